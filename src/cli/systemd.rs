//! systemd's side of a mount run as a service: readiness (`READY=1`) and systemd's file
//! descriptor store as the mount's fd store (`riffle mount --restart --fd-store systemd`).
//!
//! Under systemd the keeper is the unit's main process, and systemd stops the unit's other
//! processes when it dies, so a keeper of its own cannot be the last holder of the FUSE
//! connection there. systemd can: a unit with `FileDescriptorStoreMax=` keeps descriptors
//! its processes send it (`FDSTORE=1` on `$NOTIFY_SOCKET`, with `SCM_RIGHTS`) across
//! restarts of the service, and hands them to the next main process (`LISTEN_FDS`, named by
//! `LISTEN_FDNAMES`). So the keeper gives systemd the bundle once it holds it, and a keeper
//! that starts with the bundle in `LISTEN_FDS` takes the live mount over, as from `riffle
//! fd-store`. A daemon whose keeper died stops at once (`cli::adoption`), since systemd
//! holds the connection and restarts the keeper. The unit needs `KillMode=mixed` (the dying
//! keeper's daemon gets SIGKILL, never the SIGTERM that unmounts), `NotifyAccess=all` and
//! `Restart=`; `deploy/examples/riffle-dataset.service` has them.
//!
//! The protocol is systemd's `sd_notify(3)` and `sd_listen_fds(3)`: one datagram of
//! `KEY=VALUE` lines to the socket named by `NOTIFY_SOCKET` (a path, or `@name` for the
//! abstract namespace), and descriptors 3.. for the process whose pid is `LISTEN_PID`.

use std::io::IoSlice;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{
    sendmsg, socket, AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType, UnixAddr,
};

use crate::fs::handover::protocol;

/// The `--fd-store` value that means systemd's store.
pub const FD_STORE: &str = "systemd";

/// The names the bundle's first descriptors have in systemd's store (`FDNAME=`), in protocol
/// order: systemd passes stored descriptors back in an order of its own, so each has a name.
/// The clones of `/dev/fuse` that follow are [`clone_name`]s.
const NAMES: [&str; protocol::BASE_FDS] = ["riffle-fuse", "riffle-nodes", "riffle-handles"];

/// The name of the bundle's `n`th clone of `/dev/fuse` (from 1) in systemd's store.
fn clone_name(n: usize) -> String {
    format!("riffle-fuse-clone-{n}")
}

/// The name of the bundle's descriptor at `index` (protocol order) in systemd's store.
fn name_at(index: usize) -> String {
    match NAMES.get(index) {
        Some(name) => (*name).to_string(),
        None => clone_name(index + 1 - protocol::BASE_FDS),
    }
}

/// The first descriptor systemd passes (`SD_LISTEN_FDS_START`).
const LISTEN_FDS_START: RawFd = 3;

#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    #[error("--fd-store systemd needs systemd's notification socket (NOTIFY_SOCKET): run the mount as a systemd service with NotifyAccess=all and FileDescriptorStoreMax=")]
    NoNotifySocket,
    #[error("systemd's notification socket {0}: {1}")]
    Notify(String, nix::Error),
}

/// The notification socket named by `NOTIFY_SOCKET` (a path, or `@name`), if set.
fn notify_address() -> Option<Result<UnixAddr, SystemdError>> {
    let path = std::env::var_os("NOTIFY_SOCKET")?;
    let shown = path.to_string_lossy().into_owned();
    let bytes = path.as_encoded_bytes();
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => UnixAddr::new_abstract(name),
        None => UnixAddr::new(bytes),
    };
    Some(addr.map_err(|e| SystemdError::Notify(shown, e)))
}

/// Sends `state` (lines of `KEY=VALUE`) with `fds` to the notification socket `addr`.
fn notify(addr: &UnixAddr, state: &str, fds: &[BorrowedFd<'_>]) -> Result<(), SystemdError> {
    let failed = |e| SystemdError::Notify(format!("{addr}"), e);
    let sock = socket(
        AddressFamily::Unix,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(failed)?;
    let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let rights = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage] = if raw.is_empty() { &[] } else { &rights };
    sendmsg(
        sock.as_raw_fd(),
        &[IoSlice::new(state.as_bytes())],
        cmsgs,
        MsgFlags::empty(),
        Some(addr),
    )
    .map_err(failed)?;
    Ok(())
}

/// Tells a service manager, if there is one, that the mount serves (`Type=notify` units
/// start their dependents then). Every daemon says it, a successor too.
pub fn ready() {
    if let Some(addr) = notify_address() {
        if let Err(e) = addr.and_then(|addr| notify(&addr, "READY=1\n", &[])) {
            tracing::warn!(error = %e, "cannot tell systemd the mount is ready");
        }
    }
}

/// systemd's store, as a keeper uses it.
pub struct SystemdStore {
    addr: UnixAddr,
}

impl SystemdStore {
    /// The store of the service this keeper is the main process of.
    pub fn open() -> Result<SystemdStore, SystemdError> {
        match notify_address() {
            Some(addr) => Ok(SystemdStore { addr: addr? }),
            None => Err(SystemdError::NoNotifySocket),
        }
    }

    /// The bundle systemd passed this process at start (`LISTEN_FDS`, named [`NAMES`] and
    /// then [`clone_name`]s), in protocol order; empty when it passed none (or not all of its
    /// first three). Descriptors of other names are left alone.
    pub fn take(&self) -> Vec<OwnedFd> {
        let var = |name| std::env::var(name).ok();
        let Some(numbers) = passed(
            var("LISTEN_PID").as_deref(),
            var("LISTEN_FDS").as_deref(),
            var("LISTEN_FDNAMES").as_deref(),
        ) else {
            return Vec::new();
        };
        numbers
            .into_iter()
            .filter_map(|fd| {
                // The passed descriptors are inherited without close-on-exec: no daemon may
                // inherit them unasked.
                nix::fcntl::fcntl(
                    // SAFETY: a descriptor number systemd passed this process; only borrowed
                    // for the flag change.
                    unsafe { BorrowedFd::borrow_raw(fd) },
                    nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
                )
                .ok()?;
                // SAFETY: systemd passed descriptor `fd` to this process (LISTEN_PID is ours)
                // and nothing else owns it.
                Some(unsafe { OwnedFd::from_raw_fd(fd) })
            })
            .collect()
    }

    /// Gives systemd the bundle to keep, each descriptor under its name. systemd keeps at most
    /// `FileDescriptorStoreMax=` of them (systemd 254+ says how many in `$FDSTORE`): the
    /// unit needs `--fuse-threads` + 2, or the clones beyond die with the keeper and daemon.
    pub fn give(&self, bundle: &[BorrowedFd<'_>]) -> Result<(), SystemdError> {
        let room = std::env::var("FDSTORE")
            .ok()
            .and_then(|n| n.parse::<usize>().ok());
        if let Some(room) = room.filter(|room| *room < bundle.len()) {
            tracing::warn!(
                room,
                bundle = bundle.len(),
                "FileDescriptorStoreMax= is smaller than the bundle (--fuse-threads + 2): the requests in flight on the clones systemd cannot keep fail if keeper and daemon die together"
            );
        }
        for (index, fd) in bundle.iter().enumerate() {
            let name = name_at(index);
            notify(&self.addr, &format!("FDSTORE=1\nFDNAME={name}\n"), &[*fd])?;
        }
        Ok(())
    }

    /// Tells systemd to forget the bundle of `count` descriptors (the mount ended); the three
    /// first at least (systemd ignores names it does not hold).
    pub fn forget(&self, count: usize) {
        for name in (0..count.max(protocol::BASE_FDS)).map(name_at) {
            let state = format!("FDSTOREREMOVE=1\nFDNAME={name}\n");
            if let Err(e) = notify(&self.addr, &state, &[]) {
                tracing::warn!(error = %e, "cannot tell systemd to forget the mount's connection");
            }
        }
    }
}

/// The descriptor numbers of the bundle among those passed to this process, in protocol
/// order, from the values of `LISTEN_PID`, `LISTEN_FDS` and `LISTEN_FDNAMES`: the first three
/// ([`NAMES`]), then the clones numbered from 1 up to the first one missing. `None` unless the
/// first three were passed, and unless every name taken was passed once.
fn passed(pid: Option<&str>, count: Option<&str>, names: Option<&str>) -> Option<Vec<RawFd>> {
    let for_us = pid.and_then(|p| p.parse::<u32>().ok()) == Some(std::process::id());
    let count: usize = count.and_then(|n| n.parse().ok()).unwrap_or(0);
    if !for_us || count == 0 {
        return None;
    }
    let names: Vec<&str> = names.unwrap_or_default().split(':').take(count).collect();
    // Where `wanted` was passed: `Some(None)` if not at all, `None` if more than once.
    let find = |wanted: &str| {
        let mut at = names.iter().enumerate().filter(|(_, n)| **n == wanted);
        match (at.next(), at.next()) {
            (Some((i, _)), None) => Some(Some(LISTEN_FDS_START + i as RawFd)),
            (None, _) => Some(None),
            _ => None,
        }
    };
    let mut bundle = NAMES
        .iter()
        .map(|wanted| find(wanted).flatten())
        .collect::<Option<Vec<RawFd>>>()?;
    for n in 1..=protocol::MAX_CLONES {
        match find(&clone_name(n))? {
            Some(fd) => bundle.push(fd),
            None => break,
        }
    }
    Some(bundle)
}

/// The environment variables of systemd's descriptor passing, which a keeper's daemons must
/// not inherit (they are the keeper's).
pub const LISTEN_ENV: [&str; 3] = ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"];

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{bind, recvmsg, ControlMessageOwned};
    use std::io::IoSliceMut;
    use std::os::fd::AsFd;

    /// The bundle reaches a notification socket in systemd's format, one descriptor per
    /// message, the clones under numbered names, and is forgotten under the same names.
    #[test]
    fn the_bundle_and_its_clones_are_stored_and_forgotten_under_their_names() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = socket(
            AddressFamily::Unix,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        let addr = UnixAddr::new(&path).unwrap();
        bind(listener.as_raw_fd(), &addr).unwrap();
        let receive = || {
            let mut buf = [0u8; 256];
            let mut space = nix::cmsg_space!([RawFd; 1]);
            let mut iov = [IoSliceMut::new(&mut buf)];
            let msg = recvmsg::<()>(
                listener.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::empty(),
            )
            .unwrap();
            let mut fds = 0;
            for c in msg.cmsgs().unwrap() {
                if let ControlMessageOwned::ScmRights(received) = c {
                    fds += received.len();
                    for fd in received {
                        // SAFETY: received just now, owned by nothing else.
                        drop(unsafe { OwnedFd::from_raw_fd(fd) });
                    }
                }
            }
            let bytes = msg.bytes;
            (String::from_utf8_lossy(&buf[..bytes]).into_owned(), fds)
        };
        let store = SystemdStore { addr };
        let files: Vec<OwnedFd> = (0..5)
            .map(|_| OwnedFd::from(std::fs::File::open("/dev/null").unwrap()))
            .collect();
        let bundle: Vec<BorrowedFd> = files.iter().map(|f| f.as_fd()).collect();
        store.give(&bundle).unwrap();
        let names = [
            "riffle-fuse",
            "riffle-nodes",
            "riffle-handles",
            "riffle-fuse-clone-1",
            "riffle-fuse-clone-2",
        ];
        for name in names {
            assert_eq!(receive(), (format!("FDSTORE=1\nFDNAME={name}\n"), 1));
        }
        store.forget(bundle.len());
        for name in names {
            assert_eq!(receive(), (format!("FDSTOREREMOVE=1\nFDNAME={name}\n"), 0));
        }
    }

    #[test]
    fn clones_come_back_after_the_first_three_up_to_the_first_missing() {
        let me = std::process::id().to_string();
        let names =
            "riffle-fuse-clone-2:other:riffle-handles:riffle-fuse:riffle-fuse-clone-1:riffle-nodes";
        assert_eq!(
            passed(Some(&me), Some("6"), Some(names)),
            Some(vec![6, 8, 5, 7, 3])
        );
        // Clone 2 without clone 1: the bundle stops before the gap.
        let gap = "riffle-fuse:riffle-nodes:riffle-handles:riffle-fuse-clone-2";
        assert_eq!(passed(Some(&me), Some("4"), Some(gap)), Some(vec![3, 4, 5]));
        // A clone passed twice: not this bundle.
        let twice =
            "riffle-fuse:riffle-nodes:riffle-handles:riffle-fuse-clone-1:riffle-fuse-clone-1";
        assert_eq!(passed(Some(&me), Some("5"), Some(twice)), None);
        // Clones without the first three: no bundle.
        assert_eq!(
            passed(Some(&me), Some("1"), Some("riffle-fuse-clone-1")),
            None
        );
    }

    #[test]
    fn the_bundle_is_put_back_in_order_by_name_and_only_whole() {
        let me = std::process::id().to_string();
        // systemd passes them in an order of its own, beside other descriptors.
        let names = "other:riffle-handles:riffle-fuse:riffle-nodes";
        assert_eq!(
            passed(Some(&me), Some("4"), Some(names)),
            Some(vec![5, 6, 4])
        );
        assert_eq!(passed(Some("1"), Some("4"), Some(names)), None);
        assert_eq!(passed(Some(&me), None, Some(names)), None);
        assert_eq!(passed(Some(&me), Some("3"), Some(names)), None);
        let twice = "riffle-fuse:riffle-nodes:riffle-handles:riffle-fuse";
        assert_eq!(passed(Some(&me), Some("4"), Some(twice)), None);
    }
}
