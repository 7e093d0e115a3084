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

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use fuser::BackingId;
use parking_lot::Mutex;
use tokio::sync::{mpsc, SetOnce};

use super::backings::{KernelBacking, State};
use super::handles::Handles;
use super::FsStatus;
use crate::fetch::{Fetcher, ObjectVersion};

/// A duplicate of the session's `/dev/fuse` descriptor, set once the session exists (which
/// may be after the kernel's INIT, where passthrough is negotiated).
pub type FuseDevice = Arc<SetOnce<Arc<OwnedFd>>>;

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
            nonce: data.nonce,
        });
        status.opened_ahead.fetch_add(1, Ordering::Relaxed);
        handles.kept.keep(entry, obj.etag.clone(), backing);
    }
}
