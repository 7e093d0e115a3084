//! `copy`: the copy-first baseline, the init-container practice: download
//! the whole dataset to local disk with N parallel requests (large objects
//! in ranged parts, written in place), then train from local files.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use aws_sdk_s3::Client;
use futures_util::stream::{self, StreamExt};

use super::get::{get_streamed, parts};
use crate::manifest::Manifest;
use crate::order::subset;
use crate::outcome::{Outcome, Tally};

#[derive(Debug, Clone)]
pub struct CopyOptions {
    pub bucket: String,
    pub dest: PathBuf,
    pub parallel: usize,
    /// Objects larger than this are fetched in ranged parts of this size.
    pub part_size: u64,
    /// Copy only the N files a limited reader epoch reads (see
    /// [`crate::order::subset`]), with the reader's seed.
    pub max_files: Option<usize>,
    pub seed: u64,
}

/// The manifest entries to copy: all, or the reader's subset.
fn selection(manifest: &Manifest, opts: &CopyOptions) -> Vec<usize> {
    let mut v = subset(manifest, opts.seed, opts.max_files);
    v.sort_unstable();
    v
}

/// Downloads every object of `manifest` under `opts.dest` (keys become
/// relative paths). Sizes are checked here; bytes are verified when the
/// copy is read.
pub async fn copy_dataset(
    s3: &Client,
    manifest: &Manifest,
    opts: &CopyOptions,
) -> anyhow::Result<Outcome> {
    let tally = Arc::new(Tally::start(0));
    // Create every directory and preallocate every file first; each part
    // opens its file again to write, so a dataset of more files than the
    // descriptor limit allows open at once copies too.
    let chosen = selection(manifest, opts);
    let mut paths = Vec::with_capacity(chosen.len());
    for e in chosen.iter().map(|&i| &manifest.entries[i]) {
        let path = local_path(&opts.dest, &e.key)?;
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        }
        File::create(&path)
            .and_then(|f| f.set_len(e.size))
            .with_context(|| format!("create {}", path.display()))?;
        paths.push(path);
    }
    let jobs: Vec<(usize, u64, u64)> = chosen
        .iter()
        .enumerate()
        .flat_map(|(slot, &i)| {
            parts(manifest.entries[i].size, opts.part_size)
                .into_iter()
                .map(move |(off, len)| (slot, off, len))
        })
        .collect();
    stream::iter(jobs)
        .map(|(slot, off, len)| {
            let e = &manifest.entries[chosen[slot]];
            let key = manifest.s3_key(e);
            let path = &paths[slot];
            let tally = Arc::clone(&tally);
            let whole = off == 0 && len == e.size;
            async move {
                let range = if whole { None } else { Some((off, len)) };
                let r = match OpenOptions::new().write(true).open(path) {
                    Ok(file) => {
                        get_streamed(s3, &opts.bucket, &key, range, |at, chunk| {
                            file.write_all_at(chunk, at)
                                .with_context(|| format!("write {}", e.key))
                        })
                        .await
                    }
                    Err(err) => Err(anyhow::anyhow!("open {}: {err}", path.display())),
                };
                match r {
                    Err(err) => tally.error(format!("{err:#}")),
                    Ok(got) if got != len => {
                        tally.mismatch(format!("{key} bytes {off}+{len}: got {got} bytes"))
                    }
                    Ok(got) => {
                        tally.add_read(got);
                        if off + len == e.size {
                            tally.file_done();
                        }
                    }
                }
            }
        })
        .buffer_unordered(opts.parallel.max(1))
        .collect::<Vec<()>>()
        .await;
    let mut out = tally.finish("copy", "copy", &opts.dest.display().to_string());
    out.threads = opts.parallel;
    Ok(out)
}

/// `root/key`, refusing keys that would escape `root`.
pub fn local_path(root: &Path, key: &str) -> anyhow::Result<PathBuf> {
    let rel = Path::new(key);
    let ok = !key.is_empty()
        && rel
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
    anyhow::ensure!(ok, "key {key:?} is not a plain relative path");
    Ok(root.join(rel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_paths_stay_under_the_root() {
        let root = Path::new("/data");
        assert_eq!(
            local_path(root, "a/b.jpg").ok(),
            Some(PathBuf::from("/data/a/b.jpg"))
        );
        assert!(local_path(root, "../etc/passwd").is_err());
        assert!(local_path(root, "/abs").is_err());
        assert!(local_path(root, "").is_err());
    }
}
