//! `riffle-bench prefault`: touch fresh memory and free it again right before
//! an epoch, so that every system's epoch starts from the same guest memory.
//!
//! Why: the development VM (Firecracker; `dmesg` says "Free page reporting
//! enabled") hands free guest memory back to the host a couple of seconds
//! after it was freed, and the first touch of such a page later costs a fault
//! in the host. An epoch reads its data into the page cache, so its time
//! depended on what ran before it: local disk's epochs come right after a
//! `drop_caches` that freed as much page cache as they are about to fill, so
//! they get memory the host still backs; riffle's warm W2 epoch comes after a
//! cold epoch that wrote the cache files with `O_DIRECT`, which leaves no page
//! cache to free, so its reads went into memory the host had taken back.
//! Measured on W2's 16 cache files (4.3 GB, 4 readers, `dd`, after
//! `drop_caches`): 4.0–5.5 s and 5.3 s of kernel CPU in `_copy_to_iter` the
//! first time, 2.8–3.2 s and 1.8 s the second; with 6 GiB touched and freed
//! just before, 2.86 s the first time and 2.89 s the second. The kernel
//! reuses the pages freed last first, so the epoch that follows gets the
//! pages touched here.
//!
//! It touches `--bytes` (the epoch's data), at most what `MemAvailable` allows
//! beyond `--keep-free`, in 64 MiB pieces, frees them all, and prints
//! `{"bytes":B,"elapsed_s":S}`.

use std::time::Instant;

use anyhow::Context;

const PIECE: usize = 64 << 20;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Bytes to touch (the epoch's data)
    #[arg(long)]
    bytes: u64,
    /// Leave at least this much of MemAvailable untouched
    #[arg(long, default_value_t = 2 << 30)]
    keep_free: u64,
}

/// `MemAvailable` from /proc/meminfo, bytes.
fn mem_available() -> anyhow::Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").context("read /proc/meminfo")?;
    let kib = text
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .context("no MemAvailable in /proc/meminfo")?;
    Ok(kib * 1024)
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let budget = mem_available()?.saturating_sub(a.keep_free);
    let total = a.bytes.min(budget);
    let started = Instant::now();
    let mut pieces = Vec::new();
    let mut left = total;
    while left > 0 {
        let len = left.min(PIECE as u64) as usize;
        // Non-zero, so the allocator cannot hand out untouched zero pages.
        pieces.push(vec![1u8; len]);
        left -= len as u64;
    }
    // Keep the compiler from eliding the allocations nobody reads.
    std::hint::black_box(&pieces);
    drop(pieces);
    println!(
        "{{\"bytes\":{total},\"elapsed_s\":{:.3}}}",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
