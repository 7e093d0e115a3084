//! Disk readahead started by a lookup, for small files whose bytes are all in the cache.
//!
//! A warm epoch over small files (W1) is a chain per file: LOOKUP (a FUSE round trip), OPEN
//! (another), then the first read, which with passthrough goes to the cache's data file and,
//! once the page cache has been dropped, waits for the disk. Nothing overlaps inside one
//! reader thread, so each file costs two round trips plus a disk read.
//!
//! A lookup of a file by path is nearly always followed by an open and a read of it (a
//! training loader opens the paths of its file list). So when the kernel looks up a file
//! whose size is at most `--lookup-readahead` (1 MiB by default) and whose complete cache
//! file is kept for passthrough at the version the lookup returns, the FUSE thread, after
//! replying, hands the data file's path to a worker thread, which asks the kernel to read the
//! whole file into the page cache (`readahead(2)` queues the reads and returns). The disk read
//! then runs while the reply, the open's round trip and the reader's first `read` are under
//! way, and that read finds the pages in flight or already there. Measured on W1's warm
//! epoch (20,000 files, 8 readers, page cache dropped): 2.87 s against 3.26 s without
//! (medians of 8 alternated rounds); in the benchmark, riffle's warm epoch went from
//! 0.74–0.79× of local disk's files/s to 0.90–0.92× (medians of 5 rounds, benches/README.md).
//!
//! What it never does: change what a read returns (passthrough reads the same file either
//! way, and the kept file is the version the lookup answered with), delay a reply (the
//! request is queued after it; a full queue drops it), or read more than the file. Walks
//! that list directories (`find`, `ls -l`, `du`) get their attributes from READDIRPLUS and
//! send no lookups; a program that `stat`s many small cached files by path reads each of
//! them once from the cache disk into the page cache, clean pages the kernel reclaims like
//! any other. Files not complete in the cache are the prefetcher's business; larger files
//! have the kernel's own readahead once their first read arrives.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;

/// Requests waiting for the worker, at most; beyond that they are dropped.
const QUEUE: usize = 1024;

/// Counters, for `riffle stats` and the metrics.
#[derive(Debug, Default)]
pub struct LookaheadStats {
    /// Readaheads asked for, counted before the lookup's reply (so a test that has its
    /// `stat` back sees it).
    pub requested: AtomicU64,
    /// Requests dropped because the queue was full.
    pub dropped: AtomicU64,
    /// Readaheads that failed (the cache file was gone, evicted meanwhile).
    pub failed: AtomicU64,
}

/// One readahead to do: made (and counted) before the lookup's reply, queued after it.
pub struct Job {
    path: Arc<PathBuf>,
    len: u64,
}

/// The queue to the worker thread (see the module documentation).
pub struct Lookahead {
    tx: SyncSender<Job>,
    stats: Arc<LookaheadStats>,
}

impl Lookahead {
    /// Starts the worker thread; it ends when this is dropped.
    pub fn start(stats: Arc<LookaheadStats>) -> std::io::Result<Lookahead> {
        let (tx, rx) = sync_channel(QUEUE);
        let worker_stats = stats.clone();
        std::thread::Builder::new()
            .name("riffle-lookahead".into())
            .spawn(move || run(rx, &worker_stats))?;
        Ok(Lookahead { tx, stats })
    }

    /// A readahead of the first `len` bytes of `path`, counted as requested; [`Self::queue`]
    /// it once the lookup is answered.
    pub fn job(&self, path: Arc<PathBuf>, len: u64) -> Job {
        self.stats.requested.fetch_add(1, Ordering::Relaxed);
        Job { path, len }
    }

    /// Hands `job` to the worker, unless its queue is full.
    pub fn queue(&self, job: Job) {
        match self.tx.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }
}

fn run(rx: Receiver<Job>, stats: &LookaheadStats) {
    while let Ok(job) = rx.recv() {
        if let Err(e) = read_ahead(&job) {
            tracing::debug!(error = %e, path = %job.path.display(), "lookup readahead failed");
            stats.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn read_ahead(job: &Job) -> std::io::Result<()> {
    let file = File::open(&*job.path)?;
    let len = usize::try_from(job.len).unwrap_or(usize::MAX);
    // SAFETY: readahead on a descriptor we own; it reads nothing into our memory.
    let rc = unsafe { libc::readahead(file.as_raw_fd(), 0, len) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::eventually;

    #[tokio::test]
    async fn counts_requests_at_once_and_failures_of_missing_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a.data");
        std::fs::write(&path, vec![7u8; 100_000]).expect("write");
        let stats = Arc::new(LookaheadStats::default());
        let lookahead = Lookahead::start(stats.clone()).expect("start");
        let job = lookahead.job(Arc::new(path), 100_000);
        assert_eq!(stats.requested.load(Ordering::Relaxed), 1);
        lookahead.queue(job);
        let missing = lookahead.job(Arc::new(dir.path().join("gone.data")), 10);
        lookahead.queue(missing);
        eventually("the missing file's readahead to fail", || {
            stats.failed.load(Ordering::Relaxed) == 1
        })
        .await;
        assert_eq!(stats.requested.load(Ordering::Relaxed), 2);
        assert_eq!(stats.dropped.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_full_queue_drops_requests_instead_of_waiting() {
        let stats = Arc::new(LookaheadStats::default());
        // No worker: nothing empties the queue.
        let (tx, _rx) = sync_channel(QUEUE);
        let lookahead = Lookahead {
            tx,
            stats: stats.clone(),
        };
        for _ in 0..QUEUE + 5 {
            let job = lookahead.job(Arc::new(PathBuf::from("/nonexistent")), 1);
            lookahead.queue(job);
        }
        assert_eq!(stats.dropped.load(Ordering::Relaxed), 5);
        assert_eq!(stats.requested.load(Ordering::Relaxed), QUEUE as u64 + 5);
    }
}
