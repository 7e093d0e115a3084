//! The `s3://BUCKET[/PREFIX/]` source of a mount.

use std::fmt;

/// A bucket and the prefix below it that becomes the mount's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub bucket: String,
    /// "" or a prefix ending in '/'.
    pub prefix: String,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.prefix)
    }
}

impl std::str::FromStr for Source {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let rest = s.strip_prefix("s3://").ok_or_else(|| {
            format!("'{s}' is not an S3 URL; expected s3://BUCKET or s3://BUCKET/PREFIX/")
        })?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.len() < 3 || bucket.len() > 63 {
            return Err(format!(
                "bucket name '{bucket}' must be 3 to 63 characters long"
            ));
        }
        if !bucket
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        {
            return Err(format!(
                "bucket name '{bucket}' may only contain letters, digits, '.', '-' and '_'"
            ));
        }
        let trimmed = prefix.trim_start_matches('/');
        if trimmed.len() != prefix.len() {
            return Err(format!("'{s}': the prefix may not start with '/'"));
        }
        if trimmed.split('/').any(|c| c == "." || c == "..") || trimmed.contains("//") {
            return Err(format!(
                "'{s}': the prefix may not contain empty, '.' or '..' components"
            ));
        }
        let mut prefix = trimmed.to_string();
        if !prefix.is_empty() && !prefix.ends_with('/') {
            prefix.push('/');
        }
        Ok(Source {
            bucket: bucket.to_string(),
            prefix,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_buckets_and_prefixes() {
        let s: Source = "s3://my-bucket".parse().unwrap();
        assert_eq!((s.bucket.as_str(), s.prefix.as_str()), ("my-bucket", ""));
        let s: Source = "s3://my-bucket/".parse().unwrap();
        assert_eq!(s.prefix, "");
        let s: Source = "s3://b12/ds/train".parse().unwrap();
        assert_eq!(s.prefix, "ds/train/");
        assert_eq!(s.to_string(), "s3://b12/ds/train/");
        assert!("http://b/x".parse::<Source>().is_err());
        assert!("s3://ab".parse::<Source>().is_err());
        assert!("s3://bad bucket".parse::<Source>().is_err());
        assert!("s3://bucket//x".parse::<Source>().is_err());
        assert!("s3://bucket/a/../b".parse::<Source>().is_err());
    }
}
