//! Shared helpers for the integration tests: a CSI client that talks to the
//! plugin over its unix socket the way kubelet does, and request builders.

#![allow(dead_code)]

pub mod emulated;
pub mod node;
pub mod pod;
pub mod rgw;

use hyper_util::rt::TokioIo;
use riffle_csi::grpc::proto::identity_client::IdentityClient;
use riffle_csi::grpc::proto::node_client::NodeClient;
use riffle_csi::grpc::proto::volume_capability::access_mode::Mode;
use riffle_csi::grpc::proto::volume_capability::{AccessMode, AccessType, MountVolume};
use riffle_csi::grpc::proto::{
    NodePublishVolumeRequest, NodeStageVolumeRequest, NodeUnpublishVolumeRequest,
    NodeUnstageVolumeRequest, ProbeRequest, VolumeCapability,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::transport::{Channel, Endpoint, Uri};

/// A line of the tests' transcript (what a run showed, for the README's tables).
pub fn transcript(line: impl AsRef<str>) {
    println!("[transcript] {}", line.as_ref());
}

/// Identity and Node clients on one connection.
#[derive(Clone)]
pub struct Csi {
    pub identity: IdentityClient<Channel>,
    pub node: NodeClient<Channel>,
}

/// Connects to the plugin's unix socket, retrying until `limit`.
pub async fn connect(socket: &Path, limit: Duration) -> Csi {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let path = socket.to_path_buf();
        // The URI is required by the API but ignored: the connector dials the socket.
        let attempt = Endpoint::try_from("http://[::]:50051")
            .expect("static uri")
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(
                        tokio::net::UnixStream::connect(path).await?,
                    ))
                }
            }))
            .await;
        match attempt {
            Ok(channel) => {
                return Csi {
                    identity: IdentityClient::new(channel.clone()),
                    node: NodeClient::new(channel),
                }
            }
            Err(e) if tokio::time::Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("cannot connect to {}: {e}", socket.display()),
        }
    }
}

impl Csi {
    /// Waits until Probe reports ready.
    pub async fn wait_ready(&mut self, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Ok(r) = self.identity.probe(ProbeRequest {}).await {
                if r.into_inner().ready == Some(true) {
                    return;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "plugin not ready within {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn publish(&mut self, req: NodePublishVolumeRequest) -> Result<(), tonic::Status> {
        self.node.node_publish_volume(req).await.map(|_| ())
    }

    /// NodeStageVolume of `volume_id` at `staging` with `attributes`, as kubelet sends it for
    /// a PersistentVolume (ReadOnlyMany, no stage secret).
    pub async fn stage(
        &mut self,
        volume_id: &str,
        staging: &Path,
        attributes: HashMap<String, String>,
    ) -> Result<(), tonic::Status> {
        self.node
            .node_stage_volume(NodeStageVolumeRequest {
                volume_id: volume_id.to_string(),
                staging_target_path: staging.to_string_lossy().into_owned(),
                volume_capability: Some(capability(Mode::MultiNodeReaderOnly, &[])),
                volume_context: attributes,
                ..Default::default()
            })
            .await
            .map(|_| ())
    }

    pub async fn unstage(&mut self, volume_id: &str, staging: &Path) -> Result<(), tonic::Status> {
        self.node
            .node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: volume_id.to_string(),
                staging_target_path: staging.to_string_lossy().into_owned(),
            })
            .await
            .map(|_| ())
    }

    pub async fn unpublish(&mut self, volume_id: &str, target: &Path) -> Result<(), tonic::Status> {
        self.node
            .node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: volume_id.to_string(),
                target_path: target.to_string_lossy().into_owned(),
            })
            .await
            .map(|_| ())
    }
}

/// A filesystem volume capability with `mode` and mount flags.
pub fn capability(mode: Mode, flags: &[&str]) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: String::new(),
            mount_flags: flags.iter().map(|s| s.to_string()).collect(),
            volume_mount_group: String::new(),
        })),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

pub fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A read-only publish request as kubelet sends it for a ReadOnlyMany PV.
pub fn publish_request(
    volume_id: &str,
    target: &Path,
    attributes: HashMap<String, String>,
    secrets: HashMap<String, String>,
) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: volume_id.to_string(),
        target_path: target.to_string_lossy().into_owned(),
        volume_capability: Some(capability(Mode::MultiNodeReaderOnly, &[])),
        readonly: true,
        secrets,
        volume_context: attributes,
        ..Default::default()
    }
}

/// `base/plugins/kubernetes.io/csi/<driver>/<hash of the volume>/globalmount`, like kubelet's
/// staging paths (created, as kubelet does before NodeStageVolume).
pub fn kubelet_staging(base: &Path, volume: &str) -> PathBuf {
    let path = base
        .join("plugins/kubernetes.io/csi")
        .join(riffle_csi::DRIVER_NAME)
        .join(hex::encode(<sha2::Sha256 as sha2::Digest>::digest(volume)))
        .join("globalmount");
    std::fs::create_dir_all(&path).expect("create the staging path");
    path
}

/// A publish of a staged volume: [`publish_request`] with kubelet's staging path.
pub fn staged_publish_request(
    volume_id: &str,
    staging: &Path,
    target: &Path,
    attributes: HashMap<String, String>,
    secrets: HashMap<String, String>,
) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        staging_target_path: staging.to_string_lossy().into_owned(),
        ..publish_request(volume_id, target, attributes, secrets)
    }
}

/// `base/pods/<pod>/volumes/kubernetes.io~csi/<volume>/mount`, like kubelet's
/// target paths (the parent exists, the target does not).
pub fn kubelet_target(base: &Path, pod: &str, volume: &str) -> PathBuf {
    let parent = base
        .join("pods")
        .join(pod)
        .join("volumes/kubernetes.io~csi")
        .join(volume);
    std::fs::create_dir_all(&parent).expect("create target parent");
    parent.join("mount")
}

/// Asserts that no file below `root` (recursively, binary content included)
/// contains any of `values`; returns how many files were read, so that a
/// caller can make sure something was checked.
pub fn assert_no_secret_under(root: &Path, values: &[&str]) -> usize {
    let mut checked = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file() {
                let bytes = std::fs::read(&path).unwrap_or_default();
                checked += 1;
                for v in values {
                    assert!(
                        !bytes.windows(v.len()).any(|w| w == v.as_bytes()),
                        "a secret is in {}",
                        path.display()
                    );
                }
            }
        }
    }
    checked
}
