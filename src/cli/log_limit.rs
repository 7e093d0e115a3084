//! A rate limit on repeated log lines, so that no request the kernel or a reader sends once per
//! file can write a log line per file.
//!
//! Each place in the code that logs (a `tracing` callsite) at `info`, `warn` or `error` may
//! write [`BURST`] lines per [`PERIOD`]; further lines from it in the same period are left out
//! and counted. When the period is over, the next line from that place is written again, and a
//! background thread writes one summary line per place that had lines left out: how many, in
//! how long, and the first of them (its message), at the level of the lines it stands for. An
//! epoch that hits the same warning a million times thus writes `BURST` lines plus one summary
//! a minute. `debug` and `trace` are not limited: they are asked for on purpose, for a short
//! while.
//!
//! The limit is a per-layer [`Filter`] on the log output; its state is a map from callsite to
//! a small window record behind one mutex, touched only by events that passed the level filter
//! (a handful per second in normal operation).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tracing::callsite::Identifier;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata};
use tracing_subscriber::layer::{Context, Filter};

/// Lines one callsite may write per period.
pub const BURST: u32 = 10;
/// The length of a period.
pub const PERIOD: Duration = Duration::from_secs(60);
/// The target of the summary lines (never limited themselves).
pub const SUMMARY_TARGET: &str = "riffle::log_limit";

/// One callsite's current period.
#[derive(Debug)]
struct Window {
    start: Instant,
    written: u32,
    left_out: u64,
    /// The message of the first line left out in this period.
    first_left_out: Option<String>,
    level: Level,
    location: String,
}

/// Lines of one callsite that were left out, to be reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub level: Level,
    pub location: String,
    pub left_out: u64,
    pub first_message: String,
    pub over: Duration,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} more log lines like this were left out in the last {} s ({}, at most {} a minute): {}",
            self.left_out,
            self.over.as_secs(),
            self.location,
            BURST,
            self.first_message
        )
    }
}

/// The limiter: shared by the filter and the thread that writes summaries.
#[derive(Debug)]
pub struct RateLimit {
    burst: u32,
    period: Duration,
    windows: Mutex<HashMap<Identifier, Window>>,
}

impl RateLimit {
    pub fn new(burst: u32, period: Duration) -> Self {
        Self {
            burst,
            period,
            windows: Mutex::new(HashMap::new()),
        }
    }

    fn limited(meta: &Metadata<'_>) -> bool {
        *meta.level() <= Level::INFO && meta.target() != SUMMARY_TARGET
    }

    /// Whether a line from `meta`'s callsite may be written at `now`; `message` is called only
    /// for the first line left out in a period.
    pub fn admit(
        &self,
        meta: &'static Metadata<'static>,
        now: Instant,
        message: impl FnOnce() -> String,
    ) -> bool {
        if !Self::limited(meta) {
            return true;
        }
        let mut windows = self.windows.lock();
        let w = windows.entry(meta.callsite()).or_insert_with(|| Window {
            start: now,
            written: 0,
            left_out: 0,
            first_left_out: None,
            level: *meta.level(),
            location: match (meta.file(), meta.line()) {
                (Some(f), Some(l)) => format!("{f}:{l}"),
                _ => meta.target().to_string(),
            },
        });
        if now.saturating_duration_since(w.start) >= self.period && w.left_out == 0 {
            // A new period; a window with lines left out is reset by `take_summaries`, so that
            // its count is reported before its lines are written again.
            w.start = now;
            w.written = 0;
        }
        if w.written < self.burst {
            w.written += 1;
            return true;
        }
        if w.first_left_out.is_none() {
            w.first_left_out = Some(message());
        }
        w.left_out += 1;
        false
    }

    /// The callsites whose period is over and which left lines out: their summaries, and a new
    /// period for each. Called about once a period by the summary thread.
    pub fn take_summaries(&self, now: Instant) -> Vec<Summary> {
        let mut windows = self.windows.lock();
        let mut out = Vec::new();
        for w in windows.values_mut() {
            let over = now.saturating_duration_since(w.start);
            if w.left_out == 0 || over < self.period {
                continue;
            }
            out.push(Summary {
                level: w.level,
                location: w.location.clone(),
                left_out: w.left_out,
                first_message: w.first_left_out.take().unwrap_or_default(),
                over,
            });
            w.start = now;
            w.written = 0;
            w.left_out = 0;
        }
        out.sort_by(|a, b| a.location.cmp(&b.location));
        out
    }

    /// Writes the summaries every `period / 4` on a background thread, for the life of the
    /// process. A summary is written at most a quarter period late.
    pub fn spawn_reporter(self: &Arc<Self>) -> std::io::Result<()> {
        let limit = Arc::clone(self);
        std::thread::Builder::new()
            .name("riffle-log".into())
            .spawn(move || loop {
                std::thread::sleep(limit.period / 4);
                for s in limit.take_summaries(Instant::now()) {
                    match s.level {
                        Level::ERROR => tracing::error!(target: SUMMARY_TARGET, "{s}"),
                        Level::WARN => tracing::warn!(target: SUMMARY_TARGET, "{s}"),
                        _ => tracing::info!(target: SUMMARY_TARGET, "{s}"),
                    }
                }
            })
            .map(|_| ())
    }
}

/// The filter on the log output.
#[derive(Debug, Clone)]
pub struct RateLimitFilter(pub Arc<RateLimit>);

impl<S> Filter<S> for RateLimitFilter {
    fn enabled(&self, _meta: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        true
    }

    fn event_enabled(&self, event: &Event<'_>, _cx: &Context<'_, S>) -> bool {
        self.0
            .admit(event.metadata(), Instant::now(), || message_of(event))
    }
}

/// The `message` field of an event, with its other fields after it.
fn message_of(event: &Event<'_>) -> String {
    struct Fields(String, String);
    impl Visit for Fields {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            if field.name() == "message" {
                let _ = write!(self.0, "{value:?}");
            } else {
                let _ = write!(self.1, " {}={value:?}", field.name());
            }
        }
    }
    let mut f = Fields(String::new(), String::new());
    event.record(&mut f);
    f.0 + &f.1
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::callsite::Callsite;

    fn site(level: Level) -> &'static Metadata<'static> {
        // Two distinct callsites need two distinct `static`s; a macro makes one per use.
        // The callsite is not zero-sized: distinct zero-sized statics may share an address,
        // and with it an `Identifier`.
        macro_rules! make {
            ($lvl:expr, $n:expr) => {{
                struct Cs(#[allow(dead_code)] u8);
                static CS: Cs = Cs($n);
                static META: Metadata<'static> = Metadata::new(
                    "event src/x.rs:1",
                    "rifflefs::x",
                    $lvl,
                    Some("src/x.rs"),
                    Some(1),
                    Some("rifflefs::x"),
                    tracing::field::FieldSet::new(&["message"], tracing::callsite::Identifier(&CS)),
                    tracing::metadata::Kind::EVENT,
                );
                impl Callsite for Cs {
                    fn set_interest(&self, _: tracing::subscriber::Interest) {}
                    fn metadata(&self) -> &Metadata<'_> {
                        &META
                    }
                }
                &META
            }};
        }
        match level {
            Level::WARN => make!(Level::WARN, 1),
            Level::DEBUG => make!(Level::DEBUG, 2),
            _ => make!(Level::ERROR, 3),
        }
    }

    #[test]
    fn a_callsite_writes_its_burst_then_one_summary_per_period() {
        let limit = RateLimit::new(3, Duration::from_secs(60));
        let warn = site(Level::WARN);
        let t0 = Instant::now();
        let mut messages = 0;
        let written = (0..1000)
            .filter(|i| {
                limit.admit(warn, t0 + Duration::from_millis(*i), || {
                    messages += 1;
                    format!("line {i}")
                })
            })
            .count();
        assert_eq!(written, 3);
        assert_eq!(messages, 1, "only the first line left out is formatted");
        // Before the period is over there is nothing to report.
        assert!(limit
            .take_summaries(t0 + Duration::from_secs(30))
            .is_empty());
        let s = limit.take_summaries(t0 + Duration::from_secs(61));
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].left_out, 997);
        assert_eq!(s[0].first_message, "line 3");
        assert_eq!(s[0].level, Level::WARN);
        assert_eq!(s[0].location, "src/x.rs:1");
        assert!(s[0].to_string().contains("997 more log lines"));
        // A new period: the burst again, and nothing more to report yet.
        let t1 = t0 + Duration::from_secs(61);
        assert!(limit.admit(warn, t1, String::new));
        assert!(limit
            .take_summaries(t1 + Duration::from_secs(120))
            .is_empty());
    }

    #[test]
    fn callsites_are_limited_apart_and_debug_is_never_limited() {
        let limit = RateLimit::new(1, Duration::from_secs(60));
        let (warn, error, debug) = (site(Level::WARN), site(Level::ERROR), site(Level::DEBUG));
        let now = Instant::now();
        assert!(limit.admit(warn, now, String::new));
        assert!(!limit.admit(warn, now, String::new));
        assert!(
            limit.admit(error, now, String::new),
            "another callsite has its own burst"
        );
        assert!((0..100).all(|_| limit.admit(debug, now, String::new)));
    }

    #[test]
    fn a_quiet_callsite_starts_a_new_period_by_itself() {
        let limit = RateLimit::new(2, Duration::from_secs(10));
        let warn = site(Level::WARN);
        let t0 = Instant::now();
        assert!(limit.admit(warn, t0, String::new));
        assert!(limit.admit(warn, t0, String::new));
        // Nothing was left out, so a later line needs no summary first.
        assert!(limit.admit(warn, t0 + Duration::from_secs(11), String::new));
        assert!(limit
            .take_summaries(t0 + Duration::from_secs(30))
            .is_empty());
    }

    #[test]
    fn lines_left_out_wait_for_their_summary() {
        let limit = RateLimit::new(1, Duration::from_secs(10));
        let warn = site(Level::WARN);
        let t0 = Instant::now();
        assert!(limit.admit(warn, t0, String::new));
        assert!(!limit.admit(warn, t0, || "x".into()));
        // The period is over but the summary was not written yet: still left out, and counted.
        assert!(!limit.admit(warn, t0 + Duration::from_secs(11), String::new));
        let s = limit.take_summaries(t0 + Duration::from_secs(12));
        assert_eq!(s[0].left_out, 2);
        assert!(limit.admit(warn, t0 + Duration::from_secs(12), String::new));
    }
}
