//! The seam between volume bookkeeping and the thing that actually mounts.
//!
//! [`Mounter`] starts a mount daemon for a target, stops it, and reports the
//! health of a target. The real implementation ([`crate::riffle`]) runs the
//! `riffle` binary and inspects `/proc`; [`crate::fake`] keeps everything in
//! memory so that the CSI logic can be tested without FUSE or an object
//! store.

use crate::credentials::Credentials;
use crate::settings::VolumeSettings;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// A mount daemon process: its pid and its start time (clock ticks since
/// boot, from /proc/PID/stat). The pair identifies the process even if the
/// pid is reused after it dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaemonId {
    pub pid: i32,
    pub start_time: u64,
}

/// What is at a target path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Health {
    /// Nothing is mounted there.
    NotMounted,
    /// A rifflefs mount that answers.
    Live,
    /// A rifflefs mount whose daemon is gone ("transport endpoint is not
    /// connected") or dying; it needs a lazy unmount and a new daemon.
    Broken(String),
    /// Something other than rifflefs is mounted there (the fs type).
    Foreign(String),
}

/// Everything needed to mount one volume at one target.
pub struct MountRequest<'a> {
    pub target: &'a Path,
    pub settings: &'a VolumeSettings,
    pub credentials: Option<&'a Credentials>,
    /// Where the daemon writes its pid.
    pub pid_file: &'a Path,
    /// Where the daemon writes its log.
    pub log_file: &'a Path,
}

/// The category of a mount failure; decides the gRPC status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MountErrorKind {
    /// A setting riffle refused.
    InvalidArgument,
    /// The bucket or prefix does not exist.
    NotFound,
    /// Credentials missing, wrong or not allowed to read the bucket.
    PermissionDenied,
    /// The endpoint could not be reached.
    Unavailable,
    /// The mount did not become ready in time.
    Timeout,
    /// Something about the target path (busy, not a directory...).
    FailedPrecondition,
    /// Anything else.
    Internal,
}

/// A failed mount or unmount, with a message an operator can act on. The
/// message never contains credentials.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct MountError {
    pub kind: MountErrorKind,
    pub message: String,
}

impl MountError {
    pub fn new(kind: MountErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

/// Starts, stops and inspects mount daemons.
#[async_trait]
pub trait Mounter: Send + Sync + 'static {
    /// Mounts the volume at `req.target` (an existing empty directory) and
    /// returns once the mount is live. The daemon must outlive the caller.
    /// Returns the daemon's identity when it can be known.
    async fn mount(&self, req: MountRequest<'_>) -> Result<Option<DaemonId>, MountError>;

    /// Unmounts whatever is at `target` (gracefully, falling back to a lazy
    /// detach) and makes sure `daemon`, if given, has exited. Succeeds when
    /// nothing is mounted there.
    async fn unmount(&self, target: &Path, daemon: Option<DaemonId>) -> Result<(), MountError>;

    /// Reports what is at `target`; `daemon` is the process believed to
    /// serve it. An error means the question could not be asked (the
    /// mounter service is unreachable): the caller must leave the target
    /// alone rather than guess.
    async fn health(&self, target: &Path, daemon: Option<DaemonId>) -> Result<Health, MountError>;

    /// Whether the mounter can be asked at all (the remote one: whether the
    /// mounter service answers). While it cannot, the supervisor pauses its
    /// checks instead of counting every volume's check as a failure.
    async fn available(&self) -> Result<(), MountError> {
        Ok(())
    }

    /// Identifies the daemon whose pid is in `pid_file`, if it is alive
    /// (None also when that cannot be found out).
    async fn daemon_from_pid_file(&self, pid_file: &Path) -> Option<DaemonId>;
}
