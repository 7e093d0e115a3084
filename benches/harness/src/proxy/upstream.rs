//! The upstream side: one upstream connection per downstream connection.
//!
//! Each client connection gets its own [`UpstreamLink`], which opens a TCP
//! connection to the S3 server the first time it is needed and keeps it for
//! the client connection's next requests. The upstream thus sees the same
//! number of connections, and the same keep-alive pattern, as it would
//! without the proxy. When the upstream closes its side (idle timeout,
//! `Connection: close`) the next request opens a new one; a request that
//! could not even be written on a stale connection is retried once on a
//! fresh one (hyper hands such a request back untouched).
//!
//! Requests are written with hyper's low-level HTTP/1.1 client, which adds
//! nothing: the `Host` header and every other header go out as the client
//! sent them (original header-name case kept), the request target in origin
//! form.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::stats::Stats;

/// The request body type sent upstream.
pub type UpstreamBody = UnsyncBoxBody<Bytes, hyper::Error>;

/// Forwarding a request upstream failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The TCP connection could not be made.
    #[error("connect to upstream {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// HTTP-level failure (handshake, write, or reading the response head).
    #[error("upstream HTTP: {0}")]
    Http(#[from] hyper::Error),
}

/// The upstream connection of one downstream connection.
pub struct UpstreamLink {
    addr: SocketAddr,
    stats: Arc<Stats>,
    sender: Option<SendRequest<UpstreamBody>>,
}

impl UpstreamLink {
    /// A link to `addr`; no connection is made until the first request.
    pub fn new(addr: SocketAddr, stats: Arc<Stats>) -> Self {
        UpstreamLink {
            addr,
            stats,
            sender: None,
        }
    }

    /// Sends `req` and returns the response head (the body streams on).
    pub async fn send(
        &mut self,
        req: Request<UpstreamBody>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let mut req = req;
        let mut retried = false;
        loop {
            let sender = self.ready_sender().await?;
            match sender.try_send_request(req).await {
                Ok(response) => return Ok(response),
                Err(mut err) => {
                    self.sender = None;
                    match err.take_message() {
                        Some(unsent) if !retried => {
                            tracing::debug!(error = %err.error(), "upstream connection was stale; retrying");
                            req = unsent;
                            retried = true;
                        }
                        _ => return Err(err.into_error().into()),
                    }
                }
            }
        }
    }

    /// The live connection, opening a new one if there is none.
    async fn ready_sender(&mut self) -> Result<&mut SendRequest<UpstreamBody>, UpstreamError> {
        if let Some(sender) = self.sender.as_mut() {
            if sender.is_closed() || sender.ready().await.is_err() {
                self.sender = None;
            }
        }
        let sender = match self.sender.take() {
            Some(sender) => sender,
            None => self.connect().await?,
        };
        Ok(self.sender.insert(sender))
    }

    async fn connect(&self) -> Result<SendRequest<UpstreamBody>, UpstreamError> {
        let stream =
            TcpStream::connect(self.addr)
                .await
                .map_err(|source| UpstreamError::Connect {
                    addr: self.addr,
                    source,
                })?;
        if let Err(err) = stream.set_nodelay(true) {
            tracing::warn!(%err, "could not set TCP_NODELAY upstream");
        }
        let (mut sender, conn) = http1::Builder::new()
            .preserve_header_case(true)
            .handshake(TokioIo::new(stream))
            .await?;
        tokio::spawn(async move {
            if let Err(err) = conn.await {
                tracing::debug!(%err, "upstream connection ended with an error");
            }
        });
        sender.ready().await?;
        self.stats.upstream_connected();
        tracing::trace!(addr = %self.addr, "new upstream connection");
        Ok(sender)
    }
}
