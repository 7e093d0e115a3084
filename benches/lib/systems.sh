# Mounting and unmounting each FUSE system of the benchmark (the riffle
# variants, s3fs, rclone, Mountpoint) against an endpoint (the proxy or RGW).
# Sourced by benches/run.sh.
#
# mount_system SYSTEM BUCKET MNT ENDPOINT TAG sets DAEMON_PID and returns 0
# once the mount is live, or sets NOT_RUN (a reason) and returns 1.
# unmount_system SYSTEM MNT [TAG] unmounts, waits for the daemon to exit and
# removes the system's cache directory (or, for many-file workloads, leaves
# it for the end of the workload: see keep_caches). With REMOUNT set,
# mount_system mounts a riffle variant again on the cache directory its last
# mount with that TAG left (W4's remount: unmount it without a TAG first);
# the peers mount as always.
#
# The riffle variants (each a fresh mount with a fresh cache directory under
# $WORK/cache, on local disk):
#   riffle          --cache-dir (FUSE passthrough for fully cached files)
#   riffle-nopt     --cache-dir --no-passthrough
#   riffle-plan     --cache-dir, and `riffle plan MNT FILE` before every epoch
#                   with the exact order the reader will open (riffle-bench plan)
#   riffle-listing  --cache-dir; the reader opens the files in listing order
#                   (directory-order detection, no plan)
#   riffle-mem      no --cache-dir: the in-memory block cache only
#   riffle-seq (W4) --cache-dir --list-concurrency 0: no background listing,
#                   only the directories asked for, one at a time
#   riffle-lru, riffle-epoch (W5) --cache-dir --cache-size --eviction POLICY;
#                   W5's riffle-plan adds --eviction plan
# All with --metadata-ttl indefinite, --max-memory $RIFFLE_MEMORY and
# --fuse-transport (transport_of), and those with a cache with --cache-min-free
# $RIFFLE_CACHE_MIN_FREE; RIFFLE_EXTRA_ARGS (an array, set by W5) is appended.
#
# SYSTEM-py (W1: local-py, riffle-py, riffle-plan-py) is SYSTEM read by the
# Python reader (benches/python_reader.py: N processes, open/read/close per
# file, what a DataLoader does) instead of riffle-bench read-fs: the same
# mount (or local copy), plan and order; only the reader differs (read_pass).
#
# The /dev/fuse twins (issue 50): a riffle row's name is
# VARIANT[-devfuse][-py], and VARIANT-devfuse (riffle-devfuse,
# riffle-nopt-devfuse; riffle-devfuse-py is riffle-py's) is VARIANT mounted
# with --fuse-transport dev-fuse, the classic /dev/fuse read/writev loop,
# where VARIANT asks for $RIFFLE_TRANSPORT (RIFFLE_BENCH_FUSE_TRANSPORT:
# auto, riffle's default, or io-uring). What each mount got is read from
# `riffle stats` right after mounting (mount_transport), not assumed from the
# flag. The harness reads the same names (results/transport.rs).

is_riffle() { [[ $1 == riffle || $1 == riffle-* ]]; }

# The variant a row mounts and plans as (riffle-nopt for riffle-nopt-devfuse,
# local for local-py), whether a row is read by the Python reader, and the
# --fuse-transport a riffle row asks for.
base_system() { local s=${1%-py}; echo "${s%-devfuse}"; }
reads_with_python() { [[ $1 == *-py ]]; }
transport_of() {
    if [[ ${1%-py} == *-devfuse ]]; then echo dev-fuse; else echo "$RIFFLE_TRANSPORT"; fi
}
# The row a /dev/fuse twin is the twin of (riffle-devfuse-py: riffle-py).
twin_of() {
    local s=${1%-py}
    echo "${s%-devfuse}${1#"$s"}"
}

# Systems that are read with an epoch plan, or in listing order.
uses_plan() { [ "$(base_system "$1")" = riffle-plan ]; }
reads_in_listing_order() { [ "$(base_system "$1")" = riffle-listing ]; }

cache_dir_of() { echo "$WORK/cache/$1-$2"; }

mount_system() {
    local sys=$1; shift
    if is_riffle "$sys"; then
        mount_riffle "$sys" "$@"
    elif declare -F "mount_$sys" >/dev/null; then
        "mount_$sys" "$@"
    else
        NOT_RUN="not run: no runner for $sys"
        return 1
    fi
}

mount_riffle() {
    local sys=$1 bucket=$2 mnt=$3 endpoint=$4 tag=$5
    local pidf="$WORK/run/riffle-$tag.pid" log="$LOG_DIR/$sys-$tag.log"
    local cache args=()
    cache=$(cache_dir_of "$sys" "$tag")
    [ -n "${REMOUNT:-}" ] || rm -rf "$cache"
    case $(base_system "$sys") in
        riffle-mem) ;;
        riffle-nopt) mkdir -p "$cache"; args+=(--cache-dir "$cache" --no-passthrough) ;;
        riffle-seq) mkdir -p "$cache"; args+=(--cache-dir "$cache" --list-concurrency 0) ;;
        *) mkdir -p "$cache"; args+=(--cache-dir "$cache") ;;
    esac
    [ "$(base_system "$sys")" = riffle-mem ] || args+=(--cache-min-free "$RIFFLE_CACHE_MIN_FREE")
    args+=(--fuse-transport "$(transport_of "$sys")" "${RIFFLE_EXTRA_ARGS[@]}")
    rm -f "$pidf"
    if ! "$BIN/riffle" mount "s3://$bucket" "$mnt" --endpoint-url "$endpoint" \
        --force-path-style --metadata-ttl indefinite --max-memory "${RIFFLE_MEMORY:-1G}" \
        "${args[@]}" --log-file "$log" --pid-file "$pidf" >>"$LOG_DIR/$sys-$tag.out" 2>&1; then
        NOT_RUN="failed: riffle mount failed ($(tail -n1 "$LOG_DIR/$sys-$tag.out" 2>/dev/null))"
        return 1
    fi
    DAEMON_PID=$(cat "$pidf" 2>/dev/null || true)
    mountpoint -q "$mnt" || { NOT_RUN="failed: riffle mount returned but $mnt is not mounted"; return 1; }
    echo "$sys: riffle mount ... --max-memory ${RIFFLE_MEMORY:-1G} ${args[*]}${REMOUNT:+ (again, on the same cache directory)}" >>"$LOG_DIR/mounts.log"
}

mount_s3fs() {
    local bucket=$1 mnt=$2 endpoint=$3 tag=$4
    command -v s3fs >/dev/null || { NOT_RUN="not run: s3fs is not installed (apt-get install s3fs failed)"; return 1; }
    local cache
    cache=$(cache_dir_of s3fs "$tag")
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
    local cache conf="$WORK/run/rclone-$tag.conf"
    cache=$(cache_dir_of rclone "$tag")
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

# mount_transport MNT FILE: a riffle mount's `riffle stats --json` into FILE
# right after mounting, and its fuse.transport printed (the harness reads it
# from FILE for the row: record_row --mount-stats). A ring still registering
# its queues ("io_uring not ready") is asked again for up to 5 s.
mount_transport() {
    local mnt=$1 out=$2 t="" i
    for i in $(seq 1 50); do
        riffle_stats "$mnt" "$out"
        t=$(sed -n 's/^ *"transport": *"\(.*\)",\{0,1\}$/\1/p' "$out" | head -n1)
        [[ $t == "/dev/fuse: io_uring not ready"* ]] || break
        sleep 0.1
    done
    echo "${t:-not reported (riffle stats did not answer; see $LOG_DIR/riffle-stats.log)}"
}

# Mountpoint (benches/lib/mountpoint.sh, when present) is mount_mountpoint
# BUCKET MNT ENDPOINT TAG; without that file the system reports "not run".

unmount_system() {
    local system=$1 mnt=$2 tag=${3:-}
    if is_riffle "$system" && in_mount_table "$mnt"; then
        "$BIN/riffle" unmount "$mnt" >/dev/null 2>&1 || true
    fi
    if [ "$system" = mountpoint ] && declare -F unmount_mountpoint >/dev/null; then
        unmount_mountpoint "$mnt"
    else
        unmount_fuse "$mnt" "${DAEMON_PID:-}"
    fi
    DAEMON_PID=
    [ -n "$tag" ] && ! keep_caches && rm -rf "$(cache_dir_of "$system" "$tag")"
    return 0
}

# Whether a finished system's cache directory stays until its workload ends
# (run_workload and run_w5 remove $WORK/cache then) instead of going at once.
# On ext4 without a journal (this VM's root file system), every inode created
# in the next few minutes scans past the inodes just deleted, so removing one
# system's tens of thousands of cache files would slow down the file
# creation of the next system's cold epoch (perf, riffle's cold epoch right
# after such a removal: a third of the daemon's samples were ext4 skipping
# recently deleted inodes, recently_deleted/find_inode_bit). Set for
# many-file workloads (KEEP_CACHES=1), and only while more than 5% of the
# file system (riffle's default free-space floor) plus 10 GB stays available:
# W1's and W5's caches take a few GB in all. (A quarter of the file system
# free, the earlier rule, never held on this VM's disk, whose size counts far
# more than what is available, so the caches were removed between systems
# after all.)
keep_caches() {
    [ -n "${KEEP_CACHES:-}" ] || return 1
    local total avail
    read -r total avail < <(df -P -k "$WORK" | awk 'NR == 2 {print $2, $4}')
    [ -n "$avail" ] && [ "$avail" -gt $((total / 20 + 10 * 1024 * 1024)) ]
}

# Unmounts everything under $WORK/mnt (the exit trap).
unmount_all() {
    local m
    for m in "$WORK"/mnt/*; do
        if in_mount_table "$m"; then
            "$BIN/riffle" unmount "$m" >/dev/null 2>&1 || true
            unmount_fuse "$m"
        fi
    done
}
