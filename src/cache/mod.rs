//! The persistent NVMe block cache: survives unmount, SIGKILL and restart, shared safely by
//! several mounts on one node, read and written through io_uring.
//!
//! # Layout and identity
//! One entry per object *version*, keyed by (endpoint, bucket, key, ETag, size) hashed to a
//! 128-bit [`EntryKey`] ([`identity`]). An entry is two files under
//! `DIR/objects/ab/`: a sparse **data file** holding the object's bytes at their own
//! offsets (so a complete one is byte-for-byte the object and can back FUSE passthrough), and
//! an append-only **journal** (`.idx`) with a header (format version, block size, object
//! size, the full identity, a nonce naming the data file) and one 16-byte record per block
//! written or dropped, each with the block's CRC32C. Blocks are `block_size` bytes (1 MiB by
//! default, the fetcher's block; the last block of an object is short). [`format`](mod@format) has the
//! byte layout; `DIR/riffle-cache.format` records the format version and block size, and a
//! directory with another version or block size is refused ([`CacheError::Format`],
//! [`CacheError::BlockSize`]).
//!
//! Why per-object journals rather than one embedded database: no single file serialises the
//! writers of several processes, there is nothing to compact, an entry is removed with two
//! unlinks, a crash can damage at most the record being appended, and the data file layout is
//! exactly what passthrough needs. The cost is one small file per object next to the data.
//!
//! # Crash safety
//! A block is recorded present only after its bytes were written, by appending its record
//! afterwards ([`disk`] lists the five steps of a write). Loading an entry replays its
//! journal, so whatever a crashed process left unfinished is simply absent; a torn or garbage
//! record is skipped (records carry their own CRC and replay resynchronises byte by byte).
//! Every block read is checked against its recorded CRC32C: a mismatch (a flipped bit, a file
//! changed behind the cache's back, data lost in a machine crash while its record survived:
//! nothing is `fdatasync`ed) drops the block, counts it, and reports a miss, so the caller
//! fetches it again. Bytes that fail their check are never returned. The unit tests stop a
//! write before each step, and halfway through each write, then reopen the directory; another
//! keeps records whose data was lost.
//!
//! # I/O
//! All data I/O (block reads and writes, journal appends) goes through [`ring::Ring`]:
//! dedicated threads each driving an io_uring, fed over a channel, submitting in batches and
//! resolving oneshot futures (where io_uring is refused, as by a container's default seccomp
//! profile, `pread`/`pwrite` threads behind the same API). Whole blocks
//! (aligned offsets and lengths) use `O_DIRECT`, so filling the cache does not evict the page
//! cache and the daemon does not hold a second copy of what the kernel's FUSE page cache
//! already holds; the short last block and filesystems without `O_DIRECT` (older tmpfs) use
//! buffered I/O on a second descriptor ([`CacheConfig::direct_io`] turns `O_DIRECT` off). The
//! `O_DIRECT` descriptor is opened only for objects that have a whole block: a small file
//! needs one descriptor, not two. Buffered block writes made W2's cold epoch 1.5–2× as long. A block's journal record goes
//! to the ring chained to the block's write ([`ring::Ring::write_then`]): one round trip.
//! Metadata work (opening, creating and linking files, replaying journals, unlinking evicted
//! entries) runs on tokio's blocking pool, at most 16 tasks at a time per cache. The system
//! calls made on the caller's thread are ones that never wait for the disk (non-blocking lock
//! operations: `flock`/`fcntl` with `LOCK_NB`/`F_OFD_SETLK`; `fstat` on open descriptors; one
//! `statvfs` per block write, the free-space guard), and one exception asked for by name:
//! [`DiskCache::read_short_block_here`] reads an object's short last block with `pread` on
//! the calling FUSE thread, as a local file system's reader waits for its own read (measured
//! there). None is made while the cache's state lock is held.
//!
//! On the development VM's virtio disk the device dominates (cache writes 470–1000 MiB/s,
//! reads with the CRC check 510–1470 MiB/s, plain `O_DIRECT` `pread` 850–2100 MiB/s; the
//! ignored test `cache::tests::throughput` measures them) and the ring costs nothing measurable.
//!
//! # Budget and eviction
//! [`CacheConfig::max_bytes`] is bytes or a percentage of the cache filesystem, and every
//! reservation also keeps [`CacheConfig::min_free`] (5% by default) of the filesystem free.
//! Eviction removes whole objects in the order of an [`EvictionPolicy`] (`plan` by default:
//! [`evict::policy`]; [`evict`] explains the trait), skipping entries that are pinned ([`DiskCache::pin`] — an
//! open file), being written, or in use in another process. When nothing can go, the write is
//! refused with [`CacheError::Full`] and the caller serves the bytes it fetched anyway.
//!
//! # Memory
//! A node caching 10^6–10^7 objects keeps every one of them in this index, so an entry's
//! in-memory cost is a budget: at most 150 bytes per cached object (`tests/cache_memory.rs`
//! measures it with a counting allocator on the W1 state: 139 bytes live, 113 after a
//! restart). [`DiskCache::index_memory`] agrees within 1%; [`disk::closed_entry_bytes`]
//! (what `riffle cache stats` reports without a mount) estimates 120.
//!
//! How, per entry (`disk`, [`slab`], `entry`):
//! - **One table.** Known entries are 64-byte records in numbered slots of a [`slab::Chunked`]
//!   array (1,024 slots at a time: at most one chunk of slack, nothing moved as it grows),
//!   and a [`slab::KeyIndex`] from key to slot holds only the 4-byte slot number and a tag
//!   byte per bucket (about 7 bytes per entry), comparing keys through the records. The key
//!   is stored once, in the record.
//! - **Policies by slot.** Eviction policies name entries by slot ([`evict::Slot`]) and keep
//!   their per-entry state in arrays indexed by it, with no key and no map of their own:
//!   the default `plan` policy spends 16 bytes and its inner `epoch` policy 24 per slot, the
//!   LRU of open entries 8. The epoch policy's boundary sample adds at most 4,096 keys (24
//!   bytes each; about 17 bytes per object on W1, nothing per object at scale).
//! - **Idle open entries inline.** An open entry nobody uses (no pin, no write, no I/O in
//!   flight), of at most one block, lives in its record as `entry::Files::Idle`: the same
//!   three descriptors, its nonce, its block's CRC32C and the journal length replayed, in 32
//!   bytes, instead of an `Arc<OpenEntry>` with `Arc`'d descriptors (220–280 bytes; 450
//!   when it also owned the object's `ObjectIdentity`). A use turns it back into an
//!   `OpenEntry` (three or four allocations, no system call: every block read is still checked
//!   against its CRC, and pins still take the shared lock on the journal), and the end of the
//!   use makes it idle again, at no measurable cost on the warm calls.
//! - Entries of more than one block keep an `OpenEntry` while open (their block tables, 8
//!   bytes a block, live there): at most [`CacheConfig::max_open_objects`] of them, whose
//!   files are closed beyond that, least recently used first.
//!
//! Closing idle entries' descriptors would save nothing here (a descriptor costs the kernel,
//! not this index) and would cost opens on the warm path; the cap on open entries is there
//! for the open-file limit. A dataset of more small files than the cap (every real one: the
//! cap is 16,384, lower under a tight limit) has most entries closed during an epoch, so a
//! closed entry of one block keeps its data file's nonce and its CRC in the space of the
//! idle form (`Files::Closed`, no growth) and is read by name without the journal
//! (`entry::OneBlock`): on W1 without passthrough, reopening every closed entry halved the
//! warm epoch's rate; reading by name keeps it equal to a dataset whose entries all stay open.
//! With passthrough the same name opens the backing file (`DiskCache::open_complete`) when
//! none is kept: 1.4–1.8× the warm rate of W7's 100,000 files against loading the journal.
//!
//! # Sharing one directory between processes
//! - `DIR/lock`: every [`DiskCache`] holds a shared `flock` on it; `clear` needs the exclusive
//!   one, so it refuses while a mount runs ([`commands`]).
//! - Creating an entry: the journal header is written to a temporary file and `link`ed into
//!   place (exactly one creator wins; the others open the winner's), then the data file is
//!   created; nobody ever sees half a header.
//! - Writing a block: an OFD byte-range write lock on the block's range of the data file
//!   (taken without waiting: if another process is writing that block, this one skips it),
//!   then a replay of the journal's tail (skip if it just became present), then the write
//!   steps. Journal records are appended with `O_APPEND`, each in one 16-byte write, so
//!   appends from several processes never interleave within a record.
//! - Readers need no lock: they read only blocks that a journal records as complete and
//!   check their CRC.
//! - Using an entry (writing into it, or pinned by an open file) holds a shared `flock` on its
//!   journal. Eviction takes the exclusive lock *without waiting* and skips the entry if it
//!   cannot, checks the journal is still linked, unlinks the journal, then the data file. A
//!   process that still has an evicted entry's files open keeps reading them (an unlinked file
//!   stays readable); its next write notices the entry is gone (the journal's link count is
//!   0 after taking the shared lock) and creates a fresh one.
//! - Each process charges its budget with the entries it knows (the start-up scan, what it
//!   loads, and what it writes), so with several mounts on one directory, set their
//!   `--cache-size` to share the disk, e.g. each 45%; the 5% free-space guard is global and
//!   exact (`statvfs`).
//!
//! # API for the wiring (fetch / fs / cli)
//! ```text
//! let cache = DiskCache::open(CacheConfig::new(dir, SizeLimit::Percent(90.0)))?;   // at mount
//! let id = ObjectIdentity::new(endpoint, bucket, key, etag, size);  // per open file
//! let _pin = cache.pin(&id);                       // held by the FileReader: never evicted
//! cache.read_block(&id, i).await -> Ok(Some(bytes)) | Ok(None) = miss | Err(e) = cache failed
//! cache.write_block(&id, i, bytes).await           // after a GET; errors are informational
//! cache.open_complete(&id).await -> Ok(Some(DataFile)) // for ReplyOpen::opened_passthrough
//! cache.is_complete(&id) / has_block(&id, i)       // in-memory, no I/O
//! cache.stats()                                    // riffle stats
//! commands::stats_dir(dir) / commands::clear_dir(dir)      // riffle cache stats|clear (no mount)
//! ```
//! How the fetcher should use it: on a claim, blocks that miss the memory cache and are not in
//! flight are first looked up with `read_block` inside the task that would otherwise GET them
//! (one await per run of blocks; a `Some` resolves the waiters like a GET would); the rest are
//! fetched, and each fetched block is handed to `write_block` in a spawned task *after* the
//! waiters were woken, so cache writes never delay a read. On `Err` from any call: log nothing
//! (the cache already warned once per kind), count, and go to the store. The identity must be
//! built only from a (key, ETag, size) this mount itself listed or HEADed with its own
//! credentials. The block size of the cache must equal the fetcher's.
//!
//! # Tenants
//! Listing or HEADing an object does not prove its bytes may be read, so the cache serves an
//! entry's bytes to a mount only with a **read proof** of the mount's principal
//! ([`proofs`]): a GET of its own (free: a single-tenant node never makes an extra request),
//! or, for an entry another principal filled, one GET of its first byte with `If-Match` at
//! the first open, whose 403 fails the open with `EACCES`. Proofs and refusals last the
//! metadata TTL and are kept in one log per principal under `DIR/proofs/`, so a remount does
//! not ask again. The fetcher's disk tier applies the rule (`fetch::disk`).

pub(crate) mod commands;
pub(crate) mod disk;
pub(crate) mod entry;
pub(crate) mod evict;
pub(crate) mod format;
pub(crate) mod identity;
pub(crate) mod proofs;
pub(crate) mod ring;
pub(crate) mod scan;
#[cfg(test)]
pub(crate) mod simulate;
pub(crate) mod slab;
pub(crate) mod sys;

#[cfg(test)]
mod tests;

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Entries whose files stay open at most, by default (the daemon lowers it to fit its
/// open-file limit: `cli::fd_limit`). An open entry serves its blocks with no metadata I/O,
/// straight from the I/O thread ([`DiskCache::read_block_on_ring`]); a closed one costs three
/// opens and a journal read on a blocking thread first, except a small file (one block),
/// whose record keeps its data file's name and CRC when it is closed, so it is read by name
/// like a local file (`entry::OneBlock`). 16,384 entries hold about 49,000
/// descriptors, and keep a dataset of that many files warm without passthrough; idle ones of
/// one block cost no memory beyond their record (see "Memory"), others 220–280 bytes.
pub(crate) const DEFAULT_MAX_OPEN_OBJECTS: usize = 16_384;

pub(crate) use commands::{clear_dir, stats_dir, DirStats};
pub use disk::DiskCache;
pub(crate) use disk::{DataFile, PinGuard, WriteStep};
pub use evict::{make_policy, EvictionKind, NoPlan, PlanOracle};
pub(crate) use identity::EntryKey;
pub use identity::ObjectIdentity;
pub(crate) use proofs::{Principal, ProofLog, Verdict};
pub(crate) use ring::reserve_for_kept_buffers;

/// The cache's byte budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SizeLimit {
    Bytes(u64),
    /// A percentage (0–100] of the cache filesystem's size, resolved at open.
    Percent(f64),
}

/// How to open a cache directory.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    pub dir: PathBuf,
    pub max_bytes: SizeLimit,
    /// Bytes per block: a power of two from 4 KiB to 64 MiB (1 MiB by default). Must equal the
    /// fetcher's block size and the block size the directory was created with.
    pub block_size: u64,
    /// Space always left free on the cache's filesystem: bytes, or a share of its size (5%).
    /// The cache stores nothing more (it evicts first) once the filesystem's free space would
    /// fall below it.
    pub min_free: SizeLimit,
    /// Use `O_DIRECT` for whole blocks where the filesystem supports it (true).
    pub direct_io: bool,
    /// io_uring threads (1 is plenty for one NVMe device).
    pub ring_threads: usize,
    /// Entries whose files stay open at most (each holds three descriptors); idle ones beyond
    /// it are closed and reopened on use.
    pub max_open_objects: usize,
}

impl CacheConfig {
    pub fn new(dir: impl Into<PathBuf>, max_bytes: SizeLimit) -> Self {
        CacheConfig {
            dir: dir.into(),
            max_bytes,
            block_size: 1 << 20,
            min_free: SizeLimit::Percent(5.0),
            direct_io: true,
            ring_threads: 1,
            max_open_objects: DEFAULT_MAX_OPEN_OBJECTS,
        }
    }

    fn validate(&self) -> Result<(), CacheError> {
        let bs = self.block_size;
        if !bs.is_power_of_two() || !(4096..=64 << 20).contains(&bs) {
            return Err(CacheError::Invalid(format!(
                "block size {bs}: must be a power of two from 4 KiB to 64 MiB"
            )));
        }
        if let SizeLimit::Percent(p) = self.min_free {
            if !(0.0..100.0).contains(&p) {
                return Err(CacheError::Invalid(format!(
                    "free space kept {p}% must be at least 0 and below 100"
                )));
            }
        }
        if let SizeLimit::Percent(p) = self.max_bytes {
            if !(p > 0.0 && p <= 100.0) {
                return Err(CacheError::Invalid(format!(
                    "cache size {p}% must be above 0 and at most 100"
                )));
            }
        }
        Ok(())
    }
}

/// What went wrong in the cache. None of these should fail a read: the caller serves from the
/// store instead ([`CacheError::is_disk_failure`] tells which deserve a warning; the cache
/// itself logs the first of each kind).
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The cache filesystem is full (ENOSPC or quota).
    #[error("no space left on the cache disk ({context})")]
    NoSpace { context: String },
    #[error("I/O error on the cache disk ({context}): {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    /// The budget is used up by entries that cannot be evicted now (pinned or in use).
    #[error("the cache is full of entries in use")]
    Full,
    /// Another process is evicting or writing this entry or block right now.
    #[error("the cache entry is busy in another process")]
    Busy,
    #[error("cache directory {dir} has format version {found}; this riffle reads version {expected} (run `riffle cache clear --cache-dir {dir}`)")]
    Format {
        dir: PathBuf,
        found: u32,
        expected: u32,
    },
    #[error(
        "cache directory {dir} uses {on_disk}-byte blocks, not {configured} (clear it to change)"
    )]
    BlockSize {
        dir: PathBuf,
        on_disk: u64,
        configured: u64,
    },
    /// The directory is in use by a mount (for `clear`), or being cleared (for `open`).
    #[error("cache directory {0} is in use (a mount is using it, or it is being cleared)")]
    InUse(PathBuf),
    #[error("invalid cache request: {0}")]
    Invalid(String),
    /// A cache task was cancelled because the daemon is shutting down.
    #[error("the daemon is shutting down")]
    ShuttingDown,
    /// Only produced by the unit tests' fault injection.
    #[error("simulated crash before {0:?}")]
    SimulatedCrash(WriteStep),
}

impl CacheError {
    /// An I/O error about the cache directory itself, reported as "`context` `dir`".
    pub(crate) fn dir_io(context: &str, dir: &Path, source: io::Error) -> CacheError {
        CacheError::Io {
            context: format!("{context} {}", dir.display()),
            source,
        }
    }

    /// Whether the cache disk itself failed (full or erroring): worth one warning.
    pub fn is_disk_failure(&self) -> bool {
        matches!(self, CacheError::NoSpace { .. } | CacheError::Io { .. })
    }
}

/// Creates the directory layout, checks the format file and takes the shared directory lock.
fn prepare_dir(root: &Path, block_size: u64) -> Result<File, CacheError> {
    let io = |context: &str, e| CacheError::dir_io(context, root, e);
    fs::create_dir_all(root).map_err(|e| io("creating", e))?;
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(root.join(format::LOCK_FILE))
        .map_err(|e| io("opening the lock file of", e))?;
    // `riffle cache stats` probes the lock for an instant; a clear holds it for long.
    let mut locked = false;
    for _ in 0..50 {
        if sys::try_flock(&lock, sys::Lock::Shared).map_err(|e| io("locking", e))? {
            locked = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if !locked {
        return Err(CacheError::InUse(root.to_path_buf()));
    }
    check_format(root, block_size)?;
    let tag = root.join(format::CACHEDIR_TAG);
    if !tag.exists() {
        let _ = fs::write(&tag, format::CACHEDIR_TAG_TEXT);
    }
    fs::create_dir_all(root.join(identity::OBJECTS_DIR)).map_err(|e| io("creating", e))?;
    Ok(lock)
}

/// Creates the format file (atomically, first creator wins) or checks it.
fn check_format(root: &Path, block_size: u64) -> Result<(), CacheError> {
    let path = root.join(format::FORMAT_FILE);
    let io = |e: io::Error| CacheError::Io {
        context: format!("the format file {}", path.display()),
        source: e,
    };
    for _ in 0..3 {
        match fs::read_to_string(&path) {
            Ok(text) => {
                let Some((version, bs)) = format::parse_format_file(&text) else {
                    return Err(CacheError::Format {
                        dir: root.to_path_buf(),
                        found: 0,
                        expected: format::FORMAT_VERSION,
                    });
                };
                if version != format::FORMAT_VERSION {
                    return Err(CacheError::Format {
                        dir: root.to_path_buf(),
                        found: version,
                        expected: format::FORMAT_VERSION,
                    });
                }
                if bs != block_size {
                    return Err(CacheError::BlockSize {
                        dir: root.to_path_buf(),
                        on_disk: bs,
                        configured: block_size,
                    });
                }
                return Ok(());
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let tmp = root.join(format!(
                    "{}.tmp.{}.{:08x}",
                    format::FORMAT_FILE,
                    std::process::id(),
                    rand::random::<u32>()
                ));
                let written = (|| {
                    let mut f = File::create(&tmp)?;
                    f.write_all(format::format_file_text(block_size).as_bytes())?;
                    f.sync_all()?;
                    match fs::hard_link(&tmp, &path) {
                        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
                        _ => Ok(()),
                    }
                })();
                let _ = fs::remove_file(&tmp);
                written.map_err(io)?;
            }
            Err(e) => return Err(io(e)),
        }
    }
    Err(io(io::Error::other("the format file keeps disappearing")))
}
