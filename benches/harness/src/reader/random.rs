//! Random-read passes (W3): worker threads issue random 4 KiB–1 MiB reads
//! (4 KiB steps, any byte offset) of the dataset's largest file until the
//! duration is up, through `pread` or through a shared read-only `mmap`, and
//! compare every read with the regenerated content.

use std::fs::File;
use std::os::unix::fs::FileExt;

use anyhow::Context;
use memmap2::Mmap;

use super::{Pattern, ReadFsOptions};
use crate::content::Content;
use crate::manifest::{Entry, Manifest};
use crate::outcome::{Outcome, Tally};
use crate::rng::{mix64, SplitMix64};
use crate::s3::copy::local_path;

const MIN_READ: u64 = 4 << 10;
const MAX_READ: u64 = 1 << 20;
/// Keeps mmap offsets apart from pread offsets.
const MMAP_SALT: u64 = 0x6d6d_6170;

pub fn run(manifest: &Manifest, opts: &ReadFsOptions) -> anyhow::Result<Outcome> {
    let entry = manifest
        .entries
        .iter()
        .max_by_key(|e| e.size)
        .context("empty manifest")?;
    anyhow::ensure!(entry.size > 0, "the largest file is empty");
    let path = local_path(&opts.root, &entry.key)?;
    let file = File::open(&path).with_context(|| format!("open {}", path.display()))?;
    let map = match opts.pattern {
        // SAFETY: the mapping is read-only and only read through slices; the
        // file is a benchmark input nobody truncates while it is read.
        Pattern::W3Mmap => {
            Some(unsafe { Mmap::map(&file) }.with_context(|| format!("mmap {}", path.display()))?)
        }
        _ => None,
    };
    if let Some(m) = &map {
        anyhow::ensure!(
            m.len() as u64 == entry.size,
            "{}: {} bytes mapped, expected {}",
            path.display(),
            m.len(),
            entry.size
        );
    }
    let content = Content::new(manifest.header.seed, &entry.key);
    let salt = if map.is_some() { MMAP_SALT } else { 0 };
    let tally = Tally::start_watching(0, opts.daemon_pid);
    let path_text = path.display().to_string();
    let (tally_ref, map_ref, file_ref) = (&tally, map.as_deref(), &file);
    std::thread::scope(|s| {
        for t in 0..opts.threads.max(1) {
            let worker = Worker {
                entry,
                content,
                file: file_ref,
                map: map_ref,
                tally: tally_ref,
                path: &path_text,
            };
            let mut rng = SplitMix64::new(mix64(opts.seed ^ salt ^ mix64(t as u64 + 1)));
            s.spawn(move || {
                let mut buf = vec![0u8; MAX_READ as usize];
                while tally_ref.elapsed() < opts.duration {
                    let (off, len) = next_read(&mut rng, entry.size);
                    worker.read(off, len, &mut buf);
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

/// A random read: 4 KiB–1 MiB in 4 KiB steps, anywhere in the file.
fn next_read(rng: &mut SplitMix64, size: u64) -> (u64, u64) {
    let len = (rng.range_inclusive(1, MAX_READ / MIN_READ) * MIN_READ).min(size);
    let off = rng.below(size - len + 1);
    (off, len)
}

struct Worker<'a> {
    entry: &'a Entry,
    content: Content,
    file: &'a File,
    map: Option<&'a [u8]>,
    tally: &'a Tally,
    path: &'a str,
}

impl Worker<'_> {
    fn read(&self, off: u64, len: u64, buf: &mut [u8]) {
        let data: &[u8] = match self.map {
            Some(m) => &m[off as usize..(off + len) as usize],
            None => {
                let buf = &mut buf[..len as usize];
                match pread_full(self.file, buf, off) {
                    Ok(n) if n == buf.len() => buf,
                    Ok(n) => {
                        return self.tally.mismatch(format!(
                            "{}: pread {len} bytes at {off} returned {n} (file is {} bytes)",
                            self.path, self.entry.size
                        ))
                    }
                    Err(err) => {
                        return self
                            .tally
                            .error(format!("{}: pread {len} at {off}: {err}", self.path))
                    }
                }
            }
        };
        match self.content.first_mismatch(off, data) {
            None => self.tally.add_read(len),
            Some(i) => self.tally.mismatch(format!(
                "{}: read {len} bytes at {off}: first wrong byte at {}",
                self.path,
                off + i as u64
            )),
        }
    }
}

/// `pread` until `buf` is full or end of file.
fn pread_full(file: &File, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], off + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_stay_inside_the_file_and_in_bounds() {
        let mut rng = SplitMix64::new(1);
        for size in [1u64, 4096, 5000, 1 << 20, 3 << 20] {
            for _ in 0..500 {
                let (off, len) = next_read(&mut rng, size);
                assert!((1..=MAX_READ).contains(&len) && off + len <= size);
                assert!(len == size || len % MIN_READ == 0);
            }
        }
    }
}
