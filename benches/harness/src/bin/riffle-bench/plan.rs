//! `riffle-bench plan`: the epoch plan of a `read-fs` epoch, the paths
//! (relative to the mount root) in the order that epoch opens them, for
//! `riffle plan MOUNT FILE` or `riffle mount --prefetch-plan FILE`. The order
//! comes from [`riffle_bench::order::epoch_files`], the very function
//! `read-fs` uses, so a plan and its epoch cannot disagree.
//!
//! With `--crc32`, each line also gives the file's size and CRC-32 (zlib's,
//! regenerated from the dataset's content function):
//! `PATH<TAB>SIZE<TAB>CRC32` (8 hex digits), what `benches/python_reader.py`
//! reads and verifies with the standard library alone.

use std::fmt::Write as _;
use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use riffle_bench::content::Content;
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
    #[arg(long, conflicts_with = "crc32")]
    summary: bool,
    /// Print `PATH<TAB>SIZE<TAB>CRC32` lines (zlib's CRC-32 of each file's
    /// bytes, 8 hex digits), for benches/python_reader.py
    #[arg(long)]
    crc32: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let manifest = Manifest::read(&a.manifest)?;
    let files = epoch_files(&manifest, a.seed, a.epoch, a.max_files, a.order);
    let text = if a.summary {
        let bytes: u64 = files.iter().map(|&i| manifest.entries[i].size).sum();
        format!("{{\"files\":{},\"bytes\":{bytes}}}\n", files.len())
    } else if a.crc32 {
        crc32_text(&manifest, &files)
    } else {
        plan_text(&manifest, &files)
    };
    match &a.out {
        Some(p) => std::fs::write(p, text).with_context(|| format!("write {}", p.display()))?,
        None => std::io::stdout().lock().write_all(text.as_bytes())?,
    }
    Ok(())
}

/// `PATH<TAB>SIZE<TAB>CRC32` for `files` in order, the CRCs computed from
/// the regenerated content on every core.
fn crc32_text(manifest: &Manifest, files: &[usize]) -> String {
    let seed = manifest.header.seed;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut sums = vec![0u32; files.len()];
    let per = files.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (idx, out) in files.chunks(per).zip(sums.chunks_mut(per)) {
            s.spawn(move || {
                for (&i, sum) in idx.iter().zip(out.iter_mut()) {
                    let e = &manifest.entries[i];
                    *sum = Content::new(seed, &e.key).crc32(e.size);
                }
            });
        }
    });
    let mut text = String::with_capacity(files.len() * 48);
    for (&i, sum) in files.iter().zip(&sums) {
        let e = &manifest.entries[i];
        let _ = writeln!(text, "{}\t{}\t{sum:08x}", e.key, e.size);
    }
    text
}
