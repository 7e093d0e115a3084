//! Memory per listed object: the namespace of a 250,000-object tree (ImageNet's shape: 1,000
//! class directories of 250 JPEG names), listed completely, measured as the heap bytes the
//! namespace holds (a counting global allocator; this test binary runs nothing else).
//!
//! Deterministic: the same tree gives the same allocations. The bounds, 150 bytes per listed
//! object with ImageNet's 20-byte names and 100 with names of up to 15 bytes (kept inside the
//! node), are what a node serving 10 million objects can afford for its names; a change that
//! makes per-object state bigger fails here first. (Heap bytes asked for: the allocator's
//! own rounding comes on top, so the process's RSS grows by somewhat more; the test prints
//! that too, without judging it.)

use std::sync::Arc;

use rifflefs::namespace::{MetadataTtl, Namespace, ROOT_INO};
use rifflefs::store::memory::MemoryStore;

#[path = "common/counting_alloc.rs"]
mod counting_alloc;

#[global_allocator]
static ALLOCATOR: counting_alloc::Counting = counting_alloc::Counting;

/// The process's resident set, from /proc/self/status.
fn rss_bytes() -> isize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<isize>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

const DIRS: usize = 1_000;
const FILES_PER_DIR: usize = 250;

/// Lists a tree of `DIRS` directories of `FILES_PER_DIR` files named by `name(d, f)` under
/// `train/` and returns the heap bytes the namespace holds per listed object.
async fn listed_bytes_per_object(name: impl Fn(usize, usize) -> String) -> isize {
    let store = Arc::new(MemoryStore::new());
    for d in 0..DIRS {
        for f in 0..FILES_PER_DIR {
            store.put(&format!("train/{}", name(d, f)), Vec::new());
        }
    }
    let rss_before = rss_bytes();
    let before = counting_alloc::live();
    let ns = Namespace::new(store.clone(), "", MetadataTtl::Indefinite);
    let train = ns.lookup(ROOT_INO, "train").await.expect("train/");
    let classes = ns.readdir(train.ino).await.expect("list train/");
    assert_eq!(classes.len(), DIRS);
    let mut files = 0;
    for class in classes.iter() {
        files += ns.readdir(class.ino()).await.expect("list a class").len();
    }
    drop(classes);
    let held = counting_alloc::live() - before;
    let objects = (DIRS + files) as isize;
    assert_eq!(files, DIRS * FILES_PER_DIR);
    let per_object = held / objects;
    println!(
        "namespace of {objects} listed objects: {} MiB, {per_object} bytes per object (RSS grew by {} bytes per object)",
        held >> 20,
        (rss_bytes() - rss_before) / objects
    );
    drop(ns);
    per_object
}

/// ImageNet's names (`n01440764_10026.JPEG`: 20 bytes, kept on the heap), then names of up
/// to 15 bytes (W4's `obj-0123`, W7's `f0000001`), kept inside their nodes: the goal of
/// issue 46, at most 100 bytes per listed object (a 10^7-object tree in 1 GB). One test, so
/// the two measurements never run at once in this binary.
#[tokio::test(flavor = "current_thread")]
async fn a_listed_object_costs_the_namespace_little() {
    let per_object = listed_bytes_per_object(|d, f| format!("n{d:08}/n{d:08}_{f:05}.JPEG")).await;
    assert!(per_object <= 150, "{per_object} bytes per listed object");
    let short = listed_bytes_per_object(|d, f| format!("p{d:04}/obj-{f:04}")).await;
    assert!(
        short <= 100,
        "{short} bytes per listed object with short names"
    );
}
