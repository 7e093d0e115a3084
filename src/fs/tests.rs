//! The adapter's decisions without a kernel: a [`RiffleFs`] over the in-memory store, driven
//! through the functions the FUSE operations call (as mountpoint-s3's `tests/fs.rs` drives
//! its file system through a mock client), each answer checked as the value the adapter
//! would send. Backing files are registered through a stand-in for the kernel ([`Kernel`]),
//! so nothing here needs `/dev/fuse`.

use std::fs::File;
use std::sync::atomic::AtomicU32;
use std::time::{Duration, Instant};

use fuser::BackingId;

use super::answer::OpenAnswer;
use super::backings::Register;
use super::handover::HandleRecord;
use super::node::Node;
use super::*;
use crate::cache::{CacheConfig, DiskCache, SizeLimit};
use crate::fetch::{DiskTier, FetchConfig, ObjectVersion};
use crate::metrics::StatsSource;
use crate::namespace::{MetadataTtl, ROOT_INO};
use crate::prefetch::PrefetchConfig;
use crate::store::memory::MemoryStore;

/// The kernel's side of backing files: every file registered gets the next id.
struct Kernel {
    next: AtomicU32,
}

impl Kernel {
    fn new() -> Kernel {
        Kernel {
            next: AtomicU32::new(1),
        }
    }
}

impl Register for Kernel {
    fn open_backing(&self, _file: &File) -> std::io::Result<BackingId> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        // SAFETY: a detached id is never closed; nothing reaches a kernel here.
        Ok(unsafe { BackingId::detached(id) })
    }

    unsafe fn wrap_backing(&self, id: u32) -> BackingId {
        // SAFETY: as above.
        unsafe { BackingId::detached(id) }
    }
}

/// A mount of `store`, with the NVMe cache in `cache_dir` if given; its metadata never
/// expires.
fn mount(store: &Arc<MemoryStore>, cache_dir: Option<&std::path::Path>) -> RiffleFs {
    mount_with(store, cache_dir, MetadataTtl::Indefinite)
}

fn mount_with(
    store: &Arc<MemoryStore>,
    cache_dir: Option<&std::path::Path>,
    ttl: MetadataTtl,
) -> RiffleFs {
    let ns = Namespace::new(store.clone(), "", ttl);
    let disk = cache_dir.map(|dir| {
        let mut cc = CacheConfig::new(dir, SizeLimit::Bytes(64 << 20));
        cc.min_free = SizeLimit::Bytes(0);
        let cache = DiskCache::open(cc).expect("cache");
        Arc::new(DiskTier::new(
            cache,
            "http://test",
            "bucket",
            "key:test",
            None,
        ))
    });
    let fetcher = Fetcher::new(
        store.clone(),
        FetchConfig::default(),
        tokio::runtime::Handle::current(),
        disk,
    );
    let prefetch = Prefetcher::new(
        ns.clone(),
        fetcher.clone(),
        PrefetchConfig {
            concurrency: 1,
            byte_budget: 1 << 20,
            max_items_ahead: 0,
            max_file_bytes: 1 << 20,
            max_dir_window: 1,
            epoch_prefetch: false,
            eviction_asks_prefetch: false,
        },
    );
    let config = FsConfig {
        uid: 1,
        gid: 2,
        file_mode: 0o444,
        dir_mode: 0o555,
        read_ahead: ReadAheadConfig::default(),
        kernel_read_ahead: 1 << 20,
        io_uring: false,
        passthrough: cache_dir.is_some(),
        lookup_readahead: 0,
        max_idle_backings: 16,
    };
    RiffleFs::new(
        ns,
        fetcher,
        prefetch,
        FuseOps::new(),
        tokio::runtime::Handle::current(),
        config,
        Arc::default(),
    )
}

/// The inode of `name` at the mount root.
async fn ino_of(fs: &RiffleFs, name: &str) -> u64 {
    let entry = fs.meta.lookup(ROOT_INO, name).await.expect("lookup");
    entry.attr.ino.0
}

/// An open of `ino` as the adapter answers it: on the FUSE thread if it can, else on a task.
async fn open(fs: &RiffleFs, ino: u64, kernel: &impl Register) -> OpenAnswer {
    let fh = fs.new_fh();
    let opener = fs.opener();
    match opener.open_now(ino, fh, 0, kernel) {
        Some(answer) => answer,
        None => opener.open_later(ino, fh, 0, kernel).await,
    }
}

/// The whole of handle `fh` of `ino`, read as the adapter reads on a task.
async fn read_all(fs: &RiffleFs, ino: u64, fh: u64) -> Result<Bytes, Errno> {
    let reader = fs.handles.reader(fh).ok_or(Errno::EBADF)?;
    let size = reader.object().size;
    let range = reader.begin_read(0, size as u32);
    fs.reads().read(ino, &reader, range, 0, size as u32).await
}

fn served(fh: u64, flags: FopenFlags) -> impl Fn(&OpenAnswer) -> bool {
    move |answer| matches!(answer, OpenAnswer::Served { fh: f, flags: g } if *f == fh && *g == flags)
}

fn passthrough_id(answer: &OpenAnswer) -> Option<u32> {
    match answer {
        OpenAnswer::Passthrough { backing, .. } => Some(backing.id()),
        _ => None,
    }
}

#[tokio::test]
async fn without_passthrough_opens_are_served_and_keep_the_pages_of_the_same_version() {
    let store = Arc::new(MemoryStore::new());
    store.put("a", b"hello".to_vec());
    let fs = mount(&store, None);
    let kernel = Kernel::new();
    let ino = ino_of(&fs, "a").await;
    let first = open(&fs, ino, &kernel).await;
    let fh = first.fh().expect("opened");
    assert!(served(fh, FopenFlags::empty())(&first), "{first:?}");
    assert_eq!(&read_all(&fs, ino, fh).await.expect("read")[..], b"hello");
    fs.release_handle(Node::Object(ino), fh);
    // Attributes in memory: answered on the FUSE thread, and the pages are this version's.
    let fh = fs.new_fh();
    let again = fs.opener().open_now(ino, fh, 0, &kernel).expect("fast");
    assert!(
        served(fh, FopenFlags::FOPEN_KEEP_CACHE)(&again),
        "{again:?}"
    );
    assert_eq!(fs.meta.status.opens.load(Ordering::Relaxed), 2);
    assert_eq!(fs.meta.status.passthrough_opens.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn an_open_of_a_changed_object_is_stale_while_the_old_version_is_open() {
    let store = Arc::new(MemoryStore::new());
    store.put("a", b"old".to_vec());
    // Every open revalidates (close-to-open consistency with a TTL of zero).
    let fs = mount_with(&store, None, MetadataTtl::For(Duration::ZERO));
    let kernel = Kernel::new();
    let ino = ino_of(&fs, "a").await;
    let old = open(&fs, ino, &kernel).await.fh().expect("opened");
    store.put("a", b"new!".to_vec());
    let answer = open(&fs, ino, &kernel).await;
    assert!(matches!(answer, OpenAnswer::Stale), "{answer:?}");
    // The kernel looks the name up again: a new inode, which opens at the new version.
    let moved = ino_of(&fs, "a").await;
    assert_ne!(moved, ino);
    let fh = open(&fs, moved, &kernel).await.fh().expect("opened");
    assert_eq!(&read_all(&fs, moved, fh).await.expect("read")[..], b"new!");
    // The old handle's version is gone from the store: its read fails (EIO, not the new
    // version's bytes).
    assert_eq!(read_all(&fs, ino, old).await, Err(Errno::EIO));
}

#[tokio::test]
async fn a_read_of_a_handle_it_does_not_know_is_ebadf() {
    let store = Arc::new(MemoryStore::new());
    let fs = mount(&store, None);
    assert_eq!(read_all(&fs, 2, 99).await, Err(Errno::EBADF));
}

/// Waits until `obj` can be handed to the kernel for passthrough (complete and verified).
async fn until_passthrough_ready(fs: &RiffleFs, obj: &ObjectVersion) {
    let disk = fs.fetcher.disk().expect("disk").clone();
    let deadline = Instant::now() + Duration::from_secs(60);
    while disk.passthrough_file(obj).await.is_none() {
        assert!(Instant::now() < deadline, "never ready for passthrough");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_once_the_file_is_cached_and_verified_else_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(MemoryStore::new());
    let etag = store.put("a", vec![7u8; 10_000]);
    let fs = mount(&store, Some(dir.path()));
    fs.passthrough.store(true, Ordering::Relaxed); // as `configure` sets it at INIT
    let kernel = Kernel::new();
    let ino = ino_of(&fs, "a").await;
    // Not cached yet: served by the daemon, which reads it into the cache.
    let first = open(&fs, ino, &kernel).await;
    let fh = first.fh().expect("opened");
    assert!(served(fh, FopenFlags::empty())(&first), "{first:?}");
    assert_eq!(read_all(&fs, ino, fh).await.expect("read").len(), 10_000);
    fs.release_handle(Node::Object(ino), fh);
    let object = ObjectVersion {
        key: Arc::from("a"),
        etag: Arc::from(etag.as_str()),
        size: 10_000,
    };
    until_passthrough_ready(&fs, &object).await;
    // Cached and verified: the task registers the file with the kernel.
    let second = open(&fs, ino, &kernel).await;
    assert_eq!(passthrough_id(&second), Some(1), "{second:?}");
    assert_eq!(fs.meta.status.fast_opens.load(Ordering::Relaxed), 0);
    // Another open while it is open: the one in use, on the FUSE thread.
    let fh = fs.new_fh();
    let third = fs.opener().open_now(ino, fh, 0, &kernel).expect("fast");
    assert_eq!(passthrough_id(&third), Some(1));
    // All closed: the idle backing file answers the next open, on the FUSE thread too.
    fs.release_handle(Node::Object(ino), second.fh().expect("fh"));
    fs.release_handle(Node::Object(ino), fh);
    drop((second, third));
    let fh = fs.new_fh();
    let fourth = fs.opener().open_now(ino, fh, 0, &kernel).expect("fast");
    assert_eq!(passthrough_id(&fourth), Some(1));
    assert_eq!(fs.meta.status.fast_opens.load(Ordering::Relaxed), 2);
    assert_eq!(fs.meta.status.passthrough_opens.load(Ordering::Relaxed), 3);
    assert_eq!(kernel.next.load(Ordering::Relaxed), 2, "registered once");
}

struct Fixed;
impl StatsSource for Fixed {
    fn stats(&self) -> serde_json::Value {
        serde_json::json!({"volume": {"listed_bytes": 5}})
    }
}

#[tokio::test]
async fn the_stats_file_answers_lookup_getattr_open_read_and_release() {
    let store = Arc::new(MemoryStore::new());
    store.put("a", b"x".to_vec());
    let fs = mount(&store, None);
    fs.stats_file().set_source(Arc::new(Fixed));
    let entry = fs
        .meta
        .lookup(ROOT_INO, stats_file::NAME)
        .await
        .expect("found");
    assert_eq!(entry.attr.ino.0, stats_file::INO);
    assert_eq!(entry.ttl, Duration::ZERO);
    assert_eq!(Node::of(stats_file::INO), Node::Stats);
    let attr = fs.meta.getattr_now(Node::Stats, None);
    let attr = attr.expect("answer").expect("attr");
    assert_eq!(
        (attr.attr.ino, attr.attr.size, attr.ttl),
        (entry.attr.ino, entry.attr.size, Duration::ZERO)
    );
    // Not in a directory below the root.
    let a = ino_of(&fs, "a").await;
    assert_eq!(Node::of(a), Node::Object(a));
    assert!(fs.meta.lookup(a, stats_file::NAME).await.is_err());
    let fh = fs.new_fh();
    let opened = fs.meta.stats_file.open(fh);
    assert!(
        served(fh, FopenFlags::FOPEN_DIRECT_IO)(&opened),
        "{opened:?}"
    );
    let doc = fs.meta.stats_file.read(fh, 0, 1 << 16).expect("read");
    let value: serde_json::Value = serde_json::from_slice(&doc).expect("json");
    assert_eq!(value["volume"]["listed_bytes"], 5);
    let tail = fs.meta.stats_file.read(fh, 2, 1 << 16).expect("read");
    assert_eq!(tail, doc.slice(2..));
    let fstat = fs.meta.getattr_now(Node::Stats, Some(fh));
    assert_eq!(
        fstat.expect("answer").expect("attr").attr.size,
        doc.len() as u64
    );
    assert_eq!(fs.xattr_names(Node::Stats), Ok(&b""[..]));
    fs.release_handle(Node::Stats, fh);
    assert_eq!(fs.meta.stats_file.open_handles(), 0);
}

#[tokio::test]
async fn an_object_named_like_the_stats_file_wins() {
    let store = Arc::new(MemoryStore::new());
    store.put(stats_file::NAME, b"mine".to_vec());
    let fs = mount(&store, None);
    let ino = ino_of(&fs, stats_file::NAME).await;
    assert_ne!(ino, stats_file::INO);
    assert_eq!(Node::of(ino), Node::Object(ino));
}

#[tokio::test]
async fn handles_taken_over_from_a_predecessor_read_and_release() {
    let store = Arc::new(MemoryStore::new());
    store.put("a", b"served".to_vec());
    let b_etag = store.put("b", b"passed".to_vec());
    let table = Arc::new(HandleTable::create().expect("table"));
    let kernel = Kernel::new();
    let predecessor = mount(&store, None);
    predecessor.keep_handles_in(table.clone());
    let a = ino_of(&predecessor, "a").await;
    let b = ino_of(&predecessor, "b").await;
    let fh_a = open(&predecessor, a, &kernel).await.fh().expect("opened");
    // A passthrough handle of the predecessor's, through backing id 42.
    let fh_b = table.next_fh();
    assert!(table.record(&HandleRecord {
        fh: fh_b,
        ino: b,
        size: 6,
        etag: b_etag.clone(),
        backing: Some(42),
    }));
    drop(predecessor);

    let mut successor = mount(&store, None);
    // The node journal gives a successor the same inodes; here, the same lookups in order.
    assert_eq!(
        (ino_of(&successor, "a").await, ino_of(&successor, "b").await),
        (a, b)
    );
    let params = InitParams {
        abi: (7, 40),
        offered: 0,
        requested: 0,
        made_by: "test".into(),
    };
    successor.adopt(&params, table.clone()).expect("adopt");
    assert_eq!(
        &read_all(&successor, a, fh_a).await.expect("read")[..],
        b"served"
    );
    assert_eq!(successor.handles.opens.served(a), 1);
    // An open of the passthrough handle's inode and version gets its backing id.
    let answer = open(&successor, b, &kernel).await;
    assert_eq!(passthrough_id(&answer), Some(42), "{answer:?}");
    // Handle numbers continue the predecessor's.
    assert!(answer.fh().expect("fh") > fh_b);
    successor.release_handle(Node::Object(a), fh_a);
    assert_eq!(successor.handles.opens.served(a), 0);
    assert!(table.live().iter().all(|h| h.fh != fh_a));
}

#[tokio::test]
async fn a_release_of_an_unknown_handle_changes_nothing() {
    let store = Arc::new(MemoryStore::new());
    store.put("a", b"x".to_vec());
    let fs = mount(&store, None);
    let kernel = Kernel::new();
    let ino = ino_of(&fs, "a").await;
    let fh = open(&fs, ino, &kernel).await.fh().expect("opened");
    fs.release_handle(Node::Object(ino), fh + 100);
    fs.release_handle(Node::Stats, fh + 100);
    assert_eq!(fs.handles.opens.served(ino), 1);
    assert_eq!(&read_all(&fs, ino, fh).await.expect("read")[..], b"x");
    fs.release_handle(Node::Object(ino), fh);
    assert_eq!(fs.handles.opens.served(ino), 0);
    assert_eq!(read_all(&fs, ino, fh).await, Err(Errno::EBADF));
}

/// A kernel that refuses backing files (a daemon without `CAP_SYS_ADMIN`).
struct Refusing;

impl Register for Refusing {
    fn open_backing(&self, _file: &File) -> std::io::Result<BackingId> {
        Err(std::io::Error::from_raw_os_error(libc::EPERM))
    }

    unsafe fn wrap_backing(&self, id: u32) -> BackingId {
        // SAFETY: a detached id is never closed.
        unsafe { BackingId::detached(id) }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_that_refuses_backing_files_turns_passthrough_off_and_is_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(MemoryStore::new());
    let etag = store.put("a", vec![3u8; 5000]);
    let fs = mount(&store, Some(dir.path()));
    fs.passthrough.store(true, Ordering::Relaxed);
    let ino = ino_of(&fs, "a").await;
    let fh = open(&fs, ino, &Kernel::new()).await.fh().expect("opened");
    read_all(&fs, ino, fh).await.expect("read");
    fs.release_handle(Node::Object(ino), fh);
    let object = ObjectVersion {
        key: Arc::from("a"),
        etag: Arc::from(etag.as_str()),
        size: 5000,
    };
    until_passthrough_ready(&fs, &object).await;
    let answer = open(&fs, ino, &Refusing).await;
    let fh = answer.fh().expect("opened");
    assert!(
        served(fh, FopenFlags::FOPEN_KEEP_CACHE)(&answer),
        "{answer:?}"
    );
    assert!(!fs.passthrough.load(Ordering::Relaxed));
    assert!(fs
        .meta
        .status
        .passthrough_mode
        .lock()
        .contains("CAP_SYS_ADMIN"));
}
