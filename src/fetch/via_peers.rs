//! Blocks read through other nodes' caches ([`super::peer`]): a run's missing blocks offered
//! to their owners all at once, holding the GET's budget; what a peer serves is accepted only
//! with a read proof for this mount's principal (the owner's attestation or this mount's
//! own), and copied to the NVMe cache only while the cache has room for this node's share of
//! the dataset too. The rest goes to the store.

use std::sync::Arc;

use super::budget::Budget;
use super::claim::NewBlock;
use super::{peer, FetchError, Fetcher, ObjectVersion};

impl Fetcher {
    /// Asks the owners among `peers` for the blocks of `run` (all at once), completes those a
    /// peer served, and returns the rest, sorted, for the store: the blocks this node owns and
    /// those every peer asked failed (see [`peer`]).
    pub(super) async fn from_peers(
        self: &Arc<Self>,
        obj: &Arc<ObjectVersion>,
        run: Vec<NewBlock>,
        peers: &Arc<peer::Peers>,
        budget: &mut Budget,
    ) -> Vec<NewBlock> {
        let asks = run.into_iter().map(|block| {
            let range = self.block_range(obj, block.index);
            async move {
                let outcome = peers
                    .fetch_block(obj, block.index, range.end - range.start)
                    .await;
                (block, outcome)
            }
        });
        let answers = futures::future::join_all(asks).await;
        let mut rest = Vec::new();
        let mut accepted: Option<PeerVerdict> = None;
        for (block, outcome) in answers {
            let (data, proof) = match outcome {
                peer::Outcome::Local | peer::Outcome::Fallback => {
                    rest.push(block);
                    continue;
                }
                peer::Outcome::Got { data, proof } => (data, proof),
            };
            // One verdict per run (it is one object version).
            let verdict = match accepted {
                Some(v) => v,
                None => {
                    let v = self.accept_from_peer(obj, proof).await;
                    accepted = Some(v);
                    v
                }
            };
            match verdict {
                PeerVerdict::Serve => {
                    let index = block.index;
                    let keep = self.keeps_peer_copies();
                    let writing = self.complete(obj, block, Ok(data.clone()), keep);
                    if keep {
                        // The copy waits for the disk inside the run's memory budget.
                        let memory = budget.take_memory(data.len() as u64);
                        self.persist(obj, index, data, writing, memory).await;
                    }
                }
                PeerVerdict::Refused => {
                    self.complete(obj, block, Err(FetchError::NotPermitted), false);
                }
                PeerVerdict::Store => rest.push(block),
            }
        }
        rest.sort_by_key(|b| b.index);
        rest
    }

    /// Whether this mount may be served bytes of `obj` a peer sent, `proof` being the
    /// owner's attestation of a read proof for this mount's principal: with it, a proof is
    /// recorded here (no request); without it, this mount's own proof (one shared proof
    /// request unless it has an answer). Without an NVMe tier (no proof log), unattested
    /// bytes are taken from the store instead.
    async fn accept_from_peer(self: &Arc<Self>, obj: &ObjectVersion, proof: bool) -> PeerVerdict {
        let Some(disk) = &self.disk else {
            return if proof {
                PeerVerdict::Serve
            } else {
                PeerVerdict::Store
            };
        };
        if proof {
            disk.fetched(&disk.identity(obj));
            return PeerVerdict::Serve;
        }
        if disk.may_serve(obj) {
            return PeerVerdict::Serve;
        }
        match self.prove_once(obj).await {
            Ok(()) => PeerVerdict::Serve,
            Err(FetchError::NotPermitted) => PeerVerdict::Refused,
            Err(_) => PeerVerdict::Store,
        }
    }

    /// Whether a block read from a peer is also written to the NVMe cache: only while the
    /// cache has room for it *and* for this node's share of the dataset (what it owns, see
    /// [`peer::Peers::owned_share`]), and has never had to make room since it was opened. A
    /// copy never evicts anything, and a cache smaller than the dataset holds what this node
    /// owns rather than copies whose owners keep them: otherwise the copies would push out
    /// owned blocks that the other nodes then fetch from the store again.
    fn keeps_peer_copies(&self) -> bool {
        let reserve = self.peers.get().map_or(0, |p| p.owned_share());
        self.disk.as_ref().is_some_and(|d| {
            !d.cache.has_been_full()
                && d.cache.used_bytes() + self.config.block_size + reserve <= d.cache.limit()
        })
    }
}

/// What a mount may do with a block a peer sent ([`Fetcher::accept_from_peer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PeerVerdict {
    Serve,
    /// The store refused this mount's principal the object.
    Refused,
    /// Fetch it from the store (the proof could not be had, or there is no proof log).
    Store,
}
