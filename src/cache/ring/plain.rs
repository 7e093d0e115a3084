//! The fallback for a process that may not use io_uring: plain `pread`/`pwrite` threads.
//!
//! Container runtimes' default seccomp profiles refuse `io_uring_setup` (podman's with
//! `ENOSYS`, measured in `csi/tests/containers.rs`; Docker's since 25.0), and so does the
//! sysctl `kernel.io_uring_disabled` (`EPERM`). Before this fallback, `riffle mount` with a
//! cache directory inside such a container (a workstation container, a pod that mounts by
//! itself) refused to start ("starting io_uring: Function not implemented").
//!
//! Each lane runs [`THREADS`] threads that take requests from the lane's channel and do them
//! one at a time with `pread`/`pwrite`, with the ring's semantics (a read of exactly `len`
//! bytes, an error at end of file; a chained write only after the first completes), so no
//! caller can tell the difference but speed. On the development VM one thread's `O_DIRECT`
//! `pread` of 1 MiB blocks ran at 850–2100 MiB/s, the ring's at 650–1020 (the `cache`
//! module's measurements): for whole blocks the device dominates; the threads cost more per
//! small request and keep at most [`THREADS`] in flight per lane instead of [`MAX_INFLIGHT`].
//!
//! [`MAX_INFLIGHT`]: super::MAX_INFLIGHT

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::{mpsc, Arc, Mutex};

use bytes::Bytes;

use super::{ended_early, AlignedBuf, Chained, Done, IoBuf, Op, Request};

/// Threads per lane: requests in flight per lane (the NVMe's parallelism needs a few).
pub(super) const THREADS: usize = 4;

/// Starts the threads of one lane; they exit when every sender of `rx` is gone.
pub(super) fn spawn(
    lane: usize,
    rx: mpsc::Receiver<Request>,
) -> io::Result<Vec<std::thread::JoinHandle<()>>> {
    let rx = Arc::new(Mutex::new(rx));
    (0..THREADS)
        .map(|n| {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("riffle-cacheio-{lane}.{n}"))
                .spawn(move || run(&rx))
        })
        .collect()
}

fn run(rx: &Mutex<mpsc::Receiver<Request>>) {
    loop {
        // The lock is held only while waiting for the next request, never during its I/O.
        let next = match rx.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok(Request { op, reply }) = next else {
            return;
        };
        reply.send(perform(op));
    }
}

/// Does `op` with `pread`/`pwrite`; the files are let go before the caller gets the result.
fn perform(op: Op) -> io::Result<Done> {
    match op {
        Op::Read { file, offset, len } => {
            let mut buf = AlignedBuf::with_capacity(len);
            while buf.len < len {
                let done = buf.len;
                // SAFETY: `done < len <= capacity`: the kernel writes inside the buffer.
                let n = unsafe {
                    libc::pread(
                        file.as_raw_fd(),
                        buf.as_mut_ptr().add(done).cast(),
                        len - done,
                        (offset + done as u64) as libc::off_t,
                    )
                };
                match n {
                    0 => return Err(ended_early()),
                    n if n > 0 => buf.len += n as usize,
                    _ => retry_or(io::Error::last_os_error())?,
                }
            }
            drop(file);
            Ok(Done::Read(Bytes::from_owner(buf)))
        }
        Op::Write {
            file,
            offset,
            buf,
            then,
        } => {
            write_all(&file, offset, &buf)?;
            drop((file, buf));
            if let Some(next) = then {
                let Chained { file, offset, buf } = *next;
                write_all(&file, offset, &buf)?;
            }
            Ok(Done::Written)
        }
    }
}

fn write_all(file: &File, offset: u64, buf: &IoBuf) -> io::Result<()> {
    let data = buf.as_slice();
    let mut done = 0;
    while done < data.len() {
        let rest = &data[done..];
        // SAFETY: `rest` is a live slice for the duration of the call.
        let n = unsafe {
            libc::pwrite(
                file.as_raw_fd(),
                rest.as_ptr().cast(),
                rest.len(),
                (offset + done as u64) as libc::off_t,
            )
        };
        match n {
            0 => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            n if n > 0 => done += n as usize,
            _ => retry_or(io::Error::last_os_error())?,
        }
    }
    Ok(())
}

/// Ok for an interrupted call (the loop tries again), else the error.
fn retry_or(e: io::Error) -> io::Result<()> {
    match e.raw_os_error() {
        Some(libc::EINTR) | Some(libc::EAGAIN) => Ok(()),
        _ => Err(e),
    }
}
