//! What FUSE is shown: the attributes of an inode, a directory handle's listing and its
//! entries from an offset, the extended attributes, and the size-or-data answer of the xattr
//! calls.

use std::ffi::OsStr;
use std::sync::Arc;

use fuser::{Errno, FileAttr, FileType, INodeNo, ReplyXattr};

use super::errno::ns_errno;
use super::node::Node;
use super::{dirplus, FsConfig, RiffleFs, ETAG_XATTR};
use crate::namespace::{Attr, DirEntry, Kind, Stat};

impl RiffleFs {
    pub(super) fn file_attr(config: &FsConfig, attr: &Attr) -> FileAttr {
        let size = match &attr.kind {
            Kind::Dir => None,
            Kind::File { size, .. } => Some(*size),
        };
        let stat = Stat {
            size,
            mtime: attr.mtime,
        };
        Self::stat_attr(config, attr.ino, stat)
    }

    /// The attributes of inode `ino` as FUSE shows them (a directory when `stat.size` is `None`).
    pub(super) fn stat_attr(config: &FsConfig, ino: u64, stat: Stat) -> FileAttr {
        let (kind, size, perm, nlink) = match stat.size {
            None => (FileType::Directory, 0, config.dir_mode, 2),
            Some(size) => (FileType::RegularFile, size, config.file_mode, 1),
        };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: stat.mtime,
            mtime: stat.mtime,
            ctime: stat.mtime,
            crtime: stat.mtime,
            kind,
            perm,
            nlink,
            uid: config.uid,
            gid: config.gid,
            rdev: 0,
            flags: 0,
            blksize: 1 << 20,
        }
    }

    /// The listing behind directory handle `fh`. A handle this process did not open was opened
    /// by a predecessor daemon ([`super::handover`]): the directory is listed again (on this thread,
    /// once per such handle) and the handle keeps that listing.
    pub(super) fn dir_handle(&self, ino: u64, fh: u64) -> Result<Arc<Vec<DirEntry>>, Errno> {
        if let Some(entries) = self.handles.dir(fh) {
            return Ok(entries);
        }
        if self.handles.table.get().is_none() {
            return Err(Errno::EBADF);
        }
        let entries = self
            .runtime
            .block_on(self.meta.ns.readdir(ino))
            .map_err(|e| ns_errno(&e))?;
        self.handles.insert_dir(fh, entries.clone());
        Ok(entries)
    }

    /// Whether the read at `offset` of directory `ino`, listed as `entries`, gives only `.`
    /// and `..`: a first read, for a reader that wants names (module [`dirplus`]).
    pub(super) fn names_only(&self, ino: u64, offset: u64, entries: &[DirEntry]) -> bool {
        offset == 0 && {
            let files = entries.iter().filter(|e| !e.is_dir()).count() as u64;
            self.meta.status.dirplus.first_read(ino, files) == dirplus::FirstRead::NamesOnly
        }
    }

    /// The getxattr of `name` on `node` (`Ok`: the value).
    pub(super) fn xattr(&self, node: Node, name: &OsStr) -> Result<Arc<str>, Errno> {
        let Node::Object(ino) = node else {
            return Err(Errno::NO_XATTR);
        };
        let etag = match self.meta.ns.cached_attr(ino) {
            Ok(Attr {
                kind: Kind::File { etag, .. },
                ..
            }) => etag,
            Ok(_) => return Err(Errno::NO_XATTR),
            Err(e) => return Err(ns_errno(&e)),
        };
        if name != ETAG_XATTR {
            return Err(Errno::NO_XATTR);
        }
        Ok(etag)
    }

    /// The listxattr of `node`: the names, each ending in a NUL.
    pub(super) fn xattr_names(&self, node: Node) -> Result<&'static [u8], Errno> {
        let Node::Object(ino) = node else {
            return Ok(b"");
        };
        match self.meta.ns.cached_attr(ino) {
            Ok(attr) if !attr.is_dir() => Ok(b"user.riffle.etag\0"),
            Ok(_) => Ok(b""),
            Err(e) => Err(ns_errno(&e)),
        }
    }
}

/// Feeds a directory handle's entries to `add` from `offset` on: offset 0 is ".", 1 is "..",
/// then the listing; each entry is passed with its name (`name_of` an entry of the listing)
/// and the offset of the one after it. Stops when `add` reports the reply buffer full.
pub(super) fn walk_listing<'a>(
    entries: &[DirEntry],
    ino: u64,
    parent: u64,
    offset: u64,
    name_of: impl Fn(&DirEntry) -> &'a str,
    mut add: impl FnMut(&DirEntry, &str, u64) -> bool,
) {
    let mut index = offset;
    loop {
        let (entry, name) = match index {
            0 => (DirEntry::new(ino, true), "."),
            1 => (DirEntry::new(parent, true), ".."),
            i => match entries.get((i - 2) as usize) {
                Some(e) => (*e, name_of(e)),
                None => return,
            },
        };
        if add(&entry, name, index + 1) {
            return;
        }
        index += 1;
    }
}

/// Answers a getxattr/listxattr: the size when asked for it, ERANGE when the buffer is small.
pub(super) fn xattr_reply(reply: ReplyXattr, value: &[u8], size: u32) {
    if size == 0 {
        reply.size(value.len() as u32);
    } else if (size as usize) < value.len() {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listings_resume_at_any_offset() {
        let entries: Vec<DirEntry> = (0..5).map(|i| DirEntry::new(10 + i, false)).collect();
        let names: Vec<String> = (0..5).map(|i| format!("f{i}")).collect();
        let name_of = |e: &DirEntry| names[(e.ino() - 10) as usize].as_str();
        let collect = |offset: u64, room: usize| {
            let mut out = Vec::new();
            walk_listing(&entries, 2, 1, offset, name_of, |e, name, next| {
                out.push((name.to_string(), e.ino(), next));
                out.len() == room
            });
            out
        };
        let all = collect(0, 100);
        assert_eq!(all.len(), 7);
        assert_eq!(all[0], (".".into(), 2, 1));
        assert_eq!(all[1], ("..".into(), 1, 2));
        assert_eq!(all[6], ("f4".into(), 14, 7));
        // A full buffer after three entries; the kernel resumes at the last offset given.
        let first = collect(0, 3);
        let rest = collect(first[2].2, 100);
        assert_eq!([first, rest].concat(), all);
        assert!(collect(7, 100).is_empty());
    }
}
