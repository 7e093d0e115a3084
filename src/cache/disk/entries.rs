//! An entry's files: finding them open here, loading (or creating) them on a blocking thread,
//! installing them in the table under the cap on open entries, catching up with journal
//! records other processes appended, and the questions answered from them (status, whether
//! the entry is complete, its data file for passthrough or readahead).

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::read::{read_checked, Expected};
use super::table::{closed_one_block, known_entry, COMPLETE, KNOWN_GOOD, PIN_HELD};
use super::{io_err, DataFile, DiskCache, ObjectStatus};
use crate::cache::entry::{self, Evicted, Files, LoadError, OpenEntry};
use crate::cache::format;
use crate::cache::identity::{EntryKey, ObjectIdentity};
use crate::cache::{sys, CacheError};

impl DiskCache {
    /// The open entry of `key` (an object of `size` bytes), if its files are open here and it
    /// is alive; made from the idle files if need be (no I/O). The caller calls
    /// [`Self::settle`] once done with it.
    pub(super) fn cached_open(&self, key: EntryKey, size: u64) -> Option<Arc<OpenEntry>> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let at = st.table.find(&key)?;
        let e = st.table.at_mut(at)?;
        if e.files.is_dead() {
            return None;
        }
        let open = e.files.activate(key, size, self.block_size)?;
        st.open_lru.use_now(at);
        Some(open)
    }

    /// After a use of `key`'s open entry (every `Arc` of it the use took dropped): keeps it as
    /// idle files when nothing else uses it (see `entry`, "Idle form").
    pub(super) fn settle(&self, key: &EntryKey) {
        if let Some(e) = self.state.lock().table.get_mut(key) {
            e.settle();
        }
    }

    /// Loads (or with `create`, creates) the entry of `id` and installs it.
    pub(super) async fn load(
        &self,
        id: &ObjectIdentity,
        key: EntryKey,
        create: bool,
    ) -> Result<Option<Arc<OpenEntry>>, CacheError> {
        if let Some(o) = self.cached_open(key, id.size) {
            return Ok(Some(o));
        }
        let (root, bs, direct, idc) = (
            self.root.clone(),
            self.block_size,
            self.direct_io,
            id.clone(),
        );
        let loaded = self.blocking(move || -> Result<Option<OpenEntry>, CacheError> {
            for _ in 0..4 {
                match OpenEntry::open_existing(&root, &idc, key, bs, direct) {
                    Ok(Some(e)) => return Ok(Some(e)),
                    Ok(None) if !create => return Ok(None),
                    Ok(None) => {
                        if let Some(e) = OpenEntry::create(&root, &idc, key, bs, direct)
                            .map_err(|e| io_err("creating a cache entry", e))?
                        {
                            return Ok(Some(e));
                        }
                    }
                    Err(LoadError::Io(e)) => return Err(io_err("opening a cache entry", e)),
                    Err(e @ (LoadError::Stale(_) | LoadError::Mismatch)) => {
                        if !create {
                            return Ok(None);
                        }
                        tracing::info!(entry = %key, error = %e, "replacing an unusable cache entry");
                        match entry::evict_files(&root, key)
                            .map_err(|e| io_err("removing a stale cache entry", e))?
                        {
                            Evicted::InUse => return Err(CacheError::Busy),
                            Evicted::Removed | Evicted::Gone => {}
                        }
                    }
                }
            }
            Err(CacheError::Busy)
        })
        .await??;
        Ok(loaded.map(|e| self.install(e)))
    }

    /// Makes a freshly opened entry the open entry of its key (or returns the one another task
    /// opened first), and closes files of the least recently used entries beyond the cap.
    pub(super) fn install(&self, fresh: OpenEntry) -> Arc<OpenEntry> {
        let key = fresh.key;
        let charged = fresh.charged_bytes();
        let complete = fresh.blocks.lock().is_complete();
        let fresh = Arc::new(fresh);
        // Files and locks are let go only after the state lock is released (system calls).
        let mut released = None;
        let mut closed: Vec<Files> = Vec::new();
        let pinned = {
            let mut guard = self.state.lock();
            let st = &mut *guard;
            let Some(at) = known_entry(&mut st.table, &mut st.policy, key) else {
                return fresh; // every slot taken: used, but not kept
            };
            let Some(e) = st.table.at_mut(at) else {
                return fresh;
            };
            match &e.files {
                Files::Active(o) if !o.is_dead() => return o.clone(),
                Files::Active(_) => {
                    // Evicted by another process: the fresh files replace the dead ones.
                    st.open_count -= 1;
                    if e.flag(PIN_HELD) {
                        released = e.files.active().cloned();
                        e.set(PIN_HELD, false);
                    }
                }
                Files::Idle { .. } => {
                    // Opened here meanwhile: use those files (the fresh ones are closed).
                    if let Some(o) = e.files.activate(key, fresh.size, self.block_size) {
                        st.open_lru.use_now(at);
                        return o;
                    }
                    st.open_count -= 1; // replaced below
                }
                Files::Closed { .. } => {}
            }
            if charged > e.bytes {
                st.used += charged - e.bytes;
                e.bytes = charged;
                st.policy.resize(at, charged);
            }
            e.set(COMPLETE, complete);
            let pinned = e.pins > 0 && !e.flag(PIN_HELD);
            closed.push(std::mem::replace(
                &mut e.files,
                Files::Active(fresh.clone()),
            ));
            st.open_count += 1;
            st.open_lru.add(at, false);
            // Close the files of idle entries beyond the cap.
            while st.open_count > self.max_open {
                let table = &st.table;
                let Some(victim) = st.open_lru.coldest(&mut |s| {
                    s != at
                        && table
                            .at(s)
                            .is_some_and(|e| e.pins == 0 && e.writes == 0 && e.files.is_open())
                }) else {
                    break;
                };
                st.open_lru.take(victim);
                if let Some(v) = st.table.at_mut(victim) {
                    closed.push(v.files.close());
                    st.open_count -= 1;
                }
            }
            pinned
        };
        if let Some(o) = released {
            o.release_use();
        }
        drop(closed);
        if pinned {
            self.hold_for_pins(fresh.clone());
        }
        fresh
    }

    /// Forgets a dead open entry (evicted by another process) so the next use reloads: its
    /// files are gone, and so are the bytes charged for them (reservations in progress stay).
    pub(super) fn forget_open(&self, dead: &Arc<OpenEntry>) {
        let held = {
            let mut guard = self.state.lock();
            let st = &mut *guard;
            let key = dead.key;
            let Some(at) = st.table.find(&key) else {
                return;
            };
            let reserved = st.reserved.get(&key).copied().unwrap_or(0);
            let Some(e) = st.table.at_mut(at) else {
                return;
            };
            if !e.files.active().is_some_and(|o| Arc::ptr_eq(o, dead)) {
                return;
            }
            // Not the last reference: the caller holds `dead`.
            e.files = Files::default();
            e.set(COMPLETE, false);
            let held = e.flag(PIN_HELD);
            e.set(PIN_HELD, false);
            st.used = st.used.saturating_sub(e.bytes.saturating_sub(reserved));
            e.bytes = reserved;
            let unused = e.bytes == 0 && e.pins == 0 && e.writes == 0;
            st.open_count -= 1;
            st.open_lru.take(at);
            if unused {
                st.table.take(at);
                st.policy.remove(at);
            }
            held
        };
        // The pins' use of the dead entry ends here; the next load takes a new one.
        if held {
            dead.release_use();
        }
    }

    /// Replays the journal's new tail on a blocking thread; updates the accounting.
    pub(super) async fn refresh(&self, entry: &Arc<OpenEntry>) -> Result<(), CacheError> {
        if !entry.journal_grew() {
            return Ok(());
        }
        self.counters
            .journal_replays
            .fetch_add(1, Ordering::Relaxed);
        let e2 = entry.clone();
        let appeared = self
            .blocking(move || e2.refresh_blocking())
            .await?
            .map_err(|e| io_err("reading a cache journal", e))?;
        if appeared.is_empty() {
            return Ok(());
        }
        let added: u64 = appeared
            .iter()
            .map(|&i| {
                format::block_len(entry.size, self.block_size, i as u64).next_multiple_of(4096)
                    + format::RECORD_LEN as u64
            })
            .sum();
        let complete = entry.blocks.lock().is_complete();
        let mut st = self.state.lock();
        let st = &mut *st;
        if let Some(e) = st.table.get_mut(&entry.key) {
            e.bytes += added;
            e.set(COMPLETE, complete);
            st.used += added;
        }
        Ok(())
    }

    /// Whether every block of `id` is known here to be present (no I/O; see
    /// [`DiskCache::status`] to look at the disk).
    pub(crate) fn is_complete(&self, id: &ObjectIdentity) -> bool {
        let st = self.state.lock();
        st.table
            .get(&id.entry_key())
            .is_some_and(|e| e.complete() && !e.files.is_dead())
    }

    /// Records that every block of `id`'s complete entry is known good to this process
    /// (written here from fetched bytes, or read back and checked); true the first time. A
    /// mark in the entry's record (see `table::KNOWN_GOOD`): it costs no memory, and goes
    /// with the entry when it is evicted or loses a block.
    pub(crate) fn mark_known_good(&self, id: &ObjectIdentity) -> bool {
        let mut st = self.state.lock();
        match st.table.get_mut(&id.entry_key()) {
            Some(e) if e.complete() && !e.flag(KNOWN_GOOD) => {
                e.set(KNOWN_GOOD, true);
                true
            }
            _ => false,
        }
    }

    /// Whether every block of `id`'s complete entry is known good ([`Self::mark_known_good`]).
    pub(crate) fn is_known_good(&self, id: &ObjectIdentity) -> bool {
        let st = self.state.lock();
        st.table
            .get(&id.entry_key())
            .is_some_and(|e| e.complete() && e.flag(KNOWN_GOOD))
    }

    /// Whether this process knows of bytes of `id` in the cache (no I/O: an entry another
    /// process filled since this one last looked is not seen).
    pub(crate) fn holds_bytes(&self, id: &ObjectIdentity) -> bool {
        let st = self.state.lock();
        st.table
            .get(&id.entry_key())
            .is_some_and(|e| e.bytes > 0 && !e.files.is_dead())
    }

    /// The entry's own open data file of `id` when every block of it is present and the entry
    /// is open in this process (no I/O, no new descriptor): what a readahead reads. `None` too
    /// when the cache's state is busy (this is only ever a hint, and never waits). The entry
    /// stays an open (not idle) one until its next use ends.
    pub(crate) fn open_data_file(&self, id: &ObjectIdentity) -> Option<Arc<File>> {
        let mut st = self.state.try_lock()?;
        let key = id.entry_key();
        let e = st.table.get_mut(&key)?;
        if !e.complete() || e.files.is_dead() {
            return None;
        }
        let open = e.files.activate(key, id.size, self.block_size)?;
        Some(open.data.clone())
    }

    /// The data file of `id` when its entry's files are closed here and it is an object of
    /// one block, present (see [`entry::OneBlock`]): what a readahead opens by name. No I/O;
    /// `None` too when the cache's state is busy (a hint never waits).
    pub(crate) fn closed_data_path(&self, id: &ObjectIdentity) -> Option<PathBuf> {
        let key = id.entry_key();
        let st = self.state.try_lock()?;
        let one = closed_one_block(&st.table, key)?;
        Some(key.data_path(&self.root, one.nonce))
    }

    /// Loads the entry of `id` from disk if needed (catching up with other processes) and
    /// reports its blocks; `None` if it has no entry.
    pub(crate) async fn status(
        &self,
        id: &ObjectIdentity,
    ) -> Result<Option<ObjectStatus>, CacheError> {
        self.status_of(id, false).await
    }

    /// Like [`status`](Self::status), but an object with no entry gets an empty one, for a
    /// caller about to fetch it and write its blocks: looking and creating then take one trip
    /// to the blocking pool, where the lookup and the first write would take one each.
    pub(crate) async fn status_or_create(
        &self,
        id: &ObjectIdentity,
    ) -> Result<Option<ObjectStatus>, CacheError> {
        self.status_of(id, true).await
    }

    pub(super) async fn status_of(
        &self,
        id: &ObjectIdentity,
        create: bool,
    ) -> Result<Option<ObjectStatus>, CacheError> {
        let key = id.entry_key();
        let Some(entry) = self.load(id, key, create).await? else {
            return Ok(None);
        };
        let refreshed = self.refresh(&entry).await;
        let status = {
            let b = entry.blocks.lock();
            ObjectStatus {
                blocks_present: b.present() as u64,
                blocks_total: b.count(),
                complete: b.is_complete(),
            }
        };
        drop(entry);
        self.settle(&key);
        refreshed?;
        Ok(Some(status))
    }

    /// The complete data file of `id`, opened read-only, to back FUSE passthrough
    /// (`ReplyOpen::opened_passthrough`); `None` unless every block is present. The file is
    /// checked to be the object's size with no holes, so the kernel (which checks no CRC)
    /// can only read bytes this cache wrote. Pin the object for as long as the file is used.
    ///
    /// A closed entry of one present block is opened by name, as [`entry::OneBlock`] reads
    /// are: its table record has the nonce, so the journal is not opened and read back (a
    /// second trip to the blocking pool and a cold read of the journal). That is the open of
    /// every small file past the cap on open entries; on 20,000 small files with no kept
    /// backing files it was most of the daemon's CPU per open. Only the journal's news from
    /// other processes is not seen, which a kept backing file does not see either: the caller
    /// asks only for entries known good to this process, and another process can only evict
    /// the entry (the file is then gone or unlinked: the by-name open fails over to the
    /// journal, or finds `nlink` 0) or drop a block and write the object's own bytes again.
    pub async fn open_complete(&self, id: &ObjectIdentity) -> Result<Option<DataFile>, CacheError> {
        let key = id.entry_key();
        if let Some(file) = self.open_closed_one_block(id, false).await? {
            return Ok(Some(file));
        }
        let Some(entry) = self.load(id, key, false).await? else {
            return Ok(None);
        };
        let refreshed = self.refresh(&entry).await;
        let complete = entry.blocks.lock().is_complete();
        let nonce = entry.nonce;
        let path = entry.key.data_path(&self.root, nonce);
        drop(entry);
        self.settle(&key);
        refreshed?;
        if !complete {
            return Ok(None);
        }
        self.open_whole(path, id.size, nonce, None).await
    }

    /// [`Self::open_complete`] for an object of one block that is complete in the cache but
    /// not known good to this process (cached before a restart, not read since): its closed
    /// entry's data file opened by name, checked whole, and its bytes read and checked
    /// against the CRC its record keeps; then marked known good. The read brings the file's
    /// pages into the page cache, where the kernel's passthrough reads then find them. So
    /// the first epoch after a restart opens small files for passthrough at once, where a
    /// background check had left that open's reads to the daemon (and read the file twice).
    /// `None` when the entry is not such an entry (the caller falls back to its background
    /// check) or a check fails (the daemon's reads then check the block and drop it).
    pub async fn open_checked_one_block(
        &self,
        id: &ObjectIdentity,
    ) -> Result<Option<DataFile>, CacheError> {
        let file = self.open_closed_one_block(id, true).await?;
        if file.is_some() {
            self.mark_known_good(id);
            self.finish_read(id.entry_key(), true);
        }
        Ok(file)
    }

    /// The data file of `id`'s closed entry of one present block, by the name its record
    /// keeps, if it is whole ([`Self::open_whole`]) and, with `check_crc`, its bytes match the
    /// CRC its record keeps; `None` for any other entry.
    async fn open_closed_one_block(
        &self,
        id: &ObjectIdentity,
        check_crc: bool,
    ) -> Result<Option<DataFile>, CacheError> {
        let key = id.entry_key();
        let Some(one) = closed_one_block(&self.state.lock().table, key) else {
            return Ok(None);
        };
        let path = key.data_path(&self.root, one.nonce);
        let crc = check_crc.then_some(one.crc);
        self.open_whole(path, id.size, one.nonce, crc).await
    }

    /// Opens the data file at `path` on a blocking thread if it is whole: `size` bytes, no
    /// holes, still linked, and with `crc`, its bytes (one block) matching it; `None` when it
    /// is not (or is gone).
    async fn open_whole(
        &self,
        path: PathBuf,
        size: u64,
        nonce: u64,
        crc: Option<u32>,
    ) -> Result<Option<DataFile>, CacheError> {
        self.blocking(move || -> io::Result<Option<DataFile>> {
            let f = match File::open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(e),
            };
            let m = f.metadata()?;
            if m.nlink() == 0 {
                return Ok(None); // evicted meanwhile
            }
            if m.len() != size || (size > 0 && sys::first_hole(&f)? != size) {
                tracing::warn!(path = %path.display(), "a complete cache entry's data file has holes or a wrong size; not using it");
                return Ok(None);
            }
            if let Some(crc) = crc {
                let want = Expected {
                    len: size,
                    crc,
                    known_good: false,
                };
                if read_checked(&f, 0, want).is_none() {
                    return Ok(None);
                }
            }
            Ok(Some(DataFile { file: f, nonce }))
        })
        .await?
        .map_err(|e| io_err("opening a complete cache file", e))
    }

    /// The data file of `id`'s complete entry when its files are open in this process: a
    /// duplicate of the descriptor the cache already holds, so no metadata task is needed.
    /// `None` when the entry is not open here or not complete (use [`Self::open_complete`]).
    /// Only for entries the caller knows to be whole and good (written or verified by this
    /// process): unlike `open_complete` it does not look for holes.
    pub(crate) fn complete_data_file(&self, id: &ObjectIdentity) -> Option<DataFile> {
        let key = id.entry_key();
        let entry = self.cached_open(key, id.size)?;
        let file = if entry.blocks.lock().is_complete() {
            // The descriptor's file size, not a path lookup: the entry's own file.
            entry
                .data
                .try_clone()
                .ok()
                .filter(|f| f.metadata().is_ok_and(|m| m.len() == id.size))
        } else {
            None
        };
        let nonce = entry.nonce;
        drop(entry);
        self.settle(&key);
        file.map(|file| DataFile { file, nonce })
    }

    /// Where the data file of entry `key` named with `nonce` is (see [`DataFile`]).
    pub(crate) fn data_path(&self, key: &EntryKey, nonce: u64) -> PathBuf {
        key.data_path(&self.root, nonce)
    }
}
