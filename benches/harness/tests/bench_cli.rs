//! The `riffle-bench` binary without a store: a manifest-only `gen`, the
//! reader's exit codes on right and wrong bytes, and `record` + `report`
//! turning results into README tables.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use riffle_bench::content::Content;
use riffle_bench::manifest::Manifest;

const BIN: &str = env!("CARGO_BIN_EXE_riffle-bench");

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("AWS_ENDPOINT_URL")
        .output()
        .expect("run riffle-bench")
}

fn text(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Writes the manifest's files under `root` as `gen` would upload them.
fn materialize(manifest: &Manifest, root: &Path) {
    for e in &manifest.entries {
        let p = root.join(&e.key);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        let bytes = Content::new(manifest.header.seed, &e.key).bytes(0, e.size as usize);
        std::fs::write(p, bytes).expect("write");
    }
}

/// W1's manifest at scale 0.002 (seed 7) written under `dir`, and its files made under
/// `dir/data`: (manifest path, manifest, data root).
fn w1_tree(dir: &Path) -> (PathBuf, Manifest, PathBuf) {
    let manifest = dir.join("w1.manifest");
    let out = run(&[
        "gen",
        "--workload",
        "w1",
        "--scale",
        "0.002",
        "--seed",
        "7",
        "--bucket",
        "bench",
        "--manifest",
        text(&manifest),
        "--manifest-only",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = Manifest::read(&manifest).expect("manifest");
    let root = dir.join("data");
    materialize(&m, &root);
    (manifest, m, root)
}

#[test]
fn read_fs_passes_on_right_bytes_and_fails_on_a_flipped_byte() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (manifest, m, root) = w1_tree(dir.path());
    assert_eq!(m.entries.len(), 40);

    let json = dir.path().join("out.json");
    let args = [
        "read-fs",
        "--root",
        text(&root),
        "--manifest",
        text(&manifest),
        "--pattern",
        "w1",
        "--json-out",
        text(&json),
    ];
    let ok = run(&args);
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse");
    assert_eq!(report["files"], 40);
    assert_eq!(report["mismatches"], 0);

    let victim = root.join(&m.entries[5].key);
    let mut bytes = std::fs::read(&victim).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 0x80;
    std::fs::write(&victim, bytes).expect("write");
    let bad = run(&args);
    assert_eq!(
        bad.status.code(),
        Some(1),
        "wrong bytes must fail the reader"
    );
    assert!(String::from_utf8_lossy(&bad.stderr).contains("WRONG BYTES"));
}

#[test]
fn gen_without_endpoint_explains_itself() {
    let dir = tempfile::tempdir().expect("tempdir");
    let manifest = dir.path().join("s.manifest");
    let out = run(&[
        "gen",
        "--workload",
        "sample",
        "--bucket",
        "bench",
        "--manifest",
        text(&manifest),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--endpoint"));
}

#[test]
fn record_and_report_write_tables_and_check_wrong_bytes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let manifest = dir.path().join("w2.manifest");
    let out = run(&[
        "gen",
        "--workload",
        "w2",
        "--scale",
        "0.004",
        "--bucket",
        "bench",
        "--manifest",
        text(&manifest),
        "--manifest-only",
    ]);
    assert!(out.status.success());
    let runf = dir.path().join("run.jsonl");
    let pass = |name: &str, secs: f64, wrong: u64| {
        let p = dir.path().join(name);
        let o = serde_json::json!({"tool": "read-fs", "pattern": "w2", "source": "/x",
            "threads": 4, "epoch": 1, "seed": 0, "files": 16, "bytes": 16_000_000u64,
            "reads": 16, "elapsed_s": secs, "files_per_s": 0.0, "mb_per_s": 16.0 / secs,
            "reads_per_s": 0.0, "errors": 0, "mismatches": wrong, "problems": []});
        std::fs::write(&p, o.to_string()).expect("write");
        p
    };
    let (l1, l2, l3, r1, r2) = (
        pass("l1", 0.1, 0),
        pass("l2", 0.1, 0),
        pass("l3", 0.05, 0),
        pass("r1", 1.0, 0),
        pass("r2", 0.5, 3),
    );
    // riffle's epoch 3 left no result: recorded as absent.
    let r3 = dir.path().join("r3-missing");
    for (system, cold, warm, epoch3) in [("local", &l1, &l2, &l3), ("riffle", &r1, &r2, &r3)] {
        let out = run(&[
            "record",
            "row",
            "--run",
            text(&runf),
            "--table",
            "w2",
            "--system",
            system,
            "--cold",
            text(cold),
            "--warm",
            text(warm),
            "--epoch3",
            text(epoch3),
            "--rss-kb",
            "1024",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = run(&[
        "record",
        "row",
        "--run",
        text(&runf),
        "--table",
        "w2",
        "--system",
        "s3fs",
        "--status",
        "not run: s3fs is not installed",
    ]);
    assert!(out.status.success());
    let out = run(&[
        "record",
        "meta",
        "--run",
        text(&runf),
        "--workload",
        "w2",
        "--mode",
        "quick",
        "--manifest",
        text(&manifest),
        "--commit",
        "abc",
        "--date",
        "2026-01-01T00:00:00Z",
        "--elapsed-s",
        "12",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let readme = dir.path().join("README.md");
    let results = dir.path().join("results");
    let plots = dir.path().join("plots");
    let out = run(&[
        "report",
        "--run",
        text(&runf),
        "--results-dir",
        text(&results),
        "--readme",
        text(&readme),
        "--plots-dir",
        text(&plots),
        "--check",
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "riffle's warm epoch read wrong bytes"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(
            "| riffle, no plan (disk cache, passthrough) | 16.0 MB/s (1.0 s) | **WRONG BYTES** (3 reads) | — |"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("| local disk | 160 MB/s (0.1 s) | 160 MB/s (0.1 s) | 320 MB/s (0.1 s) |"),
        "{stdout}"
    );
    assert!(stdout.contains("| epoch 3 ÷ local |"), "{stdout}");
    let md = std::fs::read_to_string(&readme).expect("readme");
    assert!(md.contains("## Quick run"));
    assert!(md.contains("not run: s3fs is not installed"));
    assert!(md.contains("commit `abc`"));
    assert!(results.join("quick.json").is_file());
}

#[test]
fn rows_record_the_transport_riffle_stats_gave_after_mounting() {
    let dir = tempfile::tempdir().expect("tempdir");
    let manifest = dir.path().join("w2.manifest");
    let out = run(&[
        "gen",
        "--workload",
        "w2",
        "--scale",
        "0.004",
        "--bucket",
        "bench",
        "--manifest",
        text(&manifest),
        "--manifest-only",
    ]);
    assert!(out.status.success());
    let pass = dir.path().join("pass.json");
    let o = serde_json::json!({"tool": "read-fs", "pattern": "w2", "source": "/x",
        "threads": 4, "epoch": 1, "seed": 0, "files": 16, "bytes": 16_000_000u64,
        "reads": 16, "elapsed_s": 0.5, "files_per_s": 0.0, "mb_per_s": 32.0,
        "reads_per_s": 0.0, "errors": 0, "mismatches": 0, "problems": []});
    std::fs::write(&pass, o.to_string()).expect("write");
    let runf = dir.path().join("run.jsonl");
    for (system, transport) in [
        (
            "riffle-nopt",
            "io_uring: 2 queues of 8 entries (1024 KiB payloads)",
        ),
        (
            "riffle-nopt-devfuse",
            "/dev/fuse: asked for (--fuse-transport dev-fuse)",
        ),
    ] {
        // As `riffle stats --json` prints it.
        let stats = dir.path().join(format!("{system}.mount-stats.json"));
        let json = serde_json::json!({"fuse": {"opens": 0, "transport": transport}});
        std::fs::write(&stats, serde_json::to_string_pretty(&json).expect("json")).expect("write");
        let out = run(&[
            "record",
            "row",
            "--run",
            text(&runf),
            "--table",
            "w2",
            "--system",
            system,
            "--cold",
            text(&pass),
            "--warm",
            text(&pass),
            "--mount-stats",
            text(&stats),
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let recorded = std::fs::read_to_string(&runf).expect("run file");
    assert!(
        recorded.contains(r#""transport":"io_uring: 2 queues of 8 entries (1024 KiB payloads)""#),
        "{recorded}"
    );
    let out = run(&[
        "record",
        "meta",
        "--run",
        text(&runf),
        "--workload",
        "w2",
        "--mode",
        "quick",
        "--manifest",
        text(&manifest),
        "--commit",
        "abc",
        "--date",
        "2026-01-01T00:00:00Z",
        "--elapsed-s",
        "1",
    ]);
    assert!(out.status.success());
    let out = run(&[
        "report",
        "--run",
        text(&runf),
        "--results-dir",
        text(&dir.path().join("results")),
        "--readme",
        text(&dir.path().join("README.md")),
        "--check",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("| riffle (disk cache, no passthrough) [io_uring] | 32.0 MB/s (0.5 s) |"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "| riffle (disk cache, no passthrough), dev-fuse [/dev/fuse] | 32.0 MB/s (0.5 s) |"
        ),
        "{stdout}"
    );
}

/// `benches/python_reader.py`, the Python reader.
fn python_reader() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../python_reader.py")
}

/// Runs the Python reader, or `None` when this machine has no python3.
fn run_python(args: &[&str]) -> Option<Output> {
    match Command::new("python3")
        .arg(python_reader())
        .args(args)
        .output()
    {
        Ok(out) => Some(out),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("python3 not found: the Python reader is not tested");
            None
        }
        Err(e) => panic!("run python3: {e}"),
    }
}

#[test]
fn python_reader_reads_read_fs_order_and_fails_on_a_flipped_byte() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (manifest, m, root) = w1_tree(dir.path());

    // The --crc32 plan is the plain plan (read-fs's order) with each file's
    // size and zlib CRC-32.
    let plan_args = |extra: &[&str]| {
        let mut a = vec![
            "plan",
            "--manifest",
            text(&manifest),
            "--seed",
            "7",
            "--epoch",
            "2",
            "--max-files",
            "30",
        ];
        a.extend_from_slice(extra);
        let out = run(&a);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8")
    };
    let plain = plan_args(&[]);
    let with_sums = plan_args(&["--crc32"]);
    let paths: Vec<&str> = with_sums
        .lines()
        .map(|l| l.split('\t').next().expect("path"))
        .collect();
    assert_eq!(paths, plain.lines().collect::<Vec<_>>());
    assert_eq!(paths.len(), 30);
    let first = with_sums.lines().next().expect("line");
    let e = m.entries.iter().find(|e| e.key == paths[0]).expect("entry");
    let bytes = Content::new(7, &e.key).bytes(0, e.size as usize);
    assert_eq!(
        first,
        format!(
            "{}\t{}\t{:08x}",
            e.key,
            e.size,
            riffle_bench::content::crc32_of(&bytes)
        )
    );
    let plan = dir.path().join("e2.tsv");
    std::fs::write(&plan, &with_sums).expect("write");

    let json = dir.path().join("py.json");
    let args = [
        "--root",
        text(&root),
        "--plan",
        text(&plan),
        "--workers",
        "3",
        "--seed",
        "7",
        "--epoch",
        "2",
        "--json-out",
        text(&json),
    ];
    let Some(ok) = run_python(&args) else { return };
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    // The result has read-fs's shape: the results machinery reads it.
    let o: riffle_bench::outcome::Outcome =
        serde_json::from_str(std::fs::read_to_string(&json).expect("json").trim())
            .expect("an Outcome");
    assert_eq!((o.files, o.errors, o.mismatches), (30, 0, 0));
    let want: u64 = paths
        .iter()
        .map(|p| m.entries.iter().find(|e| e.key == *p).expect("entry").size)
        .sum();
    assert_eq!(o.bytes, want);
    assert_eq!((o.epoch, o.seed, o.threads), (2, 7, 3));
    assert!(o.first_256_s.is_some() && o.elapsed_s > 0.0);
    let right = dir.path().join("py-right.json");
    std::fs::copy(&json, &right).expect("copy");

    // A plain plan checked against a sums file (all files, listing order).
    let sums = dir.path().join("sums.tsv");
    std::fs::write(&sums, plan_args(&["--order", "listing", "--crc32"])).expect("write");
    let plain_plan = dir.path().join("e2.txt");
    std::fs::write(&plain_plan, &plain).expect("write");
    let out = run_python(&[
        "--root",
        text(&root),
        "--plan",
        text(&plain_plan),
        "--sums",
        text(&sums),
    ])
    .expect("python3");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // One flipped byte fails the reader (exit 1); a missing file is an I/O
    // error (exit 2 when nothing was wrong).
    let victim = root.join(paths[4]);
    let mut bytes = std::fs::read(&victim).expect("read");
    bytes[1000] ^= 0x01;
    std::fs::write(&victim, &bytes).expect("write");
    let bad = run_python(&args).expect("python3");
    assert_eq!(
        bad.status.code(),
        Some(1),
        "wrong bytes must fail the reader"
    );
    assert!(String::from_utf8_lossy(&bad.stderr).contains("WRONG BYTES"));
    let o: riffle_bench::outcome::Outcome =
        serde_json::from_str(std::fs::read_to_string(&json).expect("json").trim())
            .expect("an Outcome");
    assert_eq!((o.files, o.mismatches), (29, 1));
    // ... and the run: `report --check` fails on the Python reader's row as
    // on read-fs's.
    let wrong = dir.path().join("py-wrong.json");
    std::fs::copy(&json, &wrong).expect("copy");
    let runf = dir.path().join("run.jsonl");
    for (system, warm) in [("local-py", &right), ("riffle-py", &wrong)] {
        let out = run(&[
            "record",
            "row",
            "--run",
            text(&runf),
            "--table",
            "w1",
            "--system",
            system,
            "--cold",
            text(&right),
            "--warm",
            text(warm),
        ]);
        assert!(out.status.success());
    }
    let out = run(&[
        "record",
        "meta",
        "--run",
        text(&runf),
        "--workload",
        "w1",
        "--mode",
        "quick",
        "--manifest",
        text(&manifest),
        "--commit",
        "abc",
        "--date",
        "2026-01-01T00:00:00Z",
        "--elapsed-s",
        "1",
    ]);
    assert!(out.status.success());
    let readme = dir.path().join("README.md");
    let out = run(&[
        "report",
        "--run",
        text(&runf),
        "--results-dir",
        text(dir.path()),
        "--readme",
        text(&readme),
        "--check",
        "--require",
        "riffle",
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "the Python reader read wrong bytes"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("WRONG BYTES: w1 riffle-py"), "{stderr}");
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.starts_with("| Python reader: riffle, no plan |")
                && l.contains("| **WRONG BYTES** (1 reads) |")),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    bytes[1000] ^= 0x01;
    std::fs::write(&victim, &bytes).expect("write");
    std::fs::remove_file(root.join(paths[9])).expect("rm");
    let gone = run_python(&args).expect("python3");
    assert_eq!(gone.status.code(), Some(2));
    let o: riffle_bench::outcome::Outcome =
        serde_json::from_str(std::fs::read_to_string(&json).expect("json").trim())
            .expect("an Outcome");
    assert_eq!((o.files, o.errors, o.mismatches), (29, 1, 0));

    // A plan without sums cannot be verified: the reader refuses (exit 3).
    let out = run_python(&["--root", text(&root), "--plan", text(&plain_plan)]).expect("python3");
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn both_readers_report_the_machines_and_the_daemons_cpu() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (manifest, _, root) = w1_tree(dir.path());
    // A stand-in daemon: any live process's CPU can be watched.
    let mut daemon = Command::new("sleep").arg("30").spawn().expect("sleep");
    let pid = daemon.id().to_string();
    let cpu_of = |json: &[u8]| {
        let o: riffle_bench::outcome::Outcome = serde_json::from_slice(json).expect("outcome");
        o.cpu.expect("cpu recorded")
    };

    let read = run(&[
        "read-fs",
        "--root",
        text(&root),
        "--manifest",
        text(&manifest),
        "--pattern",
        "w1",
        "--daemon-pid",
        &pid,
    ]);
    assert!(read.status.success());
    let cpu = cpu_of(&read.stdout);
    assert!(cpu.ticks_per_s > 0);
    assert!(
        cpu.daemon_ticks.is_some(),
        "the daemon was read at both ends"
    );

    let plan = dir.path().join("plan.tsv");
    let out = run(&[
        "plan",
        "--manifest",
        text(&manifest),
        "--crc32",
        "--out",
        text(&plan),
    ]);
    assert!(out.status.success());
    if let Some(py) = run_python(&[
        "--root",
        text(&root),
        "--plan",
        text(&plan),
        "--daemon-pid",
        &pid,
    ]) {
        assert!(
            py.status.success(),
            "{}",
            String::from_utf8_lossy(&py.stderr)
        );
        let cpu = cpu_of(&py.stdout);
        assert!(cpu.ticks_per_s > 0);
        assert!(cpu.daemon_ticks.is_some());
    }
    let _ = daemon.kill();
    let _ = daemon.wait();

    // Without a daemon: the machine's CPU only.
    let read = run(&[
        "read-fs",
        "--root",
        text(&root),
        "--manifest",
        text(&manifest),
        "--pattern",
        "w1",
    ]);
    assert!(read.status.success());
    assert_eq!(cpu_of(&read.stdout).daemon_ticks, None);
}
