//! Tenants sharing one cache directory (as pods on one node do): cached bytes are served only
//! to a credential the store lets read them (`cache::proofs`), against the real RGW with
//! three users and a bucket policy, requests counted by a proxy in front of it.
//!
//! - owner: the RGW's test user, which owns the bucket and fills the cache;
//! - list-only: may `s3:ListBucket` on the bucket and nothing else;
//! - reader: may list and `s3:GetObject`.

#![cfg(feature = "rgw-tests")]

mod common;

use std::io::ErrorKind;
use std::process::Command;

use common::*;
use riffle_bench::proxy::{BlockingProxy, Latency, ProxyConfig};

const LIST_ONLY: (&str, &str, &str) = (
    "riffle-test-list-only",
    "RIFFLETESTLISTONLY01",
    "list-only-secret-0000000000000000000000",
);
const READER: (&str, &str, &str) = (
    "riffle-test-reader",
    "RIFFLETESTREADER0001",
    "reader-secret-00000000000000000000000000",
);

fn gets(proxy: &BlockingProxy) -> u64 {
    let s = proxy.stats();
    s.requests.get_object + s.requests.get_range
}

/// Creates (or renews the keys of) an RGW user.
fn rgw_user((uid, access, secret): (&str, &str, &str)) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/local/rgw.sh");
    let out = Command::new("bash")
        .args([script, "user", uid, access, secret])
        .output()
        .expect("rgw.sh user");
    assert!(
        out.status.success(),
        "rgw.sh user {uid}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn as_user((_, access, secret): (&str, &str, &str)) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ACCESS_KEY_ID", access.to_string()),
        ("AWS_SECRET_ACCESS_KEY", secret.to_string()),
        ("AWS_PROFILE", String::new()),
    ]
}

fn mount_as(
    proxy: &BlockingProxy,
    bucket: &str,
    cache: &str,
    user: Option<(&str, &str, &str)>,
) -> Mount {
    let opts = ["--cache-dir", cache, "--metadata-ttl", "indefinite"];
    let env = user.map(as_user).unwrap_or_default();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Mount::new_with_env(&proxy.url(), &format!("s3://{bucket}"), &opts, &env)
}

fn dataset(endpoint: &str) -> (String, Vec<(String, Vec<u8>)>) {
    let bucket = unique_bucket("tenancy");
    let mut objects: Vec<(String, Vec<u8>)> = (0..12)
        .map(|i| {
            (
                format!("train/f{i:02}.jpg"),
                pattern(10_000 + i * 4_001, i as u64),
            )
        })
        .collect();
    objects.push(("shards/big.bin".into(), pattern(3 << 20, 77)));
    let policy = serde_json::json!({
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"AWS": [
                    format!("arn:aws:iam:::user/{}", LIST_ONLY.0),
                    format!("arn:aws:iam:::user/{}", READER.0),
                ]},
                "Action": ["s3:ListBucket"],
                "Resource": [format!("arn:aws:s3:::{bucket}")],
            },
            {
                "Effect": "Allow",
                "Principal": {"AWS": [format!("arn:aws:iam:::user/{}", READER.0)]},
                "Action": ["s3:GetObject"],
                "Resource": [format!("arn:aws:s3:::{bucket}/*")],
            },
        ],
    });
    runtime().block_on(async {
        let s3 = client(endpoint);
        create_bucket(&s3, &bucket).await;
        put_many(&s3, &bucket, objects.clone(), 8).await;
        s3.put_bucket_policy()
            .bucket(&bucket)
            .policy(policy.to_string())
            .send()
            .await
            .expect("put bucket policy");
    });
    (bucket, objects)
}

/// What the store itself says to `user`'s GET of `key`: the policy works as the test assumes.
fn store_allows_get(endpoint: &str, user: (&str, &str, &str), bucket: &str, key: &str) -> bool {
    let s3 = client_as(endpoint, user.1, user.2);
    runtime().block_on(async { s3.get_object().bucket(bucket).key(key).send().await.is_ok() })
}

/// Reads every object; returns how many were refused with EACCES (panics on anything else,
/// and on wrong bytes).
fn read_all(mount: &Mount, objects: &[(String, Vec<u8>)]) -> usize {
    let mut refused = 0;
    for (key, want) in objects {
        match std::fs::read(mount.join(key)) {
            Ok(got) => assert!(got == *want, "{key}: wrong bytes"),
            Err(e) if e.kind() == ErrorKind::PermissionDenied => refused += 1,
            Err(e) => panic!("{key}: {e}\nlog:\n{}", mount.log_text()),
        }
    }
    refused
}

#[test]
fn cached_bytes_are_served_only_to_credentials_the_store_lets_read_them() {
    let endpoint = need_rgw!();
    rgw_user(LIST_ONLY);
    rgw_user(READER);
    let (bucket, objects) = dataset(&endpoint);
    let n = objects.len() as u64;
    let probe = &objects[0].0;
    // RGW applies the policy (users may take a moment to be seen by every RGW thread).
    assert!(!store_allows_get(&endpoint, LIST_ONLY, &bucket, probe));
    assert!(store_allows_get(&endpoint, READER, &bucket, probe));

    let proxy =
        BlockingProxy::start(ProxyConfig::new(endpoint.clone()).with_latency(Latency::NONE))
            .expect("proxy");
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = cache_dir.path().to_str().unwrap();

    // The owner fills the cache: no proof request (every entry is its own).
    let owner = mount_as(&proxy, &bucket, cache, None);
    assert_eq!(read_all(&owner, &objects), 0);
    wait_for_stats(&owner, "the owner's cache to fill", |s| {
        s["cache"]["complete_objects"].as_u64() == Some(n)
    });
    assert_eq!(stats(&owner)["store"]["proof_requests"], 0);

    // The list-only credential, beside the owner's mount: refused, one proof request each.
    proxy.reset_stats();
    let list_only = mount_as(&proxy, &bucket, cache, Some(LIST_ONLY));
    let listed = walk(&list_only.path);
    assert!(
        objects.iter().all(|(key, _)| listed.contains(key)),
        "it may list: {listed:?}"
    );
    assert_eq!(
        read_all(&list_only, &objects),
        objects.len(),
        "reads refused"
    );
    assert_eq!(gets(&proxy), n, "one proof request per object");
    let s = stats(&list_only);
    assert_eq!(s["store"]["proof_requests"], n);
    assert_eq!(s["blocks"]["disk_hits"], 0, "no cached byte served");
    assert_eq!(s["fuse"]["passthrough_opens"], 0);
    // Remembered: a second pass asks nothing.
    proxy.reset_stats();
    assert_eq!(read_all(&list_only, &objects), objects.len());
    assert_eq!(gets(&proxy), 0);
    drop(list_only);

    // After the owner's mount is gone, and after a remount: still refused, still no request.
    drop(owner);
    proxy.reset_stats();
    let list_only = mount_as(&proxy, &bucket, cache, Some(LIST_ONLY));
    assert_eq!(read_all(&list_only, &objects), objects.len());
    assert_eq!(gets(&proxy), 0, "refusals kept on disk");
    drop(list_only);

    // A credential that may GET: one proof request per object, then the cache serves it.
    proxy.reset_stats();
    let reader = mount_as(&proxy, &bucket, cache, Some(READER));
    assert_eq!(read_all(&reader, &objects), 0);
    assert_eq!(gets(&proxy), n, "one proof request per object, no data GET");
    proxy.reset_stats();
    drop_page_cache();
    assert_eq!(read_all(&reader, &objects), 0);
    assert_eq!(gets(&proxy), 0, "second pass");
    drop(reader);
    let reader = mount_as(&proxy, &bucket, cache, Some(READER));
    drop_page_cache();
    assert_eq!(read_all(&reader, &objects), 0);
    assert_eq!(gets(&proxy), 0, "after a remount");
    assert_eq!(stats(&reader)["store"]["proof_requests"], 0);

    // The proofs on disk name no credential.
    for entry in std::fs::read_dir(cache_dir.path().join("proofs")).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        for (_, access, _) in [LIST_ONLY, READER] {
            assert!(!bytes.windows(access.len()).any(|w| w == access.as_bytes()));
        }
    }
}

#[test]
fn a_single_tenant_pays_no_proof_cold_or_warm() {
    let endpoint = need_rgw!();
    let (bucket, objects) = dataset(&endpoint);
    let proxy =
        BlockingProxy::start(ProxyConfig::new(endpoint.clone()).with_latency(Latency::NONE))
            .expect("proxy");
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = cache_dir.path().to_str().unwrap();
    let mount = mount_as(&proxy, &bucket, cache, None);
    assert_eq!(read_all(&mount, &objects), 0);
    let cold = gets(&proxy);
    // One GET per small file; the 3 MiB shard in one or a few parts.
    assert!(
        cold <= objects.len() as u64 + 3,
        "cold epoch: {cold} GETs for {} files",
        objects.len()
    );
    assert_eq!(stats(&mount)["store"]["proof_requests"], 0);
    wait_for_stats(&mount, "the cache to fill", |s| {
        s["cache"]["complete_objects"].as_u64() == Some(objects.len() as u64)
    });
    drop(mount);
    proxy.reset_stats();
    let mount = mount_as(&proxy, &bucket, cache, None);
    drop_page_cache();
    assert_eq!(read_all(&mount, &objects), 0);
    assert_eq!(gets(&proxy), 0, "warm epoch after a remount");
    assert_eq!(stats(&mount)["store"]["proof_requests"], 0);
}
