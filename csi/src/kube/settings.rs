//! Volume settings: `volumeAttributes` plus `mountOptions` -> one validated,
//! canonical [`VolumeSettings`].
//!
//! Algorithm: the `riffle mount` options a volume may set are riffle's one list of them
//! ([`VOLUME_OPTIONS`]); each is written as a volume attribute in camelCase
//! (`cacheSize`, derived from the flag `cache-size`) or as a mount option under the
//! flag's own name (`cache-size=...`, '_' read as '-'). Each input is looked up there, its
//! value spelled canonically ([`rifflefs::cli::volume_options::Spelling`]) and checked by
//! `riffle mount`'s own parser ([`check_mount_args`]), whose message, prefixed with the
//! name the user wrote, is what an invalid value is refused with. Switches (flags without a
//! value, such as `--warm`) take "true"/"false"; false ones are dropped, so "absent" and
//! "false" are the same setting. The values are kept in a sorted map keyed by the riffle
//! flag. A setting given both as an attribute and as a mount option is refused rather than
//! silently resolved. Everything else is refused with its name, except what riffle does not
//! know and the plugin does: `bucket`, `prefix`, the identity attributes, `peers`, the
//! no-op mount options, and the `csi.storage.k8s.io/*` keys kubelet adds itself.
//!
//! The canonical form makes the settings hash (used to tell "same publish
//! again" from "different settings at the same target") independent of map
//! order, spelling of values and the attribute/mount-option choice.
//! Credentials are not settings: they never pass through this module. The
//! identity attributes `roleArn` and `stsEndpointUrl` are settings (they
//! name a role and an endpoint, not a secret) but not `riffle mount` flags:
//! they become the daemon's environment ([`crate::kube::access`]).

use rifflefs::cli::volume_options::{
    check_endpoint_url, check_mount_args, is_switch, VolumeOption, VOLUME_OPTIONS,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::path::Path;

/// Why a volume's attributes or mount options were refused. The message
/// names the offending attribute/option so that an operator can fix the PV.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SettingsError {
    #[error("volume attribute \"bucket\" is required")]
    MissingBucket,
    #[error("unknown volume attribute(s): {names} (supported: {supported})")]
    UnknownAttributes { names: String, supported: String },
    #[error("unsupported mount option(s): {names} (supported: {supported})")]
    UnknownMountOptions { names: String, supported: String },
    #[error("invalid value {value:?} for {source_name}: {reason}")]
    InvalidValue {
        source_name: String,
        value: String,
        reason: String,
    },
    #[error("invalid mount option {name:?}: {reason}")]
    InvalidMountOption { name: String, reason: &'static str },
    #[error("{setting} is set both as volume attribute {attribute:?} and as mount option {option:?}; set it once")]
    Conflict {
        setting: &'static str,
        attribute: String,
        option: String,
    },
    #[error("cacheMinFree (cache-min-free) applies to the node cache; set cacheSize as well")]
    MinFreeWithoutCache,
    #[error("stsEndpointUrl applies to roleArn; set roleArn as well")]
    StsEndpointWithoutRole,
    #[error("the volume sets gid {gid} but the pod's fsGroup is {group}: drop gid from the volume (fsGroup sets the files' group) or make them equal")]
    GidNotFsGroup { gid: String, group: String },
    #[error("riffle mount refuses these settings together: {0}")]
    Combination(String),
}

/// The volume attribute that sets `--flag`: its camelCase (`cache-size` -> `cacheSize`).
fn attribute_name(flag: &str) -> String {
    let mut parts = flag.split('-');
    let mut name = parts.next().unwrap_or_default().to_string();
    for part in parts {
        let mut chars = part.chars();
        if let Some(first) = chars.next() {
            name.push(first.to_ascii_uppercase());
            name.extend(chars);
        }
    }
    name
}

/// Mount options accepted and ignored because they are always in effect:
/// rifflefs mounts are read-only and always allow other users (pods run
/// under arbitrary uids).
const NOOP_MOUNT_OPTIONS: &[&str] = &["ro", "read-only", "allow-other"];

/// The attributes the plugin reads itself (not `riffle mount` flags).
const PLUGIN_ATTRIBUTES: &[&str] = &["bucket", "prefix", "roleArn", "stsEndpointUrl", "peers"];

/// Attribute keys kubelet adds on its own (podInfoOnMount, ephemeral).
const KUBELET_PREFIX: &str = "csi.storage.k8s.io/";

/// The cache directory riffle's parser is shown when it checks a value: `--cache-size` and
/// its kin need one, and the node supplies it.
const CHECKED_CACHE_DIR: &str = "/node/cache";

/// Validated, canonical settings of one volume. Contains no secrets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeSettings {
    pub bucket: String,
    /// Empty, or a key prefix ending in '/'.
    pub prefix: String,
    /// riffle flag name (without dashes) -> canonical value ("true" for
    /// boolean flags that are set; false booleans are absent).
    pub options: BTreeMap<String, String>,
    /// The role the daemon assumes with the pod's service account token
    /// (volume attribute `roleArn`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role_arn: Option<String>,
    /// Where the daemon asks STS for the role's credentials (volume
    /// attribute `stsEndpointUrl`; default: AWS STS). An S3-compatible
    /// store with STS (Ceph RGW, MinIO) serves it at its own endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sts_endpoint_url: Option<String>,
    /// Whether the volume's daemon joins its nodes' peer ring (volume
    /// attribute `peers`; absent: yes, wherever riffle-mounter has peers
    /// configured, [`crate::mounter::peers`]). Not a `riffle mount` flag: the mounter
    /// turns it into `--peer-listen`, `--peers` and `--peer-secret-file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peers: Option<bool>,
}

impl VolumeSettings {
    /// Parses and validates a volume's attributes and mount options.
    pub fn parse(
        attributes: &HashMap<String, String>,
        mount_flags: &[String],
    ) -> Result<Self, SettingsError> {
        let mut options = BTreeMap::new();
        let mut from_attribute: HashMap<&'static str, String> = HashMap::new();
        let mut unknown: Vec<&str> = Vec::new();
        let mut bucket = None;
        let mut prefix = String::new();
        let mut role_arn = None;
        let mut sts_endpoint_url = None;
        let mut peers = None;

        let mut keys: Vec<&String> = attributes.keys().collect();
        keys.sort();
        for key in keys {
            let value = &attributes[key];
            match key.as_str() {
                "bucket" => bucket = Some(parse_bucket(value)?),
                "prefix" => prefix = parse_prefix(value)?,
                "roleArn" => role_arn = Some(parse_role_arn(value)?),
                "stsEndpointUrl" => sts_endpoint_url = Some(parse_sts_endpoint(value)?),
                "peers" => peers = Some(parse_bool("peers", value)?),
                k if k.starts_with(KUBELET_PREFIX) => {}
                k => match VOLUME_OPTIONS.iter().find(|o| attribute_name(o.flag) == k) {
                    Some(option) => {
                        if let Some(v) = canonical(option, k, value)? {
                            options.insert(option.flag.to_string(), v);
                        }
                        from_attribute.insert(option.flag, k.to_string());
                    }
                    None => unknown.push(k),
                },
            }
        }
        if !unknown.is_empty() {
            let mut supported: Vec<String> =
                PLUGIN_ATTRIBUTES.iter().map(|a| a.to_string()).collect();
            supported.extend(VOLUME_OPTIONS.iter().map(|o| attribute_name(o.flag)));
            return Err(SettingsError::UnknownAttributes {
                names: unknown.join(", "),
                supported: supported.join(", "),
            });
        }
        let bucket = bucket.ok_or(SettingsError::MissingBucket)?;

        let mut unknown_flags: Vec<String> = Vec::new();
        for raw in mount_flags {
            let (name, value) = split_mount_flag(raw);
            if NOOP_MOUNT_OPTIONS.contains(&name.as_str()) {
                if value.is_some() {
                    return Err(SettingsError::InvalidMountOption {
                        name,
                        reason: "takes no value",
                    });
                }
                continue;
            }
            let Some(option) = VOLUME_OPTIONS
                .iter()
                .find(|o| !o.node_path && o.flag == name)
            else {
                unknown_flags.push(name);
                continue;
            };
            if let Some(attribute) = from_attribute.get(option.flag) {
                return Err(SettingsError::Conflict {
                    setting: option.flag,
                    attribute: attribute.clone(),
                    option: name,
                });
            }
            let value = match value {
                None if is_switch(option.flag) => "true".to_string(),
                Some(v) => v,
                None => {
                    return Err(SettingsError::InvalidMountOption {
                        name,
                        reason: "needs a value (name=value)",
                    })
                }
            };
            match canonical(option, &name, &value)? {
                Some(v) => options.insert(option.flag.to_string(), v),
                None => options.remove(option.flag),
            };
        }
        if !unknown_flags.is_empty() {
            let mut supported: Vec<&str> = NOOP_MOUNT_OPTIONS.to_vec();
            supported.extend(
                VOLUME_OPTIONS
                    .iter()
                    .filter(|o| !o.node_path)
                    .map(|o| o.flag),
            );
            return Err(SettingsError::UnknownMountOptions {
                names: unknown_flags.join(", "),
                supported: supported.join(", "),
            });
        }
        if options.contains_key("cache-min-free") && !options.contains_key("cache-size") {
            return Err(SettingsError::MinFreeWithoutCache);
        }
        if sts_endpoint_url.is_some() && role_arn.is_none() {
            return Err(SettingsError::StsEndpointWithoutRole);
        }
        let settings = Self {
            bucket,
            prefix,
            options,
            role_arn,
            sts_endpoint_url,
            peers,
        };
        // Each value passed alone; this catches options that riffle refuses together.
        check_mount_args(&settings.flags(Some(Path::new(CHECKED_CACHE_DIR))))
            .map_err(SettingsError::Combination)?;
        Ok(settings)
    }

    /// `s3://bucket/prefix/`, the source argument of `riffle mount`.
    pub fn source_url(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.prefix)
    }

    /// Whether the volume asks for unsigned (anonymous) requests.
    pub fn anonymous(&self) -> bool {
        self.options.contains_key("no-sign-request")
    }

    /// Whether the volume's daemon may join the peer ring (the `peers`
    /// attribute; default true).
    pub fn peers_enabled(&self) -> bool {
        self.peers != Some(false)
    }

    /// Whether the volume uses the node's block cache.
    pub fn uses_cache(&self) -> bool {
        self.options.contains_key("cache-size")
    }

    /// A stable digest of the settings and the volume id: equal iff a
    /// publish is "the same" for idempotency purposes.
    pub fn digest(&self, volume_id: &str) -> String {
        let mut hasher = Sha256::new();
        hasher.update(volume_id.as_bytes());
        hasher.update([0]);
        hasher.update(self.bucket.as_bytes());
        hasher.update([0]);
        hasher.update(self.prefix.as_bytes());
        // The identity attributes enter only when set, so that the digest
        // of a volume without them is what it was before they existed
        // (records written by earlier plugins stay "the same publish").
        // So does `peers`.
        let peers = self.peers.map(|p| p.to_string());
        let identity = [
            ("roleArn", &self.role_arn),
            ("stsEndpointUrl", &self.sts_endpoint_url),
            ("peers", &peers),
        ];
        let identity = identity
            .iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| (*k, v.as_str())));
        for (k, v) in self
            .options
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .chain(identity)
        {
            hasher.update([0]);
            hasher.update(k.as_bytes());
            hasher.update([b'=']);
            hasher.update(v.as_bytes());
        }
        hex::encode(hasher.finalize())
    }

    /// The `riffle mount` option flags (without source and mount point),
    /// always in `--flag=value` form so that no value can be taken for a
    /// flag. `cache_dir` is the node's shared cache, passed only when the
    /// volume enables the cache.
    /// Applies the pod's fsGroup (kubelet's `volume_mount_group`, sent because the plugin
    /// advertises `VOLUME_MOUNT_GROUP`): the files' group becomes it (`--gid`), instead of
    /// kubelet changing ownership file by file, which a read-only mount cannot do. A `gid`
    /// the volume sets itself must agree.
    pub fn apply_mount_group(&mut self, group: &str) -> Result<(), SettingsError> {
        if group.is_empty() {
            return Ok(());
        }
        let gid = match group.trim().parse::<u32>() {
            Ok(n) => n.to_string(),
            Err(_) => {
                return Err(invalid(
                    "volume_mount_group (fsGroup)",
                    group,
                    "expected a numeric id",
                ))
            }
        };
        match self.options.get("gid") {
            Some(set) if *set != gid => Err(SettingsError::GidNotFsGroup {
                gid: set.clone(),
                group: gid,
            }),
            _ => {
                self.options.insert("gid".to_string(), gid);
                Ok(())
            }
        }
    }

    pub fn flags(&self, cache_dir: Option<&Path>) -> Vec<OsString> {
        let mut out = Vec::new();
        for (flag, value) in &self.options {
            if is_switch(flag) {
                out.push(OsString::from(format!("--{flag}")));
            } else {
                out.push(OsString::from(format!("--{flag}={value}")));
            }
        }
        if let (true, Some(dir)) = (self.uses_cache(), cache_dir) {
            let mut arg = OsString::from("--cache-dir=");
            arg.push(dir.as_os_str());
            out.push(arg);
        }
        out
    }
}

/// Splits "name=value" / "--name=value" / "name" and normalizes '_' to '-'
/// in the name.
fn split_mount_flag(raw: &str) -> (String, Option<String>) {
    let raw = raw.trim().trim_start_matches("--");
    match raw.split_once('=') {
        Some((n, v)) => (n.replace('_', "-"), Some(v.to_string())),
        None => (raw.replace('_', "-"), None),
    }
}

fn invalid(source_name: &str, value: &str, reason: impl Into<String>) -> SettingsError {
    SettingsError::InvalidValue {
        source_name: source_name.to_string(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

fn parse_bucket(value: &str) -> Result<String, SettingsError> {
    let ok_chars = value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    if !(3..=63).contains(&value.len()) || !ok_chars {
        return Err(invalid(
            "bucket",
            value,
            "a bucket name has 3-63 characters: letters, digits, '.', '-', '_'",
        ));
    }
    Ok(value.to_string())
}

/// An IAM role ARN: `arn:PARTITION:iam::ACCOUNT:role/NAME` (RGW's have an
/// empty account). Checked loosely: STS has the last word.
fn parse_role_arn(value: &str) -> Result<String, SettingsError> {
    let value = value.trim();
    let parts: Vec<&str> = value.splitn(6, ':').collect();
    let ok = value.len() <= 2048
        && parts.len() == 6
        && parts[0] == "arn"
        && parts[2] == "iam"
        && parts[5].starts_with("role/")
        && parts[5].len() > "role/".len()
        && !value.chars().any(|c| c.is_whitespace() || c.is_control());
    if ok {
        Ok(value.to_string())
    } else {
        Err(invalid(
            "roleArn",
            value,
            "expected an IAM role ARN such as arn:aws:iam::123456789012:role/NAME",
        ))
    }
}

fn parse_prefix(value: &str) -> Result<String, SettingsError> {
    if value.chars().any(char::is_control) {
        return Err(invalid("prefix", value, "contains control characters"));
    }
    let trimmed = value.trim_start_matches('/');
    if trimmed.split('/').any(|seg| seg == "..") {
        return Err(invalid("prefix", value, "must not contain '..' segments"));
    }
    if trimmed.is_empty() {
        return Ok(String::new());
    }
    if trimmed.ends_with('/') {
        Ok(trimmed.to_string())
    } else {
        Ok(format!("{trimmed}/"))
    }
}

/// "true" or "false", in any case, as `source_name` takes it.
fn parse_bool(source_name: &str, value: &str) -> Result<bool, SettingsError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(invalid(
            source_name,
            value,
            "expected \"true\" or \"false\"",
        )),
    }
}

/// `stsEndpointUrl`: a URL checked as riffle checks `--endpoint-url`, kept as written.
fn parse_sts_endpoint(value: &str) -> Result<String, SettingsError> {
    let value = value.trim();
    check_endpoint_url(value)
        .map(|()| value.to_string())
        .map_err(|reason| invalid("stsEndpointUrl", value, reason))
}

/// The canonical value of `option` as `source_name` (the attribute or mount option the
/// user wrote) sets it to `value`, checked by riffle's parser; None for a switch that is
/// false.
fn canonical(
    option: &VolumeOption,
    source_name: &str,
    value: &str,
) -> Result<Option<String>, SettingsError> {
    let value = value.trim();
    if value.chars().any(char::is_control) {
        return Err(invalid(source_name, value, "contains control characters"));
    }
    if is_switch(option.flag) {
        return Ok(parse_bool(source_name, value)?.then(|| "true".to_string()));
    }
    // Never anything that reads as a flag, nor an empty value.
    if value.is_empty() || value.starts_with('-') {
        return Err(invalid(source_name, value, "expected a value"));
    }
    if option.node_path && !Path::new(value).is_absolute() {
        return Err(invalid(
            source_name,
            value,
            "expected an absolute path on the node",
        ));
    }
    let canonical = option.spelling.canonical(value);
    let args = [
        format!("--{}={canonical}", option.flag),
        format!("--cache-dir={CHECKED_CACHE_DIR}"),
    ];
    check_mount_args(&args.map(OsString::from))
        .map_err(|reason| invalid(source_name, value, reason))?;
    Ok(Some(canonical))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn flags(s: &VolumeSettings) -> Vec<String> {
        s.flags(Some(Path::new("/cache")))
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn full_attribute_set_maps_to_flags() {
        let s = VolumeSettings::parse(
            &attrs(&[
                ("bucket", "datasets"),
                ("prefix", "/imagenet/train"),
                ("endpointUrl", "http://127.0.0.1:7480"),
                ("region", "us-east-1"),
                ("forcePathStyle", "True"),
                ("metadataTtl", "indefinite"),
                ("cacheSize", "80%"),
                ("prefetchPlan", "/plans/epoch.txt"),
                ("warm", "false"),
                ("fileMode", "444"),
                ("csi.storage.k8s.io/pod.name", "trainer-0"),
                ("csi.storage.k8s.io/ephemeral", "true"),
            ]),
            &["uid=1000".into(), "--max-inflight=64".into(), "ro".into()],
        )
        .expect("valid");
        assert_eq!(s.source_url(), "s3://datasets/imagenet/train/");
        assert_eq!(
            flags(&s),
            vec![
                "--cache-size=80%",
                "--endpoint-url=http://127.0.0.1:7480",
                "--file-mode=0444",
                "--force-path-style",
                "--max-inflight=64",
                "--metadata-ttl=indefinite",
                "--prefetch-plan=/plans/epoch.txt",
                "--region=us-east-1",
                "--uid=1000",
                "--cache-dir=/cache",
            ]
        );
    }

    #[test]
    fn bucket_is_required_and_validated() {
        assert_eq!(
            VolumeSettings::parse(&attrs(&[("region", "x")]), &[]),
            Err(SettingsError::MissingBucket)
        );
        let err = VolumeSettings::parse(&attrs(&[("bucket", "a/b")]), &[]).unwrap_err();
        assert!(err.to_string().contains("bucket"), "{err}");
    }

    #[test]
    fn unknown_attributes_are_named() {
        let err = VolumeSettings::parse(
            &attrs(&[("bucket", "abc"), ("colour", "red"), ("size", "1")]),
            &[],
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("colour, size"), "{msg}");
        assert!(msg.contains("endpointUrl"), "{msg}");
    }

    #[test]
    fn unknown_mount_options_are_named() {
        let err =
            VolumeSettings::parse(&attrs(&[("bucket", "abc")]), &["rw".into(), "exec".into()])
                .unwrap_err();
        assert!(err.to_string().contains("rw, exec"), "{err}");
    }

    #[test]
    fn conflicting_sources_are_refused() {
        let err = VolumeSettings::parse(
            &attrs(&[("bucket", "abc"), ("uid", "1")]),
            &["uid=2".into()],
        )
        .unwrap_err();
        assert!(matches!(err, SettingsError::Conflict { .. }), "{err}");
    }

    #[test]
    fn the_pods_fs_group_becomes_the_files_group() {
        let attrs = HashMap::from([("bucket".to_string(), "datasets".to_string())]);
        let mut s = VolumeSettings::parse(&attrs, &[]).unwrap();
        s.apply_mount_group("").unwrap();
        assert!(!s.options.contains_key("gid"));
        s.apply_mount_group("2000").unwrap();
        assert_eq!(s.options.get("gid").map(String::as_str), Some("2000"));
        assert!(s
            .flags(None)
            .iter()
            .any(|f| f.to_str() == Some("--gid=2000")));
        assert!(matches!(
            s.apply_mount_group("staff"),
            Err(SettingsError::InvalidValue { .. })
        ));
        // A gid the volume sets itself must agree with the fsGroup.
        let with_gid = HashMap::from([
            ("bucket".to_string(), "datasets".to_string()),
            ("gid".to_string(), "100".to_string()),
        ]);
        let mut s = VolumeSettings::parse(&with_gid, &[]).unwrap();
        s.apply_mount_group("100").unwrap();
        let err = s.apply_mount_group("2000").unwrap_err();
        assert!(err.to_string().contains("fsGroup is 2000"), "{err}");
    }

    #[test]
    fn invalid_values_are_explained() {
        for (k, v) in [
            ("endpointUrl", "ftp://x"),
            ("endpointUrl", "http://user:pw@host"),
            ("forcePathStyle", "yes please"),
            ("uid", "-1"),
            ("fileMode", "999"),
            ("metadataTtl", "soon"),
            ("maxInflight", "0"),
            ("maxMemory", "lots"),
            ("cacheSize", "120%"),
            ("prefetchPlan", "relative/plan"),
            ("logLevel", "loud"),
            ("region", "--evil"),
        ] {
            let err = VolumeSettings::parse(&attrs(&[("bucket", "abc"), (k, v)]), &[]);
            assert!(err.is_err(), "{k}={v} accepted");
        }
        let err = VolumeSettings::parse(&attrs(&[("bucket", "abc"), ("prefix", "a/../b")]), &[]);
        assert!(err.is_err());
    }

    #[test]
    fn riffles_message_follows_the_name_the_user_wrote() {
        let err = VolumeSettings::parse(&attrs(&[("bucket", "abc"), ("fileMode", "999")]), &[])
            .expect_err("not octal");
        let msg = err.to_string();
        assert!(msg.contains("fileMode") && msg.contains("octal"), "{msg}");
        let err = VolumeSettings::parse(&attrs(&[("bucket", "abc")]), &["max_memory=1K".into()])
            .expect_err("too small");
        let msg = err.to_string();
        assert!(msg.contains("max-memory") && msg.contains("32M"), "{msg}");
        // Options that are the node's are not volume settings.
        for (attribute, option) in [("cacheDir", "cache-dir=/x"), ("pidFile", "pid-file=/x")] {
            let err = VolumeSettings::parse(&attrs(&[("bucket", "abc"), (attribute, "/x")]), &[]);
            assert!(
                matches!(err, Err(SettingsError::UnknownAttributes { .. })),
                "{err:?}"
            );
            let err = VolumeSettings::parse(&attrs(&[("bucket", "abc")]), &[option.into()]);
            assert!(
                matches!(err, Err(SettingsError::UnknownMountOptions { .. })),
                "{err:?}"
            );
        }
    }

    #[test]
    fn values_are_attached_to_their_flag() {
        // `--flag=value` form: a value can never be taken for another flag.
        let s = VolumeSettings::parse(&attrs(&[("bucket", "abc"), ("maxMemory", "1GiB")]), &[])
            .expect("valid");
        assert_eq!(flags(&s), vec!["--max-memory=1GiB"]);
    }

    #[test]
    fn digest_ignores_spelling_and_source() {
        let a = VolumeSettings::parse(
            &attrs(&[
                ("bucket", "abc"),
                ("forcePathStyle", "TRUE"),
                ("warm", "false"),
            ]),
            &[],
        )
        .expect("valid");
        let b = VolumeSettings::parse(&attrs(&[("bucket", "abc")]), &["force_path_style".into()])
            .expect("valid");
        assert_eq!(a.digest("v1"), b.digest("v1"));
        assert_ne!(a.digest("v1"), a.digest("v2"));
        let c = VolumeSettings::parse(&attrs(&[("bucket", "abc"), ("prefix", "x")]), &[])
            .expect("valid");
        assert_ne!(a.digest("v1"), c.digest("v1"));
    }

    #[test]
    fn cache_min_free_is_checked_and_needs_the_cache() {
        let s = VolumeSettings::parse(
            &attrs(&[
                ("bucket", "abc"),
                ("cacheSize", "1GiB"),
                ("cacheMinFree", "0"),
            ]),
            &[],
        )
        .expect("valid");
        assert!(flags(&s).contains(&"--cache-min-free=0".to_string()));
        let s = VolumeSettings::parse(
            &attrs(&[("bucket", "abc"), ("cacheSize", "1GiB")]),
            &["cache_min_free=10%".into()],
        )
        .expect("valid");
        assert!(flags(&s).contains(&"--cache-min-free=10%".to_string()));
        for bad in ["100%", "-1", "lots", "5 %"] {
            let err = VolumeSettings::parse(
                &attrs(&[
                    ("bucket", "abc"),
                    ("cacheSize", "1GiB"),
                    ("cacheMinFree", bad),
                ]),
                &[],
            )
            .expect_err(bad);
            assert!(
                matches!(err, SettingsError::InvalidValue { .. }),
                "{bad}: {err}"
            );
        }
        let err = VolumeSettings::parse(&attrs(&[("bucket", "abc"), ("cacheMinFree", "0")]), &[])
            .expect_err("no cache");
        assert_eq!(err, SettingsError::MinFreeWithoutCache);
    }

    #[test]
    fn peers_is_a_setting_but_not_a_flag() {
        let plain = VolumeSettings::parse(&attrs(&[("bucket", "abc")]), &[]).expect("valid");
        assert_eq!(plain.peers, None);
        assert!(plain.peers_enabled(), "peers are on by default");
        let off = VolumeSettings::parse(&attrs(&[("bucket", "abc"), ("peers", "False")]), &[])
            .expect("valid");
        assert_eq!(off.peers, Some(false));
        assert!(!off.peers_enabled());
        assert!(flags(&off).is_empty(), "{:?}", flags(&off));
        let on = VolumeSettings::parse(&attrs(&[("bucket", "abc"), ("peers", "true")]), &[])
            .expect("valid");
        assert!(on.peers_enabled());
        // Set, it changes the digest (a different daemon); absent, the digest and the
        // record are what they were before the attribute existed.
        assert_ne!(off.digest("v"), plain.digest("v"));
        assert_ne!(on.digest("v"), plain.digest("v"));
        let json = serde_json::to_string(&plain).expect("json");
        assert!(!json.contains("peers"), "{json}");
        let back: VolumeSettings =
            serde_json::from_str(&serde_json::to_string(&off).expect("json")).expect("back");
        assert_eq!(back, off);
        let err = VolumeSettings::parse(&attrs(&[("bucket", "abc"), ("peers", "yes")]), &[])
            .expect_err("not a boolean");
        assert!(err.to_string().contains("peers"), "{err}");
        // Not a mount option.
        assert!(VolumeSettings::parse(&attrs(&[("bucket", "abc")]), &["peers".into()]).is_err());
    }

    #[test]
    fn identity_attributes_are_settings_but_not_flags() {
        let role = "arn:aws:iam::123456789012:role/trainer";
        let s = VolumeSettings::parse(
            &attrs(&[
                ("bucket", "abc"),
                ("roleArn", role),
                ("stsEndpointUrl", "http://rgw:7480"),
            ]),
            &[],
        )
        .expect("valid");
        assert_eq!(s.role_arn.as_deref(), Some(role));
        assert_eq!(s.sts_endpoint_url.as_deref(), Some("http://rgw:7480"));
        assert!(flags(&s).is_empty(), "{:?}", flags(&s));
        let plain = VolumeSettings::parse(&attrs(&[("bucket", "abc")]), &[]).expect("valid");
        assert_ne!(s.digest("v"), plain.digest("v"));
        // A volume without them keeps the digest (and the record form) it had
        // before they existed.
        let mut before = Sha256::new();
        before.update(b"v\0abc\0");
        before.update(b"\0max-inflight=8");
        let with_option =
            VolumeSettings::parse(&attrs(&[("bucket", "abc"), ("maxInflight", "8")]), &[])
                .expect("valid");
        assert_eq!(with_option.digest("v"), hex::encode(before.finalize()));
        let json = serde_json::to_string(&plain).expect("json");
        assert!(!json.contains("role_arn"), "{json}");
        let old: VolumeSettings =
            serde_json::from_str(r#"{"bucket":"abc","prefix":"","options":{}}"#).expect("old");
        assert_eq!(old, plain);
        for bad in [
            "role/x",
            "arn:aws:s3:::bucket",
            "arn:aws:iam::1:user/x",
            "arn:aws:iam::1:role/",
        ] {
            assert!(
                VolumeSettings::parse(&attrs(&[("bucket", "abc"), ("roleArn", bad)]), &[]).is_err(),
                "{bad}"
            );
        }
        // RGW's roles have no account.
        assert!(VolumeSettings::parse(
            &attrs(&[("bucket", "abc"), ("roleArn", "arn:aws:iam:::role/reader")]),
            &[]
        )
        .is_ok());
        assert_eq!(
            VolumeSettings::parse(
                &attrs(&[("bucket", "abc"), ("stsEndpointUrl", "http://rgw:7480")]),
                &[]
            ),
            Err(SettingsError::StsEndpointWithoutRole)
        );
    }

    #[test]
    fn cache_dir_only_with_cache_size() {
        let s = VolumeSettings::parse(&attrs(&[("bucket", "abc")]), &[]).expect("valid");
        assert!(flags(&s).is_empty());
    }

    /// A positive size, as riffle reads it.
    fn is_size(value: &str) -> bool {
        rifflefs::cli::size::parse_bytes(value).is_ok_and(|b| b > 0)
    }

    #[test]
    fn sizes() {
        for ok in ["1", "512MiB", "1.5G", "2gb", "100KiB"] {
            assert!(is_size(ok), "{ok}");
        }
        for bad in ["", "MiB", "-1G", "1 G", "1PB", "0"] {
            assert!(!is_size(bad), "{bad}");
        }
    }
}
