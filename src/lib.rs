//! rifflefs: a read-only FUSE filesystem that serves an S3 or Ceph bucket at local-disk speed.
//!
//! `ARCHITECTURE.md` at the repository root follows a read through these modules, cold and
//! warm, and places the handover. Layout, one job per module:
//! - [`store`]: the object store contract (LIST a prefix, HEAD a key, GET a range), spoken to
//!   S3 and Ceph RGW, kept in memory for tests, and wrapped with retries.
//! - [`namespace`]: listings and HEADs -> a tree of stable inodes with names and attributes,
//!   trusted for `--metadata-ttl`, and the version (and inode) an open reads.
//! - [`fetch`]: byte ranges of an object version -> ranged GETs of blocks, with bounded
//!   concurrency and memory, an in-memory block cache and the NVMe tier.
//! - [`cache`]: the persistent NVMe block cache (one data file and one journal per object
//!   version, io_uring, eviction), shared by mounts and kept across restarts.
//! - [`reader`]: the reads of one open file: a sequential detector driving read-ahead.
//! - [`prefetch`]: what to fetch across files before it is asked for (epoch plans,
//!   directory order, warming).
//! - [`fs`]: the FUSE adapter: requests in, namespace and reader calls out, errno values,
//!   passthrough, and the handover of a live connection to a successor daemon.
//! - [`stats`]: every field a mount reports, declared once (path, kind, unit, help), and the
//!   builder of the `riffle stats` tree that the layers record into.
//! - [`metrics`]: what a mount reports (`riffle stats` JSON, Prometheus endpoint).
//! - [`control`]: the per-mount control socket (`riffle stats`, `plan`, `warm`).
//! - [`heap_trim`]: gives freed heap back to the system after bursts of listings.
//! - [`http_server`]: the bounded HTTP/1.1 server of the metrics endpoint and the peer port.
//! - [`cli`]: the `riffle` command line: mount (daemon and keeper), unmount, stats, warm.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod cache;
pub mod cli;
pub mod control;
pub mod fetch;
pub mod fs;
pub(crate) mod heap_trim;
pub mod http_server;
pub(crate) mod metrics;
pub mod namespace;
pub(crate) mod prefetch;
pub(crate) mod reader;
pub mod stats;
pub mod store;

#[cfg(test)]
pub(crate) mod test_support;
