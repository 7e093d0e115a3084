//! `riffle-bench-mountpoint`: mounts an S3 bucket read-only with the Mountpoint
//! for Amazon S3 library (`mountpoint-s3-fs` 0.11), for side-by-side benchmarks
//! against rifflefs (benches/run.sh). No `mount-s3` binary crate is published,
//! so this is a small front end over the library's public API with the options
//! Mountpoint users set for training jobs (`--metadata-ttl indefinite`,
//! `--cache DIR --max-cache-size MiB`, `--max-threads N`) and Mountpoint's own
//! defaults for everything else (8 MiB parts, 95% of memory as the memory
//! target, 1 MiB cache blocks, the kernel's default FUSE settings).
//!
//! Foreground by default; `--daemon` forks, mounts in the child and returns
//! only once the mount is live (like `mount-s3` without `-f`), with exit status
//! 1 and the child's error otherwise. Unmount with `fusermount3 -u MNT` (or
//! `umount MNT`, or SIGINT/SIGTERM to the daemon).
//!
//! Bench-only: not part of the rifflefs workspace or its default build.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use clap::Parser;
use mountpoint_s3_client::config::{AddressingStyle, S3ClientAuthConfig};
use mountpoint_s3_client::user_agent::UserAgent;
use mountpoint_s3_fs::data_cache::{
    CacheLimit, DataCacheConfig, DiskDataCacheConfig, ManagedCacheDir,
};
use mountpoint_s3_fs::fs::{CacheConfig, TimeToLive};
use mountpoint_s3_fs::fuse::config::{FuseOptions, FuseSessionConfig, MountPoint};
use mountpoint_s3_fs::fuse::session::FuseSession;
use mountpoint_s3_fs::logging::{LoggingConfig, init_logging};
use mountpoint_s3_fs::memory::{
    CandidateSize, MINIMUM_MEM_LIMIT, PagedPool, effective_total_memory,
};
use mountpoint_s3_fs::s3::config::{
    ClientConfig, MemoryLimitSetting, PartConfig, Region, TargetThroughputSetting,
};
use mountpoint_s3_fs::s3::{Bucket, Prefix, S3Path, S3Personality};
use mountpoint_s3_fs::{
    MountpointConfig, Runtime, S3FilesystemConfig, Superblock, SuperblockConfig, metrics,
};
use nix::unistd::{ForkResult, Pid};

/// Mountpoint's default disk-cache block size (also its S3 Express cache's).
const CACHE_BLOCK_SIZE: u64 = 1024 * 1024;

#[derive(Parser, Debug)]
#[command(
    name = "riffle-bench-mountpoint",
    version,
    about = "Bench-only: mount an S3 bucket read-only with the Mountpoint for Amazon S3 library \
             (mountpoint-s3-fs 0.11). Credentials come from the environment \
             (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) or the default AWS chain. \
             Unmount with `fusermount3 -u MOUNTPOINT`."
)]
struct Args {
    /// Bucket name, or s3://BUCKET[/PREFIX/]
    bucket: String,

    /// Directory to mount at (must exist)
    mount_point: PathBuf,

    /// Only mount keys under this prefix (must end in '/')
    #[arg(long, value_name = "PREFIX")]
    prefix: Option<String>,

    /// S3 endpoint URL, e.g. http://127.0.0.1:7480 [default: AWS S3 in --region]
    #[arg(long, value_name = "URL")]
    endpoint_url: Option<String>,

    /// Signing region
    #[arg(long, default_value = "us-east-1")]
    region: String,

    /// Path-style addressing (http://HOST/BUCKET/KEY), needed by Ceph RGW and proxies
    #[arg(long)]
    force_path_style: bool,

    /// Metadata TTL: "minimal", "indefinite" or seconds [default: like mount-s3: 60 with --cache, else minimal]
    #[arg(long, value_name = "TTL", value_parser = parse_ttl)]
    metadata_ttl: Option<TimeToLive>,

    /// TTL of negative lookups: "minimal", "indefinite" or seconds [default: --metadata-ttl]
    #[arg(long, value_name = "TTL", value_parser = parse_ttl)]
    negative_metadata_ttl: Option<TimeToLive>,

    /// Enable Mountpoint's local disk data cache under DIR (1 MiB blocks; emptied at mount and unmount)
    #[arg(long, value_name = "DIR")]
    cache: Option<PathBuf>,

    /// Maximum size of the disk cache in MiB [default: keep 5% of the disk free]
    #[arg(long, value_name = "MiB", requires = "cache")]
    max_cache_size: Option<u64>,

    /// Maximum number of FUSE worker threads
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..))]
    max_threads: u64,

    /// Memory usage target in MiB [default: 95% of total (or cgroup) memory, like mount-s3]
    #[arg(long, value_name = "MiB")]
    memory_target: Option<u64>,

    /// Part size for ranged GETs, in bytes
    #[arg(long, value_name = "BYTES", default_value_t = 8 * 1024 * 1024)]
    part_size: u64,

    /// Target throughput in Gbps (the CRT sizes its connection pool from it)
    #[arg(long, value_name = "N", default_value_t = TargetThroughputSetting::DEFAULT_TARGET_THROUGHPUT_GBPS)]
    maximum_throughput_gbps: f64,

    /// Limit on concurrent FUSE background requests [default: Mountpoint's, 64]
    #[arg(long, value_name = "N")]
    max_background: Option<u16>,

    /// Allow other users (including root) to access the mount
    #[arg(long)]
    allow_other: bool,

    /// Allow root to access the mount
    #[arg(long)]
    allow_root: bool,

    /// Unmount automatically when the daemon exits
    #[arg(long)]
    auto_unmount: bool,

    /// Fork, and return once the mount is live (the daemon keeps serving it)
    #[arg(long)]
    daemon: bool,

    /// Seconds `--daemon` waits for the mount before giving up
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    daemon_timeout: u64,

    /// Write the serving process's PID here once mounted
    #[arg(long, value_name = "FILE")]
    pid_file: Option<PathBuf>,

    /// Log to this file [default: stdout in the foreground, syslog with --daemon]
    #[arg(long, value_name = "FILE")]
    log_file: Option<PathBuf>,

    /// Debug logging (the MOUNTPOINT_LOG environment variable overrides the filter)
    #[arg(long)]
    debug: bool,

    /// Also log the AWS CRT at debug level
    #[arg(long)]
    debug_crt: bool,
}

fn parse_ttl(s: &str) -> Result<TimeToLive, String> {
    TimeToLive::new_from_str(s).map_err(|e| e.to_string())
}

impl Args {
    fn s3_path(&self) -> anyhow::Result<S3Path> {
        let (bucket, uri_prefix) = match self.bucket.strip_prefix("s3://") {
            Some(rest) => match rest.split_once('/') {
                Some((b, p)) => (b, p),
                None => (rest, ""),
            },
            None => (self.bucket.as_str(), ""),
        };
        let prefix = match (&self.prefix, uri_prefix) {
            (Some(_), p) if !p.is_empty() => {
                bail!("give the prefix either in the s3:// URI or with --prefix")
            }
            (Some(p), _) => p.as_str(),
            (None, p) => p,
        };
        let bucket =
            Bucket::new(bucket).with_context(|| format!("invalid bucket name {bucket:?}"))?;
        let prefix = Prefix::new(prefix).with_context(|| format!("invalid prefix {prefix:?}"))?;
        Ok(S3Path::new(bucket, prefix))
    }

    fn logging_config(&self) -> LoggingConfig {
        // mount-s3's default filter: warnings, Mountpoint's own info lines, no CRT, no metrics.
        let mut filter = if self.debug {
            "debug".to_string()
        } else {
            "warn,mountpoint_s3=info".to_string()
        };
        filter.push_str(if self.debug_crt {
            ",awscrt=debug"
        } else {
            ",awscrt=off"
        });
        if !self.debug {
            filter.push_str(&format!(",{}=off", metrics::TARGET_NAME));
        }
        LoggingConfig {
            log_file: self.log_file.clone(),
            log_to_stdout: !self.daemon,
            default_filter: filter,
        }
    }

    fn memory_limit(&self) -> MemoryLimitSetting {
        match self.memory_target {
            Some(mib) => MemoryLimitSetting::User(mib as usize * 1024 * 1024),
            None => {
                let default = (effective_total_memory() as f64 * 0.95) as usize;
                MemoryLimitSetting::Default(default.max(MINIMUM_MEM_LIMIT))
            }
        }
    }

    fn metadata_cache_config(&self) -> CacheConfig {
        let ttl = self.metadata_ttl.unwrap_or(if self.cache.is_some() {
            TimeToLive::Duration(Duration::from_secs(60))
        } else {
            TimeToLive::Minimal
        });
        let mut config = CacheConfig::new(ttl);
        if let Some(negative) = self.negative_metadata_ttl {
            config = config.with_negative_metadata_ttl(negative);
        }
        config
    }

    fn disk_cache_config(&self) -> anyhow::Result<Option<DiskDataCacheConfig>> {
        let Some(dir) = &self.cache else {
            return Ok(None);
        };
        let limit = match self.max_cache_size {
            Some(0) => bail!("--max-cache-size must be positive"),
            Some(mib) => CacheLimit::TotalSize {
                max_size: (mib * 1024 * 1024) as usize,
            },
            None => CacheLimit::default(),
        };
        Ok(Some(DiskDataCacheConfig {
            cache_directory: dir.clone(),
            block_size: CACHE_BLOCK_SIZE,
            limit,
        }))
    }
}

/// Mounts the bucket; the mount is live when this returns.
fn mount(args: &Args) -> anyhow::Result<FuseSession> {
    let s3_path = args.s3_path()?;
    let memory_limit = args.memory_limit();
    let part_config = PartConfig::with_part_size(args.part_size as usize).validate(memory_limit)?;

    // One pool for every buffer: cache blocks and GET parts may be pruned under pressure.
    let pool = PagedPool::config()
        .with_candidate_sizes([
            CandidateSize::prunable(CACHE_BLOCK_SIZE as usize),
            CandidateSize::prunable(part_config.read_size_bytes),
            CandidateSize::new(part_config.write_size_bytes),
        ])
        .with_memory_limit(memory_limit.bytes())
        .with_maintenance_interval(Duration::from_secs(60))
        .build();

    let client_config = ClientConfig {
        region: Region::new_user_specified(args.region.clone()),
        endpoint_url: args.endpoint_url.clone(),
        addressing_style: if args.force_path_style {
            AddressingStyle::Path
        } else {
            AddressingStyle::Automatic
        },
        dual_stack: false,
        transfer_acceleration: false,
        auth_config: S3ClientAuthConfig::Default,
        requester_pays: false,
        expected_bucket_owner: None,
        throughput_target: TargetThroughputSetting::User {
            gbps: args.maximum_throughput_gbps,
        },
        bind: None,
        part_config,
        user_agent: UserAgent::new(Some(format!(
            "riffle-bench-mountpoint/{}",
            env!("CARGO_PKG_VERSION")
        ))),
        tls_config: None,
    };
    // Sends one ListObjectsV2 first, so a wrong endpoint, bucket or key fails the mount here.
    let client = client_config
        .create_client(pool.clone(), Some(&s3_path))
        .context("cannot reach the bucket")?;
    let runtime = Runtime::new(client.event_loop_group());
    let personality =
        S3Personality::infer_from_bucket(s3_path.bucket.as_str(), &client.endpoint_config());

    let fs_config = S3FilesystemConfig {
        cache_config: args.metadata_cache_config(),
        s3_personality: personality,
        max_background_fuse_requests: args.max_background,
        read_only: true,
        ..Default::default()
    };
    let mut data_cache_config = DataCacheConfig {
        disk_cache_config: args.disk_cache_config()?,
        express_cache_config: None,
    };
    // Mountpoint owns DIR/mountpoint-cache: wiped now and again at unmount.
    let managed_cache_dir = match &mut data_cache_config.disk_cache_config {
        Some(disk) => {
            let managed =
                ManagedCacheDir::new_from_parent_with_cache_key(&disk.cache_directory, None, true)
                    .with_context(|| {
                        format!(
                            "cannot create the cache directory under {}",
                            disk.cache_directory.display()
                        )
                    })?;
            disk.cache_directory = managed.as_path_buf();
            Some(managed)
        }
        None => None,
    };

    let mount_point = MountPoint::new(&args.mount_point)
        .with_context(|| format!("bad mount point {}", args.mount_point.display()))?;
    let fuse_options = FuseOptions {
        read_only: true,
        auto_unmount: args.auto_unmount,
        allow_root: args.allow_root,
        allow_other: args.allow_other,
        clone_fd: false,
    };
    let fuse_config = FuseSessionConfig::new(mount_point, fuse_options, args.max_threads as usize)?;

    let superblock = Superblock::new(
        client.clone(),
        s3_path,
        SuperblockConfig {
            cache_config: fs_config.cache_config.clone(),
            s3_personality: personality,
        },
    );
    let mut session = MountpointConfig::new(fuse_config, fs_config, data_cache_config)?
        .create_fuse_session(superblock, client, runtime, pool)
        .context("cannot mount")?;
    if let Some(dir) = managed_cache_dir {
        session.run_on_close(Box::new(move || drop(dir)));
    }
    Ok(session)
}

fn write_pid_file(path: Option<&Path>) -> anyhow::Result<()> {
    if let Some(path) = path {
        std::fs::write(path, format!("{}\n", std::process::id()))
            .with_context(|| format!("cannot write the pid file {}", path.display()))?;
    }
    Ok(())
}

fn mounted_message(args: &Args) -> String {
    format!(
        "{} is mounted at {}",
        args.bucket,
        args.mount_point.display()
    )
}

fn run_foreground(args: Args) -> anyhow::Result<()> {
    let _logging = init_logging(args.logging_config()).context("cannot initialize logging")?;
    let _metrics = metrics::install(None).map_err(|e| anyhow!("cannot initialize metrics: {e}"))?;
    let session = mount(&args)?;
    write_pid_file(args.pid_file.as_deref())?;
    println!("{}", mounted_message(&args));
    session.join().context("FUSE session failed")
}

/// Points fd 0, 1 and 2 at /dev/null (the daemon must not hold its caller's pipes open).
fn detach_stdio() -> anyhow::Result<()> {
    let null = File::options().read(true).write(true).open("/dev/null")?;
    for fd in 0..=2 {
        // SAFETY: dup2 onto the standard descriptors, which this process owns.
        if unsafe { libc::dup2(null.as_raw_fd(), fd) } < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
    }
    Ok(())
}

/// The forked child: mounts, reports "ok" or the error through the pipe, serves.
fn daemon_child(args: Args, status: OwnedFd) -> anyhow::Result<()> {
    let mut status = File::from(status);
    // Own session: no controlling terminal, not killed with the caller's process group.
    let _ = nix::unistd::setsid();
    let result = (|| -> anyhow::Result<_> {
        let logging = init_logging(args.logging_config()).context("cannot initialize logging")?;
        let metrics =
            metrics::install(None).map_err(|e| anyhow!("cannot initialize metrics: {e}"))?;
        let session = mount(&args)?;
        write_pid_file(args.pid_file.as_deref())?;
        Ok((logging, metrics, session))
    })();
    match result {
        Ok((_logging, _metrics, session)) => {
            let _ = status.write_all(b"ok");
            drop(status);
            detach_stdio()?;
            tracing::info!("daemon serving {}", mounted_message(&args));
            session.join().context("FUSE session failed")
        }
        Err(e) => {
            // The parent prints it.
            let _ = status.write_all(format!("error: {e:#}").as_bytes());
            std::process::exit(1);
        }
    }
}

/// The caller: waits for the child's status, up to the timeout.
fn daemon_parent(args: &Args, child: Pid, status: OwnedFd) -> anyhow::Result<()> {
    let mut status = File::from(status);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut msg = String::new();
        let _ = status.read_to_string(&mut msg);
        let _ = tx.send(msg);
    });
    match rx.recv_timeout(Duration::from_secs(args.daemon_timeout)) {
        Ok(msg) if msg == "ok" => {
            println!("{} (pid {child})", mounted_message(args));
            Ok(())
        }
        Ok(msg) => {
            let _ = nix::sys::wait::waitpid(child, None);
            let msg = msg.strip_prefix("error: ").unwrap_or(&msg);
            if msg.is_empty() {
                bail!("the mount process exited without mounting");
            }
            bail!("{msg}");
        }
        Err(_) => {
            let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
            bail!(
                "the mount was not live after {} s; killed the mount process",
                args.daemon_timeout
            );
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = if args.daemon {
        // Fork before any thread exists: the CRT and FUSE threads start in the child only.
        match nix::unistd::pipe() {
            Err(e) => Err(anyhow!("cannot create a pipe: {e}")),
            // SAFETY: single-threaded here; the child only runs Rust code that starts afresh.
            Ok((read_end, write_end)) => match unsafe { nix::unistd::fork() } {
                Err(e) => Err(anyhow!("cannot fork: {e}")),
                Ok(ForkResult::Child) => {
                    drop(read_end);
                    daemon_child(args, write_end)
                }
                Ok(ForkResult::Parent { child }) => {
                    drop(write_end);
                    daemon_parent(&args, child, read_end)
                }
            },
        }
    } else {
        run_foreground(args)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("riffle-bench-mountpoint: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
