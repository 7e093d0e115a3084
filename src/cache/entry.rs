//! One open cache entry: its files, its block table, and the file-level protocol around them.
//!
//! **Block table.** One `u64` per block: 0 when absent, `PRESENT | crc32c` when the journal
//! says the block is durably in the data file. Built by replaying the journal at load and
//! brought up to date by replaying only the journal's new tail (other processes append to it)
//! when a block is not found. The table of an object of one block is kept inline, without an
//! allocation. A third bit, `VERIFIED`, marks a block this process knows to be good: it wrote
//! the block itself from bytes it had just fetched, or it read the block back from the data
//! file and its CRC matched. Such a block is read, whole or in part, without its CRC: the
//! trust FUSE passthrough gives a whole file whose blocks are all known good, block by
//! block. A block that went bad while no process that checked it had it open (a crash, a
//! power loss, another process) is checked before it is trusted. The mark lives only as long
//! as the open entry, and a record from another process that changes the block's CRC clears
//! it.
//!
//! **Idle form.** An open entry that nobody uses (no pin, no write, no I/O in flight) and that
//! has at most one block is kept by the table of known entries as [`Files::Idle`]: its three
//! descriptors, its nonce, its block's CRC and the journal length replayed, 32 bytes inline
//! and no allocation, instead of an [`OpenEntry`] behind an `Arc` (220–280 bytes with its
//! descriptors' `Arc`s). A use makes it an `OpenEntry` again ([`Files::activate`]: three or
//! four allocations, no system call), and the end of the use turns it back ([`Files::settle`]).
//! Nothing about the files changes in between: the same descriptors stay open, locks and
//! the replay mark carry over.
//!
//! **Creation** (no other process may ever see a half-made entry): the header is written to a
//! private temporary file, which is then `link`ed to its final name (`link` fails if the name
//! exists, so two racing creators agree on one journal: the loser opens the winner's). The data
//! file is created after the journal, so a data file without a journal is always an orphan.
//!
//! **Use lock.** A process that writes into an entry or has it pinned holds a shared `flock`
//! on its journal (one per process, counted in `users`); eviction takes the exclusive lock
//! without waiting, so it never removes an entry in use anywhere. Every shared lock is
//! followed by a check that the journal is still linked: an entry evicted between our open and
//! our lock is "dead", and the caller loads or creates it afresh.
//!
//! Functions here that touch the file system outside the ring are blocking (open, link,
//! journal reads): callers run them on `spawn_blocking`.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::format::{self, FormatError, Header, RecordKind};
use super::identity::{EntryKey, ObjectIdentity};
use super::ring::ALIGN;
use super::sys::{self, Lock};

const PRESENT: u64 = 1 << 32;
const VERIFIED: u64 = 1 << 33;

/// Disk bytes an entry is charged for one block of `len` bytes: the data rounded up to the
/// file system's 4 KiB allocation unit, plus its journal record.
pub fn charge(len: u64) -> u64 {
    len.next_multiple_of(4096) + format::RECORD_LEN as u64
}

/// A block table: inline for an object of at most one block.
#[derive(Debug)]
enum Table {
    Small { len: u8, slot: u64 },
    Large(Box<[u64]>),
}

impl Table {
    fn new(count: u64) -> Table {
        if count <= 1 {
            Table::Small {
                len: count as u8,
                slot: 0,
            }
        } else {
            Table::Large(vec![0u64; count as usize].into_boxed_slice())
        }
    }

    fn as_slice(&self) -> &[u64] {
        match self {
            Table::Small { len, slot } => &std::slice::from_ref(slot)[..*len as usize],
            Table::Large(b) => b,
        }
    }

    fn as_mut_slice(&mut self) -> &mut [u64] {
        match self {
            Table::Small { len, slot } => &mut std::slice::from_mut(slot)[..*len as usize],
            Table::Large(b) => b,
        }
    }
}

/// The block table and in-progress writes of one entry.
#[derive(Debug)]
pub struct Blocks {
    slots: Table,
    present: u32,
    /// Blocks being written by this process right now.
    pub writing: Vec<u32>,
    /// Journal bytes replayed so far.
    pub replayed_to: u64,
}

impl Blocks {
    fn new(count: u64) -> Self {
        Blocks {
            slots: Table::new(count),
            present: 0,
            writing: Vec::new(),
            replayed_to: 0,
        }
    }

    /// The recorded CRC of block `index`, if it is present.
    pub fn crc(&self, index: u64) -> Option<u32> {
        let v = *self.slots.as_slice().get(index as usize)?;
        (v & PRESENT != 0).then_some(v as u32)
    }

    /// Applies one journal record; returns +1 / -1 / 0 for the change in present blocks.
    pub fn apply(&mut self, index: u32, kind: RecordKind) -> i32 {
        let Some(slot) = self.slots.as_mut_slice().get_mut(index as usize) else {
            return 0;
        };
        let was = *slot & PRESENT != 0;
        match kind {
            RecordKind::Present(crc) => {
                let same = was && *slot as u32 == crc;
                *slot = PRESENT | crc as u64 | if same { *slot & VERIFIED } else { 0 };
                if was {
                    0
                } else {
                    self.present += 1;
                    1
                }
            }
            RecordKind::Dropped => {
                *slot = 0;
                if was {
                    self.present -= 1;
                    -1
                } else {
                    0
                }
            }
        }
    }

    pub fn present(&self) -> u32 {
        self.present
    }

    /// Whether block `index` is present and known good to this process (see the module
    /// documentation).
    pub fn is_verified(&self, index: u64) -> bool {
        self.slots
            .as_slice()
            .get(index as usize)
            .is_some_and(|v| v & (PRESENT | VERIFIED) == PRESENT | VERIFIED)
    }

    /// Marks block `index` known good, if it is still present with CRC `crc` (the one its
    /// bytes were checked against, or computed from).
    pub fn set_verified(&mut self, index: u64, crc: u32) {
        if let Some(slot) = self.slots.as_mut_slice().get_mut(index as usize) {
            if *slot & PRESENT != 0 && *slot as u32 == crc {
                *slot |= VERIFIED;
            }
        }
    }

    pub fn count(&self) -> u64 {
        self.slots.as_slice().len() as u64
    }

    pub fn is_complete(&self) -> bool {
        self.present as u64 == self.count()
    }

    /// Heap bytes of the table.
    pub fn heap_bytes(&self) -> usize {
        let table = match &self.slots {
            Table::Small { .. } => 0,
            Table::Large(b) => b.len() * 8,
        };
        table + self.writing.capacity() * 4
    }
}

/// How an attempt to become a user of an entry ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    Acquired,
    /// Another process holds the exclusive lock (evicting it right now).
    Busy,
    /// The entry was removed from the directory; load or create it again.
    Dead,
}

/// Why an existing journal could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("stale entry: {0}")]
    Stale(FormatError),
    #[error("the journal belongs to another object (hash collision or tampering)")]
    Mismatch,
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// One entry with its files open (see the module documentation).
pub struct OpenEntry {
    pub key: EntryKey,
    /// The object's size (its identity is not kept: the journal header holds it, and every
    /// caller names the object).
    pub size: u64,
    pub block_size: u64,
    pub nonce: u64,
    /// The journal, opened for reading and appending.
    pub idx: Arc<File>,
    /// The data file, buffered.
    pub data: Arc<File>,
    /// The data file with `O_DIRECT`, when enabled and supported.
    pub direct: Option<Arc<File>>,
    pub blocks: Mutex<Blocks>,
    users: Mutex<u32>,
    dead: AtomicBool,
}

impl std::fmt::Debug for OpenEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenEntry")
            .field("key", &self.key)
            .field("nonce", &self.nonce)
            .finish_non_exhaustive()
    }
}

impl OpenEntry {
    /// The descriptor a block of `len` bytes is read through: the `O_DIRECT` one when there
    /// is one and the length is aligned (offsets always are), the buffered one otherwise.
    pub fn file_for_reading(&self, len: u64) -> &Arc<File> {
        match &self.direct {
            Some(d) if len % ALIGN as u64 == 0 => d,
            _ => &self.data,
        }
    }

    /// Opens and replays the journal of `id`, and opens (creating if needed) its data file.
    /// `Ok(None)` when there is no journal.
    pub fn open_existing(
        root: &Path,
        id: &ObjectIdentity,
        key: EntryKey,
        block_size: u64,
        direct_io: bool,
    ) -> Result<Option<OpenEntry>, LoadError> {
        let idx = match OpenOptions::new()
            .read(true)
            .append(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(key.index_path(root))
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let buf = format::read_from(&idx, 0)?;
        let header = Header::decode(&buf).map_err(LoadError::Stale)?;
        if !header.matches(id, block_size) {
            return Err(LoadError::Mismatch);
        }
        let mut blocks = Blocks::new(header.block_count());
        let replay = format::replay(
            &buf[header.header_len..],
            header.header_len as u64,
            blocks.count(),
            |i, k| {
                blocks.apply(i, k);
            },
        );
        blocks.replayed_to = replay.consumed;
        if replay.garbage > 0 {
            tracing::debug!(entry = %key, garbage = replay.garbage, "skipped invalid bytes in a cache journal");
        }
        let data_path = key.data_path(root, header.nonce);
        let opened = open_data(&data_path);
        if idx.metadata()?.nlink() == 0 {
            // Evicted (by this process or another) between opening the journal and opening
            // the data file: the entry is gone, and a data file created here would be an orphan.
            if let Ok((_, true)) = opened {
                remove_if_exists(&data_path)?;
            }
            return Ok(None);
        }
        let (data, created) = opened?;
        let entry =
            OpenEntry::assemble(key, id, &header, idx, data, &data_path, direct_io, blocks)?;
        if created && entry.blocks.lock().present() > 0 {
            // The data file vanished (removed by hand): none of the journal's blocks exist.
            entry.drop_all_blocking();
        }
        // The journal's mtime orders the entries found at the next start-up.
        let _ = sys::touch(&entry.idx);
        Ok(Some(entry))
    }

    /// Creates a new entry for `id` (see the module documentation). `Ok(None)` when another
    /// creator won the race: load theirs.
    pub fn create(
        root: &Path,
        id: &ObjectIdentity,
        key: EntryKey,
        block_size: u64,
        direct_io: bool,
    ) -> io::Result<Option<OpenEntry>> {
        let dir = key.dir(root);
        let nonce: u64 = rand::random();
        let header = Header::new(id, block_size, nonce);
        let (index_path, encoded) = (key.index_path(root), header.encode());
        // The fan-out directory exists for all but the first entries of its prefix: try first,
        // create it only when missing (two system calls fewer per new entry).
        let result = match sys::create_published(&dir, &index_path, &encoded) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir_all(&dir)?;
                sys::create_published(&dir, &index_path, &encoded)
            }
            other => other,
        };
        let Some(idx) = result? else {
            return Ok(None);
        };
        let data_path = key.data_path(root, nonce);
        let (data, _) = open_data(&data_path)?;
        let mut blocks = Blocks::new(header.block_count());
        blocks.replayed_to = header.header_len as u64;
        let entry =
            OpenEntry::assemble(key, id, &header, idx, data, &data_path, direct_io, blocks)?;
        Ok(Some(entry))
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        key: EntryKey,
        id: &ObjectIdentity,
        header: &Header,
        idx: File,
        data: File,
        data_path: &Path,
        direct_io: bool,
        blocks: Blocks,
    ) -> io::Result<OpenEntry> {
        // Only a block whose length is a multiple of the alignment goes through `O_DIRECT`:
        // an object smaller than a block (the common small file) needs no second descriptor.
        let aligned_block =
            id.size >= header.block_size || (id.size > 0 && id.size % ALIGN as u64 == 0);
        let direct = if direct_io && aligned_block {
            sys::open_direct(data_path)?.map(Arc::new)
        } else {
            None
        };
        Ok(OpenEntry {
            key,
            size: id.size,
            block_size: header.block_size,
            nonce: header.nonce,
            idx: Arc::new(idx),
            data: Arc::new(data),
            direct,
            blocks: Mutex::new(blocks),
            users: Mutex::new(0),
            dead: AtomicBool::new(false),
        })
    }

    /// The entry kept in `files` (which must be [`Files::Idle`]), for an object of `size`
    /// bytes; `Err` gives the files back otherwise.
    fn from_idle(key: EntryKey, size: u64, block_size: u64, files: Files) -> Result<Self, Files> {
        let Files::Idle {
            nonce,
            idx,
            data,
            direct,
            crc,
            journal_len,
            present,
        } = files
        else {
            return Err(files);
        };
        let mut blocks = Blocks::new(format::block_count(size, block_size));
        if present {
            blocks.apply(0, RecordKind::Present(crc));
        }
        blocks.replayed_to = journal_len as u64;
        Ok(OpenEntry {
            key,
            size,
            block_size,
            nonce,
            idx: Arc::new(idx),
            data: Arc::new(data),
            direct: direct.map(Arc::new),
            blocks: Mutex::new(blocks),
            users: Mutex::new(0),
            dead: AtomicBool::new(false),
        })
    }

    /// Whether [`Self::into_idle`] would succeed now: alive, unused, at most one block, no
    /// write in progress, and nobody else holding a descriptor (no I/O in flight).
    fn can_idle(&self) -> bool {
        let b = self.blocks.lock();
        !self.is_dead()
            && *self.users.lock() == 0
            && b.count() <= 1
            && b.writing.is_empty()
            && b.replayed_to <= u32::MAX as u64
            && Arc::strong_count(&self.idx) == 1
            && Arc::strong_count(&self.data) == 1
            && self
                .direct
                .as_ref()
                .is_none_or(|d| Arc::strong_count(d) == 1)
    }

    /// The entry as [`Files::Idle`], when `this` is its only `Arc` and it qualifies
    /// ([`Self::can_idle`]); `this` back otherwise.
    fn into_idle(this: Arc<OpenEntry>) -> Result<Files, Arc<OpenEntry>> {
        if Arc::strong_count(&this) != 1 || !this.can_idle() {
            return Err(this);
        }
        let OpenEntry {
            key,
            size,
            block_size,
            nonce,
            idx,
            data,
            direct,
            blocks,
            users,
            dead,
        } = Arc::try_unwrap(this)?;
        let b = blocks.into_inner();
        let rebuild = |idx: Arc<File>, data: Arc<File>, direct: Option<Arc<File>>, b: Blocks| {
            Arc::new(OpenEntry {
                key,
                size,
                block_size,
                nonce,
                idx,
                data,
                direct,
                blocks: Mutex::new(b),
                users,
                dead,
            })
        };
        // `can_idle` saw every descriptor held only here, and nobody can clone it since.
        let idx = match Arc::try_unwrap(idx) {
            Ok(f) => f,
            Err(idx) => return Err(rebuild(idx, data, direct, b)),
        };
        let data = match Arc::try_unwrap(data) {
            Ok(f) => f,
            Err(data) => return Err(rebuild(Arc::new(idx), data, direct, b)),
        };
        let direct = match direct.map(Arc::try_unwrap) {
            None => None,
            Some(Ok(f)) => Some(f),
            Some(Err(d)) => return Err(rebuild(Arc::new(idx), Arc::new(data), Some(d), b)),
        };
        let crc = b.crc(0);
        Ok(Files::Idle {
            nonce,
            idx,
            data,
            direct,
            crc: crc.unwrap_or(0),
            journal_len: b.replayed_to as u32,
            present: crc.is_some(),
        })
    }

    /// Marks every present block dropped, in memory and in the journal (blocking).
    fn drop_all_blocking(&self) {
        let mut b = self.blocks.lock();
        let mut records = Vec::new();
        for i in 0..b.count() {
            if b.crc(i).is_some() {
                b.apply(i as u32, RecordKind::Dropped);
                records.extend_from_slice(&format::encode_record(i as u32, RecordKind::Dropped));
            }
        }
        drop(b);
        if let Err(e) = (&*self.idx).write_all(&records) {
            tracing::debug!(entry = %self.key, error = %e, "could not journal dropped blocks");
        }
    }

    /// Called after this process appended the `present` record of block `index`, before
    /// applying it in memory: when that record is the only one past the replay mark, moves
    /// the mark past it, so the next refresh does not read this process's own record back on
    /// a blocking thread (a 256-block object did that for every block it wrote). The record is
    /// applied by the writer itself (`Publish`).
    ///
    /// Why the record past the mark is ours: the block is not present yet, so no replay has
    /// passed our record (a replay applies every record it reads), and the mark only moves
    /// otherwise past a record of ours; so our record lies past the mark, and when exactly
    /// one record's length does, it is ours. A replay that read the tail meanwhile finds the
    /// mark moved and discards what it read (see `refresh_blocking`), and any record appended
    /// after ours stays past the mark.
    pub fn skip_own_record(&self, index: u32) {
        let mut b = self.blocks.lock();
        if b.crc(index as u64).is_some() {
            return;
        }
        let Ok(len) = self.idx.metadata().map(|m| m.len()) else {
            return;
        };
        if len == b.replayed_to + format::RECORD_LEN as u64 {
            b.replayed_to = len;
        }
    }

    /// Replays journal records appended since the last replay (blocking). Returns the
    /// blocks that became present, except those this process is writing (already charged).
    pub fn refresh_blocking(&self) -> io::Result<Vec<u32>> {
        let from = self.blocks.lock().replayed_to;
        if self.idx.metadata()?.len() <= from {
            return Ok(Vec::new());
        }
        let buf = format::read_from(&self.idx, from)?;
        let mut b = self.blocks.lock();
        if b.replayed_to != from {
            // Someone else replayed meanwhile; their result stands.
            return Ok(Vec::new());
        }
        let count = b.count();
        let mut appeared = Vec::new();
        let replay = format::replay(&buf, from, count, |i, k| {
            let ours = b.writing.contains(&i);
            if b.apply(i, k) > 0 && !ours {
                appeared.push(i);
            }
        });
        b.replayed_to = replay.consumed;
        Ok(appeared)
    }

    /// Whether the journal has grown past what was replayed (a cheap `fstat`).
    pub fn journal_grew(&self) -> bool {
        let from = self.blocks.lock().replayed_to;
        self.idx.metadata().map(|m| m.len() > from).unwrap_or(false)
    }

    /// Becomes a user: takes the shared lock on the first use (see the module documentation).
    pub fn acquire_use(&self) -> io::Result<Use> {
        if self.is_dead() {
            return Ok(Use::Dead);
        }
        let mut users = self.users.lock();
        if *users == 0 {
            if !sys::try_flock(&self.idx, Lock::Shared)? {
                return Ok(Use::Busy);
            }
            if self.idx.metadata()?.nlink() == 0 {
                let _ = sys::try_flock(&self.idx, Lock::Unlock);
                self.dead.store(true, Ordering::Relaxed);
                return Ok(Use::Dead);
            }
        }
        *users += 1;
        Ok(Use::Acquired)
    }

    /// Ends one use; the last one releases the shared lock.
    pub fn release_use(&self) {
        let mut users = self.users.lock();
        *users = users.saturating_sub(1);
        if *users == 0 {
            if let Err(e) = sys::try_flock(&self.idx, Lock::Unlock) {
                tracing::debug!(entry = %self.key, error = %e, "could not release a cache entry lock");
            }
        }
    }

    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Relaxed)
    }

    pub fn mark_dead(&self) {
        self.dead.store(true, Ordering::Relaxed);
    }

    /// Bytes this entry occupies as far as its journal says: present blocks (rounded to the
    /// allocation unit) and the journal itself.
    pub fn charged_bytes(&self) -> u64 {
        let b = self.blocks.lock();
        let mut total = b.replayed_to;
        for i in 0..b.count() {
            if b.crc(i).is_some() {
                total += format::block_len(self.size, self.block_size, i).next_multiple_of(4096);
            }
        }
        total
    }

    /// Heap bytes of this open entry (for the index-memory measurement): itself behind its
    /// `Arc`, its block table and its descriptors' `Arc`s.
    pub fn memory_bytes(&self) -> usize {
        let files = 2 + usize::from(self.direct.is_some());
        ARC_HEADER
            + std::mem::size_of::<OpenEntry>()
            + self.blocks.lock().heap_bytes()
            + files * (ARC_HEADER + std::mem::size_of::<File>()).next_multiple_of(8)
    }
}

/// The two reference counts in front of an `Arc`'s value.
const ARC_HEADER: usize = 16;

/// An entry's files as the table of known entries keeps them (see the module documentation).
#[derive(Debug)]
pub enum Files {
    /// Not open in this process; `blocks` are present as far as this process knows. For an
    /// object of one block that was present when its files were closed, `one_block` keeps
    /// what reading it back needs without the journal ([`OneBlock`]).
    Closed {
        blocks: u32,
        one_block: Option<OneBlock>,
    },
    /// Open and unused, an object of at most one block: the files of an [`OpenEntry`] and
    /// its state, without the allocation. The descriptors hold no lock (no use).
    Idle {
        nonce: u64,
        idx: File,
        data: File,
        direct: Option<File>,
        /// Block 0's CRC32C, when `present`.
        crc: u32,
        /// Journal bytes replayed.
        journal_len: u32,
        present: bool,
    },
    /// Open, in use or with more than one block.
    Active(Arc<OpenEntry>),
}

/// What an entry of one present block keeps once its files are closed (beyond the cap on
/// open entries): the name of its data file and its block's CRC32C, in the space the idle
/// form's descriptors took (the record does not grow). A reader can then open the data file
/// by name and check the bytes against the CRC, one `open` and one `pread` as a local file
/// system's reader makes, instead of reopening the entry (two opens, a journal read and a
/// journal `touch`, on a blocking thread). Bytes that fail the check, or a data file that is
/// gone (evicted by another process, which names a new entry's data file with a new nonce),
/// send the reader back to the entry's own path, which reloads it and drops a bad block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OneBlock {
    pub nonce: u64,
    pub crc: u32,
}

impl Default for Files {
    fn default() -> Self {
        Files::Closed {
            blocks: 0,
            one_block: None,
        }
    }
}

impl Files {
    /// Whether the files are open in this process.
    pub fn is_open(&self) -> bool {
        !matches!(self, Files::Closed { .. })
    }

    /// The open entry, if it is one (not made from idle files).
    pub fn active(&self) -> Option<&Arc<OpenEntry>> {
        match self {
            Files::Active(o) => Some(o),
            _ => None,
        }
    }

    /// Blocks present as far as this process knows.
    pub fn blocks(&self) -> u32 {
        match self {
            Files::Closed { blocks, .. } => *blocks,
            Files::Idle { present, .. } => u32::from(*present),
            Files::Active(o) => o.blocks.lock().present(),
        }
    }

    /// Whether the open files belong to an entry known to be evicted.
    pub fn is_dead(&self) -> bool {
        self.active().is_some_and(|o| o.is_dead())
    }

    /// The recorded CRC of block `index`, when the files are open and the block present (no
    /// allocation).
    pub fn crc(&self, index: u64) -> Option<u32> {
        match self {
            Files::Closed { .. } => None,
            Files::Idle { crc, present, .. } => (*present && index == 0).then_some(*crc),
            Files::Active(o) => o.blocks.lock().crc(index),
        }
    }

    /// The open entry of key `key` (an object of `size` bytes), made from idle files if need
    /// be (allocations, no system call); `None` when the files are closed.
    pub fn activate(
        &mut self,
        key: EntryKey,
        size: u64,
        block_size: u64,
    ) -> Option<Arc<OpenEntry>> {
        match self {
            Files::Closed { .. } => None,
            Files::Active(o) => Some(o.clone()),
            Files::Idle { .. } => {
                match OpenEntry::from_idle(key, size, block_size, std::mem::take(self)) {
                    Ok(entry) => {
                        let o = Arc::new(entry);
                        *self = Files::Active(o.clone());
                        Some(o)
                    }
                    Err(files) => {
                        *self = files;
                        None
                    }
                }
            }
        }
    }

    /// Turns an open entry that nobody else holds and nobody uses into idle files, when it
    /// qualifies; returns whether the files are idle now. The caller checks that no pin or
    /// write is counted on it.
    pub fn settle(&mut self) -> bool {
        match self {
            Files::Idle { .. } => return true,
            Files::Active(o) if Arc::strong_count(o) == 1 && o.can_idle() => {}
            _ => return false,
        }
        let Files::Active(o) = std::mem::take(self) else {
            return false;
        };
        match OpenEntry::into_idle(o) {
            Ok(idle) => {
                *self = idle;
                true
            }
            Err(o) => {
                *self = Files::Active(o);
                false
            }
        }
    }

    /// Closes the files (the descriptors are closed when the returned value is dropped),
    /// keeping what an idle entry of one present block needs to be read back ([`OneBlock`]).
    pub fn close(&mut self) -> Files {
        let blocks = self.blocks();
        let one_block = match self {
            Files::Idle {
                nonce,
                crc,
                present: true,
                ..
            } => Some(OneBlock {
                nonce: *nonce,
                crc: *crc,
            }),
            _ => None,
        };
        std::mem::replace(self, Files::Closed { blocks, one_block })
    }

    /// The data file's nonce and the block's CRC of a closed entry of one present block.
    pub fn closed_one_block(&self) -> Option<OneBlock> {
        match self {
            Files::Closed { one_block, .. } => *one_block,
            _ => None,
        }
    }

    /// Heap bytes beyond the table's slot.
    pub fn memory_bytes(&self) -> usize {
        self.active().map_or(0, |o| o.memory_bytes())
    }
}

/// Opens (creating if missing) a data file for reading and writing; `true` if created.
fn open_data(path: &Path) -> io::Result<(File, bool)> {
    let opts = |create_new: bool| {
        let mut o = OpenOptions::new();
        o.read(true).write(true).custom_flags(libc::O_CLOEXEC);
        if create_new {
            o.create_new(true);
        }
        o
    };
    match opts(true).open(path) {
        Ok(f) => Ok((f, true)),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok((opts(false).open(path)?, false)),
        Err(e) => Err(e),
    }
}

/// What happened to an eviction attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evicted {
    Removed,
    /// In use by some process (a shared lock is held).
    InUse,
    /// Not on disk (any more).
    Gone,
}

/// Removes an entry's files unless some process uses it (blocking; see the module
/// documentation): exclusive lock without waiting, check it is still linked, unlink the
/// journal first, then the data file.
pub fn evict_files(root: &Path, key: EntryKey) -> io::Result<Evicted> {
    let path = key.index_path(root);
    let f = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Evicted::Gone),
        Err(e) => return Err(e),
    };
    if !sys::try_flock(&f, Lock::Exclusive)? {
        return Ok(Evicted::InUse);
    }
    if f.metadata()?.nlink() == 0 {
        return Ok(Evicted::Gone);
    }
    let nonce = format::read_from(&f, 0)
        .ok()
        .and_then(|b| Header::decode(&b).ok())
        .map(|h| h.nonce);
    match fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Evicted::Gone),
        Err(e) => return Err(e),
    }
    match nonce {
        Some(n) => remove_if_exists(&key.data_path(root, n))?,
        None => {
            // Unreadable header: remove every data file of this key.
            for e in fs::read_dir(key.dir(root))?.flatten() {
                let name = e.file_name();
                let name = name.to_string_lossy();
                if name.starts_with(&key.hex()) && name.ends_with(".data") {
                    remove_if_exists(&e.path())?;
                }
            }
        }
    }
    Ok(Evicted::Removed)
}

pub fn remove_if_exists(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
