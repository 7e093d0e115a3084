//! Keeps the node cache off the node's root disk.
//!
//! The cache's hostPath is `DirectoryOrCreate`: on a node whose NVMe is not mounted at that
//! path, the directory is created on the root filesystem, the one kubelet watches for
//! `nodefs.available` (hard eviction below 10% by default). A cache filling it would get the
//! node's pods evicted, so a volume that asks for the cache (`cacheSize`) is refused there
//! unless the operator allows it (`--allow-root-disk-cache`, off by default). "Root disk"
//! means: the cache directory has the same `st_dev` as kubelet's root directory (as this
//! container sees it, `--kubelet-dir`) or as `/`. In a container `/` is the container's own
//! root and never matches; on a host it is the node's.
//!
//! The check runs at every mount that uses the cache (the NVMe may be mounted later, and the
//! refusal lands on the pod as a `FailedMount` event naming the fix) and once at start-up,
//! where it is only logged: volumes without a cache still work.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The flag that allows a cache on the root disk.
pub const ALLOW_FLAG: &str = "--allow-root-disk-cache";

/// The directories whose filesystem counts as the node's root disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootDisk {
    pub paths: Vec<PathBuf>,
}

impl RootDisk {
    /// Kubelet's root directory and `/`.
    pub fn new(kubelet_dir: &Path) -> Self {
        RootDisk {
            paths: vec![kubelet_dir.to_path_buf(), PathBuf::from("/")],
        }
    }

    /// `Err` (the one-line refusal) when `cache_dir` is on the filesystem of one of the
    /// paths. A path that does not exist (no kubelet on a workstation) is skipped; a cache
    /// directory that cannot be inspected is refused, since where it lives is unknown.
    pub fn check(&self, cache_dir: &Path) -> Result<(), String> {
        let cache = std::fs::metadata(cache_dir).map_err(|e| {
            format!(
                "cannot inspect the cache directory {}: {e}",
                cache_dir.display()
            )
        })?;
        for root in &self.paths {
            let Ok(meta) = std::fs::metadata(root) else {
                continue;
            };
            if meta.dev() == cache.dev() {
                return Err(refusal(cache_dir, root));
            }
        }
        Ok(())
    }
}

/// The refusal message: what is wrong, why it matters, and the two ways out.
pub fn refusal(cache_dir: &Path, root: &Path) -> String {
    format!(
        "the cache directory {} is on the node's root filesystem (the same as {}), where a full cache gets pods evicted (kubelet's nodefs.available threshold); mount the NVMe at the cache hostPath, or start riffle-mounter with {ALLOW_FLAG} to cache there anyway",
        cache_dir.display(),
        root.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_filesystem_is_refused_with_the_flag_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = dir.path().join("cache");
        let kubelet = dir.path().join("kubelet");
        std::fs::create_dir_all(&cache).expect("mkdir");
        std::fs::create_dir_all(&kubelet).expect("mkdir");
        let guard = RootDisk {
            paths: vec![kubelet.clone()],
        };
        let message = guard.check(&cache).expect_err("same filesystem");
        assert!(message.contains(ALLOW_FLAG), "{message}");
        assert!(message.contains(&cache.display().to_string()), "{message}");
        assert!(
            message.contains(&kubelet.display().to_string()),
            "{message}"
        );
        assert!(!message.contains('\n'));
    }

    #[test]
    fn another_filesystem_or_a_missing_root_passes() {
        let dir = tempfile::tempdir().expect("tempdir");
        // /proc is always another filesystem than a temporary directory.
        let guard = RootDisk {
            paths: vec![PathBuf::from("/proc"), dir.path().join("no-kubelet-here")],
        };
        assert_eq!(guard.check(dir.path()), Ok(()));
        let missing = dir.path().join("missing");
        assert!(
            guard.check(&missing).is_err(),
            "an unknown cache dir is refused"
        );
    }
}
