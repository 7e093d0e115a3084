//! The in-memory cache of completed blocks: byte-weighted, bounded, shared by all handles.
//!
//! A thin wrapper over moka's concurrent cache weighted by block length, so the bytes held
//! never exceed the configured size however many files are open. A size of zero disables it
//! (every read then goes to the in-flight table or the store).
//!
//! Plain LRU rather than moka's default TinyLFU, whose admission filter may refuse a new entry
//! that looks less frequent than the one it would evict: a block fetched ahead of a sequential
//! reader has been seen exactly once, and must be kept until the reader arrives.

use bytes::Bytes;

use super::BlockKey;

/// See the module documentation.
#[derive(Clone)]
pub struct BlockCache {
    inner: Option<moka::sync::Cache<BlockKey, Bytes>>,
}

impl BlockCache {
    pub fn new(max_bytes: u64) -> Self {
        let inner = (max_bytes > 0).then(|| {
            moka::sync::Cache::builder()
                .eviction_policy(moka::policy::EvictionPolicy::lru())
                .max_capacity(max_bytes)
                .weigher(|_k: &BlockKey, v: &Bytes| v.len().try_into().unwrap_or(u32::MAX))
                .build()
        });
        BlockCache { inner }
    }

    pub fn get(&self, key: &BlockKey) -> Option<Bytes> {
        self.inner.as_ref()?.get(key)
    }

    pub fn insert(&self, key: BlockKey, data: Bytes) {
        if let Some(c) = &self.inner {
            c.insert(key, data);
        }
    }

    pub fn remove(&self, key: &BlockKey) {
        if let Some(c) = &self.inner {
            c.invalidate(key);
        }
    }

    /// Bytes held (after pending maintenance runs).
    pub fn weighted_size(&self) -> u64 {
        self.inner.as_ref().map_or(0, |c| {
            c.run_pending_tasks();
            c.weighted_size()
        })
    }
}
