//! `riffle-bench list-s3`: W4's reference, the dataset's whole prefix tree
//! listed straight from the store with a parallel S3 client (delimiter `/`,
//! descending into the common prefixes with `--parallel` listings in
//! flight, each prefix paged with continuation tokens). The key count must
//! be the manifest's object count (exit 1 otherwise).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use riffle_bench::manifest::Manifest;
use riffle_bench::s3::list::list_store;
use riffle_bench::s3::{connect, Endpoint};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The dataset's manifest (from `gen`)
    #[arg(long)]
    manifest: PathBuf,
    /// S3 endpoint (RGW, or the proxy in front of it)
    #[arg(long, env = "AWS_ENDPOINT_URL")]
    endpoint: String,
    /// Bucket [default: the manifest's]
    #[arg(long)]
    bucket: Option<String>,
    /// LIST requests in flight
    #[arg(long, default_value_t = 64)]
    parallel: usize,
    /// Stop after this many seconds (its result says it timed out)
    #[arg(long)]
    timeout: Option<f64>,
    /// Also write the JSON result here
    #[arg(long)]
    json_out: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let manifest = Manifest::read(&a.manifest)?;
    let s3 = connect(&Endpoint::from_env(&a.endpoint)?);
    let bucket = a.bucket.unwrap_or_else(|| manifest.header.bucket.clone());
    let timeout = a.timeout.map(Duration::from_secs_f64);
    let pass = super::runtime()?.block_on(list_store(
        &s3,
        &manifest,
        &bucket,
        a.parallel.max(1),
        timeout,
    ));
    super::emit_list(&pass, a.json_out.as_deref())
}
