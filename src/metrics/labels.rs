//! Labels a mount writes on every metric sample (`riffle mount --metrics-label KEY=VALUE`).
//!
//! The CSI node's mounter starts each volume's daemon with the volume's labels (`volume`,
//! `pod`, `key`), so the daemon's own exposition already says which volume it is and the
//! mounter only has to put the daemons' texts together (`csi/src/mounter/metrics.rs`). The
//! labels are constant labels of the exporter's registry ([`super::Exporter`]): the encoder
//! writes them first in every sample's label set and escapes their values (backslash, double
//! quote, newline), so a value may hold any text. A name must be a Prometheus label name
//! (`[a-zA-Z_][a-zA-Z0-9_]*`), not one of the reserved `__` names, and not one of the labels
//! the mount's own families carry ([`OWN_LABELS`]), which it would duplicate.

use std::str::FromStr;

/// The label of `riffle_build_info` ([`super::prometheus`]): riffle's version.
pub const VERSION_LABEL: &str = "version";
/// The label of the FUSE families ([`super::prometheus`]): the operation.
pub const OP_LABEL: &str = "op";
/// The label names the mount's families carry themselves (with `le`, the bucket bound the
/// histogram encoder writes); a [`MetricLabel`] may not take them.
pub const OWN_LABELS: &[&str] = &[VERSION_LABEL, OP_LABEL, "le"];

/// One `KEY=VALUE` label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricLabel {
    pub name: String,
    pub value: String,
}

/// Why a `KEY=VALUE` is not a label.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    #[error("'{0}' is not KEY=VALUE")]
    NoEquals(String),
    #[error("'{0}' is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)")]
    BadName(String),
    #[error("label names starting with __ are reserved for Prometheus ('{0}')")]
    Reserved(String),
    #[error("'{0}' is a label of riffle's own metrics")]
    Own(String),
}

impl FromStr for MetricLabel {
    type Err = LabelError;

    fn from_str(s: &str) -> Result<Self, LabelError> {
        let (name, value) = s
            .split_once('=')
            .ok_or_else(|| LabelError::NoEquals(s.to_string()))?;
        let mut chars = name.chars();
        let valid = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(LabelError::BadName(name.to_string()));
        }
        if name.starts_with("__") {
            return Err(LabelError::Reserved(name.to_string()));
        }
        if OWN_LABELS.contains(&name) {
            return Err(LabelError::Own(name.to_string()));
        }
        Ok(MetricLabel {
            name: name.to_string(),
            value: value.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_values_taken_whole() {
        let l: MetricLabel = "pod=ml/trainer-0=x\"y".parse().expect("label");
        assert_eq!(l.name, "pod");
        assert_eq!(l.value, "ml/trainer-0=x\"y");
        assert_eq!("_k=".parse::<MetricLabel>().expect("empty value").value, "");
        assert!(matches!(
            "novalue".parse::<MetricLabel>(),
            Err(LabelError::NoEquals(_))
        ));
        for bad in ["=v", "1a=v", "a-b=v", "a b=v", "é=v", "a\"=v"] {
            assert!(
                matches!(bad.parse::<MetricLabel>(), Err(LabelError::BadName(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            "__name__=v".parse::<MetricLabel>(),
            Err(LabelError::Reserved(_))
        ));
        assert!(matches!(
            "op=v".parse::<MetricLabel>(),
            Err(LabelError::Own(_))
        ));
    }
}
