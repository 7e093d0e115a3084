//! Inferring epoch boundaries for [`EpochPolicy`] (see "Inferring epoch boundaries" in the
//! `epoch` module documentation): the hash sample of the keys accessed in this epoch, the
//! repeats counted in it, and where a detected or forced boundary is placed.

use std::collections::hash_map::Entry as MapEntry;

use super::{
    EpochPolicy, CONTINUE_WINDOW, FORCE_FACTOR, HOT_ACCESSES, MIN_FORCE_KEYS, MIN_REPEATS,
    REPEAT_DIVISOR, SAMPLE_MAX,
};
use crate::cache::identity::EntryKey;

/// A sampled key's accesses; clocks relative to the epoch's start (see [`EpochPolicy::rel`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Sampled {
    /// Clock of the first access in this epoch.
    pub(super) first: u32,
    /// Clock of the last access.
    pub(super) last: u32,
    /// Clock of the second access in this epoch.
    pub(super) repeat_at: u32,
    pub(super) count: u8,
}

/// The key's first 8 bytes (uniform: keys are SHA-256 prefixes).
fn fingerprint(key: EntryKey) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&key.0[..8]);
    u64::from_le_bytes(b)
}

impl EpochPolicy {
    /// `clock` relative to the epoch's start, as the sample keeps it. Exact: the sample only
    /// holds clocks of this epoch, and an epoch lasts less than 2^32 accesses (`observe`).
    pub(super) fn rel(&self, clock: u64) -> u32 {
        clock.saturating_sub(self.epoch_start).min(u32::MAX as u64) as u32
    }

    /// The clock that [`Self::rel`] turned into `r`.
    pub(super) fn abs(&self, r: u32) -> u64 {
        self.epoch_start + r as u64
    }

    /// Feeds the boundary detector with an access of `key` (nothing while boundaries are
    /// announced).
    pub(super) fn observe(&mut self, key: EntryKey) {
        if self.announced {
            return;
        }
        if self.clock.saturating_sub(self.epoch_start) >= u32::MAX as u64 {
            // 2^32 accesses without a boundary: end the epoch here, so that the sample's
            // relative clocks stay exact.
            self.advance(self.clock);
            self.forcible = false;
        }
        let fp = fingerprint(key);
        if fp.leading_zeros() < self.shift {
            return;
        }
        let clock = self.rel(self.clock);
        let min_gap = CONTINUE_WINDOW.max(self.len as u64);
        match self.sample.entry(fp) {
            MapEntry::Occupied(mut o) => {
                let s = o.get_mut();
                let gap = clock.saturating_sub(s.last);
                s.last = clock;
                if (gap as u64) < min_gap {
                    // Too soon to be the next pass (see "Inferring epoch boundaries").
                    return;
                }
                s.count = s.count.saturating_add(1);
                if s.count == 2 {
                    s.repeat_at = clock;
                    self.repeats += 1;
                } else if s.count == HOT_ACCESSES {
                    self.repeats -= 1;
                }
            }
            MapEntry::Vacant(v) => {
                v.insert(Sampled {
                    first: clock,
                    last: clock,
                    repeat_at: 0,
                    count: 1,
                });
                if self.sample.len() > SAMPLE_MAX {
                    self.shift += 1;
                    let shift = self.shift;
                    self.sample.retain(|&fp, _| fp.leading_zeros() >= shift);
                    // Half the keys are left: give back the room they took.
                    self.sample.shrink_to_fit();
                    self.repeats = self.sample.values().filter(|s| s.count == 2).count();
                }
                let seen = self.sample.len() as f64 * self.scale();
                let expected = self.prev_len.max(self.len as f64);
                if self.forcible
                    && self.prev_len >= MIN_FORCE_KEYS as f64
                    && seen > FORCE_FACTOR * expected
                {
                    self.moved_on();
                    return;
                }
            }
        }
        if self.repeats >= MIN_REPEATS.max(self.sample.len() / REPEAT_DIVISOR) {
            self.boundary_detected();
        }
    }

    /// Objects a sampled key stands for.
    pub(super) fn scale(&self) -> f64 {
        2f64.powi(self.shift as i32)
    }

    /// The epoch has seen [`FORCE_FACTOR`] times as many distinct objects as the previous one
    /// without repeating: the reader moved on to other data. The epoch ended when it had seen
    /// as many as the previous one.
    pub(super) fn moved_on(&mut self) {
        let mut firsts: Vec<u64> = self.sample.values().map(|s| self.abs(s.first)).collect();
        let k = ((self.prev_len / self.scale()).round() as usize).min(firsts.len() - 1);
        let (_, at, _) = firsts.select_nth_unstable(k);
        let boundary = (*at).max(self.epoch_start).min(self.clock);
        self.advance(boundary);
        self.forcible = false;
    }

    /// Places the boundary behind the repeats (see the module documentation) and advances.
    pub(super) fn boundary_detected(&mut self) {
        let mut at: Vec<u64> = self
            .sample
            .values()
            .filter(|s| s.count == 2)
            .map(|s| self.abs(s.repeat_at))
            .collect();
        let boundary = if at.is_empty() {
            self.clock
        } else {
            // The first repeat, ignoring stray early ones: those more than twice the span of
            // the later half of the repeats before the median.
            let mid = (at.len() - 1) / 2;
            let (_, median, _) = at.select_nth_unstable(mid);
            let median = *median;
            let cutoff = median.saturating_sub(2 * self.clock.saturating_sub(median));
            at.iter()
                .copied()
                .filter(|&t| t >= cutoff)
                .min()
                .unwrap_or(median)
                .max(self.epoch_start)
                .min(self.clock)
        };
        self.advance(boundary);
        self.forcible = true;
    }
}
