//! What a mount reports about itself: counters gathered from the store, namespace and fetcher,
//! served as JSON on the control socket (`riffle stats`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;

use crate::control::StatsSource;
use crate::fetch::Fetcher;
use crate::namespace::Namespace;
use crate::store::retry::RetryingStore;

/// The parts of a mount that have something to count.
pub struct MountMetrics {
    pub source: String,
    pub started: Instant,
    pub namespace: Arc<Namespace>,
    pub fetcher: Arc<Fetcher>,
    pub store: Arc<RetryingStore>,
}

impl StatsSource for MountMetrics {
    fn stats(&self) -> serde_json::Value {
        let f = self.fetcher.stats();
        let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        json!({
            "source": self.source,
            "uptime_seconds": self.started.elapsed().as_secs(),
            "store": {
                "get_requests": load(&f.get_requests),
                "get_bytes": load(&f.get_bytes),
                "retries": self.store.retries(),
                "errors": load(&f.errors),
            },
            "blocks": {
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
