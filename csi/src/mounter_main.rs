//! `riffle-mounter`: holds the rifflefs mount daemons of a node, so that
//! they outlive restarts of the `riffle-csi` plugin's container.
//!
//! ```text
//! riffle-mounter --socket /var/lib/riffle-csi/mounter/mounter.sock \
//!                --cache-dir /var/cache/riffle
//! ```
//! Serves the plugin's mount, unmount and health requests on a root-only
//! unix socket ([`riffle_csi::remote`]) and runs `riffle mount` for them;
//! the daemons are this container's processes. The daemons' logs are forwarded to its
//! standard output ([`riffle_csi::log_forward`]). It keeps no state of its own
//! (the plugin's records are the truth) and stops on SIGTERM/SIGINT without
//! touching the daemons. A container runtime stopping this container kills
//! them; with `--fd-store` (the node's `riffle fd-store`, in the plugin's
//! pod) their FUSE connections live on there, pods' reads wait, and the
//! plugin has the next mounter start daemons that take the mounts over
//! (rollouts, crashes and OOM kills cost no read). A new mounter started
//! while the old one still serves waits for its socket.
//!
//! With `--peer-service` (the headless Service of `deploy/kubernetes/peers.yaml`),
//! `--peer-address` (the pod IP) and the Secret's file at `--peer-secret-file`, every
//! daemon also joins the ring of the nodes that mount the same data, on that ring's port of
//! `--peer-ports` ([`riffle_csi::mounter::peers`]).

use anyhow::Context;
use clap::Parser;
use riffle_csi::mounter::metrics;
use riffle_csi::mounter::riffle::DaemonOptions;
use riffle_csi::remote::service;
use std::path::PathBuf;
use std::sync::Arc;

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
    /// Where the plugin has the daemons write their logs; new lines are forwarded to this
    /// program's standard output as `[volume <key>] ...` (`kubectl logs`).
    #[arg(
        long,
        env = "RIFFLE_MOUNTER_LOGS_DIR",
        default_value = "/var/lib/riffle-csi/logs"
    )]
    logs_dir: PathBuf,
    /// Do not forward the daemons' logs to standard output.
    #[arg(long, env = "RIFFLE_MOUNTER_NO_LOG_FORWARDING")]
    no_log_forwarding: bool,
    /// Serve every volume daemon's Prometheus metrics on http://HOST:PORT/metrics, each
    /// series labelled with its volume ([`riffle_csi::mounter::metrics`]).
    #[arg(long, env = "RIFFLE_MOUNTER_METRICS_ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// The plugin's state directory, whose volume records name the volumes (for the metrics).
    #[arg(
        long,
        env = "RIFFLE_CSI_STATE_DIR",
        default_value = "/var/lib/riffle-csi"
    )]
    state_dir: PathBuf,
    #[command(flatten)]
    daemons: DaemonOptions,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    riffle_csi::startup::init_logging();
    let args = Args::parse();
    let shares_dir = args
        .socket
        .parent()
        .map_or_else(|| args.state_dir.clone(), std::path::Path::to_path_buf);
    let mounter = args.daemons.mounter(&shares_dir)?;
    // Keepers are orphans by design (`riffle mount` exits once the mount is live): this
    // process reaps them, and a daemon whose keeper died, and tells the plugin they ended.
    if let Err(e) = riffle_csi::mounter::reaper::start() {
        tracing::warn!(error = %e, "cannot reap the daemons' processes (zombies stay until the container's init reaps them)");
    }
    tracing::info!(
        version = riffle_csi::VERSION,
        riffle = %mounter.binary.display(),
        "starting riffle-mounter"
    );
    if !args.no_log_forwarding {
        tokio::spawn(riffle_csi::log_forward::LogForwarder::new(&args.logs_dir).run());
    }
    // Metrics are optional: a busy port is logged, and mounts are served all the same.
    let _metrics = match args.metrics_addr {
        Some(addr) => {
            let proxy = Arc::new(metrics::MetricsProxy::new(&args.state_dir));
            metrics::serve(addr, proxy)
                .await
                .map_err(|e| tracing::error!(error = %e, "no metrics endpoint"))
                .ok()
        }
        None => None,
    };
    let running = service::start(&args.socket, Arc::new(mounter))
        .await
        .context("cannot start riffle-mounter")?;
    let signal = riffle_csi::startup::stop_signal()
        .await
        .context("cannot wait for a stop signal")?;
    tracing::info!("{signal}: no longer serving (daemons are left running)");
    running.stop().await;
    Ok(())
}
