#!/usr/bin/env bash
# The image and the node's DaemonSets under a real container runtime (run by tests/run.sh).
#
# 1. Installs podman, runc and mmdebstrap (Debian packages) if missing, and a venv with PyYAML
#    for deploy/podman_args.py if python3 lacks it. podman runs with runc (crun refuses cgroup
#    v1 with a hybrid unified mount) and with nofile/nproc limits within this machine's hard
#    limits: a containers.conf of its own (CONTAINERS_CONF), nothing changed system-wide.
# 2. Builds the image with deploy/kubernetes/image.sh from the debug binaries (stripped of
#    debug information), as an OCI archive too, loads that archive into an empty podman store
#    (what `podman load` on an air-gapped machine does), and builds a second tag with another
#    version label (the mounter rollout's) and a training pod image (the base + python3).
# 3. Runs csi/tests/containers.rs (its tests are #[ignore]d in `cargo test --workspace`), and
#    tests/systemd.rs (the example unit under systemd in a container; its rootfs is cached
#    apart, in /var/cache/riffle-tests).
# The base root filesystem is cached (deploy/kubernetes/image.sh: ~/.cache/riffle-image), so
# only a fresh machine runs mmdebstrap (about a minute). Times each step.
# Usage (as root, with the RGW up): tests/containers.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${CARGO_TARGET_DIR:-$PWD/target}/debug
WORK=$(mktemp -d "${TMPDIR:-/tmp}/riffle-containers-test.XXXXXX")
cleanup() {
    local status=$?
    set +e
    # The test images go (rebuilt every run); the base and the pod image stay as the cache.
    for image in "${RIFFLE_TEST_IMAGE:-}" "${RIFFLE_TEST_IMAGE_NEXT:-}"; do
        [ -n "$image" ] && podman rmi "$image" >/dev/null 2>&1
    done
    rm -rf "$WORK"
    exit "$status"
}
trap cleanup EXIT
t0=$(date +%s)
step() { echo "--- $* ($(($(date +%s) - t0)) s)"; }

need_apt=()
for tool in podman runc mmdebstrap; do
    command -v "$tool" >/dev/null || need_apt+=("$tool")
done
command -v objcopy >/dev/null || need_apt+=(binutils)
command -v mkfs.ext4 >/dev/null || need_apt+=(e2fsprogs)
if [ ${#need_apt[@]} -gt 0 ]; then
    step "installing ${need_apt[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need_apt[@]}"
fi
RIFFLE_TEST_PYTHON=python3
if ! python3 -c 'import yaml' 2>/dev/null; then
    venv=${TMPDIR:-/tmp}/riffle-containers-venv
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check pyyaml
    RIFFLE_TEST_PYTHON=$venv/bin/python
fi
export RIFFLE_TEST_PYTHON

export CONTAINERS_CONF=$WORK/containers.conf
nofile=$(ulimit -Hn)
[ "$nofile" = unlimited ] && nofile=1048576
nproc=$(ulimit -Hu)
[ "$nproc" = unlimited ] || [ "$nproc" -gt 4096 ] && nproc=4096
cat >"$CONTAINERS_CONF" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
EOF

step "binaries (debug)"
. tests/cargo_scope.sh
build_debug_binaries
version=$("$BIN/riffle" --version | awk '{print $2}')
export RIFFLE_TEST_IMAGE=localhost/riffle-csi:ctr-test
export RIFFLE_TEST_IMAGE_NEXT=localhost/riffle-csi:ctr-test-next
step "deploy/kubernetes/image.sh (base cached in ${RIFFLE_IMAGE_CACHE:-~/.cache/riffle-image})"
deploy/kubernetes/image.sh --bin-dir "$BIN" --strip-debug --tag "$RIFFLE_TEST_IMAGE" \
    --output "$WORK/riffle-csi.oci.tar"
step "the OCI archive loads into an empty store"
podman --root "$WORK/store" --runroot "$WORK/run" load -q -i "$WORK/riffle-csi.oci.tar"
podman --root "$WORK/store" --runroot "$WORK/run" run --rm --entrypoint riffle-csi \
    "$(podman --root "$WORK/store" --runroot "$WORK/run" images -q | head -n 1)" --version
step "a second tag for the rollout (version $version-next)"
deploy/kubernetes/image.sh --bin-dir "$BIN" --strip-debug --tag "$RIFFLE_TEST_IMAGE_NEXT" \
    --version "$version-next" --output none
RIFFLE_TEST_BASE_IMAGE=$(deploy/kubernetes/image.sh --base-only)
export RIFFLE_TEST_BASE_IMAGE
export RIFFLE_TEST_POD_IMAGE=localhost/riffle-test-pod:${RIFFLE_TEST_BASE_IMAGE##*:}
if ! podman image exists "$RIFFLE_TEST_POD_IMAGE"; then
    step "training pod image $RIFFLE_TEST_POD_IMAGE (the base + python3)"
    printf 'FROM %s\nRUN apt-get update && apt-get install -y --no-install-recommends python3 && rm -rf /var/lib/apt/lists/*\n' \
        "$RIFFLE_TEST_BASE_IMAGE" >"$WORK/Podfile"
    podman build -q --pull=never --network=host -f "$WORK/Podfile" -t "$RIFFLE_TEST_POD_IMAGE" "$WORK" >/dev/null
fi

step "csi/tests/containers.rs"
# Where the test runs podman (conmon leaves an `oom` marker in its working directory).
export RIFFLE_TEST_PODMAN_DIR=$WORK
[ -n "${RIFFLE_TEST_ENDPOINT:-}" ] || eval "$(bash deploy/local/rgw.sh env)"
cargo test "${RIFFLE_CARGO_SCOPE[@]}" --test containers "$@" -- --ignored --test-threads=1 --nocapture
step "tests/systemd.rs (the workstation unit under a real systemd)"
RIFFLE_CONTAINER_TESTS=1 cargo test "${RIFFLE_CARGO_SCOPE[@]}" --test systemd "$@" -- --nocapture
step "done"
