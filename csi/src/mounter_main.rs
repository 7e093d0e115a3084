//! `riffle-mounter`: holds the rifflefs mount daemons of a node, so that
//! they outlive restarts of the `riffle-csi` plugin's container.
//!
//! ```text
//! riffle-mounter --socket /var/lib/riffle-csi/mounter/mounter.sock \
//!                --cache-dir /var/cache/riffle
//! ```
//! Serves the plugin's mount, unmount and health requests on a root-only
//! unix socket ([`riffle_csi::remote`]) and runs `riffle mount` for them;
//! the daemons are this container's processes. It keeps no state of its own
//! (the plugin's records are the truth) and stops on SIGTERM/SIGINT without
//! touching the daemons; but a container runtime stopping this container
//! kills them, which is why its DaemonSet is updated only `OnDelete`.

use anyhow::Context;
use clap::Parser;
use riffle_csi::remote::service;
use riffle_csi::riffle::{riffle_binary, RiffleMounter};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(
    name = "riffle-mounter",
    version,
    about = "Runs rifflefs mount daemons for the riffle-csi plugin"
)]
struct Args {
    /// The unix socket the plugin connects to (created mode 0600).
    #[arg(
        long,
        env = "RIFFLE_MOUNTER_SOCKET",
        default_value = "/var/lib/riffle-csi/mounter/mounter.sock"
    )]
    socket: PathBuf,
    /// The node's shared block cache (NVMe hostPath); used by volumes that
    /// set cacheSize.
    #[arg(long, env = "RIFFLE_CSI_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
    /// The riffle binary (default: `riffle` next to this binary, else PATH).
    #[arg(long, env = "RIFFLE_BIN")]
    riffle_bin: Option<PathBuf>,
    /// Seconds `riffle mount` may take to report a mount live.
    #[arg(long, default_value_t = 90)]
    mount_timeout: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    riffle_csi::old_clients::init_logging();
    let args = Args::parse();
    if let Some(dir) = &args.cache_dir {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create cache dir {}", dir.display()))?;
    }
    let mut mounter = RiffleMounter::new(riffle_binary(args.riffle_bin), args.cache_dir);
    mounter.mount_timeout = Duration::from_secs(args.mount_timeout);
    tracing::info!(
        version = riffle_csi::VERSION,
        riffle = %mounter.binary.display(),
        "starting riffle-mounter"
    );
    let running = service::start(&args.socket, Arc::new(mounter))
        .await
        .context("cannot start riffle-mounter")?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot install SIGTERM handler")?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: no longer serving (daemons are left running)"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: no longer serving (daemons are left running)"),
    }
    running.stop().await;
    Ok(())
}
