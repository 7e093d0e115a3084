//! Publishing, unpublishing and recovering volumes: the bookkeeping between
//! the CSI calls, the state directory and the [`Mounter`].
//!
//! Every operation on a target runs under that target's lock
//! ([`KeyedLocks`]); different targets run in parallel.
//!
//! Publish: if a record exists for the target, the call is a repeat: same
//! volume id and settings hash -> the volume's secrets (keys, the pod's
//! token) are rewritten on the tmpfs, where the running daemon re-reads
//! them, and the call succeeds without a remount (remounting only if the
//! daemon died); this is how `requiresRepublish` keeps a token fresh.
//! Anything else -> AlreadyExists. Without a record, a stale rifflefs mount
//! left at the target is detached, the target directory is created, the
//! secrets and a record *without* daemon are written, then the mount is
//! made and the record completed with the daemon id. Writing the record
//! before mounting means a plugin that dies mid-mount finds the volume again
//! at start (and adopts the mount if it came up, through the pid file); a
//! failed mount removes the record, the secrets and the directory.
//!
//! Unpublish: unmount whatever is at the target, stop the daemon, remove
//! the target directory, then forget the record and secrets. Unknown or
//! already removed targets are OK (idempotent). When the mounter cannot be
//! reached at all, the plugin detaches the target itself, so that a pod on a
//! node whose mounter is gone still terminates.
//!
//! Check (start-up reconciliation and the supervisor): a recorded target
//! whose mount is live is adopted as it is. One whose daemon died while its
//! FUSE connection lives on in the node's fd store (the mounter's container
//! restarted: pods' reads wait) is taken over: a new daemon serves the same
//! connection, nothing is detached, and no pod sees the mount go. One whose
//! mount is dead (it answers ENOTCONN: nothing held its connection) or gone
//! is detached and mounted again with the recorded settings and the secrets
//! on the tmpfs (if they are gone, after a node reboot, the remount waits for
//! kubelet's next publish). A
//! volume on the node's identity is not remounted while the driver does not
//! allow it. A target whose parent directory has disappeared belongs to a
//! pod kubelet has already cleaned up: its mount, record and secrets are
//! removed instead, so nothing leaks.

use crate::kube::access::{AccessError, VolumeAccess};
use crate::kube::settings::VolumeSettings;
use crate::mounter::{
    DaemonCredentials, Health, MountError, MountErrorKind, MountRequest, Mounter,
};
use crate::node_state::locks::KeyedLocks;
use crate::node_state::secrets::{SecretStore, SecretsError};
use crate::node_state::state::{StateError, StateStore, VolumeRecord};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod shared;
pub mod supervisor;

/// A failed volume operation.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// The target is taken by another volume or other settings.
    #[error("{0}")]
    AlreadyExists(String),
    /// The target is in a state the plugin will not touch.
    #[error("{0}")]
    FailedPrecondition(String),
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Secrets(#[from] SecretsError),
    #[error("{context}: {source}")]
    Io { context: String, source: io::Error },
}

fn io_error(context: String) -> impl FnOnce(io::Error) -> VolumeError {
    move |source| VolumeError::Io { context, source }
}

/// One NodePublishVolume, validated.
pub struct PublishSpec {
    pub volume_id: String,
    pub target: PathBuf,
    pub settings: VolumeSettings,
    pub access: VolumeAccess,
    /// `namespace/name` of the pod, when kubelet said (podInfoOnMount).
    pub pod: Option<String>,
    /// The volume's staging path when kubelet staged it (NodeStageVolume): a daemon there
    /// may serve this publish and others ([`shared`]).
    pub staging: Option<PathBuf>,
}

/// What a check found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckOutcome {
    /// The mount is live.
    Healthy,
    /// The mount was broken or gone and has been mounted again.
    Recovered(String),
    /// Something else is mounted on the target; left alone.
    Foreign(String),
    /// The target's parent directory is gone (kubelet removed the pod's
    /// volume directory without unpublishing): the mount was removed and
    /// the record forgotten instead of remounting.
    Orphaned,
    /// No record (unpublished meanwhile) or the target is busy.
    Skipped,
}

/// Publishes, unpublishes and recovers volumes.
pub struct VolumeManager {
    mounter: Arc<dyn Mounter>,
    store: StateStore,
    secrets: SecretStore,
    allow_node_credentials: bool,
    locks: KeyedLocks,
}

impl VolumeManager {
    pub fn new(
        mounter: Arc<dyn Mounter>,
        store: StateStore,
        secrets: SecretStore,
        allow_node_credentials: bool,
    ) -> Self {
        Self {
            mounter,
            store,
            secrets,
            allow_node_credentials,
            locks: KeyedLocks::default(),
        }
    }

    pub fn secrets(&self) -> &SecretStore {
        &self.secrets
    }

    /// Deletes the secrets of targets without a record (a plugin that died before writing
    /// it), at start, before reconciliation; returns how many.
    pub fn prune_secrets(&self) -> Result<usize, VolumeError> {
        Ok(self.secrets.prune(&self.store)?)
    }

    /// Which mounter answers, if one does, and what ended under it (see [`Mounter::pulse`]).
    pub async fn mounter_pulse(&self) -> Result<crate::mounter::Pulse, MountError> {
        self.mounter.pulse().await
    }

    pub fn store(&self) -> &StateStore {
        &self.store
    }

    /// What is at `target` now (see [`Mounter::health`]), without taking its lock: for
    /// NodeGetVolumeStats, which only reads.
    pub async fn health(
        &self,
        target: &Path,
        daemon: Option<crate::mounter::DaemonId>,
    ) -> Result<Health, MountError> {
        self.mounter.health(target, daemon).await
    }

    /// NodePublishVolume.
    pub async fn publish(&self, spec: PublishSpec) -> Result<(), VolumeError> {
        let hash = spec.settings.digest(&spec.volume_id);
        // A target published with a daemon of its own stays so (an earlier plugin did not
        // stage; kubelet's republish now names a staging path).
        let own_daemon = self
            .store
            .load(&spec.target)?
            .is_some_and(|r| r.bind_of.is_none());
        if let Some(share) = shared::shared_path(&spec, &hash).filter(|_| !own_daemon) {
            return self.publish_shared(spec, hash, share).await;
        }
        let target = spec.target.as_path();
        let _guard = self.locks.lock(target).await;

        if let Some(mut record) = self.store.load(target)? {
            if record.volume_id != spec.volume_id {
                return Err(taken(&record, &spec.volume_id));
            }
            if record.settings_hash != hash {
                return Err(VolumeError::AlreadyExists(format!(
                    "volume {:?} is already published at {} with different settings (bucket {:?}, prefix {:?}); unpublish it before changing its attributes or mount options",
                    record.volume_id,
                    target.display(),
                    record.settings.bucket,
                    record.settings.prefix
                )));
            }
            // A republish: fresh secrets for the running daemon, no remount.
            let sts = record.settings.sts_endpoint_url.clone();
            let auth = self.secrets.auth_for(target, &spec.access, sts.as_deref());
            let recorded = record_auth(&record, &self.secrets);
            if recorded != auth && (recorded.uses_files() || auth.uses_files()) {
                return Err(VolumeError::AlreadyExists(format!(
                    "volume {:?} is already published at {} with another identity; unpublish it before changing its secret or role",
                    record.volume_id,
                    target.display()
                )));
            }
            let auth = self.secrets.write(target, &spec.access, sts.as_deref())?;
            if record.auth.as_ref() != Some(&auth) {
                record.has_credentials = auth.uses_files();
                record.auth = Some(auth);
                self.store.save(&record)?;
            }
            self.current_keeper(&mut record).await?;
            return match self.mounter.health(target, record.daemon).await? {
                Health::Live => {
                    tracing::info!(volume_id = %spec.volume_id, target = %target.display(), "already published");
                    Ok(())
                }
                Health::Foreign(fs) => Err(foreign(target, &fs)),
                Health::NotMounted => self.recover(record, false).await.map(|_| ()),
                Health::Broken(_) => self.recover(record, true).await.map(|_| ()),
            };
        }

        match self.mounter.health(target, None).await? {
            Health::NotMounted => {}
            Health::Foreign(fs) => return Err(foreign(target, &fs)),
            Health::Live | Health::Broken(_) => {
                tracing::warn!(target = %target.display(), "replacing a rifflefs mount this plugin has no record of");
                self.mounter.unmount(target, None).await?;
            }
        }
        let created = ensure_dir(target)?;
        let auth = self.secrets.write(
            target,
            &spec.access,
            spec.settings.sts_endpoint_url.as_deref(),
        )?;
        let mut record = VolumeRecord {
            volume_id: spec.volume_id.clone(),
            target: target.to_path_buf(),
            settings: spec.settings,
            settings_hash: hash,
            has_credentials: auth.uses_files(),
            auth: Some(auth),
            daemon: None,
            pod: spec.pod,
            bind_of: None,
            staging: None,
        };
        self.store.save(&record)?;
        match self.mount(&record).await {
            Ok(daemon) => {
                record.daemon = daemon;
                self.store.save(&record)?;
                tracing::info!(
                    volume_id = %record.volume_id,
                    target = %target.display(),
                    source = %record.settings.source_url(),
                    pid = ?daemon.map(|d| d.pid),
                    "published"
                );
                Ok(())
            }
            Err(e) => {
                self.forget_failed_mount(target, created);
                Err(e.into())
            }
        }
    }

    /// Forgets the unmounted `target`: removes its directory (see [`remove_target`] for
    /// `recorded`), its secrets and its record.
    fn forget(&self, target: &Path, recorded: bool) -> Result<(), VolumeError> {
        remove_target(target, recorded)?;
        self.secrets.remove(target)?;
        self.store.remove(target)?;
        Ok(())
    }

    /// Removes what a publish wrote for `target` before its mount failed: the record, the
    /// secrets, and the directory if the publish `created` it.
    fn forget_failed_mount(&self, target: &Path, created: bool) {
        if let Err(e) = self.store.remove(target) {
            tracing::warn!(error = %e, "cannot remove state after a failed mount");
        }
        if let Err(e) = self.secrets.remove(target) {
            tracing::warn!(error = %e, "cannot remove secrets after a failed mount");
        }
        if created {
            let _ = std::fs::remove_dir(target);
        }
    }

    /// NodeUnpublishVolume.
    pub async fn unpublish(&self, volume_id: &str, target: &Path) -> Result<(), VolumeError> {
        let _guard = self.locks.lock(target).await;
        let record = match self.store.load(target) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "ignoring unreadable record during unpublish");
                None
            }
        };
        if let Some(r) = &record {
            if r.volume_id != volume_id {
                tracing::warn!(
                    target = %target.display(),
                    recorded = %r.volume_id,
                    requested = %volume_id,
                    "unpublishing a target recorded for another volume id"
                );
            }
        }
        if record.as_ref().is_some_and(|r| r.bind_of.is_some()) {
            self.unbind(target).await?;
            self.forget(target, true)?;
            tracing::info!(volume_id = %volume_id, target = %target.display(), "unpublished (the shared daemon serves on until NodeUnstageVolume)");
            return Ok(());
        }
        let daemon = match record.as_ref().and_then(|r| r.daemon) {
            Some(d) => Some(d),
            None => {
                self.mounter
                    .daemon_from_pid_file(&self.store.pid_file(target))
                    .await
            }
        };
        match self.mounter.health(target, daemon).await {
            Ok(health) => {
                if health != Health::NotMounted || daemon.is_some() {
                    self.mounter.unmount(target, daemon).await?;
                }
            }
            // The mounter is gone (its DaemonSet deleted, or down): unpublish
            // must not wait for it, or the pod never finishes terminating.
            // Its daemons went with it; if one still runs (the mounter process
            // restarting inside its container), it exits once its mount is
            // detached and unused.
            Err(e) if e.kind == MountErrorKind::Unavailable => {
                tracing::warn!(target = %target.display(), error = %e, "unpublishing without the mounter: detaching the target here");
                crate::node_state::mountinfo::detach_all(target);
            }
            Err(e) => return Err(e.into()),
        }
        self.forget(target, record.is_some())?;
        tracing::info!(volume_id = %volume_id, target = %target.display(), "unpublished");
        Ok(())
    }

    /// Checks one recorded target and recovers it if its mount is broken or
    /// gone. With `wait` false a target whose lock is held (an operation in
    /// progress) is skipped.
    pub async fn check(&self, target: &Path, wait: bool) -> Result<CheckOutcome, VolumeError> {
        let _guard = if wait {
            self.locks.lock(target).await
        } else {
            match self.locks.try_lock(target) {
                Some(g) => g,
                None => return Ok(CheckOutcome::Skipped),
            }
        };
        let Some(record) = self.store.load(target)? else {
            return Ok(CheckOutcome::Skipped);
        };
        if target.parent().is_some_and(|p| !p.exists()) {
            tracing::warn!(volume_id = %record.volume_id, target = %target.display(), "pod volume directory is gone; cleaning up instead of remounting");
            if record.bind_of.is_some() {
                self.unbind(target).await?;
            } else {
                self.mounter.unmount(target, record.daemon).await?;
            }
            self.forget(target, true)?;
            return Ok(CheckOutcome::Orphaned);
        }
        if let Some(share) = record.bind_of.clone() {
            return self.check_bound(&record, &share).await;
        }
        self.revive(record).await
    }

    /// Records the keeper the pid file names, when it is a live process other than the
    /// recorded one: a daemon whose keeper died started a new keeper for itself, which wrote
    /// the pid file once it held the mount (riffle's `cli::adoption`). Without this, the dead
    /// keeper would make a live mount look broken.
    async fn current_keeper(&self, record: &mut VolumeRecord) -> Result<bool, VolumeError> {
        let named = self
            .mounter
            .daemon_from_pid_file(&self.store.pid_file(&record.target))
            .await;
        if named.is_none() || named == record.daemon {
            return Ok(false);
        }
        if let Some(old) = record.daemon {
            tracing::info!(volume_id = %record.volume_id, target = %record.target.display(), old = old.pid, new = ?named.map(|d| d.pid), "the volume has a new keeper (its daemon replaced one that died)");
        }
        record.daemon = named;
        self.store.save(record)?;
        Ok(true)
    }

    /// Brings the mount of `record` back if it is broken or gone (see [`Self::check`]);
    /// caller holds its target's lock.
    async fn revive(&self, mut record: VolumeRecord) -> Result<CheckOutcome, VolumeError> {
        self.current_keeper(&mut record).await?;
        let target = record.target.as_path();
        match self.mounter.health(target, record.daemon).await? {
            Health::Live => Ok(CheckOutcome::Healthy),
            Health::Foreign(fs) => Ok(CheckOutcome::Foreign(fs)),
            Health::NotMounted => {
                self.recover(record, false).await?;
                Ok(CheckOutcome::Recovered("not mounted".into()))
            }
            Health::Broken(reason) => Ok(CheckOutcome::Recovered(
                match self.recover(record, true).await? {
                    Recovery::TakenOver => {
                        format!("{reason}; a new daemon took the live mount over")
                    }
                    Recovery::StillServed => {
                        format!("{reason}; its connection is alive, left alone")
                    }
                    Recovery::Remounted => reason,
                },
            )),
        }
    }

    /// Brings a broken or missing mount back, with the secrets on the tmpfs:
    /// a `broken` one (something is mounted, its daemon gone) is first taken
    /// over, in case the fd store kept its connection; otherwise what is left
    /// is detached and the recorded volume mounted again. Caller holds the
    /// target's lock.
    async fn recover(
        &self,
        mut record: VolumeRecord,
        broken: bool,
    ) -> Result<Recovery, VolumeError> {
        let target = record.target.clone();
        let auth = record_auth(&record, &self.secrets);
        if auth == DaemonCredentials::Node && !self.allow_node_credentials {
            return Err(VolumeError::FailedPrecondition(format!(
                "cannot remount {}: {}",
                target.display(),
                AccessError::NodeCredentialsNotAllowed
            )));
        }
        if !self.secrets.present(&auth) {
            return Err(VolumeError::FailedPrecondition(format!(
                "cannot remount {}: its secrets are not in {} (a node reboot clears that tmpfs); kubelet's next NodePublishVolume brings them back",
                target.display(),
                self.secrets.root().display()
            )));
        }
        if broken {
            let mut attempt = 0;
            loop {
                attempt += 1;
                let e = match self.mount_as(&record, &auth, true).await {
                    Ok(daemon) => {
                        record.daemon = daemon;
                        record.auth = Some(auth);
                        self.store.save(&record)?;
                        tracing::warn!(volume_id = %record.volume_id, target = %target.display(), pid = ?daemon.map(|d| d.pid), "its daemon was gone; a new one took the live mount over (pods read on)");
                        return Ok(Recovery::TakenOver);
                    }
                    Err(e) => e,
                };
                // Refused because another keeper holds the mount (a daemon's new keeper won
                // the store's lease): it is kept, and nothing may touch it.
                if self.current_keeper(&mut record).await? {
                    tracing::info!(volume_id = %record.volume_id, target = %target.display(), reason = %e, "a live keeper holds the mount; nothing to take over");
                    return Ok(Recovery::TakenOver);
                }
                // A failure other than the store's word that nothing is kept (the new keeper
                // killed while starting, the store not answering) is tried again at once.
                if e.kind != MountErrorKind::NothingToTakeOver && attempt < TAKE_OVER_ATTEMPTS {
                    tracing::warn!(volume_id = %record.volume_id, target = %target.display(), reason = %e, attempt, "the take-over failed; trying again");
                    tokio::time::sleep(TAKE_OVER_PAUSE * attempt).await;
                    continue;
                }
                // A remount takes the mount from its pods: only for one whose connection has
                // ended. One that still answers, or waits for a daemon (its connection kept
                // somewhere), is left to its daemon or to the next round's take-over.
                if self.mounter.health(&target, None).await? == Health::Live {
                    tracing::info!(volume_id = %record.volume_id, target = %target.display(), reason = %e, "the take-over failed, but the mount's connection is alive: not remounting");
                    return Ok(Recovery::StillServed);
                }
                tracing::info!(volume_id = %record.volume_id, target = %target.display(), reason = %e, "the mount cannot be taken over");
                break;
            }
        }
        tracing::warn!(volume_id = %record.volume_id, target = %target.display(), "remounting");
        if let Err(e) = self.mounter.unmount(&target, record.daemon).await {
            tracing::warn!(target = %target.display(), error = %e, "cleanup before remount failed");
        }
        ensure_dir(&target)?;
        record.daemon = None;
        record.auth = Some(auth);
        self.store.save(&record)?;
        let daemon = match self.mount(&record).await {
            Ok(d) => d,
            Err(e) => {
                // A daemon's failure may quote its keys: never pass them on.
                let keys = self.secrets.load_keys(&target).ok().flatten();
                let message = crate::kube::credentials::scrub(keys.as_ref(), &e.message);
                return Err(MountError::new(e.kind, message).into());
            }
        };
        record.daemon = daemon;
        self.store.save(&record)?;
        tracing::info!(volume_id = %record.volume_id, target = %target.display(), pid = ?daemon.map(|d| d.pid), "remounted");
        Ok(Recovery::Remounted)
    }

    async fn mount(
        &self,
        record: &VolumeRecord,
    ) -> Result<Option<crate::mounter::DaemonId>, MountError> {
        let auth = record_auth(record, &self.secrets);
        self.mount_as(record, &auth, false).await
    }

    /// Mounts `record` with `auth`; with `take_over`, only takes the live
    /// mount at its target over (see [`Mounter::take_over`]).
    async fn mount_as(
        &self,
        record: &VolumeRecord,
        auth: &DaemonCredentials,
        take_over: bool,
    ) -> Result<Option<crate::mounter::DaemonId>, MountError> {
        let pid_file = self.store.pid_file(&record.target);
        let log_file = self.store.log_file(&record.target);
        let req = MountRequest {
            target: &record.target,
            settings: &record.settings,
            auth,
            pid_file: &pid_file,
            log_file: &log_file,
            volume_id: &record.volume_id,
            pod: record.pod.as_deref(),
        };
        if take_over {
            self.mounter.take_over(req).await
        } else {
            self.mounter.mount(req).await
        }
    }
}

/// Take-overs tried at once before a failure other than "nothing to take over" is left to the
/// supervisor's next round, and the pause before each (times the attempt).
const TAKE_OVER_ATTEMPTS: u32 = 3;
const TAKE_OVER_PAUSE: std::time::Duration = std::time::Duration::from_millis(200);

/// How [`VolumeManager::recover`] brought a mount back.
enum Recovery {
    /// A new daemon serves the connection the fd store kept.
    TakenOver,
    /// Detached and mounted anew.
    Remounted,
    /// Left alone: its connection is alive (a daemon answers, or one will).
    StillServed,
}

/// How the daemon of `record` authenticates; for records of earlier
/// plugins, from `has_credentials` (their keys were moved to the tmpfs at
/// start, see [`VolumeManager::adopt_legacy_secrets`]).
fn record_auth(record: &VolumeRecord, secrets: &SecretStore) -> DaemonCredentials {
    match (&record.auth, record.has_credentials) {
        (Some(a), _) => a.clone(),
        (None, true) => DaemonCredentials::KeysFile {
            path: secrets.keys_file(&record.target),
        },
        (None, false) if record.settings.anonymous() => DaemonCredentials::Anonymous,
        (None, false) => DaemonCredentials::Node,
    }
}

/// The target of `record` is asked for by another volume.
fn taken(record: &VolumeRecord, volume_id: &str) -> VolumeError {
    VolumeError::AlreadyExists(format!(
        "target path {} already has volume {:?} published; refusing to publish volume {volume_id:?} there",
        record.target.display(),
        record.volume_id,
    ))
}

fn foreign(target: &Path, fs_type: &str) -> VolumeError {
    VolumeError::FailedPrecondition(format!(
        "target path {} is already a mount point of type {fs_type} not managed by riffle-csi",
        target.display()
    ))
}

/// Creates the target directory if needed; true if it was created.
fn ensure_dir(target: &Path) -> Result<bool, VolumeError> {
    match std::fs::symlink_metadata(target) {
        Ok(m) if m.is_dir() => Ok(false),
        Ok(_) => Err(VolumeError::FailedPrecondition(format!(
            "target path {} exists and is not a directory",
            target.display()
        ))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::create_dir_all(target).map_err(io_error(format!(
                "cannot create target path {}",
                target.display()
            )))?;
            Ok(true)
        }
        Err(e) => Err(io_error(format!(
            "cannot inspect target path {}",
            target.display()
        ))(e)),
    }
}

/// Removes the (unmounted) target. A directory this plugin had no record of
/// is removed only if empty.
fn remove_target(target: &Path, recorded: bool) -> Result<(), VolumeError> {
    let meta = match std::fs::symlink_metadata(target) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(io_error(format!(
                "cannot inspect target path {}",
                target.display()
            ))(e))
        }
    };
    let result = if meta.is_dir() {
        std::fs::remove_dir(target)
    } else {
        std::fs::remove_file(target)
    };
    match result {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) if !recorded && e.kind() == io::ErrorKind::DirectoryNotEmpty => {
            tracing::warn!(target = %target.display(), "leaving a non-empty directory this plugin did not publish");
            Ok(())
        }
        Err(e) => Err(io_error(format!(
            "cannot remove target path {}",
            target.display()
        ))(e)),
    }
}
