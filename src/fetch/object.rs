//! What the fetcher fetches: one version of one object (the key, the ETag every GET of it
//! carries in `If-Match`, and its size), and the blocks it is cut into. Every layer above
//! the store names object bytes this way: the namespace hands out versions at open, the
//! cache derives its entry identity from one, the prefetcher queues them.

use std::sync::Arc;

/// One version of one object: what blocks belong to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectVersion {
    pub key: Arc<str>,
    pub etag: Arc<str>,
    pub size: u64,
}

/// A block of an object version.
pub type BlockKey = (Arc<ObjectVersion>, u64);
