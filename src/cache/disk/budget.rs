//! The byte budget: reservations of a write's bytes against the limit and the free-space
//! floor, and the eviction of whole entries, in the eviction policy's order, to make room.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::Ordering;

use super::table::{known_entry, EVICTING, LIVE};
use super::{io_err, DiskCache};
use crate::cache::entry::{self, Evicted};
use crate::cache::identity::EntryKey;
use crate::cache::{sys, CacheError};

/// Eviction rounds in a row that may find only entries in use elsewhere before a write is
/// refused as [`CacheError::Full`].
pub(super) const MAX_STALLS: u32 = 8;

/// Takes `bytes` off the reservation of `key`.
pub(super) fn unreserve(reserved: &mut HashMap<EntryKey, u64>, key: EntryKey, bytes: u64) {
    if let Some(r) = reserved.get_mut(&key) {
        *r = r.saturating_sub(bytes);
        if *r == 0 {
            reserved.remove(&key);
        }
    }
}

/// Releases a reservation unless committed.
pub(super) struct Reservation<'a> {
    cache: &'a DiskCache,
    key: EntryKey,
    bytes: u64,
    done: bool,
}

impl Reservation<'_> {
    pub(super) fn commit(mut self) {
        let mut st = self.cache.state.lock();
        st.pending = st.pending.saturating_sub(self.bytes);
        unreserve(&mut st.reserved, self.key, self.bytes);
        self.done = true;
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut st = self.cache.state.lock();
        st.pending = st.pending.saturating_sub(self.bytes);
        st.used = st.used.saturating_sub(self.bytes);
        if let Some(e) = st.table.get_mut(&self.key) {
            e.bytes = e.bytes.saturating_sub(self.bytes);
        }
        unreserve(&mut st.reserved, self.key, self.bytes);
    }
}

/// Victims of an eviction that has not finished; dropping it gives them back.
struct Unfinished<'a> {
    cache: &'a DiskCache,
    victims: &'a [(EntryKey, u64)],
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if self.victims.is_empty() {
            return;
        }
        let mut st = self.cache.state.lock();
        for (key, counted) in self.victims {
            st.evicting -= 1;
            st.evicting_bytes = st.evicting_bytes.saturating_sub(*counted);
            if let Some(e) = st.table.get_mut(key) {
                e.set(EVICTING, false);
            }
        }
        drop(st);
        self.cache.evicted.notify_waiters();
    }
}

impl DiskCache {
    /// Reserves `need` bytes for entry `key`, evicting others if needed (see the module
    /// documentation).
    pub(super) async fn reserve(
        &self,
        key: EntryKey,
        need: u64,
    ) -> Result<Reservation<'_>, CacheError> {
        if need > self.limit {
            return Err(CacheError::Full);
        }
        // Rounds whose victims were all in use by other processes (bounded: they are moved to
        // the hot end, so a later round would pick them again).
        let mut stalls = 0;
        loop {
            let space =
                sys::fs_space(&self.root).map_err(|e| io_err("statvfs of the cache dir", e))?;
            let notified = self.evicted.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let victims = {
                let mut guard = self.state.lock();
                let st = &mut *guard;
                let over_budget = (st.used + need).saturating_sub(self.limit);
                let floor = self.min_free;
                let avail = space.avail.saturating_sub(st.pending);
                let over_floor = (floor + need).saturating_sub(avail);
                let deficit = over_budget.max(over_floor);
                if deficit == 0 {
                    // The writer made the entry known; should it be gone, the bytes are
                    // charged to a new record all the same (and released with it).
                    let Some(at) = known_entry(&mut st.table, &mut st.policy, key) else {
                        return Err(CacheError::Full);
                    };
                    if let Some(e) = st.table.at_mut(at) {
                        e.bytes += need;
                    }
                    st.used += need;
                    st.pending += need;
                    *st.reserved.entry(key).or_default() += need;
                    return Ok(Reservation {
                        cache: self,
                        key,
                        bytes: need,
                        done: false,
                    });
                }
                // Bytes that evictions in progress (other reservations') will release count
                // as freed: choosing victims for them again evicted one entry per concurrent
                // writer instead of one in all, and once the entries nothing needs were all
                // being evicted, the next ones were those the prefetcher still needs (a file
                // fetched ahead was evicted before it was opened, and fetched again).
                let short = deficit.saturating_sub(st.evicting_bytes);
                let mut victims = Vec::new();
                let mut freed = 0;
                let own = st.table.find(&key);
                while freed < short {
                    let table = &st.table;
                    let Some(v) = st.policy.victim(table, &mut |s| {
                        Some(s) != own
                            && table.at(s).is_some_and(|e| {
                                e.pins == 0 && e.writes == 0 && !e.flag(EVICTING) && e.bytes > 0
                            })
                    }) else {
                        break;
                    };
                    let Some(e) = st.table.at_mut(v) else {
                        break; // a policy naming a slot it was not given: stop here
                    };
                    e.set(EVICTING, true);
                    freed += e.bytes;
                    victims.push((e.key, e.bytes));
                }
                if victims.is_empty() && st.evicting == 0 {
                    tracing::debug!(
                        need,
                        used = st.used,
                        limit = self.limit,
                        avail,
                        "cache full: nothing can be evicted"
                    );
                    if over_floor > 0 {
                        self.counters.free_floor.fetch_add(1, Ordering::Relaxed);
                        if !self.floor_warned.swap(true, Ordering::Relaxed) {
                            tracing::warn!(
                                dir = %self.root.display(),
                                free = avail,
                                keep_free = floor,
                                "the cache's filesystem is down to the free space it must keep (--cache-min-free): blocks are served but not cached (counted in cache.free_floor_refusals)"
                            );
                        }
                    }
                    return Err(CacheError::Full);
                }
                st.evicting += victims.len();
                st.evicting_bytes += freed;
                victims
            };
            if victims.is_empty() {
                // Others are evicting: wait for them, then look again.
                notified.await;
                continue;
            }
            if self.evict(victims).await == 0 {
                stalls += 1;
                if stalls >= MAX_STALLS {
                    return Err(CacheError::Full);
                }
            }
        }
    }

    /// Removes the victims' files and releases their bytes; returns how many went. Each
    /// victim comes with the bytes it was counted for in `evicting_bytes`.
    pub(super) async fn evict(&self, victims: Vec<(EntryKey, u64)>) -> usize {
        let root = self.root.clone();
        let keys: Vec<EntryKey> = victims.iter().map(|&(k, _)| k).collect();
        // Should this future be dropped before the files are gone, the victims are given
        // back, or the reservations waiting for their bytes would wait for ever.
        let mut unfinished = Unfinished {
            cache: self,
            victims: &victims,
        };
        let outcomes = self
            .blocking(move || {
                keys.iter()
                    .map(|&k| entry::evict_files(&root, k))
                    .collect::<Vec<_>>()
            })
            .await
            .unwrap_or_else(|e| {
                victims
                    .iter()
                    .map(|_| Err(io::Error::other(e.to_string())))
                    .collect()
            });
        unfinished.victims = &[];
        drop(unfinished);
        let mut failures = Vec::new();
        let mut removed = 0;
        let mut gone = Vec::new();
        // The removed entries' files are closed after the state lock is released.
        let mut dropped = Vec::new();
        {
            let mut guard = self.state.lock();
            let st = &mut *guard;
            for ((key, counted), outcome) in victims.into_iter().zip(outcomes) {
                st.evicting -= 1;
                st.evicting_bytes = st.evicting_bytes.saturating_sub(counted);
                let at = st.table.find(&key);
                match outcome {
                    Ok(Evicted::Removed) | Ok(Evicted::Gone) => {
                        removed += 1;
                        gone.push(key);
                        let Some(at) = at else { continue };
                        let Some(e) = st.table.at_mut(at) else {
                            continue;
                        };
                        st.used = st.used.saturating_sub(e.bytes);
                        let files = std::mem::take(&mut e.files);
                        if files.is_open() {
                            if let Some(o) = files.active() {
                                o.mark_dead();
                            }
                            st.open_count -= 1;
                            st.open_lru.take(at);
                        }
                        if outcome.as_ref().ok() == Some(&Evicted::Removed) {
                            self.counters.evictions.fetch_add(1, Ordering::Relaxed);
                            self.counters
                                .evicted_bytes
                                .fetch_add(e.bytes, Ordering::Relaxed);
                        }
                        if e.pins > 0 {
                            // Pinned while it was being evicted: keep the record (and the
                            // policy's memory of it) for the entry's next life.
                            e.bytes = 0;
                            e.flags = LIVE;
                        } else {
                            st.table.take(at);
                            st.policy.remove(at);
                        }
                        dropped.push(files);
                    }
                    Ok(Evicted::InUse) => {
                        self.counters.evict_in_use.fetch_add(1, Ordering::Relaxed);
                        if let Some(at) = at {
                            if let Some(e) = st.table.at_mut(at) {
                                e.set(EVICTING, false);
                            }
                            st.policy.touch(at, &st.table);
                        }
                    }
                    Err(err) => {
                        if let Some(at) = at {
                            if let Some(e) = st.table.at_mut(at) {
                                e.set(EVICTING, false);
                            }
                            st.policy.touch(at, &st.table);
                        }
                        failures.push(err);
                    }
                }
            }
        }
        drop(dropped);
        for err in failures {
            self.report(&io_err("evicting a cache entry", err));
        }
        if !gone.is_empty() {
            if let Some(listener) = &*self.evicted_listener.lock() {
                listener(&gone);
            }
        }
        self.evicted.notify_waiters();
        removed
    }

    /// Calls `listener` with the keys of the entries this process evicts, after their files
    /// are removed (for whoever still holds one of those files open and should let go).
    pub(crate) fn on_evicted(&self, listener: impl Fn(&[EntryKey]) + Send + Sync + 'static) {
        *self.evicted_listener.lock() = Some(Box::new(listener));
    }
}
