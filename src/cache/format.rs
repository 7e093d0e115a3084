//! The on-disk format: the cache directory's format file, and each entry's index journal.
//!
//! ## The cache directory
//! ```text
//! DIR/riffle-cache.format   "rifflefs-cache\nformat 2\nblock_size 1048576\n" (created once, atomically)
//! DIR/CACHEDIR.TAG          so backup tools skip the cache
//! DIR/lock                  flock: shared by every open cache, exclusive by `clear`
//! DIR/objects/ab/<key>.idx               the entry's index journal
//! DIR/objects/ab/<key>-<nonce>.data      the entry's data: the object's bytes at their offsets
//! ```
//! A directory with another block size, or written by another format version, is refused with
//! a clear error (`riffle cache clear` starts it afresh) rather than half understood. Format 2
//! is the first released one; a change of format from here on says in CHANGELOG.md how a
//! directory of the previous one is carried over, with a test.
//!
//! ## The index journal (`.idx`)
//! An append-only file: a header, then fixed 16-byte records.
//!
//! Header (little-endian; `header_len` bytes, a multiple of 16):
//! ```text
//!  0  8  magic "RIFLIDX\n"
//!  8  4  format version (1)
//! 12  4  header_len
//! 16  8  block size
//! 24  8  object size
//! 32  8  nonce: names this incarnation's data file, `<key>-<nonce>.data`
//! 40  2  endpoint length   42 2 bucket length   44 4 key length   48 2 etag length   50 2 zero
//! 52  .. endpoint, bucket, key, etag (UTF-8)
//!  ..  4  CRC32C of everything above
//!  ..     zero padding to a multiple of 16
//! ```
//! Record:
//! ```text
//!  0  2  magic 0x52 0xB1      2 1 kind (1 = present, 2 = dropped)     3 1 zero
//!  4  4  block index          8 4 CRC32C of the block's bytes        12 4 CRC32C of bytes 0..12
//! ```
//! Replaying applies records in file order (the last record of a block wins). A record is valid
//! only if its magic, kind and own CRC check out and its block exists; anything else (a torn
//! append, zeros from a lost write, an odd-length fragment left by ENOSPC) is skipped one byte at
//! a time until the next valid record, so garbage in the middle never hides later records and
//! the chance of mistaking garbage for a record is about 2^-48.
//!
//! The nonce ties the journal to one data file: a data file whose journal is gone, or whose
//! journal names another nonce, is an orphan (left by a crash during eviction) and is deleted by
//! the scan. A journal never describes bytes of a data file it did not create.

use std::io;

use super::identity::ObjectIdentity;

/// The directory format version written by this code (the format file; 2: one fan-out level).
pub const FORMAT_VERSION: u32 = 2;
/// The version of the index journal's header and records.
pub const INDEX_VERSION: u32 = 1;
/// Name of the directory format file.
pub const FORMAT_FILE: &str = "riffle-cache.format";
pub const LOCK_FILE: &str = "lock";
pub const CACHEDIR_TAG: &str = "CACHEDIR.TAG";
pub const CACHEDIR_TAG_TEXT: &str = "Signature: 8a477f597d28d172789f06886806bc55\n\
# This file is a cache directory tag created by rifflefs (riffle mount --cache-dir).\n";

pub const INDEX_MAGIC: &[u8; 8] = b"RIFLIDX\n";
pub const RECORD_LEN: usize = 16;
const RECORD_MAGIC: [u8; 2] = [0x52, 0xB1];
const FIXED_HEADER: usize = 52;

/// The contents of the format file.
pub fn format_file_text(block_size: u64) -> String {
    format!("rifflefs-cache\nformat {FORMAT_VERSION}\nblock_size {block_size}\n")
}

/// Parses the format file: (format version, block size).
pub fn parse_format_file(text: &str) -> Option<(u32, u64)> {
    let mut lines = text.lines();
    if lines.next()? != "rifflefs-cache" {
        return None;
    }
    let version = lines.next()?.strip_prefix("format ")?.trim().parse().ok()?;
    let block_size = lines
        .next()?
        .strip_prefix("block_size ")?
        .trim()
        .parse()
        .ok()?;
    Some((version, block_size))
}

/// A decoded index header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub version: u32,
    pub header_len: usize,
    pub block_size: u64,
    pub size: u64,
    pub nonce: u64,
    pub endpoint: String,
    pub bucket: String,
    pub key: String,
    pub etag: String,
}

impl Header {
    pub fn new(id: &ObjectIdentity, block_size: u64, nonce: u64) -> Self {
        let mut h = Header {
            version: INDEX_VERSION,
            header_len: 0,
            block_size,
            size: id.size,
            nonce,
            endpoint: id.endpoint.to_string(),
            bucket: id.bucket.to_string(),
            key: id.key.to_string(),
            etag: id.etag.to_string(),
        };
        h.header_len = h.encode().len();
        h
    }

    /// Whether this header describes `id` with `block_size`.
    pub fn matches(&self, id: &ObjectIdentity, block_size: u64) -> bool {
        self.version == INDEX_VERSION
            && self.block_size == block_size
            && self.size == id.size
            && *self.endpoint == *id.endpoint
            && *self.bucket == *id.bucket
            && *self.key == *id.key
            && *self.etag == *id.etag
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(FIXED_HEADER + 128);
        b.extend_from_slice(INDEX_MAGIC);
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes()); // header_len, patched below
        b.extend_from_slice(&self.block_size.to_le_bytes());
        b.extend_from_slice(&self.size.to_le_bytes());
        b.extend_from_slice(&self.nonce.to_le_bytes());
        b.extend_from_slice(&(self.endpoint.len() as u16).to_le_bytes());
        b.extend_from_slice(&(self.bucket.len() as u16).to_le_bytes());
        b.extend_from_slice(&(self.key.len() as u32).to_le_bytes());
        b.extend_from_slice(&(self.etag.len() as u16).to_le_bytes());
        b.extend_from_slice(&0u16.to_le_bytes());
        for s in [&self.endpoint, &self.bucket, &self.key, &self.etag] {
            b.extend_from_slice(s.as_bytes());
        }
        let total = (b.len() + 4).next_multiple_of(RECORD_LEN);
        b[12..16].copy_from_slice(&(total as u32).to_le_bytes());
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b.resize(total, 0);
        b
    }

    /// Decodes a header from the start of `buf`.
    pub fn decode(buf: &[u8]) -> Result<Header, FormatError> {
        if buf.len() < FIXED_HEADER || &buf[..8] != INDEX_MAGIC {
            return Err(FormatError::NotAnIndex);
        }
        let u16_at = |o: usize| u16::from_le_bytes([buf[o], buf[o + 1]]) as usize;
        let u32_at = |o: usize| u32::from_le_bytes([buf[o], buf[o + 1], buf[o + 2], buf[o + 3]]);
        let u64_at = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&buf[o..o + 8]);
            u64::from_le_bytes(a)
        };
        let version = u32_at(8);
        if version != INDEX_VERSION {
            return Err(FormatError::Version(version));
        }
        let header_len = u32_at(12) as usize;
        let lens = [u16_at(40), u16_at(42), u32_at(44) as usize, u16_at(48)];
        let strings: usize = lens.iter().sum();
        let crc_at = FIXED_HEADER + strings;
        if header_len % RECORD_LEN != 0
            || header_len < crc_at + 4
            || header_len > buf.len()
            || crc_at + 4 > buf.len()
        {
            return Err(FormatError::Corrupt);
        }
        if crc32c::crc32c(&buf[..crc_at]) != u32_at(crc_at) {
            return Err(FormatError::Corrupt);
        }
        let mut at = FIXED_HEADER;
        let mut fields = Vec::with_capacity(4);
        for len in lens {
            let s = std::str::from_utf8(&buf[at..at + len]).map_err(|_| FormatError::Corrupt)?;
            fields.push(s.to_string());
            at += len;
        }
        let mut fields = fields.into_iter();
        let mut next = || fields.next().unwrap_or_default();
        Ok(Header {
            version,
            header_len,
            block_size: u64_at(16),
            size: u64_at(24),
            nonce: u64_at(32),
            endpoint: next(),
            bucket: next(),
            key: next(),
            etag: next(),
        })
    }

    pub fn block_count(&self) -> u64 {
        block_count(self.size, self.block_size)
    }
}

/// Blocks of an object of `size` bytes.
pub fn block_count(size: u64, block_size: u64) -> u64 {
    size.div_ceil(block_size)
}

/// Length of block `index` of an object of `size` bytes (the last one may be short).
pub fn block_len(size: u64, block_size: u64, index: u64) -> u64 {
    let start = index.saturating_mul(block_size);
    size.saturating_sub(start).min(block_size)
}

/// Why an index file could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("not a rifflefs cache index")]
    NotAnIndex,
    #[error("index format version {0} (this build reads version {INDEX_VERSION})")]
    Version(u32),
    #[error("the index header is corrupt")]
    Corrupt,
}

/// What a record says about a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// The block's bytes are durably in the data file and have this CRC32C.
    Present(u32),
    /// The block must not be trusted any more (its bytes failed their CRC).
    Dropped,
}

/// Encodes one record.
pub fn encode_record(index: u32, kind: RecordKind) -> [u8; RECORD_LEN] {
    let mut r = [0u8; RECORD_LEN];
    r[..2].copy_from_slice(&RECORD_MAGIC);
    let (k, crc) = match kind {
        RecordKind::Present(crc) => (1u8, crc),
        RecordKind::Dropped => (2u8, 0),
    };
    r[2] = k;
    r[4..8].copy_from_slice(&index.to_le_bytes());
    r[8..12].copy_from_slice(&crc.to_le_bytes());
    let own = crc32c::crc32c(&r[..12]);
    r[12..16].copy_from_slice(&own.to_le_bytes());
    r
}

/// Decodes the record at the start of `b` (at least 16 bytes), if it is one.
pub fn decode_record(b: &[u8]) -> Option<(u32, RecordKind)> {
    if b.len() < RECORD_LEN || b[..2] != RECORD_MAGIC || b[3] != 0 {
        return None;
    }
    let word = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    if crc32c::crc32c(&b[..12]) != word(12) {
        return None;
    }
    let kind = match b[2] {
        1 => RecordKind::Present(word(8)),
        2 => RecordKind::Dropped,
        _ => return None,
    };
    Some((word(4), kind))
}

/// The result of replaying journal bytes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Replay {
    /// Valid records applied.
    pub records: u64,
    /// Bytes skipped because they were not valid records.
    pub garbage: u64,
    /// Where replay stopped: the start of an incomplete trailing record, if any (the next
    /// replay continues from here, as the record may still be being appended).
    pub consumed: u64,
}

/// Applies the records in `buf` (which starts at file offset `base`) to `apply`, skipping
/// garbage as described in the module documentation. Records naming blocks at or past
/// `blocks` are skipped as garbage.
pub fn replay(
    buf: &[u8],
    base: u64,
    blocks: u64,
    mut apply: impl FnMut(u32, RecordKind),
) -> Replay {
    let mut out = Replay::default();
    let mut at = 0usize;
    while at + RECORD_LEN <= buf.len() {
        match decode_record(&buf[at..]) {
            Some((index, kind)) if (index as u64) < blocks => {
                apply(index, kind);
                out.records += 1;
                at += RECORD_LEN;
            }
            _ => {
                out.garbage += 1;
                at += 1;
            }
        }
    }
    out.consumed = base + at as u64;
    out
}

/// Reads all of `file` from `offset` (index journals are small; used off the async threads).
pub fn read_from(file: &std::fs::File, offset: u64) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let len = file.metadata()?.len();
    let want = len.saturating_sub(offset) as usize;
    let mut buf = vec![0u8; want];
    let mut done = 0;
    while done < want {
        let n = file.read_at(&mut buf[done..], offset + done as u64)?;
        if n == 0 {
            break;
        }
        done += n;
    }
    buf.truncate(done);
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> ObjectIdentity {
        ObjectIdentity::new(
            "http://127.0.0.1:1",
            "bucket",
            "dir/file.bin",
            "etag-1",
            5 << 20,
        )
    }

    #[test]
    fn header_round_trips_and_detects_corruption() {
        let h = Header::new(&id(), 1 << 20, 42);
        let bytes = h.encode();
        assert_eq!(bytes.len() % RECORD_LEN, 0);
        assert_eq!(h.header_len, bytes.len());
        let back = Header::decode(&bytes).expect("decodes");
        assert_eq!(back, h);
        assert!(back.matches(&id(), 1 << 20));
        assert!(!back.matches(&id(), 2 << 20));
        let mut other = id();
        other.etag = "etag-2".into();
        assert!(!back.matches(&other, 1 << 20));
        for i in [0, 9, 20, 60] {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(Header::decode(&bad).is_err(), "flip at {i} undetected");
        }
        let mut v2 = bytes.clone();
        v2[8] = 2;
        assert_eq!(Header::decode(&v2), Err(FormatError::Version(2)));
        assert_eq!(Header::decode(&bytes[..10]), Err(FormatError::NotAnIndex));
    }

    #[test]
    fn records_replay_in_order_and_skip_garbage() {
        let mut buf = Vec::new();
        buf.extend_from_slice(&encode_record(0, RecordKind::Present(7)));
        buf.extend_from_slice(&encode_record(1, RecordKind::Present(8)));
        // A torn append (half a record), then more records out of alignment.
        buf.extend_from_slice(&encode_record(2, RecordKind::Present(9))[..7]);
        buf.extend_from_slice(&encode_record(1, RecordKind::Dropped));
        buf.extend_from_slice(&[0u8; RECORD_LEN]);
        buf.extend_from_slice(&encode_record(3, RecordKind::Present(10)));
        buf.extend_from_slice(&encode_record(99, RecordKind::Present(1))); // no such block
        buf.extend_from_slice(&encode_record(0, RecordKind::Present(5))[..9]); // still appending
        let mut state = [None; 4];
        let r = replay(&buf, 100, 4, |i, k| state[i as usize] = Some(k));
        assert_eq!(r.records, 4);
        assert_eq!(
            state,
            [
                Some(RecordKind::Present(7)),
                Some(RecordKind::Dropped),
                None,
                Some(RecordKind::Present(10)),
            ]
        );
        assert!(r.garbage >= 7 + RECORD_LEN as u64);
        assert!(r.consumed <= 100 + buf.len() as u64);
    }

    #[test]
    fn format_file_round_trips() {
        assert_eq!(
            parse_format_file(&format_file_text(4096)),
            Some((FORMAT_VERSION, 4096))
        );
        assert_eq!(parse_format_file("nonsense"), None);
    }

    #[test]
    fn short_last_block() {
        assert_eq!(block_count(0, 10), 0);
        assert_eq!(block_count(25, 10), 3);
        assert_eq!(block_len(25, 10, 2), 5);
        assert_eq!(block_len(25, 10, 3), 0);
        assert_eq!(block_len(20, 10, 1), 10);
    }
}
