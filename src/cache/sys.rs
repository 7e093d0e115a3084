//! Thin safe wrappers over the few system calls the cache needs beyond `std`: whole-file
//! `flock` (entry use and directory locks), open-file-description byte-range locks (one block
//! being written), `statvfs` (the free-space guard), `SEEK_HOLE` (a complete file has no holes)
//! `O_DIRECT` opens, and files that appear under their name only once their first bytes are
//! written (`O_TMPFILE` + `linkat`).
//!
//! `flock` locks belong to an open file description, so two `File`s opened separately conflict
//! even inside one process, and a lock dies with its descriptor: a process killed with SIGKILL
//! holds nothing. OFD byte-range locks (`F_OFD_SETLK`) have the same ownership, unlike classic
//! POSIX locks, which a process loses when it closes *any* descriptor of the file.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// A whole-file lock mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lock {
    Shared,
    Exclusive,
    Unlock,
}

/// `flock` without waiting: `Ok(false)` when another holder conflicts.
pub fn try_flock(file: &File, lock: Lock) -> io::Result<bool> {
    let op = match lock {
        Lock::Shared => libc::LOCK_SH,
        Lock::Exclusive => libc::LOCK_EX,
        Lock::Unlock => libc::LOCK_UN,
    } | libc::LOCK_NB;
    loop {
        // SAFETY: flock on a valid descriptor owned by `file`.
        let r = unsafe { libc::flock(file.as_raw_fd(), op) };
        if r == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => return Ok(false),
            Some(libc::EINTR) => continue,
            _ => return Err(e),
        }
    }
}

/// Takes (`write = true`) or releases an OFD write lock on `start..start+len` of `file`,
/// without waiting: `Ok(false)` when another open file description holds a conflicting lock.
pub fn try_range_lock(file: &File, start: u64, len: u64, lock: bool) -> io::Result<bool> {
    // SAFETY: an all-zero flock struct is valid; l_pid must be 0 for OFD locks.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = if lock { libc::F_WRLCK } else { libc::F_UNLCK } as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start as libc::off_t;
    fl.l_len = len as libc::off_t;
    loop {
        // SAFETY: fcntl with a pointer to a live flock struct.
        let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &mut fl) };
        if r == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EACCES) => return Ok(false),
            Some(libc::EINTR) => continue,
            _ => return Err(e),
        }
    }
}

/// Size and free space of the filesystem holding `path`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsSpace {
    pub total: u64,
    /// Available to unprivileged users (`f_bavail`).
    pub avail: u64,
}

pub fn fs_space(path: &Path) -> io::Result<FsSpace> {
    let s = nix::sys::statvfs::statvfs(path).map_err(io::Error::from)?;
    let frsize = s.fragment_size() as u64;
    Ok(FsSpace {
        total: (s.blocks() as u64).saturating_mul(frsize),
        avail: (s.blocks_available() as u64).saturating_mul(frsize),
    })
}

/// The offset of the first hole at or after 0 (the file size when it has none).
pub fn first_hole(file: &File) -> io::Result<u64> {
    // SAFETY: lseek on a valid descriptor.
    let r = unsafe { libc::lseek(file.as_raw_fd(), 0, libc::SEEK_HOLE) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as u64)
}

/// Opens `path` for reading and writing with `O_DIRECT`; `Ok(None)` when the filesystem does
/// not support it (tmpfs before Linux 6.6, some FUSE filesystems).
pub fn open_direct(path: &Path) -> io::Result<Option<File>> {
    match OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Creates the file `path` holding `contents`, read-write and in append mode, such that no
/// other process ever sees it under its name with fewer bytes: the file is written before it
/// is linked. `Ok(None)` when `path` already exists (another creator won).
///
/// An unnamed `O_TMPFILE` in `dir` is written and then linked through `/proc/self/fd`: one
/// inode, never deleted. Where the filesystem (or a missing `/proc`) does not allow that, a
/// uniquely named temporary file is written, hard-linked to `path` and unlinked. (The first
/// way also spares ext4 the inode-table scans that many just-deleted inodes cause.)
pub fn create_published(dir: &Path, path: &Path, contents: &[u8]) -> io::Result<Option<File>> {
    use std::io::Write;
    let unnamed = OpenOptions::new()
        .read(true)
        .append(true)
        .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
        .open(dir);
    match unnamed {
        Ok(mut f) => {
            f.write_all(contents)?;
            let proc_path = format!("/proc/self/fd/{}", f.as_raw_fd());
            match link_following(Path::new(&proc_path), path) {
                Ok(()) => return Ok(Some(f)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(None),
                // No /proc, or linking refused: fall back to a named temporary file.
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::EPERM)) => {}
                Err(e) => return Err(e),
            }
        }
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP) | Some(libc::EISDIR) | Some(libc::EINVAL)
            ) => {}
        Err(e) => return Err(e),
    }
    create_via_named_temporary(dir, path, contents)
}

/// `linkat(AT_FDCWD, from, AT_FDCWD, to, AT_SYMLINK_FOLLOW)`.
fn link_following(from: &Path, to: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
    };
    let (from, to) = (c(from)?, c(to)?);
    // SAFETY: both are valid NUL-terminated paths; linkat does not keep them.
    let r = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The fallback of [`create_published`]: write `<name>.tmp.<pid>.<random>`, link, unlink.
fn create_via_named_temporary(
    dir: &Path,
    path: &Path,
    contents: &[u8],
) -> io::Result<Option<File>> {
    use std::io::Write;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(
        "{name}.tmp.{}.{:016x}",
        std::process::id(),
        rand::random::<u64>()
    ));
    let result = (|| {
        let mut f = OpenOptions::new()
            .read(true)
            .append(true)
            .create_new(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&tmp)?;
        f.write_all(contents)?;
        match std::fs::hard_link(&tmp, path) {
            Ok(()) => Ok(Some(f)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(None),
            Err(e) => Err(e),
        }
    })();
    let _ = std::fs::remove_file(&tmp);
    result
}

/// Whether an I/O error means "no space left" (or quota exhausted).
pub fn is_no_space(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// Sets the modification time of `file` to now (the last-use mark that orders the LRU across
/// restarts).
pub fn touch(file: &File) -> io::Result<()> {
    // SAFETY: futimens with a null times pointer sets both times to now.
    let r = unsafe { libc::futimens(file.as_raw_fd(), std::ptr::null()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_files_appear_whole_and_only_once() {
        use std::io::{Read, Write};
        let dir = tempfile::tempdir().expect("tempdir");
        for (name, create) in [
            (
                "unnamed",
                create_published as fn(&Path, &Path, &[u8]) -> io::Result<Option<File>>,
            ),
            ("named", create_via_named_temporary),
        ] {
            let path = dir.path().join(name);
            let mut f = create(dir.path(), &path, b"header")
                .expect("create")
                .expect("first");
            f.write_all(b"+record").expect("append");
            assert!(create(dir.path(), &path, b"other")
                .expect("create")
                .is_none());
            let mut text = String::new();
            File::open(&path)
                .expect("open")
                .read_to_string(&mut text)
                .expect("read");
            assert_eq!(text, "header+record", "{name}");
        }
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["named", "unnamed"], "no temporary file is left");
    }

    #[test]
    fn flock_conflicts_between_descriptors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("f");
        std::fs::write(&p, b"x").expect("write");
        let a = File::open(&p).expect("open");
        let b = File::open(&p).expect("open");
        assert!(try_flock(&a, Lock::Shared).expect("flock"));
        assert!(try_flock(&b, Lock::Shared).expect("flock"));
        let c = File::open(&p).expect("open");
        assert!(!try_flock(&c, Lock::Exclusive).expect("flock"));
        drop(a);
        assert!(try_flock(&b, Lock::Unlock).expect("flock"));
        assert!(try_flock(&c, Lock::Exclusive).expect("flock"));
    }

    #[test]
    fn range_locks_conflict_between_descriptors_only_on_overlap() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("f");
        let open = || {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&p)
        };
        let a = open().expect("open");
        let b = open().expect("open");
        assert!(try_range_lock(&a, 0, 10, true).expect("lock"));
        assert!(!try_range_lock(&b, 5, 10, true).expect("lock"));
        assert!(try_range_lock(&b, 10, 10, true).expect("lock"));
        assert!(try_range_lock(&a, 0, 10, false).expect("unlock"));
        assert!(try_range_lock(&b, 5, 5, true).expect("lock"));
    }

    #[test]
    fn holes_are_found() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("f");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .expect("open");
        use std::os::unix::fs::FileExt;
        f.write_all_at(&[1u8; 8192], 0).expect("write");
        assert_eq!(first_hole(&f).expect("seek"), 8192);
        f.set_len(1 << 20).expect("extend");
        assert_eq!(first_hole(&f).expect("seek"), 8192);
        assert!(fs_space(dir.path()).expect("statvfs").total > 0);
    }
}
