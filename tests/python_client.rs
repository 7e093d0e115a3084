//! Python is the real client: what its `open()` sends on every file (an `ioctl(TCGETS)`, asking
//! `isatty()`) is answered at once and quietly, and the daemon's log does not grow per file.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

#[cfg(feature = "rgw-tests")]
const FILES: usize = 500;

#[cfg(feature = "rgw-tests")]
/// Reads every file under ROOT from 8 threads (each `with open(p, "rb") as f: f.read()`, as a
/// data loader's workers do), checks each size against the LISTING file (PATH<TAB>SIZE lines),
/// then calls `fcntl.ioctl(fd, TCGETS)` on one file and prints the errno's name.
const READER: &str = r#"
import errno, fcntl, os, sys, termios, concurrent.futures as cf
root, listing = sys.argv[1], sys.argv[2]
want = dict(line.rsplit("\t", 1) for line in open(listing).read().splitlines())
def read(rel):
    with open(os.path.join(root, rel), "rb") as f:
        return rel, len(f.read())
with cf.ThreadPoolExecutor(8) as ex:
    for rel, n in ex.map(read, sorted(want)):
        assert int(want[rel]) == n, (rel, n, want[rel])
with open(os.path.join(root, sorted(want)[0]), "rb") as f:
    try:
        fcntl.ioctl(f.fileno(), termios.TCGETS, bytes(64))
        print("no error")
    except OSError as e:
        print(errno.errorcode[e.errno])
"#;

#[cfg(feature = "rgw-tests")]
fn python_epoch(mount: &Mount, listing: &std::path::Path) -> String {
    let out = run_with_timeout(
        Command::new("python3").args([
            "-c",
            READER,
            mount.join("").to_str().unwrap(),
            listing.to_str().unwrap(),
        ]),
        Duration::from_secs(300),
    );
    assert!(
        out.status.success(),
        "python reader failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[cfg(feature = "rgw-tests")]
#[test]
fn python_opens_cost_no_log_line_and_ioctl_answers_enotty() {
    let endpoint = need_rgw!();
    let bucket = unique_bucket("pyclient");
    let objects: Vec<(String, Vec<u8>)> = (0..FILES)
        .map(|i| {
            (
                format!("train/c{}/s{i:04}.bin", i % 5),
                pattern(1_000 + i * 37, i as u64),
            )
        })
        .collect();
    runtime().block_on(async {
        let s3 = client(&endpoint);
        create_bucket(&s3, &bucket).await;
        put_many(&s3, &bucket, objects.clone(), 32).await;
    });
    let listing = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        listing.path(),
        objects
            .iter()
            .map(|(k, v)| format!("{k}\t{}\n", v.len()))
            .collect::<String>(),
    )
    .unwrap();
    let cache = tempfile::tempdir().unwrap();
    // Passthrough on (files complete in the cache) and off: both paths get the same ioctl.
    for extra in [&[][..], &["--no-passthrough"][..]] {
        let mut opts = vec!["--cache-dir", cache.path().to_str().unwrap()];
        opts.extend_from_slice(extra);
        let mount = Mount::new(&endpoint, &format!("s3://{bucket}"), &opts);
        let before = mount.log_text().lines().count();
        // A cold epoch (files fetched) and a warm one (from the cache).
        assert_eq!(python_epoch(&mount, listing.path()), "ENOTTY", "{extra:?}");
        assert_eq!(python_epoch(&mount, listing.path()), "ENOTTY", "{extra:?}");
        let log = mount.log_text();
        let added = log.lines().count() - before;
        assert!(
            added < 5,
            "{added} log lines for {} opens ({extra:?}):\n{log}",
            2 * FILES
        );
        assert!(!log.contains("Not Implemented"), "{log}");
    }
}

#[test]
fn log_options_are_checked() {
    let out = run_with_timeout(
        Command::new(RIFFLE).args([
            "mount",
            "s3://bucket",
            "/nonexistent-mnt",
            "--log-max-size",
            "1K",
        ]),
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--log-max-size") && err.contains("too small"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}
