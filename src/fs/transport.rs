//! How requests travel between the kernel and the daemon: `/dev/fuse` reads and writes, or
//! FUSE over io_uring (Linux 6.14+), and what `riffle stats` says about it
//! (`fuse.transport`, `fuse.ring_requests`).
//!
//! Over `/dev/fuse` each request costs the daemon a `read` and a `writev`; over the ring the
//! answer to one request and the wait for the next are one submission, and the kernel queues
//! each request on the ring of its caller's CPU (fuser's `uring` module has the layout and the
//! memory it takes). The ring is chosen at start:
//! - `auto` (the default) takes the rings where the kernel offers them (the switch
//!   `ENABLE_URING` is on and this process may make an io_uring: [`kernel_offers_ring`]) and
//!   no keeper holds the connection, else `/dev/fuse`;
//! - `io-uring` asks for the rings (where no keeper holds the connection), and the mount fails
//!   with the reason when they cannot be had;
//! - `dev-fuse` never asks for it.
//!
//! A connection a keeper holds (`--restart`, every CSI volume) stays on `/dev/fuse`: the
//! kernel cannot give a successor the requests held in a dead daemon's ring entries
//! (`FUSE_NOTIFY_RESEND` requeues the `/dev/fuse` processing lists only), so a crash would
//! leave those reads waiting forever.

use std::sync::Arc;

use parking_lot::Mutex;

/// The kernel's switch for FUSE over io_uring (off by default even where it is built).
pub const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Whether this kernel lets this process serve FUSE over io_uring; the reason when not.
///
/// Asked before INIT, because INIT decides for good: once a connection negotiated
/// `FUSE_OVER_IO_URING`, the kernel holds every request until all the rings are registered,
/// so a server that then cannot make its rings leaves every caller waiting. Hence the switch,
/// and a ring made the way the queues make theirs (128-byte SQEs): a container runtime's
/// default seccomp profile or `kernel.io_uring_disabled` refuses `io_uring_setup`.
pub fn kernel_offers_ring() -> Result<(), String> {
    match std::fs::read_to_string(ENABLE_URING) {
        Ok(v) if v.trim() == "Y" || v.trim() == "1" => {
            io_uring::IoUring::<io_uring::squeue::Entry128, io_uring::cqueue::Entry>::builder()
                .build(4)
                .map(drop)
                .map_err(|e| {
                    format!(
                        "this process may not use io_uring ({e}: a seccomp profile such as a \
                         container runtime's default, or kernel.io_uring_disabled)"
                    )
                })
        }
        Ok(_) => Err(format!(
            "the kernel's FUSE io_uring is off (as root: echo Y > {ENABLE_URING})"
        )),
        Err(_) => Err(format!(
            "this kernel has no FUSE io_uring (Linux {} lacks {ENABLE_URING}; it needs 6.14+ \
             built with CONFIG_FUSE_IO_URING)",
            super::kernel_release()
        )),
    }
}

/// What the mount's transport is, for `riffle stats`.
#[derive(Debug, Default)]
pub struct TransportStatus {
    /// Set once the session runs with rings negotiated.
    ring: Mutex<Option<Arc<fuser::UringStatus>>>,
    /// Why the mount reads `/dev/fuse` (when it has no rings), or why they are not ready.
    why_dev_fuse: Mutex<String>,
}

impl TransportStatus {
    /// The mount has rings (INIT negotiated them).
    pub fn rings(&self, status: Arc<fuser::UringStatus>) {
        *self.ring.lock() = Some(status);
    }

    /// The mount reads `/dev/fuse`, because `why`.
    pub fn dev_fuse(&self, why: impl Into<String>) {
        *self.why_dev_fuse.lock() = why.into();
    }

    /// `fuse.transport`: the transport in use and its shape, or why it is `/dev/fuse`.
    pub fn describe(&self) -> String {
        match &*self.ring.lock() {
            Some(ring) if ring.ready() => format!(
                "io_uring: {} queues of {} entries ({} KiB payloads){}",
                ring.queues(),
                ring.entries(),
                ring.payload_bytes() / 1024,
                match ring.lost_entries() {
                    0 => String::new(),
                    n => format!("; {n} entries refused by the kernel and registered again"),
                }
            ),
            Some(ring) => format!(
                "/dev/fuse: io_uring not ready ({} of {} queues registered{})",
                ring.registered(),
                ring.queues(),
                ring.error().map(|e| format!("; {e}")).unwrap_or_default()
            ),
            None => format!("/dev/fuse: {}", self.why_dev_fuse.lock()),
        }
    }

    /// `fuse.ring_entries_busy`: ring entries holding a request not answered yet.
    pub fn ring_entries_busy(&self) -> usize {
        self.ring.lock().as_ref().map_or(0, |r| r.busy())
    }

    /// `fuse.ring_requests`: requests that came over the rings.
    pub fn ring_requests(&self) -> u64 {
        self.ring.lock().as_ref().map_or(0, |r| r.requests())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_rings_the_reason_is_shown() {
        let t = TransportStatus::default();
        t.dev_fuse("asked for (--fuse-transport dev-fuse)");
        assert_eq!(
            t.describe(),
            "/dev/fuse: asked for (--fuse-transport dev-fuse)"
        );
        assert_eq!(t.ring_requests(), 0);
    }

    #[test]
    fn rings_that_did_not_register_say_so() {
        let t = TransportStatus::default();
        t.rings(Arc::new(fuser::UringStatus::default()));
        assert!(t
            .describe()
            .starts_with("/dev/fuse: io_uring not ready (0 of 0"));
    }

    /// A process that may not use io_uring (a container's default seccomp profile) is never
    /// offered the rings: negotiated at INIT, they would leave every request waiting.
    #[test]
    fn a_process_refused_io_uring_is_not_offered_the_rings() {
        if !std::fs::read_to_string(ENABLE_URING).is_ok_and(|v| v.trim() == "Y") {
            eprintln!("skipping: the kernel's FUSE io_uring is off or absent ({ENABLE_URING})");
            return;
        }
        assert_eq!(kernel_offers_ring(), Ok(()), "offered without a filter");
        std::thread::spawn(|| {
            crate::cache::ring::tests::refuse_io_uring_setup_on_this_thread();
            let why = kernel_offers_ring().expect_err("offered under a filter refusing io_uring");
            assert!(
                why.starts_with("this process may not use io_uring"),
                "{why}"
            );
        })
        .join()
        .expect("the test thread");
    }
}
