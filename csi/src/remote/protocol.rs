//! The wire format between `riffle-csi` and `riffle-mounter`.
//!
//! One connection carries one exchange: the client writes a [`Request`] as
//! one line of JSON, the server answers with one [`Response`] line and
//! closes. Lines are bounded ([`MAX_LINE`]) on both sides, so a confused
//! peer cannot make either side buffer without limit. Requests carry
//! credentials; [`Request`]'s `Debug` names the operation and target only.
//!
//! Compatibility: the mounter is replaced only when an operator deletes its
//! pod, so after the first release a plugin will often talk to an older
//! mounter. The rules from then on (CHANGELOG.md): fields are only ever
//! added (serde ignores fields it does not know); a volume setting is a
//! riffle flag name in [`VolumeSettings::options`], so one the older
//! mounter's `riffle` does not know fails that mount with riffle's own
//! "unexpected argument" message instead of being dropped silently; an
//! operation the mounter does not know is answered with an
//! `InvalidArgument` failure naming it as unreadable; a request an older
//! mounter would misread is sent only to a mounter whose Pong lists a
//! feature naming it (`features`, empty in this first protocol).

use crate::kube::settings::VolumeSettings;
use crate::mounter::{DaemonCredentials, DaemonId, Health, MountErrorKind};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

/// Longest request or response line accepted.
pub const MAX_LINE: u64 = 1 << 20;

/// What the plugin asks of the mounter: the four calls of
/// [`Mounter`](crate::mounter::Mounter), plus a ping.
#[derive(Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
// One message per connection, decoded once: its size does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Request {
    /// Who are you (version, pid): logged by the plugin at start.
    Ping,
    Mount {
        target: PathBuf,
        settings: VolumeSettings,
        /// How the daemon authenticates (no secrets over the socket: paths and names).
        auth: DaemonCredentials,
        pid_file: PathBuf,
        log_file: PathBuf,
        /// The labels of the daemon's metrics (`MountRequest::volume_id`, `::pod`).
        #[serde(default)]
        volume_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pod: Option<String>,
    },
    /// A new daemon for the live mount at `target`, whose FUSE connection
    /// the node's fd store kept when the daemon died (see
    /// [`Mounter::take_over`](crate::mounter::Mounter::take_over)).
    TakeOver {
        target: PathBuf,
        settings: VolumeSettings,
        auth: DaemonCredentials,
        pid_file: PathBuf,
        log_file: PathBuf,
        /// The labels of the daemon's metrics (`MountRequest::volume_id`, `::pod`).
        #[serde(default)]
        volume_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pod: Option<String>,
    },
    Unmount {
        target: PathBuf,
        daemon: Option<DaemonId>,
    },
    Health {
        target: PathBuf,
        daemon: Option<DaemonId>,
    },
    DaemonFromPidFile {
        pid_file: PathBuf,
    },
    /// A read-only bind of the shared daemon's mount at `source` to `target`
    /// (see [`Mounter::bind`](crate::mounter::Mounter::bind)).
    Bind {
        source: PathBuf,
        target: PathBuf,
    },
    /// Detaches the bind at `target`; the daemon behind it keeps running.
    Unbind {
        target: PathBuf,
    },
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Request::Ping => write!(f, "ping"),
            Request::Mount {
                target, settings, ..
            } => write!(f, "mount {} at {}", settings.source_url(), target.display()),
            Request::TakeOver {
                target, settings, ..
            } => write!(
                f,
                "take over {} at {}",
                settings.source_url(),
                target.display()
            ),
            Request::Unmount { target, .. } => write!(f, "unmount {}", target.display()),
            Request::Health { target, .. } => write!(f, "health {}", target.display()),
            Request::DaemonFromPidFile { pid_file } => {
                write!(f, "daemon of pid file {}", pid_file.display())
            }
            Request::Bind { source, target } => {
                write!(f, "bind {} at {}", source.display(), target.display())
            }
            Request::Unbind { target } => write!(f, "unbind {}", target.display()),
        }
    }
}

/// The mounter's answer.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Response {
    Pong {
        version: String,
        pid: u32,
        /// What this mounter can do beyond the first protocol (none yet).
        #[serde(default)]
        features: Vec<String>,
        /// Names this mounter process (its pid and start time): a change
        /// between two pings is a restart.
        instance: Option<String>,
        /// Keepers and daemons that ended under this mounter so far ([`crate::mounter::reaper`]).
        #[serde(default)]
        exited: u64,
    },
    Mounted {
        daemon: Option<DaemonId>,
    },
    Unmounted,
    /// A [`Request::Bind`] is done.
    Bound,
    Health {
        health: Health,
    },
    Daemon {
        daemon: Option<DaemonId>,
    },
    Failed {
        kind: MountErrorKind,
        message: String,
    },
}

/// A framing or encoding failure.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the peer closed the connection without an answer")]
    Closed,
    #[error("a message longer than {MAX_LINE} bytes")]
    TooLong,
    #[error("malformed message: {0}")]
    Json(#[from] serde_json::Error),
}

/// Writes `message` as one line.
pub async fn write_line<T: Serialize>(
    out: &mut (impl AsyncWrite + Unpin),
    message: &T,
) -> Result<(), WireError> {
    let mut bytes = serde_json::to_vec(message)?;
    bytes.push(b'\n');
    out.write_all(&bytes).await?;
    out.flush().await?;
    Ok(())
}

/// Reads one line (at most [`MAX_LINE`] bytes) and decodes it.
pub async fn read_line<T: for<'de> Deserialize<'de>>(
    input: impl AsyncRead + Unpin,
) -> Result<T, WireError> {
    let mut reader = BufReader::new(input.take(MAX_LINE + 1));
    let mut line = Vec::new();
    let n = reader.read_until(b'\n', &mut line).await?;
    if n == 0 {
        return Err(WireError::Closed);
    }
    if line.last() != Some(&b'\n') {
        return Err(if n as u64 > MAX_LINE {
            WireError::TooLong
        } else {
            WireError::Closed
        });
    }
    Ok(serde_json::from_slice(&line)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn settings() -> VolumeSettings {
        let attrs: HashMap<String, String> =
            [("bucket".to_string(), "datasets".to_string())].into();
        VolumeSettings::parse(&attrs, &[]).expect("valid")
    }

    #[tokio::test]
    async fn a_request_round_trips_and_its_debug_hides_credentials() {
        let auth = DaemonCredentials::KeysFile {
            path: "/run/riffle-csi/keys-of-SECRETWIRE".into(),
        };
        let req = Request::Mount {
            target: "/t".into(),
            settings: settings(),
            auth: auth.clone(),
            pid_file: "/s/run/k.pid".into(),
            log_file: "/s/logs/k.log".into(),
            volume_id: "vol-1".into(),
            pod: None,
        };
        let debug = format!("{req:?}");
        assert_eq!(debug, "mount s3://datasets/ at /t");
        let mut buf = Vec::new();
        write_line(&mut buf, &req).await.expect("write");
        let back: Request = read_line(&buf[..]).await.expect("read");
        match back {
            Request::Mount {
                auth: a,
                settings: s,
                ..
            } => {
                assert_eq!(a, auth);
                assert_eq!(s, settings());
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn torn_empty_and_oversized_lines_are_errors() {
        assert!(matches!(
            read_line::<Response>(&b""[..]).await,
            Err(WireError::Closed)
        ));
        assert!(matches!(
            read_line::<Response>(&b"{\"result\":\"unmounted\""[..]).await,
            Err(WireError::Closed)
        ));
        assert!(matches!(
            read_line::<Response>(&b"{\"result\":\"nonsense\"}\n"[..]).await,
            Err(WireError::Json(_))
        ));
        let huge = vec![b'x'; MAX_LINE as usize + 10];
        assert!(matches!(
            read_line::<Response>(&huge[..]).await,
            Err(WireError::TooLong)
        ));
        let ok: Response = read_line(&b"{\"result\":\"unmounted\"}\n"[..])
            .await
            .expect("ok");
        assert!(matches!(ok, Response::Unmounted));
    }
}
