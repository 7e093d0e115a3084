//! The dataset manifest: where a dataset lives, how it was generated, and
//! every object's key, size and checksum, so readers can verify bytes
//! without touching the store.
//!
//! Text format, one object a line:
//!
//! ```text
//! # riffle-bench manifest v1
//! # {"workload":"w1","scale":1.0,"seed":1,"bucket":"b","prefix":"","objects":2,"bytes":20}
//! train/c000/img_00000.jpg<TAB>12345<TAB>0123456789abcdef
//! ```

use std::fs;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use crate::content::Content;
use crate::dataset::{Plan, Workload};

const MAGIC: &str = "# riffle-bench manifest v1";

/// Where a dataset is and how it was generated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub workload: Workload,
    pub scale: f64,
    pub seed: u64,
    pub bucket: String,
    /// Key prefix of the dataset in the bucket ("" or ending in '/').
    pub prefix: String,
    pub objects: usize,
    pub bytes: u64,
}

/// One object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Key relative to the prefix (and path relative to a mount root).
    pub key: String,
    pub size: u64,
    pub checksum: u64,
}

/// A whole manifest.
#[derive(Debug, Clone)]
pub struct Manifest {
    pub header: Header,
    pub entries: Vec<Entry>,
}

impl Manifest {
    /// Computes the manifest of `plan` (generating every object's bytes to
    /// checksum them) on `threads` threads.
    pub fn compute(plan: &Plan, bucket: &str, prefix: &str, threads: usize) -> Self {
        let seed = plan.seed;
        let threads = threads.max(1);
        let mut entries: Vec<Entry> = plan
            .objects
            .iter()
            .map(|o| Entry {
                key: o.key.clone(),
                size: o.size,
                checksum: 0,
            })
            .collect();
        // Spread the bytes, not the objects, over the threads: interleave.
        std::thread::scope(|s| {
            let mut slots: Vec<Vec<&mut Entry>> = (0..threads).map(|_| Vec::new()).collect();
            for (i, e) in entries.iter_mut().enumerate() {
                slots[i % threads].push(e);
            }
            for slot in slots {
                s.spawn(move || {
                    for e in slot {
                        e.checksum = Content::new(seed, &e.key).checksum(e.size);
                    }
                });
            }
        });
        let header = Header {
            workload: plan.workload,
            scale: plan.scale,
            seed,
            bucket: bucket.to_string(),
            prefix: normalize_prefix(prefix),
            objects: entries.len(),
            bytes: plan.total_bytes(),
        };
        Self { header, entries }
    }

    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        }
        let tmp = path.with_extension("tmp");
        let file = fs::File::create(&tmp).with_context(|| format!("create {}", tmp.display()))?;
        let mut w = BufWriter::new(file);
        writeln!(w, "{MAGIC}")?;
        writeln!(w, "# {}", serde_json::to_string(&self.header)?)?;
        for e in &self.entries {
            writeln!(w, "{}\t{}\t{:016x}", e.key, e.size, e.checksum)?;
        }
        w.flush()?;
        drop(w);
        fs::rename(&tmp, path).with_context(|| format!("rename to {}", path.display()))?;
        Ok(())
    }

    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let file = fs::File::open(path).with_context(|| {
            format!(
                "open manifest {} (run `riffle-bench gen` first)",
                path.display()
            )
        })?;
        Self::parse(BufReader::new(file)).with_context(|| format!("manifest {}", path.display()))
    }

    pub fn parse(r: impl BufRead) -> anyhow::Result<Self> {
        let mut lines = r.lines();
        match lines.next() {
            Some(Ok(l)) if l.trim_end() == MAGIC => {}
            _ => bail!("not a riffle-bench manifest (first line must be {MAGIC:?})"),
        }
        let header_line = lines.next().context("missing header line")??;
        let json = header_line
            .strip_prefix("# ")
            .context("header line must start with '# '")?;
        let header: Header = serde_json::from_str(json).context("bad header")?;
        let mut entries = Vec::with_capacity(header.objects);
        for (n, line) in lines.enumerate() {
            let line = line?;
            if line.is_empty() {
                continue;
            }
            entries.push(parse_entry(&line).with_context(|| format!("line {}", n + 3))?);
        }
        if entries.len() != header.objects {
            bail!(
                "header says {} objects, found {} (truncated file?)",
                header.objects,
                entries.len()
            );
        }
        Ok(Self { header, entries })
    }

    /// The full S3 key of an entry.
    pub fn s3_key(&self, e: &Entry) -> String {
        format!("{}{}", self.header.prefix, e.key)
    }
}

fn parse_entry(line: &str) -> anyhow::Result<Entry> {
    let mut it = line.split('\t');
    let (Some(key), Some(size), Some(sum), None) = (it.next(), it.next(), it.next(), it.next())
    else {
        bail!("expected KEY<TAB>SIZE<TAB>CHECKSUM");
    };
    Ok(Entry {
        key: key.to_string(),
        size: size.parse().context("size")?,
        checksum: u64::from_str_radix(sum, 16).context("checksum")?,
    })
}

/// "" stays ""; anything else ends in exactly one '/' and has no leading '/'.
pub fn normalize_prefix(prefix: &str) -> String {
    let p = prefix.trim_matches('/');
    if p.is_empty() {
        String::new()
    } else {
        format!("{p}/")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_a_file() {
        let plan = Plan::new(Workload::W1, 0.002, 4).expect("plan");
        let m = Manifest::compute(&plan, "bucket", "/ds/", 2);
        assert_eq!(m.header.prefix, "ds/");
        assert_eq!(m.entries.len(), 40);
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub/m.tsv");
        m.write(&path).expect("write");
        let back = Manifest::read(&path).expect("read");
        assert_eq!(back.header, m.header);
        assert_eq!(back.entries, m.entries);
        assert_eq!(
            back.s3_key(&back.entries[0]),
            format!("ds/{}", m.entries[0].key)
        );
        // Checksums are those of the generated bytes.
        let e = &m.entries[3];
        let bytes = Content::new(4, &e.key).bytes(0, e.size as usize);
        assert_eq!(e.checksum, crate::content::checksum_of(&bytes));
    }

    #[test]
    fn rejects_truncated_and_garbage() {
        let text = format!(
            "{MAGIC}\n# {{\"workload\":\"w2\",\"scale\":1.0,\"seed\":1,\"bucket\":\"b\",\"prefix\":\"\",\"objects\":2,\"bytes\":2}}\na\t1\t00ff\n"
        );
        assert!(Manifest::parse(text.as_bytes()).is_err());
        assert!(Manifest::parse("hello\n".as_bytes()).is_err());
        let bad = format!(
            "{MAGIC}\n# {{\"workload\":\"w2\",\"scale\":1.0,\"seed\":1,\"bucket\":\"b\",\"prefix\":\"\",\"objects\":1,\"bytes\":1}}\na\tx\t00ff\n"
        );
        assert!(Manifest::parse(bad.as_bytes()).is_err());
    }
}
