//! The node's containers as the end-to-end tests play them (no cluster runs here): each
//! container a PID namespace of its own (`unshare --pid --fork --kill-child --mount-proc`),
//! killed as a whole as a runtime kills a container; the pod a Python reader in a private
//! mount namespace (`pod_reader.py`). See `rollout.rs` for the layout.

use super::node::{
    detach_mounts_under, mounter_args, node_process, plugin_args, print_tails, wait_for_mounter,
};
use super::pod::ReaderFiles;
// Re-exported for the tests that play the node with these (not every test crate uses them).
#[allow(unused_imports)]
pub use super::pod::ReaderResult;
use super::rgw::Env;
#[allow(unused_imports)]
pub use super::transcript;
use super::{kubelet_target, map, publish_request, Csi};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A process that plays a container: PID 1 of its own PID namespace (with
/// its own /proc), killed as a whole.
pub struct Container {
    pub name: &'static str,
    unshare: Child,
    /// The host pid of the namespace's PID 1.
    pub init: i32,
}

impl Container {
    pub fn start(name: &'static str, program: &Path, args: &[String], log: &Path) -> Self {
        let unshare = node_process("unshare", log)
            .args([
                "--pid",
                "--fork",
                "--kill-child",
                "--mount-proc",
                "--propagation",
                "unchanged",
                "--",
            ])
            .arg(program)
            .args(args)
            .spawn()
            .expect("run unshare (util-linux)");
        let children = format!("/proc/{0}/task/{0}/children", unshare.id());
        let deadline = Instant::now() + Duration::from_secs(10);
        let init = loop {
            let text = std::fs::read_to_string(&children).unwrap_or_default();
            if let Some(pid) = text.split_whitespace().next() {
                break pid.parse().expect("a pid");
            }
            assert!(
                Instant::now() < deadline,
                "{name}: unshare started no child"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        Self {
            name,
            unshare,
            init,
        }
    }

    /// Kills the whole namespace, as a container runtime does, and waits
    /// until its PID 1 is gone.
    pub fn kill(mut self) {
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Path::new(&format!("/proc/{}", self.init)).exists() {
            let zombie = std::fs::read_to_string(format!("/proc/{}/stat", self.init))
                .map(|s| s.contains(") Z "))
                .unwrap_or(true);
            if zombie {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{} (pid {}) survived SIGKILL",
                self.name,
                self.init
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The node: its directories, the mounter container and the plugin
/// container(s).
pub struct Node {
    pub dir: tempfile::TempDir,
    pub env: Env,
    pub mounter: Option<Container>,
    pub plugin: Option<Container>,
    /// `riffle fd-store`, the plugin pod's other container.
    pub fd_store: Option<Container>,
    pub plugin_starts: usize,
    pub mounter_starts: usize,
}

impl Node {
    pub fn new(env: &Env) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        // kubelet's directory, shared the way /var/lib/kubelet is on a node
        // (the containers mount it Bidirectional); likewise the secrets
        // directory (/run/riffle-csi: Bidirectional in the plugin, which
        // mounts a tmpfs there since the test directory is on disk, and
        // HostToContainer in the mounter, whose daemons read the files).
        for shared in [
            dir.path().join("kubelet"),
            super::node::secrets_dir(&dir.path().join("state")),
        ] {
            std::fs::create_dir_all(&shared).expect("mkdir");
            super::node::bind_shared(&shared);
        }
        Self {
            dir,
            env: env.clone(),
            mounter: None,
            plugin: None,
            fd_store: None,
            plugin_starts: 0,
            mounter_starts: 0,
        }
    }

    /// A node with a mounter, a plugin and the fd store running, and a CSI client of the
    /// plugin.
    pub async fn start_all(env: &Env) -> (Self, Csi) {
        let mut node = Node::new(env);
        node.start_mounter().await;
        node.plugin = Some(node.start_plugin());
        node.fd_store = Some(node.start_fd_store());
        let csi = node.connect().await;
        (node, csi)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn mounter_socket(&self) -> PathBuf {
        self.path("state/mounter/mounter.sock")
    }

    pub fn target(&self, pod: &str) -> PathBuf {
        kubelet_target(&self.path("kubelet"), pod, "dataset")
    }

    pub fn fd_store_socket(&self) -> PathBuf {
        self.path("state/fd-store/fd-store.sock")
    }

    pub async fn start_mounter(&mut self) {
        let riffle = self.env.riffle.clone();
        let mounter = self.start_mounter_container(&riffle);
        self.mounter = Some(mounter);
        wait_for_mounter(&self.mounter_socket()).await;
    }

    /// Starts a mounter container whose daemons run `riffle` (a new mounter
    /// waits for the socket while an old one still serves it).
    pub fn start_mounter_container(&mut self, riffle: &Path) -> Container {
        self.mounter_starts += 1;
        let mut args = mounter_args(&self.mounter_socket(), &self.path("cache"), riffle);
        args.push(format!("--fd-store={}", self.fd_store_socket().display()));
        Container::start(
            "riffle-mounter",
            Path::new(env!("CARGO_BIN_EXE_riffle-mounter")),
            &args,
            &self.path(&format!("mounter-{}.log", self.mounter_starts)),
        )
    }

    /// Starts the plugin pod's fd store container (it waits while an old
    /// one still serves the socket).
    pub fn start_fd_store(&self) -> Container {
        Container::start(
            "riffle fd-store",
            &self.env.riffle,
            &[
                "fd-store".to_string(),
                format!("--socket={}", self.fd_store_socket().display()),
            ],
            &self.path(&format!("fd-store-{}.log", self.plugin_starts)),
        )
    }

    /// Starts a plugin container; it serves once the previous one (if still
    /// running) has released the socket.
    pub fn start_plugin(&mut self) -> Container {
        self.plugin_starts += 1;
        let args = plugin_args(
            &self.path("csi.sock"),
            &self.path("state"),
            &self.mounter_socket(),
        );
        Container::start(
            "riffle-csi",
            Path::new(env!("CARGO_BIN_EXE_riffle-csi")),
            &args,
            &self.path(&format!("plugin-{}.log", self.plugin_starts)),
        )
    }

    /// Publishes `bucket` as volume `id` at `target`, as kubelet does.
    pub async fn publish(&self, csi: &mut Csi, id: &str, target: &Path, bucket: &str) {
        csi.publish(publish_request(
            id,
            target,
            self.attributes(bucket),
            self.secrets(),
        ))
        .await
        .unwrap_or_else(|e| panic!("publish {id}: {e}"));
    }

    pub async fn connect(&self) -> Csi {
        let mut csi = super::connect(&self.path("csi.sock"), Duration::from_secs(60)).await;
        csi.wait_ready(Duration::from_secs(60)).await;
        csi
    }

    pub fn attributes(&self, bucket: &str) -> std::collections::HashMap<String, String> {
        map(&[
            ("bucket", bucket),
            ("endpointUrl", &self.env.endpoint),
            ("region", "us-east-1"),
            ("forcePathStyle", "true"),
            ("logLevel", "debug"),
            // The node cache, so that warm opens go through passthrough.
            ("cacheSize", "64MiB"),
            // No free-space floor: a CI machine's disk may have less than
            // the default 15% free, and then the cache stores nothing.
            ("cacheMinFree", "0"),
        ])
    }

    pub fn secrets(&self) -> std::collections::HashMap<String, String> {
        map(&[
            ("accessKeyId", &self.env.access_key),
            ("secretAccessKey", &self.env.secret_key),
        ])
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(p) = self.plugin.take() {
            p.kill();
        }
        if let Some(f) = self.fd_store.take() {
            f.kill();
        }
        if let Some(m) = self.mounter.take() {
            m.kill();
        }
        // On a failure, or when asked (`RIFFLE_KEEP_NODE_LOGS`: to study a run that passed).
        if std::thread::panicking() || std::env::var_os("RIFFLE_KEEP_NODE_LOGS").is_some() {
            // The containers' logs, then the volumes' daemons'.
            let logs: Vec<PathBuf> = [self.dir.path().to_path_buf(), self.path("state/logs")]
                .iter()
                .flat_map(|dir| std::fs::read_dir(dir).into_iter().flatten().flatten())
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "log"))
                .collect();
            print_tails(&logs, 40);
            // The whole logs, for a failure that the tails do not explain.
            let kept = std::env::temp_dir().join(format!(
                "riffle-failed-node-{}-{}",
                std::process::id(),
                self.plugin_starts + self.mounter_starts
            ));
            if std::fs::create_dir_all(&kept).is_ok() {
                for log in &logs {
                    if let Some(name) = log.file_name() {
                        let _ = std::fs::copy(log, kept.join(name));
                    }
                }
                eprintln!("the node's logs are kept in {}", kept.display());
            }
        }
        // The mounter's namespace is gone, so are its daemons; detach what
        // they left, then the kubelet bind mount itself.
        detach_mounts_under(self.dir.path());
    }
}

/// The pod: `pod_reader.py` in a private mount namespace.
pub struct Pod {
    child: Child,
    stopped: bool,
    reader: ReaderFiles,
}

impl Pod {
    /// Starts pod `name` reading every file of `files` at `target`.
    pub fn start(node: &Node, name: &str, target: &Path, files: &[(String, Vec<u8>)]) -> Self {
        let dir = node.path(&format!("{name}.reader"));
        let reader = ReaderFiles::new(&dir, files);
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--"])
            .args(reader.command(target, &dir))
            .stdin(Stdio::null())
            .spawn()
            .expect("start the pod's reader");
        Self {
            child,
            stopped: false,
            reader,
        }
    }

    pub fn passes(&self) -> u64 {
        self.reader.passes()
    }

    /// Waits until the reader has done `more` passes beyond now.
    pub async fn wait_passes(&mut self, more: u64) {
        let goal = self.passes() + more;
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.passes() < goal {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("the pod's reader exited early: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "the pod's reader made no progress"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn finish(mut self) -> ReaderResult {
        self.reader.stop();
        let status = self.child.wait().expect("reader exit");
        self.stopped = true;
        assert!(status.success(), "the pod's reader failed: {status}");
        self.reader.result()
    }
}

impl Drop for Pod {
    /// A test that failed early must not leave its reader behind.
    fn drop(&mut self) {
        if !self.stopped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Host pids of riffle processes whose arguments name `target`.
pub fn daemons_of(target: &Path) -> Vec<i32> {
    let needle = target.to_string_lossy().into_owned();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let argv = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let argv = String::from_utf8_lossy(&argv);
        let zombie = std::fs::read_to_string(entry.path().join("stat"))
            .map(|s| s.contains(") Z "))
            .unwrap_or(true);
        if !zombie && argv.contains("riffle") && argv.contains(&needle) {
            pids.push(pid);
        }
    }
    pids
}

/// The `fuse` section of `riffle stats --json` for the mount at `target`.
pub fn fuse_stats(env: &Env, target: &Path) -> serde_json::Value {
    let out = Command::new(&env.riffle)
        .arg("stats")
        .arg(target)
        .arg("--json")
        .output()
        .expect("run riffle stats");
    assert!(
        out.status.success(),
        "riffle stats: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stats json");
    stats["fuse"].clone()
}

/// The mount id of the topmost mount at `path` (a remount gets a new one).
pub fn mount_id(path: &Path) -> Option<u64> {
    let wanted = path.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter(|line| line.split(' ').nth(4) == Some(wanted.as_str()))
        .filter_map(|line| line.split(' ').next()?.parse().ok())
        .next_back()
}

/// Waits until the keeper of every target has given the fd store a copy of its connection
/// since the last mounter start (its log says so once per copy given).
pub async fn wait_for_store_copies(node: &Node, targets: &[&Path]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    for target in targets {
        let log = node.path("state/logs").join(format!(
            "{}.log",
            riffle_csi::node_state::state::StateStore::key(target)
        ));
        let said = |line: &str| {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .matches(line)
                .count()
        };
        // One copy for the first keeper, one per keeper that took the mount over since, one
        // more per fd store restart: at least one more than the take-overs.
        while said("the fd store holds a copy of the connection")
            < said("took the mount over from the fd store") + 1
        {
            assert!(
                Instant::now() < deadline,
                "the keeper of {} never gave the fd store its connection",
                target.display()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Reads `path` until it gives `expected`, for up to `limit`.
pub async fn read_eventually(path: &Path, expected: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        match std::fs::read_to_string(path) {
            Ok(text) if text == expected => return,
            Ok(text) => panic!("{}: wrong bytes ({} bytes)", path.display(), text.len()),
            Err(e) => assert!(
                Instant::now() < deadline,
                "{} unreadable after {limit:?}: {e}",
                path.display()
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
