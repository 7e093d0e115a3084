//! What a mount reports, declared once: every field of `riffle stats` is a [`Stat`] in
//! [`defs`], and the JSON tree is built from values recorded against those declarations.
//!
//! A [`Stat`] names one field by its dotted path in the JSON (`prefetch.opens_already_cached`,
//! as `riffle stats --json` nests it and `riffle stats` prints it) and says what it is: a
//! counter (only goes up), a gauge (up and down), a string compared with one value (exported
//! as 0/1), a string or an identifying number shown only in `riffle stats`; with its unit and
//! a help text. Everything else is derived from the declaration:
//!
//! - the JSON tree: each layer that has something to report writes its values into a
//!   [`Sample`] with `sample.put(&defs::X, value)`; the sample nests them by path (the
//!   segments before the last dot are objects), and a section that does not exist on this
//!   mount (no disk cache, no peers, no plan) is written as `null` with
//!   [`Sample::absent`]`(&defs::SECTION)`. Nothing undeclared can be written, so the JSON and
//!   the declarations cannot drift (a unit test in `defs` checks the other direction: every
//!   declaration is written by a real mount);
//! - the Prometheus families (`metrics::prometheus` iterates [`defs::ALL`]): the family name is
//!   `riffle_` and the path with `.` made `_`, less a trailing `_bytes`/`_seconds` the unit
//!   suffix adds back, unless the declaration names it ([`Stat::named`]) to keep a name
//!   dashboards already use;
//! - the readers of a snapshot (the bench harness): [`Stat::get`] finds a declaration's value
//!   in a parsed `riffle stats --json`.
//!
//! This module is at the bottom of the layers (it knows no other module), so every layer can
//! record into a sample and the harness can read the declarations through the library.

pub mod defs;
mod sample;

pub use sample::Sample;

use serde_json::Value;

/// What a field is, and so how it is exported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (the exposed name gets `_total`).
    Counter,
    /// Goes up and down (numbers and booleans).
    Gauge,
    /// A string: exported as a gauge, 1 when it equals the given value, else 0.
    Equals(&'static str),
    /// A string shown in `riffle stats` only (a path, a mode, a reason).
    Text,
    /// A number that identifies rather than measures (the pid): `riffle stats` only.
    Id,
}

/// The unit of a number, which the exposition adds to the family name (`_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Bytes,
    Seconds,
}

impl Unit {
    /// As OpenMetrics spells it (the name suffix).
    pub const fn as_str(self) -> &'static str {
        match self {
            Unit::Bytes => "bytes",
            Unit::Seconds => "seconds",
        }
    }
}

/// One field of `riffle stats`; see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// Dotted path in the JSON stats.
    pub path: &'static str,
    pub kind: Kind,
    pub unit: Option<Unit>,
    pub help: &'static str,
    /// The Prometheus family name (without unit and `_total` suffixes) where it is not the
    /// one derived from the path.
    pub name: Option<&'static str>,
}

impl Stat {
    const fn new(path: &'static str, kind: Kind, unit: Option<Unit>, help: &'static str) -> Stat {
        Stat {
            path,
            kind,
            unit,
            help,
            name: None,
        }
    }

    /// This stat exported under `name` (without unit and `_total` suffixes) rather than the
    /// name derived from its path.
    pub const fn named(self, name: &'static str) -> Stat {
        Stat {
            name: Some(name),
            ..self
        }
    }

    /// Whether the Prometheus endpoint exports this stat.
    pub const fn exported(&self) -> bool {
        matches!(self.kind, Kind::Counter | Kind::Gauge | Kind::Equals(_))
    }

    /// The value at this stat's path in a `riffle stats` JSON tree; `None` if it is missing
    /// or `null` (its section is absent).
    pub fn get<'v>(&self, tree: &'v Value) -> Option<&'v Value> {
        let mut v = tree;
        for part in self.path.split('.') {
            v = v.get(part)?;
        }
        (!v.is_null()).then_some(v)
    }

    /// This stat's number in `tree` (0 when missing or not a count).
    pub fn count(&self, tree: &Value) -> u64 {
        self.get(tree).and_then(Value::as_u64).unwrap_or(0)
    }
}

/// A part of the tree that a mount may not have (its disk cache, its peers, its plan): written
/// as `null` when absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Section {
    /// Dotted path of the object.
    pub path: &'static str,
}

/// A counter; `unit` is [`BYTES`], [`SECONDS`] or [`NUMBER`].
pub const fn counter(path: &'static str, unit: Option<Unit>, help: &'static str) -> Stat {
    Stat::new(path, Kind::Counter, unit, help)
}

/// A gauge; `unit` is [`BYTES`], [`SECONDS`] or [`NUMBER`].
pub const fn gauge(path: &'static str, unit: Option<Unit>, help: &'static str) -> Stat {
    Stat::new(path, Kind::Gauge, unit, help)
}

/// A string exported as 1 when it is `value`, else 0.
pub const fn equals(path: &'static str, value: &'static str, help: &'static str) -> Stat {
    Stat::new(path, Kind::Equals(value), None, help)
}

/// A string not exported.
pub const fn text(path: &'static str, help: &'static str) -> Stat {
    Stat::new(path, Kind::Text, None, help)
}

/// An identifying number not exported.
pub const fn id(path: &'static str, help: &'static str) -> Stat {
    Stat::new(path, Kind::Id, None, help)
}

/// A section of the tree that may be `null`.
pub const fn section(path: &'static str) -> Section {
    Section { path }
}

/// Units of [`counter`] and [`gauge`].
pub const BYTES: Option<Unit> = Some(Unit::Bytes);
pub const SECONDS: Option<Unit> = Some(Unit::Seconds);
/// A plain number (a count, a ratio, a flag): no unit suffix.
pub const NUMBER: Option<Unit> = None;
