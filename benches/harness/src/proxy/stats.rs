//! Counters kept by the proxy and the JSON snapshot they are reported as.
//!
//! The hot-path counters are relaxed atomics; only the optional per-key GET
//! counts take a lock. A [`StatsSnapshot`] is a plain copy that serialises to
//! the JSON served at `GET /stats` and deserialises back in the clients.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::classify::RequestKind;
use super::faults::FaultKind;

/// Live counters shared by every connection of one proxy.
#[derive(Debug, Default)]
pub struct Stats {
    requests: [AtomicU64; 6],
    status: [AtomicU64; 5],
    bytes_down: AtomicU64,
    object_bytes_down: AtomicU64,
    bytes_up: AtomicU64,
    accepted: AtomicU64,
    active: AtomicU64,
    upstream_connects: AtomicU64,
    upstream_errors: AtomicU64,
    faults: [AtomicU64; 6],
    /// `Some` when per-key GET counting is on.
    get_keys: Option<Mutex<BTreeMap<String, u64>>>,
}

fn kind_index(kind: RequestKind) -> usize {
    match kind {
        RequestKind::GetObject => 0,
        RequestKind::GetRange => 1,
        RequestKind::Head => 2,
        RequestKind::List => 3,
        RequestKind::Put => 4,
        RequestKind::Other => 5,
    }
}

fn fault_index(kind: FaultKind) -> usize {
    match kind {
        FaultKind::Http500 => 0,
        FaultKind::Slowdown503 => 1,
        FaultKind::ResetMidBody => 2,
        FaultKind::TruncateBody => 3,
        FaultKind::Stall => 4,
        FaultKind::Trickle => 5,
    }
}

impl Stats {
    /// New counters; `count_keys` turns on per-key GET counts.
    pub fn new(count_keys: bool) -> Self {
        Stats {
            get_keys: count_keys.then(|| Mutex::new(BTreeMap::new())),
            ..Stats::default()
        }
    }

    /// One request of `kind` arrived, naming `key` (`bucket/key`).
    pub fn record_request(&self, kind: RequestKind, key: &str) {
        self.requests[kind_index(kind)].fetch_add(1, Ordering::Relaxed);
        if kind.is_get() {
            if let Some(keys) = &self.get_keys {
                *keys.lock().entry(key.to_owned()).or_insert(0) += 1;
            }
        }
    }

    /// A response head with `status` went (or is about to go) downstream.
    pub fn record_status(&self, status: u16) {
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        self.status[class].fetch_add(1, Ordering::Relaxed);
    }

    /// Response body bytes handed to the downstream connection (`object`: of an object
    /// GET, not a listing or an error).
    pub fn add_bytes_down(&self, n: u64, object: bool) {
        self.bytes_down.fetch_add(n, Ordering::Relaxed);
        if object {
            self.object_bytes_down.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Request body bytes forwarded upstream.
    pub fn add_bytes_up(&self, n: u64) {
        self.bytes_up.fetch_add(n, Ordering::Relaxed);
    }

    /// A downstream connection was accepted.
    pub fn connection_opened(&self) {
        self.accepted.fetch_add(1, Ordering::Relaxed);
        self.active.fetch_add(1, Ordering::Relaxed);
    }

    /// A downstream connection ended.
    pub fn connection_closed(&self) {
        self.active.fetch_sub(1, Ordering::Relaxed);
    }

    /// A new connection to the upstream was made.
    pub fn upstream_connected(&self) {
        self.upstream_connects.fetch_add(1, Ordering::Relaxed);
    }

    /// A request could not be forwarded (connect or protocol error).
    pub fn upstream_error(&self) {
        self.upstream_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// A fault of `kind` was injected.
    pub fn fault_injected(&self, kind: FaultKind) {
        self.faults[fault_index(kind)].fetch_add(1, Ordering::Relaxed);
    }

    /// Zeroes every counter except the number of active connections.
    pub fn reset(&self) {
        let all = self
            .requests
            .iter()
            .chain(&self.status)
            .chain(&self.faults)
            .chain([
                &self.bytes_down,
                &self.object_bytes_down,
                &self.bytes_up,
                &self.accepted,
                &self.upstream_connects,
                &self.upstream_errors,
            ]);
        for counter in all {
            counter.store(0, Ordering::Relaxed);
        }
        if let Some(keys) = &self.get_keys {
            keys.lock().clear();
        }
    }

    /// A consistent-enough copy of the counters (each one read atomically).
    pub fn snapshot(&self) -> StatsSnapshot {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let req = |k: RequestKind| load(&self.requests[kind_index(k)]);
        let fault = |k: FaultKind| load(&self.faults[fault_index(k)]);
        let requests = RequestCounts {
            total: self.requests.iter().map(load).sum(),
            get_object: req(RequestKind::GetObject),
            get_range: req(RequestKind::GetRange),
            head: req(RequestKind::Head),
            list: req(RequestKind::List),
            put: req(RequestKind::Put),
            other: req(RequestKind::Other),
        };
        StatsSnapshot {
            requests,
            status: StatusCounts {
                c1xx: load(&self.status[0]),
                c2xx: load(&self.status[1]),
                c3xx: load(&self.status[2]),
                c4xx: load(&self.status[3]),
                c5xx: load(&self.status[4]),
            },
            bytes_down: load(&self.bytes_down),
            object_bytes_down: load(&self.object_bytes_down),
            bytes_up: load(&self.bytes_up),
            connections: ConnectionCounts {
                accepted: load(&self.accepted),
                active: load(&self.active),
                upstream_connects: load(&self.upstream_connects),
            },
            upstream_errors: load(&self.upstream_errors),
            faults_injected: FaultCounts {
                http500: fault(FaultKind::Http500),
                slowdown503: fault(FaultKind::Slowdown503),
                reset_mid_body: fault(FaultKind::ResetMidBody),
                truncate_body: fault(FaultKind::TruncateBody),
                stall: fault(FaultKind::Stall),
                trickle: fault(FaultKind::Trickle),
            },
            get_keys: self.get_keys.as_ref().map(|keys| keys.lock().clone()),
        }
    }
}

/// Requests counted by kind (see [`RequestKind`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestCounts {
    pub total: u64,
    pub get_object: u64,
    pub get_range: u64,
    pub head: u64,
    pub list: u64,
    pub put: u64,
    pub other: u64,
}

/// Responses counted by status class, including injected and proxy errors.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusCounts {
    #[serde(rename = "1xx")]
    pub c1xx: u64,
    #[serde(rename = "2xx")]
    pub c2xx: u64,
    #[serde(rename = "3xx")]
    pub c3xx: u64,
    #[serde(rename = "4xx")]
    pub c4xx: u64,
    #[serde(rename = "5xx")]
    pub c5xx: u64,
}

/// Connection counts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectionCounts {
    /// Downstream connections accepted.
    pub accepted: u64,
    /// Downstream connections open now (not zeroed by a reset).
    pub active: u64,
    /// Connections opened to the upstream.
    pub upstream_connects: u64,
}

/// Faults injected, by kind. Body faults (`reset_mid_body`, `truncate_body`)
/// count when the connection is actually cut, the others when chosen.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultCounts {
    pub http500: u64,
    pub slowdown503: u64,
    pub reset_mid_body: u64,
    pub truncate_body: u64,
    pub stall: u64,
    pub trickle: u64,
}

impl FaultCounts {
    /// The sum over all kinds.
    pub fn total(&self) -> u64 {
        self.http500
            + self.slowdown503
            + self.reset_mid_body
            + self.truncate_body
            + self.stall
            + self.trickle
    }
}

/// A copy of the proxy's counters; the JSON body of `GET /stats`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsSnapshot {
    pub requests: RequestCounts,
    pub status: StatusCounts,
    /// Response body bytes sent downstream (headers not included).
    pub bytes_down: u64,
    /// The part of `bytes_down` that was object data (GET bodies), not listings.
    #[serde(default)]
    pub object_bytes_down: u64,
    /// Request body bytes forwarded upstream.
    pub bytes_up: u64,
    pub connections: ConnectionCounts,
    /// Requests answered with 502 because the upstream failed.
    pub upstream_errors: u64,
    pub faults_injected: FaultCounts,
    /// GETs per `bucket/key`, present only with per-key counting on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub get_keys: Option<BTreeMap<String, u64>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_resets() {
        let stats = Stats::new(true);
        stats.record_request(RequestKind::GetRange, "b/k");
        stats.record_request(RequestKind::GetObject, "b/k");
        stats.record_request(RequestKind::List, "b");
        stats.record_status(206);
        stats.record_status(503);
        stats.fault_injected(FaultKind::Slowdown503);
        stats.connection_opened();
        let snap = stats.snapshot();
        assert_eq!(snap.requests.total, 3);
        assert_eq!(snap.requests.get_range, 1);
        assert_eq!(snap.status.c2xx, 1);
        assert_eq!(snap.status.c5xx, 1);
        assert_eq!(snap.faults_injected.slowdown503, 1);
        assert_eq!(snap.get_keys.as_ref().and_then(|k| k.get("b/k")), Some(&2));
        let json = serde_json::to_value(&snap).expect("serialise");
        assert_eq!(json["status"]["5xx"], 1);
        stats.reset();
        let snap = stats.snapshot();
        assert_eq!(snap.requests.total, 0);
        assert_eq!(snap.connections.active, 1);
        assert_eq!(snap.get_keys.map(|k| k.len()), Some(0));
    }
}
