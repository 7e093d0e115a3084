//! rifflefs: a read-only FUSE filesystem that serves an S3 or Ceph bucket at local-disk speed.
//!
//! See `DESIGN.md` notes in the README for how the modules fit together: `store` talks to the
//! object store, `namespace` turns listings into inodes, `fetch` turns byte ranges into ranged
//! GETs with bounded memory and concurrency, `reader` serves reads of one open file with
//! adaptive read-ahead, `fs` adapts all of it to FUSE, and `cli` is the command line.

pub mod cache;
pub mod cli;
pub mod control;
pub mod fetch;
pub mod fs;
pub mod heap_trim;
pub mod metrics;
pub mod namespace;
pub mod prefetch;
pub mod reader;
pub mod store;

#[cfg(test)]
pub(crate) mod test_support;
