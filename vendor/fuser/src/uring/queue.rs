//! One ring queue: its entries' buffers, the thread that owns its io_uring, and the reply
//! slot a request's answer is written to.
//!
//! The kernel picks a request's queue by the CPU its caller runs on, and hands it to one of
//! that queue's entries that a server thread has armed (`REGISTER` the first time,
//! `COMMIT_AND_FETCH` afterwards: the answer to the entry's last request and the wait for its
//! next one, in one SQE). Only the queue's own thread submits to its ring: the kernel runs a
//! command's completion as task work on the thread that submitted it, and cancels every
//! command of a thread that exits, so an SQE sent from a short-lived thread (a Tokio blocking
//! thread answering a read) would lose its entry when that thread ends. A reply is therefore
//! written into its entry's buffers by whichever thread answers, and the entry is put on the
//! queue's ready list; from another thread, an eventfd the ring watches wakes the queue's
//! thread, which sends the commits. A reply given while the queue's thread dispatches (most
//! metadata answers) costs no wake-up at all: the commits go with the thread's next submit.
//!
//! The request is copied out of the entry before dispatch (header, fixed argument and
//! payload, assembled into the layout `/dev/fuse` reads give, which fuser's parser takes),
//! so the answer may overwrite the entry's buffers while the file system still looks at its
//! arguments.

use std::cell::Cell;
use std::io;
use std::io::IoSlice;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use io_uring::{IoUring, cqueue, opcode, squeue, types};
use log::{debug, warn};
use parking_lot::Mutex;

use super::UringStatus;
use super::abi::{self, CmdReq, EntInOut, ReqHeader};
use crate::Filesystem;
use crate::ll::Operation;
use crate::ll::fuse_abi as abi_fuse;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

/// `user_data` of the eventfd read that wakes the queue's thread.
const WAKE: u64 = u64::MAX;
const IN_HEADER: usize = size_of::<abi_fuse::fuse_in_header>();
const OUT_HEADER: usize = size_of::<abi_fuse::fuse_out_header>();

thread_local! {
    /// The queue whose thread this is (null elsewhere), so that a reply knows whether it
    /// must wake that thread.
    static QUEUE_OF_THIS_THREAD: Cell<*const QueueShared> = const { Cell::new(ptr::null()) };
}

/// Anonymous memory for a queue's entries: `depth` headers, then `depth` payload buffers.
/// The kernel reads and writes it through the addresses registered; this process only
/// touches an entry while it owns it (between the CQE that delivers a request and the SQE
/// that commits its answer), through raw pointers.
struct Region {
    base: *mut u8,
    len: usize,
    headers_len: usize,
    payload_len: usize,
}

impl Region {
    fn new(depth: usize, payload_len: usize) -> io::Result<Region> {
        let page = page_size::get();
        let headers_len = (depth * size_of::<ReqHeader>()).div_ceil(page) * page;
        let len = headers_len + depth * payload_len;
        // SAFETY: a fresh private anonymous mapping; checked below.
        let base = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Region {
            base: base.cast(),
            len,
            headers_len,
            payload_len,
        })
    }

    fn header(&self, entry: usize) -> *mut ReqHeader {
        // SAFETY: in bounds: `entry < depth` (callers), headers first.
        unsafe { self.base.add(entry * size_of::<ReqHeader>()).cast() }
    }

    fn payload(&self, entry: usize) -> *mut u8 {
        // SAFETY: in bounds: `entry < depth` (callers), payloads after the headers.
        unsafe { self.base.add(self.headers_len + entry * self.payload_len) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// What the queue's thread and the threads answering its requests share.
pub(crate) struct QueueShared {
    qid: u16,
    depth: usize,
    fuse: RawFd,
    region: Region,
    /// The `[header, payload]` iovecs of each entry, read by the kernel at `REGISTER`.
    iovecs: Box<[[libc::iovec; 2]]>,
    /// Answered entries waiting for their commit: (entry, request unique).
    ready: Mutex<Vec<(u16, u64)>>,
    wake: OwnedFd,
    /// Set when the session ends: the thread stops at its next wake-up.
    stop: AtomicBool,
}

// SAFETY: the raw pointers are to memory the queue owns for its lifetime; an entry's part is
// written by one thread at a time (its request's owner), as the module doc explains.
unsafe impl Send for QueueShared {}
unsafe impl Sync for QueueShared {}

impl QueueShared {
    pub(crate) fn new(
        qid: u16,
        depth: usize,
        payload_len: usize,
        fuse: RawFd,
    ) -> io::Result<QueueShared> {
        let region = Region::new(depth, payload_len)?;
        let iovecs = (0..depth)
            .map(|e| {
                [
                    libc::iovec {
                        iov_base: region.header(e).cast(),
                        iov_len: size_of::<ReqHeader>(),
                    },
                    libc::iovec {
                        iov_base: region.payload(e).cast(),
                        iov_len: payload_len,
                    },
                ]
            })
            .collect();
        // SAFETY: eventfd(2) returns a new descriptor or -1.
        let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if wake < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(QueueShared {
            qid,
            depth,
            fuse,
            region,
            iovecs,
            ready: Mutex::new(Vec::with_capacity(depth)),
            // SAFETY: just created, owned here.
            wake: unsafe { OwnedFd::from_raw_fd(wake) },
            stop: AtomicBool::new(false),
        })
    }

    /// Asks the queue's thread to stop (the session is over).
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake_thread();
    }

    /// Whether the session asked the queue to stop.
    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    fn wake_thread(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: an 8-byte write to our eventfd; it can only fail if the counter would
        // overflow, which a pending wake-up makes harmless.
        unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }

    /// Marks `entry`'s answer written; the queue's thread commits it.
    fn answered(&self, entry: u16, unique: u64) {
        self.ready.lock().push((entry, unique));
        let on_own_thread = QUEUE_OF_THIS_THREAD.with(|q| ptr::eq(q.get(), self));
        if !on_own_thread {
            self.wake_thread();
        }
    }

    /// Copies the request delivered to `entry` into `buf`, laid out as `/dev/fuse` gives it;
    /// returns its length and unique.
    fn take_request(&self, entry: usize, buf: &mut Vec<u8>) -> (usize, u64) {
        let header = self.region.header(entry);
        // SAFETY: the entry is ours until we commit it (its CQE arrived); plain reads of
        // kernel-written bytes through raw pointers, each within the entry's buffers.
        unsafe {
            let in_out: EntInOut = ptr::read_unaligned(ptr::addr_of!((*header).ring_ent_in_out));
            let in_header = ptr::addr_of!((*header).in_out).cast::<u8>();
            let opcode = ptr::read_unaligned(in_header.add(4).cast::<u32>());
            let op_len = abi::op_header_len(opcode).min(abi::OP_IN_OUT_SZ);
            let payload_len = (in_out.payload_sz as usize).min(self.region.payload_len);
            let len = IN_HEADER + op_len + payload_len;
            buf.clear();
            buf.reserve(len);
            let dst = buf.as_mut_ptr();
            ptr::copy_nonoverlapping(in_header, dst, IN_HEADER);
            ptr::copy_nonoverlapping(
                ptr::addr_of!((*header).op_in).cast::<u8>(),
                dst.add(IN_HEADER),
                op_len,
            );
            ptr::copy_nonoverlapping(
                self.region.payload(entry),
                dst.add(IN_HEADER + op_len),
                payload_len,
            );
            buf.set_len(len);
            // The header's `len` is the whole request, as the parser expects.
            buf[..4].copy_from_slice(&(len as u32).to_ne_bytes());
            (len, in_out.commit_id)
        }
    }

    fn register_sqe(&self, entry: usize) -> squeue::Entry128 {
        let cmd = CmdReq {
            qid: self.qid,
            ..CmdReq::default()
        };
        let sqe = opcode::UringCmd80::new(types::Fd(self.fuse), abi::CMD_REGISTER)
            .cmd(cmd.to_cmd())
            .addr(Some(self.iovecs[entry].as_ptr() as u64))
            .build()
            .user_data(entry as u64);
        with_len(sqe, 2)
    }

    fn commit_sqe(&self, entry: u16, unique: u64) -> squeue::Entry128 {
        let cmd = CmdReq {
            commit_id: unique,
            qid: self.qid,
            ..CmdReq::default()
        };
        opcode::UringCmd80::new(types::Fd(self.fuse), abi::CMD_COMMIT_AND_FETCH)
            .cmd(cmd.to_cmd())
            .build()
            .user_data(u64::from(entry))
    }
}

/// Sets the SQE's `len` (the iovec count `REGISTER` requires), which the io-uring crate's
/// `UringCmd80` builder has no setter for. `len` is the `u32` at byte 24 of every SQE.
fn with_len(sqe: squeue::Entry128, len: u32) -> squeue::Entry128 {
    const _: () = assert!(size_of::<squeue::Entry128>() == 128);
    // SAFETY: `Entry128` is `repr(C)`: a 64-byte `io_uring_sqe` then 64 bytes, plain data.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[24..28].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: the same bytes with one plain integer field changed.
    unsafe { std::mem::transmute(raw) }
}

/// Where a request that came over the ring is answered.
#[derive(Clone)]
pub(crate) struct RingSlot {
    queue: Arc<QueueShared>,
    entry: u16,
    unique: u64,
}

impl std::fmt::Debug for RingSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingSlot")
            .field("qid", &self.queue.qid)
            .field("entry", &self.entry)
            .field("unique", &self.unique)
            .finish()
    }
}

impl RingSlot {
    /// Writes the answer (a `fuse_out_header` then its arguments, as for `/dev/fuse`) into
    /// the entry and hands the entry to its queue's thread to commit. An answer larger than
    /// the payload buffer (which the kernel sizes for any request it sends) becomes `EIO`.
    pub(crate) fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let total: usize = data.iter().map(|s| s.len()).sum();
        let region = &self.queue.region;
        let entry = usize::from(self.entry);
        let header = region.header(entry);
        let payload = region.payload(entry);
        if total < OUT_HEADER || total - OUT_HEADER > region.payload_len {
            warn!("FUSE reply of {total} bytes does not fit the ring entry; answering EIO");
            return self.send_eio();
        }
        // SAFETY: the entry is owned by this request until its commit, which follows.
        unsafe {
            let in_out = ptr::addr_of_mut!((*header).in_out).cast::<u8>();
            let mut at = 0usize;
            for slice in data {
                let mut bytes: &[u8] = slice;
                if at < OUT_HEADER {
                    let n = bytes.len().min(OUT_HEADER - at);
                    ptr::copy_nonoverlapping(bytes.as_ptr(), in_out.add(at), n);
                    at += n;
                    bytes = &bytes[n..];
                }
                ptr::copy_nonoverlapping(bytes.as_ptr(), payload.add(at - OUT_HEADER), bytes.len());
                at += bytes.len();
            }
        }
        self.commit(total - OUT_HEADER)
    }

    /// Answers `EIO` (a request that cannot be parsed, or an answer that does not fit).
    pub(crate) fn send_eio(&self) -> io::Result<()> {
        let eio = abi_fuse::fuse_out_header {
            len: OUT_HEADER as u32,
            error: -libc::EIO,
            unique: self.unique,
        };
        let header = self.queue.region.header(usize::from(self.entry));
        // SAFETY: the entry is owned by this request until its commit, which follows.
        unsafe {
            let in_out = ptr::addr_of_mut!((*header).in_out).cast::<u8>();
            ptr::copy_nonoverlapping(ptr::addr_of!(eio).cast::<u8>(), in_out, OUT_HEADER);
        }
        self.commit(0)
    }

    /// Records the answer's payload size and hands the entry to its queue's thread.
    fn commit(&self, payload_sz: usize) -> io::Result<()> {
        let header = self.queue.region.header(usize::from(self.entry));
        // SAFETY: as in `send`; a plain write of one field.
        unsafe {
            let sz = ptr::addr_of_mut!((*header).ring_ent_in_out.payload_sz);
            ptr::write_unaligned(sz, payload_sz as u32);
        }
        self.queue.answered(self.entry, self.unique);
        Ok(())
    }
}

/// The queue's thread: registers the entries, then dispatches what arrives and commits the
/// answers, until the session ends or every entry is gone. A queue whose entries the kernel
/// took is reported registered to `status` (the kernel answers a refusal at submit time); an
/// error ends the thread, and the session reports it (`start_rings`). Errors are not
/// recovered from: the kernel holds new requests (in `fuse_get_req`) until every queue has
/// an entry, rather than send them over `/dev/fuse`, so a queue that never registers leaves
/// the mount unanswered, and the server must not say it is ready (`Session::run_reporting`).
pub(crate) fn serve<FS: Filesystem>(
    queue: Arc<QueueShared>,
    event_loop: SessionEventLoop<FS>,
    status: Arc<UringStatus>,
) -> io::Result<()> {
    QUEUE_OF_THIS_THREAD.with(|q| q.set(Arc::as_ptr(&queue)));
    pin_to_cpu(usize::from(queue.qid));
    let sq_entries = (queue.depth as u32 + 2).next_power_of_two();
    let mut ring: IoUring<squeue::Entry128, cqueue::Entry> = IoUring::builder()
        .setup_cqsize(sq_entries * 2)
        .build(sq_entries)?;
    let mut wake_buf = [0u8; 8];
    let wake_sqe = |buf: &mut [u8; 8]| -> squeue::Entry128 {
        opcode::Read::new(types::Fd(queue.wake.as_raw_fd()), buf.as_mut_ptr(), 8)
            .build()
            .user_data(WAKE)
            .into()
    };
    {
        let mut sq = ring.submission();
        for entry in 0..queue.depth {
            // SAFETY: the iovecs and buffers live as long as `queue`, which outlives the
            // ring (dropped at the end of this function, before `queue`'s last reference
            // here; replies hold their own).
            unsafe { sq.push(&queue.register_sqe(entry)) }
                .map_err(|_| io::Error::other("ring submission queue full"))?;
        }
        // SAFETY: `wake_buf` lives until the ring is dropped at this function's end.
        unsafe { sq.push(&wake_sqe(&mut wake_buf)) }
            .map_err(|_| io::Error::other("ring submission queue full"))?;
    }
    ring.submit()?;
    // A REGISTER the kernel refuses is answered at submit time, so its CQE is here now. One it
    // accepts completes only when a request arrives in its entry, and that may already have
    // happened: the kernel turns to the rings once every queue has an entry, so another queue's
    // thread may have finished first and callers on this queue's CPU be waiting. Those CQEs are
    // requests like every later one (dropping them here once lost the request and its entry,
    // and left its caller waiting for good).
    let mut arrived: Vec<Completion> = Vec::with_capacity(queue.depth + 1);
    let stopping = || queue.stop.load(Ordering::Acquire);
    arrived.extend(
        ring.completion()
            .map(|c| classify(c.user_data(), c.result(), stopping())),
    );
    let (refused, failed) = take_registration_failures(&mut arrived);
    let mut live = queue.depth - refused;
    match failed {
        Some(errno) if live == 0 => return Err(io::Error::from_raw_os_error(errno)),
        Some(errno) => {
            // The queue serves with the entries the kernel took.
            warn!(
                "ring queue {}: the kernel refused {refused} of {} entries ({}); serving with {live}",
                queue.qid,
                queue.depth,
                io::Error::from_raw_os_error(errno)
            );
            status.queue_registered();
        }
        None => status.queue_registered(),
    }

    let mut buf: Vec<u8> = Vec::with_capacity(IN_HEADER + abi::OP_IN_OUT_SZ + 4096);
    let mut ready: Vec<(u16, u64)> = Vec::with_capacity(queue.depth);
    let mut reregister: Vec<u16> = Vec::new();
    loop {
        let mut rearm_wake = false;
        for completion in arrived.drain(..) {
            let entry = match completion {
                Completion::Wake => {
                    rearm_wake = true;
                    continue;
                }
                Completion::Ended(entry, errno) => {
                    live -= 1;
                    debug!(
                        "ring queue {} entry {entry} ended: errno {errno}",
                        queue.qid
                    );
                    continue;
                }
                Completion::Refused(entry, errno) => {
                    // The kernel no longer holds the entry: register it afresh, so that the
                    // queue keeps its depth instead of running dry.
                    warn!(
                        "ring queue {} entry {entry}: the kernel refused its command ({}); registering it again",
                        queue.qid,
                        io::Error::from_raw_os_error(errno)
                    );
                    status.count_lost_entry();
                    reregister.push(entry);
                    continue;
                }
                Completion::Request(entry) => entry,
            };
            let (len, unique) = queue.take_request(usize::from(entry), &mut buf);
            status.count_request();
            let slot = RingSlot {
                queue: queue.clone(),
                entry,
                unique,
            };
            let slot_for_error = slot.clone();
            match RequestWithSender::with_ring(event_loop.ch.sender(), slot, &buf[..len]) {
                Some(req) => {
                    if let Ok(Operation::Destroy(_)) = req.request.operation() {
                        req.reply::<crate::ReplyEmpty>().ok();
                    } else {
                        req.dispatch(&event_loop);
                    }
                }
                None => {
                    // Answered all the same, or the entry and its caller would wait forever.
                    warn!(
                        "ring queue {}: a request fuser cannot parse; answering EIO",
                        queue.qid
                    );
                    slot_for_error.send_eio()?;
                }
            }
        }
        if live == 0 || stopping() {
            break;
        }
        std::mem::swap(&mut ready, &mut *queue.ready.lock());
        status.count_commits(ready.len());
        {
            let mut sq = ring.submission();
            for (entry, unique) in ready.drain(..) {
                // SAFETY: commits carry no buffer address.
                unsafe { sq.push(&queue.commit_sqe(entry, unique)) }
                    .map_err(|_| io::Error::other("ring submission queue full"))?;
            }
            for entry in reregister.drain(..) {
                // SAFETY: as at registration.
                unsafe { sq.push(&queue.register_sqe(usize::from(entry))) }
                    .map_err(|_| io::Error::other("ring submission queue full"))?;
            }
            if rearm_wake {
                // SAFETY: as at registration.
                unsafe { sq.push(&wake_sqe(&mut wake_buf)) }
                    .map_err(|_| io::Error::other("ring submission queue full"))?;
            }
        }
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) => return Err(e),
        }
        arrived.extend(
            ring.completion()
                .map(|c| classify(c.user_data(), c.result(), stopping())),
        );
    }
    Ok(())
}

/// Removes from the completions that followed registration the entries the kernel refused;
/// returns how many, and the first errno. Requests and the wake-up stay, to be served.
fn take_registration_failures(arrived: &mut Vec<Completion>) -> (usize, Option<i32>) {
    let mut refused = 0;
    let mut first = None;
    arrived.retain(|c| match *c {
        Completion::Ended(_, errno) | Completion::Refused(_, errno) => {
            refused += 1;
            first.get_or_insert(errno);
            false
        }
        Completion::Wake | Completion::Request(_) => true,
    });
    (refused, first)
}

/// What a completion on a queue's ring says, as its thread acts on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Completion {
    /// The eventfd read: answers given on other threads wait on the ready list.
    Wake,
    /// A request arrived in the entry (its `REGISTER` or `COMMIT_AND_FETCH` completed).
    Request(u16),
    /// The connection ended (or the session is stopping): the entry is done. The errno.
    Ended(u16, i32),
    /// The kernel refused the entry's last command and no longer holds the entry. The errno.
    Refused(u16, i32),
}

fn classify(user_data: u64, result: i32, stopping: bool) -> Completion {
    if user_data == WAKE {
        return Completion::Wake;
    }
    // Entries are numbered below the queue depth (a u16), as their SQEs' user data.
    let entry = user_data as u16;
    match -result {
        errno if errno <= 0 => Completion::Request(entry),
        libc::ENOTCONN | libc::ENODEV | libc::ECANCELED => Completion::Ended(entry, -result),
        errno if stopping => Completion::Ended(entry, errno),
        errno => Completion::Refused(entry, errno),
    }
}

/// Runs the queue's thread on the CPU whose requests it serves (the kernel queues a request
/// by its caller's CPU), as libfuse does; a CPU that is offline leaves the thread unpinned.
fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET stays within it for cpu < CPU_SETSIZE.
    unsafe {
        if cpu >= libc::CPU_SETSIZE as usize {
            return;
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            debug!(
                "ring queue thread not pinned to CPU {cpu}: {}",
                io::Error::last_os_error()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_say_request_end_refusal_or_wake() {
        assert_eq!(classify(3, 0, false), Completion::Request(3));
        assert_eq!(classify(WAKE, 8, false), Completion::Wake);
        assert_eq!(
            classify(1, -libc::ENOTCONN, false),
            Completion::Ended(1, libc::ENOTCONN)
        );
        assert_eq!(
            classify(1, -libc::ECANCELED, false),
            Completion::Ended(1, libc::ECANCELED)
        );
        assert_eq!(
            classify(2, -libc::EINVAL, false),
            Completion::Refused(2, libc::EINVAL)
        );
        assert_eq!(
            classify(2, -libc::EINVAL, true),
            Completion::Ended(2, libc::EINVAL)
        );
    }

    #[test]
    fn requests_that_arrive_during_registration_are_served() {
        // Queue 1 finished registering first, and a caller on this queue's CPU already has
        // its request in entry 0 when this thread reaps its REGISTERs' refusals.
        let mut arrived = vec![
            classify(0, 0, false),
            classify(5, -libc::EINVAL, false),
            classify(WAKE, 8, false),
        ];
        assert_eq!(
            take_registration_failures(&mut arrived),
            (1, Some(libc::EINVAL))
        );
        assert_eq!(arrived, vec![Completion::Request(0), Completion::Wake]);
    }
}
