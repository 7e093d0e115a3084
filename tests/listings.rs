//! Listings against the real RGW behind a latency proxy (30 ms to the first byte): a walk lists
//! directories ahead of the walker, and a remount on the same `--cache-dir` with
//! `--metadata-ttl indefinite` lists nothing, after an unmount or a SIGKILL. LISTs are counted at the proxy, not by riffle.

#![cfg(feature = "rgw-tests")]

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use riffle_bench::proxy::{BlockingProxy, Latency, ProxyConfig};

const DIRS: usize = 20;
const FILES: usize = 10;

fn slow_proxy(endpoint: &str) -> BlockingProxy {
    let latency = Latency {
        first_byte_delay_ms: 30,
        ..Latency::STANDARD
    };
    BlockingProxy::start(ProxyConfig::new(endpoint.to_string()).with_latency(latency))
        .expect("proxy")
}

fn lists(proxy: &BlockingProxy) -> u64 {
    proxy.stats().requests.list
}

fn mount(proxy: &BlockingProxy, bucket: &str, cache: &std::path::Path) -> Mount {
    Mount::new(
        &proxy.url(),
        &format!("s3://{bucket}/ds"),
        &[
            "--metadata-ttl",
            "indefinite",
            "--cache-dir",
            cache.to_str().unwrap(),
        ],
    )
}

fn namespace_stat(mount: &Mount, name: &str) -> u64 {
    stats(mount)["namespace"][name].as_u64().unwrap_or(0)
}

#[test]
fn a_remount_on_the_same_cache_dir_with_indefinite_lists_nothing() {
    let endpoint = need_rgw!();
    let bucket = unique_bucket("listings");
    let objects: Vec<(String, Vec<u8>)> = (0..DIRS * FILES)
        .map(|i| {
            let key = format!("ds/class{:02}/img{:03}.jpg", i / FILES, i);
            (key, pattern(100 + i, i as u64))
        })
        .collect();
    runtime().block_on(async {
        let s3 = client(&endpoint);
        create_bucket(&s3, &bucket).await;
        put_many(&s3, &bucket, objects.clone(), 32).await;
    });
    let mut expected: Vec<String> = objects
        .iter()
        .map(|(k, _)| k.trim_start_matches("ds/").to_string())
        .collect();
    expected.extend((0..DIRS).map(|d| format!("class{d:02}/")));
    expected.sort();
    let proxy = slow_proxy(&endpoint);
    let cache = tempfile::tempdir().unwrap();
    let dirs = DIRS as u64 + 1;

    // First mount: reading the root lists its subdirectories in the background with no
    // reader asking (waited for, so the test does not race the walker); the walk then lists
    // nothing more, and every listing is kept on disk.
    {
        let first = mount(&proxy, &bucket, cache.path());
        proxy.reset_stats();
        assert_eq!(std::fs::read_dir(&first.path).unwrap().count(), DIRS);
        wait_for_stats(&first, "every subdirectory listed ahead", |s| {
            s["namespace"]["listings_background"].as_u64() == Some(DIRS as u64)
        });
        assert_eq!(walk(&first.path), expected);
        assert_eq!(lists(&proxy), dirs, "each directory listed once");
        wait_for_stats(&first, "every listing kept", |s| {
            s["namespace"]["listings_saved"].as_u64() == Some(dirs)
        });
    }

    // Second mount on the same cache dir: one LIST (the start-up access check), then none.
    let second = mount(&proxy, &bucket, cache.path());
    proxy.reset_stats();
    assert_eq!(walk(&second.path), expected);
    for (key, want) in objects.iter().take(3) {
        let got = std::fs::read(second.join(key.trim_start_matches("ds/"))).unwrap();
        assert!(got == *want, "{key}");
    }
    assert_eq!(lists(&proxy), 0, "the remount listed");
    assert_eq!(namespace_stat(&second, "listings_from_disk"), dirs);
    assert_eq!(namespace_stat(&second, "listings"), 0);

    // After SIGKILL too: what was kept is whole, and a new mount lists nothing.
    let pid = second.pid();
    unsafe { libc::kill(pid, libc::SIGKILL) };
    for _ in 0..500 {
        if std::fs::metadata(format!("/proc/{pid}")).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(second); // cleans the dead mount
    let after_kill = mount(&proxy, &bucket, cache.path());
    proxy.reset_stats();
    assert_eq!(walk(&after_kill.path), expected);
    assert_eq!(lists(&proxy), 0, "the mount after SIGKILL listed");
    drop(after_kill);

    // `riffle cache clear` removes saved listings: the next mount lists again.
    let out = run_with_timeout(
        Command::new(RIFFLE)
            .args(["cache", "clear", "--cache-dir"])
            .arg(cache.path()),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!cache.path().join("listings").exists());
    let third = mount(&proxy, &bucket, cache.path());
    proxy.reset_stats();
    assert_eq!(walk(&third.path), expected);
    assert_eq!(lists(&proxy), dirs);
    assert_eq!(namespace_stat(&third, "listings_from_disk"), 0);
}
