//! A deterministic cache simulator for eviction policies: the hit ratios behind `--eviction`.
//!
//! [`simulate`] drives any [`EvictionPolicy`] over a [`Workload`] — a sequence of epochs, each
//! a sequence of accesses to `N` equally sized objects — with a capacity in objects, the way
//! [`super::DiskCache`] does for `read_block` then, on a miss, `write_block`: a hit touches the
//! entry; a miss inserts it, evicts victims until it fits — never the new entry itself nor a
//! pinned one (the last [`SimOptions::pinned_recent`] objects opened stay pinned, like files
//! held open by data-loader workers) — and touches it after the write; when nothing can go the
//! entry is dropped again (the cache's `Full`). A test checks that a real [`super::DiskCache`]
//! gets exactly the simulator's hits for every policy. Extra touches
//! per access model the per-block touches of the real cache. [`belady_min`] computes the
//! optimum for a trace (Belady's MIN: on a miss evict the cached object whose next use is
//! furthest), and [`TraceOracle`] is a [`PlanOracle`] over a known plan, for the plan policy.
//!
//! Everything is seeded ([`SplitMix64`]), so results are exact and repeatable; the tests pin
//! properties of the algorithms, not timings.
//!
//! # Results
//! `cargo test -p rifflefs --lib cache::simulate -- --nocapture` prints the tables. W5: 2,000
//! objects, capacity 1,000 (50%), 3 epochs, a fresh seeded shuffle per epoch (seed 5); hit
//! ratio per epoch, hits in brackets (epoch 1 is cold for every policy):
//!
//! ```text
//! policy                        epoch 1        epoch 2        epoch 3
//! lru                    0.0000 (   0)  0.1485 ( 297)  0.1605 ( 321)
//! epoch                  0.0000 (   0)  0.4995 ( 999)  0.4995 ( 999)
//! plan (per-epoch plan)  0.0000 (   0)  0.4995 ( 999)  0.5000 (1000)
//! plan (whole future)    0.0000 (   0)  0.5000 (1000)  0.5000 (1000)
//! optimum (Belady MIN)   0.0000 (   0)  0.5000 (1000)  0.5000 (1000)
//! ```
//!
//! Eight more seeds give the same picture (epochs 2–3: LRU 0.152–0.162, epoch 0.4993–0.5000,
//! plan with per-epoch plans 0.4995–0.5000, plan with the whole future = optimum = 0.5000).
//! On a fresh shuffle no policy can hit more than `capacity / N` of an epoch (each object is
//! read once per epoch, so only what was cached when the epoch began can hit); the epoch
//! policy gets within one or two accesses of that without a plan. A per-epoch plan loses at
//! most the first access of an epoch, when it misses into a cache full of objects the new
//! plan needs.
//!
//! The `robustness` test prints more workloads (hit ratio of epochs 2 on; capacity 1,000
//! unless noted):
//!
//! ```text
//! workload                              lru    epoch  plan/epoch  optimum
//! W5, 6 epochs                          0.156  0.499  0.500       0.500
//! W5, 16 pinned readers, 4 touches      0.154  0.493  0.494       -
//! same order every epoch                0.000  0.500  0.500       0.500
//! shuffle, 20,000 objects, cache 10%    0.005  0.100  0.100       0.100
//! shuffle, 20,000 objects, cache 50%    0.153  0.500  0.500       0.500
//! shuffle + 10 hot files                0.229  0.540  0.540       0.541
//! shuffle + 1 file read every 10        0.230  0.544  0.545       0.545
//! two jobs on one dataset, interleaved  0.327  0.406  0.665       0.722
//! dataset A ×3, then B ×3 (epochs 4–6)  0.101  0.167  0.333       0.333
//! 1,000 old objects found at start-up   0.148  0.499  0.499       -
//! Zipf 1.0 over 10,000 (no epochs)      0.674  0.671  0.794       0.816
//! uniform random                        0.494  0.506  0.678       0.785
//! ```
//!
//! With read-ahead (the next 64 objects fetched into the cache after each read; everything
//! then hits, so the cost is in fetches): W5 takes 5,443 fetches with LRU, 4,082 with epoch
//! and 4,064 with plan, for 6,000 reads (the minimum is 4,000); the same order every epoch
//! 5,999 / 3,999 / 3,999.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::RwLock;

use super::evict::{make_policy, EntryInfo, EvictionKind, EvictionPolicy, PlanOracle, Slot};
use super::identity::{EntryKey, ObjectIdentity};

/// A small seeded generator (SplitMix64): stable across versions, unlike `rand`'s.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`; the modulo bias is irrelevant here).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// A uniform float in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Fisher–Yates.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
}

/// Accesses to objects `0..keys.len()`, in epochs.
#[derive(Debug, Clone)]
pub struct Workload {
    pub keys: Vec<EntryKey>,
    pub epochs: Vec<Vec<u32>>,
}

impl Workload {
    /// `objects` objects with real cache keys (of `sim/obj-<i>`), and no accesses yet.
    pub fn new(objects: usize) -> Self {
        let keys = (0..objects)
            .map(|i| ObjectIdentity::new("sim", "bucket", format!("obj-{i}"), "etag", 1 << 20))
            .map(|id| id.entry_key())
            .collect();
        Workload {
            keys,
            epochs: Vec::new(),
        }
    }

    /// W5: every object once per epoch, a fresh seeded permutation each epoch.
    pub fn shuffled(objects: usize, epochs: usize, seed: u64) -> Self {
        let mut w = Workload::new(objects);
        let mut rng = SplitMix64::new(seed);
        for _ in 0..epochs {
            let mut order: Vec<u32> = (0..objects as u32).collect();
            rng.shuffle(&mut order);
            w.epochs.push(order);
        }
        w
    }

    /// Every object once per epoch, in the same (listing) order every time.
    pub fn sequential(objects: usize, epochs: usize) -> Self {
        let mut w = Workload::new(objects);
        for _ in 0..epochs {
            w.epochs.push((0..objects as u32).collect());
        }
        w
    }

    /// `accesses` independent draws per epoch from a Zipf(`s`) popularity over the objects
    /// (object 0 the most popular): no epochs at all, only recency and frequency.
    pub fn zipf(objects: usize, accesses: usize, epochs: usize, s: f64, seed: u64) -> Self {
        let mut w = Workload::new(objects);
        let mut cdf = Vec::with_capacity(objects);
        let mut sum = 0.0;
        for i in 0..objects {
            sum += 1.0 / ((i + 1) as f64).powf(s);
            cdf.push(sum);
        }
        let mut rng = SplitMix64::new(seed);
        // Popularity is not correlated with the key: permute which object is popular.
        let mut names: Vec<u32> = (0..objects as u32).collect();
        rng.shuffle(&mut names);
        for _ in 0..epochs {
            let mut e = Vec::with_capacity(accesses);
            for _ in 0..accesses {
                let u = rng.unit() * sum;
                let i = cdf
                    .partition_point(|&c| c < u)
                    .min(objects.saturating_sub(1));
                e.push(names[i]);
            }
            w.epochs.push(e);
        }
        w
    }

    pub fn accesses(&self) -> usize {
        self.epochs.iter().map(Vec::len).sum()
    }
}

/// How the simulated cache is used.
#[derive(Debug, Clone, Default)]
pub struct SimOptions {
    /// Objects the cache holds.
    pub capacity: usize,
    /// The last this many objects opened are pinned (not evictable), as open files are.
    pub pinned_recent: usize,
    /// Touches per access beyond the first (the real cache touches per block and on open).
    pub extra_touches: u32,
    /// Read-ahead depth: after each access the next this many objects of the trace are
    /// fetched into the cache if absent (not pinned: they can be evicted before use).
    pub prefetch: usize,
    /// Objects found on disk at start-up, newest first (handed to the policy with a
    /// `last_used` time, as the cache's scan does); at most `capacity` are kept.
    pub found: Vec<u32>,
}

impl SimOptions {
    pub fn new(capacity: usize) -> Self {
        SimOptions {
            capacity,
            ..SimOptions::default()
        }
    }
}

/// Hits of one epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EpochStats {
    pub accesses: u64,
    pub hits: u64,
}

impl EpochStats {
    pub fn hit_ratio(&self) -> f64 {
        if self.accesses == 0 {
            0.0
        } else {
            self.hits as f64 / self.accesses as f64
        }
    }
}

/// The outcome of a simulation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimReport {
    pub epochs: Vec<EpochStats>,
    pub evictions: u64,
    /// Misses that could not be cached (nothing evictable).
    pub refused: u64,
    /// Objects fetched ahead of the reader ([`SimOptions::prefetch`]).
    pub prefetched: u64,
    /// Of those, evicted before the reader got to them.
    pub wasted: u64,
}

impl SimReport {
    /// Hit ratio of epoch `e` (0-based); 0 for an epoch that does not exist.
    pub fn hit_ratio(&self, e: usize) -> f64 {
        self.epochs.get(e).map_or(0.0, EpochStats::hit_ratio)
    }

    /// Hit ratio over all epochs from `from` on.
    pub fn hit_ratio_from(&self, from: usize) -> f64 {
        let (a, h) = self
            .epochs
            .iter()
            .skip(from)
            .fold((0, 0), |(a, h), e| (a + e.accesses, h + e.hits));
        if a == 0 {
            0.0
        } else {
            h as f64 / a as f64
        }
    }

    pub fn ratios(&self) -> Vec<f64> {
        self.epochs.iter().map(EpochStats::hit_ratio).collect()
    }
}

/// What the simulation is about to do (for oracles that follow the reader).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Epoch `epoch` begins at trace position `position`.
    EpochStart { epoch: usize, position: u64 },
    /// The reader opens `object`, access number `position` of the whole trace; the cache is
    /// consulted right after.
    Open {
        epoch: usize,
        position: u64,
        object: u32,
    },
}

/// Runs `policy` over `w` (see the module documentation). `observer` sees every step before
/// the cache does.
pub fn simulate(
    policy: &mut dyn EvictionPolicy,
    w: &Workload,
    opts: &SimOptions,
    observer: &mut dyn FnMut(Step),
) -> SimReport {
    let mut sim = Sim {
        keys: &w.keys,
        cached: vec![false; w.keys.len()],
        unread: vec![false; w.keys.len()],
        pins: vec![0; w.keys.len()],
        used: 0,
        capacity: opts.capacity,
        report: SimReport::default(),
    };
    let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    for (age, &o) in opts.found.iter().enumerate() {
        let o = o as usize;
        if o >= sim.keys.len() || sim.cached[o] || sim.used >= opts.capacity {
            continue;
        }
        // Object `o` is in slot `o`.
        policy.insert(
            o as Slot,
            &EntryInfo {
                key: w.keys[o],
                bytes: 1,
                last_used: Some(start - Duration::from_secs(age as u64)),
            },
            &w.keys,
        );
        sim.cached[o] = true;
        sim.used += 1;
    }
    let flat: Vec<usize> = w.epochs.iter().flatten().map(|&o| o as usize).collect();
    let mut recent: VecDeque<usize> = VecDeque::new();
    let mut position = 0usize;
    for (e, epoch) in w.epochs.iter().enumerate() {
        observer(Step::EpochStart {
            epoch: e,
            position: position as u64,
        });
        let mut stats = EpochStats::default();
        for &object in epoch {
            observer(Step::Open {
                epoch: e,
                position: position as u64,
                object,
            });
            position += 1;
            let o = object as usize;
            if o >= w.keys.len() {
                continue;
            }
            stats.accesses += 1;
            if sim.cached[o] {
                stats.hits += 1;
                sim.unread[o] = false;
                policy.touch(o as Slot, &w.keys);
            } else {
                sim.fill(policy, o);
            }
            if sim.cached[o] {
                for _ in 0..opts.extra_touches {
                    policy.touch(o as Slot, &w.keys);
                }
            }
            if opts.pinned_recent > 0 {
                sim.pins[o] += 1;
                recent.push_back(o);
                if recent.len() > opts.pinned_recent {
                    if let Some(old) = recent.pop_front() {
                        sim.pins[old] -= 1;
                    }
                }
            }
            // Read-ahead: the next `prefetch` objects of the trace are fetched into the cache.
            for &q in flat.iter().skip(position).take(opts.prefetch) {
                if q < sim.keys.len() && !sim.cached[q] {
                    sim.report.prefetched += 1;
                    sim.fill(policy, q);
                    sim.unread[q] = sim.cached[q];
                }
            }
        }
        sim.report.epochs.push(stats);
    }
    sim.report
}

struct Sim<'a> {
    keys: &'a Vec<EntryKey>,
    cached: Vec<bool>,
    /// Prefetched and not read yet.
    unread: Vec<bool>,
    pins: Vec<u32>,
    used: usize,
    capacity: usize,
    report: SimReport,
}

impl Sim<'_> {
    /// Caches object `o` as the cache does after a miss (or a prefetch): the entry is created,
    /// victims are evicted until it fits, the block is written and the entry touched.
    fn fill(&mut self, policy: &mut dyn EvictionPolicy, o: usize) {
        let keys = self.keys;
        let at = o as Slot;
        policy.insert(
            at,
            &EntryInfo {
                key: keys[o],
                bytes: 0,
                last_used: None,
            },
            keys,
        );
        while self.used >= self.capacity {
            let (cached, pins) = (&self.cached, &self.pins);
            let victim = policy.victim(keys, &mut |s| {
                let j = s as usize;
                s != at && cached.get(j) == Some(&true) && pins.get(j) == Some(&0)
            });
            let Some(v) = victim.map(|v| v as usize) else {
                self.report.refused += 1;
                policy.remove(at);
                return;
            };
            policy.remove(v as Slot);
            self.cached[v] = false;
            self.used -= 1;
            self.report.evictions += 1;
            if std::mem::take(&mut self.unread[v]) {
                self.report.wasted += 1;
            }
        }
        self.cached[o] = true;
        self.used += 1;
        policy.touch(at, keys);
    }
}

/// Which plan the plan policy gets in [`run`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanMode {
    /// The current epoch's order, set when the epoch starts (what a sampler's `set_epoch`
    /// gives).
    PerEpoch,
    /// The whole trace, known from the start.
    WholeTrace,
}

/// Runs the policy of `kind` over `w`; `Plan` gets a [`TraceOracle`] fed as `mode` says.
pub fn run(kind: EvictionKind, w: &Workload, opts: &SimOptions, mode: PlanMode) -> SimReport {
    if kind != EvictionKind::Plan {
        let mut policy = make_policy(kind, None);
        return simulate(policy.as_mut(), w, opts, &mut |_| {});
    }
    let oracle = Arc::new(TraceOracle::new(w.keys.clone()));
    let mut policy = make_policy(kind, Some(oracle.clone()));
    if mode == PlanMode::WholeTrace {
        let all: Vec<u32> = w.epochs.iter().flatten().copied().collect();
        oracle.set_plan(&all);
    }
    let mut base = 0u64;
    simulate(policy.as_mut(), w, opts, &mut |step| match (step, mode) {
        (Step::EpochStart { epoch, position }, PlanMode::PerEpoch) => {
            if let Some(e) = w.epochs.get(epoch) {
                oracle.set_plan(e);
            }
            base = position;
        }
        (Step::Open { position, .. }, _) => oracle.opened(position - base),
        _ => {}
    })
}

/// Belady's MIN for `w` with `capacity` objects: the most hits any policy can get when every
/// miss must be cached (no pinning, nothing found at start-up).
pub fn belady_min(w: &Workload, capacity: usize) -> SimReport {
    let trace: Vec<usize> = w.epochs.iter().flatten().map(|&o| o as usize).collect();
    let n = w.keys.len();
    let mut next_use = vec![u64::MAX; trace.len()];
    let mut seen = vec![u64::MAX; n];
    for (i, &o) in trace.iter().enumerate().rev() {
        if o < n {
            next_use[i] = seen[o];
            seen[o] = i as u64;
        }
    }
    let mut current = vec![None::<u64>; n];
    let mut cached: BTreeSet<(u64, usize)> = BTreeSet::new();
    let mut report = SimReport::default();
    let mut i = 0;
    for epoch in &w.epochs {
        let mut stats = EpochStats::default();
        for &o in epoch {
            let o = o as usize;
            let nu = next_use[i];
            i += 1;
            if o >= n {
                continue;
            }
            stats.accesses += 1;
            if let Some(old) = current[o] {
                stats.hits += 1;
                cached.remove(&(old, o));
            } else {
                if capacity == 0 {
                    report.refused += 1;
                    continue;
                }
                if cached.len() >= capacity {
                    if let Some((_, v)) = cached.pop_last() {
                        current[v] = None;
                        report.evictions += 1;
                    }
                }
            }
            cached.insert((nu, o));
            current[o] = Some(nu);
        }
        report.epochs.push(stats);
    }
    report
}

/// A [`PlanOracle`] over a known plan of objects, for the simulator and tests: positions are
/// set by [`TraceOracle::opened`], plans by [`TraceOracle::set_plan`].
#[derive(Debug)]
pub struct TraceOracle {
    keys: Vec<EntryKey>,
    /// Each key's plan indices, ascending.
    uses: RwLock<HashMap<EntryKey, Vec<u64>>>,
    /// Items opened so far: the reader's position.
    position: AtomicU64,
    generation: AtomicU64,
}

impl TraceOracle {
    /// An oracle for objects with these keys and no plan.
    pub fn new(keys: Vec<EntryKey>) -> Self {
        TraceOracle {
            keys,
            uses: RwLock::new(HashMap::new()),
            position: AtomicU64::new(0),
            generation: AtomicU64::new(0),
        }
    }

    /// Replaces the plan (objects by index; unknown ones are ignored); the position goes back
    /// to 0.
    pub fn set_plan(&self, plan: &[u32]) {
        let mut uses: HashMap<EntryKey, Vec<u64>> = HashMap::new();
        for (i, &o) in plan.iter().enumerate() {
            if let Some(&k) = self.keys.get(o as usize) {
                uses.entry(k).or_default().push(i as u64);
            }
        }
        *self.uses.write() = uses;
        self.position.store(0, Ordering::SeqCst);
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    pub fn clear(&self) {
        self.set_plan(&[]);
    }

    /// The reader opened plan item `index` (and everything before it).
    pub fn opened(&self, index: u64) {
        self.position
            .fetch_max(index.saturating_add(1), Ordering::SeqCst);
    }
}

impl PlanOracle for TraceOracle {
    fn next_use(&self, key: EntryKey) -> Option<u64> {
        let position = self.position.load(Ordering::SeqCst);
        let uses = self.uses.read();
        let v = uses.get(&key)?;
        v.get(v.partition_point(|&i| i < position)).copied()
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const KINDS: [EvictionKind; 3] = [EvictionKind::Lru, EvictionKind::Epoch, EvictionKind::Plan];

    fn row(name: &str, r: &[f64]) -> String {
        let cells: Vec<String> = r.iter().map(|x| format!("{x:>7.3}")).collect();
        format!("{name:<22} {}", cells.join("  "))
    }

    #[test]
    fn the_simulator_counts_like_the_cache() {
        // 3 objects, room for 2, LRU: a b c a → miss miss miss(evicts a) miss(evicts b).
        let mut w = Workload::new(3);
        w.epochs = vec![vec![0, 1, 2, 0], vec![0, 2]];
        let r = run(
            EvictionKind::Lru,
            &w,
            &SimOptions::new(2),
            PlanMode::PerEpoch,
        );
        assert_eq!(
            r.epochs,
            vec![
                EpochStats {
                    accesses: 4,
                    hits: 0
                },
                EpochStats {
                    accesses: 2,
                    hits: 2
                }
            ]
        );
        assert_eq!(r.evictions, 2);
        // Everything pinned: the miss is not cached.
        let opts = SimOptions {
            pinned_recent: 5,
            ..SimOptions::new(2)
        };
        let r = run(EvictionKind::Lru, &w, &opts, PlanMode::PerEpoch);
        assert_eq!(r.refused, 2);
        // MIN on the same trace: a b c(evicts b, used never) a hit; then a hit, c hit.
        let m = belady_min(&w, 2);
        assert_eq!(m.ratios(), vec![0.25, 1.0]);
        // Deterministic.
        let a = Workload::shuffled(100, 2, 7);
        let b = Workload::shuffled(100, 2, 7);
        assert_eq!(a.epochs, b.epochs);
        assert_ne!(a.epochs[0], a.epochs[1]);
    }

    #[test]
    fn the_trace_oracle_answers_next_uses() {
        let w = Workload::new(3);
        let o = TraceOracle::new(w.keys.clone());
        assert_eq!(o.next_use(w.keys[0]), None);
        o.set_plan(&[1, 0, 1, 2]);
        assert_eq!(o.generation(), 1);
        assert_eq!(o.next_use(w.keys[1]), Some(0));
        o.opened(0);
        assert_eq!(o.next_use(w.keys[1]), Some(2));
        assert_eq!(o.next_use(w.keys[0]), Some(1));
        o.opened(2);
        assert_eq!(o.next_use(w.keys[1]), None);
        assert_eq!(o.next_use(w.keys[2]), Some(3));
        o.clear();
        assert_eq!(o.next_use(w.keys[2]), None);
    }

    /// W5: the table in the module documentation.
    #[test]
    fn w5_hit_ratios() {
        let w = Workload::shuffled(2000, 3, 5);
        let opts = SimOptions::new(1000);
        let lru = run(EvictionKind::Lru, &w, &opts, PlanMode::PerEpoch);
        let epoch = run(EvictionKind::Epoch, &w, &opts, PlanMode::PerEpoch);
        let plan_epoch = run(EvictionKind::Plan, &w, &opts, PlanMode::PerEpoch);
        let plan = run(EvictionKind::Plan, &w, &opts, PlanMode::WholeTrace);
        let min = belady_min(&w, 1000);
        println!("\nW5: 2,000 objects, capacity 1,000, 3 shuffled epochs: hit ratio (hits)");
        println!(
            "{:<22} {:>14} {:>14} {:>14}",
            "policy", "epoch 1", "epoch 2", "epoch 3"
        );
        for (name, r) in [
            ("lru", &lru),
            ("epoch", &epoch),
            ("plan (per-epoch plan)", &plan_epoch),
            ("plan (whole future)", &plan),
            ("optimum (Belady MIN)", &min),
        ] {
            let cells: Vec<String> = r
                .epochs
                .iter()
                .map(|e| format!("{:.4} ({:>4})", e.hit_ratio(), e.hits))
                .collect();
            println!("{name:<22} {}", cells.join("  "));
        }
        for e in 1..3 {
            let hits = |r: &SimReport| r.epochs[e].hits;
            assert!(hits(&plan) >= hits(&epoch), "epoch {e}");
            assert!(hits(&epoch) > hits(&lru) + 200, "epoch {e}");
            // Without the future, at most the first access of an epoch is lost.
            assert!(hits(&plan_epoch) + 1 >= hits(&min), "epoch {e}");
            assert!(hits(&epoch) + 10 >= hits(&min), "epoch {e}");
        }
        // Belady with the whole future is the optimum, access for access.
        assert_eq!(plan.epochs, min.epochs);
        assert_eq!(lru.hit_ratio(0), 0.0);

        // The same on other seeds: hit ratio over epochs 2 and 3.
        println!("seed    lru    epoch  plan/epoch  plan/whole  optimum");
        for seed in 100..108 {
            let w = Workload::shuffled(2000, 3, seed);
            let lru = run(EvictionKind::Lru, &w, &opts, PlanMode::PerEpoch);
            let epoch = run(EvictionKind::Epoch, &w, &opts, PlanMode::PerEpoch);
            let plan_epoch = run(EvictionKind::Plan, &w, &opts, PlanMode::PerEpoch);
            let plan = run(EvictionKind::Plan, &w, &opts, PlanMode::WholeTrace);
            let min = belady_min(&w, 1000);
            println!(
                "{seed:<4} {:>6.4} {:>8.4} {:>11.4} {:>11.4} {:>8.4}",
                lru.hit_ratio_from(1),
                epoch.hit_ratio_from(1),
                plan_epoch.hit_ratio_from(1),
                plan.hit_ratio_from(1),
                min.hit_ratio_from(1)
            );
            for e in 1..3 {
                let hits = |r: &SimReport| r.epochs[e].hits;
                assert!(hits(&plan) >= hits(&epoch), "seed {seed} epoch {e}");
                assert!(hits(&epoch) > hits(&lru) + 200, "seed {seed} epoch {e}");
                assert!(hits(&plan_epoch) + 1 >= hits(&min), "seed {seed} epoch {e}");
                assert!(hits(&epoch) + 10 >= hits(&min), "seed {seed} epoch {e}");
            }
            assert_eq!(plan.epochs, min.epochs, "seed {seed}");
        }
    }

    /// Shuffled epochs over `objects` with `hot` extra objects, one of which is read after
    /// every `every` dataset reads (a label file, an index).
    fn with_hot(objects: usize, hot: usize, every: usize, epochs: usize, seed: u64) -> Workload {
        let base = Workload::shuffled(objects, epochs, seed);
        let mut w = Workload::new(objects + hot);
        let mut h = 0;
        for e in &base.epochs {
            let mut out = Vec::new();
            for (i, &o) in e.iter().enumerate() {
                out.push(o);
                if (i + 1) % every == 0 {
                    out.push((objects + h % hot) as u32);
                    h += 1;
                }
            }
            w.epochs.push(out);
        }
        w
    }

    /// Two jobs reading the same dataset at once, each in its own shuffle, interleaved.
    fn two_jobs(objects: usize, epochs: usize, seed: u64) -> Workload {
        let a = Workload::shuffled(objects, epochs, seed);
        let b = Workload::shuffled(objects, epochs, seed + 1);
        let mut w = Workload::new(objects);
        for (x, y) in a.epochs.iter().zip(&b.epochs) {
            w.epochs
                .push(x.iter().zip(y).flat_map(|(&p, &q)| [p, q]).collect());
        }
        w
    }

    /// 3 epochs of dataset A (objects 0..n), then 3 of dataset B (n..2n).
    fn switch(objects: usize, seed: u64) -> Workload {
        let a = Workload::shuffled(objects, 3, seed);
        let b = Workload::shuffled(objects, 3, seed + 1);
        let mut w = Workload::new(2 * objects);
        w.epochs = a.epochs;
        for e in b.epochs {
            w.epochs
                .push(e.into_iter().map(|o| o + objects as u32).collect());
        }
        w
    }

    struct Case {
        name: &'static str,
        w: Workload,
        opts: SimOptions,
    }

    /// Hit ratios per epoch on other workloads: where the epoch policy's assumptions hold, where
    /// they do not, and that nothing squats the cache.
    #[test]
    fn robustness() {
        let found_then_w5 = {
            // 1,000 objects of an old dataset found at start-up, then W5 on 2,000 others.
            let mut w = Workload::shuffled(2000, 3, 11);
            let old = Workload::new(3000);
            w.keys = old.keys;
            Case {
                name: "found at start-up + W5",
                w,
                opts: SimOptions {
                    found: (2000..3000).collect(),
                    ..SimOptions::new(1000)
                },
            }
        };
        let cases = vec![
            Case {
                name: "W5, 6 epochs",
                w: Workload::shuffled(2000, 6, 5),
                opts: SimOptions::new(1000),
            },
            Case {
                name: "W5, readers (16 pinned, 4 touches)",
                w: Workload::shuffled(2000, 3, 5),
                opts: SimOptions {
                    pinned_recent: 16,
                    extra_touches: 3,
                    ..SimOptions::new(1000)
                },
            },
            Case {
                name: "sequential order",
                w: Workload::sequential(2000, 3),
                opts: SimOptions::new(1000),
            },
            Case {
                name: "W5 + read-ahead 64",
                w: Workload::shuffled(2000, 3, 5),
                opts: SimOptions {
                    prefetch: 64,
                    ..SimOptions::new(1000)
                },
            },
            Case {
                name: "W5 + read-ahead 400",
                w: Workload::shuffled(2000, 3, 5),
                opts: SimOptions {
                    prefetch: 400,
                    ..SimOptions::new(1000)
                },
            },
            Case {
                name: "sequential + read-ahead 64",
                w: Workload::sequential(2000, 3),
                opts: SimOptions {
                    prefetch: 64,
                    ..SimOptions::new(1000)
                },
            },
            Case {
                name: "shuffle, cache 10%",
                w: Workload::shuffled(20_000, 3, 9),
                opts: SimOptions::new(2000),
            },
            Case {
                name: "shuffle 20k, cache 50%",
                w: Workload::shuffled(20_000, 3, 9),
                opts: SimOptions::new(10_000),
            },
            Case {
                name: "shuffle + 10 hot files",
                w: with_hot(2000, 10, 10, 3, 3),
                opts: SimOptions::new(1000),
            },
            Case {
                name: "shuffle + 1 file every 10",
                w: with_hot(2000, 1, 10, 3, 3),
                opts: SimOptions::new(1000),
            },
            Case {
                name: "two jobs, one dataset",
                w: two_jobs(2000, 3, 21),
                opts: SimOptions::new(1000),
            },
            Case {
                name: "dataset A x3, then B x3",
                w: switch(2000, 13),
                opts: SimOptions::new(1000),
            },
            found_then_w5,
            Case {
                name: "zipf 1.0 (no epochs)",
                w: Workload::zipf(10_000, 20_000, 3, 1.0, 17),
                opts: SimOptions::new(1000),
            },
            Case {
                name: "uniform random",
                w: Workload::zipf(2000, 2000, 3, 0.0, 19),
                opts: SimOptions::new(1000),
            },
        ];
        println!("\nhit ratio per epoch");
        let mut summary = Vec::new();
        for c in &cases {
            let lru = run(EvictionKind::Lru, &c.w, &c.opts, PlanMode::PerEpoch);
            let epoch = run(EvictionKind::Epoch, &c.w, &c.opts, PlanMode::PerEpoch);
            let plan = run(EvictionKind::Plan, &c.w, &c.opts, PlanMode::PerEpoch);
            let whole = run(EvictionKind::Plan, &c.w, &c.opts, PlanMode::WholeTrace);
            if c.opts.prefetch > 0 {
                println!(
                    "{}: prefetched (wasted) lru {} ({}), epoch {} ({}), plan {} ({})",
                    c.name,
                    lru.prefetched,
                    lru.wasted,
                    epoch.prefetched,
                    epoch.wasted,
                    plan.prefetched,
                    plan.wasted
                );
            } else {
                println!("{}:", c.name);
            }
            println!("{}", row("  lru", &lru.ratios()));
            println!("{}", row("  epoch", &epoch.ratios()));
            println!("{}", row("  plan (per-epoch)", &plan.ratios()));
            println!("{}", row("  plan (whole)", &whole.ratios()));
            let from = if c.name.starts_with("dataset A") {
                3
            } else {
                1
            };
            let mut line = format!(
                "{:<36} {:>6.3} {:>6.3} {:>10.3}",
                c.name,
                lru.hit_ratio_from(from),
                epoch.hit_ratio_from(from),
                plan.hit_ratio_from(from)
            );
            if c.opts.pinned_recent == 0 && c.opts.found.is_empty() && c.opts.prefetch == 0 {
                let min = belady_min(&c.w, c.opts.capacity);
                println!("{}", row("  optimum", &min.ratios()));
                assert_eq!(whole.epochs, min.epochs, "{}", c.name);
                line += &format!(" {:>8.3}", min.hit_ratio_from(from));
            }
            summary.push(line);
            // After the first epoch: far better than LRU on epochs, about as good without
            // them; the plan never worse than the epoch order (within an access per epoch).
            let after = |r: &SimReport| r.hit_ratio_from(1);
            if c.name.starts_with("zipf") || c.name.starts_with("uniform") {
                assert!(after(&epoch) >= after(&lru) - 0.015, "{}", c.name);
            } else if c.opts.prefetch == 0 {
                assert!(after(&epoch) >= after(&lru) + 0.05, "{}", c.name);
            } else {
                assert!(lru.prefetched >= epoch.prefetched, "{}", c.name);
            }
            assert!(after(&plan) >= after(&epoch) - 0.002, "{}", c.name);
            assert!(after(&whole) >= after(&plan) - 0.002, "{}", c.name);
            if c.name.starts_with("dataset A") || c.name.starts_with("found") {
                // Old data is evicted first once it is known to be old.
                let last = c.w.epochs.len() - 1;
                assert!(epoch.hit_ratio(last) > 0.49, "{}", c.name);
                assert!(plan.hit_ratio(last) > 0.49, "{}", c.name);
            }
        }
        println!("\nhit ratio from epoch 2 (dataset A/B: from epoch 4)");
        println!(
            "{:<36} {:>6} {:>6} {:>10} {:>8}",
            "workload", "lru", "epoch", "plan/epoch", "optimum"
        );
        for line in summary {
            println!("{line}");
        }
    }

    /// Cost per access at scale (`--ignored`; prints only: timings on a shared machine).
    #[test]
    #[ignore]
    fn scale() {
        let objects: usize = std::env::var("RIFFLE_SIM_OBJECTS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(200_000);
        let w = Workload::shuffled(objects, 2, 1);
        let opts = SimOptions::new(objects / 2);
        for kind in KINDS {
            let t = std::time::Instant::now();
            let r = run(kind, &w, &opts, PlanMode::PerEpoch);
            let per = t.elapsed().as_nanos() as f64 / w.accesses() as f64;
            // Memory with every entry in the plan (the heap's worst case).
            let oracle = Arc::new(TraceOracle::new(w.keys.clone()));
            oracle.set_plan(&w.epochs[0]);
            let mut p = make_policy(kind, Some(oracle));
            for (o, k) in w.keys[..objects / 2].iter().enumerate() {
                let info = EntryInfo {
                    key: *k,
                    bytes: 1,
                    last_used: None,
                };
                p.insert(o as Slot, &info, &w.keys);
            }
            let mem = p.memory_bytes() as f64 / (objects / 2) as f64;
            println!(
                "{kind:<6} {objects} objects, cache {}: {per:.0} ns/access (with the simulator), \
                 epoch 2 hit ratio {:.3}, policy memory {mem:.0} B/entry",
                objects / 2,
                r.hit_ratio(1)
            );
        }
    }
}
