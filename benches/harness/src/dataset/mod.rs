//! The standard datasets of `shared/BENCHMARKS.md` as lists of objects.
//!
//! A [`Plan`] is the keys and sizes of one dataset; it depends only on the
//! workload, the scale and the seed. Keys are relative to the dataset's
//! prefix in the bucket (and to the mount root when read through a file
//! system). The bytes of each object come from [`crate::content`].

mod layouts;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub use layouts::{W1_MAX_SIZE, W1_MEAN_SIZE, W1_MIN_SIZE};

/// One of the standard datasets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// A small ImageFolder-like demo tree plus four 16 MiB shards (quickstart).
    Sample,
    /// ImageNet-like: 20,000 files, log-normal sizes around 110 KB, 200 directories.
    W1,
    /// 16 shards of 256 MiB.
    W2,
    /// One 4 GiB token file.
    W3,
    /// Listing: 100,000 objects in one prefix plus 1,000,000 over 1,000 prefixes.
    W4,
    /// Larger than the cache: the W1 data.
    W5,
    /// Millions of small files: 1,000,000 objects of 1–4 KiB over 1,000 directories.
    W7,
}

impl Workload {
    pub const ALL: [Workload; 7] = [
        Workload::Sample,
        Workload::W1,
        Workload::W2,
        Workload::W3,
        Workload::W4,
        Workload::W5,
        Workload::W7,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::Sample => "sample",
            Workload::W1 => "w1",
            Workload::W2 => "w2",
            Workload::W3 => "w3",
            Workload::W4 => "w4",
            Workload::W5 => "w5",
            Workload::W7 => "w7",
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown workload name.
#[derive(Debug, thiserror::Error)]
#[error("unknown workload {0:?} (expected one of sample, w1, w2, w3, w4, w5, w7)")]
pub struct UnknownWorkload(String);

impl FromStr for Workload {
    type Err = UnknownWorkload;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Workload::ALL
            .into_iter()
            .find(|w| w.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownWorkload(s.to_string()))
    }
}

/// One object of a dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectSpec {
    /// Key relative to the dataset prefix.
    pub key: String,
    pub size: u64,
}

/// The objects of one dataset.
#[derive(Debug, Clone)]
pub struct Plan {
    pub workload: Workload,
    pub scale: f64,
    pub seed: u64,
    pub objects: Vec<ObjectSpec>,
}

impl Plan {
    /// The dataset of `workload` at `scale` (1.0 = the standard size; W1, W4
    /// and W5 scale their object counts, W2 and W3 their object sizes, the
    /// sample both).
    pub fn new(workload: Workload, scale: f64, seed: u64) -> Result<Self, InvalidScale> {
        if !(scale.is_finite() && scale > 0.0 && scale <= 1.0) {
            return Err(InvalidScale(scale));
        }
        let objects = match workload {
            Workload::Sample => layouts::sample(scale, seed),
            Workload::W1 | Workload::W5 => layouts::w1(scale, seed),
            Workload::W2 => layouts::w2(scale),
            Workload::W3 => layouts::w3(scale),
            Workload::W4 => layouts::w4(scale, seed),
            Workload::W7 => layouts::w7(scale, seed),
        };
        Ok(Self {
            workload,
            scale,
            seed,
            objects,
        })
    }

    pub fn total_bytes(&self) -> u64 {
        self.objects.iter().map(|o| o.size).sum()
    }
}

/// A scale outside `(0, 1]`.
#[derive(Debug, thiserror::Error)]
#[error("scale must be in (0, 1], got {0}")]
pub struct InvalidScale(pub f64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for w in Workload::ALL {
            assert_eq!(w.name().parse::<Workload>().ok(), Some(w));
        }
        assert!("w9".parse::<Workload>().is_err());
    }

    #[test]
    fn plans_are_deterministic() {
        for w in [Workload::Sample, Workload::W1, Workload::W2, Workload::W4] {
            let a = Plan::new(w, 0.01, 3).expect("plan");
            let b = Plan::new(w, 0.01, 3).expect("plan");
            assert_eq!(a.objects, b.objects, "{w}");
        }
        let a = Plan::new(Workload::W1, 0.05, 1).expect("plan");
        let b = Plan::new(Workload::W1, 0.05, 2).expect("plan");
        assert_ne!(a.objects, b.objects, "seed changes sizes");
    }

    #[test]
    fn scale_is_checked() {
        assert!(Plan::new(Workload::W1, 0.0, 1).is_err());
        assert!(Plan::new(Workload::W1, 1.5, 1).is_err());
        assert!(Plan::new(Workload::W1, f64::NAN, 1).is_err());
    }

    #[test]
    fn keys_are_unique() {
        for w in [Workload::Sample, Workload::W1, Workload::W2, Workload::W3] {
            let p = Plan::new(w, 0.1, 1).expect("plan");
            let mut keys: Vec<_> = p.objects.iter().map(|o| &o.key).collect();
            keys.sort();
            keys.dedup();
            assert_eq!(keys.len(), p.objects.len(), "{w}");
        }
    }
}
