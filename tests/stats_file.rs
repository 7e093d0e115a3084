//! `.riffle-stats` on a real mount of a real RGW bucket: the JSON `riffle stats --json` prints,
//! readable by `cat` and Python, `stat`-able, never listed, shadowed by a real object of that
//! name, with and without passthrough, and never a cache entry or a GET.

#![cfg(feature = "rgw-tests")]

mod common;

use std::collections::BTreeSet;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::Value;

const NAME: &str = ".riffle-stats";

/// A small training set: 3 classes of 4 files and one file at the root.
fn dataset(
    endpoint: &str,
    tag: &str,
    extra: &[(&str, Vec<u8>)],
) -> (String, Vec<(String, Vec<u8>)>) {
    let bucket = unique_bucket(tag);
    let mut objects: Vec<(String, Vec<u8>)> = (0..12)
        .map(|i| {
            (
                format!("train/c{}/img{i:02}.jpg", i % 3),
                pattern(1000 + i * 4099, 300 + i as u64),
            )
        })
        .collect();
    objects.push(("labels.txt".into(), b"cat\ndog\nbird\n".to_vec()));
    for (key, body) in extra {
        objects.push((key.to_string(), body.clone()));
    }
    runtime().block_on(async {
        let s3 = client(endpoint);
        create_bucket(&s3, &bucket).await;
        put_many(&s3, &bucket, objects.clone(), 8).await;
    });
    (bucket, objects)
}

/// The object keys of a JSON tree, recursively, as dotted paths: its shape.
fn shape(prefix: &str, value: &Value, out: &mut BTreeSet<String>) {
    if let Value::Object(map) = value {
        for (k, v) in map {
            let path = format!("{prefix}{k}");
            out.insert(path.clone());
            shape(&format!("{path}."), v, out);
        }
    }
}

fn shape_of(value: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    shape("", value, &mut out);
    out
}

fn read_stats_file(mount: &Mount) -> Value {
    let bytes = std::fs::read(mount.join(NAME)).expect("read .riffle-stats");
    serde_json::from_slice(&bytes).expect(".riffle-stats is JSON")
}

/// Everything a reader of the hidden file may rely on; `files` are every object's key and size.
fn check_hidden_file(mount: &Mount, files: &[(String, Vec<u8>)]) {
    // Walk and read everything, as a training epoch does.
    for (key, want) in files {
        assert_eq!(
            &std::fs::read(mount.join(key)).expect("read"),
            want,
            "{key}"
        );
    }
    let listed: Vec<String> = walk(&mount.path);
    assert!(
        !listed.iter().any(|p| p.contains(NAME)),
        "readdir must not show {NAME}: {listed:?}"
    );

    // The same JSON, in shape, as `riffle stats --json`.
    let from_file = read_stats_file(mount);
    let from_socket = stats(mount);
    assert_eq!(shape_of(&from_file), shape_of(&from_socket));
    assert_eq!(from_file["pid"], from_socket["pid"]);
    assert_eq!(from_file["source"], from_socket["source"]);

    // The volume section: every file and directory was listed by the walk.
    let total: u64 = files.iter().map(|(_, b)| b.len() as u64).sum();
    let dirs: BTreeSet<&str> = files
        .iter()
        .flat_map(|(k, _)| {
            k.match_indices('/')
                .map(move |(i, _)| &k[..i])
                .collect::<Vec<_>>()
        })
        .collect();
    let volume = &from_file["volume"];
    assert_eq!(volume["listed_bytes"].as_u64(), Some(total), "{volume}");
    assert_eq!(volume["listed_files"].as_u64(), Some(files.len() as u64));
    assert_eq!(volume["listed_dirs"].as_u64(), Some(dirs.len() as u64));
    assert_eq!(
        volume["listed_entries"].as_u64(),
        Some((files.len() + dirs.len()) as u64)
    );

    // stat, and fstat of an open handle, agree with what a read returns.
    let meta = std::fs::metadata(mount.join(NAME)).expect("stat");
    assert!(meta.is_file());
    assert!(meta.len() > 0);
    let mut f = std::fs::File::open(mount.join(NAME)).expect("open");
    let mut text = Vec::new();
    f.read_to_end(&mut text).expect("read");
    assert_eq!(f.metadata().expect("fstat").len(), text.len() as u64);
    assert_eq!(f.metadata().expect("fstat").ino(), meta.ino());
    serde_json::from_slice::<Value>(&text).expect("JSON");

    // cat and Python see the whole document, and Python's walk does not see the file.
    let cat = Command::new("cat")
        .arg(mount.join(NAME))
        .output()
        .expect("cat");
    assert!(cat.status.success());
    serde_json::from_slice::<Value>(&cat.stdout).expect("cat gives the whole JSON");
    let script = r#"
import json, os, sys
root = sys.argv[1]
doc = json.load(open(os.path.join(root, ".riffle-stats")))
names = os.listdir(root)
walked = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]
print(json.dumps({"volume": doc["volume"], "listdir": names,
                  "hidden": any(".riffle-stats" in p for p in walked), "files": len(walked)}))
"#;
    let py = Command::new("python3")
        .args(["-c", script])
        .arg(&mount.path)
        .output()
        .expect("python3");
    assert!(
        py.status.success(),
        "{}",
        String::from_utf8_lossy(&py.stderr)
    );
    let py: Value = serde_json::from_slice(&py.stdout).expect("python output");
    assert_eq!(py["hidden"], false);
    assert_eq!(py["files"].as_u64(), Some(files.len() as u64));
    assert!(!py["listdir"].to_string().contains(NAME), "{py}");
    assert_eq!(py["volume"]["listed_bytes"].as_u64(), Some(total));

    // Only at the root.
    let below = std::fs::metadata(mount.join("train").join(NAME));
    assert_eq!(
        below.map_err(|e| e.kind()).err(),
        Some(std::io::ErrorKind::NotFound)
    );
}

/// Reading the file many times asks the store for nothing and adds no cache entry.
fn check_no_store_no_cache(mount: &Mount) {
    let before = stats(mount);
    for _ in 0..5 {
        read_stats_file(mount);
    }
    let after = stats(mount);
    for path in [
        ("store", "get_requests"),
        ("fuse", "opens"),
        ("cache", "objects"),
        ("cache", "writes"),
    ] {
        assert_eq!(
            before[path.0][path.1], after[path.0][path.1],
            "{}.{} changed by reading {NAME}",
            path.0, path.1
        );
    }
}

#[test]
fn hidden_stats_file_with_passthrough() {
    let endpoint = need_rgw!();
    let (bucket, objects) = dataset(&endpoint, "statsfile", &[]);
    let cache = tempfile::tempdir().expect("tempdir");
    let cache_dir = cache.path().to_string_lossy().into_owned();
    let mount = Mount::new(
        &endpoint,
        &format!("s3://{bucket}"),
        &["--cache-dir", &cache_dir, "--epoch-prefetch", "off"],
    );
    check_hidden_file(&mount, &objects);
    // Everything was read: the cache holds all of it, as the volume section reports (the
    // cache writes finish after the reads; bounded wait).
    let total: u64 = objects.iter().map(|(_, b)| b.len() as u64).sum();
    let mut cached = 0;
    for _ in 0..400 {
        cached = read_stats_file(&mount)["volume"]["cached_bytes"]
            .as_u64()
            .unwrap_or(0);
        if cached == total {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(cached, total, "cached_bytes after reading every file");
    check_no_store_no_cache(&mount);
}

#[test]
fn hidden_stats_file_without_passthrough() {
    let endpoint = need_rgw!();
    let (bucket, objects) = dataset(&endpoint, "statsnopt", &[]);
    let cache = tempfile::tempdir().expect("tempdir");
    let cache_dir = cache.path().to_string_lossy().into_owned();
    let mount = Mount::new(
        &endpoint,
        &format!("s3://{bucket}"),
        &["--cache-dir", &cache_dir, "--no-passthrough"],
    );
    check_hidden_file(&mount, &objects);
    let s = read_stats_file(&mount);
    assert_eq!(s["fuse"]["passthrough"], "off (--no-passthrough)");
    check_no_store_no_cache(&mount);
    // Without a cache directory there are no cached bytes, and the file still works.
    let bare = Mount::new(&endpoint, &format!("s3://{bucket}"), &["--no-passthrough"]);
    check_hidden_file(&bare, &objects);
    assert_eq!(read_stats_file(&bare)["volume"]["cached_bytes"], 0);
}

#[test]
fn a_real_object_of_that_name_wins() {
    let endpoint = need_rgw!();
    let real = b"not statistics: the dataset's own file\n".to_vec();
    let (bucket, _objects) = dataset(&endpoint, "statsshadow", &[(NAME, real.clone())]);
    let mount = Mount::new(&endpoint, &format!("s3://{bucket}"), &[]);
    assert_eq!(std::fs::read(mount.join(NAME)).expect("read"), real);
    assert_eq!(
        std::fs::metadata(mount.join(NAME)).expect("stat").len(),
        real.len() as u64
    );
    let names: Vec<String> = std::fs::read_dir(&mount.path)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().any(|n| n == NAME),
        "the real object is listed: {names:?}"
    );
    // It is an object like any other: counted in the volume.
    let s = stats(&mount);
    assert_eq!(
        s["volume"]["listed_files"].as_u64().map(|n| n >= 2),
        Some(true)
    );
}
