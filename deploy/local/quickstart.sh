#!/usr/bin/env bash
# Quickstart: what rifflefs is for, in one command and about a minute after the build.
#
# Installs what is needed, builds riffle, starts a local Ceph RGW behind riffle-proxy (30 ms to
# the first byte, like a real object store), uploads a small training set (class directories of
# images and a few shards, nothing else), mounts it with an NVMe cache, reads it like a data
# loader (a cold epoch, a warm epoch) and reads the same files from local disk, checking every
# byte, then prints a report: files/s and MB/s side by side, GETs at the store per epoch,
# whether FUSE passthrough was in force, and the `riffle stats` counters that explain it.
# Leaves the mount, the proxy and the RGW running and prints how to stop them.
# Run as root from anywhere: deploy/local/quickstart.sh
#
# Settings (environment):
#   RIFFLE_QUICKSTART_LATENCY_MS     first-byte latency the proxy adds to every response [30]
#   RIFFLE_QUICKSTART_BANDWIDTH_MBPS per-connection bandwidth cap, MB/s, 0 = none [100]
#   RIFFLE_QUICKSTART_SCALE          sample size in (0, 1]: 1 = 1,000 images + 4 x 16 MiB shards [1]
#   RIFFLE_QUICKSTART_THREADS        reader threads of each epoch [8]
#   RIFFLE_QUICKSTART_DIR            work directory: mount, cache, local copy, results [/tmp/riffle-quickstart]
#   RIFFLE_QUICKSTART_BUCKET         bucket of the sample [riffle-quickstart]
#   RIFFLE_QUICKSTART_DROP_CACHES    1: drop the page cache before each epoch, as benches/ do [1]
#   RIFFLE_QUICKSTART_PROFILE        cargo profile to build and use: release or debug [release]
#   RIFFLE_QUICKSTART_CACHE_MIN_FREE free space the cache leaves on its disk (--cache-min-free) [256M]:
#                                    the sample is small, so the 5% a real mount keeps by default
#                                    would stop a nearly full disk from caching it
#   RIFFLE_BIN_DIR                   use riffle, riffle-bench, riffle-proxy from here; build nothing
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
WORK=${RIFFLE_QUICKSTART_DIR:-/tmp/riffle-quickstart}
BUCKET=${RIFFLE_QUICKSTART_BUCKET:-riffle-quickstart}
SCALE=${RIFFLE_QUICKSTART_SCALE:-1}
LATENCY_MS=${RIFFLE_QUICKSTART_LATENCY_MS:-30}
BANDWIDTH=${RIFFLE_QUICKSTART_BANDWIDTH_MBPS:-100}
THREADS=${RIFFLE_QUICKSTART_THREADS:-8}
DROP_CACHES=${RIFFLE_QUICKSTART_DROP_CACHES:-1}
PROFILE=${RIFFLE_QUICKSTART_PROFILE:-release}
CACHE_MIN_FREE=${RIFFLE_QUICKSTART_CACHE_MIN_FREE:-256M}
MNT=$WORK/mnt
CACHE=$WORK/cache
LOCAL=$WORK/local
RES=$WORK/results
MANIFEST=$WORK/sample.manifest
SEED=7

say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
die() { echo "quickstart: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (FUSE mounts, the page-cache drop and the local Ceph need it)"
case $PROFILE in release | debug) ;; *) die "RIFFLE_QUICKSTART_PROFILE must be release or debug" ;; esac
need_apt=()
command -v fusermount3 >/dev/null || need_apt+=(fuse3)
command -v python3 >/dev/null || need_apt+=(python3)
if [ -z "${RIFFLE_BIN_DIR:-}" ]; then
    command -v pkg-config >/dev/null || need_apt+=(pkg-config)
    command -v cc >/dev/null || need_apt+=(build-essential)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
    say "installing ${need_apt[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need_apt[@]}"
fi

if [ -n "${RIFFLE_BIN_DIR:-}" ]; then
    BIN=$(cd "$RIFFLE_BIN_DIR" && pwd)
else
    command -v cargo >/dev/null || die "cargo not found; install Rust (https://rustup.rs)"
    say "building riffle, riffle-bench and riffle-proxy ($PROFILE)"
    flags=()
    [ "$PROFILE" = release ] && flags+=(--release)
    cargo build "${flags[@]}" -q -p rifflefs -p riffle-bench
    BIN=${CARGO_TARGET_DIR:-$ROOT/target}/$PROFILE
fi
for b in riffle riffle-bench riffle-proxy; do
    [ -x "$BIN/$b" ] || die "$BIN/$b is missing (build it, or set RIFFLE_BIN_DIR)"
done
RIFFLE=$BIN/riffle
BENCH=$BIN/riffle-bench
STARTED=$(date +%s.%N)

# Start from a clean slate: an earlier run's mount, proxy, cache and results.
if awk -v m="$MNT" '$2 == m {f = 1} END {exit !f}' /proc/mounts; then
    say "unmounting the earlier quickstart mount at $MNT"
    "$RIFFLE" unmount "$MNT" || "$RIFFLE" unmount "$MNT" --lazy || true
fi
if [ -s "$WORK/proxy.pid" ]; then
    old=$(cat "$WORK/proxy.pid")
    if [ "$(cat "/proc/$old/comm" 2>/dev/null)" = riffle-proxy ]; then kill "$old" 2>/dev/null || true; fi
    rm -f "$WORK/proxy.pid"
fi
rm -rf "$CACHE" "$LOCAL" "$RES"
mkdir -p "$MNT" "$CACHE" "$LOCAL" "$RES"

say "starting the local Ceph RGW (deploy/local/rgw.sh up)"
bash deploy/local/rgw.sh up
eval "$(bash deploy/local/rgw.sh env)"
RGW_URL=$AWS_ENDPOINT_URL

say "uploading a sample training set to s3://$BUCKET"
# --exact: the bucket holds the dataset and nothing else (no harness marker); the manifest that
# the reader checks every byte against is a local file.
"$BENCH" gen --workload sample --scale "$SCALE" --seed "$SEED" --exact --bucket "$BUCKET" \
    --endpoint "$RGW_URL" --manifest "$MANIFEST" 2>"$WORK/gen.log" | sed 's/; manifest .*//' \
    || { tail -n 5 "$WORK/gen.log" >&2; die "uploading the sample failed (see $WORK/gen.log)"; }

say "starting riffle-proxy in front of RGW: ${LATENCY_MS} ms to the first byte, ${BANDWIDTH} MB/s per connection"
# setsid + every descriptor redirected: it outlives this script and holds no pipe of its caller.
setsid "$BIN/riffle-proxy" --listen 127.0.0.1:0 --upstream "$RGW_URL" --control 127.0.0.1:0 \
    --first-byte-delay-ms "$LATENCY_MS" --bandwidth-mbps "$BANDWIDTH" \
    </dev/null >"$WORK/proxy.out" 2>"$WORK/proxy.log" &
echo $! >"$WORK/proxy.pid"
for _ in $(seq 1 100); do
    [ "$(wc -l <"$WORK/proxy.out")" -ge 2 ] && break
    sleep 0.1
done
PROXY_URL="http://$(sed -n 's/^listening on //p' "$WORK/proxy.out")"
PROXY_CONTROL=$(sed -n 's/^control on //p' "$WORK/proxy.out")
[ "$PROXY_URL" != "http://" ] && [ -n "$PROXY_CONTROL" ] || die "riffle-proxy did not start (see $WORK/proxy.log)"
echo "S3 endpoint $PROXY_URL -> $RGW_URL (counters at http://$PROXY_CONTROL/stats)"

say "mounting s3://$BUCKET at $MNT with an NVMe cache in $CACHE"
"$RIFFLE" mount "s3://$BUCKET" "$MNT" --endpoint-url "$PROXY_URL" --force-path-style \
    --metadata-ttl indefinite --cache-dir "$CACHE" --cache-min-free "$CACHE_MIN_FREE" \
    --log-file "$WORK/riffle.log" --pid-file "$WORK/riffle.pid"
echo "mounted; daemon pid $(cat "$WORK/riffle.pid"), log $WORK/riffle.log"

say "what the training job sees"
echo "$ ls -A $MNT"
ls -AC "$MNT"
echo "$ ls $MNT/images/train"
ls -C "$MNT/images/train"
echo "$ ls $MNT/images/train/cat | head -n 3"
ls "$MNT/images/train/cat" | head -n 3
echo "$ ls -l $MNT/shards"
ls -l "$MNT/shards"
echo "... $(find "$MNT" -type f -printf '%s\n' | awk '{n++; s += $1} END {printf "%d files, %.1f MB", n, s / 1e6}') in all"

drop_caches() {
    [ "$DROP_CACHES" = 1 ] || return 0
    sync
    echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || DROP_CACHES=failed
}

# epoch NAME ROOT EPOCH: one shuffled pass over every file of the manifest with $THREADS
# threads, every byte checked; the proxy's counters are zeroed before it and saved after it,
# and riffle's counters saved after it.
epoch() {
    local name=$1 root=$2 n=$3
    drop_caches
    "$BENCH" proxy-stats --control "$PROXY_CONTROL" --reset >/dev/null
    if ! "$BENCH" read-fs --root "$root" --manifest "$MANIFEST" --pattern w1 --threads "$THREADS" \
        --seed "$SEED" --epoch "$n" --json-out "$RES/$name.json" >/dev/null 2>"$RES/$name.err"; then
        cat "$RES/$name.err" >&2
        die "the $name epoch read wrong bytes or failed (see $RES/$name.json)"
    fi
    "$BENCH" proxy-stats --control "$PROXY_CONTROL" --out "$RES/$name-proxy.json"
    "$RIFFLE" stats --json "$MNT" >"$RES/$name-riffle.json"
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("%d files, %.1f MB in %.2f s" % (r["files"], r["bytes"]/1e6, r["elapsed_s"]))' "$RES/$name.json"
}

"$RIFFLE" stats --json "$MNT" >"$RES/before-riffle.json"
say "cold epoch: every file through the mount, shuffled, $THREADS reader threads (like a DataLoader)"
epoch cold "$MNT" 1
say "warm epoch: a new shuffle, now from the NVMe cache"
epoch warm "$MNT" 2
say "local disk: the same files copied to $LOCAL, read in the warm epoch's order"
"$BENCH" copy --manifest "$MANIFEST" --endpoint "$RGW_URL" --dest "$LOCAL" >/dev/null 2>"$RES/copy.err" \
    || { cat "$RES/copy.err" >&2; die "copying the sample to $LOCAL failed"; }
epoch local "$LOCAL" 2

# Try next: the cold epoch again on an empty cache, with its order given to riffle first.
cat >"$WORK/try-plan.sh" <<EOT
#!/usr/bin/env bash
# Written by deploy/local/quickstart.sh: the quickstart's cold epoch again, on an empty cache,
# with the epoch's order given to riffle first (riffle plan), so it fetches ahead of the readers.
set -euo pipefail
eval "\$(bash $ROOT/deploy/local/rgw.sh env)"
$RIFFLE unmount $MNT
$RIFFLE cache clear --cache-dir $CACHE
$RIFFLE mount s3://$BUCKET $MNT --endpoint-url $PROXY_URL --force-path-style \\
    --metadata-ttl indefinite --cache-dir $CACHE --cache-min-free $CACHE_MIN_FREE --log-file $WORK/riffle.log --pid-file $WORK/riffle.pid
$BENCH plan --manifest $MANIFEST --seed $SEED --epoch 1 --out $WORK/epoch1.plan
$RIFFLE plan $MNT $WORK/epoch1.plan
$BENCH read-fs --root $MNT --manifest $MANIFEST --pattern w1 --threads $THREADS --seed $SEED --epoch 1 \\
    --json-out $RES/cold-plan.json >/dev/null
python3 -c 'import json; p, c = (json.load(open("$RES/" + n + ".json"))["files_per_s"] for n in ("cold-plan", "cold")); print("cold epoch with a plan: %.0f files/s; without (the quickstart): %.0f files/s; %.1fx" % (p, c, p / c))'
EOT
chmod +x "$WORK/try-plan.sh"

python3 deploy/local/quickstart_report.py --results "$RES" --manifest "$MANIFEST" --mount "$MNT" \
    --bucket "$BUCKET" --cache-dir "$CACHE" --local "$LOCAL" --latency-ms "$LATENCY_MS" \
    --bandwidth-mbps "$BANDWIDTH" --threads "$THREADS" --drop-caches "$DROP_CACHES" \
    --riffle "$RIFFLE" --bench "$BENCH" --proxy-url "$PROXY_URL" --seed "$SEED" --try-plan "$WORK/try-plan.sh" \
    --elapsed "$(awk -v a="$STARTED" -v b="$(date +%s.%N)" 'BEGIN {printf "%.0f", b - a}')"

cat <<EOT

Left running: the mount at $MNT (daemon pid $(cat "$WORK/riffle.pid")), riffle-proxy at $PROXY_URL (pid $(cat "$WORK/proxy.pid")) and the RGW at $RGW_URL.
Stop them:
  $RIFFLE unmount $MNT     # unmount (the daemon exits)
  kill $(cat "$WORK/proxy.pid")                 # stop riffle-proxy
  deploy/local/rgw.sh down    # stop the local Ceph RGW and delete its data
EOT
