//! A changed object is never served as a blend of two versions.

#![cfg(feature = "rgw-tests")]

mod common;

use std::fs::File;
use std::os::unix::fs::FileExt;

use common::*;

#[test]
fn an_object_replaced_mid_read_fails_the_read_then_reopens_clean() {
    let endpoint = need_rgw!();
    let bucket = unique_bucket("change");
    let v1 = pattern(64 << 20, 1);
    let v2 = pattern(64 << 20, 2);
    let s3 = client(&endpoint);
    let rt = runtime();
    rt.block_on(async {
        create_bucket(&s3, &bucket).await;
        put(&s3, &bucket, "obj.bin", v1.clone()).await;
    });
    // TTL 0: every open revalidates; a small memory budget keeps little cached.
    let mount = Mount::new(
        &endpoint,
        &format!("s3://{bucket}"),
        &["--metadata-ttl", "0", "--max-memory", "32M"],
    );
    let path = mount.join("obj.bin");
    let f = File::open(&path).unwrap();
    let mut buf = vec![0u8; 4096];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf[..], &v1[..4096]);
    rt.block_on(put(&s3, &bucket, "obj.bin", v2.clone()));
    // A part never fetched before: the GET carries If-Match with v1's ETag and fails.
    let mut far = vec![0u8; 4096];
    let err = f.read_exact_at(&mut far, 50 << 20).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    drop(f);
    // Reopening sees the new version, whole.
    let f = File::open(&path).unwrap();
    f.read_exact_at(&mut far, 50 << 20).unwrap();
    assert_eq!(&far[..], &v2[50 << 20..(50 << 20) + 4096]);
    let all = std::fs::read(&path).unwrap();
    assert!(all == v2, "the file must be exactly the new version");
}

#[test]
fn a_replaced_object_is_never_served_from_its_old_cache_file() {
    let endpoint = need_rgw!();
    let v1 = pattern(3 << 20, 11);
    let v2 = pattern(3 << 20, 12);
    let cached = cached_object(&endpoint, "change-cached", &v1);
    let (mount, path) = (&cached.mount, &cached.path);
    assert!(std::fs::read(path).unwrap() == v1);
    assert_eq!(
        stats(mount)["fuse"]["fast_opens"],
        0,
        "TTL 0: no open without a HEAD"
    );
    cached.replace(&v2);
    drop_page_cache();
    let all = std::fs::read(path).unwrap();
    assert!(all == v2, "the file must be exactly the new version");
    // The new version gets its own cache file; v1's is never handed out again.
    wait_for_stats(mount, "v2 cached", |s| {
        s["fuse"]["backings_opened_ahead"] == 2
    });
    drop_page_cache();
    assert!(std::fs::read(path).unwrap() == v2);
}

/// The kernel ties a passthrough backing file to the inode, so while version 1 is open that
/// way, an open of version 2 cannot share the inode: the name moves to a new inode and the
/// new open reads version 2, whole, while the old handle keeps reading version 1, whole.
#[test]
fn a_replaced_object_opened_beside_an_open_old_version_reads_the_new_version() {
    use std::io::{Read, Seek, SeekFrom};
    use std::os::unix::fs::MetadataExt;
    let endpoint = need_rgw!();
    let v1 = pattern(3 << 20, 21);
    let v2 = pattern(2 << 20, 22);
    let cached = cached_object(&endpoint, "change-open", &v1);
    let (mount, path) = (&cached.mount, &cached.path);
    let passthrough_before = stats(mount)["fuse"]["passthrough_opens"].clone();
    let mut old = std::fs::File::open(path).unwrap();
    assert_ne!(
        stats(mount)["fuse"]["passthrough_opens"],
        passthrough_before,
        "the old version is open through passthrough"
    );
    let mut head = vec![0u8; 1 << 20];
    old.read_exact(&mut head).unwrap();
    assert!(head[..] == v1[..1 << 20]);

    cached.replace(&v2);
    drop_page_cache();
    let new = std::fs::read(path).expect("opening the new version while the old one is open");
    assert!(new == v2, "the new open reads exactly the new version");
    assert_ne!(
        std::fs::metadata(path).unwrap().ino(),
        old.metadata().unwrap().ino(),
        "the name moved to a new inode"
    );

    // The old handle still reads the old version, whole and unmixed.
    old.seek(SeekFrom::Start(0)).unwrap();
    let mut rest = Vec::new();
    old.read_to_end(&mut rest).unwrap();
    assert!(rest == v1, "the old handle reads exactly the old version");
    drop(old);
    drop_page_cache();
    assert!(std::fs::read(path).unwrap() == v2);
}

/// `obj.bin` (= `v1`) in a fresh bucket, mounted with a disk cache and TTL 0 (every open
/// revalidates the ETag), read once whole: v1 is complete in the cache and its backing file
/// kept for passthrough.
fn cached_object(endpoint: &str, tag: &str, v1: &[u8]) -> OneObject {
    let one = OneObject::new(endpoint, tag, v1, &[]);
    assert!(std::fs::read(&one.path).unwrap() == v1);
    wait_for_stats(&one.mount, "v1 cached, backing kept", |s| {
        s["cache"]["complete_objects"] == 1 && s["fuse"]["idle_backings"] == 1
    });
    one
}
