//! `riffle-bench report`: merge a run into the per-mode store, print its
//! tables and their goal lines, write the plot data and
//! `benches/README.md`, and with `--check` fail when any system of the run
//! returned wrong bytes (W4: counted the files wrong).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use riffle_bench::outcome::Outcome;
use riffle_bench::results::goals::goals;
use riffle_bench::results::render::{insert_w6, plot_tables, readme, table, MODES};
use riffle_bench::results::store::{load, merge, read_run};
use riffle_bench::results::{tables_of, Row};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A run file (from `record`) to merge in first
    #[arg(long)]
    run: Option<PathBuf>,
    /// The store of results per mode
    #[arg(long, default_value = "benches/results")]
    results_dir: PathBuf,
    /// The README to write
    #[arg(long, default_value = "benches/README.md")]
    readme: PathBuf,
    /// Directory of the plots (PNG), linked from the README when present
    #[arg(long, default_value = "benches/plots")]
    plots_dir: PathBuf,
    /// Write the plot data (JSON) here
    #[arg(long)]
    plot_data: Option<PathBuf>,
    /// Exit 1 when any system in the run read wrong bytes
    #[arg(long)]
    check: bool,
    /// Exit 1 also when a row of this system (or of its variants,
    /// SYSTEM-*) in the run did not run, or hit I/O errors (repeatable)
    #[arg(long)]
    require: Vec<String>,
}

/// Why a required row failed, if it did.
fn required_failure(r: &Row) -> Option<String> {
    if !r.ok() {
        return Some(r.status.clone());
    }
    let mut passes: Vec<&Outcome> = [&r.cold, &r.warm, &r.epoch3, &r.copy]
        .into_iter()
        .flatten()
        .collect();
    passes.extend(r.passes.iter().map(|p| &p.outcome));
    // W4: every pass must finish without errors.
    let steps: Vec<_> = r.listing.iter().flat_map(|l| l.steps()).collect();
    for (name, s) in &steps {
        if let Some(t) = s.pass.timed_out_s {
            return Some(format!("the {name} timed out after {t:.0} s"));
        }
    }
    if passes.is_empty() && steps.is_empty() {
        return Some("no result".into());
    }
    let errors: u64 = passes.iter().map(|o| o.errors).sum::<u64>()
        + steps.iter().map(|(_, s)| s.pass.errors).sum::<u64>();
    (errors > 0).then(|| format!("{errors} I/O errors"))
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let mut wrong = Vec::new();
    let mut failed = Vec::new();
    if let Some(run) = &a.run {
        let (mode, results) = read_run(run)?;
        merge(&a.results_dir, &mode, &results)?;
        for w in results.workloads.values() {
            for t in tables_of(&w.meta.workload) {
                if w.rows.iter().any(|r| r.table == t) {
                    println!("\n{} ({mode})\n\n{}", t.to_uppercase(), table(&t, &w.rows));
                    let lines = goals(&t, &w.rows, &w.rounds);
                    if !lines.is_empty() {
                        println!("Goals, this run:\n");
                        for g in lines {
                            println!("- {g}");
                        }
                    }
                }
            }
            // Extra rounds of the goal comparisons must read right too.
            for r in w.rows.iter().chain(&w.rounds) {
                let required = a
                    .require
                    .iter()
                    .any(|s| r.system == *s || r.system.starts_with(&format!("{s}-")));
                if required {
                    if let Some(why) = required_failure(r) {
                        failed.push(format!("{} {} ({:?}): {why}", r.table, r.system, r.column));
                    }
                }
                if r.mismatches() > 0 {
                    wrong.push(format!(
                        "{} {} ({:?}): {} wrong reads",
                        r.table,
                        r.system,
                        r.column,
                        r.mismatches()
                    ));
                }
            }
        }
    }
    let mut modes = Vec::new();
    for (mode, _) in MODES {
        modes.push((mode.to_string(), load(&a.results_dir, mode)?));
    }
    if let Some(p) = &a.plot_data {
        let data: Vec<_> = modes.iter().flat_map(|(m, r)| plot_tables(m, r)).collect();
        std::fs::write(p, serde_json::to_string_pretty(&data)?)
            .with_context(|| format!("write {}", p.display()))?;
    }
    let readme_dir = a.readme.parent().map(PathBuf::from).unwrap_or_default();
    let plot = |mode: &str, t: &str| {
        let file = a.plots_dir.join(format!("{mode}-{t}.png"));
        file.is_file().then(|| {
            file.strip_prefix(&readme_dir)
                .unwrap_or(&file)
                .display()
                .to_string()
        })
    };
    let mut text = readme(&modes, &plot);
    // W6's tables (benches/w6.sh, also run by benches/run.sh), kept across reports.
    for (mode, _) in MODES {
        if let Ok(w6) = std::fs::read_to_string(a.results_dir.join(format!("w6-{mode}.md"))) {
            insert_w6(&mut text, mode, &w6);
        }
    }
    // The sections of workloads that scripts of their own run, kept across reports: the
    // memory bound (benches/memory.sh) and W7 (benches/small_files.sh), in that order.
    for kept in ["memory.md", "small-files.md"] {
        if let Ok(section) = std::fs::read_to_string(a.results_dir.join(kept)) {
            let at = text.find("## Not in every run").unwrap_or(text.len());
            text.insert_str(at, &format!("{}\n\n", section.trim_end()));
        }
    }
    std::fs::write(&a.readme, text).with_context(|| format!("write {}", a.readme.display()))?;
    eprintln!("wrote {}", a.readme.display());
    if a.check && !wrong.is_empty() {
        for w in &wrong {
            eprintln!("WRONG BYTES: {w}");
        }
        return Ok(ExitCode::from(1));
    }
    if !failed.is_empty() {
        for f in &failed {
            eprintln!("FAILED: {f}");
        }
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
