//! The node's processes as the end-to-end tests start them: the plugin and
//! the mounter with the arguments a DaemonSet gives them, their logs, and
//! cleaning up what they leave.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A command for a node process: no credentials of the node's own (only a
/// volume's secret may work), debug logs appended to `log`.
pub fn node_process(program: impl AsRef<OsStr>, log: &Path) -> Command {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("open the process log");
    let mut cmd = Command::new(program);
    cmd.env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_SESSION_TOKEN")
        .env("RUST_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("clone the log"))
        .stderr(log);
    cmd
}

/// `riffle-mounter`'s arguments. The test machine has one disk: the cache is allowed on it
/// (`root_disk_cache_is_refused` in real_mount.rs drops the flag).
pub fn mounter_args(socket: &Path, cache_dir: &Path, riffle: &Path) -> Vec<String> {
    vec![
        format!("--socket={}", socket.display()),
        format!("--cache-dir={}", cache_dir.display()),
        format!("--riffle-bin={}", riffle.display()),
        "--mount-timeout=60".to_string(),
        riffle_csi::node_state::cache_disk::ALLOW_FLAG.to_string(),
    ]
}

/// Where the plugin of `state_dir` keeps volume secrets: `secrets` beside
/// it. The test directories are on disk, so the plugin mounts a tmpfs there
/// (as it does on a node whose /run is not one); the tests' cleanup detaches
/// it with the rest.
pub fn secrets_dir(state_dir: &Path) -> PathBuf {
    state_dir.with_file_name("secrets")
}

/// `riffle-csi`'s arguments (supervisor checks every second).
pub fn plugin_args(csi_socket: &Path, state_dir: &Path, mounter_socket: &Path) -> Vec<String> {
    vec![
        format!("--endpoint=unix://{}", csi_socket.display()),
        "--node-id=test-node".to_string(),
        format!("--state-dir={}", state_dir.display()),
        format!("--secrets-dir={}", secrets_dir(state_dir).display()),
        format!("--mounter-socket={}", mounter_socket.display()),
        "--check-interval=1".to_string(),
        "--mount-timeout=60".to_string(),
    ]
}

/// Waits until the mounter at `socket` answers.
pub async fn wait_for_mounter(socket: &Path) {
    let remote = riffle_csi::remote::client::RemoteMounter::new(
        socket.to_path_buf(),
        Duration::from_secs(60),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while let Err(e) = remote.ping().await {
        assert!(
            Instant::now() < deadline,
            "riffle-mounter never answered: {e}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Prints the last `lines` lines of each file (what the processes said
/// before a test failed).
pub fn print_tails(files: &[PathBuf], lines: usize) {
    for f in files {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        eprintln!("---- last lines of {}", f.display());
        for l in &all[all.len().saturating_sub(lines)..] {
            eprintln!("{l}");
        }
    }
}

/// Lazily detaches every mount below `root`, innermost first.
pub fn detach_mounts_under(root: &Path) {
    let root = root.to_string_lossy().into_owned();
    if let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") {
        let mut points: Vec<&str> = text
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|p| p.starts_with(&root))
            .collect();
        points.reverse();
        for p in points {
            let _ = nix::mount::umount2(p, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// Binds `path` on itself and makes it `rshared`, as a node's `/` is under systemd: mounts
/// below it then propagate to and from containers' Bidirectional and HostToContainer mounts.
pub fn bind_shared(path: &Path) {
    nix::mount::mount(
        Some(path),
        path,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND | nix::mount::MsFlags::MS_REC,
        None::<&str>,
    )
    .expect("bind a shared dir");
    nix::mount::mount(
        None::<&str>,
        path,
        None::<&str>,
        nix::mount::MsFlags::MS_SHARED | nix::mount::MsFlags::MS_REC,
        None::<&str>,
    )
    .expect("make it rshared");
}
