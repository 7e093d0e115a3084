//! Which cached object to evict: the [`EvictionPolicy`] trait and its LRU implementation.
//!
//! The cache evicts whole objects (an entry's data file and index together). A policy only
//! *orders* entries; the cache decides *when* to evict (a reservation that does not fit the
//! budget or the free-space guard) and *whether* a candidate may go: entries pinned by an open
//! reader, being written, already being evicted, or in use by another process (see `disk`) are
//! skipped by the `evictable` predicate given to [`EvictionPolicy::victim`], and stay where the
//! policy keeps them.
//!
//! Entries are named by the cache's [`Slot`] numbers, and policies keep their per-entry state
//! in arrays indexed by them ([`super::slab::Chunked`]): no key and no hash map per policy.
//!
//! [`LruPolicy`] keeps a doubly linked list over the slots (`u32` links, 8 bytes per slot, no
//! allocation per touch): an access moves the entry to the hot end; the victim is the first
//! evictable entry from the cold end. Entries found on disk at start-up are inserted at the cold end, newest first, so
//! they keep the order of their last use in earlier runs (the index file's mtime) and are
//! colder than anything used in this run.
//!
//! Dataset-aware policies implement the same trait: [`super::evict_epoch::EpochPolicy`]
//! ("evict what was just read in this epoch", with inferred epoch boundaries) and
//! [`super::evict_plan::PlanPolicy`] (Belady from the epoch plan, through a
//! [`super::evict_plan::PlanOracle`]); [`super::policy::make_policy`] picks one by name, and
//! [`super::simulate`] measures them.

use std::time::SystemTime;

use super::identity::EntryKey;
use super::slab::Chunked;

/// Where the cache keeps an entry: a small number it assigns when it first knows the entry,
/// stable until the entry is removed, and reused after that. Policies keep their per-entry
/// state in arrays indexed by it (see [`super::slab`]), so they need no map of their own.
pub type Slot = u32;

/// The key of each slot in use, for policies that need keys (the plan policy asks its oracle
/// by key; the epoch policy samples keys).
pub trait SlotKeys {
    fn key_of(&self, at: Slot) -> EntryKey;
}

/// Slot `i` holds `self[i]` (the simulator's numbering).
impl SlotKeys for Vec<EntryKey> {
    fn key_of(&self, at: Slot) -> EntryKey {
        self.get(at as usize).copied().unwrap_or_default()
    }
}

/// What a policy learns about an entry when the cache first knows it.
#[derive(Debug, Clone, Copy)]
pub struct EntryInfo {
    pub key: EntryKey,
    /// Bytes the entry holds now.
    pub bytes: u64,
    /// `None` for an entry used now; the time of its last use in an earlier run otherwise.
    pub last_used: Option<SystemTime>,
}

/// Orders cache entries for eviction (see the module documentation). Entries are named by
/// their [`Slot`]; `keys` gives the key in a slot.
pub trait EvictionPolicy: Send {
    fn name(&self) -> &'static str;
    /// A new entry in slot `at` (created, or found on disk). A slot already in the policy is
    /// touched instead.
    fn insert(&mut self, at: Slot, info: &EntryInfo, keys: &dyn SlotKeys);
    /// The entry was read or written.
    fn touch(&mut self, at: Slot, keys: &dyn SlotKeys);
    /// A block of the entry was written into the cache: the end of a fetch started by a read
    /// (or a read-ahead) that was already reported (`insert` or `touch`), possibly much later
    /// when the disk lags behind the store. Policies that count accesses must not count it as
    /// another; by default it is a touch.
    fn filled(&mut self, at: Slot, keys: &dyn SlotKeys) {
        self.touch(at, keys);
    }
    /// The entry was removed (evicted here or elsewhere, or cleared); its slot may be reused.
    fn remove(&mut self, at: Slot);
    /// The entry now holds `bytes` (size-aware policies care; LRU does not).
    fn resize(&mut self, _at: Slot, _bytes: u64) {}
    /// The next entry to evict in the policy's order, among those `evictable` accepts.
    fn victim(
        &mut self,
        keys: &dyn SlotKeys,
        evictable: &mut dyn FnMut(Slot) -> bool,
    ) -> Option<Slot>;
    /// Heap bytes the policy spends (for the index-memory measurement).
    fn memory_bytes(&self) -> usize;
}

const NIL: u32 = u32::MAX;
/// `prev` of a slot not in the list.
const ABSENT: u32 = u32::MAX - 1;

#[derive(Debug, Clone, Copy)]
struct Node {
    prev: u32,
    next: u32,
}

impl Default for Node {
    fn default() -> Self {
        Node {
            prev: ABSENT,
            next: NIL,
        }
    }
}

/// Least recently used first (see the module documentation).
#[derive(Debug, Default)]
pub struct LruPolicy {
    nodes: Chunked<Node>,
    len: usize,
    /// Most recently used.
    head: Option<u32>,
    /// Least recently used.
    tail: Option<u32>,
}

impl LruPolicy {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Heap bytes per entry slot.
    pub const SLOT_BYTES: usize = std::mem::size_of::<Node>();

    /// Whether slot `at` is in the list.
    pub fn contains(&self, at: Slot) -> bool {
        self.nodes.get(at).is_some_and(|n| n.prev != ABSENT)
    }

    /// Slots from the least to the most recently used (for tests and diagnostics).
    pub fn order(&self) -> Vec<Slot> {
        let mut out = Vec::with_capacity(self.len());
        let mut at = self.tail;
        while let Some(i) = at {
            out.push(i);
            let n = self.nodes[i];
            at = (n.prev != NIL).then_some(n.prev);
        }
        out
    }

    fn unlink(&mut self, i: u32) {
        let Node { prev, next } = self.nodes[i];
        if prev != NIL {
            self.nodes[prev].next = next;
        } else {
            self.head = (next != NIL).then_some(next);
        }
        if next != NIL {
            self.nodes[next].prev = prev;
        } else {
            self.tail = (prev != NIL).then_some(prev);
        }
    }

    fn push_front(&mut self, i: u32) {
        let old = self.head.unwrap_or(NIL);
        self.nodes[i] = Node {
            prev: NIL,
            next: old,
        };
        if old != NIL {
            self.nodes[old].prev = i;
        } else {
            self.tail = Some(i);
        }
        self.head = Some(i);
    }

    fn push_back(&mut self, i: u32) {
        let old = self.tail.unwrap_or(NIL);
        self.nodes[i] = Node {
            prev: old,
            next: NIL,
        };
        if old != NIL {
            self.nodes[old].next = i;
        } else {
            self.head = Some(i);
        }
        self.tail = Some(i);
    }

    /// Adds slot `at` at the hot end (`past`: at the cold end), or moves it there if present.
    pub fn add(&mut self, at: Slot, past: bool) {
        if self.contains(at) {
            self.unlink(at);
        } else {
            self.nodes.grow_to(at);
            self.len += 1;
        }
        if past {
            self.push_back(at);
        } else {
            self.push_front(at);
        }
    }

    /// Moves slot `at` to the hot end, if present.
    pub fn use_now(&mut self, at: Slot) {
        if self.contains(at) && self.head != Some(at) {
            self.unlink(at);
            self.push_front(at);
        }
    }

    /// Takes slot `at` out, if present.
    pub fn take(&mut self, at: Slot) {
        if self.contains(at) {
            self.unlink(at);
            self.nodes[at] = Node::default();
            self.len -= 1;
        }
    }

    /// The least recently used slot that `evictable` accepts.
    pub fn coldest(&self, evictable: &mut dyn FnMut(Slot) -> bool) -> Option<Slot> {
        let mut at = self.tail;
        while let Some(i) = at {
            if evictable(i) {
                return Some(i);
            }
            let n = self.nodes[i];
            at = (n.prev != NIL).then_some(n.prev);
        }
        None
    }
}

impl EvictionPolicy for LruPolicy {
    fn name(&self) -> &'static str {
        "lru"
    }

    fn insert(&mut self, at: Slot, info: &EntryInfo, _keys: &dyn SlotKeys) {
        if self.contains(at) {
            self.use_now(at);
        } else {
            self.add(at, info.last_used.is_some());
        }
    }

    fn touch(&mut self, at: Slot, _keys: &dyn SlotKeys) {
        self.use_now(at);
    }

    fn remove(&mut self, at: Slot) {
        self.take(at);
    }

    fn victim(
        &mut self,
        _keys: &dyn SlotKeys,
        evictable: &mut dyn FnMut(Slot) -> bool,
    ) -> Option<Slot> {
        self.coldest(evictable)
    }

    fn memory_bytes(&self) -> usize {
        self.nodes.heap_bytes()
    }
}

/// Approximate heap bytes of a `std` `HashMap` (SwissTable: one slot and one control byte per
/// bucket, buckets a power of two at most 8/7 of the capacity).
pub fn hashmap_bytes(capacity: usize, slot: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    let buckets = (capacity * 8 / 7).next_power_of_two().max(4);
    buckets * (slot + 1) + 16
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ins(p: &mut LruPolicy, n: u32, past: bool) {
        p.insert(
            n,
            &EntryInfo {
                key: EntryKey::default(),
                bytes: 1,
                last_used: past.then(SystemTime::now),
            },
            &Vec::new(),
        );
    }

    #[test]
    fn lru_orders_by_use_and_skips_what_may_not_go() {
        let no_keys = &Vec::new();
        let mut p = LruPolicy::new();
        for n in 1..=4 {
            ins(&mut p, n, false);
        }
        assert_eq!(p.order(), vec![1, 2, 3, 4]);
        p.touch(1, no_keys);
        assert_eq!(p.order(), vec![2, 3, 4, 1]);
        assert_eq!(p.victim(no_keys, &mut |_| true), Some(2));
        assert_eq!(p.victim(no_keys, &mut |at| at != 2), Some(3));
        p.remove(3);
        assert_eq!(p.order(), vec![2, 4, 1]);
        // Entries from an earlier run go to the cold end, in insertion order newest first.
        ins(&mut p, 9, true);
        ins(&mut p, 8, true);
        assert_eq!(p.order(), vec![8, 9, 2, 4, 1]);
        ins(&mut p, 3, false); // the removed slot, reused
        assert_eq!(p.len(), 6);
        assert_eq!(p.victim(no_keys, &mut |_| false), None);
        for n in [8, 9, 2, 4, 1, 3] {
            p.remove(n);
        }
        assert!(p.is_empty());
        assert_eq!(p.order(), Vec::<Slot>::new());
        assert!(p.memory_bytes() > 0);
    }
}
