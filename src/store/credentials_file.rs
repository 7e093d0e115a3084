//! Static S3 keys read from a file that may change while the daemon runs.
//!
//! The CSI node plugin gives a volume's daemon the keys of the volume's Secret (and a
//! `sessionToken` that an operator rotates) through a file on a tmpfs, named by
//! `RIFFLE_CREDENTIALS_FILE`, instead of the environment, which cannot change once the daemon
//! runs: when kubelet publishes the volume again with new values, the plugin replaces the file
//! (write + rename) and the daemon takes the new keys without a remount.
//!
//! The file is JSON: `{"accessKeyId": "...", "secretAccessKey": "...", "sessionToken": "..."}`
//! (`sessionToken` optional). [`FileCredentials`] reads it every time the SDK asks for
//! credentials, and gives each answer an expiry of [`REREAD_AFTER`], so the SDK's credential
//! cache asks again (re-reads the file) about once a minute; a file read is a few microseconds.
//! Errors name the file, never its content (serde's messages can quote it).

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use aws_credential_types::provider::{self, error::CredentialsError, future};
use aws_sdk_s3::config::Credentials;

/// The environment variable that names the keys file.
pub const ENV: &str = "RIFFLE_CREDENTIALS_FILE";

/// How long one reading of the file is used before it is read again.
pub const REREAD_AFTER: Duration = Duration::from_secs(60);

/// The keys file, read on every refresh. See the module documentation.
#[derive(Debug, Clone)]
pub struct FileCredentials {
    path: PathBuf,
}

#[derive(serde::Deserialize)]
struct Stored {
    #[serde(rename = "accessKeyId")]
    access_key_id: String,
    #[serde(rename = "secretAccessKey")]
    secret_access_key: String,
    #[serde(rename = "sessionToken", default)]
    session_token: Option<String>,
}

impl FileCredentials {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// The provider named by `RIFFLE_CREDENTIALS_FILE`, if it is set.
    pub fn from_env() -> Option<Self> {
        std::env::var_os(ENV)
            .filter(|p| !p.is_empty())
            .map(Self::new)
    }

    /// Reads the file now.
    pub fn load(&self) -> provider::Result {
        let bytes = std::fs::read(&self.path).map_err(|e| {
            CredentialsError::provider_error(format!(
                "cannot read the credentials file {} ({ENV}): {e}",
                self.path.display()
            ))
        })?;
        let stored: Stored = serde_json::from_slice(&bytes).map_err(|_| {
            CredentialsError::invalid_configuration(format!(
                "the credentials file {} ({ENV}) is not JSON with accessKeyId and secretAccessKey",
                self.path.display()
            ))
        })?;
        if stored.access_key_id.trim().is_empty() || stored.secret_access_key.trim().is_empty() {
            return Err(CredentialsError::invalid_configuration(format!(
                "the credentials file {} ({ENV}) has an empty accessKeyId or secretAccessKey",
                self.path.display()
            )));
        }
        Ok(Credentials::new(
            stored.access_key_id.trim(),
            stored.secret_access_key.trim(),
            stored
                .session_token
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty()),
            Some(SystemTime::now() + REREAD_AFTER),
            "RiffleCredentialsFile",
        ))
    }
}

impl provider::ProvideCredentials for FileCredentials {
    fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        future::ProvideCredentials::ready(self.load())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_credential_types::provider::ProvideCredentials;

    #[tokio::test]
    async fn each_refresh_reads_the_current_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("keys.json");
        std::fs::write(
            &path,
            br#"{"accessKeyId":"AKIDONE","secretAccessKey":"SECRETONE"}"#,
        )
        .expect("write");
        let provider = FileCredentials::new(&path);
        let first = provider.provide_credentials().await.expect("first");
        assert_eq!(first.access_key_id(), "AKIDONE");
        assert_eq!(first.session_token(), None);
        let expiry = first.expiry().expect("an expiry, so the SDK asks again");
        assert!(expiry <= SystemTime::now() + REREAD_AFTER);

        // Replaced the way the CSI plugin does it: a new file renamed over the old one.
        let tmp = dir.path().join("keys.json.tmp");
        std::fs::write(
            &tmp,
            br#"{"accessKeyId":"AKIDTWO","secretAccessKey":"SECRETTWO","sessionToken":"TOKENTWO"}"#,
        )
        .expect("write");
        std::fs::rename(&tmp, &path).expect("rename");
        let second = provider.provide_credentials().await.expect("second");
        assert_eq!(second.access_key_id(), "AKIDTWO");
        assert_eq!(second.secret_access_key(), "SECRETTWO");
        assert_eq!(second.session_token(), Some("TOKENTWO"));
    }

    #[tokio::test]
    async fn errors_name_the_file_not_its_content() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("keys.json");
        let missing = FileCredentials::new(&path)
            .provide_credentials()
            .await
            .expect_err("no file");
        assert!(format!("{missing:?}").contains("keys.json"), "{missing:?}");
        std::fs::write(
            &path,
            br#"{"accessKeyId":"AKIDLEAK","secretAccessKey":SECRETLEAK"#,
        )
        .expect("write");
        let bad = FileCredentials::new(&path)
            .provide_credentials()
            .await
            .expect_err("malformed");
        let text = format!("{bad:?} {bad}");
        assert!(
            !text.contains("SECRETLEAK") && !text.contains("AKIDLEAK"),
            "{text}"
        );
        std::fs::write(&path, br#"{"accessKeyId":" ","secretAccessKey":"x"}"#).expect("write");
        assert!(FileCredentials::new(&path).load().is_err());
    }
}
