//! Unit tests of the epoch policy: classes, boundaries (announced, detected, forced), hot
//! entries and victims that could not be evicted.

use std::time::{Duration, SystemTime};

use super::*;
use crate::cache::simulate::{simulate, SimOptions, Workload};

fn k(n: u32) -> EntryKey {
    // Spread over the fingerprint like real keys (SHA-256 prefixes) would be.
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&(u64::from(n).wrapping_mul(0x9E37_79B9_7F4A_7C15)).to_le_bytes());
    b[8..12].copy_from_slice(&n.to_le_bytes());
    EntryKey(b)
}

/// Slot `n` holds key `k(n)`.
struct K;

impl SlotKeys for K {
    fn key_of(&self, at: Slot) -> EntryKey {
        k(at)
    }
}

fn ins(p: &mut EpochPolicy, n: u32) {
    p.insert(
        n,
        &EntryInfo {
            key: k(n),
            bytes: 1,
            last_used: None,
        },
        &K,
    );
}

fn ins_found(p: &mut EpochPolicy, n: u32, age_s: u64) {
    p.insert(
        n,
        &EntryInfo {
            key: k(n),
            bytes: 1,
            last_used: Some(SystemTime::now() - Duration::from_secs(age_s)),
        },
        &K,
    );
}

fn keys(v: &[u32]) -> Vec<Slot> {
    v.to_vec()
}

/// `count` accesses of other objects.
fn others(p: &mut EpochPolicy, from: u32, count: u32) {
    for n in from..from + count {
        ins(p, n);
        p.remove(n);
    }
}

/// Spaces accesses out so that none continues the previous one.
fn filler(p: &mut EpochPolicy, from: u32) {
    others(p, from, CONTINUE_WINDOW as u32);
}

/// Writes that land long after the reads that fetched them (a disk lagging behind the
/// store) are not accesses: they end no epoch and count nothing, while the same calls as
/// `touch` (reads) do end it.
#[test]
fn late_fills_do_not_look_like_the_next_epoch() {
    let run = |as_fill: bool| {
        let mut p = EpochPolicy::new();
        for n in 0..200 {
            ins(&mut p, n);
        }
        filler(&mut p, 10_000);
        others(&mut p, 20_000, 300);
        for n in 0..100 {
            if as_fill {
                p.filled(n, &K);
            } else {
                p.touch(n, &K);
            }
        }
        // Read (filled) before and not since: still this epoch's, or the last one's.
        p.class(150)
    };
    assert_eq!(run(true), Some(EpochClass::Done), "one epoch so far");
    assert_eq!(
        run(false),
        Some(EpochClass::Pending),
        "as reads, the same calls start the next epoch"
    );
}

#[test]
fn done_entries_go_newest_first_and_found_entries_before_them() {
    let mut p = EpochPolicy::new();
    for n in 1..=4 {
        ins(&mut p, n);
    }
    // All read in this epoch: the newest first.
    assert_eq!(p.order(), keys(&[4, 3, 2, 1]));
    assert_eq!(p.class(1), Some(EpochClass::Done));
    // Found on disk at start-up: stale, before everything, in the scan's order (newest
    // handed over first, so each goes to the cold end).
    ins_found(&mut p, 9, 10);
    ins_found(&mut p, 8, 20);
    assert_eq!(p.class(8), Some(EpochClass::Stale));
    assert_eq!(p.order(), keys(&[8, 9, 4, 3, 2, 1]));
    // A found entry that is read joins this epoch.
    p.touch(9, &K);
    assert_eq!(p.order(), keys(&[8, 9, 4, 3, 2, 1]));
    assert_eq!(p.class(9), Some(EpochClass::Done));
    assert_eq!(p.victim(&K, &mut |_| true), Some(8));
    p.remove(8);
    assert_eq!(p.victim(&K, &mut |_| true), Some(9));
    // Pinned (not evictable) entries are skipped and keep their place.
    assert_eq!(p.victim(&K, &mut |at| at != 9 && at != 4), Some(3));
    p.remove(3);
    assert_eq!(p.order(), keys(&[9, 4, 2, 1]));
    assert_eq!(p.victim(&K, &mut |_| false), None);
    for n in [9, 4, 2, 1] {
        p.remove(n);
    }
    assert!(p.is_empty());
    assert!(p.order().is_empty());
    assert!(p.memory_bytes() > 0);
}

#[test]
fn boundaries_are_announced_or_detected_and_make_old_entries_stale() {
    let mut p = EpochPolicy::new();
    for n in 1..=3 {
        ins(&mut p, n);
    }
    p.new_epoch();
    // Read last epoch, not yet in this one: pending, after anything done in this one.
    assert_eq!(p.class(1), Some(EpochClass::Pending));
    ins(&mut p, 4);
    p.touch(2, &K);
    assert_eq!(p.order(), keys(&[2, 4, 3, 1]));
    p.new_epoch();
    // 1 and 3 were not read for a whole epoch: stale, least recently used first.
    assert_eq!(p.class(1), Some(EpochClass::Stale));
    assert_eq!(p.order(), keys(&[1, 3, 2, 4]));
    assert_eq!(p.boundaries(), 2);

    // Detection: a pass over 100 objects, then the next pass in another order.
    let mut p = EpochPolicy::new();
    for n in 0..100 {
        ins(&mut p, n);
    }
    // Others read in between, so that the next pass is not a continuation: repeats count
    // only after at least as many accesses as there are entries.
    others(&mut p, 1000, 100);
    assert_eq!(p.boundaries(), 0);
    let second: Vec<u32> = (0..100).map(|n| (n * 37) % 100).collect();
    let mut detected_after = None;
    for (i, &n) in second.iter().enumerate() {
        p.touch(n, &K);
        if detected_after.is_none() && p.boundaries() == 1 {
            detected_after = Some(i + 1);
        }
    }
    // max(MIN_REPEATS, 200 sampled keys / 16) = 12 repeats end the epoch, and the
    // boundary is placed at the first of them: every object of the second pass is in the
    // new epoch.
    let threshold = MIN_REPEATS.max(200 / REPEAT_DIVISOR);
    assert_eq!(detected_after, Some(threshold));
    assert_eq!(p.boundaries(), 1);
    for &n in &second {
        assert_eq!(p.class(n), Some(EpochClass::Done), "{n}");
    }
}

#[test]
fn repeated_touches_are_one_access_and_frequent_entries_get_hot() {
    let mut p = EpochPolicy::new();
    ins(&mut p, 1);
    ins(&mut p, 2);
    // Block reads of an open file: one access, however many.
    for _ in 0..10 {
        p.touch(1, &K);
    }
    assert_eq!(p.class(1), Some(EpochClass::Done));
    assert_eq!(p.order(), keys(&[1, 2]));
    // Accessed three times in one epoch, far apart: hot, evicted last.
    filler(&mut p, 100);
    p.touch(1, &K);
    filler(&mut p, 200);
    p.touch(1, &K);
    assert_eq!(p.class(1), Some(EpochClass::HotDone));
    assert_eq!(p.order(), keys(&[2, 1]));
    // Stays hot across one boundary (hot-pending), loses it after an epoch without use.
    p.new_epoch();
    assert_eq!(p.class(1), Some(EpochClass::HotPending));
    p.new_epoch();
    assert_eq!(p.class(1), Some(EpochClass::Stale));
    p.touch(1, &K);
    assert_eq!(p.class(1), Some(EpochClass::Done));
}

#[test]
fn at_most_half_the_entries_are_hot() {
    let mut p = EpochPolicy::new();
    for n in 0..10 {
        ins(&mut p, n);
    }
    for round in 0..3 {
        for n in 0..10 {
            p.touch(n, &K);
            filler(&mut p, 1000 + round * 10_000 + n * 100);
        }
    }
    let hot = (0..10)
        .filter(|&n| p.class(n) == Some(EpochClass::HotDone))
        .count();
    assert_eq!(hot, 5);
}

#[test]
fn a_victim_that_could_not_be_evicted_is_not_offered_again_at_once() {
    let mut p = EpochPolicy::new();
    for n in 1..=3 {
        ins(&mut p, n);
    }
    assert_eq!(p.victim(&K, &mut |_| true), Some(3));
    // The cache failed to remove it (in use elsewhere) and touches it.
    p.touch(3, &K);
    assert_eq!(p.class(3), Some(EpochClass::Pending));
    assert_eq!(p.victim(&K, &mut |_| true), Some(2));
    p.remove(2);
    // An ordinary touch is an access again.
    p.touch(3, &K);
    assert_eq!(p.order(), keys(&[3, 1]));
}

#[test]
fn reads_of_prefetched_entries_do_not_end_epochs() {
    // Read-ahead 100 objects deep into a cache of 400: every object is written, then read
    // about 200 accesses later. The read is a second access, but far sooner than a next
    // pass could come back, so it is not a repeat; and the entry just read, not the ones
    // fetched ahead, is the next victim.
    let mut w = Workload::new(3000);
    w.epochs = vec![(0..3000).collect()];
    let opts = SimOptions {
        prefetch: 100,
        ..SimOptions::new(400)
    };
    let mut p = EpochPolicy::new();
    let r = simulate(&mut p, &w, &opts, &mut |_| {});
    assert_eq!(p.boundaries(), 0);
    assert_eq!(r.wasted, 0);
    assert_eq!(r.epochs[0].hits, 2999);
}

#[test]
fn a_reader_that_moves_on_to_other_data_ends_the_epoch() {
    // Dataset A (0..300) twice, then dataset B (300..1100), cache of 100.
    let a = Workload::shuffled(300, 2, 1).epochs;
    let mut w = Workload::new(1100);
    w.epochs = a.clone();
    w.epochs.push((300..800).collect());
    let opts = SimOptions::new(100);
    let mut p = EpochPolicy::new();
    simulate(&mut p, &w, &opts, &mut |_| {});
    // One boundary at A's second pass; B never repeats, but once it has had 1.5 times as
    // many objects as the last epoch (450), its epoch ends where B began.
    assert_eq!(p.boundaries(), 2);
    let class = |o: usize| p.class(o as u32);
    let old: Vec<usize> = (0..300).filter(|&o| class(o).is_some()).collect();
    assert!(!old.is_empty());
    assert!(old.iter().all(|&o| class(o) == Some(EpochClass::Pending)));
    assert_eq!(class(799), Some(EpochClass::Done));
    // At B's second pass, A is stale and goes first.
    w.epochs.push((300..800).collect());
    let mut p = EpochPolicy::new();
    let r = simulate(&mut p, &w, &opts, &mut |_| {});
    assert_eq!(p.boundaries(), 3);
    assert!((0..300).all(|o| p.class(o as u32).is_none()));
    // ... so B's third pass hits what the cache can hold.
    w.epochs.push((300..800).collect());
    let r3 = simulate(&mut EpochPolicy::new(), &w, &opts, &mut |_| {});
    assert!(r3.epochs[4].hits >= 95, "{:?} {:?}", r.epochs, r3.epochs);
}
