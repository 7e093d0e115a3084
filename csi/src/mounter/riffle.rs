//! The real [`Mounter`]: runs `riffle mount` / `riffle unmount`.
//!
//! Mount: `riffle mount s3://BUCKET/PREFIX/ TARGET --allow-other <flags>
//! --pid-file=F --log-file=L` in its own session (setsid), so that neither a
//! signal to the plugin's process group nor the plugin's death reaches the
//! daemon. The child's environment says where its identity is
//! ([`DaemonCredentials::env`]: a keys file or a web identity token file on
//! the plugin's tmpfs, which the daemon re-reads; other AWS credential
//! variables of this process are removed unless the volume uses the node's
//! identity). Without
//! `--foreground`, riffle forks the daemon and exits 0 once the mount is live,
//! or non-zero with a one-line reason on stderr. Its stderr goes to a file in
//! the (root-only) run directory instead of a pipe: the daemon inherits the
//! descriptor, and a pipe would tie the daemon to the plugin. After exit 0 we
//! check that a `fuse.riffle` mount is really at the target and read the
//! daemon's pid from the pid file. With `--restart` (always given), that pid is
//! riffle's keeper, which lives as long as the mount: a daemon killed under it
//! (SIGKILL, OOM kill, panic) is replaced by a successor that takes the live
//! FUSE connection over, so the volume stays healthy and is not remounted.
//!
//! The reason line is mapped to a gRPC-relevant category by keywords (exit
//! code 2 is a usage error from clap); the message is passed on verbatim,
//! scrubbed of any credential value.
//!
//! Unmount: `riffle unmount TARGET` while the mount answers, then a lazy
//! detach (`umount2(MNT_DETACH)`) of whatever is still there (a dead daemon
//! leaves a mount that only a detach removes), then the daemon is waited
//! for, SIGTERMed, SIGKILLed.

use crate::mounter::metrics::VolumeLabels;
use crate::mounter::peers::{NodePeers, PeerOptions};
use crate::mounter::process;
use crate::mounter::{
    DaemonCredentials, DaemonId, Health, MountError, MountErrorKind, MountRequest, Mounter,
};
use crate::node_state::cache_disk::RootDisk;
use crate::node_state::cache_shares::{CacheShares, Grant};
use crate::node_state::mountinfo::{self, Probe, RIFFLE_FSTYPE};
use async_trait::async_trait;
use rifflefs::cli::failure::FailureKind;
use std::ffi::OsString;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::process::Command;

/// Runs the `riffle` binary.
#[derive(Debug, Clone)]
pub struct RiffleMounter {
    pub binary: PathBuf,
    /// The node's shared block cache, for volumes that enable caching.
    pub cache_dir: Option<PathBuf>,
    /// How long `riffle mount` may take to report the mount live.
    pub mount_timeout: Duration,
    /// How long a daemon gets to exit after unmount before each signal.
    pub stop_grace: Duration,
    /// Time limit for stat on a mount when checking its health.
    pub probe_timeout: Duration,
    /// The node cache's budget, shared by the volumes that use the cache
    /// ([`crate::node_state::cache_shares`]); None: each volume gets what it asks for.
    pub cache_shares: Option<Arc<CacheShares>>,
    /// Refuse volumes that use the cache when `cache_dir` is on this root disk
    /// ([`crate::node_state::cache_disk`]); None: no check.
    pub root_disk: Option<RootDisk>,
    /// The node's fd store (`riffle fd-store`, in the plugin's pod): every
    /// daemon's keeper gives it a copy of its FUSE connection, so that the
    /// mount outlives this container ([`Mounter::take_over`]).
    pub fd_store: Option<PathBuf>,
    /// The node's peers ([`crate::mounter::peers`]): each daemon's `--peer-listen`, `--peers` and
    /// `--peer-secret-file`, by the ring of its data.
    pub peers: Option<Arc<NodePeers>>,
}

/// How the local daemons are run: the options `riffle-mounter` and (without
/// a mounter) `riffle-csi` share.
#[derive(Debug, Clone, clap::Args)]
pub struct DaemonOptions {
    /// The node's shared block cache (NVMe hostPath); used by volumes that
    /// set cacheSize.
    #[arg(long, env = "RIFFLE_CSI_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// The riffle binary (default: `riffle` next to this binary, else PATH).
    #[arg(long, env = "RIFFLE_BIN")]
    pub riffle_bin: Option<PathBuf>,
    /// Seconds `riffle mount` may take to report a mount live.
    #[arg(long, default_value_t = 90)]
    pub mount_timeout: u64,
    /// Allow the cache directory on the node's root filesystem (by default a
    /// volume with cacheSize is refused there: a full cache would get pods
    /// evicted).
    #[arg(long, env = "RIFFLE_ALLOW_ROOT_DISK_CACHE")]
    pub allow_root_disk_cache: bool,
    /// Kubelet's root directory as this container sees it: a cache directory
    /// on its filesystem (or on that of `/`) is on the root disk.
    #[arg(long, env = "RIFFLE_KUBELET_DIR", default_value = "/var/lib/kubelet")]
    pub kubelet_dir: PathBuf,
    /// The node's fd store socket (`riffle fd-store`, run in the plugin's
    /// pod): each daemon gives it a copy of its FUSE connection, so a
    /// restart of this container (rollout, crash, OOM kill) costs no read; a
    /// new mounter takes the live mounts over.
    #[arg(long, env = "RIFFLE_FD_STORE")]
    pub fd_store: Option<PathBuf>,
    /// The node cache's budget, a size or a percentage of the cache disk: the volumes'
    /// cacheSize are shares of it and together never exceed it (first come, first served;
    /// see `cache_shares`).
    #[arg(long, env = "RIFFLE_CACHE_SIZE", default_value = crate::node_state::cache_shares::DEFAULT_BUDGET)]
    pub cache_size: String,
    /// Peers: the nodes serve each other's cache ([`crate::mounter::peers`]).
    #[command(flatten)]
    pub peers: PeerOptions,
}

impl DaemonOptions {
    /// The mounter these options describe (creating the cache directory); the node cache's
    /// shares are recorded in `state_dir`.
    pub fn mounter(&self, state_dir: &Path) -> std::io::Result<RiffleMounter> {
        if let Some(dir) = &self.cache_dir {
            std::fs::create_dir_all(dir).map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("cannot create cache dir {}: {e}", dir.display()),
                )
            })?;
        }
        let mut mounter = RiffleMounter::new(
            riffle_binary(self.riffle_bin.clone()),
            self.cache_dir.clone(),
        );
        mounter.mount_timeout = Duration::from_secs(self.mount_timeout);
        mounter.fd_store = self.fd_store.clone();
        if let Some(dir) = &self.cache_dir {
            let shares =
                CacheShares::new(dir, &self.cache_size, &state_dir.join("cache-shares.json"))
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
            mounter.cache_shares = Some(Arc::new(shares));
        }
        mounter.peers = self.peers.setup();
        if !self.allow_root_disk_cache {
            let root_disk = RootDisk::new(&self.kubelet_dir);
            if let Some(dir) = &self.cache_dir {
                if let Err(refusal) = root_disk.check(dir) {
                    tracing::error!("volumes with cacheSize will be refused: {refusal}");
                }
            }
            mounter.root_disk = Some(root_disk);
        }
        Ok(mounter)
    }
}

/// The `riffle` binary to run: `explicit` if given, else `riffle` next to
/// the running executable, else `riffle` from PATH.
pub fn riffle_binary(explicit: Option<PathBuf>) -> PathBuf {
    if let Some(p) = explicit {
        return p;
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("riffle")))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("riffle"))
}

impl RiffleMounter {
    pub fn new(binary: PathBuf, cache_dir: Option<PathBuf>) -> Self {
        Self {
            binary,
            cache_dir,
            mount_timeout: Duration::from_secs(90),
            stop_grace: Duration::from_secs(5),
            probe_timeout: Duration::from_secs(10),
            root_disk: None,
            fd_store: None,
            cache_shares: None,
            peers: None,
        }
    }

    /// The full argument list of `riffle mount` for `req` (with `take_over`:
    /// only take the live mount the fd store holds over).
    pub fn mount_args(&self, req: &MountRequest<'_>, take_over: bool) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![
            "mount".into(),
            req.settings.source_url().into(),
            req.target.as_os_str().to_owned(),
            "--allow-other".into(),
            // A keeper holds the FUSE connection: a crash or OOM kill of the daemon is
            // answered by a successor that takes the mount over (riffle's `cli::keeper`).
            "--restart".into(),
        ];
        if let Some(store) = &self.fd_store {
            let mut flag = OsString::from("--fd-store=");
            flag.push(store);
            args.push(flag);
            if take_over {
                args.push("--take-over".into());
            }
        }
        args.extend(req.settings.flags(self.cache_dir.as_deref()));
        let mut pid = OsString::from("--pid-file=");
        pid.push(req.pid_file);
        args.push(pid);
        let mut log = OsString::from("--log-file=");
        log.push(req.log_file);
        args.push(log);
        args
    }

    /// The peer flags of the daemon `req` starts ([`NodePeers::flags`]: its ring's port,
    /// if this node can give it); none without peers.
    pub fn peer_flags(&self, req: &MountRequest<'_>) -> Vec<OsString> {
        match &self.peers {
            Some(peers) => peers.flags(req.settings, req.target),
            None => Vec::new(),
        }
    }

    /// Frees the peer port of the daemon at `target` (unmounted, or not mounted after all).
    fn release_peer_port(&self, target: &Path) {
        if let Some(peers) = &self.peers {
            peers.release(target);
        }
    }

    /// The `riffle mount` command with `args` and the environment of `auth`.
    pub fn command(&self, args: &[OsString], auth: &DaemonCredentials) -> Command {
        let mut cmd = Command::new(&self.binary);
        cmd.args(args).stdin(Stdio::null()).stdout(Stdio::null());
        for (name, value) in auth.env() {
            match value {
                Some(v) => cmd.env(name, v),
                None => cmd.env_remove(name),
            };
        }
        // SAFETY: setsid is async-signal-safe and touches no memory of the
        // parent; it only fails if the child already leads a group, which a
        // freshly forked child does not.
        unsafe {
            cmd.pre_exec(|| {
                nix::unistd::setsid().map_err(std::io::Error::from)?;
                Ok(())
            });
        }
        cmd
    }

    /// Removes a daemon (and its mount) left by a mount attempt that timed
    /// out.
    async fn cleanup_after_timeout(&self, target: &Path, pid_file: &Path) {
        let daemon = process::from_pid_file(pid_file);
        if let Err(e) = self.unmount(target, daemon).await {
            tracing::warn!(target = %target.display(), error = %e, "cleanup after mount timeout failed");
        }
    }
}

/// The `--metrics-label` flags of the daemon `req` starts: its volume's labels
/// ([`VolumeLabels`]), which the daemon writes on every sample of its metrics, so the
/// mounter's endpoint ([`crate::mounter::metrics`]) passes them on as they are.
pub fn metrics_label_flags(req: &MountRequest<'_>) -> Vec<OsString> {
    VolumeLabels::new(req.volume_id, req.pod, req.target)
        .pairs()
        .into_iter()
        .map(|(name, value)| format!("--metrics-label={name}={value}").into())
        .collect()
}

/// The category of a failed `riffle mount`, from its exit status alone: riffle tells the kind
/// of a failure by its status (`rifflefs::cli::failure`, which documents the table); a
/// signal or a status no kind has is [`MountErrorKind::Internal`].
pub fn classify(exit_code: Option<i32>) -> MountErrorKind {
    match exit_code.and_then(FailureKind::from_exit_code) {
        Some(FailureKind::InvalidArgument) => MountErrorKind::InvalidArgument,
        Some(FailureKind::NothingToTakeOver) => MountErrorKind::NothingToTakeOver,
        Some(FailureKind::NotFound) => MountErrorKind::NotFound,
        Some(FailureKind::PermissionDenied) => MountErrorKind::PermissionDenied,
        Some(FailureKind::Unavailable) => MountErrorKind::Unavailable,
        Some(FailureKind::FailedPrecondition) => MountErrorKind::FailedPrecondition,
        Some(FailureKind::Failed) | None => MountErrorKind::Internal,
    }
}

/// The reason riffle gave: the last non-empty stderr line, bounded.
fn reason_line(stderr: &str) -> String {
    let line = stderr
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .unwrap_or("(no message on stderr)");
    let mut line = line.to_string();
    if line.len() > 500 {
        let mut cut = 500;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        line.truncate(cut);
        line.push('…');
    }
    line
}

#[async_trait]
impl Mounter for RiffleMounter {
    async fn mount(&self, req: MountRequest<'_>) -> Result<Option<DaemonId>, MountError> {
        let target = req.target;
        let mounted = self.run_mount_in_budget(req, false).await;
        if mounted.is_err() {
            self.release_peer_port(target);
        }
        mounted
    }

    async fn take_over(&self, req: MountRequest<'_>) -> Result<Option<DaemonId>, MountError> {
        if self.fd_store.is_none() {
            return Err(MountError::new(
                MountErrorKind::NothingToTakeOver,
                format!(
                    "no fd store holds the connection of {} (riffle-mounter runs without --fd-store)",
                    req.target.display()
                ),
            ));
        }
        let target = req.target;
        let mounted = self.run_mount_in_budget(req, true).await;
        if mounted.is_err() {
            self.release_peer_port(target);
        }
        mounted
    }

    async fn unmount(&self, target: &Path, daemon: Option<DaemonId>) -> Result<(), MountError> {
        self.stop(target, daemon).await?;
        if let Some(shares) = &self.cache_shares {
            shares.release(target);
        }
        self.release_peer_port(target);
        Ok(())
    }

    async fn health(&self, target: &Path, daemon: Option<DaemonId>) -> Result<Health, MountError> {
        Ok(self.inspect(target, daemon).await)
    }

    async fn daemon_from_pid_file(&self, pid_file: &Path) -> Option<DaemonId> {
        process::from_pid_file(pid_file)
    }
}

impl RiffleMounter {
    /// [`Self::run_mount`] with the volume's share of the node cache's budget
    /// ([`crate::node_state::cache_shares`]) as its cache size.
    async fn run_mount_in_budget(
        &self,
        req: MountRequest<'_>,
        take_over: bool,
    ) -> Result<Option<DaemonId>, MountError> {
        let Some(shares) = self
            .cache_shares
            .as_ref()
            .filter(|_| req.settings.uses_cache())
        else {
            return self.run_mount(req, take_over).await;
        };
        let (settings, grant) = shares.apply(req.target, req.settings).map_err(|e| {
            MountError::new(
                MountErrorKind::Internal,
                format!("cannot grant a share of the node cache: {e}"),
            )
        })?;
        let volume = req.settings.source_url();
        match grant {
            Some(Grant::Reduced { asked, granted }) => tracing::warn!(
                target = %req.target.display(), %volume, asked, granted,
                "the volume asked for more of the node cache than the other volumes' shares leave in riffle-mounter's --cache-size budget; it caches in what is left"
            ),
            Some(Grant::Nothing { asked }) => tracing::warn!(
                target = %req.target.display(), %volume, asked,
                "the other volumes' shares take riffle-mounter's whole --cache-size budget: this volume runs without the disk cache (its reads go to the store)"
            ),
            _ => {}
        }
        let result = self
            .run_mount(
                MountRequest {
                    settings: &settings,
                    ..req
                },
                take_over,
            )
            .await;
        shares.settled(req.target, result.is_ok());
        result
    }

    /// Runs `riffle mount` for `req` (see [`Self::mount_args`]) and waits
    /// for it to report the mount live.
    async fn run_mount(
        &self,
        req: MountRequest<'_>,
        take_over: bool,
    ) -> Result<Option<DaemonId>, MountError> {
        if let (Some(root_disk), Some(dir), true) =
            (&self.root_disk, &self.cache_dir, req.settings.uses_cache())
        {
            root_disk
                .check(dir)
                .map_err(|refusal| MountError::new(MountErrorKind::FailedPrecondition, refusal))?;
        }
        let mut args = self.mount_args(&req, take_over);
        args.extend(self.peer_flags(&req));
        args.extend(metrics_label_flags(&req));
        let source = req.settings.source_url();
        // A mount afresh names its keeper in a new pid file. A take-over must leave the file
        // as it is: when the take-over is refused because a live keeper holds the mount (a
        // daemon's new keeper won the store's lease), the file names that keeper, and the
        // plugin reads it to see so (`VolumeManager::recover`); a take-over that succeeds
        // writes it over. Removed, the live keeper went unnamed and the plugin tried again
        // and again, a refused keeper every 10 s.
        if !take_over {
            let _ = std::fs::remove_file(req.pid_file);
        }
        let stderr_path = req.pid_file.with_extension("stderr");
        let stderr_file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&stderr_path)
            .map_err(|e| {
                MountError::new(
                    MountErrorKind::Internal,
                    format!("cannot create {}: {e}", stderr_path.display()),
                )
            })?;
        let mut cmd = self.command(&args, req.auth);
        cmd.stderr(stderr_file);
        tracing::info!(
            target = %req.target.display(),
            %source,
            args = ?args,
            "running riffle mount"
        );
        let (mut child, _owned) = crate::mounter::reaper::spawn(&mut cmd).map_err(|e| {
            MountError::new(
                MountErrorKind::Internal,
                format!(
                    "cannot run the riffle binary {}: {e} (set --riffle-bin)",
                    self.binary.display()
                ),
            )
        })?;
        let status = match tokio::time::timeout(self.mount_timeout, child.wait()).await {
            Ok(Ok(status)) => status,
            Ok(Err(e)) => {
                return Err(MountError::new(
                    MountErrorKind::Internal,
                    format!("waiting for riffle mount failed: {e}"),
                ))
            }
            Err(_) => {
                let _ = child.start_kill();
                let _ = child.wait().await;
                // A take-over's mount is the pods' live one, whichever keeper holds it now:
                // never unmounted here (the supervisor's next round checks it again).
                if !take_over {
                    self.cleanup_after_timeout(req.target, req.pid_file).await;
                }
                let _ = std::fs::remove_file(&stderr_path);
                return Err(MountError::new(
                    MountErrorKind::Timeout,
                    format!(
                        "riffle mount of {source} at {} did not become ready within {:?}",
                        req.target.display(),
                        self.mount_timeout
                    ),
                ));
            }
        };
        let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
        let _ = std::fs::remove_file(&stderr_path);
        if !status.success() {
            let reason = req.auth.scrub(&reason_line(&stderr));
            let kind = classify(status.code());
            return Err(MountError::new(
                kind,
                format!(
                    "riffle mount of {source} at {} failed ({status}): {reason}",
                    req.target.display()
                ),
            ));
        }
        match mountinfo::mount_at(req.target) {
            Ok(Some(m)) if m.fs_type == RIFFLE_FSTYPE => {}
            other => {
                return Err(MountError::new(
                    MountErrorKind::Internal,
                    format!(
                    "riffle mount exited 0 but no {RIFFLE_FSTYPE} mount is at {} (found {other:?})",
                    req.target.display()
                ),
                ))
            }
        }
        // The daemon writes its pid file before the parent reports success;
        // allow a moment in case it lags.
        for _ in 0..20 {
            if let Some(id) = process::from_pid_file(req.pid_file) {
                return Ok(Some(id));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tracing::warn!(pid_file = %req.pid_file.display(), "riffle mounted but wrote no usable pid file");
        Ok(None)
    }

    /// Unmounts `target` and stops `daemon` (see [`Mounter::unmount`]).
    async fn stop(&self, target: &Path, daemon: Option<DaemonId>) -> Result<(), MountError> {
        let mounted = mountinfo::mount_at(target).map_err(|e| {
            MountError::new(
                MountErrorKind::Internal,
                format!("cannot read mountinfo: {e}"),
            )
        })?;
        if let Some(entry) = mounted {
            let answers = entry.fs_type == RIFFLE_FSTYPE
                && mountinfo::probe(target, self.probe_timeout).await == Probe::Ok;
            if answers {
                let mut cmd = Command::new(&self.binary);
                cmd.arg("unmount")
                    .arg(target)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped());
                let run = async {
                    let (child, _owned) = crate::mounter::reaper::spawn(&mut cmd)?;
                    child.wait_with_output().await
                };
                match tokio::time::timeout(Duration::from_secs(30), run).await {
                    Ok(Ok(out)) if out.status.success() => {}
                    Ok(Ok(out)) => tracing::warn!(
                        target = %target.display(),
                        stderr = %reason_line(&String::from_utf8_lossy(&out.stderr)),
                        "riffle unmount failed; detaching lazily"
                    ),
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "cannot run riffle unmount; detaching lazily")
                    }
                    Err(_) => tracing::warn!("riffle unmount timed out; detaching lazily"),
                }
            }
            // Detach whatever is still there, stacked mounts included.
            mountinfo::detach_all(target);
        }
        if let Some(id) = daemon {
            process::stop(id, self.stop_grace).await;
        }
        crate::mounter::nothing_mounted_at(target, "unmount")
    }

    /// What is at `target` (see [`Mounter::health`]); local inspection
    /// cannot fail to ask.
    async fn inspect(&self, target: &Path, daemon: Option<DaemonId>) -> Health {
        let entry = match mountinfo::mount_at(target) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(error = %e, "cannot read mountinfo; assuming mounts are fine");
                return Health::Live;
            }
        };
        let daemon_alive = daemon.map(process::is_alive);
        let Some(entry) = entry else {
            return match (daemon, daemon_alive) {
                (Some(id), Some(true)) => Health::Broken(format!(
                    "mount daemon (pid {}) runs but nothing is mounted",
                    id.pid
                )),
                _ => Health::NotMounted,
            };
        };
        if entry.fs_type != RIFFLE_FSTYPE {
            return Health::Foreign(entry.fs_type);
        }
        if let (Some(id), Some(false)) = (daemon, daemon_alive) {
            return Health::Broken(format!("mount daemon (pid {}) exited", id.pid));
        }
        match mountinfo::probe(target, self.probe_timeout).await {
            Probe::Ok => Health::Live,
            Probe::Disconnected => {
                Health::Broken("transport endpoint is not connected".to_string())
            }
            Probe::TimedOut => {
                tracing::warn!(target = %target.display(), "mount is slow to answer stat; leaving it alone");
                Health::Live
            }
            Probe::Other(e) => {
                tracing::warn!(target = %target.display(), error = %e, "stat on mount failed; leaving it alone");
                Health::Live
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::settings::VolumeSettings;
    use std::collections::HashMap;

    #[test]
    fn classification() {
        use MountErrorKind::*;
        let cases = [
            (FailureKind::InvalidArgument, InvalidArgument),
            (FailureKind::NotFound, NotFound),
            (FailureKind::PermissionDenied, PermissionDenied),
            (FailureKind::Unavailable, Unavailable),
            (FailureKind::FailedPrecondition, FailedPrecondition),
            (FailureKind::NothingToTakeOver, NothingToTakeOver),
            (FailureKind::Failed, Internal),
        ];
        for (failure, kind) in cases {
            assert_eq!(classify(Some(failure.exit_code())), kind, "{failure:?}");
        }
        // Killed by a signal, or a status riffle never uses.
        assert_eq!(classify(None), Internal);
        assert_eq!(classify(Some(101)), Internal);
    }

    #[test]
    fn reason_is_last_line_and_bounded() {
        assert_eq!(reason_line("a\nerror: b\n\n"), "error: b");
        assert_eq!(reason_line(""), "(no message on stderr)");
        assert!(reason_line(&"x".repeat(2000)).len() < 520);
    }

    #[test]
    fn args_carry_no_credentials() {
        let mut attrs = HashMap::new();
        attrs.insert("bucket".to_string(), "datasets".to_string());
        attrs.insert("cacheSize".to_string(), "10GiB".to_string());
        let settings = VolumeSettings::parse(&attrs, &[]).expect("valid");
        // The keys stay in their file: the arguments name only the file's variable.
        let keys = DaemonCredentials::KeysFile {
            path: "/run/riffle-csi/AKIDARGS-SECRETARGS".into(),
        };
        let m = RiffleMounter::new("riffle".into(), Some("/var/cache/riffle".into()));
        let req = MountRequest {
            target: Path::new("/t"),
            settings: &settings,
            auth: &keys,
            pid_file: Path::new("/s/run/k.pid"),
            log_file: Path::new("/s/logs/k.log"),
            volume_id: "vol-1",
            pod: Some("ml/trainer-0"),
        };
        let args: Vec<String> = m
            .mount_args(&req, false)
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            args,
            vec![
                "mount",
                "s3://datasets/",
                "/t",
                "--allow-other",
                "--restart",
                "--cache-size=10GiB",
                "--cache-dir=/var/cache/riffle",
                "--pid-file=/s/run/k.pid",
                "--log-file=/s/logs/k.log",
            ]
        );
        assert!(!args
            .iter()
            .any(|a| a.contains("AKIDARGS") || a.contains("SECRETARGS")));

        // With the node's fd store: every daemon's keeper gives it a copy of its connection,
        // and a take-over asks for the held mount only.
        let mut m = m;
        m.fd_store = Some("/var/lib/riffle-csi/fd-store/fd-store.sock".into());
        let with_store = |take_over| -> Vec<String> {
            m.mount_args(&req, take_over)
                .into_iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect()
        };
        let store_flag = "--fd-store=/var/lib/riffle-csi/fd-store/fd-store.sock".to_string();
        assert_eq!(with_store(false)[5], store_flag);
        assert!(!with_store(false).contains(&"--take-over".to_string()));
        assert_eq!(with_store(true)[5..7], [store_flag, "--take-over".into()]);
    }

    /// A refused take-over (another keeper serves the mount) leaves the pid file that names
    /// that keeper; a mount afresh starts from no pid file.
    #[tokio::test]
    async fn a_refused_take_over_leaves_the_live_keepers_pid_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let binary = dir.path().join("riffle");
        std::fs::write(
            &binary,
            "#!/bin/sh\necho 'riffle: another keeper serves /t (the fd store lent it its connection)' >&2\nexit 1\n",
        )
        .expect("write the stand-in riffle");
        std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let mut m = RiffleMounter::new(binary, None);
        m.fd_store = Some(dir.path().join("fd-store.sock"));
        let settings = VolumeSettings::parse(
            &[("bucket".to_string(), "datasets".to_string())].into(),
            &[],
        )
        .expect("valid");
        let (pid_file, log_file) = (dir.path().join("k.pid"), dir.path().join("k.log"));
        let req = || MountRequest {
            target: Path::new("/t"),
            settings: &settings,
            auth: &DaemonCredentials::Node,
            pid_file: &pid_file,
            log_file: &log_file,
            volume_id: "vol-1",
            pod: None,
        };
        std::fs::write(&pid_file, "4242\n").expect("the live keeper's pid file");
        let refused = m.take_over(req()).await.expect_err("the stand-in refuses");
        assert!(
            refused.message.contains("another keeper serves"),
            "{refused}"
        );
        assert_eq!(
            std::fs::read_to_string(&pid_file).ok().as_deref(),
            Some("4242\n"),
            "the take-over left the live keeper's pid file"
        );
        m.mount(req()).await.expect_err("the stand-in fails");
        assert!(!pid_file.exists(), "a mount afresh starts from no pid file");
    }

    #[test]
    fn daemons_get_their_volumes_metrics_labels() {
        let settings = VolumeSettings::parse(
            &[("bucket".to_string(), "datasets".to_string())].into(),
            &[],
        )
        .expect("valid");
        let mut req = MountRequest {
            target: Path::new("/t"),
            settings: &settings,
            auth: &DaemonCredentials::Anonymous,
            pid_file: Path::new("/s/run/k.pid"),
            log_file: Path::new("/s/logs/k.log"),
            volume_id: "vol-1",
            pod: Some("ml/trainer-0"),
        };
        let key = crate::node_state::state::StateStore::key(Path::new("/t"));
        let flags = |req: &MountRequest<'_>| -> Vec<String> {
            metrics_label_flags(req)
                .into_iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect()
        };
        assert_eq!(
            flags(&req),
            [
                "--metrics-label=volume=vol-1".to_string(),
                "--metrics-label=pod=ml/trainer-0".to_string(),
                format!("--metrics-label=key={key}"),
            ]
        );
        // No pod (kubelet did not say it): no pod label.
        req.pod = Some("");
        assert_eq!(flags(&req).len(), 2);
    }

    #[test]
    fn daemons_get_their_rings_peer_flags() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "a-secret-of-32-bytes-0123456789a\n").unwrap();
        let settings = |pairs: &[(&str, &str)]| -> VolumeSettings {
            let attrs: HashMap<String, String> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            VolumeSettings::parse(&attrs, &[]).expect("valid")
        };
        let mut m = RiffleMounter::new("riffle".into(), None);
        // Without peers configured: nothing.
        let a = settings(&[("bucket", "datasets")]);
        let req = |target: &'static str, s: &'static VolumeSettings| MountRequest {
            target: Path::new(target),
            settings: s,
            auth: &DaemonCredentials::Anonymous,
            pid_file: Path::new("/s/run/k.pid"),
            log_file: Path::new("/s/logs/k.log"),
            volume_id: "vol-1",
            pod: Some("ml/trainer-0"),
        };
        let a: &'static VolumeSettings = Box::leak(Box::new(a));
        let off: &'static VolumeSettings = Box::leak(Box::new(settings(&[
            ("bucket", "datasets"),
            ("peers", "false"),
        ])));
        assert!(m.peer_flags(&req("/t/a", a)).is_empty());
        // The same range on every node: the port of a ring is the same everywhere. Port 1 is
        // not ours to bind in a test, so use a range around a free port.
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = free.local_addr().unwrap().port();
        drop(free);
        m.peers = Some(Arc::new(NodePeers::new(
            "riffle-peers.riffle-csi.svc.cluster.local".into(),
            "127.0.0.1".parse().unwrap(),
            crate::mounter::peers::PortRange {
                first: port,
                last: port,
            },
            secret.clone(),
        )));
        let strings = |flags: Vec<OsString>| -> Vec<String> {
            flags
                .into_iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect()
        };
        let first = strings(m.peer_flags(&req("/t/a", a)));
        assert_eq!(
            first,
            vec![
                format!("--peer-listen=127.0.0.1:{port}"),
                format!("--peers=dns:riffle-peers.riffle-csi.svc.cluster.local:{port}"),
                format!("--peer-secret-file={}", secret.display()),
            ]
        );
        assert!(!first.iter().any(|f| f.contains("a-secret")));
        // A second daemon of the same data on this node asks, the first serves.
        let second = strings(m.peer_flags(&req("/t/b", a)));
        assert_eq!(second, first[1..].to_vec());
        // peers: "false" opts a volume out.
        assert!(m.peer_flags(&req("/t/c", off)).is_empty());
        // The first unmounts (`unmount` releases it after stopping the daemon): the port is
        // free for the next daemon.
        m.release_peer_port(Path::new("/t/a"));
        assert_eq!(strings(m.peer_flags(&req("/t/b", a))), first);
    }

    /// The environment the real `riffle mount` child gets: set variables
    /// with their values, removed ones as None.
    fn child_env(auth: &DaemonCredentials) -> HashMap<String, Option<String>> {
        let m = RiffleMounter::new("riffle".into(), None);
        let cmd = m.command(&[], auth);
        cmd.as_std()
            .get_envs()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.map(|v| v.to_string_lossy().into_owned()),
                )
            })
            .collect()
    }

    #[test]
    fn a_web_identity_daemon_gets_the_sdks_variables_and_nothing_of_the_node() {
        let env = child_env(&DaemonCredentials::WebIdentity {
            role_arn: "arn:aws:iam::1:role/r".into(),
            token_file: "/run/riffle-csi/k/token".into(),
            session_name: "riffle-ml-p".into(),
            sts_endpoint_url: Some("http://rgw:7480".into()),
        });
        let get = |k: &str| env.get(k).cloned().flatten();
        assert_eq!(
            get("AWS_ROLE_ARN").as_deref(),
            Some("arn:aws:iam::1:role/r")
        );
        assert_eq!(
            get("AWS_WEB_IDENTITY_TOKEN_FILE").as_deref(),
            Some("/run/riffle-csi/k/token")
        );
        assert_eq!(get("AWS_ROLE_SESSION_NAME").as_deref(), Some("riffle-ml-p"));
        assert_eq!(
            get("AWS_ENDPOINT_URL_STS").as_deref(),
            Some("http://rgw:7480")
        );
        assert_eq!(get("AWS_CONFIG_FILE").as_deref(), Some("/dev/null"));
        for removed in [
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "AWS_PROFILE",
        ] {
            assert_eq!(env.get(removed), Some(&None), "{removed} must be removed");
        }
        let keys = child_env(&DaemonCredentials::KeysFile {
            path: "/run/riffle-csi/k/keys.json".into(),
        });
        assert_eq!(
            keys.get("RIFFLE_CREDENTIALS_FILE")
                .cloned()
                .flatten()
                .as_deref(),
            Some("/run/riffle-csi/k/keys.json")
        );
        assert_eq!(keys.get("AWS_ROLE_ARN"), Some(&None));
        assert_eq!(keys.get("AWS_ACCESS_KEY_ID"), Some(&None));
        // The node's identity: the mounter's environment is inherited as it is.
        assert!(child_env(&DaemonCredentials::Node).is_empty());
    }

    #[test]
    fn failure_messages_lose_the_secrets_of_the_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let token = dir.path().join("token");
        std::fs::write(&token, "JWTSECRETVALUE").expect("write");
        let auth = DaemonCredentials::WebIdentity {
            role_arn: "arn:aws:iam::1:role/r".into(),
            token_file: token,
            session_name: "s".into(),
            sts_endpoint_url: None,
        };
        assert_eq!(
            auth.scrub("error: token JWTSECRETVALUE refused"),
            "error: token <redacted> refused"
        );
        let keys = dir.path().join("keys.json");
        std::fs::write(
            &keys,
            br#"{"accessKeyId":"AKIDFILE","secretAccessKey":"SECRETFILE"}"#,
        )
        .expect("write");
        assert_eq!(
            DaemonCredentials::KeysFile { path: keys }.scrub("AKIDFILE/SECRETFILE"),
            "<redacted>/<redacted>"
        );
    }
}
