//! The per-mount control socket: `riffle stats` (and later `warm` and `plan`) talk to a
//! running mount through it.
//!
//! Each mount listens on a unix socket whose path is derived from the mountpoint (see
//! [`socket_path`]), so a command given only the mountpoint finds its daemon. The protocol is
//! one request line (a command word, then optionally a space and a JSON argument) and one JSON
//! reply line (`{"error": "..."}` on failure); the socket is created with mode 0600, so only
//! the user who mounted (and root) can use it.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;
use serde_json::json;

use crate::fs::latency::FuseOps;
use crate::metrics::{Exporter, MetricLabel, StatsSource};
use crate::prefetch::plan::Plan;
use crate::prefetch::Prefetcher;
use crate::stats::Sample;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

/// Where the control socket of the mount at `mountpoint` lives.
pub fn socket_path(mountpoint: &Path) -> PathBuf {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in mountpoint.as_os_str().as_encoded_bytes() {
        h = (h ^ *b as u64).wrapping_mul(0x100_0000_01b3);
    }
    let dir = if nix::unistd::geteuid().is_root() {
        PathBuf::from("/run/riffle")
    } else if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR") {
        PathBuf::from(runtime).join("riffle")
    } else {
        std::env::temp_dir().join(format!("riffle-{}", nix::unistd::geteuid()))
    };
    dir.join(format!("{h:016x}.sock"))
}

/// Answers control commands.
pub trait ControlHandler: Send + Sync + 'static {
    /// `argument` is the JSON after the command word (`null` when absent).
    fn handle(
        &self,
        command: &str,
        argument: serde_json::Value,
    ) -> Result<serde_json::Value, String>;
}

/// The commands of a mount: `stats` (the mount's counters with the prefetcher's), `metrics`
/// (the same as Prometheus text, `{"pid": PID, "text": "..."}`), `plan`, `warm`,
/// `warm-status`, `warm-cancel`.
pub struct MountControl {
    pub stats: Arc<dyn StatsSource>,
    pub prefetch: Arc<Prefetcher>,
    /// The FUSE latency histograms the `metrics` command adds.
    pub fuse_ops: Arc<FuseOps>,
    /// The labels of every sample the `metrics` command writes (`--metrics-label`).
    pub metrics_labels: Arc<[MetricLabel]>,
}

impl MountControl {
    /// The mount's metrics in the OpenMetrics text format, as `--metrics-addr` serves them.
    fn metrics_text(&self) -> Result<String, String> {
        let source = Arc::new(MountControl {
            stats: self.stats.clone(),
            prefetch: self.prefetch.clone(),
            fuse_ops: self.fuse_ops.clone(),
            metrics_labels: self.metrics_labels.clone(),
        });
        Exporter::new(source, self.fuse_ops.clone(), &self.metrics_labels)
            .encode()
            .map_err(|_| "cannot encode the metrics".to_string())
    }
}

impl StatsSource for MountControl {
    /// The mount's counters with the prefetcher's section added.
    fn stats(&self) -> serde_json::Value {
        let mut sample = Sample::from(self.stats.stats());
        self.prefetch.record(&mut sample);
        sample.into_json()
    }
}

impl ControlHandler for MountControl {
    fn handle(
        &self,
        command: &str,
        argument: serde_json::Value,
    ) -> Result<serde_json::Value, String> {
        let id = || {
            argument
                .get("id")
                .and_then(|v| v.as_u64())
                .ok_or_else(|| "missing job id".to_string())
        };
        match command {
            "stats" => Ok(StatsSource::stats(self)),
            "metrics" => Ok(json!({ "pid": std::process::id(), "text": self.metrics_text()? })),
            "plan" => {
                let text = argument.get("text").and_then(|t| t.as_str());
                let plan = text.map(Plan::parse).transpose()?;
                let items = plan.as_ref().map_or(0, Plan::len);
                self.prefetch.set_plan(plan);
                Ok(json!({ "items": items }))
            }
            "warm" => {
                let paths = argument
                    .get("paths")
                    .and_then(|p| p.as_array())
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                Ok(json!({ "id": self.prefetch.warm(paths) }))
            }
            "warm-status" => {
                let progress = self
                    .prefetch
                    .warm_progress(id()?)
                    .ok_or_else(|| "no such warm job".to_string())?;
                serde_json::to_value(progress).map_err(|e| e.to_string())
            }
            "warm-cancel" => Ok(json!({ "cancelled": self.prefetch.cancel_warm(id()?) })),
            other => Err(format!("unknown command '{other}'")),
        }
    }
}

/// A running control socket; removes its file when dropped.
pub struct ControlServer {
    path: PathBuf,
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds the socket for `mountpoint` and serves requests on the current runtime.
pub fn serve(mountpoint: &Path, source: Arc<dyn ControlHandler>) -> anyhow::Result<ControlServer> {
    let path = socket_path(mountpoint);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    // A socket file left by a dead daemon of the same mountpoint.
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)
        .with_context(|| format!("cannot listen on {}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    tokio::spawn(async move {
        let mut warned = false;
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors (EMFILE) fails again at once until some are freed:
                    // pause instead of spinning, and say it once.
                    if !std::mem::replace(&mut warned, true) {
                        tracing::warn!(error = %e, "the control socket cannot accept a connection; retrying");
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let source = source.clone();
            tokio::spawn(async move {
                if let Err(e) = answer(stream, source).await {
                    tracing::debug!(error = %e, "control request failed");
                }
            });
        }
    });
    Ok(ControlServer { path })
}

#[derive(Serialize)]
struct ErrorReply<'a> {
    error: &'a str,
}

async fn answer(stream: UnixStream, source: Arc<dyn ControlHandler>) -> anyhow::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(read.take(MAX_REQUEST));
    tokio::time::timeout(Duration::from_secs(5), reader.read_line(&mut line)).await??;
    let line = line.trim();
    let (command, argument) = line.split_once(' ').unwrap_or((line, ""));
    let argument = if argument.trim().is_empty() {
        Ok(serde_json::Value::Null)
    } else {
        serde_json::from_str(argument).map_err(|e| format!("bad argument: {e}"))
    };
    // Off the runtime's workers: `stats` and `metrics` walk the disk cache's index.
    let command = command.to_string();
    let answered =
        tokio::task::spawn_blocking(move || argument.and_then(|a| source.handle(&command, a)))
            .await
            .map_err(|_| "the command failed".to_string())
            .and_then(|r| r);
    let reply = match answered {
        Ok(value) => value,
        Err(error) => serde_json::to_value(ErrorReply { error: &error })?,
    };
    let mut text = serde_json::to_string(&reply)?;
    text.push('\n');
    write.write_all(text.as_bytes()).await?;
    Ok(())
}

/// How long a client waits for the daemon's reply.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest request line accepted (a plan is sent inline).
const MAX_REQUEST: u64 = 256 << 20;

/// Sends `command` (with an optional JSON argument) to the mount at `mountpoint` and returns
/// its JSON reply.
pub fn request(mountpoint: &Path, command: &str) -> anyhow::Result<serde_json::Value> {
    request_with(mountpoint, command, None)
}

pub fn request_with(
    mountpoint: &Path,
    command: &str,
    argument: Option<&serde_json::Value>,
) -> anyhow::Result<serde_json::Value> {
    use std::io::{BufRead, Write};
    let resolved = std::fs::canonicalize(mountpoint)
        .or_else(|_| std::path::absolute(mountpoint))
        .with_context(|| format!("cannot resolve {}", mountpoint.display()))?;
    let path = socket_path(&resolved);
    let mut stream = std::os::unix::net::UnixStream::connect(&path).with_context(|| {
        format!(
            "no riffle mount answers for {} (socket {})",
            mountpoint.display(),
            path.display()
        )
    })?;
    stream.set_read_timeout(Some(REPLY_TIMEOUT))?;
    match argument {
        Some(a) => writeln!(stream, "{command} {a}")?,
        None => writeln!(stream, "{command}")?,
    }
    let mut line = String::new();
    if let Err(e) = std::io::BufReader::new(stream).read_line(&mut line) {
        if matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) {
            anyhow::bail!(
                "the riffle mount at {} did not answer within {} s (see its log)",
                mountpoint.display(),
                REPLY_TIMEOUT.as_secs()
            );
        }
        return Err(e).context("reading the daemon's reply");
    }
    let value: serde_json::Value =
        serde_json::from_str(&line).context("the daemon sent an unreadable reply")?;
    if let Some(err) = value.get("error").and_then(|e| e.as_str()) {
        anyhow::bail!("{err}");
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::Value;

    use super::*;
    use crate::metrics::fixture::mount_metrics;
    use crate::prefetch::PrefetchConfig;
    use crate::stats::defs;

    /// Every path of `v` that holds a value (numbers, strings, booleans and nulls).
    fn leaf_paths(prefix: &str, v: &Value, out: &mut BTreeSet<String>) {
        match v {
            Value::Object(map) => {
                for (k, child) in map {
                    let path = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    leaf_paths(&path, child, out);
                }
            }
            _ => {
                out.insert(prefix.to_string());
            }
        }
    }

    /// The `riffle stats` tree of a mount with every section (disk cache, peers, a plan) has
    /// exactly the declared fields: each declaration is written, nothing else is.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_stats_tree_has_exactly_the_declared_fields() {
        let dir = tempfile::tempdir().expect("tempdir");
        let metrics = mount_metrics(dir.path());
        let config = PrefetchConfig {
            concurrency: 4,
            byte_budget: 1 << 20,
            max_items_ahead: 100,
            max_file_bytes: 1 << 20,
            max_dir_window: 16,
            epoch_prefetch: true,
            eviction_asks_prefetch: false,
        };
        let prefetch = Prefetcher::new(metrics.namespace.clone(), metrics.fetcher.clone(), config);
        prefetch.set_plan(Some(Plan::parse("a/b.bin\n").expect("plan")));
        let control = MountControl {
            stats: metrics,
            prefetch,
            fuse_ops: FuseOps::new(),
            metrics_labels: Arc::from([]),
        };
        let mut written = BTreeSet::new();
        leaf_paths("", &StatsSource::stats(&control), &mut written);
        let declared: BTreeSet<String> = defs::ALL.iter().map(|s| s.path.to_string()).collect();
        let undeclared: Vec<_> = written.difference(&declared).collect();
        let unwritten: Vec<_> = declared.difference(&written).collect();
        assert!(
            undeclared.is_empty() && unwritten.is_empty(),
            "written but not declared: {undeclared:?}; declared but not written: {unwritten:?}"
        );
    }
}
