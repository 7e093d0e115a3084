//! The fuser `Filesystem` adapter: FUSE requests in, namespace and reader calls out.
//!
//! Every request that may wait on the store is moved onto the tokio runtime together with its
//! reply, so the FUSE threads only decode requests and never block; the reply is sent from the
//! task when the answer is ready. Errors become errno values in this layer (module `errno`) and
//! nowhere else: missing names ENOENT, denied EACCES, anything the store could not deliver EIO, and every call that
//! would modify the tree EROFS.
//!
//! Open files get a [`FileReader`] keyed by a fresh file handle. The kernel page cache is kept
//! across opens (`FOPEN_KEEP_CACHE`) only while the object's ETag is the one last opened, so a
//! replaced object's stale pages are dropped at the next open. Directory handles hold a snapshot
//! of the listing taken at `opendir`, so offsets stay stable while a reader pages through it.
//!
//! Fast paths: a lookup, getattr or open whose answer is already in memory (metadata younger than
//! the TTL; for an open with passthrough, a backing file kept from an earlier open of the same
//! version, see the `backings` module) is answered on the FUSE thread itself, without a tokio task.
//! A warm epoch of small files is then one FUSE round trip per lookup and per open, and the reads
//! never reach the daemon; a lookup of a small cached file also starts reading its cache file from
//! disk, so the read after the open finds it on its way (the `lookahead` module). Without
//! passthrough (kernels before 6.9), an open whose metadata is in memory and a read of bytes in the
//! memory cache are answered on the FUSE thread too, and a read of a block in an open NVMe cache
//! entry on the cache's I/O thread as soon as the block is read and verified
//! ([`Fetcher::read_quick`]); only reads that must wait for the store or for metadata I/O take a
//! task. `flush` answers ENOSYS once, so the kernel stops sending it (a read-only file system has
//! nothing to flush) and `close` costs no round trip.
//!
//! Directory handles answer `readdirplus` with every entry's attributes only when the mount's
//! readers `stat` what they list; a reader that wants names (`find -type f`, `os.walk`) gets
//! `.` and `..` at the first read and the names through `readdir`, so the kernel makes no
//! inode per file (module [`dirplus`]).
//!
//! Every other operation is answered here too, at once and without a log line, because fuser's
//! defaults write a warning per request and some arrive once per file: Python's `open()` asks
//! `isatty()` (an `ioctl(TCGETS)`) on every file it opens, so a data loader sends one `ioctl`
//! per sample. `ioctl` answers `ENOTTY`, what a regular file on ext4 answers; the kernel
//! turns an `ENOSYS` from a FUSE server into `ENOTTY` as well and keeps sending the next one,
//! so no answer saves the round trip (measured: the same count of FUSE `ioctl` requests
//! either way). `lseek`, `poll`, `copy_file_range`, `getlk`/`setlk` and `bmap` answer `ENOSYS`,
//! which the kernel remembers for the mount and handles them itself from then on (`SEEK_DATA`
//! and `SEEK_HOLE` as for a file without holes, `poll` as always ready, copies by reading and
//! writing, locks locally). `readlink` answers `EINVAL` (the tree has no symbolic links) and
//! `fsyncdir` succeeds (nothing to write).
//!
//! `.riffle-stats` at the mount root is answered by [`stats_file`] (lookup of a name the bucket
//! lacks, getattr, open, read, release of its inode): the mount's statistics, never listed.
//!
//! The adapter is a thin shell: each operation classifies its inode once ([`node::Node`]:
//! the stats file or a namespace inode), asks a decision (a function or method over the file
//! system's state that returns a value, module [`answer`]) and sends that value with the
//! operation's fuser reply, in one place per operation (the `send` at its top), from the FUSE
//! thread or from the task that waited for the answer. The decisions are tested without a
//! kernel (module `tests`).
//!
//! Files: this one holds [`RiffleFs`] and its `Filesystem` requests; `node` which node a
//! request names; `answer` the decisions' values; `meta` the lookup and getattr answers;
//! `open` the open decision (fast and on a task) and the takeover of a predecessor's handles;
//! `read` the read that waits; `handles` the open-file table and `inode_opens` its per-inode
//! state; `attr` the attributes, listings and xattrs as FUSE shows them; `errno` the errno
//! mapping; `fixed` the fixed answers; the rest one feature each (passthrough backings,
//! preopen, lookahead, dirplus, the stats file, the handover).
//!
//! [`FileReader`]: crate::reader::FileReader

mod answer;
mod attr;
mod backings;
pub(crate) mod bdi;
pub(crate) mod dirplus;
mod errno;
mod fixed;
mod handles;
pub(crate) mod handover;
mod inode_opens;
pub mod latency;
mod lookahead;
mod meta;
pub(crate) mod mountinfo;
mod node;
mod open;
mod preopen;
mod read;
pub(crate) mod stats_file;
#[cfg(test)]
mod tests;
pub mod transport;

use std::ffi::OsStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use fuser::{
    CopyFileRangeFlags, Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, PollEvents, PollFlags,
    PollNotifier, ReplyAttr, ReplyBmap, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty,
    ReplyEntry, ReplyIoctl, ReplyLock, ReplyLseek, ReplyOpen, ReplyPoll, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;

use crate::fetch::Fetcher;
use crate::namespace::{DirEntry, Namespace, Stat};
use crate::prefetch::Prefetcher;
use crate::reader::ReadAheadConfig;
use answer::{Entry, OpenAnswer};
use attr::{walk_listing, xattr_reply};
pub(crate) use backings::{idle_backings_within, MAX_IDLE_BACKINGS};
use bytes::Bytes;
use errno::ns_errno;
use fixed::fixed_answers;
use handles::Handles;
use handover::{HandleTable, InitParams};
use latency::{FuseOp, FuseOps};
use lookahead::Lookahead;
pub(crate) use lookahead::LookaheadStats;
use meta::Meta;
use node::Node;
pub(crate) use preopen::FuseDevice;
use read::Reads;
use stats_file::StatsFile;

/// Completed objects waiting to have a backing id opened ahead, at most.
const PREOPEN_QUEUE: usize = 4096;

/// `max_write` asked at INIT (see `init`).
const MAX_WRITE: u32 = 1 << 20;

/// The extended attribute that shows a file's ETag.
pub(crate) const ETAG_XATTR: &str = "user.riffle.etag";

/// Ownership, permissions and tuning of the mounted tree.
#[derive(Debug, Clone)]
pub(crate) struct FsConfig {
    pub uid: u32,
    pub gid: u32,
    pub file_mode: u16,
    pub dir_mode: u16,
    pub read_ahead: ReadAheadConfig,
    /// Largest read the kernel sends and its own read-ahead, in bytes.
    pub kernel_read_ahead: u32,
    /// Hand fully cached files to the kernel (FUSE passthrough) when it allows it.
    pub passthrough: bool,
    /// With passthrough, a lookup of a cached file up to this size starts a readahead of its
    /// cache file ([`lookahead`]); 0: never.
    pub lookup_readahead: u64,
    /// Passthrough backing files kept after their last close, at most ([`backings`]).
    pub max_idle_backings: usize,
    /// Ask the kernel for FUSE over io_uring at INIT ([`transport`]).
    pub io_uring: bool,
}

/// Counters and modes of the FUSE layer, shared with `riffle stats`.
#[derive(Debug, Default)]
pub(crate) struct FsStatus {
    pub opens: AtomicU64,
    pub passthrough_opens: AtomicU64,
    /// Passthrough opens answered on the FUSE thread from a idle backing id.
    pub fast_opens: AtomicU64,
    /// Backing ids opened ahead, as objects completed in the cache.
    pub opened_ahead: AtomicU64,
    /// Backing files kept for reopening, now.
    pub idle_backings: Arc<AtomicU64>,
    /// Backing files kept for reopening, at most (`FsConfig::max_idle_backings`).
    pub max_idle_backings: AtomicU64,
    /// Why passthrough is not in use, or "enabled".
    pub passthrough_mode: Mutex<String>,
    /// Readaheads of small cached files started by lookups ([`lookahead`]).
    pub lookahead: Arc<LookaheadStats>,
    /// Whether directory reads carry attributes ([`dirplus`]).
    pub dirplus: dirplus::DirPlus,
    /// The kernel's read-ahead window for the mount's files, and why ([`bdi`]).
    pub kernel_read_ahead: Mutex<String>,
    /// `/dev/fuse` or io_uring, and why ([`transport`]).
    pub transport: transport::TransportStatus,
    /// `/dev/fuse` descriptors the session's threads read: the first and its clones.
    pub fuse_devices: AtomicU64,
}

/// See the module documentation.
pub(crate) struct RiffleFs {
    /// The namespace, the modes shown, the counters and the stats file ([`meta`]).
    meta: Arc<Meta>,
    fetcher: Arc<Fetcher>,
    runtime: tokio::runtime::Handle,
    handles: Arc<Handles>,
    next_fh: AtomicU64,
    prefetch: Arc<Prefetcher>,
    ops: Arc<FuseOps>,
    passthrough: Arc<std::sync::atomic::AtomicBool>,
    /// The session's `/dev/fuse`, for opening backing ids ahead ([`preopen`]).
    device: FuseDevice,
    /// Readahead of small cached files at lookup ([`lookahead`]).
    lookahead: Option<Lookahead>,
}

/// The running kernel's release (`uname -r`), for saying why passthrough is off.
pub(crate) fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|r| r.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

impl RiffleFs {
    pub fn new(
        ns: Arc<Namespace>,
        fetcher: Arc<Fetcher>,
        prefetch: Arc<Prefetcher>,
        ops: Arc<FuseOps>,
        runtime: tokio::runtime::Handle,
        config: FsConfig,
        status: Arc<FsStatus>,
    ) -> Self {
        status
            .max_idle_backings
            .store(config.max_idle_backings as u64, Ordering::Relaxed);
        let handles = Arc::new(Handles::new(
            config.max_idle_backings,
            status.idle_backings.clone(),
        ));
        if let Some(disk) = fetcher.disk() {
            // An evicted file must not live on in the kernel through a idle backing file.
            let handles = Arc::downgrade(&handles);
            disk.cache().on_evicted(move |keys| {
                if let Some(handles) = handles.upgrade() {
                    for key in keys {
                        handles.kept.forget(key);
                    }
                }
            });
        }
        let meta = Arc::new(Meta {
            ns,
            config,
            status,
            stats_file: Arc::default(),
        });
        RiffleFs {
            meta,
            handles,
            prefetch,
            ops,
            passthrough: Arc::default(),
            fetcher,
            runtime,
            device: FuseDevice::default(),
            next_fh: AtomicU64::new(1),
            lookahead: None,
        }
    }

    fn new_fh(&self) -> u64 {
        match self.handles.table.get() {
            Some(table) => table.next_fh(),
            None => self.next_fh.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Forgets handle `fh` of `node` (the kernel released it; one it does not know changes
    /// nothing).
    fn release_handle(&self, node: Node, fh: u64) {
        match node {
            Node::Stats => self.meta.stats_file.release(fh),
            Node::Object(ino) => {
                self.handles.release(fh, ino);
                self.prefetch.on_release();
            }
        }
    }

    fn reads(&self) -> Reads {
        Reads {
            ns: self.meta.ns.clone(),
            fetcher: self.fetcher.clone(),
            handles: self.handles.clone(),
        }
    }

    /// Records every open file handle in `table` from now on, and takes its handle numbers
    /// from it, so a successor daemon can serve them ([`handover`]). Before the session runs.
    pub fn keep_handles_in(&self, table: Arc<HandleTable>) {
        let _ = self.handles.table.set(table);
    }

    /// Where the mount puts a duplicate of the session's `/dev/fuse` descriptor once the
    /// session exists; with it, backing ids are opened ahead of the opens that use them.
    pub fn fuse_device(&self) -> FuseDevice {
        self.device.clone()
    }

    /// The mount's `.riffle-stats` file; the mount gives it its stats source once the
    /// control handler exists.
    pub fn stats_file(&self) -> Arc<StatsFile> {
        self.meta.stats_file.clone()
    }

    /// Sets passthrough and the lookup readahead up, given whether the connection has
    /// passthrough (`Err`: why not); at INIT, or from a predecessor's INIT parameters.
    fn configure(&mut self, negotiated: Result<(), String>) {
        let mode = if !self.meta.config.passthrough {
            "off (--no-passthrough)".to_string()
        } else if self.fetcher.disk().is_none() {
            "off (no --cache-dir)".to_string()
        } else if let Err(why) = negotiated {
            why
        } else {
            self.passthrough.store(true, Ordering::Relaxed);
            self.start_preopen();
            "enabled".to_string()
        };
        // With passthrough or without it (see `look_ahead` and `look_ahead_for_daemon`).
        if self.meta.config.lookup_readahead > 0 && self.fetcher.disk().is_some() {
            self.lookahead = Some(Lookahead::new(self.meta.status.lookahead.clone()));
        }
        tracing::info!(passthrough = %mode, "FUSE passthrough");
        *self.meta.status.passthrough_mode.lock() = mode;
    }

    /// Starts opening backing ids ahead for objects as they complete in the cache.
    fn start_preopen(&self) {
        let Some(disk) = self.fetcher.disk() else {
            return;
        };
        let completions = disk.completions(PREOPEN_QUEUE);
        self.runtime.spawn(preopen::run(
            completions,
            self.fetcher.clone(),
            self.handles.clone(),
            self.device.clone(),
            self.meta.status.clone(),
        ));
    }
}

impl Filesystem for RiffleFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let wanted = InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_AUTO_INVAL_DATA;
        for flag in wanted.iter() {
            if config.add_capabilities(flag).is_err() {
                tracing::debug!(?flag, "kernel does not offer this FUSE capability");
            }
        }
        let negotiated = if !self.meta.config.passthrough || self.fetcher.disk().is_none() {
            Ok(()) // `configure` says why it is off
        } else if config
            .add_capabilities(InitFlags::FUSE_PASSTHROUGH)
            .is_err()
        {
            Err(format!(
                "unsupported by this kernel (Linux {}; passthrough needs 6.9+)",
                kernel_release()
            ))
        } else if let Err(e) = config.set_max_stack_depth(2) {
            Err(format!("unsupported (stack depth {e})"))
        } else {
            Ok(())
        };
        self.configure(negotiated);
        if self.meta.config.io_uring
            && config
                .add_capabilities(InitFlags::FUSE_OVER_IO_URING)
                .is_err()
        {
            tracing::info!("the kernel does not offer FUSE over io_uring at INIT");
        }
        let _ = config.set_max_readahead(self.meta.config.kernel_read_ahead);
        // Nothing is ever written: 1 MiB (the largest read the kernel sends) instead of
        // fuser's 16 MiB keeps each io_uring entry's payload buffer at 1 MiB.
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        tracing::info!(abi = ?config.kernel_abi(), "FUSE session initialised");
        if let Some(table) = self.handles.table.get() {
            let abi = config.kernel_abi();
            let params = InitParams {
                abi: (abi.0, abi.1),
                offered: config.capabilities().bits(),
                requested: config.requested().bits(),
                made_by: format!("riffle {}", env!("CARGO_PKG_VERSION")),
            };
            let saved = serde_json::to_vec(&params)
                .map_err(std::io::Error::other)
                .and_then(|json| table.set_params(&json).map_err(std::io::Error::other));
            if let Err(e) = saved {
                tracing::warn!(error = %e, "INIT parameters not saved; a successor daemon cannot take this mount over");
            }
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let timer = self.ops.start(FuseOp::Lookup);
        let send = |reply: ReplyEntry, answer: Result<Entry, Errno>| match answer {
            Ok(e) => reply.entry(&e.ttl, &e.attr, Generation(0)),
            Err(e) => reply.error(e),
        };
        let Some(name) = name.to_str().map(str::to_string) else {
            return send(reply, Err(Errno::ENOENT));
        };
        if let Some(found) = self.meta.ns.lookup_cached(parent.0, &name) {
            let _timer = timer;
            let answer = self.meta.looked_up(parent.0, &name, &found);
            let Ok(attr) = &found else {
                return send(reply, answer);
            };
            let read_ahead = self.look_ahead(attr);
            send(reply, answer);
            match read_ahead {
                Some((lookahead, job)) => lookahead.run(job),
                None => self.look_ahead_for_daemon(attr),
            }
            return;
        }
        let meta = self.meta.clone();
        self.runtime.spawn(async move {
            let _timer = timer;
            send(reply, meta.lookup(parent.0, &name).await);
        });
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let timer = self.ops.start(FuseOp::Getattr);
        let send = |reply: ReplyAttr, answer: Result<Entry, Errno>| match answer {
            Ok(e) => reply.attr(&e.ttl, &e.attr),
            Err(e) => reply.error(e),
        };
        let node = Node::of(ino.0);
        if let Some(answer) = self.meta.getattr_now(node, fh.map(|f| f.0)) {
            let _timer = timer;
            return send(reply, answer);
        }
        let meta = self.meta.clone();
        self.runtime.spawn(async move {
            let _timer = timer;
            send(reply, meta.getattr(ino.0).await);
        });
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let timer = self.ops.start(FuseOp::Open);
        let send = |reply: ReplyOpen, answer: OpenAnswer| match answer {
            OpenAnswer::Passthrough { fh, backing } => {
                reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &backing)
            }
            OpenAnswer::Served { fh, flags } => reply.opened(FileHandle(fh), flags),
            OpenAnswer::Stale => reply.error(Errno::ESTALE),
            OpenAnswer::Error(e) => reply.error(e),
        };
        if flags.acc_mode() != OpenAccMode::O_RDONLY || flags.0 & libc::O_TRUNC != 0 {
            return send(reply, OpenAnswer::Error(Errno::EROFS));
        }
        let fh = self.new_fh();
        let ino = match Node::of(ino.0) {
            Node::Stats => {
                // Renders the document: on the blocking pool.
                let stats = self.meta.stats_file.clone();
                self.runtime
                    .spawn_blocking(move || send(reply, stats.open(fh)));
                return;
            }
            Node::Object(ino) => ino,
        };
        let caller = req.pid();
        let opener = self.opener();
        if let Some(answer) = opener.open_now(ino, fh, caller, &reply) {
            let _timer = timer;
            return send(reply, answer);
        }
        self.runtime.spawn(async move {
            let _timer = timer;
            let answer = opener.open_later(ino, fh, caller, &reply).await;
            send(reply, answer);
        });
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let timer = self.ops.start(FuseOp::Read);
        let send = |reply: ReplyData, answer: Result<Bytes, Errno>| match answer {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        };
        let ino = match Node::of(ino.0) {
            Node::Stats => return send(reply, self.meta.stats_file.read(fh.0, offset, size)),
            Node::Object(ino) => ino,
        };
        let Some(reader) = self.handles.reader(fh.0) else {
            return send(reply, Err(Errno::EBADF));
        };
        let range = reader.begin_read(offset, size);
        let object = reader.object().clone();
        let reads = self.reads();
        let runtime = self.runtime.clone();
        // Bytes already cached are answered without a task (`Fetcher::read_quick`); the rest,
        // and anything that went wrong there, go through one (module `read`).
        self.fetcher
            .read_quick(&object, range.clone(), move |quick| {
                if let Some(data) = quick {
                    let _timer = timer;
                    return send(reply, Ok(data));
                }
                runtime.spawn(async move {
                    let _timer = timer;
                    send(reply, reads.read(ino, &reader, range, offset, size).await);
                });
            });
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _timer = self.ops.start(FuseOp::Release);
        self.release_handle(Node::of(ino.0), fh.0);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let timer = self.ops.start(FuseOp::Opendir);
        let fh = self.new_fh();
        let ns = self.meta.ns.clone();
        let handles = self.handles.clone();
        self.runtime.spawn(async move {
            let _timer = timer;
            match ns.readdir(ino.0).await {
                Ok(entries) => {
                    handles.insert_dir(fh, entries);
                    reply.opened(FileHandle(fh), FopenFlags::empty());
                }
                Err(e) => reply.error(ns_errno(&e)),
            }
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _timer = self.ops.start(FuseOp::Readdir);
        let entries = match self.dir_handle(ino.0, fh.0) {
            Ok(entries) => entries,
            Err(e) => return reply.error(e),
        };
        let parent = self.meta.ns.parent_of(ino.0);
        self.meta.ns.with_entries(|nodes| {
            let name_of = |e: &DirEntry| nodes.name(e);
            walk_listing(&entries, ino.0, parent, offset, name_of, |e, name, next| {
                let kind = if e.is_dir() {
                    FileType::Directory
                } else {
                    FileType::RegularFile
                };
                reply.add(INodeNo(e.ino()), next, kind, name)
            })
        });
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _timer = self.ops.start(FuseOp::Readdirplus);
        let entries = match self.dir_handle(ino.0, fh.0) {
            Ok(entries) => entries,
            Err(e) => return reply.error(e),
        };
        let ttl = self.meta.ttl();
        let parent = self.meta.ns.parent_of(ino.0);
        // `walk_listing` stops after `.` and `..` (offset 2) for a names-only first read.
        let names_only = self.names_only(ino.0, offset, &entries);
        self.meta.ns.with_entries(|nodes| {
            let name_of = |e: &DirEntry| nodes.name(e);
            walk_listing(&entries, ino.0, parent, offset, name_of, |e, name, next| {
                if names_only && next > 2 {
                    return true;
                }
                let stat = nodes.stat(e.ino()).unwrap_or(Stat {
                    size: None,
                    mtime: SystemTime::UNIX_EPOCH,
                });
                let attr = Self::stat_attr(&self.meta.config, e.ino(), stat);
                reply.add(INodeNo(e.ino()), next, name, &ttl, &attr, Generation(0))
            })
        });
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let _timer = self.ops.start(FuseOp::Releasedir);
        self.handles.release_dir(fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _timer = self.ops.start(FuseOp::Statfs);
        let bsize = 4096;
        reply.statfs(
            1 << 32,
            0,
            0,
            self.meta.ns.inode_count(),
            0,
            bsize,
            255,
            bsize,
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _timer = self.ops.start(FuseOp::Getxattr);
        match self.xattr(Node::of(ino.0), name) {
            Ok(value) => xattr_reply(reply, value.as_bytes(), size),
            Err(e) => reply.error(e),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _timer = self.ops.start(FuseOp::Listxattr);
        match self.xattr_names(Node::of(ino.0)) {
            Ok(names) => xattr_reply(reply, names, size),
            Err(e) => reply.error(e),
        }
    }

    // Fixed answers (module `fixed`); the module documentation says why each is what it is.
    fixed_answers! {
        /// ENOSYS: the kernel stops sending FLUSH for this mount, so close() costs no round trip.
        fn flush(INodeNo, FileHandle, LockOwner): ReplyEmpty => Flush, error(Errno::ENOSYS);
        /// Nothing to write.
        fn fsync(INodeNo, FileHandle, bool): ReplyEmpty => Fsync, ok();
        /// Nothing to write.
        fn fsyncdir(INodeNo, FileHandle, bool): ReplyEmpty => Fsync, ok();
        /// What a regular file answers to TCGETS and every other ioctl it does not know.
        fn ioctl(INodeNo, FileHandle, IoctlFlags, u32, &[u8], u32): ReplyIoctl
            => Ioctl, error(Errno::ENOTTY);
        /// ENOSYS: the kernel stops asking and answers SEEK_DATA/SEEK_HOLE itself (no holes).
        fn lseek(INodeNo, FileHandle, i64, i32): ReplyLseek => Other, error(Errno::ENOSYS);
        /// ENOSYS: the kernel stops asking and reports the file always ready, as for ext4.
        fn poll(INodeNo, FileHandle, PollNotifier, PollEvents, PollFlags): ReplyPoll
            => Other, error(Errno::ENOSYS);
        /// ENOSYS: the kernel stops asking and copies by reading and writing.
        fn copy_file_range(
            INodeNo, FileHandle, u64, INodeNo, FileHandle, u64, u64, CopyFileRangeFlags,
        ): ReplyWrite => Other, error(Errno::ENOSYS);
        /// Only sent if POSIX locks were negotiated (they are not): the kernel locks locally.
        fn getlk(INodeNo, FileHandle, LockOwner, u64, u64, i32, u32): ReplyLock
            => Other, error(Errno::ENOSYS);
        /// As `getlk`.
        fn setlk(INodeNo, FileHandle, LockOwner, u64, u64, i32, u32, bool): ReplyEmpty
            => Other, error(Errno::ENOSYS);
        /// ENOSYS: the kernel remembers it and stops asking.
        fn bmap(INodeNo, u32, u64): ReplyBmap => Other, error(Errno::ENOSYS);
        /// The tree has no symbolic links; readlink(2) of anything else is EINVAL.
        fn readlink(INodeNo): ReplyData => Readlink, error(Errno::EINVAL);
        /// Succeeds: nothing is refused here.
        fn access(INodeNo, fuser::AccessFlags): ReplyEmpty => Access, ok();

        // Everything below would modify the tree: the filesystem is read-only.

        fn setattr(
            INodeNo, Option<u32>, Option<u32>, Option<u32>, Option<u64>, Option<TimeOrNow>,
            Option<TimeOrNow>, Option<SystemTime>, Option<FileHandle>, Option<SystemTime>,
            Option<SystemTime>, Option<SystemTime>, Option<fuser::BsdFileFlags>,
        ): ReplyAttr => Modify, error(Errno::EROFS);
        fn mknod(INodeNo, &OsStr, u32, u32, u32): ReplyEntry => Modify, error(Errno::EROFS);
        fn mkdir(INodeNo, &OsStr, u32, u32): ReplyEntry => Modify, error(Errno::EROFS);
        fn unlink(INodeNo, &OsStr): ReplyEmpty => Modify, error(Errno::EROFS);
        fn rmdir(INodeNo, &OsStr): ReplyEmpty => Modify, error(Errno::EROFS);
        fn symlink(INodeNo, &OsStr, &std::path::Path): ReplyEntry
            => Modify, error(Errno::EROFS);
        fn rename(INodeNo, &OsStr, INodeNo, &OsStr, fuser::RenameFlags): ReplyEmpty
            => Modify, error(Errno::EROFS);
        fn link(INodeNo, INodeNo, &OsStr): ReplyEntry => Modify, error(Errno::EROFS);
        fn write(INodeNo, FileHandle, u64, &[u8], WriteFlags, OpenFlags, Option<LockOwner>)
            : ReplyWrite => Modify, error(Errno::EROFS);
        fn create(INodeNo, &OsStr, u32, u32, i32): fuser::ReplyCreate
            => Modify, error(Errno::EROFS);
        fn setxattr(INodeNo, &OsStr, &[u8], i32, u32): ReplyEmpty => Modify, error(Errno::EROFS);
        fn removexattr(INodeNo, &OsStr): ReplyEmpty => Modify, error(Errno::EROFS);
        fn fallocate(INodeNo, FileHandle, u64, u64, i32): ReplyEmpty
            => Modify, error(Errno::EROFS);
    }
}
