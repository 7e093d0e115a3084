//! Log set-up: `tracing` to stderr or to a file that rotates at a size bound.
//!
//! rifflefs logs at the chosen level; the AWS SDK, hyper and fuser are held at `warn` whatever
//! the level, because their debug output can include request headers (signatures, tokens).
//! fuser's session is held at `error`: its only warning is the unmount it retries when the
//! session ends, which fails with EINVAL after every normal `riffle unmount` (the kernel has
//! already unmounted) and would otherwise be logged on every clean exit.
//!
//! Two bounds keep the log small whatever the daemon is asked to do:
//! - every line at `info` and above passes the rate limit of [`log_limit`](super::log_limit):
//!   at most 10 lines a minute from one place in the code, the rest counted in one summary line;
//! - a log file is rotated when a write takes it past `--log-max-size` (the file is renamed
//!   `FILE.1`, older ones shift to `FILE.2` and on, and `--log-keep` of them are kept), so a
//!   mount's logs take at most `(log_keep + 1) × log_max_size` plus one line. Rotation happens
//!   inside the daemon, so no `logrotate` rule is needed (and none should move the file).

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use file_rotate::compression::Compression;
use file_rotate::suffix::AppendCount;
use file_rotate::{ContentLimit, FileRotate};
use tracing_subscriber::filter::FilterExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use super::log_limit::{RateLimit, RateLimitFilter, BURST, PERIOD};

/// Where the log goes and how large a log file may grow.
#[derive(Debug, Clone)]
pub struct LogConfig<'a> {
    pub level: &'a str,
    /// `None`: stderr.
    pub file: Option<&'a Path>,
    /// A log file is rotated when it passes this many bytes.
    pub max_size: u64,
    /// Rotated files kept besides the current one.
    pub keep: usize,
}

pub fn init(config: &LogConfig<'_>) -> anyhow::Result<()> {
    init_with(config, false).map(|_| ())
}

/// [`init`] for a daemon taking a live mount over (`--restart`): the log file is opened only
/// when [`LogOpener::open`] is called, once the mount is served again. Opening scans the log
/// file's directory (for rotated files) and looks at every entry there; when the mountpoint is
/// one of them, that look waits for the daemon that serves it, which is this one. Lines
/// logged until then are kept in memory (at most [`DEFERRED_MAX`] bytes).
pub fn init_deferred(config: &LogConfig<'_>) -> anyhow::Result<LogOpener> {
    init_with(config, true)
}

/// Appends one line to the log file at `path` as the log's own lines look, without opening
/// it for rotation (which scans its directory: see [`init_deferred`]). For the keeper's few
/// lines, and for a successor that fails before its log file is opened.
pub fn append_line(path: &Path, level: &str, line: &str) {
    use std::io::Write;
    if let Ok(mut file) = std::fs::OpenOptions::new().append(true).open(path) {
        let now = humantime::format_rfc3339_micros(std::time::SystemTime::now());
        let _ = writeln!(file, "{now} {level:>5} {line}");
    }
}

/// Log bytes kept in memory before a deferred log file is opened.
pub const DEFERRED_MAX: usize = 1 << 20;

/// Opens a deferred log file ([`init_deferred`]).
pub struct LogOpener(Option<(Deferred, std::path::PathBuf, u64, usize)>);

impl LogOpener {
    /// Opens the log file on a thread of its own (it may wait for the mount to answer) and
    /// writes what was logged so far to it.
    pub fn open(self) {
        let Some((deferred, path, max_size, keep)) = self.0 else {
            return;
        };
        let spawned = std::thread::Builder::new()
            .name("riffle-log-open".into())
            .spawn(move || match rotating_file(&path, max_size, keep) {
                Ok(mut file) => {
                    use std::io::Write;
                    let mut state = deferred.lock();
                    let _ = file.write_all(&state.pending);
                    state.pending = Vec::new();
                    state.file = Some(file);
                }
                Err(e) => eprintln!("riffle: {e:#}"),
            });
        if let Err(e) = spawned {
            eprintln!("riffle: cannot open the log file: {e}");
        }
    }
}

/// A log file opened later; lines before that wait in memory.
#[derive(Clone, Default)]
struct Deferred(Arc<std::sync::Mutex<DeferredState>>);

#[derive(Default)]
struct DeferredState {
    pending: Vec<u8>,
    file: Option<FileRotate<AppendCount>>,
}

impl Deferred {
    fn lock(&self) -> std::sync::MutexGuard<'_, DeferredState> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl std::io::Write for Deferred {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut state = self.lock();
        match &mut state.file {
            Some(file) => file.write(buf),
            None => {
                if state.pending.len() + buf.len() <= DEFERRED_MAX {
                    state.pending.extend_from_slice(buf);
                }
                Ok(buf.len())
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match &mut self.lock().file {
            Some(file) => file.flush(),
            None => Ok(()),
        }
    }
}

fn init_with(config: &LogConfig<'_>, deferred: bool) -> anyhow::Result<LogOpener> {
    let level = config.level;
    let filter = EnvFilter::try_new(format!(
        "warn,rifflefs={level},riffle={level},aws_config=warn,aws_smithy_runtime=warn,aws_sdk_s3=warn,hyper=warn,fuser=warn,fuser::session=error"
    ))
    .context("invalid log level")?;
    let limit = Arc::new(RateLimit::new(BURST, PERIOD));
    let filter = filter.and(RateLimitFilter(limit.clone()));
    let layer = tracing_subscriber::fmt::layer().with_target(false);
    let mut opener = LogOpener(None);
    let result = match config.file {
        Some(path) if deferred => {
            let writer = Deferred::default();
            opener = LogOpener(Some((
                writer.clone(),
                path.to_path_buf(),
                config.max_size,
                config.keep,
            )));
            tracing_subscriber::registry()
                .with(
                    layer
                        .with_ansi(false)
                        .with_writer(move || writer.clone())
                        .with_filter(filter),
                )
                .try_init()
        }
        Some(path) => {
            let writer = rotating_file(path, config.max_size, config.keep)?;
            tracing_subscriber::registry()
                .with(
                    layer
                        .with_ansi(false)
                        .with_writer(std::sync::Mutex::new(writer))
                        .with_filter(filter),
                )
                .try_init()
        }
        None => tracing_subscriber::registry()
            .with(layer.with_writer(std::io::stderr).with_filter(filter))
            .try_init(),
    };
    result.map_err(|e| anyhow::anyhow!("cannot set up logging: {e}"))?;
    if let Err(e) = limit.spawn_reporter() {
        tracing::warn!(error = %e, "no thread for the log's summary lines");
    }
    Ok(opener)
}

/// A log file at `path` (appended to) that rotates when a write takes it past `max_size` bytes,
/// keeping `keep` rotated files (`FILE.1` the newest). Fails with the reason if the file cannot
/// be opened.
pub fn rotating_file(
    path: &Path,
    max_size: u64,
    keep: usize,
) -> anyhow::Result<FileRotate<AppendCount>> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create log directory {}", dir.display()))?;
    // Open it once here so that a bad path fails with a reason (file-rotate would panic).
    let mut options = std::fs::OpenOptions::new();
    options.read(true).create(true).append(true);
    options
        .open(path)
        .with_context(|| format!("cannot open log file {}", path.display()))?;
    let max = usize::try_from(max_size.max(1)).unwrap_or(usize::MAX);
    Ok(FileRotate::new(
        path,
        AppendCount::new(keep),
        ContentLimit::BytesSurpassed(max),
        Compression::None,
        Some(options),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn sizes(dir: &Path) -> Vec<(String, u64)> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    e.metadata().unwrap().len(),
                )
            })
            .collect();
        v.sort();
        v
    }

    #[test]
    fn the_log_file_rotates_at_its_bound_and_keeps_whole_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.log");
        let mut log = rotating_file(&path, 1000, 2).unwrap();
        let line = format!("{}\n", "x".repeat(99)); // 100 bytes
        for _ in 0..55 {
            log.write_all(line.as_bytes()).unwrap();
            log.flush().unwrap();
        }
        let files = sizes(dir.path());
        let names: Vec<_> = files.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["m.log", "m.log.1", "m.log.2"],
            "two rotated files kept"
        );
        for (name, size) in &files {
            assert!(
                *size <= 1000 + 100,
                "{name} is {size} bytes, over its bound"
            );
            assert_eq!(size % 100, 0, "{name} holds only whole lines");
        }
        let total: u64 = files.iter().map(|(_, s)| s).sum();
        assert!(total < 55 * 100, "the oldest lines were dropped");
    }

    #[test]
    fn an_existing_log_counts_towards_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.log");
        std::fs::write(&path, "y".repeat(990) + "\n").unwrap();
        let mut log = rotating_file(&path, 1000, 3).unwrap();
        log.write_all(b"first line after a restart\n").unwrap();
        log.write_all(b"second\n").unwrap();
        log.flush().unwrap();
        assert!(dir.path().join("m.log.1").exists(), "rotated at the bound");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "second\n");
    }

    #[test]
    fn a_log_file_that_cannot_be_opened_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a-directory");
        std::fs::create_dir(&path).unwrap();
        let e = rotating_file(&path, 1000, 1).err().unwrap();
        assert!(e.to_string().contains("cannot open log file"), "{e}");
    }
}
