//! `riffle stats MOUNTPOINT` (a mount's counters) and `riffle cache stats|clear` (a cache
//! directory), as `section.name value` lines or JSON.

use anyhow::Context;
use serde_json::json;

use super::args::{CacheCommand, StatsArgs};
use crate::cache;
use crate::control;
use crate::namespace::saved;

pub fn run(args: &StatsArgs) -> anyhow::Result<()> {
    let value = control::request(&args.mountpoint, "stats")?;
    print(&value, args.json)
}

pub fn cache(cmd: &CacheCommand) -> anyhow::Result<()> {
    match cmd {
        CacheCommand::Stats { cache_dir, json } => {
            let s = cache::stats_dir(cache_dir)
                .with_context(|| format!("cannot read cache directory {}", cache_dir.display()))?;
            print(&dir_stats_json(&s), *json)
        }
        CacheCommand::Clear { cache_dir } => {
            let report = cache::clear_dir(cache_dir)
                .with_context(|| format!("cannot clear {}", cache_dir.display()))?;
            // Saved listings: cleared once the cache showed no mount uses the directory.
            let listings = saved::clear(cache_dir).with_context(|| {
                format!("cannot clear the saved listings of {}", cache_dir.display())
            })?;
            println!(
                "cleared {}: {} files, {} bytes",
                cache_dir.display(),
                report.files + listings.files,
                report.bytes + listings.bytes
            );
            Ok(())
        }
    }
}

fn dir_stats_json(s: &cache::DirStats) -> serde_json::Value {
    json!({
        "format_version": s.format.map(|f| f.0),
        "block_size": s.format.map(|f| f.1),
        "in_use_by_a_mount": s.in_use,
        "objects": s.objects,
        "complete_objects": s.complete_objects,
        "blocks": s.blocks,
        "bytes": s.bytes,
        "disk_bytes": s.disk_bytes,
        "orphan_files": s.orphans,
        "unreadable_entries": s.unreadable,
        "index_memory_per_object": s.index_memory_per_object,
    })
}

fn print(value: &serde_json::Value, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(value)?);
    } else {
        let mut lines = Vec::new();
        flatten("", value, &mut lines);
        for (k, v) in lines {
            println!("{k:<32} {v}");
        }
    }
    Ok(())
}

fn flatten(prefix: &str, value: &serde_json::Value, out: &mut Vec<(String, String)>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        serde_json::Value::String(s) => out.push((prefix.to_string(), s.clone())),
        other => out.push((prefix.to_string(), other.to_string())),
    }
}
