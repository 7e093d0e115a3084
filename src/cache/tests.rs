//! Unit tests of the disk cache: hits and misses, short last blocks, restart, crashes at every
//! write step, corruption, budget under concurrent fills, ENOSPC on a tiny tmpfs, two handles
//! on one directory, operator functions, and the index-memory measurement. None depends on
//! timing; the throughput comparison at the end is `#[ignore]`d and only prints.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use super::disk::{HookAction, WriteStep};
use super::format::{self, Header};
use super::*;

const BS: u64 = 64 << 10;

fn config(dir: &Path, limit: u64) -> CacheConfig {
    let mut c = CacheConfig::new(dir, SizeLimit::Bytes(limit));
    c.block_size = BS;
    c.min_free = SizeLimit::Bytes(0);
    c
}

fn open(dir: &Path, limit: u64) -> Arc<DiskCache> {
    let cache = DiskCache::open(config(dir, limit)).expect("open cache");
    cache.wait_for_scan();
    cache
}

fn obj(name: &str, size: u64) -> ObjectIdentity {
    ObjectIdentity::new("http://127.0.0.1:9000", "bucket", name, "etag-1", size)
}

/// Deterministic bytes of block `index` of `id`.
fn content(id: &ObjectIdentity, index: u64) -> Bytes {
    let len = format::block_len(id.size, BS, index) as usize;
    let mut seed = (index + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ id.key.len() as u64;
    for b in id.key.bytes() {
        seed = seed.rotate_left(5) ^ b as u64;
    }
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        out.extend_from_slice(&seed.to_le_bytes());
    }
    out.truncate(len);
    Bytes::from(out)
}

fn whole(id: &ObjectIdentity) -> Vec<u8> {
    let mut v = Vec::new();
    for i in 0..id.size.div_ceil(BS) {
        v.extend_from_slice(&content(id, i));
    }
    v
}

async fn write_all_blocks(cache: &DiskCache, id: &ObjectIdentity) {
    for i in 0..id.size.div_ceil(BS) {
        cache
            .write_block(id, i, content(id, i))
            .await
            .expect("write block");
    }
}

/// Every block of `id` read back through the cache (each must hit), concatenated.
async fn read_all_blocks(cache: &DiskCache, id: &ObjectIdentity) -> Vec<u8> {
    let mut bytes = Vec::new();
    for i in 0..id.size.div_ceil(BS) {
        let block = cache.read_block(id, i).await.expect("read");
        bytes.extend_from_slice(&block.unwrap_or_else(|| panic!("block {i} missing")));
    }
    bytes
}

fn data_path(root: &Path, id: &ObjectIdentity) -> PathBuf {
    let key = id.entry_key();
    let journal = fs::read(key.index_path(root)).expect("journal");
    let header = Header::decode(&journal).expect("header");
    key.data_path(root, header.nonce)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hit_and_miss() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = open(dir.path(), 64 << 20);
    let a = obj("a.bin", 4 * BS);
    assert_eq!(cache.read_block(&a, 0).await.expect("read"), None);
    cache
        .write_block(&a, 0, content(&a, 0))
        .await
        .expect("write");
    assert_eq!(
        cache.read_block(&a, 0).await.expect("read"),
        Some(content(&a, 0))
    );
    assert!(cache.has_block(&a, 0));
    assert!(!cache.has_block(&a, 1));
    assert_eq!(cache.read_block(&a, 1).await.expect("read"), None);
    // Another ETag is another entry.
    let mut a2 = a.clone();
    a2.etag = "etag-2".into();
    assert_eq!(cache.read_block(&a2, 0).await.expect("read"), None);
    // Writing again is harmless.
    cache
        .write_block(&a, 0, content(&a, 0))
        .await
        .expect("rewrite");
    let s = cache.stats();
    assert_eq!((s.hits, s.misses), (1, 3));
    assert_eq!((s.objects, s.blocks, s.writes), (1, 1, 1));
    assert!(matches!(
        cache.read_block(&a, 4).await,
        Err(CacheError::Invalid(_))
    ));
    assert!(matches!(
        cache.write_block(&a, 1, Bytes::from_static(b"short")).await,
        Err(CacheError::Invalid(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_last_block_and_complete_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = open(dir.path(), 64 << 20);
    let f = obj("f.bin", 2 * BS + 1000);
    assert_eq!(content(&f, 2).len(), 1000);
    cache
        .write_block(&f, 2, content(&f, 2))
        .await
        .expect("write");
    assert_eq!(
        cache.read_block(&f, 2).await.expect("read"),
        Some(content(&f, 2))
    );
    assert!(!cache.is_complete(&f));
    assert!(cache.open_complete(&f).await.expect("open").is_none());
    cache
        .write_block(&f, 0, content(&f, 0))
        .await
        .expect("write");
    cache
        .write_block(&f, 1, content(&f, 1))
        .await
        .expect("write");
    assert!(cache.is_complete(&f));
    let status = cache.status(&f).await.expect("status").expect("entry");
    assert_eq!((status.blocks_present, status.blocks_total), (3, 3));
    let file = cache
        .open_complete(&f)
        .await
        .expect("open")
        .expect("complete")
        .file;
    let mut back = vec![0u8; f.size as usize];
    file.read_exact_at(&mut back, 0).expect("read file");
    assert_eq!(back, whole(&f));
    assert_eq!(file.metadata().expect("stat").len(), f.size);
    // A one-byte object and an empty one.
    let tiny = obj("tiny", 1);
    cache
        .write_block(&tiny, 0, content(&tiny, 0))
        .await
        .expect("write");
    assert!(cache.is_complete(&tiny));
    assert_eq!(cache.block_count(0), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopen_after_drop_sees_the_same_blocks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = obj("a", 3 * BS);
    let b = obj("dir/b", BS / 2);
    let before = {
        let cache = open(dir.path(), 64 << 20);
        cache
            .write_block(&a, 0, content(&a, 0))
            .await
            .expect("write");
        cache
            .write_block(&a, 2, content(&a, 2))
            .await
            .expect("write");
        write_all_blocks(&cache, &b).await;
        cache.stats()
    };
    let cache = open(dir.path(), 64 << 20);
    let after = cache.stats();
    assert_eq!(
        (
            after.objects,
            after.complete_objects,
            after.blocks,
            after.bytes
        ),
        (
            before.objects,
            before.complete_objects,
            before.blocks,
            before.bytes
        )
    );
    assert!(after.scan_complete);
    assert!(cache.is_complete(&b));
    for (id, i, want) in [(&a, 0, true), (&a, 1, false), (&a, 2, true), (&b, 0, true)] {
        let got = cache.read_block(id, i).await.expect("read");
        assert_eq!(got, want.then(|| content(id, i)), "{} block {i}", id.key);
    }
}

/// Stops a write before each step (and halfway through each of its two writes), as a crash
/// would, over stale bytes in the block's place; the reopened cache must never serve a torn
/// block, must keep what was complete, and must accept the block again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_after_a_crash_at_every_step_of_a_block_write() {
    let mut cases: Vec<(WriteStep, HookAction)> = WriteStep::ALL
        .iter()
        .map(|&s| (s, HookAction::Crash))
        .collect();
    cases.push((WriteStep::WriteData, HookAction::CrashMidway));
    cases.push((WriteStep::AppendRecord, HookAction::CrashMidway));
    for (step, action) in cases {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let x = obj("x", 3 * BS);
        {
            let cache = open(root, 64 << 20);
            cache
                .write_block(&x, 0, content(&x, 0))
                .await
                .expect("write");
            // Stale bytes where block 1 goes (as an earlier life of the file could leave).
            let data = OpenOptions::new()
                .write(true)
                .open(data_path(root, &x))
                .expect("data file");
            data.write_all_at(&vec![0xEE; BS as usize], BS)
                .expect("stale bytes");
            cache.set_write_hook(Some(Arc::new(move |s| {
                if s == step {
                    action
                } else {
                    HookAction::Continue
                }
            })));
            let r = cache.write_block(&x, 1, content(&x, 1)).await;
            assert!(
                matches!(r, Err(CacheError::SimulatedCrash(s)) if s == step),
                "{step:?}/{action:?}: {r:?}"
            );
            // The process dies here: drop everything without any cleanup on disk.
        }
        let cache = open(root, 64 << 20);
        let recorded = step == WriteStep::Publish;
        assert_eq!(
            cache.read_block(&x, 0).await.expect("read"),
            Some(content(&x, 0)),
            "{step:?}/{action:?}"
        );
        assert_eq!(
            cache.read_block(&x, 1).await.expect("read"),
            recorded.then(|| content(&x, 1)),
            "{step:?}/{action:?}: a torn or unrecorded block was served"
        );
        assert_eq!(cache.stats().crc_failures, 0, "{step:?}/{action:?}");
        // The block (and one after it, past a possibly torn record) can be written again.
        cache
            .write_block(&x, 1, content(&x, 1))
            .await
            .expect("write");
        cache
            .write_block(&x, 2, content(&x, 2))
            .await
            .expect("write");
        drop(cache);
        let cache = open(root, 64 << 20);
        for i in 0..3 {
            assert_eq!(
                cache.read_block(&x, i).await.expect("read"),
                Some(content(&x, i)),
                "{step:?}/{action:?} block {i} after rewrite and reopen"
            );
        }
        assert!(cache.is_complete(&x));
    }
}

/// Nothing is `fdatasync`ed, so a crash of the whole machine may keep a block's journal
/// record but lose its data: the block then reads back as zeros (a hole, or a lost overwrite),
/// or the data file ends before it. Such a block must fail its check and be fetched again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_whose_data_was_lost_in_a_machine_crash_is_a_miss() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    let x = obj("x", 3 * BS + 100);
    {
        let cache = open(root, 64 << 20);
        write_all_blocks(&cache, &x).await;
    }
    let data = OpenOptions::new()
        .write(true)
        .open(data_path(root, &x))
        .expect("data file");
    data.write_all_at(&vec![0u8; BS as usize], BS)
        .expect("zeros for block 1");
    data.set_len(3 * BS)
        .expect("the last block never reached the disk");
    drop(data);
    let cache = open(root, 64 << 20);
    let got: Vec<_> = {
        let mut got = Vec::new();
        for i in 0..4 {
            got.push(cache.read_block(&x, i).await.expect("read"));
        }
        got
    };
    assert_eq!(got[0], Some(content(&x, 0)));
    assert_eq!(got[1], None, "zeros where the data was lost were served");
    assert_eq!(got[2], Some(content(&x, 2)));
    assert_eq!(
        got[3], None,
        "a block past the end of the data file was served"
    );
    assert_eq!(cache.stats().crc_failures, 2);
    assert!(!cache.is_complete(&x));
    assert!(cache.open_complete(&x).await.expect("open").is_none());
    for i in [1, 3] {
        cache
            .write_block(&x, i, content(&x, i))
            .await
            .expect("write");
    }
    for i in 0..4 {
        assert_eq!(
            cache.read_block(&x, i).await.expect("read"),
            Some(content(&x, i))
        );
    }
    assert!(cache.is_complete(&x));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_block_is_detected_dropped_and_refetched() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    let c = obj("c", 2 * BS + 100);
    // Written by one process, read by the next: the writer trusts what it wrote (its blocks
    // are known good to it, see `disk::read::Expected`), a reader checks each block once.
    write_all_blocks(&open(root, 64 << 20), &c).await;
    let cache = open(root, 64 << 20);
    let data = OpenOptions::new()
        .write(true)
        .open(data_path(root, &c))
        .expect("data file");
    // Flip bytes inside block 1 and in the short last block.
    data.write_all_at(b"\xde\xad\xbe\xef", BS + 1234)
        .expect("flip");
    data.write_all_at(b"\x00\x01", 2 * BS + 10).expect("flip");
    drop(data);
    assert_eq!(
        cache.read_block(&c, 0).await.expect("read"),
        Some(content(&c, 0))
    );
    assert_eq!(cache.read_block(&c, 1).await.expect("read"), None);
    assert_eq!(cache.read_block(&c, 2).await.expect("read"), None);
    let s = cache.stats();
    assert_eq!(s.crc_failures, 2);
    assert!(!cache.has_block(&c, 1));
    assert!(!cache.is_complete(&c));
    assert!(cache.open_complete(&c).await.expect("open").is_none());
    // The drop is persistent: a restarted cache does not trust the block either.
    drop(cache);
    let cache = open(root, 64 << 20);
    assert_eq!(cache.read_block(&c, 1).await.expect("read"), None);
    assert_eq!(cache.stats().crc_failures, 0, "dropped, not re-checked");
    // Refetched and written again, it is served.
    cache
        .write_block(&c, 1, content(&c, 1))
        .await
        .expect("write");
    cache
        .write_block(&c, 2, content(&c, 2))
        .await
        .expect("write");
    assert_eq!(
        cache.read_block(&c, 1).await.expect("read"),
        Some(content(&c, 1))
    );
    assert!(cache.is_complete(&c));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lru_evicts_the_least_recently_used_unpinned_object() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Room for three one-block objects (each charged 64 KiB + journal).
    let limit = 3 * (BS + 4096);
    let cache = open(dir.path(), limit);
    let ids: Vec<_> = (0..5).map(|i| obj(&format!("o{i}"), BS)).collect();
    for id in &ids[..3] {
        write_all_blocks(&cache, id).await;
    }
    // Whoever holds cache files open is told which entries were evicted.
    let told = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let sink = told.clone();
    cache.on_evicted(move |keys| sink.lock().extend_from_slice(keys));
    // Use o0 again: o1 is now the least recently used.
    assert!(cache.read_block(&ids[0], 0).await.expect("read").is_some());
    write_all_blocks(&cache, &ids[3]).await;
    assert!(cache.read_block(&ids[1], 0).await.expect("read").is_none());
    assert_eq!(*told.lock(), vec![ids[1].entry_key()]);
    assert!(cache.read_block(&ids[0], 0).await.expect("read").is_some());
    // Pin o2, then use o3 and o0: o2 is the coldest but pinned, so o3 goes.
    let pin = cache.pin(&ids[2]);
    assert!(cache.read_block(&ids[3], 0).await.expect("read").is_some());
    assert!(cache.read_block(&ids[0], 0).await.expect("read").is_some());
    write_all_blocks(&cache, &ids[4]).await;
    assert!(cache.read_block(&ids[2], 0).await.expect("read").is_some());
    assert!(cache.read_block(&ids[3], 0).await.expect("read").is_none());
    assert!(cache.read_block(&ids[0], 0).await.expect("read").is_some());
    let s = cache.stats();
    assert_eq!(s.evictions, 2);
    assert!(s.bytes <= limit);
    assert_eq!(s.pinned_objects, 1);
    drop(pin);
    assert_eq!(cache.stats().pinned_objects, 0);
    // Everything pinned: a write that does not fit is refused, nothing is lost.
    let pins: Vec<_> = ids.iter().map(|id| cache.pin(id)).collect();
    let big = obj("big", BS);
    assert!(matches!(
        cache.write_block(&big, 0, content(&big, 0)).await,
        Err(CacheError::Full)
    ));
    assert_eq!(cache.stats().full, 1);
    drop(pins);
    // Larger than the whole budget: refused at once.
    let mut huge_cfg = config(dir.path(), BS);
    huge_cfg.dir = dir.path().join("other");
    let small = DiskCache::open(huge_cfg).expect("open");
    assert!(matches!(
        small.write_block(&big, 0, content(&big, 0)).await,
        Err(CacheError::Full)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_keeps_the_budget_under_concurrent_fills() {
    let dir = tempfile::tempdir().expect("tempdir");
    let limit = 32 * BS;
    let cache = open(dir.path(), limit);
    let pinned = obj("pinned", 4 * BS);
    let _pin = cache.pin(&pinned);
    write_all_blocks(&cache, &pinned).await;
    let over = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for t in 0..12 {
        let cache = cache.clone();
        let over = over.clone();
        tasks.push(tokio::spawn(async move {
            for n in 0..6 {
                let id = obj(&format!("t{t}/o{n}"), 3 * BS + 7);
                for i in 0..4 {
                    match cache.write_block(&id, i, content(&id, i)).await {
                        Ok(()) | Err(CacheError::Full) | Err(CacheError::Busy) => {}
                        Err(e) => panic!("write failed: {e}"),
                    }
                    if cache.stats().bytes > limit {
                        over.store(true, Ordering::Relaxed);
                    }
                }
                // What is there is right.
                for i in 0..4 {
                    if let Some(b) = cache.read_block(&id, i).await.expect("read") {
                        assert_eq!(b, content(&id, i));
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    assert!(!over.load(Ordering::Relaxed), "the budget was exceeded");
    let s = cache.stats();
    assert!(s.bytes <= limit, "{} > {limit}", s.bytes);
    assert!(s.evictions > 0);
    assert!(s.writes > 100, "{s:?}");
    // The pinned object survived everything.
    for i in 0..4 {
        assert_eq!(
            cache.read_block(&pinned, i).await.expect("read"),
            Some(content(&pinned, i))
        );
    }
    // What is on disk, counted from the journals independently, is within the budget too.
    let on_disk = stats_dir(dir.path()).expect("stats");
    assert!(on_disk.bytes <= limit, "{} > {limit}", on_disk.bytes);
    assert_eq!(on_disk.objects, s.objects);
    assert_eq!(on_disk.blocks, s.blocks);
}

/// Unmounts a tmpfs when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Tmpfs(dir.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

fn fill(path: &Path) -> u64 {
    let mut f = fs::File::create(path).expect("filler");
    let chunk = vec![1u8; 4096];
    let mut n = 0;
    while std::io::Write::write_all(&mut f, &chunk).is_ok() {
        n += 4096;
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enospc_on_a_tiny_tmpfs_is_a_typed_failure_and_the_cache_goes_on() {
    let outer = tempfile::tempdir().expect("tempdir");
    let mnt = outer.path().join("mnt");
    fs::create_dir(&mnt).expect("mkdir");
    let Some(_tmpfs) = Tmpfs::mount(&mnt, "2m") else {
        eprintln!("skipping: cannot mount a tmpfs here (not root?)");
        return;
    };
    let root = mnt.join("cache");
    let cache = open(&root, 100 << 20);
    let a = obj("a", 4 * BS);
    cache
        .write_block(&a, 0, content(&a, 0))
        .await
        .expect("write");
    // The disk fills up behind the cache's back, between its space check and its write.
    let filler = mnt.join("filler");
    let filler2 = filler.clone();
    cache.set_write_hook(Some(Arc::new(move |s| {
        if s == WriteStep::WriteData && !filler2.exists() {
            fill(&filler2);
        }
        HookAction::Continue
    })));
    let r = cache.write_block(&a, 1, content(&a, 1)).await;
    let err = r.expect_err("the disk is full");
    assert!(
        matches!(err, CacheError::NoSpace { .. }),
        "expected NoSpace, got {err:?}"
    );
    assert!(err.is_disk_failure());
    assert_eq!(cache.stats().no_space_errors, 1);
    // Reads go on: the failed block is a miss, the good one a hit.
    assert_eq!(cache.read_block(&a, 1).await.expect("read"), None);
    assert_eq!(
        cache.read_block(&a, 0).await.expect("read"),
        Some(content(&a, 0))
    );
    // With the disk still full, the free-space check refuses up front, or the write fails
    // with ENOSPC again; either way a typed error, never a panic or a torn block.
    cache.set_write_hook(None);
    let again = cache.write_block(&a, 2, content(&a, 2)).await;
    assert!(
        matches!(
            again,
            Err(CacheError::NoSpace { .. }) | Err(CacheError::Full)
        ),
        "{again:?}"
    );
    // Space comes back: the cache works again.
    fs::remove_file(&filler).expect("rm filler");
    cache
        .write_block(&a, 1, content(&a, 1))
        .await
        .expect("write");
    assert_eq!(
        cache.read_block(&a, 1).await.expect("read"),
        Some(content(&a, 1))
    );
    drop(cache);
    // And the guard: with 5% to keep free on a 2 MiB disk, a fill stops short of ENOSPC.
    let mut cfg = config(&root, 100 << 20);
    cfg.min_free = SizeLimit::Percent(5.0);
    let cache = DiskCache::open(cfg).expect("open");
    cache.wait_for_scan();
    let mut refused = false;
    for n in 0..64 {
        let id = obj(&format!("fill{n}"), BS);
        match cache.write_block(&id, 0, content(&id, 0)).await {
            Ok(()) => {}
            Err(CacheError::Full) => {
                refused = true;
            }
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    // Entries were evicted to make room; the filesystem kept its 5% free.
    let space = sys::fs_space(&root).expect("statvfs");
    assert!(space.avail + 8192 >= space.total / 20, "{space:?}");
    assert!(
        cache.stats().evictions > 0 || refused,
        "{:?}",
        cache.stats()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_handles_on_one_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    let a = open(root, 64 << 20);
    let b = open(root, 64 << 20);
    let x = obj("x", 4 * BS);
    // Written by one, read by the other, including blocks written after the other loaded it.
    a.write_block(&x, 0, content(&x, 0)).await.expect("write");
    assert_eq!(
        b.read_block(&x, 0).await.expect("read"),
        Some(content(&x, 0))
    );
    a.write_block(&x, 1, content(&x, 1)).await.expect("write");
    assert_eq!(
        b.read_block(&x, 1).await.expect("read"),
        Some(content(&x, 1))
    );
    // Both fill the same object at once: no corruption, each block once or skipped.
    let y = obj("y", 8 * BS + 5);
    let (ra, rb) = tokio::join!(
        {
            let (a, y) = (a.clone(), y.clone());
            async move {
                for i in 0..9 {
                    let _ = a.write_block(&y, i, content(&y, i)).await;
                }
            }
        },
        {
            let (b, y) = (b.clone(), y.clone());
            async move {
                for i in (0..9).rev() {
                    let _ = b.write_block(&y, i, content(&y, i)).await;
                }
            }
        }
    );
    let ((), ()) = (ra, rb);
    for i in 0..9 {
        for c in [&a, &b] {
            if let Some(got) = c.read_block(&y, i).await.expect("read") {
                assert_eq!(got, content(&y, i), "block {i}");
            } else {
                // Skipped as busy on both sides is impossible: one of them wrote it.
                panic!("block {i} missing");
            }
        }
    }
    let journal = fs::read(y.entry_key().index_path(root)).expect("journal");
    let header = Header::decode(&journal).expect("header");
    let mut records = 0;
    let r = format::replay(&journal[header.header_len..], 0, 9, |_, _| records += 1);
    assert_eq!(r.garbage, 0);
    assert!((9..=18).contains(&records));
    assert_eq!(a.stats().crc_failures + b.stats().crc_failures, 0);

    // Eviction by one handle never breaks the other: an entry pinned in B is in use.
    // (x is made the least recently used entry for the third handle's scan.)
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    fs::File::options()
        .write(true)
        .open(x.entry_key().index_path(root))
        .and_then(|f| f.set_modified(hour_ago))
        .expect("age x");
    let small = {
        // Room for z and z2 below, not for x besides them.
        DiskCache::open(config(root, 7 * (BS + 4096))).expect("open")
    };
    small.wait_for_scan();
    let pin = b.pin(&x);
    let z = obj("z", 2 * BS);
    let r = small.write_block(&z, 0, content(&z, 0)).await;
    assert!(r.is_ok() || matches!(r, Err(CacheError::Full)), "{r:?}");
    assert!(small.stats().evict_in_use >= 1, "{:?}", small.stats());
    assert_eq!(
        b.read_block(&x, 1).await.expect("read"),
        Some(content(&x, 1))
    );
    assert!(x.entry_key().index_path(root).exists());
    drop(pin);
    // Unpinned, it may go; B keeps reading its open files or misses, never wrong bytes.
    let z2 = obj("z2", 6 * BS);
    for i in 0..6 {
        let _ = small.write_block(&z2, i, content(&z2, i)).await;
    }
    assert!(
        !x.entry_key().index_path(root).exists(),
        "x was not evicted"
    );
    if let Some(got) = b.read_block(&x, 0).await.expect("read") {
        assert_eq!(got, content(&x, 0));
    }
    // B writing into the evicted entry notices and starts a fresh one.
    b.write_block(&x, 3, content(&x, 3)).await.expect("write");
    assert!(x.entry_key().index_path(root).exists());
    let c = open(root, 64 << 20);
    assert_eq!(
        c.read_block(&x, 3).await.expect("read"),
        Some(content(&x, 3))
    );
    assert_eq!(c.read_block(&x, 0).await.expect("read"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_stats_and_clear() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    let cache = open(root, 64 << 20);
    let a = obj("a", 2 * BS);
    let b = obj("b", 3 * BS);
    write_all_blocks(&cache, &a).await;
    cache
        .write_block(&b, 0, content(&b, 0))
        .await
        .expect("write");
    let s = stats_dir(root).expect("stats");
    assert_eq!(s.format, Some((format::FORMAT_VERSION, BS)));
    assert!(s.in_use);
    assert_eq!((s.objects, s.complete_objects, s.blocks), (2, 1, 3));
    assert_eq!(s.bytes, cache.stats().bytes);
    assert!(s.disk_bytes >= 3 * BS);
    assert!(s.index_memory_per_object > 0);
    // A mount is using it: clear refuses.
    assert!(matches!(clear_dir(root), Err(CacheError::InUse(_))));
    drop(cache);
    let report = clear_dir(root).expect("clear");
    assert_eq!(report.files, 4);
    assert!(report.bytes >= 3 * BS);
    let s = stats_dir(root).expect("stats");
    assert_eq!((s.objects, s.format, s.in_use), (0, None, false));
    // After a clear another block size may be chosen; before it, it is refused.
    let mut cfg = config(root, 64 << 20);
    cfg.block_size = 2 * BS;
    drop(DiskCache::open(cfg.clone()).expect("open with a new block size"));
    let err = DiskCache::open(config(root, 64 << 20)).expect_err("block size differs");
    assert!(matches!(err, CacheError::BlockSize { .. }), "{err:?}");
    fs::write(
        root.join(format::FORMAT_FILE),
        "rifflefs-cache\nformat 9\nblock_size 65536\n",
    )
    .expect("write");
    let err = DiskCache::open(config(root, 64 << 20)).expect_err("format differs");
    assert!(
        matches!(err, CacheError::Format { found: 9, .. }),
        "{err:?}"
    );
    assert!(clear_dir(&root.join("nonexistent")).is_ok());
}

/// The passthrough file of an entry open here is the cache's own descriptor, duplicated, and
/// only once every block is present; an entry not open here is left to `open_complete`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_complete_data_file_of_an_open_entry_needs_no_metadata_task() {
    use std::io::Read;
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = open(dir.path(), 64 << 20);
    let a = obj("a", 2 * BS + 100);
    cache
        .write_block(&a, 0, content(&a, 0))
        .await
        .expect("write");
    assert!(cache.complete_data_file(&a).is_none(), "one block of three");
    write_all_blocks(&cache, &a).await;
    let mut bytes = Vec::new();
    cache
        .complete_data_file(&a)
        .expect("complete and open")
        .file
        .read_to_end(&mut bytes)
        .expect("read");
    assert!(bytes == whole(&a), "the object's bytes");
    drop(cache);
    let reopened = open(dir.path(), 64 << 20);
    assert!(
        reopened.complete_data_file(&a).is_none(),
        "not open in this process yet"
    );
    assert!(reopened.open_complete(&a).await.expect("open").is_some());
}

/// `O_DIRECT` serves only blocks whose length is a multiple of 4 KiB, so an entry opens the
/// second descriptor only when its object has such a block; the common small file has none.
#[test]
fn only_objects_with_an_aligned_block_get_an_o_direct_descriptor() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Where the filesystem refuses O_DIRECT, no entry has the descriptor.
    let probe = dir.path().join("probe");
    fs::write(&probe, b"").expect("probe file");
    let supported = sys::open_direct(&probe).expect("probe O_DIRECT").is_some();
    for (size, has_aligned_block) in [
        (1, false),
        (5000, false),
        (8192, true),
        (BS, true),
        (BS + 100, true),
    ] {
        let id = obj(&format!("object-{size}"), size);
        let entry = entry::OpenEntry::create(dir.path(), &id, id.entry_key(), BS, true)
            .expect("create entry")
            .expect("a new entry");
        assert_eq!(
            entry.direct.is_some(),
            has_aligned_block && supported,
            "{size}-byte object"
        );
    }
}

/// `status_or_create` opens an entry that exists and makes one that does not, so that the
/// block writes after a fetch find it open; `status` only looks and never creates one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_or_create_makes_the_entry_that_the_writes_use() {
    let dir = tempfile::tempdir().expect("tempdir");
    let journal = |id: &ObjectIdentity| id.entry_key().index_path(dir.path());
    let cache = open(dir.path(), 64 << 20);
    let a = obj("a", 2 * BS + 100);
    assert!(cache.status(&a).await.expect("status").is_none());
    assert!(!journal(&a).exists(), "looking created an entry");
    let s = cache
        .status_or_create(&a)
        .await
        .expect("status")
        .expect("an entry");
    assert_eq!(
        (s.blocks_present, s.blocks_total, s.complete),
        (0, 3, false)
    );
    assert!(journal(&a).exists());
    assert_eq!(cache.stats().open_objects, 1);
    write_all_blocks(&cache, &a).await;
    assert_eq!(
        cache.stats().open_objects,
        1,
        "the writes used the entry made above"
    );
    let other = open(dir.path(), 64 << 20);
    let s = other
        .status_or_create(&a)
        .await
        .expect("status")
        .expect("the entry");
    assert_eq!((s.blocks_present, s.complete), (3, true));
    for i in 0..3 {
        assert_eq!(
            other.read_block(&a, i).await.expect("read"),
            Some(content(&a, i))
        );
    }
}

/// A directory of another format version (here 1, the unreleased layout with two fan-out
/// levels) is refused with the format error and left untouched; `riffle cache clear` starts
/// it afresh. Format 2 is the first released one (CHANGELOG.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_of_another_format_is_refused_untouched() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    let old_format = format!("rifflefs-cache\nformat 1\nblock_size {BS}\n");
    let old_entry = root.join("objects/ab/cd/abcd0000000000000000000000000000.idx");
    fs::create_dir_all(old_entry.parent().expect("parent")).expect("mkdir");
    fs::write(&old_entry, b"an old journal").expect("write");
    fs::write(root.join(format::FORMAT_FILE), &old_format).expect("write");

    let err = DiskCache::open(config(root, 64 << 20)).expect_err("another format");
    assert!(
        matches!(
            err,
            CacheError::Format {
                found: 1,
                expected: format::FORMAT_VERSION,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(old_entry.exists());
    assert_eq!(
        fs::read_to_string(root.join(format::FORMAT_FILE)).expect("format file"),
        old_format
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_from_an_interrupted_eviction_are_removed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    let a = obj("a", BS);
    {
        let cache = open(root, 64 << 20);
        write_all_blocks(&cache, &a).await;
    }
    // Crash between the two unlinks of an eviction: the data file stays, its journal is gone.
    let data = data_path(root, &a);
    fs::remove_file(a.entry_key().index_path(root)).expect("rm journal");
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    fs::File::options()
        .write(true)
        .open(&data)
        .and_then(|f| f.set_modified(old))
        .expect("age it");
    assert_eq!(stats_dir(root).expect("stats").orphans, 1);
    let cache = open(root, 64 << 20);
    assert!(!data.exists(), "orphan not removed");
    assert_eq!(cache.stats().objects, 0);
    assert_eq!(cache.read_block(&a, 0).await.expect("read"), None);
}

/// The in-memory index per cached object (printed; bounded loosely so regressions show).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn index_memory_per_cached_object() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    let mut cfg = config(root, 1 << 30);
    cfg.max_open_objects = 64;
    let cache = DiskCache::open(cfg.clone()).expect("open");
    cache.wait_for_scan();
    let n = 2000;
    let mut tasks = Vec::new();
    for t in 0..16 {
        let cache = cache.clone();
        tasks.push(tokio::spawn(async move {
            for i in (t..n).step_by(16) {
                let id = obj(&format!("dataset/train/{i:07}.jpg"), 110_000);
                for b in 0..id.size.div_ceil(BS) {
                    cache
                        .write_block(&id, b, content(&id, b))
                        .await
                        .expect("write");
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let live = cache.index_memory();
    drop(cache);
    let cache = DiskCache::open(cfg).expect("reopen");
    cache.wait_for_scan();
    let scanned = cache.index_memory();
    let dir_stats = stats_dir(root).expect("stats");
    eprintln!(
        "index memory for {n} objects of 110 kB: live {live:?}; after restart {scanned:?}; \
         estimate without a mount {} B/object",
        dir_stats.index_memory_per_object
    );
    assert_eq!(live.entries, n);
    assert_eq!(scanned.entries, n);
    assert!(live.open_entries <= 64);
    // 84 and 101 bytes when written (the LRU policy; objects of two blocks stay open entries
    // of about 272 bytes while open: see `entry`, "Idle form").
    assert!(scanned.per_object < 128, "{scanned:?}");
    assert!(live.per_object < 160, "{live:?}");
    assert!(dir_stats.index_memory_per_object < 160);
}

/// Throughput of the io_uring path against plain pread/pwrite on this disk. Prints, asserts
/// nothing. Run: `cargo test -p rifflefs --lib cache::tests::throughput -- --ignored --nocapture`.
#[ignore]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throughput_io_uring_versus_pread_pwrite() {
    use std::os::unix::fs::OpenOptionsExt;
    use std::time::Instant;
    let base = std::env::var_os("RIFFLE_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::tempdir_in(base).expect("tempdir");
    let block: usize = 1 << 20;
    let blocks: u64 = 512;
    let total = block as u64 * blocks;
    let mib = |bytes: u64, secs: f64| bytes as f64 / secs / (1 << 20) as f64;
    let drop_cache = |f: &fs::File| {
        use std::os::fd::AsRawFd;
        // SAFETY: advisory call on a valid descriptor.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    };
    let payload = Bytes::from(vec![0xA5u8; block]);

    // 1. Through the cache (io_uring, O_DIRECT, a journal record per block).
    let mut cfg = CacheConfig::new(dir.path().join("c"), SizeLimit::Bytes(4 << 30));
    cfg.min_free = SizeLimit::Bytes(0);
    let cache = DiskCache::open(cfg).expect("open");
    let id = ObjectIdentity::new("e", "b", "k", "t", total);
    for depth in [1usize, 16] {
        let id = ObjectIdentity::new("e", "b", &*format!("k{depth}"), "t", total);
        let t = Instant::now();
        let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut tasks = Vec::new();
        for _ in 0..depth {
            let (cache, id, next, payload) =
                (cache.clone(), id.clone(), next.clone(), payload.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= blocks {
                        break;
                    }
                    cache
                        .write_block(&id, i, payload.clone())
                        .await
                        .expect("write");
                }
            }));
        }
        for t in tasks {
            t.await.expect("task");
        }
        let w = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut tasks = Vec::new();
        for _ in 0..depth {
            let (cache, id, next) = (cache.clone(), id.clone(), next.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= blocks {
                        break;
                    }
                    assert!(cache.read_block(&id, i).await.expect("read").is_some());
                }
            }));
        }
        for t in tasks {
            t.await.expect("task");
        }
        let r = t.elapsed().as_secs_f64();
        eprintln!(
            "cache (io_uring, O_DIRECT, journal), {depth} in flight: write {:.0} MiB/s, read {:.0} MiB/s",
            mib(total, w),
            mib(total, r)
        );
    }
    drop(id);

    // 2. Plain pwrite/pread from one thread, buffered (page cache dropped before reading)
    //    and O_DIRECT, with one fdatasync per block for the durable variant.
    let path = dir.path().join("plain");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .expect("open");
    let t = Instant::now();
    for i in 0..blocks {
        f.write_all_at(&payload, i * block as u64).expect("pwrite");
        f.sync_data().expect("fdatasync");
    }
    let w_durable = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for i in 0..blocks {
        f.write_all_at(&payload, i * block as u64).expect("pwrite");
    }
    f.sync_data().expect("fdatasync");
    let w_buffered = t.elapsed().as_secs_f64();
    drop_cache(&f);
    let mut buf = vec![0u8; block];
    let t = Instant::now();
    for i in 0..blocks {
        f.read_exact_at(&mut buf, i * block as u64).expect("pread");
    }
    let r_cold = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for i in 0..blocks {
        f.read_exact_at(&mut buf, i * block as u64).expect("pread");
    }
    let r_warm = t.elapsed().as_secs_f64();
    let direct = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .expect("open direct");
    let t = Instant::now();
    let mut dbuf = vec![0u8; block + 4096];
    let off = dbuf.as_ptr().align_offset(4096);
    for i in 0..blocks {
        direct
            .read_exact_at(&mut dbuf[off..off + block], i * block as u64)
            .expect("pread direct");
    }
    let r_direct = t.elapsed().as_secs_f64();
    // The ring alone (no CRC, no index), O_DIRECT, on the same file.
    let ring = ring::Ring::new(1).expect("ring");
    let direct = Arc::new(direct);
    for depth in [1usize, 16] {
        let t = Instant::now();
        let mut i = 0;
        while i < blocks {
            let batch: Vec<_> = (i..(i + depth as u64).min(blocks))
                .map(|b| ring.read(&direct, b * block as u64, block))
                .collect();
            for r in futures::future::join_all(batch).await {
                r.expect("ring read");
            }
            i += depth as u64;
        }
        eprintln!(
            "ring alone, O_DIRECT, {depth} in flight: read {:.0} MiB/s",
            mib(total, t.elapsed().as_secs_f64())
        );
    }
    eprintln!(
        "plain, 1 thread: pwrite+fdatasync per block {:.0} MiB/s, pwrite buffered then one fdatasync {:.0} MiB/s, \
         pread cold {:.0} MiB/s, pread page-cache hot {:.0} MiB/s, pread O_DIRECT {:.0} MiB/s",
        mib(total, w_durable),
        mib(total, w_buffered),
        mib(total, r_cold),
        mib(total, r_warm),
        mib(total, r_direct)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_gives_up_when_every_candidate_is_in_use_elsewhere() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    // Room for one block and a half.
    let a = open(root, 3 * BS / 2 + 4096);
    let b = open(root, 64 << 20);
    let o1 = obj("o1", BS);
    write_all_blocks(&a, &o1).await;
    // B opens o1 and pins it: the other handle (process) may not evict it.
    assert!(b.read_block(&o1, 0).await.expect("read").is_some());
    let _pin = b.pin(&o1);
    let o2 = obj("o2", 2 * BS);
    let r = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        a.write_block(&o2, 0, content(&o2, 0)),
    )
    .await
    .expect("no livelock");
    assert!(matches!(r, Err(CacheError::Full)), "{r:?}");
    assert!(a.stats().evict_in_use >= 1);
    assert_eq!(
        b.read_block(&o1, 0).await.expect("read"),
        Some(content(&o1, 0))
    );
}

/// A writer does not read its own journal records back: writing an object block by block
/// replays nothing, while a block another handle wrote is still found by a replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_does_not_replay_its_own_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = open(dir.path(), 64 << 20);
    let a = obj("a", 6 * BS);
    for i in 0..5 {
        cache
            .write_block(&a, i, content(&a, i))
            .await
            .expect("write");
        let status = cache.status(&a).await.expect("status").expect("entry");
        assert_eq!(status.blocks_present, i + 1);
    }
    assert_eq!(
        cache.journal_replays(),
        0,
        "only its own records were appended"
    );
    // Another handle (as another process would) writes the last block: this one replays it.
    let other = open(dir.path(), 64 << 20);
    other
        .write_block(&a, 5, content(&a, 5))
        .await
        .expect("write");
    let status = cache.status(&a).await.expect("status").expect("entry");
    assert!(status.complete, "the other handle's block was replayed");
    assert_eq!(cache.journal_replays(), 1);
    assert!(
        read_all_blocks(&cache, &a).await == whole(&a),
        "the object's bytes"
    );
}

/// Two handles (two processes) writing the blocks of one object at the same time, each
/// skipping its own records: both end up knowing every block, whichever order the records
/// landed in, and read the object's bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaved_writers_each_learn_every_block() {
    let dir = tempfile::tempdir().expect("tempdir");
    for round in 0..4 {
        let a = obj(&format!("a{round}"), 64 * BS);
        let first = open(dir.path(), 64 << 20);
        let second = open(dir.path(), 64 << 20);
        let write = |cache: Arc<DiskCache>, parity: u64| {
            let a = a.clone();
            tokio::spawn(async move {
                for i in (0..64).filter(|i| i % 2 == parity) {
                    cache
                        .write_block(&a, i, content(&a, i))
                        .await
                        .expect("write");
                }
                cache
            })
        };
        let (one, two) = (write(first, 0), write(second, 1));
        for cache in [one.await.expect("task"), two.await.expect("task")] {
            let status = cache.status(&a).await.expect("status").expect("entry");
            assert!(status.complete, "round {round}: {status:?}");
            assert!(
                read_all_blocks(&cache, &a).await == whole(&a),
                "round {round}: the object's bytes"
            );
        }
    }
}

/// The short block of an object is read on the caller's thread with its CRC checked; a whole
/// (`O_DIRECT`) block, a missing block and a block whose bytes no longer match their CRC are
/// left to the ring path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_block_is_read_on_the_callers_thread_only_when_intact() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    let small = obj("small", 3000);
    let flipped = obj("flipped", 3000);
    let big = obj("big", BS + 700);
    {
        // Written by another process: nothing is known good to the reader yet.
        let writer = open(root, 64 << 20);
        for id in [&small, &flipped, &big] {
            write_all_blocks(&writer, id).await;
        }
    }
    let cache = open(root, 64 << 20);
    assert_eq!(
        cache.read_short_block_here(&small, 0),
        Some(content(&small, 0))
    );
    // Two blocks: read on the caller's thread once the entry is open here.
    assert_eq!(cache.read_short_block_here(&big, 1), None, "not open");
    assert_eq!(
        cache.read_block(&big, 0).await.expect("read"),
        Some(content(&big, 0))
    );
    assert_eq!(cache.read_short_block_here(&big, 1), Some(content(&big, 1)));
    assert_eq!(cache.read_short_block_here(&big, 0), None, "O_DIRECT block");
    assert_eq!(cache.read_short_block_here(&obj("absent", 3000), 0), None);
    let hits = cache.stats().hits;
    assert!(hits >= 2, "hits counted: {hits}");
    let data = OpenOptions::new()
        .write(true)
        .open(data_path(root, &flipped))
        .expect("data file");
    data.write_all_at(b"\xde\xad", 100).expect("flip");
    drop(data);
    assert_eq!(
        cache.read_short_block_here(&flipped, 0),
        None,
        "CRC mismatch"
    );
    // The ring path reports and drops it.
    assert_eq!(cache.read_block(&flipped, 0).await.expect("read"), None);
    assert_eq!(cache.stats().crc_failures, 1);
}

/// Every byte of a data file, read at its offsets as the kernel reads a backing file (a check
/// for holes may have moved its cursor).
fn bytes_of(data: &DataFile) -> Vec<u8> {
    let len = data.file.metadata().expect("stat").len() as usize;
    let mut bytes = vec![0; len];
    data.file.read_exact_at(&mut bytes, 0).expect("read");
    bytes
}

/// A cache in `root` that keeps at most 2 entries open, with `n` small objects (one block
/// each) written into it, so all but the last two are closed: its config, the cache and them.
async fn small_closed_entries(
    root: &Path,
    n: u64,
) -> (CacheConfig, Arc<DiskCache>, Vec<ObjectIdentity>) {
    let mut cfg = config(root, 64 << 20);
    cfg.max_open_objects = 2;
    let cache = DiskCache::open(cfg.clone()).expect("open");
    cache.wait_for_scan();
    let ids: Vec<_> = (0..n)
        .map(|i| obj(&format!("small-{i}"), 3000 + i))
        .collect();
    for id in &ids {
        write_all_blocks(&cache, id).await;
    }
    (cfg, cache, ids)
}

/// An entry of one block whose files were closed (more cached objects than open entries) is
/// read back on the caller's thread by its data file's name, checked against the CRC kept in
/// its record, without reopening the entry; a changed data file, and one that is gone, send
/// the reader back to the entry's own path (which reloads, then drops a bad block).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_entry_of_one_block_is_read_by_name_and_checked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    let (cfg, cache, ids) = small_closed_entries(root, 6).await;
    assert!(cache.index_memory().open_entries <= 2);
    let (first, second) = (&ids[0], &ids[1]);
    let path = cache
        .closed_data_path(first)
        .expect("closed, one block known");
    assert_eq!(path, data_path(root, first));
    let replays = cache.journal_replays();
    let hits = cache.stats().hits;
    assert_eq!(
        cache.read_short_block_here(first, 0),
        Some(content(first, 0))
    );
    assert_eq!(cache.stats().hits, hits + 1);
    assert_eq!(cache.journal_replays(), replays, "read without the journal");
    assert!(cache.closed_data_path(first).is_some(), "still closed");

    // A flipped byte: refused here; the entry's own path reloads it and drops the block.
    let data = OpenOptions::new()
        .write(true)
        .open(data_path(root, second))
        .expect("data file");
    data.write_all_at(b"\xde\xad", 10).expect("flip");
    drop(data);
    assert_eq!(cache.read_short_block_here(second, 0), None, "CRC mismatch");
    assert_eq!(cache.read_block(second, 0).await.expect("read"), None);
    assert_eq!(cache.stats().crc_failures, 1);

    // The data file gone behind the cache's back: refused, never an error or wrong bytes.
    let third = &ids[2];
    let gone = cache.closed_data_path(third).expect("closed");
    fs::remove_file(&gone).expect("remove");
    assert_eq!(cache.read_short_block_here(third, 0), None);

    // After a restart, the start-up scan gives every small complete entry the same.
    drop(cache);
    let cache = DiskCache::open(cfg).expect("reopen");
    cache.wait_for_scan();
    let fourth = &ids[3];
    assert_eq!(
        cache.closed_data_path(fourth),
        Some(data_path(root, fourth))
    );
    assert_eq!(
        cache.read_short_block_here(fourth, 0),
        Some(content(fourth, 0))
    );
    assert_eq!(cache.journal_replays(), 0);
}

/// A closed entry of one block is opened for passthrough by its data file's name: the entry
/// stays closed (its journal is not opened) and the file holds the object's bytes; a data file
/// cut short or gone is refused (the journal's path, tried next, refuses it too), never an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_entry_of_one_block_opens_for_passthrough_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    let (_, cache, ids) = small_closed_entries(root, 5).await;
    let (first, second, third) = (&ids[0], &ids[1], &ids[2]);
    assert!(
        cache.closed_data_path(first).is_some(),
        "closed, one block known"
    );
    let open_entries = cache.index_memory().open_entries;
    let file = cache
        .open_complete(first)
        .await
        .expect("open")
        .expect("complete");
    assert!(bytes_of(&file) == whole(first), "the object's bytes");
    assert!(
        cache.closed_data_path(first).is_some(),
        "opened by name: the entry was not reopened"
    );
    assert_eq!(cache.index_memory().open_entries, open_entries);

    let short = OpenOptions::new()
        .write(true)
        .open(data_path(root, second))
        .expect("data file");
    short.set_len(100).expect("truncate");
    drop(short);
    assert!(cache
        .open_complete(second)
        .await
        .expect("no error")
        .is_none());

    fs::remove_file(data_path(root, third)).expect("remove");
    assert!(cache
        .open_complete(third)
        .await
        .expect("no error")
        .is_none());
}

/// After a restart a small file's entry is complete but not known good; opened for passthrough
/// it is checked on the spot, by its data file's name against the CRC its record keeps, and is
/// known good from then on; a changed byte is refused (never handed to the kernel), and an
/// object of more than one block is left to the background check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_file_cached_before_a_restart_is_checked_when_opened_for_passthrough() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    let (cfg, cache, small) = small_closed_entries(root, 4).await;
    let big = obj("big", 2 * BS + 100);
    write_all_blocks(&cache, &big).await;
    drop(cache);
    let cache = DiskCache::open(cfg).expect("reopen");
    cache.wait_for_scan();
    let (first, second) = (&small[0], &small[1]);
    assert!(!cache.is_known_good(first), "not checked since the restart");
    let file = cache
        .open_checked_one_block(first)
        .await
        .expect("no error")
        .expect("checked");
    assert!(bytes_of(&file) == whole(first), "the object's bytes");
    assert!(cache.is_known_good(first));
    assert!(
        cache.closed_data_path(first).is_some(),
        "by name: still closed"
    );

    let data = OpenOptions::new()
        .write(true)
        .open(data_path(root, second))
        .expect("data file");
    data.write_all_at(b"\xde\xad", 10).expect("flip");
    drop(data);
    assert!(cache
        .open_checked_one_block(second)
        .await
        .expect("no error")
        .is_none());
    assert!(
        !cache.is_known_good(second),
        "a changed byte is never trusted"
    );

    assert!(cache
        .open_checked_one_block(&big)
        .await
        .expect("no error")
        .is_none());
    assert!(!cache.is_known_good(&big));
}

/// Bytes `range` of `id` read in part (`read_verified_on_ring`): `None` when refused.
async fn verified_read(
    cache: &Arc<DiskCache>,
    id: &ObjectIdentity,
    range: std::ops::Range<u64>,
) -> Option<Option<Bytes>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    match cache.read_verified_on_ring(id, range, move |d| {
        let _ = tx.send(d);
    }) {
        Ok(()) => Some(rx.await.expect("done runs")),
        Err(_) => None,
    }
}

/// Blocks this handle wrote are read in part, without a CRC; blocks another handle (another
/// process) wrote are not, until this one has read them whole and checked them; a block that
/// failed its check never is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_known_good_blocks_are_read_in_part() {
    let dir = tempfile::tempdir().unwrap();
    let a = open(dir.path(), 64 << 20);
    let id = obj("tokens.bin", 3 * BS + 100);
    let all = whole(&id);
    write_all_blocks(&a, &id).await;
    let across = BS / 2..2 * BS + 10;
    let got = verified_read(&a, &id, across.clone())
        .await
        .expect("known good");
    assert_eq!(
        got.as_deref(),
        Some(&all[across.start as usize..across.end as usize])
    );
    let tail = 3 * BS + 1..3 * BS + 100;
    let got = verified_read(&a, &id, tail.clone())
        .await
        .expect("known good");
    assert_eq!(got.as_deref(), Some(&all[tail.start as usize..]));
    assert_eq!(a.stats().verified_reads, 2);
    // Nothing past the end, nothing empty.
    assert!(verified_read(&a, &id, 3 * BS..3 * BS + 101).await.is_none());
    assert!(verified_read(&a, &id, 5..5).await.is_none());

    // Another handle on the directory (another process): nothing it has not checked itself.
    let b = open(dir.path(), 64 << 20);
    assert!(verified_read(&b, &id, 0..10).await.is_none());
    for i in 0..2 {
        assert_eq!(b.read_block(&id, i).await.unwrap(), Some(content(&id, i)));
    }
    let first_two = 10..2 * BS - 10;
    let got = verified_read(&b, &id, first_two.clone())
        .await
        .expect("checked by b");
    assert_eq!(
        got.as_deref(),
        Some(&all[first_two.start as usize..first_two.end as usize])
    );
    assert!(
        verified_read(&b, &id, BS..2 * BS + 1).await.is_none(),
        "block 2 unchecked"
    );

    // Block 2 corrupted on disk: its check fails, it is dropped, and never read in part.
    let path = data_path(dir.path(), &id);
    let mut raw = fs::read(&path).unwrap();
    raw[(2 * BS + 50) as usize] ^= 0xff;
    fs::write(&path, raw).unwrap();
    assert_eq!(b.read_block(&id, 2).await.unwrap(), None);
    assert!(verified_read(&b, &id, 2 * BS..2 * BS + 10).await.is_none());
    assert!(verified_read(&b, &id, 0..10).await.is_some());
}
