//! `riffle unmount`: unmount a riffle mount; the daemon notices and exits.
//!
//! Root unmounts with umount2(2) directly; other users go through `fusermount3 -u`, the setuid
//! helper that FUSE provides for exactly this. A dead mount (its daemon was killed: "transport
//! endpoint is not connected") is always unmounted lazily, since nothing can be flushed.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};

use super::args::UnmountArgs;
use super::mount::{mount_state, MountState};

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
    unmount(path, lazy)
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
