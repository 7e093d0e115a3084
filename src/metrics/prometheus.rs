//! The mount's counters as Prometheus metrics (OpenMetrics text), built with `prometheus-client`.
//!
//! Nothing is counted twice: on each scrape a collector asks the same [`StatsSource`] that
//! answers `riffle stats` for its JSON tree and translates it, so the two views cannot drift.
//! The translation iterates the declarations of [`crate::stats::defs`]: each exported
//! [`Stat`] (counter, gauge, or string compared with a value) whose path is in the tree becomes
//! one metric family with the declaration's type, unit and help text, named by
//! [`family_name`] (`store.get_bytes` → `riffle_store_get_bytes_total`). A numeric (or
//! boolean) field of the JSON that is not declared (only a [`StatsSource`] other than the
//! mount's can have one) is still exported, as an OpenMetrics `unknown` metric named after
//! its path (`riffle_<section>_<field>`). Strings (the bucket, the cache directory) and
//! identities (the pid) are not exported, except the passthrough state, as a 0/1 gauge. There
//! are no per-object or per-path labels: the label sets are fixed (the FUSE operation kind),
//! so the number of series is bounded.
//!
//! A second collector encodes the FUSE latency histograms of [`FuseOps`]:
//! `riffle_fuse_op_duration_seconds{op="read"}` and `riffle_fuse_ops_in_progress{op="read"}`.
//!
//! The mount's `--metrics-label`s ([`MetricLabel`]) are constant labels of the registry: the
//! encoder writes them first in every sample's label set, before a family's own labels (`le`
//! and `op` of a histogram bucket come after them), so a mount under the CSI mounter exposes
//! its volume's labels itself.

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use serde_json::Value;

use super::labels::{MetricLabel, OP_LABEL, VERSION_LABEL};
use super::StatsSource;
use crate::fs::latency::{FuseOp, FuseOps, BUCKET_BOUNDS};
use crate::stats::{defs, Kind, Stat};

/// The content type of [`Exporter::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `prometheus_client`'s spelling of a declaration's unit.
fn unit(stat: &Stat) -> Option<Unit> {
    stat.unit.map(|u| match u {
        crate::stats::Unit::Bytes => Unit::Bytes,
        crate::stats::Unit::Seconds => Unit::Seconds,
    })
}

/// The family name of `stat`, without the unit and `_total` suffixes the encoder adds: the
/// declared [`Stat::name`], else `riffle_` and the path with `.` made `_`, less a trailing
/// `_<unit>` (the unit suffix puts it back).
pub fn family_name(stat: &Stat) -> String {
    if let Some(name) = stat.name {
        return name.to_string();
    }
    let name = fallback_name(stat.path);
    let suffix = stat.unit.map(|u| format!("_{}", u.as_str()));
    match suffix
        .as_deref()
        .and_then(|suffix| name.strip_suffix(suffix))
    {
        Some(stem) => stem.to_string(),
        None => name,
    }
}

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
    /// An exporter of `source`'s counters and `ops`' histograms, every sample labelled with
    /// `labels` first (constant labels of the registry; the encoder escapes their values).
    pub fn new(source: Arc<dyn StatsSource>, ops: Arc<FuseOps>, labels: &[MetricLabel]) -> Self {
        let constant = labels
            .iter()
            .map(|l| (Cow::Owned(l.name.clone()), Cow::Owned(l.value.clone())));
        let mut registry = Registry::with_labels(constant);
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
        m.encode_info(&[(VERSION_LABEL, env!("CARGO_PKG_VERSION"))])
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
        for s in defs::ALL.iter().filter(|s| s.exported()) {
            let Some(value) = s.get(&stats) else {
                continue;
            };
            let name = family_name(s);
            if encode_stat(&mut encoder, s, &name, value)? {
                names.insert(exposed_name(name, s));
            }
        }
        let mut leaves = Vec::new();
        numeric_leaves("", &stats, &mut leaves);
        for (path, value) in leaves {
            if defs::find(&path).is_some() {
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
fn exposed_name(mut name: String, s: &Stat) -> String {
    if let Some(u) = s.unit {
        name.push('_');
        name.push_str(u.as_str());
    }
    if s.kind == Kind::Counter {
        name.push_str("_total");
    }
    name
}

/// Encodes one declaration as family `name`; false if the value has the wrong shape (and
/// nothing was written).
fn encode_stat(
    encoder: &mut DescriptorEncoder,
    s: &Stat,
    name: &str,
    value: &Value,
) -> Result<bool, std::fmt::Error> {
    let unit = unit(s);
    match s.kind {
        Kind::Text | Kind::Id => return Ok(false),
        Kind::Equals(expected) => {
            let Some(text) = value.as_str() else {
                return Ok(false);
            };
            let m = encoder.encode_descriptor(name, s.help, None, MetricType::Gauge)?;
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
            let m = encoder.encode_descriptor(name, s.help, unit.as_ref(), MetricType::Counter)?;
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
            let m = encoder.encode_descriptor(name, s.help, unit.as_ref(), MetricType::Gauge)?;
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
                let labels = [(OP_LABEL, *op)];
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
            let labels = [(OP_LABEL, *op)];
            ConstGauge::new(s.in_progress).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::metrics::fixture::mount_metrics;

    struct Fixed(Value);

    impl StatsSource for Fixed {
        fn stats(&self) -> Value {
            self.0.clone()
        }
    }

    fn render(stats: Value, ops: Arc<FuseOps>) -> String {
        Exporter::new(Arc::new(Fixed(stats)), ops, &[])
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

    /// `--metrics-label`s go first in every sample's label set, before the family's own
    /// labels, with their values escaped (backslash, double quote, newline).
    #[test]
    fn metrics_labels_go_first_in_every_sample_and_are_escaped() {
        let ops = FuseOps::new();
        ops.record(FuseOp::Read, Duration::from_millis(2));
        let labels: Vec<MetricLabel> = ["volume=v1", "pod=ns/we\"ird\\\n", "key=k"]
            .iter()
            .map(|l| l.parse().expect("label"))
            .collect();
        let stats = json!({"store": {"get_requests": 7}});
        let text = Exporter::new(Arc::new(Fixed(stats)), ops, &labels)
            .encode()
            .expect("encode");
        let ours = "volume=\"v1\",pod=\"ns/we\\\"ird\\\\\\n\",key=\"k\"";
        assert_eq!(
            sample(&text, &format!("riffle_store_get_requests_total{{{ours}}}")),
            Some("7"),
            "{text}"
        );
        assert_eq!(
            sample(
                &text,
                &format!(
                    "riffle_fuse_op_duration_seconds_bucket{{{ours},le=\"+Inf\",op=\"read\"}}"
                )
            ),
            Some("1"),
            "{text}"
        );
        assert!(
            text.contains(&format!("riffle_build_info{{{ours},version=\"")),
            "{text}"
        );
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(
                line.contains(&format!("{{{ours}")),
                "{line} without the labels"
            );
        }
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

    /// Every number in the real `riffle stats` JSON (with a disk cache) is declared in
    /// [`defs`], so none is exported as `unknown`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_field_of_the_real_stats_is_classified() {
        let dir = tempfile::tempdir().expect("tempdir");
        let source = mount_metrics(dir.path());
        let mut leaves = Vec::new();
        let stats = source.stats();
        numeric_leaves("", &stats, &mut leaves);
        let unclassified: Vec<_> = leaves
            .iter()
            .map(|(p, _)| p.as_str())
            .filter(|p| defs::find(p).is_none())
            .collect();
        assert!(
            unclassified.is_empty(),
            "declare these stats fields in src/stats/defs.rs: {unclassified:?}"
        );
        let text = Exporter::new(source, FuseOps::new(), &[])
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

    /// No two exported declarations share a family (OpenMetrics requires unique names), and
    /// a derived name drops a unit suffix the encoder adds back.
    #[test]
    fn family_names_are_unique_and_derived_from_paths() {
        let mut seen = HashSet::new();
        for s in defs::ALL.iter().filter(|s| s.exported()) {
            let name = exposed_name(family_name(s), s);
            assert!(
                seen.insert(name.clone()),
                "two stats are exported as {name}"
            );
        }
        assert_eq!(family_name(&defs::STORE_GET_BYTES), "riffle_store_get");
        assert_eq!(family_name(&defs::UPTIME_SECONDS), "riffle_uptime");
        assert_eq!(family_name(&defs::CACHE_LIMIT), "riffle_cache_limit");
        assert_eq!(
            family_name(&defs::CACHE_WRITE_BYTES),
            "riffle_cache_written"
        );
        assert_eq!(
            exposed_name(
                family_name(&defs::PREFETCH_OPENS_ALREADY_CACHED),
                &defs::PREFETCH_OPENS_ALREADY_CACHED
            ),
            "riffle_prefetch_opens_already_cached_total"
        );
    }
}
