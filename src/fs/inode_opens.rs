//! Per-inode open state: which mode the open handles of each inode read in, and which object
//! version the kernel ties to the inode.
//!
//! The kernel ties two things to an inode, not to a handle, and fails an open (EIO) whose mode
//! conflicts with them:
//! - with passthrough, one backing file per inode, and no daemon-served handle beside a
//!   passthrough one (or the other way round);
//! - the page cache: daemon-served handles of one inode share it, so pages of one version are
//!   kept for the next open (`FOPEN_KEEP_CACHE`) only when it opens that same version.
//!
//! [`InodeOpens`] keeps, per inode, the passthrough handles (how many, their version and
//! their backing file), the count of daemon-served handles, and the version whose pages the
//! kernel may hold; and per passthrough handle its backing file (released with it). An open's
//! mode is chosen and counted in one step ([`InodeOpens::choose`]), so concurrent opens of an
//! inode (a task that found the cache file verified while another open was answered without
//! it, as after a restart) always agree, and a handle open at another version makes the open
//! stale.
//!
//! Lock discipline: all of it is behind one lock, a leaf: nothing else is locked while it is
//! held (no other lock of the open-file table, never the namespace tree's lock: the namespace
//! asks [`InodeOpens::other_version_open`] with no lock of the tree held, see
//! `namespace::open_version`), and no call leaves this module while it is held.
//!
//! Generic over the backing file handle `B` (fuser's `BackingId` in the adapter), so the
//! rules are testable without a kernel.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use fuser::BackingId;
use parking_lot::Mutex;

/// An ETag in 16 bytes: 128 bits of SHA-256 over it, as the cache names object versions
/// (`cache::identity`). The table of the versions whose pages the kernel may hold gets an
/// entry for every file the daemon served (every file of a cold epoch): with the ETag's
/// text (an `Arc<str>` made for the open) one cost about 120 bytes, this way about 40.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct VersionDigest(u128);

impl VersionDigest {
    fn of(etag: &str) -> Self {
        use sha2::{Digest, Sha256};
        let d = Sha256::digest(etag.as_bytes());
        let mut first = [0u8; 16];
        first.copy_from_slice(&d[..16]);
        VersionDigest(u128::from_le_bytes(first))
    }
}

/// The mode an open was given ([`InodeOpens::choose`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Mode<B> {
    /// Through this backing file.
    Passthrough(Arc<B>),
    /// Served by the daemon; `keep_cache`: the kernel's cached pages are of this version.
    Served { keep_cache: bool },
    /// A handle of the inode is open at another version.
    Stale,
}

/// See the module documentation.
pub(super) struct InodeOpens<B = BackingId> {
    state: Mutex<State<B>>,
}

struct State<B> {
    /// The version whose pages the kernel may hold, per inode.
    page_cache: HashMap<u64, VersionDigest>,
    /// The backing file of each open passthrough handle.
    backing_by_fh: HashMap<u64, Arc<B>>,
    /// Per inode, its open passthrough handles.
    passthrough: HashMap<u64, InodeBacking<B>>,
    /// Per inode, how many handles served by the daemon are open.
    served: HashMap<u64, u32>,
}

/// The passthrough handles open on one inode: how many, the object version they read and
/// their backing file.
struct InodeBacking<B> {
    opens: u32,
    etag: Arc<str>,
    backing: Weak<B>,
}

impl<B> Default for InodeOpens<B> {
    fn default() -> Self {
        InodeOpens {
            state: Mutex::new(State {
                page_cache: HashMap::new(),
                backing_by_fh: HashMap::new(),
                passthrough: HashMap::new(),
                served: HashMap::new(),
            }),
        }
    }
}

impl<B> InodeOpens<B> {
    /// The mode of the open of `fh` (of `ino` at version `etag`), counted: passthrough to the
    /// backing file already in use for the inode, else to `candidate`, else served by the
    /// daemon; [`Mode::Stale`] when passthrough handles of the inode read another version.
    pub(super) fn choose(
        &self,
        ino: u64,
        fh: u64,
        etag: &Arc<str>,
        candidate: Option<Arc<B>>,
    ) -> Mode<B> {
        let mut state = self.state.lock();
        let state = &mut *state;
        let live = match state.passthrough.get_mut(&ino) {
            Some(b) if *b.etag != **etag => return Mode::Stale,
            Some(b) => match b.backing.upgrade() {
                Some(live) => {
                    b.opens += 1;
                    Some(live)
                }
                None => {
                    // Its handles are gone (a count out of step): forget it.
                    state.passthrough.remove(&ino);
                    None
                }
            },
            None => None,
        };
        let backing = match (live, candidate) {
            (Some(live), _) => live,
            (None, Some(backing)) if !state.served.contains_key(&ino) => {
                state.passthrough.insert(
                    ino,
                    InodeBacking {
                        opens: 1,
                        etag: etag.clone(),
                        backing: Arc::downgrade(&backing),
                    },
                );
                backing
            }
            (None, _) => {
                *state.served.entry(ino).or_default() += 1;
                let keep_cache = state.remember(ino, etag);
                return Mode::Served { keep_cache };
            }
        };
        state.backing_by_fh.insert(fh, backing.clone());
        Mode::Passthrough(backing)
    }

    /// Records passthrough handle `fh` of `ino` that a predecessor daemon opened, reading
    /// version `etag` through `backing`.
    pub(super) fn adopt_passthrough(&self, ino: u64, fh: u64, etag: &Arc<str>, backing: &Arc<B>) {
        let mut state = self.state.lock();
        state.backing_by_fh.insert(fh, backing.clone());
        state
            .passthrough
            .entry(ino)
            .or_insert_with(|| InodeBacking {
                opens: 0,
                etag: etag.clone(),
                backing: Arc::downgrade(backing),
            })
            .opens += 1;
    }

    /// Records a daemon-served handle of `ino` at version `etag` that a predecessor opened.
    pub(super) fn adopt_served(&self, ino: u64, etag: &str) {
        let mut state = self.state.lock();
        *state.served.entry(ino).or_default() += 1;
        state.remember(ino, etag);
    }

    /// Forgets handle `fh` of `ino`: a passthrough one, or (`served`: the table of readers
    /// knew it) a daemon-served one. Anything else changes nothing.
    pub(super) fn release(&self, fh: u64, ino: u64, served: bool) {
        let mut state = self.state.lock();
        let state = &mut *state;
        if state.backing_by_fh.remove(&fh).is_some() {
            if let Some(b) = state.passthrough.get_mut(&ino) {
                b.opens -= 1;
                if b.opens == 0 {
                    state.passthrough.remove(&ino);
                }
            }
        } else if served {
            if let Some(n) = state.served.get_mut(&ino) {
                *n -= 1;
                if *n == 0 {
                    state.served.remove(&ino);
                }
            }
        }
    }

    /// The backing file in use for `ino` by open handles of version `etag`, if any.
    pub(super) fn live_backing(&self, ino: u64, etag: &str) -> Option<Arc<B>> {
        self.state
            .lock()
            .passthrough
            .get(&ino)
            .filter(|b| &*b.etag == etag)
            .and_then(|b| b.backing.upgrade())
    }

    /// Whether daemon-served handles of `ino` are open (the kernel then refuses a passthrough
    /// open of it).
    pub(super) fn has_served(&self, ino: u64) -> bool {
        self.state.lock().served.contains_key(&ino)
    }

    /// Daemon-served handles of `ino` open now.
    #[cfg(test)]
    pub(super) fn served(&self, ino: u64) -> u32 {
        self.state.lock().served.get(&ino).copied().unwrap_or(0)
    }

    /// Whether handles of `ino` are open at another version than `etag` in a way the kernel
    /// ties to the inode (`namespace::VersionsInUse`). Passthrough handles: the kernel refuses
    /// any other open of the inode. Handles served by the daemon: they share the inode's page
    /// cache, and the old handle's reads would fill it with old pages that the new handle then
    /// reads (a blend).
    pub(super) fn other_version_open(&self, ino: u64, etag: &str) -> bool {
        let state = self.state.lock();
        let passthrough = state
            .passthrough
            .get(&ino)
            .is_some_and(|b| &*b.etag != etag);
        passthrough
            || (state.served.contains_key(&ino)
                && state
                    .page_cache
                    .get(&ino)
                    .is_some_and(|v| *v != VersionDigest::of(etag)))
    }
}

impl<B> State<B> {
    /// Records that `ino` is opened at version `etag`; true if the kernel's cached pages (if
    /// any) belong to that same version and may be kept.
    fn remember(&mut self, ino: u64, etag: &str) -> bool {
        let version = VersionDigest::of(etag);
        match self.page_cache.get(&ino) {
            Some(previous) if *previous == version => true,
            _ => {
                self.page_cache.insert(ino, version);
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Opens = InodeOpens<u32>;

    fn served(keep_cache: bool) -> Mode<u32> {
        Mode::Served { keep_cache }
    }

    #[test]
    fn page_cache_is_kept_only_for_the_same_version() {
        let opens = Opens::default();
        let v1: Arc<str> = Arc::from("etag-1");
        let v2: Arc<str> = Arc::from("etag-2");
        assert_eq!(
            opens.choose(7, 1, &v1, None),
            served(false),
            "first open: nothing cached yet"
        );
        assert_eq!(opens.choose(7, 2, &v1, None), served(true));
        opens.release(1, 7, true);
        opens.release(2, 7, true);
        assert_eq!(
            opens.choose(7, 3, &v2, None),
            served(false),
            "new version: drop the old pages"
        );
        assert_eq!(opens.choose(7, 4, &v2, None), served(true));
    }

    #[test]
    fn one_backing_file_per_inode_and_no_mixing() {
        let opens = Opens::default();
        let e: Arc<str> = Arc::from("e");
        let first = Arc::new(1u32);
        assert_eq!(
            opens.choose(7, 1, &e, Some(first.clone())),
            Mode::Passthrough(first.clone())
        );
        // A second candidate: the one in use wins.
        assert_eq!(
            opens.choose(7, 2, &e, Some(Arc::new(2))),
            Mode::Passthrough(first.clone())
        );
        // Without a candidate too (the kernel refuses a served open beside it).
        assert_eq!(opens.choose(7, 3, &e, None), Mode::Passthrough(first));
        // Another version while they are open: stale.
        assert_eq!(opens.choose(7, 4, &Arc::from("f"), None), Mode::Stale);
        assert!(opens.other_version_open(7, "f") && !opens.other_version_open(7, "e"));
        for fh in 1..=3 {
            opens.release(fh, 7, false);
        }
        assert!(opens.live_backing(7, "e").is_none());
        // Served handles open: a candidate is not used.
        assert_eq!(opens.choose(8, 5, &e, None), served(false));
        assert!(opens.has_served(8));
        assert_eq!(opens.choose(8, 6, &e, Some(Arc::new(3))), served(true));
        assert!(opens.other_version_open(8, "f"));
    }

    #[test]
    fn a_backing_whose_handles_are_gone_is_forgotten() {
        let opens = Opens::default();
        let e: Arc<str> = Arc::from("e");
        opens.choose(7, 1, &e, Some(Arc::new(1)));
        // The handle's backing dropped (out of step): the inode is free again.
        opens.state.lock().backing_by_fh.clear();
        assert_eq!(opens.choose(7, 2, &Arc::from("e"), None), served(false));
    }

    #[test]
    fn adopted_handles_count_like_opened_ones() {
        let opens = Opens::default();
        let e: Arc<str> = Arc::from("e");
        let backing = Arc::new(5u32);
        opens.adopt_passthrough(7, 1, &e, &backing);
        opens.adopt_passthrough(7, 2, &e, &backing);
        assert_eq!(opens.live_backing(7, "e"), Some(backing.clone()));
        assert_eq!(opens.choose(7, 3, &e, None), Mode::Passthrough(backing));
        opens.adopt_served(8, "e");
        assert_eq!(opens.served(8), 1);
        assert_eq!(opens.choose(8, 4, &e, None), served(true));
    }
}
