//! W4 (listing): the timed passes over a dataset's names and what they
//! print. `riffle-bench walk` walks a mount with `find` (`find ROOT -type f`
//! counted like `| wc -l`, or with `--stat` `find ROOT -type f -printf` of
//! every file's size, which costs an `lstat` per file, summed), and
//! `riffle-bench list-s3` lists the store straight with a parallel S3 client
//! ([`crate::s3::list`]). Both print a [`ListPass`]: what they counted, the
//! manifest's counts, the time, and whether it stopped at its time limit.
//!
//! The dataset marker `gen` leaves under the prefix
//! ([`crate::s3::upload::MARKER_NAME`]) is not part of the dataset: it is
//! left out of the counts (and reported as `ignored`).

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::s3::upload::MARKER_NAME;

/// Problems kept verbatim in a [`ListPass`] at most.
const MAX_PROBLEMS: usize = 20;

/// The result of one W4 pass: a walk of a mount, or a listing of the store.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ListPass {
    /// `walk` or `list-s3`.
    pub tool: String,
    /// `find` (names only), `stat` (`find` with an `lstat` of every file) or
    /// `list` (LIST requests straight to the store).
    pub phase: String,
    /// The directory walked, or `s3://bucket/prefix`.
    pub source: String,
    /// LISTs in flight at most (`list-s3`); 0 for walks.
    #[serde(default)]
    pub parallel: usize,
    /// Files found (walk) or keys listed (`list-s3`), the marker left out.
    pub objects: u64,
    /// Their sizes summed (`stat` and `list-s3`; `None` for a names-only walk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// The dataset's object count and total size (the manifest's).
    pub expected_objects: u64,
    pub expected_bytes: u64,
    /// Files or keys left out of the counts: the dataset marker.
    #[serde(default)]
    pub ignored: u64,
    /// LIST requests sent (`list-s3` only; walks' are counted at the proxy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub list_requests: Option<u64>,
    pub elapsed_s: f64,
    pub objects_per_s: f64,
    /// The pass was stopped at its time limit, this many seconds (its counts
    /// are what it had reached).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timed_out_s: Option<f64>,
    /// Errors: `find`'s error lines (or its failure), failed LIST requests.
    pub errors: u64,
    /// The count or the summed sizes differ from the manifest's (a pass
    /// that timed out is wrong only when it counted too many).
    pub wrong: bool,
    /// The first few errors and the count mismatch, verbatim.
    #[serde(default)]
    pub problems: Vec<String>,
}

impl ListPass {
    /// A finished pass: sets the rate and `wrong` (adding the mismatch to
    /// the problems).
    pub fn finish(mut self) -> Self {
        self.objects_per_s = if self.elapsed_s > 0.0 {
            self.objects as f64 / self.elapsed_s
        } else {
            0.0
        };
        let finished = self.timed_out_s.is_none();
        let count_wrong = self.objects > self.expected_objects
            || (finished && self.objects < self.expected_objects);
        let bytes_wrong = finished && self.bytes.is_some_and(|b| b != self.expected_bytes);
        self.wrong = count_wrong || bytes_wrong;
        if count_wrong {
            self.problems.push(format!(
                "WRONG COUNT: {} objects, the manifest has {}",
                self.objects, self.expected_objects
            ));
        }
        if bytes_wrong {
            self.problems.push(format!(
                "WRONG SIZES: {} bytes in all, the manifest has {}",
                self.bytes.unwrap_or(0),
                self.expected_bytes
            ));
        }
        self
    }

    /// Whether it finished, counted right and met no error.
    pub fn clean(&self) -> bool {
        self.timed_out_s.is_none() && !self.wrong && self.errors == 0
    }

    /// The `riffle-bench` exit code of this pass: 1 on a wrong count or size,
    /// 2 on errors or a timeout, else 0.
    pub fn exit_code(&self) -> u8 {
        if self.wrong {
            1
        } else if self.errors > 0 || self.timed_out_s.is_some() {
            2
        } else {
            0
        }
    }
}

/// What a child process's output added up to.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counted {
    pub objects: u64,
    pub bytes: u64,
    pub ignored: u64,
    /// Lines that did not parse (a `--stat` line without a size).
    pub unparsed: u64,
}

/// How one line of the walk's output counts.
fn count_line(line: &[u8], stat: bool, marker: &[u8], c: &mut Counted) {
    if stat {
        // "SIZE RELPATH": the marker is the root's RELPATH `.riffle-bench.json`.
        let (size, rel) = match line.iter().position(|&b| b == b' ') {
            Some(i) => (&line[..i], &line[i + 1..]),
            None => (line, &b""[..]),
        };
        if rel == MARKER_NAME.as_bytes() {
            c.ignored += 1;
            return;
        }
        match std::str::from_utf8(size)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
        {
            Some(n) => {
                c.objects += 1;
                c.bytes += n;
            }
            None => c.unparsed += 1,
        }
    } else if line == marker {
        c.ignored += 1;
    } else {
        c.objects += 1;
    }
}

/// What running the walk's command gave.
#[derive(Debug, Clone, Default)]
pub struct RunResult {
    pub counted: Counted,
    pub elapsed: Duration,
    /// Killed at the time limit.
    pub timed_out: bool,
    /// The command's error lines (at most [`MAX_PROBLEMS`] kept) and how many.
    pub stderr: Vec<String>,
    pub stderr_lines: u64,
    /// The command exited with a failure (not killed by us).
    pub failed: Option<String>,
}

/// Runs `cmd`, counting its stdout line by line as [`count_line`] does, and
/// kills it at `timeout`.
pub fn run_counted(
    mut cmd: Command,
    stat: bool,
    marker: &[u8],
    timeout: Option<Duration>,
) -> anyhow::Result<RunResult> {
    let started = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("run {cmd:?}"))?;
    let stdout = child.stdout.take().context("child stdout")?;
    let stderr = child.stderr.take().context("child stderr")?;
    let marker = marker.to_vec();
    let (tx, rx) = mpsc::channel();
    let out_thread = std::thread::spawn(move || {
        let mut c = Counted::default();
        let mut r = BufReader::with_capacity(1 << 16, stdout);
        let mut line = Vec::with_capacity(256);
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if line.last() == Some(&b'\n') {
                        line.pop();
                    }
                    count_line(&line, stat, &marker, &mut c);
                }
            }
        }
        let _ = tx.send(());
        c
    });
    let err_thread = std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut n = 0u64;
        let mut text = String::new();
        let _ = BufReader::new(stderr).read_to_string(&mut text);
        for l in text.lines().filter(|l| !l.trim().is_empty()) {
            n += 1;
            if kept.len() < MAX_PROBLEMS {
                kept.push(l.to_string());
            }
        }
        (kept, n)
    });
    // stdout ends when the command exits (or is killed).
    let timed_out = match timeout {
        Some(t) => match rx.recv_timeout(t.saturating_sub(started.elapsed())) {
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => false,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                true
            }
        },
        None => {
            let _ = rx.recv();
            false
        }
    };
    let status = child.wait().context("wait for the walk")?;
    let elapsed = if timed_out {
        timeout.unwrap_or_default()
    } else {
        started.elapsed()
    };
    let counted = out_thread
        .join()
        .map_err(|_| anyhow::anyhow!("output reader panicked"))?;
    let (stderr, stderr_lines) = err_thread
        .join()
        .map_err(|_| anyhow::anyhow!("error reader panicked"))?;
    let failed = (!timed_out && !status.success()).then(|| format!("{cmd:?} exited with {status}"));
    Ok(RunResult {
        counted,
        elapsed,
        timed_out,
        stderr,
        stderr_lines,
        failed,
    })
}

/// Walks `root` with `find` (with `stat`, also an `lstat` of every file for
/// its size), stopped at `timeout`, and checks the count (and sizes) against
/// the manifest's `expected_objects` and `expected_bytes`.
pub fn walk(
    root: &Path,
    stat: bool,
    timeout: Option<Duration>,
    expected_objects: u64,
    expected_bytes: u64,
) -> anyhow::Result<ListPass> {
    let mut cmd = Command::new("find");
    cmd.arg(root).args(["-type", "f"]);
    if stat {
        cmd.args(["-printf", "%s %P\\n"]);
    }
    let marker = root.join(MARKER_NAME);
    let r = run_counted(cmd, stat, marker.as_os_str().as_encoded_bytes(), timeout)?;
    let mut problems = r.stderr;
    let mut errors = r.stderr_lines;
    if let Some(f) = r.failed {
        errors = errors.max(1);
        if problems.len() < MAX_PROBLEMS {
            problems.push(f);
        }
    }
    if r.counted.unparsed > 0 {
        errors += r.counted.unparsed;
        problems.push(format!(
            "{} lines of find's output had no size",
            r.counted.unparsed
        ));
    }
    Ok(ListPass {
        tool: "walk".into(),
        phase: if stat { "stat" } else { "find" }.into(),
        source: root.display().to_string(),
        parallel: 0,
        objects: r.counted.objects,
        bytes: stat.then_some(r.counted.bytes),
        expected_objects,
        expected_bytes,
        ignored: r.counted.ignored,
        list_requests: None,
        elapsed_s: r.elapsed.as_secs_f64(),
        objects_per_s: 0.0,
        timed_out_s: r.timed_out.then_some(r.elapsed.as_secs_f64()),
        errors,
        wrong: false,
        problems,
    }
    .finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pass(objects: u64, bytes: Option<u64>, timed_out: bool) -> ListPass {
        ListPass {
            objects,
            bytes,
            expected_objects: 10,
            expected_bytes: 100,
            elapsed_s: 2.0,
            timed_out_s: timed_out.then_some(2.0),
            ..ListPass::default()
        }
        .finish()
    }

    #[test]
    fn counts_are_checked_against_the_manifest() {
        let ok = pass(10, Some(100), false);
        assert!(ok.clean() && !ok.wrong);
        assert_eq!(ok.objects_per_s, 5.0);
        assert_eq!(ok.exit_code(), 0);
        let short = pass(9, None, false);
        assert!(short.wrong);
        assert_eq!(short.exit_code(), 1);
        assert!(short.problems[0].contains("WRONG COUNT: 9 objects, the manifest has 10"));
        let sizes = pass(10, Some(99), false);
        assert!(sizes.wrong && sizes.problems[0].contains("WRONG SIZES"));
        // Stopped early: short is not wrong, too many is.
        let stopped = pass(4, Some(40), true);
        assert!(!stopped.wrong && !stopped.clean());
        assert_eq!(stopped.exit_code(), 2);
        assert!(pass(11, None, true).wrong);
    }

    #[test]
    fn lines_count_but_the_marker_does_not() {
        let mut c = Counted::default();
        for l in ["/m/a/x", "/m/.riffle-bench.json", "/m/b/.riffle-bench.json"] {
            count_line(l.as_bytes(), false, b"/m/.riffle-bench.json", &mut c);
        }
        assert_eq!((c.objects, c.ignored), (2, 1));
        let mut c = Counted::default();
        for l in ["12 a/x", "0 b/y z", "7 .riffle-bench.json", "oops"] {
            count_line(l.as_bytes(), true, b"", &mut c);
        }
        assert_eq!((c.objects, c.bytes, c.ignored, c.unparsed), (2, 12, 1, 1));
    }

    #[test]
    fn walk_counts_files_and_sizes_and_stops_at_its_time_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        std::fs::create_dir_all(root.join("d/e")).expect("mkdir");
        std::fs::write(root.join("a"), b"12345").expect("write");
        std::fs::write(root.join("d/b"), b"").expect("write");
        std::fs::write(root.join("d/e/c"), b"123").expect("write");
        std::fs::write(root.join(MARKER_NAME), b"{}").expect("write");
        let w = walk(root, false, None, 3, 8).expect("walk");
        assert_eq!((w.objects, w.bytes, w.ignored), (3, None, 1));
        assert!(w.clean(), "{w:?}");
        let s = walk(root, true, Some(Duration::from_secs(60)), 3, 8).expect("stat");
        assert_eq!((s.objects, s.bytes, s.phase.as_str()), (3, Some(8), "stat"));
        assert!(s.clean(), "{s:?}");
        let wrong = walk(root, true, None, 3, 9).expect("stat");
        assert!(wrong.wrong && wrong.exit_code() == 1);
        let gone = walk(&root.join("missing"), false, None, 3, 8).expect("walk");
        assert!(gone.errors > 0 && gone.wrong, "{gone:?}");

        // A command that outlives its limit is killed and marked.
        let mut slow = Command::new("sh");
        slow.args(["-c", "echo one; echo two; exec sleep 30"]);
        let t = Instant::now();
        let r = run_counted(slow, false, b"", Some(Duration::from_millis(300))).expect("run");
        assert!(t.elapsed() < Duration::from_secs(10));
        assert!(r.timed_out && r.failed.is_none());
        assert_eq!(r.counted.objects, 2);
    }
}
