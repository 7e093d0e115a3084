//! The serving lock: at most one process reads requests from a FUSE connection, enforced by
//! the kernel.
//!
//! A connection's `/dev/fuse` descriptor is copied into several processes (the daemon, its
//! keeper, the fd store, a successor), and any of them could read requests from it. Two
//! readers would each answer the requests they happen to read, with file handles the other
//! does not know (`EBADF` on the next read). So reading is tied to a lock the kernel keeps:
//! an exclusive open-file-description lock (`F_OFD_SETLKW`) on the connection's handle table
//! (the memfd in every bundle, created once per connection; see [`super::handles`]).
//!
//! Each daemon opens its *own* description of that file (`/proc/self/fd/N`: a new open of the
//! memfd, close-on-exec, never sent to anyone) and locks it before it reads one request:
//! - the first daemon, right after it creates the table and before it mounts;
//! - a successor, after it took the bundle and before it serves (it waits while another
//!   process holds the lock).
//!
//! The keeper, the fd store and `SCM_RIGHTS` copies hold other descriptions of the file and
//! never lock it, so the lock belongs to exactly one daemon and the kernel releases it only
//! when that daemon's last descriptor of its description closes: when the process has exited
//! (a SIGKILL included). A successor therefore cannot start reading while its predecessor can
//! still read, whatever the timing of either's death.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::Duration;

/// Held for as long as this process may read the connection; never released before exit.
pub struct ServingLock {
    _description: OwnedFd,
}

#[derive(Debug, thiserror::Error)]
pub enum ServingError {
    #[error("cannot open the connection's lock file: {0}")]
    Open(std::io::Error),
    #[error("cannot lock the connection: {0}")]
    Lock(nix::Error),
    #[error(
        "another daemon still serves this FUSE connection after {0:?}; refusing to serve beside it"
    )]
    StillServed(Duration),
}

impl ServingLock {
    /// Takes the lock on the connection whose handle table is `table`, waiting up to `wait`
    /// while another process holds it (zero: do not wait).
    pub fn acquire(table: BorrowedFd<'_>, wait: Duration) -> Result<ServingLock, ServingError> {
        let description = reopen(table)?;
        if try_lock(description.as_fd())? {
            return Ok(ServingLock {
                _description: description,
            });
        }
        if wait.is_zero() {
            return Err(ServingError::StillServed(wait));
        }
        tracing::warn!(
            "another daemon still serves this FUSE connection; waiting for it to stop before serving"
        );
        // The blocking lock waits on a thread of its own, which owns the description, so
        // that the wait is bounded: after a timeout nobody receives it, and a lock the thread
        // takes later is released at once as its description closes.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("riffle-serving-lock".into())
            .spawn(move || {
                let taken = lock(description.as_fd(), true).map(|()| description);
                let _ = tx.send(taken);
            })
            .map_err(ServingError::Open)?;
        match rx.recv_timeout(wait) {
            Ok(Ok(description)) => Ok(ServingLock {
                _description: description,
            }),
            Ok(Err(e)) => Err(ServingError::Lock(e)),
            Err(_) => Err(ServingError::StillServed(wait)),
        }
    }

    /// Whether some process holds the lock on the connection of `table` now.
    #[cfg(test)]
    pub fn is_held(table: BorrowedFd<'_>) -> Result<bool, ServingError> {
        let description = reopen(table)?;
        let mut probe = whole_file(libc::F_WRLCK);
        nix::fcntl::fcntl(
            description.as_fd(),
            nix::fcntl::FcntlArg::F_OFD_GETLK(&mut probe),
        )
        .map_err(ServingError::Lock)?;
        Ok(probe.l_type != libc::F_UNLCK as libc::c_short)
    }
}

/// A new open file description of the file behind `fd` (for a memfd, a fresh open through
/// /proc reaches the same file), close-on-exec.
fn reopen(fd: BorrowedFd<'_>) -> Result<OwnedFd, ServingError> {
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map(OwnedFd::from)
        .map_err(ServingError::Open)
}

fn whole_file(kind: libc::c_int) -> libc::flock {
    // SAFETY: flock is plain data; all-zero is a valid value (start 0, length 0 = whole file).
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock
}

/// Locks the whole file through `description`; `wait`: block while another holds it.
fn lock(description: BorrowedFd<'_>, wait: bool) -> nix::Result<()> {
    let lock = whole_file(libc::F_WRLCK);
    loop {
        let arg = if wait {
            nix::fcntl::FcntlArg::F_OFD_SETLKW(&lock)
        } else {
            nix::fcntl::FcntlArg::F_OFD_SETLK(&lock)
        };
        match nix::fcntl::fcntl(description, arg) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => return other.map(|_| ()),
        }
    }
}

/// Takes the lock if it is free: false while another description holds it.
fn try_lock(description: BorrowedFd<'_>) -> Result<bool, ServingError> {
    match lock(description, false) {
        Ok(()) => Ok(true),
        Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) => Ok(false),
        Err(e) => Err(ServingError::Lock(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::handover::shared::Region;

    #[test]
    fn one_holder_at_a_time_and_free_again_when_it_closes() {
        let table = Region::create("riffle-serving-test", 1 << 20).unwrap();
        assert!(!ServingLock::is_held(table.fd()).unwrap());
        let first = ServingLock::acquire(table.fd(), Duration::ZERO).unwrap();
        assert!(ServingLock::is_held(table.fd()).unwrap());
        // A second description of the same connection (another daemon) cannot take it.
        assert!(matches!(
            ServingLock::acquire(table.fd(), Duration::ZERO),
            Err(ServingError::StillServed(_))
        ));
        // A copy of the descriptor (what a keeper or the store holds) is not the lock.
        let copy = table.fd().try_clone_to_owned().unwrap();
        drop(first);
        assert!(!ServingLock::is_held(copy.as_fd()).unwrap());
        let _second = ServingLock::acquire(copy.as_fd(), Duration::ZERO).unwrap();
    }

    #[test]
    fn a_bounded_wait_gives_up_and_holds_nothing_after() {
        let table = Region::create("riffle-serving-test", 1 << 20).unwrap();
        let first = ServingLock::acquire(table.fd(), Duration::ZERO).unwrap();
        assert!(matches!(
            ServingLock::acquire(table.fd(), Duration::from_millis(50)),
            Err(ServingError::StillServed(_))
        ));
        drop(first);
        // The given-up waiter may take the lock for an instant; it never keeps it.
        let _next = ServingLock::acquire(table.fd(), Duration::from_secs(60)).unwrap();
    }

    #[test]
    fn a_waiting_successor_serves_once_the_holder_is_gone() {
        let table = Region::create("riffle-serving-test", 1 << 20).unwrap();
        let first = ServingLock::acquire(table.fd(), Duration::ZERO).unwrap();
        std::thread::scope(|s| {
            let waiter = s.spawn(|| ServingLock::acquire(table.fd(), Duration::from_secs(60)));
            // The waiter cannot have it while the first holds it, whenever it asks.
            std::thread::sleep(Duration::from_millis(20));
            assert!(!waiter.is_finished());
            drop(first);
            assert!(waiter.join().unwrap().is_ok());
        });
    }

    /// The lock of a process that is SIGKILLed is released by the kernel, and not before:
    /// a forked child takes it, and the parent cannot until the child is dead.
    #[test]
    fn a_killed_holder_releases_it() {
        let table = Region::create("riffle-serving-test", 1 << 20).unwrap();
        let (ready_r, ready_w) = nix::unistd::pipe().unwrap();
        // SAFETY: the child only calls async-signal-safe functions (open, fcntl, write,
        // pause) before it is killed.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                let path =
                    std::ffi::CString::new(format!("/proc/self/fd/{}", table.fd().as_raw_fd()))
                        .unwrap();
                // SAFETY: async-signal-safe calls on a valid path and descriptors.
                unsafe {
                    let fd = libc::open(path.as_ptr(), libc::O_RDWR);
                    let lock = whole_file(libc::F_WRLCK);
                    let ok = fd >= 0 && libc::fcntl(fd, libc::F_OFD_SETLK, &lock) == 0;
                    libc::write(ready_w.as_raw_fd(), [u8::from(ok)].as_ptr().cast(), 1);
                    loop {
                        libc::pause();
                    }
                }
            }
            nix::unistd::ForkResult::Parent { child } => {
                drop(ready_w);
                let mut ok = [0u8];
                nix::unistd::read(&ready_r, &mut ok).unwrap();
                assert_eq!(ok[0], 1, "the child took the lock");
                assert!(ServingLock::is_held(table.fd()).unwrap());
                assert!(ServingLock::acquire(table.fd(), Duration::ZERO).is_err());
                nix::sys::signal::kill(child, nix::sys::signal::SIGKILL).unwrap();
                nix::sys::wait::waitpid(child, None).unwrap();
                assert!(ServingLock::acquire(table.fd(), Duration::ZERO).is_ok());
            }
        }
    }
}
