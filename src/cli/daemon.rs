//! Running `riffle mount` in the background, and the readiness pipe.
//!
//! The parent creates a pipe, starts `riffle` again with the same arguments plus
//! `--foreground` in a new session (detached from the terminal, stdio on /dev/null, logs to a
//! file), hands it the pipe's write end through `RIFFLE_READY_FD`, and waits. The daemon writes
//! `OK` once the filesystem is mounted, or `ERR <kind> <reason>` and exits (the kind's
//! [`FailureKind::name`]), so the parent exits with the status of that kind. If the daemon dies without
//! a word the pipe closes and the parent says so; if nothing arrives within the start-up limit
//! the parent kills the daemon. Either way the parent never waits forever.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::failure::{self, fail, FailureKind};
use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

/// How long a daemon may take to mount before `riffle mount` gives up.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The default log file of a background mount.
pub fn default_log_file(mountpoint: &Path) -> PathBuf {
    let name: String = mountpoint
        .to_string_lossy()
        .trim_matches('/')
        .replace('/', "-");
    let name = if name.is_empty() { "root".into() } else { name };
    let dir = if nix::unistd::geteuid().is_root() {
        PathBuf::from("/var/log/riffle")
    } else if let Some(state) = std::env::var_os("XDG_STATE_HOME") {
        PathBuf::from(state).join("riffle")
    } else {
        let home = std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into());
        PathBuf::from(home).join(".local/state/riffle")
    };
    dir.join(format!("{name}.log"))
}

/// Starts the daemon and waits for its verdict.
/// `pass_log_file` adds `--log-file` for the daemon when the user did not give one.
pub fn spawn_and_wait(log_file: &Path, pass_log_file: bool) -> anyhow::Result<()> {
    let (read_end, write_end) = nix::unistd::pipe().context("cannot create a pipe")?;
    fcntl(read_end.as_fd(), FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
    let exe = std::env::current_exe().context("cannot find the riffle executable")?;
    let mut cmd = Command::new(exe);
    cmd.args(std::env::args_os().skip(1)).arg("--foreground");
    if pass_log_file {
        cmd.arg("--log-file").arg(log_file);
    }
    cmd.env("RIFFLE_READY_FD", write_end.as_raw_fd().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: setsid is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("cannot start the riffle daemon")?;
    drop(write_end);
    let verdict = wait_verdict(read_end, START_TIMEOUT);
    match verdict {
        Ok(Some(msg)) if msg == "OK" => Ok(()),
        Ok(Some(msg)) => {
            let _ = child.wait();
            Err(failure_of(&msg))
        }
        Ok(None) => {
            let status = child.wait().ok();
            bail!(
                "the daemon exited during start-up ({}); see {}",
                status.map_or("unknown status".into(), |s| s.to_string()),
                log_file.display()
            )
        }
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(e)
        }
    }
}

/// The failure a readiness line other than `OK` reports: `ERR <kind> <reason>`.
fn failure_of(line: &str) -> anyhow::Error {
    let text = line.strip_prefix("ERR ").unwrap_or(line);
    match text.split_once(' ') {
        Some((word, reason)) => match FailureKind::from_name(word) {
            Some(kind) => fail(kind, reason),
            None => fail(FailureKind::Failed, text),
        },
        None => fail(FailureKind::Failed, text),
    }
}

/// Reads one line from the pipe; `None` if it closed without one.
fn wait_verdict(fd: OwnedFd, timeout: Duration) -> anyhow::Result<Option<String>> {
    let deadline = Instant::now() + timeout;
    let mut file = File::from(fd);
    let mut buf = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!(
                "the mount did not become ready within {} s",
                timeout.as_secs()
            );
        }
        let ms = PollTimeout::try_from(left.as_millis().min(i32::MAX as u128) as i32)
            .unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(file.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, ms) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e).context("waiting for the daemon"),
        }
        let mut chunk = [0u8; 4096];
        let n = file.read(&mut chunk)?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(pos) = buf.iter().position(|&b| b == b'\n') {
            return Ok(Some(String::from_utf8_lossy(&buf[..pos]).into_owned()));
        }
    }
}

/// The daemon's side of the pipe.
pub struct Readiness {
    pipe: Option<File>,
}

impl Readiness {
    /// Takes the pipe handed down by `spawn_and_wait`, if any.
    pub fn from_fd(fd: Option<i32>) -> Self {
        let pipe = fd.filter(|fd| *fd > 2).map(|fd| {
            // SAFETY: the fd was opened by our parent for exactly this purpose and is used once.
            unsafe { File::from_raw_fd(fd) }
        });
        Readiness { pipe }
    }

    pub fn is_daemon(&self) -> bool {
        self.pipe.is_some()
    }

    pub fn ready(&mut self) {
        self.send("OK");
    }

    /// Reports a failure of kind [`FailureKind::Failed`].
    pub fn failed(&mut self, reason: &str) {
        self.send_failure(FailureKind::Failed, reason);
    }

    /// Reports `e` with its kind, which the parent's exit status tells.
    pub fn failed_with(&mut self, e: &anyhow::Error) {
        self.send_failure(failure::kind_of(e), &super::one_line(e));
    }

    fn send_failure(&mut self, kind: FailureKind, reason: &str) {
        self.send(&format!("ERR {} {reason}", kind.name()));
    }

    fn send(&mut self, line: &str) {
        if let Some(mut pipe) = self.pipe.take() {
            let _ = writeln!(pipe, "{}", line.replace('\n', " "));
        }
    }
}
