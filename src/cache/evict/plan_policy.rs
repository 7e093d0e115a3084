//! Clairvoyant eviction from the epoch plan: [`PlanPolicy`] and the [`PlanOracle`] it asks.
//!
//! # Belady with a plan
//! When the trainer says in which order it will open the files (the epoch plan of the prefetch
//! module), the optimal victim is known: the entry whose next use is furthest in the future,
//! and first of all the entries the rest of the plan does not use at all (Belady's MIN, optimal
//! for a cache that must hold what it just fetched). The policy does not know the plan itself:
//! it asks a [`PlanOracle`] — implemented by the prefetch scheduler — for the plan index of an
//! entry's next use after the reader's position.
//!
//! # Two partitions
//! - Entries the plan does **not** need (`next_use` is `None`: already read in this epoch, not
//!   in the plan, or no plan at all) live in an inner [`EpochPolicy`], which orders them and
//!   gives the victims first. With no plan every entry is there, so the policy *is* the
//!   epoch policy; with a plan, the inner order decides which of the entries read in this
//!   epoch survive into the next one.
//! - Entries the plan needs are in a max-heap keyed by their next use, refreshed lazily.
//!
//! # Keeping the heap right cheaply
//! A key's next use only moves *later* as the reader advances (the position never goes back
//! within one plan), and it moves exactly when the reader passes a use of that key — which is
//! when the cache touches it. So the policy re-asks the oracle on every `touch` and pushes the
//! new value (stale heap items are recognised by a per-entry stamp and dropped when they
//! surface). The one way a stored value goes stale without a touch is a use the reader
//! skipped; for that, each `victim` call re-asks the oracle about [`SWEEP`] entries in turn
//! (so every entry is re-checked once every `len / SWEEP` evictions), and the candidate at
//! the top of the heap is always re-checked before it is returned. A plan replacement
//! changes everything: the oracle's [`PlanOracle::generation`] changes, and the next call of
//! any kind re-asks about every entry (O(n log n) once per plan); the entries the new plan
//! does not need all become stale in the inner policy, so they go first, least recently used
//! first.
//!
//! Stale items are dropped by rebuilding the heap once they outnumber the live ones by more
//! than an eighth of the entries (so at most ~2 bytes per cached object are stale items,
//! whether or not the cache ever evicts).
//!
//! Cost: `touch` is one oracle lookup plus O(log n); `victim` is O(log n) amortised, plus
//! O(log n) per unevictable entry at the top of the heap (pinned files are few), plus
//! [`SWEEP`] lookups. The alternative — sampling a few dozen random entries per eviction and
//! taking the furthest, as Redis does — needs no heap and no stamps, but it is only
//! approximately Belady (the furthest of the sample, not of all) and costs a few dozen oracle
//! lookups per eviction; the heap costs 16 bytes per needed entry and is exact whenever the
//! reader's uses are seen as touches (the simulator checks it equals Belady's MIN access for
//! access).
//!
//! The oracle is called with the cache's state lock held: it must be cheap (a hash lookup)
//! and must never call back into the cache.
//!
//! # Eviction that fails
//! As for [`EpochPolicy`]: a touch of an entry handed out as a victim and not removed means
//! the cache could not evict it; it is moved to the bottom of the heap (next use "now") until
//! the oracle is asked about it again.

use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::SystemTime;

use super::{EntryInfo, EpochPolicy, EvictionPolicy, Slot, SlotKeys};
use crate::cache::identity::EntryKey;
use crate::cache::slab::Chunked;

/// Entries re-checked against the oracle per `victim` call.
pub const SWEEP: usize = 8;
const OFFERED_MAX: usize = 64;

/// Where the reader is in the epoch plan, as the eviction policy needs it.
///
/// Implemented by the prefetch scheduler. Positions are plan indices (0-based lines of the
/// plan); the reader's position is the first plan item it has not opened yet.
///
/// - Mark an item opened before (or at least while) the cache is used for it: the policy asks
///   on every touch (open, block read, block write), and an entry whose next use is still
///   reported as the one being read looks needed right now.
/// - Report everything the scheduler has fetched or is fetching ahead of the reader as a
///   future use — plan items, and read-ahead items too (e.g. at `position + distance`, or
///   the index they would have in the listing order): an entry fetched ahead and not yet read
///   must never look "not needed", or it is the first thing evicted.
/// - Called with the disk cache's state lock held: answer from memory (a hash lookup and an
///   atomic load), never block, never call into the cache.
pub trait PlanOracle: Send + Sync {
    /// The smallest plan index `i` at or after the reader's position such that item `i` is the
    /// object of `key` and has not been opened yet; `None` when the rest of the plan does not
    /// use it (or no plan is set). Must only grow as the reader advances through one plan.
    fn next_use(&self, key: EntryKey) -> Option<u64>;

    /// Changes whenever answers may change other than by the reader advancing: a plan set,
    /// replaced or cleared.
    fn generation(&self) -> u64 {
        0
    }

    /// Epoch boundaries the mount's epoch detector has seen so far, or `None` when no detector
    /// runs (no prefetcher, or epoch prefetch off). While this is `Some`, the inner
    /// [`EpochPolicy`] takes its boundaries from it instead of inferring them (see
    /// [`EpochPolicy::follow_announced`]).
    fn epochs(&self) -> Option<u64> {
        None
    }

    /// [`Self::generation`] and [`Self::epochs`] together, as the policy asks on every
    /// access (an oracle that reaches both through one lookup answers them in one call).
    fn changes(&self) -> (u64, Option<u64>) {
        (self.generation(), self.epochs())
    }
}

/// An oracle with no plan: every entry is "not needed", so a [`PlanPolicy`] behaves exactly as
/// its inner [`EpochPolicy`].
#[derive(Debug, Default, Clone, Copy)]
pub struct NoPlan;

impl PlanOracle for NoPlan {
    fn next_use(&self, _key: EntryKey) -> Option<u64> {
        None
    }
}

/// `next` of an entry the plan does not need.
const NOT_NEEDED: u64 = u64::MAX;

/// An entry's place in the plan partition.
#[derive(Debug, Clone, Copy)]
struct Plan {
    /// The next use last seen ([`NOT_NEEDED`]: in the inner policy).
    next: u64,
    stamp: u32,
    live: bool,
    /// At the bottom of the heap after a failed eviction, until the oracle is asked again.
    held: bool,
}

impl Default for Plan {
    fn default() -> Self {
        Plan {
            next: NOT_NEEDED,
            stamp: 0,
            live: false,
            held: false,
        }
    }
}

impl Plan {
    fn next(&self) -> Option<u64> {
        (self.next != NOT_NEEDED).then_some(self.next)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct HeapItem {
    next: u64,
    stamp: u32,
    slot: u32,
}

/// Belady from the epoch plan, epoch-aware for what the plan does not need (see the module
/// documentation).
pub struct PlanPolicy {
    oracle: Arc<dyn PlanOracle>,
    rest: EpochPolicy,
    slots: Chunked<Plan>,
    /// Live entries.
    len: usize,
    /// One past the highest slot ever inserted (the range the sweep and a new plan visit).
    high: u32,
    heap: BinaryHeap<HeapItem>,
    /// Live entries in the heap partition.
    needed: usize,
    generation: u64,
    /// The oracle's [`PlanOracle::epochs`] last seen.
    epochs: Option<u64>,
    cursor: u32,
    offered: Vec<Slot>,
}

impl std::fmt::Debug for PlanPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanPolicy")
            .field("entries", &self.len)
            .field("needed", &self.needed)
            .field("generation", &self.generation)
            .finish()
    }
}

/// How an entry that leaves the plan enters the inner policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leave {
    /// The reader just used it: an access in this epoch.
    Used,
    /// Found not needed without being used (a skipped use, a new plan): the cold end.
    Dropped,
}

impl PlanPolicy {
    /// Heap bytes per slot, this policy's own and its inner policy's (the heap of needed
    /// entries and the inner policy's sample come on top).
    pub const SLOT_BYTES: usize = std::mem::size_of::<Plan>() + EpochPolicy::SLOT_BYTES;

    pub fn new(oracle: Arc<dyn PlanOracle>) -> Self {
        let generation = oracle.generation();
        PlanPolicy {
            oracle,
            rest: EpochPolicy::new(),
            slots: Chunked::new(),
            len: 0,
            high: 0,
            heap: BinaryHeap::new(),
            needed: 0,
            generation,
            epochs: None,
            cursor: 0,
            offered: Vec::new(),
        }
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Entries the plan still needs.
    #[cfg(test)]
    pub fn needed(&self) -> usize {
        self.needed
    }

    /// The inner policy (for diagnostics).
    #[cfg(test)]
    pub fn rest(&self) -> &EpochPolicy {
        &self.rest
    }

    fn live(&self, at: Slot) -> bool {
        self.slots.get(at).is_some_and(|s| s.live)
    }

    /// Slots in the order they would be evicted, by the next uses last seen (for tests and
    /// diagnostics).
    #[cfg(test)]
    pub fn order(&self) -> Vec<Slot> {
        let mut out = self.rest.order();
        let mut needed: Vec<(u64, Slot)> = (0..self.high)
            .filter_map(|i| {
                let s = self.slots.get(i)?;
                s.live.then(|| s.next().map(|n| (n, i))).flatten()
            })
            .collect();
        needed.sort_by(|a, b| b.cmp(a));
        out.extend(needed.into_iter().map(|(_, i)| i));
        out
    }

    fn push(&mut self, i: u32, next: u64) {
        let next = next.min(NOT_NEEDED - 1);
        let s = &mut self.slots[i];
        s.stamp = s.stamp.wrapping_add(1);
        s.next = next;
        s.held = false;
        self.heap.push(HeapItem {
            next,
            stamp: s.stamp,
            slot: i,
        });
        self.compact_if_stale();
    }

    /// Drops the heap's stale items once they outnumber its live ones by more than an
    /// eighth of the slots (plus a small floor); checked whenever an item is pushed or goes
    /// stale. A compaction visits every slot, and at least a sixteenth of the slots' worth of
    /// pushes or leaves come between two of them, so each costs O(1) amortised; the stale
    /// items, 16 bytes each, stay below 2 bytes per cached object. Without this, a cache that
    /// never evicts (W1's) would keep one stale item per use for ever.
    fn compact_if_stale(&mut self) {
        if self.heap.len() > 2 * self.needed + self.high as usize / 8 + 64 {
            self.compact();
        }
    }

    /// Moves slot `i` to where `q` (a fresh answer of the oracle) says.
    fn place(&mut self, i: u32, q: Option<u64>, how: Leave, keys: &dyn SlotKeys) {
        let s = self.slots[i];
        match (s.next(), q) {
            (Some(old), Some(new)) => {
                if old != new.min(NOT_NEEDED - 1) || s.held {
                    self.push(i, new);
                }
            }
            (Some(_), None) => {
                let s = &mut self.slots[i];
                s.stamp = s.stamp.wrapping_add(1);
                s.next = NOT_NEEDED;
                s.held = false;
                self.needed -= 1;
                self.compact_if_stale();
                self.rest.insert(
                    i,
                    &EntryInfo {
                        key: keys.key_of(i),
                        bytes: 0,
                        last_used: (how == Leave::Dropped).then_some(SystemTime::UNIX_EPOCH),
                    },
                    keys,
                );
            }
            (None, Some(new)) => {
                self.rest.remove(i);
                self.needed += 1;
                self.push(i, new);
            }
            (None, None) => {
                if how == Leave::Used {
                    self.rest.touch(i, keys);
                }
            }
        }
    }

    /// After a plan change, re-asks the oracle about every entry (before anything else
    /// happens under the new plan). Returns whether it did.
    fn check_generation(&mut self, keys: &dyn SlotKeys) -> bool {
        let (generation, epochs) = self.oracle.changes();
        self.check_epochs(epochs);
        if generation == self.generation {
            return false;
        }
        self.generation = generation;
        // What the new plan does not need goes first (Belady), oldest first.
        self.rest.all_stale();
        for i in 0..self.high {
            if self.live(i) {
                let q = self.oracle.next_use(keys.key_of(i));
                self.place(i, q, Leave::Dropped, keys);
            }
        }
        self.compact();
        true
    }

    /// Passes the epoch boundaries the oracle announced since the last call on to the inner
    /// policy (before a plan change they came with is applied).
    fn check_epochs(&mut self, epochs: Option<u64>) {
        if epochs == self.epochs {
            return;
        }
        self.rest.follow_announced(epochs.is_some());
        if let (Some(now), Some(before)) = (epochs, self.epochs) {
            // Two boundaries make everything stale: more change nothing.
            for _ in 0..now.saturating_sub(before).min(2) {
                self.rest.new_epoch();
            }
        }
        self.epochs = epochs;
    }

    /// Re-asks the oracle after a plan change, and about a few entries in turn otherwise.
    fn refresh(&mut self, keys: &dyn SlotKeys) {
        if self.check_generation(keys) {
            return;
        }
        let n = self.high;
        if n == 0 {
            return;
        }
        for _ in 0..(SWEEP as u32).min(n) {
            self.cursor = (self.cursor + 1) % n;
            let at = self.cursor;
            let s = self.slots[at];
            if s.held {
                // Held after a failed eviction: re-asked on the next round.
                self.slots[at].held = false;
            } else if s.live && s.next().is_some() {
                let q = self.oracle.next_use(keys.key_of(at));
                self.place(at, q, Leave::Dropped, keys);
            }
        }
        self.compact_if_stale();
    }

    /// Rebuilds the heap from the live entries (drops stale items).
    fn compact(&mut self) {
        let items: Vec<HeapItem> = (0..self.high)
            .filter_map(|i| {
                let s = self.slots.get(i)?;
                s.live
                    .then(|| {
                        s.next().map(|next| HeapItem {
                            next,
                            stamp: s.stamp,
                            slot: i,
                        })
                    })
                    .flatten()
            })
            .collect();
        // `collect` sized the vector to the live items: the capacity of a larger heap goes.
        self.heap = BinaryHeap::from(items);
    }

    fn offer(&mut self, at: Slot) {
        if !self.offered.contains(&at) {
            if self.offered.len() >= OFFERED_MAX {
                self.offered.remove(0);
            }
            self.offered.push(at);
        }
    }
}

impl EvictionPolicy for PlanPolicy {
    fn name(&self) -> &'static str {
        "plan"
    }

    fn insert(&mut self, at: Slot, info: &EntryInfo, keys: &dyn SlotKeys) {
        if self.live(at) {
            self.touch(at, keys);
            return;
        }
        self.check_generation(keys);
        let s = self.slots.grow_to(at);
        // A reused slot's stale heap items must not match: a new stamp.
        *s = Plan {
            stamp: s.stamp.wrapping_add(1),
            live: true,
            ..Plan::default()
        };
        self.len += 1;
        self.high = self.high.max(at + 1);
        match self.oracle.next_use(info.key) {
            Some(next) => {
                self.needed += 1;
                self.push(at, next);
            }
            None => self.rest.insert(at, info, keys),
        }
    }

    fn touch(&mut self, at: Slot, keys: &dyn SlotKeys) {
        if !self.live(at) {
            return;
        }
        self.check_generation(keys);
        if let Some(pos) = self.offered.iter().position(|&k| k == at) {
            // Handed out as a victim and not removed: the cache could not evict it.
            self.offered.swap_remove(pos);
            if self.slots[at].next().is_some() {
                // The bottom of the heap until the oracle is asked again.
                self.push(at, 0);
                self.slots[at].held = true;
            } else {
                self.rest.hold(at);
            }
            return;
        }
        let q = self.oracle.next_use(keys.key_of(at));
        self.place(at, q, Leave::Used, keys);
    }

    fn remove(&mut self, at: Slot) {
        self.offered.retain(|&k| k != at);
        if !self.live(at) {
            return;
        }
        let s = &mut self.slots[at];
        s.live = false;
        s.stamp = s.stamp.wrapping_add(1);
        let was_needed = s.next().is_some();
        s.next = NOT_NEEDED;
        if was_needed {
            self.needed -= 1;
        } else {
            self.rest.remove(at);
        }
        self.len -= 1;
    }

    fn resize(&mut self, at: Slot, bytes: u64) {
        self.rest.resize(at, bytes);
    }

    fn victim(
        &mut self,
        keys: &dyn SlotKeys,
        evictable: &mut dyn FnMut(Slot) -> bool,
    ) -> Option<Slot> {
        self.refresh(keys);
        // What the plan does not need goes first, in the epoch order.
        if let Some(k) = self.rest.victim(keys, evictable) {
            return Some(k);
        }
        let mut skipped = Vec::new();
        let found = loop {
            let Some(top) = self.heap.pop() else {
                break None;
            };
            let s = self.slots[top.slot];
            if !s.live || s.stamp != top.stamp {
                continue; // superseded
            }
            let q = self.oracle.next_use(keys.key_of(top.slot));
            if q.map(|q| q.min(NOT_NEEDED - 1)) != Some(top.next) && !s.held {
                // Stale: re-place it and look again (a key no longer needed is the best victim).
                self.place(top.slot, q, Leave::Dropped, keys);
                if q.is_none() && evictable(top.slot) {
                    break Some(top.slot);
                }
                continue;
            }
            skipped.push(top);
            if evictable(top.slot) {
                break Some(top.slot);
            }
        };
        self.heap.extend(skipped);
        if let Some(k) = found {
            self.offer(k);
        }
        found
    }

    fn memory_bytes(&self) -> usize {
        self.rest.memory_bytes()
            + self.slots.heap_bytes()
            + self.heap.capacity() * std::mem::size_of::<HeapItem>()
            + self.offered.capacity() * std::mem::size_of::<Slot>()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, SystemTime};

    use super::super::epoch_policy::EpochClass;
    use super::*;
    use crate::cache::simulate::{TraceOracle, Workload};

    struct Fixture {
        keys: Vec<EntryKey>,
        oracle: Arc<TraceOracle>,
        p: PlanPolicy,
    }

    impl Fixture {
        fn new(objects: usize) -> Self {
            let keys = Workload::new(objects).keys;
            let oracle = Arc::new(TraceOracle::new(keys.clone()));
            let p = PlanPolicy::new(oracle.clone());
            Fixture { keys, oracle, p }
        }

        /// Object `o` is in slot `o`.
        fn k(&self, o: usize) -> Slot {
            o as Slot
        }

        fn ks(&self, v: &[usize]) -> Vec<Slot> {
            v.iter().map(|&o| o as Slot).collect()
        }

        fn ins(&mut self, o: usize) {
            let info = EntryInfo {
                key: self.keys[o],
                bytes: 1,
                last_used: None,
            };
            self.p.insert(o as Slot, &info, &self.keys);
        }

        fn ins_found(&mut self, o: usize) {
            let info = EntryInfo {
                key: self.keys[o],
                bytes: 1,
                last_used: Some(SystemTime::now() - Duration::from_secs(60)),
            };
            self.p.insert(o as Slot, &info, &self.keys);
        }

        fn touch(&mut self, o: usize) {
            self.p.touch(o as Slot, &self.keys);
        }

        fn victim(&mut self, evictable: &mut dyn FnMut(Slot) -> bool) -> Option<Slot> {
            self.p.victim(&self.keys, evictable)
        }
    }

    #[test]
    fn stale_heap_items_stay_bounded_in_a_cache_that_never_evicts() {
        // W1's shape: every object is needed when it is cached (fetched ahead of the
        // reader), then used once per epoch; the cache is large enough to never evict.
        let n = 6000;
        let mut f = Fixture::new(n);
        let order: Vec<u32> = (0..n as u32).collect();
        for epoch in 0..3 {
            f.oracle.set_plan(&order);
            for o in 0..n {
                if epoch == 0 {
                    f.ins(o);
                } else {
                    f.touch(o);
                }
            }
            for o in 0..n {
                f.oracle.opened(o as u64);
                f.touch(o);
                let bound = 2 * f.p.needed() + n / 8 + 64;
                assert!(f.p.heap.len() <= bound, "{} > {bound}", f.p.heap.len());
            }
            assert_eq!(f.p.needed(), 0);
            // Its memory: a few bytes per object of stale items, not one item per use.
            assert!(f.p.heap.capacity() <= 2 * (n / 8 + 64), "epoch {epoch}");
        }
    }

    #[test]
    fn furthest_next_use_goes_first_after_what_the_plan_does_not_need() {
        let mut f = Fixture::new(8);
        f.oracle.set_plan(&[0, 1, 2, 3, 0, 4]);
        for o in [0, 1, 2, 3, 4, 5] {
            f.ins(o);
        }
        assert_eq!(f.p.needed(), 5);
        // 5 is not in the plan; then 4 (index 5), 3 (3), 2 (2), 1 (1), 0 (0).
        assert_eq!(f.p.order(), f.ks(&[5, 4, 3, 2, 1, 0]));
        assert_eq!(f.victim(&mut |_| true), Some(f.k(5)));
        f.p.remove(f.k(5));
        // Pinned entries are skipped and keep their place.
        let pinned = f.k(4);
        assert_eq!(f.victim(&mut |k| k != pinned), Some(f.k(3)));
        f.p.remove(f.k(3));
        assert_eq!(f.victim(&mut |_| true), Some(f.k(4)));
        assert_eq!(f.victim(&mut |_| false), None);
        // The reader opens 0 (index 0) and reads it: its next use is now index 4.
        f.oracle.opened(0);
        f.touch(0);
        assert_eq!(f.p.order(), f.ks(&[4, 0, 2, 1]));
        // ... opens 1, 2, (3,) 0: 1, 2 and 0 are not needed again: epoch order (newest
        // first), before 4.
        for (i, o) in [(1, 1), (2, 2), (4, 0)] {
            f.oracle.opened(i);
            f.touch(o);
        }
        assert_eq!(f.p.needed(), 1);
        assert_eq!(f.p.order(), f.ks(&[0, 2, 1, 4]));
        assert_eq!(f.p.rest().class(f.k(0)), Some(EpochClass::Done));
        for o in [0, 1, 2, 4] {
            f.p.remove(f.k(o));
        }
        assert!(f.p.is_empty());
        assert_eq!(f.p.needed(), 0);
        assert!(f.p.order().is_empty());
        assert!(f.p.memory_bytes() > 0);
    }

    #[test]
    fn entries_found_at_start_up_are_placed_by_the_plan() {
        let mut f = Fixture::new(4);
        f.oracle.set_plan(&[2, 3]);
        f.ins_found(0);
        f.ins_found(1);
        f.ins_found(2);
        f.ins(3);
        // 0 and 1 are not needed: stale, in the scan's order; then 3, then 2.
        assert_eq!(f.p.order(), f.ks(&[1, 0, 3, 2]));
        assert_eq!(f.p.rest().class(f.k(1)), Some(EpochClass::Stale));
    }

    #[test]
    fn a_new_plan_reorders_everything_and_what_it_does_not_need_goes_first() {
        let mut f = Fixture::new(6);
        f.oracle.set_plan(&[0, 1, 2, 3]);
        for o in 0..4 {
            f.ins(o);
        }
        for i in 0..4 {
            f.oracle.opened(i);
            f.touch(i as usize);
        }
        f.ins(4); // read outside the plan, recently
        assert_eq!(f.p.needed(), 0);
        // Next epoch: 3, 1 are needed; 0, 2, 4 are not, and go first, least recent first.
        f.oracle.set_plan(&[3, 5, 1]);
        assert_eq!(f.victim(&mut |_| true), Some(f.k(0)));
        assert_eq!(f.p.needed(), 2);
        assert_eq!(f.p.order(), f.ks(&[0, 2, 4, 1, 3]));
        // No plan at all: the epoch order, everything stale (least recently used first).
        f.oracle.clear();
        assert_eq!(f.victim(&mut |_| true), Some(f.k(3)));
        assert_eq!(f.p.needed(), 0);
    }

    #[test]
    fn a_use_passed_without_a_touch_is_noticed_by_the_sweep() {
        let mut f = Fixture::new(3);
        f.oracle.set_plan(&[0, 1, 2]);
        for o in 0..3 {
            f.ins(o);
        }
        // The reader skips 0 and 1 without the cache seeing them.
        f.oracle.opened(1);
        assert_eq!(f.p.order(), f.ks(&[2, 1, 0]));
        let v = f.victim(&mut |_| true);
        assert!(v == Some(f.k(0)) || v == Some(f.k(1)), "{v:?}");
        assert_eq!(f.p.needed(), 1);
        assert_eq!(f.p.order().last(), Some(&f.k(2)));
        assert_eq!(f.p.rest().class(f.k(1)), Some(EpochClass::Stale));
    }

    #[test]
    fn a_victim_that_could_not_be_evicted_is_not_offered_again_at_once() {
        let mut f = Fixture::new(3);
        f.oracle.set_plan(&[0, 1, 2]);
        for o in 0..3 {
            f.ins(o);
        }
        assert_eq!(f.victim(&mut |_| true), Some(f.k(2)));
        f.touch(2); // the cache could not remove it
        assert_eq!(f.victim(&mut |_| true), Some(f.k(1)));
        f.p.remove(f.k(1));
        // Asked again (a real touch), it is in its place again.
        f.touch(2);
        assert_eq!(f.p.order(), f.ks(&[2, 0]));
    }

    #[test]
    fn without_a_plan_it_is_the_epoch_policy() {
        let keys = Workload::new(50).keys;
        let mut plan = PlanPolicy::new(Arc::new(NoPlan));
        let mut epoch = EpochPolicy::new();
        for (i, &k) in keys.iter().enumerate() {
            let info = EntryInfo {
                key: k,
                bytes: 1,
                last_used: (i % 7 == 0).then(SystemTime::now),
            };
            plan.insert(i as Slot, &info, &keys);
            epoch.insert(i as Slot, &info, &keys);
            if i % 3 == 0 {
                plan.touch((i / 2) as Slot, &keys);
                epoch.touch((i / 2) as Slot, &keys);
            }
            if i % 5 == 0 {
                let a = plan.victim(&keys, &mut |_| true);
                assert_eq!(a, epoch.victim(&keys, &mut |_| true));
                if let Some(a) = a {
                    plan.remove(a);
                    epoch.remove(a);
                }
            }
        }
        assert_eq!(plan.order(), epoch.order());
    }

    /// An oracle with no plan whose epoch detector announces boundaries when told to.
    struct Announcer(AtomicU64);

    impl PlanOracle for Announcer {
        fn next_use(&self, _key: EntryKey) -> Option<u64> {
            None
        }

        fn epochs(&self) -> Option<u64> {
            Some(self.0.load(Ordering::Relaxed))
        }
    }

    /// Inserts objects `0..n`, then touches them all again: a second pass, whose repeats
    /// end the first epoch for a policy that infers boundaries.
    fn two_passes(p: &mut PlanPolicy, keys: &Vec<EntryKey>) {
        for (i, &key) in keys.iter().enumerate() {
            let info = EntryInfo {
                key,
                bytes: 1,
                last_used: None,
            };
            p.insert(i as Slot, &info, keys);
        }
        for i in 0..keys.len() {
            p.touch(i as Slot, keys);
        }
    }

    #[test]
    fn announced_epochs_replace_the_inferred_ones() {
        let keys = Workload::new(200).keys;
        // Inferred: the second pass's repeats end the first epoch.
        let mut inferred = PlanPolicy::new(Arc::new(NoPlan));
        two_passes(&mut inferred, &keys);
        assert!(inferred.rest().boundaries() >= 1);

        // Announced: the same accesses end nothing, and no sample is kept ...
        let announcer = Arc::new(Announcer(AtomicU64::new(0)));
        let mut told = PlanPolicy::new(announcer.clone());
        two_passes(&mut told, &keys);
        assert_eq!(told.rest().boundaries(), 0);
        let slots_only = told.rest().memory_bytes();
        assert!(slots_only < inferred.rest().memory_bytes());
        // ... until the detector announces a boundary, passed on at the next access.
        announcer.0.store(1, Ordering::Relaxed);
        told.touch(0, &keys);
        assert_eq!(told.rest().boundaries(), 1);
        // The entry touched after the boundary is of the new epoch; the rest, read in the
        // old one, are expected back (Pending), and the new epoch's reads go first.
        assert_eq!(told.rest().class(0), Some(EpochClass::Done));
        assert_eq!(told.rest().class(1), Some(EpochClass::Pending));
        assert_eq!(told.victim(&keys, &mut |_| true), Some(0));
    }
}
