//! Command-line arguments (clap) and their validation.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use super::size::{parse_bytes, parse_free_space, parse_size, SizeSpec};
use super::source::Source;
use crate::cache::EvictionKind;
use crate::fs::MAX_IDLE_BACKINGS;
use crate::namespace::MetadataTtl;

#[derive(Debug, Parser)]
#[command(
    name = "riffle",
    version,
    about = "Mount an S3 or Ceph bucket as a fast, read-only POSIX tree for training jobs"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Mount s3://BUCKET[/PREFIX/] read-only at MOUNTPOINT (returns once the mount is live)
    Mount(Box<MountArgs>),
    /// Unmount a riffle mount (the daemon then exits)
    Unmount(UnmountArgs),
    /// Show a mount's counters: requests, bytes, hits, misses, read-ahead, in-flight work
    Stats(StatsArgs),
    /// Set or clear the epoch plan of a mount (the order in which files will be read)
    Plan(PlanArgs),
    /// Fetch whole directories or files of a mount into its cache, with a progress bar
    Warm(WarmArgs),
    /// Inspect or clear a cache directory
    #[command(subcommand)]
    Cache(CacheCommand),
    /// Keep copies of mounts' FUSE connections for their keepers (`mount --fd-store`), so a
    /// mount outlives its keeper and daemon together (a container restart)
    FdStore(FdStoreArgs),
}

#[derive(Debug, Clone, Args)]
pub struct FdStoreArgs {
    /// The unix socket to serve (created mode 0600; only the same user may connect)
    #[arg(long, value_name = "PATH")]
    pub socket: PathBuf,
}

#[derive(Debug, Clone, Args)]
pub struct PlanArgs {
    /// The mountpoint
    pub mountpoint: PathBuf,
    /// A text file of paths relative to the mount root, one per line, in reading order
    #[arg(required_unless_present = "clear", conflicts_with = "clear")]
    pub file: Option<PathBuf>,
    /// Remove the current plan
    #[arg(long)]
    pub clear: bool,
}

#[derive(Debug, Clone, Args)]
pub struct WarmArgs {
    /// The mountpoint
    pub mountpoint: PathBuf,
    /// Directories or files to warm, absolute or relative to the mountpoint (default: all)
    pub paths: Vec<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum CacheCommand {
    /// Objects, blocks and bytes in a cache directory (safe while mounts use it)
    Stats {
        #[arg(long, value_name = "DIR")]
        cache_dir: PathBuf,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Delete everything in a cache directory (refused while a mount uses it)
    Clear {
        #[arg(long, value_name = "DIR")]
        cache_dir: PathBuf,
    },
}

#[derive(Debug, Clone, Args)]
pub struct StatsArgs {
    /// The mountpoint
    pub mountpoint: PathBuf,

    /// Print the raw JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Args)]
pub struct MountArgs {
    /// What to mount: s3://BUCKET or s3://BUCKET/PREFIX/
    #[arg(value_name = "s3://BUCKET[/PREFIX/]")]
    pub source: Source,

    /// An existing, empty directory
    pub mountpoint: PathBuf,

    /// S3 endpoint for S3-compatible stores (Ceph RGW, MinIO, Garage), e.g. http://rgw:7480
    #[arg(long, value_name = "URL", value_parser = parse_endpoint)]
    pub endpoint_url: Option<String>,

    /// Region (default: from the AWS configuration, else us-east-1)
    #[arg(long, value_name = "REGION")]
    pub region: Option<String>,

    /// Use path-style addressing (http://endpoint/bucket/key), needed by most S3-compatible stores
    #[arg(long)]
    pub force_path_style: bool,

    /// AWS shared-config profile to take credentials from
    #[arg(long, value_name = "NAME", conflicts_with = "no_sign_request")]
    pub profile: Option<String>,

    /// Do not sign requests (public buckets)
    #[arg(long)]
    pub no_sign_request: bool,

    /// Let users other than the one mounting access the files (needs user_allow_other in /etc/fuse.conf for non-root)
    #[arg(long)]
    pub allow_other: bool,

    /// Owner of all files (default: the user mounting)
    #[arg(long, value_name = "UID")]
    pub uid: Option<u32>,

    /// Group of all files (default: the group of the user mounting)
    #[arg(long, value_name = "GID")]
    pub gid: Option<u32>,

    /// Permission bits of files (octal)
    #[arg(long, value_name = "MODE", default_value = "0444", value_parser = parse_mode)]
    pub file_mode: u16,

    /// Permission bits of directories (octal)
    #[arg(long, value_name = "MODE", default_value = "0555", value_parser = parse_mode)]
    pub dir_mode: u16,

    /// How long listings and attributes are trusted: seconds, or 'indefinite' for immutable datasets
    #[arg(long, value_name = "SECONDS|indefinite", default_value = "60")]
    pub metadata_ttl: MetadataTtl,

    /// Directory listings run in the background at once when a directory is read (its
    /// subdirectories are listed ahead of a walk); 0 lists only what is asked for
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u32).range(0..=256))]
    pub list_concurrency: u32,

    /// Concurrent GET requests at most, for the whole mount
    #[arg(long, value_name = "N", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub max_inflight: u32,

    /// Memory for data buffers at most (in-flight GETs and the in-memory block cache), e.g. 512M, 2G
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = parse_memory)]
    pub max_memory: u64,

    /// Keep every byte read in a persistent block cache in this directory (on NVMe), shared
    /// with other mounts and kept across restarts
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,

    /// Most bytes the cache may hold: a size (500G) or a share of its filesystem (90%);
    /// --cache-min-free of the filesystem is always left free
    #[arg(long, value_name = "SIZE|N%", default_value = "90%", value_parser = parse_size, requires = "cache_dir")]
    pub cache_size: SizeSpec,

    /// Free space always left on the cache's filesystem: a size (20G, 0) or a share of it
    /// (15%: above kubelet's default hard eviction threshold, nodefs.available<10%, so a cache
    /// on a node's root disk never gets its pods evicted); below it the cache evicts, then
    /// stops caching (reads still work)
    #[arg(long, value_name = "SIZE|N%", default_value = "15%", value_parser = parse_free_space, requires = "cache_dir")]
    pub cache_min_free: SizeSpec,

    /// How the cache chooses what to evict: `plan` (the epoch plan's furthest-next-use first,
    /// `epoch` order for the rest), `epoch` (what was read this epoch goes first: beats LRU on
    /// shuffled epochs), or `lru`
    #[arg(long, value_name = "POLICY", default_value = "plan", value_parser = parse_eviction, requires = "cache_dir")]
    pub eviction: EvictionKind,

    /// Never hand cached files to the kernel (FUSE passthrough); every read goes through the daemon
    #[arg(long)]
    pub no_passthrough: bool,

    /// With passthrough, a lookup of a file of at most this size whose bytes are all in the
    /// cache starts reading its cache file from disk, so the read that follows the open finds
    /// it on its way (small-file epochs); 0 turns it off
    #[arg(long, value_name = "SIZE", default_value = "1M", value_parser = parse_lookup_readahead)]
    pub lookup_readahead: u64,

    /// With passthrough, cached files kept registered with the kernel after their last close,
    /// so their next open is answered from memory (least recently opened dropped first); each
    /// pins 3-4 KiB of kernel memory (the cache file's open file, inode and dentry). auto: as
    /// many as a sixteenth of the memory limit holds (the memory cgroup's, else the machine's);
    /// 0 keeps none
    #[arg(long, value_name = "N|auto", default_value = "auto", value_parser = parse_idle_backings)]
    pub max_idle_backings: IdleBackings,

    /// Unit of fetching and caching (a power of two, 64K to 16M); a cache directory keeps the
    /// block size it was created with
    #[arg(long, value_name = "SIZE", default_value = "1M", value_parser = parse_block_size)]
    pub block_size: u64,

    /// An epoch plan: paths relative to the mount root, one per line, in the order they will
    /// be read; riffle fetches ahead of the reader in that order (replace it later with
    /// `riffle plan`)
    #[arg(long, value_name = "FILE")]
    pub prefetch_plan: Option<PathBuf>,

    /// Fetch the whole mount into the cache in the background after mounting (lowest
    /// priority), as `riffle warm MOUNT` does
    #[arg(long, visible_alias = "preload")]
    pub warm: bool,

    /// With no plan, recognise a shuffled epoch over a directory tree and fetch its files
    /// that have not been opened yet in the background (bounded by what the reader has
    /// opened, and by the cache); `off` fetches only what is read
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = parse_on_off,
          action = clap::ArgAction::Set)]
    pub epoch_prefetch: bool,

    /// Serve Prometheus metrics (OpenMetrics) at http://HOST:PORT/metrics
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_addr: Option<std::net::SocketAddr>,

    /// A label written on every metric sample (repeatable), at --metrics-addr and in the
    /// control socket's `metrics`: KEY is a Prometheus label name, VALUE any text (the CSI
    /// mounter labels each volume's daemon with its volume, pod and key)
    #[arg(long, value_name = "KEY=VALUE", value_parser = parse_metrics_label)]
    pub metrics_label: Vec<crate::metrics::MetricLabel>,

    /// Serve this node's cached blocks to its peers on HOST:PORT (authenticated with
    /// --peer-secret-file; listen on the cluster network only)
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_peer_listen)]
    pub peer_listen: Option<std::net::SocketAddr>,

    /// The nodes that serve each other's cache: HOST:PORT,HOST:PORT,... (the same list on
    /// every node; it may include this node's own --peer-listen address), or dns:NAME:PORT
    /// (every address of NAME, re-resolved every 30 s: a Kubernetes headless Service)
    #[arg(long, value_name = "HOST:PORT,...|dns:NAME:PORT", value_parser = parse_peers)]
    pub peers: Option<crate::fetch::peer::Membership>,

    /// A file holding the secret every peer shares (at least 16 bytes; surrounding whitespace
    /// is ignored); requests between peers are signed with it (HMAC-SHA256)
    #[arg(long, value_name = "FILE")]
    pub peer_secret_file: Option<PathBuf>,

    /// How long to wait for a peer's answer before asking the next one, then the store
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_peer_timeout)]
    pub peer_timeout: std::time::Duration,

    /// Stay attached to the terminal instead of running as a background daemon
    #[arg(long)]
    pub foreground: bool,

    /// Log level
    #[arg(long, value_name = "LEVEL", default_value = "info",
          value_parser = ["error", "warn", "info", "debug", "trace"])]
    pub log_level: String,

    /// Log file (default: stderr with --foreground, else /var/log/riffle/ for root or ~/.local/state/riffle/)
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,

    /// Rotate the log file when it passes this size (FILE.1, FILE.2, ...)
    #[arg(long, value_name = "SIZE", default_value = "16M", value_parser = parse_log_max_size)]
    pub log_max_size: u64,

    /// Rotated log files to keep besides the current one (older ones are deleted)
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub log_keep: u16,

    /// Write the daemon's process id to this file
    #[arg(long, value_name = "FILE")]
    pub pid_file: Option<PathBuf>,

    /// Threads reading FUSE requests, each on a /dev/fuse descriptor of its own (at most 64)
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=crate::fs::handover::protocol::MAX_DEVICES as i64))]
    pub fuse_threads: u32,

    /// How FUSE requests reach the daemon: auto (io_uring where the kernel offers it and no
    /// keeper holds the connection), io-uring (the kernel's FUSE io_uring rings, Linux 6.14+;
    /// fail if they cannot be had) or dev-fuse
    #[arg(long, value_name = "TRANSPORT", value_enum, default_value_t = FuseTransport::Auto)]
    pub fuse_transport: FuseTransport,

    /// Internal: the pipe on which a daemon reports readiness to `riffle mount`
    #[arg(long, hide = true, env = "RIFFLE_READY_FD")]
    pub ready_fd: Option<i32>,

    /// Keep the mount across crashes of the daemon (SIGKILL, OOM kill, panic): a small keeper
    /// process holds the FUSE connection and starts a successor daemon that takes it over,
    /// so readers wait instead of failing (needs Linux 6.9+ for requests in flight)
    #[arg(long)]
    pub restart: bool,

    /// With --restart: also give a copy of the FUSE connection to this fd store (`riffle
    /// fd-store`), so the mount outlives the keeper too; a keeper started for a mount the store
    /// holds takes it over instead of mounting. `systemd`: systemd's store, for a mount run as
    /// a service (FileDescriptorStoreMax=)
    #[arg(long, value_name = "SOCKET", requires = "restart")]
    pub fd_store: Option<PathBuf>,

    /// With --fd-store: only take over the live mount the fd store holds for this mountpoint
    /// (its keeper and daemon died together, e.g. with their container); fail, mounting
    /// nothing, when the store holds none
    #[arg(long, requires = "fd_store")]
    pub take_over: bool,

    /// Internal: the daemon's socket to its keeper (`--restart`)
    #[arg(long, hide = true, env = "RIFFLE_KEEPER_FD")]
    pub keeper_fd: Option<i32>,

    /// Internal: run as the new keeper of the daemon at the other end of this socket (its
    /// keeper died)
    #[arg(long, hide = true, env = "RIFFLE_ADOPT_FD")]
    pub adopt_fd: Option<i32>,

    /// Internal: take the mount over from the keeper instead of mounting
    #[arg(long, hide = true, env = "RIFFLE_RESUME")]
    pub resume: bool,
}

#[derive(Debug, Clone, Args)]
pub struct UnmountArgs {
    /// The mountpoint
    pub mountpoint: PathBuf,

    /// Detach even if busy or dead (lazy unmount)
    #[arg(long)]
    pub lazy: bool,
}

pub(crate) fn parse_mode(s: &str) -> Result<u16, String> {
    let digits = s.trim_start_matches("0o");
    u16::from_str_radix(digits, 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| format!("'{s}' is not an octal file mode like 0444"))
}

fn parse_on_off(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" | "1" => Ok(true),
        "off" | "false" | "no" | "0" => Ok(false),
        _ => Err(format!("'{s}' is not on or off")),
    }
}

/// `--fuse-transport` (`fs::transport`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FuseTransport {
    Auto,
    IoUring,
    DevFuse,
}

fn parse_eviction(s: &str) -> Result<EvictionKind, String> {
    s.parse::<EvictionKind>()
        .map_err(|_| format!("'{s}' is not an eviction policy (plan, epoch or lru)"))
}

fn parse_block_size(s: &str) -> Result<u64, String> {
    let bytes = parse_bytes(s)?;
    if !bytes.is_power_of_two() || !(64 << 10..=16 << 20).contains(&bytes) {
        return Err(format!("'{s}' must be a power of two from 64K to 16M"));
    }
    Ok(bytes)
}

fn parse_memory(s: &str) -> Result<u64, String> {
    let bytes = parse_bytes(s)?;
    if bytes < 32 << 20 {
        return Err(format!("'{s}' is too small: at least 32M is needed"));
    }
    Ok(bytes)
}

/// `--max-idle-backings`: a number, or `auto` (from the memory limit, when mounting).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleBackings {
    Auto,
    AtMost(u32),
}

fn parse_idle_backings(s: &str) -> Result<IdleBackings, String> {
    if s == "auto" {
        return Ok(IdleBackings::Auto);
    }
    match s.parse::<u32>() {
        Ok(n) if n <= MAX_IDLE_BACKINGS => Ok(IdleBackings::AtMost(n)),
        _ => Err(format!(
            "'{s}' is not auto or a number from 0 to {MAX_IDLE_BACKINGS}"
        )),
    }
}

fn parse_lookup_readahead(s: &str) -> Result<u64, String> {
    let bytes = parse_bytes(s)?;
    if bytes > 64 << 20 {
        return Err(format!(
            "'{s}' is too large: at most 64M (larger files have the kernel's own readahead)"
        ));
    }
    Ok(bytes)
}

fn parse_log_max_size(s: &str) -> Result<u64, String> {
    let bytes = parse_bytes(s)?;
    if bytes < 64 << 10 {
        return Err(format!("'{s}' is too small: at least 64K"));
    }
    Ok(bytes)
}

impl MountArgs {
    /// `--fuse-transport io-uring` asks for what a keeper's connection cannot have.
    pub fn check_transport(&self) -> Result<(), String> {
        if self.fuse_transport == FuseTransport::IoUring && self.restart {
            return Err("--fuse-transport io-uring cannot be used with --restart: the kernel \
                        cannot hand a dead daemon's io_uring requests to its successor \
                        (FUSE_NOTIFY_RESEND requeues /dev/fuse requests only); use auto or dev-fuse"
                .into());
        }
        Ok(())
    }

    /// The peer options that only make sense together (clap's own message for a missing
    /// companion names no option once cut to one line, so these are checked here).
    pub fn check_peer_options(&self) -> Result<(), String> {
        match (&self.peers, &self.peer_secret_file, &self.peer_listen) {
            (Some(_), None, _) => {
                Err("--peers needs --peer-secret-file FILE (the secret every peer shares)".into())
            }
            (None, Some(_), _) => Err("--peer-secret-file is only used with --peers".into()),
            (None, None, Some(_)) => Err(
                "--peer-listen needs --peers (the nodes it serves) and --peer-secret-file".into(),
            ),
            _ => Ok(()),
        }
    }

    /// The `--metrics-label`s name each label once (a label set has unique names).
    pub fn check_metrics_labels(&self) -> Result<(), String> {
        let mut names = std::collections::HashSet::new();
        match self
            .metrics_label
            .iter()
            .find(|l| !names.insert(l.name.as_str()))
        {
            Some(l) => Err(format!("--metrics-label {} is given twice", l.name)),
            None => Ok(()),
        }
    }
}

fn parse_metrics_label(s: &str) -> Result<crate::metrics::MetricLabel, String> {
    s.parse()
        .map_err(|e: crate::metrics::labels::LabelError| e.to_string())
}

fn parse_peer_listen(s: &str) -> Result<std::net::SocketAddr, String> {
    s.parse::<std::net::SocketAddr>()
        .map_err(|_| format!("'{s}' is not IP:PORT (e.g. 10.0.0.5:7070, or 0.0.0.0:7070)"))
}

fn parse_peers(s: &str) -> Result<crate::fetch::peer::Membership, String> {
    crate::fetch::peer::Membership::parse(s)
}

fn parse_peer_timeout(s: &str) -> Result<std::time::Duration, String> {
    let d = humantime::parse_duration(s)
        .map_err(|_| format!("'{s}' is not a duration like 2s or 500ms"))?;
    if d < std::time::Duration::from_millis(10) || d > std::time::Duration::from_secs(600) {
        return Err(format!("'{s}' must be from 10ms to 10m"));
    }
    Ok(d)
}

pub(crate) fn parse_endpoint(s: &str) -> Result<String, String> {
    let url = url::Url::parse(s).map_err(|e| format!("'{s}' is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(format!(
            "'{s}' must be an http:// or https:// URL with a host"
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(
            "the endpoint URL must not contain credentials; use the AWS environment or --profile"
                .into(),
        );
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!("'{s}' must not have a query or fragment"));
    }
    Ok(s.trim_end_matches('/').to_string())
}

/// clap's first line of `e`, without its "error: " prefix.
pub(crate) fn clap_one_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    text.lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("invalid arguments")
        .trim_start_matches("error: ")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_option_values() {
        assert_eq!(parse_mode("0444"), Ok(0o444));
        assert_eq!(parse_mode("755"), Ok(0o755));
        assert!(parse_mode("0999").is_err());
        assert!(parse_mode("rw").is_err());
        assert!(parse_memory("1M").is_err());
        assert_eq!(parse_memory("64M"), Ok(64 << 20));
        assert_eq!(parse_lookup_readahead("0"), Ok(0));
        assert_eq!(parse_lookup_readahead("1M"), Ok(1 << 20));
        assert!(parse_lookup_readahead("100M").is_err());
        assert!(parse_lookup_readahead("10%").is_err());
        assert_eq!(parse_log_max_size("16M"), Ok(16 << 20));
        assert!(parse_log_max_size("1K").is_err());
        assert!(parse_log_max_size("5%").is_err());
        assert!(parse_endpoint("localhost:7480").is_err());
        assert!(parse_endpoint("ftp://x").is_err());
        assert!(parse_endpoint("http://u:p@host").is_err());
        assert!(parse_endpoint("http://host/?x=1").is_err());
        assert!(parse_endpoint("http://host/#f").is_err());
        assert_eq!(
            parse_endpoint("http://127.0.0.1:7480/").unwrap(),
            "http://127.0.0.1:7480"
        );
    }

    /// `riffle mount s3://bkt /m` with `extra`, parsed.
    fn parse_mount(extra: &[&str]) -> Result<Box<MountArgs>, String> {
        let mut argv = vec!["riffle", "mount", "s3://bkt", "/m"];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv).map(|c| c.command) {
            Ok(Command::Mount(m)) => Ok(m),
            Ok(_) => panic!("not a mount"),
            Err(e) => Err(e.to_string()),
        }
    }

    #[test]
    fn metrics_labels_are_checked() {
        let parse = parse_mount;
        let m = parse(&["--metrics-label", "volume=v1", "--metrics-label=pod=ml/p"]).unwrap();
        let pairs: Vec<_> = m
            .metrics_label
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect();
        assert_eq!(pairs, [("volume", "v1"), ("pod", "ml/p")]);
        assert_eq!(m.check_metrics_labels(), Ok(()));
        assert!(parse(&["--metrics-label", "a-b=1"]).is_err());
        assert!(parse(&["--metrics-label", "op=read"]).is_err());
        let twice = parse(&["--metrics-label", "k=1", "--metrics-label", "k=2"]).unwrap();
        assert!(twice.check_metrics_labels().unwrap_err().contains("twice"));
    }

    #[test]
    fn peer_options_are_checked() {
        use crate::fetch::peer::Membership;
        let parse = parse_mount;
        let m = parse(&[
            "--peer-listen",
            "127.0.0.1:7001",
            "--peers",
            "127.0.0.1:7001, node-b:7001,[::1]:7001",
            "--peer-secret-file",
            "/s",
            "--peer-timeout",
            "500ms",
        ])
        .unwrap();
        assert_eq!(
            m.peers,
            Some(Membership::Static(vec![
                "127.0.0.1:7001".into(),
                "node-b:7001".into(),
                "[::1]:7001".into()
            ]))
        );
        assert_eq!(m.peer_timeout, std::time::Duration::from_millis(500));
        assert_eq!(
            parse(&[
                "--peers",
                "dns:riffle-peers.ns.svc:7070",
                "--peer-secret-file",
                "/s"
            ])
            .unwrap()
            .peers,
            Some(Membership::Dns {
                name: "riffle-peers.ns.svc".into(),
                port: 7070
            })
        );
        // --peers without a secret, a secret or listen address without --peers.
        let check = |extra: &[&str]| parse(extra).unwrap().check_peer_options();
        assert!(check(&["--peers", "a:1"])
            .unwrap_err()
            .contains("--peer-secret-file"));
        assert!(check(&["--peer-secret-file", "/s"])
            .unwrap_err()
            .contains("--peers"));
        assert!(check(&["--peer-listen", "127.0.0.1:1"])
            .unwrap_err()
            .contains("--peers"));
        assert_eq!(
            check(&["--peers", "a:1", "--peer-secret-file", "/s"]),
            Ok(())
        );
        assert_eq!(check(&[]), Ok(()));
        // Bad addresses and timeouts.
        for bad in ["a", "a:0", "a:x", "a:1,b", "", "dns:name"] {
            let e = parse(&["--peers", bad, "--peer-secret-file", "/s"]).unwrap_err();
            assert!(e.contains("--peers"), "{bad}: {e}");
        }
        assert!(parse(&[
            "--peer-listen",
            "host:1",
            "--peers",
            "a:1",
            "--peer-secret-file",
            "/s"
        ])
        .is_err());
        assert!(parse(&[
            "--peers",
            "a:1",
            "--peer-secret-file",
            "/s",
            "--peer-timeout",
            "1ms"
        ])
        .is_err());
    }

    #[test]
    fn parses_a_full_mount_command() {
        let cli = Cli::try_parse_from([
            "riffle",
            "mount",
            "s3://bucket/ds",
            "/mnt/x",
            "--endpoint-url",
            "http://h:1",
            "--force-path-style",
            "--metadata-ttl",
            "indefinite",
            "--max-inflight",
            "8",
        ])
        .unwrap();
        let Command::Mount(m) = cli.command else {
            panic!()
        };
        assert_eq!(m.source.prefix, "ds/");
        assert_eq!(m.metadata_ttl, MetadataTtl::Indefinite);
        assert!(
            Cli::try_parse_from(["riffle", "mount", "s3://b", "/m", "--metadata-ttl", "soon"])
                .is_err()
        );
        assert!(
            Cli::try_parse_from(["riffle", "mount", "s3://bkt", "/m", "--max-inflight", "0"])
                .is_err()
        );
        let mount_with = |extra: &[&str]| {
            let mut argv = vec!["riffle", "mount", "s3://bkt", "/m"];
            argv.extend_from_slice(extra);
            match Cli::try_parse_from(argv).map(|c| c.command) {
                Ok(Command::Mount(m)) => Ok(m),
                Ok(_) => panic!("not a mount"),
                Err(e) => Err(e.kind()),
            }
        };
        let idle_backings = |extra: &[&str]| mount_with(extra).map(|m| m.max_idle_backings);
        assert_eq!(idle_backings(&[]), Ok(IdleBackings::Auto));
        assert_eq!(
            idle_backings(&["--max-idle-backings", "auto"]),
            Ok(IdleBackings::Auto)
        );
        assert_eq!(
            idle_backings(&["--max-idle-backings", "0"]),
            Ok(IdleBackings::AtMost(0))
        );
        assert_eq!(
            idle_backings(&["--max-idle-backings", "16777216"]),
            Ok(IdleBackings::AtMost(16_777_216))
        );
        assert!(idle_backings(&["--max-idle-backings", "Auto"]).is_err());
        assert!(idle_backings(&["--max-idle-backings", "16777217"]).is_err());
        assert!(idle_backings(&["--max-idle-backings", "-1"]).is_err());
        let epoch_prefetch = |extra: &[&str]| mount_with(extra).map(|m| m.epoch_prefetch);
        assert_eq!(epoch_prefetch(&[]), Ok(true));
        assert_eq!(epoch_prefetch(&["--epoch-prefetch", "off"]), Ok(false));
        assert_eq!(epoch_prefetch(&["--epoch-prefetch=on"]), Ok(true));
        assert!(epoch_prefetch(&["--epoch-prefetch", "sometimes"]).is_err());
        assert!(Cli::try_parse_from([
            "riffle",
            "mount",
            "s3://bkt",
            "/m",
            "--profile",
            "p",
            "--no-sign-request"
        ])
        .is_err());
    }
}
