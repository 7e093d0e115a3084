//! The per-mount control socket: `riffle stats` (and later `warm` and `plan`) talk to a
//! running mount through it.
//!
//! Each mount listens on a unix socket whose path is derived from the mountpoint (see
//! [`socket_path`]), so a command given only the mountpoint finds its daemon. The protocol is
//! one request line (a command word) and one JSON reply line; the socket is created with
//! mode 0600, so only the user who mounted (and root) can use it.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;
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

/// Something that can describe its state as JSON.
pub trait StatsSource: Send + Sync + 'static {
    fn stats(&self) -> serde_json::Value;
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
pub fn serve(mountpoint: &Path, source: Arc<dyn StatsSource>) -> anyhow::Result<ControlServer> {
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
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
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

async fn answer(stream: UnixStream, source: Arc<dyn StatsSource>) -> anyhow::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(read.take(4096));
    tokio::time::timeout(Duration::from_secs(5), reader.read_line(&mut line)).await??;
    let reply = match line.trim() {
        "stats" => source.stats(),
        other => serde_json::to_value(ErrorReply {
            error: &format!("unknown command '{other}'"),
        })?,
    };
    let mut text = serde_json::to_string(&reply)?;
    text.push('\n');
    write.write_all(text.as_bytes()).await?;
    Ok(())
}

/// Sends `command` to the mount at `mountpoint` and returns its JSON reply.
pub fn request(mountpoint: &Path, command: &str) -> anyhow::Result<serde_json::Value> {
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
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    writeln!(stream, "{command}")?;
    let mut line = String::new();
    std::io::BufReader::new(stream).read_line(&mut line)?;
    let value: serde_json::Value =
        serde_json::from_str(&line).context("the daemon sent an unreadable reply")?;
    if let Some(err) = value.get("error").and_then(|e| e.as_str()) {
        anyhow::bail!("{err}");
    }
    Ok(value)
}
