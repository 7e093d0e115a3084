//! The per-mode result store (`benches/results/{quick,full}.json`): the
//! latest run of each workload, merged in as runs finish.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::{workload_of, Meta, Record, Row};

/// The latest results of one workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadResult {
    pub meta: Meta,
    /// The tables' rows (round 1).
    pub rows: Vec<Row>,
    /// The extra rounds of the goal comparisons ([`Row::round`] 2, 3, ...),
    /// used by the goal lines only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rounds: Vec<Row>,
}

/// All workloads of one mode.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModeResults {
    pub workloads: BTreeMap<String, WorkloadResult>,
}

/// Reads a run file (JSON lines of [`Record`]s) into workload results,
/// rows of extra rounds apart. Rows whose workload has no meta line are an
/// error.
pub fn read_run(path: &Path) -> anyhow::Result<(String, ModeResults)> {
    let text = fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let mut metas = Vec::new();
    let mut rows = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let rec: Record = serde_json::from_str(line)
            .with_context(|| format!("{} line {}", path.display(), n + 1))?;
        match rec {
            Record::Meta(m) => metas.push(*m),
            Record::Row(r) => rows.push(*r),
        }
    }
    let mode = metas
        .first()
        .map(|m| m.mode.clone())
        .context("run file has no meta record")?;
    let mut out = ModeResults::default();
    for m in metas {
        anyhow::ensure!(m.mode == mode, "run file mixes modes {mode} and {}", m.mode);
        out.workloads.insert(
            m.workload.clone(),
            WorkloadResult {
                meta: m,
                rows: Vec::new(),
                rounds: Vec::new(),
            },
        );
    }
    for r in rows {
        let w = workload_of(&r.table).to_string();
        let result = out
            .workloads
            .get_mut(&w)
            .with_context(|| format!("row for {} without a meta record for {w}", r.table))?;
        if r.round.is_some() {
            result.rounds.push(r);
        } else {
            result.rows.push(r);
        }
    }
    Ok((mode, out))
}

pub fn store_path(dir: &Path, mode: &str) -> PathBuf {
    dir.join(format!("{mode}.json"))
}

pub fn load(dir: &Path, mode: &str) -> anyhow::Result<ModeResults> {
    let path = store_path(dir, mode);
    match fs::read_to_string(&path) {
        Ok(text) => {
            serde_json::from_str(&text).with_context(|| format!("parse {}", path.display()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ModeResults::default()),
        Err(e) => Err(e).with_context(|| format!("read {}", path.display())),
    }
}

/// Replaces the stored workloads of `mode` with those of `run`.
pub fn merge(dir: &Path, mode: &str, run: &ModeResults) -> anyhow::Result<ModeResults> {
    let mut all = load(dir, mode)?;
    for (k, v) in &run.workloads {
        all.workloads.insert(k.clone(), v.clone());
    }
    fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let path = store_path(dir, mode);
    fs::write(&path, serde_json::to_string_pretty(&all)? + "\n")
        .with_context(|| format!("write {}", path.display()))?;
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::Column;

    #[test]
    fn rows_of_extra_rounds_are_kept_apart_from_the_tables_rows() {
        let row = |system: &str, round: Option<u32>| {
            let mut r: Row = serde_json::from_value(serde_json::json!({
                "table": "w1", "system": system, "column": "proxy", "status": "ok"
            }))
            .expect("row");
            r.round = round;
            r
        };
        let meta: Meta = serde_json::from_value(serde_json::json!({
            "workload": "w1", "mode": "full", "date": "2026-11-22T00:00:00Z",
            "commit": "abc", "machine": crate::results::machine::Machine::current(),
            "scale": 1.0, "objects": 1, "bytes": 1, "remote": "proxy", "elapsed_s": 1.0
        }))
        .expect("meta");
        let dir = tempfile::tempdir().expect("tempdir");
        let run = dir.path().join("run.jsonl");
        let lines: Vec<String> = [
            Record::Meta(Box::new(meta)),
            Record::Row(Box::new(row("riffle-plan", None))),
            Record::Row(Box::new(row("riffle-plan", Some(2)))),
            Record::Row(Box::new(row("copy-first", Some(2)))),
        ]
        .iter()
        .map(|r| serde_json::to_string(r).expect("json"))
        .collect();
        fs::write(&run, lines.join("\n")).expect("write run");

        let (mode, results) = read_run(&run).expect("read run");
        assert_eq!(mode, "full");
        let w1 = &results.workloads["w1"];
        assert_eq!(w1.rows.len(), 1);
        assert_eq!(w1.rows[0].round, None);
        assert_eq!(w1.rounds.len(), 2);
        assert!(w1
            .rounds
            .iter()
            .all(|r| r.round == Some(2) && r.column == Column::Proxy));

        // The store keeps them through a merge.
        let stored = merge(dir.path(), &mode, &results).expect("merge");
        assert_eq!(stored, load(dir.path(), &mode).expect("load"));
        assert_eq!(stored.workloads["w1"].rounds.len(), 2);
    }
}
