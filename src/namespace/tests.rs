use super::*;
use crate::store::memory::{Fault, MemoryStore, Op};

fn ns_with(keys: &[&str], page: usize, ttl: MetadataTtl) -> (Arc<MemoryStore>, Arc<Namespace>) {
    let store = Arc::new(MemoryStore::with_page_size(page));
    for k in keys {
        store.put(k, k.as_bytes().to_vec());
    }
    let ns = Namespace::new(store.clone(), "", ttl);
    (store, ns)
}

fn names(ns: &Namespace, entries: &[DirEntry]) -> Vec<(String, bool)> {
    entries
        .iter()
        .map(|e| (ns.name_of(e), e.is_dir()))
        .collect()
}

#[tokio::test]
async fn lists_pages_and_shows_prefixes_as_directories() {
    let keys: Vec<String> = (0..25).map(|i| format!("big/f{i:03}")).collect();
    let mut all: Vec<&str> = keys.iter().map(String::as_str).collect();
    all.extend(["a.txt", "sub/x", "sub/deeper/y", "empty/"]);
    let (store, ns) = ns_with(&all, 4, MetadataTtl::Indefinite);
    let root = ns.readdir(ROOT_INO).await.unwrap();
    assert_eq!(
        names(&ns, &root),
        vec![
            ("a.txt".into(), false),
            ("big".into(), true),
            ("empty".into(), true),
            ("sub".into(), true)
        ]
    );
    let big = root.iter().find(|e| ns.name_of(e) == "big").unwrap().ino();
    let listing = ns.readdir(big).await.unwrap();
    assert_eq!(listing.len(), 25);
    assert!(
        store.count(Op::List) >= 8,
        "25 keys in pages of 4, plus the root"
    );
    let empty = root
        .iter()
        .find(|e| ns.name_of(e) == "empty")
        .unwrap()
        .ino();
    assert!(ns.readdir(empty).await.unwrap().is_empty());
}

#[tokio::test]
async fn odd_keys_are_skipped_and_directory_shadows_file() {
    let long = format!("d/{}", "n".repeat(256));
    let (_, ns) = ns_with(
        &[
            "a",
            "a/inner",
            "d//x",
            "d/./y",
            "d/ok",
            &long,
            "d/ünï cödé.bin",
        ],
        1000,
        MetadataTtl::Indefinite,
    );
    let root = ns.readdir(ROOT_INO).await.unwrap();
    assert_eq!(
        names(&ns, &root),
        vec![("a".into(), true), ("d".into(), true)]
    );
    let d = root[1].ino();
    let entries = ns.readdir(d).await.unwrap();
    assert_eq!(
        names(&ns, &entries),
        vec![("ok".into(), false), ("ünï cödé.bin".into(), false)]
    );
    // "d//x" (empty component), "d/./y", the long name and the shadowed "a".
    assert_eq!(ns.skipped_count(), 4);
}

#[tokio::test]
async fn lookups_use_head_and_list_and_cache_negatives() {
    let (store, ns) = ns_with(&["x/file", "x/dir/inner"], 1000, MetadataTtl::Indefinite);
    let x = ns.lookup(ROOT_INO, "x").await.unwrap();
    assert!(x.is_dir());
    let f = ns.lookup(x.ino, "file").await.unwrap();
    assert_eq!(
        f.kind,
        Kind::File {
            size: 6,
            etag: store.head("x/file").await.unwrap().etag.into()
        }
    );
    assert!(ns.lookup(x.ino, "dir").await.unwrap().is_dir());
    // (The first "nope" is answered by a probe or by the listing of x the first lookup in x
    // started, whichever comes first; the second asks nobody.)
    assert_eq!(
        ns.lookup(x.ino, "nope").await,
        Err(NamespaceError::NotFound)
    );
    let (heads, lists) = (store.count(Op::Head), store.count(Op::List));
    assert_eq!(
        ns.lookup(x.ino, "nope").await,
        Err(NamespaceError::NotFound)
    );
    assert_eq!(
        (store.count(Op::Head), store.count(Op::List)),
        (heads, lists),
        "negative lookup cached"
    );
    // Inode numbers are stable: a listing keeps what lookups handed out.
    let listed = ns.readdir(x.ino).await.unwrap();
    assert_eq!(
        listed
            .iter()
            .find(|e| ns.name_of(e) == "file")
            .unwrap()
            .ino(),
        f.ino
    );
    assert_eq!(ns.lookup(x.ino, "file").await.unwrap().ino, f.ino);
}

#[tokio::test]
async fn ttl_zero_revalidates_and_sees_changes() {
    let (store, ns) = ns_with(&["f"], 1000, MetadataTtl::For(Duration::ZERO));
    let a = ns.lookup(ROOT_INO, "f").await.unwrap();
    store.put("f", "a longer body");
    let b = ns.lookup(ROOT_INO, "f").await.unwrap();
    assert_eq!(a.ino, b.ino);
    assert_ne!(a.kind, b.kind);
    let target = ns.open_target(b.ino).await.unwrap();
    assert_eq!(target.size, 13);
    store.remove("f");
    assert_eq!(
        ns.lookup(ROOT_INO, "f").await,
        Err(NamespaceError::NotFound)
    );
    let listing = ns.readdir(ROOT_INO).await.unwrap();
    assert!(listing.is_empty());
}

#[tokio::test]
async fn indefinite_ttl_never_asks_again() {
    let (store, ns) = ns_with(&["f", "g/h"], 1000, MetadataTtl::Indefinite);
    ns.readdir(ROOT_INO).await.unwrap();
    store.reset_counts();
    let f = ns.lookup(ROOT_INO, "f").await.unwrap();
    ns.getattr(f.ino).await.unwrap();
    ns.open_target(f.ino).await.unwrap();
    assert_eq!(
        ns.lookup(ROOT_INO, "zzz").await,
        Err(NamespaceError::NotFound)
    );
    assert_eq!(store.count(Op::List) + store.count(Op::Head), 0);
}

#[tokio::test]
async fn prefix_mount_shows_only_the_prefix() {
    let store = Arc::new(MemoryStore::new());
    for k in ["ds/train/a", "ds/val/b", "other/c", "dsx"] {
        store.put(k, "1");
    }
    let ns = Namespace::new(store, "ds/", MetadataTtl::Indefinite);
    let root = ns.readdir(ROOT_INO).await.unwrap();
    assert_eq!(
        names(&ns, &root),
        vec![("train".into(), true), ("val".into(), true)]
    );
    let train = ns.lookup(ROOT_INO, "train").await.unwrap();
    let a = ns.lookup(train.ino, "a").await.unwrap();
    assert_eq!(ns.open_target(a.ino).await.unwrap().key, "ds/train/a");
}

#[tokio::test]
async fn store_errors_surface() {
    let (store, ns) = ns_with(&["f"], 1000, MetadataTtl::Indefinite);
    store.inject(Op::List, Fault::Error(StoreError::AccessDenied("x".into())));
    assert!(matches!(
        ns.readdir(ROOT_INO).await,
        Err(NamespaceError::Store(StoreError::AccessDenied(_)))
    ));
    // A later attempt works.
    assert_eq!(ns.readdir(ROOT_INO).await.unwrap().len(), 1);
    let f = ns.lookup(ROOT_INO, "f").await.unwrap();
    assert_eq!(ns.readdir(f.ino).await, Err(NamespaceError::NotADirectory));
    assert_eq!(
        ns.open_target(ROOT_INO).await,
        Err(NamespaceError::IsADirectory)
    );
}

#[tokio::test]
async fn a_lookup_miss_lists_the_directory_in_the_background() {
    let keys: Vec<String> = (0..10).map(|i| format!("dir/f{i}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let (store, ns) = ns_with(&refs, 1000, MetadataTtl::Indefinite);
    let dir = ns.lookup(ROOT_INO, "dir").await.unwrap();
    ns.lookup(dir.ino, "f0").await.unwrap();
    // Wait for the background listing of "dir" to land.
    crate::test_support::eventually("the listing", || ns.has_fresh_listing(dir.ino)).await;
    let heads = store.count(Op::Head);
    for i in 1..10 {
        ns.lookup(dir.ino, &format!("f{i}")).await.unwrap();
    }
    assert_eq!(
        store.count(Op::Head),
        heads,
        "later lookups are answered by the listing"
    );
}

#[tokio::test]
async fn resolves_paths_and_finds_listing_positions() {
    let (_, ns) = ns_with(
        &["a/b/c.txt", "a/b/d.txt", "a/x"],
        1000,
        MetadataTtl::Indefinite,
    );
    let c = ns.resolve("a/b/c.txt").await.unwrap();
    assert_eq!(ns.relative_path(c.ino), "a/b/c.txt");
    assert_eq!(ns.resolve("").await.unwrap().ino, ROOT_INO);
    assert_eq!(ns.resolve("a/nope").await, Err(NamespaceError::NotFound));
    let b = ns.resolve("a/b").await.unwrap();
    ns.readdir(b.ino).await.unwrap();
    let d = ns.resolve("a/b/d.txt").await.unwrap();
    let (parent, listing, i) = ns.listing_position(d.ino).unwrap();
    assert_eq!((parent, listing.len(), i), (b.ino, 2, 1));
}

#[tokio::test]
async fn a_superseded_file_name_moves_to_a_new_inode_and_stays_there() {
    let (store, ns) = ns_with(&["d/a.bin", "d/b.bin"], 100, MetadataTtl::Indefinite);
    let dir = ns.lookup(ROOT_INO, "d").await.unwrap().ino;
    let listed = ns.readdir(dir).await.unwrap();
    let old = ns.lookup(dir, "a.bin").await.unwrap().ino;
    let new = ns.supersede(old).expect("a file can be superseded");
    assert_ne!(new, old);
    assert_eq!(ns.lookup(dir, "a.bin").await.unwrap().ino, new);
    assert_eq!(ns.relative_path(new), "d/a.bin");
    assert_eq!(
        ns.open_target(new).await.unwrap(),
        ns.open_target(old).await.unwrap(),
        "the new inode starts with the attributes last known"
    );
    // Superseding the old inode again does not move the name a second time.
    assert_eq!(ns.supersede(old), Some(new));
    // The next listing hands out the new inode for the name, and the others keep theirs.
    let relisted = ns.readdir(dir).await.unwrap();
    let ino_of = |entries: &[DirEntry], name: &str| {
        entries
            .iter()
            .find(|e| ns.name_of(e) == name)
            .map(|e| e.ino())
    };
    assert_eq!(ino_of(&relisted, "a.bin"), Some(new));
    assert_eq!(ino_of(&relisted, "b.bin"), ino_of(&listed, "b.bin"));
    assert!(
        store.count(Op::List) >= 2,
        "the listing was dropped and made again"
    );
    // Directories and the root keep their inodes.
    assert_eq!(ns.supersede(dir), None);
    assert_eq!(ns.supersede(ROOT_INO), None);
}

/// A namespace over `n` files in directory `dir` (listed `page` keys at a time) of a store
/// that answers in 30 ms (paused test time), and the files' paths.
fn slow_store_with_files(
    dir: &str,
    n: usize,
    page: usize,
    ttl: MetadataTtl,
) -> (Arc<MemoryStore>, Arc<Namespace>, Vec<String>) {
    let paths: Vec<String> = (0..n).map(|i| format!("{dir}/f{i:03}")).collect();
    let keys: Vec<&str> = paths.iter().map(String::as_str).collect();
    let (store, ns) = ns_with(&keys, page, ttl);
    store.set_latency(Duration::from_millis(30));
    (store, ns, paths)
}

/// Resolves every path at once (as the plan scheduler and a sampler's workers do) and checks
/// that each is the file it names.
async fn resolve_all_at_once(ns: &Arc<Namespace>, paths: &[String]) {
    let tasks: Vec<_> = paths
        .iter()
        .map(|p| {
            let (ns, p) = (ns.clone(), p.clone());
            tokio::spawn(async move { ns.resolve(&p).await })
        })
        .collect();
    for (task, path) in tasks.into_iter().zip(paths) {
        let attr = task
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(matches!(attr.kind, Kind::File { .. }), "{path}");
        assert_eq!(ns.relative_path(attr.ino), *path);
    }
}

#[tokio::test(start_paused = true)]
async fn concurrent_lookups_in_an_unlisted_directory_share_its_listing() {
    let (store, ns, paths) = slow_store_with_files("d", 40, 1000, MetadataTtl::Indefinite);
    resolve_all_at_once(&ns, &paths).await;
    // The first lookup of each level probes (a HEAD and a one-key LIST) while the level's
    // listing runs; the other 39 wait for the listing. Before, each of the 40 probed both
    // levels: 80 HEADs and 80 LISTs.
    assert_eq!(store.count(Op::Head), 2, "one probe of d, one of a file");
    assert_eq!(store.count(Op::List), 4, "two probes, two listings");
}

#[tokio::test(start_paused = true)]
async fn lookups_do_not_wait_for_a_listing_of_many_pages() {
    let (store, ns, paths) = slow_store_with_files("big", 25, 4, MetadataTtl::Indefinite);
    let dir = ns.lookup(ROOT_INO, "big").await.unwrap().ino;
    let (listing, ()) = futures::join!(ns.readdir(dir), resolve_all_at_once(&ns, &paths[..10]));
    assert_eq!(listing.unwrap().len(), 25, "readdir waits for every page");
    // Seven pages take 210 ms; the lookups were released after the first page and probed.
    assert!(
        store.count(Op::Head) >= 10,
        "{} HEADs: every lookup probed",
        store.count(Op::Head)
    );
    let relisted = ns.readdir(dir).await.unwrap();
    assert_eq!(relisted.len(), 25, "one listing, shared, then fresh");
}

#[tokio::test(start_paused = true)]
async fn concurrent_readdirs_share_one_listing() {
    let (store, ns, _) = slow_store_with_files("d", 30, 7, MetadataTtl::For(Duration::ZERO));
    let dir = ns.lookup(ROOT_INO, "d").await.unwrap().ino;
    store.reset_counts();
    let all = futures::future::join_all((0..6).map(|_| ns.readdir(dir))).await;
    for listing in all {
        assert_eq!(listing.unwrap().len(), 30);
    }
    // Even with a zero TTL, callers that waited for a listing take it: five pages, once.
    assert_eq!(store.count(Op::List), 5);
}

// ---- Listing ahead (module `background`) and saved listings (module `kept`) ----

mod ahead_and_kept {
    use crate::store::RangeRequest;
    use std::collections::BTreeSet;
    use std::sync::atomic::{AtomicU64, Ordering};

    use async_trait::async_trait;
    use bytes::Bytes;

    use super::*;
    use crate::namespace::background::FanoutConfig;
    use crate::namespace::saved::SavedListings;
    use crate::store::retry::{RetryPolicy, RetryingStore};
    use crate::store::ListPage;
    use crate::test_support::eventually;

    /// A store that records the most LISTs in progress at once.
    struct ListGauge {
        inner: Arc<MemoryStore>,
        active: AtomicU64,
        max: AtomicU64,
    }

    #[async_trait]
    impl ObjectStore for ListGauge {
        async fn list_page(&self, req: ListRequest<'_>) -> Result<ListPage, StoreError> {
            let now = self.active.fetch_add(1, Ordering::SeqCst) + 1;
            self.max.fetch_max(now, Ordering::SeqCst);
            let page = self.inner.list_page(req).await;
            self.active.fetch_sub(1, Ordering::SeqCst);
            page
        }
        async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError> {
            self.inner.head(key).await
        }
        async fn get_range(&self, req: RangeRequest<'_>) -> Result<Bytes, StoreError> {
            self.inner.get_range(req).await
        }
    }

    /// `dirs` class directories of `files` files each under `train/`, pages of `page` keys.
    fn tree(dirs: usize, files: usize, page: usize) -> (Arc<MemoryStore>, BTreeSet<String>) {
        let store = Arc::new(MemoryStore::with_page_size(page));
        let mut keys = BTreeSet::new();
        for d in 0..dirs {
            for f in 0..files {
                let key = format!("train/c{d:03}/img{f:03}.jpg");
                store.put(&key, vec![d as u8; 10 + f]);
                keys.insert(key);
            }
        }
        (store, keys)
    }

    fn options(concurrency: usize, kept: Option<Arc<SavedListings>>) -> NamespaceOptions {
        NamespaceOptions {
            fanout: Some(FanoutConfig {
                concurrency,
                ..FanoutConfig::default()
            }),
            kept,
            ..NamespaceOptions::default()
        }
    }

    /// Walks the tree depth first, one directory at a time (as `find` does), and returns every
    /// file path seen, duplicates included.
    async fn walk(ns: &Arc<Namespace>) -> Vec<String> {
        let mut files = Vec::new();
        let mut stack = vec![(ROOT_INO, String::new())];
        while let Some((ino, path)) = stack.pop() {
            let entries = ns.readdir(ino).await.expect("readdir");
            for e in entries.iter().rev() {
                let p = format!("{path}{}", ns.name_of(e));
                if e.is_dir() {
                    stack.push((e.ino(), format!("{p}/")));
                } else {
                    files.push(p);
                }
            }
        }
        files
    }

    fn exactly_once(seen: Vec<String>, keys: &BTreeSet<String>) {
        let n = seen.len();
        let set: BTreeSet<String> = seen.into_iter().collect();
        assert_eq!(set.len(), n, "an entry was seen twice");
        assert_eq!(&set, keys);
    }

    #[tokio::test(start_paused = true)]
    async fn a_walk_lists_ahead_within_the_bound_and_sees_every_entry_once() {
        // 60 directories of 25 files in pages of 10 (three pages each), 30 ms per LIST.
        let (mem, keys) = tree(60, 25, 10);
        mem.set_latency(Duration::from_millis(30));
        let gauge = Arc::new(ListGauge {
            inner: mem.clone(),
            active: AtomicU64::new(0),
            max: AtomicU64::new(0),
        });
        let ns =
            Namespace::with_options(gauge.clone(), "", MetadataTtl::Indefinite, options(8, None));
        let start = tokio::time::Instant::now();
        exactly_once(walk(&ns).await, &keys);
        let took = start.elapsed();
        // One LIST per page of each directory (root, `train` of 6 pages, 60 classes of 3):
        // nothing listed twice although readers and background listings met on every one.
        assert_eq!(mem.count(Op::List), 1 + 6 + 60 * 3);
        let max = gauge.max.load(Ordering::SeqCst);
        // 8 in the background plus the one demand listing of the walker.
        assert!(max <= 9, "{max} LISTs at once");
        assert!(
            max >= 8,
            "only {max} LISTs at once: nothing ran in parallel"
        );
        let stats = ns.listing_stats();
        assert!(stats.background >= 55, "{stats:?}");
        assert_eq!(stats.from_store, 62);
        // One after another: 187 × 30 ms = 5.6 s; ahead: ~8 rounds of 8 directories of 3 pages.
        assert!(took < Duration::from_millis(2500), "the walk took {took:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn listing_ahead_goes_one_level_below_what_is_read() {
        let (mem, _) = tree(20, 2, 1000);
        let ns =
            Namespace::with_options(mem.clone(), "", MetadataTtl::Indefinite, options(4, None));
        ns.readdir(ROOT_INO).await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            mem.count(Op::List),
            2,
            "the root and `train`, not the classes"
        );
        let train = ns.lookup(ROOT_INO, "train").await.unwrap().ino;
        ns.readdir(train).await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(mem.count(Op::List), 22);
        // A zero TTL lists nothing ahead.
        let (mem, _) = tree(5, 1, 1000);
        let ns = Namespace::with_options(
            mem.clone(),
            "",
            MetadataTtl::For(Duration::ZERO),
            options(4, None),
        );
        ns.readdir(ROOT_INO).await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(mem.count(Op::List), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn errors_and_503s_in_background_listings_lose_no_entry() {
        let (mem, keys) = tree(30, 4, 1000);
        mem.set_latency(Duration::from_millis(30));
        let policy = RetryPolicy {
            max_attempts: 4,
            base_delay: Duration::from_millis(5),
            max_delay: Duration::from_millis(50),
        };
        let retrying = Arc::new(RetryingStore::new(mem.clone(), policy));
        let ns = Namespace::with_options(
            retrying.clone(),
            "",
            MetadataTtl::Indefinite,
            options(4, None),
        );
        let train = ns.lookup(ROOT_INO, "train").await.unwrap().ino;
        ns.readdir(ROOT_INO).await.unwrap();
        // `train` is listed in the background with five 503s first (retried), and then the
        // classes: two of their listings fail for good (a final error, not retried).
        tokio::time::sleep(Duration::from_secs(1)).await;
        for _ in 0..5 {
            mem.inject(
                Op::List,
                Fault::Error(StoreError::Transient("503 SlowDown".into())),
            );
        }
        ns.readdir(train).await.unwrap();
        for _ in 0..2 {
            mem.inject(Op::List, Fault::Error(StoreError::Other("boom".into())));
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        let stats = ns.listing_stats();
        assert_eq!(stats.background_failed, 2, "{stats:?}");
        assert!(retrying.retries() >= 5);
        // The walk lists the two failed directories itself and sees everything once.
        exactly_once(walk(&ns).await, &keys);
        assert_eq!(ns.listing_stats().from_store, 32);
    }

    /// Mounts `store` with saved listings under `dir`, walks it, and waits until every listing
    /// is on disk.
    async fn first_mount(store: Arc<MemoryStore>, dir: &std::path::Path, dirs: u64) {
        let kept = Arc::new(SavedListings::new(dir, "http://rgw", "bucket"));
        let ns =
            Namespace::with_options(store, "", MetadataTtl::Indefinite, options(8, Some(kept)));
        ns.check_access().await.unwrap();
        walk(&ns).await;
        eventually("every listing kept on disk", || {
            ns.listing_stats().saved_written == dirs
        })
        .await;
    }

    fn remount(store: Arc<MemoryStore>, dir: &std::path::Path, ttl: MetadataTtl) -> Arc<Namespace> {
        let kept = Arc::new(SavedListings::new(dir, "http://rgw", "bucket"));
        Namespace::with_options(store, "", ttl, options(8, Some(kept)))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_kept_listing_is_used_only_while_fresh_and_after_the_access_check() {
        let cache = tempfile::tempdir().unwrap();
        let (mem, keys) = tree(10, 5, 1000);
        first_mount(mem.clone(), cache.path(), 12).await;

        // Before the access check nothing kept is used: the store is listed.
        mem.reset_counts();
        let kept = Arc::new(SavedListings::new(cache.path(), "http://rgw", "bucket"));
        let no_fanout = NamespaceOptions {
            fanout: None,
            kept: Some(kept),
            ..NamespaceOptions::default()
        };
        let unchecked =
            Namespace::with_options(mem.clone(), "", MetadataTtl::Indefinite, no_fanout);
        unchecked.readdir(ROOT_INO).await.unwrap();
        assert_eq!(unchecked.listing_stats().from_disk, 0);
        assert_eq!(mem.count(Op::List), 1);
        // It keeps what it listed, on a blocking thread: let that land before the files are
        // aged below, or it could replace the aged root listing with a fresh one.
        eventually("the unchecked mount's listing kept", || {
            unchecked.listing_stats().saved_written == 1
        })
        .await;

        // After it (one LIST of the mount root), a remount's walk lists nothing.
        let ns = remount(mem.clone(), cache.path(), MetadataTtl::Indefinite);
        ns.check_access().await.unwrap();
        mem.reset_counts();
        exactly_once(walk(&ns).await, &keys);
        assert_eq!(mem.count(Op::List), 0);
        assert_eq!(ns.listing_stats().from_disk, 12);
        // Attributes come from the saved listing too: a lookup costs no request.
        let attr = ns.resolve("train/c003/img004.jpg").await.unwrap();
        assert!(matches!(attr.kind, Kind::File { size: 14, .. }));
        assert_eq!(mem.count(Op::Head) + mem.count(Op::List), 0);

        // Listings two minutes old: fresh with `indefinite`, stale under a 60 s TTL.
        let kept = SavedListings::new(cache.path(), "http://rgw", "bucket");
        kept.grant_access();
        let mut prefixes = vec![String::new(), "train/".to_string()];
        prefixes.extend((0..10).map(|d| format!("train/c{d:03}/")));
        for p in &prefixes {
            let old = kept.load(p).unwrap().unwrap();
            let taken = old.taken - Duration::from_secs(120);
            kept.store(p, taken, &old.listing).unwrap();
        }
        let stale = remount(
            mem.clone(),
            cache.path(),
            MetadataTtl::For(Duration::from_secs(60)),
        );
        stale.check_access().await.unwrap();
        mem.reset_counts();
        exactly_once(walk(&stale).await, &keys);
        assert_eq!(stale.listing_stats().from_disk, 0);
        assert_eq!(mem.count(Op::List), 12);
        // Its listings are written on blocking threads after the walk saw them: wait for
        // them, so that the next mount finds every file in place.
        eventually("the stale mount's listings kept again", || {
            stale.listing_stats().saved_written == 12
        })
        .await;
        let ns = remount(
            mem.clone(),
            cache.path(),
            MetadataTtl::For(Duration::from_secs(600)),
        );
        ns.check_access().await.unwrap();
        mem.reset_counts();
        exactly_once(walk(&ns).await, &keys);
        // (The 60 s mount above rewrote them as it listed: fresh again.) This mount's own
        // counters, not the shared store's: nothing from the store, every listing from disk.
        let stats = ns.listing_stats();
        assert_eq!((stats.from_store, stats.from_disk), (0, 12), "{stats:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_listing_kept_with_other_credentials_is_not_used_when_the_check_fails() {
        let cache = tempfile::tempdir().unwrap();
        let (mem, _) = tree(3, 2, 1000);
        first_mount(mem.clone(), cache.path(), 5).await;
        // Another mount whose credentials may not list the bucket.
        let ns = remount(mem.clone(), cache.path(), MetadataTtl::Indefinite);
        let denied = || Fault::Error(StoreError::AccessDenied("403".into()));
        mem.inject(Op::List, denied());
        assert!(ns.check_access().await.is_err());
        mem.inject(Op::List, denied());
        assert_eq!(
            ns.readdir(ROOT_INO).await,
            Err(NamespaceError::Store(StoreError::AccessDenied(
                "403".into()
            )))
        );
        assert_eq!(ns.listing_stats().from_disk, 0);
        assert!(
            ns.lookup_cached(ROOT_INO, "train").is_none(),
            "nothing kept leaked"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_torn_kept_listing_is_ignored_never_half_used() {
        let cache = tempfile::tempdir().unwrap();
        let (mem, keys) = tree(4, 50, 1000);
        first_mount(mem.clone(), cache.path(), 6).await;
        let kept = SavedListings::new(cache.path(), "http://rgw", "bucket");
        // A crash tore one directory's file (half of it reached the disk), and left a
        // temporary file of another behind.
        let torn = kept.path_for("train/c002/");
        let bytes = std::fs::read(&torn).unwrap();
        std::fs::write(&torn, &bytes[..bytes.len() / 2]).unwrap();
        let other = kept.path_for("train/c001/");
        std::fs::rename(&other, other.with_extension("lst.tmp.1.0")).unwrap();
        let ns = remount(mem.clone(), cache.path(), MetadataTtl::Indefinite);
        ns.check_access().await.unwrap();
        mem.reset_counts();
        exactly_once(walk(&ns).await, &keys);
        let stats = ns.listing_stats();
        assert_eq!(stats.saved_ignored, 1, "{stats:?}");
        assert_eq!(stats.from_disk, 4);
        assert_eq!(
            mem.count(Op::List),
            2,
            "the two directories listed from the store"
        );
    }
}

#[test]
fn etags_are_kept_compact_and_given_back_exactly() {
    let md5 = "0123456789abcdef0123456789abcdef";
    assert!(matches!(StoredEtag::new(md5), StoredEtag::Md5(_)));
    for etag in [
        md5,
        "0123456789ABCDEF0123456789ABCDEF",
        "0123456789abcdef0123456789abcdef-12",
        "0123456789abcdef0123456789abcdeg",
        "\"0123456789abcdef0123456789abcde\"",
        "",
        "é-not-hex-at-all-but-32-bytes-ok",
    ] {
        assert_eq!(&*StoredEtag::new(etag).text(), etag, "{etag}");
    }
    assert!(matches!(
        StoredEtag::new("0123456789ABCDEF0123456789ABCDEF"),
        StoredEtag::Text(_)
    ));
}

#[test]
fn compact_times_keep_their_order_and_meaning() {
    let now = Instant::now();
    assert!(Stamp::at(now).elapsed() < Duration::from_secs(60));
    // Before the process-wide base (a saved listing's age) still fits.
    if let Some(earlier) = now.checked_sub(Duration::from_secs(3600)) {
        let e = Stamp::at(earlier).elapsed();
        assert!(
            e >= Duration::from_secs(3600) && e < Duration::from_secs(3700),
            "{e:?}"
        );
    }
    assert!(Stamp::LONG_AGO.elapsed() > Duration::from_secs(100 * 365 * 24 * 3600));
    let ttl = MetadataTtl::For(Duration::from_secs(5));
    assert!(ttl.is_fresh_stamp(Stamp::at(now)));
    assert!(!ttl.is_fresh_stamp(Stamp::LONG_AGO));
    assert!(MetadataTtl::Indefinite.is_fresh_stamp(Stamp::LONG_AGO));
    let t = SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789);
    assert_eq!(Mtime::new(t).system_time(), t);
    let before_epoch = SystemTime::UNIX_EPOCH - Duration::from_secs(1);
    assert_eq!(
        Mtime::new(before_epoch).system_time(),
        SystemTime::UNIX_EPOCH
    );
}

#[test]
fn a_node_takes_seventy_two_bytes() {
    // The per-object budget (`tests/namespace_memory.rs`) counts on it.
    assert_eq!(std::mem::size_of::<super::Node>(), 72);
}

/// The fs layer's open versions, played: `(inode, ETag)` pairs held open.
#[derive(Default)]
struct HeldOpen(parking_lot::Mutex<Vec<(u64, Arc<str>)>>);

impl VersionsInUse for HeldOpen {
    fn other_version_open(&self, ino: u64, etag: &str) -> bool {
        self.0.lock().iter().any(|(i, e)| *i == ino && &**e != etag)
    }
}

#[tokio::test]
async fn an_open_of_a_new_version_beside_an_open_old_one_moves_the_name_in_one_call() {
    let (store, ns) = ns_with(
        &["d/a.bin"],
        100,
        MetadataTtl::For(Duration::from_secs(3600)),
    );
    let held = HeldOpen::default();
    let dir = ns.lookup(ROOT_INO, "d").await.unwrap().ino;
    let old = ns.lookup(dir, "a.bin").await.unwrap().ino;
    let Opening::Current(v1) = ns.open(old, &held).await.unwrap() else {
        panic!("nothing else is open: the inode is read as it is");
    };
    held.0.lock().push((old, v1.etag.clone()));
    // The same version again: still the same inode.
    assert_eq!(
        ns.open(old, &held).await.unwrap(),
        Opening::Current(v1.clone())
    );
    // Replaced in the store: two opens at once of the old inode both see the new version,
    // and the name gets one new inode.
    store.put("d/a.bin", b"the second version, longer".to_vec());
    ns.invalidate(old); // as when the store refused the old version's read proof
    let (first, second) = tokio::join!(ns.open(old, &held), ns.open(old, &held));
    let (first, second) = (first.unwrap(), second.unwrap());
    let Opening::Moved {
        target: v2,
        to: Some(new),
    } = first.clone()
    else {
        panic!("another version is open: {first:?}");
    };
    assert_eq!(second, first);
    assert_ne!(new, old);
    assert_ne!(v2.etag, v1.etag);
    assert_eq!(v2.key, "d/a.bin");
    assert_eq!(v2.size, 26);
    // The name leads to the new inode, which opens at the new version; the fast path never
    // answers for the old inode while the other version is open.
    assert_eq!(ns.lookup(dir, "a.bin").await.unwrap().ino, new);
    assert_eq!(
        ns.open(new, &held).await.unwrap(),
        Opening::Current(v2.clone())
    );
    assert_eq!(ns.open_cached(new, &held), Some(Ok(v2.clone())));
    assert_eq!(ns.open_cached(old, &held), None);
    // Once the old handle is closed, the old inode opens (at the new version) where it is.
    held.0.lock().clear();
    assert_eq!(ns.open_cached(old, &held), Some(Ok(v2)));
}
