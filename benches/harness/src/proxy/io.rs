//! The downstream socket wrapper that can end a connection with a reset.
//!
//! Hyper owns the socket while it serves a connection, so the response body
//! cannot reach it. Instead the body arms a shared [`ResetSwitch`] and then
//! fails; hyper drops the connection, and [`ResettableStream`]'s `Drop` sets
//! `SO_LINGER` to zero just before the socket closes, which makes the kernel
//! send RST instead of FIN (and throw away anything still unsent).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Asks the connection to end with RST when it closes.
#[derive(Debug, Clone, Default)]
pub struct ResetSwitch(Arc<AtomicBool>);

impl ResetSwitch {
    /// Arms the switch: the socket resets instead of closing cleanly.
    pub fn arm(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    fn armed(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// A TCP stream that resets on drop once its [`ResetSwitch`] is armed.
#[derive(Debug)]
pub struct ResettableStream {
    stream: TcpStream,
    switch: ResetSwitch,
}

impl ResettableStream {
    /// Wraps `stream`; arm `switch` to reset it on drop.
    pub fn new(stream: TcpStream, switch: ResetSwitch) -> Self {
        ResettableStream { stream, switch }
    }
}

impl Drop for ResettableStream {
    fn drop(&mut self) {
        if self.switch.armed() {
            let sock = socket2::SockRef::from(&self.stream);
            if let Err(err) = sock.set_linger(Some(Duration::ZERO)) {
                tracing::warn!(%err, "could not set SO_LINGER=0 for a reset fault");
            }
        }
    }
}

impl AsyncRead for ResettableStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for ResettableStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.switch.armed() {
            // A shutdown would send FIN before the reset; skip it.
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
