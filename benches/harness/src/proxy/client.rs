//! A blocking client for the control endpoint, for tests and scripts that
//! talk to a `riffle-proxy` running as a separate process.
//!
//! Each call is one HTTP/1.1 request over a fresh `std::net::TcpStream` with
//! `Connection: close`; the answer is read to end of stream. No async
//! runtime is involved, so it works from plain `#[test]` functions.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::config::Latency;
use super::faults::{FaultRule, FaultRuleStatus};
use super::stats::StatsSnapshot;

/// A control request failed.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Connecting, writing or reading failed.
    #[error("control endpoint {addr}: {source}")]
    Io {
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// The answer was not HTTP as expected.
    #[error("control endpoint {addr}: malformed response: {reason}")]
    Malformed { addr: SocketAddr, reason: String },
    /// The endpoint answered with an error status.
    #[error("control endpoint {addr}: {status}: {body}")]
    Status {
        addr: SocketAddr,
        status: u16,
        body: String,
    },
    /// The answer's JSON did not have the expected shape.
    #[error("control endpoint {addr}: bad JSON: {source}")]
    Json {
        addr: SocketAddr,
        source: serde_json::Error,
    },
}

#[derive(Deserialize)]
struct FaultList {
    faults: Vec<FaultRuleStatus>,
}

/// Talks to one proxy's control endpoint.
#[derive(Debug, Clone)]
pub struct ControlClient {
    addr: SocketAddr,
    timeout: Duration,
}

impl ControlClient {
    /// A client for the endpoint at `addr` (10 s timeouts).
    pub fn new(addr: SocketAddr) -> Self {
        ControlClient {
            addr,
            timeout: Duration::from_secs(10),
        }
    }

    /// Sets the connect/read/write timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The endpoint's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `GET /stats`.
    pub fn stats(&self) -> Result<StatsSnapshot, ControlError> {
        self.call("GET", "/stats", None)
    }

    /// `POST /stats/reset`; returns the counters just before the reset.
    pub fn reset_stats(&self) -> Result<StatsSnapshot, ControlError> {
        self.call("POST", "/stats/reset", None)
    }

    /// `GET /faults`.
    pub fn faults(&self) -> Result<Vec<FaultRuleStatus>, ControlError> {
        self.call::<FaultList>("GET", "/faults", None)
            .map(|l| l.faults)
    }

    /// `PUT /faults`: replaces every rule.
    pub fn set_faults(&self, rules: &[FaultRule]) -> Result<Vec<FaultRuleStatus>, ControlError> {
        let body = self.encode(&serde_json::json!({ "faults": rules }))?;
        self.call::<FaultList>("PUT", "/faults", Some(&body))
            .map(|l| l.faults)
    }

    /// `POST /faults`: appends one rule.
    pub fn add_fault(&self, rule: &FaultRule) -> Result<Vec<FaultRuleStatus>, ControlError> {
        let body = self.encode(rule)?;
        self.call::<FaultList>("POST", "/faults", Some(&body))
            .map(|l| l.faults)
    }

    /// `DELETE /faults`.
    pub fn clear_faults(&self) -> Result<(), ControlError> {
        self.call::<FaultList>("DELETE", "/faults", None).map(drop)
    }

    /// `GET /latency`.
    pub fn latency(&self) -> Result<Latency, ControlError> {
        self.call("GET", "/latency", None)
    }

    /// `PUT /latency`.
    pub fn set_latency(&self, latency: &Latency) -> Result<Latency, ControlError> {
        let body = self.encode(latency)?;
        self.call("PUT", "/latency", Some(&body))
    }

    fn encode(&self, value: &impl serde::Serialize) -> Result<Vec<u8>, ControlError> {
        serde_json::to_vec(value).map_err(|source| ControlError::Json {
            addr: self.addr,
            source,
        })
    }

    fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<T, ControlError> {
        let (status, body) = self.request(method, path, body)?;
        if !(200..300).contains(&status) {
            return Err(ControlError::Status {
                addr: self.addr,
                status,
                body: String::from_utf8_lossy(&body).into_owned(),
            });
        }
        serde_json::from_slice(&body).map_err(|source| ControlError::Json {
            addr: self.addr,
            source,
        })
    }

    /// One raw request; returns the status and the body.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<(u16, Vec<u8>), ControlError> {
        let io = |source| ControlError::Io {
            addr: self.addr,
            source,
        };
        let mut stream = TcpStream::connect_timeout(&self.addr, self.timeout).map_err(io)?;
        stream.set_read_timeout(Some(self.timeout)).map_err(io)?;
        stream.set_write_timeout(Some(self.timeout)).map_err(io)?;
        let body = body.unwrap_or_default();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.addr,
            body.len()
        );
        stream.write_all(head.as_bytes()).map_err(io)?;
        stream.write_all(body).map_err(io)?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).map_err(io)?;
        parse_response(&raw).map_err(|reason| ControlError::Malformed {
            addr: self.addr,
            reason,
        })
    }
}

/// Splits a `Connection: close` HTTP/1.1 response into status and body.
fn parse_response(raw: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no end of headers")?;
    let head = std::str::from_utf8(&raw[..split]).map_err(|_| "head is not UTF-8")?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or("no status code")?;
    let mut body = raw[split + 4..].to_vec();
    let content_length = head.lines().skip(1).find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse::<usize>().ok())
            .flatten()
    });
    if let Some(len) = content_length {
        if body.len() < len {
            return Err(format!("body has {} of {len} bytes", body.len()));
        }
        body.truncate(len);
    }
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_responses() {
        let raw = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(parse_response(raw), Ok((200, b"{}".to_vec())));
        assert!(parse_response(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n{}").is_err());
        assert!(parse_response(b"garbage").is_err());
    }
}
