//! W4 (listing): one row per system with its timed passes over the
//! dataset's names ([`super::Listing`]): the cold walk (`find -type f`),
//! the stat of every file, the daemon's memory after them, and the same walk
//! and stat after a remount; what each pass cost at the store (LISTs and
//! HEADs at the proxy); and the goals of the listing work.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::goals::{div, per_round, rule, Goal};
use super::metrics::{num, ratio, PlotPoint, PlotSeries, PlotTable};
use super::{Column, Listing, Row, Step};

/// Systems in display order.
const ORDER: [&str; 6] = [
    "s3-client",
    "riffle",
    "riffle-seq",
    "s3fs",
    "rclone",
    "mountpoint",
];

/// The row label of a system in the W4 table and its goals.
pub fn label(system: &str) -> String {
    match system {
        "s3-client" => "S3 client, parallel listing, 64 in flight (reference)".into(),
        "riffle" => "riffle (background listing, the default)".into(),
        "riffle-seq" => "riffle, sequential walk (`--list-concurrency 0`)".into(),
        s => super::render::system_label(s),
    }
}

/// A short label for the plot.
fn short(system: &str) -> String {
    match system {
        "s3-client" => "S3 client\nlisting".into(),
        "riffle-seq" => "riffle\nsequential".into(),
        s => super::render::short_label(s),
    }
}

fn rows_of(rows: &[Row]) -> Vec<&Row> {
    let mut v: Vec<&Row> = rows
        .iter()
        .filter(|r| r.table == "w4" && r.column == Column::Proxy)
        .collect();
    v.sort_by_key(|r| {
        ORDER
            .iter()
            .position(|s| *s == r.system)
            .unwrap_or(ORDER.len())
    });
    v
}

type Pick = fn(&Listing) -> Option<&Step>;

fn cold_walk(l: &Listing) -> Option<&Step> {
    l.walk.as_ref()
}

fn remount_walk(l: &Listing) -> Option<&Step> {
    l.remount_walk.as_ref()
}

fn find<'a>(rows: &'a [Row], system: &str) -> Option<&'a Row> {
    rows.iter()
        .find(|r| r.table == "w4" && r.system == system && r.column == Column::Proxy)
}

/// The seconds of a pass that finished, counted right and met no error.
fn secs(s: &Step) -> Option<f64> {
    s.pass.clean().then_some(s.pass.elapsed_s)
}

fn step<'a>(rows: &'a [Row], system: &str, pick: Pick) -> Option<&'a Step> {
    find(rows, system)
        .filter(|r| r.ok())
        .and_then(|r| r.listing.as_ref())
        .and_then(pick)
}

/// Why `system`'s pass has no time, for a goal that is not measured.
fn why_not(rows: &[Row], system: &str, pick: Pick, phase: &str) -> String {
    let why = match find(rows, system) {
        None => "not in this run".to_string(),
        Some(r) if !r.ok() => r.status.clone(),
        Some(r) => match r.listing.as_ref().and_then(pick) {
            None => format!("no {phase}"),
            Some(s) => match (&s.pass.timed_out_s, s.pass.wrong) {
                (_, true) => format!("{phase} counted wrong"),
                (Some(t), _) => format!("{phase} timed out after {t:.0} s"),
                _ if s.pass.errors > 0 => format!("{phase} hit {} errors", s.pass.errors),
                _ => "no result".into(),
            },
        },
    };
    format!("{}: {why}", label(system))
}

/// `what` failed for these (system, pass) pairs: the reasons joined.
fn missing(rows: &[Row], wanted: &[(&str, Pick, &str)]) -> String {
    let gone: Vec<String> = wanted
        .iter()
        .filter(|(s, pick, _)| step(rows, s, *pick).and_then(secs).is_none())
        .map(|(s, pick, phase)| why_not(rows, s, *pick, phase))
        .collect();
    if gone.is_empty() {
        "no result".into()
    } else {
        gone.join("; ")
    }
}

/// The goals of the listing work, checked per round (riffle, the
/// sequential walk and the S3 client run again in extra rounds).
pub(super) fn goals(rounds: &[Vec<Row>], rows: &[Row]) -> Vec<Goal> {
    if find(rows, "riffle").is_none() {
        return Vec::new();
    }
    let riffle = label("riffle");
    let walk_secs = |r: &[Row], s: &str, pick: Pick| step(r, s, pick).and_then(secs);
    let mut out = vec![
        Goal {
            what: format!("{riffle}, cold walk time ÷ {}'s", label("s3-client")),
            values: per_round(rounds, |r| {
                div(
                    walk_secs(r, "riffle", cold_walk),
                    walk_secs(r, "s3-client", cold_walk),
                )
            }),
            rule: rule("w4.cold_walk_vs_s3_client"),
            unit: "×",
            missing: missing(
                rows,
                &[
                    ("riffle", cold_walk, "cold walk"),
                    ("s3-client", cold_walk, "listing"),
                ],
            ),
        },
        Goal {
            what: format!("{}, cold walk time ÷ {riffle}'s", label("riffle-seq")),
            values: per_round(rounds, |r| {
                div(
                    walk_secs(r, "riffle-seq", cold_walk),
                    walk_secs(r, "riffle", cold_walk),
                )
            }),
            rule: rule("w4.seq_walk_vs_riffle"),
            unit: "×",
            missing: missing(
                rows,
                &[
                    ("riffle-seq", cold_walk, "cold walk"),
                    ("riffle", cold_walk, "cold walk"),
                ],
            ),
        },
    ];
    // LISTs at the store over the remount's walk and stat, both counted.
    let remount_lists = |r: &[Row]| {
        let l = find(r, "riffle").filter(|r| r.ok())?.listing.as_ref()?;
        let walk = l.remount_walk.as_ref()?.detail.store_lists?;
        let stat = l
            .remount_stat
            .as_ref()
            .map_or(Some(0), |s| s.detail.store_lists)?;
        Some((walk + stat) as f64)
    };
    out.push(Goal {
        what: format!("{riffle}, LISTs at the store in the remount's walk and stat"),
        values: per_round(rounds, remount_lists),
        rule: rule("w4.remount_lists"),
        unit: "",
        missing: format!(
            "no proxy counts; {}",
            missing(rows, &[("riffle", remount_walk, "remount walk")])
        ),
    });
    out.push(Goal {
        what: format!("{riffle}, remount walk time ÷ cold walk time"),
        values: per_round(rounds, |r| {
            div(
                walk_secs(r, "riffle", remount_walk),
                walk_secs(r, "riffle", cold_walk),
            )
        }),
        rule: rule("w4.remount_vs_cold_walk"),
        unit: "×",
        missing: missing(
            rows,
            &[
                ("riffle", remount_walk, "remount walk"),
                ("riffle", cold_walk, "cold walk"),
            ],
        ),
    });
    out.push(Goal {
        what: format!(
            "{riffle}, daemon RSS growth per listed object (VmRSS after the cold walk and stat \
             − VmRSS right after mounting, ÷ objects)"
        ),
        values: per_round(rounds, |r| {
            find(r, "riffle")
                .filter(|r| r.ok())?
                .listing
                .as_ref()?
                .rss_per_object()
        }),
        rule: rule("w4.rss_per_listed_object"),
        unit: " B",
        missing: format!(
            "no RSS readings, or {}",
            missing(rows, &[("riffle", cold_walk, "cold walk")])
        ),
    });
    out
}

/// A pass's cell: its time and rate, or why it has none.
fn pass_cell(s: Option<&Step>) -> String {
    let Some(s) = s else {
        return "—".into();
    };
    let p = &s.pass;
    let what = if p.tool == "list-s3" { "keys" } else { "files" };
    let mut out = if p.wrong {
        match p.bytes {
            Some(b) if p.objects == p.expected_objects && p.timed_out_s.is_none() => format!(
                "**WRONG SIZES** ({b} bytes, the manifest has {})",
                p.expected_bytes
            ),
            _ => format!(
                "**WRONG COUNT** ({} {what} of {})",
                p.objects, p.expected_objects
            ),
        }
    } else if let Some(t) = p.timed_out_s {
        format!(
            "timed out after {t:.0} s ({} {what} of {})",
            p.objects, p.expected_objects
        )
    } else {
        format!("{} s ({} {what}/s)", num(p.elapsed_s), num(p.objects_per_s))
    };
    if p.errors > 0 {
        let _ = write!(out, ", {} errors", p.errors);
    }
    out
}

fn count(v: Option<u64>) -> String {
    v.map_or("?".into(), |n| n.to_string())
}

/// LISTs / HEADs at the store of the passes picked, "walk, stat".
fn store_cell(a: Option<&Step>, b: Option<&Step>) -> String {
    let one = |s: &Step| {
        format!(
            "{} / {}",
            count(s.detail.store_lists),
            count(s.detail.store_heads)
        )
    };
    match (a, b) {
        (None, None) => "—".into(),
        (Some(a), None) => one(a),
        (None, Some(b)) => format!("— ; {}", one(b)),
        (Some(a), Some(b)) => format!("{}; {}", one(a), one(b)),
    }
}

fn mib(kb: u64) -> String {
    format!("{:.0} MiB", kb as f64 / 1024.0)
}

/// riffle's listings of a walk (from the store, of them in the background,
/// from the cache directory), summed over the walk and its stat.
fn listings(a: Option<&Step>, b: Option<&Step>) -> Option<String> {
    let cs: Vec<_> = [a, b]
        .into_iter()
        .flatten()
        .filter_map(|s| s.detail.riffle.as_ref())
        .collect();
    if cs.is_empty() {
        return None;
    }
    let sum = |f: fn(&super::RiffleCounters) -> u64| cs.iter().map(|c| f(c)).sum::<u64>();
    Some(format!(
        "{} ({} ahead) / {}",
        sum(|c| c.listings),
        sum(|c| c.listings_background),
        sum(|c| c.listings_from_disk)
    ))
}

/// The W4 table.
pub fn table(rows: &[Row]) -> String {
    let rows = rows_of(rows);
    let reference = rows
        .iter()
        .find(|r| r.system == "s3-client" && r.ok())
        .and_then(|r| r.listing.as_ref())
        .and_then(cold_walk)
        .and_then(secs);
    let head = [
        "system",
        "cold walk (`find -type f`)",
        "stat of every file",
        "cold walk ÷ S3 client listing (time)",
        "LISTs / HEADs at the store: walk; stat",
        "daemon RSS after walk + stat (peak)",
        "RSS growth per object",
        "remount: walk",
        "remount: stat",
        "remount: LISTs / HEADs at the store: walk; stat",
        "riffle's listings: from the store (in the background) / from disk, cold → remount",
    ];
    let mut out = String::new();
    let _ = writeln!(out, "| {} |", head.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(head.len()));
    for r in &rows {
        let mut cells = vec![label(&r.system)];
        let l = match (&r.listing, r.ok()) {
            (Some(l), true) => l,
            _ => {
                cells.push(r.status.clone());
                cells.extend((0..head.len() - 2).map(|_| "—".to_string()));
                let _ = writeln!(out, "| {} |", cells.join(" | "));
                continue;
            }
        };
        let (walk, stat) = (l.walk.as_ref(), l.stat.as_ref());
        let (rwalk, rstat) = (l.remount_walk.as_ref(), l.remount_stat.as_ref());
        cells.push(pass_cell(walk));
        cells.push(pass_cell(stat));
        cells.push(if r.system == "s3-client" {
            "—".into()
        } else {
            // Time ÷ time: above 1× the walk is slower than the listing.
            ratio(walk.and_then(secs), reference)
        });
        cells.push(store_cell(walk, stat));
        cells.push(match (l.rss_after_kb, r.rss_kb) {
            (Some(now), Some(peak)) => format!("{} ({})", mib(now), mib(peak)),
            (Some(now), None) => mib(now),
            (None, Some(peak)) => format!("? ({})", mib(peak)),
            (None, None) => "—".into(),
        });
        cells.push(
            l.rss_per_object()
                .map_or("—".into(), |b| format!("{b:.0} B")),
        );
        cells.push(pass_cell(rwalk));
        cells.push(pass_cell(rstat));
        cells.push(store_cell(rwalk, rstat));
        cells.push(match (listings(walk, stat), listings(rwalk, rstat)) {
            (None, None) => "—".into(),
            (a, b) => format!(
                "{} → {}",
                a.unwrap_or_else(|| "—".into()),
                b.unwrap_or_else(|| "—".into())
            ),
        });
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    super::push_row_notes(&mut out, rows.iter().copied(), label);
    out
}

/// The W4 plot: files (keys) per second of each pass, one bar group per system.
pub fn plot(mode: &str, rows: &[Row], title: &str) -> PlotTable {
    let passes: [(&str, &str, Pick); 4] = [
        ("walk", "cold walk", |l| l.walk.as_ref()),
        ("stat", "stat", |l| l.stat.as_ref()),
        ("remount_walk", "remount walk", |l| l.remount_walk.as_ref()),
        ("remount_stat", "remount stat", |l| l.remount_stat.as_ref()),
    ];
    let series = passes
        .iter()
        .map(|(key, name, _)| PlotSeries {
            key: (*key).into(),
            label: (*name).into(),
            hatch: false,
        })
        .collect();
    let points = rows_of(rows)
        .into_iter()
        .map(|r| {
            let mut values = BTreeMap::new();
            if let Some(l) = r.listing.as_ref().filter(|_| r.ok()) {
                for (key, _, pick) in &passes {
                    if let Some(s) = pick(l).filter(|s| s.pass.clean()) {
                        values.insert((*key).to_string(), s.pass.objects_per_s);
                    }
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
        table: "w4".into(),
        title: format!("{title} ({mode})"),
        unit: "files (S3 client: keys) per second".into(),
        series,
        points,
        y_max: None,
        reference: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::listing::ListPass;
    use crate::results::goals::by_round;
    use crate::results::{PassDetail, RiffleCounters};

    const OBJECTS: u64 = 1_100_000;

    fn step(secs: f64, lists: u64, heads: u64) -> Step {
        let tool = "walk";
        Step {
            pass: ListPass {
                tool: tool.into(),
                phase: "find".into(),
                objects: OBJECTS,
                expected_objects: OBJECTS,
                expected_bytes: 35_000_000,
                elapsed_s: secs,
                ..ListPass::default()
            }
            .finish(),
            detail: PassDetail {
                store_lists: Some(lists),
                store_heads: Some(heads),
                ..PassDetail::default()
            },
        }
    }

    fn row(system: &str, listing: Listing) -> Row {
        Row {
            rss_kb: Some(300 * 1024),
            listing: Some(listing),
            ..Row::new("w4", system, Column::Proxy, "ok")
        }
    }

    /// A file system's row: cold walk and remount walk times, the LISTs of
    /// the remount, and the RSS growth.
    fn fs_row(system: &str, cold: f64, remount: f64, remount_lists: u64) -> Row {
        row(
            system,
            Listing {
                walk: Some(step(cold, 1102, 0)),
                stat: Some(step(cold / 2.0, 0, 0)),
                remount_walk: Some(step(remount, remount_lists, 0)),
                remount_stat: Some(step(remount / 2.0, 0, 0)),
                rss_base_kb: Some(20 * 1024),
                // 240 MB more: 228.8 B per object.
                rss_after_kb: Some(20 * 1024 + 245_760),
            },
        )
    }

    fn s3_client(secs: f64) -> Row {
        let mut s = step(secs, 1102, 0);
        s.pass.tool = "list-s3".into();
        s.pass.list_requests = Some(1102);
        Row {
            rss_kb: None,
            ..row(
                "s3-client",
                Listing {
                    walk: Some(s),
                    ..Listing::default()
                },
            )
        }
    }

    fn timed_out(mut s: Step, after: f64, objects: u64) -> Step {
        s.pass.objects = objects;
        s.pass.elapsed_s = after;
        s.pass.timed_out_s = Some(after);
        s.pass.problems.clear();
        s.pass = s.pass.finish();
        s
    }

    #[test]
    fn table_shows_times_counts_at_the_store_memory_and_timeouts() {
        let mut s3fs = fs_row("s3fs", 600.0, 600.0, 0);
        if let Some(l) = s3fs.listing.as_mut() {
            l.walk = l.walk.take().map(|s| timed_out(s, 600.0, 41_000));
            l.walk.as_mut().expect("walk").detail.store_heads = Some(40_000);
            l.stat = None;
            l.remount_walk = None;
            l.remount_stat = None;
            l.rss_after_kb = None;
        }
        let mut wrong = fs_row("rclone", 30.0, 30.0, 1102);
        if let Some(l) = wrong.listing.as_mut() {
            let w = l.walk.as_mut().expect("walk");
            w.pass.objects = OBJECTS - 1;
            w.pass = w.pass.clone().finish();
        }
        let mut mountpoint = fs_row("mountpoint", 1.0, 1.0, 0);
        mountpoint.status = "not run: riffle-bench-mountpoint is not built".into();
        let mut riffle = fs_row("riffle", 12.0, 1.5, 0);
        if let Some(l) = riffle.listing.as_mut() {
            l.walk.as_mut().expect("walk").detail.riffle = Some(RiffleCounters {
                listings: 1102,
                listings_background: 1100,
                ..RiffleCounters::default()
            });
            l.remount_walk.as_mut().expect("walk").detail.riffle = Some(RiffleCounters {
                listings_from_disk: 1102,
                ..RiffleCounters::default()
            });
        }
        let rows = vec![
            s3fs,
            riffle,
            fs_row("riffle-seq", 60.0, 1.5, 0),
            s3_client(10.0),
            wrong,
            mountpoint,
        ];
        let t = table(&rows);
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[0].starts_with("| system | cold walk (`find -type f`) |"),
            "{t}"
        );
        assert!(
            lines[2].starts_with(
                "| S3 client, parallel listing, 64 in flight (reference) | 10.0 s (110000 keys/s) \
                 | — | — | 1102 / 0 | — | — | — | — | — | — |"
            ),
            "{t}"
        );
        assert!(
            lines[3].starts_with(
                "| riffle (background listing, the default) | 12.0 s (91667 files/s) | 6.00 s \
                 (183333 files/s) | 1.20× | 1102 / 0; 0 / 0 | 260 MiB (300 MiB) | 229 B | 1.50 s \
                 (733333 files/s) | 0.75 s (1466667 files/s) | 0 / 0; 0 / 0 | 1102 (1100 ahead) \
                 / 0 → 0 (0 ahead) / 1102 |"
            ),
            "{t}"
        );
        assert!(
            lines[4].contains("| riffle, sequential walk (`--list-concurrency 0`) | 60.0 s"),
            "{t}"
        );
        assert!(lines[4].contains("| 6.00× |"), "{t}");
        assert!(
            lines[5].starts_with(
                "| s3fs | timed out after 600 s (41000 files of 1100000) | — | — | 1102 / 40000 | ? \
                 (300 MiB) | — | — | — | — | — |"
            ),
            "{t}"
        );
        assert!(
            lines[6].contains("| **WRONG COUNT** (1099999 files of 1100000) |"),
            "{t}"
        );
        assert!(
            lines[7]
                .starts_with("| Mountpoint | not run: riffle-bench-mountpoint is not built | — |"),
            "{t}"
        );
        // A wrong count fails the run like wrong bytes.
        assert_eq!(rows[4].mismatches(), 1);
        assert_eq!(rows[1].mismatches(), 0);

        let p = plot("full", &rows, "W4");
        assert_eq!(p.points[0].system, "s3-client");
        assert_eq!(
            p.points[1].values.get("walk").map(|v| v.round()),
            Some(91667.0)
        );
        assert!(p.points[3].values.is_empty(), "s3fs timed out");
    }

    fn goal_lines(rows: &[Row], extra: &[Row]) -> Vec<String> {
        crate::results::goals::goals("w4", rows, extra)
    }

    #[test]
    fn goals_compare_with_the_s3_client_the_sequential_walk_and_the_remount() {
        let rows = vec![
            s3_client(10.0),
            fs_row("riffle", 12.0, 1.8, 0),
            fs_row("riffle-seq", 60.0, 1.5, 0),
        ];
        let g = goal_lines(&rows, &[]);
        assert_eq!(g.len(), 5, "{g:#?}");
        assert!(
            g[0].contains(
                "riffle (background listing, the default), cold walk time ÷ S3 client, parallel \
                 listing, 64 in flight (reference)'s: **1.20×** (goal ≤ 1.5×): met"
            ),
            "{g:#?}"
        );
        assert!(
            g[1].contains(
                "riffle, sequential walk (`--list-concurrency 0`), cold walk time ÷ riffle \
                 (background listing, the default)'s: **5.00×** (goal ≥ 3×): met"
            ),
            "{g:#?}"
        );
        assert!(
            g[2].contains(
                "LISTs at the store in the remount's walk and stat: **0.00** (goal ≤ 0): met"
            ),
            "{g:#?}"
        );
        assert!(
            g[3].contains("remount walk time ÷ cold walk time: **0.15×** (goal ≤ 0.2×): met"),
            "{g:#?}"
        );
        assert!(
            g[4].contains("÷ objects): **228.8 B** (goal ≤ 150 B): **not met**"),
            "{g:#?}"
        );

        // Extra rounds: each pairs its own rows; the lines give the median.
        let extra: Vec<Row> = [
            s3_client(5.0),
            fs_row("riffle", 10.0, 5.0, 3),
            fs_row("riffle-seq", 20.0, 1.0, 0),
        ]
        .into_iter()
        .map(|r| Row {
            round: Some(2),
            ..r
        })
        .collect();
        assert_eq!(by_round(&rows, &extra).len(), 2);
        let g = goal_lines(&rows, &extra);
        assert!(
            g[0].contains(
                "**1.60×** (goal ≤ 1.5×, median of 2 alternated rounds: 1.20×, 2.00×): **not met**"
            ),
            "{g:#?}"
        );
        assert!(
            g[1].contains(
                "**3.50×** (goal ≥ 3×, median of 2 alternated rounds: 5.00×, 2.00×): met"
            ),
            "{g:#?}"
        );
        assert!(
            g[2].contains(
                "**1.50** (goal ≤ 0, median of 2 alternated rounds: 0.00, 3.00): **not met**"
            ),
            "{g:#?}"
        );

        // A sequential walk that timed out, no S3 client: the lines say why.
        let mut seq = fs_row("riffle-seq", 60.0, 1.5, 0);
        if let Some(l) = seq.listing.as_mut() {
            l.walk = l.walk.take().map(|s| timed_out(s, 600.0, 900_000));
        }
        let g = goal_lines(&[fs_row("riffle", 12.0, 1.5, 0), seq], &[]);
        assert!(
            g[0].contains(
                "not measured (S3 client, parallel listing, 64 in flight (reference): not in this \
                 run; goal ≤ 1.5×)"
            ),
            "{g:#?}"
        );
        assert!(
            g[1].contains(
                "not measured (riffle, sequential walk (`--list-concurrency 0`): cold walk timed \
                 out after 600 s; goal ≥ 3×)"
            ),
            "{g:#?}"
        );
        // Without riffle, no goal lines.
        assert!(goal_lines(&[s3_client(1.0)], &[]).is_empty());
    }
}
