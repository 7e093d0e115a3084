//! Benchmark results: what `benches/run.sh` records for each system
//! ([`Row`]) and each workload run ([`Meta`]), the per-mode store under
//! `benches/results/`, and the markdown report (`benches/README.md`).

pub mod machine;
pub mod metrics;
pub mod render;
pub mod store;

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
    /// copy-first: the download before the (local) epochs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy: Option<Outcome>,
    /// Peak resident memory of the system's daemon (VmHWM), KiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_kb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Row {
    pub fn ok(&self) -> bool {
        self.status == "ok"
    }

    /// Reads that returned wrong bytes, over all passes of the row.
    pub fn mismatches(&self) -> u64 {
        [&self.cold, &self.warm, &self.copy]
            .iter()
            .filter_map(|o| o.as_ref())
            .map(|o| o.mismatches)
            .sum()
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
