//! Proxy configuration: addresses, the latency model, start-up faults.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::faults::FaultRule;
use super::ProxyError;

/// The latency model applied to every response.
///
/// JSON (`GET`/`PUT /latency`): `{"first_byte_delay_ms": 30, "bandwidth_mbps": 100.0}`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Latency {
    /// Added before the response head is sent back, on top of the upstream's
    /// own time to the response head.
    pub first_byte_delay_ms: u64,
    /// Response body rate cap per downstream connection, in MB/s
    /// (10^6 bytes per second). 0 means unlimited.
    pub bandwidth_mbps: f64,
}

impl Latency {
    /// The standard benchmark remote: 30 ms to first byte, 100 MB/s per
    /// connection.
    pub const STANDARD: Latency = Latency {
        first_byte_delay_ms: 30,
        bandwidth_mbps: 100.0,
    };

    /// No added latency and no bandwidth cap: a pure counting proxy.
    pub const NONE: Latency = Latency {
        first_byte_delay_ms: 0,
        bandwidth_mbps: 0.0,
    };

    /// The first-byte delay.
    pub fn first_byte_delay(&self) -> Duration {
        Duration::from_millis(self.first_byte_delay_ms)
    }

    /// The bandwidth cap in bytes per second; `None` when unlimited.
    pub fn bandwidth_bytes_per_sec(&self) -> Option<u64> {
        let rate = self.bandwidth_mbps * 1e6;
        // `as` saturates; a rate under 1 B/s is treated as 1 B/s.
        (rate > 0.0).then(|| (rate as u64).max(1))
    }

    /// Checks the values are usable.
    pub fn validate(&self) -> Result<(), ProxyError> {
        if !self.bandwidth_mbps.is_finite() || self.bandwidth_mbps < 0.0 {
            return Err(ProxyError::Config(format!(
                "bandwidth_mbps must be a finite number >= 0, not {}",
                self.bandwidth_mbps
            )));
        }
        Ok(())
    }
}

impl Default for Latency {
    fn default() -> Self {
        Latency::STANDARD
    }
}

/// Everything needed to start a proxy.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Where clients connect (port 0 picks a free port).
    pub listen: SocketAddr,
    /// The S3 server, as `http://host:port`.
    pub upstream: String,
    /// Where the control endpoint listens; `None` for no endpoint (an
    /// in-process [`super::ProxyHandle`] does not need one).
    pub control: Option<SocketAddr>,
    /// The latency model (changeable at run time).
    pub latency: Latency,
    /// Fault rules active from the start.
    pub faults: Vec<FaultRule>,
    /// Seed for probabilistic faults (`None`: from the OS).
    pub seed: Option<u64>,
    /// Count GETs per `bucket/key` in the statistics.
    pub count_keys: bool,
    /// How long shutdown waits for open connections to finish.
    pub drain_timeout: Duration,
}

impl ProxyConfig {
    /// A proxy on `127.0.0.1:0` in front of `upstream` with the standard
    /// latency model, no control endpoint and no faults.
    pub fn new(upstream: impl Into<String>) -> Self {
        ProxyConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            upstream: upstream.into(),
            control: None,
            latency: Latency::STANDARD,
            faults: Vec::new(),
            seed: None,
            count_keys: false,
            drain_timeout: Duration::from_secs(5),
        }
    }

    /// Sets the latency model.
    pub fn with_latency(mut self, latency: Latency) -> Self {
        self.latency = latency;
        self
    }

    /// Starts a control endpoint on `addr`.
    pub fn with_control(mut self, addr: SocketAddr) -> Self {
        self.control = Some(addr);
        self
    }

    /// Turns on per-key GET counts.
    pub fn with_key_counts(mut self) -> Self {
        self.count_keys = true;
        self
    }
}

/// Where the upstream is, parsed from `http://host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamAddr {
    pub host: String,
    pub port: u16,
}

impl UpstreamAddr {
    /// Parses `http://host[:port][/]`. Only plain HTTP is supported.
    pub fn parse(url: &str) -> Result<Self, ProxyError> {
        let bad = |reason: &str| ProxyError::Config(format!("upstream {url:?}: {reason}"));
        let uri: http::Uri = url.parse().map_err(|_| bad("not a URL"))?;
        if uri.scheme_str() != Some("http") {
            return Err(bad("only http:// is supported"));
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(bad("must not have a path or query"));
        }
        let authority = uri.authority().ok_or_else(|| bad("no host"))?;
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        Ok(UpstreamAddr {
            host,
            port: authority.port_u16().unwrap_or(80),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_urls() {
        let a = UpstreamAddr::parse("http://127.0.0.1:7480").expect("plain");
        assert_eq!((a.host.as_str(), a.port), ("127.0.0.1", 7480));
        let b = UpstreamAddr::parse("http://localhost/").expect("default port");
        assert_eq!((b.host.as_str(), b.port), ("localhost", 80));
        let c = UpstreamAddr::parse("http://[::1]:9000").expect("v6");
        assert_eq!(c.host, "::1");
        assert!(UpstreamAddr::parse("https://x:1").is_err());
        assert!(UpstreamAddr::parse("http://x:1/bucket").is_err());
        assert!(UpstreamAddr::parse("x:1").is_err());
    }

    #[test]
    fn bandwidth() {
        assert_eq!(Latency::NONE.bandwidth_bytes_per_sec(), None);
        assert_eq!(
            Latency::STANDARD.bandwidth_bytes_per_sec(),
            Some(100_000_000)
        );
        let bad = Latency {
            first_byte_delay_ms: 0,
            bandwidth_mbps: -1.0,
        };
        assert!(bad.validate().is_err());
    }
}
