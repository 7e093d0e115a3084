//! What is mounted at a path, from /proc/self/mountinfo, and whether a FUSE
//! mount still answers.
//!
//! mountinfo escapes space, tab, newline and backslash in mount points as
//! octal (`\040` ...); rather than unescaping every line we escape the path
//! we look for the same way and compare. When several mounts are stacked on
//! one path the last line is the visible (topmost) one.
//!
//! A FUSE mount whose daemon died stays in mountinfo but every access fails
//! with ENOTCONN ("transport endpoint is not connected"); [`probe`] calls
//! statfs on the path on a blocking thread with a time limit, because a live
//! but stuck daemon can make it hang. statfs rather than stat: the kernel
//! answers stat from its attribute cache without asking the daemon, but
//! always forwards statfs, so only statfs tells a dead daemon reliably.

use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The filesystem type riffle mounts show in mountinfo.
pub const RIFFLE_FSTYPE: &str = "fuse.riffle";

/// One mount seen at a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub fs_type: String,
    pub source: Option<String>,
}

/// Escapes a path the way the kernel writes it in mountinfo.
fn escape(path: &Path) -> PathBuf {
    let mut out = Vec::new();
    for &b in path.as_os_str().as_bytes() {
        match b {
            b' ' => out.extend_from_slice(b"\\040"),
            b'\t' => out.extend_from_slice(b"\\011"),
            b'\n' => out.extend_from_slice(b"\\012"),
            b'\\' => out.extend_from_slice(b"\\134"),
            _ => out.push(b),
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// The topmost mount at `path`, if any.
pub fn mount_at(path: &Path) -> io::Result<Option<MountEntry>> {
    let infos = procfs::process::Process::myself()
        .and_then(|p| p.mountinfo())
        .map_err(io::Error::other)?;
    let wanted = escape(path);
    Ok(infos
        .into_iter()
        .rfind(|m| m.mount_point == wanted)
        .map(|m| MountEntry {
            fs_type: m.fs_type,
            source: m.mount_source,
        }))
}

/// The result of touching a mounted path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    Ok,
    /// ENOTCONN/ECONNABORTED: the FUSE daemon is gone.
    Disconnected,
    /// stat did not return in time (daemon alive but slow or stuck).
    TimedOut,
    Other(String),
}

/// Calls statfs on `path` with a time limit.
pub async fn probe(path: &Path, limit: Duration) -> Probe {
    let owned = path.to_path_buf();
    let task = tokio::task::spawn_blocking(move || nix::sys::statfs::statfs(&owned));
    match tokio::time::timeout(limit, task).await {
        Err(_) => Probe::TimedOut,
        Ok(Err(join)) => Probe::Other(join.to_string()),
        Ok(Ok(Ok(_))) => Probe::Ok,
        Ok(Ok(Err(nix::errno::Errno::ENOTCONN | nix::errno::Errno::ECONNABORTED))) => {
            Probe::Disconnected
        }
        Ok(Ok(Err(e))) => Probe::Other(e.to_string()),
    }
}

/// Bind-mounts `source` (a riffle mount) at `target`, read-only, nosuid and nodev: how one
/// shared daemon's mount reaches each pod that uses it. Two steps, as mount(8) does: a bind
/// takes no flags of its own, so the new mount is then remounted with them. A failed
/// second step detaches the bind again, so no writable bind is ever left behind.
pub fn bind_read_only(source: &Path, target: &Path) -> io::Result<()> {
    use nix::mount::{mount, MsFlags};
    mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(io::Error::from)?;
    let flags = MsFlags::MS_BIND
        | MsFlags::MS_REMOUNT
        | MsFlags::MS_RDONLY
        | MsFlags::MS_NOSUID
        | MsFlags::MS_NODEV;
    if let Err(e) = mount(None::<&str>, target, None::<&str>, flags, None::<&str>) {
        let _ = nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH);
        return Err(io::Error::from(e));
    }
    Ok(())
}

/// Lazily detaches whatever is mounted at `target`, stacked mounts included
/// (at most 16 deep). A FUSE daemon whose mount is detached this way exits by
/// itself once nothing uses the mount any more.
pub fn detach_all(target: &Path) {
    for _ in 0..16 {
        match mount_at(target) {
            Ok(Some(_)) => {
                if let Err(e) = nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH) {
                    tracing::warn!(target = %target.display(), error = %e, "lazy unmount failed");
                    break;
                }
            }
            _ => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_like_the_kernel() {
        assert_eq!(
            escape(Path::new("/a b/c\\d")),
            PathBuf::from("/a\\040b/c\\134d")
        );
    }

    #[test]
    fn root_is_mounted_and_a_plain_dir_is_not() {
        assert!(mount_at(Path::new("/")).expect("mountinfo").is_some());
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(mount_at(dir.path()).expect("mountinfo").is_none());
    }

    #[tokio::test]
    async fn probe_plain_paths() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(probe(dir.path(), Duration::from_secs(5)).await, Probe::Ok);
        assert!(matches!(
            probe(&dir.path().join("missing"), Duration::from_secs(5)).await,
            Probe::Other(_)
        ));
    }
}
