//! Mount daemon processes: identify, check, stop.
//!
//! A daemon is identified by its pid plus its start time from
//! /proc/PID/stat, so a pid that was reused by an unrelated process after the
//! daemon died is never mistaken for the daemon (and never signalled). A
//! zombie counts as dead: when the plugin is PID 1 of its container without
//! an init, exited daemons can linger as zombies (the image runs `tini` to
//! reap them).

use crate::mounter::DaemonId;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::path::Path;
use std::time::Duration;

/// The identity of a live (non-zombie) process, or None.
pub fn identify(pid: i32) -> Option<DaemonId> {
    let stat = procfs::process::Process::new(pid).ok()?.stat().ok()?;
    if matches!(stat.state, 'Z' | 'X' | 'x') {
        return None;
    }
    Some(DaemonId {
        pid,
        start_time: stat.starttime,
    })
}

/// Whether the process `id` still runs.
pub fn is_alive(id: DaemonId) -> bool {
    identify(id.pid) == Some(id)
}

/// Reads a pid file and identifies the live process named in it, if that process is the one
/// that writes this pid file (its arguments name it: `--pid-file=PATH`). A pid file outlives
/// its writer, and pids are reused (a new container starts them from 1 again), so a pid
/// alone could name another volume's keeper.
pub fn from_pid_file(path: &Path) -> Option<DaemonId> {
    let text = std::fs::read_to_string(path).ok()?;
    let pid: i32 = text.trim().parse().ok()?;
    if pid <= 1 {
        return None;
    }
    let id = identify(pid)?;
    writes_pid_file(pid, path).then_some(id)
}

/// Whether process `pid` was started with `--pid-file=PATH` (or `--pid-file PATH`).
fn writes_pid_file(pid: i32, path: &Path) -> bool {
    let Ok(argv) = procfs::process::Process::new(pid).and_then(|p| p.cmdline()) else {
        return false;
    };
    let path = path.to_string_lossy();
    let joined = format!("--pid-file={path}");
    argv.contains(&joined)
        || argv
            .windows(2)
            .any(|w| w[0] == "--pid-file" && w[1] == path.as_ref())
}

/// Waits up to `grace` for `id` to exit on its own, then sends SIGTERM and
/// waits up to `grace` again, then SIGKILL. Returns once it is gone.
pub async fn stop(id: DaemonId, grace: Duration) {
    if wait_exit(id, grace).await {
        return;
    }
    tracing::warn!(
        pid = id.pid,
        "mount daemon still running after unmount; sending SIGTERM"
    );
    signal(id, Signal::SIGTERM);
    if wait_exit(id, grace).await {
        return;
    }
    tracing::warn!(
        pid = id.pid,
        "mount daemon ignored SIGTERM; sending SIGKILL"
    );
    signal(id, Signal::SIGKILL);
    wait_exit(id, grace).await;
}

/// Signals `id` only if it is still that process.
pub fn signal(id: DaemonId, sig: Signal) {
    if is_alive(id) {
        if let Err(e) = kill(Pid::from_raw(id.pid), sig) {
            tracing::debug!(pid = id.pid, error = %e, "kill failed");
        }
    }
}

async fn wait_exit(id: DaemonId, limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if !is_alive(id) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifies_self_and_rejects_wrong_start_time() {
        let me = identify(std::process::id() as i32).expect("self is alive");
        assert!(is_alive(me));
        let other = DaemonId {
            start_time: me.start_time + 1,
            ..me
        };
        assert!(!is_alive(other));
    }

    #[tokio::test]
    async fn stop_kills_a_stubborn_child() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "trap '' TERM; sleep 30"])
            .spawn()
            .expect("spawn sh");
        let id = identify(child.id() as i32).expect("child alive");
        // Reap in the background so the child does not linger as a zombie.
        let reaper = std::thread::spawn(move || child.wait());
        stop(id, Duration::from_millis(200)).await;
        assert!(!is_alive(id));
        let _ = reaper.join();
    }

    #[test]
    fn pid_file_garbage_or_a_stranger_is_none() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("pid");
        std::fs::write(&p, "not a pid").expect("write");
        assert!(from_pid_file(&p).is_none());
        // A live process that does not write this pid file (a reused pid): not its writer.
        std::fs::write(&p, format!("{}\n", std::process::id())).expect("write");
        assert!(from_pid_file(&p).is_none());
        // One started with --pid-file=p is.
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg("sleep 30")
            .arg(format!("--pid-file={}", p.display()))
            .spawn()
            .expect("spawn sh");
        std::fs::write(&p, format!("{}\n", child.id())).expect("write");
        assert_eq!(from_pid_file(&p).map(|d| d.pid), Some(child.id() as i32));
        let _ = child.kill();
        let _ = child.wait();
    }
}
