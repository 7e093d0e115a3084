//! The numbers a table shows: each row's headline throughput (files/s for
//! W1, MB/s otherwise), its cell text, and its ratios to local disk and to
//! the best peer in the same run.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{Column, Row};
use crate::outcome::Outcome;

/// The systems a row is compared against as "peers" (everything but
/// riffle itself, local disk and the raw S3 client reference).
pub const PEERS: [&str; 4] = ["copy-first", "s3fs", "rclone", "mountpoint"];

/// Cold (epoch 1), warm (epoch 2) or the re-read (epoch 3, W2 only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Epoch {
    Cold,
    Warm,
    Reread,
}

/// What the headline number of a table is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    FilesPerSec,
    MbPerSec,
}

impl Unit {
    pub fn of_table(table: &str) -> Self {
        if table == "w1" || table == "w5" {
            Unit::FilesPerSec
        } else {
            Unit::MbPerSec
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Unit::FilesPerSec => "files/s",
            Unit::MbPerSec => "MB/s",
        }
    }

    fn amount(self, o: &Outcome) -> f64 {
        match self {
            Unit::FilesPerSec => o.files as f64,
            Unit::MbPerSec => o.bytes as f64 / 1e6,
        }
    }
}

/// The row's outcome of an epoch.
pub(super) fn pass(row: &Row, epoch: Epoch) -> Option<&Outcome> {
    match epoch {
        Epoch::Cold => row.cold.as_ref(),
        Epoch::Warm => row.warm.as_ref(),
        Epoch::Reread => row.epoch3.as_ref(),
    }
}

/// The row's throughput in an epoch; `None` when it did not run or read
/// wrong bytes. copy-first's cold epoch includes the copy time.
pub fn throughput(row: &Row, epoch: Epoch) -> Option<f64> {
    if !row.ok() {
        return None;
    }
    let o = pass(row, epoch)?;
    if o.mismatches > 0 {
        return None;
    }
    let unit = Unit::of_table(&row.table);
    let secs = match (&row.copy, epoch) {
        (Some(c), Epoch::Cold) => c.elapsed_s + o.elapsed_s,
        _ => o.elapsed_s,
    };
    (secs > 0.0).then(|| unit.amount(o) / secs)
}

/// Text of a throughput cell.
pub fn cell(row: &Row, epoch: Epoch) -> String {
    if !row.ok() {
        return row.status.clone();
    }
    let Some(o) = pass(row, epoch) else {
        return "—".into();
    };
    if o.mismatches > 0 {
        return format!("**WRONG BYTES** ({} reads)", o.mismatches);
    }
    let unit = Unit::of_table(&row.table);
    let mut s = match throughput(row, epoch) {
        Some(v) => format!("{} {}", num(v), unit.label()),
        None => "—".into(),
    };
    let random_reads = row.table.starts_with("w3");
    match (&row.copy, epoch) {
        (Some(c), Epoch::Cold) => {
            s += &format!(" (copy {:.1} s + read {:.1} s)", c.elapsed_s, o.elapsed_s);
        }
        _ if random_reads => s += &format!(", {} reads/s", num(o.reads_per_s)),
        _ => s += &format!(" ({:.1} s)", o.elapsed_s),
    }
    if o.errors > 0 {
        s += &format!(", {} errors", o.errors);
    }
    s
}

/// A number with three significant digits at most.
pub fn num(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// `value / base` as `0.42×` (two significant digits below 1, so small
/// ratios stay readable: `0.0043×`).
pub fn ratio(value: Option<f64>, base: Option<f64>) -> String {
    match (value, base) {
        (Some(v), Some(b)) if b > 0.0 && v > 0.0 => {
            let r = v / b;
            let digits = if r >= 0.995 {
                2
            } else {
                (1 - r.log10().floor() as i32).max(2) as usize
            };
            format!("{r:.digits$}×")
        }
        _ => "—".into(),
    }
}

/// The best peer (other than `system`) in `rows` for an epoch.
pub fn best_peer<'a>(rows: &'a [Row], system: &str, epoch: Epoch) -> Option<(&'a str, f64)> {
    rows.iter()
        .filter(|r| r.column == Column::Proxy && r.system != system)
        .filter(|r| PEERS.contains(&r.system.as_str()))
        .filter_map(|r| throughput(r, epoch).map(|t| (r.system.as_str(), t)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

/// One bar series of a plot (a colour in the legend).
#[derive(Debug, Clone, Serialize)]
pub struct PlotSeries {
    pub key: String,
    pub label: String,
    /// Drawn hatched and lighter (the no-proxy columns).
    pub hatch: bool,
}

/// One bar group of a plot: a system and its value per series.
#[derive(Debug, Clone, Serialize)]
pub struct PlotPoint {
    pub system: String,
    /// The tick label.
    pub label: String,
    pub values: BTreeMap<String, f64>,
}

/// The plot data of one table.
#[derive(Debug, Clone, Serialize)]
pub struct PlotTable {
    pub mode: String,
    pub table: String,
    pub title: String,
    /// The y axis label.
    pub unit: String,
    pub series: Vec<PlotSeries>,
    pub points: Vec<PlotPoint>,
    /// Linear axis from 0 to this value (hit ratios); log scale allowed otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub y_max: Option<f64>,
    /// A dashed horizontal line (value, label), e.g. a ceiling.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reference: Option<(f64, String)>,
}

fn series(key: &str, label: &str, hatch: bool) -> PlotSeries {
    PlotSeries {
        key: key.into(),
        label: label.into(),
        hatch,
    }
}

/// The series of a cold/warm throughput plot.
pub fn throughput_series() -> Vec<PlotSeries> {
    vec![
        series("cold", "cold (proxy)", false),
        series("warm", "warm (proxy)", false),
        series("direct_cold", "cold (no proxy)", true),
        series("direct_warm", "warm (no proxy)", true),
    ]
}

/// Plot data for the systems of `rows` (proxy column, with the direct
/// column alongside when there is one), labelled with `label`.
pub fn plot_points(rows: &[Row], label: &dyn Fn(&str) -> String) -> Vec<PlotPoint> {
    let mut out = Vec::new();
    for r in rows.iter().filter(|r| r.column == Column::Proxy) {
        let direct = rows
            .iter()
            .find(|d| d.column == Column::Direct && d.system == r.system);
        let mut values = BTreeMap::new();
        let mut put = |k: &str, v: Option<f64>| {
            if let Some(v) = v {
                values.insert(k.to_string(), v);
            }
        };
        put("cold", throughput(r, Epoch::Cold));
        put("warm", throughput(r, Epoch::Warm));
        put(
            "direct_cold",
            direct.and_then(|d| throughput(d, Epoch::Cold)),
        );
        put(
            "direct_warm",
            direct.and_then(|d| throughput(d, Epoch::Warm)),
        );
        out.push(PlotPoint {
            system: r.system.clone(),
            label: label(&r.system),
            values,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(files: u64, bytes: u64, secs: f64) -> Outcome {
        Outcome {
            files,
            bytes,
            elapsed_s: secs,
            ..Outcome::default()
        }
    }

    fn row(system: &str, cold: f64, warm: f64) -> Row {
        Row {
            cold: Some(outcome(1000, 1_000_000, cold)),
            warm: Some(outcome(1000, 1_000_000, warm)),
            ..Row::new("w1", system, Column::Proxy, "ok")
        }
    }

    #[test]
    fn copy_first_cold_includes_the_copy() {
        let mut r = row("copy-first", 10.0, 10.0);
        r.copy = Some(outcome(1000, 1_000_000, 30.0));
        assert_eq!(throughput(&r, Epoch::Cold), Some(25.0));
        assert_eq!(throughput(&r, Epoch::Warm), Some(100.0));
        assert!(cell(&r, Epoch::Cold).contains("copy 30.0 s"));
    }

    #[test]
    fn best_peer_skips_self_riffle_and_wrong_bytes() {
        let mut bad = row("rclone", 1.0, 1.0);
        if let Some(c) = bad.cold.as_mut() {
            c.mismatches = 1;
        }
        let rows = vec![
            row("local", 1.0, 1.0),
            row("riffle", 2.0, 2.0),
            row("s3fs", 20.0, 10.0),
            bad,
        ];
        assert_eq!(
            best_peer(&rows, "riffle", Epoch::Cold),
            Some(("s3fs", 50.0))
        );
        assert_eq!(best_peer(&rows, "s3fs", Epoch::Cold), None);
        assert!(cell(&rows[3], Epoch::Cold).contains("WRONG BYTES"));
        assert_eq!(ratio(Some(1.0), Some(4.0)), "0.25×");
        assert_eq!(ratio(Some(43.0), Some(10_000.0)), "0.0043×");
        assert_eq!(ratio(Some(5.0), Some(100.0)), "0.050×");
        assert_eq!(ratio(Some(12.0), Some(1.0)), "12.00×");
        assert_eq!(ratio(None, Some(1.0)), "—");
    }

    #[test]
    fn not_run_rows_show_their_reason() {
        let mut r = row("s3fs", 1.0, 1.0);
        r.status = "not run: s3fs is not installed".into();
        assert_eq!(throughput(&r, Epoch::Cold), None);
        assert_eq!(cell(&r, Epoch::Warm), "not run: s3fs is not installed");
    }
}
