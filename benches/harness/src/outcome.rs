//! What one measured pass (a reader epoch, a store read, a copy) reports:
//! counts, rates, the CPU it cost and every error or wrong byte, as JSON on
//! stdout.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::cpu::{self, CpuUse, Sample};

/// Problems kept verbatim in an [`Outcome`] at most.
const MAX_PROBLEMS: usize = 20;

/// The result of one measured pass.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// `read-fs`, `read-s3` or `copy`.
    pub tool: String,
    /// Access pattern (`w1`, `w2`, `w3`, `w3-mmap`, `objects`, `ranged`, `copy`).
    pub pattern: String,
    /// The directory or `s3://bucket/prefix` read.
    pub source: String,
    pub threads: usize,
    pub epoch: u32,
    pub seed: u64,
    /// Files (or objects) read completely.
    pub files: u64,
    /// Bytes read (verified or not).
    pub bytes: u64,
    /// Verified read calls (W3) or successful requests (S3 reads, copies).
    pub reads: u64,
    pub elapsed_s: f64,
    pub files_per_s: f64,
    pub mb_per_s: f64,
    pub reads_per_s: f64,
    /// Seconds until the first 256 files were read (W1-style passes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_256_s: Option<f64>,
    /// I/O errors (open, read, request failures).
    pub errors: u64,
    /// Reads that returned wrong bytes (or a wrong size).
    pub mismatches: u64,
    /// The first few errors and mismatches, verbatim.
    #[serde(default)]
    pub problems: Vec<String>,
    /// The machine's CPU during the pass, and the watched daemon's
    /// ([`crate::cpu`]); absent where `/proc` could not be read, and in
    /// results recorded before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuUse>,
}

impl Outcome {
    /// True when every byte read was right and nothing failed.
    pub fn clean(&self) -> bool {
        self.errors == 0 && self.mismatches == 0
    }
}

/// Counters shared by the workers of a pass.
#[derive(Debug)]
pub struct Tally {
    started: Instant,
    files: AtomicU64,
    bytes: AtomicU64,
    reads: AtomicU64,
    errors: AtomicU64,
    mismatches: AtomicU64,
    first_256: OnceLock<Duration>,
    first_n: u64,
    problems: Mutex<Vec<String>>,
    /// The daemon whose CPU the pass reports, and the counters at the start.
    daemon: Option<u32>,
    cpu_start: Option<Sample>,
}

impl Tally {
    /// Starts the clock. `first_n` is the file count whose time is reported
    /// as `first_256_s` (256, or fewer for a smaller dataset; 0 = none).
    pub fn start(first_n: u64) -> Self {
        Self::start_watching(first_n, None)
    }

    /// As [`Tally::start`], also reporting the CPU of process `daemon` (the
    /// file system's daemon) over the pass.
    pub fn start_watching(first_n: u64, daemon: Option<u32>) -> Self {
        let cpu_start = Sample::take(daemon);
        Self {
            daemon,
            cpu_start,
            started: Instant::now(),
            files: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            mismatches: AtomicU64::new(0),
            first_256: OnceLock::new(),
            first_n,
            problems: Mutex::new(Vec::new()),
        }
    }

    pub fn file_done(&self) {
        let n = self.files.fetch_add(1, Ordering::Relaxed) + 1;
        if n == self.first_n {
            let _ = self.first_256.set(self.started.elapsed());
        }
    }

    pub fn add_bytes(&self, n: u64) {
        self.bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts a read (or request) without bytes (they were counted as they came).
    pub fn count_read(&self) {
        self.reads.fetch_add(1, Ordering::Relaxed);
    }

    pub fn add_read(&self, bytes: u64) {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn error(&self, what: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        self.note(format!("error: {what}"));
    }

    pub fn mismatch(&self, what: String) {
        self.mismatches.fetch_add(1, Ordering::Relaxed);
        self.note(format!("WRONG BYTES: {what}"));
    }

    fn note(&self, line: String) {
        let mut p = self.problems.lock();
        if p.len() < MAX_PROBLEMS {
            p.push(line);
        }
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// The outcome so far, with rates over the time since [`Tally::start`].
    pub fn finish(&self, tool: &str, pattern: &str, source: &str) -> Outcome {
        let elapsed = self.started.elapsed().as_secs_f64().max(1e-9);
        let cpu = self
            .cpu_start
            .zip(Sample::take(self.daemon))
            .map(|(a, b)| CpuUse::between(&a, &b, cpu::ticks_per_s()));
        let files = self.files.load(Ordering::Relaxed);
        let bytes = self.bytes.load(Ordering::Relaxed);
        let reads = self.reads.load(Ordering::Relaxed);
        Outcome {
            tool: tool.to_string(),
            pattern: pattern.to_string(),
            source: source.to_string(),
            files,
            bytes,
            reads,
            elapsed_s: elapsed,
            files_per_s: files as f64 / elapsed,
            mb_per_s: bytes as f64 / 1e6 / elapsed,
            reads_per_s: reads as f64 / elapsed,
            first_256_s: self.first_256.get().map(Duration::as_secs_f64),
            errors: self.errors.load(Ordering::Relaxed),
            mismatches: self.mismatches.load(Ordering::Relaxed),
            problems: self.problems.lock().clone(),
            cpu,
            ..Outcome::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tally_counts_and_keeps_a_few_problems() {
        let t = Tally::start(2);
        t.file_done();
        t.add_bytes(10);
        t.file_done();
        t.add_read(5);
        for i in 0..30 {
            t.mismatch(format!("m{i}"));
        }
        t.error("e".into());
        let o = t.finish("read-fs", "w1", "/x");
        assert_eq!((o.files, o.bytes, o.reads), (2, 15, 1));
        assert_eq!((o.errors, o.mismatches), (1, 30));
        assert_eq!(o.problems.len(), MAX_PROBLEMS);
        assert!(o.first_256_s.is_some());
        assert!(!o.clean());
        assert!(
            o.cpu.is_some_and(|c| c.daemon_ticks.is_none()),
            "machine CPU, no daemon"
        );
    }
}
