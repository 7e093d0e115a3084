//! Nodes serve each other's cache: one fetch from the store per block and cluster.
//!
//! # Ownership
//! Every block of an object version (bucket, key, ETag, block index) has one owner among the
//! members, by rendezvous hashing ([`ring`]). Blocks are immutable (an ETag names one
//! version), so no node ever invalidates another's copy, and a membership change moves about
//! 1/N of the ownership and no data.
//!
//! # The read path (the ladder)
//! The fetcher asks here only for blocks that are in neither its memory cache, its in-flight
//! table nor its NVMe cache, at the point where it would send a store GET (so demand reads,
//! read-ahead, epoch prefetch, plans and `riffle warm` all go through the owners). For each
//! such block ([`Peers::fetch_block`]):
//! 1. the members are ranked for the block; members whose circuit breaker is open are passed
//!    over (as if absent);
//! 2. if this node is first, it is the owner and fetches from the store itself
//!    ([`Outcome::Local`]);
//! 3. otherwise the first is asked (`GET /v1/block` on its peer port, [`client`]); the owner
//!    answers from its memory or NVMe cache, or fills itself from the store through its own
//!    fetcher, where its in-flight table makes one GET of concurrent askers ([`server`]);
//! 4. on an error or a timeout (`--peer-timeout`, 2 s by default) the next-ranked member is
//!    asked once (if that is this node, the store is);
//! 5. then the store, directly ([`Outcome::Fallback`]).
//!
//! Every block received is checked against the CRC32C the owner sent (and the answer's MAC),
//! like a block read back from disk; a mismatch is an error of that peer. A peer whose
//! request failed (transport error, timeout, 5xx, 401, a bad block) is kept out for a
//! back-off (1 s, doubling to 30 s while it keeps failing); when the back-off is over one
//! request is let through (half-open), and its success closes the breaker. So a dead peer
//! costs at most one timeout per block and then nothing until its back-off ends. A peer's 404
//! or 412 (it cannot serve that object) is not a fault of the peer and opens nothing.
//!
//! A node never asks itself, and a block served to a peer is always fetched *locally* (the
//! owner's memory, disk or the store, never another peer), so a request never travels more
//! than one hop, even while two nodes disagree on the members.
//!
//! # Local copies
//! A block read from a peer goes into the memory cache (like any fetched block), and into the
//! NVMe cache only while that cache has room for it beyond this node's share of the dataset
//! (the bytes the mount has listed ÷ the members: about what it owns), and has never had to
//! evict since it was opened. So a node whose cache holds the whole dataset keeps a copy of
//! everything it read (later epochs are local reads), and a cache smaller than that holds the
//! blocks the node owns and no copies that would push them out: measured on W6 with caches of
//! 40% of the dataset each, copies kept whenever the cache had room cost 0.24–0.29 store GETs
//! per file in epochs 2–3 (owned blocks evicted for copies, then fetched again for peers);
//! with the reserve, 0.
//!
//! # Proofs across nodes
//! The cache serves an object version to a mount only with a read proof of its principal
//! ([`crate::cache::proofs`]), and that holds across nodes: a request names the asking
//! mount's principal hash, and the owner's answer says whether the owner holds a read proof
//! for that principal and that version (it always holds one for its own principal, as it
//! serves only bytes its mount may read: it fetched them, or proved them). So when the
//! principals match (the same credentials on every node, the usual case), the asking node
//! records a proof without a request to the store; otherwise it makes its own proof request
//! (the one-byte GET of [`crate::fetch::Fetcher::admit`]) before it serves the bytes to its
//! mount, and a refusal fails the read with `EACCES` as it would locally. A mount without a
//! cache directory (no proof log) takes unattested blocks from the store instead.
//!
//! # Membership
//! `--peers` lists `HOST:PORT` of every node (the same list on every node; it may include the
//! node's own `--peer-listen` address, recognised as itself). `dns:NAME:PORT` instead resolves
//! NAME (a Kubernetes headless Service: one address per ready pod) every 30 s; each address
//! with PORT is a member. Members are named by `IP:PORT` then, the same on every node.

pub mod auth;
pub mod client;
pub mod ring;
pub mod server;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};

use super::ObjectVersion;
pub use auth::Secret;
use ring::{BlockName, Member, Ring};

/// How often `dns:` membership is resolved again.
pub const DNS_REFRESH: Duration = Duration::from_secs(30);

/// Where the member list comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Membership {
    /// `HOST:PORT,...`
    Static(Vec<String>),
    /// `dns:NAME:PORT`: every address NAME resolves to, with PORT.
    Dns { name: String, port: u16 },
}

impl Membership {
    /// Parses `--peers`: `dns:NAME:PORT`, or `HOST:PORT` separated by commas.
    pub fn parse(s: &str) -> Result<Membership, String> {
        let s = s.trim();
        if let Some(rest) = s.strip_prefix("dns:") {
            let (name, port) =
                split_host_port(rest).ok_or_else(|| format!("'{s}' is not dns:NAME:PORT"))?;
            return Ok(Membership::Dns {
                name: name.to_string(),
                port,
            });
        }
        let mut members = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if split_host_port(part).is_none() {
                return Err(format!("'{part}' is not HOST:PORT"));
            }
            members.push(part.to_string());
        }
        if members.is_empty() {
            return Err("--peers lists no HOST:PORT".into());
        }
        Ok(Membership::Static(members))
    }
}

/// `HOST:PORT` (IPv6 in brackets) split, with a nonzero port and a plausible host.
pub fn split_host_port(s: &str) -> Option<(&str, u16)> {
    let (host, port) = s.rsplit_once(':')?;
    let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let plausible = !host.is_empty()
        && host.len() <= 253
        && (host.parse::<IpAddr>().is_ok()
            || host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.'));
    plausible.then_some((host, port))
}

/// What a node needs to take part.
#[derive(Debug, Clone)]
pub struct PeerConfig {
    /// This node's peer port (`--peer-listen`); `None`: it only asks, and owns nothing.
    pub listen: Option<SocketAddr>,
    pub members: Membership,
    pub secret: Secret,
    pub timeout: Duration,
    /// The mount's bucket and prefix: a node serves only objects under them.
    pub bucket: String,
    pub prefix: String,
    /// The mount's principal hash, 32 hex digits ([`crate::cache::Principal::to_hex`]).
    pub principal: String,
    pub block_size: u64,
    /// The first back-off of a failed peer (doubles to 30x while it keeps failing).
    pub backoff: Duration,
}

/// Counters, in `riffle stats` as `peer.*`.
#[derive(Debug, Default)]
pub struct PeerStats {
    pub bytes_served: AtomicU64,
    pub blocks_served: AtomicU64,
    pub bytes_fetched: AtomicU64,
    pub blocks_fetched: AtomicU64,
    /// Blocks the ladder gave up on and fetched from the store.
    pub store_fallbacks: AtomicU64,
    /// Failed requests to peers (and refused requests from them).
    pub errors: AtomicU64,
}

/// What the ladder got for one block.
#[derive(Debug)]
pub enum Outcome {
    /// This node owns the block: fetch it from the store.
    Local,
    /// Every peer asked failed: fetch it from the store.
    Fallback,
    /// The bytes, CRC-checked; `proof`: the owner attests a read proof of this mount's
    /// principal for the version.
    Got { data: Bytes, proof: bool },
}

/// A peer's circuit breaker (see the module documentation).
#[derive(Debug, Default)]
struct Breaker {
    failures: u32,
    open_until: Option<Instant>,
    probing: bool,
}

impl Breaker {
    fn allows(&mut self, now: Instant) -> bool {
        match self.open_until {
            None => true,
            Some(t) if now < t => false,
            Some(_) if self.probing => false,
            Some(_) => {
                self.probing = true;
                true
            }
        }
    }

    /// Returns whether the breaker was closed before (the peer just went bad).
    fn failed(&mut self, now: Instant, base: Duration) -> bool {
        let was_closed = self.open_until.is_none();
        self.failures = self.failures.saturating_add(1);
        let factor = 1u32 << (self.failures - 1).min(5);
        self.open_until = Some(now + (base * factor).min(base * 30));
        self.probing = false;
        was_closed
    }

    /// Returns whether the breaker was open (the peer came back).
    fn succeeded(&mut self) -> bool {
        let was_open = self.open_until.is_some();
        *self = Breaker::default();
        was_open
    }
}

/// A node's view of its peers: membership, breakers, the client, counters.
pub struct Peers {
    config: PeerConfig,
    ring: RwLock<Arc<Ring>>,
    breakers: Mutex<HashMap<String, Breaker>>,
    client: client::PeerClient,
    stats: PeerStats,
    node: String,
    /// Bytes of the dataset as far as the mount has listed it ([`Self::set_dataset_bytes`]).
    dataset_bytes: AtomicU64,
}

impl std::fmt::Debug for Peers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peers")
            .field("node", &self.node)
            .field("members", &self.ring.read().len())
            .finish_non_exhaustive()
    }
}

impl Peers {
    /// Peers with a static member list resolved now (blocking, at mount); a `dns:` list
    /// starts empty until [`Self::start_discovery`] resolves it.
    pub fn new(config: PeerConfig) -> Arc<Peers> {
        let node = config
            .listen
            .map_or_else(|| "-".to_string(), |a| a.to_string());
        let client = client::PeerClient::new(&config, &node);
        let peers = Arc::new(Peers {
            ring: RwLock::new(Arc::new(Ring::default())),
            breakers: Mutex::new(HashMap::new()),
            client,
            stats: PeerStats::default(),
            node,
            config,
            dataset_bytes: AtomicU64::new(0),
        });
        if let Membership::Static(list) = &peers.config.members {
            let members = list
                .iter()
                .map(|addr| Member::new(addr, peers.is_self_static(addr)))
                .collect();
            peers.set_ring(Ring::new(members));
        }
        peers
    }

    pub fn config(&self) -> &PeerConfig {
        &self.config
    }

    pub fn stats(&self) -> &PeerStats {
        &self.stats
    }

    /// Members in the ring now (this node included when it is one).
    pub fn member_count(&self) -> usize {
        self.ring.read().len()
    }

    /// Tells how many bytes the mount's dataset has (as listed so far); see
    /// [`Self::owned_share`].
    pub fn set_dataset_bytes(&self, bytes: u64) {
        self.dataset_bytes.store(bytes, Ordering::Relaxed);
    }

    /// The bytes of the dataset this node owns, about: the dataset's bytes over the members,
    /// 0 when it is not a member. The NVMe cache keeps this much room for owned blocks
    /// before it keeps copies of other nodes' blocks (see the module documentation).
    pub fn owned_share(&self) -> u64 {
        let ring = self.ring.read();
        if !ring.members().iter().any(|m| m.is_self) {
            return 0;
        }
        self.dataset_bytes.load(Ordering::Relaxed) / ring.len().max(1) as u64
    }

    pub fn ring(&self) -> Arc<Ring> {
        self.ring.read().clone()
    }

    fn set_ring(&self, ring: Ring) {
        let addrs: Vec<&str> = ring.members().iter().map(|m| m.addr.as_str()).collect();
        tracing::info!(members = ?addrs, "peer members");
        *self.ring.write() = Arc::new(ring);
    }

    /// Whether `addr` (as listed in `--peers`) is this node's `--peer-listen` address.
    fn is_self_static(&self, addr: &str) -> bool {
        let Some(listen) = self.config.listen else {
            return false;
        };
        if addr == listen.to_string() {
            return true;
        }
        let Some((host, port)) = split_host_port(addr) else {
            return false;
        };
        if port != listen.port() {
            return false;
        }
        use std::net::ToSocketAddrs;
        let resolved: Vec<SocketAddr> = (host, port)
            .to_socket_addrs()
            .map(|a| a.collect())
            .unwrap_or_default();
        resolved.iter().any(|a| is_self_addr(*a, listen))
    }

    /// With `dns:` membership, resolves the name now and every [`DNS_REFRESH`] on the
    /// current runtime; the task ends when `self` is dropped.
    pub fn start_discovery(self: &Arc<Self>) {
        let Membership::Dns { name, port } = self.config.members.clone() else {
            return;
        };
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut last: Vec<String> = Vec::new();
            loop {
                let Some(this) = weak.upgrade() else { return };
                match tokio::net::lookup_host((name.as_str(), port)).await {
                    Ok(found) => {
                        let mut addrs: Vec<SocketAddr> = found.collect();
                        addrs.sort();
                        addrs.dedup();
                        let names: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
                        if names != last {
                            let members = addrs
                                .iter()
                                .map(|a| {
                                    let me =
                                        this.config.listen.is_some_and(|l| is_self_addr(*a, l));
                                    Member::new(&a.to_string(), me)
                                })
                                .collect();
                            this.set_ring(Ring::new(members));
                            last = names;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(%name, error = %e, "cannot resolve the peers' DNS name; keeping the members known")
                    }
                }
                drop(this);
                tokio::time::sleep(DNS_REFRESH).await;
            }
        });
    }

    /// Gets block `index` (of `len` bytes) of `obj` by the ladder of the module documentation.
    pub async fn fetch_block(&self, obj: &ObjectVersion, index: u64, len: u64) -> Outcome {
        let ring = self.ring();
        let name = BlockName::new(&self.config.bucket, &obj.key, &obj.etag, index);
        let mut tried = 0;
        for member in ring.rank(name) {
            if member.is_self {
                if tried == 0 {
                    return Outcome::Local;
                }
                break;
            }
            if !self
                .breakers
                .lock()
                .entry(member.addr.clone())
                .or_default()
                .allows(Instant::now())
            {
                continue;
            }
            tried += 1;
            let result = tokio::time::timeout(
                self.config.timeout,
                self.client.get(&member.addr, obj, index, len),
            )
            .await
            .unwrap_or(Err(client::PeerError::Timeout));
            match result {
                Ok((data, proof)) => {
                    if self
                        .breakers
                        .lock()
                        .entry(member.addr.clone())
                        .or_default()
                        .succeeded()
                    {
                        tracing::info!(peer = %member.addr, "peer answers again");
                    }
                    self.stats.blocks_fetched.fetch_add(1, Ordering::Relaxed);
                    self.stats
                        .bytes_fetched
                        .fetch_add(data.len() as u64, Ordering::Relaxed);
                    return Outcome::Got { data, proof };
                }
                Err(e) => {
                    self.stats.errors.fetch_add(1, Ordering::Relaxed);
                    if e.is_peer_fault() {
                        let went_bad = self
                            .breakers
                            .lock()
                            .entry(member.addr.clone())
                            .or_default()
                            .failed(Instant::now(), self.config.backoff);
                        if went_bad {
                            tracing::warn!(peer = %member.addr, error = %e, "peer failed; asking others and the store until it answers again");
                        } else {
                            tracing::debug!(peer = %member.addr, error = %e, "peer failed again");
                        }
                    } else {
                        tracing::debug!(peer = %member.addr, key = %obj.key, error = %e, "peer cannot serve the block");
                    }
                }
            }
            if tried >= 2 {
                break;
            }
        }
        self.stats.store_fallbacks.fetch_add(1, Ordering::Relaxed);
        Outcome::Fallback
    }

    /// Whether the owner attests a read proof for `principal` (hex): it holds one for its
    /// own principal for everything it serves (see the module documentation).
    pub(crate) fn attests(&self, principal: &str) -> bool {
        principal.eq_ignore_ascii_case(&self.config.principal)
    }
}

/// Whether `addr` names this node listening on `listen`: the same address, or the same port
/// with `listen` on every interface and `addr`'s IP one of this machine's (it can be bound).
fn is_self_addr(addr: SocketAddr, listen: SocketAddr) -> bool {
    if addr == listen {
        return true;
    }
    if addr.port() != listen.port() || !listen.ip().is_unspecified() {
        return false;
    }
    addr.ip().is_loopback() || std::net::UdpSocket::bind(SocketAddr::new(addr.ip(), 0)).is_ok()
}

#[cfg(test)]
mod tests;
