//! What a mount has listed, summed: the files and directories reachable from the root, the
//! bytes of those files, and how many of those bytes the node's cache holds.
//!
//! This is the `volume` section of `riffle stats` (and of `.riffle-stats`), which the CSI
//! plugin answers `NodeGetVolumeStats` from: a read-only dataset has no free space, so its
//! "capacity" is what it lists and its "use" is what this node keeps of it.
//!
//! The walk follows names, not inode numbers: a superseded inode (an object replaced while
//! open) and names a re-listing dropped are not counted. It goes one directory at a time, and
//! within a directory [`CHUNK`] children at a time, taking the tree's read lock for each chunk
//! only, so a walk of millions of names never holds off the lookups of a running epoch for
//! long; the cache is asked about a chunk's files after the lock is released. The figures are a
//! snapshot per chunk: a listing merged while the walk runs may be counted before or after.
//! Cost: one pass over the listed names (and one cache index lookup per file when asked),
//! the same order as the cache's own statistics.

use std::sync::Arc;

use super::tree::{Body, DirState, Tree};
use super::{Namespace, ROOT_INO};

/// Children handled per read lock.
const CHUNK: usize = 4096;

/// Whether the cache holds an object version whole: `(key, etag, size)`.
pub type CachedWhole<'a> = &'a dyn Fn(&str, &str, u64) -> bool;

/// The sums of one walk (see the module documentation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ListedUsage {
    /// Files reachable from the root.
    pub files: u64,
    /// Directories reachable from the root, the root excluded.
    pub dirs: u64,
    /// Bytes of those files.
    pub bytes: u64,
    /// Bytes of those files the cache holds whole (as told by the `cached` callback).
    pub cached_bytes: u64,
}

impl ListedUsage {
    /// Files and directories: the volume's inodes.
    pub fn entries(&self) -> u64 {
        self.files + self.dirs
    }
}

/// One file of a chunk, for the cache question asked outside the lock.
struct FileOfChunk {
    key: String,
    etag: Arc<str>,
    size: u64,
}

/// The current children of a directory: its listing's entries that no later change replaced,
/// then the names added or replaced since (their inodes; each node holds its name).
fn children(tree: &Tree, dir: &DirState) -> Vec<u64> {
    let mut out: Vec<u64> = dir
        .entries
        .iter()
        .filter(|e| !dir.changes.contains_key(tree.name_of(e)))
        .map(|e| e.ino())
        .collect();
    out.extend(dir.changes.values().flatten());
    out
}

impl Namespace {
    /// Walks the names reachable from the root and sums them. `cached(key, etag, size)` says
    /// whether the cache holds that object version whole; without it `cached_bytes` is 0.
    pub(crate) fn listed_usage(&self, cached: Option<CachedWhole<'_>>) -> ListedUsage {
        let mut usage = ListedUsage::default();
        // (directory inode, its key prefix: "" or ending in '/').
        let mut dirs = vec![(ROOT_INO, self.root_prefix.clone())];
        while let Some((dir, prefix)) = dirs.pop() {
            let names = {
                let tree = self.tree.read();
                match Self::node(&tree, dir).ok().and_then(|n| n.dir()) {
                    Some(state) => children(&tree, state),
                    None => continue,
                }
            };
            for chunk in names.chunks(CHUNK) {
                let mut files = Vec::new();
                {
                    let tree = self.tree.read();
                    for ino in chunk {
                        let Ok(node) = Self::node(&tree, *ino) else {
                            continue;
                        };
                        let name = node.name.as_str();
                        match &node.body {
                            Body::Dir(_) => {
                                usage.dirs += 1;
                                dirs.push((*ino, format!("{prefix}{name}/")));
                            }
                            Body::File { size, etag } => {
                                usage.files += 1;
                                usage.bytes += size;
                                if cached.is_some() {
                                    files.push(FileOfChunk {
                                        key: format!("{prefix}{name}"),
                                        etag: etag.text(),
                                        size: *size,
                                    });
                                }
                            }
                        }
                    }
                }
                if let Some(cached) = cached {
                    for f in files {
                        if cached(&f.key, &f.etag, f.size) {
                            usage.cached_bytes += f.size;
                        }
                    }
                }
            }
        }
        usage
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::namespace::MetadataTtl;
    use crate::store::memory::MemoryStore;
    use crate::store::ObjectStore;

    fn store() -> Arc<MemoryStore> {
        let s = Arc::new(MemoryStore::new());
        s.put("p/a.bin", vec![1u8; 10]);
        s.put("p/d/b.bin", vec![2u8; 20]);
        s.put("p/d/e/c.bin", vec![3u8; 30]);
        s.put("p/d/e/z.bin", vec![4u8; 5]);
        s.put("outside.bin", vec![5u8; 1000]);
        s
    }

    #[tokio::test]
    async fn sums_what_was_listed_below_the_prefix() {
        let s = store();
        let ns = Namespace::new(
            s.clone() as Arc<dyn ObjectStore>,
            "p/",
            MetadataTtl::Indefinite,
        );
        assert_eq!(
            ns.listed_usage(None),
            ListedUsage::default(),
            "nothing listed yet"
        );
        ns.resolve("d/e/c.bin").await.expect("resolve");
        ns.readdir(ROOT_INO).await.expect("list root");
        let d = ns.resolve("d").await.expect("d").ino;
        ns.readdir(d).await.expect("list d");
        let e = ns.resolve("d/e").await.expect("e").ino;
        ns.readdir(e).await.expect("list e");
        let asked = parking_lot::Mutex::new(Vec::new());
        let cached = |key: &str, _etag: &str, size: u64| {
            asked.lock().push(key.to_string());
            size == 30 || size == 10
        };
        let usage = ns.listed_usage(Some(&cached));
        assert_eq!(
            usage,
            ListedUsage {
                files: 4,
                dirs: 2,
                bytes: 65,
                cached_bytes: 40
            }
        );
        assert_eq!(usage.entries(), 6);
        let mut asked = asked.into_inner();
        asked.sort();
        assert_eq!(
            asked,
            ["p/a.bin", "p/d/b.bin", "p/d/e/c.bin", "p/d/e/z.bin"]
        );
    }
}
