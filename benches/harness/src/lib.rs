//! Benchmark and integration-test harness for rifflefs.
//!
//! The main piece is [`proxy`]: a transparent HTTP/1.1 reverse proxy that sits
//! between an S3 client and an S3 server (Ceph RGW in this project) and adds
//! first-byte latency, a per-connection bandwidth cap, request counting and
//! run-time fault injection. It runs in-process ([`proxy::ProxyHandle`],
//! [`proxy::BlockingProxy`]) or as the `riffle-proxy` binary, which is steered
//! over HTTP with [`proxy::ControlClient`].

pub mod proxy;
