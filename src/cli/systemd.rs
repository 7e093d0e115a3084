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

/// The `--fd-store` value that means systemd's store.
pub const FD_STORE: &str = "systemd";

/// The names the bundle's descriptors have in systemd's store (`FDNAME=`), in protocol order:
/// systemd passes stored descriptors back in an order of its own, so each has a name.
const NAMES: [&str; 3] = ["riffle-fuse", "riffle-nodes", "riffle-handles"];

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

    /// The bundle systemd passed this process at start (`LISTEN_FDS`, named [`NAMES`]), in
    /// protocol order; empty when it passed none (or not all of it). Descriptors of other
    /// names are left alone.
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

    /// Gives systemd the bundle to keep, each descriptor under its name.
    pub fn give(&self, bundle: &[BorrowedFd<'_>]) -> Result<(), SystemdError> {
        for (fd, name) in bundle.iter().zip(NAMES) {
            notify(&self.addr, &format!("FDSTORE=1\nFDNAME={name}\n"), &[*fd])?;
        }
        Ok(())
    }

    /// Tells systemd to forget the bundle (the mount ended).
    pub fn forget(&self) {
        for name in NAMES {
            let state = format!("FDSTOREREMOVE=1\nFDNAME={name}\n");
            if let Err(e) = notify(&self.addr, &state, &[]) {
                tracing::warn!(error = %e, "cannot tell systemd to forget the mount's connection");
            }
        }
    }
}

/// The descriptor numbers of the bundle among those passed to this process, in protocol
/// order, from the values of `LISTEN_PID`, `LISTEN_FDS` and `LISTEN_FDNAMES`; `None` unless
/// all of it was passed, once.
fn passed(pid: Option<&str>, count: Option<&str>, names: Option<&str>) -> Option<Vec<RawFd>> {
    let for_us = pid.and_then(|p| p.parse::<u32>().ok()) == Some(std::process::id());
    let count: usize = count.and_then(|n| n.parse().ok()).unwrap_or(0);
    if !for_us || count == 0 {
        return None;
    }
    let names: Vec<&str> = names.unwrap_or_default().split(':').take(count).collect();
    NAMES
        .iter()
        .map(|wanted| {
            let mut at = names.iter().enumerate().filter(|(_, n)| *n == wanted);
            match (at.next(), at.next()) {
                (Some((i, _)), None) => Some(LISTEN_FDS_START + i as RawFd),
                _ => None,
            }
        })
        .collect()
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

    /// The bundle reaches a notification socket in systemd's format, with its descriptors.
    #[test]
    fn the_bundle_reaches_the_notification_socket() {
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
            let mut space = nix::cmsg_space!([RawFd; 3]);
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
        let files: Vec<OwnedFd> = (0..3)
            .map(|_| OwnedFd::from(std::fs::File::open("/dev/null").unwrap()))
            .collect();
        let bundle: Vec<BorrowedFd> = files.iter().map(|f| f.as_fd()).collect();
        store.give(&bundle).unwrap();
        for name in NAMES {
            assert_eq!(receive(), (format!("FDSTORE=1\nFDNAME={name}\n"), 1));
        }
        store.forget();
        for name in NAMES {
            assert_eq!(receive(), (format!("FDSTOREREMOVE=1\nFDNAME={name}\n"), 0));
        }
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
