# One workload of benches/run.sh: generate the dataset, run every system
# (with and without the proxy), record the rows. Sourced; uses the globals
# set by run.sh (MODE, SCALE, SYSTEMS, DIRECT, BIN, WORK, RES_DIR, ...).

has() { [[ ",$1," == *",$2,"* ]]; }

# Table ids (and read-fs patterns) of a workload.
tables_of() {
    case $1 in w3) echo "w3 w3-mmap" ;; *) echo "$1" ;; esac
}

# The proxy's counters (riffle-bench proxy-stats): "--reset" zeroes them,
# "--out FILE" saves them.
proxy_stats() {
    "$BIN/riffle-bench" proxy-stats --control "$PROXY_CONTROL" "$@" 2>>"$LOG_DIR/proxy-stats.log"
}

# riffle stats MNT --json into FILE (empty when the daemon does not answer).
riffle_stats() {
    "$BIN/riffle" stats "$1" --json >"$2" 2>>"$LOG_DIR/riffle-stats.log" || : >"$2"
}

# GET requests (whole and ranged) in a proxy-stats file, or "?".
gets_of() {
    sed -n 's/.*"get_object":\([0-9]*\).*"get_range":\([0-9]*\).*/\1 \2/p' "$1" 2>/dev/null \
        | awk '{print $1 + $2; found = 1} END {if (!found) print "?"}'
}

# read_pass SYSTEM ROOT TABLE EPOCH OUT [COUNT]: one reader epoch after
# dropping the page cache. With COUNT=1 (the FUSE systems), the proxy's
# counters are reset before the epoch and saved after it (OUT's .proxy.json,
# through the proxy column only), and a riffle mount's `riffle stats` are
# saved before and after it (.riffle-before/.riffle-after.json). For
# riffle-plan, the epoch's plan (riffle-bench plan: the very order read-fs
# will open) is written first and handed to `riffle plan` right before the
# reader starts. The reader is riffle-bench read-fs, or for SYSTEM-py rows
# the Python reader, given the same plan as its order and $PY_SUMS (sizes
# and CRC-32s) to verify it. Either records the machine's CPU over the
# epoch, and with COUNT=1 that of the mount's daemon ($DAEMON_PID, the
# process peak RSS is read from).
read_pass() {
    local sys=$1 root=$2 table=$3 epoch=$4 out=$5 count=${6:-0} rc=0
    local base=${out%.json} extra=() order=shuffle plan="" order_file="" t0 msg="" daemon=()
    [ "$count" = 1 ] && [ -n "${DAEMON_PID:-}" ] && daemon=(--daemon-pid "$DAEMON_PID")
    case $table in
        w3|w3-mmap) extra+=(--duration "$W3_DURATION") ;;
        *) reads_in_listing_order "$sys" && order=listing; extra+=(--order "$order") ;;
    esac
    extra+=("${LIMIT[@]}")
    rm -f "$out" "$base".{proxy,riffle-before,riffle-after}.json
    if uses_plan "$sys" || reads_with_python "$sys"; then
        order_file="$WORK/run/plan-$table-e$epoch-$order.txt"
        "$BIN/riffle-bench" plan --manifest "$MANIFEST" --seed "$SEED" --epoch "$epoch" \
            --order "$order" "${LIMIT[@]}" --out "$order_file" 2>>"$LOG_DIR/plan.log" \
            || { warn "riffle-bench plan failed (see $LOG_DIR/plan.log)"; order_file=""; }
        uses_plan "$sys" && plan=$order_file
    fi
    drop_caches || true
    if [ "$count" = 1 ]; then
        is_riffle "$sys" && riffle_stats "$root" "$base.riffle-before.json"
        [ "$COL" = proxy ] && proxy_stats --reset >/dev/null
    fi
    if [ -n "$plan" ]; then
        t0=$(date +%s.%N)
        "$BIN/riffle" plan "$root" "$plan" >>"$LOG_DIR/plan.log" 2>&1 \
            || warn "riffle plan $root failed (see $LOG_DIR/plan.log)"
        msg=" [plan of $(wc -l < "$plan") files set in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.2f", b - a}') s]"
    fi
    if reads_with_python "$sys"; then
        # No plan file, no result: the row says the reader produced none.
        [ -n "$order_file" ] && timeout -k 10 "$EPOCH_TIMEOUT" python3 "$ROOT/benches/python_reader.py" \
            --root "$root" --plan "$order_file" --sums "$PY_SUMS" --workers "$PY_WORKERS" \
            --seed "$SEED" --epoch "$epoch" --json-out "$out" "${daemon[@]}" \
            >/dev/null 2>>"$LOG_DIR/python-reader.log" || rc=$?
    else
        timeout -k 10 "$EPOCH_TIMEOUT" "$BIN/riffle-bench" read-fs --root "$root" \
            --manifest "$MANIFEST" --pattern "$table" --seed "$SEED" --epoch "$epoch" \
            --json-out "$out" "${extra[@]}" "${daemon[@]}" >/dev/null 2>>"$LOG_DIR/read-fs.log" || rc=$?
    fi
    if [ "$count" = 1 ]; then
        if [ "$COL" = proxy ]; then
            proxy_stats --out "$base.proxy.json" || true
            msg+=", $(gets_of "$base.proxy.json") GETs at the proxy"
        fi
        is_riffle "$sys" && riffle_stats "$root" "$base.riffle-after.json"
    fi
    note_load
    say "    $table epoch $epoch$(reads_with_python "$sys" && echo " (Python reader)"): $(summary "$out")$msg$([ $rc = 0 ] || echo " (exit $rc)") [load $(cut -d' ' -f1 /proc/loadavg)]"
    return 0
}

# LIMIT: "--max-files N" when this workload's epochs read a subset (W1 and
# W5 in the full run), else empty.
set_limit() {
    LIMIT=()
    local n=
    case $WL in
        w1) n=$W1_MAX_FILES ;;
        w5) n=$W5_MAX_FILES ;;
    esac
    if [ -n "$n" ] && [ "$n" != 0 ]; then
        LIMIT=(--max-files "$n")
    fi
}

# Status of a row from its cold result file.
status_of() {
    if [ -s "$1" ]; then echo ok; else echo "failed: the reader produced no result (timed out or crashed; see logs)"; fi
}

record_row() {
    local round=()
    [ "$ROUND" -gt 1 ] && round=(--round "$ROUND")
    "$BIN/riffle-bench" record row --run "$RUN_FILE" "${round[@]}" "$@"
}

# What names the files of an extra round of the goal comparisons apart
# (results, copies, mount tags): "-rN" in round N > 1, else nothing.
round_suffix() {
    if [ "$ROUND" -gt 1 ]; then echo "-r$ROUND"; fi
}

# Whether this workload's readers run epoch 3, a re-read for every system
# alike (the W2 table): riffle's epoch 2 is the first read of the cache
# files its epoch 1 wrote, while local disk's epoch 2 re-reads what its
# epoch 1 read (benches/README.md, "First reads"). Rows record it with
# --epoch3 (a missing result is recorded as absent).
has_reread() {
    has "${TABLES// /,}" w2
}

# The reader epochs of this workload's tables.
reader_epochs() {
    if has_reread; then echo 1 2 3; else echo 1 2; fi
}

# local disk and copy-first share the copy: copy (timed), then the local epochs.
run_copy() {
    local col=$1 endpoint=$2 r
    r=$(round_suffix)
    local dest="$WORK/local/$MODE-$WL$r" t e e3
    say "  copy-first ($col): 64 parallel downloads to $dest"
    rm -rf "$dest"
    local copy="$RES_DIR/$WL-copy-$col$r.json" rc=0
    timeout -k 10 "$EPOCH_TIMEOUT" "$BIN/riffle-bench" copy --manifest "$MANIFEST" \
        --endpoint "$endpoint" --dest "$dest" --parallel 64 --json-out "$copy" \
        --seed "$SEED" "${LIMIT[@]}" >/dev/null 2>>"$LOG_DIR/copy.log" || rc=$?
    say "    copy: $(summary "$copy")$([ $rc = 0 ] || echo " (exit $rc)")"
    if [ ! -s "$WORK/run/local-done-$WL$r" ]; then
        say "  local disk"
        for e in $(reader_epochs); do
            for t in $TABLES; do
                read_pass local "$dest" "$t" "$e" "$RES_DIR/$t-local$r-e$e.json"
            done
        done
        echo ok > "$WORK/run/local-done-$WL$r"
        if has "$SYSTEMS" local; then
            for t in $TABLES; do
                e3=(); has_reread && e3=(--epoch3 "$RES_DIR/$t-local$r-e3.json")
                record_row --table "$t" --system local --column proxy \
                    --status "$(status_of "$RES_DIR/$t-local$r-e1.json")" \
                    --cold "$RES_DIR/$t-local$r-e1.json" --warm "$RES_DIR/$t-local$r-e2.json" "${e3[@]}"
            done
        fi
        # The Python reader on the same copy, right after read-fs.
        if has "$SYSTEMS" local-py && runs_in local-py; then
            if python_missing >/dev/null; then
                record_row --table "$WL" --system local-py --column proxy --status "$(python_missing)"
            else
                say "  local disk, Python reader"
                for e in $(reader_epochs); do
                    read_pass local-py "$dest" "$WL" "$e" "$RES_DIR/$WL-local-py$r-e$e.json"
                done
                record_row --table "$WL" --system local-py --column proxy \
                    --status "$(status_of "$RES_DIR/$WL-local-py$r-e1.json")" \
                    --cold "$RES_DIR/$WL-local-py$r-e1.json" --warm "$RES_DIR/$WL-local-py$r-e2.json" \
                    --note "$(note_of local-py)"
            fi
        fi
    fi
    # copy-first's epochs are local disk's (after the copy), its re-read too.
    if has "$SYSTEMS" copy-first; then
        for t in $TABLES; do
            local st=ok
            [ -s "$copy" ] || st="failed: the copy produced no result (see logs)"
            [ "$st" = ok ] && st=$(status_of "$RES_DIR/$t-local$r-e1.json")
            e3=(); has_reread && e3=(--epoch3 "$RES_DIR/$t-local$r-e3.json")
            record_row --table "$t" --system copy-first --column "$col" --status "$st" \
                --copy "$copy" --cold "$RES_DIR/$t-local$r-e1.json" --warm "$RES_DIR/$t-local$r-e2.json" \
                "${e3[@]}"
        done
    fi
}

# Extra rounds (2..GOAL_ROUNDS) of the comparisons the goals of issues 3 and
# 4 are set on, run again back to back after every system ran once (round 1,
# the table's rows): a new copy and local disk's epochs on it (W1: the
# copy-first total; W2: local disk's first read of files just written, its
# warm epoch and its re-read), then riffle + epoch plan (W1, a fresh mount and
# cache: the cold-epoch goal) and riffle (a fresh mount and cache: the warm
# goal against local disk's epochs of the same round; on W2 its cold, warm and
# re-read epochs, so its warm epoch is again the first read of cache files
# just written; on W1 also riffle read by the Python reader, after local disk
# read by it: the Python goals; and riffle without passthrough, when it runs:
# issue 21's goals). The goal lines give the median over the
# rounds and each round's value (results/goals.rs); the tables show round 1
# only.
run_goal_rounds() {
    local riffles=() sys
    case $WL in
        w1) riffles=(riffle-plan riffle riffle-devfuse riffle-py riffle-devfuse-py riffle-nopt riffle-nopt-devfuse) ;;
        w2) riffles=(riffle riffle-devfuse riffle-nopt riffle-nopt-devfuse) ;;
        *) return 0 ;;
    esac
    [ "$GOAL_ROUNDS" -gt 1 ] || return 0
    has "$SYSTEMS" copy-first || has "$SYSTEMS" local || has "$SYSTEMS" local-py || return 0
    for ((ROUND = 2; ROUND <= GOAL_ROUNDS; ROUND++)); do
        say "  goal round $ROUND of $GOAL_ROUNDS: a new copy, local disk, ${riffles[*]}"
        run_copy proxy "$PROXY_URL"
        # Nothing reads a round's copy again: free its space now (W2: 4.3 GB).
        rm -rf "$WORK/local/$MODE-$WL$(round_suffix)"
        for sys in "${riffles[@]}"; do
            has "$SYSTEMS" "$sys" && run_fuse "$sys" proxy "$PROXY_URL"
        done
    done
    ROUND=1
}

# The store read straight with 64 requests in flight (W1: whole objects,
# W2: 8 MiB ranged parts); not for the random-read W3.
run_s3_client() {
    local col=$1 endpoint=$2 mode rc=0
    local out="$RES_DIR/$WL-s3-client-$col.json"
    case $WL in w1) mode=objects ;; w2) mode=ranged ;; *) return 0 ;; esac
    say "  S3 client ($col): read-s3 --mode $mode, 64 in flight"
    timeout -k 10 "$EPOCH_TIMEOUT" "$BIN/riffle-bench" read-s3 --manifest "$MANIFEST" \
        --endpoint "$endpoint" --mode "$mode" --parallel 64 --seed "$SEED" "${LIMIT[@]}" \
        --json-out "$out" >/dev/null 2>>"$LOG_DIR/read-s3.log" || rc=$?
    say "    one pass: $(summary "$out")$([ $rc = 0 ] || echo " (exit $rc)")"
    record_row --table "$WL" --system s3-client --column "$col" --status "$(status_of "$out")" \
        --cold "$out" --note "no cache, so one pass only"
}

# The note under a system's row (a /dev/fuse twin's: what it differs in;
# every riffle row's transport, as `riffle stats` gave it, is added by the
# report).
note_of() {
    if is_riffle "$1" && [ "$(transport_of "$1")" = dev-fuse ]; then
        echo "as the row above ($(twin_of "$1")), a fresh mount and cache, with --fuse-transport dev-fuse: every FUSE request over /dev/fuse (a read and a writev in the daemon per request), for comparison"
        return 0
    fi
    case $1 in
        riffle) echo "no plan, no flags beyond the cache (what unchanged training code gets): a fresh mount with a fresh --cache-dir on local disk; epoch prefetch on (the default); files complete in the cache are opened with FUSE passthrough; --max-memory $RIFFLE_MEMORY" ;;
        riffle-nopt) echo "as riffle, with --no-passthrough (what kernels before 6.9 and mounts without CAP_SYS_ADMIN get): every read the page cache cannot answer goes through the daemon, which checks a cached block's CRC once before it trusts it (blocks it wrote itself are trusted, as with passthrough)" ;;
        riffle-plan) echo "as riffle, plus \`riffle plan MNT FILE\` right before each epoch with the exact order the reader opens (\`riffle-bench plan\`, the reader's own order function); setting it is not timed (it takes milliseconds)" ;;
        riffle-listing) echo "‡ this row's reader opens the files in listing order (sorted paths, directory by directory) instead of a shuffle; otherwise as riffle, no plan: riffle's directory-order detection prefetches" ;;
        local-py) echo "the Python reader (benches/python_reader.py: $PY_WORKERS worker processes, each file opened, read whole with f.read() and closed, like a DataLoader's workers; zlib CRC-32 of every file checked) on local disk's copy, right after read-fs's epochs; the Python rows' ÷ local columns divide by this row" ;;
        riffle-py) echo "as riffle, no plan (a fresh mount and cache), read by the Python reader instead of read-fs: the same files in the same order (riffle-bench plan)" ;;
        riffle-plan-py) echo "as riffle + epoch plan (a fresh mount and cache, \`riffle plan\` before each epoch), read by the Python reader" ;;
        riffle-mem) echo "no --cache-dir: only the in-memory block cache (--max-memory $RIFFLE_MEMORY), so a warm epoch refetches whatever did not fit in it" ;;
        mountpoint) echo "the mountpoint-s3-fs library (bench-only binary, benches/mountpoint) with its local disk cache (--cache), --metadata-ttl indefinite, --max-threads ${MOUNTPOINT_MAX_THREADS:-16}" ;;
    esac
}

# W1's browsing measurement: a fresh riffle mount (defaults, --cache-dir)
# read by one thread opening BROWSE_FILES files drawn at random from the
# whole dataset, like a person looking at samples. What matters is what it
# costs at the store: the proxy's bytes are saved once riffle has nothing
# left in flight (epoch prefetch finished what it started), so the row's
# detail shows bytes fetched against bytes read.
BROWSE_FILES=${RIFFLE_BENCH_BROWSE_FILES:-200}
run_browse() {
    local sys=riffle mnt="$WORK/mnt/riffle-browse" tag="$WL-browse" out="$RES_DIR/w1-riffle-browse-proxy-e1.json"
    local base=${out%.json} i
    [ "$COL" = proxy ] || return 0
    fresh_mountpoint "$mnt"
    say "  riffle, browsing $BROWSE_FILES random files with 1 thread"
    NOT_RUN=''
    DAEMON_PID=''
    if ! mount_system "$sys" "$BUCKET" "$mnt" "$PROXY_URL" "$tag"; then
        say "    $NOT_RUN"
        record_row --table w1 --system riffle-browse --column proxy --status "$NOT_RUN"
        unmount_system "$sys" "$mnt" "$tag"
        return 0
    fi
    rm -f "$out" "$base".{proxy,riffle-before,riffle-after}.json
    drop_caches || true
    riffle_stats "$mnt" "$base.riffle-before.json"
    proxy_stats --reset >/dev/null
    timeout -k 10 "$EPOCH_TIMEOUT" "$BIN/riffle-bench" read-fs --root "$mnt" \
        --manifest "$MANIFEST" --pattern w1 --seed "$SEED" --epoch 1 --threads 1 \
        --sample "$BROWSE_FILES" --json-out "$out" ${DAEMON_PID:+--daemon-pid "$DAEMON_PID"} \
        >/dev/null 2>>"$LOG_DIR/read-fs.log" || true
    for i in $(seq 1 120); do
        riffle_stats "$mnt" "$base.riffle-after.json"
        grep -Eq '"fetching": ?0[,}]' "$base.riffle-after.json" && break
        sleep 0.5
    done
    proxy_stats --out "$base.proxy.json" || true
    say "    $(summary "$out"), $(gets_of "$base.proxy.json") GETs at the proxy"
    unmount_system "$sys" "$mnt" "$tag"
    record_row --table w1 --system riffle-browse --column proxy --status "$(status_of "$out")" \
        --cold "$out" --note "§ one reader thread opens $BROWSE_FILES files drawn at random from all of the dataset's files (not an epoch): the row is about what browsing costs at the store, bytes fetched against bytes read (goal below), not about speed"
}

# Whether a system runs in this workload (the plan and listing-order
# variants and the Python reader's rows are W1's, the sequential walk W4's;
# a /dev/fuse twin runs where its row does).
runs_in() {
    reads_with_python "$1" && { [ "$WL" = w1 ]; return; }
    case $(base_system "$1") in
        riffle-plan|riffle-listing) [ "$WL" = w1 ] ;;
        riffle-seq) [ "$WL" = w4 ] ;;
        *) return 0 ;;
    esac
}

# The Python reader: how many worker processes (W1's 8 reader threads), and
# why its rows cannot run (printed; nothing when they can).
PY_WORKERS=${RIFFLE_BENCH_PY_WORKERS:-8}
python_missing() {
    if ! command -v python3 >/dev/null; then
        echo "not run: python3 is not installed"
    elif [ ! -s "${PY_SUMS:-}" ]; then
        echo "failed: no sizes and CRC-32s for the Python reader (riffle-bench plan --crc32 failed; see logs)"
    else
        return 1
    fi
}

# PY_SUMS: sizes and CRC-32s of every file the epochs of this workload read
# (riffle-bench plan --crc32, in listing order; the same files every epoch),
# which the Python reader checks; computed once per workload when a SYSTEM-py
# row runs in it.
prepare_python_sums() {
    PY_SUMS=
    local sys
    for sys in ${SYSTEMS//,/ }; do
        reads_with_python "$sys" && runs_in "$sys" && PY_SUMS="$WORK/run/sums-$MODE-$WL.tsv"
    done
    [ -n "$PY_SUMS" ] || return 0
    command -v python3 >/dev/null || return 0
    "$BIN/riffle-bench" plan --manifest "$MANIFEST" --seed "$SEED" --order listing "${LIMIT[@]}" \
        --crc32 --out "$PY_SUMS" 2>>"$LOG_DIR/plan.log" \
        || { warn "riffle-bench plan --crc32 failed (see $LOG_DIR/plan.log): the Python reader's rows fail"; rm -f "$PY_SUMS"; }
}

# check_mounted MNT EPOCH: 0 while MNT is still mounted; else sets
# MOUNT_LOST (the row's status) and warns: something unmounted it during the
# epoch (its daemon died, or a cleanup elsewhere on the machine, such as
# tests/run.sh's exit trap, unmounted every fuse.riffle mount).
check_mounted() {
    mountpoint -q "$1" 2>/dev/null && return 0
    MOUNT_LOST="failed: the mount disappeared during epoch $2 (its daemon exited, or something else on the machine unmounted it; see logs)"
    warn "$1 is no longer mounted after epoch $2"
    return 1
}

# A FUSE system: mount, the epochs of every table (two; W2 three), peak
# RSS, unmount.
run_fuse() {
    local sys=$1 col=$2 endpoint=$3 mnt="$WORK/mnt/$1" r t e e3 rss note
    r=$(round_suffix)
    local tag="$WL-$col$r" res="$sys-$col$r"
    fresh_mountpoint "$mnt"
    say "  $sys ($col)"
    NOT_RUN=''
    DAEMON_PID=''
    COL=$col
    local t0=$SECONDS
    if reads_with_python "$sys" && python_missing >/dev/null; then
        NOT_RUN=$(python_missing)
        say "    $NOT_RUN"
        for t in $TABLES; do record_row --table "$t" --system "$sys" --column "$col" --status "$NOT_RUN"; done
        return 0
    fi
    if ! mount_system "$sys" "$BUCKET" "$mnt" "$endpoint" "$tag"; then
        say "    $NOT_RUN"
        for t in $TABLES; do record_row --table "$t" --system "$sys" --column "$col" --status "$NOT_RUN"; done
        unmount_system "$sys" "$mnt" "$tag"
        return 0
    fi
    local stats_arg=()
    if is_riffle "$sys"; then
        local stats="$RES_DIR/$WL-$res.mount-stats.json"
        say "    mounted in $((SECONDS - t0)) s (--fuse-transport $(transport_of "$sys")); FUSE transport: $(mount_transport "$mnt" "$stats")"
        stats_arg=(--mount-stats "$stats")
    else
        say "    mounted in $((SECONDS - t0)) s"
    fi
    MOUNT_LOST=
    for e in $(reader_epochs); do
        for t in $TABLES; do read_pass "$sys" "$mnt" "$t" "$e" "$RES_DIR/$t-$res-e$e.json" 1; done
        check_mounted "$mnt" "$e" || break
    done
    rss=$(peak_rss_kb "$DAEMON_PID")
    t0=$SECONDS
    unmount_system "$sys" "$mnt" "$tag"
    say "    unmounted in $((SECONDS - t0)) s; daemon peak RSS ${rss:-?} KiB"
    note=$(note_of "$sys")
    for t in $TABLES; do
        e3=(); has_reread && e3=(--epoch3 "$RES_DIR/$t-$res-e3.json")
        record_row --table "$t" --system "$sys" --column "$col" \
            --status "${MOUNT_LOST:-$(status_of "$RES_DIR/$t-$res-e1.json")}" \
            --cold "$RES_DIR/$t-$res-e1.json" --warm "$RES_DIR/$t-$res-e2.json" \
            "${e3[@]}" ${rss:+--rss-kb "$rss"} ${note:+--note "$note"} "${stats_arg[@]}"
    done
}

# Generates (or finds) the dataset of $1 (at scale $2, default $SCALE) into
# $BUCKET / $MANIFEST.
gen_dataset() {
    "$BIN/riffle-bench" gen --workload "$1" --scale "${2:-$SCALE}" --seed "$SEED" \
        --bucket "$BUCKET" --endpoint "$RGW_URL" --manifest "$MANIFEST" 2>>"$LOG_DIR/gen.log"
}

run_workload() {
    WL=$1
    case $WL in
        w4) run_w4; return 0 ;;
        w5) run_w5; return 0 ;;
        w6) run_w6; return 0 ;;
    esac
    TABLES=$(tables_of "$WL")
    case $WL in w1) KEEP_CACHES=1 ;; *) KEEP_CACHES= ;; esac
    BUCKET="riffle-bench-$MODE-$WL"
    MANIFEST="$WORK/manifests/$MODE-$WL.manifest"
    local started=$SECONDS date commit col endpoint sys notes=()
    date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    commit=$(commit_id)
    rm -f "$WORK/run/local-done-$WL" "$WORK/run/local-done-$WL"-r*
    load_reset
    say "== ${WL^^} ($MODE): dataset s3://$BUCKET"
    if ! gen_dataset "$WL"; then
        warn "generating $WL failed (see $LOG_DIR/gen.log); skipping it"
        return 0
    fi
    say "   dataset ready after $((SECONDS - started)) s"
    RIFFLE_MEMORY=$RIFFLE_BASE_MEMORY
    RIFFLE_EXTRA_ARGS=()
    set_limit
    if [ ${#LIMIT[@]} -gt 0 ]; then
        # Keep riffle's memory-cache-to-data ratio of the whole dataset
        # (1 GiB for all its files at scale 1) when an epoch reads a subset.
        local objects
        objects=$(sed -n '2s/.*"objects":\([0-9]*\).*/\1/p' "$MANIFEST")
        RIFFLE_MEMORY="$(( ${RIFFLE_BASE_MEMORY_MB:-1024} * W1_MAX_FILES / ${objects:-20000} ))M"
    fi
    prepare_python_sums
    for col in proxy direct; do
        endpoint=$PROXY_URL
        [ "$col" = direct ] && endpoint=$RGW_URL
        for sys in ${SYSTEMS//,/ }; do
            [ "$col" = direct ] && ! has "$DIRECT" "$sys" && continue
            case $sys in
                # local disk's epochs (read-fs's and the Python reader's) run
                # on copy-first's copy, else on a copy of their own, once.
                local|local-py) runs_in "$sys" && [ "$col" = proxy ] && ! has "$SYSTEMS" copy-first \
                    && [ ! -s "$WORK/run/local-done-$WL" ] && run_copy "$col" "$endpoint" ;;
                copy-first) run_copy "$col" "$endpoint" ;;
                s3-client) run_s3_client "$col" "$endpoint" ;;
                *) runs_in "$sys" && run_fuse "$sys" "$col" "$endpoint" ;;
            esac
        done
    done
    if [ "$WL" = w1 ] && has "$SYSTEMS" riffle; then
        COL=proxy
        run_browse
    fi
    run_goal_rounds
    rm -rf "$WORK/local/$MODE-$WL" "$WORK/local/$MODE-$WL"-r* "$WORK/cache"
    mkdir -p "$WORK/cache"
    [ ${#LIMIT[@]} -gt 0 ] && notes+=(--note "time budget: each W1 epoch reads the same $W1_MAX_FILES of the 20,000 files (whole directories, chosen with the seed; a new shuffled order each epoch), for every system alike; copy-first copies that subset; riffle's --max-memory is scaled by the same fraction ($RIFFLE_MEMORY) so its memory cache holds the same share of the data as 1 GiB does of the whole dataset (the disk cache is unlimited)")
    [ "$MODE" = quick ] && notes+=(--note "quick datasets are small: they fit the peers' caches and (within a pass) the page cache, so this is a smoke test of correctness, not a measurement; riffle runs with --max-memory $RIFFLE_BASE_MEMORY so its warm epochs read the disk cache")
    local debug_note="debug builds of riffle and the reader (--debug): absolute numbers are lower than with release builds"
    if [ "$WL" = w1 ] && has "$SYSTEMS" local-py; then
        debug_note+="; read-fs's unoptimized XXH3 checks cost it several times the CPU of the Python reader (whose zlib CRC-32 is C), so on these 2 cores read-fs is CPU-bound where the Python reader is not, and the Python goals' comparisons with read-fs mean little in this mode"
    fi
    [ "$PROFILE" = debug ] && notes+=(--note "$debug_note")
    [ -n "$(load_note)" ] && notes+=(--note "$(load_note)")
    notes+=(--note "$(fuse_ring_note)")
    case $WL in w3) notes+=(--note "each W3 pass reads for $W3_DURATION; both epochs use the same random offsets, so the warm epoch re-reads what the cold one read first (and then goes further)") ;; esac
    "$BIN/riffle-bench" record meta --run "$RUN_FILE" --workload "$WL" --mode "$MODE" \
        --manifest "$MANIFEST" --commit "$commit" --date "$date" \
        --elapsed-s "$((SECONDS - started))" "${notes[@]}"
    say "== ${WL^^} done in $((SECONDS - started)) s"
}
