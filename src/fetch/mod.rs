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
//!
//! Files, one job each: this one holds the [`Fetcher`] and its read API; `claim` the
//! in-flight table and the GET tasks it starts; `get` the streaming GET of a run; `budget`
//! the GET slots and memory; `quick` the task-less warm read; `proof` the read proofs at
//! open; `via_peers` blocks read through peers; `blocks` the memory cache; `buffer` the
//! blocks' buffers and what they hold; `disk` the NVMe tier; `object` the object version
//! and block key.

mod blocks;
mod budget;
pub(crate) mod buffer;
mod claim;
mod disk;
mod get;
mod object;
pub(crate) mod peer;
mod proof;
mod quick;
mod via_peers;

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::future::Shared;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use parking_lot::Mutex;
use tokio::sync::Semaphore;

use crate::store::{ObjectStore, StoreError};
pub(crate) use blocks::BlockCache;
pub(crate) use budget::Priority;
use budget::MEMORY_UNIT;
pub(crate) use budget::{idle_connections, idle_connections_memory};
use claim::{Mode, Slot};
pub(crate) use disk::DiskTier;
pub(crate) use object::BlockKey;
pub use object::ObjectVersion;
use proof::Proof;

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

/// See the module documentation.
pub struct Fetcher {
    store: Arc<dyn ObjectStore>,
    config: FetchConfig,
    cache: BlockCache,
    inflight: Arc<Mutex<HashMap<BlockKey, Waiter>>>,
    requests: Arc<Semaphore>,
    memory: Arc<Semaphore>,
    background_limit: Arc<Semaphore>,
    warm_limit: Arc<Semaphore>,
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
            warm_limit: Arc::new(Semaphore::new((config.max_inflight / 2).max(1))),
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
    pub(crate) fn set_peers(&self, peers: Arc<peer::Peers>) {
        let _ = self.peers.set(peers);
    }

    pub(crate) fn peers(&self) -> Option<&Arc<peer::Peers>> {
        self.peers.get()
    }

    pub(crate) fn config(&self) -> &FetchConfig {
        &self.config
    }

    pub fn stats(&self) -> &FetchStats {
        &self.stats
    }

    pub(crate) fn block_cache(&self) -> &BlockCache {
        &self.cache
    }

    pub(crate) fn disk(&self) -> Option<&Arc<DiskTier>> {
        self.disk.as_ref()
    }

    /// Number of blocks of `obj`.
    pub(crate) fn block_count(&self, obj: &ObjectVersion) -> u64 {
        obj.size.div_ceil(self.config.block_size)
    }

    fn block_range(&self, obj: &ObjectVersion, index: u64) -> Range<u64> {
        let start = index * self.config.block_size;
        start..(start + self.config.block_size).min(obj.size)
    }

    /// Bytes `range` of `obj` (clamped to its size), fetching what is missing.
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

    /// Fetches `blocks` of `obj` at background priority and waits until they are in (cached
    /// in memory, and written to the NVMe cache when there is one). Used by the prefetch
    /// scheduler (epoch plans, directory order) and warming; demand reads always go first
    /// (see [`Priority`]).
    pub(crate) async fn fetch_background(
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
    pub(crate) fn is_cached(&self, obj: &Arc<ObjectVersion>) -> bool {
        self.whole_on_disk(obj) || self.in_memory(obj)
    }

    /// Whether every block of `obj` is in the memory cache (no I/O).
    pub(crate) fn in_memory(&self, obj: &Arc<ObjectVersion>) -> bool {
        (0..self.block_count(obj)).all(|i| self.cache.get(&(obj.clone(), i)).is_some())
    }

    /// Whether every block of `obj` is known to be in the NVMe cache (no I/O).
    pub(crate) fn whole_on_disk(&self, obj: &ObjectVersion) -> bool {
        self.disk
            .as_ref()
            .is_some_and(|d| d.cache.is_complete(&d.identity(obj)) && d.may_serve(obj))
    }

    /// Starts fetching the missing blocks of `blocks` if the budgets allow it right now.
    /// Blocks the NVMe cache holds and has already checked are left alone: a read of them
    /// takes just its bytes from the cache file's page cache ([`Self::read_quick`]), so
    /// reading them ahead into memory (a whole block and a CRC each) would only cost.
    pub(crate) fn prefetch(self: &Arc<Self>, obj: &Arc<ObjectVersion>, mut blocks: Range<u64>) {
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
    pub(crate) fn prefetch_stream(self: &Arc<Self>, obj: &Arc<ObjectVersion>, blocks: Range<u64>) {
        let blocks = blocks.start..blocks.end.min(self.block_count(obj));
        if !blocks.is_empty() {
            self.claim(obj, blocks, Mode::ReadAhead);
        }
    }

    /// Forgets the memory copies of `blocks` that the NVMe cache holds and has checked: a
    /// sequential reader has passed them (the kernel's page cache has what it read), and a
    /// later read of one takes its bytes from the cache file. Blocks only in memory stay.
    pub(crate) fn drop_behind(&self, obj: &Arc<ObjectVersion>, blocks: Range<u64>) {
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
}

#[cfg(test)]
mod tests;
