//! CPU spent during a measured pass (issue 50): the whole machine's and the
//! daemon's of the system under test.
//!
//! A [`Sample`] is taken when a pass's clock starts and another when it
//! stops ([`crate::outcome::Tally`]; `benches/python_reader.py` does the
//! same in its parent process); [`CpuUse::between`] is their difference,
//! kept in clock ticks (`USER_HZ`) as the kernel counts them:
//!
//! - **machine**: the `cpu` line of `/proc/stat` (every CPU), user + nice +
//!   system + irq + softirq, so idle, iowait and steal do not count. It is
//!   everything that ran on the machine during the pass: the reader, the
//!   daemon, the kernel's work for both, and the store and proxy (RGW and
//!   riffle-proxy run on the same machine).
//! - **daemon**: utime + stime of the daemon's process (`/proc/PID/stat`
//!   fields 14 and 15), which cover all its threads but not its children's
//!   (cutime and cstime, not counted). `benches/run.sh` passes the pid it
//!   samples peak RSS from: riffle's daemon (the benchmark mounts without
//!   `--restart`, so there is no keeper), s3fs, rclone, Mountpoint. Local
//!   disk has none.
//!
//! Seconds, and per-file or per-byte figures, are derived from the ticks
//! where the tables are made ([`crate::results::cpu`]).

use serde::{Deserialize, Serialize};

/// The CPU counters at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// Busy ticks of the whole machine since boot.
    pub machine: u64,
    /// The daemon's utime + stime, when one is watched and readable.
    pub daemon: Option<u64>,
}

impl Sample {
    /// The counters now; `None` when `/proc/stat` cannot be read (not
    /// Linux). A daemon that cannot be read (it exited) gives `daemon: None`.
    pub fn take(daemon: Option<u32>) -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let machine = machine_ticks(&stat)?;
        let daemon = daemon.and_then(|pid| {
            let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            process_ticks(&text)
        });
        Some(Self { machine, daemon })
    }
}

/// What a pass cost in CPU, in clock ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuUse {
    /// Clock ticks per second (`USER_HZ`, `sysconf(_SC_CLK_TCK)`).
    pub ticks_per_s: u64,
    /// Busy ticks of the whole machine (all CPUs) during the pass.
    pub machine_ticks: u64,
    /// The daemon's ticks (all its threads) during the pass; `None` without
    /// a daemon, or when it could not be read at both ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemon_ticks: Option<u64>,
}

impl CpuUse {
    /// From the sample at the start of a pass to the one at its end.
    pub fn between(start: &Sample, end: &Sample, ticks_per_s: u64) -> Self {
        let daemon_ticks = match (start.daemon, end.daemon) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            _ => None,
        };
        Self {
            ticks_per_s,
            machine_ticks: end.machine.saturating_sub(start.machine),
            daemon_ticks,
        }
    }

    /// The machine's CPU seconds.
    pub fn machine_s(&self) -> f64 {
        seconds(self.machine_ticks, self.ticks_per_s)
    }

    /// The daemon's CPU seconds.
    pub fn daemon_s(&self) -> Option<f64> {
        self.daemon_ticks.map(|t| seconds(t, self.ticks_per_s))
    }

    /// The daemon's share of the machine's CPU (0..=1 but for sampling
    /// skew); `None` without a daemon or when the machine was idle.
    pub fn daemon_share(&self) -> Option<f64> {
        let d = self.daemon_ticks?;
        (self.machine_ticks > 0).then(|| d as f64 / self.machine_ticks as f64)
    }

    /// Two passes together (copy-first: the copy, then the local epoch).
    /// The daemon's ticks are known only if both passes know them.
    pub fn plus(&self, other: &Self) -> Self {
        Self {
            ticks_per_s: self.ticks_per_s,
            machine_ticks: self.machine_ticks + other.machine_ticks,
            daemon_ticks: self
                .daemon_ticks
                .zip(other.daemon_ticks)
                .map(|(a, b)| a + b),
        }
    }
}

fn seconds(ticks: u64, ticks_per_s: u64) -> f64 {
    if ticks_per_s == 0 {
        0.0
    } else {
        ticks as f64 / ticks_per_s as f64
    }
}

/// `USER_HZ`, the unit of `/proc/stat` and `/proc/PID/stat` times.
pub fn ticks_per_s() -> u64 {
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(hz).ok().filter(|&h| h > 0).unwrap_or(100)
}

/// user + nice + system + irq + softirq of the `cpu` line of `/proc/stat`.
pub fn machine_ticks(proc_stat: &str) -> Option<u64> {
    let line = proc_stat
        .lines()
        .find(|l| l.split_whitespace().next() == Some("cpu"))?;
    // cpu user nice system idle iowait irq softirq steal guest guest_nice
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    let at = |i: usize| f.get(i).copied();
    Some(at(0)? + at(1)? + at(2)? + at(5)? + at(6)?)
}

/// utime + stime of a `/proc/PID/stat` line (fields 14 and 15; the command
/// name, field 2, is in parentheses and may hold spaces, so fields are
/// counted after its closing parenthesis).
pub fn process_ticks(pid_stat: &str) -> Option<u64> {
    let (_, rest) = pid_stat.rsplit_once(')')?;
    // rest: field 3 (state) onwards; utime is field 14, stime 15.
    let mut f = rest.split_whitespace().skip(11);
    let utime: u64 = f.next()?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_stat_and_a_process_stat() {
        let stat = "cpu  100 5 30 9000 40 2 3 7 0 0\ncpu0 50 2 15 4500 20 1 1 3 0 0\nintr 1\n";
        assert_eq!(machine_ticks(stat), Some(100 + 5 + 30 + 2 + 3));
        assert_eq!(machine_ticks("cpu0 1 2 3 4 5 6 7\n"), None);
        let pid = "4242 (riffle (x) y) S 1 4242 4242 0 -1 4194560 1 0 0 0 120 35 4 5 20 0 9";
        assert_eq!(
            process_ticks(pid),
            Some(155),
            "utime 120 + stime 35, not the children's"
        );
        assert_eq!(process_ticks("4242 (riffle) S 1"), None);
        let own = Sample::take(Some(std::process::id())).expect("Linux /proc");
        assert!(own.daemon.is_some(), "this process reads as a daemon");
    }

    #[test]
    fn between_two_samples_and_two_passes() {
        let a = Sample {
            machine: 1_000,
            daemon: Some(10),
        };
        let b = Sample {
            machine: 1_250,
            daemon: Some(110),
        };
        let u = CpuUse::between(&a, &b, 100);
        assert_eq!((u.machine_ticks, u.daemon_ticks), (250, Some(100)));
        assert_eq!(u.machine_s(), 2.5);
        assert_eq!(u.daemon_s(), Some(1.0));
        assert_eq!(u.daemon_share(), Some(0.4));
        let gone = Sample { daemon: None, ..b };
        assert_eq!(CpuUse::between(&a, &gone, 100).daemon_share(), None);
        let local = CpuUse {
            daemon_ticks: None,
            ..u
        };
        assert_eq!(u.plus(&u).machine_ticks, 500);
        assert_eq!(u.plus(&u).daemon_ticks, Some(200));
        assert_eq!(u.plus(&local).daemon_ticks, None);
    }
}
