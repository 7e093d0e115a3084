//! Memory per cached object: the NVMe block cache's in-memory index in the W1 benchmark's
//! state (6,000 complete objects of about 110 KB, one short 1 MiB block each, every one used
//! within the last epoch), measured as the heap bytes the cache holds (a counting global
//! allocator; this test binary runs nothing else).
//!
//! The cache is driven as the daemon drives it: the default configuration and the default
//! eviction policy (`plan`, here with an oracle that has no plan, as before `riffle plan`);
//! every object written block by block as the fetcher does, then per object what an open
//! with passthrough does (pin, a block read, `open_complete`) and what its release drops.
//! Measured three times: live after that epoch, after a restart (the cache dropped and
//! reopened on the same directory, its scan finished), and after a second epoch over the
//! restarted cache.
//!
//! Deterministic: the same objects give the same allocations (the blocking pool's and the
//! runtime's own allocations are outside the measured spans up to a few hundred bytes). The
//! bound, 150 bytes per cached object, is what a node caching 10 million objects can afford;
//! a change that makes per-entry state bigger fails here first. (Heap bytes asked for: the
//! allocator's own rounding comes on top.)

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use rifflefs::cache::{
    make_policy, CacheConfig, DiskCache, EvictionKind, NoPlan, ObjectIdentity, PlanOracle,
    SizeLimit,
};

#[path = "common/counting_alloc.rs"]
mod counting_alloc;

#[global_allocator]
static ALLOCATOR: counting_alloc::Counting = counting_alloc::Counting;

use counting_alloc::live;

const OBJECTS: usize = 6_000;
/// The W1 objects' sizes: about 110 KB, varied.
fn size_of(i: usize) -> u64 {
    90_000 + (i as u64 * 7_919) % 40_000
}

/// What the namespace holds for one object (allocated before any measurement).
struct Listed {
    key: String,
    etag: Arc<str>,
    size: u64,
}

struct Objects {
    endpoint: Arc<str>,
    bucket: Arc<str>,
    listed: Vec<Listed>,
}

impl Objects {
    fn new() -> Self {
        Objects {
            endpoint: Arc::from("http://127.0.0.1:7480"),
            bucket: Arc::from("riffle-w1"),
            listed: (0..OBJECTS)
                .map(|i| Listed {
                    key: format!("train/n{:08}/n{:08}_{i:05}.JPEG", i / 250, i / 250),
                    etag: Arc::from(format!("{:032x}", i as u128 * 0x9e37_79b9_7f4a_7c15)),
                    size: size_of(i),
                })
                .collect(),
        }
    }

    /// The identity an open builds: a fresh key (as the FUSE layer makes per open), the
    /// namespace's ETag, the mount's endpoint and bucket.
    fn identity(&self, i: usize) -> ObjectIdentity {
        let l = &self.listed[i];
        ObjectIdentity::new(
            self.endpoint.clone(),
            self.bucket.clone(),
            Arc::<str>::from(l.key.as_str()),
            l.etag.clone(),
            l.size,
        )
    }
}

fn open_cache(dir: &std::path::Path) -> Arc<DiskCache> {
    // As `riffle mount` builds it: defaults, the `plan` policy with the scheduler's oracle.
    let oracle: Arc<dyn PlanOracle> = Arc::new(NoPlan);
    let policy = make_policy(EvictionKind::default(), Some(oracle));
    let mut config = CacheConfig::new(dir, SizeLimit::Percent(90.0));
    // No free-space floor: the test's disk may have less free than the default 5%.
    config.min_free = SizeLimit::Bytes(0);
    let cache = DiskCache::open_with_policy(config, policy).expect("open the cache");
    cache.wait_for_scan();
    cache
}

/// One epoch as the FUSE layer reads it with passthrough: per object, an open pins the entry
/// and tells the policy, the reader's first read looks the block up in the cache, the open
/// asks for the complete file to hand to the kernel; the release drops all of it.
async fn epoch(cache: &Arc<DiskCache>, objects: &Objects) {
    for i in 0..OBJECTS {
        let id = objects.identity(i);
        let pin = cache.pin(&id);
        let block = cache.read_block(&id, 0).await.expect("read");
        assert_eq!(block.map(|b| b.len() as u64), Some(id.size), "object {i}");
        let file = cache.open_complete(&id).await.expect("open_complete");
        assert!(file.is_some(), "object {i} is not complete");
        drop(file);
        drop(pin);
    }
}

fn report(what: &str, cache: &DiskCache, held: isize) -> isize {
    let per_object = held / OBJECTS as isize;
    let m = cache.index_memory();
    println!(
        "{what}: {held} heap bytes, {per_object} bytes per cached object \
         (index_memory: {} per object, {} entries, {} open, table {} B, open entries {} B)",
        m.per_object, m.entries, m.open_entries, m.table_bytes, m.open_bytes
    );
    per_object
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_object_costs_the_cache_index_little() {
    let dir = tempfile::tempdir().expect("tempdir");
    let objects = Objects::new();

    let before_open = live();
    let cache = open_cache(dir.path());
    let fixed = live() - before_open;
    let before = live();

    // The cold epoch: the fetcher writes every block it fetched.
    let t = Instant::now();
    for i in 0..OBJECTS {
        let id = objects.identity(i);
        let pin = cache.pin(&id);
        let fill = cache.pin_for_fill(&id);
        let data: Vec<u8> = (0..id.size).map(|b| (b as usize ^ i) as u8).collect();
        cache
            .write_block(&id, 0, Bytes::from(data))
            .await
            .expect("write");
        drop(fill);
        drop(pin);
    }
    let written = live() - before;
    println!(
        "wrote {OBJECTS} objects in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    report("after the cold epoch", &cache, written);

    let t = Instant::now();
    epoch(&cache, &objects).await;
    println!("warm epoch in {:.1} s", t.elapsed().as_secs_f64());
    let warm = report("after a warm epoch", &cache, live() - before);
    assert_eq!(cache.stats().complete_objects, OBJECTS as u64);

    // A restart on the same directory.
    drop(cache);
    let before = live();
    let cache = open_cache(dir.path());
    let restarted = report("after a restart", &cache, live() - before - fixed);
    assert_eq!(cache.stats().complete_objects, OBJECTS as u64);
    epoch(&cache, &objects).await;
    let rewarm = report(
        "after a warm epoch of the restarted cache",
        &cache,
        live() - before - fixed,
    );

    for (what, per_object) in [
        ("live", warm),
        ("after a restart", restarted),
        ("after a restart and an epoch", rewarm),
    ] {
        assert!(
            per_object <= 150,
            "{what}: {per_object} bytes per cached object"
        );
    }
    drop(cache);
}
