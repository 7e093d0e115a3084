//! The subreaper of riffle-mounter ([`riffle_csi::mounter::reaper`]): orphans are reaped and counted,
//! children that tokio waits for are left to it. A test binary of its own, since becoming a
//! subreaper changes the whole process.

use riffle_csi::mounter::reaper;
use std::time::Duration;

#[tokio::test]
async fn orphans_are_reaped_and_owned_children_left_to_tokio() {
    reaper::start().expect("become a subreaper");
    let before = reaper::exited();
    // sh starts a sleeper and exits at once: the sleeper is reparented to this process, and
    // must be reaped when it ends (no zombie), while sh's own status goes to tokio.
    let mut cmd = tokio::process::Command::new("sh");
    cmd.args(["-c", "sleep 0.2 & echo $!"])
        .stdout(std::process::Stdio::piped());
    let (child, guard) = reaper::spawn(&mut cmd).expect("spawn sh");
    let out = child.wait_with_output().await.expect("sh's status");
    drop(guard);
    assert!(out.status.success());
    let orphan: i32 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("pid");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while reaper::exited() == before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the orphan was never reaped"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !std::path::Path::new(&format!("/proc/{orphan}")).exists(),
        "the orphan {orphan} is gone, not a zombie"
    );
    // A child spawned through the registry keeps its exit status for tokio.
    let mut cmd = tokio::process::Command::new("sh");
    cmd.args(["-c", "sleep 0.3; exit 7"]);
    let (mut child, guard) = reaper::spawn(&mut cmd).expect("spawn sh");
    assert_eq!(child.wait().await.expect("status").code(), Some(7));
    drop(guard);
}
