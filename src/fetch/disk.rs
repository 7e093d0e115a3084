//! The fetcher's NVMe tier: reading blocks from the disk cache before asking the store,
//! writing fetched blocks into it, pinning open objects, and handing complete, verified
//! cache files to FUSE passthrough.
//!
//! Every block a GET brings is written to the cache after its waiters were woken; writes are
//! limited to `WRITE_PERMITS` in flight, and a GET that outruns the disk waits for a permit,
//! which slows it down through TCP flow control instead of buffering without bound. Blocks that
//! miss memory are looked up here before any GET (the entry is loaded from disk on first use,
//! so a restarted daemon finds what an earlier one cached). An object with no entry gets an
//! empty one in the same trip to the blocking pool, so the writes after the GET find it open.
//!
//! Passthrough bypasses the daemon, and with it the per-block CRC check, so a cache file is
//! handed to the kernel only once this daemon knows all its blocks are good: either it wrote
//! every block itself from bytes it just fetched, or it has read the whole file back and every
//! block's CRC matched (done in the background at the first open after a restart; that open
//! and any before the check finishes are served by the daemon). Corruption that appears after
//! that point is not caught, as the daemon path does not catch it in a block it wrote or has
//! read back and checked (it reads such blocks in part, without the CRC: `cache::entry`).
//!
//! Cached bytes are served to this mount only with a read proof of its principal
//! ([`crate::cache::proofs`]): every block it fetches records one, and an entry another
//! principal filled is proved once with [`super::Fetcher::admit`] at open. Without a proof,
//! the blocks of an entry count as missing here (they are fetched, which proves them) and it
//! is never handed to passthrough.
//!
//! Objects this daemon completes or verifies are announced on a bounded channel
//! ([`DiskTier::completions`]), which the FUSE layer uses to register their cache files with
//! the kernel ahead of the next open.

use std::collections::HashSet;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{mpsc, Semaphore};

use super::ObjectVersion;
use crate::cache::{DataFile, DiskCache, EntryKey, ObjectIdentity, PinGuard, Principal, ProofLog};

/// Cache writes in flight at most (1 MiB blocks: this many MiB buffered).
const WRITE_PERMITS: usize = 64;

/// See the module documentation.
pub struct DiskTier {
    pub(super) cache: Arc<DiskCache>,
    endpoint: Arc<str>,
    bucket: Arc<str>,
    /// Complete entries being read back to verify them (the ones known good are marked in
    /// the cache's own records: `DiskCache::mark_known_good`).
    verifying: Mutex<HashSet<EntryKey>>,
    /// This mount's principal's read proofs.
    pub(super) proofs: ProofLog,
    pub(super) write_permits: Arc<Semaphore>,
    /// Where to announce objects this daemon completed in the cache ([`Self::completions`]).
    completed: Mutex<Option<mpsc::Sender<ObjectVersion>>>,
}

impl DiskTier {
    /// `endpoint` and `bucket` complete the identity of every object this mount reads;
    /// `principal` names who signs its requests ([`crate::store::s3::S3Store::principal_name`])
    /// and `proof_ttl` is how long the answer of a proof request lasts (the metadata TTL;
    /// `None`: indefinitely).
    pub fn new(
        cache: Arc<DiskCache>,
        endpoint: &str,
        bucket: &str,
        principal: &str,
        proof_ttl: Option<std::time::Duration>,
    ) -> Self {
        let proofs = ProofLog::open(cache.dir(), Principal::new(endpoint, principal), proof_ttl);
        DiskTier {
            cache,
            endpoint: Arc::from(endpoint),
            bucket: Arc::from(bucket),
            verifying: Mutex::new(HashSet::new()),
            proofs,
            write_permits: Arc::new(Semaphore::new(WRITE_PERMITS)),
            completed: Mutex::new(None),
        }
    }

    pub fn cache(&self) -> &Arc<DiskCache> {
        &self.cache
    }

    /// The cache identity of an object version this mount listed or HEADed itself.
    pub fn identity(&self, obj: &ObjectVersion) -> ObjectIdentity {
        ObjectIdentity::new(
            self.endpoint.clone(),
            self.bucket.clone(),
            obj.key.clone(),
            obj.etag.clone(),
            obj.size,
        )
    }

    /// Waits (at most `limit`) for the cache writes in flight to finish, so an unmount does
    /// not lose blocks that were already fetched.
    pub async fn flush(&self, limit: std::time::Duration) -> bool {
        let all = self.write_permits.acquire_many(WRITE_PERMITS as u32);
        matches!(tokio::time::timeout(limit, all).await, Ok(Ok(_)))
    }

    pub fn pin(&self, obj: &ObjectVersion) -> PinGuard {
        self.cache.pin(&self.identity(obj))
    }

    /// Pins `obj`'s entry without telling the eviction policy of a use yet
    /// ([`PinGuard::used`] does).
    pub fn pin_unused(&self, obj: &ObjectVersion) -> PinGuard {
        self.cache.pin_unused(&self.identity(obj))
    }

    /// The key of `obj`'s cache entry.
    pub fn entry_key(&self, obj: &ObjectVersion) -> EntryKey {
        self.identity(obj).entry_key()
    }

    /// Whether this mount has a read proof for `obj`, so its cached bytes may be served.
    pub fn may_serve(&self, obj: &ObjectVersion) -> bool {
        self.proofs.may_read(&self.entry_key(obj))
    }

    /// This mount's principal's proofs.
    pub fn proofs(&self) -> &ProofLog {
        &self.proofs
    }

    /// Notes that this mount fetched bytes of `id` from the store: a read proof.
    pub(super) fn fetched(&self, id: &ObjectIdentity) {
        self.proofs.record_read(id.entry_key());
    }

    /// Notes that this daemon wrote a block of `id`; announces the object if that completed it.
    pub(super) fn wrote(&self, id: &ObjectIdentity) {
        if self.cache.is_complete(id) {
            self.known_good(id);
        }
    }

    /// Records that every block of `id` is known good (written here, or read back whole) and,
    /// the first time, announces it to the completions listener. Both ways lead here, so an
    /// object verified by an open's background check while its last block was being written
    /// is announced too.
    fn known_good(&self, id: &ObjectIdentity) {
        if !self.cache.mark_known_good(id) {
            return;
        }
        if let Some(tx) = &*self.completed.lock() {
            // Full: the listener lags; it is only an optimisation, so drop it.
            let _ = tx.try_send(ObjectVersion {
                key: id.key.clone(),
                etag: id.etag.clone(),
                size: id.size,
            });
        }
    }

    /// From now on, every object this daemon completes or verifies in the cache (complete and
    /// known good, so ready for passthrough) is sent here, as long as the channel has room
    /// (`capacity`).
    /// Replaces an earlier listener.
    pub fn completions(&self, capacity: usize) -> mpsc::Receiver<ObjectVersion> {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        *self.completed.lock() = Some(tx);
        rx
    }

    /// The cache file of `obj` for passthrough, if it is complete and known good, or if it is
    /// a small file (one block) that checks good now; otherwise `None`, after starting a
    /// background check of a complete file not yet verified. Never one this mount has no read
    /// proof for.
    pub async fn passthrough_file(self: &Arc<Self>, obj: &ObjectVersion) -> Option<DataFile> {
        let id = self.identity(obj);
        let key = id.entry_key();
        if !self.proofs.may_read(&key) {
            return None;
        }
        if self.cache.is_known_good(&id) {
            return self.known_good_file(&id).await;
        }
        // A small file cached before a restart: checked now, so this open gets passthrough
        // too. Marked known good without announcing it: this open registers the file itself.
        // By name when the start-up scan has recorded its entry, else below once loaded.
        if let Ok(Some(file)) = self.cache.open_checked_one_block(&id).await {
            return Some(file);
        }
        let complete = match self.cache.status(&id).await {
            Ok(Some(status)) => status.complete,
            _ => false,
        };
        if complete && self.cache.block_count(id.size) == 1 {
            // A small file the cache's start-up scan had not reached (its journal is loaded
            // now): checked on the spot too, and not announced, as above.
            if !self.verify(&id).await {
                return None;
            }
            self.cache.mark_known_good(&id);
            return self.known_good_file(&id).await;
        }
        if complete && self.verifying.lock().insert(key) {
            let this = self.clone();
            tokio::spawn(async move {
                let good = this.verify(&id).await;
                this.verifying.lock().remove(&key);
                if good {
                    this.known_good(&id);
                }
            });
        }
        None
    }

    /// The data file of `id`, complete and known good: the open entry's own descriptor,
    /// duplicated, or else the file opened anew.
    async fn known_good_file(&self, id: &ObjectIdentity) -> Option<DataFile> {
        if let Some(file) = self.cache.complete_data_file(id) {
            return Some(file);
        }
        self.cache.open_complete(id).await.ok().flatten()
    }

    /// Reads every block back (each read checks its CRC32C and drops a bad block).
    async fn verify(&self, id: &ObjectIdentity) -> bool {
        let blocks = self.cache.block_count(id.size);
        for index in 0..blocks {
            match self.cache.read_block(id, index).await {
                Ok(Some(_)) => {}
                _ => return false,
            }
        }
        true
    }
}
