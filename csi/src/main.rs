//! `riffle-csi`: the rifflefs CSI node plugin binary.
//!
//! ```text
//! riffle-csi --endpoint unix:///csi/csi.sock --node-id NODE \
//!            --state-dir /var/lib/riffle-csi --cache-dir /mnt/nvme/riffle-cache
//! ```
//! Parses the command line, sets up logging (RUST_LOG, default info, to
//! stderr), starts the plugin with the real `riffle` mounter and runs until
//! SIGTERM or SIGINT. Stopping the plugin leaves mounts in place.

use anyhow::Context;
use clap::Parser;
use riffle_csi::riffle::RiffleMounter;
use riffle_csi::server::{self, PluginConfig};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(name = "riffle-csi", version, about = "CSI node plugin for rifflefs")]
struct Args {
    /// gRPC endpoint (unix socket) kubelet connects to.
    #[arg(long, env = "CSI_ENDPOINT", default_value = "unix:///csi/csi.sock")]
    endpoint: String,
    /// This node's name, reported by NodeGetInfo.
    #[arg(long, env = "NODE_ID")]
    node_id: String,
    /// Where volume records, credentials, pid files and daemon logs are kept
    /// (a hostPath, so that they survive the plugin's container).
    #[arg(
        long,
        env = "RIFFLE_CSI_STATE_DIR",
        default_value = "/var/lib/riffle-csi"
    )]
    state_dir: PathBuf,
    /// The node's shared block cache (NVMe hostPath); used by volumes that
    /// set cacheSize.
    #[arg(long, env = "RIFFLE_CSI_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
    /// The riffle binary (default: `riffle` next to this binary, else PATH).
    #[arg(long, env = "RIFFLE_BIN")]
    riffle_bin: Option<PathBuf>,
    /// Seconds between health checks of the mounts.
    #[arg(long, default_value_t = 5)]
    check_interval: u64,
    /// Seconds `riffle mount` may take to report a mount live.
    #[arg(long, default_value_t = 90)]
    mount_timeout: u64,
}

fn riffle_binary(explicit: Option<PathBuf>) -> PathBuf {
    if let Some(p) = explicit {
        return p;
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("riffle")))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("riffle"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    anyhow::ensure!(
        !args.node_id.trim().is_empty(),
        "--node-id must not be empty"
    );
    let socket = server::parse_endpoint(&args.endpoint)?;
    if let Some(dir) = &args.cache_dir {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create cache dir {}", dir.display()))?;
    }
    let mut mounter = RiffleMounter::new(riffle_binary(args.riffle_bin), args.cache_dir);
    mounter.mount_timeout = Duration::from_secs(args.mount_timeout);
    tracing::info!(
        version = riffle_csi::VERSION,
        riffle = %mounter.binary.display(),
        state_dir = %args.state_dir.display(),
        "starting riffle-csi"
    );
    let plugin = server::start(
        PluginConfig {
            socket,
            node_id: args.node_id,
            state_dir: args.state_dir,
            check_interval: Duration::from_secs(args.check_interval.max(1)),
        },
        Arc::new(mounter),
    )
    .await
    .context("cannot start the plugin")?;

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot install SIGTERM handler")?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: stopping (mounts stay)"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping (mounts stay)"),
    }
    plugin.stop().await.context("gRPC server failed")?;
    Ok(())
}
