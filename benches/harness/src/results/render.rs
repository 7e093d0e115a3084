//! Markdown: the result tables of a run (printed by `report`) and the whole
//! `benches/README.md` built from the stored results of every mode.

use std::fmt::Write;

use super::metrics::{
    best_peer, cell, ratio, throughput, throughput_series, Epoch, PlotTable, Unit,
};
use super::store::{ModeResults, WorkloadResult};
use super::transport::{self, twin_of};
use super::{local_of, python_reader, tables_of, Column, Row};

/// Display order of systems (the Python reader's rows last, together); each riffle row's
/// `/dev/fuse` twin ([`transport`]) comes right after it.
const ORDER: [&str; 17] = [
    "local",
    "copy-first",
    "s3-client",
    "riffle",
    "riffle-seq",
    "riffle-nopt",
    "riffle-plan",
    "riffle-listing",
    "riffle-browse",
    "riffle-mem",
    "s3fs",
    "rclone",
    "mountpoint",
    "local-py",
    "riffle-py",
    "riffle-plan-py",
    "riffle-lru",
];

/// The row label of a system (a `/dev/fuse` twin's: its twin's, then `, dev-fuse`).
pub fn system_label(system: &str) -> String {
    if let Some(twin) = twin_of(system) {
        return format!("{}, dev-fuse", system_label(&twin));
    }
    match system {
        "local" => "local disk".into(),
        "copy-first" => "copy-first".into(),
        "s3-client" => "S3 client, 64 in flight (reference)".into(),
        "riffle" => "riffle, no plan (disk cache, passthrough)".into(),
        "riffle-nopt" => "riffle (disk cache, no passthrough)".into(),
        "riffle-seq" => "riffle, sequential walk (`--list-concurrency 0`)".into(),
        "riffle-plan" => "riffle + epoch plan".into(),
        "riffle-listing" => "riffle, listing order ‡".into(),
        "riffle-browse" => "riffle, browsing (1 thread, random files) §".into(),
        "riffle-mem" => "riffle (memory only)".into(),
        "rclone" => "rclone (full cache)".into(),
        "mountpoint" => "Mountpoint".into(),
        "local-py" => "Python reader: local disk".into(),
        "riffle-py" => "Python reader: riffle, no plan".into(),
        "riffle-plan-py" => "Python reader: riffle + epoch plan".into(),
        s => s.into(),
    }
}

/// A short label for plots.
pub fn short_label(system: &str) -> String {
    if let Some(twin) = twin_of(system) {
        return format!("{}\n/dev/fuse", short_label(&twin));
    }
    match system {
        "local" => "local".into(),
        "s3-client" => "S3 client".into(),
        "riffle-nopt" => "riffle\nno passthrough".into(),
        "riffle-seq" => "riffle\nsequential".into(),
        "riffle-plan" => "riffle\n+ plan".into(),
        "riffle-listing" => "riffle\nlisting order".into(),
        "riffle-browse" => "riffle\nbrowsing".into(),
        "riffle-mem" => "riffle\nmemory only".into(),
        "mountpoint" => "Mountpoint".into(),
        "local-py" => "Python\nlocal".into(),
        "riffle-py" => "Python\nriffle".into(),
        "riffle-plan-py" => "Python\nriffle + plan".into(),
        s => s.into(),
    }
}

fn table_title(table: &str) -> &'static str {
    match table {
        "w1" => "W1 imagenet: small files, 8 readers",
        "w2" => "W2 shards: 4 readers, whole shards in 1 MiB reads",
        "w3" => "W3 tokens: 16 threads, random 4 KiB–1 MiB pread",
        "w3-mmap" => "W3 tokens through mmap: 16 threads, random 4 KiB–1 MiB",
        "w4" => "W4 listing: `find -type f` over every object, then a stat of every file, cold and after a remount",
        "w5" => "W5 larger than cache: W1 with a cache of half the data, 3 shuffled epochs",
        _ => "workload",
    }
}

fn rank(system: &str) -> usize {
    let (name, twin) = match twin_of(system) {
        Some(name) => (name, 1),
        None => (system.to_string(), 0),
    };
    let at = ORDER.iter().position(|s| *s == name).unwrap_or(ORDER.len());
    2 * at + twin
}

fn sorted(rows: &[Row]) -> Vec<&Row> {
    let mut v: Vec<&Row> = rows.iter().collect();
    v.sort_by_key(|r| rank(&r.system));
    v
}

fn rss(row: &Row) -> String {
    row.rss_kb
        .map_or("—".into(), |kb| format!("{:.0} MiB", kb as f64 / 1024.0))
}

/// Why a table with epoch 3 shows it, under the table.
const EPOCH3_NOTE: &str = "riffle's warm epoch (2) is its first read of the cache files it \
     wrote during epoch 1; local disk's epoch 1 is its first read of the copy written just before \
     it, and its epoch 2 a second read (see \"First reads\" in How to read the tables). So the \
     goals below also pair riffle's warm epoch with local disk's epoch 1, a first read of newly \
     written files on both sides, and epoch 3, a re-read for every system alike (copy-first's \
     epochs are local disk's), with local disk's epoch 3; \"warm (epoch 2)\" stays the headline \
     warm figure.";

/// The epochs a table shows: cold and warm, and the re-read when any of
/// its rows has one.
fn shown_epochs(rows: &[Row]) -> Vec<Epoch> {
    let mut epochs = vec![Epoch::Cold, Epoch::Warm];
    if rows.iter().any(|r| r.epoch3.is_some()) {
        epochs.push(Epoch::Reread);
    }
    epochs
}

/// What a table's numbers are, after its title.
fn unit_note(table: &str) -> String {
    match table {
        "w4" => "seconds, lower is better".into(),
        t => format!("{}, higher is better", Unit::of_table(t).label()),
    }
}

/// The markdown table of one table id.
pub fn table(table: &str, rows: &[Row]) -> String {
    match table {
        "w4" => return super::w4::table(rows),
        "w5" => return super::w5::table(rows),
        _ => {}
    }
    let rows: Vec<Row> = rows.iter().filter(|r| r.table == table).cloned().collect();
    let proxy: Vec<&Row> = sorted(&rows)
        .into_iter()
        .filter(|r| r.column == Column::Proxy)
        .collect();
    // "÷ local" divides by local disk read by the same reader.
    let local_for = |system: &str| {
        rows.iter()
            .find(|r| r.system == local_of(system) && r.column == Column::Proxy)
    };
    let has_direct = rows.iter().any(|r| r.column == Column::Direct);
    let first256 = table == "w1";
    let epochs = shown_epochs(&rows);
    let reread = epochs.contains(&Epoch::Reread);
    let cpu = super::cpu::recorded(&rows);
    let mut out = String::new();
    let mut head = vec!["system", "cold (epoch 1)", "warm (epoch 2)"];
    if reread {
        head.push("re-read (epoch 3)");
    }
    if first256 {
        head.push("first 256 files, cold");
    }
    head.extend(["cold ÷ local", "warm ÷ local"]);
    if reread {
        head.push("epoch 3 ÷ local");
    }
    head.extend(["cold ÷ best peer", "warm ÷ best peer", "daemon peak RSS"]);
    let cpu_heads = super::cpu::heads(table, &epochs);
    if cpu {
        head.extend(cpu_heads.iter().map(String::as_str));
    }
    if has_direct {
        head.extend(["no proxy: cold", "no proxy: warm"]);
    }
    let _ = writeln!(out, "| {} |", head.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(head.len()));
    for r in &proxy {
        let mut cells = vec![transport::row_label(r, &system_label)];
        cells.extend(epochs.iter().map(|&epoch| cell(r, epoch)));
        if first256 {
            cells.push(
                r.cold
                    .as_ref()
                    .and_then(|o| o.first_256_s)
                    .filter(|_| r.ok() && r.copy.is_none())
                    .map_or("—".into(), |s| format!("{s:.2} s")),
            );
        }
        for &epoch in &epochs {
            let base = local_for(&r.system).and_then(|l| throughput(l, epoch));
            cells.push(ratio(throughput(r, epoch), base));
        }
        for epoch in [Epoch::Cold, Epoch::Warm] {
            // The peers are read by read-fs: no "÷ best peer" for the
            // Python reader's rows.
            let compared =
                !matches!(r.system.as_str(), "local" | "s3-client") && !python_reader(&r.system);
            cells.push(match best_peer(&rows, &r.system, epoch) {
                Some((name, t)) if compared && throughput(r, epoch).is_some() => {
                    format!("{} ({name})", ratio(throughput(r, epoch), Some(t)))
                }
                _ => "—".into(),
            });
        }
        cells.push(rss(r));
        if cpu {
            cells.extend(super::cpu::cells(r, &epochs));
        }
        if has_direct {
            let d = rows
                .iter()
                .find(|d| d.column == Column::Direct && d.system == r.system);
            for epoch in [Epoch::Cold, Epoch::Warm] {
                cells.push(d.map_or("—".into(), |d| cell(d, epoch)));
            }
        }
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    let mut notes: Vec<String> = sorted(&rows)
        .into_iter()
        .filter_map(|r| {
            let col = match r.column {
                Column::Proxy => "",
                Column::Direct => ", no proxy",
            };
            let ran = r
                .transport
                .as_ref()
                .map(|t| format!("FUSE transport (`riffle stats` right after mounting): {t}"));
            let text: Vec<&str> = [r.note.as_deref(), ran.as_deref()]
                .into_iter()
                .flatten()
                .collect();
            (!text.is_empty()).then(|| {
                format!(
                    "- {}{col}: {}",
                    transport::row_label(r, &system_label),
                    text.join("; ")
                )
            })
        })
        .collect();
    if let Some(n) = transport::all_dev_fuse_note(&proxy) {
        notes.push(format!("- FUSE transport: {n}"));
    }
    if reread {
        notes.push(format!("- re-read (epoch 3): {EPOCH3_NOTE}"));
    }
    if !notes.is_empty() {
        out.push('\n');
        out.push_str(&notes.join("\n"));
        out.push('\n');
    }
    out
}

fn count(v: Option<u64>) -> String {
    v.map_or("—".into(), |n| n.to_string())
}

fn share(part: u64, whole: u64) -> String {
    if whole == 0 {
        "—".into()
    } else {
        format!("{part} / {whole}")
    }
}

/// What each epoch cost at the store (GETs counted at the proxy) and
/// riffle's own counters, for the proxy rows that have them.
pub fn cost_table(table: &str, rows: &[Row]) -> Option<String> {
    if table == "w4" || table == "w5" {
        return None; // their own tables have the counts at the store
    }
    let rows: Vec<&Row> = sorted(rows)
        .into_iter()
        .filter(|r| r.table == table && r.column == Column::Proxy && r.ok())
        .filter(|r| r.cold_detail.is_some() || r.warm_detail.is_some())
        .collect();
    if rows.is_empty() {
        return None;
    }
    // The requests that came over io_uring, once a row recorded its transport.
    let rings = rows.iter().any(|r| r.transport.is_some());
    let mut out = String::new();
    let mut head = vec![
        "system",
        "GETs at the store, cold",
        "GETs at the store, warm",
        "cold: opens of files already cached",
        "cold: plan opens already cached",
        "cold: dir-order prefetched files",
        "warm: passthrough opens",
        "cache index memory per object",
    ];
    if rings {
        head.push("FUSE requests over io_uring (cold / warm)");
    }
    let _ = writeln!(out, "| {} |", head.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(head.len()));
    for r in rows {
        let cold = r.cold_detail.as_ref();
        let warm = r.warm_detail.as_ref();
        let rc = cold.and_then(|d| d.riffle.as_ref());
        let rw = warm.and_then(|d| d.riffle.as_ref());
        let mut cells = vec![
            transport::row_label(r, &system_label),
            count(cold.and_then(|d| d.store_gets)),
            count(warm.and_then(|d| d.store_gets)),
            rc.map_or("—".into(), |c| share(c.opens_already_cached, c.opens)),
            rc.filter(|c| c.plan_opens > 0).map_or("—".into(), |c| {
                share(c.plan_opens_already_cached, c.plan_opens)
            }),
            rc.map_or("—".into(), |c| c.dir_order_fetched_files.to_string()),
            rw.map_or("—".into(), |c| {
                format!(
                    "{} ({})",
                    share(c.passthrough_opens, c.opens),
                    c.passthrough
                )
            }),
            rw.filter(|c| c.cache_objects > 0).map_or("—".into(), |c| {
                format!(
                    "{} B ({} objects)",
                    c.index_memory_per_object, c.cache_objects
                )
            }),
        ];
        if rings {
            cells.push(match (rc, rw) {
                (None, None) => "—".into(),
                _ => format!(
                    "{} / {}",
                    rc.map_or("—".into(), |c| c.ring_requests.to_string()),
                    rw.map_or("—".into(), |c| c.ring_requests.to_string())
                ),
            });
        }
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    Some(out)
}

/// One workload's section: facts of the run, its tables and plots.
pub fn workload_section(w: &WorkloadResult, plot: &dyn Fn(&str) -> Option<String>) -> String {
    let m = &w.meta;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Run {} on commit `{}`; {}. Dataset: {} objects, {:.2} GB (scale {}). Remote: {}. \
         All systems of this workload took {:.0} s.\n",
        m.date,
        m.commit,
        m.machine.describe(),
        m.objects,
        m.bytes as f64 / 1e9,
        m.scale,
        m.remote,
        m.elapsed_s
    );
    for n in &m.notes {
        let _ = writeln!(out, "- {n}");
    }
    if !m.notes.is_empty() {
        out.push('\n');
    }
    for t in tables_of(&m.workload) {
        if !w.rows.iter().any(|r| r.table == t) {
            continue;
        }
        let _ = writeln!(out, "**{}** ({})\n", table_title(&t), unit_note(&t));
        out.push_str(&table(&t, &w.rows));
        out.push('\n');
        let goals = super::goals::goals(&t, &w.rows, &w.rounds);
        if !goals.is_empty() {
            let _ = writeln!(out, "Goals, this run:\n");
            for g in goals {
                let _ = writeln!(out, "- {g}");
            }
            out.push('\n');
        }
        if let Some(cost) = cost_table(&t, &w.rows) {
            let _ = writeln!(
                out,
                "What each epoch cost: GETs counted at the proxy (the store side), and \
                 riffle's own counters (`riffle stats`) over the epoch\n"
            );
            out.push_str(&cost);
            out.push('\n');
        }
        if let Some(img) = plot(&t) {
            let _ = writeln!(out, "![{}]({img})\n", table_title(&t));
        }
    }
    out
}

/// Plot data for every table of a mode.
pub fn plot_tables(mode: &str, results: &ModeResults) -> Vec<PlotTable> {
    let mut out = Vec::new();
    for w in results.workloads.values() {
        for t in tables_of(&w.meta.workload) {
            let rows: Vec<Row> = w.rows.iter().filter(|r| r.table == t).cloned().collect();
            if rows.is_empty() {
                continue;
            }
            match t.as_str() {
                "w4" => {
                    out.push(super::w4::plot(mode, &rows, table_title(&t)));
                    continue;
                }
                "w5" => {
                    out.push(super::w5::plot(mode, &rows, table_title(&t)));
                    continue;
                }
                _ => {}
            }
            let mut points = super::metrics::plot_points(&rows, &short_label);
            points.sort_by_key(|p| rank(&p.system));
            out.push(PlotTable {
                mode: mode.to_string(),
                table: t.clone(),
                title: format!("{} ({mode})", table_title(&t)),
                unit: Unit::of_table(&t).label().to_string(),
                series: throughput_series(),
                points,
                y_max: None,
                reference: None,
            });
        }
    }
    out
}

/// Which modes a README shows, in order, with their headings.
pub const MODES: [(&str, &str); 2] = [
    ("full", "Full run"),
    ("quick", "Quick run (`--quick`: scaled-down smoke test)"),
];

/// The whole README.
pub fn readme(
    modes: &[(String, ModeResults)],
    plot: &dyn Fn(&str, &str) -> Option<String>,
) -> String {
    let mut out = String::from(README_HEAD);
    for (mode, heading) in MODES {
        let Some((_, results)) = modes.iter().find(|(m, _)| m == mode) else {
            continue;
        };
        if results.workloads.is_empty() {
            continue;
        }
        let _ = writeln!(out, "## {heading}\n");
        for (name, w) in &results.workloads {
            let _ = writeln!(out, "### {}\n", name.to_uppercase());
            out.push_str(&workload_section(w, &|t| plot(mode, t)));
        }
    }
    out.push_str(README_TAIL);
    out
}

/// Puts W6's table (`benches/w6.sh`'s `results/w6-MODE.md`, kept across reports) into
/// `text` as the last workload, `### W6`, of the section of `mode` (one of [`MODES`]); a
/// README without that section gets one before `## Memory bound` or `## Not in every run`.
pub fn insert_w6(text: &mut String, mode: &str, w6: &str) {
    let Some((_, heading)) = MODES.iter().find(|(m, _)| *m == mode) else {
        return;
    };
    let body = format!("### W6\n\n{}\n\n", w6.trim_end());
    let head = format!("## {heading}\n");
    let end_of = |text: &str, from: usize| {
        text[from..]
            .find("\n## ")
            .map_or(text.len(), |i| from + i + 1)
    };
    if let Some(at) = text.find(&head) {
        let end = end_of(text, at + head.len());
        text.insert_str(end, &body);
        return;
    }
    let at = ["## Memory bound", "## Not in every run"]
        .iter()
        .find_map(|h| text.find(h))
        .unwrap_or(text.len());
    text.insert_str(at, &format!("{head}\n{body}"));
}

const README_HEAD: &str = "\
# rifflefs benchmarks

Generated by `benches/run.sh` from `benches/results/*.json`; edit the text in
`benches/harness/src/results/render.rs`, not here. The workloads and baselines
are those of `shared/BENCHMARKS.md`.

**How to reproduce:** `benches/run.sh W1 W2 W5` (full datasets, about 25
minutes here once the datasets are uploaded, 5 goal rounds included; add
`W3` for the 4 GiB random-read workload) or
`benches/run.sh --quick` (scaled-down datasets, a few minutes). Needs root
(FUSE mounts, dropping the page cache), the local Ceph RGW
(`deploy/local/rgw.sh`, started if down), `s3fs` and `rclone` (installed with
apt if missing) and Python 3 with matplotlib for the plots (a venv in
`benches/.venv`; `--no-plots` skips it). The Mountpoint peer is a bench-only
binary over the `mountpoint-s3-fs` library (`benches/mountpoint`), built by
full runs (about 10 minutes the first time) or `--build-mountpoint`.

**CI smoke test:** `benches/run.sh --quick --debug --no-plots` uses the debug
build CI already has for the tests, installs what it needs (s3fs, rclone and
fuse3 with apt; Ceph through `deploy/local/rgw.sh up`), takes four to five
minutes after the build here (half a minute of it the Python reader's W1
rows), and exits non-zero when any system returned a wrong byte (to either
reader) or any riffle variant failed to run, lost its mount or hit an I/O
error. Mountpoint runs in it only if `benches/mountpoint` is already built.

How to read the tables:

- **The remote** is Ceph RGW on loopback behind `riffle-proxy`: 30 ms before
  the first byte of every response and 100 MB/s per connection, like S3 seen
  from a nearby instance. \"no proxy\" columns are RGW straight on loopback.
  The proxy also counts the GETs of every epoch: what each epoch really cost
  at the store.
- **Every system is read by the same reader**, `riffle-bench read-fs`, which
  verifies every byte (whole files against the manifest's checksums, random
  reads against the regenerated content); a wrong byte shows as
  **WRONG BYTES** and fails the run.
- **W1 adds the Python reader**, `benches/python_reader.py` (Python's
  standard library only): what a PyTorch `DataLoader` does per file. 8 worker
  processes (fork) take the epoch's files round-robin (worker i: files i,
  i + 8, ...); each file is opened, read whole with `f.read()` (Python's own
  `fstat`, `isatty` ioctl and `lseek` calls included) and closed, and its size
  and zlib CRC-32 are checked (regenerated by `riffle-bench plan --crc32`: the
  manifest's XXH3 is not in Python's standard library). It reads the same
  files in the same order as read-fs (`riffle-bench plan` prints read-fs's
  order), on local disk's copy right after read-fs and on fresh riffle mounts
  with and without a plan: the **Python reader:** rows. Their \"÷ local\"
  columns divide by the Python reader's own local-disk row; they have no
  \"÷ best peer\" (the peers are read by read-fs). A wrong byte fails the run
  as with read-fs.
- **The page cache is dropped** (`sync; echo 3 > /proc/sys/vm/drop_caches`)
  before every epoch, for every system alike, so \"warm\" means the system's own
  cache (memory or disk), never the kernel's.
- **First reads**: on this VM the first read of files just written to its
  disk is often slower than later reads of the same files, whoever wrote
  them. Over six fresh W2 copies (measured outside a run), local disk's
  first read of the copy took 2.9–5.7 s (median 4.4 s) and its second read
  2.6–3.6 s; riffle's warm W2 epoch is likewise its first read of the cache
  files its cold epoch wrote. The cause lies below the file system and was
  not found: the first read sends the same reads to the disk, the extra time
  is kernel CPU copying pages to the reader, it shows for files written
  buffered (the copy) as for files written with `O_DIRECT` (riffle's cache),
  and touching 6 GiB of memory just before did not remove it (3.6 and 4.5 s
  against 4.1 and 4.7 s without). It varies from run to run (none to 2×),
  and local disk's W1 epochs (small files) do not show it. Earlier runs
  blamed the virtual disk, then the VM handing freed memory back to its host
  (riffle's cold epoch was thought to leave no page cache to free; it leaves
  its 4.2 GB of FUSE page cache, as local disk's epochs leave theirs). So
  W2's goal lines also compare like with like: riffle's warm epoch with
  local disk's epoch 1 (a first read each) and riffle's epoch 3 with local
  disk's (a re-read each).
- **local disk**: the dataset already on the local disk. **copy-first**: the
  init-container practice, 64 parallel downloads to local disk through the
  proxy, then the local epoch; its cold figure includes the copy.
  **S3 client**: `riffle-bench read-s3`, the store read directly with 64
  requests in flight and no file system, as a reference for what the remote
  can deliver.
- **riffle** rows are `riffle mount` of the same build, each a fresh mount with
  a fresh cache directory on local disk, `--metadata-ttl indefinite`:
  **riffle, no plan (disk cache, passthrough)** is `--cache-dir` and nothing
  else, what unchanged training code gets (epoch prefetch is on by default), with
  FUSE passthrough for files complete in the cache; **no passthrough** adds
  `--no-passthrough`; **browsing §** is a fresh default mount read by one thread
  opening 200 files drawn at random from the whole dataset (what browsing costs);
  **+ epoch plan** calls `riffle plan MNT FILE` right before each epoch with the
  exact order the reader will open (`riffle-bench plan` prints it from the
  reader's own order function); **listing order ‡** is read in sorted path
  order instead of a shuffle, with no plan (riffle's directory-order detection).
  **, dev-fuse** rows (issue 50) are the row above them mounted with
  `--fuse-transport dev-fuse`, every FUSE request over `/dev/fuse` (a read and a
  writev per request), where the other riffle rows ask for riffle's default
  (`auto`; `RIFFLE_BENCH_FUSE_TRANSPORT=io-uring` asks for the kernel's io_uring
  rings, which `benches/run.sh` switches on where it can); each riffle row's
  label ends with the transport `riffle stats` reported right after mounting,
  `[io_uring]` or `[/dev/fuse]`, and its note with the whole text.
  **s3fs**: with its local file cache (`use_cache`). **rclone**: `rclone mount
  --vfs-cache-mode full`. **Mountpoint**: Mountpoint for S3 through its
  library, with its local disk cache.
- **Run order**: local disk and copy-first (they share the copy; the Python
  reader's local-disk epochs follow read-fs's on it), then riffle + epoch
  plan right after them, then the S3 client, the other riffle rows (riffle
  read by the Python reader right after riffle) and the peers. The planned
  cold epoch and copy-first are the pair the issue-4 goal compares, so they
  run back to back: each system leaves 12,000 files or more on the same disk
  and the machine's state drifts during a run. In position six (after the S3
  client, riffle and riffle without passthrough) the planned cold W1 epoch
  took 7.4 s where it took 5.5 s right after copy-first and 6.0 s after one
  other riffle row, on the same build, minutes apart.
- **Rounds**: the comparisons the goals are set on run again after every
  system ran once, one after another in the same run
  (`RIFFLE_BENCH_GOAL_ROUNDS`, 5 rounds in all in full runs): W1 copy-first
  (a new copy and local disk's epochs, read-fs's and the Python reader's),
  riffle + epoch plan, riffle and riffle read by the Python reader (each a
  fresh mount and cache; each riffle row followed by its dev-fuse row when
  that runs); W2 a new copy and local disk's three epochs,
  then a fresh riffle mount's three epochs, so riffle's warm epoch is again
  the first read of cache files just written, as local disk's epoch 1 is of
  its copy. A round's ratio comes from that round's results
  alone; a goal line gives the median over the rounds and every round's
  value, so one disturbed epoch on this shared machine neither makes nor
  breaks a goal. The tables show the first round. Goals against a peer that
  ran once (s3fs, Mountpoint) use the first round.
- **Ratios are the result**: absolute numbers on this shared 2-core machine,
  where RGW, the proxy, the daemon and the reader share the cores, are noise.
  \"÷ local\" and \"÷ best peer\" divide the row's throughput by that of local
  disk and of the best of copy-first, s3fs, rclone and Mountpoint in the same
  run and epoch. The daemon's peak RSS is `VmHWM` after both epochs. Each
  workload notes the machine's load average during it: this machine is shared
  with other jobs, and runs minutes apart differ by up to 2× in absolute
  numbers (the virtual disk's speed varies as much), less so in ratios.
- **CPU** (W1, W2, W3): \"CPU s per 1,000 files\" (W1) or \"per GB\" (W2,
  W3) is the whole machine's busy CPU time over the epoch (`/proc/stat`,
  user + nice + system + irq + softirq of every core, sampled by the reader
  when its clock starts and stops) divided by what the epoch read; it holds
  the reader, the daemon, the kernel's work for them and RGW and the proxy,
  which share this machine. \"daemon share\" is the system's daemon's part of
  it (`/proc/PID/stat` utime + stime, all its threads, not its children;
  riffle's daemon, s3fs, rclone, Mountpoint; \"—\" without a daemon).
  copy-first's cold figure includes the copy's CPU. Other jobs on this
  shared machine count too (the load average under each workload says how
  busy it was), so compare the rows of one run, not runs.
- **Goals** under a table are the issues' goals, checked on that run.

";

const README_TAIL: &str = "\
## Not in every run

- **W3** is not part of the default full run (`benches/run.sh W3` adds it).
- **W4** is part of the default full run and takes about an hour the first
  time (uploading its 1.1 M objects to the local RGW takes ~20 min, and RGW's
  memstore then holds ~15 GB: restart it before the other workloads);
  `benches/run.sh W1 W2 W5` runs the others without it.
- **W6** (three nodes reading as one data-parallel job, with and without
  `--peers`) is part of the default full run (3 rounds, W1's data at scale
  0.3) but not of `--quick`'s default: its six rows take about 4 minutes in
  debug on this machine, too long for CI's smoke run; `benches/run.sh --quick
  W6` runs it (1 round). `benches/w6.sh [--quick|--full] [--release]` runs it
  alone. Its table (`benches/results/w6-MODE.md`, kept across reports) is W6
  of its mode above, with issue 38's goals under it.
- **W6 on paper: 64 nodes × 8 GPUs.** The model W6 measures (3 nodes here):
  without peers each node's epoch prefetch pulls the whole set from the store
  in epoch 1 (3.00 GETs per file on 3 nodes, so N× the egress), and with caches
  smaller than the set a node's cache misses about its uncached share every
  epoch (0.93 GETs per file at 40% each); with peers the cluster fetches each
  file once in epoch 1 and never again while the caches together hold the set
  (each node keeps room for its owned share, set ÷ N), and a node reads
  (N−1)/N of its share from peers. Per-node read rate assumed: 8 GPUs at
  ~375 images/s each (ResNet-50 on A100) ≈ 3,000 files/s ≈ 330 MB/s.

  | dataset, cache per node | egress epoch 1 / later, no peers | egress epoch 1 / later, peers | peer traffic per node and epoch (in ≈ out) | network per node |
  |---|---|---|---|---|
  | ImageNet-1k (1.28 M files, 150 GB), 150 GB (whole set) | 9.6 TB / 0 | 150 GB / 0 | 2.3 GB of reads (+ up to 150 GB in epoch 1 if every node's prefetch copies the set) | ≈ 2.6 Gbit/s |
  | ImageNet-1k, 60 GB (40%) | ≈ 320 GB / ≈ 140 GB every epoch | 150 GB / 0 (owned share 2.3 GB fits) | 2.3 GB | ≈ 2.6 Gbit/s |
  | 50 TB set, 4 TB NVMe (8%) | ≥ 50 TB / ≈ 46 TB every epoch | 50 TB / 0 (owned share 780 GB fits) | ≈ 770 GB | at 1 GB/s read per node ≈ 8 Gbit/s in and out |

  So peers turn N× (or every-epoch) egress into one copy of the set per job,
  at a peer bandwidth equal to the node's own read rate: a few Gbit/s on
  100–400 Gbit/s GPU-node networks.
";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::Outcome;

    fn row(system: &str, column: Column, secs: f64) -> Row {
        let o = Outcome {
            files: 100,
            bytes: 100_000_000,
            elapsed_s: secs,
            first_256_s: Some(0.5),
            ..Outcome::default()
        };
        Row {
            cold: Some(o.clone()),
            warm: Some(o),
            rss_kb: Some(204_800),
            ..Row::new("w1", system, column, "ok")
        }
    }

    #[test]
    fn w6_goes_last_in_its_modes_section_or_gets_one() {
        let mut text = "# B\n\n## Full run\n\n### W1\n\nt1\n\n## Quick run (`--quick`: scaled-down smoke test)\n\n### W1\n\nq1\n\n## Not in every run\n".to_string();
        insert_w6(&mut text, "full", "W6 full table\n");
        insert_w6(&mut text, "quick", "W6 quick table");
        assert_eq!(
            text,
            "# B\n\n## Full run\n\n### W1\n\nt1\n\n### W6\n\nW6 full table\n\n## Quick run (`--quick`: scaled-down smoke test)\n\n### W1\n\nq1\n\n### W6\n\nW6 quick table\n\n## Not in every run\n"
        );
        let mut bare = "# B\n\n## Memory bound\n\nm\n".to_string();
        insert_w6(&mut bare, "quick", "W6 q");
        assert_eq!(
            bare,
            "# B\n\n## Quick run (`--quick`: scaled-down smoke test)\n\n### W6\n\nW6 q\n\n## Memory bound\n\nm\n"
        );
        let mut last = "# B\n\n## Full run\n\n### W1\n".to_string();
        insert_w6(&mut last, "full", "x");
        assert_eq!(last, "# B\n\n## Full run\n\n### W1\n### W6\n\nx\n\n");
    }

    #[test]
    fn table_has_ratios_rss_and_direct_columns() {
        let mut rclone = row("rclone", Column::Proxy, 20.0);
        rclone.status = "not run: rclone is not installed".into();
        let rows = vec![
            row("riffle", Column::Proxy, 10.0),
            row("local", Column::Proxy, 1.0),
            row("s3fs", Column::Proxy, 40.0),
            rclone,
            row("riffle", Column::Direct, 5.0),
        ];
        let t = table("w1", &rows);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].contains("no proxy: cold"));
        assert!(lines[2].starts_with("| local disk |"), "{t}");
        assert!(
            lines[3]
                .contains("| riffle, no plan (disk cache, passthrough) | 10.0 files/s (10.0 s)"),
            "{t}"
        );
        assert!(lines[3].contains("0.10×"), "riffle vs local: {t}");
        assert!(lines[3].contains("4.00× (s3fs)"), "riffle vs s3fs: {t}");
        assert!(lines[3].contains("200 MiB"));
        assert!(lines[3].contains("20.0 files/s (5.0 s)"), "direct: {t}");
        assert!(t.contains("not run: rclone is not installed"));
        assert!(
            !t.contains("epoch 3"),
            "no re-read columns without one: {t}"
        );
    }

    #[test]
    fn python_rows_divide_by_the_python_readers_local_disk() {
        let rows = vec![
            row("local", Column::Proxy, 1.0),
            row("riffle", Column::Proxy, 2.0),
            row("s3fs", Column::Proxy, 40.0),
            row("riffle-py", Column::Proxy, 5.0),
            row("local-py", Column::Proxy, 4.0),
        ];
        let t = table("w1", &rows);
        let lines: Vec<&str> = t.lines().collect();
        // The Python reader's rows come last, local disk first.
        assert!(
            lines[5].starts_with("| Python reader: local disk | 25.0 files/s (4.0 s) |"),
            "{t}"
        );
        assert!(
            lines[5].contains("| 1.00× | 1.00× | — | — |"),
            "its own baseline, no peer: {t}"
        );
        assert!(
            lines[6].starts_with("| Python reader: riffle, no plan | 20.0 files/s (5.0 s) |"),
            "{t}"
        );
        assert!(
            lines[6].contains("| 0.80× | 0.80× | — | — |"),
            "÷ the Python reader's local disk (4 s), not read-fs's (1 s): {t}"
        );
        // read-fs rows are unchanged: riffle ÷ local disk, and its best peer.
        assert!(
            lines[3].contains("| 0.50× | 0.50× | 20.00× (s3fs) |"),
            "{t}"
        );
    }

    #[test]
    fn table_shows_cpu_columns_once_a_row_recorded_cpu() {
        let cpu = |machine, daemon| {
            Some(crate::cpu::CpuUse {
                ticks_per_s: 100,
                machine_ticks: machine,
                daemon_ticks: daemon,
            })
        };
        let mut local = row("local", Column::Proxy, 1.0);
        let mut riffle = row("riffle", Column::Proxy, 2.0);
        for o in [&mut local.cold, &mut local.warm].into_iter().flatten() {
            o.cpu = cpu(20, None);
        }
        for (o, m) in [(&mut riffle.cold, 50), (&mut riffle.warm, 10)] {
            if let Some(o) = o.as_mut() {
                o.cpu = cpu(m, Some(m / 2));
            }
        }
        let t = table("w1", &[local, riffle]);
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[0].ends_with(
                "| daemon peak RSS | CPU s per 1,000 files (cold / warm) | daemon share (cold / warm) |"
            ),
            "{t}"
        );
        // 100 files: 0.2 s of CPU is 2 s per 1,000 files.
        assert!(lines[2].ends_with("| 200 MiB | 2.00 / 2.00 | — |"), "{t}");
        assert!(
            lines[3].ends_with("| 200 MiB | 5.00 / 1.00 | 50% / 50% |"),
            "{t}"
        );
    }

    #[test]
    fn dev_fuse_twins_follow_their_rows_and_labels_say_what_ran() {
        let rings = "io_uring: 2 queues of 8 entries (1024 KiB payloads)";
        let dev_fuse = "/dev/fuse: asked for (--fuse-transport dev-fuse)";
        let with = |system: &str, t: &str, note: Option<&str>| Row {
            transport: Some(t.into()),
            note: note.map(str::to_string),
            ..row(system, Column::Proxy, 1.0)
        };
        let rows = vec![
            with("riffle-devfuse-py", dev_fuse, None),
            with(
                "riffle-nopt-devfuse",
                dev_fuse,
                Some("as riffle-nopt, over /dev/fuse"),
            ),
            with("riffle", rings, Some("the defaults")),
            row("local", Column::Proxy, 1.0),
            with("riffle-devfuse", dev_fuse, None),
            with("riffle-nopt", rings, None),
            with("riffle-py", rings, None),
        ];
        let t = table("w1", &rows);
        let labels: Vec<&str> = t
            .lines()
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|l| l.split(" | ").next().unwrap_or_default())
            .collect();
        assert_eq!(
            labels,
            [
                "| local disk",
                "| riffle, no plan (disk cache, passthrough) [io_uring]",
                "| riffle, no plan (disk cache, passthrough), dev-fuse [/dev/fuse]",
                "| riffle (disk cache, no passthrough) [io_uring]",
                "| riffle (disk cache, no passthrough), dev-fuse [/dev/fuse]",
                "| Python reader: riffle, no plan [io_uring]",
                "| Python reader: riffle, no plan, dev-fuse [/dev/fuse]",
            ],
            "{t}"
        );
        assert!(
            t.contains(
                "- riffle, no plan (disk cache, passthrough) [io_uring]: the defaults; FUSE \
                 transport (`riffle stats` right after mounting): io_uring: 2 queues of 8 \
                 entries (1024 KiB payloads)"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "- riffle (disk cache, no passthrough), dev-fuse [/dev/fuse]: as riffle-nopt, \
                 over /dev/fuse; FUSE transport (`riffle stats` right after mounting): \
                 /dev/fuse: asked for (--fuse-transport dev-fuse)"
            ),
            "{t}"
        );
        assert!(
            !t.contains("this table does not measure FUSE over io_uring"),
            "{t}"
        );
        assert_eq!(
            short_label("riffle-nopt-devfuse"),
            "riffle\nno passthrough\n/dev/fuse"
        );

        // Every riffle row on /dev/fuse (the kernel's switch off): the table says so.
        let off: Vec<Row> = rows
            .into_iter()
            .map(|r| Row {
                transport: r
                    .transport
                    .map(|_| "/dev/fuse: the kernel's FUSE io_uring is off".to_string()),
                ..r
            })
            .collect();
        let t = table("w1", &off);
        assert!(
            t.contains("| riffle, no plan (disk cache, passthrough) [/dev/fuse] |"),
            "{t}"
        );
        assert!(
            t.contains("- FUSE transport: every riffle row of this table ran over /dev/fuse"),
            "{t}"
        );
    }

    #[test]
    fn cost_table_counts_ring_requests_once_rows_recorded_a_transport() {
        let counters = |ring_requests| {
            Some(super::super::PassDetail {
                store_gets: Some(0),
                riffle: Some(super::super::RiffleCounters {
                    ring_requests,
                    ..Default::default()
                }),
                ..Default::default()
            })
        };
        let mut riffle = row("riffle", Column::Proxy, 1.0);
        riffle.cold_detail = counters(5000);
        riffle.warm_detail = counters(3000);
        let old = cost_table("w1", std::slice::from_ref(&riffle)).expect("table");
        assert!(!old.contains("io_uring"), "{old}");
        riffle.transport = Some("io_uring: 2 queues of 8 entries (1024 KiB payloads)".into());
        let t = cost_table("w1", &[riffle]).expect("table");
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[0].ends_with("| FUSE requests over io_uring (cold / warm) |"),
            "{t}"
        );
        assert!(
            lines[2].starts_with("| riffle, no plan (disk cache, passthrough) [io_uring] |"),
            "{t}"
        );
        assert!(lines[2].ends_with("| 5000 / 3000 |"), "{t}");
    }

    fn w2_row(system: &str, warm_secs: f64, epoch3_secs: Option<f64>) -> Row {
        let o = |secs: f64| Outcome {
            files: 16,
            bytes: 1_600_000_000,
            elapsed_s: secs,
            ..Outcome::default()
        };
        Row {
            table: "w2".into(),
            warm: Some(o(warm_secs)),
            epoch3: epoch3_secs.map(o),
            rss_kb: None,
            ..row(system, Column::Proxy, 2.0)
        }
    }

    #[test]
    fn table_with_epoch3_has_reread_columns_and_their_note() {
        let rows = vec![
            w2_row("local", 1.0, Some(0.8)),
            w2_row("riffle", 1.6, Some(1.0)),
            w2_row("s3fs", 4.0, None),
        ];
        let t = table("w2", &rows);
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[0].starts_with(
                "| system | cold (epoch 1) | warm (epoch 2) | re-read (epoch 3) | \
                 cold ÷ local | warm ÷ local | epoch 3 ÷ local | cold ÷ best peer |"
            ),
            "{t}"
        );
        assert_eq!(lines[1], "|---|---|---|---|---|---|---|---|---|---|", "{t}");
        assert!(
            lines[2].starts_with(
                "| local disk | 50.0 MB/s (2.0 s) | 1600 MB/s (1.0 s) | 2000 MB/s (0.8 s) | \
                 1.00× | 1.00× | 1.00× |"
            ),
            "{t}"
        );
        assert!(
            lines[3].contains(
                "| 1000 MB/s (1.6 s) | 1600 MB/s (1.0 s) | 1.00× | 0.62× | 0.80× | 1.00× (s3fs) |"
            ),
            "riffle: {t}"
        );
        assert!(
            lines[4].contains("| 400 MB/s (4.0 s) | — | 1.00× | 0.25× | — |"),
            "s3fs has no epoch 3: {t}"
        );
        assert!(
            t.contains("- re-read (epoch 3): riffle's warm epoch (2) is its first read"),
            "{t}"
        );
    }
}
