//! One listing per directory at a time, and lookups that wait for it instead of probing.
//!
//! A lookup that misses in a directory without a fresh listing starts one listing of that
//! directory in the background and probes its own name (a HEAD and a one-key LIST) at once.
//! Without more, every other lookup in that directory before the listing lands probes too:
//! a trainer's sampler (or the epoch-plan scheduler) opening 48 files of a 100-file
//! directory at once cost 48 HEADs and 48 LISTs, three times over for a path three
//! components deep, before the first GET could start.
//!
//! [`Listings`] keeps the listings under way, by directory inode. A caller *claims* a
//! directory: it either leads (no listing under way; it must list, and the returned
//! [`Lead`] marks the listing finished when dropped, whether it succeeded, failed or was
//! cancelled) or follows the listing under way ([`Follower`]). Followers wait in one of two
//! ways:
//!
//! - [`Follower::first_page`] (lookups): until the listing finished, or until it turned out
//!   to need more than one page. A one-page directory thus costs its one LIST, and the
//!   waiters answer from it; in a big directory the waiters are released after the first page
//!   and probe, so no lookup waits for a long listing.
//! - [`Follower::finished`] (`readdir`): until the listing finished.
//!
//! A follower then checks the tree: the listing may have failed, in which case it does what it
//! would have done without waiting (probe, or list itself).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::watch;

/// How far a listing got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Progress {
    /// The first page has not arrived yet.
    FirstPage,
    /// The first page arrived and more follow.
    MorePages,
    /// Done: succeeded, failed or cancelled.
    Finished,
}

/// The listings under way (see the module documentation).
#[derive(Debug, Default)]
pub(super) struct Listings {
    under_way: Arc<Mutex<HashMap<u64, watch::Receiver<Progress>>>>,
}

/// The outcome of [`Listings::claim`].
pub(super) enum Claim {
    Lead(Lead),
    Follow(Follower),
}

impl Listings {
    /// Leads a listing of `dir` when none is under way, else follows the one that is.
    pub fn claim(&self, dir: u64) -> Claim {
        let mut under_way = self.under_way.lock();
        if let Some(rx) = under_way.get(&dir) {
            return Claim::Follow(Follower { rx: rx.clone() });
        }
        let (tx, rx) = watch::channel(Progress::FirstPage);
        under_way.insert(dir, rx);
        Claim::Lead(Lead {
            under_way: self.under_way.clone(),
            dir,
            tx,
        })
    }
}

/// The right and duty to list one directory; dropping it releases the followers.
pub(super) struct Lead {
    under_way: Arc<Mutex<HashMap<u64, watch::Receiver<Progress>>>>,
    dir: u64,
    tx: watch::Sender<Progress>,
}

impl Lead {
    /// The first page arrived and another one is needed.
    pub fn more_pages(&self) {
        self.tx.send_replace(Progress::MorePages);
    }
}

impl Drop for Lead {
    fn drop(&mut self) {
        let mut under_way = self.under_way.lock();
        under_way.remove(&self.dir);
        self.tx.send_replace(Progress::Finished);
    }
}

/// A waiter on another caller's listing.
pub(super) struct Follower {
    rx: watch::Receiver<Progress>,
}

impl Follower {
    /// Waits until the listing finished (`true`) or needs more than one page (`false`).
    pub async fn first_page(mut self) -> bool {
        match self.rx.wait_for(|p| *p != Progress::FirstPage).await {
            Ok(p) => *p == Progress::Finished,
            Err(_) => true, // the lead is gone: finished
        }
    }

    /// Waits until the listing finished.
    pub async fn finished(mut self) {
        let _ = self.rx.wait_for(|p| *p == Progress::Finished).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lead(listings: &Listings, dir: u64) -> Lead {
        match listings.claim(dir) {
            Claim::Lead(lead) => lead,
            Claim::Follow(_) => panic!("{dir} is already being listed"),
        }
    }

    fn follow(listings: &Listings, dir: u64) -> Follower {
        match listings.claim(dir) {
            Claim::Follow(follower) => follower,
            Claim::Lead(_) => panic!("nobody lists {dir}"),
        }
    }

    #[tokio::test]
    async fn one_lead_per_directory_and_followers_released_by_its_progress() {
        let listings = Listings::default();
        let seven = lead(&listings, 7);
        let waiting_for_one_page = follow(&listings, 7);
        let waiting_for_all = follow(&listings, 7);
        let _eight = lead(&listings, 8);

        let first = tokio::spawn(waiting_for_one_page.first_page());
        let all = tokio::spawn(waiting_for_all.finished());
        seven.more_pages();
        assert!(!first.await.unwrap(), "released after one page, unfinished");
        assert!(!all.is_finished(), "a readdir waits for every page");
        drop(seven);
        all.await.unwrap();
        let _again = lead(&listings, 7); // the entry went with its lead
    }

    #[tokio::test]
    async fn a_dropped_lead_counts_as_finished() {
        let listings = Listings::default();
        let one = lead(&listings, 1);
        let follower = follow(&listings, 1);
        drop(one);
        assert!(follower.first_page().await);
    }
}
