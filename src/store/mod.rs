//! The object store seen by every other module.
//!
//! rifflefs needs exactly three things from a remote store: list a "directory" (a prefix with
//! the `/` delimiter, one page at a time), HEAD one key, and GET a byte range of one object
//! version. [`ObjectStore`] is that contract; [`s3::S3Store`] speaks it to AWS S3 and
//! S3-compatible servers (Ceph RGW, Garage, MinIO), [`memory::MemoryStore`] keeps objects in
//! memory with fault injection for tests, and [`retry::RetryingStore`] wraps either one with
//! retries (exponential backoff with full jitter) and response-length verification, so the
//! retry behaviour itself is tested against injected faults.
//!
//! Errors are classified once, here, into [`StoreError`] kinds that the rest of the daemon acts
//! on: transient ones are retried, `PreconditionFailed` means the object changed under a reader
//! (its ETag no longer matches), and everything else is final.

pub(crate) mod credentials_file;
mod error;
pub mod memory;
pub(crate) mod retry;
pub(crate) mod s3;

use std::ops::Range;
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;

pub use error::{Detail, StoreError};

/// Attributes of one object version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    /// The full key.
    pub key: String,
    pub size: u64,
    /// The ETag as the server sent it, without surrounding quotes.
    pub etag: String,
    pub last_modified: SystemTime,
}

/// One page of a delimited listing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListPage {
    /// Objects directly under the prefix, in the store's (lexicographic) order.
    pub objects: Vec<ObjectMeta>,
    /// Common prefixes (each ending with the delimiter), in order.
    pub prefixes: Vec<String>,
    /// Present when more pages follow.
    pub next_token: Option<String>,
}

/// The body of a ranged GET, in chunks as they arrive.
pub type ByteChunks = futures::stream::BoxStream<'static, Result<Bytes, StoreError>>;

/// A read-only view of one bucket.
#[async_trait]
pub trait ObjectStore: Send + Sync + 'static {
    /// Lists one page of keys under `prefix` using `/` as the delimiter.
    /// `max_keys` limits the page size (the store may return fewer).
    async fn list_page(
        &self,
        prefix: &str,
        token: Option<&str>,
        max_keys: Option<u32>,
    ) -> Result<ListPage, StoreError>;

    /// Attributes of `key`, or [`StoreError::NotFound`].
    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError>;

    /// Bytes `range` of `key`. With `etag`, the read fails with
    /// [`StoreError::PreconditionFailed`] if the object is no longer that version.
    async fn get_range(
        &self,
        key: &str,
        range: Range<u64>,
        etag: Option<&str>,
    ) -> Result<Bytes, StoreError>;

    /// Like [`ObjectStore::get_range`], but hands out the body as it arrives, so the first
    /// blocks of a large part can be served before its last byte is in. The stream may end
    /// early or fail midway; the caller checks the length it got.
    async fn get_range_stream(
        &self,
        key: &str,
        range: Range<u64>,
        etag: Option<&str>,
    ) -> Result<ByteChunks, StoreError> {
        let data = self.get_range(key, range, etag).await?;
        Ok(Box::pin(futures::stream::once(async move { Ok(data) })))
    }
}

/// Strips the quotes S3 puts around ETags.
pub(crate) fn normalize_etag(raw: &str) -> String {
    raw.trim().trim_matches('"').to_string()
}
