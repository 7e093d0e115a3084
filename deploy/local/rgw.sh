#!/usr/bin/env bash
# Single-node Ceph RGW (S3 server) on loopback, for tests, benchmarks and the
# quickstart. No systemd, no containers: the daemons (mon, memstore osd,
# optionally mgr, radosgw) are started directly and everything they write
# lives under one state dir. See deploy/local/README.md.
set -euo pipefail

PROG=${0##*/}
STATE_DIR=${RIFFLE_RGW_DIR:-/tmp/riffle-rgw}
PORT=${RIFFLE_RGW_PORT:-7480}
MEM_BYTES=${RIFFLE_RGW_MEM_BYTES:-17179869184}
ACCESS_KEY=${RIFFLE_RGW_ACCESS_KEY:-RIFFLETESTACCESSKEY0}
SECRET_KEY=${RIFFLE_RGW_SECRET_KEY:-riffletestsecretkey0000000000000000000000}
TEST_UID=${RIFFLE_RGW_UID:-riffle-test}
UP_TIMEOUT=${RIFFLE_RGW_TIMEOUT:-90}
THREADS=${RIFFLE_RGW_THREADS:-64}
WITH_MGR=${RIFFLE_RGW_MGR:-0}
OPS_LOG=${RIFFLE_RGW_OPS_LOG:-0}
REGION=us-east-1
ENDPOINT="http://127.0.0.1:${PORT}"
MON_PORT=${RIFFLE_RGW_MON_PORT:-3300}
# msgr2 only: one port, so several clusters can run side by side
MON_ADDRS="v2:127.0.0.1:$MON_PORT"
PACKAGES=(ceph-mon ceph-osd ceph-mgr radosgw ceph-common uuid-runtime)
MARKER=.riffle-rgw-state

CONF="$STATE_DIR/ceph.conf"
KEYRING="$STATE_DIR/keyring"
LOG_DIR="$STATE_DIR/log"
RUN_DIR="$STATE_DIR/run"

# Ceph tools honour these; make sure a caller's settings cannot leak in.
unset CEPH_ARGS
export CEPH_CONF="$CONF"

usage() {
    cat <<EOF
Usage: $PROG COMMAND

Run a throw-away single-node Ceph RGW (S3) on 127.0.0.1 for tests and benchmarks.

Commands:
  up                      start mon, osd (memstore), radosgw and create the test user;
                          does nothing if RGW already answers on the port
  down                    stop the daemons of the state dir and delete the state dir
  status                  print "up" and exit 0 if RGW answers, else "down" and exit 1
  env                     print export lines for the test credentials and endpoint:
                            eval "\$($0 env)"
  user UID ACCESS SECRET  create (or re-key) another S3 user
  help                    this text

Environment (defaults in brackets):
  RIFFLE_RGW_DIR          state dir: config, keys, pid files, logs [/tmp/riffle-rgw]
  RIFFLE_RGW_PORT         S3 port on 127.0.0.1 [7480]
  RIFFLE_RGW_MON_PORT     Ceph monitor port on 127.0.0.1 [3300]
  RIFFLE_RGW_MEM_BYTES    memstore capacity; data lives in RAM [17179869184]
  RIFFLE_RGW_ACCESS_KEY   test user's access key [RIFFLETESTACCESSKEY0]
  RIFFLE_RGW_SECRET_KEY   test user's secret key [riffletestsecretkey0000000000000000000000]
  RIFFLE_RGW_UID          test user's uid [riffle-test]
  RIFFLE_RGW_TIMEOUT      seconds 'up' waits before giving up [90]
  RIFFLE_RGW_THREADS      rgw thread pool size [64]
  RIFFLE_RGW_MGR          1 = also run ceph-mgr (not needed for S3) [0]
  RIFFLE_RGW_OPS_LOG      1 = log every request to \$RIFFLE_RGW_DIR/log/ [0]
  RIFFLE_RGW_EXTRA_CONF   text appended to ceph.conf, e.g. \$'[osd]\\ndebug osd = 10'

To run a second cluster next to the first, give it its own RIFFLE_RGW_DIR,
RIFFLE_RGW_PORT and RIFFLE_RGW_MON_PORT.
Logs: \$RIFFLE_RGW_DIR/log/*.log
EOF
}

say() { printf '%s: %s\n' "$PROG" "$*"; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }

# --- small helpers ----------------------------------------------------------

# Body of an anonymous GET / (RGW answers 200 with an empty
# ListAllMyBucketsResult); empty when nothing answers.
probe() {
    curl -s --noproxy "*" --max-time "${1:-3}" "$ENDPOINT/" 2>/dev/null || true
}

rgw_answers() {
    [[ $(probe "$@") == *ListAllMyBucketsResult* ]]
}

port_in_use() { # port
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }

# Our daemons, as "pid kind" lines (kind: mon, osd, mgr, rgw): the pids named
# by the pid files plus any found by scanning /proc (daemons whose pid file is
# missing, e.g. after a failed start). A process counts only if it was
# started with "-c $CONF", so a recycled pid is never signalled.
our_daemons() {
    local f pid kind parts=()
    local -A seen=()
    for f in "$RUN_DIR"/*.pid /proc/[0-9]*; do
        if [[ $f == /proc/* ]]; then
            pid=${f#/proc/}
        else
            [[ -f $f ]] || continue
            pid=
            read -r pid 2>/dev/null <"$f" || [[ -n $pid ]] || continue
        fi
        is_uint "$pid" || continue
        [[ -z ${seen[$pid]:-} && $pid != "$$" ]] || continue
        seen[$pid]=1
        mapfile -d '' -t parts 2>/dev/null <"/proc/$pid/cmdline" || continue
        [[ " ${parts[*]} " == *" -c $CONF "* ]] || continue
        case ${parts[0]##*/} in
        ceph-mon) kind=mon ;;
        ceph-osd) kind=osd ;;
        ceph-mgr) kind=mgr ;;
        radosgw) kind=rgw ;;
        *) continue ;;
        esac
        echo "$pid $kind"
    done
}

alive() { # pids...; zombies count as gone (a container's pid 1 may not reap)
    local p st out=()
    for p in "$@"; do
        st=$(cut -d' ' -f3 2>/dev/null </proc/"$p"/stat) || continue
        [[ $st == Z ]] && continue
        out+=("$p")
    done
    echo "${out[@]}"
}

stop_pids() { # pids...: SIGTERM, wait up to 10 s, then SIGKILL
    local left i
    (($#)) || return 0
    kill -TERM "$@" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        # shellcheck disable=SC2048,SC2086
        left=$(alive $*)
        [[ -z $left ]] && return 0
        sleep 0.1
    done
    say "still running after 10 s, sending SIGKILL to pid $left" >&2
    # shellcheck disable=SC2086
    kill -KILL $left 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        # shellcheck disable=SC2086
        left=$(alive $left)
        [[ -z $left ]] && return 0
        sleep 0.1
    done
    die "could not stop pid $left"
}

# One kind after the other, clients first: radosgw hangs in shutdown once the
# OSD is gone, and the OSD waits ~5 s to tell a vanished monitor it goes down.
stop_daemons() {
    local list kinds
    list=$(our_daemons)
    for kinds in 'rgw|mgr' osd mon; do
        # shellcheck disable=SC2046
        stop_pids $(awk -v k="^($kinds)\$" '$2 ~ k { print $1 }' <<<"$list")
    done
}

# rm -rf only what is recognisably ours.
wipe_state_dir() {
    [[ -e $STATE_DIR ]] || return 0
    case $(realpath -m "$STATE_DIR") in
    / | /tmp | /root | /home | /usr | /var | /etc) die "refusing to delete $STATE_DIR" ;;
    esac
    if [[ -f $STATE_DIR/$MARKER ]] || [[ -d $STATE_DIR && -z $(ls -A "$STATE_DIR") ]]; then
        rm -rf "$STATE_DIR"
    else
        die "$STATE_DIR exists but is not a $PROG state dir (no $MARKER); refusing to delete it"
    fi
}

ensure_packages() {
    local need=0 c
    for c in ceph-mon ceph-osd radosgw radosgw-admin ceph ceph-authtool monmaptool uuidgen curl timeout; do
        command -v "$c" >/dev/null 2>&1 || need=1
    done
    if [[ $WITH_MGR == 1 ]] && ! command -v ceph-mgr >/dev/null 2>&1; then need=1; fi
    [[ $need == 1 ]] || return 0
    local pkgs=("${PACKAGES[@]}")
    command -v curl >/dev/null 2>&1 || pkgs+=(curl ca-certificates)
    [[ $(id -u) == 0 ]] || die "missing Ceph packages; as root run: apt-get install --no-install-recommends ${pkgs[*]}"
    command -v apt-get >/dev/null 2>&1 || die "missing Ceph packages (${pkgs[*]}) and no apt-get to install them"
    say "installing ${pkgs[*]} (apt-get)"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}" >/dev/null
}

# --- up -----------------------------------------------------------------------

DEADLINE=0
STAGE=
UP_DONE=0

remaining() {
    local r=$((DEADLINE - SECONDS))
    ((r > 0)) && echo "$r" || echo 0
}

# fd 8 is the caller's stderr, saved by cmd_up: a signal may run this while
# stderr is redirected to a log file.
fail_up() { # message
    trap - EXIT INT TERM HUP
    if [[ -e /proc/$$/fd/8 ]]; then exec 2>&8; fi
    printf '%s: error: %s; logs: %s/\n' "$PROG" "$1" "$LOG_DIR" >&2
    if [[ -n ${CI:-} ]]; then # show the logs in CI output
        local f
        for f in "$LOG_DIR"/*; do
            [[ -s $f ]] || continue
            printf -- '--- tail %s\n' "$f" >&2
            tail -n 30 "$f" >&2 || true
        done
    fi
    stop_daemons || true
    exit 1
}

on_up_exit() {
    local rc=$?
    ((UP_DONE)) && return 0
    fail_up "'up' failed (exit $rc) while $STAGE"
}

# Run a command with whatever is left of the start-up budget.
bounded() {
    local r
    r=$(remaining)
    ((r > 0)) || return 124
    timeout --kill-after=2 "$r" "$@"
}

# Daemons started by this 'up' and their pids once their pid file appeared.
STARTED=()
declare -A PIDS=()

# Fail at once if a started daemon has died, instead of waiting for the deadline.
check_daemons() {
    local n f
    for n in "${STARTED[@]}"; do
        f=$RUN_DIR/$n.pid
        if [[ -z ${PIDS[$n]:-} && -s $f ]]; then PIDS[$n]=$(<"$f"); fi
        if [[ -n ${PIDS[$n]:-} && -z $(alive "${PIDS[$n]}") ]]; then
            fail_up "$n exited while $STAGE (see $LOG_DIR/$n.log)"
        fi
    done
}

# Wait until "$@" succeeds or the start-up budget is spent.
wait_for() {
    while ((SECONDS < DEADLINE)); do
        "$@" && return 0
        check_daemons
        sleep 0.2
    done
    return 1
}

write_conf() {
    local fsid=$1 rgw_debug=0/0 ops_log=false
    if [[ $OPS_LOG == 1 ]]; then rgw_debug=1/5 ops_log=true; fi
    cat >"$CONF" <<EOF
# Written by deploy/local/rgw.sh; throw-away single-node cluster.
[global]
fsid = $fsid
mon host = $MON_ADDRS
mon initial members = a
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind msgr1 = false
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
keyring = $KEYRING
run dir = $RUN_DIR
crash dir = $STATE_DIR/crash
pid file = $RUN_DIR/\$name.pid
log file = $LOG_DIR/\$name.log
log to file = true
log to stderr = false
err to stderr = true
mon cluster log file = $LOG_DIR/cluster.log
mon cluster log file level = info

# one OSD, one copy, few PGs
osd objectstore = memstore
memstore device bytes = $MEM_BYTES
# page set = false keeps ~20 KiB less per small object than 64 KiB pages
memstore page set = false
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon warn on insecure global id reclaim allowed = false
mon data avail warn = 2
mon data avail crit = 1
# commit map changes quickly: start-up (osd boot, rgw pool creation) is a
# chain of ~15 map updates, each waiting 1 s by default (12 s -> 2 s)
paxos propose interval = 0.05

# quiet logs (raise a level here to debug)
debug ms = 0/0
debug mon = 0/0
debug paxos = 0/0
debug auth = 0/0
debug monc = 0/0
debug mgr = 0/0
debug mgrc = 0/0
debug osd = 0/0
debug memdb = 0/0
debug rocksdb = 0/0
debug leveldb = 0/0
debug objecter = 0/0
debug rados = 0/0
debug asok = 0/0
debug crush = 0/0
debug finisher = 0/0
debug throttle = 0/0
debug heartbeatmap = 0/0
debug perfcounter = 0/0
debug timer = 0/0
debug rgw = $rgw_debug
debug rgw sync = 0/0
debug civetweb = 0/0

[mon]
mon data = $STATE_DIR/mon/ceph-\$id
admin socket = $RUN_DIR/\$name.asok

[osd]
osd data = $STATE_DIR/osd/ceph-\$id
admin socket = $RUN_DIR/\$name.asok
# no background scrubbing during benchmarks
osd scrub min interval = 31536000
osd scrub max interval = 31536000
osd deep scrub interval = 31536000
# short PG logs: one copy, nothing to recover from; this halves the memory
# each small object costs (~50 -> ~25 KiB) and speeds up small PUTs
osd min pg log entries = 100
osd max pg log entries = 100
osd pg log dups tracked = 100
osd pg log trim min = 10

[mgr]
mgr data = $STATE_DIR/mgr/ceph-\$id
admin socket = $RUN_DIR/\$name.asok

[client]
# command-line tools (ceph, radosgw-admin): no log files, no sockets
log to file = false
admin socket =

[client.rgw.a]
log to file = true
admin socket = $RUN_DIR/\$name.asok
rgw data = $STATE_DIR/rgw
# tcp_nodelay=1: without it small GETs on a reused connection stall ~44 ms
rgw frontends = beast endpoint=127.0.0.1:$PORT tcp_nodelay=1
rgw thread pool size = $THREADS
rgw enable apis = s3, admin
rgw enable ops log = $ops_log
rgw ops log rados = false
rgw ops log file path = $LOG_DIR/rgw-ops.log
rgw enable usage log = false
rgw run sync thread = false
rgw dynamic resharding = false
rgw init timeout = 300
EOF
    if [[ -n ${RIFFLE_RGW_EXTRA_CONF:-} ]]; then
        printf '\n# RIFFLE_RGW_EXTRA_CONF\n%s\n' "$RIFFLE_RGW_EXTRA_CONF" >>"$CONF"
    fi
}

make_keys() {
    # -c /dev/null: the tool needs no cluster config (and should not log).
    local kt=(ceph-authtool -c /dev/null "$KEYRING")
    "${kt[@]}" --create-keyring --gen-key -n mon. --cap mon 'allow *' >/dev/null
    "${kt[@]}" --gen-key -n client.admin \
        --cap mon 'allow *' --cap osd 'allow *' --cap mds 'allow *' --cap mgr 'allow *'
    "${kt[@]}" --gen-key -n osd.0 \
        --cap mon 'allow profile osd' --cap mgr 'allow profile osd' --cap osd 'allow *'
    "${kt[@]}" --gen-key -n mgr.x \
        --cap mon 'allow profile mgr' --cap osd 'allow *' --cap mds 'allow *'
    "${kt[@]}" --gen-key -n client.rgw.a \
        --cap mon 'allow rw' --cap osd 'allow rwx' --cap mgr 'allow rw'
    chmod 600 "$KEYRING"
}

# Start a (self-daemonizing) Ceph daemon; its early output goes to log/NAME.out.
# It must not inherit the lock (fd 9) or the caller's stderr (fd 8): a CI step
# would wait for the pipe to close.
start_daemon() { # name cmd args...
    local name=$1 r
    shift
    STARTED+=("$name")
    r=$(remaining)
    ((r > 0)) || return 124
    timeout --kill-after=2 "$r" "$@" -c "$CONF" </dev/null >>"$LOG_DIR/$name.out" 2>&1 8>&- 9>&-
}

osd_is_up() {
    local out
    out=$(timeout 10 ceph -c "$CONF" --connect-timeout 5 osd stat 2>/dev/null) || return 1
    [[ $out == *"1 up"* ]]
}

signed_list_ok() { # access secret
    local code
    code=$(curl -s --noproxy "*" -o /dev/null -w '%{http_code}' --max-time 5 \
        --aws-sigv4 "aws:amz:$REGION:s3" --user "$1:$2" \
        -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' "$ENDPOINT/" 2>/dev/null) || true
    [[ $code == 200 ]]
}

create_user() { # uid access secret
    local uid=$1 access=$2 secret=$3
    if timeout 30 radosgw-admin -c "$CONF" user info --uid="$uid" >/dev/null 2>&1; then
        timeout 30 radosgw-admin -c "$CONF" key create --uid="$uid" --key-type=s3 \
            --access-key="$access" --secret-key="$secret" >/dev/null
    else
        timeout 30 radosgw-admin -c "$CONF" user create --uid="$uid" --display-name="$uid" \
            --access-key="$access" --secret-key="$secret" >/dev/null
    fi
}

cmd_up() {
    is_uint "$PORT" || die "RIFFLE_RGW_PORT must be a number"
    is_uint "$MON_PORT" || die "RIFFLE_RGW_MON_PORT must be a number"
    is_uint "$UP_TIMEOUT" || die "RIFFLE_RGW_TIMEOUT must be a number"
    ensure_packages
    if rgw_answers; then
        say "RGW already up at $ENDPOINT"
        signed_list_ok "$ACCESS_KEY" "$SECRET_KEY" ||
            say "warning: it rejects access key $ACCESS_KEY (started with other credentials?)" >&2
        return 0
    fi
    if port_in_use "$PORT"; then
        die "port $PORT is in use by something that is not RGW; set RIFFLE_RGW_PORT"
    fi

    local t0ms
    t0ms=$(date +%s%N)
    # Leftovers of an earlier run (crashed daemons, stale dir) go first.
    stop_daemons
    wipe_state_dir
    if port_in_use "$MON_PORT"; then
        die "monitor port 127.0.0.1:$MON_PORT is in use (another cluster? set RIFFLE_RGW_MON_PORT)"
    fi

    DEADLINE=$((SECONDS + UP_TIMEOUT))
    STAGE="preparing $STATE_DIR"
    exec 8>&2
    trap on_up_exit EXIT
    trap 'exit 130' INT TERM HUP
    mkdir -p "$STATE_DIR"
    touch "$STATE_DIR/$MARKER"
    mkdir -p "$LOG_DIR" "$RUN_DIR" "$STATE_DIR/crash" "$STATE_DIR/mon/ceph-a" \
        "$STATE_DIR/osd/ceph-0" "$STATE_DIR/mgr/ceph-x" "$STATE_DIR/rgw"

    local fsid osd_uuid
    fsid=$(uuidgen)
    osd_uuid=$(uuidgen)
    write_conf "$fsid"
    make_keys
    monmaptool -c "$CONF" --create --fsid "$fsid" --addv a "$MON_ADDRS" "$STATE_DIR/monmap" >/dev/null

    STAGE="creating the monitor"
    bounded ceph-mon -c "$CONF" --mkfs -i a --monmap "$STATE_DIR/monmap" --keyring "$KEYRING" \
        >>"$LOG_DIR/mon.a.out" 2>&1 || fail_up "ceph-mon --mkfs failed"
    STAGE="starting the monitor"
    start_daemon mon.a ceph-mon -i a || fail_up "ceph-mon did not start"

    # 'ceph' waits for the monitor to form a quorum; mkfs imported all keys.
    STAGE="registering osd.0"
    bounded ceph -c "$CONF" osd new "$osd_uuid" 0 >/dev/null 2>>"$LOG_DIR/cli.err" ||
        fail_up "monitor did not answer within ${UP_TIMEOUT}s ('ceph osd new' failed)"
    STAGE="creating osd.0"
    bounded ceph-osd -c "$CONF" -i 0 --mkfs --osd-uuid "$osd_uuid" \
        >>"$LOG_DIR/osd.0.out" 2>&1 || fail_up "ceph-osd --mkfs failed"
    STAGE="starting osd.0"
    start_daemon osd.0 ceph-osd -i 0 || fail_up "ceph-osd did not start"
    if [[ $WITH_MGR == 1 ]]; then
        STAGE="starting mgr.x"
        start_daemon mgr.x ceph-mgr -i x || fail_up "ceph-mgr did not start"
    fi
    # radosgw waits for the OSD by itself and creates its pools.
    STAGE="starting radosgw"
    start_daemon client.rgw.a radosgw -n client.rgw.a || fail_up "radosgw did not start"

    STAGE="waiting for radosgw"
    if ! wait_for rgw_answers; then
        if ! osd_is_up; then
            fail_up "osd.0 did not come up within ${UP_TIMEOUT}s"
        fi
        fail_up "RGW did not answer on $ENDPOINT within ${UP_TIMEOUT}s"
    fi

    STAGE="creating the S3 user"
    create_user "$TEST_UID" "$ACCESS_KEY" "$SECRET_KEY" 2>>"$LOG_DIR/cli.err" ||
        fail_up "radosgw-admin user create failed"
    STAGE="checking the S3 user"
    wait_for signed_list_ok "$ACCESS_KEY" "$SECRET_KEY" ||
        fail_up "RGW answers but rejects the test credentials"

    UP_DONE=1
    trap - EXIT INT TERM HUP
    local ms=$((($(date +%s%N) - t0ms) / 1000000))
    say "RGW up at $ENDPOINT in $((ms / 1000)).$(printf '%03d' $((ms % 1000))) s (state and logs in $STATE_DIR)"
    say "credentials: eval \"\$($0 env)\""
}

# --- other commands ---------------------------------------------------------------

cmd_down() {
    local was=0
    [[ -n $(our_daemons) ]] && was=1
    stop_daemons
    wipe_state_dir
    if ((was)); then say "RGW stopped, $STATE_DIR removed"; else say "RGW not running ($STATE_DIR removed)"; fi
    if rgw_answers 1; then
        say "warning: something still answers on $ENDPOINT (started from another RIFFLE_RGW_DIR?)" >&2
    fi
}

cmd_status() {
    if rgw_answers; then
        echo up
        return 0
    fi
    echo "down"
    return 1
}

cmd_env() {
    cat <<EOF
export AWS_ACCESS_KEY_ID=$ACCESS_KEY
export AWS_SECRET_ACCESS_KEY=$SECRET_KEY
export AWS_REGION=$REGION
export AWS_DEFAULT_REGION=$REGION
export AWS_ENDPOINT_URL=$ENDPOINT
export RIFFLE_TEST_ENDPOINT=$ENDPOINT
export AWS_REQUEST_CHECKSUM_CALCULATION=when_required
export AWS_RESPONSE_CHECKSUM_VALIDATION=when_required
EOF
}

cmd_user() {
    [[ $# == 3 ]] || die "usage: $PROG user UID ACCESS SECRET"
    [[ -f $CONF ]] || die "no cluster in $STATE_DIR; run '$PROG up' first"
    rgw_answers || die "RGW is not up at $ENDPOINT"
    create_user "$1" "$2" "$3" || die "radosgw-admin could not create user $1"
    local i
    for ((i = 0; i < 50; i++)); do
        if signed_list_ok "$2" "$3"; then
            say "user $1 ready (access key $2)"
            return 0
        fi
        sleep 0.2
    done
    die "user $1 created but RGW rejects its credentials"
}

# Serialise up/down/user of one state dir (concurrent CI steps, test runners).
lock() {
    command -v flock >/dev/null 2>&1 || return 0
    mkdir -p "$(dirname "$STATE_DIR")"
    exec 9>"$STATE_DIR.lock"
    flock -w 120 9 || die "another $PROG holds $STATE_DIR.lock"
}

case ${1:-} in
up) lock; cmd_up ;;
down) lock; cmd_down ;;
status) cmd_status ;;
env) cmd_env ;;
user) shift; lock; cmd_user "$@" ;;
help | -h | --help) usage ;;
'') usage >&2; exit 2 ;;
*) printf '%s: unknown command %s\n\n' "$PROG" "$1" >&2; usage >&2; exit 2 ;;
esac
