//! Deciding what to fetch before it is asked for: epoch plans, directory order, warming.
//!
//! The in-file read-ahead of `reader` hides latency *within* a file; this module hides it
//! *across* files, which is what small-file datasets need (a 110 KB file is all latency).
//! Three sources say what comes next, in decreasing priority after demand reads:
//!
//! 1. **An epoch plan** ([`plan`]): the paths the trainer will open, in order, given at mount
//!    (`--prefetch-plan`) or at run time (`riffle plan`). One scheduler task keeps up to
//!    `concurrency` plan items being fetched, in plan order, from the reader's position on,
//!    while the bytes fetched ahead and not yet opened stay within the byte budget (a share of
//!    the cache, so prefetch never evicts what it fetched before it is read). By Little's law
//!    the items in flight needed are rate × latency (e.g. 2,000 files/s × 30 ms = 60, and
//!    a store under load answers in two or three times that, which is why the default
//!    `--max-inflight` is 256); the concurrency is three quarters of `--max-inflight`,
//!    leaving the rest to demand reads.
//!    Each open moves the reader's position; replacing the plan mid-epoch starts over from
//!    the new plan (fetches of the old one finish or are dropped; nothing is mixed).
//!    An open of a file whose plan items were all opened already (a reopen, or the next
//!    epoch when no new plan was set) is not a plan open: the plan is spent for it.
//! 2. **Directory order** ([`dirorder`]): for opens outside a plan, a reader that opens a
//!    directory's files in listing order gets the next files of the listing fetched ahead, in
//!    a window that grows while the order holds.
//! 3. **Warm** ([`warm`]): whole subtrees, lowest priority.
//!
//! Files are prefetched whole up to `max_file_bytes` (larger ones only their first part; the
//! in-file read-ahead takes over when they are opened). Every open is checked against the
//! caches, so `riffle stats` reports how many opened files were already fully cached.
//! [`Prefetcher::shutdown`] stops the scheduler and every job promptly.
//!
//! The NVMe cache's plan-aware eviction asks the prefetcher (through [`Oracle`]) when each
//! cached object is needed next: its plan index if the reader has not opened it yet, "soon"
//! for files fetched ahead in directory order, never otherwise. Those answers are given with
//! `try_lock` only, because the cache asks while holding its own lock.

mod dirorder;
mod epoch;
pub mod plan;
mod warm;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::cache::{EntryKey, PlanOracle};
use crate::fetch::{Fetcher, ObjectVersion, Priority};
use crate::namespace::{Attr, Kind, Namespace, NamespaceError};
use crate::stats::{defs, Sample};
use dirorder::DirOrder;
use plan::{Plan, PlanTracker, Window};
use warm::WarmJob;

/// Tuning of the prefetcher.
#[derive(Debug, Clone, Copy)]
pub struct PrefetchConfig {
    /// Plan items fetched at once.
    pub concurrency: usize,
    /// Bytes fetched ahead of the reader and not yet opened, at most.
    pub byte_budget: u64,
    /// Plan items ahead of the reader's position at most.
    pub max_items_ahead: usize,
    /// Larger files are prefetched only up to this many bytes.
    pub max_file_bytes: u64,
    /// Directory-order window, in files.
    pub max_dir_window: usize,
    /// Fetch the unopened files of a recognised epoch set with no plan ([`epoch`]).
    pub epoch_prefetch: bool,
    /// The NVMe cache's eviction policy asks the prefetcher what is needed (`plan`, the
    /// default); with `lru` or `epoch`, or with only the memory cache (which evicts on its
    /// own), files fetched ahead are not protected, so epoch prefetch only takes sets that
    /// fit in the room.
    pub eviction_asks_prefetch: bool,
}

/// Counters for `riffle stats`.
#[derive(Debug, Default)]
pub struct PrefetchStats {
    pub opens: AtomicU64,
    pub opens_cached: AtomicU64,
    pub plan_opens: AtomicU64,
    pub plan_opens_ready: AtomicU64,
    pub plan_fetched: AtomicU64,
    pub plan_fetched_bytes: AtomicU64,
    pub plan_missing: AtomicU64,
    pub plan_errors: AtomicU64,
    /// Bytes fetched for a plan that was replaced before they were opened.
    pub plan_unused_bytes: AtomicU64,
    pub dir_order_fetched: AtomicU64,
    /// Files (and bytes) fetched ahead by epoch prefetch.
    pub epoch_fetched: AtomicU64,
    pub epoch_fetched_bytes: AtomicU64,
    /// Bytes epoch prefetch fetched and the reader did not open in that epoch.
    pub epoch_wasted_bytes: AtomicU64,
    pub epoch_errors: AtomicU64,
    /// Epoch boundaries seen, and epoch sets enumerated.
    pub epochs: AtomicU64,
    pub epoch_sets: AtomicU64,
}

struct PlanSlot {
    tracker: PlanTracker,
    generation: u64,
    /// Cache entries of the plan items resolved so far, and their plan index.
    entries: HashMap<EntryKey, usize>,
}

/// Files fetched ahead outside a plan (directory order) that the eviction policy should
/// treat as needed soon; bounded.
const MAX_AHEAD_TRACKED: usize = 65_536;

/// See the module documentation.
pub struct Prefetcher {
    pub(crate) ns: Arc<Namespace>,
    pub(crate) fetcher: Arc<Fetcher>,
    config: PrefetchConfig,
    plan: Mutex<Option<PlanSlot>>,
    generation: AtomicU64,
    dirs: Mutex<HashMap<u64, DirOrder>>,
    wake: Notify,
    stopped: AtomicBool,
    stats: PrefetchStats,
    jobs: Mutex<HashMap<u64, Arc<WarmJob>>>,
    next_job: AtomicU64,
    ahead: Mutex<HashSet<EntryKey>>,
    epoch: Mutex<epoch::EpochState>,
    epoch_wake: Notify,
    /// Files open now (opens minus releases): how many the reader reads at once.
    open_files: AtomicU64,
}

/// The eviction policy's view of the plan (see `cache::PlanOracle`), bound to the
/// prefetcher once both exist (the cache is opened before the prefetcher is built).
#[derive(Default)]
pub struct Oracle {
    prefetcher: OnceLock<Weak<Prefetcher>>,
}

impl Oracle {
    pub fn bind(&self, prefetcher: &Arc<Prefetcher>) {
        let _ = self.prefetcher.set(Arc::downgrade(prefetcher));
    }

    fn get(&self) -> Option<Arc<Prefetcher>> {
        self.prefetcher.get().and_then(Weak::upgrade)
    }
}

impl PlanOracle for Oracle {
    fn next_use(&self, key: EntryKey) -> Option<u64> {
        self.get()?.next_use(key)
    }

    fn generation(&self) -> u64 {
        self.get()
            .map_or(0, |p| p.generation.load(Ordering::Relaxed))
    }

    /// The epoch tracker's boundaries ([`PrefetchStats::epochs`]): the one epoch detector of
    /// a mount, whose boundaries the eviction policy follows.
    fn epochs(&self) -> Option<u64> {
        self.get().and_then(|p| p.epochs_seen())
    }

    fn changes(&self) -> (u64, Option<u64>) {
        self.get().map_or((0, None), |p| {
            (p.generation.load(Ordering::Relaxed), p.epochs_seen())
        })
    }
}

impl Prefetcher {
    /// Epoch boundaries the epoch tracker has seen, or `None` when it does not run.
    fn epochs_seen(&self) -> Option<u64> {
        self.config
            .epoch_prefetch
            .then(|| self.stats.epochs.load(Ordering::Relaxed))
    }
}

impl Prefetcher {
    pub fn new(ns: Arc<Namespace>, fetcher: Arc<Fetcher>, config: PrefetchConfig) -> Arc<Self> {
        Arc::new(Prefetcher {
            ns,
            fetcher,
            config,
            plan: Mutex::new(None),
            generation: AtomicU64::new(0),
            dirs: Mutex::new(HashMap::new()),
            wake: Notify::new(),
            stopped: AtomicBool::new(false),
            stats: PrefetchStats::default(),
            jobs: Mutex::new(HashMap::new()),
            next_job: AtomicU64::new(1),
            ahead: Mutex::new(HashSet::new()),
            epoch: Mutex::new(epoch::EpochState::default()),
            epoch_wake: Notify::new(),
            open_files: AtomicU64::new(0),
        })
    }

    #[cfg(test)]
    pub fn stats(&self) -> &PrefetchStats {
        &self.stats
    }

    /// Starts the plan scheduler on the current runtime.
    pub fn start(self: &Arc<Self>) {
        let this = self.clone();
        tokio::spawn(async move { this.schedule().await });
        if self.config.epoch_prefetch {
            let this = self.clone();
            tokio::spawn(async move { this.epoch_schedule().await });
        }
    }

    /// Stops the scheduler and every warm job.
    pub fn shutdown(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        for job in self.jobs.lock().values() {
            job.cancel();
        }
        self.wake.notify_one();
        self.epoch_wake.notify_one();
    }

    fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    /// Replaces the plan (`None` clears it).
    ///
    /// The cache entries of the plan's files whose metadata is already known are worked out
    /// here, before the plan is published, so the eviction oracle knows the whole plan from
    /// the start: files cached in an earlier epoch and needed late in this one must not look
    /// "not needed" (and go first) until the scheduler reaches them. Files whose metadata is
    /// not known yet get their entry when the scheduler resolves them. The generation moves
    /// only after the new plan is in place, so the policy re-asks about its entries against
    /// the new plan.
    pub fn set_plan(&self, plan: Option<Plan>) {
        let lag = (self.config.concurrency * 2).max(16);
        let slot = plan.map(|p| {
            let entries = self.known_entries(&p);
            PlanSlot {
                tracker: PlanTracker::new(p, lag),
                generation: 0,
                entries,
            }
        });
        let old = {
            let mut current = self.plan.lock();
            let old = std::mem::replace(&mut *current, slot);
            let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
            if let Some(slot) = current.as_mut() {
                slot.generation = generation;
            }
            old
        };
        if let Some(old) = old {
            // Fetched for the old plan and never opened: prefetch that went to waste.
            self.stats
                .plan_unused_bytes
                .fetch_add(old.tracker.ready_bytes(), Ordering::Relaxed);
        }
        self.wake.notify_one();
        self.epoch_wake.notify_one();
    }

    /// The cache entry and plan index (first use) of every plan file whose metadata the
    /// namespace holds and trusts now; no request to the store.
    fn known_entries(&self, plan: &Plan) -> HashMap<EntryKey, usize> {
        let mut entries = HashMap::new();
        if self.fetcher.disk().is_none() {
            return entries;
        }
        for i in 0..plan.len() {
            let Some(obj) = self.known_version(plan.path(i)) else {
                continue;
            };
            if let Some(key) = self.entry_key(&obj) {
                entries.entry(key).or_insert(i);
            }
        }
        entries
    }

    fn entry_key(&self, obj: &ObjectVersion) -> Option<EntryKey> {
        self.fetcher.disk().map(|d| d.identity(obj).entry_key())
    }

    /// When the plan (or directory-order read-ahead) needs the cache entry `key` next: the
    /// plan index of its next use, `None` if nothing ahead needs it.
    ///
    /// Called by the cache with its state lock held. The plan and `ahead` locks are only ever
    /// held for short bookkeeping that never calls into the cache, so waiting for them here
    /// cannot deadlock; an answer must not depend on whether another thread happens to hold
    /// them (a "not needed" given under contention would send a needed file to the front of
    /// the eviction order).
    fn next_use(&self, key: EntryKey) -> Option<u64> {
        if let Some(slot) = self.plan.lock().as_ref() {
            let position = slot.tracker.position();
            if let Some(&i) = slot.entries.get(&key) {
                let needed = i >= position && slot.tracker.state(i) != plan::ItemState::Opened;
                return needed.then_some(i as u64);
            }
            if self.ahead.lock().contains(&key) {
                return Some(position as u64);
            }
            return None;
        }
        let needed = self.ahead.lock().contains(&key) || self.epoch.lock().is_needed(&key);
        needed.then_some(0)
    }

    /// Tells the prefetcher that a file handle was released.
    pub fn on_release(&self) {
        let _ = self
            .open_files
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// Tells the prefetcher that `ino` (the object `obj`) was opened, by a caller not known.
    #[cfg(test)]
    pub fn on_open(self: &Arc<Self>, ino: u64, obj: &Arc<ObjectVersion>) {
        self.on_open_by(ino, obj, None);
    }

    /// Tells the prefetcher that `ino` (the object `obj`) was opened by `caller` (the thread or
    /// process id the kernel reports with the open), which tells readers apart.
    pub fn on_open_by(self: &Arc<Self>, ino: u64, obj: &Arc<ObjectVersion>, caller: Option<u32>) {
        self.stats.opens.fetch_add(1, Ordering::Relaxed);
        let open_now = self.open_files.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(key) = self.entry_key(obj) {
            self.ahead.lock().remove(&key);
        }
        let cached = self.fetcher.is_cached(obj);
        if cached {
            self.stats.opens_cached.fetch_add(1, Ordering::Relaxed);
        }
        let mut in_plan = false;
        if let Some(slot) = self.plan.lock().as_mut() {
            let path = self.ns.relative_path(ino);
            if slot.tracker.opened(&path).is_some() {
                in_plan = true;
                self.stats.plan_opens.fetch_add(1, Ordering::Relaxed);
                if cached {
                    self.stats.plan_opens_ready.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        self.epoch_on_open(ino, obj, open_now, caller);
        if in_plan {
            self.wake.notify_one();
        } else {
            self.follow_directory_order(ino);
        }
    }

    fn follow_directory_order(self: &Arc<Self>, ino: u64) {
        let Some((parent, listing, index)) = self.ns.listing_position(ino) else {
            return;
        };
        let ahead = {
            let mut dirs = self.dirs.lock();
            let tolerance = (self.config.concurrency / 4).max(4);
            dirs.entry(parent)
                .or_insert_with(|| DirOrder::new(self.config.max_dir_window, tolerance))
                .opened(index, listing.len())
        };
        for entry in &listing[ahead] {
            if entry.is_dir() {
                continue;
            }
            let Some(obj) = self.known_file(entry.ino()) else {
                continue;
            };
            if self.fetcher.is_cached(&obj) {
                continue;
            }
            self.stats.dir_order_fetched.fetch_add(1, Ordering::Relaxed);
            if let Some(key) = self.entry_key(&obj) {
                let mut ahead = self.ahead.lock();
                if ahead.len() >= MAX_AHEAD_TRACKED {
                    ahead.clear();
                }
                ahead.insert(key);
            }
            let this = self.clone();
            tokio::spawn(async move {
                if !this.is_stopped() {
                    let _ = this.fetch_file(&obj).await;
                }
            });
        }
    }

    /// Fetches the part of `obj` that prefetch covers.
    async fn fetch_file(&self, obj: &Arc<ObjectVersion>) -> Result<u64, crate::fetch::FetchError> {
        let bytes = obj.size.min(self.config.max_file_bytes);
        let blocks = 0..bytes.div_ceil(self.fetcher.config().block_size);
        self.fetcher
            .fetch_background(obj, blocks, Priority::Prefetch)
            .await?;
        Ok(bytes)
    }

    /// The plan scheduler: hands out plan items in order as the window allows.
    async fn schedule(self: Arc<Self>) {
        let window = Window {
            concurrency: self.config.concurrency,
            bytes: self.config.byte_budget,
            items: self.config.max_items_ahead,
        };
        loop {
            let notified = self.wake.notified();
            if self.is_stopped() {
                return;
            }
            let batch = match self.plan.lock().as_mut() {
                Some(slot) => {
                    let items = slot.tracker.next_to_fetch(window);
                    let paths: Vec<_> = items
                        .iter()
                        .map(|&i| (i, slot.tracker.plan().path(i).clone()))
                        .collect();
                    Some((slot.generation, paths))
                }
                None => None,
            };
            if let Some((generation, items)) = batch {
                let mut cached = Vec::new();
                for (i, path) in items {
                    // Already whole in a cache (a later epoch): nothing to fetch, and no task
                    // to spawn. (Checked without the plan lock: the cache's eviction policy
                    // takes the plan lock while holding its own.)
                    if self.known_and_cached(&path) {
                        cached.push(i);
                        continue;
                    }
                    let this = self.clone();
                    tokio::spawn(async move { this.fetch_plan_item(generation, i, &path).await });
                }
                if !cached.is_empty() {
                    if let Some(slot) = self.plan.lock().as_mut() {
                        if slot.generation == generation {
                            for i in cached {
                                slot.tracker.fetched(i, Ok(Some(0)));
                            }
                        }
                    }
                    continue; // the window has room again
                }
            }
            notified.await;
        }
    }

    /// The object version at `path` if the namespace holds and trusts its metadata now (no
    /// request to the store); `None` for a directory or an unknown path.
    fn known_version(&self, path: &str) -> Option<Arc<ObjectVersion>> {
        file_version(&self.ns, self.ns.resolve_cached(path)?)
    }

    /// The object version of file `ino` as last known (no request to the store); `None` for a
    /// directory or an unknown inode.
    fn known_file(&self, ino: u64) -> Option<Arc<ObjectVersion>> {
        file_version(&self.ns, self.ns.cached_attr(ino).ok()?)
    }

    /// Whether `path`'s metadata is known and trusted and its object is whole in a cache.
    fn known_and_cached(&self, path: &str) -> bool {
        self.known_version(path)
            .is_some_and(|obj| self.fetcher.is_cached(&obj))
    }

    async fn fetch_plan_item(&self, generation: u64, i: usize, path: &str) {
        let outcome = if self.is_stopped() {
            Err(())
        } else {
            match self.ns.resolve(path).await {
                Ok(attr) => match file_version(&self.ns, attr) {
                    Some(obj) => {
                        if let Some(key) = self.entry_key(&obj) {
                            if let Some(slot) = self.plan.lock().as_mut() {
                                if slot.generation == generation {
                                    slot.entries.entry(key).or_insert(i);
                                }
                            }
                        }
                        match self.fetch_file(&obj).await {
                            Ok(bytes) => {
                                self.stats.plan_fetched.fetch_add(1, Ordering::Relaxed);
                                self.stats
                                    .plan_fetched_bytes
                                    .fetch_add(bytes, Ordering::Relaxed);
                                Ok(Some(bytes))
                            }
                            Err(e) => {
                                tracing::debug!(%path, error = %e, "plan prefetch failed");
                                self.stats.plan_errors.fetch_add(1, Ordering::Relaxed);
                                Err(())
                            }
                        }
                    }
                    None => Ok(None), // a directory
                },
                Err(NamespaceError::NotFound) => {
                    self.stats.plan_missing.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%path, "plan item not in the store; skipped");
                    Ok(None)
                }
                Err(e) => {
                    tracing::debug!(%path, error = %e, "plan item lookup failed");
                    self.stats.plan_errors.fetch_add(1, Ordering::Relaxed);
                    Err(())
                }
            }
        };
        if let Some(slot) = self.plan.lock().as_mut() {
            if slot.generation == generation {
                slot.tracker.fetched(i, outcome);
            }
        }
        self.wake.notify_one();
    }

    /// Bytes a warm job may still bring in without evicting what is cached.
    pub(crate) fn room_for_warm(&self) -> u64 {
        match self.fetcher.disk() {
            Some(disk) => {
                let s = disk.cache().stats();
                s.limit.saturating_sub(s.bytes)
            }
            None => self.fetcher.config().block_cache_bytes,
        }
    }

    /// Starts a warm job over `paths` (relative to the mount root; empty = all).
    pub fn warm(self: &Arc<Self>, paths: Vec<String>) -> u64 {
        let id = self.next_job.fetch_add(1, Ordering::Relaxed);
        let job = WarmJob::new(id);
        self.jobs.lock().insert(id, job.clone());
        let this = self.clone();
        tokio::spawn(async move { warm::run(this, job, paths).await });
        id
    }

    pub fn warm_progress(&self, id: u64) -> Option<warm::Progress> {
        self.jobs.lock().get(&id).map(|j| j.progress())
    }

    pub fn cancel_warm(&self, id: u64) -> bool {
        match self.jobs.lock().get(&id) {
            Some(job) => {
                job.cancel();
                true
            }
            None => false,
        }
    }

    /// Records the prefetch section of `riffle stats`.
    pub fn record(&self, sample: &mut Sample) {
        let s = &self.stats;
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        match self.plan.lock().as_ref() {
            Some(slot) => {
                let t = &slot.tracker;
                sample.put(&defs::PREFETCH_PLAN_ITEMS, t.plan().len());
                sample.put(&defs::PREFETCH_PLAN_POSITION, t.position());
                sample.put(&defs::PREFETCH_PLAN_FETCHING, t.fetching());
                sample.put(&defs::PREFETCH_PLAN_READY_UNOPENED_BYTES, t.ready_bytes());
            }
            None => sample.absent(&defs::PREFETCH_PLAN),
        }
        sample.put(&defs::PREFETCH_OPENS, load(&s.opens));
        sample.put(&defs::PREFETCH_OPENS_ALREADY_CACHED, load(&s.opens_cached));
        sample.put(&defs::PREFETCH_PLAN_OPENS, load(&s.plan_opens));
        let ready = load(&s.plan_opens_ready);
        sample.put(&defs::PREFETCH_PLAN_OPENS_ALREADY_CACHED, ready);
        sample.put(&defs::PREFETCH_PLAN_FETCHED_FILES, load(&s.plan_fetched));
        sample.put(
            &defs::PREFETCH_PLAN_FETCHED_BYTES,
            load(&s.plan_fetched_bytes),
        );
        sample.put(&defs::PREFETCH_PLAN_MISSING, load(&s.plan_missing));
        sample.put(&defs::PREFETCH_PLAN_ERRORS, load(&s.plan_errors));
        sample.put(
            &defs::PREFETCH_PLAN_UNUSED_BYTES,
            load(&s.plan_unused_bytes),
        );
        sample.put(
            &defs::PREFETCH_DIR_ORDER_FETCHED_FILES,
            load(&s.dir_order_fetched),
        );
        self.record_epoch(sample);
    }
}

/// The object version a file node stands for; `None` for a directory.
fn file_version(ns: &Namespace, attr: Attr) -> Option<Arc<ObjectVersion>> {
    let Kind::File { size, etag } = attr.kind else {
        return None;
    };
    Some(Arc::new(ObjectVersion {
        key: Arc::from(ns.key_of(attr.ino).as_str()),
        etag,
        size,
    }))
}

#[cfg(test)]
mod tests;
