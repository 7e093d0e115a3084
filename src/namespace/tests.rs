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

fn names(entries: &[DirEntry]) -> Vec<(String, bool)> {
    entries
        .iter()
        .map(|e| (e.name.to_string(), e.is_dir))
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
        names(&root),
        vec![
            ("a.txt".into(), false),
            ("big".into(), true),
            ("empty".into(), true),
            ("sub".into(), true)
        ]
    );
    let big = root.iter().find(|e| &*e.name == "big").unwrap().ino;
    let listing = ns.readdir(big).await.unwrap();
    assert_eq!(listing.len(), 25);
    assert!(
        store.count(Op::List) >= 8,
        "25 keys in pages of 4, plus the root"
    );
    let empty = root.iter().find(|e| &*e.name == "empty").unwrap().ino;
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
    assert_eq!(names(&root), vec![("a".into(), true), ("d".into(), true)]);
    let d = root[1].ino;
    let entries = ns.readdir(d).await.unwrap();
    assert_eq!(
        names(&entries),
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
        listed.iter().find(|e| &*e.name == "file").unwrap().ino,
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
        names(&root),
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
    let ino_of =
        |entries: &[DirEntry], name: &str| entries.iter().find(|e| &*e.name == name).map(|e| e.ino);
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
