//! One GET (whole or ranged), streamed chunk by chunk to a callback.

use anyhow::anyhow;
use aws_sdk_s3::Client;

use super::client::error_text;

/// GETs `bucket/key` (bytes `range.0..range.0 + range.1` when given) and
/// hands each body chunk to `on_chunk` with its offset in the object.
/// Returns the number of body bytes received.
pub async fn get_streamed(
    s3: &Client,
    bucket: &str,
    key: &str,
    range: Option<(u64, u64)>,
    mut on_chunk: impl FnMut(u64, &[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<u64> {
    let mut req = s3.get_object().bucket(bucket).key(key);
    let start = range.map_or(0, |(off, _)| off);
    if let Some((off, len)) = range {
        if len == 0 {
            return Ok(0);
        }
        req = req.range(format!("bytes={}-{}", off, off + len - 1));
    }
    let mut out = req
        .send()
        .await
        .map_err(|e| anyhow!("GET {key}: {}", error_text(&e)))?;
    let mut got = 0u64;
    while let Some(chunk) = out.body.next().await {
        let chunk = chunk.map_err(|e| anyhow!("GET {key}: body: {e}"))?;
        on_chunk(start + got, &chunk)?;
        got += chunk.len() as u64;
    }
    Ok(got)
}

/// Splits `size` bytes into `(offset, len)` parts of `part` bytes (one
/// empty part for an empty object).
pub fn parts(size: u64, part: u64) -> Vec<(u64, u64)> {
    if size == 0 {
        return vec![(0, 0)];
    }
    let part = part.max(1);
    (0..size.div_ceil(part))
        .map(|i| (i * part, part.min(size - i * part)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_the_object() {
        assert_eq!(parts(0, 8), vec![(0, 0)]);
        assert_eq!(parts(8, 8), vec![(0, 8)]);
        assert_eq!(parts(20, 8), vec![(0, 8), (8, 8), (16, 4)]);
    }
}
