//! Demand reads answered without a task ([`Fetcher::read_quick`]): from memory at once, from
//! the NVMe cache's page cache when its blocks are known good, or from one block of an open
//! cache entry on the cache's I/O thread. Anything else goes through [`Fetcher::read`].

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;

use super::{BlockKey, Fetcher, ObjectVersion};

impl Fetcher {
    /// A demand read of `range` (clamped to the object) served without a task when it needs
    /// no request to the store and no metadata I/O: at once when every block is in memory;
    /// from the NVMe cache's data file, just the bytes of `range`, when its blocks are known
    /// good to this process ([`crate::cache::DiskCache::read_verified_on_ring`]); or from
    /// one block of the NVMe cache whose entry is open, with `done` run on the cache's I/O
    /// thread as soon as the bytes are read and verified. Otherwise (anything missing,
    /// several blocks not all in memory, a failed or mismatched disk read) `done` gets `None`
    /// and the caller takes the task path, [`Fetcher::read`], which fetches, waits, and deals
    /// with errors. Calls `done` exactly once, possibly before returning.
    ///
    /// A warm read then costs one hand-off (to the I/O thread and its reply) instead of four
    /// (to a task, to the GET task that finds the block on disk, to the I/O thread, and back).
    pub(crate) fn read_quick<F>(
        self: &Arc<Self>,
        obj: &Arc<ObjectVersion>,
        range: Range<u64>,
        done: F,
    ) where
        F: FnOnce(Option<Bytes>) + Send + 'static,
    {
        let Some((range, blocks)) = self.clamp(obj, range) else {
            return done(Some(Bytes::new()));
        };
        let bs = self.config.block_size;
        let parts: Option<Vec<Bytes>> = blocks
            .clone()
            .map(|i| self.cache.get(&(obj.clone(), i)))
            .collect();
        if let Some(parts) = parts {
            let n = parts.len() as u64;
            self.stats.block_hits.fetch_add(n, Ordering::Relaxed);
            return done(Some(self.assemble(range, blocks.start, &parts)));
        }
        let Some(disk) = &self.disk else {
            return done(None);
        };
        if !disk.may_serve(obj) {
            // Not proved readable by this mount's principal: the task path fetches it.
            return done(None);
        }
        // Blocks known good: just the bytes asked for, through the page cache. Not a short
        // block alone (a small file): that is read on the FUSE thread below, which costs less
        // than the hand-off to the I/O thread and back.
        let one_block = blocks.end - blocks.start == 1;
        let short = {
            let block = self.block_range(obj, blocks.start);
            (block.end - block.start) % crate::cache::ring::ALIGN as u64 != 0
        };
        if self.any_in_flight(obj, blocks.clone()) {
            // Being fetched or read from disk already (read-ahead, or a stream's window read
            // into memory): wait for that rather than read the same bytes a second time.
            return done(None);
        }
        let done = if one_block && short {
            done
        } else {
            let Err(done) =
                disk.cache
                    .read_verified_on_ring(&disk.identity(obj), range.clone(), done)
            else {
                return;
            };
            done
        };
        if !one_block {
            return done(None);
        }
        let index = blocks.start;
        let this = self.clone();
        let key = (obj.clone(), index);
        let slice = (range.start - index * bs) as usize..(range.end - index * bs) as usize;
        let id = disk.identity(obj);
        // A short block (a small file) is read right here, on the FUSE thread.
        if let Some(data) = disk.cache.read_short_block_here(&id, index) {
            return done(Some(self.disk_block_read(key, data, slice)));
        }
        let on_disk = disk.cache.read_block_on_ring(&id, index, move |data| {
            let Some(data) = data else {
                return done(None);
            };
            done(Some(this.disk_block_read(key, data, slice)));
        });
        if let Err(done) = on_disk {
            done(None);
        }
    }

    /// Whether a block of `blocks` is being fetched or read from disk.
    fn any_in_flight(&self, obj: &Arc<ObjectVersion>, blocks: Range<u64>) -> bool {
        let inflight = self.inflight.lock();
        blocks
            .into_iter()
            .any(|i| inflight.contains_key(&(obj.clone(), i)))
    }

    /// A demand read's block read from the NVMe cache: counted, kept in memory when the read
    /// took only part of it (the kernel's reads of a large file are smaller than a block, and
    /// the next ones of this block are then served at once; a read of a whole small file has
    /// no next one), and the part `slice` returned.
    fn disk_block_read(&self, key: BlockKey, data: Bytes, slice: Range<usize>) -> Bytes {
        self.stats.block_misses.fetch_add(1, Ordering::Relaxed);
        self.stats.disk_hits.fetch_add(1, Ordering::Relaxed);
        let part = data.slice(slice);
        if part.len() < data.len() {
            self.cache.insert(key, data);
        }
        part
    }
}
