//! `riffle-bench gen`: plan a dataset, write its manifest, upload it.

use std::path::PathBuf;

use anyhow::Context;

use riffle_bench::dataset::{Plan, Workload};
use riffle_bench::manifest::{normalize_prefix, Manifest};
use riffle_bench::s3::upload::{upload, UploadOptions};
use riffle_bench::s3::{connect, Endpoint};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// sample, w1, w2, w3, w4 or w5
    #[arg(long)]
    workload: Workload,
    /// Shrink the dataset (W1/W4/W5: counts, W2/W3: sizes), in (0, 1]
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    #[arg(long)]
    bucket: String,
    /// Key prefix of the dataset in the bucket
    #[arg(long, default_value = "")]
    prefix: String,
    /// S3 endpoint, e.g. http://127.0.0.1:7480 (required unless --manifest-only)
    #[arg(long, env = "AWS_ENDPOINT_URL")]
    endpoint: Option<String>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Requests in flight at most
    #[arg(long, default_value_t = 64)]
    parallel: usize,
    /// Where to write the manifest [default: ./BUCKET.manifest]
    #[arg(long)]
    manifest: Option<PathBuf>,
    /// Only compute and write the manifest; upload nothing
    #[arg(long)]
    manifest_only: bool,
    /// Leave exactly the dataset under the prefix, as a real dataset would
    /// be: write no marker object (`<prefix>.riffle-bench.json`), delete any
    /// other object under the prefix, and upload every object (without the
    /// marker nothing proves that objects already there hold these bytes).
    /// The manifest, written outside the bucket, is all readers need
    #[arg(long)]
    exact: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let plan = Plan::new(a.workload, a.scale, a.seed)?;
    let prefix = normalize_prefix(&a.prefix);
    let manifest_path = a
        .manifest
        .unwrap_or_else(|| PathBuf::from(format!("{}.manifest", a.bucket)));
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let manifest = Manifest::compute(&plan, &a.bucket, &prefix, threads);
    manifest.write(&manifest_path)?;
    eprintln!(
        "gen {}: {} objects, {:.3} GB; manifest {}",
        plan.workload,
        plan.objects.len(),
        plan.total_bytes() as f64 / 1e9,
        manifest_path.display()
    );
    if a.manifest_only {
        return Ok(());
    }
    let url = a
        .endpoint
        .as_deref()
        .context("--endpoint (or AWS_ENDPOINT_URL) is required to upload")?;
    let endpoint = Endpoint::from_env(url)?;
    let s3 = connect(&endpoint);
    let mut opts = UploadOptions::new(&a.bucket, &prefix, a.parallel);
    opts.exact = a.exact;
    let summary = super::runtime()?.block_on(upload(&s3, &plan, &opts))?;
    println!(
        "gen {} -> s3://{}/{}: {} objects ({:.3} GB), uploaded {} ({:.3} GB), skipped {} already there, deleted {} others, {:.1} s; manifest {}",
        plan.workload,
        a.bucket,
        prefix,
        summary.objects,
        summary.bytes_total as f64 / 1e9,
        summary.uploaded,
        summary.bytes_uploaded as f64 / 1e9,
        summary.skipped,
        summary.deleted,
        summary.elapsed_s,
        manifest_path.display()
    );
    Ok(())
}
