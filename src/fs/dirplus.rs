//! Whether a directory read hands the kernel every entry's attributes (`readdirplus`) or
//! only the names, learned from what the reader does next.
//!
//! # Why
//! With `readdirplus`, the kernel turns every entry of a reply into a dentry and an inode
//! (about a kilobyte of kernel memory each). That saves one `LOOKUP` round trip per file for a
//! reader that `stat`s what it lists (`ls -l`, `du`, `find -printf %s`), and costs a reader
//! that only wants the names (`find -type f`, `os.walk`, `os.scandir` with `d_type`,
//! ImageFolder's scan, `glob`) the inodes it never uses. Linux asks for `readdirplus` at the
//! first read of every directory (offset 0) and, with `FUSE_READDIRPLUS_AUTO`, later in the
//! same directory only after a lookup of one of its children; since Linux 6.16 the first
//! read asks for as many entries as the reader's buffer holds, so a directory of 1,000 files
//! comes back in one `readdirplus` and all 1,000 inodes are made. Measured on W4's 1.1 million
//! objects after a remount (listings from disk, page cache dropped): `find -type f` took
//! 3.4–4.8 s with attributes, 1.06–1.07 s with names only (`find` spent its time in the
//! kernel making inodes); a stat of every file took 8.2–9.8 s with attributes and 37–40 s
//! with names only (a `LOOKUP` round trip per file).
//!
//! # The rule
//! The first read of a directory (a `readdirplus` at offset 0) is answered with the
//! attributes when the mount's readers have lately been `stat`ing what they list ("stat
//! mode"), else with only `.` and `..` (which the kernel does not make inodes for): the
//! kernel then asks for the rest with a plain `readdir`, one round trip more per directory.
//! Such a names-only read is a **probe**: the lookups of that directory's files that reach
//! the daemon are counted (the kernel sends a lookup only for a name it has no dentry for,
//! so each is a reader wanting a file's inode). At the next directory's first read the probe
//! gives its verdict: [`STAT_LOOKUPS`] lookups or more (or all its files, when it has fewer)
//! mean stat mode, fewer mean names mode; a probe of a directory without files has no
//! verdict. In stat mode every [`PROBE_EVERY`]th first read is a probe again, so a mount
//! whose readers stop `stat`ing goes back to names (attributes handed out leave nothing to
//! observe: a `stat` of an inode the kernel has is not sent). A `readdirplus` at another
//! offset is sent only after the reader looked up a child of that directory, so it always
//! gets the attributes.
//!
//! So `find -type f`, `os.walk` and an ImageFolder scan get names only; a `stat`-every-file
//! walk pays a round trip per file in one directory of [`PROBE_EVERY`] and gets the
//! attributes for the rest. With several readers at once the verdict follows whichever
//! directory was read last, a heuristic that can only cost time, never change an answer.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

/// Lookups of a probe directory's files that mean its reader `stat`s what it lists.
pub const STAT_LOOKUPS: u64 = 8;

/// In stat mode, one first read in this many is a probe.
pub const PROBE_EVERY: u64 = 32;

/// What a directory's first read answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FirstRead {
    /// Every entry with its attributes.
    WithAttrs,
    /// Only `.` and `..`; the kernel reads the names with `readdir`.
    NamesOnly,
}

/// The learned state (module documentation).
#[derive(Debug, Default)]
pub struct DirPlus {
    /// The directory being probed (0: none) and the lookups of its files so far.
    probe_ino: AtomicU64,
    probe_lookups: AtomicU64,
    state: Mutex<State>,
    stat_mode: AtomicBool,
    /// First reads answered each way (for `riffle stats`).
    pub with_attrs: AtomicU64,
    pub names_only: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    /// Files in the directory being probed.
    probe_files: u64,
    /// First reads with attributes since the last probe.
    since_probe: u64,
}

impl DirPlus {
    /// The answer to the first read (offset 0) of directory `ino`, which has `files` files.
    pub fn first_read(&self, ino: u64, files: u64) -> FirstRead {
        let mut state = self.state.lock();
        let probed = self.probe_ino.load(Ordering::Acquire);
        if probed != 0 && probed != ino && state.probe_files > 0 {
            let lookups = self.probe_lookups.load(Ordering::Acquire);
            let stat = lookups >= STAT_LOOKUPS.min(state.probe_files);
            self.stat_mode.store(stat, Ordering::Relaxed);
        }
        if self.stat_mode.load(Ordering::Relaxed) && state.since_probe + 1 < PROBE_EVERY {
            state.since_probe += 1;
            self.with_attrs.fetch_add(1, Ordering::Relaxed);
            return FirstRead::WithAttrs;
        }
        state.since_probe = 0;
        state.probe_files = files;
        self.probe_lookups.store(0, Ordering::Release);
        self.probe_ino.store(ino, Ordering::Release);
        self.names_only.fetch_add(1, Ordering::Relaxed);
        FirstRead::NamesOnly
    }

    /// A lookup of a file in directory `parent` reached the daemon.
    pub fn looked_up_file(&self, parent: u64) {
        if self.probe_ino.load(Ordering::Relaxed) == parent {
            self.probe_lookups.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether first reads carry attributes now.
    pub fn stat_mode(&self) -> bool {
        self.stat_mode.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A walker reading directories 100.. with `files` files each, looking up `stats` of each.
    fn walk(plus: &DirPlus, dirs: std::ops::Range<u64>, files: u64, stats: u64) -> Vec<FirstRead> {
        dirs.map(|d| {
            let answer = plus.first_read(d, files);
            if answer == FirstRead::NamesOnly {
                for _ in 0..stats {
                    plus.looked_up_file(d);
                }
            }
            answer
        })
        .collect()
    }

    #[test]
    fn a_walker_that_only_wants_names_never_gets_attributes() {
        let plus = DirPlus::default();
        let answers = walk(&plus, 100..1100, 1000, 0);
        assert!(answers.iter().all(|a| *a == FirstRead::NamesOnly));
        assert!(!plus.stat_mode());
        assert_eq!(plus.names_only.load(Ordering::Relaxed), 1000);
    }

    #[test]
    fn a_stat_walker_gets_attributes_but_for_one_probe_in_thirty_two() {
        let plus = DirPlus::default();
        let answers = walk(&plus, 100..1124, 1000, 1000);
        assert_eq!(
            answers[0],
            FirstRead::NamesOnly,
            "the first directory is a probe"
        );
        assert_eq!(answers[1], FirstRead::WithAttrs);
        let probes = answers
            .iter()
            .filter(|a| **a == FirstRead::NamesOnly)
            .count();
        assert_eq!(probes, 1024 / PROBE_EVERY as usize);
        assert!(plus.stat_mode());
    }

    #[test]
    fn stat_mode_ends_at_the_first_probe_without_lookups() {
        let plus = DirPlus::default();
        walk(&plus, 100..200, 1000, 1000);
        assert!(plus.stat_mode());
        let answers = walk(&plus, 200..300, 1000, 0);
        let first_probe = answers
            .iter()
            .position(|a| *a == FirstRead::NamesOnly)
            .expect("a probe within 32 directories");
        assert!(first_probe < PROBE_EVERY as usize);
        assert!(answers[first_probe..]
            .iter()
            .all(|a| *a == FirstRead::NamesOnly));
        assert!(!plus.stat_mode());
    }

    #[test]
    fn small_directories_count_all_their_files_and_empty_ones_give_no_verdict() {
        let plus = DirPlus::default();
        // Three files, all stat'ed: fewer than STAT_LOOKUPS, but all of them.
        walk(&plus, 100..101, 3, 3);
        // A directory of subdirectories only: no verdict of its own.
        assert_eq!(plus.first_read(101, 0), FirstRead::WithAttrs);
        assert!(plus.stat_mode());
        let plus = DirPlus::default();
        walk(&plus, 100..101, 3, 2);
        assert_eq!(plus.first_read(101, 3), FirstRead::NamesOnly);
        assert!(!plus.stat_mode());
    }

    #[test]
    fn lookups_elsewhere_do_not_count() {
        let plus = DirPlus::default();
        assert_eq!(plus.first_read(100, 1000), FirstRead::NamesOnly);
        for _ in 0..100 {
            plus.looked_up_file(7);
        }
        assert_eq!(plus.first_read(101, 1000), FirstRead::NamesOnly);
        assert!(!plus.stat_mode());
    }
}
