//! `riffle stats MOUNTPOINT`: a mount's counters, as `section.name value` lines or JSON.

use super::args::StatsArgs;
use crate::control;

pub fn run(args: &StatsArgs) -> anyhow::Result<()> {
    let value = control::request(&args.mountpoint, "stats")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        let mut lines = Vec::new();
        flatten("", &value, &mut lines);
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
