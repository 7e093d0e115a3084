//! The workstation unit (`deploy/examples/riffle-dataset.service`, this very file with its
//! paths and source replaced) under a real systemd, in a podman container (`--systemd=always`,
//! a Debian rootfs from `mmdebstrap`), against the real RGW: readers on the host read the
//! mount through an `rshared` bind while the keeper (the unit's main process) is SIGKILLed
//! three times and then the daemon. systemd keeps a copy of the FUSE connection in its
//! descriptor store (`--fd-store systemd`), restarts the unit, and the new keeper takes the
//! live mount over: 0 failed and 0 wrong reads, one keeper and one daemon after each kill, and
//! `systemctl stop` leaves no mount and no riffle process.
//!
//! Runs with `RIFFLE_CONTAINER_TESTS=1` (podman, runc and mmdebstrap installed, as
//! `tests/run.sh` does); otherwise it says it was skipped. The rootfs is built once and kept in
//! `$RIFFLE_TEST_CACHE` (default /var/cache/riffle-tests).

#![cfg(feature = "rgw-tests")]

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The rootfs packages: systemd as init, fuse3 for fusermount, ca-certificates for TLS roots.
const PACKAGES: &str = "systemd,systemd-sysv,dbus,fuse3,ca-certificates";

fn enabled() -> bool {
    std::env::var("RIFFLE_CONTAINER_TESTS").is_ok_and(|v| v == "1")
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn podman() -> Command {
    let mut cmd = Command::new("podman");
    cmd.args(["--runtime", "runc"]);
    cmd
}

/// `localhost/riffle-test-systemd:<digest of the package list>`, built once.
fn systemd_image() -> String {
    use sha2::Digest;
    let tag: String = sha2::Sha256::digest(PACKAGES)[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let image = format!("localhost/riffle-test-systemd:{tag}");
    if podman()
        .args(["image", "exists", &image])
        .status()
        .is_ok_and(|s| s.success())
    {
        return image;
    }
    let cache = PathBuf::from(
        std::env::var("RIFFLE_TEST_CACHE").unwrap_or_else(|_| "/var/cache/riffle-tests".into()),
    );
    std::fs::create_dir_all(&cache).expect("test cache dir");
    let rootfs = cache.join(format!("systemd-rootfs-{tag}.tar"));
    if !rootfs.exists() {
        // mmdebstrap writes the format its output's name ends in: a .tar.
        let partial = rootfs.with_extension("partial.tar");
        run(Command::new("mmdebstrap")
            .args([
                "--variant=minbase",
                &format!("--include={PACKAGES}"),
                "bookworm",
            ])
            .arg(&partial));
        std::fs::rename(&partial, &rootfs).expect("keep the rootfs");
    }
    run(podman()
        .args(["import", "--change", "CMD [\"/sbin/init\"]"])
        .arg(&rootfs)
        .arg(&image));
    image
}

/// The shipped unit with this test's source, mountpoint, endpoint and paths.
fn unit(bucket: &str, endpoint: &str) -> String {
    let shipped = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/examples/riffle-dataset.service"),
    )
    .expect("the example unit");
    let mut unit = shipped.clone();
    for (from, to) in [
        ("s3://datasets/imagenet/", format!("s3://{bucket}/")),
        ("/mnt/imagenet", "/share/mnt".to_string()),
        ("http://rgw.lan:7480", endpoint.to_string()),
        (
            "/etc/riffle/imagenet.env",
            "/etc/riffle/test.env".to_string(),
        ),
        ("/usr/local/bin/riffle", "/opt/riffle/riffle".to_string()),
        (
            "--cache-size 80%",
            "--cache-size 1G --cache-min-free 0".to_string(),
        ),
    ] {
        assert!(unit.contains(from), "the example unit no longer has {from}");
        unit = unit.replace(from, &to);
    }
    unit
}

/// Host pids of the unit's riffle processes (their arguments name `bucket`): keepers and
/// daemons.
fn riffle_processes(bucket: &str) -> (Vec<i32>, Vec<i32>) {
    let (mut keepers, mut daemons) = (Vec::new(), Vec::new());
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let argv = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        if stat.contains(") Z ") || !String::from_utf8_lossy(&argv).contains(bucket) {
            continue;
        }
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        if comm.trim() == "riffle-keeper" {
            keepers.push(pid);
        } else if comm.trim() == "riffle" {
            daemons.push(pid);
        }
    }
    (keepers, daemons)
}

/// A podman container running systemd, removed on drop; `share` is bound `rshared`.
struct SystemdContainer {
    name: String,
    share: PathBuf,
    _dir: tempfile::TempDir,
}

impl SystemdContainer {
    fn start(image: &str, bucket: &str, endpoint: &str) -> SystemdContainer {
        let dir = tempfile::tempdir().expect("tempdir");
        let share = dir.path().join("share");
        let bin = dir.path().join("bin");
        for d in [&share, &bin] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        // The mount made in the container's /share appears here (Bidirectional, in Kubernetes
        // words), so the readers run on the host.
        run(Command::new("mount").arg("--bind").arg(&share).arg(&share));
        run(Command::new("mount").arg("--make-rshared").arg(&share));
        std::fs::copy(common::RIFFLE, bin.join("riffle")).expect("copy riffle");
        let unit_file = dir.path().join("riffle-dataset.service");
        std::fs::write(&unit_file, unit(bucket, endpoint)).expect("unit");
        let env_file = dir.path().join("test.env");
        std::fs::write(
            &env_file,
            format!(
                "AWS_ACCESS_KEY_ID={}\nAWS_SECRET_ACCESS_KEY={}\n",
                std::env::var("AWS_ACCESS_KEY_ID").expect("AWS_ACCESS_KEY_ID"),
                std::env::var("AWS_SECRET_ACCESS_KEY").expect("AWS_SECRET_ACCESS_KEY"),
            ),
        )
        .expect("env file");
        let name = format!("riffle-test-systemd-{}", std::process::id());
        let _ = podman().args(["rm", "-f", &name]).output();
        let volume = |from: &Path, to: &str, opts: &str| format!("{}:{to}:{opts}", from.display());
        run(podman()
            .args([
                "run",
                "-d",
                "--name",
                &name,
                "--systemd=always",
                "--privileged",
            ])
            .args(["--network", "host"])
            .args([
                "--ulimit",
                "nofile=20000:20000",
                "--ulimit",
                "nproc=4096:4096",
            ])
            .args(["-v", &volume(&share, "/share", "rshared")])
            .args(["-v", &volume(&bin, "/opt/riffle", "ro")])
            .args([
                "-v",
                &volume(
                    &unit_file,
                    "/etc/systemd/system/riffle-dataset.service",
                    "ro",
                ),
            ])
            .args(["-v", &volume(&env_file, "/etc/riffle/test.env", "ro")])
            .arg(image)
            .arg("/sbin/init"));
        let container = SystemdContainer {
            name,
            share,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let state = container.exec_output(&["systemctl", "is-system-running"]);
            if ["running", "degraded"].contains(&state.as_str()) {
                break;
            }
            assert!(Instant::now() < deadline, "systemd did not boot: {state}");
            std::thread::sleep(Duration::from_millis(200));
        }
        container
    }

    fn exec(&self, args: &[&str]) -> String {
        run(podman().arg("exec").arg(&self.name).args(args))
    }

    fn exec_output(&self, args: &[&str]) -> String {
        let out = podman()
            .arg("exec")
            .arg(&self.name)
            .args(args)
            .output()
            .expect("podman exec");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn mnt(&self) -> PathBuf {
        self.share.join("mnt")
    }
}

impl Drop for SystemdContainer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "{}",
                self.exec_output(&["journalctl", "-u", "riffle-dataset", "--no-pager"])
            );
        }
        let _ = podman().args(["rm", "-f", &self.name]).output();
        let _ = nix::mount::umount2(&self.mnt(), nix::mount::MntFlags::MNT_DETACH);
        let _ = nix::mount::umount2(&self.share, nix::mount::MntFlags::MNT_DETACH);
    }
}

#[derive(Default)]
struct Tally {
    reads: AtomicU64,
    failed: AtomicU64,
    wrong: AtomicU64,
    passes: AtomicU64,
    longest_us: AtomicU64,
    errors: Mutex<Vec<String>>,
}

/// Waits for `passes` more passes of the readers.
fn wait_for_progress(tally: &Tally, passes: u64, what: &str) {
    let goal = tally.passes.load(Ordering::Relaxed) + passes;
    let deadline = Instant::now() + Duration::from_secs(120);
    while tally.passes.load(Ordering::Relaxed) < goal {
        assert!(
            Instant::now() < deadline,
            "{what}: no progress (errors {:?})",
            tally.errors.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the unit is active with one keeper other than `old` and one daemon.
fn wait_for_one_keeper(c: &SystemdContainer, bucket: &str, old: i32) -> (i32, i32) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (keepers, daemons) = riffle_processes(bucket);
        let active = c.exec_output(&["systemctl", "is-active", "riffle-dataset"]) == "active";
        if active && keepers.len() == 1 && keepers[0] != old && daemons.len() == 1 {
            return (keepers[0], daemons[0]);
        }
        assert!(
            Instant::now() < deadline,
            "not one keeper and one daemon: {keepers:?} {daemons:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_killed_keeper_under_systemd_costs_no_read() {
    let endpoint = need_rgw!();
    if !enabled() {
        eprintln!("SKIPPED: set RIFFLE_CONTAINER_TESTS=1 (podman, runc, mmdebstrap) to run the systemd unit test");
        return;
    }
    let image = systemd_image();
    let bucket = common::unique_bucket("systemd");
    let files: Vec<(String, Vec<u8>)> = (0..80)
        .map(|i| {
            (
                format!("train/c{}/img_{i:03}.jpg", i % 4),
                common::pattern(2_000 + i * 3_001, i as u64),
            )
        })
        .collect();
    let rt = common::runtime();
    rt.block_on(async {
        let s3 = common::client(&endpoint);
        common::create_bucket(&s3, &bucket).await;
        common::put_many(&s3, &bucket, files.clone(), 16).await;
    });
    let c = SystemdContainer::start(&image, &bucket, &endpoint);
    // Type=notify: this returns once the daemon said the mount serves.
    c.exec(&["systemctl", "start", "riffle-dataset"]);
    let (mut keeper, mut daemon) = wait_for_one_keeper(&c, &bucket, 0);
    let (files, tally, stop) = (
        Arc::new(files),
        Arc::new(Tally::default()),
        Arc::new(AtomicBool::new(false)),
    );
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (files, tally, stop, root) = (files.clone(), tally.clone(), stop.clone(), c.mnt());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for i in 0..files.len() {
                        let (key, bytes) = &files[(i * 7 + r * 13) % files.len()];
                        let started = Instant::now();
                        let read = std::fs::File::open(root.join(key)).and_then(|mut f| {
                            let mut data = Vec::new();
                            f.read_to_end(&mut data).map(|_| data)
                        });
                        tally
                            .longest_us
                            .fetch_max(started.elapsed().as_micros() as u64, Ordering::Relaxed);
                        tally.reads.fetch_add(1, Ordering::Relaxed);
                        let problem = match read {
                            Ok(data) if &data == bytes => None,
                            Ok(data) => {
                                tally.wrong.fetch_add(1, Ordering::Relaxed);
                                Some(format!("{key}: {} wrong bytes", data.len()))
                            }
                            Err(e) => {
                                tally.failed.fetch_add(1, Ordering::Relaxed);
                                Some(format!("{key}: {e}"))
                            }
                        };
                        if let Some(p) = problem {
                            tally.errors.lock().unwrap().push(p);
                        }
                    }
                    tally.passes.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    wait_for_progress(&tally, 2, "before the first kill");
    for round in 1..=3 {
        // The unit's main process, as `systemctl kill --kill-whom=main` finds it.
        c.exec(&[
            "systemctl",
            "kill",
            "--kill-whom=main",
            "--signal=SIGKILL",
            "riffle-dataset",
        ]);
        (keeper, daemon) = wait_for_one_keeper(&c, &bucket, keeper);
        wait_for_progress(&tally, 2, &format!("after keeper kill {round}"));
    }
    // A daemon kill is still the keeper's to answer.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the daemon");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (keepers, daemons) = riffle_processes(&bucket);
        if keepers == vec![keeper] && daemons.len() == 1 && daemons[0] != daemon {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no successor: {keepers:?} {daemons:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    wait_for_progress(&tally, 2, "after the daemon kill");
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().expect("reader");
    }
    let (reads, failed, wrong) = (
        tally.reads.load(Ordering::Relaxed),
        tally.failed.load(Ordering::Relaxed),
        tally.wrong.load(Ordering::Relaxed),
    );
    let journal = c.exec_output(&["journalctl", "-u", "riffle-dataset", "--no-pager"]);
    eprintln!(
        "systemd: 3 keeper SIGKILLs and 1 daemon SIGKILL, {reads} reads, {failed} failed, {wrong} wrong, longest read {} ms; the unit took the mount over from systemd's store {} times",
        tally.longest_us.load(Ordering::Relaxed) / 1000,
        journal.matches("took the mount over from systemd's fd store").count()
    );
    assert_eq!(
        (failed, wrong),
        (0, 0),
        "{:?}",
        tally.errors.lock().unwrap()
    );
    assert_eq!(
        journal
            .matches("took the mount over from systemd's fd store")
            .count(),
        3,
        "{journal}"
    );
    c.exec(&["systemctl", "stop", "riffle-dataset"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while riffle_processes(&bucket) != (vec![], vec![]) {
        assert!(Instant::now() < deadline, "riffle processes after stop");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mounts.contains(c.mnt().to_str().expect("utf-8")),
        "still mounted after systemctl stop"
    );
}
