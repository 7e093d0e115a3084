//! `NodeGetVolumeStats`: a published volume's usage and condition, as kubelet shows them
//! (`kubelet_volume_stats_*` metrics, `kubectl describe`).
//!
//! The numbers come from the volume's own daemon, through the file every rifflefs mount has at
//! its root, `.riffle-stats` (the JSON of `riffle stats --json`): the plugin sees the target
//! path (kubelet's directory, with mount propagation) but not the daemon's control socket,
//! which lives in the mounter's container. Its `volume` section becomes:
//!
//! - bytes: `total` = the listed size of the dataset (the files the mount has listed so far:
//!   all of them once a reader walked the tree), `used` = the bytes of those files the node's
//!   cache holds whole, `available` = `total - used` (what a reader would still fetch from the
//!   store). A read-only dataset has no free space; these answer "how big, how much is local".
//! - inodes: `total` = `used` = the files and directories listed, `available` = 0.
//!
//! Errors, per the CSI spec: an empty volume id or path is INVALID_ARGUMENT; a path this plugin
//! has not published that volume at is NOT_FOUND. A published volume whose mount is dead
//! (its daemon gone: ENOTCONN), gone, replaced, or not answering within [`READ_LIMIT`] is
//! answered with `volume_condition.abnormal` and the reason, and no usage (the supervisor
//! remounts it). A `.riffle-stats` that is not the daemon's document (an object of that name in
//! the bucket wins over it) gives a normal condition that says so, and no usage.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::Status;

use crate::grpc::proto::volume_usage::Unit;
use crate::grpc::proto::{
    NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse, VolumeCondition, VolumeUsage,
};
use crate::mounter::Health;
use crate::volumes::VolumeManager;

/// The stats file at a rifflefs mount's root.
pub const STATS_FILE: &str = ".riffle-stats";

/// How long reading the stats file may take before the mount counts as not answering.
pub const READ_LIMIT: Duration = Duration::from_secs(10);

/// Answers one NodeGetVolumeStats (see the module documentation).
pub async fn volume_stats(
    manager: &VolumeManager,
    req: &NodeGetVolumeStatsRequest,
) -> Result<NodeGetVolumeStatsResponse, Status> {
    if req.volume_id.is_empty() {
        return Err(Status::invalid_argument("volume_id is required"));
    }
    if req.volume_path.is_empty() {
        return Err(Status::invalid_argument("volume_path is required"));
    }
    let path = PathBuf::from(&req.volume_path);
    let not_found = || {
        Status::not_found(format!(
            "volume {:?} is not published at {}",
            req.volume_id, req.volume_path
        ))
    };
    let record = manager
        .store()
        .load(&path)
        .map_err(|e| Status::internal(e.to_string()))?
        .filter(|r| r.volume_id == req.volume_id)
        .ok_or_else(not_found)?;
    match manager.health(&path, record.daemon).await {
        Ok(Health::Live) => {}
        // The mounter cannot be asked: the mount itself can (reading it says if it is dead).
        Err(e) => tracing::debug!(error = %e, "NodeGetVolumeStats without the mounter's health"),
        Ok(Health::NotMounted) => {
            return Ok(abnormal(format!(
                "nothing is mounted at {}; the plugin mounts it again",
                path.display()
            )))
        }
        Ok(Health::Broken(reason)) => {
            return Ok(abnormal(format!(
                "the mount is dead ({reason}); the plugin mounts it again"
            )))
        }
        Ok(Health::Foreign(fs)) => {
            return Ok(abnormal(format!(
                "a {fs} mount not managed by riffle-csi is at {}",
                path.display()
            )))
        }
    }
    Ok(match read_stats(&path).await {
        Ok(text) => from_document(&text),
        Err(e) => abnormal(e),
    })
}

/// Reads `path/.riffle-stats` on a blocking thread, at most [`READ_LIMIT`]; the error is the
/// reason the volume is abnormal. (A mount that never answers keeps that thread; the answer
/// is given anyway.)
async fn read_stats(path: &Path) -> Result<Vec<u8>, String> {
    let file = path.join(STATS_FILE);
    let read = tokio::task::spawn_blocking({
        let file = file.clone();
        move || std::fs::read(file)
    });
    match tokio::time::timeout(READ_LIMIT, read).await {
        Err(_) => Err(format!(
            "the mount did not answer within {} s (reading {})",
            READ_LIMIT.as_secs(),
            file.display()
        )),
        Ok(Err(e)) => Err(format!("cannot read {}: {e}", file.display())),
        Ok(Ok(Err(e))) if e.raw_os_error() == Some(libc::ENOTCONN) => Err(format!(
            "the mount is dead (its daemon is gone: {e}); the plugin mounts it again"
        )),
        Ok(Ok(Err(e))) if e.kind() == io::ErrorKind::NotFound => Err(format!(
            "{} is missing: the daemon is not a rifflefs mount that has it (an older riffle?)",
            file.display()
        )),
        Ok(Ok(Err(e))) => Err(format!("cannot read {}: {e}", file.display())),
        Ok(Ok(Ok(text))) => Ok(text),
    }
}

/// The answer for a stats document: usage from its `volume` section, or a normal condition
/// that says why there is none.
pub fn from_document(text: &[u8]) -> NodeGetVolumeStatsResponse {
    let usage = serde_json::from_slice::<serde_json::Value>(text)
        .ok()
        .and_then(|v| usage(&v));
    match usage {
        Some(usage) => NodeGetVolumeStatsResponse {
            usage,
            volume_condition: Some(VolumeCondition {
                abnormal: false,
                message: "the mount answers".into(),
            }),
        },
        None => NodeGetVolumeStatsResponse {
            usage: Vec::new(),
            volume_condition: Some(VolumeCondition {
                abnormal: false,
                message: format!(
                    "no usage: {STATS_FILE} at the volume root is not the daemon's statistics (an object of that name in the bucket hides them)"
                ),
            }),
        },
    }
}

/// Bytes and inodes from the `volume` section of a stats document.
pub fn usage(stats: &serde_json::Value) -> Option<Vec<VolumeUsage>> {
    let volume = stats.get("volume")?;
    let field = |name: &str| volume.get(name)?.as_u64();
    let total = field("listed_bytes")?;
    let cached = field("cached_bytes")?.min(total);
    let entries = field("listed_entries")?;
    let signed = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    Some(vec![
        VolumeUsage {
            available: signed(total - cached),
            total: signed(total),
            used: signed(cached),
            unit: Unit::Bytes as i32,
        },
        VolumeUsage {
            available: 0,
            total: signed(entries),
            used: signed(entries),
            unit: Unit::Inodes as i32,
        },
    ])
}

fn abnormal(message: String) -> NodeGetVolumeStatsResponse {
    NodeGetVolumeStatsResponse {
        usage: Vec::new(),
        volume_condition: Some(VolumeCondition {
            abnormal: true,
            message,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_comes_from_the_volume_section() {
        let doc = br#"{"volume": {"listed_bytes": 1000, "cached_bytes": 300, "listed_entries": 7,
            "listed_files": 5, "listed_dirs": 2}, "cache": null}"#;
        let r = from_document(doc);
        assert_eq!(r.usage.len(), 2);
        let bytes = &r.usage[0];
        assert_eq!((bytes.total, bytes.used, bytes.available), (1000, 300, 700));
        assert_eq!(bytes.unit, Unit::Bytes as i32);
        let inodes = &r.usage[1];
        assert_eq!((inodes.total, inodes.used, inodes.available), (7, 7, 0));
        assert_eq!(inodes.unit, Unit::Inodes as i32);
        assert_eq!(r.volume_condition.map(|c| c.abnormal), Some(false));
    }

    #[test]
    fn a_document_that_is_not_the_daemons_gives_no_usage() {
        for doc in [
            &b"image bytes"[..],
            br#"{"something": 1}"#,
            br#"{"volume": {}}"#,
        ] {
            let r = from_document(doc);
            assert!(r.usage.is_empty());
            let c = r.volume_condition.expect("condition");
            assert!(!c.abnormal);
            assert!(c.message.contains("hides"), "{}", c.message);
        }
    }

    #[test]
    fn cached_bytes_never_exceed_the_total() {
        let v = serde_json::json!({"volume": {"listed_bytes": 10, "cached_bytes": 30, "listed_entries": 1}});
        let u = usage(&v).expect("usage");
        assert_eq!((u[0].total, u[0].used, u[0].available), (10, 10, 0));
    }
}
