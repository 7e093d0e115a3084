//! The CPU columns of the W1, W2 and W3 tables (issue 50): what an epoch
//! cost the whole machine in CPU seconds per unit of work, and the share of
//! it the system's daemon spent.
//!
//! Both come from the ticks an epoch's reader recorded ([`crate::cpu`]):
//!
//! - **CPU s per 1,000 files** (W1) or **per GB** (W2, W3): the machine's
//!   busy ticks over the epoch ÷ `USER_HZ`, divided by the files (÷ 1,000)
//!   or bytes (÷ 10⁹) the epoch read. copy-first's cold epoch adds its
//!   copy's CPU, as its cold throughput adds the copy's time.
//! - **daemon share**: the daemon's ticks ÷ the machine's, over the same
//!   epoch; "—" for a system without a daemon (local disk, copy-first, the
//!   S3 client), in whole percents from 10% and with one decimal below.
//!
//! A cell lists the table's epochs in order (cold / warm, and the re-read
//! where the table has one); an epoch that did not run, read wrong bytes or
//! recorded no CPU shows "—". Tables show the columns only when some row
//! recorded CPU, so results from before it render as they did.

use super::metrics::{pass, Epoch, Unit};
use super::Row;
use crate::cpu::CpuUse;

/// The CPU an epoch cost the machine, copy included for copy-first's cold
/// epoch; `None` when the row failed, the epoch read wrong bytes or
/// recorded no CPU.
pub fn epoch_cpu(row: &Row, epoch: Epoch) -> Option<CpuUse> {
    if !row.ok() {
        return None;
    }
    let o = pass(row, epoch)?;
    if o.mismatches > 0 {
        return None;
    }
    let cpu = o.cpu?;
    match (&row.copy, epoch) {
        (Some(c), Epoch::Cold) => Some(c.cpu?.plus(&cpu)),
        _ => Some(cpu),
    }
}

/// The work a CPU figure is divided by: thousands of files (W1) or GB.
fn work(row: &Row, epoch: Epoch) -> Option<f64> {
    let o = pass(row, epoch)?;
    let w = match Unit::of_table(&row.table) {
        Unit::FilesPerSec => o.files as f64 / 1e3,
        Unit::MbPerSec => o.bytes as f64 / 1e9,
    };
    (w > 0.0).then_some(w)
}

/// The machine's CPU seconds per 1,000 files (W1) or per GB in an epoch.
pub fn per_work(row: &Row, epoch: Epoch) -> Option<f64> {
    Some(epoch_cpu(row, epoch)?.machine_s() / work(row, epoch)?)
}

/// The daemon's share of the machine's CPU in an epoch.
pub fn daemon_share(row: &Row, epoch: Epoch) -> Option<f64> {
    epoch_cpu(row, epoch)?.daemon_share()
}

/// Whether any row recorded CPU: the tables show the columns then.
pub fn recorded(rows: &[Row]) -> bool {
    rows.iter().any(|r| {
        [&r.cold, &r.warm, &r.epoch3, &r.copy]
            .into_iter()
            .flatten()
            .any(|o| o.cpu.is_some())
    })
}

/// The two column heads for a table showing `epochs`.
pub fn heads(table: &str, epochs: &[Epoch]) -> [String; 2] {
    let per = match Unit::of_table(table) {
        Unit::FilesPerSec => "CPU s per 1,000 files",
        Unit::MbPerSec => "CPU s per GB",
    };
    let which = epochs
        .iter()
        .map(|e| match e {
            Epoch::Cold => "cold",
            Epoch::Warm => "warm",
            Epoch::Reread => "re-read",
        })
        .collect::<Vec<_>>()
        .join(" / ");
    [
        format!("{per} ({which})"),
        format!("daemon share ({which})"),
    ]
}

/// A row's two cells: CPU per unit of work, and the daemon's share.
pub fn cells(row: &Row, epochs: &[Epoch]) -> [String; 2] {
    let join = |f: &dyn Fn(Epoch) -> Option<String>| {
        let parts: Vec<Option<String>> = epochs.iter().map(|&e| f(e)).collect();
        if parts.iter().all(Option::is_none) {
            return "—".to_string();
        }
        parts
            .into_iter()
            .map(|p| p.unwrap_or_else(|| "—".into()))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    [
        join(&|e| per_work(row, e).map(|v| format!("{v:.2}"))),
        join(&|e| daemon_share(row, e).map(percent)),
    ]
}

/// A share as a percentage: whole percents from 10%, one decimal below, so
/// a daemon that hardly ran shows as such (`0.3%`, not `0%`).
fn percent(share: f64) -> String {
    let p = share * 100.0;
    if p >= 10.0 {
        format!("{p:.0}%")
    } else {
        format!("{p:.1}%")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::Outcome;
    use crate::results::Column;

    fn outcome(files: u64, bytes: u64, machine: u64, daemon: Option<u64>) -> Outcome {
        Outcome {
            files,
            bytes,
            elapsed_s: 1.0,
            cpu: Some(CpuUse {
                ticks_per_s: 100,
                machine_ticks: machine,
                daemon_ticks: daemon,
            }),
            ..Outcome::default()
        }
    }

    fn row(table: &str, system: &str, cold: Outcome, warm: Outcome) -> Row {
        Row {
            cold: Some(cold),
            warm: Some(warm),
            ..Row::new(table, system, Column::Proxy, "ok")
        }
    }

    #[test]
    fn ticks_become_seconds_per_1000_files_and_the_daemons_share() {
        // 2,000 files; 300 ticks at 100/s = 3 s, 1.5 s per 1,000 files; the
        // daemon's 120 ticks are 40% of the machine's.
        let r = row(
            "w1",
            "riffle",
            outcome(2_000, 0, 300, Some(120)),
            outcome(2_000, 0, 50, Some(5)),
        );
        assert_eq!(per_work(&r, Epoch::Cold), Some(1.5));
        assert_eq!(daemon_share(&r, Epoch::Cold), Some(0.4));
        assert_eq!(per_work(&r, Epoch::Warm), Some(0.25));
        assert_eq!(percent(0.003), "0.3%");
        let epochs = [Epoch::Cold, Epoch::Warm];
        assert_eq!(
            cells(&r, &epochs),
            ["1.50 / 0.25".to_string(), "40% / 10%".into()]
        );
        assert_eq!(
            heads("w1", &epochs),
            [
                "CPU s per 1,000 files (cold / warm)".to_string(),
                "daemon share (cold / warm)".into()
            ]
        );
    }

    #[test]
    fn per_gb_copy_first_adds_its_copy_and_local_disk_has_no_share() {
        // 2 GB; 400 ticks = 4 s, 2 s per GB.
        let mut r = row(
            "w2",
            "copy-first",
            outcome(4, 2_000_000_000, 400, None),
            outcome(4, 2_000_000_000, 100, None),
        );
        r.copy = Some(outcome(4, 2_000_000_000, 600, None));
        assert_eq!(
            per_work(&r, Epoch::Cold),
            Some(5.0),
            "(600 + 400) ticks / 2 GB"
        );
        assert_eq!(per_work(&r, Epoch::Warm), Some(0.5));
        assert_eq!(daemon_share(&r, Epoch::Cold), None);
        let epochs = [Epoch::Cold, Epoch::Warm, Epoch::Reread];
        assert_eq!(
            cells(&r, &epochs),
            ["5.00 / 0.50 / —".to_string(), "—".into()]
        );
        assert_eq!(
            heads("w3", &epochs)[0],
            "CPU s per GB (cold / warm / re-read)"
        );
        if let Some(o) = r.cold.as_mut() {
            o.mismatches = 1;
        }
        assert_eq!(per_work(&r, Epoch::Cold), None, "wrong bytes: no figure");
        assert!(recorded(std::slice::from_ref(&r)));
        let mut old = r.clone();
        for o in [&mut old.cold, &mut old.warm, &mut old.copy]
            .into_iter()
            .flatten()
        {
            o.cpu = None;
        }
        assert!(!recorded(&[old]));
    }
}
