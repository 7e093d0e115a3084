//! How a riffle row's FUSE requests reached its daemon (issue 50): the `/dev/fuse` twins of
//! the riffle rows, and the transport each row recorded.
//!
//! **Names.** A riffle row's system is `VARIANT[-devfuse][-py]`: `riffle-nopt` asks for
//! the transport `benches/run.sh` gives every riffle row (`--fuse-transport auto`, or what
//! `RIFFLE_BENCH_FUSE_TRANSPORT` says), and `riffle-nopt-devfuse` is the same mount with
//! `--fuse-transport dev-fuse`, the classic `/dev/fuse` read and writev loop, its twin for
//! comparison. `-py` stays last (the Python reader's rows, [`super::python_reader`]):
//! `riffle-devfuse-py` is `riffle-py`'s twin. `benches/lib/systems.sh` (`transport_of`)
//! reads the same names to choose the flag; here they give labels, table order and the
//! pairs the goals compare.
//!
//! **What ran.** A row records the `fuse.transport` text of `riffle stats` taken right after
//! mounting ([`super::Row::transport`]), whatever it asked for: `io_uring: 2 queues of 8
//! entries (1024 KiB payloads)`, or `/dev/fuse: WHY`. Labels end with its kind in brackets
//! ([`row_label`]), so a row that asked for the rings and did not get them says so.

use super::Row;

/// The suffix that makes a riffle row's `/dev/fuse` twin.
pub const DEV_FUSE: &str = "-devfuse";

/// The suffix of the Python reader's rows, which stays last.
const PY: &str = "-py";

/// The row a `/dev/fuse` twin is the twin of (`riffle-nopt-devfuse` → `riffle-nopt`,
/// `riffle-devfuse-py` → `riffle-py`); `None` for a row that is no twin.
pub fn twin_of(system: &str) -> Option<String> {
    let (name, py) = match system.strip_suffix(PY) {
        Some(name) => (name, PY),
        None => (system, ""),
    };
    let variant = name.strip_suffix(DEV_FUSE)?;
    is_riffle(variant).then(|| format!("{variant}{py}"))
}

/// The `/dev/fuse` twin of a riffle row (`riffle-py` → `riffle-devfuse-py`).
pub fn dev_fuse_twin(system: &str) -> String {
    match system.strip_suffix(PY) {
        Some(name) => format!("{name}{DEV_FUSE}{PY}"),
        None => format!("{system}{DEV_FUSE}"),
    }
}

fn is_riffle(system: &str) -> bool {
    system == "riffle" || system.starts_with("riffle-")
}

/// The kind of transport a `fuse.transport` text names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    IoUring,
    DevFuse,
}

impl Kind {
    /// The kind `riffle stats`' `fuse.transport` text starts with; `None` for text of
    /// neither kind (an older daemon's, or none).
    pub fn of(described: &str) -> Option<Self> {
        if described.starts_with("io_uring") {
            Some(Kind::IoUring)
        } else if described.starts_with("/dev/fuse") {
            Some(Kind::DevFuse)
        } else {
            None
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Kind::IoUring => "io_uring",
            Kind::DevFuse => "/dev/fuse",
        }
    }
}

/// The transport a row ran with, from what it recorded after mounting.
pub fn kind(row: &Row) -> Option<Kind> {
    row.transport.as_deref().and_then(Kind::of)
}

/// A row's label in a table: its system's label, and for a row that recorded its transport
/// the transport's kind in brackets (`riffle, no plan (disk cache, passthrough) [io_uring]`).
pub fn row_label(row: &Row, label: &dyn Fn(&str) -> String) -> String {
    let name = label(&row.system);
    match kind(row) {
        Some(k) => format!("{name} [{}]", k.label()),
        None => name,
    }
}

/// A line under a table whose riffle rows all recorded `/dev/fuse`: then the rows that did
/// not ask for it and their twins measure the same transport, and the table must say so.
pub fn all_dev_fuse_note(rows: &[&Row]) -> Option<String> {
    let kinds: Vec<Kind> = rows
        .iter()
        .filter(|r| is_riffle(&r.system))
        .filter_map(|r| kind(r))
        .collect();
    (!kinds.is_empty() && kinds.iter().all(|k| *k == Kind::DevFuse)).then(|| {
        "every riffle row of this table ran over /dev/fuse (the brackets in the labels: what \
         `riffle stats` said right after mounting), the rows that did not ask for it too, so \
         they and their `dev-fuse` twins measure the same transport: this table does not \
         measure FUSE over io_uring"
            .to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::Column;

    fn row(system: &str, transport: Option<&str>) -> Row {
        Row {
            transport: transport.map(str::to_string),
            ..Row::new("w1", system, Column::Proxy, "ok")
        }
    }

    #[test]
    fn twins_keep_the_python_suffix_last() {
        assert_eq!(twin_of("riffle-devfuse").as_deref(), Some("riffle"));
        assert_eq!(
            twin_of("riffle-nopt-devfuse").as_deref(),
            Some("riffle-nopt")
        );
        assert_eq!(twin_of("riffle-devfuse-py").as_deref(), Some("riffle-py"));
        assert_eq!(
            twin_of("riffle-plan-devfuse-py").as_deref(),
            Some("riffle-plan-py")
        );
        for not_twin in [
            "riffle",
            "riffle-py",
            "riffle-nopt",
            "local-py",
            "s3fs-devfuse",
        ] {
            assert_eq!(twin_of(not_twin), None, "{not_twin}");
        }
        for system in ["riffle", "riffle-nopt", "riffle-py", "riffle-plan-py"] {
            let twin = dev_fuse_twin(system);
            assert_eq!(twin_of(&twin).as_deref(), Some(system), "{twin}");
        }
        assert_eq!(dev_fuse_twin("riffle-py"), "riffle-devfuse-py");
    }

    #[test]
    fn labels_say_the_transport_that_ran_not_the_one_asked_for() {
        let label = |s: &str| format!("<{s}>");
        let rings = row(
            "riffle",
            Some("io_uring: 2 queues of 8 entries (1024 KiB payloads)"),
        );
        assert_eq!(row_label(&rings, &label), "<riffle> [io_uring]");
        // Asked for the default, got /dev/fuse: the label says /dev/fuse.
        let fell_back = row(
            "riffle",
            Some("/dev/fuse: the kernel's FUSE io_uring is off"),
        );
        assert_eq!(row_label(&fell_back, &label), "<riffle> [/dev/fuse]");
        let twin = row(
            "riffle-devfuse",
            Some("/dev/fuse: asked for (--fuse-transport dev-fuse)"),
        );
        assert_eq!(row_label(&twin, &label), "<riffle-devfuse> [/dev/fuse]");
        // Results from before rows recorded it, and peers: the label alone.
        assert_eq!(row_label(&row("riffle", None), &label), "<riffle>");
        assert_eq!(row_label(&row("riffle", Some("")), &label), "<riffle>");

        let local = row("local", None);
        assert!(all_dev_fuse_note(&[&local, &fell_back, &twin]).is_some());
        assert!(all_dev_fuse_note(&[&local, &rings, &twin]).is_none());
        assert!(
            all_dev_fuse_note(&[&local, &row("riffle", None)]).is_none(),
            "nothing recorded, nothing said"
        );
    }
}
