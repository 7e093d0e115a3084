//! `riffle-bench copy`: the copy-first download.

use std::path::PathBuf;
use std::process::ExitCode;

use riffle_bench::manifest::Manifest;
use riffle_bench::s3::copy::{copy_dataset, CopyOptions};
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
    /// Local directory to copy into (created; existing files are overwritten)
    #[arg(long)]
    dest: PathBuf,
    /// Downloads in flight
    #[arg(long, default_value_t = 64)]
    parallel: usize,
    /// Objects larger than this are fetched in ranged parts of this size
    #[arg(long, default_value = "8M", value_parser = parse_size)]
    part_size: u64,
    /// Copy only the N files `read-fs --max-files N --seed S` reads
    #[arg(long)]
    max_files: Option<usize>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Also write the JSON result here
    #[arg(long)]
    json_out: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let manifest = Manifest::read(&a.manifest)?;
    let s3 = connect(&Endpoint::from_env(&a.endpoint)?);
    let opts = CopyOptions {
        bucket: a.bucket.unwrap_or_else(|| manifest.header.bucket.clone()),
        dest: a.dest,
        parallel: a.parallel,
        part_size: a.part_size,
        max_files: a.max_files,
        seed: a.seed,
    };
    let outcome = super::runtime()?.block_on(copy_dataset(&s3, &manifest, &opts))?;
    super::emit(&outcome, a.json_out.as_deref())
}
