//! An /etc/fstab line (`riffle#s3://...  /mnt  fuse  options`) or `mount -t fuse.riffle` is
//! handed by mount(8) to mount.fuse3, which runs riffle's helper form. mount(8) resets PATH
//! to a system default, so the test calls mount.fuse3 directly with riffle on its PATH.

#![cfg(feature = "rgw-tests")]

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

#[test]
fn mount_t_fuse_riffle_works_with_fstab_options() {
    let endpoint = need_rgw!();
    let bucket = unique_bucket("fstab");
    runtime().block_on(async {
        let s3 = client(&endpoint);
        create_bucket(&s3, &bucket).await;
        put(&s3, &bucket, "ds/x.txt", b"from fstab".to_vec()).await;
    });
    // mount.fuse3 finds the program named by the type on PATH.
    let bin = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(RIFFLE, bin.path().join("riffle")).unwrap();
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let options = format!(
        "ro,_netdev,nofail,allow_other,endpoint-url={endpoint},force-path-style,metadata-ttl=indefinite"
    );
    let out = run_with_timeout(
        Command::new("mount.fuse3")
            .arg(format!("riffle#s3://{bucket}/ds/"))
            .arg(&mnt)
            .args(["-o", &options])
            .env("PATH", &path),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read = std::fs::read(mnt.join("x.txt"));
    let _ = Command::new(RIFFLE).arg("unmount").arg(&mnt).output();
    assert_eq!(read.unwrap(), b"from fstab");
    // 'rw' is refused with a reason.
    let out = run_with_timeout(
        Command::new("mount.fuse3")
            .arg(format!("riffle#s3://{bucket}/"))
            .arg(&mnt)
            .args(["-o", "rw"])
            .env("PATH", &path),
        Duration::from_secs(60),
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("read-only"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
