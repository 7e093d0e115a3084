//! Which object keys can be shown as POSIX names.
//!
//! S3 keys are arbitrary UTF-8 strings; a POSIX path component cannot be empty, `.` or `..`,
//! longer than 255 bytes, or contain NUL. Keys whose components break these rules cannot be
//! shown and are skipped (with one warning each, see [`SkipLog`]).

use std::collections::HashSet;

use parking_lot::Mutex;

/// The longest file name Linux accepts (NAME_MAX).
pub const NAME_MAX: usize = 255;

/// Why a component cannot be a POSIX name, or `None` if it can.
pub fn invalid_reason(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("it has an empty path component")
    } else if name == "." || name == ".." {
        Some("it has a '.' or '..' path component")
    } else if name.len() > NAME_MAX {
        Some("a path component is longer than 255 bytes")
    } else if name.contains('\0') {
        Some("it contains a NUL byte")
    } else {
        None
    }
}

/// Remembers which keys were already reported so each is logged once per mount.
#[derive(Debug, Default)]
pub struct SkipLog {
    seen: Mutex<HashSet<String>>,
}

impl SkipLog {
    /// Logs a warning for `key` the first time it is reported.
    pub fn skip(&self, key: &str, why: &str) {
        if self.seen.lock().insert(key.to_string()) {
            tracing::warn!(key = %key.escape_debug(), "skipping object: {why}");
        }
    }

    pub fn count(&self) -> usize {
        self.seen.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_what_posix_cannot_name() {
        assert!(invalid_reason("").is_some());
        assert!(invalid_reason(".").is_some());
        assert!(invalid_reason("..").is_some());
        assert!(invalid_reason(&"x".repeat(256)).is_some());
        assert!(invalid_reason("a\0b").is_some());
        assert!(invalid_reason(&"x".repeat(255)).is_none());
        assert!(invalid_reason("ünï cödé .jpg").is_none());
        assert!(invalid_reason("...").is_none());
    }
}
