//! `riffle-proxy`: the S3 latency/fault proxy as a process.
//!
//! Prints `listening on ADDR` (and `control on ADDR` with `--control`) as the
//! first stdout lines so scripts can read the ports chosen for port 0, logs
//! to stderr (`RUST_LOG`, default `info`), and on SIGINT/SIGTERM drains open
//! connections, prints `stats {JSON}` as the last stdout line and exits 0.

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use riffle_bench::proxy::{FaultRule, Latency, ProxyConfig, ProxyHandle};
use tokio::signal::unix::{signal, SignalKind};
use tracing_subscriber::EnvFilter;

/// A transparent HTTP/1.1 proxy in front of an S3 server that adds
/// first-byte latency and a per-connection bandwidth cap, counts requests,
/// and injects faults on demand.
#[derive(Debug, Parser)]
#[command(name = "riffle-proxy", version)]
struct Args {
    /// Address to accept S3 clients on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,

    /// The S3 server, http://host:port.
    #[arg(long, default_value = "http://127.0.0.1:7480")]
    upstream: String,

    /// Address of the JSON control endpoint (port 0 picks a free port).
    #[arg(long)]
    control: Option<SocketAddr>,

    /// Delay added before every response head, in milliseconds.
    #[arg(long, default_value_t = Latency::STANDARD.first_byte_delay_ms)]
    first_byte_delay_ms: u64,

    /// Response body rate cap per connection in MB/s (10^6 bytes/s); 0 = unlimited.
    #[arg(long, default_value_t = Latency::STANDARD.bandwidth_mbps)]
    bandwidth_mbps: f64,

    /// No added latency and no bandwidth cap (overrides the two above).
    #[arg(long)]
    no_delay: bool,

    /// A fault rule active from the start; repeatable. JSON
    /// ('{"fault":"stall","ms":5000}') or compact
    /// ('stall,ms=5000,every_nth=3,kind=get_range,key_contains=shard').
    #[arg(long = "fault", value_name = "SPEC", value_parser = parse_fault)]
    faults: Vec<FaultRule>,

    /// Seed for probabilistic faults.
    #[arg(long)]
    seed: Option<u64>,

    /// Count GETs per bucket/key (reported as get_keys in /stats).
    #[arg(long)]
    count_keys: bool,

    /// Seconds to let open connections finish on shutdown.
    #[arg(long, default_value_t = 5)]
    drain_timeout_secs: u64,
}

fn parse_fault(spec: &str) -> Result<FaultRule, String> {
    FaultRule::parse(spec).map_err(|e| e.to_string())
}

impl Args {
    fn config(&self) -> ProxyConfig {
        let latency = if self.no_delay {
            Latency::NONE
        } else {
            Latency {
                first_byte_delay_ms: self.first_byte_delay_ms,
                bandwidth_mbps: self.bandwidth_mbps,
            }
        };
        ProxyConfig {
            listen: self.listen,
            upstream: self.upstream.clone(),
            control: self.control,
            latency,
            faults: self.faults.clone(),
            seed: self.seed,
            count_keys: self.count_keys,
            drain_timeout: Duration::from_secs(self.drain_timeout_secs),
        }
    }
}

/// Installs the SIGINT/SIGTERM handlers now; the future resolves on the
/// first of them.
fn termination() -> anyhow::Result<impl std::future::Future<Output = &'static str>> {
    let mut int = signal(SignalKind::interrupt()).context("install SIGINT handler")?;
    let mut term = signal(SignalKind::terminate()).context("install SIGTERM handler")?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => "SIGINT",
            _ = term.recv() => "SIGTERM",
        }
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let args = Args::parse();
    let terminated = termination()?;
    let proxy = ProxyHandle::start(args.config())
        .await
        .context("starting the proxy")?;

    let mut out = std::io::stdout().lock();
    writeln!(out, "listening on {}", proxy.addr())?;
    if let Some(control) = proxy.control_addr() {
        writeln!(out, "control on {control}")?;
    }
    out.flush()?;
    drop(out);

    let signal = terminated.await;
    tracing::info!(signal, "shutting down");
    let stats = proxy.shutdown().await;
    let mut out = std::io::stdout().lock();
    writeln!(out, "stats {}", serde_json::to_string(&stats)?)?;
    out.flush()?;
    Ok(())
}
