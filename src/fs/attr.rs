//! What FUSE is shown: the attributes of an inode, a directory handle's entries from an
//! offset, and the size-or-data answer of the xattr calls.

use fuser::{Errno, FileAttr, FileType, INodeNo, ReplyXattr};

use super::{FsConfig, RiffleFs};
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
