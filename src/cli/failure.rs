//! What kind of failure ended a `riffle` command, told by its exit status.
//!
//! A caller that acts on failures (the CSI plugin's mounter, which answers kubelet with a gRPC
//! code; a script deciding whether to retry) needs the kind, not a sentence to search. So each
//! [`FailureKind`] has its own exit status, written here once and read by the CSI crate from
//! here too:
//!
//! | status | kind | for example |
//! |---|---|---|
//! | 1 | [`FailureKind::Failed`] | anything not below |
//! | 2 | [`FailureKind::InvalidArgument`] | an invalid option or value (clap's own status) |
//! | 3 | [`FailureKind::NothingToTakeOver`] | `--take-over` found no live connection: mount afresh |
//! | 4 | [`FailureKind::NotFound`] | the bucket does not exist |
//! | 5 | [`FailureKind::PermissionDenied`] | access denied, no usable credentials |
//! | 6 | [`FailureKind::Unavailable`] | the endpoint cannot be reached or does not answer |
//! | 7 | [`FailureKind::FailedPrecondition`] | the mountpoint is missing, mounted, not empty; no `/dev/fuse` |
//!
//! An error carries its kind as a [`Failure`] somewhere in its `anyhow` chain (or as a
//! [`StoreError`], whose variant says it); [`kind_of`] finds it. A background mount's daemon
//! sends the kind to the waiting parent on the readiness pipe ([`FailureKind::name`] before
//! the reason), so the parent exits with the daemon's kind.

use crate::store::StoreError;

/// The kind of a failure, and the exit status that tells it (module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    Failed,
    InvalidArgument,
    NothingToTakeOver,
    NotFound,
    PermissionDenied,
    Unavailable,
    FailedPrecondition,
}

impl FailureKind {
    pub const ALL: [FailureKind; 7] = [
        FailureKind::Failed,
        FailureKind::InvalidArgument,
        FailureKind::NothingToTakeOver,
        FailureKind::NotFound,
        FailureKind::PermissionDenied,
        FailureKind::Unavailable,
        FailureKind::FailedPrecondition,
    ];

    /// The exit status of a command that failed this way.
    pub const fn exit_code(self) -> i32 {
        match self {
            FailureKind::Failed => 1,
            FailureKind::InvalidArgument => 2,
            FailureKind::NothingToTakeOver => 3,
            FailureKind::NotFound => 4,
            FailureKind::PermissionDenied => 5,
            FailureKind::Unavailable => 6,
            FailureKind::FailedPrecondition => 7,
        }
    }

    /// The kind an exit status tells; `None` for 0 and statuses no kind has.
    pub fn from_exit_code(code: i32) -> Option<FailureKind> {
        Self::ALL.into_iter().find(|k| k.exit_code() == code)
    }

    /// The kind's word on the readiness pipe.
    pub const fn name(self) -> &'static str {
        match self {
            FailureKind::Failed => "failed",
            FailureKind::InvalidArgument => "invalid-argument",
            FailureKind::NothingToTakeOver => "nothing-to-take-over",
            FailureKind::NotFound => "not-found",
            FailureKind::PermissionDenied => "permission-denied",
            FailureKind::Unavailable => "unavailable",
            FailureKind::FailedPrecondition => "failed-precondition",
        }
    }

    pub fn from_name(name: &str) -> Option<FailureKind> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The kind of a store error met while mounting.
    pub fn of_store_error(e: &StoreError) -> FailureKind {
        match e {
            StoreError::NotFound | StoreError::NoSuchBucket(_) => FailureKind::NotFound,
            StoreError::AccessDenied(_) | StoreError::NoCredentials(_) => {
                FailureKind::PermissionDenied
            }
            StoreError::Transient(_) | StoreError::Unreachable(_) => FailureKind::Unavailable,
            StoreError::Invalid(_) => FailureKind::InvalidArgument,
            StoreError::PreconditionFailed | StoreError::Other(_) => FailureKind::Failed,
        }
    }
}

/// A failure with its kind; its message is the whole error's text.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Failure {
    pub kind: FailureKind,
    pub message: String,
}

impl Failure {
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        Failure {
            kind,
            message: message.into(),
        }
    }
}

/// An `anyhow` error of kind `kind`: `return Err(fail(FailureKind::NotFound, "..."))`.
pub fn fail(kind: FailureKind, message: impl Into<String>) -> anyhow::Error {
    Failure::new(kind, message).into()
}

/// The kind of `e`: the outermost [`Failure`] or [`StoreError`] in its chain, else
/// [`FailureKind::Failed`].
pub fn kind_of(e: &anyhow::Error) -> FailureKind {
    for cause in e.chain() {
        if let Some(f) = cause.downcast_ref::<Failure>() {
            return f.kind;
        }
        if let Some(s) = cause.downcast_ref::<StoreError>() {
            return FailureKind::of_store_error(s);
        }
    }
    FailureKind::Failed
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn every_kind_has_its_own_status_and_name() {
        for k in FailureKind::ALL {
            assert_eq!(FailureKind::from_exit_code(k.exit_code()), Some(k));
            assert_eq!(FailureKind::from_name(k.name()), Some(k));
        }
        assert_eq!(FailureKind::from_exit_code(0), None);
        assert_eq!(FailureKind::from_exit_code(101), None);
    }

    #[test]
    fn the_kind_survives_context() {
        let e = fail(FailureKind::NotFound, "bucket 'x' does not exist").context("mounting");
        assert_eq!(kind_of(&e), FailureKind::NotFound);
        let e = Err::<(), _>(StoreError::AccessDenied("denied".into()))
            .context("listing")
            .unwrap_err();
        assert_eq!(kind_of(&e), FailureKind::PermissionDenied);
        assert_eq!(kind_of(&anyhow::anyhow!("odd")), FailureKind::Failed);
    }
}
