//! Directory reads: listing a directory from the store or from disk and merging the listing
//! into the tree.
//!
//! A read of a directory whose listing is older than the TTL lists it again, one listing per
//! directory at a time (followers wait for the lead, module `listings`), takes a saved listing
//! from disk when one may be used (module [`super::kept`]) and keeps each new one there, and
//! then queues background listings of its subdirectories (module [`super::background`]). A
//! listing is applied to the tree whole or not at all.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use super::listings::{Claim, Lead};
use super::names::invalid_reason;
use super::saved::{ListedFile, RawListing};
use super::tree::{DirEntry, NodeKind, Tree};
use super::{MetadataTtl, Namespace, NamespaceError};
use crate::store::{ListPage, ListRequest, ObjectMeta};

/// Saved listings written at once (each on a blocking thread).
const KEPT_WRITERS: usize = 2;

impl Namespace {
    /// The entries of directory `ino` if its last listing is younger than the TTL, without
    /// listing it (no I/O).
    pub(crate) fn readdir_cached(&self, ino: u64) -> Option<Arc<Vec<DirEntry>>> {
        let tree = self.tree.read();
        let (entries, listed) = Self::node(&tree, ino).ok()?.dir()?.listing()?;
        self.ttl.is_fresh(listed).then(|| entries.clone())
    }

    /// The entries of directory `ino`, listed again when the last listing is older than the TTL.
    /// Its subdirectories are then listed in the background (module [`background`]).
    ///
    /// [`background`]: super::background
    pub async fn readdir(self: &Arc<Self>, ino: u64) -> Result<Arc<Vec<DirEntry>>, NamespaceError> {
        let entries = self.readdir_listing(ino).await?;
        self.fan_out(ino);
        Ok(entries)
    }

    /// Queues background listings of the subdirectories of `ino` without a fresh listing,
    /// once per listing of `ino`.
    pub(super) fn fan_out(self: &Arc<Self>, ino: u64) {
        let Some(fanout) = &self.fanout else {
            return;
        };
        if self.ttl.always_stale() {
            return;
        }
        let fanned_out = |tree: &Tree| {
            Self::node(tree, ino)
                .ok()
                .and_then(|n| n.dir())
                .is_none_or(|d| d.fanned_out || d.listed_at.is_none())
        };
        if fanned_out(&self.tree.read()) {
            return;
        }
        let queued = {
            let mut tree = self.tree.write();
            if fanned_out(&tree) {
                return;
            }
            let Ok(dir) = Self::dir_mut(&mut tree, ino) else {
                return;
            };
            dir.fanned_out = true;
            let subdirs: Vec<u64> = dir
                .listing()
                .map(|(entries, _)| {
                    entries
                        .iter()
                        .filter(|e| e.is_dir())
                        .map(|e| e.ino())
                        .collect()
                })
                .unwrap_or_default();
            let mut queued = Vec::new();
            for child in subdirs {
                let fresh = Self::node(&tree, child)
                    .ok()
                    .and_then(|n| n.dir())
                    .and_then(|d| d.listing())
                    .is_some_and(|(_, at)| self.ttl.is_fresh(at));
                if fresh {
                    continue;
                }
                let Some(place) = fanout.enqueue() else {
                    break; // the queue is full: readers list the rest themselves
                };
                queued.push((child, self.dir_prefix(&tree, child), place));
            }
            queued
        };
        for (child, prefix, place) in queued {
            let this = self.clone();
            let fanout = fanout.clone();
            tokio::spawn(async move {
                let _place = place;
                let Ok(_permit) = fanout.permits.clone().acquire_owned().await else {
                    return;
                };
                if this.has_fresh_listing(child) {
                    return;
                }
                // A reader listing it already: nothing to do (demand never waits for us).
                let Claim::Lead(lead) = this.listings.claim(child) else {
                    return;
                };
                if this.has_fresh_listing(child) {
                    return; // listed between the check and the claim
                }
                fanout.started.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = this.list_dir(child, &prefix, Some(lead)).await {
                    fanout.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(prefix, error = %e, "background listing failed");
                }
            });
        }
    }

    pub(super) async fn readdir_listing(
        &self,
        ino: u64,
    ) -> Result<Arc<Vec<DirEntry>>, NamespaceError> {
        let mut followed = false;
        loop {
            let (prefix, listed_before) = {
                let tree = self.tree.read();
                let node = Self::node(&tree, ino)?;
                let dir = node.dir().ok_or(NamespaceError::NotADirectory)?;
                if let Some((entries, listed)) = dir.listing() {
                    if self.ttl.is_fresh(listed) {
                        return Ok(entries.clone());
                    }
                }
                (self.dir_prefix(&tree, ino), dir.listing().map(|(_, at)| at))
            };
            match self.listings.claim(ino) {
                Claim::Lead(lead) => {
                    // Listed (e.g. in the background) between the check above and the claim.
                    if let Some(entries) = self.listing_since(&self.tree.read(), ino, listed_before)
                    {
                        return Ok(entries);
                    }
                    return self.list_dir(ino, &prefix, Some(lead)).await;
                }
                // Followed once already and the directory is still not listed: another
                // listing started meanwhile (or the one followed failed); list without
                // waiting again.
                Claim::Follow(_) if followed => return self.list_dir(ino, &prefix, None).await,
                Claim::Follow(follower) => {
                    follower.finished().await;
                    followed = true;
                    // A listing made while this call waited answers it, whatever the TTL.
                    if let Some(entries) = self.listing_since(&self.tree.read(), ino, listed_before)
                    {
                        return Ok(entries);
                    }
                }
            }
        }
    }

    /// The listing of directory `ino` if it was made after `before` (the instant of the
    /// listing it had then, if any).
    pub(super) fn listing_since(
        &self,
        tree: &Tree,
        ino: u64,
        before: Option<Instant>,
    ) -> Option<Arc<Vec<DirEntry>>> {
        let (entries, at) = Self::node(tree, ino).ok()?.dir()?.listing()?;
        before
            .is_none_or(|before| at > before)
            .then(|| entries.clone())
    }

    /// Lists directory `ino` (its key prefix `prefix`): as the `lead` of its listing, whose
    /// followers are released once the result is in the tree, or (`None`) outside the
    /// one-listing-at-a-time rule.
    pub(super) async fn list_dir(
        &self,
        ino: u64,
        prefix: &str,
        lead: Option<Lead>,
    ) -> Result<Arc<Vec<DirEntry>>, NamespaceError> {
        if let Some(entries) = self.apply_kept(ino, prefix).await {
            drop(lead);
            return Ok(entries);
        }
        let started = Instant::now();
        let taken = SystemTime::now();
        let pages = self.list_all(prefix, lead.as_ref()).await;
        let result = pages.map(|pages| {
            self.counts.from_store.fetch_add(1, Ordering::Relaxed);
            let raw = self.collect_listing(prefix, pages);
            let entries = self.apply_raw(ino, &raw, started, false);
            self.keep(prefix, taken, raw);
            entries.unwrap_or_default()
        });
        drop(lead);
        result
    }

    /// The saved listing of directory `ino`, applied, if there is one that may be used: kept
    /// listings enabled, access granted, the directory never listed in this mount, the file
    /// whole and fresh under the TTL.
    pub(super) async fn apply_kept(&self, ino: u64, prefix: &str) -> Option<Arc<Vec<DirEntry>>> {
        let kept = self.kept.as_ref()?;
        if !kept.access_granted() || self.ttl.always_stale() {
            return None;
        }
        {
            let tree = self.tree.read();
            if Self::node(&tree, ino).ok()?.dir()?.ever_listed {
                return None;
            }
        }
        let (k, p) = (kept.clone(), prefix.to_string());
        let found = match tokio::task::spawn_blocking(move || k.load(&p)).await {
            Ok(Ok(Some(found))) => found,
            Ok(Ok(None)) | Err(_) => return None,
            Ok(Err(e)) => {
                self.counts.saved_ignored.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(error = %e, "saved listing not used");
                return None;
            }
        };
        let age = SystemTime::now()
            .duration_since(found.taken)
            .unwrap_or(Duration::ZERO);
        let at = match self.ttl {
            MetadataTtl::Indefinite => Instant::now().checked_sub(age).unwrap_or_else(Instant::now),
            MetadataTtl::For(ttl) if age < ttl => Instant::now().checked_sub(age)?,
            MetadataTtl::For(_) => return None,
        };
        // Counted in `listing_stats().from_disk` by `apply_raw`, under the tree's lock.
        self.apply_raw(ino, &found.listing, at, true)
    }

    /// Writes a listing just taken from the store to disk in the background (at most
    /// [`KEPT_WRITERS`] at once).
    pub(super) fn keep(&self, prefix: &str, taken: SystemTime, raw: RawListing) {
        let Some(kept) = self.kept.clone() else {
            return;
        };
        if self.ttl.always_stale() {
            return; // relisted on every access: nobody could use it
        }
        static WRITERS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(KEPT_WRITERS);
        let counts = self.counts.clone();
        let prefix = prefix.to_string();
        tokio::spawn(async move {
            let Ok(_permit) = WRITERS.acquire().await else {
                return;
            };
            let written =
                tokio::task::spawn_blocking(move || kept.store(&prefix, taken, &raw)).await;
            match written {
                Ok(Ok(())) => {
                    counts.saved_written.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "cannot keep a listing"),
                Err(_) => {}
            }
        });
    }

    pub(super) async fn list_all(
        &self,
        prefix: &str,
        lead: Option<&Lead>,
    ) -> Result<Vec<ListPage>, NamespaceError> {
        let mut pages = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = self
                .store
                .list_page(ListRequest::page(prefix, token.as_deref()))
                .await?;
            token = page.next_token.clone();
            pages.push(page);
            if token.is_none() {
                return Ok(pages);
            }
            if let Some(lead) = lead {
                lead.more_pages();
            }
        }
    }

    /// The entries of a complete listing of `prefix`: valid names only (others are skipped
    /// and logged), directories winning over files of the same name.
    pub(super) fn collect_listing(&self, prefix: &str, pages: Vec<ListPage>) -> RawListing {
        let mut dirs: Vec<String> = Vec::new();
        let mut objects: Vec<ObjectMeta> = Vec::new();
        for page in pages {
            for p in page.prefixes {
                let name = p
                    .strip_prefix(prefix)
                    .and_then(|n| n.strip_suffix('/'))
                    .unwrap_or_default();
                match invalid_reason(name) {
                    None => dirs.push(name.to_string()),
                    Some(why) => self.skipped.skip(&p, why),
                }
            }
            for o in page.objects {
                let name = o.key.strip_prefix(prefix).unwrap_or_default();
                if name.is_empty() {
                    continue; // the directory's own `dir/` marker object
                }
                match invalid_reason(name) {
                    None => objects.push(o),
                    Some(why) => self.skipped.skip(&o.key, why),
                }
            }
        }
        dirs.sort_unstable();
        dirs.dedup();
        let mut files = Vec::with_capacity(objects.len());
        for meta in objects {
            let name = &meta.key[prefix.len()..];
            if dirs.binary_search_by(|d| d.as_str().cmp(name)).is_ok() {
                self.skipped.skip(
                    &meta.key,
                    "an object and a prefix share this name; the directory is shown",
                );
                continue;
            }
            files.push(ListedFile {
                name: name.to_string(),
                size: meta.size,
                etag: meta.etag,
                mtime: meta.last_modified,
            });
        }
        RawListing { dirs, files }
    }

    /// Merges a complete listing of directory `ino`, taken at `at`, into the tree and returns
    /// its entries. With `if_unlisted` (a saved listing), nothing is merged (`None`) when the
    /// directory was listed in this mount meanwhile.
    pub(super) fn apply_raw(
        &self,
        ino: u64,
        raw: &RawListing,
        at: Instant,
        if_unlisted: bool,
    ) -> Option<Arc<Vec<DirEntry>>> {
        let mut tree = self.tree.write();
        let dir = Self::node(&tree, ino).ok()?.dir()?;
        if if_unlisted && dir.ever_listed {
            return None;
        }
        let n = raw.dirs.len() + raw.files.len();
        let mut entries = Vec::with_capacity(n);
        for name in &raw.dirs {
            let child = Self::upsert(
                &mut tree,
                ino,
                name,
                NodeKind::Dir,
                self.mount_time,
                at,
                false,
            );
            entries.push(DirEntry::new(child, true));
        }
        for file in &raw.files {
            let kind = NodeKind::file(file.size, &file.etag);
            let child = Self::upsert(&mut tree, ino, &file.name, kind, file.mtime, at, false);
            entries.push(DirEntry::new(child, false));
        }
        tree.sort_by_name(&mut entries);
        // Children that were not listed are gone: the listing is the new child index.
        let entries = Arc::new(entries);
        if let Some(dir) = tree.nodes[(ino - 1) as usize].dir_mut() {
            dir.set_listing(entries.clone(), at);
            dir.ever_listed = true;
            dir.fanned_out = false;
        }
        if if_unlisted {
            // A saved listing: counted before a reader can see its entries, so a walk that
            // saw them also sees the count (a listing applied in the background, ahead of
            // the walker, is otherwise counted after the walker has moved on).
            self.counts.from_disk.fetch_add(1, Ordering::Relaxed);
        }
        drop(tree);
        crate::heap_trim::trim_soon();
        Some(entries)
    }
}
