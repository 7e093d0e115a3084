//! Read proofs: which cached object versions a credential has shown, at the store, that it
//! may read. The cache serves an entry's bytes to a mount only with such a proof.
//!
//! # The rule
//! The cache is shared by every mount on a node, whatever credential each one uses. Listing a
//! bucket (or HEADing a key) proves nothing about reading its objects (`s3:ListBucket` is
//! granted far more widely than `s3:GetObject`, and a HEAD does not prove `kms:Decrypt`), so
//! a mount may be served an entry's bytes only once its own **principal** has read that
//! object version from the store:
//! - a GET this mount made for the version (every block it fetched) is a proof: a
//!   single-tenant node, whose entries were all filled by one principal, makes no extra
//!   request, ever;
//! - an open of a version whose entry holds bytes and that this principal has no proof for
//!   costs one proof request: a GET of its first byte with `If-Match: <etag>`
//!   ([`crate::fetch::Fetcher::admit`]); an answer proves it, a refusal (403) is remembered
//!   as a denial and fails the open with `EACCES`;
//! - the answers to proof requests (proofs and refusals) last the metadata TTL
//!   (`--metadata-ttl`; with `indefinite`, for as long as the log keeps them); a GET of the
//!   mount's own does not expire (the principal read those bytes from the store, as it would
//!   keep them in its own page cache). All are kept on disk so a remount does not repeat them.
//!
//! # Principals
//! A [`Principal`] is 128 bits of SHA-256 over the endpoint and the name of whoever signs the
//! requests: `role:<arn>` for web identity (`AWS_ROLE_ARN`: the role, not the session, so
//! proofs outlive its short-lived keys), `key:<access key id>` for keys, `anonymous` for
//! unsigned requests. Only the hash reaches the disk. Temporary keys other than web identity
//! (an assumed role in a profile, instance credentials) are named by their access key id, so
//! their proofs last one credential session: safe, at one proof request per object and
//! session.
//!
//! # On disk
//! One append-only log per principal, `DIR/proofs/<principal>.log`, of 32-byte records
//! (little-endian):
//! ```text
//!  0 16  entry key          16 1  verdict (1 = may read, 2 = refused)     17 3 zero
//! 20  8  expiry, seconds since the Unix epoch (u64::MAX: never)          28 4 CRC32C of 0..28
//! ```
//! One log per principal rather than a file per entry: a mount reads only its own log, at
//! start (32 bytes per object it has read), and a shared cache holds one file per tenant, not
//! one more per object. Appends are single `O_APPEND` writes of one record, atomic on local
//! file systems, so several mounts of one principal share a log; a torn tail is skipped the
//! way the entry journals skip one (byte by byte to the next valid record). The last record
//! of a key wins. A log is rewritten without its expired and superseded records when they
//! are more than half of it (at load; a record another mount appends during the rewrite may
//! be lost, which costs one proof request, never a wrong answer).
//!
//! Losing a log (deleted, corrupt, unwritable) only costs proof requests: nothing here can
//! make the cache serve bytes without a proof. In memory a proof costs about 30 bytes
//! (a 16-byte key and a 4-byte word in a hash table) per object version the mount has read.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use super::EntryKey;

/// The directory under the cache dir holding the logs.
pub const PROOFS_DIR: &str = "proofs";
const RECORD: usize = 32;
const ALLOWED: u8 = 1;
const REFUSED: u8 = 2;
/// In memory: the top bit of the word marks a refusal, the rest is the expiry in minutes
/// since the Unix epoch (rounded up; `NEVER`: no expiry).
const REFUSED_BIT: u32 = 1 << 31;
const NEVER: u32 = REFUSED_BIT - 1;

/// Who signs a mount's requests, as the cache tells principals apart (see the module doc).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Principal([u8; 16]);

impl Principal {
    /// `name` is `role:<arn>`, `key:<access key id>` or `anonymous`; `endpoint` as in
    /// [`super::ObjectIdentity`].
    pub fn new(endpoint: &str, name: &str) -> Principal {
        let mut h = Sha256::new();
        h.update(b"rifflefs-principal-v1\0");
        for field in [endpoint, name] {
            h.update((field.len() as u64).to_le_bytes());
            h.update(field.as_bytes());
        }
        let mut out = [0u8; 16];
        out.copy_from_slice(&h.finalize()[..16]);
        Principal(out)
    }

    /// The hash in hex (32 digits): how peers name a principal ([`crate::fetch::peer`]).
    pub fn to_hex(self) -> String {
        self.hex()
    }

    fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl std::fmt::Debug for Principal {
    // The hash only, and short: enough to tell two apart in a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Principal({})", &self.hex()[..8])
    }
}

/// What a principal's log says about one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Read it from the store: its cached bytes may be served.
    MayRead,
    /// The store refused it (403): fail its opens with `EACCES` until this expires.
    Refused,
}

/// One principal's proofs: see the module documentation.
pub struct ProofLog {
    path: PathBuf,
    /// `None`: the log could not be opened; proofs are kept in memory only.
    file: Mutex<Option<File>>,
    entries: Mutex<HashMap<EntryKey, u32>>,
    ttl: Option<Duration>,
}

impl ProofLog {
    /// Opens (or creates) `principal`'s log in the cache directory `dir`, keeping what it
    /// records for `ttl` (`None`: indefinitely). Never fails: a log that cannot be read or
    /// written leaves proofs in memory only, after one warning.
    pub fn open(dir: &Path, principal: Principal, ttl: Option<Duration>) -> ProofLog {
        let proofs = dir.join(PROOFS_DIR);
        let path = proofs.join(format!("{}.log", principal.hex()));
        let (entries, records) = match read_log(&path) {
            Ok(found) => found,
            Err(e) => {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!(path = %path.display(), error = %e, "cannot read the cache's proof log; proofs will be asked for again");
                }
                (HashMap::new(), 0)
            }
        };
        if records > 64 && records > 2 * entries.len() {
            if let Err(e) = rewrite(&path, &entries) {
                tracing::debug!(path = %path.display(), error = %e, "could not compact the proof log");
            }
        }
        let file = fs::create_dir_all(&proofs)
            .and_then(|()| {
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .mode_0600()
                    .open(&path)
            })
            .map_err(|e| {
                tracing::warn!(path = %path.display(), error = %e, "cannot write the cache's proof log; proofs last until unmount");
            })
            .ok();
        ProofLog {
            path,
            file: Mutex::new(file),
            entries: Mutex::new(entries),
            ttl,
        }
    }

    /// A log kept in memory only (tests, and mounts without a cache directory).
    pub fn in_memory(ttl: Option<Duration>) -> ProofLog {
        ProofLog {
            path: PathBuf::new(),
            file: Mutex::new(None),
            entries: Mutex::new(HashMap::new()),
            ttl,
        }
    }

    /// The log's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What is known about `key` now (`None`: nothing, or it expired).
    pub fn verdict(&self, key: &EntryKey) -> Option<Verdict> {
        let word = *self.entries.lock().get(key)?;
        decode(word, now_minutes())
    }

    /// Whether `key`'s cached bytes may be served: a proof that has not expired.
    pub fn may_read(&self, key: &EntryKey) -> bool {
        self.verdict(key) == Some(Verdict::MayRead)
    }

    /// Records that this principal read `key`'s version from the store itself (a GET this
    /// mount made): a proof that does not expire (see the module doc).
    pub fn record_read(&self, key: EntryKey) {
        self.write(key, Verdict::MayRead, None);
    }

    /// Records the answer of a proof request: it lasts the TTL.
    pub fn record(&self, key: EntryKey, verdict: Verdict) {
        let expires = self
            .ttl
            .map(|ttl| SystemTime::now() + ttl)
            .map(|at| at.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs());
        self.write(key, verdict, expires);
    }

    /// Keeps `verdict` (until `expires`, seconds since the epoch) in memory and in the log,
    /// unless the same is already known.
    fn write(&self, key: EntryKey, verdict: Verdict, expires: Option<u64>) {
        let word = encode(verdict, expires);
        {
            let mut entries = self.entries.lock();
            match entries.get(&key) {
                // Already as good: nothing to write (the common case: every block a mount
                // fetches records its object).
                Some(&old) if old == word || (old == NEVER && verdict == Verdict::MayRead) => {
                    return
                }
                _ => {}
            }
            entries.insert(key, word);
        }
        let record = encode_record(&key, verdict, expires.unwrap_or(u64::MAX));
        let mut file = self.file.lock();
        if let Some(f) = file.as_mut() {
            if let Err(e) = f.write_all(&record) {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot append to the cache's proof log; proofs last until unmount");
                *file = None;
            }
        }
    }
}

trait CreateMode {
    fn mode_0600(&mut self) -> &mut Self;
}

impl CreateMode for OpenOptions {
    fn mode_0600(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.mode(0o600)
    }
}

fn now_minutes() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
        / 60
}

fn encode(verdict: Verdict, expires_secs: Option<u64>) -> u32 {
    let minutes = match expires_secs {
        None => NEVER,
        Some(s) => (s.div_ceil(60)).min(NEVER as u64 - 1) as u32,
    };
    match verdict {
        Verdict::MayRead => minutes,
        Verdict::Refused => minutes | REFUSED_BIT,
    }
}

fn decode(word: u32, now_minutes: u64) -> Option<Verdict> {
    let minutes = word & !REFUSED_BIT;
    if minutes != NEVER && (minutes as u64) <= now_minutes {
        return None;
    }
    Some(if word & REFUSED_BIT != 0 {
        Verdict::Refused
    } else {
        Verdict::MayRead
    })
}

fn encode_record(key: &EntryKey, verdict: Verdict, expires_secs: u64) -> [u8; RECORD] {
    let mut r = [0u8; RECORD];
    r[..16].copy_from_slice(&key.0);
    r[16] = match verdict {
        Verdict::MayRead => ALLOWED,
        Verdict::Refused => REFUSED,
    };
    r[20..28].copy_from_slice(&expires_secs.to_le_bytes());
    let crc = crc32c::crc32c(&r[..28]);
    r[28..].copy_from_slice(&crc.to_le_bytes());
    r
}

/// The record at the start of `b`, if it is one.
fn decode_record(b: &[u8]) -> Option<(EntryKey, Verdict, u64)> {
    let r = b.get(..RECORD)?;
    if r[17..20] != [0, 0, 0]
        || crc32c::crc32c(&r[..28]) != u32::from_le_bytes(r[28..].try_into().ok()?)
    {
        return None;
    }
    let verdict = match r[16] {
        ALLOWED => Verdict::MayRead,
        REFUSED => Verdict::Refused,
        _ => return None,
    };
    let mut key = [0u8; 16];
    key.copy_from_slice(&r[..16]);
    let expires = u64::from_le_bytes(r[20..28].try_into().ok()?);
    Some((EntryKey(key), verdict, expires))
}

/// The live entries of a log and how many records it holds.
fn read_log(path: &Path) -> io::Result<(HashMap<EntryKey, u32>, usize)> {
    let mut bytes = Vec::new();
    File::open(path)?.read_to_end(&mut bytes)?;
    let now = now_minutes();
    let mut entries = HashMap::new();
    let mut records = 0;
    let mut at = 0;
    while at + RECORD <= bytes.len() {
        match decode_record(&bytes[at..]) {
            Some((key, verdict, expires)) => {
                records += 1;
                let word = encode(verdict, (expires != u64::MAX).then_some(expires));
                if decode(word, now).is_some() {
                    entries.insert(key, word);
                } else {
                    entries.remove(&key);
                }
                at += RECORD;
            }
            None => at += 1,
        }
    }
    Ok((entries, records))
}

/// Replaces the log with one record per live entry (write a temporary file, rename).
fn rewrite(path: &Path, entries: &HashMap<EntryKey, u32>) -> io::Result<()> {
    let tmp = path.with_extension(format!("log.tmp{}", std::process::id()));
    let mut out = Vec::with_capacity(entries.len() * RECORD);
    for (key, word) in entries {
        let verdict = if word & REFUSED_BIT != 0 {
            Verdict::Refused
        } else {
            Verdict::MayRead
        };
        let minutes = word & !REFUSED_BIT;
        let expires = if minutes == NEVER {
            u64::MAX
        } else {
            minutes as u64 * 60
        };
        out.extend_from_slice(&encode_record(key, verdict, expires));
    }
    let mut f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode_0600()
        .open(&tmp)?;
    f.write_all(&out)?;
    fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> EntryKey {
        EntryKey([n; 16])
    }

    #[test]
    fn principals_differ_by_name_and_endpoint_and_hide_the_name() {
        let a = Principal::new("http://rgw", "key:AKIAONE");
        assert_eq!(a, Principal::new("http://rgw", "key:AKIAONE"));
        assert_ne!(a, Principal::new("http://rgw", "key:AKIATWO"));
        assert_ne!(a, Principal::new("http://other", "key:AKIAONE"));
        assert!(!format!("{a:?}").contains("AKIA"));
        assert!(!a.hex().contains("AKIA"));
    }

    #[test]
    fn proofs_and_refusals_survive_a_reopen_and_the_last_record_wins() {
        let dir = tempfile::tempdir().unwrap();
        let p = Principal::new("e", "key:A");
        let log = ProofLog::open(dir.path(), p, None);
        assert_eq!(log.verdict(&key(1)), None);
        log.record_read(key(1));
        log.record(key(2), Verdict::Refused);
        log.record(key(3), Verdict::Refused);
        log.record(key(3), Verdict::MayRead);
        drop(log);
        let again = ProofLog::open(dir.path(), p, None);
        assert!(again.may_read(&key(1)));
        assert_eq!(again.verdict(&key(2)), Some(Verdict::Refused));
        assert!(again.may_read(&key(3)));
        // Another principal's log knows nothing of these.
        let other = ProofLog::open(dir.path(), Principal::new("e", "key:B"), None);
        assert_eq!(other.verdict(&key(1)), None);
        let mode = std::fs::metadata(again.path()).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(mode.permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn a_repeated_verdict_is_written_once() {
        let dir = tempfile::tempdir().unwrap();
        let log = ProofLog::open(dir.path(), Principal::new("e", "key:A"), None);
        for _ in 0..100 {
            log.record_read(key(7));
            log.record(key(7), Verdict::MayRead);
        }
        assert_eq!(std::fs::metadata(log.path()).unwrap().len(), RECORD as u64);
    }

    #[test]
    fn expired_records_are_forgotten() {
        assert_eq!(decode(encode(Verdict::MayRead, Some(60)), 5), None);
        assert_eq!(
            decode(encode(Verdict::Refused, Some(3600)), 59),
            Some(Verdict::Refused)
        );
        assert_eq!(decode(encode(Verdict::Refused, Some(3600)), 60), None);
        assert_eq!(
            decode(encode(Verdict::MayRead, None), u64::MAX / 2),
            Some(Verdict::MayRead)
        );
        // A TTL long past is read back from disk as expired.
        let dir = tempfile::tempdir().unwrap();
        let p = Principal::new("e", "key:A");
        let path = dir.path().join(PROOFS_DIR);
        std::fs::create_dir_all(&path).unwrap();
        std::fs::write(
            path.join(format!("{}.log", p.hex())),
            encode_record(&key(1), Verdict::MayRead, 120),
        )
        .unwrap();
        assert_eq!(ProofLog::open(dir.path(), p, None).verdict(&key(1)), None);
    }

    #[test]
    fn a_torn_or_garbled_log_keeps_every_whole_record() {
        let dir = tempfile::tempdir().unwrap();
        let p = Principal::new("e", "key:A");
        let log = ProofLog::open(dir.path(), p, None);
        log.record(key(1), Verdict::MayRead);
        let path = log.path().to_path_buf();
        drop(log);
        // A torn append (half a record), then garbage, then a whole record.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice(&encode_record(&key(9), Verdict::MayRead, u64::MAX)[..13]);
        bytes.extend_from_slice(b"garbage!");
        bytes.extend_from_slice(&encode_record(&key(2), Verdict::Refused, u64::MAX));
        std::fs::write(&path, bytes).unwrap();
        let again = ProofLog::open(dir.path(), p, None);
        assert!(again.may_read(&key(1)));
        assert_eq!(again.verdict(&key(9)), None);
        assert_eq!(again.verdict(&key(2)), Some(Verdict::Refused));
    }

    #[test]
    fn a_log_of_mostly_dead_records_is_compacted() {
        let dir = tempfile::tempdir().unwrap();
        let p = Principal::new("e", "key:A");
        let log = ProofLog::open(dir.path(), p, None);
        for round in 0..100 {
            let verdict = if round % 2 == 0 {
                Verdict::MayRead
            } else {
                Verdict::Refused
            };
            log.record(key(1), verdict);
        }
        log.record(key(2), Verdict::MayRead);
        let path = log.path().to_path_buf();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 101 * RECORD as u64);
        drop(log);
        let again = ProofLog::open(dir.path(), p, None);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 2 * RECORD as u64);
        assert_eq!(again.verdict(&key(1)), Some(Verdict::Refused));
        assert!(again.may_read(&key(2)));
        // Appends after the rewrite land in the new file.
        again.record(key(3), Verdict::MayRead);
        drop(again);
        assert!(ProofLog::open(dir.path(), p, None).may_read(&key(3)));
    }

    #[test]
    fn an_unwritable_log_keeps_proofs_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        // A file where the proofs directory should be.
        std::fs::write(dir.path().join(PROOFS_DIR), b"not a directory").unwrap();
        let log = ProofLog::open(dir.path(), Principal::new("e", "key:A"), None);
        log.record(key(1), Verdict::MayRead);
        assert!(log.may_read(&key(1)));
    }
}
