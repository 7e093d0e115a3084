//! The two budgets every GET holds: a slot of `max_inflight` concurrent GETs and the bytes of
//! its buffers (`inflight_memory`, counted in [`MEMORY_UNIT`]s). Demand reads wait for both in
//! FIFO order; background work first takes a slot of its priority's limiter (prefetch at most
//! 3/4 of the GET slots, warm 1/2 and behind prefetch); read-ahead takes only what is free
//! at once. A fetch for a peer takes a slot of its own limit and memory from the same budget.

use tokio::sync::OwnedSemaphorePermit;

use super::Fetcher;

/// Memory permits are counted in units of this many bytes (fits a part in a `u32`).
pub(super) const MEMORY_UNIT: u64 = 4096;

/// The most a GET's connection buffers are charged besides its data (twice the data below
/// that). The HTTP client (hyper) reads each response into a per-connection buffer that
/// doubles while reads fill it, up to hyper's default limit of 8 KiB + 400 KiB (the value
/// here; the SDK's client does not change it; 128–256 KiB for a 110 KB body, the limit for
/// 1 MiB blocks), and keeps it while the connection waits in the pool for its next request:
/// 64 readers of W1's small files at `--max-memory 64M` ran ~256 GETs at once and their
/// connections held 54 MiB of buffers beside 32 MiB of data (heaptrack). A connection serves
/// one GET at a time and is reused, so charging each GET for it bounds the buffers of the
/// connections the budget lets run at once, and the client keeps at most [`idle_connections`]
/// idle ones. On small files a small budget runs fewer GETs at once (64M: ~75 instead of 256
/// for 110 KB files; 256M and more: still `--max-inflight`). Charging 256 KiB, less than the
/// limit, let the mixed load of `benches/memory.sh` at 64M, whose 1 MiB GETs fill their
/// buffers, pass its bound.
pub const CONNECTION_BUFFER: u64 = 8192 + 4096 * 100;

/// Idle connections whose buffers are part of the fixed memory beside `--max-memory` (6.5 MiB).
pub const FIXED_IDLE_CONNECTIONS: usize = 16;

/// How many idle connections the S3 client keeps for a GET budget of `get_memory` bytes: as
/// many as an eighth of it holds in buffers, at least [`FIXED_IDLE_CONNECTIONS`]. An idle
/// connection keeps its read buffer ([`CONNECTION_BUFFER`]) and no GET is charged for it; the
/// SDK's default client keeps every connection, so a burst of 256 GETs (the default
/// `--max-inflight`) left up to 100 MiB of buffers outside any budget; at `--max-memory 64M`
/// (56 connections under `benches/memory.sh`'s mixed load) the peak RSS went from 132–138 to
/// 125–133 MiB with 16 kept (three alternated runs each). A connection beyond the limit is
/// closed when its GET ends and a later burst opens new ones, which cost cold epochs 8–12%
/// with 16 at 1G (seven alternated rounds, local RGW), so large budgets keep more. Those
/// beyond the fixed ones take their buffers out of the GET budget
/// ([`idle_connections_memory`]).
pub fn idle_connections(get_memory: u64) -> usize {
    let share = get_memory / 8 / CONNECTION_BUFFER;
    usize::try_from(share)
        .unwrap_or(usize::MAX)
        .max(FIXED_IDLE_CONNECTIONS)
}

/// The buffers of `idle` kept connections beyond the [`FIXED_IDLE_CONNECTIONS`]: what they take
/// of the GET budget.
pub fn idle_connections_memory(idle: usize) -> u64 {
    idle.saturating_sub(FIXED_IDLE_CONNECTIONS) as u64 * CONNECTION_BUFFER
}

impl Fetcher {
    /// GETs in flight right now.
    pub(crate) fn inflight_requests(&self) -> usize {
        self.config.max_inflight - self.requests.available_permits()
    }

    /// Bytes of GET buffers reserved right now.
    pub(crate) fn inflight_bytes(&self) -> u64 {
        let total = self.config.inflight_memory / MEMORY_UNIT;
        (total - self.memory.available_permits() as u64) * MEMORY_UNIT
    }

    fn memory_units(bytes: u64) -> u32 {
        bytes.div_ceil(MEMORY_UNIT).max(1) as u32
    }

    /// The memory permits of a GET of `bytes`: its data and its connection's read buffer
    /// (twice the data, at most [`CONNECTION_BUFFER`]), at most the whole budget (a GET larger
    /// than it could never start).
    fn get_units(&self, bytes: u64) -> u32 {
        let total = (self.config.inflight_memory / MEMORY_UNIT).max(1) as u32;
        let buffer = bytes.saturating_mul(2).min(CONNECTION_BUFFER);
        Self::memory_units(bytes + buffer).min(total)
    }

    pub(super) fn try_budget(&self, bytes: u64) -> Option<Budget> {
        let request = self.requests.clone().try_acquire_owned().ok()?;
        let memory = self
            .memory
            .clone()
            .try_acquire_many_owned(self.get_units(bytes))
            .ok()?;
        Some(Budget {
            _request: request,
            memory,
            _limits: Vec::new(),
        })
    }

    /// A slot of the peer-serving limit (a fetch for a peer takes no slot of this node's own
    /// readers: two nodes asking each other cannot hold each other's slots).
    /// The buffer memory of its `bytes` comes from the node's one budget, like any GET's.
    pub(super) async fn wait_peer_budget(&self, bytes: u64) -> Option<Budget> {
        let request = self.peer_limit.clone().acquire_owned().await.ok()?;
        self.wait_memory(request, bytes, Vec::new()).await
    }

    /// Waits for a GET slot and buffer memory; background work first takes a slot of its
    /// priority's limiter, so it can never hold every GET slot and starve demand reads.
    pub(super) async fn wait_budget(
        &self,
        bytes: u64,
        priority: Option<Priority>,
    ) -> Option<Budget> {
        let mut limits = Vec::new();
        if let Some(p) = priority {
            if p == Priority::Warm {
                limits.push(self.warm_limit.clone().acquire_owned().await.ok()?);
            }
            limits.push(self.background_limit.clone().acquire_owned().await.ok()?);
        }
        let request = self.requests.clone().acquire_owned().await.ok()?;
        self.wait_memory(request, bytes, limits).await
    }

    /// Waits for the buffer memory of a GET of `bytes` that holds `request` and `limits`.
    async fn wait_memory(
        &self,
        request: OwnedSemaphorePermit,
        bytes: u64,
        limits: Vec<OwnedSemaphorePermit>,
    ) -> Option<Budget> {
        let memory = self
            .memory
            .clone()
            .acquire_many_owned(self.get_units(bytes))
            .await
            .ok()?;
        Some(Budget {
            _request: request,
            memory,
            _limits: limits,
        })
    }
}

/// Permits held for the life of one GET; its blocks take their memory along to the cache
/// write ([`Budget::take_memory`]).
pub(super) struct Budget {
    _request: OwnedSemaphorePermit,
    memory: OwnedSemaphorePermit,
    _limits: Vec<OwnedSemaphorePermit>,
}

impl Budget {
    /// Splits the memory permits of `bytes` off this budget (as many as it still has).
    pub(super) fn take_memory(&mut self, bytes: u64) -> Option<OwnedSemaphorePermit> {
        let units = (Fetcher::memory_units(bytes) as usize).min(self.memory.num_permits());
        if units == 0 {
            return None;
        }
        self.memory.split(units)
    }
}

/// Who asked for a fetch, which decides who waits for whom.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// The epoch plan, directory order: at most 3/4 of the GET slots.
    Prefetch,
    /// `riffle warm` and `--warm`: at most 1/2 of the GET slots, and behind prefetch.
    Warm,
}
