//! Listings saved on disk under `--cache-dir`, so a new mount does not list again.
//!
//! # What is saved, and where
//! Every listing a mount takes from the store (all pages of one directory, after the names
//! that cannot be POSIX names were dropped) is written to `DIR/listings/ab/<key>.lst`, where
//! `<key>` is the first 128 bits of SHA-256 over a domain tag and the length-prefixed
//! endpoint, bucket and directory key prefix (hex), and `ab` its first byte: one file per
//! directory, fanned out over 256 subdirectories like the block cache's entries. The file
//! repeats the endpoint, bucket and prefix in full and a load compares them, so another
//! endpoint, bucket or prefix never reads it, even after a hash collision. Nothing secret is
//! written: no credential, no header, only what a LIST returned (names, sizes, mtimes, ETags).
//!
//! # Format (little-endian)
//! ```text
//! "RIFFLIST" | version u32 = 1
//! | scope_len u32 | scope (endpoint, NUL, bucket) | prefix_len u32 | prefix
//! | taken: secs u64, nanos u32 (wall clock when the LIST started)
//! | dirs u32 | files u32
//! | per directory: name_len u16, name
//! | per file: name_len u16, name, size u64, mtime secs i64, mtime nanos u32,
//! |           etag kind u8 (0 text, 1 lowercase hex stored as bytes), etag_len u16, etag
//! | CRC32C u32 of everything before it
//! ```
//! About 50 bytes plus the name per file (a 32-hex-digit ETag takes 16 bytes): a directory of
//! 10^6 images is ~70 MB on disk, and nothing of it stays in memory once applied.
//!
//! # Crash safety
//! A listing is written to a temporary file beside its final name (`<key>.lst.tmp.<pid>.<n>`),
//! `fsync`ed, and renamed over the old one: a reader sees the old file or the new one, never a
//! mix. Should a file still be torn (a crash of the machine before the data reached the disk,
//! a truncated copy), its CRC32C or its length does not match and the whole file is ignored
//! (counted, logged at debug), and the directory is listed from the store as if nothing was
//! kept: a saved listing is used whole or not at all. A temporary file a crash left behind is
//! never read (only `.lst` files are) and goes with `riffle cache clear`.
//!
//! # Freshness and the access check
//! A saved listing is used only while it is younger than `--metadata-ttl` (always with
//! `indefinite`, never with `0`), measured from the wall-clock time its LIST started; once
//! applied it ages in memory like a listing just taken, so it is asked again when its TTL
//! runs out. It is used only after this mount proved, with its own credentials, that it can
//! list the bucket: [`SavedListings::grant_access`] is called once the mount's startup probe
//! (one LIST of the mount root) succeeded, and until then [`SavedListings::load`] answers
//! nothing. A changed object is still caught by the read path: every GET carries `If-Match`
//! with the ETag of the listing, and an object that no longer matches invalidates its
//! directory, which also deletes that directory's saved listing ([`SavedListings::forget`]).

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use super::names::invalid_reason;
use super::tree::{is_lower_hex, lower_hex, lower_hex_bytes};

/// The directory under the cache dir holding saved listings.
pub const LISTINGS_DIR: &str = "listings";

const MAGIC: &[u8; 8] = b"RIFFLIST";
const VERSION: u32 = 1;
const SUFFIX: &str = "lst";

/// One file of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedFile {
    /// The name in its directory.
    pub name: String,
    pub size: u64,
    pub etag: String,
    pub mtime: SystemTime,
}

/// A complete listing of one directory, names relative to it (valid POSIX names only).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawListing {
    /// Subdirectory names, sorted and without duplicates.
    pub dirs: Vec<String>,
    /// Files, none of them shadowed by a subdirectory of the same name.
    pub files: Vec<ListedFile>,
}

/// A listing read back from disk, and when its LIST was taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    pub taken: SystemTime,
    pub listing: RawListing,
}

/// Why a saved listing could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum KeptError {
    #[error("saved listing {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    /// Short, checksum mismatch, bad magic or version, or a field out of bounds.
    #[error("saved listing {path} is torn or damaged ({why}); ignored")]
    Torn { path: PathBuf, why: &'static str },
}

/// Saved listings of one endpoint and bucket under one cache directory (module documentation).
#[derive(Debug)]
pub struct SavedListings {
    dir: PathBuf,
    scope: String,
    access: AtomicBool,
}

/// Numbers temporary files: unique within the process (the pid makes them unique on the node).
static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl SavedListings {
    /// Listings of `bucket` at `endpoint` kept under `cache_dir`; not usable until
    /// [`Self::grant_access`].
    pub fn new(cache_dir: &Path, endpoint: &str, bucket: &str) -> Self {
        SavedListings {
            dir: cache_dir.join(LISTINGS_DIR),
            scope: format!("{endpoint}\0{bucket}"),
            access: AtomicBool::new(false),
        }
    }

    /// Records that this mount listed the mount root with its own credentials: from now on
    /// saved listings may be used.
    pub fn grant_access(&self) {
        self.access.store(true, Ordering::Release);
    }

    pub fn access_granted(&self) -> bool {
        self.access.load(Ordering::Acquire)
    }

    fn key_hex(&self, prefix: &str) -> String {
        let mut h = Sha256::new();
        h.update(b"riffle-listing-v1");
        for field in [self.scope.as_bytes(), prefix.as_bytes()] {
            h.update((field.len() as u64).to_le_bytes());
            h.update(field);
        }
        let digest = h.finalize();
        digest[..16].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Where the listing of the directory with key prefix `prefix` is kept.
    pub fn path_for(&self, prefix: &str) -> PathBuf {
        let key = self.key_hex(prefix);
        self.dir.join(&key[..2]).join(format!("{key}.{SUFFIX}"))
    }

    /// The saved listing of `prefix`: `Ok(None)` when there is none or access was not granted.
    /// Freshness is the caller's to judge (from [`Kept::taken`]).
    pub fn load(&self, prefix: &str) -> Result<Option<Kept>, KeptError> {
        if !self.access_granted() {
            return Ok(None);
        }
        let path = self.path_for(prefix);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(KeptError::Io { path, source }),
        };
        match decode(&bytes, &self.scope, prefix) {
            Ok(kept) => Ok(kept),
            Err(why) => Err(KeptError::Torn { path, why }),
        }
    }

    /// Keeps `listing` of `prefix`, taken at `taken` (crash-safe: temp file, fsync, rename).
    pub fn store(
        &self,
        prefix: &str,
        taken: SystemTime,
        listing: &RawListing,
    ) -> Result<(), KeptError> {
        let path = self.path_for(prefix);
        let io_err = |source| KeptError::Io {
            path: path.clone(),
            source,
        };
        let bytes = encode(&self.scope, prefix, taken, listing);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(io_err)?;
        }
        let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = path.with_extension(format!("{SUFFIX}.tmp.{}.{n}", std::process::id()));
        let written = (|| {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            fs::rename(&tmp, &path)
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(io_err(e));
        }
        Ok(())
    }

    /// Deletes the saved listing of `prefix` (its directory changed under a reader).
    pub fn forget(&self, prefix: &str) {
        let _ = fs::remove_file(self.path_for(prefix));
    }
}

/// What [`clear`] removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Cleared {
    pub files: u64,
    pub bytes: u64,
}

/// Removes every saved listing under `cache_dir` (for `riffle cache clear`).
pub fn clear(cache_dir: &Path) -> io::Result<Cleared> {
    let dir = cache_dir.join(LISTINGS_DIR);
    let mut out = Cleared::default();
    let subdirs = match fs::read_dir(&dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for sub in subdirs.flatten() {
        let path = sub.path();
        if sub.file_type()?.is_dir() {
            for f in fs::read_dir(&path)?.flatten() {
                out.files += 1;
                out.bytes += f.metadata().map_or(0, |m| m.len());
                fs::remove_file(f.path())?;
            }
            fs::remove_dir(&path)?;
        } else {
            out.files += 1;
            out.bytes += sub.metadata().map_or(0, |m| m.len());
            fs::remove_file(&path)?;
        }
    }
    fs::remove_dir(&dir)?;
    Ok(out)
}

/// Whether `etag` is lowercase hex of even length that fits the compact form.
fn compact_etag(etag: &str) -> bool {
    !etag.is_empty() && etag.len() <= 128 && is_lower_hex(etag)
}

fn put_str16(out: &mut Vec<u8>, s: &[u8]) {
    // Names are at most 255 bytes (longer ones were skipped); ETags are clamped to fit.
    let len = s.len().min(u16::MAX as usize);
    out.extend_from_slice(&(len as u16).to_le_bytes());
    out.extend_from_slice(&s[..len]);
}

fn put_str32(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s);
}

fn split_time(t: SystemTime) -> (i64, u32) {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
        Err(e) => {
            let d = e.duration();
            if d.subsec_nanos() == 0 {
                (-(d.as_secs() as i64), 0)
            } else {
                (-(d.as_secs() as i64) - 1, 1_000_000_000 - d.subsec_nanos())
            }
        }
    }
}

fn join_time(secs: i64, nanos: u32) -> SystemTime {
    let base = if secs >= 0 {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs as u64)
    } else {
        SystemTime::UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
    };
    base + Duration::from_nanos(u64::from(nanos))
}

fn encode(scope: &str, prefix: &str, taken: SystemTime, listing: &RawListing) -> Vec<u8> {
    let names: usize = listing.dirs.iter().map(String::len).sum::<usize>()
        + listing
            .files
            .iter()
            .map(|f| f.name.len() + f.etag.len())
            .sum::<usize>();
    let mut out =
        Vec::with_capacity(64 + scope.len() + prefix.len() + names + listing.files.len() * 30);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    put_str32(&mut out, scope.as_bytes());
    put_str32(&mut out, prefix.as_bytes());
    let (secs, nanos) = split_time(taken);
    out.extend_from_slice(&(secs.max(0) as u64).to_le_bytes());
    out.extend_from_slice(&nanos.to_le_bytes());
    out.extend_from_slice(&(listing.dirs.len() as u32).to_le_bytes());
    out.extend_from_slice(&(listing.files.len() as u32).to_le_bytes());
    for d in &listing.dirs {
        put_str16(&mut out, d.as_bytes());
    }
    for f in &listing.files {
        put_str16(&mut out, f.name.as_bytes());
        out.extend_from_slice(&f.size.to_le_bytes());
        let (secs, nanos) = split_time(f.mtime);
        out.extend_from_slice(&secs.to_le_bytes());
        out.extend_from_slice(&nanos.to_le_bytes());
        if compact_etag(&f.etag) {
            out.push(1);
            let raw: Vec<u8> = lower_hex_bytes(&f.etag).collect();
            put_str16(&mut out, &raw);
        } else {
            out.push(0);
            put_str16(&mut out, f.etag.as_bytes());
        }
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Reads fields off a byte slice; every read is bounds-checked.
struct Cursor<'a> {
    bytes: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        if self.bytes.len() < n {
            return Err("shorter than its fields");
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], &'static str> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, &'static str> {
        Ok(self.array::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, &'static str> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, &'static str> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, &'static str> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn str16(&mut self) -> Result<&'a [u8], &'static str> {
        let n = self.u16()? as usize;
        self.take(n)
    }

    fn str32(&mut self) -> Result<&'a [u8], &'static str> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    fn name(&mut self) -> Result<String, &'static str> {
        let raw = self.str16()?;
        let name = std::str::from_utf8(raw).map_err(|_| "a name is not UTF-8")?;
        if invalid_reason(name).is_some() || name.contains('/') {
            return Err("a name is not a valid entry name");
        }
        Ok(name.to_string())
    }
}

/// `Ok(None)`: a whole, valid file of another scope or prefix (a hash collision).
fn decode(bytes: &[u8], scope: &str, prefix: &str) -> Result<Option<Kept>, &'static str> {
    if bytes.len() < MAGIC.len() + 8 {
        return Err("too short");
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    let mut crc_bytes = [0u8; 4];
    crc_bytes.copy_from_slice(crc);
    if crc32c::crc32c(body) != u32::from_le_bytes(crc_bytes) {
        return Err("checksum mismatch");
    }
    let mut c = Cursor { bytes: body };
    if c.take(MAGIC.len())? != MAGIC {
        return Err("not a saved listing");
    }
    if c.u32()? != VERSION {
        return Err("another format version");
    }
    if c.str32()? != scope.as_bytes() || c.str32()? != prefix.as_bytes() {
        return Ok(None);
    }
    let secs = c.u64()?;
    let nanos = c.u32()?;
    if nanos >= 1_000_000_000 || secs > i64::MAX as u64 {
        return Err("bad time");
    }
    let taken = join_time(secs as i64, nanos);
    let n_dirs = c.u32()? as usize;
    let n_files = c.u32()? as usize;
    // Each entry takes at least 2 (dirs) or 25 (files) bytes: bound allocations by the body.
    if n_dirs.saturating_mul(2) + n_files.saturating_mul(25) > c.bytes.len() {
        return Err("counts larger than the file");
    }
    let mut dirs = Vec::with_capacity(n_dirs);
    for _ in 0..n_dirs {
        dirs.push(c.name()?);
    }
    let mut files = Vec::with_capacity(n_files);
    for _ in 0..n_files {
        let name = c.name()?;
        let size = c.u64()?;
        let secs = i64::from_le_bytes(c.array()?);
        let nanos = c.u32()?;
        if nanos >= 1_000_000_000 {
            return Err("bad time");
        }
        let etag = match c.u8()? {
            0 => std::str::from_utf8(c.str16()?)
                .map_err(|_| "an ETag is not UTF-8")?
                .to_string(),
            1 => lower_hex(c.str16()?),
            _ => return Err("bad ETag kind"),
        };
        files.push(ListedFile {
            name,
            size,
            etag,
            mtime: join_time(secs, nanos),
        });
    }
    if !c.bytes.is_empty() {
        return Err("trailing bytes");
    }
    Ok(Some(Kept {
        taken,
        listing: RawListing { dirs, files },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> RawListing {
        RawListing {
            dirs: vec!["a".into(), "sub dir".into()],
            files: vec![
                ListedFile {
                    name: "f1.jpg".into(),
                    size: 123,
                    etag: "0123456789abcdef0123456789abcdef".into(),
                    mtime: SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 5),
                },
                ListedFile {
                    name: "ünï".into(),
                    size: 0,
                    etag: "ABC-2".into(),
                    mtime: SystemTime::UNIX_EPOCH - Duration::new(10, 1),
                },
            ],
        }
    }

    #[test]
    fn round_trips_and_is_keyed_by_scope_and_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let kept = SavedListings::new(dir.path(), "http://e", "bucket");
        let taken = SystemTime::now();
        kept.store("ds/train/", taken, &sample()).unwrap();
        assert_eq!(kept.load("ds/train/").unwrap(), None, "no access yet");
        kept.grant_access();
        let back = kept.load("ds/train/").unwrap().unwrap();
        assert_eq!(back.listing, sample());
        assert_eq!(back.taken, taken);
        assert_eq!(kept.load("ds/other/").unwrap(), None);
        let other = SavedListings::new(dir.path(), "http://e", "bucket2");
        other.grant_access();
        assert_eq!(other.load("ds/train/").unwrap(), None);
        // A file of another scope at this path (a collision) is not used either.
        fs::create_dir_all(other.path_for("ds/train/").parent().unwrap()).unwrap();
        fs::copy(kept.path_for("ds/train/"), other.path_for("ds/train/")).unwrap();
        assert_eq!(other.load("ds/train/").unwrap(), None);
    }

    #[test]
    fn every_torn_or_flipped_file_is_rejected_whole() {
        let bytes = encode("s", "p/", SystemTime::now(), &sample());
        for len in 0..bytes.len() {
            assert!(decode(&bytes[..len], "s", "p/").is_err(), "torn at {len}");
        }
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(decode(&bad, "s", "p/").is_err(), "flipped byte {i}");
        }
        assert!(decode(&bytes, "s", "p/").unwrap().is_some());
    }

    #[test]
    fn an_entry_costs_about_sixty_bytes_on_disk() {
        let files: Vec<ListedFile> = (0..10_000)
            .map(|i| ListedFile {
                name: format!("n{i:08}_{i:04}.JPEG"),
                size: 110_000,
                etag: format!("{i:032x}"),
                mtime: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            })
            .collect();
        let listing = RawListing {
            dirs: vec![],
            files,
        };
        let bytes = encode("s", "p/", SystemTime::now(), &listing);
        let per_entry = bytes.len() / 10_000;
        // 20-byte names: 2 + 20 + 8 + 12 + 1 + 2 + 16 = 61 bytes.
        assert!(per_entry <= 64, "{per_entry} bytes per entry");
    }

    #[test]
    fn clear_removes_everything() {
        let dir = tempfile::tempdir().unwrap();
        let kept = SavedListings::new(dir.path(), "e", "b");
        kept.store("", SystemTime::now(), &sample()).unwrap();
        kept.store("x/", SystemTime::now(), &sample()).unwrap();
        let cleared = clear(dir.path()).unwrap();
        assert_eq!(cleared.files, 2);
        assert!(!dir.path().join(LISTINGS_DIR).exists());
        assert_eq!(clear(dir.path()).unwrap(), Cleared::default());
    }
}
