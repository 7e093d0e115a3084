#!/usr/bin/env bash
# The rifflefs benchmarks (shared/BENCHMARKS.md), every system side by side
# in one run:
#
#   benches/run.sh [--quick] [--systems LIST] [--direct LIST] [--no-build] [W1 W2 W3]
#
# Builds the release binaries, starts the local Ceph RGW if it is down,
# generates the datasets (skipping objects already uploaded), starts
# riffle-proxy in front of RGW (30 ms first byte, 100 MB/s per connection)
# and, for each workload, reads the dataset through every system with the
# same reader (riffle-bench read-fs), epoch 1 (cold) and epoch 2 (warm), the
# page cache dropped before each epoch. Prints the tables, merges them into
# benches/results/{quick,full}.json and writes benches/README.md and the
# plots in benches/plots/. Exits non-zero if any system returned wrong bytes.
# Every mount is unmounted on exit, failure included.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN=$ROOT/target/release

usage() {
    cat <<USAGE
Usage: benches/run.sh [--quick] [options] [W1 W2 W3]

  --quick          scaled-down datasets (scale 0.05, W3 reads 4 s): a smoke test
                   of a few minutes [default workloads W1 W2 W3]
                   (without --quick: full datasets, default workloads W1 W2)
  --systems LIST   systems to run, comma-separated
                   [local,copy-first,s3-client,riffle,s3fs,rclone]
  --direct LIST    systems also run against RGW without the proxy, or "none"
                   [quick: copy-first,s3-client,riffle,s3fs,rclone; full: s3-client,riffle]
  --no-build       use the release binaries as they are

Environment: RIFFLE_BENCH_WORK (scratch dir) [benches/.work],
RIFFLE_BENCH_SEED [1], RIFFLE_BENCH_W1_MAX_FILES (each W1 epoch reads the same
seeded N files; 0 = all) [quick: all, full: 6000], RIFFLE_BENCH_EPOCH_TIMEOUT
(seconds) [quick 180, full 1200],
RIFFLE_BENCH_W3_DURATION [quick 4s, full 30s].
USAGE
}

MODE=full
SYSTEMS="local,copy-first,s3-client,riffle,s3fs,rclone"
DIRECT=
BUILD=1
WORKLOADS=()
while [ $# -gt 0 ]; do
    case $1 in
        --quick) MODE=quick ;;
        --systems) SYSTEMS=${2:?}; shift ;;
        --direct) DIRECT=${2:?}; shift ;;
        --no-build) BUILD=0 ;;
        -h|--help) usage; exit 0 ;;
        [wW][1-3]) WORKLOADS+=("$(echo "$1" | tr 'W' 'w')") ;;
        [wW][45]) echo "benches/run.sh: $1 has no runner yet (see benches/README.md)" >&2; exit 2 ;;
        *) usage >&2; exit 2 ;;
    esac
    shift
done
if [ "$MODE" = quick ]; then
    SCALE=0.05
    W3_DURATION=${RIFFLE_BENCH_W3_DURATION:-4s}
    EPOCH_TIMEOUT=${RIFFLE_BENCH_EPOCH_TIMEOUT:-180}
    DIRECT=${DIRECT:-copy-first,s3-client,riffle,s3fs,rclone}
    [ ${#WORKLOADS[@]} -gt 0 ] || WORKLOADS=(w1 w2 w3)
else
    SCALE=1
    W1_MAX_FILES=${RIFFLE_BENCH_W1_MAX_FILES-6000}
    W3_DURATION=${RIFFLE_BENCH_W3_DURATION:-30s}
    EPOCH_TIMEOUT=${RIFFLE_BENCH_EPOCH_TIMEOUT:-1200}
    DIRECT=${DIRECT:-s3-client,riffle}
    [ ${#WORKLOADS[@]} -gt 0 ] || WORKLOADS=(w1 w2)
fi
[ "$DIRECT" = none ] && DIRECT=
SEED=${RIFFLE_BENCH_SEED:-1}
W1_MAX_FILES=${W1_MAX_FILES-${RIFFLE_BENCH_W1_MAX_FILES:-}}

WORK=${RIFFLE_BENCH_WORK:-$ROOT/benches/.work}
RUN_ID=$(date -u +%Y%m%dT%H%M%SZ)-$MODE
LOG_DIR=$WORK/logs/$RUN_ID
RES_DIR=$WORK/results/$RUN_ID
RUN_FILE=$RES_DIR/run.jsonl
mkdir -p "$WORK"/{mnt,run,cache,local,manifests} "$LOG_DIR" "$RES_DIR"

# shellcheck source=benches/lib/common.sh
. "$ROOT/benches/lib/common.sh"
# shellcheck source=benches/lib/systems.sh
. "$ROOT/benches/lib/systems.sh"
# shellcheck source=benches/lib/prepare.sh
. "$ROOT/benches/lib/prepare.sh"
# shellcheck source=benches/lib/workload.sh
. "$ROOT/benches/lib/workload.sh"

[ "$(id -u)" = 0 ] || die "run as root: FUSE mounts and dropping the page cache need it"
RUN_STARTED=$SECONDS

PROXY_PID=
cleanup() {
    local rc=$?
    unmount_all
    [ -n "$PROXY_PID" ] && kill "$PROXY_PID" 2>/dev/null && wait "$PROXY_PID" 2>/dev/null
    rm -rf "$WORK/cache" "$WORK/local"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "benches/run.sh: mode $MODE, workloads ${WORKLOADS[*]}, systems $SYSTEMS, no-proxy column: ${DIRECT:-none}"
say "scratch $WORK, logs $LOG_DIR"
[ "$BUILD" = 1 ] && build_binaries
ensure_rgw
ensure_peer_tools
ensure_plot_venv
check_memory "${WORKLOADS[@]}"
start_proxy
drop_caches || warn "cannot write /proc/sys/vm/drop_caches: the page cache is NOT dropped between epochs"

for wl in "${WORKLOADS[@]}"; do
    run_workload "$wl"
done

say "all workloads done in $((SECONDS - RUN_STARTED)) s; writing the report"
rc=0
"$BIN/riffle-bench" report --run "$RUN_FILE" --results-dir benches/results \
    --readme benches/README.md --plots-dir benches/plots \
    --plot-data "$RES_DIR/plot-data.json" --check || rc=$?
if [ -x benches/.venv/bin/python ]; then
    benches/.venv/bin/python benches/plot.py "$RES_DIR/plot-data.json" benches/plots \
        >>"$LOG_DIR/plot.log" 2>&1 || warn "plotting failed (see $LOG_DIR/plot.log)"
    "$BIN/riffle-bench" report --results-dir benches/results --readme benches/README.md \
        --plots-dir benches/plots >/dev/null 2>&1 || true
fi
[ $rc = 0 ] || say "FAILED: a system returned wrong bytes (see above)"
say "total $((SECONDS - RUN_STARTED)) s"
exit "$rc"
