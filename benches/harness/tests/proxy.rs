//! End-to-end tests of the proxy against an in-process fake upstream.
//!
//! Timing assertions are lower bounds only: the machine may be busy, so a
//! delay can be longer than asked, never shorter.

mod common;

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{call, pattern, sha256, Ending, FakeUpstream, RawConn};
use riffle_bench::proxy::{
    ControlClient, FaultKind, FaultRule, Latency, ProxyConfig, ProxyHandle, RequestKind,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

async fn proxy_with(upstream: &FakeUpstream, latency: Latency) -> ProxyHandle {
    ProxyHandle::start(ProxyConfig::new(upstream.url()).with_latency(latency))
        .await
        .expect("start proxy")
}

async fn setup(latency: Latency) -> (FakeUpstream, ProxyHandle) {
    let upstream = FakeUpstream::start().await;
    let proxy = proxy_with(&upstream, latency).await;
    (upstream, proxy)
}

#[tokio::test]
async fn large_body_passes_through_unchanged() {
    let (upstream, proxy) = setup(Latency::NONE).await;
    let data = pattern(24 * 1024 * 1024 + 17, 1);
    upstream.put("bucket/big/object.bin", data.clone());

    let r = call(proxy.addr(), "GET", "/bucket/big/object.bin", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.ending, Ending::Complete);
    assert_eq!(r.content_length, Some(data.len()));
    assert_eq!(sha256(&r.body), sha256(&data));

    let stats = proxy.stats();
    assert_eq!(stats.requests.get_object, 1);
    assert_eq!(stats.bytes_down, data.len() as u64);
    assert_eq!(stats.status.c2xx, 1);
}

#[tokio::test]
async fn ranges_and_heads_pass_through() {
    let (upstream, proxy) = setup(Latency::NONE).await;
    let data = pattern(100_000, 2);
    upstream.put("bucket/k", data.clone());
    let mut conn = RawConn::connect(proxy.addr()).await;

    let r = conn
        .call("GET", "/bucket/k", &["Range: bytes=1000-1999"])
        .await;
    assert_eq!(r.status, 206);
    assert_eq!(r.header("content-range"), Some("bytes 1000-1999/100000"));
    assert_eq!(r.body, data.slice(1000..2000));

    let r = conn.call("HEAD", "/bucket/k", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.content_length, Some(100_000));
    assert!(r.body.is_empty());

    let r = conn.call("GET", "/bucket/k", &["Range: bytes=-10"]).await;
    assert_eq!(r.body, data.slice(99_990..));

    let stats = proxy.stats();
    assert_eq!(stats.requests.get_range, 2);
    assert_eq!(stats.requests.head, 1);
    assert_eq!(stats.bytes_down, 1010);
    // All three went over one client connection, hence one upstream one.
    assert_eq!(stats.connections.accepted, 1);
    assert_eq!(stats.connections.upstream_connects, 1);
}

/// A one-shot raw upstream that records the request bytes and answers with
/// fixed bytes.
async fn raw_upstream(reply: &'static [u8]) -> (SocketAddr, tokio::task::JoinHandle<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.expect("accept");
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        // Read the head, then the 11-byte body the test sends.
        loop {
            let n = stream.read(&mut buf).await.expect("read");
            got.extend_from_slice(&buf[..n]);
            if let Some(p) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                if got.len() >= p + 4 + 11 || n == 0 {
                    break;
                }
            }
        }
        stream.write_all(reply).await.expect("reply");
        got
    });
    (addr, task)
}

#[tokio::test]
async fn request_and_response_bytes_are_forwarded_verbatim() {
    const REPLY: &[u8] = b"HTTP/1.1 200 OK\r\nx-amz-request-id: TX1\r\nETag: \"e\"\r\nContent-Length: 5\r\nServer: Fake\r\n\r\nhello";
    let (addr, upstream) = raw_upstream(REPLY).await;
    let proxy =
        ProxyHandle::start(ProxyConfig::new(format!("http://{addr}")).with_latency(Latency::NONE))
            .await
            .expect("start");
    let request = "PUT /bucket/some%20key?x-id=PutObject HTTP/1.1\r\n\
        Host: 127.0.0.1:9\r\n\
        X-Amz-Date: 20240101T000000Z\r\n\
        x-amz-content-sha256: UNSIGNED-PAYLOAD\r\n\
        Authorization: AWS4-HMAC-SHA256 Credential=AK/20240101/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature=00\r\n\
        Content-Length: 11\r\n";
    let mut conn = RawConn::connect(proxy.addr()).await;
    conn.send(request, b"hello world").await;
    let r = conn.read_response(false).await;
    let seen = upstream.await.expect("upstream task");

    let mut sent = request.as_bytes().to_vec();
    sent.extend_from_slice(b"\r\nhello world");
    assert_eq!(
        String::from_utf8_lossy(&seen),
        String::from_utf8_lossy(&sent),
        "upstream must see the request byte for byte"
    );
    let mut got = r.head.clone();
    got.extend_from_slice(&r.body);
    assert_eq!(
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(REPLY)
    );
    assert_eq!(proxy.stats().bytes_up, 11);
}

#[tokio::test]
async fn first_byte_delay_is_applied() {
    let (upstream, proxy) = setup(Latency {
        first_byte_delay_ms: 150,
        bandwidth_mbps: 0.0,
    })
    .await;
    upstream.put("bucket/k", pattern(10, 3));
    let mut conn = RawConn::connect(proxy.addr()).await;
    for method in ["GET", "HEAD", "GET"] {
        let started = Instant::now();
        let r = conn.call(method, "/bucket/k", &[]).await;
        assert_eq!(r.status, 200);
        assert!(started.elapsed() >= Duration::from_millis(150), "{method}");
    }
    // Injected errors are delayed too.
    proxy
        .set_faults(vec![FaultRule::http500()])
        .expect("faults");
    let started = Instant::now();
    assert_eq!(conn.call("GET", "/bucket/k", &[]).await.status, 500);
    assert!(started.elapsed() >= Duration::from_millis(150));
}

#[tokio::test]
async fn bandwidth_is_capped_per_connection() {
    let (upstream, proxy) = setup(Latency {
        first_byte_delay_ms: 0,
        bandwidth_mbps: 10.0,
    })
    .await;
    let data = pattern(3_000_000, 4);
    upstream.put("bucket/k", data.clone());
    let started = Instant::now();
    let r = call(proxy.addr(), "GET", "/bucket/k", &[]).await;
    // 3 MB at 10 MB/s is 300 ms, less a few ms of allowed burst.
    assert!(
        started.elapsed() >= Duration::from_millis(280),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(sha256(&r.body), sha256(&data));
}

#[tokio::test]
async fn requests_are_counted_by_kind() {
    let upstream = FakeUpstream::start().await;
    let proxy = ProxyHandle::start(
        ProxyConfig::new(upstream.url())
            .with_latency(Latency::NONE)
            .with_key_counts(),
    )
    .await
    .expect("start");
    upstream.put("bucket/a", pattern(1000, 5));
    let mut conn = RawConn::connect(proxy.addr()).await;
    conn.call("GET", "/bucket/a", &[]).await;
    conn.call("GET", "/bucket/a?x-id=GetObject", &[]).await;
    conn.call("GET", "/bucket/a", &["Range: bytes=0-9"]).await;
    conn.call("HEAD", "/bucket/a", &[]).await;
    conn.call("GET", "/bucket?list-type=2&prefix=a", &[]).await;
    conn.call("GET", "/bucket/missing", &[]).await;
    let body = pattern(5000, 6);
    conn.send(
        "PUT /bucket/b HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n",
        &body,
    )
    .await;
    assert_eq!(conn.read_response(false).await.status, 200);
    conn.call("DELETE", "/bucket/b", &[]).await;
    conn.call("GET", "/bucket/a?acl", &[]).await;

    let s = proxy.stats();
    assert_eq!(s.requests.get_object, 3, "{s:?}");
    assert_eq!(s.requests.get_range, 1);
    assert_eq!(s.requests.head, 1);
    assert_eq!(s.requests.list, 1);
    assert_eq!(s.requests.put, 1);
    assert_eq!(s.requests.other, 2);
    assert_eq!(s.requests.total, 9);
    assert_eq!(s.status.c4xx, 1);
    assert_eq!(s.bytes_up, 5000);
    let keys = s.get_keys.expect("key counts on");
    assert_eq!(keys.get("bucket/a"), Some(&3));
    assert_eq!(keys.get("bucket/missing"), Some(&1));
    let put = upstream
        .seen()
        .into_iter()
        .find(|r| r.method == "PUT")
        .expect("PUT reached upstream");
    assert_eq!(put.body_sha256, sha256(&body));
    assert_eq!(put.host.as_deref(), Some("x"));

    let before = proxy.reset_stats();
    assert_eq!(before.requests.total, 9);
    assert_eq!(proxy.stats().requests.total, 0);
}

#[tokio::test]
async fn http500_and_slowdown503_are_s3_errors() {
    let (upstream, proxy) = setup(Latency::NONE).await;
    upstream.put("bucket/k", pattern(100, 7));
    proxy
        .set_faults(vec![FaultRule::slowdown503().with_every_nth(2)])
        .expect("faults");
    let mut conn = RawConn::connect(proxy.addr()).await;
    assert_eq!(conn.call("GET", "/bucket/k", &[]).await.status, 200);
    let r = conn.call("GET", "/bucket/k", &[]).await;
    assert_eq!(r.status, 503);
    let text = String::from_utf8_lossy(&r.body);
    assert!(text.contains("<Code>SlowDown</Code>"), "{text}");
    assert_eq!(r.header("content-type"), Some("application/xml"));
    assert_eq!(conn.call("GET", "/bucket/k", &[]).await.status, 200);

    proxy
        .set_faults(vec![FaultRule::http500()])
        .expect("faults");
    let r = conn.call("PUT", "/bucket/k2", &["Content-Length: 0"]).await;
    assert_eq!(r.status, 500);
    assert!(String::from_utf8_lossy(&r.body).contains("<Code>InternalError</Code>"));
    // Injected errors never reach the upstream.
    assert_eq!(upstream.seen().len(), 2);
    let s = proxy.stats();
    assert_eq!(s.faults_injected.slowdown503, 1);
    assert_eq!(s.faults_injected.http500, 1);
    assert_eq!(s.status.c5xx, 2);
}

#[tokio::test]
async fn truncate_body_closes_early() {
    let (upstream, proxy) = setup(Latency::NONE).await;
    let data = pattern(1_000_000, 8);
    upstream.put("bucket/k", data.clone());
    proxy
        .set_faults(vec![FaultRule::truncate_body().with_after_bytes(300_000)])
        .expect("faults");
    let r = call(proxy.addr(), "GET", "/bucket/k", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.content_length, Some(1_000_000));
    assert_eq!(r.ending, Ending::EarlyEof);
    assert_eq!(r.body.len(), 300_000);
    assert_eq!(r.body, data.slice(..300_000));
    // Default cut point: half the body.
    proxy
        .set_faults(vec![FaultRule::truncate_body()])
        .expect("faults");
    let r = call(proxy.addr(), "GET", "/bucket/k", &["Range: bytes=0-999"]).await;
    assert_eq!(r.ending, Ending::EarlyEof);
    assert_eq!(r.body.len(), 500);
    assert_eq!(proxy.stats().faults_injected.truncate_body, 2);
}

#[tokio::test]
async fn reset_mid_body_is_an_error() {
    let (upstream, proxy) = setup(Latency::NONE).await;
    upstream.put("bucket/k", pattern(2_000_000, 9));
    proxy
        .set_faults(vec![FaultRule::reset_mid_body()
            .with_after_bytes(100_000)
            .with_kind(RequestKind::GetObject)])
        .expect("faults");
    let r = call(proxy.addr(), "GET", "/bucket/k", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.content_length, Some(2_000_000));
    assert_eq!(r.ending, Ending::Error(ErrorKind::ConnectionReset));
    assert!(r.body.len() <= 100_000);
    assert_eq!(proxy.stats().faults_injected.reset_mid_body, 1);
    // Ranged GETs are not matched by the kind filter.
    let r = call(proxy.addr(), "GET", "/bucket/k", &["Range: bytes=0-99999"]).await;
    assert_eq!(r.ending, Ending::Complete);
}

#[tokio::test]
async fn stall_holds_the_response() {
    let (upstream, proxy) = setup(Latency::NONE).await;
    let data = pattern(1000, 10);
    upstream.put("bucket/slow", data.clone());
    upstream.put("bucket/fast", data.clone());
    proxy
        .set_faults(vec![FaultRule::stall(400).with_key_contains("slow")])
        .expect("faults");
    let started = Instant::now();
    let r = call(proxy.addr(), "GET", "/bucket/slow", &[]).await;
    assert!(started.elapsed() >= Duration::from_millis(400));
    assert_eq!(r.body, data);
    assert_eq!(
        call(proxy.addr(), "GET", "/bucket/fast", &[]).await.status,
        200
    );
    assert_eq!(proxy.stats().faults_injected.stall, 1);
}

#[tokio::test]
async fn trickle_sends_slowly() {
    let (upstream, proxy) = setup(Latency::NONE).await;
    let data = pattern(1000, 11);
    upstream.put("bucket/k", data.clone());
    proxy
        .set_faults(vec![FaultRule::trickle(2000)])
        .expect("faults");
    let started = Instant::now();
    let r = call(proxy.addr(), "GET", "/bucket/k", &[]).await;
    // 1000 bytes at 2000 B/s: about 500 ms, less one 10 ms burst.
    assert!(
        started.elapsed() >= Duration::from_millis(450),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(r.body, data);
    assert_eq!(proxy.stats().faults_injected.trickle, 1);
}

#[tokio::test]
async fn faults_can_be_switched_off() {
    let (upstream, proxy) = setup(Latency::NONE).await;
    upstream.put("bucket/k", pattern(10_000, 12));
    proxy
        .set_faults(vec![
            FaultRule::http500().with_method("PUT"),
            FaultRule::reset_mid_body(),
        ])
        .expect("faults");
    let r = call(proxy.addr(), "GET", "/bucket/k", &[]).await;
    assert!(matches!(r.ending, Ending::Error(_)));
    let r = call(proxy.addr(), "PUT", "/bucket/x", &["Content-Length: 0"]).await;
    assert_eq!(r.status, 500);
    proxy.clear_faults();
    let r = call(proxy.addr(), "GET", "/bucket/k", &[]).await;
    assert_eq!((r.status, r.ending), (200, Ending::Complete));
    let r = call(proxy.addr(), "PUT", "/bucket/x", &["Content-Length: 0"]).await;
    assert_eq!(r.status, 200);
    assert!(proxy.faults().is_empty());
}

#[tokio::test]
async fn limit_fires_only_n_times() {
    let (upstream, proxy) = setup(Latency::NONE).await;
    upstream.put("bucket/k", pattern(10, 13));
    proxy
        .set_faults(vec![FaultRule::slowdown503().with_limit(2)])
        .expect("faults");
    let mut statuses = Vec::new();
    let mut conn = RawConn::connect(proxy.addr()).await;
    for _ in 0..4 {
        statuses.push(conn.call("GET", "/bucket/k", &[]).await.status);
    }
    assert_eq!(statuses, [503, 503, 200, 200]);
    let status = proxy.faults();
    assert_eq!((status[0].matched, status[0].fired), (4, 2));
}

#[tokio::test]
async fn upstream_down_gives_502() {
    // Bind and drop to get a port with nothing listening.
    let port = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let proxy = ProxyHandle::start(
        ProxyConfig::new(format!("http://127.0.0.1:{port}")).with_latency(Latency::NONE),
    )
    .await
    .expect("start");
    let r = call(proxy.addr(), "GET", "/bucket/k", &[]).await;
    assert_eq!(r.status, 502);
    assert_eq!(proxy.stats().upstream_errors, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_endpoint_steers_the_proxy() {
    let upstream = FakeUpstream::start().await;
    upstream.put("bucket/k", pattern(10, 14));
    let proxy = ProxyHandle::start(
        ProxyConfig::new(upstream.url())
            .with_latency(Latency::NONE)
            .with_control("127.0.0.1:0".parse().expect("addr")),
    )
    .await
    .expect("start");
    let control = ControlClient::new(proxy.control_addr().expect("control on"));
    let blocking = |f: Box<dyn FnOnce() + Send>| tokio::task::spawn_blocking(f);

    let c = control.clone();
    blocking(Box::new(move || {
        let rules = c
            .set_faults(&[FaultRule::parse("http500,kind=get_object").expect("rule")])
            .expect("set faults");
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].rule.fault, FaultKind::Http500);
        // Bad rules are refused with 400 and leave the rules alone.
        let (status, body) = c
            .request("PUT", "/faults", Some(br#"{"fault":"stall"}"#))
            .expect("request");
        assert_eq!(status, 400, "{}", String::from_utf8_lossy(&body));
        let (status, _) = c.request("GET", "/nope", None).expect("request");
        assert_eq!(status, 404);
        assert_eq!(c.faults().expect("faults").len(), 1);
    }))
    .await
    .expect("control calls");

    assert_eq!(
        call(proxy.addr(), "GET", "/bucket/k", &[]).await.status,
        500
    );
    assert_eq!(
        call(proxy.addr(), "HEAD", "/bucket/k", &[]).await.status,
        200
    );

    let c = control.clone();
    blocking(Box::new(move || {
        let stats = c.stats().expect("stats");
        assert_eq!(stats.faults_injected.http500, 1);
        assert_eq!(stats.requests.total, 2);
        c.clear_faults().expect("clear");
        assert!(c.faults().expect("faults").is_empty());
        let latency = c
            .set_latency(&Latency {
                first_byte_delay_ms: 5,
                bandwidth_mbps: 50.0,
            })
            .expect("latency");
        assert_eq!(latency.first_byte_delay_ms, 5);
        let before = c.reset_stats().expect("reset");
        assert_eq!(before.requests.total, 2);
        assert_eq!(c.stats().expect("stats").requests.total, 0);
    }))
    .await
    .expect("control calls");

    assert_eq!(proxy.latency().bandwidth_mbps, 50.0);
    assert_eq!(
        call(proxy.addr(), "GET", "/bucket/k", &[]).await.status,
        200
    );
    let final_stats = proxy.shutdown().await;
    assert_eq!(final_stats.requests.get_object, 1);
}

#[tokio::test]
async fn shutdown_lets_a_response_finish() {
    let (upstream, proxy) = setup(Latency {
        first_byte_delay_ms: 0,
        bandwidth_mbps: 5.0,
    })
    .await;
    let data = pattern(1_000_000, 15);
    upstream.put("bucket/k", data.clone());
    let addr = proxy.addr();
    let reader = tokio::spawn(async move { call(addr, "GET", "/bucket/k", &[]).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    proxy.shutdown().await;
    let r = reader.await.expect("reader");
    assert_eq!(r.ending, Ending::Complete);
    assert_eq!(r.body, data);
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[test]
fn blocking_proxy_works_without_a_runtime() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let upstream = rt.block_on(FakeUpstream::start());
    upstream.put("bucket/k", Bytes::from_static(b"0123456789"));
    let proxy = riffle_bench::proxy::BlockingProxy::start(
        ProxyConfig::new(upstream.url()).with_latency(Latency::NONE),
    )
    .expect("start");
    // Drive the fake upstream on a thread of its own.
    let addr = proxy.addr();
    let handle = std::thread::spawn(move || {
        rt.block_on(async move {
            let r = call(addr, "GET", "/bucket/k", &[]).await;
            drop(upstream);
            r
        })
    });
    let r = handle.join().expect("client thread");
    assert_eq!(&r.body[..], b"0123456789");
    assert_eq!(proxy.stats().requests.get_object, 1);
    assert_eq!(proxy.shutdown().requests.total, 1);
}
