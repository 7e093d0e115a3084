//! Parsing sizes (`8M`, `16MiB`, `1G`, `4096`) and durations (`30s`, `2m`)
//! on the command line.

/// Bytes from a number with an optional binary suffix (K, M, G, T; `iB`/`B`
/// optional, case-insensitive).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits_end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits_end);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("bad size {text:?} (e.g. 8M, 16MiB, 4096)"))?;
    let mult: u64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(format!("bad size suffix in {text:?} (K, M, G or T)")),
    };
    Ok((value * mult as f64).round() as u64)
}

/// A duration like `30s`, `2m`, `500ms`, or plain seconds.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    if let Ok(secs) = text.trim().parse::<f64>() {
        if secs.is_finite() && secs >= 0.0 {
            return Ok(std::time::Duration::from_secs_f64(secs));
        }
    }
    humantime::parse_duration(text.trim()).map_err(|e| format!("bad duration {text:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("8M"), Ok(8 << 20));
        assert_eq!(parse_size("16MiB"), Ok(16 << 20));
        assert_eq!(parse_size("1.5g"), Ok(3 << 29));
        assert!(parse_size("8X").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("30s"),
            Ok(std::time::Duration::from_secs(30))
        );
        assert_eq!(
            parse_duration("2.5"),
            Ok(std::time::Duration::from_millis(2500))
        );
        assert_eq!(parse_duration("1m"), Ok(std::time::Duration::from_secs(60)));
        assert!(parse_duration("soon").is_err());
    }
}
