//! The read of a daemon-served handle that waits: the bytes from the fetcher, or the errno of
//! its failure ([`read_errno`]).
//!
//! Bytes already in memory or in an open NVMe cache entry are answered before this, without a
//! task (`Fetcher::read_quick`, in the adapter); everything else comes here, on a task. A
//! read that finds the object changed in the store (its ETag no longer matches) fails with
//! EIO, the open keeps reading the version it opened, and the next open sees the new one: the
//! inode's attributes are invalidated, and a backing file kept for the old version dropped.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use fuser::Errno;

use super::errno::read_errno;
use super::handles::Handles;
use crate::fetch::{FetchError, Fetcher};
use crate::namespace::Namespace;
use crate::reader::FileReader;

/// What a read needs, cloned into its task.
#[derive(Clone)]
pub(super) struct Reads {
    pub ns: Arc<Namespace>,
    pub fetcher: Arc<Fetcher>,
    pub handles: Arc<Handles>,
}

impl Reads {
    /// Bytes `range` of the object `reader` (of inode `ino`) reads, for the kernel's read of
    /// `size` bytes at `offset`.
    pub async fn read(
        &self,
        ino: u64,
        reader: &FileReader,
        range: Range<u64>,
        offset: u64,
        size: u32,
    ) -> Result<Bytes, Errno> {
        let object = reader.object();
        self.fetcher.read(object, range).await.map_err(|e| {
            if e == FetchError::Changed {
                self.ns.invalidate(ino);
                if let Some(disk) = self.fetcher.disk() {
                    self.handles.kept.forget(&disk.entry_key(object));
                }
            }
            read_errno(&object.key, offset, size, &e)
        })
    }
}
