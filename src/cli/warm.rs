//! `riffle plan` and `riffle warm`: steering a running mount's prefetcher.
//!
//! `riffle warm` starts a warm job in the daemon, then polls its progress over the control
//! socket and draws a progress bar (files, bytes, rate, ETA) on a terminal, or prints a plain
//! line every few seconds otherwise. Ctrl-C cancels the job (the mount is unaffected) and
//! exits with 130; stopping at the cache budget exits with 3 after saying how far it got.

use std::io::IsTerminal;
use std::path::{Component, Path};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use serde_json::json;

use super::args::{PlanArgs, WarmArgs};
use crate::control;

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

pub fn plan(args: &PlanArgs) -> anyhow::Result<()> {
    let text = match &args.file {
        Some(file) => Some(
            std::fs::read_to_string(file)
                .with_context(|| format!("cannot read {}", file.display()))?,
        ),
        None => None,
    };
    let reply = control::request_with(&args.mountpoint, "plan", Some(&json!({ "text": text })))?;
    match text {
        Some(_) => println!(
            "plan set: {} items",
            reply.get("items").and_then(|v| v.as_u64()).unwrap_or(0)
        ),
        None => println!("plan cleared"),
    }
    Ok(())
}

/// A path given on the command line, as a path relative to the mount root: an absolute one
/// inside the mountpoint, or a relative one, which is relative to the mount root (as the
/// help says), `.` being the root itself and `./sub` the same as `sub`.
fn relative_to_mount(mountpoint: &Path, path: &Path) -> anyhow::Result<String> {
    let rel = if path.is_absolute() {
        let mount = std::fs::canonicalize(mountpoint)
            .with_context(|| format!("cannot resolve {}", mountpoint.display()))?;
        path.strip_prefix(&mount)
            .or_else(|_| path.strip_prefix(mountpoint))
            .map_err(|_| anyhow!("{} is not inside {}", path.display(), mountpoint.display()))?
    } else {
        path
    };
    let mut parts: Vec<String> = Vec::new();
    for c in rel.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if parts.pop().is_none() {
                    bail!("{} leaves the mount", path.display());
                }
            }
            Component::Normal(name) => parts.push(name.to_string_lossy().into_owned()),
            Component::RootDir | Component::Prefix(_) => {}
        }
    }
    Ok(parts.join("/"))
}

pub fn warm(args: &WarmArgs) -> anyhow::Result<()> {
    let paths = args
        .paths
        .iter()
        .map(|p| relative_to_mount(&args.mountpoint, p))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let reply = control::request_with(&args.mountpoint, "warm", Some(&json!({ "paths": paths })))?;
    let id = reply
        .get("id")
        .and_then(|v| v.as_u64())
        .ok_or_else(|| anyhow!("the daemon did not start a warm job"))?;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t);
    }
    let mut view = View::new();
    let mut cancelled = false;
    loop {
        if INTERRUPTED.load(Ordering::SeqCst) && !cancelled {
            cancelled = true;
            let _ =
                control::request_with(&args.mountpoint, "warm-cancel", Some(&json!({ "id": id })));
        }
        let p = control::request_with(&args.mountpoint, "warm-status", Some(&json!({ "id": id })))?;
        let phase = p.get("phase").and_then(|v| v.as_str()).unwrap_or("");
        view.show(&p);
        match phase {
            "listing" | "fetching" => std::thread::sleep(Duration::from_millis(200)),
            "done" => {
                view.finish(&p);
                return Ok(());
            }
            "stopped" => {
                view.finish(&p);
                eprintln!("riffle: {}", message(&p));
                std::process::exit(3);
            }
            "cancelled" => {
                view.finish(&p);
                eprintln!("riffle: warm cancelled; the mount is unaffected");
                std::process::exit(130);
            }
            _ => {
                view.finish(&p);
                bail!("warm failed: {}", message(&p));
            }
        }
    }
}

fn message(p: &serde_json::Value) -> String {
    p.get("message")
        .and_then(|m| m.as_str())
        .unwrap_or("no reason given")
        .to_string()
}

fn num(p: &serde_json::Value, key: &str) -> u64 {
    p.get(key).and_then(|v| v.as_u64()).unwrap_or(0)
}

/// A progress bar on a terminal, plain lines elsewhere.
struct View {
    bar: Option<indicatif::ProgressBar>,
    last_line: Instant,
}

impl View {
    fn new() -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new(0);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} ETA {eta} {msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar
        });
        View {
            bar,
            last_line: Instant::now(),
        }
    }

    fn show(&mut self, p: &serde_json::Value) {
        let (files, files_total) = (num(p, "files_done"), num(p, "files_total"));
        let (bytes, bytes_total) = (num(p, "bytes_done"), num(p, "bytes_total"));
        match &self.bar {
            Some(bar) => {
                bar.set_length(bytes_total);
                bar.set_position(bytes);
                bar.set_message(format!("{files}/{files_total} files"));
            }
            None => {
                if self.last_line.elapsed() >= Duration::from_secs(2) {
                    self.last_line = Instant::now();
                    eprintln!("{}", line(p));
                }
            }
        }
    }

    fn finish(&mut self, p: &serde_json::Value) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        println!("{}", line(p));
    }
}

/// `warm: 120/2000 files, 13.2/220.0 MB, 45.1 MB/s, ETA 4 s`
fn line(p: &serde_json::Value) -> String {
    let (files, files_total) = (num(p, "files_done"), num(p, "files_total"));
    let (bytes, bytes_total) = (num(p, "bytes_done"), num(p, "bytes_total"));
    let elapsed = p
        .get("elapsed_seconds")
        .and_then(|v| v.as_f64())
        .unwrap_or(0.0)
        .max(1e-3);
    let rate = bytes as f64 / elapsed;
    let eta = if rate > 0.0 {
        format!("{:.0} s", bytes_total.saturating_sub(bytes) as f64 / rate)
    } else {
        "?".into()
    };
    format!(
        "warm: {files}/{files_total} files, {:.1}/{:.1} MB, {:.1} MB/s, ETA {eta}, {:.1} s elapsed",
        bytes as f64 / 1e6,
        bytes_total as f64 / 1e6,
        rate / 1e6,
        elapsed
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_relative_to_the_mount_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mnt = std::fs::canonicalize(dir.path()).expect("canonical");
        let rel = |p: &str| {
            let p = p.replace("MNT", &mnt.to_string_lossy());
            relative_to_mount(&mnt, Path::new(&p)).map_err(|e| e.to_string())
        };
        assert_eq!(rel(".").as_deref(), Ok(""));
        assert_eq!(rel("./").as_deref(), Ok(""));
        assert_eq!(rel("./sub").as_deref(), Ok("sub"));
        assert_eq!(rel("sub/./x/").as_deref(), Ok("sub/x"));
        assert_eq!(rel("a/../b").as_deref(), Ok("b"));
        assert_eq!(rel("MNT/sub/x").as_deref(), Ok("sub/x"));
        assert_eq!(rel("MNT").as_deref(), Ok(""));
        assert_eq!(rel("MNT/./sub").as_deref(), Ok("sub"));
        assert!(rel("..").is_err_and(|e| e.contains("leaves the mount")));
        assert!(rel("/elsewhere/x").is_err_and(|e| e.contains("is not inside")));
    }
}
