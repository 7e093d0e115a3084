//! Node chaos: whichever riffle process of the node is SIGKILLed, whenever, no read fails
//! and exactly one daemon serves each volume afterwards.
//!
//! The node is played as in `rollout.rs` (containers as PID namespaces, pods as Python readers
//! in private mount namespaces, kubelet as a CSI client): a **staged** volume, one daemon
//! bound into two pods, and an **unstaged** one read by a third pod. Every pod holds one file
//! open for the whole run and reads every file in a loop, checking every byte. The five kinds
//! of process that can die on a node:
//! - the **plugin** container (`riffle-csi`), killed and started again;
//! - the **mounter** container (`riffle-mounter` with every keeper and daemon), likewise;
//! - the **fd store** container (`riffle fd-store`), likewise;
//! - a volume's **keeper** (`riffle-keeper`), SIGKILLed alone: its daemon gets a new keeper;
//! - a volume's **daemon**, SIGKILLed alone: its keeper starts a successor.
//!
//! One test per kind kills that kind [`rounds`] times (the volume alternating), waiting after
//! each kill until every pod has read on and each volume has exactly one keeper and one
//! daemon again. The chaos test draws [`kills`] kills from all five kinds and both volumes with
//! a seeded generator (`RIFFLE_CHAOS_SEED`; the seed is printed), and a third of the time
//! kills again at once, without waiting for the node to recover (two deaths in quick
//! succession). What no design survives is left out: the fd store and the mounter both down
//! at once holds no copy of a connection anywhere (a node reboot, `rollout.rs`'s
//! `a_mounter_restart_is_reported_and_repaired`), so a container kill that would make both
//! down waits until the other holder is back; likewise a keeper's or daemon's kill waits
//! while neither the store nor the volume's other process holds its connection (right after
//! the store restarts, before its keepers have given it their copies: a keeper and daemon
//! killed together then would leave the connection with no holder at all, seen as
//! `ECONNABORTED` then `ENOTCONN` in the pods).
//!
//! Each test asserts 0 failed and 0 wrong reads, progress after every kill, one keeper and one
//! daemon per volume at the end, the held files still reading, and unpublish + unstage leaving
//! no mount, no riffle process and no zombie; it prints its row of the restart table in
//! `docs/kubernetes/daemons.md` (kills, reads, failed, wrong, longest read, daemons per volume).
//!
//! Needs what `rollout.rs` needs (RGW, root, /dev/fuse, unshare, python3).

#![cfg(feature = "rgw-tests")]

mod common;

use common::emulated::{transcript, Node, Pod, ReaderResult};
use common::rgw::{content, env, make_bucket};
use common::{kubelet_staging, staged_publish_request, Csi};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::const_new(());

/// Kills per kind in the one-kind tests (RIFFLE_CHAOS_ROUNDS overrides).
fn rounds() -> usize {
    env_number("RIFFLE_CHAOS_ROUNDS", 4)
}

/// Kills in the chaos test (RIFFLE_CHAOS_KILLS overrides).
fn kills() -> usize {
    env_number("RIFFLE_CHAOS_KILLS", 24)
}

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Plugin,
    Mounter,
    FdStore,
    Keeper,
    Daemon,
}

const KINDS: [Kind; 5] = [
    Kind::Plugin,
    Kind::Mounter,
    Kind::FdStore,
    Kind::Keeper,
    Kind::Daemon,
];

/// A seeded generator (splitmix64): the same seed draws the same kills.
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The live riffle processes serving the mount at `mountpoint`: keepers (named
/// `riffle-keeper`) and daemons (the other `--foreground` ones; `riffle mount` itself, which
/// waits for the mount, has no `--foreground`).
#[derive(Debug, Default)]
struct Roles {
    keepers: Vec<i32>,
    daemons: Vec<i32>,
}

fn roles(mountpoint: &Path) -> Roles {
    let needle = mountpoint.to_string_lossy().into_owned();
    let mut roles = Roles::default();
    for (pid, stat, argv) in processes() {
        if stat.contains(") Z ") || !argv.iter().any(|a| a == &needle) {
            continue;
        }
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() == "riffle-keeper" {
            roles.keepers.push(pid);
        } else if argv.iter().any(|a| a == "--foreground") {
            roles.daemons.push(pid);
        }
    }
    roles
}

/// Every process: pid, `/proc/PID/stat`, arguments.
fn processes() -> Vec<(i32, String, Vec<String>)> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let argv: Vec<String> = std::fs::read(entry.path().join("cmdline"))
            .unwrap_or_default()
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        all.push((pid, stat, argv));
    }
    all
}

/// Zombies whose process was a riffle one (the name in `stat`).
fn riffle_zombies() -> Vec<i32> {
    processes()
        .into_iter()
        .filter(|(_, stat, _)| stat.contains(") Z ") && stat.contains("(riffle"))
        .map(|(pid, _, _)| pid)
        .collect()
}

/// The `/dev/fuse` descriptors process `pid` holds.
fn fuse_fd_numbers(pid: i32) -> Vec<i32> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.flatten()
                .filter(|fd| {
                    // `/dev/fuse`; `/fuse` from a process whose /dev is another mount.
                    std::fs::read_link(fd.path())
                        .is_ok_and(|l| l.file_name() == Some(std::ffi::OsStr::new("fuse")))
                })
                .filter_map(|fd| fd.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// How many `/dev/fuse` descriptors process `pid` holds.
fn fuse_fds(pid: i32) -> usize {
    fuse_fd_numbers(pid).len()
}

/// Whether descriptor `a` of process `pa` and `b` of `pb` are the same open file (`kcmp`):
/// copies of one descriptor are, the clones of a connection's `/dev/fuse` are not.
fn same_file(pa: i32, a: i32, pb: i32, b: i32) -> bool {
    const KCMP_FILE: libc::c_long = 0;
    // SAFETY: kcmp only compares kernel objects of two processes; nothing is written.
    unsafe { libc::syscall(libc::SYS_kcmp, pa, pb, KCMP_FILE, a, b) == 0 }
}

/// Whether process `holder` holds every `/dev/fuse` file process `of` holds (each volume's
/// bundle carries its connection's clones of `/dev/fuse`, one per FUSE thread, and a copy of
/// the connection is whole only with all of them).
fn holds_every_fuse_file_of(holder: i32, of: i32) -> bool {
    let held = fuse_fd_numbers(holder);
    let wanted = fuse_fd_numbers(of);
    !wanted.is_empty()
        && wanted
            .iter()
            .all(|&w| held.iter().any(|&h| same_file(holder, h, of, w)))
}

fn fd_links(pid: i32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.flatten()
                .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                .map(|l| l.display().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// The node with its three pods and two volumes.
struct Cluster {
    node: Node,
    csi: Csi,
    staging: PathBuf,
    /// The staged volume's shared mount and the unstaged volume's target: what the daemons
    /// serve.
    mounts: [PathBuf; 2],
    /// The pods' targets: two binds of the staged volume, the unstaged volume.
    targets: [PathBuf; 3],
    pods: Vec<Pod>,
    kills: Vec<(Kind, usize)>,
}

impl Cluster {
    async fn start(env: &common::rgw::Env) -> Cluster {
        let bucket = make_bucket(env, 4).await;
        let (node, mut csi) = Node::start_all(env).await;
        let staging = kubelet_staging(&node.path("kubelet"), "vol-shared");
        csi.stage("vol-shared", &staging, node.attributes(&bucket))
            .await
            .expect("stage");
        let targets = [
            node.target("trainer-0"),
            node.target("trainer-1"),
            node.target("evaluator-0"),
        ];
        for target in &targets[..2] {
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
        node.publish(&mut csi, "vol-solo", &targets[2], &bucket)
            .await;
        let shared = std::fs::read_dir(&staging)
            .expect("staging")
            .flatten()
            .map(|e| e.path())
            .next()
            .expect("the shared mount");
        let mounts = [shared, targets[2].clone()];
        let mut files: Vec<(String, Vec<u8>)> = (0..4)
            .map(|i| (format!("shard-{i}/data.txt"), content(i).into_bytes()))
            .collect();
        files.push(("shard-0/nested/deep.bin".to_string(), vec![7u8; 300_000]));
        let pods = targets
            .iter()
            .enumerate()
            .map(|(i, t)| Pod::start(&node, &format!("pod-{i}"), t, &files))
            .collect();
        let mut cluster = Cluster {
            node,
            csi,
            staging,
            mounts,
            targets,
            pods,
            kills: Vec::new(),
        };
        cluster.settled("start").await;
        cluster
    }

    /// Waits until every pod read on (two passes) and each volume has exactly one keeper and
    /// one daemon.
    async fn settled(&mut self, after: &str) {
        for pod in &mut self.pods {
            pod.wait_passes(2).await;
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let now: Vec<Roles> = self.mounts.iter().map(|m| roles(m)).collect();
            if now
                .iter()
                .all(|r| r.keepers.len() == 1 && r.daemons.len() == 1)
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "after {after}: not one keeper and one daemon per volume: {now:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether a copy of every volume's connection is held outside the mounter's container
    /// (by the fd store: every `/dev/fuse` file of each volume's keeper), and inside it (by
    /// each volume's keeper).
    fn store_holds_all(&self) -> bool {
        self.node.fd_store.as_ref().is_some_and(|store| {
            self.mounts.iter().all(|m| {
                let r = roles(m);
                r.keepers.len() == 1 && holds_every_fuse_file_of(store.init, r.keepers[0])
            })
        })
    }

    /// Whether the connection of `volume` keeps a holder when its `kind` (a keeper or a
    /// daemon) dies now: the fd store (every `/dev/fuse` file of the volume's keeper, or of
    /// its daemon while it has none), or the volume's other process.
    fn survives_kill_of(&self, kind: Kind, volume: usize) -> bool {
        let r = roles(&self.mounts[volume]);
        let in_store = self.node.fd_store.as_ref().is_some_and(|store| {
            r.keepers
                .first()
                .or(r.daemons.first())
                .is_some_and(|&of| holds_every_fuse_file_of(store.init, of))
        });
        let other = match kind {
            Kind::Keeper => &r.daemons,
            _ => &r.keepers,
        };
        in_store || other.iter().any(|&pid| fuse_fds(pid) > 0)
    }

    fn keepers_hold_all(&self) -> bool {
        self.mounts.iter().all(|m| {
            let r = roles(m);
            r.keepers.len() == 1 && fuse_fds(r.keepers[0]) > 0
        })
    }

    /// Waits until `holds` says a volume's other holder is there, so that the kill to come
    /// does not leave a connection without any.
    async fn wait_until(&self, what: &str, holds: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !holds(self) {
            assert!(
                Instant::now() < deadline,
                "{what} never held every connection: store fds {:?}, mounts {:?}",
                self.node
                    .fd_store
                    .as_ref()
                    .map(|s| (s.init, fd_links(s.init))),
                self.mounts
                    .iter()
                    .map(|m| roles(m))
                    .map(|r| (
                        r.keepers
                            .iter()
                            .map(|k| (*k, fd_links(*k)))
                            .collect::<Vec<_>>(),
                        r.daemons
                    ))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILLs a process of `kind` (for keepers and daemons, of `volume`'s mount) and, for a
    /// container, starts it again as the runtime would.
    async fn kill(&mut self, kind: Kind, volume: usize) {
        let mount = self.mounts[volume].clone();
        match kind {
            Kind::Plugin => {
                self.node.plugin.take().expect("a plugin").kill();
                self.node.plugin = Some(self.node.start_plugin());
            }
            Kind::Mounter => {
                self.wait_until("the fd store", Cluster::store_holds_all)
                    .await;
                self.node.mounter.take().expect("a mounter").kill();
                self.node.start_mounter().await;
            }
            Kind::FdStore => {
                self.wait_until("the keepers", Cluster::keepers_hold_all)
                    .await;
                self.node.fd_store.take().expect("an fd store").kill();
                self.node.fd_store = Some(self.node.start_fd_store());
            }
            Kind::Keeper | Kind::Daemon => {
                self.wait_until("another holder of the volume", |c| {
                    c.survives_kill_of(kind, volume)
                })
                .await;
                let deadline = Instant::now() + Duration::from_secs(60);
                let pid = loop {
                    let r = roles(&mount);
                    let pick = if kind == Kind::Keeper {
                        r.keepers.first()
                    } else {
                        r.daemons.first()
                    };
                    if let Some(pid) = pick {
                        break *pid;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "no {kind:?} of {} to kill",
                        mount.display()
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                };
                nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                )
                .expect("SIGKILL");
            }
        }
        self.kills.push((kind, volume));
    }

    /// Stops the pods, checks their reads and the node, unpublishes and unstages, and
    /// checks that nothing is left; prints the table row as `what`.
    async fn finish(mut self, what: &str) {
        for pod in &mut self.pods {
            pod.wait_passes(1).await;
        }
        // A take-over the supervisor started since the last kill settled (its keeper refused
        // by the store's lease, or on its way out) may be in progress: the counts below are
        // of the node once it has settled again (bounded, as after every kill).
        self.settled("the last pass").await;
        let daemons: Vec<usize> = self.mounts.iter().map(|m| roles(m).daemons.len()).collect();
        let keepers: Vec<usize> = self.mounts.iter().map(|m| roles(m).keepers.len()).collect();
        let results: Vec<ReaderResult> = self.pods.drain(..).map(Pod::finish).collect();
        let reads: u64 = results.iter().map(|r| r.reads).sum();
        let failed: u64 = results.iter().map(|r| r.failed).sum();
        let wrong: u64 = results.iter().map(|r| r.wrong).sum();
        let longest = results.iter().map(|r| r.longest_ms).fold(0.0, f64::max);
        let by_kind: Vec<String> = KINDS
            .iter()
            .map(|k| {
                let n = self.kills.iter().filter(|(kind, _)| kind == k).count();
                format!("{k:?} {n}")
            })
            .collect();
        transcript(format!(
            "| {what} | {} ({}) | {reads} | {failed} | {wrong} | {longest} ms | {} (keepers {}) |",
            self.kills.len(),
            by_kind.join(", "),
            daemons
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(" / "),
            keepers
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(" / "),
        ));
        for (i, r) in results.iter().enumerate() {
            assert_eq!((r.failed, r.wrong), (0, 0), "pod {i}: {:?}", r.errors);
            assert!(r.reads > 0, "pod {i} read");
        }
        assert_eq!(daemons, vec![1, 1], "one daemon per volume");
        assert_eq!(keepers, vec![1, 1], "one keeper per volume");
        // The last plugin knows every volume: unpublish and unstage leave nothing.
        self.csi = self.node.connect().await;
        for target in &self.targets[..2] {
            self.csi
                .unpublish("vol-shared", target)
                .await
                .expect("unpublish");
        }
        self.csi
            .unpublish("vol-solo", &self.targets[2])
            .await
            .expect("unpublish");
        self.csi
            .unstage("vol-shared", &self.staging)
            .await
            .expect("unstage");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left: Vec<Roles> = self.mounts.iter().map(|m| roles(m)).collect();
            let zombies = riffle_zombies();
            if left
                .iter()
                .all(|r| r.keepers.is_empty() && r.daemons.is_empty())
                && zombies.is_empty()
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "left after unpublish and unstage: {left:?}, zombies {zombies:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for path in self.mounts.iter().chain(&self.targets) {
            assert!(
                riffle_csi::node_state::mountinfo::mount_at(path)
                    .expect("mountinfo")
                    .is_none(),
                "{} still mounted",
                path.display()
            );
        }
    }
}

/// Kills of one kind only, `rounds()` times, the volume alternating.
async fn kills_of_one_kind_cost_no_read(kind: Kind) {
    let _serial = SERIAL.lock().await;
    let env = env();
    let mut cluster = Cluster::start(&env).await;
    for round in 0..rounds() {
        cluster.kill(kind, round % 2).await;
        cluster
            .settled(&format!("{kind:?} kill {}", round + 1))
            .await;
    }
    cluster.finish(&format!("{kind:?}")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_kills_cost_no_read() {
    kills_of_one_kind_cost_no_read(Kind::Plugin).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mounter_kills_cost_no_read() {
    kills_of_one_kind_cost_no_read(Kind::Mounter).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fd_store_kills_cost_no_read() {
    kills_of_one_kind_cost_no_read(Kind::FdStore).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keeper_kills_cost_no_read() {
    kills_of_one_kind_cost_no_read(Kind::Keeper).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_kills_cost_no_read() {
    kills_of_one_kind_cost_no_read(Kind::Daemon).await;
}

/// Random kills of every kind, a third of them right after the one before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_kills_of_every_kind_cost_no_read() {
    let _serial = SERIAL.lock().await;
    let env = env();
    let seed = std::env::var("RIFFLE_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    transcript(format!(
        "chaos seed {seed} (RIFFLE_CHAOS_SEED={seed} repeats this run)"
    ));
    let mut draw = Draw(seed);
    let mut cluster = Cluster::start(&env).await;
    for n in 1..=kills() {
        let (kind, volume) = (KINDS[draw.below(KINDS.len())], draw.below(2));
        let at_once = draw.below(3) == 0;
        transcript(format!(
            "kill {n}: {kind:?} (volume {volume}){}",
            if at_once {
                ", right after the last"
            } else {
                ""
            }
        ));
        cluster.kill(kind, volume).await;
        if !at_once {
            cluster.settled(&format!("kill {n} ({kind:?})")).await;
            tokio::time::sleep(Duration::from_millis(draw.below(1500) as u64)).await;
        }
    }
    cluster.settled("the last kill").await;
    cluster.finish(&format!("chaos, seed {seed}")).await;
}
