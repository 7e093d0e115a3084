//! Without FUSE passthrough (kernels before 6.9, no CAP_SYS_ADMIN, `--no-passthrough`) every
//! read the page cache cannot answer goes through the daemon: warm epochs read exactly the
//! objects' bytes every way (read, `pread`, `mmap`, `O_DIRECT`) within the memory bound, and a
//! changed object is never served as a blend of two versions.

#![cfg(feature = "rgw-tests")]

mod common;

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};

use common::*;

const BIG: usize = 64 << 20;

/// Small files of awkward sizes (empty, one byte, around a page, up to just over 1 MiB) and
/// one 64 MiB file, twice the memory budget.
fn dataset(endpoint: &str, tag: &str) -> (String, Vec<(String, Vec<u8>)>) {
    let bucket = unique_bucket(tag);
    let sizes = [
        0usize,
        1,
        4095,
        4096,
        4097,
        65_537,
        100_000,
        1 << 20,
        (1 << 20) + 1,
    ];
    let mut objects: Vec<(String, Vec<u8>)> = (0..60)
        .map(|i| {
            let size = sizes[i % sizes.len()] + if i < sizes.len() { 0 } else { i * 997 };
            (
                format!("train/c{}/img{i:03}.jpg", i % 5),
                pattern(size, 1000 + i as u64),
            )
        })
        .collect();
    objects.push(("shards/big.bin".into(), pattern(BIG, 77)));
    bucket_with(endpoint, &bucket, &objects);
    (bucket, objects)
}

/// Without passthrough, with a memory budget well below the dataset.
const NO_PASSTHROUGH: &[&str] = &["--no-passthrough", "--max-memory", "32M"];

/// Reads every small file from 4 threads, each in its own order, and checks the bytes.
fn read_small_files(mount: &Mount, objects: &[(String, Vec<u8>)]) {
    std::thread::scope(|s| {
        for t in 0..4usize {
            s.spawn(move || {
                let n = objects.len();
                for k in 0..n {
                    let (key, want) = &objects[(k * 7 + t * 13) % n];
                    if want.len() > 2 << 20 {
                        continue;
                    }
                    let got =
                        std::fs::read(mount.join(key)).unwrap_or_else(|e| panic!("{key}: {e}"));
                    assert!(got == *want, "{key}: wrong bytes");
                }
            });
        }
    });
}

/// Reads the big file sequentially, by `pread` at scattered offsets, through `mmap`, and with
/// `O_DIRECT`, checking every byte.
fn read_big_every_way(mount: &Mount, want: &[u8]) {
    let path = mount.join("shards/big.bin");
    let got = std::fs::read(&path).unwrap();
    assert!(got == want, "sequential read: wrong bytes");
    let f = File::open(&path).unwrap();
    let mut buf = vec![0u8; 300_000];
    for off in [0usize, 4095, 1 << 20, 33_333_333, BIG - 300_000] {
        f.read_exact_at(&mut buf, off as u64).unwrap();
        assert!(buf[..] == want[off..off + buf.len()], "pread at {off}");
    }
    let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
    assert_eq!(map.len(), BIG);
    for off in [0usize, 12_345_678, BIG - 4096] {
        assert!(
            map[off..off + 4096] == want[off..off + 4096],
            "mmap at {off}"
        );
    }
    drop(map);
    check_o_direct_reads(&path, want, &[0, 9 << 20, (BIG as u64) - (1 << 20)]);
}

#[test]
fn warm_epochs_without_passthrough_read_exact_bytes_every_way_within_the_memory_bound() {
    let endpoint = need_rgw!();
    let (bucket, objects) = dataset(&endpoint, "nopt-warm");
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = cache_dir.path().to_str().unwrap();
    let opts = [
        &["--cache-dir", cache, "--metadata-ttl", "indefinite"][..],
        NO_PASSTHROUGH,
    ]
    .concat();
    let mount = Mount::new(&endpoint, &format!("s3://{bucket}"), &opts);
    // Epoch 1 (cold) fills the disk cache.
    read_small_files(&mount, &objects);
    let big = &objects.last().unwrap().1;
    read_big_every_way(&mount, big);
    let n = objects.iter().filter(|(_, b)| !b.is_empty()).count() as u64;
    wait_for_stats(&mount, "everything cached", |s| {
        s["cache"]["complete_objects"].as_u64() == Some(n)
    });
    let gets = stats(&mount)["store"]["get_requests"].clone();
    // Two warm epochs from the disk cache (the 64 MiB file is twice the memory budget).
    for _ in 0..2 {
        drop_page_cache();
        read_small_files(&mount, &objects);
        read_big_every_way(&mount, big);
    }
    let s = stats(&mount);
    assert_eq!(
        s["store"]["get_requests"], gets,
        "warm epochs cost no GET: {s}"
    );
    assert_eq!(s["fuse"]["passthrough_opens"], 0);
    assert_eq!(s["fuse"]["passthrough"], "off (--no-passthrough)");
    // The reads above came in requests of up to 1 MiB: the mount's read-ahead window (its
    // backing device's read_ahead_kb, 128 by default) was raised at mount (tests run as root).
    assert_eq!(s["fuse"]["kernel_read_ahead"], "1024 KiB", "{s}");
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let device = mountinfo
        .lines()
        .rev()
        .filter(|l| l.split(' ').nth(4) == mount.path.to_str())
        .find_map(|l| l.split(' ').nth(2))
        .expect("the mount in mountinfo");
    let window = std::fs::read_to_string(format!("/sys/class/bdi/{device}/read_ahead_kb")).unwrap();
    assert_eq!(window.trim(), "1024");
    assert_eq!(s["cache"]["crc_failures"], 0);
    assert!(s["blocks"]["disk_hits"].as_u64().unwrap() > 0, "{s}");
    let memory = s["blocks"]["memory_cache_bytes"].as_u64().unwrap();
    assert!(
        memory <= 32 << 20,
        "memory cache {memory} bytes over --max-memory 32M"
    );
    let rss = peak_rss(mount.pid());
    assert!(rss > 0, "daemon gone");
    assert!(rss < 256 << 20, "daemon peak RSS {} MiB", rss >> 20);
}

/// A replaced object is read whole at its new version at the next open, although the page
/// cache held the old version's pages and the memory cache its bytes.
#[test]
fn a_replaced_small_object_is_read_whole_at_its_new_version_without_passthrough() {
    let endpoint = need_rgw!();
    let versions: Vec<Vec<u8>> = (0..4).map(|v| pattern(150_000, 300 + v)).collect();
    let one = OneObject::new(&endpoint, "nopt-change", &versions[0], NO_PASSTHROUGH);
    let path = &one.path;
    for (v, bytes) in versions.iter().enumerate() {
        if v > 0 {
            one.replace(bytes);
        }
        // Twice: the second open finds the version in memory and its pages in the page cache.
        for round in 0..2 {
            let got = std::fs::read(path).unwrap();
            assert!(
                got == *bytes,
                "version {v}, read {round}: not exactly that version"
            );
        }
    }
}

/// Daemon-served handles share the inode's page cache, so an open of a new version beside an
/// open old one gets a new inode: the new handle reads the new version whole, the old handle
/// the old version whole, however their reads interleave.
#[test]
fn a_replaced_object_opened_beside_an_open_old_version_reads_the_new_version_without_passthrough() {
    let endpoint = need_rgw!();
    let v1 = pattern(3 << 20, 501);
    let v2 = pattern(3 << 20, 502);
    let one = OneObject::new(&endpoint, "nopt-beside", &v1, NO_PASSTHROUGH);
    let path = &one.path;
    let old = File::open(path).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    old.read_exact_at(&mut buf, 0).unwrap();
    assert!(buf[..] == v1[..1 << 20]);

    one.replace(&v2);
    let new = File::open(path).unwrap();
    assert_ne!(
        new.metadata().unwrap().ino(),
        old.metadata().unwrap().ino(),
        "the name moved to a new inode"
    );
    // Interleaved: each handle reads the same regions, each its own version.
    for off in [1usize << 20, 0, 2 << 20] {
        old.read_exact_at(&mut buf, off as u64).unwrap();
        assert!(buf[..] == v1[off..off + buf.len()], "old handle at {off}");
        new.read_exact_at(&mut buf, off as u64).unwrap();
        assert!(buf[..] == v2[off..off + buf.len()], "new handle at {off}");
    }
    drop(old);
    drop(new);
    assert!(std::fs::read(path).unwrap() == v2);
}
