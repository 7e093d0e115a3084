//! Benchmark results: what `benches/run.sh` records for each system
//! ([`Row`]) and each workload run ([`Meta`]), the per-mode store under
//! `benches/results/`, and the markdown report (`benches/README.md`).

pub mod cpu;
mod cpu_goals;
pub mod detail;
pub mod goals;
pub mod machine;
pub mod metrics;
pub mod render;
mod rules;
pub mod store;
pub mod transport;
pub mod w4;
pub mod w5;

use serde::{Deserialize, Serialize};

use crate::listing::ListPass;
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
    /// Table id: `w1`, `w2`, `w3`, `w3-mmap`, `w4`, `w5`.
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
    /// W4: the walks of the listing dataset (absent for other tables).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listing: Option<Listing>,
    /// A riffle row's FUSE transport as `riffle stats` gave it right after mounting
    /// (`fuse.transport`: `io_uring: ...` or `/dev/fuse: WHY`; [`transport`]). Absent for
    /// the other systems and in results recorded before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<String>,
}

/// W4 (listing): one system's timed passes over the dataset's names, each
/// with what it cost at the store. For a file system: the cold walk and the
/// stat of every file on a fresh mount, then the same after unmounting and
/// mounting again (riffle: on the same cache directory). For the S3
/// client: its parallel listing, in `walk`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Listing {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub walk: Option<Step>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stat: Option<Step>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remount_walk: Option<Step>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remount_stat: Option<Step>,
    /// The daemon's resident memory (VmRSS, KiB) right after mounting,
    /// before the walk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_base_kb: Option<u64>,
    /// Its VmRSS (KiB) after the cold walk and the stat (the row's `rss_kb`
    /// is VmHWM then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_after_kb: Option<u64>,
}

/// One W4 pass and what it cost at the store (LISTs and HEADs at the
/// proxy) and in riffle's counters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub pass: ListPass,
    #[serde(default)]
    pub detail: PassDetail,
}

impl Listing {
    /// Its passes in order, with their names.
    pub fn steps(&self) -> impl Iterator<Item = (&'static str, &Step)> {
        [
            ("cold walk", &self.walk),
            ("stat", &self.stat),
            ("remount walk", &self.remount_walk),
            ("remount stat", &self.remount_stat),
        ]
        .into_iter()
        .filter_map(|(name, s)| s.as_ref().map(|s| (name, s)))
    }

    /// The daemon's RSS growth per object of the dataset over the walk and
    /// the stat (bytes): VmRSS after them minus VmRSS right after mounting,
    /// divided by the manifest's object count. `None` unless both were read
    /// and the walk counted every object.
    pub fn rss_per_object(&self) -> Option<f64> {
        let pass = &self.walk.as_ref()?.pass;
        let (base, after) = (self.rss_base_kb?, self.rss_after_kb?);
        (pass.clean() && pass.expected_objects > 0)
            .then(|| after.saturating_sub(base) as f64 * 1024.0 / pass.expected_objects as f64)
    }
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
    /// The part of `store_bytes` that was object data (GET bodies), the rest
    /// being listings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_object_bytes: Option<u64>,
    /// LIST requests counted at the proxy (W4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_lists: Option<u64>,
    /// HEAD requests counted at the proxy (W4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_heads: Option<u64>,
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
    /// Directory listings taken from the store (`namespace.listings`), run
    /// in the background ahead of a walk (`listings_background`), and taken
    /// from the cache directory instead (`listings_from_disk`).
    #[serde(default)]
    pub listings: u64,
    #[serde(default)]
    pub listings_background: u64,
    #[serde(default)]
    pub listings_from_disk: u64,
    /// FUSE requests that came over io_uring rings (`fuse.ring_requests`; the rest came
    /// over `/dev/fuse`).
    #[serde(default)]
    pub ring_requests: u64,
}

impl Row {
    /// A row of `system` in `table` with its status and nothing measured yet; callers set
    /// what they have with struct update syntax (`Row { warm, ..Row::new(...) }`).
    pub fn new(table: &str, system: &str, column: Column, status: &str) -> Row {
        Row {
            table: table.into(),
            system: system.into(),
            column,
            status: status.into(),
            cold: None,
            warm: None,
            epoch3: None,
            copy: None,
            rss_kb: None,
            note: None,
            cold_detail: None,
            warm_detail: None,
            passes: Vec::new(),
            round: None,
            listing: None,
            transport: None,
        }
    }

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
        // W4: a pass that counted wrong.
        let listing = self.listing.as_ref().map_or(0, |l| {
            l.steps().filter(|(_, s)| s.pass.wrong).count() as u64
        });
        two.max(all) + listing
    }
}

/// Facts about one workload's run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// `w1` ... `w5`.
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

/// The notes under a table: a line `- LABEL: NOTE` for each row that has a note, after a
/// blank line; nothing when no row has one.
pub fn push_row_notes<'a>(
    out: &mut String,
    rows: impl IntoIterator<Item = &'a Row>,
    label: impl Fn(&str) -> String,
) {
    let notes: Vec<String> = rows
        .into_iter()
        .filter_map(|r| {
            r.note
                .as_ref()
                .map(|n| format!("- {}: {n}", label(&r.system)))
        })
        .collect();
    if !notes.is_empty() {
        out.push('\n');
        out.push_str(&notes.join("\n"));
        out.push('\n');
    }
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
