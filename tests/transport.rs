//! The FUSE transport (`fs::transport`): over io_uring every read returns the objects' exact
//! bytes, served by the daemon or handed to the kernel (passthrough), cold and warm, and the
//! requests really came over the rings, which the default takes where the kernel offers them;
//! `dev-fuse` and connections a keeper holds stay on `/dev/fuse` and say why.

#![cfg(feature = "rgw-tests")]

mod common;

use std::fs::File;
use std::os::unix::fs::FileExt;

use common::*;

const BIG: usize = 8 << 20;

/// Turns the kernel's FUSE io_uring on (tests run as root); false on a kernel without it
/// (before 6.14, or built without CONFIG_FUSE_IO_URING), where the ring tests have nothing to
/// test.
fn kernel_ring() -> bool {
    let switch = rifflefs::fs::transport::ENABLE_URING;
    if !std::path::Path::new(switch).exists() {
        eprintln!("skipping: this kernel has no FUSE io_uring ({switch})");
        return false;
    }
    std::fs::write(switch, "Y").unwrap_or_else(|e| panic!("cannot turn on {switch}: {e}"));
    true
}

/// Files of awkward sizes (empty, one byte, around a page, past 1 MiB: the payload buffer)
/// and one of 8 MiB.
fn dataset(endpoint: &str, tag: &str) -> (String, Vec<(String, Vec<u8>)>) {
    let bucket = unique_bucket(tag);
    let sizes = [
        0usize,
        1,
        4095,
        4097,
        65_537,
        (1 << 20) - 1,
        (1 << 20) + 1,
        3 << 20,
    ];
    let mut objects: Vec<(String, Vec<u8>)> = (0..40)
        .map(|i| {
            let size = sizes[i % sizes.len()] + if i < sizes.len() { 0 } else { i * 131 };
            (
                format!("d{}/f{i:02}.bin", i % 3),
                pattern(size, 7000 + i as u64),
            )
        })
        .collect();
    objects.push(("big.bin".into(), pattern(BIG, 7777)));
    bucket_with(endpoint, &bucket, &objects);
    (bucket, objects)
}

/// Reads every file from 4 threads, each in its own order, and the big one at scattered
/// offsets, checking every byte.
fn read_all(mount: &Mount, objects: &[(String, Vec<u8>)]) {
    std::thread::scope(|s| {
        for t in 0..4usize {
            s.spawn(move || {
                let n = objects.len();
                for k in 0..n {
                    let (key, want) = &objects[(k * 7 + t * 13) % n];
                    let got =
                        std::fs::read(mount.join(key)).unwrap_or_else(|e| panic!("{key}: {e}"));
                    assert!(got == *want, "{key}: wrong bytes");
                }
            });
        }
    });
    let want = &objects.last().unwrap().1;
    let f = File::open(mount.join("big.bin")).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    for off in [0usize, 4095, 1 << 20, 3_333_333, BIG - (1 << 20)] {
        f.read_exact_at(&mut buf, off as u64).unwrap();
        assert!(buf[..] == want[off..off + buf.len()], "pread at {off}");
    }
}

#[test]
fn reads_over_io_uring_return_exact_bytes_with_and_without_passthrough() {
    let endpoint = need_rgw!();
    if !kernel_ring() {
        return;
    }
    let (bucket, objects) = dataset(&endpoint, "uring");
    // The default takes the rings where the kernel offers them; the flag insists on them.
    for extra in [
        &[][..],
        &["--fuse-transport", "io-uring", "--no-passthrough"][..],
    ] {
        let cache_dir = tempfile::tempdir().unwrap();
        let cache = cache_dir.path().to_str().unwrap();
        let opts = [&["--cache-dir", cache][..], extra].concat();
        let mount = Mount::new(&endpoint, &format!("s3://{bucket}"), &opts);
        let s = stats(&mount);
        let transport = s["fuse"]["transport"].as_str().unwrap().to_string();
        assert!(
            transport.starts_with("io_uring: "),
            "{extra:?}: {transport}"
        );
        // Cold: fetched while read.
        read_all(&mount, &objects);
        let n = objects.iter().filter(|(_, b)| !b.is_empty()).count() as u64;
        wait_for_stats(&mount, "everything cached", |s| {
            s["cache"]["complete_objects"].as_u64() == Some(n)
        });
        // Warm, from the disk cache (the page cache dropped).
        drop_page_cache();
        read_all(&mount, &objects);
        let s = stats(&mount);
        let over_rings = s["fuse"]["ring_requests"].as_u64().unwrap();
        // At least a lookup, an open and a release per file per epoch came over the rings.
        assert!(
            over_rings >= 2 * 3 * objects.len() as u64,
            "{extra:?}: only {over_rings} requests over the rings: {s}"
        );
        if !extra.contains(&"--no-passthrough") {
            assert!(s["fuse"]["passthrough_opens"].as_u64().unwrap() > 0, "{s}");
        } else {
            assert_eq!(s["fuse"]["passthrough_opens"], 0);
        }
    }
}

#[test]
fn dev_fuse_and_keeper_connections_stay_off_the_ring_and_say_why() {
    let endpoint = need_rgw!();
    if !kernel_ring() {
        return;
    }
    let (bucket, objects) = dataset(&endpoint, "devfuse");
    let (key, want) = &objects[5];
    for (extra, why) in [
        (
            &["--fuse-transport", "dev-fuse"][..],
            "/dev/fuse: asked for (--fuse-transport dev-fuse)",
        ),
        (
            &["--restart"][..],
            "/dev/fuse: a keeper holds the connection",
        ),
    ] {
        let mount = Mount::new(&endpoint, &format!("s3://{bucket}"), extra);
        assert!(
            std::fs::read(mount.join(key)).unwrap() == *want,
            "{extra:?}"
        );
        let s = stats(&mount);
        let transport = s["fuse"]["transport"].as_str().unwrap();
        assert!(transport.starts_with(why), "{extra:?}: {transport}");
        assert_eq!(s["fuse"]["ring_requests"], 0, "{extra:?}");
    }
}
