//! `riffle-bench read-s3`: the straight-from-the-store baseline.

use std::path::PathBuf;
use std::process::ExitCode;

use riffle_bench::manifest::Manifest;
use riffle_bench::s3::read::{read_store, ReadMode, ReadOptions};
use riffle_bench::s3::{connect, Endpoint};
use riffle_bench::units::parse_size;

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
    /// objects: one GET per object; ranged: every object in ranged parts
    #[arg(long, value_enum, default_value = "objects")]
    mode: ReadMode,
    /// Requests in flight
    #[arg(long, default_value_t = 64)]
    parallel: usize,
    /// Part size of ranged reads
    #[arg(long, default_value = "8M", value_parser = parse_size)]
    part_size: u64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, default_value_t = 1)]
    epoch: u32,
    /// Read only N objects, the same N every epoch in a new order
    #[arg(long)]
    max_files: Option<usize>,
    /// Also write the JSON result here
    #[arg(long)]
    json_out: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let manifest = Manifest::read(&a.manifest)?;
    let s3 = connect(&Endpoint::from_env(&a.endpoint)?);
    let opts = ReadOptions {
        bucket: a.bucket.unwrap_or_else(|| manifest.header.bucket.clone()),
        mode: a.mode,
        parallel: a.parallel,
        part_size: a.part_size,
        seed: a.seed,
        epoch: a.epoch,
        max_files: a.max_files,
    };
    let outcome = super::runtime()?.block_on(read_store(&s3, &manifest, &opts));
    super::emit(&outcome, a.json_out.as_deref())
}
