//! `read-fs`: the one reader used for every system (local disk, copy-first,
//! riffle, s3fs, rclone, ...), with the access patterns of the standard
//! workloads. Every byte read is verified: whole files against the
//! manifest's checksum, random reads against the regenerated content.

mod random;
mod whole;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use crate::manifest::Manifest;
use crate::order::Order;
use crate::outcome::Outcome;

/// The access pattern of a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Pattern {
    /// Every file opened, read whole, closed, in a seeded shuffle (W1).
    W1,
    /// Whole files read sequentially in 1 MiB reads, shards in a seeded shuffle (W2).
    W2,
    /// Random 4 KiB–1 MiB `pread`s of the largest file for a duration (W3).
    W3,
    /// The same random reads through `mmap` (W3).
    #[value(name = "w3-mmap")]
    W3Mmap,
}

impl Pattern {
    pub fn name(self) -> &'static str {
        match self {
            Pattern::W1 => "w1",
            Pattern::W2 => "w2",
            Pattern::W3 => "w3",
            Pattern::W3Mmap => "w3-mmap",
        }
    }

    /// Reader threads of the standard workload.
    pub fn default_threads(self) -> usize {
        match self {
            Pattern::W1 => 8,
            Pattern::W2 => 4,
            Pattern::W3 | Pattern::W3Mmap => 16,
        }
    }
}

/// How to read.
#[derive(Debug, Clone)]
pub struct ReadFsOptions {
    /// The directory that corresponds to the manifest's prefix.
    pub root: PathBuf,
    pub pattern: Pattern,
    pub threads: usize,
    /// Seed of the access order (W1/W2: shuffled with `seed + epoch`; W3:
    /// the same offsets every epoch, so a warm epoch re-reads what the cold
    /// one read first).
    pub seed: u64,
    pub epoch: u32,
    /// W3: how long to read.
    pub duration: Duration,
    /// W1/W2: read only N files, the same N every epoch in a new order
    /// (see [`crate::order`]).
    pub max_files: Option<usize>,
    /// W1/W2: stop after the first N files of the epoch's order (with a
    /// shuffle, N files drawn at random from all of them: a person
    /// browsing, not an epoch).
    pub sample: Option<usize>,
    /// W1/W2: a seeded shuffle (new every epoch) or listing order.
    pub order: Order,
    /// Read size of whole-file passes.
    pub block_size: usize,
    /// The file system's daemon, whose CPU the outcome reports beside the
    /// machine's ([`crate::cpu`]).
    pub daemon_pid: Option<u32>,
}

impl ReadFsOptions {
    pub fn new(root: PathBuf, pattern: Pattern) -> Self {
        Self {
            root,
            pattern,
            threads: pattern.default_threads(),
            seed: 0,
            epoch: 1,
            duration: Duration::from_secs(30),
            max_files: None,
            sample: None,
            order: Order::Shuffle,
            block_size: 1 << 20,
            daemon_pid: None,
        }
    }
}

/// Runs one pass over the dataset of `manifest` under `opts.root`.
pub fn read_fs(manifest: &Manifest, opts: &ReadFsOptions) -> anyhow::Result<Outcome> {
    anyhow::ensure!(
        opts.root.is_dir(),
        "{} is not a directory (is the file system mounted?)",
        opts.root.display()
    );
    let mut out = match opts.pattern {
        Pattern::W1 | Pattern::W2 => whole::run(manifest, opts)?,
        Pattern::W3 | Pattern::W3Mmap => random::run(manifest, opts).context("random reads")?,
    };
    out.threads = opts.threads;
    out.epoch = opts.epoch;
    out.seed = opts.seed;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::content::Content;
    use crate::dataset::{Plan, Workload};
    use std::path::Path;

    fn materialize(plan: &Plan, root: &Path) -> Manifest {
        for o in &plan.objects {
            let p = root.join(&o.key);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(
                &p,
                Content::new(plan.seed, &o.key).bytes(0, o.size as usize),
            )
            .expect("write");
        }
        Manifest::compute(plan, "b", "", 2)
    }

    #[test]
    fn clean_w1_pass_reads_everything() {
        let dir = tempfile::tempdir().expect("tempdir");
        let plan = Plan::new(Workload::W1, 0.003, 11).expect("plan");
        let m = materialize(&plan, dir.path());
        let mut opts = ReadFsOptions::new(dir.path().to_path_buf(), Pattern::W1);
        opts.threads = 3;
        let out = read_fs(&m, &opts).expect("read");
        assert!(out.clean(), "{:?}", out.problems);
        assert_eq!(out.files, 60);
        assert_eq!(out.bytes, plan.total_bytes());
        assert!(out.first_256_s.is_some());
    }

    #[test]
    fn w1_detects_a_flipped_byte_a_short_file_and_a_missing_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let plan = Plan::new(Workload::W1, 0.002, 12).expect("plan");
        let m = materialize(&plan, dir.path());
        let flip = dir.path().join(&m.entries[0].key);
        let mut bytes = std::fs::read(&flip).expect("read");
        bytes[5000] ^= 1;
        std::fs::write(&flip, bytes).expect("write");
        let short = dir.path().join(&m.entries[1].key);
        let len = std::fs::metadata(&short).expect("stat").len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&short)
            .and_then(|f| f.set_len(len - 1))
            .expect("truncate");
        std::fs::remove_file(dir.path().join(&m.entries[2].key)).expect("rm");
        let out = read_fs(
            &m,
            &ReadFsOptions::new(dir.path().to_path_buf(), Pattern::W1),
        )
        .expect("read");
        assert_eq!(out.mismatches, 2, "{:?}", out.problems);
        assert_eq!(out.errors, 1, "{:?}", out.problems);
        assert_eq!(out.files, 37);
        assert!(!out.clean());
    }

    #[test]
    fn w2_reads_shards_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let plan = Plan::new(Workload::W2, 1.0 / 256.0, 1).expect("plan");
        let m = materialize(&plan, dir.path());
        let out = read_fs(
            &m,
            &ReadFsOptions::new(dir.path().to_path_buf(), Pattern::W2),
        )
        .expect("read");
        assert!(out.clean(), "{:?}", out.problems);
        assert_eq!(out.files, 16);
        assert_eq!(out.bytes, 16 << 20);
    }

    #[test]
    fn w3_random_reads_verify_and_detect_wrong_content() {
        let dir = tempfile::tempdir().expect("tempdir");
        let plan = Plan::new(Workload::W3, 1.0 / 1024.0, 3).expect("plan");
        let m = materialize(&plan, dir.path());
        for pattern in [Pattern::W3, Pattern::W3Mmap] {
            let mut opts = ReadFsOptions::new(dir.path().to_path_buf(), pattern);
            opts.threads = 2;
            opts.duration = Duration::from_millis(200);
            let out = read_fs(&m, &opts).expect("read");
            assert!(out.clean(), "{pattern:?} {:?}", out.problems);
            assert!(out.reads > 0);
        }
        // The same file with another seed's bytes: every read is wrong.
        let wrong = Plan::new(Workload::W3, 1.0 / 1024.0, 4).expect("plan");
        materialize(&wrong, dir.path());
        for pattern in [Pattern::W3, Pattern::W3Mmap] {
            let mut opts = ReadFsOptions::new(dir.path().to_path_buf(), pattern);
            opts.threads = 2;
            opts.duration = Duration::from_millis(100);
            let out = read_fs(&m, &opts).expect("read");
            assert!(out.mismatches > 0, "{pattern:?}");
            assert_eq!(out.reads, 0, "only verified reads count: {pattern:?}");
        }
    }

    #[test]
    fn missing_root_is_an_error() {
        let plan = Plan::new(Workload::W1, 0.001, 1).expect("plan");
        let m = Manifest::compute(&plan, "b", "", 1);
        let opts = ReadFsOptions::new(PathBuf::from("/nonexistent/riffle-bench"), Pattern::W1);
        assert!(read_fs(&m, &opts).is_err());
    }
}
