//! Reads of one open file: a sequential detector driving an adaptive read-ahead window.
//!
//! Each open file handle has a [`FileReader`]. On every read it decides whether the reader is
//! sequential: the read starts at (or within one block of) where the previous one ended — the
//! tolerance absorbs the kernel issuing its own read-ahead requests slightly out of order on
//! several FUSE threads. While reads stay sequential the window doubles on each read, from
//! `initial_window` up to `max_window`; the bytes from the end of the read to the end of the
//! window are handed to [`Fetcher::prefetch`], which starts GETs for the blocks not already
//! cached or in flight (only as far as the budgets allow). A read that jumps elsewhere resets
//! the window to zero: random readers fetch only the blocks they touch.
//!
//! Read-ahead is remembered as a high-water mark so each block is requested once per handle,
//! not once per read. Without the NVMe cache, the window is capped at a quarter of the memory
//! cache, so what is read ahead is still there when the reader gets to it.
//!
//! # Cached files
//! With the NVMe cache, blocks it holds and has checked are left where they are for short
//! runs: a random reader's request (and the few the kernel's own read-ahead adds to it) takes
//! just its bytes from the cache file ([`Fetcher::prefetch`] skips them). Once a run passes
//! [`LONG_RUN_BYTES`] (more than the kernel's read-ahead makes of a random read) it is a
//! stream, and waiting for one cache-file read per request would leave the disk idle between
//! them: the window is then read into memory as well, cached blocks included
//! ([`Fetcher::prefetch_stream`]), and the blocks the reader has passed are dropped from memory
//! again ([`Fetcher::drop_behind`]; the kernel's page cache holds what it read), so a stream
//! holds about its window in memory, not the file. A file wholly in the cache when it is
//! opened has a shorter window ([`CACHED_STREAM_WINDOW`]): its blocks come from the local disk,
//! not the store.
//!
//! The reader only decides what to read ahead ([`FileReader::begin_read`]); the FUSE layer then
//! serves the bytes through the fetcher.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::cache::PinGuard;
use crate::fetch::{Fetcher, ObjectVersion};

/// Bytes a sequential run reads before it counts as a stream (see the module documentation).
pub const LONG_RUN_BYTES: u64 = 4 << 20;

/// Read-ahead tuning.
#[derive(Debug, Clone, Copy)]
pub struct ReadAheadConfig {
    pub initial_window: u64,
    pub max_window: u64,
}

impl Default for ReadAheadConfig {
    fn default() -> Self {
        ReadAheadConfig {
            initial_window: 1 << 20,
            max_window: 64 << 20,
        }
    }
}

/// The sequential detector's state (pure, so it is tested on its own).
#[derive(Debug, Clone)]
pub struct ReadAhead {
    config: ReadAheadConfig,
    tolerance: u64,
    /// Where the last sequential run ended.
    next: u64,
    window: u64,
    /// Read-ahead already requested up to here.
    requested_to: u64,
    /// The largest useful single request (a GET part).
    step: u64,
    reads: u64,
    /// Where the current sequential run began.
    run_start: u64,
}

impl ReadAhead {
    /// `tolerance` is how far out of order a read may land and still be sequential; `step` is
    /// the size of one GET part.
    pub fn new(config: ReadAheadConfig, tolerance: u64, step: u64) -> Self {
        ReadAhead {
            config,
            tolerance,
            step,
            next: 0,
            window: 0,
            requested_to: 0,
            reads: 0,
            run_start: 0,
        }
    }

    /// Records a read of `range` of an object of `size` bytes; returns the byte range to read
    /// ahead (possibly empty).
    pub fn observe(&mut self, range: Range<u64>, size: u64) -> Range<u64> {
        let sequential = if self.reads == 0 {
            range.start == 0
        } else {
            range.start + self.tolerance >= self.next && range.start <= self.next + self.tolerance
        };
        self.reads += 1;
        if sequential {
            self.window = if self.window == 0 {
                self.config.initial_window
            } else {
                (self.window * 2).min(self.config.max_window)
            };
            self.next = self.next.max(range.end);
        } else {
            self.window = 0;
            self.run_start = range.start;
            self.next = range.end;
            self.requested_to = range.end;
            return range.end..range.end;
        }
        let start = self.requested_to.max(range.end);
        let end = (range.end + self.window).min(size);
        // Top the window up in steps of at least half of it (capped at `step`), so a reader
        // at full speed causes few large GETs rather than one small GET per read.
        let min_step = (self.window / 2).min(self.step).max(1);
        if end <= start || (end - start < min_step && end < size) {
            return start..start;
        }
        self.requested_to = end;
        start..end
    }

    #[cfg(test)]
    pub fn window(&self) -> u64 {
        self.window
    }

    /// Bytes read sequentially so far in the current run (0 after a jump: a jump starts a
    /// run of the read that made it).
    pub fn run_len(&self) -> u64 {
        if self.window == 0 {
            0
        } else {
            self.next.saturating_sub(self.run_start)
        }
    }
}

/// The read-ahead window of a file whose blocks are all in the NVMe cache when it is opened.
///
/// Such a stream reads the cache file, not the store: a block is a direct read of about a
/// millisecond, not a GET with tens of milliseconds to its first byte, so a few blocks ahead
/// keep the disk busy. A longer window only makes the cache's I/O thread read blocks the reader
/// will not want for a while ahead of the ones it is waiting for. Measured on W2 without
/// passthrough (16 shards of 256 MiB read whole by 4 readers in 1 MiB reads, page cache dropped
/// before each epoch, one warm mount per window, alternated over 6 rounds, two runs): 16 MiB
/// read 1,328 and 1,847 MB/s (medians), 64 MiB 1,136 and 1,602 (+17%, +15%); 8 MiB 1,332 and
/// 1,762, 32 MiB 1,230. Two more runs, one build of each with the order rotated every round
/// (8 and 10 rounds): 1,167 against 1,177 (−1%) and 1,238 against 933 (+33%). The daemon's
/// peak RSS did not change: it is reached in the cold epoch.
pub const CACHED_STREAM_WINDOW: u64 = 16 << 20;

/// The read-ahead configuration of one open file. Without the NVMe cache, blocks read ahead
/// wait in the memory cache: a window larger than a quarter of it would have them evicted
/// before the reader arrives (and fetched twice). With the NVMe cache they also land on disk,
/// so the full window is safe, and for a file wholly cached at open a short one is enough
/// ([`CACHED_STREAM_WINDOW`]).
fn window_for(
    mut config: ReadAheadConfig,
    has_disk: bool,
    cached_on_open: bool,
    block_cache_bytes: u64,
) -> ReadAheadConfig {
    let cap = if !has_disk {
        block_cache_bytes / 4
    } else if cached_on_open {
        CACHED_STREAM_WINDOW
    } else {
        u64::MAX
    };
    config.max_window = config.max_window.min(cap).max(config.initial_window);
    config
}

/// See the module documentation.
pub struct FileReader {
    object: Arc<ObjectVersion>,
    fetcher: Arc<Fetcher>,
    read_ahead: Mutex<ReadAhead>,
    /// Blocks below this one were dropped from memory behind a stream.
    dropped_to: AtomicU64,
    /// Keeps the object's NVMe cache entry from eviction while the file is open.
    _pin: Option<PinGuard>,
}

impl FileReader {
    pub fn new(
        object: Arc<ObjectVersion>,
        fetcher: Arc<Fetcher>,
        config: ReadAheadConfig,
        pin: Option<PinGuard>,
    ) -> Self {
        let fc = fetcher.config();
        let (tolerance, step) = (fc.block_size, fc.block_size * fc.max_part_blocks);
        // A file no larger than the short window reads the same with either window (read-ahead
        // stops at the object's end), so only a larger one asks the cache, whose state lock
        // every small file's open would otherwise take once more.
        let cached_on_open = object.size > CACHED_STREAM_WINDOW && fetcher.whole_on_disk(&object);
        let config = window_for(
            config,
            fetcher.disk().is_some(),
            cached_on_open,
            fc.block_cache_bytes,
        );
        FileReader {
            object,
            fetcher,
            read_ahead: Mutex::new(ReadAhead::new(config, tolerance, step)),
            dropped_to: AtomicU64::new(0),
            _pin: pin,
        }
    }

    pub fn object(&self) -> &Arc<ObjectVersion> {
        &self.object
    }

    /// The first half of a read of up to `len` bytes at `offset`: shows it to the read-ahead
    /// detector (starting read-ahead when it is sequential) and returns the byte range to
    /// serve, clamped to the object (empty at or past its end). The caller then serves the
    /// range with [`Fetcher::read_quick`] or [`Fetcher::read`].
    pub fn begin_read(&self, offset: u64, len: u32) -> Range<u64> {
        let size = self.object.size;
        let end = offset.saturating_add(len as u64).min(size);
        if offset >= end {
            return end..end;
        }
        let (ahead, stream) = {
            let mut ra = self.read_ahead.lock();
            let ahead = ra.observe(offset..end, size);
            (ahead, ra.run_len() >= LONG_RUN_BYTES)
        };
        // A block the read-ahead starts inside of is this read's last block (which the read
        // itself fetches) or was requested with the previous window: start at the next one.
        let bs = self.fetcher.config().block_size;
        let blocks = ahead.start.div_ceil(bs)..ahead.end.div_ceil(bs);
        if stream {
            if !blocks.is_empty() {
                self.fetcher.prefetch_stream(&self.object, blocks);
            }
            // The blocks wholly before this read are behind the reader.
            let behind = offset / bs;
            let from = self.dropped_to.fetch_max(behind, Ordering::Relaxed);
            if from < behind {
                self.fetcher.drop_behind(&self.object, from..behind);
            }
        } else if !blocks.is_empty() {
            self.fetcher.prefetch(&self.object, blocks);
        }
        offset..end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// A run becomes a stream only past LONG_RUN_BYTES of sequential reads; what the kernel's
    /// read-ahead makes of a random read (a request and the next one) does not; a jump ends it.
    #[test]
    fn a_run_is_a_stream_only_when_long() {
        let mut ra = ReadAhead::new(ReadAheadConfig::default(), MIB, 8 * MIB);
        let size = 1 << 30;
        // Random reads, each followed by the kernel's read-ahead of the next MiB.
        for at in [700 * MIB, 3 * MIB, 512 * MIB, 90 * MIB] {
            ra.observe(at..at + MIB, size);
            assert_eq!(ra.run_len(), 0);
            ra.observe(at + MIB..at + 2 * MIB, size);
            assert!(ra.run_len() < LONG_RUN_BYTES, "{}", ra.run_len());
        }
        // A sequential reader from a jump on.
        let mut at = 200 * MIB;
        ra.observe(at..at + MIB, size);
        while ra.run_len() < LONG_RUN_BYTES {
            at += MIB;
            ra.observe(at..at + MIB, size);
            assert!(at < 200 * MIB + 2 * LONG_RUN_BYTES);
        }
        ra.observe(10 * MIB..11 * MIB, size);
        assert_eq!(ra.run_len(), 0);
    }

    #[test]
    fn window_grows_while_sequential_and_resets_on_jumps() {
        let mut ra = ReadAhead::new(
            ReadAheadConfig {
                initial_window: MIB,
                max_window: 8 * MIB,
            },
            MIB,
            8 * MIB,
        );
        let size = 1 << 30;
        assert_eq!(
            ra.observe(0..128 << 10, size),
            (128 << 10)..(128 << 10) + MIB
        );
        let r = ra.observe(128 << 10..256 << 10, size);
        assert_eq!(r.end, (256 << 10) + 2 * MIB);
        for i in 2..10u64 {
            ra.observe(i * (128 << 10)..(i + 1) * (128 << 10), size);
        }
        assert_eq!(ra.window(), 8 * MIB);
        // A jump far away: no read-ahead.
        assert!(ra.observe(500 * MIB..500 * MIB + 4096, size).is_empty());
        assert_eq!(ra.window(), 0);
        // Sequential again from there: the window restarts small.
        let r = ra.observe(500 * MIB + 4096..500 * MIB + 8192, size);
        assert_eq!(r, 500 * MIB + 8192..500 * MIB + 8192 + MIB);
    }

    #[test]
    fn read_ahead_is_clamped_to_the_object_and_never_repeated() {
        let mut ra = ReadAhead::new(ReadAheadConfig::default(), MIB, 8 * MIB);
        assert_eq!(ra.observe(0..1000, 3000), 1000..3000);
        assert!(ra.observe(1000..2000, 3000).is_empty());
        assert!(ra.observe(2000..3000, 3000).is_empty());
    }

    #[test]
    fn a_full_window_is_topped_up_in_large_steps() {
        let mut ra = ReadAhead::new(ReadAheadConfig::default(), MIB, 8 * MIB);
        let size = 1 << 30;
        let mut requests = Vec::new();
        for i in 0..200u64 {
            let r = ra.observe(i * MIB..(i + 1) * MIB, size);
            if !r.is_empty() {
                requests.push(r);
            }
        }
        assert_eq!(ra.window(), 64 * MIB);
        // Once the window is full, each top-up covers at least one 8 MiB part.
        let late: Vec<_> = requests.iter().filter(|r| r.start > 100 * MIB).collect();
        assert!(!late.is_empty());
        assert!(late.iter().all(|r| r.end - r.start >= 8 * MIB), "{late:?}");
        // Everything up to the last read plus the window was requested, with no gaps.
        for pair in requests.windows(2) {
            assert_eq!(pair[0].end, pair[1].start);
        }
    }

    /// Read-ahead never asks again for the block the read itself is fetching: a read served
    /// without a task ([`Fetcher::read_quick`]) does not join in-flight fetches, so a
    /// read-ahead of that block would read it a second time.
    #[tokio::test]
    async fn read_ahead_starts_after_the_blocks_of_the_read() {
        use crate::store::memory::MemoryStore;
        use std::sync::atomic::Ordering;
        let store = Arc::new(MemoryStore::new());
        let bs = MIB;
        let mut objects = Vec::new();
        for (key, size) in [("one-block", bs / 2), ("three-blocks", 3 * bs)] {
            let etag = store.put(key, vec![7; size as usize]);
            objects.push(Arc::new(ObjectVersion {
                key: Arc::from(key),
                etag: Arc::from(etag.as_str()),
                size,
            }));
        }
        let fetcher = Fetcher::new(
            store,
            crate::fetch::FetchConfig::default(),
            tokio::runtime::Handle::current(),
            None,
        );
        let requests = || fetcher.stats().prefetch_requests.load(Ordering::Relaxed);
        // The first 128 KiB of a half-block file: the rest of it is in the block being read.
        let small = FileReader::new(
            objects[0].clone(),
            fetcher.clone(),
            ReadAheadConfig::default(),
            None,
        );
        assert_eq!(small.begin_read(0, 128 << 10), 0..128 << 10);
        assert_eq!(requests(), 0);
        // The first 128 KiB of a three-block file: blocks 1 and 2 are read ahead, not 0.
        let big = FileReader::new(
            objects[1].clone(),
            fetcher.clone(),
            ReadAheadConfig::default(),
            None,
        );
        big.begin_read(0, 128 << 10);
        assert_eq!(requests(), 1);
        assert!(fetcher
            .block_cache()
            .get(&(objects[1].clone(), 0))
            .is_none());
        crate::test_support::eventually("the next file's read-ahead", || {
            fetcher
                .block_cache()
                .get(&(objects[1].clone(), 1))
                .is_some()
        })
        .await;
        assert!(fetcher
            .block_cache()
            .get(&(objects[1].clone(), 0))
            .is_none());
    }

    #[test]
    fn the_window_fits_where_the_blocks_come_from() {
        let config = ReadAheadConfig::default();
        // Without the NVMe cache: a quarter of the memory cache, never below the first step.
        assert_eq!(
            window_for(config, false, false, 128 * MIB).max_window,
            32 * MIB
        );
        assert_eq!(window_for(config, false, false, 2 * MIB).max_window, MIB);
        // With it: the full window while blocks may come from the store...
        assert_eq!(
            window_for(config, true, false, 128 * MIB).max_window,
            64 * MIB
        );
        // ...and a short one for a file wholly cached when it was opened.
        let cached = window_for(config, true, true, 128 * MIB);
        assert_eq!(cached.max_window, CACHED_STREAM_WINDOW);
        assert_eq!(cached.initial_window, config.initial_window);
        // A window grows to the cap and no further.
        let mut ra = ReadAhead::new(cached, MIB, 8 * MIB);
        for i in 0..100u64 {
            ra.observe(i * MIB..(i + 1) * MIB, 1 << 30);
        }
        assert_eq!(ra.window(), CACHED_STREAM_WINDOW);
    }

    #[test]
    fn a_first_read_not_at_zero_is_random() {
        let mut ra = ReadAhead::new(ReadAheadConfig::default(), MIB, 8 * MIB);
        assert!(ra.observe(10 * MIB..11 * MIB, 100 * MIB).is_empty());
    }

    #[test]
    fn slightly_reordered_reads_still_count_as_sequential() {
        let mut ra = ReadAhead::new(ReadAheadConfig::default(), MIB, 8 * MIB);
        ra.observe(0..128 << 10, 100 * MIB);
        ra.observe(256 << 10..384 << 10, 100 * MIB);
        ra.observe(128 << 10..256 << 10, 100 * MIB);
        assert!(ra.window() >= 4 * MIB);
    }
}
