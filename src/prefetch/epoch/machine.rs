//! The epoch tracker's pure state: the epoch set, which of its files are opened or fetched
//! ahead in the current epoch, the repeats that place a boundary, the allowance and the fetch
//! cursor. Nothing here does I/O, awaits or touches the cache: [`super`] holds the driver that
//! feeds it opens and listings, starts the fetches it picks and reports on it, and the
//! algorithm it implements.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use super::{
    BACK_OFF_USEFUL, FLOOR_BYTES, MAX_PARALLEL, MIN_JUDGED, PARALLEL_WINDOW, RAMP_FILES,
    RAMP_PARALLEL, TRUST_USEFUL,
};
use crate::cache::EntryKey;
use crate::namespace::ROOT_INO;

/// How much prefetch an epoch allows, from what the previous epoch showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trust {
    /// First epoch, or usefulness in between: the browsing allowance.
    Normal,
    /// The last epoch opened what was fetched ahead: only the cache room bounds prefetch.
    Trusted,
    /// The last epoch left much of what was fetched ahead unopened: no growth.
    BackedOff,
}

impl Trust {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Trust::Normal => "normal",
            Trust::Trusted => "trusted",
            Trust::BackedOff => "backed-off",
        }
    }

    /// The trust the next epoch gets from this one's usefulness (files fetched ahead, and how
    /// many of them were opened in the epoch).
    pub fn after(fetched: u64, fetched_opened: u64, current: Trust) -> Trust {
        if fetched < MIN_JUDGED {
            return current;
        }
        let useful = fetched_opened as f64 / fetched as f64;
        if useful >= TRUST_USEFUL {
            Trust::Trusted
        } else if useful < BACK_OFF_USEFUL {
            Trust::BackedOff
        } else {
            Trust::Normal
        }
    }
}

/// Bytes that may be fetched ahead and not yet opened, given what was opened in this epoch
/// and how many files the reader reads at once.
pub fn allowance(trust: Trust, opened_files: u64, opened_bytes: u64, parallel: u64) -> u64 {
    match trust {
        Trust::Trusted => u64::MAX,
        Trust::BackedOff => opened_bytes.max(FLOOR_BYTES),
        Trust::Normal => opened_bytes
            .saturating_mul((opened_files / RAMP_FILES).max(1))
            .saturating_mul(parallel.max(1))
            .max(FLOOR_BYTES),
    }
}

/// Distinct repeats that start the next epoch.
pub fn repeats_for_boundary(opened_files: u64) -> usize {
    (opened_files / 64).clamp(8, 1024) as usize
}

/// Opens that must come between two opens of a file for the second to be a repeat.
pub fn repeat_gap(opened_files: u64) -> u64 {
    (opened_files / 16).clamp(4, 64)
}

/// The lowest common ancestor of two directories, given a way to find a node's parent.
pub fn common_ancestor(a: u64, b: u64, parent_of: impl Fn(u64) -> u64) -> u64 {
    let mut chain = HashSet::new();
    let mut cur = a;
    loop {
        chain.insert(cur);
        if cur == ROOT_INO {
            break;
        }
        let up = parent_of(cur);
        if up == cur {
            break;
        }
        cur = up;
    }
    let mut cur = b;
    loop {
        if chain.contains(&cur) {
            return cur;
        }
        if cur == ROOT_INO {
            return ROOT_INO;
        }
        let up = parent_of(cur);
        if up == cur {
            return ROOT_INO;
        }
        cur = up;
    }
}

pub(super) const AHEAD: u8 = 1;

/// The files of an epoch set and where each stands in the current epoch.
pub(super) struct EpochSet {
    pub(super) root: u64,
    pub(super) root_path: String,
    pub(super) inos: Vec<u64>,
    pub(super) sizes: Vec<u64>,
    /// Each file's directory (an index into `dirs`); a directory's files are contiguous.
    pub(super) dir_of: Vec<u32>,
    pub(super) dirs: Vec<DirRange>,
    /// Directories the reader has opened a file in, in the order it first did, and their
    /// files and bytes.
    pub(super) drawn: Vec<u32>,
    pub(super) drawn_files: u64,
    pub(super) drawn_bytes: u64,
    pub(super) index: HashMap<u64, u32>,
    /// Sequence number of each file's last open (0: never).
    pub(super) opened_at: Vec<u64>,
    pub(super) flags: Vec<u8>,
    pub(super) total_bytes: u64,
}

/// The files of one directory of a set: `start..end` of its file list, and whether the
/// reader has opened a file in it.
pub(super) struct DirRange {
    pub(super) start: u32,
    pub(super) end: u32,
    pub(super) drawn: bool,
    pub(super) bytes: u64,
}

impl EpochSet {
    /// The set of the files `listed` under `root`, none opened or drawn from yet.
    pub(super) fn new(root: u64, root_path: String, listed: Listed) -> EpochSet {
        let Listed {
            inos,
            sizes,
            dir_of,
            dirs,
        } = listed;
        let index = inos
            .iter()
            .enumerate()
            .map(|(i, &ino)| (ino, i as u32))
            .collect();
        let n = inos.len();
        let total_bytes = sizes.iter().sum();
        EpochSet {
            root,
            root_path,
            inos,
            sizes,
            dir_of,
            dirs,
            drawn: Vec::new(),
            drawn_files: 0,
            drawn_bytes: 0,
            index,
            opened_at: vec![0; n],
            flags: vec![0; n],
            total_bytes,
        }
    }

    /// Marks the directory of file `i` as drawn from; whether it was new.
    pub(super) fn draw_from(&mut self, i: usize) -> bool {
        let d = self.dir_of[i];
        let dir = &mut self.dirs[d as usize];
        if dir.drawn {
            return false;
        }
        dir.drawn = true;
        self.drawn_files += u64::from(dir.end - dir.start);
        self.drawn_bytes += dir.bytes;
        self.drawn.push(d);
        true
    }
}

/// The files under a set's root, directory by directory.
#[derive(Default)]
pub(super) struct Listed {
    pub(super) inos: Vec<u64>,
    pub(super) sizes: Vec<u64>,
    pub(super) dir_of: Vec<u32>,
    pub(super) dirs: Vec<DirRange>,
}

/// The epoch tracker's state (under one lock; never held across an await or a cache call).
pub(in crate::prefetch) struct EpochState {
    pub(super) set: Option<EpochSet>,
    pub(super) building: Option<u64>,
    pub(super) candidate: Option<u64>,
    /// Distinct files opened outside the set (or before there is one) since it was built, and
    /// the sequence of their last open (applied to the set when it is installed).
    pub(super) outside: HashMap<u64, u64>,
    /// Opens (inode, sequence) seen while a set was being built.
    pub(super) pending_opens: Vec<(u64, u64)>,
    pub(super) seq: u64,
    /// Opens with a sequence number above this one belong to the current epoch.
    pub(super) epoch_start: u64,
    /// Only a second open of a file whose earlier open came after this one is a repeat.
    pub(super) repeat_floor: u64,
    /// Files opened in the previous epoch (the scale of the repeat rules early in an epoch).
    pub(super) last_epoch_files: u64,
    pub(super) epoch: u64,
    pub(super) opened_files: u64,
    pub(super) opened_bytes: u64,
    /// Distinct repeats this epoch: inode and the sequence of the repeat open.
    pub(super) repeats: HashMap<u64, u64>,
    pub(super) ahead_bytes: u64,
    pub(super) ahead_files: u64,
    pub(super) in_flight: usize,
    /// [`Prefetcher::epoch_fill`] calls between taking their candidates and starting (or
    /// putting back) the last of them: work that `in_flight` does not show yet.
    pub(super) filling: usize,
    /// The fetch cursor: a position in the set's drawn directories and in that directory.
    pub(super) cursor_dir: usize,
    pub(super) cursor_file: u32,
    /// Files the cursor passed that did not fit the allowance yet.
    pub(super) retry: Vec<(usize, u64)>,
    /// Cached (or being fetched) files of the set not opened in this epoch: what the eviction
    /// oracle reports as needed, with their sizes.
    pub(super) needed: HashMap<EntryKey, u64>,
    pub(super) needed_bytes: u64,
    pub(super) needs_rebuild: bool,
    pub(super) trust: Trust,
    /// The most files open at once over the last window of opens, and in the window before.
    pub(super) parallel_now: u64,
    pub(super) parallel_before: u64,
    /// Distinct callers (thread or process ids) that opened files in this window, at most
    /// [`MAX_PARALLEL`], and how many the window before had (0: none known).
    pub(super) callers_now: Vec<u32>,
    pub(super) callers_before: usize,
    pub(super) last_usefulness: Option<f64>,
    pub(super) fetched_this_epoch: u64,
    pub(super) fetched_bytes_this_epoch: u64,
    pub(super) fetched_opened_this_epoch: u64,
    pub(super) note: Option<String>,
}

impl Default for EpochState {
    fn default() -> Self {
        EpochState {
            set: None,
            building: None,
            candidate: None,
            outside: HashMap::new(),
            pending_opens: Vec::new(),
            seq: 0,
            epoch_start: 0,
            repeat_floor: 0,
            last_epoch_files: 0,
            epoch: 1,
            opened_files: 0,
            opened_bytes: 0,
            repeats: HashMap::new(),
            ahead_bytes: 0,
            ahead_files: 0,
            in_flight: 0,
            filling: 0,
            cursor_dir: 0,
            cursor_file: 0,
            retry: Vec::new(),
            needed: HashMap::new(),
            needed_bytes: 0,
            needs_rebuild: false,
            trust: Trust::Normal,
            parallel_now: 1,
            parallel_before: 1,
            callers_now: Vec::new(),
            callers_before: 0,
            last_usefulness: None,
            fetched_this_epoch: 0,
            fetched_bytes_this_epoch: 0,
            fetched_opened_this_epoch: 0,
            note: None,
        }
    }
}

impl EpochState {
    pub(in crate::prefetch) fn is_needed(&self, key: &EntryKey) -> bool {
        self.needed.contains_key(key)
    }

    pub(super) fn forget_needed(&mut self, key: &EntryKey) {
        if let Some(size) = self.needed.remove(key) {
            self.needed_bytes = self.needed_bytes.saturating_sub(size);
        }
    }

    /// Adds a needed entry; whether it is new.
    pub(super) fn add_needed(&mut self, key: EntryKey, size: u64) -> bool {
        let new = self.needed.insert(key, size).is_none();
        if new {
            self.needed_bytes += size;
        }
        new
    }

    /// Records the open of file `i` of the set at sequence `seq`; returns whether the next
    /// epoch starts with it.
    pub(super) fn record_open(&mut self, i: usize, seq: u64, cap: u64) -> bool {
        let Some(set) = self.set.as_mut() else {
            return false;
        };
        set.draw_from(i);
        let last = set.opened_at[i];
        set.opened_at[i] = seq;
        if last > self.epoch_start {
            // Opened before in this epoch: a repeat if far enough apart, and if that earlier
            // open is surely of this epoch (not one the boundary took along).
            let basis = self.opened_files.max(self.last_epoch_files);
            if last > self.repeat_floor && seq - last >= repeat_gap(basis) {
                self.repeats.entry(set.inos[i]).or_insert(seq);
                return self.repeats.len() >= repeats_for_boundary(basis);
            }
            return false;
        }
        self.opened_files += 1;
        self.opened_bytes += set.sizes[i];
        if set.flags[i] & AHEAD != 0 {
            set.flags[i] &= !AHEAD;
            self.ahead_bytes = self.ahead_bytes.saturating_sub(set.sizes[i].min(cap));
            self.ahead_files = self.ahead_files.saturating_sub(1);
            self.fetched_opened_this_epoch += 1;
        }
        false
    }

    /// Starts the next epoch, retroactively at the first repeat.
    pub(super) fn start_epoch(&mut self, wasted: &std::sync::atomic::AtomicU64) {
        let Some(set) = self.set.as_mut() else {
            return;
        };
        let first = self.repeats.values().copied().min().unwrap_or(self.seq);
        self.trust = Trust::after(
            self.fetched_this_epoch,
            self.fetched_opened_this_epoch,
            self.trust,
        );
        if self.fetched_this_epoch > 0 {
            self.last_usefulness =
                Some(self.fetched_opened_this_epoch as f64 / self.fetched_this_epoch as f64);
        }
        wasted.fetch_add(self.ahead_bytes, Ordering::Relaxed);
        self.epoch += 1;
        // The files opened within one gap before the first repeat may belong to either epoch
        // (their repeats would not have counted); they are taken as opened in the new one, so
        // that nothing is fetched twice in it (at worst a few of them miss later). Their next
        // opens are not repeats.
        let basis = self.opened_files.max(self.last_epoch_files);
        self.last_epoch_files = self.opened_files;
        self.epoch_start = first.saturating_sub(1 + repeat_gap(basis));
        self.repeat_floor = first - 1;
        self.repeats.clear();
        self.opened_files = 0;
        self.opened_bytes = 0;
        for (i, at) in set.opened_at.iter().enumerate() {
            if *at > self.epoch_start {
                self.opened_files += 1;
                self.opened_bytes += set.sizes[i];
            }
        }
        set.flags.iter_mut().for_each(|f| *f &= !AHEAD);
        self.ahead_bytes = 0;
        self.ahead_files = 0;
        self.rewind();
        self.fetched_this_epoch = 0;
        self.fetched_bytes_this_epoch = 0;
        self.fetched_opened_this_epoch = 0;
        self.needs_rebuild = true;
    }

    /// Installs a freshly enumerated set, keeping the opens seen before and which files are
    /// fetched ahead (`cap`: the bytes of a file prefetch fetches at most).
    pub(super) fn install(&mut self, mut set: EpochSet, cap: u64) {
        if let Some(old) = self.set.take() {
            for (i, ino) in old.inos.iter().enumerate() {
                if let Some(&j) = set.index.get(ino) {
                    set.opened_at[j as usize] = old.opened_at[i];
                    set.flags[j as usize] |= old.flags[i] & AHEAD;
                }
            }
        }
        // Opens of files the new set lacks stay where they were: a set installed from the
        // listings at hand may lack a directory the reader opened a file in (its listing was
        // still under way), and the full set that follows must count that open, or the file
        // would be fetched ahead again in the epoch it was read in.
        let pending = std::mem::take(&mut self.pending_opens);
        for (ino, seq) in pending {
            match set.index.get(&ino) {
                Some(&j) => set.opened_at[j as usize] = set.opened_at[j as usize].max(seq),
                None if self.building.is_some() => self.pending_opens.push((ino, seq)),
                None => {}
            }
        }
        self.outside.retain(|ino, seq| match set.index.get(ino) {
            Some(&j) => {
                set.opened_at[j as usize] = set.opened_at[j as usize].max(*seq);
                false
            }
            None => true,
        });
        self.opened_files = 0;
        self.opened_bytes = 0;
        for i in 0..set.opened_at.len() {
            if set.opened_at[i] > 0 {
                set.draw_from(i);
            }
            if set.opened_at[i] > self.epoch_start {
                self.opened_files += 1;
                self.opened_bytes += set.sizes[i];
            }
        }
        // Files fetched ahead under the old set stay counted against the allowance (a
        // fetch of one still running is never repeated: the fetcher shares it).
        self.ahead_bytes = 0;
        self.ahead_files = 0;
        for i in 0..set.flags.len() {
            if set.flags[i] & AHEAD != 0 {
                if set.opened_at[i] > self.epoch_start {
                    set.flags[i] &= !AHEAD;
                } else {
                    self.ahead_bytes += set.sizes[i].min(cap);
                    self.ahead_files += 1;
                }
            }
        }
        self.rewind();
        self.set = Some(set);
        self.needs_rebuild = true;
    }

    /// Records how many files are open at this open, and who opened it; the window moves
    /// every [`PARALLEL_WINDOW`] opens.
    pub(super) fn note_parallelism(&mut self, open_now: u64, caller: Option<u32>) {
        if self.seq % PARALLEL_WINDOW == 0 {
            self.parallel_before = self.parallel_now;
            self.parallel_now = 1;
            self.callers_before = self.callers_now.len();
            self.callers_now.clear();
        }
        self.parallel_now = self.parallel_now.max(open_now);
        if let Some(c) = caller {
            if self.callers_now.len() < MAX_PARALLEL as usize && !self.callers_now.contains(&c) {
                self.callers_now.push(c);
            }
        }
    }

    /// How many files the reader reads at once, at most [`MAX_PARALLEL`]: the recent peak of
    /// files open at the same time, but no more than the distinct callers that opened them.
    /// The kernel sends a file's RELEASE after `close` returns, so one reader thread is often
    /// seen with two files open; its opens all come from one thread, which caps it at one.
    pub(super) fn parallelism(&self) -> u64 {
        let open = self.parallel_now.max(self.parallel_before);
        let callers = self.callers_now.len().max(self.callers_before) as u64;
        let p = if callers > 0 { open.min(callers) } else { open };
        p.clamp(1, MAX_PARALLEL)
    }

    /// Epoch fetches that may be in flight now, of `max`: in an epoch that is not trusted,
    /// [`RAMP_PARALLEL`] per reader thread until it has opened [`RAMP_FILES`] files. Those
    /// opens are nearly all misses that wait for the store, and the store serves every
    /// request alike: with the full concurrency beside them (48 prefetches for 8 readers) the
    /// first 256 opens take twice as long as with epoch prefetch off. One fetch per reader
    /// thread leaves the store idle early (the cold epoch up to 1.2× copy-first's time), a
    /// linear ramp to the full concurrency is as slow as none; three per reader thread keep
    /// the first opens within 1.4× of prefetch off and the epoch as fast as copy-first.
    pub(super) fn concurrency(&self, max: usize) -> usize {
        if self.trust == Trust::Trusted || self.opened_files >= RAMP_FILES {
            return max;
        }
        (RAMP_PARALLEL * self.parallelism() as usize)
            .min(max)
            .max(1)
    }

    /// Bytes that may be fetched ahead now.
    pub(super) fn limit(&self) -> u64 {
        allowance(
            self.trust,
            self.opened_files,
            self.opened_bytes,
            self.parallelism(),
        )
    }

    /// Back to the first drawn directory (a new epoch or a new set).
    fn rewind(&mut self) {
        self.cursor_dir = 0;
        self.cursor_file = 0;
        self.retry.clear();
    }

    /// Whether the scheduler has nothing to start: a set is installed and its cursor has
    /// passed every drawn directory with no file left to retry, and no rebuild or
    /// enumeration is due. Only an open that draws from a new directory, a boundary (which
    /// rewinds the cursor), a new set or a finished fetch (which wakes the scheduler itself)
    /// makes work again; the allowance growing with opens matters only for files waiting in
    /// `retry`, which makes this false.
    pub(super) fn idle(&self) -> bool {
        self.set
            .as_ref()
            .is_some_and(|set| self.cursor_dir >= set.drawn.len())
            && self.retry.is_empty()
            && !self.needs_rebuild
            && self.building.is_none()
            && self.filling == 0
    }

    /// The next files of the set to look at for prefetch: in the directories drawn from, not
    /// opened in this epoch and not fetched ahead; at most `n`. Moves the cursor past them.
    pub(super) fn candidates(&mut self, n: usize) -> Vec<(usize, u64)> {
        let Some(set) = self.set.as_ref() else {
            return Vec::new();
        };
        let epoch_start = self.epoch_start;
        let wanted = |i: usize| set.opened_at[i] <= epoch_start && set.flags[i] & AHEAD == 0;
        let mut out: Vec<(usize, u64)> = Vec::new();
        // Files waiting for the allowance come first; those beyond `n` wait on.
        let mut waiting = std::mem::take(&mut self.retry).into_iter();
        for (i, ino) in waiting.by_ref() {
            if set.inos.get(i) == Some(&ino) && wanted(i) {
                out.push((i, ino));
                if out.len() == n {
                    break;
                }
            }
        }
        self.retry.extend(waiting);
        while out.len() < n && self.cursor_dir < set.drawn.len() {
            let dir = &set.dirs[set.drawn[self.cursor_dir] as usize];
            let i = dir.start + self.cursor_file;
            if i >= dir.end {
                self.cursor_dir += 1;
                self.cursor_file = 0;
                continue;
            }
            self.cursor_file += 1;
            let i = i as usize;
            if wanted(i) {
                out.push((i, set.inos[i]));
            }
        }
        out
    }
}
