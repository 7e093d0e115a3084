//! Which cached object to evict: the [`EvictionPolicy`] trait and its LRU implementation.
//!
//! The cache evicts whole objects (an entry's data file and index together). A policy only
//! *orders* entries; the cache decides *when* to evict (a reservation that does not fit the
//! budget or the free-space guard) and *whether* a candidate may go: entries pinned by an open
//! reader, being written, already being evicted, or in use by another process (see `disk`) are
//! skipped by the `evictable` predicate given to [`EvictionPolicy::victim`], and stay where the
//! policy keeps them.
//!
//! [`LruPolicy`] keeps a doubly linked list in a slab (`u32` links, no allocation per touch):
//! an access moves the entry to the hot end; the victim is the first evictable entry from the
//! cold end. Entries found on disk at start-up are inserted at the cold end, newest first, so
//! they keep the order of their last use in earlier runs (the index file's mtime) and are
//! colder than anything used in this run.
//!
//! Dataset-aware policies implement the same trait: [`super::evict_epoch::EpochPolicy`]
//! ("evict what was just read in this epoch", with inferred epoch boundaries) and
//! [`super::evict_plan::PlanPolicy`] (Belady from the epoch plan, through a
//! [`super::evict_plan::PlanOracle`]); [`super::policy::make_policy`] picks one by name, and
//! [`super::simulate`] measures them.

use std::collections::HashMap;
use std::time::SystemTime;

use super::identity::{EntryKey, ObjectIdentity};

/// What a policy learns about an entry when the cache first knows it.
#[derive(Debug, Clone, Copy)]
pub struct EntryInfo<'a> {
    pub key: EntryKey,
    /// The object, when known (always for entries created or loaded in this run and for
    /// entries found by the start-up scan).
    pub identity: Option<&'a ObjectIdentity>,
    /// Bytes the entry holds now.
    pub bytes: u64,
    /// `None` for an entry used now; the time of its last use in an earlier run otherwise.
    pub last_used: Option<SystemTime>,
}

/// Orders cache entries for eviction (see the module documentation).
pub trait EvictionPolicy: Send {
    fn name(&self) -> &'static str;
    /// A new entry (created, or found on disk).
    fn insert(&mut self, info: &EntryInfo<'_>);
    /// The entry was read or written.
    fn touch(&mut self, key: EntryKey);
    /// A block of the entry was written into the cache: the end of a fetch started by a read
    /// (or a read-ahead) that was already reported (`insert` or `touch`), possibly much later
    /// when the disk lags behind the store. Policies that count accesses must not count it as
    /// another; by default it is a touch.
    fn filled(&mut self, key: EntryKey) {
        self.touch(key);
    }
    /// The entry was removed (evicted here or elsewhere, or cleared).
    fn remove(&mut self, key: EntryKey);
    /// The entry now holds `bytes` (size-aware policies care; LRU does not).
    fn resize(&mut self, _key: EntryKey, _bytes: u64) {}
    /// The next entry to evict in the policy's order, among those `evictable` accepts.
    fn victim(&mut self, evictable: &mut dyn FnMut(EntryKey) -> bool) -> Option<EntryKey>;
    /// Heap bytes the policy spends (for the index-memory measurement).
    fn memory_bytes(&self) -> usize;
}

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Node {
    key: EntryKey,
    prev: u32,
    next: u32,
}

/// Least recently used first (see the module documentation).
#[derive(Debug, Default)]
pub struct LruPolicy {
    nodes: Vec<Node>,
    free: Vec<u32>,
    index: HashMap<EntryKey, u32>,
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
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Keys from the least to the most recently used (for tests and diagnostics).
    pub fn order(&self) -> Vec<EntryKey> {
        let mut out = Vec::with_capacity(self.len());
        let mut at = self.tail;
        while let Some(i) = at {
            let n = self.nodes[i as usize];
            out.push(n.key);
            at = (n.prev != NIL).then_some(n.prev);
        }
        out
    }

    fn unlink(&mut self, i: u32) {
        let Node { prev, next, .. } = self.nodes[i as usize];
        if prev != NIL {
            self.nodes[prev as usize].next = next;
        } else {
            self.head = (next != NIL).then_some(next);
        }
        if next != NIL {
            self.nodes[next as usize].prev = prev;
        } else {
            self.tail = (prev != NIL).then_some(prev);
        }
    }

    fn push_front(&mut self, i: u32) {
        let old = self.head.unwrap_or(NIL);
        self.nodes[i as usize].prev = NIL;
        self.nodes[i as usize].next = old;
        if old != NIL {
            self.nodes[old as usize].prev = i;
        } else {
            self.tail = Some(i);
        }
        self.head = Some(i);
    }

    fn push_back(&mut self, i: u32) {
        let old = self.tail.unwrap_or(NIL);
        self.nodes[i as usize].next = NIL;
        self.nodes[i as usize].prev = old;
        if old != NIL {
            self.nodes[old as usize].next = i;
        } else {
            self.head = Some(i);
        }
        self.tail = Some(i);
    }
}

impl EvictionPolicy for LruPolicy {
    fn name(&self) -> &'static str {
        "lru"
    }

    fn insert(&mut self, info: &EntryInfo<'_>) {
        if self.index.contains_key(&info.key) {
            self.touch(info.key);
            return;
        }
        let node = Node {
            key: info.key,
            prev: NIL,
            next: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        self.index.insert(info.key, i);
        if info.last_used.is_some() {
            self.push_back(i);
        } else {
            self.push_front(i);
        }
    }

    fn touch(&mut self, key: EntryKey) {
        if let Some(&i) = self.index.get(&key) {
            if self.head != Some(i) {
                self.unlink(i);
                self.push_front(i);
            }
        }
    }

    fn remove(&mut self, key: EntryKey) {
        if let Some(i) = self.index.remove(&key) {
            self.unlink(i);
            self.free.push(i);
        }
    }

    fn victim(&mut self, evictable: &mut dyn FnMut(EntryKey) -> bool) -> Option<EntryKey> {
        let mut at = self.tail;
        while let Some(i) = at {
            let n = self.nodes[i as usize];
            if evictable(n.key) {
                return Some(n.key);
            }
            at = (n.prev != NIL).then_some(n.prev);
        }
        None
    }

    fn memory_bytes(&self) -> usize {
        self.nodes.capacity() * std::mem::size_of::<Node>()
            + self.free.capacity() * 4
            + hashmap_bytes(
                self.index.capacity(),
                std::mem::size_of::<(EntryKey, u32)>(),
            )
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

    fn k(n: u8) -> EntryKey {
        EntryKey([n; 16])
    }

    fn ins(p: &mut LruPolicy, n: u8, past: bool) {
        p.insert(&EntryInfo {
            key: k(n),
            identity: None,
            bytes: 1,
            last_used: past.then(SystemTime::now),
        });
    }

    #[test]
    fn lru_orders_by_use_and_skips_what_may_not_go() {
        let mut p = LruPolicy::new();
        for n in 1..=4 {
            ins(&mut p, n, false);
        }
        assert_eq!(p.order(), vec![k(1), k(2), k(3), k(4)]);
        p.touch(k(1));
        assert_eq!(p.order(), vec![k(2), k(3), k(4), k(1)]);
        assert_eq!(p.victim(&mut |_| true), Some(k(2)));
        assert_eq!(p.victim(&mut |key| key != k(2)), Some(k(3)));
        p.remove(k(3));
        assert_eq!(p.order(), vec![k(2), k(4), k(1)]);
        // Entries from an earlier run go to the cold end, in insertion order newest first.
        ins(&mut p, 9, true);
        ins(&mut p, 8, true);
        assert_eq!(p.order(), vec![k(8), k(9), k(2), k(4), k(1)]);
        ins(&mut p, 5, false); // reuses the freed node
        assert_eq!(p.len(), 6);
        assert_eq!(p.victim(&mut |_| false), None);
        for n in [8, 9, 2, 4, 1, 5] {
            p.remove(k(n));
        }
        assert!(p.is_empty());
        assert_eq!(p.order(), Vec::<EntryKey>::new());
        assert!(p.memory_bytes() > 0);
    }
}
