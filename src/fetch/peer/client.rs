//! Asking a peer for one block: `GET http://PEER/v1/block?...`, signed ([`super::auth`]),
//! over a pool of keep-alive HTTP/1 connections (hyper-util's client, already in the build
//! for the AWS SDK). The answer is accepted only with status 200, exactly the block's length,
//! the CRC32C the owner sent, and the owner's MAC over both and the proof flag.
//!
//! Keep-alive has one race: a peer's server closes a connection that has waited the
//! server's `HEADER_TIMEOUT` for its next request (hyper's header-read timeout runs while a
//! keep-alive connection is idle), and a request written at that moment fails although the
//! peer is healthy. So the pool drops a connection after [`POOL_IDLE`], well before the peer
//! would, and a request that finds its connection closed before any answer (or reset under
//! it; a peer's restart does that too) is sent once more on a fresh one: a block GET is
//! idempotent, and the retry is not a failure of the peer.

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::header::AUTHORIZATION;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::auth::{self, AuthError, Fields, Secret};
use super::{ObjectVersion, PeerConfig};
use crate::fetch::buffer::Filling;

pub const PATH: &str = "/v1/block";
pub const CRC: &str = "x-riffle-crc32c";
pub const PROOF: &str = "x-riffle-proof";

/// How long an idle pooled connection is kept: at most a third of the time after which the
/// peer's server closes it (checked where that is set, in `server`).
pub const POOL_IDLE: std::time::Duration = std::time::Duration::from_secs(10);

/// Why a peer's answer was not used.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("no answer within the peer timeout")]
    Timeout,
    #[error("request failed: {0}")]
    Request(String),
    #[error("answered {0}")]
    Status(u16),
    #[error("the block has {got} bytes, expected {want}")]
    Length { got: usize, want: u64 },
    #[error("the block does not match its CRC32C")]
    Crc,
    #[error("the answer is not authentic: {0}")]
    Auth(AuthError),
}

impl PeerError {
    /// Whether this counts against the peer (opens its breaker): anything but an answer
    /// saying it cannot serve this object (not found, changed, not permitted, other bucket).
    pub fn is_peer_fault(&self) -> bool {
        !matches!(self, PeerError::Status(400 | 403 | 404 | 409 | 412 | 416))
    }
}

/// See the module documentation.
pub struct PeerClient {
    http: Client<HttpConnector, Empty<Bytes>>,
    secret: Secret,
    node: String,
    principal: String,
    bucket: String,
    block_size: u64,
}

impl PeerClient {
    pub fn new(config: &PeerConfig, node: &str) -> PeerClient {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(config.timeout));
        let http = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE)
            .build(connector);
        PeerClient {
            http,
            secret: config.secret.clone(),
            node: node.to_string(),
            principal: config.principal.clone(),
            bucket: config.bucket.clone(),
            block_size: config.block_size,
        }
    }

    /// The path and query of a block request.
    pub fn path(bucket: &str, obj: &ObjectVersion, index: u64, block_size: u64) -> String {
        let query = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("bucket", bucket)
            .append_pair("key", &obj.key)
            .append_pair("etag", &obj.etag)
            .append_pair("size", &obj.size.to_string())
            .append_pair("block", &index.to_string())
            .append_pair("bs", &block_size.to_string())
            .finish();
        format!("{PATH}?{query}")
    }

    /// Block `index` of `obj` (`len` bytes) from the peer at `addr` (`HOST:PORT`), and whether
    /// the peer attests a read proof of this mount's principal.
    pub async fn get(
        &self,
        addr: &str,
        obj: &ObjectVersion,
        index: u64,
        len: u64,
    ) -> Result<(Bytes, bool), PeerError> {
        let path = Self::path(&self.bucket, obj, index, self.block_size);
        let fields = Fields::now(&self.node, &self.principal);
        let authorization = self.secret.sign("GET", &path, &fields);
        let mut retried = false;
        let response = loop {
            let request = hyper::Request::get(format!("http://{addr}{path}"))
                .header(AUTHORIZATION, &authorization)
                .header(auth::TIME, fields.time.to_string())
                .header(auth::NODE, &fields.node)
                .header(auth::PRINCIPAL, &fields.principal)
                .body(Empty::new())
                .map_err(|e| PeerError::Request(e.to_string()))?;
            match self.http.request(request).await {
                Err(e) if !retried && closed_before_answer(&e) => {
                    tracing::debug!(peer = %addr, error = %error_chain(&e), "the connection closed under the request; sending it once more");
                    retried = true;
                }
                other => break other.map_err(|e| PeerError::Request(error_chain(&e)))?,
            }
        };
        let status = response.status();
        if status != hyper::StatusCode::OK {
            return Err(PeerError::Status(status.as_u16()));
        }
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let crc: u32 = header(CRC)
            .and_then(|c| c.parse().ok())
            .ok_or(PeerError::Auth(AuthError::Header(CRC)))?;
        let proof = header(PROOF).as_deref() == Some("1");
        let mac = header(auth::RESPONSE_MAC);
        let limit = usize::try_from(len).unwrap_or(usize::MAX).saturating_add(1);
        let body = Limited::new(response.into_body(), limit)
            .collect()
            .await
            .map_err(|e| PeerError::Request(format!("body: {e}")))?
            .to_bytes();
        if body.len() as u64 != len {
            return Err(PeerError::Length {
                got: body.len(),
                want: len,
            });
        }
        self.secret
            .verify_response(&authorization, crc, body.len(), proof, mac.as_deref())
            .map_err(PeerError::Auth)?;
        if crc32c::crc32c(&body) != crc {
            return Err(PeerError::Crc);
        }
        // A body that came in one read is a slice of the connection's read buffer (up to
        // 400 KiB): copied into a buffer of the block's own size, it pins only itself.
        Ok((Filling::copy_of(&body), proof))
    }
}

/// Whether a request failed because its (pooled) connection closed before any answer came.
fn closed_before_answer(e: &hyper_util::client::legacy::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(h) = s.downcast_ref::<hyper::Error>() {
            if h.is_incomplete_message() || h.is_canceled() || h.is_closed() {
                return true;
            }
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            );
        }
        source = s.source();
    }
    false
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
