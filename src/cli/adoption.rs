//! A daemon whose keeper died gets a new one (`riffle mount --restart`).
//!
//! The keeper is the daemon's parent and holds a copy of its FUSE connection so that a crash
//! of the daemon costs no read (`cli::keeper`). When the keeper itself dies (a SIGKILL, an OOM
//! kill of the wrong process), the daemon is still serving, and is the only one that may: it
//! holds the connection's serving lock (`fs::handover::serving`). It learns of the death at
//! once, because the keeper's end of their socket closes, and then:
//! 1. starts a new keeper, this program again with the daemon's own arguments and
//!    `RIFFLE_ADOPT_FD` (an *adopter*, in a session of its own), and gives it the bundle with
//!    `HOLD`, waiting for its answer;
//! 2. on `OK` (the adopter holds the connection and, with an fd store, the mount's lease
//!    there, and has written the pid file) serves on and watches the new keeper the same way;
//! 3. on a refusal (another keeper took the mount over from the fd store meanwhile: its
//!    successor waits for this daemon's serving lock), stops at once: the process exits
//!    without unmounting, the kernel releases the lock, and that successor serves the requests
//!    this one had read but not answered (they are resent). Readers wait; none fails.
//!
//! If no adopter can be started (or it dies before answering): with an fd store, which holds
//! the connection and whose keepers' supervisor takes it over, the daemon stops as in 3;
//! without one the daemon is the connection's only holder, so it keeps serving and tries
//! again [`ATTEMPTS`] times with a growing pause, then serves on without a keeper (logged: a
//! crash of it then ends the mount). Requests are never read by two processes at once, and a
//! keeper kill, like a daemon kill, costs no read.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::fs::handover::protocol::{self, ProtocolError};

/// Adopters started without an answer before a daemon without an fd store gives up.
pub const ATTEMPTS: u32 = 5;

/// The exit status of a daemon that stopped so that another keeper's successor serves.
pub const YIELDED: i32 = 75;

/// What the daemon needs to hand itself to a new keeper.
pub struct Adoptable {
    /// This daemon's end of its keeper's socket.
    pub keeper: OwnedFd,
    /// Copies of the bundle, in protocol order (`fuse`, nodes, handles, `fuse`'s clones).
    pub bundle: Vec<OwnedFd>,
    /// Whether an fd store also holds the connection (`--fd-store`).
    pub with_store: bool,
}

/// Watches the keeper on a thread of its own for as long as the daemon runs.
pub fn watch(adoptable: Adoptable) {
    let spawned = std::thread::Builder::new()
        .name("riffle-keeper-watch".into())
        .spawn(move || run(adoptable));
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot watch the keeper; if it dies, this daemon runs without one");
    }
}

fn run(adoptable: Adoptable) {
    let Adoptable {
        mut keeper,
        bundle,
        with_store,
    } = adoptable;
    let mut adopter: Option<Child> = None;
    loop {
        // The keeper never speaks first: this returns when its end closes (it died).
        while protocol::recv(keeper.as_fd()).is_ok() {}
        if let Some(mut dead) = adopter.take() {
            // Reap it: it was this daemon's child.
            let _ = dead.wait();
        }
        tracing::warn!("the keeper of this daemon died; starting a new one");
        let mut failures = 0;
        loop {
            match adopt_once(&bundle) {
                Ok((socket, child)) => {
                    tracing::info!(
                        keeper = child.id(),
                        "a new keeper holds the connection: a crash of this daemon costs no read"
                    );
                    keeper = socket;
                    adopter = Some(child);
                    break;
                }
                Err(AdoptError::Refused(reason)) => stop(&reason),
                Err(AdoptError::Failed(reason)) if with_store => stop(&format!(
                    "no new keeper ({reason}); the fd store holds the connection for the next"
                )),
                Err(AdoptError::Failed(reason)) => {
                    failures += 1;
                    if failures >= ATTEMPTS {
                        tracing::error!(
                            reason,
                            "no new keeper after {ATTEMPTS} attempts; serving on without one: a crash of this daemon will end the mount"
                        );
                        return;
                    }
                    let pause = Duration::from_millis(200 << failures);
                    tracing::warn!(reason, ?pause, "could not start a new keeper; trying again");
                    std::thread::sleep(pause);
                }
            }
        }
    }
}

#[derive(Debug)]
enum AdoptError {
    /// The adopter said no: another keeper holds the mount.
    Refused(String),
    /// No adopter could be started, or it ended before answering.
    Failed(String),
}

/// Starts an adopter and hands it the bundle; its socket and process on success.
fn adopt_once(bundle: &[OwnedFd]) -> Result<(OwnedFd, Child), AdoptError> {
    let failed = |what: &str, e: &dyn std::fmt::Display| AdoptError::Failed(format!("{what}: {e}"));
    let (ours, theirs) = protocol::pair().map_err(|e| failed("socket", &e))?;
    let program = super::keeper::program().map_err(|e| failed("program", &e))?;
    let mut cmd = Command::new(program);
    cmd.args(std::env::args_os().skip(1))
        .env("RIFFLE_ADOPT_FD", theirs.as_raw_fd().to_string())
        .env_remove("RIFFLE_KEEPER_FD")
        .env_remove("RIFFLE_RESUME")
        .env_remove("RIFFLE_READY_FD")
        .stdin(Stdio::null());
    let inherit = theirs.as_raw_fd();
    // SAFETY: setsid and fcntl are async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            // Its own session: a signal to this daemon's group does not reach its keeper.
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            let flags = libc::fcntl(inherit, libc::F_GETFD);
            if flags < 0 || libc::fcntl(inherit, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| failed("cannot start a keeper", &e))?;
    drop(theirs);
    let fds: Vec<_> = bundle.iter().map(|fd| fd.as_fd()).collect();
    match protocol::hold(ours.as_fd(), None, &fds) {
        Ok(()) => Ok((ours, child)),
        Err(e) => {
            let _ = child.wait();
            Err(match e {
                ProtocolError::Refused(reason) => AdoptError::Refused(reason),
                ProtocolError::Busy => AdoptError::Refused("another keeper holds the mount".into()),
                other => AdoptError::Failed(other.to_string()),
            })
        }
    }
}

/// Stops serving now, so that the keeper that holds the mount has its successor serve:
/// exits without unmounting (the kernel then releases this daemon's serving lock).
fn stop(reason: &str) -> ! {
    tracing::error!(
        reason,
        "this daemon stops serving: another daemon takes the connection over (readers wait, none fails)"
    );
    // SAFETY: _exit ends the process at once; no destructor may unmount the live mount.
    unsafe { libc::_exit(YIELDED) }
}
