//! rifflefs patch: FUSE over io_uring (Linux 6.14+, `CONFIG_FUSE_IO_URING`, on once root
//! writes `Y` to `/sys/module/fuse/parameters/enable_uring`).
//!
//! With `/dev/fuse` every request costs the server two system calls, a `read` that takes it
//! and a `writev` that answers it, each a switch into the kernel and a copy. Over the ring the
//! answer to one request and the wait for the next are one submission
//! (`FUSE_IO_URING_CMD_COMMIT_AND_FETCH`), and the kernel queues each request on the ring of
//! the CPU its caller runs on, served by a thread pinned there.
//!
//! Layout: one queue per possible CPU (the kernel's count, `num_possible_cpus()`; it switches
//! the connection to the ring only once every queue has an armed entry), each with
//! [`UringOptions::queue_depth`] entries of a 288-byte header and a payload buffer as large as
//! the largest request or answer the connection allows (`max(8 KiB, max_write, max_pages ×
//! page)`: 1 MiB for rifflefs, which sets `max_write` to 1 MiB and the kernel caps `max_pages`
//! at 256). The memory is reserved, not committed: pages are touched only by the answers that
//! use them, so a queue costs at most `queue_depth` MiB and, with passthrough (no data over
//! FUSE), a few KiB per entry.
//!
//! `FORGET`, `BATCH_FORGET` and `INTERRUPT` still come over `/dev/fuse`, so the session keeps
//! its `/dev/fuse` threads beside the queues; notifications and passthrough's backing-file
//! ioctls also stay on the descriptor. Until every queue has registered an entry the kernel
//! holds new requests (`fuse_get_req` waits) rather than send them over `/dev/fuse`: once
//! INIT negotiated the rings, they must come up (riffle checks it can make a ring first).
//!
//! What the ring cannot do: survive its server. When the thread that armed an entry exits,
//! the kernel cancels the entry (`fuse_uring_cancel`); a request held in it when the server
//! died stays on the queue's processing list, and `FUSE_NOTIFY_RESEND` requeues only the
//! processing lists of `/dev/fuse` descriptors (`fuse_resend` walks `fc->devices`), so that
//! request would wait until the connection ends. A server whose connection must outlive it
//! (a keeper holds it) therefore does not negotiate the ring.

mod abi;
mod queue;

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::{Condvar, Mutex};

pub(crate) use queue::{QueueShared, RingSlot, serve};

/// How the session sets up its rings. The default depth, 8 (libfuse's too), bounds the
/// memory a queue's answers may touch at 8 payload buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UringOptions {
    /// Entries per queue: how many requests of one CPU's callers the server can hold at once
    /// (more wait in the kernel for an entry).
    pub queue_depth: u16,
}

impl Default for UringOptions {
    fn default() -> Self {
        UringOptions { queue_depth: 8 }
    }
}

/// What the rings did, for the file system to report. Shared with the session's threads.
#[derive(Debug, Default)]
pub struct UringStatus {
    queues: AtomicUsize,
    registered: AtomicUsize,
    entries: AtomicUsize,
    payload: AtomicUsize,
    requests: AtomicU64,
    busy: AtomicUsize,
    lost: AtomicU64,
    error: Mutex<Option<String>>,
    /// Signalled, under `error`'s lock, when a queue registers or fails.
    settled: Condvar,
}

impl UringStatus {
    /// Queues the session set up (0 when the connection did not negotiate the ring).
    pub fn queues(&self) -> usize {
        self.queues.load(Ordering::Relaxed)
    }

    /// Queues whose entries the kernel accepted.
    pub fn registered(&self) -> usize {
        self.registered.load(Ordering::Relaxed)
    }

    /// Entries per queue.
    pub fn entries(&self) -> usize {
        self.entries.load(Ordering::Relaxed)
    }

    /// Bytes of each entry's payload buffer.
    pub fn payload_bytes(&self) -> usize {
        self.payload.load(Ordering::Relaxed)
    }

    /// Requests that came over the rings.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Entries holding a request whose answer is not committed yet, over all queues.
    pub fn busy(&self) -> usize {
        self.busy.load(Ordering::Relaxed)
    }

    /// Entries whose command the kernel refused (each registered again).
    pub fn lost_entries(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }

    /// Whether every queue registered: the kernel then sends requests over the rings.
    pub fn ready(&self) -> bool {
        let queues = self.queues();
        queues > 0 && self.registered() == queues
    }

    /// Why a queue could not be set up or stopped serving, if one did.
    pub fn error(&self) -> Option<String> {
        self.error.lock().clone()
    }

    /// Waits until every queue has registered (the kernel then sends requests over the rings)
    /// or one could not be set up (why). Until then the kernel holds every new request, so a
    /// server whose rings do not all come up must not report its mount ready: its callers
    /// would wait for good. Registration is answered at once (a refusal at submit time), so
    /// this returns as soon as each queue's thread has submitted its entries.
    pub fn wait_settled(&self) -> Result<(), String> {
        let mut error = self.error.lock();
        loop {
            if let Some(why) = error.as_ref() {
                return Err(why.clone());
            }
            if self.ready() {
                return Ok(());
            }
            self.settled.wait(&mut error);
        }
    }

    /// Waits until a queue fails (why): one whose thread stopped serving while the session
    /// runs leaves the callers on its CPU waiting for an entry until the connection ends.
    pub fn wait_failed(&self) -> String {
        let mut error = self.error.lock();
        loop {
            if let Some(why) = error.as_ref() {
                return why.clone();
            }
            self.settled.wait(&mut error);
        }
    }

    fn queue_registered(&self) {
        self.registered.fetch_add(1, Ordering::Relaxed);
        let _error = self.error.lock();
        self.settled.notify_all();
    }

    /// Queue `qid` could not be set up, or stopped serving before the session did.
    pub(crate) fn queue_failed(&self, qid: u16, error: &io::Error) {
        self.failed(format!("queue {qid}: {error}"));
    }

    /// The rings could not be set up at all (after INIT negotiated them).
    pub(crate) fn rings_failed(&self, error: &io::Error) {
        self.failed(format!("no rings: {error}"));
    }

    fn failed(&self, why: String) {
        // INIT negotiated the rings, and the kernel holds every request until each queue has
        // an entry (and a queue's requests until it has a free one): without them the mount
        // does not answer.
        log::error!(
            "FUSE over io_uring: {why}; the kernel holds the requests the rings do not take"
        );
        let mut error = self.error.lock();
        error.get_or_insert(why);
        self.settled.notify_all();
    }

    fn count_request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.busy.fetch_add(1, Ordering::Relaxed);
    }

    fn count_lost_entry(&self) {
        self.lost.fetch_add(1, Ordering::Relaxed);
    }

    fn count_commits(&self, n: usize) {
        self.busy.fetch_sub(n, Ordering::Relaxed);
    }
}

/// What the kernel accepted at INIT that sizes the rings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Negotiated {
    pub(crate) max_write: u32,
    pub(crate) max_pages: u16,
}

impl Negotiated {
    /// The kernel's `max_payload_sz`: every entry's payload buffer must be at least this.
    pub(crate) fn payload_len(self) -> usize {
        // fs/fuse/inode.c: max_pages = min(max_pages_limit, max(1, asked)); max_write at
        // least 4 KiB. fs/fuse/dev_uring.c: max(FUSE_MIN_READ_BUFFER, max_write, max_pages × page).
        let limit = std::fs::read_to_string("/proc/sys/fs/fuse/max_pages_limit")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(256);
        let pages = usize::from(self.max_pages.max(1)).min(limit);
        8192.max(self.max_write.max(4096) as usize)
            .max(pages * page_size::get())
    }
}

/// Prepares one queue per possible CPU; `status` learns the layout.
pub(crate) fn queues(
    options: UringOptions,
    negotiated: Negotiated,
    fuse: std::os::fd::RawFd,
    status: &UringStatus,
) -> io::Result<Vec<Arc<QueueShared>>> {
    let count = possible_cpus()?;
    let depth = usize::from(options.queue_depth.max(1));
    let payload = negotiated.payload_len();
    status.queues.store(count, Ordering::Relaxed);
    status.entries.store(depth, Ordering::Relaxed);
    status.payload.store(payload, Ordering::Relaxed);
    (0..count)
        .map(|qid| {
            let qid = u16::try_from(qid).map_err(|_| io::Error::other("too many CPUs"))?;
            QueueShared::new(qid, depth, payload, fuse).map(Arc::new)
        })
        .collect()
}

/// The kernel's `num_possible_cpus()`, from `/sys/devices/system/cpu/possible` ("0-15",
/// "0,2-3"): the highest CPU number plus one, as the kernel indexes queues by CPU number.
fn possible_cpus() -> io::Result<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    parse_cpu_list(&text)
        .ok_or_else(|| io::Error::other(format!("cannot read the CPU list '{}'", text.trim())))
}

fn parse_cpu_list(text: &str) -> Option<usize> {
    let mut highest = None;
    for part in text.trim().split(',') {
        let last = part.rsplit('-').next()?;
        let n: usize = last.trim().parse().ok()?;
        highest = Some(highest.map_or(n, |h: usize| h.max(n)));
    }
    highest.map(|h| h + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_count_to_the_highest_cpu() {
        assert_eq!(parse_cpu_list("0-1\n"), Some(2));
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0,2-3"), Some(4));
        assert_eq!(parse_cpu_list("0-15,32-47"), Some(48));
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn settles_once_every_queue_registers() {
        let status = Arc::new(UringStatus::default());
        status.queues.store(2, Ordering::Relaxed);
        let waiter = {
            let status = status.clone();
            std::thread::spawn(move || status.wait_settled())
        };
        status.queue_registered();
        status.queue_registered();
        assert_eq!(waiter.join().expect("waiter"), Ok(()));
        assert!(status.error().is_none());
    }

    #[test]
    fn one_failed_queue_settles_with_its_reason_and_wakes_the_watcher() {
        let status = Arc::new(UringStatus::default());
        status.queues.store(2, Ordering::Relaxed);
        let (settled, failed) = {
            let (a, b) = (status.clone(), status.clone());
            (
                std::thread::spawn(move || a.wait_settled()),
                std::thread::spawn(move || b.wait_failed()),
            )
        };
        status.queue_registered();
        status.queue_failed(1, &io::Error::from_raw_os_error(libc::ENOMEM));
        let why = settled.join().expect("waiter").expect_err("a queue failed");
        assert!(why.starts_with("queue 1: "), "{why}");
        assert_eq!(failed.join().expect("watcher"), why);
        // The first reason stays.
        status.rings_failed(&io::Error::other("later"));
        assert_eq!(status.error().as_deref(), Some(why.as_str()));
    }

    #[test]
    fn rings_that_cannot_be_set_up_settle_too() {
        let status = UringStatus::default();
        status.queues.store(4, Ordering::Relaxed);
        status.rings_failed(&io::Error::other("cannot read the CPU list"));
        let why = status.wait_settled().expect_err("no rings");
        assert_eq!(why, "no rings: cannot read the CPU list");
    }

    #[test]
    fn payloads_cover_the_largest_request() {
        let page = page_size::get();
        let n = Negotiated {
            max_write: 1 << 20,
            max_pages: 256,
        };
        assert!(n.payload_len() >= 1 << 20);
        let small = Negotiated {
            max_write: 4096,
            max_pages: 1,
        };
        assert_eq!(small.payload_len(), 8192.max(page));
    }
}
