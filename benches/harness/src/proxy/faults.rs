//! Fault rules: what can go wrong, when, and for which requests.
//!
//! A [`FaultRule`] names one fault ([`FaultKind`]), a trigger (a probability,
//! every Nth matching request, or — with neither — every matching request),
//! an optional filter (method, request kind, substring of `bucket/key`), an
//! optional `limit` on how often it fires, and the fault's own parameter
//! (`after_bytes`, `ms`, `bytes_per_sec`). Rules are plain JSON, the same
//! shape on the control endpoint and on the command line; the command line
//! also takes a compact `kind,name=value,...` form ([`FaultRule::parse`]).
//!
//! [`FaultSet`] holds the active rules. For every request it walks them in
//! order and returns a [`Decision`]: each rule whose filter matches counts the
//! request (`matched`), and fires when its trigger says so and its limit is
//! not reached (`fired`). An `http500`/`slowdown503` that fires ends the walk
//! (the request is answered by the proxy). `stall`s add up, the slowest
//! `trickle` wins, and the first body cut (`reset_mid_body`/`truncate_body`)
//! wins; body-cut rules do not see `HEAD` requests.

use std::str::FromStr;
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::classify::RequestKind;

/// The faults the proxy can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// Answer `500 Internal Server Error` (S3 XML `InternalError`) without
    /// asking the upstream.
    Http500,
    /// Answer `503 Slow Down` (S3 XML `SlowDown`) without asking the upstream.
    Slowdown503,
    /// Send part of the response body, then reset the connection (RST).
    ResetMidBody,
    /// Send the upstream's `Content-Length` but only part of the body, then
    /// close the connection (FIN).
    TruncateBody,
    /// Hold the response head back for `ms` more milliseconds.
    Stall,
    /// Send the response body at `bytes_per_sec`.
    Trickle,
}

impl FaultKind {
    /// Every kind, in reporting order.
    pub const ALL: [FaultKind; 6] = [
        FaultKind::Http500,
        FaultKind::Slowdown503,
        FaultKind::ResetMidBody,
        FaultKind::TruncateBody,
        FaultKind::Stall,
        FaultKind::Trickle,
    ];

    /// The snake_case name used in JSON and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::Http500 => "http500",
            FaultKind::Slowdown503 => "slowdown503",
            FaultKind::ResetMidBody => "reset_mid_body",
            FaultKind::TruncateBody => "truncate_body",
            FaultKind::Stall => "stall",
            FaultKind::Trickle => "trickle",
        }
    }

    fn is_body_cut(self) -> bool {
        matches!(self, FaultKind::ResetMidBody | FaultKind::TruncateBody)
    }
}

/// A fault rule could not be understood.
#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    /// The JSON did not have the rule's shape.
    #[error("bad fault rule JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The compact form was malformed.
    #[error("bad fault spec {spec:?}: {reason}")]
    Spec { spec: String, reason: String },
    /// The rule's fields contradict each other or are out of range.
    #[error("invalid {fault} rule: {reason}")]
    Invalid { fault: &'static str, reason: String },
}

/// One fault rule, as given in JSON.
///
/// ```json
/// {"fault": "reset_mid_body", "every_nth": 3, "kind": "get_range",
///  "key_contains": "shard-", "after_bytes": 65536, "limit": 10}
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultRule {
    /// Which fault.
    pub fault: FaultKind,
    /// Fire with this probability (0.0–1.0) per matching request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probability: Option<f64>,
    /// Fire on the Nth, 2Nth, … matching request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_nth: Option<u64>,
    /// Only requests with this method (case-insensitive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Only requests of this kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<RequestKind>,
    /// Only requests whose `bucket/key` path contains this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_contains: Option<String>,
    /// Stop firing after this many times.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// Body cuts: body bytes to send before cutting. Default: half the
    /// `Content-Length`. Never more than `Content-Length - 1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_bytes: Option<u64>,
    /// `stall`: milliseconds to hold the response head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ms: Option<u64>,
    /// `trickle`: body rate in bytes per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_sec: Option<u64>,
}

impl FaultRule {
    /// A rule for `fault` that fires on every request; refine it with the
    /// builder methods.
    pub fn new(fault: FaultKind) -> Self {
        FaultRule {
            fault,
            probability: None,
            every_nth: None,
            method: None,
            kind: None,
            key_contains: None,
            limit: None,
            after_bytes: None,
            ms: None,
            bytes_per_sec: None,
        }
    }

    /// `http500` on every matching request.
    pub fn http500() -> Self {
        Self::new(FaultKind::Http500)
    }

    /// `slowdown503` on every matching request.
    pub fn slowdown503() -> Self {
        Self::new(FaultKind::Slowdown503)
    }

    /// `reset_mid_body` on every matching request.
    pub fn reset_mid_body() -> Self {
        Self::new(FaultKind::ResetMidBody)
    }

    /// `truncate_body` on every matching request.
    pub fn truncate_body() -> Self {
        Self::new(FaultKind::TruncateBody)
    }

    /// `stall` of `ms` milliseconds on every matching request.
    pub fn stall(ms: u64) -> Self {
        FaultRule {
            ms: Some(ms),
            ..Self::new(FaultKind::Stall)
        }
    }

    /// `trickle` at `bytes_per_sec` on every matching request.
    pub fn trickle(bytes_per_sec: u64) -> Self {
        FaultRule {
            bytes_per_sec: Some(bytes_per_sec),
            ..Self::new(FaultKind::Trickle)
        }
    }

    /// Fire with probability `p`.
    pub fn with_probability(mut self, p: f64) -> Self {
        self.probability = Some(p);
        self
    }

    /// Fire on every `n`th matching request.
    pub fn with_every_nth(mut self, n: u64) -> Self {
        self.every_nth = Some(n);
        self
    }

    /// Only requests with `method`.
    pub fn with_method(mut self, method: &str) -> Self {
        self.method = Some(method.to_owned());
        self
    }

    /// Only requests of `kind`.
    pub fn with_kind(mut self, kind: RequestKind) -> Self {
        self.kind = Some(kind);
        self
    }

    /// Only requests whose path contains `needle`.
    pub fn with_key_contains(mut self, needle: &str) -> Self {
        self.key_contains = Some(needle.to_owned());
        self
    }

    /// Fire at most `n` times.
    pub fn with_limit(mut self, n: u64) -> Self {
        self.limit = Some(n);
        self
    }

    /// Body cuts: cut after `n` body bytes.
    pub fn with_after_bytes(mut self, n: u64) -> Self {
        self.after_bytes = Some(n);
        self
    }

    /// Checks that the fields fit together.
    pub fn validate(&self) -> Result<(), FaultError> {
        let invalid = |reason: &str| FaultError::Invalid {
            fault: self.fault.as_str(),
            reason: reason.to_owned(),
        };
        if let Some(p) = self.probability {
            if !(0.0..=1.0).contains(&p) {
                return Err(invalid("probability must be within 0.0..=1.0"));
            }
            if self.every_nth.is_some() {
                return Err(invalid("give probability or every_nth, not both"));
            }
        }
        if self.every_nth == Some(0) {
            return Err(invalid("every_nth must be at least 1"));
        }
        if self.after_bytes.is_some() && !self.fault.is_body_cut() {
            return Err(invalid(
                "after_bytes applies to reset_mid_body and truncate_body",
            ));
        }
        match (self.fault, self.ms) {
            (FaultKind::Stall, None) => return Err(invalid("stall needs ms")),
            (FaultKind::Stall, Some(_)) | (_, None) => {}
            (_, Some(_)) => return Err(invalid("ms applies to stall")),
        }
        match (self.fault, self.bytes_per_sec) {
            (FaultKind::Trickle, None | Some(0)) => {
                return Err(invalid("trickle needs bytes_per_sec of at least 1"))
            }
            (FaultKind::Trickle, Some(_)) | (_, None) => {}
            (_, Some(_)) => return Err(invalid("bytes_per_sec applies to trickle")),
        }
        Ok(())
    }

    /// Parses a rule from JSON (`{"fault":"stall","ms":5000}`) or from the
    /// compact form `stall,ms=5000,every_nth=2,kind=get_range`, and validates
    /// it.
    pub fn parse(spec: &str) -> Result<Self, FaultError> {
        let spec = spec.trim();
        let rule: FaultRule = if spec.starts_with('{') {
            serde_json::from_str(spec)?
        } else {
            serde_json::from_value(compact_to_json(spec)?)?
        };
        rule.validate()?;
        Ok(rule)
    }

    fn matches(&self, method: &str, kind: RequestKind, key: &str) -> bool {
        if kind == RequestKind::Head && self.fault.is_body_cut() {
            return false;
        }
        self.method
            .as_deref()
            .is_none_or(|m| m.eq_ignore_ascii_case(method))
            && self.kind.is_none_or(|k| k == kind)
            && self
                .key_contains
                .as_deref()
                .is_none_or(|needle| key.contains(needle))
    }
}

impl FromStr for FaultRule {
    type Err = FaultError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FaultRule::parse(s)
    }
}

/// Turns `kind,name=value,...` into the JSON object of a rule.
fn compact_to_json(spec: &str) -> Result<serde_json::Value, FaultError> {
    let bad = |reason: &str| FaultError::Spec {
        spec: spec.to_owned(),
        reason: reason.to_owned(),
    };
    let mut parts = spec.split(',').map(str::trim);
    let fault = parts
        .next()
        .filter(|f| !f.is_empty())
        .ok_or_else(|| bad("empty"))?;
    let mut map = serde_json::Map::new();
    map.insert("fault".into(), fault.into());
    for part in parts.filter(|p| !p.is_empty()) {
        let (name, value) = part
            .split_once('=')
            .ok_or_else(|| bad(&format!("{part:?} is not name=value")))?;
        let value = match name {
            "method" | "kind" | "key_contains" => serde_json::Value::from(value),
            "probability" => value
                .parse::<f64>()
                .map(serde_json::Value::from)
                .map_err(|_| bad("probability must be a number"))?,
            _ => value
                .parse::<u64>()
                .map(serde_json::Value::from)
                .map_err(|_| bad(&format!("{name} must be a whole number")))?,
        };
        map.insert(name.to_owned(), value);
    }
    Ok(serde_json::Value::Object(map))
}

/// Parses the body of `PUT /faults` / `POST /faults`: `{"faults":[rule,...]}`,
/// a bare array of rules, or a single rule object. Every rule is validated.
pub fn parse_rules_json(body: &[u8]) -> Result<Vec<FaultRule>, FaultError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Wrapped {
        faults: Vec<FaultRule>,
    }
    let value: serde_json::Value = serde_json::from_slice(body)?;
    let rules = match value {
        serde_json::Value::Array(_) => serde_json::from_value::<Vec<FaultRule>>(value)?,
        serde_json::Value::Object(ref map) if map.contains_key("faults") => {
            serde_json::from_value::<Wrapped>(value)?.faults
        }
        other => vec![serde_json::from_value::<FaultRule>(other)?],
    };
    for rule in &rules {
        rule.validate()?;
    }
    Ok(rules)
}

/// A rule with its counters; the entries of `GET /faults`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultRuleStatus {
    pub rule: FaultRule,
    /// Requests the filter matched.
    pub matched: u64,
    /// Times the rule fired.
    pub fired: u64,
}

/// How a response body is to be cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyCut {
    /// Reset (RST) rather than close (FIN).
    pub reset: bool,
    /// Body bytes to send first (`None`: half the `Content-Length`).
    pub after_bytes: Option<u64>,
}

/// What the fault rules decided for one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    /// Answer with this error (`Http500` or `Slowdown503`) instead of
    /// forwarding.
    pub error: Option<FaultKind>,
    /// Extra time to hold the response head.
    pub stall: Option<Duration>,
    /// Body rate cap in bytes per second.
    pub trickle: Option<u64>,
    /// Cut the body.
    pub cut: Option<BodyCut>,
}

impl Decision {
    /// The kinds this decision injects when chosen (body cuts count later,
    /// when the cut happens).
    pub fn chosen_kinds(&self) -> impl Iterator<Item = FaultKind> {
        let stall = self.stall.map(|_| FaultKind::Stall);
        let trickle = self.trickle.map(|_| FaultKind::Trickle);
        self.error.into_iter().chain(stall).chain(trickle)
    }
}

struct ActiveRule {
    rule: FaultRule,
    matched: u64,
    fired: u64,
}

struct FaultState {
    rules: Vec<ActiveRule>,
    rng: SmallRng,
}

/// The active fault rules of one proxy.
pub struct FaultSet {
    state: Mutex<FaultState>,
}

impl FaultSet {
    /// An empty set; `seed` makes probabilistic rules repeatable.
    pub fn new(seed: Option<u64>) -> Self {
        let rng = match seed {
            Some(seed) => SmallRng::seed_from_u64(seed),
            None => SmallRng::from_os_rng(),
        };
        FaultSet {
            state: Mutex::new(FaultState {
                rules: Vec::new(),
                rng,
            }),
        }
    }

    /// Replaces every rule (counters start at zero).
    pub fn set(&self, rules: Vec<FaultRule>) {
        self.state.lock().rules = rules
            .into_iter()
            .map(|rule| ActiveRule {
                rule,
                matched: 0,
                fired: 0,
            })
            .collect();
    }

    /// Appends rules.
    pub fn add(&self, rules: Vec<FaultRule>) {
        self.state
            .lock()
            .rules
            .extend(rules.into_iter().map(|rule| ActiveRule {
                rule,
                matched: 0,
                fired: 0,
            }));
    }

    /// Removes every rule.
    pub fn clear(&self) {
        self.state.lock().rules.clear();
    }

    /// The rules with their counters.
    pub fn list(&self) -> Vec<FaultRuleStatus> {
        self.state
            .lock()
            .rules
            .iter()
            .map(|r| FaultRuleStatus {
                rule: r.rule.clone(),
                matched: r.matched,
                fired: r.fired,
            })
            .collect()
    }

    /// Decides the faults for one request.
    pub fn decide(&self, method: &str, kind: RequestKind, key: &str) -> Decision {
        let mut decision = Decision::default();
        let mut guard = self.state.lock();
        let state = &mut *guard;
        for active in state.rules.iter_mut() {
            let rule = &active.rule;
            if rule.fault.is_body_cut() && decision.cut.is_some() {
                continue;
            }
            if !rule.matches(method, kind, key) {
                continue;
            }
            active.matched += 1;
            if rule.limit.is_some_and(|limit| active.fired >= limit) {
                continue;
            }
            let fires = match (rule.probability, rule.every_nth) {
                (Some(p), _) => state.rng.random::<f64>() < p,
                (None, Some(n)) => active.matched % n == 0,
                (None, None) => true,
            };
            if !fires {
                continue;
            }
            active.fired += 1;
            match rule.fault {
                FaultKind::Http500 | FaultKind::Slowdown503 => {
                    decision.error = Some(rule.fault);
                    break;
                }
                FaultKind::Stall => {
                    let ms = Duration::from_millis(rule.ms.unwrap_or(0));
                    decision.stall = Some(decision.stall.unwrap_or_default() + ms);
                }
                FaultKind::Trickle => {
                    let rate = rule.bytes_per_sec.unwrap_or(1).max(1);
                    decision.trickle = Some(decision.trickle.map_or(rate, |r| r.min(rate)));
                }
                FaultKind::ResetMidBody | FaultKind::TruncateBody => {
                    decision.cut = Some(BodyCut {
                        reset: rule.fault == FaultKind::ResetMidBody,
                        after_bytes: rule.after_bytes,
                    });
                }
            }
        }
        decision
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_and_json_forms_agree() {
        let a = FaultRule::parse(
            "reset_mid_body,every_nth=3,kind=get_range,key_contains=42,after_bytes=10",
        )
        .expect("compact");
        let b = FaultRule::parse(
            r#"{"fault":"reset_mid_body","every_nth":3,"kind":"get_range","key_contains":"42","after_bytes":10}"#,
        )
        .expect("json");
        assert_eq!(a, b);
        assert_eq!(
            FaultRule::parse("slowdown503,probability=0.5")
                .expect("probability")
                .probability,
            Some(0.5)
        );
    }

    #[test]
    fn rejects_bad_rules() {
        for bad in [
            "stall",
            "stall,ms=x",
            "http500,ms=3",
            "trickle,bytes_per_sec=0",
            "http500,every_nth=0",
            "http500,probability=2",
            "http500,probability=0.5,every_nth=2",
            "http500,bogus=1",
            "nosuch",
            "http500,every_nth",
            r#"{"fault":"http500","typo":1}"#,
        ] {
            assert!(FaultRule::parse(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn every_nth_filter_and_limit() {
        let set = FaultSet::new(Some(1));
        set.set(vec![FaultRule::http500()
            .with_every_nth(2)
            .with_kind(RequestKind::GetObject)
            .with_limit(2)]);
        let fired: Vec<bool> = (0..8)
            .map(|_| {
                set.decide("GET", RequestKind::GetObject, "b/k")
                    .error
                    .is_some()
            })
            .collect();
        assert_eq!(
            fired,
            [false, true, false, true, false, false, false, false]
        );
        assert!(set.decide("GET", RequestKind::List, "b").error.is_none());
        let status = set.list();
        assert_eq!((status[0].matched, status[0].fired), (8, 2));
    }

    #[test]
    fn combines_rules() {
        let set = FaultSet::new(Some(1));
        set.set(vec![
            FaultRule::stall(10),
            FaultRule::stall(5).with_method("get"),
            FaultRule::trickle(100),
            FaultRule::trickle(50).with_key_contains("slow"),
            FaultRule::truncate_body(),
            FaultRule::reset_mid_body(),
        ]);
        let d = set.decide("GET", RequestKind::GetObject, "b/slow");
        assert_eq!(d.stall, Some(Duration::from_millis(15)));
        assert_eq!(d.trickle, Some(50));
        assert_eq!(
            d.cut,
            Some(BodyCut {
                reset: false,
                after_bytes: None
            })
        );
        let head = set.decide("HEAD", RequestKind::Head, "b/k");
        assert_eq!(head.cut, None);
        assert_eq!(head.stall, Some(Duration::from_millis(10)));
    }

    #[test]
    fn error_ends_the_walk_and_probability_is_seeded() {
        let set = FaultSet::new(Some(7));
        set.set(vec![FaultRule::slowdown503(), FaultRule::stall(10)]);
        let d = set.decide("PUT", RequestKind::Put, "b/k");
        assert_eq!(d.error, Some(FaultKind::Slowdown503));
        assert_eq!(d.stall, None);
        set.set(vec![FaultRule::http500().with_probability(0.5)]);
        let n = (0..1000)
            .filter(|_| {
                set.decide("GET", RequestKind::GetObject, "b/k")
                    .error
                    .is_some()
            })
            .count();
        assert!((300..700).contains(&n), "{n} of 1000");
    }

    #[test]
    fn rules_json_shapes() {
        let one = parse_rules_json(br#"{"fault":"http500"}"#).expect("single");
        let arr = parse_rules_json(br#"[{"fault":"http500"}]"#).expect("array");
        let wrapped = parse_rules_json(br#"{"faults":[{"fault":"http500"}]}"#).expect("wrapped");
        assert_eq!(one, arr);
        assert_eq!(arr, wrapped);
        assert!(parse_rules_json(br#"{"faults":[{"fault":"stall"}]}"#).is_err());
    }
}
