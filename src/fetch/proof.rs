//! Read proofs at open ([`Fetcher::admit`]): whether this mount's principal may be served what
//! the NVMe cache holds of an object (filled, perhaps, under another credential). One GET of
//! the first byte with `If-Match`, shared by concurrent opens, and its answer recorded in the
//! cache's proof log ([`crate::cache::proofs`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::future::{FutureExt, Shared};

use super::{DiskTier, FetchError, Fetcher, ObjectVersion};
use crate::store::{RangeRequest, StoreError};

pub(super) type Proof = Shared<futures::future::BoxFuture<'static, Result<(), FetchError>>>;

impl Fetcher {
    /// Bytes `range` of `obj` (clamped to its size), fetching what is missing.
    /// Whether this mount may be served what the NVMe cache holds of `obj`; called at open.
    /// Asks the store only when the entry holds bytes and this mount's principal has no
    /// answer for it yet ([`crate::cache::proofs`]): one GET of the first byte with
    /// `If-Match`, shared by concurrent opens. `Err(NotPermitted)` on a refusal, now or
    /// remembered; `Err(Changed)` if the object is no longer that version; other errors
    /// of the proof request as they came (not remembered).
    pub(crate) async fn admit(self: &Arc<Self>, obj: &ObjectVersion) -> Result<(), FetchError> {
        let Some(disk) = &self.disk else {
            return Ok(());
        };
        let id = disk.identity(obj);
        let key = id.entry_key();
        if let Some(answer) = self.known_answer(disk, &key) {
            return answer;
        }
        // Nothing cached: nothing to prove (this mount's own GETs will be its proof).
        match disk.cache.status(&id).await {
            Ok(Some(status)) if status.blocks_present > 0 => {}
            _ => return Ok(()),
        }
        self.prove_once(obj).await
    }

    /// This mount's answer for `obj`: a proof or refusal it knows, or one proof request
    /// shared by concurrent callers.
    pub(super) async fn prove_once(
        self: &Arc<Self>,
        obj: &ObjectVersion,
    ) -> Result<(), FetchError> {
        let Some(disk) = &self.disk else {
            return Ok(());
        };
        let key = disk.entry_key(obj);
        let proof = {
            let mut proving = self.proving.lock();
            // A proof that finished while this one looked at the cache.
            if let Some(answer) = self.known_answer(disk, &key) {
                return answer;
            }
            proving
                .entry(key)
                .or_insert_with(|| {
                    let this = self.clone();
                    let obj = obj.clone();
                    async move {
                        let result = this.prove(&obj).await;
                        this.proving.lock().remove(&key);
                        result
                    }
                    .boxed()
                    .shared()
                })
                .clone()
        };
        proof.await
    }

    /// What this mount's proofs already say of `key` (a refusal counted), if anything.
    fn known_answer(
        &self,
        disk: &DiskTier,
        key: &crate::cache::EntryKey,
    ) -> Option<Result<(), FetchError>> {
        match disk.proofs.verdict(key)? {
            crate::cache::Verdict::MayRead => Some(Ok(())),
            crate::cache::Verdict::Refused => {
                self.stats.proofs_refused.fetch_add(1, Ordering::Relaxed);
                Some(Err(FetchError::NotPermitted))
            }
        }
    }

    /// One proof request for `obj` (see [`Self::admit`]), its answer recorded.
    async fn prove(&self, obj: &ObjectVersion) -> Result<(), FetchError> {
        let Some(disk) = &self.disk else {
            return Ok(());
        };
        let key = disk.entry_key(obj);
        self.stats.proof_requests.fetch_add(1, Ordering::Relaxed);
        match self
            .store
            .get_range(RangeRequest::of_version(&obj.key, 0..1, &obj.etag))
            .await
        {
            Ok(_) => {
                disk.proofs.record(key, crate::cache::Verdict::MayRead);
                Ok(())
            }
            Err(StoreError::AccessDenied(detail)) => {
                tracing::info!(key = %obj.key, %detail, "the store refused this mount's credential the object; its cached bytes are not served to this mount");
                disk.proofs.record(key, crate::cache::Verdict::Refused);
                self.stats.proofs_refused.fetch_add(1, Ordering::Relaxed);
                Err(FetchError::NotPermitted)
            }
            Err(e) => Err(e.into()),
        }
    }
}
