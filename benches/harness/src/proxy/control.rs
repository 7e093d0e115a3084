//! The control endpoint: a small JSON-over-HTTP API to read counters and
//! change faults and latency while the proxy runs.
//!
//! | method and path     | body                       | answer                              |
//! |---------------------|----------------------------|-------------------------------------|
//! | `GET /`             |                            | `{"proxy":"ADDR","upstream":"URL"}` |
//! | `GET /health`       |                            | `ok`                                |
//! | `GET /stats`        |                            | [`StatsSnapshot`]                   |
//! | `POST /stats/reset` |                            | the [`StatsSnapshot`] before zeroing |
//! | `GET /faults`       |                            | `{"faults":[FaultRuleStatus…]}`     |
//! | `PUT /faults`       | rules (see below)          | `{"faults":[…]}` after replacing    |
//! | `POST /faults`      | rules                      | `{"faults":[…]}` after appending    |
//! | `DELETE /faults`    |                            | `{"faults":[]}`                     |
//! | `GET /latency`      |                            | [`Latency`]                         |
//! | `PUT /latency`      | [`Latency`]                | the new [`Latency`]                 |
//!
//! Rules are `{"faults":[rule…]}`, a bare `[rule…]`, or one `rule` object
//! (see [`super::faults::FaultRule`]). Errors answer 400/404/405 with
//! `{"error":"…"}`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use serde::Serialize;
use serde_json::json;

use super::config::Latency;
use super::faults::parse_rules_json;
use super::state::ProxyState;
#[cfg(doc)]
use super::stats::StatsSnapshot;

/// Largest request body the control endpoint reads.
const MAX_BODY: usize = 1 << 20;

type ControlResponse = Response<Full<Bytes>>;

fn respond(
    status: StatusCode,
    body: impl Into<Bytes>,
    content_type: &'static str,
) -> ControlResponse {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn json_response(status: StatusCode, value: &impl Serialize) -> ControlResponse {
    match serde_json::to_vec(value) {
        Ok(body) => respond(status, body, "application/json"),
        Err(err) => error(StatusCode::INTERNAL_SERVER_ERROR, &err.to_string()),
    }
}

fn error(status: StatusCode, message: &str) -> ControlResponse {
    let body = json!({ "error": message }).to_string();
    respond(status, body, "application/json")
}

fn faults_json(state: &ProxyState) -> ControlResponse {
    json_response(StatusCode::OK, &json!({ "faults": state.fault_status() }))
}

/// Serves one control request.
pub async fn handle(
    state: Arc<ProxyState>,
    proxy_addr: SocketAddr,
    req: Request<Incoming>,
) -> Result<ControlResponse, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().trim_end_matches('/').to_owned();
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(err) => {
            return Ok(error(
                StatusCode::BAD_REQUEST,
                &format!("reading body: {err}"),
            ))
        }
    };
    tracing::debug!(%method, %path, "control request");
    let response = match (method, path.as_str()) {
        (Method::GET, "") => json_response(
            StatusCode::OK,
            &json!({ "proxy": proxy_addr.to_string(), "upstream": state.upstream_url }),
        ),
        (Method::GET, "/health") => respond(StatusCode::OK, "ok\n", "text/plain"),
        (Method::GET, "/stats") => json_response(StatusCode::OK, &state.stats()),
        (Method::POST, "/stats/reset") => json_response(StatusCode::OK, &state.reset_stats()),
        (Method::GET, "/faults") => faults_json(&state),
        (Method::PUT, "/faults") => match parse_rules_json(&body) {
            Ok(rules) => match state.set_faults(rules) {
                Ok(()) => faults_json(&state),
                Err(err) => error(StatusCode::BAD_REQUEST, &err.to_string()),
            },
            Err(err) => error(StatusCode::BAD_REQUEST, &err.to_string()),
        },
        (Method::POST, "/faults") => match parse_rules_json(&body) {
            Ok(rules) => match state.add_faults(rules) {
                Ok(()) => faults_json(&state),
                Err(err) => error(StatusCode::BAD_REQUEST, &err.to_string()),
            },
            Err(err) => error(StatusCode::BAD_REQUEST, &err.to_string()),
        },
        (Method::DELETE, "/faults") => {
            state.clear_faults();
            faults_json(&state)
        }
        (Method::GET, "/latency") => json_response(StatusCode::OK, &state.latency()),
        (Method::PUT, "/latency") => match serde_json::from_slice::<Latency>(&body) {
            Ok(latency) => match state.set_latency(latency) {
                Ok(()) => json_response(StatusCode::OK, &state.latency()),
                Err(err) => error(StatusCode::BAD_REQUEST, &err.to_string()),
            },
            Err(err) => error(StatusCode::BAD_REQUEST, &format!("bad latency JSON: {err}")),
        },
        (_, "" | "/health" | "/stats" | "/stats/reset" | "/faults" | "/latency") => {
            error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
        }
        _ => error(StatusCode::NOT_FOUND, "no such endpoint"),
    };
    Ok(response)
}
