use std::mem::align_of;

use crate::ll::fuse_abi as abi;
use crate::session::MAX_WRITE_SIZE;

/// Size of the buffer for reading a request from the kernel. Since the kernel may send
/// up to `MAX_WRITE_SIZE` bytes in a write request, we use that value plus some extra space.
const BUFFER_SIZE: usize = MAX_WRITE_SIZE + 4096;

/// rifflefs patch: the head of the buffer made resident before the first read. The kernel
/// copies a request into the reader's buffer after taking it off the queue; where a page of
/// the buffer is not present yet it must fault it in, and a thread with a SIGKILL pending
/// refuses to (`-EINTR`), so the kernel ends the request with `EIO`. A killed daemon's
/// threads wake up and take pending requests before they die, so without this a daemon
/// killed before each thread had used its buffer fails the requests it took (what
/// `FUSE_NOTIFY_RESEND` would otherwise replay for its successor). Every request but a
/// large WRITE or SETXATTR fits here: headers, two names of at most 255 bytes, an xattr
/// value of at most 64 KiB.
const RESIDENT_HEAD: usize = 256 * 1024;

/// A buffer that provides an aligned sub-slice for FUSE operations.
///
/// This struct wraps a `Vec<u8>` and provides access to an aligned portion
/// of the buffer, ensuring proper alignment for `fuse_in_header`.
#[derive(Debug)]
pub(crate) struct FuseReadBuf {
    buffer: Vec<u8>,
}

impl FuseReadBuf {
    /// Creates a new `FuseReadBuf` with the default buffer size.
    ///
    /// The actual buffer may be slightly larger to accommodate alignment requirements.
    pub(crate) fn new() -> Self {
        let mut buffer = vec![0; BUFFER_SIZE];
        // A write to each page (volatile: a write of zeroes to zeroed memory could be left
        // out) makes it present; anonymous memory stays so unless the node swaps.
        for page in buffer[..RESIDENT_HEAD].chunks_mut(4096) {
            // SAFETY: a valid pointer to a byte of the buffer.
            unsafe { std::ptr::write_volatile(page.as_mut_ptr(), 0) };
        }
        Self { buffer }
    }

    /// Returns a mutable reference to the aligned portion of the buffer.
    pub(crate) fn as_mut(&mut self) -> &mut [u8] {
        let alignment = align_of::<abi::fuse_in_header>();
        let off = alignment - (self.buffer.as_ptr() as usize) % alignment;
        if off == alignment {
            &mut self.buffer
        } else {
            &mut self.buffer[off..]
        }
    }
}
