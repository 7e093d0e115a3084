//! The persistent NVMe cache against the real RGW, with GETs counted at the store side by
//! a proxy in front of it (not by riffle).

#![cfg(feature = "rgw-tests")]

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use riffle_bench::proxy::{BlockingProxy, Latency, ProxyConfig};

fn gets(proxy: &BlockingProxy) -> u64 {
    let s = proxy.stats();
    s.requests.get_object + s.requests.get_range
}

fn dataset(endpoint: &str, tag: &str) -> (String, Vec<(String, Vec<u8>)>) {
    let bucket = unique_bucket(tag);
    let mut objects: Vec<(String, Vec<u8>)> = (0..40)
        .map(|i| {
            (
                format!("imgs/c{}/f{i:03}.jpg", i % 4),
                pattern(20_000 + i * 3_001, i as u64),
            )
        })
        .collect();
    objects.push(("shards/big.bin".into(), pattern(24 << 20, 99)));
    bucket_with(endpoint, &bucket, &objects);
    (bucket, objects)
}

fn read_all(mount: &Mount, objects: &[(String, Vec<u8>)]) {
    for (key, want) in objects {
        let got = std::fs::read(mount.join(key)).unwrap_or_else(|e| panic!("{key}: {e}"));
        assert!(got == *want, "{key}: wrong bytes");
    }
}

fn complete_objects(s: &serde_json::Value) -> u64 {
    s["cache"]["complete_objects"].as_u64().unwrap_or(0)
}

/// The `fuse` counter `name` of a `riffle stats` document (0 when absent).
fn fuse_count(s: &serde_json::Value, name: &str) -> u64 {
    s["fuse"][name].as_u64().unwrap_or(0)
}

/// `--max-idle-backings` bounds the backing files kept after close; the opens past it still
/// get passthrough, registering the cache file again.
#[test]
fn idle_backings_stay_within_max_idle_backings() {
    let endpoint = need_rgw!();
    let (bucket, objects) = dataset(&endpoint, "idle-backings");
    let cache_dir = tempfile::tempdir().unwrap();
    let opts = [
        "--cache-dir",
        cache_dir.path().to_str().unwrap(),
        "--cache-min-free",
        "0",
        "--metadata-ttl",
        "indefinite",
        "--max-idle-backings",
        "5",
    ];
    let mount = Mount::new(&endpoint, &format!("s3://{bucket}"), &opts);
    read_all(&mount, &objects);
    let n = objects.len() as u64;
    wait_for_stats(&mount, "every object cached", |s| complete_objects(s) == n);
    wait_for_stats(&mount, "five backing files kept", |s| {
        fuse_count(s, "idle_backings") == 5
    });
    let before = stats(&mount);
    drop_page_cache();
    read_all(&mount, &objects);
    let s = stats(&mount);
    assert_eq!(fuse_count(&s, "idle_backings"), 5, "{s}");
    let passthrough = |s: &serde_json::Value| fuse_count(s, "passthrough_opens");
    assert_eq!(passthrough(&s) - passthrough(&before), n, "{s}");
}

/// `--max-idle-backings auto`, the default, keeps as many backing files as a sixteenth of
/// the daemon's memory cgroup limit holds at 4 KiB each: a daemon started in a cgroup (v1's
/// memory controller, as on this machine kind) limited to 1 GiB keeps at most 16,384, says so
/// in its log, and still keeps every file of a small dataset.
#[test]
fn auto_idle_backings_follow_the_memory_cgroup_limit() {
    let endpoint = need_rgw!();
    let own = std::fs::read_to_string("/proc/self/cgroup").expect("/proc/self/cgroup");
    let path = own
        .lines()
        .find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_string()))
        .expect("this test needs cgroup v1's memory controller (/proc/self/cgroup names none)");
    let cgroup_dir = tempfile::tempdir().unwrap();
    let name = cgroup_dir.path().file_name().unwrap().to_str().unwrap();
    let cgroup = std::path::Path::new("/sys/fs/cgroup/memory")
        .join(path.trim_start_matches('/'))
        .join(format!("riffle-test-{name}"));
    std::fs::create_dir(&cgroup).expect("a memory cgroup");
    std::fs::write(
        cgroup.join("memory.limit_in_bytes"),
        (1u64 << 30).to_string(),
    )
    .expect("set its limit");
    // `riffle mount` run from inside the cgroup: the daemon it starts stays in it.
    let wrapper = cgroup_dir.path().join("riffle-in-cgroup");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\necho $$ > {}/cgroup.procs || exit 1\nexec {RIFFLE} \"$@\"\n",
            cgroup.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();

    let (bucket, objects) = dataset(&endpoint, "auto-backings");
    let cache_dir = tempfile::tempdir().unwrap();
    let opts = [
        "--cache-dir",
        cache_dir.path().to_str().unwrap(),
        "--metadata-ttl",
        "indefinite",
        "--max-memory",
        "64M",
    ];
    let mount = Mount::new_with_program(&endpoint, &wrapper, &format!("s3://{bucket}"), &opts);
    let in_cgroup = std::fs::read_to_string(format!("/proc/{}/cgroup", mount.pid())).unwrap();
    assert!(
        in_cgroup.contains(&format!(":memory:{path}/riffle-test-{name}")),
        "{in_cgroup}"
    );
    let s = stats(&mount);
    assert_eq!(fuse_count(&s, "max_idle_backings"), 16_384, "{s}");
    let log = mount.log_text();
    assert!(
        log.contains("--max-idle-backings auto")
            && log.contains("1024 MiB, the limit of memory cgroup"),
        "{log}"
    );
    read_all(&mount, &objects);
    let n = objects.len() as u64;
    wait_for_stats(&mount, "a backing file kept for every object", |s| {
        fuse_count(s, "idle_backings") == n
    });
    drop(mount);
    // The daemon has exited once the mount is gone; an empty cgroup left behind is harmless.
    let _ = std::fs::remove_dir(&cgroup);
}

#[test]
fn cached_data_costs_no_gets_across_epochs_and_a_sigkill() {
    let endpoint = need_rgw!();
    let (bucket, objects) = dataset(&endpoint, "cache");
    let proxy =
        BlockingProxy::start(ProxyConfig::new(endpoint.clone()).with_latency(Latency::NONE))
            .expect("proxy");
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = cache_dir.path().to_str().unwrap();
    let opts = [
        "--cache-dir",
        cache,
        "--cache-min-free",
        "0",
        "--metadata-ttl",
        "indefinite",
        "--max-memory",
        "32M",
    ];
    let mount = Mount::new(&proxy.url(), &format!("s3://{bucket}"), &opts);

    // Epoch 1 fetches everything once.
    read_all(&mount, &objects);
    assert!(gets(&proxy) > 0);
    let n = objects.len() as u64;
    wait_for_stats(&mount, "every object cached", |s| complete_objects(s) == n);

    // Each object got a passthrough backing file, kept for reopening (opened ahead as it
    // completed, or kept from a passthrough open) ...
    let fast_before = |s: &serde_json::Value| fuse_count(s, "fast_opens");
    wait_for_stats(&mount, "a backing file kept for every object", |s| {
        fuse_count(s, "idle_backings") == n
    });
    let s_before = stats(&mount);
    let before = fast_before(&s_before);

    // Epoch 2, page cache dropped: not one GET reaches the store, and every open is answered
    // from memory with the backing file kept for it (the kernel reads the cache file).
    drop_page_cache();
    proxy.reset_stats();
    read_all(&mount, &objects);
    assert_eq!(gets(&proxy), 0, "second epoch");
    let s = stats(&mount);
    assert_eq!(fast_before(&s) - before, n, "fast opens in epoch 2: {s}");

    // Each lookup in epoch 2 (the dentries went with the page cache) of a small cached file
    // started a readahead of its cache file (counted before the lookup's reply); the 24 MiB
    // shard, above `--lookup-readahead`'s default 1 MiB, did not.
    let readaheads = |s: &serde_json::Value| fuse_count(s, "lookup_readaheads");
    assert_eq!(readaheads(&s) - readaheads(&s_before), n - 1, "{s}");
    drop_page_cache();
    std::fs::metadata(mount.join(&objects[n as usize - 1].0)).unwrap();
    assert_eq!(readaheads(&stats(&mount)), readaheads(&s), "the shard");
    std::fs::metadata(mount.join(&objects[1].0)).unwrap();
    let s = stats(&mount);
    assert_eq!(readaheads(&s) - readaheads(&s_before), n, "{s}");
    assert_eq!(s["fuse"]["lookup_readaheads_failed"], 0, "{s}");

    // SIGKILL the daemon, clean the dead mount, mount again on the same cache: still none.
    unsafe { libc::kill(mount.pid(), libc::SIGKILL) };
    for _ in 0..500 {
        if std::fs::metadata(format!("/proc/{}", mount.pid())).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let m = mount.path.to_str().unwrap().to_string();
    let out = run_with_timeout(
        Command::new(RIFFLE).args(["unmount", &m]),
        Duration::from_secs(30),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run_with_timeout(
        Command::new(RIFFLE)
            .args([
                "mount",
                &format!("s3://{bucket}"),
                &m,
                "--endpoint-url",
                &proxy.url(),
                "--force-path-style",
            ])
            .args(opts)
            .arg("--pid-file")
            .arg(&mount.pid_file),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop_page_cache();
    proxy.reset_stats();
    read_all(&mount, &objects);
    assert_eq!(gets(&proxy), 0, "after SIGKILL and remount");

    // The first opens after the restart verified the cached files in the background; then
    // opens are handed to the kernel (passthrough), with the right bytes.
    let s = stats(&mount);
    assert_eq!(s["fuse"]["passthrough"], "enabled", "{s}");
    let (key, want) = &objects[0];
    let mut passthrough = false;
    for _ in 0..200 {
        drop_page_cache();
        assert!(std::fs::read(mount.join(key)).unwrap() == *want);
        if stats(&mount)["fuse"]["passthrough_opens"]
            .as_u64()
            .unwrap_or(0)
            > 0
        {
            passthrough = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(passthrough, "passthrough never engaged: {}", stats(&mount));
    read_all(&mount, &objects);
    let big = objects.last().unwrap();
    let f = std::fs::File::open(mount.join(&big.0)).unwrap();
    let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
    assert!(map[..] == big.1[..], "mmap through passthrough");
    assert_eq!(gets(&proxy), 0);
}

/// A dataset cached by a mount that has gone, then one byte flipped in every cache file, the
/// page cache dropped and the proxy's counts reset: the store behind `proxy`, and the cache.
struct Corrupted {
    proxy: BlockingProxy,
    bucket: String,
    objects: Vec<(String, Vec<u8>)>,
    cache: String,
    _cache_dir: tempfile::TempDir,
}

impl Corrupted {
    fn new(endpoint: &str, tag: &str) -> Corrupted {
        let (bucket, objects) = dataset(endpoint, tag);
        let proxy = BlockingProxy::start(
            ProxyConfig::new(endpoint.to_string()).with_latency(Latency::NONE),
        )
        .expect("proxy");
        let cache_dir = tempfile::tempdir().unwrap();
        let cache = cache_dir.path().to_str().unwrap().to_string();
        let n = objects.len() as u64;
        {
            let opts = ["--cache-dir", cache.as_str()];
            let mount = Mount::new(&proxy.url(), &format!("s3://{bucket}"), &opts);
            read_all(&mount, &objects);
            wait_for_stats(&mount, "every object cached", |s| complete_objects(s) == n);
        }
        assert_eq!(flip_every_data_file(cache_dir.path()), objects.len());
        drop_page_cache();
        proxy.reset_stats();
        Corrupted {
            proxy,
            bucket,
            objects,
            cache,
            _cache_dir: cache_dir,
        }
    }
}

/// Flips one byte in the middle of every data file of the cache in `dir`; how many.
fn flip_every_data_file(dir: &std::path::Path) -> usize {
    let mut flipped = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "data") {
                let mut raw = std::fs::read(&path).unwrap();
                let mid = raw.len() / 2;
                raw[mid] ^= 0x5a;
                std::fs::write(&path, raw).unwrap();
                flipped += 1;
            }
        }
    }
    flipped
}

/// With passthrough, after a restart: a small file's cache file is checked when it is opened
/// and a corrupted one is never handed to the kernel (which checks no CRC); every read gets
/// the object's bytes, fetched again, and once the cache has healed the files open for
/// passthrough again.
#[test]
fn corrupted_cache_files_are_never_handed_to_passthrough() {
    let endpoint = need_rgw!();
    let Corrupted {
        proxy,
        bucket,
        objects,
        cache,
        _cache_dir,
    } = Corrupted::new(&endpoint, "crc-pt");
    let opts = ["--cache-dir", &cache, "--metadata-ttl", "indefinite"];
    let n = objects.len() as u64;
    let mount = Mount::new(&proxy.url(), &format!("s3://{bucket}"), &opts);
    wait_for_stats(&mount, "the start-up scan found every entry", |s| {
        complete_objects(s) == n
    });
    read_all(&mount, &objects);
    let s = stats(&mount);
    assert_eq!(s["fuse"]["passthrough"], "enabled", "{s}");
    assert_eq!(fuse_count(&s, "passthrough_opens"), 0, "{s}");
    assert!(s["cache"]["crc_failures"].as_u64().unwrap() >= n, "{s}");
    assert!(gets(&proxy) >= n, "bad blocks are fetched again");
    wait_for_stats(&mount, "cache healed", |s| complete_objects(s) == n);
    drop_page_cache();
    read_all(&mount, &objects);
    let s = stats(&mount);
    assert_eq!(fuse_count(&s, "passthrough_opens"), n, "{s}");
}

#[test]
fn corrupted_cache_bytes_are_never_served() {
    let endpoint = need_rgw!();
    let Corrupted {
        proxy,
        bucket,
        objects,
        cache,
        _cache_dir,
    } = Corrupted::new(&endpoint, "crc");
    let n = objects.len() as u64;
    let mount = Mount::new(
        &proxy.url(),
        &format!("s3://{bucket}"),
        &["--cache-dir", &cache, "--no-passthrough"],
    );
    read_all(&mount, &objects);
    let s = stats(&mount);
    assert!(s["cache"]["crc_failures"].as_u64().unwrap() >= n, "{s}");
    assert!(gets(&proxy) >= n, "bad blocks are fetched again");
    assert_eq!(s["fuse"]["passthrough_opens"], 0);
    assert_eq!(s["fuse"]["passthrough"], "off (--no-passthrough)");
    // The cache heals: the refetched blocks were written back.
    wait_for_stats(&mount, "cache healed", |s| complete_objects(s) == n);
    let out = run_with_timeout(
        Command::new(RIFFLE).args(["cache", "stats", "--json", "--cache-dir", &cache]),
        Duration::from_secs(20),
    );
    let dir: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(dir["in_use_by_a_mount"], true);
    let out = run_with_timeout(
        Command::new(RIFFLE).args(["cache", "clear", "--cache-dir", &cache]),
        Duration::from_secs(20),
    );
    assert!(!out.status.success(), "clear must refuse while mounted");
    drop(mount);
    let out = run_with_timeout(
        Command::new(RIFFLE).args(["cache", "clear", "--cache-dir", &cache]),
        Duration::from_secs(20),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn two_mounts_share_one_cache_directory() {
    let endpoint = need_rgw!();
    let (bucket, objects) = dataset(&endpoint, "shared");
    let proxy =
        BlockingProxy::start(ProxyConfig::new(endpoint.clone()).with_latency(Latency::NONE))
            .expect("proxy");
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = cache_dir.path().to_str().unwrap();
    let opts = [
        "--cache-dir",
        cache,
        "--cache-size",
        "45%",
        "--no-passthrough",
    ];
    let a = Mount::new(&proxy.url(), &format!("s3://{bucket}"), &opts);
    let b = Mount::new(&proxy.url(), &format!("s3://{bucket}"), &opts);
    // Both read everything at the same time: correct bytes on both.
    std::thread::scope(|s| {
        s.spawn(|| read_all(&a, &objects));
        s.spawn(|| read_all(&b, &objects));
    });
    let n = objects.len() as u64;
    // Which mount writes which object is a race (the other finds it on disk, or skips a block
    // already written), so neither's own counters say when the directory holds everything:
    // `riffle unmount` waits for each daemon to exit, and a daemon flushes its cache writes
    // before it exits.
    drop(a);
    drop(b);
    // A third mount finds it all on disk.
    let c = Mount::new(&proxy.url(), &format!("s3://{bucket}"), &opts);
    proxy.reset_stats();
    read_all(&c, &objects);
    assert_eq!(gets(&proxy), 0, "everything was cached by the first two");
    let s = stats(&c);
    assert!(s["blocks"]["disk_hits"].as_u64().unwrap() >= n, "{s}");
}

/// The daemon fits into the open-file limit it is given. 256 GETs in flight and 16,384 open
/// cache entries need about 50,000 descriptors; the usual soft limit is 1,024, and below what
/// it needed the cache used to fail with EMFILE ("Too many open files") and `riffle stats`
/// could not connect. With soft = hard = 256 (no raising possible), it shrinks its open cache entries
/// and GET slots, says so, and still caches every file with no error.
#[test]
fn a_small_open_file_limit_shrinks_what_is_kept_open_instead_of_failing() {
    let endpoint = need_rgw!();
    let bucket = unique_bucket("fdlimit");
    let objects: Vec<(String, Vec<u8>)> = (0..600)
        .map(|i| {
            (
                format!("d{}/f{i:04}", i % 6),
                pattern(3_000 + i * 7, i as u64),
            )
        })
        .collect();
    runtime().block_on(async {
        let s3 = client(&endpoint);
        create_bucket(&s3, &bucket).await;
        put_many(&s3, &bucket, objects.clone(), 16).await;
    });
    let cache_dir = tempfile::tempdir().unwrap();
    let opts = [
        "--cache-dir",
        cache_dir.path().to_str().unwrap(),
        "--metadata-ttl",
        "indefinite",
    ];
    let mount =
        Mount::new_with_open_file_limit(&endpoint, &format!("s3://{bucket}/"), &opts, Some(256));
    // Many readers at once, so many entries and GETs are open together.
    std::thread::scope(|s| {
        for part in objects.chunks(objects.len() / 16) {
            let mount = &mount;
            s.spawn(move || read_all(mount, part));
        }
    });
    let n = objects.len() as u64;
    wait_for_stats(&mount, "every object cached", |s| complete_objects(s) == n);
    let s = stats(&mount);
    assert_eq!(s["cache"]["io_errors"], 0, "{s}");
    assert_eq!(s["store"]["errors"], 0, "{s}");
    assert!(
        mount
            .log_text()
            .contains("the open-file limit leaves room for fewer GETs in flight"),
        "{}",
        mount.log_text()
    );
}

/// With the filesystem's free space at the floor the cache keeps (`--cache-min-free`), reads
/// still return the object's bytes from the store, nothing is written to the cache, the
/// refusals are counted, and the log says why once (not once per block).
#[test]
fn a_cache_filesystem_at_its_free_space_floor_serves_reads_and_says_why() {
    let endpoint = need_rgw!();
    let (bucket, objects) = dataset(&endpoint, "cache-floor");
    let cache_dir = tempfile::tempdir().unwrap();
    let opts = [
        "--cache-dir",
        cache_dir.path().to_str().unwrap(),
        // More than any test machine has free.
        "--cache-min-free",
        "99.9%",
        "--metadata-ttl",
        "indefinite",
    ];
    let mount = Mount::new(&endpoint, &format!("s3://{bucket}"), &opts);
    read_all(&mount, &objects);
    read_all(&mount, &objects);
    let s = stats(&mount);
    assert_eq!(s["cache"]["write_bytes"], 0, "{s}");
    assert_eq!(complete_objects(&s), 0, "{s}");
    assert!(
        s["cache"]["free_floor_refusals"].as_u64().unwrap_or(0) > 0,
        "{s}"
    );
    assert!(s["cache"]["min_free"].as_u64().unwrap_or(0) > 0, "{s}");
    assert_eq!(s["cache"]["io_errors"], 0, "{s}");
    let log = mount.log_text();
    let lines = log
        .lines()
        .filter(|l| l.contains("--cache-min-free"))
        .count();
    assert!((1..=2).contains(&lines), "{log}");
}
