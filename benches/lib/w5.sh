# W5 of benches/run.sh (shared/BENCHMARKS.md): W1's data read through riffle
# with a disk cache of half the data, 3 epochs in a fresh shuffle each, once
# per eviction policy: --eviction lru and --eviction epoch (no plan), the
# defaults with no plan (`plan` eviction and epoch prefetch: what unchanged
# code gets), and --eviction plan with the epoch's plan handed to `riffle
# plan` before each epoch. The hit ratio of each epoch is counted at the store side: 1 - GETs
# at the proxy / files read (every W1 file is below one 1 MiB block, so a
# file read from the store costs one GET). Sourced by benches/run.sh; uses
# its globals and lib/workload.sh.

W5_POLICIES=(lru epoch default plan)

run_w5() {
    WL=w5
    TABLES=w1
    KEEP_CACHES=1
    BUCKET="riffle-bench-$MODE-w1"
    MANIFEST="$WORK/manifests/$MODE-w1.manifest"
    local started=$SECONDS date commit summary files bytes cache_size policy sys e
    local mnt="$WORK/mnt/riffle-w5" tag="w5-proxy" rss passes notes=()
    date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    commit=$(commit_id)
    load_reset
    say "== W5 ($MODE): W1's dataset s3://$BUCKET, cache limited to half of what an epoch reads"
    if ! gen_dataset w1; then
        warn "generating W1's dataset for W5 failed (see $LOG_DIR/gen.log); skipping W5"
        return 0
    fi
    set_limit
    summary=$("$BIN/riffle-bench" plan --manifest "$MANIFEST" --seed "$SEED" "${LIMIT[@]}" --summary)
    files=$(echo "$summary" | sed -n 's/.*"files":\([0-9]*\).*/\1/p')
    bytes=$(echo "$summary" | sed -n 's/.*"bytes":\([0-9]*\).*/\1/p')
    cache_size=$((bytes / 2))
    say "   each epoch reads $files files, $bytes bytes; --cache-size $cache_size (50%)"
    # The memory cache (half of --max-memory) must not hide the disk cache's
    # misses: 32M, riffle's minimum, keeps 16 MB of blocks in memory.
    RIFFLE_MEMORY=32M
    COL=proxy
    fresh_mountpoint "$mnt"
    for policy in "${W5_POLICIES[@]}"; do
        sys=riffle-$policy
        RIFFLE_EXTRA_ARGS=(--cache-size "$cache_size" --eviction "$policy")
        if [ "$policy" = default ]; then
            sys=riffle
            RIFFLE_EXTRA_ARGS=(--cache-size "$cache_size")
        fi
        say "  riffle ${RIFFLE_EXTRA_ARGS[*]}$([ "$policy" = plan ] && echo ", with an epoch plan each epoch")"
        NOT_RUN=''
        DAEMON_PID=''
        if ! mount_system "$sys" "$BUCKET" "$mnt" "$PROXY_URL" "$tag"; then
            say "    $NOT_RUN"
            record_row --table w5 --system "$sys" --column proxy --status "$NOT_RUN"
            unmount_system "$sys" "$mnt" "$tag"
            continue
        fi
        passes=()
        MOUNT_LOST=
        for e in 1 2 3; do
            read_pass "$sys" "$mnt" w1 "$e" "$RES_DIR/w5-$sys-e$e.json" 1
            passes+=(--pass "$RES_DIR/w5-$sys-e$e.json")
            check_mounted "$mnt" "$e" || break
        done
        rss=$(peak_rss_kb "$DAEMON_PID")
        unmount_system "$sys" "$mnt" "$tag"
        record_row --table w5 --system "$sys" --column proxy \
            --status "${MOUNT_LOST:-$(status_of "$RES_DIR/w5-$sys-e1.json")}" \
            --cold "$RES_DIR/w5-$sys-e1.json" --warm "$RES_DIR/w5-$sys-e2.json" \
            "${passes[@]}" ${rss:+--rss-kb "$rss"}
    done
    RIFFLE_EXTRA_ARGS=()
    rm -rf "$WORK/cache"
    mkdir -p "$WORK/cache"
    notes+=(--note "every policy gets a fresh mount and an empty cache directory; each epoch reads the same $files files ($(awk -v b="$bytes" 'BEGIN {printf "%.0f", b / 1e6}') MB$([ ${#LIMIT[@]} -gt 0 ] && echo ": whole directories of the 20,000, the same subset as W1's, to keep W5 within a few minutes"; true)) in a new seeded shuffle, 8 readers as in W1; --cache-size $cache_size (half those bytes; each cached file also costs its 4 KiB rounding and journal, so a little under half the files fit), --max-memory 32M (riffle's minimum: 16 MB of memory cache, under 5% of the data)")
    notes+=(--note "hit ratio = 1 − GETs counted at the proxy ÷ files read in the epoch (a file is one GET when it is not cached), so prefetched files count as misses too, however early they were fetched; 0.5 is the ceiling with half the data cached under a fresh shuffle")
    notes+=(--note "\`--eviction plan\` runs with \`riffle plan\` before each epoch, so it also prefetches in plan order (its files/s show prefetch, its hit ratio only the cache); \`lru\`, \`epoch\` and the defaults read without a plan; with \`lru\` and \`epoch\` epoch prefetch stays off for a set larger than the cache (their eviction does not protect what is fetched ahead), so those rows are the cache policy alone; the defaults' row adds epoch prefetch (files fetched ahead also count as GETs, so its hit ratio at the store stays near 0.5 while its opens find their files cached)")
    [ "$PROFILE" = debug ] && notes+=(--note "debug builds of riffle and the reader (--debug)")
    [ -n "$(load_note)" ] && notes+=(--note "$(load_note)")
    "$BIN/riffle-bench" record meta --run "$RUN_FILE" --workload w5 --mode "$MODE" \
        --manifest "$MANIFEST" --commit "$commit" --date "$date" \
        --elapsed-s "$((SECONDS - started))" "${notes[@]}"
    say "== W5 done in $((SECONDS - started)) s"
}
