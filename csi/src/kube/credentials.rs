//! S3 credentials from a volume's `nodePublishSecretRef`.
//!
//! The secret's keys are `accessKeyId`, `secretAccessKey` and optionally
//! `sessionToken`; an empty secret means "use the node's own identity".
//! Values are held in [`secrecy::SecretString`] (redacted `Debug`, zeroed on
//! drop) and leave this module only as environment variables of the
//! `riffle mount` child ([`Credentials::env`]), as the JSON of the root-only
//! secrets file ([`Credentials::to_json`]), and never in a message:
//! [`Credentials::scrub`] removes them from any text that is about to be
//! logged or returned (defence in depth against a child that echoes them).

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

const ACCESS_KEY_ID: &str = "accessKeyId";
const SECRET_ACCESS_KEY: &str = "secretAccessKey";
const SESSION_TOKEN: &str = "sessionToken";

/// Why a secret was refused. Messages name keys, never values.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CredentialsError {
    #[error("unknown key(s) in the nodePublishSecretRef secret: {0} (supported: accessKeyId, secretAccessKey, sessionToken)")]
    UnknownKeys(String),
    #[error("the nodePublishSecretRef secret must have both accessKeyId and secretAccessKey (missing {0})")]
    Incomplete(&'static str),
    #[error("the nodePublishSecretRef secret has an empty {0}")]
    Empty(&'static str),
}

/// Static S3 credentials.
#[derive(Debug, Clone)]
pub struct Credentials {
    access_key_id: SecretString,
    secret_access_key: SecretString,
    session_token: Option<SecretString>,
}

/// On-disk form, used only by [`Credentials::to_json`]/[`Credentials::from_json`].
#[derive(Serialize, Deserialize)]
struct Stored {
    #[serde(rename = "accessKeyId")]
    access_key_id: String,
    #[serde(rename = "secretAccessKey")]
    secret_access_key: String,
    #[serde(
        rename = "sessionToken",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    session_token: Option<String>,
}

impl Credentials {
    /// Parses the CSI `secrets` map; `Ok(None)` when it is empty.
    pub fn from_secrets(
        secrets: &HashMap<String, String>,
    ) -> Result<Option<Self>, CredentialsError> {
        if secrets.is_empty() {
            return Ok(None);
        }
        let mut unknown: Vec<&str> = secrets
            .keys()
            .map(String::as_str)
            .filter(|k| ![ACCESS_KEY_ID, SECRET_ACCESS_KEY, SESSION_TOKEN].contains(k))
            .collect();
        if !unknown.is_empty() {
            unknown.sort_unstable();
            return Err(CredentialsError::UnknownKeys(unknown.join(", ")));
        }
        let get = |key: &'static str| -> Result<Option<SecretString>, CredentialsError> {
            match secrets.get(key) {
                None => Ok(None),
                Some(v) if v.trim().is_empty() => Err(CredentialsError::Empty(key)),
                Some(v) => Ok(Some(SecretString::from(v.trim().to_string()))),
            }
        };
        let access_key_id =
            get(ACCESS_KEY_ID)?.ok_or(CredentialsError::Incomplete(ACCESS_KEY_ID))?;
        let secret_access_key =
            get(SECRET_ACCESS_KEY)?.ok_or(CredentialsError::Incomplete(SECRET_ACCESS_KEY))?;
        let session_token = get(SESSION_TOKEN)?;
        Ok(Some(Self {
            access_key_id,
            secret_access_key,
            session_token,
        }))
    }

    /// The environment of a child that should use these credentials:
    /// `(name, Some(value))` to set, `(name, None)` to remove (a session
    /// token inherited from the plugin's own environment must not be mixed
    /// with these keys).
    pub fn env(&self) -> Vec<(&'static str, Option<&str>)> {
        vec![
            (
                "AWS_ACCESS_KEY_ID",
                Some(self.access_key_id.expose_secret()),
            ),
            (
                "AWS_SECRET_ACCESS_KEY",
                Some(self.secret_access_key.expose_secret()),
            ),
            (
                "AWS_SESSION_TOKEN",
                self.session_token.as_ref().map(|t| t.expose_secret()),
            ),
        ]
    }

    /// Replaces every occurrence of a secret value in `text` by `<redacted>`.
    pub fn scrub(&self, text: &str) -> String {
        let mut out = text.to_string();
        let mut values = vec![
            self.access_key_id.expose_secret(),
            self.secret_access_key.expose_secret(),
        ];
        if let Some(t) = &self.session_token {
            values.push(t.expose_secret());
        }
        for v in values {
            if !v.is_empty() {
                out = out.replace(v, "<redacted>");
            }
        }
        out
    }

    /// JSON for the root-only secrets file.
    pub fn to_json(&self) -> Vec<u8> {
        let stored = Stored {
            access_key_id: self.access_key_id.expose_secret().to_string(),
            secret_access_key: self.secret_access_key.expose_secret().to_string(),
            session_token: self
                .session_token
                .as_ref()
                .map(|t| t.expose_secret().to_string()),
        };
        // Serializing three strings cannot fail.
        serde_json::to_vec(&stored).unwrap_or_default()
    }

    /// Reads the JSON written by [`Credentials::to_json`].
    pub fn from_json(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        let stored: Stored = serde_json::from_slice(bytes)?;
        Ok(Self {
            access_key_id: stored.access_key_id.into(),
            secret_access_key: stored.secret_access_key.into(),
            session_token: stored.session_token.map(Into::into),
        })
    }
}

/// Scrubs `text` when credentials are present.
pub fn scrub(credentials: Option<&Credentials>, text: &str) -> String {
    match credentials {
        Some(c) => c.scrub(text),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn empty_secret_means_node_identity() {
        assert!(Credentials::from_secrets(&HashMap::new())
            .expect("ok")
            .is_none());
    }

    #[test]
    fn parse_env_and_roundtrip() {
        let c = Credentials::from_secrets(&map(&[
            ("accessKeyId", "AKIDEXAMPLE"),
            ("secretAccessKey", "s3cr3tVALUE"),
        ]))
        .expect("ok")
        .expect("some");
        let env = c.env();
        assert!(env.contains(&("AWS_ACCESS_KEY_ID", Some("AKIDEXAMPLE"))));
        assert!(env.contains(&("AWS_SESSION_TOKEN", None)));
        let back = Credentials::from_json(&c.to_json()).expect("json");
        assert_eq!(back.env(), env);
        let dbg = format!("{c:?}");
        assert!(
            !dbg.contains("s3cr3tVALUE") && !dbg.contains("AKIDEXAMPLE"),
            "{dbg}"
        );
    }

    #[test]
    fn errors_name_keys_not_values() {
        let err = Credentials::from_secrets(&map(&[("password", "hunter2")])).unwrap_err();
        assert!(err.to_string().contains("password"));
        assert!(!err.to_string().contains("hunter2"));
        let err = Credentials::from_secrets(&map(&[("accessKeyId", "AKID")])).unwrap_err();
        assert_eq!(err, CredentialsError::Incomplete("secretAccessKey"));
        assert!(!err.to_string().contains("AKID\""));
    }

    #[test]
    fn scrub_removes_values() {
        let c = Credentials::from_secrets(&map(&[
            ("accessKeyId", "AKIDEXAMPLE"),
            ("secretAccessKey", "s3cr3tVALUE"),
            ("sessionToken", "TOKENVALUE"),
        ]))
        .expect("ok")
        .expect("some");
        let text = c.scrub("denied for AKIDEXAMPLE with s3cr3tVALUE/TOKENVALUE");
        assert_eq!(text, "denied for <redacted> with <redacted>/<redacted>");
    }
}
