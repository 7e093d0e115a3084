//! Compact storage for per-entry state: [`Chunked`], an array grown in fixed chunks, and
//! [`KeyIndex`], a hash index from an [`EntryKey`] to the number of the slot holding it.
//!
//! The cache numbers its known entries (slots, reused after a removal) and keeps the key once,
//! in the slot; the eviction policies keep their per-entry state in arrays indexed by the same
//! number, with no key and no map of their own. At 10^6–10^7 entries that is what the index
//! costs (see the `cache` module documentation, "Memory"):
//!
//! - A `Vec` grown by doubling holds up to twice what it needs, and copies everything at each
//!   doubling (momentarily three times the memory). [`Chunked`] allocates [`CHUNK`] slots at a
//!   time: at most one chunk of slack, nothing ever moves.
//! - A `HashMap<EntryKey, u32>` spends 21 bytes a bucket. [`KeyIndex`] stores only the 4-byte
//!   slot number and a control byte (a 7-bit tag of the hash, as SwissTable does) per bucket,
//!   5 bytes, and compares keys through the caller (`key_of`). Linear probing, at most 7/8
//!   full counting removed buckets; the tag makes a probe that is not the key cost one byte
//!   read, not a read of the slot. Keys are hashed with `std`'s randomly seeded SipHash, like
//!   the `HashMap` it replaces, so crafted object names cannot pile keys into one probe run.
//!   Why not `hashbrown::HashTable<u32>`, which has the same 5-byte buckets: under the
//!   cache's churn (entries evicted and new ones added at a steady count) it grows to twice
//!   the buckets once it is more than half full, where this one rebuilds in place (measured:
//!   81,936 against 40,976 bytes for 6,000 keys after 30,000 replacements, the
//!   `key_index_stays_small` test run against both).

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::ops::{Index, IndexMut};

use super::identity::EntryKey;

/// Slots per chunk of a [`Chunked`].
pub const CHUNK: usize = 1024;

/// An array of `T` indexed by `u32`, allocated [`CHUNK`] elements at a time (see the module
/// documentation). Elements not yet written are `T::default()`.
#[derive(Debug)]
pub struct Chunked<T> {
    chunks: Vec<Box<[T]>>,
}

impl<T> Default for Chunked<T> {
    fn default() -> Self {
        Chunked { chunks: Vec::new() }
    }
}

impl<T: Default> Chunked<T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Elements allocated (a multiple of [`CHUNK`]).
    pub fn capacity(&self) -> usize {
        self.chunks.len() * CHUNK
    }

    pub fn get(&self, i: u32) -> Option<&T> {
        let i = i as usize;
        self.chunks.get(i / CHUNK).and_then(|c| c.get(i % CHUNK))
    }

    pub fn get_mut(&mut self, i: u32) -> Option<&mut T> {
        let i = i as usize;
        self.chunks
            .get_mut(i / CHUNK)
            .and_then(|c| c.get_mut(i % CHUNK))
    }

    /// Element `i`, allocating the chunks up to it.
    pub fn grow_to(&mut self, i: u32) -> &mut T {
        let (c, o) = (i as usize / CHUNK, i as usize % CHUNK);
        while self.chunks.len() <= c {
            self.chunks
                .push((0..CHUNK).map(|_| T::default()).collect::<Box<[T]>>());
        }
        &mut self.chunks[c][o]
    }

    /// Heap bytes.
    pub fn heap_bytes(&self) -> usize {
        self.chunks.capacity() * std::mem::size_of::<Box<[T]>>()
            + self.capacity() * std::mem::size_of::<T>()
    }
}

/// Panics on an index never grown to: a slot number the owner did not hand out (a bug).
impl<T> Index<u32> for Chunked<T> {
    type Output = T;
    fn index(&self, i: u32) -> &T {
        &self.chunks[i as usize / CHUNK][i as usize % CHUNK]
    }
}

impl<T> IndexMut<u32> for Chunked<T> {
    fn index_mut(&mut self, i: u32) -> &mut T {
        &mut self.chunks[i as usize / CHUNK][i as usize % CHUNK]
    }
}

const EMPTY: u8 = 0;
const REMOVED: u8 = 1;

/// The control byte of a full bucket: the hash's top 7 bits, and the high bit set.
fn tag(hash: u64) -> u8 {
    0x80 | (hash >> 57) as u8
}

/// A hash index from keys to slot numbers (see the module documentation). The caller keeps
/// the keys; every method that compares or rehashes takes `key_of`, the key stored in a slot.
#[derive(Debug, Default)]
pub struct KeyIndex {
    ctrl: Box<[u8]>,
    slots: Box<[u32]>,
    len: usize,
    removed: usize,
    hasher: RandomState,
}

impl KeyIndex {
    #[cfg(test)]
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Heap bytes.
    pub fn heap_bytes(&self) -> usize {
        self.ctrl.len() * (1 + std::mem::size_of::<u32>())
    }

    fn hash(&self, key: &EntryKey) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The bucket holding `key`.
    fn find_bucket(&self, key: &EntryKey, key_of: &impl Fn(u32) -> EntryKey) -> Option<usize> {
        let n = self.ctrl.len();
        if n == 0 {
            return None;
        }
        let h = self.hash(key);
        let (t, mask) = (tag(h), n - 1);
        let mut b = h as usize & mask;
        // There is always an empty bucket (at most 7/8 are full or removed).
        for _ in 0..n {
            match self.ctrl[b] {
                EMPTY => return None,
                c if c == t && key_of(self.slots[b]) == *key => return Some(b),
                _ => b = (b + 1) & mask,
            }
        }
        None
    }

    /// The slot of `key`.
    pub fn get(&self, key: &EntryKey, key_of: impl Fn(u32) -> EntryKey) -> Option<u32> {
        self.find_bucket(key, &key_of).map(|b| self.slots[b])
    }

    /// Records that `key` is in `slot`. `key` must not be in the index yet, and `key_of(slot)`
    /// must already return it (a growth rehashes every key).
    pub fn insert(&mut self, key: &EntryKey, slot: u32, key_of: impl Fn(u32) -> EntryKey) {
        if (self.len + self.removed + 1) * 8 > self.ctrl.len() * 7 {
            self.rebuild(&key_of);
        }
        let h = self.hash(key);
        let mask = self.ctrl.len() - 1;
        let mut b = h as usize & mask;
        while self.ctrl[b] & 0x80 != 0 {
            b = (b + 1) & mask;
        }
        if self.ctrl[b] == REMOVED {
            self.removed -= 1;
        }
        self.ctrl[b] = tag(h);
        self.slots[b] = slot;
        self.len += 1;
    }

    /// Forgets `key`; returns its slot.
    pub fn remove(&mut self, key: &EntryKey, key_of: impl Fn(u32) -> EntryKey) -> Option<u32> {
        let b = self.find_bucket(key, &key_of)?;
        let mask = self.ctrl.len() - 1;
        // A bucket followed by an empty one ends every probe run through it: it can be empty.
        if self.ctrl[(b + 1) & mask] == EMPTY {
            self.ctrl[b] = EMPTY;
        } else {
            self.ctrl[b] = REMOVED;
            self.removed += 1;
        }
        self.len -= 1;
        Some(self.slots[b])
    }

    /// Rehashes into the smallest table (a power of two, at least 8 buckets) that holds one
    /// more key at most 7/8 full: twice the size when full of keys, the same or smaller when
    /// full of removed buckets.
    fn rebuild(&mut self, key_of: &impl Fn(u32) -> EntryKey) {
        let want = ((self.len + 1) * 8).div_ceil(7);
        let n = want.next_power_of_two().max(8);
        let old_ctrl = std::mem::replace(&mut self.ctrl, vec![EMPTY; n].into_boxed_slice());
        let old_slots = std::mem::replace(&mut self.slots, vec![0; n].into_boxed_slice());
        self.removed = 0;
        let mask = n - 1;
        for (c, slot) in old_ctrl.iter().zip(old_slots.iter()) {
            if c & 0x80 == 0 {
                continue;
            }
            let h = self.hash(&key_of(*slot));
            let mut b = h as usize & mask;
            while self.ctrl[b] != EMPTY {
                b = (b + 1) & mask;
            }
            self.ctrl[b] = tag(h);
            self.slots[b] = *slot;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    fn key(n: u32) -> EntryKey {
        let mut k = [0u8; 16];
        k[..4].copy_from_slice(&n.to_le_bytes());
        EntryKey(k)
    }

    #[test]
    fn chunked_grows_by_chunks_and_keeps_defaults() {
        let mut c: Chunked<u64> = Chunked::new();
        assert_eq!(c.capacity(), 0);
        assert_eq!(c.get(0), None);
        *c.grow_to(5) = 7;
        assert_eq!(c.capacity(), CHUNK);
        assert_eq!(c[5], 7);
        assert_eq!(c.get(6), Some(&0));
        *c.grow_to(CHUNK as u32 * 3) = 1;
        assert_eq!(c.capacity(), 4 * CHUNK);
        assert_eq!(c.get(CHUNK as u32 * 4), None);
        assert!(c.heap_bytes() >= 4 * CHUNK * 8);
    }

    proptest! {
        /// The index answers like a `HashMap` through any sequence of inserts and removals.
        #[test]
        fn key_index_is_a_map(ops in prop::collection::vec((any::<bool>(), 0u32..300), 0..2000)) {
            // Slot `s` holds key `s + 1000` (slots are the caller's; keys live there).
            let key_of = |s: u32| key(s + 1000);
            let mut index = KeyIndex::new();
            let mut model: HashMap<EntryKey, u32> = HashMap::new();
            for (insert, s) in ops {
                let k = key_of(s);
                if insert {
                    if let std::collections::hash_map::Entry::Vacant(v) = model.entry(k) {
                        index.insert(&k, s, key_of);
                        v.insert(s);
                    }
                } else {
                    prop_assert_eq!(index.remove(&k, key_of), model.remove(&k));
                }
                prop_assert_eq!(index.len(), model.len());
            }
            for s in 0..300 {
                let k = key_of(s);
                prop_assert_eq!(index.get(&k, key_of), model.get(&k).copied());
            }
            prop_assert!(index.heap_bytes() <= 5 * 2048);
        }
    }

    #[test]
    fn key_index_stays_small() {
        let key_of = |s: u32| key(s);
        let mut index = KeyIndex::new();
        for s in 0..6000 {
            index.insert(&key(s), s, key_of);
        }
        assert_eq!(index.heap_bytes(), 8192 * 5);
        for s in 0..6000 {
            assert_eq!(index.get(&key(s), key_of), Some(s));
        }
        // Churn does not grow it: removed buckets are reclaimed by rebuilding in place.
        for round in 0..10u32 {
            for s in 0..3000 {
                index.remove(&key(s + round * 3000), key_of);
                index.insert(&key(s + (round + 2) * 3000), s + (round + 2) * 3000, key_of);
            }
        }
        assert_eq!(index.len(), 6000);
        assert_eq!(index.heap_bytes(), 8192 * 5);
    }
}
