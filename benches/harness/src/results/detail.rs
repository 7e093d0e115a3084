//! Reading what an epoch cost from the files `benches/run.sh` leaves next
//! to each reader result `X.json`:
//!
//! - `X.proxy.json`: `riffle-bench proxy-stats` after the epoch (the proxy's
//!   counters were reset just before it), so its GETs are the epoch's;
//! - `X.riffle-before.json` / `X.riffle-after.json`: `riffle stats --json`
//!   just before and after the epoch; the counters are their difference.
//!
//! and, once per riffle mount, `riffle stats --json` taken right after mounting, whose
//! `fuse.transport` is the row's transport ([`mount_transport`]).

use std::path::{Path, PathBuf};

use anyhow::Context;
use rifflefs::stats::{defs, Stat};
use serde_json::Value;

use super::{PassDetail, RiffleCounters};

/// `dir/name.json` → `dir/name.<suffix>.json`.
pub fn sidecar(result: &Path, suffix: &str) -> PathBuf {
    let stem = result
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    result.with_file_name(format!("{stem}.{suffix}.json"))
}

fn read_json(path: &Path) -> anyhow::Result<Option<Value>> {
    match std::fs::read_to_string(path) {
        Ok(t) if t.trim().is_empty() => Ok(None),
        Ok(t) => Ok(Some(
            serde_json::from_str(t.trim()).with_context(|| format!("parse {}", path.display()))?,
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("read {}", path.display())),
    }
}

/// The number at `path` of the proxy's JSON (0 when missing).
fn u(v: &Value, path: &[&str]) -> u64 {
    path.iter()
        .try_fold(v, |v, k| v.get(k))
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

/// riffle's counters between two `riffle stats --json` snapshots, read by
/// their declarations in `rifflefs::stats::defs`.
pub fn riffle_delta(before: Option<&Value>, after: &Value) -> RiffleCounters {
    let d = |stat: &Stat| {
        stat.count(after)
            .saturating_sub(before.map_or(0, |b| stat.count(b)))
    };
    RiffleCounters {
        get_requests: d(&defs::STORE_GET_REQUESTS),
        get_bytes: d(&defs::STORE_GET_BYTES),
        opens: d(&defs::FUSE_OPENS),
        opens_already_cached: d(&defs::PREFETCH_OPENS_ALREADY_CACHED),
        passthrough_opens: d(&defs::FUSE_PASSTHROUGH_OPENS),
        plan_opens: d(&defs::PREFETCH_PLAN_OPENS),
        plan_opens_already_cached: d(&defs::PREFETCH_PLAN_OPENS_ALREADY_CACHED),
        plan_fetched_files: d(&defs::PREFETCH_PLAN_FETCHED_FILES),
        plan_unused_bytes: d(&defs::PREFETCH_PLAN_UNUSED_BYTES),
        dir_order_fetched_files: d(&defs::PREFETCH_DIR_ORDER_FETCHED_FILES),
        cache_hits: d(&defs::CACHE_HITS),
        cache_misses: d(&defs::CACHE_MISSES),
        evictions: d(&defs::CACHE_EVICTIONS),
        passthrough: defs::FUSE_PASSTHROUGH
            .get(after)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        cache_objects: defs::CACHE_OBJECTS.count(after),
        cache_bytes: defs::CACHE_BYTES.count(after),
        index_memory_per_object: defs::CACHE_INDEX_MEMORY_PER_OBJECT.count(after),
        listings: d(&defs::NAMESPACE_LISTINGS),
        listings_background: d(&defs::NAMESPACE_LISTINGS_BACKGROUND),
        listings_from_disk: d(&defs::NAMESPACE_LISTINGS_FROM_DISK),
        ring_requests: d(&defs::FUSE_RING_REQUESTS),
    }
}

/// The `fuse.transport` text of a `riffle stats --json` file (`None` when the file is
/// missing or empty, the daemon did not answer, or an older daemon has no such stat).
pub fn mount_transport(stats: &Path) -> anyhow::Result<Option<String>> {
    Ok(read_json(stats)?.and_then(|v| {
        defs::FUSE_TRANSPORT
            .get(&v)
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .map(str::to_string)
    }))
}

/// The detail of the epoch whose reader result is `result`, from its
/// sidecar files; `None` when there are none.
pub fn pass_detail(result: &Path) -> anyhow::Result<Option<PassDetail>> {
    let proxy = read_json(&sidecar(result, "proxy"))?;
    let before = read_json(&sidecar(result, "riffle-before"))?;
    let after = read_json(&sidecar(result, "riffle-after"))?;
    if proxy.is_none() && after.is_none() {
        return Ok(None);
    }
    let store_gets = proxy
        .as_ref()
        .map(|p| u(p, &["requests", "get_object"]) + u(p, &["requests", "get_range"]));
    let store_bytes = proxy.as_ref().map(|p| u(p, &["bytes_down"]));
    // Older proxies did not count object bytes apart.
    let store_object_bytes = proxy
        .as_ref()
        .filter(|p| p.get("object_bytes_down").is_some())
        .map(|p| u(p, &["object_bytes_down"]));
    Ok(Some(PassDetail {
        store_gets,
        store_bytes,
        store_object_bytes,
        store_lists: proxy.as_ref().map(|p| u(p, &["requests", "list"])),
        store_heads: proxy.as_ref().map(|p| u(p, &["requests", "head"])),
        riffle: after.as_ref().map(|a| riffle_delta(before.as_ref(), a)),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sidecars_and_deltas() {
        let dir = tempfile::tempdir().expect("tempdir");
        let result = dir.path().join("w1-riffle-proxy-e2.json");
        assert_eq!(
            sidecar(&result, "proxy"),
            dir.path().join("w1-riffle-proxy-e2.proxy.json")
        );
        assert!(pass_detail(&result).expect("none").is_none());
        std::fs::write(
            sidecar(&result, "proxy"),
            r#"{"requests":{"total":12,"get_object":2,"get_range":5,"head":2,"list":3},"bytes_down":700}"#,
        )
        .expect("write");
        std::fs::write(
            sidecar(&result, "riffle-before"),
            r#"{"store":{"get_requests":10},"fuse":{"opens":100,"passthrough":"enabled"},"namespace":{"listings":4,"listings_from_disk":1}}"#,
        )
        .expect("write");
        std::fs::write(
            sidecar(&result, "riffle-after"),
            r#"{"store":{"get_requests":17},"fuse":{"opens":150,"passthrough":"enabled","passthrough_opens":40,"ring_requests":900},"cache":{"objects":90,"index_memory_per_object":916},"namespace":{"listings":4,"listings_background":2,"listings_from_disk":12}}"#,
        )
        .expect("write");
        let d = pass_detail(&result).expect("read").expect("some");
        assert_eq!(d.store_gets, Some(7));
        assert_eq!(d.store_bytes, Some(700));
        assert_eq!((d.store_lists, d.store_heads), (Some(3), Some(2)));
        let r = d.riffle.expect("riffle");
        assert_eq!(r.get_requests, 7);
        assert_eq!(r.opens, 50);
        assert_eq!(r.passthrough_opens, 40);
        assert_eq!(r.passthrough, "enabled");
        assert_eq!(r.ring_requests, 900, "none before: all of it in the epoch");
        assert_eq!(r.cache_objects, 90);
        assert_eq!(r.index_memory_per_object, 916);
        assert_eq!(
            (r.listings, r.listings_background, r.listings_from_disk),
            (0, 2, 11)
        );
    }

    #[test]
    fn the_transport_comes_from_the_stats_after_mounting() {
        let dir = tempfile::tempdir().expect("tempdir");
        let stats = dir.path().join("w1-riffle-proxy.mount-stats.json");
        assert_eq!(mount_transport(&stats).expect("missing"), None);
        std::fs::write(&stats, "").expect("write");
        assert_eq!(mount_transport(&stats).expect("empty"), None, "no answer");
        std::fs::write(
            &stats,
            r#"{"fuse": {"opens": 0, "transport": "io_uring: 2 queues of 8 entries (1024 KiB payloads)"}}"#,
        )
        .expect("write");
        assert_eq!(
            mount_transport(&stats).expect("read").as_deref(),
            Some("io_uring: 2 queues of 8 entries (1024 KiB payloads)")
        );
        std::fs::write(&stats, r#"{"fuse": {"opens": 0}}"#).expect("write");
        assert_eq!(mount_transport(&stats).expect("older"), None);
    }
}
