//! The CSI Node service: validates requests, hands them to the
//! [`VolumeManager`], maps failures to gRPC status codes.
//!
//! Validation order follows what csi-sanity checks: missing volume id,
//! target path or volume capability -> INVALID_ARGUMENT; then the
//! capability (filesystem access only, read-only), the attributes and mount
//! options, the secret, the identity ([`crate::kube::access`]: a volume with
//! neither a secret nor a role is refused with FAILED_PRECONDITION unless
//! the driver allows node credentials). rifflefs is read-only: a publish is accepted when
//! `readonly` is set or the access mode is a reader-only mode
//! (SINGLE_NODE_READER_ONLY, MULTI_NODE_READER_ONLY: a PV/PVC with
//! `ReadOnlyMany`); anything else asks for a writable volume and is refused
//! with INVALID_ARGUMENT saying how to fix the manifest.
//!
//! NodeStageVolume and NodeUnstageVolume (STAGE_UNSTAGE_VOLUME): a staged volume's
//! publishes share one daemon per identity and options ([`crate::volumes`]' `shared`
//! module); stage validates what it is given and prepares the staging directory, unstage
//! stops the shared daemons. Inline ephemeral volumes are not staged by kubelet and get a
//! daemon of their own, as before.
//!
//! NodeGetVolumeStats is answered by [`crate::grpc::volume_stats`].
//!
//! Status codes: AlreadyExists for a target taken with other settings,
//! FailedPrecondition for a target the plugin will not touch,
//! NotFound/PermissionDenied/Unavailable/DeadlineExceeded from the mount's
//! reason, Internal otherwise. Messages never contain credentials.

use crate::grpc::proto::node_server::Node;
use crate::grpc::proto::node_service_capability::rpc::Type as RpcType;
use crate::grpc::proto::node_service_capability::{Rpc, Type as CapabilityType};
use crate::grpc::proto::volume_capability::access_mode::Mode;
use crate::grpc::proto::volume_capability::AccessType;
use crate::grpc::proto::{
    NodeGetCapabilitiesRequest, NodeGetCapabilitiesResponse, NodeGetInfoRequest,
    NodeGetInfoResponse, NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse,
    NodePublishVolumeRequest, NodePublishVolumeResponse, NodeServiceCapability,
    NodeStageVolumeRequest, NodeStageVolumeResponse, NodeUnpublishVolumeRequest,
    NodeUnpublishVolumeResponse, NodeUnstageVolumeRequest, NodeUnstageVolumeResponse,
    VolumeCapability,
};
use crate::kube::access::{AccessPolicy, VolumeAccess};
use crate::kube::credentials::Credentials;
use crate::kube::settings::VolumeSettings;
use crate::mounter::MountErrorKind;
use crate::volumes::{PublishSpec, VolumeError, VolumeManager};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tonic::{Code, Request, Response, Status};

/// Filesystem types a volume capability may name.
const FS_TYPES: &[&str] = &["", "fuse.riffle", "riffle", "rifflefs"];

/// The Node service.
pub struct NodeService {
    node_id: String,
    manager: Arc<VolumeManager>,
    policy: AccessPolicy,
}

impl NodeService {
    pub fn new(node_id: String, manager: Arc<VolumeManager>, policy: AccessPolicy) -> Self {
        Self {
            node_id,
            manager,
            policy,
        }
    }
}

fn invalid(msg: impl Into<String>) -> Status {
    Status::invalid_argument(msg)
}

fn target_path(raw: &str) -> Result<PathBuf, Status> {
    if raw.is_empty() {
        return Err(invalid("target_path is required"));
    }
    let path = Path::new(raw);
    if !path.is_absolute() {
        return Err(invalid(format!(
            "target_path {raw:?} must be an absolute path"
        )));
    }
    Ok(path.to_path_buf())
}

/// The optional staging path of a publish: empty (not staged) or absolute.
fn staging_path(raw: &str) -> Result<Option<PathBuf>, Status> {
    if raw.is_empty() {
        return Ok(None);
    }
    let path = Path::new(raw);
    if !path.is_absolute() {
        return Err(invalid(format!(
            "staging_target_path {raw:?} must be an absolute path"
        )));
    }
    Ok(Some(path.to_path_buf()))
}

/// Validates a stage request: the staging path, the capability's access type and file
/// system type, and the volume's attributes and mount options (so that a bad attribute is
/// reported at stage, before any pod waits on a publish). Returns the staging path.
pub fn validate_stage(req: &NodeStageVolumeRequest) -> Result<PathBuf, Status> {
    if req.volume_id.is_empty() {
        return Err(invalid("volume_id is required"));
    }
    let staging = staging_path(&req.staging_target_path)?
        .ok_or_else(|| invalid("staging_target_path is required"))?;
    let capability = req
        .volume_capability
        .as_ref()
        .ok_or_else(|| invalid("volume_capability is required"))?;
    let mount = mount_capability(capability)?;
    volume_settings(&req.volume_context, mount)?;
    Ok(staging)
}

/// The volume's settings from its attributes, mount options and fsGroup.
fn volume_settings(
    volume_context: &std::collections::HashMap<String, String>,
    mount: &crate::grpc::proto::volume_capability::MountVolume,
) -> Result<VolumeSettings, Status> {
    let mut settings = VolumeSettings::parse(volume_context, &mount.mount_flags)
        .map_err(|e| invalid(e.to_string()))?;
    settings
        .apply_mount_group(&mount.volume_mount_group)
        .map_err(|e| invalid(e.to_string()))?;
    Ok(settings)
}

/// The capability's mount access with a file system type rifflefs serves.
fn mount_capability(
    capability: &VolumeCapability,
) -> Result<&crate::grpc::proto::volume_capability::MountVolume, Status> {
    let mount = match &capability.access_type {
        Some(AccessType::Mount(m)) => m,
        Some(AccessType::Block(_)) => {
            return Err(invalid(
                "block access is not supported: rifflefs volumes are filesystems (use volumeMode: Filesystem)",
            ))
        }
        None => return Err(invalid("volume_capability.access_type is required (mount)")),
    };
    if !FS_TYPES.contains(&mount.fs_type.as_str()) {
        return Err(invalid(format!(
            "fsType {:?} is not supported: leave it empty or use fuse.riffle",
            mount.fs_type
        )));
    }
    Ok(mount)
}

/// Validates a publish request into a [`PublishSpec`].
pub fn validate_publish(
    req: &NodePublishVolumeRequest,
    policy: &AccessPolicy,
) -> Result<PublishSpec, Status> {
    if req.volume_id.is_empty() {
        return Err(invalid("volume_id is required"));
    }
    let target = target_path(&req.target_path)?;
    let staging = staging_path(&req.staging_target_path)?;
    let capability = req
        .volume_capability
        .as_ref()
        .ok_or_else(|| invalid("volume_capability is required"))?;
    let mount = mount_capability(capability)?;
    let mode = capability
        .access_mode
        .as_ref()
        .ok_or_else(|| invalid("volume_capability.access_mode is required"))?
        .mode();
    if mode == Mode::Unknown {
        return Err(invalid("volume_capability.access_mode is UNKNOWN"));
    }
    let reader_only = matches!(mode, Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly);
    if !req.readonly && !reader_only {
        return Err(invalid(format!(
            "rifflefs volumes are read-only but a writable volume was requested (access mode {}, readonly=false): use accessModes [ReadOnlyMany] on the PV and PVC, or readOnly: true on the volume",
            mode.as_str_name()
        )));
    }
    let settings = volume_settings(&req.volume_context, mount)?;
    let credentials =
        Credentials::from_secrets(&req.secrets).map_err(|e| invalid(e.to_string()))?;
    let access = VolumeAccess::resolve(&settings, credentials, &req.volume_context, policy)
        .map_err(|e| {
            if e.is_invalid_argument() {
                invalid(e.to_string())
            } else {
                Status::failed_precondition(e.to_string())
            }
        })?;
    let pod = pod_info(&req.volume_context);
    Ok(PublishSpec {
        volume_id: req.volume_id.clone(),
        target,
        settings,
        access,
        pod,
        staging,
    })
}

/// `namespace/name` of the pod a publish is for, from the pod info kubelet adds to the volume
/// context (`podInfoOnMount`); None without a pod name.
fn pod_info(volume_context: &std::collections::HashMap<String, String>) -> Option<String> {
    let get = |k: &str| {
        volume_context
            .get(&format!("csi.storage.k8s.io/pod.{k}"))
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    };
    let name = get("name")?;
    Some(match get("namespace") {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name.to_string(),
    })
}

/// Maps a volume failure to a gRPC status.
pub fn to_status(err: &VolumeError) -> Status {
    let code = match err {
        VolumeError::AlreadyExists(_) => Code::AlreadyExists,
        VolumeError::FailedPrecondition(_) => Code::FailedPrecondition,
        VolumeError::Mount(m) => match m.kind {
            MountErrorKind::InvalidArgument => Code::InvalidArgument,
            MountErrorKind::NotFound => Code::NotFound,
            MountErrorKind::PermissionDenied => Code::PermissionDenied,
            MountErrorKind::Unavailable => Code::Unavailable,
            MountErrorKind::Timeout => Code::DeadlineExceeded,
            MountErrorKind::FailedPrecondition | MountErrorKind::NothingToTakeOver => {
                Code::FailedPrecondition
            }
            MountErrorKind::Internal => Code::Internal,
        },
        VolumeError::State(_) | VolumeError::Secrets(_) | VolumeError::Io { .. } => Code::Internal,
    };
    Status::new(code, err.to_string())
}

/// Maps a failed unpublish, stage or unstage of `volume_id` at `path` to its status, and logs
/// it at ERROR (a publish's failure is logged by its caller: its message is scrubbed of keys).
fn failed<'a>(
    call: &'static str,
    volume_id: &'a str,
    path: &'a Path,
) -> impl FnOnce(VolumeError) -> Status + 'a {
    move |e| {
        let status = to_status(&e);
        tracing::error!(volume_id, path = %path.display(), error = %status.message(), "{call} failed");
        status
    }
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let req = request.into_inner();
        let spec = validate_publish(&req, &self.policy).inspect_err(|s| {
            tracing::warn!(volume_id = %req.volume_id, target = %req.target_path, error = %s.message(), "NodePublishVolume refused");
        })?;
        let access = spec.access.clone();
        tracing::info!(
            volume_id = %spec.volume_id,
            target = %spec.target.display(),
            source = %spec.settings.source_url(),
            credentials = access.describe(),
            "NodePublishVolume"
        );
        match self.manager.publish(spec).await {
            Ok(()) => Ok(Response::new(NodePublishVolumeResponse {})),
            Err(e) => {
                let status = to_status(&e);
                let message = access.scrub(status.message());
                tracing::error!(volume_id = %req.volume_id, target = %req.target_path, code = ?status.code(), error = %message, "NodePublishVolume failed");
                Err(Status::new(status.code(), message))
            }
        }
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let req = request.into_inner();
        if req.volume_id.is_empty() {
            return Err(invalid("volume_id is required"));
        }
        let target = target_path(&req.target_path)?;
        tracing::info!(volume_id = %req.volume_id, target = %target.display(), "NodeUnpublishVolume");
        self.manager
            .unpublish(&req.volume_id, &target)
            .await
            .map_err(failed("NodeUnpublishVolume", &req.volume_id, &target))?;
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let req = request.into_inner();
        let staging = validate_stage(&req).inspect_err(|s| {
            tracing::warn!(volume_id = %req.volume_id, staging = %req.staging_target_path, error = %s.message(), "NodeStageVolume refused");
        })?;
        if !req.secrets.is_empty() {
            tracing::warn!(volume_id = %req.volume_id, "NodeStageVolume carries a nodeStageSecretRef secret, which rifflefs does not use: a volume's keys come with each publish (nodePublishSecretRef)");
        }
        tracing::info!(volume_id = %req.volume_id, staging = %staging.display(), "NodeStageVolume");
        self.manager
            .stage(&req.volume_id, &staging)
            .await
            .map_err(failed("NodeStageVolume", &req.volume_id, &staging))?;
        Ok(Response::new(NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let req = request.into_inner();
        if req.volume_id.is_empty() {
            return Err(invalid("volume_id is required"));
        }
        let staging = staging_path(&req.staging_target_path)?
            .ok_or_else(|| invalid("staging_target_path is required"))?;
        tracing::info!(volume_id = %req.volume_id, staging = %staging.display(), "NodeUnstageVolume");
        self.manager
            .unstage(&req.volume_id, &staging)
            .await
            .map_err(failed("NodeUnstageVolume", &req.volume_id, &staging))?;
        Ok(Response::new(NodeUnstageVolumeResponse {}))
    }

    async fn node_get_capabilities(
        &self,
        _request: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        // Staging (one daemon per staged volume, identity and options, shared by the pods
        // on the node), volume stats and their condition, and the pod's fsGroup as the
        // files' group (VOLUME_MOUNT_GROUP: kubelet hands it over instead of changing
        // ownership, which a read-only mount cannot take); no expansion.
        let rpc = |kind: RpcType| NodeServiceCapability {
            r#type: Some(CapabilityType::Rpc(Rpc {
                r#type: kind as i32,
            })),
        };
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: vec![
                rpc(RpcType::StageUnstageVolume),
                rpc(RpcType::GetVolumeStats),
                rpc(RpcType::VolumeCondition),
                rpc(RpcType::VolumeMountGroup),
            ],
        }))
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let req = request.into_inner();
        crate::grpc::volume_stats::volume_stats(&self.manager, &req)
            .await
            .map(Response::new)
    }

    async fn node_get_info(
        &self,
        _request: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            max_volumes_per_node: 0,
            accessible_topology: None,
        }))
    }
}
