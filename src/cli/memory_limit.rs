//! The memory this process may use, for defaults that follow it: its memory cgroup's limit
//! when one is set, else the machine's memory.
//!
//! The limit of a cgroup is the lowest limit on the path from it to the root: a container's
//! runtime sets it on the container's cgroup, a systemd unit's `MemoryMax=` on the unit's, and a
//! parent's limit (a pod's, a slice's) bounds every child. Under cgroup v2 each level's
//! `memory.max` is read (`max` is no limit); under v1 the memory controller reports the
//! effective limit itself (`hierarchical_memory_limit` in `memory.stat`, a value near 2^63 when
//! there is none). Inside a container with a cgroup namespace the process's own cgroup is `/`,
//! the container's. Where nothing can be read (no `/sys/fs/cgroup`, an unknown layout) the
//! machine's `MemTotal` is the limit: a cgroup's limit can only be lower.

use std::fmt;
use std::path::Path;

/// Where a [`MemoryLimit`] came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitSource {
    /// The memory cgroup's limit (the cgroup's path, as in `/proc/self/cgroup`).
    Cgroup(String),
    /// The machine's memory (`MemTotal`): no cgroup limit.
    Machine,
}

/// The memory this process may use, in bytes, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryLimit {
    pub bytes: u64,
    pub source: LimitSource,
}

impl fmt::Display for MemoryLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mib = self.bytes >> 20;
        match &self.source {
            LimitSource::Cgroup(path) => write!(f, "{mib} MiB, the limit of memory cgroup {path}"),
            LimitSource::Machine => write!(f, "{mib} MiB, the machine's memory (no cgroup limit)"),
        }
    }
}

/// This process's memory limit; `None` only when not even `/proc/meminfo` can be read.
pub fn of_this_process() -> Option<MemoryLimit> {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    let machine = read("/proc/meminfo").and_then(|m| mem_total(&m))?;
    let cgroup = read("/proc/self/cgroup")
        .and_then(|own| cgroup_limit(&own, Path::new("/sys/fs/cgroup")))
        .filter(|(bytes, _)| *bytes < machine);
    Some(match cgroup {
        Some((bytes, path)) => MemoryLimit {
            bytes,
            source: LimitSource::Cgroup(path),
        },
        None => MemoryLimit {
            bytes: machine,
            source: LimitSource::Machine,
        },
    })
}

/// `MemTotal` of `/proc/meminfo`'s text, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The memory limit of the cgroup `/proc/self/cgroup` (`own`) names, under the cgroup
/// file system mounted at `root`, and that cgroup's path; `None` when it has none.
fn cgroup_limit(own: &str, root: &Path) -> Option<(u64, String)> {
    for line in own.lines() {
        // `hierarchy-ID:controllers:path`; the path may hold colons.
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if controllers.split(',').any(|c| c == "memory") {
            return v1_limit(&root.join("memory"), path).map(|b| (b, path.to_string()));
        }
        if controllers.is_empty() && root.join("cgroup.controllers").exists() {
            return v2_limit(root, path).map(|b| (b, path.to_string()));
        }
    }
    None
}

/// Under cgroup v1: the memory controller's effective limit of `path` (its own or an
/// ancestor's, whichever is lower).
fn v1_limit(memory_root: &Path, path: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(memory_root.join(relative(path)).join("memory.stat"))
        .or_else(|_| std::fs::read_to_string(memory_root.join("memory.stat")))
        .ok()?;
    let line = stat
        .lines()
        .find(|l| l.starts_with("hierarchical_memory_limit "))?;
    let bytes: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    // No limit reads as the page counter's maximum, about 2^63.
    (bytes < 1 << 62).then_some(bytes)
}

/// Under cgroup v2: the lowest `memory.max` from `path` up to the root.
fn v2_limit(root: &Path, path: &str) -> Option<u64> {
    let mut dir = root.join(relative(path));
    let mut lowest: Option<u64> = None;
    loop {
        if let Ok(text) = std::fs::read_to_string(dir.join("memory.max")) {
            if let Ok(bytes) = text.trim().parse::<u64>() {
                lowest = Some(lowest.map_or(bytes, |l| l.min(bytes)));
            }
        }
        if dir == root || !dir.pop() || !dir.starts_with(root) {
            return lowest;
        }
    }
}

fn relative(path: &str) -> &str {
    path.trim_start_matches('/')
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn write(path: &Path, text: &str) {
        fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        fs::write(path, text).expect("write");
    }

    #[test]
    fn mem_total_is_read_in_bytes() {
        let meminfo = "MemTotal:       24576000 kB\nMemFree:  100 kB\n";
        assert_eq!(mem_total(meminfo), Some(24_576_000 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
    }

    #[test]
    fn v2_takes_the_lowest_limit_up_to_the_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        write(&root.join("cgroup.controllers"), "cpu memory\n");
        write(&root.join("kubepods/memory.max"), "4294967296\n");
        write(&root.join("kubepods/pod1/memory.max"), "max\n");
        write(&root.join("kubepods/pod1/c1/memory.max"), "8589934592\n");
        let own = "0::/kubepods/pod1/c1\n";
        assert_eq!(
            cgroup_limit(own, root),
            Some((4 << 30, "/kubepods/pod1/c1".to_string()))
        );
        write(&root.join("kubepods/memory.max"), "max\n");
        assert_eq!(cgroup_limit(own, root).map(|l| l.0), Some(8 << 30));
        write(&root.join("kubepods/pod1/c1/memory.max"), "max\n");
        assert_eq!(cgroup_limit(own, root), None, "no limit anywhere");
        // A cgroup namespace: the process's cgroup is the root, the container's.
        write(&root.join("memory.max"), "1073741824\n");
        assert_eq!(cgroup_limit("0::/\n", root).map(|l| l.0), Some(1 << 30));
    }

    #[test]
    fn v1_reads_the_memory_controllers_effective_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let own = "9:pids:/\n4:memory:/process_api/abc\n0::/\n";
        write(
            &root.join("memory/process_api/abc/memory.stat"),
            "cache 0\nhierarchical_memory_limit 2147483648\n",
        );
        assert_eq!(
            cgroup_limit(own, root),
            Some((2 << 30, "/process_api/abc".to_string()))
        );
        write(
            &root.join("memory/process_api/abc/memory.stat"),
            "hierarchical_memory_limit 9223372036854771712\n",
        );
        assert_eq!(cgroup_limit(own, root), None, "no limit");
        // Inside a container the host's path is not there: the mounted root is its cgroup.
        write(
            &root.join("memory/memory.stat"),
            "hierarchical_memory_limit 536870912\n",
        );
        assert_eq!(
            cgroup_limit("4:memory:/docker/xyz\n", root).map(|l| l.0),
            Some(512 << 20)
        );
    }

    #[test]
    fn this_process_has_a_limit() {
        let limit = of_this_process().expect("/proc/meminfo");
        assert!(limit.bytes > 0);
    }
}
