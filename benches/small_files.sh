#!/usr/bin/env bash
# W7, millions of small files (issue 46): 10^6 objects of 1-4 KiB in 1,000
# directories read end to end through one default riffle mount, with the
# daemon's RSS sampled against the files read:
#
#   benches/small_files.sh [--objects N] [--tag NAME] [--riffle PATH] [--store rgw|garage]
#                          [--stop-rss MIB] [--no-build] [--no-local]
#
# Steps, each with its time, the requests the store saw (counted at
# riffle-proxy: 30 ms before the first byte of every response, 100 MB/s per
# connection) and the daemon's RSS:
#   S3 client listing   riffle-bench list-s3 (64 LISTs in flight), the reference
#   listing             a fresh default mount (--cache-dir, --metadata-ttl
#                       indefinite, --max-memory at its default 1G): find -type f
#   cold epoch          riffle-bench read-fs, 8 threads, every file once in a
#                       shuffled order; RSS and files opened sampled every second
#   warm epoch          the same again (page cache dropped before every epoch)
#   SIGKILL, remount    the daemon killed, the dead mount cleared, a new mount
#                       over the full cache: time until `riffle mount` returns
#                       (ready), until the first file is read, then a listing
#                       and a warm epoch through it
#   local disk          riffle-bench copy of the dataset (64 downloads in flight,
#                       through the proxy), then the same epoch on local disk
#
# --store garage (benches/lib/garage.sh) keeps the objects on disk: the local
# RGW's memstore holds ~25 KiB of RAM per small object, so 10^6 of them do not
# fit this machine (24 GiB); RGW is the default for smaller --objects. The
# dataset is uploaded once and kept (the marker object says what it holds).
# --stop-rss ends the cold epoch once the daemon's RSS passes MIB (for a build
# whose RSS grows without bound). Writes benches/results/small-files-TAG.md
# (the table) and small-files-TAG-rss.csv (files read, RSS), then
# benches/small_files_report.py puts every tag's results together in
# benches/results/small-files.md and benches/plots/small-files-rss.png.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

OBJECTS=1000000
TAG=after
RIFFLE=
STORE=
STOP_RSS=0
BUILD=1
LOCAL=1
while [ $# -gt 0 ]; do
    case $1 in
        --objects) OBJECTS=$2; shift ;;
        --tag) TAG=$2; shift ;;
        --riffle) RIFFLE=$2; shift ;;
        --store) STORE=$2; shift ;;
        --stop-rss) STOP_RSS=$2; shift ;;
        --no-build) BUILD=0 ;;
        --no-local) LOCAL=0 ;;
        -h|--help) sed -n '2,36p' "$0"; exit 0 ;;
        *) echo "benches/small_files.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
[[ $OBJECTS =~ ^[0-9]+$ ]] && [ "$OBJECTS" -ge 1000 ] && [ "$OBJECTS" -le 1000000 ] \
    || { echo "benches/small_files.sh: --objects must be 1000 to 1000000" >&2; exit 2; }
[ -n "$STORE" ] || STORE=$([ "$OBJECTS" -gt 200000 ] && echo garage || echo rgw)

WORK=${RIFFLE_BENCH_WORK:-$ROOT/benches/.work}/small-files
LOG_DIR=$WORK/logs
RUN=$WORK/run-$TAG
mkdir -p "$LOG_DIR" "$RUN" "$WORK/mnt"
# shellcheck source=lib/common.sh
. benches/lib/common.sh

BIN=$ROOT/target/release
RIFFLE=${RIFFLE:-$BIN/riffle}
if [ "$BUILD" = 1 ]; then
    say "building release riffle, riffle-bench and riffle-proxy"
    CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1} cargo build --release -q -p rifflefs -p riffle-bench
fi

case $STORE in
    rgw)
        deploy/local/rgw.sh status >/dev/null 2>&1 || deploy/local/rgw.sh up >>"$LOG_DIR/rgw.log" 2>&1
        eval "$(deploy/local/rgw.sh env)" ;;
    garage)
        benches/lib/garage.sh up
        eval "$(benches/lib/garage.sh env)" ;;
    *) die "--store is rgw or garage" ;;
esac
STORE_URL=$AWS_ENDPOINT_URL
BUCKET=${RIFFLE_BENCH_W7_BUCKET:-riffle-w7}
[ "$STORE" = garage ] && benches/lib/garage.sh bucket "$BUCKET"
SCALE=$(awk -v n="$OBJECTS" 'BEGIN {printf "%.6f", n / 1000000}')
MANIFEST=$WORK/w7-$OBJECTS.manifest
say "W7: $OBJECTS objects in s3://$BUCKET on $STORE (uploading what is missing)"
"$BIN/riffle-bench" gen --workload w7 --scale "$SCALE" --bucket "$BUCKET" --parallel 128 \
    --manifest "$MANIFEST" >>"$LOG_DIR/gen.log" 2>&1 || die "riffle-bench gen failed (see $LOG_DIR/gen.log)"

# The latency proxy (as benches/run.sh's), its counters read around each step.
start_proxy "$STORE_URL" "$RUN/proxy.out" "$LOG_DIR/proxy.log"
proxy() { "$BIN/riffle-bench" proxy-stats --control "$PROXY_CONTROL" "$@" 2>>"$LOG_DIR/proxy.log"; }
count() { # FIELD FILE: a counter of a proxy-stats file
    sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p" "$2" | head -1
}
gets() { echo $(( $(count get_object "$1") + $(count get_range "$1") )); }

MNT=$WORK/mnt/riffle
CACHE=$WORK/cache
LOCAL_DIR=$WORK/local
DAEMON=
SAMPLER=
cleanup() {
    [ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null || true
    if in_mount_table "$MNT"; then
        "$RIFFLE" unmount "$MNT" >/dev/null 2>&1 || umount -l "$MNT" 2>/dev/null || true
    fi
    kill "$PROXY_PID" 2>/dev/null || true
}
trap cleanup EXIT

mount_riffle() { # LOG-TAG: mounts over $CACHE; sets DAEMON and READY (seconds until ready)
    local pidf=$RUN/riffle.pid t0 t1
    rm -f "$pidf"
    t0=$(date +%s.%N)
    "$RIFFLE" mount "s3://$BUCKET" "$MNT" --endpoint-url "$PROXY_URL" --force-path-style \
        --metadata-ttl indefinite --cache-dir "$CACHE" --cache-min-free 1G \
        --log-file "$LOG_DIR/riffle-$TAG-$1.log" --pid-file "$pidf" >>"$LOG_DIR/riffle-$TAG.out" 2>&1 \
        || die "riffle mount failed (see $LOG_DIR/riffle-$TAG.out)"
    t1=$(date +%s.%N)
    DAEMON=$(cat "$pidf")
    READY=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b - a}')
}

opens() { # files the mount has opened so far
    "$RIFFLE" stats "$MNT" --json 2>/dev/null \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)["fuse"]["opens"])' 2>/dev/null || echo ""
}

# Samples (epoch, files opened, VmRSS KiB) every second into $RUN/rss.csv; with
# --stop-rss, ends the reader (pid $2) once RSS passes it.
sample() { # EPOCH READER_PID
    local e=$1 reader=$2 rss n
    while kill -0 "$reader" 2>/dev/null; do
        rss=$(current_rss_kb "$DAEMON")
        n=$(opens)
        [ -n "$rss" ] && [ -n "$n" ] && echo "$e,$n,$rss" >> "$RUN/rss.csv"
        if [ "$STOP_RSS" -gt 0 ] && [ -n "$rss" ] && [ "$rss" -gt $((STOP_RSS * 1024)) ]; then
            echo "$e,stopped,$n,$rss" >> "$RUN/stopped"
            kill "$reader" 2>/dev/null || true
            return
        fi
        sleep 1
    done
}

ROWS=$RUN/rows.tsv
: > "$ROWS"
: > "$RUN/rss.csv"
rm -f "$RUN/stopped"
row() { printf '%s\t%s\t%s\t%s\t%s\n' "$@" >> "$ROWS"; } # step time requests rss notes
mib() { [ -n "${1:-}" ] && awk -v k="$1" 'BEGIN {printf "%.0f MiB", k / 1024}' || echo "—"; }
secs() { sed -n 's/.*"elapsed_s":\([0-9.e+-]*\).*/\1/p' "$1" | awk '{printf "%.1f s", $1}'; }
fps() { sed -n 's/.*"files_per_s":\([0-9.e+-]*\).*/\1/p' "$1" | awk '{printf "%.0f files/s", $1}'; }
wrong() { sed -n 's/.*"mismatches":\([0-9]*\).*/\1/p' "$1"; }
STATUS=0
check() { # JSON: fails the run on wrong bytes or errors
    local m e
    m=$(wrong "$1"); e=$(sed -n 's/.*"errors":\([0-9]*\).*/\1/p' "$1")
    if [ "${m:-1}" != 0 ] || [ "${e:-1}" != 0 ]; then
        warn "$1: ${m:-?} wrong, ${e:-?} errors"; STATUS=1
    fi
}

epoch() { # E NAME: one read-fs epoch over the mount, sampled; a row
    local e=$1 name=$2 json=$RUN/epoch-$1.json reader rc=0
    drop_caches || true
    proxy --reset >/dev/null
    "$BIN/riffle-bench" read-fs --root "$MNT" --manifest "$MANIFEST" --pattern w1 --threads 8 \
        --epoch "$e" --json-out "$json" >/dev/null 2>>"$LOG_DIR/read-$TAG.log" &
    reader=$!
    sample "$e" "$reader" &
    SAMPLER=$!
    wait "$reader" || rc=$?
    wait "$SAMPLER" 2>/dev/null || true
    SAMPLER=
    proxy --out "$RUN/proxy-e$e.json"
    if grep -q "^$e,stopped" "$RUN/stopped" 2>/dev/null; then
        local n
        n=$(awk -F, -v e="$e" '$1 == e && $2 == "stopped" {print $3}' "$RUN/stopped")
        row "$name" "stopped at $n files" "$(gets "$RUN/proxy-e$e.json") GETs" \
            "$(mib "$(peak_rss_kb "$DAEMON")")" "ended at --stop-rss $STOP_RSS MiB"
        return 1
    fi
    [ "$rc" = 0 ] || warn "read-fs epoch $e exited $rc"
    check "$json"
    row "$name" "$(secs "$json") ($(fps "$json"))" "$(gets "$RUN/proxy-e$e.json") GETs" \
        "$(mib "$(peak_rss_kb "$DAEMON")")" "$(wrong "$json") wrong bytes"
}

walk() { # NAME: find -type f over the mount; a row
    local name=$1 json=$RUN/walk-$RANDOM.json
    drop_caches || true
    proxy --reset >/dev/null
    "$BIN/riffle-bench" walk --root "$MNT" --manifest "$MANIFEST" --json-out "$json" \
        >/dev/null 2>>"$LOG_DIR/walk-$TAG.log" || STATUS=1
    proxy --out "$RUN/proxy-walk.json"
    row "$name" "$(secs "$json")" "$(count list "$RUN/proxy-walk.json") LISTs" \
        "$(mib "$(current_rss_kb "$DAEMON")") (RSS after)" ""
}

# S3 client listing (the reference).
proxy --reset >/dev/null
"$BIN/riffle-bench" list-s3 --manifest "$MANIFEST" --endpoint "$PROXY_URL" --bucket "$BUCKET" \
    --parallel 64 --json-out "$RUN/list-s3.json" >/dev/null 2>>"$LOG_DIR/list-$TAG.log" || STATUS=1
proxy --out "$RUN/proxy-list.json"
row "S3 client listing (64 in flight)" "$(secs "$RUN/list-s3.json")" \
    "$(count list "$RUN/proxy-list.json") LISTs" "—" ""

# A fresh default mount: listing, cold epoch, warm epoch.
cleanup_mount() { in_mount_table "$MNT" && { "$RIFFLE" unmount "$MNT" >/dev/null 2>&1 || umount -l "$MNT"; }; true; }
cleanup_mount
rm -rf "$CACHE"; mkdir -p "$CACHE" "$MNT"
mount_riffle fresh
say "mounted in $READY s; listing"
walk "riffle listing (find -type f)"
say "cold epoch"
if epoch 1 "riffle cold epoch"; then
    say "warm epoch"
    epoch 2 "riffle warm epoch" || true
    # SIGKILL and remount over the full cache.
    say "SIGKILL and remount"
    kill -9 "$DAEMON"
    sleep 1
    umount -l "$MNT" 2>/dev/null || fusermount3 -u -z "$MNT" 2>/dev/null || true
    mount_riffle remount
    drop_caches || true
    t0=$(date +%s.%N)
    cat "$MNT/$(awk -F'\t' '!/^#/ {print $1; exit}' "$MANIFEST")" >/dev/null || STATUS=1
    first=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.2f", b - a}')
    row "SIGKILL, remount over the full cache: ready" "$READY s" "—" \
        "$(mib "$(current_rss_kb "$DAEMON")")" "first file read $first s after"
    walk "remount: listing (find -type f)"
    epoch 3 "remount: warm epoch" || true
fi
cleanup_mount

# Local disk.
if [ "$LOCAL" = 1 ]; then
    rm -rf "$CACHE"
    say "local disk: copy, then an epoch"
    rm -rf "$LOCAL_DIR"
    "$BIN/riffle-bench" copy --manifest "$MANIFEST" --endpoint "$PROXY_URL" --bucket "$BUCKET" \
        --dest "$LOCAL_DIR" --parallel 64 --json-out "$RUN/copy.json" >/dev/null 2>>"$LOG_DIR/copy-$TAG.log" || STATUS=1
    drop_caches || true
    "$BIN/riffle-bench" read-fs --root "$LOCAL_DIR" --manifest "$MANIFEST" --pattern w1 --threads 8 \
        --epoch 1 --json-out "$RUN/local.json" >/dev/null 2>>"$LOG_DIR/read-$TAG.log" || STATUS=1
    check "$RUN/local.json"
    row "local disk: copy (64 in flight), then an epoch" "copy $(secs "$RUN/copy.json") + $(secs "$RUN/local.json") ($(fps "$RUN/local.json"))" "—" "—" ""
    rm -rf "$LOCAL_DIR"
fi

commit=$(commit_id)
{
    echo "W7 run \`$TAG\`: $OBJECTS objects (1-4 KiB, 1,000 directories) on $STORE behind riffle-proxy,"
    echo "riffle \`$("$RIFFLE" --version 2>/dev/null | head -1)\` from commit \`$commit\`, $(date -u +%Y-%m-%d), $(nproc) cores,"
    echo "load average $(cut -d' ' -f1-3 /proc/loadavg) at the end."
    echo
    echo "| step | time | requests at the store | daemon RSS (peak) | notes |"
    echo "|---|---|---|---|---|"
    awk -F'\t' '{printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5}' "$ROWS"
} > "benches/results/small-files-$TAG.md"
cp "$RUN/rss.csv" "benches/results/small-files-$TAG-rss.csv"
say "wrote benches/results/small-files-$TAG.md"
cat "benches/results/small-files-$TAG.md"
py=python3
[ -x benches/.venv/bin/python ] && py=benches/.venv/bin/python
"$py" benches/small_files_report.py benches/results benches/plots || warn "small_files_report.py failed"
exit "$STATUS"
