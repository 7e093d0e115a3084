//! `riffle-bench`: dataset generator, readers and report of the rifflefs
//! benchmarks (see `benches/README.md` and `benches/run.sh`).
//!
//! Each subcommand lives in its own module; this file only parses the
//! command line and maps results to exit codes: 0 when everything read was
//! right, 1 on any wrong byte (W4: a wrong count or size), 2 on I/O errors
//! without wrong bytes (W4: also a pass stopped at its time limit).

mod copy;
mod gen;
mod list_s3;
mod plan;
mod proxy_stats;
mod read_fs;
mod read_s3;
mod record;
mod report;
mod walk;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use riffle_bench::listing::ListPass;
use riffle_bench::outcome::Outcome;

#[derive(Debug, Parser)]
#[command(name = "riffle-bench", version, about = "rifflefs benchmark harness")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Generate a standard dataset, upload what is missing, write its manifest
    Gen(gen::Args),
    /// Read a dataset straight from the store with a parallel S3 client
    #[command(name = "read-s3")]
    ReadS3(read_s3::Args),
    /// Read a dataset through a file system with a standard access pattern
    #[command(name = "read-fs")]
    ReadFs(read_fs::Args),
    /// Copy a dataset from the store to local disk (copy-first baseline)
    Copy(copy::Args),
    /// Print the epoch plan of a read-fs epoch (paths in the order it opens them)
    Plan(plan::Args),
    /// List a dataset straight from the store with a parallel S3 client (W4)
    #[command(name = "list-s3")]
    ListS3(list_s3::Args),
    /// Walk a mount with find, counting the files (and with --stat their sizes) (W4)
    Walk(walk::Args),
    /// Print (or reset) a riffle-proxy's counters through its control endpoint
    #[command(name = "proxy-stats")]
    ProxyStats(proxy_stats::Args),
    /// Append a result record to a run file (used by benches/run.sh)
    #[command(subcommand)]
    Record(record::Command),
    /// Merge a run into benches/results and write benches/README.md
    Report(report::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Gen(a) => gen::run(a).map(|()| ExitCode::SUCCESS),
        Command::ReadS3(a) => read_s3::run(a),
        Command::ReadFs(a) => read_fs::run(a),
        Command::Copy(a) => copy::run(a),
        Command::ListS3(a) => list_s3::run(a),
        Command::Walk(a) => walk::run(a),
        Command::Plan(a) => plan::run(a).map(|()| ExitCode::SUCCESS),
        Command::ProxyStats(a) => proxy_stats::run(a).map(|()| ExitCode::SUCCESS),
        Command::Record(c) => record::run(c).map(|()| ExitCode::SUCCESS),
        Command::Report(a) => report::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("riffle-bench: error: {e:#}");
            ExitCode::from(3)
        }
    }
}

/// A tokio runtime sized for this 2-core machine's share.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

/// Prints a W4 pass as JSON (stdout, and `json_out` when given) and maps it
/// to the exit code ([`ListPass::exit_code`]).
fn emit_list(pass: &ListPass, json_out: Option<&std::path::Path>) -> anyhow::Result<ExitCode> {
    let json = serde_json::to_string(pass)?;
    println!("{json}");
    if let Some(p) = json_out {
        std::fs::write(p, format!("{json}\n"))
            .map_err(|e| anyhow::anyhow!("write {}: {e}", p.display()))?;
    }
    for p in &pass.problems {
        eprintln!("{p}");
    }
    if let Some(s) = pass.timed_out_s {
        eprintln!(
            "riffle-bench: {} stopped at its time limit after {s:.0} s ({} of {} objects)",
            pass.tool, pass.objects, pass.expected_objects
        );
    }
    Ok(ExitCode::from(pass.exit_code()))
}

/// Prints `outcome` as JSON (stdout, and `json_out` when given) and maps it
/// to the exit code.
fn emit(outcome: &Outcome, json_out: Option<&std::path::Path>) -> anyhow::Result<ExitCode> {
    let json = serde_json::to_string(outcome)?;
    println!("{json}");
    if let Some(p) = json_out {
        std::fs::write(p, format!("{json}\n"))
            .map_err(|e| anyhow::anyhow!("write {}: {e}", p.display()))?;
    }
    for p in &outcome.problems {
        eprintln!("{p}");
    }
    Ok(if outcome.mismatches > 0 {
        eprintln!(
            "riffle-bench: {} reads returned WRONG BYTES",
            outcome.mismatches
        );
        ExitCode::from(1)
    } else if outcome.errors > 0 {
        eprintln!("riffle-bench: {} I/O errors", outcome.errors);
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}
