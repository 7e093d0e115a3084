//! The walk over existing entries: at start-up (in the background) and for `riffle cache stats`.
//!
//! For every journal it reads the header and replays the records, which gives the entry's
//! identity, present blocks and charged bytes; the journal's mtime is the entry's last use in
//! earlier runs. Entries reach the cache in batches of up to [`BATCH`] entries sorted newest
//! first (so the LRU order is exact within a batch, and a cache of up to that many entries is
//! ordered exactly), and eviction has candidates long before a walk over millions of entries
//! ends; until then, entries not yet found are simply not charged (the free-space guard still
//! holds).
//!
//! It also removes what crashes leave behind: data files with no journal, or whose journal
//! names another nonce (a crash between the two unlinks of an eviction), and temporary journals
//! of interrupted creations. Both only once older than a grace period, and an orphan's journal
//! is looked up again right before the unlink, so an entry being created by another process
//! at that moment (journal first, data second) is never touched.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use super::entry::{remove_if_exists, OneBlock};
use super::format::{self, Header};
use super::identity::{parse_file_name, EntryKey, FileName, OBJECTS_DIR};

/// Orphaned data files younger than this are left alone.
const ORPHAN_GRACE: Duration = Duration::from_secs(60);
/// Temporary journals younger than this are left alone.
const TEMP_GRACE: Duration = Duration::from_secs(600);
/// Entries handed to the cache at once.
pub const BATCH: usize = 65536;

/// One entry found on disk.
#[derive(Debug, Clone)]
pub struct Found {
    pub key: EntryKey,
    pub bytes: u64,
    pub blocks: u32,
    pub complete: bool,
    pub last_used: SystemTime,
    /// For an object of one block, present: its data file's nonce and CRC, so it can be read
    /// by name before its entry is opened (see `entry::OneBlock`).
    pub one_block: Option<OneBlock>,
}

/// Totals of a walk.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WalkSummary {
    pub entries: u64,
    pub complete: u64,
    pub blocks: u64,
    /// Charged bytes (4 KiB-rounded present blocks plus journals).
    pub bytes: u64,
    /// Bytes allocated on disk by all files of the cache (`st_blocks`).
    pub disk_bytes: u64,
    /// Journals that could not be read or decoded.
    pub unreadable: u64,
    /// Orphaned data files and stale temporary journals (removed if the walk cleans).
    pub orphans: u64,
    /// Journal bytes that were not valid records.
    pub garbage_bytes: u64,
}

/// The background start-up scan: hands each batch to `feed` until it returns false (the cache
/// was dropped), and logs how the walk ended.
pub fn run(root: &Path, feed: &mut dyn FnMut(Vec<Found>) -> bool) {
    match walk(root, true, feed) {
        Ok(s) => tracing::info!(
            entries = s.entries,
            bytes = s.bytes,
            orphans = s.orphans,
            unreadable = s.unreadable,
            "cache scan finished"
        ),
        Err(e) => {
            tracing::warn!(error = %e, "cache scan failed; entries not found are loaded on use")
        }
    }
}

/// An entry's last use in earlier runs: its journal's mtime.
fn last_used(meta: &fs::Metadata) -> SystemTime {
    meta.modified().unwrap_or(SystemTime::UNIX_EPOCH)
}

fn older_than(meta: &fs::Metadata, age: Duration) -> bool {
    meta.modified()
        .ok()
        .and_then(|m| SystemTime::now().duration_since(m).ok())
        .is_some_and(|d| d >= age)
}

fn subdirs(dir: &Path) -> io::Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    match fs::read_dir(dir) {
        Ok(rd) => {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    out.push(e.path());
                }
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    out.sort();
    Ok(out)
}

/// Walks every entry under `root` (see the module documentation). `sink` receives batches and
/// returns false to stop early. With `clean`, orphans are removed.
pub fn walk(
    root: &Path,
    clean: bool,
    sink: &mut dyn FnMut(Vec<Found>) -> bool,
) -> io::Result<WalkSummary> {
    let mut sum = WalkSummary::default();
    let mut batch = Vec::new();
    let mut flush = |batch: &mut Vec<Found>| {
        // Newest first: each is inserted at the cold end, so the oldest ends up coldest.
        batch.sort_by_key(|f| std::cmp::Reverse(f.last_used));
        sink(std::mem::take(batch))
    };
    for fan_out in subdirs(&root.join(OBJECTS_DIR))? {
        batch.extend(walk_leaf(root, &fan_out, clean, &mut sum)?);
        if batch.len() >= BATCH && !flush(&mut batch) {
            return Ok(sum);
        }
    }
    if !batch.is_empty() {
        flush(&mut batch);
    }
    Ok(sum)
}

fn walk_leaf(
    root: &Path,
    dir: &Path,
    clean: bool,
    sum: &mut WalkSummary,
) -> io::Result<Vec<Found>> {
    let mut journals = Vec::new();
    let mut data = Vec::new();
    let mut temps = Vec::new();
    for e in fs::read_dir(dir)?.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        match parse_file_name(name) {
            FileName::Index(k) => journals.push(k),
            FileName::Data(k, nonce) => data.push((k, nonce, e.path())),
            FileName::Temp(_) => temps.push(e.path()),
            FileName::Other => {}
        }
    }
    let mut nonces: HashMap<EntryKey, u64> = HashMap::new();
    let mut found = Vec::new();
    for key in journals {
        let path = key.index_path(root);
        let read = fs::File::open(&path).and_then(|f| {
            let meta = f.metadata()?;
            Ok((format::read_from(&f, 0)?, meta))
        });
        let (buf, meta) = match read {
            Ok(x) => x,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(_) => {
                sum.unreadable += 1;
                continue;
            }
        };
        sum.disk_bytes += meta.blocks() * 512;
        let Ok(header) = Header::decode(&buf) else {
            sum.unreadable += 1;
            continue;
        };
        let count = header.block_count();
        let mut present = vec![false; count as usize];
        let mut first_crc = 0;
        let replay = format::replay(
            &buf[header.header_len.min(buf.len())..],
            header.header_len as u64,
            count,
            |i, k| {
                present[i as usize] = match k {
                    format::RecordKind::Present(crc) => {
                        if i == 0 {
                            first_crc = crc;
                        }
                        true
                    }
                    _ => false,
                }
            },
        );
        sum.garbage_bytes += replay.garbage;
        let mut bytes = buf.len() as u64;
        let mut blocks = 0u32;
        for (i, p) in present.iter().enumerate() {
            if *p {
                blocks += 1;
                bytes += format::block_len(header.size, header.block_size, i as u64)
                    .next_multiple_of(4096);
            }
        }
        let complete = blocks as u64 == count;
        nonces.insert(key, header.nonce);
        sum.entries += 1;
        sum.blocks += blocks as u64;
        sum.bytes += bytes;
        if complete {
            sum.complete += 1;
        }
        found.push(Found {
            key,
            bytes,
            blocks,
            complete,
            last_used: last_used(&meta),
            one_block: (count == 1 && complete).then_some(OneBlock {
                nonce: header.nonce,
                crc: first_crc,
            }),
        });
    }
    for (key, nonce, path) in data {
        let Ok(meta) = fs::metadata(&path) else {
            continue;
        };
        if nonces.get(&key) == Some(&nonce) {
            sum.disk_bytes += meta.blocks() * 512;
            continue;
        }
        sum.orphans += 1;
        if clean && older_than(&meta, ORPHAN_GRACE) && !journal_names(root, key, nonce) {
            tracing::debug!(path = %path.display(), "removing an orphaned cache data file");
            remove_if_exists(&path)?;
        } else {
            sum.disk_bytes += meta.blocks() * 512;
        }
    }
    for path in temps {
        let Ok(meta) = fs::metadata(&path) else {
            continue;
        };
        if older_than(&meta, TEMP_GRACE) {
            sum.orphans += 1;
            if clean {
                remove_if_exists(&path)?;
            }
        }
    }
    Ok(found)
}

/// Whether the journal of `key` exists now and names `nonce` (the re-check before removing
/// an orphan).
fn journal_names(root: &Path, key: EntryKey, nonce: u64) -> bool {
    fs::File::open(key.index_path(root))
        .and_then(|f| format::read_from(&f, 0))
        .ok()
        .and_then(|b| Header::decode(&b).ok())
        .is_some_and(|h| h.nonce == nonce)
}
