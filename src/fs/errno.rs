//! Errno mapping: how the namespace's errors reach FUSE callers.
//!
//! Missing names are ENOENT, denied ones EACCES, and anything the store could not deliver EIO
//! (logged here, once per failed request). Errors become errno values here and in the
//! adapter's fixed answers ([`super`]) and nowhere else.

use fuser::Errno;

use crate::fetch::FetchError;
use crate::namespace::NamespaceError;
use crate::store::StoreError;

pub(super) fn ns_errno(e: &NamespaceError) -> Errno {
    match e {
        NamespaceError::NotFound => Errno::ENOENT,
        NamespaceError::NotADirectory => Errno::ENOTDIR,
        NamespaceError::IsADirectory => Errno::EISDIR,
        NamespaceError::Store(StoreError::NotFound) => Errno::ENOENT,
        NamespaceError::Store(StoreError::AccessDenied(_)) => Errno::EACCES,
        NamespaceError::Store(e) => {
            tracing::warn!(error = %e, "metadata request failed");
            Errno::EIO
        }
    }
}

/// A failed open or read of `key`: EACCES when the store refused this mount's credential
/// the object (logged at debug: the caller sees it), ESTALE for an open of a version that
/// changed, EIO otherwise (logged).
pub(super) fn fetch_errno(key: &str, e: &FetchError) -> Errno {
    match e {
        FetchError::NotPermitted | FetchError::Store(StoreError::AccessDenied(_)) => {
            tracing::debug!(%key, error = %e, "read refused");
            Errno::EACCES
        }
        FetchError::Changed => Errno::ESTALE,
        other => {
            tracing::warn!(%key, error = %other, "could not open the object");
            Errno::EIO
        }
    }
}

/// A failed read of `offset`..+`size` of `key`: EACCES when the store refused this mount's
/// credential the object (as [`fetch_errno`]), EIO otherwise, logged: a version that changed
/// while open (the reader reopens to see the new one) or anything the store could not deliver.
pub(super) fn read_errno(key: &str, offset: u64, size: u32, e: &FetchError) -> Errno {
    match e {
        FetchError::NotPermitted | FetchError::Store(StoreError::AccessDenied(_)) => {
            fetch_errno(key, e)
        }
        FetchError::Changed => {
            tracing::warn!(%key, "object changed while open; failing the read (reopen to see the new version)");
            Errno::EIO
        }
        other => {
            tracing::warn!(%key, offset, size, error = %other, "read failed");
            Errno::EIO
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_errno() {
        let cases = [
            (NamespaceError::NotFound, Errno::ENOENT),
            (NamespaceError::NotADirectory, Errno::ENOTDIR),
            (NamespaceError::IsADirectory, Errno::EISDIR),
            (NamespaceError::Store(StoreError::NotFound), Errno::ENOENT),
            (
                NamespaceError::Store(StoreError::AccessDenied("x".into())),
                Errno::EACCES,
            ),
            (
                NamespaceError::Store(StoreError::Transient("503".into())),
                Errno::EIO,
            ),
            (
                NamespaceError::Store(StoreError::Unreachable("refused".into())),
                Errno::EIO,
            ),
        ];
        for (error, errno) in cases {
            assert_eq!(ns_errno(&error), errno, "{error:?}");
        }
    }

    #[test]
    fn read_errors_map_to_errno() {
        let cases = [
            (FetchError::NotPermitted, Errno::EACCES),
            (
                FetchError::Store(StoreError::AccessDenied("x".into())),
                Errno::EACCES,
            ),
            (FetchError::Changed, Errno::EIO),
            (
                FetchError::Store(StoreError::Transient("503".into())),
                Errno::EIO,
            ),
        ];
        for (error, errno) in cases {
            assert_eq!(read_errno("k", 0, 1, &error), errno, "{error:?}");
        }
    }
}
