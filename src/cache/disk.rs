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

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::SystemTime;

use bytes::Bytes;
use parking_lot::{Condvar, Mutex};

use super::entry::{self, Evicted, Files, LoadError, OpenEntry, Use};
use super::evict::{hashmap_bytes, EntryInfo, EvictionPolicy, LruPolicy, Slot, SlotKeys};
use super::evict_plan::PlanPolicy;
use super::format::{self, RecordKind};
use super::identity::{EntryKey, ObjectIdentity};
use super::ring::{AlignedBuf, IoBuf, Ring, ALIGN};
use super::slab::{Chunked, KeyIndex};
use super::sys;
use super::{scan, CacheConfig, CacheError, SizeLimit};

/// Eviction rounds in a row that may find only entries in use elsewhere before a write is
/// refused as [`CacheError::Full`].
const MAX_STALLS: u32 = 8;

/// Metadata tasks (opening, creating, replaying, removing entries) on tokio's blocking pool at
/// once, per cache handle. A cold epoch asks for hundreds of entries together; without a limit
/// each waiting one got a thread of its own (160 threads on 2 cores, all in the file system's
/// inode allocation at once).
const METADATA_TASKS: usize = 16;

/// Of the [`METADATA_TASKS`] slots, those background work (prefetch, preload) may hold at
/// once: the rest are always free for a reader's demand read. Without the split, a cold epoch
/// whose prefetcher had a few hundred new entries queued for creation made every demand
/// read's own entry wait behind all of them (the slots are first come, first served).
const BACKGROUND_METADATA_TASKS: usize = METADATA_TASKS * 3 / 4;

tokio::task_local! {
    /// Set (by [`DiskCache::in_background`]) for the duration of background work.
    static BACKGROUND: ();
}

/// A step of a block write (see the module documentation); the test hook stops before one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WriteStep {
    Reserve,
    Lock,
    WriteData,
    AppendRecord,
    Publish,
}

impl WriteStep {
    pub const ALL: [WriteStep; 5] = [
        WriteStep::Reserve,
        WriteStep::Lock,
        WriteStep::WriteData,
        WriteStep::AppendRecord,
        WriteStep::Publish,
    ];
}

/// What the test hook asks a write to do at a step.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookAction {
    Continue,
    /// Stop before the step, as if the process died there.
    Crash,
    /// Do half of the step's write (`WriteData`, `AppendRecord`), then stop.
    CrashMidway,
}

#[cfg(test)]
pub type WriteHook = Arc<dyn Fn(WriteStep) -> HookAction + Send + Sync>;

/// Counters since this handle was opened.
#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    crc_failures: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    write_skipped: AtomicU64,
    evictions: AtomicU64,
    evicted_bytes: AtomicU64,
    evict_in_use: AtomicU64,
    full: AtomicU64,
    /// Of `full`: refused because the filesystem's free space is at the floor kept free.
    free_floor: AtomicU64,
    no_space_errors: AtomicU64,
    io_errors: AtomicU64,
    /// Journal tails read back on a blocking thread.
    journal_replays: AtomicU64,
    /// Reads of known-good blocks served as just the bytes asked for.
    verified_reads: AtomicU64,
}

/// A snapshot of a live cache's state and counters (`riffle stats`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Entries known to hold bytes (from the scan, loaded, or written here).
    pub objects: u64,
    /// Entries whose every block is present.
    pub complete_objects: u64,
    /// Blocks present in the known entries.
    pub blocks: u64,
    /// Bytes charged (see the module documentation); never above `limit`.
    pub bytes: u64,
    pub limit: u64,
    /// Entries with files open in this process.
    pub open_objects: u64,
    pub pinned_objects: u64,
    pub hits: u64,
    pub misses: u64,
    pub crc_failures: u64,
    pub writes: u64,
    pub write_bytes: u64,
    /// Writes not done because another writer (here or in another process) had the block.
    pub write_skipped: u64,
    pub evictions: u64,
    pub evicted_bytes: u64,
    /// Eviction candidates skipped because another process uses them.
    pub evict_in_use: u64,
    /// Writes refused because nothing could be evicted.
    pub full: u64,
    /// Reads of blocks known good to this process served as just the bytes asked for,
    /// without reading the whole block and checking its CRC ([`DiskCache::read_verified_on_ring`]).
    pub verified_reads: u64,
    /// Of `full`: refused because the filesystem's free space is at the floor kept free
    /// (`--cache-min-free`), whatever the cache's own budget.
    pub free_floor_refusals: u64,
    /// Bytes of the filesystem always left free.
    pub min_free: u64,
    pub no_space_errors: u64,
    pub io_errors: u64,
    pub scan_complete: bool,
    /// See [`IndexMemory`].
    pub index_memory: IndexMemory,
}

/// Memory the cache's in-memory index spends (a structural count of its tables).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexMemory {
    pub entries: u64,
    pub open_entries: u64,
    /// Bytes of the table of all known entries (idle open entries included) and the
    /// eviction policies.
    pub table_bytes: u64,
    /// Bytes of the open entries in use or of more than one block (`Arc<OpenEntry>`s with
    /// their block tables and descriptors' `Arc`s).
    pub open_bytes: u64,
    /// `(table_bytes + open_bytes) / entries`.
    pub per_object: u64,
    /// `table_bytes / entries`: what an entry costs once its files are closed.
    pub per_closed_object: u64,
}

/// A complete entry's data file, open, and where it is (for readahead by path later, when
/// the descriptor is long closed).
#[derive(Debug)]
pub struct DataFile {
    pub file: File,
    pub path: PathBuf,
}

/// One known entry: 64 bytes, in a slot of the [`Table`] (see "Memory" in the `cache` module
/// documentation).
#[derive(Debug, Default)]
struct Record {
    key: EntryKey,
    /// Bytes charged to it (including reservations of writes in progress).
    bytes: u64,
    /// Its files: closed, open and idle, or open and in use.
    files: Files,
    pins: u32,
    /// Writes in progress.
    writes: u16,
    flags: u8,
}

/// The slot holds a known entry.
const LIVE: u8 = 1;
/// Every block is present.
const COMPLETE: u8 = 2;
/// Chosen as a victim; its files are being removed.
const EVICTING: u8 = 4;
/// The open entry in `files` holds one use on behalf of all pins (a shared lock on its
/// journal: no other process evicts it).
const PIN_HELD: u8 = 8;

impl Record {
    fn flag(&self, f: u8) -> bool {
        self.flags & f != 0
    }

    fn set(&mut self, f: u8, on: bool) {
        if on {
            self.flags |= f;
        } else {
            self.flags &= !f;
        }
    }

    fn complete(&self) -> bool {
        self.flag(COMPLETE)
    }

    /// Keeps the open entry as idle files if nothing uses it (see `entry`, "Idle form").
    fn settle(&mut self) {
        if self.pins == 0 && self.writes == 0 && !self.flag(PIN_HELD) {
            self.files.settle();
        }
    }
}

/// Slots available: the policies use the two highest `u32` values as list markers.
const MAX_SLOTS: Slot = u32::MAX - 2;

/// The known entries: records in numbered slots (a slot is reused once its entry is gone), and
/// an index from key to slot. The eviction policies name entries by slot.
#[derive(Debug, Default)]
struct Table {
    records: Chunked<Record>,
    index: KeyIndex,
    free: Vec<Slot>,
    /// Slots ever used: the next new one.
    high: Slot,
}

fn key_in(records: &Chunked<Record>, at: Slot) -> EntryKey {
    records.get(at).map_or_else(EntryKey::default, |r| r.key)
}

impl SlotKeys for Table {
    fn key_of(&self, at: Slot) -> EntryKey {
        key_in(&self.records, at)
    }
}

impl Table {
    fn len(&self) -> usize {
        self.index.len()
    }

    fn find(&self, key: &EntryKey) -> Option<Slot> {
        let records = &self.records;
        self.index.get(key, |at| key_in(records, at))
    }

    fn at(&self, at: Slot) -> Option<&Record> {
        self.records.get(at).filter(|r| r.flag(LIVE))
    }

    fn at_mut(&mut self, at: Slot) -> Option<&mut Record> {
        self.records.get_mut(at).filter(|r| r.flag(LIVE))
    }

    fn get(&self, key: &EntryKey) -> Option<&Record> {
        self.at(self.find(key)?)
    }

    fn get_mut(&mut self, key: &EntryKey) -> Option<&mut Record> {
        let at = self.find(key)?;
        self.at_mut(at)
    }

    /// A new record for `key` (not known yet); `None` when every slot is taken.
    fn add(&mut self, key: EntryKey) -> Option<Slot> {
        let at = match self.free.pop() {
            Some(at) => at,
            None if self.high < MAX_SLOTS => {
                self.high += 1;
                self.high - 1
            }
            None => return None,
        };
        *self.records.grow_to(at) = Record {
            key,
            flags: LIVE,
            ..Record::default()
        };
        let records = &self.records;
        self.index.insert(&key, at, |s| key_in(records, s));
        Some(at)
    }

    /// Removes the record in slot `at` and gives it back (its files are the caller's to close,
    /// outside the state lock).
    fn take(&mut self, at: Slot) -> Option<Record> {
        let key = self.at(at)?.key;
        let records = &self.records;
        self.index.remove(&key, |s| key_in(records, s));
        let record = std::mem::take(self.records.get_mut(at)?);
        self.free.push(at);
        Some(record)
    }

    fn iter(&self) -> impl Iterator<Item = &Record> {
        (0..self.high).filter_map(|at| self.at(at))
    }

    /// Heap bytes of the records, the index and the free list (not of open entries).
    fn heap_bytes(&self) -> usize {
        self.records.heap_bytes() + self.index.heap_bytes() + self.free.capacity() * 4
    }
}

/// The slot of `key`, with a new record (made known to the eviction policy) if there is none;
/// `None` only when every slot is taken. Takes the two fields rather than the whole state so
/// callers keep using the others.
fn known_entry(
    table: &mut Table,
    policy: &mut Box<dyn EvictionPolicy>,
    key: EntryKey,
) -> Option<Slot> {
    if let Some(at) = table.find(&key) {
        return Some(at);
    }
    let at = table.add(key)?;
    policy.insert(
        at,
        &EntryInfo {
            key,
            bytes: 0,
            last_used: None,
        },
        table,
    );
    Some(at)
}

/// Takes `bytes` off the reservation of `key`.
fn unreserve(reserved: &mut HashMap<EntryKey, u64>, key: EntryKey, bytes: u64) {
    if let Some(r) = reserved.get_mut(&key) {
        *r = r.saturating_sub(bytes);
        if *r == 0 {
            reserved.remove(&key);
        }
    }
}

/// What a closed entry of one present block keeps for reading it by name (see
/// `entry::OneBlock`), when `key` is one.
fn closed_one_block(table: &Table, key: EntryKey) -> Option<entry::OneBlock> {
    let e = table.get(&key)?;
    e.complete().then(|| e.files.closed_one_block()).flatten()
}

/// How many blocks at the start of `blocks` are known good (`VERIFIED`) in `open`.
fn verified_prefix_of(open: &OpenEntry, blocks: std::ops::Range<u64>) -> u64 {
    let b = open.blocks.lock();
    blocks.take_while(|&i| b.is_verified(i)).count() as u64
}

/// Whether a block read back is whole (`len` bytes) and matches its CRC32C.
fn intact(data: &[u8], len: u64, crc: u32) -> bool {
    data.len() as u64 == len && crc32c::crc32c(data) == crc
}

/// `len` bytes of `file` at `offset` read on the calling thread, when they are all there and
/// match `crc`.
fn read_checked(file: &File, offset: u64, len: u64, crc: u32) -> Option<Bytes> {
    let mut buf = vec![0u8; len as usize];
    match file.read_at(&mut buf, offset) {
        Ok(n) if intact(&buf[..n], len, crc) => Some(Bytes::from(buf)),
        _ => None,
    }
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

/// Releases a reservation unless committed.
struct Reservation<'a> {
    cache: &'a DiskCache,
    key: EntryKey,
    bytes: u64,
    done: bool,
}

impl Reservation<'_> {
    fn commit(mut self) {
        let mut st = self.cache.state.lock();
        st.pending = st.pending.saturating_sub(self.bytes);
        unreserve(&mut st.reserved, self.key, self.bytes);
        self.done = true;
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut st = self.cache.state.lock();
        st.pending = st.pending.saturating_sub(self.bytes);
        st.used = st.used.saturating_sub(self.bytes);
        if let Some(e) = st.table.get_mut(&self.key) {
            e.bytes = e.bytes.saturating_sub(self.bytes);
        }
        unreserve(&mut st.reserved, self.key, self.bytes);
    }
}

/// Ends a write's use of an entry.
struct WriteUse<'a> {
    cache: &'a DiskCache,
    entry: Arc<OpenEntry>,
    index: u32,
    writing: bool,
}

impl Drop for WriteUse<'_> {
    fn drop(&mut self) {
        if self.writing {
            self.entry
                .blocks
                .lock()
                .writing
                .retain(|&i| i != self.index);
        }
        self.entry.release_use();
        let mut st = self.cache.state.lock();
        if let Some(e) = st.table.get_mut(&self.entry.key) {
            e.writes = e.writes.saturating_sub(1);
        }
    }
}

/// Releases an OFD range lock.
struct RangeLock<'a> {
    file: &'a File,
    start: u64,
    len: u64,
}

impl Drop for RangeLock<'_> {
    fn drop(&mut self) {
        let _ = sys::try_range_lock(self.file, self.start, self.len, false);
    }
}

/// Keeps an object's entry from being evicted, here and (once its files are open) in every
/// process sharing the directory. Dropping it unpins.
#[derive(Debug)]
pub struct PinGuard {
    cache: Weak<DiskCache>,
    key: EntryKey,
}

impl PinGuard {
    /// Tells the eviction policy of a use of the pinned entry now. An open pins before it
    /// tells the prefetcher (so the entry cannot be evicted in between, when the prefetcher
    /// no longer counts it as needed) and calls this after, so the policy asks its oracle
    /// again and sees the file opened.
    pub fn used(&self) {
        if let Some(cache) = self.cache.upgrade() {
            let mut guard = cache.state.lock();
            let st = &mut *guard;
            if let Some(at) = st.table.find(&self.key) {
                st.policy.touch(at, &st.table);
            }
        }
    }
}

impl Drop for PinGuard {
    fn drop(&mut self) {
        if let Some(cache) = self.cache.upgrade() {
            cache.unpin(self.key);
        }
    }
}

/// Blocks present in one object's entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectStatus {
    pub blocks_present: u64,
    pub blocks_total: u64,
    pub complete: bool,
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
            .spawn(move || scan::run(&root, weak));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "could not start the cache scan; existing entries are found on use");
            cache.finish_scan();
        }
        Ok(cache)
    }

    pub fn dir(&self) -> &Path {
        &self.root
    }

    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// The byte budget in force (a percentage resolved at open).
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Blocks at most in an object of `size` bytes.
    pub fn block_count(&self, size: u64) -> u64 {
        format::block_count(size, self.block_size)
    }

    /// Blocks until the start-up scan of existing entries has finished.
    pub fn wait_for_scan(&self) {
        let mut done = self.scan_done.lock();
        while !*done {
            self.scan_cv.wait(&mut done);
        }
    }

    pub(super) fn finish_scan(&self) {
        *self.scan_done.lock() = true;
        self.scan_cv.notify_all();
    }

    /// Adds entries found by the scan (ones already known here are left alone).
    pub(super) fn add_scanned(&self, found: Vec<scan::Found>) {
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

    #[cfg(test)]
    pub(crate) fn set_write_hook(&self, hook: Option<WriteHook>) {
        *self.hook.lock() = hook;
    }

    #[cfg(test)]
    fn hook(&self, step: WriteStep) -> HookAction {
        self.hook
            .lock()
            .as_ref()
            .map_or(HookAction::Continue, |h| h(step))
    }

    /// Runs the test hook before `step`: `Ok(true)` to do only half of the step.
    #[cfg(test)]
    fn step(&self, step: WriteStep) -> Result<bool, CacheError> {
        match self.hook(step) {
            HookAction::Continue => Ok(false),
            HookAction::Crash => Err(CacheError::SimulatedCrash(step)),
            HookAction::CrashMidway => Ok(true),
        }
    }

    #[cfg(not(test))]
    #[inline(always)]
    fn step(&self, _step: WriteStep) -> Result<bool, CacheError> {
        Ok(false)
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

    /// The open entry of `key` (an object of `size` bytes), if its files are open here and it
    /// is alive; made from the idle files if need be (no I/O). The caller calls
    /// [`Self::settle`] once done with it.
    fn cached_open(&self, key: EntryKey, size: u64) -> Option<Arc<OpenEntry>> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let at = st.table.find(&key)?;
        let e = st.table.at_mut(at)?;
        if e.files.is_dead() {
            return None;
        }
        let open = e.files.activate(key, size, self.block_size)?;
        st.open_lru.use_now(at);
        Some(open)
    }

    /// After a use of `key`'s open entry (every `Arc` of it the use took dropped): keeps it as
    /// idle files when nothing else uses it (see `entry`, "Idle form").
    fn settle(&self, key: &EntryKey) {
        if let Some(e) = self.state.lock().table.get_mut(key) {
            e.settle();
        }
    }

    /// Loads (or with `create`, creates) the entry of `id` and installs it.
    async fn load(
        &self,
        id: &ObjectIdentity,
        key: EntryKey,
        create: bool,
    ) -> Result<Option<Arc<OpenEntry>>, CacheError> {
        if let Some(o) = self.cached_open(key, id.size) {
            return Ok(Some(o));
        }
        let (root, bs, direct, idc) = (
            self.root.clone(),
            self.block_size,
            self.direct_io,
            id.clone(),
        );
        let loaded = self.blocking(move || -> Result<Option<OpenEntry>, CacheError> {
            for _ in 0..4 {
                match OpenEntry::open_existing(&root, &idc, key, bs, direct) {
                    Ok(Some(e)) => return Ok(Some(e)),
                    Ok(None) if !create => return Ok(None),
                    Ok(None) => {
                        if let Some(e) = OpenEntry::create(&root, &idc, key, bs, direct)
                            .map_err(|e| io_err("creating a cache entry", e))?
                        {
                            return Ok(Some(e));
                        }
                    }
                    Err(LoadError::Io(e)) => return Err(io_err("opening a cache entry", e)),
                    Err(e @ (LoadError::Stale(_) | LoadError::Mismatch)) => {
                        if !create {
                            return Ok(None);
                        }
                        tracing::info!(entry = %key, error = %e, "replacing an unusable cache entry");
                        match entry::evict_files(&root, key)
                            .map_err(|e| io_err("removing a stale cache entry", e))?
                        {
                            Evicted::InUse => return Err(CacheError::Busy),
                            Evicted::Removed | Evicted::Gone => {}
                        }
                    }
                }
            }
            Err(CacheError::Busy)
        })
        .await??;
        Ok(loaded.map(|e| self.install(e)))
    }

    /// Makes a freshly opened entry the open entry of its key (or returns the one another task
    /// opened first), and closes files of the least recently used entries beyond the cap.
    fn install(&self, fresh: OpenEntry) -> Arc<OpenEntry> {
        let key = fresh.key;
        let charged = fresh.charged_bytes();
        let complete = fresh.blocks.lock().is_complete();
        let fresh = Arc::new(fresh);
        // Files and locks are let go only after the state lock is released (system calls).
        let mut released = None;
        let mut closed: Vec<Files> = Vec::new();
        let pinned = {
            let mut guard = self.state.lock();
            let st = &mut *guard;
            let Some(at) = known_entry(&mut st.table, &mut st.policy, key) else {
                return fresh; // every slot taken: used, but not kept
            };
            let Some(e) = st.table.at_mut(at) else {
                return fresh;
            };
            match &e.files {
                Files::Active(o) if !o.is_dead() => return o.clone(),
                Files::Active(_) => {
                    // Evicted by another process: the fresh files replace the dead ones.
                    st.open_count -= 1;
                    if e.flag(PIN_HELD) {
                        released = e.files.active().cloned();
                        e.set(PIN_HELD, false);
                    }
                }
                Files::Idle { .. } => {
                    // Opened here meanwhile: use those files (the fresh ones are closed).
                    if let Some(o) = e.files.activate(key, fresh.size, self.block_size) {
                        st.open_lru.use_now(at);
                        return o;
                    }
                    st.open_count -= 1; // replaced below
                }
                Files::Closed { .. } => {}
            }
            if charged > e.bytes {
                st.used += charged - e.bytes;
                e.bytes = charged;
                st.policy.resize(at, charged);
            }
            e.set(COMPLETE, complete);
            let pinned = e.pins > 0 && !e.flag(PIN_HELD);
            closed.push(std::mem::replace(
                &mut e.files,
                Files::Active(fresh.clone()),
            ));
            st.open_count += 1;
            st.open_lru.add(at, false);
            // Close the files of idle entries beyond the cap.
            while st.open_count > self.max_open {
                let table = &st.table;
                let Some(victim) = st.open_lru.coldest(&mut |s| {
                    s != at
                        && table
                            .at(s)
                            .is_some_and(|e| e.pins == 0 && e.writes == 0 && e.files.is_open())
                }) else {
                    break;
                };
                st.open_lru.take(victim);
                if let Some(v) = st.table.at_mut(victim) {
                    closed.push(v.files.close());
                    st.open_count -= 1;
                }
            }
            pinned
        };
        if let Some(o) = released {
            o.release_use();
        }
        drop(closed);
        if pinned {
            self.hold_for_pins(fresh.clone());
        }
        fresh
    }

    /// Forgets a dead open entry (evicted by another process) so the next use reloads: its
    /// files are gone, and so are the bytes charged for them (reservations in progress stay).
    fn forget_open(&self, dead: &Arc<OpenEntry>) {
        let held = {
            let mut guard = self.state.lock();
            let st = &mut *guard;
            let key = dead.key;
            let Some(at) = st.table.find(&key) else {
                return;
            };
            let reserved = st.reserved.get(&key).copied().unwrap_or(0);
            let Some(e) = st.table.at_mut(at) else {
                return;
            };
            if !e.files.active().is_some_and(|o| Arc::ptr_eq(o, dead)) {
                return;
            }
            // Not the last reference: the caller holds `dead`.
            e.files = Files::default();
            e.set(COMPLETE, false);
            let held = e.flag(PIN_HELD);
            e.set(PIN_HELD, false);
            st.used = st.used.saturating_sub(e.bytes.saturating_sub(reserved));
            e.bytes = reserved;
            let unused = e.bytes == 0 && e.pins == 0 && e.writes == 0;
            st.open_count -= 1;
            st.open_lru.take(at);
            if unused {
                st.table.take(at);
                st.policy.remove(at);
            }
            held
        };
        // The pins' use of the dead entry ends here; the next load takes a new one.
        if held {
            dead.release_use();
        }
    }

    /// Runs `work` as background work: the metadata tasks it causes (creating and opening
    /// entries) take at most [`BACKGROUND_METADATA_TASKS`] of the slots, so demand reads
    /// never queue behind them.
    pub async fn in_background<T>(work: impl std::future::Future<Output = T>) -> T {
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

    /// Replays the journal's new tail on a blocking thread; updates the accounting.
    async fn refresh(&self, entry: &Arc<OpenEntry>) -> Result<(), CacheError> {
        if !entry.journal_grew() {
            return Ok(());
        }
        self.counters
            .journal_replays
            .fetch_add(1, Ordering::Relaxed);
        let e2 = entry.clone();
        let appeared = self
            .blocking(move || e2.refresh_blocking())
            .await?
            .map_err(|e| io_err("reading a cache journal", e))?;
        if appeared.is_empty() {
            return Ok(());
        }
        let added: u64 = appeared
            .iter()
            .map(|&i| {
                format::block_len(entry.size, self.block_size, i as u64).next_multiple_of(4096)
                    + format::RECORD_LEN as u64
            })
            .sum();
        let complete = entry.blocks.lock().is_complete();
        let mut st = self.state.lock();
        let st = &mut *st;
        if let Some(e) = st.table.get_mut(&entry.key) {
            e.bytes += added;
            e.set(COMPLETE, complete);
            st.used += added;
        }
        Ok(())
    }

    /// Block `index` of `id`, or `None` on a miss (absent, or dropped because its CRC did not
    /// match). Errors are failures of the cache disk: read from the store instead.
    pub async fn read_block(
        &self,
        id: &ObjectIdentity,
        index: u64,
    ) -> Result<Option<Bytes>, CacheError> {
        let result = self.read_inner(id, index).await;
        match &result {
            Ok(Some(_)) => self.counters.hits.fetch_add(1, Ordering::Relaxed),
            _ => self.counters.misses.fetch_add(1, Ordering::Relaxed),
        };
        if let Err(e) = &result {
            self.report(e);
        }
        result
    }

    async fn read_inner(
        &self,
        id: &ObjectIdentity,
        index: u64,
    ) -> Result<Option<Bytes>, CacheError> {
        let len = self.block_len(id, index)?;
        let key = id.entry_key();
        let Some(entry) = self.load(id, key, false).await? else {
            return Ok(None);
        };
        let read = self.read_open(id, &entry, index, len).await;
        drop(entry);
        // One trip to the state: the policy hears of the hit, and the entry goes idle.
        let mut guard = self.state.lock();
        let st = &mut *guard;
        if let Some(at) = st.table.find(&key) {
            if matches!(read, Ok(Some(_))) {
                st.policy.touch(at, &st.table);
            }
            if let Some(e) = st.table.at_mut(at) {
                e.settle();
            }
        }
        read
    }

    /// [`Self::read_inner`] once the entry is open.
    async fn read_open(
        &self,
        id: &ObjectIdentity,
        entry: &Arc<OpenEntry>,
        index: u64,
        len: u64,
    ) -> Result<Option<Bytes>, CacheError> {
        let mut crc = entry.blocks.lock().crc(index);
        if crc.is_none() {
            self.refresh(entry).await?;
            crc = entry.blocks.lock().crc(index);
        }
        let Some(crc) = crc else {
            return Ok(None);
        };
        let offset = index * self.block_size;
        let file = entry.file_for_reading(len);
        let data = match self.ring.read(file, offset, len as usize).await {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Bytes::new(),
            Err(e) => return Err(io_err("reading a cached block", e)),
        };
        if !intact(&data, len, crc) {
            self.drop_block(id, entry, index, crc).await;
            return Ok(None);
        }
        entry.blocks.lock().set_verified(index, crc);
        Ok(Some(data))
    }

    /// Reads block `index` of `id` without a task, when that needs no metadata I/O: the entry
    /// is open here and the block's CRC is known. The read goes to the I/O thread, and `done`
    /// runs there with the bytes once their CRC matched, or with `None` when the read failed
    /// or the bytes did not match (the caller then takes the task path, [`Self::read_block`],
    /// which reads again and drops or reports what is wrong). Gives `done` back, uncalled,
    /// when the block cannot be read this way. `done` runs on the I/O thread: it must be short.
    pub fn read_block_on_ring<F>(
        self: &Arc<Self>,
        id: &ObjectIdentity,
        index: u64,
        done: F,
    ) -> Result<(), F>
    where
        F: FnOnce(Option<Bytes>) + Send + 'static,
    {
        let Ok(len) = self.block_len(id, index) else {
            return Err(done);
        };
        let key = id.entry_key();
        let Some((entry, crc)) = self.open_for_read(key, id.size, index) else {
            return Err(done);
        };
        let this = self.clone();
        let file = entry.file_for_reading(len).clone();
        self.ring
            .read_then(file, index * self.block_size, len as usize, move |read| {
                let data = match read {
                    Ok(data) if intact(&data, len, crc) => Some(data),
                    _ => None,
                };
                if data.is_some() {
                    entry.blocks.lock().set_verified(index, crc);
                }
                // The ring let go of the descriptor before calling: with this `Arc` gone,
                // the entry can go idle.
                drop(entry);
                this.finish_read(key, data.is_some());
                done(data);
            });
        Ok(())
    }

    /// Block `index` of `id` read on the calling thread (a FUSE thread), when it is a short
    /// block: read through the buffered descriptor, a few pages that are usually in the page
    /// cache already or on their way (a lookup of a small cached file starts a `readahead`
    /// of it). Waiting for them here, as a local file system's reader would, costs less than
    /// handing the read to the ring thread and the reply back: W1's warm epoch without
    /// passthrough went from 0.75x to 0.83-0.90x of local disk (medians of 6-12 alternated
    /// rounds). A page-cache-only read (`RWF_NOWAIT`) found half the blocks still being read
    /// and gave 0.78x. `None` for a whole block (read with `O_DIRECT` on the ring), one not
    /// present or not open here, and one that fails its read or CRC check: the caller takes
    /// [`Self::read_block_on_ring`], which reports and drops a block that fails its CRC.
    pub fn read_short_block_here(&self, id: &ObjectIdentity, index: u64) -> Option<Bytes> {
        let len = self.block_len(id, index).ok()?;
        if len % ALIGN as u64 == 0 {
            return None; // read with O_DIRECT: not through the page cache
        }
        let key = id.entry_key();
        let Some((entry, crc)) = self.open_for_read(key, id.size, index) else {
            return self.read_closed_block(key, len);
        };
        let data = read_checked(
            entry.file_for_reading(len),
            index * self.block_size,
            len,
            crc,
        );
        if data.is_some() {
            entry.blocks.lock().set_verified(index, crc);
        }
        drop(entry);
        self.finish_read(key, data.is_some());
        data
    }

    /// [`Self::read_short_block_here`] of an entry whose files are closed, by the data file's
    /// name and against the CRC kept for it ([`entry::OneBlock`]); `None` (the caller reloads
    /// the entry) when it has none, the file is gone, or the bytes fail the check.
    fn read_closed_block(&self, key: EntryKey, len: u64) -> Option<Bytes> {
        let one = closed_one_block(&self.state.lock().table, key)?;
        let file = File::open(key.data_path(&self.root, one.nonce)).ok()?;
        let data = read_checked(&file, 0, len, one.crc);
        drop(file);
        if data.is_some() {
            self.finish_read(key, true);
        }
        data
    }

    /// Reads bytes `range` of `id` (within the object) straight from its data file, through
    /// the page cache, when every block the range touches is present and known good to this
    /// process (the entry's `VERIFIED` marks, see the `entry` module): just the bytes asked
    /// for, with no CRC to check, as a local file system would read them and as FUSE
    /// passthrough reads a file whose blocks are all known good. The read goes to the I/O
    /// thread (a buffered read that waits for the disk must not hold up a FUSE thread) and
    /// `done` runs there with the bytes, or with `None` if the read failed or came up short
    /// (the caller then reads the blocks the checked way). Gives `done` back, uncalled, when
    /// some block is absent, not known good, or the entry is not open here.
    ///
    /// A block read whole and checked costs a whole block of disk reads and a CRC for every
    /// read that misses memory; random reads of a few KiB to 1 MiB into a large cached file
    /// (W3) read 1-2 MiB each that way.
    pub fn read_verified_on_ring<F>(
        self: &Arc<Self>,
        id: &ObjectIdentity,
        range: std::ops::Range<u64>,
        done: F,
    ) -> Result<(), F>
    where
        F: FnOnce(Option<Bytes>) + Send + 'static,
    {
        if range.is_empty() || range.end > id.size {
            return Err(done);
        }
        let blocks = range.start / self.block_size..range.end.div_ceil(self.block_size);
        let key = id.entry_key();
        let entry = {
            let mut guard = self.state.lock();
            let st = &mut *guard;
            let Some(at) = st.table.find(&key) else {
                return Err(done);
            };
            let Some(open) = st.table.at(at).and_then(|e| e.files.active()).cloned() else {
                return Err(done);
            };
            if open.is_dead()
                || verified_prefix_of(&open, blocks.clone()) < blocks.end - blocks.start
            {
                return Err(done);
            }
            st.open_lru.use_now(at);
            open
        };
        let this = self.clone();
        let file = entry.data.clone();
        let len = (range.end - range.start) as usize;
        self.ring.read_then(file, range.start, len, move |read| {
            let data = read.ok().filter(|d| d.len() == len);
            drop(entry);
            if data.is_some() {
                this.counters.verified_reads.fetch_add(1, Ordering::Relaxed);
            }
            this.finish_read(key, data.is_some());
            done(data);
        });
        Ok(())
    }

    /// After a block read of `key`: a hit touches the entry for eviction and counts; either
    /// way the entry may go idle again.
    fn finish_read(&self, key: EntryKey, hit: bool) {
        {
            let mut guard = self.state.lock();
            let st = &mut *guard;
            if let Some(at) = st.table.find(&key) {
                if hit {
                    st.policy.touch(at, &st.table);
                }
                if let Some(e) = st.table.at_mut(at) {
                    e.settle();
                }
            }
        }
        if hit {
            self.counters.hits.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The open entry of `key` and the CRC of its block `index`, when it is open here and the
    /// block present (an idle entry is made an open one only then).
    fn open_for_read(&self, key: EntryKey, size: u64, index: u64) -> Option<(Arc<OpenEntry>, u32)> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let at = st.table.find(&key)?;
        let e = st.table.at_mut(at)?;
        if e.files.is_dead() {
            return None;
        }
        let crc = e.files.crc(index)?;
        let open = e.files.activate(key, size, self.block_size)?;
        st.open_lru.use_now(at);
        Some((open, crc))
    }

    /// Drops a block whose bytes did not match their CRC: in memory, then in the journal.
    async fn drop_block(&self, id: &ObjectIdentity, entry: &Arc<OpenEntry>, index: u64, crc: u32) {
        self.counters.crc_failures.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(key = %id.key, block = index, "cached block failed its CRC32C check; dropped, fetching it again");
        {
            let mut b = entry.blocks.lock();
            if b.crc(index) != Some(crc) {
                return; // rewritten meanwhile
            }
            b.apply(index as u32, RecordKind::Dropped);
        }
        {
            let mut st = self.state.lock();
            if let Some(e) = st.table.get_mut(&entry.key) {
                e.set(COMPLETE, false);
            }
        }
        let rec = format::encode_record(index as u32, RecordKind::Dropped);
        if let Err(e) = self
            .ring
            .write(&entry.idx, 0, IoBuf::Bytes(Bytes::copy_from_slice(&rec)))
            .await
        {
            tracing::debug!(error = %e, "could not journal a dropped block");
        }
    }

    /// Stores block `index` of `id` (exactly its length: the last block may be short) before
    /// returning (written, not `fdatasync`ed: see the module documentation). `Ok(())` also
    /// when the block was already there or another writer had it. Errors: [`CacheError::Full`]
    /// (the budget cannot make room), [`CacheError::Busy`], or a failure of the cache disk; in
    /// every case the caller simply serves the bytes it has.
    pub async fn write_block(
        &self,
        id: &ObjectIdentity,
        index: u64,
        data: Bytes,
    ) -> Result<(), CacheError> {
        let key = id.entry_key();
        let result = self.write_inner(id, key, index, data).await;
        // Every `Arc` of the entry the write took is gone: it can go idle.
        self.settle(&key);
        match &result {
            Err(CacheError::Full) => {
                self.counters.full.fetch_add(1, Ordering::Relaxed);
            }
            Err(CacheError::Busy) => {
                self.counters.write_skipped.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => self.report(e),
            Ok(()) => {}
        }
        result
    }

    /// Opens (creating) the entry and becomes a writing user of it.
    async fn begin_write(
        &self,
        id: &ObjectIdentity,
        key: EntryKey,
    ) -> Result<Arc<OpenEntry>, CacheError> {
        for _ in 0..4 {
            let Some(entry) = self.load(id, key, true).await? else {
                return Err(CacheError::Busy);
            };
            {
                let mut st = self.state.lock();
                match st.table.get_mut(&key) {
                    Some(e) if !e.flag(EVICTING) && e.writes < u16::MAX => e.writes += 1,
                    _ => return Err(CacheError::Busy),
                }
            }
            let used = entry.acquire_use();
            match used {
                Ok(Use::Acquired) => return Ok(entry),
                other => {
                    if let Some(e) = self.state.lock().table.get_mut(&key) {
                        e.writes = e.writes.saturating_sub(1);
                    }
                    match other {
                        Ok(Use::Dead) => self.forget_open(&entry),
                        Ok(_) => return Err(CacheError::Busy),
                        Err(e) => return Err(io_err("locking a cache entry", e)),
                    }
                }
            }
        }
        Err(CacheError::Busy)
    }

    async fn write_inner(
        &self,
        id: &ObjectIdentity,
        key: EntryKey,
        index: u64,
        data: Bytes,
    ) -> Result<(), CacheError> {
        let len = self.block_len(id, index)?;
        if data.len() as u64 != len {
            return Err(CacheError::Invalid(format!(
                "block {index} has {} bytes, expected {len}",
                data.len()
            )));
        }
        self.step(WriteStep::Reserve)?;
        let entry = self.begin_write(id, key).await?;
        let mut guard = WriteUse {
            cache: self,
            entry: entry.clone(),
            index: index as u32,
            writing: false,
        };
        {
            let mut b = entry.blocks.lock();
            if b.crc(index).is_some() || b.writing.contains(&(index as u32)) {
                return Ok(());
            }
            b.writing.push(index as u32);
            guard.writing = true;
        }
        let reservation = self.reserve(key, entry::charge(len)).await?;

        self.step(WriteStep::Lock)?;
        let offset = index * self.block_size;
        let locked = sys::try_range_lock(&entry.data, offset, len, true)
            .map_err(|e| io_err("locking a cache block", e))?;
        if !locked {
            return Err(CacheError::Busy);
        }
        let _range = RangeLock {
            file: &entry.data,
            start: offset,
            len,
        };
        self.refresh(&entry).await?;
        if entry.blocks.lock().crc(index).is_some() {
            return Ok(()); // another process just wrote it; the reservation is released
        }

        let half_data = self.step(WriteStep::WriteData)?;
        let crc = crc32c::crc32c(&data);
        let (file, buf) = match &entry.direct {
            Some(d) if len % ALIGN as u64 == 0 && !half_data => {
                (d, IoBuf::Aligned(AlignedBuf::copy_from(&data)))
            }
            _ if half_data => (&entry.data, IoBuf::Bytes(data.slice(..data.len() / 2))),
            _ => (&entry.data, IoBuf::Bytes(data)),
        };

        // The record goes to the ring with the block, chained: the ring appends it only once
        // the block is written, with no round trip back here in between. A simulated crash
        // halfway through the block, or before the record, writes the block alone.
        let record_step = if half_data {
            Err(CacheError::SimulatedCrash(WriteStep::WriteData))
        } else {
            self.step(WriteStep::AppendRecord)
        };
        let half = match record_step {
            Ok(half) => half,
            Err(crash) => {
                self.ring
                    .write(file, offset, buf)
                    .await
                    .map_err(|e| io_err("writing a cached block", e))?;
                return Err(crash);
            }
        };
        let rec = format::encode_record(index as u32, RecordKind::Present(crc));
        let rec = if half { &rec[..7] } else { &rec[..] };
        self.ring
            .write_then(
                (file, offset, buf),
                (&entry.idx, 0, IoBuf::Bytes(Bytes::copy_from_slice(rec))),
            )
            .await
            .map_err(|e| io_err("writing a cached block and its journal record", e))?;
        if half {
            return Err(CacheError::SimulatedCrash(WriteStep::AppendRecord));
        }
        entry.skip_own_record(index as u32);

        self.step(WriteStep::Publish)?;
        {
            // Written here from bytes just fetched: known good to this process, as
            // passthrough trusts a file whose blocks this daemon wrote.
            let mut b = entry.blocks.lock();
            b.apply(index as u32, RecordKind::Present(crc));
            b.set_verified(index, crc);
        }
        {
            // The block table is read again under the state lock: two writers of one entry
            // publish in either order, and the one that publishes last must not replace the
            // other's newer count with its own older one (an entry whose blocks were all
            // written then stayed "incomplete": no passthrough, no `is_complete`).
            let mut st = self.state.lock();
            let st = &mut *st;
            if let Some(at) = st.table.find(&key) {
                if let Some(e) = st.table.at_mut(at) {
                    e.set(COMPLETE, entry.blocks.lock().is_complete());
                }
                st.policy.filled(at, &st.table);
            }
        }
        reservation.commit();
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        self.counters.write_bytes.fetch_add(len, Ordering::Relaxed);
        Ok(())
    }

    /// Reserves `need` bytes for entry `key`, evicting others if needed (see the module
    /// documentation).
    async fn reserve(&self, key: EntryKey, need: u64) -> Result<Reservation<'_>, CacheError> {
        if need > self.limit {
            return Err(CacheError::Full);
        }
        // Rounds whose victims were all in use by other processes (bounded: they are moved to
        // the hot end, so a later round would pick them again).
        let mut stalls = 0;
        loop {
            let space =
                sys::fs_space(&self.root).map_err(|e| io_err("statvfs of the cache dir", e))?;
            let notified = self.evicted.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let victims = {
                let mut guard = self.state.lock();
                let st = &mut *guard;
                let over_budget = (st.used + need).saturating_sub(self.limit);
                let floor = self.min_free;
                let avail = space.avail.saturating_sub(st.pending);
                let over_floor = (floor + need).saturating_sub(avail);
                let deficit = over_budget.max(over_floor);
                if deficit == 0 {
                    // The writer made the entry known; should it be gone, the bytes are
                    // charged to a new record all the same (and released with it).
                    let Some(at) = known_entry(&mut st.table, &mut st.policy, key) else {
                        return Err(CacheError::Full);
                    };
                    if let Some(e) = st.table.at_mut(at) {
                        e.bytes += need;
                    }
                    st.used += need;
                    st.pending += need;
                    *st.reserved.entry(key).or_default() += need;
                    return Ok(Reservation {
                        cache: self,
                        key,
                        bytes: need,
                        done: false,
                    });
                }
                let mut victims = Vec::new();
                let mut freed = 0;
                let own = st.table.find(&key);
                while freed < deficit {
                    let table = &st.table;
                    let Some(v) = st.policy.victim(table, &mut |s| {
                        Some(s) != own
                            && table.at(s).is_some_and(|e| {
                                e.pins == 0 && e.writes == 0 && !e.flag(EVICTING) && e.bytes > 0
                            })
                    }) else {
                        break;
                    };
                    let Some(e) = st.table.at_mut(v) else {
                        break; // a policy naming a slot it was not given: stop here
                    };
                    e.set(EVICTING, true);
                    freed += e.bytes;
                    victims.push(e.key);
                }
                if victims.is_empty() && st.evicting == 0 {
                    tracing::debug!(
                        need,
                        used = st.used,
                        limit = self.limit,
                        avail,
                        "cache full: nothing can be evicted"
                    );
                    if over_floor > 0 {
                        self.counters.free_floor.fetch_add(1, Ordering::Relaxed);
                        if !self.floor_warned.swap(true, Ordering::Relaxed) {
                            tracing::warn!(
                                dir = %self.root.display(),
                                free = avail,
                                keep_free = floor,
                                "the cache's filesystem is down to the free space it must keep (--cache-min-free): blocks are served but not cached (counted in cache.free_floor_refusals)"
                            );
                        }
                    }
                    return Err(CacheError::Full);
                }
                st.evicting += victims.len();
                victims
            };
            if victims.is_empty() {
                // Others are evicting: wait for them, then look again.
                notified.await;
                continue;
            }
            if self.evict(victims).await == 0 {
                stalls += 1;
                if stalls >= MAX_STALLS {
                    return Err(CacheError::Full);
                }
            }
        }
    }

    /// Removes the victims' files and releases their bytes; returns how many went.
    async fn evict(&self, victims: Vec<EntryKey>) -> usize {
        let root = self.root.clone();
        let keys = victims.clone();
        let outcomes = self
            .blocking(move || {
                keys.iter()
                    .map(|&k| entry::evict_files(&root, k))
                    .collect::<Vec<_>>()
            })
            .await
            .unwrap_or_else(|e| {
                victims
                    .iter()
                    .map(|_| Err(io::Error::other(e.to_string())))
                    .collect()
            });
        let mut failures = Vec::new();
        let mut removed = 0;
        let mut gone = Vec::new();
        // The removed entries' files are closed after the state lock is released.
        let mut dropped = Vec::new();
        {
            let mut guard = self.state.lock();
            let st = &mut *guard;
            for (key, outcome) in victims.into_iter().zip(outcomes) {
                st.evicting -= 1;
                let at = st.table.find(&key);
                match outcome {
                    Ok(Evicted::Removed) | Ok(Evicted::Gone) => {
                        removed += 1;
                        gone.push(key);
                        let Some(at) = at else { continue };
                        let Some(e) = st.table.at_mut(at) else {
                            continue;
                        };
                        st.used = st.used.saturating_sub(e.bytes);
                        let files = std::mem::take(&mut e.files);
                        if files.is_open() {
                            if let Some(o) = files.active() {
                                o.mark_dead();
                            }
                            st.open_count -= 1;
                            st.open_lru.take(at);
                        }
                        if outcome.as_ref().ok() == Some(&Evicted::Removed) {
                            self.counters.evictions.fetch_add(1, Ordering::Relaxed);
                            self.counters
                                .evicted_bytes
                                .fetch_add(e.bytes, Ordering::Relaxed);
                        }
                        if e.pins > 0 {
                            // Pinned while it was being evicted: keep the record (and the
                            // policy's memory of it) for the entry's next life.
                            e.bytes = 0;
                            e.flags = LIVE;
                        } else {
                            st.table.take(at);
                            st.policy.remove(at);
                        }
                        dropped.push(files);
                    }
                    Ok(Evicted::InUse) => {
                        self.counters.evict_in_use.fetch_add(1, Ordering::Relaxed);
                        if let Some(at) = at {
                            if let Some(e) = st.table.at_mut(at) {
                                e.set(EVICTING, false);
                            }
                            st.policy.touch(at, &st.table);
                        }
                    }
                    Err(err) => {
                        if let Some(at) = at {
                            if let Some(e) = st.table.at_mut(at) {
                                e.set(EVICTING, false);
                            }
                            st.policy.touch(at, &st.table);
                        }
                        failures.push(err);
                    }
                }
            }
        }
        drop(dropped);
        for err in failures {
            self.report(&io_err("evicting a cache entry", err));
        }
        if !gone.is_empty() {
            if let Some(listener) = &*self.evicted_listener.lock() {
                listener(&gone);
            }
        }
        self.evicted.notify_waiters();
        removed
    }

    /// Calls `listener` with the keys of the entries this process evicts, after their files
    /// are removed (for whoever still holds one of those files open and should let go).
    pub fn on_evicted(&self, listener: impl Fn(&[EntryKey]) + Send + Sync + 'static) {
        *self.evicted_listener.lock() = Some(Box::new(listener));
    }

    /// How many blocks at the start of `blocks` are present and known good to this process,
    /// in an entry open here (no I/O): those [`Self::read_verified_on_ring`] would serve.
    pub fn verified_prefix(&self, id: &ObjectIdentity, blocks: std::ops::Range<u64>) -> u64 {
        let st = self.state.lock();
        match st.table.get(&id.entry_key()).and_then(|e| e.files.active()) {
            Some(open) if !open.is_dead() => verified_prefix_of(open, blocks),
            _ => 0,
        }
    }

    /// Whether block `index` of `id` is known here to be present (no I/O: blocks written by
    /// other processes since this process last looked are not seen; `read_block` sees them).
    pub fn has_block(&self, id: &ObjectIdentity, index: u64) -> bool {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let Some(at) = st.table.find(&id.entry_key()) else {
            return false;
        };
        let Some(e) = st.table.at(at) else {
            return false;
        };
        if !e.files.is_open() || e.files.is_dead() {
            return false;
        }
        let present = e.files.crc(index).is_some();
        st.open_lru.use_now(at);
        present
    }

    /// Journal tails this handle has read back on a blocking thread.
    #[cfg(test)]
    pub(crate) fn journal_replays(&self) -> u64 {
        self.counters.journal_replays.load(Ordering::Relaxed)
    }

    /// Whether every block of `id` is known here to be present (no I/O; see
    /// [`DiskCache::status`] to look at the disk).
    pub fn is_complete(&self, id: &ObjectIdentity) -> bool {
        let st = self.state.lock();
        st.table
            .get(&id.entry_key())
            .is_some_and(|e| e.complete() && !e.files.is_dead())
    }

    /// The entry's own open data file of `id` when every block of it is present and the entry
    /// is open in this process (no I/O, no new descriptor): what a readahead reads. `None` too
    /// when the cache's state is busy (this is only ever a hint, and never waits). The entry
    /// stays an open (not idle) one until its next use ends.
    pub fn open_data_file(&self, id: &ObjectIdentity) -> Option<Arc<File>> {
        let mut st = self.state.try_lock()?;
        let key = id.entry_key();
        let e = st.table.get_mut(&key)?;
        if !e.complete() || e.files.is_dead() {
            return None;
        }
        let open = e.files.activate(key, id.size, self.block_size)?;
        Some(open.data.clone())
    }

    /// The data file of `id` when its entry's files are closed here and it is an object of
    /// one block, present (see [`entry::OneBlock`]): what a readahead opens by name. No I/O;
    /// `None` too when the cache's state is busy (a hint never waits).
    pub fn closed_data_path(&self, id: &ObjectIdentity) -> Option<PathBuf> {
        let key = id.entry_key();
        let st = self.state.try_lock()?;
        let one = closed_one_block(&st.table, key)?;
        Some(key.data_path(&self.root, one.nonce))
    }

    /// Loads the entry of `id` from disk if needed (catching up with other processes) and
    /// reports its blocks; `None` if it has no entry.
    pub async fn status(&self, id: &ObjectIdentity) -> Result<Option<ObjectStatus>, CacheError> {
        self.status_of(id, false).await
    }

    /// Like [`status`](Self::status), but an object with no entry gets an empty one, for a
    /// caller about to fetch it and write its blocks: looking and creating then take one trip
    /// to the blocking pool, where the lookup and the first write would take one each.
    pub async fn status_or_create(
        &self,
        id: &ObjectIdentity,
    ) -> Result<Option<ObjectStatus>, CacheError> {
        self.status_of(id, true).await
    }

    async fn status_of(
        &self,
        id: &ObjectIdentity,
        create: bool,
    ) -> Result<Option<ObjectStatus>, CacheError> {
        let key = id.entry_key();
        let Some(entry) = self.load(id, key, create).await? else {
            return Ok(None);
        };
        let refreshed = self.refresh(&entry).await;
        let status = {
            let b = entry.blocks.lock();
            ObjectStatus {
                blocks_present: b.present() as u64,
                blocks_total: b.count(),
                complete: b.is_complete(),
            }
        };
        drop(entry);
        self.settle(&key);
        refreshed?;
        Ok(Some(status))
    }

    /// The complete data file of `id`, opened read-only, to back FUSE passthrough
    /// (`ReplyOpen::opened_passthrough`); `None` unless every block is present. The file is
    /// checked to be the object's size with no holes, so the kernel (which checks no CRC)
    /// can only read bytes this cache wrote. Pin the object for as long as the file is used.
    pub async fn open_complete(&self, id: &ObjectIdentity) -> Result<Option<DataFile>, CacheError> {
        let key = id.entry_key();
        let Some(entry) = self.load(id, key, false).await? else {
            return Ok(None);
        };
        let refreshed = self.refresh(&entry).await;
        let complete = entry.blocks.lock().is_complete();
        let path = entry.key.data_path(&self.root, entry.nonce);
        drop(entry);
        self.settle(&key);
        refreshed?;
        if !complete {
            return Ok(None);
        }
        let size = id.size;
        self.blocking(move || -> io::Result<Option<DataFile>> {
            let f = match File::open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(e),
            };
            let m = f.metadata()?;
            if m.len() != size || m.nlink() == 0 || (size > 0 && sys::first_hole(&f)? != size) {
                tracing::warn!(path = %path.display(), "a complete cache entry's data file has holes or a wrong size; not using it");
                return Ok(None);
            }
            Ok(Some(DataFile { file: f, path }))
        })
        .await?
        .map_err(|e| io_err("opening a complete cache file", e))
    }

    /// The data file of `id`'s complete entry when its files are open in this process: a
    /// duplicate of the descriptor the cache already holds, so no metadata task is needed.
    /// `None` when the entry is not open here or not complete (use [`Self::open_complete`]).
    /// Only for entries the caller knows to be whole and good (written or verified by this
    /// process): unlike `open_complete` it does not look for holes.
    pub fn complete_data_file(&self, id: &ObjectIdentity) -> Option<DataFile> {
        let key = id.entry_key();
        let entry = self.cached_open(key, id.size)?;
        let file = if entry.blocks.lock().is_complete() {
            // The descriptor's file size, not a path lookup: the entry's own file.
            entry
                .data
                .try_clone()
                .ok()
                .filter(|f| f.metadata().is_ok_and(|m| m.len() == id.size))
        } else {
            None
        };
        let path = entry.key.data_path(&self.root, entry.nonce);
        drop(entry);
        self.settle(&key);
        file.map(|file| DataFile { file, path })
    }

    /// Pins the entry of `id` (creating the in-memory record if it has none yet) until the
    /// guard is dropped: never evicted by this process, nor, while its files are open here, by
    /// any other (see the locking protocol).
    pub fn pin(self: &Arc<Self>, id: &ObjectIdentity) -> PinGuard {
        self.pin_with(id, true)
    }

    /// A pin that is not yet a use of the entry (the policy is not told; see
    /// [`PinGuard::used`]).
    pub fn pin_unused(self: &Arc<Self>, id: &ObjectIdentity) -> PinGuard {
        self.pin_with(id, false)
    }

    /// A pin for the blocks of `id` a GET just brought, held until they are written: keeps
    /// the entry's record (and with it the eviction policy's memory of the read that fetched
    /// them) from being dropped when the reader's own pin ends before the disk catches up.
    /// Unlike [`Self::pin`] it is not a use of the entry: the policy is not told.
    pub fn pin_for_fill(self: &Arc<Self>, id: &ObjectIdentity) -> PinGuard {
        self.pin_with(id, false)
    }

    fn pin_with(self: &Arc<Self>, id: &ObjectIdentity, is_use: bool) -> PinGuard {
        let key = id.entry_key();
        let unheld = {
            let mut guard = self.state.lock();
            let st = &mut *guard;
            let mut unheld = None;
            if let Some(at) = known_entry(&mut st.table, &mut st.policy, key) {
                if let Some(e) = st.table.at_mut(at) {
                    e.pins = e.pins.saturating_add(1);
                    if !e.flag(PIN_HELD) && !e.files.is_dead() {
                        unheld = e.files.activate(key, id.size, self.block_size);
                    }
                }
                if is_use {
                    st.policy.touch(at, &st.table);
                }
            }
            unheld
        };
        if let Some(open) = unheld {
            self.hold_for_pins(open);
        }
        PinGuard {
            cache: Arc::downgrade(self),
            key,
        }
    }

    /// Takes the use of `open` that an entry's pins share, unless another task took one first
    /// or the pins are gone. The use may lock the entry's journal (a system call), so it is
    /// taken with the state lock released, and the lock is taken again only to record it.
    fn hold_for_pins(&self, open: Arc<OpenEntry>) {
        let key = open.key;
        if open.acquire_use().ok() != Some(Use::Acquired) {
            drop(open);
            self.settle(&key);
            return;
        }
        let spare = {
            let mut st = self.state.lock();
            match st.table.get_mut(&key) {
                Some(e)
                    if e.pins > 0
                        && !e.flag(PIN_HELD)
                        && e.files.active().is_some_and(|o| Arc::ptr_eq(o, &open)) =>
                {
                    e.set(PIN_HELD, true);
                    None
                }
                _ => Some(open),
            }
        };
        if let Some(open) = spare {
            open.release_use();
            drop(open);
            self.settle(&key);
        }
    }

    fn unpin(&self, key: EntryKey) {
        let mut released = None;
        {
            let mut guard = self.state.lock();
            let st = &mut *guard;
            let Some(at) = st.table.find(&key) else {
                return;
            };
            let mut forget = false;
            if let Some(e) = st.table.at_mut(at) {
                e.pins = e.pins.saturating_sub(1);
                if e.pins == 0 {
                    if e.flag(PIN_HELD) {
                        released = e.files.active().cloned();
                        e.set(PIN_HELD, false);
                    } else {
                        e.settle();
                    }
                    forget = e.bytes == 0 && !e.files.is_open() && e.writes == 0;
                }
            }
            if forget {
                st.table.take(at);
                st.policy.remove(at);
            }
        }
        // Outside the state lock: the last use unlocks the journal (a system call); then the
        // entry can go idle.
        if let Some(o) = released {
            o.release_use();
            drop(o);
            self.settle(&key);
        }
    }

    /// A snapshot of the cache's state and counters.
    pub fn stats(&self) -> CacheStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let index_memory = self.index_memory();
        let st = self.state.lock();
        let mut s = CacheStats {
            bytes: st.used,
            limit: self.limit,
            open_objects: st.open_count as u64,
            hits: get(&c.hits),
            misses: get(&c.misses),
            crc_failures: get(&c.crc_failures),
            writes: get(&c.writes),
            write_bytes: get(&c.write_bytes),
            write_skipped: get(&c.write_skipped),
            evictions: get(&c.evictions),
            evicted_bytes: get(&c.evicted_bytes),
            evict_in_use: get(&c.evict_in_use),
            full: get(&c.full),
            verified_reads: get(&c.verified_reads),
            free_floor_refusals: get(&c.free_floor),
            min_free: self.min_free,
            no_space_errors: get(&c.no_space_errors),
            io_errors: get(&c.io_errors),
            scan_complete: *self.scan_done.lock(),
            index_memory,
            ..CacheStats::default()
        };
        for e in st.table.iter() {
            if e.bytes > 0 {
                s.objects += 1;
            }
            if e.complete() {
                s.complete_objects += 1;
            }
            if e.pins > 0 {
                s.pinned_objects += 1;
            }
            s.blocks += e.files.blocks() as u64;
        }
        s
    }

    /// Measures the in-memory index (see [`IndexMemory`]).
    pub fn index_memory(&self) -> IndexMemory {
        let st = self.state.lock();
        let table = st.table.heap_bytes()
            + st.policy.memory_bytes()
            + st.open_lru.memory_bytes()
            + hashmap_bytes(
                st.reserved.capacity(),
                std::mem::size_of::<(EntryKey, u64)>(),
            );
        let open: usize = st.table.iter().map(|e| e.files.memory_bytes()).sum();
        let n = st.table.len().max(1) as u64;
        IndexMemory {
            entries: st.table.len() as u64,
            open_entries: st.open_count as u64,
            table_bytes: table as u64,
            open_bytes: open as u64,
            per_object: (table + open) as u64 / n,
            per_closed_object: table as u64 / n,
        }
    }
}

/// What an entry costs in the index while its files are closed or idle (for `riffle cache
/// stats` without a mount): its record, its share of the key index (5 bytes a bucket, at most
/// 7/8 full, at least 7/16 after a growth: about 8 bytes), the default policy's per-slot state
/// and the open-entry LRU's node. The epoch policy's sample (at most 4,096 keys, about 100–200
/// KiB per cache) comes on top.
pub fn closed_entry_bytes() -> u64 {
    (std::mem::size_of::<Record>() + 8 + PlanPolicy::SLOT_BYTES + LruPolicy::SLOT_BYTES) as u64
}

/// Used by the scan for entries it found.
pub(super) fn last_used(meta: &std::fs::Metadata) -> SystemTime {
    meta.modified().unwrap_or(SystemTime::UNIX_EPOCH)
}
