//! Gives freed heap memory back to the operating system after a burst of listings.
//!
//! Listing a bucket parses pages of 1,000 keys (XML from the store, or a saved listing read
//! from disk) into short-lived buffers on many threads at once, then keeps only the compact
//! tree. glibc's allocator keeps what those buffers freed in its per-thread arenas, so after
//! a walk of a million objects the daemon's RSS stays above what the tree holds: measured on
//! W4 at a tenth of its size (110,000 objects), 261 bytes of RSS per listed object after the
//! walk, 218 after `malloc_trim(0)`.
//!
//! # When memory is trimmed
//! Anyone who just finished such a burst calls [`trim_soon`]; the namespace does after every
//! listing it applies. A single background thread (started on the first call) waits until
//! [`QUIET`] passed without another call, then calls `malloc_trim(0)` once: a walk that
//! applies a listing every few milliseconds is trimmed once, a quarter of a second after its
//! last listing, never while it runs. A trim walks the allocator's arenas and returns whole
//! free pages (`madvise(MADV_DONTNEED)`); it moves nothing and costs milliseconds for a heap
//! of hundreds of megabytes. A training epoch, which lists nothing, never triggers one.
//!
//! On other C libraries (musl) `malloc_trim` does not exist and this does nothing.
//!
//! # Arenas
//! glibc gives threads their own arenas, up to eight per core, and memory freed in one arena
//! serves only later allocations there. The daemon's data buffers (a block read from the
//! cache or fetched, 4 KiB to 1 MiB, freed when its reply is sent or the memory cache lets
//! it go) are allocated on FUSE, runtime and I/O threads alike, so each arena ends up
//! holding free space of its own: on W1 without passthrough (6,000 files, `--max-memory
//! 307M`, so a memory cache of 307 MB) the daemon's RSS after the cold epoch was 461 MB with
//! the default arenas, 379 MB with 4 and 308 MB with 2 (passthrough, whose reads skip the
//! daemon: 306 MB), at the same speed within the noise (warm ÷ local disk 0.63–0.94× in all
//! three). So [`limit_arenas`] caps them at [`ARENAS`] at start-up, unless the user set
//! `MALLOC_ARENA_MAX` or `GLIBC_TUNABLES` (theirs wins).
//!
//! # Large allocations
//! glibc serves an allocation of [`MMAP_THRESHOLD`] or more with pages of its own (`mmap`),
//! given back at `free`, but by default it raises that threshold to the size of every such
//! allocation freed (up to 32 MiB), after which they come from the arenas and what they free
//! stays there, in holes between live allocations. The daemon's large allocations come and
//! go by the thousand (the HTTP client's per-connection read buffers, 128–400 KiB; small
//! files' blocks; listing pages), so RSS ended far above what was live: with `--max-memory
//! 64M`, 64 readers of small files peaked at 133–152 MiB, six shards at 109–127 MiB; with the
//! threshold fixed at 128 KiB (which also stops the dynamic adjustment), 99–104 and 74–76 MiB,
//! at the same speed (`benches/memory.sh`). [`limit_arenas`] fixes it, unless the user set
//! `MALLOC_MMAP_THRESHOLD_` or `GLIBC_TUNABLES`. (Blocks of 256 KiB and more are mapped by
//! the cache's own buffers, `cache::ring::AlignedBuf`, which keep a few for reuse.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::OnceLock;
use std::time::Duration;

/// How long no [`trim_soon`] call must come before the trim runs.
pub const QUIET: Duration = Duration::from_millis(250);

/// Trims done since the process started (for `riffle stats`).
static TRIMS: AtomicU64 = AtomicU64::new(0);

/// Asks for a trim once the current burst of work is over (module documentation). Never
/// blocks: a request while one is pending is the same request.
pub fn trim_soon() {
    static REQUESTS: OnceLock<Option<SyncSender<()>>> = OnceLock::new();
    let requests = REQUESTS.get_or_init(|| {
        let (tx, rx) = sync_channel(1);
        std::thread::Builder::new()
            .name("riffle-trim".into())
            .spawn(move || trim_after_quiet(rx))
            .map_err(|e| tracing::debug!(error = %e, "no heap trim thread"))
            .ok()
            .map(|_| tx)
    });
    if let Some(tx) = requests {
        // Full: a request is pending already, which this one joins.
        let _ = tx.try_send(());
    }
}

/// Allocator arenas at most (module documentation, "Arenas").
pub const ARENAS: i32 = 2;

/// Allocations of this many bytes or more get pages of their own, given back at `free`
/// (module documentation, "Large allocations").
pub const MMAP_THRESHOLD: i32 = 128 * 1024;

/// Caps glibc's arenas at [`ARENAS`] and fixes its mmap threshold at [`MMAP_THRESHOLD`]; call
/// before any thread starts. Leaves a setting alone when the environment sets it (or
/// `GLIBC_TUNABLES` is set); does nothing on other C libraries.
pub fn limit_arenas() {
    if std::env::var_os("GLIBC_TUNABLES").is_some() {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
            // SAFETY: mallopt only sets an allocator parameter; called before other threads.
            unsafe { libc::mallopt(libc::M_ARENA_MAX, ARENAS) };
        }
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
            // SAFETY: as above.
            unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) };
        }
    }
}

/// Trims done by this process so far.
pub fn trims() -> u64 {
    TRIMS.load(Ordering::Relaxed)
}

fn trim_after_quiet(requests: Receiver<()>) {
    while requests.recv().is_ok() {
        // Wait out the burst: every request within QUIET starts the wait again.
        while requests.recv_timeout(QUIET).is_ok() {}
        trim_now();
    }
}

/// Returns the allocator's free pages to the operating system now.
fn trim_now() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim takes the allocator's own locks; it only releases free memory.
        let released = unsafe { libc::malloc_trim(0) };
        TRIMS.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(released = released != 0, "heap trimmed");
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    #[test]
    fn a_burst_of_requests_ends_in_a_trim() {
        let before = trims();
        for _ in 0..50 {
            trim_soon();
            std::thread::sleep(Duration::from_millis(2));
        }
        // Other tests in this process may ask too; wait until ours has been served.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while trims() == before && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(trims() > before, "the burst was never trimmed");
    }
}
