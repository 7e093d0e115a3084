//! Running `riffle mount` in the background, and the readiness pipe.
//!
//! The parent creates a pipe, starts `riffle` again with the same arguments plus
//! `--foreground` in a new session (detached from the terminal, stdio on /dev/null, logs to a
//! file), hands it the pipe's write end through `RIFFLE_READY_FD`, and waits. The daemon writes
//! `OK` once the filesystem is mounted, or `ERR <kind> <reason>` and exits (the kind's
//! [`FailureKind::name`]), so the parent exits with the status of that kind. If the daemon dies without
//! a word the pipe closes and the parent says so; if nothing arrives within the start-up limit
//! the parent kills the daemon. Either way the parent never waits forever.
//!
//! Under a keeper (`--restart`) the process started is the keeper, and its daemons report
//! through it ([`Readiness::relay`]): each gets a pipe of its own, whose `OK` the keeper
//! passes on at once. A daemon that dies without a word, or says `ERR`, while the keeper
//! holds the connection (a take-over from the fd store holds it before any daemon runs) is
//! replaced as any crash is, and the parent hears its successor's verdict, or the keeper's
//! when it gives up (the last daemon's `ERR`, so the exit status tells the same kind).

use std::fs::File;
use std::io::{BufRead, Read, Write};
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
    /// Takes the pipe handed down by `spawn_and_wait`, if any. The descriptor is closed on
    /// exec from here on: a process this one starts must not hold the pipe open, or the
    /// parent would wait on it after this process died without a word.
    pub fn from_fd(fd: Option<i32>) -> Self {
        let pipe = fd.filter(|fd| *fd > 2).map(|fd| {
            // SAFETY: the fd was opened by our parent for exactly this purpose and is used once.
            let file = unsafe { File::from_raw_fd(fd) };
            let _ = fcntl(file.as_fd(), FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC));
            file
        });
        Readiness { pipe }
    }

    /// Whether the verdict is still to be sent.
    pub fn pending(&self) -> bool {
        self.pipe.is_some()
    }

    /// Lets a child report in this one's place (the keeper's daemons): a fresh pipe whose
    /// write end the child inherits, read by a thread that passes an `OK` on at once. An
    /// `ERR` line, or the child's end closing without a word, is kept back and the pipe
    /// returned by [`Relay::finish`], so that a successor may still mount; what `riffle
    /// mount` hears is then the successor's verdict, or the keeper's own when it gives up.
    /// Without a pending verdict the relay is idle: no pipe, and the child reports nothing.
    pub fn relay(&mut self) -> anyhow::Result<Relay> {
        let pending = std::mem::replace(self, Readiness::from_fd(None));
        if !pending.pending() {
            return Ok(Relay {
                child_end: None,
                reading: None,
            });
        }
        let (read_end, write_end) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .context("cannot create the daemon's readiness pipe")?;
        let reading = std::thread::Builder::new()
            .name("riffle-ready".into())
            .spawn(move || relay_verdict(read_end, pending))
            .context("cannot start the readiness thread")?;
        Ok(Relay {
            child_end: Some(write_end),
            reading: Some(reading),
        })
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

    /// Passes on a verdict line a child sent (`ERR <kind> <reason>`), kind and all.
    pub fn pass_on(&mut self, line: &str) {
        self.send(line);
    }

    fn send(&mut self, line: &str) {
        if let Some(mut pipe) = self.pipe.take() {
            let _ = writeln!(pipe, "{}", line.replace('\n', " "));
        }
    }
}

/// A child's readiness pipe, relayed to `riffle mount` (see [`Readiness::relay`]).
pub struct Relay {
    /// The end the child writes; closed here once the child is started.
    child_end: Option<OwnedFd>,
    reading: Option<std::thread::JoinHandle<(Readiness, Option<String>)>>,
}

impl Relay {
    /// The descriptor the child inherits (open across exec only in the child: its pre-exec
    /// hook clears close-on-exec), to name in its `RIFFLE_READY_FD`; none when idle.
    pub fn child_fd(&self) -> Option<i32> {
        self.child_end.as_ref().map(|fd| fd.as_raw_fd())
    }

    /// The child is started (or failed to start): this process's copy of its end is closed,
    /// so the pipe ends when the child does.
    pub fn started(&mut self) {
        self.child_end = None;
    }

    /// Waits for the relay's end, once the child has exited: the verdict still to be sent
    /// (none if the child's `OK` went on), and the `ERR` line the child sent, if any.
    pub fn finish(mut self) -> (Readiness, Option<String>) {
        self.started();
        match self.reading.take().map(|t| t.join()) {
            Some(Ok(outcome)) => outcome,
            _ => (Readiness::from_fd(None), None),
        }
    }
}

/// Reads the child's verdict line; passes `OK` on, keeps anything else back.
fn relay_verdict(read_end: OwnedFd, mut pending: Readiness) -> (Readiness, Option<String>) {
    let mut line = Vec::new();
    // A read error counts as silence, as the pipe's end does.
    let _ = std::io::BufReader::new(File::from(read_end)).read_until(b'\n', &mut line);
    let line = String::from_utf8_lossy(&line);
    let text = line.trim_end_matches('\n');
    if text == "OK" {
        pending.ready();
        return (pending, None);
    }
    (pending, Some(text.to_string()).filter(|t| !t.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::IntoRawFd;

    /// A pipe standing in for `riffle mount`'s: the readiness holding its write end, and the
    /// read end.
    fn parent_pipe() -> (Readiness, File) {
        let (read_end, write_end) = nix::unistd::pipe().expect("pipe");
        (
            Readiness::from_fd(Some(write_end.into_raw_fd())),
            File::from(read_end),
        )
    }

    /// What a child holding the relay's end writes, the child then exiting.
    fn child_says(relay: &mut Relay, line: Option<&str>) {
        let fd = relay.child_fd().expect("a pending relay has a child end");
        // SAFETY: `fd` is the relay's open child end, closed only by `started` below.
        let end = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let mut child = File::from(nix::unistd::dup(end).expect("dup"));
        relay.started();
        if let Some(line) = line {
            writeln!(child, "{line}").expect("write");
        }
    }

    fn everything(mut parent: File) -> String {
        let mut text = String::new();
        parent.read_to_string(&mut text).expect("read");
        text
    }

    #[test]
    fn a_childs_ok_reaches_the_parent() {
        let (mut readiness, parent) = parent_pipe();
        let mut relay = readiness.relay().expect("relay");
        child_says(&mut relay, Some("OK"));
        let (pending, refused) = relay.finish();
        assert!(!pending.pending() && refused.is_none());
        drop((readiness, pending));
        assert_eq!(everything(parent), "OK\n");
    }

    #[test]
    fn an_err_or_silence_is_kept_for_a_successor() {
        let (mut readiness, parent) = parent_pipe();
        let mut relay = readiness.relay().expect("relay");
        child_says(
            &mut relay,
            Some("ERR unreachable the endpoint did not answer"),
        );
        let (mut pending, refused) = relay.finish();
        assert!(pending.pending(), "the verdict is still to be sent");
        assert_eq!(
            refused.as_deref(),
            Some("ERR unreachable the endpoint did not answer")
        );
        // A successor that dies without a word: still pending, nothing refused.
        let mut relay = pending.relay().expect("relay");
        child_says(&mut relay, None);
        let (mut pending, refused) = relay.finish();
        assert!(pending.pending() && refused.is_none());
        // The keeper gives up with the first daemon's line.
        pending.pass_on("ERR unreachable the endpoint did not answer");
        drop((readiness, pending));
        assert_eq!(
            everything(parent),
            "ERR unreachable the endpoint did not answer\n"
        );
    }

    #[test]
    fn without_a_pending_verdict_the_relay_is_idle() {
        let mut relay = Readiness::from_fd(None).relay().expect("relay");
        assert!(relay.child_fd().is_none());
        relay.started();
        let (pending, refused) = relay.finish();
        assert!(!pending.pending() && refused.is_none());
    }
}
