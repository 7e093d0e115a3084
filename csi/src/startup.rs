//! What both binaries (`riffle-csi`, `riffle-mounter`) do around their work:
//! set up logging, and wait for the signal to stop.

use tracing_subscriber::layer::{Layer, SubscriberExt};

/// RUST_LOG (default `info`) to stderr, without colours unless stderr is a
/// terminal, plus the [`old_clients`](crate::grpc::old_clients) alarm.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let subscriber = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_filter(filter),
        )
        .with(crate::grpc::old_clients::layer());
    if tracing::subscriber::set_global_default(subscriber).is_err() {
        eprintln!("riffle-csi: a logger was already installed");
    }
}

/// Waits for SIGTERM or SIGINT and names the one that came.
pub async fn stop_signal() -> std::io::Result<&'static str> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => Ok("SIGTERM"),
        result = tokio::signal::ctrl_c() => result.map(|()| "SIGINT"),
    }
}
