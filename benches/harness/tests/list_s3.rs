//! `riffle-bench list-s3` (W4's S3 client reference) against the fake
//! upstream, through the proxy: it lists every key of a W4 tree once, in
//! delimited pages, the LISTs it counts are the proxy's, and a key missing
//! from the store is a wrong count (exit 1).

mod common;

use std::process::Command;

use bytes::Bytes;
use common::FakeUpstream;
use riffle_bench::listing::ListPass;
use riffle_bench::manifest::Manifest;
use riffle_bench::proxy::{Latency, ProxyConfig, ProxyHandle};

const BIN: &str = env!("CARGO_BIN_EXE_riffle-bench");

fn text(p: &std::path::Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_s3_counts_every_key_of_a_w4_tree_and_fails_on_a_missing_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let manifest = dir.path().join("w4.manifest");
    // Scale 0.001: flat/ holds 100 objects, tree/p0000/ 1,000.
    let out = Command::new(BIN)
        .args([
            "gen",
            "--workload",
            "w4",
            "--scale",
            "0.001",
            "--bucket",
            "bench",
            "--manifest",
            text(&manifest),
            "--manifest-only",
        ])
        .output()
        .expect("gen");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = Manifest::read(&manifest).expect("manifest");
    assert_eq!(m.entries.len(), 1100);

    let upstream = FakeUpstream::start().await;
    upstream.set_list_page(300);
    for e in &m.entries {
        upstream.put(
            &format!("bench/{}", e.key),
            Bytes::from(vec![b'x'; e.size as usize]),
        );
    }
    // The dataset marker and another bucket's keys are not counted.
    upstream.put("bench/.riffle-bench.json", Bytes::from_static(b"{}"));
    upstream.put("other/flat/obj-000000", Bytes::from_static(b"x"));
    let proxy = ProxyHandle::start(ProxyConfig::new(upstream.url()).with_latency(Latency::NONE))
        .await
        .expect("proxy");

    let json = dir.path().join("list.json");
    let list = |json: &std::path::Path| {
        let (endpoint, manifest, json) = (proxy.url(), manifest.clone(), json.to_path_buf());
        async move {
            tokio::task::spawn_blocking(move || {
                Command::new(BIN)
                    .args([
                        "list-s3",
                        "--manifest",
                        text(&manifest),
                        "--endpoint",
                        &endpoint,
                        "--parallel",
                        "4",
                        "--timeout",
                        "60",
                        "--json-out",
                        text(&json),
                    ])
                    .env("AWS_ACCESS_KEY_ID", "test")
                    .env("AWS_SECRET_ACCESS_KEY", "test")
                    .env_remove("AWS_ENDPOINT_URL")
                    .output()
                    .expect("list-s3")
            })
            .await
            .expect("join")
        }
    };
    let read = |json: &std::path::Path| -> ListPass {
        serde_json::from_str(std::fs::read_to_string(json).expect("json").trim())
            .expect("a ListPass")
    };

    proxy.reset_stats();
    let ok = list(&json).await;
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let p = read(&json);
    assert_eq!((p.objects, p.expected_objects, p.ignored), (1100, 1100, 1));
    assert_eq!(p.bytes, Some(m.header.bytes));
    assert!(!p.wrong && p.clean(), "{p:?}");
    // The root (the marker, flat/, tree/), flat/ (1 page of 100), tree/
    // (1: p0000/), tree/p0000/ (1,000 keys in pages of 300: 4).
    assert_eq!(p.list_requests, Some(1 + 1 + 1 + 4));
    assert_eq!(
        proxy.stats().requests.list,
        7,
        "every LIST is one at the proxy"
    );

    // One key gone from the store: the count is wrong, and that fails.
    upstream.remove(&format!("bench/{}", m.entries[500].key));
    let bad = list(&json).await;
    assert_eq!(bad.status.code(), Some(1), "a wrong count must fail");
    assert!(String::from_utf8_lossy(&bad.stderr)
        .contains("WRONG COUNT: 1099 objects, the manifest has 1100"));
    assert!(read(&json).wrong);
}
