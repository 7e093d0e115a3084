//! The mount's counters as Prometheus metrics (OpenMetrics text), built with `prometheus-client`.
//!
//! Nothing is counted twice: on each scrape a collector asks the same [`StatsSource`] that
//! answers `riffle stats` for its JSON tree and translates it, so the two views cannot drift.
//! The translation is the table [`STATS`]: each entry maps one JSON path (`store.get_bytes`)
//! to a metric family with a type (counter or gauge), a unit and a help text, e.g.
//! `riffle_store_get_bytes_total`. A numeric (or boolean) field of the JSON that is not in the
//! table is still exported, as an OpenMetrics `unknown` metric named after its path
//! (`riffle_<section>_<field>`), so a counter added to the JSON shows up before it is
//! classified here; a unit test fails until it is. Strings (the bucket, the cache directory)
//! are not exported, except the passthrough state, as a 0/1 gauge. There are no per-object or
//! per-path labels: the label sets are fixed (the FUSE operation kind), so the number of series
//! is bounded.
//!
//! A second collector encodes the FUSE latency histograms of [`FuseOps`]:
//! `riffle_fuse_op_duration_seconds{op="read"}` and `riffle_fuse_ops_in_progress{op="read"}`.

use std::collections::HashSet;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use serde_json::Value;

use super::StatsSource;
use crate::fs::latency::{FuseOp, FuseOps, BUCKET_BOUNDS};

/// The content type of [`Exporter::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How a JSON field becomes a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (the exposed name gets `_total`).
    Counter,
    /// Goes up and down.
    Gauge,
    /// A string field: 1 when it equals the given value, else 0.
    Equals(&'static str),
}

/// One row of the translation table.
#[derive(Debug, Clone, Copy)]
pub struct StatSpec {
    /// Dotted path in the JSON stats (as `riffle stats` prints it).
    pub path: &'static str,
    /// Metric family name, without the unit and `_total` suffixes.
    pub name: &'static str,
    pub kind: Kind,
    pub unit: Option<MetricUnit>,
    pub help: &'static str,
}

/// The units used here (a `Copy` stand-in for `prometheus_client`'s `Unit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricUnit {
    Bytes,
    Seconds,
}

impl MetricUnit {
    fn unit(self) -> Unit {
        match self {
            MetricUnit::Bytes => Unit::Bytes,
            MetricUnit::Seconds => Unit::Seconds,
        }
    }
}

const fn spec(
    path: &'static str,
    name: &'static str,
    kind: Kind,
    unit: Option<MetricUnit>,
    help: &'static str,
) -> StatSpec {
    StatSpec {
        path,
        name,
        kind,
        unit,
        help,
    }
}

use Kind::{Counter, Gauge};
const BYTES: Option<MetricUnit> = Some(MetricUnit::Bytes);
const SECONDS: Option<MetricUnit> = Some(MetricUnit::Seconds);

/// Every field of the JSON stats and the metric it becomes.
#[rustfmt::skip]
pub const STATS: &[StatSpec] = &[
    spec("uptime_seconds", "riffle_uptime", Gauge, SECONDS, "Time since the mount started."),
    spec("store.get_requests", "riffle_store_get_requests", Counter, None, "Ranged GET requests sent to the object store."),
    spec("store.get_bytes", "riffle_store_get", Counter, BYTES, "Bytes received from the object store by GETs."),
    spec("store.retries", "riffle_store_retries", Counter, None, "Object store requests retried after a transient error."),
    spec("store.errors", "riffle_store_errors", Counter, None, "Fetches that failed after retries."),
    spec("store.proof_requests", "riffle_store_proof_requests", Counter, None, "One-byte GETs proving this mount's credential may read an object another credential cached."),
    spec("store.proofs_refused", "riffle_store_proofs_refused", Counter, None, "Opens refused (EACCES) because the store refused this mount's credential the object."),
    spec("fuse.opens", "riffle_fuse_opens", Counter, None, "Files opened."),
    spec("fuse.passthrough_opens", "riffle_fuse_passthrough_opens", Counter, None, "Files opened in FUSE passthrough mode (served by the kernel from the cache)."),
    spec("fuse.fast_opens", "riffle_fuse_fast_opens", Counter, None, "Passthrough opens answered from memory with a idle backing file."),
    spec("fuse.idle_backings", "riffle_fuse_idle_backings", Gauge, None, "Idle backing files held for reopening cached files from memory."),
    spec("fuse.backings_opened_ahead", "riffle_fuse_backings_opened_ahead", Counter, None, "Backing files registered with the kernel as objects completed in the cache, before any open."),
    spec("fuse.lookup_readaheads", "riffle_fuse_lookup_readaheads", Counter, None, "Readaheads of small cached files' cache files started because a lookup named them."),
    spec("fuse.lookup_readaheads_failed", "riffle_fuse_lookup_readaheads_failed", Counter, None, "Lookup readaheads that failed (the cache file was gone)."),
    spec("fuse.dir_reads_with_attrs", "riffle_fuse_dir_reads_with_attrs", Counter, None, "First reads of a directory answered with every entry's attributes (readdirplus), for readers that stat what they list."),
    spec("fuse.dir_reads_names_only", "riffle_fuse_dir_reads_names_only", Counter, None, "First reads of a directory answered with names only, for readers that do not stat what they list."),
    spec("fuse.passthrough", "riffle_fuse_passthrough_enabled", Kind::Equals("enabled"), None, "1 if FUSE passthrough is in use, else 0 (see riffle stats for the reason)."),
    spec("cache.objects", "riffle_cache_objects", Gauge, None, "Objects with bytes in the disk cache."),
    spec("cache.complete_objects", "riffle_cache_complete_objects", Gauge, None, "Objects whose every block is in the disk cache."),
    spec("cache.blocks", "riffle_cache_blocks", Gauge, None, "Blocks in the disk cache."),
    spec("cache.bytes", "riffle_cache", Gauge, BYTES, "Bytes charged to the disk cache."),
    spec("cache.limit", "riffle_cache_limit", Gauge, BYTES, "Size limit of the disk cache."),
    spec("cache.hits", "riffle_cache_hits", Counter, None, "Disk cache block lookups that found the block."),
    spec("cache.misses", "riffle_cache_misses", Counter, None, "Disk cache block lookups that did not find the block."),
    spec("cache.crc_failures", "riffle_cache_crc_failures", Counter, None, "Disk cache blocks that failed their checksum."),
    spec("cache.writes", "riffle_cache_writes", Counter, None, "Blocks written to the disk cache."),
    spec("cache.write_bytes", "riffle_cache_written", Counter, BYTES, "Bytes written to the disk cache."),
    spec("cache.evictions", "riffle_cache_evictions", Counter, None, "Objects evicted from the disk cache."),
    spec("cache.evicted_bytes", "riffle_cache_evicted", Counter, BYTES, "Bytes evicted from the disk cache."),
    spec("cache.full", "riffle_cache_full_refusals", Counter, None, "Disk cache writes refused because nothing could be evicted."),
    spec("cache.verified_reads", "riffle_cache_verified_reads", Counter, None, "Disk cache reads of blocks known good served as just the bytes asked for (no whole-block read and CRC check)."),
    spec("cache.free_floor_refusals", "riffle_cache_free_floor_refusals", Counter, None, "Disk cache writes refused because the cache filesystem is down to the free space kept (--cache-min-free)."),
    spec("cache.min_free", "riffle_cache_min_free", Gauge, BYTES, "Bytes of the cache filesystem always left free (--cache-min-free)."),
    spec("cache.no_space_errors", "riffle_cache_no_space_errors", Counter, None, "Disk cache writes that failed with ENOSPC."),
    spec("cache.io_errors", "riffle_cache_io_errors", Counter, None, "Disk cache I/O errors."),
    spec("cache.index_memory_per_object", "riffle_cache_index_memory_per_object", Gauge, BYTES, "Memory of the disk cache index per known object."),
    spec("blocks.disk_hits", "riffle_blocks_disk_hits", Counter, None, "Blocks served from the disk cache."),
    spec("blocks.hits", "riffle_blocks_hits", Counter, None, "Blocks served from memory or joined in flight."),
    spec("blocks.misses", "riffle_blocks_misses", Counter, None, "Blocks that had to be fetched from the store."),
    spec("blocks.memory_cache_bytes", "riffle_blocks_memory_cache", Gauge, BYTES, "Bytes of blocks held in the memory cache."),
    spec("read_ahead.requests", "riffle_read_ahead_requests", Counter, None, "Read-ahead GETs started."),
    spec("read_ahead.skipped_for_budget", "riffle_read_ahead_skipped_for_budget", Counter, None, "Read-ahead skipped because the request or memory budget was used up."),
    spec("prefetch.opens", "riffle_prefetch_opens", Counter, None, "File opens seen by the prefetcher."),
    spec("prefetch.opens_already_cached", "riffle_prefetch_opens_already_cached", Counter, None, "File opens whose file was already wholly cached."),
    spec("prefetch.plan_opens", "riffle_prefetch_plan_opens", Counter, None, "File opens of files in the epoch plan."),
    spec("prefetch.plan_opens_already_cached", "riffle_prefetch_plan_opens_already_cached", Counter, None, "File opens of plan files that were already wholly cached."),
    spec("prefetch.plan_fetched_files", "riffle_prefetch_plan_fetched_files", Counter, None, "Files fetched ahead of the reader by the epoch plan."),
    spec("prefetch.plan_fetched_bytes", "riffle_prefetch_plan_fetched", Counter, BYTES, "Bytes fetched ahead of the reader by the epoch plan."),
    spec("prefetch.plan_missing", "riffle_prefetch_plan_missing", Counter, None, "Plan entries not found in the store."),
    spec("prefetch.plan_errors", "riffle_prefetch_plan_errors", Counter, None, "Plan fetches that failed."),
    spec("prefetch.plan_unused_bytes", "riffle_prefetch_plan_unused", Counter, BYTES, "Bytes fetched for a plan that was replaced before they were opened (wasted)."),
    spec("prefetch.dir_order_fetched_files", "riffle_prefetch_dir_order_fetched_files", Counter, None, "Files fetched ahead of the reader in directory order."),
    spec("prefetch.epoch.enabled", "riffle_prefetch_epoch_enabled", Gauge, None, "1 if epoch prefetch is on (--epoch-prefetch)."),
    spec("prefetch.epoch.active", "riffle_prefetch_epoch_active", Gauge, None, "1 while an epoch set is recognised and no plan is set."),
    spec("prefetch.epoch.files", "riffle_prefetch_epoch_set_files", Gauge, None, "Files in the epoch set epoch prefetch recognised (no plan)."),
    spec("prefetch.epoch.bytes", "riffle_prefetch_epoch_set", Gauge, BYTES, "Bytes of the files in the epoch set."),
    spec("prefetch.epoch.directories", "riffle_prefetch_epoch_set_directories", Gauge, None, "Directories in the epoch set."),
    spec("prefetch.epoch.directories_drawn_from", "riffle_prefetch_epoch_directories_drawn_from", Gauge, None, "Directories of the epoch set the reader has opened files in."),
    spec("prefetch.epoch.files_drawn_from", "riffle_prefetch_epoch_files_drawn_from", Gauge, None, "Files in the directories drawn from (what epoch prefetch may fetch)."),
    spec("prefetch.epoch.bytes_drawn_from", "riffle_prefetch_epoch_drawn_from", Gauge, BYTES, "Bytes in the directories drawn from."),
    spec("prefetch.epoch.epoch", "riffle_prefetch_epoch_number", Gauge, None, "The epoch the reader is in (1 = the first seen)."),
    spec("prefetch.epoch.opened_files", "riffle_prefetch_epoch_opened_files", Gauge, None, "Files of the set opened in this epoch."),
    spec("prefetch.epoch.opened_bytes", "riffle_prefetch_epoch_opened", Gauge, BYTES, "Bytes of the files of the set opened in this epoch."),
    spec("prefetch.epoch.fetched_ahead_files", "riffle_prefetch_epoch_fetched_ahead_files", Gauge, None, "Files epoch prefetch started fetching in this epoch."),
    spec("prefetch.epoch.fetched_ahead_bytes", "riffle_prefetch_epoch_fetched_ahead", Gauge, BYTES, "Bytes epoch prefetch started fetching in this epoch."),
    spec("prefetch.epoch.ahead_unopened_files", "riffle_prefetch_epoch_ahead_unopened_files", Gauge, None, "Files fetched ahead in this epoch and not opened yet."),
    spec("prefetch.epoch.ahead_unopened_bytes", "riffle_prefetch_epoch_ahead_unopened", Gauge, BYTES, "Bytes fetched ahead in this epoch and not opened yet."),
    spec("prefetch.epoch.fetching", "riffle_prefetch_epoch_fetching", Gauge, None, "Epoch prefetch fetches in flight."),
    spec("prefetch.epoch.cached_unopened_bytes", "riffle_prefetch_epoch_cached_unopened", Gauge, BYTES, "Bytes of set files cached and not opened in this epoch (protected from eviction)."),
    spec("prefetch.epoch.last_usefulness", "riffle_prefetch_epoch_last_usefulness", Gauge, None, "Share of the files fetched ahead in the last epoch that were opened in it."),
    spec("prefetch.epoch.total_fetched_files", "riffle_prefetch_epoch_fetched_files", Counter, None, "Files fetched ahead by epoch prefetch."),
    spec("prefetch.epoch.total_fetched_bytes", "riffle_prefetch_epoch_fetched", Counter, BYTES, "Bytes fetched ahead by epoch prefetch."),
    spec("prefetch.epoch.wasted_bytes", "riffle_prefetch_epoch_wasted", Counter, BYTES, "Bytes epoch prefetch fetched that were not opened before their epoch ended."),
    spec("prefetch.epoch.errors", "riffle_prefetch_epoch_errors", Counter, None, "Epoch prefetch fetches that failed."),
    spec("prefetch.epoch.epochs_started", "riffle_prefetch_epochs_started", Counter, None, "Epoch boundaries seen (files of the set opened again)."),
    spec("prefetch.plan.items", "riffle_prefetch_plan_items", Gauge, None, "Entries in the current epoch plan."),
    spec("prefetch.plan.position", "riffle_prefetch_plan_position", Gauge, None, "The reader's position in the epoch plan."),
    spec("prefetch.plan.fetching", "riffle_prefetch_plan_fetching", Gauge, None, "Plan files being fetched."),
    spec("prefetch.plan.ready_unopened_bytes", "riffle_prefetch_plan_ready_unopened", Gauge, BYTES, "Bytes fetched for the plan and not yet opened by the reader."),
    spec("volume.listed_files", "riffle_volume_listed_files", Gauge, None, "Files reachable from the mount root among the names listed so far."),
    spec("volume.listed_dirs", "riffle_volume_listed_dirs", Gauge, None, "Directories reachable from the mount root among the names listed so far."),
    spec("volume.listed_entries", "riffle_volume_listed_entries", Gauge, None, "Files and directories listed so far (the volume's inodes in NodeGetVolumeStats)."),
    spec("volume.listed_bytes", "riffle_volume_listed", Gauge, BYTES, "Bytes of the files listed so far (the volume's total bytes in NodeGetVolumeStats)."),
    spec("volume.cached_bytes", "riffle_volume_cached", Gauge, BYTES, "Bytes of the listed files the node's disk cache holds whole (the volume's used bytes in NodeGetVolumeStats)."),
    spec("peer.members", "riffle_peer_members", Gauge, None, "Members of the peer ring (this node included when it is one)."),
    spec("peer.bytes_served", "riffle_peer_served", Counter, BYTES, "Bytes of blocks served to peers."),
    spec("peer.blocks_served", "riffle_peer_blocks_served", Counter, None, "Blocks served to peers."),
    spec("peer.bytes_fetched", "riffle_peer_fetched", Counter, BYTES, "Bytes of blocks fetched from peers (CRC-checked)."),
    spec("peer.blocks_fetched", "riffle_peer_blocks_fetched", Counter, None, "Blocks fetched from peers (CRC-checked)."),
    spec("peer.store_fallbacks", "riffle_peer_store_fallbacks", Counter, None, "Blocks fetched from the store because the peers asked failed."),
    spec("peer.errors", "riffle_peer_errors", Counter, None, "Failed requests to peers, and refused requests from them."),
    spec("inflight.requests", "riffle_inflight_requests", Gauge, None, "GET requests in flight."),
    spec("inflight.bytes", "riffle_inflight", Gauge, BYTES, "Bytes of GET buffers reserved."),
    spec("namespace.inodes", "riffle_namespace_inodes", Gauge, None, "Inodes known to the namespace."),
    spec("namespace.skipped_keys", "riffle_namespace_skipped_keys", Gauge, None, "Object keys not representable as paths (skipped)."),
    spec("namespace.listings", "riffle_namespace_listings", Counter, None, "Directory listings taken from the store (all pages of one directory)."),
    spec("namespace.listings_background", "riffle_namespace_listings_background", Counter, None, "Directory listings started in the background ahead of a walk."),
    spec("namespace.listings_background_failed", "riffle_namespace_listings_background_failed", Counter, None, "Background listings that failed after retries (a reader lists the directory itself)."),
    spec("namespace.listings_from_disk", "riffle_namespace_listings_from_disk", Counter, None, "Directory listings taken from the cache directory instead of the store."),
    spec("namespace.listings_saved", "riffle_namespace_listings_saved", Counter, None, "Directory listings written to the cache directory."),
    spec("namespace.listings_saved_ignored", "riffle_namespace_listings_saved_ignored", Counter, None, "Saved listings found torn or unreadable and not used."),
    spec("namespace.heap_trims", "riffle_namespace_heap_trims", Counter, None, "Times freed heap memory was given back to the system after a burst of listings."),
];

/// JSON fields deliberately not exported (identity, not measurements).
pub const IGNORED: &[&str] = &["pid"];

/// The Prometheus view of a mount: a registry with the stats and FUSE latency collectors.
pub struct Exporter {
    registry: Registry,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter").finish_non_exhaustive()
    }
}

impl Exporter {
    pub fn new(source: Arc<dyn StatsSource>, ops: Arc<FuseOps>) -> Self {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(BuildInfo));
        registry.register_collector(Box::new(StatsCollector { source }));
        registry.register_collector(Box::new(FuseOpsCollector { ops }));
        Exporter { registry }
    }

    /// The current metrics in the OpenMetrics text format ([`CONTENT_TYPE`]), `# EOF` included.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::with_capacity(16 * 1024);
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

#[derive(Debug)]
struct BuildInfo;

impl Collector for BuildInfo {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut m = encoder.encode_descriptor(
            "riffle_build",
            "The riffle version serving this mount.",
            None,
            MetricType::Info,
        )?;
        m.encode_info(&[("version", env!("CARGO_PKG_VERSION"))])
    }
}

struct StatsCollector {
    source: Arc<dyn StatsSource>,
}

impl std::fmt::Debug for StatsCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatsCollector").finish_non_exhaustive()
    }
}

impl Collector for StatsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = self.source.stats();
        let mut names = HashSet::new();
        for s in STATS {
            let Some(value) = lookup(&stats, s.path) else {
                continue;
            };
            if encode_spec(&mut encoder, s, value)? {
                names.insert(exposed_name(s.name, s.kind, s.unit));
            }
        }
        let mut leaves = Vec::new();
        numeric_leaves("", &stats, &mut leaves);
        for (path, value) in leaves {
            if IGNORED.contains(&path.as_str()) || STATS.iter().any(|s| s.path == path) {
                continue;
            }
            let name = fallback_name(&path);
            if !names.insert(name.clone()) {
                continue;
            }
            let help = format!("riffle stats field {path} (type not classified yet).");
            let m = encoder.encode_descriptor(&name, &help, None, MetricType::Unknown)?;
            encode_gauge(m, value)?;
        }
        Ok(())
    }
}

/// The name a family is exposed under: `name[_unit][_total]`.
fn exposed_name(name: &str, kind: Kind, unit: Option<MetricUnit>) -> String {
    let mut out = name.to_string();
    if let Some(u) = unit {
        out.push('_');
        out.push_str(u.unit().as_str());
    }
    if kind == Kind::Counter {
        out.push_str("_total");
    }
    out
}

/// The value at a dotted path of `stats`, if present and not null.
fn lookup<'v>(stats: &'v Value, path: &str) -> Option<&'v Value> {
    let mut v = stats;
    for part in path.split('.') {
        v = v.get(part)?;
    }
    (!v.is_null()).then_some(v)
}

/// Encodes one table row; false if the value has the wrong shape (and nothing was written).
fn encode_spec(
    encoder: &mut DescriptorEncoder,
    s: &StatSpec,
    value: &Value,
) -> Result<bool, std::fmt::Error> {
    let unit = s.unit.map(MetricUnit::unit);
    match s.kind {
        Kind::Equals(expected) => {
            let Some(text) = value.as_str() else {
                return Ok(false);
            };
            let m = encoder.encode_descriptor(s.name, s.help, None, MetricType::Gauge)?;
            ConstGauge::new(i64::from(text == expected)).encode(m)?;
        }
        Kind::Counter => {
            // A count (exact), or a non-negative total such as seconds.
            enum Total {
                Count(u64),
                Amount(f64),
            }
            let total = match (value.as_u64(), value.as_f64()) {
                (Some(n), _) => Total::Count(n),
                (None, Some(x)) if x >= 0.0 => Total::Amount(x),
                _ => return Ok(false),
            };
            let m =
                encoder.encode_descriptor(s.name, s.help, unit.as_ref(), MetricType::Counter)?;
            match total {
                Total::Count(n) => ConstCounter::new(n).encode(m)?,
                Total::Amount(x) => ConstCounter::new(x).encode(m)?,
            }
        }
        Kind::Gauge => {
            if value.as_u64().is_none()
                && value.as_i64().is_none()
                && value.as_f64().is_none()
                && value.as_bool().is_none()
            {
                return Ok(false);
            }
            let m = encoder.encode_descriptor(s.name, s.help, unit.as_ref(), MetricType::Gauge)?;
            encode_gauge(m, value)?;
        }
    }
    Ok(true)
}

fn encode_gauge(
    m: prometheus_client::encoding::MetricEncoder,
    value: &Value,
) -> Result<(), std::fmt::Error> {
    if let Some(n) = value.as_u64() {
        ConstGauge::new(n).encode(m)
    } else if let Some(n) = value.as_i64() {
        ConstGauge::new(n).encode(m)
    } else if let Some(b) = value.as_bool() {
        ConstGauge::new(i64::from(b)).encode(m)
    } else {
        ConstGauge::new(value.as_f64().unwrap_or(f64::NAN)).encode(m)
    }
}

/// Every number or boolean under `v`, with its dotted path.
pub(crate) fn numeric_leaves<'v>(prefix: &str, v: &'v Value, out: &mut Vec<(String, &'v Value)>) {
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                numeric_leaves(&path, child, out);
            }
        }
        Value::Number(_) | Value::Bool(_) => out.push((prefix.to_string(), v)),
        _ => {}
    }
}

/// `riffle_` and the path, with every character outside `[a-zA-Z0-9_]` made `_`.
fn fallback_name(path: &str) -> String {
    let mut name = String::from("riffle_");
    name.extend(path.chars().map(|c| {
        if c.is_ascii_alphanumeric() || c == '_' {
            c
        } else {
            '_'
        }
    }));
    name
}

#[derive(Debug)]
struct FuseOpsCollector {
    ops: Arc<FuseOps>,
}

impl Collector for FuseOpsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let bounds: Vec<f64> = BUCKET_BOUNDS
            .iter()
            .map(|ns| *ns as f64 / 1e9)
            .chain(std::iter::once(f64::INFINITY))
            .collect();
        let snapshots: Vec<_> = FuseOp::ALL
            .iter()
            .map(|op| (op.as_str(), self.ops.snapshot(*op)))
            .collect();
        {
            let seconds = Unit::Seconds;
            let mut family = encoder.encode_descriptor(
                "riffle_fuse_op_duration",
                "Time from receiving a FUSE request to sending its reply, by operation.",
                Some(&seconds),
                MetricType::Histogram,
            )?;
            for (op, s) in &snapshots {
                let buckets: Vec<(f64, u64)> = bounds
                    .iter()
                    .copied()
                    .zip(s.buckets.iter().copied())
                    .collect();
                let labels = [("op", *op)];
                family
                    .encode_family(&labels)?
                    .encode_histogram::<NoLabelSet>(s.sum_seconds, s.count, &buckets, None)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "riffle_fuse_ops_in_progress",
            "FUSE requests received and not yet answered, by operation.",
            None,
            MetricType::Gauge,
        )?;
        for (op, s) in &snapshots {
            let labels = [("op", *op)];
            ConstGauge::new(s.in_progress).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use serde_json::json;

    use super::*;
    use crate::cache::{CacheConfig, DiskCache, SizeLimit};
    use crate::fetch::{DiskTier, FetchConfig, Fetcher};
    use crate::fs::FsStatus;
    use crate::metrics::MountMetrics;
    use crate::namespace::{MetadataTtl, Namespace};
    use crate::store::memory::MemoryStore;
    use crate::store::retry::{RetryPolicy, RetryingStore};
    use crate::store::ObjectStore;

    struct Fixed(Value);

    impl StatsSource for Fixed {
        fn stats(&self) -> Value {
            self.0.clone()
        }
    }

    fn render(stats: Value, ops: Arc<FuseOps>) -> String {
        Exporter::new(Arc::new(Fixed(stats)), ops)
            .encode()
            .expect("encode")
    }

    /// The sample lines of `text` as (name with labels, value).
    fn samples(text: &str) -> Vec<(&str, &str)> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.rsplit_once(' '))
            .collect()
    }

    fn sample<'t>(text: &'t str, name: &str) -> Option<&'t str> {
        samples(text)
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v)
    }

    #[test]
    fn known_counters_and_gauges_have_their_values() {
        let stats = json!({
            "source": "s3://secret-bucket/prefix",
            "pid": 4242,
            "uptime_seconds": 12,
            "store": {"get_requests": 7, "get_bytes": 7340032, "retries": 2, "errors": 1},
            "fuse": {"opens": 5, "passthrough_opens": 3, "passthrough": "enabled"},
            "cache": {"dir": "/nvme/riffle", "bytes": 1000, "limit": 5000, "evictions": 4, "hits": 9},
            "blocks": {"disk_hits": 6, "hits": 11, "misses": 8, "memory_cache_bytes": 2048},
            "read_ahead": {"requests": 3, "skipped_for_budget": 1},
            "inflight": {"requests": 2, "bytes": 4096},
            "namespace": {"inodes": 10, "skipped_keys": 0, "listings_from_disk": 4},
        });
        let text = render(stats, FuseOps::new());
        let expect = [
            ("riffle_uptime_seconds", "12"),
            ("riffle_store_get_requests_total", "7"),
            ("riffle_store_get_bytes_total", "7340032"),
            ("riffle_store_retries_total", "2"),
            ("riffle_store_errors_total", "1"),
            ("riffle_fuse_opens_total", "5"),
            ("riffle_fuse_passthrough_opens_total", "3"),
            ("riffle_fuse_passthrough_enabled", "1"),
            ("riffle_cache_bytes", "1000"),
            ("riffle_cache_limit_bytes", "5000"),
            ("riffle_cache_evictions_total", "4"),
            ("riffle_cache_hits_total", "9"),
            ("riffle_blocks_disk_hits_total", "6"),
            ("riffle_blocks_hits_total", "11"),
            ("riffle_blocks_misses_total", "8"),
            ("riffle_blocks_memory_cache_bytes", "2048"),
            ("riffle_read_ahead_requests_total", "3"),
            ("riffle_read_ahead_skipped_for_budget_total", "1"),
            ("riffle_inflight_requests", "2"),
            ("riffle_inflight_bytes", "4096"),
            ("riffle_namespace_inodes", "10"),
            ("riffle_namespace_skipped_keys", "0"),
            ("riffle_namespace_listings_from_disk_total", "4"),
        ];
        for (name, value) in expect {
            assert_eq!(sample(&text, name), Some(value), "{name} in\n{text}");
        }
        assert!(
            text.contains("# TYPE riffle_store_get_bytes counter"),
            "{text}"
        );
        assert!(
            text.contains("# UNIT riffle_store_get_bytes bytes"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE riffle_inflight_requests gauge"),
            "{text}"
        );
        assert!(text.contains("riffle_build_info{version=\""), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
        // No strings: not the bucket, not the cache directory, not the pid.
        assert!(!text.contains("secret-bucket"), "{text}");
        assert!(!text.contains("/nvme"), "{text}");
        assert!(!text.contains("4242"), "{text}");
    }

    #[test]
    fn missing_sections_are_left_out_and_unclassified_fields_still_exported() {
        let stats = json!({
            "store": {"get_requests": 1},
            "fuse": {"passthrough": "kernel too old"},
            "cache": null,
            "prefetch": {"wasted-bytes": 77, "active": true},
        });
        let text = render(stats, FuseOps::new());
        assert!(!text.contains("riffle_cache_"), "{text}");
        assert_eq!(sample(&text, "riffle_fuse_passthrough_enabled"), Some("0"));
        assert_eq!(sample(&text, "riffle_prefetch_wasted_bytes"), Some("77"));
        assert!(
            text.contains("# TYPE riffle_prefetch_wasted_bytes unknown"),
            "{text}"
        );
        assert_eq!(sample(&text, "riffle_prefetch_active"), Some("1"));
    }

    #[test]
    fn wrongly_shaped_values_are_skipped_not_mislabelled() {
        let stats =
            json!({"store": {"get_requests": -3, "errors": "many"}, "inflight": {"requests": 1.5}});
        let text = render(stats, FuseOps::new());
        assert_eq!(sample(&text, "riffle_store_get_requests_total"), None);
        assert_eq!(sample(&text, "riffle_inflight_requests"), Some("1.5"));
        assert!(!text.contains("many"), "{text}");
    }

    #[test]
    fn fuse_histograms_have_bucket_sum_and_count_per_op() {
        let ops = FuseOps::new();
        ops.record(FuseOp::Read, Duration::from_millis(2));
        ops.record(FuseOp::Read, Duration::from_millis(20));
        ops.record(FuseOp::Lookup, Duration::from_micros(1));
        let _open = ops.start(FuseOp::Open);
        let text = render(json!({}), ops.clone());
        assert!(
            text.contains("# TYPE riffle_fuse_op_duration_seconds histogram"),
            "{text}"
        );
        for (suffix, want) in [
            ("count{op=\"read\"}", "2"),
            ("sum{op=\"read\"}", "0.022"),
            ("bucket{le=\"0.001\",op=\"read\"}", "0"),
            ("bucket{le=\"0.0025\",op=\"read\"}", "1"),
            ("bucket{le=\"0.025\",op=\"read\"}", "2"),
            ("bucket{le=\"+Inf\",op=\"read\"}", "2"),
            ("bucket{le=\"0.00001\",op=\"lookup\"}", "1"),
            ("count{op=\"getattr\"}", "0"),
        ] {
            let name = format!("riffle_fuse_op_duration_seconds_{suffix}");
            assert_eq!(sample(&text, &name), Some(want), "{name}");
        }
        assert_eq!(
            sample(&text, "riffle_fuse_ops_in_progress{op=\"open\"}"),
            Some("1")
        );
        // One histogram per op kind, and nothing else labelled.
        assert_eq!(
            text.matches("riffle_fuse_op_duration_seconds_count{")
                .count(),
            FuseOp::ALL.len()
        );
    }

    /// Every number in the real `riffle stats` JSON (with a disk cache) is in [`STATS`], so none
    /// is exported as `unknown`. When this fails, add the new field to the table.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_field_of_the_real_stats_is_classified() {
        let dir = tempfile::tempdir().expect("tempdir");
        let memory = Arc::new(MemoryStore::new());
        memory.put("a/b.bin", vec![7u8; 10]);
        let retrying = Arc::new(RetryingStore::new(memory, RetryPolicy::default()));
        let store: Arc<dyn ObjectStore> = retrying.clone();
        let ns = Namespace::new(store.clone(), "", MetadataTtl::Indefinite);
        let cache = DiskCache::open(CacheConfig::new(dir.path(), SizeLimit::Bytes(64 << 20)))
            .expect("cache");
        let disk = Arc::new(DiskTier::new(cache, "memory", "bucket", "key:test", None));
        let fetcher = Fetcher::new(
            store,
            FetchConfig::default(),
            tokio::runtime::Handle::current(),
            Some(disk),
        );
        // With peers, so their section is classified too.
        fetcher.set_peers(crate::fetch::peer::Peers::new(
            crate::fetch::peer::PeerConfig {
                listen: None,
                members: crate::fetch::peer::Membership::Static(vec!["127.0.0.1:9".into()]),
                secret: crate::fetch::peer::Secret::from_bytes(b"0123456789abcdef"),
                timeout: std::time::Duration::from_secs(2),
                bucket: "bucket".into(),
                prefix: String::new(),
                principal: "00".repeat(16),
                block_size: 1 << 20,
                backoff: std::time::Duration::from_secs(1),
            },
        ));
        let fs = Arc::new(FsStatus::default());
        *fs.passthrough_mode.lock() = "enabled".into();
        let source = Arc::new(MountMetrics {
            source: "s3://bucket/".into(),
            started: Instant::now(),
            namespace: ns,
            fetcher,
            store: retrying,
            fs,
        });
        let mut leaves = Vec::new();
        let stats = source.stats();
        numeric_leaves("", &stats, &mut leaves);
        let unclassified: Vec<_> = leaves
            .iter()
            .map(|(p, _)| p.as_str())
            .filter(|p| !IGNORED.contains(p) && !STATS.iter().any(|s| s.path == *p))
            .collect();
        assert!(
            unclassified.is_empty(),
            "add these stats fields to STATS in src/metrics/prometheus.rs: {unclassified:?}"
        );
        let text = Exporter::new(source, FuseOps::new())
            .encode()
            .expect("encode");
        assert!(!text.contains(" unknown\n"), "{text}");
        assert!(text.contains("riffle_cache_limit_bytes 67108864"), "{text}");
        assert_eq!(sample(&text, "riffle_fuse_passthrough_enabled"), Some("1"));
        assert_eq!(sample(&text, "riffle_peer_members"), Some("1"));
        // Family names are unique (OpenMetrics requires it).
        let mut seen = HashSet::new();
        for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            assert!(seen.insert(line.split(' ').nth(2)), "duplicate {line}");
        }
    }
}
