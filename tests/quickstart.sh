#!/usr/bin/env bash
# CI test of the quickstart and of the README's PyTorch example (run by tests/run.sh).
# Runs deploy/local/quickstart.sh end to end with a small sample and the debug binaries in a
# temporary work directory, checks its report (every byte verified, 0 GETs in the warm epoch,
# the report's lines present, nothing but the dataset in the mount), runs
# deploy/local/pytorch_example.py against the mount (with and without a plan; without torch it
# does the same walk and reads), then unmounts and stops the proxy it started. The RGW is left
# as it was (tests/run.sh starts and stops it). Nothing here depends on timing.
# Usage (as root, with an RGW up or startable): tests/quickstart.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${CARGO_TARGET_DIR:-$PWD/target}/debug
WORK=$(mktemp -d "${TMPDIR:-/tmp}/riffle-quickstart-test.XXXXXX")
MNT=$WORK/mnt
RES=$WORK/results
OUT=$WORK/quickstart.out

fail() { echo "tests/quickstart.sh: FAIL: $*" >&2; exit 1; }
cleanup() {
    local status=$?
    set +e
    if awk -v m="$MNT" '$2 == m {f = 1} END {exit !f}' /proc/mounts; then
        "$BIN/riffle" unmount "$MNT" >/dev/null 2>&1 || umount -l "$MNT"
    fi
    if [ -s "$WORK/proxy.pid" ]; then
        local pid
        pid=$(cat "$WORK/proxy.pid")
        [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = riffle-proxy ] && kill "$pid"
    fi
    if [ "$status" = 0 ]; then
        rm -rf "$WORK"
    else
        echo "tests/quickstart.sh: output and logs kept in $WORK" >&2
    fi
    exit "$status"
}
trap cleanup EXIT

echo "--- README's PyTorch example is deploy/local/pytorch_example.py verbatim"
python3 - <<'EOF' || fail "README.md's 'Using it from PyTorch' block differs from deploy/local/pytorch_example.py"
import sys
readme = open("README.md").read()
section = readme.split("## Using it from PyTorch", 1)[1]
block = section.split("```python\n", 1)[1].split("```\n", 1)[0]
sys.exit(0 if block == open("deploy/local/pytorch_example.py").read() else 1)
EOF

BUCKET=riffle-quickstart-test
echo "--- s3://$BUCKET as an earlier run may leave it: other bytes under the sample's keys, a marker, a stray object"
. tests/cargo_scope.sh
build_debug_binaries
eval "$(bash deploy/local/rgw.sh env)"
for wl in "sample --scale 0.001 --seed 1" "w3 --scale 0.0002"; do
    # shellcheck disable=SC2086
    "$BIN/riffle-bench" gen --workload $wl --bucket "$BUCKET" --manifest "$WORK/old.manifest" \
        >/dev/null 2>"$WORK/old-gen.log" || { cat "$WORK/old-gen.log" >&2; fail "seeding the bucket failed"; }
done

echo "--- deploy/local/quickstart.sh (RIFFLE_QUICKSTART_SCALE=0.1, debug binaries)"
RIFFLE_QUICKSTART_DIR=$WORK RIFFLE_QUICKSTART_SCALE=0.1 RIFFLE_BIN_DIR=$BIN \
    RIFFLE_QUICKSTART_BUCKET=$BUCKET deploy/local/quickstart.sh >"$OUT" 2>&1 \
    || { tail -n 40 "$OUT" >&2; fail "the quickstart exited non-zero"; }
# The marker and tokens.bin were deleted, the 14 stale sample objects overwritten.
grep -q "s3://$BUCKET/: 104 objects .* uploaded 104 .* deleted 2 others" "$OUT" \
    || fail "gen --exact did not upload all and delete the marker and the stray object: $(grep '^gen ' "$OUT")"
sed -n '/rifflefs quickstart report/,$p' "$OUT"

# The figures behind the report.
python3 - "$RES/report.json" <<'EOF' || fail "the report's figures are wrong (above)"
import json, sys
r = json.load(open(sys.argv[1]))
checks = {
    "every byte verified": r["verified"] and r["mismatches"] == 0 and r["errors"] == 0,
    "three full epochs read": r["files_read"] == 3 * r["files"] and r["bytes_read"] == 3 * r["bytes"],
    "the sample's layout (10 classes x 10 images, 4 shards)":
        (r["images"], r["classes"], r["shards"], r["files"]) == (100, 10, 4, 104),
    "the cold epoch fetched from the store": r["cold_gets_proxy"] > 0,
    "0 GETs at the store in the warm epoch (proxy)": r["warm_gets_proxy"] == 0,
    "0 GETs sent by riffle in the warm epoch": r["warm_gets_riffle"] == 0,
    "every warm open counted": r["warm_opens"] == r["files"],
}
bad = [k for k, ok in checks.items() if not ok]
print("report.json:", "ok" if not bad else "FAILED: " + "; ".join(bad))
sys.exit(1 if bad else 0)
EOF

# The report's lines.
for line in 'rifflefs quickstart report' \
    '30 ms to the first byte' 'RIFFLE_QUICKSTART_LATENCY_MS' \
    'cold epoch  (riffle, empty cache)' 'warm epoch  (riffle, NVMe cache)' 'local disk  (ext4 copy)' \
    'warm / cold:' 'warm / local disk:' 'opens found their file already fetched' 'every byte checked against the manifest: 0 wrong, 0 errors' \
    'Warm epoch at the store: 0 GETs counted by the proxy, 0 sent by riffle' \
    'Passthrough  ' 'store.get_requests' 'store.get_bytes' 'cache.hits' 'fuse.passthrough_opens' \
    'cache.complete_objects 104 of 104 files' 'Try next:' 'try-plan.sh' '(riffle plan)' \
    'riffle warm ' 'pytorch_example.py' 'riffle mount s3://' 'kubectl apply -k deploy/kubernetes' \
    'This run took' 'Stop them:' 'riffle unmount '; do
    grep -qF -- "$line" "$OUT" || fail "the quickstart's output has no line with '$line'"
done
# The warm row says 0 GETs at the store.
grep -E '^  warm epoch  \(riffle, NVMe cache\) .* 0$' "$OUT" >/dev/null || fail "the warm epoch's row does not end in 0 GETs"
# The mount holds the dataset and nothing else (no harness marker).
[ "$(ls -A "$MNT" | paste -sd' ')" = "images shards" ] || fail "the mount's root holds $(ls -A "$MNT" | paste -sd' ')"
echo "report lines: ok; mount root: images shards"

echo "--- the report's 'a plan' line: $WORK/try-plan.sh (remounts with an empty cache, sets a plan, reads)"
bash "$WORK/try-plan.sh" >"$WORK/try-plan.out" 2>&1 || { cat "$WORK/try-plan.out" >&2; fail "try-plan.sh failed"; }
cat "$WORK/try-plan.out"
grep -q '^cold epoch with a plan: ' "$WORK/try-plan.out" || fail "try-plan.sh printed no result"
python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); sys.exit(not (r["mismatches"] == r["errors"] == 0 and r["files"] == 104))' \
    "$RES/cold-plan.json" || fail "the planned epoch did not read all 104 files right"

echo "--- deploy/local/pytorch_example.py against the mount"
images_bytes=$(awk -F'\t' '$1 ~ /^images\// {s += $2} END {print s}' "$WORK/sample.manifest")
for args in "$MNT/images/train" "$MNT/images/train $MNT"; do
    # shellcheck disable=SC2086
    RIFFLE=$BIN/riffle python3 deploy/local/pytorch_example.py $args >"$WORK/pytorch.out" 2>&1 \
        || { cat "$WORK/pytorch.out" >&2; fail "pytorch_example.py $args exited non-zero"; }
    cat "$WORK/pytorch.out"
    for e in 0 1; do
        grep -q "^epoch $e: 100 samples, $images_bytes bytes, 10 classes" "$WORK/pytorch.out" \
            || fail "pytorch_example.py $args: epoch $e did not read 100 samples of $images_bytes bytes"
    done
done
echo "quickstart test: ok"
