# Preparing a benchmark run: binaries, RGW, peer tools, the plot venv, a
# memory check and the latency proxy. Sourced by benches/run.sh.

# Builds riffle, riffle-bench and riffle-proxy: release, or the debug
# profile with --debug (what CI has already built for the tests).
build_binaries() {
    local flags=()
    [ "$PROFILE" = release ] && flags+=(--release)
    say "building $PROFILE binaries (riffle, riffle-bench, riffle-proxy)"
    CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1} cargo build "${flags[@]}" -q -p riffle-bench -p rifflefs \
        || die "cargo build failed"
}

# Mountpoint (benches/lib/mountpoint.sh): built when asked (full runs; the
# first build takes ~10 min for the AWS CRT), else used only if already
# built. Without the binary its rows say why.
prepare_mountpoint() {
    has "$SYSTEMS" mountpoint || return 0
    if ! declare -F mount_mountpoint >/dev/null; then
        warn "benches/lib/mountpoint.sh is missing: Mountpoint is not run"
        return 0
    fi
    if [ "$BUILD_MOUNTPOINT" = 1 ]; then
        say "building the bench-only Mountpoint binary (benches/mountpoint) if needed"
        build_mountpoint >/dev/null 2>>"$LOG_DIR/mountpoint-build.log" \
            || warn "Mountpoint could not be built: $(tail -n1 "$LOG_DIR/mountpoint-build.log")"
    elif [ ! -x "${MOUNTPOINT_BIN:-}" ]; then
        say "Mountpoint is not built; its rows will say so (benches/run.sh --build-mountpoint builds it, ~10 min)"
    fi
}

ensure_rgw() {
    if ! deploy/local/rgw.sh status >/dev/null 2>&1; then
        say "starting the local Ceph RGW"
        deploy/local/rgw.sh up >>"$LOG_DIR/rgw.log" 2>&1 || die "deploy/local/rgw.sh up failed (see $LOG_DIR/rgw.log)"
    fi
    eval "$(deploy/local/rgw.sh env)"
    RGW_URL=$AWS_ENDPOINT_URL
    printf '%s:%s\n' "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY" > "$WORK/run/s3fs.passwd"
    chmod 600 "$WORK/run/s3fs.passwd"
}

# Installs s3fs and rclone with apt when missing; a peer that cannot be
# installed is reported as "not run" later.
ensure_peer_tools() {
    local missing=()
    command -v s3fs >/dev/null || missing+=(s3fs)
    command -v rclone >/dev/null || missing+=(rclone)
    command -v fusermount3 >/dev/null || missing+=(fuse3)
    [ ${#missing[@]} -eq 0 ] && return 0
    say "installing ${missing[*]} with apt"
    apt_install "$LOG_DIR/apt.log" "${missing[@]}" \
        || warn "apt-get install ${missing[*]} failed (see $LOG_DIR/apt.log)"
}

# A venv with matplotlib for the plots; without it the report has no plots.
ensure_plot_venv() {
    local venv=benches/.venv
    [ "$PLOTS" = 1 ] || return 0
    if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
        return 0
    fi
    say "creating $venv with matplotlib (plots)"
    { python3 -m venv "$venv" && "$venv/bin/pip" install -q matplotlib; } >>"$LOG_DIR/venv.log" 2>&1 \
        || { warn "no plots: could not set up $venv (see $LOG_DIR/venv.log)"; rm -rf "$venv"; }
}

# RGW keeps the datasets in RAM (memstore): warn when they may not fit.
check_memory() {
    local need=0 wl gb scale avail
    for wl in "$@"; do
        scale=$SCALE
        case $wl in
            # The memstore OSD holds ~1.8x the data: with W1, W2 and W3
            # (10.8 GB) in it, its RSS reached 19.3 GB and the kernel's OOM
            # killer ended it (2026-11-27).
            w1) gb=4.1 ;;
            w5) if [[ " $* " == *" w1 "* ]]; then gb=0; else gb=4.1; fi ;;
            w2|w3) gb=7.7 ;;
            # 1.1 M objects of 0-64 bytes: their data is nothing, but the
            # memstore OSD keeps each object's head and bucket index entry
            # (W4_RGW_GB_PER_SCALE, benches/run.sh).
            w4) gb=$W4_RGW_GB_PER_SCALE; scale=$W4_SCALE ;;
            # W1's data at W6's own scale, in a bucket of its own.
            w6) gb=4.1; scale=${RIFFLE_BENCH_W6_SCALE:-$([ "$MODE" = quick ] && echo 0.05 || echo 0.3)} ;;
            *) gb=0 ;;
        esac
        need=$(awk -v a="$need" -v b="$gb" -v s="$scale" 'BEGIN {print a + b * s}')
    done
    avail=$(awk '/^MemAvailable:/ {printf "%.1f", $2 / 1048576}' /proc/meminfo)
    say "datasets need ~${need} GB in RGW's memory; ${avail} GiB available"
    if awk -v n="$need" -v a="$avail" 'BEGIN {exit !(n + 3 > a)}'; then
        warn "memory is tight: RGW holds the datasets in RAM (buckets of earlier runs too: deploy/local/rgw.sh down && deploy/local/rgw.sh up empties it)"
    fi
}

start_proxy() {
    local out="$WORK/run/proxy.out" i
    : > "$out"
    RUST_LOG=warn "$BIN/riffle-proxy" --listen 127.0.0.1:0 --upstream "$RGW_URL" \
        --control 127.0.0.1:0 >"$out" 2>>"$LOG_DIR/proxy.log" &
    PROXY_PID=$!
    for i in $(seq 1 100); do
        [ "$(wc -l < "$out")" -ge 2 ] && break
        sleep 0.1
    done
    PROXY_URL="http://$(sed -n 's/^listening on //p' "$out")"
    PROXY_CONTROL=$(sed -n 's/^control on //p' "$out")
    [ "$PROXY_URL" != "http://" ] && [ -n "$PROXY_CONTROL" ] \
        || die "riffle-proxy did not start (see $LOG_DIR/proxy.log)"
    say "proxy $PROXY_URL -> $RGW_URL (30 ms first byte, 100 MB/s per connection)"
}
