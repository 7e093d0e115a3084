//! Every field of `riffle stats`, declared once (see [`crate::stats`] for what is derived from
//! a declaration).
//!
//! Adding a counter is one line here, its increments where it is counted, and the one
//! `sample.put` of the layer that owns it; the JSON, the Prometheus family (with its type,
//! unit and help) and the harness's reading of it follow. For example, a count of plan
//! entries skipped:
//!
//! ```text
//! // here, in the prefetch group:
//!     PREFETCH_PLAN_SKIPPED = counter("prefetch.plan_skipped", NUMBER, "Plan entries skipped.");
//! // in Prefetcher::record, beside the other counters:
//!     sample.put(&defs::PREFETCH_PLAN_SKIPPED, load(&s.plan_skipped));
//! ```
//!
//! `riffle stats` then shows `prefetch.plan_skipped` and `/metrics` serves
//! `riffle_prefetch_plan_skipped_total`. The unit is declared ([`BYTES`], [`SECONDS`] or
//! [`NUMBER`]); a path that already ends in it (`store.get_bytes`, [`BYTES`]) does not get the
//! suffix twice (`riffle_store_get_bytes_total`), and `.named("riffle_...")` keeps an exposed
//! name that differs from the derived one. The tests here fail when two declarations share a
//! path; `control`'s test, which builds the tree of a mount with every section, fails when
//! the tree lacks a declared field or has one not declared.

use super::{counter, equals, gauge, id, section, text, Section, Stat, BYTES, NUMBER, SECONDS};

/// Declares each stat as a constant and lists them all in [`ALL`].
macro_rules! stats {
    ($($name:ident = $def:expr;)*) => {
        $(
            #[doc = concat!("`riffle stats` field: ", stringify!($def))]
            pub const $name: Stat = $def;
        )*
        /// Every declared stat, in declaration order.
        pub const ALL: &[Stat] = &[$($name),*];
    };
}

#[rustfmt::skip]
stats! {
    // The mount.
    SOURCE = text("source", "The bucket and prefix the mount serves (s3://bucket/prefix).");
    PID = id("pid", "The daemon's process id.");
    UPTIME_SECONDS = gauge("uptime_seconds", SECONDS, "Time since the mount started.");

    // The object store (`fetch`, `store::retry`).
    STORE_GET_REQUESTS = counter("store.get_requests", NUMBER, "Ranged GET requests sent to the object store.");
    STORE_GET_BYTES = counter("store.get_bytes", BYTES, "Bytes received from the object store by GETs.");
    STORE_RETRIES = counter("store.retries", NUMBER, "Object store requests retried after a transient error.");
    STORE_ERRORS = counter("store.errors", NUMBER, "Fetches that failed after retries.");
    STORE_PROOF_REQUESTS = counter("store.proof_requests", NUMBER, "One-byte GETs proving this mount's credential may read an object another credential cached.");
    STORE_PROOFS_REFUSED = counter("store.proofs_refused", NUMBER, "Opens refused (EACCES) because the store refused this mount's credential the object.");

    // The FUSE layer (`fs`).
    FUSE_OPENS = counter("fuse.opens", NUMBER, "Files opened.");
    FUSE_PASSTHROUGH_OPENS = counter("fuse.passthrough_opens", NUMBER, "Files opened in FUSE passthrough mode (served by the kernel from the cache).");
    FUSE_FAST_OPENS = counter("fuse.fast_opens", NUMBER, "Passthrough opens answered from memory with a idle backing file.");
    FUSE_IDLE_BACKINGS = gauge("fuse.idle_backings", NUMBER, "Idle backing files held for reopening cached files from memory.");
    FUSE_MAX_IDLE_BACKINGS = gauge("fuse.max_idle_backings", NUMBER, "Idle backing files held at most (--max-idle-backings; auto: a sixteenth of the memory limit at 4 KiB each).");
    FUSE_BACKINGS_OPENED_AHEAD = counter("fuse.backings_opened_ahead", NUMBER, "Backing files registered with the kernel as objects completed in the cache, before any open.");
    FUSE_LOOKUP_READAHEADS = counter("fuse.lookup_readaheads", NUMBER, "Readaheads of small cached files' cache files started because a lookup named them.");
    FUSE_LOOKUP_READAHEADS_FAILED = counter("fuse.lookup_readaheads_failed", NUMBER, "Lookup readaheads that failed (the cache file was gone).");
    FUSE_DIR_READS_WITH_ATTRS = counter("fuse.dir_reads_with_attrs", NUMBER, "First reads of a directory answered with every entry's attributes (readdirplus), for readers that stat what they list.");
    FUSE_DIR_READS_NAMES_ONLY = counter("fuse.dir_reads_names_only", NUMBER, "First reads of a directory answered with names only, for readers that do not stat what they list.");
    FUSE_PASSTHROUGH = equals("fuse.passthrough", "enabled", "1 if FUSE passthrough is in use, else 0 (see riffle stats for the reason).").named("riffle_fuse_passthrough_enabled");
    FUSE_DIR_READS_MODE = text("fuse.dir_reads_mode", "How first reads of a directory are answered now: attributes or names.");
    FUSE_TRANSPORT = text("fuse.transport", "How requests reach the daemon: io_uring (queues and entries) or /dev/fuse, and why.");
    FUSE_RING_REQUESTS = counter("fuse.ring_requests", NUMBER, "FUSE requests that came over io_uring rings (the rest over /dev/fuse).");
    FUSE_RING_ENTRIES_BUSY = gauge("fuse.ring_entries_busy", NUMBER, "io_uring ring entries holding a request whose answer is not committed yet (the rest wait for the next request).");
    FUSE_DEVICES = gauge("fuse.devices", NUMBER, "/dev/fuse descriptors the daemon's FUSE threads read: the first and its clones, one per thread (--fuse-threads); fewer after taking over a connection whose bundle carried fewer.");
    FUSE_KERNEL_READ_AHEAD = text("fuse.kernel_read_ahead", "The kernel's read-ahead window for the mount's files, and why.");

    // The disk cache (`cache`); absent without `--cache-dir`.
    CACHE_OBJECTS = gauge("cache.objects", NUMBER, "Objects with bytes in the disk cache.");
    CACHE_COMPLETE_OBJECTS = gauge("cache.complete_objects", NUMBER, "Objects whose every block is in the disk cache.");
    CACHE_BLOCKS = gauge("cache.blocks", NUMBER, "Blocks in the disk cache.");
    CACHE_BYTES = gauge("cache.bytes", BYTES, "Bytes charged to the disk cache.");
    CACHE_LIMIT = gauge("cache.limit", BYTES, "Size limit of the disk cache.");
    CACHE_HITS = counter("cache.hits", NUMBER, "Disk cache block lookups that found the block.");
    CACHE_MISSES = counter("cache.misses", NUMBER, "Disk cache block lookups that did not find the block.");
    CACHE_CRC_FAILURES = counter("cache.crc_failures", NUMBER, "Disk cache blocks that failed their checksum.");
    CACHE_WRITES = counter("cache.writes", NUMBER, "Blocks written to the disk cache.");
    CACHE_WRITE_BYTES = counter("cache.write_bytes", BYTES, "Bytes written to the disk cache.").named("riffle_cache_written");
    CACHE_EVICTIONS = counter("cache.evictions", NUMBER, "Objects evicted from the disk cache.");
    CACHE_EVICTED_BYTES = counter("cache.evicted_bytes", BYTES, "Bytes evicted from the disk cache.");
    CACHE_FULL = counter("cache.full", NUMBER, "Disk cache writes refused because nothing could be evicted.").named("riffle_cache_full_refusals");
    CACHE_VERIFIED_READS = counter("cache.verified_reads", NUMBER, "Disk cache reads of blocks known good served as just the bytes asked for (no whole-block read and CRC check).");
    CACHE_FREE_FLOOR_REFUSALS = counter("cache.free_floor_refusals", NUMBER, "Disk cache writes refused because the cache filesystem is down to the free space kept (--cache-min-free).");
    CACHE_MIN_FREE = gauge("cache.min_free", BYTES, "Bytes of the cache filesystem always left free (--cache-min-free).");
    CACHE_NO_SPACE_ERRORS = counter("cache.no_space_errors", NUMBER, "Disk cache writes that failed with ENOSPC.");
    CACHE_IO_ERRORS = counter("cache.io_errors", NUMBER, "Disk cache I/O errors.");
    CACHE_INDEX_MEMORY_PER_OBJECT = gauge("cache.index_memory_per_object", BYTES, "Memory of the disk cache index per known object.");
    CACHE_DIR = text("cache.dir", "The disk cache directory.");

    // Blocks (`fetch`).
    BLOCKS_DISK_HITS = counter("blocks.disk_hits", NUMBER, "Blocks served from the disk cache.");
    BLOCKS_HITS = counter("blocks.hits", NUMBER, "Blocks served from memory or joined in flight.");
    BLOCKS_MISSES = counter("blocks.misses", NUMBER, "Blocks that had to be fetched from the store.");
    BLOCKS_MEMORY_CACHE_BYTES = gauge("blocks.memory_cache_bytes", BYTES, "Bytes of blocks held in the memory cache.");

    // In-file read-ahead (`fetch`).
    READ_AHEAD_REQUESTS = counter("read_ahead.requests", NUMBER, "Read-ahead GETs started.");
    READ_AHEAD_SKIPPED_FOR_BUDGET = counter("read_ahead.skipped_for_budget", NUMBER, "Read-ahead skipped because the request or memory budget was used up.");

    // Prefetch across files (`prefetch`).
    PREFETCH_OPENS = counter("prefetch.opens", NUMBER, "File opens seen by the prefetcher.");
    PREFETCH_OPENS_ALREADY_CACHED = counter("prefetch.opens_already_cached", NUMBER, "File opens whose file was already wholly cached.");
    PREFETCH_PLAN_OPENS = counter("prefetch.plan_opens", NUMBER, "File opens of files in the epoch plan.");
    PREFETCH_PLAN_OPENS_ALREADY_CACHED = counter("prefetch.plan_opens_already_cached", NUMBER, "File opens of plan files that were already wholly cached.");
    PREFETCH_PLAN_FETCHED_FILES = counter("prefetch.plan_fetched_files", NUMBER, "Files fetched ahead of the reader by the epoch plan.");
    PREFETCH_PLAN_FETCHED_BYTES = counter("prefetch.plan_fetched_bytes", BYTES, "Bytes fetched ahead of the reader by the epoch plan.");
    PREFETCH_PLAN_MISSING = counter("prefetch.plan_missing", NUMBER, "Plan entries not found in the store.");
    PREFETCH_PLAN_ERRORS = counter("prefetch.plan_errors", NUMBER, "Plan fetches that failed.");
    PREFETCH_PLAN_UNUSED_BYTES = counter("prefetch.plan_unused_bytes", BYTES, "Bytes fetched for a plan that was replaced before they were opened (wasted).");
    PREFETCH_DIR_ORDER_FETCHED_FILES = counter("prefetch.dir_order_fetched_files", NUMBER, "Files fetched ahead of the reader in directory order.");

    // Epoch prefetch (`prefetch::epoch`).
    PREFETCH_EPOCH_ENABLED = gauge("prefetch.epoch.enabled", NUMBER, "1 if epoch prefetch is on (--epoch-prefetch).");
    PREFETCH_EPOCH_ACTIVE = gauge("prefetch.epoch.active", NUMBER, "1 while an epoch set is recognised and no plan is set.");
    PREFETCH_EPOCH_FILES = gauge("prefetch.epoch.files", NUMBER, "Files in the epoch set epoch prefetch recognised (no plan).").named("riffle_prefetch_epoch_set_files");
    PREFETCH_EPOCH_BYTES = gauge("prefetch.epoch.bytes", BYTES, "Bytes of the files in the epoch set.").named("riffle_prefetch_epoch_set");
    PREFETCH_EPOCH_DIRECTORIES = gauge("prefetch.epoch.directories", NUMBER, "Directories in the epoch set.").named("riffle_prefetch_epoch_set_directories");
    PREFETCH_EPOCH_DIRECTORIES_DRAWN_FROM = gauge("prefetch.epoch.directories_drawn_from", NUMBER, "Directories of the epoch set the reader has opened files in.");
    PREFETCH_EPOCH_FILES_DRAWN_FROM = gauge("prefetch.epoch.files_drawn_from", NUMBER, "Files in the directories drawn from (what epoch prefetch may fetch).");
    PREFETCH_EPOCH_BYTES_DRAWN_FROM = gauge("prefetch.epoch.bytes_drawn_from", BYTES, "Bytes in the directories drawn from.").named("riffle_prefetch_epoch_drawn_from");
    PREFETCH_EPOCH_EPOCH = gauge("prefetch.epoch.epoch", NUMBER, "The epoch the reader is in (1 = the first seen).").named("riffle_prefetch_epoch_number");
    PREFETCH_EPOCH_OPENED_FILES = gauge("prefetch.epoch.opened_files", NUMBER, "Files of the set opened in this epoch.");
    PREFETCH_EPOCH_OPENED_BYTES = gauge("prefetch.epoch.opened_bytes", BYTES, "Bytes of the files of the set opened in this epoch.");
    PREFETCH_EPOCH_FETCHED_AHEAD_FILES = gauge("prefetch.epoch.fetched_ahead_files", NUMBER, "Files epoch prefetch started fetching in this epoch.");
    PREFETCH_EPOCH_FETCHED_AHEAD_BYTES = gauge("prefetch.epoch.fetched_ahead_bytes", BYTES, "Bytes epoch prefetch started fetching in this epoch.");
    PREFETCH_EPOCH_AHEAD_UNOPENED_FILES = gauge("prefetch.epoch.ahead_unopened_files", NUMBER, "Files fetched ahead in this epoch and not opened yet.");
    PREFETCH_EPOCH_AHEAD_UNOPENED_BYTES = gauge("prefetch.epoch.ahead_unopened_bytes", BYTES, "Bytes fetched ahead in this epoch and not opened yet.");
    PREFETCH_EPOCH_FETCHING = gauge("prefetch.epoch.fetching", NUMBER, "Epoch prefetch fetches in flight.");
    PREFETCH_EPOCH_CACHED_UNOPENED_BYTES = gauge("prefetch.epoch.cached_unopened_bytes", BYTES, "Bytes of set files cached and not opened in this epoch (protected from eviction).");
    PREFETCH_EPOCH_LAST_USEFULNESS = gauge("prefetch.epoch.last_usefulness", NUMBER, "Share of the files fetched ahead in the last epoch that were opened in it.");
    PREFETCH_EPOCH_TOTAL_FETCHED_FILES = counter("prefetch.epoch.total_fetched_files", NUMBER, "Files fetched ahead by epoch prefetch.").named("riffle_prefetch_epoch_fetched_files");
    PREFETCH_EPOCH_TOTAL_FETCHED_BYTES = counter("prefetch.epoch.total_fetched_bytes", BYTES, "Bytes fetched ahead by epoch prefetch.").named("riffle_prefetch_epoch_fetched");
    PREFETCH_EPOCH_WASTED_BYTES = counter("prefetch.epoch.wasted_bytes", BYTES, "Bytes epoch prefetch fetched that were not opened before their epoch ended.");
    PREFETCH_EPOCH_ERRORS = counter("prefetch.epoch.errors", NUMBER, "Epoch prefetch fetches that failed.");
    PREFETCH_EPOCH_EPOCHS_STARTED = counter("prefetch.epoch.epochs_started", NUMBER, "Epoch boundaries seen (files of the set opened again).").named("riffle_prefetch_epochs_started");
    PREFETCH_EPOCH_ROOT = text("prefetch.epoch.root", "The directory of the epoch set (null without one).");
    PREFETCH_EPOCH_MODE = text("prefetch.epoch.mode", "How far epoch prefetch trusts the last epoch: normal, trusted or backed-off.");
    PREFETCH_EPOCH_NOTE = text("prefetch.epoch.note", "Why epoch prefetch holds back, if it does (null otherwise).");

    // The epoch plan (`prefetch::plan`); absent without one.
    PREFETCH_PLAN_ITEMS = gauge("prefetch.plan.items", NUMBER, "Entries in the current epoch plan.");
    PREFETCH_PLAN_POSITION = gauge("prefetch.plan.position", NUMBER, "The reader's position in the epoch plan.");
    PREFETCH_PLAN_FETCHING = gauge("prefetch.plan.fetching", NUMBER, "Plan files being fetched.");
    PREFETCH_PLAN_READY_UNOPENED_BYTES = gauge("prefetch.plan.ready_unopened_bytes", BYTES, "Bytes fetched for the plan and not yet opened by the reader.");

    // What the mount has listed (`namespace::usage`).
    VOLUME_LISTED_FILES = gauge("volume.listed_files", NUMBER, "Files reachable from the mount root among the names listed so far.");
    VOLUME_LISTED_DIRS = gauge("volume.listed_dirs", NUMBER, "Directories reachable from the mount root among the names listed so far.");
    VOLUME_LISTED_ENTRIES = gauge("volume.listed_entries", NUMBER, "Files and directories listed so far (the volume's inodes in NodeGetVolumeStats).");
    VOLUME_LISTED_BYTES = gauge("volume.listed_bytes", BYTES, "Bytes of the files listed so far (the volume's total bytes in NodeGetVolumeStats).");
    VOLUME_CACHED_BYTES = gauge("volume.cached_bytes", BYTES, "Bytes of the listed files the node's disk cache holds whole (the volume's used bytes in NodeGetVolumeStats).");

    // The peer ring (`fetch::peer`); absent without peers.
    PEER_MEMBERS = gauge("peer.members", NUMBER, "Members of the peer ring (this node included when it is one).");
    PEER_BYTES_SERVED = counter("peer.bytes_served", BYTES, "Bytes of blocks served to peers.").named("riffle_peer_served");
    PEER_BLOCKS_SERVED = counter("peer.blocks_served", NUMBER, "Blocks served to peers.");
    PEER_BYTES_FETCHED = counter("peer.bytes_fetched", BYTES, "Bytes of blocks fetched from peers (CRC-checked).").named("riffle_peer_fetched");
    PEER_BLOCKS_FETCHED = counter("peer.blocks_fetched", NUMBER, "Blocks fetched from peers (CRC-checked).");
    PEER_STORE_FALLBACKS = counter("peer.store_fallbacks", NUMBER, "Blocks fetched from the store because the peers asked failed.");
    PEER_ERRORS = counter("peer.errors", NUMBER, "Failed requests to peers, and refused requests from them.");

    // GETs in flight (`fetch`).
    INFLIGHT_REQUESTS = gauge("inflight.requests", NUMBER, "GET requests in flight.");
    INFLIGHT_BYTES = gauge("inflight.bytes", BYTES, "Bytes of GET buffers reserved.");

    // The namespace (`namespace`).
    NAMESPACE_INODES = gauge("namespace.inodes", NUMBER, "Inodes known to the namespace.");
    NAMESPACE_SKIPPED_KEYS = gauge("namespace.skipped_keys", NUMBER, "Object keys not representable as paths (skipped).");
    NAMESPACE_LISTINGS = counter("namespace.listings", NUMBER, "Directory listings taken from the store (all pages of one directory).");
    NAMESPACE_LISTINGS_BACKGROUND = counter("namespace.listings_background", NUMBER, "Directory listings started in the background ahead of a walk.");
    NAMESPACE_LISTINGS_BACKGROUND_FAILED = counter("namespace.listings_background_failed", NUMBER, "Background listings that failed after retries (a reader lists the directory itself).");
    NAMESPACE_LISTINGS_FROM_DISK = counter("namespace.listings_from_disk", NUMBER, "Directory listings taken from the cache directory instead of the store.");
    NAMESPACE_LISTINGS_SAVED = counter("namespace.listings_saved", NUMBER, "Directory listings written to the cache directory.");
    NAMESPACE_LISTINGS_SAVED_IGNORED = counter("namespace.listings_saved_ignored", NUMBER, "Saved listings found torn or unreadable and not used.");
    NAMESPACE_HEAP_TRIMS = counter("namespace.heap_trims", NUMBER, "Times freed heap memory was given back to the system after a burst of listings.");
}

/// The disk cache's section (absent without `--cache-dir`).
pub const CACHE: Section = section("cache");
/// The peer ring's section (absent without peers).
pub const PEER: Section = section("peer");
/// The epoch plan's section (absent without a plan).
pub const PREFETCH_PLAN: Section = section("prefetch.plan");

/// The declaration of the field at `path`, if any.
pub fn find(path: &str) -> Option<&'static Stat> {
    ALL.iter().find(|s| s.path == path)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn paths_are_unique_and_no_field_is_also_a_section() {
        let mut seen = HashSet::new();
        for s in ALL {
            assert!(seen.insert(s.path), "{} is declared twice", s.path);
            assert!(!s.help.is_empty(), "{} has no help", s.path);
            let inside = format!("{}.", s.path);
            assert!(
                !ALL.iter().any(|t| t.path.starts_with(&inside)),
                "{} is a field and a section",
                s.path
            );
        }
        for section in [CACHE, PEER, PREFETCH_PLAN] {
            let inside = format!("{}.", section.path);
            assert!(
                ALL.iter().any(|s| s.path.starts_with(&inside)),
                "section {} has no fields",
                section.path
            );
            assert!(find(section.path).is_none(), "{} is a field", section.path);
        }
    }

    #[test]
    fn find_and_get_read_by_path() {
        let tree = serde_json::json!({"prefetch": {"opens": 3, "plan": null}});
        assert_eq!(find("prefetch.opens"), Some(&PREFETCH_OPENS));
        assert_eq!(find("prefetch.nothing"), None);
        assert_eq!(PREFETCH_OPENS.count(&tree), 3);
        assert_eq!(PREFETCH_PLAN_ITEMS.get(&tree), None);
        assert_eq!(FUSE_OPENS.count(&tree), 0);
    }
}
