//! The machine a run happened on, read from /proc.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    pub nproc: usize,
    pub memory_gib: f64,
    pub kernel: String,
    pub cpu: String,
}

impl Machine {
    pub fn current() -> Self {
        let nproc = std::thread::available_parallelism().map_or(1, |n| n.get());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory_gib = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(0.0, |kb| kb / (1024.0 * 1024.0));
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("model name"))
                    .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        Self {
            nproc,
            memory_gib,
            kernel,
            cpu,
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "{} cores ({}), {:.0} GiB memory, Linux {}",
            self.nproc, self.cpu, self.memory_gib, self.kernel
        )
    }
}
