#!/usr/bin/env bash
# Where a warm epoch's CPU goes (issue 50): the Python reader (benches/python_reader.py, the
# per-file calls of a DataLoader's workers, no decode) reads a W1-shaped set of small files
# once from local disk and once through each riffle variant below, warm (every file in
# riffle's cache, the page cache dropped), under `perf record -a` (the software clock: no
# hardware counters are needed). perf's samples are split by who spent them:
#
#   reader user     the reader's processes in user space (Python, zlib's CRC-32)
#   reader kernel   the reader's system calls: open, the isatty ioctl, read, close, and
#                   everything FUSE does on the caller's side (request, wait, wake-up,
#                   passthrough's read of the cache file)
#   daemon user     riffle's process in user space
#   daemon kernel   riffle's system calls (reads and answers of /dev/fuse or the rings)
#   other           everything else on the machine that was not idle (kernel threads such
#                   as kworkers, and whatever else runs: quote the others, not this one)
#
# and the kernel functions that took most of the reader's and the daemon's kernel time are
# listed per variant. CPU is given in µs per file (samples ÷ the sampling rate ÷ files). The
# io_uring variant then reads one more warm epoch with only the daemon recorded, with call
# stacks: the FUSE requests per file and how the daemon's time splits between waiting for a
# request, each request's answer and riffle's own code.
#
#   benches/cpu_profile.sh [--files N] [--workers N] [--rate HZ] [--no-build]
#
# Variants: local disk; riffle (passthrough) over io_uring and over /dev/fuse; riffle
# --no-passthrough over io_uring and over /dev/fuse. io_uring rows need the kernel's switch
# (/sys/module/fuse/parameters/enable_uring, turned on here where root can). Needs perf
# (Debian: linux-perf), the RGW (deploy/local/rgw.sh up) and release binaries (built unless
# --no-build). Writes benches/results/cpu-profile.md and prints it.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

FILES=2000
WORKERS=8
RATE=4999
BUILD=1
while [ $# -gt 0 ]; do
    case $1 in
        --files) FILES=$2; shift ;;
        --workers) WORKERS=$2; shift ;;
        --rate) RATE=$2; shift ;;
        --no-build) BUILD=0 ;;
        -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
        *) echo "benches/cpu_profile.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
die() { echo "benches/cpu_profile.sh: $*" >&2; exit 1; }
[[ $FILES =~ ^[0-9]+$ ]] && [ "$FILES" -ge 100 ] || die "--files must be a number, at least 100"
command -v perf >/dev/null || die "perf is missing (apt-get install linux-perf)"
[ "$(id -u)" = 0 ] || die "run as root (perf -a, dropping the page cache, mounting)"
bash deploy/local/rgw.sh status >/dev/null 2>&1 || die "the RGW is not up (bash deploy/local/rgw.sh up)"
eval "$(bash deploy/local/rgw.sh env)"

BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release
if [ "$BUILD" = 1 ]; then
    cargo build --release -q -p rifflefs -p riffle-bench || die "cargo build failed"
fi
[ -x "$BIN/riffle" ] && [ -x "$BIN/riffle-bench" ] || die "no release binaries in $BIN"
ring_switch=/sys/module/fuse/parameters/enable_uring
[ -w "$ring_switch" ] && echo Y > "$ring_switch"

WORK=$(mktemp -d /tmp/riffle-cpu-profile.XXXXXX)
MNT=$WORK/mnt
mkdir -p "$MNT" "$WORK/local"
cleanup() {
    mountpoint -q "$MNT" && "$BIN/riffle" unmount "$MNT" >/dev/null 2>&1
    rm -rf "$WORK"
}
trap cleanup EXIT

# W1's shape (small image files in class directories), scaled to about FILES files.
BUCKET=riffle-cpu-profile
scale=$(awk -v f="$FILES" 'BEGIN { s = f / 20000; if (s > 1) s = 1; printf "%.4f", s }')
"$BIN/riffle-bench" gen --workload w1 --scale "$scale" --bucket "$BUCKET" \
    --manifest "$WORK/w1.manifest" >/dev/null 2>"$WORK/gen.log" || { cat "$WORK/gen.log" >&2; die "gen failed"; }
"$BIN/riffle-bench" plan --manifest "$WORK/w1.manifest" --seed 1 --epoch 2 --crc32 \
    --out "$WORK/plan.tsv" 2>"$WORK/plan.log" || { cat "$WORK/plan.log" >&2; die "plan failed"; }
files=$(wc -l < "$WORK/plan.tsv")

drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }
read_epoch() { # ROOT [perf output [perf record options, instead of the whole machine's]]
    local args=(python3 "$ROOT/benches/python_reader.py" --root "$1" --plan "$WORK/plan.tsv"
        --workers "$WORKERS" --seed 1 --epoch 2 --json-out "$WORK/epoch.json")
    local out=${2:-}
    shift $(($# < 2 ? $# : 2))
    [ $# -gt 0 ] || set -- -a -g -F "$RATE"
    drop_caches
    if [ -n "$out" ]; then
        perf record -q "$@" -e cpu-clock -o "$out" -- "${args[@]}" >/dev/null 2>>"$WORK/perf.log"
    else
        "${args[@]}" >/dev/null
    fi
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if r["errors"]==0 and r["mismatches"]==0 else 1)' \
        "$WORK/epoch.json" || die "the reader got errors or wrong bytes on $1"
}

# Samples of one recording, split as the header says: "reader_user reader_kernel daemon_user
# daemon_kernel other" (perf report's raw counts; idle excluded).
# perf's `pid` key is the thread: the daemon's threads are the ones listed under /proc (taken
# while it still runs).
split_samples() { # perf.data daemon-thread-ids (comma-separated)
    perf report -i "$1" --no-children --sort pid,comm,dso -F sample,pid,comm,dso --stdio -q 2>/dev/null |
        awk -v daemon=",${2:-none}," '
            NF >= 4 {
                n = $1; tid = $2; sub(/:.*/, "", tid); dso = $NF
                if ($0 ~ /swapper/) next
                k = (dso == "[kernel.kallsyms]") ? "kernel" : "user"
                if (index(daemon, "," tid ",")) d[k] += n
                else if ($0 ~ /python3/) r[k] += n
                else o += n
            }
            END { printf "%d %d %d %d %d\n", r["user"], r["kernel"], d["user"], d["kernel"], o }'
}
top_kernel() { # perf.data filter-args...
    local data=$1; shift
    perf report -i "$data" --no-children "$@" --dso '[kernel.kallsyms]' --percentage relative \
        --sort sym --stdio -q 2>/dev/null | awk '$1 ~ /%$/ && $2 == "[k]" { print $1, $3 }' |
        head -n 6 | paste -sd ';' | sed 's/;/; /g'
}
us_per_file() { awk -v n="$1" -v r="$RATE" -v f="$files" 'BEGIN { printf "%.0f", n / r / f * 1e6 }'; }

REPORT=$WORK/report.md
{
    echo "| warm epoch, Python reader ($WORKERS processes, $files files) | files/s | reader user | reader kernel | daemon user | daemon kernel | other | machine (all but other) |"
    echo "|---|---|---|---|---|---|---|---|"
} >"$REPORT"
NOTES=$WORK/notes.md
: >"$NOTES"
row() { # label perf.data daemon-thread-ids
    local s fps machine
    read -r -a s <<<"$(split_samples "$2" "${3:-}")"
    fps=$(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["files_per_s"]))' "$WORK/epoch.json")
    machine=$((s[0] + s[1] + s[2] + s[3]))
    printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$1" "$fps" \
        "$(us_per_file "${s[0]}")" "$(us_per_file "${s[1]}")" "$(us_per_file "${s[2]}")" \
        "$(us_per_file "${s[3]}")" "$(us_per_file "${s[4]}")" "$(us_per_file "$machine")" >>"$REPORT"
    {
        echo "- **$1**: the reader's kernel time: $(top_kernel "$2" --comm python3)"
        if [ -n "${3:-}" ]; then echo "  - the daemon's kernel time: $(top_kernel "$2" --tid "$3")"; fi
    } >>"$NOTES"
}

# The daemon alone over one more warm epoch, with its call stacks (DWARF: the release build
# keeps no frame pointers): the FUSE requests per file that came over its rings, and the share
# of its samples spent under each step of a request (inclusive, so a step's callees count in
# it too).
DAEMON=$WORK/daemon.md
: >"$DAEMON"
ring_requests() { "$BIN/riffle" stats --json "$MNT" | python3 -c 'import json,sys; print(json.load(sys.stdin)["fuse"]["ring_requests"])'; }
daemon_profile() { # label
    local pid before after
    pid=$(cat "$WORK/riffle.pid")
    before=$(ring_requests)
    read_epoch "$MNT" "$WORK/daemon.data" --call-graph dwarf,16384 -F 999 -p "$pid"
    after=$(ring_requests)
    share() { # symbol pattern (awk regex)
        perf report -i "$WORK/daemon.data" --children -g none --sort sym --stdio -q 2>/dev/null |
            awk -v p="$1" '$0 ~ p { v = $1; sub(/%/, "", v); if (v + 0 > best) best = v + 0 } END { printf "%.0f%%", best }'
    }
    own=$(perf report -i "$WORK/daemon.data" --no-children -g none --sort dso --stdio -q 2>/dev/null |
        awk '$2 == "riffle" { v = $1; sub(/%/, "", v); printf "%.0f%%", v }')
    {
        echo "**$1**, the daemon alone over one more warm epoch (\`perf record --call-graph dwarf -p\`):"
        echo "$((after - before)) FUSE requests over its rings for $files files ($(awk -v r=$((after - before)) -v f="$files" 'BEGIN { printf "%.2f", r / f }') per file). Share of the daemon's samples:"
        echo
        echo "| waiting for a request (\`io_cqring_wait\`) | of it, the switch in (\`finish_task_switch\`) | lookup | of it, the cache file's read-ahead | open | release | ioctl | commits (\`fuse_uring_cmd\`) | riffle's own code (all requests) |"
        echo "|---|---|---|---|---|---|---|---|---|"
        echo "| $(share ' io_cqring_wait$') | $(share ' finish_task_switch') | $(share 'Filesystem>::lookup$') | $(share 'Lookahead::run$') | $(share 'Filesystem>::open$') | $(share 'Filesystem>::release$') | $(share 'Filesystem>::ioctl$') | $(share ' fuse_uring_cmd$') | ${own:-0%} |"
    } >>"$DAEMON"
}

echo "cpu_profile: $files files; local disk" >&2
mount_riffle() { # extra args...
    rm -rf "$WORK/cache"; mkdir -p "$WORK/cache"
    "$BIN/riffle" mount "s3://$BUCKET" "$MNT" --endpoint-url "$AWS_ENDPOINT_URL" --force-path-style \
        --metadata-ttl indefinite --cache-dir "$WORK/cache" --cache-min-free 0 \
        --pid-file "$WORK/riffle.pid" --log-file "$WORK/riffle.log" "$@" >/dev/null
}
# The local copy comes through a first riffle mount (its cold epoch fills the cache).
mount_riffle --fuse-transport dev-fuse
cp -r "$MNT/." "$WORK/local/"
"$BIN/riffle" unmount "$MNT" >/dev/null
read_epoch "$WORK/local"
read_epoch "$WORK/local" "$WORK/local.data"
row "local disk" "$WORK/local.data"

for variant in "io_uring|--fuse-transport io-uring" "/dev/fuse|--fuse-transport dev-fuse" \
    "io_uring, no passthrough|--fuse-transport io-uring --no-passthrough" \
    "/dev/fuse, no passthrough|--fuse-transport dev-fuse --no-passthrough"; do
    label="riffle, ${variant%%|*}"
    echo "cpu_profile: $label" >&2
    # shellcheck disable=SC2086
    if ! mount_riffle ${variant#*|}; then
        echo "| $label | not run: riffle mount failed ($(tail -n1 "$WORK/riffle.log" 2>/dev/null)) |||||||" >>"$REPORT"
        continue
    fi
    read_epoch "$MNT"                   # cold: fills the cache
    read_epoch "$MNT"                   # warm once untraced (passthrough opens settle)
    read_epoch "$MNT" "$WORK/riffle.data"
    tids=$(ls "/proc/$(cat "$WORK/riffle.pid")/task" | paste -sd ,)
    row "$label" "$WORK/riffle.data" "$tids"
    [ "$label" = "riffle, io_uring" ] && daemon_profile "$label"
    "$BIN/riffle" unmount "$MNT" >/dev/null
done

OUT=$ROOT/benches/results/cpu-profile.md
{
    echo "# Where a warm epoch's CPU goes"
    echo
    echo "\`benches/cpu_profile.sh\` on $(date -u +%F), kernel $(uname -r), $(nproc) CPUs; µs of CPU per file, from \`perf record -a -F $RATE -e cpu-clock\` over one warm epoch each (the page cache dropped before it). The machine is shared: compare rows of this one run."
    echo
    cat "$REPORT"
    echo
    echo "Kernel functions with the most samples (share of that process group's kernel samples):"
    echo
    cat "$NOTES"
    if [ -s "$DAEMON" ]; then
        echo
        cat "$DAEMON"
    fi
} >"$OUT"
cat "$OUT"
