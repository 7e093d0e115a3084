//! Mount daemons that outlive the plugin's container.
//!
//! In Kubernetes a container restart kills every process of the container.
//! If the `riffle mount` daemons were children of the `riffle-csi`
//! container, every rollout of the plugin, and every crash or OOM kill of
//! it, would kill every FUSE daemon on the node at once, and pods would get
//! `ENOTCONN` on every read. So the daemons live in a second, long-lived
//! container: the **mounter** (`riffle-mounter`, its own DaemonSet; it holds
//! no CSI logic and changes rarely). The mounter's own restarts cost no read
//! either: the node's fd store, in the plugin's pod, keeps a copy of every
//! daemon's FUSE connection, and a new mounter's daemons take the mounts over
//! ([`crate::volumes`]), so its DaemonSet rolls like any other.
//!
//! The plugin keeps everything that changes often (the CSI services, volume
//! records, reconciliation, the supervisor) and asks the mounter to do the
//! four things of the [`Mounter`](crate::mounter::Mounter) trait over a
//! root-only unix socket in a hostPath both containers share:
//! - [`protocol`]: one JSON request and one JSON response per connection;
//!   no secret travels: a mount request names the files on the secrets
//!   tmpfs the daemon reads ([`crate::mounter::DaemonCredentials`]); only
//!   requests of plugins before that carry keys, in the body, never in a pod
//!   spec, an argument or an environment variable the API server knows of;
//! - [`client`]: [`client::RemoteMounter`], the plugin's `Mounter`;
//! - [`service`]: the mounter's server, which checks the caller's uid and
//!   hands each request to a local mounter ([`crate::mounter::riffle::RiffleMounter`]
//!   in production, [`crate::mounter::fake::FakeMounter`] in tests).
//!
//! Daemon ids (pid + start time) are those of the mounter's PID namespace;
//! the plugin only stores them and passes them back, so the two containers
//! need not share a PID namespace (no `hostPID`). Pid files and logs are in
//! the shared state directory, at the same path in both containers.
//!
//! Why not a pod per volume (Mountpoint's CSI driver v2, JuiceFS's mount
//! pods): that needs API-server access and RBAC to create pods from every
//! node, adds a pod start (image pull, scheduling) to every publish, and
//! still cannot keep a connection alive across the mounter's own restart.
//! A mounter DaemonSet gives the same protection against what actually
//! happens often (plugin upgrades and crashes) with a local socket hop of a
//! millisecond per call. What it does not protect against is a restart of
//! the mounter itself, which ends its daemons: see `deploy/kubernetes`.

pub mod client;
pub mod protocol;
pub mod service;
