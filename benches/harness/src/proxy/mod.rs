//! A transparent S3 latency and fault proxy.
//!
//! The proxy sits between an S3 client and an S3 server (Ceph RGW at
//! `http://127.0.0.1:7480` in this project) and forwards HTTP/1.1 requests
//! and responses as they are — method, target, headers including `Host` (so
//! SigV4 signatures made for the proxy's address stay valid), bodies
//! streamed in both directions — while it:
//!
//! - holds every response head back by a first-byte delay and caps each
//!   connection's response body rate ([`Latency`]: 30 ms and 100 MB/s by
//!   default, [`Latency::NONE`] for a pure counting proxy);
//! - counts requests by kind ([`RequestKind`]), statuses, bytes and
//!   connections ([`StatsSnapshot`]);
//! - injects faults chosen by [`FaultRule`]s that can be changed at run time.
//!
//! How the pieces fit: [`server`] accepts connections; each one gets a
//! [`forward::ConnContext`] with its own upstream connection
//! ([`upstream`]), pacer ([`pacing`]) and reset switch ([`io`]).
//! [`forward::handle`] classifies each request ([`classify`]), asks the
//! [`faults::FaultSet`] what to do, forwards it, waits out the delay and
//! wraps the response body ([`body`]). Counters live in [`stats`]; the
//! [`control`] endpoint and the in-process [`ProxyHandle`] read and change
//! the shared [`state::ProxyState`]; [`ControlClient`] is a blocking client
//! for the control endpoint of a proxy in another process.
//!
//! ```no_run
//! # async fn demo() -> Result<(), riffle_bench::proxy::ProxyError> {
//! use riffle_bench::proxy::{FaultRule, Latency, ProxyConfig, ProxyHandle, RequestKind};
//! let proxy = ProxyHandle::start(
//!     ProxyConfig::new("http://127.0.0.1:7480").with_latency(Latency::NONE),
//! )
//! .await?;
//! // Point the S3 client at proxy.url(), path-style.
//! proxy.set_faults(vec![FaultRule::slowdown503().with_every_nth(10)])?;
//! assert_eq!(proxy.stats().requests.get_object, 0);
//! proxy.clear_faults();
//! let final_stats = proxy.shutdown().await;
//! println!("{} requests", final_stats.requests.total);
//! # Ok(()) }
//! ```

pub mod body;
pub mod classify;
pub mod client;
pub mod config;
pub mod control;
pub mod faults;
pub mod forward;
pub mod io;
pub mod pacing;
pub mod responses;
pub mod server;
pub mod state;
pub mod stats;
pub mod upstream;

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use classify::RequestKind;
pub use client::{ControlClient, ControlError};
pub use config::{Latency, ProxyConfig, UpstreamAddr};
pub use faults::{FaultError, FaultKind, FaultRule, FaultRuleStatus};
pub use stats::StatsSnapshot;

use state::ProxyState;

/// Boxed error type of response bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body type of responses sent downstream.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// Starting or steering a proxy failed.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// A configuration value is unusable.
    #[error("configuration: {0}")]
    Config(String),
    /// A socket operation failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    /// A fault rule is invalid.
    #[error(transparent)]
    Fault(#[from] FaultError),
}

/// A proxy running on the current tokio runtime.
///
/// Dropping the handle asks the proxy to shut down (without waiting);
/// [`ProxyHandle::shutdown`] waits for it.
pub struct ProxyHandle {
    addr: SocketAddr,
    control_addr: Option<SocketAddr>,
    state: Arc<ProxyState>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

async fn bind(addr: SocketAddr, what: &str) -> Result<(TcpListener, SocketAddr), ProxyError> {
    let io = |context: String| move |source| ProxyError::Io { context, source };
    let listener = TcpListener::bind(addr)
        .await
        .map_err(io(format!("bind {what} on {addr}")))?;
    let local = listener
        .local_addr()
        .map_err(io(format!("local address of {what}")))?;
    Ok((listener, local))
}

async fn resolve(upstream: &UpstreamAddr) -> Result<SocketAddr, ProxyError> {
    let mut addrs = tokio::net::lookup_host((upstream.host.as_str(), upstream.port))
        .await
        .map_err(|source| ProxyError::Io {
            context: format!("resolve upstream {}", upstream.host),
            source,
        })?;
    addrs
        .next()
        .ok_or_else(|| ProxyError::Config(format!("upstream {} has no address", upstream.host)))
}

impl ProxyHandle {
    /// Binds the listener(s) and starts serving on the current runtime.
    pub async fn start(config: ProxyConfig) -> Result<Self, ProxyError> {
        config.latency.validate()?;
        for rule in &config.faults {
            rule.validate()?;
        }
        let upstream = resolve(&UpstreamAddr::parse(&config.upstream)?).await?;
        let (listener, addr) = bind(config.listen, "proxy").await?;
        let control = match config.control {
            Some(control) => Some(bind(control, "control endpoint").await?),
            None => None,
        };
        let state = Arc::new(ProxyState::new(
            upstream,
            config.upstream.clone(),
            config.latency,
            config.seed,
            config.count_keys,
        ));
        state.set_faults(config.faults.clone())?;
        let (shutdown, stop) = watch::channel(false);
        let mut tasks = vec![tokio::spawn(server::run_proxy(
            listener,
            Arc::clone(&state),
            stop.clone(),
            config.drain_timeout,
        ))];
        let control_addr = control.map(|(listener, control_addr)| {
            tasks.push(tokio::spawn(server::run_control(
                listener,
                Arc::clone(&state),
                addr,
                stop,
            )));
            control_addr
        });
        tracing::info!(%addr, ?control_addr, upstream = %config.upstream, latency = ?config.latency, "proxy started");
        Ok(ProxyHandle {
            addr,
            control_addr,
            state,
            shutdown,
            tasks,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, the endpoint URL to give an S3 client.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The control endpoint's address, if one was started.
    pub fn control_addr(&self) -> Option<SocketAddr> {
        self.control_addr
    }

    /// A copy of the counters.
    pub fn stats(&self) -> StatsSnapshot {
        self.state.stats()
    }

    /// Zeroes the counters; returns their values just before.
    pub fn reset_stats(&self) -> StatsSnapshot {
        self.state.reset_stats()
    }

    /// Replaces every fault rule.
    pub fn set_faults(&self, rules: Vec<FaultRule>) -> Result<(), ProxyError> {
        self.state.set_faults(rules)
    }

    /// Appends a fault rule.
    pub fn add_fault(&self, rule: FaultRule) -> Result<(), ProxyError> {
        self.state.add_faults(vec![rule])
    }

    /// Removes every fault rule.
    pub fn clear_faults(&self) {
        self.state.clear_faults();
    }

    /// The fault rules with their counters.
    pub fn faults(&self) -> Vec<FaultRuleStatus> {
        self.state.fault_status()
    }

    /// The latency model in force.
    pub fn latency(&self) -> Latency {
        self.state.latency()
    }

    /// Changes the latency model for requests from now on.
    pub fn set_latency(&self, latency: Latency) -> Result<(), ProxyError> {
        self.state.set_latency(latency)
    }

    /// Stops accepting, lets open connections finish their current
    /// response (up to the drain timeout), and waits for all of it.
    /// Returns the final counters.
    pub async fn shutdown(mut self) -> StatsSnapshot {
        self.shutdown.send_replace(true);
        for task in std::mem::take(&mut self.tasks) {
            if let Err(err) = task.await {
                tracing::warn!(%err, "proxy task failed");
            }
        }
        tracing::info!(addr = %self.addr, "proxy stopped");
        self.state.stats()
    }
}

impl Drop for ProxyHandle {
    fn drop(&mut self) {
        self.shutdown.send_replace(true);
    }
}

/// A proxy on its own small tokio runtime, for tests without one.
///
/// Dereferences to [`ProxyHandle`] for everything but shutdown; dropping it
/// stops the proxy and its runtime without waiting.
pub struct BlockingProxy {
    handle: Option<ProxyHandle>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl BlockingProxy {
    /// Starts a proxy with `config` on a new 2-thread runtime.
    pub fn start(config: ProxyConfig) -> Result<Self, ProxyError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("riffle-proxy")
            .enable_all()
            .build()
            .map_err(|source| ProxyError::Io {
                context: "start the proxy runtime".into(),
                source,
            })?;
        let handle = runtime.block_on(ProxyHandle::start(config))?;
        Ok(BlockingProxy {
            handle: Some(handle),
            runtime: Some(runtime),
        })
    }

    /// Shuts down gracefully and waits (see [`ProxyHandle::shutdown`]);
    /// returns the final counters.
    pub fn shutdown(mut self) -> StatsSnapshot {
        match (self.handle.take(), self.runtime.take()) {
            (Some(handle), Some(runtime)) => runtime.block_on(handle.shutdown()),
            _ => StatsSnapshot::default(),
        }
    }
}

impl std::ops::Deref for BlockingProxy {
    type Target = ProxyHandle;

    fn deref(&self) -> &ProxyHandle {
        // Only `shutdown` and `drop` take the handle, and both consume self.
        self.handle
            .as_ref()
            .unwrap_or_else(|| unreachable!("BlockingProxy used after shutdown"))
    }
}

impl Drop for BlockingProxy {
    fn drop(&mut self) {
        drop(self.handle.take());
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
