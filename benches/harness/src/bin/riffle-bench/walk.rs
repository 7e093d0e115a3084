//! `riffle-bench walk`: W4's walk of a mount, `find ROOT -type f` counted
//! (what `| wc -l` counts), or with `--stat` every file's size through
//! `find -printf` (an `lstat` per file) summed, checked against the
//! manifest and stopped at `--timeout` (see [`riffle_bench::listing`]).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use riffle_bench::listing::walk;
use riffle_bench::manifest::Manifest;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The directory to walk (a mount of the dataset's bucket and prefix)
    #[arg(long)]
    root: PathBuf,
    /// The dataset's manifest (from `gen`): the count and sizes to expect
    #[arg(long)]
    manifest: PathBuf,
    /// Also stat every file (its size, summed), not only list the names
    #[arg(long)]
    stat: bool,
    /// Stop the walk after this many seconds (its result says it timed out)
    #[arg(long)]
    timeout: Option<f64>,
    /// Also write the JSON result here
    #[arg(long)]
    json_out: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let m = Manifest::read(&a.manifest)?;
    let timeout = a.timeout.map(Duration::from_secs_f64);
    let pass = walk(
        &a.root,
        a.stat,
        timeout,
        m.header.objects as u64,
        m.header.bytes,
    )?;
    super::emit_list(&pass, a.json_out.as_deref())
}
