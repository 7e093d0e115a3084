//! W5 (larger than cache): one row per eviction policy, three shuffled
//! epochs each, with the hit ratio of every epoch counted at the store side
//! (`1 - GETs / files`, see [`super::Pass::hit_ratio`]) and files/s.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::metrics::{num, ratio, PlotPoint, PlotSeries, PlotTable};
use super::{Column, Pass, Row};

/// Policies in display order.
const POLICIES: [&str; 4] = ["riffle-lru", "riffle-epoch", "riffle", "riffle-plan"];

pub fn label(system: &str) -> String {
    match system {
        "riffle-lru" => "`--eviction lru`".into(),
        "riffle-epoch" => "`--eviction epoch`".into(),
        "riffle" => "no plan, defaults (`plan` eviction, epoch prefetch)".into(),
        "riffle-plan" => "`--eviction plan` + an epoch plan each epoch".into(),
        s => s.into(),
    }
}

fn short(system: &str) -> String {
    match system {
        "riffle-lru" => "lru".into(),
        "riffle-epoch" => "epoch".into(),
        "riffle" => "no plan (defaults)".into(),
        "riffle-plan" => "plan (+ epoch plans)".into(),
        s => s.into(),
    }
}

fn rows_of(rows: &[Row]) -> Vec<&Row> {
    let mut v: Vec<&Row> = rows
        .iter()
        .filter(|r| r.table == "w5" && r.column == Column::Proxy)
        .collect();
    v.sort_by_key(|r| {
        POLICIES
            .iter()
            .position(|p| *p == r.system)
            .unwrap_or(POLICIES.len())
    });
    v
}

/// Files/s and hit ratio over the epochs after the first (what a cache
/// policy decides), `None` without results.
pub(super) fn later(r: &Row) -> (Option<f64>, Option<f64>) {
    let ps: Vec<&Pass> = r
        .passes
        .iter()
        .skip(1)
        .filter(|p| p.outcome.mismatches == 0)
        .collect();
    if ps.is_empty() || !r.ok() {
        return (None, None);
    }
    let files: u64 = ps.iter().map(|p| p.outcome.files).sum();
    let secs: f64 = ps.iter().map(|p| p.outcome.elapsed_s).sum();
    let gets: Option<u64> = ps.iter().map(|p| p.detail.store_gets).sum();
    let rate = (secs > 0.0).then(|| files as f64 / secs);
    let hit = gets
        .filter(|_| files > 0)
        .map(|g| (1.0 - g as f64 / files as f64).clamp(0.0, 1.0));
    (rate, hit)
}

fn epoch_cell(p: &Pass) -> String {
    let o = &p.outcome;
    if o.mismatches > 0 {
        return format!("**WRONG BYTES** ({} reads)", o.mismatches);
    }
    let rate = if o.elapsed_s > 0.0 {
        o.files as f64 / o.elapsed_s
    } else {
        o.files_per_s
    };
    let mut s = format!("{} files/s ({:.1} s)", num(rate), o.elapsed_s);
    if o.errors > 0 {
        s += &format!(", {} errors", o.errors);
    }
    s
}

/// The W5 table.
pub fn table(rows: &[Row]) -> String {
    let rows = rows_of(rows);
    let lru = rows
        .iter()
        .find(|r| r.system == "riffle-lru")
        .map(|r| later(r));
    let mut out = String::new();
    let head = [
        "eviction policy",
        "epoch 1 (cold)",
        "epoch 2",
        "epoch 3",
        "hit ratio at the store, epochs 1 / 2 / 3",
        "hit ratio, epochs 2–3 ÷ LRU",
        "files/s, epochs 2–3 ÷ LRU",
        "riffle: opens already cached, epochs 2 / 3",
        "evictions (all epochs)",
        "daemon peak RSS",
    ];
    let _ = writeln!(out, "| {} |", head.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(head.len()));
    for r in &rows {
        let mut cells = vec![label(&r.system)];
        if !r.ok() && r.passes.is_empty() {
            cells.push(r.status.clone());
            cells.extend((0..head.len() - 2).map(|_| "—".to_string()));
            let _ = writeln!(out, "| {} |", cells.join(" | "));
            continue;
        }
        for i in 0..3 {
            cells.push(r.passes.get(i).map_or("—".into(), epoch_cell));
        }
        let hits: Vec<String> = (0..3)
            .map(|i| {
                r.passes
                    .get(i)
                    .and_then(Pass::hit_ratio)
                    .map_or("—".into(), |h| format!("{h:.2}"))
            })
            .collect();
        cells.push(hits.join(" / "));
        let (rate, hit) = later(r);
        let (lru_rate, lru_hit) = lru.unwrap_or((None, None));
        cells.push(match (hit, lru_hit) {
            (Some(h), Some(l)) => format!("{h:.2} vs {l:.2}: {}", ratio(Some(h), Some(l))),
            _ => "—".into(),
        });
        cells.push(ratio(rate, lru_rate));
        let cached: Vec<String> = (1..3)
            .map(|i| {
                r.passes
                    .get(i)
                    .and_then(|p| p.detail.riffle.as_ref())
                    .map_or("—".into(), |c| {
                        format!("{} / {}", c.opens_already_cached, c.opens)
                    })
            })
            .collect();
        cells.push(cached.join(", "));
        let ev: Option<u64> = r
            .passes
            .iter()
            .map(|p| p.detail.riffle.as_ref().map(|c| c.evictions))
            .sum();
        cells.push(ev.map_or("—".into(), |e| e.to_string()));
        cells.push(
            r.rss_kb
                .map_or("—".into(), |kb| format!("{:.0} MiB", kb as f64 / 1024.0)),
        );
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    super::push_row_notes(&mut out, rows.iter().copied(), label);
    out
}

/// The W5 plot: hit ratio per epoch, one bar group per policy.
pub fn plot(mode: &str, rows: &[Row], title: &str) -> PlotTable {
    let series = (1..=3)
        .map(|e| PlotSeries {
            key: format!("e{e}"),
            label: format!("epoch {e}"),
            hatch: false,
        })
        .collect();
    let points = rows_of(rows)
        .into_iter()
        .map(|r| {
            let mut values = BTreeMap::new();
            for (i, p) in r.passes.iter().enumerate() {
                if let Some(h) = p.hit_ratio() {
                    values.insert(format!("e{}", i + 1), h);
                }
            }
            PlotPoint {
                system: r.system.clone(),
                label: short(&r.system),
                values,
            }
        })
        .collect();
    PlotTable {
        mode: mode.to_string(),
        table: "w5".into(),
        title: format!("{title} ({mode})"),
        unit: "hit ratio at the store (1 − GETs / files)".into(),
        series,
        points,
        y_max: Some(1.0),
        reference: Some((0.5, "ceiling: half the data cached, fresh shuffle".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::Outcome;
    use crate::results::PassDetail;

    fn pass(files: u64, secs: f64, gets: u64) -> Pass {
        Pass {
            outcome: Outcome {
                files,
                elapsed_s: secs,
                ..Outcome::default()
            },
            detail: PassDetail {
                store_gets: Some(gets),
                ..PassDetail::default()
            },
        }
    }

    fn row(system: &str, passes: Vec<Pass>) -> Row {
        Row {
            rss_kb: Some(10_240),
            passes,
            ..Row::new("w5", system, Column::Proxy, "ok")
        }
    }

    #[test]
    fn hit_ratios_per_epoch_and_against_lru() {
        let rows = vec![
            row(
                "riffle-epoch",
                vec![
                    pass(1000, 10.0, 1000),
                    pass(1000, 5.0, 500),
                    pass(1000, 5.0, 500),
                ],
            ),
            row(
                "riffle-lru",
                vec![
                    pass(1000, 10.0, 1000),
                    pass(1000, 8.0, 850),
                    pass(1000, 8.0, 850),
                ],
            ),
        ];
        let t = table(&rows);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[2].starts_with("| `--eviction lru` |"), "{t}");
        assert!(lines[2].contains("0.00 / 0.15 / 0.15"), "{t}");
        assert!(lines[3].contains("0.00 / 0.50 / 0.50"), "{t}");
        assert!(lines[3].contains("0.50 vs 0.15: 3.33×"), "{t}");
        assert!(lines[3].contains("| 1.60× |"), "{t}");
        let p = plot("full", &rows, "W5");
        assert_eq!(p.points[0].system, "riffle-lru");
        assert_eq!(p.points[1].values.get("e2"), Some(&0.5));
    }
}
