//! Per-volume state persisted in the state directory, so that a restarted
//! plugin knows what it had published.
//!
//! Layout (the directory and its subdirectories are mode 0700, files 0600):
//! ```text
//! STATE/volumes/KEY.json   VolumeRecord: volume id, target, settings, settings
//!                          hash, how the daemon authenticates (paths and
//!                          names, no values), daemon pid + start time; for a
//!                          pod served by a shared daemon, the shared mount
//!                          it binds; for a shared mount, its staging path.
//! STATE/run/KEY.pid        pid file written by the mount daemon
//! STATE/logs/KEY.log       the mount daemon's log
//! ```
//! KEY is a hash of the target path (targets are unique per publish).
//!
//! No secret is ever written here: the state directory is on the node's
//! disk. Keys and tokens live on a tmpfs ([`crate::node_state::secrets`]). Every write
//! goes to a temporary file in the same directory, is fsynced and renamed
//! over the old one, so a crash leaves either the old or the new record,
//! never half of one.

use crate::kube::settings::VolumeSettings;
use crate::mounter::{DaemonCredentials, DaemonId};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A state-directory failure.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("state directory {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("corrupt state file {path}: {source}")]
    Corrupt {
        path: PathBuf,
        source: serde_json::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StateError + '_ {
    move |source| StateError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What the plugin remembers about one published target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub volume_id: String,
    pub target: PathBuf,
    pub settings: VolumeSettings,
    pub settings_hash: String,
    /// Whether the volume has credentials of its own (a Secret or a role);
    /// kept for plugins before [`VolumeRecord::auth`].
    pub has_credentials: bool,
    /// How the daemon authenticates. None in records of earlier plugins:
    /// keys in the daemon's environment if `has_credentials`, else the
    /// node's identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<DaemonCredentials>,
    /// The daemon serving the mount; None while the mount is being made.
    pub daemon: Option<DaemonId>,
    /// The pod it was published for, `namespace/name` (kubelet's pod info), when known: a
    /// label of the volume's metrics ([`crate::mounter::metrics`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// A pod's target served by a shared daemon: the shared mount it is a bind of
    /// (see [`crate::volumes`]). Such a record has no daemon and no secrets of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bind_of: Option<PathBuf>,
    /// A shared daemon's mount: the staging path (NodeStageVolume) it lives under, which
    /// NodeUnstageVolume clears.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staging: Option<PathBuf>,
}

/// The state directory.
#[derive(Debug, Clone)]
pub struct StateStore {
    root: PathBuf,
}

const SUBDIRS: [&str; 3] = ["volumes", "run", "logs"];

impl StateStore {
    /// Opens (creating if needed) the state directory.
    pub fn open(root: &Path) -> Result<Self, StateError> {
        for dir in std::iter::once(root.to_path_buf()).chain(SUBDIRS.iter().map(|d| root.join(d))) {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .map_err(io_err(&dir))?;
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).map_err(io_err(&dir))?;
        }
        Ok(Self {
            root: root.to_path_buf(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file-name key of a target path.
    pub fn key(target: &Path) -> String {
        use std::os::unix::ffi::OsStrExt;
        let digest = Sha256::digest(target.as_os_str().as_bytes());
        hex::encode(&digest[..16])
    }

    fn record_path(&self, target: &Path) -> PathBuf {
        self.root
            .join("volumes")
            .join(format!("{}.json", Self::key(target)))
    }

    /// Where the daemon for `target` writes its pid.
    pub fn pid_file(&self, target: &Path) -> PathBuf {
        self.root
            .join("run")
            .join(format!("{}.pid", Self::key(target)))
    }

    /// Where the daemon for `target` writes its log.
    pub fn log_file(&self, target: &Path) -> PathBuf {
        self.root
            .join("logs")
            .join(format!("{}.log", Self::key(target)))
    }

    /// The record for `target`, if any.
    pub fn load(&self, target: &Path) -> Result<Option<VolumeRecord>, StateError> {
        let path = self.record_path(target);
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| StateError::Corrupt { path, source }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(&path)(e)),
        }
    }

    /// Writes `record` atomically.
    pub fn save(&self, record: &VolumeRecord) -> Result<(), StateError> {
        let path = self.record_path(&record.target);
        let bytes = serde_json::to_vec_pretty(record).map_err(|source| StateError::Corrupt {
            path: path.clone(),
            source,
        })?;
        write_atomic(&path, &bytes)
    }

    /// Every record in the store. Unreadable files are logged and skipped
    /// (they are moved aside so that they are not read again).
    pub fn list(&self) -> Result<Vec<VolumeRecord>, StateError> {
        let dir = self.root.join("volumes");
        let mut out = Vec::new();
        for entry in fs::read_dir(&dir).map_err(io_err(&dir))? {
            let path = entry.map_err(io_err(&dir))?.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            match fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<VolumeRecord>(&b).map_err(|e| e.to_string()))
            {
                Ok(r) => out.push(r),
                Err(e) => {
                    tracing::error!(path = %path.display(), error = %e, "skipping unreadable volume record");
                    let _ = fs::rename(&path, path.with_extension("corrupt"));
                }
            }
        }
        out.sort_by(|a, b| a.target.cmp(&b.target));
        Ok(out)
    }

    /// Deletes everything stored for `target`.
    pub fn remove(&self, target: &Path) -> Result<(), StateError> {
        for path in [
            self.record_path(target),
            self.pid_file(target),
            self.log_file(target),
        ] {
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(&path)(e)),
            }
        }
        Ok(())
    }
}

/// Writes `bytes` to `path` through a 0600 temporary file, fsync and rename.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StateError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    // tempfile creates the file with mode 0600.
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io_err(dir))?;
    tmp.write_all(bytes).map_err(io_err(path))?;
    tmp.as_file().sync_all().map_err(io_err(path))?;
    tmp.persist(path).map_err(|e| io_err(path)(e.error))?;
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn record(target: &str) -> VolumeRecord {
        let attrs: HashMap<String, String> = [("bucket".to_string(), "abc".to_string())].into();
        let settings = VolumeSettings::parse(&attrs, &[]).expect("valid");
        VolumeRecord {
            volume_id: "vol".into(),
            target: target.into(),
            settings_hash: settings.digest("vol"),
            settings,
            has_credentials: true,
            auth: Some(DaemonCredentials::KeysFile {
                path: "/run/riffle-csi/k/keys.json".into(),
            }),
            daemon: Some(DaemonId {
                pid: 42,
                start_time: 7,
            }),
            pod: Some("ml/trainer-0".into()),
            bind_of: None,
            staging: None,
        }
    }

    #[test]
    fn save_load_list_remove() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = StateStore::open(&dir.path().join("state")).expect("open");
        let r = record("/var/lib/kubelet/pods/x/volumes/kubernetes.io~csi/v/mount");
        store.save(&r).expect("save");
        assert_eq!(store.load(&r.target).expect("load"), Some(r.clone()));
        assert_eq!(store.list().expect("list"), vec![r.clone()]);
        store.remove(&r.target).expect("remove");
        assert_eq!(store.load(&r.target).expect("load"), None);
        assert!(store.list().expect("list").is_empty());
    }

    #[test]
    fn records_of_earlier_plugins_still_load() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = StateStore::open(dir.path()).expect("open");
        let mut r = record("/old");
        r.auth = None;
        let mut json: serde_json::Value = serde_json::to_value(&r).expect("json");
        json.as_object_mut().expect("object").remove("auth");
        fs::write(
            store.record_path(&r.target),
            serde_json::to_vec(&json).expect("bytes"),
        )
        .expect("write");
        assert_eq!(store.load(&r.target).expect("load"), Some(r));
        assert!(
            !dir.path().join("secrets").exists(),
            "no secrets dir on disk"
        );
    }

    #[test]
    fn corrupt_records_are_skipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = StateStore::open(dir.path()).expect("open");
        fs::write(dir.path().join("volumes/bad.json"), b"{not json").expect("write");
        store.save(&record("/ok")).expect("save");
        assert_eq!(store.list().expect("list").len(), 1);
        assert!(dir.path().join("volumes/bad.corrupt").exists());
    }
}
