//! Backing ids opened ahead: when an object becomes complete in the disk cache, its data file
//! is registered with the kernel for passthrough right away, so the first open of the next
//! epoch is already answered from memory (see [`super::backings`]).
//!
//! fuser creates backing ids only inside an open's reply, so ids opened ahead are raw ids made
//! with the `FUSE_DEV_IOC_BACKING_OPEN` ioctl on a duplicate of the session's `/dev/fuse`
//! descriptor ([`FuseDevice`]). A [`KernelBacking`] owns such an id until the first open that
//! uses it hands it to fuser (`ReplyOpen::wrap_backing`), after which fuser's [`BackingId`]
//! closes it when the last handle and the kept table let go; an id never used is closed by
//! [`KernelBacking`] itself (`FUSE_DEV_IOC_BACKING_CLOSE`).
//!
//! The task takes completions from a bounded channel filled by the fetcher
//! ([`crate::fetch::DiskTier::completions`]); when it lags, completions are dropped and those
//! files take the ordinary path at their next open. Only files this daemon wrote or verified
//! are opened ahead, exactly as at open time.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use fuser::{BackingId, ReplyOpen};
use parking_lot::Mutex;
use tokio::sync::{mpsc, SetOnce};

use super::handles::Handles;
use super::FsStatus;
use crate::fetch::{Fetcher, ObjectVersion};

/// `FUSE_DEV_IOC_BACKING_CLOSE` from `linux/fuse.h`: `_IOW(229, 2, uint32_t)`.
const FUSE_DEV_IOC_BACKING_CLOSE: libc::c_ulong = (1 << 30) | (4 << 16) | (229 << 8) | 2;

/// A duplicate of the session's `/dev/fuse` descriptor, set once the session exists (which
/// may be after the kernel's INIT, where passthrough is negotiated).
pub type FuseDevice = Arc<SetOnce<Arc<OwnedFd>>>;

/// A passthrough backing id: raw (opened ahead, owned here) or handed to fuser.
pub struct KernelBacking {
    state: Mutex<State>,
    /// The cache data file behind the id ([`super::lookahead`] reads it ahead by path).
    pub data_path: Arc<PathBuf>,
}

enum State {
    Raw { device: Arc<OwnedFd>, id: u32 },
    Wrapped(Arc<BackingId>),
}

impl KernelBacking {
    pub fn wrapped(id: Arc<BackingId>, data_path: PathBuf) -> Self {
        KernelBacking {
            state: Mutex::new(State::Wrapped(id)),
            data_path: Arc::new(data_path),
        }
    }

    /// The fuser handle to reply with; a raw id becomes fuser's (and is closed by it) here.
    pub fn for_reply(&self, reply: &ReplyOpen) -> Arc<BackingId> {
        let mut state = self.state.lock();
        match &*state {
            State::Wrapped(id) => id.clone(),
            State::Raw { id, .. } => {
                // SAFETY: the id was opened on this session's device and is open (closed only
                // by `Drop` below, which no longer sees it once the state is `Wrapped`).
                let wrapped = Arc::new(unsafe { reply.wrap_backing(*id) });
                *state = State::Wrapped(wrapped.clone());
                wrapped
            }
        }
    }
}

impl Drop for KernelBacking {
    fn drop(&mut self) {
        if let State::Raw { device, id } = &*self.state.lock() {
            // SAFETY: a plain ioctl on a descriptor we own, with a pointer to a live u32.
            let rc = unsafe { libc::ioctl(device.as_raw_fd(), FUSE_DEV_IOC_BACKING_CLOSE, id) };
            if rc != 0 {
                tracing::debug!(error = %std::io::Error::last_os_error(), "could not close a backing id");
            }
        }
    }
}

/// Opens ahead, until the channel closes, a backing id for every object that completes.
pub async fn run(
    mut completions: mpsc::Receiver<ObjectVersion>,
    fetcher: Arc<Fetcher>,
    handles: Arc<Handles>,
    device: FuseDevice,
    status: Arc<FsStatus>,
) {
    let Some(disk) = fetcher.disk().cloned() else {
        return;
    };
    let device = device.wait().await.clone();
    while let Some(obj) = completions.recv().await {
        let entry = disk.entry_key(&obj);
        if handles.kept.contains(&entry, &obj.etag) {
            continue;
        }
        let Some(data) = disk.passthrough_file(&obj).await else {
            continue;
        };
        let id = match BackingId::create_raw(&*device, &data.file) {
            Ok(id) => id,
            Err(e) => {
                tracing::debug!(error = %e, "could not open a backing id ahead; stopping");
                return;
            }
        };
        let backing = Arc::new(KernelBacking {
            state: Mutex::new(State::Raw {
                device: device.clone(),
                id,
            }),
            data_path: Arc::new(data.path),
        });
        status.opened_ahead.fetch_add(1, Ordering::Relaxed);
        handles.kept.keep(entry, obj.etag.clone(), backing);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_close_ioctl_number_is_the_kernels() {
        // linux/fuse.h: #define FUSE_DEV_IOC_BACKING_CLOSE _IOW(FUSE_DEV_IOC_MAGIC, 2, uint32_t)
        assert_eq!(FUSE_DEV_IOC_BACKING_CLOSE, 0x4004_e502);
    }
}
