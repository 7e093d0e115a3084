//! Shared helpers for integration tests: the RGW under test, an S3 client to arrange objects,
//! and real `riffle mount` processes.
//!
//! The tests that need a running S3 server are built with the `rgw-tests` feature:
//! `tests/run.sh` turns it on, starts the local Ceph RGW and exports `RIFFLE_TEST_ENDPOINT`
//! and AWS credentials; without those such a test fails with a message saying so. A plain
//! `cargo test` builds and runs the others.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_s3::config::{Credentials, Region, RequestChecksumCalculation};
use aws_sdk_s3::primitives::ByteStream;
use futures::StreamExt;

pub const RIFFLE: &str = env!("CARGO_BIN_EXE_riffle");

/// The S3 endpoint under test (tests built with the `rgw-tests` feature need one).
pub fn endpoint() -> String {
    match std::env::var("RIFFLE_TEST_ENDPOINT") {
        Ok(e) => e,
        Err(_) => panic!(
            "RIFFLE_TEST_ENDPOINT is not set: run the tests with tests/run.sh (it starts a local \
             Ceph RGW), or eval \"$(deploy/local/rgw.sh env)\" after deploy/local/rgw.sh up"
        ),
    }
}

/// The endpoint of the real S3 server the calling test needs.
#[macro_export]
macro_rules! need_rgw {
    () => {
        common::endpoint()
    };
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

pub fn client(endpoint: &str) -> aws_sdk_s3::Client {
    let access = std::env::var("AWS_ACCESS_KEY_ID").expect("AWS_ACCESS_KEY_ID");
    let secret = std::env::var("AWS_SECRET_ACCESS_KEY").expect("AWS_SECRET_ACCESS_KEY");
    client_as(endpoint, &access, &secret)
}

/// A client of the store signing with these keys.
pub fn client_as(endpoint: &str, access: &str, secret: &str) -> aws_sdk_s3::Client {
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .force_path_style(true)
        .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
        .credentials_provider(Credentials::new(access, secret, None, None, "test"))
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

/// A bucket name unique to this process and call.
pub fn unique_bucket(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{tag}-{}-{n}-{nanos}", std::process::id())
}

pub async fn create_bucket(s3: &aws_sdk_s3::Client, bucket: &str) {
    s3.create_bucket()
        .bucket(bucket)
        .send()
        .await
        .unwrap_or_else(|e| panic!("create bucket {bucket}: {e:?}"));
}

pub async fn put(s3: &aws_sdk_s3::Client, bucket: &str, key: &str, body: Vec<u8>) {
    s3.put_object()
        .bucket(bucket)
        .key(key)
        .body(ByteStream::from(body))
        .send()
        .await
        .unwrap_or_else(|e| panic!("put {key}: {e:?}"));
}

/// Uploads many objects with `parallel` requests in flight.
/// Creates `bucket` and uploads `objects` into it (16 at a time).
pub fn bucket_with(endpoint: &str, bucket: &str, objects: &[(String, Vec<u8>)]) {
    runtime().block_on(async {
        let s3 = client(endpoint);
        create_bucket(&s3, bucket).await;
        put_many(&s3, bucket, objects.to_vec(), 16).await;
    });
}

pub async fn put_many(
    s3: &aws_sdk_s3::Client,
    bucket: &str,
    objects: Vec<(String, Vec<u8>)>,
    parallel: usize,
) {
    futures::stream::iter(objects)
        .map(|(k, v)| async move { put(s3, bucket, &k, v).await })
        .buffer_unordered(parallel)
        .collect::<Vec<()>>()
        .await;
}

/// Every key of the bucket (no delimiter), paginated.
pub async fn list_all(s3: &aws_sdk_s3::Client, bucket: &str) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    let mut pages = s3.list_objects_v2().bucket(bucket).into_paginator().send();
    while let Some(page) = pages.next().await {
        let page = page.expect("list");
        for o in page.contents() {
            out.push((
                o.key().unwrap_or_default().to_string(),
                o.size().unwrap_or(0),
            ));
        }
    }
    out
}

/// Deletes every object of the bucket and the bucket itself, `parallel` requests in flight
/// (the local RGW keeps objects in RAM: a test that uploads many deletes them when done).
pub async fn delete_all(s3: &aws_sdk_s3::Client, bucket: &str, parallel: usize) {
    let keys = list_all(s3, bucket).await;
    futures::stream::iter(keys)
        .map(|(k, _)| async move {
            s3.delete_object()
                .bucket(bucket)
                .key(&k)
                .send()
                .await
                .unwrap_or_else(|e| panic!("delete {k}: {e}"));
        })
        .buffer_unordered(parallel)
        .collect::<Vec<()>>()
        .await;
    s3.delete_bucket()
        .bucket(bucket)
        .send()
        .await
        .unwrap_or_else(|e| panic!("delete bucket {bucket}: {e}"));
}

pub async fn get(s3: &aws_sdk_s3::Client, bucket: &str, key: &str) -> Vec<u8> {
    let out = s3
        .get_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .expect("get");
    out.body
        .collect()
        .await
        .expect("body")
        .into_bytes()
        .to_vec()
}

/// Deterministic bytes: a counter-based pattern that differs at every offset and seed, so
/// misplaced or mixed blocks are detected.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    let mut i: u64 = 0;
    while out.len() < len {
        let mut x = (i ^ seed.rotate_left(17)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^= x >> 29;
        out.extend_from_slice(&x.to_le_bytes());
        i += 1;
    }
    out.truncate(len);
    out
}

/// Runs a command with a time limit; panics if it does not finish (a hang is a failure).
pub fn run_with_timeout(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let start = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("{cmd:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A live riffle mount, unmounted on drop.
pub struct Mount {
    pub path: PathBuf,
    pub log: PathBuf,
    pub pid_file: PathBuf,
    _dir: tempfile::TempDir,
}

impl Mount {
    /// Mounts `source` with the test endpoint plus `extra` options; panics with the reason on failure.
    pub fn new(endpoint: &str, source: &str, extra: &[&str]) -> Mount {
        Self::new_with_open_file_limit(endpoint, source, extra, None)
    }

    /// [`Mount::new`], with the daemon's open-file limit (soft and hard) set to `nofile`.
    pub fn new_with_open_file_limit(
        endpoint: &str,
        source: &str,
        extra: &[&str],
        nofile: Option<u64>,
    ) -> Mount {
        Self::mount_with(Path::new(RIFFLE), endpoint, source, extra, nofile, &[])
    }

    /// [`Mount::new`], with `env` set for the daemon (e.g. another user's credentials).
    pub fn new_with_env(
        endpoint: &str,
        source: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Mount {
        Self::mount_with(Path::new(RIFFLE), endpoint, source, extra, None, env)
    }

    /// [`Mount::new`], run by the `riffle` program at `program` (a copy, to play upgrades).
    pub fn new_with_program(endpoint: &str, program: &Path, source: &str, extra: &[&str]) -> Mount {
        Self::mount_with(program, endpoint, source, extra, None, &[])
    }

    fn mount_with(
        program: &Path,
        endpoint: &str,
        source: &str,
        extra: &[&str],
        nofile: Option<u64>,
        env: &[(&str, &str)],
    ) -> Mount {
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("mnt");
        std::fs::create_dir(&path).expect("mkdir");
        let log = dir.path().join("riffle.log");
        let pid_file = dir.path().join("riffle.pid");
        let mut cmd = Command::new(program);
        cmd.envs(env.iter().copied());
        if let Some(n) = nofile {
            // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    let lim = libc::rlimit {
                        rlim_cur: n,
                        rlim_max: n,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        // The tests' caches hold a few MB: keep none of the 15% of the disk a cache leaves free
        // by default, so a nearly full test machine still caches (tests that are about the
        // floor pass their own --cache-min-free).
        let min_free: &[&str] =
            if extra.contains(&"--cache-dir") && !extra.contains(&"--cache-min-free") {
                &["--cache-min-free", "0"]
            } else {
                &[]
            };
        let out = run_with_timeout(
            cmd.arg("mount")
                .arg(source)
                .arg(&path)
                .args(["--endpoint-url", endpoint, "--force-path-style"])
                .arg("--log-file")
                .arg(&log)
                .arg("--pid-file")
                .arg(&pid_file)
                .args(extra)
                .args(min_free),
            Duration::from_secs(90),
        );
        assert!(
            out.status.success(),
            "riffle mount failed: {}\nlog:\n{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        Mount {
            path,
            log,
            pid_file,
            _dir: dir,
        }
    }

    pub fn pid(&self) -> i32 {
        std::fs::read_to_string(&self.pid_file)
            .expect("pid file")
            .trim()
            .parse()
            .expect("pid")
    }

    pub fn join(&self, rel: &str) -> PathBuf {
        self.path.join(rel)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let ok = Command::new(RIFFLE)
            .arg("unmount")
            .arg(&self.path)
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.path).output();
        }
    }
}

/// Peak resident set size (VmHWM) of a process, in bytes.
pub fn peak_rss(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Every file and directory below `root`, relative, with `/` separators (directories end in `/`).
pub fn walk(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read_dir") {
            let entry = entry.expect("entry");
            let path = entry.path();
            let rel = path
                .strip_prefix(root)
                .expect("prefix")
                .to_string_lossy()
                .into_owned();
            if entry.file_type().expect("type").is_dir() {
                out.push(format!("{rel}/"));
                stack.push(path);
            } else {
                out.push(rel);
            }
        }
    }
    out.sort();
    out
}

/// `riffle stats --json` of a mount.
pub fn stats(mount: &Mount) -> serde_json::Value {
    let out = run_with_timeout(
        Command::new(RIFFLE)
            .args(["stats", "--json"])
            .arg(&mount.path),
        Duration::from_secs(20),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stats JSON")
}

/// Polls `cond` on the mount's stats until it holds (bounded; panics with the stats if not).
pub fn wait_for_stats(mount: &Mount, what: &str, cond: impl Fn(&serde_json::Value) -> bool) {
    let mut last = serde_json::Value::Null;
    for _ in 0..600 {
        last = stats(mount);
        if cond(&last) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out waiting for {what}: {last}");
}

/// Drops the kernel's page cache (root only), so reads reach the filesystem again.
pub fn drop_page_cache() {
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
}

/// Reads 1 MiB at each of `offsets` of `path` with `O_DIRECT` (into an aligned buffer) and
/// checks the bytes against `want`, the whole file.
pub fn check_o_direct_reads(path: &Path, want: &[u8], offsets: &[u64]) {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .unwrap();
    let layout = std::alloc::Layout::from_size_align(1 << 20, 4096).unwrap();
    // SAFETY: a 1 MiB, 4 KiB-aligned allocation, freed below.
    let ptr = unsafe { std::alloc::alloc(layout) };
    let buf = unsafe { std::slice::from_raw_parts_mut(ptr, 1 << 20) };
    for &off in offsets {
        let n = f.read_at(buf, off).unwrap();
        assert!(n > 0, "O_DIRECT at {off}: nothing read");
        assert!(
            buf[..n] == want[off as usize..off as usize + n],
            "O_DIRECT at {off}"
        );
    }
    unsafe { std::alloc::dealloc(ptr, layout) };
}

/// `obj.bin` (= `v1`) alone in a fresh bucket, mounted with a fresh `--cache-dir`, TTL 0
/// (every open revalidates the ETag) and `extra` options; [`OneObject::replace`] changes it
/// behind the mount's back. Fields drop in order: the mount goes before its cache directory.
pub struct OneObject {
    s3: aws_sdk_s3::Client,
    rt: tokio::runtime::Runtime,
    bucket: String,
    pub mount: Mount,
    pub path: PathBuf,
    _cache_dir: tempfile::TempDir,
}

impl OneObject {
    pub fn new(endpoint: &str, tag: &str, v1: &[u8], extra: &[&str]) -> OneObject {
        let bucket = unique_bucket(tag);
        let s3 = client(endpoint);
        let rt = runtime();
        rt.block_on(async {
            create_bucket(&s3, &bucket).await;
            put(&s3, &bucket, "obj.bin", v1.to_vec()).await;
        });
        let cache_dir = tempfile::tempdir().unwrap();
        let mut opts = vec![
            "--metadata-ttl",
            "0",
            "--cache-dir",
            cache_dir.path().to_str().unwrap(),
        ];
        opts.extend_from_slice(extra);
        let mount = Mount::new(endpoint, &format!("s3://{bucket}"), &opts);
        let path = mount.join("obj.bin");
        OneObject {
            s3,
            rt,
            bucket,
            mount,
            path,
            _cache_dir: cache_dir,
        }
    }

    /// Replaces `obj.bin` in the store (a new ETag) behind the mount's back.
    pub fn replace(&self, bytes: &[u8]) {
        self.rt
            .block_on(put(&self.s3, &self.bucket, "obj.bin", bytes.to_vec()));
    }
}
