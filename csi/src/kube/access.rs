//! Whose identity a volume's daemon reads the bucket with.
//!
//! Decided at every NodePublishVolume from the request alone (no API-server
//! access), in this order:
//! - `noSignRequest`: unsigned requests ([`VolumeAccess::Anonymous`]); a
//!   Secret or a role as well is refused;
//! - a `nodePublishSecretRef` Secret: its keys ([`VolumeAccess::Secret`]);
//! - the volume attribute `roleArn`: the pod's own identity. The CSIDriver's
//!   `tokenRequests` make kubelet mint a token of the pod's service account
//!   for the configured audience (default `sts.amazonaws.com`) and pass it in
//!   the volume context (`csi.storage.k8s.io/serviceAccount.tokens`, JSON:
//!   audience -> {token, expirationTimestamp}); the daemon assumes the role
//!   with it (`AssumeRoleWithWebIdentity`, as EKS IRSA does). The role's
//!   trust policy decides which service accounts may assume it, so naming a
//!   role in a pod spec grants nothing by itself;
//! - none of these: the node's own credentials (the mounter's environment,
//!   the instance role), only when the driver allows it
//!   (`--allow-node-credentials`, off by default): otherwise any pod author
//!   could read whatever the node may read with an inline volume.
//!
//! The pod's service-account annotation (`eks.amazonaws.com/role-arn`) does
//! not reach a CSI plugin: kubelet passes the service account's *name*, not
//! its annotations. Mountpoint's CSI driver reads the annotation from the API
//! server; riffle-csi has no API access, so the role is named by `roleArn`.
//!
//! Secret values (keys, tokens) are kept in [`SecretString`]s and leave this
//! module only as files on the plugin's tmpfs ([`crate::node_state::secrets`]); every
//! message that could echo one goes through [`VolumeAccess::scrub`].

use crate::kube::credentials::Credentials;
use crate::kube::settings::VolumeSettings;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use std::collections::HashMap;

/// The volume-context key kubelet fills from the CSIDriver's tokenRequests.
pub const TOKENS_KEY: &str = "csi.storage.k8s.io/serviceAccount.tokens";

/// The token audience the plugin uses unless told otherwise; the same as the
/// CSIDriver's `tokenRequests` in deploy/kubernetes.
pub const DEFAULT_AUDIENCE: &str = "sts.amazonaws.com";

/// The plugin flag that allows the node's own credentials.
pub const NODE_CREDENTIALS_FLAG: &str = "--allow-node-credentials";

/// The driver-level rules a publish is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessPolicy {
    /// Whether a volume with neither a Secret nor a role may use the node's
    /// own credentials.
    pub allow_node_credentials: bool,
    /// The audience of the service-account token used with `roleArn`.
    pub token_audience: String,
}

impl Default for AccessPolicy {
    fn default() -> Self {
        Self {
            allow_node_credentials: false,
            token_audience: DEFAULT_AUDIENCE.to_string(),
        }
    }
}

/// Why a publish has no usable identity. Messages never contain a token or
/// a key.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AccessError {
    #[error("roleArn is set and a nodePublishSecretRef secret was given; use one or the other")]
    RoleAndSecret,
    #[error("noSignRequest is set but {0} was given; use one or the other")]
    AnonymousAndCredentials(&'static str),
    #[error("the volume context's {TOKENS_KEY} is not the JSON kubelet sends (audience -> {{token, expirationTimestamp}})")]
    MalformedTokens,
    #[error("roleArn is set but kubelet sent no service account token for audience {audience:?} (received: {received}); the CSIDriver riffle.csi.rifflefs.io needs tokenRequests with that audience and requiresRepublish: true (deploy/kubernetes/csidriver.yaml), and the plugin's --token-audience must match")]
    NoToken { audience: String, received: String },
    #[error("this volume has no credentials of its own (no nodePublishSecretRef secret, no roleArn, no noSignRequest) and the driver does not allow the node's credentials: give the volume a secret or a roleArn, or start riffle-csi with {NODE_CREDENTIALS_FLAG} (RIFFLE_CSI_ALLOW_NODE_CREDENTIALS=true)")]
    NodeCredentialsNotAllowed,
}

impl AccessError {
    /// Whether the request is wrong (InvalidArgument) rather than the
    /// driver's setup or policy (FailedPrecondition).
    pub fn is_invalid_argument(&self) -> bool {
        matches!(
            self,
            Self::RoleAndSecret | Self::AnonymousAndCredentials(_) | Self::MalformedTokens
        )
    }
}

/// How one volume's daemon authenticates.
#[derive(Debug, Clone)]
pub enum VolumeAccess {
    /// Unsigned requests (`noSignRequest`).
    Anonymous,
    /// The keys of the volume's Secret.
    Secret(Credentials),
    /// A role assumed with the pod's service account token.
    WebIdentity {
        role_arn: String,
        token: SecretString,
        session_name: String,
    },
    /// The node's own credentials (allowed by the driver).
    Node,
}

#[derive(Deserialize)]
struct ServiceAccountToken {
    token: String,
}

impl VolumeAccess {
    /// Decides the identity of a publish; see the module documentation.
    pub fn resolve(
        settings: &VolumeSettings,
        credentials: Option<Credentials>,
        volume_context: &HashMap<String, String>,
        policy: &AccessPolicy,
    ) -> Result<Self, AccessError> {
        if settings.anonymous() {
            return match (&credentials, &settings.role_arn) {
                (Some(_), _) => Err(AccessError::AnonymousAndCredentials(
                    "a nodePublishSecretRef secret",
                )),
                (None, Some(_)) => Err(AccessError::AnonymousAndCredentials("roleArn")),
                (None, None) => Ok(Self::Anonymous),
            };
        }
        match (credentials, &settings.role_arn) {
            (Some(_), Some(_)) => Err(AccessError::RoleAndSecret),
            (Some(c), None) => Ok(Self::Secret(c)),
            (None, Some(role_arn)) => {
                let token = pod_token(volume_context, &policy.token_audience)?;
                Ok(Self::WebIdentity {
                    role_arn: role_arn.clone(),
                    token,
                    session_name: session_name(volume_context),
                })
            }
            (None, None) if policy.allow_node_credentials => Ok(Self::Node),
            (None, None) => Err(AccessError::NodeCredentialsNotAllowed),
        }
    }

    /// What the plugin's log may say about the identity (no values).
    pub fn describe(&self) -> &'static str {
        match self {
            Self::Anonymous => "anonymous",
            Self::Secret(_) => "secret",
            Self::WebIdentity { .. } => "pod service account (web identity)",
            Self::Node => "node identity",
        }
    }

    /// Replaces every secret value of this identity in `text` by
    /// `<redacted>`.
    pub fn scrub(&self, text: &str) -> String {
        match self {
            Self::Secret(c) => c.scrub(text),
            Self::WebIdentity { token, .. } if !token.expose_secret().is_empty() => {
                text.replace(token.expose_secret(), "<redacted>")
            }
            _ => text.to_string(),
        }
    }
}

/// The token for `audience` from the volume context.
fn pod_token(
    volume_context: &HashMap<String, String>,
    audience: &str,
) -> Result<SecretString, AccessError> {
    let no_token = |received: String| AccessError::NoToken {
        audience: audience.to_string(),
        received,
    };
    let Some(raw) = volume_context.get(TOKENS_KEY) else {
        return Err(no_token("no tokens".to_string()));
    };
    // serde's message may quote the text: never pass it on.
    let mut tokens: HashMap<String, ServiceAccountToken> =
        serde_json::from_str(raw).map_err(|_| AccessError::MalformedTokens)?;
    match tokens.remove(audience) {
        Some(t) if !t.token.trim().is_empty() => Ok(SecretString::from(t.token.trim().to_string())),
        _ => {
            let mut audiences: Vec<&String> = tokens.keys().collect();
            audiences.sort();
            let received = if audiences.is_empty() {
                "no tokens".to_string()
            } else {
                format!("tokens for {audiences:?}")
            };
            Err(no_token(received))
        }
    }
}

/// `AWS_ROLE_SESSION_NAME` (what CloudTrail or RGW's ops log shows):
/// `riffle-NAMESPACE-POD` from the pod info kubelet passes, reduced to the
/// characters STS allows and at most 64 of them.
fn session_name(volume_context: &HashMap<String, String>) -> String {
    let get = |k: &str| {
        volume_context
            .get(&format!("csi.storage.k8s.io/{k}"))
            .cloned()
            .unwrap_or_default()
    };
    let mut name = String::from("riffle");
    for part in [get("pod.namespace"), get("pod.name")] {
        if !part.is_empty() {
            name.push('-');
            name.push_str(&part);
        }
    }
    let clean: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "+=,.@_-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    clean
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

    fn settings(pairs: &[(&str, &str)]) -> VolumeSettings {
        VolumeSettings::parse(&map(pairs), &[]).expect("valid")
    }

    fn creds() -> Credentials {
        Credentials::from_secrets(&map(&[
            ("accessKeyId", "AKIDACCESS"),
            ("secretAccessKey", "SECRETACCESS"),
        ]))
        .expect("ok")
        .expect("some")
    }

    const ROLE: &str = "arn:aws:iam::123456789012:role/trainer";

    fn tokens(audience: &str, token: &str) -> String {
        format!(
            r#"{{"{audience}":{{"token":"{token}","expirationTimestamp":"2030-01-01T00:00:00Z"}}}}"#
        )
    }

    #[test]
    fn the_pods_token_and_role_make_a_web_identity() {
        let s = settings(&[("bucket", "abc"), ("roleArn", ROLE)]);
        let ctx = map(&[
            (TOKENS_KEY, &tokens("sts.amazonaws.com", "JWT.PAYLOAD.SIG")),
            ("csi.storage.k8s.io/pod.namespace", "ml"),
            ("csi.storage.k8s.io/pod.name", "trainer-0 (x)"),
        ]);
        match VolumeAccess::resolve(&s, None, &ctx, &AccessPolicy::default()).expect("ok") {
            VolumeAccess::WebIdentity {
                role_arn,
                token,
                session_name,
            } => {
                assert_eq!(role_arn, ROLE);
                assert_eq!(token.expose_secret(), "JWT.PAYLOAD.SIG");
                assert_eq!(session_name, "riffle-ml-trainer-0__x_");
            }
            other => panic!("{other:?}"),
        }
        let access = VolumeAccess::resolve(&s, None, &ctx, &AccessPolicy::default()).expect("ok");
        assert_eq!(
            access.scrub("token JWT.PAYLOAD.SIG refused"),
            "token <redacted> refused"
        );
    }

    #[test]
    fn a_role_needs_a_token_of_the_configured_audience() {
        let s = settings(&[("bucket", "abc"), ("roleArn", ROLE)]);
        let err = VolumeAccess::resolve(&s, None, &HashMap::new(), &AccessPolicy::default())
            .expect_err("no token");
        assert!(matches!(err, AccessError::NoToken { .. }), "{err}");
        let ctx = map(&[(TOKENS_KEY, &tokens("other", "JWTVALUE"))]);
        let err = VolumeAccess::resolve(&s, None, &ctx, &AccessPolicy::default())
            .expect_err("wrong audience");
        let msg = err.to_string();
        assert!(
            msg.contains("\"other\"") && msg.contains("sts.amazonaws.com"),
            "{msg}"
        );
        assert!(!msg.contains("JWTVALUE"), "{msg}");
        let policy = AccessPolicy {
            token_audience: "other".into(),
            ..Default::default()
        };
        assert!(VolumeAccess::resolve(&s, None, &ctx, &policy).is_ok());
        let bad = map(&[(TOKENS_KEY, "{\"sts.amazonaws.com\": JWTLEAK")]);
        let err =
            VolumeAccess::resolve(&s, None, &bad, &AccessPolicy::default()).expect_err("malformed");
        assert_eq!(err, AccessError::MalformedTokens);
        assert!(!err.to_string().contains("JWTLEAK"));
    }

    #[test]
    fn node_credentials_only_when_allowed() {
        let s = settings(&[("bucket", "abc"), ("csi.storage.k8s.io/ephemeral", "true")]);
        let err = VolumeAccess::resolve(&s, None, &HashMap::new(), &AccessPolicy::default())
            .expect_err("refused");
        assert_eq!(err, AccessError::NodeCredentialsNotAllowed);
        assert!(err.to_string().contains(NODE_CREDENTIALS_FLAG));
        assert!(!err.is_invalid_argument());
        let allow = AccessPolicy {
            allow_node_credentials: true,
            ..Default::default()
        };
        assert!(matches!(
            VolumeAccess::resolve(&s, None, &HashMap::new(), &allow),
            Ok(VolumeAccess::Node)
        ));
        // A token alone (kubelet sends one to every volume) is not an identity.
        let ctx = map(&[(TOKENS_KEY, &tokens("sts.amazonaws.com", "JWT"))]);
        assert_eq!(
            VolumeAccess::resolve(&s, None, &ctx, &AccessPolicy::default()).unwrap_err(),
            AccessError::NodeCredentialsNotAllowed
        );
        // Anonymous and secret volumes need no permission.
        let anon = settings(&[("bucket", "abc"), ("noSignRequest", "true")]);
        assert!(matches!(
            VolumeAccess::resolve(&anon, None, &HashMap::new(), &AccessPolicy::default()),
            Ok(VolumeAccess::Anonymous)
        ));
        assert!(matches!(
            VolumeAccess::resolve(&s, Some(creds()), &HashMap::new(), &AccessPolicy::default()),
            Ok(VolumeAccess::Secret(_))
        ));
    }

    #[test]
    fn conflicting_identities_are_refused() {
        let role = settings(&[("bucket", "abc"), ("roleArn", ROLE)]);
        let err = VolumeAccess::resolve(
            &role,
            Some(creds()),
            &HashMap::new(),
            &AccessPolicy::default(),
        )
        .unwrap_err();
        assert_eq!(err, AccessError::RoleAndSecret);
        assert!(err.is_invalid_argument());
        let anon_role = settings(&[
            ("bucket", "abc"),
            ("noSignRequest", "true"),
            ("roleArn", ROLE),
        ]);
        assert!(
            VolumeAccess::resolve(&anon_role, None, &HashMap::new(), &AccessPolicy::default())
                .unwrap_err()
                .is_invalid_argument()
        );
        let anon = settings(&[("bucket", "abc"), ("noSignRequest", "true")]);
        assert!(VolumeAccess::resolve(
            &anon,
            Some(creds()),
            &HashMap::new(),
            &AccessPolicy::default()
        )
        .unwrap_err()
        .is_invalid_argument());
    }
}
