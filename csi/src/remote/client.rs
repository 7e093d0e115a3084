//! [`RemoteMounter`]: the plugin's [`Mounter`] when the daemons live in the
//! mounter container.
//!
//! Each call opens the mounter's socket, sends one request and waits for the
//! answer within a limit (a mount may take as long as the mounter's own
//! mount timeout; the other calls are quick). A mounter that cannot be
//! reached is an `Unavailable` error naming the socket, so kubelet retries
//! the publish and the supervisor retries its check; nothing falls back to
//! starting daemons in the plugin's own container, which would quietly
//! bring back the problem the mounter exists to solve.

use super::protocol::{read_line, write_line, Request, Response, WireError};
use crate::mounter::{DaemonId, Health, MountError, MountErrorKind, MountRequest, Mounter, Pulse};
use async_trait::async_trait;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::net::UnixStream;

/// Talks to `riffle-mounter` over its unix socket.
#[derive(Debug, Clone)]
pub struct RemoteMounter {
    pub socket: PathBuf,
    /// How long a mount may take (the mounter's mount timeout plus slack).
    pub mount_timeout: Duration,
    /// How long any other call may take (an unmount waits for the daemon
    /// to exit, up to about three stop grace periods).
    pub call_timeout: Duration,
}

impl RemoteMounter {
    pub fn new(socket: PathBuf, mount_timeout: Duration) -> Self {
        Self {
            socket,
            mount_timeout: mount_timeout + Duration::from_secs(30),
            call_timeout: Duration::from_secs(60),
        }
    }

    /// Sends `request`, returns the answer; `Failed` answers become errors.
    pub async fn call(&self, request: &Request, limit: Duration) -> Result<Response, MountError> {
        let exchange = async {
            let mut stream = UnixStream::connect(&self.socket).await.map_err(|e| {
                MountError::new(
                    MountErrorKind::Unavailable,
                    format!(
                        "riffle-mounter is not reachable at {}: {e} (is the riffle-mounter DaemonSet running on this node?)",
                        self.socket.display()
                    ),
                )
            })?;
            let wire = |e: WireError| {
                MountError::new(
                    MountErrorKind::Unavailable,
                    format!("riffle-mounter at {}: {e}", self.socket.display()),
                )
            };
            write_line(&mut stream, request).await.map_err(wire)?;
            read_line::<Response>(&mut stream).await.map_err(wire)
        };
        let response = tokio::time::timeout(limit, exchange).await.map_err(|_| {
            MountError::new(
                MountErrorKind::Timeout,
                format!(
                    "riffle-mounter at {} did not answer {request:?} within {limit:?}",
                    self.socket.display()
                ),
            )
        })??;
        match response {
            Response::Failed { kind, message } => Err(MountError::new(kind, message)),
            other => Ok(other),
        }
    }

    /// The mounter's version and pid, for the plugin's start-up log.
    pub async fn ping(&self) -> Result<(String, u32), MountError> {
        self.pong().await.map(|(version, pid, _)| (version, pid))
    }

    /// The mounter's version, pid and features.
    pub async fn pong(&self) -> Result<(String, u32, Vec<String>), MountError> {
        match self.call(&Request::Ping, self.call_timeout).await? {
            Response::Pong {
                version,
                pid,
                features,
                ..
            } => Ok((version, pid, features)),
            other => Err(unexpected(&other)),
        }
    }
}

fn unexpected(response: &Response) -> MountError {
    MountError::new(
        MountErrorKind::Internal,
        format!("riffle-mounter sent an unexpected answer: {response:?}"),
    )
}

#[async_trait]
impl Mounter for RemoteMounter {
    async fn mount(&self, req: MountRequest<'_>) -> Result<Option<DaemonId>, MountError> {
        let request = Request::Mount {
            target: req.target.to_path_buf(),
            settings: req.settings.clone(),
            auth: req.auth.clone(),
            pid_file: req.pid_file.to_path_buf(),
            log_file: req.log_file.to_path_buf(),
            volume_id: req.volume_id.to_string(),
            pod: req.pod.map(str::to_string),
        };
        match self.call(&request, self.mount_timeout).await? {
            Response::Mounted { daemon } => Ok(daemon),
            other => Err(unexpected(&other)),
        }
    }

    async fn unmount(&self, target: &Path, daemon: Option<DaemonId>) -> Result<(), MountError> {
        let request = Request::Unmount {
            target: target.to_path_buf(),
            daemon,
        };
        match self.call(&request, self.call_timeout).await? {
            Response::Unmounted => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    async fn health(&self, target: &Path, daemon: Option<DaemonId>) -> Result<Health, MountError> {
        let request = Request::Health {
            target: target.to_path_buf(),
            daemon,
        };
        match self.call(&request, self.call_timeout).await? {
            Response::Health { health } => Ok(health),
            other => Err(unexpected(&other)),
        }
    }

    async fn available(&self) -> Result<(), MountError> {
        self.ping().await.map(|_| ())
    }

    async fn pulse(&self) -> Result<Pulse, MountError> {
        match self.call(&Request::Ping, self.call_timeout).await? {
            Response::Pong {
                instance, exited, ..
            } => Ok(Pulse { instance, exited }),
            other => Err(unexpected(&other)),
        }
    }

    async fn take_over(&self, req: MountRequest<'_>) -> Result<Option<DaemonId>, MountError> {
        let request = Request::TakeOver {
            target: req.target.to_path_buf(),
            settings: req.settings.clone(),
            auth: req.auth.clone(),
            pid_file: req.pid_file.to_path_buf(),
            log_file: req.log_file.to_path_buf(),
            volume_id: req.volume_id.to_string(),
            pod: req.pod.map(str::to_string),
        };
        match self.call(&request, self.mount_timeout).await? {
            Response::Mounted { daemon } => Ok(daemon),
            other => Err(unexpected(&other)),
        }
    }

    async fn bind(&self, source: &Path, target: &Path) -> Result<(), MountError> {
        let request = Request::Bind {
            source: source.to_path_buf(),
            target: target.to_path_buf(),
        };
        match self.call(&request, self.call_timeout).await? {
            Response::Bound => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    async fn unbind(&self, target: &Path) -> Result<(), MountError> {
        let request = Request::Unbind {
            target: target.to_path_buf(),
        };
        match self.call(&request, self.call_timeout).await? {
            Response::Unmounted => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    async fn daemon_from_pid_file(&self, pid_file: &Path) -> Option<DaemonId> {
        let request = Request::DaemonFromPidFile {
            pid_file: pid_file.to_path_buf(),
        };
        match self.call(&request, self.call_timeout).await {
            Ok(Response::Daemon { daemon }) => daemon,
            Ok(other) => {
                tracing::warn!(error = %unexpected(&other), "cannot identify a daemon");
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot identify a daemon");
                None
            }
        }
    }
}
