//! The in-memory cache of completed blocks: byte-weighted, bounded, shared by all handles.
//!
//! A thin wrapper over moka's concurrent cache weighted by block length, so the bytes held
//! never exceed the configured size however many files are open. A size of zero disables it
//! (every read then goes to the in-flight table or the store).
//!
//! Plain LRU rather than moka's default TinyLFU, whose admission filter may refuse a new entry
//! that looks less frequent than the one it would evict: a block fetched ahead of a sequential
//! reader has been seen exactly once, and must be kept until the reader arrives.
//!
//! **A hard bound.** moka applies inserts and evicts in batches: an insert is logged and the
//! cache's size is brought back under its capacity only when 64 writes are pending or after a
//! while, so under a burst of fetches it held up to 64 blocks (64 MiB of 1 MiB blocks) more
//! than its capacity, beyond `--max-memory`. Here every byte inserted is counted at once
//! ([`BlockCache::held`]; an eviction, replacement or removal gives its bytes back through
//! moka's eviction listener) and an insert that takes the count past the capacity runs moka's
//! pending maintenance itself, so the cache holds at most its capacity plus the blocks being
//! inserted at that moment.
//!
//! **What an entry costs.** Each entry is charged what it really holds ([`weight`]): its
//! buffer's footprint ([`super::buffer::footprint`]: the allocation, not the block's length)
//! and [`ENTRY_BYTES`] of bookkeeping (moka's entry, its place in the LRU order and the hash
//! table, the block's shared header) plus the object version its key keeps alive. Counting
//! lengths only, a cache of small files' blocks held several times its capacity: 2.5 KB
//! blocks in 8 KiB of heap each, and about 300 bytes per entry nobody counted (issue 46).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use super::buffer::{compact, footprint};
use super::BlockKey;

/// Bytes of bookkeeping per entry besides the block's buffer and the text of the object
/// version's key and ETag (measured by `tests/fetch_memory.rs`, about 410: moka's entry,
/// its nodes in the LRU order and its hash table, the `Bytes` header, and the
/// `ObjectVersion` with its two strings' headers, which the entry's key keeps alive).
pub const ENTRY_BYTES: u64 = 416;

/// What the entry of `data` under `key` is charged (see the module documentation).
pub fn weight(key: &BlockKey, data: &Bytes) -> u64 {
    footprint(data.len()) + ENTRY_BYTES + (key.0.key.len() + key.0.etag.len()) as u64
}

/// See the module documentation.
#[derive(Clone)]
pub struct BlockCache {
    inner: Option<moka::sync::Cache<BlockKey, Bytes>>,
    /// Bytes inserted and not yet evicted, replaced or removed (moka's count lags).
    held: Arc<AtomicU64>,
    max_bytes: u64,
}

impl BlockCache {
    pub fn new(max_bytes: u64) -> Self {
        let held = Arc::new(AtomicU64::new(0));
        let inner = (max_bytes > 0).then(|| {
            let released = held.clone();
            moka::sync::Cache::builder()
                .eviction_policy(moka::policy::EvictionPolicy::lru())
                .max_capacity(max_bytes)
                .weigher(|k: &BlockKey, v: &Bytes| weight(k, v).try_into().unwrap_or(u32::MAX))
                .eviction_listener(move |k, v: Bytes, _cause| {
                    let w = weight(&k, &v);
                    let _ = released.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
                        Some(h.saturating_sub(w))
                    });
                })
                .build()
        });
        BlockCache {
            inner,
            held,
            max_bytes,
        }
    }

    pub fn get(&self, key: &BlockKey) -> Option<Bytes> {
        self.inner.as_ref()?.get(key)
    }

    /// Keeps `data` as block `key`, in a buffer of its own size ([`compact`]).
    pub fn insert(&self, key: BlockKey, data: Bytes) {
        if let Some(c) = &self.inner {
            let data = compact(data);
            let w = weight(&key, &data);
            c.insert(key, data);
            if self.held.fetch_add(w, Ordering::Relaxed) + w > self.max_bytes {
                // Over the capacity: evict now rather than after moka's next batch.
                c.run_pending_tasks();
            }
        }
    }

    pub fn remove(&self, key: &BlockKey) {
        if let Some(c) = &self.inner {
            c.invalidate(key);
        }
    }

    /// Bytes held, as charged (after pending maintenance runs).
    pub fn weighted_size(&self) -> u64 {
        self.inner.as_ref().map_or(0, |c| {
            c.run_pending_tasks();
            c.weighted_size()
        })
    }

    /// Bytes inserted and not yet given back (at least what moka holds).
    #[cfg(test)]
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fetch::ObjectVersion;

    #[test]
    fn a_burst_of_inserts_never_holds_more_than_the_capacity() {
        let cache = BlockCache::new(8 << 20);
        let obj = Arc::new(ObjectVersion {
            key: Arc::from("k"),
            etag: Arc::from("e"),
            size: 1 << 30,
        });
        for i in 0..200u64 {
            cache.insert((obj.clone(), i), Bytes::from(vec![0u8; 1 << 20]));
            assert!(
                cache.held() <= (8 << 20) + (1 << 20),
                "{} bytes held after {i} inserts",
                cache.held()
            );
        }
        assert!(cache.weighted_size() <= 8 << 20);
        cache.insert((obj.clone(), 0), Bytes::from(vec![0u8; 1 << 20]));
        cache.remove(&(obj.clone(), 0));
        cache.weighted_size();
        assert!(cache.held() <= 8 << 20);
    }
}
