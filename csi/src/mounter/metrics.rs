//! `riffle-mounter --metrics-addr HOST:PORT`: every volume daemon's Prometheus metrics on one
//! port, each series labelled with its volume.
//!
//! The daemons under the mounter share the node's network (the mounter runs with
//! `hostNetwork`), so they open no port of their own. Each daemon labels its own samples: the
//! mounter starts it with its volume's labels ([`VolumeLabels`], `riffle mount
//! --metrics-label`, [`crate::mounter::riffle::metrics_label_flags`]): `volume` (the CSI volume id),
//! `pod` (`namespace/name`, when kubelet passed the pod's name: `podInfoOnMount`) and `key`
//! (the target's key, as in the `[volume <key>]` log lines; it keeps two publishes of one
//! volume apart). On each scrape ([`MetricsProxy::render`]) the mounter reads the plugin's
//! volume records (`STATE/volumes/*.json`, read only: the plugin's records are the truth),
//! asks the daemon of each published one for its metrics over its control socket (the
//! `metrics` command: `{"pid": PID, "text": "<OpenMetrics text>"}`, the same text `riffle
//! mount --metrics-addr` serves), and puts the answers together ([`Merged`]).
//!
//! The merge reads lines, never sample values or label sets: OpenMetrics wants every family
//! in one block, so the lines of each daemon's text are grouped under the family of the
//! `# TYPE` / `# HELP` / `# UNIT` line that precedes them (a sample before any of them is a
//! family of its own name); a family's descriptor lines are written once (the first daemon's),
//! then every daemon's samples of it, families in the order first seen, one `# EOF` at the end.
//! A family whose `# TYPE` differs from the one already merged (daemons of different
//! versions) keeps the first daemon's samples only. Samples are never relabelled here: the
//! daemon's labels are already on them.
//!
//! The mounter adds series of its own, labelled with the same [`VolumeLabels`]:
//! `riffle_mounter_volumes` (published volumes with a daemon), `riffle_mounter_volume_up` (1
//! when the volume's daemon answered this scrape) and `riffle_mounter_daemon_restarts_total`
//! (daemon processes replaced under the volume's keeper as this mounter saw them between
//! scrapes: a new pid; a restart and a second one between two scrapes count once), and
//! `riffle_mounter_peer_port_conflicts_total` ([`crate::mounter::peers`]).
//!
//! Bounds: daemons are asked in parallel, each within [`DAEMON_TIMEOUT`], and an answer longer
//! than [`MAX_ANSWER`] is dropped; the HTTP side ([`serve`], on `rifflefs::http_server`)
//! serves [`MAX_CONNECTIONS`] connections at once, reads at most [`MAX_REQUEST`] bytes of a
//! request's head within [`REQUEST_TIMEOUT`], answers one request per connection and closes
//! it. Nothing secret is in the output: daemon metrics hold counters only, and the records'
//! settings are not read.

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, ALLOW, CACHE_CONTROL, CONNECTION, CONTENT_TYPE as CONTENT};
use hyper::{Method, Request, Response, StatusCode};
use rifflefs::http_server::{self, HttpServer, ServerLimits};
use serde::Deserialize;
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::task::JoinSet;

/// How long one daemon may take to answer.
pub const DAEMON_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest answer read from a daemon.
pub const MAX_ANSWER: u64 = 16 << 20;
/// Longest HTTP request head (line and headers) read.
pub const MAX_REQUEST: usize = 16 * 1024;
/// Time a client has to send its request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once; more are closed at accept.
pub const MAX_CONNECTIONS: usize = 8;

/// The content type of [`MetricsProxy::render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Why the endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsProxyError {
    #[error("cannot listen for metrics on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: http_server::ServeError,
    },
}

/// What the proxy reads of a volume record (leniently: fields it does not know are ignored,
/// so records of other plugin versions are read too).
#[derive(Debug, Clone, Deserialize)]
struct Record {
    volume_id: String,
    target: PathBuf,
    #[serde(default)]
    pod: Option<String>,
    /// None while the mount is being made.
    #[serde(default)]
    daemon: Option<serde_json::Value>,
}

/// A volume's labels: on every sample of its daemon (which the mounter starts with them) and
/// on the mounter's own series of the volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeLabels {
    pub volume: String,
    pub pod: Option<String>,
    pub key: String,
}

impl VolumeLabels {
    /// The labels of the volume `volume_id` published at `target` for `pod` (none if empty).
    pub fn new(volume_id: &str, pod: Option<&str>, target: &Path) -> Self {
        VolumeLabels {
            volume: volume_id.to_string(),
            pod: pod.filter(|p| !p.is_empty()).map(str::to_string),
            key: key_of(target),
        }
    }

    /// Name and value of each label, in the order they are written.
    pub fn pairs(&self) -> Vec<(&'static str, &str)> {
        let mut pairs = vec![("volume", self.volume.as_str())];
        if let Some(pod) = &self.pod {
            pairs.push(("pod", pod.as_str()));
        }
        pairs.push(("key", self.key.as_str()));
        pairs
    }

    /// The label set of a sample, `{volume="...",...}`, values escaped (OpenMetrics).
    fn label_set(&self) -> String {
        let set: Vec<String> = self
            .pairs()
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", escape_label_value(v)))
            .collect();
        format!("{{{}}}", set.join(","))
    }
}

/// See the module documentation.
pub struct MetricsProxy {
    state_dir: PathBuf,
    /// Per volume key: the daemon pid last seen and the restarts counted.
    seen: Mutex<HashMap<String, (u32, u64)>>,
}

impl MetricsProxy {
    /// A proxy for the daemons of the volumes recorded under `state_dir`.
    pub fn new(state_dir: &Path) -> MetricsProxy {
        MetricsProxy {
            state_dir: state_dir.to_path_buf(),
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// The published volumes with a daemon, sorted by target.
    fn records(&self) -> Vec<Record> {
        let dir = self.state_dir.join("volumes");
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) => {
                tracing::debug!(dir = %dir.display(), error = %e, "no volume records");
                return Vec::new();
            }
        };
        let mut out: Vec<Record> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("json"))
            .filter_map(|p| {
                let bytes = std::fs::read(&p).ok()?;
                serde_json::from_slice::<Record>(&bytes)
                    .map_err(|_| tracing::debug!(path = %p.display(), "unreadable volume record"))
                    .ok()
            })
            .filter(|r| r.daemon.is_some())
            .collect();
        out.sort_by(|a, b| a.target.cmp(&b.target));
        out
    }

    /// Every volume daemon's metrics with its labels, and the mounter's own series, in the
    /// OpenMetrics text format (`# EOF` included).
    pub async fn render(&self) -> String {
        let started = Instant::now();
        let records = self.records();
        let mut asks = JoinSet::new();
        for (i, record) in records.iter().enumerate() {
            let socket = control_socket_path(&record.target);
            asks.spawn(async move {
                let answer = tokio::time::timeout(DAEMON_TIMEOUT, ask_metrics(&socket)).await;
                let answer = match answer {
                    Ok(Ok(a)) => Ok(a),
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err(format!("no answer within {} s", DAEMON_TIMEOUT.as_secs())),
                };
                (i, answer)
            });
        }
        let mut answers: Vec<Option<Result<DaemonMetrics, String>>> =
            (0..records.len()).map(|_| None).collect();
        while let Some(done) = asks.join_next().await {
            if let Ok((i, answer)) = done {
                answers[i] = Some(answer);
            }
        }
        let mut merged = Merged::default();
        let mut up = Vec::new();
        let mut restarts = Vec::new();
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let keys: HashSet<String> = records.iter().map(|r| key_of(&r.target)).collect();
        seen.retain(|k, _| keys.contains(k));
        for (record, answer) in records.iter().zip(answers) {
            let labels =
                VolumeLabels::new(&record.volume_id, record.pod.as_deref(), &record.target);
            let answered = match answer {
                Some(Ok(metrics)) => {
                    merged.add(&metrics.text);
                    let entry = seen.entry(labels.key.clone()).or_insert((metrics.pid, 0));
                    if entry.0 != metrics.pid {
                        *entry = (metrics.pid, entry.1 + 1);
                    }
                    true
                }
                Some(Err(e)) => {
                    tracing::debug!(volume = %labels.volume, key = %labels.key, error = %e, "a volume daemon gave no metrics");
                    false
                }
                None => false,
            };
            let count = seen.get(&labels.key).map_or(0, |s| s.1);
            up.push((labels.clone(), u64::from(answered)));
            restarts.push((labels, count));
        }
        drop(seen);
        let mut out = merged.finish();
        family(
            &mut out,
            "riffle_mounter_volumes",
            "gauge",
            "Published volumes with a daemon on this node.",
            &[(None, records.len() as u64)],
        );
        let up: Vec<_> = up.iter().map(|(l, v)| (Some(l), *v)).collect();
        family(
            &mut out,
            "riffle_mounter_volume_up",
            "gauge",
            "1 if the volume's daemon answered this scrape, else 0.",
            &up,
        );
        let restarts: Vec<_> = restarts.iter().map(|(l, v)| (Some(l), *v)).collect();
        family(
            &mut out,
            "riffle_mounter_daemon_restarts",
            "counter",
            "Daemons of the volume replaced by a successor (a new pid) as this mounter saw them.",
            &restarts,
        );
        family(
            &mut out,
            "riffle_mounter_peer_port_conflicts",
            "counter",
            "Daemons that could not serve their ring's peer port on this node (another volume's daemon or another program holds it); they mount and ask their peers all the same.",
            &[(None, crate::mounter::peers::PORT_CONFLICTS.load(std::sync::atomic::Ordering::Relaxed))],
        );
        let _ = writeln!(
            out,
            "# TYPE riffle_mounter_scrape_duration_seconds gauge\n# UNIT riffle_mounter_scrape_duration_seconds seconds\n# HELP riffle_mounter_scrape_duration_seconds Time this scrape took to gather the daemons' metrics.\nriffle_mounter_scrape_duration_seconds {:.6}",
            started.elapsed().as_secs_f64()
        );
        out.push_str("# EOF\n");
        out
    }
}

/// Appends one family of the mounter's own: `counter` samples get `_total`.
fn family(
    out: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    samples: &[(Option<&VolumeLabels>, u64)],
) {
    let _ = writeln!(out, "# TYPE {name} {kind}\n# HELP {name} {help}");
    let suffix = if kind == "counter" { "_total" } else { "" };
    for (labels, value) in samples {
        let set = labels.map(VolumeLabels::label_set).unwrap_or_default();
        let _ = writeln!(out, "{name}{suffix}{set} {value}");
    }
}

/// A daemon's answer to `metrics`.
#[derive(Debug, Deserialize)]
struct DaemonMetrics {
    pid: u32,
    text: String,
}

/// Asks the daemon listening on `socket` for its metrics.
async fn ask_metrics(socket: &Path) -> Result<DaemonMetrics, String> {
    let mut stream = UnixStream::connect(socket)
        .await
        .map_err(|e| format!("cannot connect to {}: {e}", socket.display()))?;
    stream
        .write_all(b"metrics\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut line = Vec::new();
    BufReader::new(stream.take(MAX_ANSWER + 1))
        .read_until(b'\n', &mut line)
        .await
        .map_err(|e| e.to_string())?;
    if line.len() as u64 > MAX_ANSWER {
        return Err(format!("an answer longer than {MAX_ANSWER} bytes"));
    }
    let value: serde_json::Value =
        serde_json::from_slice(&line).map_err(|_| "an unreadable answer".to_string())?;
    if let Some(error) = value.get("error").and_then(|e| e.as_str()) {
        // An older daemon: "unknown command 'metrics'".
        return Err(error.to_string());
    }
    serde_json::from_value(value).map_err(|_| "an answer without metrics".to_string())
}

/// The key of a target path, as [`crate::node_state::state::StateStore::key`] names it.
fn key_of(target: &Path) -> String {
    crate::node_state::state::StateStore::key(target)
}

/// Where the daemon mounted at `mountpoint` listens for control commands: riffle's own
/// rule (the daemons run with the mounter's user and environment).
pub use rifflefs::control::socket_path as control_socket_path;

/// Several daemons' OpenMetrics texts put together into one (module documentation).
#[derive(Debug, Default)]
pub struct Merged {
    order: Vec<String>,
    families: HashMap<String, Family>,
}

/// One family being merged: its descriptor lines (the first daemon's) and every daemon's
/// sample lines.
#[derive(Debug, Default)]
struct Family {
    descriptors: Vec<String>,
    /// The `# TYPE` line, which another daemon's must match.
    kind: Option<String>,
    samples: Vec<String>,
}

impl Merged {
    /// Adds one daemon's text (up to its `# EOF`).
    pub fn add(&mut self, text: &str) {
        // This daemon's families in its order: name, descriptor lines, sample lines.
        let mut parts: Vec<(String, Vec<String>, Vec<String>)> = Vec::new();
        let mut current: Option<String> = None;
        for line in text.lines().map(str::trim_end) {
            if line == "# EOF" {
                break;
            }
            if line.is_empty() {
                continue;
            }
            if let Some(rest) = line.strip_prefix("# ") {
                let mut words = rest.splitn(3, ' ');
                let (Some("HELP" | "TYPE" | "UNIT"), Some(name)) = (words.next(), words.next())
                else {
                    continue;
                };
                if current.as_deref() != Some(name) {
                    parts.push((name.to_string(), Vec::new(), Vec::new()));
                    current = Some(name.to_string());
                }
                if let Some(part) = parts.last_mut() {
                    part.1.push(line.to_string());
                }
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            if current.is_none() {
                // A sample without descriptors: a family of its own name.
                let end = line.find(['{', ' ']).unwrap_or(line.len());
                parts.push((line[..end].to_string(), Vec::new(), Vec::new()));
            }
            if let Some(part) = parts.last_mut() {
                part.2.push(line.to_string());
            }
        }
        for (name, descriptors, samples) in parts {
            let kind = descriptors
                .iter()
                .find(|d| d.starts_with("# TYPE "))
                .cloned();
            let family = self.families.entry(name.clone()).or_insert_with(|| {
                self.order.push(name.clone());
                Family {
                    descriptors,
                    kind: kind.clone(),
                    samples: Vec::new(),
                }
            });
            if family.kind != kind {
                tracing::debug!(family = %name, merged = ?family.kind, this = ?kind, "a family of another type; its samples are left out");
                continue;
            }
            family.samples.extend(samples);
        }
    }

    /// The merged text, families in the order they were first seen, without `# EOF`.
    pub fn finish(self) -> String {
        let mut out = String::new();
        let mut families = self.families;
        for name in &self.order {
            let Some(f) = families.remove(name) else {
                continue;
            };
            for line in f.descriptors.iter().chain(&f.samples) {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }
}

/// Escapes a label value (OpenMetrics: backslash, double quote, newline).
fn escape_label_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A running endpoint; dropping it stops it (listener and connections).
pub type MetricsEndpoint = HttpServer;

const INDEX: &str = "<!DOCTYPE html>\n<html><head><title>riffle-mounter</title></head><body><p><a href=\"/metrics\">metrics</a></p></body></html>\n";

/// Binds `addr` and serves `GET /metrics` from `proxy` on `rifflefs::http_server` (module
/// documentation for the bounds).
pub async fn serve(
    addr: SocketAddr,
    proxy: Arc<MetricsProxy>,
) -> Result<MetricsEndpoint, MetricsProxyError> {
    let limits = ServerLimits {
        header_timeout: REQUEST_TIMEOUT,
        max_header_bytes: Some(MAX_REQUEST),
        max_connections: MAX_CONNECTIONS,
        connection_lifetime: None,
    };
    let handler = move |req| answer(req, proxy.clone());
    let server = http_server::serve(addr, limits, "mounter metrics endpoint", handler)
        .map_err(|source| MetricsProxyError::Bind { addr, source })?;
    tracing::info!(
        "serving the volumes' Prometheus metrics on http://{}/metrics",
        server.local_addr()
    );
    Ok(server)
}

/// Answers one request; every answer closes its connection.
async fn answer<B>(req: Request<B>, proxy: Arc<MetricsProxy>) -> Response<Full<Bytes>> {
    let readable = matches!(*req.method(), Method::GET | Method::HEAD);
    let mut response = match req.uri().path() {
        "/metrics" | "/" if !readable => {
            let mut r = respond(
                StatusCode::METHOD_NOT_ALLOWED,
                "text/plain",
                "GET or HEAD\n".into(),
            );
            r.headers_mut()
                .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
            r
        }
        "/metrics" => respond(StatusCode::OK, CONTENT_TYPE, proxy.render().await),
        "/" => respond(StatusCode::OK, "text/html; charset=utf-8", INDEX.into()),
        _ => respond(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    };
    let headers = response.headers_mut();
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(CONNECTION, HeaderValue::from_static("close"));
    response
}

fn respond(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT, HeaderValue::from_static(content_type));
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpStream;

    /// A daemon's text as `riffle mount --metrics-label` writes it: `labels` (a label set's
    /// inside, `volume="..",...`) first in every sample's label set.
    fn daemon(labels: &str) -> String {
        format!(
            "# HELP riffle_build The riffle version serving this mount.\n\
# TYPE riffle_build info\n\
riffle_build_info{{{labels},version=\"0.1.0\"}} 1\n\
# HELP riffle_store_get_requests Ranged GET requests sent to the object store.\n\
# TYPE riffle_store_get_requests counter\n\
riffle_store_get_requests_total{{{labels}}} 7\n\
# HELP riffle_fuse_op_duration_seconds FUSE operation latency.\n\
# TYPE riffle_fuse_op_duration_seconds histogram\n\
# UNIT riffle_fuse_op_duration_seconds seconds\n\
riffle_fuse_op_duration_seconds_sum{{{labels},op=\"read\"}} 0.5\n\
riffle_fuse_op_duration_seconds_count{{{labels},op=\"read\"}} 3\n\
riffle_fuse_op_duration_seconds_bucket{{{labels},le=\"0.001\",op=\"read\"}} 1\n\
riffle_fuse_op_duration_seconds_bucket{{{labels},le=\"+Inf\",op=\"read\"}} 3\n\
# EOF\n"
        )
    }

    #[test]
    fn the_mounters_own_labels_are_escaped() {
        assert_eq!(escape_label_value("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
        let labels = VolumeLabels::new("v1", Some("ns/we\"ird\\\n"), Path::new("/t"));
        let key = key_of(Path::new("/t"));
        assert_eq!(
            labels.label_set(),
            format!("{{volume=\"v1\",pod=\"ns/we\\\"ird\\\\\\n\",key=\"{key}\"}}")
        );
    }

    #[test]
    fn two_daemons_merge_with_descriptors_once() {
        let mut merged = Merged::default();
        merged.add(&daemon("volume=\"vol-a\",pod=\"ml/trainer-0\",key=\"ka\""));
        merged.add(&daemon("volume=\"vol-b\",key=\"kb\""));
        let text = merged.finish();
        for descriptor in [
            "# TYPE riffle_store_get_requests counter",
            "# HELP riffle_store_get_requests Ranged GET requests sent to the object store.",
            "# TYPE riffle_fuse_op_duration_seconds histogram",
            "# UNIT riffle_fuse_op_duration_seconds seconds",
            "# TYPE riffle_build info",
        ] {
            assert_eq!(
                text.lines().filter(|l| *l == descriptor).count(),
                1,
                "{descriptor} in\n{text}"
            );
        }
        assert!(!text.contains("# EOF"));
        assert!(text.contains(
            "riffle_store_get_requests_total{volume=\"vol-a\",pod=\"ml/trainer-0\",key=\"ka\"} 7\n"
        ));
        assert!(text.contains("riffle_store_get_requests_total{volume=\"vol-b\",key=\"kb\"} 7\n"));
        assert!(text.contains(
            "riffle_fuse_op_duration_seconds_bucket{volume=\"vol-b\",key=\"kb\",le=\"+Inf\",op=\"read\"} 3\n"
        ));
        // Each family's samples follow its own descriptors, both volumes together.
        let lines: Vec<&str> = text.lines().collect();
        let at = |s: &str| lines.iter().position(|l| *l == s).expect(s);
        let type_get = at("# TYPE riffle_store_get_requests counter");
        let type_hist = at("# TYPE riffle_fuse_op_duration_seconds histogram");
        for (i, l) in lines.iter().enumerate() {
            if l.starts_with("riffle_store_get_requests_total") {
                assert!(i > type_get && i < type_hist, "{l} out of its family");
            }
        }
        assert_eq!(
            lines
                .iter()
                .filter(|l| l.starts_with("riffle_store_get_requests_total"))
                .count(),
            2
        );
    }

    #[test]
    fn a_family_of_another_type_keeps_the_first_daemons_samples() {
        let mut merged = Merged::default();
        merged.add(
            "# TYPE m gauge\nm{volume=\"a\",key=\"ka\"} 1\n# TYPE n gauge\nn{volume=\"a\",key=\"ka\"} 1\n# EOF\n",
        );
        merged.add(
            "# TYPE m counter\nm_total{volume=\"b\",key=\"kb\"} 2\n# TYPE n gauge\nn{volume=\"b\",key=\"kb\"} 2\n# EOF\n",
        );
        let text = merged.finish();
        assert_eq!(
            text,
            "# TYPE m gauge\nm{volume=\"a\",key=\"ka\"} 1\n# TYPE n gauge\nn{volume=\"a\",key=\"ka\"} 1\nn{volume=\"b\",key=\"kb\"} 2\n"
        );
    }

    #[test]
    fn untyped_samples_become_families_of_their_own() {
        let mut merged = Merged::default();
        merged.add("x{volume=\"a\",key=\"k\"} 1\ny{volume=\"a\",key=\"k\",a=\"1\"} 2\n");
        assert_eq!(
            merged.finish(),
            "x{volume=\"a\",key=\"k\"} 1\ny{volume=\"a\",key=\"k\",a=\"1\"} 2\n"
        );
    }

    #[tokio::test]
    async fn without_records_only_the_mounters_series_are_served() {
        let dir = tempfile::tempdir().expect("tempdir");
        let proxy = MetricsProxy::new(dir.path());
        let text = proxy.render().await;
        assert!(text.contains("riffle_mounter_volumes 0\n"), "{text}");
        assert!(text.ends_with("# EOF\n"));
        // A record whose daemon does not answer: up 0, its labels from the record.
        std::fs::create_dir_all(dir.path().join("volumes")).expect("mkdir");
        std::fs::write(
            dir.path().join("volumes/x.json"),
            r#"{"volume_id":"vol-1","target":"/nonexistent/t","pod":"ml/p","daemon":{"pid":1,"start_time":2},"settings":{}}"#,
        )
        .expect("write");
        let text = proxy.render().await;
        let key = key_of(Path::new("/nonexistent/t"));
        assert!(text.contains("riffle_mounter_volumes 1\n"), "{text}");
        assert!(
            text.contains(&format!(
                "riffle_mounter_volume_up{{volume=\"vol-1\",pod=\"ml/p\",key=\"{key}\"}} 0\n"
            )),
            "{text}"
        );
    }

    #[tokio::test]
    async fn the_endpoint_answers_http() {
        let dir = tempfile::tempdir().expect("tempdir");
        let endpoint = serve(
            "127.0.0.1:0".parse().expect("addr"),
            Arc::new(MetricsProxy::new(dir.path())),
        )
        .await
        .expect("serve");
        let addr = endpoint.local_addr();
        let get = |path: &'static str| async move {
            let mut s = TcpStream::connect(addr).await.expect("connect");
            s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                .await
                .expect("write");
            let mut out = String::new();
            s.read_to_string(&mut out).await.expect("read");
            out
        };
        let ok = get("/metrics").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains("application/openmetrics-text"));
        assert!(ok.ends_with("# EOF\n"));
        assert!(get("/nope").await.starts_with("HTTP/1.1 404"));
    }
}
