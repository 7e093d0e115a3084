//! The mount on top of a path, from a `/proc/self/mountinfo` text.
//!
//! Each line is `id parent major:minor root mount-point options ... - fstype source options`.
//! Mount points escape space, tab, newline and backslash as octal (`\040` ...), so a field is
//! unescaped before it is compared with the path. When several mounts are stacked on one path
//! the last line is the visible (topmost) one.

use std::path::Path;

/// One mountinfo line's fields that riffle uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry<'a> {
    /// `major:minor` of the mount's device (for a FUSE mount, its backing device in sysfs).
    pub device: &'a str,
    /// The file system type, e.g. `fuse.riffle` or `ext4`.
    pub fstype: &'a str,
}

/// The mount on top of `path` in `mountinfo`, if anything is mounted there.
pub fn find<'a>(mountinfo: &'a str, path: &Path) -> Option<MountEntry<'a>> {
    let want = path.as_os_str().as_encoded_bytes();
    mountinfo.lines().rev().find_map(|line| {
        let mut fields = line.split(' ');
        let device = fields.nth(2)?;
        let point = fields.nth(1)?;
        if unescape(point) != want {
            return None;
        }
        let fstype = line
            .split(" - ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .unwrap_or("");
        Some(MountEntry { device, fstype })
    })
}

/// Undoes mountinfo's octal escapes; a backslash not followed by three octal digits of a
/// byte's value is kept as it is.
fn unescape(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let value = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .map(|d| d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0')))
            .and_then(|v| u8::try_from(v).ok());
        match value {
            Some(v) => {
                out.push(v);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 252:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
40 22 0:39 / /mnt/data rw,nosuid - fuse.riffle riffle ro
41 22 0:40 / /mnt/my\\040data rw - fuse.riffle riffle ro
42 40 0:41 / /mnt/data rw - fuse.other other ro
";

    #[test]
    fn the_mount_on_top_is_found() {
        let top = find(MOUNTINFO, Path::new("/mnt/data")).unwrap();
        assert_eq!(
            top,
            MountEntry {
                device: "0:41",
                fstype: "fuse.other"
            }
        );
        let spaced = find(MOUNTINFO, Path::new("/mnt/my data")).unwrap();
        assert_eq!((spaced.device, spaced.fstype), ("0:40", "fuse.riffle"));
        assert_eq!(find(MOUNTINFO, Path::new("/")).unwrap().fstype, "ext4");
        assert_eq!(find(MOUNTINFO, Path::new("/mnt")), None);
        assert_eq!(find("", Path::new("/")), None);
    }

    #[test]
    fn escapes_are_undone_and_odd_backslashes_kept() {
        assert_eq!(unescape("a\\040b\\011c\\134"), b"a b\tc\\");
        assert_eq!(unescape(r"/mnt/with\040space"), b"/mnt/with space");
        assert_eq!(unescape("/plain"), b"/plain");
        assert_eq!(unescape("a\\9b\\04"), b"a\\9b\\04");
        assert_eq!(unescape("\\777"), b"\\777");
    }
}
