# The Mountpoint for Amazon S3 peer: building the bench-only binary
# (benches/mountpoint, over the mountpoint-s3-fs library) and mounting and
# unmounting with it. Sourced by benches/run.sh after common.sh; expects
# ROOT, WORK and LOG_DIR to be set (like systems.sh).
#
# build_mountpoint prints the binary's path (building it the first time, ~10 min
# because of the AWS CRT), or prints why not to stderr and returns 1.
# mount_mountpoint BUCKET MNT ENDPOINT [TAG] sets DAEMON_PID and returns 0 once
# the mount is live, or sets NOT_RUN (a reason) and returns 1.
# unmount_mountpoint MNT unmounts and waits for the daemon to exit.
#
# Settings as Mountpoint users set them for training: --metadata-ttl indefinite,
# --max-threads (MOUNTPOINT_MAX_THREADS, default 16, Mountpoint's default) and,
# with MOUNTPOINT_CACHE=1, its local disk cache (--cache, MOUNTPOINT_CACHE_MIB
# caps it, default: Mountpoint's 5%-of-disk-free rule). MOUNTPOINT_MEMORY_MIB
# sets its memory target (default: Mountpoint's, 95% of RAM).
# shellcheck disable=SC2034  # DAEMON_PID and NOT_RUN are read by run.sh

MOUNTPOINT_DIR=${MOUNTPOINT_DIR:-$ROOT/benches/mountpoint}
MOUNTPOINT_BIN=$MOUNTPOINT_DIR/target/release/riffle-bench-mountpoint

# Sets missing to the Debian packages (or cargo) the build needs and lacks.
mountpoint_build_deps_missing() {
    missing=()
    command -v cargo >/dev/null || missing+=(cargo)
    command -v cmake >/dev/null || missing+=(cmake)
    command -v cc >/dev/null || missing+=(gcc)
    command -v pkg-config >/dev/null || missing+=(pkg-config)
    pkg-config --exists fuse3 2>/dev/null || pkg-config --exists fuse 2>/dev/null || missing+=("libfuse3-dev")
    ls /usr/lib/llvm-*/lib/libclang.so* /usr/lib/*/libclang*.so* >/dev/null 2>&1 \
        || [ -n "${LIBCLANG_PATH:-}" ] || missing+=("libclang-dev")
}

build_mountpoint() {
    local log="${LOG_DIR:-/tmp}/build-mountpoint.log" missing=()
    # Rebuild only when the binary is missing or older than its sources.
    if [ -x "$MOUNTPOINT_BIN" ] && [ -z "$(find "$MOUNTPOINT_DIR/src" "$MOUNTPOINT_DIR/Cargo.toml" \
            "$MOUNTPOINT_DIR/Cargo.lock" -newer "$MOUNTPOINT_BIN" 2>/dev/null)" ]; then
        echo "$MOUNTPOINT_BIN"
        return 0
    fi
    mountpoint_build_deps_missing
    if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null \
            && ! [[ " ${missing[*]} " == *" cargo "* ]]; then
        # The C and bindgen toolchain of the AWS CRT and fuser, as the peers are installed.
        echo "build_mountpoint: installing ${missing[*]} with apt" >&2
        apt_install "$log" "${missing[@]}" || true
        mountpoint_build_deps_missing
    fi
    if [ ${#missing[@]} -gt 0 ]; then
        echo "build_mountpoint: cannot build riffle-bench-mountpoint: missing ${missing[*]}" \
            "(apt-get install cmake gcc pkg-config libfuse3-dev libclang-dev)" >&2
        return 1
    fi
    echo "build_mountpoint: building riffle-bench-mountpoint (first time ~10 min; log $log)" >&2
    if ! (cd "$MOUNTPOINT_DIR" && CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1} \
            cargo build --release --locked --target-dir "$MOUNTPOINT_DIR/target") >"$log" 2>&1; then
        echo "build_mountpoint: cannot build riffle-bench-mountpoint (cargo failed: $(grep -m1 '^error' "$log"); see $log)" >&2
        return 1
    fi
    [ -x "$MOUNTPOINT_BIN" ] || { echo "build_mountpoint: cargo succeeded but $MOUNTPOINT_BIN is missing" >&2; return 1; }
    echo "$MOUNTPOINT_BIN"
}

mount_mountpoint() {
    local bucket=$1 mnt=$2 endpoint=$3 tag=${4:-mnt}
    local pidf="$WORK/run/mountpoint-$tag.pid" log="$LOG_DIR/mountpoint-$tag.log"
    local out="$LOG_DIR/mountpoint-$tag.out" args=()
    [ -x "$MOUNTPOINT_BIN" ] || { NOT_RUN="not run: riffle-bench-mountpoint is not built (build_mountpoint)"; return 1; }
    mkdir -p "$WORK/run" "$LOG_DIR"
    rm -f "$pidf"
    if [ "${MOUNTPOINT_CACHE:-0}" = 1 ]; then
        local cache="$WORK/cache/mountpoint-$tag"
        rm -rf "$cache"; mkdir -p "$cache"
        args+=(--cache "$cache")
        [ -n "${MOUNTPOINT_CACHE_MIB:-}" ] && args+=(--max-cache-size "$MOUNTPOINT_CACHE_MIB")
    fi
    [ -n "${MOUNTPOINT_MEMORY_MIB:-}" ] && args+=(--memory-target "$MOUNTPOINT_MEMORY_MIB")
    if ! "$MOUNTPOINT_BIN" "$bucket" "$mnt" --endpoint-url "$endpoint" --force-path-style \
        --region us-east-1 --metadata-ttl indefinite --max-threads "${MOUNTPOINT_MAX_THREADS:-16}" \
        "${args[@]}" --daemon --log-file "$log" --pid-file "$pidf" >>"$out" 2>&1; then
        NOT_RUN="failed: Mountpoint did not mount ($(tail -n1 "$out" 2>/dev/null))"
        return 1
    fi
    DAEMON_PID=$(cat "$pidf" 2>/dev/null || true)
    mountpoint -q "$mnt" || { NOT_RUN="failed: Mountpoint returned but $mnt is not mounted"; return 1; }
}

unmount_mountpoint() {
    local mnt=$1 pid=${DAEMON_PID:-} _
    if in_mount_table "$mnt"; then
        fusermount3 -u "$mnt" 2>/dev/null || fusermount -u "$mnt" 2>/dev/null \
            || umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
    fi
    if [ -n "$pid" ]; then
        for _ in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill "$pid" 2>/dev/null || true
    fi
    DAEMON_PID=
}
