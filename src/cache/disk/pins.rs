//! Pins: an open file keeps its entry from being evicted, here and (through a shared lock on
//! the journal that all pins share) in every other process using the directory.

use std::sync::{Arc, Weak};

use super::table::{known_entry, PIN_HELD};
use super::DiskCache;
use crate::cache::entry::{OpenEntry, Use};
use crate::cache::identity::{EntryKey, ObjectIdentity};

/// Keeps an object's entry from being evicted, here and (once its files are open) in every
/// process sharing the directory. Dropping it unpins.
#[derive(Debug)]
pub struct PinGuard {
    cache: Weak<DiskCache>,
    key: EntryKey,
}

impl PinGuard {
    /// Tells the eviction policy of a use of the pinned entry now. An open pins before it
    /// tells the prefetcher (so the entry cannot be evicted in between, when the prefetcher
    /// no longer counts it as needed) and calls this after, so the policy asks its oracle
    /// again and sees the file opened.
    pub fn used(&self) {
        if let Some(cache) = self.cache.upgrade() {
            let mut guard = cache.state.lock();
            let st = &mut *guard;
            if let Some(at) = st.table.find(&self.key) {
                st.policy.touch(at, &st.table);
            }
        }
    }
}

impl Drop for PinGuard {
    fn drop(&mut self) {
        if let Some(cache) = self.cache.upgrade() {
            cache.unpin(self.key);
        }
    }
}

impl DiskCache {
    /// Pins the entry of `id` (creating the in-memory record if it has none yet) until the
    /// guard is dropped: never evicted by this process, nor, while its files are open here, by
    /// any other (see the locking protocol).
    pub fn pin(self: &Arc<Self>, id: &ObjectIdentity) -> PinGuard {
        self.pin_with(id, true)
    }

    /// A pin that is not yet a use of the entry (the policy is not told; see
    /// [`PinGuard::used`]).
    pub(crate) fn pin_unused(self: &Arc<Self>, id: &ObjectIdentity) -> PinGuard {
        self.pin_with(id, false)
    }

    /// A pin for the blocks of `id` a GET just brought, held until they are written: keeps
    /// the entry's record (and with it the eviction policy's memory of the read that fetched
    /// them) from being dropped when the reader's own pin ends before the disk catches up.
    /// Unlike [`Self::pin`] it is not a use of the entry: the policy is not told.
    pub fn pin_for_fill(self: &Arc<Self>, id: &ObjectIdentity) -> PinGuard {
        self.pin_with(id, false)
    }

    pub(super) fn pin_with(self: &Arc<Self>, id: &ObjectIdentity, is_use: bool) -> PinGuard {
        let key = id.entry_key();
        let unheld = {
            let mut guard = self.state.lock();
            let st = &mut *guard;
            let mut unheld = None;
            if let Some(at) = known_entry(&mut st.table, &mut st.policy, key) {
                if let Some(e) = st.table.at_mut(at) {
                    e.pins = e.pins.saturating_add(1);
                    if !e.flag(PIN_HELD) && !e.files.is_dead() {
                        unheld = e.files.activate(key, id.size, self.block_size);
                    }
                }
                if is_use {
                    st.policy.touch(at, &st.table);
                }
            }
            unheld
        };
        if let Some(open) = unheld {
            self.hold_for_pins(open);
        }
        PinGuard {
            cache: Arc::downgrade(self),
            key,
        }
    }

    /// Takes the use of `open` that an entry's pins share, unless another task took one first
    /// or the pins are gone. The use may lock the entry's journal (a system call), so it is
    /// taken with the state lock released, and the lock is taken again only to record it.
    pub(super) fn hold_for_pins(&self, open: Arc<OpenEntry>) {
        let key = open.key;
        if open.acquire_use().ok() != Some(Use::Acquired) {
            drop(open);
            self.settle(&key);
            return;
        }
        let spare = {
            let mut st = self.state.lock();
            match st.table.get_mut(&key) {
                Some(e)
                    if e.pins > 0
                        && !e.flag(PIN_HELD)
                        && e.files.active().is_some_and(|o| Arc::ptr_eq(o, &open)) =>
                {
                    e.set(PIN_HELD, true);
                    None
                }
                _ => Some(open),
            }
        };
        if let Some(open) = spare {
            open.release_use();
            drop(open);
            self.settle(&key);
        }
    }

    pub(super) fn unpin(&self, key: EntryKey) {
        let mut released = None;
        {
            let mut guard = self.state.lock();
            let st = &mut *guard;
            let Some(at) = st.table.find(&key) else {
                return;
            };
            let mut forget = false;
            if let Some(e) = st.table.at_mut(at) {
                e.pins = e.pins.saturating_sub(1);
                if e.pins == 0 {
                    if e.flag(PIN_HELD) {
                        released = e.files.active().cloned();
                        e.set(PIN_HELD, false);
                    } else {
                        e.settle();
                    }
                    forget = e.bytes == 0 && !e.files.is_open() && e.writes == 0;
                }
            }
            if forget {
                st.table.take(at);
                st.policy.remove(at);
            }
        }
        // Outside the state lock: the last use unlocks the journal (a system call); then the
        // entry can go idle.
        if let Some(o) = released {
            o.release_use();
            drop(o);
            self.settle(&key);
        }
    }
}
