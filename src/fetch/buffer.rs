//! Block buffers sized by their content, and what a block really holds in memory.
//!
//! A block that can be written to the NVMe cache with `O_DIRECT` (its length a multiple of
//! [`ALIGN`]: every whole block, and a short one that happens to be) is received into an
//! [`AlignedBuf`], so the write needs no aligned copy. Any other block (the short last block
//! of an object: the whole of a small file) is written buffered, and gets a plain buffer of
//! exactly its length. An aligned buffer of less than [`MAPPED_MIN`] comes from the heap,
//! rounded up to [`ALIGN`], and glibc's aligned allocation leaves a gap of up to [`ALIGN`]
//! before it that later allocations of small files' blocks cannot use: a 2.5 KB file's
//! block held about 8 KiB of heap (measured: 8.3 KB of RSS per small file read, issue 46).
//!
//! [`footprint`] is what a block of some length holds with these rules; the memory cache
//! charges it (plus its own bookkeeping) instead of the block's length.

use bytes::Bytes;

use crate::cache::ring::{AlignedBuf, ALIGN, MAPPED_MIN};

/// A block being received: aligned when it may be written with `O_DIRECT`, else exactly its
/// length (see the module documentation).
pub(super) enum Filling {
    Aligned(AlignedBuf),
    Exact(Vec<u8>),
}

impl Filling {
    /// An empty buffer for a block of `len` bytes.
    pub(super) fn for_block(len: usize) -> Filling {
        if len % ALIGN == 0 {
            Filling::Aligned(AlignedBuf::with_capacity(len))
        } else {
            Filling::Exact(Vec::with_capacity(len))
        }
    }

    /// A block holding a copy of `data`.
    pub(super) fn copy_of(data: &[u8]) -> Bytes {
        let mut f = Filling::for_block(data.len());
        f.extend_from_slice(data);
        f.freeze()
    }

    /// Appends as much of `data` as the block has room for; returns how many bytes it took.
    pub(super) fn extend_from_slice(&mut self, data: &[u8]) -> usize {
        match self {
            Filling::Aligned(a) => a.extend_from_slice(data),
            Filling::Exact(v) => {
                let take = data.len().min(v.capacity() - v.len());
                v.extend_from_slice(&data[..take]);
                take
            }
        }
    }

    pub(super) fn len(&self) -> usize {
        match self {
            Filling::Aligned(a) => a.len(),
            Filling::Exact(v) => v.len(),
        }
    }

    pub(super) fn freeze(self) -> Bytes {
        match self {
            Filling::Aligned(a) => Bytes::from_owner(a),
            Filling::Exact(v) => Bytes::from(v),
        }
    }
}

/// The bytes a block of `len` bytes holds in memory in its buffer: mapped pages from
/// [`MAPPED_MIN`] on, the aligned allocation and its slack for other lengths that are a
/// multiple of [`ALIGN`], else its length and the allocator's header and rounding.
pub(crate) fn footprint(len: usize) -> u64 {
    let len = len as u64;
    let align = ALIGN as u64;
    if len >= MAPPED_MIN as u64 {
        len.next_multiple_of(align)
    } else if len % align == 0 {
        len.max(align) + align
    } else {
        (len + 8).next_multiple_of(16).max(32)
    }
}

/// `data` in a buffer sized by its content, when it sits in a larger one: a short block
/// read from the NVMe cache (the cache reads into [`AlignedBuf`]s, rounded up to [`ALIGN`];
/// such a buffer starts on an [`ALIGN`] boundary, a buffer of the block's own length does
/// so only by chance, and is then copied for nothing).
pub(crate) fn compact(data: Bytes) -> Bytes {
    let len = data.len();
    if len < MAPPED_MIN && len % ALIGN != 0 && (data.as_ptr() as usize) % ALIGN == 0 {
        Filling::copy_of(&data)
    } else {
        data
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_sized_by_content() {
        let small = Filling::copy_of(&[7u8; 2_500]);
        assert_eq!(&small[..], &[7u8; 2_500][..]);
        assert!(matches!(Filling::for_block(2_500), Filling::Exact(_)));
        assert!(matches!(Filling::for_block(8_192), Filling::Aligned(_)));
        let mut f = Filling::for_block(3);
        assert_eq!(f.extend_from_slice(b"abcdef"), 3);
        assert_eq!(f.len(), 3);
        assert_eq!(&f.freeze()[..], b"abc");
    }

    #[test]
    fn footprints_follow_the_buffers() {
        assert_eq!(footprint(2_500), 2_512);
        assert_eq!(footprint(1), 32);
        assert_eq!(footprint(8_192), 12_288);
        assert_eq!(footprint(1 << 20), 1 << 20);
        assert_eq!(footprint((1 << 20) - 100), 1 << 20);
    }

    #[test]
    fn a_short_block_in_an_aligned_buffer_is_copied_out() {
        let mut a = AlignedBuf::with_capacity(2_500);
        a.extend_from_slice(&[1u8; 2_500]);
        let in_aligned = Bytes::from_owner(a);
        let compacted = compact(in_aligned.clone());
        assert_eq!(compacted, in_aligned);
        assert_ne!(compacted.as_ptr(), in_aligned.as_ptr());
        let whole = Filling::copy_of(&[2u8; 8_192]);
        assert_eq!(compact(whole.clone()).as_ptr(), whole.as_ptr());
    }
}
