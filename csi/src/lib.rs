//! rifflefs CSI node plugin.
//!
//! Kubernetes (kubelet) talks to this plugin over a unix socket with the CSI
//! Identity and Node gRPC services. `NodePublishVolume` starts a `riffle
//! mount` daemon that mounts an S3/Ceph bucket read-only at the pod's target
//! path; `NodeUnpublishVolume` unmounts it. There is no controller service:
//! volumes are provisioned statically (PV + PVC) or inline in a pod spec.
//!
//! Layout, one folder per job (`tests/layers.py csi/src` checks that none imports a
//! higher one):
//! - [`kube`]: what a volume asks for (settings, credentials, whose identity it reads with).
//! - [`node_state`]: what the plugin keeps on the node (volume records, secrets on tmpfs,
//!   the node cache's budget, per-target locks, the mount table).
//! - [`mounter`]: the `Mounter` trait; `riffle` runs the real `riffle` binary, `fake` is an
//!   in-memory double for tests, processes, exited children, peer flags, and `metrics`:
//!   every daemon's Prometheus metrics on one mounter port; [`remote`]: the
//!   plugin-to-`riffle-mounter` protocol, so that the daemons outlive the plugin's
//!   container (rollouts, crashes).
//! - [`volumes`]: publish / unpublish / stage / recover, one target at a time, and the
//!   supervisor (start-up reconciliation, the periodic health loop).
//! - [`grpc`]: the CSI Identity and Node services and their socket.
//! - [`log_forward`]: the daemons' logs to the mounter's standard output; [`startup`]:
//!   logging and stop signals of the two binaries.

pub mod grpc;
pub mod kube;
pub mod log_forward;
pub mod mounter;
pub mod node_state;
pub mod remote;
pub mod startup;
pub mod volumes;

/// The CSI driver name, as registered with kubelet and in the CSIDriver object.
pub const DRIVER_NAME: &str = "riffle.csi.rifflefs.io";

/// The plugin's version, reported by GetPluginInfo.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
