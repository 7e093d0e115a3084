//! A real [`MountMetrics`] for the tests that check the stats tree against the declarations:
//! a memory store, a disk cache and a peer ring, so every section is present.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::MountMetrics;
use crate::cache::{CacheConfig, DiskCache, SizeLimit};
use crate::fetch::peer::{Membership, PeerConfig, Peers, Secret};
use crate::fetch::{DiskTier, FetchConfig, Fetcher};
use crate::fs::FsStatus;
use crate::namespace::{MetadataTtl, Namespace};
use crate::store::memory::MemoryStore;
use crate::store::retry::{RetryPolicy, RetryingStore};
use crate::store::ObjectStore;

/// A mount of one 10-byte object with a 64 MiB disk cache in `dir`, one static peer and
/// passthrough enabled; call inside a tokio runtime.
pub(crate) fn mount_metrics(dir: &Path) -> Arc<MountMetrics> {
    let memory = Arc::new(MemoryStore::new());
    memory.put("a/b.bin", vec![7u8; 10]);
    let retrying = Arc::new(RetryingStore::new(memory, RetryPolicy::default()));
    let store: Arc<dyn ObjectStore> = retrying.clone();
    let ns = Namespace::new(store.clone(), "", MetadataTtl::Indefinite);
    let cache = DiskCache::open(CacheConfig::new(dir, SizeLimit::Bytes(64 << 20))).expect("cache");
    let disk = Arc::new(DiskTier::new(cache, "memory", "bucket", "key:test", None));
    let fetcher = Fetcher::new(
        store,
        FetchConfig::default(),
        tokio::runtime::Handle::current(),
        Some(disk),
    );
    // With peers, so their section is there too.
    fetcher.set_peers(Peers::new(PeerConfig {
        listen: None,
        members: Membership::Static(vec!["127.0.0.1:9".into()]),
        secret: Secret::from_bytes(b"0123456789abcdef"),
        timeout: Duration::from_secs(2),
        bucket: "bucket".into(),
        prefix: String::new(),
        principal: "00".repeat(16),
        block_size: 1 << 20,
        backoff: Duration::from_secs(1),
    }));
    let fs = Arc::new(FsStatus::default());
    *fs.passthrough_mode.lock() = "enabled".into();
    Arc::new(MountMetrics {
        source: "s3://bucket/".into(),
        started: Instant::now(),
        namespace: ns,
        fetcher,
        store: retrying,
        fs,
    })
}
