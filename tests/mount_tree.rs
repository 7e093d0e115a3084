//! A real FUSE mount of a real RGW bucket: the tree, the bytes, concurrency, mmap, O_DIRECT,
//! read-only semantics, prefixes and xattrs.

#![cfg(feature = "rgw-tests")]

mod common;

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::OnceLock;

use common::*;
use sha2::{Digest, Sha256};

const BIG_KEY: &str = "big/300m.bin";
const BIG_SIZE: usize = 300 << 20;
const BIG_SEED: u64 = 0xB16;

struct Dataset {
    bucket: String,
    /// Small objects: key and content.
    small: Vec<(String, Vec<u8>)>,
    /// Keys that must not appear (odd names).
    odd: Vec<String>,
}

fn seed_of(key: &str) -> u64 {
    key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn small_objects() -> (Vec<(String, Vec<u8>)>, Vec<String>) {
    let mut keys: Vec<(String, usize)> = Vec::new();
    for i in 0..1200 {
        keys.push((format!("many/f{i:04}.bin"), (i * 7) % 8192));
    }
    for d in 0..20 {
        for f in 0..90 {
            keys.push((
                format!("spread/d{d:02}/f{f:03}.dat"),
                1 + (d * 131 + f * 17) % 4096,
            ));
        }
    }
    let mut deep = String::from("deep");
    for level in 1..=10 {
        deep.push_str(&format!("/l{level}"));
        keys.push((format!("{deep}/file{level}.txt"), level * 100));
    }
    for name in [
        "names/ünïcödé ñame.txt",
        "names/with space.txt",
        "names/日本語/ファイル.bin",
        "names/emoji 🚀.dat",
        "names/semi;colon&amp.txt",
        "names/%41percent.txt",
    ] {
        keys.push((name.to_string(), 1234));
    }
    keys.push(("empty/zero.bin".into(), 0));
    keys.push(("emptydir/".into(), 0));
    keys.push(("markers/withmarker/".into(), 0));
    keys.push(("markers/withmarker/x.txt".into(), 10));
    keys.push(("shadow".into(), 5));
    keys.push(("shadow/inside.txt".into(), 6));
    keys.push(("top.txt".into(), 42));
    let odd = vec![
        "odd//double".to_string(),
        "odd/./dot".to_string(),
        "odd/../up".to_string(),
        format!("odd/{}", "n".repeat(256)),
    ];
    for k in &odd {
        keys.push((k.clone(), 3));
    }
    keys.push(("odd/fine.txt".into(), 4));
    let objects = keys
        .into_iter()
        .map(|(k, len)| {
            let data = pattern(len, seed_of(&k));
            (k, data)
        })
        .collect();
    (objects, odd)
}

fn dataset(endpoint: &str) -> &'static Dataset {
    static DATA: OnceLock<Dataset> = OnceLock::new();
    DATA.get_or_init(|| {
        let bucket = unique_bucket("tree");
        let (small, odd) = small_objects();
        let rt = runtime();
        rt.block_on(async {
            let s3 = client(endpoint);
            create_bucket(&s3, &bucket).await;
            put_many(&s3, &bucket, small.clone(), 32).await;
            put(&s3, &bucket, BIG_KEY, pattern(BIG_SIZE, BIG_SEED)).await;
        });
        Dataset { bucket, small, odd }
    })
}

/// The tree a mount must show for the dataset (directories end in '/').
fn expected_tree(data: &Dataset) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut keys: Vec<&str> = data.small.iter().map(|(k, _)| k.as_str()).collect();
    keys.push(BIG_KEY);
    for key in keys {
        if data.odd.iter().any(|o| o == key) {
            continue;
        }
        let parts: Vec<&str> = key.split('/').collect();
        for i in 1..parts.len() {
            out.insert(format!("{}/", parts[..i].join("/")));
        }
        if !key.ends_with('/') {
            out.insert(key.to_string());
        }
    }
    // "shadow" is both an object and a prefix: the directory wins.
    out.remove("shadow");
    out
}

#[test]
fn mounted_tree_equals_the_bucket_listing() {
    let endpoint = need_rgw!();
    let data = dataset(&endpoint);
    let listed = runtime().block_on(list_all(&client(&endpoint), &data.bucket));
    assert!(listed.len() >= 3000, "{} objects", listed.len());
    let mount = Mount::new(&endpoint, &format!("s3://{}", data.bucket), &[]);
    let shown: BTreeSet<String> = walk(&mount.path).into_iter().collect();
    let expected = expected_tree(data);
    let missing: Vec<_> = expected.difference(&shown).collect();
    let extra: Vec<_> = shown.difference(&expected).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing {missing:?}, extra {extra:?}"
    );
    assert_eq!(std::fs::read_dir(mount.join("many")).unwrap().count(), 1200);
    // Sizes and times come from the listing.
    for (key, size) in listed.iter().filter(|(k, _)| k.starts_with("spread/d03/")) {
        assert_eq!(
            std::fs::metadata(mount.join(key)).unwrap().len(),
            *size as u64
        );
    }
    // Odd keys were skipped with one warning each.
    let log = mount.log_text();
    assert!(log.contains("skipping object"), "{log}");
}

/// A walk that only wants names (`d_type`) gets no attributes from directory reads, so the
/// kernel makes no inodes for its files; a walk that stats every file is recognised after one
/// directory and gets them (module `fs::dirplus`). Sizes are right either way.
#[test]
fn a_names_walk_gets_names_only_and_a_stat_walk_gets_attributes() {
    let endpoint = need_rgw!();
    let data = dataset(&endpoint);
    let mount = Mount::new(&endpoint, &format!("s3://{}", data.bucket), &[]);
    let shown = walk(&mount.path);
    assert_eq!(shown, expected_tree(data).into_iter().collect::<Vec<_>>());
    let after_walk = stats(&mount);
    let fuse = &after_walk["fuse"];
    assert_eq!(fuse["dir_reads_with_attrs"], 0, "{fuse}");
    assert!(
        fuse["dir_reads_names_only"].as_u64().unwrap() >= 20,
        "{fuse}"
    );
    assert_eq!(fuse["dir_reads_mode"], "names", "{fuse}");

    drop_page_cache();
    let sizes: std::collections::HashMap<&str, usize> = data
        .small
        .iter()
        .map(|(k, v)| (k.as_str(), v.len()))
        .collect();
    for d in 0..20 {
        let dir = format!("spread/d{d:02}");
        for entry in std::fs::read_dir(mount.join(&dir)).unwrap() {
            let entry = entry.unwrap();
            let key = format!("{dir}/{}", entry.file_name().to_string_lossy());
            assert_eq!(
                entry.metadata().unwrap().len(),
                sizes[key.as_str()] as u64,
                "{key}"
            );
        }
    }
    let after_stat = stats(&mount);
    let fuse = &after_stat["fuse"];
    assert!(
        fuse["dir_reads_with_attrs"].as_u64().unwrap() >= 18,
        "{fuse}"
    );
    assert_eq!(fuse["dir_reads_mode"], "attributes", "{fuse}");
}

#[test]
fn every_small_file_has_the_objects_bytes() {
    let endpoint = need_rgw!();
    let data = dataset(&endpoint);
    let mount = Mount::new(&endpoint, &format!("s3://{}", data.bucket), &[]);
    let files: Vec<&(String, Vec<u8>)> = data
        .small
        .iter()
        .filter(|(k, _)| !k.ends_with('/') && !data.odd.contains(k) && !k.starts_with("shadow"))
        .collect();
    // 16 threads read all of them concurrently, each file whole.
    std::thread::scope(|s| {
        for chunk in files.chunks(files.len().div_ceil(16)) {
            let mount = &mount;
            s.spawn(move || {
                for (key, want) in chunk {
                    let got =
                        std::fs::read(mount.join(key)).unwrap_or_else(|e| panic!("{key}: {e}"));
                    assert_eq!(Sha256::digest(&got), Sha256::digest(want), "{key}");
                }
            });
        }
    });
    assert_eq!(
        std::fs::read(mount.join("shadow/inside.txt"))
            .unwrap()
            .len(),
        6
    );
    assert!(std::fs::read(mount.join("empty/zero.bin"))
        .unwrap()
        .is_empty());
}

#[test]
fn the_300_mib_object_reads_correctly_every_way() {
    let endpoint = need_rgw!();
    let data = dataset(&endpoint);
    let mount = Mount::new(&endpoint, &format!("s3://{}", data.bucket), &[]);
    let want = pattern(BIG_SIZE, BIG_SEED);
    let path = mount.join(BIG_KEY);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), BIG_SIZE as u64);

    // Sequential read of the whole file.
    let mut got = Vec::with_capacity(BIG_SIZE);
    File::open(&path).unwrap().read_to_end(&mut got).unwrap();
    assert_eq!(got.len(), BIG_SIZE);
    assert_eq!(Sha256::digest(&got), Sha256::digest(&want));
    drop(got);

    // Random-offset preads on a fresh handle, including across block edges and past the end.
    let f = File::open(&path).unwrap();
    let mut rng = 0x1234_5678u64;
    for _ in 0..300 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let off = (rng % (BIG_SIZE as u64 + 4096)) as usize;
        let len = 1 + (rng >> 40) as usize % (3 << 20);
        let mut buf = vec![0u8; len];
        let n = f.read_at(&mut buf, off as u64).unwrap();
        let end = (off + len).min(BIG_SIZE);
        let expect = if off >= BIG_SIZE {
            &[][..]
        } else {
            &want[off..end]
        };
        assert_eq!(&buf[..n], expect, "pread at {off} len {len}");
    }

    // 16 concurrent readers on separate handles, each its own region, with seeks.
    std::thread::scope(|s| {
        for t in 0..16usize {
            let (path, want) = (&path, &want);
            s.spawn(move || {
                let mut f = File::open(path).unwrap();
                let region = BIG_SIZE / 16;
                let start = t * region + (t * 4099) % 65536;
                f.seek(SeekFrom::Start(start as u64)).unwrap();
                let mut buf = vec![0u8; 4 << 20];
                f.read_exact(&mut buf).unwrap();
                assert_eq!(&buf[..], &want[start..start + buf.len()], "reader {t}");
            });
        }
    });

    // mmap.
    let f = File::open(&path).unwrap();
    let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
    assert_eq!(map.len(), BIG_SIZE);
    for off in [0usize, 4096, 1 << 20, 123_456_789, BIG_SIZE - 4096] {
        assert_eq!(
            &map[off..off + 4096],
            &want[off..off + 4096],
            "mmap at {off}"
        );
    }

    // O_DIRECT reads into an aligned buffer.
    check_o_direct_reads(&path, &want, &[0, 7 << 20, (BIG_SIZE as u64) - (1 << 20)]);
}

#[test]
fn writes_are_refused_with_erofs() {
    let endpoint = need_rgw!();
    let data = dataset(&endpoint);
    let mount = Mount::new(&endpoint, &format!("s3://{}", data.bucket), &[]);
    let erofs = |r: std::io::Result<()>, what: &str| {
        let e = r.expect_err(what);
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{what}: {e}");
    };
    let top = mount.join("top.txt");
    erofs(std::fs::write(mount.join("new.txt"), b"x"), "create");
    erofs(
        std::fs::OpenOptions::new().write(true).open(&top).map(drop),
        "open for writing",
    );
    erofs(
        std::fs::OpenOptions::new()
            .append(true)
            .open(&top)
            .map(drop),
        "append",
    );
    erofs(std::fs::create_dir(mount.join("newdir")), "mkdir");
    erofs(std::fs::remove_file(&top), "unlink");
    erofs(std::fs::remove_dir(mount.join("emptydir")), "rmdir");
    erofs(std::fs::rename(&top, mount.join("moved.txt")), "rename");
    erofs(
        std::os::unix::fs::symlink("top.txt", mount.join("link")),
        "symlink",
    );
    erofs(std::fs::hard_link(&top, mount.join("hard")), "link");
    use std::os::unix::fs::PermissionsExt;
    erofs(
        std::fs::set_permissions(&top, std::fs::Permissions::from_mode(0o600)),
        "chmod",
    );
    let c = std::ffi::CString::new(top.to_string_lossy().as_bytes()).unwrap();
    assert_eq!(unsafe { libc::truncate(c.as_ptr(), 0) }, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EROFS)
    );
    let name = c"user.test";
    assert_eq!(
        unsafe { libc::setxattr(c.as_ptr(), name.as_ptr(), b"v".as_ptr().cast(), 1, 0) },
        -1
    );
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EROFS)
    );
    // Nothing changed.
    assert_eq!(std::fs::read(&top).unwrap().len(), 42);
}

#[test]
fn a_prefix_mount_shows_only_the_prefix() {
    let endpoint = need_rgw!();
    let data = dataset(&endpoint);
    let mount = Mount::new(&endpoint, &format!("s3://{}/deep/l1/l2", data.bucket), &[]);
    let shown = walk(&mount.path);
    assert_eq!(shown.first().map(String::as_str), Some("file2.txt"));
    assert!(
        shown.contains(&"l3/l4/l5/l6/l7/l8/l9/l10/file10.txt".to_string()),
        "{shown:?}"
    );
    assert_eq!(shown.len(), 9 + 8, "{shown:?}");
    let want = pattern(
        1000,
        seed_of("deep/l1/l2/l3/l4/l5/l6/l7/l8/l9/l10/file10.txt"),
    );
    assert_eq!(
        std::fs::read(mount.join("l3/l4/l5/l6/l7/l8/l9/l10/file10.txt")).unwrap(),
        want
    );
}

#[test]
fn attributes_xattrs_and_stable_inodes() {
    let endpoint = need_rgw!();
    let data = dataset(&endpoint);
    let mount = Mount::new(
        &endpoint,
        &format!("s3://{}", data.bucket),
        &[
            "--metadata-ttl",
            "0",
            "--file-mode",
            "0440",
            "--uid",
            "1234",
            "--gid",
            "4321",
        ],
    );
    let path = mount.join("top.txt");
    let a = std::fs::metadata(&path).unwrap();
    let b = std::fs::metadata(&path).unwrap();
    assert_eq!(a.ino(), b.ino());
    assert_eq!((a.mode() & 0o7777, a.uid(), a.gid()), (0o440, 1234, 4321));
    let dir = std::fs::metadata(mount.join("names")).unwrap();
    assert!(dir.is_dir());
    let head = runtime().block_on(async {
        client(&endpoint)
            .head_object()
            .bucket(&data.bucket)
            .key("top.txt")
            .send()
            .await
            .unwrap()
    });
    let etag = head.e_tag().unwrap().trim_matches('"').to_string();
    let c = std::ffi::CString::new(path.to_string_lossy().as_bytes()).unwrap();
    let mut buf = vec![0u8; 256];
    let n = unsafe {
        libc::getxattr(
            c.as_ptr(),
            c"user.riffle.etag".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    assert!(n > 0, "{}", std::io::Error::last_os_error());
    assert_eq!(std::str::from_utf8(&buf[..n as usize]).unwrap(), etag);
    let n = unsafe { libc::listxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!(&buf[..n as usize], b"user.riffle.etag\0");
    let modified = head.last_modified().unwrap().secs();
    assert_eq!(a.mtime(), modified);
    // statfs works.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let root = std::ffi::CString::new(mount.path.to_string_lossy().as_bytes()).unwrap();
    assert_eq!(unsafe { libc::statvfs(root.as_ptr(), &mut st) }, 0);
    assert_eq!(st.f_namemax, 255);
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the metrics endpoint");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn stats_report_requests_through_the_control_socket_and_prometheus() {
    let endpoint = need_rgw!();
    let data = dataset(&endpoint);
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let mount = Mount::new(
        &endpoint,
        &format!("s3://{}", data.bucket),
        &["--metrics-addr", &metrics_addr],
    );
    assert_eq!(std::fs::read(mount.join("top.txt")).unwrap().len(), 42);
    let out = run_with_timeout(
        std::process::Command::new(RIFFLE)
            .args(["stats", "--json"])
            .arg(&mount.path),
        std::time::Duration::from_secs(20),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        stats["store"]["get_requests"].as_u64().unwrap() >= 1,
        "{stats}"
    );
    assert_eq!(stats["source"], format!("s3://{}/", data.bucket));
    let text = run_with_timeout(
        std::process::Command::new(RIFFLE)
            .arg("stats")
            .arg(&mount.path),
        std::time::Duration::from_secs(20),
    );
    assert!(String::from_utf8_lossy(&text.stdout).contains("store.get_requests"));
    let dir = tempfile::tempdir().unwrap();
    let none = run_with_timeout(
        std::process::Command::new(RIFFLE)
            .arg("stats")
            .arg(dir.path()),
        std::time::Duration::from_secs(20),
    );
    assert_eq!(none.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&none.stderr).contains("no riffle mount answers"));
    // The same counters, and FUSE latency histograms, in Prometheus form.
    let page = http_get(&metrics_addr, "/metrics");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("application/openmetrics-text"), "{page}");
    assert!(page.contains("riffle_store_get_requests_total"), "{page}");
    assert!(
        page.contains("riffle_fuse_op_duration_seconds_count{op=\"read\"}"),
        "{page}"
    );
    assert!(
        page.contains("riffle_fuse_op_duration_seconds_bucket{le="),
        "{page}"
    );
    assert!(!page.contains(&std::env::var("AWS_SECRET_ACCESS_KEY").unwrap()));
}
