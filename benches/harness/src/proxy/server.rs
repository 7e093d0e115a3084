//! Accept loops and connection lifetimes, with graceful shutdown.
//!
//! [`run_proxy`] accepts client connections and serves each on its own task
//! with hyper's HTTP/1.1 server (keep-alive on, original header case kept,
//! no `Date` added, `TCP_NODELAY` set). [`run_control`] does the same for
//! the control endpoint.
//!
//! Shutdown is a `watch` channel flipped to `true` (or dropped). The accept
//! loop stops accepting, every connection is told to finish its current
//! response and close, and the loop waits up to the drain timeout before
//! aborting what is left.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::control;
use super::forward::{handle, ConnContext};
use super::io::{ResetSwitch, ResettableStream};
use super::state::ProxyState;

/// Resolves when shutdown is asked for (or its sender is gone).
pub async fn shutdown_requested(mut rx: watch::Receiver<bool>) {
    // An error means the sender was dropped: shut down too.
    let _ = rx.wait_for(|stop| *stop).await;
}

/// Keeps the active-connection count right even when a task is aborted.
struct ActiveGuard(Arc<ProxyState>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.stats.connection_closed();
    }
}

/// Accepts connections on `listener` until shutdown, serving each with
/// `serve`, then drains them for up to `drain`.
async fn accept_loop<F, Fut>(
    name: &'static str,
    listener: TcpListener,
    shutdown: watch::Receiver<bool>,
    drain: Duration,
    serve: F,
) where
    F: Fn(TcpStream, SocketAddr, watch::Receiver<bool>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut conns = JoinSet::new();
    let stop = shutdown_requested(shutdown.clone());
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    if let Err(err) = stream.set_nodelay(true) {
                        tracing::warn!(%err, "could not set TCP_NODELAY");
                    }
                    conns.spawn(serve(stream, peer, shutdown.clone()));
                }
                Err(err) => {
                    // Typically out of file descriptors: back off a little.
                    tracing::warn!(%err, listener = name, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    let open = conns.len();
    if open > 0 {
        tracing::info!(open, listener = name, "draining connections");
    }
    let drained =
        tokio::time::timeout(drain, async { while conns.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(
            left = conns.len(),
            listener = name,
            "drain timed out; aborting"
        );
        conns.abort_all();
        while conns.join_next().await.is_some() {}
    }
}

/// Runs the proxy listener until shutdown.
pub async fn run_proxy(
    listener: TcpListener,
    state: Arc<ProxyState>,
    shutdown: watch::Receiver<bool>,
    drain: Duration,
) {
    accept_loop(
        "proxy",
        listener,
        shutdown,
        drain,
        move |stream, peer, stop| serve_proxy_conn(stream, peer, Arc::clone(&state), stop),
    )
    .await;
}

async fn serve_proxy_conn(
    stream: TcpStream,
    peer: SocketAddr,
    state: Arc<ProxyState>,
    shutdown: watch::Receiver<bool>,
) {
    state.stats.connection_opened();
    let _active = ActiveGuard(Arc::clone(&state));
    let reset = ResetSwitch::default();
    let ctx = Arc::new(ConnContext::new(state, peer, reset.clone()));
    let io = TokioIo::new(ResettableStream::new(stream, reset));
    let service = service_fn(move |req| handle(Arc::clone(&ctx), req));
    let conn = http1::Builder::new()
        .preserve_header_case(true)
        .auto_date_header(false)
        .serve_connection(io, service);
    tokio::pin!(conn);
    let stop = shutdown_requested(shutdown);
    tokio::pin!(stop);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        _ = &mut stop => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(err) = result {
        tracing::debug!(%peer, %err, "client connection ended with an error");
    }
}

/// Runs the control endpoint until shutdown; `proxy_addr` is the proxy's
/// own listening address, reported at `GET /`.
pub async fn run_control(
    listener: TcpListener,
    state: Arc<ProxyState>,
    proxy_addr: SocketAddr,
    shutdown: watch::Receiver<bool>,
) {
    let drain = Duration::from_secs(1);
    accept_loop(
        "control",
        listener,
        shutdown,
        drain,
        move |stream, peer, stop| {
            let state = Arc::clone(&state);
            async move {
                let service =
                    service_fn(move |req| control::handle(Arc::clone(&state), proxy_addr, req));
                let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
                tokio::pin!(conn);
                let result = tokio::select! {
                    result = conn.as_mut() => result,
                    _ = shutdown_requested(stop) => {
                        conn.as_mut().graceful_shutdown();
                        conn.await
                    }
                };
                if let Err(err) = result {
                    tracing::debug!(%peer, %err, "control connection ended with an error");
                }
            }
        },
    )
    .await;
}
