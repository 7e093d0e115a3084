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
//! replying, asks the kernel to read the whole data file into the page cache
//! (`readahead(2)` queues the reads and returns). The disk read then runs while the open's
//! round trip and the reader's first `read` are under way, and that read finds the pages in
//! flight or already there. Measured on W1's warm epoch (20,000 files, 8 readers, page cache
//! dropped): 2.87 s against 3.26 s without (medians of 8 alternated rounds); in the
//! benchmark, riffle's warm epoch went from 0.74–0.79× of local disk's files/s to
//! 0.90–0.92× (medians of 5 rounds, benches/README.md).
//!
//! The readahead runs on the FUSE thread that answered the lookup, not on a worker of its
//! own: handing it over cost two context switches per file (waking the worker, and its going
//! back to sleep), more than the `open` and `readahead` calls themselves. Measured on W1's
//! warm epoch (6,000 files, one filled cache, two mounts alternated with local disk, page
//! cache dropped): the Python reader at 0.89× local disk against 0.81× with the worker
//! (medians of 9 rounds, +8% files/s), `riffle-bench read-fs` +8% (medians of 7 rounds).
//!
//! Without passthrough the daemon reads the cache file itself when the READ arrives, on the
//! io_uring thread; a page cache miss there costs that one thread the page allocation and the
//! readahead submission, and the READ waits for the disk. So, without passthrough, a lookup
//! of a small file complete in the cache and not in the daemon's memory also starts
//! `readahead(2)`, on the entry's own open descriptor, after the reply (and only when the
//! cache's state lock is free at once: it is a hint). Measured on W1's warm epoch without
//! passthrough (6,000 files, 8 readers, page cache dropped, two mounts alternated): +11%
//! files/s, every one of 8 paired rounds 1.08× or more (medians 6,916 against 6,214 files/s);
//! cold epochs were not slower in 6 paired rounds (the machine's noise there is ±30%).
//!
//! What it never does: change what a read returns (passthrough reads the same file either
//! way, and the kept file is the version the lookup answered with), delay the lookup's reply
//! (it is sent first), or read more than the file. Walks
//! that list directories (`find`, `ls -l`, `du`) get their attributes from READDIRPLUS and
//! send no lookups; a program that `stat`s many small cached files by path reads each of
//! them once from the cache disk into the page cache, clean pages the kernel reclaims like
//! any other. Files not complete in the cache are the prefetcher's business; larger files
//! have the kernel's own readahead once their first read arrives.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::RiffleFs;
use crate::fetch::{DiskTier, ObjectVersion};
use crate::namespace::{Attr, Kind};

/// Counters, for `riffle stats` and the metrics.
#[derive(Debug, Default)]
pub struct LookaheadStats {
    /// Readaheads asked for, counted before the lookup's reply (so a test that has its
    /// `stat` back sees it).
    pub requested: AtomicU64,
    /// Readaheads that failed (the cache file was gone, evicted meanwhile).
    pub failed: AtomicU64,
}

/// One readahead to do: made (and counted) before the lookup's reply, run after it.
pub struct Job {
    file: CacheFile,
    len: u64,
}

/// The cache file to read ahead: by path (a file kept for passthrough, opened here) or an
/// open descriptor (the cache entry's own data file, without passthrough).
enum CacheFile {
    Path(PathBuf),
    Open(Arc<File>),
}

/// Readaheads of the cache files of looked-up files (see the module documentation).
pub struct Lookahead {
    stats: Arc<LookaheadStats>,
}

impl Lookahead {
    pub fn new(stats: Arc<LookaheadStats>) -> Lookahead {
        Lookahead { stats }
    }

    /// A readahead of the first `len` bytes of `path`, counted as requested; [`Self::run`]
    /// it once the lookup is answered.
    pub fn job(&self, path: PathBuf, len: u64) -> Job {
        self.stats.requested.fetch_add(1, Ordering::Relaxed);
        Job {
            file: CacheFile::Path(path),
            len,
        }
    }

    /// A readahead of the first `len` bytes of the open cache file `file`, counted as
    /// requested.
    pub fn job_open(&self, file: Arc<File>, len: u64) -> Job {
        self.stats.requested.fetch_add(1, Ordering::Relaxed);
        Job {
            file: CacheFile::Open(file),
            len,
        }
    }

    /// Starts the readahead of `job` (on the calling thread; `readahead(2)` returns once the
    /// reads are queued). A failure is counted, never reported to the reader.
    pub fn run(&self, job: Job) {
        if let Err(e) = read_ahead(&job) {
            tracing::debug!(error = %e, "lookup readahead failed");
            self.stats.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn read_ahead(job: &Job) -> std::io::Result<()> {
    let opened;
    let file = match &job.file {
        CacheFile::Path(path) => {
            opened = File::open(path)?;
            &opened
        }
        CacheFile::Open(file) => &**file,
    };
    let len = usize::try_from(job.len).unwrap_or(usize::MAX);
    // SAFETY: readahead on a descriptor we hold; it reads nothing into our memory.
    let rc = unsafe { libc::readahead(file.as_raw_fd(), 0, len) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The lookup side: which looked-up files get a readahead.
impl RiffleFs {
    /// For a lookup that found a small file whose complete cache file is kept for
    /// passthrough at this version, a readahead of that file, to queue once the lookup is
    /// answered (this module).
    pub(super) fn look_ahead(&self, attr: &Attr) -> Option<(&Lookahead, Job)> {
        if !self.passthrough.load(Ordering::Relaxed) {
            return None; // see `look_ahead_for_daemon`
        }
        let (lookahead, disk, object) = self.look_ahead_candidate(attr)?;
        let key = disk.entry_key(&object);
        let kept = self.handles.kept.peek(&key, &object.etag)?;
        let path = disk.cache().data_path(&key, kept.nonce);
        Some((lookahead, lookahead.job(path, object.size)))
    }

    /// What a lookup readahead needs, when `attr` is a file it applies to (non-empty, at most
    /// `--lookup-readahead`, on a mount with the NVMe cache): the readahead, the cache tier
    /// and the object version the lookup answered with.
    pub(super) fn look_ahead_candidate(
        &self,
        attr: &Attr,
    ) -> Option<(&Lookahead, &Arc<DiskTier>, Arc<ObjectVersion>)> {
        let (Some(lookahead), Some(disk)) = (&self.lookahead, self.fetcher.disk()) else {
            return None;
        };
        let Kind::File { size, etag } = &attr.kind else {
            return None;
        };
        if *size == 0 || *size > self.meta.config.lookup_readahead {
            return None;
        }
        let object = Arc::new(ObjectVersion {
            key: Arc::from(self.meta.ns.key_of(attr.ino)),
            etag: etag.clone(),
            size: *size,
        });
        Some((lookahead, disk, object))
    }

    /// Without passthrough, after a lookup was answered that found a small file complete in
    /// the cache but not in the daemon's memory: a readahead of its cache file, so the
    /// daemon's read at the READ copies from the page cache instead of waiting for the disk
    /// on the io_uring thread (this module).
    pub(super) fn look_ahead_for_daemon(&self, attr: &Attr) {
        if self.passthrough.load(Ordering::Relaxed) {
            return;
        }
        let Some((lookahead, disk, object)) = self.look_ahead_candidate(attr) else {
            return;
        };
        if self.fetcher.in_memory(&object) || !disk.may_serve(&object) {
            return;
        }
        let id = disk.identity(&object);
        if let Some(file) = disk.cache().open_data_file(&id) {
            lookahead.run(lookahead.job_open(file, object.size));
        } else if let Some(path) = disk.cache().closed_data_path(&id) {
            // Its files were closed (more cached files than open entries): by name.
            lookahead.run(lookahead.job(path, object.size));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_requests_at_once_and_failures_of_missing_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a.data");
        std::fs::write(&path, vec![7u8; 100_000]).expect("write");
        let stats = Arc::new(LookaheadStats::default());
        let lookahead = Lookahead::new(stats.clone());
        let job = lookahead.job(path.clone(), 100_000);
        assert_eq!(stats.requested.load(Ordering::Relaxed), 1);
        lookahead.run(job);
        assert_eq!(stats.failed.load(Ordering::Relaxed), 0);
        let missing = lookahead.job(dir.path().join("gone.data"), 10);
        lookahead.run(missing);
        assert_eq!(stats.failed.load(Ordering::Relaxed), 1);
        assert_eq!(stats.requested.load(Ordering::Relaxed), 2);
        // Without passthrough: the cache entry's own open descriptor.
        let open = Arc::new(File::open(&path).expect("open"));
        lookahead.run(lookahead.job_open(open, 100_000));
        assert_eq!(stats.failed.load(Ordering::Relaxed), 1);
        assert_eq!(stats.requested.load(Ordering::Relaxed), 3);
    }
}
