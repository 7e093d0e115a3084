//! Operator functions behind `riffle cache stats --cache-dir DIR` and `riffle cache clear
//! --cache-dir DIR`; both work without a mount and without a tokio runtime.
//!
//! `stats` only reads: it walks every journal (see `scan`) and is safe while mounts use the
//! directory (its numbers are then a snapshot that may be slightly behind).
//!
//! `clear` **refuses while any mount uses the directory**: every open [`super::DiskCache`]
//! holds a shared `flock` on `DIR/lock` for its whole life, and `clear` takes the exclusive
//! lock without waiting, failing with [`CacheError::InUse`]. Clearing under a live mount could
//! not be made both safe and useful (its open files would keep their space until it exits, and
//! its in-memory index would describe files that no longer exist), so an operator unmounts
//! first. While `clear` holds the lock, a mount that starts fails with `InUse` too. The
//! objects directory is first renamed aside (one atomic step: no entry is ever half visible),
//! then deleted; a clear interrupted by a crash leaves only a renamed directory, which the
//! next `clear` finishes removing. The format file goes too, so the next mount may choose
//! another block size.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::disk::closed_entry_bytes;
use super::format::{self, FORMAT_FILE, LOCK_FILE};
use super::identity::OBJECTS_DIR;
use super::scan::{self, WalkSummary};
use super::sys::{self, Lock};
use super::CacheError;

/// What `riffle cache stats` prints.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirStats {
    /// `(format version, block size)` from the format file; `None` for an empty directory.
    pub format: Option<(u32, u64)>,
    /// Whether a mount holds the directory right now.
    pub in_use: bool,
    pub objects: u64,
    pub complete_objects: u64,
    pub blocks: u64,
    /// Bytes charged to entries (what budgets count).
    pub bytes: u64,
    /// Bytes the cache's files occupy on disk.
    pub disk_bytes: u64,
    pub orphans: u64,
    pub unreadable: u64,
    /// In-memory index bytes a mount spends per cached object whose files are closed.
    pub index_memory_per_object: u64,
}

/// Walks the cache directory and summarises it (read-only; see the module documentation).
pub fn stats_dir(dir: &Path) -> Result<DirStats, CacheError> {
    let io = |context: &str, e| CacheError::dir_io(context, dir, e);
    let format = match fs::read_to_string(dir.join(FORMAT_FILE)) {
        Ok(t) => format::parse_format_file(&t),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(io("reading the format file of", e)),
    };
    let in_use = match fs::File::open(dir.join(LOCK_FILE)) {
        Ok(f) => !sys::try_flock(&f, Lock::Exclusive).map_err(|e| io("locking", e))?,
        Err(_) => false,
    };
    let WalkSummary {
        entries,
        complete,
        blocks,
        bytes,
        disk_bytes,
        unreadable,
        orphans,
        ..
    } = scan::walk(dir, false, &mut |_| true).map_err(|e| io("walking", e))?;
    Ok(DirStats {
        format,
        in_use,
        objects: entries,
        complete_objects: complete,
        blocks,
        bytes,
        disk_bytes,
        orphans,
        unreadable,
        index_memory_per_object: closed_entry_bytes(),
    })
}

/// What `clear` removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClearReport {
    pub files: u64,
    pub bytes: u64,
}

/// Removes every entry, refusing while a mount uses the directory (see the module
/// documentation). A directory that does not exist is already clear.
pub fn clear_dir(dir: &Path) -> Result<ClearReport, CacheError> {
    let io = |context: &str, e| CacheError::dir_io(context, dir, e);
    if !dir.exists() {
        return Ok(ClearReport::default());
    }
    let lock = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.join(LOCK_FILE))
        .map_err(|e| io("opening the lock file of", e))?;
    if !sys::try_flock(&lock, Lock::Exclusive).map_err(|e| io("locking", e))? {
        return Err(CacheError::InUse(dir.to_path_buf()));
    }
    let report = clear_locked(dir)?;
    tracing::info!(dir = %dir.display(), files = report.files, bytes = report.bytes, "cache cleared");
    drop(lock);
    Ok(report)
}

/// Removes every entry, the read proofs and the format file; the caller holds the directory lock exclusively.
fn clear_locked(dir: &Path) -> Result<ClearReport, CacheError> {
    let io = |context: &str, e| CacheError::dir_io(context, dir, e);
    let objects = dir.join(OBJECTS_DIR);
    if objects.exists() {
        let aside = dir.join(format!(
            "{OBJECTS_DIR}.clearing.{}.{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        fs::rename(&objects, &aside).map_err(|e| io("renaming the objects of", e))?;
    }
    let mut report = ClearReport::default();
    for e in fs::read_dir(dir).map_err(|e| io("listing", e))?.flatten() {
        let name = e.file_name();
        if name
            .to_str()
            .is_some_and(|n| n.starts_with(&format!("{OBJECTS_DIR}.clearing.")))
        {
            remove_counting(&e.path(), &mut report).map_err(|e| io("removing entries of", e))?;
        }
    }
    // The read proofs name entries that are gone now.
    let proofs = dir.join(super::proofs::PROOFS_DIR);
    if proofs.exists() {
        remove_counting(&proofs, &mut report).map_err(|e| io("removing the read proofs of", e))?;
    }
    match fs::remove_file(dir.join(FORMAT_FILE)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            return Err(io("removing the format file of", e))
        }
        _ => {}
    }
    Ok(report)
}

fn remove_counting(path: &Path, report: &mut ClearReport) -> io::Result<()> {
    for e in fs::read_dir(path)?.flatten() {
        let p = e.path();
        let meta = fs::symlink_metadata(&p)?;
        if meta.is_dir() {
            remove_counting(&p, report)?;
        } else {
            report.files += 1;
            report.bytes += meta.blocks() * 512;
            fs::remove_file(&p)?;
        }
    }
    fs::remove_dir(path)
}
