//! The goals of the issues checked against one run's rows, as lines
//! under each table: the measured value, the goal, met or not.
//!
//! A goal compares two systems of the same run. When the run repeated a
//! comparison (extra rounds, [`Row::round`]: `benches/run.sh` runs the
//! compared systems again, one after another, after the table's own rows),
//! the goal is computed in each round from that round's rows alone, and the
//! line gives the median over the rounds with every round's value, so one
//! disturbed epoch on this shared machine neither makes nor breaks a goal. A goal whose systems were
//! not repeated (the peers) has its one value, from the table's rows.

use super::metrics::{throughput, Epoch, Unit};
use super::render::system_label;
pub(super) use super::rules::{rule, Rule};
use super::{Column, Row};

pub(super) fn find<'a>(rows: &'a [Row], table: &str, system: &str) -> Option<&'a Row> {
    rows.iter()
        .find(|r| r.table == table && r.system == system && r.column == Column::Proxy)
}

fn tp(rows: &[Row], table: &str, system: &str, epoch: Epoch) -> Option<f64> {
    find(rows, table, system).and_then(|r| throughput(r, epoch))
}

/// The rows of each round: round 1 is the table's rows, then each extra
/// round's rows, in round order.
pub(super) fn by_round(rows: &[Row], extra: &[Row]) -> Vec<Vec<Row>> {
    let mut numbers: Vec<u32> = extra.iter().filter_map(|r| r.round).collect();
    numbers.sort_unstable();
    numbers.dedup();
    std::iter::once(rows.to_vec())
        .chain(numbers.into_iter().map(|n| {
            extra
                .iter()
                .filter(|r| r.round == Some(n))
                .cloned()
                .collect()
        }))
        .collect()
}

/// `value` of every round where it was measured, in round order.
pub(super) fn per_round(rounds: &[Vec<Row>], value: impl Fn(&[Row]) -> Option<f64>) -> Vec<f64> {
    rounds.iter().filter_map(|r| value(r)).collect()
}

/// The median of `values` (the mean of the middle two for an even count).
fn median(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// One goal measured: `values` holds one value per round that measured it, judged on their
/// median by its `rule` (its line of `benches/goals.toml`).
pub(super) struct Goal {
    pub(super) what: String,
    pub(super) values: Vec<f64>,
    pub(super) rule: Rule,
    pub(super) unit: &'static str,
    pub(super) missing: String,
}

impl Goal {
    pub(super) fn render(&self) -> String {
        let op = self.rule.cmp.symbol();
        let fmt = |v: f64| {
            if self.unit == "%" {
                format!("{v:.1}{}", self.unit)
            } else if self.unit == "×" && v < 0.995 {
                format!("{v:.2}{}", self.unit)
            } else if v >= 10.0 {
                format!("{v:.1}{}", self.unit)
            } else {
                format!("{v:.2}{}", self.unit)
            }
        };
        let goal = format!("goal {op} {}{}", self.rule.goal, self.unit);
        let Some(v) = median(&self.values) else {
            return format!("{}: not measured ({}; {goal})", self.what, self.missing);
        };
        let met = self.rule.cmp.met(v, self.rule.goal);
        let rounds = if self.values.len() > 1 {
            let each: Vec<String> = self.values.iter().map(|&x| fmt(x)).collect();
            format!(
                ", median of {} alternated rounds: {}",
                self.values.len(),
                each.join(", ")
            )
        } else {
            String::new()
        };
        format!(
            "{}: **{}** ({goal}{rounds}): {}",
            self.what,
            fmt(v),
            if met { "met" } else { "**not met**" }
        )
    }
}

pub(super) fn div(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// `a`'s throughput in its epoch ÷ `b`'s in its epoch, per round, judged by goal `id`.
fn ratio_goal(
    rounds: &[Vec<Row>],
    table: &str,
    what: String,
    a: (&str, Epoch),
    b: (&str, Epoch),
    id: &str,
) -> Goal {
    Goal {
        what,
        values: per_round(rounds, |r| {
            div(tp(r, table, a.0, a.1), tp(r, table, b.0, b.1))
        }),
        rule: rule(id),
        unit: "×",
        missing: missing(&rounds[0], table, &[a, b]),
    }
}

/// Which of the `wanted` systems have no result in their epoch, and why.
fn missing(rows: &[Row], table: &str, wanted: &[(&str, Epoch)]) -> String {
    let gone: Vec<String> = wanted
        .iter()
        .filter(|(s, epoch)| tp(rows, table, s, *epoch).is_none())
        .map(|(s, _)| {
            let status = find(rows, table, s).map_or("not in this run".to_string(), |r| {
                if r.ok() {
                    "no result".into()
                } else {
                    r.status.clone()
                }
            });
            format!("{}: {status}", system_label(s))
        })
        .collect();
    if gone.is_empty() {
        "no result".into()
    } else {
        gone.join("; ")
    }
}

/// `system`'s throughput in `epoch` (warm or the re-read) ÷ local disk's
/// in the same epoch, per round.
fn vs_local(rounds: &[Vec<Row>], table: &str, system: &str, epoch: Epoch, id: &str) -> Goal {
    let unit = Unit::of_table(table).label();
    let what = match epoch {
        Epoch::Reread => format!("epoch 3 (re-read) {unit} ÷ local disk epoch 3"),
        _ => format!("warm {unit} ÷ local disk"),
    };
    ratio_goal(
        rounds,
        table,
        format!("{}, {what}", system_label(system)),
        (system, epoch),
        ("local", epoch),
        id,
    )
}

/// `system`'s warm epoch (its first read of the cache files its cold epoch
/// wrote) ÷ local disk's epoch 1 (its first read of the copy written just
/// before it), per round: a first read of freshly written files on both
/// sides.
fn first_reads(rounds: &[Vec<Row>], table: &str, system: &str, id: &str) -> Goal {
    let unit = Unit::of_table(table).label();
    ratio_goal(
        rounds,
        table,
        format!(
            "{}, warm {unit} (first read of its cache) ÷ local disk epoch 1 (first read of its \
             copy)",
            system_label(system)
        ),
        (system, Epoch::Warm),
        ("local", Epoch::Cold),
        id,
    )
}

/// Whether any row of `table` has an epoch 3 (W2 since it was added).
fn has_reread(rows: &[Row], table: &str) -> bool {
    rows.iter().any(|r| r.table == table && r.epoch3.is_some())
}

/// The goals of issue 20 on W1: what unchanged code gets (riffle with no plan) against the
/// exact plan and copy-first, its first files, its GETs, and what browsing costs.
fn no_plan_goals(rounds: &[Vec<Row>], rows: &[Row]) -> Vec<Goal> {
    let table = "w1";
    let mut out = Vec::new();
    if find(rows, table, "riffle").is_none() {
        return out;
    }
    let cold = |r: &[Row]| {
        find(r, table, "riffle")
            .filter(|r| r.ok())
            .and_then(|r| r.cold.clone())
    };
    let no_plan = system_label("riffle");
    if find(rows, table, "riffle-plan").is_some() {
        out.push(ratio_goal(
            rounds,
            table,
            format!("{no_plan}, cold files/s ÷ riffle + epoch plan"),
            ("riffle", Epoch::Cold),
            ("riffle-plan", Epoch::Cold),
            "w1.no_plan_cold_vs_plan",
        ));
    }
    if find(rows, table, "copy-first").is_some() {
        let copy_total = |r: &[Row]| {
            find(r, table, "copy-first")
                .filter(|r| r.ok())
                .and_then(|r| Some(r.copy.as_ref()?.elapsed_s + r.cold.as_ref()?.elapsed_s))
        };
        out.push(Goal {
            what: format!("{no_plan}, cold epoch time ÷ copy-first total (copy + local epoch)"),
            values: per_round(rounds, |r| div(cold(r).map(|o| o.elapsed_s), copy_total(r))),
            rule: rule("w1.no_plan_cold_vs_copy_first"),
            unit: "×",
            missing: missing(
                rows,
                table,
                &[("riffle", Epoch::Cold), ("copy-first", Epoch::Cold)],
            ),
        });
    }
    out.push(Goal {
        what: format!("{no_plan}, first 256 files of the cold epoch"),
        values: per_round(rounds, |r| cold(r)?.first_256_s),
        rule: rule("w1.no_plan_first_256"),
        unit: " s",
        missing: missing(rows, table, &[("riffle", Epoch::Cold)]),
    });
    let gets_per_file = |r: &[Row], warm: bool| {
        let row = find(r, table, "riffle").filter(|r| r.ok())?;
        let (o, d) = if warm {
            (row.warm.as_ref()?, row.warm_detail.as_ref()?)
        } else {
            (row.cold.as_ref()?, row.cold_detail.as_ref()?)
        };
        let gets = d.store_gets? as f64;
        Some(if warm {
            gets
        } else {
            gets / o.files.max(1) as f64
        })
    };
    out.push(Goal {
        what: format!("{no_plan}, GETs at the store ÷ files read, cold epoch"),
        values: per_round(rounds, |r| gets_per_file(r, false)),
        rule: rule("w1.no_plan_cold_gets_per_file"),
        unit: "×",
        missing: "no proxy counts".into(),
    });
    out.push(Goal {
        what: format!("{no_plan}, GETs at the store in the warm epoch"),
        values: per_round(rounds, |r| gets_per_file(r, true)),
        rule: rule("w1.no_plan_warm_gets"),
        unit: "",
        missing: "no proxy counts".into(),
    });
    if let Some(browse) = find(rows, table, "riffle-browse") {
        // Object bytes (GET bodies) where the proxy counted them apart: the rule bounds what
        // is fetched ahead and never opened. The listings beside them are what opening files
        // in those directories costs, with or without prefetch, and are named beside the goal.
        let detail = browse.cold_detail.as_ref();
        let object_bytes = detail.and_then(|d| d.store_object_bytes);
        let value = browse.cold.as_ref().and_then(|o| {
            let fetched = object_bytes.or(detail?.store_bytes)? as f64;
            (o.bytes > 0).then(|| fetched / o.bytes as f64)
        });
        let what = match (object_bytes, detail.and_then(|d| d.store_bytes)) {
            (Some(objects), Some(all)) => format!(
                "{}, object bytes fetched at the store (GET bodies; listings: {:.1} MB more) ÷ bytes read",
                system_label("riffle-browse"),
                all.saturating_sub(objects) as f64 / 1e6
            ),
            _ => format!(
                "{}, bytes fetched at the store ÷ bytes read",
                system_label("riffle-browse")
            ),
        };
        out.push(Goal {
            what,
            values: value.into_iter().collect(),
            rule: rule("w1.browse_fetched_vs_read"),
            unit: "×",
            missing: browse.status.clone(),
        });
    }
    out
}

/// The goals of issue 20 on W5: riffle with no plan (`plan` eviction, the default) over
/// epochs 2–3 against `--eviction epoch`, its opens found cached and its GETs.
fn w5_goals(rows: &[Row]) -> Vec<Goal> {
    let find5 = |s: &str| find(rows, "w5", s).filter(|r| r.ok());
    let Some(default) = find5("riffle") else {
        return Vec::new();
    };
    let label = super::w5::label("riffle");
    let mut out = Vec::new();
    let (rate, _) = super::w5::later(default);
    let epoch_rate = find5("riffle-epoch").and_then(|r| super::w5::later(r).0);
    out.push(Goal {
        what: format!("{label}, files/s in epochs 2–3 ÷ `--eviction epoch`"),
        values: div(rate, epoch_rate).into_iter().collect(),
        rule: rule("w5.no_plan_vs_epoch"),
        unit: "×",
        missing: "`--eviction epoch` not in this run".into(),
    });
    let later: Vec<&super::Pass> = default.passes.iter().skip(1).collect();
    let (cached, opens) = later
        .iter()
        .filter_map(|p| p.detail.riffle.as_ref())
        .fold((0, 0), |(c, o), r| {
            (c + r.opens_already_cached, o + r.opens)
        });
    out.push(Goal {
        what: format!("{label}, opens already cached in epochs 2–3"),
        values: (opens > 0)
            .then(|| cached as f64 / opens as f64)
            .into_iter()
            .collect(),
        rule: rule("w5.opens_cached"),
        unit: "",
        missing: "no riffle counters".into(),
    });
    let worst = later
        .iter()
        .filter_map(|p| Some(p.detail.store_gets? as f64 / p.outcome.files.max(1) as f64))
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
    out.push(Goal {
        what: format!("{label}, GETs per epoch ÷ files read, epochs 2–3 (the larger)"),
        values: worst.into_iter().collect(),
        rule: rule("w5.gets_per_file"),
        unit: "×",
        missing: "no proxy counts".into(),
    });
    out
}

/// The goals of issue 23 on W1, when the Python reader's rows ran: its warm
/// epoch through riffle (no plan) against its own local-disk epoch, and
/// whether it sees the same riffle-to-local-disk ratio as `read-fs` (warm,
/// and cold), within 10%.
fn python_goals(rounds: &[Vec<Row>], rows: &[Row]) -> Vec<Goal> {
    const TABLE: &str = "w1";
    if find(rows, TABLE, "riffle-py").is_none() && find(rows, TABLE, "local-py").is_none() {
        return Vec::new();
    }
    let mut out = vec![ratio_goal(
        rounds,
        TABLE,
        format!(
            "{}, warm files/s ÷ {} (the same reader on local disk)",
            system_label("riffle-py"),
            system_label("local-py")
        ),
        ("riffle-py", Epoch::Warm),
        ("local-py", Epoch::Warm),
        "w1.python_warm_vs_local_py",
    )];
    // riffle ÷ local disk as each reader sees it.
    let vs_local = |r: &[Row], system: &str, epoch: Epoch| {
        div(
            tp(r, TABLE, system, epoch),
            tp(r, TABLE, super::local_of(system), epoch),
        )
    };
    for (epoch, name) in [(Epoch::Warm, "warm"), (Epoch::Cold, "cold")] {
        let shown = |system: &str| {
            vs_local(&rounds[0], system, epoch).map_or("—".to_string(), |v| format!("{v:.2}×"))
        };
        out.push(Goal {
            what: format!(
                "riffle, no plan, {name} files/s ÷ local disk, the Python reader's ratio against \
                 read-fs's ({} and {} in the table), |Python ÷ read-fs − 1|",
                shown("riffle-py"),
                shown("riffle")
            ),
            values: per_round(rounds, |r| {
                let ratio = div(
                    vs_local(r, "riffle-py", epoch),
                    vs_local(r, "riffle", epoch),
                )?;
                Some((ratio - 1.0).abs() * 100.0)
            }),
            rule: rule(match epoch {
                Epoch::Warm => "w1.python_vs_read_fs.warm",
                _ => "w1.python_vs_read_fs.cold",
            }),
            unit: "%",
            missing: missing(
                rows,
                TABLE,
                &[
                    ("riffle-py", epoch),
                    ("local-py", epoch),
                    ("riffle", epoch),
                    ("local", epoch),
                ],
            ),
        });
    }
    out
}

/// The goal lines of one table (empty when it has none); `extra` holds the
/// rows of the run's extra rounds (see the module documentation).
pub fn goals(table: &str, rows: &[Row], extra: &[Row]) -> Vec<String> {
    let rounds = by_round(rows, extra);
    let mut out = Vec::new();
    match table {
        "w1" => {
            // Issue 21: without passthrough (most GPU nodes' kernels) at 0.85× local disk.
            for (s, id) in [
                ("riffle", "w1.warm_vs_local.riffle"),
                ("riffle-nopt", "w1.warm_vs_local.riffle-nopt"),
            ] {
                if find(rows, table, s).is_some() {
                    out.push(vs_local(&rounds, table, s, Epoch::Warm, id));
                }
            }
            if find(rows, table, "riffle-plan").is_some() {
                for (peer, id) in [
                    ("s3fs", "w1.plan_cold_vs.s3fs"),
                    ("mountpoint", "w1.plan_cold_vs.mountpoint"),
                ] {
                    out.push(ratio_goal(
                        &rounds,
                        table,
                        format!("riffle + epoch plan, cold files/s ÷ {}", system_label(peer)),
                        ("riffle-plan", Epoch::Cold),
                        (peer, Epoch::Cold),
                        id,
                    ));
                }
                let plan_cold = |r: &[Row]| {
                    find(r, table, "riffle-plan")
                        .filter(|r| r.ok())
                        .and_then(|r| r.cold.clone())
                };
                let copy_total = |r: &[Row]| {
                    find(r, table, "copy-first")
                        .filter(|r| r.ok())
                        .and_then(|r| Some(r.copy.as_ref()?.elapsed_s + r.cold.as_ref()?.elapsed_s))
                };
                out.push(Goal {
                    what: "riffle + epoch plan, cold epoch time ÷ copy-first total (copy + local epoch)"
                        .into(),
                    values: per_round(&rounds, |r| {
                        div(plan_cold(r).map(|o| o.elapsed_s), copy_total(r))
                    }),
                    rule: rule("w1.plan_cold_vs_copy_first"),
                    unit: "×",
                    missing: missing(
                        rows,
                        table,
                        &[("riffle-plan", Epoch::Cold), ("copy-first", Epoch::Cold)],
                    ),
                });
                out.push(Goal {
                    what: "riffle + epoch plan, first 256 files of the cold epoch".into(),
                    values: per_round(&rounds, |r| plan_cold(r)?.first_256_s),
                    rule: rule("w1.plan_first_256"),
                    unit: " s",
                    missing: missing(rows, table, &[("riffle-plan", Epoch::Cold)]),
                });
            }
            out.extend(no_plan_goals(&rounds, rows));
            out.extend(python_goals(&rounds, rows));
        }
        "w5" => out.extend(w5_goals(rows)),
        "w4" => out.extend(super::w4::goals(&rounds, rows)),
        "w2" => {
            // The goal is set on the warm epoch; it is also checked like for
            // like (see the note under the table): riffle's warm epoch, its
            // first read of the cache files it just wrote, against local
            // disk's first read of the copy it just wrote (epoch 1); and
            // riffle's re-read against local disk's re-read (epoch 3).
            let reread = has_reread(rows, table);
            for (s, [warm, first, reread_id]) in [
                (
                    "riffle",
                    [
                        "w2.warm_vs_local.riffle",
                        "w2.first_reads.riffle",
                        "w2.reread_vs_local.riffle",
                    ],
                ),
                (
                    "riffle-nopt",
                    [
                        "w2.warm_vs_local.riffle-nopt",
                        "w2.first_reads.riffle-nopt",
                        "w2.reread_vs_local.riffle-nopt",
                    ],
                ),
            ] {
                if find(rows, table, s).is_some() {
                    out.push(vs_local(&rounds, table, s, Epoch::Warm, warm));
                    out.push(first_reads(&rounds, table, s, first));
                    if reread {
                        out.push(vs_local(&rounds, table, s, Epoch::Reread, reread_id));
                    }
                }
            }
        }
        _ => {}
    }
    // Issue 50: CPU per warm file, and the daemon's share over io_uring against /dev/fuse.
    out.extend(super::cpu_goals::goals(table, &rounds, rows));
    out.iter().map(Goal::render).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::Outcome;

    fn row(system: &str, secs: f64) -> Row {
        let o = Outcome {
            files: 1000,
            bytes: 100_000_000,
            elapsed_s: secs,
            first_256_s: Some(0.4),
            ..Outcome::default()
        };
        Row {
            cold: Some(o.clone()),
            warm: Some(o),
            ..Row::new("w1", system, Column::Proxy, "ok")
        }
    }

    #[test]
    fn w1_goals_are_checked_and_missing_peers_said() {
        let mut copy = row("copy-first", 1.0);
        copy.copy = Some(Outcome {
            elapsed_s: 4.0,
            ..Outcome::default()
        });
        let rows = vec![
            row("local", 1.0),
            copy,
            row("riffle", 1.1),
            row("riffle-plan", 5.0),
            row("s3fs", 60.0),
        ];
        let g = goals("w1", &rows, &[]).join("\n");
        assert!(
            g.contains("warm files/s ÷ local disk: **0.91×** (goal ≥ 0.8×): met"),
            "{g}"
        );
        assert!(g.contains("÷ s3fs: **12.0×** (goal ≥ 10×): met"), "{g}");
        assert!(
            g.contains("÷ Mountpoint: not measured (Mountpoint: not in this run"),
            "{g}"
        );
        assert!(
            g.contains("copy-first total (copy + local epoch): **1.00×** (goal ≤ 1.1×): met"),
            "{g}"
        );
        assert!(
            g.contains("first 256 files of the cold epoch: **0.40 s** (goal < 1 s): met"),
            "{g}"
        );
        let mut slow = rows.clone();
        slow[3] = row("riffle-plan", 50.0);
        let g = goals("w1", &slow, &[]).join("\n");
        assert!(g.contains("**10.0×** (goal ≤ 1.1×): **not met**"), "{g}");
    }

    /// `row`, as round `n` of the run's extra rounds.
    fn in_round(n: u32, row: Row) -> Row {
        Row {
            round: Some(n),
            ..row
        }
    }

    fn copy_first(read_secs: f64, copy_secs: f64) -> Row {
        let mut copy = row("copy-first", read_secs);
        copy.copy = Some(Outcome {
            elapsed_s: copy_secs,
            ..Outcome::default()
        });
        copy
    }

    #[test]
    fn repeated_comparisons_are_judged_on_the_median_of_their_rounds() {
        let rows = vec![
            row("local", 1.0),
            copy_first(1.0, 4.0),
            row("riffle-plan", 6.0),
            row("s3fs", 66.0),
        ];
        let mut failed = in_round(4, row("riffle-plan", 1.0));
        failed.status = "failed: the mount disappeared".into();
        let extra = vec![
            in_round(2, copy_first(1.0, 4.0)),
            in_round(2, row("riffle-plan", 5.0)),
            in_round(3, copy_first(1.0, 4.0)),
            in_round(3, row("riffle-plan", 5.25)),
            // A round whose riffle row failed has no value; its copy-first
            // row is not paired with another round's.
            in_round(4, copy_first(1.0, 4.0)),
            failed,
        ];
        let g = goals("w1", &rows, &extra).join("\n");
        assert!(
            g.contains(
                "copy-first total (copy + local epoch): **1.05×** (goal ≤ 1.1×, median of 3 \
                 alternated rounds: 1.20×, 1.00×, 1.05×): met"
            ),
            "{g}"
        );
        assert!(
            g.contains(
                "first 256 files of the cold epoch: **0.40 s** (goal < 1 s, median of 3 \
                 alternated rounds: 0.40 s, 0.40 s, 0.40 s): met"
            ),
            "{g}"
        );
        // s3fs ran once: its ratio is round 1's alone.
        assert!(g.contains("÷ s3fs: **11.0×** (goal ≥ 10×): met"), "{g}");
        // Without the extra rounds, round 1 decides.
        let g = goals("w1", &rows, &[]).join("\n");
        assert!(
            g.contains(
                "copy-first total (copy + local epoch): **1.20×** (goal ≤ 1.1×): **not met**"
            ),
            "{g}"
        );
    }

    #[test]
    fn python_goals_compare_with_its_own_local_disk_and_with_read_fs() {
        // read-fs: riffle 0.80× local disk; the Python reader: 0.83×.
        let rows = vec![
            row("local", 1.0),
            row("riffle", 1.25),
            row("local-py", 2.0),
            row("riffle-py", 2.4),
        ];
        let g = goals("w1", &rows, &[]);
        let py: Vec<&String> = g.iter().filter(|l| l.contains("Python")).collect();
        assert_eq!(py.len(), 3, "{g:#?}");
        assert!(
            py[0].contains(
                "Python reader: riffle, no plan, warm files/s ÷ Python reader: local disk (the \
                 same reader on local disk): **0.83×** (goal ≥ 0.9×): **not met**"
            ),
            "{py:#?}"
        );
        // 0.833 / 0.8 - 1 = 4.2%.
        assert!(
            py[1].contains(
                "riffle, no plan, warm files/s ÷ local disk, the Python reader's ratio against \
                 read-fs's (0.83× and 0.80× in the table), |Python ÷ read-fs − 1|: **4.2%** \
                 (goal ≤ 10%): met"
            ),
            "{py:#?}"
        );
        assert!(py[2].contains("riffle, no plan, cold files/s"), "{py:#?}");
        assert!(py[2].contains("**4.2%** (goal ≤ 10%): met"), "{py:#?}");

        // Each round pairs its own rows; the line gives the median.
        let extra = vec![
            in_round(2, row("local", 1.0)),
            in_round(2, row("riffle", 1.0)),
            in_round(2, row("local-py", 2.0)),
            in_round(2, row("riffle-py", 2.0)),
        ];
        let g = goals("w1", &rows, &extra).join("\n");
        assert!(
            g.contains(
                "(the same reader on local disk): **0.92×** (goal ≥ 0.9×, median of 2 alternated \
                 rounds: 0.83×, 1.00×): met"
            ),
            "{g}"
        );
        assert!(
            g.contains("**2.1%** (goal ≤ 10%, median of 2 alternated rounds: 4.2%, 0.0%): met"),
            "{g}"
        );

        // Far apart: the readers disagree.
        let apart = vec![
            row("local", 1.0),
            row("riffle", 2.0),
            row("local-py", 1.0),
            row("riffle-py", 1.0),
        ];
        let g = goals("w1", &apart, &[]).join("\n");
        assert!(g.contains("**100.0%** (goal ≤ 10%): **not met**"), "{g}");

        // The Python reader's local disk alone: the lines say what is missing.
        let g = goals("w1", &[row("local", 1.0), row("local-py", 1.0)], &[]).join("\n");
        assert!(
            g.contains(
                "not measured (Python reader: riffle, no plan: not in this run; riffle, no plan \
                 (disk cache, passthrough): not in this run; goal ≤ 10%)"
            ),
            "{g}"
        );
        // Without the Python reader's rows, no Python lines.
        let g = goals("w1", &[row("local", 1.0), row("riffle", 1.0)], &[]).join("\n");
        assert!(!g.contains("Python"), "{g}");
    }

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }

    /// A W2 row: 1 GB read in each epoch, in these times.
    fn w2_row(system: &str, cold_secs: f64, warm_secs: f64, epoch3_secs: Option<f64>) -> Row {
        let o = |secs: f64| Outcome {
            files: 16,
            bytes: 1_000_000_000,
            elapsed_s: secs,
            ..Outcome::default()
        };
        Row {
            table: "w2".into(),
            cold: Some(o(cold_secs)),
            warm: Some(o(warm_secs)),
            epoch3: epoch3_secs.map(o),
            ..row(system, 2.0)
        }
    }

    #[test]
    fn w2_checks_the_first_reads_and_the_reread_beside_the_warm_epoch() {
        let rows = vec![
            w2_row("local", 2.0, 1.0, Some(1.0)),
            w2_row("riffle", 3.0, 1.25, Some(1.02)),
            w2_row("riffle-nopt", 3.0, 2.0, None),
        ];
        let g = goals("w2", &rows, &[]);
        assert_eq!(g.len(), 6, "{g:#?}");
        assert!(
            g[0].contains("riffle, no plan (disk cache, passthrough), warm MB/s ÷ local disk: **0.80×** (goal ≥ 0.95×): **not met**"),
            "{g:#?}"
        );
        // riffle's warm epoch (1.25 s) against local disk's first read of its copy (2 s).
        assert!(
            g[1].contains(
                "riffle, no plan (disk cache, passthrough), warm MB/s (first read of its cache) ÷ local \
                 disk epoch 1 (first read of its copy): **1.60×** (goal ≥ 0.95×): met"
            ),
            "{g:#?}"
        );
        assert!(
            g[2].contains(
                "riffle, no plan (disk cache, passthrough), epoch 3 (re-read) MB/s ÷ local disk epoch 3: \
                 **0.98×** (goal ≥ 0.95×): met"
            ),
            "{g:#?}"
        );
        assert!(
            g[4].contains("(first read of its copy): **1.00×** (goal ≥ 0.85×): met"),
            "{g:#?}"
        );
        assert!(
            g[5].contains("epoch 3 (re-read) MB/s ÷ local disk epoch 3: not measured (riffle (disk cache, no passthrough): no result"),
            "{g:#?}"
        );

        let without: Vec<Row> = rows
            .iter()
            .cloned()
            .map(|r| Row { epoch3: None, ..r })
            .collect();
        let g = goals("w2", &without, &[]);
        assert_eq!(g.len(), 4, "no re-read lines without epoch 3: {g:#?}");

        // Local disk without its first read (a run before the copy was timed
        // with it): the first-read line says which side is missing.
        let mut no_first = rows;
        no_first[0].cold = None;
        let g = goals("w2", &no_first, &[]);
        assert!(
            g[1].contains("(first read of its copy): not measured (local disk: no result; goal"),
            "{g:#?}"
        );
    }

    #[test]
    fn w2_rounds_pair_local_disks_epochs_with_riffles_in_the_same_round() {
        let rows = vec![
            w2_row("local", 2.0, 1.0, Some(1.0)),
            w2_row("riffle", 3.0, 1.25, Some(1.0)),
        ];
        let extra = vec![
            in_round(2, w2_row("local", 4.0, 2.0, Some(1.0))),
            in_round(2, w2_row("riffle", 3.0, 2.0, Some(1.0))),
            in_round(3, w2_row("local", 1.0, 1.0, Some(1.0))),
            in_round(3, w2_row("riffle", 3.0, 1.05, Some(1.0))),
        ];
        let g = goals("w2", &rows, &extra);
        assert!(
            g[0].contains(
                "warm MB/s ÷ local disk: **0.95×** (goal ≥ 0.95×, median of 3 alternated \
                 rounds: 0.80×, 1.00×, 0.95×): met"
            ),
            "{g:#?}"
        );
        assert!(
            g[1].contains(
                "(first read of its copy): **1.60×** (goal ≥ 0.95×, median of 3 alternated \
                 rounds: 1.60×, 2.00×, 0.95×): met"
            ),
            "{g:#?}"
        );
    }

    #[test]
    fn no_plan_goals_compare_with_the_plan_and_copy_first_and_count_gets() {
        let mut plan = row("riffle-plan", 10.0);
        plan.cold.as_mut().unwrap().files = 1000;
        let mut riffle = row("riffle", 10.5);
        riffle.cold_detail = Some(super::super::PassDetail {
            store_gets: Some(1010),
            ..Default::default()
        });
        riffle.warm_detail = Some(super::super::PassDetail {
            store_gets: Some(0),
            ..Default::default()
        });
        let mut copy = row("copy-first", 2.0);
        copy.copy = Some(Outcome {
            elapsed_s: 9.0,
            ..Outcome::default()
        });
        let mut browse = row("riffle-browse", 1.0);
        browse.cold_detail = Some(super::super::PassDetail {
            store_bytes: Some(250_000_000),
            ..Default::default()
        });
        let g = goals("w1", &[plan, riffle, copy, browse], &[]).join("\n");
        assert!(
            g.contains("cold files/s ÷ riffle + epoch plan: **0.95×** (goal ≥ 0.9×): met"),
            "{g}"
        );
        assert!(
            g.contains("÷ copy-first total (copy + local epoch): **0.95×** (goal ≤ 1×): met"),
            "{g}"
        );
        assert!(
            g.contains("GETs at the store ÷ files read, cold epoch: **1.01×** (goal ≤ 1.02×): met"),
            "{g}"
        );
        assert!(
            g.contains("GETs at the store in the warm epoch: **0.00** (goal ≤ 0): met"),
            "{g}"
        );
        assert!(
            g.contains(
                "bytes fetched at the store ÷ bytes read: **2.50×** (goal ≤ 2×): **not met**"
            ),
            "{g}"
        );
    }

    #[test]
    fn browsing_is_judged_on_object_bytes_when_the_proxy_counted_them_apart() {
        let mut browse = row("riffle-browse", 1.0);
        browse.cold_detail = Some(super::super::PassDetail {
            store_bytes: Some(250_000_000),
            store_object_bytes: Some(180_000_000),
            ..Default::default()
        });
        let g = goals(
            "w1",
            &[row("riffle-plan", 10.0), row("riffle", 10.0), browse],
            &[],
        )
        .join("\n");
        assert!(
            g.contains(
                "object bytes fetched at the store (GET bodies; listings: 70.0 MB more) ÷ bytes read: **1.80×** (goal ≤ 2×): met"
            ),
            "{g}"
        );
    }
}
