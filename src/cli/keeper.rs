//! `riffle mount --restart`: the keeper, a small parent that keeps the mount alive across
//! crashes of its daemon.
//!
//! The keeper starts the daemon (this same program and arguments, with a keeper socket in
//! `RIFFLE_KEEPER_FD`) and waits. Once the daemon's FUSE connection is initialised, the
//! daemon gives the keeper a copy of its `/dev/fuse` descriptors (the first and the clones its
//! other FUSE threads read) with the state a successor needs (`fs::handover`: the INIT parameters, the node journal and the handle table). While
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
//!
//! **A keeper that dies** leaves its daemon serving: the daemon starts a new keeper for itself
//! (`cli::adoption`) with `RIFFLE_ADOPT_FD`, and gives it the bundle (`HOLD`). That keeper, an
//! *adopter*, first takes the mount's lease in the fd store when there is one (`HOLD KEY`; a
//! `BUSY` answer means another keeper took the mount over from the store meanwhile: the
//! adopter refuses, and the daemon stops serving so that the other keeper's successor can),
//! then writes the pid file and answers `OK`. It learns of the daemon's end when the daemon's
//! end of their socket closes, and from then on is an ordinary keeper: a live connection gets
//! a successor. Only the process that holds the connection's serving lock
//! (`fs::handover::serving`) reads requests, so whatever dies in whatever order, no two
//! daemons serve one connection. The pid file is written only by a keeper that holds the
//! mount (after its lease in the store), so it always names the live keeper.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use parking_lot::Mutex;

use super::args::MountArgs;
use super::daemon::Readiness;
use super::systemd::{self, SystemdStore};
use super::{fail, FailureKind};
use crate::fs::handover::protocol::{self, Holder, Message, ProtocolError};

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
pub(super) fn program() -> anyhow::Result<std::path::PathBuf> {
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
        super::logging::append_line(path, "WARN", &format!("riffle keeper: {line}"));
    }
}

/// The name keepers show in `ps` and `/proc/PID/comm`, so that an operator (and a test)
/// tells a volume's keeper from its daemon.
pub const PROCESS_NAME: &str = "riffle-keeper";

/// Runs the keeper until the mount ends; see the module documentation.
pub fn run(args: &MountArgs) -> anyhow::Result<()> {
    let log = args.log_file.as_deref();
    let mut readiness = Readiness::from_fd(args.ready_fd);
    name_this_process(PROCESS_NAME);
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
    let holder = Arc::new(Mutex::new(Holder::default()));
    if let Some(fd) = args.adopt_fd {
        return adopt(args, fd, &holder);
    }
    let opened = match &args.fd_store {
        Some(path) if path.as_os_str() == systemd::FD_STORE => {
            SystemdLink::open(args.take_over, &holder, log).map(Store::Systemd)
        }
        Some(socket) => StoreLink::open(socket, &args.mountpoint, args.take_over, &holder, log)
            .map(Store::Riffle),
        None => Ok(Store::None),
    };
    let store = match opened {
        Ok(store) => store,
        Err(e) => {
            note(log, &super::one_line(&e));
            readiness.failed_with(&e);
            return Err(e);
        }
    };
    // The pid file names the keeper: it lives as long as the mount, and a stop signal sent to
    // it reaches the daemon (the daemon under a keeper writes none). Written once this keeper
    // holds the mount (above: the store's lease), so a keeper refused the mount never names
    // itself in place of the one that holds it.
    if let Err(reason) = write_pid_file(args) {
        readiness.failed(&reason);
        bail!("{reason}");
    }
    let result = keep(&holder, &store, &mut readiness, log, 0);
    finish(args, &store);
    result
}

/// Where a copy of the mount's connection is kept beside this keeper (`--fd-store`).
enum Store {
    None,
    /// `riffle fd-store` at a socket.
    Riffle(StoreLink),
    /// systemd's descriptor store (`--fd-store systemd`).
    Systemd(SystemdLink),
}

impl Store {
    /// Whether the mount was taken from the store (its first daemon resumes).
    fn took(&self) -> bool {
        match self {
            Store::None => false,
            Store::Riffle(link) => link.took,
            Store::Systemd(link) => link.took,
        }
    }
}

/// What a keeper does once its mount ended or was given up.
fn finish(args: &MountArgs, store: &Store) {
    // The mount ended (or was given up): its copy in the store must not keep it alive.
    match store {
        Store::None => {}
        Store::Riffle(link) => link.drop_key(),
        Store::Systemd(link) => link.store.forget(link.held.load(Ordering::Relaxed)),
    }
    if let Some(pid_file) = &args.pid_file {
        let _ = std::fs::remove_file(pid_file);
    }
}

/// The keeper's side of systemd's descriptor store (see `cli::systemd`).
struct SystemdLink {
    store: SystemdStore,
    /// Whether systemd passed the live mount's bundle to this keeper.
    took: bool,
    /// Descriptors of the bundle systemd holds: passed at start, or given since.
    held: Arc<std::sync::atomic::AtomicUsize>,
}

impl SystemdLink {
    /// Takes the bundle systemd passed at start, if it is of a live connection; then gives
    /// systemd the keeper's bundle once it holds one (a first daemon's).
    fn open(
        take_over_only: bool,
        holder: &Arc<Mutex<Holder>>,
        log: Option<&std::path::Path>,
    ) -> anyhow::Result<SystemdLink> {
        let store = SystemdStore::open()?;
        let passed = store.take();
        let live = protocol::is_bundle(passed.len())
            && passed
                .first()
                .is_some_and(|fuse| !protocol::connection_gone(fuse.as_fd()));
        if !passed.is_empty() && !live {
            // A mount that ended while no keeper ran (or a bundle of another shape).
            store.forget(passed.len());
        }
        if !live && take_over_only {
            return Err(fail(
                FailureKind::NothingToTakeOver,
                "--take-over: systemd passed no live connection; nothing was mounted",
            ));
        }
        if live {
            let held = Arc::new(std::sync::atomic::AtomicUsize::new(passed.len()));
            let mut holder = holder.lock();
            holder.answer(0, Message::Hold(None), passed);
            holder.disconnected(0);
            note(log, "took the mount over from systemd's fd store");
            return Ok(SystemdLink {
                store,
                took: true,
                held,
            });
        }
        let link = SystemdLink {
            store,
            took: false,
            held: Arc::default(),
        };
        let (holder, log_file) = (holder.clone(), log.map(|p| p.to_path_buf()));
        let held = link.held.clone();
        let give = SystemdStore::open()?;
        let spawned = std::thread::Builder::new()
            .name("riffle-keeper-systemd".into())
            .spawn(move || {
                let bundle = loop {
                    match holder.lock().copies() {
                        Some(bundle) => break bundle,
                        None => std::thread::sleep(Duration::from_millis(50)),
                    }
                };
                let fds: Vec<_> = bundle.iter().map(|fd| fd.as_fd()).collect();
                held.store(fds.len(), Ordering::Relaxed);
                match give.give(&fds) {
                    Ok(()) => note(
                        log_file.as_deref(),
                        "systemd's fd store holds a copy of the connection",
                    ),
                    Err(e) => note(log_file.as_deref(), &format!("{e}")),
                }
            });
        if let Err(e) = spawned {
            note(log, &format!("cannot start the systemd store thread: {e}"));
        }
        Ok(link)
    }
}

/// Writes the pid file whole or not at all (a new file renamed over the old): a reader sees
/// the previous keeper's pid or this one's, never an empty file.
fn write_pid_file(args: &MountArgs) -> Result<(), String> {
    let Some(pid_file) = &args.pid_file else {
        return Ok(());
    };
    let mut partial = pid_file.as_os_str().to_owned();
    partial.push(".new");
    let partial = PathBuf::from(partial);
    std::fs::write(&partial, format!("{}\n", std::process::id()))
        .and_then(|()| std::fs::rename(&partial, pid_file))
        .map_err(|e| format!("cannot write pid file {}: {e}", pid_file.display()))
}

/// Sets this process's name (its main thread's, as `ps` shows it).
fn name_this_process(name: &str) {
    if let Ok(name) = std::ffi::CString::new(name) {
        // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes (longer ones
        // are cut by the kernel); `name` lives across the call.
        unsafe {
            libc::prctl(libc::PR_SET_NAME, name.as_ptr());
        }
    }
}

/// The client id the adopted daemon has in the adopter's [`Holder`].
const ADOPTED: u64 = 1;

/// The adopter: keeps the daemon that started it (its keeper died), then its successors.
fn adopt(args: &MountArgs, fd: i32, holder: &Arc<Mutex<Holder>>) -> anyhow::Result<()> {
    let log = args.log_file.as_deref();
    anyhow::ensure!(
        fd > 2,
        "RIFFLE_ADOPT_FD must name an inherited socket, not {fd}"
    );
    // SAFETY: the daemon handed this descriptor down for exactly this use; taken once.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let daemon = nix::sys::socket::getsockopt(&socket, nix::sys::socket::sockopt::PeerCredentials)
        .context("cannot identify the daemon to adopt")?
        .pid();
    DAEMON_PID.store(daemon, Ordering::Relaxed);
    let (message, fds) = protocol::recv(socket.as_fd()).context("the daemon gave no bundle")?;
    let (reply, _) = holder.lock().answer(ADOPTED, message, fds);
    if reply != Message::Ok {
        let _ = protocol::send(socket.as_fd(), &reply, &[]);
        bail!("the daemon's bundle was refused: {reply:?}");
    }
    let store = match &args.fd_store {
        // Under systemd a daemon whose keeper died stops (`cli::adoption`): systemd holds the
        // connection and starts the next keeper.
        Some(path) if path.as_os_str() == systemd::FD_STORE => {
            bail!("a daemon under systemd is not adopted")
        }
        Some(path) => match StoreLink::adopt(path, &args.mountpoint, holder, log) {
            Ok(link) => Store::Riffle(link),
            Err(e) => {
                let reason = super::one_line(&e);
                note(log, &format!("cannot adopt daemon {daemon}: {reason}"));
                let _ = protocol::send(socket.as_fd(), &Message::Err(reason), &[]);
                return Err(e);
            }
        },
        None => Store::None,
    };
    if let Err(reason) = write_pid_file(args) {
        // The daemon serves on under this keeper all the same; a missing pid file only
        // hides the keeper from whoever stops the mount by it.
        note(log, &reason);
    }
    protocol::send(socket.as_fd(), &Message::Ok, &[]).context("the daemon to adopt is gone")?;
    note(
        log,
        &format!("adopted daemon {daemon}, whose keeper died; a crash of it costs no read"),
    );
    // Until the daemon's end of the socket closes, which it does only by ending.
    answer(&socket, holder, ADOPTED);
    DAEMON_PID.store(0, Ordering::Relaxed);
    let result = if connection_alive(holder) {
        note(
            log,
            &format!(
                "the adopted daemon {daemon} ended; starting a successor to take the mount over"
            ),
        );
        keep(holder, &store, &mut Readiness::from_fd(None), log, 1)
    } else {
        Ok(())
    };
    finish(args, &store);
    result
}

/// The keeper's link to an fd store (`--fd-store`, see `cli::fd_store`).
struct StoreLink {
    socket: std::path::PathBuf,
    key: String,
    /// Whether the mount was taken from the store (its first daemon resumes).
    took: bool,
    /// A copy of the connection on which this keeper holds the mount's lease, while it does.
    lease: Arc<Mutex<Option<OwnedFd>>>,
}

impl StoreLink {
    /// Connects to the store and takes the mount's bundle if the store holds one; then keeps
    /// giving the store a copy of the keeper's bundle (again after the store restarts). With
    /// `take_over_only`, a store that holds no live connection for the mountpoint (or cannot
    /// be asked) is an error: the caller wanted that mount, not a new one.
    fn open(
        socket: &std::path::Path,
        mountpoint: &std::path::Path,
        take_over_only: bool,
        holder: &Arc<Mutex<Holder>>,
        log: Option<&std::path::Path>,
    ) -> anyhow::Result<StoreLink> {
        let (absolute, mut link) = StoreLink::new(socket, mountpoint);
        let message = |why: &str| {
            format!(
                "--take-over: the fd store {} {why} for {}; nothing was mounted",
                socket.display(),
                absolute.display()
            )
        };
        // The store's word that no live connection is kept: mounting afresh is right.
        let nothing_to_take = |why: &str| fail(FailureKind::NothingToTakeOver, message(why));
        // No answer: a connection may still be kept, so nothing may mount over it.
        let no_answer = |why: &str| anyhow::anyhow!(message(why));
        let lease = match protocol::connect(socket) {
            Ok(conn) => match take_waiting_for_a_dead_lease(&conn, &link.key, take_over_only) {
                Ok(fds)
                    if fds
                        .first()
                        .is_some_and(|fuse| protocol::connection_gone(fuse.as_fd())) =>
                {
                    // A mount that ended while no keeper ran: forget it, mount afresh.
                    protocol::drop_key(conn.as_fd(), &link.key);
                    if take_over_only {
                        return Err(nothing_to_take("held a connection that has ended"));
                    }
                    Some(conn)
                }
                Ok(fds) => {
                    let mut holder = holder.lock();
                    holder.answer(0, Message::Hold(None), fds);
                    holder.disconnected(0);
                    link.took = true;
                    note(log, "took the mount over from the fd store");
                    Some(conn)
                }
                Err(ProtocolError::Nothing) if take_over_only => {
                    return Err(nothing_to_take("holds no connection"))
                }
                // A mount afresh: a mountpoint with a live mount on it is refused anyway.
                Err(ProtocolError::Nothing | ProtocolError::Starting) => Some(conn),
                Err(ProtocolError::Busy) => bail!(
                    "another keeper serves {} (the fd store lent it its connection)",
                    absolute.display()
                ),
                Err(e) if take_over_only => return Err(no_answer(&format!("failed ({e})"))),
                Err(e) => {
                    note(log, &format!("fd store {}: {e}", socket.display()));
                    None
                }
            },
            Err(e) if take_over_only => return Err(no_answer(&format!("is unreachable ({e})"))),
            Err(e) => {
                note(
                    log,
                    &format!(
                        "fd store {} unreachable ({e}); will retry",
                        socket.display()
                    ),
                );
                None
            }
        };
        link.mirror(lease, false, holder.clone(), log.map(|p| p.to_path_buf()));
        Ok(link)
    }

    /// The link of the mount at `mountpoint` (its absolute path, which names it in the store).
    fn new(socket: &std::path::Path, mountpoint: &std::path::Path) -> (PathBuf, StoreLink) {
        use sha2::Digest;
        let absolute = std::path::absolute(mountpoint).unwrap_or(mountpoint.to_path_buf());
        let digest = sha2::Sha256::digest(absolute.as_os_str().as_encoded_bytes());
        let key: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        let link = StoreLink {
            socket: socket.to_path_buf(),
            key,
            took: false,
            lease: Arc::default(),
        };
        (absolute, link)
    }

    /// An adopter's link: gives the store the adopted daemon's bundle and takes the mount's
    /// lease. Refused (`BUSY`) when another keeper holds the lease: it took the mount over
    /// from the store while this adopter was starting, and its daemon is to serve. A store
    /// that cannot be asked is asked again in the background, as by every keeper.
    fn adopt(
        socket: &std::path::Path,
        mountpoint: &std::path::Path,
        holder: &Arc<Mutex<Holder>>,
        log: Option<&std::path::Path>,
    ) -> anyhow::Result<StoreLink> {
        let (absolute, link) = StoreLink::new(socket, mountpoint);
        let lease = match protocol::connect(socket) {
            Ok(conn) => {
                let bundle = holder
                    .lock()
                    .copies()
                    .context("cannot copy the adopted bundle")?;
                let fds: Vec<_> = bundle.iter().map(|fd| fd.as_fd()).collect();
                match hold_waiting_for_a_dead_lease(&conn, &link.key, &fds) {
                    Ok(()) => {
                        note(log, "the fd store holds a copy of the connection");
                        Some(conn)
                    }
                    Err(ProtocolError::Busy) => bail!(
                        "another keeper took {} over from the fd store {}",
                        absolute.display(),
                        socket.display()
                    ),
                    Err(e) => {
                        note(
                            log,
                            &format!("fd store {}: {e}; will retry", socket.display()),
                        );
                        None
                    }
                }
            }
            Err(e) => {
                note(
                    log,
                    &format!(
                        "fd store {} unreachable ({e}); will retry",
                        socket.display()
                    ),
                );
                None
            }
        };
        link.mirror(lease, true, holder.clone(), log.map(|p| p.to_path_buf()));
        Ok(link)
    }

    /// Keeps a copy of the bundle in the store, on connection `lease` (or a new one), and
    /// gives it again whenever the store comes back. `held`: `lease` holds it already (the
    /// adopter gave it).
    fn mirror(
        &self,
        lease: Option<OwnedFd>,
        held: bool,
        holder: Arc<Mutex<Holder>>,
        log: Option<std::path::PathBuf>,
    ) {
        let (socket, key, shared) = (self.socket.clone(), self.key.clone(), self.lease.clone());
        let (mut holding, mut fresh) = if held { (lease, None) } else { (None, lease) };
        let spawned = std::thread::Builder::new()
            .name("riffle-keeper-store".into())
            .spawn(move || {
                let mut pause = STORE_RETRY_FIRST;
                loop {
                    let link = match holding.take() {
                        Some(link) => Some(link),
                        None => match give(&socket, &key, &holder, fresh.take(), log.as_deref()) {
                            Err(ProtocolError::Busy) => step_aside(log.as_deref()),
                            given => given.ok(),
                        },
                    };
                    let linked = link.is_some();
                    if let Some(link) = link {
                        *shared.lock() = link.try_clone().ok();
                        // Holds the lease until the store goes away (answers to a drop on it
                        // too).
                        while protocol::recv(link.as_fd()).is_ok() {}
                        *shared.lock() = None;
                        pause = STORE_RETRY_FIRST;
                    }
                    std::thread::sleep(pause);
                    if !linked {
                        pause = (pause * 2).min(STORE_RETRY_LAST);
                    }
                }
            });
        if let Err(e) = spawned {
            eprintln!("riffle keeper: cannot start the fd store thread: {e}");
        }
    }

    /// Tells the store the mount ended: on the lease's connection while this keeper holds
    /// one (the store takes a drop only from the lease holder; the mirror thread reads its
    /// answer), else on a new one.
    fn drop_key(&self) {
        if let Some(lease) = self.lease.lock().take() {
            let _ = protocol::send(lease.as_fd(), &Message::Drop(self.key.clone()), &[]);
        } else if let Ok(conn) = protocol::connect(&self.socket) {
            protocol::drop_key(conn.as_fd(), &self.key);
        }
    }
}

/// Gives the store a copy of the bundle of mount `key` (once the keeper holds one), on `conn`
/// or a new connection; the connection, now holding the lease, or why not (`Busy`: another
/// keeper holds the mount there).
fn give(
    socket: &std::path::Path,
    key: &str,
    holder: &Mutex<Holder>,
    conn: Option<OwnedFd>,
    log: Option<&std::path::Path>,
) -> Result<OwnedFd, ProtocolError> {
    let bundle = loop {
        match holder.lock().copies() {
            Some(bundle) => break bundle,
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let link = match conn {
        Some(link) => link,
        None => protocol::connect(socket)?,
    };
    let fds: Vec<_> = bundle.iter().map(|fd| fd.as_fd()).collect();
    match hold_waiting_for_a_dead_lease(&link, key, &fds) {
        Ok(()) => {
            note(log, "the fd store holds a copy of the connection");
            Ok(link)
        }
        Err(e) => {
            note(log, &format!("fd store: {e}"));
            Err(e)
        }
    }
}

/// This keeper lost the mount to another keeper that the store holds it for (it took the
/// mount over while this one was without a lease, e.g. while the store restarted): one
/// keeper per mount, so this one ends, and its daemon with it, at once. The other's
/// successor then serves (it waits for the serving lock this daemon holds) and answers the
/// requests this daemon had read again; the store's copy and the pid file are the other's.
fn step_aside(log: Option<&std::path::Path>) -> ! {
    let daemon = DAEMON_PID.load(Ordering::Relaxed);
    note(
        log,
        &format!(
            "another keeper holds this mount in the fd store; this keeper stops (with its daemon {daemon}) so that the other's serves"
        ),
    );
    if daemon > 0 {
        // SAFETY: a plain kill of this keeper's daemon.
        unsafe {
            libc::kill(daemon, libc::SIGKILL);
        }
    }
    // SAFETY: _exit ends the process at once: nothing may drop the store's copy on the way.
    unsafe { libc::_exit(1) }
}

/// How long a keeper waits for the store to notice that the keeper before it died (its
/// lease ends when the store sees its socket close), or for a store that just started to hear
/// from the live keepers (longer than [`protocol::STORE_SETTLES`]).
const DEAD_LEASE_WAIT: Duration = Duration::from_secs(10);

/// How soon a keeper gives a restarted fd store its copy, then how far apart its tries grow
/// while the store stays away. Until the copy is given, the keeper and its daemon are the
/// connection's only holders, so the first try comes soon (a store container restarts in
/// tens of milliseconds); the tries then back off to one a second (each failed one is a line
/// in the log).
const STORE_RETRY_FIRST: Duration = Duration::from_millis(100);
const STORE_RETRY_LAST: Duration = Duration::from_secs(1);
const _: () = assert!(DEAD_LEASE_WAIT.as_secs() > protocol::STORE_SETTLES.as_secs());

/// Takes mount `key` from the store; while another keeper's lease holds it, asks again for up
/// to [`DEAD_LEASE_WAIT`] (a keeper killed a moment ago may not have been noticed yet). A
/// `take_over` also waits out a store too young to say it holds none; a mount afresh does not
/// (its mountpoint check refuses a live mount anyway).
fn take_waiting_for_a_dead_lease(
    conn: &OwnedFd,
    key: &str,
    take_over: bool,
) -> Result<Vec<OwnedFd>, ProtocolError> {
    let deadline = Instant::now() + DEAD_LEASE_WAIT;
    loop {
        match protocol::take(conn.as_fd(), Some(key)) {
            Err(ProtocolError::Busy) if Instant::now() < deadline => {}
            Err(ProtocolError::Starting) if take_over && Instant::now() < deadline => {}
            other => return other,
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Gives the store the bundle of mount `key`; while another keeper's lease holds it, asks
/// again for up to [`DEAD_LEASE_WAIT`] (that keeper may have died a moment ago), then `Busy`.
fn hold_waiting_for_a_dead_lease(
    conn: &OwnedFd,
    key: &str,
    bundle: &[std::os::fd::BorrowedFd<'_>],
) -> Result<(), ProtocolError> {
    let deadline = Instant::now() + DEAD_LEASE_WAIT;
    loop {
        match protocol::hold(conn.as_fd(), Some(key), bundle) {
            Err(ProtocolError::Busy) if Instant::now() < deadline => {}
            other => return other,
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Starts daemons until the mount ends; `generation`: daemons that served before (an
/// adopter's first daemon is a successor).
fn keep(
    holder: &Arc<Mutex<Holder>>,
    store: &Store,
    readiness: &mut Readiness,
    log: Option<&std::path::Path>,
    mut generation: u64,
) -> anyhow::Result<()> {
    let mut failures = 0u32;
    // The last `ERR` a daemon sent while `riffle mount` still waits for a verdict: passed on
    // only when the keeper gives up, since a successor may still mount.
    let mut refusal: Option<String> = None;
    loop {
        generation += 1;
        let resume = generation > 1 || store.took();
        let started = Instant::now();
        let (status, refused) = run_daemon(holder, generation, resume, readiness)?;
        refusal = refused.or(refusal);
        DAEMON_PID.store(0, Ordering::Relaxed);
        if status.success() {
            return Ok(());
        }
        let how = describe(&status);
        let held = holder.lock().is_holding();
        if !held {
            // The first daemon failed before its connection existed: it said why (readiness
            // pipe, log); nothing to keep.
            let why = format!("the riffle daemon {how} before mounting");
            give_up(readiness, refusal, &why);
            bail!("{why}");
        }
        if !connection_alive(holder) {
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
            let why = format!(
                "the riffle daemon {how}; {MAX_FAILED_STARTS} successors in a row failed, \
                 giving the mount up (readers now get ENOTCONN)"
            );
            give_up(readiness, refusal, &why);
            bail!("{why}");
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

/// Tells `riffle mount`, if it still waits, why the keeper gives up: the last daemon's own
/// `ERR` (its kind sets the exit status), else `why`.
fn give_up(readiness: &mut Readiness, refusal: Option<String>, why: &str) {
    match refusal {
        Some(line) => readiness.pass_on(&line),
        None => readiness.failed(why),
    }
}

/// Starts one daemon, answers its keeper socket, and waits for it to exit; with it, the
/// `ERR` line it sent while `riffle mount` waited for a verdict.
///
/// While that verdict is pending, every daemon reports through the keeper
/// ([`Readiness::relay`]): the first daemon of a take-over can die before it says `OK` (the
/// connection is already the keeper's, from the store), and then its successor's `OK` is
/// the verdict. Were the first daemon's the only one, `riffle mount` would hear nothing and
/// wait on a keeper that serves on.
fn run_daemon(
    holder: &Arc<Mutex<Holder>>,
    generation: u64,
    resume: bool,
    readiness: &mut Readiness,
) -> anyhow::Result<(ExitStatus, Option<String>)> {
    let (ours, theirs) = protocol::pair().context("cannot create the keeper socket")?;
    let mut cmd = Command::new(program()?);
    cmd.args(std::env::args_os().skip(1));
    if !std::env::args_os().any(|a| a == "--foreground" || a == "-f") {
        cmd.arg("--foreground");
    }
    cmd.env("RIFFLE_KEEPER_FD", theirs.as_raw_fd().to_string())
        .env_remove("RIFFLE_ADOPT_FD");
    for passed in systemd::LISTEN_ENV {
        // systemd passed its descriptors to the keeper, not to its daemons.
        cmd.env_remove(passed);
    }
    if resume {
        cmd.env("RIFFLE_RESUME", "true");
    }
    if generation > 1 {
        cmd.stdin(Stdio::null());
    }
    let mut relay = readiness.relay()?;
    match relay.child_fd() {
        Some(fd) => cmd.env("RIFFLE_READY_FD", fd.to_string()),
        None => cmd.env_remove("RIFFLE_READY_FD"),
    };
    let inherit = [Some(theirs.as_raw_fd()), relay.child_fd()];
    // SAFETY: fcntl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            for fd in inherit.into_iter().flatten() {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let spawned = cmd.spawn();
    relay.started();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            let (mut pending, _) = relay.finish();
            pending.failed(&format!("cannot start the riffle daemon: {e}"));
            return Err(e).context("cannot start the riffle daemon");
        }
    };
    DAEMON_PID.store(child.id() as i32, Ordering::Relaxed);
    drop(theirs);
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
    let (pending, refused) = relay.finish();
    *readiness = pending;
    Ok((status, refused))
}

/// Answers the daemon's messages until its socket closes.
fn answer(socket: &OwnedFd, holder: &Mutex<Holder>, client: u64) {
    let served = protocol::serve_client(socket.as_fd(), |message, fds| {
        holder.lock().answer(client, message, fds)
    });
    if let Err(e) = served {
        eprintln!("riffle keeper: {e}");
    }
    holder.lock().disconnected(client);
}

/// Whether the held FUSE connection still exists.
fn connection_alive(holder: &Mutex<Holder>) -> bool {
    holder
        .lock()
        .fuse()
        .is_some_and(|fuse| !protocol::connection_gone(fuse))
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
