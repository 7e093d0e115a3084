#!/usr/bin/env bash
# The rifflefs benchmarks (shared/BENCHMARKS.md), every system side by side
# in one run:
#
#   benches/run.sh [--quick] [--debug] [--no-plots] [--systems LIST] [--direct LIST]
#                  [--no-build] [--build-mountpoint] [W1 W2 W3 W4 W5 W6]
#
# Builds the binaries, starts the local Ceph RGW if it is down, installs the
# peers (s3fs, rclone) with apt when missing, generates the datasets
# (skipping objects already uploaded), starts riffle-proxy in front of RGW
# (30 ms first byte, 100 MB/s per connection) and, for each workload, reads
# the dataset through every system with the same reader (riffle-bench
# read-fs; on W1, local disk and riffle also with the Python reader,
# benches/python_reader.py: the *-py systems), epoch 1 (cold) and epoch 2
# (warm; W2 adds epoch 3, a re-read; W5: three epochs per eviction policy),
# the page cache dropped before each epoch, GETs counted at the proxy and
# riffle's counters saved around each epoch. riffle, riffle-py and
# riffle-nopt each run beside their /dev/fuse twin (riffle-devfuse,
# riffle-devfuse-py, riffle-nopt-devfuse: --fuse-transport dev-fuse), the
# kernel's FUSE io_uring switched on where root can, and every riffle row
# records the transport `riffle stats` gave right after mounting. W4 (listing, benches/lib/w4.sh)
# walks its 1.1 M names instead of reading: find, stat of every file, daemon
# RSS, then the same after a remount, LISTs and HEADs counted at the proxy.
# W6 (benches/w6.sh, benches/lib/w6.sh) mounts W1's data three times as three
# nodes, with and without --peers, and reads DistributedSampler shares. Prints the tables, merges them into benches/results/{quick,full}.json
# and writes benches/README.md and the plots in benches/plots/ (or under --report-dir). Exits
# non-zero if any system returned wrong bytes, and with --quick also if a
# riffle variant failed to run or hit I/O errors. Every mount is unmounted on
# exit, failure included.
#
# Full run (W4's 1.1 M objects take ~12 min to upload the first time):
#   benches/run.sh
#
# CI smoke test (after the debug build of the tests; ~5 min):
#   benches/run.sh --quick --debug --no-build --no-plots
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

usage() {
    cat <<USAGE
Usage: benches/run.sh [--quick] [options] [W1 W2 W3 W4 W5 W6]

  --quick          scaled-down datasets (scale 0.05, W3 reads 2 s, W4 scale
                   0.01): a smoke test of a few minutes that fails on wrong
                   bytes (or a wrong W4 count) or a failed riffle
                   [default workloads W1 W2 W3 W5; add W4 or W6 to run
                   them: W6's six rows take ~4 min in debug on this shared
                   machine, too long for CI's smoke run]
                   (without --quick: full datasets, default workloads W1 W2 W5 W4 W6)
  --debug          build and run the debug profile (cargo build without
                   --release: what CI builds for the tests); also
                   RIFFLE_BENCH_PROFILE=debug
  --no-plots       skip the Python venv and the plots (CI)
  --systems LIST   systems to run, comma-separated [$DEFAULT_SYSTEMS]
                   (also: riffle-mem, riffle without a disk cache; SYSTEM-py
                   is W1's SYSTEM read by the Python reader, benches/python_reader.py;
                   a riffle VARIANT-devfuse, e.g. riffle-nopt-devfuse or
                   riffle-devfuse-py, is VARIANT with --fuse-transport dev-fuse)
  --direct LIST    systems also run against RGW without the proxy, or "none"
                   [quick: none; full: s3-client,riffle]
  --no-build       use the binaries as they are
  --build-mountpoint  build the bench-only Mountpoint binary if needed (~10 min
                   the first time; default in full runs, not with --quick)
  --report-dir DIR where the results (DIR/results), the report (DIR/README.md)
                   and the plots (DIR/plots) go [benches: the committed ones];
                   another DIR starts from a copy of the committed results, so
                   a smoke run (tests/run.sh) leaves the tracked tree as it was

Environment: RIFFLE_BENCH_WORK (scratch dir) [benches/.work],
RIFFLE_BENCH_SEED [1], RIFFLE_BENCH_SCALE (the datasets' scale in a full run,
for a shorter measurement or a machine whose RGW cannot hold them; riffle's
--max-memory is scaled with it) [1], RIFFLE_BENCH_W1_MAX_FILES (each W1 epoch reads the same
seeded N files, whole directories; 0 = all) [quick: all, full: 6000],
RIFFLE_BENCH_W5_MAX_FILES (the same for W5) [quick: all, full: 6000],
RIFFLE_BENCH_EPOCH_TIMEOUT (seconds) [quick 180, full 1200],
RIFFLE_BENCH_GOAL_ROUNDS (rounds of the goal comparisons, each with a new
copy: W1 copy-first, riffle + plan and riffle, W2 local disk and riffle;
1 = only the table's rows) [quick 2, full 5],
RIFFLE_BENCH_W3_DURATION [quick 2s, full 30s], RIFFLE_BENCH_W4_SCALE [quick
0.01, full 1], RIFFLE_BENCH_W4_TIMEOUT (seconds each W4 pass may take, per
system) [quick 120, full 600], RIFFLE_BENCH_W4_ROUNDS (rounds of W4's goal
comparisons: the S3 client, riffle, riffle's sequential walk) [quick 2, full
3], RIFFLE_BENCH_W6_ROUNDS (rounds of W6's rows; its table shows medians)
[quick 1, full 3], RIFFLE_BENCH_W6_SCALE (W1's scale for W6) [quick 0.05,
full 0.3], RIFFLE_BENCH_CACHE_MIN_FREE (riffle's --cache-min-free: the caches
are scratch, bounded by the datasets; rclone and s3fs keep no floor) [1G],
RIFFLE_BENCH_PY_WORKERS (the
Python reader's worker processes) [8], RIFFLE_BENCH_FUSE_TRANSPORT (the
--fuse-transport of the riffle rows but the -devfuse twins: auto or
io-uring) [auto], MOUNTPOINT_* (see
benches/lib/mountpoint.sh; MOUNTPOINT_CACHE defaults to 1 here).
USAGE
}

# Run order (benches/README.md, "Run order"): riffle-plan right after copy-first, the pair of the
# cold-epoch goal; the table's row order is fixed elsewhere (results/render.rs).
# Each riffle row that the transport matters for is followed by its /dev/fuse twin (issue 50).
DEFAULT_SYSTEMS="local,local-py,copy-first,riffle-plan,s3-client,riffle,riffle-devfuse,riffle-py,riffle-devfuse-py,riffle-plan-py,riffle-nopt,riffle-nopt-devfuse,riffle-listing,riffle-seq,s3fs,rclone,mountpoint"
MODE=full
SYSTEMS=$DEFAULT_SYSTEMS
DIRECT=
BUILD=1
REPORT_DIR=benches
BUILD_MOUNTPOINT=
PLOTS=1
PROFILE=${RIFFLE_BENCH_PROFILE:-release}
WORKLOADS=()
while [ $# -gt 0 ]; do
    case $1 in
        --quick) MODE=quick ;;
        --debug) PROFILE=debug ;;
        --no-plots) PLOTS=0 ;;
        --systems) SYSTEMS=${2:?}; shift ;;
        --direct) DIRECT=${2:?}; shift ;;
        --no-build) BUILD=0 ;;
        --build-mountpoint) BUILD_MOUNTPOINT=1 ;;
        --report-dir) REPORT_DIR=${2:?}; shift ;;
        -h|--help) usage; exit 0 ;;
        [wW][1-6]) WORKLOADS+=("$(echo "$1" | tr 'W' 'w')") ;;
        *) usage >&2; exit 2 ;;
    esac
    shift
done
case $PROFILE in
    release|debug) ;;
    *) echo "benches/run.sh: RIFFLE_BENCH_PROFILE must be release or debug" >&2; exit 2 ;;
esac
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/$PROFILE
if [ "$MODE" = quick ]; then
    SCALE=0.05
    W3_DURATION=${RIFFLE_BENCH_W3_DURATION:-2s}
    EPOCH_TIMEOUT=${RIFFLE_BENCH_EPOCH_TIMEOUT:-180}
    DIRECT=${DIRECT:-none}
    # Small enough that the quick datasets do not fit riffle's memory cache,
    # so warm epochs exercise the disk cache.
    RIFFLE_BASE_MEMORY=64M
    BUILD_MOUNTPOINT=${BUILD_MOUNTPOINT:-0}
    GOAL_ROUNDS=${RIFFLE_BENCH_GOAL_ROUNDS:-2}
    W4_DEFAULT_SCALE=0.01
    W4_TIMEOUT=${RIFFLE_BENCH_W4_TIMEOUT:-120}
    W4_ROUNDS=${RIFFLE_BENCH_W4_ROUNDS:-2}
    # W4 is not in the quick default (CI's smoke test): see benches/README.md.
    W6_ROUNDS=${RIFFLE_BENCH_W6_ROUNDS:-1}
    # Nor W6 (~4 min in debug): `benches/run.sh --quick W6` runs it.
    [ ${#WORKLOADS[@]} -gt 0 ] || WORKLOADS=(w1 w2 w3 w5)
else
    SCALE=${RIFFLE_BENCH_SCALE:-1}
    W1_MAX_FILES=${RIFFLE_BENCH_W1_MAX_FILES-6000}
    W5_MAX_FILES=${RIFFLE_BENCH_W5_MAX_FILES-6000}
    W3_DURATION=${RIFFLE_BENCH_W3_DURATION:-30s}
    EPOCH_TIMEOUT=${RIFFLE_BENCH_EPOCH_TIMEOUT:-1200}
    DIRECT=${DIRECT:-s3-client,riffle}
    # 1 GiB of memory cache for the whole datasets, the same share of them at a smaller scale.
    RIFFLE_BASE_MEMORY_MB=$(awk -v s="$SCALE" 'BEGIN {printf "%d", 1024 * s}')
    RIFFLE_BASE_MEMORY=${RIFFLE_BASE_MEMORY_MB}M
    [ "$RIFFLE_BASE_MEMORY_MB" = 1024 ] && RIFFLE_BASE_MEMORY=1G
    BUILD_MOUNTPOINT=${BUILD_MOUNTPOINT:-$BUILD}
    GOAL_ROUNDS=${RIFFLE_BENCH_GOAL_ROUNDS:-5}
    W4_DEFAULT_SCALE=1
    W4_TIMEOUT=${RIFFLE_BENCH_W4_TIMEOUT:-600}
    # Each W4 round walks 1.1 M names three times over (the S3 client, riffle
    # with its remount, the sequential walk): 3 rounds, not GOAL_ROUNDS.
    W4_ROUNDS=${RIFFLE_BENCH_W4_ROUNDS:-3}
    W6_ROUNDS=${RIFFLE_BENCH_W6_ROUNDS:-3}
    [ ${#WORKLOADS[@]} -gt 0 ] || WORKLOADS=(w1 w2 w5 w4 w6)
fi
W4_SCALE=${RIFFLE_BENCH_W4_SCALE:-$W4_DEFAULT_SCALE}
[[ $SCALE =~ ^(0?\.[0-9]*[1-9][0-9]*|1(\.0*)?)$ ]] || { echo "benches/run.sh: RIFFLE_BENCH_SCALE must be in (0, 1]" >&2; exit 2; }
# RGW's memory for W4 at scale 1 (GB), for check_memory: the OSD's RSS grew
# by ~15 GB (13.7 KB per object) uploading its 1.1 M objects.
W4_RGW_GB_PER_SCALE=15
[ "$DIRECT" = none ] && DIRECT=
[[ $GOAL_ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "benches/run.sh: RIFFLE_BENCH_GOAL_ROUNDS must be a whole number ≥ 1" >&2; exit 2; }
[[ $W6_ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "benches/run.sh: RIFFLE_BENCH_W6_ROUNDS must be a whole number ≥ 1" >&2; exit 2; }
[[ $W4_ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "benches/run.sh: RIFFLE_BENCH_W4_ROUNDS must be a whole number ≥ 1" >&2; exit 2; }
[[ $W4_TIMEOUT =~ ^[1-9][0-9]*$ ]] || { echo "benches/run.sh: RIFFLE_BENCH_W4_TIMEOUT must be a whole number of seconds ≥ 1" >&2; exit 2; }
[[ $W4_SCALE =~ ^(0?\.[0-9]*[1-9][0-9]*|1(\.0*)?)$ ]] || { echo "benches/run.sh: RIFFLE_BENCH_W4_SCALE must be in (0, 1]" >&2; exit 2; }
ROUND=1
SEED=${RIFFLE_BENCH_SEED:-1}
W1_MAX_FILES=${W1_MAX_FILES-${RIFFLE_BENCH_W1_MAX_FILES:-}}
W5_MAX_FILES=${W5_MAX_FILES-${RIFFLE_BENCH_W5_MAX_FILES:-}}
RIFFLE_EXTRA_ARGS=()
RIFFLE_CACHE_MIN_FREE=${RIFFLE_BENCH_CACHE_MIN_FREE:-1G}
RIFFLE_TRANSPORT=${RIFFLE_BENCH_FUSE_TRANSPORT:-auto}
case $RIFFLE_TRANSPORT in
    auto|io-uring) ;;
    *) echo "benches/run.sh: RIFFLE_BENCH_FUSE_TRANSPORT must be auto or io-uring (the -devfuse rows are dev-fuse)" >&2; exit 2 ;;
esac
export MOUNTPOINT_CACHE=${MOUNTPOINT_CACHE:-1}

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
# shellcheck source=benches/lib/w4.sh
. "$ROOT/benches/lib/w4.sh"
# shellcheck source=benches/lib/w5.sh
. "$ROOT/benches/lib/w5.sh"
# shellcheck source=benches/lib/w6.sh
. "$ROOT/benches/lib/w6.sh"
W6_FAILED=
# The Mountpoint peer (mount_mountpoint, unmount_mountpoint, build_mountpoint).
if [ -f "$ROOT/benches/lib/mountpoint.sh" ]; then
    # shellcheck source=benches/lib/mountpoint.sh
    . "$ROOT/benches/lib/mountpoint.sh"
fi

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

say "benches/run.sh: mode $MODE ($PROFILE build), workloads ${WORKLOADS[*]}, systems $SYSTEMS, no-proxy column: ${DIRECT:-none}"
say "scratch $WORK, logs $LOG_DIR"
[ "$BUILD" = 1 ] && build_binaries
[ -x "$BIN/riffle" ] && [ -x "$BIN/riffle-bench" ] && [ -x "$BIN/riffle-proxy" ] \
    || die "no $PROFILE binaries in $BIN (run without --no-build)"
BUILT_AT=$SECONDS
ensure_rgw
ensure_peer_tools
ensure_plot_venv
prepare_mountpoint
check_memory "${WORKLOADS[@]}"
start_proxy
drop_caches || warn "cannot write /proc/sys/vm/drop_caches: the page cache is NOT dropped between epochs"
enable_fuse_ring
case $FUSE_RING in
    on) say "FUSE over io_uring: on ($FUSE_RING_SWITCH); riffle rows ask for --fuse-transport $RIFFLE_TRANSPORT, -devfuse rows for dev-fuse" ;;
    *) warn "$(fuse_ring_note)" ;;
esac

for wl in "${WORKLOADS[@]}"; do
    run_workload "$wl"
done

say "all workloads done in $((SECONDS - RUN_STARTED)) s ($((SECONDS - BUILT_AT)) s after the build); writing the report"
rc=0
checks=(--check)
[ "$MODE" = quick ] && checks+=(--require riffle)
# A run of W6 alone records no rows (its table is benches/results/w6-MODE.md).
run_arg=()
[ -s "$RUN_FILE" ] && run_arg=(--run "$RUN_FILE")
if [ "$REPORT_DIR" != benches ] && [ ! -d "$REPORT_DIR/results" ]; then
    # Start from the committed results, so the report keeps the sections this run did not
    # redo (the full run's, other workloads').
    mkdir -p "$REPORT_DIR/plots"
    cp -r benches/results "$REPORT_DIR/results"
    cp benches/README.md "$REPORT_DIR/README.md"
fi
"$BIN/riffle-bench" report "${run_arg[@]}" --results-dir "$REPORT_DIR/results" \
    --readme "$REPORT_DIR/README.md" --plots-dir "$REPORT_DIR/plots" \
    --plot-data "$RES_DIR/plot-data.json" "${checks[@]}" || rc=$?
if [ "$PLOTS" = 1 ] && [ -x benches/.venv/bin/python ]; then
    benches/.venv/bin/python benches/plot.py "$RES_DIR/plot-data.json" "$REPORT_DIR/plots" \
        >>"$LOG_DIR/plot.log" 2>&1 || warn "plotting failed (see $LOG_DIR/plot.log)"
    "$BIN/riffle-bench" report --results-dir "$REPORT_DIR/results" --readme "$REPORT_DIR/README.md" \
        --plots-dir "$REPORT_DIR/plots" >/dev/null 2>&1 || true
fi
say "report: $REPORT_DIR/README.md"
if [ -n "$W6_FAILED" ]; then
    say "FAILED: W6: $W6_FAILED"
    rc=1
fi
[ $rc = 0 ] || say "FAILED: a system returned wrong bytes (W4: counted wrong; W6: a failed read or run), or a riffle variant failed (see above)"
say "total $((SECONDS - RUN_STARTED)) s ($((SECONDS - BUILT_AT)) s after the build)"
exit "$rc"
