//! The open-file table: what the FUSE adapter knows about each open file and directory handle.
//!
//! [`Handles`] maps file handles to their [`FileReader`] and directory handles to the listing
//! taken at `opendir`; it remembers per inode which object version the kernel's page cache
//! holds (`FOPEN_KEEP_CACHE` only for the same ETag), which passthrough backing file the open
//! handles use ([`InodeBacking`]: the kernel wants one per inode), how many daemon-served
//! handles are open, and the backing files kept for reopening. It records every open handle
//! in the handover table for a successor daemon ([`super::handover`]).
//!
//! [`Opener`] is what answering an open needs, cloned into the open's task (or used on the
//! FUSE thread by the fast path): it starts the handle's reader and picks or opens the
//! passthrough backing file.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use fuser::{BackingId, FileHandle, FopenFlags, ReplyOpen};
use parking_lot::Mutex;

use super::backings::{IdleBackings, KernelBacking};
use super::handover::{HandleRecord, HandleTable};
use super::{FsStatus, KEPT_BACKINGS_MAX};
use crate::cache::EntryKey;
use crate::fetch::{Fetcher, ObjectVersion};
use crate::namespace::{DirEntry, OpenTarget, VersionsInUse};
use crate::prefetch::Prefetcher;
use crate::reader::{FileReader, ReadAheadConfig};

/// Open file and directory handles, shared with the tasks that answer open/opendir.
pub(super) struct Handles {
    pub(super) files: Mutex<HashMap<u64, Arc<FileReader>>>,
    pub(super) dirs: Mutex<HashMap<u64, Arc<Vec<DirEntry>>>>,
    /// The version whose pages the kernel may hold, per inode ([`VersionDigest`]).
    pub(super) page_cache_etag: Mutex<HashMap<u64, VersionDigest>>,
    /// Passthrough: the backing file of each open handle, and per inode the one in use (the
    /// kernel wants one backing file per inode, and no mixing with cached opens).
    pub(super) backing_by_fh: Mutex<HashMap<u64, (u64, Arc<BackingId>)>>,
    pub(super) backing_by_ino: Mutex<HashMap<u64, InodeBacking>>,
    /// Open handles per inode served by the daemon (not passthrough).
    pub(super) cached_opens: Mutex<HashMap<u64, u32>>,
    /// Backing files kept for reopening, per cache entry.
    pub(super) kept: IdleBackings<EntryKey, Arc<KernelBacking>>,
    /// Where open file handles are recorded for a successor daemon ([`handover`]).
    pub(super) table: std::sync::OnceLock<Arc<HandleTable>>,
}

/// An ETag in 16 bytes: 128 bits of SHA-256 over it, as the cache names object versions
/// (`cache::identity`). The table of the versions whose pages the kernel may hold gets an
/// entry for every file the daemon served (every file of a cold epoch): with the ETag's
/// text (an `Arc<str>` made for the open) one cost about 120 bytes, this way about 40.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct VersionDigest(u128);

impl VersionDigest {
    pub(super) fn of(etag: &str) -> Self {
        use sha2::{Digest, Sha256};
        let d = Sha256::digest(etag.as_bytes());
        let mut first = [0u8; 16];
        first.copy_from_slice(&d[..16]);
        VersionDigest(u128::from_le_bytes(first))
    }
}

/// How [`Handles::answer_open`] answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Answered {
    Passthrough,
    ByDaemon,
    /// `ESTALE`: a handle of the inode is open at another version.
    Stale,
}

/// The passthrough handles open on one inode: how many, the object version they read and
/// their backing file.
pub(super) struct InodeBacking {
    opens: u32,
    etag: Arc<str>,
    backing: Weak<BackingId>,
}

impl Handles {
    pub(super) fn new(kept_gauge: Arc<AtomicU64>) -> Self {
        Handles {
            files: Mutex::default(),
            dirs: Mutex::default(),
            page_cache_etag: Mutex::default(),
            backing_by_fh: Mutex::default(),
            backing_by_ino: Mutex::default(),
            cached_opens: Mutex::default(),
            kept: IdleBackings::new(KEPT_BACKINGS_MAX, kept_gauge),
            table: std::sync::OnceLock::new(),
        }
    }

    /// Records open handle `fh` for a successor daemon (before the open is answered).
    pub(super) fn record(&self, fh: u64, ino: u64, etag: &str, backing: Option<u32>) {
        let Some(table) = self.table.get() else {
            return;
        };
        let size = self
            .files
            .lock()
            .get(&fh)
            .map_or(0, |reader| reader.object().size);
        let record = HandleRecord {
            fh,
            ino,
            size,
            etag: etag.to_string(),
            backing,
        };
        if !table.record(&record) {
            tracing::warn!(fh, ino, "handle not recorded for a successor daemon (table full or ETag too long); it will fail with EIO after a handover");
        }
    }

    /// Forgets handle `fh` of `ino` (the kernel released it). A handle this daemon does not
    /// know changes nothing: a RELEASE its predecessor had already applied (and then died
    /// before answering) comes again after a handover (`FUSE_NOTIFY_RESEND`), and counting it
    /// would take another open handle of the inode out of the count, so that an open of the
    /// inode could then be answered in the mode the kernel refuses beside that handle (EIO).
    pub(super) fn release(&self, fh: u64, ino: u64) {
        if let Some(table) = self.table.get() {
            table.release(fh);
        }
        let reader = self.files.lock().remove(&fh);
        if self.backing_by_fh.lock().remove(&fh).is_some() {
            let mut inodes = self.backing_by_ino.lock();
            if let Some(b) = inodes.get_mut(&ino) {
                b.opens -= 1;
                if b.opens == 0 {
                    inodes.remove(&ino);
                }
            }
        } else if reader.is_some() {
            let mut opens = self.cached_opens.lock();
            if let Some(n) = opens.get_mut(&ino) {
                *n -= 1;
                if *n == 0 {
                    opens.remove(&ino);
                }
            }
        }
    }

    /// Records passthrough handle `fh` of `ino`, reading version `etag` through `backing`.
    pub(super) fn passthrough_opened(
        &self,
        ino: u64,
        fh: u64,
        etag: &Arc<str>,
        backing: &Arc<BackingId>,
    ) {
        self.backing_by_fh.lock().insert(fh, (ino, backing.clone()));
        self.backing_by_ino
            .lock()
            .entry(ino)
            .or_insert_with(|| InodeBacking {
                opens: 0,
                etag: etag.clone(),
                backing: Arc::downgrade(backing),
            })
            .opens += 1;
    }

    /// The backing file in use for `ino` by open handles of version `etag`, if any.
    pub(super) fn live_backing(&self, ino: u64, etag: &str) -> Option<Arc<BackingId>> {
        self.backing_by_ino
            .lock()
            .get(&ino)
            .filter(|b| &*b.etag == etag)
            .and_then(|b| b.backing.upgrade())
    }

    /// Answers the open of `fh` (of `ino` at version `etag`): with passthrough to the backing
    /// file already in use for the inode, else to `candidate`, else served by the daemon
    /// (keeping the kernel's cached pages when they belong to this same version).
    ///
    /// The kernel fails an open with EIO when its mode conflicts with the inode's other open
    /// files (one backing file per inode; no daemon-served open beside a passthrough one), so
    /// the mode is chosen and counted under one lock: concurrent opens of an inode (a task
    /// that found the cache file verified while another open was answered without it, as
    /// after a restart) always agree. A handle open at another version makes it `ESTALE`.
    pub(super) fn answer_open(
        &self,
        ino: u64,
        fh: u64,
        etag: &Arc<str>,
        candidate: Option<Arc<BackingId>>,
        reply: ReplyOpen,
    ) -> Answered {
        let chosen = {
            let mut inodes = self.backing_by_ino.lock();
            let mut cached = self.cached_opens.lock();
            let live = match inodes.get_mut(&ino) {
                Some(b) if *b.etag != **etag => Err(()),
                Some(b) => match b.backing.upgrade() {
                    Some(live) => {
                        b.opens += 1;
                        Ok(Some(live))
                    }
                    None => {
                        // Its handles are gone (a count out of step): forget it.
                        inodes.remove(&ino);
                        Ok(None)
                    }
                },
                None => Ok(None),
            };
            match live {
                Err(()) => None,
                Ok(Some(live)) => Some(Some(live)),
                Ok(None) => match candidate {
                    Some(backing) if !cached.contains_key(&ino) => {
                        inodes.insert(
                            ino,
                            InodeBacking {
                                opens: 1,
                                etag: etag.clone(),
                                backing: Arc::downgrade(&backing),
                            },
                        );
                        Some(Some(backing))
                    }
                    _ => {
                        *cached.entry(ino).or_default() += 1;
                        Some(None)
                    }
                },
            }
        };
        match chosen {
            None => {
                self.files.lock().remove(&fh);
                reply.error(fuser::Errno::ESTALE);
                Answered::Stale
            }
            Some(Some(backing)) => {
                self.backing_by_fh.lock().insert(fh, (ino, backing.clone()));
                self.record(fh, ino, etag, Some(backing.id()));
                reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &backing);
                Answered::Passthrough
            }
            Some(None) => {
                self.record(fh, ino, etag, None);
                let flags = if self.remember_etag(ino, etag) {
                    FopenFlags::FOPEN_KEEP_CACHE
                } else {
                    FopenFlags::empty()
                };
                reply.opened(FileHandle(fh), flags);
                Answered::ByDaemon
            }
        }
    }

    /// Records that `ino` is opened at version `etag`; true if the kernel's cached pages (if
    /// any) belong to that same version and may be kept.
    pub(super) fn remember_etag(&self, ino: u64, etag: &str) -> bool {
        let version = VersionDigest::of(etag);
        let mut map = self.page_cache_etag.lock();
        match map.get(&ino) {
            Some(previous) if *previous == version => true,
            _ => {
                map.insert(ino, version);
                false
            }
        }
    }
}

impl VersionsInUse for Handles {
    /// Whether handles of `ino` are open at another version than `etag`; an open of `etag`
    /// must then get a new inode (the namespace gives it one). Passthrough handles: the
    /// kernel refuses any other open of the inode (one backing file per inode, and no
    /// daemon-served opens beside it). Handles served by the daemon: they share the inode's
    /// page cache, and the old handle's reads would fill it with old pages that the new
    /// handle then reads (a blend).
    fn other_version_open(&self, ino: u64, etag: &str) -> bool {
        let passthrough = self
            .backing_by_ino
            .lock()
            .get(&ino)
            .is_some_and(|b| &*b.etag != etag);
        passthrough
            || (self.cached_opens.lock().contains_key(&ino)
                && self
                    .page_cache_etag
                    .lock()
                    .get(&ino)
                    .is_some_and(|v| *v != VersionDigest::of(etag)))
    }
}

/// What an open needs, cloned into its task (or used on the FUSE thread by the fast path).
#[derive(Clone)]
pub(super) struct Opener {
    pub(super) fetcher: Arc<Fetcher>,
    pub(super) handles: Arc<Handles>,
    pub(super) status: Arc<FsStatus>,
    pub(super) prefetch: Arc<Prefetcher>,
    pub(super) passthrough: Arc<std::sync::atomic::AtomicBool>,
    pub(super) read_ahead: ReadAheadConfig,
}

impl Opener {
    /// Starts handle `fh` of `ino` at `object` for `caller` (the opening thread's id): counts
    /// the open, tells the prefetcher, and keeps a reader for it (pinning the cache entry).
    pub(super) fn start(&self, ino: u64, fh: u64, caller: u32, object: Arc<ObjectVersion>) {
        self.status.opens.fetch_add(1, Ordering::Relaxed);
        // Pinned before the prefetcher hears of the open: from then on it no longer counts
        // the file as needed, and eviction could take it before a later pin.
        let pin = self.fetcher.disk().map(|d| d.pin_unused(&object));
        self.prefetch.on_open_by(ino, &object, Some(caller));
        if let Some(pin) = &pin {
            pin.used();
        }
        let reader = FileReader::new(object, self.fetcher.clone(), self.read_ahead, pin);
        self.handles.files.lock().insert(fh, Arc::new(reader));
    }

    /// Answers the open of `fh` ([`Handles::answer_open`]) and counts a passthrough one.
    pub(super) fn answer(
        &self,
        ino: u64,
        fh: u64,
        etag: &Arc<str>,
        candidate: Option<Arc<BackingId>>,
        reply: ReplyOpen,
    ) -> Answered {
        let answered = self.handles.answer_open(ino, fh, etag, candidate, reply);
        if answered == Answered::Passthrough {
            self.status
                .passthrough_opens
                .fetch_add(1, Ordering::Relaxed);
        }
        answered
    }

    /// A backing file for passthrough of `ino`: the one in use or kept for the inode at this
    /// version, or the object's complete and verified cache file (then kept for later opens).
    /// `None` (served by the daemon) when the file is not cached and verified yet, or when
    /// daemon-served handles of the inode are open (the kernel does not mix the two on one
    /// inode).
    pub(super) async fn passthrough_backing(
        &self,
        ino: u64,
        object: &ObjectVersion,
        reply: &ReplyOpen,
    ) -> Option<Arc<BackingId>> {
        let handles = &self.handles;
        if handles.cached_opens.lock().contains_key(&ino) {
            return None;
        }
        let disk = self.fetcher.disk()?;
        let entry = disk.entry_key(object);
        // The one in use first: the kernel allows one backing file per inode, and after a
        // handover the one in use may be a predecessor's, not the one kept here.
        if let Some(live) = handles.live_backing(ino, &object.etag) {
            return Some(live);
        }
        if let Some(kept) = handles.kept.get(&entry, &object.etag) {
            return Some(kept.for_reply(reply));
        }
        let data = disk.passthrough_file(object).await?;
        match reply.open_backing(&data.file) {
            Ok(id) => {
                let id = Arc::new(id);
                let kept = Arc::new(KernelBacking::wrapped(id.clone(), data.nonce));
                handles.kept.keep(entry, object.etag.clone(), kept);
                Some(id)
            }
            Err(e) => {
                if self.passthrough.swap(false, Ordering::Relaxed) {
                    tracing::warn!(error = %e, "FUSE passthrough refused by the kernel (needs CAP_SYS_ADMIN); serving reads through the daemon");
                    *self.status.passthrough_mode.lock() = format!(
                        "off (the kernel refused a backing file: {e}; passthrough needs CAP_SYS_ADMIN)"
                    );
                }
                None
            }
        }
    }
}

/// The object version an open reads.
pub(super) fn object_of(target: &OpenTarget) -> Arc<ObjectVersion> {
    Arc::new(ObjectVersion {
        key: Arc::from(target.key.as_str()),
        etag: target.etag.clone(),
        size: target.size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A handle served by the daemon, as [`Opener::start`] and [`Handles::answer_open`] leave
    /// it (the reader itself is not needed here: the table of readers is what counts).
    fn served_open(handles: &Handles, ino: u64, fh: u64) {
        let object = Arc::new(ObjectVersion {
            key: Arc::from("k"),
            etag: Arc::from("e"),
            size: 1,
        });
        let fetcher = Fetcher::new(
            Arc::new(crate::store::memory::MemoryStore::new()),
            crate::fetch::FetchConfig::default(),
            tokio::runtime::Handle::current(),
            None,
        );
        let reader = FileReader::new(object, fetcher, ReadAheadConfig::default(), None);
        handles.files.lock().insert(fh, Arc::new(reader));
        *handles.cached_opens.lock().entry(ino).or_default() += 1;
    }

    #[tokio::test]
    async fn a_release_of_a_handle_it_does_not_know_leaves_the_counts_alone() {
        let handles = Handles::new(Arc::default());
        served_open(&handles, 7, 1);
        served_open(&handles, 7, 2);
        // fh 3 was released by the predecessor, whose answer never reached the kernel: the
        // RELEASE comes again.
        handles.release(3, 7);
        assert_eq!(handles.cached_opens.lock().get(&7), Some(&2));
        handles.release(1, 7);
        handles.release(1, 7);
        assert_eq!(
            handles.cached_opens.lock().get(&7),
            Some(&1),
            "fh 2 is still open"
        );
        handles.release(2, 7);
        assert!(handles.cached_opens.lock().get(&7).is_none());
    }

    #[test]
    fn page_cache_is_kept_only_for_the_same_version() {
        let handles = Handles::new(Arc::default());
        let v1: Arc<str> = Arc::from("etag-1");
        let v2: Arc<str> = Arc::from("etag-2");
        assert!(
            !handles.remember_etag(7, &v1),
            "first open: nothing cached yet"
        );
        assert!(handles.remember_etag(7, &v1));
        assert!(
            !handles.remember_etag(7, &v2),
            "new version: drop the old pages"
        );
        assert!(handles.remember_etag(7, &v2));
    }
}
