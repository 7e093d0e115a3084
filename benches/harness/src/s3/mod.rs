//! The parallel S3 client side of the harness: uploading datasets
//! ([`upload`]), the straight-from-the-store reader ([`read`]) and the
//! copy-first download ([`copy`]), on aws-sdk-s3 with path-style addressing.

pub mod client;
pub mod copy;
pub mod read;
pub mod upload;

mod get;

pub use client::{connect, Endpoint};
