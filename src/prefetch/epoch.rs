//! Epoch prefetch: fetching the unread files of a shuffled epoch, with no plan.
//!
//! # Why it works without the order
//! A shuffled epoch is sampling *without replacement*. The order is unknown, but the **set** is
//! known: every file of the dataset that has not been opened in this epoch will be opened
//! before the epoch ends, and every file that has been opened will not be needed again until
//! the next one. So the files of the set that are neither opened nor cached can be fetched in
//! any order, as many at once as the store's latency needs, and every one of them is a future
//! hit. A random open finds its file cached with probability "cached and unopened ÷ unopened",
//! which grows towards 1 as the background fetches overtake the reader: the first epoch
//! becomes "copy-first in the background, demand reads first", and an epoch over a set larger
//! than the cache becomes one whose opens are mostly hits while each file is still fetched at
//! most once.
//!
//! # Recognising the set
//! Opens outside a plan are watched. Their parent directories' lowest common ancestor is the
//! *candidate root* (for ImageFolder's `root/class/img` the dataset root after two opens from
//! different classes; for a flat directory that directory). After [`MIN_OPENS_TO_BUILD`]
//! distinct opens under a candidate, the files under it are enumerated in the background and
//! become the *epoch set*, directory by directory in listing order: first at once from the
//! listings the namespace holds (every directory the reader opened a file in is among them,
//! so fetching starts within the open that triggered it), then again once the directories not
//! listed yet are listed, [`LIST_CONCURRENCY`] at a time (on W1's 200 directories behind the
//! 30 ms proxy that took about a second, a second in which nothing was fetched ahead). An
//! open outside the set's root moves the candidate up and the set is rebuilt at the new root.
//! A new set keeps the old one's opened marks and fetched-ahead marks by inode, so nothing
//! counted against the allowance is forgotten and nothing is fetched twice.
//!
//! Only the directories the reader has opened a file in (*drawn from*) are fetched, in the
//! order it first drew from them. A job that reads some classes of a tree (a subset of the
//! directories, an evaluation split next to the training one) gets those; ImageFolder over a
//! whole dataset draws from every class within its first few thousand opens, while the
//! allowance below is still small.
//!
//! # Epochs
//! Each file keeps the sequence number of its last open. An open of a file already opened in
//! this epoch is a *repeat* if at least a gap of `clamp(n/16, 4, 64)` other opens came
//! between the two (`n`: files opened in this epoch or the last, the larger) (a file read twice in a row, or by two processes at once, is not the next
//! epoch). The next epoch starts when the distinct repeats reach `clamp(n/64, 8, 1024)`;
//! it is placed retroactively one gap before the first of them, so the files opened since
//! then count as opened in the new epoch and none of them is fetched again in it (the few
//! from the end of the old epoch that this takes along may miss later: a miss, never a
//! second GET; their next opens are not repeats). At a boundary the opened marks reset, the fetch cursor goes back to the start
//! of the set, and the files fetched ahead and never opened in the ending epoch are counted
//! as wasted (they stay cached and are needed in the new epoch like any cached file).
//!
//! # What users do not pay for it
//! - **Browsing** (a few files opened by hand, an evaluation reading 1% of the set): the bytes
//!   fetched ahead and not yet opened stay within an allowance that grows with what the reader
//!   has opened in this epoch and with how many files it reads at once (`P`, the most files
//!   open at the same time over the last [`PARALLEL_WINDOW`] opens or the window before, but
//!   no more than the distinct threads or processes that opened them, at most
//!   [`MAX_PARALLEL`]; a file's RELEASE reaches the daemon after `close` returns, so one
//!   thread is often seen with two files open): `max(opened_bytes × max(1, opened_files / RAMP_FILES) × P, FLOOR)`.
//!   One reader thread opening its first [`RAMP_FILES`] files can cause at most as many bytes
//!   fetched ahead as it read (bytes fetched ≤ 2 × bytes read once it has read a megabyte);
//!   a data loader with eight workers gets eight times that (by Little's law its prefetch needs
//!   scale with its parallelism), and as a real epoch goes on the allowance grows
//!   quadratically. Modelled on W1 (8 threads, 35 ms per miss, a store that serves ~1,000
//!   files/s) the growth without `P` already came close to the exact plan (20.8 s against
//!   20.9 s; a linear allowance took 43% longer); measured on the full W1 (6,000 files of 60
//!   directories) it reached 0.75× the plan's files/s, with 913 of 6,000 opens missing in the
//!   first part of the epoch, which is what `P` shortens.
//! - **The first opens.** In an epoch that is not trusted, at most [`RAMP_PARALLEL`] epoch
//!   fetches per reader thread are in flight until it has opened [`RAMP_FILES`] files: its
//!   first opens are nearly all misses, and beside a full set of prefetches they waited for a
//!   store that serves every request alike (W1's first 256 files: 3.2–3.4 s → 2.1–2.4 s).
//! - **Usefulness**: at each boundary the share of files fetched ahead that were opened in the
//!   epoch is measured. At least [`TRUST_USEFUL`] (a reader of the whole set) makes the next
//!   epoch *trusted*: the allowance is lifted and only the cache room bounds prefetch. Below
//!   [`BACK_OFF_USEFUL`] (a node of a multi-node job that reads a random share of the set per
//!   epoch) the next epoch is *backed off*: the allowance stays at `max(opened_bytes, FLOOR)`
//!   (no growth), so such a node fetches at most about twice what it reads.
//! - **Room**: with an NVMe cache, the bytes of set files that are cached and not opened in this
//!   epoch (fetched ahead, or kept from the last epoch) stay under the cache limit less
//!   1/[`DEMAND_RESERVE`] of it (the rest is for demand reads and the cache's own rounding). In
//!   a set larger than the cache every byte of room is a hit later in the epoch: on W5 (cache
//!   = half the bytes) 1/8 kept back gave 0.79 of the opens of epochs 2–3 cached, 1/16 0.81
//!   (one run each, 4,726 and 4,777 of 6,000 against 4,876 and 4,903), with no file fetched
//!   twice and the same files/s.
//!   The space prefetch fetches into therefore comes only from files already opened in this
//!   epoch (and from anything outside the set): the eviction oracle reports every cached,
//!   unopened file of the set as needed (the `plan` eviction policy, the default, then evicts
//!   everything else first), so a file fetched ahead is never evicted to make room for another
//!   prefetch. Without an NVMe cache the ahead bytes stay within the prefetch byte budget (half
//!   the memory cache).
//! - **The eviction policy is told.** The policy caches its last answer per entry and asks
//!   again on a use of the entry or when the oracle's generation moves; so the generation
//!   moves whenever cached files become needed in bulk (a set installed, a boundary's rebuild,
//!   a fill that found cached files). Without it the files kept from the last epoch stayed in
//!   the policy's "not needed" order and went first: a set twice the cache fetched 728–797 of
//!   800 files per epoch and some twice; with it, about half, and none twice (unit test).
//! - With `--eviction lru` or `epoch` the policy does not ask, and the memory cache (no
//!   `--cache-dir`) evicts by its own order, so a file fetched ahead could be the next victim:
//!   then only sets whose drawn-from directories fit in the room are prefetched.
//! - A plan, when set, wins: epoch prefetch pauses while one is active. Directory order and
//!   `--preload` work as before (a fetch already in flight is shared, never repeated).
//!
//! # Cost
//! Per file of the set: its inode, size and last-open sequence (24 bytes), a flag byte and an
//! index entry (about 24 bytes), plus 24 bytes per cached unopened file in the needed map. A
//! set is capped at [`MAX_SET_FILES`]. An open is O(1); a boundary and the rebuild of the
//! needed map are O(set) once per epoch.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::StreamExt;
use serde_json::json;

use super::Prefetcher;
use crate::cache::EntryKey;
use crate::fetch::{ObjectVersion, Priority};
use crate::namespace::{Kind, ROOT_INO};

/// Opens under a candidate root before its files are enumerated.
pub const MIN_OPENS_TO_BUILD: u32 = 4;
/// Distinct files outside the set remembered at most (enough to place the candidate root).
const OUTSIDE_TRACKED: usize = 4096;
/// Directories listed at once while enumerating a set.
pub const LIST_CONCURRENCY: usize = 16;
/// Opens over which the browsing allowance grows by one more "opened bytes".
pub const RAMP_FILES: u64 = 256;
/// Opens per window of the reader's parallelism (the most files open at once).
pub const PARALLEL_WINDOW: u64 = 64;
/// Epoch fetches in flight per reader thread while an epoch ramps up (see
/// [`EpochState::concurrency`]).
pub const RAMP_PARALLEL: usize = 3;
/// The parallelism the allowance scales with, at most.
pub const MAX_PARALLEL: u64 = 16;
/// The NVMe cache's share (one part in this many) kept out of the epoch room, for demand reads
/// and the cache's rounding.
pub const DEMAND_RESERVE: u64 = 16;
/// Bytes that may be fetched ahead before anything is opened.
pub const FLOOR_BYTES: u64 = 1 << 20;
/// Usefulness at or above which the next epoch is trusted.
pub const TRUST_USEFUL: f64 = 0.75;
/// Usefulness below which the next epoch backs off.
pub const BACK_OFF_USEFUL: f64 = 0.6;
/// Files fetched ahead in an epoch before its usefulness is judged.
pub const MIN_JUDGED: u64 = 16;
/// The largest set tracked.
pub const MAX_SET_FILES: usize = 16_000_000;

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
    fn as_str(self) -> &'static str {
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

const AHEAD: u8 = 1;

/// The files of an epoch set and where each stands in the current epoch.
struct EpochSet {
    root: u64,
    root_path: String,
    inos: Vec<u64>,
    sizes: Vec<u64>,
    /// Each file's directory (an index into `dirs`); a directory's files are contiguous.
    dir_of: Vec<u32>,
    dirs: Vec<DirRange>,
    /// Directories the reader has opened a file in, in the order it first did, and their
    /// files and bytes.
    drawn: Vec<u32>,
    drawn_files: u64,
    drawn_bytes: u64,
    index: HashMap<u64, u32>,
    /// Sequence number of each file's last open (0: never).
    opened_at: Vec<u64>,
    flags: Vec<u8>,
    total_bytes: u64,
}

/// The files of one directory of a set: `start..end` of its file list, and whether the
/// reader has opened a file in it.
struct DirRange {
    start: u32,
    end: u32,
    drawn: bool,
    bytes: u64,
}

impl EpochSet {
    /// The set of the files `listed` under `root`, none opened or drawn from yet.
    fn new(root: u64, root_path: String, listed: Listed) -> EpochSet {
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
    fn draw_from(&mut self, i: usize) -> bool {
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
struct Listed {
    inos: Vec<u64>,
    sizes: Vec<u64>,
    dir_of: Vec<u32>,
    dirs: Vec<DirRange>,
}

/// What one [`Prefetcher::epoch_fill`] did.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Fill {
    /// Fetches started.
    started: usize,
    /// Files were skipped (already cached, or metadata unknown): call again at once.
    again: bool,
    /// Cached files became needed: the eviction policy must re-ask about them.
    newly_needed: bool,
    /// This call counted itself in [`EpochState::filling`].
    counted: bool,
}

/// What [`Prefetcher::epoch_on_open`] found out, for the caller to act on.
#[derive(Default)]
struct OpenOutcome {
    build: Option<u64>,
    boundary: bool,
    /// The scheduler has nothing to do after this open ([`EpochState::idle`]).
    idle: bool,
}

/// The epoch tracker's state (under one lock; never held across an await or a cache call).
pub(super) struct EpochState {
    set: Option<EpochSet>,
    building: Option<u64>,
    candidate: Option<u64>,
    /// Distinct files opened outside the set (or before there is one) since it was built, and
    /// the sequence of their last open (applied to the set when it is installed).
    outside: HashMap<u64, u64>,
    /// Opens (inode, sequence) seen while a set was being built.
    pending_opens: Vec<(u64, u64)>,
    seq: u64,
    /// Opens with a sequence number above this one belong to the current epoch.
    epoch_start: u64,
    /// Only a second open of a file whose earlier open came after this one is a repeat.
    repeat_floor: u64,
    /// Files opened in the previous epoch (the scale of the repeat rules early in an epoch).
    last_epoch_files: u64,
    epoch: u64,
    opened_files: u64,
    opened_bytes: u64,
    /// Distinct repeats this epoch: inode and the sequence of the repeat open.
    repeats: HashMap<u64, u64>,
    ahead_bytes: u64,
    ahead_files: u64,
    in_flight: usize,
    /// [`Prefetcher::epoch_fill`] calls between taking their candidates and starting (or
    /// putting back) the last of them: work that `in_flight` does not show yet.
    filling: usize,
    /// The fetch cursor: a position in the set's drawn directories and in that directory.
    cursor_dir: usize,
    cursor_file: u32,
    /// Files the cursor passed that did not fit the allowance yet.
    retry: Vec<(usize, u64)>,
    /// Cached (or being fetched) files of the set not opened in this epoch: what the eviction
    /// oracle reports as needed, with their sizes.
    needed: HashMap<EntryKey, u64>,
    needed_bytes: u64,
    needs_rebuild: bool,
    trust: Trust,
    /// The most files open at once over the last window of opens, and in the window before.
    parallel_now: u64,
    parallel_before: u64,
    /// Distinct callers (thread or process ids) that opened files in this window, at most
    /// [`MAX_PARALLEL`], and how many the window before had (0: none known).
    callers_now: Vec<u32>,
    callers_before: usize,
    last_usefulness: Option<f64>,
    fetched_this_epoch: u64,
    fetched_bytes_this_epoch: u64,
    fetched_opened_this_epoch: u64,
    note: Option<String>,
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
    pub(super) fn is_needed(&self, key: &EntryKey) -> bool {
        self.needed.contains_key(key)
    }

    fn forget_needed(&mut self, key: &EntryKey) {
        if let Some(size) = self.needed.remove(key) {
            self.needed_bytes = self.needed_bytes.saturating_sub(size);
        }
    }

    /// Adds a needed entry; whether it is new.
    fn add_needed(&mut self, key: EntryKey, size: u64) -> bool {
        let new = self.needed.insert(key, size).is_none();
        if new {
            self.needed_bytes += size;
        }
        new
    }

    /// Records the open of file `i` of the set at sequence `seq`; returns whether the next
    /// epoch starts with it.
    fn record_open(&mut self, i: usize, seq: u64, cap: u64) -> bool {
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
    fn start_epoch(&mut self, wasted: &std::sync::atomic::AtomicU64) {
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
    fn install(&mut self, mut set: EpochSet, cap: u64) {
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
    fn note_parallelism(&mut self, open_now: u64, caller: Option<u32>) {
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
    fn parallelism(&self) -> u64 {
        let open = self.parallel_now.max(self.parallel_before);
        let callers = self.callers_now.len().max(self.callers_before) as u64;
        let p = if callers > 0 { open.min(callers) } else { open };
        p.clamp(1, MAX_PARALLEL)
    }

    /// Epoch fetches that may be in flight now, of `max`: in an epoch that is not trusted,
    /// [`RAMP_PARALLEL`] per reader thread until it has opened [`RAMP_FILES`] files. Those
    /// opens are nearly all misses that wait for the store, and the store serves every
    /// request alike: with the full concurrency beside them (48 prefetches for 8 readers) the
    /// first 256 files of W1 took 3.2–3.4 s (1.7 s with epoch prefetch off). Paired W1
    /// probes, 3 rounds each: one per reader thread, 1.8–1.9 s but the cold epoch 1.10–1.15×
    /// copy-first's total → 1.12–1.21× (the store idle early); a linear ramp to the full
    /// concurrency, 3.3–4.0 s; three per reader thread, 2.1–2.4 s and 0.96–1.03×.
    fn concurrency(&self, max: usize) -> usize {
        if self.trust == Trust::Trusted || self.opened_files >= RAMP_FILES {
            return max;
        }
        (RAMP_PARALLEL * self.parallelism() as usize)
            .min(max)
            .max(1)
    }

    /// Bytes that may be fetched ahead now.
    fn limit(&self) -> u64 {
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

    /// The next files of the set to look at for prefetch: in the directories drawn from, not
    /// opened in this epoch and not fetched ahead; at most `n`. Moves the cursor past them.
    /// Whether the scheduler has nothing to start: a set is installed and its cursor has
    /// passed every drawn directory with no file left to retry, and no rebuild or
    /// enumeration is due. Only an open that draws from a new directory, a boundary (which
    /// rewinds the cursor), a new set or a finished fetch (which wakes the scheduler itself)
    /// makes work again; the allowance growing with opens matters only for files waiting in
    /// `retry`, which makes this false.
    fn idle(&self) -> bool {
        self.set
            .as_ref()
            .is_some_and(|set| self.cursor_dir >= set.drawn.len())
            && self.retry.is_empty()
            && !self.needs_rebuild
            && self.building.is_none()
            && self.filling == 0
    }

    fn candidates(&mut self, n: usize) -> Vec<(usize, u64)> {
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

impl Prefetcher {
    /// The epoch tracker's part of an open outside a plan: updates the set and the epoch, and
    /// starts a set enumeration or a boundary's follow-up where one is due.
    pub(super) fn epoch_on_open(
        self: &Arc<Self>,
        ino: u64,
        obj: &Arc<ObjectVersion>,
        open_now: u64,
        caller: Option<u32>,
    ) {
        if !self.config.epoch_prefetch {
            return;
        }
        let key = self.entry_key(obj);
        let parent = self.ns.parent_of(ino);
        let outcome = {
            let mut st = self.epoch.lock();
            st.seq += 1;
            let seq = st.seq;
            st.note_parallelism(open_now, caller);
            let mut outcome = OpenOutcome::default();
            let in_set = st
                .set
                .as_ref()
                .and_then(|s| s.index.get(&ino).map(|&i| i as usize));
            match in_set {
                Some(i) => {
                    if let Some(key) = key {
                        st.forget_needed(&key);
                    }
                    if st.record_open(i, seq, self.config.max_file_bytes) {
                        st.start_epoch(&self.stats.epoch_wasted_bytes);
                        outcome.boundary = true;
                    }
                }
                None => {
                    if st.building.is_some() && st.pending_opens.len() < MAX_SET_FILES {
                        st.pending_opens.push((ino, seq));
                    }
                    // The candidate root moves only on distinct files, so one file outside
                    // the set opened again and again (a label file) cannot widen it.
                    let new = !st.outside.contains_key(&ino);
                    if new && st.outside.len() < OUTSIDE_TRACKED {
                        st.outside.insert(ino, seq);
                        let candidate = match st.candidate {
                            None => parent,
                            Some(c) => common_ancestor(c, parent, |n| self.ns.parent_of(n)),
                        };
                        st.candidate = Some(candidate);
                    } else if let Some(at) = st.outside.get_mut(&ino) {
                        *at = seq;
                    }
                    let built = st.set.as_ref().map(|s| s.root) == st.candidate;
                    if !built
                        && st.building.is_none()
                        && st.outside.len() >= MIN_OPENS_TO_BUILD as usize
                    {
                        st.building = st.candidate;
                        outcome.build = st.candidate;
                    }
                }
            }
            outcome.idle = st.idle();
            outcome
        };
        if let Some(root) = outcome.build {
            let this = self.clone();
            tokio::spawn(async move { this.build_set(root).await });
        }
        if outcome.boundary {
            self.stats.epochs.fetch_add(1, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::Relaxed);
        }
        // An open that cannot give the scheduler work wakes nobody: waking the scheduler's
        // task costs a thread wake-up (a context switch on the open's path) per file, the
        // largest part of a warm open on a small machine.
        if !outcome.idle || outcome.build.is_some() || outcome.boundary {
            self.epoch_wake.notify_one();
        }
    }

    /// Enumerates the files under `root` and installs them as the epoch set.
    async fn build_set(self: Arc<Self>, mut root: u64) {
        loop {
            let Some(next) = self.build_set_once(root).await else {
                return;
            };
            root = next;
        }
    }

    /// One enumeration and install; the next root to enumerate if the candidate moved up
    /// meanwhile.
    async fn build_set_once(self: &Arc<Self>, root: u64) -> Option<u64> {
        // First the directories listed already (every one the reader opened a file in), so
        // fetching starts now rather than after the whole tree is listed (200 directories
        // behind a 30 ms store took a second); the full set replaces it when listed.
        let result = match self.enumerate_listed(root) {
            Ok((listed, true)) => Ok(listed),
            Ok((listed, false)) => {
                if !listed.inos.is_empty() {
                    let mut st = self.epoch.lock();
                    st.install(
                        EpochSet::new(root, self.ns.relative_path(root), listed),
                        self.config.max_file_bytes,
                    );
                    drop(st);
                    self.generation.fetch_add(1, Ordering::Relaxed);
                    self.epoch_wake.notify_one();
                }
                self.enumerate(root).await
            }
            Err(e) => Err(e),
        };
        let rebuild = {
            let mut st = self.epoch.lock();
            st.building = None;
            match result {
                Ok(listed) => {
                    st.install(
                        EpochSet::new(root, self.ns.relative_path(root), listed),
                        self.config.max_file_bytes,
                    );
                    st.note = None;
                    self.stats.epoch_sets.fetch_add(1, Ordering::Relaxed);
                }
                Err(note) => {
                    tracing::debug!(%note, "epoch prefetch: no set");
                    st.note = Some(note);
                    st.pending_opens.clear();
                }
            }
            // The candidate moved up while this one was enumerated: enumerate again.
            match st.candidate {
                Some(c) if Some(c) != st.set.as_ref().map(|s| s.root) && c != root => {
                    st.building = Some(c);
                    Some(c)
                }
                _ => None,
            }
        };
        self.generation.fetch_add(1, Ordering::Relaxed);
        self.epoch_wake.notify_one();
        rebuild
    }

    /// The files under `root` (inodes and sizes), directory by directory in listing order.
    async fn enumerate(&self, root: u64) -> Result<Listed, String> {
        let mut out = Listed::default();
        let mut level = vec![root];
        while !level.is_empty() {
            let listings: Vec<_> = futures::stream::iter(level)
                .map(|dir| async move { (dir, self.ns.readdir(dir).await) })
                .buffered(LIST_CONCURRENCY)
                .collect()
                .await;
            let mut next = Vec::new();
            for (dir, listing) in listings {
                if self.is_stopped() {
                    return Err("stopped".into());
                }
                let entries =
                    listing.map_err(|e| format!("listing {}: {e}", self.ns.key_of(dir)))?;
                self.add_listed(&mut out, &entries, &mut next);
                if out.inos.len() > MAX_SET_FILES {
                    return Err(self.too_large(root));
                }
            }
            level = next;
        }
        Ok(out)
    }

    /// The files under `root` in the directories whose listings the namespace holds now (no
    /// I/O), and whether that was every directory under it. The directories a reader has
    /// opened files in are listed already, so this set can be fetched from at once while the
    /// rest of the tree is listed ([`Self::build_set_once`]).
    fn enumerate_listed(&self, root: u64) -> Result<(Listed, bool), String> {
        let mut out = Listed::default();
        let mut complete = true;
        let mut level = vec![root];
        while !level.is_empty() {
            let mut next = Vec::new();
            for dir in level {
                let Some(entries) = self.ns.readdir_cached(dir) else {
                    complete = false;
                    continue;
                };
                self.add_listed(&mut out, &entries, &mut next);
                if out.inos.len() > MAX_SET_FILES {
                    return Err(self.too_large(root));
                }
            }
            level = next;
        }
        Ok((out, complete))
    }

    fn too_large(&self, root: u64) -> String {
        format!(
            "{} holds more than {MAX_SET_FILES} files; epoch prefetch is off for it",
            self.ns.key_of(root)
        )
    }

    /// Appends one directory's listing to `out`: its files as the next directory range, its
    /// subdirectories to `next`.
    fn add_listed(
        &self,
        out: &mut Listed,
        entries: &[crate::namespace::DirEntry],
        next: &mut Vec<u64>,
    ) {
        let d = out.dirs.len() as u32;
        let start = out.inos.len() as u32;
        let mut bytes = 0;
        for e in entries.iter() {
            match self.ns.cached_attr(e.ino()).map(|a| a.kind) {
                Ok(Kind::Dir) => next.push(e.ino()),
                Ok(Kind::File { size, .. }) => {
                    out.inos.push(e.ino());
                    out.sizes.push(size);
                    out.dir_of.push(d);
                    bytes += size;
                }
                Err(_) => {}
            }
        }
        out.dirs.push(DirRange {
            start,
            end: out.inos.len() as u32,
            drawn: false,
            bytes,
        });
    }

    /// Bytes the set's cached unopened files may take: the NVMe cache less 1/[`DEMAND_RESERVE`]
    /// of it, or the prefetch byte budget in memory.
    fn epoch_room(&self) -> u64 {
        match self.fetcher.disk() {
            Some(disk) => {
                let limit = disk.cache().limit();
                limit - limit / DEMAND_RESERVE
            }
            None => self.config.byte_budget,
        }
    }

    /// Whether `obj` is whole where it stays: on the NVMe cache when there is one (blocks only
    /// in the memory tier are gone soon and are not counted against the room), else in memory.
    fn held(&self, obj: &Arc<ObjectVersion>) -> bool {
        match self.fetcher.disk() {
            Some(disk) => disk.cache().is_complete(&disk.identity(obj)),
            None => self.fetcher.is_cached(obj),
        }
    }

    /// Rebuilds the needed map after an install or a boundary: every cached file of the set
    /// not opened in this epoch. The cache checks run without the lock.
    async fn rebuild_needed(&self) {
        let (inos, epoch) = {
            let mut st = self.epoch.lock();
            st.needs_rebuild = false;
            let Some(set) = st.set.as_ref() else {
                return;
            };
            (set.inos.clone(), st.epoch)
        };
        let mut found = Vec::new();
        for chunk in inos.chunks(4096) {
            for &ino in chunk {
                let Some(obj) = self.known_file(ino) else {
                    continue;
                };
                if self.held(&obj) {
                    if let Some(key) = self.entry_key(&obj) {
                        found.push((ino, key, obj.size));
                    }
                }
            }
            tokio::task::yield_now().await;
        }
        let mut st = self.epoch.lock();
        if st.epoch != epoch || st.needs_rebuild {
            return; // another boundary or install meanwhile: its own rebuild follows
        }
        let Some(set) = st.set.as_ref() else {
            return;
        };
        // Files opened in this epoch (also those opened while this ran) are not needed; what
        // in-flight prefetches added since is kept.
        let epoch_start = st.epoch_start;
        let unopened = |ino: &u64| {
            set.index
                .get(ino)
                .is_none_or(|&i| set.opened_at[i as usize] <= epoch_start)
        };
        let mut needed: HashMap<EntryKey, u64> = found
            .into_iter()
            .filter(|(ino, _, _)| unopened(ino))
            .map(|(_, key, size)| (key, size))
            .collect();
        for (key, size) in st.needed.drain() {
            needed.entry(key).or_insert(size);
        }
        st.needed_bytes = needed.values().sum();
        st.needed = needed;
        drop(st);
        // The eviction policy re-asks about every entry: those it holds as "not needed" (the
        // last epoch's, read since) are needed again. Without this they stayed in its
        // not-needed order until touched and went first, before files read in this epoch.
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    /// The epoch prefetch scheduler: keeps fetching unopened, uncached files of the set while
    /// the allowance and the room allow, up to the prefetch concurrency.
    pub(super) async fn epoch_schedule(self: Arc<Self>) {
        loop {
            let notified = self.epoch_wake.notified();
            if self.is_stopped() {
                return;
            }
            if self.plan.lock().is_none() {
                if self.epoch.lock().needs_rebuild {
                    self.rebuild_needed().await;
                }
                if self.epoch_fill().again {
                    continue;
                }
            }
            notified.await;
        }
    }

    /// Starts what the allowance, the room and the concurrency allow.
    ///
    /// While a call holds candidates it has taken from the cursor, `filling` counts it, so
    /// neither [`EpochState::idle`] nor a caller waiting for quiet mistakes it for no work.
    fn epoch_fill(self: &Arc<Self>) -> Fill {
        let fill = self.epoch_fill_batch();
        let mut st = self.epoch.lock();
        st.filling = st.filling.saturating_sub(fill.counted as usize);
        fill
    }

    fn epoch_fill_batch(self: &Arc<Self>) -> Fill {
        let room = self.epoch_room();
        let max_bytes = self.config.max_file_bytes;
        let mut fill = Fill::default();
        if self.plan.lock().is_some() {
            return fill; // a plan knows the order: it wins
        }
        let batch = {
            let mut st = self.epoch.lock();
            let free_slots = st
                .concurrency(self.config.concurrency)
                .saturating_sub(st.in_flight);
            if free_slots == 0 {
                return fill;
            }
            let batch = st.candidates(free_slots.min(256));
            st.filling += 1;
            fill.counted = true;
            batch
        };
        let mut batch = batch.into_iter();
        while let Some((i, ino)) = batch.next() {
            let Some(obj) = self.known_file(ino) else {
                fill.again = true;
                continue;
            };
            let key = self.entry_key(&obj);
            if self.held(&obj) {
                if let Some(key) = key {
                    let mut st = self.epoch.lock();
                    let epoch_start = st.epoch_start;
                    let unopened = st
                        .set
                        .as_ref()
                        .is_some_and(|s| s.opened_at.get(i).is_some_and(|&at| at <= epoch_start));
                    if unopened && st.add_needed(key, obj.size) {
                        fill.newly_needed = true;
                    }
                }
                fill.again = true;
                continue;
            }
            let bytes = obj.size.min(max_bytes);
            let epoch = {
                let mut st = self.epoch.lock();
                let epoch = st.epoch;
                let epoch_start = st.epoch_start;
                let limit = st.limit();
                let over = st.ahead_bytes.saturating_add(bytes) > limit
                    || st.needed_bytes.saturating_add(bytes) > room;
                let Some(set) = st.set.as_mut() else {
                    return fill;
                };

                if set.inos.get(i) != Some(&ino)
                    || set.opened_at[i] > epoch_start
                    || set.flags[i] & AHEAD != 0
                {
                    continue;
                }
                if over {
                    // Come back to this file when the reader has opened more (or freed room).
                    st.retry.push((i, ino));
                    st.retry.extend(batch);
                    fill.again = false;
                    drop(st);
                    if fill.newly_needed {
                        self.generation.fetch_add(1, Ordering::Relaxed);
                    }
                    return fill;
                }
                set.flags[i] |= AHEAD;
                st.ahead_bytes += bytes;
                st.ahead_files += 1;
                st.in_flight += 1;
                st.fetched_this_epoch += 1;
                st.fetched_bytes_this_epoch += bytes;
                if let Some(key) = key {
                    st.add_needed(key, obj.size);
                }
                epoch
            };
            fill.started += 1;
            let this = self.clone();
            tokio::spawn(async move { this.epoch_fetch(epoch, (i, ino), obj, key, bytes).await });
        }
        if fill.newly_needed {
            self.generation.fetch_add(1, Ordering::Relaxed);
        }
        fill
    }

    async fn epoch_fetch(
        self: Arc<Self>,
        epoch: u64,
        (i, ino): (usize, u64),
        obj: Arc<ObjectVersion>,
        key: Option<EntryKey>,
        bytes: u64,
    ) {
        let result = if self.is_stopped() {
            Err(crate::fetch::FetchError::Cancelled)
        } else {
            let blocks = 0..obj
                .size
                .min(self.config.max_file_bytes)
                .div_ceil(self.fetcher.config().block_size);
            self.fetcher
                .fetch_background(&obj, blocks, Priority::Prefetch)
                .await
        };
        {
            let mut st = self.epoch.lock();
            st.in_flight = st.in_flight.saturating_sub(1);
            match &result {
                Ok(()) => {
                    self.stats.epoch_fetched.fetch_add(1, Ordering::Relaxed);
                    self.stats
                        .epoch_fetched_bytes
                        .fetch_add(bytes, Ordering::Relaxed);
                }
                Err(e) => {
                    self.stats.epoch_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(key = %obj.key, error = %e, "epoch prefetch failed");
                    if st.epoch == epoch {
                        let epoch_start = st.epoch_start;
                        let mut undo = false;
                        if let Some(set) = st.set.as_mut() {
                            // `i` is of the set the fetch started under; a set installed
                            // since has other indexes.
                            if set.inos.get(i) == Some(&ino)
                                && set.flags[i] & AHEAD != 0
                                && set.opened_at[i] <= epoch_start
                            {
                                set.flags[i] &= !AHEAD;
                                undo = true;
                            }
                        }
                        if undo {
                            st.ahead_bytes = st.ahead_bytes.saturating_sub(bytes);
                            st.ahead_files = st.ahead_files.saturating_sub(1);
                        }
                        if let Some(key) = key {
                            st.forget_needed(&key);
                        }
                    }
                }
            }
        }
        self.epoch_wake.notify_one();
    }

    /// The epoch section of `riffle stats`.
    pub(super) fn epoch_json(&self) -> serde_json::Value {
        let s = &self.stats;
        let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        let plan_active = self.plan.lock().is_some();
        let st = self.epoch.lock();
        let set = st.set.as_ref();
        json!({
            "enabled": self.config.epoch_prefetch,
            "active": set.is_some() && !plan_active,
            "root": set.map(|s| if s.root_path.is_empty() { "/".to_string() } else { s.root_path.clone() }),
            "files": set.map_or(0, |s| s.inos.len()),
            "bytes": set.map_or(0, |s| s.total_bytes),
            "directories": set.map_or(0, |s| s.dirs.len()),
            "directories_drawn_from": set.map_or(0, |s| s.drawn.len()),
            "files_drawn_from": set.map_or(0, |s| s.drawn_files),
            "bytes_drawn_from": set.map_or(0, |s| s.drawn_bytes),
            "epoch": st.epoch,
            "opened_files": st.opened_files,
            "opened_bytes": st.opened_bytes,
            "fetched_ahead_files": st.fetched_this_epoch,
            "fetched_ahead_bytes": st.fetched_bytes_this_epoch,
            "ahead_unopened_files": st.ahead_files,
            "ahead_unopened_bytes": st.ahead_bytes,
            "fetching": st.in_flight,
            "cached_unopened_bytes": st.needed_bytes,
            "mode": st.trust.as_str(),
            "last_usefulness": st.last_usefulness,
            "note": st.note,
            "total_fetched_files": load(&s.epoch_fetched),
            "total_fetched_bytes": load(&s.epoch_fetched_bytes),
            "wasted_bytes": load(&s.epoch_wasted_bytes),
            "errors": load(&s.epoch_errors),
            "epochs_started": load(&s.epochs),
        })
    }
}

#[cfg(test)]
mod tests;
