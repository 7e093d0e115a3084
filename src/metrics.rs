//! What a mount reports about itself: counters gathered from the store, namespace and fetcher,
//! served as JSON on the control socket (`riffle stats`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;

use crate::control::StatsSource;
use crate::fetch::Fetcher;
use crate::fs::FsStatus;
use crate::namespace::Namespace;
use crate::store::retry::RetryingStore;

/// The parts of a mount that have something to count.
pub struct MountMetrics {
    pub source: String,
    pub started: Instant,
    pub namespace: Arc<Namespace>,
    pub fetcher: Arc<Fetcher>,
    pub store: Arc<RetryingStore>,
    pub fs: Arc<FsStatus>,
}

impl StatsSource for MountMetrics {
    fn stats(&self) -> serde_json::Value {
        let f = self.fetcher.stats();
        let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        let cache = self.fetcher.disk().map(|d| {
            let c = d.cache().stats();
            json!({
                "dir": d.cache().dir().display().to_string(),
                "objects": c.objects,
                "complete_objects": c.complete_objects,
                "blocks": c.blocks,
                "bytes": c.bytes,
                "limit": c.limit,
                "hits": c.hits,
                "misses": c.misses,
                "crc_failures": c.crc_failures,
                "writes": c.writes,
                "write_bytes": c.write_bytes,
                "evictions": c.evictions,
                "evicted_bytes": c.evicted_bytes,
                "full": c.full,
                "no_space_errors": c.no_space_errors,
                "io_errors": c.io_errors,
                "index_memory_per_object": c.index_memory.per_object,
            })
        });
        json!({
            "source": self.source,
            "pid": std::process::id(),
            "uptime_seconds": self.started.elapsed().as_secs(),
            "store": {
                "get_requests": load(&f.get_requests),
                "get_bytes": load(&f.get_bytes),
                "retries": self.store.retries(),
                "errors": load(&f.errors),
            },
            "fuse": {
                "opens": load(&self.fs.opens),
                "passthrough_opens": load(&self.fs.passthrough_opens),
                "passthrough": self.fs.passthrough_mode.lock().clone(),
            },
            "cache": cache,
            "blocks": {
                "disk_hits": load(&f.disk_hits),
                "hits": load(&f.block_hits),
                "misses": load(&f.block_misses),
                "memory_cache_bytes": self.fetcher.block_cache().weighted_size(),
            },
            "prefetch": {
                "requests": load(&f.prefetch_requests),
                "skipped_for_budget": load(&f.prefetch_skipped),
            },
            "inflight": {
                "requests": self.fetcher.inflight_requests(),
                "bytes": self.fetcher.inflight_bytes(),
            },
            "namespace": {
                "inodes": self.namespace.inode_count(),
                "skipped_keys": self.namespace.skipped_count(),
            },
        })
    }
}
