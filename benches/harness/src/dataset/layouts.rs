//! Keys and sizes of each standard dataset (see `shared/BENCHMARKS.md`).
//!
//! Every size depends only on the seed and the key, never on generation
//! order, so a dataset is the same however it is produced.

use super::ObjectSpec;
use crate::rng::{hash_str, SplitMix64};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// W1: mean file size (bytes). ImageNet's average JPEG is about 110 KB.
pub const W1_MEAN_SIZE: f64 = 110_000.0;
/// W1: smallest file (bytes).
pub const W1_MIN_SIZE: u64 = 10_000;
/// W1: largest file (bytes).
pub const W1_MAX_SIZE: u64 = 1_000_000;
/// W1: log-normal shape parameter.
const W1_SIGMA: f64 = 0.75;
const W1_FILES: f64 = 20_000.0;
const W1_DIRS: f64 = 200.0;

fn scaled(n: f64, scale: f64) -> usize {
    ((n * scale).round() as usize).max(1)
}

/// A random source for the size of `key`, independent of other keys.
fn rng_for(seed: u64, key: &str) -> SplitMix64 {
    SplitMix64::new(hash_str(seed ^ 0x5349_5a45, key))
}

/// W1/W5: `train/cNNN/img_NNNNN.jpg`, file `i` in directory `i % dirs`,
/// sizes log-normal with mean ~110 KB clamped to 10 KB–1 MB.
pub fn w1(scale: f64, seed: u64) -> Vec<ObjectSpec> {
    let files = scaled(W1_FILES, scale);
    let dirs = scaled(W1_DIRS, scale).min(files);
    // Mean of a log-normal is exp(mu + sigma^2 / 2).
    let mu = W1_MEAN_SIZE.ln() - W1_SIGMA * W1_SIGMA / 2.0;
    (0..files)
        .map(|i| {
            let key = format!("train/c{:03}/img_{:05}.jpg", i % dirs, i);
            let raw = rng_for(seed, &key).log_normal(mu, W1_SIGMA);
            let size = (raw.round() as u64).clamp(W1_MIN_SIZE, W1_MAX_SIZE);
            ObjectSpec { key, size }
        })
        .collect()
}

/// W2: 16 shards `shards/shard-NNNNN.tar` of 256 MiB × scale (whole MiB).
pub fn w2(scale: f64) -> Vec<ObjectSpec> {
    let size = ((256.0 * scale).round() as u64).max(1) * MIB;
    (0..16)
        .map(|i| ObjectSpec {
            key: format!("shards/shard-{i:05}.tar"),
            size,
        })
        .collect()
}

/// W3: one `tokens.bin` of 4 GiB × scale (whole MiB).
pub fn w3(scale: f64) -> Vec<ObjectSpec> {
    let size = ((4096.0 * scale).round() as u64).max(1) * MIB;
    vec![ObjectSpec {
        key: "tokens.bin".to_string(),
        size,
    }]
}

/// W4: `flat/obj-NNNNNN` (100,000 × scale) and `tree/pNNNN/obj-NNNN`
/// (1,000 × scale prefixes of 1,000 objects), each 0–64 bytes.
pub fn w4(scale: f64, seed: u64) -> Vec<ObjectSpec> {
    let flat = scaled(100_000.0, scale);
    let prefixes = scaled(1_000.0, scale);
    let mut out = Vec::with_capacity(flat + prefixes * 1000);
    let mut small = |key: String| {
        let size = rng_for(seed, &key).below(65);
        out.push(ObjectSpec { key, size });
    };
    for i in 0..flat {
        small(format!("flat/obj-{i:06}"));
    }
    for p in 0..prefixes {
        for i in 0..1000 {
            small(format!("tree/p{p:04}/obj-{i:04}"));
        }
    }
    out
}

/// W7: `dNNNN/fNNNNNNN` (1,000,000 × scale files over 1,000 × scale
/// directories, file `i` in directory `i % dirs`), each 1–4 KiB (uniform):
/// the many-small-files shape of LAION-style sample sets (10^6 of them do
/// not fit the local RGW's in-memory store: `benches/small_files.sh` keeps
/// them in Garage).
pub fn w7(scale: f64, seed: u64) -> Vec<ObjectSpec> {
    let files = scaled(1_000_000.0, scale);
    let dirs = scaled(1_000.0, scale).min(files);
    (0..files)
        .map(|i| {
            let key = format!("d{:04}/f{:07}", i % dirs, i);
            let size = KIB + rng_for(seed, &key).below(3 * KIB + 1);
            ObjectSpec { key, size }
        })
        .collect()
}

/// Classes of the sample ImageFolder (CIFAR-10's).
const SAMPLE_CLASSES: [&str; 10] = [
    "airplane", "bird", "car", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
];
/// Sample: images per class at scale 1.
const SAMPLE_IMAGES_PER_CLASS: f64 = 100.0;
/// Sample: shards, and the size of each at scale 1 (MiB).
const SAMPLE_SHARDS: usize = 4;
const SAMPLE_SHARD_MIB: f64 = 16.0;

/// The quickstart sample, laid out like a training set and nothing else:
/// `images/train/<class>/<class>_NNNN.jpg`, 10 classes of 100 images × scale
/// (at least 1), 10–300 KB (log-uniform), plus `shards/train-NNNNN.tar`, 4
/// shards of 16 MiB × scale (whole MiB, at least 1 MiB).
pub fn sample(scale: f64, seed: u64) -> Vec<ObjectSpec> {
    let per_class = scaled(SAMPLE_IMAGES_PER_CLASS, scale);
    let mut out = Vec::new();
    for class in SAMPLE_CLASSES {
        for i in 0..per_class {
            let key = format!("images/train/{class}/{class}_{i:04}.jpg");
            let size = rng_for(seed, &key).log_uniform(10.0 * KIB as f64, 300.0 * KIB as f64);
            out.push(ObjectSpec {
                key,
                size: size.round() as u64,
            });
        }
    }
    let shard = ((SAMPLE_SHARD_MIB * scale).round() as u64).max(1) * MIB;
    for i in 0..SAMPLE_SHARDS {
        out.push(ObjectSpec {
            key: format!("shards/train-{i:05}.tar"),
            size: shard,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn w1_has_the_standard_shape() {
        let files = w1(1.0, 1);
        assert_eq!(files.len(), 20_000);
        let dirs: std::collections::BTreeSet<_> = files
            .iter()
            .map(|o| o.key.rsplit_once('/').map(|(d, _)| d.to_string()))
            .collect();
        assert_eq!(dirs.len(), 200);
        assert!(files
            .iter()
            .all(|o| (W1_MIN_SIZE..=W1_MAX_SIZE).contains(&o.size)));
        let mean = files.iter().map(|o| o.size as f64).sum::<f64>() / files.len() as f64;
        assert!(
            (mean - W1_MEAN_SIZE).abs() < 0.05 * W1_MEAN_SIZE,
            "mean {mean}"
        );
        // Log-normal, not uniform: the median sits below the mean, and the
        // sizes spread over more than a decade.
        let mut sizes: Vec<u64> = files.iter().map(|o| o.size).collect();
        sizes.sort_unstable();
        let median = sizes[sizes.len() / 2] as f64;
        assert!(median < mean && median > 0.6 * mean, "median {median}");
        assert!(sizes[sizes.len() / 100] < 40_000 && sizes[sizes.len() * 99 / 100] > 300_000);
    }

    #[test]
    fn w1_scales_counts_not_sizes() {
        let small = w1(0.05, 1);
        assert_eq!(small.len(), 1000);
        assert!(small
            .iter()
            .all(|o| (W1_MIN_SIZE..=W1_MAX_SIZE).contains(&o.size)));
        // The same key has the same size at any scale.
        let full = w1(1.0, 1);
        let same_key = full.iter().find(|o| o.key == small[17].key);
        assert!(same_key.is_none() || same_key.map(|o| o.size) == Some(small[17].size));
    }

    #[test]
    fn w2_w3_scale_sizes() {
        assert_eq!(w2(1.0).len(), 16);
        assert!(w2(1.0).iter().all(|o| o.size == 256 * MIB));
        assert!(w2(1.0 / 32.0).iter().all(|o| o.size == 8 * MIB));
        assert_eq!(w3(1.0)[0].size, 4096 * MIB);
        assert_eq!(w3(1.0 / 64.0)[0].size, 64 * MIB);
    }

    #[test]
    fn w4_counts() {
        let objs = w4(0.01, 1);
        assert_eq!(objs.len(), 1000 + 10 * 1000);
        assert!(objs.iter().all(|o| o.size <= 64));
        assert_eq!(w4(1.0, 1).len(), 1_100_000);
    }

    #[test]
    fn w7_counts_and_sizes() {
        let objs = w7(0.01, 1);
        assert_eq!(objs.len(), 10_000);
        assert!(objs.iter().all(|o| (KIB..=4 * KIB).contains(&o.size)));
        let dirs: std::collections::BTreeSet<_> =
            objs.iter().map(|o| o.key.split('/').next()).collect();
        assert_eq!(dirs.len(), 10);
        let mean = objs.iter().map(|o| o.size as f64).sum::<f64>() / objs.len() as f64;
        assert!(
            (mean - 2.5 * KIB as f64).abs() < 0.05 * KIB as f64,
            "mean {mean}"
        );
    }

    #[test]
    fn sample_is_small_and_bounded() {
        let s = sample(1.0, 1);
        assert_eq!(s.len(), 1004);
        assert!(s[..1000].iter().all(
            |o| o.key.starts_with("images/train/") && (10 * KIB..=300 * KIB).contains(&o.size)
        ));
        assert!(s[1000..]
            .iter()
            .all(|o| o.key.starts_with("shards/train-") && o.size == 16 * MIB));
        let classes: std::collections::BTreeSet<_> =
            s[..1000].iter().map(|o| o.key.split('/').nth(2)).collect();
        assert_eq!(classes.len(), 10);
        // Scaled down (the CI quickstart): fewer images, smaller shards.
        let small = sample(0.1, 1);
        assert_eq!(small.len(), 104);
        assert!(small[100..].iter().all(|o| o.size == 2 * MIB));
        assert_eq!(sample(0.001, 1).len(), 14);
    }
}
