# Shared helpers of benches/run.sh: logging, apt installs, page-cache dropping, reading
# results, waiting for mounts and reading a daemon's RSS.
# Sourced; expects WORK and LOG_DIR to be set.

say() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*"; }
warn() { printf '%s WARNING: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'benches/run.sh: error: %s\n' "$*" >&2; exit 1; }

# apt_install LOG PACKAGE...: installs Debian packages without prompts,
# appending apt's output to LOG; fails when apt-get does.
apt_install() {
    local log=$1
    shift
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        --no-install-recommends "$@"; } >>"$log" 2>&1
}

# Drops the page cache (and dentries/inodes) so every epoch starts cold for
# the kernel; a system's own cache survives. Returns 1 when not allowed.
drop_caches() {
    sync
    if [ -w /proc/sys/vm/drop_caches ]; then
        echo 3 > /proc/sys/vm/drop_caches
    else
        return 1
    fi
}

# One line summary of a read-fs/read-s3/copy JSON result.
summary() {
    local f=$1
    [ -s "$f" ] || { echo "no result"; return; }
    local secs fps mbps rps mism errs
    secs=$(sed -n 's/.*"elapsed_s":\([0-9.e+-]*\).*/\1/p' "$f")
    fps=$(sed -n 's/.*"files_per_s":\([0-9.e+-]*\).*/\1/p' "$f")
    mbps=$(sed -n 's/.*"mb_per_s":\([0-9.e+-]*\).*/\1/p' "$f")
    rps=$(sed -n 's/.*"reads_per_s":\([0-9.e+-]*\).*/\1/p' "$f")
    mism=$(sed -n 's/.*"mismatches":\([0-9]*\).*/\1/p' "$f")
    errs=$(sed -n 's/.*"errors":\([0-9]*\).*/\1/p' "$f")
    printf '%.1f s, %.0f files/s, %.0f MB/s, %.0f reads/s, %s errors, %s wrong' \
        "$secs" "$fps" "$mbps" "$rps" "$errs" "$mism"
    cpu_summary "$f"
}

# ", CPU X s (daemon Y s)" of a result file's machine (and daemon) CPU
# ticks, or nothing when it recorded none.
cpu_summary() {
    local hz machine daemon
    hz=$(sed -n 's/.*"ticks_per_s":\([0-9]*\).*/\1/p' "$1")
    machine=$(sed -n 's/.*"machine_ticks":\([0-9]*\).*/\1/p' "$1")
    daemon=$(sed -n 's/.*"daemon_ticks":\([0-9]*\).*/\1/p' "$1")
    [ -n "$hz" ] && [ -n "$machine" ] || return 0
    awk -v hz="$hz" -v m="$machine" -v d="$daemon" 'BEGIN {
        printf ", CPU %.2f s", m / hz
        if (d != "") printf " (daemon %.2f s)", d / hz
    }'
}

# Waits until $1 is a mountpoint while process $2 lives; 0 when mounted.
wait_mounted() {
    local mnt=$1 pid=$2 i
    for i in $(seq 1 300); do
        mountpoint -q "$mnt" && return 0
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

# Peak RSS (VmHWM, KiB) of a live process, or nothing.
peak_rss_kb() {
    [ -n "${1:-}" ] && [ -r "/proc/$1/status" ] || return 0
    awk '/^VmHWM:/ {print $2}' "/proc/$1/status"
}

# Current RSS (VmRSS, KiB) of a live process, or nothing.
current_rss_kb() {
    [ -n "${1:-}" ] && [ -r "/proc/$1/status" ] || return 0
    awk '/^VmRSS:/ {print $2}' "/proc/$1/status"
}

# Whether $1 is in the mount table; unlike `mountpoint -q`, also true for a
# dead FUSE mount (its daemon gone), whose stat fails with ENOTCONN.
in_mount_table() {
    awk -v m="$1" '$2 == m {found = 1} END {exit !found}' /proc/mounts
}

# Creates mountpoint $1, first clearing a mount left there (a dead one from an
# interrupted earlier run would make the next mount fail).
fresh_mountpoint() {
    if in_mount_table "$1"; then
        warn "$1 was still mounted (left by an earlier run?); unmounting it"
        unmount_fuse "$1"
    fi
    mkdir -p "$1"
}

# Unmounts $1 if mounted (lazily as a last resort); waits for process $2.
unmount_fuse() {
    local mnt=$1 pid=${2:-} i
    if in_mount_table "$mnt"; then
        fusermount3 -u "$mnt" 2>/dev/null || fusermount -u "$mnt" 2>/dev/null \
            || umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
    fi
    if [ -n "$pid" ]; then
        for i in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || return 0
            sleep 0.1
        done
        kill "$pid" 2>/dev/null || true
    fi
}

# Starts $BIN/riffle-proxy in front of UPSTREAM (30 ms before the first byte,
# 100 MB/s per connection), its two address lines in OUT and its log in LOG;
# sets PROXY_PID, PROXY_URL and PROXY_CONTROL.
start_proxy() { # UPSTREAM OUT LOG
    local upstream=$1 out=$2 log=$3
    RUST_LOG=warn "$BIN/riffle-proxy" --listen 127.0.0.1:0 --upstream "$upstream" \
        --control 127.0.0.1:0 >"$out" 2>>"$log" &
    PROXY_PID=$!
    for _ in $(seq 1 100); do [ "$(wc -l < "$out")" -ge 2 ] && break; sleep 0.1; done
    PROXY_URL="http://$(sed -n 's/^listening on //p' "$out")"
    PROXY_CONTROL=$(sed -n 's/^control on //p' "$out")
    [ -n "$PROXY_CONTROL" ] || die "riffle-proxy did not start (see $log)"
}

# The commit of the run, with "+dirty" when src/ or benches/ have changes.
commit_id() {
    local c
    c=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
    git diff --quiet HEAD -- src benches 2>/dev/null || c="$c+dirty"
    echo "$c"
}

# The machine's 1-minute load average, sampled after every epoch (note_load)
# and reported per workload (load_note), since other jobs may share the
# machine and move the absolute numbers.
LOAD_MIN=
LOAD_MAX=
note_load() {
    local l
    l=$(cut -d' ' -f1 /proc/loadavg)
    if [ -z "$LOAD_MIN" ] || awk -v a="$l" -v b="$LOAD_MIN" 'BEGIN {exit !(a < b)}'; then LOAD_MIN=$l; fi
    if [ -z "$LOAD_MAX" ] || awk -v a="$l" -v b="$LOAD_MAX" 'BEGIN {exit !(a > b)}'; then LOAD_MAX=$l; fi
}
load_reset() { LOAD_MIN=; LOAD_MAX=; }
load_note() {
    [ -n "$LOAD_MIN" ] || return 0
    echo "1-minute load average after the epochs of this workload: $LOAD_MIN to $LOAD_MAX on $(nproc) cores (RGW, the proxy, the daemon and 8 reader threads count; above that, other jobs were sharing the machine)"
}

# FUSE over io_uring (issue 50): the kernel's switch, off until root turns it
# on (tests/run.sh does the same). enable_fuse_ring writes Y where it can and
# sets FUSE_RING to on, off (it stayed off: not writable) or absent (this
# kernel has no FUSE io_uring); fuse_ring_note says it for the report.
FUSE_RING_SWITCH=/sys/module/fuse/parameters/enable_uring
FUSE_RING=
enable_fuse_ring() {
    if [ ! -e "$FUSE_RING_SWITCH" ]; then
        FUSE_RING=absent
        return 0
    fi
    [ -w "$FUSE_RING_SWITCH" ] && { echo Y > "$FUSE_RING_SWITCH"; } 2>/dev/null
    case $(cat "$FUSE_RING_SWITCH" 2>/dev/null) in
        Y|1) FUSE_RING=on ;;
        *) FUSE_RING=off ;;
    esac
}
fuse_ring_note() {
    local asked="the riffle rows ask for --fuse-transport $RIFFLE_TRANSPORT, their dev-fuse twins for dev-fuse; each label ends with the transport \`riffle stats\` gave right after mounting"
    case $FUSE_RING in
        on) echo "FUSE transport: $asked; the kernel's FUSE io_uring was on ($FUSE_RING_SWITCH = Y)" ;;
        off) echo "FUSE transport: $asked; the kernel's FUSE io_uring was OFF and could not be turned on ($FUSE_RING_SWITCH is not writable here), so every riffle row ran over /dev/fuse, those that asked for $RIFFLE_TRANSPORT too: this run does not measure io_uring" ;;
        *) echo "FUSE transport: $asked; this kernel (Linux $(uname -r)) has no FUSE io_uring ($FUSE_RING_SWITCH is missing; it needs 6.14+), so every riffle row ran over /dev/fuse, those that asked for $RIFFLE_TRANSPORT too: this run does not measure io_uring" ;;
    esac
}
