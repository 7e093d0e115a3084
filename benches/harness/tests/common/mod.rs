//! Test helpers: a fake S3 upstream and a raw HTTP/1.1 client that reports
//! exactly how a response ended.
#![allow(dead_code)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// `len` deterministic pseudo-random bytes.
pub fn pattern(len: usize, seed: u64) -> Bytes {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    Bytes::from(out)
}

pub fn sha256(data: &[u8]) -> Vec<u8> {
    Sha256::digest(data).to_vec()
}

/// One request as the fake upstream saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub uri: String,
    pub host: Option<String>,
    pub headers: Vec<(String, String)>,
    pub body_len: usize,
    pub body_sha256: Vec<u8>,
}

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// A tiny S3-like server: objects in memory, `Range` honoured, `PUT`
/// stores, `GET /bucket` lists the bucket's keys as ListObjectsV2 does
/// (`prefix`, `delimiter`, `max-keys`, `continuation-token`; pages of at
/// most [`FakeUpstream::set_list_page`] entries). Bodies go out in 64 KiB
/// frames with a `Content-Length`.
pub struct FakeUpstream {
    pub addr: SocketAddr,
    pub objects: Arc<Mutex<HashMap<String, Bytes>>>,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    list_page: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeUpstream {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind fake");
        let addr = listener.local_addr().expect("fake addr");
        let objects: Arc<Mutex<HashMap<String, Bytes>>> = Arc::default();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let list_page = Arc::new(AtomicUsize::new(1000));
        let (o, s, l) = (
            Arc::clone(&objects),
            Arc::clone(&seen),
            Arc::clone(&list_page),
        );
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (o, s, l) = (Arc::clone(&o), Arc::clone(&s), Arc::clone(&l));
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        serve(Arc::clone(&o), Arc::clone(&s), Arc::clone(&l), req)
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        FakeUpstream {
            addr,
            objects,
            seen,
            list_page,
            task,
        }
    }

    /// Entries (keys and common prefixes) a listing page holds at most,
    /// whatever `max-keys` asks (1,000 by default, as S3).
    pub fn set_list_page(&self, n: usize) {
        self.list_page.store(n.max(1), Ordering::Relaxed);
    }

    pub fn remove(&self, key: &str) {
        self.objects.lock().remove(key);
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn put(&self, key: &str, data: Bytes) {
        self.objects.lock().insert(key.to_owned(), data);
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().clone()
    }
}

fn full(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let body = body.into();
    let mut response = Response::new(Full::new(body.clone()).boxed_unsync());
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_LENGTH,
        body.len().to_string().parse().expect("len header"),
    );
    response
}

fn chunked_frames(data: Bytes) -> Body {
    let frames: Vec<Result<Frame<Bytes>, Infallible>> = (0..data.len())
        .step_by(64 * 1024)
        .map(|at| {
            Ok(Frame::data(
                data.slice(at..(at + 64 * 1024).min(data.len())),
            ))
        })
        .collect();
    StreamBody::new(futures_util::stream::iter(frames)).boxed_unsync()
}

/// Parses `bytes=a-b`, `bytes=a-`, `bytes=-n` against `len`.
fn parse_range(value: &str, len: u64) -> Option<(u64, u64)> {
    let spec = value.strip_prefix("bytes=")?;
    let (a, b) = spec.split_once('-')?;
    let (start, end) = match (a, b) {
        ("", n) => {
            let n: u64 = n.parse().ok()?;
            (len.saturating_sub(n), len.checked_sub(1)?)
        }
        (a, "") => (a.parse().ok()?, len.checked_sub(1)?),
        (a, b) => (
            a.parse().ok()?,
            b.parse::<u64>().ok()?.min(len.checked_sub(1)?),
        ),
    };
    (start <= end && end < len).then_some((start, end))
}

/// `%XX` and `+` decoded (query values as clients encode them).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A ListObjectsV2 answer for `bucket` from the objects (`bucket/key`),
/// the continuation token being the last entry of the page before.
fn list_bucket(
    objects: &HashMap<String, Bytes>,
    bucket: &str,
    query: &str,
    page_cap: usize,
) -> String {
    let param = |name: &str| {
        query
            .split('&')
            .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| percent_decode(v))
    };
    let prefix = param("prefix").unwrap_or_default();
    let delimiter = param("delimiter").filter(|d| !d.is_empty());
    let token = param("continuation-token");
    let max_keys = param("max-keys")
        .and_then(|m| m.parse::<usize>().ok())
        .unwrap_or(1000)
        .min(page_cap);
    let mut keys: Vec<(String, usize)> = objects
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(&format!("{bucket}/"))?.to_string(), v.len())))
        .filter(|(k, _)| k.starts_with(&prefix))
        .collect();
    keys.sort();
    // Keys and common prefixes in order, each prefix once.
    let mut entries: Vec<(String, Option<usize>)> = Vec::new();
    for (k, size) in keys {
        let rest = &k[prefix.len()..];
        match delimiter
            .as_deref()
            .and_then(|d| rest.find(d).map(|i| i + d.len()))
        {
            Some(end) => {
                let p = format!("{prefix}{}", &rest[..end]);
                if entries.last().map(|(e, _)| e) != Some(&p) {
                    entries.push((p, None));
                }
            }
            None => entries.push((k, Some(size))),
        }
    }
    let start = token.map_or(0, |t| {
        entries
            .iter()
            .position(|(e, _)| *e == t)
            .map_or(entries.len(), |i| i + 1)
    });
    let page: Vec<&(String, Option<usize>)> = entries.iter().skip(start).take(max_keys).collect();
    let truncated = start + page.len() < entries.len();
    let mut xml = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult \
         xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>{}</Name><Prefix>{}</Prefix>\
         <KeyCount>{}</KeyCount><MaxKeys>{max_keys}</MaxKeys><IsTruncated>{truncated}</IsTruncated>",
        xml_escape(bucket),
        xml_escape(&prefix),
        page.len()
    );
    if let Some(d) = &delimiter {
        xml += &format!("<Delimiter>{}</Delimiter>", xml_escape(d));
    }
    if truncated {
        if let Some((last, _)) = page.last() {
            xml += &format!(
                "<NextContinuationToken>{}</NextContinuationToken>",
                xml_escape(last)
            );
        }
    }
    for (e, size) in &page {
        match size {
            Some(n) => {
                xml += &format!(
                    "<Contents><Key>{}</Key><Size>{n}</Size><ETag>\"abc\"</ETag>\
                     <LastModified>2026-01-01T00:00:00.000Z</LastModified>\
                     <StorageClass>STANDARD</StorageClass></Contents>",
                    xml_escape(e)
                )
            }
            None => {
                xml += &format!(
                    "<CommonPrefixes><Prefix>{}</Prefix></CommonPrefixes>",
                    xml_escape(e)
                )
            }
        }
    }
    xml + "</ListBucketResult>"
}

async fn serve(
    objects: Arc<Mutex<HashMap<String, Bytes>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    list_page: Arc<AtomicUsize>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let key = parts.uri.path().trim_start_matches('/').to_owned();
    seen.lock().push(Seen {
        method: parts.method.to_string(),
        uri: parts.uri.to_string(),
        host: parts
            .headers
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(str::to_owned),
        headers: parts
            .headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned()))
            .collect(),
        body_len: body.len(),
        body_sha256: sha256(&body),
    });
    let is_bucket = !key.contains('/') || key.ends_with('/');
    let response = match parts.method {
        Method::PUT => {
            let etag = format!("\"{}\"", hex(&sha256(&body)[..8]));
            objects.lock().insert(key, body);
            let mut r = full(StatusCode::OK, "");
            r.headers_mut()
                .insert(http::header::ETAG, etag.parse().expect("etag"));
            r
        }
        Method::GET if is_bucket => {
            let xml = list_bucket(
                &objects.lock(),
                key.trim_end_matches('/'),
                parts.uri.query().unwrap_or(""),
                list_page.load(Ordering::Relaxed),
            );
            let mut r = full(StatusCode::OK, xml);
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                "application/xml".parse().expect("content type"),
            );
            r
        }
        Method::GET | Method::HEAD => {
            let Some(data) = objects.lock().get(&key).cloned() else {
                return Ok(full(
                    StatusCode::NOT_FOUND,
                    "<Error><Code>NoSuchKey</Code></Error>",
                ));
            };
            let len = data.len() as u64;
            let range = parts
                .headers
                .get(http::header::RANGE)
                .and_then(|v| v.to_str().ok())
                .map(|v| parse_range(v, len));
            let (status, slice, content_range) = match range {
                None => (StatusCode::OK, data, None),
                Some(None) => return Ok(full(StatusCode::RANGE_NOT_SATISFIABLE, "")),
                Some(Some((start, end))) => (
                    StatusCode::PARTIAL_CONTENT,
                    data.slice(start as usize..=end as usize),
                    Some(format!("bytes {start}-{end}/{len}")),
                ),
            };
            let mut r = Response::new(if parts.method == Method::HEAD {
                Full::new(Bytes::new()).boxed_unsync()
            } else {
                chunked_frames(slice.clone())
            });
            *r.status_mut() = status;
            let h = r.headers_mut();
            h.insert(
                http::header::CONTENT_LENGTH,
                slice.len().to_string().parse().expect("len"),
            );
            h.insert(http::header::ETAG, "\"abc\"".parse().expect("etag"));
            if let Some(cr) = content_range {
                h.insert(
                    http::header::CONTENT_RANGE,
                    cr.parse().expect("content-range"),
                );
            }
            r
        }
        Method::DELETE => full(StatusCode::NO_CONTENT, ""),
        _ => full(StatusCode::METHOD_NOT_ALLOWED, ""),
    };
    Ok(response)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// How a response body ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// All `Content-Length` bytes arrived.
    Complete,
    /// The connection closed cleanly before that.
    EarlyEof,
    /// Reading failed (e.g. connection reset).
    Error(io::ErrorKind),
}

/// A response read off a raw connection.
#[derive(Debug, Clone)]
pub struct RawResponse {
    pub status: u16,
    /// The head exactly as received, up to and including the blank line.
    pub head: Vec<u8>,
    pub headers: Vec<(String, String)>,
    pub content_length: Option<usize>,
    pub body: Bytes,
    pub ending: Ending,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A raw HTTP/1.1 client connection.
pub struct RawConn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl RawConn {
    pub async fn connect(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        RawConn {
            stream,
            buf: Vec::new(),
        }
    }

    /// Sends `head` (the request line and headers, `\r\n`-terminated lines
    /// without the final blank line) and `body`.
    pub async fn send(&mut self, head: &str, body: &[u8]) {
        let mut req = head.as_bytes().to_vec();
        req.extend_from_slice(b"\r\n");
        req.extend_from_slice(body);
        self.stream.write_all(&req).await.expect("write request");
    }

    /// Reads one response; `head_only` for responses to HEAD.
    pub async fn read_response(&mut self, head_only: bool) -> RawResponse {
        let head_end = loop {
            if let Some(pos) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break pos + 4;
            }
            let mut chunk = [0u8; 8192];
            let n = self.stream.read(&mut chunk).await.expect("read head");
            assert!(n > 0, "connection closed before a response head");
            self.buf.extend_from_slice(&chunk[..n]);
        };
        let head: Vec<u8> = self.buf.drain(..head_end).collect();
        let text = String::from_utf8_lossy(&head).into_owned();
        let mut lines = text.split("\r\n");
        let status = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .expect("status line");
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.to_owned(), v.trim().to_owned()))
            .collect();
        let content_length = headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.parse().ok());
        let want = if head_only || status == 204 || status == 304 {
            0
        } else {
            content_length.unwrap_or(usize::MAX)
        };
        let mut body = Vec::new();
        let mut ending = Ending::Complete;
        loop {
            let take = self.buf.len().min(want - body.len());
            body.extend(self.buf.drain(..take));
            if body.len() == want {
                break;
            }
            let mut chunk = vec![0u8; 256 * 1024];
            match self.stream.read(&mut chunk).await {
                Ok(0) => {
                    ending = if content_length.is_some() {
                        Ending::EarlyEof
                    } else {
                        Ending::Complete
                    };
                    break;
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(err) => {
                    ending = Ending::Error(err.kind());
                    break;
                }
            }
        }
        RawResponse {
            status,
            head,
            headers,
            content_length,
            body: Bytes::from(body),
            ending,
        }
    }

    /// Sends a bodiless request and reads its response.
    pub async fn call(
        &mut self,
        method: &str,
        target: &str,
        extra_headers: &[&str],
    ) -> RawResponse {
        let mut head = format!("{method} {target} HTTP/1.1\r\nHost: s3.test:1234\r\n");
        for h in extra_headers {
            head.push_str(h);
            head.push_str("\r\n");
        }
        self.send(&head, b"").await;
        self.read_response(method == "HEAD").await
    }
}

/// One bodiless request on a fresh connection.
pub async fn call(
    addr: SocketAddr,
    method: &str,
    target: &str,
    extra_headers: &[&str],
) -> RawResponse {
    RawConn::connect(addr)
        .await
        .call(method, target, extra_headers)
        .await
}
