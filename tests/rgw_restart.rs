//! The real RGW stopped and started again under a live mount: reads fail with EIO while it is
//! down and work again afterwards, without remounting.
//!
//! This stops the shared RGW, so it is `#[ignore]`d in the normal run and executed on its own,
//! last, by `tests/run.sh` (`cargo test --test rgw_restart -- --ignored`).

#![cfg(feature = "rgw-tests")]

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// The radosgw of the local cluster under test (`RIFFLE_RGW_DIR`, as `deploy/local/rgw.sh`
/// uses it): its pid and command line.
fn radosgw() -> (i32, Vec<String>) {
    let dir = std::env::var("RIFFLE_RGW_DIR").unwrap_or_else(|_| "/tmp/riffle-rgw".into());
    let conf = format!("{}/ceph.conf", dir.trim_end_matches('/'));
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = raw
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.first().is_some_and(|a| a.ends_with("radosgw")) && args.contains(&conf) {
            return (pid, args);
        }
    }
    panic!("no radosgw process of {conf} found");
}

fn answers(endpoint: &str) -> bool {
    let addr = endpoint.trim_start_matches("http://");
    std::net::TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_secs(1)).is_ok()
}

fn wait(what: &str, limit: Duration, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
#[ignore = "stops the shared RGW; run alone by tests/run.sh"]
fn reads_fail_while_rgw_is_down_and_work_after_it_restarts() {
    let endpoint = need_rgw!();
    let bucket = unique_bucket("restart");
    runtime().block_on(async {
        let s3 = client(&endpoint);
        create_bucket(&s3, &bucket).await;
        for i in 0..3 {
            put(&s3, &bucket, &format!("f{i}"), pattern(100_000, i)).await;
        }
    });
    let mount = Mount::new(
        &endpoint,
        &format!("s3://{bucket}"),
        &["--metadata-ttl", "indefinite"],
    );
    assert_eq!(
        std::fs::read(mount.join("f0")).unwrap(),
        pattern(100_000, 0)
    );
    let _ = walk(&mount.path);

    let (pid, args) = radosgw();
    unsafe { libc::kill(pid, libc::SIGTERM) };
    wait("radosgw to stop", Duration::from_secs(30), || {
        std::fs::metadata(format!("/proc/{pid}")).is_err() || !answers(&endpoint)
    });
    let err = std::fs::read(mount.join("f1")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    // Already-read data is still served from the caches.
    assert_eq!(
        std::fs::read(mount.join("f0")).unwrap(),
        pattern(100_000, 0)
    );

    let status = Command::new(&args[0])
        .args(&args[1..])
        .status()
        .expect("restart radosgw");
    assert!(status.success(), "radosgw did not start again");
    wait("radosgw to answer", Duration::from_secs(90), || {
        answers(&endpoint)
    });
    // RGW may need a moment after accepting connections; reads succeed without a remount.
    let start = Instant::now();
    loop {
        match std::fs::read(mount.join("f1")) {
            Ok(data) => {
                assert_eq!(data, pattern(100_000, 1));
                break;
            }
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
                assert!(
                    start.elapsed() < Duration::from_secs(60),
                    "still failing: {e}"
                );
                std::thread::sleep(Duration::from_millis(500));
            }
        }
    }
    assert_eq!(
        std::fs::read(mount.join("f2")).unwrap(),
        pattern(100_000, 2)
    );
}
