//! Detecting a reader that walks a directory in listing order, without a plan.
//!
//! Unchanged training code often reads a directory's files in `ls` order (a sorted file list,
//! `ImageFolder` without shuffling, shards `000..N` one after another). For each directory,
//! [`DirOrder`] watches where in the listing the opened files stand. An open within a short
//! distance ahead of the furthest one so far (the tolerance absorbs several workers opening
//! neighbouring files out of order) counts as in order; anything else starts over. After
//! three in-order opens the detector asks for the next files of the listing to be fetched, a
//! window that starts at 8 files and doubles with every further in-order open up to
//! `max_window`, each file asked for once.

use std::ops::Range;

/// The per-directory detector (pure logic).
#[derive(Debug, Clone)]
pub struct DirOrder {
    furthest: Option<usize>,
    in_order: u32,
    window: usize,
    requested_to: usize,
    max_window: usize,
    tolerance: usize,
}

/// In-order opens needed before prefetching starts.
const CONFIRM: u32 = 3;
const START_WINDOW: usize = 8;

impl DirOrder {
    pub fn new(max_window: usize, tolerance: usize) -> Self {
        DirOrder {
            furthest: None,
            in_order: 0,
            window: 0,
            requested_to: 0,
            max_window: max_window.max(1),
            tolerance: tolerance.max(1),
        }
    }

    /// The reader opened listing entry `index` of `len`; returns entries to fetch ahead.
    pub fn opened(&mut self, index: usize, len: usize) -> Range<usize> {
        let in_order = match self.furthest {
            None => index == 0,
            Some(f) => index + self.tolerance > f && index <= f + self.tolerance,
        };
        if in_order {
            self.in_order += 1;
            self.furthest = Some(self.furthest.map_or(index, |f| f.max(index)));
        } else {
            self.in_order = 1;
            self.window = 0;
            self.furthest = Some(index);
            self.requested_to = index + 1;
            return 0..0;
        }
        if self.in_order < CONFIRM {
            return 0..0;
        }
        self.window = if self.window == 0 {
            START_WINDOW.min(self.max_window)
        } else {
            (self.window * 2).min(self.max_window)
        };
        let furthest = self.furthest.unwrap_or(index);
        let start = self.requested_to.max(furthest + 1);
        let end = (furthest + 1 + self.window).min(len);
        if end <= start {
            return 0..0;
        }
        self.requested_to = end;
        start..end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_reads_open_a_growing_window() {
        let mut d = DirOrder::new(64, 4);
        assert!(d.opened(0, 1000).is_empty());
        assert!(d.opened(1, 1000).is_empty());
        assert_eq!(d.opened(2, 1000), 3..11);
        assert_eq!(d.opened(3, 1000), 11..20);
        assert_eq!(d.opened(4, 1000), 20..37);
        for i in 5..20 {
            d.opened(i, 1000);
        }
        let r = d.opened(20, 1000);
        assert!(r.end - 21 <= 64);
    }

    #[test]
    fn interleaved_workers_still_count_as_in_order() {
        let mut d = DirOrder::new(64, 4);
        let mut fetched = 0;
        for i in [0usize, 2, 1, 3, 5, 4, 6, 8, 7] {
            fetched += d.opened(i, 100).len();
        }
        assert!(fetched > 0);
    }

    #[test]
    fn random_opens_never_prefetch() {
        let mut d = DirOrder::new(64, 4);
        for i in [50usize, 3, 90, 17, 64, 2, 77, 31, 8, 99] {
            assert!(d.opened(i, 100).is_empty());
        }
    }

    #[test]
    fn the_window_stops_at_the_end_of_the_listing() {
        let mut d = DirOrder::new(64, 4);
        d.opened(0, 5);
        d.opened(1, 5);
        assert_eq!(d.opened(2, 5), 3..5);
        assert!(d.opened(3, 5).is_empty());
    }
}
