//! Turns "bytes X..Y of object version O" into ranged GETs, with bounded concurrency and memory.
//!
//! Objects are cut into fixed-size blocks (1 MiB by default; the last one may be short). A block
//! is the unit of caching and of waiting; a GET covers a run of up to `max_part_blocks`
//! consecutive missing blocks (one request instead of eight for sequential reads) and carries
//! `If-Match` with the ETag the file was opened with, so a replaced object fails the read
//! ([`FetchError::Changed`]) instead of mixing two versions.
//!
//! Every block being fetched has one entry in the in-flight table, a shared future that all
//! readers of that block await: concurrent readers of the same data cause one request. The table
//! is consulted and updated under one lock, after the block cache, so a block is either cached,
//! in flight, or fetched anew, never fetched twice at once.
//!
//! Two budgets bound the work: `max_inflight` concurrent GETs, and the bytes of GET buffers in
//! flight (`memory`). Demand reads wait for both (FIFO, so every demand read progresses);
//! read-ahead only takes what is free at once and otherwise is skipped (the reader's next call
//! asks again), so prefetching never queues ahead of a demand read. Completed blocks go into a
//! byte-weighted in-memory cache (moka) of bounded size; the NVMe cache replaces it as the
//! place blocks land.
//!
//! A demand read whose bytes are cached can skip the table and the tasks altogether
//! ([`Fetcher::read_quick`]): it is answered at once from memory, or from one block of an open
//! NVMe cache entry by the cache's I/O thread. It does so only when nothing has to wait and
//! the block is not in flight; everything else (and any failed or mismatched disk read) goes
//! through [`Fetcher::read`].
//!
//! With peers ([`peer`], `--peers`), a GET's run of missing blocks is first offered to the
//! blocks' owners among the other nodes, block by block and all at once, holding the GET's
//! budget; what they serve (CRC-checked) completes like a fetched block, and the blocks this
//! node owns or that no peer could serve go to the store as before. Blocks asked for by a
//! peer ([`Fetcher::serve_peer`]) are claimed like any other (so they join a fetch in flight)
//! but are never offered to peers again, and take a budget of their own.

mod blocks;
mod disk;
mod object;
pub mod peer;

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::future::{FutureExt, Shared};
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use parking_lot::Mutex;
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use crate::cache::ring::AlignedBuf;
use crate::store::{ObjectStore, StoreError};
pub use blocks::BlockCache;
pub use disk::DiskTier;
pub use object::{BlockKey, ObjectVersion};

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum FetchError {
    #[error("the object changed since it was opened")]
    Changed,
    #[error(transparent)]
    Store(StoreError),
    #[error("the fetch was cancelled")]
    Cancelled,
    /// The store refused this mount's principal a read of the object (a proof request
    /// answered 403, now or earlier within the metadata TTL).
    #[error("the store refused this credential a read of the object")]
    NotPermitted,
}

impl From<StoreError> for FetchError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::PreconditionFailed => FetchError::Changed,
            other => FetchError::Store(other),
        }
    }
}

/// Sizes and budgets.
#[derive(Debug, Clone, Copy)]
pub struct FetchConfig {
    pub block_size: u64,
    /// Blocks per GET at most.
    pub max_part_blocks: u64,
    /// Concurrent GETs at most.
    pub max_inflight: usize,
    /// Bytes of GET buffers in flight at most (at least one part).
    pub inflight_memory: u64,
    /// Bytes of completed blocks kept in memory.
    pub block_cache_bytes: u64,
}

impl Default for FetchConfig {
    fn default() -> Self {
        FetchConfig {
            block_size: 1 << 20,
            max_part_blocks: 8,
            max_inflight: 64,
            inflight_memory: 256 << 20,
            block_cache_bytes: 256 << 20,
        }
    }
}

/// Counters, read by `riffle stats` and tests.
#[derive(Debug, Default)]
pub struct FetchStats {
    pub get_requests: AtomicU64,
    pub get_bytes: AtomicU64,
    pub block_hits: AtomicU64,
    pub block_misses: AtomicU64,
    pub prefetch_requests: AtomicU64,
    pub prefetch_skipped: AtomicU64,
    pub errors: AtomicU64,
    /// Blocks served from the NVMe cache.
    pub disk_hits: AtomicU64,
    /// Proof requests made (one-byte GETs of entries another principal filled).
    pub proof_requests: AtomicU64,
    /// Opens refused because the store refused this principal the object.
    pub proofs_refused: AtomicU64,
}

type BlockResult = Result<Bytes, FetchError>;
type Waiter = Shared<futures::future::BoxFuture<'static, BlockResult>>;

/// Memory permits are counted in units of this many bytes (fits a part in a `u32`).
const MEMORY_UNIT: u64 = 4096;

/// The most a GET's connection buffers are charged besides its data (twice the data below
/// that). The HTTP client (hyper) reads each response into a per-connection buffer that
/// doubles while reads fill it (up to about 400 KiB: 128–256 KiB for a 110 KB body) and keeps
/// it while the connection waits in the pool for its next request: 64 readers of W1's small
/// files at `--max-memory 64M` ran ~256 GETs at once and their connections held 54 MiB of
/// buffers beside 32 MiB of data (heaptrack). A connection serves one GET at a time and is
/// reused, so charging each GET for it bounds the buffers of the connections the budget lets
/// run at once; on small files a small budget runs fewer GETs at once (64M: ~100 instead of
/// 256 for 110 KB files; 256M and more: still `--max-inflight`).
pub const CONNECTION_BUFFER: u64 = 256 << 10;

/// See the module documentation.
pub struct Fetcher {
    store: Arc<dyn ObjectStore>,
    config: FetchConfig,
    cache: BlockCache,
    inflight: Arc<Mutex<HashMap<BlockKey, Waiter>>>,
    requests: Arc<Semaphore>,
    memory: Arc<Semaphore>,
    background_limit: Arc<Semaphore>,
    preload_limit: Arc<Semaphore>,
    stats: FetchStats,
    runtime: tokio::runtime::Handle,
    disk: Option<Arc<DiskTier>>,
    /// Proof requests in flight, so concurrent opens of one object make one.
    proving: Mutex<HashMap<crate::cache::EntryKey, Proof>>,
    /// Other nodes whose caches this one reads through ([`peer`]), once set.
    peers: std::sync::OnceLock<Arc<peer::Peers>>,
    /// Fetches made to serve peers, at most (their own limit: see [`peer::server`]).
    peer_limit: Arc<Semaphore>,
}

type Proof = Shared<futures::future::BoxFuture<'static, Result<(), FetchError>>>;

/// A block to be fetched by a new GET, and the channel its waiters listen on.
struct NewBlock {
    index: u64,
    done: oneshot::Sender<BlockResult>,
}

enum Slot {
    Ready(Bytes),
    Wait(Waiter),
}

/// A fetched block's entry left in the in-flight table while the block is written to the NVMe
/// cache; dropping it (the write over, or never started) removes the entry, unless another
/// has taken its place.
struct WriteBehind {
    table: Arc<Mutex<HashMap<BlockKey, Waiter>>>,
    key: BlockKey,
    waiter: Waiter,
}

impl Drop for WriteBehind {
    fn drop(&mut self) {
        let mut table = self.table.lock();
        if table
            .get(&self.key)
            .is_some_and(|w| Shared::ptr_eq(w, &self.waiter))
        {
            table.remove(&self.key);
        }
    }
}

impl Fetcher {
    /// `disk` is the NVMe cache tier, if the mount has one.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        mut config: FetchConfig,
        runtime: tokio::runtime::Handle,
        disk: Option<Arc<DiskTier>>,
    ) -> Arc<Self> {
        config.max_inflight = config.max_inflight.max(1);
        // One block must fit the memory budget, and a part must not exceed it.
        config.inflight_memory = config.inflight_memory.max(config.block_size);
        config.max_part_blocks = config
            .max_part_blocks
            .clamp(1, (config.inflight_memory / config.block_size).max(1));
        let memory_units = (config.inflight_memory / MEMORY_UNIT) as usize;
        Arc::new(Fetcher {
            store,
            cache: BlockCache::new(config.block_cache_bytes),
            inflight: Arc::new(Mutex::new(HashMap::new())),
            requests: Arc::new(Semaphore::new(config.max_inflight)),
            background_limit: Arc::new(Semaphore::new((config.max_inflight * 3 / 4).max(1))),
            preload_limit: Arc::new(Semaphore::new((config.max_inflight / 2).max(1))),
            memory: Arc::new(Semaphore::new(memory_units)),
            stats: FetchStats::default(),
            runtime,
            config,
            disk,
            proving: Mutex::new(HashMap::new()),
            peers: std::sync::OnceLock::new(),
            peer_limit: Arc::new(Semaphore::new(config.max_inflight)),
        })
    }

    /// From now on, blocks missing here are asked of their owners among `peers` before the
    /// store ([`peer`]). Set once; a second call is ignored.
    pub fn set_peers(&self, peers: Arc<peer::Peers>) {
        let _ = self.peers.set(peers);
    }

    pub fn peers(&self) -> Option<&Arc<peer::Peers>> {
        self.peers.get()
    }

    pub fn config(&self) -> &FetchConfig {
        &self.config
    }

    pub fn stats(&self) -> &FetchStats {
        &self.stats
    }

    /// GETs in flight right now.
    pub fn inflight_requests(&self) -> usize {
        self.config.max_inflight - self.requests.available_permits()
    }

    /// Bytes of GET buffers reserved right now.
    pub fn inflight_bytes(&self) -> u64 {
        let total = self.config.inflight_memory / MEMORY_UNIT;
        (total - self.memory.available_permits() as u64) * MEMORY_UNIT
    }

    pub fn block_cache(&self) -> &BlockCache {
        &self.cache
    }

    pub fn disk(&self) -> Option<&Arc<DiskTier>> {
        self.disk.as_ref()
    }

    /// Number of blocks of `obj`.
    pub fn block_count(&self, obj: &ObjectVersion) -> u64 {
        obj.size.div_ceil(self.config.block_size)
    }

    fn block_range(&self, obj: &ObjectVersion, index: u64) -> Range<u64> {
        let start = index * self.config.block_size;
        start..(start + self.config.block_size).min(obj.size)
    }

    /// Bytes `range` of `obj` (clamped to its size), fetching what is missing.
    /// Whether this mount may be served what the NVMe cache holds of `obj`; called at open.
    /// Asks the store only when the entry holds bytes and this mount's principal has no
    /// answer for it yet ([`crate::cache::proofs`]): one GET of the first byte with
    /// `If-Match`, shared by concurrent opens. `Err(NotPermitted)` on a refusal, now or
    /// remembered; `Err(Changed)` if the object is no longer that version; other errors
    /// of the proof request as they came (not remembered).
    pub async fn admit(self: &Arc<Self>, obj: &ObjectVersion) -> Result<(), FetchError> {
        let Some(disk) = &self.disk else {
            return Ok(());
        };
        let id = disk.identity(obj);
        let key = id.entry_key();
        if let Some(answer) = self.known_answer(disk, &key) {
            return answer;
        }
        // Nothing cached: nothing to prove (this mount's own GETs will be its proof).
        match disk.cache.status(&id).await {
            Ok(Some(status)) if status.blocks_present > 0 => {}
            _ => return Ok(()),
        }
        self.prove_once(obj).await
    }

    /// This mount's answer for `obj`: a proof or refusal it knows, or one proof request
    /// shared by concurrent callers.
    async fn prove_once(self: &Arc<Self>, obj: &ObjectVersion) -> Result<(), FetchError> {
        let Some(disk) = &self.disk else {
            return Ok(());
        };
        let key = disk.entry_key(obj);
        let proof = {
            let mut proving = self.proving.lock();
            // A proof that finished while this one looked at the cache.
            if let Some(answer) = self.known_answer(disk, &key) {
                return answer;
            }
            proving
                .entry(key)
                .or_insert_with(|| {
                    let this = self.clone();
                    let obj = obj.clone();
                    async move {
                        let result = this.prove(&obj).await;
                        this.proving.lock().remove(&key);
                        result
                    }
                    .boxed()
                    .shared()
                })
                .clone()
        };
        proof.await
    }

    /// What this mount's proofs already say of `key` (a refusal counted), if anything.
    fn known_answer(
        &self,
        disk: &DiskTier,
        key: &crate::cache::EntryKey,
    ) -> Option<Result<(), FetchError>> {
        match disk.proofs.verdict(key)? {
            crate::cache::Verdict::MayRead => Some(Ok(())),
            crate::cache::Verdict::Refused => {
                self.stats.proofs_refused.fetch_add(1, Ordering::Relaxed);
                Some(Err(FetchError::NotPermitted))
            }
        }
    }

    /// One proof request for `obj` (see [`Self::admit`]), its answer recorded.
    async fn prove(&self, obj: &ObjectVersion) -> Result<(), FetchError> {
        let Some(disk) = &self.disk else {
            return Ok(());
        };
        let key = disk.entry_key(obj);
        self.stats.proof_requests.fetch_add(1, Ordering::Relaxed);
        match self.store.get_range(&obj.key, 0..1, Some(&obj.etag)).await {
            Ok(_) => {
                disk.proofs.record(key, crate::cache::Verdict::MayRead);
                Ok(())
            }
            Err(StoreError::AccessDenied(detail)) => {
                tracing::info!(key = %obj.key, %detail, "the store refused this mount's credential the object; its cached bytes are not served to this mount");
                disk.proofs.record(key, crate::cache::Verdict::Refused);
                self.stats.proofs_refused.fetch_add(1, Ordering::Relaxed);
                Err(FetchError::NotPermitted)
            }
            Err(e) => Err(e.into()),
        }
    }

    pub async fn read(
        self: &Arc<Self>,
        obj: &Arc<ObjectVersion>,
        range: Range<u64>,
    ) -> BlockResult {
        let Some((range, blocks)) = self.clamp(obj, range) else {
            return Ok(Bytes::new());
        };
        let slots = self.claim(obj, blocks.clone(), Mode::Demand);
        let mut parts = Vec::with_capacity(slots.len());
        for slot in slots {
            parts.push(match slot {
                Slot::Ready(b) => b,
                Slot::Wait(w) => w.await?,
            });
        }
        Ok(self.assemble(range, blocks.start, &parts))
    }

    /// `range` clamped to the object's size, and the blocks that cover it; `None` when nothing
    /// of it is inside the object.
    fn clamp(&self, obj: &ObjectVersion, range: Range<u64>) -> Option<(Range<u64>, Range<u64>)> {
        let end = range.end.min(obj.size);
        if range.start >= end {
            return None;
        }
        let bs = self.config.block_size;
        Some((range.start..end, range.start / bs..end.div_ceil(bs)))
    }

    /// Bytes `range` cut from `parts`, the consecutive blocks from `first_block` that cover it.
    fn assemble(&self, range: Range<u64>, first_block: u64, parts: &[Bytes]) -> Bytes {
        let bs = self.config.block_size;
        let first = first_block * bs;
        if let [only] = parts {
            return only.slice((range.start - first) as usize..(range.end - first) as usize);
        }
        let mut out = BytesMut::with_capacity((range.end - range.start) as usize);
        for (i, part) in parts.iter().enumerate() {
            let block_start = first + i as u64 * bs;
            let lo = range.start.saturating_sub(block_start) as usize;
            let hi = ((range.end - block_start) as usize).min(part.len());
            out.extend_from_slice(&part[lo..hi]);
        }
        out.freeze()
    }

    /// A demand read of `range` (clamped to the object) served without a task when it needs
    /// no request to the store and no metadata I/O: at once when every block is in memory;
    /// from the NVMe cache's data file, just the bytes of `range`, when its blocks are known
    /// good to this process ([`DiskCache::read_verified_on_ring`]); or from one block of the
    /// NVMe cache whose entry is open, with `done` run on the cache's I/O thread as soon as
    /// the bytes are read and verified. Otherwise (anything missing,
    /// several blocks not all in memory, a failed or mismatched disk read) `done` gets `None`
    /// and the caller takes the task path, [`Fetcher::read`], which fetches, waits, and deals
    /// with errors. Calls `done` exactly once, possibly before returning.
    ///
    /// A warm read then costs one hand-off (to the I/O thread and its reply) instead of four
    /// (to a task, to the GET task that finds the block on disk, to the I/O thread, and back).
    pub fn read_quick<F>(self: &Arc<Self>, obj: &Arc<ObjectVersion>, range: Range<u64>, done: F)
    where
        F: FnOnce(Option<Bytes>) + Send + 'static,
    {
        let Some((range, blocks)) = self.clamp(obj, range) else {
            return done(Some(Bytes::new()));
        };
        let bs = self.config.block_size;
        let parts: Option<Vec<Bytes>> = blocks
            .clone()
            .map(|i| self.cache.get(&(obj.clone(), i)))
            .collect();
        if let Some(parts) = parts {
            let n = parts.len() as u64;
            self.stats.block_hits.fetch_add(n, Ordering::Relaxed);
            return done(Some(self.assemble(range, blocks.start, &parts)));
        }
        let Some(disk) = &self.disk else {
            return done(None);
        };
        if !disk.may_serve(obj) {
            // Not proved readable by this mount's principal: the task path fetches it.
            return done(None);
        }
        // Blocks known good: just the bytes asked for, through the page cache. Not a short
        // block alone (a small file): that is read on the FUSE thread below, which costs less
        // than the hand-off to the I/O thread and back.
        let one_block = blocks.end - blocks.start == 1;
        let short = {
            let block = self.block_range(obj, blocks.start);
            (block.end - block.start) % crate::cache::ring::ALIGN as u64 != 0
        };
        if self.any_in_flight(obj, blocks.clone()) {
            // Being fetched or read from disk already (read-ahead, or a stream's window read
            // into memory): wait for that rather than read the same bytes a second time.
            return done(None);
        }
        let done = if one_block && short {
            done
        } else {
            let Err(done) =
                disk.cache
                    .read_verified_on_ring(&disk.identity(obj), range.clone(), done)
            else {
                return;
            };
            done
        };
        if !one_block {
            return done(None);
        }
        let index = blocks.start;
        let this = self.clone();
        let key = (obj.clone(), index);
        let slice = (range.start - index * bs) as usize..(range.end - index * bs) as usize;
        let id = disk.identity(obj);
        // A short block (a small file) is read right here, on the FUSE thread.
        if let Some(data) = disk.cache.read_short_block_here(&id, index) {
            return done(Some(self.disk_block_read(key, data, slice)));
        }
        let on_disk = disk.cache.read_block_on_ring(&id, index, move |data| {
            let Some(data) = data else {
                return done(None);
            };
            done(Some(this.disk_block_read(key, data, slice)));
        });
        if let Err(done) = on_disk {
            done(None);
        }
    }

    /// Whether a block of `blocks` is being fetched or read from disk.
    fn any_in_flight(&self, obj: &Arc<ObjectVersion>, blocks: Range<u64>) -> bool {
        let inflight = self.inflight.lock();
        blocks
            .into_iter()
            .any(|i| inflight.contains_key(&(obj.clone(), i)))
    }

    /// A demand read's block read from the NVMe cache: counted, kept in memory when the read
    /// took only part of it (the kernel's reads of a large file are smaller than a block, and
    /// the next ones of this block are then served at once; a read of a whole small file has
    /// no next one), and the part `slice` returned.
    fn disk_block_read(&self, key: BlockKey, data: Bytes, slice: Range<usize>) -> Bytes {
        self.stats.block_misses.fetch_add(1, Ordering::Relaxed);
        self.stats.disk_hits.fetch_add(1, Ordering::Relaxed);
        let part = data.slice(slice);
        if part.len() < data.len() {
            self.cache.insert(key, data);
        }
        part
    }

    /// Fetches `blocks` of `obj` at background priority and waits until they are in (cached
    /// in memory, and written to the NVMe cache when there is one). Used by the prefetch
    /// scheduler (epoch plans, directory order) and preload; demand reads always go first
    /// (see [`Priority`]).
    pub async fn fetch_background(
        self: &Arc<Self>,
        obj: &Arc<ObjectVersion>,
        blocks: Range<u64>,
        priority: Priority,
    ) -> Result<(), FetchError> {
        let blocks = blocks.start..blocks.end.min(self.block_count(obj));
        if blocks.is_empty() {
            return Ok(());
        }
        // Cached by another principal: a proof request instead of fetching it again.
        if let Some(disk) = &self.disk {
            if !disk.may_serve(obj) && disk.cache.holds_bytes(&disk.identity(obj)) {
                self.admit(obj).await?;
            }
        }
        // Already whole on disk: nothing to fetch, and copying it into memory would only
        // compete with the reader for the disk (a passthrough reader never asks the daemon).
        if self.whole_on_disk(obj) {
            return Ok(());
        }
        // Each block is let go as soon as it is in (in completion order): a completed block
        // waited for in a list kept its bytes alive in its shared future until the loop got
        // to it, so a file's blocks that came in before its first one were held outside
        // `--max-memory` (up to a whole file per prefetch in flight: 150 MiB of a 64M budget
        // reading six W2 shards).
        let mut waiting: FuturesUnordered<Waiter> = self
            .claim(obj, blocks, Mode::Background(priority))
            .into_iter()
            .filter_map(|slot| match slot {
                Slot::Wait(w) => Some(w),
                Slot::Ready(_) => None,
            })
            .collect();
        while let Some(done) = waiting.next().await {
            done?;
        }
        Ok(())
    }

    /// Whether every block of `obj` is in the memory or the NVMe cache (no I/O).
    pub fn is_cached(&self, obj: &Arc<ObjectVersion>) -> bool {
        self.whole_on_disk(obj) || self.in_memory(obj)
    }

    /// Whether every block of `obj` is in the memory cache (no I/O).
    pub fn in_memory(&self, obj: &Arc<ObjectVersion>) -> bool {
        (0..self.block_count(obj)).all(|i| self.cache.get(&(obj.clone(), i)).is_some())
    }

    /// Whether every block of `obj` is known to be in the NVMe cache (no I/O).
    pub fn whole_on_disk(&self, obj: &ObjectVersion) -> bool {
        self.disk
            .as_ref()
            .is_some_and(|d| d.cache.is_complete(&d.identity(obj)) && d.may_serve(obj))
    }

    /// Starts fetching the missing blocks of `blocks` if the budgets allow it right now.
    /// Blocks the NVMe cache holds and has already checked are left alone: a read of them
    /// takes just its bytes from the cache file's page cache ([`Self::read_quick`]), so
    /// reading them ahead into memory (a whole block and a CRC each) would only cost.
    pub fn prefetch(self: &Arc<Self>, obj: &Arc<ObjectVersion>, mut blocks: Range<u64>) {
        if let Some(disk) = self.disk.as_ref().filter(|d| d.may_serve(obj)) {
            blocks.start += disk
                .cache
                .verified_prefix(&disk.identity(obj), blocks.clone());
        }
        self.prefetch_stream(obj, blocks);
    }

    /// Starts reading `blocks` ahead into memory, the known-good cached ones included: for a
    /// long sequential run, where each of the reader's next requests would otherwise wait for
    /// its own read of the cache file. Blocks on disk are read whole with direct I/O (no copy
    /// through the page cache) as far ahead as the budgets allow; blocks the reader has passed
    /// go again with [`Self::drop_behind`].
    pub fn prefetch_stream(self: &Arc<Self>, obj: &Arc<ObjectVersion>, blocks: Range<u64>) {
        let blocks = blocks.start..blocks.end.min(self.block_count(obj));
        if !blocks.is_empty() {
            self.claim(obj, blocks, Mode::ReadAhead);
        }
    }

    /// Forgets the memory copies of `blocks` that the NVMe cache holds and has checked: a
    /// sequential reader has passed them (the kernel's page cache has what it read), and a
    /// later read of one takes its bytes from the cache file. Blocks only in memory stay.
    pub fn drop_behind(&self, obj: &Arc<ObjectVersion>, blocks: Range<u64>) {
        let Some(disk) = self.disk.as_ref().filter(|d| d.may_serve(obj)) else {
            return;
        };
        let blocks = blocks.start..blocks.end.min(self.block_count(obj));
        let known_good = disk
            .cache
            .verified_prefix(&disk.identity(obj), blocks.clone());
        for index in blocks.start..blocks.start + known_good {
            self.cache.remove(&(obj.clone(), index));
        }
    }

    /// Finds or starts every block of `blocks`. Demand and background claims start GETs that
    /// wait for budget (background ones behind their priority's limiter); read-ahead claims
    /// start only what the budget allows now and stop at the first refusal.
    fn claim(
        self: &Arc<Self>,
        obj: &Arc<ObjectVersion>,
        blocks: Range<u64>,
        mode: Mode,
    ) -> Vec<Slot> {
        let demand = mode == Mode::Demand;
        let try_now = mode == Mode::ReadAhead;
        let mut slots = Vec::with_capacity((blocks.end - blocks.start) as usize);
        let mut runs: Vec<(Vec<NewBlock>, Option<Budget>)> = Vec::new();
        let mut refused = false;
        {
            let mut inflight = self.inflight.lock();
            let mut run: Vec<NewBlock> = Vec::new();
            for index in blocks {
                let key = (obj.clone(), index);
                if let Some(data) = self.cache.get(&key) {
                    if demand {
                        self.stats.block_hits.fetch_add(1, Ordering::Relaxed);
                    }
                    slots.push(Slot::Ready(data));
                } else if let Some(w) = inflight.get(&key) {
                    slots.push(Slot::Wait(w.clone()));
                } else {
                    if demand {
                        self.stats.block_misses.fetch_add(1, Ordering::Relaxed);
                    }
                    if !run.is_empty() && run.len() as u64 == self.config.max_part_blocks {
                        runs.push((std::mem::take(&mut run), None));
                    }
                    let (tx, rx) = oneshot::channel();
                    let waiter: Waiter = rx
                        .map(|r| r.unwrap_or(Err(FetchError::Cancelled)))
                        .boxed()
                        .shared();
                    inflight.insert(key, waiter.clone());
                    slots.push(Slot::Wait(waiter));
                    run.push(NewBlock { index, done: tx });
                    continue;
                }
                if !run.is_empty() {
                    runs.push((std::mem::take(&mut run), None));
                }
            }
            if !run.is_empty() {
                runs.push((run, None));
            }
            if try_now {
                // Reserve budget for each run in order; drop the runs that do not fit.
                for (run, budget) in runs.iter_mut() {
                    if !refused {
                        *budget = self.try_budget(self.run_bytes(obj, run));
                        refused = budget.is_none();
                    }
                    if refused {
                        for b in run.drain(..) {
                            inflight.remove(&(obj.clone(), b.index));
                        }
                    }
                }
                runs.retain(|(run, _)| !run.is_empty());
            }
        }
        if try_now {
            self.stats
                .prefetch_requests
                .fetch_add(runs.len() as u64, Ordering::Relaxed);
            if refused {
                self.stats.prefetch_skipped.fetch_add(1, Ordering::Relaxed);
            }
        }
        let priority = match mode {
            Mode::Background(p) => Some(p),
            _ => None,
        };
        for (run, budget) in runs {
            self.start_get(obj.clone(), run, budget, priority, mode == Mode::Peer);
        }
        slots
    }

    /// Block `index` of `obj` for a peer that asked this node ([`peer::server`]): from memory,
    /// the NVMe cache or the store, joined with a fetch of it in flight, never from another
    /// peer; under its own concurrency limit.
    pub(crate) async fn serve_peer(
        self: &Arc<Self>,
        obj: &Arc<ObjectVersion>,
        index: u64,
    ) -> BlockResult {
        if index >= self.block_count(obj) {
            return Err(FetchError::Store(StoreError::NotFound));
        }
        match self.claim(obj, index..index + 1, Mode::Peer).pop() {
            Some(Slot::Ready(data)) => Ok(data),
            Some(Slot::Wait(w)) => w.await,
            None => Err(FetchError::Cancelled),
        }
    }

    fn run_bytes(&self, obj: &ObjectVersion, run: &[NewBlock]) -> u64 {
        let (Some(first), Some(last)) = (run.first(), run.last()) else {
            return 0;
        };
        self.block_range(obj, last.index).end - self.block_range(obj, first.index).start
    }

    fn memory_units(bytes: u64) -> u32 {
        bytes.div_ceil(MEMORY_UNIT).max(1) as u32
    }

    /// The memory permits of a GET of `bytes`: its data and its connection's read buffer
    /// (twice the data, at most [`CONNECTION_BUFFER`]), at most the whole budget (a GET larger
    /// than it could never start).
    fn get_units(&self, bytes: u64) -> u32 {
        let total = (self.config.inflight_memory / MEMORY_UNIT).max(1) as u32;
        let buffer = bytes.saturating_mul(2).min(CONNECTION_BUFFER);
        Self::memory_units(bytes + buffer).min(total)
    }

    fn try_budget(&self, bytes: u64) -> Option<Budget> {
        let request = self.requests.clone().try_acquire_owned().ok()?;
        let memory = self
            .memory
            .clone()
            .try_acquire_many_owned(self.get_units(bytes))
            .ok()?;
        Some(Budget {
            _request: request,
            memory,
            _limits: Vec::new(),
        })
    }

    /// Spawns the GET for one run of consecutive blocks.
    fn start_get(
        self: &Arc<Self>,
        obj: Arc<ObjectVersion>,
        run: Vec<NewBlock>,
        budget: Option<Budget>,
        priority: Option<Priority>,
        for_peer: bool,
    ) {
        let (Some(first), Some(last)) = (run.first(), run.last()) else {
            return;
        };
        let range =
            self.block_range(&obj, first.index).start..self.block_range(&obj, last.index).end;
        let this = self.clone();
        let work = async move {
            let run = this.serve_from_disk(&obj, run).await;
            if run.is_empty() {
                return;
            }
            let waited = match budget {
                Some(b) => Some(b),
                None if for_peer => this.wait_peer_budget(range.end - range.start).await,
                None => this.wait_budget(range.end - range.start, priority).await,
            };
            let Some(mut budget) = waited else {
                return;
            };
            // A block asked for by a peer is fetched here, never from another peer.
            let peers = this.peers.get().filter(|_| !for_peer).cloned();
            let run = match peers {
                Some(peers) => this.from_peers(&obj, run, &peers, &mut budget).await,
                None => run,
            };
            for part in split_contiguous(run) {
                let (Some(first), Some(last)) = (part.first(), part.last()) else {
                    continue;
                };
                let range = this.block_range(&obj, first.index).start
                    ..this.block_range(&obj, last.index).end;
                this.stats.get_requests.fetch_add(1, Ordering::Relaxed);
                this.stream_run(&obj, range, part, &mut budget).await;
            }
        };
        // Background work yields the cache's metadata slots to demand reads.
        if priority.is_some() {
            self.runtime
                .spawn(crate::cache::DiskCache::in_background(work));
        } else {
            self.runtime.spawn(work);
        }
    }

    /// Asks the owners among `peers` for the blocks of `run` (all at once), completes those a
    /// peer served, and returns the rest, sorted, for the store: the blocks this node owns and
    /// those every peer asked failed (see [`peer`]).
    async fn from_peers(
        self: &Arc<Self>,
        obj: &Arc<ObjectVersion>,
        run: Vec<NewBlock>,
        peers: &Arc<peer::Peers>,
        budget: &mut Budget,
    ) -> Vec<NewBlock> {
        let asks = run.into_iter().map(|block| {
            let range = self.block_range(obj, block.index);
            async move {
                let outcome = peers
                    .fetch_block(obj, block.index, range.end - range.start)
                    .await;
                (block, outcome)
            }
        });
        let answers = futures::future::join_all(asks).await;
        let mut rest = Vec::new();
        let mut accepted: Option<PeerVerdict> = None;
        for (block, outcome) in answers {
            let (data, proof) = match outcome {
                peer::Outcome::Local | peer::Outcome::Fallback => {
                    rest.push(block);
                    continue;
                }
                peer::Outcome::Got { data, proof } => (data, proof),
            };
            // One verdict per run (it is one object version).
            let verdict = match accepted {
                Some(v) => v,
                None => {
                    let v = self.accept_from_peer(obj, proof).await;
                    accepted = Some(v);
                    v
                }
            };
            match verdict {
                PeerVerdict::Serve => {
                    let index = block.index;
                    let keep = self.keeps_peer_copies();
                    let writing = self.complete(obj, block, Ok(data.clone()), keep);
                    if keep {
                        // The copy waits for the disk inside the run's memory budget.
                        let memory = budget.take_memory(data.len() as u64);
                        self.persist(obj, index, data, writing, memory).await;
                    }
                }
                PeerVerdict::Refused => {
                    self.complete(obj, block, Err(FetchError::NotPermitted), false);
                }
                PeerVerdict::Store => rest.push(block),
            }
        }
        rest.sort_by_key(|b| b.index);
        rest
    }

    /// Whether this mount may be served bytes of `obj` a peer sent, `proof` being the
    /// owner's attestation of a read proof for this mount's principal: with it, a proof is
    /// recorded here (no request); without it, this mount's own proof (one shared proof
    /// request unless it has an answer). Without an NVMe tier (no proof log), unattested
    /// bytes are taken from the store instead.
    async fn accept_from_peer(self: &Arc<Self>, obj: &ObjectVersion, proof: bool) -> PeerVerdict {
        let Some(disk) = &self.disk else {
            return if proof {
                PeerVerdict::Serve
            } else {
                PeerVerdict::Store
            };
        };
        if proof {
            disk.fetched(&disk.identity(obj));
            return PeerVerdict::Serve;
        }
        if disk.may_serve(obj) {
            return PeerVerdict::Serve;
        }
        match self.prove_once(obj).await {
            Ok(()) => PeerVerdict::Serve,
            Err(FetchError::NotPermitted) => PeerVerdict::Refused,
            Err(_) => PeerVerdict::Store,
        }
    }

    /// Whether a block read from a peer is also written to the NVMe cache: only while the
    /// cache has room for it *and* for this node's share of the dataset (what it owns, see
    /// [`peer::Peers::owned_share`]), and has never had to make room since it was opened. A
    /// copy never evicts anything, and a cache smaller than the dataset holds what this node
    /// owns rather than copies whose owners keep them: otherwise the copies would push out
    /// owned blocks that the other nodes then fetch from the store again.
    fn keeps_peer_copies(&self) -> bool {
        let reserve = self.peers.get().map_or(0, |p| p.owned_share());
        self.disk.as_ref().is_some_and(|d| {
            !d.cache.has_been_full()
                && d.cache.used_bytes() + self.config.block_size + reserve <= d.cache.limit()
        })
    }

    /// Completes the blocks of `run` that the NVMe cache holds; returns the others.
    async fn serve_from_disk(&self, obj: &Arc<ObjectVersion>, run: Vec<NewBlock>) -> Vec<NewBlock> {
        let Some(disk) = &self.disk else {
            return run;
        };
        let id = disk.identity(obj);
        // Loads the entry (made by this or an earlier daemon), or creates the one the fetched
        // blocks will be written to; an error: serve from the store alone.
        if !matches!(disk.cache.status_or_create(&id).await, Ok(Some(_))) {
            return run;
        }
        if !disk.may_serve(obj) {
            // Cached bytes without a read proof of this mount's: fetch them (that proves).
            return run;
        }
        let (present, mut missing): (Vec<NewBlock>, Vec<NewBlock>) = run
            .into_iter()
            .partition(|b| disk.cache.has_block(&id, b.index));
        let reads = present.iter().map(|b| disk.cache.read_block(&id, b.index));
        let results = futures::future::join_all(reads).await;
        for (block, result) in present.into_iter().zip(results) {
            match result {
                Ok(Some(data)) => {
                    self.stats.disk_hits.fetch_add(1, Ordering::Relaxed);
                    self.complete(obj, block, Ok(data), false);
                }
                _ => missing.push(block),
            }
        }
        missing.sort_by_key(|b| b.index);
        missing
    }

    /// Hands a fetched block to the NVMe cache; waits while `WRITE_PERMITS` writes are in
    /// flight, which slows the GET down rather than buffering without bound. `writing` (from
    /// [`Self::complete`]) keeps the block's finished entry in the in-flight table until the
    /// write is over, however it ends. `memory` is the block's share of its GET's memory
    /// budget, held until the write is over: a block waiting for the disk stays inside
    /// `--max-memory` (before, up to `WRITE_PERMITS` blocks waited outside it).
    async fn persist(
        &self,
        obj: &Arc<ObjectVersion>,
        index: u64,
        data: Bytes,
        writing: Option<WriteBehind>,
        memory: Option<OwnedSemaphorePermit>,
    ) {
        let Some(disk) = &self.disk else {
            return;
        };
        let id = disk.identity(obj);
        let hold = disk.cache.pin_for_fill(&id);
        let Ok(permit) = disk.write_permits.clone().acquire_owned().await else {
            return;
        };
        let disk = disk.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _hold = hold;
            let _writing = writing;
            let _memory = memory;
            if disk.cache.write_block(&id, index, data).await.is_ok() {
                disk.wrote(&id);
            }
        });
    }

    /// Receives one GET's body and completes each block as soon as its last byte arrives.
    /// If the body fails or ends early, the rest of the run is fetched again with a plain
    /// (retried, length-checked) ranged GET. Each block is received into its own aligned
    /// buffer ([`AlignedBuf`]: written to the NVMe cache with `O_DIRECT` without a copy), and
    /// takes its share of `budget`'s memory along to the cache write ([`Self::persist`]).
    async fn stream_run(
        &self,
        obj: &Arc<ObjectVersion>,
        range: Range<u64>,
        run: Vec<NewBlock>,
        budget: &mut Budget,
    ) {
        let mut pending = run.into_iter().peekable();
        let mut failure: Option<FetchError> = None;
        match self
            .store
            .get_range_stream(&obj.key, range.clone(), Some(&obj.etag))
            .await
        {
            Err(e) => failure = Some(e.into()),
            Ok(mut chunks) => {
                self.read_from_store(obj);
                let mut buf: Option<AlignedBuf> = None;
                while let Some(chunk) = chunks.next().await {
                    let mut data = match chunk {
                        Ok(d) => d,
                        Err(e) => {
                            tracing::debug!(key = %obj.key, error = %e, "GET body failed midway; refetching the rest");
                            break;
                        }
                    };
                    self.stats
                        .get_bytes
                        .fetch_add(data.len() as u64, Ordering::Relaxed);
                    while !data.is_empty() {
                        let Some(block) = pending.peek() else { break };
                        let want = (self.block_range(obj, block.index).end
                            - self.block_range(obj, block.index).start)
                            as usize;
                        // One exact allocation per block: a cached block pins only itself.
                        let filling = buf.get_or_insert_with(|| AlignedBuf::with_capacity(want));
                        let take = filling
                            .extend_from_slice(&data[..(want - filling.len()).min(data.len())]);
                        let _ = data.split_to(take);
                        if filling.len() == want {
                            if let (Some(block), Some(full)) = (pending.next(), buf.take()) {
                                let index = block.index;
                                let data = Bytes::from_owner(full);
                                let memory = budget.take_memory(data.len() as u64);
                                let writing = self.complete(obj, block, Ok(data.clone()), true);
                                self.persist(obj, index, data, writing, memory).await;
                            }
                        }
                    }
                    if pending.peek().is_none() {
                        break;
                    }
                }
            }
        }
        let rest: Vec<NewBlock> = pending.collect();
        let (Some(first), Some(last)) = (rest.first(), rest.last()) else {
            return;
        };
        let retry_range =
            self.block_range(obj, first.index).start..self.block_range(obj, last.index).end;
        let result = match failure {
            Some(e) => Err(e),
            None => self
                .store
                .get_range(&obj.key, retry_range.clone(), Some(&obj.etag))
                .await
                .map_err(FetchError::from),
        };
        match &result {
            Ok(data) => {
                self.read_from_store(obj);
                self.stats
                    .get_bytes
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
            }
            Err(e) => {
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(key = %obj.key, start = retry_range.start, end = retry_range.end, error = %e, "read from the store failed");
            }
        }
        let bs = self.config.block_size;
        for block in rest {
            let out = result.clone().map(|data| {
                // Copy: a cached block must not pin the whole part's buffer.
                let lo = (block.index * bs - retry_range.start) as usize;
                let hi = (lo + bs as usize).min(data.len());
                Bytes::from_owner(AlignedBuf::copy_from(&data[lo..hi]))
            });
            let index = block.index;
            let writing = self.complete(obj, block, out.clone(), true);
            if let Ok(data) = out {
                let memory = budget.take_memory(data.len() as u64);
                self.persist(obj, index, data, writing, memory).await;
            }
        }
    }

    /// Notes that the store answered a GET of `obj` for this mount: a read proof for its
    /// cache entry ([`crate::cache::proofs`]).
    fn read_from_store(&self, obj: &ObjectVersion) {
        if let Some(disk) = &self.disk {
            disk.fetched(&disk.identity(obj));
        }
    }

    /// Publishes one block: into the cache, out of the in-flight table, to its waiters.
    ///
    /// A fetched block about to be written to the NVMe cache (`to_disk`, with a disk tier)
    /// stays in the table, resolved, until the write is over (the returned [`WriteBehind`]):
    /// the memory cache may drop or refuse a block at once (it admits by frequency), and a
    /// block in neither the table, memory nor the disk would be fetched a second time.
    fn complete(
        &self,
        obj: &Arc<ObjectVersion>,
        block: NewBlock,
        out: BlockResult,
        to_disk: bool,
    ) -> Option<WriteBehind> {
        let key = (obj.clone(), block.index);
        if let Ok(data) = &out {
            self.cache.insert(key.clone(), data.clone());
        }
        let writing = {
            let mut inflight = self.inflight.lock();
            match inflight.get(&key) {
                Some(waiter) if to_disk && out.is_ok() && self.disk.is_some() => {
                    Some(WriteBehind {
                        table: self.inflight.clone(),
                        waiter: waiter.clone(),
                        key,
                    })
                }
                _ => {
                    inflight.remove(&key);
                    None
                }
            }
        };
        let _ = block.done.send(out);
        writing
    }

    /// A slot of the peer-serving limit (a fetch for a peer takes no slot of this node's own
    /// readers: two nodes asking each other cannot hold each other's slots).
    /// The buffer memory of its `bytes` comes from the node's one budget, like any GET's.
    async fn wait_peer_budget(&self, bytes: u64) -> Option<Budget> {
        let request = self.peer_limit.clone().acquire_owned().await.ok()?;
        self.wait_memory(request, bytes, Vec::new()).await
    }

    /// Waits for a GET slot and buffer memory; background work first takes a slot of its
    /// priority's limiter, so it can never hold every GET slot and starve demand reads.
    async fn wait_budget(&self, bytes: u64, priority: Option<Priority>) -> Option<Budget> {
        let mut limits = Vec::new();
        if let Some(p) = priority {
            if p == Priority::Preload {
                limits.push(self.preload_limit.clone().acquire_owned().await.ok()?);
            }
            limits.push(self.background_limit.clone().acquire_owned().await.ok()?);
        }
        let request = self.requests.clone().acquire_owned().await.ok()?;
        self.wait_memory(request, bytes, limits).await
    }

    /// Waits for the buffer memory of a GET of `bytes` that holds `request` and `limits`.
    async fn wait_memory(
        &self,
        request: OwnedSemaphorePermit,
        bytes: u64,
        limits: Vec<OwnedSemaphorePermit>,
    ) -> Option<Budget> {
        let memory = self
            .memory
            .clone()
            .acquire_many_owned(self.get_units(bytes))
            .await
            .ok()?;
        Some(Budget {
            _request: request,
            memory,
            _limits: limits,
        })
    }
}

/// Splits blocks sorted by index into runs of consecutive indexes.
fn split_contiguous(blocks: Vec<NewBlock>) -> Vec<Vec<NewBlock>> {
    let mut runs: Vec<Vec<NewBlock>> = Vec::new();
    for block in blocks {
        match runs.last_mut() {
            Some(run) if run.last().is_some_and(|b| b.index + 1 == block.index) => run.push(block),
            _ => runs.push(vec![block]),
        }
    }
    runs
}

/// Permits held for the life of one GET; its blocks take their memory along to the cache
/// write ([`Budget::take_memory`]).
struct Budget {
    _request: OwnedSemaphorePermit,
    memory: OwnedSemaphorePermit,
    _limits: Vec<OwnedSemaphorePermit>,
}

impl Budget {
    /// Splits the memory permits of `bytes` off this budget (as many as it still has).
    fn take_memory(&mut self, bytes: u64) -> Option<OwnedSemaphorePermit> {
        let units = (Fetcher::memory_units(bytes) as usize).min(self.memory.num_permits());
        if units == 0 {
            return None;
        }
        self.memory.split(units)
    }
}

/// Who asked for a fetch, which decides who waits for whom.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// The epoch plan, directory order: at most 3/4 of the GET slots.
    Prefetch,
    /// `riffle warm` and `--preload`: at most 1/2 of the GET slots, and behind prefetch.
    Preload,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Demand,
    ReadAhead,
    Background(Priority),
    /// A block a peer asked this node for.
    Peer,
}

/// What a mount may do with a block a peer sent ([`Fetcher::accept_from_peer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PeerVerdict {
    Serve,
    /// The store refused this mount's principal the object.
    Refused,
    /// Fetch it from the store (the proof could not be had, or there is no proof log).
    Store,
}

#[cfg(test)]
mod tests;
