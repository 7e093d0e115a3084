//! Which cached object to evict: the [`EvictionPolicy`] trait, the types policies share, and
//! the policies: [`lru`], [`epoch`], [`plan`], and [`policy`] to pick one by name.
//!
//! The cache evicts whole objects (an entry's data file and index together). A policy only
//! *orders* entries; the cache decides *when* to evict (a reservation that does not fit the
//! budget or the free-space guard) and *whether* a candidate may go: entries pinned by an open
//! reader, being written, already being evicted, or in use by another process (see `disk`) are
//! skipped by the `evictable` predicate given to [`EvictionPolicy::victim`], and stay where the
//! policy keeps them.
//!
//! Entries are named by the cache's [`Slot`] numbers, and policies keep their per-entry state
//! in arrays indexed by them ([`crate::cache::slab::Chunked`]): no key and no hash map per policy.
//!
//! [`LruPolicy`] keeps a doubly linked list over the slots (`u32` links, 8 bytes per slot, no
//! allocation per touch): an access moves the entry to the hot end; the victim is the first
//! evictable entry from the cold end. Entries found on disk at start-up are inserted at the cold end, newest first, so
//! they keep the order of their last use in earlier runs (the index file's mtime) and are
//! colder than anything used in this run.
//!
//! Dataset-aware policies implement the same trait: [`EpochPolicy`]
//! ("evict what was just read in this epoch", with inferred epoch boundaries) and
//! [`PlanPolicy`] (Belady from the epoch plan, through a
//! [`PlanOracle`]); [`make_policy`] picks one by name, and
//! `cache::simulate` (unit tests) measures them.

use std::time::SystemTime;

use super::identity::EntryKey;

pub mod epoch_policy;
pub mod lru;
pub mod plan_policy;
pub mod policy;

pub use epoch_policy::EpochPolicy;
pub use lru::LruPolicy;
pub use plan_policy::{NoPlan, PlanOracle, PlanPolicy};
pub use policy::{make_policy, EvictionKind};

/// Where the cache keeps an entry: a small number it assigns when it first knows the entry,
/// stable until the entry is removed, and reused after that. Policies keep their per-entry
/// state in arrays indexed by it (see [`crate::cache::slab`]), so they need no map of their own.
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

/// Approximate heap bytes of a `std` `HashMap` (SwissTable: one slot and one control byte per
/// bucket, buckets a power of two at most 8/7 of the capacity).
pub fn hashmap_bytes(capacity: usize, slot: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    let buckets = (capacity * 8 / 7).next_power_of_two().max(4);
    buckets * (slot + 1) + 16
}
