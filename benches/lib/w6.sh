# W6 of benches/run.sh: three nodes reading one dataset as a data-parallel job,
# with and without peers (issue 38). The workload itself is benches/w6.sh (also
# run on its own); this runs it with run.sh's mode and build, and fails the run
# on a failed read (wrong bytes, I/O errors) or a failed W6. Its table goes to
# benches/results/w6-MODE.md and into benches/README.md (riffle-bench report).
# Sourced by benches/run.sh; uses its globals.

run_w6() {
    local started=$SECONDS flags=("--$MODE" --rounds "$W6_ROUNDS") rc=0 failed
    [ "$PROFILE" = release ] && flags+=(--release)
    say "== W6 ($MODE): three nodes, DistributedSampler shares, with and without peers (benches/w6.sh ${flags[*]})"
    set +e
    RIFFLE_BENCH_WORK=$WORK RIFFLE_BENCH_SEED=$SEED bash "$ROOT/benches/w6.sh" "${flags[@]}" 2>&1 \
        | tee "$LOG_DIR/w6.log"
    rc=${PIPESTATUS[0]}
    set -e
    failed=$(awk -F'\t' '{s += $10} END {print s + 0}' "$WORK/w6/rows.tsv" 2>/dev/null || echo 0)
    if [ "$rc" != 0 ]; then
        warn "W6 failed (exit $rc; see $LOG_DIR/w6.log)"
        W6_FAILED="benches/w6.sh exited $rc"
    elif [ "${failed:-0}" != 0 ]; then
        warn "W6: $failed failed reads (see $LOG_DIR/w6.log)"
        W6_FAILED="$failed failed reads"
    fi
    say "   W6 done in $((SECONDS - started)) s"
}
