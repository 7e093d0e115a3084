use std::sync::atomic::Ordering;
use std::time::Duration;

use proptest::prelude::*;
use tokio::sync::oneshot;

use super::*;
use crate::store::memory::{Fault, MemoryStore, Op};

const BS: u64 = 1024;

fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn setup(
    config: FetchConfig,
    objects: &[(&str, Vec<u8>)],
) -> (Arc<MemoryStore>, Arc<Fetcher>, Vec<Arc<ObjectVersion>>) {
    let store = Arc::new(MemoryStore::new());
    let versions = objects
        .iter()
        .map(|(k, d)| {
            let etag = store.put(k, d.clone());
            Arc::new(ObjectVersion {
                key: Arc::from(*k),
                etag: Arc::from(etag.as_str()),
                size: d.len() as u64,
            })
        })
        .collect();
    let fetcher = Fetcher::new(
        store.clone(),
        config,
        tokio::runtime::Handle::current(),
        None,
    );
    (store, fetcher, versions)
}

fn small() -> FetchConfig {
    FetchConfig {
        block_size: BS,
        max_part_blocks: 4,
        max_inflight: 4,
        inflight_memory: 64 * BS,
        block_cache_bytes: 1 << 20,
    }
}

#[tokio::test]
async fn reads_across_blocks_and_clamps_at_the_end() {
    let body = data(10 * BS as usize + 17, 1);
    let (store, f, v) = setup(small(), &[("k", body.clone())]);
    let got = f.read(&v[0], 100..3 * BS + 5).await.unwrap();
    assert_eq!(&got[..], &body[100..3 * BS as usize + 5]);
    let tail = f.read(&v[0], 10 * BS..20 * BS).await.unwrap();
    assert_eq!(&tail[..], &body[10 * BS as usize..]);
    assert!(f.read(&v[0], 50 * BS..51 * BS).await.unwrap().is_empty());
    // Blocks 0..4 in one GET (a run of 4), block 10 in another.
    assert_eq!(store.count(Op::Get), 2);
    // Everything read is now cached.
    f.read(&v[0], 0..3 * BS).await.unwrap();
    assert_eq!(store.count(Op::Get), 2);
}

#[tokio::test]
async fn concurrent_readers_of_one_block_share_one_get() {
    let body = data(BS as usize, 2);
    let (store, f, v) = setup(small(), &[("k", body.clone())]);
    store.set_latency(Duration::from_millis(20));
    let reads: Vec<_> = (0..16)
        .map(|_| {
            let f = f.clone();
            let o = v[0].clone();
            tokio::spawn(async move { f.read(&o, 0..BS).await })
        })
        .collect();
    for r in reads {
        assert_eq!(&r.await.unwrap().unwrap()[..], &body[..]);
    }
    assert_eq!(store.count(Op::Get), 1);
}

#[tokio::test]
async fn prefetched_blocks_serve_later_reads() {
    let body = data(8 * BS as usize, 3);
    let (store, f, v) = setup(small(), &[("k", body.clone())]);
    f.prefetch(&v[0], 0..8);
    let got = f.read(&v[0], 0..8 * BS).await.unwrap();
    assert_eq!(&got[..], &body[..]);
    assert_eq!(store.count(Op::Get), 2, "two parts of four blocks");
    assert_eq!(f.stats().block_misses.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn a_replaced_object_fails_instead_of_mixing_versions() {
    let body = data(4 * BS as usize, 4);
    let (store, f, v) = setup(small(), &[("k", body.clone())]);
    assert_eq!(
        &f.read(&v[0], 0..BS).await.unwrap()[..],
        &body[..BS as usize]
    );
    store.inject(
        Op::Get,
        Fault::ReplaceWith(Bytes::from(data(4 * BS as usize, 9))),
    );
    assert_eq!(
        f.read(&v[0], 2 * BS..3 * BS).await,
        Err(FetchError::Changed)
    );
}

#[tokio::test]
async fn store_errors_reach_the_reader_and_are_not_cached() {
    let body = data(BS as usize, 5);
    let (store, f, v) = setup(small(), &[("k", body.clone())]);
    store.inject(Op::Get, Fault::Error(StoreError::AccessDenied("no".into())));
    assert!(matches!(
        f.read(&v[0], 0..10).await,
        Err(FetchError::Store(StoreError::AccessDenied(_)))
    ));
    assert_eq!(&f.read(&v[0], 0..10).await.unwrap()[..], &body[..10]);
}

#[tokio::test]
async fn concurrent_gets_stay_within_max_inflight() {
    let objects: Vec<(String, Vec<u8>)> = (0..20)
        .map(|i| (format!("o{i}"), data(BS as usize, i)))
        .collect();
    let refs: Vec<(&str, Vec<u8>)> = objects
        .iter()
        .map(|(k, d)| (k.as_str(), d.clone()))
        .collect();
    let (store, f, v) = setup(small(), &refs);
    store.set_latency(Duration::from_millis(5));
    let reads: Vec<_> = v
        .iter()
        .map(|o| {
            let f = f.clone();
            let o = o.clone();
            tokio::spawn(async move { f.read(&o, 0..BS).await })
        })
        .collect();
    for (r, (_, d)) in reads.into_iter().zip(&objects) {
        assert_eq!(&r.await.unwrap().unwrap()[..], &d[..]);
    }
    assert!(
        store.max_concurrent_gets() <= 4,
        "{}",
        store.max_concurrent_gets()
    );
    assert_eq!(store.count(Op::Get), 20);
}

#[test]
fn idle_connections_hold_an_eighth_of_the_get_budget_beyond_the_fixed_ones() {
    use super::budget::{CONNECTION_BUFFER, FIXED_IDLE_CONNECTIONS};
    const MIB: u64 = 1 << 20;
    // --max-memory 64M: 24 MiB for GETs, an eighth of it holds fewer buffers than the fixed
    // connections, which take nothing from the GET budget.
    assert_eq!(idle_connections(24 * MIB), FIXED_IDLE_CONNECTIONS);
    assert_eq!(idle_connections_memory(idle_connections(24 * MIB)), 0);
    // The default 1G: 384 MiB for GETs, 120 idle connections, whose buffers beyond the fixed
    // ones come out of the GET budget and stay within its eighth.
    let idle = idle_connections(384 * MIB);
    assert_eq!(idle, 120);
    let taken = idle_connections_memory(idle);
    assert_eq!(
        taken,
        (120 - FIXED_IDLE_CONNECTIONS) as u64 * CONNECTION_BUFFER
    );
    assert!(taken <= 384 * MIB / 8);
}

#[tokio::test]
async fn prefetch_never_exceeds_the_memory_budget() {
    let config = FetchConfig {
        inflight_memory: 4 * BS,
        ..small()
    };
    let objects: Vec<(String, Vec<u8>)> = (0..8)
        .map(|i| (format!("o{i}"), data(4 * BS as usize, i)))
        .collect();
    let refs: Vec<(&str, Vec<u8>)> = objects
        .iter()
        .map(|(k, d)| (k.as_str(), d.clone()))
        .collect();
    let (store, f, v) = setup(config, &refs);
    store.set_latency(Duration::from_millis(50));
    for o in &v {
        f.prefetch(o, 0..4);
        assert!(f.inflight_bytes() <= 4 * BS);
    }
    // Only the first object's run fit; the others were skipped, not queued.
    assert_eq!(f.stats().prefetch_requests.load(Ordering::Relaxed), 1);
    assert_eq!(f.stats().prefetch_skipped.load(Ordering::Relaxed), 7);
    // Demand reads still complete (they wait for the budget).
    for (o, (_, d)) in v.iter().zip(&objects) {
        assert_eq!(&f.read(o, 0..4 * BS).await.unwrap()[..], &d[..]);
    }
    let _ = store;
}

#[tokio::test]
async fn memory_cache_stays_within_its_budget() {
    let config = FetchConfig {
        block_cache_bytes: 8 * BS,
        ..small()
    };
    let body = data(64 * BS as usize, 6);
    let (_, f, v) = setup(config, &[("k", body.clone())]);
    for i in 0..64 {
        f.read(&v[0], i * BS..(i + 1) * BS).await.unwrap();
    }
    assert!(f.block_cache().weighted_size() <= 8 * BS);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Any sequence of reads returns exactly the reference bytes, whatever the block layout.
    #[test]
    fn reads_match_the_reference(
        len in 0usize..20_000,
        reads in proptest::collection::vec((0u64..22_000, 0u64..5_000), 1..20),
        cache in prop_oneof![Just(0u64), Just(1u64 << 20)],
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async {
            let body = data(len, 7);
            let config = FetchConfig { block_cache_bytes: cache, ..small() };
            let (_, f, v) = setup(config, &[("k", body.clone())]);
            for (off, n) in reads {
                let got = f.read(&v[0], off..off + n).await.unwrap();
                let lo = (off as usize).min(len);
                let hi = ((off + n) as usize).min(len);
                prop_assert_eq!(&got[..], &body[lo..hi.max(lo)]);
            }
            Ok(())
        })?;
    }
}

#[tokio::test]
async fn a_body_cut_short_is_completed_by_a_second_get() {
    let body = data(8 * BS as usize, 8);
    let (store, f, v) = setup(small(), &[("k", body.clone())]);
    store.inject(Op::Get, Fault::Truncate(1500));
    let got = f.read(&v[0], 0..4 * BS).await.unwrap();
    assert_eq!(&got[..], &body[..4 * BS as usize]);
    // The streamed GET delivered block 0 and part of block 1; one more GET fetched 1..4.
    assert_eq!(store.count(Op::Get), 2);
}

mod with_disk {
    use super::*;
    use crate::cache::{CacheConfig, DiskCache, SizeLimit};

    pub(super) const DBS: u64 = 4096;

    fn disk_fetcher(store: &Arc<MemoryStore>, dir: &std::path::Path) -> Arc<Fetcher> {
        disk_fetcher_with_memory(store, dir, 0)
    }

    /// [`disk_fetcher`] with a memory cache of `block_cache_bytes`.
    fn disk_fetcher_with_memory(
        store: &Arc<MemoryStore>,
        dir: &std::path::Path,
        block_cache_bytes: u64,
    ) -> Arc<Fetcher> {
        fetcher_as(store.clone(), dir, "key:test", block_cache_bytes)
    }

    /// A fetcher over `store` with the NVMe cache at `dir`, signing as `principal`.
    pub(super) fn fetcher_as(
        store: Arc<dyn ObjectStore>,
        dir: &std::path::Path,
        principal: &str,
        block_cache_bytes: u64,
    ) -> Arc<Fetcher> {
        let mut cc = CacheConfig::new(dir, SizeLimit::Bytes(64 << 20));
        cc.block_size = DBS;
        cc.min_free = SizeLimit::Bytes(0);
        let cache = DiskCache::open(cc).unwrap();
        let tier = Arc::new(DiskTier::new(
            cache,
            "http://test",
            "bucket",
            principal,
            None,
        ));
        let config = FetchConfig {
            block_size: DBS,
            block_cache_bytes,
            ..small()
        };
        Fetcher::new(store, config, tokio::runtime::Handle::current(), Some(tier))
    }

    /// Waits until `obj` is complete in the NVMe cache and its write-behind entries (which
    /// hold buffer budget) have left the in-flight table: the cache counts a block as written
    /// a moment before the entry is released.
    pub(super) async fn wait_complete(f: &Fetcher, obj: &ObjectVersion) {
        let tier = f.disk().unwrap();
        let id = tier.identity(obj);
        crate::test_support::eventually("the cache to complete", || {
            tier.cache().is_complete(&id) && f.inflight.lock().is_empty()
        })
        .await;
    }

    pub(super) fn version(store: &MemoryStore, key: &str, body: &[u8]) -> Arc<ObjectVersion> {
        let etag = store.put(key, body.to_vec());
        Arc::new(ObjectVersion {
            key: Arc::from(key),
            etag: Arc::from(etag.as_str()),
            size: body.len() as u64,
        })
    }

    #[tokio::test]
    async fn a_restarted_fetcher_reads_cached_blocks_without_gets() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MemoryStore::new());
        let body = data(10 * DBS as usize + 100, 11);
        let obj = version(&store, "k", &body);
        {
            let f = disk_fetcher(&store, dir.path());
            assert_eq!(
                &f.read(&obj, 0..body.len() as u64).await.unwrap()[..],
                &body[..]
            );
            wait_complete(&f, &obj).await;
        }
        let gets = store.count(Op::Get);
        let f = disk_fetcher(&store, dir.path());
        assert_eq!(
            &f.read(&obj, 0..body.len() as u64).await.unwrap()[..],
            &body[..]
        );
        assert_eq!(store.count(Op::Get), gets, "served from the NVMe cache");
        assert_eq!(f.stats().disk_hits.load(Ordering::Relaxed), 11);
    }

    /// Fetched blocks take their GET's memory budget along to their cache writes and give it
    /// back when written: after a demand read and a background fetch, with every write over,
    /// the whole budget is free again (none kept by a write, none lost by a split).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cache_writes_give_their_memory_budget_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MemoryStore::new());
        let f = disk_fetcher(&store, dir.path());
        let body = data(10 * DBS as usize + 100, 12);
        let obj = version(&store, "read", &body);
        assert_eq!(
            &f.read(&obj, 0..body.len() as u64).await.unwrap()[..],
            &body[..]
        );
        let other = version(&store, "background", &data(7 * DBS as usize, 13));
        f.fetch_background(&other, 0..7, Priority::Prefetch)
            .await
            .unwrap();
        wait_complete(&f, &obj).await;
        wait_complete(&f, &other).await;
        crate::test_support::eventually("the memory budget to be free", || f.inflight_bytes() == 0)
            .await;
        // The blocks on disk are the fetched bytes (written from their aligned buffers).
        let again = disk_fetcher(&store, dir.path());
        assert_eq!(
            &again.read(&obj, 0..body.len() as u64).await.unwrap()[..],
            &body[..]
        );
    }

    /// A block the memory cache does not keep (here it keeps nothing) is not fetched again
    /// while its write to the NVMe cache is still going on: the finished fetch stays in the
    /// in-flight table until the write is over.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_block_being_written_to_disk_is_not_fetched_again() {
        use crate::cache::disk::HookAction;
        use crate::cache::WriteStep;
        use std::sync::atomic::AtomicBool;
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MemoryStore::new());
        let body = data(3 * DBS as usize, 14);
        let obj = version(&store, "k", &body);
        let f = disk_fetcher(&store, dir.path());
        // Every block write stops before its data until `go` is set.
        let go = Arc::new(AtomicBool::new(false));
        let held = Arc::new(AtomicU64::new(0));
        let (g, h) = (go.clone(), held.clone());
        f.disk()
            .unwrap()
            .cache()
            .set_write_hook(Some(Arc::new(move |step| {
                if step == WriteStep::WriteData {
                    h.fetch_add(1, Ordering::SeqCst);
                    // Bounded, so that a failing test ends instead of holding the runtime.
                    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
                    while !g.load(Ordering::SeqCst) && std::time::Instant::now() < until {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                }
                HookAction::Continue
            })));
        let len = body.len() as u64;
        assert_eq!(&f.read(&obj, 0..len).await.unwrap()[..], &body[..]);
        crate::test_support::eventually("a block write to start", || {
            held.load(Ordering::SeqCst) > 0
        })
        .await;
        assert_eq!(store.count(Op::Get), 1);
        // The writes are held: the blocks are in neither the memory nor the disk cache.
        assert_eq!(&f.read(&obj, 0..len).await.unwrap()[..], &body[..]);
        assert_eq!(store.count(Op::Get), 1, "fetched again while being written");
        go.store(true, Ordering::SeqCst);
        wait_complete(&f, &obj).await;
        f.disk().unwrap().cache().set_write_hook(None);
        assert_eq!(&f.read(&obj, 0..len).await.unwrap()[..], &body[..]);
        assert_eq!(store.count(Op::Get), 1);
        assert!(
            f.inflight.lock().is_empty(),
            "write-behind entries released"
        );
    }

    #[tokio::test]
    async fn a_corrupted_cache_block_is_fetched_again() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MemoryStore::new());
        let body = data(4 * DBS as usize, 12);
        let obj = version(&store, "k", &body);
        cache_whole(&disk_fetcher(&store, dir.path()), &obj).await;
        // Flip bytes in the middle of block 2 of the data file.
        let data_file = the_data_file(dir.path());
        let mut raw = std::fs::read(&data_file).unwrap();
        raw[2 * DBS as usize + 10] ^= 0xff;
        std::fs::write(&data_file, raw).unwrap();
        let gets = store.count(Op::Get);
        let f = disk_fetcher(&store, dir.path());
        assert_eq!(
            &f.read(&obj, 0..body.len() as u64).await.unwrap()[..],
            &body[..]
        );
        assert_eq!(
            store.count(Op::Get),
            gets + 1,
            "only the bad block is fetched"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cache_file_verified_after_a_restart_is_announced_for_passthrough() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MemoryStore::new());
        let body = data(3 * DBS as usize + 7, 13);
        let obj = version(&store, "k", &body);
        cache_whole(&disk_fetcher(&store, dir.path()), &obj).await;
        let f = disk_fetcher(&store, dir.path());
        let tier = f.disk().unwrap().clone();
        let mut completions = tier.completions(8);
        // Complete on disk but not known good to this daemon: no file yet, a check starts.
        assert!(tier.passthrough_file(&obj).await.is_none());
        let announced = tokio::time::timeout(Duration::from_secs(30), completions.recv())
            .await
            .expect("the verified object was never announced")
            .unwrap();
        assert_eq!(announced, *obj);
        assert!(tier.passthrough_file(&obj).await.is_some());
        assert!(completions.try_recv().is_err(), "announced once");
    }

    /// A small cache file (one block) cached before a restart is checked at its first open,
    /// whether the cache's start-up scan has reached its entry (then by name) or not (its
    /// journal loaded first), and that open gets it for passthrough, unannounced (the open
    /// registers it); one with a changed byte never does, and its read is fetched again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_small_cache_file_is_checked_at_its_first_open_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MemoryStore::new());
        let body = data(DBS as usize / 2 + 3, 14);
        let obj = version(&store, "k", &body);
        cache_whole(&disk_fetcher(&store, dir.path()), &obj).await;
        let f = disk_fetcher(&store, dir.path());
        let tier = f.disk().unwrap().clone();
        let mut completions = tier.completions(8);
        let file = tier
            .passthrough_file(&obj)
            .await
            .expect("checked at the open");
        let mut bytes = vec![0; body.len()];
        std::os::unix::fs::FileExt::read_exact_at(&file.file, &mut bytes, 0).unwrap();
        assert!(bytes == body);
        assert!(completions.try_recv().is_err(), "not announced");
        drop((file, tier, f));

        let data_file = the_data_file(dir.path());
        let mut raw = std::fs::read(&data_file).unwrap();
        raw[100] ^= 0xff;
        std::fs::write(&data_file, raw).unwrap();
        let gets = store.count(Op::Get);
        let f = disk_fetcher(&store, dir.path());
        assert!(f.disk().unwrap().passthrough_file(&obj).await.is_none());
        assert_eq!(
            &f.read(&obj, 0..body.len() as u64).await.unwrap()[..],
            &body[..]
        );
        assert_eq!(store.count(Op::Get), gets + 1, "fetched again");
    }

    /// `read_quick`'s answer, and the name of the thread that gave it.
    async fn quick(
        f: &Arc<Fetcher>,
        obj: &Arc<ObjectVersion>,
        range: std::ops::Range<u64>,
    ) -> (Option<Bytes>, Option<String>) {
        let (tx, rx) = oneshot::channel();
        f.read_quick(obj, range, move |got| {
            let thread = std::thread::current().name().map(str::to_string);
            let _ = tx.send((got, thread));
        });
        rx.await.expect("read_quick calls done exactly once")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn quick_reads_come_from_the_io_thread_or_the_caller_and_only_when_nothing_must_wait() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MemoryStore::new());
        let body = data(3 * DBS as usize + 100, 13);
        let obj = version(&store, "k", &body);
        let f = disk_fetcher(&store, dir.path());
        // Nothing cached yet: declined, and nothing fetched.
        assert_eq!(quick(&f, &obj, 0..DBS).await.0, None);
        assert_eq!(store.count(Op::Get), 0);
        cache_whole(&f, &obj).await;
        // A restarted daemon, which has checked none of the blocks yet (a daemon trusts the
        // blocks it wrote itself); reading block 2 opens the cache entry.
        let f = disk_fetcher(&store, dir.path());
        f.read(&obj, 2 * DBS..2 * DBS + 1).await.unwrap();
        let gets = store.count(Op::Get);
        let hits = f.stats().disk_hits.load(Ordering::Relaxed);
        // One whole block, then part of it again: from the NVMe cache (this fetcher keeps no
        // blocks in memory), answered on the cache's I/O thread, the second time as just the
        // bytes asked for (the first read checked the block); the short last block (a small
        // file's only block) is read on the calling thread itself.
        let caller = std::thread::current().name().map(str::to_string);
        for (range, on_ring) in [
            (DBS..2 * DBS, true),
            (DBS + 10..DBS + 20, true),
            (3 * DBS..3 * DBS + 100, false),
        ] {
            let (got, thread) = quick(&f, &obj, range.clone()).await;
            let want = &body[range.start as usize..range.end as usize];
            assert_eq!(got.as_deref(), Some(want), "{range:?}");
            if on_ring {
                assert!(
                    thread
                        .as_deref()
                        .is_some_and(|t| t.starts_with("riffle-uring")),
                    "{thread:?}"
                );
            } else {
                assert_eq!(thread, caller, "{range:?}");
            }
        }
        assert_eq!(f.stats().disk_hits.load(Ordering::Relaxed), hits + 2);
        assert_eq!(f.disk().unwrap().cache().stats().verified_reads, 1);
        // A read across two blocks that are not in memory, one never read from disk yet,
        // takes the task path; once both were checked, it is read in part on the I/O thread.
        assert_eq!(quick(&f, &obj, DBS - 1..DBS + 1).await.0, None);
        assert!(quick(&f, &obj, 0..DBS).await.0.is_some());
        let (got, thread) = quick(&f, &obj, DBS - 1..DBS + 1).await;
        assert_eq!(
            got.as_deref(),
            Some(&body[DBS as usize - 1..DBS as usize + 1])
        );
        assert!(thread.is_some_and(|t| t.starts_with("riffle-uring")));
        assert_eq!(f.disk().unwrap().cache().stats().verified_reads, 2);
        assert_eq!(store.count(Op::Get), gets, "no request to the store");
    }

    /// Read-ahead leaves alone the blocks the NVMe cache has checked already (a read of them
    /// takes its bytes from the cache file), and reads ahead the ones it has not.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn read_ahead_skips_blocks_the_cache_has_checked() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MemoryStore::new());
        let body = data(4 * DBS as usize, 15);
        let obj = version(&store, "k", &body);
        cache_whole(&disk_fetcher(&store, dir.path()), &obj).await;
        // A restarted daemon: it has checked none of the blocks yet.
        let f = disk_fetcher(&store, dir.path());
        let gets = store.count(Op::Get);
        let cache = f.disk().unwrap().cache().clone();
        let disk_reads = || cache.stats().hits + cache.stats().misses;
        // Blocks 0 and 1 read back and checked; 2 and 3 not yet.
        for i in 0..2 {
            f.read(&obj, i * DBS..(i + 1) * DBS).await.unwrap();
        }
        let before = disk_reads();
        let id = f.disk().unwrap().identity(&obj);
        f.prefetch(&obj, 0..2);
        f.prefetch(&obj, 0..4);
        crate::test_support::eventually("blocks 2 and 3 read ahead", || {
            cache.verified_prefix(&id, 0..4) == 4 && f.inflight.lock().is_empty()
        })
        .await;
        assert_eq!(
            disk_reads(),
            before + 2,
            "checked blocks are not read ahead"
        );
        assert_eq!(store.count(Op::Get), gets);
    }

    /// A stream reads ahead into memory the blocks the cache has checked as well (no GET), and
    /// the blocks it has passed leave memory again, except those only memory holds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stream_reads_checked_blocks_ahead_and_drops_them_behind() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MemoryStore::new());
        let body = data(4 * DBS as usize, 16);
        let obj = version(&store, "k", &body);
        let f = disk_fetcher_with_memory(&store, dir.path(), 64 * DBS);
        cache_whole(&f, &obj).await;
        let id = f.disk().unwrap().identity(&obj);
        let cache = f.disk().unwrap().cache().clone();
        assert_eq!(cache.verified_prefix(&id, 0..4), 4);
        for i in 0..4 {
            f.cache.remove(&(obj.clone(), i));
        }
        let gets = store.count(Op::Get);
        let hits = cache.stats().hits;
        f.prefetch_stream(&obj, 0..4);
        crate::test_support::eventually("blocks read ahead into memory", || {
            f.inflight.lock().is_empty() && (0..4).all(|i| f.cache.get(&(obj.clone(), i)).is_some())
        })
        .await;
        assert_eq!(cache.stats().hits, hits + 4, "read from the cache file");
        assert_eq!(store.count(Op::Get), gets, "no GET");
        for i in 0..4 {
            let got = f.cache.get(&(obj.clone(), i)).unwrap();
            assert_eq!(
                &got[..],
                &body[(i * DBS) as usize..((i + 1) * DBS) as usize]
            );
        }
        f.drop_behind(&obj, 0..2);
        assert!((0..2).all(|i| f.cache.get(&(obj.clone(), i)).is_none()));
        assert!((2..4).all(|i| f.cache.get(&(obj.clone(), i)).is_some()));
        // A block the cache does not hold stays in memory: it is the only copy here.
        let other = version(&store, "only-in-memory", &body[..DBS as usize]);
        f.cache.insert(
            (other.clone(), 0),
            Bytes::from(body[..DBS as usize].to_vec()),
        );
        f.drop_behind(&other, 0..1);
        assert!(f.cache.get(&(other.clone(), 0)).is_some());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_quick_read_of_a_corrupted_block_returns_nothing_and_the_task_path_refetches() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MemoryStore::new());
        let body = data(2 * DBS as usize, 14);
        let obj = version(&store, "k", &body);
        cache_whole(&disk_fetcher(&store, dir.path()), &obj).await;
        // A restarted daemon (which has checked block 0 only) finds block 1 gone bad.
        let f = disk_fetcher(&store, dir.path());
        assert_eq!(
            &f.read(&obj, 0..DBS).await.unwrap()[..],
            &body[..DBS as usize]
        );
        let raw = std::fs::OpenOptions::new()
            .write(true)
            .open(the_data_file(dir.path()))
            .unwrap();
        std::os::unix::fs::FileExt::write_all_at(&raw, b"\xff\x00", DBS + 7).unwrap();
        raw.sync_all().unwrap();
        let gets = store.count(Op::Get);
        assert_eq!(
            quick(&f, &obj, DBS..2 * DBS).await.0,
            None,
            "never wrong bytes"
        );
        let got = f.read(&obj, DBS..2 * DBS).await.unwrap();
        assert_eq!(&got[..], &body[DBS as usize..]);
        assert_eq!(
            store.count(Op::Get),
            gets + 1,
            "the bad block is fetched again"
        );
        assert_eq!(f.disk().unwrap().cache().stats().crc_failures, 1);
        // The untouched block is still served quickly.
        assert_eq!(
            quick(&f, &obj, 0..DBS).await.0.as_deref(),
            Some(&body[..DBS as usize])
        );
    }

    /// Reads all of `obj` through `f` and waits until its cache entry is complete.
    async fn cache_whole(f: &Arc<Fetcher>, obj: &Arc<ObjectVersion>) {
        f.read(obj, 0..obj.size).await.unwrap();
        wait_complete(f, obj).await;
    }

    /// The data file of the only object cached in `dir`.
    fn the_data_file(dir: &std::path::Path) -> std::path::PathBuf {
        walk_files(dir)
            .into_iter()
            .find(|p| p.extension().is_some_and(|e| e == "data"))
            .unwrap()
    }

    fn walk_files(root: &std::path::Path) -> Vec<std::path::PathBuf> {
        let mut out = Vec::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    out.push(p);
                }
            }
        }
        out
    }
}

#[tokio::test]
async fn read_ahead_into_a_full_memory_cache_is_kept_for_the_reader() {
    // A cache of 8 blocks, already full of other, often-read data; blocks prefetched next
    // must still be there for the reader.
    let config = FetchConfig {
        block_cache_bytes: 8 * BS,
        ..small()
    };
    let body = data(64 * BS as usize, 13);
    let (store, f, v) = setup(config, &[("k", body.clone())]);
    // Fill the cache with blocks read several times (frequent, in TinyLFU's eyes).
    for _ in 0..4 {
        for i in 0..8 {
            f.read(&v[0], i * BS..(i + 1) * BS).await.unwrap();
        }
    }
    f.prefetch(&v[0], 40..44);
    until_cached(&f, &v[0], 40..44).await;
    let gets = store.count(Op::Get);
    assert_eq!(
        &f.read(&v[0], 40 * BS..44 * BS).await.unwrap()[..],
        &body[40 * BS as usize..44 * BS as usize]
    );
    assert_eq!(
        store.count(Op::Get),
        gets,
        "the prefetched blocks were kept"
    );
}

async fn until_cached(f: &Fetcher, obj: &Arc<ObjectVersion>, blocks: std::ops::Range<u64>) {
    crate::test_support::eventually("the prefetched blocks in the cache", || {
        blocks
            .clone()
            .all(|i| f.block_cache().get(&(obj.clone(), i)).is_some())
    })
    .await;
}

/// W5 below the FUSE layer: a shuffled dataset twice the cache size, read three times by 8
/// concurrent readers through the fetcher and a real disk cache. The epoch policy keeps a
/// stable half of the dataset across epochs (hit ratio ≈ 0.5, the ceiling under a fresh
/// shuffle); LRU keeps what the next epoch evicts before reading it.
mod larger_than_cache {
    use super::*;
    use crate::cache::simulate::SplitMix64;
    use crate::cache::{make_policy, CacheConfig, DiskCache, EvictionKind, SizeLimit};
    use parking_lot::Mutex;

    /// Hit ratios (1 − GETs ÷ objects) of three shuffled epochs.
    async fn hit_ratios(kind: EvictionKind) -> Vec<f64> {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MemoryStore::new());
        let mut rng = SplitMix64::new(7);
        let n = 600;
        let mut objects = Vec::new();
        let mut total = 0;
        for i in 0..n {
            let len = 50_000 + rng.below(120_000) as usize;
            total += len as u64;
            let key = format!("d/{i:05}");
            let etag = store.put(&key, data(len, i as u8));
            objects.push(Arc::new(ObjectVersion {
                key: Arc::from(key.as_str()),
                etag: Arc::from(etag.as_str()),
                size: len as u64,
            }));
        }
        let mut cc = CacheConfig::new(dir.path(), SizeLimit::Bytes(total / 2));
        cc.min_free = SizeLimit::Bytes(0);
        let cache = DiskCache::open_with_policy(cc, make_policy(kind, None)).unwrap();
        let tier = Arc::new(DiskTier::new(
            cache,
            "http://test",
            "bucket",
            "key:test",
            None,
        ));
        let config = FetchConfig {
            block_size: 1 << 20,
            max_part_blocks: 8,
            max_inflight: 64,
            inflight_memory: 256 << 20,
            block_cache_bytes: 16 << 20,
        };
        let handle = tokio::runtime::Handle::current();
        let f = Fetcher::new(store.clone(), config, handle, Some(tier.clone()));
        let objects = Arc::new(objects);
        let mut ratios = Vec::new();
        for _epoch in 0..3 {
            let mut order: Vec<usize> = (0..n).collect();
            rng.shuffle(&mut order);
            let queue = Arc::new(Mutex::new(order));
            let before = store.count(Op::Get);
            let readers: Vec<_> = (0..8)
                .map(|_| {
                    let (queue, objects, f, tier) =
                        (queue.clone(), objects.clone(), f.clone(), tier.clone());
                    tokio::spawn(async move {
                        loop {
                            let next = queue.lock().pop();
                            let Some(i) = next else { break };
                            let o = &objects[i];
                            let _open = tier.pin(o);
                            let got = f.read(o, 0..o.size).await.unwrap();
                            assert_eq!(got.len() as u64, o.size);
                        }
                    })
                })
                .collect();
            for r in readers {
                r.await.unwrap();
            }
            assert!(
                tier.flush(Duration::from_secs(30)).await,
                "cache writes settle"
            );
            let gets = store.count(Op::Get) - before;
            ratios.push(1.0 - gets as f64 / n as f64);
        }
        ratios
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_epoch_policy_keeps_half_of_a_shuffled_dataset_and_lru_does_not() {
        let epoch = hit_ratios(EvictionKind::Epoch).await;
        let lru = hit_ratios(EvictionKind::Lru).await;
        for e in 1..3 {
            assert!(epoch[e] >= 0.4, "epoch policy, epoch {}: {epoch:?}", e + 1);
            assert!(lru[e] < epoch[e] - 0.15, "lru {lru:?} vs epoch {epoch:?}");
        }
    }
}

/// The cache's proof rule ([`crate::cache::proofs`]): cached bytes only for a principal that
/// has read the object version from the store.
mod proofs {
    use super::with_disk::{fetcher_as, version, wait_complete, DBS};
    use super::*;
    use async_trait::async_trait;
    use parking_lot::Mutex;

    /// A principal that may list but not read: every GET is refused (counted).
    struct ListOnly {
        inner: Arc<MemoryStore>,
        gets: AtomicU64,
    }

    #[async_trait]
    impl ObjectStore for ListOnly {
        async fn list_page(
            &self,
            req: crate::store::ListRequest<'_>,
        ) -> Result<crate::store::ListPage, StoreError> {
            self.inner.list_page(req).await
        }
        async fn head(&self, key: &str) -> Result<crate::store::ObjectMeta, StoreError> {
            self.inner.head(key).await
        }
        async fn get_range(&self, _: crate::store::RangeRequest<'_>) -> Result<Bytes, StoreError> {
            self.gets.fetch_add(1, Ordering::SeqCst);
            Err(StoreError::AccessDenied("AccessDenied (HTTP 403)".into()))
        }
    }

    fn fetcher(
        store: Arc<dyn ObjectStore>,
        dir: &std::path::Path,
        principal: &str,
    ) -> Arc<Fetcher> {
        fetcher_as(store, dir, principal, 0)
    }

    /// Fills the cache with `obj` as principal `A`.
    async fn fill(
        store: &Arc<MemoryStore>,
        dir: &std::path::Path,
        obj: &Arc<ObjectVersion>,
        body: &[u8],
    ) {
        let a = fetcher(store.clone(), dir, "key:A");
        a.admit(obj).await.unwrap();
        assert_eq!(&a.read(obj, 0..obj.size).await.unwrap()[..], body);
        wait_complete(&a, obj).await;
    }

    #[tokio::test]
    async fn the_filler_reads_its_entries_after_a_restart_with_no_request() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MemoryStore::new());
        let body = data(3 * DBS as usize + 10, 1);
        let obj = version(&store, "k", &body);
        fill(&store, dir.path(), &obj, &body).await;
        let gets = store.count(Op::Get);
        let again = fetcher(store.clone(), dir.path(), "key:A");
        again.admit(&obj).await.unwrap();
        assert_eq!(&again.read(&obj, 0..obj.size).await.unwrap()[..], &body[..]);
        assert_eq!(store.count(Op::Get), gets, "no proof request, no GET");
        assert_eq!(again.stats().proof_requests.load(Ordering::Relaxed), 0);
        assert!(again.is_cached(&obj));
    }

    #[tokio::test]
    async fn a_list_only_principal_is_refused_and_never_served_cached_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MemoryStore::new());
        let body = data(2 * DBS as usize, 2);
        let obj = version(&store, "k", &body);
        fill(&store, dir.path(), &obj, &body).await;
        let list_only = Arc::new(ListOnly {
            inner: store.clone(),
            gets: AtomicU64::new(0),
        });
        let l = fetcher(list_only.clone(), dir.path(), "key:L");
        assert_eq!(l.admit(&obj).await, Err(FetchError::NotPermitted));
        assert_eq!(
            list_only.gets.load(Ordering::SeqCst),
            1,
            "one proof request"
        );
        // Remembered: no second request; and a read that skips the open still gets nothing
        // from the cache (it asks the store, which refuses).
        assert_eq!(l.admit(&obj).await, Err(FetchError::NotPermitted));
        assert_eq!(list_only.gets.load(Ordering::SeqCst), 1);
        assert!(matches!(
            l.read(&obj, 0..obj.size).await,
            Err(FetchError::Store(StoreError::AccessDenied(_)))
        ));
        assert_eq!(l.stats().disk_hits.load(Ordering::Relaxed), 0);
        let quick = Arc::new(Mutex::new(None));
        let q = quick.clone();
        l.read_quick(&obj, 0..100, move |data| *q.lock() = Some(data));
        crate::test_support::eventually("read_quick to answer", || quick.lock().is_some()).await;
        assert_eq!(*quick.lock(), Some(None), "the quick path declines");
        assert!(l.disk().unwrap().passthrough_file(&obj).await.is_none());
        assert!(!l.is_cached(&obj));
        // The refusal survives a remount.
        let again = fetcher(list_only.clone(), dir.path(), "key:L");
        assert_eq!(again.admit(&obj).await, Err(FetchError::NotPermitted));
        assert_eq!(
            list_only.gets.load(Ordering::SeqCst),
            2,
            "the read above, no new proof"
        );
    }

    #[tokio::test]
    async fn another_reader_proves_once_then_reads_from_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MemoryStore::new());
        let body = data(3 * DBS as usize, 3);
        let obj = version(&store, "k", &body);
        fill(&store, dir.path(), &obj, &body).await;
        let before = store.count(Op::Get);
        let b = fetcher(store.clone(), dir.path(), "key:B");
        assert!(!b.is_cached(&obj), "not servable before the proof");
        // Concurrent opens share one proof request.
        let (x, y) = tokio::join!(b.admit(&obj), b.admit(&obj));
        assert_eq!((x, y), (Ok(()), Ok(())));
        assert_eq!(store.count(Op::Get), before + 1, "one proof request");
        assert_eq!(&b.read(&obj, 0..obj.size).await.unwrap()[..], &body[..]);
        assert_eq!(store.count(Op::Get), before + 1, "served from the cache");
        assert_eq!(b.stats().disk_hits.load(Ordering::Relaxed), 3);
        // After a remount: no request at all.
        let again = fetcher(store.clone(), dir.path(), "key:B");
        again.admit(&obj).await.unwrap();
        assert_eq!(&again.read(&obj, 0..obj.size).await.unwrap()[..], &body[..]);
        assert_eq!(store.count(Op::Get), before + 1);
    }

    #[tokio::test]
    async fn nothing_cached_needs_no_proof_and_a_changed_object_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MemoryStore::new());
        let body = data(DBS as usize, 4);
        let obj = version(&store, "k", &body);
        let b = fetcher(store.clone(), dir.path(), "key:B");
        b.admit(&obj).await.unwrap();
        assert_eq!(store.count(Op::Get), 0, "a cold object costs no proof");
        // Filled by A, then replaced in the store: B's proof request finds it changed.
        fill(&store, dir.path(), &obj, &body).await;
        store.put("k", data(DBS as usize, 5));
        assert_eq!(b.admit(&obj).await, Err(FetchError::Changed));
        assert_eq!(b.stats().proofs_refused.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_transient_failure_of_the_proof_is_not_remembered() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MemoryStore::new());
        let body = data(DBS as usize, 6);
        let obj = version(&store, "k", &body);
        fill(&store, dir.path(), &obj, &body).await;
        let b = fetcher(store.clone(), dir.path(), "key:B");
        store.inject(
            Op::Get,
            Fault::Error(StoreError::Transient("503 SlowDown".into())),
        );
        assert!(matches!(
            b.admit(&obj).await,
            Err(FetchError::Store(StoreError::Transient(_)))
        ));
        b.admit(&obj).await.unwrap();
        assert!(b.is_cached(&obj));
    }
}
