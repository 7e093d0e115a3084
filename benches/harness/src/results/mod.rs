//! Benchmark results: what `benches/run.sh` records for each system
//! ([`Row`]) and each workload run ([`Meta`]), the per-mode store under
//! `benches/results/`, and the markdown report (`benches/README.md`).

pub mod detail;
pub mod goals;
pub mod machine;
pub mod metrics;
pub mod render;
pub mod store;
pub mod w5;

use serde::{Deserialize, Serialize};

use crate::outcome::Outcome;

/// With or without the latency proxy in front of RGW.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Column {
    /// Through riffle-proxy (30 ms first byte, 100 MB/s per connection).
    Proxy,
    /// RGW straight on loopback.
    Direct,
}

/// One system's result in one table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// Table id: `w1`, `w2`, `w3`, `w3-mmap`.
    pub table: String,
    /// `local`, `copy-first`, `s3-client`, `riffle`, `s3fs`, `rclone`, ...
    pub system: String,
    pub column: Column,
    /// `ok`, `not run: REASON` or `failed: REASON`.
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold: Option<Outcome>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<Outcome>,
    /// Epoch 3, a re-read (W2): every system reads data it has read before,
    /// where riffle's epoch 2 is the first read of the cache files its
    /// epoch 1 wrote. Absent in results recorded before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch3: Option<Outcome>,
    /// copy-first: the download before the (local) epochs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy: Option<Outcome>,
    /// Peak resident memory of the system's daemon (VmHWM), KiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_kb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// What the cold epoch cost at the store and what riffle counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_detail: Option<PassDetail>,
    /// The same for the warm epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_detail: Option<PassDetail>,
    /// Every epoch in order, for workloads of more than two epochs (W5).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub passes: Vec<Pass>,
    /// An extra round (2, 3, ...) of a goal comparison: the same system run
    /// again later in the same workload run, alternated with its baseline
    /// ([`store::WorkloadResult::rounds`], [`goals`]). `None` for the
    /// table's own row, which is round 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round: Option<u32>,
}

/// One epoch of a many-epoch row (W5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pass {
    pub outcome: Outcome,
    #[serde(default)]
    pub detail: PassDetail,
}

impl Pass {
    /// The share of the files read that cost no GET at the store:
    /// `1 - GETs / files` (GETs counted at the proxy; W1-style files are
    /// one block, so one GET each). `None` without a proxy count.
    pub fn hit_ratio(&self) -> Option<f64> {
        hit_ratio(&self.outcome, &self.detail)
    }
}

/// `1 - GETs / files`, clamped to [0, 1]; `None` without a proxy count.
pub fn hit_ratio(o: &Outcome, d: &PassDetail) -> Option<f64> {
    let gets = d.store_gets?;
    (o.files > 0).then(|| (1.0 - gets as f64 / o.files as f64).clamp(0.0, 1.0))
}

/// What an epoch cost beside the reader's own numbers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PassDetail {
    /// GET requests (whole and ranged) counted at the proxy during the
    /// epoch: what the store really served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_gets: Option<u64>,
    /// Bytes the proxy sent during the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_bytes: Option<u64>,
    /// riffle's counters over the epoch (`riffle stats --json` after minus before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub riffle: Option<RiffleCounters>,
}

/// The `riffle stats` counters the report uses, over one epoch (the
/// `cache_*` gauges are as they stood at its end).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RiffleCounters {
    pub get_requests: u64,
    pub get_bytes: u64,
    pub opens: u64,
    /// Opens of files already complete in a cache (disk or memory).
    pub opens_already_cached: u64,
    pub passthrough_opens: u64,
    pub plan_opens: u64,
    pub plan_opens_already_cached: u64,
    pub plan_fetched_files: u64,
    pub plan_unused_bytes: u64,
    pub dir_order_fetched_files: u64,
    /// Block hits and misses of the disk cache (reads that reach the daemon).
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub evictions: u64,
    /// `enabled`, `disabled`, ... (`fuse.passthrough`).
    #[serde(default)]
    pub passthrough: String,
    pub cache_objects: u64,
    pub cache_bytes: u64,
    /// Bytes of cache index memory per cached object.
    pub index_memory_per_object: u64,
}

impl Row {
    pub fn ok(&self) -> bool {
        self.status == "ok"
    }

    /// Reads that returned wrong bytes, over all passes of the row.
    pub fn mismatches(&self) -> u64 {
        let two: u64 = [&self.cold, &self.warm, &self.epoch3, &self.copy]
            .iter()
            .filter_map(|o| o.as_ref())
            .map(|o| o.mismatches)
            .sum();
        // Many-epoch rows repeat their first two epochs as cold and warm.
        let all: u64 = self.passes.iter().map(|p| p.outcome.mismatches).sum();
        two.max(all)
    }
}

/// Facts about one workload's run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// `w1`, `w2`, `w3`.
    pub workload: String,
    /// `quick` or `full`.
    pub mode: String,
    /// UTC, RFC 3339.
    pub date: String,
    pub commit: String,
    pub machine: machine::Machine,
    pub scale: f64,
    pub objects: usize,
    pub bytes: u64,
    /// The remote as the proxy simulates it.
    pub remote: String,
    /// Wall time of the whole workload (all systems), seconds.
    pub elapsed_s: f64,
    #[serde(default)]
    pub notes: Vec<String>,
}

/// One line of a run file (JSON lines).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Record {
    Meta(Box<Meta>),
    Row(Box<Row>),
}

/// Whether a row is read by the Python reader (`benches/python_reader.py`,
/// a DataLoader-like multi-process reader) instead of `riffle-bench read-fs`:
/// the `SYSTEM-py` rows of W1 (`local-py`, `riffle-py`, `riffle-plan-py`).
pub fn python_reader(system: &str) -> bool {
    system.ends_with("-py")
}

/// The local-disk row a row's "÷ local" divides by: the one read by the
/// same reader.
pub fn local_of(system: &str) -> &'static str {
    if python_reader(system) {
        "local-py"
    } else {
        "local"
    }
}

/// The tables a workload produces, in order.
pub fn tables_of(workload: &str) -> Vec<String> {
    match workload {
        "w3" => vec!["w3".into(), "w3-mmap".into()],
        w => vec![w.to_string()],
    }
}

/// The workload a table belongs to.
pub fn workload_of(table: &str) -> &str {
    match table {
        "w3-mmap" => "w3",
        t => t,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_without_epoch3_still_load_and_epoch3_round_trips() {
        let old = r#"{"table":"w2","system":"riffle","column":"proxy","status":"ok"}"#;
        let row: Row = serde_json::from_str(old).expect("old row");
        assert_eq!(row.epoch3, None);
        assert!(!serde_json::to_string(&row)
            .expect("json")
            .contains("epoch3"));

        let with = Row {
            epoch3: Some(Outcome {
                bytes: 7,
                mismatches: 2,
                ..Outcome::default()
            }),
            ..row
        };
        let json = serde_json::to_string(&with).expect("json");
        let back: Row = serde_json::from_str(&json).expect("new row");
        assert_eq!(back, with);
        assert_eq!(back.mismatches(), 2, "epoch 3's wrong bytes count");
    }
}
