//! `riffle unmount`: unmount a riffle mount; the daemon notices and exits.
//!
//! Root unmounts with umount2(2) directly; other users go through `fusermount3 -u`, the setuid
//! helper that FUSE provides for exactly this. A dead mount (its daemon was killed: "transport
//! endpoint is not connected") is always unmounted lazily, since nothing can be flushed.

use std::path::Path;
use std::process::Command;

use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::args::UnmountArgs;
use crate::control;
use crate::fs::mountinfo;

pub fn run(args: &UnmountArgs) -> anyhow::Result<()> {
    let path = &args.mountpoint;
    let lazy = match mount_state(path)? {
        MountState::NotMounted => bail!("{} is not mounted", path.display()),
        MountState::Mounted { fstype } if fstype != "fuse.riffle" => {
            bail!("{} is not a riffle mount (it is {fstype})", path.display())
        }
        MountState::Mounted { .. } => args.lazy,
        MountState::Dead => true,
    };
    // Ask the daemon who it is, so we can wait for it to finish (and release its cache
    // directory) before returning.
    let pid = control::request(path, "stats")
        .ok()
        .and_then(|s| s.get("pid").and_then(|p| p.as_u64()));
    unmount(path, lazy)?;
    if let Some(pid) = pid {
        wait_for_exit(pid, DAEMON_EXIT_WAIT);
    }
    Ok(())
}

/// How long `riffle unmount` waits for the daemon to exit after the unmount.
const DAEMON_EXIT_WAIT: Duration = Duration::from_secs(10);

fn wait_for_exit(pid: u64, limit: Duration) {
    let deadline = Instant::now() + limit;
    let proc_dir = format!("/proc/{pid}");
    while Instant::now() < deadline {
        // Gone, or a zombie waiting for its parent: either way it has let go of everything.
        match std::fs::read_to_string(format!("{proc_dir}/stat")) {
            Err(_) => return,
            Ok(stat)
                if stat
                    .rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z')) =>
            {
                return
            }
            Ok(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    tracing::warn!(pid, "the daemon is still running after the unmount");
}

/// Unmounts `path` (lazily: detach even if busy).
pub fn unmount(path: &Path, lazy: bool) -> anyhow::Result<()> {
    if nix::unistd::geteuid().is_root() {
        let flags = if lazy {
            nix::mount::MntFlags::MNT_DETACH
        } else {
            nix::mount::MntFlags::empty()
        };
        return nix::mount::umount2(path, flags).map_err(|e| match e {
            nix::errno::Errno::EBUSY => anyhow::anyhow!(
                "{} is busy (files are open); close them or use --lazy",
                path.display()
            ),
            e => anyhow::anyhow!("cannot unmount {}: {e}", path.display()),
        });
    }
    let mut cmd = Command::new("fusermount3");
    cmd.arg("-u");
    if lazy {
        cmd.arg("-z");
    }
    let out = cmd
        .arg(path)
        .output()
        .context("cannot run fusermount3 (install the fuse3 package)")?;
    if !out.status.success() {
        bail!(
            "cannot unmount {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// What is at a path, as far as mounts go.
#[derive(Debug, PartialEq, Eq)]
pub enum MountState {
    NotMounted,
    Mounted {
        fstype: String,
    },
    /// A FUSE mount whose daemon is gone ("transport endpoint is not connected").
    Dead,
}

/// Looks `path` up in /proc/self/mountinfo.
pub fn mount_state(path: &Path) -> anyhow::Result<MountState> {
    let abs = match std::fs::canonicalize(path) {
        Ok(p) => p,
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            std::path::absolute(path).unwrap_or(path.to_path_buf())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(MountState::NotMounted),
        Err(e) => return Err(e).with_context(|| format!("cannot inspect {}", path.display())),
    };
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .context("cannot read /proc/self/mountinfo")?;
    let Some(entry) = mountinfo::find(&info, &abs) else {
        return Ok(MountState::NotMounted);
    };
    let fstype = entry.fstype.to_string();
    // statfs always reaches the daemon (stat may be answered from the kernel's attribute
    // cache even when the daemon is gone).
    match nix::sys::statfs::statfs(&abs) {
        Err(nix::errno::Errno::ENOTCONN) => Ok(MountState::Dead),
        _ => Ok(MountState::Mounted { fstype }),
    }
}
