//! Latency of FUSE operations, one histogram per kind of operation, recorded without locks.
//!
//! [`FuseOps`] holds, for each [`FuseOp`], a fixed array of atomic bucket counters (upper
//! bounds [`BUCKET_BOUNDS`], 10 µs to 10 s, plus an overflow bucket), the sum of the observed
//! durations in nanoseconds and the number of operations currently in progress. Recording is
//! a binary search over 19 constants and three relaxed `fetch_add`s; each operation's counters
//! sit on their own cache line so that concurrent reads and lookups do not contend. The total
//! count is derived from the buckets when read, so a scrape always sees `count` equal to the
//! `+Inf` bucket even while operations are being recorded.
//!
//! The FUSE adapter times an operation with a guard:
//!
//! ```
//! # use rifflefs::fs::latency::{FuseOp, FuseOps};
//! let ops = FuseOps::new();
//! let timer = ops.start(FuseOp::Read);
//! // ... later, possibly in a task spawned on the runtime (the guard is `Send + 'static`):
//! timer.finish(); // or just drop it after the reply has been sent
//! assert_eq!(ops.snapshot(FuseOp::Read).count, 1);
//! ```
//!
//! The guard owns an `Arc` of the recorder, so it can be moved into the async task that sends
//! the reply; it records exactly once, on [`OpTimer::finish`] or on drop. Bind it to a named
//! variable (`let _t = ...`): `let _ = ops.start(...)` drops it, and records, at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Upper bounds of the histogram buckets, in nanoseconds (Prometheus `le`, inclusive).
pub const BUCKET_BOUNDS: [u64; 19] = [
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// Buckets per operation: the bounded ones and the overflow (`+Inf`) one.
const BUCKETS: usize = BUCKET_BOUNDS.len() + 1;

/// A kind of FUSE operation: the `op` label of the latency histogram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FuseOp {
    Lookup,
    Getattr,
    Open,
    Read,
    Release,
    Flush,
    Fsync,
    Opendir,
    Readdir,
    Readdirplus,
    Releasedir,
    Statfs,
    Getxattr,
    Listxattr,
    Access,
    Readlink,
    /// `ioctl`: answered ENOTTY (Python's `open()` sends one per file, asking `isatty()`).
    Ioctl,
    /// Any call that would modify the tree (write, create, setattr, mkdir, ...), answered EROFS.
    Modify,
    /// Anything else.
    Other,
}

impl FuseOp {
    /// Every kind, in label order.
    pub const ALL: [FuseOp; 19] = [
        FuseOp::Lookup,
        FuseOp::Getattr,
        FuseOp::Open,
        FuseOp::Read,
        FuseOp::Release,
        FuseOp::Flush,
        FuseOp::Fsync,
        FuseOp::Opendir,
        FuseOp::Readdir,
        FuseOp::Readdirplus,
        FuseOp::Releasedir,
        FuseOp::Statfs,
        FuseOp::Getxattr,
        FuseOp::Listxattr,
        FuseOp::Access,
        FuseOp::Readlink,
        FuseOp::Ioctl,
        FuseOp::Modify,
        FuseOp::Other,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            FuseOp::Lookup => "lookup",
            FuseOp::Getattr => "getattr",
            FuseOp::Open => "open",
            FuseOp::Read => "read",
            FuseOp::Release => "release",
            FuseOp::Flush => "flush",
            FuseOp::Fsync => "fsync",
            FuseOp::Opendir => "opendir",
            FuseOp::Readdir => "readdir",
            FuseOp::Readdirplus => "readdirplus",
            FuseOp::Releasedir => "releasedir",
            FuseOp::Statfs => "statfs",
            FuseOp::Getxattr => "getxattr",
            FuseOp::Listxattr => "listxattr",
            FuseOp::Access => "access",
            FuseOp::Readlink => "readlink",
            FuseOp::Ioctl => "ioctl",
            FuseOp::Modify => "modify",
            FuseOp::Other => "other",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The counters of one operation kind, alone on a cache line.
#[repr(align(64))]
#[derive(Default)]
struct OpCounters {
    buckets: [AtomicU64; BUCKETS],
    sum_nanos: AtomicU64,
    in_progress: AtomicU64,
}

/// See the module documentation.
pub struct FuseOps {
    ops: [OpCounters; FuseOp::ALL.len()],
}

impl std::fmt::Debug for FuseOps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut m = f.debug_map();
        for op in FuseOp::ALL {
            m.entry(&op.as_str(), &self.snapshot(op).count);
        }
        m.finish()
    }
}

/// What one operation kind has recorded so far.
#[derive(Debug, Clone, PartialEq)]
pub struct OpSnapshot {
    /// Observations per bucket (not cumulative); the last one is the overflow (`+Inf`) bucket.
    pub buckets: [u64; BUCKETS],
    /// Total of the observed durations, in seconds.
    pub sum_seconds: f64,
    /// Number of observations (the sum of `buckets`).
    pub count: u64,
    /// Operations started and not yet finished.
    pub in_progress: u64,
}

impl FuseOps {
    pub fn new() -> Arc<Self> {
        Arc::new(FuseOps {
            ops: Default::default(),
        })
    }

    /// Starts timing one `op`; the returned guard records the elapsed time when finished or
    /// dropped, and may be moved into the task that sends the reply.
    #[must_use = "the timer records when dropped: bind it with `let _t = ...`"]
    pub fn start(self: &Arc<Self>, op: FuseOp) -> OpTimer {
        self.ops[op.index()]
            .in_progress
            .fetch_add(1, Ordering::Relaxed);
        OpTimer {
            ops: self.clone(),
            op,
            started: Instant::now(),
            done: false,
        }
    }

    /// Records one `op` that took `elapsed` (for callers that time it themselves).
    pub fn record(&self, op: FuseOp, elapsed: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let c = &self.ops[op.index()];
        let bucket = BUCKET_BOUNDS.partition_point(|&bound| bound < nanos);
        c.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        c.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The current values of `op`'s histogram.
    pub fn snapshot(&self, op: FuseOp) -> OpSnapshot {
        let c = &self.ops[op.index()];
        let buckets: [u64; BUCKETS] = std::array::from_fn(|i| c.buckets[i].load(Ordering::Relaxed));
        OpSnapshot {
            count: buckets.iter().sum(),
            buckets,
            sum_seconds: c.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9,
            in_progress: c.in_progress.load(Ordering::Relaxed),
        }
    }

    fn finish(&self, op: FuseOp, elapsed: Duration) {
        self.record(op, elapsed);
        self.ops[op.index()]
            .in_progress
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// Times one FUSE operation; records on [`finish`](OpTimer::finish) or drop, exactly once.
#[must_use = "the timer records when dropped: bind it with `let _t = ...`"]
pub struct OpTimer {
    ops: Arc<FuseOps>,
    op: FuseOp,
    started: Instant,
    done: bool,
}

impl OpTimer {
    /// Records the time since [`FuseOps::start`] and returns it.
    pub fn finish(mut self) -> Duration {
        self.complete()
    }

    #[cfg(test)]
    pub fn op(&self) -> FuseOp {
        self.op
    }

    fn complete(&mut self) -> Duration {
        let elapsed = self.started.elapsed();
        if !self.done {
            self.done = true;
            self.ops.finish(self.op, elapsed);
        }
        elapsed
    }
}

impl Drop for OpTimer {
    fn drop(&mut self) {
        self.complete();
    }
}

impl std::fmt::Debug for OpTimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpTimer")
            .field("op", &self.op)
            .field("started", &self.started)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket_of(d: Duration) -> usize {
        let ops = FuseOps::new();
        ops.record(FuseOp::Other, d);
        let s = ops.snapshot(FuseOp::Other);
        s.buckets.iter().position(|&n| n == 1).unwrap_or(usize::MAX)
    }

    #[test]
    fn labels_are_distinct_and_indexes_match() {
        let mut seen = std::collections::HashSet::new();
        for (i, op) in FuseOp::ALL.into_iter().enumerate() {
            assert_eq!(op.index(), i);
            assert!(seen.insert(op.as_str()));
        }
    }

    #[test]
    fn durations_land_in_the_right_bucket() {
        assert_eq!(bucket_of(Duration::ZERO), 0);
        assert_eq!(bucket_of(Duration::from_micros(10)), 0, "le is inclusive");
        assert_eq!(bucket_of(Duration::from_nanos(10_001)), 1);
        assert_eq!(bucket_of(Duration::from_millis(3)), 8);
        assert_eq!(bucket_of(Duration::from_secs(10)), 18);
        assert_eq!(bucket_of(Duration::from_secs(11)), 19, "overflow bucket");
        assert_eq!(bucket_of(Duration::MAX), 19);
    }

    #[test]
    fn records_into_the_histogram_of_its_op_only() {
        let ops = FuseOps::new();
        ops.record(FuseOp::Read, Duration::from_millis(2));
        ops.record(FuseOp::Read, Duration::from_millis(2));
        ops.record(FuseOp::Lookup, Duration::from_micros(5));
        let read = ops.snapshot(FuseOp::Read);
        assert_eq!(read.count, 2);
        assert_eq!(read.buckets[7], 2, "2 ms is in the (1 ms, 2.5 ms] bucket");
        assert!((read.sum_seconds - 0.004).abs() < 1e-9);
        let lookup = ops.snapshot(FuseOp::Lookup);
        assert_eq!(lookup.count, 1);
        assert_eq!(lookup.buckets[0], 1);
        for op in FuseOp::ALL {
            if op != FuseOp::Read && op != FuseOp::Lookup {
                assert_eq!(ops.snapshot(op).count, 0, "{op:?}");
            }
        }
    }

    #[test]
    fn timer_records_once_and_tracks_in_progress() {
        let ops = FuseOps::new();
        let t = ops.start(FuseOp::Open);
        assert_eq!(t.op(), FuseOp::Open);
        assert_eq!(ops.snapshot(FuseOp::Open).in_progress, 1);
        assert_eq!(ops.snapshot(FuseOp::Open).count, 0);
        let elapsed = t.finish();
        let s = ops.snapshot(FuseOp::Open);
        assert_eq!((s.count, s.in_progress), (1, 0));
        assert!(s.sum_seconds <= elapsed.as_secs_f64() + 1e-9);
        {
            let _t = ops.start(FuseOp::Open);
        }
        assert_eq!(ops.snapshot(FuseOp::Open).count, 2, "drop records too");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn timer_moved_into_a_spawned_task_records_there() {
        let ops = FuseOps::new();
        let t = ops.start(FuseOp::Read);
        let task = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            drop(t);
        });
        assert_eq!(ops.snapshot(FuseOp::Read).count, 0);
        task.await.expect("task");
        let s = ops.snapshot(FuseOp::Read);
        assert_eq!((s.count, s.in_progress), (1, 0));
        assert!(s.sum_seconds >= 0.030, "{}", s.sum_seconds);
        // 30 ms or more lands in a bucket above 25 ms.
        assert_eq!(s.buckets[..11].iter().sum::<u64>(), 0);
    }

    #[test]
    fn concurrent_recording_loses_nothing() {
        let ops = FuseOps::new();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for i in 0..10_000u64 {
                        ops.record(FuseOp::Getattr, Duration::from_micros(i % 2000));
                    }
                });
            }
        });
        assert_eq!(ops.snapshot(FuseOp::Getattr).count, 40_000);
    }
}
