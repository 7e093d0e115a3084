#!/usr/bin/env bash
# A single-node Garage (S3 server keeping objects on disk), for datasets the
# local Ceph RGW cannot hold: its memstore keeps ~25 KiB of RAM per small
# object (10^6 objects would need ~25 GB), Garage ~6 KB of disk (LMDB
# metadata and data blocks) and little RAM.
#
#   benches/lib/garage.sh up       build it if missing (cargo install, ~10 min), start it
#   benches/lib/garage.sh env      export lines for its endpoint and key: eval "$(... env)"
#   benches/lib/garage.sh bucket B create bucket B (if missing) for the key
#   benches/lib/garage.sh status   "up" and exit 0 when it answers
#   benches/lib/garage.sh stop     stop the server (its data stays for the next `up`)
#
# State (binary, config, metadata, data, key) under $RIFFLE_GARAGE_DIR
# [benches/.work/garage]; S3 on 127.0.0.1:$RIFFLE_GARAGE_PORT [3990], RPC
# and admin on the next ports.
set -euo pipefail
cd "$(dirname "$0")/../.."

DIR=${RIFFLE_GARAGE_DIR:-$PWD/benches/.work/garage}
PORT=${RIFFLE_GARAGE_PORT:-3990}
VERSION=2.5.0
BIN=$DIR/install/bin/garage
CONF=$DIR/garage.toml

die() { printf 'garage.sh: error: %s\n' "$*" >&2; exit 1; }
g() { "$BIN" -c "$CONF" "$@"; }

status() {
    curl -s --noproxy '*' --max-time 2 -o /dev/null "http://127.0.0.1:$PORT/" 2>/dev/null
}

build() {
    [ -x "$BIN" ] && return 0
    echo "garage.sh: building garage $VERSION (cargo install, ~10 minutes)" >&2
    mkdir -p "$DIR"
    cargo install "garage@$VERSION" --locked --no-default-features \
        --features bundled-libs,lmdb --root "$DIR/install" >"$DIR/build.log" 2>&1 \
        || die "cargo install garage failed (see $DIR/build.log)"
}

configure() {
    [ -s "$CONF" ] && return 0
    mkdir -p "$DIR/meta" "$DIR/data"
    cat >"$CONF" <<EOF
metadata_dir = "$DIR/meta"
data_dir = "$DIR/data"
db_engine = "lmdb"
metadata_fsync = false
data_fsync = false
replication_factor = 1
compression_level = "none"
rpc_bind_addr = "127.0.0.1:$((PORT + 1))"
rpc_public_addr = "127.0.0.1:$((PORT + 1))"
rpc_secret = "$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')"

[s3_api]
s3_region = "us-east-1"
api_bind_addr = "127.0.0.1:$PORT"
root_domain = ".s3.garage.localhost"

[admin]
api_bind_addr = "127.0.0.1:$((PORT + 3))"
EOF
}

up() {
    build
    configure
    if ! status; then
        RUST_LOG=${RIFFLE_GARAGE_LOG:-warn} setsid nohup "$BIN" -c "$CONF" server >>"$DIR/server.log" 2>&1 < /dev/null &
        echo $! >"$DIR/server.pid"
        local i
        for i in $(seq 1 100); do status && break; sleep 0.2; done
        status || die "garage did not start (see $DIR/server.log)"
    fi
    # A new node has no role yet: give it one (all the capacity), once.
    local id
    id=$(g status 2>/dev/null | awk '/NO ROLE ASSIGNED/ {print $1; exit}')
    if [ -n "$id" ]; then
        g layout assign -z dc1 -c 100G "$id" >/dev/null
        g layout apply --version 1 >/dev/null
    fi
    if [ ! -s "$DIR/key" ]; then
        g key create riffle-bench | awk '/Key ID:/ {print "id=" $3} /Secret key:/ {print "secret=" $3}' >"$DIR/key"
        grep -q '^secret=' "$DIR/key" || { rm -f "$DIR/key"; die "could not create a key"; }
    fi
    echo "garage.sh: up on http://127.0.0.1:$PORT (state in $DIR)" >&2
}

env_lines() {
    [ -s "$DIR/key" ] || die "not set up (run: benches/lib/garage.sh up)"
    # shellcheck disable=SC1091
    . "$DIR/key"
    cat <<EOF
export AWS_ACCESS_KEY_ID=$id
export AWS_SECRET_ACCESS_KEY=$secret
export AWS_ENDPOINT_URL=http://127.0.0.1:$PORT
export AWS_REGION=us-east-1
export AWS_DEFAULT_REGION=us-east-1
export AWS_REQUEST_CHECKSUM_CALCULATION=when_required
export AWS_RESPONSE_CHECKSUM_VALIDATION=when_required
EOF
}

bucket() {
    local b=$1 id secret
    g bucket info "$b" >/dev/null 2>&1 || g bucket create "$b" >/dev/null
    # shellcheck disable=SC1091
    . "$DIR/key"
    g bucket allow --read --write --owner "$b" --key "$id" >/dev/null
}

case ${1:-} in
    up) up ;;
    env) env_lines ;;
    bucket) [ -n "${2:-}" ] || die "bucket NAME"; bucket "$2" ;;
    status) if status; then echo up; else echo down; exit 1; fi ;;
    stop) [ -s "$DIR/server.pid" ] && kill "$(cat "$DIR/server.pid")" 2>/dev/null; rm -f "$DIR/server.pid" ;;
    *) sed -n '2,16p' "$0"; exit 2 ;;
esac
