//! Which object keys can be shown as POSIX names, and how the tree keeps a name.
//!
//! S3 keys are arbitrary UTF-8 strings; a POSIX path component cannot be empty, `.` or `..`,
//! longer than 255 bytes, or contain NUL. Keys whose components break these rules cannot be
//! shown and are skipped (with one warning each, see [`SkipLog`]).
//!
//! A node keeps its name as a [`Name`]: 16 bytes, holding a name of up to 15 bytes itself
//! (`f0000001`, `img_00042.jpg`, `000012345.jpg`: most names of large datasets) and a longer
//! one in a heap allocation of exactly its length. An `Arc<str>` took 16 bytes too, plus an
//! allocation of its length and 16 bytes of counts for every name: 32 bytes of heap for a
//! name of up to 8 bytes, 48 up to 24, once the allocator's header and rounding are in.

use std::collections::HashSet;
use std::ptr::NonNull;

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

/// A name in 16 bytes (see the module documentation).
pub struct Name(Repr);

/// Inline: the bytes, and their count in the last byte (at most [`INLINE`]). On the heap: a
/// pointer to the bytes (a `Box<[u8]>` of `len` bytes), their count, and [`HEAP`] in the
/// last byte.
#[repr(C)]
union Repr {
    inline: [u8; 16],
    heap: Heap,
}

#[derive(Clone, Copy)]
#[repr(C)]
struct Heap {
    ptr: NonNull<u8>,
    len: u32,
    _pad: [u8; 3],
    tag: u8,
}

/// Names of at most this many bytes are kept inline.
const INLINE: usize = 15;
/// The last byte of a name kept on the heap.
const HEAP: u8 = 0xff;

impl Name {
    pub fn new(name: &str) -> Name {
        let bytes = name.as_bytes();
        if bytes.len() <= INLINE {
            let mut inline = [0u8; 16];
            inline[..bytes.len()].copy_from_slice(bytes);
            inline[15] = bytes.len() as u8;
            return Name(Repr { inline });
        }
        let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX) as usize;
        let boxed: Box<[u8]> = bytes[..len].into();
        let ptr = NonNull::new(Box::into_raw(boxed).cast::<u8>()).unwrap_or(NonNull::dangling());
        Name(Repr {
            heap: Heap {
                ptr,
                len: len as u32,
                _pad: [0; 3],
                tag: HEAP,
            },
        })
    }

    fn on_heap(&self) -> Option<Heap> {
        // SAFETY: both variants keep their tag in the last byte, so reading it is always
        // valid; the heap variant is read only when the tag says it is the one written.
        unsafe { (self.0.inline[15] == HEAP).then_some(self.0.heap) }
    }

    pub fn as_str(&self) -> &str {
        let bytes = match self.on_heap() {
            // SAFETY: `ptr` and `len` are those of the `Box<[u8]>` this name owns (`new`).
            Some(h) => unsafe { std::slice::from_raw_parts(h.ptr.as_ptr(), h.len as usize) },
            // SAFETY: an inline name: the first `inline[15]` (at most 15) bytes are its own.
            None => unsafe { &self.0.inline[..self.0.inline[15] as usize] },
        };
        // Made from a `&str` (`new`): valid UTF-8. (A name cut at u32::MAX bytes could not
        // be, but names are at most 255 bytes: `invalid_reason`.)
        std::str::from_utf8(bytes).unwrap_or_default()
    }
}

impl Drop for Name {
    fn drop(&mut self) {
        if let Some(h) = self.on_heap() {
            let slice = std::ptr::slice_from_raw_parts_mut(h.ptr.as_ptr(), h.len as usize);
            // SAFETY: the `Box<[u8]>` made in `new`, owned by this name alone, dropped once.
            drop(unsafe { Box::from_raw(slice) });
        }
    }
}

impl Clone for Name {
    fn clone(&self) -> Name {
        Name::new(self.as_str())
    }
}

// SAFETY: a name owns its bytes (inline, or a heap allocation nobody else points to) and never
// changes them: sending or sharing it is sending or sharing a `Box<[u8]>`.
unsafe impl Send for Name {}
// SAFETY: as above.
unsafe impl Sync for Name {}

impl std::ops::Deref for Name {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq for Name {
    fn eq(&self, other: &Name) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Name {}

impl std::fmt::Debug for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_sixteen_bytes_and_gives_back_its_text() {
        assert_eq!(std::mem::size_of::<Name>(), 16);
        for text in [
            "",
            "a",
            "f0000001",
            "exactly15bytes!",
            "sixteen_bytes_ab",
            "ünï cödé .jpg",
        ] {
            let name = Name::new(text);
            assert_eq!(name.as_str(), text);
            assert_eq!(name.on_heap().is_some(), text.len() > INLINE, "{text}");
            let copy = name.clone();
            drop(name);
            assert_eq!(&*copy, text);
        }
        let long = "n".repeat(255);
        assert_eq!(Name::new(&long).as_str(), long);
        assert_eq!(Name::new("ab"), Name::new("ab"));
        assert_ne!(Name::new("ab"), Name::new("abc"));
    }

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
