//! Saying so in the log when a gRPC client the HTTP/2 server rejects calls.
//!
//! kubelet since 1.26 (and current CSI sidecars) send `:authority:
//! localhost` on the unix socket. Older kubelets and sidecars built with an
//! old grpc-go send the socket path (`/csi/csi.sock`), which is not a valid
//! URI authority: the HTTP/2 server (h2, under tonic) resets every such
//! request with PROTOCOL_ERROR before any handler runs, and says so only in
//! a DEBUG line of its own. Without this module the operator would see a
//! plugin that logs nothing while kubelet reports "connection reset".
//!
//! [`layer`] is a `tracing` layer that listens to h2's server events only
//! (its own filter enables `h2::server` at DEBUG, whatever RUST_LOG says)
//! and turns "malformed authority" into one WARN a minute naming the
//! authority sent and the supported versions.

use std::sync::Mutex;
use std::time::{Duration, Instant};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::filter::{Filtered, Targets};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

/// The h2 module whose events carry the reason for a reset.
const H2_SERVER: &str = "h2::server";

/// How often the warning may repeat.
const EVERY: Duration = Duration::from_secs(60);

/// The warning for a client that sent `authority`.
pub fn warning(authority: &str) -> String {
    format!(
        "a gRPC client sent :authority {authority}, which HTTP/2 rejects (PROTOCOL_ERROR): it is a kubelet older than 1.26 or a CSI sidecar built with an old grpc-go; riffle-csi supports kubelet >= 1.26, node-driver-registrar >= v2.13 and livenessprobe >= v2.15"
    )
}

/// The authority quoted in an h2 "malformed authority" message.
pub fn rejected_authority(message: &str) -> Option<&str> {
    let rest = message.split("malformed authority (").nth(1)?;
    let end = rest.rfind("):").unwrap_or(rest.len());
    // h2 prints the raw value with Debug: b"/csi/csi.sock".
    let quoted = rest[..end].strip_prefix('b').unwrap_or(&rest[..end]);
    Some(quoted.trim_matches('"'))
}

/// The layer: listens to h2's server events and warns.
pub struct OldClientAlarm {
    last: Mutex<Option<Instant>>,
}

/// [`OldClientAlarm`] with the filter that lets exactly h2's server events
/// through.
pub fn layer<S>() -> Filtered<OldClientAlarm, Targets, S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    OldClientAlarm {
        last: Mutex::new(None),
    }
    .with_filter(Targets::new().with_target(H2_SERVER, tracing::Level::DEBUG))
}

#[derive(Default)]
struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl<S: Subscriber> Layer<S> for OldClientAlarm {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut message = Message::default();
        event.record(&mut message);
        let Some(authority) = rejected_authority(&message.0) else {
            return;
        };
        let now = Instant::now();
        {
            let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|at| now.duration_since(at) < EVERY) {
                return;
            }
            *last = Some(now);
        }
        tracing::warn!("{}", warning(authority));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_authority_is_found_in_h2s_message() {
        let m =
            r#"malformed headers: malformed authority (b"/csi/csi.sock"): invalid uri character"#;
        assert_eq!(rejected_authority(m), Some("/csi/csi.sock"));
        let m = r#"malformed headers: malformed authority ("/x.sock"): invalid uri character"#;
        assert_eq!(rejected_authority(m), Some("/x.sock"));
        assert_eq!(rejected_authority("malformed headers: missing path"), None);
        assert!(warning("/csi/csi.sock").contains("kubelet older than 1.26"));
    }
}
