//! Byte sizes on the command line: `512M`, `1.5G`, `2GiB`, `1048576`, and `90%` where a share
//! of a filesystem is allowed.

/// A size as written by the user.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SizeSpec {
    Bytes(u64),
    /// A percentage (0–100] of some total.
    Percent(f64),
}

impl SizeSpec {
    /// The size in bytes, taking percentages of `total`.
    #[cfg(test)]
    pub fn resolve(&self, total: u64) -> u64 {
        match *self {
            SizeSpec::Bytes(b) => b,
            SizeSpec::Percent(p) => (total as f64 * p / 100.0) as u64,
        }
    }
}

/// Parses a size in bytes; binary units (K = 1024).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        SizeSpec::Bytes(b) => Ok(b),
        SizeSpec::Percent(_) => Err(format!("'{s}': a percentage is not allowed here")),
    }
}

/// The number of `s` if it is written as a percentage (`N%`), parsed.
fn percentage(s: &str) -> Option<Result<f64, String>> {
    let p = s.trim().strip_suffix('%')?;
    Some(p.parse().map_err(|_| format!("'{s}' is not a percentage")))
}

/// Parses a size or a percentage.
pub fn parse_size(s: &str) -> Result<SizeSpec, String> {
    let t = s.trim();
    if let Some(v) = percentage(s) {
        let v = v?;
        if !(v > 0.0 && v <= 100.0) {
            return Err(format!(
                "'{s}': a percentage must be above 0 and at most 100"
            ));
        }
        return Ok(SizeSpec::Percent(v));
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size (examples: 512M, 4G, 1048576)"))?;
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(format!("'{s}': unknown unit '{unit}' (use K, M, G or T)")),
    };
    let bytes = value * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(format!("'{s}' is too large"));
    }
    Ok(SizeSpec::Bytes(bytes as u64))
}

/// Parses free space to keep: a size, or a percentage from 0 up to (not including) 100.
pub fn parse_free_space(s: &str) -> Result<SizeSpec, String> {
    if let Some(v) = percentage(s) {
        let v = v?;
        if !(0.0..100.0).contains(&v) {
            return Err(format!(
                "'{s}': a percentage of free space must be at least 0 and below 100"
            ));
        }
        return Ok(SizeSpec::Percent(v));
    }
    parse_size(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes_and_percentages() {
        assert_eq!(parse_bytes("1048576"), Ok(1 << 20));
        assert_eq!(parse_bytes("512M"), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_bytes("2g"), Ok(2 << 30));
        assert_eq!(parse_size("90%"), Ok(SizeSpec::Percent(90.0)));
        assert_eq!(SizeSpec::Percent(50.0).resolve(1000), 500);
        assert!(parse_bytes("12X").is_err());
        assert!(parse_bytes("").is_err());
        assert!(parse_size("0%").is_err());
        assert!(parse_size("101%").is_err());
        assert!(parse_bytes("50%").is_err());
        assert_eq!(parse_free_space("0"), Ok(SizeSpec::Bytes(0)));
        assert_eq!(parse_free_space("0%"), Ok(SizeSpec::Percent(0.0)));
        assert_eq!(parse_free_space("20G"), Ok(SizeSpec::Bytes(20 << 30)));
        assert!(parse_free_space("100%").is_err());
        assert!(parse_free_space("-1%").is_err());
        // No space inside a size.
        assert!(parse_size("5 %").is_err());
        assert!(parse_bytes("1 G").is_err());
    }
}
