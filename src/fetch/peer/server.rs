//! The peer port: `GET /v1/block?bucket=&key=&etag=&size=&block=&bs=` (URL-encoded), signed.
//!
//! Bound only to `--peer-listen`. Every request is authenticated first ([`super::auth`]:
//! 401 otherwise). The block is served through this node's fetcher *locally*
//! ([`crate::fetch::Fetcher::serve_peer`]): from memory, from the NVMe cache (CRC-checked on
//! read, and only with this mount's read proof), or fetched from the store with `If-Match`
//! on the ETag, joined with any fetch of the same block in flight (one GET for every asker),
//! and never from another peer. Peer-serving GETs have their own concurrency limit, so nodes
//! that wait on each other's answers cannot starve each other's slots.
//!
//! The answer is the block's bytes with `x-riffle-crc32c`, `x-riffle-proof` (`1` when this
//! node holds a read proof for the asking principal: see the parent module) and the answer's
//! MAC. Errors: 400 a malformed query, 404 an object outside this mount's bucket and prefix or
//! not in the store, 409 another block size, 412 the object changed, 403 the store refused
//! this node's credential, 416 a block past the end, 502 the store failed.
//!
//! Connections are HTTP/1.1 keep-alive ([`crate::http_server`], as for the metrics endpoint), at most
//! [`MAX_CONNECTIONS`] at once; request headers must arrive within [`HEADER_TIMEOUT`].

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};

use super::auth::{self, Fields};
use super::client::{CRC, PATH, PROOF};
use super::Peers;
use crate::fetch::{FetchError, Fetcher, ObjectVersion};
use crate::http_server::{self, ServerLimits};
use crate::store::StoreError;

pub const MAX_CONNECTIONS: usize = 1024;
/// Also how long an idle keep-alive connection stays open (hyper's header-read timeout runs
/// while one waits for its next request): askers drop theirs well before.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
const _: () = assert!(super::client::POOL_IDLE.as_secs() * 3 <= HEADER_TIMEOUT.as_secs());

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen for peers on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the peer server must be started inside a tokio runtime")]
    NoRuntime,
}

/// A running peer port; dropping it stops it.
pub type PeerServer = crate::http_server::HttpServer;

/// Binds `addr` (before returning) and serves `fetcher`'s blocks to `peers`' members.
pub fn serve(
    addr: SocketAddr,
    fetcher: Arc<Fetcher>,
    peers: Arc<Peers>,
) -> Result<PeerServer, ServeError> {
    let limits = ServerLimits {
        header_timeout: HEADER_TIMEOUT,
        max_header_bytes: None,
        max_connections: MAX_CONNECTIONS,
        connection_lifetime: None,
    };
    let handler = move |req| {
        let (fetcher, peers) = (fetcher.clone(), peers.clone());
        async move { handle(req, &fetcher, &peers).await }
    };
    let server = http_server::serve(addr, limits, "peer port", handler).map_err(|e| match e {
        http_server::ServeError::Bind(source) => ServeError::Bind { addr, source },
        http_server::ServeError::NoRuntime => ServeError::NoRuntime,
    })?;
    tracing::info!(addr = %server.local_addr(), "serving cached blocks to peers");
    Ok(server)
}

/// [`serve`], but a port that cannot be bound (another program holds it) is a WARN and no
/// server, never a failed mount: the node still asks its peers, fetches the blocks it owns
/// from the store itself, and the other nodes' requests to it fail over to the next-ranked
/// member (in Kubernetes the mounter hands out the ports and checks them first: this is the
/// race it cannot see; csi's `peers` module).
pub fn serve_or_warn(
    addr: SocketAddr,
    fetcher: Arc<Fetcher>,
    peers: Arc<Peers>,
) -> Option<PeerServer> {
    match serve(addr, fetcher, peers) {
        Ok(server) => Some(server),
        Err(e) => {
            tracing::warn!(error = %e, "not serving peers: this node asks its peers and serves none");
            None
        }
    }
}

/// The query of a block request.
#[derive(Debug, PartialEq, Eq)]
struct BlockQuery {
    bucket: String,
    key: String,
    etag: String,
    size: u64,
    block: u64,
    block_size: u64,
}

fn parse_query(query: &str) -> Option<BlockQuery> {
    let mut q: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        q.insert(k.into_owned(), v.into_owned());
    }
    let text = |k: &str| q.get(k).filter(|v| !v.is_empty()).cloned();
    let number = |k: &str| q.get(k).and_then(|v| v.parse::<u64>().ok());
    Some(BlockQuery {
        bucket: text("bucket")?,
        key: text("key")?,
        etag: text("etag")?,
        size: number("size")?,
        block: number("block")?,
        block_size: number("bs").filter(|b| *b > 0)?,
    })
}

async fn handle(
    req: Request<Incoming>,
    fetcher: &Arc<Fetcher>,
    peers: &Peers,
) -> Response<Full<Bytes>> {
    let stats = peers.stats();
    let refuse = |status: StatusCode, why: &'static str| {
        stats.errors.fetch_add(1, Ordering::Relaxed);
        text(status, why)
    };
    let path_and_query = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    let authorization = header(AUTHORIZATION.as_str());
    let fields = match Fields::from_headers(header) {
        Ok(f) => f,
        Err(e) => {
            tracing::debug!(error = %e, "peer request refused");
            return refuse(StatusCode::UNAUTHORIZED, "unauthorized\n");
        }
    };
    if let Err(e) = peers.config().secret.verify(
        req.method().as_str(),
        &path_and_query,
        &fields,
        authorization,
        SystemTime::now(),
    ) {
        tracing::debug!(node = %fields.node, error = %e, "peer request refused");
        return refuse(StatusCode::UNAUTHORIZED, "unauthorized\n");
    }
    let authorization = authorization.unwrap_or_default().to_string();
    if req.method() != Method::GET || req.uri().path() != PATH {
        return refuse(StatusCode::NOT_FOUND, "not found\n");
    }
    let Some(q) = req.uri().query().and_then(parse_query) else {
        return refuse(StatusCode::BAD_REQUEST, "malformed block query\n");
    };
    let config = peers.config();
    if q.bucket != config.bucket || !q.key.starts_with(&config.prefix) {
        return refuse(StatusCode::NOT_FOUND, "not in this node's mount\n");
    }
    if q.block_size != fetcher.config().block_size {
        return refuse(StatusCode::CONFLICT, "another block size\n");
    }
    let obj = Arc::new(ObjectVersion {
        key: Arc::from(q.key.as_str()),
        etag: Arc::from(q.etag.as_str()),
        size: q.size,
    });
    if q.block >= fetcher.block_count(&obj) {
        return refuse(StatusCode::RANGE_NOT_SATISFIABLE, "no such block\n");
    }
    match fetcher.serve_peer(&obj, q.block).await {
        Ok(data) => {
            let proof = peers.attests(&fields.principal);
            let crc = crc32c::crc32c(&data);
            let mac = config
                .secret
                .sign_response(&authorization, crc, data.len(), proof);
            stats.blocks_served.fetch_add(1, Ordering::Relaxed);
            stats
                .bytes_served
                .fetch_add(data.len() as u64, Ordering::Relaxed);
            let mut r = Response::new(Full::new(data));
            let h = r.headers_mut();
            h.insert(
                CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            h.insert(CRC, HeaderValue::from(crc));
            h.insert(
                PROOF,
                HeaderValue::from_static(if proof { "1" } else { "0" }),
            );
            if let Ok(v) = HeaderValue::from_str(&mac) {
                h.insert(auth::RESPONSE_MAC, v);
            }
            r
        }
        Err(e) => {
            let status = match &e {
                FetchError::Changed => StatusCode::PRECONDITION_FAILED,
                FetchError::NotPermitted | FetchError::Store(StoreError::AccessDenied(_)) => {
                    StatusCode::FORBIDDEN
                }
                FetchError::Store(StoreError::NotFound) => StatusCode::NOT_FOUND,
                _ => StatusCode::BAD_GATEWAY,
            };
            tracing::debug!(key = %obj.key, block = q.block, error = %e, "cannot serve a block to a peer");
            refuse(status, "cannot serve the block\n")
        }
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_parse_with_encoding_and_reject_gaps() {
        let obj = ObjectVersion {
            key: Arc::from("a dir/ü&x=1.jpg"),
            etag: Arc::from("\"e\""),
            size: 10,
        };
        let path = super::super::client::PeerClient::path("bkt", &obj, 3, 1024);
        let query = path.split_once('?').unwrap().1;
        assert_eq!(
            parse_query(query),
            Some(BlockQuery {
                bucket: "bkt".into(),
                key: "a dir/ü&x=1.jpg".into(),
                etag: "\"e\"".into(),
                size: 10,
                block: 3,
                block_size: 1024,
            })
        );
        assert_eq!(
            parse_query("bucket=b&key=k&etag=e&size=1&block=x&bs=1"),
            None
        );
        assert_eq!(
            parse_query("bucket=b&key=&etag=e&size=1&block=0&bs=1"),
            None
        );
        assert_eq!(
            parse_query("bucket=b&key=k&etag=e&size=1&block=0&bs=0"),
            None
        );
    }
}
