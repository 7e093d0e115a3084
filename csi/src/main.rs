//! `riffle-csi`: the rifflefs CSI node plugin binary.
//!
//! ```text
//! riffle-csi --endpoint unix:///csi/csi.sock --node-id NODE \
//!            --state-dir /var/lib/riffle-csi \
//!            --mounter-socket /var/lib/riffle-csi/mounter/mounter.sock
//! ```
//! Parses the command line, sets up logging (RUST_LOG, default info, to
//! stderr), starts the plugin and runs until SIGTERM or SIGINT. Stopping the
//! plugin leaves mounts in place.
//!
//! With `--mounter-socket` (the Kubernetes deployment), the mount daemons run
//! in the `riffle-mounter` container and survive this container's restarts
//! ([`riffle_csi::remote`]). Without it, the plugin starts the daemons
//! itself, as children in their own sessions: they survive the plugin
//! process (a workstation, systemd) but not a container restart.

use anyhow::Context;
use clap::Parser;
use riffle_csi::grpc::server::{self, PluginConfig};
use riffle_csi::kube::access::AccessPolicy;
use riffle_csi::mounter::riffle::DaemonOptions;
use riffle_csi::mounter::Mounter;
use riffle_csi::remote::client::RemoteMounter;
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
    /// Where volume records, pid files and daemon logs are kept (a
    /// hostPath, so that they survive the plugin's container; the mounter
    /// must see it at the same path). Never a secret.
    #[arg(
        long,
        env = "RIFFLE_CSI_STATE_DIR",
        default_value = "/var/lib/riffle-csi"
    )]
    state_dir: PathBuf,
    /// Where volume secrets (keys, service account tokens) are kept for the
    /// daemons: a tmpfs (the plugin mounts one there if it is not), shared
    /// with riffle-mounter at the same path.
    #[arg(
        long,
        env = "RIFFLE_CSI_SECRETS_DIR",
        default_value = "/run/riffle-csi"
    )]
    secrets_dir: PathBuf,
    /// Let a volume with neither a secret nor a roleArn (an inline volume,
    /// say) read with the node's own credentials (the mounter's environment,
    /// the instance role). Off: such a publish is refused.
    #[arg(long, env = "RIFFLE_CSI_ALLOW_NODE_CREDENTIALS")]
    allow_node_credentials: bool,
    /// The audience of the pod service account token a roleArn volume uses;
    /// the CSIDriver's tokenRequests must name it.
    #[arg(long, env = "RIFFLE_CSI_TOKEN_AUDIENCE", default_value = riffle_csi::kube::access::DEFAULT_AUDIENCE)]
    token_audience: String,
    /// The riffle-mounter's socket: the daemons then run in the mounter's
    /// container, and --cache-dir, --riffle-bin and --mount-timeout are the
    /// mounter's to set.
    #[arg(long, env = "RIFFLE_CSI_MOUNTER_SOCKET")]
    mounter_socket: Option<PathBuf>,
    /// How daemons are run without --mounter-socket (with it, only
    /// --mount-timeout applies here: how long a mount request may take).
    #[command(flatten)]
    daemons: DaemonOptions,
    /// Seconds between health checks of the mounts.
    #[arg(long, default_value_t = 5)]
    check_interval: u64,
    /// Seconds to wait at start for a previous plugin to release the socket
    /// (a rollout that starts the new plugin first).
    #[arg(long, default_value_t = 300)]
    takeover_wait: u64,
}

/// The mounter the plugin uses: the remote one, or daemons of its own.
async fn mounter(args: &Args) -> anyhow::Result<Arc<dyn Mounter>> {
    let daemons = &args.daemons;
    if let Some(socket) = &args.mounter_socket {
        let remote = RemoteMounter::new(socket.clone(), Duration::from_secs(daemons.mount_timeout));
        match remote.ping().await {
            Ok((version, pid)) => {
                tracing::info!(socket = %socket.display(), %version, pid, "riffle-mounter answers")
            }
            Err(e) => tracing::warn!(
                error = %e,
                "riffle-mounter does not answer yet; publishes fail (kubelet retries) until it does"
            ),
        }
        if daemons.cache_dir.is_some() || daemons.riffle_bin.is_some() {
            tracing::warn!("--cache-dir and --riffle-bin are ignored with --mounter-socket: they are riffle-mounter's options");
        }
        return Ok(Arc::new(remote));
    }
    let local = daemons.mounter(&args.state_dir)?;
    if let Err(e) = riffle_csi::mounter::reaper::start() {
        tracing::warn!(error = %e, "cannot reap the daemons' processes (zombies stay until the container's init reaps them)");
    }
    tracing::info!(
        riffle = %local.binary.display(),
        "mount daemons run as children of this process (no --mounter-socket): they die with this container"
    );
    Ok(Arc::new(local))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    riffle_csi::startup::init_logging();
    let args = Args::parse();
    anyhow::ensure!(
        !args.node_id.trim().is_empty(),
        "--node-id must not be empty"
    );
    let socket = server::parse_endpoint(&args.endpoint)?;
    tracing::info!(
        version = riffle_csi::VERSION,
        state_dir = %args.state_dir.display(),
        "starting riffle-csi"
    );
    let mounter = mounter(&args).await?;
    let plugin = server::start(
        PluginConfig {
            socket,
            node_id: args.node_id,
            state_dir: args.state_dir,
            secrets_dir: args.secrets_dir,
            policy: AccessPolicy {
                allow_node_credentials: args.allow_node_credentials,
                token_audience: args.token_audience,
            },
            check_interval: Duration::from_secs(args.check_interval.max(1)),
            takeover_wait: Duration::from_secs(args.takeover_wait),
        },
        mounter,
    )
    .await
    .context("cannot start the plugin")?;

    let signal = riffle_csi::startup::stop_signal()
        .await
        .context("cannot wait for a stop signal")?;
    tracing::info!("{signal}: stopping (mounts stay)");
    plugin.stop().await.context("gRPC server failed")?;
    Ok(())
}
