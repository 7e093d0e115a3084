//! What the fetcher's memory budget holds when it reads many small objects: the heap bytes
//! really allocated stay within the budget, whatever the blocks' sizes.
//!
//! 60,000 objects of 1–4 KiB are read whole, once each, through a [`Fetcher`] over the
//! in-memory store, with a block cache of 16 MiB and 16 MiB for GETs in flight, and the
//! heap bytes the fetcher holds afterwards are counted: what dropping it gives back (a
//! counting global allocator; this test binary runs nothing else). Every block it keeps was fetched and sits in the memory
//! cache, which is full: what it holds must be within its capacity plus the fixed part
//! (the in-flight table, the semaphores, the cache's own tables), however many objects
//! went through it. Before issue 46 each 2.5 KB block was received into a 4 KiB-aligned
//! buffer (4 KiB, and as much again in glibc's alignment slack) while the cache counted
//! its 2.5 KB, and moka's own bookkeeping per entry was not counted at all: the cache held
//! about twice its capacity (and eight times in RSS).
//!
//! Deterministic: the same objects give the same allocations.

use std::sync::Arc;

use rifflefs::fetch::{FetchConfig, Fetcher, ObjectVersion};
use rifflefs::store::memory::MemoryStore;
use rifflefs::store::ObjectStore;

#[path = "common/counting_alloc.rs"]
mod counting_alloc;

#[global_allocator]
static ALLOCATOR: counting_alloc::Counting = counting_alloc::Counting;

const OBJECTS: usize = 60_000;
const CACHE: u64 = 16 << 20;
/// What the fetcher may hold besides its block cache's capacity: its tables and the cache's
/// fixed structures.
const FIXED: isize = 2 << 20;

fn size_of(i: usize) -> usize {
    1024 + (i * 7_919) % 3_072
}

#[test]
fn small_blocks_in_memory_stay_within_the_budget() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let store = Arc::new(MemoryStore::new());
    // Keys and ETags only: each read gets a fresh object version, as an open does, so what
    // the cache keeps alive of it counts.
    let objects: Vec<(String, String)> = (0..OBJECTS)
        .map(|i| {
            let key = format!("d{:03}/f{i:07}", i % 100);
            let etag = store.put(&key, vec![(i % 251) as u8; size_of(i)]);
            (key, etag)
        })
        .collect();
    let shared: Arc<dyn ObjectStore> = store.clone();
    let fetcher = Fetcher::new(
        shared,
        FetchConfig {
            block_size: 1 << 20,
            max_part_blocks: 8,
            max_inflight: 64,
            inflight_memory: CACHE,
            block_cache_bytes: CACHE,
        },
        runtime.handle().clone(),
        None,
    );
    let mut content = 0u64;
    runtime.block_on(async {
        for (i, (key, etag)) in objects.iter().enumerate() {
            let obj = Arc::new(ObjectVersion {
                key: Arc::from(key.as_str()),
                etag: Arc::from(etag.as_str()),
                size: size_of(i) as u64,
            });
            let data = fetcher.read(&obj, 0..obj.size).await.expect("read");
            assert_eq!(data.len() as u64, obj.size);
            content += obj.size;
        }
    });
    // What the fetcher holds is what dropping it gives back (the store keeps a log of the
    // GETs it answered, which is not the fetcher's).
    let live = counting_alloc::live();
    drop(fetcher);
    let held = live - counting_alloc::live();
    drop(store);
    println!(
        "read {OBJECTS} objects ({} MB): the fetcher holds {} KiB of heap (block cache capacity {} KiB)",
        content / 1_000_000,
        held >> 10,
        CACHE >> 10
    );
    assert!(
        content > 4 * CACHE,
        "the objects must overflow the cache several times"
    );
    assert!(
        held <= CACHE as isize + FIXED,
        "the fetcher holds {held} bytes of heap for a budget of {CACHE} (+ {FIXED} fixed)"
    );
}
