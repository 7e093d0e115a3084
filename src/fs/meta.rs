//! The metadata answers: what a lookup and a getattr answer, given what the namespace found.
//!
//! [`Meta`] is the part of the file system's state these answers need (the namespace, the
//! ownership and modes shown, the counters, the stats file), shared by the FUSE threads (an
//! answer in memory) and the tasks (an answer that waited on the store) through one `Arc`.
//! A lookup at the mount root of `.riffle-stats` that the bucket does not have finds the stats
//! file ([`stats_file::stands_in`]); every other answer is the namespace's, its errors mapped
//! by [`ns_errno`].

use std::sync::Arc;
use std::time::Duration;

use fuser::Errno;

use super::answer::Entry;
use super::errno::ns_errno;
use super::node::Node;
use super::stats_file::{self, StatsFile};
use super::{FsConfig, FsStatus, RiffleFs};
use crate::namespace::{Attr, Namespace, NamespaceError};

/// See the module documentation.
pub(super) struct Meta {
    pub ns: Arc<Namespace>,
    pub config: FsConfig,
    pub status: Arc<FsStatus>,
    /// `.riffle-stats` at the mount root ([`stats_file`]).
    pub stats_file: Arc<StatsFile>,
}

impl Meta {
    /// How long the kernel may keep names and attributes.
    pub fn ttl(&self) -> Duration {
        self.ns.ttl().kernel_ttl()
    }

    /// The answer to a lookup of `name` in `parent` that the namespace answered with `found`.
    /// A file found counts towards the directory reads' verdict ([`super::dirplus`]).
    pub fn looked_up(
        &self,
        parent: u64,
        name: &str,
        found: &Result<Attr, NamespaceError>,
    ) -> Result<Entry, Errno> {
        match found {
            Ok(attr) => {
                if !attr.is_dir() {
                    self.status.dirplus.looked_up_file(parent);
                }
                Ok(self.entry(attr))
            }
            Err(e) if stats_file::stands_in(parent, name, e) => {
                Ok(self.stats_file.entry(&self.config, None))
            }
            Err(e) => Err(ns_errno(e)),
        }
    }

    /// [`Self::looked_up`] once the namespace answered (revalidated per the TTL; on a task).
    pub async fn lookup(&self, parent: u64, name: &str) -> Result<Entry, Errno> {
        self.looked_up(parent, name, &self.ns.lookup(parent, name).await)
    }

    /// A getattr of `node` answered from memory: the stats file's always (the size of the
    /// document of handle `fh`, if given), a namespace inode's when its attributes are
    /// younger than the TTL. `None`: ask [`Self::getattr`].
    pub fn getattr_now(&self, node: Node, fh: Option<u64>) -> Option<Result<Entry, Errno>> {
        match node {
            Node::Stats => Some(Ok(self.stats_file.entry(&self.config, fh))),
            Node::Object(ino) => self.ns.getattr_cached(ino).map(|found| self.attr(found)),
        }
    }

    /// The getattr of namespace inode `ino` (revalidated per the TTL; on a task).
    pub async fn getattr(&self, ino: u64) -> Result<Entry, Errno> {
        self.attr(self.ns.getattr(ino).await)
    }

    fn attr(&self, found: Result<Attr, NamespaceError>) -> Result<Entry, Errno> {
        found
            .map(|attr| self.entry(&attr))
            .map_err(|e| ns_errno(&e))
    }

    fn entry(&self, attr: &Attr) -> Entry {
        Entry {
            attr: RiffleFs::file_attr(&self.config, attr),
            ttl: self.ttl(),
        }
    }
}
