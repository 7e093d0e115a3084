//! What a mount reports about itself: counters gathered from the store, namespace and fetcher.
//!
//! [`MountMetrics`] records them, each against its declaration in [`crate::stats::defs`], into
//! one JSON tree ([`crate::stats::Sample`]), served on the control socket (`riffle stats`).
//! The same tree feeds the Prometheus endpoint (`--metrics-addr`): [`prometheus`] translates
//! it into OpenMetrics families, one per declaration, on each scrape and adds the FUSE
//! operation latency histograms recorded by [`crate::fs::latency`], every sample labelled
//! with the mount's `--metrics-label`s ([`labels`]); [`http`] serves the result.
//! [`serve_metrics`] puts the three together.

#[cfg(test)]
pub(crate) mod fixture;
pub mod http;
pub mod labels;
pub mod prometheus;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::fetch::{Fetcher, ObjectVersion};
use crate::fs::latency::FuseOps;
use crate::fs::FsStatus;
use crate::namespace::{ListedUsage, Namespace};
use crate::stats::{defs, Sample};
use crate::store::retry::RetryingStore;
pub use http::MetricsServer;
pub use labels::MetricLabel;
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
/// `http://addr/metrics`, every sample labelled with `labels`, on the current tokio runtime
/// (call inside `Runtime::enter`). The address is bound before this returns; dropping the
/// returned server stops it.
pub fn serve_metrics(
    addr: SocketAddr,
    source: Arc<dyn StatsSource>,
    ops: Arc<FuseOps>,
    labels: &[MetricLabel],
) -> Result<MetricsServer, MetricsError> {
    let server = http::serve(addr, Arc::new(Exporter::new(source, ops, labels)))?;
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
        let mut sample = Sample::new();
        self.record(&mut sample);
        sample.into_json()
    }
}

impl MountMetrics {
    /// Records every section but `prefetch` (the control socket adds it).
    pub fn record(&self, sample: &mut Sample) {
        let f = self.fetcher.stats();
        let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        sample.put(&defs::SOURCE, self.source.as_str());
        sample.put(&defs::PID, std::process::id());
        sample.put(&defs::UPTIME_SECONDS, self.started.elapsed().as_secs());

        sample.put(&defs::STORE_GET_REQUESTS, load(&f.get_requests));
        sample.put(&defs::STORE_GET_BYTES, load(&f.get_bytes));
        sample.put(&defs::STORE_RETRIES, self.store.retries());
        sample.put(&defs::STORE_ERRORS, load(&f.errors));
        sample.put(&defs::STORE_PROOF_REQUESTS, load(&f.proof_requests));
        sample.put(&defs::STORE_PROOFS_REFUSED, load(&f.proofs_refused));

        let fs = &self.fs;
        sample.put(&defs::FUSE_OPENS, load(&fs.opens));
        sample.put(&defs::FUSE_PASSTHROUGH_OPENS, load(&fs.passthrough_opens));
        sample.put(&defs::FUSE_FAST_OPENS, load(&fs.fast_opens));
        sample.put(&defs::FUSE_BACKINGS_OPENED_AHEAD, load(&fs.opened_ahead));
        sample.put(&defs::FUSE_IDLE_BACKINGS, load(&fs.idle_backings));
        sample.put(&defs::FUSE_MAX_IDLE_BACKINGS, load(&fs.max_idle_backings));
        sample.put(&defs::FUSE_LOOKUP_READAHEADS, load(&fs.lookahead.requested));
        sample.put(
            &defs::FUSE_LOOKUP_READAHEADS_FAILED,
            load(&fs.lookahead.failed),
        );
        sample.put(&defs::FUSE_PASSTHROUGH, fs.passthrough_mode.lock().clone());
        sample.put(
            &defs::FUSE_DIR_READS_WITH_ATTRS,
            load(&fs.dirplus.with_attrs),
        );
        sample.put(
            &defs::FUSE_DIR_READS_NAMES_ONLY,
            load(&fs.dirplus.names_only),
        );
        let mode = if fs.dirplus.stat_mode() {
            "attributes"
        } else {
            "names"
        };
        sample.put(&defs::FUSE_DIR_READS_MODE, mode);
        sample.put(&defs::FUSE_TRANSPORT, fs.transport.describe());
        sample.put(&defs::FUSE_RING_REQUESTS, fs.transport.ring_requests());
        sample.put(
            &defs::FUSE_RING_ENTRIES_BUSY,
            fs.transport.ring_entries_busy(),
        );
        sample.put(&defs::FUSE_DEVICES, load(&fs.fuse_devices));
        sample.put(
            &defs::FUSE_KERNEL_READ_AHEAD,
            fs.kernel_read_ahead.lock().clone(),
        );

        match self.fetcher.disk() {
            Some(d) => {
                let c = d.cache().stats();
                sample.put(&defs::CACHE_DIR, d.cache().dir().display().to_string());
                sample.put(&defs::CACHE_OBJECTS, c.objects);
                sample.put(&defs::CACHE_COMPLETE_OBJECTS, c.complete_objects);
                sample.put(&defs::CACHE_BLOCKS, c.blocks);
                sample.put(&defs::CACHE_BYTES, c.bytes);
                sample.put(&defs::CACHE_LIMIT, c.limit);
                sample.put(&defs::CACHE_HITS, c.hits);
                sample.put(&defs::CACHE_MISSES, c.misses);
                sample.put(&defs::CACHE_CRC_FAILURES, c.crc_failures);
                sample.put(&defs::CACHE_WRITES, c.writes);
                sample.put(&defs::CACHE_WRITE_BYTES, c.write_bytes);
                sample.put(&defs::CACHE_EVICTIONS, c.evictions);
                sample.put(&defs::CACHE_EVICTED_BYTES, c.evicted_bytes);
                sample.put(&defs::CACHE_FULL, c.full);
                sample.put(&defs::CACHE_VERIFIED_READS, c.verified_reads);
                sample.put(&defs::CACHE_FREE_FLOOR_REFUSALS, c.free_floor_refusals);
                sample.put(&defs::CACHE_MIN_FREE, c.min_free);
                sample.put(&defs::CACHE_NO_SPACE_ERRORS, c.no_space_errors);
                sample.put(&defs::CACHE_IO_ERRORS, c.io_errors);
                sample.put(
                    &defs::CACHE_INDEX_MEMORY_PER_OBJECT,
                    c.index_memory.per_object,
                );
            }
            None => sample.absent(&defs::CACHE),
        }

        match self.fetcher.peers() {
            Some(p) => {
                let s = p.stats();
                sample.put(&defs::PEER_MEMBERS, p.member_count());
                sample.put(&defs::PEER_BYTES_SERVED, load(&s.bytes_served));
                sample.put(&defs::PEER_BLOCKS_SERVED, load(&s.blocks_served));
                sample.put(&defs::PEER_BYTES_FETCHED, load(&s.bytes_fetched));
                sample.put(&defs::PEER_BLOCKS_FETCHED, load(&s.blocks_fetched));
                sample.put(&defs::PEER_STORE_FALLBACKS, load(&s.store_fallbacks));
                sample.put(&defs::PEER_ERRORS, load(&s.errors));
            }
            None => sample.absent(&defs::PEER),
        }

        sample.put(&defs::BLOCKS_DISK_HITS, load(&f.disk_hits));
        sample.put(&defs::BLOCKS_HITS, load(&f.block_hits));
        sample.put(&defs::BLOCKS_MISSES, load(&f.block_misses));
        let memory = self.fetcher.block_cache().weighted_size();
        sample.put(&defs::BLOCKS_MEMORY_CACHE_BYTES, memory);

        sample.put(&defs::READ_AHEAD_REQUESTS, load(&f.prefetch_requests));
        sample.put(
            &defs::READ_AHEAD_SKIPPED_FOR_BUDGET,
            load(&f.prefetch_skipped),
        );

        sample.put(&defs::INFLIGHT_REQUESTS, self.fetcher.inflight_requests());
        sample.put(&defs::INFLIGHT_BYTES, self.fetcher.inflight_bytes());

        let volume = self.volume_usage();
        sample.put(&defs::VOLUME_LISTED_FILES, volume.files);
        sample.put(&defs::VOLUME_LISTED_DIRS, volume.dirs);
        sample.put(&defs::VOLUME_LISTED_ENTRIES, volume.entries());
        sample.put(&defs::VOLUME_LISTED_BYTES, volume.bytes);
        sample.put(&defs::VOLUME_CACHED_BYTES, volume.cached_bytes);

        let ns = &self.namespace;
        let listings = ns.listing_stats();
        sample.put(&defs::NAMESPACE_INODES, ns.inode_count());
        sample.put(&defs::NAMESPACE_SKIPPED_KEYS, ns.skipped_count());
        sample.put(&defs::NAMESPACE_LISTINGS, listings.from_store);
        sample.put(&defs::NAMESPACE_LISTINGS_BACKGROUND, listings.background);
        sample.put(
            &defs::NAMESPACE_LISTINGS_BACKGROUND_FAILED,
            listings.background_failed,
        );
        sample.put(&defs::NAMESPACE_LISTINGS_FROM_DISK, listings.from_disk);
        sample.put(&defs::NAMESPACE_LISTINGS_SAVED, listings.saved_written);
        sample.put(
            &defs::NAMESPACE_LISTINGS_SAVED_IGNORED,
            listings.saved_ignored,
        );
        sample.put(&defs::NAMESPACE_HEAP_TRIMS, crate::heap_trim::trims());
    }
}
