//! The known entries: 64-byte [`Record`]s in numbered slots of a [`Table`], found by key
//! through a [`KeyIndex`], with the flags that say what state an entry is in (see "Memory" in
//! the `cache` module documentation).

use crate::cache::entry::{self, Files};
use crate::cache::evict::{EntryInfo, EvictionPolicy, Slot, SlotKeys};
use crate::cache::identity::EntryKey;
use crate::cache::slab::{Chunked, KeyIndex};

/// One known entry: 64 bytes, in a slot of the [`Table`] (see "Memory" in the `cache` module
/// documentation).
#[derive(Debug, Default)]
pub(super) struct Record {
    pub(super) key: EntryKey,
    /// Bytes charged to it (including reservations of writes in progress).
    pub(super) bytes: u64,
    /// Its files: closed, open and idle, or open and in use.
    pub(super) files: Files,
    pub(super) pins: u32,
    /// Writes in progress.
    pub(super) writes: u16,
    pub(super) flags: u8,
}

/// The slot holds a known entry.
pub(super) const LIVE: u8 = 1;
/// Every block is present.
pub(super) const COMPLETE: u8 = 2;
/// Chosen as a victim; its files are being removed.
pub(super) const EVICTING: u8 = 4;
/// The open entry in `files` holds one use on behalf of all pins (a shared lock on its
/// journal: no other process evicts it).
pub(super) const PIN_HELD: u8 = 8;
/// Every block is known good to this process: it wrote them from bytes it had just fetched,
/// or read them all back and their CRCs matched (the condition for FUSE passthrough,
/// `fetch::disk`). Only ever set with [`COMPLETE`], and cleared with it.
pub(super) const KNOWN_GOOD: u8 = 16;

impl Record {
    pub(super) fn flag(&self, f: u8) -> bool {
        self.flags & f != 0
    }

    pub(super) fn set(&mut self, f: u8, on: bool) {
        if on {
            self.flags |= f;
        } else {
            // An entry that is no longer complete is no longer known good either.
            let also = if f & COMPLETE != 0 { KNOWN_GOOD } else { 0 };
            self.flags &= !(f | also);
        }
    }

    pub(super) fn complete(&self) -> bool {
        self.flag(COMPLETE)
    }

    /// Keeps the open entry as idle files if nothing uses it (see `entry`, "Idle form").
    pub(super) fn settle(&mut self) {
        if self.pins == 0 && self.writes == 0 && !self.flag(PIN_HELD) {
            self.files.settle();
        }
    }
}

/// Slots available: the policies use the two highest `u32` values as list markers.
pub(super) const MAX_SLOTS: Slot = u32::MAX - 2;

/// The known entries: records in numbered slots (a slot is reused once its entry is gone), and
/// an index from key to slot. The eviction policies name entries by slot.
#[derive(Debug, Default)]
pub(super) struct Table {
    pub(super) records: Chunked<Record>,
    pub(super) index: KeyIndex,
    pub(super) free: Vec<Slot>,
    /// Slots ever used: the next new one.
    pub(super) high: Slot,
}

pub(super) fn key_in(records: &Chunked<Record>, at: Slot) -> EntryKey {
    records.get(at).map_or_else(EntryKey::default, |r| r.key)
}

impl SlotKeys for Table {
    fn key_of(&self, at: Slot) -> EntryKey {
        key_in(&self.records, at)
    }
}

impl Table {
    pub(super) fn len(&self) -> usize {
        self.index.len()
    }

    pub(super) fn find(&self, key: &EntryKey) -> Option<Slot> {
        let records = &self.records;
        self.index.get(key, |at| key_in(records, at))
    }

    pub(super) fn at(&self, at: Slot) -> Option<&Record> {
        self.records.get(at).filter(|r| r.flag(LIVE))
    }

    pub(super) fn at_mut(&mut self, at: Slot) -> Option<&mut Record> {
        self.records.get_mut(at).filter(|r| r.flag(LIVE))
    }

    pub(super) fn get(&self, key: &EntryKey) -> Option<&Record> {
        self.at(self.find(key)?)
    }

    pub(super) fn get_mut(&mut self, key: &EntryKey) -> Option<&mut Record> {
        let at = self.find(key)?;
        self.at_mut(at)
    }

    /// A new record for `key` (not known yet); `None` when every slot is taken.
    pub(super) fn add(&mut self, key: EntryKey) -> Option<Slot> {
        let at = match self.free.pop() {
            Some(at) => at,
            None if self.high < MAX_SLOTS => {
                self.high += 1;
                self.high - 1
            }
            None => return None,
        };
        *self.records.grow_to(at) = Record {
            key,
            flags: LIVE,
            ..Record::default()
        };
        let records = &self.records;
        self.index.insert(&key, at, |s| key_in(records, s));
        Some(at)
    }

    /// Removes the record in slot `at` and gives it back (its files are the caller's to close,
    /// outside the state lock).
    pub(super) fn take(&mut self, at: Slot) -> Option<Record> {
        let key = self.at(at)?.key;
        let records = &self.records;
        self.index.remove(&key, |s| key_in(records, s));
        let record = std::mem::take(self.records.get_mut(at)?);
        self.free.push(at);
        Some(record)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Record> {
        (0..self.high).filter_map(|at| self.at(at))
    }

    /// Heap bytes of the records, the index and the free list (not of open entries).
    pub(super) fn heap_bytes(&self) -> usize {
        self.records.heap_bytes() + self.index.heap_bytes() + self.free.capacity() * 4
    }
}

/// The slot of `key`, with a new record (made known to the eviction policy) if there is none;
/// `None` only when every slot is taken. Takes the two fields rather than the whole state so
/// callers keep using the others.
pub(super) fn known_entry(
    table: &mut Table,
    policy: &mut Box<dyn EvictionPolicy>,
    key: EntryKey,
) -> Option<Slot> {
    if let Some(at) = table.find(&key) {
        return Some(at);
    }
    let at = table.add(key)?;
    policy.insert(
        at,
        &EntryInfo {
            key,
            bytes: 0,
            last_used: None,
        },
        table,
    );
    Some(at)
}

/// What a closed entry of one present block keeps for reading it by name (see
/// `entry::OneBlock`), when `key` is one.
pub(super) fn closed_one_block(table: &Table, key: EntryKey) -> Option<entry::OneBlock> {
    let e = table.get(&key)?;
    e.complete().then(|| e.files.closed_one_block()).flatten()
}
