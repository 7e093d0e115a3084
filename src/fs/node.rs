//! Which node a request names, classified once at the top of each operation: the mount's
//! `.riffle-stats` file ([`stats_file`], an inode of its own that the namespace never gives
//! out) or an inode of the namespace.

use super::stats_file;

/// What a request's inode is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Node {
    /// `.riffle-stats` at the mount root ([`stats_file`]).
    Stats,
    /// A file or directory of the namespace.
    Object(u64),
}

impl Node {
    pub(super) fn of(ino: u64) -> Node {
        if ino == stats_file::INO {
            Node::Stats
        } else {
            Node::Object(ino)
        }
    }
}
