#!/usr/bin/env bash
# Splice against the copy for READ replies without passthrough (issue 50, the splice lever):
#
#   benches/splice_probe.sh [--size MIB] [--rounds N]
#
# Builds benches/splice_probe.c (a one-file FUSE file system on libfuse 3, whose splice path
# is the reference one: fuse_reply_data) and reads its file end to end with dd (1 MiB reads,
# which reach the server as the kernel's 128 KiB read-ahead requests;
# the FUSE file's page cache dropped before each round) answered four ways: from memory (one
# copy in the kernel: how riffle answers a cached read without passthrough), spliced from the
# backing file's page cache, spliced with SPLICE_F_MOVE, and
# spliced with SPLICE_F_MOVE from an O_DIRECT descriptor (fresh pages the kernel may steal
# instead of copying). Each round checks the bytes (cmp) and measures MiB/s, the server's CPU
# (utime + stime of its threads) and the machine's (user + nice + system + irq + softirq of
# /proc/stat) per GiB. With perf, the move rounds are profiled too: samples in
# replace_page_cache_folio (a page moved) and in fuse_copy_folio (a page copied) say which
# the kernel did. Writes benches/results/splice-probe.md and prints it. Needs root (mount,
# dropping caches), fuse3 and libfuse3-dev (installed with apt when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SIZE=1024
ROUNDS=3
while [ $# -gt 0 ]; do
    case $1 in
        --size) SIZE=$2; shift ;;
        --rounds) ROUNDS=$2; shift ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        *) echo "benches/splice_probe.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
die() { echo "benches/splice_probe.sh: $*" >&2; exit 1; }
[[ $SIZE =~ ^[0-9]+$ ]] && [ "$SIZE" -ge 16 ] || die "--size must be a number of MiB, at least 16"
[[ $ROUNDS =~ ^[0-9]+$ ]] && [ "$ROUNDS" -ge 1 ] || die "--rounds must be a number, at least 1"
[ "$(id -u)" = 0 ] || die "run as root (mounting, dropping the page cache)"
if ! pkg-config --exists fuse3 2>/dev/null || ! command -v fusermount3 >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        fuse3 libfuse3-dev pkg-config gcc >/dev/null || die "apt-get install libfuse3-dev failed"
fi

WORK=$(mktemp -d /tmp/riffle-splice-probe.XXXXXX)
MNT=$WORK/mnt
SERVER_PID=
cleanup() {
    mountpoint -q "$MNT" 2>/dev/null && fusermount3 -u "$MNT"
    [ -n "$SERVER_PID" ] && wait "$SERVER_PID" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$MNT"
# shellcheck disable=SC2046
gcc -O2 -Wall -o "$WORK/splice_probe" "$ROOT/benches/splice_probe.c" $(pkg-config --cflags --libs fuse3) \
    || die "cannot build benches/splice_probe.c"
dd if=/dev/urandom of="$WORK/backing" bs=1M count="$SIZE" status=none

ticks_of() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
machine_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 }' /proc/stat; }
hz=$(getconf CLK_TCK)
has_perf=0
command -v perf >/dev/null && perf stat -e cpu-clock true >/dev/null 2>&1 && has_perf=1

REPORT=$WORK/report.md
{
    echo "| reply | MiB/s | server CPU s per GiB | machine CPU s per GiB | pages moved / copied (perf samples) |"
    echo "|---|---|---|---|---|"
} >"$REPORT"
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

for mode in mem splice move move-direct; do
    "$WORK/splice_probe" "$mode" "$WORK/backing" "$MNT" 2>"$WORK/$mode.log" &
    SERVER_PID=$!
    for _ in $(seq 100); do mountpoint -q "$MNT" && break; sleep 0.05; done
    mountpoint -q "$MNT" || die "$mode: the probe did not mount ($(cat "$WORK/$mode.log"))"
    cmp -s "$WORK/backing" "$MNT/f" || die "$mode: the file's bytes differ from the backing file's"
    : >"$WORK/rates"; : >"$WORK/server"; : >"$WORK/machine"
    for _ in $(seq "$ROUNDS"); do
        sync; echo 3 >/proc/sys/vm/drop_caches
        # The page-cache modes read the backing file from memory, as riffle's memory blocks are.
        [ "$mode" = move-direct ] || cat "$WORK/backing" >/dev/null
        s0=$(ticks_of "$SERVER_PID"); m0=$(machine_ticks); t0=$(date +%s.%N)
        dd if="$MNT/f" of=/dev/null bs=1M status=none
        t1=$(date +%s.%N); s1=$(ticks_of "$SERVER_PID"); m1=$(machine_ticks)
        awk -v s="$SIZE" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f\n", s / (b - a) }' >>"$WORK/rates"
        awk -v t=$((s1 - s0)) -v hz="$hz" -v s="$SIZE" 'BEGIN { printf "%.3f\n", t / hz / (s / 1024) }' >>"$WORK/server"
        awk -v t=$((m1 - m0)) -v hz="$hz" -v s="$SIZE" 'BEGIN { printf "%.3f\n", t / hz / (s / 1024) }' >>"$WORK/machine"
    done
    moved="—"
    if [ "$has_perf" = 1 ] && [[ $mode == move* ]]; then
        sync; echo 3 >/proc/sys/vm/drop_caches
        [ "$mode" = move-direct ] || cat "$WORK/backing" >/dev/null
        perf record -q -a -F 4999 -e cpu-clock -o "$WORK/$mode.perf" -- \
            dd if="$MNT/f" of=/dev/null bs=1M status=none 2>/dev/null
        count() { perf report -i "$WORK/$mode.perf" --no-children --sort sym --stdio -q -F sample,sym 2>/dev/null |
            awk -v s="$1" '$NF == s { n += $1 } END { print n + 0 }'; }
        moved="$(count replace_page_cache_folio) / $(count fuse_copy_folio)"
    fi
    fusermount3 -u "$MNT"
    wait "$SERVER_PID" || true
    SERVER_PID=
    printf '| %s | %s | %s | %s | %s |\n' "$mode" "$(median <"$WORK/rates")" "$(median <"$WORK/server")" \
        "$(median <"$WORK/machine")" "$moved" >>"$REPORT"
done

OUT=$ROOT/benches/results/splice-probe.md
{
    echo "# Splice against the copy for READ replies"
    echo
    echo "\`benches/splice_probe.sh\` on $(date -u +%F), kernel $(uname -r), $(nproc) CPUs: a ${SIZE} MiB file read with \`dd bs=1M\` through a one-file libfuse $(pkg-config --modversion fuse3) server (8 threads), the FUSE file's page cache dropped before each of $ROUNDS rounds; medians. The machine is shared: compare rows of this one run."
    echo
    cat "$REPORT"
} >"$OUT"
cat "$OUT"
