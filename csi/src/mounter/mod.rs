//! The seam between volume bookkeeping and the thing that actually mounts.
//!
//! [`Mounter`] starts a mount daemon for a target, stops it, and reports the
//! health of a target. The real implementation ([`crate::mounter::riffle`]) runs the
//! `riffle` binary and inspects `/proc`; [`crate::mounter::fake`] keeps everything in
//! memory so that the CSI logic can be tested without FUSE or an object
//! store.

pub mod fake;
pub mod metrics;
pub mod peers;
pub mod process;
pub mod reaper;
pub mod riffle;

use crate::kube::credentials::Credentials;
use crate::kube::settings::VolumeSettings;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A mount daemon process: its pid and its start time (clock ticks since
/// boot, from /proc/PID/stat). The pair identifies the process even if the
/// pid is reused after it dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaemonId {
    pub pid: i32,
    pub start_time: u64,
}

/// The mounter as one ping finds it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pulse {
    /// Names the mounter's process (None: it cannot tell): a change is a restart, whose
    /// daemons died with it, and their mounts need a successor at once.
    pub instance: Option<String>,
    /// The riffle processes (keepers, daemons) that have ended under it so far
    /// ([`crate::mounter::reaper`]): a change means a volume may have lost its keeper or daemon.
    pub exited: u64,
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

/// How a daemon finds its identity: what the mounter puts in its
/// environment. Holds paths and names, never a secret: the secret values are
/// in files on the plugin's tmpfs ([`crate::node_state::secrets`]) that the plugin
/// rewrites at every publish, and that the daemon re-reads, so new keys or a
/// new token reach a running daemon without a remount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum DaemonCredentials {
    /// The node's own identity: the mounter's environment, the instance
    /// role. Only with the plugin's --allow-node-credentials.
    Node,
    /// Unsigned requests (the volume's noSignRequest flag).
    Anonymous,
    /// Keys in a JSON file the daemon re-reads (`RIFFLE_CREDENTIALS_FILE`).
    KeysFile { path: PathBuf },
    /// AssumeRoleWithWebIdentity with the token in `token_file`, by the
    /// AWS SDK's default chain in the daemon.
    WebIdentity {
        role_arn: String,
        token_file: PathBuf,
        session_name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sts_endpoint_url: Option<String>,
    },
}

/// Environment variables through which the AWS SDK could find credentials
/// other than the ones a volume was given; removed from the daemon's
/// environment unless it uses the node's identity.
pub const CREDENTIAL_ENV: &[&str] = &[
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_ROLE_ARN",
    "AWS_ROLE_SESSION_NAME",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ENDPOINT_URL_STS",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "RIFFLE_CREDENTIALS_FILE",
];

impl DaemonCredentials {
    /// The daemon's environment: `(name, Some(value))` to set, `(name,
    /// None)` to remove. Except for the node's identity, the other ways the
    /// SDK could find credentials are closed: the variables above and the
    /// shared config and credentials files (as Mountpoint's CSI driver does
    /// for pod-level credentials). The instance metadata service stays
    /// reachable for the region: keys come from the daemon's own provider
    /// (`RIFFLE_CREDENTIALS_FILE`), and the SDK's chain stops at the web
    /// identity provider once it is configured, even when it fails.
    pub fn env(&self) -> Vec<(&'static str, Option<String>)> {
        if *self == Self::Node {
            return Vec::new();
        }
        let mut env: Vec<(&'static str, Option<String>)> =
            CREDENTIAL_ENV.iter().map(|k| (*k, None)).collect();
        let mut set = |name: &'static str, value: String| {
            env.retain(|(k, _)| *k != name);
            env.push((name, Some(value)));
        };
        set("AWS_CONFIG_FILE", "/dev/null".into());
        set("AWS_SHARED_CREDENTIALS_FILE", "/dev/null".into());
        match self {
            Self::Node | Self::Anonymous => {}
            Self::KeysFile { path } => set(
                "RIFFLE_CREDENTIALS_FILE",
                path.to_string_lossy().into_owned(),
            ),
            Self::WebIdentity {
                role_arn,
                token_file,
                session_name,
                sts_endpoint_url,
            } => {
                set("AWS_ROLE_ARN", role_arn.clone());
                set(
                    "AWS_WEB_IDENTITY_TOKEN_FILE",
                    token_file.to_string_lossy().into_owned(),
                );
                set("AWS_ROLE_SESSION_NAME", session_name.clone());
                if let Some(url) = sts_endpoint_url {
                    set("AWS_ENDPOINT_URL_STS", url.clone());
                }
            }
        }
        env
    }

    /// Removes from `text` the secrets in the files this names (defence in
    /// depth: riffle never prints them; the mounter's logs and answers go
    /// through this).
    pub fn scrub(&self, text: &str) -> String {
        match self {
            Self::KeysFile { path } => {
                let keys = std::fs::read(path)
                    .ok()
                    .and_then(|b| Credentials::from_json(&b).ok());
                crate::kube::credentials::scrub(keys.as_ref(), text)
            }
            Self::WebIdentity { token_file, .. } => match std::fs::read_to_string(token_file) {
                Ok(token) if !token.trim().is_empty() => text.replace(token.trim(), "<redacted>"),
                _ => text.to_string(),
            },
            Self::Node | Self::Anonymous => text.to_string(),
        }
    }

    /// Whether the daemon reads files the plugin writes (a mounter that
    /// predates them must not be asked: it would run the daemon with the
    /// node's identity instead).
    pub fn uses_files(&self) -> bool {
        matches!(self, Self::KeysFile { .. } | Self::WebIdentity { .. })
    }
}

/// Everything needed to mount one volume at one target.
pub struct MountRequest<'a> {
    pub target: &'a Path,
    pub settings: &'a VolumeSettings,
    /// How the daemon authenticates.
    pub auth: &'a DaemonCredentials,
    /// Where the daemon writes its pid.
    pub pid_file: &'a Path,
    /// Where the daemon writes its log.
    pub log_file: &'a Path,
    /// The CSI volume id and the pod (`namespace/name`, when kubelet said it): labels of the
    /// daemon's metrics ([`crate::mounter::metrics::VolumeLabels`]).
    pub volume_id: &'a str,
    pub pod: Option<&'a str>,
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
    /// A take-over found no live connection to take over (the fd store holds none, or none
    /// is used): the mount is gone, and mounting afresh is right.
    NothingToTakeOver,
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

    /// Takes over the live mount at `req.target` whose daemon died while a
    /// copy of its FUSE connection stayed in the node's fd store (the
    /// mounter's container restarted): a new daemon serves the same
    /// connection, so pods reading it never see the mount go. Fails,
    /// touching nothing, when there is nothing to take over (no fd store,
    /// or it holds no live connection for the target); the caller then
    /// remounts.
    async fn take_over(&self, req: MountRequest<'_>) -> Result<Option<DaemonId>, MountError> {
        Err(MountError::new(
            MountErrorKind::NothingToTakeOver,
            format!(
                "this mounter cannot take the mount at {} over",
                req.target.display()
            ),
        ))
    }

    /// Who runs the daemons now ([`Pulse`]), so that a restart or a keeper or
    /// daemon that ended between two checks is noticed at once.
    async fn pulse(&self) -> Result<Pulse, MountError> {
        self.available().await.map(|()| Pulse {
            instance: None,
            exited: crate::mounter::reaper::exited(),
        })
    }

    /// Makes the live mount at `source` (a shared daemon's, see
    /// [`crate::volumes`]) also appear at `target` (an existing directory), read-only:
    /// another pod's view of the same daemon. By default this process binds it
    /// ([`crate::node_state::mountinfo::bind_read_only`]).
    async fn bind(&self, source: &Path, target: &Path) -> Result<(), MountError> {
        bind_here(source, target).await
    }

    /// Removes what [`Mounter::bind`] put at `target`, leaving the daemon behind it
    /// running (other pods read through it). Succeeds when nothing is there.
    async fn unbind(&self, target: &Path) -> Result<(), MountError> {
        unbind_here(target).await
    }
}

/// [`Mounter::bind`] in this process.
pub async fn bind_here(source: &Path, target: &Path) -> Result<(), MountError> {
    let (source, target) = (source.to_path_buf(), target.to_path_buf());
    tokio::task::spawn_blocking(move || {
        crate::node_state::mountinfo::bind_read_only(&source, &target).map_err(|e| {
            MountError::new(
                MountErrorKind::Internal,
                format!(
                    "cannot bind {} at {}: {e}",
                    source.display(),
                    target.display()
                ),
            )
        })
    })
    .await
    .map_err(|e| MountError::new(MountErrorKind::Internal, e.to_string()))?
}

/// [`Mounter::unbind`] in this process.
pub async fn unbind_here(target: &Path) -> Result<(), MountError> {
    let owned = target.to_path_buf();
    tokio::task::spawn_blocking(move || crate::node_state::mountinfo::detach_all(&owned))
        .await
        .map_err(|e| MountError::new(MountErrorKind::Internal, e.to_string()))?;
    nothing_mounted_at(target, "unbinding it")
}

/// Ok when nothing is mounted at `target` any more (`after` says what should have removed
/// it, for the error).
pub fn nothing_mounted_at(target: &Path, after: &str) -> Result<(), MountError> {
    match crate::node_state::mountinfo::mount_at(target) {
        Ok(None) => Ok(()),
        Ok(Some(m)) => Err(MountError::new(
            MountErrorKind::Internal,
            format!(
                "{} is still mounted ({}) after {after}",
                target.display(),
                m.fs_type
            ),
        )),
        Err(e) => Err(MountError::new(
            MountErrorKind::Internal,
            format!("cannot read mountinfo: {e}"),
        )),
    }
}
