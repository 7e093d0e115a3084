//! The CSI v1 types and Identity/Node service stubs generated from
//! `proto/csi.proto` by build.rs.
//!
//! `NodePublishVolumeRequest` and `NodeStageVolumeRequest` carry credentials in `secrets`; their `Debug`
//! is written here by hand (code generation is told to skip it) and prints
//! only the secret *keys*, never values, so that no log line built with
//! `{:?}` can leak them. The same goes for the service account tokens
//! kubelet puts in `volume_context` (`csi.storage.k8s.io/serviceAccount.tokens`).

#![allow(clippy::all, missing_docs)]

tonic::include_proto!("csi.v1");

impl std::fmt::Debug for NodePublishVolumeRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut secret_keys: Vec<&String> = self.secrets.keys().collect();
        secret_keys.sort();
        let context: std::collections::BTreeMap<&String, &str> = self
            .volume_context
            .iter()
            .map(|(k, v)| {
                if k == crate::kube::access::TOKENS_KEY {
                    (k, "<redacted>")
                } else {
                    (k, v.as_str())
                }
            })
            .collect();
        f.debug_struct("NodePublishVolumeRequest")
            .field("volume_id", &self.volume_id)
            .field("publish_context", &self.publish_context)
            .field("staging_target_path", &self.staging_target_path)
            .field("target_path", &self.target_path)
            .field("volume_capability", &self.volume_capability)
            .field("readonly", &self.readonly)
            .field("secrets", &format_args!("<redacted: keys {secret_keys:?}>"))
            .field("volume_context", &context)
            .finish()
    }
}

impl std::fmt::Debug for NodeStageVolumeRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut secret_keys: Vec<&String> = self.secrets.keys().collect();
        secret_keys.sort();
        f.debug_struct("NodeStageVolumeRequest")
            .field("volume_id", &self.volume_id)
            .field("publish_context", &self.publish_context)
            .field("staging_target_path", &self.staging_target_path)
            .field("volume_capability", &self.volume_capability)
            .field("secrets", &format_args!("<redacted: keys {secret_keys:?}>"))
            .field("volume_context", &self.volume_context)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_redacts_secret_values() {
        let mut req = NodePublishVolumeRequest {
            volume_id: "v".into(),
            ..Default::default()
        };
        req.secrets
            .insert("secretAccessKey".into(), "TOPSECRETVALUE".into());
        req.volume_context.insert(
            crate::kube::access::TOKENS_KEY.into(),
            r#"{"sts.amazonaws.com":{"token":"JWTSECRETTOKEN"}}"#.into(),
        );
        req.volume_context
            .insert("bucket".into(), "datasets".into());
        let text = format!("{req:?}");
        assert!(!text.contains("TOPSECRETVALUE"), "{text}");
        assert!(text.contains("secretAccessKey"), "{text}");
        assert!(!text.contains("JWTSECRETTOKEN"), "{text}");
        assert!(text.contains("datasets"), "{text}");
    }
}
