//! The node's DaemonSets under a real container runtime (podman with runc), from the image
//! that `deploy/kubernetes/image.sh` builds, each container started with what
//! `daemonset.yaml` and `mounter.yaml` say.
//!
//! `deploy/podman_args.py` translates a manifest's container into `podman create` arguments
//! (args, env, privileges, hostPath volumes, `Bidirectional` = rshared and
//! `HostToContainer` = rslave propagation, memory limits; it refuses fields it does not
//! know), so the containers here run what the manifests say. The node:
//! - a **node root** (a temporary directory bind-mounted on itself and made `rshared`, as `/`
//!   is under systemd) under which every hostPath lives; `/mnt/nvme` is an ext4 file system
//!   of its own (a loop device), so the mounter's root-disk check passes as on a node with
//!   an NVMe;
//! - the plugin's pod: `riffle-csi` and `riffle-fd-store` (the sidecars'
//!   registry images are not here: kubelet's part is this test's CSI client over the
//!   plugin's socket, as in the other tests);
//! - the `riffle-mounter` pod;
//! - a **training pod**, the container of `deploy/examples/static-pv-training-job.yaml`'s Job
//!   (unprivileged, user 1000, the runtime's default seccomp profile, the volume read-only
//!   and `HostToContainer`) with `pod_reader.py` in place of `train.py`: it reads every file
//!   in a loop, holds one open, and checks every byte.
//!
//! Scenarios, each under a new reading pod: every container killed by the runtime (`podman
//! kill`, as a crash or an OOM kill of the whole container) and started again, every container
//! restarted (`podman restart`: SIGTERM, then start), the mounter rolled to a second image tag
//! (the new pod first, then the old one stopped, as `maxSurge: 1` does), and a real cgroup
//! OOM kill: the mounter's memory cgroup limited to little more than it uses, a second pod
//! reading a large object, until the kernel kills a volume daemon. Every scenario asserts 0
//! failed and 0 wrong reads and one daemon per volume after, and reports the longest read
//! (the goal is under 5 s; not asserted: a loaded machine stretches a container's start, and
//! tests must not depend on timing).
//!
//! Run by `tests/containers.sh` (which installs podman, builds the images and sets
//! RIFFLE_TEST_IMAGE, RIFFLE_TEST_IMAGE_NEXT, RIFFLE_TEST_BASE_IMAGE, RIFFLE_TEST_POD_IMAGE,
//! RIFFLE_TEST_PYTHON and CONTAINERS_CONF); needs what `rollout.rs` needs (RGW, root,
//! /dev/fuse). Hence `#[ignore]`: `cargo test --workspace` does not run them.

#![cfg(feature = "rgw-tests")]

mod common;

use common::pod::{ReaderFiles, ReaderResult};
use common::rgw::{content, env, s3, Env};
use common::{kubelet_target, map, publish_request, transcript, Csi};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::const_new(());

/// Restarts per scenario (RIFFLE_CONTAINER_ROUNDS overrides).
const ROUNDS: usize = 2;
/// The object a second pod reads to load the mounter in the OOM scenario.
const BIG: &str = "big/blob.bin";
const BIG_BYTES: usize = 192 << 20;
/// Where kubelet's directory is, in the containers and (under the node root) on the node.
const KUBELET: &str = "/var/lib/kubelet";

fn rounds() -> usize {
    std::env::var("RIFFLE_CONTAINER_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(ROUNDS)
}

fn setting(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run these tests with tests/containers.sh (it builds the images)")
    })
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs podman; its standard output, trimmed. Panics with its error output if it fails. It
/// runs in RIFFLE_TEST_PODMAN_DIR (tests/containers.sh's work directory), else the temporary
/// directory: conmon, which podman starts for each container, writes an `oom` marker into its
/// working directory when the container's cgroup had an OOM kill.
fn podman(args: &[&str]) -> String {
    let cwd = std::env::var_os("RIFFLE_TEST_PODMAN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let out = Command::new("podman")
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .expect("run podman");
    assert!(
        out.status.success(),
        "podman {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A container of a manifest: its file, workload and container name, and the image name it
/// gives (replaced by a local image; `*`: whatever it is).
struct Workload {
    file: &'static str,
    workload: &'static str,
    container: &'static str,
    image: &'static str,
}

const PLUGIN: Workload = Workload {
    file: "deploy/kubernetes/daemonset.yaml",
    workload: "DaemonSet/riffle-csi-node",
    container: "riffle-csi",
    image: "riffle-csi",
};
const FD_STORE: Workload = Workload {
    file: "deploy/kubernetes/daemonset.yaml",
    workload: "DaemonSet/riffle-csi-node",
    container: "riffle-fd-store",
    image: "riffle-csi",
};
const MOUNTER: Workload = Workload {
    file: "deploy/kubernetes/mounter.yaml",
    workload: "DaemonSet/riffle-mounter",
    container: "riffle-mounter",
    image: "riffle-csi",
};
const TRAINER: Workload = Workload {
    file: "deploy/examples/static-pv-training-job.yaml",
    workload: "Job/resnet50-train",
    container: "train",
    image: "*",
};

/// `deploy/podman_args.py`'s answer.
#[derive(serde::Deserialize)]
struct Translated {
    options: Vec<String>,
    entrypoint: Option<Vec<String>>,
    image: String,
    args: Vec<String>,
    ignored: Vec<String>,
}

/// A container this test created (removed when the node goes).
struct Ctr {
    name: String,
}

impl Ctr {
    /// `podman run -d` of `t`, with `extra` options (the test's own, never the manifest's).
    fn run(name: &str, t: &Translated, extra: &[String]) -> Ctr {
        let mut args: Vec<String> = vec!["run".into(), "-d".into(), format!("--name={name}")];
        args.extend(t.options.iter().cloned());
        args.extend(extra.iter().cloned());
        if let Some(e) = &t.entrypoint {
            args.push(format!(
                "--entrypoint={}",
                serde_json::to_string(e).expect("json")
            ));
        }
        args.push(t.image.clone());
        args.extend(t.args.iter().cloned());
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        podman(&refs);
        Ctr {
            name: name.to_string(),
        }
    }

    fn inspect(&self, format: &str) -> String {
        podman(&["inspect", "--format", format, &self.name])
    }

    fn id(&self) -> String {
        self.inspect("{{.Id}}")
    }

    /// The host pid of the container's PID 1 (0 when it is not running).
    fn pid(&self) -> i32 {
        self.inspect("{{.State.Pid}}").parse().unwrap_or(0)
    }

    fn running(&self) -> bool {
        self.inspect("{{.State.Running}}") == "true"
    }

    /// SIGKILL to the container (every process of it dies), waiting until it has stopped.
    fn kill(&self) {
        podman(&["kill", &self.name]);
        podman(&["wait", &self.name]);
    }

    fn start(&self) {
        podman(&["start", &self.name]);
    }

    /// `podman restart`: SIGTERM, up to the stop timeout (the manifest's grace period), then
    /// start.
    fn restart(&self) {
        podman(&["restart", &self.name]);
    }

    /// `podman stop`: what kubelet does to a deleted pod's container.
    fn stop(&self) {
        podman(&["stop", &self.name]);
    }

    /// The path of the container's memory cgroup (cgroup v1).
    fn memory_cgroup(&self) -> PathBuf {
        let line = std::fs::read_to_string(format!("/proc/{}/cgroup", self.pid()))
            .expect("cgroup")
            .lines()
            .find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_string()))
            .expect("a memory cgroup (cgroup v1)");
        Path::new("/sys/fs/cgroup/memory").join(line.trim_start_matches('/'))
    }
}

/// A `riffle` process serving a volume: a keeper (the daemon's parent) or the daemon.
#[derive(Debug, Clone, PartialEq)]
struct Served {
    pid: i32,
    daemon: bool,
    cgroup: String,
}

/// The riffle processes on this machine (any container) whose arguments name `target` (a
/// path as the containers see it).
fn serving(target: &Path) -> Vec<Served> {
    let needle = target.as_os_str().as_encoded_bytes();
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let argv = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let mut args = argv.split(|b| *b == 0);
        let program = args.next().unwrap_or_default();
        if !program.ends_with(b"riffle") || !args.any(|a| a == needle) {
            continue;
        }
        let zombie = std::fs::read_to_string(entry.path().join("stat"))
            .map(|s| s.contains(") Z "))
            .unwrap_or(true);
        if zombie {
            continue;
        }
        // Keepers name themselves (riffle's `cli::keeper::PROCESS_NAME`).
        let daemon = std::fs::read_to_string(entry.path().join("comm"))
            .is_ok_and(|comm| comm.trim() != "riffle-keeper");
        let cgroup = std::fs::read_to_string(entry.path().join("cgroup")).unwrap_or_default();
        out.push(Served {
            pid,
            daemon,
            cgroup,
        });
    }
    out
}

/// A volume published to a pod: its target as the containers and as this machine see it.
struct Volume {
    id: &'static str,
    target: PathBuf,
    host_target: PathBuf,
}

/// The node: its root, its containers and kubelet's CSI client.
struct Node {
    dir: tempfile::TempDir,
    root: PathBuf,
    env: Env,
    bucket: String,
    plugin: Ctr,
    fd_store: Ctr,
    mounter: Ctr,
    /// Every container created, for the cleanup.
    created: Vec<String>,
    prefix: String,
}

impl Node {
    async fn start(env: &Env, bucket: &str) -> (Node, Csi) {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("node");
        std::fs::create_dir_all(root.join("var/lib/kubelet")).expect("kubelet dir");
        std::fs::create_dir_all(root.join("mnt/nvme")).expect("nvme dir");
        common::node::bind_shared(&root);
        // The node's NVMe: a file system of its own for the cache hostPath.
        let image = dir.path().join("nvme.img");
        let file = std::fs::File::create(&image).expect("nvme image");
        file.set_len(1 << 30).expect("size the nvme image");
        for cmd in [
            vec!["mkfs.ext4", "-q", "-F", image.to_str().expect("utf-8")],
            vec![
                "mount",
                "-o",
                "loop",
                image.to_str().expect("utf-8"),
                root.join("mnt/nvme").to_str().expect("utf-8"),
            ],
        ] {
            let status = Command::new(cmd[0]).args(&cmd[1..]).status().expect(cmd[0]);
            assert!(status.success(), "{cmd:?}");
        }
        let prefix = format!("ctr-{}", std::process::id());
        let mut node = Node {
            dir,
            root,
            env: env.clone(),
            bucket: bucket.to_string(),
            plugin: Ctr {
                name: String::new(),
            },
            fd_store: Ctr {
                name: String::new(),
            },
            mounter: Ctr {
                name: String::new(),
            },
            created: Vec::new(),
            prefix,
        };
        node.mounter = node.run(&MOUNTER, "mounter", &setting("RIFFLE_TEST_IMAGE"));
        let image = setting("RIFFLE_TEST_IMAGE");
        node.plugin = node.run(&PLUGIN, "plugin", &image);
        node.fd_store = node.run(&FD_STORE, "fd-store", &image);
        let csi = node.connect().await;
        (node, csi)
    }

    /// Translates `w` for this node with `image` as the image.
    fn translate(
        &self,
        w: &Workload,
        pod_uid: &str,
        image: &str,
        sources: &[String],
    ) -> Translated {
        let mut cmd = Command::new(
            std::env::var("RIFFLE_TEST_PYTHON").unwrap_or_else(|_| "python3".to_string()),
        );
        cmd.arg(repo().join("deploy/podman_args.py"))
            .arg(repo().join(w.file))
            .arg(w.workload)
            .arg(w.container)
            .arg(format!("--node-root={}", self.root.display()))
            .arg("--node-name=test-node")
            .arg(format!("--pod-uid={pod_uid}"))
            .arg(format!("--pod-name={pod_uid}"))
            .arg(format!("--image={}={image}", w.image));
        for s in sources {
            cmd.arg(format!("--volume-source={s}"));
        }
        let out = cmd.output().expect("run deploy/podman_args.py");
        assert!(
            out.status.success(),
            "podman_args.py: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("podman_args.py's json")
    }

    /// Starts `w` from `image` as this node's container `name` (its pod's uid is `name`).
    fn run(&mut self, w: &Workload, name: &str, image: &str) -> Ctr {
        let t = self.translate(w, name, image, &[]);
        transcript(format!(
            "{} ({}): podman {}; not translated (kubelet's part): {}",
            w.container,
            w.workload,
            t.options.join(" "),
            t.ignored.join(", ")
        ));
        let full = format!("{}-{name}", self.prefix);
        self.created.push(full.clone());
        Ctr::run(&full, &t, &[])
    }

    fn csi_socket(&self) -> PathBuf {
        self.root
            .join("var/lib/kubelet/plugins")
            .join(riffle_csi::DRIVER_NAME)
            .join("csi.sock")
    }

    async fn connect(&self) -> Csi {
        let mut csi = common::connect(&self.csi_socket(), Duration::from_secs(60)).await;
        csi.wait_ready(Duration::from_secs(60)).await;
        csi
    }

    /// A pod's volume: kubelet's target path (its parent created, as kubelet does; the pod's
    /// uid is unique to this run, as kubelet's are).
    fn volume(&self, id: &'static str, pod: &str) -> Volume {
        let uid = format!("{}-{pod}", self.prefix);
        let host_target = kubelet_target(&self.root.join("var/lib/kubelet"), &uid, id);
        let target = Path::new(KUBELET).join(
            host_target
                .strip_prefix(self.root.join("var/lib/kubelet"))
                .expect("under kubelet's dir"),
        );
        Volume {
            id,
            target,
            host_target,
        }
    }

    async fn publish(&self, csi: &mut Csi, v: &Volume) {
        let attributes = map(&[
            ("bucket", &self.bucket),
            ("endpointUrl", &self.env.endpoint),
            ("region", "us-east-1"),
            ("forcePathStyle", "true"),
            // The node cache (on the node's "NVMe"), so that warm opens use passthrough.
            ("cacheSize", "64MiB"),
        ]);
        let secrets = map(&[
            ("accessKeyId", &self.env.access_key),
            ("secretAccessKey", &self.env.secret_key),
        ]);
        csi.publish(publish_request(v.id, &v.target, attributes, secrets))
            .await
            .unwrap_or_else(|e| panic!("publish {}: {e}", v.id));
    }

    /// How many times the keeper of `v` has given an fd store a copy of its connection (its
    /// log in the state directory says so once per copy).
    fn store_copies(&self, v: &Volume) -> usize {
        let log = self.root.join("var/lib/riffle-csi/logs").join(format!(
            "{}.log",
            riffle_csi::node_state::state::StateStore::key(&v.target)
        ));
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .matches("the fd store holds a copy of the connection")
            .count()
    }

    /// Waits until every volume's keeper has given the fd store more copies than `before`.
    async fn wait_for_store_copies(&self, volumes: &[&Volume], before: &[usize]) {
        let deadline = Instant::now() + Duration::from_secs(60);
        for (v, &n) in volumes.iter().zip(before) {
            while self.store_copies(v) <= n {
                assert!(
                    Instant::now() < deadline,
                    "the keeper of {} gave the fd store no new copy",
                    v.id
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    /// Waits until each volume is served by exactly one keeper and one daemon, all in the
    /// current mounter container and none of `gone` (pids); returns them.
    async fn wait_for_one_daemon_each(&self, volumes: &[&Volume], gone: &[i32]) -> Vec<Served> {
        let mounter = self.mounter.id();
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut all = Vec::new();
        for v in volumes {
            loop {
                let now = serving(&v.target);
                let daemons = now.iter().filter(|s| s.daemon).count();
                if now.len() == 2
                    && daemons == 1
                    && now.iter().all(|s| !gone.contains(&s.pid))
                    && now.iter().all(|s| s.cgroup.contains(&mounter))
                {
                    all.extend(now);
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{}: not one keeper and one daemon of the mounter {}: {now:?}",
                    v.id,
                    self.mounter.name
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        all
    }

    /// Starts a training pod reading `files` from `v` (the Job's container, the reader in
    /// place of train.py); `name` names the pod and its container.
    fn start_pod(&mut self, name: &str, v: &Volume, files: &[(String, Vec<u8>)]) -> Pod {
        let files_dir = self.dir.path().join("pods").join(name);
        let reader = ReaderFiles::new(&files_dir, files);
        let mut t = self.translate(
            &TRAINER,
            name,
            &setting("RIFFLE_TEST_POD_IMAGE"),
            &[format!("imagenet={}", v.host_target.display())],
        );
        let data = t
            .options
            .iter()
            .find_map(|o| o.strip_prefix(&format!("--volume={}:", v.host_target.display())))
            .and_then(|o| o.split(':').next())
            .expect("the Job mounts the volume")
            .to_string();
        t.entrypoint = Some(
            reader
                .command(Path::new(&data), Path::new("/pod"))
                .into_iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
        );
        let full = format!("{}-{name}", self.prefix);
        self.created.push(full.clone());
        // The test's own addition: the reader's files.
        let ctr = Ctr::run(
            &full,
            &t,
            &[format!("--volume={}:/pod:rw", files_dir.display())],
        );
        Pod { ctr, reader }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for name in &self.created {
                let out = Command::new("podman")
                    .args(["logs", "--tail", "40", name])
                    .output();
                if let Ok(out) = out {
                    eprintln!("---- last lines of podman logs {name}");
                    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
                    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
                }
            }
        }
        // One at a time: podman removes none of a list that names a container already gone.
        for name in &self.created {
            let _ = Command::new("podman")
                .args(["rm", "-f", "-t", "0", name])
                .output();
        }
        common::node::detach_mounts_under(self.dir.path());
    }
}

/// A training pod and its reader's files.
struct Pod {
    ctr: Ctr,
    reader: ReaderFiles,
}

impl Pod {
    async fn wait_passes(&self, more: u64) {
        let goal = self.reader.passes() + more;
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.reader.passes() < goal {
            assert!(self.ctr.running(), "the pod's reader exited early");
            assert!(
                Instant::now() < deadline,
                "the pod's reader made no progress"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The reader's process: seccomp mode (2: a filter), effective capabilities and uid.
    fn security(&self) -> String {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.ctr.pid())).expect("status");
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.split_whitespace().next().unwrap_or("").to_string())
                .unwrap_or_default()
        };
        format!(
            "Seccomp {}, CapEff {}, Uid {}",
            field("Seccomp:"),
            field("CapEff:"),
            field("Uid:")
        )
    }

    async fn finish(self) -> ReaderResult {
        self.reader.stop();
        let code = podman(&["wait", &self.ctr.name]);
        assert_eq!(code, "0", "the pod's reader failed");
        self.reader.result()
    }
}

/// A bucket of `common::rgw` (its shards, which the pods read) with one more object.
async fn make_bucket(env: &Env, key: &str, bytes: Vec<u8>) -> (String, Vec<(String, Vec<u8>)>) {
    let bucket = common::rgw::make_bucket(env, 4).await;
    s3(env)
        .await
        .put_object()
        .bucket(&bucket)
        .key(key)
        .body(bytes.into())
        .send()
        .await
        .expect("put object");
    let mut files: Vec<(String, Vec<u8>)> = (0..4)
        .map(|i| (format!("shard-{i}/data.txt"), content(i).into_bytes()))
        .collect();
    files.push(("shard-0/nested/deep.bin".to_string(), vec![7u8; 300_000]));
    (bucket, files)
}

async fn remove_bucket(env: &Env, bucket: &str) {
    let client = s3(env).await;
    let listed = client
        .list_objects_v2()
        .bucket(bucket)
        .send()
        .await
        .expect("list");
    for o in listed.contents() {
        let _ = client
            .delete_object()
            .bucket(bucket)
            .key(o.key().unwrap_or_default())
            .send()
            .await;
    }
    let _ = client.delete_bucket().bucket(bucket).send().await;
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Scenario {
    /// `podman kill` of a container, then `podman start`.
    Kill(Part),
    /// `podman restart` of a container.
    Restart(Part),
    /// A mounter container from the other image tag started, then the old one stopped.
    MounterRollout,
    /// The mounter's memory cgroup limited; a second pod reads a large object until the
    /// kernel kills a daemon.
    MounterOom,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Part {
    Plugin,
    FdStore,
    Mounter,
}

impl Scenario {
    fn describe(self) -> String {
        match self {
            Scenario::Kill(p) => format!("{p:?} container: podman kill, then podman start"),
            Scenario::Restart(p) => format!("{p:?} container: podman restart"),
            Scenario::MounterRollout => "mounter rolled to the other image tag".to_string(),
            Scenario::MounterOom => "cgroup OOM kill of a mounter daemon".to_string(),
        }
    }
}

/// One line of the results table.
struct Row {
    scenario: String,
    reads: u64,
    failed: u64,
    wrong: u64,
    longest_ms: f64,
    daemons: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs podman and the images: run tests/containers.sh"]
async fn the_node_in_real_containers_keeps_pods_reading() {
    let _serial = SERIAL.lock().await;
    let env = env();
    let big: Vec<u8> = (0..BIG_BYTES).map(|i| (i % 251) as u8).collect();
    let (bucket, files) = make_bucket(&env, BIG, big).await;
    let (mut node, mut csi) = Node::start(&env, &bucket).await;
    let train = node.volume("vol-train", "trainer");
    let eval = node.volume("vol-eval", "evaluator");
    let volumes = [&train, &eval];
    for v in volumes {
        node.publish(&mut csi, v).await;
    }
    let mut served = node.wait_for_one_daemon_each(&volumes, &[]).await;
    node.wait_for_store_copies(&volumes, &[0, 0]).await;
    transcript(format!(
        "published {} and {} through the plugin's socket: one keeper and one daemon each, in the mounter container",
        train.target.display(),
        eval.target.display()
    ));

    let scenarios = [
        Scenario::Kill(Part::Plugin),
        Scenario::Kill(Part::FdStore),
        Scenario::Kill(Part::Mounter),
        Scenario::Restart(Part::Plugin),
        Scenario::Restart(Part::FdStore),
        Scenario::Restart(Part::Mounter),
        Scenario::MounterRollout,
        Scenario::MounterOom,
    ];
    let images = [
        setting("RIFFLE_TEST_IMAGE"),
        setting("RIFFLE_TEST_IMAGE_NEXT"),
    ];
    let mut mounter_image = 0;
    let mut rows = Vec::new();
    for (n, scenario) in scenarios.into_iter().enumerate() {
        let pod = node.start_pod(&format!("trainer-{n}"), &train, &files);
        pod.wait_passes(3).await;
        if n == 0 {
            transcript(format!(
                "the training pod's reader: {} (podman's default seccomp profile, no privileges)",
                pod.security()
            ));
        }
        for round in 1..=rounds() {
            let copies: Vec<usize> = volumes.iter().map(|v| node.store_copies(v)).collect();
            let old: Vec<i32> = served.iter().map(|s| s.pid).collect();
            // Processes that must no longer serve once it is over: every keeper and daemon
            // when the mounter's container went, the killed daemon after an OOM kill.
            let mut gone = old.clone();
            match scenario {
                Scenario::Kill(part) | Scenario::Restart(part) => {
                    let ctr = match part {
                        Part::Plugin => &node.plugin,
                        Part::FdStore => &node.fd_store,
                        Part::Mounter => &node.mounter,
                    };
                    if matches!(scenario, Scenario::Kill(_)) {
                        ctr.kill();
                        if part != Part::Mounter {
                            // Nothing of the data path is gone: the pod reads on meanwhile.
                            pod.wait_passes(2).await;
                        }
                        ctr.start();
                    } else {
                        ctr.restart();
                    }
                    if part != Part::Mounter {
                        gone.clear();
                    }
                    if part == Part::Plugin {
                        csi = node.connect().await;
                        // kubelet repeats a publish: the new plugin knows the volume.
                        node.publish(&mut csi, &train).await;
                    }
                    if part == Part::FdStore {
                        // The keepers give the new store their copies.
                        node.wait_for_store_copies(&volumes, &copies).await;
                    }
                }
                Scenario::MounterRollout => {
                    mounter_image = 1 - mounter_image;
                    let name = format!("mounter-{n}-{round}");
                    let new = node.run(&MOUNTER, &name, &images[mounter_image]);
                    // The new pod waits for the old one's socket while the pod reads on.
                    pod.wait_passes(1).await;
                    let old_mounter = std::mem::replace(&mut node.mounter, new);
                    old_mounter.stop();
                    podman(&["rm", &old_mounter.name]);
                }
                Scenario::MounterOom => {
                    let killed = oom_kill_a_daemon(&mut node, &train, n, round).await;
                    // The kernel killed a volume daemon (the largest process), not a keeper.
                    let daemons: Vec<i32> =
                        served.iter().filter(|s| s.daemon).map(|s| s.pid).collect();
                    assert!(
                        killed.iter().any(|pid| daemons.contains(pid)),
                        "the OOM killer took {killed:?}, not a daemon of {daemons:?}"
                    );
                    gone = killed;
                }
            }
            if !gone.is_empty() {
                served = node.wait_for_one_daemon_each(&volumes, &gone).await;
            }
            if gone.len() == old.len() && !gone.is_empty() {
                // A new mounter container: its keepers give the fd store their copies.
                node.wait_for_store_copies(&volumes, &copies).await;
            }
            pod.wait_passes(3).await;
            let version = podman(&[
                "image",
                "inspect",
                "--format",
                "{{index .Labels \"org.opencontainers.image.version\"}}",
                &node.mounter.inspect("{{.ImageName}}"),
            ]);
            transcript(format!(
                "{} round {round}: the pod read on ({} passes); serving: {:?}; mounter {} (image version {version})",
                scenario.describe(),
                pod.reader.passes(),
                served.iter().map(|s| (s.pid, s.daemon)).collect::<Vec<_>>(),
                node.mounter.name,
            ));
        }
        let result = pod.finish().await;
        let daemons: Vec<String> = volumes
            .iter()
            .map(|v| {
                serving(&v.target)
                    .iter()
                    .filter(|s| s.daemon)
                    .count()
                    .to_string()
            })
            .collect();
        result.check(&scenario.describe(), rounds());
        transcript(format!(
            "{}: daemons per volume after: {}",
            scenario.describe(),
            daemons.join(", ")
        ));

        assert!(daemons.iter().all(|d| d == "1"), "daemons: {daemons:?}");
        rows.push(Row {
            scenario: scenario.describe(),
            reads: result.reads,
            failed: result.failed,
            wrong: result.wrong,
            longest_ms: result.longest_ms,
            daemons: daemons.join(", "),
        });
    }

    println!(
        "| scenario | rounds | reads | failed | wrong | longest read | daemons per volume after |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {} ms | {} |",
            r.scenario,
            rounds(),
            r.reads,
            r.failed,
            r.wrong,
            r.longest_ms,
            r.daemons
        );
    }

    for v in volumes {
        csi.unpublish(v.id, &v.target).await.expect("unpublish");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !serving(&v.target).is_empty() {
            assert!(
                Instant::now() < deadline,
                "{}: the daemon outlived unpublish",
                v.id
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(!v.host_target.exists(), "{}: target removed", v.id);
    }
    transcript("unpublished both volumes: no daemon, no target left");
    drop(node);
    remove_bucket(&env, &bucket).await;
}

/// Limits the mounter's memory cgroup to a little more than it uses, has a second pod read
/// the large object through `v` until the kernel's OOM killer kills a process of the
/// container (the cgroup's `oom_kill` count), then lifts the limit again. Returns the pids the
/// kernel log says it killed in that cgroup.
async fn oom_kill_a_daemon(node: &mut Node, v: &Volume, n: usize, round: usize) -> Vec<i32> {
    let cgroup = node.mounter.memory_cgroup();
    let read = |f: &str| std::fs::read_to_string(cgroup.join(f)).expect("cgroup file");
    let oom_kills = || -> u64 {
        read("memory.oom_control")
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let kills_before = oom_kills();
    let used: u64 = read("memory.usage_in_bytes").trim().parse().expect("usage");
    let limit = used + (64 << 20);
    std::fs::write(cgroup.join("memory.limit_in_bytes"), limit.to_string()).expect("set limit");
    // The load: a second pod of the same Job reading the large object.
    let name = format!("loader-{n}-{round}");
    let mut t = node.translate(
        &TRAINER,
        &name,
        &setting("RIFFLE_TEST_POD_IMAGE"),
        &[format!("imagenet={}", v.host_target.display())],
    );
    t.entrypoint = Some(vec![
        "sh".into(),
        "-c".into(),
        format!("while :; do cat /data/{BIG} > /dev/null; done"),
    ]);
    let full = format!("{}-{name}", node.prefix);
    node.created.push(full.clone());
    let loader = Ctr::run(&full, &t, &[]);
    let since = std::time::SystemTime::now();
    let deadline = Instant::now() + Duration::from_secs(120);
    while oom_kills() == kills_before {
        assert!(
            Instant::now() < deadline,
            "no OOM kill within 2 minutes under a limit of {limit} bytes (used {used})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Lift the limit (an operator's fix) and stop the load.
    std::fs::write(cgroup.join("memory.limit_in_bytes"), "-1").expect("lift the limit");
    podman(&["rm", "-f", "-t", "0", &loader.name]);
    // The kernel's word: "oom-kill:... oom_memcg=<this cgroup>,...,pid=N" and "Memory cgroup
    // out of memory: Killed process N (riffle) ...".
    let log = Command::new("dmesg").output().expect("dmesg");
    let log = String::from_utf8_lossy(&log.stdout);
    let memcg = format!("oom_memcg=/libpod_parent/libpod-{}", node.mounter.id());
    let killed: Vec<i32> = log
        .lines()
        .filter(|l| l.contains("oom-kill:") && l.contains(&memcg))
        .filter_map(|l| l.rsplit_once(",pid=")?.1.split(',').next()?.parse().ok())
        .collect();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| {
            killed
                .iter()
                .any(|pid| l.contains(&format!("Killed process {pid} (")))
        })
        .collect();
    assert!(
        !said.is_empty(),
        "no OOM kill of this container in the kernel log (dmesg)"
    );
    transcript(format!(
        "OOM round {round}: limit {} MiB ({} MiB used before the load); {:?} after the load started, memory.oom_control oom_kill {} -> {}, memory.failcnt {}, podman's OOMKilled (the container's init) {}; kernel log: {:?}",
        limit >> 20,
        used >> 20,
        since.elapsed().unwrap_or_default(),
        kills_before,
        oom_kills(),
        read("memory.failcnt").trim(),
        node.mounter.inspect("{{.State.OOMKilled}}"),
        said.last()
    ));
    killed
}

/// `riffle mount` with a cache directory in a container that mounts by itself (a
/// workstation container, a pod with SYS_ADMIN and /dev/fuse) under podman's default seccomp
/// profile, which refuses io_uring: it mounts, says in its log that the cache does its I/O
/// with pread/pwrite threads, writes the cache on a cold read, and after a remount (a new
/// daemon, nothing in memory) serves a warm read from the cache; every byte right both times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs podman and the images: run tests/containers.sh"]
async fn a_mount_under_the_default_seccomp_profile_caches_without_io_uring() {
    let _serial = SERIAL.lock().await;
    let env = env();
    let data: Vec<u8> = (0..(8usize << 20)).map(|i| (i % 241) as u8).collect();
    let (bucket, _) = make_bucket(&env, "shard.bin", data.clone()).await;
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&data));
    // Without passthrough, so that the warm read goes through the daemon and its cache.
    let script = format!(
        "set -e
         mkdir -p /mnt/d /cache
         for pass in cold warm; do
             riffle mount s3://{bucket} /mnt/d --endpoint-url {endpoint} --force-path-style \
                 --region us-east-1 --cache-dir /cache --cache-size 64M --cache-min-free 0 \
                 --no-passthrough --log-file /tmp/$pass.log
             echo \"$pass $(sha256sum /mnt/d/shard.bin | cut -d' ' -f1)\"
             riffle stats /mnt/d --json > /tmp/$pass.json
             riffle unmount /mnt/d
         done
         grep -h 'io_uring is refused here' /tmp/cold.log /tmp/warm.log
         echo ---cold; cat /tmp/cold.json; echo ---warm; cat /tmp/warm.json",
        endpoint = env.endpoint
    );
    let out = Command::new("podman")
        .args([
            "run",
            "--rm",
            "--network=host",
            "--device=/dev/fuse",
            "--cap-add=SYS_ADMIN",
            "-e",
            &format!("AWS_ACCESS_KEY_ID={}", env.access_key),
            "-e",
            &format!("AWS_SECRET_ACCESS_KEY={}", env.secret_key),
            "--entrypoint=sh",
            &setting("RIFFLE_TEST_IMAGE"),
            "-c",
            &script,
        ])
        .output()
        .expect("podman run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for pass in ["cold", "warm"] {
        assert!(
            stdout.contains(&format!("{pass} {digest}")),
            "{pass} read: {stdout}"
        );
    }
    let fallbacks: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("io_uring is refused here"))
        .collect();
    assert_eq!(
        fallbacks.len(),
        2,
        "each daemon says it falls back: {stdout}"
    );
    let (_, rest) = stdout.split_once("---cold\n").expect("cold stats");
    let (cold, warm) = rest.split_once("---warm\n").expect("warm stats");
    let cold: serde_json::Value = serde_json::from_str(cold).expect("stats json");
    let warm: serde_json::Value = serde_json::from_str(warm).expect("stats json");
    assert!(cold["cache"]["writes"].as_u64() > Some(0), "{cold}");
    assert!(warm["blocks"]["disk_hits"].as_u64() > Some(0), "{warm}");
    assert_eq!(warm["store"]["get_requests"].as_u64(), Some(0), "{warm}");
    // Nor are FUSE's rings asked for (negotiated at INIT without a ring to serve them, they
    // would hold every request: this test hung so once).
    if std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring")
        .is_ok_and(|v| v.trim() == "Y")
    {
        let transport = cold["fuse"]["transport"].as_str().unwrap_or_default();
        assert!(
            transport.starts_with("/dev/fuse: this process may not use io_uring"),
            "{transport}"
        );
    }
    transcript(format!(
        "riffle mount --cache-dir under podman's default seccomp profile: {}; cold read: {} cache writes; after a remount, warm read: {} blocks from the cache, {} GETs; every byte right",
        fallbacks[0].trim(),
        cold["cache"]["writes"],
        warm["blocks"]["disk_hits"],
        warm["store"]["get_requests"]
    ));
    remove_bucket(&env, &bucket).await;
}

/// The Dockerfile's runtime stage, built here on the same base image (its build stage
/// replaced by the binaries of image.sh's image), and image.sh's image lay out the same
/// files with the same modes, owners and sizes, and have the same configuration. What the
/// Dockerfile's `apt-get` adds (apt's logs and lists) is the only difference allowed.
#[test]
#[ignore = "needs podman and the images: run tests/containers.sh"]
fn the_dockerfile_and_image_sh_lay_out_the_same_files() {
    let image = setting("RIFFLE_TEST_IMAGE");
    let base = setting("RIFFLE_TEST_BASE_IMAGE");
    let ctx = tempfile::tempdir().expect("tempdir");
    // The build stage's outputs: the binaries in image.sh's image.
    let root = PathBuf::from(podman(&["image", "mount", &image]));
    std::fs::create_dir_all(ctx.path().join("bin")).expect("bin");
    for b in ["riffle", "riffle-csi", "riffle-mounter"] {
        std::fs::copy(
            root.join("usr/local/bin").join(b),
            ctx.path().join("bin").join(b),
        )
        .expect("copy a binary");
    }
    podman(&["image", "unmount", &image]);
    std::fs::create_dir_all(ctx.path().join("deploy/kubernetes")).expect("ctx");
    std::fs::copy(
        repo().join("deploy/kubernetes/entrypoint.sh"),
        ctx.path().join("deploy/kubernetes/entrypoint.sh"),
    )
    .expect("entrypoint");
    let dockerfile =
        std::fs::read_to_string(repo().join("deploy/kubernetes/Dockerfile")).expect("Dockerfile");
    let lines: Vec<&str> = dockerfile.lines().collect();
    let froms: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].starts_with("FROM "))
        .collect();
    assert_eq!(froms.len(), 2, "a build stage and a runtime stage");
    let mut built = vec![
        "FROM scratch AS build".to_string(),
        "COPY bin/ /src/target/release/".to_string(),
        format!("FROM {base}"),
    ];
    built.extend(lines[froms[1] + 1..].iter().map(|l| l.to_string()));
    std::fs::write(ctx.path().join("Dockerfile"), built.join("\n")).expect("Dockerfile");
    let from_dockerfile = format!("{image}-dockerfile");
    podman(&[
        "build",
        "--quiet",
        "--pull=never",
        "--network=host",
        "-f",
        ctx.path().join("Dockerfile").to_str().expect("utf-8"),
        "-t",
        &from_dockerfile,
        ctx.path().to_str().expect("utf-8"),
    ]);
    let a = image_files(&image);
    let b = image_files(&from_dockerfile);
    // apt-get update and install's own bookkeeping, and the empty mount point the build's
    // RUN leaves for the /etc/hosts it mounts (a runtime mounts its own over it).
    let apt = |line: &String| {
        let path = line.split(' ').next().unwrap_or_default();
        path.starts_with("var/log/apt/")
            || path == "var/log/dpkg.log"
            || path.starts_with("var/lib/apt/lists/")
            || path.starts_with("var/cache/apt/")
            || path.starts_with("var/cache/debconf/")
            || line == "etc/hosts f 755 0:0 0 "
    };
    let only_a: Vec<&String> = a
        .iter()
        .filter(|l| !b.contains(*l))
        .filter(|l| !apt(l))
        .collect();
    let only_b: Vec<&String> = b
        .iter()
        .filter(|l| !a.contains(*l))
        .filter(|l| !apt(l))
        .collect();
    assert!(
        only_a.is_empty() && only_b.is_empty(),
        "only in image.sh's image: {only_a:?}\nonly in the Dockerfile's: {only_b:?}"
    );
    let config = "{{json .Config.Entrypoint}} {{json .Config.Cmd}} {{json .Config.Env}} {{json .Config.WorkingDir}} {{json .Config.User}}";
    let (ca, cb) = (
        podman(&["image", "inspect", "--format", config, &image]),
        podman(&["image", "inspect", "--format", config, &from_dockerfile]),
    );
    assert_eq!(ca, cb, "the images' configurations");
    transcript(format!(
        "image.sh's image and the Dockerfile's runtime stage: the same {} files (modes, owners, sizes, link targets) and configuration {ca}",
        a.len()
    ));
    podman(&["rmi", &from_dockerfile]);
}

/// Every file of `image`: path, type, mode, owner, size (regular files) or link target.
fn image_files(image: &str) -> std::collections::BTreeSet<String> {
    let root = podman(&["image", "mount", image]);
    let out = Command::new("find")
        .args([
            &root,
            "-mindepth",
            "1",
            "-printf",
            "%P %y %m %U:%G %s %l\\n",
        ])
        .output()
        .expect("find");
    podman(&["image", "unmount", image]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            // Directories' sizes depend on the file system's history, not their content.
            let mut f: Vec<&str> = l.split(' ').collect();
            if f.get(1) == Some(&"d") && f.len() > 4 {
                f[4] = "-";
            }
            f.join(" ")
        })
        .collect()
}
