//! rifflefs CSI node plugin.
//!
//! Kubernetes (kubelet) talks to this plugin over a unix socket with the CSI
//! Identity and Node gRPC services. `NodePublishVolume` starts a `riffle
//! mount` daemon that mounts an S3/Ceph bucket read-only at the pod's target
//! path; `NodeUnpublishVolume` unmounts it. There is no controller service:
//! volumes are provisioned statically (PV + PVC) or inline in a pod spec.
//!
//! Layout, one job per module:
//! - [`proto`]: generated CSI v1 types and service stubs.
//! - [`settings`]: volume attributes + mount options -> validated settings.
//! - [`credentials`]: the `nodePublishSecretRef` secret -> credentials kept
//!   out of logs, arguments and error messages; [`access`]: whose identity a
//!   volume reads with (its secret, the pod's service account token and a
//!   role, or, if the driver allows it, the node's); [`secrets`]: the tmpfs
//!   where keys and tokens are kept for the daemons.
//! - [`mounter`]: the `Mounter` trait; [`riffle`] runs the real `riffle`
//!   binary, [`fake`] is an in-memory double for tests, [`remote`] asks the
//!   `riffle-mounter` container to do it, so that the daemons outlive the
//!   plugin's container (rollouts, crashes).
//! - [`mountinfo`] and [`process`]: what is mounted where, and whether a
//!   daemon process is still the one we started.
//! - [`state`]: per-volume records persisted in the state dir (no secrets).
//! - [`volumes`]: publish / unpublish / recover, one target at a time
//!   ([`locks`]: one async mutex per target path).
//! - [`supervisor`]: start-up reconciliation and the periodic health loop.
//! - [`volume_stats`]: NodeGetVolumeStats, from the mount's `.riffle-stats`;
//!   [`cache_disk`]: refuses a node cache on the root disk; [`cache_shares`]: the node
//!   cache's one budget, shared out to the volumes; [`log_forward`]: the
//!   daemons' logs to the mounter's standard output; [`metrics_proxy`]: every
//!   daemon's Prometheus metrics on one mounter port, labelled by volume.
//! - [`peers`]: the daemons' peer flags in Kubernetes (the ring of a
//!   volume's data, its port on every node, collisions on one node).
//! - [`identity`], [`node`]: the gRPC services; [`server`]: the unix socket;
//!   [`old_clients`]: a WARN for clients the HTTP/2 server rejects;
//!   [`startup`]: logging and stop signals of the two binaries.

pub mod access;
pub mod cache_disk;
pub mod cache_shares;
pub mod credentials;
pub mod fake;
pub mod identity;
pub mod locks;
pub mod log_forward;
pub mod metrics_proxy;
pub mod mounter;
pub mod mountinfo;
pub mod node;
pub mod old_clients;
pub mod peers;
pub mod process;
pub mod proto;
pub mod reaper;
pub mod remote;
pub mod riffle;
pub mod secrets;
pub mod server;
pub mod settings;
pub mod startup;
pub mod state;
pub mod supervisor;
pub mod volume_stats;
pub mod volumes;

/// The CSI driver name, as registered with kubelet and in the CSIDriver object.
pub const DRIVER_NAME: &str = "riffle.csi.rifflefs.io";

/// The plugin's version, reported by GetPluginInfo.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
