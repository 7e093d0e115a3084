//! [`ObjectStore`] over the S3 API (aws-sdk-s3), for AWS S3 and S3-compatible servers.
//!
//! Credentials come from the standard AWS chain (environment, shared profile, web identity,
//! instance metadata) through aws-config, or none at all for public buckets. For S3-compatible
//! servers the endpoint and path-style addressing can be set, and request checksums are only
//! computed when an operation requires them (Ceph 16 rejects streaming checksums). The SDK's own
//! retries are turned off: [`super::retry::RetryingStore`] retries, so one policy applies to
//! every store and is tested. Timeouts are set so a stalled connection surfaces as a transient
//! error rather than a hang. The HTTP client is the SDK's default one with a bounded pool of idle
//! connections (`S3Config::idle_connections`).
//!
//! Secrets never leave the SDK: errors carry the service's error code and message only.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use aws_config::BehaviorVersion;
use aws_sdk_s3::config::{
    Region, RequestChecksumCalculation, ResponseChecksumValidation, StalledStreamProtectionConfig,
};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_smithy_runtime_api::http::Response as HttpResponse;
use aws_smithy_types::retry::RetryConfig;
use aws_smithy_types::timeout::TimeoutConfig;
use bytes::Bytes;

use super::{
    normalize_etag, ByteChunks, Detail, ListPage, ListRequest, ObjectMeta, ObjectStore,
    RangeRequest, StoreError,
};

/// How to reach one bucket.
#[derive(Debug, Clone)]
pub struct S3Config {
    pub bucket: String,
    pub endpoint_url: Option<String>,
    pub region: Option<String>,
    pub force_path_style: bool,
    pub profile: Option<String>,
    pub no_sign_request: bool,
    pub connect_timeout: Option<Duration>,
    pub read_timeout: Option<Duration>,
    /// Idle connections kept for the next requests (`fetch::idle_connections`).
    pub idle_connections: usize,
}

/// The SDK's default HTTPS client (hyper 1 with rustls over aws-lc, the proxy from the
/// environment), keeping at most `idle` idle connections instead of all. Built as
/// aws-smithy-runtime's `default_https_client` builds it, through the same (hidden)
/// `build_with_connector_fn`: the public `build_https` would drop the proxy from the
/// environment.
fn http_client(idle: usize) -> aws_smithy_runtime_api::client::http::SharedHttpClient {
    use aws_smithy_http_client::{proxy::ProxyConfig, tls, Builder, ConnectorBuilder};
    Builder::new().build_with_connector_fn(move |settings, components| {
        let mut connector = ConnectorBuilder::default()
            .pool_max_idle_per_host(idle)
            .tls_provider(tls::Provider::Rustls(
                tls::rustls_provider::CryptoMode::AwsLc,
            ));
        connector.set_connector_settings(settings.cloned());
        if let Some(components) = components {
            connector.set_sleep_impl(components.sleep_impl());
        }
        connector.set_proxy_config(Some(ProxyConfig::from_env()));
        connector.build()
    })
}

/// See the module documentation.
pub struct S3Store {
    client: aws_sdk_s3::Client,
    bucket: String,
    /// `None` for unsigned requests (`--no-sign-request`).
    credentials: Option<aws_sdk_s3::config::SharedCredentialsProvider>,
}

impl S3Store {
    pub async fn new(config: &S3Config) -> Self {
        let mut loader = aws_config::defaults(BehaviorVersion::latest());
        if let Some(profile) = &config.profile {
            loader = loader.profile_name(profile);
        }
        if config.no_sign_request {
            loader = loader.no_credentials();
        } else if let Some(file) = super::credentials_file::FileCredentials::from_env() {
            // Keys the CSI plugin may replace while the daemon runs.
            loader = loader.credentials_provider(file);
        }
        if let Some(region) = &config.region {
            loader = loader.region(Region::new(region.clone()));
        }
        let sdk = loader.load().await;
        let timeouts = TimeoutConfig::builder()
            .connect_timeout(config.connect_timeout.unwrap_or(Duration::from_secs(5)))
            .read_timeout(config.read_timeout.unwrap_or(Duration::from_secs(20)))
            .build();
        let mut builder = aws_sdk_s3::config::Builder::from(&sdk)
            .force_path_style(config.force_path_style)
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
            .retry_config(RetryConfig::disabled())
            .timeout_config(timeouts)
            .stalled_stream_protection(
                StalledStreamProtectionConfig::enabled()
                    .grace_period(Duration::from_secs(10))
                    .build(),
            );
        if sdk.region().is_none() {
            builder = builder.region(Region::new("us-east-1"));
        }
        if let Some(endpoint) = &config.endpoint_url {
            builder = builder.endpoint_url(endpoint);
        }
        builder = builder.http_client(http_client(config.idle_connections));
        S3Store {
            client: aws_sdk_s3::Client::from_conf(builder.build()),
            bucket: config.bucket.clone(),
            credentials: if config.no_sign_request {
                None
            } else {
                sdk.credentials_provider()
            },
        }
    }

    /// The name of whoever signs this store's requests, for the cache's proof rule
    /// ([`crate::cache::proofs`]): `role:<arn>` with web identity (`AWS_ROLE_ARN` and
    /// `AWS_WEB_IDENTITY_TOKEN_FILE`, as EKS and the CSI driver set them), `key:<access key
    /// id>` otherwise, `anonymous` unsigned. The name is hashed before it is kept anywhere.
    pub async fn principal_name(&self) -> Result<String, StoreError> {
        use aws_sdk_s3::config::ProvideCredentials;
        let Some(provider) = &self.credentials else {
            return Ok("anonymous".to_string());
        };
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        if let (Some(role), Some(_)) = (env("AWS_ROLE_ARN"), env("AWS_WEB_IDENTITY_TOKEN_FILE")) {
            return Ok(format!("role:{role}"));
        }
        match provider.provide_credentials().await {
            Ok(credentials) => Ok(format!("key:{}", credentials.access_key_id())),
            Err(e) => Err(StoreError::NoCredentials(
                first_line_of_credential_error(&describe_chain(&e)).into(),
            )),
        }
    }

    /// The error's kind and text, made from the SDK's error, which becomes its source: the
    /// service's modelled error, the connector's or the timeout's, never the raw response
    /// (its body can echo the signed request). A credential error keeps no source: the
    /// chain's errors tell what every provider tried and found.
    fn classify<E>(&self, err: SdkError<E, HttpResponse>) -> StoreError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let classified = self.classify_text(&err);
        if matches!(classified, StoreError::NoCredentials(_)) {
            return classified;
        }
        match err.into_source() {
            Ok(source) => classified.with_source(source),
            Err(_) => classified,
        }
    }

    fn classify_text<E>(&self, err: &SdkError<E, HttpResponse>) -> StoreError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        match err {
            SdkError::TimeoutError(_) => StoreError::Transient("request timed out".into()),
            SdkError::DispatchFailure(e) => {
                let chain = describe_chain(err);
                if chain.contains("credential") {
                    StoreError::NoCredentials(first_line_of_credential_error(&chain).into())
                } else if e.is_timeout() {
                    StoreError::Transient("request timed out".into())
                } else {
                    let detail = e
                        .as_connector_error()
                        .map(|c| describe_chain(c))
                        .unwrap_or_else(|| "connection failed".to_string());
                    StoreError::Unreachable(detail.into())
                }
            }
            SdkError::ResponseError(_) => {
                StoreError::Transient(format!("bad response: {}", describe_chain(err)).into())
            }
            SdkError::ServiceError(ctx) => {
                let status = ctx.raw().status().as_u16();
                let err = ctx.err();
                let code = err.code().unwrap_or("");
                let message = err.message().unwrap_or("").to_string();
                let detail = if message.is_empty() {
                    format!("{code} (HTTP {status})")
                } else {
                    format!("{code}: {message} (HTTP {status})")
                };
                match (code, status) {
                    ("NoSuchBucket", _) => StoreError::NoSuchBucket(self.bucket.as_str().into()),
                    ("NoSuchKey" | "NotFound", _) | (_, 404) => StoreError::NotFound,
                    ("PreconditionFailed", _) | (_, 412) => StoreError::PreconditionFailed,
                    ("InvalidAccessKeyId", _) => StoreError::AccessDenied(
                        "the access key is not known to the store (InvalidAccessKeyId)".into(),
                    ),
                    ("SignatureDoesNotMatch", _) => StoreError::AccessDenied(
                        "the secret key is wrong (SignatureDoesNotMatch)".into(),
                    ),
                    ("AccessDenied" | "AllAccessDisabled" | "ExpiredToken", _) | (_, 401 | 403) => {
                        StoreError::AccessDenied(detail.into())
                    }
                    ("SlowDown" | "InternalError" | "RequestTimeout" | "ServiceUnavailable", _)
                    | (_, 500..=599 | 408 | 429) => StoreError::Transient(detail.into()),
                    _ => StoreError::Other(detail.into()),
                }
            }
            _ => StoreError::Other(describe_chain(err).into()),
        }
    }
}

/// The error and its sources on one line (the SDK nests the useful part several levels deep).
fn describe_chain(err: &dyn std::error::Error) -> String {
    let mut parts = vec![err.to_string()];
    let mut source = err.source();
    while let Some(s) = source {
        let text = s.to_string();
        if parts.last() != Some(&text) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}

/// A body that failed midway: transient, made from the stream's error.
fn body_error(e: aws_smithy_types::byte_stream::error::Error) -> StoreError {
    StoreError::Transient(Detail::with_source(
        format!("body: {}", describe_chain(&e)),
        e,
    ))
}

/// The credential chain's error lists every provider it tried; keep the gist.
fn first_line_of_credential_error(chain: &str) -> String {
    chain
        .split(": ")
        .find(|part| part.contains("credential"))
        .unwrap_or("no credentials")
        .trim()
        .to_string()
}

fn to_system_time(t: Option<&aws_smithy_types::DateTime>) -> SystemTime {
    t.and_then(|t| SystemTime::try_from(*t).ok())
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

#[async_trait]
impl ObjectStore for S3Store {
    async fn list_page(&self, page: ListRequest<'_>) -> Result<ListPage, StoreError> {
        let mut req = self
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(page.prefix)
            .delimiter("/");
        if let Some(t) = page.token {
            req = req.continuation_token(t);
        }
        if let Some(m) = page.max_keys {
            req = req.max_keys(m.min(1000) as i32);
        }
        let out = req.send().await.map_err(|e| self.classify(e))?;
        let objects = out
            .contents()
            .iter()
            .filter_map(|o| {
                Some(ObjectMeta {
                    key: o.key()?.to_string(),
                    size: o.size().unwrap_or(0).max(0) as u64,
                    etag: normalize_etag(o.e_tag().unwrap_or("")),
                    last_modified: to_system_time(o.last_modified()),
                })
            })
            .collect();
        let prefixes = out
            .common_prefixes()
            .iter()
            .filter_map(|p| p.prefix().map(str::to_string))
            .collect();
        let next_token = if out.is_truncated().unwrap_or(false) {
            out.next_continuation_token().map(str::to_string)
        } else {
            None
        };
        Ok(ListPage {
            objects,
            prefixes,
            next_token,
        })
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError> {
        let out = self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| self.classify(e))?;
        Ok(ObjectMeta {
            key: key.to_string(),
            size: out.content_length().unwrap_or(0).max(0) as u64,
            etag: normalize_etag(out.e_tag().unwrap_or("")),
            last_modified: to_system_time(out.last_modified()),
        })
    }

    async fn get_range(&self, req: RangeRequest<'_>) -> Result<Bytes, StoreError> {
        if req.byte_count() == 0 {
            return Ok(Bytes::new());
        }
        let out = self.send_get(&req).await?;
        let body = out.body.collect().await.map_err(body_error)?;
        Ok(body.into_bytes())
    }

    async fn get_range_stream(&self, req: RangeRequest<'_>) -> Result<ByteChunks, StoreError> {
        if req.byte_count() == 0 {
            return Ok(Box::pin(futures::stream::empty()));
        }
        let out = self.send_get(&req).await?;
        let chunks = futures::stream::unfold(out.body, |mut body| async move {
            let next = body.next().await?;
            let item = next.map_err(body_error);
            Some((item, body))
        });
        Ok(Box::pin(chunks))
    }
}

impl S3Store {
    async fn send_get(
        &self,
        get: &RangeRequest<'_>,
    ) -> Result<aws_sdk_s3::operation::get_object::GetObjectOutput, StoreError> {
        let (key, range) = (get.key, &get.range);
        let mut req = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .range(format!("bytes={}-{}", range.start, range.end - 1));
        if let Some(etag) = get.if_match {
            req = req.if_match(format!("\"{etag}\""));
        }
        req.send().await.map_err(|e| self.classify(e))
    }
}
