//! Rollouts and crashes of the plugin's container never break a pod's reads.
//!
//! No cluster runs here, so the test plays kubelet and the container runtime:
//! - the **plugin container**: `riffle-csi` as PID 1 of a PID namespace of
//!   its own (`unshare --pid --fork --kill-child --mount-proc`), so killing
//!   it kills everything it started inside, as a runtime does when a
//!   container stops or crashes;
//! - the **mounter container**: `riffle-mounter`, likewise in a PID
//!   namespace of its own, where the design places the mount daemons;
//! - **Bidirectional propagation**: the test's kubelet directory is a
//!   bind mount made `rshared`, and both containers' mount namespaces copy it
//!   with propagation unchanged, as a `mountPropagation: Bidirectional`
//!   hostPath does; so the mounter's FUSE mounts appear on the "host";
//! - the **pod**: a Python reader (`pod_reader.py`) in a mount namespace of
//!   its own with private propagation (kubelet's default), started after
//!   the publish: it sees the mount as it was then and nothing later, so a
//!   remount on the host would not reach it. It holds one file open for
//!   the whole run and reads every file in a loop, checking every byte.
//!
//! The plugin's pod has a second container, `riffle fd-store`, that keeps a
//! copy of every volume's FUSE connection (each daemon's keeper gives it
//! one); the mounter runs with `--fd-store`.
//!
//! Scenarios: plugin pod rollout (a new one starts while the old one serves,
//! waiting for the sockets, then the old namespaces are killed); plugin pod
//! crash (killed, the pod reads with no plugin at all, then a new one
//! starts); volume daemon SIGKILL (its keeper starts a successor); mounter
//! rollout (a new mounter container running a different build of `riffle`
//! starts while the old one serves, then the old one's namespace is killed
//! with every keeper and daemon); mounter crash (its namespace killed, a new
//! one started). Each runs [`ROUNDS`] times with one reader; the reader must
//! report zero failed and zero wrong reads and must have made progress
//! after every restart, the pod's mount must keep its mount id (never
//! remounted); unpublish through the last plugin must then leave no mount
//! and no daemon.
//!
//! Needs what `real_mount.rs` needs (RGW, root, /dev/fuse) plus `unshare`
//! (util-linux) and python3.

#![cfg(feature = "rgw-tests")]

mod common;

use common::emulated::{
    daemons_of, fuse_stats, mount_id, read_eventually, transcript, wait_for_store_copies, Node, Pod,
};
use common::node::wait_for_mounter;
use common::rgw::{content, env, make_bucket};
use common::{kubelet_staging, staged_publish_request};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::const_new(());

/// Restarts per scenario (RIFFLE_ROLLOUT_ROUNDS overrides).
const ROUNDS: usize = 5;

fn rounds() -> usize {
    std::env::var("RIFFLE_ROLLOUT_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(ROUNDS)
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Scenario {
    /// The new plugin starts first; then the old one's namespace is killed.
    Rollout,
    /// The plugin's namespace is killed; later a new one starts.
    Crash,
    /// The volume's daemon is SIGKILLed (what an OOM kill does); its keeper starts a
    /// successor that takes the live FUSE connection over.
    DaemonKill,
    /// A new mounter container, running a different build of `riffle` (a copy of the
    /// binary under another name), starts while the old one serves; then the old one's
    /// namespace is killed with every keeper and daemon in it. The plugin has the new
    /// mounter's daemons take the live mounts over from the fd store.
    MounterRollout,
    /// The mounter's namespace is killed (a crash, or an OOM kill of the container: with
    /// memory.oom.group every process of it dies) and a new one starts a moment later.
    MounterCrash,
}

impl Scenario {
    fn kills_the_mounter(self) -> bool {
        matches!(self, Scenario::MounterRollout | Scenario::MounterCrash)
    }
}

/// The keeper (the riffle process of `target` whose parent is not one) and its daemon.
fn keeper_and_daemon(target: &Path) -> (i32, i32) {
    let pids = daemons_of(target);
    let parent = |pid: i32| -> i32 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        stat.rfind(')')
            .and_then(|i| stat[i + 2..].split(' ').nth(1)?.parse().ok())
            .unwrap_or(0)
    };
    let keeper = *pids
        .iter()
        .find(|&&p| !pids.contains(&parent(p)))
        .expect("a keeper");
    let daemon = pids
        .iter()
        .copied()
        .find(|&p| parent(p) == keeper)
        .unwrap_or(0);
    (keeper, daemon)
}

async fn restarts_leave_reads_alone(scenario: Scenario) {
    let _serial = SERIAL.lock().await;
    let env = env();
    let bucket = make_bucket(&env, 4).await;
    let (mut node, mut csi) = Node::start_all(&env).await;
    let target = node.target("trainer-0");
    let started = Instant::now();
    node.publish(&mut csi, "vol-train", &target, &bucket).await;
    transcript(format!(
        "{scenario:?}: NodePublishVolume through riffle-mounter took {:?}",
        started.elapsed()
    ));
    let mut daemons = daemons_of(&target);
    assert_eq!(
        daemons.len(),
        2,
        "riffle's keeper and its daemon serve the target: {daemons:?}"
    );
    // A second pod's volume, to show unpublish stops exactly its own daemon.
    let other = node.target("evaluator-0");
    node.publish(&mut csi, "vol-eval", &other, &bucket).await;

    let mut files: Vec<(String, Vec<u8>)> = (0..4)
        .map(|i| (format!("shard-{i}/data.txt"), content(i).into_bytes()))
        .collect();
    files.push(("shard-0/nested/deep.bin".to_string(), vec![7u8; 300_000]));
    let mut pod = Pod::start(&node, "pod", &target, &files);
    pod.wait_passes(3).await;
    let first_mount = mount_id(&target).expect("the target is a mount");
    // A different build for the mounter rollout: the same program under another name (the
    // daemons that take the mounts over run it; an upgrade of the image does the same).
    let next_build = node.path("riffle-next-build");
    std::fs::copy(&env.riffle, &next_build).expect("copy the riffle binary");

    for round in 1..=rounds() {
        if scenario.kills_the_mounter() {
            // Every keeper has given the fd store its copy (the store itself restarts in
            // the plugin scenarios, and keepers give it again).
            wait_for_store_copies(&node, &[&target, &other]).await;
        }
        let old = node.plugin.take().expect("a plugin runs");
        match scenario {
            Scenario::Rollout => {
                let new = node.start_plugin();
                let new_store = node.start_fd_store();
                // The new plugin pod waits for the sockets while the old serves;
                // the pod reads throughout.
                pod.wait_passes(2).await;
                old.kill();
                node.fd_store.take().expect("an fd store runs").kill();
                node.plugin = Some(new);
                node.fd_store = Some(new_store);
            }
            Scenario::Crash => {
                old.kill();
                node.fd_store.take().expect("an fd store runs").kill();
                // No plugin at all: the pod must still read.
                pod.wait_passes(3).await;
                node.plugin = Some(node.start_plugin());
                node.fd_store = Some(node.start_fd_store());
            }
            Scenario::MounterRollout | Scenario::MounterCrash => {
                node.plugin = Some(old);
                let riffle = if scenario == Scenario::MounterRollout && round % 2 == 1 {
                    next_build.clone()
                } else {
                    env.riffle.clone()
                };
                let before = daemons_of(&target);
                let old_mounter = node.mounter.take().expect("a mounter runs");
                if scenario == Scenario::MounterRollout {
                    let new = node.start_mounter_container(&riffle);
                    pod.wait_passes(1).await;
                    old_mounter.kill();
                    node.mounter = Some(new);
                } else {
                    old_mounter.kill();
                    // The runtime restarts the container after a moment; reads wait on
                    // the connections the fd store keeps (nothing to assert about time).
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    node.mounter = Some(node.start_mounter_container(&riffle));
                }
                wait_for_mounter(&node.mounter_socket()).await;
                let deadline = Instant::now() + Duration::from_secs(120);
                // A daemon under a keeper has the keeper's socket in its environment.
                let is_daemon = |pid: &i32| {
                    std::fs::read(format!("/proc/{pid}/environ"))
                        .unwrap_or_default()
                        .split(|b| *b == 0)
                        .any(|var| var.starts_with(b"RIFFLE_KEEPER_FD="))
                };
                loop {
                    // Done when the new keeper and its daemon are all that runs for the
                    // target (`riffle mount` itself has exited).
                    let now = daemons_of(&target);
                    if now.len() == 2
                        && now.iter().all(|p| !before.contains(p))
                        && now.iter().any(is_daemon)
                    {
                        break;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "round {round}: no new keeper and daemon took the mount over: {now:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                daemons = daemons_of(&target);
                let exe = std::fs::read_link(format!("/proc/{}/exe", keeper_and_daemon(&target).1))
                    .expect("the new daemon's program");
                assert_eq!(
                    exe,
                    std::fs::canonicalize(&riffle).expect("the riffle binary"),
                    "round {round}: the daemon runs the mounter's build"
                );
            }
            Scenario::DaemonKill => {
                node.plugin = Some(old);
                let (keeper, daemon) = keeper_and_daemon(&target);
                kill(Pid::from_raw(daemon), Signal::SIGKILL).expect("kill the daemon");
                let deadline = Instant::now() + Duration::from_secs(60);
                while [0, daemon].contains(&keeper_and_daemon(&target).1) {
                    assert!(Instant::now() < deadline, "no successor daemon");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                assert_eq!(keeper_and_daemon(&target).0, keeper, "the same keeper");
                daemons = daemons_of(&target);
            }
        }
        csi = node.connect().await;
        pod.wait_passes(3).await;
        assert_eq!(
            daemons_of(&target),
            daemons,
            "round {round}: the same processes serve (adopted, not remounted)"
        );
        assert_eq!(
            mount_id(&target),
            Some(first_mount),
            "round {round}: the pod's mount is the one it started with (never remounted)"
        );
        let what = match scenario {
            Scenario::DaemonKill => "volume daemon SIGKILLed, successor serving",
            Scenario::MounterRollout => {
                "new mounter container started, old one killed; its daemons' mounts taken over"
            }
            Scenario::MounterCrash => {
                "mounter container killed and started again; its daemons' mounts taken over"
            }
            _ => "plugin pod killed, new plugin ready",
        };
        let opens = fuse_stats(&env, &target);
        if scenario.kills_the_mounter() {
            // Passthrough again from the new daemon: new opens of files whose cache
            // entry is complete get their backing file from it.
            assert!(opens["passthrough"] == "enabled", "round {round}: {opens}");
        }
        transcript(format!(
            "{scenario:?} round {round}: {what}, pod read on ({} passes so far); this daemon: {} of {} opens through passthrough",
            pod.passes(),
            opens["passthrough_opens"],
            opens["opens"]
        ));
    }
    // The last plugin knows the volume: publishing again is a no-op.
    node.publish(&mut csi, "vol-train", &target, &bucket).await;
    pod.finish().check(&format!("{scenario:?}"), rounds());

    // The daemon kept FUSE passthrough in the mounter's container.
    let fuse = fuse_stats(&env, &target);
    transcript(format!(
        "{scenario:?}: riffle stats: passthrough {}, {} of {} opens through passthrough",
        fuse["passthrough"], fuse["passthrough_opens"], fuse["opens"]
    ));
    assert_eq!(fuse["passthrough"], "enabled", "{fuse}");
    assert!(fuse["passthrough_opens"].as_u64() > Some(0), "{fuse}");

    csi.unpublish("vol-train", &target)
        .await
        .expect("unpublish");
    assert!(!target.exists(), "target removed");
    assert!(
        riffle_csi::node_state::mountinfo::mount_at(&target)
            .expect("mountinfo")
            .is_none(),
        "nothing mounted at the target"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !daemons_of(&target).is_empty() {
        assert!(Instant::now() < deadline, "the daemon outlived unpublish");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let left = daemons_of(&other);
    assert_eq!(
        left.len(),
        2,
        "the other volume's keeper and daemon run on: {left:?}"
    );
    assert_eq!(
        std::fs::read_to_string(other.join("shard-1/data.txt")).expect("the other volume reads"),
        content(1)
    );
    csi.unpublish("vol-eval", &other)
        .await
        .expect("unpublish the second volume");
    assert!(!other.exists() && daemons_of(&other).is_empty());
    transcript(format!(
        "{scenario:?}: NodeUnpublishVolume through the last plugin: target removed, its daemon exited, the other volume's daemon untouched until its own unpublish"
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_rollout_leaves_reads_alone() {
    restarts_leave_reads_alone(Scenario::Rollout).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_crash_leaves_reads_alone() {
    restarts_leave_reads_alone(Scenario::Crash).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_sigkill_leaves_reads_alone() {
    restarts_leave_reads_alone(Scenario::DaemonKill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mounter_rollout_to_a_new_build_leaves_reads_alone() {
    restarts_leave_reads_alone(Scenario::MounterRollout).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mounter_crash_leaves_reads_alone() {
    restarts_leave_reads_alone(Scenario::MounterCrash).await;
}

/// What the design does not protect against, and how it ends: the mounter
/// container and the fd store die together (both pods restarted at once, as
/// in a node reboot). The daemons die with the mounter and nothing holds
/// their connections: the mount on the node answers ENOTCONN; the plugin
/// reports the mounter unreachable, and once a new mounter answers, its
/// supervisor finds nothing to take over and remounts the volume on the node
/// (reaching pods with HostToContainer propagation and new pods). Then a
/// node reboot (everything but the state directory gone), and last a
/// mounter deleted for good, with which unpublish still ends in a clean
/// node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mounter_restart_is_reported_and_repaired() {
    let _serial = SERIAL.lock().await;
    let env = env();
    let bucket = make_bucket(&env, 1).await;
    let (mut node, mut csi) = Node::start_all(&env).await;
    let target = node.target("trainer-0");
    node.publish(&mut csi, "vol-train", &target, &bucket).await;
    let file = target.join("shard-0/data.txt");
    read_eventually(&file, &content(0), Duration::ZERO).await;
    let before = daemons_of(&target);
    assert_eq!(before.len(), 2, "riffle's keeper and daemon: {before:?}");

    node.fd_store.take().expect("fd store").kill();
    node.mounter.take().expect("mounter").kill();
    // statfs always reaches the daemon; stat may come from the attr cache.
    // The first call after the connection ended may get ECONNABORTED, the
    // ones after ENOTCONN.
    // The kernel ends the connection as the namespace's last process dies.
    let deadline = Instant::now() + Duration::from_secs(10);
    let err = loop {
        match nix::sys::statfs::statfs(&target) {
            Err(e) => break e,
            Ok(_) => assert!(
                Instant::now() < deadline,
                "the daemon outlived its container"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        [nix::errno::Errno::ENOTCONN, nix::errno::Errno::ECONNABORTED].contains(&err),
        "{err}"
    );
    transcript(format!(
        "fd store and mounter container killed together: the daemon died, statfs on the target gives {err}"
    ));
    // The plugin says why it cannot repair it yet.
    let log = node.path("plugin-1.log");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("riffle-mounter is not reachable")
    {
        assert!(
            Instant::now() < deadline,
            "the plugin never reported the mounter unreachable"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    node.start_mounter().await;
    read_eventually(&file, &content(0), Duration::from_secs(90)).await;
    let after = daemons_of(&target);
    assert_eq!(after.len(), 2, "riffle's keeper and daemon: {after:?}");
    assert_ne!(after, before, "a new daemon serves the target");
    transcript(
        "new mounter container: the plugin's supervisor remounted the target; readable again",
    );

    // A node reboot: both containers and every mount are gone; the records
    // and secrets in the state directory (a hostPath) are not.
    node.plugin.take().expect("plugin").kill();
    node.mounter.take().expect("mounter").kill();
    nix::mount::umount2(&target, nix::mount::MntFlags::MNT_DETACH).expect("detach");
    assert!(riffle_csi::node_state::mountinfo::mount_at(&target)
        .expect("mountinfo")
        .is_none());
    node.start_mounter().await;
    node.plugin = Some(node.start_plugin());
    csi = node.connect().await;
    // Start-up reconciliation remounted it before the plugin reported ready.
    read_eventually(&file, &content(0), Duration::ZERO).await;
    // kubelet retries the publish for the pod still on the node: a no-op.
    node.publish(&mut csi, "vol-train", &target, &bucket).await;
    assert_eq!(daemons_of(&target).len(), 2);
    transcript("node reboot: the new plugin remounted the recorded volume at start; kubelet's repeated publish is OK");

    // The mounter is deleted for good (its DaemonSet removed): the pod must
    // still be able to terminate, so unpublish works without it.
    node.mounter.take().expect("mounter").kill();
    csi.unpublish("vol-train", &target)
        .await
        .expect("unpublish without a mounter");
    assert!(!target.exists(), "target removed");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !daemons_of(&target).is_empty() {
        assert!(Instant::now() < deadline, "the daemon outlived unpublish");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let left: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter(|l| l.contains(" fuse.riffle ") && l.contains(&*node.dir.path().to_string_lossy()))
        .map(str::to_string)
        .collect();
    assert!(left.is_empty(), "stale mounts: {left:?}");
    transcript(
        "mounter deleted, then unpublish: target removed, no daemon, no stale mount on the node",
    );
}

/// A staged volume (one daemon for the node's pods, bound into each) through mounter
/// rollouts: the new mounter's daemon takes the shared mount over, so the pods' binds, on
/// the same FUSE connection, never change and their reads never fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mounter_rollout_leaves_a_staged_volumes_pods_reading() {
    let _serial = SERIAL.lock().await;
    let env = env();
    let bucket = make_bucket(&env, 4).await;
    let (mut node, mut csi) = Node::start_all(&env).await;
    let staging = kubelet_staging(&node.path("kubelet"), "vol-shared");
    csi.stage("vol-shared", &staging, node.attributes(&bucket))
        .await
        .expect("stage");
    let pods = [node.target("trainer-0"), node.target("trainer-1")];
    for target in &pods {
        csi.publish(staged_publish_request(
            "vol-shared",
            &staging,
            target,
            node.attributes(&bucket),
            node.secrets(),
        ))
        .await
        .expect("staged publish");
    }
    let shared = std::fs::read_dir(&staging)
        .expect("staging")
        .flatten()
        .map(|e| e.path())
        .next()
        .expect("the shared mount");
    assert_eq!(daemons_of(&shared).len(), 2, "one keeper and its daemon");
    let mut files: Vec<(String, Vec<u8>)> = (0..4)
        .map(|i| (format!("shard-{i}/data.txt"), content(i).into_bytes()))
        .collect();
    files.push(("shard-0/nested/deep.bin".to_string(), vec![7u8; 300_000]));
    let mut pod = Pod::start(&node, "pod", &pods[0], &files);
    pod.wait_passes(3).await;
    let mounts: Vec<Option<u64>> = pods.iter().map(|t| mount_id(t)).collect();
    for round in 1..=rounds() {
        wait_for_store_copies(&node, &[&shared]).await;
        let before = daemons_of(&shared);
        let old = node.mounter.take().expect("a mounter runs");
        let riffle = env.riffle.clone();
        let new = node.start_mounter_container(&riffle);
        pod.wait_passes(1).await;
        old.kill();
        node.mounter = Some(new);
        wait_for_mounter(&node.mounter_socket()).await;
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let now = daemons_of(&shared);
            if now.len() == 2 && now.iter().all(|p| !before.contains(p)) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: no new daemon took the shared mount over: {now:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        pod.wait_passes(2).await;
        let now: Vec<Option<u64>> = pods.iter().map(|t| mount_id(t)).collect();
        assert_eq!(
            now, mounts,
            "round {round}: the pods' binds are the ones they had"
        );
        transcript(format!(
            "staged volume, mounter rollout round {round}: the shared mount was taken over; both pods' binds unchanged, the pod read on ({} passes)",
            pod.passes()
        ));
    }
    pod.finish().check("staged volume", rounds());
    assert_eq!(
        std::fs::read_to_string(pods[1].join("shard-2/data.txt")).expect("the other pod reads"),
        content(2)
    );
    for target in &pods {
        csi.unpublish("vol-shared", target)
            .await
            .expect("unpublish");
    }
    csi.unstage("vol-shared", &staging).await.expect("unstage");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !daemons_of(&shared).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the shared daemon outlived unstage"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
