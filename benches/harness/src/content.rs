//! The bytes of every generated object: a deterministic function of the
//! dataset seed, the object's key (relative to the dataset prefix) and the
//! byte offset, so any range can be regenerated to verify a read without
//! downloading anything, and a whole object's checksum can be recomputed.
//!
//! Byte `o` of an object is byte `o % 8` (little-endian) of the 64-bit word
//! `mix64(base + (o / 8) * GOLDEN)` where `base = hash_str(seed, key)`.
//! Generation runs at several GB/s, so verification is cheap next to I/O.

use xxhash_rust::xxh3::Xxh3;

use crate::rng::{hash_str, mix64};

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// The content of one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Content {
    base: u64,
}

impl Content {
    pub fn new(seed: u64, key: &str) -> Self {
        Self {
            base: hash_str(seed, key),
        }
    }

    fn word(&self, index: u64) -> [u8; 8] {
        mix64(self.base.wrapping_add(index.wrapping_mul(GOLDEN))).to_le_bytes()
    }

    /// Fills `buf` with the object's bytes starting at `offset`.
    pub fn fill(&self, offset: u64, buf: &mut [u8]) {
        let mut pos = offset;
        let mut out = buf;
        // Unaligned head.
        let head = (pos % 8) as usize;
        if head != 0 && !out.is_empty() {
            let w = self.word(pos / 8);
            let n = (8 - head).min(out.len());
            out[..n].copy_from_slice(&w[head..head + n]);
            out = &mut out[n..];
            pos += n as u64;
        }
        let mut index = pos / 8;
        let mut chunks = out.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.word(index));
            index += 1;
        }
        let tail = chunks.into_remainder();
        if !tail.is_empty() {
            let w = self.word(index);
            let n = tail.len();
            tail.copy_from_slice(&w[..n]);
        }
    }

    /// `len` bytes from `offset`.
    pub fn bytes(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.fill(offset, &mut v);
        v
    }

    /// The checksum of the whole object of `size` bytes (see [`Checksum`]).
    pub fn checksum(&self, size: u64) -> u64 {
        let mut h = Checksum::new();
        self.each_chunk(size, |chunk| h.update(chunk));
        h.finish()
    }

    /// Calls `f` with the whole object of `size` bytes, 1 MiB at a time, in order.
    fn each_chunk(&self, size: u64, mut f: impl FnMut(&[u8])) {
        const CHUNK: usize = 1 << 20;
        let mut buf = vec![0u8; CHUNK.min(size as usize)];
        let mut off = 0u64;
        while off < size {
            let n = CHUNK.min((size - off) as usize);
            self.fill(off, &mut buf[..n]);
            f(&buf[..n]);
            off += n as u64;
        }
    }

    /// Index of the first byte of `data` that differs from the content at
    /// `offset`, if any.
    pub fn first_mismatch(&self, offset: u64, data: &[u8]) -> Option<usize> {
        const CHUNK: usize = 64 << 10;
        let mut expect = vec![0u8; CHUNK.min(data.len())];
        let mut done = 0usize;
        for piece in data.chunks(CHUNK) {
            let e = &mut expect[..piece.len()];
            self.fill(offset + done as u64, e);
            if piece != &e[..] {
                let i = piece.iter().zip(e.iter()).position(|(a, b)| a != b);
                return Some(done + i.unwrap_or(0));
            }
            done += piece.len();
        }
        None
    }
}

/// The streaming checksum used in manifests: XXH3-64 (not cryptographic;
/// it guards against wrong bytes, not against an adversary).
#[derive(Clone)]
pub struct Checksum(Xxh3);

impl Default for Checksum {
    fn default() -> Self {
        Self::new()
    }
}

impl Checksum {
    pub fn new() -> Self {
        Self(Xxh3::new())
    }
    pub fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }
    pub fn finish(&self) -> u64 {
        self.0.digest()
    }
}

/// Checksum of a byte slice in one go.
pub fn checksum_of(data: &[u8]) -> u64 {
    let mut h = Checksum::new();
    h.update(data);
    h.finish()
}

impl Content {
    /// The CRC-32 of the whole object of `size` bytes (see [`Crc32`]).
    pub fn crc32(&self, size: u64) -> u32 {
        let mut h = Crc32::new();
        self.each_chunk(size, |chunk| h.update(chunk));
        h.finalize()
    }
}

/// CRC-32 as zlib computes it (IEEE 802.3, the `crc32fast` crate): the
/// checksum of `riffle-bench plan --crc32`, which `benches/python_reader.py`
/// checks with the standard library's `zlib.crc32` (XXH3, the manifest's
/// checksum, is not in Python's standard library).
pub type Crc32 = crc32fast::Hasher;

/// CRC-32 (zlib's) of a byte slice in one go.
pub fn crc32_of(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_is_consistent_at_any_offset() {
        let c = Content::new(42, "train/c000/img_00001.jpg");
        let whole = c.bytes(0, 1000);
        for off in [0usize, 1, 7, 8, 9, 15, 333] {
            for len in [0usize, 1, 3, 8, 17, 100] {
                assert_eq!(
                    c.bytes(off as u64, len),
                    whole[off..off + len].to_vec(),
                    "off {off} len {len}"
                );
            }
        }
    }

    #[test]
    fn content_depends_on_seed_and_key() {
        let a = Content::new(1, "k").bytes(0, 64);
        assert_eq!(a, Content::new(1, "k").bytes(0, 64));
        assert_ne!(a, Content::new(2, "k").bytes(0, 64));
        assert_ne!(a, Content::new(1, "k2").bytes(0, 64));
    }

    #[test]
    fn checksum_matches_streaming_and_one_shot() {
        let c = Content::new(9, "shards/shard-00000.tar");
        let size = (3 << 20) + 12_345;
        let data = c.bytes(0, size);
        assert_eq!(c.checksum(size as u64), checksum_of(&data));
        assert_ne!(c.checksum(size as u64), c.checksum(size as u64 - 1));
    }

    #[test]
    fn crc32_is_zlibs() {
        // zlib.crc32(b"123456789") == 0xCBF43926 (the standard check value).
        assert_eq!(crc32_of(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32_of(b""), 0);
        // zlib.crc32(b"The quick brown fox jumps over the lazy dog")
        assert_eq!(
            crc32_of(b"The quick brown fox jumps over the lazy dog"),
            0x414F_A339
        );
        // Streaming in odd pieces gives the one-shot value.
        let c = Content::new(3, "train/c001/img_00042.jpg");
        let size = 300_007;
        let data = c.bytes(0, size);
        let mut h = Crc32::new();
        for piece in data.chunks(12_345) {
            h.update(piece);
        }
        assert_eq!(h.finalize(), crc32_of(&data));
        assert_eq!(c.crc32(size as u64), crc32_of(&data));
        let mut flipped = data.clone();
        flipped[77_777] ^= 0x10;
        assert_ne!(crc32_of(&flipped), crc32_of(&data));
    }

    #[test]
    fn first_mismatch_finds_a_flipped_byte() {
        let c = Content::new(5, "tokens.bin");
        let mut data = c.bytes(1000, 200_000);
        assert_eq!(c.first_mismatch(1000, &data), None);
        data[150_001] ^= 0x40;
        assert_eq!(c.first_mismatch(1000, &data), Some(150_001));
        assert_eq!(c.first_mismatch(1001, &data[1..]), Some(150_000));
    }
}
