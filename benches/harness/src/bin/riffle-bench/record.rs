//! `riffle-bench record`: append a meta or row record to a run file
//! (JSON lines), so `benches/run.sh` never assembles JSON itself.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use riffle_bench::listing::ListPass;
use riffle_bench::manifest::Manifest;
use riffle_bench::outcome::Outcome;
use riffle_bench::results::detail::{mount_transport, pass_detail};
use riffle_bench::results::machine::Machine;
use riffle_bench::results::{Column, Listing, Meta, Pass, Record, Row, Step};

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Facts about one workload's run
    Meta(MetaArgs),
    /// One system's results in one table
    Row(Box<RowArgs>),
}

#[derive(Debug, clap::Args)]
pub struct MetaArgs {
    /// The run file to append to
    #[arg(long)]
    run: PathBuf,
    /// w1 ... w5
    #[arg(long)]
    workload: String,
    /// quick or full
    #[arg(long)]
    mode: String,
    /// The dataset's manifest
    #[arg(long)]
    manifest: PathBuf,
    #[arg(long)]
    commit: String,
    /// UTC start time
    #[arg(long)]
    date: String,
    /// Wall time of the workload, seconds
    #[arg(long)]
    elapsed_s: f64,
    #[arg(
        long,
        default_value = "RGW behind riffle-proxy: 30 ms first byte, 100 MB/s per connection"
    )]
    remote: String,
    /// A note shown under the workload's heading (repeatable)
    #[arg(long)]
    note: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct RowArgs {
    #[arg(long)]
    run: PathBuf,
    /// Table id: w1, w2, w3, w3-mmap, w4, w5
    #[arg(long)]
    table: String,
    #[arg(long)]
    system: String,
    #[arg(long, value_enum, default_value = "proxy")]
    column: Column,
    /// ok, "not run: REASON" or "failed: REASON"
    #[arg(long, default_value = "ok")]
    status: String,
    /// JSON result of epoch 1 (with its sidecars X.proxy.json,
    /// X.riffle-before.json, X.riffle-after.json when present)
    #[arg(long)]
    cold: Option<PathBuf>,
    /// JSON result of epoch 2 (sidecars as for --cold)
    #[arg(long)]
    warm: Option<PathBuf>,
    /// JSON result of epoch 3, a re-read (W2); a missing file is recorded
    /// as absent
    #[arg(long)]
    epoch3: Option<PathBuf>,
    /// JSON result of every epoch in order, for workloads of more than two
    /// epochs (W5; repeatable; sidecars as for --cold)
    #[arg(long)]
    pass: Vec<PathBuf>,
    /// JSON result of the copy (copy-first)
    #[arg(long)]
    copy: Option<PathBuf>,
    /// Daemon peak RSS, KiB
    #[arg(long)]
    rss_kb: Option<u64>,
    /// W4: the cold walk's JSON result (`riffle-bench walk`, or the S3
    /// client's `list-s3`), with its sidecars as for --cold
    #[arg(long)]
    walk: Option<PathBuf>,
    /// W4: the stat of every file after the cold walk (`walk --stat`)
    #[arg(long)]
    stat: Option<PathBuf>,
    /// W4: the walk after a remount
    #[arg(long)]
    remount_walk: Option<PathBuf>,
    /// W4: the stat after a remount
    #[arg(long)]
    remount_stat: Option<PathBuf>,
    /// W4: the daemon's VmRSS right after mounting, KiB
    #[arg(long)]
    rss_base_kb: Option<u64>,
    /// W4: the daemon's VmRSS after the cold walk and stat, KiB
    #[arg(long)]
    rss_after_kb: Option<u64>,
    #[arg(long)]
    note: Option<String>,
    /// A riffle mount's `riffle stats --json` taken right after mounting: the row's FUSE
    /// transport (`fuse.transport`); a missing or empty file records none
    #[arg(long)]
    mount_stats: Option<PathBuf>,
    /// An extra round (2, 3, ...) of a goal comparison (the goal lines use
    /// the median over rounds); 1, the default, is the table's own row
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    round: u32,
}

pub fn run(cmd: Command) -> anyhow::Result<()> {
    match cmd {
        Command::Meta(a) => {
            let m = Manifest::read(&a.manifest)?;
            let meta = Meta {
                workload: a.workload,
                mode: a.mode,
                date: a.date,
                commit: a.commit,
                machine: Machine::current(),
                scale: m.header.scale,
                objects: m.header.objects,
                bytes: m.header.bytes,
                remote: a.remote,
                elapsed_s: a.elapsed_s,
                notes: a.note,
            };
            append(&a.run, &Record::Meta(Box::new(meta)))
        }
        Command::Row(a) => {
            let mut passes = Vec::new();
            for p in &a.pass {
                // A pass without a result (the reader crashed) ends the row.
                let Some(outcome) = outcome(Some(p))? else {
                    break;
                };
                passes.push(Pass {
                    outcome,
                    detail: pass_detail(p)?.unwrap_or_default(),
                });
            }
            let detail = |p: Option<&Path>| p.map(pass_detail).transpose().map(Option::flatten);
            let listing = Listing {
                walk: step(a.walk.as_deref())?,
                stat: step(a.stat.as_deref())?,
                remount_walk: step(a.remount_walk.as_deref())?,
                remount_stat: step(a.remount_stat.as_deref())?,
                rss_base_kb: a.rss_base_kb,
                rss_after_kb: a.rss_after_kb,
            };
            let row = Row {
                table: a.table,
                system: a.system,
                column: a.column,
                status: a.status,
                cold: outcome(a.cold.as_deref())?,
                warm: outcome(a.warm.as_deref())?,
                epoch3: outcome(a.epoch3.as_deref())?,
                copy: outcome(a.copy.as_deref())?,
                rss_kb: a.rss_kb,
                note: a.note.filter(|n| !n.is_empty()),
                cold_detail: detail(a.cold.as_deref())?,
                warm_detail: detail(a.warm.as_deref())?,
                passes,
                round: (a.round > 1).then_some(a.round),
                listing: (listing != Listing::default()).then_some(listing),
                transport: a
                    .mount_stats
                    .as_deref()
                    .map(mount_transport)
                    .transpose()?
                    .flatten(),
            };
            append(&a.run, &Record::Row(Box::new(row)))
        }
    }
}

/// A reader's JSON result; a missing or empty file means the pass did not
/// produce one (the reader crashed), which is recorded as absent.
fn outcome(path: Option<&Path>) -> anyhow::Result<Option<Outcome>> {
    path.map_or(Ok(None), json::<Outcome>)
}

/// A W4 pass's JSON result with what it cost (its sidecars); a missing
/// or empty file (the pass did not run, or crashed) is recorded as absent.
fn step(path: Option<&Path>) -> anyhow::Result<Option<Step>> {
    let Some(path) = path else { return Ok(None) };
    let Some(pass) = json::<ListPass>(path)? else {
        return Ok(None);
    };
    Ok(Some(Step {
        pass,
        detail: pass_detail(path)?.unwrap_or_default(),
    }))
}

/// The JSON value in `path`; `None` when the file is missing or empty.
fn json<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<Option<T>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("read {}", path.display())),
    };
    if text.trim().is_empty() {
        return Ok(None);
    }
    Ok(Some(
        serde_json::from_str(text.trim()).with_context(|| format!("parse {}", path.display()))?,
    ))
}

fn append(run: &Path, rec: &Record) -> anyhow::Result<()> {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(run)
        .with_context(|| format!("open {}", run.display()))?;
    writeln!(f, "{}", serde_json::to_string(rec)?)?;
    Ok(())
}
