//! The open path, decided once for both of its ways: on the FUSE thread when the answer is
//! in memory ([`Opener::open_now`]), else on a task ([`Opener::open_later`]); and the handles
//! a predecessor daemon left open, taken over at start ([`RiffleFs::adopt`]).
//!
//! An open is, in order: the version to read (the namespace's, with the inode it is read
//! under, `namespace::open_version`); this mount's read proof for the cached bytes; the
//! handle's reader started (pinning the cache entry, telling the prefetcher); the passthrough
//! backing file, if any ([`Opener::candidate`]: the one in use for the inode, one kept for
//! this version, or, on a task only, the complete and verified cache file registered with the
//! kernel now); and the mode, chosen and counted with the inode's other handles
//! ([`Handles::answer_open`]). The FUSE thread answers when the version is fresh in memory
//! and, with passthrough, a backing file is in memory too; anything else takes the task.
//! Both return an [`OpenAnswer`], which the adapter sends.
//!
//! Registering a backing file needs the kernel connection; it goes through [`Register`] (the
//! open's reply in the adapter), so the decision is testable without `/dev/fuse`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use fuser::{BackingId, InitFlags};

use super::answer::OpenAnswer;
use super::backings::{KernelBacking, Register};
use super::errno::{fetch_errno, ns_errno};
use super::handles::{object_of, Handles};
use super::handover::{HandleTable, InitParams, TableError};
use super::{FsStatus, RiffleFs};
use crate::fetch::{FetchError, Fetcher, ObjectVersion};
use crate::namespace::{Namespace, Opening};
use crate::prefetch::Prefetcher;
use crate::reader::{FileReader, ReadAheadConfig};

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
                key: Arc::from(self.meta.ns.key_of(handle.ino)),
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
                    self.handles.opens.adopt_passthrough(
                        handle.ino,
                        handle.fh,
                        &object.etag,
                        &backing,
                    );
                    passthrough += 1;
                }
                None => {
                    opener.start(handle.ino, handle.fh, 0, object.clone());
                    self.handles.opens.adopt_served(handle.ino, &object.etag);
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
            ns: self.meta.ns.clone(),
            fetcher: self.fetcher.clone(),
            handles: self.handles.clone(),
            status: self.meta.status.clone(),
            prefetch: self.prefetch.clone(),
            passthrough: self.passthrough.clone(),
            read_ahead: self.meta.config.read_ahead,
            runtime: self.runtime.clone(),
        }
    }
}

/// What an open needs, cloned into its task (or used on the FUSE thread by the fast path).
#[derive(Clone)]
pub(super) struct Opener {
    ns: Arc<Namespace>,
    fetcher: Arc<Fetcher>,
    handles: Arc<Handles>,
    status: Arc<FsStatus>,
    prefetch: Arc<Prefetcher>,
    passthrough: Arc<std::sync::atomic::AtomicBool>,
    read_ahead: ReadAheadConfig,
    runtime: tokio::runtime::Handle,
}

/// Where an open's passthrough backing file comes from ([`Opener::candidate`]).
enum Candidate {
    /// None, served by the daemon: passthrough is off.
    Off,
    /// None, served by the daemon: daemon-served handles of the inode are open (the kernel
    /// does not mix the two on one inode), or there is no disk cache.
    Served,
    /// This one: in use for the inode, or kept for this version.
    Ready(Arc<BackingId>),
    /// None in memory: the cache file, if complete and verified, is to be registered now.
    FromDisk,
}

impl Opener {
    /// Answers the open of `fh` (of `ino`, by `caller`, the opening thread's id) on the FUSE
    /// thread when it needs nothing but memory: metadata younger than the TTL, no handle open
    /// at another version, this mount's read proof, and then, with passthrough, a backing
    /// file in use or kept for that version; without passthrough, nothing more (the daemon
    /// serves the reads). `None`: the open takes the task ([`Self::open_later`]).
    pub(super) fn open_now(
        &self,
        ino: u64,
        fh: u64,
        caller: u32,
        reg: &impl Register,
    ) -> Option<OpenAnswer> {
        let Some(Ok(target)) = self.ns.open_cached(ino, &*self.handles) else {
            return None;
        };
        let object = object_of(&target);
        if self
            .fetcher
            .disk()
            .is_some_and(|disk| !disk.may_serve(&object))
        {
            // No read proof of this mount's for its cached bytes: the task path asks
            // (`Fetcher::admit`).
            return None;
        }
        let candidate = match self.candidate(ino, &object, reg) {
            Candidate::Off => None,
            Candidate::Ready(backing) => {
                self.status.fast_opens.fetch_add(1, Ordering::Relaxed);
                Some(backing)
            }
            Candidate::Served | Candidate::FromDisk => return None,
        };
        // The prefetcher may start tasks.
        let _runtime = self.runtime.enter();
        self.start(ino, fh, caller, object);
        Some(self.answer(ino, fh, &target.etag, candidate))
    }

    /// The open of `fh` (of `ino`, by `caller`) that needs the store or the disk: the object's
    /// current version (revalidated per the TTL) or, when another version is open, a new inode
    /// for the name (one call: [`Namespace::open`]), then this mount's read proof, then the
    /// answer. On a task.
    pub(super) async fn open_later(
        &self,
        ino: u64,
        fh: u64,
        caller: u32,
        reg: &impl Register,
    ) -> OpenAnswer {
        let target = match self.ns.open(ino, &*self.handles).await {
            Ok(Opening::Current(t)) => t,
            Ok(Opening::Moved { target, to }) => {
                // The old version is open in a way the kernel ties to the inode (its
                // backing file or its page cache): the name now has a new inode. ESTALE
                // makes the kernel look the path up again (once), which finds it.
                tracing::info!(key = %target.key, ino, moved_to = ?to, "object changed while its old version is open; the name now has a new inode");
                return OpenAnswer::Stale;
            }
            Err(e) => return OpenAnswer::Error(ns_errno(&e)),
        };
        let object = object_of(&target);
        if let Err(e) = self.fetcher.admit(&object).await {
            if e == FetchError::Changed {
                // Replaced in the store since it was listed: the kernel looks it up
                // again (once) on ESTALE, which finds the new version.
                self.ns.invalidate(ino);
            }
            return OpenAnswer::Error(fetch_errno(&object.key, &e));
        }
        self.start(ino, fh, caller, object.clone());
        let candidate = match self.candidate(ino, &object, reg) {
            Candidate::Off | Candidate::Served => None,
            Candidate::Ready(backing) => Some(backing),
            Candidate::FromDisk => self.register(&object, reg).await,
        };
        let answer = self.answer(ino, fh, &object.etag, candidate);
        if matches!(answer, OpenAnswer::Stale) {
            tracing::info!(key = %object.key, ino, "opened while a handle of another version was being opened; ESTALE");
        }
        answer
    }

    /// Starts handle `fh` of `ino` at `object` for `caller` (the opening thread's id): counts
    /// the open, tells the prefetcher, and keeps a reader for it (pinning the cache entry).
    pub(super) fn start(&self, ino: u64, fh: u64, caller: u32, object: Arc<ObjectVersion>) {
        self.status.opens.fetch_add(1, Ordering::Relaxed);
        // Pinned before the prefetcher hears of the open: from then on it no longer counts
        // the file as needed, and eviction could take it before a later pin.
        let pin = self.fetcher.disk().map(|d| d.pin_unused(&object));
        self.prefetch.on_open_by(ino, &object, Some(caller));
        if let Some(pin) = &pin {
            pin.used();
        }
        let reader = FileReader::new(object, self.fetcher.clone(), self.read_ahead, pin);
        self.handles.insert_reader(fh, reader);
    }

    /// The answer to the open of started handle `fh` ([`Handles::answer_open`]), a
    /// passthrough one counted.
    fn answer(
        &self,
        ino: u64,
        fh: u64,
        etag: &Arc<str>,
        candidate: Option<Arc<BackingId>>,
    ) -> OpenAnswer {
        let answer = self.handles.answer_open(ino, fh, etag, candidate);
        if matches!(answer, OpenAnswer::Passthrough { .. }) {
            self.status
                .passthrough_opens
                .fetch_add(1, Ordering::Relaxed);
        }
        answer
    }

    /// The passthrough backing file an open of `ino` at `object` can have without the disk.
    /// The one in use first: the kernel allows one backing file per inode, and after a
    /// handover the one in use may be a predecessor's, not the one kept here.
    fn candidate(&self, ino: u64, object: &ObjectVersion, reg: &impl Register) -> Candidate {
        if !self.passthrough.load(Ordering::Relaxed) {
            return Candidate::Off;
        }
        if self.handles.opens.has_served(ino) {
            return Candidate::Served;
        }
        let Some(disk) = self.fetcher.disk() else {
            return Candidate::Served;
        };
        if let Some(live) = self.handles.opens.live_backing(ino, &object.etag) {
            return Candidate::Ready(live);
        }
        match self.handles.kept.get(&disk.entry_key(object), &object.etag) {
            Some(kept) => Candidate::Ready(kept.for_reply(reg)),
            None => Candidate::FromDisk,
        }
    }

    /// The object's complete and verified cache file registered as a backing file (then kept
    /// for later opens); `None` (served by the daemon) when it is not cached and verified
    /// yet, or when the kernel refuses (passthrough is then off for the mount).
    async fn register(
        &self,
        object: &ObjectVersion,
        reg: &impl Register,
    ) -> Option<Arc<BackingId>> {
        let disk = self.fetcher.disk()?;
        let data = disk.passthrough_file(object).await?;
        match reg.open_backing(&data.file) {
            Ok(id) => {
                let id = Arc::new(id);
                let kept = Arc::new(KernelBacking::wrapped(id.clone(), data.nonce));
                self.handles
                    .kept
                    .keep(disk.entry_key(object), object.etag.clone(), kept);
                Some(id)
            }
            Err(e) => {
                if self.passthrough.swap(false, Ordering::Relaxed) {
                    tracing::warn!(error = %e, "FUSE passthrough refused by the kernel (needs CAP_SYS_ADMIN); serving reads through the daemon");
                    *self.status.passthrough_mode.lock() = format!(
                        "off (the kernel refused a backing file: {e}; passthrough needs CAP_SYS_ADMIN)"
                    );
                }
                None
            }
        }
    }
}
