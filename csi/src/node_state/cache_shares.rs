//! One budget for the node cache: the volumes' `cacheSize` are shares of it, never more.
//!
//! Every daemon charges its cache budget only with the cache entries it knows (the entries it
//! found at start and what it writes itself; see the daemon's `cache` module), so two volumes
//! that each asked for 80% of the cache disk would together try to fill 160% of it: they
//! would evict each other's files and run into the free-space floor. The mounter therefore
//! holds the node's budget (`riffle-mounter --cache-size`, a size or a percentage of the
//! cache disk; 85% by default: the disk less the default free-space floor) and grants each
//! daemon that uses the cache its share: what the volume asks for (`cacheSize`), at most
//! what the shares of the other mounted volumes leave. A volume granted less than it asked
//! for runs with the remainder, and the mounter says so in a WARN naming the volume; with
//! nothing left it is mounted without the disk cache (its reads still work, from the store)
//! instead of failing the pod. So the sum of the shares never exceeds the budget, and a
//! per-volume `cacheSize` can only lower a volume's share. First come, first served: to
//! split the cache between volumes that run at once, give them sizes that add up to at
//! most the budget.
//!
//! Shares are kept in a JSON file in the mounter's state directory, by target path, so a new
//! mounter (a rollout, a crash) knows its predecessor's, and a take-over keeps the share its
//! mount had. A share is given back when its volume is unmounted; one whose target has no
//! mount any more (a mounter that died before it could give it back) is dropped the next
//! time a share is granted, unless this process is mounting it right now.

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::kube::settings::VolumeSettings;
use rifflefs::cli::size::{parse_size, SizeSpec};

/// The default node budget: the cache disk less the default free-space floor (15%).
pub const DEFAULT_BUDGET: &str = "85%";

/// The option whose value is a volume's requested share.
const CACHE_SIZE: &str = "cache-size";

/// The node cache's budget and the shares granted from it.
#[derive(Debug)]
pub struct CacheShares {
    /// Where the shares are recorded.
    file: PathBuf,
    /// The cache directory (percentages are of its file system).
    cache_dir: PathBuf,
    /// The budget as written (a size or a percentage).
    budget: String,
    /// Targets this process is mounting right now: their shares are kept though nothing is
    /// mounted there yet.
    state: Mutex<HashSet<PathBuf>>,
}

/// What a volume gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grant {
    /// The whole share it asked for, in bytes.
    Full(u64),
    /// Less than it asked for (`asked` bytes): `granted` bytes.
    Reduced { asked: u64, granted: u64 },
    /// Nothing is left: no disk cache.
    Nothing { asked: u64 },
}

impl CacheShares {
    /// The budget `budget` (a size or a percentage of the cache disk) for `cache_dir`, shares
    /// recorded in `file`. Fails on a budget that is neither.
    pub fn new(cache_dir: &Path, budget: &str, file: &Path) -> Result<Self, String> {
        if parse_size(budget).is_err() {
            return Err(format!(
                "--cache-size {budget:?}: expected a size such as 500GiB or a percentage such as 85%"
            ));
        }
        Ok(Self {
            file: file.to_path_buf(),
            cache_dir: cache_dir.to_path_buf(),
            budget: budget.to_string(),
            state: Mutex::new(HashSet::new()),
        })
    }

    /// The settings a daemon at `target` runs with: `settings` with `cache-size` set to the
    /// share granted (without the disk cache when nothing is left), and the grant; settings
    /// that do not use the cache are returned as they are.
    pub fn apply(
        &self,
        target: &Path,
        settings: &VolumeSettings,
    ) -> io::Result<(VolumeSettings, Option<Grant>)> {
        let Some(asked) = settings.options.get(CACHE_SIZE) else {
            return Ok((settings.clone(), None));
        };
        let grant = self.grant(target, asked)?;
        let mut granted = settings.clone();
        match grant {
            Grant::Full(bytes) | Grant::Reduced { granted: bytes, .. } => {
                granted
                    .options
                    .insert(CACHE_SIZE.to_string(), bytes.to_string());
            }
            Grant::Nothing { .. } => {
                granted.options.remove(CACHE_SIZE);
                granted.options.remove("cache-min-free");
            }
        }
        Ok((granted, Some(grant)))
    }

    /// Grants `target` its share of what it `asked` for (a size or a percentage of the cache
    /// disk); a target that has a share keeps it.
    pub fn grant(&self, target: &Path, asked: &str) -> io::Result<Grant> {
        let mut mounting = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let total = disk_size(&self.cache_dir)?;
        let budget = bytes_of(&self.budget, total).unwrap_or(0);
        let asked = bytes_of(asked, total).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cacheSize {asked:?} is not a size or a percentage"),
            )
        })?;
        let mut shares = self.load();
        shares.retain(|t, _| t.as_path() == target || mounting.contains(t) || is_mounted(t));
        let others: u64 = shares
            .iter()
            .filter(|(t, _)| t.as_path() != target)
            .map(|(_, b)| *b)
            .sum();
        let left = budget.saturating_sub(others);
        let granted = match shares.get(target) {
            // A take-over or a repeat keeps its share, within what is left.
            Some(had) => (*had).min(left),
            None => asked.min(left),
        };
        if granted == 0 {
            shares.remove(target);
        } else {
            shares.insert(target.to_path_buf(), granted);
            mounting.insert(target.to_path_buf());
        }
        self.save(&shares)?;
        Ok(match granted {
            0 => Grant::Nothing { asked },
            g if g >= asked => Grant::Full(g),
            g => Grant::Reduced { asked, granted: g },
        })
    }

    /// The mount at `target` is made (or failed: `keep` false): its share no longer needs
    /// this process to hold it.
    pub fn settled(&self, target: &Path, keep: bool) {
        let mut mounting = self.state.lock().unwrap_or_else(|p| p.into_inner());
        mounting.remove(target);
        if !keep {
            let mut shares = self.load();
            if shares.remove(target).is_some() {
                if let Err(e) = self.save(&shares) {
                    tracing::warn!(error = %e, "cannot record the node cache's shares");
                }
            }
        }
    }

    /// Gives the share of `target` back (its volume was unmounted).
    pub fn release(&self, target: &Path) {
        self.settled(target, false);
    }

    /// The shares granted now, by target (for tests and the log).
    pub fn shares(&self) -> BTreeMap<PathBuf, u64> {
        self.load()
    }

    fn load(&self) -> BTreeMap<PathBuf, u64> {
        match std::fs::read(&self.file) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                tracing::warn!(file = %self.file.display(), error = %e, "unreadable cache shares; starting afresh");
                BTreeMap::new()
            }),
            Err(_) => BTreeMap::new(),
        }
    }

    fn save(&self, shares: &BTreeMap<PathBuf, u64>) -> io::Result<()> {
        let dir = self.file.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        serde_json::to_writer(&mut tmp, shares).map_err(io::Error::other)?;
        tmp.persist(&self.file).map_err(|e| e.error)?;
        Ok(())
    }
}

/// The size of the file system holding `dir`, bytes.
/// The bytes of a size or of a percentage ("80%") of `total` (whole hundredths of it), as
/// riffle reads them; None if it is neither.
fn bytes_of(value: &str, total: u64) -> Option<u64> {
    match parse_size(value).ok()? {
        SizeSpec::Bytes(bytes) => Some(bytes),
        SizeSpec::Percent(p) => Some(((total / 100) as f64 * p) as u64),
    }
}

fn disk_size(dir: &Path) -> io::Result<u64> {
    let st = nix::sys::statvfs::statvfs(dir).map_err(io::Error::from)?;
    Ok(st.blocks() * st.fragment_size())
}

fn is_mounted(target: &Path) -> bool {
    crate::node_state::mountinfo::mount_at(target)
        .ok()
        .flatten()
        .is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(cache: &str) -> VolumeSettings {
        VolumeSettings::parse(
            &[
                ("bucket".to_string(), "datasets".to_string()),
                ("cacheSize".to_string(), cache.to_string()),
            ]
            .into(),
            &[],
        )
        .expect("valid")
    }

    #[test]
    fn shares_never_add_up_to_more_than_the_budget() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("state/cache-shares.json");
        let shares = CacheShares::new(dir.path(), "3GiB", &file).expect("budget");
        let gib = 1u64 << 30;
        let (a, b, c) = (Path::new("/t/a"), Path::new("/t/b"), Path::new("/t/c"));
        assert_eq!(shares.grant(a, "2GiB").expect("a"), Grant::Full(2 * gib));
        assert_eq!(
            shares.grant(b, "2GiB").expect("b"),
            Grant::Reduced {
                asked: 2 * gib,
                granted: gib
            }
        );
        assert_eq!(
            shares.grant(c, "1GiB").expect("c"),
            Grant::Nothing { asked: gib }
        );
        // A repeat (a take-over) keeps its share; a new process reads the same file.
        assert_eq!(
            shares.grant(a, "2GiB").expect("a again"),
            Grant::Full(2 * gib)
        );
        let again = CacheShares::new(dir.path(), "3GiB", &file).expect("budget");
        assert_eq!(again.shares().values().sum::<u64>(), 3 * gib);
        // `a` is unmounted: its share goes to the next volume.
        shares.release(a);
        assert_eq!(shares.grant(c, "1GiB").expect("c"), Grant::Full(gib));
    }

    #[test]
    fn a_share_whose_mount_is_gone_is_given_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("cache-shares.json");
        let old = CacheShares::new(dir.path(), "1GiB", &file).expect("budget");
        old.grant(Path::new("/no/such/mount"), "1GiB")
            .expect("grant");
        old.settled(Path::new("/no/such/mount"), true);
        // A new mounter: nothing is mounted at that target, so its share is free again.
        let new = CacheShares::new(dir.path(), "1GiB", &file).expect("budget");
        assert_eq!(
            new.grant(Path::new("/t/x"), "1GiB").expect("x"),
            Grant::Full(1 << 30)
        );
    }

    #[test]
    fn settings_get_the_granted_share_or_no_cache() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("cache-shares.json");
        let shares = CacheShares::new(dir.path(), "1GiB", &file).expect("budget");
        let (s, grant) = shares
            .apply(Path::new("/t/a"), &settings("4GiB"))
            .expect("apply");
        assert_eq!(
            grant,
            Some(Grant::Reduced {
                asked: 4 << 30,
                granted: 1 << 30
            })
        );
        assert_eq!(
            s.options.get("cache-size").map(String::as_str),
            Some("1073741824")
        );
        let (s, grant) = shares
            .apply(Path::new("/t/b"), &settings("50%"))
            .expect("apply");
        assert!(matches!(grant, Some(Grant::Nothing { .. })));
        assert!(!s.uses_cache());
        let plain = VolumeSettings::parse(
            &[("bucket".to_string(), "datasets".to_string())].into(),
            &[],
        )
        .expect("valid");
        assert_eq!(
            shares.apply(Path::new("/t/c"), &plain).expect("apply").1,
            None
        );
        assert!(CacheShares::new(dir.path(), "lots", &file).is_err());
    }
}
