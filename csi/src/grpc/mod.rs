//! The CSI gRPC services kubelet calls, and the socket they are served on.
//!
//! - [`proto`]: generated CSI v1 types and service stubs.
//! - [`identity`], [`node`]: the Identity and Node services; [`volume_stats`]:
//!   NodeGetVolumeStats, from the mount's `.riffle-stats`.
//! - [`server`]: the unix socket and the plugin's start-up; [`old_clients`]: a WARN for
//!   clients the HTTP/2 server rejects.

pub mod identity;
pub mod node;
pub mod old_clients;
pub mod proto;
pub mod server;
pub mod volume_stats;
