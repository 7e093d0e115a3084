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
    /// Lists one page of keys ([`ListRequest`]).
    async fn list_page(&self, req: ListRequest<'_>) -> Result<ListPage, StoreError>;

    /// Attributes of `key`, or [`StoreError::NotFound`].
    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError>;

    /// The bytes of a ranged GET ([`RangeRequest`]).
    async fn get_range(&self, req: RangeRequest<'_>) -> Result<Bytes, StoreError>;

    /// Like [`ObjectStore::get_range`], but hands out the body as it arrives, so the first
    /// blocks of a large part can be served before its last byte is in. The stream may end
    /// early or fail midway; the caller checks the length it got.
    async fn get_range_stream(&self, req: RangeRequest<'_>) -> Result<ByteChunks, StoreError> {
        let data = self.get_range(req).await?;
        Ok(Box::pin(futures::stream::once(async move { Ok(data) })))
    }
}

/// One page of a delimited listing to ask for: the keys and common prefixes under `prefix`
/// (with `/` as the delimiter) after `token`, at most `max_keys` of them (the store may
/// return fewer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListRequest<'a> {
    pub prefix: &'a str,
    pub token: Option<&'a str>,
    pub max_keys: Option<u32>,
}

impl<'a> ListRequest<'a> {
    /// The page after `token` (the first with `None`), as large as the store makes it.
    pub fn page(prefix: &'a str, token: Option<&'a str>) -> Self {
        ListRequest {
            prefix,
            token,
            max_keys: None,
        }
    }

    /// One key at the most: whether anything is listed under `prefix`.
    pub fn probe(prefix: &'a str) -> Self {
        ListRequest {
            prefix,
            token: None,
            max_keys: Some(1),
        }
    }
}

/// A ranged GET: bytes `range` of `key`. With `if_match`, the read fails with
/// [`StoreError::PreconditionFailed`] if the object is no longer that version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeRequest<'a> {
    pub key: &'a str,
    pub range: Range<u64>,
    pub if_match: Option<&'a str>,
}

impl<'a> RangeRequest<'a> {
    /// Bytes `range` of version `etag` of `key`.
    pub fn of_version(key: &'a str, range: Range<u64>, etag: &'a str) -> Self {
        RangeRequest {
            key,
            range,
            if_match: Some(etag),
        }
    }

    /// Bytes `range` of whatever version of `key` is current.
    pub fn any_version(key: &'a str, range: Range<u64>) -> Self {
        RangeRequest {
            key,
            range,
            if_match: None,
        }
    }

    /// The number of bytes asked for.
    pub fn byte_count(&self) -> u64 {
        self.range.end.saturating_sub(self.range.start)
    }
}

/// Strips the quotes S3 puts around ETags.
pub(crate) fn normalize_etag(raw: &str) -> String {
    raw.trim().trim_matches('"').to_string()
}
