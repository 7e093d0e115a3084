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

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use bytes::Bytes;
use io_uring::{opcode, types, IoUring};
use tokio::sync::oneshot;

/// Alignment of every buffer (and of `O_DIRECT` offsets and lengths).
pub const ALIGN: usize = 4096;
/// Submission queue size of each ring.
const ENTRIES: u32 = 256;
/// Operations in flight per ring at most (the completion queue holds twice `ENTRIES`).
pub const MAX_INFLIGHT: usize = 256;
const WAKE_TOKEN: u64 = u64::MAX;

/// A buffer aligned to [`ALIGN`]: `cap` bytes allocated, the first `len` initialised.
///
/// **Where block buffers live.** Buffers of at least [`MAPPED_MIN`] (every block the daemon
/// fetches or reads from the cache: 1 MiB by default) are mapped pages of their own, not heap
/// memory, and go back to the system when freed, except for a few kept for the next
/// allocation ([`POOL_MAX_BYTES`], so a steady stream of blocks costs no page faults). From the
/// heap, glibc kept what freed blocks left behind: blocks come and go by the thousand on
/// several threads, the heap's free space ends up in holes between live allocations, and a
/// daemon with `--max-memory 64M` reading six W2 shards reached 165–200 MiB of RSS for 64 MiB
/// of live blocks (75–105 MiB with block buffers mapped; `benches/memory.sh`). Mapped memory is
/// RSS only while a block lives, so the daemon's RSS follows `--max-memory`.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    cap: usize,
    len: usize,
    /// Mapped pages (see above) rather than a heap allocation.
    mapped: bool,
}

/// Buffers of at least this many bytes are mapped pages (see [`AlignedBuf`]).
pub const MAPPED_MIN: usize = 256 * 1024;
/// Bytes of freed mapped buffers kept for reuse at most.
pub const POOL_MAX_BYTES: usize = 16 << 20;

/// Freed mapped buffers (address, size), kept for reuse.
static POOL: parking_lot::Mutex<Vec<(usize, usize)>> = parking_lot::Mutex::new(Vec::new());

/// Pages of `size` bytes: a pooled buffer of that size, else a new mapping.
fn map(size: usize) -> Option<NonNull<u8>> {
    {
        let mut pool = POOL.lock();
        if let Some(i) = pool.iter().rposition(|&(_, s)| s == size) {
            let (addr, _) = pool.swap_remove(i);
            return NonNull::new(addr as *mut u8);
        }
    }
    // SAFETY: a new private anonymous mapping; no existing memory is touched.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return None;
    }
    NonNull::new(raw.cast())
}

/// Gives back a buffer from [`map`]: to the pool while it has room, else to the system.
fn unmap(ptr: NonNull<u8>, size: usize) {
    {
        let mut pool = POOL.lock();
        let pooled: usize = pool.iter().map(|&(_, s)| s).sum();
        if pooled + size <= POOL_MAX_BYTES {
            pool.push((ptr.as_ptr() as usize, size));
            return;
        }
    }
    // SAFETY: `ptr` is a mapping of `size` bytes made by `map`, owned by the dropped buffer.
    unsafe { libc::munmap(ptr.as_ptr().cast(), size) };
}

// SAFETY: the buffer is uniquely owned heap memory.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads the initialised part.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    fn layout(cap: usize) -> std::alloc::Layout {
        // ALIGN is a power of two and cap is at most isize::MAX in practice; fall back to the
        // smallest valid layout rather than panic on absurd sizes (allocation then fails).
        std::alloc::Layout::from_size_align(cap.max(ALIGN).next_multiple_of(ALIGN), ALIGN)
            .unwrap_or(std::alloc::Layout::new::<[u8; ALIGN]>())
    }

    /// An empty buffer with room for `cap` bytes.
    pub fn with_capacity(cap: usize) -> AlignedBuf {
        let layout = Self::layout(cap);
        if layout.size() >= MAPPED_MIN {
            let Some(ptr) = map(layout.size()) else {
                std::alloc::handle_alloc_error(layout);
            };
            return AlignedBuf {
                ptr,
                cap: layout.size(),
                len: 0,
                mapped: true,
            };
        }
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout);
        };
        AlignedBuf {
            ptr,
            cap: layout.size(),
            len: 0,
            mapped: false,
        }
    }

    /// A copy of `data` in an aligned buffer.
    pub fn copy_from(data: &[u8]) -> AlignedBuf {
        let mut b = AlignedBuf::with_capacity(data.len());
        // SAFETY: the buffer has room for data.len() bytes and does not overlap `data`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), b.ptr.as_ptr(), data.len()) };
        b.len = data.len();
        b
    }

    /// Appends as much of `data` as there is room for; returns how many bytes it took.
    pub fn extend_from_slice(&mut self, data: &[u8]) -> usize {
        let take = data.len().min(self.cap - self.len);
        // SAFETY: `take` bytes fit after the initialised part; `data` does not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(self.len), take)
        };
        self.len += take;
        take
    }

    /// Bytes initialised so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is initialised yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the first `len` bytes are initialised (written by a copy or by the kernel).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.mapped {
            unmap(self.ptr, self.cap);
            return;
        }
        // SAFETY: allocated in `with_capacity` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.cap)) };
    }
}

/// Bytes to write: either the caller's buffer (buffered I/O, or `O_DIRECT` when it is
/// aligned: see [`is_aligned`]) or an aligned copy (`O_DIRECT`).
pub enum IoBuf {
    Bytes(Bytes),
    Aligned(AlignedBuf),
}

/// Whether `data` can be written with `O_DIRECT` as it is: its address and length are
/// multiples of [`ALIGN`] (a fetched block is received into an [`AlignedBuf`], so it needs no
/// aligned copy, which would double its memory while it is written).
pub fn is_aligned(data: &[u8]) -> bool {
    (data.as_ptr() as usize) % ALIGN == 0 && data.len() % ALIGN == 0
}

impl IoBuf {
    fn as_slice(&self) -> &[u8] {
        match self {
            IoBuf::Bytes(b) => b,
            IoBuf::Aligned(a) => a.as_ref(),
        }
    }
}

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
    wake: Arc<Wake>,
    thread: Option<JoinHandle<()>>,
}

/// A set of io_uring threads (see the module documentation).
pub struct Ring {
    lanes: Vec<Lane>,
    submitted: AtomicUsize,
}

impl Ring {
    /// Starts `threads` rings (at least one).
    pub fn new(threads: usize) -> io::Result<Ring> {
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
                wake,
                thread: Some(thread),
            });
        }
        Ok(Ring {
            lanes,
            submitted: AtomicUsize::new(0),
        })
    }

    /// Requests sent so far (for tests and stats).
    pub fn submitted(&self) -> usize {
        self.submitted.load(Ordering::Relaxed)
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
        if lane.wake.sleeping.swap(false, Ordering::SeqCst) {
            lane.wake.ring_bell();
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
            lane.wake.ring_bell();
        }
        let me = std::thread::current().id();
        for lane in &mut self.lanes {
            if let Some(t) = lane.thread.take() {
                // The last owner may let go inside a callback on a ring thread
                // ([`Ring::read_then`]): that thread finishes its work and exits on its own.
                if t.thread().id() != me {
                    let _ = t.join();
                }
            }
        }
    }
}

/// One operation the kernel owns right now.
enum InFlight {
    Read {
        file: Arc<File>,
        offset: u64,
        buf: AlignedBuf,
        want: usize,
        reply: Reply,
    },
    Write {
        file: Arc<File>,
        offset: u64,
        buf: IoBuf,
        done: usize,
        then: Option<Box<Chained>>,
        reply: Reply,
    },
}

/// Work waiting for room in the submission queue.
enum Pending {
    New(Request),
    /// Resubmit the rest of a short transfer in this slot.
    Continue(usize),
}

struct RingThread {
    ring: IoUring,
    rx: mpsc::Receiver<Request>,
    wake: Arc<Wake>,
    wake_buf: Box<[u8; 8]>,
    wake_armed: bool,
    slots: Vec<Option<InFlight>>,
    free: Vec<usize>,
    inflight: usize,
    backlog: VecDeque<Pending>,
    closed: bool,
}

impl RingThread {
    fn new(ring: IoUring, rx: mpsc::Receiver<Request>, wake: Arc<Wake>) -> Self {
        RingThread {
            ring,
            rx,
            wake,
            wake_buf: Box::new([0; 8]),
            wake_armed: false,
            slots: (0..MAX_INFLIGHT).map(|_| None).collect(),
            free: (0..MAX_INFLIGHT).rev().collect(),
            inflight: 0,
            backlog: VecDeque::new(),
            closed: false,
        }
    }

    fn intake(&mut self) -> bool {
        let mut got = false;
        loop {
            match self.rx.try_recv() {
                Ok(r) => {
                    self.backlog.push_back(Pending::New(r));
                    got = true;
                }
                Err(mpsc::TryRecvError::Empty) => return got,
                Err(mpsc::TryRecvError::Disconnected) => {
                    self.closed = true;
                    return got;
                }
            }
        }
    }

    fn run(mut self) {
        loop {
            self.intake();
            self.fill();
            if self.closed && self.inflight == 0 && self.backlog.is_empty() {
                break;
            }
            // Announce the sleep, then look at the channel one last time (see module docs).
            self.wake.sleeping.store(true, Ordering::SeqCst);
            if self.intake() {
                self.wake.sleeping.store(false, Ordering::SeqCst);
                self.fill();
                if let Err(e) = self.ring.submit() {
                    tracing::debug!(error = %e, "io_uring submit failed");
                }
            } else if let Err(e) = self.ring.submit_and_wait(1) {
                if e.raw_os_error() != Some(libc::EINTR) {
                    tracing::warn!(error = %e, "io_uring_enter failed");
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            self.wake.sleeping.store(false, Ordering::SeqCst);
            self.reap();
        }
        // The kernel tears a ring down asynchronously: never free the buffer of a read that
        // may still be outstanding (8 bytes, once per cache).
        let RingThread {
            ring,
            wake_buf,
            wake_armed,
            ..
        } = self;
        drop(ring);
        if wake_armed {
            std::mem::forget(wake_buf);
        }
    }

    /// Moves work from the backlog into the submission queue while there is room.
    fn fill(&mut self) {
        if !self.wake_armed && !self.closed {
            let e = opcode::Read::new(
                types::Fd(self.wake.fd.as_raw_fd()),
                self.wake_buf.as_mut_ptr(),
                8,
            )
            .build()
            .user_data(WAKE_TOKEN);
            // SAFETY: the buffer lives in `self` for as long as the ring does.
            if unsafe { self.ring.submission().push(&e) }.is_ok() {
                self.wake_armed = true;
            }
        }
        while let Some(p) = self.backlog.pop_front() {
            match self.start(p) {
                Ok(()) => {}
                Err(p) => {
                    self.backlog.push_front(p);
                    break;
                }
            }
        }
    }

    fn take_slot(&mut self) -> Option<usize> {
        let s = self.free.pop()?;
        self.inflight += 1;
        Some(s)
    }

    fn release_slot(&mut self, s: usize) {
        self.slots[s] = None;
        self.free.push(s);
        self.inflight -= 1;
    }

    /// Pushes one submission for `p`; gives `p` back when the queue or the slots are full.
    fn start(&mut self, p: Pending) -> Result<(), Pending> {
        if self.ring.submission().is_full() {
            return Err(p);
        }
        let (slot, entry) = match p {
            Pending::New(Request { op, reply }) => {
                let Some(slot) = self.take_slot() else {
                    return Err(Pending::New(Request { op, reply }));
                };
                match op {
                    Op::Read { file, offset, len } => {
                        self.slots[slot] = Some(InFlight::Read {
                            buf: AlignedBuf::with_capacity(len),
                            file,
                            offset,
                            want: len,
                            reply,
                        });
                    }
                    Op::Write {
                        file,
                        offset,
                        buf,
                        then,
                    } => {
                        self.slots[slot] = Some(InFlight::Write {
                            file,
                            offset,
                            buf,
                            done: 0,
                            then,
                            reply,
                        });
                    }
                }
                match self.entry_for(slot) {
                    Some(e) => (slot, e),
                    None => {
                        self.release_slot(slot);
                        return Ok(());
                    }
                }
            }
            Pending::Continue(slot) => match self.entry_for(slot) {
                Some(e) => (slot, e),
                None => return Ok(()),
            },
        };
        let entry = entry.user_data(slot as u64);
        // SAFETY: buffers and files of the slot stay alive until its completion is reaped.
        if unsafe { self.ring.submission().push(&entry) }.is_err() {
            // Checked for room above; cannot happen, but never lose a request.
            self.backlog.push_front(Pending::Continue(slot));
        }
        Ok(())
    }

    /// The submission entry for the (remaining) transfer of a read or write slot.
    fn entry_for(&mut self, slot: usize) -> Option<io_uring::squeue::Entry> {
        match self.slots[slot].as_mut()? {
            InFlight::Read {
                file,
                offset,
                buf,
                want,
                ..
            } => {
                let done = buf.len;
                // SAFETY: `done < want <= cap`, so the pointer stays inside the buffer.
                let ptr = unsafe { buf.as_mut_ptr().add(done) };
                Some(
                    opcode::Read::new(types::Fd(file.as_raw_fd()), ptr, (*want - done) as u32)
                        .offset(*offset + done as u64)
                        .build(),
                )
            }
            InFlight::Write {
                file,
                offset,
                buf,
                done,
                ..
            } => {
                let data = buf.as_slice();
                let rest = &data[*done..];
                Some(
                    opcode::Write::new(
                        types::Fd(file.as_raw_fd()),
                        rest.as_ptr(),
                        rest.len() as u32,
                    )
                    .offset(*offset + *done as u64)
                    .build(),
                )
            }
        }
    }

    fn reap(&mut self) {
        let done: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (token, res) in done {
            if token == WAKE_TOKEN {
                self.wake_armed = false;
                continue;
            }
            let slot = token as usize;
            if slot >= self.slots.len() {
                continue;
            }
            self.complete(slot, res);
        }
    }

    fn complete(&mut self, slot: usize, res: i32) {
        let retry = res == -libc::EINTR || res == -libc::EAGAIN;
        let err = (res < 0).then(|| io::Error::from_raw_os_error(-res));
        match self.slots[slot].as_mut() {
            None => {}
            Some(InFlight::Read { buf, want, .. }) => {
                if retry {
                    self.backlog.push_back(Pending::Continue(slot));
                    return;
                }
                if res > 0 {
                    buf.len += res as usize;
                    if buf.len < *want {
                        self.backlog.push_back(Pending::Continue(slot));
                        return;
                    }
                }
                if let Some(InFlight::Read {
                    buf, reply, file, ..
                }) = self.slots[slot].take()
                {
                    // The file goes before the reply: whoever gets it may find the descriptor
                    // held by nobody else now (the cache then keeps its entry compactly).
                    drop(file);
                    let out = match err {
                        Some(e) => Err(e),
                        None if res == 0 => Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "the cache file ends before the block",
                        )),
                        None => Ok(Done::Read(Bytes::from_owner(buf))),
                    };
                    reply.send(out);
                }
                self.release_slot(slot);
            }
            Some(InFlight::Write {
                file,
                offset,
                buf,
                done,
                then,
                ..
            }) => {
                if retry {
                    self.backlog.push_back(Pending::Continue(slot));
                    return;
                }
                if res > 0 {
                    *done += res as usize;
                    if *done < buf.as_slice().len() {
                        self.backlog.push_back(Pending::Continue(slot));
                        return;
                    }
                    // Complete: the chained write, if any, takes over the slot and the reply.
                    if let Some(next) = then.take() {
                        let Chained {
                            file: f,
                            offset: o,
                            buf: b,
                        } = *next;
                        (*file, *offset, *buf, *done) = (f, o, b, 0);
                        self.backlog.push_back(Pending::Continue(slot));
                        return;
                    }
                }
                if let Some(InFlight::Write {
                    reply, file, then, ..
                }) = self.slots[slot].take()
                {
                    drop((file, then));
                    let out = match err {
                        Some(e) => Err(e),
                        None if res == 0 => Err(io::Error::from(io::ErrorKind::WriteZero)),
                        None => Ok(Done::Written),
                    };
                    reply.send(out);
                }
                self.release_slot(slot);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;

    #[test]
    fn block_buffers_are_mapped_and_reused_within_the_pool_bound() {
        let size = 1 << 20;
        let mut a = AlignedBuf::with_capacity(size);
        assert!(a.mapped && a.is_empty());
        assert_eq!(
            a.extend_from_slice(&vec![5u8; size + 10]),
            size,
            "only what fits"
        );
        assert!(is_aligned(a.as_ref()) && a.as_ref().iter().all(|&b| b == 5));
        let small = AlignedBuf::copy_from(&[1u8; 5000]);
        assert!(!small.mapped && small.len() == 5000 && !is_aligned(small.as_ref()));
        // Many buffers dropped at once: the pool keeps at most its bound, the rest is unmapped.
        let many: Vec<AlignedBuf> = (0..(POOL_MAX_BYTES / size + 8))
            .map(|_| AlignedBuf::with_capacity(size))
            .collect();
        drop(many);
        drop(a);
        let pooled: usize = POOL.lock().iter().map(|&(_, s)| s).sum();
        assert!(pooled <= POOL_MAX_BYTES, "{pooled} bytes pooled");
        // A reused buffer starts empty, whatever its pages held.
        let b = AlignedBuf::with_capacity(size);
        assert!(b.mapped && b.is_empty() && b.as_ref().is_empty());
    }

    fn file(dir: &std::path::Path) -> Arc<File> {
        Arc::new(
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(dir.join("f"))
                .expect("open"),
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_reads_and_writes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = file(dir.path());
        let ring = Arc::new(Ring::new(2).expect("io_uring"));
        let mut tasks = Vec::new();
        for i in 0..64u64 {
            let (ring, f) = (ring.clone(), f.clone());
            tasks.push(tokio::spawn(async move {
                let data = Bytes::from(vec![i as u8; 10_000]);
                ring.write(&f, i * 10_000, IoBuf::Bytes(data)).await?;
                let back = ring.read(&f, i * 10_000, 10_000).await?;
                assert!(back.iter().all(|&b| b == i as u8));
                Ok::<_, io::Error>(())
            }));
        }
        for t in tasks {
            t.await.expect("join").expect("io");
        }
        let past_end = ring.read(&f, 64 * 10_000, 10).await;
        assert_eq!(
            past_end.map(|_| ()).map_err(|e| e.kind()),
            Err(io::ErrorKind::UnexpectedEof)
        );
        assert!(ring.submitted() >= 64 * 2);
    }

    #[test]
    fn read_then_answers_on_the_ring_thread_even_when_the_ring_is_dropped_there() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = file(dir.path());
        std::os::unix::fs::FileExt::write_all_at(&*f, b"hello, ring", 0).expect("write");
        let ring = Arc::new(Ring::new(1).expect("io_uring"));
        let (tx, rx) = std::sync::mpsc::channel();
        let (go, wait_go) = std::sync::mpsc::channel::<()>();
        let held = ring.clone();
        ring.read_then(f.clone(), 7, 4, move |got| {
            let thread = std::thread::current().name().map(str::to_string);
            let _ = wait_go.recv();
            // The last owner lets go here, on the ring thread: Drop must not join itself.
            drop(held);
            let _ = tx.send((got.map(|b| b.to_vec()), thread));
        });
        drop(ring);
        go.send(()).expect("callback waiting");
        let (got, thread) = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("answered");
        assert_eq!(got.expect("read"), b"ring");
        assert_eq!(thread.as_deref(), Some("riffle-uring-0"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_chained_write_starts_only_after_the_first_and_never_after_a_failure() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = file(dir.path());
        let journal = Arc::new(
            OpenOptions::new()
                .append(true)
                .create(true)
                .open(dir.path().join("journal"))
                .expect("open journal"),
        );
        let ring = Ring::new(1).expect("io_uring");
        for i in 0..32u64 {
            let block = Bytes::from(vec![i as u8; 20_000]);
            let record = Bytes::from(vec![b'a' + i as u8; 4]);
            ring.write_then(
                (&data, i * 20_000, IoBuf::Bytes(block)),
                (&journal, 0, IoBuf::Bytes(record)),
            )
            .await
            .expect("chained write");
            // Both writes are done when the reply comes.
            let back = std::fs::read(dir.path().join("f")).expect("read data");
            assert_eq!(back.len() as u64, (i + 1) * 20_000);
            assert!(back[(i * 20_000) as usize..].iter().all(|&b| b == i as u8));
            let records = std::fs::read(dir.path().join("journal")).expect("read journal");
            assert_eq!(records.len() as u64, (i + 1) * 4);
        }

        // The first write fails (the file is open read-only): the second never happens.
        let read_only = Arc::new(File::open(dir.path().join("f")).expect("open read-only"));
        let failed = ring
            .write_then(
                (&read_only, 0, IoBuf::Bytes(Bytes::from_static(b"nope"))),
                (&journal, 0, IoBuf::Bytes(Bytes::from_static(b"XXXX"))),
            )
            .await;
        assert!(failed.is_err());
        let records = std::fs::read(dir.path().join("journal")).expect("read journal");
        assert_eq!(records.len(), 32 * 4);
        assert!(!records.contains(&b'X'));
    }

    #[test]
    fn aligned_buffers_are_aligned() {
        let b = AlignedBuf::copy_from(&[7u8; 5000]);
        assert_eq!(b.as_ref().len(), 5000);
        assert_eq!(b.as_ref().as_ptr() as usize % ALIGN, 0);
        assert!(b.as_ref().iter().all(|&x| x == 7));
    }
}
