//! `riffle-mounter --metrics-addr HOST:PORT`: every volume daemon's Prometheus metrics on one
//! port, each series labelled with its volume.
//!
//! The daemons under the mounter share the node's network (the mounter runs with
//! `hostNetwork`), so they open no port of their own: on each scrape ([`MetricsProxy::render`])
//! the mounter reads the plugin's volume records (`STATE/volumes/*.json`, read only: the
//! plugin's records are the truth), asks the daemon of each published one for its metrics over
//! its control socket (the `metrics` command: `{"pid": PID, "text": "<OpenMetrics text>"}`,
//! the same text `riffle mount --metrics-addr` serves), and merges the answers
//! ([`Merged`]): every sample line gets the labels `volume` (the CSI volume id), `pod`
//! (`namespace/name`, when kubelet passed the pod's name: `podInfoOnMount`) and `key` (the
//! target's key, as in the `[volume <key>]` log lines; it keeps two publishes of one volume
//! apart); the `# HELP`, `# TYPE` and `# UNIT` lines of a family are written once, with the
//! samples of every volume under them. Labels a daemon already has are kept (one named like
//! ours becomes `exported_<name>`, as Prometheus does), label values are escaped.
//!
//! The mounter adds series of its own: `riffle_mounter_volumes` (published volumes with a
//! daemon), `riffle_mounter_volume_up` (1 when the volume's daemon answered this scrape) and
//! `riffle_mounter_daemon_restarts_total` (daemon processes replaced under the volume's keeper
//! as this mounter saw them between scrapes: a new pid; a restart and a second one between two
//! scrapes count once), and `riffle_mounter_peer_port_conflicts_total` ([`crate::peers`]).
//!
//! Bounds: daemons are asked in parallel, each within [`DAEMON_TIMEOUT`], and an answer longer
//! than [`MAX_ANSWER`] is dropped; the HTTP side ([`serve`]) serves a fixed number of
//! connections at once, reads at most [`MAX_REQUEST`] bytes of a request within
//! [`REQUEST_TIMEOUT`], answers one request per connection and closes it. Nothing secret is in
//! the output: daemon metrics hold counters only, and the records' settings are not read.

use serde::Deserialize;
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// How long one daemon may take to answer.
pub const DAEMON_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest answer read from a daemon.
pub const MAX_ANSWER: u64 = 16 << 20;
/// Longest HTTP request (line and headers) read.
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
        source: std::io::Error,
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

/// A volume's labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeLabels {
    pub volume: String,
    pub pod: Option<String>,
    pub key: String,
}

impl VolumeLabels {
    fn pairs(&self) -> Vec<(&'static str, &str)> {
        let mut pairs = vec![("volume", self.volume.as_str())];
        if let Some(pod) = &self.pod {
            pairs.push(("pod", pod.as_str()));
        }
        pairs.push(("key", self.key.as_str()));
        pairs
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
            let labels = VolumeLabels {
                volume: record.volume_id.clone(),
                pod: record.pod.clone().filter(|p| !p.is_empty()),
                key: key_of(&record.target),
            };
            let answered = match answer {
                Some(Ok(metrics)) => {
                    merged.add(&metrics.text, &labels);
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
            &[(None, crate::peers::PORT_CONFLICTS.load(std::sync::atomic::Ordering::Relaxed))],
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
        let sample = format!("{name}{suffix} {value}");
        let line = match labels {
            Some(l) => add_labels(&sample, &l.pairs()).unwrap_or(sample),
            None => sample,
        };
        out.push_str(&line);
        out.push('\n');
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

/// The key of a target path, as [`crate::state::StateStore::key`] names it.
fn key_of(target: &Path) -> String {
    crate::state::StateStore::key(target)
}

/// Where the daemon mounted at `mountpoint` listens for control commands: riffle's own
/// rule (the daemons run with the mounter's user and environment).
pub use rifflefs::control::socket_path as control_socket_path;

/// One metric family being merged.
#[derive(Debug, Default)]
struct Family {
    /// `# TYPE`, `# HELP`, `# UNIT` lines, from the first daemon that had the family.
    descriptors: Vec<String>,
    kind: Option<String>,
    samples: Vec<String>,
}

/// Several daemons' OpenMetrics texts merged into one (module documentation).
#[derive(Debug, Default)]
pub struct Merged {
    order: Vec<String>,
    families: HashMap<String, Family>,
}

/// Suffixes a sample's name may add to its family's (OpenMetrics).
const SUFFIXES: &[&str] = &[
    "_total", "_created", "_bucket", "_count", "_sum", "_info", "_gcount", "_gsum",
];

impl Merged {
    /// Adds one daemon's text, every sample labelled with `labels`. Lines that cannot be
    /// parsed are dropped; a family whose type differs from the one already merged (daemons
    /// of different versions) keeps the first daemon's samples only.
    pub fn add(&mut self, text: &str, labels: &VolumeLabels) {
        let pairs = labels.pairs();
        for parsed in parse_families(text) {
            let family = match self.families.get_mut(&parsed.name) {
                Some(f) if f.kind == parsed.kind => f,
                Some(f) => {
                    tracing::debug!(family = %parsed.name, merged = ?f.kind, this = ?parsed.kind, "a family of another type; its samples are left out");
                    continue;
                }
                None => {
                    self.order.push(parsed.name.clone());
                    self.families.entry(parsed.name.clone()).or_insert(Family {
                        descriptors: parsed.descriptors.iter().map(|d| d.to_string()).collect(),
                        kind: parsed.kind.clone(),
                        samples: Vec::new(),
                    })
                }
            };
            family
                .samples
                .extend(parsed.samples.iter().filter_map(|s| add_labels(s, &pairs)));
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
            for d in &f.descriptors {
                out.push_str(d);
                out.push('\n');
            }
            for s in &f.samples {
                out.push_str(s);
                out.push('\n');
            }
        }
        out
    }
}

/// One family of a daemon's text.
struct Parsed<'a> {
    name: String,
    kind: Option<String>,
    descriptors: Vec<&'a str>,
    samples: Vec<&'a str>,
}

impl Parsed<'_> {
    /// A family with nothing in it yet.
    fn named(name: &str) -> Self {
        Parsed {
            name: name.to_string(),
            kind: None,
            descriptors: Vec::new(),
            samples: Vec::new(),
        }
    }
}

/// Splits an OpenMetrics (or Prometheus) text into its families: a `# HELP`, `# TYPE` or
/// `# UNIT` line of a new name starts one; a sample whose name is not the current family's
/// (or that name with an OpenMetrics suffix) starts an untyped family of its own.
fn parse_families(text: &str) -> Vec<Parsed<'_>> {
    let mut out: Vec<Parsed<'_>> = Vec::new();
    for line in text.lines() {
        let line = line.trim_end();
        if line == "# EOF" {
            break;
        }
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let mut words = rest.splitn(3, ' ');
            let (Some(what @ ("HELP" | "TYPE" | "UNIT")), Some(name)) =
                (words.next(), words.next())
            else {
                continue;
            };
            if out.last().is_none_or(|f| f.name != name) {
                out.push(Parsed::named(name));
            }
            if let Some(f) = out.last_mut() {
                if what == "TYPE" {
                    f.kind = words.next().map(|k| k.trim().to_string());
                }
                f.descriptors.push(line);
            }
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let name = sample_name(line);
        if name.is_empty() {
            continue;
        }
        let belongs = out.last().is_some_and(|f| {
            name == f.name
                || name
                    .strip_prefix(f.name.as_str())
                    .is_some_and(|s| SUFFIXES.contains(&s))
        });
        if !belongs {
            out.push(Parsed::named(name));
        }
        if let Some(f) = out.last_mut() {
            f.samples.push(line);
        }
    }
    out
}

/// The metric name a sample line starts with.
fn sample_name(line: &str) -> &str {
    let end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .unwrap_or(line.len());
    &line[..end]
}

/// Escapes a label value (OpenMetrics: backslash, double quote, newline).
pub fn escape_label_value(value: &str) -> String {
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

/// `line` (a sample: `name{labels} value ...` or `name value ...`) with `labels` put first in
/// its label set; an existing label with one of their names is renamed `exported_<name>`.
/// None if the line's label set is malformed.
pub fn add_labels(line: &str, labels: &[(&str, &str)]) -> Option<String> {
    let name = sample_name(line);
    if name.is_empty() {
        return None;
    }
    let rest = &line[name.len()..];
    let mut set: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape_label_value(v)))
        .collect();
    let after = if let Some(inner) = rest.strip_prefix('{') {
        let (existing, after) = parse_label_set(inner)?;
        for (k, raw) in existing {
            let k = if labels.iter().any(|(ours, _)| *ours == k) {
                format!("exported_{k}")
            } else {
                k.to_string()
            };
            set.push(format!("{k}=\"{raw}\""));
        }
        after
    } else {
        rest
    };
    Some(format!("{name}{{{}}}{after}", set.join(",")))
}

/// Parses `a="x",b="y"} rest` (after the `{`): the labels with their raw (still escaped)
/// values, and what follows the `}`.
fn parse_label_set(s: &str) -> Option<(Vec<(&str, &str)>, &str)> {
    let mut labels = Vec::new();
    let mut rest = s.trim_start();
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            return Some((labels, after));
        }
        let eq = rest.find('=')?;
        let key = rest[..eq].trim();
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return None;
        }
        let value_start = rest[eq + 1..].trim_start().strip_prefix('"')?;
        let mut end = None;
        let mut escaped = false;
        for (i, c) in value_start.char_indices() {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                end = Some(i);
                break;
            }
        }
        let end = end?;
        labels.push((key, &value_start[..end]));
        rest = value_start[end + 1..].trim_start();
        if let Some(after) = rest.strip_prefix(',') {
            rest = after.trim_start();
        } else if !rest.starts_with('}') {
            return None;
        }
    }
}

/// A running endpoint; dropping it stops accepting.
#[derive(Debug)]
pub struct MetricsEndpoint {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl MetricsEndpoint {
    /// The address actually bound (port 0 picks one).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsEndpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Binds `addr` and serves `GET /metrics` from `proxy` (module documentation for the bounds).
pub async fn serve(
    addr: SocketAddr,
    proxy: Arc<MetricsProxy>,
) -> Result<MetricsEndpoint, MetricsProxyError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| MetricsProxyError::Bind { addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| MetricsProxyError::Bind { addr, source })?;
    tracing::info!("serving the volumes' Prometheus metrics on http://{local}/metrics");
    let task = tokio::spawn(accept_loop(listener, proxy));
    Ok(MetricsEndpoint { addr: local, task })
}

async fn accept_loop(listener: TcpListener, proxy: Arc<MetricsProxy>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::debug!(error = %e, "metrics accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue; // too many at once: closed
        };
        let proxy = proxy.clone();
        tokio::spawn(async move {
            let _slot = slot;
            if let Err(e) = answer(stream, &proxy).await {
                tracing::debug!(error = %e, "metrics request failed");
            }
        });
    }
}

/// Reads one request and answers it.
async fn answer(mut stream: TcpStream, proxy: &MetricsProxy) -> std::io::Result<()> {
    let head = match tokio::time::timeout(REQUEST_TIMEOUT, read_head(&mut stream)).await {
        Ok(Ok(Some(head))) => head,
        Ok(Ok(None)) => {
            return respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                "text/plain",
                "request too large\n",
                false,
            )
            .await
        }
        Ok(Err(e)) => return Err(e),
        Err(_) => return Ok(()),
    };
    let mut parts = head.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => {
            let body = proxy.render().await;
            respond(&mut stream, "200 OK", CONTENT_TYPE, &body, method == "HEAD").await
        }
        ("GET" | "HEAD", "/") => {
            let index = "<!DOCTYPE html>\n<html><head><title>riffle-mounter</title></head><body><p><a href=\"/metrics\">metrics</a></p></body></html>\n";
            respond(
                &mut stream,
                "200 OK",
                "text/html; charset=utf-8",
                index,
                method == "HEAD",
            )
            .await
        }
        (_, "/metrics" | "/") => {
            respond(
                &mut stream,
                "405 Method Not Allowed",
                "text/plain",
                "GET or HEAD\n",
                false,
            )
            .await
        }
        _ => {
            respond(
                &mut stream,
                "404 Not Found",
                "text/plain",
                "not found\n",
                false,
            )
            .await
        }
    }
}

/// The request line and headers (up to the blank line); None if longer than [`MAX_REQUEST`].
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<String>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(Some(String::from_utf8_lossy(&buf).into_owned()));
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.windows(2).any(|w| w == b"\n\n") {
            return Ok(Some(String::from_utf8_lossy(&buf).into_owned()));
        }
        if buf.len() > MAX_REQUEST {
            return Ok(None);
        }
    }
}

async fn respond(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &str,
    head_only: bool,
) -> std::io::Result<()> {
    let header = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(header.as_bytes()).await?;
    if !head_only {
        stream.write_all(body.as_bytes()).await?;
    }
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(volume: &str, pod: Option<&str>, key: &str) -> VolumeLabels {
        VolumeLabels {
            volume: volume.into(),
            pod: pod.map(str::to_string),
            key: key.into(),
        }
    }

    const DAEMON: &str = "# HELP riffle_build The riffle version serving this mount.\n\
# TYPE riffle_build info\n\
riffle_build_info{version=\"0.1.0\"} 1\n\
# HELP riffle_store_get_requests Ranged GET requests sent to the object store.\n\
# TYPE riffle_store_get_requests counter\n\
riffle_store_get_requests_total 7\n\
# HELP riffle_fuse_op_duration_seconds FUSE operation latency.\n\
# TYPE riffle_fuse_op_duration_seconds histogram\n\
# UNIT riffle_fuse_op_duration_seconds seconds\n\
riffle_fuse_op_duration_seconds_sum{op=\"read\"} 0.5\n\
riffle_fuse_op_duration_seconds_count{op=\"read\"} 3\n\
riffle_fuse_op_duration_seconds_bucket{le=\"0.001\",op=\"read\"} 1\n\
riffle_fuse_op_duration_seconds_bucket{le=\"+Inf\",op=\"read\"} 3\n\
# EOF\n";

    #[test]
    fn labels_go_first_and_existing_ones_are_kept() {
        let pairs = [("volume", "v1"), ("key", "k")];
        assert_eq!(
            add_labels("m_total 3", &pairs).as_deref(),
            Some("m_total{volume=\"v1\",key=\"k\"} 3")
        );
        assert_eq!(
            add_labels("h_bucket{le=\"0.5\",op=\"read\"} 2 1700000000", &pairs).as_deref(),
            Some("h_bucket{volume=\"v1\",key=\"k\",le=\"0.5\",op=\"read\"} 2 1700000000")
        );
        assert_eq!(
            add_labels("m{} 1", &pairs).as_deref(),
            Some("m{volume=\"v1\",key=\"k\"} 1")
        );
    }

    #[test]
    fn a_label_named_like_ours_is_exported_and_escapes_survive() {
        let pairs = [("volume", "v1")];
        assert_eq!(
            add_labels("m{volume=\"a\\\"b,}\",x=\"y\"} 1", &pairs).as_deref(),
            Some("m{volume=\"v1\",exported_volume=\"a\\\"b,}\",x=\"y\"} 1")
        );
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label_value("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
        let line = add_labels("m 1", &[("pod", "ns/we\"ird\\\n")]).expect("line");
        assert_eq!(line, "m{pod=\"ns/we\\\"ird\\\\\\n\"} 1");
    }

    #[test]
    fn malformed_label_sets_are_dropped() {
        assert_eq!(add_labels("m{a=\"x\" 1", &[("v", "1")]), None);
        assert_eq!(add_labels("m{a=x} 1", &[("v", "1")]), None);
        assert_eq!(add_labels("m{a=\"x\"b=\"y\"} 1", &[("v", "1")]), None);
        assert_eq!(add_labels("{a=\"x\"} 1", &[("v", "1")]), None);
    }

    #[test]
    fn two_daemons_merge_with_descriptors_once() {
        let mut merged = Merged::default();
        merged.add(DAEMON, &labels("vol-a", Some("ml/trainer-0"), "ka"));
        merged.add(DAEMON, &labels("vol-b", None, "kb"));
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
            "# TYPE m gauge\nm 1\n# TYPE n gauge\nn 1\n# EOF\n",
            &labels("a", None, "ka"),
        );
        merged.add(
            "# TYPE m counter\nm_total 2\n# TYPE n gauge\nn 2\n# EOF\n",
            &labels("b", None, "kb"),
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
        merged.add("x 1\ny{a=\"1\"} 2\n", &labels("a", None, "k"));
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
