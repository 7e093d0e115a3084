//! Peers in Kubernetes: which `riffle mount` peer flags each volume daemon of a node gets, so
//! that the nodes serve each other's cache (riffle's `fetch::peer`) with no configuration of
//! their own.
//!
//! # Membership
//! A headless Service over the riffle-mounter pods (`deploy/kubernetes/peers.yaml`) has one
//! DNS address per ready mounter pod; the mounter runs on the host network, so that is the
//! node's address, and it is also the mounter's `status.podIP` (`--peer-address`, from the
//! downward API). A daemon gets `--peers dns:SERVICE:PORT` (every address of the Service with
//! the volume's port is a member) and `--peer-listen ADDRESS:PORT`, which names the very
//! member the Service lists for this node: riffle recognises itself in the ring that way.
//! Nodes that do not mount the volume are members too, with nothing listening on the port: a
//! refused connection opens their circuit breaker in the other daemons, which then pass them
//! over (one refused connection per member and back-off, up to 30 s).
//!
//! # The port rule
//! One mounter runs many daemons, so each ring needs a port of its own, the same on every node
//! with no coordination: the port is a hash of the ring's key within `--peer-ports` (7000-7999
//! by default). The key is what the bytes depend on: the store (the volume's `endpointUrl`,
//! normalised, and `region`), the bucket and the prefix ([`ring_key`]). Not the volume id
//! (an inline volume's id is new for every pod, and two PVs of the same data should share one
//! ring), nor the identity (the cache's proof rule holds across nodes: a node serves a block to
//! a mount only once that mount's principal has a read proof for the object), nor settings
//! that change no byte (uid, modes, cache size, memory).
//!
//! # Collisions
//! On each node the mounter keeps which daemon holds which port, and checks that a free one can
//! be bound before it gives it out. A daemon whose port is taken still mounts, and still asks
//! the ring's owners (`--peers` without `--peer-listen`: it owns nothing and serves nobody):
//! - by a daemon of the *same* ring (two volumes of the same data on one node): expected, logged
//!   at INFO; the other nodes' requests to this node reach that daemon, which serves the same
//!   bytes;
//! - by a daemon of *another* ring (two keys hash to one port, about k²/2000 for k rings on a
//!   node with the default range), or by another program on the node: a WARN naming both, and
//!   `riffle_mounter_peer_port_conflicts_total` on the mounter's metrics. Other nodes' requests
//!   for this ring's blocks reach the port's holder, which refuses them (404: another bucket or
//!   prefix; not a fault of the peer), and they ask the next-ranked member: one extra round
//!   trip for the blocks this node would own, no failed read, no extra store GET.
//!
//! A daemon that finds its port taken after all (a race with another program) logs a WARN and
//! mounts all the same (riffle's `fetch::peer::server::serve_or_warn`).
//!
//! # The secret
//! `--peer-secret-file` is a file of a Kubernetes Secret mounted into the mounter; only its
//! path is passed on (a daemon reads it at start). The mounter reads it to check that it is
//! there and long enough (riffle refuses a secret under 16 bytes, which would fail the mount);
//! without it the volume's daemon runs without peers, so creating the Secret is what turns
//! peers on. Its bytes are never logged nor put in an argument, an error or a metric.

use crate::kube::settings::VolumeSettings;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::ffi::OsString;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The default `--peer-ports`.
pub const DEFAULT_PORTS: &str = "7000-7999";

/// riffle's shortest peer secret, in bytes (after trimming whitespace).
pub const MIN_SECRET_BYTES: usize = 16;

/// Daemons that could not have their ring's port (another ring's daemon or another program
/// holds it), since the mounter started: `riffle_mounter_peer_port_conflicts_total`.
pub static PORT_CONFLICTS: AtomicU64 = AtomicU64::new(0);

/// The peer options of riffle-mounter (and of riffle-csi when it runs the daemons itself).
#[derive(Debug, Clone, clap::Args)]
pub struct PeerOptions {
    /// The DNS name of the headless Service over the riffle-mounter pods
    /// (deploy/kubernetes/peers.yaml), e.g. riffle-peers.riffle-csi.svc.cluster.local: with
    /// it, every volume's daemon joins the ring of the nodes that mount the same data, once
    /// --peer-secret-file exists. Needs --peer-address.
    #[arg(long, env = "RIFFLE_PEER_SERVICE")]
    pub peer_service: Option<String>,
    /// The file holding the secret the nodes share (a Kubernetes Secret's key, at least 16
    /// bytes); checked at each mount: while it is missing, daemons run without peers.
    #[arg(
        long,
        env = "RIFFLE_PEER_SECRET_FILE",
        default_value = "/etc/riffle-peers/secret"
    )]
    pub peer_secret_file: PathBuf,
    /// This node's address as the Service lists it (the mounter pod's status.podIP, which is
    /// the node's: host network); the daemons' peer ports listen on it only.
    #[arg(long, env = "RIFFLE_PEER_ADDRESS")]
    pub peer_address: Option<IpAddr>,
    /// The ports the rings' ports are hashed into (FIRST-LAST), the same on every node; a
    /// port of the range held by another program only makes the rings hashed to it lose
    /// this node's share.
    #[arg(long, env = "RIFFLE_PEER_PORTS", default_value = DEFAULT_PORTS, value_parser = PortRange::parse)]
    pub peer_ports: PortRange,
}

impl PeerOptions {
    /// The node's peer setup, or None without --peer-service (or without --peer-address,
    /// which is logged).
    pub fn setup(&self) -> Option<Arc<NodePeers>> {
        let service = self.peer_service.as_ref()?.trim().to_string();
        if service.is_empty() {
            return None;
        }
        let Some(address) = self.peer_address else {
            tracing::error!("--peer-service needs --peer-address (the mounter pod's status.podIP); volumes run without peers");
            return None;
        };
        tracing::info!(
            %service,
            %address,
            ports = %self.peer_ports,
            secret_file = %self.peer_secret_file.display(),
            "peers: volume daemons join their data's ring once the secret file exists"
        );
        Some(Arc::new(NodePeers::new(
            service,
            address,
            self.peer_ports,
            self.peer_secret_file.clone(),
        )))
    }
}

/// An inclusive range of ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    /// Parses `FIRST-LAST` (or one port).
    pub fn parse(s: &str) -> Result<PortRange, String> {
        let s = s.trim();
        let (a, b) = s.split_once('-').unwrap_or((s, s));
        let port = |p: &str| {
            p.trim()
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| format!("'{s}' is not FIRST-LAST (ports 1-65535)"))
        };
        let (first, last) = (port(a)?, port(b)?);
        if first > last {
            return Err(format!("'{s}': the first port is above the last"));
        }
        Ok(PortRange { first, last })
    }

    pub fn len(&self) -> u32 {
        u32::from(self.last - self.first) + 1
    }

    pub fn is_empty(&self) -> bool {
        false
    }
}

impl std::fmt::Display for PortRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

/// The key of a volume's ring: the hex SHA-256 of the store, bucket and prefix (see the module
/// documentation).
pub fn ring_key(settings: &VolumeSettings) -> String {
    let endpoint = settings
        .options
        .get("endpoint-url")
        .map(|u| {
            url::Url::parse(u)
                .map(|u| u.as_str().trim_end_matches('/').to_ascii_lowercase())
                .unwrap_or_else(|_| u.clone())
        })
        .unwrap_or_default();
    let region = settings.options.get("region").cloned().unwrap_or_default();
    let mut h = Sha256::new();
    for part in [
        "riffle-peers-v1",
        &endpoint,
        &region,
        &settings.bucket,
        &settings.prefix,
    ] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    hex::encode(h.finalize())
}

/// The port of the ring `key` ([`ring_key`]) within `range`: the same on every node.
pub fn port_for(key: &str, range: PortRange) -> u16 {
    let digest = Sha256::digest(key.as_bytes());
    let mut n = [0u8; 8];
    n.copy_from_slice(&digest[..8]);
    let offset = u64::from_be_bytes(n) % u64::from(range.len());
    range.first + offset as u16
}

/// Why a daemon does not serve its ring's port on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Taken {
    /// A daemon of the same ring (at this target) serves it.
    SameRing(PathBuf),
    /// A daemon of another ring (at this target) holds it.
    OtherRing(PathBuf),
    /// Something else on the node holds it.
    OtherProgram,
}

/// What a volume's daemon does with peers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// No peer flags, and why.
    Off(String),
    /// Serves its ring on `port` and asks the ring's owners.
    Member { port: u16 },
    /// Asks the ring's owners on `port`; serves nothing (the port is taken here).
    Asker { port: u16, taken: Taken },
}

/// Who holds a port on this node.
#[derive(Debug, Clone)]
struct Holder {
    ring: String,
    target: PathBuf,
}

/// The node's peer setup: the Service, this node's address, the port range, the secret file,
/// and which of this mounter's daemons holds which port.
#[derive(Debug)]
pub struct NodePeers {
    service: String,
    address: IpAddr,
    ports: PortRange,
    secret_file: PathBuf,
    held: Mutex<HashMap<u16, Holder>>,
    /// Where a daemon's target asks (so that a release frees only what it held).
    roles: Mutex<HashMap<PathBuf, u16>>,
}

impl NodePeers {
    pub fn new(service: String, address: IpAddr, ports: PortRange, secret_file: PathBuf) -> Self {
        NodePeers {
            service,
            address,
            ports,
            secret_file,
            held: Mutex::new(HashMap::new()),
            roles: Mutex::new(HashMap::new()),
        }
    }

    /// Decides the role of the daemon about to mount `settings` at `target` (replacing any
    /// role `target` had), logs it, and returns its `riffle mount` flags.
    pub fn flags(&self, settings: &VolumeSettings, target: &Path) -> Vec<OsString> {
        let role = self.assign(settings, target, &|addr| TcpListener::bind(addr).is_ok());
        let volume = settings.source_url();
        match &role {
            Role::Off(why) => {
                tracing::info!(target = %target.display(), %volume, "no peers: {why}")
            }
            Role::Member { port } => tracing::info!(
                target = %target.display(),
                %volume,
                listen = %SocketAddr::new(self.address, *port),
                "the daemon serves its ring's peers (dns:{}:{port})",
                self.service
            ),
            Role::Asker {
                port,
                taken: Taken::SameRing(other),
            } => tracing::info!(
                target = %target.display(),
                %volume,
                port,
                "the daemon asks its ring's peers; the daemon at {} serves the ring's port for this node (the same data)",
                other.display()
            ),
            Role::Asker {
                port,
                taken: Taken::OtherRing(other),
            } => tracing::warn!(
                target = %target.display(),
                %volume,
                port,
                "peer port collision: the daemon of another volume (at {}) holds this ring's port on this node; this daemon asks its peers but serves none (set another --peer-ports range, or peers: \"false\" on one of the volumes)",
                other.display()
            ),
            Role::Asker {
                port,
                taken: Taken::OtherProgram,
            } => tracing::warn!(
                target = %target.display(),
                %volume,
                port,
                "peer port collision: port {port} cannot be bound on {} (another program?); this daemon asks its peers but serves none (see --peer-ports)",
                self.address
            ),
        }
        self.role_flags(&role)
    }

    /// The `riffle mount` flags of `role`.
    pub fn role_flags(&self, role: &Role) -> Vec<OsString> {
        let port = match role {
            Role::Off(_) => return Vec::new(),
            Role::Member { port } | Role::Asker { port, .. } => *port,
        };
        let mut out = Vec::new();
        if let Role::Member { .. } = role {
            out.push(format!("--peer-listen={}", SocketAddr::new(self.address, port)).into());
        }
        out.push(format!("--peers=dns:{}:{port}", self.service).into());
        let mut secret = OsString::from("--peer-secret-file=");
        secret.push(&self.secret_file);
        out.push(secret);
        out
    }

    /// The role of the daemon at `target` for `settings`; `bindable` says whether this node
    /// can listen on an address (a port no daemon of this mounter holds may still be another
    /// program's).
    pub fn assign(
        &self,
        settings: &VolumeSettings,
        target: &Path,
        bindable: &dyn Fn(SocketAddr) -> bool,
    ) -> Role {
        self.release(target);
        if !settings.peers_enabled() {
            return Role::Off("the volume sets peers: \"false\"".into());
        }
        if let Err(why) = check_secret(&self.secret_file) {
            return Role::Off(why);
        }
        let ring = ring_key(settings);
        let port = port_for(&ring, self.ports);
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let role = match held.get(&port) {
            Some(h) if h.ring == ring => Role::Asker {
                port,
                taken: Taken::SameRing(h.target.clone()),
            },
            Some(h) => Role::Asker {
                port,
                taken: Taken::OtherRing(h.target.clone()),
            },
            None if !bindable(SocketAddr::new(self.address, port)) => Role::Asker {
                port,
                taken: Taken::OtherProgram,
            },
            None => {
                held.insert(
                    port,
                    Holder {
                        ring,
                        target: target.to_path_buf(),
                    },
                );
                self.roles
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(target.to_path_buf(), port);
                Role::Member { port }
            }
        };
        if matches!(
            role,
            Role::Asker {
                taken: Taken::OtherRing(_) | Taken::OtherProgram,
                ..
            }
        ) {
            PORT_CONFLICTS.fetch_add(1, Ordering::Relaxed);
        }
        role
    }

    /// Frees the port the daemon at `target` held (it is unmounted, or failed to mount).
    pub fn release(&self, target: &Path) {
        let port = self
            .roles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(target);
        if let Some(port) = port {
            let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            if held.get(&port).is_some_and(|h| h.target == target) {
                held.remove(&port);
            }
        }
    }
}

/// Whether `path` holds a usable peer secret; the reason (never its content) if not.
pub fn check_secret(path: &Path) -> Result<(), String> {
    match std::fs::read(path) {
        Ok(raw) if raw.trim_ascii().len() >= MIN_SECRET_BYTES => Ok(()),
        Ok(raw) if raw.trim_ascii().is_empty() => {
            Err(format!("the peer secret file {} is empty", path.display()))
        }
        Ok(_) => Err(format!(
            "the peer secret in {} is shorter than {MIN_SECRET_BYTES} bytes",
            path.display()
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(format!(
            "no peer secret at {} (create the Secret: docs/kubernetes/peers.md)",
            path.display()
        )),
        Err(e) => Err(format!(
            "cannot read the peer secret file {}: {}",
            path.display(),
            e.kind()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::io::Write;

    fn settings(pairs: &[(&str, &str)]) -> VolumeSettings {
        let attrs: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        VolumeSettings::parse(&attrs, &[]).expect("valid")
    }

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    fn node(dir: &tempfile::TempDir, secret: Option<&str>) -> NodePeers {
        let file = dir.path().join("secret");
        if let Some(s) = secret {
            let mut f = std::fs::File::create(&file).unwrap();
            writeln!(f, "{s}").unwrap();
        }
        NodePeers::new(
            "riffle-peers.riffle-csi.svc.cluster.local".into(),
            "10.1.2.3".parse().unwrap(),
            PortRange::parse(DEFAULT_PORTS).unwrap(),
            file,
        )
    }

    fn strings(flags: Vec<OsString>) -> Vec<String> {
        flags
            .into_iter()
            .map(|f| f.into_string().unwrap())
            .collect()
    }

    #[test]
    fn port_ranges() {
        assert_eq!(
            PortRange::parse("7000-7999"),
            Ok(PortRange {
                first: 7000,
                last: 7999
            })
        );
        assert_eq!(PortRange::parse("7000-7999").unwrap().len(), 1000);
        assert_eq!(PortRange::parse(" 7070 ").unwrap().len(), 1);
        for bad in ["", "0-10", "10-5", "a-b", "7000-70000", "-"] {
            assert!(PortRange::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_port_depends_on_the_data_only_and_stays_in_range() {
        let range = PortRange::parse(DEFAULT_PORTS).unwrap();
        let base = settings(&[("bucket", "imagenet"), ("prefix", "train")]);
        let key = ring_key(&base);
        let port = port_for(&key, range);
        assert!((7000..=7999).contains(&port));
        // Fixed forever (every node, every version must agree): a change here splits rings
        // across a rolling update.
        assert_eq!(port, port_for(&ring_key(&base), range));
        // Settings that change no byte, the identity and peers itself: the same ring.
        for same in [
            settings(&[
                ("bucket", "imagenet"),
                ("prefix", "/train/"),
                ("uid", "1000"),
                ("cacheSize", "10GiB"),
                ("maxMemory", "2GiB"),
            ]),
            settings(&[
                ("bucket", "imagenet"),
                ("prefix", "train"),
                ("roleArn", "arn:aws:iam::1:role/r"),
            ]),
        ] {
            assert_eq!(ring_key(&same), key);
        }
        // The store, the bucket, the prefix: another ring.
        for other in [
            settings(&[("bucket", "imagenet"), ("prefix", "val")]),
            settings(&[("bucket", "imagenet2"), ("prefix", "train")]),
            settings(&[
                ("bucket", "imagenet"),
                ("prefix", "train"),
                ("endpointUrl", "http://rgw:7480"),
            ]),
            settings(&[
                ("bucket", "imagenet"),
                ("prefix", "train"),
                ("region", "eu-west-1"),
            ]),
        ] {
            assert_ne!(ring_key(&other), key);
        }
        // Spellings of one endpoint are one ring.
        let a = settings(&[("bucket", "b12"), ("endpointUrl", "http://RGW:7480")]);
        let b = settings(&[("bucket", "b12"), ("endpointUrl", "http://rgw:7480/")]);
        assert_eq!(ring_key(&a), ring_key(&b));
        // Spread over the range: 200 buckets take well over 150 distinct ports of 1000.
        let ports: std::collections::HashSet<u16> = (0..200)
            .map(|i| {
                port_for(
                    &ring_key(&settings(&[("bucket", &format!("bucket-{i}"))])),
                    range,
                )
            })
            .collect();
        assert!(ports.len() > 150, "{}", ports.len());
        let one = PortRange::parse("7070").unwrap();
        assert_eq!(port_for(&key, one), 7070);
    }

    #[test]
    fn a_member_listens_on_the_node_address_and_asks_the_service() {
        let dir = tempfile::tempdir().unwrap();
        let peers = node(&dir, Some(SECRET));
        let s = settings(&[("bucket", "imagenet")]);
        let port = port_for(&ring_key(&s), peers.ports);
        let role = peers.assign(&s, Path::new("/t/a"), &|_| true);
        assert_eq!(role, Role::Member { port });
        let flags = strings(peers.role_flags(&role));
        assert_eq!(
            flags,
            vec![
                format!("--peer-listen=10.1.2.3:{port}"),
                format!("--peers=dns:riffle-peers.riffle-csi.svc.cluster.local:{port}"),
                format!("--peer-secret-file={}", dir.path().join("secret").display()),
            ]
        );
        // Never the secret itself.
        assert!(!flags.iter().any(|f| f.contains(SECRET)));
        // Assigning the same target again (a take-over, a remount) keeps its port.
        assert_eq!(
            peers.assign(&s, Path::new("/t/a"), &|_| true),
            Role::Member { port }
        );
    }

    #[test]
    fn ipv6_addresses_are_bracketed() {
        let dir = tempfile::tempdir().unwrap();
        let mut peers = node(&dir, Some(SECRET));
        peers.address = "fd00::7".parse().unwrap();
        let flags = strings(peers.role_flags(&Role::Member { port: 7001 }));
        assert_eq!(flags[0], "--peer-listen=[fd00::7]:7001");
    }

    #[test]
    fn without_a_secret_or_with_peers_false_there_are_no_flags() {
        let dir = tempfile::tempdir().unwrap();
        let s = settings(&[("bucket", "imagenet")]);
        let missing = node(&dir, None);
        let Role::Off(why) = missing.assign(&s, Path::new("/t/a"), &|_| true) else {
            panic!("no secret, no peers")
        };
        assert!(why.contains("no peer secret"), "{why}");
        let short = node(&dir, Some("short-secret"));
        let Role::Off(why) = short.assign(&s, Path::new("/t/a"), &|_| true) else {
            panic!("short secret")
        };
        assert!(why.contains("shorter than 16"), "{why}");
        assert!(!why.contains("short-secret"), "{why}");
        assert!(short.role_flags(&Role::Off(why)).is_empty());
        let peers = node(&dir, Some(SECRET));
        let off = settings(&[("bucket", "imagenet"), ("peers", "false")]);
        assert!(matches!(
            peers.assign(&off, Path::new("/t/a"), &|_| true),
            Role::Off(_)
        ));
        // Created later, the secret turns peers on for the next mount.
        assert!(matches!(
            peers.assign(&s, Path::new("/t/a"), &|_| true),
            Role::Member { .. }
        ));
    }

    #[test]
    fn collisions_leave_an_asker_that_still_mounts() {
        let dir = tempfile::tempdir().unwrap();
        let peers = node(&dir, Some(SECRET));
        let a = settings(&[("bucket", "imagenet")]);
        let port = port_for(&ring_key(&a), peers.ports);
        assert_eq!(
            peers.assign(&a, Path::new("/t/a"), &|_| true),
            Role::Member { port }
        );
        // The same data at another target: asks, the first serves.
        let a2 = settings(&[("bucket", "imagenet"), ("uid", "1000")]);
        assert_eq!(
            peers.assign(&a2, Path::new("/t/a2"), &|_| true),
            Role::Asker {
                port,
                taken: Taken::SameRing("/t/a".into())
            }
        );
        // Another ring hashed to the same port: find one with a one-port range.
        let narrow = NodePeers::new(
            peers.service.clone(),
            peers.address,
            PortRange::parse("7070").unwrap(),
            peers.secret_file.clone(),
        );
        let before = PORT_CONFLICTS.load(Ordering::Relaxed);
        assert_eq!(
            narrow.assign(&a, Path::new("/t/a"), &|_| true),
            Role::Member { port: 7070 }
        );
        let b = settings(&[("bucket", "openimages")]);
        let role = narrow.assign(&b, Path::new("/t/b"), &|_| true);
        assert_eq!(
            role,
            Role::Asker {
                port: 7070,
                taken: Taken::OtherRing("/t/a".into())
            }
        );
        assert!(PORT_CONFLICTS.load(Ordering::Relaxed) > before);
        // An asker gets --peers and the secret file, no --peer-listen.
        let flags = strings(narrow.role_flags(&role));
        assert_eq!(flags.len(), 2, "{flags:?}");
        assert!(flags[0].starts_with("--peers=dns:"));
        assert!(flags.iter().all(|f| !f.starts_with("--peer-listen")));
        // The holder unmounts: the port is free for the next mount of the other ring.
        narrow.release(Path::new("/t/a"));
        assert_eq!(
            narrow.assign(&b, Path::new("/t/b"), &|_| true),
            Role::Member { port: 7070 }
        );
        // Releasing an asker frees nothing it did not hold.
        narrow.release(Path::new("/t/a"));
        assert_eq!(
            narrow.assign(&a, Path::new("/t/a"), &|_| true),
            Role::Asker {
                port: 7070,
                taken: Taken::OtherRing("/t/b".into())
            }
        );
        // Another program holds the port.
        let other = node(&dir, Some(SECRET));
        assert_eq!(
            other.assign(&a, Path::new("/t/a"), &|_| false),
            Role::Asker {
                port,
                taken: Taken::OtherProgram
            }
        );
    }

    #[test]
    fn a_real_listener_makes_the_port_taken() {
        let dir = tempfile::tempdir().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let peers = NodePeers::new(
            "svc".into(),
            "127.0.0.1".parse().unwrap(),
            PortRange {
                first: port,
                last: port,
            },
            {
                let f = dir.path().join("s");
                std::fs::write(&f, SECRET).unwrap();
                f
            },
        );
        let s = settings(&[("bucket", "imagenet")]);
        let flags = strings(peers.flags(&s, Path::new("/t/a")));
        assert_eq!(
            flags,
            vec![
                format!("--peers=dns:svc:{port}"),
                format!("--peer-secret-file={}", dir.path().join("s").display())
            ]
        );
        drop(listener);
        let flags = strings(peers.flags(&s, Path::new("/t/a")));
        assert_eq!(flags[0], format!("--peer-listen=127.0.0.1:{port}"));
    }

    #[test]
    fn options_need_an_address() {
        use clap::Parser;
        #[derive(Debug, Parser)]
        struct Cli {
            #[command(flatten)]
            peers: PeerOptions,
        }
        let none = Cli::try_parse_from(["x"]).unwrap();
        assert!(none.peers.setup().is_none());
        assert_eq!(
            none.peers.peer_ports,
            PortRange::parse(DEFAULT_PORTS).unwrap()
        );
        let no_address = Cli::try_parse_from(["x", "--peer-service=svc"]).unwrap();
        assert!(no_address.peers.setup().is_none());
        let full = Cli::try_parse_from([
            "x",
            "--peer-service=svc",
            "--peer-address=10.0.0.1",
            "--peer-ports=7100-7199",
        ])
        .unwrap();
        let setup = full.peers.setup().expect("set up");
        assert_eq!(setup.ports, PortRange::parse("7100-7199").unwrap());
        assert!(Cli::try_parse_from(["x", "--peer-ports=9-1"]).is_err());
    }
}
