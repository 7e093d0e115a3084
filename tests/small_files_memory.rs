//! The memory bound under many small files (issue 46): a mount with a small `--max-memory`
//! and an NVMe cache reads 20,000 files of 1–4 KiB cold, then warm, and the daemon's peak
//! RSS (`VmHWM`) must stay within the bound docs/memory.md states, `--max-memory` + 64 MiB + 500
//! bytes per listed entry (104 MiB here). Before issue 46 every small file read held several
//! KB (a 2.5 KB block in 8 KiB of aligned heap while the memory cache counted 2.5 KB, and
//! per-file state outside any budget): the same test with that build's daemon fails, at
//! 127 MiB against the bound of 104 (this build: 83 MiB).
//!
//! Not timing-based: it counts bytes, never seconds. 20,000 files (four times what the memory
//! cache holds) cost about 2 minutes of CPU in a debug build; the objects are deleted at the
//! end (the local RGW keeps them in RAM, about 25 KiB each).

#![cfg(feature = "rgw-tests")]

mod common;

use common::*;

const FILES: usize = 20_000;
const DIRS: usize = 20;
const MAX_MEMORY: u64 = 32 << 20;
/// The fixed part and the per-listed-entry part of the bound (docs/memory.md, "The bound").
const OVERHEAD: u64 = 64 << 20;
const PER_ENTRY: u64 = 450;

fn key(i: usize) -> String {
    format!("d{:03}/f{i:07}", i % DIRS)
}

fn size_of(i: usize) -> usize {
    1024 + (i * 7_919) % 3_072
}

/// Reads every file from 8 threads (each its own share, in a scattered order) and checks its
/// bytes.
fn read_all(mount: &Mount) {
    std::thread::scope(|s| {
        for t in 0..8 {
            s.spawn(move || {
                for k in (t..FILES).step_by(8) {
                    let i = (k * 7_907) % FILES;
                    let got = std::fs::read(mount.join(&key(i)))
                        .unwrap_or_else(|e| panic!("{}: {e}", key(i)));
                    assert!(
                        got == pattern(size_of(i), i as u64),
                        "{}: wrong bytes",
                        key(i)
                    );
                }
            });
        }
    });
}

#[test]
fn many_small_files_stay_within_the_memory_bound() {
    let endpoint = need_rgw!();
    let bucket = unique_bucket("mem-small");
    let rt = runtime();
    let s3 = client(&endpoint);
    rt.block_on(async {
        create_bucket(&s3, &bucket).await;
        let objects = (0..FILES)
            .map(|i| (key(i), pattern(size_of(i), i as u64)))
            .collect();
        put_many(&s3, &bucket, objects, 128).await;
    });
    let cache = tempfile::tempdir().expect("tempdir");
    let max_memory = format!("{}M", MAX_MEMORY >> 20);
    let mount = Mount::new(
        &endpoint,
        &format!("s3://{bucket}"),
        &[
            "--cache-dir",
            cache.path().to_str().expect("path"),
            "--metadata-ttl",
            "indefinite",
            "--max-memory",
            &max_memory,
        ],
    );
    read_all(&mount);
    let cold = peak_rss(mount.pid());
    drop_page_cache();
    read_all(&mount);
    let peak = peak_rss(mount.pid());
    let s = stats(&mount);
    let listed = s["volume"]["listed_entries"]
        .as_u64()
        .expect("listed entries");
    let opens = s["fuse"]["opens"].as_u64().expect("opens");
    assert!(listed >= FILES as u64, "{listed} entries listed");
    assert_eq!(opens, 2 * FILES as u64, "every file opened in both epochs");
    let bound = MAX_MEMORY + OVERHEAD + listed * PER_ENTRY;
    println!(
        "{FILES} small files read cold and warm at --max-memory {max_memory}: peak RSS {} MiB after the cold epoch, {} MiB after the warm one; bound {} MiB ({listed} listed entries)",
        cold >> 20,
        peak >> 20,
        bound >> 20
    );
    assert!(
        peak <= bound,
        "peak RSS {} MiB over the bound of {} MiB",
        peak >> 20,
        bound >> 20
    );
    drop(mount);
    rt.block_on(delete_all(&s3, &bucket, 64));
}
