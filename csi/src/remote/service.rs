//! The mounter's side: accepts the plugin's requests on a unix socket and
//! runs them on a local [`Mounter`].
//!
//! The socket is created mode 0600 and every connection's peer uid
//! (`SO_PEERCRED`) must be the mounter's own (root in the DaemonSet):
//! whoever may mount may only be the plugin. Each connection is served in
//! its own task, and a request is carried out to the end even if the
//! plugin goes away meanwhile (a mount finished for a dead plugin is adopted
//! by the next one through its pid file; one abandoned half-way would leave
//! a daemon nobody knows). A client has [`REQUEST_READ_LIMIT`] to send its
//! request, so a stuck one holds no task for ever.
//!
//! Mounts and unmounts of one target run one at a time here too, not only
//! in the plugin: a plugin killed during a mount leaves that mount running
//! in the mounter, and the next plugin's recovery of the same target must
//! not overlap it (two daemons stacked on one target, one of them unknown
//! to anybody). Different targets proceed in parallel. Requests are logged
//! by operation and target; credentials are never logged.

use super::protocol::{read_line, write_line, Request, Response};
use crate::grpc::server::{self, ServerError};
use crate::mounter::{MountError, MountErrorKind, MountRequest, Mounter};
use crate::node_state::locks::KeyedLocks;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long a new mounter waits for an old one to release the socket.
const TAKEOVER_WAIT: Duration = Duration::from_secs(600);

/// How long a client may take to send its request line.
pub const REQUEST_READ_LIMIT: Duration = Duration::from_secs(30);

/// A serving mounter; dropping it does not stop it, [`RunningService::stop`]
/// does.
pub struct RunningService {
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    pub socket: PathBuf,
}

impl RunningService {
    /// Stops accepting requests (requests under way finish in their own
    /// tasks; daemons are not touched).
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let _ = (&mut self.task).await;
    }
}

/// Binds `socket` (replacing a stale socket file, refusing one a live
/// mounter answers on) and serves `mounter` on it.
pub async fn start(
    socket: &Path,
    mounter: Arc<dyn Mounter>,
) -> Result<RunningService, ServerError> {
    // A rollout may start the new mounter before the old one stops (maxSurge): wait for it.
    let listener = server::bind_when_free(socket, TAKEOVER_WAIT).await?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600)).map_err(|source| {
        ServerError::Socket {
            path: socket.to_path_buf(),
            source,
        }
    })?;
    let (tx, rx) = oneshot::channel();
    tracing::info!(socket = %socket.display(), "riffle-mounter serving");
    let task = tokio::spawn(accept_loop(listener, mounter, rx));
    Ok(RunningService {
        shutdown: Some(tx),
        task,
        socket: socket.to_path_buf(),
    })
}

async fn accept_loop(
    listener: UnixListener,
    mounter: Arc<dyn Mounter>,
    mut shutdown: oneshot::Receiver<()>,
) {
    let own_uid = nix::unistd::geteuid().as_raw();
    let locks = Arc::new(KeyedLocks::default());
    loop {
        let stream = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        match stream.peer_cred() {
            Ok(peer) if peer.uid() == own_uid => {}
            Ok(peer) => {
                tracing::warn!(
                    uid = peer.uid(),
                    pid = ?peer.pid(),
                    "refused a connection from another user"
                );
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot identify a peer; refused");
                continue;
            }
        }
        let mounter = Arc::clone(&mounter);
        tokio::spawn(serve_connection(stream, mounter, Arc::clone(&locks)));
    }
}

async fn serve_connection(
    mut stream: UnixStream,
    mounter: Arc<dyn Mounter>,
    locks: Arc<KeyedLocks>,
) {
    let read = tokio::time::timeout(REQUEST_READ_LIMIT, read_line(&mut stream)).await;
    let request: Request = match read {
        Ok(Ok(r)) => r,
        Err(_) => {
            tracing::warn!(limit = ?REQUEST_READ_LIMIT, "a client sent no request in time; closed");
            return;
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "unreadable request");
            let _ = write_line(
                &mut stream,
                &failed(
                    MountErrorKind::InvalidArgument,
                    format!("unreadable request: {e}"),
                ),
            )
            .await;
            return;
        }
    };
    tracing::debug!(request = ?request, "request");
    let described = format!("{request:?}");
    let response = handle(request, mounter.as_ref(), &locks).await;
    if let Response::Failed { message, .. } = &response {
        tracing::warn!(request = %described, error = %message, "request failed");
    } else if !["health", "daemon", "ping"]
        .iter()
        .any(|quiet| described.starts_with(quiet))
    {
        tracing::info!(request = %described, "done");
    }
    if let Err(e) = write_line(&mut stream, &response).await {
        tracing::warn!(request = %described, error = %e, "the plugin went away before the answer (the work is done; the next plugin adopts it)");
    }
}

/// This process among the mounters the plugin has talked to: its pid and when it started
/// (pids repeat across containers).
fn instance() -> &'static str {
    static INSTANCE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    INSTANCE.get_or_init(|| {
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{}@{started}", std::process::id())
    })
}

fn failed(kind: MountErrorKind, message: String) -> Response {
    Response::Failed { kind, message }
}

fn from_error(e: MountError) -> Response {
    failed(e.kind, e.message)
}

/// Carries out one request; mounts and unmounts hold their target's lock.
pub async fn handle(request: Request, mounter: &dyn Mounter, locks: &KeyedLocks) -> Response {
    match request {
        Request::Ping => Response::Pong {
            version: crate::VERSION.to_string(),
            pid: std::process::id(),
            features: Vec::new(),
            instance: Some(instance().to_string()),
            exited: crate::mounter::reaper::exited(),
        },
        Request::TakeOver {
            target,
            settings,
            auth,
            pid_file,
            log_file,
            volume_id,
            pod,
        } => {
            let _one_at_a_time = locks.lock(&target).await;
            let req = MountRequest {
                target: &target,
                settings: &settings,
                auth: &auth,
                pid_file: &pid_file,
                log_file: &log_file,
                volume_id: &volume_id,
                pod: pod.as_deref(),
            };
            match mounter.take_over(req).await {
                Ok(daemon) => Response::Mounted { daemon },
                Err(e) => failed(e.kind, auth.scrub(&e.message)),
            }
        }
        Request::Mount {
            target,
            settings,
            auth,
            pid_file,
            log_file,
            volume_id,
            pod,
        } => {
            let _one_at_a_time = locks.lock(&target).await;
            let req = MountRequest {
                target: &target,
                settings: &settings,
                auth: &auth,
                pid_file: &pid_file,
                log_file: &log_file,
                volume_id: &volume_id,
                pod: pod.as_deref(),
            };
            match mounter.mount(req).await {
                Ok(daemon) => Response::Mounted { daemon },
                // Neither the log below nor the plugin may see a secret
                // that a failure message echoed.
                Err(e) => failed(e.kind, auth.scrub(&e.message)),
            }
        }
        Request::Unmount { target, daemon } => {
            let _one_at_a_time = locks.lock(&target).await;
            match mounter.unmount(&target, daemon).await {
                Ok(()) => Response::Unmounted,
                Err(e) => from_error(e),
            }
        }
        Request::Health { target, daemon } => match mounter.health(&target, daemon).await {
            Ok(health) => Response::Health { health },
            Err(e) => from_error(e),
        },
        Request::DaemonFromPidFile { pid_file } => Response::Daemon {
            daemon: mounter.daemon_from_pid_file(&pid_file).await,
        },
        Request::Bind { source, target } => {
            let _one_at_a_time = locks.lock(&target).await;
            match mounter.bind(&source, &target).await {
                Ok(()) => Response::Bound,
                Err(e) => from_error(e),
            }
        }
        Request::Unbind { target } => {
            let _one_at_a_time = locks.lock(&target).await;
            match mounter.unbind(&target).await {
                Ok(()) => Response::Unmounted,
                Err(e) => from_error(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::settings::VolumeSettings;
    use crate::mounter::fake::FakeMounter;
    use crate::mounter::{DaemonCredentials, Health};
    use crate::remote::client::RemoteMounter;
    use std::collections::HashMap;
    use std::time::Duration;

    #[tokio::test]
    async fn the_remote_mounter_does_what_the_local_one_does() {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("mounter.sock");
        let fake = FakeMounter::new();
        let service = start(&socket, Arc::new(fake.clone())).await.expect("start");
        let mode = std::fs::metadata(&socket)
            .expect("socket")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let remote = RemoteMounter::new(socket.clone(), Duration::from_secs(5));
        let (version, pid) = remote.ping().await.expect("ping");
        assert_eq!(version, crate::VERSION);
        assert_eq!(pid, std::process::id());

        let target = dir.path().join("target");
        std::fs::create_dir(&target).expect("mkdir");
        let attrs: HashMap<String, String> =
            [("bucket".to_string(), "datasets".to_string())].into();
        let settings = VolumeSettings::parse(&attrs, &[]).expect("valid");
        let auth = DaemonCredentials::KeysFile {
            path: dir.path().join("keys.json"),
        };
        let pid_file = dir.path().join("k.pid");
        let req = MountRequest {
            target: &target,
            settings: &settings,
            auth: &auth,
            pid_file: &pid_file,
            log_file: &dir.path().join("k.log"),
            volume_id: "vol-1",
            pod: None,
        };
        let daemon = remote.mount(req).await.expect("mount").expect("a daemon");
        assert_eq!(
            remote.health(&target, Some(daemon)).await.expect("health"),
            Health::Live
        );
        assert_eq!(remote.daemon_from_pid_file(&pid_file).await, Some(daemon));
        // The identity reached the mounter's side whole.
        assert_eq!(fake.mount_at(&target).expect("mounted").auth, auth);
        assert!(fake.kill(&target));
        assert!(matches!(
            remote.health(&target, Some(daemon)).await.expect("health"),
            Health::Broken(_)
        ));
        remote
            .unmount(&target, Some(daemon))
            .await
            .expect("unmount");
        assert_eq!(
            remote.health(&target, None).await.expect("health"),
            Health::NotMounted
        );

        service.stop().await;
        let err = remote
            .health(&target, None)
            .await
            .expect_err("mounter gone");
        assert_eq!(err.kind, MountErrorKind::Unavailable);
        assert!(
            err.message.contains("riffle-mounter is not reachable"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn mounts_of_one_target_never_overlap_other_targets_do() {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("mounter.sock");
        let fake = FakeMounter::new();
        fake.set_delay(Duration::from_millis(200));
        let service = start(&socket, Arc::new(fake.clone())).await.expect("start");
        let settings = VolumeSettings::parse(
            &[("bucket".to_string(), "datasets".to_string())].into(),
            &[],
        )
        .expect("valid");
        let mount = |target: &'static str| {
            let (socket, settings, dir) =
                (socket.clone(), settings.clone(), dir.path().to_path_buf());
            tokio::spawn(async move {
                let remote = RemoteMounter::new(socket, Duration::from_secs(10));
                let target = dir.join(target);
                let _ = std::fs::create_dir_all(&target);
                remote
                    .mount(MountRequest {
                        target: &target,
                        settings: &settings,
                        auth: &DaemonCredentials::Node,
                        pid_file: &dir.join("p"),
                        log_file: &dir.join("l"),
                        volume_id: "vol-1",
                        pod: None,
                    })
                    .await
            })
        };
        // A plugin's mount still running when the next plugin mounts the
        // same target: one after the other.
        let (a, b) = (mount("same"), mount("same"));
        a.await.expect("join").expect("mount");
        b.await.expect("join").expect("mount");
        assert_eq!(fake.max_concurrent_mounts(), 1);
        let (c, d) = (mount("one"), mount("two"));
        c.await.expect("join").expect("mount");
        d.await.expect("join").expect("mount");
        assert_eq!(
            fake.max_concurrent_mounts(),
            2,
            "different targets in parallel"
        );
        service.stop().await;
    }

    #[tokio::test]
    async fn a_client_that_sends_nothing_holds_nothing_for_ever() {
        // The limit itself is 30 s; what matters is that reading is bounded
        // and the connection is closed without an answer.
        tokio::time::pause();
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("mounter.sock");
        let service = start(&socket, Arc::new(FakeMounter::new()))
            .await
            .expect("start");
        let mut silent = UnixStream::connect(&socket).await.expect("connect");
        tokio::time::advance(REQUEST_READ_LIMIT + Duration::from_secs(1)).await;
        let mut buf = Vec::new();
        let n = tokio::io::AsyncReadExt::read_to_end(&mut silent, &mut buf)
            .await
            .expect("read");
        assert_eq!(n, 0, "closed without an answer");
        service.stop().await;
    }

    #[tokio::test]
    async fn an_operation_the_mounter_does_not_know_is_an_error_not_a_hang() {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("mounter.sock");
        let service = start(&socket, Arc::new(FakeMounter::new()))
            .await
            .expect("start");
        let mut stream = UnixStream::connect(&socket).await.expect("connect");
        tokio::io::AsyncWriteExt::write_all(
            &mut stream,
            b"{\"op\":\"resize\",\"target\":\"/t\"}\n",
        )
        .await
        .expect("write");
        match read_line::<Response>(&mut stream).await.expect("an answer") {
            Response::Failed { kind, message } => {
                assert_eq!(kind, MountErrorKind::InvalidArgument);
                assert!(message.contains("unreadable request"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        service.stop().await;
    }
}
