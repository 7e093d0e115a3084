# W4 of benches/run.sh (shared/BENCHMARKS.md): listing. 100,000 objects in
# one prefix (flat/) plus 1,000,000 over 1,000 prefixes (tree/pNNNN/), 0-64
# bytes each (scale 1; --quick: 0.01, 11,000 objects). For every file
# system: a fresh mount, then
#   1. the cold walk, `find MNT -type f` counted (riffle-bench walk: what
#      `| wc -l` counts), which must find the manifest's object count;
#   2. the stat of every file, `find MNT -type f -printf '%s %P\n'` (an lstat
#      per file) summed (riffle-bench walk --stat), which must add up to the
#      manifest's bytes;
#   3. the daemon's VmRSS and VmHWM after them (and VmRSS right after
#      mounting: the growth per object is what the walk cost);
#   4. unmount, mount again the same way (riffle: on the same --cache-dir,
#      whose saved listings --metadata-ttl indefinite lets it reuse) and walk
#      and stat again.
# The page cache (dentries and inodes included) is dropped before every
# pass; LISTs and HEADs are counted at the proxy around each pass (and
# riffle's listing counters with `riffle stats`). Each pass stops after
# W4_TIMEOUT seconds: its cell then says "timed out after N s", and a
# system whose cold walk timed out skips the rest. The S3 client's reference
# is riffle-bench list-s3: the whole tree listed with delimiter '/', 64
# listings in flight. The goals' comparisons (the S3 client, riffle, riffle's
# sequential walk) run again in extra rounds (W4_ROUNDS) after every system
# ran once. Sourced by benches/run.sh; uses its globals and lib/workload.sh.

W4_SYSTEMS=(s3-client riffle riffle-seq s3fs rclone mountpoint)

# A field of a walk's or listing's JSON result (riffle-bench walk / list-s3).
w4_field() {
    sed -n "s/.*\"$2\":\([0-9.e+-]*\|true\|false\).*/\1/p" "$1" 2>/dev/null
}

# One line about a walk's or listing's JSON result.
walk_summary() {
    local f=$1 secs objs want timed errs what=files
    [ -s "$f" ] || { echo "no result"; return; }
    secs=$(w4_field "$f" elapsed_s)
    objs=$(w4_field "$f" objects)
    want=$(w4_field "$f" expected_objects)
    timed=$(w4_field "$f" timed_out_s)
    errs=$(w4_field "$f" errors)
    grep -q '"tool":"list-s3"' "$f" && what=keys
    if grep -q '"wrong":true' "$f"; then
        printf 'WRONG: %s %s of %s (%s)' "$objs" "$what" "$want" "$(sed -n 's/.*"\(WRONG [^"]*\)".*/\1/p' "$f")"
    elif [ -n "$timed" ]; then
        printf 'timed out after %.0f s (%s %s of %s)' "$timed" "$objs" "$what" "$want"
    else
        printf '%.2f s, %s %s (right)' "$secs" "$objs" "$what"
    fi
    [ "${errs:-0}" = 0 ] || printf ', %s errors' "$errs"
}

# Whether a pass's result exists and finished (did not time out).
walk_finished() {
    [ -s "$1" ] && [ -z "$(w4_field "$1" timed_out_s)" ]
}

# LIST and HEAD requests in a proxy-stats file, or "?".
lists_of() {
    sed -n 's/.*"list":\([0-9]*\).*/\1/p' "$1" 2>/dev/null | grep . || echo "?"
}
heads_of() {
    sed -n 's/.*"head":\([0-9]*\).*/\1/p' "$1" 2>/dev/null | grep . || echo "?"
}

# w4_pass SYSTEM MNT walk|stat OUT NAME: one timed pass over the mount after
# dropping the page cache, the proxy's counters reset before it and saved
# after it (OUT's .proxy.json), riffle's counters around it.
w4_pass() {
    local sys=$1 mnt=$2 phase=$3 out=$4 name=$5 base=${4%.json} args=() rc=0
    [ "$phase" = stat ] && args+=(--stat)
    rm -f "$out" "$base".{proxy,riffle-before,riffle-after}.json
    drop_caches || true
    is_riffle "$sys" && riffle_stats "$mnt" "$base.riffle-before.json"
    proxy_stats --reset >/dev/null
    # The walk stops itself at W4_TIMEOUT (and says so); timeout(1) is only
    # a backstop for a walk that cannot be stopped.
    timeout -k 10 $((W4_TIMEOUT + 120)) "$BIN/riffle-bench" walk --root "$mnt" \
        --manifest "$MANIFEST" "${args[@]}" --timeout "$W4_TIMEOUT" --json-out "$out" \
        >/dev/null 2>>"$LOG_DIR/walk.log" || rc=$?
    proxy_stats --out "$base.proxy.json" || true
    is_riffle "$sys" && riffle_stats "$mnt" "$base.riffle-after.json"
    note_load
    say "    $name: $(walk_summary "$out"), $(lists_of "$base.proxy.json") LISTs and $(heads_of "$base.proxy.json") HEADs at the proxy$([ $rc = 0 ] || echo " (exit $rc)") [load $(cut -d' ' -f1 /proc/loadavg)]"
    return 0
}

# w4_mounted MNT PASS: 0 while MNT is mounted; else sets MOUNT_LOST.
w4_mounted() {
    mountpoint -q "$1" 2>/dev/null && return 0
    MOUNT_LOST="failed: the mount disappeared during the $2 (its daemon exited, or something else on the machine unmounted it; see logs)"
    warn "$1 is no longer mounted after the $2"
    return 1
}

# The note under a system's W4 row.
w4_note_of() {
    case $1 in
        s3-client) echo "\`riffle-bench list-s3\`: the whole tree listed straight from the store through the proxy, delimiter \`/\`, descending into every common prefix with up to 64 listings in flight, each prefix paged with continuation tokens (1,000 keys a page); no file system" ;;
        riffle) echo "a fresh mount with a fresh --cache-dir, --metadata-ttl indefinite, the default --list-concurrency (16): reading a directory lists its subdirectories in the background, ahead of the walk; the remount is a new daemon on the same --cache-dir, which reuses the listings the first mount kept there" ;;
        riffle-seq) echo "as riffle, with \`--list-concurrency 0\`: it lists only the directory the walk asks for, one at a time, which is how riffle walked before background listing existed (the baseline of the ≥ 3× goal)" ;;
        s3fs) echo "as in the other workloads (use_cache); remounted the same way (its listing and stat caches live in memory only)" ;;
        rclone) echo "\`rclone mount --vfs-cache-mode full\` as in the other workloads; remounted the same way (its directory cache lives in memory only)" ;;
        mountpoint) echo "as in the other workloads (--metadata-ttl indefinite, its local disk cache); remounted the same way, on a new cache directory" ;;
    esac
}

# The S3 client's listing: one pass, no file system.
run_w4_s3_client() {
    local r rc=0 out base
    r=$(round_suffix)
    out="$RES_DIR/w4-s3-client$r-walk.json"
    base=${out%.json}
    say "  S3 client: list-s3, 64 listings in flight"
    rm -f "$out" "$base.proxy.json"
    proxy_stats --reset >/dev/null
    timeout -k 10 $((W4_TIMEOUT + 120)) "$BIN/riffle-bench" list-s3 --manifest "$MANIFEST" \
        --endpoint "$PROXY_URL" --parallel 64 --timeout "$W4_TIMEOUT" --json-out "$out" \
        >/dev/null 2>>"$LOG_DIR/list-s3.log" || rc=$?
    proxy_stats --out "$base.proxy.json" || true
    note_load
    say "    listing: $(walk_summary "$out"), $(lists_of "$base.proxy.json") LISTs at the proxy ($(w4_field "$out" list_requests) sent)$([ $rc = 0 ] || echo " (exit $rc)")"
    local st=ok
    [ -s "$out" ] || st="failed: list-s3 produced no result (crashed; see $LOG_DIR/list-s3.log)"
    record_row --table w4 --system s3-client --column proxy --status "$st" --walk "$out" \
        --note "$(w4_note_of s3-client)"
}

# A file system: mount, cold walk and stat, RSS, remount, walk and stat again.
run_w4_fs() {
    local sys=$1 mnt="$WORK/mnt/$1" r tag res t0 rss_base rss_after rss_peak st files=()
    r=$(round_suffix)
    tag="w4-proxy$r"
    res="$RES_DIR/w4-$sys$r"
    fresh_mountpoint "$mnt"
    say "  $sys"
    NOT_RUN=''
    DAEMON_PID=''
    COL=proxy
    REMOUNT=
    t0=$SECONDS
    if ! mount_system "$sys" "$BUCKET" "$mnt" "$PROXY_URL" "$tag"; then
        say "    $NOT_RUN"
        record_row --table w4 --system "$sys" --column proxy --status "$NOT_RUN"
        unmount_system "$sys" "$mnt" "$tag"
        return 0
    fi
    say "    mounted in $((SECONDS - t0)) s"
    rss_base=$(current_rss_kb "$DAEMON_PID")
    MOUNT_LOST=
    w4_pass "$sys" "$mnt" walk "$res-walk.json" "cold walk"
    files+=(--walk "$res-walk.json")
    if walk_finished "$res-walk.json" && w4_mounted "$mnt" "cold walk"; then
        w4_pass "$sys" "$mnt" stat "$res-stat.json" "stat of every file"
        files+=(--stat "$res-stat.json")
        w4_mounted "$mnt" "stat" || true
    else
        [ -n "$MOUNT_LOST" ] || say "    the cold walk did not finish: no stat, no remount"
    fi
    rss_after=$(current_rss_kb "$DAEMON_PID")
    rss_peak=$(peak_rss_kb "$DAEMON_PID")
    say "    daemon RSS ${rss_after:-?} KiB after the walk and stat (${rss_base:-?} KiB after mounting; peak ${rss_peak:-?} KiB)"
    st=ok
    if [ -z "$MOUNT_LOST" ] && walk_finished "$res-walk.json"; then
        # The cache directory stays (no tag) for the second mount.
        t0=$SECONDS
        unmount_system "$sys" "$mnt"
        REMOUNT=1
        if mount_system "$sys" "$BUCKET" "$mnt" "$PROXY_URL" "$tag"; then
            say "    unmounted and mounted again in $((SECONDS - t0)) s"
            w4_pass "$sys" "$mnt" walk "$res-rwalk.json" "remount walk"
            files+=(--remount-walk "$res-rwalk.json")
            if walk_finished "$res-rwalk.json" && w4_mounted "$mnt" "remount walk"; then
                w4_pass "$sys" "$mnt" stat "$res-rstat.json" "remount stat"
                files+=(--remount-stat "$res-rstat.json")
                w4_mounted "$mnt" "remount stat" || true
            fi
        else
            st="failed: the remount failed (${NOT_RUN#*: })"
            say "    $st"
        fi
        REMOUNT=
    fi
    unmount_system "$sys" "$mnt" "$tag"
    [ -s "$res-walk.json" ] || st="failed: the walk produced no result (crashed; see $LOG_DIR/walk.log)"
    record_row --table w4 --system "$sys" --column proxy --status "${MOUNT_LOST:-$st}" \
        "${files[@]}" ${rss_peak:+--rss-kb "$rss_peak"} ${rss_base:+--rss-base-kb "$rss_base"} \
        ${rss_after:+--rss-after-kb "$rss_after"} --note "$(w4_note_of "$sys")"
}

# Extra rounds (2..W4_ROUNDS) of the goals' comparisons, after every system
# ran once: the S3 client's listing, riffle and riffle's sequential walk,
# one after another (results/goals.rs takes the median over the rounds).
run_w4_rounds() {
    local sys
    [ "$W4_ROUNDS" -gt 1 ] || return 0
    has "$SYSTEMS" riffle || return 0
    for ((ROUND = 2; ROUND <= W4_ROUNDS; ROUND++)); do
        say "  goal round $ROUND of $W4_ROUNDS: the S3 client, riffle, riffle's sequential walk"
        has "$SYSTEMS" s3-client && run_w4_s3_client
        for sys in riffle riffle-seq; do
            has "$SYSTEMS" "$sys" && run_w4_fs "$sys"
        done
    done
    ROUND=1
}

run_w4() {
    WL=w4
    TABLES=w4
    KEEP_CACHES=
    # A scale other than the mode's own gets a bucket of its own: gen only
    # adds objects, so another scale's leftovers would change the counts.
    BUCKET="riffle-bench-$MODE-w4"
    [ "$W4_SCALE" = "$W4_DEFAULT_SCALE" ] || BUCKET="$BUCKET-s$(echo "$W4_SCALE" | tr '.' '-')"
    MANIFEST="$WORK/manifests/$MODE-w4-$W4_SCALE.manifest"
    local started=$SECONDS date commit objects sys notes=()
    date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    commit=$(commit_id)
    load_reset
    say "== W4 ($MODE): dataset s3://$BUCKET (scale $W4_SCALE), each pass stopped after $W4_TIMEOUT s"
    if ! gen_dataset w4 "$W4_SCALE"; then
        warn "generating w4 failed (see $LOG_DIR/gen.log); skipping it"
        return 0
    fi
    objects=$(sed -n '2s/.*"objects":\([0-9]*\).*/\1/p' "$MANIFEST")
    say "   dataset ready after $((SECONDS - started)) s: $objects objects"
    RIFFLE_MEMORY=$RIFFLE_BASE_MEMORY
    RIFFLE_EXTRA_ARGS=()
    for sys in "${W4_SYSTEMS[@]}"; do
        has "$SYSTEMS" "$sys" || continue
        case $sys in
            s3-client) run_w4_s3_client ;;
            *) run_w4_fs "$sys" ;;
        esac
    done
    run_w4_rounds
    rm -rf "$WORK/cache"
    mkdir -p "$WORK/cache"
    notes+=(--note "each system: a fresh mount, the cold walk (\`find MNT -type f\`, counted as \`| wc -l\` counts: it must find the manifest's $objects objects; the dataset marker \`.riffle-bench.json\` is not counted), then the stat of every file (\`find MNT -type f -printf '%s %P\\n'\`, an lstat per file, summed: it must add up to the manifest's bytes), then unmount, mount again the same way and both passes again; the page cache (dentries and inodes included) is dropped before every pass; a wrong count fails the run like wrong bytes")
    notes+=(--note "each pass is stopped after $W4_TIMEOUT s (RIFFLE_BENCH_W4_TIMEOUT); a system whose cold walk timed out skips the stat and the remount. LISTs and HEADs are counted at the proxy (30 ms before every response) over each pass; the mount's own start-up requests are not counted")
    notes+=(--note "daemon RSS: VmRSS after the cold walk and stat (VmHWM in brackets); RSS growth per object = (that VmRSS − VmRSS right after mounting) ÷ the dataset's objects, what holding the listed tree costs the daemon")
    [ "$W4_ROUNDS" -gt 1 ] && notes+=(--note "the S3 client's listing, riffle and riffle's sequential walk ran again in $((W4_ROUNDS - 1)) extra round(s) after every system ran once; the goal lines give the median over the rounds, the table the first round")
    [ "$MODE" = quick ] && notes+=(--note "the quick dataset is small ($objects objects at scale $W4_SCALE): a smoke test of the runner and of the counts, not a measurement")
    [ "$PROFILE" = debug ] && notes+=(--note "debug builds of riffle and the harness (--debug)")
    [ -n "$(load_note)" ] && notes+=(--note "$(load_note)")
    "$BIN/riffle-bench" record meta --run "$RUN_FILE" --workload w4 --mode "$MODE" \
        --manifest "$MANIFEST" --commit "$commit" --date "$date" \
        --elapsed-s "$((SECONDS - started))" "${notes[@]}"
    say "== W4 done in $((SECONDS - started)) s"
}
