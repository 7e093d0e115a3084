//! Passthrough backing files held idle after the last close, so reopening a cached file is answered
//! from memory.
//!
//! Handing a file to the kernel for passthrough costs the daemon an `open` of the cache's data
//! file, a `fstat`/`SEEK_HOLE` check and a `FUSE_DEV_IOC_BACKING_OPEN` ioctl, all on a blocking
//! thread behind a tokio hop. A training epoch opens every file once, so without this table
//! each epoch pays that for every file, and for small files (W1) it costs more than the read.
//!
//! The table keeps, per cache entry (one object version, so one inode), the backing id of its
//! last passthrough open, or one opened ahead by `preopen` when the object became complete in
//! the cache, together with the ETag it belongs to. While kept:
//! - an open of the same object at the same ETag reuses the backing id; the FUSE thread
//!   answers it without a tokio task (see `Opener::open_now` in `super::open`);
//! - an open at another ETag (the object changed) drops the kept one: a changed object never
//!   reuses the old version's bytes;
//! - the cache may still evict the entry (a kept file is not pinned, so the eviction policy
//!   is not constrained); the cache then tells the FUSE layer, which drops the idle backing
//!   here, so the kernel lets go of the deleted file and its blocks are freed.
//!
//! Bound: at most `max_entries` entries, the least recently opened dropped first. Each costs
//! the kernel [`KERNEL_BYTES_PER_BACKING`] (the data file's open file, inode and dentry, which
//! it cannot reclaim while the file is registered) and this table about 200 bytes (the key,
//! the ETag's handle, the recency order and the [`KernelBacking`] with fuser's handle; the
//! data file is named by its nonce, not by a path: 130 bytes less). An open of a cached file
//! whose backing is not kept registers its data file again, on a task (a file `open`, a check
//! for holes and the `FUSE_DEV_IOC_BACKING_OPEN` ioctl): W7's warm epoch of 100,000 small
//! files took 113-143 µs of the daemon's CPU per file with 65,536 kept, 64-94 µs with every
//! file kept. So the bound follows the memory the process may use
//! ([`idle_backings_within`], `--max-idle-backings auto`): a sixteenth of it, at
//! [`KERNEL_BYTES_PER_BACKING`] a file, is 65,536 files in 4 GiB and ImageNet's 1.28 million in
//! 80 GiB, the pinned memory growing only as an epoch opens more files.
//!
//! What the table keeps is a [`KernelBacking`]: a backing id opened ahead (raw, closed here
//! with `FUSE_DEV_IOC_BACKING_CLOSE` if never used) or one fuser made in an open's reply.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use fuser::{BackingId, ReplyOpen};
use parking_lot::Mutex;

/// Kernel memory one kept backing file pins: 3-4 KiB measured (slab after dropping caches,
/// 81 MiB with none kept, 356-360 MiB with 65,536, W7's small files).
pub const KERNEL_BYTES_PER_BACKING: u64 = 4096;
/// `--max-idle-backings auto` lets kept backing files pin at most this share (1/N) of the
/// memory the process may use.
const AUTO_SHARE_OF_MEMORY: u64 = 16;
/// Kept backing files at most, whatever the option says.
pub const MAX_IDLE_BACKINGS: u32 = 1 << 24;

/// The bound `--max-idle-backings auto` sets for a process that may use `memory` bytes (its
/// memory cgroup's limit or the machine's memory): a sixteenth of it at
/// [`KERNEL_BYTES_PER_BACKING`] each, at most [`MAX_IDLE_BACKINGS`].
pub fn idle_backings_within(memory: u64) -> usize {
    (memory / AUTO_SHARE_OF_MEMORY / KERNEL_BYTES_PER_BACKING).min(MAX_IDLE_BACKINGS as u64)
        as usize
}

/// Registers files with the kernel as backing files: an open's reply in the adapter (fuser
/// makes backing ids only through one), a stand-in in tests (no `/dev/fuse` needed).
pub(super) trait Register: Sync {
    /// A new backing id for `file`.
    fn open_backing(&self, file: &std::fs::File) -> std::io::Result<BackingId>;

    /// fuser's handle of raw backing id `id`, which closes it when dropped.
    ///
    /// # Safety
    /// `id` was opened on this session's device and is open, and nothing else closes it.
    unsafe fn wrap_backing(&self, id: u32) -> BackingId;
}

impl Register for ReplyOpen {
    fn open_backing(&self, file: &std::fs::File) -> std::io::Result<BackingId> {
        ReplyOpen::open_backing(self, file)
    }

    unsafe fn wrap_backing(&self, id: u32) -> BackingId {
        // SAFETY: as the caller promises.
        unsafe { ReplyOpen::wrap_backing(self, id) }
    }
}

/// See the module documentation. `K` is the cache entry key, `B` the backing id handle
/// (generic so the policy is testable without a kernel).
pub struct IdleBackings<K, B> {
    inner: Mutex<Inner<K, B>>,
    max_entries: usize,
    /// How many are kept, for the stats.
    gauge: Arc<AtomicU64>,
}

struct Kept<B> {
    etag: Arc<str>,
    backing: B,
    stamp: u64,
}

struct Inner<K, B> {
    by_key: HashMap<K, Kept<B>>,
    /// Recency: stamp of the last use → key.
    order: BTreeMap<u64, K>,
    next_stamp: u64,
}

impl<K: Hash + Eq + Clone, B: Clone> IdleBackings<K, B> {
    /// At most `max_entries`; `gauge` always holds how many are kept.
    pub fn new(max_entries: usize, gauge: Arc<AtomicU64>) -> Self {
        gauge.store(0, Ordering::Relaxed);
        IdleBackings {
            inner: Mutex::new(Inner {
                by_key: HashMap::new(),
                order: BTreeMap::new(),
                next_stamp: 0,
            }),
            max_entries,
            gauge,
        }
    }

    fn count(&self, inner: &Inner<K, B>) {
        self.gauge
            .store(inner.by_key.len() as u64, Ordering::Relaxed);
    }

    /// The backing kept for `key` if it belongs to version `etag` (and marks it recently used);
    /// a idle backing of another version is dropped.
    pub fn get(&self, key: &K, etag: &str) -> Option<B> {
        let mut inner = self.inner.lock();
        let inner = &mut *inner;
        let kept = inner.by_key.get_mut(key)?;
        if &*kept.etag != etag {
            inner.remove(key);
            self.count(inner);
            return None;
        }
        inner.order.remove(&kept.stamp);
        kept.stamp = inner.next_stamp;
        inner.next_stamp += 1;
        inner.order.insert(kept.stamp, key.clone());
        Some(kept.backing.clone())
    }

    /// The backing kept for `key` if it belongs to version `etag`, without marking it used.
    pub fn peek(&self, key: &K, etag: &str) -> Option<B> {
        self.inner
            .lock()
            .by_key
            .get(key)
            .filter(|k| &*k.etag == etag)
            .map(|k| k.backing.clone())
    }

    /// Whether a backing of version `etag` is kept for `key` (without marking it used).
    pub fn contains(&self, key: &K, etag: &str) -> bool {
        self.inner
            .lock()
            .by_key
            .get(key)
            .is_some_and(|k| &*k.etag == etag)
    }

    /// Keeps `backing` (of `key` at version `etag`), replacing what was kept for `key`, then
    /// drops the least recently used beyond the bound.
    pub fn keep(&self, key: K, etag: Arc<str>, backing: B) {
        if self.max_entries == 0 {
            return;
        }
        let mut inner = self.inner.lock();
        inner.remove(&key);
        let stamp = inner.next_stamp;
        inner.next_stamp += 1;
        inner.order.insert(stamp, key.clone());
        inner.by_key.insert(
            key,
            Kept {
                etag,
                backing,
                stamp,
            },
        );
        while inner.by_key.len() > self.max_entries {
            let Some((_, oldest)) = inner.order.pop_first() else {
                break;
            };
            inner.by_key.remove(&oldest);
        }
        self.count(&inner);
    }

    /// Drops what is kept for `key`.
    pub fn forget(&self, key: &K) {
        let mut inner = self.inner.lock();
        inner.remove(key);
        self.count(&inner);
    }

    /// Entries kept.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        let n = self.inner.lock().by_key.len();
        assert_eq!(self.gauge.load(Ordering::Relaxed), n as u64, "gauge");
        n
    }
}

impl<K: Hash + Eq, B> Inner<K, B> {
    fn remove(&mut self, key: &K) {
        if let Some(kept) = self.by_key.remove(key) {
            self.order.remove(&kept.stamp);
        }
    }
}

/// `FUSE_DEV_IOC_BACKING_CLOSE` from `linux/fuse.h`: `_IOW(229, 2, uint32_t)`.
const FUSE_DEV_IOC_BACKING_CLOSE: libc::c_ulong = (1 << 30) | (4 << 16) | (229 << 8) | 2;

/// A passthrough backing id: raw (opened ahead, owned here) or handed to fuser.
pub struct KernelBacking {
    pub(super) state: Mutex<State>,
    /// The nonce naming the cache data file behind the id ([`super::lookahead`] reads it
    /// ahead by path: `DiskCache::data_path`).
    pub nonce: u64,
}

pub(super) enum State {
    Raw { device: Arc<OwnedFd>, id: u32 },
    Wrapped(Arc<BackingId>),
}

impl KernelBacking {
    pub fn wrapped(id: Arc<BackingId>, nonce: u64) -> Self {
        KernelBacking {
            state: Mutex::new(State::Wrapped(id)),
            nonce,
        }
    }

    /// The fuser handle to reply with; a raw id becomes fuser's (and is closed by it) here.
    pub(super) fn for_reply(&self, reply: &impl Register) -> Arc<BackingId> {
        let mut state = self.state.lock();
        match &*state {
            State::Wrapped(id) => id.clone(),
            State::Raw { id, .. } => {
                // SAFETY: the id was opened on this session's device and is open (closed only
                // by `Drop` below, which no longer sees it once the state is `Wrapped`).
                let wrapped = Arc::new(unsafe { reply.wrap_backing(*id) });
                *state = State::Wrapped(wrapped.clone());
                wrapped
            }
        }
    }
}

impl Drop for KernelBacking {
    fn drop(&mut self) {
        if let State::Raw { device, id } = &*self.state.lock() {
            // SAFETY: a plain ioctl on a descriptor we own, with a pointer to a live u32.
            let rc = unsafe { libc::ioctl(device.as_raw_fd(), FUSE_DEV_IOC_BACKING_CLOSE, id) };
            if rc != 0 {
                tracing::debug!(error = %std::io::Error::last_os_error(), "could not close a backing id");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn auto_keeps_a_sixteenth_of_the_memory_limit_in_backing_files() {
        assert_eq!(idle_backings_within(4 << 30), 65_536);
        assert_eq!(
            idle_backings_within(80 << 30),
            1_310_720,
            "ImageNet's files"
        );
        assert_eq!(idle_backings_within(64 << 20), 1_024);
        assert_eq!(idle_backings_within(0), 0);
        assert_eq!(idle_backings_within(u64::MAX), MAX_IDLE_BACKINGS as usize);
    }

    /// A backing handle that counts how many are alive.
    struct Probe(Arc<AtomicUsize>, u32);
    impl Probe {
        fn new(live: &Arc<AtomicUsize>, id: u32) -> Arc<Probe> {
            live.fetch_add(1, Ordering::SeqCst);
            Arc::new(Probe(live.clone(), id))
        }
    }
    impl Drop for Probe {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn id(b: Option<Arc<Probe>>) -> Option<u32> {
        b.map(|p| p.1)
    }

    #[test]
    fn reuses_only_the_same_version() {
        let live = Arc::new(AtomicUsize::new(0));
        let kept = IdleBackings::new(10, Arc::default());
        kept.keep(7u64, "e1".into(), Probe::new(&live, 70));
        assert_eq!(id(kept.get(&7, "e1")), Some(70));
        assert!(kept.contains(&7, "e1") && !kept.contains(&7, "e2"));
        assert_eq!(id(kept.get(&8, "e1")), None);
        // The object changed: the old version's backing is dropped.
        assert_eq!(id(kept.get(&7, "e2")), None);
        assert_eq!(live.load(Ordering::SeqCst), 0);
        assert_eq!(id(kept.get(&7, "e1")), None);
        assert_eq!(kept.len(), 0);
    }

    #[test]
    fn keeps_within_the_bound_dropping_the_least_recent() {
        let live = Arc::new(AtomicUsize::new(0));
        let kept = IdleBackings::new(3, Arc::default());
        for k in 1..=3u64 {
            kept.keep(k, "e".into(), Probe::new(&live, k as u32));
        }
        assert!(kept.get(&1, "e").is_some()); // 2 is now the least recent
        kept.keep(4, "e".into(), Probe::new(&live, 4));
        assert_eq!(id(kept.get(&2, "e")), None);
        for k in [1, 3, 4] {
            assert_eq!(id(kept.get(&k, "e")), Some(k as u32));
        }
        assert_eq!(kept.len(), 3);
        assert_eq!(live.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn replacing_forgetting_and_dropping_release_backings() {
        let live = Arc::new(AtomicUsize::new(0));
        let kept = IdleBackings::new(10, Arc::default());
        kept.keep(1u64, "e".into(), Probe::new(&live, 1));
        kept.keep(1, "f".into(), Probe::new(&live, 11));
        assert_eq!(kept.len(), 1);
        assert_eq!(live.load(Ordering::SeqCst), 1);
        assert_eq!(id(kept.get(&1, "f")), Some(11));
        kept.keep(2, "e".into(), Probe::new(&live, 2));
        kept.forget(&1);
        assert_eq!(kept.len(), 1);
        assert_eq!(live.load(Ordering::SeqCst), 1);
        drop(kept);
        assert_eq!(live.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn zero_entries_keeps_nothing() {
        let live = Arc::new(AtomicUsize::new(0));
        let kept = IdleBackings::new(0, Arc::default());
        kept.keep(1u64, "e".into(), Probe::new(&live, 1));
        assert_eq!(id(kept.get(&1, "e")), None);
        assert_eq!(live.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn the_close_ioctl_number_is_the_kernels() {
        // linux/fuse.h: #define FUSE_DEV_IOC_BACKING_CLOSE _IOW(FUSE_DEV_IOC_MAGIC, 2, uint32_t)
        assert_eq!(FUSE_DEV_IOC_BACKING_CLOSE, 0x4004_e502);
    }
}
