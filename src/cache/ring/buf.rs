//! Buffers for the rings: 4096-aligned (for `O_DIRECT`), the large ones mapped pages of their
//! own with a small pool of freed ones kept for reuse (see [`AlignedBuf`]).

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;

use super::ALIGN;

/// A buffer aligned to [`ALIGN`]: `cap` bytes allocated, the first `len` initialised.
///
/// **Where block buffers live.** Buffers of at least [`MAPPED_MIN`] (every block the daemon
/// fetches or reads from the cache: 1 MiB by default) are mapped pages of their own, not heap
/// memory, and go back to the system when freed, except for those kept for the next
/// allocation (the pool: [`keeps`], so a steady stream of blocks costs no page faults). From
/// the heap, glibc kept what freed blocks left behind: blocks come and go by the thousand on
/// several threads, the heap's free space ends up in holes between live allocations, and a
/// daemon with `--max-memory 64M` reading six W2 shards reached 165–200 MiB of RSS for 64 MiB
/// of live blocks (75–105 MiB with block buffers mapped; `benches/memory.sh`). Mapped memory
/// is RSS only while a block lives or is kept, so the daemon's RSS follows `--max-memory`.
///
/// **Why the pool has a share of the budget.** A new mapping costs its pages' faults when the
/// block is first written, and those are taken inside the `O_DIRECT` read that fills it (the
/// kernel pins the pages one by one, faulting each in and zeroing it) and given back by
/// `munmap`. With a pool of a fixed 16 MiB, warm epochs without passthrough (W2-shaped: 1 GiB
/// of shards, `--max-memory 256M`, every block read from the NVMe cache) spent a quarter of
/// the daemon's CPU there (`perf`: 19% in `do_anonymous_page` under the reads, 6% in
/// `munmap`): a stream's read-ahead reads many blocks at once, more than the pool held, and
/// lets as many go once the reader has passed them (`reader`'s module documentation). A 64 MiB
/// pool cut the daemon's CPU per warm epoch from 65–91 to 49–56 ticks, 256 MiB to 46–51. So
/// the pool keeps the share of `--max-memory` the daemon reserves for it (an eighth, taken
/// from the budget of GETs in flight: [`reserve_for_kept_buffers`]) and as much again, at most
/// [`POOL_EXTRA_BYTES`] more (part of the fixed memory beside `--max-memory`). 48 MiB kept in
/// all at 256M cut the daemon's CPU per warm epoch there from 67.5 to 46 ticks, and at W2's
/// full scale (4 GiB of shards at the default 1G) from 275.5 to 212 (medians). Letting it keep
/// whatever the live buffers left of the whole budget was tried and measured worse: the kept
/// pages then stayed resident while the rest of the daemon's memory peaked (a listing walk
/// beside the readers), and `benches/memory.sh` went past its bound (348 MiB against 326 at
/// `--max-memory 256M`). The extra is at most the share itself because a fixed 16 MiB beside a
/// small budget put `benches/memory.sh`'s mixed load at 64M near or past its bound (peaks of
/// 128–132 MiB against 134 with it, 121–126 with 8 MiB); keeping only the share at 256M (32
/// MiB instead of 48) cost the daemon 52.5 instead of 46.5 ticks per warm epoch.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    cap: usize,
    pub(super) len: usize,
    /// Mapped pages (see above) rather than a heap allocation.
    pub(super) mapped: bool,
}

/// Buffers of at least this many bytes are mapped pages (see [`AlignedBuf`]).
pub const MAPPED_MIN: usize = 256 * 1024;
/// The most bytes of freed mapped buffers kept beyond the reserved share (see [`keeps`]).
pub const POOL_EXTRA_BYTES: usize = 16 << 20;

/// Freed mapped buffers kept for reuse (address, size), and their bytes.
pub(super) struct Pool {
    pub(super) bufs: Vec<(usize, usize)>,
    pub(super) bytes: usize,
}

pub(super) static POOL: parking_lot::Mutex<Pool> = parking_lot::Mutex::new(Pool {
    bufs: Vec::new(),
    bytes: 0,
});
/// Bytes of `--max-memory` reserved for kept buffers; 0 until set.
static RESERVED: AtomicUsize = AtomicUsize::new(0);

/// Lets the pool keep `bytes` of freed buffers and as many again, up to [`POOL_EXTRA_BYTES`]
/// more (`bytes` is the share of the daemon's `--max-memory` reserved for them; see
/// [`AlignedBuf`]).
pub fn reserve_for_kept_buffers(bytes: u64) {
    RESERVED.store(
        usize::try_from(bytes).unwrap_or(usize::MAX),
        Ordering::Relaxed,
    );
}

/// Whether a freed buffer of `size` bytes is kept beside the `kept` ones: while they stay
/// within the `reserved` share and as much again, at most [`POOL_EXTRA_BYTES`] more; within
/// [`POOL_EXTRA_BYTES`] while nothing is reserved (a process without a budget: tests, tools).
pub(super) fn keeps(kept: usize, size: usize, reserved: usize) -> bool {
    let limit = match reserved {
        0 => POOL_EXTRA_BYTES,
        share => share.saturating_add(share.min(POOL_EXTRA_BYTES)),
    };
    kept + size <= limit
}

/// Pages of `size` bytes: a pooled buffer of that size, else a new mapping.
fn map(size: usize) -> Option<NonNull<u8>> {
    {
        let mut pool = POOL.lock();
        if let Some(i) = pool.bufs.iter().rposition(|&(_, s)| s == size) {
            let (addr, _) = pool.bufs.swap_remove(i);
            pool.bytes -= size;
            return NonNull::new(addr as *mut u8);
        }
    }
    // SAFETY: a new private anonymous mapping; no existing memory is touched.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return None;
    }
    NonNull::new(raw.cast())
}

/// Gives back a buffer from [`map`]: to the pool while it [`keeps`] it, else to the system.
fn unmap(ptr: NonNull<u8>, size: usize) {
    {
        let mut pool = POOL.lock();
        if keeps(pool.bytes, size, RESERVED.load(Ordering::Relaxed)) {
            pool.bufs.push((ptr.as_ptr() as usize, size));
            pool.bytes += size;
            return;
        }
    }
    // SAFETY: `ptr` is a mapping of `size` bytes made by `map`, owned by the dropped buffer.
    unsafe { libc::munmap(ptr.as_ptr().cast(), size) };
}

// SAFETY: the buffer is uniquely owned heap memory.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads the initialised part.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    fn layout(cap: usize) -> std::alloc::Layout {
        // ALIGN is a power of two and cap is at most isize::MAX in practice; fall back to the
        // smallest valid layout rather than panic on absurd sizes (allocation then fails).
        std::alloc::Layout::from_size_align(cap.max(ALIGN).next_multiple_of(ALIGN), ALIGN)
            .unwrap_or(std::alloc::Layout::new::<[u8; ALIGN]>())
    }

    /// An empty buffer with room for `cap` bytes.
    pub fn with_capacity(cap: usize) -> AlignedBuf {
        let layout = Self::layout(cap);
        if layout.size() >= MAPPED_MIN {
            let Some(ptr) = map(layout.size()) else {
                std::alloc::handle_alloc_error(layout);
            };
            return AlignedBuf {
                ptr,
                cap: layout.size(),
                len: 0,
                mapped: true,
            };
        }
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout);
        };
        AlignedBuf {
            ptr,
            cap: layout.size(),
            len: 0,
            mapped: false,
        }
    }

    /// A copy of `data` in an aligned buffer.
    pub fn copy_from(data: &[u8]) -> AlignedBuf {
        let mut b = AlignedBuf::with_capacity(data.len());
        // SAFETY: the buffer has room for data.len() bytes and does not overlap `data`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), b.ptr.as_ptr(), data.len()) };
        b.len = data.len();
        b
    }

    /// Appends as much of `data` as there is room for; returns how many bytes it took.
    pub fn extend_from_slice(&mut self, data: &[u8]) -> usize {
        let take = data.len().min(self.cap - self.len);
        // SAFETY: `take` bytes fit after the initialised part; `data` does not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(self.len), take)
        };
        self.len += take;
        take
    }

    /// Bytes initialised so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is initialised yet.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(super) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the first `len` bytes are initialised (written by a copy or by the kernel).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.mapped {
            unmap(self.ptr, self.cap);
            return;
        }
        // SAFETY: allocated in `with_capacity` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.cap)) };
    }
}

/// Bytes to write: either the caller's buffer (buffered I/O, or `O_DIRECT` when it is
/// aligned: see [`is_aligned`]) or an aligned copy (`O_DIRECT`).
pub enum IoBuf {
    Bytes(Bytes),
    Aligned(AlignedBuf),
}

/// Whether `data` can be written with `O_DIRECT` as it is: its address and length are
/// multiples of [`ALIGN`] (a fetched block is received into an [`AlignedBuf`], so it needs no
/// aligned copy, which would double its memory while it is written).
pub fn is_aligned(data: &[u8]) -> bool {
    (data.as_ptr() as usize) % ALIGN == 0 && data.len() % ALIGN == 0
}

impl IoBuf {
    pub(super) fn as_slice(&self) -> &[u8] {
        match self {
            IoBuf::Bytes(b) => b,
            IoBuf::Aligned(a) => a.as_ref(),
        }
    }
}
