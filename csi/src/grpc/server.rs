//! The plugin process: unix socket, gRPC server, reconciliation,
//! supervisor.
//!
//! Start-up order: open the state directory; bind the socket (a socket file
//! left by a dead predecessor is removed, but one that still accepts
//! connections belongs to a live plugin and is an error); serve gRPC with
//! Probe answering not-ready; reconcile recorded volumes; report ready; run
//! the supervisor. Stopping the plugin stops serving and supervising but
//! leaves every mount daemon running: they are separate processes in their
//! own sessions, and the next plugin adopts them.

use crate::grpc::identity::IdentityService;
use crate::grpc::node::NodeService;
use crate::grpc::proto::identity_server::IdentityServer;
use crate::grpc::proto::node_server::NodeServer;
use crate::kube::access::AccessPolicy;
use crate::mounter::Mounter;
use crate::node_state::secrets::{SecretStore, SecretsError};
use crate::node_state::state::{StateError, StateStore};
use crate::volumes::supervisor;
use crate::volumes::VolumeManager;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;

/// Why the plugin could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("endpoint {0:?} is not a unix socket address (expected unix:///path/to/csi.sock)")]
    BadEndpoint(String),
    #[error("socket {path}: {source}")]
    Socket { path: PathBuf, source: io::Error },
    #[error("socket {0} is in use by a running plugin")]
    SocketInUse(PathBuf),
    #[error("{0} exists and is not a socket; refusing to remove it")]
    NotASocket(PathBuf),
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Secrets(#[from] SecretsError),
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Parses `unix:///csi/csi.sock`, `unix:/csi/csi.sock` or a plain absolute
/// path.
pub fn parse_endpoint(endpoint: &str) -> Result<PathBuf, ServerError> {
    let path = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .unwrap_or(endpoint);
    let path = Path::new(path);
    if path.is_absolute() {
        Ok(path.to_path_buf())
    } else {
        Err(ServerError::BadEndpoint(endpoint.to_string()))
    }
}

/// Binds the socket at `path`, removing a stale socket file first.
pub async fn bind(path: &Path) -> Result<UnixListener, ServerError> {
    let sock_err = |source| ServerError::Socket {
        path: path.to_path_buf(),
        source,
    };
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if tokio::net::UnixStream::connect(path).await.is_ok() {
                return Err(ServerError::SocketInUse(path.to_path_buf()));
            }
            tracing::info!(socket = %path.display(), "removing stale socket");
            std::fs::remove_file(path).map_err(sock_err)?;
        }
        Ok(_) => return Err(ServerError::NotASocket(path.to_path_buf())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(sock_err(e)),
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(sock_err)?;
    }
    UnixListener::bind(path).map_err(sock_err)
}

/// Binds `path` like [`bind`], but while a live plugin still answers on it
/// (a rollout that starts the new plugin before the old one is gone) waits
/// up to `wait` for it to go away instead of failing at once.
pub async fn bind_when_free(path: &Path, wait: Duration) -> Result<UnixListener, ServerError> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut said = false;
    loop {
        match bind(path).await {
            Err(ServerError::SocketInUse(p)) if tokio::time::Instant::now() < deadline => {
                if !said {
                    tracing::info!(socket = %p.display(), wait = ?wait, "another process still serves this socket (a rollout?); waiting for it to stop");
                    said = true;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            other => return other,
        }
    }
}

/// The plugin's configuration.
#[derive(Debug, Clone)]
pub struct PluginConfig {
    pub socket: PathBuf,
    pub node_id: String,
    pub state_dir: PathBuf,
    /// Where volume secrets are kept: a tmpfs (mounted by the plugin if the
    /// directory is not on one), shared with the mounter at the same path.
    pub secrets_dir: PathBuf,
    /// The driver's identity rules (node credentials, token audience).
    pub policy: AccessPolicy,
    /// How often the supervisor checks the mounts.
    pub check_interval: Duration,
    /// How long to wait for a previous plugin to release the socket.
    pub takeover_wait: Duration,
}

/// A started plugin.
pub struct RunningPlugin {
    shutdown: Option<oneshot::Sender<()>>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    background: JoinHandle<()>,
    ready: Arc<AtomicBool>,
}

impl RunningPlugin {
    /// Whether start-up reconciliation has finished.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// Waits until the gRPC server stops (after [`RunningPlugin::stop`], or
    /// on a server error).
    pub async fn wait(mut self) -> Result<(), ServerError> {
        let result = (&mut self.server).await;
        self.background.abort();
        match result {
            Ok(r) => r.map_err(ServerError::from),
            Err(join) => Err(ServerError::Socket {
                path: PathBuf::new(),
                source: io::Error::other(join.to_string()),
            }),
        }
    }

    /// Stops serving and supervising; mounts stay.
    pub async fn stop(mut self) -> Result<(), ServerError> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.wait().await
    }
}

/// Starts the plugin with `mounter`.
pub async fn start(
    config: PluginConfig,
    mounter: Arc<dyn Mounter>,
) -> Result<RunningPlugin, ServerError> {
    // Bind first: until the previous plugin is gone, this one must not
    // touch the state directory it still works in.
    let listener = bind_when_free(&config.socket, config.takeover_wait).await?;
    let store = StateStore::open(&config.state_dir)?;
    let secrets = SecretStore::open(&config.secrets_dir)?;
    let manager = Arc::new(VolumeManager::new(
        mounter,
        store,
        secrets,
        config.policy.allow_node_credentials,
    ));
    match manager.prune_secrets() {
        Ok(0) => {}
        Ok(n) => tracing::info!(pruned = n, "removed secrets of targets without a record"),
        Err(e) => tracing::error!(error = %e, "cannot prune the secrets of unrecorded targets"),
    }
    tracing::info!(
        secrets_dir = %config.secrets_dir.display(),
        allow_node_credentials = config.policy.allow_node_credentials,
        token_audience = %config.policy.token_audience,
        "volume identities"
    );
    let ready = Arc::new(AtomicBool::new(false));
    let identity = IdentityService::new(Arc::clone(&ready));
    let node = NodeService::new(
        config.node_id.clone(),
        Arc::clone(&manager),
        config.policy.clone(),
    );
    let (tx, rx) = oneshot::channel::<()>();
    tracing::info!(socket = %config.socket.display(), node_id = %config.node_id, "serving CSI");
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(IdentityServer::new(identity))
            .add_service(NodeServer::new(node))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                let _ = rx.await;
            }),
    );
    let ready_flag = Arc::clone(&ready);
    let interval = config.check_interval;
    let background = tokio::spawn(async move {
        let (recovered, failed) = supervisor::reconcile(&manager).await;
        tracing::info!(recovered, failed, "reconciliation done; ready");
        ready_flag.store(true, Ordering::SeqCst);
        supervisor::run(manager, interval).await;
    });
    Ok(RunningPlugin {
        shutdown: Some(tx),
        server,
        background,
        ready,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(
            parse_endpoint("unix:///csi/csi.sock").expect("ok"),
            PathBuf::from("/csi/csi.sock")
        );
        assert_eq!(
            parse_endpoint("unix:/csi/csi.sock").expect("ok"),
            PathBuf::from("/csi/csi.sock")
        );
        assert!(parse_endpoint("tcp://127.0.0.1:1").is_err());
        assert!(parse_endpoint("unix://relative.sock").is_err());
    }

    #[tokio::test]
    async fn stale_socket_is_replaced_live_one_is_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("csi.sock");
        // A socket file whose listener is gone.
        drop(std::os::unix::net::UnixListener::bind(&path).expect("bind"));
        let live = bind(&path).await.expect("stale socket replaced");
        assert!(matches!(
            bind(&path).await,
            Err(ServerError::SocketInUse(_))
        ));
        // A live socket is waited for, and taken once its owner is gone.
        let waiter = tokio::spawn({
            let path = path.clone();
            async move { bind_when_free(&path, Duration::from_secs(30)).await }
        });
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(!waiter.is_finished(), "waits while the socket answers");
        drop(live);
        let taken = waiter.await.expect("join").expect("bound once free");
        assert!(matches!(
            bind_when_free(&path, Duration::from_millis(300)).await,
            Err(ServerError::SocketInUse(_))
        ));
        drop(taken);
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").expect("write");
        assert!(matches!(bind(&file).await, Err(ServerError::NotASocket(_))));
    }
}
