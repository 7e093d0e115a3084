//! Keeping published volumes mounted.
//!
//! [`reconcile`] runs once at start, before the plugin reports ready: every
//! recorded target is checked (in parallel) and live mounts are adopted,
//! broken ones ("transport endpoint is not connected" after a daemon died
//! with the previous plugin) are detached and remounted, so pods recover
//! without a restart.
//!
//! [`run`] then repeats the same check every interval, each target on a task
//! of its own: a take-over can take up to the mounter's mount timeout, and
//! the other volumes' recoveries (and the mounter pings below) go on
//! meanwhile. A target whose recovery fails is retried with exponential
//! backoff (interval x 2^n, at most five minutes) so that a bucket that went
//! away does not turn into a remount storm; targets with a check or an
//! operation in progress are skipped for that round. While the mounter itself cannot be asked (the `riffle-mounter`
//! container restarting), rounds are skipped whole and count against no
//! target.
//!
//! A restart of the mounter's container takes every daemon of the node with
//! it, while the pods' reads wait on connections the fd store kept alive
//! (see [`crate::volumes`]): each second until a new daemon serves is a
//! second of stalled training. So the mounter is pinged every
//! [`MOUNTER_POLL`] (a local socket round trip), and a round runs at once,
//! without waiting for the interval, when it answers again after an outage
//! or when it answers as another process than before (a restart between
//! two pings); targets in backoff are retried then too, since the outage,
//! not the target, made them fail. Likewise when a keeper or daemon ended
//! under it (the mounter reaps and counts them, [`crate::mounter::reaper`]): a volume
//! whose keeper and daemon died in quick succession, with only the fd store
//! holding its connection, is taken over within a ping, not a round.

use crate::node_state::state::VolumeRecord;
use crate::volumes::{CheckOutcome, VolumeError, VolumeManager};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// How often the supervisor asks whether the mounter is the same process.
pub const MOUNTER_POLL: Duration = Duration::from_millis(250);

/// Checks every recorded target once; returns how many were recovered and
/// how many failed.
pub async fn reconcile(manager: &Arc<VolumeManager>) -> (usize, usize) {
    let records = match manager.store().list() {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "cannot list volume records");
            return (0, 0);
        }
    };
    tracing::info!(volumes = records.len(), "reconciling recorded volumes");
    let mut tasks = Checks::new();
    for record in records {
        spawn_check(&mut tasks, manager, record, true);
    }
    let (mut recovered, mut failed) = (0, 0);
    while let Some(joined) = tasks.join_next().await {
        let Ok((record, outcome)) = joined else {
            failed += 1;
            continue;
        };
        let target = record.target.display();
        match outcome {
            Ok(CheckOutcome::Healthy) => {
                tracing::info!(volume_id = %record.volume_id, %target, "adopted live mount")
            }
            Ok(CheckOutcome::Recovered(why)) => {
                recovered += 1;
                tracing::warn!(volume_id = %record.volume_id, %target, reason = %why, "remounted broken mount")
            }
            Ok(CheckOutcome::Foreign(fs)) => {
                tracing::error!(volume_id = %record.volume_id, %target, fs_type = %fs, "target is covered by another mount")
            }
            Ok(CheckOutcome::Orphaned) => {
                tracing::warn!(volume_id = %record.volume_id, %target, "removed the mount of a pod that no longer exists")
            }
            Ok(CheckOutcome::Skipped) => {}
            Err(e) => {
                failed += 1;
                tracing::error!(volume_id = %record.volume_id, %target, error = %e, "recovery failed; the supervisor will retry")
            }
        }
    }
    (recovered, failed)
}

/// The checks of targets, each on a task of its own.
type Checks = tokio::task::JoinSet<(VolumeRecord, Result<CheckOutcome, VolumeError>)>;

/// Checks `record` on a task of `checks`: one volume's slow recovery (a take-over waits for
/// its daemon's start, up to the mounter's mount timeout) must not hold up another's. Checks
/// of one target exclude each other by its lock ([`VolumeManager::check`]; `wait`: wait for
/// it, or skip a target in use), and a pod's bind of a staged volume waits for the staged
/// mount's.
fn spawn_check(
    checks: &mut Checks,
    manager: &Arc<VolumeManager>,
    record: VolumeRecord,
    wait: bool,
) {
    let manager = Arc::clone(manager);
    checks.spawn(async move {
        let outcome = manager.check(&record.target, wait).await;
        (record, outcome)
    });
}

/// Per-target retry schedule after failed recoveries.
#[derive(Default)]
struct Backoff {
    entries: HashMap<PathBuf, (u32, Instant)>,
}

impl Backoff {
    fn due(&self, target: &PathBuf, now: Instant) -> bool {
        self.entries.get(target).is_none_or(|(_, at)| now >= *at)
    }

    fn failed(&mut self, target: PathBuf, interval: Duration, now: Instant) -> Duration {
        let failures = self.entries.get(&target).map_or(0, |(n, _)| *n) + 1;
        let delay = interval
            .saturating_mul(1u32 << failures.min(16))
            .min(MAX_BACKOFF);
        self.entries.insert(target, (failures, now + delay));
        delay
    }

    fn succeeded(&mut self, target: &PathBuf) {
        self.entries.remove(target);
    }
}

/// Checks all recorded targets every `interval`, forever. A round starts the checks of the
/// targets due and goes on at once: the pings and the next rounds do not wait for a slow
/// one, and a target whose check still runs is left out of them.
pub async fn run(manager: Arc<VolumeManager>, interval: Duration) {
    let mut backoff = Backoff::default();
    let mut ticker = tokio::time::interval(interval.min(MOUNTER_POLL));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut paused = false;
    let mut mounter: Option<String> = None;
    let mut exited: Option<u64> = None;
    let mut last_round: Option<Instant> = None;
    let mut checks = Checks::new();
    let mut checking: HashSet<PathBuf> = HashSet::new();
    loop {
        tokio::select! {
            Some(joined) = checks.join_next(), if !checks.is_empty() => {
                if let Ok((record, outcome)) = joined {
                    checking.remove(&record.target);
                    settle(&mut backoff, &record, outcome, interval);
                }
                continue;
            }
            _ = ticker.tick() => {}
        }
        let pulse = match manager.mounter_pulse().await {
            Err(e) => {
                if !paused {
                    tracing::error!(error = %e, "the mounter cannot be asked; volume checks paused until it answers");
                    paused = true;
                }
                continue;
            }
            Ok(pulse) => pulse,
        };
        let restarted = matches!((&mounter, &pulse.instance), (Some(a), Some(b)) if a != b);
        let ended = exited.is_some_and(|n| n != pulse.exited);
        let urgent = paused || restarted || ended;
        if paused {
            tracing::info!("the mounter answers again; checking every volume");
            paused = false;
        } else if restarted {
            tracing::warn!("the mounter restarted; checking every volume");
        } else if ended {
            tracing::info!("a keeper or daemon of this node ended; checking every volume");
        }
        mounter = pulse.instance.or(mounter);
        exited = Some(pulse.exited);
        let due = last_round.is_none_or(|at| at.elapsed() >= interval);
        if !(urgent || due) {
            continue;
        }
        last_round = Some(Instant::now());
        if urgent {
            backoff.entries.clear();
        }
        let records = match manager.store().list() {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "cannot list volume records");
                continue;
            }
        };
        let now = Instant::now();
        backoff
            .entries
            .retain(|t, _| records.iter().any(|r| &r.target == t));
        for record in records {
            if backoff.due(&record.target, now) && checking.insert(record.target.clone()) {
                spawn_check(&mut checks, &manager, record, false);
            }
        }
    }
}

/// Logs a finished check of `record` and updates its retry schedule.
fn settle(
    backoff: &mut Backoff,
    record: &VolumeRecord,
    outcome: Result<CheckOutcome, VolumeError>,
    interval: Duration,
) {
    let target = record.target.display();
    match outcome {
        Ok(CheckOutcome::Recovered(why)) => {
            backoff.succeeded(&record.target);
            tracing::warn!(volume_id = %record.volume_id, %target, reason = %why, "mount daemon was gone; remounted");
        }
        Ok(CheckOutcome::Foreign(fs)) => {
            tracing::warn!(volume_id = %record.volume_id, %target, fs_type = %fs, "target is covered by another mount")
        }
        Ok(_) => backoff.succeeded(&record.target),
        Err(e) => {
            let delay = backoff.failed(record.target.clone(), interval, Instant::now());
            tracing::error!(volume_id = %record.volume_id, %target, error = %e, retry_in = ?delay, "remount failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_caps() {
        let mut b = Backoff::default();
        let t = PathBuf::from("/t");
        let now = Instant::now();
        assert!(b.due(&t, now));
        let d1 = b.failed(t.clone(), Duration::from_secs(5), now);
        let d2 = b.failed(t.clone(), Duration::from_secs(5), now);
        assert!(d2 > d1);
        assert!(!b.due(&t, now));
        for _ in 0..20 {
            b.failed(t.clone(), Duration::from_secs(5), now);
        }
        assert_eq!(b.entries[&t].1, now + MAX_BACKOFF);
        b.succeeded(&t);
        assert!(b.due(&t, now));
    }
}
