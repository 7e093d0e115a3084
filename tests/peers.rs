//! Three nodes serving each other's cache (`fetch::peer`), against the real RGW: three
//! `riffle mount`s of one bucket, each with its own cache directory and peer port on
//! 127.0.0.1, one shared secret, all behind one proxy that counts GETs per key. A
//! `DistributedSampler`-style reader (a seeded shuffle per epoch, rank r reads every 3rd
//! index of it) reads three epochs:
//! - epoch 1 fetches each object about once for the whole cluster (not once per node);
//! - epoch 2 makes no store GET at all (every block is in its owner's cache or a local copy);
//! - a SIGKILLed daemon before epoch 3 costs the other two nodes no failed read.
//!
//! No assertion depends on timing: the peer timeout is long (a dead peer refuses connections
//! at once), and the epochs are separated by waiting for each node to have nothing in flight.

#![cfg(feature = "rgw-tests")]

mod common;

use std::process::Command;

use common::*;
use riffle_bench::proxy::{BlockingProxy, Latency, ProxyConfig};

const NODES: usize = 3;

fn dataset(endpoint: &str) -> (String, Vec<(String, Vec<u8>)>) {
    let bucket = unique_bucket("peers");
    let mut objects: Vec<(String, Vec<u8>)> = (0..84)
        .map(|i| {
            (
                format!("train/c{}/f{i:03}.jpg", i % 3),
                pattern(8_000 + (i * 1_777) % 40_000, i as u64),
            )
        })
        .collect();
    // Files of several blocks, whose blocks have different owners.
    for i in 0..3 {
        objects.push((
            format!("train/c{i}/shard{i}.bin"),
            pattern((2 << 20) + 12_345 * i, 1000 + i as u64),
        ));
    }
    runtime().block_on(async {
        let s3 = client(endpoint);
        create_bucket(&s3, &bucket).await;
        put_many(&s3, &bucket, objects.clone(), 8).await;
    });
    (bucket, objects)
}

/// `n` ports that were free a moment ago on 127.0.0.1.
fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("addr").port())
        .collect()
}

/// A permutation of 0..n seeded with `seed` (Fisher-Yates over xorshift64*), as
/// `DistributedSampler` draws one per epoch from `seed + epoch`.
fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        p.swap(i, j);
    }
    p
}

/// Reads one epoch: rank r (for each live mount `mounts[r]`) reads indices r, r+3, ... of
/// the epoch's permutation with two threads, checking every byte. Returns the failed reads.
fn read_epoch(mounts: &[Option<&Mount>], objects: &[(String, Vec<u8>)], epoch: u64) -> Vec<String> {
    let order = permutation(objects.len(), 42 + epoch);
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for (rank, mount) in mounts.iter().enumerate() {
            let Some(mount) = mount else { continue };
            let share: Vec<usize> = order.iter().copied().skip(rank).step_by(NODES).collect();
            for worker in 0..2 {
                let mine: Vec<usize> = share.iter().copied().skip(worker).step_by(2).collect();
                let failures = &failures;
                scope.spawn(move || {
                    for i in mine {
                        let (key, want) = &objects[i];
                        match std::fs::read(mount.join(key)) {
                            Ok(got) if got == *want => {}
                            Ok(_) => failures.lock().unwrap().push(format!("{key}: wrong bytes")),
                            Err(e) => failures.lock().unwrap().push(format!("{key}: {e}")),
                        }
                    }
                });
            }
        }
    });
    failures.into_inner().unwrap()
}

/// Waits until no node has a GET or an epoch-prefetch fetch in flight.
fn settle(mounts: &[Option<&Mount>]) {
    for mount in mounts.iter().flatten() {
        wait_for_stats(mount, "the node to settle", |s| {
            s["inflight"]["requests"] == 0 && s["prefetch"]["epoch"]["fetching"].as_u64() == Some(0)
        });
    }
}

/// GETs per key at the proxy since the last reset, and resets.
fn take_gets(proxy: &BlockingProxy, bucket: &str) -> std::collections::BTreeMap<String, u64> {
    let snap = proxy.reset_stats();
    snap.get_keys
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(k, n)| {
            k.strip_prefix(&format!("{bucket}/"))
                .map(|key| (key.to_string(), n))
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

#[test]
fn three_nodes_fetch_each_file_once_and_survive_a_killed_peer() {
    let endpoint = need_rgw!();
    let (bucket, objects) = dataset(&endpoint);
    let files = objects.len() as u64;
    let proxy = BlockingProxy::start(
        ProxyConfig::new(endpoint.clone())
            .with_latency(Latency::NONE)
            .with_key_counts(),
    )
    .expect("proxy");
    let secret_dir = tempfile::tempdir().unwrap();
    let secret = secret_dir.path().join("peer-secret");
    std::fs::write(&secret, "integration-test-peer-secret-0123456789\n").unwrap();
    let secret = secret.to_str().unwrap().to_string();
    let ports = free_ports(NODES);
    let peers = ports
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    let caches: Vec<tempfile::TempDir> = (0..NODES).map(|_| tempfile::tempdir().unwrap()).collect();
    let mounts: Vec<Mount> = (0..NODES)
        .map(|n| {
            let listen = format!("127.0.0.1:{}", ports[n]);
            Mount::new(
                &proxy.url(),
                &format!("s3://{bucket}"),
                &[
                    "--cache-dir",
                    caches[n].path().to_str().unwrap(),
                    "--metadata-ttl",
                    "indefinite",
                    "--peer-listen",
                    &listen,
                    "--peers",
                    &peers,
                    "--peer-secret-file",
                    &secret,
                    // Long: nothing here waits for a timeout (a dead peer refuses at once).
                    "--peer-timeout",
                    "60s",
                ],
            )
        })
        .collect();
    for m in &mounts {
        assert_eq!(stats(m)["peer"]["members"], 3, "{}", m.log_text());
    }
    let all: Vec<Option<&Mount>> = mounts.iter().map(Some).collect();
    // Listing and the mounts' probes are not GETs of objects.
    take_gets(&proxy, &bucket);

    // Epoch 1: every file is fetched from the store about once for the cluster.
    let failed = read_epoch(&all, &objects, 1);
    assert!(failed.is_empty(), "epoch 1: {failed:?}");
    settle(&all);
    let epoch1 = take_gets(&proxy, &bucket);
    let total1: u64 = epoch1.values().sum();
    let most = epoch1.values().copied().max().unwrap_or(0);
    eprintln!(
        "epoch 1: {total1} store GETs for {files} files ({:.2} per file), at most {most} for one key",
        total1 as f64 / files as f64
    );
    for (key, _) in &objects {
        assert!(
            epoch1.contains_key(key),
            "{key} was never fetched: {epoch1:?}"
        );
    }
    // A file of several blocks may take a GET per owner (one run each).
    assert!(
        total1 <= files + 3 * 3,
        "epoch 1: {total1} GETs for {files} files: {epoch1:?}"
    );
    let served: u64 = mounts
        .iter()
        .map(|m| stats(m)["peer"]["blocks_served"].as_u64().unwrap_or(0))
        .sum();
    assert!(served > 0, "no block went between peers");

    // Epoch 2, another shuffle: every block is in its owner's cache or a local copy.
    drop_page_cache();
    let failed = read_epoch(&all, &objects, 2);
    assert!(failed.is_empty(), "epoch 2: {failed:?}");
    settle(&all);
    let epoch2 = take_gets(&proxy, &bucket);
    eprintln!("epoch 2: {} store GETs", epoch2.values().sum::<u64>());
    assert!(epoch2.is_empty(), "epoch 2 went to the store: {epoch2:?}");
    for m in &mounts {
        let s = stats(m);
        assert_eq!(s["peer"]["errors"], 0, "{s}\n{}", m.log_text());
        assert_eq!(s["peer"]["store_fallbacks"], 0, "{s}\n{}", m.log_text());
    }

    // A node's daemon is killed: the other two read epoch 3 without a failed read.
    let victim = mounts[2].pid();
    assert!(Command::new("kill")
        .args(["-KILL", &victim.to_string()])
        .status()
        .unwrap()
        .success());
    let survivors: Vec<Option<&Mount>> = vec![Some(&mounts[0]), Some(&mounts[1]), None];
    drop_page_cache();
    let failed = read_epoch(&survivors, &objects, 3);
    assert!(failed.is_empty(), "epoch 3 with a dead peer: {failed:?}");
    settle(&survivors);
    let epoch3: u64 = take_gets(&proxy, &bucket).values().sum();
    let read3 = (files as usize * 2).div_ceil(3);
    eprintln!(
        "epoch 3 (one node killed): {epoch3} store GETs for {read3} files read ({:.2} per file)",
        epoch3 as f64 / read3 as f64
    );
    let errors: u64 = survivors
        .iter()
        .flatten()
        .map(|m| stats(m)["peer"]["errors"].as_u64().unwrap_or(0))
        .sum();
    eprintln!("epoch 3: {errors} failed peer requests (the dead node's breaker)");
    // Only what the killed node owned and the others had no copy of goes to the store again.
    assert!(
        epoch3 <= read3 as u64 / 2,
        "epoch 3: {epoch3} GETs for {read3} files"
    );
}
