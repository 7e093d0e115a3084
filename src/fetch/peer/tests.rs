//! The ladder against in-process peers on 127.0.0.1, each node with its own in-memory store
//! holding the same objects (same ETags), so every node's GETs are counted apart.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::*;
use crate::cache::{CacheConfig, DiskCache, SizeLimit};
use crate::fetch::{DiskTier, FetchConfig, FetchError, Fetcher};
use crate::store::memory::{Fault, MemoryStore, Op};
use crate::store::StoreError;

const BS: u64 = 4096;
const SECRET: &[u8] = b"a-shared-test-secret-0123";

fn body(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

/// A store with `objects`, put in order (so two stores give the same ETags).
fn store(objects: &[(&str, &[u8])]) -> Arc<MemoryStore> {
    let s = Arc::new(MemoryStore::new());
    for (k, d) in objects {
        s.put(k, d.to_vec());
    }
    s
}

fn version(store: &MemoryStore, key: &str) -> Arc<ObjectVersion> {
    let meta = futures::executor::block_on(store.head(key)).unwrap();
    Arc::new(ObjectVersion {
        key: Arc::from(key),
        etag: Arc::from(meta.etag.as_str()),
        size: meta.size,
    })
}

use crate::store::ObjectStore as _;

fn config(members: Vec<String>, listen: Option<SocketAddr>, principal: &str) -> PeerConfig {
    PeerConfig {
        listen,
        members: Membership::Static(members),
        secret: Secret::from_bytes(SECRET),
        // Long: no test depends on a timeout firing.
        timeout: Duration::from_secs(60),
        bucket: "bucket".into(),
        prefix: String::new(),
        principal: crate::cache::Principal::new("http://test", principal).to_hex(),
        block_size: BS,
        // Long: a failed peer stays out for the rest of a test.
        backoff: Duration::from_secs(3600),
    }
}

fn fetch_config() -> FetchConfig {
    FetchConfig {
        block_size: BS,
        max_part_blocks: 4,
        max_inflight: 8,
        inflight_memory: 64 * BS,
        block_cache_bytes: 1 << 20,
    }
}

fn fetcher(store: &Arc<MemoryStore>, disk: Option<(&std::path::Path, &str)>) -> Arc<Fetcher> {
    let tier = disk.map(|(dir, principal)| {
        let mut cc = CacheConfig::new(dir, SizeLimit::Bytes(64 << 20));
        cc.block_size = BS;
        cc.min_free = SizeLimit::Bytes(0);
        let cache = DiskCache::open(cc).unwrap();
        Arc::new(DiskTier::new(
            cache,
            "http://test",
            "bucket",
            principal,
            None,
        ))
    });
    Fetcher::new(
        store.clone(),
        fetch_config(),
        tokio::runtime::Handle::current(),
        tier,
    )
}

/// A node serving `fetcher` on 127.0.0.1 (an ephemeral port), signing as `principal`.
struct Node {
    fetcher: Arc<Fetcher>,
    peers: Arc<Peers>,
    server: server::PeerServer,
}

impl Node {
    fn start(fetcher: Arc<Fetcher>, principal: &str) -> Node {
        let peers = Peers::new(config(Vec::new(), None, principal));
        let server = server::serve(
            "127.0.0.1:0".parse().unwrap(),
            fetcher.clone(),
            peers.clone(),
        )
        .unwrap();
        Node {
            fetcher,
            peers,
            server,
        }
    }

    fn addr(&self) -> String {
        self.server.local_addr().to_string()
    }
}

/// A port nothing listens on (bound, then closed).
fn dead_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// A requesting node (not a member itself) over `store` asking `members`.
fn asker(
    store: &Arc<MemoryStore>,
    members: Vec<String>,
    disk: Option<(&std::path::Path, &str)>,
) -> (Arc<Fetcher>, Arc<Peers>) {
    let principal = disk.map_or("key:a", |(_, p)| p);
    let f = fetcher(store, disk);
    let peers = Peers::new(config(members, None, principal));
    f.set_peers(peers.clone());
    (f, peers)
}

fn load(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_come_from_their_owner_which_fetches_each_once() {
    let data = body(10 * BS as usize + 5, 1);
    let objects: &[(&str, &[u8])] = &[("train/a.bin", &data)];
    let owner_store = store(objects);
    let owner = Node::start(fetcher(&owner_store, None), "key:a");
    let asker_store = store(objects);
    let (a1, p1) = asker(&asker_store, vec![owner.addr()], None);
    let (a2, _) = asker(&store(objects), vec![owner.addr()], None);
    let v = version(&asker_store, "train/a.bin");
    let got = a1.read(&v, 100..data.len() as u64).await.unwrap();
    assert_eq!(&got[..], &data[100..]);
    // A second node reading the same blocks: the owner has them.
    let got = a2.read(&v, 0..data.len() as u64).await.unwrap();
    assert_eq!(&got[..], &data[..]);
    assert_eq!(
        asker_store.count(Op::Get),
        0,
        "the asker never went to the store"
    );
    // The owner fetched the 11 blocks once, in runs or one by one.
    let owner_bytes = load(&owner.fetcher.stats().get_bytes);
    assert_eq!(owner_bytes, data.len() as u64);
    assert_eq!(load(&owner.peers.stats().blocks_served), 22);
    assert_eq!(load(&p1.stats().blocks_fetched), 11);
    assert_eq!(load(&p1.stats().store_fallbacks), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_reads_itself_from_the_store_and_a_node_never_asks_itself() {
    let data = body(3 * BS as usize, 2);
    let objects: &[(&str, &[u8])] = &[("k", &data)];
    let s = store(objects);
    let f = fetcher(&s, None);
    // This node is the only member: it owns everything and asks nobody.
    let me: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let peers = Peers::new(config(vec![me.to_string()], Some(me), "key:a"));
    assert!(peers.ring().members()[0].is_self);
    f.set_peers(peers.clone());
    let v = version(&s, "k");
    assert_eq!(
        &f.read(&v, 0..data.len() as u64).await.unwrap()[..],
        &data[..]
    );
    assert_eq!(s.count(Op::Get), 1, "one GET of the run, from the store");
    assert_eq!(load(&peers.stats().errors), 0);
    assert_eq!(load(&peers.stats().store_fallbacks), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_owner_costs_one_failure_then_the_next_ranked_serves_and_the_breaker_keeps_it_out() {
    let objects_data: Vec<(String, Vec<u8>)> = (0..40)
        .map(|i| (format!("f{i:02}"), body(100 + i, i as u8)))
        .collect();
    let objects: Vec<(&str, &[u8])> = objects_data
        .iter()
        .map(|(k, d)| (k.as_str(), d.as_slice()))
        .collect();
    let live = Node::start(fetcher(&store(&objects), None), "key:a");
    let dead = dead_addr();
    let mine = store(&objects);
    let (f, peers) = asker(&mine, vec![live.addr(), dead.clone()], None);
    let ring = peers.ring();
    let mut owned_by_dead = 0;
    for (k, d) in &objects_data {
        let v = version(&mine, k);
        let name = BlockName::new("bucket", k, &v.etag, 0);
        if ring.owner(name).map(|m| m.addr.as_str()) == Some(dead.as_str()) {
            owned_by_dead += 1;
        }
        assert_eq!(&f.read(&v, 0..v.size).await.unwrap()[..], &d[..]);
    }
    assert!(
        owned_by_dead > 5,
        "the test needs blocks the dead peer owns"
    );
    // One failed request to the dead peer; then its breaker kept it out and the live one
    // served everything; the store was never asked.
    assert_eq!(load(&peers.stats().errors), 1);
    assert_eq!(load(&peers.stats().blocks_fetched), 40);
    assert_eq!(load(&peers.stats().store_fallbacks), 0);
    assert_eq!(mine.count(Op::Get), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_peer_fails_the_store_serves() {
    let data = body(2 * BS as usize, 3);
    let objects: &[(&str, &[u8])] = &[("k", &data)];
    // The owner's store fails: it answers 502, and the asker goes to its own store.
    let owner_store = store(objects);
    for _ in 0..10 {
        owner_store.inject(
            Op::Get,
            Fault::Error(StoreError::Transient("injected".into())),
        );
    }
    let owner = Node::start(fetcher(&owner_store, None), "key:a");
    let mine = store(objects);
    let (f, peers) = asker(&mine, vec![owner.addr(), dead_addr()], None);
    let v = version(&mine, "k");
    assert_eq!(&f.read(&v, 0..v.size).await.unwrap()[..], &data[..]);
    assert_eq!(load(&peers.stats().store_fallbacks), 2);
    assert!(load(&peers.stats().errors) >= 2);
    assert_eq!(mine.count(Op::Get), 1, "the two blocks in one GET");
}

/// A peer that answers every request with `body` and a MAC over the CRC of `claimed`.
async fn lying_peer(claimed: Bytes, body: Bytes) -> String {
    use http_body_util::Full;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (claimed, body) = (claimed.clone(), body.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: hyper::Request<_>| {
                    let (claimed, body) = (claimed.clone(), body.clone());
                    async move {
                        let auth = req
                            .headers()
                            .get(hyper::header::AUTHORIZATION)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default()
                            .to_string();
                        let crc = crc32c::crc32c(&claimed);
                        let secret = Secret::from_bytes(SECRET);
                        let mac = secret.sign_response(&auth, crc, body.len(), true);
                        let r = hyper::Response::builder()
                            .header(client::CRC, crc)
                            .header(client::PROOF, "1")
                            .header(auth::RESPONSE_MAC, mac)
                            .body(Full::new(body))
                            .unwrap();
                        Ok::<_, std::convert::Infallible>(r)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_block_from_a_peer_is_rejected_and_fetched_from_the_store() {
    let data = body(BS as usize, 4);
    let objects: &[(&str, &[u8])] = &[("k", &data)];
    let mut bad = data.clone();
    bad[100] ^= 0xff;
    let liar = lying_peer(Bytes::from(data.clone()), Bytes::from(bad)).await;
    let mine = store(objects);
    let (f, peers) = asker(&mine, vec![liar], None);
    let v = version(&mine, "k");
    assert_eq!(&f.read(&v, 0..v.size).await.unwrap()[..], &data[..]);
    assert_eq!(load(&peers.stats().errors), 1);
    assert_eq!(load(&peers.stats().blocks_fetched), 0);
    assert_eq!(load(&peers.stats().store_fallbacks), 1);
    assert_eq!(mine.count(Op::Get), 1);
    // The client's own verdict, directly.
    let client = client::PeerClient::new(&config(vec![], None, "key:a"), "-");
    let liar = lying_peer(Bytes::from(data.clone()), Bytes::from(vec![0u8; 10])).await;
    let e = client.get(&liar, &v, 0, BS).await.unwrap_err();
    assert!(matches!(e, client::PeerError::Length { .. }), "{e}");
}

/// An owner node (principal `key:a`, no disk cache) of one object `k` of one block, made of
/// `seed`: its bytes, the node's store, the node and the version.
fn one_block_owner(seed: u8) -> (Vec<u8>, Arc<MemoryStore>, Node, Arc<ObjectVersion>) {
    let data = body(BS as usize, seed);
    let owner_store = store(&[("k", &data)]);
    let owner = Node::start(fetcher(&owner_store, None), "key:a");
    let v = version(&owner_store, "k");
    (data, owner_store, owner, v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_with_another_secret_or_a_stale_time_are_refused() {
    let (_, owner_store, owner, v) = one_block_owner(5);
    let mut other = config(vec![], None, "key:a");
    other.secret = Secret::from_bytes(b"not-the-shared-secret-at-all");
    let client = client::PeerClient::new(&other, "-");
    let e = client.get(&owner.addr(), &v, 0, BS).await.unwrap_err();
    assert!(matches!(e, client::PeerError::Status(401)), "{e}");
    assert!(e.is_peer_fault());
    // A well-signed request from too long ago.
    let path = client::PeerClient::path("bucket", &v, 0, BS);
    let secret = Secret::from_bytes(SECRET);
    let mut fields = auth::Fields::now("-", &"ab".repeat(16));
    fields.time -= 3600;
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<Bytes>>();
    let send = |fields: auth::Fields, sign: bool| {
        let mut req = hyper::Request::get(format!("http://{}{path}", owner.addr()))
            .header(auth::TIME, fields.time.to_string())
            .header(auth::NODE, &fields.node)
            .header(auth::PRINCIPAL, &fields.principal);
        if sign {
            req = req.header(
                hyper::header::AUTHORIZATION,
                secret.sign("GET", &path, &fields),
            );
        }
        http.request(req.body(http_body_util::Empty::new()).unwrap())
    };
    assert_eq!(send(fields, true).await.unwrap().status(), 401);
    // Unsigned.
    let fresh = auth::Fields::now("-", &"ab".repeat(16));
    assert_eq!(send(fresh.clone(), false).await.unwrap().status(), 401);
    // And the same request signed and fresh is served.
    assert_eq!(send(fresh, true).await.unwrap().status(), 200);
    assert_eq!(
        owner_store.count(Op::Get),
        1,
        "refused requests fetch nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_principal_is_attested_and_records_a_proof_without_a_store_request() {
    let dir_a = tempfile::tempdir().unwrap();
    let dir_b = tempfile::tempdir().unwrap();
    let data = body(2 * BS as usize, 6);
    let objects: &[(&str, &[u8])] = &[("k", &data)];
    let owner = Node::start(
        fetcher(&store(objects), Some((dir_b.path(), "key:same"))),
        "key:same",
    );
    let mine = store(objects);
    let (f, _) = asker(&mine, vec![owner.addr()], Some((dir_a.path(), "key:same")));
    let v = version(&mine, "k");
    assert_eq!(&f.read(&v, 0..v.size).await.unwrap()[..], &data[..]);
    assert_eq!(mine.count(Op::Get), 0);
    assert_eq!(load(&f.stats().proof_requests), 0);
    assert!(f.disk().unwrap().may_serve(&v), "a proof was recorded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_principal_proves_its_own_read_before_it_is_served_peer_bytes() {
    let dir_a = tempfile::tempdir().unwrap();
    let dir_b = tempfile::tempdir().unwrap();
    let data = body(2 * BS as usize, 7);
    let objects: &[(&str, &[u8])] = &[("k", &data), ("secret", &data)];
    let owner = Node::start(
        fetcher(&store(objects), Some((dir_b.path(), "key:owner"))),
        "key:owner",
    );
    let mine = store(objects);
    let (f, _) = asker(&mine, vec![owner.addr()], Some((dir_a.path(), "key:other")));
    let v = version(&mine, "k");
    assert_eq!(&f.read(&v, 0..v.size).await.unwrap()[..], &data[..]);
    // One proof request (a one-byte GET), not a fetch of the blocks.
    assert_eq!(load(&f.stats().proof_requests), 1);
    assert_eq!(mine.count(Op::Get), 1);
    assert_eq!(load(&f.stats().get_bytes), 0);
    // The store refuses this principal the other object: the peer's bytes are not served.
    mine.inject(
        Op::Get,
        Fault::Error(StoreError::AccessDenied("injected".into())),
    );
    let s = version(&mine, "secret");
    assert_eq!(f.read(&s, 0..s.size).await, Err(FetchError::NotPermitted));
    assert_eq!(load(&f.stats().proofs_refused), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_proof_log_unattested_blocks_come_from_the_store() {
    let data = body(BS as usize, 8);
    let objects: &[(&str, &[u8])] = &[("k", &data)];
    let owner = Node::start(fetcher(&store(objects), None), "key:owner");
    let mine = store(objects);
    let (f, peers) = asker(&mine, vec![owner.addr()], None);
    let v = version(&mine, "k");
    assert_eq!(&f.read(&v, 0..v.size).await.unwrap()[..], &data[..]);
    assert_eq!(load(&peers.stats().blocks_fetched), 1);
    assert_eq!(mine.count(Op::Get), 1, "fetched from the store instead");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_peer_port_is_no_server_and_no_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let store = store(&[]);
    let peers = Peers::new(config(vec![], None, "key:a"));
    assert!(server::serve(addr, fetcher(&store, None), peers.clone()).is_err());
    assert!(server::serve_or_warn(addr, fetcher(&store, None), peers.clone()).is_none());
    drop(taken);
    assert!(server::serve_or_warn(addr, fetcher(&store, None), peers).is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_serves_only_its_own_bucket_and_prefix() {
    let data = body(BS as usize, 9);
    let objects: &[(&str, &[u8])] = &[("k", &data)];
    let owner_store = store(objects);
    let fetcher = fetcher(&owner_store, None);
    let mut cfg = config(vec![], None, "key:a");
    cfg.prefix = "train/".into();
    let peers = Peers::new(cfg);
    let server = server::serve("127.0.0.1:0".parse().unwrap(), fetcher, peers).unwrap();
    let client = client::PeerClient::new(&config(vec![], None, "key:a"), "-");
    let v = version(&owner_store, "k");
    let e = client
        .get(&server.local_addr().to_string(), &v, 0, BS)
        .await
        .unwrap_err();
    assert!(matches!(e, client::PeerError::Status(404)), "{e}");
    assert!(!e.is_peer_fault());
    assert_eq!(owner_store.count(Op::Get), 0);
}

#[test]
fn the_breaker_opens_backs_off_doubling_and_lets_one_probe_through() {
    let base = Duration::from_secs(1);
    let t0 = Instant::now();
    let mut b = Breaker::default();
    assert!(b.allows(t0));
    assert!(b.failed(t0, base), "went bad");
    assert!(!b.allows(t0 + Duration::from_millis(500)));
    // Half-open: one probe, not two.
    assert!(b.allows(t0 + Duration::from_secs(1)));
    assert!(!b.allows(t0 + Duration::from_secs(1)));
    // The probe fails: twice as long.
    let t1 = t0 + Duration::from_secs(1);
    assert!(!b.failed(t1, base));
    assert!(!b.allows(t1 + Duration::from_millis(1500)));
    assert!(b.allows(t1 + Duration::from_secs(2)));
    assert!(b.succeeded(), "came back");
    assert!(b.allows(t1 + Duration::from_secs(2)));
    // At most 30 x the base.
    for _ in 0..20 {
        b.failed(t0, base);
    }
    assert!(b.allows(t0 + base * 30));
}

#[test]
fn membership_parses_and_recognises_this_node() {
    assert_eq!(
        Membership::parse("a:1, b:2,"),
        Ok(Membership::Static(vec!["a:1".into(), "b:2".into()]))
    );
    assert!(Membership::parse("a").is_err());
    assert!(Membership::parse(",").is_err());
    assert!(Membership::parse("dns:svc").is_err());
    assert!(Membership::parse("bad host:1").is_err());
    let listen: SocketAddr = "0.0.0.0:7070".parse().unwrap();
    assert!(is_self_addr("127.0.0.1:7070".parse().unwrap(), listen));
    assert!(!is_self_addr("127.0.0.1:7071".parse().unwrap(), listen));
    // An address of another machine (TEST-NET-1 is never local).
    assert!(!is_self_addr("192.0.2.1:7070".parse().unwrap(), listen));
    let exact: SocketAddr = "127.0.0.1:7070".parse().unwrap();
    let peers = Peers::new(config(
        vec!["127.0.0.1:7070".into(), "localhost:7071".into()],
        Some(exact),
        "key:a",
    ));
    let flags: Vec<bool> = peers.ring().members().iter().map(|m| m.is_self).collect();
    assert_eq!(flags, vec![true, false]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_membership_resolves_the_name_and_recognises_this_node() {
    let listen: SocketAddr = "127.0.0.1:7077".parse().unwrap();
    let mut cfg = config(Vec::new(), Some(listen), "key:a");
    cfg.members = Membership::Dns {
        name: "localhost".into(),
        port: 7077,
    };
    let peers = Peers::new(cfg);
    assert_eq!(peers.member_count(), 0, "nothing before the first lookup");
    peers.start_discovery();
    crate::test_support::eventually("the name to resolve", || peers.member_count() > 0).await;
    let ring = peers.ring();
    assert!(
        ring.members()
            .iter()
            .any(|m| m.addr == "127.0.0.1:7077" && m.is_self),
        "{:?}",
        ring.members()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_blocks_are_kept_on_disk_only_beyond_the_room_for_this_nodes_share() {
    let objects_data: Vec<(String, Vec<u8>)> = (0..24)
        .map(|i| (format!("f{i:02}"), body(1000 + i, i as u8)))
        .collect();
    let objects: Vec<(&str, &[u8])> = objects_data
        .iter()
        .map(|(k, d)| (k.as_str(), d.as_slice()))
        .collect();
    let owner = Node::start(fetcher(&store(&objects), None), "key:a");
    let me: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let read_all = |dataset_bytes: u64| {
        let objects = &objects;
        let owner = owner.addr();
        async move {
            let dir = tempfile::tempdir().unwrap();
            let mine = store(objects);
            let f = fetcher(&mine, Some((dir.path(), "key:a")));
            let peers = Peers::new(config(vec![owner, me.to_string()], Some(me), "key:a"));
            peers.set_dataset_bytes(dataset_bytes);
            f.set_peers(peers.clone());
            let mut from_peer = Vec::new();
            for (k, _) in objects {
                let v = version(&mine, k);
                f.read(&v, 0..v.size).await.unwrap();
                let name = BlockName::new("bucket", k, &v.etag, 0);
                if !peers.ring().owner(name).unwrap().is_self {
                    from_peer.push(v);
                }
            }
            assert!(!from_peer.is_empty());
            // Let the writes of kept copies land (a block leaves the in-flight table once
            // its write is over).
            crate::test_support::eventually("the copies' writes", || f.inflight.lock().is_empty())
                .await;
            let tier = f.disk().unwrap().clone();
            let kept = from_peer
                .iter()
                .filter(|v| tier.cache().is_complete(&tier.identity(v)))
                .count();
            (kept, from_peer.len(), dir)
        }
    };
    // A small dataset: room for this node's share and the copies.
    let (kept, n, _dir) = read_all(1 << 20).await;
    assert_eq!(kept, n, "every copy kept");
    // A dataset whose share (half of it, two members) fills the 64 MiB cache: no copies.
    let (kept, _, _dir) = read_all(128 << 20).await;
    assert_eq!(kept, 0, "no copy kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_never_answers_costs_one_timeout_then_its_breaker_keeps_it_out() {
    // Accepts connections and reads nothing: every request to it times out.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let objects_data: Vec<(String, Vec<u8>)> = (0..6)
        .map(|i| (format!("s{i}"), body(200, i as u8)))
        .collect();
    let objects: Vec<(&str, &[u8])> = objects_data
        .iter()
        .map(|(k, d)| (k.as_str(), d.as_slice()))
        .collect();
    let mine = store(&objects);
    let f = fetcher(&mine, None);
    let mut cfg = config(vec![silent_addr], None, "key:a");
    cfg.timeout = Duration::from_millis(200);
    let peers = Peers::new(cfg);
    f.set_peers(peers.clone());
    for (k, d) in &objects_data {
        let v = version(&mine, k);
        assert_eq!(&f.read(&v, 0..v.size).await.unwrap()[..], &d[..]);
    }
    // The first block waited for the timeout; the others did not ask the silent peer.
    assert_eq!(load(&peers.stats().errors), 1);
    assert_eq!(load(&peers.stats().store_fallbacks), 6);
    assert_eq!(mine.count(Op::Get), 6);
}

/// A peer port that hangs up on its first `drops` connections as soon as a request arrives
/// (what a keep-alive connection the peer closes under a request looks like), and passes
/// later connections through to `to`. Returns its address and the connections it accepted.
async fn hanging_up_peer(
    to: String,
    drops: usize,
) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let n = count.fetch_add(1, Ordering::SeqCst);
            let to = to.clone();
            tokio::spawn(async move {
                if n < drops {
                    // Read the whole head, so the close is a clean one (FIN, not a reset).
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    return;
                }
                let mut upstream = tokio::net::TcpStream::connect(&to).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut stream, &mut upstream).await;
            });
        }
    });
    (addr, accepted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_closed_under_a_request_is_retried_once_on_a_fresh_one() {
    let (data, _, owner, v) = one_block_owner(9);
    let client = client::PeerClient::new(&config(vec![], None, "key:a"), "-");
    // Hung up once: the second connection answers, and the block is whole.
    let (once, accepted) = hanging_up_peer(owner.addr(), 1).await;
    let (got, _) = client.get(&once, &v, 0, BS).await.unwrap();
    assert_eq!(&got[..], &data[..]);
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    // Hung up every time: one retry, then the peer's failure.
    let (always, accepted) = hanging_up_peer(owner.addr(), usize::MAX).await;
    let e = client.get(&always, &v, 0, BS).await.unwrap_err();
    assert!(matches!(e, client::PeerError::Request(_)), "{e}");
    assert!(e.is_peer_fault());
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}
