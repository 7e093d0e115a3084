//! The parallel S3 client side of the harness: uploading datasets
//! ([`upload`]), the straight-from-the-store reader ([`read`]), the
//! copy-first download ([`copy`]) and W4's parallel listing ([`list`]), on
//! aws-sdk-s3 with path-style addressing.

pub mod client;
pub mod copy;
pub mod list;
pub mod read;
pub mod upload;

mod get;

pub use client::{connect, Endpoint};
