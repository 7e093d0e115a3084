//! Block writes in the five steps of the module documentation ([`WriteStep`]), and the unit
//! tests' hook that stops a write before any of them.

use std::fs::File;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;

use super::table::{COMPLETE, EVICTING};
use super::{io_err, DiskCache};
use crate::cache::entry::{self, OpenEntry, Use};
use crate::cache::format::{self, RecordKind};
use crate::cache::identity::{EntryKey, ObjectIdentity};
use crate::cache::ring::{AlignedBuf, IoBuf, ALIGN};
use crate::cache::{sys, CacheError};

/// A step of a block write (see the module documentation); the test hook stops before one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WriteStep {
    Reserve,
    Lock,
    WriteData,
    AppendRecord,
    Publish,
}

impl WriteStep {
    pub const ALL: [WriteStep; 5] = [
        WriteStep::Reserve,
        WriteStep::Lock,
        WriteStep::WriteData,
        WriteStep::AppendRecord,
        WriteStep::Publish,
    ];
}

/// What the test hook asks a write to do at a step.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookAction {
    Continue,
    /// Stop before the step, as if the process died there.
    Crash,
    /// Do half of the step's write (`WriteData`, `AppendRecord`), then stop.
    CrashMidway,
}

#[cfg(test)]
pub type WriteHook = Arc<dyn Fn(WriteStep) -> HookAction + Send + Sync>;

/// Ends a write's use of an entry.
pub(super) struct WriteUse<'a> {
    cache: &'a DiskCache,
    entry: Arc<OpenEntry>,
    index: u32,
    writing: bool,
}

impl Drop for WriteUse<'_> {
    fn drop(&mut self) {
        if self.writing {
            self.entry
                .blocks
                .lock()
                .writing
                .retain(|&i| i != self.index);
        }
        self.entry.release_use();
        let mut st = self.cache.state.lock();
        if let Some(e) = st.table.get_mut(&self.entry.key) {
            e.writes = e.writes.saturating_sub(1);
        }
    }
}

/// Releases an OFD range lock.
pub(super) struct RangeLock<'a> {
    file: &'a File,
    start: u64,
    len: u64,
}

impl Drop for RangeLock<'_> {
    fn drop(&mut self) {
        let _ = sys::try_range_lock(self.file, self.start, self.len, false);
    }
}

impl DiskCache {
    #[cfg(test)]
    pub(crate) fn set_write_hook(&self, hook: Option<WriteHook>) {
        *self.hook.lock() = hook;
    }

    #[cfg(test)]
    pub(super) fn hook(&self, step: WriteStep) -> HookAction {
        self.hook
            .lock()
            .as_ref()
            .map_or(HookAction::Continue, |h| h(step))
    }

    /// Runs the test hook before `step`: `Ok(true)` to do only half of the step.
    #[cfg(test)]
    pub(super) fn step(&self, step: WriteStep) -> Result<bool, CacheError> {
        match self.hook(step) {
            HookAction::Continue => Ok(false),
            HookAction::Crash => Err(CacheError::SimulatedCrash(step)),
            HookAction::CrashMidway => Ok(true),
        }
    }

    #[cfg(not(test))]
    #[inline(always)]
    pub(super) fn step(&self, _step: WriteStep) -> Result<bool, CacheError> {
        Ok(false)
    }

    /// Stores block `index` of `id` (exactly its length: the last block may be short) before
    /// returning (written, not `fdatasync`ed: see the module documentation). `Ok(())` also
    /// when the block was already there or another writer had it. Errors: [`CacheError::Full`]
    /// (the budget cannot make room), [`CacheError::Busy`], or a failure of the cache disk; in
    /// every case the caller simply serves the bytes it has.
    pub async fn write_block(
        &self,
        id: &ObjectIdentity,
        index: u64,
        data: Bytes,
    ) -> Result<(), CacheError> {
        let key = id.entry_key();
        let result = self.write_inner(id, key, index, data).await;
        // Every `Arc` of the entry the write took is gone: it can go idle.
        self.settle(&key);
        match &result {
            Err(CacheError::Full) => {
                self.counters.full.fetch_add(1, Ordering::Relaxed);
            }
            Err(CacheError::Busy) => {
                self.counters.write_skipped.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => self.report(e),
            Ok(()) => {}
        }
        result
    }

    /// Opens (creating) the entry and becomes a writing user of it.
    pub(super) async fn begin_write(
        &self,
        id: &ObjectIdentity,
        key: EntryKey,
    ) -> Result<Arc<OpenEntry>, CacheError> {
        for _ in 0..4 {
            let Some(entry) = self.load(id, key, true).await? else {
                return Err(CacheError::Busy);
            };
            {
                let mut st = self.state.lock();
                match st.table.get_mut(&key) {
                    Some(e) if !e.flag(EVICTING) && e.writes < u16::MAX => e.writes += 1,
                    _ => return Err(CacheError::Busy),
                }
            }
            let used = entry.acquire_use();
            match used {
                Ok(Use::Acquired) => return Ok(entry),
                other => {
                    if let Some(e) = self.state.lock().table.get_mut(&key) {
                        e.writes = e.writes.saturating_sub(1);
                    }
                    match other {
                        Ok(Use::Dead) => self.forget_open(&entry),
                        Ok(_) => return Err(CacheError::Busy),
                        Err(e) => return Err(io_err("locking a cache entry", e)),
                    }
                }
            }
        }
        Err(CacheError::Busy)
    }

    pub(super) async fn write_inner(
        &self,
        id: &ObjectIdentity,
        key: EntryKey,
        index: u64,
        data: Bytes,
    ) -> Result<(), CacheError> {
        let len = self.block_len(id, index)?;
        if data.len() as u64 != len {
            return Err(CacheError::Invalid(format!(
                "block {index} has {} bytes, expected {len}",
                data.len()
            )));
        }
        self.step(WriteStep::Reserve)?;
        let entry = self.begin_write(id, key).await?;
        let mut guard = WriteUse {
            cache: self,
            entry: entry.clone(),
            index: index as u32,
            writing: false,
        };
        {
            let mut b = entry.blocks.lock();
            if b.crc(index).is_some() || b.writing.contains(&(index as u32)) {
                return Ok(());
            }
            b.writing.push(index as u32);
            guard.writing = true;
        }
        let reservation = self.reserve(key, entry::charge(len)).await?;

        self.step(WriteStep::Lock)?;
        let offset = index * self.block_size;
        let locked = sys::try_range_lock(&entry.data, offset, len, true)
            .map_err(|e| io_err("locking a cache block", e))?;
        if !locked {
            return Err(CacheError::Busy);
        }
        let _range = RangeLock {
            file: &entry.data,
            start: offset,
            len,
        };
        self.refresh(&entry).await?;
        if entry.blocks.lock().crc(index).is_some() {
            return Ok(()); // another process just wrote it; the reservation is released
        }

        let half_data = self.step(WriteStep::WriteData)?;
        let crc = crc32c::crc32c(&data);
        let (file, buf) = match &entry.direct {
            Some(d) if len % ALIGN as u64 == 0 && !half_data => {
                if crate::cache::ring::is_aligned(&data) {
                    (d, IoBuf::Bytes(data))
                } else {
                    (d, IoBuf::Aligned(AlignedBuf::copy_from(&data)))
                }
            }
            _ if half_data => (&entry.data, IoBuf::Bytes(data.slice(..data.len() / 2))),
            _ => (&entry.data, IoBuf::Bytes(data)),
        };

        // The record goes to the ring with the block, chained: the ring appends it only once
        // the block is written, with no round trip back here in between. A simulated crash
        // halfway through the block, or before the record, writes the block alone.
        let record_step = if half_data {
            Err(CacheError::SimulatedCrash(WriteStep::WriteData))
        } else {
            self.step(WriteStep::AppendRecord)
        };
        let half = match record_step {
            Ok(half) => half,
            Err(crash) => {
                self.ring
                    .write(file, offset, buf)
                    .await
                    .map_err(|e| io_err("writing a cached block", e))?;
                return Err(crash);
            }
        };
        let rec = format::encode_record(index as u32, RecordKind::Present(crc));
        let rec = if half { &rec[..7] } else { &rec[..] };
        self.ring
            .write_then(
                (file, offset, buf),
                (&entry.idx, 0, IoBuf::Bytes(Bytes::copy_from_slice(rec))),
            )
            .await
            .map_err(|e| io_err("writing a cached block and its journal record", e))?;
        if half {
            return Err(CacheError::SimulatedCrash(WriteStep::AppendRecord));
        }
        entry.skip_own_record(index as u32);

        self.step(WriteStep::Publish)?;
        {
            // Written here from bytes just fetched: known good to this process, as
            // passthrough trusts a file whose blocks this daemon wrote.
            let mut b = entry.blocks.lock();
            b.apply(index as u32, RecordKind::Present(crc));
            b.set_verified(index, crc);
        }
        {
            // The block table is read again under the state lock: two writers of one entry
            // publish in either order, and the one that publishes last must not replace the
            // other's newer count with its own older one (an entry whose blocks were all
            // written then stayed "incomplete": no passthrough, no `is_complete`).
            let mut st = self.state.lock();
            let st = &mut *st;
            if let Some(at) = st.table.find(&key) {
                if let Some(e) = st.table.at_mut(at) {
                    e.set(COMPLETE, entry.blocks.lock().is_complete());
                }
                st.policy.filled(at, &st.table);
            }
        }
        reservation.commit();
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        self.counters.write_bytes.fetch_add(len, Ordering::Relaxed);
        Ok(())
    }
}
