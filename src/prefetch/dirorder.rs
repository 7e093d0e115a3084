//! Detecting a reader that walks a directory in listing order, without a plan.
//!
//! Unchanged training code often reads a directory's files in `ls` order (a sorted file list,
//! `ImageFolder` without shuffling, shards `000..N` one after another). For each directory,
//! [`DirOrder`] watches where in the listing the opened files stand. An open a short distance
//! *ahead* of the furthest one so far is a step in order; an open a short distance *behind* it
//! is a neighbour that another worker opened a little late, and neither confirms nor breaks the
//! run; anything else starts a new run at that file. After three steps in order (four opens)
//! the detector asks for the next files of the listing to be fetched, a window that starts at
//! 8 files and doubles with every further step up to `max_window`, each file asked for once.
//!
//! The distance ("tolerance", absorbing workers that open neighbouring files out of order) is
//! at most an eighth of the directory: in a small directory read in a shuffled order, a wide
//! tolerance would make almost every open look "near" the furthest one, and the prefetches it
//! set off would be wasted — worse, with a cache smaller than the dataset they would evict
//! files the reader still needs. With the cap, a shuffled read of 20-file directories sets off
//! a prefetch in about one directory in fifty (see the tests).

use std::ops::Range;

/// The per-directory detector (pure logic).
#[derive(Debug, Clone)]
pub struct DirOrder {
    furthest: Option<usize>,
    steps: u32,
    window: usize,
    requested_to: usize,
    max_window: usize,
    tolerance: usize,
}

/// Steps in order needed before prefetching starts.
const CONFIRM: u32 = 3;
const START_WINDOW: usize = 8;

impl DirOrder {
    pub fn new(max_window: usize, tolerance: usize) -> Self {
        DirOrder {
            furthest: None,
            steps: 0,
            window: 0,
            requested_to: 0,
            max_window: max_window.max(1),
            tolerance: tolerance.max(1),
        }
    }

    /// The reader opened listing entry `index` of `len`; returns entries to fetch ahead.
    pub fn opened(&mut self, index: usize, len: usize) -> Range<usize> {
        let tolerance = self.tolerance.min(len / 8).max(1);
        match self.furthest {
            Some(f) if index > f && index <= f + tolerance => {
                self.steps += 1;
                self.furthest = Some(index);
            }
            Some(f) if index <= f && index + tolerance > f => return 0..0,
            _ => {
                self.steps = 0;
                self.window = 0;
                self.furthest = Some(index);
                self.requested_to = index + 1;
                return 0..0;
            }
        }
        if self.steps < CONFIRM {
            return 0..0;
        }
        self.window = if self.window == 0 {
            START_WINDOW.min(self.max_window)
        } else {
            (self.window * 2).min(self.max_window)
        };
        let start = self.requested_to.max(index + 1);
        let end = (index + 1 + self.window).min(len);
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
        assert!(d.opened(2, 1000).is_empty());
        assert_eq!(d.opened(3, 1000), 4..12);
        assert_eq!(d.opened(4, 1000), 12..21);
        assert_eq!(d.opened(5, 1000), 21..38);
        for i in 6..20 {
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
        d.opened(0, 6);
        d.opened(1, 6);
        d.opened(2, 6);
        assert_eq!(d.opened(3, 6), 4..6);
        assert!(d.opened(4, 6).is_empty());
    }

    #[test]
    fn a_run_can_start_anywhere_and_late_neighbours_do_not_break_it() {
        let mut d = DirOrder::new(64, 4);
        let fetched: usize = [40usize, 41, 43, 42, 44]
            .into_iter()
            .map(|i| d.opened(i, 200).len())
            .sum();
        assert_eq!(
            fetched, 8,
            "steps 41, 43, 44 (42 came late) confirm the run"
        );
    }

    /// W5-like: 300 directories of 20 files, each read in a shuffled order. The cap on the
    /// tolerance keeps the prefetches this sets off rare (seeded, so deterministic).
    #[test]
    fn shuffled_small_directories_rarely_prefetch() {
        use crate::cache::simulate::SplitMix64;
        let mut rng = SplitMix64::new(5);
        let (dirs, files) = (300, 20);
        let mut fetched = 0;
        for _ in 0..dirs {
            let mut d = DirOrder::new(64, 12);
            let mut order: Vec<usize> = (0..files).collect();
            rng.shuffle(&mut order);
            fetched += order
                .iter()
                .map(|&i| d.opened(i, files).len())
                .sum::<usize>();
        }
        assert!(
            fetched * 50 < dirs * files,
            "{fetched} of {} files prefetched",
            dirs * files
        );
        // The same directories read in listing order are all detected.
        let mut fetched = 0;
        for _ in 0..dirs {
            let mut d = DirOrder::new(64, 12);
            fetched += (0..files).map(|i| d.opened(i, files).len()).sum::<usize>();
        }
        assert_eq!(fetched, dirs * (files - 4));
    }
}
