//! Building an aws-sdk-s3 client for an S3-compatible endpoint, and the
//! bucket-level calls the harness needs (create if missing, list sizes).

use std::collections::HashMap;

use anyhow::{anyhow, Context};
use aws_sdk_s3::config::{
    BehaviorVersion, Credentials, Region, RequestChecksumCalculation, ResponseChecksumValidation,
};
use aws_sdk_s3::Client;

/// Where and as whom to connect.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub url: String,
    pub region: String,
    pub access_key: String,
    pub secret_key: String,
}

impl Endpoint {
    /// The endpoint `url` with credentials from `AWS_ACCESS_KEY_ID` and
    /// `AWS_SECRET_ACCESS_KEY` (e.g. `eval "$(deploy/local/rgw.sh env)"`).
    pub fn from_env(url: &str) -> anyhow::Result<Self> {
        let var = |name: &str| {
            std::env::var(name).with_context(|| {
                format!("{name} is not set (try: eval \"$(deploy/local/rgw.sh env)\")")
            })
        };
        Ok(Self {
            url: url.trim_end_matches('/').to_string(),
            region: std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".to_string()),
            access_key: var("AWS_ACCESS_KEY_ID")?,
            secret_key: var("AWS_SECRET_ACCESS_KEY")?,
        })
    }
}

/// A client for `endpoint`: path-style, checksums only when required (Ceph
/// 16 rejects streaming checksums), no response checksum validation.
pub fn connect(endpoint: &Endpoint) -> Client {
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(&endpoint.url)
        .region(Region::new(endpoint.region.clone()))
        .force_path_style(true)
        .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
        .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
        .credentials_provider(Credentials::new(
            endpoint.access_key.clone(),
            endpoint.secret_key.clone(),
            None,
            None,
            "riffle-bench",
        ))
        .build();
    Client::from_conf(config)
}

/// Creates `bucket` unless it exists.
pub async fn ensure_bucket(s3: &Client, bucket: &str) -> anyhow::Result<()> {
    if s3.head_bucket().bucket(bucket).send().await.is_ok() {
        return Ok(());
    }
    match s3.create_bucket().bucket(bucket).send().await {
        Ok(_) => Ok(()),
        Err(e) => {
            let svc = e.as_service_error();
            if svc.is_some_and(|e| e.is_bucket_already_owned_by_you()) {
                Ok(())
            } else {
                Err(anyhow!("create bucket {bucket}: {}", error_text(&e)))
            }
        }
    }
}

/// Every key under `prefix` with its size.
pub async fn list_sizes(
    s3: &Client,
    bucket: &str,
    prefix: &str,
) -> anyhow::Result<HashMap<String, u64>> {
    let mut out = HashMap::new();
    let mut pages = s3
        .list_objects_v2()
        .bucket(bucket)
        .prefix(prefix)
        .max_keys(1000)
        .into_paginator()
        .send();
    while let Some(page) = pages.next().await {
        let page = page.map_err(|e| anyhow!("list {bucket}/{prefix}: {}", error_text(&e)))?;
        for o in page.contents() {
            if let Some(k) = o.key() {
                out.insert(k.to_string(), o.size().unwrap_or(0).max(0) as u64);
            }
        }
    }
    Ok(out)
}

/// A one-line description of an SDK error, with the service's code and
/// message when there is one.
pub fn error_text<E, R>(e: &aws_sdk_s3::error::SdkError<E, R>) -> String
where
    E: aws_sdk_s3::error::ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    match e.as_service_error() {
        Some(s) => format!(
            "{}: {}",
            s.code().unwrap_or("service error"),
            s.message().unwrap_or("")
        ),
        None => {
            let mut text = e.to_string();
            let mut src = std::error::Error::source(e);
            while let Some(s) = src {
                text.push_str(": ");
                text.push_str(&s.to_string());
                src = s.source();
            }
            text
        }
    }
}
