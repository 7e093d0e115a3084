//! A growable region of shared memory that outlives the process writing it: an anonymous
//! file (`memfd_create`) mapped `MAP_SHARED`. Stores into the mapping land in the file's
//! pages at once, so whatever a daemon wrote before a SIGKILL is there for a successor that
//! maps the same file (the descriptor is held by the keeper, see the parent module). Nothing
//! is on disk and nothing outlives the last descriptor.
//!
//! The mapping reserves [`Region::reserve`] bytes of address space once and never moves;
//! the file grows under it in [`GROW_STEP`] steps (`ftruncate`), so writers never touch a
//! page past the file's end.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// The file grows by this much at a time.
pub(super) const GROW_STEP: u64 = 1 << 20;

/// One shared, growable memory file and its mapping.
pub struct Region {
    fd: OwnedFd,
    base: NonNull<u8>,
    reserve: usize,
    /// The file's current size.
    len: AtomicU64,
}

// SAFETY: the mapping is plain shared memory; callers synchronise their writes (the node
// journal under the namespace's lock, handle slots by ownership of a slot) and publish them
// through atomics in the mapping.
unsafe impl Send for Region {}
// SAFETY: see above.
unsafe impl Sync for Region {}

impl Region {
    /// A new, empty region named `name` (shown in /proc/PID/fd) that may grow to `reserve`
    /// bytes.
    pub fn create(name: &str, reserve: usize) -> io::Result<Region> {
        let cname = std::ffi::CString::new(name).map_err(io::Error::other)?;
        // SAFETY: a valid NUL-terminated name; the result is checked.
        let raw = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: memfd_create returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Self::map(fd, reserve)
    }

    /// Maps an existing region (received from a keeper), at most `reserve` bytes of it.
    pub fn open(fd: OwnedFd, reserve: usize) -> io::Result<Region> {
        Self::map(fd, reserve)
    }

    fn map(fd: OwnedFd, reserve: usize) -> io::Result<Region> {
        let len = file_len(fd.as_fd())?;
        if len > reserve as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("shared region of {len} bytes is larger than its reserve {reserve}"),
            ));
        }
        // SAFETY: a fresh shared mapping of a file we hold; nothing else uses the range.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserve,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base =
            NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        Ok(Region {
            fd,
            base,
            reserve,
            len: AtomicU64::new(len),
        })
    }

    /// The descriptor, to hand to a keeper.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The file's size now.
    pub fn size(&self) -> u64 {
        self.len.load(Ordering::Acquire)
    }

    /// Reads the file's size again: a predecessor may have grown it since this mapping was
    /// made (a successor maps the regions before its predecessor has stopped serving).
    pub fn refresh(&self) -> io::Result<u64> {
        let len = file_len(self.fd.as_fd())?.min(self.reserve as u64);
        Ok(self.len.fetch_max(len, Ordering::AcqRel).max(len))
    }

    /// Makes the file at least `needed` bytes long (in whole steps); never shorter than it
    /// is (another mapping may have grown it).
    pub fn ensure(&self, needed: u64) -> io::Result<()> {
        if needed <= self.size() || needed <= self.refresh()? {
            return Ok(());
        }
        if needed > self.reserve as u64 {
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("shared region full ({} bytes)", self.reserve),
            ));
        }
        let new_len = needed.div_ceil(GROW_STEP) * GROW_STEP;
        let new_len = new_len.min(self.reserve as u64);
        nix::unistd::ftruncate(&self.fd, new_len as libc::off_t).map_err(io::Error::from)?;
        self.len.fetch_max(new_len, Ordering::AcqRel);
        Ok(())
    }

    /// The 8-byte word at `offset` (8-aligned, inside the file) as an atomic.
    pub fn word(&self, offset: u64) -> &AtomicU64 {
        assert!(
            offset % 8 == 0 && offset + 8 <= self.size(),
            "word {offset} out of bounds"
        );
        // SAFETY: in bounds of the mapped file (checked), 8-aligned (the mapping is
        // page-aligned), and AtomicU64 has the layout of u64; shared memory is exactly what
        // atomics are for.
        unsafe { &*self.base.as_ptr().add(offset as usize).cast::<AtomicU64>() }
    }

    /// Copies `bytes` into the region at `offset` (inside the file).
    pub fn write(&self, offset: u64, bytes: &[u8]) {
        assert!(
            offset + bytes.len() as u64 <= self.size(),
            "write out of bounds"
        );
        // SAFETY: in bounds (checked); the caller owns this range (see the type's Sync note).
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.base.as_ptr().add(offset as usize),
                bytes.len(),
            )
        }
    }

    /// Copies `out.len()` bytes at `offset` out of the region; false if out of bounds.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> bool {
        if offset + out.len() as u64 > self.size() {
            return false;
        }
        // SAFETY: in bounds (checked).
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.base.as_ptr().add(offset as usize),
                out.as_mut_ptr(),
                out.len(),
            )
        }
        true
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.reserve);
        }
    }
}

/// The size of the file behind `fd`.
fn file_len(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let stat = nix::sys::stat::fstat(fd).map_err(io::Error::from)?;
    Ok(stat.st_size as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_seen_through_a_second_mapping_and_growth_keeps_them() {
        let region = Region::create("riffle-test", 8 << 20).unwrap();
        region.ensure(16).unwrap();
        region.word(8).store(42, Ordering::Release);
        region.ensure(3 << 20).unwrap();
        region.write((3 << 20) - 5, b"hello");
        let copy = region.fd().try_clone_to_owned().unwrap();
        drop(region);
        let again = Region::open(copy, 8 << 20).unwrap();
        assert_eq!(again.size(), 3 << 20);
        assert_eq!(again.word(8).load(Ordering::Acquire), 42);
        let mut out = [0u8; 5];
        assert!(again.read((3 << 20) - 5, &mut out));
        assert_eq!(&out, b"hello");
        assert!(!again.read(3 << 20, &mut out));
        assert!(again.ensure(9 << 20).is_err());
    }

    #[test]
    fn growth_through_another_mapping_is_seen_and_never_undone() {
        let first = Region::create("riffle-test", 8 << 20).unwrap();
        first.ensure(16).unwrap();
        let second = Region::open(first.fd().try_clone_to_owned().unwrap(), 8 << 20).unwrap();
        first.ensure(3 << 20).unwrap();
        first.write((3 << 20) - 5, b"hello");
        let mut out = [0u8; 5];
        assert!(
            !second.read((3 << 20) - 5, &mut out),
            "not seen before a refresh"
        );
        // Growing the stale mapping a little must not cut the file back.
        second.ensure(2 << 20).unwrap();
        assert_eq!(file_len(second.fd()).unwrap(), 3 << 20);
        assert_eq!(second.refresh().unwrap(), 3 << 20);
        assert!(second.read((3 << 20) - 5, &mut out));
        assert_eq!(&out, b"hello");
    }
}
