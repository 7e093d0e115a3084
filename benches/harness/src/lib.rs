//! Benchmark and integration-test harness for rifflefs.
//!
//! - [`proxy`]: a transparent HTTP/1.1 reverse proxy that sits between an S3
//!   client and an S3 server (Ceph RGW in this project) and adds first-byte
//!   latency, a per-connection bandwidth cap, request counting and run-time
//!   fault injection. It runs in-process ([`proxy::ProxyHandle`],
//!   [`proxy::BlockingProxy`]) or as the `riffle-proxy` binary, which is
//!   steered over HTTP with [`proxy::ControlClient`].
//! - The benchmark pieces behind the `riffle-bench` binary: deterministic
//!   datasets ([`dataset`], [`content`], [`manifest`]), the parallel S3
//!   client ([`s3`]: upload, read, copy), the file-system reader used for
//!   every system ([`reader`]), which files an epoch reads in which order
//!   ([`order`]), W4's walks of a mount and listings of the store
//!   ([`listing`], [`s3::list`]), the CPU a pass costs ([`cpu`]), and the
//!   result tables ([`results`]).

pub mod content;
pub mod cpu;
pub mod dataset;
pub mod listing;
pub mod manifest;
pub mod order;
pub mod outcome;
pub mod progress;
pub mod proxy;
pub mod reader;
pub mod results;
pub mod rng;
pub mod s3;
pub mod units;
