//! The `riffle` command line: `mount` and `unmount`.
//!
//! `riffle mount` validates everything it can before touching the mountpoint, then (unless
//! `--foreground`) starts itself again as a detached daemon and waits on a pipe until the
//! daemon reports "mounted" or a one-line reason, so the command returns only once the mount
//! is live or has failed, never in between and never hanging (every step has a timeout).

mod adoption;
pub(crate) mod args;
mod daemon;
pub mod failure;
mod fd_limit;
mod fd_store;
mod fstab;
mod keeper;
mod log_limit;
mod logging;
mod memory_limit;
mod mount;
pub mod size;
pub(crate) mod source;
mod stats;
mod systemd;
mod unmount;
pub mod volume_options;
mod warm;

use clap::Parser;

pub(crate) use args::{Cli, Command};

/// Entry point of the `riffle` binary; returns the process exit code.
pub fn main() -> i32 {
    crate::heap_trim::limit_arenas();
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if fstab::is_helper_form(&argv) {
        let lossy = argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        match fstab::rewrite(lossy) {
            Ok(rewritten) => argv = rewritten.into_iter().map(Into::into).collect(),
            Err(e) => {
                eprintln!("riffle: {e}");
                return 2;
            }
        }
    }
    let cli = match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help and --version
            let _ = e.print();
            return 0;
        }
        Err(e) => {
            eprintln!("riffle: {} (see riffle --help)", args::clap_one_line(&e));
            return 2;
        }
    };
    let result = match cli.command {
        Command::Mount(args) => mount::run(*args),
        Command::Unmount(args) => unmount::run(&args),
        Command::Stats(args) => stats::run(&args),
        Command::Cache(cmd) => stats::cache(&cmd),
        Command::Plan(args) => warm::plan(&args),
        Command::Warm(args) => warm::warm(&args),
        Command::FdStore(args) => fd_store::run(&args),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("riffle: {}", one_line(&e));
            exit_status(&e)
        }
    }
}

pub use failure::{fail, Failure, FailureKind};

/// `riffle mount --take-over` exits with this when the fd store holds no live connection for
/// the mountpoint (nothing was mounted): the one failure after which mounting afresh is
/// right. The other statuses are [`FailureKind`]'s.
pub const EXIT_NOTHING_TO_TAKE_OVER: i32 = FailureKind::NothingToTakeOver.exit_code();

/// The exit status for `e`.
fn exit_status(e: &anyhow::Error) -> i32 {
    failure::kind_of(e).exit_code()
}

/// An error and its causes on one line.
pub fn one_line(e: &anyhow::Error) -> String {
    let mut text = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !text.contains(&c) {
            text.push_str(": ");
            text.push_str(&c);
        }
    }
    text.replace('\n', " ")
}
