//! An in-memory [`ObjectStore`] with fault injection, for tests.
//!
//! Objects live in a `BTreeMap` so listings come out in S3's lexicographic order; pages are cut
//! at `page_size` keys (objects and common prefixes both count, as in S3) and the continuation
//! token is the last key or prefix returned. ETags are derived from a per-store version counter,
//! so replacing an object always changes its ETag.
//!
//! Faults are queued per operation kind ([`Op`]) and consumed in order, one per call: an error
//! to return, a truncated body, or "replace the object before answering" (an object replaced
//! mid-read). A fixed latency can be added to every call. Every call is counted per kind so tests
//! can assert how many requests reached the store.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;

use super::{ByteChunks, ListPage, ListRequest, ObjectMeta, ObjectStore, RangeRequest, StoreError};

/// Streamed bodies come in chunks of this many bytes, so block assembly across chunk
/// boundaries is exercised.
const STREAM_CHUNK: usize = 777;

/// The kinds of request a fault or a counter applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    List,
    Head,
    Get,
}

/// One injected fault, consumed by the next call of its kind.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Answer with this error.
    Error(StoreError),
    /// Answer a GET with only the first `n` bytes of the range.
    Truncate(usize),
    /// Replace the object with these bytes (new ETag) before answering.
    ReplaceWith(Bytes),
}

#[derive(Debug, Clone)]
struct StoredObject {
    data: Bytes,
    etag: String,
    last_modified: SystemTime,
}

/// See the module documentation.
#[derive(Debug)]
pub struct MemoryStore {
    objects: Mutex<BTreeMap<String, StoredObject>>,
    faults: Mutex<HashMap<Op, VecDeque<Fault>>>,
    counts: Mutex<HashMap<Op, u64>>,
    version: AtomicU64,
    page_size: usize,
    latency: Mutex<Duration>,
    active_gets: AtomicU64,
    max_active_gets: AtomicU64,
    get_log: Mutex<Vec<String>>,
}

/// Counts a GET as active while alive.
struct ActiveGet<'a>(&'a AtomicU64);

impl Drop for ActiveGet<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::with_page_size(1000)
    }

    pub fn with_page_size(page_size: usize) -> Self {
        MemoryStore {
            objects: Mutex::new(BTreeMap::new()),
            faults: Mutex::new(HashMap::new()),
            counts: Mutex::new(HashMap::new()),
            version: AtomicU64::new(1),
            page_size: page_size.max(1),
            latency: Mutex::new(Duration::ZERO),
            active_gets: AtomicU64::new(0),
            max_active_gets: AtomicU64::new(0),
            get_log: Mutex::new(Vec::new()),
        }
    }

    /// Creates or replaces an object; returns its new ETag.
    pub fn put(&self, key: &str, data: impl Into<Bytes>) -> String {
        let version = self.version.fetch_add(1, Ordering::Relaxed);
        let etag = format!("{version:032x}");
        self.objects.lock().insert(
            key.to_string(),
            StoredObject {
                data: data.into(),
                etag: etag.clone(),
                last_modified: SystemTime::UNIX_EPOCH
                    + Duration::from_secs(1_700_000_000 + version),
            },
        );
        etag
    }

    pub fn remove(&self, key: &str) {
        self.objects.lock().remove(key);
    }

    /// Queues a fault for the next call of kind `op`.
    pub fn inject(&self, op: Op, fault: Fault) {
        self.faults.lock().entry(op).or_default().push_back(fault);
    }

    pub fn clear_faults(&self) {
        self.faults.lock().clear();
    }

    /// Adds `latency` to every call.
    pub fn set_latency(&self, latency: Duration) {
        *self.latency.lock() = latency;
    }

    /// How many calls of kind `op` reached the store.
    pub fn count(&self, op: Op) -> u64 {
        self.counts.lock().get(&op).copied().unwrap_or(0)
    }

    /// The keys of all GETs so far, in the order they reached the store.
    pub fn get_log(&self) -> Vec<String> {
        self.get_log.lock().clone()
    }

    /// The most GETs that were ever in progress at once.
    pub fn max_concurrent_gets(&self) -> u64 {
        self.max_active_gets.load(Ordering::SeqCst)
    }

    pub fn reset_counts(&self) {
        self.counts.lock().clear();
    }

    async fn enter(&self, op: Op) -> Option<Fault> {
        *self.counts.lock().entry(op).or_default() += 1;
        let latency = *self.latency.lock();
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        self.faults
            .lock()
            .get_mut(&op)
            .and_then(VecDeque::pop_front)
    }

    fn meta(key: &str, obj: &StoredObject) -> ObjectMeta {
        ObjectMeta {
            key: key.to_string(),
            size: obj.data.len() as u64,
            etag: obj.etag.clone(),
            last_modified: obj.last_modified,
        }
    }
}

#[async_trait]
impl ObjectStore for MemoryStore {
    async fn list_page(&self, req: ListRequest<'_>) -> Result<ListPage, StoreError> {
        let ListRequest {
            prefix,
            token,
            max_keys,
        } = req;
        if let Some(Fault::Error(e)) = self.enter(Op::List).await {
            return Err(e);
        }
        let limit = max_keys.map_or(self.page_size, |m| (m as usize).clamp(1, self.page_size));
        let objects = self.objects.lock();
        let mut page = ListPage::default();
        let mut last_entry: Option<String> = None;
        let range = objects.range::<str, _>((
            std::ops::Bound::Included(prefix),
            std::ops::Bound::Unbounded,
        ));
        for (key, obj) in range {
            if !key.starts_with(prefix) {
                break;
            }
            // Skip everything up to and including the token (a key, or all keys of a prefix).
            if let Some(t) = token {
                if key.as_str() <= t || (t.ends_with('/') && key.starts_with(t)) {
                    continue;
                }
            }
            let rest = &key[prefix.len()..];
            let common = rest.find('/').map(|i| format!("{prefix}{}", &rest[..=i]));
            if common.is_some() && common == last_entry {
                continue; // more keys under a prefix already returned
            }
            if page.objects.len() + page.prefixes.len() == limit {
                page.next_token = last_entry;
                return Ok(page);
            }
            match common {
                Some(common) => {
                    page.prefixes.push(common.clone());
                    last_entry = Some(common);
                }
                None => {
                    page.objects.push(Self::meta(key, obj));
                    last_entry = Some(key.clone());
                }
            }
        }
        Ok(page)
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError> {
        if let Some(Fault::Error(e)) = self.enter(Op::Head).await {
            return Err(e);
        }
        let objects = self.objects.lock();
        objects
            .get(key)
            .map(|o| Self::meta(key, o))
            .ok_or(StoreError::NotFound)
    }

    async fn get_range(&self, req: RangeRequest<'_>) -> Result<Bytes, StoreError> {
        let RangeRequest {
            key,
            range,
            if_match: etag,
        } = req;
        self.get_log.lock().push(key.to_string());
        let now = self.active_gets.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_active_gets.fetch_max(now, Ordering::SeqCst);
        let _active = ActiveGet(&self.active_gets);
        let fault = self.enter(Op::Get).await;
        match &fault {
            Some(Fault::Error(e)) => return Err(e.clone()),
            Some(Fault::ReplaceWith(data)) => {
                self.put(key, data.clone());
            }
            _ => {}
        }
        let objects = self.objects.lock();
        let obj = objects.get(key).ok_or(StoreError::NotFound)?;
        if let Some(expected) = etag {
            if expected != obj.etag {
                return Err(StoreError::PreconditionFailed);
            }
        }
        let len = obj.data.len() as u64;
        if range.start > range.end || range.start >= len && !(range.start == 0 && len == 0) {
            return Err(StoreError::Invalid(
                format!(
                    "range {}..{} outside object of {len} bytes",
                    range.start, range.end
                )
                .into(),
            ));
        }
        let end = range.end.min(len) as usize;
        let mut data = obj.data.slice(range.start as usize..end);
        if let Some(Fault::Truncate(n)) = fault {
            data.truncate(n);
        }
        Ok(data)
    }

    async fn get_range_stream(&self, req: RangeRequest<'_>) -> Result<ByteChunks, StoreError> {
        let data = self.get_range(req).await?;
        let chunks: Vec<Result<Bytes, StoreError>> = (0..data.len())
            .step_by(STREAM_CHUNK)
            .map(|i| Ok(data.slice(i..(i + STREAM_CHUNK).min(data.len()))))
            .collect();
        Ok(Box::pin(futures::stream::iter(chunks)))
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    fn names(page: &ListPage) -> (Vec<String>, Vec<String>) {
        (
            page.objects.iter().map(|o| o.key.clone()).collect(),
            page.prefixes.clone(),
        )
    }

    #[tokio::test]
    async fn lists_with_delimiter_and_pages() {
        let store = MemoryStore::with_page_size(2);
        for k in ["a", "b/1", "b/2", "c", "d/", "e"] {
            store.put(k, "x");
        }
        let p1 = store.list_page(ListRequest::page("", None)).await.unwrap();
        assert_eq!(names(&p1), (vec!["a".into()], vec!["b/".into()]));
        let p2 = store
            .list_page(ListRequest::page("", p1.next_token.as_deref()))
            .await
            .unwrap();
        assert_eq!(names(&p2), (vec!["c".into()], vec!["d/".into()]));
        let p3 = store
            .list_page(ListRequest::page("", p2.next_token.as_deref()))
            .await
            .unwrap();
        assert_eq!(names(&p3), (vec!["e".into()], vec![]));
        assert!(p3.next_token.is_none());
    }

    #[tokio::test]
    async fn streams_in_chunks() {
        let store = MemoryStore::new();
        store.put("k", vec![7u8; 2000]);
        let chunks: Vec<_> = store
            .get_range_stream(RangeRequest::any_version("k", 0..2000))
            .await
            .unwrap()
            .collect()
            .await;
        assert_eq!(chunks.len(), 3);
        let total: usize = chunks.iter().map(|c| c.as_ref().unwrap().len()).sum();
        assert_eq!(total, 2000);
    }

    #[tokio::test]
    async fn etag_mismatch_is_precondition_failed() {
        let store = MemoryStore::new();
        let etag = store.put("k", "hello");
        assert_eq!(
            store
                .get_range(RangeRequest::of_version("k", 1..3, &etag))
                .await
                .unwrap(),
            Bytes::from("el")
        );
        store.put("k", "world");
        assert_eq!(
            store
                .get_range(RangeRequest::of_version("k", 0..3, &etag))
                .await,
            Err(StoreError::PreconditionFailed)
        );
    }
}
