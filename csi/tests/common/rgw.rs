//! The real S3 server of the integration tests (Ceph RGW from
//! deploy/local/rgw.sh): connection details from the environment, a client,
//! and buckets with known content.
//!
//! Needs RIFFLE_TEST_ENDPOINT (e.g. http://127.0.0.1:7480) with
//! AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY of a user there
//! (`eval "$(deploy/local/rgw.sh env)"`), root and /dev/fuse, and the riffle
//! binary from RIFFLE_BIN, else $CARGO_TARGET_DIR/debug/riffle, else
//! target/debug/riffle. Without RIFFLE_TEST_ENDPOINT [`env`] FAILS with
//! instructions. The tests that use it are built with the `rgw-tests` feature
//! (`tests/run.sh` turns it on).

use aws_sdk_s3::primitives::ByteStream;
use std::path::{Path, PathBuf};

/// Connection details of the test S3 server.
#[derive(Clone)]
pub struct Env {
    pub endpoint: String,
    pub access_key: String,
    pub secret_key: String,
    pub riffle: PathBuf,
}

/// Reads the environment.
pub fn env() -> Env {
    let Ok(endpoint) = std::env::var("RIFFLE_TEST_ENDPOINT") else {
        panic!(
            "RIFFLE_TEST_ENDPOINT is not set. These tests need a real S3 server: run \
             tests/run.sh, or `deploy/local/rgw.sh up && eval \"$(deploy/local/rgw.sh env)\"` first."
        );
    };
    let access_key = std::env::var("AWS_ACCESS_KEY_ID")
        .expect("AWS_ACCESS_KEY_ID must be set with RIFFLE_TEST_ENDPOINT");
    let secret_key = std::env::var("AWS_SECRET_ACCESS_KEY")
        .expect("AWS_SECRET_ACCESS_KEY must be set with RIFFLE_TEST_ENDPOINT");
    let riffle = std::env::var_os("RIFFLE_BIN")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("CARGO_TARGET_DIR").map(|t| PathBuf::from(t).join("debug/riffle"))
        })
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/riffle"));
    assert!(
        riffle.is_file(),
        "riffle binary {} not found: build it (cargo build -p rifflefs --bin riffle) or set RIFFLE_BIN",
        riffle.display()
    );
    assert!(
        nix::unistd::geteuid().is_root(),
        "the real-mount tests mount FUSE filesystems and must run as root"
    );
    assert!(Path::new("/dev/fuse").exists(), "/dev/fuse is missing");
    Env {
        endpoint,
        access_key,
        secret_key,
        riffle,
    }
}

pub async fn s3(env: &Env) -> aws_sdk_s3::Client {
    let creds = aws_sdk_s3::config::Credentials::new(
        &env.access_key,
        &env.secret_key,
        None,
        None,
        "riffle-csi-test",
    );
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
        .region(aws_sdk_s3::config::Region::new("us-east-1"))
        .endpoint_url(&env.endpoint)
        .credentials_provider(creds)
        .force_path_style(true)
        // Ceph 16 rejects streaming checksums.
        .request_checksum_calculation(aws_sdk_s3::config::RequestChecksumCalculation::WhenRequired)
        .response_checksum_validation(aws_sdk_s3::config::ResponseChecksumValidation::WhenRequired)
        .build();
    aws_sdk_s3::Client::from_conf(conf)
}

/// Creates a fresh bucket with `shard-N/data.txt` for N in 0..shards and a
/// nested object. Returns its name.
pub async fn make_bucket(env: &Env, shards: usize) -> String {
    let client = s3(env).await;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let bucket = format!("csi-{}-{nanos}", std::process::id());
    client
        .create_bucket()
        .bucket(&bucket)
        .send()
        .await
        .expect("create bucket");
    for i in 0..shards {
        client
            .put_object()
            .bucket(&bucket)
            .key(format!("shard-{i}/data.txt"))
            .body(ByteStream::from(content(i).into_bytes()))
            .send()
            .await
            .expect("put object");
    }
    client
        .put_object()
        .bucket(&bucket)
        .key("shard-0/nested/deep.bin")
        .body(ByteStream::from(vec![7u8; 300_000]))
        .send()
        .await
        .expect("put object");
    bucket
}

pub fn content(i: usize) -> String {
    format!("rifflefs csi test shard {i}\n").repeat(100)
}
