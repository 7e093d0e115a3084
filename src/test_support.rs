//! Helpers shared by the unit tests.

use std::time::{Duration, Instant};

/// How long a test waits for background work before calling it stuck. Generous on purpose:
/// the bound only turns a hang into a failure, so it must not fire on a slow, loaded machine
/// (disk writes behind a busy virtual disk have taken seconds).
const PATIENCE: Duration = Duration::from_secs(60);

/// Polls `cond` until it holds; panics naming `what` if it never does.
pub async fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
