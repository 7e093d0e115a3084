//! Forwarding the volume daemons' logs to the mounter's own output, so `kubectl logs` on the
//! `riffle-mounter` pod shows them.
//!
//! Each daemon writes its log to `<logs dir>/<volume key>.log` (the key names the target:
//! [`crate::node_state::state`]), rotated by riffle itself at a size bound. The forwarder looks at that
//! directory once a second ([`LogForwarder::tick`]) and writes every new complete line of each
//! file to standard output as `[volume <key>] <line>`. It keeps, per file, only its inode,
//! the offset reached and an unfinished last line, so its memory is bounded whatever the
//! daemons log:
//! - files present when the mounter starts are followed from their end (a restarted mounter
//!   does not replay history); files that appear later are read from their start;
//! - a file replaced under its name (rotation: another inode) or shorter than the offset
//!   reached (truncated) is read again from its start;
//! - at most [`MAX_BYTES_PER_TICK`] of one file are forwarded per tick: a daemon that logs
//!   faster than that has the excess skipped, with one line saying how many bytes, so a
//!   noisy volume neither floods the node's log pipeline nor delays the others;
//! - an unfinished line longer than [`MAX_LINE`] is forwarded cut.
//!
//! The files stay the complete record (`riffle` keeps rotated copies next to them).

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Bytes of one file forwarded per tick at most.
pub const MAX_BYTES_PER_TICK: u64 = 256 * 1024;
/// An unfinished line is forwarded (cut) once it is this long.
pub const MAX_LINE: usize = 16 * 1024;

/// What is known of one followed file.
struct Followed {
    inode: u64,
    offset: u64,
    partial: Vec<u8>,
}

/// See the module documentation.
pub struct LogForwarder {
    dir: PathBuf,
    files: HashMap<PathBuf, Followed>,
}

impl LogForwarder {
    /// Starts following `dir`: the files already there from their current end.
    pub fn new(dir: &Path) -> LogForwarder {
        let mut forwarder = LogForwarder {
            dir: dir.to_path_buf(),
            files: HashMap::new(),
        };
        for (path, inode, len) in forwarder.logs() {
            forwarder.files.insert(
                path,
                Followed {
                    inode,
                    offset: len,
                    partial: Vec::new(),
                },
            );
        }
        forwarder
    }

    /// The `*.log` files of the directory: path, inode, length.
    fn logs(&self) -> Vec<(PathBuf, u64, u64)> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
            .filter_map(|e| {
                let meta = e.metadata().ok()?;
                meta.is_file().then(|| (e.path(), meta.ino(), meta.len()))
            })
            .collect()
    }

    /// Forwards what was appended since the last tick, one line at a time to `out`.
    pub fn tick(&mut self, out: &mut dyn FnMut(String)) {
        let present = self.logs();
        self.files
            .retain(|path, _| present.iter().any(|(p, _, _)| p == path));
        for (path, inode, len) in present {
            let label = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            let followed = self.files.entry(path.clone()).or_insert(Followed {
                inode,
                offset: 0,
                partial: Vec::new(),
            });
            if followed.inode != inode || len < followed.offset {
                // Rotated or truncated: the new contents from their start.
                *followed = Followed {
                    inode,
                    offset: 0,
                    partial: Vec::new(),
                };
            }
            if len == followed.offset {
                continue;
            }
            let mut start = followed.offset;
            if len - start > MAX_BYTES_PER_TICK {
                let skipped = len - MAX_BYTES_PER_TICK - start;
                out(format!(
                    "[volume {label}] ... {skipped} bytes of this volume's log not forwarded (more than {} KiB a second; the whole log is in {})",
                    MAX_BYTES_PER_TICK / 1024,
                    path.display()
                ));
                start = len - MAX_BYTES_PER_TICK;
                followed.partial.clear();
            }
            let Ok(read) = read_range(&path, start, len) else {
                continue;
            };
            followed.offset = start + read.len() as u64;
            followed.partial.extend_from_slice(&read);
            while let Some(end) = followed.partial.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = followed.partial.drain(..=end).collect();
                let text = String::from_utf8_lossy(&line[..line.len() - 1]);
                out(format!("[volume {label}] {}", text.trim_end_matches('\r')));
            }
            if followed.partial.len() >= MAX_LINE {
                let text = String::from_utf8_lossy(&followed.partial).into_owned();
                followed.partial.clear();
                out(format!("[volume {label}] {text} ... (line cut)"));
            }
        }
    }

    /// Forwards to standard output once a second, forever.
    pub async fn run(mut self) {
        let mut every = tokio::time::interval(std::time::Duration::from_secs(1));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let batch = tokio::task::block_in_place(|| {
                let mut lines = Vec::new();
                self.tick(&mut |line| lines.push(line));
                lines
            });
            if !batch.is_empty() {
                use std::io::Write;
                let mut stdout = std::io::stdout().lock();
                for line in batch {
                    let _ = writeln!(stdout, "{line}");
                }
            }
        }
    }
}

/// Bytes `start..end` of `path` (fewer if it shrank meanwhile).
fn read_range(path: &Path, start: u64, end: u64) -> std::io::Result<Vec<u8>> {
    let mut file = File::open(path)?;
    file.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::with_capacity((end - start) as usize);
    file.take(end - start).read_to_end(&mut buf)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn append(path: &Path, text: &str) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("open");
        f.write_all(text.as_bytes()).expect("write");
    }

    fn tick(f: &mut LogForwarder) -> Vec<String> {
        let mut lines = Vec::new();
        f.tick(&mut |l| lines.push(l));
        lines
    }

    #[test]
    fn new_lines_are_forwarded_with_the_volume_and_history_is_not_replayed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let old = dir.path().join("aaaa.log");
        append(&old, "before the mounter started\n");
        std::fs::write(dir.path().join("notes.txt"), "not a log\n").expect("write");
        let mut f = LogForwarder::new(dir.path());
        assert!(tick(&mut f).is_empty());
        append(&old, "one\ntwo and a ha");
        assert_eq!(tick(&mut f), ["[volume aaaa] one"]);
        append(&old, "lf\n");
        assert_eq!(tick(&mut f), ["[volume aaaa] two and a half"]);
        // A file that appears later is read from its start.
        append(&dir.path().join("bbbb.log"), "mounted\n");
        assert_eq!(tick(&mut f), ["[volume bbbb] mounted"]);
        assert!(tick(&mut f).is_empty());
    }

    #[test]
    fn a_rotated_or_truncated_log_is_followed_from_its_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("k.log");
        let mut f = LogForwarder::new(dir.path());
        append(&log, "first\n");
        assert_eq!(tick(&mut f), ["[volume k] first"]);
        std::fs::rename(&log, dir.path().join("k.log.1")).expect("rotate");
        append(&log, "after rotation\n");
        assert_eq!(tick(&mut f), ["[volume k] after rotation"]);
        std::fs::write(&log, "x\n").expect("truncate");
        assert_eq!(tick(&mut f), ["[volume k] x"]);
    }

    #[test]
    fn forwarding_is_bounded_per_tick_and_per_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("noisy.log");
        let mut f = LogForwarder::new(dir.path());
        let line = format!("{}\n", "y".repeat(99));
        append(&log, &line.repeat(5_000)); // 500,000 bytes
        let lines = tick(&mut f);
        assert!(
            lines[0].contains("bytes of this volume's log not forwarded"),
            "{}",
            lines[0]
        );
        let forwarded: usize = lines[1..].iter().map(|l| l.len() + 1).sum();
        assert!(forwarded as u64 <= MAX_BYTES_PER_TICK + 64 * lines.len() as u64);
        assert!(
            lines.len() > 2_000 && lines.len() < 2_700,
            "{}",
            lines.len()
        );
        // One endless line is cut, not buffered without bound.
        append(&log, &"z".repeat(MAX_LINE + 10));
        let cut = tick(&mut f);
        assert_eq!(cut.len(), 1);
        assert!(cut[0].ends_with("(line cut)"));
    }

    #[test]
    fn a_missing_directory_forwards_nothing() {
        let mut f = LogForwarder::new(Path::new("/nonexistent/riffle/logs"));
        assert!(tick(&mut f).is_empty());
    }
}
