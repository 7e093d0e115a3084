//! `riffle-bench read-fs`: the reader used for every system.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use riffle_bench::manifest::Manifest;
use riffle_bench::order::Order;
use riffle_bench::reader::{read_fs, Pattern, ReadFsOptions};
use riffle_bench::units::parse_duration;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Directory holding the dataset (a mount, or a local copy)
    #[arg(long)]
    root: PathBuf,
    /// The dataset's manifest (from `gen`)
    #[arg(long)]
    manifest: PathBuf,
    #[arg(long, value_enum)]
    pattern: Pattern,
    /// Reader threads [default: 8 for w1, 4 for w2, 16 for w3]
    #[arg(long)]
    threads: Option<usize>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, default_value_t = 1)]
    epoch: u32,
    /// W3: how long to read
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    duration: Duration,
    /// W1/W2: read only N files (whole directories), the same N every epoch
    #[arg(long)]
    max_files: Option<usize>,
    /// W1/W2: read only the first N files of the epoch's order (with the
    /// shuffle: N files at random from the whole dataset, like a person
    /// browsing it)
    #[arg(long)]
    sample: Option<usize>,
    /// W1/W2: the order files are opened in: a shuffle seeded with
    /// seed + epoch, or sorted by path (listing order). `riffle-bench plan`
    /// prints the same order
    #[arg(long, value_enum, default_value = "shuffle")]
    order: Order,
    /// The file system's daemon: its CPU over the pass (utime + stime, all
    /// threads) is reported beside the machine's
    #[arg(long)]
    daemon_pid: Option<u32>,
    /// Also write the JSON result here
    #[arg(long)]
    json_out: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let manifest = Manifest::read(&a.manifest)?;
    let mut opts = ReadFsOptions::new(a.root, a.pattern);
    opts.threads = a.threads.unwrap_or_else(|| a.pattern.default_threads());
    opts.seed = a.seed;
    opts.epoch = a.epoch;
    opts.duration = a.duration;
    opts.max_files = a.max_files;
    opts.sample = a.sample;
    opts.order = a.order;
    opts.daemon_pid = a.daemon_pid;
    let outcome = read_fs(&manifest, &opts)?;
    super::emit(&outcome, a.json_out.as_deref())
}
