//! Inodes, names and attributes, built from delimited LISTs and HEADs.
//!
//! The bucket (below the mount's prefix) is shown as a tree: common prefixes are directories,
//! objects are files. Every node gets an inode number the first time it is seen; the number is
//! never reused or changed within a mount while the node keeps its kind, so `(parent, name)`
//! maps to the same inode across re-listings (one exception: [`Namespace::supersede`] gives a
//! changed object a new inode while its old version is still open through passthrough).
//! Nodes live in a `Vec` indexed by inode number (inodes are never freed: a dataset's tree is
//! bounded). A listed object costs about 80 bytes (`tests/namespace_memory.rs`): its node
//! (72 bytes: its name inline up to 15 bytes, times in 8 bytes each, an MD5 ETag in 16, a
//! directory's state behind a pointer) and its 8-byte entry in the parent's listing, which is
//! also the parent's name index (see `DirState`); a longer name adds an allocation of its
//! length.
//!
//! Freshness follows `--metadata-ttl`: a directory listing, a file's attributes and a negative
//! lookup are trusted for the TTL (forever with `indefinite`), then asked again. A lookup is
//! answered from the parent's listing when that is fresh; otherwise a HEAD of `prefix/name`
//! and a one-key LIST of `prefix/name/` run concurrently, and a directory wins over a file of
//! the same name (the shadowed file is logged). Zero-byte `dir/` marker objects appear as the
//! directory they name. Keys that cannot be POSIX names are skipped (see [`names`]).
//!
//! A lookup that misses in a directory with no fresh listing also starts one listing of that
//! directory in the background: readers that open files by path without listing first
//! (a sampler with a file list) then pay one LIST per directory instead of a HEAD and a LIST
//! per file. Lookups in that directory while its listing runs wait for it when it fits in one
//! page, and concurrent `readdir`s share it (module `listings`).
//!
//! When a directory is read, its subdirectories are listed in the background, a bounded
//! number at once and below demand requests, so a walk of many directories costs about the
//! time of its largest one rather than the sum of all (module [`background`]). With a
//! `--cache-dir`, every listing taken from the store is also kept on disk, and a later mount
//! of the same endpoint, bucket and prefix uses it while it is fresh under the TTL, once that
//! mount showed it can list the bucket with its own credentials (module [`kept`]): a remount
//! of an immutable dataset lists nothing. A listing is applied to the tree whole (all its
//! pages, from the store or from disk) or not at all.
//!
//! No lock is held across an `await`: remote calls are made first, their answers merged in
//! under a short write lock.
//!
//! The nodes and their layout are in module `tree`; listing a directory and merging the
//! listing into the tree in module `readdir`; this module is the service around them.

pub(crate) mod background;
mod listings;
pub(crate) mod names;
mod open_version;
mod readdir;
pub(crate) mod saved;
mod tree;
mod usage;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::RwLock;

use crate::store::{ListRequest, ObjectMeta, ObjectStore, StoreError};
use background::{Fanout, FanoutConfig};
use listings::{Claim, Listings};
use names::{invalid_reason, Name, SkipLog};
pub(crate) use open_version::{OpenTarget, Opening, VersionsInUse};
use saved::SavedListings;
pub(crate) use tree::DirEntry;
use tree::{Body, DirState, Mtime, Node, NodeKind, Stamp, StoredEtag, Tree};
pub(crate) use usage::ListedUsage;

/// The root directory's inode number (FUSE's).
pub const ROOT_INO: u64 = 1;

/// Told of every node the tree creates, in inode order, under the tree's lock (the FUSE
/// connection handover keeps them, so that a successor daemon rebuilds the same inode
/// numbers: `fs::handover::nodes`).
pub(crate) trait NodeLog: Send + Sync {
    fn created(&self, ino: u64, parent: u64, is_dir: bool, name: &str);
}

/// How long metadata is trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetadataTtl {
    For(Duration),
    /// The dataset is immutable: never ask again.
    Indefinite,
}

impl MetadataTtl {
    /// Whether something checked `age()` ago is still fresh (`age` is not asked with
    /// `indefinite`).
    fn is_fresh_after(&self, age: impl FnOnce() -> Duration) -> bool {
        match self {
            MetadataTtl::For(ttl) => age() < *ttl,
            MetadataTtl::Indefinite => true,
        }
    }

    fn is_fresh(&self, checked: Instant) -> bool {
        self.is_fresh_after(|| checked.elapsed())
    }

    fn is_fresh_stamp(&self, checked: Stamp) -> bool {
        checked != Stamp::NEVER && self.is_fresh_after(|| checked.elapsed())
    }

    /// A zero TTL: every access asks the store, so a listing is stale the moment it is taken
    /// (nothing is worth listing ahead, keeping or using from disk).
    fn always_stale(&self) -> bool {
        *self == MetadataTtl::For(Duration::ZERO)
    }

    /// The TTL to hand to the kernel for entries and attributes.
    pub fn kernel_ttl(&self) -> Duration {
        match self {
            MetadataTtl::For(ttl) => *ttl,
            MetadataTtl::Indefinite => Duration::from_secs(365 * 24 * 3600),
        }
    }
}

impl std::str::FromStr for MetadataTtl {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("indefinite") {
            return Ok(MetadataTtl::Indefinite);
        }
        s.parse::<u64>()
            .map(|secs| MetadataTtl::For(Duration::from_secs(secs)))
            .map_err(|_| format!("'{s}' is not a number of seconds or 'indefinite'"))
    }
}

/// What a node is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File { size: u64, etag: Arc<str> },
}

/// Attributes of one node as the filesystem layer needs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub kind: Kind,
    pub mtime: SystemTime,
}

/// What `stat` shows of a node, without its ETag ([`Entries::stat`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stat {
    /// `None` for a directory.
    pub size: Option<u64>,
    pub mtime: SystemTime,
}

/// The nodes listings point to, under the tree's read lock ([`Namespace::with_entries`]).
pub(crate) struct Entries<'a> {
    tree: &'a Tree,
}

impl Entries<'_> {
    /// The name of the node `e` points to.
    pub(crate) fn name(&self, e: &DirEntry) -> &str {
        self.tree.name_of(e)
    }

    /// The size (`None` for a directory) and mtime of `ino` (`None` when unknown).
    pub(crate) fn stat(&self, ino: u64) -> Option<Stat> {
        Namespace::node(self.tree, ino).ok().map(|n| Stat {
            size: match &n.body {
                Body::Dir(_) => None,
                Body::File { size, .. } => Some(*size),
            },
            mtime: n.mtime.system_time(),
        })
    }
}

impl Attr {
    pub fn is_dir(&self) -> bool {
        matches!(self.kind, Kind::Dir)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NamespaceError {
    #[error("no such file or directory")]
    NotFound,
    #[error("not a directory")]
    NotADirectory,
    #[error("is a directory")]
    IsADirectory,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// See the module documentation.
pub struct Namespace {
    store: Arc<dyn ObjectStore>,
    root_prefix: String,
    ttl: MetadataTtl,
    tree: RwLock<Tree>,
    skipped: SkipLog,
    mount_time: SystemTime,
    listings: Listings,
    fanout: Option<Arc<Fanout>>,
    kept: Option<Arc<SavedListings>>,
    counts: Arc<ListingCounts>,
}

/// A node as a predecessor daemon created it ([`Namespace::restore`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RestoredNode {
    pub ino: u64,
    pub parent: u64,
    pub is_dir: bool,
    pub name: String,
}

/// What a [`Namespace`] does beyond listing on demand.
#[derive(Default, Clone)]
pub(crate) struct NamespaceOptions {
    /// List the subdirectories of directories being read in the background.
    pub fanout: Option<FanoutConfig>,
    /// Keep listings on disk and use saved ones (after [`SavedListings::grant_access`]).
    pub kept: Option<Arc<SavedListings>>,
    /// Told of every node created ([`NodeLog`]).
    pub node_log: Option<Arc<dyn NodeLog>>,
}

/// Listing counters (for `riffle stats`).
#[derive(Debug, Default)]
struct ListingCounts {
    from_store: AtomicU64,
    from_disk: AtomicU64,
    saved_written: AtomicU64,
    saved_ignored: AtomicU64,
}

/// A snapshot of the listing counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ListingStats {
    /// Complete listings taken from the store.
    pub from_store: u64,
    /// Background listings that listed a directory (from the store or from disk).
    pub background: u64,
    /// Background listings that failed after the store's retries.
    pub background_failed: u64,
    /// Listings taken from disk (kept by this or an earlier mount).
    pub from_disk: u64,
    /// Listings written to disk.
    pub saved_written: u64,
    /// Saved listings found torn or unreadable (and not used).
    pub saved_ignored: u64,
}

/// The outcome of asking the store about one name.
enum Found {
    Dir,
    File(ObjectMeta),
    Nothing,
}

/// Whether `name` can name an entry of a directory (lookups of anything else are ENOENT).
fn is_child_name(name: &str) -> bool {
    invalid_reason(name).is_none() && !name.contains('/')
}

impl Namespace {
    /// `root_prefix` is "" or ends with '/'.
    pub fn new(store: Arc<dyn ObjectStore>, root_prefix: &str, ttl: MetadataTtl) -> Arc<Self> {
        Self::with_options(store, root_prefix, ttl, NamespaceOptions::default())
    }

    /// [`Self::new`] with background listings and saved listings as `options` say.
    pub(crate) fn with_options(
        store: Arc<dyn ObjectStore>,
        root_prefix: &str,
        ttl: MetadataTtl,
        options: NamespaceOptions,
    ) -> Arc<Self> {
        let now = SystemTime::now();
        let root = Node {
            parent: ROOT_INO,
            name: Name::new(""),
            body: Body::Dir(Box::default()),
            mtime: Mtime::new(now),
            checked: Stamp::at(Instant::now()),
        };
        Arc::new(Namespace {
            store,
            root_prefix: root_prefix.to_string(),
            ttl,
            tree: RwLock::new(Tree {
                nodes: vec![root],
                log: options.node_log,
            }),
            skipped: SkipLog::default(),
            mount_time: now,
            listings: Listings::default(),
            fanout: options.fanout.map(Fanout::new),
            kept: options.kept,
            counts: Arc::default(),
        })
    }

    /// Rebuilds the nodes a predecessor daemon handed out, with the same inode numbers
    /// (`records` in inode order, from 2), on a namespace that has created none yet. Their
    /// attributes are unknown: every restored file is asked about again at its next use, as
    /// after its TTL, and every restored directory is listed again when read.
    pub(crate) fn restore(
        &self,
        records: impl IntoIterator<Item = RestoredNode>,
    ) -> Result<(), String> {
        let mut tree = self.tree.write();
        if tree.nodes.len() != 1 {
            return Err(format!("{} nodes exist already", tree.nodes.len()));
        }
        let epoch = Mtime::new(self.mount_time);
        for record in records {
            let ino = tree.nodes.len() as u64 + 1;
            if record.ino != ino || record.parent == 0 || record.parent >= ino {
                return Err(format!(
                    "node {} (parent {}) out of order at inode {ino}",
                    record.ino, record.parent
                ));
            }
            let body = if record.is_dir {
                Body::Dir(Box::default())
            } else {
                Body::File {
                    size: 0,
                    etag: StoredEtag::Text(Arc::from("")),
                }
            };
            let name: Arc<str> = Arc::from(record.name.as_str());
            tree.nodes.push(Node {
                parent: record.parent,
                name: Name::new(&record.name),
                body,
                mtime: epoch,
                checked: Stamp::NEVER,
            });
            match tree.nodes[(record.parent - 1) as usize].dir_mut() {
                Some(dir) => dir.set_child(name, ino),
                None => return Err(format!("parent {} of node {ino} is a file", record.parent)),
            }
        }
        Ok(())
    }

    /// One LIST of the mount root with this namespace's store (its credentials); on success,
    /// saved listings may be used from now on. (`riffle mount` makes the same check in its
    /// start-up probe and calls [`SavedListings::grant_access`] itself.)
    #[cfg(test)]
    pub(crate) async fn check_access(&self) -> Result<(), NamespaceError> {
        self.store
            .list_page(ListRequest::probe(&self.root_prefix))
            .await?;
        if let Some(kept) = &self.kept {
            kept.grant_access();
        }
        Ok(())
    }

    /// The listing counters.
    pub(crate) fn listing_stats(&self) -> ListingStats {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ListingStats {
            from_store: load(&self.counts.from_store),
            background: self.fanout.as_ref().map_or(0, |f| load(&f.started)),
            background_failed: self.fanout.as_ref().map_or(0, |f| load(&f.failed)),
            from_disk: load(&self.counts.from_disk),
            saved_written: load(&self.counts.saved_written),
            saved_ignored: load(&self.counts.saved_ignored),
        }
    }

    pub(crate) fn ttl(&self) -> MetadataTtl {
        self.ttl
    }

    /// Number of inodes handed out so far.
    pub(crate) fn inode_count(&self) -> u64 {
        self.tree.read().nodes.len() as u64
    }

    /// Keys skipped because they cannot be POSIX names.
    pub(crate) fn skipped_count(&self) -> usize {
        self.skipped.count()
    }

    /// The key prefix of a directory ("" or ending in '/'), or full key of a file.
    fn path_of(tree: &Tree, root_prefix: &str, ino: u64) -> String {
        let mut parts: Vec<&str> = Vec::new();
        let mut cur = ino;
        while cur != ROOT_INO {
            let node = &tree.nodes[(cur - 1) as usize];
            parts.push(node.name.as_str());
            cur = node.parent;
        }
        let mut path = root_prefix.to_string();
        for (i, part) in parts.iter().rev().enumerate() {
            path.push_str(part);
            if i + 1 < parts.len() {
                path.push('/');
            }
        }
        path
    }

    fn dir_prefix(&self, tree: &Tree, ino: u64) -> String {
        let mut p = Self::path_of(tree, &self.root_prefix, ino);
        if ino != ROOT_INO {
            p.push('/');
        }
        p
    }

    fn node(tree: &Tree, ino: u64) -> Result<&Node, NamespaceError> {
        ino.checked_sub(1)
            .and_then(|i| tree.nodes.get(i as usize))
            .ok_or(NamespaceError::NotFound)
    }

    fn attr_of(ino: u64, node: &Node) -> Attr {
        Attr {
            ino,
            kind: node.kind(),
            mtime: node.mtime.system_time(),
        }
    }

    /// Attributes of `ino` as last known, without asking the store.
    pub(crate) fn cached_attr(&self, ino: u64) -> Result<Attr, NamespaceError> {
        let tree = self.tree.read();
        Self::node(&tree, ino).map(|n| Self::attr_of(ino, n))
    }

    /// The name of the node `e` points to (for tests: a reply reads them all at once through
    /// [`Self::with_entries`]).
    #[cfg(test)]
    pub(crate) fn name_of(&self, e: &DirEntry) -> String {
        self.with_entries(|nodes| nodes.name(e).to_string())
    }

    /// Calls `f` with the names and stats of the nodes listings point to ([`Entries`]), all
    /// under one read lock and without building the ETag text: what a `readdir` or
    /// `readdirplus` reply of thousands of entries needs.
    pub(crate) fn with_entries<R>(&self, f: impl FnOnce(&Entries<'_>) -> R) -> R {
        let tree = self.tree.read();
        f(&Entries { tree: &tree })
    }

    /// Whether directory `ino` has a listing younger than the TTL.
    pub(crate) fn has_fresh_listing(&self, ino: u64) -> bool {
        self.readdir_cached(ino).is_some()
    }

    /// Resolves a path relative to the mount root ("" is the root), component by component.
    pub(crate) async fn resolve(self: &Arc<Self>, path: &str) -> Result<Attr, NamespaceError> {
        let mut attr = self.cached_attr(ROOT_INO)?;
        for part in path.split('/').filter(|p| !p.is_empty()) {
            attr = self.lookup(attr.ino, part).await?;
        }
        Ok(attr)
    }

    /// [`Self::resolve`] when every component's answer is in memory and within the TTL;
    /// `None` when any would need the store.
    pub(crate) fn resolve_cached(&self, path: &str) -> Option<Attr> {
        let tree = self.tree.read();
        let mut attr = Self::attr_of(ROOT_INO, Self::node(&tree, ROOT_INO).ok()?);
        for part in path.split('/').filter(|p| !p.is_empty()) {
            if !is_child_name(part) {
                return None;
            }
            attr = self.fresh_lookup(&tree, attr.ino, part)?.ok()?;
        }
        Some(attr)
    }

    /// The path of `ino` relative to the mount root.
    pub(crate) fn relative_path(&self, ino: u64) -> String {
        let tree = self.tree.read();
        Self::path_of(&tree, "", ino)
    }

    /// Where `ino` stands in its parent's last listing: the parent, the listing and the
    /// index. `None` when the parent was never listed.
    pub(crate) fn listing_position(&self, ino: u64) -> Option<(u64, Arc<Vec<DirEntry>>, usize)> {
        let tree = self.tree.read();
        let node = Self::node(&tree, ino).ok()?;
        let parent = Self::node(&tree, node.parent).ok()?;
        let (entries, _) = parent.dir()?.listing()?;
        let i = tree.find_in(entries, &node.name)?;
        Some((node.parent, entries.clone(), i))
    }

    /// The parent directory of `ino` (the root is its own parent).
    pub(crate) fn parent_of(&self, ino: u64) -> u64 {
        let tree = self.tree.read();
        Self::node(&tree, ino).map_or(ROOT_INO, |n| n.parent)
    }

    /// The full key of a node (for logs and the control socket).
    pub(crate) fn key_of(&self, ino: u64) -> String {
        Self::path_of(&self.tree.read(), &self.root_prefix, ino)
    }

    /// The answer to a lookup of `name` in `parent` if it needs no request to the store (the
    /// parent's listing, the child's attributes or a negative entry is younger than the TTL).
    pub(crate) fn lookup_cached(
        &self,
        parent: u64,
        name: &str,
    ) -> Option<Result<Attr, NamespaceError>> {
        if !is_child_name(name) {
            return Some(Err(NamespaceError::NotFound));
        }
        self.fresh_lookup(&self.tree.read(), parent, name)
    }

    fn fresh_lookup(
        &self,
        tree: &Tree,
        parent: u64,
        name: &str,
    ) -> Option<Result<Attr, NamespaceError>> {
        let node = match Self::node(tree, parent) {
            Ok(node) => node,
            Err(e) => return Some(Err(e)),
        };
        let Some(dir) = node.dir() else {
            return Some(Err(NamespaceError::NotADirectory));
        };
        if let Some((_, listed)) = dir.listing() {
            if self.ttl.is_fresh(listed) {
                return Some(match tree.child(dir, name) {
                    Some(ino) => Ok(Self::attr_of(ino, &tree.nodes[(ino - 1) as usize])),
                    None => Err(NamespaceError::NotFound),
                });
            }
        }
        if let Some(ino) = tree.child(dir, name) {
            let child = &tree.nodes[(ino - 1) as usize];
            if self.ttl.is_fresh_stamp(child.checked) {
                return Some(Ok(Self::attr_of(ino, child)));
            }
        }
        match dir.missing.get(name) {
            Some(since) if self.ttl.is_fresh(*since) => Some(Err(NamespaceError::NotFound)),
            _ => None,
        }
    }

    /// Looks `name` up in directory `parent`.
    pub async fn lookup(self: &Arc<Self>, parent: u64, name: &str) -> Result<Attr, NamespaceError> {
        if !is_child_name(name) {
            return Err(NamespaceError::NotFound);
        }
        // (With a zero TTL a listing would be stale at once: neither start nor wait for one.)
        let lists = !self.ttl.always_stale();
        let (prefix, follower) = {
            let tree = self.tree.read();
            if let Some(answer) = self.fresh_lookup(&tree, parent, name) {
                return answer;
            }
            let node = Self::node(&tree, parent)?;
            let listed_before = node
                .dir()
                .ok_or(NamespaceError::NotADirectory)?
                .listing()
                .map(|(_, at)| at);
            let prefix = self.dir_prefix(&tree, parent);
            let follower = match lists.then(|| self.listings.claim(parent)) {
                Some(Claim::Lead(lead)) => {
                    let this = self.clone();
                    let dir_prefix = prefix.clone();
                    tokio::spawn(async move {
                        if let Err(e) = this.list_dir(parent, &dir_prefix, Some(lead)).await {
                            tracing::debug!(error = %e, "background listing failed");
                        }
                    });
                    None
                }
                Some(Claim::Follow(f)) => Some((f, listed_before)),
                None => None,
            };
            (prefix, follower)
        };
        if let Some((follower, listed_before)) = follower {
            if follower.first_page().await {
                let tree = self.tree.read();
                if self.listing_since(&tree, parent, listed_before).is_some() {
                    if let Some(answer) = self.fresh_lookup(&tree, parent, name) {
                        return answer;
                    }
                }
            }
        }
        let found = self.probe(&prefix, name).await?;
        let mut tree = self.tree.write();
        let now = Instant::now();
        match found {
            Found::Nothing => {
                let known = Self::node(&tree, parent)?
                    .dir()
                    .is_some_and(|d| tree.child(d, name).is_some());
                let dir = Self::dir_mut(&mut tree, parent)?;
                let name: Arc<str> = Arc::from(name);
                dir.remove_child(name.clone(), known);
                dir.missing.insert(name, now);
                Err(NamespaceError::NotFound)
            }
            Found::Dir => {
                let ino = Self::upsert(
                    &mut tree,
                    parent,
                    name,
                    NodeKind::Dir,
                    self.mount_time,
                    now,
                    true,
                );
                Ok(Self::attr_of(ino, &tree.nodes[(ino - 1) as usize]))
            }
            Found::File(meta) => {
                let kind = NodeKind::file(meta.size, &meta.etag);
                let ino =
                    Self::upsert(&mut tree, parent, name, kind, meta.last_modified, now, true);
                Ok(Self::attr_of(ino, &tree.nodes[(ino - 1) as usize]))
            }
        }
    }

    /// HEAD `prefix+name` and LIST `prefix+name/` concurrently.
    async fn probe(&self, prefix: &str, name: &str) -> Result<Found, NamespaceError> {
        let key = format!("{prefix}{name}");
        let dir_prefix = format!("{key}/");
        let (head, list) = futures::join!(
            self.store.head(&key),
            self.store.list_page(ListRequest::probe(&dir_prefix))
        );
        let list = list?;
        let is_dir = !list.objects.is_empty() || !list.prefixes.is_empty();
        match head {
            Ok(meta) if !is_dir => Ok(Found::File(meta)),
            Ok(_) => {
                self.skipped.skip(
                    &key,
                    "an object and a prefix share this name; the directory is shown",
                );
                Ok(Found::Dir)
            }
            Err(StoreError::NotFound) if is_dir => Ok(Found::Dir),
            Err(StoreError::NotFound) => Ok(Found::Nothing),
            Err(e) => Err(e.into()),
        }
    }

    fn dir_mut(tree: &mut Tree, ino: u64) -> Result<&mut DirState, NamespaceError> {
        tree.nodes
            .get_mut((ino - 1) as usize)
            .ok_or(NamespaceError::NotFound)?
            .dir_mut()
            .ok_or(NamespaceError::NotADirectory)
    }

    /// Inserts or refreshes child `name` of `parent`, keeping its inode if its kind is unchanged,
    /// and returns the inode. With `index`, a new inode is recorded as a change to the parent's
    /// children (a listing being applied records its children itself).
    #[allow(clippy::too_many_arguments)]
    fn upsert(
        tree: &mut Tree,
        parent: u64,
        name: &str,
        kind: NodeKind,
        mtime: SystemTime,
        now: Instant,
        index: bool,
    ) -> u64 {
        let existing = tree.nodes[(parent - 1) as usize]
            .dir()
            .and_then(|d| tree.child(d, name));
        if let Some(ino) = existing {
            let node = &mut tree.nodes[(ino - 1) as usize];
            if node.is_dir() == kind.is_dir() {
                if !kind.is_dir() {
                    node.mtime = Mtime::new(mtime);
                }
                node.set_file(kind);
                node.checked = Stamp::at(now);
                return ino;
            }
        }
        let body = match kind {
            NodeKind::Dir => Body::Dir(Box::default()),
            NodeKind::File { size, etag } => Body::File { size, etag },
        };
        let ino = tree.push(Node {
            parent,
            name: Name::new(name),
            body,
            mtime: Mtime::new(mtime),
            checked: Stamp::at(now),
        });
        if let Some(dir) = tree.nodes[(parent - 1) as usize].dir_mut() {
            dir.missing.remove(name);
            if index {
                dir.set_child(Arc::from(name), ino);
            }
        }
        ino
    }

    /// Attributes of `ino`, revalidated with a HEAD when a file's are older than the TTL.
    pub(crate) async fn getattr(&self, ino: u64) -> Result<Attr, NamespaceError> {
        if let Some(answer) = self.getattr_cached(ino) {
            return answer;
        }
        let key = Self::path_of(&self.tree.read(), &self.root_prefix, ino);
        let result = self.store.head(&key).await;
        let mut tree = self.tree.write();
        let node = tree
            .nodes
            .get_mut((ino - 1) as usize)
            .ok_or(NamespaceError::NotFound)?;
        match result {
            Ok(meta) => {
                node.set_file(NodeKind::file(meta.size, &meta.etag));
                node.mtime = Mtime::new(meta.last_modified);
                node.checked = Stamp::at(Instant::now());
                Ok(Self::attr_of(ino, node))
            }
            Err(StoreError::NotFound) => Err(NamespaceError::NotFound),
            Err(e) => Err(e.into()),
        }
    }

    /// Attributes of `ino` if they need no revalidation (a directory, or a file checked within
    /// the TTL).
    pub(crate) fn getattr_cached(&self, ino: u64) -> Option<Result<Attr, NamespaceError>> {
        let tree = self.tree.read();
        match Self::node(&tree, ino) {
            Ok(node) if node.is_dir() || self.ttl.is_fresh_stamp(node.checked) => {
                Some(Ok(Self::attr_of(ino, node)))
            }
            Ok(_) => None,
            Err(e) => Some(Err(e)),
        }
    }

    /// Deletes the saved listing of a directory whose in-memory listing was dropped because
    /// something in it changed, so no later mount trusts it.
    fn forget_kept(&self, prefix: &str) {
        if let Some(kept) = &self.kept {
            kept.forget(prefix);
        }
    }

    /// Forces the next access to `ino` to ask the store (after it changed under a reader).
    pub(crate) fn invalidate(&self, ino: u64) {
        let mut tree = self.tree.write();
        let Some(node) = tree.nodes.get_mut((ino.wrapping_sub(1)) as usize) else {
            return;
        };
        if !node.is_dir() {
            node.checked = Stamp::LONG_AGO;
        }
        let parent = node.parent;
        if let Some(dir) = tree.nodes[(parent - 1) as usize].dir_mut() {
            dir.listed_at = None;
        }
        let parent_prefix = self.dir_prefix(&tree, parent);
        drop(tree);
        self.forget_kept(&parent_prefix);
    }
}

#[cfg(test)]
mod tests;
