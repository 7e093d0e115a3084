//! One async mutex per target path, so that operations on the same target
//! (a publish retried by kubelet, an unpublish, the supervisor's recovery)
//! run one at a time while different targets proceed in parallel.
//!
//! The map holds `Weak` references: a target's mutex lives only while some
//! operation holds or waits for it, and dead entries are pruned when new
//! ones are created, so the map does not grow with every target ever seen.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// Per-key async locks.
#[derive(Default)]
pub struct KeyedLocks {
    map: Mutex<HashMap<PathBuf, Weak<AsyncMutex<()>>>>,
}

impl KeyedLocks {
    fn entry(&self, key: &Path) -> Arc<AsyncMutex<()>> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(existing) = map.get(key).and_then(Weak::upgrade) {
            return existing;
        }
        map.retain(|_, w| w.strong_count() > 0);
        let fresh = Arc::new(AsyncMutex::new(()));
        map.insert(key.to_path_buf(), Arc::downgrade(&fresh));
        fresh
    }

    /// Waits for and takes the lock of `key`.
    pub async fn lock(&self, key: &Path) -> OwnedMutexGuard<()> {
        self.entry(key).lock_owned().await
    }

    /// Takes the lock of `key` if it is free.
    pub fn try_lock(&self, key: &Path) -> Option<OwnedMutexGuard<()>> {
        self.entry(key).try_lock_owned().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn same_key_excludes_other_keys_do_not() {
        let locks = KeyedLocks::default();
        let a = locks.lock(Path::new("/a")).await;
        assert!(locks.try_lock(Path::new("/a")).is_none());
        assert!(locks.try_lock(Path::new("/b")).is_some());
        drop(a);
        assert!(locks.try_lock(Path::new("/a")).is_some());
    }
}
