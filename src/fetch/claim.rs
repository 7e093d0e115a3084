//! Block-fetch scheduling: the in-flight table and the GETs it starts.
//!
//! [`Fetcher::claim`] looks every block of a range up under one lock, after the memory cache:
//! cached, in flight (a shared future to await), or new. New blocks are cut into runs of
//! consecutive blocks, at most `max_part_blocks` each, and each run becomes one task
//! ([`Fetcher::start_get`]) that first completes what the NVMe cache holds, then takes its
//! budget, offers the rest to peers (if any), and GETs what is left. A completed block goes to
//! the memory cache, its waiters, and the NVMe cache; while it is written there its entry
//! stays in the table ([`WriteBehind`]), so it is never fetched twice.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::{FutureExt, Shared};
use parking_lot::Mutex;
use tokio::sync::{oneshot, OwnedSemaphorePermit};

use super::budget::{Budget, Priority};
use super::{BlockKey, BlockResult, FetchError, Fetcher, ObjectVersion, Waiter};

/// A block to be fetched by a new GET, and the channel its waiters listen on.
pub(super) struct NewBlock {
    pub(super) index: u64,
    done: oneshot::Sender<BlockResult>,
}

pub(super) enum Slot {
    Ready(Bytes),
    Wait(Waiter),
}

/// A fetched block's entry left in the in-flight table while the block is written to the NVMe
/// cache; dropping it (the write over, or never started) removes the entry, unless another
/// has taken its place.
pub(super) struct WriteBehind {
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    Demand,
    ReadAhead,
    Background(Priority),
    /// A block a peer asked this node for.
    Peer,
}

impl Fetcher {
    /// Finds or starts every block of `blocks`. Demand and background claims start GETs that
    /// wait for budget (background ones behind their priority's limiter); read-ahead claims
    /// start only what the budget allows now and stop at the first refusal.
    pub(super) fn claim(
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

    fn run_bytes(&self, obj: &ObjectVersion, run: &[NewBlock]) -> u64 {
        let (Some(first), Some(last)) = (run.first(), run.last()) else {
            return 0;
        };
        self.block_range(obj, last.index).end - self.block_range(obj, first.index).start
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
    pub(super) async fn persist(
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

    /// Publishes one block: into the cache, out of the in-flight table, to its waiters.
    ///
    /// A fetched block about to be written to the NVMe cache (`to_disk`, with a disk tier)
    /// stays in the table, resolved, until the write is over (the returned [`WriteBehind`]):
    /// the memory cache may drop or refuse a block at once (it admits by frequency), and a
    /// block in neither the table, memory nor the disk would be fetched a second time.
    pub(super) fn complete(
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
