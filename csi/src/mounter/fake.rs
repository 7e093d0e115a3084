//! An in-memory [`Mounter`] for tests: no FUSE, no object store.
//!
//! A "mount" is a record in a shared map plus a marker file
//! (`FAKE_MARKER`, holding the source URL) written into the target directory
//! so that tests can "read through" the volume; unmount removes both. Daemon
//! ids are invented. Tests can make the next mount fail, delay mounts (to
//! exercise concurrency), and "kill" a daemon so the target reports
//! [`Health::Broken`] as a dead FUSE daemon would. Clones share state, so a
//! "restarted plugin" built with a clone sees the same mounts.

use crate::mounter::{DaemonId, Health, MountError, MountRequest, Mounter};
use async_trait::async_trait;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Name of the marker file a fake mount writes into its target.
pub const FAKE_MARKER: &str = ".riffle-fake-mount";

/// One fake mount.
#[derive(Debug, Clone)]
pub struct FakeMount {
    pub source: String,
    pub daemon: DaemonId,
    pub alive: bool,
    /// The `riffle mount` flags that would have been passed.
    pub flags: Vec<String>,
    /// Names (not values) of the environment variables that would have been
    /// set for the daemon.
    pub env_names: Vec<String>,
    /// How the daemon would have authenticated (paths and names only).
    pub auth: crate::mounter::DaemonCredentials,
    /// The variables of `auth` that would have been set, with their values
    /// (paths, a role, a session name: no secrets).
    pub auth_env: Vec<(String, String)>,
    /// For a bind ([`Mounter::bind`]): the mount it shows. It is live while that mount is
    /// live and served by the same daemon (a remount leaves the bind on the old one).
    pub bind_of: Option<PathBuf>,
}

#[derive(Default)]
struct Inner {
    mounts: HashMap<PathBuf, FakeMount>,
    fail_next: Vec<MountError>,
    delay: Duration,
}

/// The fake mounter. Clones share state.
#[derive(Clone, Default)]
pub struct FakeMounter {
    inner: Arc<Mutex<Inner>>,
    next_pid: Arc<AtomicI32>,
    mount_calls: Arc<AtomicUsize>,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
}

impl FakeMounter {
    pub fn new() -> Self {
        let me = Self::default();
        me.next_pid.store(100_000, Ordering::SeqCst);
        me
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock poisons it; the data is still fine
        // for a test double.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes the next mount fail with `err`.
    pub fn fail_next(&self, err: MountError) {
        self.lock().fail_next.push(err);
    }

    /// Makes every mount take `delay`.
    pub fn set_delay(&self, delay: Duration) {
        self.lock().delay = delay;
    }

    /// Simulates the daemon at `target` dying (SIGKILL).
    pub fn kill(&self, target: &Path) -> bool {
        match self.lock().mounts.get_mut(target) {
            Some(m) => {
                m.alive = false;
                true
            }
            None => false,
        }
    }

    /// The mount at `target`, if any.
    pub fn mount_at(&self, target: &Path) -> Option<FakeMount> {
        self.lock().mounts.get(target).cloned()
    }

    /// Number of mounts currently present.
    pub fn mount_count(&self) -> usize {
        self.lock().mounts.len()
    }

    /// Number of daemons the mounts present are served by (binds share their daemon).
    pub fn daemon_count(&self) -> usize {
        self.lock()
            .mounts
            .values()
            .filter(|m| m.bind_of.is_none())
            .count()
    }

    /// Total number of mount calls so far (successful or not).
    pub fn mount_calls(&self) -> usize {
        self.mount_calls.load(Ordering::SeqCst)
    }

    /// The largest number of mount calls that ran at the same time.
    pub fn max_concurrent_mounts(&self) -> usize {
        self.max_in_flight.load(Ordering::SeqCst)
    }
}

struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Whether `m`, if a bind, still shows a live mount of the same daemon.
fn bind_is_live(mounts: &HashMap<PathBuf, FakeMount>, m: &FakeMount) -> bool {
    match &m.bind_of {
        None => true,
        Some(source) => mounts
            .get(source)
            .is_some_and(|s| s.alive && s.daemon == m.daemon),
    }
}

#[async_trait]
impl Mounter for FakeMounter {
    async fn mount(&self, req: MountRequest<'_>) -> Result<Option<DaemonId>, MountError> {
        self.mount_calls.fetch_add(1, Ordering::SeqCst);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        let _guard = InFlight(&self.in_flight);
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let (delay, failure) = {
            let mut inner = self.lock();
            let failure = if inner.fail_next.is_empty() {
                None
            } else {
                Some(inner.fail_next.remove(0))
            };
            (inner.delay, failure)
        };
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if let Some(err) = failure {
            return Err(err);
        }
        let source = req.settings.source_url();
        std::fs::write(req.target.join(FAKE_MARKER), &source).map_err(|e| {
            MountError::new(
                crate::mounter::MountErrorKind::FailedPrecondition,
                format!("fake mount cannot write into {}: {e}", req.target.display()),
            )
        })?;
        let daemon = DaemonId {
            pid: self.next_pid.fetch_add(1, Ordering::SeqCst),
            start_time: 1,
        };
        let flags = req
            .settings
            .flags(None)
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let auth_env: Vec<(String, String)> = req
            .auth
            .env()
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k.to_string(), v)))
            .collect();
        let env_names: Vec<String> = auth_env.iter().map(|(k, _)| k.clone()).collect();
        std::fs::write(req.pid_file, daemon.pid.to_string()).ok();
        self.lock().mounts.insert(
            req.target.to_path_buf(),
            FakeMount {
                source,
                daemon,
                alive: true,
                flags,
                env_names,
                auth: req.auth.clone(),
                auth_env,
                bind_of: None,
            },
        );
        Ok(Some(daemon))
    }

    async fn unmount(&self, target: &Path, _daemon: Option<DaemonId>) -> Result<(), MountError> {
        if self.lock().mounts.remove(target).is_some() {
            let _ = std::fs::remove_file(target.join(FAKE_MARKER));
        }
        Ok(())
    }

    async fn health(&self, target: &Path, _daemon: Option<DaemonId>) -> Result<Health, MountError> {
        let inner = self.lock();
        Ok(match inner.mounts.get(target) {
            None => Health::NotMounted,
            Some(m) if m.alive && bind_is_live(&inner.mounts, m) => Health::Live,
            Some(_) => Health::Broken("transport endpoint is not connected".into()),
        })
    }

    async fn bind(&self, source: &Path, target: &Path) -> Result<(), MountError> {
        let mut inner = self.lock();
        let Some(shown) = inner.mounts.get(source).filter(|m| m.alive).cloned() else {
            return Err(MountError::new(
                crate::mounter::MountErrorKind::Internal,
                format!("fake bind: nothing live at {}", source.display()),
            ));
        };
        std::fs::write(target.join(FAKE_MARKER), &shown.source).map_err(|e| {
            MountError::new(
                crate::mounter::MountErrorKind::FailedPrecondition,
                format!("fake bind cannot write into {}: {e}", target.display()),
            )
        })?;
        inner.mounts.insert(
            target.to_path_buf(),
            FakeMount {
                bind_of: Some(source.to_path_buf()),
                ..shown
            },
        );
        Ok(())
    }

    async fn unbind(&self, target: &Path) -> Result<(), MountError> {
        self.unmount(target, None).await
    }

    async fn daemon_from_pid_file(&self, pid_file: &Path) -> Option<DaemonId> {
        let pid: i32 = std::fs::read_to_string(pid_file)
            .ok()?
            .trim()
            .parse()
            .ok()?;
        self.lock()
            .mounts
            .values()
            .find(|m| m.daemon.pid == pid && m.alive)
            .map(|m| m.daemon)
    }
}
