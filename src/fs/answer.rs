//! What the adapter's decisions return.
//!
//! Every FUSE operation is decided by a plain function or method over the file system's state
//! that returns one of these values; `impl Filesystem for RiffleFs` ([`super`]) sends it with
//! the operation's fuser reply, in one place per operation. So the decisions are testable
//! without a kernel (`fs::tests`).

use std::sync::Arc;
use std::time::Duration;

use fuser::{BackingId, Errno, FileAttr, FopenFlags};

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
