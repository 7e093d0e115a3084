//! The csi-sanity node-plugin cases (and the plugin's own rules on top),
//! driven over the plugin's unix socket as kubelet does, with the in-memory
//! fake mounter behind a `riffle-mounter` service, as deployed (the plugin
//! talks to it over its socket): always runnable, no FUSE and no object
//! store needed.
//!
//! csi-sanity itself cannot run here (no Go toolchain, and it needs a
//! controller service to create volumes); each test names the csi-sanity
//! case it mirrors. One deliberate difference: csi-sanity publishes with
//! SINGLE_NODE_WRITER and readonly=false, which a read-only driver refuses;
//! these tests publish read-only (MULTI_NODE_READER_ONLY, or readonly=true).

mod common;

use common::{
    assert_no_secret_under, capability, kubelet_staging, kubelet_target, map, publish_request,
    staged_publish_request, Csi,
};
use riffle_csi::grpc::proto::node_service_capability::rpc::Type as RpcType;
use riffle_csi::grpc::proto::node_service_capability::Type as CapabilityType;
use riffle_csi::grpc::proto::volume_capability::access_mode::Mode;
use riffle_csi::grpc::proto::volume_capability::{AccessMode, AccessType, BlockVolume};
use riffle_csi::grpc::proto::volume_usage::Unit;
use riffle_csi::grpc::proto::{
    GetPluginCapabilitiesRequest, GetPluginInfoRequest, NodeGetCapabilitiesRequest,
    NodeGetInfoRequest, NodeGetVolumeStatsRequest, NodeUnpublishVolumeRequest, ProbeRequest,
    VolumeCapability,
};
use riffle_csi::grpc::server::{self, PluginConfig, RunningPlugin};
use riffle_csi::kube::access::AccessPolicy;
use riffle_csi::mounter::fake::{FakeMounter, FAKE_MARKER};
use riffle_csi::mounter::{MountError, MountErrorKind};
use riffle_csi::remote::client::RemoteMounter;
use riffle_csi::remote::service::{self, RunningService};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tonic::Code;

/// Everything the plugin logs in this test process (all tests share it).
fn logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&buf);
        let _ = tracing_subscriber::fmt()
            .with_env_filter("debug")
            .with_ansi(false)
            .with_writer(move || LogWriter(Arc::clone(&sink)))
            .try_init();
        buf
    })
}

struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl Write for LogWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn log_text() -> String {
    String::from_utf8_lossy(&logs().lock().unwrap_or_else(|p| p.into_inner())).into_owned()
}

/// A plugin and a mounter service with a fake mounter in a temporary
/// directory.
struct Fixture {
    dir: tempfile::TempDir,
    /// The plugin's secrets directory, on the tmpfs at /dev/shm.
    secrets: tempfile::TempDir,
    allow_node_credentials: bool,
    check_interval: Duration,
    fake: FakeMounter,
    plugin: Option<RunningPlugin>,
    mounter: Option<RunningService>,
    csi: Csi,
}

impl Fixture {
    /// A plugin that allows node credentials (most cases here publish
    /// without a secret, as csi-sanity does).
    async fn new() -> Self {
        Self::with_options(true, Duration::from_millis(200)).await
    }

    /// A fixture whose supervisor checks the mounts every `interval` (an hour: a dead mount
    /// stays dead for the test).
    async fn with_check_interval(interval: Duration) -> Self {
        Self::with_options(true, interval).await
    }

    async fn with_node_credentials(allow: bool) -> Self {
        Self::with_options(allow, Duration::from_millis(200)).await
    }

    async fn with_options(allow: bool, interval: Duration) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let secrets = shm_dir();
        let fake = FakeMounter::new();
        let mounter = serve(dir.path(), &fake).await;
        let (plugin, csi) = start_with(dir.path(), secrets.path(), allow, interval).await;
        Self {
            dir,
            secrets,
            allow_node_credentials: allow,
            check_interval: interval,
            fake,
            plugin: Some(plugin),
            mounter: Some(mounter),
            csi,
        }
    }

    /// Publishes bucket `datasets` as volume `id` at `target`, no secret.
    async fn publish_datasets(&mut self, id: &str, target: &Path) {
        self.csi
            .publish(publish_request(
                id,
                target,
                bucket("datasets"),
                Default::default(),
            ))
            .await
            .expect("publish");
    }

    fn target(&self, pod: &str, volume: &str) -> PathBuf {
        kubelet_target(&self.dir.path().join("kubelet"), pod, volume)
    }

    /// Stops the plugin (mounts stay) and starts a new one on the same
    /// socket and state directory.
    async fn restart(&mut self) {
        if let Some(p) = self.plugin.take() {
            p.stop().await.expect("clean stop");
        }
        let (plugin, csi) = start_with(
            self.dir.path(),
            self.secrets.path(),
            self.allow_node_credentials,
            self.check_interval,
        )
        .await;
        self.plugin = Some(plugin);
        self.csi = csi;
    }
}

/// The mounter service, serving `fake`, at `dir`/mounter.sock.
async fn serve(dir: &Path, fake: &FakeMounter) -> RunningService {
    logs();
    service::start(&dir.join("mounter.sock"), Arc::new(fake.clone()))
        .await
        .expect("mounter service starts")
}

/// Waits until the fake mount at `target` is alive with a daemon other than
/// `before` (the supervisor remounted it). A remount unmounts first, so the
/// fake may have no mount there for a moment.
async fn wait_remounted(fake: &FakeMounter, target: &Path, before: i32) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(m) = fake.mount_at(target).filter(|m| m.alive) {
            assert_ne!(m.daemon.pid, before);
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} not remounted in time",
            target.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A fresh directory on the tmpfs at /dev/shm (the plugin refuses to keep
/// secrets anywhere else; it would mount a tmpfs, which these in-process
/// tests would then have to unmount).
fn shm_dir() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm").expect("a tmpfs at /dev/shm")
}

/// A plugin using the mounter service at `dir`/mounter.sock.
async fn start(dir: &Path, secrets: &Path, allow_node_credentials: bool) -> (RunningPlugin, Csi) {
    start_with(
        dir,
        secrets,
        allow_node_credentials,
        Duration::from_millis(200),
    )
    .await
}

/// [`start`], with the supervisor checking every `check_interval`.
async fn start_with(
    dir: &Path,
    secrets: &Path,
    allow_node_credentials: bool,
    check_interval: Duration,
) -> (RunningPlugin, Csi) {
    logs();
    let socket = dir.join("csi.sock");
    let plugin = server::start(
        PluginConfig {
            socket: socket.clone(),
            node_id: "node-a".into(),
            state_dir: dir.join("state"),
            secrets_dir: secrets.to_path_buf(),
            policy: AccessPolicy {
                allow_node_credentials,
                ..Default::default()
            },
            check_interval,
            takeover_wait: Duration::ZERO,
        },
        Arc::new(RemoteMounter::new(
            dir.join("mounter.sock"),
            Duration::from_secs(10),
        )),
    )
    .await
    .expect("plugin starts");
    let mut csi = common::connect(&socket, Duration::from_secs(10)).await;
    csi.wait_ready(Duration::from_secs(10)).await;
    (plugin, csi)
}

fn bucket(name: &str) -> std::collections::HashMap<String, String> {
    map(&[("bucket", name)])
}

fn code(r: Result<(), tonic::Status>) -> Code {
    match r {
        Ok(()) => Code::Ok,
        Err(s) => s.code(),
    }
}

// ---------------------------------------------------------------- Identity

#[tokio::test]
async fn identity_get_plugin_info() {
    // csi-sanity: GetPluginInfo "should return appropriate information".
    let mut f = Fixture::new().await;
    let info = f
        .csi
        .identity
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .expect("ok")
        .into_inner();
    assert_eq!(info.name, "riffle.csi.rifflefs.io");
    assert!(info.name.len() <= 63);
    assert!(info
        .name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-'));
    assert!(!info.vendor_version.is_empty());
}

#[tokio::test]
async fn identity_capabilities_and_probe() {
    // csi-sanity: GetPluginCapabilities and Probe.
    let mut f = Fixture::new().await;
    let caps = f
        .csi
        .identity
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .expect("ok")
        .into_inner();
    assert!(caps.capabilities.is_empty(), "no controller service");
    let probe = f
        .csi
        .identity
        .probe(ProbeRequest {})
        .await
        .expect("ok")
        .into_inner();
    assert_eq!(probe.ready, Some(true));
}

// ---------------------------------------------------------------- Node info

#[tokio::test]
async fn node_get_capabilities() {
    // csi-sanity: NodeGetCapabilities "should return appropriate capabilities".
    let mut f = Fixture::new().await;
    let caps = f
        .csi
        .node
        .node_get_capabilities(NodeGetCapabilitiesRequest {})
        .await
        .expect("ok")
        .into_inner();
    let kinds: Vec<RpcType> = caps
        .capabilities
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(CapabilityType::Rpc(rpc)) => RpcType::try_from(rpc.r#type).ok(),
            None => None,
        })
        .collect();
    // Staging, volume stats and their condition, the pod's fsGroup; no expansion.
    assert_eq!(
        kinds,
        [
            RpcType::StageUnstageVolume,
            RpcType::GetVolumeStats,
            RpcType::VolumeCondition,
            RpcType::VolumeMountGroup
        ]
    );
}

/// kubelet hands the pod's fsGroup over as `volume_mount_group` (VOLUME_MOUNT_GROUP): it
/// becomes the files' group; a volume gid that disagrees is refused with both named.
#[tokio::test]
async fn the_pods_fs_group_is_the_files_group() {
    let mut f = Fixture::new().await;
    let with_group = |id: &str, target: &Path, flags: &[&str], group: &str| {
        let mut req = publish_request(id, target, bucket("datasets"), Default::default());
        let mut cap = capability(Mode::MultiNodeReaderOnly, flags);
        if let Some(AccessType::Mount(m)) = cap.access_type.as_mut() {
            m.volume_mount_group = group.to_string();
        }
        req.volume_capability = Some(cap);
        req
    };
    let target = f.target("fsgroup", "data");
    f.csi
        .publish(with_group("vol-g", &target, &[], "2000"))
        .await
        .expect("publish with an fsGroup");
    let mount = f.fake.mount_at(&target).expect("mounted");
    assert!(
        mount.flags.contains(&"--gid=2000".to_string()),
        "{:?}",
        mount.flags
    );
    f.csi.unpublish("vol-g", &target).await.expect("unpublish");

    let target = f.target("fsgroup-conflict", "data");
    let err = f
        .csi
        .publish(with_group("vol-h", &target, &["gid=100"], "2000"))
        .await
        .expect_err("a volume gid other than the fsGroup");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("fsGroup is 2000"),
        "{}",
        err.message()
    );
    assert!(f.fake.mount_at(&target).is_none());
}

fn stats_request(volume_id: &str, path: &Path) -> NodeGetVolumeStatsRequest {
    NodeGetVolumeStatsRequest {
        volume_id: volume_id.into(),
        volume_path: path.to_string_lossy().into_owned(),
        staging_target_path: String::new(),
    }
}

#[tokio::test]
async fn node_get_volume_stats_refuses_what_is_not_published() {
    // csi-sanity: NodeGetVolumeStats "should fail when no volume id provided", "... no volume
    // path provided", "... volume is not found".
    let mut f = Fixture::new().await;
    let target = f.target("pod", "data");
    f.publish_datasets("vol", &target).await;
    let node = f.csi.node.clone();
    let call = |req: NodeGetVolumeStatsRequest| {
        let mut node = node.clone();
        async move { node.node_get_volume_stats(req).await.map(|_| ()) }
    };
    assert_eq!(
        code(call(stats_request("", &target)).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(call(stats_request("vol", Path::new(""))).await),
        Code::InvalidArgument
    );
    let elsewhere = f.target("other-pod", "data");
    assert_eq!(
        code(call(stats_request("vol", &elsewhere)).await),
        Code::NotFound
    );
    assert_eq!(
        code(call(stats_request("another-vol", &target)).await),
        Code::NotFound
    );
    f.csi.unpublish("vol", &target).await.expect("unpublish");
    assert_eq!(
        code(call(stats_request("vol", &target)).await),
        Code::NotFound,
        "unpublished"
    );
}

#[tokio::test]
async fn node_get_volume_stats_reads_the_mount_and_reports_a_dead_one() {
    // An hour between checks: the dead mount below stays dead while it is asked about.
    let mut f = Fixture::with_check_interval(Duration::from_secs(3600)).await;
    let target = f.target("pod", "data");
    f.publish_datasets("vol", &target).await;
    // What a riffle daemon serves at its mount root (the fake mount is a plain directory).
    std::fs::write(
        target.join(".riffle-stats"),
        br#"{"volume": {"listed_files": 3, "listed_dirs": 1, "listed_entries": 4,
                        "listed_bytes": 5000, "cached_bytes": 1200}}"#,
    )
    .expect("write");
    let r = f
        .csi
        .node
        .node_get_volume_stats(stats_request("vol", &target))
        .await
        .expect("stats")
        .into_inner();
    let usage: Vec<(i32, i64, i64, i64)> = r
        .usage
        .iter()
        .map(|u| (u.unit, u.total, u.used, u.available))
        .collect();
    assert_eq!(
        usage,
        [
            (Unit::Bytes as i32, 5000, 1200, 3800),
            (Unit::Inodes as i32, 4, 4, 0)
        ]
    );
    assert_eq!(r.volume_condition.map(|c| c.abnormal), Some(false));

    assert!(f.fake.kill(&target));
    let r = f
        .csi
        .node
        .node_get_volume_stats(stats_request("vol", &target))
        .await
        .expect("a dead mount is an answer, not an error")
        .into_inner();
    assert!(r.usage.is_empty());
    let condition = r.volume_condition.expect("condition");
    assert!(condition.abnormal);
    assert!(condition.message.contains("dead"), "{}", condition.message);
    std::fs::remove_file(target.join(".riffle-stats")).expect("remove");
    f.csi.unpublish("vol", &target).await.expect("unpublish");
}

#[tokio::test]
async fn node_get_info() {
    // csi-sanity: NodeGetInfo "should return appropriate values".
    let mut f = Fixture::new().await;
    let info = f
        .csi
        .node
        .node_get_info(NodeGetInfoRequest {})
        .await
        .expect("ok")
        .into_inner();
    assert_eq!(info.node_id, "node-a");
    assert!(info.max_volumes_per_node >= 0);
    assert!(info.accessible_topology.is_none());
}

// ---------------------------------------------------- argument validation

#[tokio::test]
async fn publish_missing_arguments() {
    // csi-sanity: NodePublishVolume "should fail when no volume id / target
    // path / volume capability is provided".
    let mut f = Fixture::new().await;
    let target = f.target("pod", "vol");
    let full = publish_request("vol-1", &target, bucket("datasets"), Default::default());

    let mut no_id = full.clone();
    no_id.volume_id.clear();
    assert_eq!(code(f.csi.publish(no_id).await), Code::InvalidArgument);

    let mut no_target = full.clone();
    no_target.target_path.clear();
    assert_eq!(code(f.csi.publish(no_target).await), Code::InvalidArgument);

    let mut no_cap = full.clone();
    no_cap.volume_capability = None;
    assert_eq!(code(f.csi.publish(no_cap).await), Code::InvalidArgument);

    let mut relative = full.clone();
    relative.target_path = "relative/target".into();
    assert_eq!(code(f.csi.publish(relative).await), Code::InvalidArgument);

    let mut no_mode = full.clone();
    if let Some(c) = no_mode.volume_capability.as_mut() {
        c.access_mode = None;
    }
    assert_eq!(code(f.csi.publish(no_mode).await), Code::InvalidArgument);

    let mut block = full.clone();
    block.volume_capability = Some(VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(AccessMode {
            mode: Mode::MultiNodeReaderOnly as i32,
        }),
    });
    let err = f.csi.publish(block).await.expect_err("block refused");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("block"), "{}", err.message());

    assert_eq!(f.fake.mount_calls(), 0);
    assert!(!target.exists());
}

#[tokio::test]
async fn unpublish_missing_arguments() {
    // csi-sanity: NodeUnpublishVolume "should fail when no volume id / target
    // path is provided".
    let mut f = Fixture::new().await;
    let r = f
        .csi
        .node
        .node_unpublish_volume(NodeUnpublishVolumeRequest::default())
        .await;
    assert_eq!(r.expect_err("no id").code(), Code::InvalidArgument);
    let r = f
        .csi
        .node
        .node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: "vol-1".into(),
            target_path: String::new(),
        })
        .await;
    assert_eq!(r.expect_err("no target").code(), Code::InvalidArgument);
}

// ------------------------------------------------- publish / unpublish

#[tokio::test]
async fn publish_creates_and_unpublish_removes_target() {
    // csi-sanity: NodeUnpublishVolume "should remove target path", and the
    // node part of "should work".
    let mut f = Fixture::new().await;
    let target = f.target("pod-1", "data");
    assert!(!target.exists());
    f.csi
        .publish(publish_request(
            "vol-1",
            &target,
            map(&[("bucket", "datasets"), ("prefix", "imagenet")]),
            Default::default(),
        ))
        .await
        .expect("publish");
    assert!(target.is_dir(), "target created by the plugin");
    let marker = std::fs::read_to_string(target.join(FAKE_MARKER)).expect("read through mount");
    assert_eq!(marker, "s3://datasets/imagenet/");
    f.csi.unpublish("vol-1", &target).await.expect("unpublish");
    assert!(!target.exists(), "target removed by the plugin");
    assert_eq!(f.fake.mount_count(), 0);
    let state = std::fs::read_dir(f.dir.path().join("state/volumes"))
        .expect("state dir")
        .count();
    assert_eq!(state, 0, "no record left");
}

#[tokio::test]
async fn publish_and_unpublish_are_idempotent() {
    // csi-sanity: Node Service "should be idempotent" (publish twice,
    // unpublish twice).
    let mut f = Fixture::new().await;
    let target = f.target("pod-1", "data");
    let req = publish_request("vol-1", &target, bucket("datasets"), Default::default());
    f.csi.publish(req.clone()).await.expect("first publish");
    f.csi.publish(req.clone()).await.expect("second publish");
    assert_eq!(f.fake.mount_calls(), 1, "second publish is a no-op");
    f.csi
        .unpublish("vol-1", &target)
        .await
        .expect("first unpublish");
    f.csi
        .unpublish("vol-1", &target)
        .await
        .expect("second unpublish");
    assert!(!target.exists());
}

#[tokio::test]
async fn target_path_that_is_a_file_is_refused() {
    let mut f = Fixture::new().await;
    let target = f.target("pod-file", "data");
    std::fs::write(&target, b"not a directory").expect("write");
    let err = f
        .csi
        .publish(publish_request(
            "vol",
            &target,
            bucket("datasets"),
            Default::default(),
        ))
        .await
        .expect_err("file target");
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message().contains("not a directory"),
        "{}",
        err.message()
    );
    assert_eq!(f.fake.mount_calls(), 0);
    assert!(target.is_file(), "left alone");
}

#[tokio::test]
async fn unpublish_unknown_target_is_ok() {
    let mut f = Fixture::new().await;
    let target = f.target("nobody", "nothing");
    f.csi
        .unpublish("vol-unknown", &target)
        .await
        .expect("unknown target is OK");
    // An existing empty directory kubelet left behind is removed too.
    std::fs::create_dir_all(&target).expect("mkdir");
    f.csi.unpublish("vol-unknown", &target).await.expect("ok");
    assert!(!target.exists());
}

#[tokio::test]
async fn same_target_other_settings_is_already_exists() {
    let mut f = Fixture::new().await;
    let target = f.target("pod-1", "data");
    f.csi
        .publish(publish_request(
            "vol-1",
            &target,
            bucket("datasets"),
            Default::default(),
        ))
        .await
        .expect("publish");
    let err = f
        .csi
        .publish(publish_request(
            "vol-1",
            &target,
            map(&[("bucket", "datasets"), ("prefix", "other")]),
            Default::default(),
        ))
        .await
        .expect_err("different settings");
    assert_eq!(err.code(), Code::AlreadyExists);
    assert!(
        err.message().contains("different settings"),
        "{}",
        err.message()
    );
    let err = f
        .csi
        .publish(publish_request(
            "vol-2",
            &target,
            bucket("datasets"),
            Default::default(),
        ))
        .await
        .expect_err("different volume");
    assert_eq!(err.code(), Code::AlreadyExists);
    // Same settings spelled differently (mount option instead of attribute,
    // explicit false boolean) are the same publish.
    let mut same = publish_request(
        "vol-1",
        &target,
        map(&[("bucket", "datasets"), ("warm", "false")]),
        Default::default(),
    );
    same.volume_capability = Some(capability(Mode::MultiNodeReaderOnly, &["ro"]));
    f.csi.publish(same).await.expect("same settings");
    assert_eq!(f.fake.mount_calls(), 1);
    f.csi.unpublish("vol-1", &target).await.expect("unpublish");
}

#[tokio::test]
async fn writable_requests_are_refused() {
    let mut f = Fixture::new().await;
    let target = f.target("pod-1", "data");
    let mut rw = publish_request("vol-1", &target, bucket("datasets"), Default::default());
    rw.readonly = false;
    rw.volume_capability = Some(capability(Mode::SingleNodeWriter, &[]));
    let err = f
        .csi
        .publish(rw.clone())
        .await
        .expect_err("writable refused");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("read-only"), "{}", err.message());
    assert!(err.message().contains("ReadOnlyMany"), "{}", err.message());
    assert!(!target.exists());

    // An inline ephemeral volume: SINGLE_NODE_WRITER but readOnly: true.
    rw.readonly = true;
    rw.volume_context
        .insert("csi.storage.k8s.io/ephemeral".into(), "true".into());
    f.csi.publish(rw).await.expect("readonly inline volume");
    f.csi.unpublish("vol-1", &target).await.expect("unpublish");
}

#[tokio::test]
async fn attributes_and_mount_options_are_validated() {
    let mut f = Fixture::new().await;
    let target = f.target("pod-1", "data");

    let err = f
        .csi
        .publish(publish_request(
            "vol-1",
            &target,
            map(&[("bucket", "datasets"), ("colour", "red"), ("sizeGB", "3")]),
            Default::default(),
        ))
        .await
        .expect_err("unknown attributes");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("colour, sizeGB"),
        "{}",
        err.message()
    );

    let err = f
        .csi
        .publish(publish_request(
            "vol-1",
            &target,
            map(&[("prefix", "x")]),
            Default::default(),
        ))
        .await
        .expect_err("no bucket");
    assert!(err.message().contains("bucket"), "{}", err.message());

    let mut bad_flag = publish_request("vol-1", &target, bucket("datasets"), Default::default());
    bad_flag.volume_capability = Some(capability(Mode::MultiNodeReaderOnly, &["rw", "exec"]));
    let err = f
        .csi
        .publish(bad_flag)
        .await
        .expect_err("bad mount options");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("rw, exec"), "{}", err.message());

    let mut fs_type = publish_request("vol-1", &target, bucket("datasets"), Default::default());
    if let Some(AccessType::Mount(m)) = fs_type
        .volume_capability
        .as_mut()
        .and_then(|c| c.access_type.as_mut())
    {
        m.fs_type = "ext4".into();
    }
    assert_eq!(code(f.csi.publish(fs_type).await), Code::InvalidArgument);
    assert_eq!(f.fake.mount_calls(), 0);

    // Valid attributes, kubelet's podInfoOnMount keys, and allowed mount
    // options reach riffle as flags.
    let mut ok = publish_request(
        "vol-1",
        &target,
        map(&[
            ("bucket", "datasets"),
            ("endpointUrl", "http://rgw.storage:7480"),
            ("forcePathStyle", "true"),
            ("metadataTtl", "indefinite"),
            ("csi.storage.k8s.io/pod.name", "trainer-0"),
            ("csi.storage.k8s.io/pod.namespace", "ml"),
            ("csi.storage.k8s.io/serviceAccount.name", "default"),
        ]),
        Default::default(),
    );
    ok.volume_capability = Some(capability(
        Mode::MultiNodeReaderOnly,
        &["uid=1000", "gid=1000", "allow-other", "max-inflight=128"],
    ));
    f.csi.publish(ok).await.expect("valid publish");
    let mount = f.fake.mount_at(&target).expect("mounted");
    assert_eq!(
        mount.flags,
        vec![
            "--endpoint-url=http://rgw.storage:7480",
            "--force-path-style",
            "--gid=1000",
            "--max-inflight=128",
            "--metadata-ttl=indefinite",
            "--uid=1000",
        ]
    );
    assert!(
        mount.env_names.is_empty(),
        "node identity: no credentials set"
    );
    f.csi.unpublish("vol-1", &target).await.expect("unpublish");
}

// ------------------------------------------------------------ secrets

#[tokio::test]
async fn secrets_stay_out_of_logs_messages_and_state() {
    let mut f = Fixture::new().await;
    let target = f.target("pod-s", "data");
    let secrets = map(&[
        ("accessKeyId", "AKIDFAKESANITY01"),
        ("secretAccessKey", "FAKESECRETVALUE0123456789"),
        ("sessionToken", "FAKESESSIONTOKENVALUE"),
    ]);
    f.csi
        .publish(publish_request(
            "vol-s",
            &target,
            bucket("datasets"),
            secrets.clone(),
        ))
        .await
        .expect("publish with secret");
    let mount = f.fake.mount_at(&target).expect("mounted");
    // The daemon is told where the keys are, not what they are.
    let keys_file = f
        .secrets
        .path()
        .join(riffle_csi::node_state::state::StateStore::key(&target))
        .join("keys.json");
    assert!(
        mount.auth_env.contains(&(
            "RIFFLE_CREDENTIALS_FILE".to_string(),
            keys_file.to_string_lossy().into_owned()
        )),
        "{:?}",
        mount.auth_env
    );
    assert!(!mount.env_names.iter().any(|n| n == "AWS_SECRET_ACCESS_KEY"));
    let keys = std::fs::read_to_string(&keys_file).expect("keys file");
    assert!(keys.contains("FAKESECRETVALUE0123456789") && keys.contains("FAKESESSIONTOKENVALUE"));
    assert!(mount
        .flags
        .iter()
        .all(|a| !a.contains("FAKESECRET") && !a.contains("AKIDFAKE")));

    // A failing mount whose reason echoes the secret: the message is scrubbed.
    let target2 = f.target("pod-s2", "data");
    f.fake.fail_next(MountError::new(
        MountErrorKind::PermissionDenied,
        "AccessDenied for AKIDFAKESANITY01 signed with FAKESECRETVALUE0123456789",
    ));
    let err = f
        .csi
        .publish(publish_request(
            "vol-s2",
            &target2,
            bucket("datasets"),
            secrets.clone(),
        ))
        .await
        .expect_err("mount fails");
    assert_eq!(err.code(), Code::PermissionDenied);
    assert!(
        !err.message().contains("FAKESECRETVALUE"),
        "{}",
        err.message()
    );
    assert!(
        !err.message().contains("AKIDFAKESANITY01"),
        "{}",
        err.message()
    );

    // Incomplete and unknown secret keys are named, values never shown.
    let err = f
        .csi
        .publish(publish_request(
            "vol-s3",
            &f.target("pod-s3", "data"),
            bucket("datasets"),
            map(&[
                ("accessKeyId", "AKIDFAKESANITY01"),
                ("password", "FAKESECRETVALUE0123456789"),
            ]),
        ))
        .await
        .expect_err("bad secret");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("password"), "{}", err.message());
    assert!(
        !err.message().contains("FAKESECRETVALUE"),
        "{}",
        err.message()
    );

    // Nothing under the state directory holds a secret; the keys file on
    // the tmpfs is root-only.
    let state = f.dir.path().join("state");
    assert_no_secret_under(&state, &["FAKESECRETVALUE", "FAKESESSIONTOKENVALUE"]);
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(&keys_file).expect("stat").mode() & 0o777,
        0o600
    );

    f.csi.unpublish("vol-s", &target).await.expect("unpublish");
    assert_eq!(
        std::fs::read_dir(f.secrets.path())
            .expect("secrets")
            .count(),
        0,
        "secrets deleted at unpublish"
    );
    let logs = log_text();
    assert!(logs.contains("NodePublishVolume"), "logging is captured");
    for value in [
        "AKIDFAKESANITY01",
        "FAKESECRETVALUE",
        "FAKESESSIONTOKENVALUE",
    ] {
        assert!(
            !logs.contains(value),
            "secret {value} found in the logs: {:?}",
            logs.lines()
                .filter(|l| l.contains(value))
                .collect::<Vec<_>>()
        );
    }
}

// ------------------------------------------------------- pod identity

/// The volume context kubelet sends with the CSIDriver's tokenRequests.
fn pod_context(bucket_name: &str, role: Option<&str>, token: &str) -> HashMap<String, String> {
    let tokens = format!(
        r#"{{"sts.amazonaws.com":{{"token":"{token}","expirationTimestamp":"2030-01-01T00:00:00Z"}}}}"#
    );
    let mut attrs = map(&[
        ("bucket", bucket_name),
        ("csi.storage.k8s.io/pod.name", "trainer-0"),
        ("csi.storage.k8s.io/pod.namespace", "ml"),
        ("csi.storage.k8s.io/serviceAccount.name", "trainer"),
        (riffle_csi::kube::access::TOKENS_KEY, &tokens),
    ]);
    if let Some(role) = role {
        attrs.insert("roleArn".into(), role.into());
    }
    attrs
}

fn env_value(env: &[(String, String)], name: &str) -> Option<String> {
    env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
}

#[tokio::test]
async fn a_pod_token_reaches_the_daemon_and_a_republish_replaces_it_without_a_remount() {
    use std::os::unix::fs::MetadataExt;
    let mut f = Fixture::with_node_credentials(false).await;
    let target = f.target("pod-irsa", "data");
    let role = "arn:aws:iam::123456789012:role/trainer";
    let first = "eyJhbGciOiJSUzI1NiJ9.FIRSTTOKENPAYLOAD.sig1";
    f.csi
        .publish(publish_request(
            "vol-irsa",
            &target,
            pod_context("datasets", Some(role), first),
            Default::default(),
        ))
        .await
        .expect("publish with the pod's token");
    let mount = f.fake.mount_at(&target).expect("mounted");
    assert_eq!(
        env_value(&mount.auth_env, "AWS_ROLE_ARN").as_deref(),
        Some(role)
    );
    assert_eq!(
        env_value(&mount.auth_env, "AWS_ROLE_SESSION_NAME").as_deref(),
        Some("riffle-ml-trainer-0")
    );
    let token_file = PathBuf::from(
        env_value(&mount.auth_env, "AWS_WEB_IDENTITY_TOKEN_FILE")
            .expect("the daemon is told where the token is"),
    );
    assert!(
        token_file.starts_with(f.secrets.path()),
        "{}",
        token_file.display()
    );
    assert_eq!(std::fs::read_to_string(&token_file).expect("token"), first);
    let meta = std::fs::metadata(&token_file).expect("stat");
    assert_eq!(meta.mode() & 0o777, 0o600);
    assert!(riffle_csi::node_state::secrets::is_tmpfs(&token_file).expect("statfs"));
    assert!(
        !mount.env_names.iter().any(|n| n == "AWS_ACCESS_KEY_ID"),
        "{:?}",
        mount.env_names
    );

    // kubelet republishes (requiresRepublish) with a fresh token: the file
    // is replaced, the daemon is the same, nothing is remounted.
    let second = "eyJhbGciOiJSUzI1NiJ9.SECONDTOKENPAYLOAD.sig2";
    f.csi
        .publish(publish_request(
            "vol-irsa",
            &target,
            pod_context("datasets", Some(role), second),
            Default::default(),
        ))
        .await
        .expect("republish");
    assert_eq!(std::fs::read_to_string(&token_file).expect("token"), second);
    assert_eq!(
        std::fs::metadata(&token_file).expect("stat").mode() & 0o777,
        0o600
    );
    let after = f.fake.mount_at(&target).expect("mounted");
    assert_eq!(after.daemon, mount.daemon, "same daemon");
    assert_eq!(f.fake.mount_calls(), 1, "no remount");
    assert_eq!(after.auth_env, mount.auth_env);

    // Neither token is in the state directory or the logs.
    let checked = assert_no_secret_under(
        &f.dir.path().join("state"),
        &["FIRSTTOKENPAYLOAD", "SECONDTOKENPAYLOAD"],
    );
    assert!(checked > 0, "the volume record was checked");
    let logs = log_text();
    assert!(!logs.contains("TOKENPAYLOAD"), "a token is in the logs");

    // A republish naming a secret instead: refused, the token stays.
    let err = f
        .csi
        .publish(publish_request(
            "vol-irsa",
            &target,
            bucket("datasets"),
            map(&[("accessKeyId", "AKIDX"), ("secretAccessKey", "SECRETX")]),
        ))
        .await
        .expect_err("another identity");
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    assert_eq!(std::fs::read_to_string(&token_file).expect("token"), second);

    f.csi
        .unpublish("vol-irsa", &target)
        .await
        .expect("unpublish");
    assert!(!token_file.exists(), "token removed at unpublish");
    assert_eq!(std::fs::read_dir(f.secrets.path()).expect("ls").count(), 0);
}

#[tokio::test]
async fn a_role_without_a_token_is_refused_with_the_fix() {
    let mut f = Fixture::with_node_credentials(false).await;
    let target = f.target("pod-notoken", "data");
    let mut attrs = bucket("datasets");
    attrs.insert("roleArn".into(), "arn:aws:iam::1:role/r".into());
    let err = f
        .csi
        .publish(publish_request(
            "vol-nt",
            &target,
            attrs,
            Default::default(),
        ))
        .await
        .expect_err("no token");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("tokenRequests"), "{}", err.message());
    assert_eq!(f.fake.mount_calls(), 0);
}

#[tokio::test]
async fn a_volume_without_credentials_needs_the_node_credentials_setting() {
    // Off (the default): an inline volume with no secret and no role is
    // refused, with the setting named; kubelet's token alone changes nothing.
    let mut f = Fixture::with_node_credentials(false).await;
    let target = f.target("pod-inline", "data");
    let mut inline = pod_context("datasets", None, "eyJ.NOROLETOKEN.sig");
    inline.insert("csi.storage.k8s.io/ephemeral".into(), "true".into());
    let err = f
        .csi
        .publish(publish_request(
            "csi-inline-1",
            &target,
            inline.clone(),
            Default::default(),
        ))
        .await
        .expect_err("refused");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("--allow-node-credentials"),
        "{}",
        err.message()
    );
    assert_eq!(err.message().lines().count(), 1, "one line");
    assert_eq!(f.fake.mount_calls(), 0);
    assert!(!target.exists(), "nothing was created");
    // A public bucket (noSignRequest) and a volume with a secret need no
    // permission.
    let mut public = inline.clone();
    public.insert("noSignRequest".into(), "true".into());
    f.csi
        .publish(publish_request(
            "csi-inline-2",
            &target,
            public,
            Default::default(),
        ))
        .await
        .expect("anonymous");
    f.csi
        .unpublish("csi-inline-2", &target)
        .await
        .expect("unpublish");
    let with_secret = f.target("pod-inline-secret", "data");
    f.csi
        .publish(publish_request(
            "csi-inline-3",
            &with_secret,
            inline.clone(),
            map(&[
                ("accessKeyId", "AKIDINLINE"),
                ("secretAccessKey", "SECRETINLINE"),
            ]),
        ))
        .await
        .expect("secret");
    f.csi
        .unpublish("csi-inline-3", &with_secret)
        .await
        .expect("unpublish");

    // On: the same publish mounts with the node's identity.
    let mut allowed = Fixture::with_node_credentials(true).await;
    let target = allowed.target("pod-inline", "data");
    allowed
        .csi
        .publish(publish_request(
            "csi-inline-1",
            &target,
            inline,
            Default::default(),
        ))
        .await
        .expect("allowed");
    let mount = allowed.fake.mount_at(&target).expect("mounted");
    assert_eq!(mount.auth, riffle_csi::mounter::DaemonCredentials::Node);
    assert!(
        mount.env_names.is_empty(),
        "the node's environment, untouched"
    );
    allowed
        .csi
        .unpublish("csi-inline-1", &target)
        .await
        .expect("unpublish");
}

#[tokio::test]
async fn no_sign_request_conflicts_with_a_secret() {
    let mut f = Fixture::new().await;
    let target = f.target("pod", "data");
    let err = f
        .csi
        .publish(publish_request(
            "vol",
            &target,
            map(&[("bucket", "public-data"), ("noSignRequest", "true")]),
            map(&[("accessKeyId", "A"), ("secretAccessKey", "B")]),
        ))
        .await
        .expect_err("conflict");
    assert_eq!(err.code(), Code::InvalidArgument);
}

// ------------------------------------------------------- mount failures

#[tokio::test]
async fn mount_failures_map_to_codes_and_leave_nothing_behind() {
    let mut f = Fixture::new().await;
    let cases = [
        (MountErrorKind::NotFound, Code::NotFound),
        (MountErrorKind::PermissionDenied, Code::PermissionDenied),
        (MountErrorKind::Unavailable, Code::Unavailable),
        (MountErrorKind::Timeout, Code::DeadlineExceeded),
        (MountErrorKind::InvalidArgument, Code::InvalidArgument),
        (MountErrorKind::Internal, Code::Internal),
    ];
    for (i, (kind, want)) in cases.into_iter().enumerate() {
        let target = f.target(&format!("pod-{i}"), "data");
        f.fake
            .fail_next(MountError::new(kind, "riffle mount failed: reason"));
        let err = f
            .csi
            .publish(publish_request(
                "vol",
                &target,
                bucket("datasets"),
                Default::default(),
            ))
            .await
            .expect_err("mount fails");
        assert_eq!(err.code(), want, "{kind:?}");
        assert!(!target.exists(), "target removed after a failed mount");
    }
    let records = std::fs::read_dir(f.dir.path().join("state/volumes"))
        .expect("dir")
        .count();
    assert_eq!(records, 0);
}

// ------------------------------------------------------- concurrency

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_concurrent_publishes() {
    let f = Fixture::new().await;
    f.fake.set_delay(Duration::from_millis(300));
    let targets: Vec<PathBuf> = (0..8)
        .map(|i| f.target(&format!("pod-{i}"), "data"))
        .collect();
    let mut tasks = Vec::new();
    for (i, target) in targets.iter().enumerate() {
        let mut csi = f.csi.clone();
        let req = publish_request(
            &format!("vol-{i}"),
            target,
            map(&[("bucket", "datasets"), ("prefix", &format!("shard-{i}"))]),
            Default::default(),
        );
        tasks.push(tokio::spawn(async move { csi.publish(req).await }));
    }
    // Kubelet retrying the same publish meanwhile is coalesced.
    let mut dup = f.csi.clone();
    let dup_req = publish_request(
        "vol-0",
        &targets[0],
        map(&[("bucket", "datasets"), ("prefix", "shard-0")]),
        Default::default(),
    );
    tasks.push(tokio::spawn(async move { dup.publish(dup_req).await }));
    for t in tasks {
        t.await.expect("join").expect("publish");
    }
    assert_eq!(f.fake.mount_count(), 8);
    assert_eq!(
        f.fake.mount_calls(),
        8,
        "duplicate publish did not mount twice"
    );
    assert!(
        f.fake.max_concurrent_mounts() > 1,
        "mounts of different targets ran in parallel"
    );
    for (i, target) in targets.iter().enumerate() {
        let marker = std::fs::read_to_string(target.join(FAKE_MARKER)).expect("read");
        assert_eq!(marker, format!("s3://datasets/shard-{i}/"));
    }
    let mut tasks = Vec::new();
    for (i, target) in targets.iter().enumerate() {
        let mut csi = f.csi.clone();
        let target = target.clone();
        tasks.push(tokio::spawn(async move {
            csi.unpublish(&format!("vol-{i}"), &target).await
        }));
    }
    for t in tasks {
        t.await.expect("join").expect("unpublish");
    }
    assert_eq!(f.fake.mount_count(), 0);
    assert!(targets.iter().all(|t| !t.exists()));
}

// ------------------------------------------------- restart and recovery

#[tokio::test]
async fn restart_adopts_live_mounts_and_remounts_dead_ones() {
    let mut f = Fixture::new().await;
    let live = f.target("pod-live", "data");
    let dead = f.target("pod-dead", "data");
    let secret = map(&[
        ("accessKeyId", "AKIDRESTART"),
        ("secretAccessKey", "SECRETRESTART"),
    ]);
    f.csi
        .publish(publish_request(
            "vol-live",
            &live,
            bucket("datasets"),
            Default::default(),
        ))
        .await
        .expect("publish");
    f.csi
        .publish(publish_request(
            "vol-dead",
            &dead,
            bucket("private"),
            secret.clone(),
        ))
        .await
        .expect("publish");
    let live_pid = f.fake.mount_at(&live).expect("mounted").daemon.pid;
    let dead_pid = f.fake.mount_at(&dead).expect("mounted").daemon.pid;

    // The plugin goes away; while it is away one daemon dies.
    if let Some(p) = f.plugin.take() {
        p.stop().await.expect("stop");
    }
    assert!(f.fake.kill(&dead));
    f.restart().await;

    let after_live = f.fake.mount_at(&live).expect("still mounted");
    assert_eq!(
        after_live.daemon.pid, live_pid,
        "live mount adopted, not remounted"
    );
    let after_dead = f.fake.mount_at(&dead).expect("remounted");
    assert!(after_dead.alive);
    assert_ne!(
        after_dead.daemon.pid, dead_pid,
        "dead mount got a new daemon"
    );
    assert!(
        matches!(
            &after_dead.auth,
            riffle_csi::mounter::DaemonCredentials::KeysFile { path } if path.is_file()
        ),
        "remounted with the keys kept on the tmpfs: {:?}",
        after_dead.auth
    );
    assert_eq!(f.fake.mount_calls(), 3);

    // kubelet may publish again after the restart: still idempotent.
    f.csi
        .publish(publish_request(
            "vol-live",
            &live,
            bucket("datasets"),
            Default::default(),
        ))
        .await
        .expect("republish");
    f.csi.unpublish("vol-live", &live).await.expect("unpublish");
    f.csi.unpublish("vol-dead", &dead).await.expect("unpublish");
    assert_eq!(f.fake.mount_count(), 0);
}

#[tokio::test]
async fn supervisor_remounts_a_dead_daemon() {
    let mut f = Fixture::new().await;
    let target = f.target("pod", "data");
    f.publish_datasets("vol", &target).await;
    let before = f.fake.mount_at(&target).expect("mounted").daemon.pid;
    assert!(f.fake.kill(&target));
    wait_remounted(&f.fake, &target, before).await;
    f.csi.unpublish("vol", &target).await.expect("unpublish");
}

#[tokio::test]
async fn supervisor_pauses_while_the_mounter_is_down_and_remounts_when_it_is_back() {
    let mut f = Fixture::new().await;
    let target = f.target("pod-mounter-restart", "data");
    f.publish_datasets("vol", &target).await;
    let before = f.fake.mount_at(&target).expect("mounted").daemon.pid;
    // The mounter container restarts: its service goes away, its daemons die.
    f.mounter.take().expect("mounter").stop().await;
    assert!(f.fake.kill(&target));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !log_text().contains("volume checks paused") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no pause was logged"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Several rounds go by: none is counted against the volume.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let target_text = target.display().to_string();
    assert!(
        !log_text()
            .lines()
            .any(|l| l.contains("remount failed") && l.contains(&target_text)),
        "a check failed against the volume while the mounter was down"
    );
    f.mounter = Some(serve(f.dir.path(), &f.fake).await);
    wait_remounted(&f.fake, &target, before).await;
    assert!(log_text().contains("the mounter answers again"));
    f.csi.unpublish("vol", &target).await.expect("unpublish");
}

#[tokio::test]
async fn orphaned_volume_is_cleaned_up_not_remounted() {
    let mut f = Fixture::new().await;
    let target = f.target("pod-gone", "data");
    f.csi
        .publish(publish_request(
            "vol",
            &target,
            bucket("datasets"),
            Default::default(),
        ))
        .await
        .expect("publish");
    if let Some(p) = f.plugin.take() {
        p.stop().await.expect("stop");
    }
    // While the plugin is away the daemon dies and kubelet force-removes the
    // pod's volume directory.
    assert!(f.fake.kill(&target));
    let pod_volume_dir = target.parent().expect("parent").to_path_buf();
    std::fs::remove_dir_all(&pod_volume_dir).expect("remove pod dir");
    f.restart().await;
    assert_eq!(f.fake.mount_count(), 0, "no mount for a pod that is gone");
    assert!(!pod_volume_dir.exists(), "nothing recreated");
    assert_eq!(
        std::fs::read_dir(f.dir.path().join("state/volumes"))
            .expect("dir")
            .count(),
        0
    );
}

#[tokio::test]
async fn republish_of_a_dead_mount_remounts_it() {
    let mut f = Fixture::new().await;
    // kubelet republishes while the daemon is dead (the supervisor may get
    // there first; either way the target ends up live).
    let target = f.target("pod", "data");
    let req = publish_request("vol", &target, bucket("datasets"), Default::default());
    f.csi.publish(req.clone()).await.expect("publish");
    assert!(f.fake.kill(&target));
    f.csi.publish(req).await.expect("republish");
    assert!(f.fake.mount_at(&target).expect("mounted").alive);
    f.csi.unpublish("vol", &target).await.expect("unpublish");
}

#[tokio::test]
async fn stale_socket_from_a_dead_plugin_is_replaced() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("csi.sock");
    drop(std::os::unix::net::UnixListener::bind(&socket).expect("bind"));
    assert!(socket.exists());
    let fake = FakeMounter::new();
    let _mounter = serve(dir.path(), &fake).await;
    let secrets = shm_dir();
    let (plugin, mut csi) = start(dir.path(), secrets.path(), true).await;
    csi.identity
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .expect("serving on the replaced socket");
    plugin.stop().await.expect("stop");
}

// ---------------------------------------------------------------- Staging

impl Fixture {
    fn staging(&self, volume: &str) -> PathBuf {
        kubelet_staging(&self.dir.path().join("kubelet"), volume)
    }

    /// Publishes the staged volume `id` (bucket `datasets`) at `target` with `secrets`.
    async fn publish_staged(
        &mut self,
        id: &str,
        staging: &Path,
        target: &Path,
        secrets: HashMap<String, String>,
    ) -> Result<(), tonic::Status> {
        self.csi
            .publish(staged_publish_request(
                id,
                staging,
                target,
                bucket("datasets"),
                secrets,
            ))
            .await
    }

    /// The shared mounts (directories) under `staging`.
    fn shared_mounts(&self, staging: &Path) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(staging)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        dirs.sort();
        dirs
    }
}

fn keys(id: &str, secret: &str) -> HashMap<String, String> {
    map(&[("accessKeyId", id), ("secretAccessKey", secret)])
}

fn marker(target: &Path) -> String {
    std::fs::read_to_string(target.join(FAKE_MARKER)).unwrap_or_default()
}

#[tokio::test]
async fn a_staged_volume_is_one_daemon_for_every_pod() {
    let mut f = Fixture::new().await;
    let staging = f.staging("vol-stage");
    f.csi
        .stage("vol-stage", &staging, bucket("datasets"))
        .await
        .expect("stage");
    assert_eq!(
        f.fake.daemon_count(),
        0,
        "the daemon waits for the first pod"
    );
    let (a, b) = (f.target("pod-a", "data"), f.target("pod-b", "data"));
    let secret = keys("AKIDSHARED", "SHAREDSECRET");
    f.publish_staged("vol-stage", &staging, &a, secret.clone())
        .await
        .expect("publish a");
    f.publish_staged("vol-stage", &staging, &b, secret.clone())
        .await
        .expect("publish b");
    assert_eq!(f.fake.daemon_count(), 1, "two pods, one daemon");
    assert_eq!(f.fake.mount_calls(), 1);
    let shared = f.shared_mounts(&staging);
    assert_eq!(shared.len(), 1, "{shared:?}");
    let daemon = f.fake.mount_at(&shared[0]).expect("shared mount").daemon;
    for target in [&a, &b] {
        let bind = f.fake.mount_at(target).expect("a bind at the pod's target");
        assert_eq!(bind.bind_of.as_deref(), Some(shared[0].as_path()));
        assert_eq!(bind.daemon, daemon);
        assert_eq!(marker(target), "s3://datasets/");
    }
    // A repeated publish changes nothing.
    f.publish_staged("vol-stage", &staging, &a, secret.clone())
        .await
        .expect("publish a again");
    assert_eq!(f.fake.mount_calls(), 1);

    // One pod goes; the other reads on through the same daemon.
    f.csi.unpublish("vol-stage", &a).await.expect("unpublish a");
    assert!(!a.exists());
    assert!(f.fake.mount_at(&a).is_none());
    assert_eq!(marker(&b), "s3://datasets/");
    assert_eq!(
        f.fake.mount_at(&shared[0]).expect("still there").daemon,
        daemon
    );

    // Unstaging while a pod still uses it is refused; after the last one it stops the daemon.
    let busy = f
        .csi
        .unstage("vol-stage", &staging)
        .await
        .expect_err("b still reads");
    assert_eq!(busy.code(), Code::FailedPrecondition, "{busy:?}");
    assert!(
        busy.message().contains("still published"),
        "{}",
        busy.message()
    );
    f.csi.unpublish("vol-stage", &b).await.expect("unpublish b");
    f.csi.unstage("vol-stage", &staging).await.expect("unstage");
    assert_eq!(f.fake.daemon_count(), 0);
    assert_eq!(f.fake.mount_count(), 0);
    assert!(
        f.shared_mounts(&staging).is_empty(),
        "staging path left empty"
    );
    f.csi
        .unstage("vol-stage", &staging)
        .await
        .expect("unstage again is OK");
    assert_no_secret_under(f.secrets.path(), &["SHAREDSECRET"]);
    assert_no_secret_under(f.dir.path(), &["SHAREDSECRET"]);
}

#[tokio::test]
async fn other_keys_or_a_pods_own_token_stage_apart() {
    let mut f = Fixture::with_node_credentials(false).await;
    let staging = f.staging("vol-tenants");
    f.csi
        .stage("vol-tenants", &staging, bucket("datasets"))
        .await
        .expect("stage");
    let (a, b, c) = (
        f.target("pod-a", "data"),
        f.target("pod-b", "data"),
        f.target("pod-c", "data"),
    );
    f.publish_staged("vol-tenants", &staging, &a, keys("AKIDONE", "SECRETONE"))
        .await
        .expect("tenant one");
    // The same key id with another secret is another identity: never served by the first.
    f.publish_staged("vol-tenants", &staging, &b, keys("AKIDONE", "WRONGSECRET"))
        .await
        .expect("tenant two");
    assert_eq!(f.fake.daemon_count(), 2);
    assert_ne!(
        f.fake.mount_at(&a).expect("a").daemon,
        f.fake.mount_at(&b).expect("b").daemon
    );
    // A role assumed with the pod's token is the pod's own: a daemon at its target.
    let role = "arn:aws:iam::123456789012:role/trainer";
    f.csi
        .publish(staged_publish_request(
            "vol-tenants",
            &staging,
            &c,
            pod_context("datasets", Some(role), "eyJ.PODTOKEN.sig"),
            Default::default(),
        ))
        .await
        .expect("a pod with its own token");
    let own = f.fake.mount_at(&c).expect("c");
    assert!(own.bind_of.is_none(), "a daemon of its own");
    assert_eq!(f.fake.daemon_count(), 3);
    assert_eq!(f.shared_mounts(&staging).len(), 2);
    for (target, id) in [
        (&a, "vol-tenants"),
        (&b, "vol-tenants"),
        (&c, "vol-tenants"),
    ] {
        f.csi.unpublish(id, target).await.expect("unpublish");
    }
    f.csi
        .unstage("vol-tenants", &staging)
        .await
        .expect("unstage");
    assert_eq!(f.fake.mount_count(), 0);
}

#[tokio::test]
async fn a_dead_shared_daemon_is_brought_back_and_every_pod_bound_again() {
    let mut f = Fixture::new().await;
    let staging = f.staging("vol-heal");
    f.csi
        .stage("vol-heal", &staging, bucket("datasets"))
        .await
        .expect("stage");
    let (a, b) = (f.target("pod-a", "data"), f.target("pod-b", "data"));
    for t in [&a, &b] {
        f.publish_staged("vol-heal", &staging, t, Default::default())
            .await
            .expect("publish");
    }
    let shared = f.shared_mounts(&staging).remove(0);
    let before = f.fake.mount_at(&shared).expect("shared").daemon;
    assert!(f.fake.kill(&shared));
    // The supervisor remounts the shared daemon and binds both pods to the new one.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = f
            .fake
            .mount_at(&shared)
            .filter(|m| m.alive)
            .map(|m| m.daemon);
        let bound = [&a, &b]
            .iter()
            .all(|t| f.fake.mount_at(t).map(|m| m.daemon) == now);
        if now.is_some_and(|d| d != before) && bound {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not brought back in time"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(f.fake.daemon_count(), 1);
    for t in [&a, &b] {
        f.csi.unpublish("vol-heal", t).await.expect("unpublish");
    }
    f.csi.unstage("vol-heal", &staging).await.expect("unstage");
    assert_eq!(f.fake.mount_count(), 0);
}

#[tokio::test]
async fn a_plugin_restart_between_stage_and_publish_and_after_it() {
    let mut f = Fixture::with_check_interval(Duration::from_secs(3600)).await;
    let staging = f.staging("vol-crash");
    f.csi
        .stage("vol-crash", &staging, bucket("datasets"))
        .await
        .expect("stage");
    f.restart().await;
    let (a, b) = (f.target("pod-a", "data"), f.target("pod-b", "data"));
    f.publish_staged("vol-crash", &staging, &a, Default::default())
        .await
        .expect("publish after the restart");
    let daemon = f.fake.mount_at(&a).expect("a").daemon;
    f.restart().await;
    // The restarted plugin adopts the shared daemon: the next pod binds it, no new mount.
    f.publish_staged("vol-crash", &staging, &b, Default::default())
        .await
        .expect("publish b");
    assert_eq!(f.fake.mount_at(&b).expect("b").daemon, daemon);
    assert_eq!(f.fake.mount_calls(), 1);
    for t in [&a, &b] {
        f.csi.unpublish("vol-crash", t).await.expect("unpublish");
    }
    f.csi.unstage("vol-crash", &staging).await.expect("unstage");
    assert_eq!(f.fake.mount_count(), 0);
}

#[tokio::test]
async fn stage_requests_are_validated() {
    let mut f = Fixture::new().await;
    let staging = f.staging("vol-bad");
    let relative = f
        .csi
        .stage("vol-bad", Path::new("relative/path"), bucket("datasets"))
        .await
        .expect_err("relative staging path");
    assert_eq!(relative.code(), Code::InvalidArgument);
    let missing = f
        .csi
        .stage("vol-bad", Path::new(""), bucket("datasets"))
        .await
        .expect_err("no staging path");
    assert_eq!(missing.code(), Code::InvalidArgument);
    assert!(
        missing.message().contains("staging_target_path"),
        "{}",
        missing.message()
    );
    let no_id = f
        .csi
        .stage("", &staging, bucket("datasets"))
        .await
        .expect_err("no volume id");
    assert_eq!(no_id.code(), Code::InvalidArgument);
    let bad = f
        .csi
        .stage(
            "vol-bad",
            &staging,
            map(&[("bucket", "datasets"), ("cacheSize", "lots")]),
        )
        .await
        .expect_err("a bad attribute is reported at stage");
    assert_eq!(bad.code(), Code::InvalidArgument);
    let unstage = f
        .csi
        .unstage("vol-bad", Path::new(""))
        .await
        .expect_err("no staging path");
    assert_eq!(unstage.code(), Code::InvalidArgument);
    // Unstaging what was never staged is OK (idempotent).
    f.csi
        .unstage("vol-bad", &staging)
        .await
        .expect("nothing to unstage");
}

#[tokio::test]
async fn a_rotated_secret_reaches_the_shared_daemon_without_a_remount() {
    let mut f = Fixture::with_node_credentials(false).await;
    let staging = f.staging("vol-rotate");
    f.csi
        .stage("vol-rotate", &staging, bucket("datasets"))
        .await
        .expect("stage");
    let (a, b) = (f.target("pod-a", "data"), f.target("pod-b", "data"));
    for t in [&a, &b] {
        f.publish_staged("vol-rotate", &staging, t, keys("AKIDOLD", "OLDSECRET"))
            .await
            .expect("publish");
    }
    let shared = f.shared_mounts(&staging).remove(0);
    let mount = f.fake.mount_at(&shared).expect("shared");
    let keys_file =
        PathBuf::from(env_value(&mount.auth_env, "RIFFLE_CREDENTIALS_FILE").expect("a keys file"));
    // requiresRepublish brings the PV's Secret's new values to each pod in turn.
    for t in [&a, &b] {
        f.publish_staged("vol-rotate", &staging, t, keys("AKIDNEW", "NEWSECRET"))
            .await
            .expect("a republish with rotated keys");
    }
    assert_eq!(f.fake.mount_calls(), 1, "no remount");
    assert_eq!(f.fake.daemon_count(), 1);
    let text = std::fs::read_to_string(&keys_file).expect("keys");
    assert!(
        text.contains("NEWSECRET") && !text.contains("OLDSECRET"),
        "the daemon re-reads the new keys"
    );
    // Other settings on a republish are still refused.
    let other = f
        .csi
        .publish(staged_publish_request(
            "vol-rotate",
            &staging,
            &a,
            map(&[("bucket", "elsewhere")]),
            keys("AKIDNEW", "NEWSECRET"),
        ))
        .await
        .expect_err("other settings");
    assert_eq!(other.code(), Code::AlreadyExists);
    for t in [&a, &b] {
        f.csi.unpublish("vol-rotate", t).await.expect("unpublish");
    }
    f.csi
        .unstage("vol-rotate", &staging)
        .await
        .expect("unstage");
    assert_no_secret_under(f.secrets.path(), &["NEWSECRET", "OLDSECRET"]);
}

#[tokio::test]
async fn a_pod_published_before_staging_keeps_its_own_daemon() {
    let mut f = Fixture::new().await;
    let target = f.target("pod-old", "data");
    f.publish_datasets("vol-upgrade", &target).await;
    let daemon = f.fake.mount_at(&target).expect("mounted").daemon;
    // After the upgrade kubelet's republish names a staging path it never staged.
    let staging = f.staging("vol-upgrade");
    f.publish_staged("vol-upgrade", &staging, &target, Default::default())
        .await
        .expect("a republish");
    let now = f.fake.mount_at(&target).expect("mounted");
    assert!(now.bind_of.is_none(), "not moved to a shared daemon");
    assert_eq!(now.daemon, daemon);
    assert_eq!(f.fake.mount_calls(), 1);
    f.csi
        .unpublish("vol-upgrade", &target)
        .await
        .expect("unpublish");
    assert_eq!(f.fake.mount_count(), 0);
}
