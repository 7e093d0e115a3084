//! Handling one client request: count it, decide its faults, forward it,
//! hold the response head for the first-byte delay, shape the body.
//!
//! The request goes upstream as it came in: method, target, version and
//! headers (including `Host`) unchanged, the body streamed through while
//! its bytes are counted. The response comes back the same way: status and
//! headers as the upstream sent them (hyper adds no `Date`), the body wrapped
//! by [`super::body`] for pacing, counting and cuts. The first-byte delay
//! and any `stall` are waited out after the upstream's response head has
//! arrived, so they add to the upstream's own time to first byte.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http::uri::PathAndQuery;
use http::{header, Method, Request, Response, Uri};
use http_body::Body as _;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use parking_lot::Mutex;

use super::body::{response_body, BodyPlan, PlannedCut};
use super::classify::{classify, key_of};
use super::faults::{BodyCut, Decision};
use super::io::ResetSwitch;
use super::pacing::Pacer;
use super::responses;
use super::state::ProxyState;
use super::upstream::{UpstreamBody, UpstreamLink};
use super::ProxyBody;

/// What one downstream connection carries from request to request.
pub struct ConnContext {
    pub state: Arc<ProxyState>,
    pub link: tokio::sync::Mutex<UpstreamLink>,
    pub pacer: Arc<Mutex<Pacer>>,
    pub reset: ResetSwitch,
    pub peer: SocketAddr,
}

impl ConnContext {
    /// Context for a new connection from `peer`.
    pub fn new(state: Arc<ProxyState>, peer: SocketAddr, reset: ResetSwitch) -> Self {
        let link = UpstreamLink::new(state.upstream, Arc::clone(&state.stats));
        ConnContext {
            state,
            link: tokio::sync::Mutex::new(link),
            pacer: Arc::new(Mutex::new(Pacer::default())),
            reset,
            peer,
        }
    }
}

/// Serves one request of the connection `ctx`.
pub async fn handle(
    ctx: Arc<ConnContext>,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let state = &ctx.state;
    let kind = classify(req.method(), req.uri(), req.headers());
    let key = key_of(req.uri()).to_owned();
    state.stats.record_request(kind, &key);
    let decision = state.faults.decide(req.method().as_str(), kind, &key);
    for fault in decision.chosen_kinds() {
        state.stats.fault_injected(fault);
    }
    let latency = state.latency();
    let is_head = req.method() == Method::HEAD;
    tracing::trace!(peer = %ctx.peer, method = %req.method(), uri = %req.uri(), ?kind, "request");

    let response = match decision.error {
        Some(fault) => {
            tracing::debug!(fault = fault.as_str(), %key, "injecting error response");
            responses::injected_error(fault, &key)
        }
        None => match forward(&ctx, req).await {
            Ok(upstream) => shape(
                &ctx,
                upstream,
                is_head,
                kind.is_get(),
                &decision,
                latency.bandwidth_bytes_per_sec(),
            ),
            Err(err) => {
                state.stats.upstream_error();
                tracing::warn!(%err, %key, "upstream request failed");
                responses::bad_gateway(&key, &err.to_string())
            }
        },
    };

    let hold = latency.first_byte_delay() + decision.stall.unwrap_or_default();
    if !hold.is_zero() {
        tokio::time::sleep(hold).await;
    }
    state.stats.record_status(response.status().as_u16());
    Ok(response)
}

/// Sends the request upstream on this connection's link.
async fn forward(
    ctx: &ConnContext,
    req: Request<Incoming>,
) -> Result<Response<Incoming>, super::upstream::UpstreamError> {
    let (mut parts, body) = req.into_parts();
    if parts.uri.scheme().is_some() {
        // An absolute-form target (proxy-style client): send origin form.
        let origin = parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        parts.uri = Uri::from(origin);
    }
    let stats = Arc::clone(&ctx.state.stats);
    let body: UpstreamBody = body
        .map_frame(move |frame| {
            if let Some(data) = frame.data_ref() {
                stats.add_bytes_up(data.len() as u64);
            }
            frame
        })
        .boxed_unsync();
    ctx.link
        .lock()
        .await
        .send(Request::from_parts(parts, body))
        .await
}

/// Wraps the upstream response body for pacing, counting and cuts.
fn shape(
    ctx: &ConnContext,
    upstream: Response<Incoming>,
    is_head: bool,
    object_get: bool,
    decision: &Decision,
    bandwidth: Option<u64>,
) -> Response<ProxyBody> {
    let (parts, body) = upstream.into_parts();
    if is_head || body.is_end_stream() {
        return Response::from_parts(parts, responses::empty());
    }
    let content_length = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let cut = decision.cut.and_then(|cut| plan_cut(cut, content_length));
    let rate = match (bandwidth, decision.trickle) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let plan = BodyPlan {
        rate,
        pacer: Arc::clone(&ctx.pacer),
        cut,
        stats: Arc::clone(&ctx.state.stats),
        object_get,
        reset: ctx.reset.clone(),
    };
    Response::from_parts(parts, response_body(body, plan))
}

/// Where to cut a body of `content_length` bytes (unknown for chunked
/// bodies). A body of known length is always cut before its last byte; an
/// empty one is not cut at all.
fn plan_cut(cut: BodyCut, content_length: Option<u64>) -> Option<PlannedCut> {
    let after = match content_length {
        Some(0) => return None,
        Some(len) => cut.after_bytes.unwrap_or(len / 2).min(len - 1),
        None => cut.after_bytes.unwrap_or(0),
    };
    Some(PlannedCut {
        after,
        reset: cut.reset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_points() {
        let cut = |after_bytes| BodyCut {
            reset: false,
            after_bytes,
        };
        let after = |c, len| plan_cut(c, len).map(|p| p.after);
        assert_eq!(after(cut(None), Some(100)), Some(50));
        assert_eq!(after(cut(Some(10)), Some(100)), Some(10));
        assert_eq!(after(cut(Some(1000)), Some(100)), Some(99));
        assert_eq!(after(cut(None), Some(1)), Some(0));
        assert_eq!(after(cut(None), Some(0)), None);
        assert_eq!(after(cut(None), None), Some(0));
        assert_eq!(after(cut(Some(7)), None), Some(7));
    }
}
