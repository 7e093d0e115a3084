//! Issue 50's CPU goals, from the CPU columns ([`super::cpu`]): what a warm epoch through
//! riffle costs the whole machine against local disk, and how much of it the daemon spends
//! over io_uring against the same mount over `/dev/fuse` (its twin, [`super::transport`]).
//!
//! - **CPU per warm file ÷ local disk's** (W1: riffle, riffle read by the Python reader,
//!   riffle without passthrough): the machine's CPU seconds per 1,000 files in the warm
//!   epoch ÷ those of local disk read by the same reader, in the same round.
//! - **daemon share over io_uring ÷ over /dev/fuse** (W1's three, W2 without passthrough):
//!   the daemon's share of the machine's CPU in the warm epoch ÷ its `dev-fuse` twin's, in
//!   the same round; measured only where the row really ran over io_uring and its twin over
//!   `/dev/fuse` (what `riffle stats` said after mounting), since otherwise both sides are the
//!   same transport and the ratio would only measure noise.
//!
//! A table none of whose rows recorded CPU (results from before the CPU columns) has none of
//! these lines, as it has none of the columns.

use super::cpu::{daemon_share, per_work};
use super::goals::{div, find, per_round, rule, Goal};
use super::metrics::Epoch;
use super::render::system_label;
use super::transport::{self, dev_fuse_twin, Kind};
use super::{local_of, Row};

/// Rows a goal is checked for, each with its goal's id in `benches/goals.toml`.
type Goals = &'static [(&'static str, &'static str)];

/// The goals of `table` (W1, W2; none for the others).
pub(super) fn goals(table: &str, rounds: &[Vec<Row>], rows: &[Row]) -> Vec<Goal> {
    let ours: Vec<Row> = rows.iter().filter(|r| r.table == table).cloned().collect();
    if !super::cpu::recorded(&ours) {
        return Vec::new();
    }
    let (cpu, share): (Goals, Goals) = match table {
        "w1" => (
            &[
                ("riffle", "w1.warm_cpu_vs_local.riffle"),
                ("riffle-py", "w1.warm_cpu_vs_local.riffle-py"),
                ("riffle-nopt", "w1.warm_cpu_vs_local.riffle-nopt"),
            ],
            &[
                ("riffle", "w1.daemon_share_vs_dev_fuse.riffle"),
                ("riffle-py", "w1.daemon_share_vs_dev_fuse.riffle-py"),
                ("riffle-nopt", "w1.daemon_share_vs_dev_fuse.riffle-nopt"),
            ],
        ),
        "w2" => (
            &[],
            &[("riffle-nopt", "w2.daemon_share_vs_dev_fuse.riffle-nopt")],
        ),
        _ => (&[], &[]),
    };
    let mut out = Vec::new();
    for &(system, id) in cpu {
        if find(rows, table, system).is_some() {
            out.push(cpu_vs_local(table, rounds, rows, system, id));
        }
    }
    for &(system, id) in share {
        let twin = dev_fuse_twin(system);
        if find(rows, table, system).is_some() && find(rows, table, &twin).is_some() {
            out.push(share_vs_dev_fuse(table, rounds, rows, system, &twin, id));
        }
    }
    out
}

/// A row's warm CPU figure, or why there is none.
fn warm(
    rows: &[Row],
    table: &str,
    system: &str,
    value: fn(&Row, Epoch) -> Option<f64>,
) -> Result<f64, String> {
    let Some(row) = find(rows, table, system) else {
        return Err(format!("{}: not in this run", system_label(system)));
    };
    if !row.ok() {
        return Err(format!("{}: {}", system_label(system), row.status));
    }
    value(row, Epoch::Warm).ok_or_else(|| format!("{}: no CPU recorded", system_label(system)))
}

/// What is missing for a goal on `systems`, from round 1's rows.
fn missing(
    rows: &[Row],
    table: &str,
    systems: &[&str],
    value: fn(&Row, Epoch) -> Option<f64>,
) -> String {
    let gone: Vec<String> = systems
        .iter()
        .filter_map(|s| warm(rows, table, s, value).err())
        .collect();
    if gone.is_empty() {
        "no result".into()
    } else {
        gone.join("; ")
    }
}

fn cpu_vs_local(table: &str, rounds: &[Vec<Row>], rows: &[Row], system: &str, id: &str) -> Goal {
    let local = local_of(system);
    let shown =
        |s: &str| warm(rows, table, s, per_work).map_or("—".to_string(), |v| format!("{v:.2}"));
    Goal {
        what: format!(
            "{}, the machine's CPU per warm file ÷ {}'s ({} and {} s per 1,000 files in the \
             table)",
            system_label(system),
            system_label(local),
            shown(system),
            shown(local)
        ),
        values: per_round(rounds, |r| {
            div(
                warm(r, table, system, per_work).ok(),
                warm(r, table, local, per_work).ok(),
            )
        }),
        rule: rule(id),
        unit: "×",
        missing: missing(rows, table, &[system, local], per_work),
    }
}

/// Whether `row` ran over `kind`, by what it recorded after mounting.
fn ran_over(row: Option<&Row>, kind: Kind) -> bool {
    row.and_then(transport::kind) == Some(kind)
}

fn share_vs_dev_fuse(
    table: &str,
    rounds: &[Vec<Row>],
    rows: &[Row],
    system: &str,
    twin: &str,
    id: &str,
) -> Goal {
    let shown = |s: &str| {
        warm(rows, table, s, daemon_share)
            .map_or("—".to_string(), |v| format!("{:.1}%", v * 100.0))
    };
    let transports_apart = |r: &[Row]| {
        ran_over(find(r, table, system), Kind::IoUring)
            && ran_over(find(r, table, twin), Kind::DevFuse)
    };
    let missing = if transports_apart(rows) {
        missing(rows, table, &[system, twin], daemon_share)
    } else {
        let over = |s: &str| {
            find(rows, table, s)
                .and_then(transport::kind)
                .map_or("a transport it did not record", Kind::label)
        };
        format!(
            "{} ran over {} and {} over {}: not io_uring against /dev/fuse",
            system_label(system),
            over(system),
            system_label(twin),
            over(twin)
        )
    };
    Goal {
        what: format!(
            "{}, the daemon's share of the machine's CPU in the warm epoch over io_uring ÷ over \
             /dev/fuse (its dev-fuse twin; {} and {} in the table)",
            system_label(system),
            shown(system),
            shown(twin)
        ),
        values: per_round(rounds, |r| {
            if !transports_apart(r) {
                return None;
            }
            div(
                warm(r, table, system, daemon_share).ok(),
                warm(r, table, twin, daemon_share).ok(),
            )
        }),
        rule: rule(id),
        unit: "×",
        missing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::CpuUse;
    use crate::outcome::Outcome;
    use crate::results::goals::by_round;
    use crate::results::Column;

    const RINGS: &str = "io_uring: 2 queues of 8 entries (1024 KiB payloads)";
    const DEV_FUSE: &str = "/dev/fuse: asked for (--fuse-transport dev-fuse)";

    /// A W1 row of 1,000 files whose warm epoch took `machine` ticks (100 a second), the
    /// daemon `daemon` of them.
    fn row(system: &str, machine: u64, daemon: Option<u64>, transport: Option<&str>) -> Row {
        let o = Outcome {
            files: 1000,
            bytes: 100_000_000,
            elapsed_s: 1.0,
            cpu: Some(CpuUse {
                ticks_per_s: 100,
                machine_ticks: machine,
                daemon_ticks: daemon,
            }),
            ..Outcome::default()
        };
        Row {
            cold: Some(o.clone()),
            warm: Some(o),
            transport: transport.map(str::to_string),
            ..Row::new("w1", system, Column::Proxy, "ok")
        }
    }

    fn lines(table: &str, rows: &[Row], extra: &[Row]) -> Vec<String> {
        let rounds = by_round(rows, extra);
        goals(table, &rounds, rows)
            .iter()
            .map(Goal::render)
            .collect()
    }

    #[test]
    fn cpu_per_file_against_the_same_readers_local_disk() {
        let rows = vec![
            row("local", 100, None, None),
            row("local-py", 200, None, None),
            row("riffle", 120, Some(10), Some(RINGS)),
            row("riffle-py", 300, Some(30), Some(RINGS)),
        ];
        let g = lines("w1", &rows, &[]);
        assert_eq!(g.len(), 2, "no riffle-nopt, no twins: {g:#?}");
        let before_cpu: Vec<Row> = rows
            .iter()
            .cloned()
            .map(|mut r| {
                for o in [&mut r.cold, &mut r.warm].into_iter().flatten() {
                    o.cpu = None;
                }
                r
            })
            .collect();
        assert!(
            lines("w1", &before_cpu, &[]).is_empty(),
            "no CPU recorded, no lines"
        );
        assert!(
            g[0].contains(
                "riffle, no plan (disk cache, passthrough), the machine's CPU per warm file ÷ \
                 local disk's (1.20 and 1.00 s per 1,000 files in the table): **1.20×** (goal \
                 ≤ 1.3×): met"
            ),
            "{g:#?}"
        );
        // ÷ the Python reader's local disk (2 s per 1,000 files), not read-fs's.
        assert!(
            g[1].contains("Python reader: local disk's (3.00 and 2.00 s per 1,000 files in the table): **1.50×** (goal ≤ 1.3×): **not met**"),
            "{g:#?}"
        );
        let w2: Vec<Row> = rows
            .into_iter()
            .map(|r| Row {
                table: "w2".into(),
                ..r
            })
            .collect();
        assert!(
            lines("w2", &w2, &[]).is_empty(),
            "W2 has only the share goal"
        );
    }

    #[test]
    fn daemon_share_halved_against_the_dev_fuse_twin_in_each_round() {
        let rows = vec![
            row("local", 100, None, None),
            row("riffle-nopt", 100, Some(20), Some(RINGS)),
            row("riffle-nopt-devfuse", 100, Some(50), Some(DEV_FUSE)),
        ];
        let extra = vec![
            Row {
                round: Some(2),
                ..row("riffle-nopt", 100, Some(30), Some(RINGS))
            },
            Row {
                round: Some(2),
                ..row("riffle-nopt-devfuse", 100, Some(50), Some(DEV_FUSE))
            },
        ];
        let g = lines("w1", &rows, &extra);
        let share: Vec<&String> = g.iter().filter(|l| l.contains("daemon's share")).collect();
        assert_eq!(share.len(), 1, "{g:#?}");
        assert!(
            share[0].contains(
                "riffle (disk cache, no passthrough), the daemon's share of the machine's CPU in \
                 the warm epoch over io_uring ÷ over /dev/fuse (its dev-fuse twin; 20.0% and \
                 50.0% in the table): **0.50×** (goal ≤ 0.5×, median of 2 alternated rounds: \
                 0.40×, 0.60×): met"
            ),
            "{share:#?}"
        );

        // The auto row got /dev/fuse (the kernel's switch off): no value, and the line says
        // why instead of comparing /dev/fuse with itself.
        let mut off = rows.clone();
        off[1].transport = Some("/dev/fuse: the kernel's FUSE io_uring is off".into());
        let g = lines(
            "w2",
            &off.iter()
                .cloned()
                .map(|r| Row {
                    table: "w2".into(),
                    ..r
                })
                .collect::<Vec<_>>(),
            &[],
        );
        assert_eq!(g.len(), 1, "{g:#?}");
        assert!(
            g[0].contains(
                "not measured (riffle (disk cache, no passthrough) ran over /dev/fuse and riffle \
                 (disk cache, no passthrough), dev-fuse over /dev/fuse: not io_uring against \
                 /dev/fuse; goal ≤ 0.5×)"
            ),
            "{g:#?}"
        );

        // A twin without CPU figures: the line names it.
        let mut bare = rows;
        bare[2].warm.as_mut().expect("warm").cpu = None;
        let g = lines("w1", &bare, &[]).join("\n");
        assert!(
            g.contains("not measured (riffle (disk cache, no passthrough), dev-fuse: no CPU recorded; goal ≤ 0.5×)"),
            "{g}"
        );
    }
}
