//! Responses the proxy makes up itself: injected S3 errors and 502s.
//!
//! Error bodies follow S3's XML error format so S3 clients parse and
//! classify them as they would a real server's (`SlowDown` is throttling,
//! `InternalError` a retryable server error).

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};

use super::faults::FaultKind;
use super::ProxyBody;

static REQUEST_IDS: AtomicU64 = AtomicU64::new(1);

/// Escapes the five XML special characters.
fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// An S3-style XML error response.
pub fn s3_error(
    status: StatusCode,
    code: &str,
    message: &str,
    resource: &str,
) -> Response<ProxyBody> {
    let request_id = format!(
        "riffle-proxy-{}",
        REQUEST_IDS.fetch_add(1, Ordering::Relaxed)
    );
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>{}</Message><Resource>/{}</Resource><RequestId>{request_id}</RequestId></Error>",
        xml_escape(message),
        xml_escape(resource),
    );
    let mut response = Response::new(
        Full::new(Bytes::from(body))
            .map_err(Into::into)
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/xml"),
    );
    if let Ok(id) = HeaderValue::from_str(&request_id) {
        headers.insert("x-amz-request-id", id);
    }
    response
}

/// The response for an injected `http500` or `slowdown503`.
pub fn injected_error(kind: FaultKind, resource: &str) -> Response<ProxyBody> {
    match kind {
        FaultKind::Slowdown503 => s3_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "SlowDown",
            "Please reduce your request rate.",
            resource,
        ),
        _ => s3_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "We encountered an internal error. Please try again.",
            resource,
        ),
    }
}

/// The response when the upstream could not be reached or failed.
pub fn bad_gateway(resource: &str, error: &str) -> Response<ProxyBody> {
    s3_error(
        StatusCode::BAD_GATEWAY,
        "BadGateway",
        &format!("riffle-proxy: upstream failed: {error}"),
        resource,
    )
}

/// An empty body.
pub fn empty() -> ProxyBody {
    Empty::new().map_err(Into::into).boxed_unsync()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes() {
        assert_eq!(xml_escape("a&b<c>\"'"), "a&amp;b&lt;c&gt;&quot;&apos;");
    }
}
