//! The ring thread: takes requests from its channel, submits them in batches with one
//! `io_uring_enter` that also waits, reaps completions, resubmits the rest of short transfers,
//! starts the second write of a chain, and replies (see the module documentation of
//! [`super`]). It sleeps only in the kernel, woken by a read of an eventfd it keeps armed.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;

use bytes::Bytes;
use io_uring::{opcode, types, IoUring};

use super::{
    ended_early, AlignedBuf, Chained, Done, IoBuf, Op, Reply, Request, Wake, MAX_INFLIGHT,
};

const WAKE_TOKEN: u64 = u64::MAX;

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

pub(super) struct RingThread {
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
    pub(super) fn new(ring: IoUring, rx: mpsc::Receiver<Request>, wake: Arc<Wake>) -> Self {
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

    pub(super) fn run(mut self) {
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
                        None if res == 0 => Err(ended_early()),
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
