//! The open path: on the FUSE thread when the answer is in memory ([`RiffleFs::open_now`]),
//! else on a task ([`RiffleFs::open_later`]); and the handles a predecessor daemon left open,
//! taken over at start ([`RiffleFs::adopt`]). Both end in an [`Opener`]: the handle's reader
//! started, and the reply with a passthrough backing file or served by the daemon.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use fuser::{BackingId, Errno, INodeNo, InitFlags, ReplyOpen};

use super::errno::{fetch_errno, ns_errno};
use super::handles::{object_of, Answered, Opener};
use super::handover::{HandleTable, InitParams, TableError};
use super::latency::OpTimer;
use super::RiffleFs;
use crate::fetch::{FetchError, ObjectVersion};
use crate::namespace::Opening;

impl RiffleFs {
    /// Configures the file system from a connection's saved INIT parameters instead of an
    /// INIT (a successor daemon: the kernel never sends INIT twice), and takes over the file
    /// handles its predecessor left open. Before the session runs, once the predecessor has
    /// stopped serving (the serving lock is held).
    pub fn adopt(
        &mut self,
        params: &InitParams,
        table: Arc<HandleTable>,
    ) -> Result<(), TableError> {
        let negotiated = if params.enabled(InitFlags::FUSE_PASSTHROUGH) {
            Ok(())
        } else {
            Err("off (not negotiated by the daemon that made this connection)".to_string())
        };
        self.configure(negotiated);
        tracing::info!(abi = ?params.kernel_abi(), made_by = %params.made_by, "FUSE session taken over");
        let live = table.take_over()?;
        self.keep_handles_in(table);
        let _runtime = self.runtime.enter();
        let opener = self.opener();
        let (mut files, mut passthrough) = (0, 0);
        let mut backings = std::collections::HashMap::new();
        for handle in live {
            let object = Arc::new(ObjectVersion {
                key: Arc::from(self.ns.key_of(handle.ino)),
                etag: Arc::from(handle.etag.as_str()),
                size: handle.size,
            });
            match handle.backing {
                Some(id) => {
                    // One reference per id, shared by the handles that read through it: the
                    // inode's backing file stays known for as long as any of them is open.
                    let backing = backings
                        .entry(id)
                        // SAFETY: the predecessor registered `id` on this connection, and it
                        // stays registered until unmount (nothing here closes it).
                        .or_insert_with(|| Arc::new(unsafe { BackingId::detached(id) }))
                        .clone();
                    // Later opens of the inode at this version reply with the same id (the
                    // kernel allows one backing file per inode), as long as one is open.
                    self.handles
                        .passthrough_opened(handle.ino, handle.fh, &object.etag, &backing);
                    passthrough += 1;
                }
                None => {
                    opener.start(handle.ino, handle.fh, 0, object.clone());
                    *self
                        .handles
                        .cached_opens
                        .lock()
                        .entry(handle.ino)
                        .or_default() += 1;
                    self.handles.remember_etag(handle.ino, &object.etag);
                    files += 1;
                }
            }
        }
        tracing::info!(
            files,
            passthrough,
            "file handles taken over from the predecessor"
        );
        Ok(())
    }

    pub(super) fn opener(&self) -> Opener {
        Opener {
            fetcher: self.fetcher.clone(),
            handles: self.handles.clone(),
            status: self.status.clone(),
            prefetch: self.prefetch.clone(),
            passthrough: self.passthrough.clone(),
            read_ahead: self.config.read_ahead,
        }
    }

    /// Answers an open on the FUSE thread when it needs nothing but memory: metadata younger
    /// than the TTL and no handle open at another version, and then, with passthrough, a
    /// backing file kept for that version; without it, nothing more (the daemon serves the
    /// reads). Otherwise gives the reply back, for the task path.
    pub(super) fn open_now(
        &self,
        ino: u64,
        fh: u64,
        caller: u32,
        reply: ReplyOpen,
    ) -> Option<ReplyOpen> {
        let Some(Ok(target)) = self.ns.open_cached(ino, &*self.handles) else {
            return Some(reply);
        };
        let object = object_of(&target);
        if self
            .fetcher
            .disk()
            .is_some_and(|disk| !disk.may_serve(&object))
        {
            // No read proof of this mount's for its cached bytes: the task path asks
            // (`Fetcher::admit`).
            return Some(reply);
        }
        if !self.passthrough.load(Ordering::Relaxed) {
            // The prefetcher may start tasks.
            let _runtime = self.runtime.enter();
            let opener = self.opener();
            opener.start(ino, fh, caller, object);
            opener.answer(ino, fh, &target.etag, None, reply);
            return None;
        }
        if self.handles.cached_opens.lock().contains_key(&ino) {
            return Some(reply);
        }
        let Some(disk) = self.fetcher.disk() else {
            return Some(reply);
        };
        // The backing file in use for the inode first (after a handover it may be a
        // predecessor's: the kernel allows one per inode), else one kept for this version.
        let backing = match self.handles.live_backing(ino, &target.etag) {
            Some(live) => live,
            None => {
                let Some(kept) = self
                    .handles
                    .kept
                    .get(&disk.entry_key(&object), &target.etag)
                else {
                    return Some(reply);
                };
                kept.for_reply(&reply)
            }
        };
        self.status.fast_opens.fetch_add(1, Ordering::Relaxed);
        let _runtime = self.runtime.enter();
        let opener = self.opener();
        opener.start(ino, fh, caller, object);
        opener.answer(ino, fh, &target.etag, Some(backing), reply);
        None
    }

    /// The open of `fh` (of `ino`, by `caller`) that needs the store or the disk: the object's
    /// current version (revalidated per the TTL) or, when another version is open, a new inode
    /// for the name (one call: [`crate::namespace::Namespace::open`]), then this mount's read
    /// proof, then the reply, on a task.
    pub(super) fn open_later(
        &self,
        ino: INodeNo,
        fh: u64,
        caller: u32,
        reply: ReplyOpen,
        timer: OpTimer,
    ) {
        let ns = self.ns.clone();
        let opener = self.opener();
        self.runtime.spawn(async move {
            let _timer = timer;
            let target = match ns.open(ino.0, &*opener.handles).await {
                Ok(Opening::Current(t)) => t,
                Ok(Opening::Moved { target, to }) => {
                    // The old version is open in a way the kernel ties to the inode (its
                    // backing file or its page cache): the name now has a new inode. ESTALE
                    // makes the kernel look the path up again (once), which finds it.
                    tracing::info!(key = %target.key, ino = ino.0, moved_to = ?to, "object changed while its old version is open; the name now has a new inode");
                    return reply.error(Errno::ESTALE);
                }
                Err(e) => return reply.error(ns_errno(&e)),
            };
            let object = object_of(&target);
            if let Err(e) = opener.fetcher.admit(&object).await {
                if e == FetchError::Changed {
                    // Replaced in the store since it was listed: the kernel looks it up
                    // again (once) on ESTALE, which finds the new version.
                    ns.invalidate(ino.0);
                }
                return reply.error(fetch_errno(&object.key, &e));
            }
            opener.start(ino.0, fh, caller, object.clone());
            let candidate = if opener.passthrough.load(Ordering::Relaxed) {
                opener.passthrough_backing(ino.0, &object, &reply).await
            } else {
                None
            };
            if opener.answer(ino.0, fh, &object.etag, candidate, reply) == Answered::Stale {
                tracing::info!(key = %object.key, ino = ino.0, "opened while a handle of another version was being opened; ESTALE");
            }
        });
    }
}
