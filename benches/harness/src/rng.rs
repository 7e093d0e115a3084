//! Small deterministic random numbers for the benchmark generators and readers.
//!
//! The datasets and access orders must be the same on every machine and with
//! every version of the harness, so this module does not depend on `rand`'s
//! algorithm choices: [`SplitMix64`] is fully specified here, and so are the
//! shuffle and the distributions built on it.

/// Finalizer of SplitMix64: a bijective 64-bit mixer.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A stable 64-bit hash of a seed and a string (FNV-1a, then mixed).
pub fn hash_str(seed: u64, s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ mix64(seed);
    for b in s.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix64(h ^ (s.len() as u64))
}

/// The SplitMix64 generator (Steele, Lea and Flood), seeded by any `u64`.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        mix64(self.state)
    }

    /// Uniform in `[0, 1)` with 53 bits of precision.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[0, n)`; `n` must be non-zero. Uses Lemire's multiply-shift
    /// (the tiny bias is irrelevant for benchmarks).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `[lo, hi]` (inclusive).
    pub fn range_inclusive(&mut self, lo: u64, hi: u64) -> u64 {
        debug_assert!(lo <= hi);
        lo + self.below(hi - lo + 1)
    }

    /// A standard normal variate (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64(); // (0, 1]
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// A log-normal variate: `exp(mu + sigma * N(0,1))`.
    pub fn log_normal(&mut self, mu: f64, sigma: f64) -> f64 {
        (mu + sigma * self.normal()).exp()
    }

    /// Log-uniform in `[lo, hi]`.
    pub fn log_uniform(&mut self, lo: f64, hi: f64) -> f64 {
        (lo.ln() + self.next_f64() * (hi.ln() - lo.ln())).exp()
    }

    /// Fisher–Yates shuffle in place.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

/// `0..n` shuffled with `seed` (the order a seeded sampler would visit).
pub fn shuffled_indices(n: usize, seed: u64) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    SplitMix64::new(mix64(seed ^ 0x5348_5546_464c_4521)).shuffle(&mut v);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_is_stable() {
        // Reference values of SplitMix64 seeded with 1234567.
        let mut r = SplitMix64::new(1_234_567);
        assert_eq!(r.next_u64(), 6_457_827_717_110_365_317);
        assert_eq!(r.next_u64(), 3_203_168_211_198_807_973);
    }

    #[test]
    fn shuffle_is_a_permutation_and_seeded() {
        let a = shuffled_indices(1000, 7);
        let b = shuffled_indices(1000, 7);
        let c = shuffled_indices(1000, 8);
        assert_eq!(a, b);
        assert_ne!(a, c);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn below_stays_in_range() {
        let mut r = SplitMix64::new(3);
        for n in [1u64, 2, 3, 10, 1 << 40] {
            for _ in 0..1000 {
                assert!(r.below(n) < n);
            }
        }
    }

    #[test]
    fn hash_depends_on_seed_and_text() {
        assert_eq!(hash_str(1, "a/b"), hash_str(1, "a/b"));
        assert_ne!(hash_str(1, "a/b"), hash_str(2, "a/b"));
        assert_ne!(hash_str(1, "a/b"), hash_str(1, "a/c"));
    }
}
