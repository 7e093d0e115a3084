//! Whole-file passes (W1, W2): worker threads take the next file of the
//! epoch's order (a seeded shuffle, or listing order; see
//! [`crate::order`]), open it, read it to the end in fixed-size reads while
//! checksumming, close it, and compare size and checksum with the manifest.

use std::fs::File;
use std::io::Read;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::ReadFsOptions;
use crate::content::Checksum;
use crate::manifest::{Entry, Manifest};
use crate::order::epoch_files;
use crate::outcome::{Outcome, Tally};
use crate::s3::copy::local_path;

pub fn run(manifest: &Manifest, opts: &ReadFsOptions) -> anyhow::Result<Outcome> {
    let mut order = epoch_files(manifest, opts.seed, opts.epoch, opts.max_files, opts.order);
    if let Some(n) = opts.sample {
        order.truncate(n);
    }
    let threads = opts.threads.clamp(1, order.len().max(1));
    let next = AtomicUsize::new(0);
    let tally = Tally::start_watching(256.min(order.len() as u64), opts.daemon_pid);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let mut buf = vec![0u8; opts.block_size.max(4096)];
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&idx) = order.get(i) else { break };
                    read_one(opts, &manifest.entries[idx], &mut buf, &tally);
                }
            });
        }
    });
    Ok(tally.finish(
        "read-fs",
        opts.pattern.name(),
        &opts.root.display().to_string(),
    ))
}

fn read_one(opts: &ReadFsOptions, e: &Entry, buf: &mut [u8], tally: &Tally) {
    let path = match local_path(&opts.root, &e.key) {
        Ok(p) => p,
        Err(err) => return tally.error(format!("{err:#}")),
    };
    let mut file = match File::open(&path) {
        Ok(f) => f,
        Err(err) => return tally.error(format!("open {}: {err}", path.display())),
    };
    let mut sum = Checksum::new();
    let mut got = 0u64;
    loop {
        match file.read(buf) {
            Ok(0) => break,
            Ok(n) => {
                sum.update(&buf[..n]);
                got += n as u64;
                tally.add_read(n as u64);
            }
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(err) => {
                return tally.error(format!("read {} at {got}: {err}", path.display()));
            }
        }
    }
    drop(file);
    let checksum = sum.finish();
    if got != e.size || checksum != e.checksum {
        tally.mismatch(format!(
            "{}: {got} bytes, checksum {checksum:016x}; expected {} bytes, {:016x}",
            path.display(),
            e.size,
            e.checksum
        ));
    } else {
        tally.file_done();
    }
}
