use std::ptr::NonNull;

use crate::session::MAX_WRITE_SIZE;

/// Size of the buffer for reading a request from the kernel. Since the kernel may send
/// up to `MAX_WRITE_SIZE` bytes in a write request, we use that value plus some extra space.
const BUFFER_SIZE: usize = MAX_WRITE_SIZE + 4096;

/// rifflefs patch: the head of the buffer kept resident and writable from the start. The
/// kernel copies a request into the reader's buffer after taking it off the queue, through
/// `get_user_pages`; where a page is not present, or is write-protected for copy-on-write
/// after a `fork()` of the daemon (it starts helper processes), the kernel must fault it in,
/// and a thread with a SIGKILL pending refuses to (`-EINTR`), so the kernel ends the request
/// with `EIO`. A dying daemon's threads wake up and take pending requests before they die
/// (SIGKILL, or `exit_group`, which kills the other threads), so without this they fail the
/// requests they took, which `FUSE_NOTIFY_RESEND` would otherwise replay for a successor.
/// Hence the buffer is a mapping of its own, excluded from `fork()` (`MADV_DONTFORK`: never
/// write-protected), with its head written once before the first read. Every request but a
/// large WRITE or SETXATTR fits in the head: headers, two names of at most 255 bytes, an
/// xattr value of at most 64 KiB.
const RESIDENT_HEAD: usize = 256 * 1024;

/// A buffer for reading requests from the kernel: page-aligned (so aligned for
/// `fuse_in_header`), `BUFFER_SIZE` bytes.
#[derive(Debug)]
pub(crate) struct FuseReadBuf {
    base: NonNull<u8>,
}

// SAFETY: the mapping is owned by this value alone.
unsafe impl Send for FuseReadBuf {}

impl FuseReadBuf {
    /// Maps a new buffer (see [`RESIDENT_HEAD`]).
    pub(crate) fn new() -> Self {
        // SAFETY: a fresh private anonymous mapping; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                BUFFER_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            panic!(
                "cannot map a FUSE request buffer of {BUFFER_SIZE} bytes: {}",
                std::io::Error::last_os_error()
            );
        }
        // SAFETY: the mapping just made. Best effort: without it a fork write-protects the
        // pages until the next write, as for any heap buffer.
        unsafe { libc::madvise(ptr, BUFFER_SIZE, libc::MADV_DONTFORK) };
        let base = NonNull::new(ptr.cast::<u8>()).expect("mmap gave null");
        for page in (0..RESIDENT_HEAD).step_by(4096) {
            // SAFETY: inside the mapping. Volatile: a write of zero to zeroed memory must not
            // be left out.
            unsafe { std::ptr::write_volatile(base.as_ptr().add(page), 0) };
        }
        Self { base }
    }

    /// The whole buffer.
    pub(crate) fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is BUFFER_SIZE bytes, readable and writable, and borrowed
        // mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr(), BUFFER_SIZE) }
    }
}

impl Drop for FuseReadBuf {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.base.as_ptr().cast(), BUFFER_SIZE) };
    }
}
