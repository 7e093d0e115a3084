#!/usr/bin/env bash
# The memory workload: peak RSS of one riffle daemon ÷ its --max-memory,
# under each reader load of issue 39, against the local Ceph RGW:
#
#   benches/memory.sh [--quick] [--debug] [--no-build] [--budgets "64M 256M 1G"]
#                     [--riffle PATH] [--out FILE]
#
#   small    64 readers of small files (W1 files, read-fs --threads 64)
#   shards   6 shards read in parallel, 1 MiB reads (W2, --threads 6)
#   random   random 4 KiB-1 MiB preads of one big file (W3, 16 threads)
#   mixed    all three at once, with a listing walk (W4 tree, stat of every
#            file) at the same time
#
# Each (budget, workload) gets a fresh mount of one bucket holding the four
# datasets under w1/ w2/ w3/ w4/ (--cache-dir on an empty directory,
# --metadata-ttl indefinite), a cold epoch and a warm one (page cache dropped
# before each; the warm epoch reads from the disk cache), then the daemon's
# VmHWM from /proc/PID/status and its listed entries (riffle stats).
#
# The bound checked: peak RSS <= --max-memory + OVERHEAD + listed entries x
# PER_OBJECT (docs/memory.md, "The bound"), OVERHEAD 64 MiB and PER_OBJECT 500 bytes
# unless RIFFLE_MEM_OVERHEAD / RIFFLE_MEM_PER_OBJECT say otherwise. Writes
# benches/results/memory.md (the table) and puts it into benches/README.md
# (section "Memory bound", also kept by `riffle-bench report`); with --out,
# only FILE (e.g. another build's riffle, --riffle, for a before/after).
# Exits 1 when a row is over its bound or a reader saw wrong bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

QUICK=0
PROFILE=release
BUILD=1
BUDGETS="64M 256M 1G"
RIFFLE=
OUT=
while [ $# -gt 0 ]; do
    case $1 in
        --quick) QUICK=1 ;;
        --debug) PROFILE=debug ;;
        --no-build) BUILD=0 ;;
        --budgets) BUDGETS=$2; shift ;;
        --riffle) RIFFLE=$2; shift ;;
        --out) OUT=$2; shift ;;
        -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
        *) echo "benches/memory.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done

WORK=${RIFFLE_BENCH_WORK:-$ROOT/benches/.work}/memory
LOG_DIR=$WORK/logs
mkdir -p "$WORK/run" "$LOG_DIR" "$WORK/mnt"
# shellcheck source=lib/common.sh
. benches/lib/common.sh

OVERHEAD_MIB=${RIFFLE_MEM_OVERHEAD:-64}
PER_OBJECT=${RIFFLE_MEM_PER_OBJECT:-500}
if [ "$QUICK" = 1 ]; then
    W1_SCALE=0.02 W2_SCALE=0.05 W3_SCALE=0.03 W4_SCALE=0.002 DURATION=3s
else
    # W1 2,000 files (~220 MB), W2 16 shards of 64 MiB (1 GiB: more than the
    # memory cache of a 1G budget), W3 one 512 MiB file, W4 ~11,000 names.
    W1_SCALE=0.1 W2_SCALE=0.25 W3_SCALE=0.125 W4_SCALE=0.01 DURATION=20s
fi

if [ "$PROFILE" = release ]; then BIN=$ROOT/target/release; else BIN=$ROOT/target/debug; fi
RIFFLE=${RIFFLE:-$BIN/riffle}
if [ "$BUILD" = 1 ]; then
    flags=()
    [ "$PROFILE" = release ] && flags+=(--release)
    say "building $PROFILE riffle and riffle-bench"
    CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1} cargo build "${flags[@]}" -q -p rifflefs -p riffle-bench
fi

deploy/local/rgw.sh status >/dev/null 2>&1 || deploy/local/rgw.sh up >>"$LOG_DIR/rgw.log" 2>&1
eval "$(deploy/local/rgw.sh env)"
ENDPOINT=$AWS_ENDPOINT_URL
BUCKET=riffle-memory

say "datasets in s3://$BUCKET (uploading what is missing)"
gen() { # WORKLOAD SCALE
    "$BIN/riffle-bench" gen --workload "$1" --scale "$2" --bucket "$BUCKET" --prefix "$1" \
        --manifest "$WORK/$1.manifest" >>"$LOG_DIR/gen.log" 2>&1 \
        || die "riffle-bench gen $1 failed (see $LOG_DIR/gen.log)"
}
gen w1 "$W1_SCALE"; gen w2 "$W2_SCALE"; gen w3 "$W3_SCALE"; gen w4 "$W4_SCALE"

MNT=$WORK/mnt/riffle
CACHE=$WORK/cache
DAEMON_PID=
cleanup() {
    if in_mount_table "$MNT"; then
        "$RIFFLE" unmount "$MNT" >/dev/null 2>&1 || umount -l "$MNT" 2>/dev/null || true
    fi
}
trap cleanup EXIT

mount_riffle() { # BUDGET TAG
    cleanup
    rm -rf "$CACHE"; mkdir -p "$CACHE" "$MNT"
    local pidf="$WORK/run/riffle.pid"
    rm -f "$pidf"
    "$RIFFLE" mount "s3://$BUCKET" "$MNT" --endpoint-url "$ENDPOINT" --force-path-style \
        --metadata-ttl indefinite --max-memory "$1" --cache-dir "$CACHE" --cache-min-free 1G \
        --log-file "$LOG_DIR/riffle-$2.log" --pid-file "$pidf" >>"$LOG_DIR/riffle-$2.out" 2>&1 \
        || die "riffle mount failed (see $LOG_DIR/riffle-$2.out)"
    DAEMON_PID=$(cat "$pidf")
}

read_fs() { # DATASET PATTERN THREADS EPOCH OUT [extra...]
    local ds=$1 pattern=$2 threads=$3 epoch=$4 out=$5
    shift 5
    "$BIN/riffle-bench" read-fs --root "$MNT/$ds" --manifest "$WORK/$ds.manifest" \
        --pattern "$pattern" --threads "$threads" --epoch "$epoch" --json-out "$out" "$@" \
        >/dev/null 2>>"$LOG_DIR/readers.log"
}

# One epoch of WORKLOAD; returns non-zero on wrong bytes (exit code 1 of a reader).
epoch() { # WORKLOAD EPOCH TAG
    local wl=$1 e=$2 tag=$3 pids=() rc=0 p
    case $wl in
        small) read_fs w1 w1 64 "$e" "$WORK/run/$tag-w1.json" & pids+=($!) ;;
        shards) read_fs w2 w2 6 "$e" "$WORK/run/$tag-w2.json" & pids+=($!) ;;
        random) read_fs w3 w3 16 "$e" "$WORK/run/$tag-w3.json" --duration "$DURATION" & pids+=($!) ;;
        mixed)
            read_fs w1 w1 64 "$e" "$WORK/run/$tag-w1.json" & pids+=($!)
            read_fs w2 w2 6 "$e" "$WORK/run/$tag-w2.json" & pids+=($!)
            read_fs w3 w3 16 "$e" "$WORK/run/$tag-w3.json" --duration "$DURATION" & pids+=($!)
            "$BIN/riffle-bench" walk --root "$MNT/w4" --manifest "$WORK/w4.manifest" --stat \
                --json-out "$WORK/run/$tag-w4.json" >/dev/null 2>>"$LOG_DIR/readers.log" & pids+=($!)
            ;;
    esac
    for p in "${pids[@]}"; do
        wait "$p" || { local s=$?; [ "$s" = 1 ] && rc=1; [ "$rc" = 0 ] && rc=$s; }
    done
    return "$rc"
}

mib() { awk -v k="$1" 'BEGIN {printf "%.0f", k / 1024}'; }
budget_mib() { # 64M, 256M, 1G -> MiB
    local v=${1%[MmGg]*} u=${1: -1}
    case $u in G|g) echo $((v * 1024)) ;; M|m) echo "$v" ;; *) echo $(( $1 / 1048576 )) ;; esac
}

TABLE=$WORK/memory.md.new
STATUS=0
{
    echo "| workload | --max-memory | peak RSS | ratio | bound | listed entries | within |"
    echo "|---|---|---|---|---|---|---|"
} > "$TABLE"
for budget in $BUDGETS; do
    for wl in small shards random mixed; do
        tag="$wl-$budget"
        say "$tag: mount, cold and warm epoch"
        mount_riffle "$budget" "$tag"
        wrong=0
        for e in 1 2; do
            drop_caches || true
            epoch "$wl" "$e" "$tag-e$e" || { s=$?; [ "$s" = 1 ] && wrong=1; }
        done
        listed=$("$RIFFLE" stats "$MNT" --json 2>/dev/null \
            | python3 -c 'import json,sys; print(json.load(sys.stdin)["volume"]["listed_entries"])' \
            2>/dev/null || echo 0)
        peak_kb=$(peak_rss_kb "$DAEMON_PID")
        cleanup
        b=$(budget_mib "$budget")
        peak=$(mib "${peak_kb:-0}")
        bound=$(awk -v b="$b" -v o="$OVERHEAD_MIB" -v n="$listed" -v p="$PER_OBJECT" \
            'BEGIN {printf "%.0f", b + o + n * p / 1048576}')
        ratio=$(awk -v r="$peak" -v b="$b" 'BEGIN {printf "%.2f", r / b}')
        within=yes
        [ "$peak" -le "$bound" ] || { within=NO; STATUS=1; }
        [ "$wrong" = 0 ] || { within="$within, WRONG BYTES"; STATUS=1; }
        say "  peak RSS $peak MiB (budget $b MiB, ratio $ratio, bound $bound MiB, $listed listed): $within"
        printf '| %s | %s | %s MiB | %s | %s MiB | %s | %s |\n' \
            "$wl" "$budget" "$peak" "$ratio" "$bound" "$listed" "$within" >> "$TABLE"
    done
done

mode=full; [ "$QUICK" = 1 ] && mode=quick
out=${OUT:-benches/results/memory.md}
{
    echo "## Memory bound"
    echo
    echo "Generated by \`benches/memory.sh\` ($mode, $PROFILE build, $(date -u +%Y-%m-%d),"
    echo "commit \`$(git rev-parse --short HEAD 2>/dev/null || echo '?')\`): one riffle daemon per row,"
    echo "a fresh mount with an empty \`--cache-dir\`, a cold and a warm epoch of the"
    echo "workload; peak RSS is the daemon's \`VmHWM\`. **bound** = \`--max-memory\` +"
    echo "${OVERHEAD_MIB} MiB + ${PER_OBJECT} bytes per listed entry (docs/memory.md, \"The bound\")."
    echo "small: 64 readers of W1 files; shards: 6 W2 shards at once (1 MiB reads);"
    echo "random: 16 threads of random 4 KiB-1 MiB preads of the W3 file for $DURATION;"
    echo "mixed: the three at once and a walk (with stat) of the W4 tree. The same run on"
    echo "the build before the memory bound (issue 39): \`benches/results/memory-before.md\`."
    echo
    cat "$TABLE"
    echo
} > "$out"
[ -n "$OUT" ] || python3 - "$out" benches/README.md <<'PY'
import sys, re
section = open(sys.argv[1]).read()
readme_path = sys.argv[2]
text = open(readme_path).read()
start = text.find("## Memory bound")
if start >= 0:
    end = text.find("\n## ", start + 1)
    text = text[:start] + section.rstrip("\n") + "\n" + (text[end:] if end >= 0 else "")
else:
    tail = text.find("## Not in every run")
    if tail < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        text = text[:tail] + section + "\n" + text[tail:]
open(readme_path, "w").write(text)
PY
say "wrote $out"
cat "$out"
exit "$STATUS"
