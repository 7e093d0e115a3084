//! Which files an epoch reads, and in which order: the one place that
//! decides it, shared by `read-fs`, `read-s3`, `copy` and `plan` (the epoch
//! plan handed to `riffle plan`), so a plan and the reader it describes can
//! never disagree.
//!
//! - **The subset** (`--max-files N`, for a time budget): whole directories,
//!   chosen in a shuffle of the directories seeded with `seed` alone, until N
//!   files are reached (the last directory cut short in listing order). It
//!   is the same every epoch, so a second epoch revisits what the first read,
//!   and it is made of whole directories, so a reader in listing order walks
//!   complete directories as `ImageFolder` would.
//! - **The order**: [`Order::Shuffle`] visits the subset (or everything) in a
//!   shuffle seeded with `seed + epoch`, like PyTorch's `DistributedSampler`
//!   at `set_epoch`; [`Order::Listing`] visits it sorted by path, as a reader
//!   of `sorted(os.listdir(...))` does.

use std::collections::BTreeMap;

use crate::manifest::Manifest;
use crate::rng::shuffled_indices;

/// The order an epoch visits its files in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Order {
    /// A shuffle seeded with `seed + epoch` (a new order every epoch).
    #[default]
    Shuffle,
    /// Sorted by path: directory by directory, each in listing order.
    Listing,
}

impl Order {
    pub fn name(self) -> &'static str {
        match self {
            Order::Shuffle => "shuffle",
            Order::Listing => "listing",
        }
    }
}

/// The directory part of a key (`""` for a key without `/`).
fn dir_of(key: &str) -> &str {
    key.rsplit_once('/').map_or("", |(d, _)| d)
}

/// The files read by every epoch with `limit`: whole directories chosen in
/// a shuffle seeded with `seed`, sorted by key; all files (in manifest
/// order) without a limit or when it covers everything.
pub fn subset(manifest: &Manifest, seed: u64, limit: Option<usize>) -> Vec<usize> {
    let n = manifest.entries.len();
    let Some(m) = limit.filter(|&m| m < n) else {
        return (0..n).collect();
    };
    let mut dirs: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, e) in manifest.entries.iter().enumerate() {
        dirs.entry(dir_of(&e.key)).or_default().push(i);
    }
    let dirs: Vec<Vec<usize>> = dirs
        .into_values()
        .map(|mut files| {
            files.sort_by(|&a, &b| manifest.entries[a].key.cmp(&manifest.entries[b].key));
            files
        })
        .collect();
    let mut chosen = Vec::with_capacity(m);
    for d in shuffled_indices(dirs.len(), seed) {
        let want = m - chosen.len();
        chosen.extend(dirs[d].iter().take(want));
        if chosen.len() >= m {
            break;
        }
    }
    sort_by_key(manifest, &mut chosen);
    chosen
}

fn sort_by_key(manifest: &Manifest, v: &mut [usize]) {
    v.sort_by(|&a, &b| manifest.entries[a].key.cmp(&manifest.entries[b].key));
}

/// The manifest indices an epoch reads, in the order it opens them.
pub fn epoch_files(
    manifest: &Manifest,
    seed: u64,
    epoch: u32,
    limit: Option<usize>,
    order: Order,
) -> Vec<usize> {
    let epoch_seed = seed.wrapping_add(u64::from(epoch));
    let chosen = subset(manifest, seed, limit);
    match order {
        Order::Shuffle => shuffled_indices(chosen.len(), epoch_seed)
            .into_iter()
            .map(|i| chosen[i])
            .collect(),
        Order::Listing => {
            let mut v = chosen;
            sort_by_key(manifest, &mut v);
            v
        }
    }
}

/// The epoch plan of an epoch: the paths (relative to the dataset root, the
/// mount root) in the order the reader will open them, one a line.
pub fn plan_text(manifest: &Manifest, files: &[usize]) -> String {
    let mut out = String::with_capacity(files.len() * 32);
    for &i in files {
        out.push_str(&manifest.entries[i].key);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::{Plan, Workload};
    use crate::manifest::{Entry, Header};

    /// A W1 manifest without checksums (only keys and sizes matter here).
    fn manifest(scale: f64) -> Manifest {
        let plan = Plan::new(Workload::W1, scale, 3).expect("plan");
        let entries: Vec<Entry> = plan
            .objects
            .iter()
            .map(|o| Entry {
                key: o.key.clone(),
                size: o.size,
                checksum: 0,
            })
            .collect();
        Manifest {
            header: Header {
                workload: Workload::W1,
                scale,
                seed: 3,
                bucket: "b".into(),
                prefix: String::new(),
                objects: entries.len(),
                bytes: plan.total_bytes(),
            },
            entries,
        }
    }

    #[test]
    fn limited_epochs_revisit_the_same_whole_directories_in_another_order() {
        let m = manifest(0.05); // 1000 files in 10 directories of 100
        let e1 = epoch_files(&m, 5, 1, Some(250), Order::Shuffle);
        let e2 = epoch_files(&m, 5, 2, Some(250), Order::Shuffle);
        assert_eq!(e1.len(), 250);
        assert_ne!(e1, e2);
        let (mut s1, mut s2) = (e1.clone(), e2.clone());
        s1.sort_unstable();
        s2.sort_unstable();
        assert_eq!(s1, s2);
        // Two whole directories and half of a third.
        let mut per_dir: BTreeMap<&str, usize> = BTreeMap::new();
        for &i in &e1 {
            *per_dir.entry(dir_of(&m.entries[i].key)).or_default() += 1;
        }
        let mut counts: Vec<usize> = per_dir.values().copied().collect();
        counts.sort_unstable();
        assert_eq!(counts, vec![50, 100, 100]);
    }

    #[test]
    fn listing_order_is_the_subset_sorted_by_path() {
        let m = manifest(0.05);
        let l = epoch_files(&m, 5, 1, Some(250), Order::Listing);
        let keys: Vec<&str> = l.iter().map(|&i| m.entries[i].key.as_str()).collect();
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        assert_eq!(keys, sorted);
        assert_eq!(l, epoch_files(&m, 5, 2, Some(250), Order::Listing));
        let mut shuffled = epoch_files(&m, 5, 1, Some(250), Order::Shuffle);
        shuffled.sort_by(|&a, &b| m.entries[a].key.cmp(&m.entries[b].key));
        assert_eq!(l, shuffled);
    }

    #[test]
    fn without_a_limit_every_file_is_read_in_a_seeded_shuffle() {
        let m = manifest(0.01);
        let n = m.entries.len();
        assert_eq!(
            epoch_files(&m, 5, 1, None, Order::Shuffle),
            shuffled_indices(n, 6)
        );
        assert_eq!(
            epoch_files(&m, 5, 1, Some(n + 1), Order::Shuffle),
            shuffled_indices(n, 6)
        );
        assert_eq!(subset(&m, 5, None), (0..n).collect::<Vec<_>>());
    }

    #[test]
    fn a_plan_lists_the_paths_in_reading_order() {
        let m = manifest(0.01);
        let files = epoch_files(&m, 1, 1, Some(10), Order::Shuffle);
        let text = plan_text(&m, &files);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 10);
        assert_eq!(lines[0], m.entries[files[0]].key);
        assert!(text.ends_with('\n'));
    }
}
