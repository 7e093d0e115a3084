//! What a live cache reports: its counters, the [`CacheStats`] snapshot of `riffle stats`,
//! and the [`IndexMemory`] its in-memory index spends.

use std::sync::atomic::{AtomicU64, Ordering};

use super::table::Record;
use super::DiskCache;
use crate::cache::evict::{hashmap_bytes, EvictionPolicy, LruPolicy, PlanPolicy};
use crate::cache::identity::EntryKey;

/// Counters since this handle was opened.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) hits: AtomicU64,
    pub(super) misses: AtomicU64,
    pub(super) crc_failures: AtomicU64,
    pub(super) writes: AtomicU64,
    pub(super) write_bytes: AtomicU64,
    pub(super) write_skipped: AtomicU64,
    pub(super) evictions: AtomicU64,
    pub(super) evicted_bytes: AtomicU64,
    pub(super) evict_in_use: AtomicU64,
    pub(super) full: AtomicU64,
    /// Of `full`: refused because the filesystem's free space is at the floor kept free.
    pub(super) free_floor: AtomicU64,
    pub(super) no_space_errors: AtomicU64,
    pub(super) io_errors: AtomicU64,
    /// Journal tails read back on a blocking thread.
    pub(super) journal_replays: AtomicU64,
    /// Reads of known-good blocks served as just the bytes asked for.
    pub(super) verified_reads: AtomicU64,
}

/// A snapshot of a live cache's state and counters (`riffle stats`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Entries known to hold bytes (from the scan, loaded, or written here).
    pub objects: u64,
    /// Entries whose every block is present.
    pub complete_objects: u64,
    /// Blocks present in the known entries.
    pub blocks: u64,
    /// Bytes charged (see the module documentation); never above `limit`.
    pub bytes: u64,
    pub limit: u64,
    /// Entries with files open in this process.
    pub open_objects: u64,
    pub pinned_objects: u64,
    pub hits: u64,
    pub misses: u64,
    pub crc_failures: u64,
    pub writes: u64,
    pub write_bytes: u64,
    /// Writes not done because another writer (here or in another process) had the block.
    pub write_skipped: u64,
    pub evictions: u64,
    pub evicted_bytes: u64,
    /// Eviction candidates skipped because another process uses them.
    pub evict_in_use: u64,
    /// Writes refused because nothing could be evicted.
    pub full: u64,
    /// Reads of blocks known good to this process served as just the bytes asked for,
    /// without reading the whole block and checking its CRC ([`DiskCache::read_verified_on_ring`]).
    pub verified_reads: u64,
    /// Of `full`: refused because the filesystem's free space is at the floor kept free
    /// (`--cache-min-free`), whatever the cache's own budget.
    pub free_floor_refusals: u64,
    /// Bytes of the filesystem always left free.
    pub min_free: u64,
    pub no_space_errors: u64,
    pub io_errors: u64,
    pub scan_complete: bool,
    /// See [`IndexMemory`].
    pub index_memory: IndexMemory,
}

/// Memory the cache's in-memory index spends (a structural count of its tables).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexMemory {
    pub entries: u64,
    pub open_entries: u64,
    /// Bytes of the table of all known entries (idle open entries included) and the
    /// eviction policies.
    pub table_bytes: u64,
    /// Bytes of the open entries in use or of more than one block (`Arc<OpenEntry>`s with
    /// their block tables and descriptors' `Arc`s).
    pub open_bytes: u64,
    /// `(table_bytes + open_bytes) / entries`.
    pub per_object: u64,
    /// `table_bytes / entries`: what an entry costs once its files are closed.
    pub per_closed_object: u64,
}

impl DiskCache {
    /// Journal tails this handle has read back on a blocking thread.
    #[cfg(test)]
    pub(crate) fn journal_replays(&self) -> u64 {
        self.counters.journal_replays.load(Ordering::Relaxed)
    }

    /// Bytes charged to the cache now (cheap: no walk of the index).
    pub(crate) fn used_bytes(&self) -> u64 {
        self.state.lock().used
    }

    /// Whether the cache has had to make room (evicted, or refused a write) since it was
    /// opened (cheap: two counters).
    pub(crate) fn has_been_full(&self) -> bool {
        self.counters.evictions.load(Ordering::Relaxed) > 0
            || self.counters.full.load(Ordering::Relaxed) > 0
    }

    /// A snapshot of the cache's state and counters.
    pub fn stats(&self) -> CacheStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let index_memory = self.index_memory();
        let st = self.state.lock();
        let mut s = CacheStats {
            bytes: st.used,
            limit: self.limit,
            open_objects: st.open_count as u64,
            hits: get(&c.hits),
            misses: get(&c.misses),
            crc_failures: get(&c.crc_failures),
            writes: get(&c.writes),
            write_bytes: get(&c.write_bytes),
            write_skipped: get(&c.write_skipped),
            evictions: get(&c.evictions),
            evicted_bytes: get(&c.evicted_bytes),
            evict_in_use: get(&c.evict_in_use),
            full: get(&c.full),
            verified_reads: get(&c.verified_reads),
            free_floor_refusals: get(&c.free_floor),
            min_free: self.min_free,
            no_space_errors: get(&c.no_space_errors),
            io_errors: get(&c.io_errors),
            scan_complete: *self.scan_done.lock(),
            index_memory,
            ..CacheStats::default()
        };
        for e in st.table.iter() {
            if e.bytes > 0 {
                s.objects += 1;
            }
            if e.complete() {
                s.complete_objects += 1;
            }
            if e.pins > 0 {
                s.pinned_objects += 1;
            }
            s.blocks += e.files.blocks() as u64;
        }
        s
    }

    /// Measures the in-memory index (see [`IndexMemory`]).
    pub fn index_memory(&self) -> IndexMemory {
        let st = self.state.lock();
        let table = st.table.heap_bytes()
            + st.policy.memory_bytes()
            + st.open_lru.memory_bytes()
            + hashmap_bytes(
                st.reserved.capacity(),
                std::mem::size_of::<(EntryKey, u64)>(),
            );
        let open: usize = st.table.iter().map(|e| e.files.memory_bytes()).sum();
        let n = st.table.len().max(1) as u64;
        IndexMemory {
            entries: st.table.len() as u64,
            open_entries: st.open_count as u64,
            table_bytes: table as u64,
            open_bytes: open as u64,
            per_object: (table + open) as u64 / n,
            per_closed_object: table as u64 / n,
        }
    }
}

/// What an entry costs in the index while its files are closed or idle (for `riffle cache
/// stats` without a mount): its record, its share of the key index (5 bytes a bucket, at most
/// 7/8 full, at least 7/16 after a growth: about 8 bytes), the default policy's per-slot state
/// and the open-entry LRU's node. The epoch policy's sample (at most 4,096 keys, about 100–200
/// KiB per cache) comes on top.
pub fn closed_entry_bytes() -> u64 {
    (std::mem::size_of::<Record>() + 8 + PlanPolicy::SLOT_BYTES + LruPolicy::SLOT_BYTES) as u64
}
