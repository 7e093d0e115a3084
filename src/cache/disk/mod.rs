//! [`DiskCache`]: reads, crash-safe writes, pins, the byte budget and eviction.
//!
//! **Read** (`read_block`): find the entry's open files (loading its journal on first use, on
//! a blocking thread); if the block table lacks the block, replay the journal's new tail (it
//! may have been written by another process); read the block through the ring (`O_DIRECT` for
//! whole aligned blocks); compare its CRC32C with the recorded one. A mismatch drops the block
//! (a `dropped` record, counted in `crc_failures`) and is reported as a miss, so the caller
//! fetches it again; bad bytes are never returned.
//!
//! **Write** (`write_block`) is a sequence of steps, each of which may be the last one a
//! crashing process completes; the test hook [`WriteStep`] stops a write before any step:
//!
//! 1. `Reserve` — become a user of the entry (creating it if needed) and reserve its bytes in
//!    the budget, evicting other entries if needed;
//! 2. `Lock` — take an OFD write lock on the block's byte range of the data file, without
//!    waiting (another process writing the same block: skip, it will be there), then replay
//!    the journal's tail (someone may just have finished it);
//! 3. `WriteData` — write the bytes at the block's offset;
//! 4. `AppendRecord` — append the block's `present` record with its CRC32C to the journal;
//! 5. `Publish` — mark the block present in memory. (Before that, the writer moves its replay
//!    mark past its own record when that is the only record past it, so it does not read its
//!    own records back: `OpenEntry::skip_own_record`.)
//!
//! A crash of the process before step 4 completes leaves bytes that no record describes:
//! invisible, and overwritten by the next write of that block. A torn record is skipped by
//! replay. Nothing is `fdatasync`ed: what a process wrote is in the page cache, which every
//! later reader on the node sees, so only a crash of the whole machine can lose it, and then
//! a record may survive whose data did not (or the other way round). Such a block fails its
//! CRC32C check at its first read, which drops it and fetches it again; passthrough, which
//! skips that check, is only given files this daemon wrote itself or read back whole
//! (`fetch::disk`). An `fdatasync` per block cost about a fifth of the daemon's CPU in a cold
//! epoch of small files (every one went to an io_uring worker thread and flushed the disk's
//! write cache): W1 with an epoch plan took 7.4–7.6 s against 5.9–6.5 s without it.
//!
//! **Budget.** `used` is the sum of the entries' charged bytes (4 KiB-rounded data plus
//! journal) as far as this process knows: the start-up scan, entries it loaded, and its own
//! reservations. A reservation succeeds only when `used + need <= limit` and the file system
//! keeps `min_free` free after it (`statvfs`, less bytes reserved but not yet
//! written); otherwise victims chosen by the [`EvictionPolicy`] are removed until it fits, or
//! the write is refused with [`CacheError::Full`]. Bytes are released only after the files are
//! unlinked, so the bytes on disk never exceed `used`, and `used` never exceeds `limit`.
//! Entries pinned (open readers), being written, or in use by another process are never
//! victims.
//!
//! The files of this module, one job each: [`table`] (the records of the known entries),
//! [`entries`] (opening, loading and installing an entry's files), [`read`] (block reads and
//! their CRC check), [`write`] (the write steps above), [`budget`] (reservations and
//! eviction), [`pins`] and [`stats`]; this file holds the [`DiskCache`] itself, its opening
//! and the start-up scan's hand-over, and the metadata tasks on the blocking pool.

mod budget;
mod entries;
mod pins;
mod read;
mod stats;
mod table;
mod write;

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::entry::Files;
use super::evict::{EntryInfo, EvictionPolicy, LruPolicy};
use super::format;
use super::identity::{EntryKey, ObjectIdentity};
use super::ring::Ring;
use super::{scan, sys, CacheConfig, CacheError, SizeLimit};
use stats::Counters;
use table::{Table, COMPLETE};

pub use pins::PinGuard;
pub use stats::closed_entry_bytes;
pub use write::WriteStep;
#[cfg(test)]
pub use write::{HookAction, WriteHook};

/// Metadata tasks (opening, creating, replaying, removing entries) on tokio's blocking pool at
/// once, per cache handle. A cold epoch asks for hundreds of entries together; without a limit
/// each waiting one got a thread of its own (160 threads on 2 cores, all in the file system's
/// inode allocation at once).
const METADATA_TASKS: usize = 16;

/// Of the [`METADATA_TASKS`] slots, those background work (prefetch, warming) may hold at
/// once: the rest are always free for a reader's demand read. Without the split, a cold epoch
/// whose prefetcher had a few hundred new entries queued for creation made every demand
/// read's own entry wait behind all of them (the slots are first come, first served).
const BACKGROUND_METADATA_TASKS: usize = METADATA_TASKS * 3 / 4;

tokio::task_local! {
    /// Set (by [`DiskCache::in_background`]) for the duration of background work.
    static BACKGROUND: ();
}

/// A complete entry's data file, open, and the nonce in its name (its path, for readahead
/// by path later when the descriptor is long closed, is [`DiskCache::data_path`]).
#[derive(Debug)]
pub struct DataFile {
    pub file: File,
    pub nonce: u64,
}

/// Blocks present in one object's entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectStatus {
    pub blocks_present: u64,
    pub blocks_total: u64,
    pub complete: bool,
}

struct State {
    table: Table,
    policy: Box<dyn EvictionPolicy>,
    /// Slots of entries with open files, least recently used first.
    open_lru: LruPolicy,
    open_count: usize,
    used: u64,
    /// Reserved bytes not yet written (the free-space guard subtracts them from `statvfs`).
    pending: u64,
    /// Evictions in progress.
    evicting: usize,
    /// Bytes the evictions in progress will release: a reservation counts them as freed
    /// already and waits for them rather than choosing more victims.
    evicting_bytes: u64,
    /// Bytes of an entry's `bytes` reserved by its writes in progress.
    reserved: HashMap<EntryKey, u64>,
}

type EvictedListener = Box<dyn Fn(&[EntryKey]) + Send + Sync>;

/// The persistent block cache (see the `cache` module documentation).
pub struct DiskCache {
    root: PathBuf,
    block_size: u64,
    limit: u64,
    /// Bytes of the filesystem always left free (`CacheConfig::min_free`, resolved at open).
    min_free: u64,
    /// Whether the first write refused at the free-space floor has been logged.
    floor_warned: AtomicBool,
    direct_io: bool,
    max_open: usize,
    ring: Ring,
    state: Mutex<State>,
    evicted: tokio::sync::Notify,
    evicted_listener: Mutex<Option<EvictedListener>>,
    counters: Counters,
    scan_done: Mutex<bool>,
    scan_cv: Condvar,
    warned_no_space: AtomicBool,
    warned_io: AtomicBool,
    metadata_slots: tokio::sync::Semaphore,
    background_metadata_slots: tokio::sync::Semaphore,
    /// The shared lock on `DIR/lock` (held for the life of this handle).
    _dir_lock: File,
    #[cfg(test)]
    hook: Mutex<Option<WriteHook>>,
}

impl std::fmt::Debug for DiskCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskCache")
            .field("root", &self.root)
            .field("block_size", &self.block_size)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

fn io_err(context: &str, e: io::Error) -> CacheError {
    if sys::is_no_space(&e) {
        CacheError::NoSpace {
            context: context.to_string(),
        }
    } else {
        CacheError::Io {
            context: context.to_string(),
            source: e,
        }
    }
}

async fn run_blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, CacheError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        if e.is_cancelled() {
            // The runtime is shutting down (unmount): not a failure of the cache disk.
            CacheError::ShuttingDown
        } else {
            CacheError::Io {
                context: "cache metadata task".into(),
                source: io::Error::other(e.to_string()),
            }
        }
    })
}

impl DiskCache {
    /// Opens (creating if needed) the cache directory; see the module documentation of `cache`
    /// for what happens and what can fail.
    pub fn open(config: CacheConfig) -> Result<Arc<DiskCache>, CacheError> {
        Self::open_with_policy(config, Box::new(LruPolicy::new()))
    }

    /// [`DiskCache::open`] with another eviction policy.
    pub fn open_with_policy(
        config: CacheConfig,
        policy: Box<dyn EvictionPolicy>,
    ) -> Result<Arc<DiskCache>, CacheError> {
        config.validate()?;
        let root = config.dir.clone();
        let dir_lock = super::prepare_dir(&root, config.block_size)?;
        let space = sys::fs_space(&root).map_err(|e| io_err("statvfs of the cache dir", e))?;
        let resolve = |size: SizeLimit| match size {
            SizeLimit::Bytes(b) => b,
            SizeLimit::Percent(p) => (space.total as f64 * p / 100.0) as u64,
        };
        let limit = resolve(config.max_bytes);
        let min_free = resolve(config.min_free);
        if space.avail <= min_free {
            tracing::warn!(
                dir = %root.display(),
                free = space.avail,
                keep_free = min_free,
                "the cache's filesystem has no more free space than it must keep free (--cache-min-free): nothing is cached until space is freed there or the floor is lowered"
            );
        }
        let ring = Ring::new(config.ring_threads).map_err(|e| io_err("starting io_uring", e))?;
        tracing::info!(dir = %root.display(), limit, block_size = config.block_size, policy = policy.name(), direct_io = config.direct_io, "disk cache opened");
        let cache = Arc::new(DiskCache {
            root,
            block_size: config.block_size,
            limit,
            min_free,
            floor_warned: AtomicBool::new(false),
            direct_io: config.direct_io,
            max_open: config.max_open_objects.max(1),
            ring,
            state: Mutex::new(State {
                table: Table::default(),
                policy,
                open_lru: LruPolicy::new(),
                open_count: 0,
                used: 0,
                pending: 0,
                evicting: 0,
                evicting_bytes: 0,
                reserved: HashMap::new(),
            }),
            evicted: tokio::sync::Notify::new(),
            evicted_listener: Mutex::new(None),
            counters: Counters::default(),
            scan_done: Mutex::new(false),
            scan_cv: Condvar::new(),
            warned_no_space: AtomicBool::new(false),
            warned_io: AtomicBool::new(false),
            metadata_slots: tokio::sync::Semaphore::new(METADATA_TASKS),
            background_metadata_slots: tokio::sync::Semaphore::new(BACKGROUND_METADATA_TASKS),
            _dir_lock: dir_lock,
            #[cfg(test)]
            hook: Mutex::new(None),
        });
        let weak = Arc::downgrade(&cache);
        let root = cache.root.clone();
        let spawned = std::thread::Builder::new()
            .name("riffle-cache-scan".into())
            .spawn(move || {
                scan::run(&root, &mut |batch| match weak.upgrade() {
                    Some(c) => {
                        c.add_scanned(batch);
                        true
                    }
                    None => false,
                });
                if let Some(c) = weak.upgrade() {
                    c.finish_scan();
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "could not start the cache scan; existing entries are found on use");
            cache.finish_scan();
        }
        Ok(cache)
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.root
    }

    /// The byte budget in force (a percentage resolved at open).
    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    /// Blocks at most in an object of `size` bytes.
    pub(crate) fn block_count(&self, size: u64) -> u64 {
        format::block_count(size, self.block_size)
    }

    /// Blocks until the start-up scan of existing entries has finished.
    pub fn wait_for_scan(&self) {
        let mut done = self.scan_done.lock();
        while !*done {
            self.scan_cv.wait(&mut done);
        }
    }

    fn finish_scan(&self) {
        *self.scan_done.lock() = true;
        self.scan_cv.notify_all();
    }

    /// Adds entries found by the scan (ones already known here are left alone).
    fn add_scanned(&self, found: Vec<scan::Found>) {
        let mut st = self.state.lock();
        let st = &mut *st;
        for f in found {
            if st.table.find(&f.key).is_some() {
                continue;
            }
            let Some(at) = st.table.add(f.key) else {
                break;
            };
            if let Some(e) = st.table.at_mut(at) {
                e.bytes = f.bytes;
                e.files = Files::Closed {
                    blocks: f.blocks,
                    one_block: f.one_block,
                };
                e.set(COMPLETE, f.complete);
            }
            st.used += f.bytes;
            st.policy.insert(
                at,
                &EntryInfo {
                    key: f.key,
                    bytes: f.bytes,
                    last_used: Some(f.last_used),
                },
                &st.table,
            );
        }
    }

    fn block_len(&self, id: &ObjectIdentity, index: u64) -> Result<u64, CacheError> {
        if index >= format::block_count(id.size, self.block_size) || index > u32::MAX as u64 {
            return Err(CacheError::Invalid(format!(
                "block {index} of a {}-byte object",
                id.size
            )));
        }
        Ok(format::block_len(id.size, self.block_size, index))
    }

    /// Logs the first failure of each kind as a warning (later ones at debug), and counts it.
    fn report(&self, e: &CacheError) {
        let (flag, counter) = match e {
            CacheError::NoSpace { .. } => (&self.warned_no_space, &self.counters.no_space_errors),
            CacheError::Io { .. } => (&self.warned_io, &self.counters.io_errors),
            _ => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if !flag.swap(true, Ordering::Relaxed) {
            tracing::warn!(error = %e, dir = %self.root.display(), "disk cache failure; reading from the store instead (further failures are logged at debug level)");
        } else {
            tracing::debug!(error = %e, "disk cache failure");
        }
    }

    /// Runs `work` as background work: the metadata tasks it causes (creating and opening
    /// entries) take at most [`BACKGROUND_METADATA_TASKS`] of the slots, so demand reads
    /// never queue behind them.
    pub(crate) async fn in_background<T>(work: impl std::future::Future<Output = T>) -> T {
        BACKGROUND.scope((), work).await
    }

    /// Runs `f` on tokio's blocking pool once one of the [`METADATA_TASKS`] slots is free
    /// (for background work, one of its share of them: [`Self::in_background`]).
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, CacheError> {
        let _background = if BACKGROUND.try_with(|_| ()).is_ok() {
            Some(
                self.background_metadata_slots
                    .acquire()
                    .await
                    .map_err(|_| CacheError::ShuttingDown)?,
            )
        } else {
            None
        };
        let _slot = self
            .metadata_slots
            .acquire()
            .await
            .map_err(|_| CacheError::ShuttingDown)?;
        run_blocking(f).await
    }
}
