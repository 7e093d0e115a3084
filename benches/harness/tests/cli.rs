//! The `riffle-proxy` binary as a separate process: start-up lines, faults
//! from flags, the blocking control client, and SIGTERM shutdown.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};

use common::{call, pattern, FakeUpstream};
use riffle_bench::proxy::{ControlClient, FaultRule, StatsSnapshot};

fn addr_after(line: &str, prefix: &str) -> SocketAddr {
    line.strip_prefix(prefix)
        .unwrap_or_else(|| panic!("{line:?} does not start with {prefix:?}"))
        .trim()
        .parse()
        .expect("address")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_serves_steers_and_stops_on_sigterm() {
    let upstream = FakeUpstream::start().await;
    upstream.put("bucket/k", pattern(4096, 1));
    let mut child = Command::new(env!("CARGO_BIN_EXE_riffle-proxy"))
        .args(["--listen", "127.0.0.1:0", "--control", "127.0.0.1:0"])
        .args(["--upstream", &upstream.url(), "--no-delay", "--count-keys"])
        .args(["--fault", "http500,limit=1,kind=get_object"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn riffle-proxy");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut next_line = move || lines.next().expect("a line").expect("read line");
    let proxy = addr_after(&next_line(), "listening on ");
    let control = ControlClient::new(addr_after(&next_line(), "control on "));

    assert_eq!(call(proxy, "GET", "/bucket/k", &[]).await.status, 500);
    let r = call(proxy, "GET", "/bucket/k", &[]).await;
    assert_eq!((r.status, r.body.len()), (200, 4096));

    let stats = tokio::task::spawn_blocking(move || {
        control
            .set_faults(&[FaultRule::slowdown503()])
            .expect("set faults");
        control.stats().expect("stats")
    })
    .await
    .expect("control");
    assert_eq!(stats.faults_injected.http500, 1);
    assert_eq!(stats.requests.get_object, 2);
    assert_eq!(
        stats.get_keys.and_then(|k| k.get("bucket/k").copied()),
        Some(2)
    );
    assert_eq!(call(proxy, "GET", "/bucket/k", &[]).await.status, 503);

    let pid = i32::try_from(child.id()).expect("pid");
    // SAFETY: kill(2) on our own child's pid has no memory-safety impact.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let last = tokio::task::spawn_blocking(next_line)
        .await
        .expect("read stats line");
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status:?}");
    let final_stats: StatsSnapshot =
        serde_json::from_str(last.strip_prefix("stats ").expect("stats line")).expect("JSON");
    assert_eq!(final_stats.requests.get_object, 3);
    assert_eq!(final_stats.faults_injected.slowdown503, 1);
}

#[test]
fn bad_fault_flag_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_riffle-proxy"))
        .args(["--fault", "stall"])
        .output()
        .expect("run riffle-proxy");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("stall needs ms"), "{err}");
}
