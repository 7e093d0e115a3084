//! Shared daemons: one `riffle mount` per (volume, identity, options) on a node, however
//! many pods use the volume.
//!
//! kubelet stages a PersistentVolume once per node (NodeStageVolume, at a staging path of
//! its own) and then publishes it once per pod. A publish of a staged volume is served by
//! the daemon mounted at `STAGING/riffle-KEY`, where KEY digests the volume's settings
//! digest (volume id, source, options, the pod's fsGroup) and its identity (the keys of its
//! Secret, or anonymous, or the node's); the pod's target is a read-only bind of that mount.
//! Eight pods of one job that read a dataset with one Secret thus share one daemon: one
//! memory budget, one listing, one prefetcher, one share of the node cache. What differs
//! stages apart: other keys or options get a daemon of their own under the same staging
//! path, and a role assumed with the pod's own service-account token is never shared (the
//! token belongs to that pod and dies with it), nor is a volume kubelet did not stage
//! (inline ephemeral volumes are one pod's by definition).
//!
//! Lifecycle. NodeStageVolume validates the request and creates the staging directory;
//! the identity arrives with the publishes (nodePublishSecretRef, the pod's token), so the
//! first publish mounts the shared daemon and binds it, and later ones only bind. An
//! unpublish detaches the pod's bind and nothing else. NodeUnstageVolume, which kubelet
//! sends once the last pod on the node has gone, stops every shared daemon under the
//! staging path; it refuses while a pod's bind of one is still recorded.
//!
//! A rotated Secret: every pod of a PV carries the PV's one `nodePublishSecretRef`, and
//! `requiresRepublish` brings its new values to each running pod in turn. Such a republish
//! computes another KEY, but a running pod's view of its volume cannot be moved to another
//! mount, so the daemon it is bound to gets the new keys instead (re-read without a
//! remount); pods published after the rotation start from the new KEY. A daemon's keys are
//! only ever replaced by a pod bound to it, that is one that held its keys when first bound.
//!
//! Crash safety, as for a daemon of one's own: a record is written before what it
//! describes (the pod's record, with `bind_of`, before the shared mount and the bind; the
//! shared mount's record before its daemon), so a plugin that dies half-way finds both
//! again. Checking a pod's record (start-up, supervisor, a repeated publish) first brings
//! its shared mount back (adopted when live; taken over or remounted as any mount) and then
//! binds again when the pod's bind is gone or shows a dead connection (a remount leaves
//! older binds on the old one). A shared mount whose staging directory is gone (kubelet
//! removed it) is stopped like any orphan.
//!
//! Locks: a pod's target first, then its shared mount; never the other way round.

use super::{ensure_dir, foreign, taken, CheckOutcome, VolumeError, VolumeManager};
use crate::kube::access::VolumeAccess;
use crate::mounter::{DaemonCredentials, Health, MountErrorKind};
use crate::node_state::state::VolumeRecord;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// A repeated publish of `record` with other settings or another kind of identity.
fn changed(record: &VolumeRecord) -> VolumeError {
    VolumeError::AlreadyExists(format!(
        "volume {:?} is already published at {} with other settings or another identity; unpublish it before changing its attributes, mount options or role",
        record.volume_id,
        record.target.display()
    ))
}

/// Prefix of the shared mounts' directories under a staging path.
const SHARED_PREFIX: &str = "riffle-";

/// The shared mount a publish is served by, or None when it gets a daemon of its own (see
/// the module documentation).
pub(super) fn shared_path(spec: &super::PublishSpec, settings_hash: &str) -> Option<PathBuf> {
    let staging = spec.staging.as_ref()?;
    let identity: Vec<u8> = match &spec.access {
        VolumeAccess::WebIdentity { .. } => return None,
        VolumeAccess::Anonymous => b"anonymous".to_vec(),
        VolumeAccess::Node => b"node".to_vec(),
        // The whole secret, not only the key id: a pod naming someone else's key id with a
        // wrong secret must not be served by the daemon that holds the right one.
        VolumeAccess::Secret(credentials) => {
            [b"secret:".as_slice(), &credentials.to_json()].concat()
        }
    };
    let mut hasher = Sha256::new();
    hasher.update(settings_hash.as_bytes());
    hasher.update([0]);
    hasher.update(&identity);
    let digest = hasher.finalize();
    Some(staging.join(format!("{SHARED_PREFIX}{}", hex::encode(&digest[..8]))))
}

impl VolumeManager {
    /// NodeStageVolume: the staging directory exists (kubelet normally creates it). The
    /// daemon waits for the first publish, which brings the identity.
    pub async fn stage(&self, volume_id: &str, staging: &Path) -> Result<(), VolumeError> {
        let _guard = self.locks.lock(staging).await;
        ensure_dir(staging)?;
        tracing::info!(volume_id, staging = %staging.display(), "staged");
        Ok(())
    }

    /// NodeUnstageVolume: stops every shared daemon under `staging` and removes its
    /// directory, record and secrets. Refused while a pod's bind of one is recorded (kubelet
    /// unstages only after the last unpublish; a record whose pod directory is gone is an
    /// orphan and is cleaned up here instead).
    pub async fn unstage(&self, volume_id: &str, staging: &Path) -> Result<(), VolumeError> {
        let _guard = self.locks.lock(staging).await;
        let records = self.store.list()?;
        let shares: Vec<&VolumeRecord> = records
            .iter()
            .filter(|r| r.staging.as_deref() == Some(staging))
            .collect();
        for share in &shares {
            for user in records
                .iter()
                .filter(|r| r.bind_of.as_deref() == Some(share.target.as_path()))
            {
                // A pod whose volume directory is gone is an orphan: the check cleans it up.
                // Any other is still published (its mount need not be made live to say so).
                if user.target.parent().is_some_and(Path::exists) {
                    return Err(VolumeError::FailedPrecondition(format!(
                        "volume {volume_id:?} is still published at {}; unpublish it before unstaging",
                        user.target.display()
                    )));
                }
                self.check(&user.target, true).await?;
            }
        }
        for share in shares {
            let target = share.target.as_path();
            let _share_guard = self.locks.lock(target).await;
            self.mounter.unmount(target, share.daemon).await?;
            self.forget(target, true)?;
            tracing::info!(volume_id, shared = %target.display(), pid = ?share.daemon.map(|d| d.pid), "shared daemon stopped");
        }
        // Directories a plugin that died between creating one and recording it left behind.
        if let Ok(entries) = std::fs::read_dir(staging) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                if name.to_string_lossy().starts_with(SHARED_PREFIX)
                    && crate::node_state::mountinfo::mount_at(&entry.path())
                        .ok()
                        .flatten()
                        .is_none()
                {
                    let _ = std::fs::remove_dir(entry.path());
                }
            }
        }
        tracing::info!(volume_id, staging = %staging.display(), "unstaged");
        Ok(())
    }

    /// NodePublishVolume of a volume served by the shared daemon at `share`.
    pub(super) async fn publish_shared(
        &self,
        spec: super::PublishSpec,
        hash: String,
        share: PathBuf,
    ) -> Result<(), VolumeError> {
        let target = spec.target.clone();
        let _guard = self.locks.lock(&target).await;
        if let Some(record) = self.store.load(&target)? {
            if record.volume_id != spec.volume_id {
                return Err(taken(&record, &spec.volume_id));
            }
            let bound = self.bound_share(&record, &spec, &hash, &share)?;
            // A repeat: the shared mount and the bind are made live if they are not.
            self.ensure_share(Some((&spec, &hash)), &bound).await?;
            self.bind_again_if_needed(&record, &bound).await?;
            tracing::info!(volume_id = %spec.volume_id, target = %target.display(), "already published");
            return Ok(());
        }
        match self.mounter.health(&target, None).await? {
            Health::NotMounted => {}
            Health::Foreign(fs) => return Err(foreign(&target, &fs)),
            Health::Live | Health::Broken(_) => {
                tracing::warn!(target = %target.display(), "detaching a rifflefs mount this plugin has no record of");
                self.unbind(&target).await?;
            }
        }
        let created = ensure_dir(&target)?;
        let record = VolumeRecord {
            volume_id: spec.volume_id.clone(),
            target: target.clone(),
            settings: spec.settings.clone(),
            settings_hash: hash.clone(),
            has_credentials: false,
            auth: None,
            daemon: None,
            pod: spec.pod.clone(),
            bind_of: Some(share.clone()),
            staging: None,
        };
        self.store.save(&record)?;
        let bound = async {
            let daemon = self.ensure_share(Some((&spec, &hash)), &share).await?;
            self.mounter.bind(&share, &target).await?;
            Ok::<_, VolumeError>(daemon)
        }
        .await;
        match bound {
            Ok(daemon) => {
                tracing::info!(
                    volume_id = %record.volume_id,
                    target = %target.display(),
                    source = %record.settings.source_url(),
                    shared = %share.display(),
                    pid = ?daemon.map(|d| d.pid),
                    "published (a bind of the volume's shared daemon)"
                );
                Ok(())
            }
            Err(e) => {
                if let Err(se) = self.store.remove(&target) {
                    tracing::warn!(error = %se, "cannot remove state after a failed publish");
                }
                if created {
                    let _ = std::fs::remove_dir(&target);
                }
                Err(e)
            }
        }
    }

    /// The shared mount a repeated publish of the pod `record` goes to: the one it is bound
    /// to. A publish that computes another one (`share`) is refused, unless only the keys of
    /// its Secret changed: a rotation (a PV's pods all carry its one `nodePublishSecretRef`,
    /// and `requiresRepublish` brings its new values). The daemon the pod reads from then
    /// gets the new keys, which it re-reads without a remount; a running pod's view of its
    /// volume cannot be moved to another mount. A daemon's keys are thus only ever replaced
    /// by a pod bound to it, which held its keys when it was first bound.
    fn bound_share(
        &self,
        record: &VolumeRecord,
        spec: &super::PublishSpec,
        hash: &str,
        share: &Path,
    ) -> Result<PathBuf, VolumeError> {
        let Some(bound) = &record.bind_of else {
            return Err(changed(record));
        };
        if bound == share {
            return Ok(bound.clone());
        }
        let keys_only = record.settings_hash == hash
            && matches!(spec.access, VolumeAccess::Secret(_))
            && self
                .store
                .load(bound)?
                .and_then(|r| r.auth)
                .is_some_and(|a| matches!(a, DaemonCredentials::KeysFile { .. }));
        if !keys_only {
            return Err(changed(record));
        }
        tracing::info!(volume_id = %record.volume_id, target = %record.target.display(), shared = %bound.display(), "the volume's Secret changed (a rotation): the shared daemon this pod reads from gets the new keys, without a remount");
        Ok(bound.clone())
    }

    /// Makes the shared mount at `share` live and returns its daemon: adopts it, brings it
    /// back (taken over or remounted), or, with a publish to take the identity from, mounts
    /// it the first time. A publish also rewrites its secrets on the tmpfs (the same ones by
    /// construction; a node reboot clears them).
    async fn ensure_share(
        &self,
        publish: Option<(&super::PublishSpec, &str)>,
        share: &Path,
    ) -> Result<Option<crate::mounter::DaemonId>, VolumeError> {
        let _guard = self.locks.lock(share).await;
        let existing = self.store.load(share)?;
        let auth = match publish {
            Some((spec, _)) => Some(self.secrets.write(
                share,
                &spec.access,
                spec.settings.sts_endpoint_url.as_deref(),
            )?),
            None => None,
        };
        if let Some(mut record) = existing {
            if let Some(auth) = auth {
                if record.auth.as_ref() != Some(&auth) {
                    record.has_credentials = auth.uses_files();
                    record.auth = Some(auth);
                    self.store.save(&record)?;
                }
            }
            match self.revive(record).await? {
                CheckOutcome::Foreign(fs) => return Err(foreign(share, &fs)),
                CheckOutcome::Recovered(reason) => {
                    tracing::warn!(shared = %share.display(), %reason, "shared daemon brought back")
                }
                _ => {}
            }
            return Ok(self.store.load(share)?.and_then(|r| r.daemon));
        }
        let (Some((spec, hash)), Some(auth)) = (publish, auth) else {
            return Err(VolumeError::FailedPrecondition(format!(
                "the shared mount {} has no record; the next NodePublishVolume of its volume mounts it again",
                share.display()
            )));
        };
        let staging = share.parent().map(Path::to_path_buf);
        let created = ensure_dir(share)?;
        let mut record = VolumeRecord {
            volume_id: spec.volume_id.clone(),
            target: share.to_path_buf(),
            settings: spec.settings.clone(),
            settings_hash: hash.to_string(),
            has_credentials: auth.uses_files(),
            auth: Some(auth),
            daemon: None,
            pod: None,
            bind_of: None,
            staging,
        };
        self.store.save(&record)?;
        match self.mount(&record).await {
            Ok(daemon) => {
                record.daemon = daemon;
                self.store.save(&record)?;
                tracing::info!(volume_id = %record.volume_id, shared = %share.display(), pid = ?daemon.map(|d| d.pid), "shared daemon started");
                Ok(daemon)
            }
            Err(e) => {
                self.forget_failed_mount(share, created);
                Err(e.into())
            }
        }
    }

    /// Checks a pod's bind of a shared mount (see [`VolumeManager::check`]); caller holds
    /// the pod target's lock.
    pub(super) async fn check_bound(
        &self,
        record: &VolumeRecord,
        share: &Path,
    ) -> Result<CheckOutcome, VolumeError> {
        self.ensure_share(None, share).await?;
        self.bind_again_if_needed(record, share).await
    }

    /// Binds `share` at the pod's target again when the bind there is gone or shows a dead
    /// connection; the shared mount is live.
    async fn bind_again_if_needed(
        &self,
        record: &VolumeRecord,
        share: &Path,
    ) -> Result<CheckOutcome, VolumeError> {
        let target = record.target.as_path();
        let reason = match self.mounter.health(target, None).await? {
            Health::Live => return Ok(CheckOutcome::Healthy),
            Health::Foreign(fs) => return Ok(CheckOutcome::Foreign(fs)),
            Health::NotMounted => "not mounted".to_string(),
            Health::Broken(reason) => reason,
        };
        self.unbind(target).await?;
        ensure_dir(target)?;
        self.mounter.bind(share, target).await?;
        tracing::warn!(volume_id = %record.volume_id, target = %target.display(), shared = %share.display(), %reason, "bound to the shared daemon again");
        Ok(CheckOutcome::Recovered(format!(
            "{reason}; bound to the shared daemon again"
        )))
    }

    /// Detaches a pod's bind; without the mounter (its DaemonSet gone or down) the plugin
    /// detaches it itself, so that the pod still terminates.
    pub(super) async fn unbind(&self, target: &Path) -> Result<(), VolumeError> {
        match self.mounter.unbind(target).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind == MountErrorKind::Unavailable => {
                tracing::warn!(target = %target.display(), error = %e, "unbinding without the mounter: detaching the target here");
                crate::node_state::mountinfo::detach_all(target);
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }
}
