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
    let before = store.count(Op::Head);
    assert_eq!(
        ns.lookup(x.ino, "nope").await,
        Err(NamespaceError::NotFound)
    );
    assert_eq!(
        ns.lookup(x.ino, "nope").await,
        Err(NamespaceError::NotFound)
    );
    assert_eq!(store.count(Op::Head), before + 1, "negative lookup cached");
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
    // Wait (bounded) for the background listing of "dir" to land.
    for _ in 0..5000 {
        if ns.has_fresh_listing(dir.ino) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(ns.has_fresh_listing(dir.ino));
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
