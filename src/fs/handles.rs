//! The open-file table: what the FUSE adapter knows about each open file and directory handle.
//!
//! [`Handles`] maps file handles to their [`FileReader`] and directory handles to the listing
//! taken at `opendir`; it keeps the per-inode open state ([`InodeOpens`]: the version the
//! kernel's page cache holds, the passthrough backing file in use, the daemon-served handles)
//! and the backing files kept for reopening ([`IdleBackings`]). It records every open handle
//! in the handover table for a successor daemon ([`super::handover`]).
//!
//! Locks: `files`, `dirs` and the one lock of [`InodeOpens`] are each taken alone, never one
//! inside another, and never with the namespace tree's lock held.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use fuser::{BackingId, FopenFlags};
use parking_lot::Mutex;

use super::answer::OpenAnswer;
use super::backings::{IdleBackings, KernelBacking};
use super::handover::{HandleRecord, HandleTable};
use super::inode_opens::{InodeOpens, Mode};
use crate::cache::EntryKey;
use crate::fetch::ObjectVersion;
use crate::namespace::{DirEntry, OpenTarget, VersionsInUse};
use crate::reader::FileReader;

/// Open file and directory handles, shared with the tasks that answer open/opendir.
pub(super) struct Handles {
    files: Mutex<HashMap<u64, Arc<FileReader>>>,
    dirs: Mutex<HashMap<u64, Arc<Vec<DirEntry>>>>,
    /// Per inode: the open handles' modes and versions.
    pub(super) opens: InodeOpens,
    /// Backing files kept for reopening, per cache entry.
    pub(super) kept: IdleBackings<EntryKey, Arc<KernelBacking>>,
    /// Where open file handles are recorded for a successor daemon ([`handover`]).
    pub(super) table: std::sync::OnceLock<Arc<HandleTable>>,
}

impl Handles {
    /// Handles keeping up to `max_kept` idle backing files (counted in `kept_gauge`).
    pub(super) fn new(max_kept: usize, kept_gauge: Arc<AtomicU64>) -> Self {
        Handles {
            files: Mutex::default(),
            dirs: Mutex::default(),
            opens: InodeOpens::default(),
            kept: IdleBackings::new(max_kept, kept_gauge),
            table: std::sync::OnceLock::new(),
        }
    }

    /// The reader of file handle `fh`.
    pub(super) fn reader(&self, fh: u64) -> Option<Arc<FileReader>> {
        self.files.lock().get(&fh).cloned()
    }

    pub(super) fn insert_reader(&self, fh: u64, reader: FileReader) {
        self.files.lock().insert(fh, Arc::new(reader));
    }

    /// The listing of directory handle `fh`.
    pub(super) fn dir(&self, fh: u64) -> Option<Arc<Vec<DirEntry>>> {
        self.dirs.lock().get(&fh).cloned()
    }

    pub(super) fn insert_dir(&self, fh: u64, entries: Arc<Vec<DirEntry>>) {
        self.dirs.lock().insert(fh, entries);
    }

    pub(super) fn release_dir(&self, fh: u64) {
        self.dirs.lock().remove(&fh);
    }

    /// Records open handle `fh` for a successor daemon (before the open is answered).
    fn record(&self, fh: u64, ino: u64, etag: &str, backing: Option<u32>) {
        let Some(table) = self.table.get() else {
            return;
        };
        let size = self.reader(fh).map_or(0, |reader| reader.object().size);
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
        self.opens.release(fh, ino, reader.is_some());
    }

    /// Answers the open of `fh` (of `ino` at version `etag`, its reader started): with
    /// passthrough to the backing file already in use for the inode, else to `candidate`,
    /// else served by the daemon (keeping the kernel's cached pages when they belong to this
    /// same version); stale when a handle of the inode is open at another version
    /// ([`InodeOpens::choose`]: the mode is chosen and counted in one step). The handle is
    /// recorded for a successor before the answer is sent.
    pub(super) fn answer_open(
        &self,
        ino: u64,
        fh: u64,
        etag: &Arc<str>,
        candidate: Option<Arc<BackingId>>,
    ) -> OpenAnswer {
        match self.opens.choose(ino, fh, etag, candidate) {
            Mode::Stale => {
                self.files.lock().remove(&fh);
                OpenAnswer::Stale
            }
            Mode::Passthrough(backing) => {
                self.record(fh, ino, etag, Some(backing.id()));
                OpenAnswer::Passthrough { fh, backing }
            }
            Mode::Served { keep_cache } => {
                self.record(fh, ino, etag, None);
                let flags = if keep_cache {
                    FopenFlags::FOPEN_KEEP_CACHE
                } else {
                    FopenFlags::empty()
                };
                OpenAnswer::Served { fh, flags }
            }
        }
    }
}

impl VersionsInUse for Handles {
    /// [`InodeOpens::other_version_open`]: an open of `etag` must then get a new inode (the
    /// namespace gives it one).
    fn other_version_open(&self, ino: u64, etag: &str) -> bool {
        self.opens.other_version_open(ino, etag)
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
    use crate::fetch::Fetcher;
    use crate::reader::ReadAheadConfig;

    /// A handle served by the daemon, as `Opener::start` and [`Handles::answer_open`] leave
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
        let etag = object.etag.clone();
        let reader = FileReader::new(object, fetcher, ReadAheadConfig::default(), None);
        handles.insert_reader(fh, reader);
        handles.answer_open(ino, fh, &etag, None);
    }

    #[tokio::test]
    async fn a_release_of_a_handle_it_does_not_know_leaves_the_counts_alone() {
        let handles = Handles::new(16, Arc::default());
        served_open(&handles, 7, 1);
        served_open(&handles, 7, 2);
        // fh 3 was released by the predecessor, whose answer never reached the kernel: the
        // RELEASE comes again.
        handles.release(3, 7);
        assert_eq!(handles.opens.served(7), 2);
        handles.release(1, 7);
        handles.release(1, 7);
        assert_eq!(handles.opens.served(7), 1, "fh 2 is still open");
        handles.release(2, 7);
        assert_eq!(handles.opens.served(7), 0);
    }
}
