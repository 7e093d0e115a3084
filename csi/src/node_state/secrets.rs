//! Volume secrets on a tmpfs: the only place a key or a token is written.
//!
//! Layout (directories 0700, files 0600, root-owned):
//! ```text
//! SECRETS/KEY/keys.json   the volume's Secret: what the daemon reads
//!                         (RIFFLE_CREDENTIALS_FILE) and what a restarted
//!                         plugin remounts a dead daemon with
//! SECRETS/KEY/token       the pod's service account token (web identity:
//!                         AWS_WEB_IDENTITY_TOKEN_FILE)
//! ```
//! KEY is the target's key in the state directory ([`StateStore::key`]).
//! SECRETS is `--secrets-dir` (default `/run/riffle-csi`, a hostPath shared
//! with riffle-mounter at the same path). At start the plugin makes sure it
//! is a tmpfs (or ramfs): if it is not, the plugin mounts a small tmpfs
//! there itself, so a secret never reaches a disk; so they are gone at a
//! node reboot, and removed at unpublish. They survive a restart of the
//! plugin, which needs them to remount a dead daemon (kubelet sends secrets
//! only with NodePublishVolume).
//!
//! Every write goes to a temporary file in the same directory and is renamed
//! over the old file: a daemon reading it (at its next credential refresh)
//! sees the old or the new content, never half of one. This is how a
//! republish (the CSIDriver's `requiresRepublish`) hands a running daemon a
//! fresh token or rotated keys without a remount.

use crate::kube::access::VolumeAccess;
use crate::kube::credentials::Credentials;
use crate::mounter::DaemonCredentials;
use crate::node_state::state::StateStore;
use secrecy::ExposeSecret;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// `statfs` f_type of tmpfs and ramfs.
const TMPFS_MAGIC: i64 = 0x0102_1994;
const RAMFS_MAGIC: i64 = 0x8584_58f6;

/// Size of the tmpfs the plugin mounts when the directory is on disk.
const TMPFS_SIZE: &str = "16m";

/// A failure of the secrets directory. Messages name paths, never values.
#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    #[error("secrets directory {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("secrets directory {path} is not on a tmpfs and mounting one there failed ({source}); point --secrets-dir (RIFFLE_CSI_SECRETS_DIR) at a tmpfs such as /run/riffle-csi")]
    NotTmpfs { path: PathBuf, source: nix::Error },
    #[error("the stored credentials {path} are unreadable")]
    Corrupt { path: PathBuf },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> SecretsError + '_ {
    move |source| SecretsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Whether `path` is on a tmpfs or ramfs.
pub fn is_tmpfs(path: &Path) -> Result<bool, SecretsError> {
    let stat = nix::sys::statfs::statfs(path).map_err(|e| SecretsError::Io {
        path: path.to_path_buf(),
        source: e.into(),
    })?;
    // f_type's integer type differs between targets.
    #[allow(clippy::unnecessary_cast)]
    let kind = stat.filesystem_type().0 as i64;
    Ok(kind == TMPFS_MAGIC || kind == RAMFS_MAGIC)
}

/// The tmpfs holding every volume's secrets. See the module documentation.
#[derive(Debug, Clone)]
pub struct SecretStore {
    root: PathBuf,
}

impl SecretStore {
    /// Opens `root` (creating it, 0700), mounting a tmpfs on it if it is not
    /// on one already.
    pub fn open(root: &Path) -> Result<Self, SecretsError> {
        create_dir(root)?;
        if !is_tmpfs(root)? {
            let options = format!("mode=0700,size={TMPFS_SIZE}");
            nix::mount::mount(
                Some("tmpfs"),
                root,
                Some("tmpfs"),
                nix::mount::MsFlags::MS_NOSUID
                    | nix::mount::MsFlags::MS_NODEV
                    | nix::mount::MsFlags::MS_NOEXEC,
                Some(options.as_str()),
            )
            .map_err(|source| SecretsError::NotTmpfs {
                path: root.to_path_buf(),
                source,
            })?;
            tracing::info!(dir = %root.display(), "mounted a tmpfs for volume secrets");
        }
        fs::set_permissions(root, fs::Permissions::from_mode(0o700)).map_err(io_err(root))?;
        Ok(Self {
            root: root.to_path_buf(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn dir(&self, target: &Path) -> PathBuf {
        self.root.join(StateStore::key(target))
    }

    /// Where the daemon of `target` reads its keys.
    pub fn keys_file(&self, target: &Path) -> PathBuf {
        self.dir(target).join("keys.json")
    }

    /// Where the daemon of `target` reads its web identity token.
    pub fn token_file(&self, target: &Path) -> PathBuf {
        self.dir(target).join("token")
    }

    /// What the daemon of `target` is given for `access` (the files are
    /// those [`SecretStore::write`] writes).
    pub fn auth_for(
        &self,
        target: &Path,
        access: &VolumeAccess,
        sts_endpoint_url: Option<&str>,
    ) -> DaemonCredentials {
        match access {
            VolumeAccess::Node => DaemonCredentials::Node,
            VolumeAccess::Anonymous => DaemonCredentials::Anonymous,
            VolumeAccess::Secret(_) => DaemonCredentials::KeysFile {
                path: self.keys_file(target),
            },
            VolumeAccess::WebIdentity {
                role_arn,
                session_name,
                ..
            } => DaemonCredentials::WebIdentity {
                role_arn: role_arn.clone(),
                token_file: self.token_file(target),
                session_name: session_name.clone(),
                sts_endpoint_url: sts_endpoint_url.map(str::to_string),
            },
        }
    }

    /// Writes the secrets of `access` for `target` (replacing what was
    /// there, atomically) and returns what the daemon is to be given.
    pub fn write(
        &self,
        target: &Path,
        access: &VolumeAccess,
        sts_endpoint_url: Option<&str>,
    ) -> Result<DaemonCredentials, SecretsError> {
        match access {
            VolumeAccess::Node | VolumeAccess::Anonymous => self.remove(target)?,
            VolumeAccess::Secret(creds) => {
                create_dir(&self.dir(target))?;
                write_atomic(&self.keys_file(target), &creds.to_json())?;
                remove_file(&self.token_file(target))?;
            }
            VolumeAccess::WebIdentity { token, .. } => {
                create_dir(&self.dir(target))?;
                write_atomic(&self.token_file(target), token.expose_secret().as_bytes())?;
                remove_file(&self.keys_file(target))?;
            }
        }
        Ok(self.auth_for(target, access, sts_endpoint_url))
    }

    /// Whether the files `auth` names are present (they are not after a
    /// node reboot until kubelet publishes again).
    pub fn present(&self, auth: &DaemonCredentials) -> bool {
        match auth {
            DaemonCredentials::Node | DaemonCredentials::Anonymous => true,
            DaemonCredentials::KeysFile { path } => path.is_file(),
            DaemonCredentials::WebIdentity { token_file, .. } => token_file.is_file(),
        }
    }

    /// The stored keys of `target` (to scrub messages of a remount).
    pub fn load_keys(&self, target: &Path) -> Result<Option<Credentials>, SecretsError> {
        let path = self.keys_file(target);
        match fs::read(&path) {
            Ok(bytes) => Credentials::from_json(&bytes)
                .map(Some)
                .map_err(|_| SecretsError::Corrupt { path }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(&path)(e)),
        }
    }

    /// Deletes every secret of `target`.
    pub fn remove(&self, target: &Path) -> Result<(), SecretsError> {
        let dir = self.dir(target);
        match fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err(&dir)(e)),
        }
    }

    /// Deletes the secrets of every target `store` has no record of (a
    /// plugin that died between writing them and writing the record, or
    /// after forgetting the record). Returns how many were deleted.
    pub fn prune(&self, store: &StateStore) -> Result<usize, SecretsError> {
        let records = store.list().map_err(|e| SecretsError::Io {
            path: store.root().to_path_buf(),
            source: io::Error::other(e.to_string()),
        })?;
        let keep: std::collections::HashSet<String> =
            records.iter().map(|r| StateStore::key(&r.target)).collect();
        let mut pruned = 0;
        for entry in fs::read_dir(&self.root).map_err(io_err(&self.root))? {
            let path = entry.map_err(io_err(&self.root))?.path();
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if keep.contains(&name) {
                continue;
            }
            let removed = if path.is_dir() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            match removed {
                Ok(()) => pruned += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(&path)(e)),
            }
        }
        Ok(pruned)
    }
}

fn create_dir(dir: &Path) -> Result<(), SecretsError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_err(dir))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(io_err(dir))
}

fn remove_file(path: &Path) -> Result<(), SecretsError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err(path)(e)),
        _ => Ok(()),
    }
}

/// Writes `bytes` to `path` through a 0600 temporary file in the same
/// directory and a rename (no fsync: a tmpfs has no disk to reach).
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), SecretsError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    // tempfile creates the file with mode 0600.
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io_err(dir))?;
    tmp.write_all(bytes).map_err(io_err(path))?;
    tmp.persist(path).map_err(|e| io_err(path)(e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::access::{AccessPolicy, TOKENS_KEY};
    use crate::kube::settings::VolumeSettings;
    use std::collections::HashMap;
    use std::os::unix::fs::MetadataExt;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn web_identity(token: &str) -> VolumeAccess {
        let settings = VolumeSettings::parse(
            &map(&[("bucket", "abc"), ("roleArn", "arn:aws:iam::1:role/r")]),
            &[],
        )
        .expect("valid");
        let tokens = format!(r#"{{"sts.amazonaws.com":{{"token":"{token}"}}}}"#);
        VolumeAccess::resolve(
            &settings,
            None,
            &map(&[(TOKENS_KEY, &tokens)]),
            &AccessPolicy::default(),
        )
        .expect("ok")
    }

    fn shm_dir() -> tempfile::TempDir {
        tempfile::tempdir_in("/dev/shm").expect("a tmpfs at /dev/shm")
    }

    #[test]
    fn a_token_is_replaced_in_place_and_removed() {
        let dir = shm_dir();
        let store = SecretStore::open(&dir.path().join("secrets")).expect("open");
        assert!(is_tmpfs(store.root()).expect("statfs"));
        let target = Path::new("/pods/a/mount");
        let auth = store
            .write(target, &web_identity("TOKENONE"), Some("http://sts:1"))
            .expect("write");
        let DaemonCredentials::WebIdentity {
            token_file,
            sts_endpoint_url,
            ..
        } = &auth
        else {
            panic!("{auth:?}")
        };
        assert_eq!(sts_endpoint_url.as_deref(), Some("http://sts:1"));
        assert_eq!(fs::read_to_string(token_file).expect("read"), "TOKENONE");
        let meta = fs::metadata(token_file).expect("stat");
        assert_eq!(meta.mode() & 0o777, 0o600);
        let ino = meta.ino();
        let again = store
            .write(target, &web_identity("TOKENTWO"), Some("http://sts:1"))
            .expect("rewrite");
        assert_eq!(again, auth, "same file, same environment");
        assert_eq!(fs::read_to_string(token_file).expect("read"), "TOKENTWO");
        assert_ne!(
            fs::metadata(token_file).expect("stat").ino(),
            ino,
            "renamed over"
        );
        assert!(store.present(&auth));
        store.remove(target).expect("remove");
        assert!(!store.present(&auth));
        assert_eq!(fs::read_dir(store.root()).expect("ls").count(), 0);
    }

    #[test]
    fn keys_round_trip_and_secrets_of_unrecorded_targets_are_pruned() {
        let dir = shm_dir();
        let state_dir = tempfile::tempdir().expect("tempdir");
        let state = StateStore::open(state_dir.path()).expect("state");
        let store = SecretStore::open(&dir.path().join("secrets")).expect("open");
        let attrs = map(&[("bucket", "abc")]);
        let settings = VolumeSettings::parse(&attrs, &[]).expect("valid");
        let target = PathBuf::from("/pods/b/mount");
        state
            .save(&crate::node_state::state::VolumeRecord {
                volume_id: "v".into(),
                target: target.clone(),
                settings_hash: settings.digest("v"),
                settings,
                has_credentials: true,
                auth: None,
                daemon: None,
                pod: None,
                bind_of: None,
                staging: None,
            })
            .expect("save");
        let creds = Credentials::from_secrets(&map(&[
            ("accessKeyId", "AKIDKEYS"),
            ("secretAccessKey", "SECRETKEYS"),
        ]))
        .expect("ok")
        .expect("some");
        store
            .write(&target, &VolumeAccess::Secret(creds.clone()), None)
            .expect("write");
        // Secrets of a target without a record (a plugin that died before
        // writing it) are pruned; the recorded target's stay.
        store
            .write(Path::new("/pods/gone/mount"), &web_identity("ORPHAN"), None)
            .expect("write");
        assert_eq!(store.prune(&state).expect("prune"), 1);
        assert!(store.keys_file(&target).is_file());
        assert!(!store.token_file(Path::new("/pods/gone/mount")).exists());
        let back = store.load_keys(&target).expect("load").expect("some");
        assert_eq!(back.env(), creds.env());
    }

    #[test]
    fn a_directory_on_disk_gets_a_tmpfs() {
        // Needs CAP_SYS_ADMIN, as the plugin has; the tests run as root.
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("secrets");
        fs::create_dir(&root).expect("mkdir");
        if is_tmpfs(&root).expect("statfs") {
            panic!(
                "{} is already a tmpfs: this test needs a disk-backed TMPDIR",
                root.display()
            );
        }
        let store = SecretStore::open(&root).expect("open mounts a tmpfs");
        assert!(is_tmpfs(store.root()).expect("statfs"));
        // Opening again (a restarted plugin) keeps the tmpfs and its files.
        store
            .write(Path::new("/t"), &web_identity("KEEP"), None)
            .expect("write");
        let again = SecretStore::open(&root).expect("reopen");
        assert_eq!(
            fs::read_to_string(again.token_file(Path::new("/t"))).expect("read"),
            "KEEP"
        );
        nix::mount::umount2(&root, nix::mount::MntFlags::MNT_DETACH).expect("umount");
    }
}
