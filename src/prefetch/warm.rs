//! Warm: `riffle warm MOUNT [PATH...]` and `--warm` fetch whole subtrees into the cache.
//!
//! A warm job first lists what it was given (directories recursively, in listing order) to
//! learn the files and total bytes, then fetches the files whole, in that order, with
//! warm priority (behind demand reads and the prefetch plan; see `fetch::Priority`), many
//! at a time. It stops cleanly when the next file would take it past the room the cache has
//! (the NVMe cache's free budget, or the in-memory cache without one), with a message saying
//! how far it got; it can be cancelled at any time without disturbing the mount. Progress
//! (files, bytes, rate) is read by the `riffle warm` command through the control socket.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use parking_lot::Mutex;
use serde::Serialize;

use super::Prefetcher;
use crate::fetch::{ObjectVersion, Priority};
use crate::namespace::Kind;

/// Files a warm job fetches at once (the warm limiter caps GETs further).
const PARALLEL_FILES: usize = 32;

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Listing,
    Fetching,
    Done,
    /// Stopped at the cache budget.
    Stopped,
    Cancelled,
    Failed,
}

/// What `warm-status` reports.
#[derive(Debug, Clone, Serialize)]
pub struct Progress {
    pub id: u64,
    pub phase: Phase,
    pub files_total: u64,
    pub bytes_total: u64,
    pub files_done: u64,
    pub bytes_done: u64,
    pub errors: u64,
    pub elapsed_seconds: f64,
    pub message: Option<String>,
}

/// One warm job.
pub struct WarmJob {
    pub id: u64,
    started: Instant,
    state: Mutex<(Phase, Option<String>)>,
    files_total: AtomicU64,
    bytes_total: AtomicU64,
    files_done: AtomicU64,
    bytes_done: AtomicU64,
    errors: AtomicU64,
    cancelled: AtomicBool,
}

impl WarmJob {
    pub fn new(id: u64) -> Arc<Self> {
        Arc::new(WarmJob {
            id,
            started: Instant::now(),
            state: Mutex::new((Phase::Listing, None)),
            files_total: AtomicU64::new(0),
            bytes_total: AtomicU64::new(0),
            files_done: AtomicU64::new(0),
            bytes_done: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            cancelled: AtomicBool::new(false),
        })
    }

    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }

    fn finish(&self, phase: Phase, message: Option<String>) {
        *self.state.lock() = (phase, message);
    }

    pub fn progress(&self) -> Progress {
        let (phase, message) = self.state.lock().clone();
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Progress {
            id: self.id,
            phase,
            files_total: load(&self.files_total),
            bytes_total: load(&self.bytes_total),
            files_done: load(&self.files_done),
            bytes_done: load(&self.bytes_done),
            errors: load(&self.errors),
            elapsed_seconds: self.started.elapsed().as_secs_f64(),
            message,
        }
    }

    fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed)
    }
}

/// Runs `job` over `paths` (relative to the mount root; empty = everything).
pub async fn run(prefetcher: Arc<Prefetcher>, job: Arc<WarmJob>, paths: Vec<String>) {
    let files = match list(&prefetcher, &job, paths).await {
        Ok(files) => files,
        Err(message) => return job.finish(Phase::Failed, Some(message)),
    };
    if job.is_cancelled() {
        return job.finish(Phase::Cancelled, None);
    }
    let room = prefetcher.room_for_warm();
    let total: u64 = files.iter().map(|f| f.size).sum();
    let mut take = 0u64;
    let count = files
        .iter()
        .take_while(|f| {
            take += f.size;
            take <= room
        })
        .count();
    let stopping = count < files.len();
    *job.state.lock() = (Phase::Fetching, None);
    let fetcher = prefetcher.fetcher.clone();
    let bs = fetcher.config().block_size;
    let job_ref = &job;
    futures::stream::iter(files.into_iter().take(count))
        .map(|obj| {
            let fetcher = fetcher.clone();
            async move {
                if job_ref.is_cancelled() {
                    return;
                }
                let blocks = 0..obj.size.div_ceil(bs);
                match fetcher.fetch_background(&obj, blocks, Priority::Warm).await {
                    Ok(()) => {
                        job_ref.files_done.fetch_add(1, Ordering::Relaxed);
                        job_ref.bytes_done.fetch_add(obj.size, Ordering::Relaxed);
                    }
                    Err(e) => {
                        job_ref.errors.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(key = %obj.key, error = %e, "warm: fetch failed");
                    }
                }
            }
        })
        .buffer_unordered(PARALLEL_FILES)
        .collect::<Vec<()>>()
        .await;
    if job.is_cancelled() {
        job.finish(
            Phase::Cancelled,
            Some("cancelled; the mount is unaffected".into()),
        );
    } else if stopping {
        let done = job.bytes_done.load(Ordering::Relaxed);
        job.finish(
            Phase::Stopped,
            Some(format!(
                "stopped at the cache budget: {done} of {total} bytes warmed ({count} of {} files); \
                 raise --cache-size (or use --cache-dir) to warm everything",
                job.files_total.load(Ordering::Relaxed)
            )),
        );
    } else {
        job.finish(Phase::Done, None);
    }
}

/// The files under `paths`, in listing order.
async fn list(
    prefetcher: &Arc<Prefetcher>,
    job: &WarmJob,
    paths: Vec<String>,
) -> Result<Vec<Arc<ObjectVersion>>, String> {
    let ns = &prefetcher.ns;
    let roots = if paths.is_empty() {
        vec![String::new()]
    } else {
        paths
    };
    let mut files = Vec::new();
    for root in roots {
        let attr = ns
            .resolve(&root)
            .await
            .map_err(|e| format!("{root}: {e}"))?;
        let mut stack = vec![attr];
        while let Some(attr) = stack.pop() {
            if job.is_cancelled() {
                return Ok(files);
            }
            match attr.kind {
                Kind::File { size, etag } => {
                    job.files_total.fetch_add(1, Ordering::Relaxed);
                    job.bytes_total.fetch_add(size, Ordering::Relaxed);
                    files.push(Arc::new(ObjectVersion {
                        key: Arc::from(ns.key_of(attr.ino).as_str()),
                        etag,
                        size,
                    }));
                }
                Kind::Dir => {
                    let entries = ns
                        .readdir(attr.ino)
                        .await
                        .map_err(|e| format!("listing {}: {e}", ns.key_of(attr.ino)))?;
                    // Reverse onto the stack so the listing order comes out first.
                    for e in entries.iter().rev() {
                        if let Ok(child) = ns.cached_attr(e.ino()) {
                            stack.push(child);
                        }
                    }
                }
            }
        }
    }
    Ok(files)
}
