//! Sorting S3 requests into the kinds the proxy counts and filters faults on.
//!
//! Only path-style addressing is understood (`/bucket` and `/bucket/key`),
//! which is what rifflefs and the benchmarks use against RGW. The rules:
//!
//! - `HEAD` anything → [`RequestKind::Head`]
//! - `PUT` anything → [`RequestKind::Put`]
//! - `GET /bucket/key` whose query holds only plain-read parameters
//!   (`versionId`, `partNumber`, `x-id`, `response-*`, presigned
//!   `X-Amz-*`) →
//!   [`RequestKind::GetRange`] with a `Range` header, else
//!   [`RequestKind::GetObject`]
//! - `GET /bucket` whose query holds only listing parameters (`list-type`,
//!   `prefix`, `delimiter`, `marker`, …, or none) → [`RequestKind::List`]
//! - everything else (`POST`, `DELETE`, sub-resources such as `?acl`,
//!   `?uploads`, `GET /`) → [`RequestKind::Other`]

use http::{HeaderMap, Method, Uri};
use serde::{Deserialize, Serialize};

/// The kind of an S3 request, as counted in the statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestKind {
    /// `GET` of a whole object (no `Range` header).
    GetObject,
    /// `GET` of an object with a `Range` header.
    GetRange,
    /// `HEAD` of an object or bucket.
    Head,
    /// Object listing: `GET` on a bucket.
    List,
    /// `PUT` of an object or bucket.
    Put,
    /// Anything else.
    Other,
}

impl RequestKind {
    /// Every kind, in the order used for reporting.
    pub const ALL: [RequestKind; 6] = [
        RequestKind::GetObject,
        RequestKind::GetRange,
        RequestKind::Head,
        RequestKind::List,
        RequestKind::Put,
        RequestKind::Other,
    ];

    /// The snake_case name used in JSON and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            RequestKind::GetObject => "get_object",
            RequestKind::GetRange => "get_range",
            RequestKind::Head => "head",
            RequestKind::List => "list",
            RequestKind::Put => "put",
            RequestKind::Other => "other",
        }
    }

    /// True for the two object-read kinds.
    pub fn is_get(self) -> bool {
        matches!(self, RequestKind::GetObject | RequestKind::GetRange)
    }
}

/// Query parameters that keep a `GET /bucket/key` a plain object read.
fn is_object_read_param(name: &str) -> bool {
    name == "versionId"
        || name == "partNumber"
        || name == "x-id"
        || name.starts_with("response-")
        || name.to_ascii_lowercase().starts_with("x-amz-")
}

/// Query parameters of the ListObjects (v1 and v2) calls.
fn is_list_param(name: &str) -> bool {
    matches!(
        name,
        "list-type"
            | "prefix"
            | "delimiter"
            | "marker"
            | "continuation-token"
            | "start-after"
            | "max-keys"
            | "encoding-type"
            | "fetch-owner"
            | "x-id"
    ) || name.to_ascii_lowercase().starts_with("x-amz-")
}

/// Names of the query parameters (the part before `=`, not decoded).
fn query_names(uri: &Uri) -> impl Iterator<Item = &str> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').map_or(p, |(name, _)| name))
}

/// Classifies one request.
pub fn classify(method: &Method, uri: &Uri, headers: &HeaderMap) -> RequestKind {
    if method == Method::HEAD {
        return RequestKind::Head;
    }
    if method == Method::PUT {
        return RequestKind::Put;
    }
    if method != Method::GET {
        return RequestKind::Other;
    }
    let path = uri.path().trim_start_matches('/');
    if path.is_empty() {
        return RequestKind::Other;
    }
    let has_key = path
        .split_once('/')
        .is_some_and(|(_bucket, key)| !key.is_empty());
    if has_key {
        if query_names(uri).all(is_object_read_param) {
            if headers.contains_key(http::header::RANGE) {
                RequestKind::GetRange
            } else {
                RequestKind::GetObject
            }
        } else {
            RequestKind::Other
        }
    } else if query_names(uri).all(is_list_param) {
        RequestKind::List
    } else {
        RequestKind::Other
    }
}

/// The object path a request names: the URI path without its leading `/`
/// (`bucket/key`, still percent-encoded as the client sent it).
pub fn key_of(uri: &Uri) -> &str {
    uri.path().trim_start_matches('/')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(method: Method, uri: &str, range: bool) -> RequestKind {
        let uri: Uri = uri.parse().expect("test uri");
        let mut headers = HeaderMap::new();
        if range {
            headers.insert(
                http::header::RANGE,
                http::HeaderValue::from_static("bytes=0-9"),
            );
        }
        classify(&method, &uri, &headers)
    }

    #[test]
    fn kinds() {
        assert_eq!(kind(Method::GET, "/b/k", false), RequestKind::GetObject);
        assert_eq!(kind(Method::GET, "/b/dir/k", true), RequestKind::GetRange);
        // aws-sdk-s3 tags its calls with `x-id`.
        assert_eq!(
            kind(Method::GET, "/b/k?versionId=3&x-id=GetObject", false),
            RequestKind::GetObject
        );
        assert_eq!(
            kind(Method::GET, "/b/k?X-Amz-Signature=ab&versionId=1", false),
            RequestKind::GetObject
        );
        assert_eq!(kind(Method::GET, "/b/k?acl", false), RequestKind::Other);
        assert_eq!(kind(Method::HEAD, "/b/k", false), RequestKind::Head);
        assert_eq!(kind(Method::HEAD, "/b", false), RequestKind::Head);
        assert_eq!(
            kind(Method::GET, "/b?list-type=2&prefix=a%2F", false),
            RequestKind::List
        );
        assert_eq!(kind(Method::GET, "/b/", false), RequestKind::List);
        assert_eq!(kind(Method::GET, "/b", false), RequestKind::List);
        assert_eq!(kind(Method::GET, "/b?location", false), RequestKind::Other);
        assert_eq!(kind(Method::GET, "/", false), RequestKind::Other);
        assert_eq!(kind(Method::PUT, "/b/k", false), RequestKind::Put);
        assert_eq!(kind(Method::DELETE, "/b/k", false), RequestKind::Other);
        assert_eq!(
            kind(Method::POST, "/b/k?uploads", false),
            RequestKind::Other
        );
    }

    #[test]
    fn keys() {
        let uri: Uri = "/b/a%20b/c?x=1".parse().expect("test uri");
        assert_eq!(key_of(&uri), "b/a%20b/c");
    }
}
