//! Epoch-aware eviction for datasets read in passes ("epochs"), with no plan: [`EpochPolicy`].
//!
//! # Why not LRU
//! A training job reads its whole dataset once per epoch, in a fresh random order each time.
//! When the cache holds half the dataset, LRU keeps the objects read *last*, and the next
//! epoch evicts the oldest of those first — exactly the ones it has not re-read yet. An
//! object read in the current epoch, on the other hand, will not be read again before the next
//! one: it is the cheapest thing to evict. Evicting "what was just read in this epoch" keeps a
//! stable set cached from one epoch to the next and turns about `capacity / dataset` of every
//! epoch into hits, the most any policy can get on a fresh shuffle, clairvoyant or not (on W5
//! within one or two accesses per epoch of Belady's optimum; see `cache::simulate`).
//!
//! # Classes
//! Every entry belongs to the epoch of its last access (`ep`) and is in one of five classes,
//! evicted in this order:
//! 1. **Stale**: not accessed in the current or the previous epoch (`ep ≤ E-2`), and entries
//!    found on disk at start-up. Least recently used first. This is what keeps objects that are
//!    never read again (an older dataset, a file read once) from squatting the cache: two epoch
//!    boundaries after their last use they go before anything else.
//! 2. **Done**: accessed in the current epoch. Most recently accessed first: any of them is
//!    free to evict for this epoch; taking the newest keeps the older ones (the stable set) and,
//!    for a dataset read in the same order every epoch, evicts the one needed last.
//! 3. **Pending**: accessed in the previous epoch, not yet in this one: expected back before
//!    the epoch ends. Most recently accessed first (the same argument in the same order).
//! 4. **Hot**: accessed at least [`HOT_ACCESSES`] times within one epoch (a label file, an
//!    index, a shard shared by every worker), and again in every epoch since. Least recently
//!    used first, hot-from-the-previous-epoch before hot-in-this-one. At most half the entries
//!    are hot, so a workload that is not epochal at all degrades to LRU over that half rather
//!    than to most-recently-used. An entry that goes an epoch without access stops being hot.
//!
//! Pinned and otherwise unevictable entries are skipped by the cache's predicate and stay put.
//!
//! # Accesses, not touches
//! The cache calls `touch` on every block read and written and on every open. Touches of one
//! entry less than [`CONTINUE_WINDOW`] accesses after the access began continue that access:
//! they move the entry to the front of its class (it was just read, so it is the next to go —
//! this is also what makes a file fetched ahead of the reader and then read evictable right
//! after the read rather than before it) but count nothing. The window does not slide, so a
//! file re-read every few accesses still counts its reads and can become hot.
//!
//! # Who says where an epoch ends
//! A mount has one epoch detector: the prefetcher's (`prefetch::epoch`), which sees opens
//! of files in the directory tree being read. Through the plan oracle
//! (`PlanOracle::epochs`) the [`PlanPolicy`](super::PlanPolicy) wrapping this policy is
//! told of each boundary it finds and announces it here ([`EpochPolicy::follow_announced`],
//! [`EpochPolicy::new_epoch`]); then nothing below is run and no sample is kept. A policy
//! with no detector behind it (epoch prefetch off, `--eviction-policy epoch`, the
//! simulator) infers boundaries itself, as follows.
//!
//! # Inferring epoch boundaries
//! Without a detector, epochs are not announced. The signal is *repeats*: an object accessed a second time in the
//! current epoch. In a pass over a dataset nothing repeats until the next pass starts, and then
//! everything does. The policy watches a hash sample of the keys it sees (all of them for up to
//! [`SAMPLE_MAX`] objects, then a `2^-k` sample chosen by the key's own hash bits, which are
//! uniform: keys are SHA-256 prefixes). The sample covers objects whether or not they are
//! cached: a miss on an object evicted earlier in the epoch is a repeat as much as a hit is,
//! which matters when the cache is a small fraction of the dataset.
//!
//! A second access counts as a repeat only if it comes at least `max(CONTINUE_WINDOW,
//! entries)` accesses after the previous one: the next pass cannot come back sooner than the
//! cache holds entries (if it did, the dataset would fit and eviction would not matter), while
//! a file written by read-ahead and read a little later, or a file re-read while it is still
//! in use, would otherwise look like one (read-ahead must stay under half the cache, since its
//! writes and the reads both count as accesses). Sampled keys accessed [`HOT_ACCESSES`] times or
//! more in the epoch do not count either, so a few hot files cannot end epochs. The epoch ends
//! when the sampled repeats reach `max(MIN_REPEATS, distinct sampled keys / REPEAT_DIVISOR)`,
//! about 1/8 to 1/16 of a pass into the next one, whatever the cache size.
//!
//! The boundary is then placed retroactively, at the first repeat (ignoring stray early ones:
//! those further before the median repeat than twice the span from the median to now).
//! Entries accessed since the boundary move to the new epoch's Done class (a walk over the
//! front of one list, since classes are kept in access order), the rest of the old Done class
//! becomes Pending, and the old Pending becomes Stale. On W5 the estimate is within a few
//! accesses of the true boundary.
//!
//! A reader that moves on to other data (another dataset) repeats nothing, so there is a
//! second signal: an epoch that has seen [`FORCE_FACTOR`] times as many distinct objects as
//! the previous one (or as the cache holds, if more) ends, retroactively at the point where it
//! had seen as many as the previous one. The old data becomes Pending, and Stale at the next
//! boundary. Only an epoch that began at a detected repeat boundary can end this way, so one
//! spurious short epoch cannot start a cascade of forced boundaries through a long first pass.
//!
//! A workload that never repeats never advances the epoch and is served
//! most-recently-used-first within one class: for a single pass over a dataset larger than the
//! cache, that is as good as anything. A workload with no epochs at all (random access with
//! locality) advances epochs often; most entries are then stale and ordered least recently
//! used first, so it degrades to LRU (measured: Zipf and uniform random within 0.01 of LRU).
//!
//! [`EpochPolicy::new_epoch`] announces a boundary explicitly (the plan policy does when the
//! prefetcher's detector finds one, and twice when the plan is replaced).
//!
//! The sampled keys' access clocks are kept relative to the epoch's start in 32 bits, so an
//! epoch ends after at most 2^32 accesses (about 12 hours of 100,000 file accesses a second
//! without a single repeat).
//!
//! # Cost
//! Every operation is O(1) (linked-list moves over the cache's slots, `u32` links) except
//! the boundary: O(sample) ≤ O([`SAMPLE_MAX`]) once per epoch, plus the entries moved. A
//! victim scan skips unevictable entries, so it costs O(1 + pinned). Memory: a 24-byte node
//! per slot ([`EpochPolicy::SLOT_BYTES`]; the key and the index are the cache's), plus at most
//! [`SAMPLE_MAX`] sampled keys (24 bytes each and the map's slack: at most 200 KiB, 100 KiB
//! for a sample of at most 3,584 keys).
//!
//! # Eviction that fails
//! When the cache cannot remove the entry it was handed (another process uses it), it
//! `touch`es it. For LRU that moves it to the safest end; here it would make it the newest
//! Done entry, i.e. the next victim again. So a touch of an entry this policy handed out as a
//! victim, before it was removed, is taken as "keep it for now" instead: the entry goes to the
//! back of the Pending class (or stays hot).

use std::collections::HashMap;

use super::{hashmap_bytes, EntryInfo, EvictionPolicy, Slot, SlotKeys};
use crate::cache::identity::EntryKey;
use crate::cache::slab::Chunked;
use boundary::Sampled;

mod boundary;

/// Touches of an entry less than this many accesses after its access began continue it.
pub const CONTINUE_WINDOW: u64 = 64;
/// Accesses within one epoch that make an entry hot.
pub const HOT_ACCESSES: u8 = 3;
/// Keys tracked for boundary detection at most (then the sample rate halves).
pub const SAMPLE_MAX: usize = 4096;
/// An epoch ends when sampled repeats reach this share (1/n) of the sampled keys ...
pub const REPEAT_DIVISOR: usize = 16;
/// ... and at least this many.
pub const MIN_REPEATS: usize = 8;
/// An epoch also ends when it has seen this many times as many distinct objects as the
/// previous one without repeats (the reader moved on to other data) ...
pub const FORCE_FACTOR: f64 = 1.5;
/// ... if the previous one had at least this many.
pub const MIN_FORCE_KEYS: usize = 64;

const NIL: u32 = u32::MAX;
/// The epoch of entries found at start-up (always stale); live epochs start at 2.
const BEFORE: u32 = 0;
const FIRST_EPOCH: u32 = 2;
/// Keys handed out as victims and not yet removed, remembered at most.
const OFFERED_MAX: usize = 64;

/// The class of an entry, in eviction order (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EpochClass {
    Stale,
    Done,
    Pending,
    HotPending,
    HotDone,
}

impl EpochClass {
    const ALL: [EpochClass; 5] = [
        EpochClass::Stale,
        EpochClass::Done,
        EpochClass::Pending,
        EpochClass::HotPending,
        EpochClass::HotDone,
    ];

    fn idx(self) -> usize {
        self as usize
    }

    /// Victims are taken from the least recently used end (else from the most recent one).
    fn lru_first(self) -> bool {
        matches!(
            self,
            EpochClass::Stale | EpochClass::HotPending | EpochClass::HotDone
        )
    }
}

#[derive(Debug, Clone, Copy)]
struct Node {
    /// Towards the most recently accessed end.
    prev: u32,
    /// Towards the least recently accessed end.
    next: u32,
    /// The access clock at the last touch (lists are in this order).
    last: u64,
    /// The epoch of the last access.
    ep: u32,
    /// Accesses in `ep`.
    count: u8,
    /// `last` minus the access clock when the current access began, at most 255 (only
    /// whether it is below [`CONTINUE_WINDOW`] matters).
    since_start: u8,
    hot: bool,
    /// The slot holds an entry of this policy.
    live: bool,
}

impl Default for Node {
    fn default() -> Self {
        Node {
            prev: NIL,
            next: NIL,
            last: 0,
            ep: BEFORE,
            count: 0,
            since_start: 0,
            hot: false,
            live: false,
        }
    }
}

impl Node {
    /// The access clock when the current access began.
    fn start(&self) -> u64 {
        self.last.saturating_sub(self.since_start as u64)
    }

    /// A touch at `clock` that continues the current access.
    fn touched_at(&mut self, clock: u64) {
        let since = clock.saturating_sub(self.last) + self.since_start as u64;
        self.since_start = since.min(u8::MAX as u64) as u8;
        self.last = clock;
    }
}

/// A doubly linked list in the slab; `head` is the most recently accessed.
#[derive(Debug, Clone, Copy)]
struct Ends {
    head: u32,
    tail: u32,
    len: usize,
}

impl Default for Ends {
    fn default() -> Self {
        Ends {
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }
}

/// "Evict what was just read in this epoch" (see the module documentation).
#[derive(Debug)]
pub struct EpochPolicy {
    nodes: Chunked<Node>,
    /// Entries (live nodes).
    len: usize,
    lists: [Ends; 5],
    epoch: u32,
    /// Counts accesses (not continuation touches).
    clock: u64,
    /// The clock at the current epoch's (estimated) start.
    epoch_start: u64,
    /// Sampled keys (by their first 8 bytes) accessed in this epoch.
    sample: HashMap<u64, Sampled>,
    /// A key is sampled when its first 8 bytes have at least this many leading zeros.
    shift: u32,
    /// Sampled keys accessed exactly twice in this epoch.
    repeats: usize,
    /// Distinct objects (estimated from the sample) of the previous epoch; 0 if unknown.
    prev_len: f64,
    /// The last boundary was detected from repeats, so this epoch may end by
    /// [`FORCE_FACTOR`] (forced boundaries never follow each other).
    forcible: bool,
    offered: Vec<Slot>,
    boundaries: u64,
    /// Boundaries are announced ([`Self::follow_announced`]): the sample is not kept.
    announced: bool,
}

impl Default for EpochPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl EpochPolicy {
    pub fn new() -> Self {
        EpochPolicy {
            nodes: Chunked::new(),
            len: 0,
            lists: [Ends::default(); 5],
            epoch: FIRST_EPOCH,
            clock: 0,
            epoch_start: 0,
            sample: HashMap::new(),
            shift: 0,
            repeats: 0,
            prev_len: 0.0,
            forcible: false,
            offered: Vec::new(),
            boundaries: 0,
            announced: false,
        }
    }

    /// Heap bytes per slot (the sample comes on top, at most [`SAMPLE_MAX`] keys).
    pub const SLOT_BYTES: usize = std::mem::size_of::<Node>();

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn live(&self, at: Slot) -> bool {
        self.nodes.get(at).is_some_and(|n| n.live)
    }

    /// Epoch boundaries seen so far (detected or announced).
    #[cfg(test)]
    pub fn boundaries(&self) -> u64 {
        self.boundaries
    }

    /// The class of an entry, if known.
    #[cfg(test)]
    pub fn class(&self, at: Slot) -> Option<EpochClass> {
        self.live(at).then(|| self.class_of(at))
    }

    /// Slots in the order they would be evicted (for tests and diagnostics).
    #[cfg(test)]
    pub fn order(&self) -> Vec<Slot> {
        let mut out = Vec::with_capacity(self.len());
        for c in EpochClass::ALL {
            self.walk(c, |i| {
                out.push(i);
                false
            });
        }
        out
    }

    /// Whether epoch boundaries are announced by the mount's epoch detector (the
    /// prefetcher's, through the plan oracle) rather than inferred here. While they are, no
    /// sample is kept and [`Self::new_epoch`] is the only boundary (one detector per mount:
    /// the two cannot disagree); when the detector stops announcing, inference resumes from
    /// an empty sample.
    pub fn follow_announced(&mut self, announced: bool) {
        if announced == self.announced {
            return;
        }
        self.announced = announced;
        self.sample = HashMap::new();
        self.repeats = 0;
        self.forcible = false;
    }

    /// Announces an epoch boundary now (everything accessed so far belongs to the old epoch).
    pub fn new_epoch(&mut self) {
        self.advance(self.clock.saturating_add(1));
        self.forcible = false;
    }

    /// Keeps entry `at` for now without counting an access: the cache could not evict it (see
    /// "Eviction that fails"; `touch` does this by itself for victims this policy handed out).
    pub fn hold(&mut self, at: Slot) {
        self.offered.retain(|&k| k != at);
        if self.live(at) {
            self.requeue(at);
        }
    }

    /// Makes every entry stale (two boundaries now): nothing known so far is expected back.
    pub fn all_stale(&mut self) {
        self.new_epoch();
        self.new_epoch();
    }

    fn class_of(&self, i: u32) -> EpochClass {
        let n = &self.nodes[i];
        if n.ep.saturating_add(2) <= self.epoch {
            EpochClass::Stale
        } else if n.ep.saturating_add(1) == self.epoch {
            if n.hot {
                EpochClass::HotPending
            } else {
                EpochClass::Pending
            }
        } else if n.hot {
            EpochClass::HotDone
        } else {
            EpochClass::Done
        }
    }

    /// Visits a class in eviction order until `f` returns true.
    fn walk(&self, c: EpochClass, mut f: impl FnMut(Slot) -> bool) -> bool {
        let ends = self.lists[c.idx()];
        let mut at = if c.lru_first() { ends.tail } else { ends.head };
        while at != NIL {
            let n = &self.nodes[at];
            if f(at) {
                return true;
            }
            at = if c.lru_first() { n.prev } else { n.next };
        }
        false
    }

    fn unlink(&mut self, i: u32, c: EpochClass) {
        let Node { prev, next, .. } = self.nodes[i];
        let ends = &mut self.lists[c.idx()];
        if prev != NIL {
            self.nodes[prev].next = next;
        } else {
            ends.head = next;
        }
        if next != NIL {
            self.nodes[next].prev = prev;
        } else {
            ends.tail = prev;
        }
        ends.len -= 1;
    }

    fn push_head(&mut self, i: u32, c: EpochClass) {
        let ends = &mut self.lists[c.idx()];
        let old = ends.head;
        self.nodes[i].prev = NIL;
        self.nodes[i].next = old;
        if old != NIL {
            self.nodes[old].prev = i;
        } else {
            ends.tail = i;
        }
        ends.head = i;
        ends.len += 1;
    }

    fn push_tail(&mut self, i: u32, c: EpochClass) {
        let ends = &mut self.lists[c.idx()];
        let old = ends.tail;
        self.nodes[i].next = NIL;
        self.nodes[i].prev = old;
        if old != NIL {
            self.nodes[old].next = i;
        } else {
            ends.head = i;
        }
        ends.tail = i;
        ends.len += 1;
    }

    /// Puts all of `src` in front of `dst`'s head, leaving `src` empty.
    fn splice_front(&mut self, dst: EpochClass, src: EpochClass) {
        let s = std::mem::take(&mut self.lists[src.idx()]);
        if s.len == 0 {
            return;
        }
        let d = &mut self.lists[dst.idx()];
        if d.len == 0 {
            *d = s;
            return;
        }
        self.nodes[s.tail].next = d.head;
        self.nodes[d.head].prev = s.tail;
        d.head = s.head;
        d.len += s.len;
    }

    fn hot_len(&self) -> usize {
        self.lists[EpochClass::HotDone.idx()].len + self.lists[EpochClass::HotPending.idx()].len
    }

    /// A touch of entry `i`, of key `key` (or its insertion).
    fn access(&mut self, i: u32, key: EntryKey) {
        let from = self.class_of(i);
        let epoch = self.epoch;
        let n = self.nodes[i];
        if n.ep == epoch && self.clock.saturating_sub(n.start()) < CONTINUE_WINDOW {
            // The same access, continued: the entry moves to the front of its class (it was
            // just read: for a file fetched ahead of the reader, this is the read), but
            // nothing is counted. The window does not slide, so a file re-read every few
            // accesses still counts its reads.
            let clock = self.clock;
            self.nodes[i].touched_at(clock);
            self.unlink(i, from);
            self.push_head(i, from);
            return;
        }
        self.clock += 1;
        let may_be_hot = self.hot_len() < self.len / 2;
        let clock = self.clock;
        let node = &mut self.nodes[i];
        if node.ep == epoch {
            node.count = node.count.saturating_add(1);
            if node.count >= HOT_ACCESSES && !node.hot && may_be_hot {
                node.hot = true;
            }
        } else {
            // Hotness survives an epoch boundary only for entries used in the previous epoch.
            node.hot &= node.ep.saturating_add(1) == epoch;
            node.ep = epoch;
            node.count = 1;
        }
        node.since_start = 0;
        node.last = clock;
        self.unlink(i, from);
        let to = self.class_of(i);
        self.push_head(i, to);
        self.observe(key);
    }

    /// Starts a new epoch whose first access was at clock `boundary`.
    fn advance(&mut self, boundary: u64) {
        use EpochClass::*;
        // Entries accessed since the boundary belong to the new epoch: take them off the
        // fronts of their lists (which are in access order, newest first).
        let mut moved = Vec::new();
        for c in [Done, HotDone] {
            loop {
                let i = self.lists[c.idx()].head;
                if i == NIL || self.nodes[i].last < boundary {
                    break;
                }
                self.unlink(i, c);
                moved.push(i);
            }
        }
        // Pending → Stale (hot ones at the fresher end); Done → Pending.
        self.splice_front(Stale, Pending);
        self.splice_front(Stale, HotPending);
        self.lists[Pending.idx()] = std::mem::take(&mut self.lists[Done.idx()]);
        self.lists[HotPending.idx()] = std::mem::take(&mut self.lists[HotDone.idx()]);
        self.epoch = self.epoch.saturating_add(1);
        let old_start = std::mem::replace(&mut self.epoch_start, boundary);
        let abs = |r: u32| old_start + r as u64;
        self.boundaries += 1;
        // Appending at the tail, newest first, keeps the access order.
        for i in moved {
            let epoch = self.epoch;
            let n = &mut self.nodes[i];
            n.ep = epoch;
            n.count = 1;
            let c = self.class_of(i);
            self.push_tail(i, c);
        }
        let ended = self
            .sample
            .values()
            .filter(|s| abs(s.first) < boundary)
            .count();
        self.prev_len = ended as f64 * self.scale();
        self.sample.retain(|_, s| abs(s.last) >= boundary);
        self.sample.shrink_to_fit();
        // Clocks relative to the new start (every one kept is at or after it).
        let rel = |t: u64| t.saturating_sub(boundary).min(u32::MAX as u64) as u32;
        for s in self.sample.values_mut() {
            // The first access since the boundary: exact for keys seen once, approximate
            // otherwise.
            let first = if abs(s.first) >= boundary {
                abs(s.first)
            } else if abs(s.repeat_at) >= boundary {
                abs(s.repeat_at)
            } else {
                abs(s.last)
            };
            s.first = rel(first);
            s.last = rel(abs(s.last));
            s.count = 1;
            s.repeat_at = 0;
        }
        self.repeats = 0;
        if self.shift > 0 && self.sample.len() < SAMPLE_MAX / 4 {
            self.shift -= 1;
        }
    }

    /// The cache could not evict `i` (see "Eviction that fails").
    fn requeue(&mut self, i: u32) {
        let from = self.class_of(i);
        self.unlink(i, from);
        let epoch = self.epoch;
        let clock = self.clock;
        let n = &mut self.nodes[i];
        if n.hot {
            n.ep = epoch;
            n.touched_at(clock);
            self.push_head(i, EpochClass::HotDone);
        } else {
            n.ep = epoch.saturating_sub(1);
            self.push_tail(i, EpochClass::Pending);
        }
    }
}

impl EvictionPolicy for EpochPolicy {
    fn name(&self) -> &'static str {
        "epoch"
    }

    fn insert(&mut self, at: Slot, info: &EntryInfo, keys: &dyn SlotKeys) {
        if self.live(at) {
            self.touch(at, keys);
            return;
        }
        *self.nodes.grow_to(at) = Node {
            live: true,
            ..Node::default()
        };
        self.len += 1;
        // Found on disk: stale, at the cold end (the scan hands entries over newest first).
        self.push_tail(at, EpochClass::Stale);
        if info.last_used.is_none() {
            self.access(at, info.key);
        }
    }

    fn touch(&mut self, at: Slot, keys: &dyn SlotKeys) {
        if !self.live(at) {
            return;
        }
        if let Some(pos) = self.offered.iter().position(|&k| k == at) {
            self.offered.swap_remove(pos);
            self.requeue(at);
        } else {
            self.access(at, keys.key_of(at));
        }
    }

    /// The write completes an access already counted (the open, or the read that missed),
    /// however many accesses later it lands: the entry moves to the front of its class like a
    /// continued access, and neither the access count nor the boundary detector sees it. Were
    /// it counted, a disk lagging more than `entries` accesses behind the reads would turn
    /// every late write into a "repeat" and end an epoch in the middle of one (measured: hit
    /// ratio 0.26 instead of 0.5 on the shuffled half-cache workload when writes lag). An
    /// entry not accessed in this epoch yet (filled by read-ahead before any open) counts as
    /// accessed now.
    fn filled(&mut self, at: Slot, keys: &dyn SlotKeys) {
        if !self.live(at) || self.offered.contains(&at) {
            return;
        }
        if self.nodes[at].ep != self.epoch {
            self.access(at, keys.key_of(at));
            return;
        }
        let c = self.class_of(at);
        let clock = self.clock;
        self.nodes[at].touched_at(clock);
        self.unlink(at, c);
        self.push_head(at, c);
    }

    fn remove(&mut self, at: Slot) {
        self.offered.retain(|&k| k != at);
        if self.live(at) {
            let c = self.class_of(at);
            self.unlink(at, c);
            self.nodes[at] = Node::default();
            self.len -= 1;
        }
    }

    fn victim(
        &mut self,
        _keys: &dyn SlotKeys,
        evictable: &mut dyn FnMut(Slot) -> bool,
    ) -> Option<Slot> {
        let mut found = None;
        for c in EpochClass::ALL {
            if self.walk(c, |i| {
                let ok = evictable(i);
                if ok {
                    found = Some(i);
                }
                ok
            }) {
                break;
            }
        }
        let at = found?;
        if !self.offered.contains(&at) {
            if self.offered.len() >= OFFERED_MAX {
                self.offered.remove(0);
            }
            self.offered.push(at);
        }
        Some(at)
    }

    fn memory_bytes(&self) -> usize {
        self.nodes.heap_bytes()
            + hashmap_bytes(
                self.sample.capacity(),
                std::mem::size_of::<(u64, Sampled)>(),
            )
            + self.offered.capacity() * std::mem::size_of::<Slot>()
    }
}

#[cfg(test)]
mod tests;
