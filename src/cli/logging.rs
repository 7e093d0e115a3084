//! Log set-up: `tracing` to stderr or a file.
//!
//! rifflefs logs at the chosen level; the AWS SDK, hyper and fuser are held at `warn` whatever
//! the level, because their debug output can include request headers (signatures, tokens).
//! fuser's session is held at `error`: its only warning is the unmount it retries when the
//! session ends, which fails with EINVAL after every normal `riffle unmount` (the kernel has
//! already unmounted) and would otherwise be logged on every clean exit.

use std::fs::OpenOptions;
use std::path::Path;

use anyhow::Context;
use tracing_subscriber::EnvFilter;

pub fn init(level: &str, file: Option<&Path>) -> anyhow::Result<()> {
    let filter = EnvFilter::try_new(format!(
        "warn,rifflefs={level},riffle={level},aws_config=warn,aws_smithy_runtime=warn,aws_sdk_s3=warn,hyper=warn,fuser=warn,fuser::session=error"
    ))
    .context("invalid log level")?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    match file {
        Some(path) => {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("cannot create log directory {}", dir.display()))?;
            }
            let f = OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("cannot open log file {}", path.display()))?;
            builder
                .with_ansi(false)
                .with_writer(std::sync::Mutex::new(f))
                .try_init()
        }
        None => builder.with_writer(std::io::stderr).try_init(),
    }
    .map_err(|e| anyhow::anyhow!("cannot set up logging: {e}"))
}
