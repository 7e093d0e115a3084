//! [`LruPolicy`]: least recently used first, over a doubly linked list of the cache's slots
//! (see the `evict` module documentation).

use super::{EntryInfo, EvictionPolicy, Slot, SlotKeys};
use crate::cache::slab::Chunked;

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

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    #[cfg(test)]
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
    #[cfg(test)]
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

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use crate::cache::identity::EntryKey;

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
