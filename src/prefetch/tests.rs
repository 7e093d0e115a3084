//! Deterministic tests of the scheduler against the in-memory store with injected latency.
//! Waiting is always for a condition, with a generous bound; nothing asserts durations.

use std::time::Duration;

use super::*;
use crate::cache::PlanOracle;
use crate::fetch::FetchConfig;
use crate::namespace::MetadataTtl;
use crate::store::memory::{MemoryStore, Op};
use crate::test_support::eventually as until;

const FILE: usize = 3000;

struct Setup {
    store: Arc<MemoryStore>,
    ns: Arc<Namespace>,
    fetcher: Arc<Fetcher>,
    prefetch: Arc<Prefetcher>,
}

fn setup(keys: &[String], max_inflight: usize, config: PrefetchConfig) -> Setup {
    setup_with(keys, max_inflight, config, None)
}

fn setup_with(
    keys: &[String],
    max_inflight: usize,
    config: PrefetchConfig,
    disk: Option<Arc<crate::fetch::DiskTier>>,
) -> Setup {
    let store = Arc::new(MemoryStore::new());
    for (i, k) in keys.iter().enumerate() {
        store.put(k, vec![i as u8; FILE]);
    }
    store.set_latency(Duration::from_millis(5));
    let ns = Namespace::new(store.clone(), "", MetadataTtl::Indefinite);
    let fetcher = Fetcher::new(
        store.clone(),
        FetchConfig {
            block_size: 4096,
            max_inflight,
            block_cache_bytes: 64 << 20,
            ..FetchConfig::default()
        },
        tokio::runtime::Handle::current(),
        disk,
    );
    let prefetch = Prefetcher::new(ns.clone(), fetcher.clone(), config);
    prefetch.start();
    Setup {
        store,
        ns,
        fetcher,
        prefetch,
    }
}

fn config(concurrency: usize, byte_budget: u64, ahead: usize) -> PrefetchConfig {
    PrefetchConfig {
        concurrency,
        byte_budget,
        max_items_ahead: ahead,
        max_file_bytes: 1 << 20,
        max_dir_window: 16,
        epoch_prefetch: false,
        eviction_asks_prefetch: true,
    }
}

fn keys(n: usize, dir: &str) -> Vec<String> {
    (0..n).map(|i| format!("{dir}/f{i:03}")).collect()
}

fn plan_of(paths: &[String]) -> Plan {
    Plan::parse(&paths.join("\n")).unwrap()
}

fn load(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

async fn open(s: &Setup, path: &str) {
    let attr = s.ns.resolve(path).await.unwrap();
    let t = s.ns.open_target(attr.ino).await.unwrap();
    let obj = Arc::new(ObjectVersion {
        key: Arc::from(t.key.as_str()),
        etag: t.etag,
        size: t.size,
    });
    s.prefetch.on_open(attr.ino, &obj);
}

/// A disk cache tier in `dir` with the tests' 4 KiB blocks.
fn disk_tier(dir: &std::path::Path) -> Arc<crate::fetch::DiskTier> {
    use crate::cache::{CacheConfig, DiskCache, SizeLimit};
    let mut cc = CacheConfig::new(dir, SizeLimit::Bytes(64 << 20));
    cc.block_size = 4096;
    cc.min_free = SizeLimit::Bytes(0);
    Arc::new(crate::fetch::DiskTier::new(
        DiskCache::open(cc).unwrap(),
        "http://t",
        "b",
        "key:test",
        None,
    ))
}

/// The cache entry of the file at `path`, as the current metadata names it.
async fn entry_key_of(s: &Setup, tier: &crate::fetch::DiskTier, path: &str) -> EntryKey {
    let attr = s.ns.resolve(path).await.unwrap();
    let t = s.ns.open_target(attr.ino).await.unwrap();
    let obj = ObjectVersion {
        key: Arc::from(t.key.as_str()),
        etag: t.etag,
        size: t.size,
    };
    tier.identity(&obj).entry_key()
}

fn gets_of(s: &Setup) -> Vec<String> {
    s.store.get_log()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_items_are_fetched_ahead_in_order_and_within_concurrency() {
    let mut order = keys(40, "d");
    order.reverse();
    let s = setup(&order, 64, config(4, 1 << 30, 10));
    s.prefetch.set_plan(Some(plan_of(&order)));
    until("10 items ahead", || {
        load(&s.prefetch.stats().plan_fetched) == 10
    })
    .await;
    let fetched: Vec<String> = gets_of(&s);
    assert_eq!(fetched.len(), 10, "only the window ahead: {fetched:?}");
    let mut want: Vec<String> = order[..10].to_vec();
    let mut got = fetched.clone();
    want.sort();
    got.sort();
    assert_eq!(got, want, "the first ten plan items");
    assert!(s.store.max_concurrent_gets() <= 4);
    // The reader moves on: the window follows it.
    for p in &order[..20] {
        open(&s, p).await;
    }
    until("the window follows the reader", || {
        s.store.get_log().contains(&order[29])
    })
    .await;
    assert!(
        !s.store.get_log().contains(&order[30]),
        "never more than 10 ahead"
    );
    assert_eq!(load(&s.prefetch.stats().plan_opens), 20);
    assert!(load(&s.prefetch.stats().plan_opens_ready) >= 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_byte_budget_bounds_what_is_fetched_ahead() {
    let order = keys(50, "d");
    let s = setup(&order, 64, config(2, 3 * FILE as u64, 1000));
    s.prefetch.set_plan(Some(plan_of(&order)));
    until("the budget filled", || {
        load(&s.prefetch.stats().plan_fetched) >= 3
    })
    .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let fetched = load(&s.prefetch.stats().plan_fetched);
    assert!(fetched <= 3 + 2, "at most budget + concurrency: {fetched}");
    open(&s, &order[0]).await;
    open(&s, &order[1]).await;
    until("more after opens", || {
        load(&s.prefetch.stats().plan_fetched) > fetched
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demand_reads_jump_the_prefetch_queue() {
    let mut all = keys(60, "d");
    all.push("other/x".into());
    let s = setup(&all, 4, config(3, 1 << 30, 1000));
    s.store.set_latency(Duration::from_millis(20));
    s.prefetch.set_plan(Some(plan_of(&all[..60])));
    until("prefetch started", || s.store.count(Op::Get) >= 3).await;
    let attr = s.ns.resolve("other/x").await.unwrap();
    let t = s.ns.open_target(attr.ino).await.unwrap();
    let obj = Arc::new(ObjectVersion {
        key: Arc::from(t.key.as_str()),
        etag: t.etag,
        size: t.size,
    });
    let data = s.fetcher.read(&obj, 0..FILE as u64).await.unwrap();
    assert_eq!(data.len(), FILE);
    let log = gets_of(&s);
    let at = log.iter().position(|k| k == "other/x").unwrap();
    assert!(at < 12, "the demand GET waited behind {at} prefetches");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_prefetching() {
    let order = keys(200, "d");
    let s = setup(&order, 8, config(2, 1 << 30, 1000));
    s.store.set_latency(Duration::from_millis(10));
    s.prefetch.set_plan(Some(plan_of(&order)));
    until("started", || s.store.count(Op::Get) >= 2).await;
    s.prefetch.shutdown();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after = s.store.count(Op::Get);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(s.store.count(Op::Get), after, "no new GETs after shutdown");
    assert!(after < 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_plan_replaces_the_old_one_mid_epoch() {
    let mut all = keys(30, "a");
    all.extend(keys(30, "b"));
    let s = setup(&all, 64, config(4, 1 << 30, 5));
    s.prefetch.set_plan(Some(plan_of(&all[..30])));
    until("plan a ahead", || {
        load(&s.prefetch.stats().plan_fetched) == 5
    })
    .await;
    s.prefetch.set_plan(Some(plan_of(&all[30..])));
    until("plan b ahead", || {
        load(&s.prefetch.stats().plan_fetched) == 10
    })
    .await;
    let log = gets_of(&s);
    assert_eq!(log.iter().filter(|k| k.starts_with("b/")).count(), 5);
    assert_eq!(log.iter().filter(|k| k.starts_with("a/")).count(), 5);
    s.prefetch.set_plan(None);
    let mut sample = crate::stats::Sample::new();
    s.prefetch.record(&mut sample);
    assert!(sample.into_json()["prefetch"]["plan"].is_null());
    // Both plans' five files were fetched and never opened: counted as unused.
    assert_eq!(
        load(&s.prefetch.stats().plan_unused_bytes),
        10 * FILE as u64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_missing_from_the_store_are_skipped() {
    let present = keys(6, "d");
    let s = setup(&present, 64, config(4, 1 << 30, 100));
    let mut plan = present.clone();
    plan.insert(2, "d/gone".into());
    plan.insert(4, "nodir/x".into());
    s.prefetch.set_plan(Some(plan_of(&plan)));
    until("all handled", || {
        load(&s.prefetch.stats().plan_fetched) + load(&s.prefetch.stats().plan_missing) == 8
    })
    .await;
    assert_eq!(load(&s.prefetch.stats().plan_missing), 2);
    assert_eq!(load(&s.prefetch.stats().plan_fetched), 6);
}

/// Forty files in `dir`, whose listing the namespace has read (as `ls` or a data loader's
/// directory scan would before the opens).
async fn listed_dir_of_40() -> (Vec<String>, Setup) {
    let files = keys(40, "dir");
    let s = setup(&files, 64, config(8, 1 << 30, 100));
    let dir = s.ns.resolve("dir").await.unwrap();
    s.ns.readdir(dir.ino).await.unwrap();
    (files, s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_in_listing_order_gets_the_next_files_prefetched() {
    let (files, s) = listed_dir_of_40().await;
    for f in &files[..4] {
        open(&s, f).await;
    }
    assert!(load(&s.prefetch.stats().dir_order_fetched) > 0);
    until("the next files cached", || {
        s.store.get_log().iter().any(|k| k == "dir/f010")
    })
    .await;
    // A random reader elsewhere does not trigger anything.
    let before = load(&s.prefetch.stats().dir_order_fetched);
    for i in [30, 7, 22, 15] {
        open(&s, &files[i]).await;
    }
    assert_eq!(load(&s.prefetch.stats().dir_order_fetched), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_a_plan_is_spent_reopening_its_files_in_listing_order_is_followed() {
    let (files, s) = listed_dir_of_40().await;
    s.prefetch.set_plan(Some(plan_of(&files[..4])));
    for f in &files[..4] {
        open(&s, f).await;
    }
    assert_eq!(load(&s.prefetch.stats().plan_opens), 4);
    assert_eq!(
        load(&s.prefetch.stats().dir_order_fetched),
        0,
        "plan opens are the plan's"
    );
    // The next epoch, without a new plan, in listing order: the spent plan no longer claims
    // these opens, so directory order is detected and the files after them are fetched.
    for f in &files[..4] {
        open(&s, f).await;
    }
    assert_eq!(load(&s.prefetch.stats().plan_opens), 4);
    assert!(load(&s.prefetch.stats().dir_order_fetched) > 0);
    until("the next files fetched ahead", || {
        s.store.get_log().iter().any(|k| k == "dir/f010")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_fetches_a_subtree_and_reports_progress() {
    let mut all = keys(20, "w");
    all.extend(keys(5, "skip"));
    let s = setup(&all, 64, config(4, 1 << 30, 100));
    let id = s.prefetch.warm(vec!["w".into()]);
    until("warm done", || {
        s.prefetch
            .warm_progress(id)
            .is_some_and(|p| p.phase == warm::Phase::Done)
    })
    .await;
    let p = s.prefetch.warm_progress(id).unwrap();
    assert_eq!((p.files_total, p.files_done), (20, 20));
    assert_eq!(p.bytes_done, 20 * FILE as u64);
    assert!(s.store.get_log().iter().all(|k| k.starts_with("w/")));
    let bad = s.prefetch.warm(vec!["nope".into()]);
    until("warm failed", || {
        s.prefetch
            .warm_progress(bad)
            .is_some_and(|p| p.phase == warm::Phase::Failed)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_oracle_tells_eviction_when_plan_items_are_needed() {
    let dir = tempfile::tempdir().unwrap();
    let tier = disk_tier(dir.path());
    let order = keys(6, "d");
    let s = setup_with(&order, 64, config(8, 1 << 30, 100), Some(tier.clone()));
    let oracle = Oracle::default();
    assert_eq!(oracle.generation(), 0, "unbound: knows nothing");
    oracle.bind(&s.prefetch);
    s.prefetch.set_plan(Some(plan_of(&order)));
    until("all fetched", || {
        load(&s.prefetch.stats().plan_fetched) == 6
    })
    .await;
    assert_eq!(
        oracle.next_use(entry_key_of(&s, &tier, &order[3]).await),
        Some(3)
    );
    for p in &order[..4] {
        open(&s, p).await;
    }
    assert_eq!(
        oracle.next_use(entry_key_of(&s, &tier, &order[3]).await),
        None,
        "opened: not needed again"
    );
    assert_eq!(
        oracle.next_use(entry_key_of(&s, &tier, &order[5]).await),
        Some(5)
    );
    let before = oracle.generation();
    s.prefetch.set_plan(None);
    assert!(oracle.generation() > before);
    assert_eq!(
        oracle.next_use(entry_key_of(&s, &tier, &order[5]).await),
        None
    );
}

/// A new plan's files already known to the namespace (listed, cached in an earlier epoch) are
/// "needed" for eviction from the moment the plan is set, however far ahead of the scheduler:
/// otherwise the policy would evict the files cached for later in the epoch first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_plan_marks_known_files_needed_before_the_scheduler_reaches_them() {
    let dir = tempfile::tempdir().unwrap();
    let tier = disk_tier(dir.path());
    let order = keys(40, "d");
    // One item in flight and one ahead: the scheduler cannot have reached the end.
    let s = setup_with(&order, 64, config(1, 1 << 30, 1), Some(tier.clone()));
    s.ns.readdir(s.ns.resolve("d").await.unwrap().ino)
        .await
        .unwrap();
    let oracle = Oracle::default();
    oracle.bind(&s.prefetch);
    let before = oracle.generation();
    s.prefetch.set_plan(Some(plan_of(&order)));
    assert!(oracle.generation() > before, "the policy is told to re-ask");
    let key = entry_key_of(&s, &tier, &order[39]).await;
    assert!(load(&s.prefetch.stats().plan_fetched) < 39);
    assert_eq!(oracle.next_use(key), Some(39));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_over_cached_files_spawns_no_fetch_and_still_tracks_the_reader() {
    let order = keys(30, "d");
    let s = setup(&order, 64, config(4, 1 << 30, 100));
    s.prefetch.set_plan(Some(plan_of(&order)));
    until("the first plan fetched", || {
        load(&s.prefetch.stats().plan_fetched) == 30
    })
    .await;
    for path in &order {
        open(&s, path).await;
    }
    assert_eq!(load(&s.prefetch.stats().plan_opens_ready), 30);
    let gets = s.store.count(Op::Get);
    // The next epoch's plan: every file is cached, so the scheduler marks each item ready
    // itself (no task, no fetch counted, no GET), and the reader finds every file cached.
    let mut next = order.clone();
    next.reverse();
    s.prefetch.set_plan(Some(plan_of(&next)));
    until("the scheduler ran through the plan", || {
        s.prefetch
            .plan
            .lock()
            .as_ref()
            .is_some_and(|slot| (0..30).all(|i| slot.tracker.state(i) == plan::ItemState::Ready(0)))
    })
    .await;
    for path in &next {
        open(&s, path).await;
    }
    assert_eq!(
        load(&s.prefetch.stats().plan_fetched),
        30,
        "nothing fetched again"
    );
    assert_eq!(load(&s.prefetch.stats().plan_opens_ready), 60);
    assert_eq!(s.store.count(Op::Get), gets);
}
