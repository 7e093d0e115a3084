//! Retries with exponential backoff and full jitter, plus response-length verification.
//!
//! [`RetryingStore`] wraps any [`ObjectStore`]. A call that fails with a retryable error
//! (5xx, 503 SlowDown, timeout, connection reset, or a GET body shorter than the range asked
//! for) is tried again after `rand(0, min(max_backoff, base * 2^attempt))` ("full jitter", which
//! spreads a thundering herd of readers best), up to `max_attempts` in all. Final errors
//! (not found, access denied, precondition failed) are returned at once. The number of retries
//! is counted so `riffle stats` and tests can see them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use rand::Rng;

use super::{ByteChunks, ListPage, ListRequest, ObjectMeta, ObjectStore, RangeRequest, StoreError};

/// How often and how patiently to retry.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    pub base_delay: Duration,
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 6,
            base_delay: Duration::from_millis(50),
            max_delay: Duration::from_secs(3),
        }
    }
}

impl RetryPolicy {
    /// The sleep before retry number `attempt` (1-based).
    fn backoff(&self, attempt: u32) -> Duration {
        let cap = self
            .base_delay
            .saturating_mul(1u32 << attempt.min(20))
            .min(self.max_delay);
        let nanos = rand::rng().random_range(0..=cap.as_nanos() as u64);
        Duration::from_nanos(nanos)
    }
}

/// See the module documentation.
pub struct RetryingStore {
    inner: Arc<dyn ObjectStore>,
    policy: RetryPolicy,
    retries: AtomicU64,
}

impl RetryingStore {
    pub fn new(inner: Arc<dyn ObjectStore>, policy: RetryPolicy) -> Self {
        RetryingStore {
            inner,
            policy,
            retries: AtomicU64::new(0),
        }
    }

    /// Retries performed since start.
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    async fn run<T, F, Fut>(&self, what: &str, mut call: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        let mut attempt = 1;
        loop {
            match call().await {
                Ok(v) => return Ok(v),
                Err(e) if e.is_retryable() && attempt < self.policy.max_attempts => {
                    let delay = self.policy.backoff(attempt);
                    tracing::debug!(%what, attempt, ?delay, error = %e, "retrying");
                    self.retries.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                Err(e) => {
                    if e.is_retryable() {
                        tracing::warn!(%what, attempts = attempt, error = %e, "giving up");
                    }
                    return Err(e);
                }
            }
        }
    }
}

#[async_trait]
impl ObjectStore for RetryingStore {
    async fn list_page(&self, req: ListRequest<'_>) -> Result<ListPage, StoreError> {
        self.run("LIST", || self.inner.list_page(req)).await
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError> {
        self.run("HEAD", || self.inner.head(key)).await
    }

    async fn get_range(&self, req: RangeRequest<'_>) -> Result<Bytes, StoreError> {
        let expected = req.byte_count();
        self.run("GET", || async {
            let data = self.inner.get_range(req.clone()).await?;
            if data.len() as u64 != expected {
                return Err(StoreError::Transient(
                    format!("short body: {} of {expected} bytes", data.len()).into(),
                ));
            }
            Ok(data)
        })
        .await
    }

    /// Retries until the response starts; a failure midway is the caller's to handle.
    async fn get_range_stream(&self, req: RangeRequest<'_>) -> Result<ByteChunks, StoreError> {
        self.run("GET", || self.inner.get_range_stream(req.clone()))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::{Fault, MemoryStore, Op};

    fn fast() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 4,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(2),
        }
    }

    #[tokio::test]
    async fn retries_transient_errors_and_short_bodies() {
        let mem = Arc::new(MemoryStore::new());
        mem.put("k", "0123456789");
        mem.inject(
            Op::Get,
            Fault::Error(StoreError::Transient("503 SlowDown".into())),
        );
        mem.inject(Op::Get, Fault::Truncate(3));
        let store = RetryingStore::new(mem.clone(), fast());
        let data = store
            .get_range(RangeRequest::any_version("k", 2..8))
            .await
            .unwrap();
        assert_eq!(data, Bytes::from("234567"));
        assert_eq!(mem.count(Op::Get), 3);
        assert_eq!(store.retries(), 2);
    }

    #[tokio::test]
    async fn gives_up_after_max_attempts() {
        let mem = Arc::new(MemoryStore::new());
        mem.put("k", "abc");
        for _ in 0..10 {
            mem.inject(Op::Head, Fault::Error(StoreError::Transient("500".into())));
        }
        let store = RetryingStore::new(mem.clone(), fast());
        assert!(matches!(
            store.head("k").await,
            Err(StoreError::Transient(_))
        ));
        assert_eq!(mem.count(Op::Head), 4);
    }

    #[tokio::test]
    async fn final_errors_are_not_retried() {
        let mem = Arc::new(MemoryStore::new());
        mem.inject(
            Op::Head,
            Fault::Error(StoreError::AccessDenied("no".into())),
        );
        let store = RetryingStore::new(mem.clone(), fast());
        assert!(matches!(
            store.head("k").await,
            Err(StoreError::AccessDenied(_))
        ));
        assert_eq!(mem.count(Op::Head), 1);
    }
}
