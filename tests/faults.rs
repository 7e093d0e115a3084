//! Faults under load: a proxy between the mount and RGW injects 500s, 503 SlowDown, resets
//! mid-body, truncated bodies and slow trickles while several readers read and verify. Every
//! read must return the right bytes or EIO — never wrong bytes — the daemon must stay up and
//! within its memory budget, and everything must read cleanly once the faults stop.

#![cfg(feature = "rgw-tests")]

mod common;

use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};

use common::*;
use riffle_bench::proxy::{BlockingProxy, FaultRule, Latency, ProxyConfig, RequestKind};

fn proxy(endpoint: &str) -> BlockingProxy {
    BlockingProxy::start(ProxyConfig::new(endpoint.to_string()).with_latency(Latency::NONE))
        .expect("proxy")
}

#[derive(Default)]
struct Counts {
    ok: AtomicU64,
    eio: AtomicU64,
}

/// Reads every object once per round with `threads` readers; panics on wrong bytes or on an
/// error other than EIO.
fn read_rounds(
    mount: &Mount,
    objects: &[(String, Vec<u8>)],
    threads: usize,
    rounds: usize,
) -> Counts {
    let counts = Counts::default();
    std::thread::scope(|s| {
        for t in 0..threads {
            let counts = &counts;
            s.spawn(move || {
                for r in 0..rounds {
                    for (i, (key, want)) in objects.iter().enumerate() {
                        if (i + t + r) % threads != 0 {
                            continue;
                        }
                        let mut got = Vec::new();
                        let result = std::fs::File::open(mount.join(key))
                            .and_then(|mut f| f.read_to_end(&mut got));
                        match result {
                            Ok(_) => {
                                assert!(got == *want, "WRONG BYTES for {key}");
                                counts.ok.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) if e.raw_os_error() == Some(libc::EIO) => {
                                counts.eio.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => panic!("{key}: unexpected error {e}"),
                        }
                    }
                }
            });
        }
    });
    counts
}

#[test]
fn reads_under_faults_are_right_or_eio_and_recover() {
    let endpoint = need_rgw!();
    let bucket = unique_bucket("faults");
    let mut objects: Vec<(String, Vec<u8>)> = (0..160)
        .map(|i| {
            (
                format!("small/f{i:03}"),
                pattern(20_000 + i * 977, i as u64),
            )
        })
        .collect();
    for i in 0..4 {
        objects.push((format!("big/b{i}"), pattern(6 << 20, 1000 + i as u64)));
    }
    runtime().block_on(async {
        let s3 = client(&endpoint);
        create_bucket(&s3, &bucket).await;
        put_many(&s3, &bucket, objects.clone(), 16).await;
    });
    let proxy = proxy(&endpoint);
    // A small memory budget and no disk cache, so every round fetches again under faults.
    let mount = Mount::new(
        &proxy.url(),
        &format!("s3://{bucket}"),
        &["--metadata-ttl", "indefinite", "--max-memory", "32M"],
    );
    // Metadata first (faults target data reads).
    let _ = walk(&mount.path);
    proxy
        .set_faults(vec![
            FaultRule::http500().with_probability(0.08),
            FaultRule::slowdown503().with_probability(0.08),
            FaultRule::reset_mid_body().with_probability(0.05),
            FaultRule::truncate_body().with_probability(0.05),
            FaultRule::trickle(200_000)
                .with_probability(0.02)
                .with_limit(4),
        ])
        .expect("faults");
    let under_faults = read_rounds(&mount, &objects, 8, 3);
    drop_page_cache();
    let injected = proxy.stats().faults_injected;
    let total_faults = injected.http500
        + injected.slowdown503
        + injected.reset_mid_body
        + injected.truncate_body
        + injected.trickle;
    // The daemon is alive and within budget (32M of data buffers plus the runtime).
    let rss = peak_rss(mount.pid());
    assert!(rss > 0, "daemon gone");
    assert!(rss < 256 << 20, "peak RSS {rss} bytes");
    // Faults off: everything reads, right.
    proxy.clear_faults();
    let after = read_rounds(&mount, &objects, 8, 1);
    assert_eq!(
        after.eio.load(Ordering::Relaxed),
        0,
        "reads still failing after the faults stopped"
    );
    let s = stats(&mount);
    println!(
        "faults under load: {} reads right, {} EIO, 0 wrong; {} faults injected ({:?}); \
         {} store retries; then {} reads right with faults off; daemon peak RSS {} MiB",
        under_faults.ok.load(Ordering::Relaxed),
        under_faults.eio.load(Ordering::Relaxed),
        total_faults,
        injected,
        s["store"]["retries"],
        after.ok.load(Ordering::Relaxed),
        rss >> 20
    );
    assert!(total_faults > 20, "the faults fired: {injected:?}");
    assert!(under_faults.ok.load(Ordering::Relaxed) > 0);
}

#[test]
fn a_10000_file_directory_lists_completely_while_503s_fire() {
    let endpoint = need_rgw!();
    let bucket = unique_bucket("list503");
    let objects: Vec<(String, Vec<u8>)> = (0..10_000)
        .map(|i| (format!("big/k{i:05}"), Vec::new()))
        .collect();
    runtime().block_on(async {
        let s3 = client(&endpoint);
        create_bucket(&s3, &bucket).await;
        put_many(&s3, &bucket, objects, 64).await;
    });
    let proxy = proxy(&endpoint);
    let mount = Mount::new(&proxy.url(), &format!("s3://{bucket}"), &[]);
    proxy
        .set_faults(vec![FaultRule::slowdown503()
            .with_kind(RequestKind::List)
            .with_every_nth(3)])
        .expect("faults");
    let names = std::fs::read_dir(mount.join("big")).unwrap().count();
    assert_eq!(names, 10_000);
    let injected = proxy.stats().faults_injected.slowdown503;
    println!("listed 10,000 entries while {injected} LIST requests got 503 SlowDown");
    assert!(injected >= 3);
}

#[test]
fn a_stalled_store_fails_reads_with_eio_not_a_hang() {
    let endpoint = need_rgw!();
    let bucket = unique_bucket("stall");
    runtime().block_on(async {
        let s3 = client(&endpoint);
        create_bucket(&s3, &bucket).await;
        put(&s3, &bucket, "a", pattern(1000, 1)).await;
        put(&s3, &bucket, "b", pattern(1000, 2)).await;
    });
    let proxy = proxy(&endpoint);
    let mount = Mount::new(
        &proxy.url(),
        &format!("s3://{bucket}"),
        &["--metadata-ttl", "indefinite"],
    );
    let _ = walk(&mount.path);
    // The endpoint disappears: connections are refused.
    let url = proxy.url();
    proxy.shutdown();
    let err = std::fs::read(mount.join("a")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    // It comes back on the same address: reads work again without remounting.
    let addr: std::net::SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    let mut config = ProxyConfig::new(endpoint.clone()).with_latency(Latency::NONE);
    config.listen = addr;
    let _back = BlockingProxy::start(config).expect("restart on the same port");
    assert_eq!(std::fs::read(mount.join("b")).unwrap(), pattern(1000, 2));
    assert_eq!(std::fs::read(mount.join("a")).unwrap(), pattern(1000, 1));
}
