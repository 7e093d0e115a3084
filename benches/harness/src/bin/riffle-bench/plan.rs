//! `riffle-bench plan`: the epoch plan of a `read-fs` epoch, the paths
//! (relative to the mount root) in the order that epoch opens them, for
//! `riffle plan MOUNT FILE` or `riffle mount --prefetch-plan FILE`. The order
//! comes from [`riffle_bench::order::epoch_files`], the very function
//! `read-fs` uses, so a plan and its epoch cannot disagree.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use riffle_bench::manifest::Manifest;
use riffle_bench::order::{epoch_files, plan_text, Order};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The dataset's manifest (from `gen`)
    #[arg(long)]
    manifest: PathBuf,
    /// The reader's --seed
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The reader's --epoch
    #[arg(long, default_value_t = 1)]
    epoch: u32,
    /// The reader's --max-files
    #[arg(long)]
    max_files: Option<usize>,
    /// The reader's --order
    #[arg(long, value_enum, default_value = "shuffle")]
    order: Order,
    /// Write the plan here instead of stdout
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print `{"files":N,"bytes":B}` of the epoch instead of the plan
    #[arg(long)]
    summary: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let manifest = Manifest::read(&a.manifest)?;
    let files = epoch_files(&manifest, a.seed, a.epoch, a.max_files, a.order);
    let text = if a.summary {
        let bytes: u64 = files.iter().map(|&i| manifest.entries[i].size).sum();
        format!("{{\"files\":{},\"bytes\":{bytes}}}\n", files.len())
    } else {
        plan_text(&manifest, &files)
    };
    match &a.out {
        Some(p) => std::fs::write(p, text).with_context(|| format!("write {}", p.display()))?,
        None => std::io::stdout().lock().write_all(text.as_bytes())?,
    }
    Ok(())
}
