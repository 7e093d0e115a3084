//! The GET of one run of blocks: its body streamed into one buffer per block (sized by the
//! block: [`super::buffer`]), each block completed as soon as its last byte arrives; a body
//! that fails or ends early is finished with one plain (retried, length-checked) ranged GET
//! of the rest.

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::StreamExt;

use super::budget::Budget;
use super::buffer::Filling;
use super::claim::NewBlock;
use super::{FetchError, Fetcher, ObjectVersion};
use crate::store::RangeRequest;

impl Fetcher {
    /// Receives one GET's body and completes each block as soon as its last byte arrives.
    /// If the body fails or ends early, the rest of the run is fetched again with a plain
    /// (retried, length-checked) ranged GET. Each block is received into its own buffer
    /// ([`Filling`]: aligned when it can be written to the NVMe cache with `O_DIRECT`, else
    /// exactly its length), and takes its share of `budget`'s memory along to the cache
    /// write ([`Self::persist`]).
    pub(super) async fn stream_run(
        &self,
        obj: &Arc<ObjectVersion>,
        range: Range<u64>,
        run: Vec<NewBlock>,
        budget: &mut Budget,
    ) {
        let mut pending = run.into_iter().peekable();
        let mut failure: Option<FetchError> = None;
        match self
            .store
            .get_range_stream(RangeRequest::of_version(&obj.key, range.clone(), &obj.etag))
            .await
        {
            Err(e) => failure = Some(e.into()),
            Ok(mut chunks) => {
                self.read_from_store(obj);
                let mut buf: Option<Filling> = None;
                while let Some(chunk) = chunks.next().await {
                    let mut data = match chunk {
                        Ok(d) => d,
                        Err(e) => {
                            tracing::debug!(key = %obj.key, error = %e, "GET body failed midway; refetching the rest");
                            break;
                        }
                    };
                    self.stats
                        .get_bytes
                        .fetch_add(data.len() as u64, Ordering::Relaxed);
                    while !data.is_empty() {
                        let Some(block) = pending.peek() else { break };
                        let want = (self.block_range(obj, block.index).end
                            - self.block_range(obj, block.index).start)
                            as usize;
                        // One allocation per block: a cached block pins only itself.
                        let filling = buf.get_or_insert_with(|| Filling::for_block(want));
                        let take = filling
                            .extend_from_slice(&data[..(want - filling.len()).min(data.len())]);
                        let _ = data.split_to(take);
                        if filling.len() == want {
                            if let (Some(block), Some(full)) = (pending.next(), buf.take()) {
                                let index = block.index;
                                let data = full.freeze();
                                let memory = budget.take_memory(data.len() as u64);
                                let writing = self.complete(obj, block, Ok(data.clone()), true);
                                self.persist(obj, index, data, writing, memory).await;
                            }
                        }
                    }
                    if pending.peek().is_none() {
                        break;
                    }
                }
            }
        }
        let rest: Vec<NewBlock> = pending.collect();
        let (Some(first), Some(last)) = (rest.first(), rest.last()) else {
            return;
        };
        let retry_range =
            self.block_range(obj, first.index).start..self.block_range(obj, last.index).end;
        let result = match failure {
            Some(e) => Err(e),
            None => self
                .store
                .get_range(RangeRequest::of_version(
                    &obj.key,
                    retry_range.clone(),
                    &obj.etag,
                ))
                .await
                .map_err(FetchError::from),
        };
        match &result {
            Ok(data) => {
                self.read_from_store(obj);
                self.stats
                    .get_bytes
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
            }
            Err(e) => {
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(key = %obj.key, start = retry_range.start, end = retry_range.end, error = %e, "read from the store failed");
            }
        }
        let bs = self.config.block_size;
        for block in rest {
            let out = result.clone().map(|data| {
                // Copy: a cached block must not pin the whole part's buffer.
                let lo = (block.index * bs - retry_range.start) as usize;
                let hi = (lo + bs as usize).min(data.len());
                Filling::copy_of(&data[lo..hi])
            });
            let index = block.index;
            let writing = self.complete(obj, block, out.clone(), true);
            if let Ok(data) = out {
                let memory = budget.take_memory(data.len() as u64);
                self.persist(obj, index, data, writing, memory).await;
            }
        }
    }

    /// Notes that the store answered a GET of `obj` for this mount: a read proof for its
    /// cache entry ([`crate::cache::proofs`]).
    fn read_from_store(&self, obj: &ObjectVersion) {
        if let Some(disk) = &self.disk {
            disk.fetched(&disk.identity(obj));
        }
    }
}
