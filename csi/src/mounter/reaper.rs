//! Reaping the riffle processes that end under this one, and counting them.
//!
//! `riffle mount` forks its keeper and exits once the mount is live, so keepers, and a
//! daemon whose keeper died, are orphans. This process makes itself their *child subreaper*
//! (`PR_SET_CHILD_SUBREAPER`): orphans of its descendants become its children rather than
//! PID 1's, so when one ends this process is told (`SIGCHLD`), reaps it (no zombies, also
//! when it is PID 1 of its container without an init) and counts it. The count goes to the
//! plugin with every ping ([`exited`]): a change tells the supervisor at once that a volume
//! may have lost its keeper or daemon, instead of at its next round.
//!
//! The children this process starts itself (`riffle mount`, `riffle unmount`) are waited for
//! by tokio, which must find them unreaped: they are spawned through [`spawn`], which keeps
//! their pids in a registry that the reaper leaves alone until their [`Owned`] guard drops.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Pids of children that tokio waits for.
static OWNED: Mutex<Option<HashSet<i32>>> = Mutex::new(None);

/// Children reaped so far.
static EXITED: AtomicU64 = AtomicU64::new(0);

/// How often the children are looked at even without a `SIGCHLD` (none is lost: each scan
/// reaps every child that has ended).
const SCAN_EVERY: Duration = Duration::from_secs(5);

/// A child that tokio waits for; the reaper leaves it alone while this lives.
pub struct Owned(i32);

impl Drop for Owned {
    fn drop(&mut self) {
        if let Some(owned) = OWNED.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            owned.remove(&self.0);
        }
    }
}

/// Spawns `cmd`, keeping the child out of the reaper's way until the guard drops (after
/// tokio has waited for it).
pub fn spawn(cmd: &mut tokio::process::Command) -> std::io::Result<(tokio::process::Child, Owned)> {
    let mut owned = OWNED.lock().unwrap_or_else(|p| p.into_inner());
    let child = cmd.spawn()?;
    let pid = child.id().map_or(0, |pid| pid as i32);
    owned.get_or_insert_with(HashSet::new).insert(pid);
    Ok((child, Owned(pid)))
}

/// How many children the reaper has reaped.
pub fn exited() -> u64 {
    EXITED.load(Ordering::Relaxed)
}

/// Becomes the subreaper of this process's descendants and reaps them as they end, on the
/// tokio runtime this is called in.
pub fn start() -> std::io::Result<()> {
    // SAFETY: a plain prctl with an integer argument.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut child_signals = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())?;
    tokio::spawn(async move {
        loop {
            let _ = tokio::time::timeout(SCAN_EVERY, child_signals.recv()).await;
            let reaped = reap();
            if reaped > 0 {
                EXITED.fetch_add(reaped, Ordering::Relaxed);
                tracing::debug!(reaped, "reaped ended riffle processes");
            }
        }
    });
    Ok(())
}

/// Reaps every ended child that tokio does not wait for; how many.
fn reap() -> u64 {
    let me = std::process::id() as i32;
    let Ok(all) = procfs::process::all_processes() else {
        return 0;
    };
    let owned = OWNED.lock().unwrap_or_else(|p| p.into_inner());
    let mut reaped = 0;
    for process in all.flatten() {
        let Ok(stat) = process.stat() else { continue };
        let ours = stat.ppid == me && stat.state == 'Z';
        if !ours || owned.as_ref().is_some_and(|o| o.contains(&stat.pid)) {
            continue;
        }
        let pid = nix::unistd::Pid::from_raw(stat.pid);
        if let Ok(status) = nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG))
        {
            if status != nix::sys::wait::WaitStatus::StillAlive {
                tracing::info!(pid = stat.pid, name = %stat.comm, ?status, "a riffle process of this node ended");
                reaped += 1;
            }
        }
    }
    reaped
}
