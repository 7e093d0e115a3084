//! `riffle mount --restart`: the keeper, a small parent that keeps the mount alive across
//! crashes of its daemon.
//!
//! The keeper starts the daemon (this same program and arguments, with a keeper socket in
//! `RIFFLE_KEEPER_FD`) and waits. Once the daemon's FUSE connection is initialised, the
//! daemon gives the keeper a copy of its `/dev/fuse` descriptor with the state a successor
//! needs (`fs::handover`: the INIT parameters, the node journal and the handle table). While
//! the keeper holds that copy, the kernel keeps the connection even when the daemon dies:
//! readers' requests wait instead of failing. When the daemon dies (a signal: SIGKILL, an
//! OOM kill, a panic's abort; or a non-zero exit), the keeper starts a successor with
//! `RIFFLE_RESUME=true`, which takes the bundle back over the socket (`TAKE`), rebuilds the
//! inodes and handles, asks the kernel to resend what the dead daemon had read but not
//! answered, and serves on. The cache on disk is reused, so nothing is fetched again.
//!
//! The daemon exiting 0 means the file system was unmounted (or stopped by SIGTERM): the
//! keeper exits 0. SIGTERM and SIGINT sent to the keeper are passed on to the daemon. SIGHUP
//! replaces the daemon: the keeper kills it and starts a successor from the program now at
//! its path, so installing a new `riffle` and sending SIGHUP upgrades a live mount. A
//! successor that fails is retried with a growing pause (0.1 s doubling to 5 s); after
//! [`MAX_FAILED_STARTS`] failures in a row, or when the connection is gone (unmounted while
//! no daemon ran), the keeper closes its copy, the kernel ends the connection, and readers
//! get `ENOTCONN` as they would without a keeper.
//!
//! The keeper allocates nothing per request and touches no data: its memory stays at a few
//! MiB whatever the daemon does, so an OOM kill picks the daemon, not the keeper (and the
//! keeper lowers its own `oom_score_adj` when it may).

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use parking_lot::Mutex;

use super::args::MountArgs;
use super::daemon::Readiness;
use crate::fs::handover::protocol::{self, Holder, ProtocolError};

/// Successive failed starts of a successor before the keeper gives up.
pub const MAX_FAILED_STARTS: u32 = 10;

/// A daemon that served at least this long counts as started (the failure count resets).
const STARTED_AFTER: Duration = Duration::from_secs(2);

/// The daemon's pid, for passing signals on (0: none running).
static DAEMON_PID: AtomicI32 = AtomicI32::new(0);

extern "C" fn pass_signal_on(signal: libc::c_int) {
    let pid = DAEMON_PID.load(Ordering::Relaxed);
    // SIGHUP: replace the daemon (an upgrade: the successor runs the program now installed
    // at the keeper's path). Killing it is safe: every request comes again to its successor.
    let signal = if signal == libc::SIGHUP {
        libc::SIGKILL
    } else {
        signal
    };
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

/// The program to start: this one, or what was installed at its path since it started (an
/// upgrade replaces the file, and the kernel then names the running one "PATH (deleted)").
fn program() -> anyhow::Result<std::path::PathBuf> {
    let exe = std::env::current_exe().context("cannot find the riffle executable")?;
    let text = exe.to_string_lossy();
    Ok(match text.strip_suffix(" (deleted)") {
        Some(installed) => std::path::PathBuf::from(installed),
        None => exe,
    })
}

/// Says something to the keeper's standard error and to the daemon's log file (where an
/// operator looks; a background keeper's standard error goes nowhere).
fn note(log_file: Option<&std::path::Path>, line: &str) {
    eprintln!("riffle keeper: {line}");
    if let Some(path) = log_file {
        use std::io::Write;
        if let Ok(mut file) = std::fs::OpenOptions::new().append(true).open(path) {
            let now = humantime::format_rfc3339_micros(std::time::SystemTime::now());
            let _ = writeln!(file, "{now}  WARN riffle keeper: {line}");
        }
    }
}

/// Runs the keeper until the mount ends; see the module documentation.
pub fn run(args: &MountArgs) -> anyhow::Result<()> {
    let log = args.log_file.as_deref();
    let mut readiness = Readiness::from_fd(args.ready_fd);
    for signal in [
        nix::sys::signal::SIGTERM,
        nix::sys::signal::SIGINT,
        nix::sys::signal::SIGHUP,
    ] {
        let action = nix::sys::signal::SigAction::new(
            nix::sys::signal::SigHandler::Handler(pass_signal_on),
            nix::sys::signal::SaFlags::SA_RESTART,
            nix::sys::signal::SigSet::empty(),
        );
        // SAFETY: the handler only reads an atomic and calls kill.
        unsafe { nix::sys::signal::sigaction(signal, &action) }
            .context("cannot set the keeper's signal handlers")?;
    }
    // The keeper should be the last process the OOM killer picks (root only may lower it).
    let _ = std::fs::write("/proc/self/oom_score_adj", "-999");
    // The pid file names the keeper: it lives as long as the mount, and a stop signal sent to
    // it reaches the daemon (the daemon under a keeper writes none).
    if let Some(pid_file) = &args.pid_file {
        if let Err(e) = std::fs::write(pid_file, format!("{}\n", std::process::id())) {
            let reason = format!("cannot write pid file {}: {e}", pid_file.display());
            readiness.failed(&reason);
            bail!("{reason}");
        }
    }
    let result = keep(&mut readiness, log);
    if let Some(pid_file) = &args.pid_file {
        let _ = std::fs::remove_file(pid_file);
    }
    result
}

/// Starts daemons until the mount ends.
fn keep(readiness: &mut Readiness, log: Option<&std::path::Path>) -> anyhow::Result<()> {
    let holder = Arc::new(Mutex::new(Holder::default()));
    let mut failures = 0u32;
    let mut generation = 0u64;
    loop {
        generation += 1;
        let resume = generation > 1;
        let started = Instant::now();
        let status = run_daemon(&holder, generation, resume, readiness)?;
        DAEMON_PID.store(0, Ordering::Relaxed);
        if status.success() {
            return Ok(());
        }
        let how = describe(&status);
        let held = holder.lock().is_holding();
        if !held {
            // The first daemon failed before its connection existed: it said why (readiness
            // pipe, log); nothing to keep.
            bail!("the riffle daemon {how} before mounting");
        }
        if !connection_alive(&holder) {
            note(
                log,
                &format!("the daemon {how} and the mount is gone; exiting"),
            );
            return Ok(());
        }
        if started.elapsed() >= STARTED_AFTER {
            failures = 0;
        }
        failures += 1;
        if failures > MAX_FAILED_STARTS {
            holder.lock().clear();
            note(log, &format!("the daemon {how}; giving the mount up"));
            bail!(
                "the riffle daemon {how}; {MAX_FAILED_STARTS} successors in a row failed, \
                 giving the mount up (readers now get ENOTCONN)"
            );
        }
        let pause = Duration::from_millis(100 * (1u64 << (failures - 1).min(6)))
            .min(Duration::from_secs(5));
        let attempt = if failures > 1 {
            format!(" (attempt {failures}, after {} ms)", pause.as_millis())
        } else {
            String::new()
        };
        note(
            log,
            &format!("the daemon {how}; starting a successor to take the mount over{attempt}"),
        );
        if failures > 1 {
            std::thread::sleep(pause);
        }
    }
}

/// Starts one daemon, answers its keeper socket, and waits for it to exit.
fn run_daemon(
    holder: &Arc<Mutex<Holder>>,
    generation: u64,
    resume: bool,
    readiness: &mut Readiness,
) -> anyhow::Result<ExitStatus> {
    let (ours, theirs) = protocol::pair().context("cannot create the keeper socket")?;
    let mut cmd = Command::new(program()?);
    cmd.args(std::env::args_os().skip(1));
    if !std::env::args_os().any(|a| a == "--foreground" || a == "-f") {
        cmd.arg("--foreground");
    }
    cmd.env("RIFFLE_KEEPER_FD", theirs.as_raw_fd().to_string());
    if resume {
        cmd.env("RIFFLE_RESUME", "true")
            .env_remove("RIFFLE_READY_FD");
        cmd.stdin(Stdio::null());
    }
    let inherit = theirs.as_raw_fd();
    // SAFETY: fcntl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let flags = libc::fcntl(inherit, libc::F_GETFD);
            if flags < 0 || libc::fcntl(inherit, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            readiness.failed(&format!("cannot start the riffle daemon: {e}"));
            return Err(e).context("cannot start the riffle daemon");
        }
    };
    DAEMON_PID.store(child.id() as i32, Ordering::Relaxed);
    drop(theirs);
    // The daemon reports readiness itself; the keeper's copy of the pipe must not keep it open.
    drop(std::mem::replace(readiness, Readiness::from_fd(None)));
    let answering = {
        let holder = holder.clone();
        std::thread::Builder::new()
            .name("riffle-keeper".into())
            .spawn(move || answer(&ours, &holder, generation))
            .context("cannot start the keeper thread")?
    };
    let status = child.wait().context("cannot wait for the riffle daemon")?;
    // The daemon's end is closed now, so the thread's next receive ends.
    let _ = answering.join();
    Ok(status)
}

/// Answers the daemon's messages until its socket closes.
fn answer(socket: &OwnedFd, holder: &Mutex<Holder>, client: u64) {
    loop {
        let (message, fds) = match protocol::recv(socket.as_fd()) {
            Ok(received) => received,
            Err(ProtocolError::Closed) => break,
            Err(e) => {
                eprintln!("riffle keeper: {e}");
                let _ = protocol::send(socket.as_fd(), &protocol::Message::Err(e.to_string()), &[]);
                break;
            }
        };
        let (reply, attach) = holder.lock().answer(client, message, fds);
        let attach: Vec<_> = attach.iter().map(|fd| fd.as_fd()).collect();
        if let Err(e) = protocol::send(socket.as_fd(), &reply, &attach) {
            eprintln!("riffle keeper: cannot answer the daemon: {e}");
            break;
        }
    }
    holder.lock().disconnected(client);
}

/// Whether the held FUSE connection still exists (the kernel reports an error on the
/// descriptor once it was unmounted or aborted).
fn connection_alive(holder: &Mutex<Holder>) -> bool {
    let holder = holder.lock();
    let Some(fuse) = holder.fuse() else {
        return false;
    };
    let mut fds = [PollFd::new(fuse, PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(_) => !fds[0].revents().is_some_and(|r| {
            r.intersects(PollFlags::POLLERR | PollFlags::POLLHUP | PollFlags::POLLNVAL)
        }),
        Err(_) => false,
    }
}

fn describe(status: &ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (_, Some(signal)) => {
            let name = nix::sys::signal::Signal::try_from(signal)
                .map_or_else(|_| signal.to_string(), |s| s.as_str().to_string());
            format!("was killed by {name}")
        }
        (Some(code), _) => format!("exited with status {code}"),
        _ => "ended".to_string(),
    }
}
