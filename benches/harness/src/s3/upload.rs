//! Uploading a generated dataset with bounded concurrency.
//!
//! Objects already present with the right size are skipped, but only when
//! the dataset marker (`<prefix>.riffle-bench.json`, written before the
//! first upload) says the bucket holds the same workload, scale and seed:
//! same sizes with other bytes would otherwise pass unnoticed. With
//! [`UploadOptions::exact`] the prefix is made to hold the dataset and
//! nothing else, as a real dataset would (the quickstart mounts it): no
//! marker is written, any other object under the prefix (an earlier marker
//! included) is deleted, and every object is uploaded, since without a marker
//! nothing proves that an object already there holds these bytes. Objects above
//! the multipart threshold go up in parts, generated on the fly, with a cap
//! on parts in flight so memory stays bounded.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use aws_sdk_s3::Client;
use futures_util::stream::{self, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

use super::client::{ensure_bucket, error_text, list_sizes};
use crate::content::Content;
use crate::dataset::{ObjectSpec, Plan, Workload};
use crate::progress::Progress;

/// How to upload.
#[derive(Debug, Clone)]
pub struct UploadOptions {
    pub bucket: String,
    /// Normalized prefix ("" or ending in '/').
    pub prefix: String,
    /// Requests in flight at most.
    pub parallel: usize,
    /// Objects larger than this go up in multipart uploads.
    pub multipart_threshold: u64,
    pub part_size: u64,
    /// Multipart parts in flight at most (each holds `part_size` bytes).
    pub max_parts_in_flight: usize,
    /// Leave exactly the dataset under the prefix: no marker, other objects
    /// deleted, everything uploaded (see the module doc).
    pub exact: bool,
}

impl UploadOptions {
    pub fn new(bucket: &str, prefix: &str, parallel: usize) -> Self {
        Self {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
            parallel: parallel.max(1),
            multipart_threshold: 32 << 20,
            part_size: 16 << 20,
            max_parts_in_flight: 16,
            exact: false,
        }
    }
}

/// What an upload did.
#[derive(Debug, Clone, Serialize)]
pub struct UploadSummary {
    pub objects: usize,
    pub uploaded: usize,
    pub skipped: usize,
    /// Objects under the prefix that were not part of the dataset, deleted
    /// (only with [`UploadOptions::exact`]).
    pub deleted: usize,
    pub bytes_total: u64,
    pub bytes_uploaded: u64,
    pub elapsed_s: f64,
}

/// The marker that says which dataset a prefix holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Marker {
    workload: Workload,
    scale: f64,
    seed: u64,
}

/// The name of the dataset marker object, right under the dataset's prefix.
/// It is the harness's bookkeeping, not part of the dataset: W4's walks and
/// listings leave it out of their counts ([`crate::listing`]).
pub const MARKER_NAME: &str = ".riffle-bench.json";

fn marker_key(prefix: &str) -> String {
    format!("{prefix}{MARKER_NAME}")
}

/// Uploads every object of `plan` that is not already there.
pub async fn upload(
    s3: &Client,
    plan: &Plan,
    opts: &UploadOptions,
) -> anyhow::Result<UploadSummary> {
    ensure_bucket(s3, &opts.bucket).await?;
    let marker = Marker {
        workload: plan.workload,
        scale: plan.scale,
        seed: plan.seed,
    };
    let mut deleted = 0;
    let existing = if opts.exact {
        deleted = delete_others(s3, plan, opts).await?;
        Default::default()
    } else if read_marker(s3, opts).await.as_ref() == Some(&marker) {
        list_sizes(s3, &opts.bucket, &opts.prefix).await?
    } else {
        write_marker(s3, opts, &marker).await?;
        Default::default()
    };
    let todo: Vec<&ObjectSpec> = plan
        .objects
        .iter()
        .filter(|o| existing.get(&format!("{}{}", opts.prefix, o.key)) != Some(&o.size))
        .collect();
    let todo_bytes: u64 = todo.iter().map(|o| o.size).sum();
    let label = format!(
        "gen {} -> s3://{}/{}",
        plan.workload, opts.bucket, opts.prefix
    );
    let progress = Progress::start(
        &label,
        todo.len() as u64,
        todo_bytes,
        Duration::from_secs(2),
    );
    let parts = Arc::new(Semaphore::new(opts.max_parts_in_flight.max(1)));
    let mut results = stream::iter(todo.iter().copied())
        .map(|o| {
            let parts = Arc::clone(&parts);
            let progress = Arc::clone(&progress);
            async move {
                let key = format!("{}{}", opts.prefix, o.key);
                let content = Content::new(plan.seed, &o.key);
                let r = if o.size > opts.multipart_threshold {
                    put_multipart(s3, opts, &key, content, o.size, &parts, &progress).await
                } else {
                    put_whole(s3, opts, &key, content, o.size).await
                };
                progress.add(
                    1,
                    if o.size > opts.multipart_threshold {
                        0
                    } else {
                        o.size
                    },
                );
                r.with_context(|| format!("upload s3://{}/{key}", opts.bucket))
            }
        })
        .buffer_unordered(opts.parallel);
    let mut first_err = None;
    while let Some(r) = results.next().await {
        if let Err(e) = r {
            first_err.get_or_insert(e);
        }
    }
    progress.finish();
    if let Some(e) = first_err {
        return Err(e);
    }
    Ok(UploadSummary {
        objects: plan.objects.len(),
        uploaded: todo.len(),
        skipped: plan.objects.len() - todo.len(),
        deleted,
        bytes_total: plan.total_bytes(),
        bytes_uploaded: todo_bytes,
        elapsed_s: progress.elapsed().as_secs_f64(),
    })
}

/// Deletes every object under the prefix that is not part of `plan`;
/// returns how many.
async fn delete_others(s3: &Client, plan: &Plan, opts: &UploadOptions) -> anyhow::Result<usize> {
    let wanted: HashSet<String> = plan
        .objects
        .iter()
        .map(|o| format!("{}{}", opts.prefix, o.key))
        .collect();
    let others: Vec<String> = list_sizes(s3, &opts.bucket, &opts.prefix)
        .await?
        .into_keys()
        .filter(|k| !wanted.contains(k))
        .collect();
    // One DeleteObject per key: Ceph 16 wants Content-MD5 on DeleteObjects,
    // and an exact upload rarely has more than a few keys to remove.
    let mut results = stream::iter(others.iter())
        .map(|key| async move {
            s3.delete_object()
                .bucket(&opts.bucket)
                .key(key)
                .send()
                .await
                .map_err(|e| anyhow!("delete s3://{}/{key}: {}", opts.bucket, error_text(&e)))
        })
        .buffer_unordered(opts.parallel);
    while let Some(r) = results.next().await {
        r?;
    }
    Ok(others.len())
}

async fn read_marker(s3: &Client, opts: &UploadOptions) -> Option<Marker> {
    let out = s3
        .get_object()
        .bucket(&opts.bucket)
        .key(marker_key(&opts.prefix))
        .send()
        .await
        .ok()?;
    let body = out.body.collect().await.ok()?.into_bytes();
    serde_json::from_slice(&body).ok()
}

async fn write_marker(s3: &Client, opts: &UploadOptions, marker: &Marker) -> anyhow::Result<()> {
    let body = serde_json::to_vec(marker)?;
    s3.put_object()
        .bucket(&opts.bucket)
        .key(marker_key(&opts.prefix))
        .body(ByteStream::from(body))
        .send()
        .await
        .map_err(|e| anyhow!("write dataset marker: {}", error_text(&e)))?;
    Ok(())
}

async fn put_whole(
    s3: &Client,
    opts: &UploadOptions,
    key: &str,
    content: Content,
    size: u64,
) -> anyhow::Result<()> {
    let body = content.bytes(0, size as usize);
    s3.put_object()
        .bucket(&opts.bucket)
        .key(key)
        .body(ByteStream::from(body))
        .send()
        .await
        .map_err(|e| anyhow!("{}", error_text(&e)))?;
    Ok(())
}

async fn put_multipart(
    s3: &Client,
    opts: &UploadOptions,
    key: &str,
    content: Content,
    size: u64,
    parts: &Semaphore,
    progress: &Progress,
) -> anyhow::Result<()> {
    let created = s3
        .create_multipart_upload()
        .bucket(&opts.bucket)
        .key(key)
        .send()
        .await
        .map_err(|e| anyhow!("create multipart upload: {}", error_text(&e)))?;
    let upload_id = created
        .upload_id()
        .context("create multipart upload: no upload id")?
        .to_string();
    let count = size.div_ceil(opts.part_size);
    let uploaded = stream::iter(0..count)
        .map(|i| {
            let upload_id = &upload_id;
            async move {
                let _permit = parts.acquire().await.map_err(|e| anyhow!("{e}"))?;
                let off = i * opts.part_size;
                let len = opts.part_size.min(size - off);
                let body = content.bytes(off, len as usize);
                let number = i as i32 + 1;
                let out = s3
                    .upload_part()
                    .bucket(&opts.bucket)
                    .key(key)
                    .upload_id(upload_id)
                    .part_number(number)
                    .body(ByteStream::from(body))
                    .send()
                    .await
                    .map_err(|e| anyhow!("upload part {number}: {}", error_text(&e)))?;
                progress.add_bytes(len);
                Ok::<_, anyhow::Error>(
                    CompletedPart::builder()
                        .part_number(number)
                        .set_e_tag(out.e_tag().map(str::to_string))
                        .build(),
                )
            }
        })
        .buffer_unordered(opts.max_parts_in_flight.max(1))
        .collect::<Vec<_>>()
        .await;
    let mut done = Vec::with_capacity(uploaded.len());
    for r in uploaded {
        match r {
            Ok(p) => done.push(p),
            Err(e) => {
                let _ = s3
                    .abort_multipart_upload()
                    .bucket(&opts.bucket)
                    .key(key)
                    .upload_id(&upload_id)
                    .send()
                    .await;
                return Err(e);
            }
        }
    }
    done.sort_by_key(|p| p.part_number());
    s3.complete_multipart_upload()
        .bucket(&opts.bucket)
        .key(key)
        .upload_id(&upload_id)
        .multipart_upload(
            CompletedMultipartUpload::builder()
                .set_parts(Some(done))
                .build(),
        )
        .send()
        .await
        .map_err(|e| anyhow!("complete multipart upload: {}", error_text(&e)))?;
    Ok(())
}
