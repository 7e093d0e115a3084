#!/usr/bin/env bash
# The test command (README.md, "Run the tests"; CI calls exactly this).
# Installs what the tests need, starts the local Ceph RGW unless one is already up, runs the
# format and lint checks and every test of the workspace against it, then stops the RGW it
# started. Usage: tests/run.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v fusermount3 >/dev/null || need_apt+=(fuse3)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
command -v cc >/dev/null || need_apt+=(build-essential)
command -v curl >/dev/null || need_apt+=(curl)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "==> installing ${need_apt[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need_apt[@]}"
fi
[ -e /dev/fuse ] || { echo "tests/run.sh: /dev/fuse is missing; FUSE tests cannot run" >&2; exit 1; }

# FUSE over io_uring (Linux 6.14+) is built into the kernel but off until root turns it on;
# tests/transport.rs mounts with --fuse-transport io-uring and needs it on.
ring_switch=/sys/module/fuse/parameters/enable_uring
if [ -w "$ring_switch" ]; then echo Y > "$ring_switch"; fi

started_rgw=0
if ! bash deploy/local/rgw.sh status >/dev/null 2>&1; then
    bash deploy/local/rgw.sh up
    started_rgw=1
fi
cleanup() {
    # Keep the tests' exit status; nothing in here may change it.
    local status=$?
    set +e
    # Leave no mounts of ours behind (the tests mount under temporary directories; other
    # riffle mounts on this machine are not ours to touch), then stop the RGW if we started it.
    local tmp=${TMPDIR:-/tmp}
    grep -E ' fuse\.riffle ' /proc/self/mountinfo | awk '{print $5}' | while read -r m; do
        case "$m" in "${tmp%/}"/.tmp*) umount -l "$m" 2>/dev/null ;; esac
    done
    if [ "$started_rgw" = 1 ]; then bash deploy/local/rgw.sh down; fi
    exit "$status"
}
trap cleanup EXIT
eval "$(bash deploy/local/rgw.sh env)"
# The caches of the benchmark smoke test and the quickstart keep no free-space floor: a CI
# machine's disk may have less free than the default floor (5%, or the 1G and 256M those
# scripts keep), and then nothing would be cached and their checks would fail for a reason
# that is not theirs. The floor itself has an integration test of its own.
export RIFFLE_BENCH_CACHE_MIN_FREE=0 RIFFLE_QUICKSTART_CACHE_MIN_FREE=0

# The packages and features of every cargo command below (the tests that need the RGW, which a
# plain `cargo test` leaves out), so that each crate is compiled once.
. tests/cargo_scope.sh
echo "==> cargo fmt --check"
cargo fmt --all --check
echo "==> layer check of src/ and csi/src/ (no module importing a higher one, no two files importing each other)"
python3 tests/layers.py
python3 tests/layers.py csi/src
echo "==> cargo clippy"
cargo clippy "${RIFFLE_CARGO_SCOPE[@]}" --all-targets -- -D warnings
echo "==> cargo test"
cargo test "${RIFFLE_CARGO_SCOPE[@]}" "$@"
echo "==> the vendored fuser's io_uring transport (its own unit tests)"
(cd vendor/fuser && CARGO_TARGET_DIR="$PWD/../../target/fuser-tests" cargo test --lib uring)
echo "==> RGW stopped and restarted under a mount (alone, last)"
cargo test "${RIFFLE_CARGO_SCOPE[@]}" --test rgw_restart -- --ignored
echo "==> benchmark smoke test (quick datasets, every system side by side, every byte verified)"
# Debug binaries (already built for the tests); fails on any wrong byte. Its report goes to
# target/bench-quick (README.md and results/), so the tracked tree stays as it was.
rm -rf target/bench-quick
benches/run.sh --quick --debug --no-build --no-plots --report-dir target/bench-quick
echo "==> quickstart end to end (small sample, debug binaries) and the README's PyTorch example"
# Checks the report (every byte verified, 0 GETs in the warm epoch, its lines present), never
# timings; unmounts and stops the proxy it started, leaves the RGW to this script.
tests/quickstart.sh
if [ -x deploy/validate.sh ]; then
    echo "==> deploy manifests"
    deploy/validate.sh
fi
echo "==> the image built without a registry and the node's DaemonSets under podman (real containers)"
# Installs podman, runc and mmdebstrap; builds the image from the debug binaries with
# deploy/kubernetes/image.sh (the base root filesystem cached in ~/.cache/riffle-image) and
# runs csi/tests/containers.rs: every container killed, restarted, the mounter rolled to a
# second tag and OOM-killed by its cgroup under a reading pod.
tests/containers.sh
echo "==> all tests passed"
