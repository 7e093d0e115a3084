//! What the plugin keeps on the node between calls and across restarts.
//!
//! - [`state`]: per-volume records persisted in the state dir (no secrets).
//! - [`secrets`]: the tmpfs where keys and tokens are kept for the daemons.
//! - [`cache_disk`]: refuses a node cache on the root disk; [`cache_shares`]: the node
//!   cache's one budget, shared out to the volumes.
//! - [`locks`]: one async mutex per target path; [`mountinfo`]: what is mounted where.

pub mod cache_disk;
pub mod cache_shares;
pub mod locks;
pub mod mountinfo;
pub mod secrets;
pub mod state;
