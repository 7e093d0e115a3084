#!/usr/bin/env bash
# Quickstart: install what is needed, build riffle, start a local Ceph RGW, upload a small
# sample dataset, mount it, read it back (verifying every byte) and say what happened.
# Run as root from anywhere: deploy/local/quickstart.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
WORK=${RIFFLE_QUICKSTART_DIR:-/tmp/riffle-quickstart}
BUCKET=riffle-quickstart
MNT=$WORK/mnt

say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

[ "$(id -u)" = 0 ] || { echo "quickstart: run as root (FUSE mounts and the local Ceph need it)" >&2; exit 1; }
if ! command -v fusermount3 >/dev/null || ! command -v pkg-config >/dev/null; then
    say "installing fuse3"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends fuse3 pkg-config
fi
command -v cargo >/dev/null || { echo "quickstart: cargo not found; install Rust (https://rustup.rs)" >&2; exit 1; }

say "building riffle (release)"
cargo build --release -q -p rifflefs -p riffle-bench
RIFFLE=$ROOT/target/release/riffle
BENCH=$ROOT/target/release/riffle-bench

say "starting the local Ceph RGW (deploy/local/rgw.sh up)"
bash deploy/local/rgw.sh up
eval "$(bash deploy/local/rgw.sh env)"

say "uploading a sample dataset to s3://$BUCKET"
mkdir -p "$WORK"
"$BENCH" gen --workload sample --bucket "$BUCKET" --endpoint "$AWS_ENDPOINT_URL" --manifest "$WORK/manifest.tsv"

say "mounting s3://$BUCKET at $MNT"
if grep -q " $MNT fuse" /proc/self/mountinfo; then "$RIFFLE" unmount "$MNT" --lazy || true; fi
mkdir -p "$MNT"
"$RIFFLE" mount "s3://$BUCKET" "$MNT" --endpoint-url "$AWS_ENDPOINT_URL" --force-path-style \
    --metadata-ttl indefinite --log-file "$WORK/riffle.log" --pid-file "$WORK/riffle.pid"
echo "mounted; daemon pid $(cat "$WORK/riffle.pid"), log $WORK/riffle.log"

say "what the training job sees"
find "$MNT" -maxdepth 2 | head -n 12
echo "... $(find "$MNT" -type f | wc -l) files, $(du -sh --apparent-size "$MNT" | cut -f1) in all"

say "reading every file through the mount with 8 threads, checking every byte"
"$BENCH" read-fs --root "$MNT" --manifest "$WORK/manifest.tsv" --pattern w1 --threads 8

cat <<EOT

Done. The sample dataset is mounted read-only at $MNT. Try:
  ls $MNT; python3 -c "import os; print(len(os.listdir('$MNT')))"
When finished:
  $RIFFLE unmount $MNT        # unmount (the daemon exits)
  deploy/local/rgw.sh down     # stop the local Ceph RGW and delete its data
EOT
