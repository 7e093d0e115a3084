//! [`StoreError`], the store's errors classified by what the caller should do about them, and
//! [`Detail`], the text a variant shows together with the error it came from.
//!
//! The text is what users see (in `Display`, in mount errors, in logs) and is made by the
//! store that classified the error, which keeps secrets and noise out of it. The source error
//! is kept for [`std::error::Error::source`], so a caller that walks the chain reaches the
//! underlying error; stores attach only errors that carry no secrets (see [`super::s3`]).

use std::error::Error;
use std::fmt;
use std::sync::Arc;

/// What went wrong talking to the store, classified by what the caller should do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    NotFound,
    /// The bucket's name.
    NoSuchBucket(Detail),
    AccessDenied(Detail),
    PreconditionFailed,
    Invalid(Detail),
    /// Worth retrying: 5xx, 503 SlowDown, timeouts, resets, truncated bodies.
    Transient(Detail),
    /// Cannot connect at all (DNS, refused, TLS); retried, but reported as such at mount.
    Unreachable(Detail),
    /// The credential chain produced nothing usable.
    NoCredentials(Detail),
    Other(Detail),
}

/// The detail of a `StoreError` (by reference, shared or mutable), if its variant has one.
macro_rules! detail_of {
    ($error:expr) => {
        match $error {
            StoreError::NotFound | StoreError::PreconditionFailed => None,
            StoreError::NoSuchBucket(d)
            | StoreError::AccessDenied(d)
            | StoreError::Invalid(d)
            | StoreError::Transient(d)
            | StoreError::Unreachable(d)
            | StoreError::NoCredentials(d)
            | StoreError::Other(d) => Some(d),
        }
    };
}

impl StoreError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Transient(_) | StoreError::Unreachable(_))
    }

    /// The same error, made from `source` (kept only by the variants that carry a detail).
    pub(super) fn with_source(mut self, source: Box<dyn Error + Send + Sync + 'static>) -> Self {
        if let Some(detail) = self.detail_mut() {
            detail.source = Some(Source::from(source));
        }
        self
    }

    fn detail_mut(&mut self) -> Option<&mut Detail> {
        detail_of!(self)
    }

    /// The variant's detail, if it has one.
    fn detail(&self) -> Option<&Detail> {
        detail_of!(self)
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::NotFound => write!(f, "not found"),
            StoreError::NoSuchBucket(bucket) => write!(f, "bucket '{bucket}' does not exist"),
            StoreError::AccessDenied(d) => write!(f, "access denied: {d}"),
            StoreError::PreconditionFailed => {
                write!(f, "the object changed (ETag no longer matches)")
            }
            StoreError::Invalid(d) => write!(f, "invalid request: {d}"),
            StoreError::Transient(d) => write!(f, "transient error: {d}"),
            StoreError::Unreachable(d) => write!(f, "cannot reach the endpoint: {d}"),
            StoreError::NoCredentials(d) => write!(f, "no credentials: {d}"),
            StoreError::Other(d) => write!(f, "{d}"),
        }
    }
}

impl Error for StoreError {
    /// The error the detail was made from (the text itself is in `Display`, not repeated here).
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.detail().and_then(Detail::source)
    }
}

/// The error a [`Detail`] was made from; shared, so that a [`StoreError`] stays `Clone`.
type Source = Arc<dyn Error + Send + Sync + 'static>;

/// A [`StoreError`]'s text, and the error it was made from if the store kept it.
///
/// Two details are equal when their texts are: the source is context, not identity.
#[derive(Clone)]
pub struct Detail {
    text: String,
    source: Option<Source>,
}

impl Detail {
    /// `text`, made from `source`.
    pub fn with_source(
        text: impl Into<String>,
        source: impl Error + Send + Sync + 'static,
    ) -> Detail {
        Detail {
            text: text.into(),
            source: Some(Arc::new(source)),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The error this detail was made from, if kept.
    pub fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}

impl From<String> for Detail {
    fn from(text: String) -> Detail {
        Detail { text, source: None }
    }
}

impl From<&str> for Detail {
    fn from(text: &str) -> Detail {
        Detail::from(text.to_string())
    }
}

impl fmt::Display for Detail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// The text and the source's `Display` only: a source's `Debug` may show more than the store
/// chose to let out (an SDK error's raw response, for one).
impl fmt::Debug for Detail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_tuple("Detail");
        d.field(&self.text);
        if let Some(source) = &self.source {
            d.field(&format_args!("{source}"));
        }
        d.finish()
    }
}

impl PartialEq for Detail {
    fn eq(&self, other: &Detail) -> bool {
        self.text == other.text
    }
}

impl Eq for Detail {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_is_the_message_and_the_source_stays_reachable() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = StoreError::Unreachable(Detail::with_source("connection refused", io));
        assert_eq!(
            e.to_string(),
            "cannot reach the endpoint: connection refused"
        );
        assert_eq!(
            e.source().map(|s| s.to_string()).as_deref(),
            Some("refused")
        );
        assert_eq!(e, StoreError::Unreachable("connection refused".into()));
        assert!(StoreError::AccessDenied("no".into()).source().is_none());
        assert_eq!(
            StoreError::NoSuchBucket("b".into()).to_string(),
            "bucket 'b' does not exist"
        );
    }
}
