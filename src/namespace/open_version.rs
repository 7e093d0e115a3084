//! Opening a file: the version to read, and the inode to read it under, in one call from the
//! fs layer.
//!
//! An open reads the object's version that is current at open: the attributes are
//! revalidated per the TTL (close-to-open consistency, [`Namespace::open`]), or taken from
//! memory when fresh ([`Namespace::open_cached`], which never asks the store). The version
//! must also be one the kernel can read under this inode. The kernel ties some state to an
//! inode, not to a handle: its page cache, and with passthrough the one backing file per
//! inode. So when a handle still holds *another* version of the inode open, the new version
//! cannot be read under it. Which versions are open is the fs layer's state, kept under its
//! own locks; it answers through [`VersionsInUse`]. The namespace then gives the name a new
//! inode ([`Namespace::supersede`]: the old inode stays with the handles open on it, as
//! after a file was replaced by a rename) and says so ([`Opening::Moved`]): the open answers
//! ESTALE, and the kernel looks the name up again (once) and finds the new inode.
//!
//! [`VersionsInUse`] is asked with no lock of the tree held (its locks and the tree's are
//! never nested), and `supersede` re-checks under the tree's lock that the name still points
//! at the inode, so two opens racing to supersede one inode give the name one new inode.
//! The fs layer still decides the reply under its own lock (a handle of another version
//! opened meanwhile makes it ESTALE too). The one other way an open learns of a new version
//! is the store's answer to the read proof (`Fetcher::admit`, a layer above): that is
//! [`Namespace::invalidate`].

use std::sync::Arc;

use super::tree::{Body, Node};
use super::{Attr, Kind, Namespace, NamespaceError};

/// A file ready to be read: its full key and the version that was current at open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OpenTarget {
    pub key: String,
    pub size: u64,
    pub etag: Arc<str>,
}

/// The open handles' versions, as the fs layer knows them (see the module documentation).
pub(crate) trait VersionsInUse: Send + Sync {
    /// Whether `ino` is open at a version other than `etag` in a way that ties the version to
    /// the inode.
    fn other_version_open(&self, ino: u64, etag: &str) -> bool;
}

/// What an open of an inode reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Opening {
    /// The version to read under the opened inode.
    Current(OpenTarget),
    /// `target` is the current version, but another version is open under the inode: the name
    /// now has inode `to` (`None`: the name is gone or is not a file any more).
    Moved { target: OpenTarget, to: Option<u64> },
}

impl Namespace {
    /// What to read when `ino` is opened (see the module documentation).
    pub(crate) async fn open(
        &self,
        ino: u64,
        versions: &dyn VersionsInUse,
    ) -> Result<Opening, NamespaceError> {
        let target = self.open_target(ino).await?;
        if versions.other_version_open(ino, &target.etag) {
            let to = self.supersede(ino);
            return Ok(Opening::Moved { target, to });
        }
        Ok(Opening::Current(target))
    }

    /// [`Self::open`] when it needs no request to the store and no new inode; `None` otherwise.
    pub(crate) fn open_cached(
        &self,
        ino: u64,
        versions: &dyn VersionsInUse,
    ) -> Option<Result<OpenTarget, NamespaceError>> {
        match self.open_target_cached(ino)? {
            Ok(target) if versions.other_version_open(ino, &target.etag) => None,
            answer => Some(answer),
        }
    }

    /// [`Self::open_target`] when it needs no request to the store.
    fn open_target_cached(&self, ino: u64) -> Option<Result<OpenTarget, NamespaceError>> {
        Some(
            self.getattr_cached(ino)?
                .and_then(|attr| self.target_of(ino, attr)),
        )
    }

    /// What to read when `ino` is opened: revalidated per the TTL (close-to-open consistency).
    pub(crate) async fn open_target(&self, ino: u64) -> Result<OpenTarget, NamespaceError> {
        let attr = self.getattr(ino).await?;
        self.target_of(ino, attr)
    }

    fn target_of(&self, ino: u64, attr: Attr) -> Result<OpenTarget, NamespaceError> {
        match attr.kind {
            Kind::Dir => Err(NamespaceError::IsADirectory),
            Kind::File { size, etag } => Ok(OpenTarget {
                key: self.key_of(ino),
                size,
                etag,
            }),
        }
    }

    /// Gives the name of file `ino` a new inode with its current attributes, and leaves `ino`
    /// to the handles still open on it; returns the new inode (or the one the name already
    /// moved to). For an object that changed while its old version is open in a way the kernel
    /// ties to the inode (a passthrough backing file): the next lookup of the name finds the
    /// new inode, as after a file was replaced by a rename. The parent's listing is dropped so
    /// no directory read hands out the old inode for the name again.
    pub(super) fn supersede(&self, ino: u64) -> Option<u64> {
        let mut tree = self.tree.write();
        let node = Self::node(&tree, ino).ok()?;
        let Body::File { size, etag } = &node.body else {
            return None; // directories (the root among them) keep their inodes
        };
        let (parent, name) = (node.parent, node.name.clone());
        let successor = Node {
            parent,
            name: name.clone(),
            body: Body::File {
                size: *size,
                etag: etag.clone(),
            },
            mtime: node.mtime,
            checked: node.checked,
        };
        let new_ino = tree.nodes.len() as u64 + 1;
        let current = Self::node(&tree, parent)
            .ok()?
            .dir()
            .and_then(|d| tree.child(d, &name));
        match current {
            Some(current) if current == ino => {}
            other => return other,
        }
        let dir = Self::dir_mut(&mut tree, parent).ok()?;
        dir.set_child(Arc::from(name.as_str()), new_ino);
        dir.listed_at = None;
        tree.push(successor);
        let parent_prefix = self.dir_prefix(&tree, parent);
        drop(tree);
        self.forget_kept(&parent_prefix);
        Some(new_ino)
    }
}
