//! `riffle fd-store`: keeps a copy of mounts' FUSE connections, so that a mount outlives its
//! keeper and daemon dying together (in Kubernetes: the mounter container restarted, while
//! the store runs in the plugin's container).
//!
//! Keepers started with `--fd-store SOCKET` give the store their mount's bundle under a key
//! naming the mount (`HOLD 1 KEY`, see `fs::handover::protocol`) and keep the connection open:
//! while it is open the keeper holds the lease, and no one else may take the bundle. When the
//! keeper dies its lease ends; a keeper started again for the same mountpoint takes the
//! bundle (`TAKE 1 KEY`) and its daemon serves the live connection on. A keeper whose mount
//! ended drops its key (`DROP 1 KEY`); the store also forgets, every [`SWEEP_EVERY`], any
//! connection the kernel has ended (unmounted while no keeper ran). A store that restarts
//! starts empty, and the keepers give it their bundles again.
//!
//! The socket is created mode 0600 and each connection's peer (`SO_PEERCRED`) must be this
//! process's own user: a FUSE descriptor lets its holder answer for the whole mount.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use nix::sys::socket::{getsockopt, sockopt};
use parking_lot::Mutex;

use super::args::FdStoreArgs;
use crate::fs::handover::protocol::{self, connection_gone, Store};

/// How often ended connections are forgotten.
pub const SWEEP_EVERY: Duration = Duration::from_secs(10);

pub fn run(args: &FdStoreArgs) -> anyhow::Result<()> {
    let listener = bind(&args.socket)?;
    let store = Arc::new(Mutex::new(Store::default()));
    {
        let store = store.clone();
        std::thread::Builder::new()
            .name("fd-store-sweep".into())
            .spawn(move || loop {
                std::thread::sleep(SWEEP_EVERY);
                let gone = store.lock().sweep(connection_gone);
                if gone > 0 {
                    eprintln!("riffle fd-store: forgot {gone} ended mount(s)");
                }
            })
            .context("cannot start the sweep thread")?;
    }
    eprintln!("riffle fd-store: serving {}", args.socket.display());
    let clients = AtomicU64::new(1);
    let own = nix::unistd::geteuid().as_raw();
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                eprintln!("riffle fd-store: accept: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        match getsockopt(&stream, sockopt::PeerCredentials) {
            Ok(cred) if cred.uid() == own => {}
            Ok(cred) => {
                eprintln!(
                    "riffle fd-store: refused a connection from uid {}",
                    cred.uid()
                );
                continue;
            }
            Err(e) => {
                eprintln!("riffle fd-store: cannot identify a peer: {e}");
                continue;
            }
        }
        let client = clients.fetch_add(1, Ordering::Relaxed);
        let store = store.clone();
        let spawned = std::thread::Builder::new()
            .name("fd-store-client".into())
            .spawn(move || serve(OwnedFd::from(stream), client, &store));
        if let Err(e) = spawned {
            eprintln!("riffle fd-store: cannot start a client thread: {e}");
        }
    }
    Ok(())
}

/// A seqpacket listener at `path`. A stale socket file is replaced; while another store still
/// answers on it (a rollout that starts the new store before the old one stops), this waits
/// for it to go: the old store's holders give their connections to this one once it serves.
fn bind(path: &std::path::Path) -> anyhow::Result<UnixListener> {
    use nix::sys::socket::{
        bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType, UnixAddr,
    };
    let mut said = false;
    while protocol::connect(path).is_ok() {
        if !said {
            eprintln!(
                "riffle fd-store: another fd store serves {}; waiting for it to stop",
                path.display()
            );
            said = true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = std::fs::remove_file(path);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let fd = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .context("cannot create the store's socket")?;
    let addr = UnixAddr::new(path).context("socket path")?;
    bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr)
        .with_context(|| format!("cannot listen on {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    listen(&fd, Backlog::new(64).context("backlog")?).context("listen")?;
    Ok(UnixListener::from(fd))
}

/// Answers one client until it disconnects; its leases then end.
fn serve(socket: OwnedFd, client: u64, store: &Mutex<Store>) {
    let _ = protocol::serve_client(socket.as_fd(), |message, fds| {
        store.lock().answer(client, message, fds)
    });
    store.lock().disconnected(client);
}
