//! What a volume asks for, from Kubernetes: its settings and whose identity it reads with.
//!
//! - [`settings`]: volume attributes and mount options -> validated, canonical settings.
//! - [`credentials`]: the `nodePublishSecretRef` secret -> credentials kept out of logs,
//!   arguments and error messages.
//! - [`access`]: whose identity a volume reads with (its secret, the pod's service account
//!   token and a role, or, if the driver allows it, the node's).

pub mod access;
pub mod credentials;
pub mod settings;
