//! The state one proxy's connections and its control endpoint share.

use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::Mutex;

use super::config::Latency;
use super::faults::{FaultRule, FaultRuleStatus, FaultSet};
use super::stats::{Stats, StatsSnapshot};
use super::ProxyError;

/// Counters, fault rules and the latency model of one proxy.
pub struct ProxyState {
    /// The live counters.
    pub stats: Arc<Stats>,
    /// The active fault rules.
    pub faults: FaultSet,
    latency: Mutex<Latency>,
    /// The resolved upstream address.
    pub upstream: SocketAddr,
    /// The upstream as configured (`http://host:port`).
    pub upstream_url: String,
}

impl ProxyState {
    /// New state with `latency`, no faults and zeroed counters.
    pub fn new(
        upstream: SocketAddr,
        upstream_url: String,
        latency: Latency,
        seed: Option<u64>,
        count_keys: bool,
    ) -> Self {
        ProxyState {
            stats: Arc::new(Stats::new(count_keys)),
            faults: FaultSet::new(seed),
            latency: Mutex::new(latency),
            upstream,
            upstream_url,
        }
    }

    /// The latency model now in force.
    pub fn latency(&self) -> Latency {
        *self.latency.lock()
    }

    /// Changes the latency model for requests that arrive from now on.
    pub fn set_latency(&self, latency: Latency) -> Result<(), ProxyError> {
        latency.validate()?;
        *self.latency.lock() = latency;
        tracing::info!(?latency, "latency changed");
        Ok(())
    }

    /// Replaces the fault rules after validating every one.
    pub fn set_faults(&self, rules: Vec<FaultRule>) -> Result<(), ProxyError> {
        for rule in &rules {
            rule.validate()?;
        }
        tracing::info!(?rules, "fault rules set");
        self.faults.set(rules);
        Ok(())
    }

    /// Appends fault rules after validating every one.
    pub fn add_faults(&self, rules: Vec<FaultRule>) -> Result<(), ProxyError> {
        for rule in &rules {
            rule.validate()?;
        }
        tracing::info!(?rules, "fault rules added");
        self.faults.add(rules);
        Ok(())
    }

    /// Removes every fault rule.
    pub fn clear_faults(&self) {
        tracing::info!("fault rules cleared");
        self.faults.clear();
    }

    /// The fault rules with their counters.
    pub fn fault_status(&self) -> Vec<FaultRuleStatus> {
        self.faults.list()
    }

    /// A copy of the counters.
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// Zeroes the counters and returns their values just before.
    pub fn reset_stats(&self) -> StatsSnapshot {
        let before = self.stats.snapshot();
        self.stats.reset();
        before
    }
}
