//! Epoch prefetch: fetching the unread files of a shuffled epoch, with no plan.
//!
//! # Why it works without the order
//! A shuffled epoch is sampling *without replacement*. The order is unknown, but the **set** is
//! known: every file of the dataset that has not been opened in this epoch will be opened
//! before the epoch ends, and every file that has been opened will not be needed again until
//! the next one. So the files of the set that are neither opened nor cached can be fetched in
//! any order, as many at once as the store's latency needs, and every one of them is a future
//! hit. A random open finds its file cached with probability "cached and unopened ÷ unopened",
//! which grows towards 1 as the background fetches overtake the reader: the first epoch
//! becomes "copy-first in the background, demand reads first", and an epoch over a set larger
//! than the cache becomes one whose opens are mostly hits while each file is still fetched at
//! most once.
//!
//! # Recognising the set
//! Opens outside a plan are watched. Their parent directories' lowest common ancestor is the
//! *candidate root* (for ImageFolder's `root/class/img` the dataset root after two opens from
//! different classes; for a flat directory that directory). After [`MIN_OPENS_TO_BUILD`]
//! distinct opens under a candidate, the files under it are enumerated in the background and
//! become the *epoch set*, directory by directory in listing order: first at once from the
//! listings the namespace holds (every directory the reader opened a file in is among them,
//! so fetching starts within the open that triggered it), then again once the directories not
//! listed yet are listed, [`LIST_CONCURRENCY`] at a time (a few hundred directories behind a
//! 30 ms store take about a second to list, a second in which nothing would be fetched). An
//! open outside the set's root moves the candidate up and the set is rebuilt at the new root.
//! A new set keeps the old one's opened marks and fetched-ahead marks by inode, so nothing
//! counted against the allowance is forgotten and nothing is fetched twice.
//!
//! Only the directories the reader has opened a file in (*drawn from*) are fetched, in the
//! order it first drew from them. A job that reads some classes of a tree (a subset of the
//! directories, an evaluation split next to the training one) gets those; ImageFolder over a
//! whole dataset draws from every class within its first few thousand opens, while the
//! allowance below is still small.
//!
//! # Epochs
//! Each file keeps the sequence number of its last open. An open of a file already opened in this
//! epoch is a *repeat* if at least a gap of `clamp(n/16, 4, 64)` other opens came between the two
//! (`n`: files opened in this epoch or the last, the larger; a file read twice in a row, or by two
//! processes at once, is not the next epoch). The next epoch starts when the distinct repeats reach
//! `clamp(n/64, 8, 1024)`; it is placed retroactively one gap before the first of them, so the
//! files opened since then count as opened in the new epoch and none of them is fetched again in it
//! (the few from the end of the old epoch that this takes along may miss later: a miss, never a
//! second GET; their next opens are not repeats). At a boundary the opened marks reset, the fetch
//! cursor goes back to the start of the set, and the files fetched ahead and never opened in the
//! ending epoch are counted as wasted (they stay cached and are needed in the new epoch like any
//! cached file).
//!
//! # What users do not pay for it
//! - **Browsing** (a few files opened by hand, an evaluation reading 1% of the set): the bytes
//!   fetched ahead and not yet opened stay within an allowance that grows with what the reader
//!   has opened in this epoch and with how many files it reads at once (`P`, the most files
//!   open at the same time over the last [`PARALLEL_WINDOW`] opens or the window before, but
//!   no more than the distinct threads or processes that opened them, at most
//!   [`MAX_PARALLEL`]; a file's RELEASE reaches the daemon after `close` returns, so one
//!   thread is often seen with two files open): `max(opened_bytes × max(1, opened_files / RAMP_FILES) × P, FLOOR)`.
//!   One reader thread opening its first [`RAMP_FILES`] files can cause at most as many bytes
//!   fetched ahead as it read (bytes fetched ≤ 2 × bytes read once it has read a megabyte);
//!   a data loader with eight workers gets eight times that (by Little's law its prefetch needs
//!   scale with its parallelism), and as a real epoch goes on the allowance grows
//!   quadratically. For 8 reader threads with 35 ms per miss, a linear allowance takes about
//!   43% longer than an exact plan and the quadratic one about as long; what it still misses
//!   is early in the epoch, which is what `P` shortens.
//! - **The first opens.** In an epoch that is not trusted, at most [`RAMP_PARALLEL`] epoch
//!   fetches per reader thread are in flight until it has opened [`RAMP_FILES`] files: its
//!   first opens are nearly all misses, and beside a full set of prefetches they waited for a
//!   store that serves every request alike (about 1.5× as long for an 8-thread reader's first
//!   256 files).
//! - **Usefulness**: at each boundary the share of files fetched ahead that were opened in the
//!   epoch is measured. At least [`TRUST_USEFUL`] (a reader of the whole set) makes the next
//!   epoch *trusted*: the allowance is lifted and only the cache room bounds prefetch. Below
//!   [`BACK_OFF_USEFUL`] (a node of a multi-node job that reads a random share of the set per
//!   epoch) the next epoch is *backed off*: the allowance stays at `max(opened_bytes, FLOOR)`
//!   (no growth), so such a node fetches at most about twice what it reads.
//! - **Room**: with an NVMe cache, the bytes of set files that are cached and not opened in this
//!   epoch (fetched ahead, or kept from the last epoch) stay under the cache limit less
//!   1/[`DEMAND_RESERVE`] of it (the rest is for demand reads and the cache's own rounding). In
//!   a set larger than the cache every byte of room is a hit later in the epoch: with a cache
//!   of half the set's bytes, keeping back 1/16 rather than 1/8 raises the share of opens
//!   after the first epoch that are cached from 0.79 to 0.81, with no file fetched twice.
//!   The space prefetch fetches into therefore comes only from files already opened in this
//!   epoch (and from anything outside the set): the eviction oracle reports every cached,
//!   unopened file of the set as needed (the `plan` eviction policy, the default, then evicts
//!   everything else first), so a file fetched ahead is never evicted to make room for another
//!   prefetch. Without an NVMe cache the ahead bytes stay within the prefetch byte budget (half
//!   the memory cache).
//! - **The eviction policy is told.** The policy caches its last answer per entry and asks
//!   again on a use of the entry or when the oracle's generation moves; so the generation
//!   moves whenever cached files become needed in bulk (a set installed, a boundary's rebuild,
//!   a fill that found cached files). Without it the files kept from the last epoch stayed in
//!   the policy's "not needed" order and went first: a set twice the cache's size was fetched
//!   nearly whole every epoch, some files twice, instead of about half and none twice (a unit
//!   test checks this). The boundaries found here are the mount's only ones: the oracle
//!   reports their count (`PlanOracle::epochs`, [`PrefetchStats::epochs`]) and the eviction
//!   policy's epoch classes follow it instead of inferring epochs from the cache's accesses.
//! - With `--eviction lru` or `epoch` the policy does not ask, and the memory cache (no
//!   `--cache-dir`) evicts by its own order, so a file fetched ahead could be the next victim:
//!   then only sets whose drawn-from directories fit in the room are prefetched.
//! - A plan, when set, wins: epoch prefetch pauses while one is active. Directory order and
//!   `--warm` work as before (a fetch already in flight is shared, never repeated).
//!
//! # Cost
//! Per file of the set: its inode, size and last-open sequence (24 bytes), a flag byte and an
//! index entry (about 24 bytes), plus 24 bytes per cached unopened file in the needed map. A
//! set is capped at [`MAX_SET_FILES`]. An open is O(1); a boundary and the rebuild of the
//! needed map are O(set) once per epoch.

mod machine;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::StreamExt;

pub(super) use machine::EpochState;
use machine::{common_ancestor, DirRange, EpochSet, Listed, AHEAD};

use super::Prefetcher;
use crate::cache::EntryKey;
use crate::fetch::{ObjectVersion, Priority};
use crate::namespace::Kind;
use crate::stats::{defs, Sample};

/// Opens under a candidate root before its files are enumerated.
pub const MIN_OPENS_TO_BUILD: u32 = 4;
/// Distinct files outside the set remembered at most (enough to place the candidate root).
const OUTSIDE_TRACKED: usize = 4096;
/// Directories listed at once while enumerating a set.
pub const LIST_CONCURRENCY: usize = 16;
/// Opens over which the browsing allowance grows by one more "opened bytes".
pub const RAMP_FILES: u64 = 256;
/// Opens per window of the reader's parallelism (the most files open at once).
pub const PARALLEL_WINDOW: u64 = 64;
/// Epoch fetches in flight per reader thread while an epoch ramps up (see
/// [`EpochState::concurrency`]).
pub const RAMP_PARALLEL: usize = 3;
/// The parallelism the allowance scales with, at most.
pub const MAX_PARALLEL: u64 = 16;
/// The NVMe cache's share (one part in this many) kept out of the epoch room, for demand reads
/// and the cache's rounding.
pub const DEMAND_RESERVE: u64 = 16;
/// Bytes that may be fetched ahead before anything is opened.
pub const FLOOR_BYTES: u64 = 1 << 20;
/// Usefulness at or above which the next epoch is trusted.
pub const TRUST_USEFUL: f64 = 0.75;
/// Usefulness below which the next epoch backs off.
pub const BACK_OFF_USEFUL: f64 = 0.6;
/// Files fetched ahead in an epoch before its usefulness is judged.
pub const MIN_JUDGED: u64 = 16;
/// The largest set tracked.
pub const MAX_SET_FILES: usize = 16_000_000;

/// What one [`Prefetcher::epoch_fill`] did.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Fill {
    /// Fetches started.
    started: usize,
    /// Files were skipped (already cached, or metadata unknown): call again at once.
    again: bool,
    /// Cached files became needed: the eviction policy must re-ask about them.
    newly_needed: bool,
    /// This call counted itself in [`EpochState::filling`].
    counted: bool,
}

/// What [`Prefetcher::epoch_on_open`] found out, for the caller to act on.
#[derive(Default)]
struct OpenOutcome {
    build: Option<u64>,
    boundary: bool,
    /// The scheduler has nothing to do after this open ([`EpochState::idle`]).
    idle: bool,
}

impl Prefetcher {
    /// The epoch tracker's part of an open outside a plan: updates the set and the epoch, and
    /// starts a set enumeration or a boundary's follow-up where one is due.
    pub(super) fn epoch_on_open(
        self: &Arc<Self>,
        ino: u64,
        obj: &Arc<ObjectVersion>,
        open_now: u64,
        caller: Option<u32>,
    ) {
        if !self.config.epoch_prefetch {
            return;
        }
        let key = self.entry_key(obj);
        let parent = self.ns.parent_of(ino);
        let outcome = {
            let mut st = self.epoch.lock();
            st.seq += 1;
            let seq = st.seq;
            st.note_parallelism(open_now, caller);
            let mut outcome = OpenOutcome::default();
            let in_set = st
                .set
                .as_ref()
                .and_then(|s| s.index.get(&ino).map(|&i| i as usize));
            match in_set {
                Some(i) => {
                    if let Some(key) = key {
                        st.forget_needed(&key);
                    }
                    if st.record_open(i, seq, self.config.max_file_bytes) {
                        st.start_epoch(&self.stats.epoch_wasted_bytes);
                        outcome.boundary = true;
                    }
                }
                None => {
                    if st.building.is_some() && st.pending_opens.len() < MAX_SET_FILES {
                        st.pending_opens.push((ino, seq));
                    }
                    // The candidate root moves only on distinct files, so one file outside
                    // the set opened again and again (a label file) cannot widen it.
                    let new = !st.outside.contains_key(&ino);
                    if new && st.outside.len() < OUTSIDE_TRACKED {
                        st.outside.insert(ino, seq);
                        let candidate = match st.candidate {
                            None => parent,
                            Some(c) => common_ancestor(c, parent, |n| self.ns.parent_of(n)),
                        };
                        st.candidate = Some(candidate);
                    } else if let Some(at) = st.outside.get_mut(&ino) {
                        *at = seq;
                    }
                    let built = st.set.as_ref().map(|s| s.root) == st.candidate;
                    if !built
                        && st.building.is_none()
                        && st.outside.len() >= MIN_OPENS_TO_BUILD as usize
                    {
                        st.building = st.candidate;
                        outcome.build = st.candidate;
                    }
                }
            }
            outcome.idle = st.idle();
            outcome
        };
        if let Some(root) = outcome.build {
            let this = self.clone();
            tokio::spawn(async move { this.build_set(root).await });
        }
        if outcome.boundary {
            self.stats.epochs.fetch_add(1, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::Relaxed);
        }
        // An open that cannot give the scheduler work wakes nobody: waking the scheduler's
        // task costs a thread wake-up (a context switch on the open's path) per file, the
        // largest part of a warm open on a small machine.
        if !outcome.idle || outcome.build.is_some() || outcome.boundary {
            self.epoch_wake.notify_one();
        }
    }

    /// Enumerates the files under `root` and installs them as the epoch set.
    async fn build_set(self: Arc<Self>, mut root: u64) {
        loop {
            let Some(next) = self.build_set_once(root).await else {
                return;
            };
            root = next;
        }
    }

    /// One enumeration and install; the next root to enumerate if the candidate moved up
    /// meanwhile.
    async fn build_set_once(self: &Arc<Self>, root: u64) -> Option<u64> {
        // First the directories listed already (every one the reader opened a file in), so
        // fetching starts now rather than after the whole tree is listed (200 directories
        // behind a 30 ms store took a second); the full set replaces it when listed.
        let result = match self.enumerate_listed(root) {
            Ok((listed, true)) => Ok(listed),
            Ok((listed, false)) => {
                if !listed.inos.is_empty() {
                    let mut st = self.epoch.lock();
                    st.install(
                        EpochSet::new(root, self.ns.relative_path(root), listed),
                        self.config.max_file_bytes,
                    );
                    drop(st);
                    self.generation.fetch_add(1, Ordering::Relaxed);
                    self.epoch_wake.notify_one();
                }
                self.enumerate(root).await
            }
            Err(e) => Err(e),
        };
        let rebuild = {
            let mut st = self.epoch.lock();
            st.building = None;
            match result {
                Ok(listed) => {
                    st.install(
                        EpochSet::new(root, self.ns.relative_path(root), listed),
                        self.config.max_file_bytes,
                    );
                    st.note = None;
                    self.stats.epoch_sets.fetch_add(1, Ordering::Relaxed);
                }
                Err(note) => {
                    tracing::debug!(%note, "epoch prefetch: no set");
                    st.note = Some(note);
                    st.pending_opens.clear();
                }
            }
            // The candidate moved up while this one was enumerated: enumerate again.
            match st.candidate {
                Some(c) if Some(c) != st.set.as_ref().map(|s| s.root) && c != root => {
                    st.building = Some(c);
                    Some(c)
                }
                _ => None,
            }
        };
        self.generation.fetch_add(1, Ordering::Relaxed);
        self.epoch_wake.notify_one();
        rebuild
    }

    /// The files under `root` (inodes and sizes), directory by directory in listing order.
    async fn enumerate(&self, root: u64) -> Result<Listed, String> {
        let mut out = Listed::default();
        let mut level = vec![root];
        while !level.is_empty() {
            let listings: Vec<_> = futures::stream::iter(level)
                .map(|dir| async move { (dir, self.ns.readdir(dir).await) })
                .buffered(LIST_CONCURRENCY)
                .collect()
                .await;
            let mut next = Vec::new();
            for (dir, listing) in listings {
                if self.is_stopped() {
                    return Err("stopped".into());
                }
                let entries =
                    listing.map_err(|e| format!("listing {}: {e}", self.ns.key_of(dir)))?;
                self.add_listed(&mut out, &entries, &mut next);
                if out.inos.len() > MAX_SET_FILES {
                    return Err(self.too_large(root));
                }
            }
            level = next;
        }
        Ok(out)
    }

    /// The files under `root` in the directories whose listings the namespace holds now (no
    /// I/O), and whether that was every directory under it. The directories a reader has
    /// opened files in are listed already, so this set can be fetched from at once while the
    /// rest of the tree is listed ([`Self::build_set_once`]).
    fn enumerate_listed(&self, root: u64) -> Result<(Listed, bool), String> {
        let mut out = Listed::default();
        let mut complete = true;
        let mut level = vec![root];
        while !level.is_empty() {
            let mut next = Vec::new();
            for dir in level {
                let Some(entries) = self.ns.readdir_cached(dir) else {
                    complete = false;
                    continue;
                };
                self.add_listed(&mut out, &entries, &mut next);
                if out.inos.len() > MAX_SET_FILES {
                    return Err(self.too_large(root));
                }
            }
            level = next;
        }
        Ok((out, complete))
    }

    fn too_large(&self, root: u64) -> String {
        format!(
            "{} holds more than {MAX_SET_FILES} files; epoch prefetch is off for it",
            self.ns.key_of(root)
        )
    }

    /// Appends one directory's listing to `out`: its files as the next directory range, its
    /// subdirectories to `next`.
    fn add_listed(
        &self,
        out: &mut Listed,
        entries: &[crate::namespace::DirEntry],
        next: &mut Vec<u64>,
    ) {
        let d = out.dirs.len() as u32;
        let start = out.inos.len() as u32;
        let mut bytes = 0;
        for e in entries.iter() {
            match self.ns.cached_attr(e.ino()).map(|a| a.kind) {
                Ok(Kind::Dir) => next.push(e.ino()),
                Ok(Kind::File { size, .. }) => {
                    out.inos.push(e.ino());
                    out.sizes.push(size);
                    out.dir_of.push(d);
                    bytes += size;
                }
                Err(_) => {}
            }
        }
        out.dirs.push(DirRange {
            start,
            end: out.inos.len() as u32,
            drawn: false,
            bytes,
        });
    }

    /// Bytes the set's cached unopened files may take: the NVMe cache less 1/[`DEMAND_RESERVE`]
    /// of it, or the prefetch byte budget in memory.
    fn epoch_room(&self) -> u64 {
        match self.fetcher.disk() {
            Some(disk) => {
                let limit = disk.cache().limit();
                limit - limit / DEMAND_RESERVE
            }
            None => self.config.byte_budget,
        }
    }

    /// Whether `obj` is whole where it stays: on the NVMe cache when there is one (blocks only
    /// in the memory tier are gone soon and are not counted against the room), else in memory.
    fn held(&self, obj: &Arc<ObjectVersion>) -> bool {
        match self.fetcher.disk() {
            Some(disk) => disk.cache().is_complete(&disk.identity(obj)),
            None => self.fetcher.is_cached(obj),
        }
    }

    /// Rebuilds the needed map after an install or a boundary: every cached file of the set
    /// not opened in this epoch. The cache checks run without the lock.
    async fn rebuild_needed(&self) {
        let (inos, epoch) = {
            let mut st = self.epoch.lock();
            st.needs_rebuild = false;
            let Some(set) = st.set.as_ref() else {
                return;
            };
            (set.inos.clone(), st.epoch)
        };
        let mut found = Vec::new();
        for chunk in inos.chunks(4096) {
            for &ino in chunk {
                let Some(obj) = self.known_file(ino) else {
                    continue;
                };
                if self.held(&obj) {
                    if let Some(key) = self.entry_key(&obj) {
                        found.push((ino, key, obj.size));
                    }
                }
            }
            tokio::task::yield_now().await;
        }
        let mut st = self.epoch.lock();
        if st.epoch != epoch || st.needs_rebuild {
            return; // another boundary or install meanwhile: its own rebuild follows
        }
        let Some(set) = st.set.as_ref() else {
            return;
        };
        // Files opened in this epoch (also those opened while this ran) are not needed; what
        // in-flight prefetches added since is kept.
        let epoch_start = st.epoch_start;
        let unopened = |ino: &u64| {
            set.index
                .get(ino)
                .is_none_or(|&i| set.opened_at[i as usize] <= epoch_start)
        };
        let mut needed: HashMap<EntryKey, u64> = found
            .into_iter()
            .filter(|(ino, _, _)| unopened(ino))
            .map(|(_, key, size)| (key, size))
            .collect();
        for (key, size) in st.needed.drain() {
            needed.entry(key).or_insert(size);
        }
        st.needed_bytes = needed.values().sum();
        st.needed = needed;
        drop(st);
        // The eviction policy re-asks about every entry: those it holds as "not needed" (the
        // last epoch's, read since) are needed again. Without this they stayed in its
        // not-needed order until touched and went first, before files read in this epoch.
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    /// The epoch prefetch scheduler: keeps fetching unopened, uncached files of the set while
    /// the allowance and the room allow, up to the prefetch concurrency.
    pub(super) async fn epoch_schedule(self: Arc<Self>) {
        loop {
            let notified = self.epoch_wake.notified();
            if self.is_stopped() {
                return;
            }
            if self.plan.lock().is_none() {
                if self.epoch.lock().needs_rebuild {
                    self.rebuild_needed().await;
                }
                if self.epoch_fill().again {
                    continue;
                }
            }
            notified.await;
        }
    }

    /// Starts what the allowance, the room and the concurrency allow.
    ///
    /// While a call holds candidates it has taken from the cursor, `filling` counts it, so
    /// neither [`EpochState::idle`] nor a caller waiting for quiet mistakes it for no work.
    fn epoch_fill(self: &Arc<Self>) -> Fill {
        let fill = self.epoch_fill_batch();
        let mut st = self.epoch.lock();
        st.filling = st.filling.saturating_sub(fill.counted as usize);
        fill
    }

    fn epoch_fill_batch(self: &Arc<Self>) -> Fill {
        let room = self.epoch_room();
        let max_bytes = self.config.max_file_bytes;
        let mut fill = Fill::default();
        if self.plan.lock().is_some() {
            return fill; // a plan knows the order: it wins
        }
        let batch = {
            let mut st = self.epoch.lock();
            // Under an eviction policy that does not ask the prefetcher what it still needs
            // (`--eviction lru` or `epoch`), files fetched ahead of a set larger than the room
            // are evicted before they are read and fetched again: take only sets that fit.
            let unprotected = !self.config.eviction_asks_prefetch || self.fetcher.disk().is_none();
            if unprotected && st.set.as_ref().is_some_and(|set| set.drawn_bytes > room) {
                return fill;
            }
            let free_slots = st
                .concurrency(self.config.concurrency)
                .saturating_sub(st.in_flight);
            if free_slots == 0 {
                return fill;
            }
            let batch = st.candidates(free_slots.min(256));
            st.filling += 1;
            fill.counted = true;
            batch
        };
        let mut batch = batch.into_iter();
        while let Some((i, ino)) = batch.next() {
            let Some(obj) = self.known_file(ino) else {
                fill.again = true;
                continue;
            };
            let key = self.entry_key(&obj);
            if self.held(&obj) {
                if let Some(key) = key {
                    let mut st = self.epoch.lock();
                    let epoch_start = st.epoch_start;
                    let unopened = st
                        .set
                        .as_ref()
                        .is_some_and(|s| s.opened_at.get(i).is_some_and(|&at| at <= epoch_start));
                    if unopened && st.add_needed(key, obj.size) {
                        fill.newly_needed = true;
                    }
                }
                fill.again = true;
                continue;
            }
            let bytes = obj.size.min(max_bytes);
            let epoch = {
                let mut st = self.epoch.lock();
                let epoch = st.epoch;
                let epoch_start = st.epoch_start;
                let limit = st.limit();
                let over = st.ahead_bytes.saturating_add(bytes) > limit
                    || st.needed_bytes.saturating_add(bytes) > room;
                let Some(set) = st.set.as_mut() else {
                    return fill;
                };

                if set.inos.get(i) != Some(&ino)
                    || set.opened_at[i] > epoch_start
                    || set.flags[i] & AHEAD != 0
                {
                    continue;
                }
                if over {
                    // Come back to this file when the reader has opened more (or freed room).
                    st.retry.push((i, ino));
                    st.retry.extend(batch);
                    fill.again = false;
                    drop(st);
                    if fill.newly_needed {
                        self.generation.fetch_add(1, Ordering::Relaxed);
                    }
                    return fill;
                }
                set.flags[i] |= AHEAD;
                st.ahead_bytes += bytes;
                st.ahead_files += 1;
                st.in_flight += 1;
                st.fetched_this_epoch += 1;
                st.fetched_bytes_this_epoch += bytes;
                if let Some(key) = key {
                    st.add_needed(key, obj.size);
                }
                epoch
            };
            fill.started += 1;
            let this = self.clone();
            tokio::spawn(async move { this.epoch_fetch(epoch, (i, ino), obj, key, bytes).await });
        }
        if fill.newly_needed {
            self.generation.fetch_add(1, Ordering::Relaxed);
        }
        fill
    }

    async fn epoch_fetch(
        self: Arc<Self>,
        epoch: u64,
        (i, ino): (usize, u64),
        obj: Arc<ObjectVersion>,
        key: Option<EntryKey>,
        bytes: u64,
    ) {
        let result = if self.is_stopped() {
            Err(crate::fetch::FetchError::Cancelled)
        } else {
            let blocks = 0..obj
                .size
                .min(self.config.max_file_bytes)
                .div_ceil(self.fetcher.config().block_size);
            self.fetcher
                .fetch_background(&obj, blocks, Priority::Prefetch)
                .await
        };
        {
            let mut st = self.epoch.lock();
            st.in_flight = st.in_flight.saturating_sub(1);
            match &result {
                Ok(()) => {
                    self.stats.epoch_fetched.fetch_add(1, Ordering::Relaxed);
                    self.stats
                        .epoch_fetched_bytes
                        .fetch_add(bytes, Ordering::Relaxed);
                }
                Err(e) => {
                    self.stats.epoch_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(key = %obj.key, error = %e, "epoch prefetch failed");
                    if st.epoch == epoch {
                        let epoch_start = st.epoch_start;
                        let mut undo = false;
                        if let Some(set) = st.set.as_mut() {
                            // `i` is of the set the fetch started under; a set installed
                            // since has other indexes.
                            if set.inos.get(i) == Some(&ino)
                                && set.flags[i] & AHEAD != 0
                                && set.opened_at[i] <= epoch_start
                            {
                                set.flags[i] &= !AHEAD;
                                undo = true;
                            }
                        }
                        if undo {
                            st.ahead_bytes = st.ahead_bytes.saturating_sub(bytes);
                            st.ahead_files = st.ahead_files.saturating_sub(1);
                        }
                        if let Some(key) = key {
                            st.forget_needed(&key);
                        }
                    }
                }
            }
        }
        self.epoch_wake.notify_one();
    }

    /// Records the epoch section of `riffle stats`.
    pub(super) fn record_epoch(&self, sample: &mut Sample) {
        let s = &self.stats;
        let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        let plan_active = self.plan.lock().is_some();
        let st = self.epoch.lock();
        let set = st.set.as_ref();
        let root = set.map(|s| {
            if s.root_path.is_empty() {
                "/".to_string()
            } else {
                s.root_path.clone()
            }
        });
        sample.put(&defs::PREFETCH_EPOCH_ENABLED, self.config.epoch_prefetch);
        sample.put(&defs::PREFETCH_EPOCH_ACTIVE, set.is_some() && !plan_active);
        sample.put(&defs::PREFETCH_EPOCH_ROOT, root);
        sample.put(&defs::PREFETCH_EPOCH_FILES, set.map_or(0, |s| s.inos.len()));
        sample.put(
            &defs::PREFETCH_EPOCH_BYTES,
            set.map_or(0, |s| s.total_bytes),
        );
        sample.put(
            &defs::PREFETCH_EPOCH_DIRECTORIES,
            set.map_or(0, |s| s.dirs.len()),
        );
        let drawn = set.map_or(0, |s| s.drawn.len());
        sample.put(&defs::PREFETCH_EPOCH_DIRECTORIES_DRAWN_FROM, drawn);
        let drawn_files = set.map_or(0, |s| s.drawn_files);
        sample.put(&defs::PREFETCH_EPOCH_FILES_DRAWN_FROM, drawn_files);
        let drawn_bytes = set.map_or(0, |s| s.drawn_bytes);
        sample.put(&defs::PREFETCH_EPOCH_BYTES_DRAWN_FROM, drawn_bytes);
        sample.put(&defs::PREFETCH_EPOCH_EPOCH, st.epoch);
        sample.put(&defs::PREFETCH_EPOCH_OPENED_FILES, st.opened_files);
        sample.put(&defs::PREFETCH_EPOCH_OPENED_BYTES, st.opened_bytes);
        sample.put(
            &defs::PREFETCH_EPOCH_FETCHED_AHEAD_FILES,
            st.fetched_this_epoch,
        );
        let fetched_bytes = st.fetched_bytes_this_epoch;
        sample.put(&defs::PREFETCH_EPOCH_FETCHED_AHEAD_BYTES, fetched_bytes);
        sample.put(&defs::PREFETCH_EPOCH_AHEAD_UNOPENED_FILES, st.ahead_files);
        sample.put(&defs::PREFETCH_EPOCH_AHEAD_UNOPENED_BYTES, st.ahead_bytes);
        sample.put(&defs::PREFETCH_EPOCH_FETCHING, st.in_flight);
        sample.put(&defs::PREFETCH_EPOCH_CACHED_UNOPENED_BYTES, st.needed_bytes);
        sample.put(&defs::PREFETCH_EPOCH_MODE, st.trust.as_str());
        sample.put(&defs::PREFETCH_EPOCH_LAST_USEFULNESS, st.last_usefulness);
        sample.put(&defs::PREFETCH_EPOCH_NOTE, st.note.clone());
        sample.put(
            &defs::PREFETCH_EPOCH_TOTAL_FETCHED_FILES,
            load(&s.epoch_fetched),
        );
        let total_bytes = load(&s.epoch_fetched_bytes);
        sample.put(&defs::PREFETCH_EPOCH_TOTAL_FETCHED_BYTES, total_bytes);
        sample.put(
            &defs::PREFETCH_EPOCH_WASTED_BYTES,
            load(&s.epoch_wasted_bytes),
        );
        sample.put(&defs::PREFETCH_EPOCH_ERRORS, load(&s.epoch_errors));
        sample.put(&defs::PREFETCH_EPOCH_EPOCHS_STARTED, load(&s.epochs));
    }
}

#[cfg(test)]
mod tests;
