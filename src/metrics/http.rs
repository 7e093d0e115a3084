//! A minimal HTTP/1.1 server for Prometheus: `GET /metrics` and a tiny index at `GET /`.
//!
//! Served by [`crate::http_server`] (hyper's HTTP/1 connection and a bounded accept loop);
//! this module is routing and limits. The limits ([`HttpLimits`]) keep a scraper or a port scanner
//! from holding resources: request headers are bounded in size (431 past it) and must arrive
//! within a timeout, each connection lives at most a fixed time, and at most a fixed number
//! of connections are served at once (more are closed at accept). Request bodies are never
//! read.
//!
//! Routes: `/metrics` (GET or HEAD) answers the [`Exporter`]'s OpenMetrics text, encoded on
//! the blocking pool because collecting the disk cache's statistics walks its index; `/`
//! answers a one-link HTML page; any other path is 404, and another method on a known path
//! 405. Dropping the [`MetricsServer`] stops the accept loop and every open connection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};

use super::prometheus::{Exporter, CONTENT_TYPE as OPENMETRICS};
use super::MetricsError;
use crate::http_server::{self, ServeError, ServerLimits};

const INDEX: &str = "<!DOCTYPE html>\n<html><head><title>riffle</title></head>\
<body><h1>riffle</h1><p><a href=\"/metrics\">metrics</a></p></body></html>\n";

/// Bounds on what one client may cost.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    /// Time to send a request's line and headers.
    pub header_timeout: Duration,
    /// Lifetime of a connection, keep-alive included.
    pub connection_lifetime: Duration,
    /// Bytes of request line and headers (at least 8 KiB, hyper's minimum buffer).
    pub max_header_bytes: usize,
    /// Connections served at once.
    pub max_connections: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_timeout: Duration::from_secs(10),
            connection_lifetime: Duration::from_secs(120),
            max_header_bytes: 16 * 1024,
            max_connections: 32,
        }
    }
}

/// A running metrics endpoint; dropping it stops it (listener and connections).
pub type MetricsServer = crate::http_server::HttpServer;

/// Binds `addr` and serves `exporter` on the current tokio runtime with [`HttpLimits`]'s
/// defaults. Must be called inside a runtime context (`Runtime::enter` or a task); the bind
/// happens before returning, so a busy port is reported here.
pub fn serve(addr: SocketAddr, exporter: Arc<Exporter>) -> Result<MetricsServer, MetricsError> {
    serve_with_limits(addr, exporter, HttpLimits::default())
}

/// [`serve`] with explicit limits.
pub fn serve_with_limits(
    addr: SocketAddr,
    exporter: Arc<Exporter>,
    limits: HttpLimits,
) -> Result<MetricsServer, MetricsError> {
    let limits = ServerLimits {
        header_timeout: limits.header_timeout,
        max_header_bytes: Some(limits.max_header_bytes.max(8 * 1024)),
        max_connections: limits.max_connections.max(1),
        connection_lifetime: Some(limits.connection_lifetime),
    };
    let handler = move |req| route(req, exporter.clone());
    http_server::serve(addr, limits, "metrics endpoint", handler).map_err(|e| match e {
        ServeError::Bind(source) => MetricsError::Bind { addr, source },
        ServeError::NoRuntime => MetricsError::NoRuntime,
    })
}

async fn route(req: Request<Incoming>, exporter: Arc<Exporter>) -> Response<Full<Bytes>> {
    let readable = matches!(*req.method(), Method::GET | Method::HEAD);
    match req.uri().path() {
        "/metrics" | "/" if !readable => {
            let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
            r.headers_mut()
                .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
            r
        }
        "/metrics" => metrics(exporter).await,
        "/" => {
            let mut r = Response::new(Full::new(Bytes::from_static(INDEX.as_bytes())));
            r.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            );
            r
        }
        _ => text(StatusCode::NOT_FOUND, "not found; try /metrics\n"),
    }
}

async fn metrics(exporter: Arc<Exporter>) -> Response<Full<Bytes>> {
    match tokio::task::spawn_blocking(move || exporter.encode()).await {
        Ok(Ok(body)) => {
            let mut r = Response::new(Full::new(Bytes::from(body)));
            let h = r.headers_mut();
            h.insert(CONTENT_TYPE, HeaderValue::from_static(OPENMETRICS));
            h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
            r
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot encode metrics");
            text(StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics\n")
        }
        Err(e) => {
            tracing::warn!(error = %e, "metrics encoding task failed");
            text(StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics\n")
        }
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;
    use crate::fs::latency::{FuseOp, FuseOps};
    use crate::metrics::StatsSource;

    struct Fixed;

    impl StatsSource for Fixed {
        fn stats(&self) -> serde_json::Value {
            serde_json::json!({"store": {"get_requests": 42}})
        }
    }

    fn start(limits: HttpLimits) -> (MetricsServer, Arc<FuseOps>) {
        let ops = FuseOps::new();
        let exporter = Arc::new(Exporter::new(Arc::new(Fixed), ops.clone(), &[]));
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        let server = serve_with_limits(addr, exporter, limits).expect("serve");
        (server, ops)
    }

    /// Sends `raw` on a new connection and returns everything the server sends until it closes.
    async fn exchange(addr: SocketAddr, raw: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        // The server may close before reading everything (oversized headers): not an error.
        let _ = s.write_all(raw).await;
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
            .await
            .expect("the server closes the connection")
            .ok();
        String::from_utf8_lossy(&out).into_owned()
    }

    async fn get(addr: SocketAddr, path: &str) -> String {
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        exchange(addr, req.as_bytes()).await
    }

    fn status(response: &str) -> &str {
        response.split(' ').nth(1).unwrap_or("")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn metrics_are_served_with_the_openmetrics_content_type() {
        let (server, ops) = start(HttpLimits::default());
        ops.record(FuseOp::Read, Duration::from_millis(1));
        let r = get(server.local_addr(), "/metrics").await;
        assert_eq!(status(&r), "200", "{r}");
        assert!(
            r.to_ascii_lowercase().contains(
                "\r\ncontent-type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\n"
            ),
            "{r}"
        );
        assert!(r.contains("\nriffle_store_get_requests_total 42\n"), "{r}");
        assert!(
            r.contains("riffle_fuse_op_duration_seconds_count{op=\"read\"} 1"),
            "{r}"
        );
        assert!(r.ends_with("# EOF\n"), "{r}");
        let q = get(server.local_addr(), "/metrics?x=1").await;
        assert_eq!(status(&q), "200", "{q}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn index_not_found_and_wrong_method() {
        let (server, _) = start(HttpLimits::default());
        let addr = server.local_addr();
        let index = get(addr, "/").await;
        assert_eq!(status(&index), "200", "{index}");
        assert!(index.contains("href=\"/metrics\""), "{index}");
        let missing = get(addr, "/metrics/extra").await;
        assert_eq!(status(&missing), "404", "{missing}");
        assert_eq!(status(&get(addr, "/favicon.ico").await), "404");
        let post = exchange(
            addr,
            b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
        )
        .await;
        assert_eq!(status(&post), "405", "{post}");
        let head = exchange(
            addr,
            b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert_eq!(status(&head), "200", "{head}");
        assert!(!head.contains("# EOF"), "HEAD has no body: {head}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn survives_malformed_oversized_and_silent_clients() {
        let limits = HttpLimits {
            header_timeout: Duration::from_millis(300),
            ..HttpLimits::default()
        };
        let (server, _) = start(limits);
        let addr = server.local_addr();

        let garbage = exchange(addr, b"\x00\x01 not http at all\r\n\r\n").await;
        assert!(garbage.is_empty() || status(&garbage) == "400", "{garbage}");

        let huge = format!(
            "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
            "a".repeat(64 * 1024)
        );
        let big = exchange(addr, huge.as_bytes()).await;
        assert!(big.is_empty() || status(&big) == "431", "{big}");

        // A client that never finishes its headers is cut off by the header timeout.
        let started = std::time::Instant::now();
        let silent = exchange(addr, b"GET /metrics HTTP/1.1\r\nHost:").await;
        assert!(!silent.contains("# EOF"), "{silent}");
        assert!(started.elapsed() < Duration::from_secs(5));

        // And the server still answers.
        let ok = get(addr, "/metrics").await;
        assert_eq!(status(&ok), "200", "{ok}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn keep_alive_serves_several_requests_and_drop_stops_the_server() {
        let (server, _) = start(HttpLimits::default());
        let addr = server.local_addr();
        let two = exchange(
            addr,
            b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert_eq!(two.matches("HTTP/1.1 200").count(), 1, "{two}");
        assert_eq!(two.matches("HTTP/1.1 404").count(), 1, "{two}");
        drop(server);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(TcpStream::connect(addr).await.is_err(), "still listening");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_over_the_limit_are_closed() {
        let limits = HttpLimits {
            max_connections: 1,
            ..HttpLimits::default()
        };
        let (server, _) = start(limits);
        let addr = server.local_addr();
        // Hold one connection open (headers unfinished).
        let mut held = TcpStream::connect(addr).await.expect("connect");
        held.write_all(b"GET /metrics HTTP/1.1\r\n")
            .await
            .expect("write");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let refused = get(addr, "/metrics").await;
        assert!(refused.is_empty(), "{refused}");
        drop(held);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let ok = get(addr, "/metrics").await;
        assert_eq!(status(&ok), "200", "{ok}");
    }

    #[test]
    fn needs_a_runtime_and_reports_a_busy_port() {
        let exporter = Arc::new(Exporter::new(Arc::new(Fixed), FuseOps::new(), &[]));
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        assert!(matches!(
            serve(addr, exporter.clone()),
            Err(MetricsError::NoRuntime)
        ));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let _in = rt.enter();
        let first = serve(addr, exporter.clone()).expect("serve");
        let err = serve(first.local_addr(), exporter).expect_err("port is taken");
        assert!(matches!(err, MetricsError::Bind { .. }), "{err}");
        assert!(err.to_string().contains("cannot listen"), "{err}");
    }
}
