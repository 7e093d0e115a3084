//! A changed object is never served as a blend of two versions.

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
