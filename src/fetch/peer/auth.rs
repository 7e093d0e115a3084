//! Peer authentication: HMAC-SHA256 with a secret every node shares (`--peer-secret-file`).
//!
//! A request carries the time (Unix seconds), the asking node's name and the principal hash
//! of the mount asking (see [`crate::cache::Principal`]), and a MAC over those, the method
//! and the path with its query (which names bucket, key, ETag, size and block):
//! ```text
//! authorization: RIFFLE-HMAC-SHA256 <hex MAC of "riffle-peer-v1\nGET\n/v1/block?...\n<time>\n<node>\n<principal>">
//! x-riffle-time: <unix seconds>     x-riffle-node: <HOST:PORT>     x-riffle-principal: <32 hex>
//! ```
//! The owner answers 401 to a missing or malformed header, a MAC that does not match
//! (compared in constant time, by the `hmac` crate's `verify_slice`), or a time more than
//! [`MAX_SKEW`] away from its clock. Within that window a captured request can be replayed,
//! which gains nothing an eavesdropper did not already see (the block bytes), as blocks are
//! immutable. The answer is signed too, over the request's MAC, the block's CRC32C, its
//! length and the proof flag, so a man in the middle can neither claim a proof the owner did
//! not attest nor swap a block for another one with its own CRC.
//!
//! Traffic is not encrypted: run peers on the cluster network, where the store traffic goes
//! too (or under a service mesh that adds TLS). The secret is never logged, printed, put in an
//! error message, a metric or an argument list: it comes from a file.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{KeyInit, Mac};

type HmacSha256 = hmac::Hmac<sha2_hmac::Sha256>;

/// Largest accepted difference between a request's time and the owner's clock.
pub const MAX_SKEW: Duration = Duration::from_secs(300);
/// Shortest secret accepted.
pub const MIN_SECRET_BYTES: usize = 16;

pub const TIME: &str = "x-riffle-time";
pub const NODE: &str = "x-riffle-node";
pub const PRINCIPAL: &str = "x-riffle-principal";
pub const RESPONSE_MAC: &str = "x-riffle-mac";
const SCHEME: &str = "RIFFLE-HMAC-SHA256 ";

/// Why a secret file cannot be used (never with the secret's bytes).
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("cannot read the peer secret file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("the peer secret file {path} is empty")]
    Empty { path: String },
    #[error("the peer secret in {path} is too short: at least {MIN_SECRET_BYTES} bytes")]
    TooShort { path: String },
}

/// Why a request was refused (the owner answers 401 and logs this at debug).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("missing or malformed header {0}")]
    Header(&'static str),
    #[error("the request's time is more than five minutes from this node's clock")]
    Skew,
    #[error("the request's MAC does not match (another secret?)")]
    BadMac,
}

/// The shared secret. Its `Debug` shows nothing of it.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// Reads the secret from `path`: its bytes less surrounding whitespace (a trailing newline
    /// of an editor or `echo` is not part of it).
    pub fn from_file(path: &Path) -> Result<Secret, SecretError> {
        let shown = path.display().to_string();
        let raw = std::fs::read(path).map_err(|source| SecretError::Read {
            path: shown.clone(),
            source,
        })?;
        let secret = raw.trim_ascii();
        if secret.is_empty() {
            return Err(SecretError::Empty { path: shown });
        }
        if secret.len() < MIN_SECRET_BYTES {
            return Err(SecretError::TooShort { path: shown });
        }
        Ok(Secret(secret.to_vec()))
    }

    #[cfg(test)]
    pub fn from_bytes(b: &[u8]) -> Secret {
        Secret(b.to_vec())
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC takes keys of any length.
        match <HmacSha256 as KeyInit>::new_from_slice(&self.0) {
            Ok(m) => m,
            Err(_) => unreachable!("HMAC accepts keys of every length"),
        }
    }

    fn request_mac(&self, method: &str, path_and_query: &str, fields: &Fields) -> HmacSha256 {
        let mut m = self.mac();
        for part in [
            "riffle-peer-v1",
            method,
            path_and_query,
            &fields.time.to_string(),
            &fields.node,
            &fields.principal,
        ] {
            m.update(part.as_bytes());
            m.update(b"\n");
        }
        m
    }

    /// The `authorization` header's value for a request.
    pub fn sign(&self, method: &str, path_and_query: &str, fields: &Fields) -> String {
        let mac = self.request_mac(method, path_and_query, fields);
        format!("{SCHEME}{}", hex(&mac.finalize().into_bytes()))
    }

    /// Checks a request's `authorization` value against its fields, at time `now`.
    pub fn verify(
        &self,
        method: &str,
        path_and_query: &str,
        fields: &Fields,
        authorization: Option<&str>,
        now: SystemTime,
    ) -> Result<(), AuthError> {
        let given = authorization
            .and_then(|a| a.strip_prefix(SCHEME))
            .and_then(unhex)
            .ok_or(AuthError::Header("authorization"))?;
        let now = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        if now.abs_diff(fields.time) > MAX_SKEW.as_secs() {
            return Err(AuthError::Skew);
        }
        self.request_mac(method, path_and_query, fields)
            .verify_slice(&given)
            .map_err(|_| AuthError::BadMac)
    }

    /// The MAC of an answer: binds the block's CRC, length and the proof flag to the request
    /// (`authorization` as the request sent it).
    pub fn sign_response(&self, authorization: &str, crc: u32, len: usize, proof: bool) -> String {
        hex(&self
            .response_mac(authorization, crc, len, proof)
            .finalize()
            .into_bytes())
    }

    /// Checks an answer's MAC (constant time).
    pub fn verify_response(
        &self,
        authorization: &str,
        crc: u32,
        len: usize,
        proof: bool,
        given: Option<&str>,
    ) -> Result<(), AuthError> {
        let given = given
            .and_then(unhex)
            .ok_or(AuthError::Header(RESPONSE_MAC))?;
        self.response_mac(authorization, crc, len, proof)
            .verify_slice(&given)
            .map_err(|_| AuthError::BadMac)
    }

    fn response_mac(&self, authorization: &str, crc: u32, len: usize, proof: bool) -> HmacSha256 {
        let mut m = self.mac();
        let text = format!("riffle-peer-answer-v1\n{authorization}\n{crc}\n{len}\n{proof}\n");
        m.update(text.as_bytes());
        m
    }
}

/// The signed fields of a request besides method and path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fields {
    /// Unix seconds.
    pub time: u64,
    /// The asking node (`HOST:PORT`, or `-` for a node without a peer port).
    pub node: String,
    /// The asking mount's principal hash, 32 hex digits.
    pub principal: String,
}

impl Fields {
    pub fn now(node: &str, principal: &str) -> Fields {
        Fields {
            time: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs(),
            node: node.to_string(),
            principal: principal.to_string(),
        }
    }

    /// The fields from a request's headers (`get` looks one up).
    pub fn from_headers<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Result<Fields, AuthError> {
        let time = get(TIME)
            .and_then(|t| t.parse().ok())
            .ok_or(AuthError::Header(TIME))?;
        let node = get(NODE)
            .filter(|n| !n.is_empty() && n.len() <= 256)
            .ok_or(AuthError::Header(NODE))?;
        let principal = get(PRINCIPAL)
            .filter(|p| p.len() == 32 && p.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or(AuthError::Header(PRINCIPAL))?;
        Ok(Fields {
            time,
            node: node.to_string(),
            principal: principal.to_string(),
        })
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 || s.len() > 128 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATH: &str = "/v1/block?bucket=b&key=k&etag=e&size=10&block=0&bs=1024";

    fn fields() -> Fields {
        Fields::now("127.0.0.1:7001", &"ab".repeat(16))
    }

    #[test]
    fn hmac_matches_rfc_4231_case_2() {
        let s = Secret::from_bytes(b"Jefe");
        let mut m = s.mac();
        m.update(b"what do ya want for nothing?");
        assert_eq!(
            hex(&m.finalize().into_bytes()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn a_signed_request_verifies_and_every_change_fails() {
        let s = Secret::from_bytes(b"0123456789abcdef-shared");
        let f = fields();
        let auth = s.sign("GET", PATH, &f);
        let now = SystemTime::now();
        assert_eq!(s.verify("GET", PATH, &f, Some(&auth), now), Ok(()));
        // Another path, node, principal or secret.
        let other = PATH.replace("block=0", "block=1");
        assert_eq!(
            s.verify("GET", &other, &f, Some(&auth), now),
            Err(AuthError::BadMac)
        );
        let mut g = f.clone();
        g.principal = "cd".repeat(16);
        assert_eq!(
            s.verify("GET", PATH, &g, Some(&auth), now),
            Err(AuthError::BadMac)
        );
        let wrong = Secret::from_bytes(b"another-secret-of-16");
        assert_eq!(
            wrong.verify("GET", PATH, &f, Some(&auth), now),
            Err(AuthError::BadMac)
        );
        // A missing or garbled header.
        assert_eq!(
            s.verify("GET", PATH, &f, None, now),
            Err(AuthError::Header("authorization"))
        );
        assert_eq!(
            s.verify("GET", PATH, &f, Some("RIFFLE-HMAC-SHA256 zz"), now),
            Err(AuthError::Header("authorization"))
        );
    }

    #[test]
    fn stale_or_future_times_are_refused() {
        let s = Secret::from_bytes(b"0123456789abcdef");
        let mut f = fields();
        f.time -= MAX_SKEW.as_secs() + 5;
        let auth = s.sign("GET", PATH, &f);
        assert_eq!(
            s.verify("GET", PATH, &f, Some(&auth), SystemTime::now()),
            Err(AuthError::Skew)
        );
        let mut f = fields();
        f.time += MAX_SKEW.as_secs() + 5;
        let auth = s.sign("GET", PATH, &f);
        assert_eq!(
            s.verify("GET", PATH, &f, Some(&auth), SystemTime::now()),
            Err(AuthError::Skew)
        );
    }

    #[test]
    fn answers_are_bound_to_their_request() {
        let s = Secret::from_bytes(b"0123456789abcdef");
        let auth = s.sign("GET", PATH, &fields());
        let mac = s.sign_response(&auth, 7, 10, true);
        assert!(s.verify_response(&auth, 7, 10, true, Some(&mac)).is_ok());
        assert!(s.verify_response(&auth, 7, 10, false, Some(&mac)).is_err());
        assert!(s.verify_response(&auth, 8, 10, true, Some(&mac)).is_err());
        assert!(s.verify_response(&auth, 7, 10, true, None).is_err());
    }

    #[test]
    fn secret_files_are_checked_and_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none");
        let e = Secret::from_file(&missing).unwrap_err().to_string();
        assert!(e.contains("cannot read the peer secret file"), "{e}");
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n  \n").unwrap();
        assert!(matches!(
            Secret::from_file(&empty),
            Err(SecretError::Empty { .. })
        ));
        let short = dir.path().join("short");
        std::fs::write(&short, "abc\n").unwrap();
        let e = Secret::from_file(&short).unwrap_err().to_string();
        assert!(e.contains("too short") && !e.contains("abc"), "{e}");
        let good = dir.path().join("good");
        std::fs::write(&good, "a-long-enough-secret-value\n").unwrap();
        let s = Secret::from_file(&good).unwrap();
        assert_eq!(format!("{s:?}"), "Secret(..)");
        assert_eq!(s.0, b"a-long-enough-secret-value");
    }
}
