# Mounting and unmounting each FUSE system of the benchmark (riffle, s3fs,
# rclone) against an endpoint (the proxy or RGW). Sourced by benches/run.sh.
#
# mount_SYSTEM BUCKET MNT ENDPOINT TAG sets DAEMON_PID and returns 0 once the
# mount is live, or sets NOT_RUN (a reason) and returns 1.
# unmount_system SYSTEM MNT unmounts and waits for the daemon to exit.

mount_riffle() {
    local bucket=$1 mnt=$2 endpoint=$3 tag=$4
    local pidf="$WORK/run/riffle.pid" log="$LOG_DIR/riffle-$tag.log"
    rm -f "$pidf"
    if ! "$BIN/riffle" mount "s3://$bucket" "$mnt" --endpoint-url "$endpoint" \
        --force-path-style --metadata-ttl indefinite --max-memory "${RIFFLE_MEMORY:-1G}" \
        --log-file "$log" --pid-file "$pidf" >>"$LOG_DIR/riffle-$tag.out" 2>&1; then
        NOT_RUN="failed: riffle mount failed ($(tail -n1 "$LOG_DIR/riffle-$tag.out" 2>/dev/null))"
        return 1
    fi
    DAEMON_PID=$(cat "$pidf" 2>/dev/null || true)
    mountpoint -q "$mnt" || { NOT_RUN="failed: riffle mount returned but $mnt is not mounted"; return 1; }
}

mount_s3fs() {
    local bucket=$1 mnt=$2 endpoint=$3 tag=$4
    command -v s3fs >/dev/null || { NOT_RUN="not run: s3fs is not installed (apt-get install s3fs failed)"; return 1; }
    local cache="$WORK/cache/s3fs"
    rm -rf "$cache"; mkdir -p "$cache"
    s3fs "$bucket" "$mnt" -f -o ro -o passwd_file="$WORK/run/s3fs.passwd" \
        -o url="$endpoint" -o use_path_request_style -o endpoint=us-east-1 \
        -o use_cache="$cache" >>"$LOG_DIR/s3fs-$tag.log" 2>&1 &
    DAEMON_PID=$!
    wait_mounted "$mnt" "$DAEMON_PID" && return 0
    NOT_RUN="failed: s3fs did not mount ($(tail -n1 "$LOG_DIR/s3fs-$tag.log" 2>/dev/null))"
    kill "$DAEMON_PID" 2>/dev/null || true
    return 1
}

mount_rclone() {
    local bucket=$1 mnt=$2 endpoint=$3 tag=$4
    command -v rclone >/dev/null || { NOT_RUN="not run: rclone is not installed (apt-get install rclone failed)"; return 1; }
    local cache="$WORK/cache/rclone" conf="$WORK/run/rclone-$tag.conf"
    rm -rf "$cache"; mkdir -p "$cache"
    cat > "$conf" <<CONF
[bench]
type = s3
provider = Ceph
access_key_id = $AWS_ACCESS_KEY_ID
secret_access_key = $AWS_SECRET_ACCESS_KEY
endpoint = $endpoint
region = us-east-1
force_path_style = true
CONF
    env -u AWS_CA_BUNDLE rclone --config "$conf" mount "bench:$bucket" "$mnt" \
        --read-only --vfs-cache-mode full --cache-dir "$cache" \
        --log-file "$LOG_DIR/rclone-$tag.log" >>"$LOG_DIR/rclone-$tag.out" 2>&1 &
    DAEMON_PID=$!
    wait_mounted "$mnt" "$DAEMON_PID" && return 0
    NOT_RUN="failed: rclone did not mount ($(tail -n1 "$LOG_DIR/rclone-$tag.log" 2>/dev/null))"
    kill "$DAEMON_PID" 2>/dev/null || true
    return 1
}

unmount_system() {
    local system=$1 mnt=$2
    if [ "$system" = riffle ] && mountpoint -q "$mnt" 2>/dev/null; then
        "$BIN/riffle" unmount "$mnt" >/dev/null 2>&1 || true
    fi
    unmount_fuse "$mnt" "${DAEMON_PID:-}"
    DAEMON_PID=
}

# Unmounts everything under $WORK/mnt (the exit trap).
unmount_all() {
    local m
    for m in "$WORK"/mnt/*; do
        [ -d "$m" ] || continue
        if mountpoint -q "$m" 2>/dev/null; then
            "$BIN/riffle" unmount "$m" >/dev/null 2>&1 || true
            unmount_fuse "$m"
        fi
    done
}
