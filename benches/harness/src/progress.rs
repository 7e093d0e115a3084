//! A progress line on stderr every couple of seconds for long transfers.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Shared counters of a transfer, printed by a background thread.
#[derive(Debug)]
pub struct Progress {
    label: String,
    total_items: u64,
    total_bytes: u64,
    items: AtomicU64,
    bytes: AtomicU64,
    started: Instant,
    stop: AtomicBool,
}

impl Progress {
    /// Starts printing `label: items/total, MB/total MB, MB/s` every
    /// `every` to stderr until [`Progress::finish`].
    pub fn start(label: &str, total_items: u64, total_bytes: u64, every: Duration) -> Arc<Self> {
        let p = Arc::new(Self {
            label: label.to_string(),
            total_items,
            total_bytes,
            items: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            started: Instant::now(),
            stop: AtomicBool::new(false),
        });
        let bg = Arc::clone(&p);
        std::thread::spawn(move || {
            let tick = Duration::from_millis(100);
            let mut next = Instant::now() + every;
            while !bg.stop.load(Ordering::Relaxed) {
                std::thread::sleep(tick);
                if Instant::now() >= next {
                    bg.print();
                    next += every;
                }
            }
        });
        p
    }

    pub fn add(&self, items: u64, bytes: u64) {
        self.items.fetch_add(items, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn add_bytes(&self, bytes: u64) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn items(&self) -> u64 {
        self.items.load(Ordering::Relaxed)
    }

    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    fn print(&self) {
        let secs = self.started.elapsed().as_secs_f64().max(1e-9);
        let mb = self.bytes() as f64 / 1e6;
        let line = format!(
            "{}: {}/{} objects, {:.1}/{:.1} MB, {:.1} MB/s, {:.0} s\n",
            self.label,
            self.items(),
            self.total_items,
            mb,
            self.total_bytes as f64 / 1e6,
            mb / secs,
            secs
        );
        let _ = std::io::stderr().write_all(line.as_bytes());
    }

    /// Stops the printer.
    pub fn finish(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
