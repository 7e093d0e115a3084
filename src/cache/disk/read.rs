//! Block reads: on a task, straight on the I/O thread, on the calling thread (a short block),
//! or by name for a closed entry of one block, each checked against the block's CRC32C (a
//! mismatch drops the block) unless this process has checked or written it ([`Expected`]);
//! and reads of part of blocks known good, without the check.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;

use super::table::{closed_one_block, COMPLETE};
use super::{io_err, DiskCache};
use crate::cache::entry::OpenEntry;
use crate::cache::format::{self, RecordKind};
use crate::cache::identity::{EntryKey, ObjectIdentity};
use crate::cache::ring::{IoBuf, ALIGN};
use crate::cache::CacheError;

/// How many blocks at the start of `blocks` are known good (`VERIFIED`) in `open`.
pub(super) fn verified_prefix_of(open: &OpenEntry, blocks: std::ops::Range<u64>) -> u64 {
    let b = open.blocks.lock();
    blocks.take_while(|&i| b.is_verified(i)).count() as u64
}

/// `range` rounded out to whole pages ([`ALIGN`]), when those pages lie within an object of
/// `size` bytes: the span a verified read takes through the entry's `O_DIRECT` descriptor,
/// which copies the pages once, from the disk into the ring's buffer, where the buffered
/// descriptor copies them twice (disk to page cache, page cache to the buffer) and fills the
/// page cache with a second copy of what the daemon's memory cache and the kernel's cache of
/// the mount already hold. W2-shaped warm epochs without passthrough (1 GiB of shards, a
/// 256 MiB memory cache, the page cache dropped) went from 789 to 896 MB/s over io_uring and
/// from 949 to 985 MB/s over `/dev/fuse` (medians of nine alternated epochs). `None` when the
/// rounded range would reach the object's last, partial page: that read goes through the page
/// cache.
pub(super) fn direct_span(range: &std::ops::Range<u64>, size: u64) -> Option<std::ops::Range<u64>> {
    let align = ALIGN as u64;
    let start = range.start - range.start % align;
    let end = range.end.checked_next_multiple_of(align)?;
    (end <= size).then_some(start..end)
}

/// What a block read back must be: `len` bytes that match its CRC32C, `crc`. The check is
/// made once per process: a block this process has checked already, or written itself
/// (`known_good`: its `VERIFIED` mark, see the `entry` module), is taken whole without
/// computing the CRC again, as a read of part of it ([`DiskCache::read_verified_on_ring`])
/// and FUSE passthrough take it. A stream's read-ahead reads every block of a shard whole into
/// memory again each epoch: a 1 MiB block's CRC was 5-6% of the machine's CPU in W2's warm
/// epochs without passthrough (`perf -a`), and skipping it took the daemon's CPU per epoch
/// from 0.84 to 0.75 s over `/dev/fuse` and from 0.84 to 0.79 s over io_uring (medians of 12
/// alternated epochs, the same set-up as [`direct_span`]'s).
#[derive(Clone, Copy, Debug)]
pub(super) struct Expected {
    pub len: u64,
    pub crc: u32,
    pub known_good: bool,
}

impl Expected {
    /// Whether `data`, read back, is the block.
    pub fn met_by(&self, data: &[u8]) -> bool {
        data.len() as u64 == self.len && (self.known_good || crc32c::crc32c(data) == self.crc)
    }
}

/// What block `index` of `open` (`len` bytes) must read back as, if it is present.
fn expected(open: &OpenEntry, index: u64, len: u64) -> Option<Expected> {
    let b = open.blocks.lock();
    Some(Expected {
        len,
        crc: b.crc(index)?,
        known_good: b.is_verified(index),
    })
}

/// `want.len` bytes of `file` at `offset` read on the calling thread, when they are all there
/// and are the block.
pub(super) fn read_checked(file: &File, offset: u64, want: Expected) -> Option<Bytes> {
    let mut buf = vec![0u8; want.len as usize];
    match file.read_at(&mut buf, offset) {
        Ok(n) if want.met_by(&buf[..n]) => Some(Bytes::from(buf)),
        _ => None,
    }
}

impl DiskCache {
    /// Block `index` of `id`, or `None` on a miss (absent, or dropped because its CRC did not
    /// match). Errors are failures of the cache disk: read from the store instead.
    pub async fn read_block(
        &self,
        id: &ObjectIdentity,
        index: u64,
    ) -> Result<Option<Bytes>, CacheError> {
        let result = self.read_inner(id, index).await;
        match &result {
            Ok(Some(_)) => self.counters.hits.fetch_add(1, Ordering::Relaxed),
            _ => self.counters.misses.fetch_add(1, Ordering::Relaxed),
        };
        if let Err(e) = &result {
            self.report(e);
        }
        result
    }

    pub(super) async fn read_inner(
        &self,
        id: &ObjectIdentity,
        index: u64,
    ) -> Result<Option<Bytes>, CacheError> {
        let len = self.block_len(id, index)?;
        let key = id.entry_key();
        let Some(entry) = self.load(id, key, false).await? else {
            return Ok(None);
        };
        let read = self.read_open(id, &entry, index, len).await;
        drop(entry);
        // One trip to the state: the policy hears of the hit, and the entry goes idle.
        let mut guard = self.state.lock();
        let st = &mut *guard;
        if let Some(at) = st.table.find(&key) {
            if matches!(read, Ok(Some(_))) {
                st.policy.touch(at, &st.table);
            }
            if let Some(e) = st.table.at_mut(at) {
                e.settle();
            }
        }
        read
    }

    /// [`Self::read_inner`] once the entry is open.
    pub(super) async fn read_open(
        &self,
        id: &ObjectIdentity,
        entry: &Arc<OpenEntry>,
        index: u64,
        len: u64,
    ) -> Result<Option<Bytes>, CacheError> {
        let mut want = expected(entry, index, len);
        if want.is_none() {
            self.refresh(entry).await?;
            want = expected(entry, index, len);
        }
        let Some(want) = want else {
            return Ok(None);
        };
        let crc = want.crc;
        let offset = index * self.block_size;
        let file = entry.file_for_reading(len);
        let data = match self.ring.read(file, offset, len as usize).await {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Bytes::new(),
            Err(e) => return Err(io_err("reading a cached block", e)),
        };
        if !want.met_by(&data) {
            self.drop_block(id, entry, index, crc).await;
            return Ok(None);
        }
        entry.blocks.lock().set_verified(index, crc);
        Ok(Some(data))
    }

    /// Reads block `index` of `id` without a task, when that needs no metadata I/O: the entry
    /// is open here and the block's CRC is known. The read goes to the I/O thread, and `done`
    /// runs there with the bytes once their CRC matched, or with `None` when the read failed
    /// or the bytes did not match (the caller then takes the task path, [`Self::read_block`],
    /// which reads again and drops or reports what is wrong). Gives `done` back, uncalled,
    /// when the block cannot be read this way. `done` runs on the I/O thread: it must be short.
    pub(crate) fn read_block_on_ring<F>(
        self: &Arc<Self>,
        id: &ObjectIdentity,
        index: u64,
        done: F,
    ) -> Result<(), F>
    where
        F: FnOnce(Option<Bytes>) + Send + 'static,
    {
        let Ok(len) = self.block_len(id, index) else {
            return Err(done);
        };
        let key = id.entry_key();
        let Some((entry, want)) = self.open_for_read(key, id.size, index, len) else {
            return Err(done);
        };
        let this = self.clone();
        let file = entry.file_for_reading(len).clone();
        self.ring
            .read_then(file, index * self.block_size, len as usize, move |read| {
                let data = match read {
                    Ok(data) if want.met_by(&data) => Some(data),
                    _ => None,
                };
                if data.is_some() && !want.known_good {
                    entry.blocks.lock().set_verified(index, want.crc);
                }
                // The ring let go of the descriptor before calling: with this `Arc` gone,
                // the entry can go idle.
                drop(entry);
                this.finish_read(key, data.is_some());
                done(data);
            });
        Ok(())
    }

    /// Block `index` of `id` read on the calling thread (a FUSE thread), when it is a short
    /// block: read through the buffered descriptor, a few pages that are usually in the page
    /// cache already or on their way (a lookup of a small cached file starts a `readahead`
    /// of it). Waiting for them here, as a local file system's reader would, costs less than
    /// handing the read to the ring thread and the reply back: W1's warm epoch without
    /// passthrough went from 0.75x to 0.83-0.90x of local disk (medians of 6-12 alternated
    /// rounds). A page-cache-only read (`RWF_NOWAIT`) found half the blocks still being read
    /// and gave 0.78x. `None` for a whole block (read with `O_DIRECT` on the ring), one not
    /// present or not open here, and one that fails its read or CRC check: the caller takes
    /// [`Self::read_block_on_ring`], which reports and drops a block that fails its CRC.
    pub(crate) fn read_short_block_here(&self, id: &ObjectIdentity, index: u64) -> Option<Bytes> {
        let len = self.block_len(id, index).ok()?;
        if len % ALIGN as u64 == 0 {
            return None; // read with O_DIRECT: not through the page cache
        }
        let key = id.entry_key();
        let Some((entry, want)) = self.open_for_read(key, id.size, index, len) else {
            return self.read_closed_block(key, len);
        };
        let data = read_checked(entry.file_for_reading(len), index * self.block_size, want);
        if data.is_some() && !want.known_good {
            entry.blocks.lock().set_verified(index, want.crc);
        }
        drop(entry);
        self.finish_read(key, data.is_some());
        data
    }

    /// [`Self::read_short_block_here`] of an entry whose files are closed, by the data file's
    /// name and against the CRC kept for it ([`entry::OneBlock`]); `None` (the caller reloads
    /// the entry) when it has none, the file is gone, or the bytes fail the check.
    pub(super) fn read_closed_block(&self, key: EntryKey, len: u64) -> Option<Bytes> {
        let one = closed_one_block(&self.state.lock().table, key)?;
        let file = File::open(key.data_path(&self.root, one.nonce)).ok()?;
        let want = Expected {
            len,
            crc: one.crc,
            known_good: false,
        };
        let data = read_checked(&file, 0, want);
        drop(file);
        if data.is_some() {
            self.finish_read(key, true);
        }
        data
    }

    /// Reads bytes `range` of `id` (within the object) straight from its data file (with
    /// `O_DIRECT` where the range's pages lie within the object, see [`direct_span`], else
    /// through the page cache), when every block the range touches is present and known good
    /// to this process (the entry's `VERIFIED` marks, see the `entry` module): just the bytes asked
    /// for, with no CRC to check, as a local file system would read them and as FUSE
    /// passthrough reads a file whose blocks are all known good. The read goes to the I/O
    /// thread (a buffered read that waits for the disk must not hold up a FUSE thread) and
    /// `done` runs there with the bytes, or with `None` if the read failed or came up short
    /// (the caller then reads the blocks the checked way). Gives `done` back, uncalled, when
    /// some block is absent, not known good, or the entry is not open here.
    ///
    /// A block read whole and checked costs a whole block of disk reads and a CRC for every
    /// read that misses memory; random reads of a few KiB to 1 MiB into a large cached file
    /// (W3) read 1-2 MiB each that way.
    pub(crate) fn read_verified_on_ring<F>(
        self: &Arc<Self>,
        id: &ObjectIdentity,
        range: std::ops::Range<u64>,
        done: F,
    ) -> Result<(), F>
    where
        F: FnOnce(Option<Bytes>) + Send + 'static,
    {
        if range.is_empty() || range.end > id.size {
            return Err(done);
        }
        let blocks = range.start / self.block_size..range.end.div_ceil(self.block_size);
        let key = id.entry_key();
        let entry = {
            let mut guard = self.state.lock();
            let st = &mut *guard;
            let Some(at) = st.table.find(&key) else {
                return Err(done);
            };
            let Some(open) = st.table.at(at).and_then(|e| e.files.active()).cloned() else {
                return Err(done);
            };
            if open.is_dead()
                || verified_prefix_of(&open, blocks.clone()) < blocks.end - blocks.start
            {
                return Err(done);
            }
            st.open_lru.use_now(at);
            open
        };
        let this = self.clone();
        let len = (range.end - range.start) as usize;
        let (file, span) = match (&entry.direct, direct_span(&range, id.size)) {
            (Some(direct), Some(span)) => (direct.clone(), span),
            _ => (entry.data.clone(), range.clone()),
        };
        let skip = (range.start - span.start) as usize;
        let span_len = (span.end - span.start) as usize;
        self.ring
            .read_then(file, span.start, span_len, move |read| {
                let data = read
                    .ok()
                    .filter(|d| d.len() == span_len)
                    .map(|d| d.slice(skip..skip + len));
                drop(entry);
                if data.is_some() {
                    this.counters.verified_reads.fetch_add(1, Ordering::Relaxed);
                }
                this.finish_read(key, data.is_some());
                done(data);
            });
        Ok(())
    }

    /// After a block read of `key`: a hit touches the entry for eviction and counts; either
    /// way the entry may go idle again.
    pub(super) fn finish_read(&self, key: EntryKey, hit: bool) {
        {
            let mut guard = self.state.lock();
            let st = &mut *guard;
            if let Some(at) = st.table.find(&key) {
                if hit {
                    st.policy.touch(at, &st.table);
                }
                if let Some(e) = st.table.at_mut(at) {
                    e.settle();
                }
            }
        }
        if hit {
            self.counters.hits.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The open entry of `key` and what its block `index` (`len` bytes) must read back as,
    /// when it is open here and the block present (an idle entry is made an open one only
    /// then).
    pub(super) fn open_for_read(
        &self,
        key: EntryKey,
        size: u64,
        index: u64,
        len: u64,
    ) -> Option<(Arc<OpenEntry>, Expected)> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let at = st.table.find(&key)?;
        let e = st.table.at_mut(at)?;
        if e.files.is_dead() {
            return None;
        }
        e.files.crc(index)?;
        let open = e.files.activate(key, size, self.block_size)?;
        st.open_lru.use_now(at);
        let want = expected(&open, index, len)?;
        Some((open, want))
    }

    /// Drops a block whose bytes did not match their CRC: in memory, then in the journal.
    pub(super) async fn drop_block(
        &self,
        id: &ObjectIdentity,
        entry: &Arc<OpenEntry>,
        index: u64,
        crc: u32,
    ) {
        self.counters.crc_failures.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(key = %id.key, block = index, "cached block failed its CRC32C check; dropped, fetching it again");
        {
            let mut b = entry.blocks.lock();
            if b.crc(index) != Some(crc) {
                return; // rewritten meanwhile
            }
            b.apply(index as u32, RecordKind::Dropped);
        }
        {
            let mut st = self.state.lock();
            if let Some(e) = st.table.get_mut(&entry.key) {
                e.set(COMPLETE, false);
            }
        }
        let rec = format::encode_record(index as u32, RecordKind::Dropped);
        if let Err(e) = self
            .ring
            .write(&entry.idx, 0, IoBuf::Bytes(Bytes::copy_from_slice(&rec)))
            .await
        {
            tracing::debug!(error = %e, "could not journal a dropped block");
        }
    }

    /// How many blocks at the start of `blocks` are present and known good to this process,
    /// in an entry open here (no I/O): those [`Self::read_verified_on_ring`] would serve.
    pub(crate) fn verified_prefix(&self, id: &ObjectIdentity, blocks: std::ops::Range<u64>) -> u64 {
        let st = self.state.lock();
        match st.table.get(&id.entry_key()).and_then(|e| e.files.active()) {
            Some(open) if !open.is_dead() => verified_prefix_of(open, blocks),
            _ => 0,
        }
    }

    /// Whether block `index` of `id` is known here to be present (no I/O: blocks written by
    /// other processes since this process last looked are not seen; `read_block` sees them).
    pub fn has_block(&self, id: &ObjectIdentity, index: u64) -> bool {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let Some(at) = st.table.find(&id.entry_key()) else {
            return false;
        };
        let Some(e) = st.table.at(at) else {
            return false;
        };
        if !e.files.is_open() || e.files.is_dead() {
            return false;
        }
        let present = e.files.crc(index).is_some();
        st.open_lru.use_now(at);
        present
    }
}

#[cfg(test)]
mod tests {
    use super::direct_span;

    const P: u64 = super::ALIGN as u64;

    #[test]
    fn a_direct_span_is_whole_pages_within_the_object() {
        assert_eq!(direct_span(&(10..20), 4 * P), Some(0..P));
        assert_eq!(direct_span(&(P..2 * P), 4 * P), Some(P..2 * P));
        assert_eq!(direct_span(&(P + 1..3 * P - 1), 4 * P), Some(P..3 * P));
        // A whole last page is read directly; a partial one never is.
        assert_eq!(direct_span(&(3 * P..4 * P), 4 * P), Some(3 * P..4 * P));
        assert_eq!(direct_span(&(3 * P..3 * P + 5), 3 * P + 5), None);
        assert_eq!(direct_span(&(10..20), 3 * P + 5), Some(0..P));
        assert_eq!(direct_span(&(2 * P + 1..3 * P + 1), 3 * P + 5), None);
    }
}
