# One workload of benches/run.sh: generate the dataset, run every system
# (with and without the proxy), record the rows. Sourced; uses the globals
# set by run.sh (MODE, SCALE, SYSTEMS, DIRECT, BIN, WORK, RES_DIR, ...).

has() { [[ ",$1," == *",$2,"* ]]; }

# Table ids (and read-fs patterns) of a workload.
tables_of() {
    case $1 in w3) echo "w3 w3-mmap" ;; *) echo "$1" ;; esac
}

# read_pass ROOT TABLE EPOCH OUT: one reader epoch after dropping caches.
read_pass() {
    local root=$1 table=$2 epoch=$3 out=$4 rc=0
    local extra=()
    case $table in
        w3|w3-mmap) extra+=(--duration "$W3_DURATION") ;;
    esac
    extra+=("${LIMIT[@]}")
    drop_caches || true
    rm -f "$out"
    timeout -k 10 "$EPOCH_TIMEOUT" "$BIN/riffle-bench" read-fs --root "$root" \
        --manifest "$MANIFEST" --pattern "$table" --seed "$SEED" --epoch "$epoch" \
        --json-out "$out" "${extra[@]}" >/dev/null 2>>"$LOG_DIR/read-fs.log" || rc=$?
    say "    $table epoch $epoch: $(summary "$out")$([ $rc = 0 ] || echo " (exit $rc)")"
    return 0
}

# LIMIT: "--max-files N" when this workload's epochs read a subset (W1 in
# the full run), else empty.
set_limit() {
    LIMIT=()
    if [ "$WL" = w1 ] && [ -n "$W1_MAX_FILES" ] && [ "$W1_MAX_FILES" != 0 ]; then
        LIMIT=(--max-files "$W1_MAX_FILES")
    fi
}

# Status of a row from its cold result file.
status_of() {
    if [ -s "$1" ]; then echo ok; else echo "failed: the reader produced no result (timed out or crashed; see logs)"; fi
}

record_row() {
    "$BIN/riffle-bench" record row --run "$RUN_FILE" "$@"
}

# local disk and copy-first share the copy: copy (timed), then the local epochs.
run_copy() {
    local col=$1 endpoint=$2 dest="$WORK/local/$MODE-$WL" t
    say "  copy-first ($col): 64 parallel downloads to $dest"
    rm -rf "$dest"
    local copy="$RES_DIR/$WL-copy-$col.json" rc=0
    timeout -k 10 "$EPOCH_TIMEOUT" "$BIN/riffle-bench" copy --manifest "$MANIFEST" \
        --endpoint "$endpoint" --dest "$dest" --parallel 64 --json-out "$copy" \
        --seed "$SEED" "${LIMIT[@]}" >/dev/null 2>>"$LOG_DIR/copy.log" || rc=$?
    say "    copy: $(summary "$copy")$([ $rc = 0 ] || echo " (exit $rc)")"
    if [ ! -s "$WORK/run/local-done-$WL" ]; then
        say "  local disk"
        for e in 1 2; do
            for t in $TABLES; do
                read_pass "$dest" "$t" "$e" "$RES_DIR/$t-local-e$e.json"
            done
        done
        echo ok > "$WORK/run/local-done-$WL"
        if has "$SYSTEMS" local; then
            for t in $TABLES; do
                record_row --table "$t" --system local --column proxy \
                    --status "$(status_of "$RES_DIR/$t-local-e1.json")" \
                    --cold "$RES_DIR/$t-local-e1.json" --warm "$RES_DIR/$t-local-e2.json"
            done
        fi
    fi
    if has "$SYSTEMS" copy-first; then
        for t in $TABLES; do
            local st=ok
            [ -s "$copy" ] || st="failed: the copy produced no result (see logs)"
            [ "$st" = ok ] && st=$(status_of "$RES_DIR/$t-local-e1.json")
            record_row --table "$t" --system copy-first --column "$col" --status "$st" \
                --copy "$copy" --cold "$RES_DIR/$t-local-e1.json" --warm "$RES_DIR/$t-local-e2.json"
        done
    fi
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

# A FUSE system: mount, two epochs of every table, peak RSS, unmount.
run_fuse() {
    local sys=$1 col=$2 endpoint=$3 mnt="$WORK/mnt/$1" tag="$WL-$2" t e rss note=
    mkdir -p "$mnt"
    say "  $sys ($col)"
    NOT_RUN=''
    DAEMON_PID=''
    local t0=$SECONDS
    if ! "mount_$sys" "$BUCKET" "$mnt" "$endpoint" "$tag"; then
        say "    $NOT_RUN"
        for t in $TABLES; do record_row --table "$t" --system "$sys" --column "$col" --status "$NOT_RUN"; done
        unmount_system "$sys" "$mnt"
        return 0
    fi
    say "    mounted in $((SECONDS - t0)) s"
    for e in 1 2; do
        for t in $TABLES; do read_pass "$mnt" "$t" "$e" "$RES_DIR/$t-$sys-$col-e$e.json"; done
    done
    rss=$(peak_rss_kb "$DAEMON_PID")
    t0=$SECONDS
    unmount_system "$sys" "$mnt"
    say "    unmounted in $((SECONDS - t0)) s; daemon peak RSS ${rss:-?} KiB"
    [ "$sys" = riffle ] && note="no disk cache yet (issue 2): only the in-memory block cache (--max-memory $RIFFLE_MEMORY), so a warm epoch refetches whatever did not fit in it"
    for t in $TABLES; do
        record_row --table "$t" --system "$sys" --column "$col" \
            --status "$(status_of "$RES_DIR/$t-$sys-$col-e1.json")" \
            --cold "$RES_DIR/$t-$sys-$col-e1.json" --warm "$RES_DIR/$t-$sys-$col-e2.json" \
            ${rss:+--rss-kb "$rss"} ${note:+--note "$note"}
    done
}

run_workload() {
    WL=$1
    TABLES=$(tables_of "$WL")
    BUCKET="riffle-bench-$MODE-$WL"
    MANIFEST="$WORK/manifests/$MODE-$WL.manifest"
    local started=$SECONDS date commit col endpoint sys notes=()
    date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
    git diff --quiet HEAD -- src benches 2>/dev/null || commit="$commit+dirty"
    rm -f "$WORK/run/local-done-$WL"
    say "== ${WL^^} ($MODE): dataset s3://$BUCKET"
    if ! "$BIN/riffle-bench" gen --workload "$WL" --scale "$SCALE" --seed "$SEED" \
        --bucket "$BUCKET" --endpoint "$RGW_URL" --manifest "$MANIFEST" 2>>"$LOG_DIR/gen.log"; then
        warn "generating $WL failed (see $LOG_DIR/gen.log); skipping it"
        return 0
    fi
    RIFFLE_MEMORY=1G
    set_limit
    if [ ${#LIMIT[@]} -gt 0 ]; then
        # Keep riffle's cache-to-data ratio of the whole dataset (1 GiB for
        # all its files) when an epoch reads a subset.
        local objects
        objects=$(sed -n '2s/.*"objects":\([0-9]*\).*/\1/p' "$MANIFEST")
        RIFFLE_MEMORY="$(( 1024 * W1_MAX_FILES / ${objects:-20000} ))M"
    fi
    for col in proxy direct; do
        endpoint=$PROXY_URL
        [ "$col" = direct ] && endpoint=$RGW_URL
        for sys in ${SYSTEMS//,/ }; do
            [ "$col" = direct ] && ! has "$DIRECT" "$sys" && continue
            case $sys in
                local) [ "$col" = proxy ] && ! has "$SYSTEMS" copy-first && run_copy "$col" "$endpoint" ;;
                copy-first) run_copy "$col" "$endpoint" ;;
                s3-client) run_s3_client "$col" "$endpoint" ;;
                *)
                    # Any FUSE system with a mount_SYSTEM function (lib/systems.sh).
                    if declare -F "mount_$sys" >/dev/null; then
                        run_fuse "$sys" "$col" "$endpoint"
                    else
                        warn "unknown system $sys"
                    fi
                    ;;
            esac
        done
    done
    rm -rf "$WORK/local/$MODE-$WL" "$WORK/cache"
    mkdir -p "$WORK/cache"
    [ ${#LIMIT[@]} -gt 0 ] && notes+=(--note "time budget: each W1 epoch reads the same $W1_MAX_FILES of the 20,000 files (a seeded subset, in a new shuffled order each epoch), for every system alike; copy-first copies that subset; riffle's --max-memory is scaled by the same fraction ($RIFFLE_MEMORY) so its cache holds the same share of the data as 1 GiB does of the whole dataset")
    [ "$MODE" = quick ] && notes+=(--note "quick datasets are small: they fit riffle's 1 GiB memory cache, the peers' caches and (within a pass) the page cache, so this is a smoke test of correctness, not a measurement")
    case $WL in w3) notes+=(--note "each W3 pass reads for $W3_DURATION; both epochs use the same random offsets, so the warm epoch re-reads what the cold one read first (and then goes further)") ;; esac
    "$BIN/riffle-bench" record meta --run "$RUN_FILE" --workload "$WL" --mode "$MODE" \
        --manifest "$MANIFEST" --commit "$commit" --date "$date" \
        --elapsed-s "$((SECONDS - started))" "${notes[@]}"
    say "== ${WL^^} done in $((SECONDS - started)) s"
}
