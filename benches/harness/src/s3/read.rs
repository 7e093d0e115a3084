//! `read-s3`: the "straight from the store with a parallel S3 client"
//! baseline. Whole objects with N requests in flight (in a seeded shuffled
//! order, like a W1 epoch), or every object in ranged parts (W2/W3 style);
//! every byte is verified against the manifest or the regenerated content.

use std::sync::Arc;

use aws_sdk_s3::Client;
use futures_util::stream::{self, StreamExt};

use super::get::{get_streamed, parts};
use crate::content::{Checksum, Content};
use crate::manifest::Manifest;
use crate::order::{epoch_files, Order};
use crate::outcome::{Outcome, Tally};

/// How `read-s3` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReadMode {
    /// Each object with one GET.
    Objects,
    /// Each object in ranged GETs of `part_size`.
    Ranged,
}

#[derive(Debug, Clone)]
pub struct ReadOptions {
    pub bucket: String,
    pub mode: ReadMode,
    pub parallel: usize,
    pub part_size: u64,
    pub seed: u64,
    pub epoch: u32,
    /// Read only N objects (the same N every epoch, see [`crate::order`]).
    pub max_files: Option<usize>,
}

/// Reads the dataset of `manifest` from the store and verifies it.
pub async fn read_store(s3: &Client, manifest: &Manifest, opts: &ReadOptions) -> Outcome {
    let order = epoch_files(
        manifest,
        opts.seed,
        opts.epoch,
        opts.max_files,
        Order::Shuffle,
    );
    let tally = Arc::new(Tally::start(256.min(order.len() as u64)));
    let seed = manifest.header.seed;
    let source = format!("s3://{}/{}", opts.bucket, manifest.header.prefix);
    match opts.mode {
        ReadMode::Objects => {
            stream::iter(order)
                .map(|i| {
                    let e = &manifest.entries[i];
                    let key = manifest.s3_key(e);
                    let tally = Arc::clone(&tally);
                    async move {
                        let mut sum = Checksum::new();
                        let r = get_streamed(s3, &opts.bucket, &key, None, |_, chunk| {
                            sum.update(chunk);
                            tally.add_bytes(chunk.len() as u64);
                            Ok(())
                        })
                        .await;
                        match r {
                            Err(err) => tally.error(format!("{err:#}")),
                            Ok(got) if got != e.size || sum.finish() != e.checksum => tally
                                .mismatch(format!(
                                    "{key}: {got} bytes, checksum {:016x}; expected {} bytes, {:016x}",
                                    sum.finish(),
                                    e.size,
                                    e.checksum
                                )),
                            Ok(_) => {
                                tally.count_read();
                                tally.file_done();
                            }
                        }
                    }
                })
                .buffer_unordered(opts.parallel.max(1))
                .collect::<Vec<()>>()
                .await;
        }
        ReadMode::Ranged => {
            let jobs: Vec<(usize, u64, u64)> = order
                .iter()
                .flat_map(|&i| {
                    parts(manifest.entries[i].size, opts.part_size)
                        .into_iter()
                        .map(move |(off, len)| (i, off, len))
                })
                .collect();
            stream::iter(jobs)
                .map(|(i, off, len)| {
                    let e = &manifest.entries[i];
                    let key = manifest.s3_key(e);
                    let content = Content::new(seed, &e.key);
                    let tally = Arc::clone(&tally);
                    async move {
                        let mut bad = None;
                        let r = get_streamed(s3, &opts.bucket, &key, Some((off, len)), |at, chunk| {
                            if bad.is_none() {
                                bad = content.first_mismatch(at, chunk).map(|j| at + j as u64);
                            }
                            Ok(())
                        })
                        .await;
                        match r {
                            Err(err) => tally.error(format!("{err:#}")),
                            Ok(got) if got != len || bad.is_some() => tally.mismatch(format!(
                                "{key} bytes {off}+{len}: got {got} bytes, first wrong byte at {bad:?}"
                            )),
                            Ok(got) => {
                                tally.add_read(got);
                                if off + len == e.size {
                                    tally.file_done();
                                }
                            }
                        }
                    }
                })
                .buffer_unordered(opts.parallel.max(1))
                .collect::<Vec<()>>()
                .await;
        }
    }
    let pattern = match opts.mode {
        ReadMode::Objects => "objects",
        ReadMode::Ranged => "ranged",
    };
    let mut out = tally.finish("read-s3", pattern, &source);
    out.threads = opts.parallel;
    out.epoch = opts.epoch;
    out.seed = opts.seed;
    out
}
