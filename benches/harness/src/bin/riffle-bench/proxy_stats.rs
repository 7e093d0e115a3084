//! `riffle-bench proxy-stats`: a `riffle-proxy`'s counters over its control
//! endpoint (`GET /stats`, or `POST /stats/reset` with `--reset`), so
//! `benches/run.sh` counts the GETs of each epoch at the store side without
//! needing curl.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use riffle_bench::proxy::ControlClient;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The proxy's control address (HOST:PORT, its `control on` line)
    #[arg(long)]
    control: String,
    /// Zero the counters (prints them as they were)
    #[arg(long)]
    reset: bool,
    /// Write the JSON here instead of stdout
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let addr = a
        .control
        .parse()
        .with_context(|| format!("control address {}", a.control))?;
    let client = ControlClient::new(addr);
    let stats = if a.reset {
        client.reset_stats()
    } else {
        client.stats()
    }
    .with_context(|| format!("proxy control {}", a.control))?;
    let json = serde_json::to_string(&stats)? + "\n";
    match &a.out {
        Some(p) => std::fs::write(p, json).with_context(|| format!("write {}", p.display()))?,
        None => std::io::stdout().lock().write_all(json.as_bytes())?,
    }
    Ok(())
}
