//! The response body stream: upstream bytes passed through untouched, paced,
//! counted, and cut short when a body fault says so.
//!
//! The upstream body is read frame by frame and handed on in pieces (whole
//! frames when there is no rate cap, [`Pacer::piece_size`] pieces when
//! there is). Before each piece the connection's [`Pacer`] says when it may
//! go; the stream sleeps until then. Nothing is buffered beyond the one frame
//! hyper already read, so a 300 MiB object flows through in constant memory.
//!
//! A cut sends `after` bytes, pauses briefly so hyper flushes them to the
//! socket, then fails the body. Hyper answers a failed body by dropping the
//! connection without finishing the message: the client sees the connection
//! close (FIN, `truncate_body`) or reset (RST, `reset_mid_body`, via
//! [`ResetSwitch`]) before `Content-Length` bytes arrived.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Incoming;
use parking_lot::Mutex;
use tokio::time::Instant;

use super::faults::FaultKind;
use super::io::ResetSwitch;
use super::pacing::Pacer;
use super::stats::Stats;
use super::{BoxError, ProxyBody};

/// How long a cut waits for hyper to flush the bytes sent before it.
const CUT_FLUSH_PAUSE: Duration = Duration::from_millis(20);

/// The error a cut body fails with.
#[derive(Debug, thiserror::Error)]
#[error("response body cut by an injected {0} fault")]
pub struct InjectedCut(&'static str);

/// A body cut, resolved against the response.
#[derive(Debug, Clone, Copy)]
pub struct PlannedCut {
    /// Body bytes to send before cutting.
    pub after: u64,
    /// Reset rather than close.
    pub reset: bool,
}

/// How one response body is to be sent.
pub struct BodyPlan {
    /// Rate cap in bytes per second (`None`: unlimited).
    pub rate: Option<u64>,
    /// The connection's pacer.
    pub pacer: Arc<Mutex<Pacer>>,
    /// Cut the body short.
    pub cut: Option<PlannedCut>,
    /// Where sent bytes and injected cuts are counted.
    pub stats: Arc<Stats>,
    /// The body of an object GET (its bytes also count as object bytes).
    pub object_get: bool,
    /// The connection's reset switch.
    pub reset: ResetSwitch,
}

struct BodyState {
    inner: Incoming,
    pending: Bytes,
    plan: BodyPlan,
    /// Bytes left before the cut.
    cut_left: Option<u64>,
    /// The pacer's schedule was started (at the first poll, which comes
    /// after the first-byte delay).
    paced: bool,
    done: bool,
}

impl BodyState {
    async fn next(&mut self) -> Option<Result<Frame<Bytes>, BoxError>> {
        if self.done {
            return None;
        }
        while self.pending.is_empty() {
            match self.inner.frame().await {
                None => {
                    self.done = true;
                    return None;
                }
                Some(Err(err)) => {
                    self.done = true;
                    tracing::debug!(%err, "upstream body failed");
                    return Some(Err(err.into()));
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.pending = data,
                    // Trailers pass through as they are.
                    Err(frame) => return Some(Ok(frame)),
                },
            }
        }
        let mut take = self.pending.len();
        if let Some(left) = self.cut_left {
            if left == 0 {
                return Some(Err(self.cut().await));
            }
            take = take.min(usize::try_from(left).unwrap_or(usize::MAX));
        }
        if let Some(rate) = self.plan.rate {
            take = take.min(Pacer::piece_size(rate));
            let now = Instant::now();
            let send_at = {
                let mut pacer = self.plan.pacer.lock();
                if !self.paced {
                    pacer.begin_response(now);
                    self.paced = true;
                }
                pacer.reserve(take, rate, now)
            };
            // Only sleep when needed: even a past deadline would wait for
            // the timer's next tick.
            if send_at > now {
                tokio::time::sleep_until(send_at).await;
            }
        }
        let piece = self.pending.split_to(take);
        if let Some(left) = self.cut_left.as_mut() {
            *left -= take as u64;
        }
        self.plan
            .stats
            .add_bytes_down(take as u64, self.plan.object_get);
        Some(Ok(Frame::data(piece)))
    }

    async fn cut(&mut self) -> BoxError {
        self.done = true;
        let (kind, name) = match self.plan.cut {
            Some(PlannedCut { reset: true, .. }) => (FaultKind::ResetMidBody, "reset_mid_body"),
            _ => (FaultKind::TruncateBody, "truncate_body"),
        };
        // Returning Pending lets hyper flush what was sent so far.
        tokio::time::sleep(CUT_FLUSH_PAUSE).await;
        if kind == FaultKind::ResetMidBody {
            self.plan.reset.arm();
        }
        self.plan.stats.fault_injected(kind);
        tracing::debug!(fault = name, "cutting response body");
        Box::new(InjectedCut(name))
    }
}

/// Wraps the upstream response body according to `plan`.
pub fn response_body(inner: Incoming, plan: BodyPlan) -> ProxyBody {
    let state = BodyState {
        inner,
        pending: Bytes::new(),
        cut_left: plan.cut.map(|c| c.after),
        plan,
        paced: false,
        done: false,
    };
    let frames = stream::unfold(state, |mut state| async move {
        let item = state.next().await?;
        Some((item, state))
    });
    StreamBody::new(frames).boxed_unsync()
}
