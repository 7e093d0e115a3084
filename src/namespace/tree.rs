//! The in-memory tree: nodes indexed by inode number, each directory's children and listing.
//!
//! [`Tree`] is a `Vec` of [`Node`]s (index `ino - 1`; inodes are never freed). A node keeps
//! its name in 16 bytes, inline up to 15 bytes ([`Name`]), its times in 8 bytes each
//! ([`Stamp`], [`Mtime`]), a file's ETag in 16 bytes when it is an MD5 ([`StoredEtag`]) and a
//! directory's [`DirState`] behind a pointer, so a node takes 72 bytes. A directory's children
//! are indexed by its last listing ([`DirEntry`]s, 8 bytes each, sorted by their nodes' names)
//! plus the changes since. Nothing here does I/O or takes a lock: the async service
//! ([`super::Namespace`]) holds the tree under its lock and merges the store's answers in.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use super::names::Name;
use super::{Kind, NodeLog};

/// One entry of a directory listing: 8 bytes, one per listed object: the child's inode
/// number, with its kind in the top bit (which no inode number reaches). Its name is its
/// node's ([`super::Namespace::with_entries`] reads them); a listing is sorted by it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct DirEntry {
    ino_and_kind: u64,
}

const DIR_BIT: u64 = 1 << 63;

impl DirEntry {
    pub fn new(ino: u64, is_dir: bool) -> Self {
        debug_assert!(ino & DIR_BIT == 0);
        DirEntry {
            ino_and_kind: if is_dir { ino | DIR_BIT } else { ino },
        }
    }

    pub fn ino(&self) -> u64 {
        self.ino_and_kind & !DIR_BIT
    }

    pub fn is_dir(&self) -> bool {
        self.ino_and_kind & DIR_BIT != 0
    }
}

impl std::fmt::Debug for DirEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirEntry")
            .field("ino", &self.ino())
            .field("is_dir", &self.is_dir())
            .finish()
    }
}

/// A node's kind as the tree keeps it: like [`Kind`], with the ETag in 16 bytes when it is an
/// MD5 in lowercase hex (what S3 and Ceph give single-part objects) instead of a 48-byte
/// string on the heap.
#[derive(Debug, Clone)]
pub(super) enum NodeKind {
    Dir,
    File { size: u64, etag: StoredEtag },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum StoredEtag {
    Md5([u8; 16]),
    Text(Arc<str>),
}

/// Whether `s` is lowercase hex of even length: an ETag that can be kept as the bytes it
/// spells and given back exactly (here and in saved listings).
pub(super) fn is_lower_hex(s: &str) -> bool {
    s.len() % 2 == 0 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The bytes spelled by `s`, which [`is_lower_hex`] accepted.
pub(super) fn lower_hex_bytes(s: &str) -> impl Iterator<Item = u8> + '_ {
    let digit = |c: u8| match c {
        b'0'..=b'9' => c - b'0',
        _ => c - b'a' + 10,
    };
    s.as_bytes()
        .chunks(2)
        .map(move |p| (digit(p[0]) << 4) | digit(p[1]))
}

/// `bytes` spelled in lowercase hex.
pub(super) fn lower_hex(bytes: &[u8]) -> String {
    pub(super) const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(HEX[(b >> 4) as usize] as char);
        out.push(HEX[(b & 15) as usize] as char);
    }
    out
}

impl StoredEtag {
    pub(super) fn new(etag: &str) -> Self {
        if etag.len() == 32 && is_lower_hex(etag) {
            let mut md5 = [0u8; 16];
            for (out, b) in md5.iter_mut().zip(lower_hex_bytes(etag)) {
                *out = b;
            }
            return StoredEtag::Md5(md5);
        }
        StoredEtag::Text(Arc::from(etag))
    }

    /// The ETag exactly as the store gave it.
    pub(super) fn text(&self) -> Arc<str> {
        match self {
            StoredEtag::Md5(md5) => Arc::from(lower_hex(md5)),
            StoredEtag::Text(text) => text.clone(),
        }
    }
}

impl NodeKind {
    pub(super) fn file(size: u64, etag: &str) -> Self {
        NodeKind::File {
            size,
            etag: StoredEtag::new(etag),
        }
    }

    pub(super) fn is_dir(&self) -> bool {
        matches!(self, NodeKind::Dir)
    }
}

/// When a node was last checked against the store, in 8 bytes (an `Instant` takes 16):
/// signed nanoseconds from a process-wide base, so moments before it (a saved listing's age)
/// fit too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stamp(i64);

impl Stamp {
    /// Older than any TTL.
    pub(super) const LONG_AGO: Stamp = Stamp(i64::MIN);
    /// Never checked in this process (a node taken over from a predecessor daemon): stale
    /// under any TTL, `indefinite` too.
    pub(super) const NEVER: Stamp = Stamp(i64::MIN + 1);

    pub(super) fn base() -> Instant {
        static BASE: OnceLock<Instant> = OnceLock::new();
        *BASE.get_or_init(Instant::now)
    }

    pub(super) fn at(t: Instant) -> Stamp {
        let base = Self::base();
        let nanos = |d: Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        match t.checked_duration_since(base) {
            Some(after) => Stamp(nanos(after)),
            None => Stamp(-nanos(base.duration_since(t))),
        }
    }

    pub(super) fn elapsed(self) -> Duration {
        let now = Stamp::at(Instant::now()).0;
        Duration::from_nanos(u64::try_from(now.saturating_sub(self.0)).unwrap_or(0))
    }
}

/// A modification time in 8 bytes (a `SystemTime` takes 16): nanoseconds since the Unix
/// epoch (earlier times become the epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Mtime(u64);

impl Mtime {
    pub(super) fn new(t: SystemTime) -> Mtime {
        Mtime(
            t.duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
                .unwrap_or(0),
        )
    }

    pub(super) fn system_time(self) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_nanos(self.0)
    }
}

/// One node of the tree: 72 bytes (a directory's state lives behind a pointer, in the place
/// a file's size and ETag take).
#[derive(Debug)]
pub(super) struct Node {
    pub(super) parent: u64,
    pub(super) name: Name,
    pub(super) body: Body,
    pub(super) mtime: Mtime,
    pub(super) checked: Stamp,
}

/// What a node holds by kind.
#[derive(Debug)]
pub(super) enum Body {
    Dir(Box<DirState>),
    File { size: u64, etag: StoredEtag },
}

impl Node {
    pub(super) fn dir(&self) -> Option<&DirState> {
        match &self.body {
            Body::Dir(dir) => Some(dir),
            Body::File { .. } => None,
        }
    }

    pub(super) fn dir_mut(&mut self) -> Option<&mut DirState> {
        match &mut self.body {
            Body::Dir(dir) => Some(dir),
            Body::File { .. } => None,
        }
    }

    pub(super) fn is_dir(&self) -> bool {
        matches!(self.body, Body::Dir(_))
    }

    pub(super) fn kind(&self) -> Kind {
        match &self.body {
            Body::Dir(_) => Kind::Dir,
            Body::File { size, etag } => Kind::File {
                size: *size,
                etag: etag.text(),
            },
        }
    }

    /// Sets a file's size and ETag (nothing for a directory).
    pub(super) fn set_file(&mut self, kind: NodeKind) {
        if let (Body::File { .. }, NodeKind::File { size, etag }) = (&self.body, kind) {
            self.body = Body::File { size, etag };
        }
    }
}

/// A directory's children and listing.
///
/// The children are indexed by the last complete listing itself (sorted by name: a binary
/// search through the children's nodes, [`Tree::child`]) plus the changes made since
/// (`changes`, usually empty): a separate name -> inode map would cost about 50 bytes per
/// object on top of the listing. The listing's entries
/// stay as the index after the listing stops counting as one (`listed_at` None: invalidated,
/// or a child superseded), so a re-listing keeps every name's inode.
#[derive(Debug, Default)]
pub(super) struct DirState {
    /// The last complete listing, sorted by name.
    pub(super) entries: Arc<Vec<DirEntry>>,
    /// When `entries` was listed; None while there is no valid listing.
    pub(super) listed_at: Option<Instant>,
    /// Children added or replaced (`Some`) or gone (`None`) since `entries` was listed.
    pub(super) changes: HashMap<Arc<str>, Option<u64>>,
    /// Names known not to exist, and since when.
    pub(super) missing: HashMap<Arc<str>, Instant>,
    /// Listed at least once in this mount (a saved listing is only used before that).
    pub(super) ever_listed: bool,
    /// The subdirectories of the current listing were queued for background listings.
    pub(super) fanned_out: bool,
}

impl DirState {
    /// The valid listing and when it was made.
    pub(super) fn listing(&self) -> Option<(&Arc<Vec<DirEntry>>, Instant)> {
        self.listed_at.map(|at| (&self.entries, at))
    }

    pub(super) fn set_child(&mut self, name: Arc<str>, ino: u64) {
        self.changes.insert(name, Some(ino));
    }

    /// Records that child `name` is gone; `known`: whether it was a child ([`Tree::child`]).
    pub(super) fn remove_child(&mut self, name: Arc<str>, known: bool) {
        if known {
            self.changes.insert(name, None);
        }
    }

    /// Installs a complete listing: it is the whole truth about the children now.
    pub(super) fn set_listing(&mut self, entries: Arc<Vec<DirEntry>>, at: Instant) {
        self.entries = entries;
        self.listed_at = Some(at);
        self.changes = HashMap::new();
        self.missing = HashMap::new();
    }
}

pub(super) struct Tree {
    /// Index `ino - 1`.
    pub(super) nodes: Vec<Node>,
    /// Told of each node added ([`NodeLog`]).
    pub(super) log: Option<Arc<dyn NodeLog>>,
}

impl Tree {
    /// The node of inode `ino` (which must exist).
    pub(super) fn at(&self, ino: u64) -> &Node {
        &self.nodes[(ino - 1) as usize]
    }

    /// The name of the node an entry of a listing points to.
    pub(super) fn name_of(&self, e: &DirEntry) -> &str {
        self.at(e.ino()).name.as_str()
    }

    /// The inode of child `name` of directory `dir`, if known: its changes since its listing,
    /// else a binary search of the listing by the children's names.
    pub(super) fn child(&self, dir: &DirState, name: &str) -> Option<u64> {
        if let Some(change) = dir.changes.get(name) {
            return *change;
        }
        self.find_in(&dir.entries, name)
            .map(|i| dir.entries[i].ino())
    }

    /// Where `name` is in `entries` (sorted by name), if it is there.
    pub(super) fn find_in(&self, entries: &[DirEntry], name: &str) -> Option<usize> {
        entries.binary_search_by(|e| self.name_of(e).cmp(name)).ok()
    }

    /// Sorts the entries of a listing by their nodes' names.
    pub(super) fn sort_by_name(&self, entries: &mut [DirEntry]) {
        entries.sort_unstable_by(|a, b| self.name_of(a).cmp(self.name_of(b)));
    }

    /// Adds `node` as the next inode and returns its number.
    pub(super) fn push(&mut self, node: Node) -> u64 {
        let ino = self.nodes.len() as u64 + 1;
        if let Some(log) = &self.log {
            log.created(ino, node.parent, node.is_dir(), &node.name);
        }
        self.nodes.push(node);
        ino
    }
}
