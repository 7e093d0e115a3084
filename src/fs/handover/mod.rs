//! Handing a live FUSE connection to a successor daemon, so that a crash, an OOM kill or an
//! upgrade of the daemon costs no read.
//!
//! The kernel keeps a FUSE connection while any descriptor of its `/dev/fuse` file is open,
//! and while no daemon reads it, callers' requests wait instead of failing. So a copy of the
//! descriptor lives in a process that does not die with the daemon: the **keeper**
//! (`cli::keeper`, the small parent of a `riffle mount --restart` daemon). When the daemon
//! dies, the keeper starts a successor, which takes the descriptor back and serves the same
//! connection. Everything the successor must know to answer requests as its predecessor
//! would is kept beside the descriptor, in shared memory that survives the daemon:
//! - the **INIT parameters** ([`InitParams`]): the kernel sends `FUSE_INIT` once per
//!   connection, so the successor configures itself from what was negotiated then (notably
//!   whether passthrough is on) instead of from a handshake;
//! - the **node journal** ([`nodes`]): the kernel names files by the inode numbers it was
//!   given, and the successor rebuilds the same numbers for the same paths, without a
//!   request to the store (attributes are then asked again, as after a TTL);
//! - the **handle table** ([`handles`]): every open file handle with its object version and
//!   passthrough backing id, so a handle opened before the handover keeps reading the same
//!   version (or fails with EIO if it changed, never a blend), and new opens of an inode a
//!   passthrough handle still holds reuse that backing id.
//!
//! Requests the dead daemon had read but not answered stay on the kernel's processing list;
//! the successor asks the kernel to queue them again (`FUSE_NOTIFY_RESEND`, Linux 6.9+,
//! announced by `FUSE_HAS_RESEND` at INIT), and answers them like any other: every request of
//! a read-only file system may be answered twice-asked. A replayed request may have been
//! applied already (the predecessor died after applying it, before answering): a `RELEASE`
//! of a handle the successor does not know changes nothing (counting it would take another
//! handle of the inode out of the count, and an open could then get the mode the kernel
//! refuses beside that handle, EIO); an `OPEN` the predecessor recorded but never answered
//! stays recorded, a handle the kernel never got, which only keeps the inode in the mode it
//! had. The successor reads the journal and the table once it holds the serving lock: until
//! then its predecessor may still be answering (and recording).
//!
//! Each FUSE thread reads a descriptor of its own: the first, or one of its clones
//! (`FUSE_DEV_IOC_CLONE`, one per thread after the first, `--fuse-threads` in all). The
//! kernel keeps a request a thread has read on the processing list of the descriptor it was
//! read from, and ends that list with `ECONNABORTED` when the descriptor's file is released,
//! i.e. when its last holder closes it; the resend requeues the processing lists of every
//! descriptor of the connection still open (`fuse_resend`, `fc->devices`). So the daemon makes
//! its clones right after INIT, before any thread reads, and they travel in the bundle with
//! the first descriptor: every holder of the connection holds every clone, a daemon's death
//! releases none of them, and its successor serves on exactly those descriptors (fewer than
//! its `--fuse-threads` if the bundle carries fewer: the other threads share the first
//! descriptor; it never makes a clone of its own, which nothing else would hold). On a kernel
//! without resend, requests in flight at the crash wait until the connection ends: the
//! successor refuses to resume and the mount ends as it does without a keeper.
//!
//! The bundle (descriptor, journal, table, clones) moves between processes over a unix socket
//! with `SCM_RIGHTS`, in a line protocol with a version ([`protocol`]).
//!
//! ## One reader per connection, whatever dies
//! Several processes hold the descriptor, but only one may read requests from it: the one
//! holding the connection's **serving lock** ([`serving`]), an exclusive lock the kernel keeps
//! on the handle table's memfd and drops only when its holder has exited. A daemon takes it
//! before it reads one request and never gives it back; a successor waits for it. So no
//! instant has two readers, however deaths and starts interleave. Around that invariant, each
//! process's death is answered by another (`cli::keeper`, `cli::adoption`, the CSI plugin's
//! supervisor, `riffle fd-store`), and readers only ever wait:
//!
//! | dies | who notices, how | what follows |
//! |---|---|---|
//! | daemon | its keeper (`waitpid`) | the keeper starts a successor: `TAKE`, serving lock (free at the daemon's exit), `FUSE_NOTIFY_RESEND` |
//! | keeper | its daemon (the keeper's end of their socket closes) | the daemon starts a new keeper for itself and gives it the bundle (`HOLD`); that adopter takes the mount's lease in the fd store (or is refused, and the daemon exits so that the refusing store's keeper serves), writes the pid file, answers `OK` |
//! | keeper and daemon (the mounter's container) | the fd store (their sockets close); the plugin (the mounter restarted, or its reaper counted the deaths) | a take-over keeper (`riffle mount --take-over`) takes the bundle from the store (`TAKE KEY`) and starts a successor |
//! | fd store | every keeper (its lease connection closes) | each keeper gives the new store its bundle again; the store answers `STARTING`, never `NONE`, until they have had time to |
//! | an adopter or take-over keeper, while starting | its daemon (socket closes) or its launcher | the daemon tries again (with an fd store: stops, and the store's copy is taken over); the plugin retries the take-over |
//! | two keepers for one mount (a race) | the store: one `HOLD`/`TAKE` gets the lease, the other `BUSY` | the keeper without the lease stops with its daemon (`cli::keeper`'s `step_aside`); the lease holder's successor serves |
//!
//! What nothing survives: every holder of the descriptor dead at once (the mounter's
//! container and the fd store together, or a keeper and its daemon without a store): the
//! kernel ends the connection and readers get `ENOTCONN`, as after a node reboot.

pub mod handles;
pub mod nodes;
pub mod protocol;
pub mod serving;
pub mod shared;

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use fuser::{InitFlags, Version};
use serde::{Deserialize, Serialize};

pub use handles::{HandleRecord, HandleTable, TableError};
pub use nodes::NodeJournal;

/// What was negotiated at the connection's `FUSE_INIT`, saved for successors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitParams {
    /// The kernel's FUSE ABI (major, minor).
    pub abi: (u32, u32),
    /// Capabilities the kernel offered.
    pub offered: u64,
    /// Capabilities the daemon asked for; in force are `offered & requested`.
    pub requested: u64,
    /// The riffle version that made the connection.
    pub made_by: String,
}

impl InitParams {
    pub fn kernel_abi(&self) -> Version {
        Version(self.abi.0, self.abi.1)
    }

    /// Whether `flag` is in force on the connection.
    pub fn enabled(&self, flag: InitFlags) -> bool {
        InitFlags::from_bits_retain(self.offered & self.requested).contains(flag)
    }

    /// Whether the kernel can requeue requests a dead daemon had read (`FUSE_NOTIFY_RESEND`).
    pub fn kernel_resends(&self) -> bool {
        InitFlags::from_bits_retain(self.offered).contains(InitFlags::FUSE_HAS_RESEND)
    }
}

/// The state a daemon keeps for its successors (see the module documentation).
pub struct Handover {
    pub nodes: std::sync::Arc<NodeJournal>,
    pub handles: std::sync::Arc<HandleTable>,
}

/// What a successor takes over.
pub struct Resumed {
    pub fuse: OwnedFd,
    /// The clones of `fuse` its predecessor's threads read, to be read again (none in a
    /// bundle of an older build, or of a daemon with one thread).
    pub clones: Vec<OwnedFd>,
    pub nodes: std::sync::Arc<NodeJournal>,
    pub handles: std::sync::Arc<HandleTable>,
    pub params: InitParams,
}

#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    #[error(transparent)]
    Nodes(#[from] nodes::JournalError),
    #[error(transparent)]
    Handles(#[from] handles::TableError),
    #[error("INIT parameters: {0}")]
    Params(String),
    #[error(transparent)]
    Protocol(#[from] protocol::ProtocolError),
    #[error("cannot ask the kernel to resend requests: {0}")]
    Resend(std::io::Error),
}

impl Handover {
    pub fn create() -> Result<Handover, HandoverError> {
        Ok(Handover {
            nodes: std::sync::Arc::new(NodeJournal::create()?),
            handles: std::sync::Arc::new(HandleTable::create()?),
        })
    }

    /// Saves the INIT parameters (at the connection's first INIT).
    #[cfg(test)]
    pub fn save_params(&self, params: &InitParams) -> Result<(), HandoverError> {
        let json = serde_json::to_vec(params).map_err(|e| HandoverError::Params(e.to_string()))?;
        self.handles.set_params(&json)?;
        Ok(())
    }

    /// The descriptors to give the keeper, in protocol order: `fuse`, the journal, the
    /// table, then `fuse`'s clones.
    pub fn fds<'a>(&'a self, fuse: BorrowedFd<'a>, clones: &'a [OwnedFd]) -> Vec<BorrowedFd<'a>> {
        protocol::bundle(
            fuse,
            self.nodes.region().fd(),
            self.handles.region().fd(),
            clones.iter().map(AsFd::as_fd),
        )
    }
}

impl Resumed {
    /// The bundle received from a keeper: `[fuse, nodes, handles, clones...]`.
    pub fn from_fds(fds: Vec<OwnedFd>) -> Result<Resumed, HandoverError> {
        let got = fds.len();
        let shape = || {
            HandoverError::Params(format!(
                "expected {} to {} descriptors, got {got}",
                protocol::BASE_FDS,
                protocol::MAX_BUNDLE_FDS,
            ))
        };
        let ([fuse, nodes, handles], clones) = protocol::unbundle(fds).ok_or_else(shape)?;
        let nodes = std::sync::Arc::new(NodeJournal::open(nodes)?);
        let handles = std::sync::Arc::new(HandleTable::open(handles)?);
        let json = handles.params()?;
        let params: InitParams =
            serde_json::from_slice(&json).map_err(|e| HandoverError::Params(e.to_string()))?;
        Ok(Resumed {
            fuse,
            clones,
            nodes,
            handles,
            params,
        })
    }
}

/// `FUSE_NOTIFY_RESEND` from `linux/fuse.h`.
const FUSE_NOTIFY_RESEND: i32 = 7;

/// Asks the kernel to queue again every request that was read from the connection but not
/// answered (they come back with bit 63 set in their `unique`).
pub fn request_resend(fuse: impl AsFd) -> Result<(), HandoverError> {
    // struct fuse_out_header { u32 len; i32 error (the notify code); u64 unique (0) }
    let mut header = [0u8; 16];
    header[..4].copy_from_slice(&16u32.to_ne_bytes());
    header[4..8].copy_from_slice(&FUSE_NOTIFY_RESEND.to_ne_bytes());
    // SAFETY: a write of 16 bytes from a live buffer to a descriptor we hold.
    let n = unsafe {
        libc::write(
            fuse.as_fd().as_raw_fd(),
            header.as_ptr().cast(),
            header.len(),
        )
    };
    if n == 16 {
        Ok(())
    } else {
        Err(HandoverError::Resend(std::io::Error::last_os_error()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_params_survive_the_table_and_say_what_is_in_force() {
        let handover = Handover::create().unwrap();
        let params = InitParams {
            abi: (7, 41),
            offered: (InitFlags::FUSE_PASSTHROUGH | InitFlags::FUSE_HAS_RESEND).bits(),
            requested: InitFlags::FUSE_PASSTHROUGH.bits(),
            made_by: "riffle 0.1.0".into(),
        };
        handover.save_params(&params).unwrap();
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        drop(b);
        let fds = vec![
            OwnedFd::from(a),
            handover.nodes.region().fd().try_clone_to_owned().unwrap(),
            handover.handles.region().fd().try_clone_to_owned().unwrap(),
        ];
        let resumed = Resumed::from_fds(fds).unwrap();
        assert_eq!(resumed.params, params);
        assert!(resumed.params.enabled(InitFlags::FUSE_PASSTHROUGH));
        assert!(!resumed.params.enabled(InitFlags::FUSE_HAS_RESEND));
        assert!(resumed.params.kernel_resends());
        assert_eq!(resumed.params.kernel_abi(), Version(7, 41));
    }

    #[test]
    fn clones_follow_the_first_three_and_an_old_bundle_has_none() {
        let handover = Handover::create().unwrap();
        handover
            .save_params(&InitParams {
                abi: (7, 41),
                offered: InitFlags::FUSE_HAS_RESEND.bits(),
                requested: 0,
                made_by: "riffle 0.1.0".into(),
            })
            .unwrap();
        let file = || OwnedFd::from(tempfile::tempfile().unwrap());
        let ino = |fd: &OwnedFd| nix::sys::stat::fstat(fd).unwrap().st_ino;
        let (fuse, clones) = (file(), [file(), file()]);
        let given = handover.fds(fuse.as_fd(), &clones);
        assert_eq!(given.len(), 5);
        let copies: Vec<OwnedFd> = given
            .iter()
            .map(|fd| fd.try_clone_to_owned().unwrap())
            .collect();
        let resumed = Resumed::from_fds(copies).unwrap();
        assert_eq!(ino(&resumed.fuse), ino(&fuse));
        assert_eq!(
            resumed.clones.iter().map(ino).collect::<Vec<_>>(),
            clones.iter().map(ino).collect::<Vec<_>>()
        );
        // A bundle of three (one thread, or a build from before the clones).
        let old: Vec<OwnedFd> = handover
            .fds(fuse.as_fd(), &[])
            .iter()
            .map(|fd| fd.try_clone_to_owned().unwrap())
            .collect();
        assert!(Resumed::from_fds(old).unwrap().clones.is_empty());
        // More than a bundle may carry.
        let mut many: Vec<OwnedFd> = handover
            .fds(fuse.as_fd(), &[])
            .iter()
            .map(|fd| fd.try_clone_to_owned().unwrap())
            .collect();
        many.extend((0..protocol::MAX_CLONES + 1).map(|_| file()));
        assert!(Resumed::from_fds(many).is_err());
    }

    #[test]
    fn a_bundle_without_saved_params_is_refused() {
        let handover = Handover::create().unwrap();
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let fds = vec![
            OwnedFd::from(a),
            handover.nodes.region().fd().try_clone_to_owned().unwrap(),
            handover.handles.region().fd().try_clone_to_owned().unwrap(),
        ];
        assert!(Resumed::from_fds(fds).is_err());
        assert!(Resumed::from_fds(Vec::new()).is_err());
    }
}
