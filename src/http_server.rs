//! A bounded HTTP/1.1 server, shared by the metrics endpoint (`metrics::http`) and the peer
//! port (`fetch::peer::server`).
//!
//! Built on hyper's HTTP/1 server connection, driven by a plain tokio accept loop: request
//! parsing, keep-alive, `HEAD`, pipelining and malformed input are hyper's well-tested code;
//! each caller brings only its handler and its [`ServerLimits`]. The address is bound before
//! [`serve`] returns, so a busy port is reported to the caller. At most `max_connections`
//! connections are served at once (more are closed at accept); request headers must arrive
//! within `header_timeout`, may be bounded in size, and a connection may be given a lifetime.
//! A failed accept (out of file descriptors and the like) backs off instead of spinning.
//! Dropping the [`HttpServer`] stops the accept loop and every open connection.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

/// Bounds on what the server's clients may cost.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    /// Time to send a request's line and headers.
    pub header_timeout: Duration,
    /// Bytes of request line and headers (None: hyper's default).
    pub max_header_bytes: Option<usize>,
    /// Connections served at once.
    pub max_connections: usize,
    /// Lifetime of a connection, keep-alive included (None: as long as the client keeps it).
    pub connection_lifetime: Option<Duration>,
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{0}")]
    Bind(std::io::Error),
    #[error("the server must be started inside a tokio runtime")]
    NoRuntime,
}

/// A running server; dropping it stops it (listener and connections).
#[derive(Debug)]
pub struct HttpServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl HttpServer {
    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Binds `addr` and answers every request with `handler` on the current tokio runtime. `name`
/// says what the server is in its log lines.
pub fn serve<H, F>(
    addr: SocketAddr,
    limits: ServerLimits,
    name: &'static str,
    handler: H,
) -> Result<HttpServer, ServeError>
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| ServeError::NoRuntime)?;
    let std_listener = std::net::TcpListener::bind(addr).map_err(ServeError::Bind)?;
    std_listener
        .set_nonblocking(true)
        .map_err(ServeError::Bind)?;
    let local = std_listener.local_addr().map_err(ServeError::Bind)?;
    let listener = {
        let _in_runtime = runtime.enter();
        TcpListener::from_std(std_listener).map_err(ServeError::Bind)?
    };
    let task = runtime.spawn(accept_loop(listener, limits, name, handler));
    Ok(HttpServer { addr: local, task })
}

async fn accept_loop<H, F>(
    listener: TcpListener,
    limits: ServerLimits,
    name: &'static str,
    handler: H,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    if let Some(bytes) = limits.max_header_bytes {
        builder.max_buf_size(bytes).max_header_size(bytes);
    }
    let builder = std::sync::Arc::new(builder);
    // Dropping the set (when this task is aborted) aborts every connection.
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "{name}: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if connections.len() >= limits.max_connections {
            tracing::debug!(%peer, "{name}: too many connections; closing");
            continue;
        }
        let _ = stream.set_nodelay(true);
        let builder = builder.clone();
        let handler = handler.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let answer = handler(req);
                async move { Ok::<_, Infallible>(answer.await) }
            });
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            let ended = match limits.connection_lifetime {
                Some(lifetime) => match tokio::time::timeout(lifetime, conn).await {
                    Ok(ended) => ended,
                    Err(_) => {
                        tracing::debug!(%peer, "{name}: a connection reached its lifetime");
                        return;
                    }
                },
                None => conn.await,
            };
            if let Err(e) = ended {
                tracing::debug!(%peer, error = %e, "{name}: a connection failed");
            }
        });
    }
}
