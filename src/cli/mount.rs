//! `riffle mount`: check, connect, mount, serve.
//!
//! Order matters for failing fast with a useful reason: options are validated by clap; then
//! the mountpoint is checked (exists, is a directory, is empty, is not mounted already, is not a
//! dead FUSE mount); then one LIST of the prefix proves the endpoint answers, the bucket exists
//! and the credentials work (bounded by a timeout); only then is the filesystem mounted.

use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use fuser::{MountOption, SessionACL};

use super::adoption::{self, Adoptable};
use super::args::{FuseTransport, IdleBackings, MountArgs};
use super::daemon::{self, Readiness};
use super::fd_limit::{self, Budget};
use super::keeper;
use super::memory_limit;
use super::size::SizeSpec;
use super::unmount::{mount_state, MountState};
use super::{fail, logging, one_line, FailureKind};
use crate::cache::{
    make_policy, reserve_for_kept_buffers, CacheConfig, DiskCache, EvictionKind, SizeLimit,
    DEFAULT_MAX_OPEN_OBJECTS,
};
use crate::control;
use crate::control::MountControl;
use crate::fetch::peer::{self, server::PeerServer};
use crate::fetch::{idle_connections, idle_connections_memory, DiskTier, FetchConfig, Fetcher};
use crate::fs::handover::serving::ServingLock;
use crate::fs::handover::{protocol, request_resend, Handover, InitParams, Resumed};
use crate::fs::latency::FuseOps;
use crate::fs::transport;
use crate::fs::{FsConfig, FsStatus, RiffleFs};
use crate::metrics::{serve_metrics, MountMetrics};
use crate::namespace::background::FanoutConfig;
use crate::namespace::saved::SavedListings;
use crate::namespace::{MetadataTtl, Namespace, NamespaceOptions, NodeLog};
use crate::prefetch::plan::Plan;
use crate::prefetch::{Oracle, PrefetchConfig, Prefetcher};
use crate::reader::ReadAheadConfig;
use crate::store::retry::{RetryPolicy, RetryingStore};
use crate::store::s3::{S3Config, S3Store};
use crate::store::{ListRequest, ObjectStore, StoreError};

/// The kernel's read-ahead for the mount's files: asked for at `INIT` and set as the mount's
/// backing-device window (`fs::bdi`), so reads served by the daemon come in 1 MiB requests.
const KERNEL_READ_AHEAD: u32 = 1 << 20;

/// The memory `--max-idle-backings auto` assumes when `/proc/meminfo` cannot be read.
const AUTO_FALLBACK_MEMORY: u64 = 4 << 30;

/// How long the start-up LIST may take in all (retries included).
const PROBE_TIMEOUT: Duration = Duration::from_secs(15);

pub fn run(args: MountArgs) -> anyhow::Result<()> {
    // Peer options that cannot be used are said at once, before any daemon starts.
    args.check_peer_options()
        .map_err(|e| fail(FailureKind::InvalidArgument, e))?;
    args.check_metrics_labels()
        .map_err(|e| fail(FailureKind::InvalidArgument, e))?;
    args.check_transport()
        .map_err(|e| fail(FailureKind::InvalidArgument, e))?;
    if args.fuse_transport == FuseTransport::IoUring {
        transport::kernel_offers_ring()
            .map_err(|e| precondition(format!("--fuse-transport io-uring: {e}")))?;
    }
    if let Some(path) = &args.peer_secret_file {
        peer::Secret::from_file(path)?;
    }
    if !args.foreground {
        let abs = std::path::absolute(&args.mountpoint).unwrap_or(args.mountpoint.clone());
        let (log, given) = match &args.log_file {
            Some(f) => (f.clone(), true),
            None => (daemon::default_log_file(&abs), false),
        };
        return daemon::spawn_and_wait(&log, !given);
    }
    if args.restart && args.keeper_fd.is_none() {
        return keeper::run(&args);
    }
    let mut readiness = Readiness::from_fd(args.ready_fd);
    let result = serve(&args, &mut readiness);
    if let Err(e) = &result {
        let line = one_line(e);
        tracing::error!("{line}");
        if let (true, Some(log)) = (args.resume, &args.log_file) {
            // A successor's log file may not be open yet (`logging::init_deferred`).
            logging::append_line(log, "ERROR", &line);
        }
        readiness.failed_with(e);
    }
    result
}

/// The daemon: checks, builds the stack, mounts (or takes a live mount over from its
/// keeper), serves until unmounted, then shuts down.
fn serve(args: &MountArgs, readiness: &mut Readiness) -> anyhow::Result<()> {
    let log_config = logging::LogConfig {
        level: &args.log_level,
        file: args.log_file.as_deref(),
        max_size: args.log_max_size,
        keep: usize::from(args.log_keep),
    };
    // A successor must not touch the mount before it serves it (see `init_deferred`).
    let log_opener = if args.resume {
        Some(logging::init_deferred(&log_config)?)
    } else {
        logging::init(&log_config)?;
        None
    };
    if args.block_size * 4 > args.max_memory {
        bail!(
            "--max-memory must be at least 4 blocks (--block-size {} needs --max-memory {}M or more)",
            args.block_size,
            (args.block_size * 4) >> 20
        );
    }
    let keeper = args.keeper_fd.filter(|fd| *fd > 2).map(|fd| {
        // SAFETY: the keeper handed this descriptor down for exactly this use; used once.
        unsafe { OwnedFd::from_raw_fd(fd) }
    });
    let takeover = match (&keeper, args.resume) {
        (Some(keeper), true) => Some(take_over(keeper)?),
        (None, true) => bail!("--resume needs a keeper (riffle mount --restart starts one)"),
        (_, false) => None,
    };
    let mountpoint = match &takeover {
        // The mount is there and alive: it is the one taken over. Nothing may touch it until
        // this process serves it (a stat of the mountpoint would wait for this very daemon),
        // so the path is made absolute without asking the file system.
        Some(_) => std::path::absolute(&args.mountpoint)
            .with_context(|| format!("cannot resolve {}", args.mountpoint.display()))?,
        None => check_mountpoint(&args.mountpoint)?,
    };
    let handover = match (&keeper, &takeover) {
        (Some(_), None) => Some(Handover::create().context("cannot set up the handover state")?),
        _ => None,
    };
    // What a new keeper would need of this daemon's state if its keeper dies (`adoption`).
    let state_fds = match (&handover, &takeover) {
        (Some(h), _) => Some(state_copies(&h.nodes, &h.handles)?),
        (_, Some(t)) => Some(state_copies(&t.nodes, &t.handles)?),
        _ => None,
    };
    // The first daemon of a kept connection locks it before mounting: no request is read by
    // anyone before (`fs::handover::serving`). A successor locks it below, before serving.
    let mut serving = match &handover {
        Some(h) => Some(
            ServingLock::acquire(h.handles.region().fd(), Duration::ZERO)
                .context("cannot lock the new FUSE connection")?,
        ),
        None => None,
    };
    let node_log: Option<Arc<dyn NodeLog>> = match (&handover, &takeover) {
        (Some(h), _) => Some(h.nodes.clone()),
        (_, Some(t)) => Some(t.nodes.clone()),
        _ => None,
    };
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores.clamp(2, 8))
        .thread_name("riffle-io")
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let mut stack = build(args, &runtime, node_log)?;
    let session = match takeover {
        Some(takeover) => {
            // Built while the predecessor may still be stopping; served only once it has.
            serving = Some(
                ServingLock::acquire(takeover.handles.region().fd(), PREDECESSOR_WAIT)
                    .context("cannot take the mount over")?,
            );
            adopt(args, &mut stack, takeover)?
        }
        None => mount(
            args,
            &mountpoint,
            &mut stack,
            keeper.as_ref(),
            handover.as_ref(),
        )?,
    };
    if let (Some(keeper), Some(state), true) = (keeper, state_fds, session.kept) {
        match device_copies(&session) {
            Ok((fuse, clones)) => {
                let [nodes, handles] = state;
                let bundle = protocol::bundle(fuse, nodes, handles, clones);
                adoption::watch(Adoptable {
                    keeper,
                    bundle,
                    with_store: args.fd_store.is_some(),
                });
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot copy /dev/fuse; if the keeper dies, this daemon runs without one")
            }
        }
    }
    let _serving = serving;
    serve_until_unmounted(
        args,
        &mountpoint,
        stack,
        session,
        runtime,
        readiness,
        log_opener,
    )
}

/// What a mount serves with, built before it mounts.
struct Stack {
    ns: Arc<Namespace>,
    prefetch: Arc<Prefetcher>,
    metrics: Arc<MountMetrics>,
    fuse_ops: Arc<FuseOps>,
    fs_status: Arc<FsStatus>,
    /// Whether the session asks for FUSE over io_uring (`ring_choice`, decided once).
    io_uring: bool,
    fs: Option<RiffleFs>,
    fuse_device: crate::fs::FuseDevice,
    /// `.riffle-stats`, given the control handler as its source once that exists.
    stats_file: Arc<crate::fs::stats_file::StatsFile>,
    flush_on_exit: Option<Arc<DiskTier>>,
    /// The peer port (`--peer-listen`), served as long as the mount.
    _peer_server: Option<PeerServer>,
}

/// The session and how to end it.
struct Mounted {
    session: fuser::Session<RiffleFs>,
    /// Clones of the session's `/dev/fuse` descriptor, one per FUSE thread after the first
    /// (made by this daemon, or its predecessor's taken over); with a keeper, it holds them too.
    clones: Vec<OwnedFd>,
    /// A taken-over session has no mount handle of its own: it unmounts by path.
    taken_over: bool,
    /// Whether a keeper holds a copy of the connection.
    kept: bool,
}

/// How long a successor waits for its predecessor to stop serving (it is stopping: its
/// keeper gave the mount to this one's keeper).
const PREDECESSOR_WAIT: Duration = Duration::from_secs(30);

/// Copies of the session's `/dev/fuse` descriptor and of its clones.
fn device_copies(mounted: &Mounted) -> std::io::Result<(OwnedFd, Vec<OwnedFd>)> {
    let fuse = mounted.session.as_fd().try_clone_to_owned()?;
    let clones = mounted
        .clones
        .iter()
        .map(OwnedFd::try_clone)
        .collect::<std::io::Result<Vec<_>>>()?;
    Ok((fuse, clones))
}

/// Copies of the node journal's and handle table's descriptors.
fn state_copies(
    nodes: &crate::fs::handover::NodeJournal,
    handles: &crate::fs::handover::HandleTable,
) -> anyhow::Result<[OwnedFd; 2]> {
    let copy = |fd: std::os::fd::BorrowedFd<'_>| {
        fd.try_clone_to_owned()
            .context("cannot copy the handover state's descriptors")
    };
    Ok([copy(nodes.region().fd())?, copy(handles.region().fd())?])
}

/// The store (probed: endpoint, bucket and credentials answer), namespace, cache, fetcher,
/// prefetcher and the FUSE adapter.
fn build(
    args: &MountArgs,
    runtime: &tokio::runtime::Runtime,
    node_log: Option<Arc<dyn NodeLog>>,
) -> anyhow::Result<Stack> {
    // --max-memory: 3/8 for GETs in flight and the buffers of the idle connections kept beyond
    // the fixed ones, 1/8 for freed block buffers kept for reuse (`cache::ring`'s `AlignedBuf`),
    // 1/2 for the memory block cache.
    let kept_buffers = args.max_memory / 8;
    let get_memory = args.max_memory / 2 - kept_buffers;
    let idle_connections = idle_connections(get_memory);
    let s3 = S3Config {
        idle_connections,
        bucket: args.source.bucket.clone(),
        endpoint_url: args.endpoint_url.clone(),
        region: args.region.clone(),
        force_path_style: args.force_path_style,
        profile: args.profile.clone(),
        no_sign_request: args.no_sign_request,
        connect_timeout: None,
        read_timeout: None,
    };
    let s3_store = Arc::new(runtime.block_on(S3Store::new(&s3)));
    let raw: Arc<dyn ObjectStore> = s3_store.clone();
    runtime.block_on(probe(raw.clone(), args))?;
    // After the probe: its LIST has shown the credentials work. Only the cache and peers
    // need it.
    let principal = match args.cache_dir.is_some() || args.peers.is_some() {
        true => runtime
            .block_on(s3_store.principal_name())
            .context("cannot tell who signs this mount's requests")?,
        false => String::new(),
    };
    let endpoint = args.endpoint_url.as_deref().unwrap_or("aws-s3");
    let kept = args.cache_dir.as_ref().map(|dir| {
        let kept = SavedListings::new(dir, endpoint, &args.source.bucket);
        // The probe just listed the mount root with this mount's credentials.
        kept.grant_access();
        Arc::new(kept)
    });

    let retrying = Arc::new(RetryingStore::new(raw, RetryPolicy::default()));
    let store: Arc<dyn ObjectStore> = retrying.clone();
    let ns = Namespace::with_options(
        store.clone(),
        &args.source.prefix,
        args.metadata_ttl,
        NamespaceOptions {
            fanout: (args.list_concurrency > 0).then(|| FanoutConfig {
                concurrency: args.list_concurrency as usize,
                ..FanoutConfig::default()
            }),
            kept,
            node_log,
        },
    );
    let fds = fd_limit::raise_to_hard_limit().unwrap_or(1024);
    let budget = Budget::fit(fds, args.max_inflight as usize, args.cache_dir.is_some());
    if budget.max_inflight < args.max_inflight as usize {
        tracing::warn!(
            open_file_limit = fds,
            max_inflight = budget.max_inflight,
            "the open-file limit leaves room for fewer GETs in flight than --max-inflight; raise it (ulimit -n, or LimitNOFILE= in a systemd unit)"
        );
    } else if args.cache_dir.is_some() && budget.open_entries < DEFAULT_MAX_OPEN_OBJECTS {
        tracing::info!(
            open_file_limit = fds,
            open_cache_entries = budget.open_entries,
            "the open-file limit keeps fewer cache entries open (idle ones are reopened on use)"
        );
    }
    reserve_for_kept_buffers(kept_buffers);
    let fetch_config = FetchConfig {
        max_inflight: budget.max_inflight,
        inflight_memory: get_memory - idle_connections_memory(idle_connections),
        block_cache_bytes: args.max_memory / 2,
        block_size: args.block_size,
        ..FetchConfig::default()
    };
    let oracle = Arc::new(Oracle::default());
    let disk = match &args.cache_dir {
        None => None,
        Some(dir) => {
            let size_limit = |spec| match spec {
                SizeSpec::Bytes(b) => SizeLimit::Bytes(b),
                SizeSpec::Percent(p) => SizeLimit::Percent(p),
            };
            let mut cc = CacheConfig::new(dir, size_limit(args.cache_size));
            cc.min_free = size_limit(args.cache_min_free);
            cc.block_size = fetch_config.block_size;
            cc.max_open_objects = budget.open_entries;
            let policy = make_policy(args.eviction, Some(oracle.clone()));
            let cache = DiskCache::open_with_policy(cc, policy)
                .with_context(|| format!("cannot use cache directory {}", dir.display()))?;
            let proof_ttl = match args.metadata_ttl {
                MetadataTtl::For(ttl) => Some(ttl),
                MetadataTtl::Indefinite => None,
            };
            Some(Arc::new(DiskTier::new(
                cache,
                endpoint,
                &args.source.bucket,
                &principal,
                proof_ttl,
            )))
        }
    };
    let flush_on_exit = disk.clone();
    let fetcher = Fetcher::new(store, fetch_config, runtime.handle().clone(), disk);
    let peer_server = start_peers(args, runtime, &fetcher, endpoint, &principal)?;
    if let Some(peers) = fetcher.peers() {
        track_dataset_bytes(runtime, &ns, peers);
    }
    let prefetch = Prefetcher::new(
        ns.clone(),
        fetcher.clone(),
        prefetch_config(
            &fetcher,
            args.epoch_prefetch,
            args.cache_dir.is_some() && args.eviction == EvictionKind::Plan,
        ),
    );
    oracle.bind(&prefetch);
    if let Some(path) = &args.prefetch_plan {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the prefetch plan {}", path.display()))?;
        let plan = Plan::parse(&text).map_err(|e| {
            fail(
                FailureKind::InvalidArgument,
                format!("prefetch plan {}: {e}", path.display()),
            )
        })?;
        tracing::info!(items = plan.len(), "prefetch plan loaded");
        prefetch.set_plan(Some(plan));
    }
    let fs_status = Arc::new(FsStatus::default());
    let io_uring = match ring_choice(args) {
        Ok(()) => true,
        Err(why) => {
            fs_status.transport.dev_fuse(why);
            false
        }
    };
    let metrics = Arc::new(MountMetrics {
        source: args.source.to_string(),
        started: std::time::Instant::now(),
        namespace: ns.clone(),
        fetcher: fetcher.clone(),
        store: retrying,
        fs: fs_status.clone(),
    });
    let fuse_ops = FuseOps::new();
    let fs = RiffleFs::new(
        ns.clone(),
        fetcher,
        prefetch.clone(),
        fuse_ops.clone(),
        runtime.handle().clone(),
        FsConfig {
            uid: args.uid.unwrap_or_else(|| nix::unistd::geteuid().as_raw()),
            gid: args.gid.unwrap_or_else(|| nix::unistd::getegid().as_raw()),
            file_mode: args.file_mode,
            dir_mode: args.dir_mode,
            read_ahead: ReadAheadConfig::default(),
            kernel_read_ahead: KERNEL_READ_AHEAD,
            passthrough: !args.no_passthrough,
            lookup_readahead: args.lookup_readahead,
            max_idle_backings: max_idle_backings(args.max_idle_backings),
            io_uring,
        },
        fs_status.clone(),
    );
    Ok(Stack {
        ns,
        prefetch,
        metrics,
        fuse_ops,
        fs_status,
        io_uring,
        fuse_device: fs.fuse_device(),
        stats_file: fs.stats_file(),
        fs: Some(fs),
        flush_on_exit,
        _peer_server: peer_server,
    })
}

/// The bound on kept passthrough backing files: the option's number, or with `auto` as many
/// as the memory this process may use allows ([`crate::fs::idle_backings_within`]); logged,
/// and shown by `riffle stats` (`fuse.max_idle_backings`).
fn max_idle_backings(option: IdleBackings) -> usize {
    match option {
        IdleBackings::AtMost(n) => n as usize,
        IdleBackings::Auto => {
            let limit = memory_limit::of_this_process();
            let memory = limit.as_ref().map_or(AUTO_FALLBACK_MEMORY, |l| l.bytes);
            let kept = crate::fs::idle_backings_within(memory);
            match &limit {
                Some(limit) => tracing::info!(kept, memory = %limit, "--max-idle-backings auto"),
                None => tracing::warn!(
                    kept,
                    assumed_mib = memory >> 20,
                    "--max-idle-backings auto: the memory limit could not be read (/proc/meminfo)"
                ),
            }
            kept
        }
    }
}

/// Keeps `peers` told how many bytes the mount has listed (its share of them is the room
/// the cache keeps for owned blocks): every 2 s for the first minute, while a job's first
/// listings come in, then every 30 s. Ends when the namespace goes.
fn track_dataset_bytes(
    runtime: &tokio::runtime::Runtime,
    ns: &Arc<Namespace>,
    peers: &Arc<peer::Peers>,
) {
    let ns = Arc::downgrade(ns);
    let peers = Arc::downgrade(peers);
    runtime.spawn(async move {
        let started = std::time::Instant::now();
        loop {
            let Some(n) = ns.upgrade() else { return };
            let bytes = tokio::task::spawn_blocking(move || n.listed_usage(None).bytes).await;
            match (bytes, peers.upgrade()) {
                (Ok(bytes), Some(p)) => p.set_dataset_bytes(bytes),
                (_, None) => return,
                _ => {}
            }
            let pause = if started.elapsed() < Duration::from_secs(60) {
                2
            } else {
                30
            };
            tokio::time::sleep(Duration::from_secs(pause)).await;
        }
    });
}

/// With `--peers`: the fetcher asks the blocks' owners before the store, and with
/// `--peer-listen` this node serves its cache to them (`fetch::peer`).
fn start_peers(
    args: &MountArgs,
    runtime: &tokio::runtime::Runtime,
    fetcher: &Arc<Fetcher>,
    endpoint: &str,
    principal: &str,
) -> anyhow::Result<Option<PeerServer>> {
    let Some(members) = &args.peers else {
        return Ok(None);
    };
    let Some(secret_file) = &args.peer_secret_file else {
        bail!("--peers needs --peer-secret-file");
    };
    let secret = peer::Secret::from_file(secret_file)?;
    let config = peer::PeerConfig {
        listen: args.peer_listen,
        members: members.clone(),
        secret,
        timeout: args.peer_timeout,
        bucket: args.source.bucket.clone(),
        prefix: args.source.prefix.clone(),
        principal: crate::cache::Principal::new(endpoint, principal).to_hex(),
        block_size: fetcher.config().block_size,
        backoff: Duration::from_secs(1),
    };
    let _in_runtime = runtime.enter();
    let peers = peer::Peers::new(config);
    if args.peer_listen.is_some() && !peers.ring().members().iter().any(|m| m.is_self) {
        if let peer::Membership::Static(_) = members {
            tracing::warn!("--peers does not list this node's --peer-listen address: it serves peers but owns no blocks");
        }
    }
    peers.start_discovery();
    fetcher.set_peers(peers.clone());
    let server = match args.peer_listen {
        Some(addr) => peer::server::serve_or_warn(addr, fetcher.clone(), peers),
        None => None,
    };
    Ok(server)
}

/// fuser's session settings. fuser makes no clone of `/dev/fuse` itself (`clone_fd` off):
/// this daemon makes them ([`clone_devices`]) so that a keeper can hold them too, and gives
/// them to the session (`serve_on`); a thread without a clone of its own (a bundle with fewer
/// than `--fuse-threads` wants) shares the first descriptor.
/// `rings`: ask for FUSE over io_uring (`ring_choice`).
fn session_config(args: &MountArgs, rings: bool) -> fuser::Config {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::FSName("riffle".into()),
        // fuser's own mount(2) path (root) does not pass the subtype to the kernel; the kernel
        // option does, so the mount shows as `fuse.riffle` either way.
        if nix::unistd::geteuid().is_root() {
            MountOption::CUSTOM("subtype=riffle".into())
        } else {
            MountOption::Subtype("riffle".into())
        },
        MountOption::RO,
        MountOption::NoSuid,
        MountOption::NoDev,
        MountOption::NoAtime,
        MountOption::DefaultPermissions,
    ];
    config.acl = if args.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(args.fuse_threads as usize);
    config.clone_fd = false;
    config.uring = rings.then(fuser::UringOptions::default);
    config
}

/// Whether the daemon asks for FUSE over io_uring (`fs::transport`); why not, when not.
fn ring_choice(args: &MountArgs) -> Result<(), String> {
    match args.fuse_transport {
        FuseTransport::DevFuse => Err("asked for (--fuse-transport dev-fuse)".into()),
        _ if args.restart || args.keeper_fd.is_some() => Err(
            "a keeper holds the connection (the kernel cannot hand a dead daemon's io_uring \
             requests to its successor)"
                .into(),
        ),
        FuseTransport::Auto | FuseTransport::IoUring => transport::kernel_offers_ring(),
    }
}

/// Records the transport the session got (it asked for rings where `asked`);
/// `--fuse-transport io-uring` fails without them.
fn check_rings(
    args: &MountArgs,
    asked: bool,
    session: &fuser::Session<RiffleFs>,
    status: &FsStatus,
) -> anyhow::Result<()> {
    if session.negotiated_uring() {
        status.transport.rings(session.uring_status());
    } else if asked {
        let why = "the kernel did not accept FUSE over io_uring at INIT";
        if args.fuse_transport == FuseTransport::IoUring {
            return Err(precondition(format!("--fuse-transport io-uring: {why}")));
        }
        status.transport.dev_fuse(why);
    }
    Ok(())
}

/// Clones of the session's `/dev/fuse` descriptor (`FUSE_DEV_IOC_CLONE`), one per FUSE thread
/// after the first: each thread then reads a descriptor of its own, whose requests in flight
/// the kernel keeps on that descriptor's own processing list. Made after INIT and before any
/// thread reads, and given to the keeper with the connection (`fs::handover`): a clone
/// carries requests only once the keeper holds it, so a daemon's death ends none of them
/// (the kernel ends a clone's requests with `ECONNABORTED` only when its last holder closes
/// it) and the successor's resend brings them all back. A clone that cannot be made leaves
/// its thread sharing the first descriptor.
fn clone_devices(session: &fuser::Session<RiffleFs>, threads: u32) -> Vec<OwnedFd> {
    let wanted = (threads as usize)
        .saturating_sub(1)
        .min(protocol::MAX_CLONES);
    let mut clones = Vec::with_capacity(wanted);
    while clones.len() < wanted {
        match session.clone_device() {
            Ok(fd) => clones.push(fd),
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    clones = clones.len(),
                    "cannot clone /dev/fuse; the other FUSE threads share the first descriptor"
                );
                break;
            }
        }
    }
    clones
}

/// Mounts (the kernel's INIT happens here) and, with a keeper, gives it the connection.
fn mount(
    args: &MountArgs,
    mountpoint: &Path,
    stack: &mut Stack,
    keeper: Option<&OwnedFd>,
    handover: Option<&Handover>,
) -> anyhow::Result<Mounted> {
    let fs = stack
        .fs
        .take()
        .context("the file system was already mounted")?;
    if let Some(handover) = handover {
        fs.keep_handles_in(handover.handles.clone());
    }
    let config = session_config(args, stack.io_uring);
    let session = fuser::Session::new(fs, mountpoint, &config)
        .map_err(|e| precondition(format!("cannot mount at {}: {e}", mountpoint.display())))?;
    check_rings(args, stack.io_uring, &session, &stack.fs_status)?;
    let clones = clone_devices(&session, args.fuse_threads);
    let read_ahead = match crate::fs::bdi::set_read_ahead(mountpoint, KERNEL_READ_AHEAD) {
        Ok(path) => {
            tracing::debug!(path = %path.display(), "kernel read-ahead window set");
            format!("{} KiB", KERNEL_READ_AHEAD / 1024)
        }
        Err(e) => {
            tracing::info!(error = %e, "kernel read-ahead window left at the kernel's default");
            format!("the kernel's default, 128 KiB ({e})")
        }
    };
    *stack.fs_status.kernel_read_ahead.lock() = read_ahead;
    let kept = match (keeper, handover) {
        (Some(keeper), Some(handover)) => give_to_keeper(keeper, handover, &session, &clones),
        _ => false,
    };
    Ok(Mounted {
        session,
        clones,
        taken_over: false,
        kept,
    })
}

/// Gives the keeper a copy of the connection (the first descriptor and its `clones`) and the
/// handover state, when the kernel can resend requests in flight; otherwise a crash would
/// leave them waiting forever, so the mount goes without (as without `--restart`). Whether
/// the keeper holds it.
fn give_to_keeper(
    keeper: &OwnedFd,
    handover: &Handover,
    session: &fuser::Session<RiffleFs>,
    clones: &[OwnedFd],
) -> bool {
    let params = handover
        .handles
        .params()
        .ok()
        .and_then(|json| serde_json::from_slice::<InitParams>(&json).ok());
    match params {
        Some(params) if params.kernel_resends() => {
            match protocol::hold(keeper.as_fd(), None, &handover.fds(session.as_fd(), clones)) {
                Ok(()) => {
                    tracing::info!(
                        devices = 1 + clones.len(),
                        "the keeper holds the FUSE connection: a crash of this daemon costs no read"
                    );
                    true
                }
                Err(e) => {
                    tracing::error!(error = %e, "the keeper did not take the FUSE connection; a crash of this daemon will end the mount");
                    false
                }
            }
        }
        Some(_) => {
            tracing::warn!(
                kernel = %crate::fs::kernel_release(),
                "--restart needs Linux 6.9+ (FUSE_NOTIFY_RESEND, to replay the requests a dead daemon had read); this mount ends if its daemon dies"
            );
            false
        }
        None => {
            tracing::error!(
                "the INIT parameters were not saved; a crash of this daemon will end the mount"
            );
            false
        }
    }
}

/// Takes the mount over from the keeper: the connection, its INIT parameters, and the
/// predecessor's inodes.
fn take_over(keeper: &OwnedFd) -> anyhow::Result<Resumed> {
    let fds = protocol::take(keeper.as_fd(), None)
        .context("cannot take the mount over from the keeper")?;
    let resumed = Resumed::from_fds(fds).context("cannot take the mount over")?;
    Ok(resumed)
}

/// Serves a connection taken over from a dead predecessor: the same inodes and handles,
/// configured from the saved INIT parameters.
fn adopt(args: &MountArgs, stack: &mut Stack, takeover: Resumed) -> anyhow::Result<Mounted> {
    let records = takeover
        .nodes
        .records()
        .context("cannot read the predecessor's inodes")?;
    let nodes = records.len();
    stack
        .ns
        .restore(records)
        .map_err(|e| anyhow!("cannot rebuild the predecessor's inodes: {e}"))?;
    let mut fs = stack
        .fs
        .take()
        .context("the file system was already mounted")?;
    fs.adopt(&takeover.params, takeover.handles.clone())
        .context("cannot take over the predecessor's file handles")?;
    let devices = 1 + takeover.clones.len();
    if devices < args.fuse_threads as usize {
        // Never a clone of its own: nothing else would hold it, and the kernel would end the
        // requests it had read when this daemon dies.
        tracing::info!(
            devices,
            fuse_threads = args.fuse_threads,
            "the connection taken over carries fewer /dev/fuse descriptors than --fuse-threads (its first daemon made fewer clones, or was an older build); the other threads share the first"
        );
    }
    tracing::info!(
        inodes = nodes,
        devices,
        "took the mount over from the keeper"
    );
    // A connection taken over never has rings (`ring_choice`: a keeper holds it).
    let config = session_config(args, false);
    let session = fuser::Session::from_fd_initialized(
        fs,
        takeover.fuse,
        config.acl,
        config,
        takeover.params.kernel_abi(),
    );
    *stack.fs_status.kernel_read_ahead.lock() =
        "set by the daemon that mounted (taken over)".to_string();
    Ok(Mounted {
        session,
        clones: takeover.clones,
        taken_over: true,
        kept: true,
    })
}

/// Starts the control socket, metrics and prefetch, reports readiness, serves until the file
/// system is unmounted, then flushes the cache.
fn serve_until_unmounted(
    args: &MountArgs,
    mountpoint: &Path,
    stack: Stack,
    mounted: Mounted,
    runtime: tokio::runtime::Runtime,
    readiness: &mut Readiness,
    log_opener: Option<logging::LogOpener>,
) -> anyhow::Result<()> {
    let Mounted {
        mut session,
        clones,
        taken_over,
        kept: _,
    } = mounted;
    stack.fs_status.fuse_devices.store(
        1 + clones.len() as u64,
        std::sync::atomic::Ordering::Relaxed,
    );
    session.serve_on(clones);
    match session.as_fd().try_clone_to_owned() {
        Ok(fd) => {
            let _ = stack.fuse_device.set(Arc::new(fd));
            // (Until then, backing ids are only opened at open time.)
        }
        Err(e) => tracing::debug!(error = %e, "cannot duplicate /dev/fuse; no backing ids ahead"),
    }
    let prefetch = stack.prefetch.clone();
    let (_control, _metrics_server) = {
        let _in_runtime = runtime.enter();
        prefetch.start();
        if args.warm && !taken_over {
            let id = prefetch.warm(Vec::new());
            tracing::info!(job = id, "warming the whole mount in the background");
        }
        let handler = Arc::new(MountControl {
            stats: stack.metrics.clone(),
            prefetch: prefetch.clone(),
            fuse_ops: stack.fuse_ops.clone(),
            metrics_labels: args.metrics_label.clone().into(),
        });
        stack.stats_file.set_source(handler.clone());
        let metrics_server = args
            .metrics_addr
            .map(|addr| {
                let labels = &handler.metrics_labels;
                serve_metrics(addr, handler.clone(), stack.fuse_ops.clone(), labels)
            })
            .transpose()?;
        (control::serve(mountpoint, handler)?, metrics_server)
    };
    let mut unmounter = session.unmount_callable();
    let mount_path = mountpoint.to_path_buf();
    runtime.spawn(async move {
        wait_for_stop_signal().await;
        tracing::info!("stop signal received; unmounting {}", mount_path.display());
        let result = if taken_over {
            super::unmount::unmount(&mount_path, false)
        } else {
            unmounter.unmount().map_err(anyhow::Error::from)
        };
        if let Err(e) = result {
            tracing::warn!(error = %e, "unmount failed");
        }
    });
    let _ = std::env::set_current_dir("/");
    // Under a keeper, the pid file names the keeper (the process that lives as long as the
    // mount, and that a stop signal goes to); it wrote the file itself.
    let pid_file = args.pid_file.as_ref().filter(|_| args.keeper_fd.is_none());
    if let Some(pid_file) = pid_file {
        std::fs::write(pid_file, format!("{}\n", std::process::id()))
            .with_context(|| format!("cannot write pid file {}", pid_file.display()))?;
    }
    if taken_over {
        // Everything is in place to answer: the requests the predecessor had read come again.
        if let Err(e) = request_resend(session.as_fd()) {
            tracing::error!(error = %e, "requests the predecessor had read may wait until unmount");
        }
    }
    tracing::info!(
        source = %args.source,
        mountpoint = %mountpoint.display(),
        pid = std::process::id(),
        daemon = readiness.is_daemon(),
        taken_over,
        "mounted"
    );
    let rings = session.negotiated_uring().then(|| session.uring_status());
    let result = session.run_reporting(|started| {
        if let Err(why) = started {
            rings_failed(&why, readiness);
        }
        readiness.ready();
        super::systemd::ready();
        if let Some(opener) = log_opener {
            // Opened once the session's threads answer (the open may look at the mount).
            opener.open();
        }
        if let Some(status) = rings {
            watch_rings(status);
        }
    });
    tracing::info!("unmounted {}; exiting", mountpoint.display());
    prefetch.shutdown();
    if let Some(disk) = stack.flush_on_exit {
        if !runtime.block_on(disk.flush(Duration::from_secs(30))) {
            tracing::warn!(
                "cache writes still in flight after 30 s; some blocks will be fetched again"
            );
        }
    }
    if let Some(pid_file) = pid_file {
        let _ = std::fs::remove_file(pid_file);
    }
    runtime.shutdown_timeout(Duration::from_secs(1));
    result.context("the FUSE session ended with an error")
}

/// The rings INIT negotiated did not all come up: the kernel holds every request until they
/// have, so the mount would never answer. The session has unmounted (where nothing held the
/// mount); the daemon says why and exits at once, which ends the connection (no keeper holds
/// it over io_uring) and with it any request the kernel still held.
fn rings_failed(why: &str, readiness: &mut Readiness) -> ! {
    let e = precondition(format!(
        "FUSE over io_uring: {why} (mount with --fuse-transport dev-fuse)"
    ));
    tracing::error!("{}", one_line(&e));
    readiness.failed_with(&e);
    std::process::exit(super::exit_status(&e));
}

/// Watches the rings of a running mount: a queue whose thread stops serving while the session
/// runs leaves the callers on its CPU waiting for an entry until the connection ends, so the
/// daemon ends it, as a crash would (no keeper holds a mount over io_uring): those callers
/// and every later one get `ENOTCONN` instead of waiting for good.
fn watch_rings(status: Arc<fuser::UringStatus>) {
    let spawned = std::thread::Builder::new()
        .name("riffle-rings".into())
        .spawn(move || {
            let why = status.wait_failed();
            tracing::error!(
                "FUSE over io_uring: {why}; ending the connection (its callers get ENOTCONN)"
            );
            std::process::exit(FailureKind::Failed.exit_code());
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot watch the FUSE rings");
    }
}

async fn wait_for_stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// Prefetch sizing: three quarters of the GET slots, and a byte window that is a share of the
/// cache so that what is fetched ahead is still there when the reader arrives.
fn prefetch_config(fetcher: &Fetcher, epoch_prefetch: bool, eviction_asks: bool) -> PrefetchConfig {
    let concurrency = (fetcher.config().max_inflight * 3 / 4).max(1);
    let (byte_budget, max_file_bytes) = match fetcher.disk() {
        Some(disk) => ((disk.cache().limit() / 4).min(16 << 30), 256 << 20),
        None => (fetcher.config().block_cache_bytes / 2, 8 << 20),
    };
    PrefetchConfig {
        concurrency,
        byte_budget,
        max_items_ahead: 100_000,
        max_file_bytes,
        max_dir_window: concurrency * 4,
        epoch_prefetch,
        eviction_asks_prefetch: eviction_asks,
    }
}

/// One LIST of the prefix: proves endpoint, bucket and credentials before mounting.
async fn probe(raw: Arc<dyn ObjectStore>, args: &MountArgs) -> anyhow::Result<()> {
    let endpoint = args
        .endpoint_url
        .clone()
        .unwrap_or_else(|| "the AWS S3 endpoint".to_string());
    let bucket = &args.source.bucket;
    let policy = RetryPolicy {
        max_attempts: 3,
        base_delay: Duration::from_millis(200),
        max_delay: Duration::from_secs(1),
    };
    let store = RetryingStore::new(raw, policy);
    let listing = store.list_page(ListRequest::probe(&args.source.prefix));
    match tokio::time::timeout(PROBE_TIMEOUT, listing).await {
        Err(_) => Err(fail(
            FailureKind::Unavailable,
            format!(
                "no answer from {endpoint} within {} s",
                PROBE_TIMEOUT.as_secs()
            ),
        )),
        Ok(Ok(page)) => {
            if page.objects.is_empty() && page.prefixes.is_empty() {
                tracing::warn!(source = %args.source, "nothing under this prefix yet: the mount is empty");
            }
            Ok(())
        }
        Ok(Err(e)) => {
            let message = match &e {
                StoreError::NoSuchBucket(b) => format!("bucket '{b}' does not exist at {endpoint}"),
                StoreError::AccessDenied(detail) => format!(
                    "access to bucket '{bucket}' was denied: {detail}; check the credentials \
                     (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or --profile; --no-sign-request for public buckets)"
                ),
                StoreError::Unreachable(detail) => format!("cannot reach {endpoint}: {detail}"),
                StoreError::Transient(detail) => {
                    format!("{endpoint} did not answer properly: {detail}")
                }
                StoreError::NoCredentials(detail) => format!(
                    "no usable AWS credentials ({detail}): set AWS_ACCESS_KEY_ID and \
                     AWS_SECRET_ACCESS_KEY, use --profile, or --no-sign-request for a public bucket"
                ),
                e => format!("cannot list {} at {endpoint}: {e}", args.source),
            };
            Err(fail(FailureKind::of_store_error(&e), message))
        }
    }
}

/// A failure of the mountpoint or the FUSE device, not of the bucket.
fn precondition(message: String) -> anyhow::Error {
    fail(FailureKind::FailedPrecondition, message)
}

/// Checks the mountpoint and returns its absolute path.
fn check_mountpoint(path: &Path) -> anyhow::Result<PathBuf> {
    let shown = path.display();
    match mount_state(path)? {
        MountState::NotMounted => {}
        MountState::Mounted { fstype } => {
            return Err(precondition(format!(
                "{shown} is already mounted ({fstype}); unmount it first"
            )))
        }
        MountState::Dead => {
            return Err(precondition(format!(
                "{shown} is a dead mount (its daemon is gone: transport endpoint is not \
                 connected); clean it with `riffle unmount {shown}` and mount again"
            )))
        }
    }
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(precondition(format!("mountpoint {shown} does not exist")))
        }
        Err(e) => return Err(e).with_context(|| format!("cannot use mountpoint {shown}")),
    };
    if !meta.is_dir() {
        return Err(precondition(format!(
            "mountpoint {shown} is not a directory"
        )));
    }
    let mut entries =
        std::fs::read_dir(path).with_context(|| format!("cannot read mountpoint {shown}"))?;
    if entries.next().is_some() {
        return Err(precondition(format!("mountpoint {shown} is not empty")));
    }
    std::fs::canonicalize(path).with_context(|| format!("cannot resolve {shown}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountpoint_checks_give_reasons() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        let err = check_mountpoint(&missing).unwrap_err().to_string();
        assert!(err.contains("does not exist"), "{err}");
        let file = dir.path().join("file");
        std::fs::write(&file, "x").unwrap();
        let err = check_mountpoint(&file).unwrap_err().to_string();
        assert!(err.contains("not a directory"), "{err}");
        let err = check_mountpoint(dir.path()).unwrap_err().to_string();
        assert!(err.contains("not empty"), "{err}");
        let empty = dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        assert!(check_mountpoint(&empty).is_ok());
        assert!(matches!(
            mount_state(Path::new("/proc")).unwrap(),
            MountState::Mounted { .. }
        ));
    }
}
