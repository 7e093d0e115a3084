//! Open-file budget of the daemon.
//!
//! The daemon holds a socket per GET in flight (and idle ones kept for reuse, at most as many
//! again), three descriptors per open cache entry (journal, data file, and its `O_DIRECT`
//! twin; up to [`DEFAULT_MAX_OPEN_OBJECTS`] entries stay open), and a few dozen others (the FUSE
//! device, the control socket and its clients, the io_uring, logs). The usual soft limit of
//! 1,024 descriptors is far below that: the cache then failed with `EMFILE` ("Too many open
//! files") and fell back to the store, and `riffle stats` could not even connect.
//!
//! So at start the daemon raises its soft limit to the hard limit (as Go programs and most
//! servers do), and if that still does not fit, shrinks what it can: first the open cache
//! entries (down to [`MIN_OPEN_ENTRIES`]; idle ones are closed and reopened on use, which
//! costs a little time), then the GET slots, with a warning that says which limit to raise.

use std::io;

use crate::cache::DEFAULT_MAX_OPEN_OBJECTS;

/// Open cache entries at least (readers pin the entries they read).
pub const MIN_OPEN_ENTRIES: usize = 16;
/// Descriptors per open cache entry.
const PER_ENTRY: usize = 3;
/// Descriptors per GET slot: the request's socket, and an idle one kept for reuse.
const PER_SLOT: usize = 2;
/// Everything else: FUSE, control socket clients, io_uring, eventfds, logs, metrics.
const RESERVED: usize = 128;

/// How many GET slots and open cache entries fit in `limit` descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub max_inflight: usize,
    pub open_entries: usize,
}

impl Budget {
    /// Fits `wanted_inflight` slots and up to [`DEFAULT_MAX_OPEN_OBJECTS`] entries (none without a
    /// disk cache) into `limit` descriptors, shrinking entries first, then slots.
    pub fn fit(limit: u64, wanted_inflight: usize, disk_cache: bool) -> Budget {
        let usable = (limit.min(usize::MAX as u64) as usize).saturating_sub(RESERVED);
        let min_entries = if disk_cache { MIN_OPEN_ENTRIES } else { 0 };
        let max_entries = if disk_cache {
            DEFAULT_MAX_OPEN_OBJECTS
        } else {
            0
        };
        let for_slots = usable.saturating_sub(min_entries * PER_ENTRY);
        let max_inflight = wanted_inflight.min(for_slots / PER_SLOT).max(1);
        let for_entries = usable.saturating_sub(max_inflight * PER_SLOT) / PER_ENTRY;
        Budget {
            max_inflight,
            open_entries: for_entries.clamp(min_entries, max_entries),
        }
    }
}

/// Raises the soft open-file limit to the hard one; returns the soft limit in force.
pub fn raise_to_hard_limit() -> io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for getrlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: `raised` is a valid rlimit; raising the soft limit up to the hard one is
        // always allowed.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return Ok(raised.rlim_cur);
        }
    }
    Ok(lim.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generous_limit_changes_nothing() {
        assert_eq!(
            Budget::fit(1 << 20, 256, true),
            Budget {
                max_inflight: 256,
                open_entries: DEFAULT_MAX_OPEN_OBJECTS
            }
        );
        assert_eq!(Budget::fit(u64::MAX, 4096, false).max_inflight, 4096);
    }

    #[test]
    fn the_usual_1024_shrinks_open_entries_first() {
        let b = Budget::fit(1024, 256, true);
        assert_eq!(b.max_inflight, 256);
        assert_eq!(b.open_entries, (1024 - RESERVED - 512) / PER_ENTRY);
        let used = RESERVED + b.max_inflight * PER_SLOT + b.open_entries * PER_ENTRY;
        assert!(used <= 1024, "{used} descriptors");
    }

    #[test]
    fn a_tight_limit_shrinks_the_get_slots_too() {
        let b = Budget::fit(512, 256, true);
        assert_eq!(b.open_entries, MIN_OPEN_ENTRIES);
        assert!(b.max_inflight < 256);
        let used = RESERVED + b.max_inflight * PER_SLOT + b.open_entries * PER_ENTRY;
        assert!(used <= 512, "{used} descriptors");
        // Without a disk cache the slots get it all; below the reserve one slot remains.
        assert_eq!(
            Budget::fit(512, 256, false).max_inflight,
            (512 - RESERVED) / 2
        );
        assert_eq!(Budget::fit(64, 256, true).max_inflight, 1);
    }
}
