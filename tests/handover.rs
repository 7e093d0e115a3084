//! `riffle mount --restart` against the real RGW: the daemon is SIGKILLed (what an OOM kill
//! does) again and again, and replaced by a different build (an upgrade), while readers read
//! every file in a loop and one handle opened before the first kill stays open throughout.
//! Every read must return the object's bytes: 0 failed, 0 wrong, progress after every kill,
//! and the keeper's successor serves the same connection (the mount is never remounted).

#![cfg(feature = "rgw-tests")]

mod common;

use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Mount;

/// Files in the bucket (small ones, read whole), plus one large file read at random offsets
/// through a handle held open for the whole test.
const FILES: usize = 120;
const LARGE: usize = 6 << 20;

/// What the readers saw.
#[derive(Default)]
struct Tally {
    reads: AtomicU64,
    failed: AtomicU64,
    wrong: AtomicU64,
    /// Complete passes over every file, by all readers together.
    passes: AtomicU64,
    /// The longest read, in microseconds.
    longest_us: AtomicU64,
    errors: Mutex<Vec<String>>,
}

impl Tally {
    fn read(&self, what: &str, expected: &[u8], read: impl FnOnce() -> std::io::Result<Vec<u8>>) {
        let start = Instant::now();
        let result = read();
        self.longest_us
            .fetch_max(start.elapsed().as_micros() as u64, Ordering::Relaxed);
        self.reads.fetch_add(1, Ordering::Relaxed);
        match result {
            Ok(data) if data == expected => {}
            Ok(data) => {
                self.wrong.fetch_add(1, Ordering::Relaxed);
                self.note(format!("{what}: {} wrong bytes", data.len()));
            }
            Err(e) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                self.note(format!("{what}: {e}"));
            }
        }
    }

    /// Reads, failed reads, wrong reads.
    fn counts(&self) -> (u64, u64, u64) {
        (
            self.reads.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
            self.wrong.load(Ordering::Relaxed),
        )
    }

    fn note(&self, line: String) {
        let mut errors = self.errors.lock().unwrap();
        if errors.len() < 10 {
            errors.push(line);
        }
    }
}

struct Dataset {
    files: Vec<(String, Vec<u8>)>,
    large: Vec<u8>,
}

fn dataset(endpoint: &str, bucket: &str) -> Dataset {
    let rt = common::runtime();
    let s3 = common::client(endpoint);
    let files: Vec<(String, Vec<u8>)> = (0..FILES)
        .map(|i| {
            let size = 2_000 + (i * 7_919) % 150_000;
            (
                format!("train/c{:02}/img_{i:04}.jpg", i % 8),
                common::pattern(size, i as u64),
            )
        })
        .collect();
    let large = common::pattern(LARGE, 999);
    rt.block_on(async {
        common::create_bucket(&s3, bucket).await;
        common::put_many(&s3, bucket, files.clone(), 16).await;
        common::put(&s3, bucket, "tokens.bin", large.clone()).await;
    });
    Dataset { files, large }
}

/// Starts the readers: two that pass over every file (open, read whole, close), one that
/// preads the held handle of the large file.
fn start_readers(
    root: &Path,
    data: &Arc<Dataset>,
    tally: &Arc<Tally>,
    stop: &Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<()>> {
    let held = std::fs::File::open(root.join("tokens.bin")).expect("open the held file");
    let mut readers = Vec::new();
    for r in 0..2usize {
        let (root, data, tally, stop) = (
            root.to_path_buf(),
            data.clone(),
            tally.clone(),
            stop.clone(),
        );
        readers.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for i in 0..data.files.len() {
                    let (key, bytes) = &data.files[(i * 7 + r * 13) % data.files.len()];
                    tally.read(key, bytes, || {
                        let mut out = Vec::new();
                        let name = |what: &str, e: std::io::Error| {
                            std::io::Error::new(e.kind(), format!("{what}: {e}"))
                        };
                        std::fs::File::open(root.join(key))
                            .map_err(|e| name("open", e))?
                            .read_to_end(&mut out)
                            .map_err(|e| name("read", e))?;
                        Ok(out)
                    });
                }
                tally.passes.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    {
        let (data, tally, stop) = (data.clone(), tally.clone(), stop.clone());
        readers.push(std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let offset = (n * 1_048_573) % (LARGE as u64 - 70_000);
                let len = 4_096 + (n as usize * 4_099) % 65_536;
                let want = &data.large[offset as usize..offset as usize + len];
                tally.read("tokens.bin (held)", want, || {
                    let mut out = vec![0u8; len];
                    held.read_exact_at(&mut out, offset)?;
                    Ok(out)
                });
            }
        }));
    }
    readers
}

/// Stops the readers and waits for them.
fn stop_readers(stop: &AtomicBool, readers: Vec<std::thread::JoinHandle<()>>) {
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        reader.join().expect("reader");
    }
}

/// Waits until the readers made `passes` more passes (a successor serves: progress).
fn wait_for_progress(tally: &Tally, passes: u64, what: &str) {
    let target = tally.passes.load(Ordering::Relaxed) + passes;
    let deadline = Instant::now() + Duration::from_secs(120);
    while tally.passes.load(Ordering::Relaxed) < target {
        assert!(
            Instant::now() < deadline,
            "{what}: no progress in 120 s (failed {}, errors {:?})",
            tally.failed.load(Ordering::Relaxed),
            tally.errors.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The daemon's pid (it answers `riffle stats`; the pid file names the keeper), or `None`
/// while no daemon answers (between a kill and its successor).
fn daemon_pid(mount: &Mount) -> Option<i32> {
    let out = std::process::Command::new(common::RIFFLE)
        .args(["stats", "--json"])
        .arg(&mount.path)
        .output()
        .ok()?;
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    stats["pid"].as_i64().map(|p| p as i32)
}

/// The daemon's pid once a live daemon other than `old` answers.
fn wait_for_new_daemon(mount: &Mount, old: i32) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(pid) = daemon_pid(mount).filter(|p| *p != old) {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "no successor daemon within 60 s:\n{}",
            mount.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn sigkill(pid: i32) {
    // SAFETY: a plain kill of a process this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0, "kill {pid}");
}

/// SIGKILLs `pids` as one: each is stopped first, so that none sees another die (a daemon
/// whose keeper died starts a new one, a keeper whose daemon died a successor).
fn kill_together(pids: &[i32]) {
    for &pid in pids {
        // SAFETY: a plain kill of a process this test started.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0, "stop {pid}");
    }
    for &pid in pids {
        sigkill(pid);
    }
}

/// The daemon's parent.
fn parent_of(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("daemon stat");
    let after = &stat[stat.rfind(')').expect("stat") + 2..];
    after
        .split(' ')
        .nth(1)
        .expect("ppid")
        .parse()
        .expect("ppid")
}

fn passthrough_opens(mount: &Mount) -> u64 {
    common::stats(mount)["fuse"]["passthrough_opens"]
        .as_u64()
        .unwrap_or(0)
}

fn run_scenario(endpoint: &str, extra: &[&str], program: Option<&Path>) {
    let bucket = common::unique_bucket("handover");
    let data = Arc::new(dataset(endpoint, &bucket));
    let cache = tempfile::tempdir().expect("cache dir");
    let cache_dir = cache.path().to_str().expect("utf-8 path");
    let mut args = vec!["--restart", "--cache-dir", cache_dir, "--cache-size", "1G"];
    args.extend_from_slice(extra);
    let mount = match program {
        Some(program) => {
            Mount::new_with_program(endpoint, program, &format!("s3://{bucket}/"), &args)
        }
        None => Mount::new(endpoint, &format!("s3://{bucket}/"), &args),
    };
    let keeper = mount.pid();
    let first = daemon_pid(&mount).expect("the daemon answers");
    assert_eq!(parent_of(first), keeper, "the pid file names the keeper");
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let readers = start_readers(&mount.path, &data, &tally, &stop);
    wait_for_progress(&tally, 2, "before the first kill");
    let mut pid = first;
    let mut passthrough = Vec::new();
    for round in 1..=3 {
        passthrough.push(passthrough_opens(&mount));
        sigkill(pid);
        pid = wait_for_new_daemon(&mount, pid);
        assert_eq!(
            parent_of(pid),
            keeper,
            "round {round}: the keeper started the successor"
        );
        wait_for_progress(&tally, 2, &format!("after kill {round}"));
    }
    passthrough.push(passthrough_opens(&mount));
    stop_readers(&stop, readers);
    let errors = tally.errors.lock().unwrap().clone();
    let (reads, failed, wrong) = tally.counts();
    eprintln!(
        "handover {extra:?}: 3 SIGKILLs, {reads} reads, {failed} failed, {wrong} wrong, longest read {} ms, passthrough opens by each daemon {passthrough:?}",
        tally.longest_us.load(Ordering::Relaxed) / 1000
    );
    if failed + wrong > 0 {
        let log = mount.log_text();
        let notable: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR") || l.contains("took"))
            .collect();
        eprintln!(
            "the mount's log (warnings and take-overs):\n{}",
            notable.join("\n")
        );
    }
    assert_eq!((failed, wrong), (0, 0), "errors: {errors:?}");
    assert!(reads > 0);
    let log = mount.log_text();
    assert_eq!(
        log.matches("took the mount over from the keeper").count(),
        3,
        "log:\n{log}"
    );
    if !extra.contains(&"--no-passthrough") {
        // Every successor opened files through passthrough again (its own backing ids).
        assert!(
            passthrough.iter().skip(1).all(|&n| n > 0),
            "passthrough opens {passthrough:?}"
        );
    }
    // Unmounting ends the daemon and its keeper; nothing stays mounted.
    let path = mount.path.clone();
    drop(mount);
    for p in [pid, keeper] {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Path::new(&format!("/proc/{p}")).exists()
            && !std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|s| s.contains(") Z "))
        {
            assert!(
                Instant::now() < deadline,
                "process {p} still running after unmount"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mounts.contains(path.to_str().expect("utf-8")),
        "still mounted"
    );
}

#[test]
fn sigkilled_daemons_cost_no_read_with_passthrough() {
    let endpoint = need_rgw!();
    run_scenario(&endpoint, &[], None);
}

#[test]
fn sigkilled_daemons_cost_no_read_without_passthrough() {
    let endpoint = need_rgw!();
    run_scenario(&endpoint, &["--no-passthrough"], None);
}

/// An upgrade: a new build is installed over the program the keeper runs (a rename, as a
/// package manager does), and SIGHUP makes the keeper replace its daemon with it.
#[test]
fn a_new_build_takes_the_mount_over_on_sighup() {
    let endpoint = need_rgw!();
    let dir = tempfile::tempdir().expect("tempdir");
    let installed: PathBuf = dir.path().join("riffle");
    std::fs::copy(common::RIFFLE, &installed).expect("install riffle");
    let bucket = common::unique_bucket("upgrade");
    let data = Arc::new(dataset(&endpoint, &bucket));
    let mount = Mount::new_with_program(
        &endpoint,
        &installed,
        &format!("s3://{bucket}/"),
        &["--restart", "--no-passthrough"],
    );
    let keeper = mount.pid();
    let old = daemon_pid(&mount).expect("the daemon answers");
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let readers = start_readers(&mount.path, &data, &tally, &stop);
    wait_for_progress(&tally, 2, "before the upgrade");
    // A different build: the same program with bytes appended (another file, another digest).
    let staged = dir.path().join("riffle.new");
    let mut bytes = std::fs::read(common::RIFFLE).expect("read riffle");
    bytes.extend_from_slice(b"\nanother build\n");
    std::fs::write(&staged, &bytes).expect("stage the new build");
    std::fs::set_permissions(&staged, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    std::fs::rename(&staged, &installed).expect("install the new build");
    // SAFETY: a plain kill of a process this test started.
    assert_eq!(unsafe { libc::kill(keeper, libc::SIGHUP) }, 0);
    let new = wait_for_new_daemon(&mount, old);
    wait_for_progress(&tally, 2, "after the upgrade");
    stop_readers(&stop, readers);
    let exe = std::fs::read_link(format!("/proc/{new}/exe")).expect("successor exe");
    let digest = |path: &Path| {
        use sha2::Digest;
        sha2::Sha256::digest(std::fs::read(path).expect("read")).to_vec()
    };
    assert_eq!(exe, installed, "the successor runs the new build");
    assert_ne!(digest(&installed), digest(Path::new(common::RIFFLE)));
    let (_, failed, wrong) = tally.counts();
    assert_eq!(
        (failed, wrong),
        (0, 0),
        "errors: {:?}",
        tally.errors.lock().unwrap()
    );
}

/// Keeper and daemon killed together (in Kubernetes: the mounter container restarted), with
/// a copy of the connection in an fd store (`riffle fd-store`, the plugin's container): a new
/// `riffle mount --restart --fd-store` of the same mountpoint takes the live mount over. The
/// store restarting (the plugin's container) loses nothing either: the keeper gives it the
/// connection again.
/// A running `riffle fd-store`, SIGKILLed when dropped (a failed test leaves none behind).
struct FdStore(std::process::Child);

impl FdStore {
    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for FdStore {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `riffle fd-store` at `socket` and waits until it listens.
fn start_fd_store(socket: &Path) -> FdStore {
    let child = std::process::Command::new(common::RIFFLE)
        .args(["fd-store", "--socket"])
        .arg(socket)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start riffle fd-store");
    let store = FdStore(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !socket.exists() {
        assert!(Instant::now() < deadline, "fd store socket");
        std::thread::sleep(Duration::from_millis(20));
    }
    store
}

/// A `--restart` mount whose keepers give a `riffle fd-store` of its own their copy, as on
/// a CSI node (the mount is dropped before the store).
struct StoreMount {
    mount: Mount,
    store: FdStore,
    socket: PathBuf,
    source: String,
    /// The mount's options: keeper, store, cache.
    args: Vec<String>,
    _dirs: [tempfile::TempDir; 2],
}

impl StoreMount {
    fn new(endpoint: &str, bucket: &str) -> StoreMount {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("fdstore.sock");
        let store = start_fd_store(&socket);
        let cache = tempfile::tempdir().expect("cache dir");
        let source = format!("s3://{bucket}/");
        let args: Vec<String> = [
            "--restart",
            "--fd-store",
            socket.to_str().expect("utf-8"),
            "--cache-dir",
            cache.path().to_str().expect("utf-8"),
            "--cache-size",
            "1G",
        ]
        .map(String::from)
        .into();
        let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let mount = Mount::new(endpoint, &source, &arg_refs);
        StoreMount {
            mount,
            store,
            socket,
            source,
            args,
            _dirs: [dir, cache],
        }
    }

    /// `riffle mount` of the same volume at the same mountpoint, log and pid file, against
    /// `endpoint`: what a new mounter container runs once the old one's keeper and daemon died.
    fn remount(&self, endpoint: &str) -> std::process::Command {
        let mut cmd = std::process::Command::new(common::RIFFLE);
        cmd.arg("mount")
            .arg(&self.source)
            .arg(&self.mount.path)
            .args([
                "--endpoint-url",
                endpoint,
                "--force-path-style",
                "--cache-min-free",
                "0",
            ])
            .arg("--log-file")
            .arg(&self.mount.log)
            .arg("--pid-file")
            .arg(&self.mount.pid_file)
            .args(&self.args);
        cmd
    }
}

#[test]
fn keeper_and_daemon_killed_together_cost_no_read_with_an_fd_store() {
    let endpoint = need_rgw!();
    let bucket = common::unique_bucket("fdstore");
    let data = Arc::new(dataset(&endpoint, &bucket));
    let mut node = StoreMount::new(&endpoint, &bucket);
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let readers = start_readers(&node.mount.path, &data, &tally, &stop);
    wait_for_progress(&tally, 2, "before the first kill");
    let wait_for_log = |needle: &str, count: usize| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while node.mount.log_text().matches(needle).count() < count {
            assert!(
                Instant::now() < deadline,
                "log never said '{needle}':\n{}",
                node.mount.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_for_log("the fd store holds a copy of the connection", 1);
    for round in 1..=3 {
        if round == 2 {
            // The store restarts; the keeper gives it the connection again.
            node.store.kill();
            let held = node
                .mount
                .log_text()
                .matches("the fd store holds a copy of the connection")
                .count();
            node.store = start_fd_store(&node.socket);
            wait_for_log("the fd store holds a copy of the connection", held + 1);
        }
        let held_before = node
            .mount
            .log_text()
            .matches("the fd store holds a copy of the connection")
            .count();
        let keeper = node.mount.pid();
        let daemon = daemon_pid(&node.mount).expect("a daemon answers");
        kill_together(&[keeper, daemon]);
        // A new keeper for the same mountpoint (as a new mounter container would start one).
        let out = common::run_with_timeout(&mut node.remount(&endpoint), Duration::from_secs(90));
        assert!(
            out.status.success(),
            "round {round}: remount through the store failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            node.mount.log_text()
        );
        wait_for_log("took the mount over from the fd store", round);
        // The new keeper gave the store its copy (before the next kill).
        wait_for_log(
            "the fd store holds a copy of the connection",
            held_before + 1,
        );
        wait_for_progress(
            &tally,
            2,
            &format!("after killing keeper and daemon, round {round}"),
        );
    }
    stop_readers(&stop, readers);
    let (reads, failed, wrong) = tally.counts();
    eprintln!(
        "fd store: keeper and daemon SIGKILLed together 3 times (store restarted once): {reads} reads, {failed} failed, {wrong} wrong, longest read {} ms",
        tally.longest_us.load(Ordering::Relaxed) / 1000
    );
    assert_eq!(
        (failed, wrong),
        (0, 0),
        "errors: {:?}",
        tally.errors.lock().unwrap()
    );
    drop(node);
}

/// The live riffle processes serving `mount` by role: keepers (named
/// `riffle-keeper`) and daemons, and the zombies among their children.
struct Roles {
    keepers: Vec<i32>,
    daemons: Vec<i32>,
    zombies: Vec<i32>,
}

fn roles(mountpoint: &Path) -> Roles {
    let needle = mountpoint.to_string_lossy().into_owned();
    let stat = |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let (mut keepers, mut daemons, mut live) = (Vec::new(), Vec::new(), Vec::new());
    let mut parents = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = stat(pid);
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        let ppid: i32 = fields.get(1).and_then(|p| p.parse().ok()).unwrap_or(0);
        parents.push((pid, ppid, fields.first() == Some(&"Z")));
        let argv = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let argv = String::from_utf8_lossy(&argv);
        if fields.first() == Some(&"Z") || !argv.contains(&needle) || !argv.contains("mount") {
            continue;
        }
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        live.push(pid);
        if comm.trim() == "riffle-keeper" {
            keepers.push(pid);
        } else if argv.contains("--foreground") {
            daemons.push(pid);
        }
    }
    let zombies = parents
        .iter()
        .filter(|(_, ppid, zombie)| *zombie && live.contains(ppid))
        .map(|(pid, _, _)| *pid)
        .collect();
    Roles {
        keepers,
        daemons,
        zombies,
    }
}

/// Waits until exactly one keeper, other than `old` and named by the pid file, and exactly one
/// daemon serve `mount`.
fn wait_for_one_keeper(mount: &Mount, old: i32) -> (i32, i32) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = roles(&mount.path);
        let named = std::fs::read_to_string(&mount.pid_file)
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok());
        if now.keepers.len() == 1
            && now.keepers[0] != old
            && now.daemons.len() == 1
            && named == Some(now.keepers[0])
        {
            return (now.keepers[0], now.daemons[0]);
        }
        assert!(
            Instant::now() < deadline,
            "no new keeper for the daemon within 60 s: keepers {:?}, daemons {:?}\n{}",
            now.keepers,
            now.daemons,
            mount.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The keeper of a workstation mount (`riffle mount --restart`, no fd store) is SIGKILLed:
/// its daemon serves on and starts a new keeper for itself, which then replaces a SIGKILLed
/// daemon as the first did. Three rounds; 0 failed and 0 wrong reads, exactly one keeper and
/// one daemon after each, no zombie, and nothing left after unmount.
#[test]
fn a_killed_keeper_costs_no_read_and_the_daemon_gets_a_new_one() {
    let endpoint = need_rgw!();
    let bucket = common::unique_bucket("keeperkill");
    let data = Arc::new(dataset(&endpoint, &bucket));
    let cache = tempfile::tempdir().expect("cache dir");
    let cache_dir = cache.path().to_str().expect("utf-8 path");
    let mount = Mount::new(
        &endpoint,
        &format!("s3://{bucket}/"),
        &["--restart", "--cache-dir", cache_dir, "--cache-size", "1G"],
    );
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let readers = start_readers(&mount.path, &data, &tally, &stop);
    wait_for_progress(&tally, 2, "before the first kill");
    let (mut keeper, mut daemon) = wait_for_one_keeper(&mount, 0);
    assert_eq!(mount.pid(), keeper, "the pid file names the keeper");
    for round in 1..=3 {
        sigkill(keeper);
        let (adopter, same) = wait_for_one_keeper(&mount, keeper);
        assert_eq!(same, daemon, "round {round}: the daemon serves on");
        assert_eq!(
            parent_of(adopter),
            daemon,
            "round {round}: the daemon started its new keeper"
        );
        assert_eq!(mount.pid(), adopter, "round {round}: the pid file names it");
        wait_for_progress(&tally, 2, &format!("after keeper kill {round}"));
        // The mount is kept again: a daemon kill is survived as before.
        sigkill(daemon);
        let successor = wait_for_new_daemon(&mount, daemon);
        assert_eq!(
            parent_of(successor),
            adopter,
            "round {round}: the new keeper started the successor"
        );
        wait_for_progress(&tally, 2, &format!("after daemon kill {round}"));
        (keeper, daemon) = wait_for_one_keeper(&mount, 0);
        assert_eq!((keeper, daemon), (adopter, successor));
        let now = roles(&mount.path);
        assert!(
            now.zombies.is_empty(),
            "round {round}: zombies {:?}",
            now.zombies
        );
    }
    stop_readers(&stop, readers);
    let (reads, failed, wrong) = tally.counts();
    eprintln!(
        "keeper kills: 3 keeper and 3 daemon SIGKILLs, {reads} reads, {failed} failed, {wrong} wrong, longest read {} ms",
        tally.longest_us.load(Ordering::Relaxed) / 1000
    );
    assert_eq!(
        (failed, wrong),
        (0, 0),
        "errors: {:?}",
        tally.errors.lock().unwrap()
    );
    let log = mount.log_text();
    assert_eq!(log.matches("whose keeper died").count(), 3, "log:\n{log}");
    let path = mount.path.clone();
    drop(mount);
    let deadline = Instant::now() + Duration::from_secs(30);
    let left = loop {
        let r = roles(&path);
        if r.keepers.is_empty() && r.daemons.is_empty() {
            break r;
        }
        assert!(Instant::now() < deadline, "processes left after unmount");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(left.zombies.is_empty());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mounts.contains(path.to_str().expect("utf-8")),
        "still mounted"
    );
}

/// The `/dev/fuse` descriptors process `pid` has open.
fn fuse_fds(pid: i32) -> Vec<i32> {
    let dir = format!("/proc/{pid}/fd");
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .flatten()
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t == Path::new("/dev/fuse")))
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// Whether descriptor `a` of process `pa` and `b` of `pb` are the same open file (`kcmp`:
/// a copy made by dup or by passing it over a socket is; a clone of `/dev/fuse` is not).
fn same_file(pa: i32, a: i32, pb: i32, b: i32) -> bool {
    const KCMP_FILE: libc::c_long = 0;
    // SAFETY: kcmp only compares kernel objects of two processes; nothing is written.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, pa, pb, KCMP_FILE, a, b) };
    assert!(r >= 0, "kcmp: {}", std::io::Error::last_os_error());
    r == 0
}

/// One descriptor of each distinct `/dev/fuse` file process `pid` has open: copies of one
/// file (the daemon keeps several of its first descriptor) count once.
fn distinct_fuse_files(pid: i32) -> Vec<i32> {
    let mut distinct: Vec<i32> = Vec::new();
    for fd in fuse_fds(pid) {
        if !distinct.iter().any(|&d| same_file(pid, d, pid, fd)) {
            distinct.push(fd);
        }
    }
    distinct
}

/// Waits until process `pid` is gone (killed and reaped by its keeper).
fn wait_until_gone(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            Instant::now() < deadline,
            "process {pid} still there 30 s after SIGKILL"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Each FUSE thread reads a `/dev/fuse` descriptor of its own (a clone), and the keeper holds
/// every one of them: a SIGKILLed daemon's requests in flight on any clone are resent to the
/// successor, which serves on exactly those descriptors (no clone of its own). Without
/// passthrough, so that every read goes through the daemon's threads; three kills under
/// readers, 0 failed and 0 wrong reads.
#[test]
fn each_fuse_thread_reads_a_clone_the_keeper_holds_and_a_kill_ends_none() {
    let endpoint = need_rgw!();
    let bucket = common::unique_bucket("clones");
    let data = Arc::new(dataset(&endpoint, &bucket));
    let cache = tempfile::tempdir().expect("cache dir");
    let cache_dir = cache.path().to_str().expect("utf-8 path");
    let mount = Mount::new(
        &endpoint,
        &format!("s3://{bucket}/"),
        &[
            "--restart",
            "--fuse-threads",
            "4",
            "--no-passthrough",
            "--cache-dir",
            cache_dir,
            "--cache-size",
            "1G",
        ],
    );
    let keeper = mount.pid();
    let held = distinct_fuse_files(keeper);
    assert_eq!(
        held.len(),
        4,
        "the keeper holds the first descriptor and 3 clones"
    );
    // Every file a daemon reads is one the keeper holds, and it reads 4 of them.
    let check_daemon = |pid: i32, when: &str| {
        assert_eq!(
            common::stats(&mount)["fuse"]["devices"].as_u64(),
            Some(4),
            "{when}: riffle stats"
        );
        let reads = distinct_fuse_files(pid);
        assert_eq!(
            reads.len(),
            4,
            "{when}: distinct /dev/fuse files of daemon {pid}"
        );
        for fd in reads {
            assert!(
                held.iter().any(|&h| same_file(pid, fd, keeper, h)),
                "{when}: daemon {pid}'s /dev/fuse descriptor {fd} is not one the keeper holds"
            );
        }
        assert_eq!(
            distinct_fuse_files(keeper).len(),
            4,
            "{when}: the keeper holds no other"
        );
    };
    let mut daemon = daemon_pid(&mount).expect("the daemon answers");
    check_daemon(daemon, "first daemon");
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    // Six readers (two sets), so that requests are in flight on every thread at a kill (with
    // the first daemon's clones unheld, 3 runs in 4 failed reads with ECONNABORTED).
    let mut readers = start_readers(&mount.path, &data, &tally, &stop);
    readers.extend(start_readers(&mount.path, &data, &tally, &stop));
    wait_for_progress(&tally, 2, "before the first kill");
    for round in 1..=3 {
        sigkill(daemon);
        wait_until_gone(daemon);
        let successor = wait_for_new_daemon(&mount, daemon);
        assert_eq!(
            parent_of(successor),
            keeper,
            "round {round}: the keeper started the successor"
        );
        check_daemon(successor, &format!("round {round}"));
        wait_for_progress(&tally, 2, &format!("after kill {round}"));
        daemon = successor;
    }
    stop_readers(&stop, readers);
    let (reads, failed, wrong) = tally.counts();
    eprintln!(
        "clones: 4 /dev/fuse descriptors, 3 SIGKILLs, {reads} reads, {failed} failed, {wrong} wrong, longest read {} ms",
        tally.longest_us.load(Ordering::Relaxed) / 1000
    );
    assert_eq!(
        (failed, wrong),
        (0, 0),
        "errors: {:?}",
        tally.errors.lock().unwrap()
    );
    let log = mount.log_text();
    assert_eq!(
        log.matches("took the mount over from the keeper").count(),
        3,
        "log:\n{log}"
    );
}

/// A TCP relay to the RGW that holds every connection unanswered until it is opened: while
/// it is shut, a daemon that lists the bucket before it reports (every daemon does, its
/// probe) cannot report anything.
struct Gate {
    endpoint: String,
    open: Arc<AtomicBool>,
    /// Connections accepted while shut.
    held: Arc<AtomicU64>,
}

impl Gate {
    fn new(upstream: &str) -> Gate {
        let upstream = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the gate");
        let endpoint = format!("http://{}", listener.local_addr().expect("gate address"));
        let open = Arc::new(AtomicBool::new(false));
        let held = Arc::new(AtomicU64::new(0));
        let (is_open, count) = (open.clone(), held.clone());
        std::thread::spawn(move || {
            let mut stalled = Vec::new();
            for client in listener.incoming().flatten() {
                if !is_open.load(Ordering::SeqCst) {
                    count.fetch_add(1, Ordering::SeqCst);
                    stalled.push(client);
                    continue;
                }
                stalled.clear();
                let Ok(server) = std::net::TcpStream::connect(&upstream) else {
                    continue;
                };
                for (mut from, mut to) in [
                    (
                        client.try_clone().expect("clone"),
                        server.try_clone().expect("clone"),
                    ),
                    (server, client),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Write);
                    });
                }
            }
        });
        Gate {
            endpoint,
            open,
            held,
        }
    }
}

/// A take-over from the fd store whose first daemon dies before it reports: the keeper has
/// the connection already (from the store), starts a successor, and `riffle mount` exits 0
/// once the successor serves, instead of waiting forever on a keeper that serves on (what a
/// CSI chaos run hit: the mounter's take-over never answered, so no other volume was
/// recovered). The first daemon is held in its start-up probe by a shut [`Gate`] until the
/// test has killed it, so it dies before its `OK` in every run.
#[test]
fn a_take_over_whose_first_daemon_dies_unreported_reports_its_successor() {
    let endpoint = need_rgw!();
    let bucket = common::unique_bucket("unreported");
    let data = dataset(&endpoint, &bucket);
    let node = StoreMount::new(&endpoint, &bucket);
    let mount = &node.mount;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !mount
        .log_text()
        .contains("the fd store holds a copy of the connection")
    {
        assert!(Instant::now() < deadline, "the store never held the mount");
        std::thread::sleep(Duration::from_millis(20));
    }
    kill_together(&[mount.pid(), daemon_pid(mount).expect("a daemon answers")]);
    let gate = Gate::new(&endpoint);
    let mut take_over = node
        .remount(&gate.endpoint)
        .arg("--take-over")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the take-over");
    // The first daemon waits in its probe on the shut gate: kill it there.
    let deadline = Instant::now() + Duration::from_secs(60);
    let first = loop {
        let now = roles(&mount.path);
        if gate.held.load(Ordering::SeqCst) > 0 && now.keepers.len() == 1 {
            if let [daemon] = now.daemons[..] {
                break daemon;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the first daemon never reached the gate: {} connections, keepers {:?}, daemons {:?}\n{}",
            gate.held.load(Ordering::SeqCst),
            now.keepers,
            now.daemons,
            mount.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    sigkill(first);
    gate.open.store(true, Ordering::SeqCst);
    // A guard against the old hang only: the verdict comes once the successor serves.
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(status) = take_over.try_wait().expect("wait for riffle mount") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = take_over.kill();
            panic!(
                "riffle mount --take-over never returned after its first daemon died:\n{}",
                mount.log_text()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    if let Some(mut pipe) = take_over.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    assert!(
        status.success(),
        "the take-over failed ({status}): {stderr}\n{}",
        mount.log_text()
    );
    let log = mount.log_text();
    assert!(
        log.contains("took the mount over from the fd store")
            && log.contains("the daemon was killed by SIGKILL; starting a successor"),
        "the take-over's first daemon was not replaced:\n{log}"
    );
    let successor = daemon_pid(mount).expect("the successor answers");
    assert_ne!(successor, first, "the successor serves");
    let (name, bytes) = &data.files[0];
    assert_eq!(
        &std::fs::read(mount.join(name)).expect("read through the successor"),
        bytes,
        "the successor serves the object's bytes"
    );
    drop(node);
}
