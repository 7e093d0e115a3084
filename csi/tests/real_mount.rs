//! End-to-end tests: the `riffle-csi` binary, driven over its unix socket as
//! kubelet does, mounting real rifflefs (the `riffle` binary, FUSE) against a
//! real S3 server (Ceph RGW from deploy/local/rgw.sh).
//!
//! Needs: root and /dev/fuse; RIFFLE_TEST_ENDPOINT (e.g.
//! http://127.0.0.1:7480) with AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY of a
//! user there (`eval "$(deploy/local/rgw.sh env)"`); the riffle binary from
//! RIFFLE_BIN, else target/debug/riffle. Built with the `rgw-tests` feature
//! (`tests/run.sh`); without RIFFLE_TEST_ENDPOINT every test here FAILS with
//! instructions.
//!
//! The plugin runs as deployed: with a `riffle-mounter` that holds the mount
//! daemons (`--mounter-socket`); both are plain processes here, and
//! `rollout.rs` plays them as containers. Both are started WITHOUT the AWS_*
//! variables in their environment, so the only way a volume can read the
//! bucket is the nodePublishSecretRef secret passed in NodePublishVolume. The tests run one at a time (a global
//! lock): they share the 2-core machine with RGW and the FUSE daemons.

#![cfg(feature = "rgw-tests")]

mod common;

use common::node::{
    detach_mounts_under, mounter_args, node_process, plugin_args, print_tails, wait_for_mounter,
};
use common::rgw::{content, env, make_bucket, Env};
use common::{
    assert_no_secret_under, kubelet_staging, kubelet_target, map, publish_request,
    staged_publish_request, Csi,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;
use tonic::Code;

static SERIAL: Mutex<()> = Mutex::const_new(());

/// A running `riffle-csi` process and its `riffle-mounter`, plus their
/// directories. Drop kills both and cleans up every mount under the test
/// directory.
struct Plugin {
    dir: tempfile::TempDir,
    child: Option<Child>,
    mounter: Option<Child>,
    /// The mounter's metrics endpoint (`--metrics-addr`).
    metrics: std::net::SocketAddr,
    env: Env,
    csi: Csi,
}

impl Plugin {
    async fn start(env: &Env) -> Self {
        Self::start_with(env, true).await
    }

    /// A plugin whose mounter allows a cache on the root disk or not (then it takes this
    /// test's `kubelet` directory as kubelet's root).
    async fn start_with(env: &Env, allow_root_disk_cache: bool) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mounter, metrics) = spawn_mounter(env, dir.path(), allow_root_disk_cache).await;
        let (child, csi) = spawn_plugin(dir.path()).await;
        Self {
            dir,
            child: Some(child),
            mounter: Some(mounter),
            metrics,
            env: env.clone(),
            csi,
        }
    }

    fn mounter_log(&self) -> PathBuf {
        self.dir.path().join("mounter.log")
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn plugin_log(&self) -> PathBuf {
        self.dir.path().join("plugin.log")
    }

    fn target(&self, pod: &str) -> PathBuf {
        kubelet_target(&self.dir.path().join("kubelet"), pod, "dataset")
    }

    fn secrets(&self) -> HashMap<String, String> {
        map(&[
            ("accessKeyId", &self.env.access_key),
            ("secretAccessKey", &self.env.secret_key),
        ])
    }

    fn attributes(&self, bucket: &str, prefix: &str) -> HashMap<String, String> {
        map(&[
            ("bucket", bucket),
            ("prefix", prefix),
            ("endpointUrl", &self.env.endpoint),
            ("region", "us-east-1"),
            ("forcePathStyle", "true"),
            ("logLevel", "debug"),
        ])
    }

    /// SIGKILLs the plugin process (mount daemons must survive).
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a new plugin process on the same socket and state directory.
    async fn restart(&mut self) {
        self.kill();
        let (child, csi) = spawn_plugin(self.dir.path()).await;
        self.child = Some(child);
        self.csi = csi;
    }

    fn plugin_pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The daemon pid recorded for `target` (None while a mount is being
    /// made).
    fn recorded_pid(&self, target: &Path) -> Option<i32> {
        let key = riffle_csi::node_state::state::StateStore::key(target);
        let text =
            std::fs::read_to_string(self.state().join("volumes").join(format!("{key}.json")))
                .expect("volume record");
        let record: serde_json::Value = serde_json::from_str(&text).expect("json");
        record["daemon"]["pid"].as_i64().map(|p| p as i32)
    }

    /// The daemon pid recorded for a settled `target`.
    fn daemon_pid(&self, target: &Path) -> i32 {
        self.recorded_pid(target)
            .expect("a daemon pid in the volume record")
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        self.kill();
        if let Some(mut mounter) = self.mounter.take() {
            let _ = mounter.kill();
            let _ = mounter.wait();
        }
        if std::thread::panicking() {
            // Show what the plugin, the mounter and the daemons said before
            // the test failed.
            let mut files = vec![self.plugin_log(), self.mounter_log()];
            if let Ok(entries) = std::fs::read_dir(self.state().join("logs")) {
                files.extend(entries.flatten().map(|e| e.path()));
            }
            print_tails(&files, 60);
        }
        // Detach every mount left under the test directory and stop daemons.
        detach_mounts_under(self.dir.path());
        if let Ok(entries) = std::fs::read_dir(self.state().join("run")) {
            for e in entries.flatten() {
                if let Some(pid) = std::fs::read_to_string(e.path())
                    .ok()
                    .and_then(|t| t.trim().parse::<i32>().ok())
                {
                    if pid > 1 {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                }
            }
        }
    }
}

fn mounter_socket(dir: &Path) -> PathBuf {
    dir.join("state/mounter/mounter.sock")
}

/// Starts `riffle-mounter` (with its metrics endpoint on a free port of 127.0.0.1) and waits
/// until it answers.
async fn spawn_mounter(
    env: &Env,
    dir: &Path,
    allow_root_disk_cache: bool,
) -> (Child, std::net::SocketAddr) {
    let socket = mounter_socket(dir);
    let mut args = mounter_args(&socket, &dir.join("cache"), &env.riffle);
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    args.push(format!("--metrics-addr={metrics}"));
    args.push(format!("--state-dir={}", dir.join("state").display()));
    if !allow_root_disk_cache {
        args.retain(|a| a != riffle_csi::node_state::cache_disk::ALLOW_FLAG);
        args.push(format!("--kubelet-dir={}", dir.join("kubelet").display()));
    }
    let child = node_process(
        env!("CARGO_BIN_EXE_riffle-mounter"),
        &dir.join("mounter.log"),
    )
    .args(args)
    .spawn()
    .expect("start riffle-mounter");
    wait_for_mounter(&socket).await;
    (child, metrics)
}

/// `GET /metrics` from the mounter at `addr`: the body.
fn scrape(addr: std::net::SocketAddr) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to the metrics port");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read");
    let (head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("application/openmetrics-text"), "{head}");
    body.to_string()
}

async fn spawn_plugin(dir: &Path) -> (Child, Csi) {
    let socket = dir.join("csi.sock");
    let child = node_process(env!("CARGO_BIN_EXE_riffle-csi"), &dir.join("plugin.log"))
        .args(plugin_args(
            &socket,
            &dir.join("state"),
            &mounter_socket(dir),
        ))
        .spawn()
        .expect("start riffle-csi");
    let mut csi = common::connect(&socket, Duration::from_secs(20)).await;
    csi.wait_ready(Duration::from_secs(120)).await;
    (child, csi)
}

/// Reads `path`, retrying for up to `limit` (a remount may be under way).
async fn read_eventually(path: &Path, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    loop {
        match std::fs::read_to_string(path) {
            Ok(text) => return text,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("{} unreadable after {limit:?}: {e}", path.display()),
        }
    }
}

fn fstype_at(path: &Path) -> Option<String> {
    riffle_csi::node_state::mountinfo::mount_at(path)
        .ok()
        .flatten()
        .map(|m| m.fs_type)
}

fn transcript(line: impl AsRef<str>) {
    println!("[transcript] {}", line.as_ref());
}

// ------------------------------------------------------------------ tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_read_kill_plugin_read_unpublish() {
    let _serial = SERIAL.lock().await;
    let env = env();
    let bucket = make_bucket(&env, 1).await;
    let mut p = Plugin::start(&env).await;
    let target = p.target("trainer-0");

    let req = publish_request(
        "vol-train",
        &target,
        p.attributes(&bucket, "shard-0"),
        p.secrets(),
    );
    transcript(format!(
        "NodePublishVolume volume_id=vol-train target={} bucket={bucket} prefix=shard-0/",
        target.display()
    ));
    p.csi.publish(req.clone()).await.expect("publish");
    transcript(format!("  -> OK; mount type {:?}", fstype_at(&target)));
    assert_eq!(fstype_at(&target).as_deref(), Some("fuse.riffle"));

    let text = std::fs::read_to_string(target.join("data.txt")).expect("read through the mount");
    assert_eq!(text, content(0));
    let deep = std::fs::read(target.join("nested/deep.bin")).expect("read nested");
    assert_eq!(deep.len(), 300_000);
    transcript(format!(
        "read data.txt ({} bytes, first line {:?}) and nested/deep.bin ({} bytes)",
        text.len(),
        text.lines().next().unwrap_or(""),
        deep.len()
    ));
    // Read-only.
    assert!(std::fs::write(target.join("new.txt"), b"x").is_err());

    // Publishing again is OK; with other settings it is AlreadyExists.
    p.csi.publish(req).await.expect("idempotent publish");
    let other = publish_request(
        "vol-train",
        &target,
        p.attributes(&bucket, "elsewhere"),
        p.secrets(),
    );
    assert_eq!(
        p.csi
            .publish(other)
            .await
            .expect_err("other settings")
            .code(),
        Code::AlreadyExists
    );

    let daemon = p.daemon_pid(&target);
    transcript(format!(
        "SIGKILL riffle-csi (pid {:?}); mount daemon pid {daemon} keeps running",
        p.plugin_pid()
    ));
    p.kill();
    let again =
        std::fs::read_to_string(target.join("data.txt")).expect("read with the plugin dead");
    assert_eq!(again, content(0));
    transcript(format!(
        "read data.txt with no plugin running: {} bytes, identical",
        again.len()
    ));

    p.restart().await;
    transcript(format!(
        "restarted riffle-csi (pid {:?}); Probe ready",
        p.plugin_pid()
    ));
    assert_eq!(
        p.daemon_pid(&target),
        daemon,
        "live mount adopted, not remounted"
    );
    let after = std::fs::read_to_string(target.join("data.txt")).expect("read after restart");
    assert_eq!(after, content(0));
    transcript("read data.txt after the restart: identical; same daemon adopted");

    p.csi
        .unpublish("vol-train", &target)
        .await
        .expect("unpublish");
    transcript("NodeUnpublishVolume -> OK");
    assert!(!target.exists(), "target removed");
    assert!(
        riffle_csi::mounter::process::identify(daemon).is_none(),
        "daemon {daemon} stopped"
    );
    transcript(format!(
        "target {} removed; daemon {daemon} exited",
        target.display()
    ));
    p.csi
        .unpublish("vol-train", &target)
        .await
        .expect("unpublish again is OK");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_appear_in_no_argv_or_log() {
    let _serial = SERIAL.lock().await;
    let env = env();
    let bucket = make_bucket(&env, 1).await;
    let mut p = Plugin::start(&env).await;
    let target = p.target("pod-secret");
    p.csi
        .publish(publish_request(
            "vol-s",
            &target,
            p.attributes(&bucket, "shard-0"),
            p.secrets(),
        ))
        .await
        .expect("publish with secret");
    assert_eq!(
        std::fs::read_to_string(target.join("data.txt")).expect("read"),
        content(0)
    );

    // Wrong secret: refused, and the message does not echo it.
    let wrong = map(&[
        ("accessKeyId", &env.access_key),
        ("secretAccessKey", "WRONGSECRETVALUEforthetest0000000000000"),
    ]);
    let bad_target = p.target("pod-wrong");
    let err = p
        .csi
        .publish(publish_request(
            "vol-w",
            &bad_target,
            p.attributes(&bucket, "shard-0"),
            wrong,
        ))
        .await
        .expect_err("wrong secret refused");
    println!("wrong secret -> {:?}: {}", err.code(), err.message());
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(
        !err.message().contains("WRONGSECRETVALUE"),
        "{}",
        err.message()
    );
    assert!(
        !err.message().contains(&env.secret_key),
        "{}",
        err.message()
    );

    // No credentials at all: refused before anything runs, since the
    // driver does not allow the node's credentials (--allow-node-credentials).
    let anon_target = p.target("pod-anon");
    let err = p
        .csi
        .publish(publish_request(
            "vol-a",
            &anon_target,
            p.attributes(&bucket, "shard-0"),
            HashMap::new(),
        ))
        .await
        .expect_err("no credentials refused");
    println!("no credentials -> {:?}: {}", err.code(), err.message());
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("--allow-node-credentials"),
        "{}",
        err.message()
    );

    let secret_values = [env.secret_key.as_str(), "WRONGSECRETVALUEforthetest"];
    // 1. The argv of every riffle process (plugin, mounter, mount daemons; other
    // programs on a shared test machine may legitimately hold the test key).
    let daemon = p.daemon_pid(&target);
    let daemon_argv = std::fs::read(format!("/proc/{daemon}/cmdline")).expect("daemon cmdline");
    assert!(String::from_utf8_lossy(&daemon_argv).contains("riffle"));
    let mut riffle_processes = 0;
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        if let Ok(argv) = std::fs::read(entry.path().join("cmdline")) {
            let argv = String::from_utf8_lossy(&argv);
            if !argv.contains("riffle") {
                continue;
            }
            riffle_processes += 1;
            for s in secret_values {
                assert!(
                    !argv.contains(s),
                    "secret in argv of {:?}: {argv}",
                    entry.path()
                );
            }
        }
    }
    assert!(
        riffle_processes >= 3,
        "plugin, mounter and daemon were checked"
    );
    // 2. The plugin's and the mounter's logs, the daemons' logs, the volume
    // records.
    let mut files = vec![p.plugin_log(), p.mounter_log()];
    for sub in ["logs", "volumes"] {
        if let Ok(entries) = std::fs::read_dir(p.state().join(sub)) {
            files.extend(entries.flatten().map(|e| e.path()));
        }
    }
    let mut checked_lines = 0;
    for f in &files {
        let text = String::from_utf8_lossy(&std::fs::read(f).unwrap_or_default()).into_owned();
        for line in text.lines() {
            checked_lines += 1;
            for s in secret_values {
                assert!(!line.contains(s), "secret in {}: {line}", f.display());
            }
        }
    }
    assert!(
        checked_lines > 0,
        "the logs were empty: nothing was checked"
    );
    println!(
        "checked {} files ({checked_lines} lines) and the argv of {riffle_processes} riffle processes: no secret",
        files.len()
    );
    p.csi.unpublish("vol-s", &target).await.expect("unpublish");
}

/// The riffle processes' environment variable `name` of process `pid`.
fn environ_of(pid: i32, name: &str) -> Option<String> {
    let bytes = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    bytes.split(|b| *b == 0).find_map(|kv| {
        let kv = String::from_utf8_lossy(kv);
        kv.strip_prefix(&format!("{name}=")).map(str::to_string)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_at_rest_after_publish_crash_and_unpublish() {
    use std::os::unix::fs::MetadataExt;
    let _serial = SERIAL.lock().await;
    let env = env();
    let bucket = make_bucket(&env, 1).await;
    let mut p = Plugin::start(&env).await;
    let state = p.state();
    let secrets_dir = common::node::secrets_dir(&state);
    let secret = env.secret_key.clone();
    // Every file: records, pid files, the daemons' logs (none is left
    // after unpublish).
    let no_secret_in_state = |when: &str| {
        let n = assert_no_secret_under(&state, &[&secret]);
        assert!(
            n > 0 || when.contains("unpublish"),
            "nothing under {} was checked",
            state.display()
        );
        transcript(format!(
            "{when}: {n} files under the state directory, none holds the secret key"
        ));
    };
    assert!(
        riffle_csi::node_state::secrets::is_tmpfs(&secrets_dir).expect("statfs"),
        "the plugin mounted a tmpfs on {} (the test directory is on disk)",
        secrets_dir.display()
    );

    let target = p.target("pod-at-rest");
    p.csi
        .publish(publish_request(
            "vol-rest",
            &target,
            p.attributes(&bucket, "shard-0"),
            p.secrets(),
        ))
        .await
        .expect("publish");
    // The daemon reads with the keys from the tmpfs file: neither it nor
    // the mounter has them in its environment.
    assert_eq!(
        std::fs::read_to_string(target.join("data.txt")).expect("read"),
        content(0)
    );
    let keeper = p.daemon_pid(&target);
    let keys_file = PathBuf::from(
        environ_of(keeper, "RIFFLE_CREDENTIALS_FILE")
            .expect("the daemon is told where its keys are"),
    );
    assert!(
        keys_file.starts_with(&secrets_dir),
        "{}",
        keys_file.display()
    );
    assert_eq!(environ_of(keeper, "AWS_SECRET_ACCESS_KEY"), None);
    assert_eq!(
        std::fs::metadata(&keys_file).expect("stat").mode() & 0o777,
        0o600
    );
    assert!(std::fs::read_to_string(&keys_file)
        .expect("keys")
        .contains(&secret));
    no_secret_in_state("after publish");

    // The plugin crashes; a new one adopts the mount.
    p.kill();
    no_secret_in_state("after SIGKILL of the plugin");
    // With the plugin down, the daemon and its keeper die too (the mounter's
    // container restarting): the next plugin must remount from the tmpfs.
    let daemon = child_of(keeper).expect("the keeper's daemon");
    sigkill(&[keeper, daemon]);
    p.restart().await;
    let text = read_eventually(&target.join("data.txt"), Duration::from_secs(60)).await;
    assert_eq!(text, content(0));
    assert_ne!(p.daemon_pid(&target), keeper, "remounted");
    transcript("restarted plugin remounted the volume with the keys on the tmpfs");
    no_secret_in_state("after the restart and remount");

    p.csi
        .unpublish("vol-rest", &target)
        .await
        .expect("unpublish");
    assert!(!keys_file.exists(), "keys removed at unpublish");
    assert_eq!(
        std::fs::read_dir(&secrets_dir).expect("ls").count(),
        0,
        "nothing left on the tmpfs"
    );
    no_secret_in_state("after unpublish");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_volume_the_store_refuses_leaks_no_token_and_leaves_nothing() {
    // The test RGW has no STS/OIDC provider: its AssumeRoleWithWebIdentity
    // answers with an error (the daemon's debug log shows the SDK's web
    // identity provider calling it), so the publish fails; the token must
    // appear in no message, log or state file, and nothing may be left on
    // the tmpfs. An assumed role end to end needs an STS this test lacks.
    let _serial = SERIAL.lock().await;
    let env = env();
    let bucket = make_bucket(&env, 1).await;
    let p = Plugin::start(&env).await;
    let target = p.target("pod-role");
    let token = "eyJhbGciOiJSUzI1NiJ9.PODTOKENPAYLOADFORTHETEST.c2ln";
    let mut attrs = p.attributes(&bucket, "shard-0");
    attrs.insert("roleArn".into(), "arn:aws:iam:::role/reader".into());
    attrs.insert("stsEndpointUrl".into(), env.endpoint.clone());
    attrs.insert(
        riffle_csi::kube::access::TOKENS_KEY.into(),
        format!(r#"{{"sts.amazonaws.com":{{"token":"{token}","expirationTimestamp":"2030-01-01T00:00:00Z"}}}}"#),
    );
    let err = p
        .csi
        .clone()
        .publish(publish_request("vol-role", &target, attrs, HashMap::new()))
        .await
        .expect_err("RGW without STS refuses the role");
    println!(
        "role volume on RGW without STS -> {:?}: {}",
        err.code(),
        err.message()
    );
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("credentials"), "{}", err.message());
    assert!(
        !err.message().contains("PODTOKENPAYLOAD"),
        "{}",
        err.message()
    );
    let secrets_dir = common::node::secrets_dir(&p.state());
    assert_eq!(
        std::fs::read_dir(&secrets_dir).expect("ls").count(),
        0,
        "token removed"
    );
    assert_no_secret_under(&p.state(), &["PODTOKENPAYLOAD"]);
    for log in [p.plugin_log(), p.mounter_log()] {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            !text.contains("PODTOKENPAYLOAD"),
            "token in {}",
            log.display()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_volumes_published_concurrently() {
    let _serial = SERIAL.lock().await;
    let env = env();
    let bucket = make_bucket(&env, 8).await;
    let p = Plugin::start(&env).await;
    let targets: Vec<PathBuf> = (0..8).map(|i| p.target(&format!("worker-{i}"))).collect();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (i, target) in targets.iter().enumerate() {
        let mut csi = p.csi.clone();
        let req = publish_request(
            &format!("vol-{i}"),
            target,
            p.attributes(&bucket, &format!("shard-{i}")),
            p.secrets(),
        );
        tasks.push(tokio::spawn(async move { csi.publish(req).await }));
    }
    for t in tasks {
        t.await.expect("join").expect("publish");
    }
    println!("8 concurrent publishes took {:?}", started.elapsed());
    for (i, target) in targets.iter().enumerate() {
        assert_eq!(fstype_at(target).as_deref(), Some("fuse.riffle"));
        let text = std::fs::read_to_string(target.join("data.txt")).expect("read");
        assert_eq!(text, content(i), "volume {i} shows its own prefix");
    }
    let mut tasks = Vec::new();
    for (i, target) in targets.iter().enumerate() {
        let mut csi = p.csi.clone();
        let target = target.clone();
        tasks.push(tokio::spawn(async move {
            csi.unpublish(&format!("vol-{i}"), &target).await
        }));
    }
    for t in tasks {
        t.await.expect("join").expect("unpublish");
    }
    assert!(targets.iter().all(|t| !t.exists()));
}

/// SIGKILLs every process of `pids`.
fn sigkill(pids: &[i32]) {
    for &pid in pids {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("kill");
    }
}

/// The first child of process `pid` (riffle's keeper has one: its daemon).
fn child_of(pid: i32) -> Option<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The mount ID (mountinfo's first field) of the mount at `path`.
fn mount_id_at(path: &Path) -> Option<u64> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let wanted = path.to_str()?;
    info.lines()
        .find(|l| l.split(' ').nth(4) == Some(wanted))
        .and_then(|l| l.split(' ').next()?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mount_daemon_is_recovered() {
    let _serial = SERIAL.lock().await;
    let env = env();
    let bucket = make_bucket(&env, 1).await;
    let mut p = Plugin::start(&env).await;
    let target = p.target("pod-recover");
    p.csi
        .publish(publish_request(
            "vol-r",
            &target,
            p.attributes(&bucket, "shard-0"),
            p.secrets(),
        ))
        .await
        .expect("publish");
    assert_eq!(
        std::fs::read_to_string(target.join("data.txt")).expect("read"),
        content(0)
    );
    // The recorded pid is riffle's keeper (`riffle mount --restart`); the daemon serving the
    // mount is its child. A SIGKILL of the daemon (what an OOM kill does) is answered by a
    // successor that takes the live connection over: nothing to remount.
    let keeper = p.daemon_pid(&target);
    let mount_id = mount_id_at(&target);
    for round in 1..=2 {
        let daemon = child_of(keeper).expect("the keeper's daemon");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(daemon),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("kill daemon");
        let killed = Instant::now();
        assert_eq!(
            std::fs::read_to_string(target.join("data.txt")).expect("read after the kill"),
            content(0)
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while child_of(keeper).is_none_or(|pid| pid == daemon) {
            assert!(Instant::now() < deadline, "no successor daemon");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        transcript(format!(
            "round {round}: daemon {daemon} SIGKILLed; read at once, successor {:?} serving after {:?}, same mount, no remount",
            child_of(keeper),
            killed.elapsed()
        ));
        assert_eq!(mount_id_at(&target), mount_id, "the mount was not replaced");
        assert_eq!(
            p.recorded_pid(&target),
            Some(keeper),
            "the keeper is still the record"
        );
    }

    // Both keeper and daemon dead (the mounter's container gone) while no plugin runs: the new
    // plugin finds the dead mount at start and remounts it.
    p.kill();
    let daemon = child_of(keeper).expect("the keeper's daemon");
    sigkill(&[keeper, daemon]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // statfs always reaches the (dead) daemon; stat may be answered from
    // the kernel's attribute cache.
    let err = nix::sys::statfs::statfs(&target).expect_err("dead mount");
    assert_eq!(err, nix::errno::Errno::ENOTCONN, "{err}");
    println!(
        "plugin, keeper {keeper} and daemon {daemon} killed: statfs on the target gives ENOTCONN"
    );
    let new_daemon = keeper;
    p.restart().await;
    let text = read_eventually(&target.join("data.txt"), Duration::from_secs(30)).await;
    assert_eq!(text, content(0));
    assert_ne!(p.daemon_pid(&target), new_daemon);
    println!("restarted plugin remounted it at start: readable again");
    p.csi.unpublish("vol-r", &target).await.expect("unpublish");
    assert!(!target.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mount_failures_map_to_grpc_codes() {
    let _serial = SERIAL.lock().await;
    let env = env();
    let mut p = Plugin::start(&env).await;

    let missing = p.target("pod-missing");
    let err = p
        .csi
        .publish(publish_request(
            "vol-missing",
            &missing,
            p.attributes("csi-no-such-bucket-anywhere", ""),
            p.secrets(),
        ))
        .await
        .expect_err("missing bucket");
    println!("missing bucket -> {:?}: {}", err.code(), err.message());
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(!missing.exists(), "target removed after the failed mount");

    let unreachable = p.target("pod-unreachable");
    let mut attrs = p.attributes("csi-any-bucket", "");
    attrs.insert("endpointUrl".into(), "http://127.0.0.1:9".into());
    let err = p
        .csi
        .publish(publish_request(
            "vol-unreachable",
            &unreachable,
            attrs,
            p.secrets(),
        ))
        .await
        .expect_err("unreachable endpoint");
    println!(
        "unreachable endpoint -> {:?}: {}",
        err.code(),
        err.message()
    );
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(!unreachable.exists());
}

/// `riffle mount --take-over` tells the mounter by its exit status which failure allows a
/// fresh mount: the fd store's word that it holds nothing for the target is
/// [`rifflefs::cli::EXIT_NOTHING_TO_TAKE_OVER`]; a store that cannot be asked is not
/// (a connection may still be kept there, and a remount would take it from the pods).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_over_with_nothing_to_take_says_so_in_its_exit_status() {
    let _serial = SERIAL.lock().await;
    let env = env();
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("fd-store.sock");
    let mut store = std::process::Command::new(&env.riffle)
        .args(["fd-store", "--socket"])
        .arg(&socket)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start riffle fd-store");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !socket.exists() {
        assert!(Instant::now() < deadline, "fd store socket");
        std::thread::sleep(Duration::from_millis(20));
    }
    let target = dir.path().join("mnt");
    std::fs::create_dir(&target).expect("mkdir");
    let take_over = |store: &Path| {
        std::process::Command::new(&env.riffle)
            .args(["mount", "s3://any-bucket/"])
            .arg(&target)
            .args(["--endpoint-url", &env.endpoint, "--restart", "--take-over"])
            .arg(format!("--fd-store={}", store.display()))
            .output()
            .expect("run riffle mount")
    };
    let nothing = take_over(&socket);
    let said = String::from_utf8_lossy(&nothing.stderr).into_owned();
    assert_eq!(
        nothing.status.code(),
        Some(rifflefs::cli::EXIT_NOTHING_TO_TAKE_OVER),
        "{said}"
    );
    assert!(said.contains("holds no connection"), "{said}");
    let unreachable = take_over(&dir.path().join("no-store.sock"));
    let said = String::from_utf8_lossy(&unreachable.stderr).into_owned();
    assert_eq!(unreachable.status.code(), Some(1), "{said}");
    assert!(said.contains("unreachable"), "{said}");
    assert_eq!(
        riffle_csi::mounter::riffle::classify(nothing.status.code()),
        riffle_csi::mounter::MountErrorKind::NothingToTakeOver
    );
    transcript(format!(
        "--take-over with an empty store exits {:?}; with no store {:?}",
        nothing.status.code(),
        unreachable.status.code()
    ));
    let _ = store.kill();
    let _ = store.wait();
}

/// NodeGetVolumeStats of a published volume against the bucket's own listing: bytes = the
/// objects' total size (all cached once read), inodes = objects + directories.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_stats_match_the_bucket() {
    let _serial = SERIAL.lock().await;
    let env = env();
    let bucket = make_bucket(&env, 3).await;
    // The manifest: every object and its size, from the store.
    let listing = common::rgw::s3(&env)
        .await
        .list_objects_v2()
        .bucket(&bucket)
        .send()
        .await
        .expect("list");
    let objects: Vec<(String, u64)> = listing
        .contents()
        .iter()
        .map(|o| {
            (
                o.key().unwrap_or_default().to_string(),
                o.size().unwrap_or(0) as u64,
            )
        })
        .collect();
    let total: u64 = objects.iter().map(|(_, s)| s).sum();
    let dirs: std::collections::BTreeSet<&str> = objects
        .iter()
        .flat_map(|(k, _)| k.match_indices('/').map(move |(i, _)| &k[..i]))
        .collect();
    let entries = (objects.len() + dirs.len()) as i64;

    let mut p = Plugin::start(&env).await;
    let target = p.target("trainer-stats");
    let mut attributes = p.attributes(&bucket, "");
    attributes.insert("cacheSize".into(), "64MiB".into());
    // No free-space floor: the test machine's disk may have less than the default 15% free,
    // and then the cache stores nothing.
    attributes.insert("cacheMinFree".into(), "0".into());
    p.csi
        .publish(publish_request(
            "vol-stats",
            &target,
            attributes,
            p.secrets(),
        ))
        .await
        .expect("publish");
    // A training epoch: every file read once.
    for (key, size) in &objects {
        let bytes = std::fs::read(target.join(key)).expect("read through the mount");
        assert_eq!(bytes.len() as u64, *size, "{key}");
    }
    let request = riffle_csi::grpc::proto::NodeGetVolumeStatsRequest {
        volume_id: "vol-stats".into(),
        volume_path: target.to_string_lossy().into_owned(),
        staging_target_path: String::new(),
    };
    // The cache writes finish after the reads: ask until all is cached (bounded).
    let deadline = Instant::now() + Duration::from_secs(30);
    let answer = loop {
        let answer = p
            .csi
            .node
            .node_get_volume_stats(request.clone())
            .await
            .expect("NodeGetVolumeStats")
            .into_inner();
        let cached = answer.usage.first().map(|u| u.used);
        if cached == Some(total as i64) || Instant::now() > deadline {
            break answer;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    transcript(format!("NodeGetVolumeStats -> {answer:?}"));
    let usage: Vec<(i32, i64, i64, i64)> = answer
        .usage
        .iter()
        .map(|u| (u.unit, u.total, u.used, u.available))
        .collect();
    use riffle_csi::grpc::proto::volume_usage::Unit;
    assert_eq!(
        usage,
        [
            (Unit::Bytes as i32, total as i64, total as i64, 0),
            (Unit::Inodes as i32, entries, entries, 0),
        ],
        "bucket: {objects:?}"
    );
    let condition = answer.volume_condition.expect("condition");
    assert!(!condition.abnormal, "{condition:?}");
    // What a pod reads: the same document.
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(target.join(".riffle-stats")).expect("stats file"))
            .expect("JSON");
    transcript(format!(
        "{}/.riffle-stats volume section: {}",
        target.display(),
        doc["volume"]
    ));
    assert_eq!(doc["volume"]["listed_bytes"].as_u64(), Some(total));
    p.csi
        .unpublish("vol-stats", &target)
        .await
        .expect("unpublish");
}

/// A mounter whose cache directory is on the root disk refuses volumes that use the cache,
/// with a message naming the flag; volumes without a cache still publish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_disk_cache_is_refused() {
    let _serial = SERIAL.lock().await;
    let env = env();
    let bucket = make_bucket(&env, 1).await;
    let mut p = Plugin::start_with(&env, false).await;
    let target = p.target("trainer-root-disk");
    let mut cached = p.attributes(&bucket, "shard-0");
    cached.insert("cacheSize".into(), "64MiB".into());
    let refused = p
        .csi
        .publish(publish_request("vol-root", &target, cached, p.secrets()))
        .await
        .expect_err("a cache on the root disk is refused");
    transcript(format!(
        "NodePublishVolume with cacheSize -> {:?}: {}",
        refused.code(),
        refused.message()
    ));
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(
        refused.message().contains("--allow-root-disk-cache")
            && refused.message().contains("root filesystem"),
        "{}",
        refused.message()
    );
    assert!(!refused.message().contains('\n'));
    assert_eq!(fstype_at(&target), None, "nothing mounted");
    let log = std::fs::read_to_string(p.mounter_log()).unwrap_or_default();
    assert!(
        log.contains("volumes with cacheSize will be refused"),
        "the mounter said so at start-up"
    );
    // Without the cache the volume publishes on the same node.
    p.csi
        .publish(publish_request(
            "vol-root",
            &target,
            p.attributes(&bucket, "shard-0"),
            p.secrets(),
        ))
        .await
        .expect("publish without a cache");
    assert_eq!(
        std::fs::read_to_string(target.join("data.txt")).expect("read"),
        content(0)
    );
    p.csi
        .unpublish("vol-root", &target)
        .await
        .expect("unpublish");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mounter_metrics_carry_each_volumes_labels() {
    let _serial = SERIAL.lock().await;
    let env = env();
    let bucket = make_bucket(&env, 2).await;
    let mut p = Plugin::start(&env).await;
    // Two pods, two volumes; kubelet adds the pod's name (podInfoOnMount).
    let pods = [
        ("vol-metrics-a", "trainer-a"),
        ("vol-metrics-b", "trainer-b"),
    ];
    let mut targets = Vec::new();
    for (i, (volume, pod)) in pods.iter().enumerate() {
        let target = p.target(pod);
        let mut attributes = p.attributes(&bucket, &format!("shard-{i}"));
        attributes.insert("csi.storage.k8s.io/pod.name".into(), pod.to_string());
        attributes.insert("csi.storage.k8s.io/pod.namespace".into(), "ml".into());
        attributes.insert("csi.storage.k8s.io/ephemeral".into(), "false".into());
        p.csi
            .publish(publish_request(volume, &target, attributes, p.secrets()))
            .await
            .expect("publish");
        assert_eq!(
            std::fs::read_to_string(target.join("data.txt")).expect("read"),
            content(i)
        );
        targets.push(target);
    }
    let text = scrape(p.metrics);
    transcript(format!("GET /metrics ({} lines):", text.lines().count()));
    for line in text.lines().filter(|l| {
        l.starts_with("riffle_mounter")
            || l.starts_with("riffle_store_get_requests")
            || l.starts_with("riffle_blocks_hits")
            || l.contains("riffle_fuse_opens")
            || l.starts_with("riffle_build")
    }) {
        transcript(line);
    }
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert!(text.contains("\nriffle_mounter_volumes 2\n"), "{text}");
    for ((volume, pod), target) in pods.iter().zip(&targets) {
        let key = riffle_csi::node_state::state::StateStore::key(target);
        let labels = format!("{{volume=\"{volume}\",pod=\"ml/{pod}\",key=\"{key}\"");
        for series in [
            "riffle_store_get_requests_total",
            "riffle_fuse_opens_total",
            "riffle_mounter_volume_up",
            "riffle_fuse_op_duration_seconds_count",
        ] {
            assert!(
                text.lines()
                    .any(|l| l.starts_with(&format!("{series}{labels}"))),
                "{series}{labels} in\n{text}"
            );
        }
        assert!(
            text.contains(&format!("riffle_mounter_volume_up{labels}}} 1\n")),
            "{volume} answered"
        );
        // Its files were opened: the daemon's own counter, under its own label.
        let opens = text
            .lines()
            .find(|l| l.starts_with(&format!("riffle_fuse_opens_total{labels}")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .expect("an opens sample");
        assert!(opens >= 1.0, "{volume}: {opens} opens");
    }
    // Each family is described once, with both volumes' samples under it.
    for descriptor in [
        "# TYPE riffle_store_get_requests counter",
        "# TYPE riffle_fuse_op_duration_seconds histogram",
        "# TYPE riffle_mounter_volume_up gauge",
    ] {
        assert_eq!(
            text.lines().filter(|l| *l == descriptor).count(),
            1,
            "{descriptor}"
        );
    }
    // No secret in the metrics.
    assert!(!text.contains(&p.env.secret_key));
    assert!(!text.contains(&p.env.access_key));
    // An unpublished volume leaves the metrics.
    p.csi
        .unpublish(pods[0].0, &targets[0])
        .await
        .expect("unpublish");
    let text = scrape(p.metrics);
    assert!(text.contains("\nriffle_mounter_volumes 1\n"), "{text}");
    assert!(!text.contains(&format!("volume=\"{}\"", pods[0].0)));
    assert!(text.contains(&format!("volume=\"{}\"", pods[1].0)));
    p.csi
        .unpublish(pods[1].0, &targets[1])
        .await
        .expect("unpublish");
}

/// Resident memory of process `pid` and its first child (a keeper and its daemon), KiB.
fn rss_kib(pid: i32) -> u64 {
    let of = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmRSS:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|v| v.parse::<u64>().ok())
            })
            .unwrap_or(0)
    };
    of(pid) + child_of(pid).map_or(0, of)
}

/// Stages `volume` (prefix shard-0 of `bucket`) and publishes it to `pods`, as kubelet does
/// for a PV used by those pods on one node; returns the staging path and the shared mount.
async fn stage_and_publish(
    p: &mut Plugin,
    volume: &str,
    bucket: &str,
    pods: &[PathBuf],
    restart_between: bool,
) -> (PathBuf, PathBuf) {
    let staging = kubelet_staging(&p.dir.path().join("kubelet"), volume);
    p.csi
        .stage(volume, &staging, p.attributes(bucket, "shard-0"))
        .await
        .expect("stage");
    if restart_between {
        p.restart().await;
    }
    for target in pods {
        let req = staged_publish_request(
            volume,
            &staging,
            target,
            p.attributes(bucket, "shard-0"),
            p.secrets(),
        );
        p.csi.publish(req).await.expect("staged publish");
        assert_eq!(fstype_at(target).as_deref(), Some("fuse.riffle"));
    }
    let shared: Vec<PathBuf> = std::fs::read_dir(&staging)
        .expect("staging")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(shared.len(), 1, "one shared mount: {shared:?}");
    (staging, shared[0].clone())
}

/// Unpublishes `pods`, unstages `volume` and waits for its daemon `keeper` to exit.
async fn unpublish_and_unstage(
    p: &mut Plugin,
    volume: &str,
    staging: &Path,
    pods: &[PathBuf],
    keeper: i32,
) {
    for target in pods {
        p.csi.unpublish(volume, target).await.expect("unpublish");
    }
    p.csi.unstage(volume, staging).await.expect("unstage");
    assert!(
        std::fs::read_dir(staging)
            .expect("staging")
            .next()
            .is_none(),
        "the staging path is left empty for kubelet"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while riffle_csi::mounter::process::identify(keeper).is_some() {
        assert!(
            Instant::now() < deadline,
            "{keeper} still runs after unstage"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// kubelet's calls for a PersistentVolume used by eight pods of one job on a node: without
/// staging (as before: a publish each), eight daemons; staged (NodeStageVolume, then a
/// publish per pod), one daemon bound into every pod. One pod leaving leaves the others
/// reading; NodeUnstageVolume stops the daemon. The plugin is restarted between the stage
/// and the first publish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_volume_is_one_daemon_for_eight_pods() {
    let _serial = SERIAL.lock().await;
    let env = env();
    let bucket = make_bucket(&env, 1).await;
    let mut p = Plugin::start(&env).await;
    let pods = 8;
    let read_all = |targets: &[PathBuf]| {
        for target in targets {
            assert_eq!(
                std::fs::read_to_string(target.join("data.txt")).expect("read"),
                content(0)
            );
            assert_eq!(
                std::fs::read(target.join("nested/deep.bin"))
                    .expect("read")
                    .len(),
                300_000
            );
        }
    };

    // Before: a publish per pod, no staging.
    let direct: Vec<PathBuf> = (0..pods)
        .map(|i| p.target(&format!("direct-{i}")))
        .collect();
    for target in &direct {
        let req = publish_request(
            "vol-job",
            target,
            p.attributes(&bucket, "shard-0"),
            p.secrets(),
        );
        p.csi.publish(req).await.expect("publish");
    }
    read_all(&direct);
    let mut pids: Vec<i32> = direct.iter().map(|t| p.daemon_pid(t)).collect();
    pids.sort();
    pids.dedup();
    let rss_before: u64 = pids.iter().map(|&pid| rss_kib(pid)).sum();
    transcript(format!(
        "without staging: {pods} pods -> {} daemons, {} MiB resident together",
        pids.len(),
        rss_before / 1024
    ));
    assert_eq!(pids.len(), pods);
    for target in &direct {
        p.csi.unpublish("vol-job", target).await.expect("unpublish");
    }

    // After: NodeStageVolume once, the plugin restarted, then a publish per pod.
    let staged: Vec<PathBuf> = (0..pods)
        .map(|i| p.target(&format!("staged-{i}")))
        .collect();
    let (staging, shared) = stage_and_publish(&mut p, "vol-job", &bucket, &staged, true).await;
    read_all(&staged);
    let daemon = p.daemon_pid(&shared);
    let rss_after = rss_kib(daemon);
    transcript(format!(
        "staged: {pods} pods -> 1 daemon (pid {daemon}), {} MiB resident",
        rss_after / 1024
    ));
    assert!(
        staged.iter().all(|t| p.recorded_pid(t).is_none()),
        "pods' targets are binds, with no daemon of their own"
    );
    // Writes are refused through a bind as through the mount.
    assert!(std::fs::write(staged[0].join("new.txt"), b"x").is_err());
    // kubelet asks for a pod's volume stats at its own path: the shared daemon answers.
    let stats = p
        .csi
        .node
        .node_get_volume_stats(riffle_csi::grpc::proto::NodeGetVolumeStatsRequest {
            volume_id: "vol-job".into(),
            volume_path: staged[3].to_string_lossy().into_owned(),
            staging_target_path: staging.to_string_lossy().into_owned(),
        })
        .await
        .expect("NodeGetVolumeStats")
        .into_inner();
    let listed = stats.usage.first().map(|u| u.total);
    assert!(listed.is_some_and(|t| t > 0), "{stats:?}");
    assert!(
        stats.volume_condition.as_ref().is_some_and(|c| !c.abnormal),
        "{stats:?}"
    );

    // One pod goes: the others read on, from the same daemon.
    p.csi
        .unpublish("vol-job", &staged[0])
        .await
        .expect("unpublish one");
    assert!(!staged[0].exists());
    read_all(&staged[1..]);
    assert!(
        riffle_csi::mounter::process::identify(daemon).is_some(),
        "the shared daemon runs"
    );
    transcript("unpublished staged-0: the 7 other pods read on through the same daemon");

    unpublish_and_unstage(&mut p, "vol-job", &staging, &staged[1..], daemon).await;
    transcript(format!("NodeUnstageVolume -> OK; daemon {daemon} exited"));
}

/// `--cache-size=...` on the command line of the daemon serving `target`.
fn cache_size_arg(p: &Plugin, target: &Path) -> Option<String> {
    let pid = p.daemon_pid(target);
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("cmdline");
    cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .find_map(|a| a.strip_prefix("--cache-size=").map(str::to_string))
}

/// Two volumes that each ask for 80% of the node cache: the first gets it, the second what
/// the mounter's budget (85% by default) leaves, and the first one's share goes back when it
/// is unpublished. Never more than the budget together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_share_the_node_cache_budget() {
    let _serial = SERIAL.lock().await;
    let env = env();
    let bucket = make_bucket(&env, 1).await;
    let p = Plugin::start(&env).await;
    let mut attributes = p.attributes(&bucket, "shard-0");
    attributes.insert("cacheSize".into(), "80%".into());
    attributes.insert("cacheMinFree".into(), "0".into());
    let disk = nix::sys::statvfs::statvfs(&p.dir.path().join("cache")).expect("statvfs");
    let total = disk.blocks() * disk.fragment_size();
    let (a, b, c) = (p.target("first"), p.target("second"), p.target("third"));
    let mut csi = p.csi.clone();
    for (id, target) in [("vol-a", &a), ("vol-b", &b)] {
        csi.publish(publish_request(id, target, attributes.clone(), p.secrets()))
            .await
            .expect("publish");
        assert_eq!(
            std::fs::read_to_string(target.join("data.txt")).expect("read"),
            content(0)
        );
    }
    let first: u64 = cache_size_arg(&p, &a)
        .expect("a cache")
        .parse()
        .expect("bytes");
    let second: u64 = cache_size_arg(&p, &b)
        .expect("b cache")
        .parse()
        .expect("bytes");
    transcript(format!(
        "cache disk {} GiB; budget 85%; both ask 80%: first gets {} GiB, second {} GiB",
        total >> 30,
        first >> 30,
        second >> 30
    ));
    assert_eq!(first, total / 100 * 80);
    assert!(first + second <= total / 100 * 85, "{first} + {second}");
    assert!(second > 0 && second < first);
    csi.unpublish("vol-a", &a).await.expect("unpublish a");
    csi.publish(publish_request(
        "vol-c",
        &c,
        attributes.clone(),
        p.secrets(),
    ))
    .await
    .expect("publish c");
    let third: u64 = cache_size_arg(&p, &c)
        .expect("c cache")
        .parse()
        .expect("bytes");
    assert!(
        third > second && third + second <= total / 100 * 85,
        "{third}"
    );
    for (id, target) in [("vol-b", &b), ("vol-c", &c)] {
        csi.unpublish(id, target).await.expect("unpublish");
    }
}

/// A staged volume's shared daemon dies with its keeper (nothing held its connection): the
/// supervisor mounts it again and binds every pod to the new mount; pods read on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_shared_daemon_is_remounted_and_its_pods_bound_again() {
    let _serial = SERIAL.lock().await;
    let env = env();
    let bucket = make_bucket(&env, 1).await;
    let mut p = Plugin::start(&env).await;
    let pods: Vec<PathBuf> = (0..2).map(|i| p.target(&format!("heal-{i}"))).collect();
    let (staging, shared) = stage_and_publish(&mut p, "vol-heal", &bucket, &pods, false).await;
    let keeper = p.daemon_pid(&shared);
    let daemon = child_of(keeper).expect("the keeper's daemon");
    sigkill(&[keeper, daemon]);
    transcript(format!(
        "shared daemon: keeper {keeper} and daemon {daemon} SIGKILLed"
    ));
    for target in &pods {
        let text = read_eventually(&target.join("data.txt"), Duration::from_secs(60)).await;
        assert_eq!(text, content(0));
    }
    let new_keeper = p.daemon_pid(&shared);
    assert_ne!(new_keeper, keeper);
    transcript(format!(
        "the supervisor remounted the shared mount (keeper {new_keeper}) and bound both pods again: readable"
    ));
    unpublish_and_unstage(&mut p, "vol-heal", &staging, &pods, new_keeper).await;
}
