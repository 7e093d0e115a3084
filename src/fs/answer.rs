//! What the adapter's decisions return, and which node a request names.
//!
//! Every FUSE operation is decided by a plain function or method over the file system's state
//! that returns one of these values; `impl Filesystem for RiffleFs` ([`super`]) sends it with
//! the operation's fuser reply, in one place per operation. So the decisions are testable
//! without a kernel ([`super::tests`]), and a request's inode is classified once, at the top
//! of the operation ([`Node`]): the mount's `.riffle-stats` file or an inode of the namespace.

use std::sync::Arc;
use std::time::Duration;

use fuser::{BackingId, Errno, FileAttr, FopenFlags};

use super::stats_file;

/// What a request's inode is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Node {
    /// `.riffle-stats` at the mount root ([`stats_file`]).
    Stats,
    /// A file or directory of the namespace.
    Object(u64),
}

impl Node {
    pub(super) fn of(ino: u64) -> Node {
        if ino == stats_file::INO {
            Node::Stats
        } else {
            Node::Object(ino)
        }
    }
}

/// The answer to a lookup or a getattr: the attributes, and how long the kernel may keep them
/// (and the name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Entry {
    pub attr: FileAttr,
    pub ttl: Duration,
}

/// The answer to an open.
#[derive(Debug)]
pub(super) enum OpenAnswer {
    /// Handle `fh`, its reads passed through to `backing` by the kernel.
    Passthrough {
        fh: u64,
        backing: Arc<BackingId>,
    },
    /// Handle `fh`, its reads served by the daemon.
    Served {
        fh: u64,
        flags: FopenFlags,
    },
    /// `ESTALE`: another version of the object is open under the inode; the kernel looks the
    /// name up again (once) and finds the new version's inode.
    Stale,
    Error(Errno),
}

impl OpenAnswer {
    /// The handle the answer opened, if any.
    #[cfg(test)]
    pub(super) fn fh(&self) -> Option<u64> {
        match self {
            OpenAnswer::Passthrough { fh, .. } | OpenAnswer::Served { fh, .. } => Some(*fh),
            OpenAnswer::Stale | OpenAnswer::Error(_) => None,
        }
    }
}
