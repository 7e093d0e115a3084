//! All cache data I/O: io_uring rings, each driven by one dedicated thread.
//!
//! Callers (async tasks) send a request (a read or a write of a file at an offset) over
//! a channel and await a oneshot reply; they never touch the file themselves, so no tokio
//! worker blocks on the disk. A read may instead carry a callback that the ring thread runs
//! with the result ([`Ring::read_then`]): a cache hit then goes from the FUSE thread to the
//! ring thread and straight back to the kernel, with no task to wake in between. The ring
//! thread loops:
//!
//! 1. take every request waiting in the channel and turn as many as fit into submission queue
//!    entries (up to [`MAX_INFLIGHT`] operations in flight);
//! 2. submit them all with one `io_uring_enter` that also waits for at least one completion
//!    (a batch: under load, one system call carries dozens of operations);
//! 3. reap every completion, resubmit the rest of short transfers, start the second write of
//!    a chained pair ([`Ring::write_then`]: a block, then its journal record) once the first is
//!    complete, reply to the callers.
//!
//! The thread sleeps only inside `io_uring_enter`. To wake it for new requests, the ring
//! always has a read of an eventfd outstanding; a sender writes the eventfd only when the
//! thread announced (with a flag, checked after the last look at the channel) that it is about
//! to sleep, so a busy ring costs no extra system call per request.
//!
//! There is no `fdatasync`: the cache does not need its data durable, because every block
//! carries a CRC32C that is checked before it is served (see [`super::disk`]). Requests for
//! one file always go to the same ring (chosen by descriptor number).
//!
//! **Buffers and cancellation.** The ring thread owns every buffer and a clone of the file for
//! as long as the kernel may touch them; a caller that stops waiting (its future dropped) only
//! loses the reply. Reads land in 4096-aligned buffers ([`AlignedBuf`]) handed out as `Bytes`
//! without a copy, so they serve `O_DIRECT` reads too.
//!
//! **Where io_uring is refused** (a container's default seccomp profile, the sysctl
//! `kernel.io_uring_disabled`), [`Ring::new`] logs it once and starts `plain` threads instead:
//! the same API and semantics with `pread`/`pwrite`, slower under many small requests.
//!
//! Files: this one holds the [`Ring`] API and the requests it sends; `thread` the ring
//! thread's loop; `plain` the fallback threads; `buf` the aligned buffers and their page pool.

mod buf;
mod plain;
mod thread;

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use bytes::Bytes;
use io_uring::IoUring;
use tokio::sync::oneshot;

pub use buf::{is_aligned, reserve_for_kept_buffers, AlignedBuf, IoBuf, MAPPED_MIN};
use thread::RingThread;

/// Alignment of every buffer (and of `O_DIRECT` offsets and lengths).
pub const ALIGN: usize = 4096;
/// Submission queue size of each ring.
const ENTRIES: u32 = 256;
/// Operations in flight per ring at most (the completion queue holds twice `ENTRIES`).
pub const MAX_INFLIGHT: usize = 256;

enum Op {
    Read {
        file: Arc<File>,
        offset: u64,
        len: usize,
    },
    Write {
        file: Arc<File>,
        offset: u64,
        buf: IoBuf,
        /// A write to start once this one is complete (never if it fails).
        then: Option<Box<Chained>>,
    },
}

/// The second write of a chain ([`Ring::write_then`]).
struct Chained {
    file: Arc<File>,
    offset: u64,
    buf: IoBuf,
}

enum Done {
    Read(Bytes),
    Written,
}

impl Done {
    /// The bytes of a read's reply.
    fn into_bytes(self) -> io::Result<Bytes> {
        match self {
            Done::Read(b) => Ok(b),
            _ => Err(io::Error::other("unexpected reply")),
        }
    }
}

/// The error of a request whose ring has stopped.
fn stopped() -> io::Error {
    io::Error::other("the cache I/O thread has stopped")
}

/// The error of a read past the end of its file.
fn ended_early() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the cache file ends before the block",
    )
}

/// Whether `io_uring_setup` failed because this process may not use io_uring (`ENOSYS` from a
/// seccomp filter or a kernel without it, `EPERM`/`EACCES` from a filter, an LSM or
/// `kernel.io_uring_disabled`), rather than for want of a resource.
fn refused(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSYS) | Some(libc::EPERM) | Some(libc::EACCES)
    )
}

/// Where the result of an operation goes: a waiting task, or a callback run on the ring thread.
enum Reply {
    Task(oneshot::Sender<io::Result<Done>>),
    Call(Box<dyn FnOnce(io::Result<Done>) + Send>),
}

impl Reply {
    fn send(self, out: io::Result<Done>) {
        match self {
            Reply::Task(tx) => {
                let _ = tx.send(out);
            }
            Reply::Call(f) => f(out),
        }
    }
}

struct Request {
    op: Op,
    reply: Reply,
}

struct Wake {
    fd: OwnedFd,
    sleeping: AtomicBool,
}

impl Wake {
    fn ring_bell(&self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a live u64 to an eventfd we own.
        unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }
}

struct Lane {
    tx: Option<mpsc::Sender<Request>>,
    /// The ring thread's bell; None for `plain` threads, which block on the channel.
    wake: Option<Arc<Wake>>,
    threads: Vec<JoinHandle<()>>,
}

/// A set of io_uring threads (see the module documentation).
pub struct Ring {
    lanes: Vec<Lane>,
    submitted: AtomicUsize,
}

impl Ring {
    /// Starts `threads` rings (at least one); where io_uring is refused, as many lanes of
    /// `pread`/`pwrite` threads (see the module documentation).
    pub fn new(threads: usize) -> io::Result<Ring> {
        match Self::with_io_uring(threads) {
            Err(e) if refused(&e) => {
                tracing::warn!(
                    error = %e,
                    "io_uring is refused here (a seccomp profile such as a container runtime's default, or kernel.io_uring_disabled): the cache does its I/O with pread/pwrite threads"
                );
                Self::with_plain_threads(threads)
            }
            started => started,
        }
    }

    /// `threads` lanes of [`plain`] threads.
    fn with_plain_threads(threads: usize) -> io::Result<Ring> {
        let mut lanes = Vec::new();
        for n in 0..threads.max(1) {
            let (tx, rx) = mpsc::channel();
            lanes.push(Lane {
                tx: Some(tx),
                wake: None,
                threads: plain::spawn(n, rx)?,
            });
        }
        Ok(Ring {
            lanes,
            submitted: AtomicUsize::new(0),
        })
    }

    fn with_io_uring(threads: usize) -> io::Result<Ring> {
        let mut lanes = Vec::new();
        for n in 0..threads.max(1) {
            let ring = IoUring::new(ENTRIES)?;
            // SAFETY: eventfd returns a new descriptor or -1.
            let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: `fd` is a fresh descriptor we own.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            let wake = Arc::new(Wake {
                fd,
                sleeping: AtomicBool::new(false),
            });
            let (tx, rx) = mpsc::channel();
            // Built here, not on the thread: its tables are allocated before `new` returns.
            let ring_thread = RingThread::new(ring, rx, wake.clone());
            let thread = std::thread::Builder::new()
                .name(format!("riffle-uring-{n}"))
                .spawn(move || ring_thread.run())?;
            lanes.push(Lane {
                tx: Some(tx),
                wake: Some(wake),
                threads: vec![thread],
            });
        }
        Ok(Ring {
            lanes,
            submitted: AtomicUsize::new(0),
        })
    }

    /// Requests sent so far (for tests and stats).
    #[cfg(test)]
    pub fn submitted(&self) -> usize {
        self.submitted.load(Ordering::Relaxed)
    }

    /// Whether the lanes are io_uring rings (not the `plain` fallback).
    #[cfg(test)]
    fn uses_io_uring(&self) -> bool {
        self.lanes.iter().all(|l| l.wake.is_some())
    }

    /// Queues `op` on its file's ring; gives the request back if that ring has stopped.
    /// (A request given back still holds its file: drop it before replying.)
    fn send(&self, op: Op, reply: Reply) -> Result<(), Request> {
        let fd = match &op {
            Op::Read { file, .. } | Op::Write { file, .. } => file.as_raw_fd(),
        };
        let lane = &self.lanes[fd as usize % self.lanes.len()];
        let request = Request { op, reply };
        let Some(tx) = lane.tx.as_ref() else {
            return Err(request);
        };
        tx.send(request).map_err(|e| e.0)?;
        self.submitted.fetch_add(1, Ordering::Relaxed);
        if let Some(wake) = &lane.wake {
            if wake.sleeping.swap(false, Ordering::SeqCst) {
                wake.ring_bell();
            }
        }
        Ok(())
    }

    async fn call(&self, op: Op) -> io::Result<Done> {
        let (reply, rx) = oneshot::channel();
        self.send(op, Reply::Task(reply)).map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }

    /// Reads exactly `len` bytes at `offset` (an error if the file ends first).
    pub async fn read(&self, file: &Arc<File>, offset: u64, len: usize) -> io::Result<Bytes> {
        self.call(Op::Read {
            file: file.clone(),
            offset,
            len,
        })
        .await?
        .into_bytes()
    }

    /// Reads exactly `len` bytes at `offset` like [`Ring::read`], but instead of a task waiting,
    /// `done` runs on the ring thread with the result, so the bytes reach their user with no
    /// further thread hand-off. `done` must be short and must not block: it holds up every
    /// other operation of its ring. If the ring has stopped, `done` runs here with an error.
    /// The ring lets go of `file` before `done` runs.
    pub fn read_then(
        &self,
        file: Arc<File>,
        offset: u64,
        len: usize,
        done: impl FnOnce(io::Result<Bytes>) + Send + 'static,
    ) {
        let op = Op::Read { file, offset, len };
        let reply = Reply::Call(Box::new(move |out: io::Result<Done>| {
            done(out.and_then(Done::into_bytes))
        }));
        if let Err(Request { op, reply }) = self.send(op, reply) {
            drop(op);
            reply.send(Err(stopped()));
        }
    }

    /// Writes all of `buf` at `offset`.
    pub async fn write(&self, file: &Arc<File>, offset: u64, buf: IoBuf) -> io::Result<()> {
        self.call(Op::Write {
            file: file.clone(),
            offset,
            buf,
            then: None,
        })
        .await
        .map(|_| ())
    }

    /// Writes all of `buf` at `offset` of `file`, then, only once that write is complete, all
    /// of `next_buf` at `next_offset` of `next_file`; the reply comes after both. If the first
    /// write fails, the second is never started. The ring thread starts the second write itself
    /// as soon as it reaps the first, which saves the caller a round trip (a block and then its
    /// journal record).
    pub async fn write_then(
        &self,
        (file, offset, buf): (&Arc<File>, u64, IoBuf),
        (next_file, next_offset, next_buf): (&Arc<File>, u64, IoBuf),
    ) -> io::Result<()> {
        self.call(Op::Write {
            file: file.clone(),
            offset,
            buf,
            then: Some(Box::new(Chained {
                file: next_file.clone(),
                offset: next_offset,
                buf: next_buf,
            })),
        })
        .await
        .map(|_| ())
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        for lane in &mut self.lanes {
            lane.tx = None;
            if let Some(wake) = &lane.wake {
                wake.ring_bell();
            }
        }
        let me = std::thread::current().id();
        for lane in &mut self.lanes {
            for t in lane.threads.drain(..) {
                // The last owner may let go inside a callback on a ring thread
                // ([`Ring::read_then`]): that thread finishes its work and exits on its own.
                if t.thread().id() != me {
                    let _ = t.join();
                }
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
