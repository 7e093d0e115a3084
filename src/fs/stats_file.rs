//! `.riffle-stats`: the mount's statistics as a hidden file at the mount root, so that a
//! training pod (which has the mount but not the daemon's control socket) can read them.
//!
//! The file holds the JSON `riffle stats --json` prints (the same [`StatsSource`]: the
//! counters, the `volume` section the CSI plugin's `NodeGetVolumeStats` reports, the prefetch
//! section). It is never listed: `readdir` shows the bucket's names only, so `ImageFolder`,
//! `os.walk` and `find` do not see it, as JuiceFS's `.stats`. It only answers a lookup the
//! bucket does not: a name that exists at the mount root (an object or a prefix
//! `.riffle-stats`) wins, and the file then is that object.
//!
//! Each open renders the JSON once, on the runtime's blocking pool (the walk behind the
//! `volume` section is one pass over the listed names), and keeps it for the life of that
//! handle, so every read of one open sees the same document. Opens are `FOPEN_DIRECT_IO`: the
//! kernel reads until a short read instead of trusting the size, and keeps no pages, so `cat`
//! and Python's `open().read()` get the whole document whatever size a `stat` said. The size
//! a `stat` reports is that of the handle's document when the kernel names the handle
//! (`fstat` on an open file), else that of the last document rendered; attributes and the name
//! are given to the kernel with a zero TTL, so each `stat` and each open asks again. Nothing
//! here touches the cache, the fetcher or the store (the lookup that lets the bucket win is
//! the namespace's own, cached like any other negative lookup), and it works the same with
//! and without passthrough.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use fuser::{Errno, FileAttr, FopenFlags};
use parking_lot::Mutex;

use super::answer::{Entry, OpenAnswer};
use super::{FsConfig, RiffleFs};
use crate::metrics::StatsSource;
use crate::namespace::{NamespaceError, Stat, ROOT_INO};
use crate::store::StoreError;

/// The file's name at the mount root.
pub const NAME: &str = ".riffle-stats";

/// Its inode number: namespace inodes count up from 1 and never get near it; below the bit
/// directory entries keep the kind in.
pub const INO: u64 = u64::MAX >> 2;

/// See the module documentation.
#[derive(Default)]
pub struct StatsFile {
    /// Set once the mount's control handler exists (just after the mount is made).
    source: OnceLock<Arc<dyn StatsSource>>,
    /// The document of each open handle.
    open: Mutex<HashMap<u64, Arc<[u8]>>>,
    /// Length of the last document rendered, for a `stat` without a handle.
    last_len: AtomicU64,
}

/// Whether a lookup of `name` in `parent` that the namespace answered with `error` finds the
/// stats file: the name at the root, and nothing of that name in the bucket.
pub fn stands_in(parent: u64, name: &str, error: &NamespaceError) -> bool {
    parent == ROOT_INO
        && name == NAME
        && matches!(
            error,
            NamespaceError::NotFound | NamespaceError::Store(StoreError::NotFound)
        )
}

impl StatsFile {
    /// Where the documents come from; until it is set, opens answer EAGAIN.
    pub fn set_source(&self, source: Arc<dyn StatsSource>) {
        let _ = self.source.set(source);
    }

    /// A fresh document: the pretty JSON `riffle stats --json` prints, with a newline.
    fn render(&self) -> Option<Arc<[u8]>> {
        let source = self.source.get()?;
        let mut text = serde_json::to_vec_pretty(&source.stats()).ok()?;
        text.push(b'\n');
        self.last_len.store(text.len() as u64, Ordering::Relaxed);
        Some(Arc::from(text))
    }

    /// The size a `stat` reports: the handle's document, else the last one rendered.
    fn size(&self, fh: Option<u64>) -> u64 {
        if let Some(doc) = fh.and_then(|fh| self.open.lock().get(&fh).cloned()) {
            return doc.len() as u64;
        }
        match self.last_len.load(Ordering::Relaxed) {
            0 => self.render().map_or(0, |doc| doc.len() as u64),
            len => len,
        }
    }

    fn attr(&self, config: &FsConfig, fh: Option<u64>) -> FileAttr {
        let stat = Stat {
            size: Some(self.size(fh)),
            mtime: SystemTime::now(),
        };
        RiffleFs::stat_attr(config, INO, stat)
    }

    /// The answer to the lookup that found the file, or to a `getattr` (an `fstat` names
    /// its handle).
    pub(super) fn entry(&self, config: &FsConfig, fh: Option<u64>) -> Entry {
        Entry {
            attr: self.attr(config, fh),
            ttl: Duration::ZERO,
        }
    }

    /// Opens handle `fh`: renders its document (on the blocking pool: the caller's job).
    pub(super) fn open(&self, fh: u64) -> OpenAnswer {
        match self.render() {
            Some(doc) => {
                self.open.lock().insert(fh, doc);
                OpenAnswer::Served {
                    fh,
                    flags: FopenFlags::FOPEN_DIRECT_IO,
                }
            }
            None => OpenAnswer::Error(Errno::EAGAIN),
        }
    }

    /// Reads handle `fh`'s document. A handle this daemon did not open (a predecessor's,
    /// after a handover) gets a fresh document, kept from then on.
    pub(super) fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Bytes, Errno> {
        let known = self.open.lock().get(&fh).cloned();
        let doc = known.or_else(|| self.render()).ok_or(Errno::EAGAIN)?;
        self.open.lock().entry(fh).or_insert_with(|| doc.clone());
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(doc.len());
        let end = start.saturating_add(size as usize).min(doc.len());
        Ok(Bytes::copy_from_slice(&doc[start..end]))
    }

    pub fn release(&self, fh: u64) {
        self.open.lock().remove(&fh);
    }

    /// Handles open now (for tests).
    #[cfg(test)]
    pub fn open_handles(&self) -> usize {
        self.open.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;
    impl StatsSource for Fixed {
        fn stats(&self) -> serde_json::Value {
            serde_json::json!({"volume": {"listed_bytes": 5}})
        }
    }

    #[test]
    fn stands_in_only_for_a_missing_name_at_the_root() {
        assert!(stands_in(ROOT_INO, NAME, &NamespaceError::NotFound));
        assert!(stands_in(
            ROOT_INO,
            NAME,
            &NamespaceError::Store(StoreError::NotFound)
        ));
        assert!(!stands_in(2, NAME, &NamespaceError::NotFound));
        assert!(!stands_in(
            ROOT_INO,
            "riffle-stats",
            &NamespaceError::NotFound
        ));
        assert!(!stands_in(
            ROOT_INO,
            NAME,
            &NamespaceError::Store(StoreError::Transient("503".into()))
        ));
    }

    #[test]
    fn documents_are_the_sources_json_and_sizes_follow_them() {
        let file = StatsFile::default();
        assert!(file.render().is_none(), "no source yet");
        assert_eq!(file.size(None), 0);
        file.set_source(Arc::new(Fixed));
        let doc = file.render().expect("document");
        let value: serde_json::Value = serde_json::from_slice(&doc).expect("json");
        assert_eq!(value["volume"]["listed_bytes"], 5);
        assert_eq!(doc.last(), Some(&b'\n'));
        assert_eq!(file.size(None), doc.len() as u64);
        file.open.lock().insert(9, Arc::from(&b"abc"[..]));
        assert_eq!(file.size(Some(9)), 3, "an fstat sees its handle's document");
        file.release(9);
        assert_eq!(file.open_handles(), 0);
    }
}
