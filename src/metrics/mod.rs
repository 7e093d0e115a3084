//! What a mount reports about itself: counters gathered from the store, namespace and fetcher.
//!
//! [`MountMetrics`] gathers them into one JSON tree, served on the control socket
//! (`riffle stats`). The same tree feeds the Prometheus endpoint (`--metrics-addr`):
//! [`prometheus`] translates it into OpenMetrics families on each scrape and adds the FUSE
//! operation latency histograms recorded by [`crate::fs::latency`]; [`http`] serves the result.
//! [`serve_metrics`] puts the three together.

pub mod http;
pub mod prometheus;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;

use crate::fetch::{Fetcher, ObjectVersion};
use crate::fs::latency::FuseOps;
use crate::fs::FsStatus;
use crate::namespace::{ListedUsage, Namespace};
use crate::store::retry::RetryingStore;
pub use http::MetricsServer;
pub use prometheus::Exporter;

/// Something that can describe its state as JSON.
pub trait StatsSource: Send + Sync + 'static {
    fn stats(&self) -> serde_json::Value;
}

/// Why the metrics endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("cannot listen for metrics on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the metrics endpoint must be started inside a tokio runtime")]
    NoRuntime,
}

/// Serves `source`'s counters and `ops`' FUSE latency histograms as Prometheus metrics on
/// `http://addr/metrics`, on the current tokio runtime (call inside `Runtime::enter`). The
/// address is bound before this returns; dropping the returned server stops it.
pub fn serve_metrics(
    addr: SocketAddr,
    source: Arc<dyn StatsSource>,
    ops: Arc<FuseOps>,
) -> Result<MetricsServer, MetricsError> {
    let server = http::serve(addr, Arc::new(Exporter::new(source, ops)))?;
    tracing::info!(
        "serving Prometheus metrics on http://{}/metrics",
        server.local_addr()
    );
    Ok(server)
}

/// The parts of a mount that have something to count.
pub struct MountMetrics {
    pub source: String,
    pub started: Instant,
    pub namespace: Arc<Namespace>,
    pub fetcher: Arc<Fetcher>,
    pub store: Arc<RetryingStore>,
    pub fs: Arc<FsStatus>,
}

impl MountMetrics {
    /// The `volume` section: what the mount has listed and how much of it the node's cache
    /// holds whole (`namespace::usage`); what the CSI plugin's `NodeGetVolumeStats` reports.
    fn volume_usage(&self) -> ListedUsage {
        let Some(disk) = self.fetcher.disk() else {
            return self.namespace.listed_usage(None);
        };
        let cached = |key: &str, etag: &str, size: u64| {
            let object = ObjectVersion {
                key: Arc::from(key),
                etag: Arc::from(etag),
                size,
            };
            disk.cache().is_complete(&disk.identity(&object))
        };
        self.namespace.listed_usage(Some(&cached))
    }
}

impl StatsSource for MountMetrics {
    fn stats(&self) -> serde_json::Value {
        let f = self.fetcher.stats();
        let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        let listings = self.namespace.listing_stats();
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
                "verified_reads": c.verified_reads,
                "free_floor_refusals": c.free_floor_refusals,
                "min_free": c.min_free,
                "no_space_errors": c.no_space_errors,
                "io_errors": c.io_errors,
                "index_memory_per_object": c.index_memory.per_object,
            })
        });
        let peer = self.fetcher.peers().map(|p| {
            let s = p.stats();
            json!({
                "members": p.member_count(),
                "bytes_served": load(&s.bytes_served),
                "blocks_served": load(&s.blocks_served),
                "bytes_fetched": load(&s.bytes_fetched),
                "blocks_fetched": load(&s.blocks_fetched),
                "store_fallbacks": load(&s.store_fallbacks),
                "errors": load(&s.errors),
            })
        });
        let volume = self.volume_usage();
        json!({
            "source": self.source,
            "pid": std::process::id(),
            "uptime_seconds": self.started.elapsed().as_secs(),
            "store": {
                "get_requests": load(&f.get_requests),
                "get_bytes": load(&f.get_bytes),
                "retries": self.store.retries(),
                "errors": load(&f.errors),
                "proof_requests": load(&f.proof_requests),
                "proofs_refused": load(&f.proofs_refused),
            },
            "fuse": {
                "opens": load(&self.fs.opens),
                "passthrough_opens": load(&self.fs.passthrough_opens),
                "fast_opens": load(&self.fs.fast_opens),
                "backings_opened_ahead": load(&self.fs.opened_ahead),
                "idle_backings": load(&self.fs.idle_backings),
                "lookup_readaheads": load(&self.fs.lookahead.requested),
                "lookup_readaheads_failed": load(&self.fs.lookahead.failed),
                "passthrough": self.fs.passthrough_mode.lock().clone(),
                "dir_reads_with_attrs": load(&self.fs.dirplus.with_attrs),
                "dir_reads_names_only": load(&self.fs.dirplus.names_only),
                "dir_reads_mode": if self.fs.dirplus.stat_mode() { "attributes" } else { "names" },
                "kernel_read_ahead": self.fs.kernel_read_ahead.lock().clone(),
            },
            "cache": cache,
            "peer": peer,
            "blocks": {
                "disk_hits": load(&f.disk_hits),
                "hits": load(&f.block_hits),
                "misses": load(&f.block_misses),
                "memory_cache_bytes": self.fetcher.block_cache().weighted_size(),
            },
            "read_ahead": {
                "requests": load(&f.prefetch_requests),
                "skipped_for_budget": load(&f.prefetch_skipped),
            },
            "inflight": {
                "requests": self.fetcher.inflight_requests(),
                "bytes": self.fetcher.inflight_bytes(),
            },
            "volume": {
                "listed_files": volume.files,
                "listed_dirs": volume.dirs,
                "listed_entries": volume.entries(),
                "listed_bytes": volume.bytes,
                "cached_bytes": volume.cached_bytes,
            },
            "namespace": {
                "inodes": self.namespace.inode_count(),
                "skipped_keys": self.namespace.skipped_count(),
                "listings": listings.from_store,
                "listings_background": listings.background,
                "listings_background_failed": listings.background_failed,
                "listings_from_disk": listings.from_disk,
                "listings_saved": listings.saved_written,
                "listings_saved_ignored": listings.saved_ignored,
                "heap_trims": crate::heap_trim::trims(),
            },
        })
    }
}
