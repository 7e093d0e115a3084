//! Epoch plans: the order in which files will be read, and where the reader is in it.
//!
//! A plan is a text file of paths relative to the mount root, one per line, in the order the
//! trainer will open them (blank lines and `#` comments are ignored). [`PlanTracker`] keeps
//! one state per item and the reader's position: items are marked opened as the reader opens
//! them, and the position is the first item not yet opened. Readers that skip items (several
//! data-loader workers that open items slightly out of order, or a reader that jumps ahead of
//! the plan) are handled with a lag bound: the position never trails the furthest item opened
//! by more than `lag` items, so skipped items stop holding the window back.
//!
//! [`PlanTracker::next_to_fetch`] hands out the items to prefetch next: in plan order, from the
//! position onwards, at most `concurrency` at a time, and only while the bytes prefetched but
//! not yet opened stay within the byte budget — so prefetch never runs further ahead than the
//! cache can hold.

use std::collections::HashMap;
use std::sync::Arc;

/// A parsed plan.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    items: Vec<Arc<str>>,
    /// The first position of each path.
    index: HashMap<Arc<str>, usize>,
    /// For a path listed more than once: each position → its next position (empty when every
    /// path is listed once, the usual case).
    next_same: HashMap<usize, usize>,
}

impl Plan {
    /// Parses a plan; fails on paths that cannot be in the mount (`..` components).
    pub fn parse(text: &str) -> Result<Plan, String> {
        let mut plan = Plan::default();
        // The latest position of each path listed more than once, while parsing.
        let mut last: HashMap<Arc<str>, usize> = HashMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let path = line.trim_start_matches("./").trim_start_matches('/');
            if path.split('/').any(|c| c == "..") {
                return Err(format!("line {}: '{line}' leaves the mount", n + 1));
            }
            let path: Arc<str> = Arc::from(path);
            let here = plan.items.len();
            match plan.index.get(&path) {
                None => {
                    plan.index.insert(path.clone(), here);
                }
                Some(&first) => {
                    let previous = last.insert(path.clone(), here).unwrap_or(first);
                    plan.next_same.insert(previous, here);
                }
            }
            plan.items.push(path);
        }
        Ok(plan)
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn path(&self, i: usize) -> &Arc<str> {
        &self.items[i]
    }

    /// The first position of `path` in the plan.
    pub fn position(&self, path: &str) -> Option<usize> {
        self.index.get(path).copied()
    }

    /// The next position after `i` of the same path, if it is listed again.
    pub fn next_position(&self, i: usize) -> Option<usize> {
        self.next_same.get(&i).copied()
    }
}

/// What is known about one plan item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemState {
    Waiting,
    Fetching,
    /// Fetched: this many bytes are held for the reader.
    Ready(u64),
    Opened,
    /// Not in the store (or not a file): skipped.
    Missing,
    /// Fetching failed; the reader will fetch it on demand.
    Failed,
}

/// See the module documentation.
#[derive(Debug)]
pub struct PlanTracker {
    plan: Plan,
    state: Vec<ItemState>,
    position: usize,
    furthest_opened: Option<usize>,
    lag: usize,
    fetching: usize,
    ready_bytes: u64,
}

/// Limits for [`PlanTracker::next_to_fetch`].
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// Items being fetched at once at most.
    pub concurrency: usize,
    /// Bytes fetched ahead and not yet opened at most.
    pub bytes: u64,
    /// Items ahead of the position at most.
    pub items: usize,
}

impl PlanTracker {
    pub fn new(plan: Plan, lag: usize) -> Self {
        let n = plan.len();
        PlanTracker {
            plan,
            state: vec![ItemState::Waiting; n],
            position: 0,
            furthest_opened: None,
            lag: lag.max(1),
            fetching: 0,
            ready_bytes: 0,
        }
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    pub fn position(&self) -> usize {
        self.position
    }

    pub fn state(&self, i: usize) -> ItemState {
        self.state[i]
    }

    /// Bytes fetched ahead and not opened yet.
    pub fn ready_bytes(&self) -> u64 {
        self.ready_bytes
    }

    pub fn fetching(&self) -> usize {
        self.fetching
    }

    /// The reader opened `path`; returns its plan index and whether it was already fetched.
    /// `None` when the path is not in the plan, or when every occurrence of it has been opened
    /// already: a reopen, or a later epoch reading after the plan is spent, is not a plan
    /// item (so directory-order detection sees it).
    pub fn opened(&mut self, path: &str) -> Option<(usize, bool)> {
        let first = self.plan.position(path)?;
        // A path listed twice: the first occurrence not opened yet at or after the position.
        // Only the path's own occurrences are visited, so an open costs O(1) for a path listed
        // once, also once the plan is spent (a later epoch reading without a new plan).
        let mut i = first;
        let mut first_unopened = None;
        let i = loop {
            if self.state[i] != ItemState::Opened {
                if i + self.lag >= self.position {
                    break i;
                }
                first_unopened.get_or_insert(i);
            }
            match self.plan.next_position(i) {
                Some(next) => i = next,
                // Only occurrences the position has passed are left: the earliest of them.
                None => break first_unopened?,
            }
        };
        Some((i, self.mark_opened(i)))
    }

    /// Marks item `i` opened and moves the position; whether it had been fetched.
    fn mark_opened(&mut self, i: usize) -> bool {
        let was_ready = matches!(self.state[i], ItemState::Ready(_));
        match self.state[i] {
            ItemState::Ready(bytes) => self.ready_bytes -= bytes,
            ItemState::Fetching => self.fetching -= 1,
            _ => {}
        }
        self.state[i] = ItemState::Opened;
        self.furthest_opened = Some(self.furthest_opened.map_or(i, |f| f.max(i)));
        self.advance();
        was_ready
    }

    fn advance(&mut self) {
        if let Some(f) = self.furthest_opened {
            self.position = self.position.max((f + 1).saturating_sub(self.lag));
        }
        while self.position < self.state.len()
            && matches!(
                self.state[self.position],
                ItemState::Opened | ItemState::Missing
            )
        {
            self.position += 1;
        }
    }

    /// The next items to fetch, marked as fetching.
    pub fn next_to_fetch(&mut self, window: Window) -> Vec<usize> {
        let mut out = Vec::new();
        let end = (self.position + window.items).min(self.state.len());
        for i in self.position..end {
            if self.fetching >= window.concurrency || self.ready_bytes >= window.bytes {
                break;
            }
            if self.state[i] == ItemState::Waiting {
                self.state[i] = ItemState::Fetching;
                self.fetching += 1;
                out.push(i);
            }
        }
        out
    }

    /// Records the outcome of fetching item `i`: `Some(bytes)` fetched, `None` missing;
    /// `failed` for a fetch error.
    pub fn fetched(&mut self, i: usize, outcome: Result<Option<u64>, ()>) {
        if self.state.get(i) != Some(&ItemState::Fetching) {
            return; // opened meanwhile, or a stale report
        }
        self.fetching -= 1;
        self.state[i] = match outcome {
            Ok(Some(bytes)) => {
                self.ready_bytes += bytes;
                ItemState::Ready(bytes)
            }
            Ok(None) => ItemState::Missing,
            Err(()) => ItemState::Failed,
        };
        self.advance();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(n: usize) -> Plan {
        let text: String = (0..n).map(|i| format!("d/f{i}\n")).collect();
        Plan::parse(&text).unwrap()
    }

    const W: Window = Window {
        concurrency: 4,
        bytes: 1000,
        items: 100,
    };

    #[test]
    fn parses_paths_comments_and_rejects_escapes() {
        let p = Plan::parse("# epoch 3\n./a/b.jpg\n\n/c.jpg\nd e.jpg\n").unwrap();
        assert_eq!(p.len(), 3);
        assert_eq!(&**p.path(0), "a/b.jpg");
        assert_eq!(p.position("c.jpg"), Some(1));
        assert_eq!(p.position("d e.jpg"), Some(2));
        assert!(Plan::parse("a/../../etc/passwd").is_err());
    }

    #[test]
    fn fetches_in_order_within_concurrency_and_budget() {
        let mut t = PlanTracker::new(plan(20), 8);
        assert_eq!(t.next_to_fetch(W), vec![0, 1, 2, 3]);
        assert!(t.next_to_fetch(W).is_empty(), "concurrency reached");
        t.fetched(0, Ok(Some(400)));
        t.fetched(1, Ok(Some(400)));
        assert_eq!(t.next_to_fetch(W), vec![4, 5]);
        t.fetched(2, Ok(Some(400)));
        // 1200 bytes ready and unopened: over the budget.
        assert!(t.next_to_fetch(W).is_empty());
        assert_eq!(t.opened("d/f0"), Some((0, true)));
        assert_eq!(t.opened("d/f1"), Some((1, true)));
        assert_eq!(t.position(), 2);
        assert_eq!(t.next_to_fetch(W), vec![6]);
    }

    #[test]
    fn a_reader_ahead_of_the_plan_drags_the_position() {
        let mut t = PlanTracker::new(plan(100), 4);
        assert_eq!(t.opened("d/f50"), Some((50, false)));
        assert_eq!(t.position(), 47);
        let next = t.next_to_fetch(W);
        assert_eq!(next, vec![47, 48, 49, 51]);
        assert_eq!(t.opened("not/in/plan"), None);
    }

    #[test]
    fn a_path_listed_again_is_matched_to_its_next_unopened_occurrence() {
        let mut t = PlanTracker::new(Plan::parse("a\nb\na\nc\na\n").unwrap(), 1);
        assert_eq!(t.plan().next_position(0), Some(2));
        assert_eq!(t.plan().next_position(2), Some(4));
        assert_eq!(t.plan().next_position(4), None);
        assert_eq!(t.plan().next_position(1), None);
        assert_eq!(t.opened("a"), Some((0, false)));
        assert_eq!(t.opened("b"), Some((1, false)));
        assert_eq!(t.opened("a"), Some((2, false)));
        assert_eq!(t.opened("a"), Some((4, false)));
        // Every occurrence opened: a reopen, not a plan item.
        assert_eq!(t.opened("a"), None);
        // With a lag of 1 the unopened "c" no longer holds the position back.
        assert_eq!(t.position(), 5);
    }

    /// The tracker's `opened` with the item found by a scan of the whole rest of the plan (how
    /// it was done before occurrences were chained): the reference model for the property
    /// test below, which compares the items chosen (the state update is shared).
    fn opened_by_scan(t: &mut PlanTracker, path: &str) -> Option<(usize, bool)> {
        let first = t.plan.position(path)?;
        let unopened = |i: &usize| &*t.plan.items[*i] == path && t.state[*i] != ItemState::Opened;
        let i = (first..t.plan.len())
            .filter(unopened)
            .find(|&i| i + t.lag >= t.position)
            .or_else(|| (first..t.plan.len()).find(unopened))?;
        Some((i, t.mark_opened(i)))
    }

    proptest::proptest! {
        /// Plans with repeated paths, opened in any order (with fetches in between): the
        /// chained lookup answers exactly as a scan of the plan does.
        #[test]
        fn opened_matches_a_scan_of_the_plan(
            items in proptest::collection::vec(0u8..6, 1..40),
            opens in proptest::collection::vec((0u8..8, proptest::bool::ANY), 0..80),
            lag in 1usize..6,
        ) {
            let text: String = items.iter().map(|i| format!("p{i}\n")).collect();
            let plan = Plan::parse(&text).unwrap();
            let mut chained = PlanTracker::new(plan.clone(), lag);
            let mut scanned = PlanTracker::new(plan, lag);
            for (path, fetch_first) in opens {
                if fetch_first {
                    let window = Window { concurrency: 2, bytes: 1 << 20, items: 8 };
                    let a = chained.next_to_fetch(window);
                    proptest::prop_assert_eq!(&a, &scanned.next_to_fetch(window));
                    for i in a {
                        chained.fetched(i, Ok(Some(10)));
                        scanned.fetched(i, Ok(Some(10)));
                    }
                }
                let path = format!("p{path}");
                proptest::prop_assert_eq!(chained.opened(&path), opened_by_scan(&mut scanned, &path));
                proptest::prop_assert_eq!(chained.position(), scanned.position());
                proptest::prop_assert_eq!(chained.ready_bytes(), scanned.ready_bytes());
            }
        }
    }

    #[test]
    fn missing_items_are_skipped() {
        let mut t = PlanTracker::new(plan(5), 8);
        assert_eq!(t.next_to_fetch(W), vec![0, 1, 2, 3]);
        t.fetched(0, Ok(None));
        t.fetched(1, Err(()));
        assert_eq!(t.state(0), ItemState::Missing);
        assert_eq!(t.position(), 1);
        assert_eq!(t.next_to_fetch(W), vec![4]);
    }
}
