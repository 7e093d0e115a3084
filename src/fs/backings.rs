//! Passthrough backing files kept after the last close, so reopening a cached file is answered
//! from memory.
//!
//! Handing a file to the kernel for passthrough costs the daemon an `open` of the cache's data
//! file, a `fstat`/`SEEK_HOLE` check and a `FUSE_DEV_IOC_BACKING_OPEN` ioctl, all on a blocking
//! thread behind a tokio hop. A training epoch opens every file once, so without this table
//! each epoch pays that for every file, and for small files (W1) it costs more than the read.
//!
//! The table keeps, per object key (one inode each), the backing id of its last passthrough
//! open, or one opened ahead by `preopen` when the object became complete in the cache,
//! together with the object version (ETag) it belongs to and a hold on its cache entry. While
//! kept:
//! - an open of the same object at the same ETag reuses the backing id; the FUSE thread
//!   answers it without a tokio task (see `RiffleFs::open`);
//! - an open at another ETag (the object changed) drops the kept one: a changed object never
//!   reuses the old version's bytes;
//! - the hold keeps the cache entry (and so the file the kernel reads) from eviction, so the
//!   disk budget is never exceeded by files that are deleted but still held by the kernel.
//!
//! Bounds: at most `max_entries` objects, and at most `max_bytes` of held object bytes (a
//! fraction of the cache budget, so pinned idle files never crowd out the eviction policy);
//! beyond either, the least recently opened are dropped first. Each kept entry costs the kernel
//! one `struct file` (a few hundred bytes) and this table about 150 bytes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;

/// See the module documentation. `B` is the backing id handle, `P` the pin guard (generic so
/// the policy is testable without a kernel).
pub struct KeptBackings<B, P> {
    inner: Mutex<Inner<B, P>>,
    max_entries: usize,
    max_bytes: u64,
}

struct Kept<B, P> {
    key: Arc<str>,
    etag: Arc<str>,
    backing: B,
    bytes: u64,
    stamp: u64,
    _pin: P,
}

struct Inner<B, P> {
    by_key: HashMap<Arc<str>, Kept<B, P>>,
    /// Recency: stamp of the last use → object key.
    order: BTreeMap<u64, Arc<str>>,
    next_stamp: u64,
    bytes: u64,
}

impl<B: Clone, P> KeptBackings<B, P> {
    pub fn new(max_entries: usize, max_bytes: u64) -> Self {
        KeptBackings {
            inner: Mutex::new(Inner {
                by_key: HashMap::new(),
                order: BTreeMap::new(),
                next_stamp: 0,
                bytes: 0,
            }),
            max_entries,
            max_bytes,
        }
    }

    /// The backing kept for object `key` if it belongs to version `etag` (and marks it recently
    /// used); a kept backing of another version is dropped.
    pub fn get(&self, key: &str, etag: &str) -> Option<B> {
        let mut inner = self.inner.lock();
        let inner = &mut *inner;
        let kept = inner.by_key.get_mut(key)?;
        if &*kept.etag != etag {
            inner.remove(key);
            return None;
        }
        inner.order.remove(&kept.stamp);
        kept.stamp = inner.next_stamp;
        inner.next_stamp += 1;
        inner.order.insert(kept.stamp, kept.key.clone());
        Some(kept.backing.clone())
    }

    /// Whether a backing of version `etag` of `key` is kept (without marking it used).
    pub fn contains(&self, key: &str, etag: &str) -> bool {
        self.inner
            .lock()
            .by_key
            .get(key)
            .is_some_and(|k| &*k.etag == etag)
    }

    /// Keeps `backing` (of object `key` at version `etag`, `bytes` long) with its hold,
    /// replacing what was kept for `key`, then drops the least recently used beyond the bounds.
    /// An object larger than the byte bound is not kept.
    pub fn keep(&self, key: Arc<str>, etag: Arc<str>, bytes: u64, backing: B, pin: P) {
        if self.max_entries == 0 || bytes > self.max_bytes {
            return;
        }
        let mut inner = self.inner.lock();
        inner.remove(&key);
        let stamp = inner.next_stamp;
        inner.next_stamp += 1;
        inner.order.insert(stamp, key.clone());
        inner.bytes += bytes;
        inner.by_key.insert(
            key.clone(),
            Kept {
                key,
                etag,
                backing,
                bytes,
                stamp,
                _pin: pin,
            },
        );
        while inner.by_key.len() > self.max_entries || inner.bytes > self.max_bytes {
            let Some((_, oldest)) = inner.order.pop_first() else {
                break;
            };
            inner.remove(&oldest);
        }
    }

    /// Drops what is kept for object `key`.
    pub fn forget(&self, key: &str) {
        self.inner.lock().remove(key);
    }

    /// Inodes and object bytes kept.
    #[cfg(test)]
    pub fn usage(&self) -> (usize, u64) {
        let inner = self.inner.lock();
        (inner.by_key.len(), inner.bytes)
    }
}

impl<B, P> Inner<B, P> {
    fn remove(&mut self, key: &str) {
        if let Some(kept) = self.by_key.remove(key) {
            self.order.remove(&kept.stamp);
            self.bytes -= kept.bytes;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn k(n: u64) -> Arc<str> {
        Arc::from(format!("dir/{n}.jpg"))
    }

    /// A pin that counts how many are alive.
    struct Pin(Arc<AtomicUsize>);
    impl Pin {
        fn new(live: &Arc<AtomicUsize>) -> Pin {
            live.fetch_add(1, Ordering::SeqCst);
            Pin(live.clone())
        }
    }
    impl Drop for Pin {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn reuses_only_the_same_version() {
        let live = Arc::new(AtomicUsize::new(0));
        let kept = KeptBackings::new(10, 1 << 30);
        kept.keep(k(7), "e1".into(), 100, 70u32, Pin::new(&live));
        assert_eq!(kept.get(&k(7), "e1"), Some(70));
        assert_eq!(kept.get(&k(8), "e1"), None);
        // The object changed: the old version's backing is dropped, with its pin.
        assert_eq!(kept.get(&k(7), "e2"), None);
        assert_eq!(live.load(Ordering::SeqCst), 0);
        assert_eq!(kept.get(&k(7), "e1"), None);
        assert_eq!(kept.usage(), (0, 0));
    }

    #[test]
    fn keeps_within_the_entry_bound_dropping_the_least_recent() {
        let live = Arc::new(AtomicUsize::new(0));
        let kept = KeptBackings::new(3, 1 << 30);
        for ino in 1..=3 {
            kept.keep(k(ino), "e".into(), 10, ino as u32, Pin::new(&live));
        }
        assert!(kept.get(&k(1), "e").is_some()); // 2 is now the least recent
        kept.keep(k(4), "e".into(), 10, 4, Pin::new(&live));
        assert_eq!(kept.get(&k(2), "e"), None);
        for ino in [1, 3, 4] {
            assert!(kept.get(&k(ino), "e").is_some(), "inode {ino}");
        }
        assert_eq!(kept.usage(), (3, 30));
        assert_eq!(live.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn keeps_within_the_byte_bound() {
        let live = Arc::new(AtomicUsize::new(0));
        let kept = KeptBackings::new(100, 1000);
        kept.keep(k(1), "e".into(), 400, 1u32, Pin::new(&live));
        kept.keep(k(2), "e".into(), 400, 2, Pin::new(&live));
        kept.keep(k(3), "e".into(), 400, 3, Pin::new(&live));
        assert_eq!(kept.usage(), (2, 800));
        assert_eq!(kept.get(&k(1), "e"), None);
        // Larger than the whole bound: never kept, nothing else dropped for it.
        kept.keep(k(4), "e".into(), 1001, 4, Pin::new(&live));
        assert_eq!(kept.usage(), (2, 800));
        assert_eq!(live.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn replacing_forgetting_and_dropping_release_pins() {
        let live = Arc::new(AtomicUsize::new(0));
        let kept = KeptBackings::new(10, 1 << 30);
        kept.keep(k(1), "e".into(), 10, 1u32, Pin::new(&live));
        kept.keep(k(1), "f".into(), 20, 11, Pin::new(&live));
        assert_eq!(kept.usage(), (1, 20));
        assert_eq!(live.load(Ordering::SeqCst), 1);
        assert_eq!(kept.get(&k(1), "f"), Some(11));
        kept.keep(k(2), "e".into(), 10, 2, Pin::new(&live));
        kept.forget(&k(1));
        assert_eq!(kept.usage(), (1, 10));
        assert_eq!(live.load(Ordering::SeqCst), 1);
        drop(kept);
        assert_eq!(live.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn zero_entries_keeps_nothing() {
        let live = Arc::new(AtomicUsize::new(0));
        let kept = KeptBackings::new(0, 1 << 30);
        kept.keep(k(1), "e".into(), 10, 1u32, Pin::new(&live));
        assert_eq!(kept.get(&k(1), "e"), None);
        assert_eq!(live.load(Ordering::SeqCst), 0);
    }
}
