#!/usr/bin/env bash
# W6: three nodes reading one dataset as a data-parallel job (issue 38).
#
# Three `riffle mount`s of W1's dataset on this machine, each with its own
# cache directory (and, in the peers rows, its own peer port on 127.0.0.1 and
# one shared secret), all behind one riffle-proxy (30 ms to the first byte,
# 100 MB/s per connection) in front of the local Ceph RGW. Each epoch is
# PyTorch DistributedSampler's: one seeded shuffle of the whole dataset
# (`riffle-bench plan --epoch E`), rank r reads lines r, r+3, ... of it
# through node r with benches/python_reader.py (4 worker processes), the three
# ranks at once; the page cache is dropped before every epoch. Rows: no peers
# (today) and peers, with caches that hold the whole dataset and caches of 40%
# of it each (120% together); and peers with the third daemon SIGKILLed before
# epoch 3 (its rank stops; the other two read their shares), at both sizes.
# In epoch 3 of those rows the files read are the two live ranks' shares.
#
# Columns per epoch: GETs at the store ÷ files read (cluster-wide), files/s of
# the slowest rank, bytes the nodes fetched from peers, object bytes the store
# sent, and issue 38's goals under the table. The table goes to
# benches/results/w6-MODE.md, and from there into benches/README.md (as W6
# of the mode, like the other workloads; `riffle-bench report`).
# benches/run.sh runs this script for its W6 (in full runs, and with
# --quick W6).
#
#   benches/w6.sh [--quick|--full] [--release] [--rounds N]
#
# Needs root (FUSE, drop_caches), the local RGW (deploy/local/rgw.sh up) and
# built binaries: target/debug by default (cargo build -p rifflefs -p
# riffle-bench), target/release with --release.
# Environment: RIFFLE_BENCH_W6_SCALE (W1's scale) [quick 0.05, full 0.3],
# RIFFLE_BENCH_SEED [1], RIFFLE_BENCH_W6_ROWS (a subset of: no-peers-whole
# peers-whole no-peers-40 peers-40 peers-whole-kill peers-40-kill) [all].

set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODE=quick PROFILE=debug ROUNDS=1
while [ $# -gt 0 ]; do
    case $1 in
        --quick) MODE=quick ;;
        --full) MODE=full ;;
        --release) PROFILE=release ;;
        --rounds) ROUNDS=$2; shift ;;
        *) echo "usage: benches/w6.sh [--quick|--full] [--release] [--rounds N]" >&2; exit 2 ;;
    esac
    shift
done
case $MODE in
    quick) SCALE=${RIFFLE_BENCH_W6_SCALE:-0.05} ;;
    full) SCALE=${RIFFLE_BENCH_W6_SCALE:-0.3} ;;
esac
SEED=${RIFFLE_BENCH_SEED:-1}
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/$PROFILE
WORK=${RIFFLE_BENCH_WORK:-$ROOT/benches/.work}/w6
NODES=3
WORKERS=4
# shellcheck source=lib/common.sh
. "$ROOT/benches/lib/common.sh"
say() { echo "[w6 $(date +%H:%M:%S)] $*"; }
die() { echo "benches/w6.sh: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root: FUSE mounts and dropping the page cache need it"
for b in riffle riffle-bench riffle-proxy; do
    [ -x "$BIN/$b" ] || die "no $BIN/$b (cargo build $([ $PROFILE = release ] && echo --release) -p rifflefs -p riffle-bench)"
done
eval "$(bash "$ROOT/deploy/local/rgw.sh" env)"
RGW_URL=$AWS_ENDPOINT_URL
rm -rf "$WORK"
mkdir -p "$WORK"/{logs,res,mnt,cache}

PROXY_PID=
MOUNTED=()
cleanup() {
    local m
    for m in "${MOUNTED[@]}"; do
        "$BIN/riffle" unmount "$m" >/dev/null 2>&1 || umount -l "$m" 2>/dev/null || true
    done
    [ -n "$PROXY_PID" ] && kill "$PROXY_PID" 2>/dev/null || true
}
trap cleanup EXIT

BUCKET=riffle-bench-w6-$MODE
MANIFEST=$WORK/w6.manifest
say "dataset: W1 at scale $SCALE in s3://$BUCKET"
"$BIN/riffle-bench" gen --workload w1 --scale "$SCALE" --seed "$SEED" --bucket "$BUCKET" \
    --endpoint "$RGW_URL" --manifest "$MANIFEST" 2>>"$WORK/logs/gen.log" \
    || die "generating the dataset failed (see $WORK/logs/gen.log)"
SUMMARY=$("$BIN/riffle-bench" plan --manifest "$MANIFEST" --seed "$SEED" --summary)
FILES=$(echo "$SUMMARY" | sed -n 's/.*"files":\([0-9]*\).*/\1/p')
BYTES=$(echo "$SUMMARY" | sed -n 's/.*"bytes":\([0-9]*\).*/\1/p')
say "an epoch reads $FILES files, $BYTES bytes (all of them, split over $NODES ranks)"

start_proxy "$RGW_URL" "$WORK/proxy.out" "$WORK/logs/proxy.log"
say "proxy $PROXY_URL -> $RGW_URL (30 ms first byte, 100 MB/s per connection)"

SECRET=$WORK/peer-secret
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$SECRET"
chmod 600 "$SECRET"

for e in 1 2 3; do
    "$BIN/riffle-bench" plan --manifest "$MANIFEST" --seed "$SEED" --epoch "$e" --crc32 \
        --out "$WORK/plan-e$e.tsv"
    for r in $(seq 0 $((NODES - 1))); do
        awk -v r="$r" -v n="$NODES" '(NR - 1) % n == r' "$WORK/plan-e$e.tsv" > "$WORK/plan-e$e-r$r.tsv"
    done
done

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
json() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {'d': d}))" "$@"; }

# run_row NAME PEERS(0|1) CACHE_BYTES KILL(0|1) ROUND
run_row() {
    local name=$1 peers=$2 cache=$3 kill=$4 round=$5 n e r
    local ports=() list="" mnt logs pids=() alive
    say "row: $name (--cache-size $cache per node), round $round"
    for n in $(seq 0 $((NODES - 1))); do ports+=("$(free_port)"); done
    list=$(printf '127.0.0.1:%s,' "${ports[@]}"); list=${list%,}
    for n in $(seq 0 $((NODES - 1))); do
        mnt=$WORK/mnt/n$n
        rm -rf "$WORK/cache/n$n"; mkdir -p "$mnt" "$WORK/cache/n$n"
        local extra=()
        [ "$peers" = 1 ] && extra=(--peer-listen "127.0.0.1:${ports[$n]}" --peers "$list" --peer-secret-file "$SECRET")
        "$BIN/riffle" mount "s3://$BUCKET" "$mnt" --endpoint-url "$PROXY_URL" --force-path-style \
            --cache-dir "$WORK/cache/n$n" --cache-size "$cache" --cache-min-free 0 \
            --metadata-ttl indefinite --max-memory 32M --log-file "$WORK/logs/$name-r$round-n$n.log" \
            --pid-file "$WORK/cache/n$n.pid" "${extra[@]}" \
            || die "mount of node $n failed (see $WORK/logs/$name-r$round-n$n.log)"
        MOUNTED+=("$mnt")
    done
    alive=$NODES
    for e in 1 2 3; do
        if [ "$kill" = 1 ] && [ "$e" = 3 ]; then
            kill -KILL "$(cat "$WORK/cache/n2.pid")"
            alive=2
            say "  node 2's daemon SIGKILLed before epoch 3"
        fi
        for n in $(seq 0 $((alive - 1))); do
            "$BIN/riffle" stats "$WORK/mnt/n$n" --json > "$WORK/res/$name-r$round-e$e-n$n-before.json"
        done
        sync; echo 3 > /proc/sys/vm/drop_caches
        "$BIN/riffle-bench" proxy-stats --control "$PROXY_CONTROL" --reset >/dev/null
        pids=()
        for r in $(seq 0 $((alive - 1))); do
            python3 "$ROOT/benches/python_reader.py" --root "$WORK/mnt/n$r" \
                --plan "$WORK/plan-e$e-r$r.tsv" --workers "$WORKERS" --seed "$SEED" --epoch "$e" \
                --json-out "$WORK/res/$name-r$round-e$e-rank$r.json" >/dev/null \
                2>>"$WORK/logs/reader.log" &
            pids+=($!)
        done
        local failed=0
        for p in "${pids[@]}"; do wait "$p" || failed=1; done
        # Let each node finish what it fetches ahead (it counts for this epoch).
        for n in $(seq 0 $((alive - 1))); do
            for _ in $(seq 1 600); do
                "$BIN/riffle" stats "$WORK/mnt/n$n" --json > "$WORK/res/tmp.json" 2>/dev/null || break
                [ "$(json "$WORK/res/tmp.json" "d['inflight']['requests'] + (d.get('prefetch') or {}).get('epoch', {}).get('fetching', 0)")" = 0 ] && break
                sleep 0.1
            done
            cp "$WORK/res/tmp.json" "$WORK/res/$name-r$round-e$e-n$n-after.json"
        done
        "$BIN/riffle-bench" proxy-stats --control "$PROXY_CONTROL" --out "$WORK/res/$name-r$round-e$e-proxy.json"
        python3 - "$WORK/res" "$name-r$round-e$e" "$alive" "$failed" "$name" "$e" "$round" >> "$WORK/rows.tsv" <<'EOF'
import json, sys, os
res, tag, alive, failed, name, epoch, rnd = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6], sys.argv[7]
proxy = json.load(open(os.path.join(res, tag + "-proxy.json")))
gets = proxy["requests"]["get_object"] + proxy["requests"]["get_range"]
ranks = [json.load(open(os.path.join(res, f"{tag}-rank{r}.json"))) for r in range(alive)]
files = sum(r["files"] for r in ranks)
errors = sum(r.get("errors", 0) + r.get("mismatches", 0) for r in ranks)
slowest = min(r["files_per_s"] for r in ranks)
peer = 0
for n in range(alive):
    b = json.load(open(os.path.join(res, f"{tag}-n{n}-before.json")))
    a = json.load(open(os.path.join(res, f"{tag}-n{n}-after.json")))
    pb = (b.get("peer") or {}).get("bytes_fetched", 0)
    pa = (a.get("peer") or {}).get("bytes_fetched", 0)
    peer += pa - pb
print("\t".join(str(x) for x in [name, rnd, epoch, files, gets, f"{gets / max(files, 1):.3f}", f"{slowest:.0f}", peer, proxy.get("object_bytes_down", 0), errors + failed]))
EOF
        say "  epoch $e: $(tail -1 "$WORK/rows.tsv" | awk -F'\t' '{printf "%s files, %s GETs (%s per file), slowest rank %s files/s, peer %d MB, store %d MB, %s failed", $4, $5, $6, $7, $8/1e6, $9/1e6, $10}')"
    done
    for n in $(seq 0 $((NODES - 1))); do
        "$BIN/riffle" unmount "$WORK/mnt/n$n" >/dev/null 2>&1 || umount -l "$WORK/mnt/n$n" 2>/dev/null || true
    done
    MOUNTED=()
}

: > "$WORK/rows.tsv"
WHOLE=$((BYTES * 3 / 2 + (64 << 20)))
PART=$((BYTES * 2 / 5))
ROWS=${RIFFLE_BENCH_W6_ROWS:-no-peers-whole peers-whole no-peers-40 peers-40 peers-whole-kill peers-40-kill}
for round in $(seq 1 "$ROUNDS"); do
    for row in $ROWS; do
        case $row in
            no-peers-whole) run_row "$row" 0 "$WHOLE" 0 "$round" ;;
            peers-whole) run_row "$row" 1 "$WHOLE" 0 "$round" ;;
            no-peers-40) run_row "$row" 0 "$PART" 0 "$round" ;;
            peers-40) run_row "$row" 1 "$PART" 0 "$round" ;;
            peers-whole-kill) run_row "$row" 1 "$WHOLE" 1 "$round" ;;
            peers-40-kill) run_row "$row" 1 "$PART" 1 "$round" ;;
            *) die "unknown row $row" ;;
        esac
    done
done

# The table: medians over rounds.
TABLE=$WORK/w6.md
python3 - "$WORK/rows.tsv" "$FILES" "$BYTES" "$SCALE" "$MODE" "$PROFILE" "$ROUNDS" "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)" > "$TABLE" <<'EOF'
import sys, statistics, collections
path, files, nbytes, scale, mode, profile, rounds, commit = sys.argv[1:]
rows = collections.defaultdict(list)
for line in open(path):
    name, rnd, epoch, f, gets, per, fps, peer, store, failed = line.rstrip("\n").split("\t")
    rows[(name, int(epoch))].append((int(f), int(gets), float(per), float(fps), int(peer), int(store), int(failed)))
labels = {
    "no-peers-whole": ("no peers (today)", "whole dataset"),
    "peers-whole": ("peers", "whole dataset"),
    "no-peers-40": ("no peers (today)", "40% each"),
    "peers-40": ("peers", "40% each"),
    "peers-whole-kill": ("peers, node 3 SIGKILLed before epoch 3", "whole dataset"),
    "peers-40-kill": ("peers, node 3 SIGKILLed before epoch 3", "40% each"),
}
med = lambda xs: statistics.median(xs)
print(f"W6 ({mode}, {profile} build, commit {commit}): W1's dataset at scale {scale}, {files} files, "
      f"{int(nbytes) / 1e6:.0f} MB; 3 daemons on this machine, each its own cache directory, all behind one "
      f"proxy (30 ms to the first byte); 3 ranks (DistributedSampler shares of one seeded shuffle per epoch), "
      f"4 Python worker processes each; page cache dropped per epoch; medians of {rounds} round(s).")
print()
print("| system | cache per node | GETs ÷ files read, epochs 1 / 2 / 3 | files/s of the slowest rank, epochs 1 / 2 / 3 | peer MB, epochs 1 / 2 / 3 | store MB, epochs 1 / 2 / 3 | failed reads |")
print("|---|---|---|---|---|---|---|")
for name, (system, cache) in labels.items():
    eps = [rows.get((name, e)) for e in (1, 2, 3)]
    if not all(eps):
        continue
    col = lambda i, fmt: " / ".join(fmt(med([r[i] for r in ep])) for ep in eps)
    failed = sum(r[6] for ep in eps for r in ep)
    print(f"| {system} | {cache} | {col(2, lambda v: f'{v:.2f}')} | {col(3, lambda v: f'{v:.0f}')} | "
          f"{col(4, lambda v: f'{v / 1e6:.0f}')} | {col(5, lambda v: f'{v / 1e6:.0f}')} | {failed} |")
# Issue 38's goals, on the medians above (each only when its rows ran).
def m(name, epoch, i):
    rs = rows.get((name, epoch))
    return med([r[i] for r in rs]) if rs else None
goals = []
def goal(ok, text):
    goals.append(f"- {'met' if ok else 'NOT met'}: {text}")
for size, suffix in (("whole dataset", "whole"), ("40% each", "40")):
    p, n, k = f"peers-{suffix}", f"no-peers-{suffix}", f"peers-{suffix}-kill"
    e1 = m(p, 1, 2)
    if e1 is not None:
        goal(e1 <= 1.02, f"{size}: with peers, epoch 1 store GETs ≤ 1.02 × files read: {e1:.2f}")
        late = max(m(p, 2, 2), m(p, 3, 2))
        goal(late <= 0.02, f"{size}: with peers, epochs 2–3 store GETs ≤ 0.02 × files read: {late:.2f}")
    if e1 is not None and m(n, 2, 3) is not None:
        ratios = [m(p, e, 3) / max(m(n, e, 3), 1e-9) for e in (2, 3)]
        goal(min(ratios) >= 2, f"{size}: epochs 2–3 files/s ≥ 2 × no peers (slowest ranks): "
             + " / ".join(f"{r:.1f}×" for r in ratios))
    if m(k, 3, 2) is not None:
        failed = sum(r[6] for e in (1, 2, 3) for r in rows[(k, e)])
        goal(failed == 0, f"{size}: a daemon SIGKILLed before epoch 3 costs the other two no failed read: {failed}")
        goal(m(k, 3, 2) <= 0.45, f"{size}: then epoch 3 store GETs ≤ 0.45 × files read: {m(k, 3, 2):.2f}")
if goals:
    print()
    print("Goals (issue 38), this run:")
    print()
    print("\n".join(goals))
EOF
cat "$TABLE"
mkdir -p "$ROOT/benches/results"
cp "$TABLE" "$ROOT/benches/results/w6-$MODE.md"
say "the table is in benches/results/w6-$MODE.md"
# benches/README.md shows it as W6 of its mode (benches/run.sh reports again after).
"$BIN/riffle-bench" report --results-dir "$ROOT/benches/results" --readme "$ROOT/benches/README.md" \
    --plots-dir "$ROOT/benches/plots" >/dev/null 2>&1 \
    && say "benches/README.md updated" || say "benches/README.md not updated (riffle-bench report failed)"
