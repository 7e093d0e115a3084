//! Prefetch against the real RGW behind a latency proxy (30 ms to the first byte): epoch
//! plans written by a Python training-style reader, `riffle warm`, and directory order.
//! GETs are counted at the proxy, per key, not by riffle.

#![cfg(feature = "rgw-tests")]

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use riffle_bench::proxy::{BlockingProxy, Latency, ProxyConfig};

fn dataset(
    endpoint: &str,
    tag: &str,
    classes: usize,
    per_class: usize,
) -> (String, Vec<(String, Vec<u8>)>) {
    let bucket = unique_bucket(tag);
    let objects: Vec<(String, Vec<u8>)> = (0..classes * per_class)
        .map(|i| {
            let key = format!("train/class{:02}/img{:04}.jpg", i % classes, i);
            (key, pattern(8_000 + (i * 7919) % 40_000, i as u64))
        })
        .collect();
    runtime().block_on(async {
        let s3 = client(endpoint);
        create_bucket(&s3, &bucket).await;
        put_many(&s3, &bucket, objects.clone(), 32).await;
    });
    (bucket, objects)
}

fn slow_proxy(endpoint: &str) -> BlockingProxy {
    let latency = Latency {
        first_byte_delay_ms: 30,
        ..Latency::STANDARD
    };
    BlockingProxy::start(
        ProxyConfig::new(endpoint.to_string())
            .with_latency(latency)
            .with_key_counts(),
    )
    .expect("proxy")
}

fn gets(proxy: &BlockingProxy) -> u64 {
    let s = proxy.stats();
    s.requests.get_object + s.requests.get_range
}

#[test]
fn a_reader_following_its_epoch_plan_finds_its_files_cached() {
    let endpoint = need_rgw!();
    let (bucket, objects) = dataset(&endpoint, "plan", 6, 50);
    let proxy = slow_proxy(&endpoint);
    let cache = tempfile::tempdir().unwrap();
    let mount = Mount::new(
        &proxy.url(),
        &format!("s3://{bucket}/train"),
        &[
            "--metadata-ttl",
            "indefinite",
            "--cache-dir",
            cache.path().to_str().unwrap(),
        ],
    );
    proxy.reset_stats();
    // Rank 0 of 2, epoch 3: half the dataset in a seeded shuffled order, paced like a trainer
    // (0.5 s from `set_epoch` to the first batch, 5 ms of compute per sample) rather than a
    // copy loop, which on a loaded 2-core machine could outrun any prefetcher on its first
    // files and make this a test of the machine's load.
    let out = run_with_timeout(
        Command::new("python3")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/plan_reader.py"))
            .arg(RIFFLE)
            .arg(&mount.path)
            .args(["42", "3", "0", "2", "500", "5"]),
        Duration::from_secs(300),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["files"], objects.len() as u64 / 2);
    let s = stats(&mount);
    let opens = s["prefetch"]["plan_opens"].as_u64().unwrap();
    let ready = s["prefetch"]["plan_opens_already_cached"].as_u64().unwrap();
    assert_eq!(opens, objects.len() as u64 / 2, "{s}");
    assert!(
        ready * 100 >= opens * 95,
        "only {ready} of {opens} opened files were cached: {s}"
    );
    // At the store: each file of the plan was fetched once (by the prefetcher, before the
    // reader asked), and nothing outside the plan was fetched.
    let per_key = proxy.stats().get_keys.unwrap_or_default();
    assert_eq!(per_key.len() as u64, opens, "{per_key:?}");
    assert!(per_key.values().all(|&n| n == 1), "{per_key:?}");
}

#[test]
fn warm_fills_the_cache_and_the_next_epoch_costs_no_gets() {
    let endpoint = need_rgw!();
    let (bucket, objects) = dataset(&endpoint, "warm", 4, 40);
    let proxy = slow_proxy(&endpoint);
    let cache = tempfile::tempdir().unwrap();
    let mount = Mount::new(
        &proxy.url(),
        &format!("s3://{bucket}"),
        &[
            "--metadata-ttl",
            "indefinite",
            "--cache-dir",
            cache.path().to_str().unwrap(),
        ],
    );
    let out = run_with_timeout(
        Command::new(RIFFLE)
            .arg("warm")
            .arg(&mount.path)
            .arg("train"),
        Duration::from_secs(300),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("{n}/{n} files", n = objects.len())),
        "{text}"
    );
    drop_page_cache();
    proxy.reset_stats();
    for (key, want) in &objects {
        assert!(std::fs::read(mount.join(key)).unwrap() == *want, "{key}");
    }
    assert_eq!(gets(&proxy), 0, "the warmed epoch reached the store");
    // Warming something that is not there fails with a reason.
    let out = run_with_timeout(
        Command::new(RIFFLE)
            .arg("warm")
            .arg(&mount.path)
            .arg("nope"),
        Duration::from_secs(60),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope"));
}

#[test]
fn a_reader_in_ls_order_gets_files_prefetched_without_a_plan() {
    let endpoint = need_rgw!();
    let (bucket, objects) = dataset(&endpoint, "lsorder", 1, 120);
    let proxy = slow_proxy(&endpoint);
    // Directory order alone: epoch prefetch, on by default, would race it for the same files
    // (each fetched once either way) and make its count depend on timing.
    let mount = Mount::new(
        &proxy.url(),
        &format!("s3://{bucket}"),
        &["--metadata-ttl", "indefinite", "--epoch-prefetch", "off"],
    );
    let dir = mount.join("train/class00");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names.len(), objects.len());
    for name in &names {
        std::fs::read(dir.join(name)).unwrap();
    }
    let s = stats(&mount);
    let fetched = s["prefetch"]["dir_order_fetched_files"].as_u64().unwrap();
    let cached = s["prefetch"]["opens_already_cached"].as_u64().unwrap();
    assert!(fetched >= 100, "{s}");
    assert!(
        cached * 2 >= objects.len() as u64,
        "at least half found cached: {s}"
    );
    let per_key = proxy.stats().get_keys.unwrap_or_default();
    assert!(
        per_key.values().all(|&n| n == 1),
        "each file fetched once: {per_key:?}"
    );
}

/// The ImageFolder way with no plan and no flags: scan the tree, then read it in a shuffled
/// order from 8 threads in Python. Once the reader is half way, every file it has not opened
/// yet is fetched ahead (each once at the store), and the second half finds its files cached.
#[test]
fn a_shuffled_python_reader_gets_its_unopened_files_prefetched_without_a_plan() {
    let endpoint = need_rgw!();
    let (bucket, objects) = dataset(&endpoint, "epochpf", 6, 50);
    let proxy = slow_proxy(&endpoint);
    let cache = tempfile::tempdir().unwrap();
    let mount = Mount::new(
        &proxy.url(),
        &format!("s3://{bucket}"),
        &["--cache-dir", cache.path().to_str().unwrap()],
    );
    let reader = r#"
import os, random, sys, concurrent.futures as cf
root, half, out = sys.argv[1], sys.argv[2], sys.argv[3]
files = sorted(os.path.join(d, f) for d, _, fs in os.walk(os.path.join(root, "train")) for f in fs)
random.Random(42).shuffle(files)
part = files[: len(files) // 2] if half == "first" else files[len(files) // 2 :]
def read(p):
    with open(p, "rb") as f:
        return os.path.relpath(p, root), len(f.read())
with cf.ThreadPoolExecutor(8) as ex, open(out, "w") as o:
    for rel, n in ex.map(read, part):
        o.write(f"{rel}\t{n}\n")
"#;
    let sizes: std::collections::HashMap<String, usize> =
        objects.iter().map(|(k, v)| (k.clone(), v.len())).collect();
    let run = |half: &str| {
        let out = tempfile::NamedTempFile::new().unwrap();
        let status = run_with_timeout(
            Command::new("python3").args([
                "-c",
                reader,
                mount.join("").to_str().unwrap(),
                half,
                out.path().to_str().unwrap(),
            ]),
            Duration::from_secs(300),
        );
        assert!(status.status.success(), "{status:?}");
        let text = std::fs::read_to_string(out.path()).unwrap();
        for line in text.lines() {
            let (rel, n) = line.split_once('\t').unwrap();
            assert_eq!(sizes[rel], n.parse::<usize>().unwrap(), "{rel}");
        }
        text.lines().count()
    };
    assert_eq!(run("first"), 150);
    let files = objects.len() as u64;
    wait_for_stats(&mount, "the unopened files fetched ahead", |s| {
        let e = &s["prefetch"]["epoch"];
        e["fetching"].as_u64() == Some(0)
            && e["opened_files"].as_u64().unwrap_or(0)
                + e["ahead_unopened_files"].as_u64().unwrap_or(0)
                == files
    });
    let before = stats(&mount);
    assert_eq!(before["prefetch"]["epoch"]["root"], "train", "{before}");
    assert_eq!(run("second"), 150);
    let after = stats(&mount);
    let delta = |s: &serde_json::Value, k: &str| s["prefetch"][k].as_u64().unwrap();
    let opens = delta(&after, "opens") - delta(&before, "opens");
    let hits = delta(&after, "opens_already_cached") - delta(&before, "opens_already_cached");
    assert!(
        hits * 10 >= opens * 8,
        "{hits} of {opens} opens in the second half found their file cached: {after}"
    );
    let per_key = proxy.stats().get_keys.unwrap_or_default();
    assert_eq!(per_key.len(), objects.len(), "every file fetched");
    assert!(
        per_key.values().all(|&n| n == 1),
        "each file fetched once at the store: {per_key:?}"
    );
}
