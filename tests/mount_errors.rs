//! Bad input gets a clear one-line reason and a non-zero exit, quickly; secrets stay secret;
//! a killed daemon leaves a dead mount that can be cleaned and mounted again.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

#[cfg(feature = "rgw-tests")]
/// Arguments, environment overrides, expected exit code, expected text in the message.
type Case = (
    Vec<String>,
    Vec<(&'static str, &'static str)>,
    i32,
    &'static str,
);

#[cfg(feature = "rgw-tests")]
/// Runs `riffle mount` and returns (exit code, stderr).
fn mount_fails(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = Command::new(RIFFLE);
    cmd.arg("mount").args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = run_with_timeout(&mut cmd, Duration::from_secs(45));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "one line expected: {stderr:?}"
    );
    (out.status.code().unwrap_or(-1), stderr)
}

#[cfg(feature = "rgw-tests")]
fn bucket_with_one_object(endpoint: &str) -> String {
    let bucket = unique_bucket("errs");
    runtime().block_on(async {
        let s3 = client(endpoint);
        create_bucket(&s3, &bucket).await;
        put(&s3, &bucket, "a.txt", b"hello".to_vec()).await;
    });
    bucket
}

#[cfg(feature = "rgw-tests")]
#[test]
fn bad_input_gets_a_clear_reason() {
    let endpoint = need_rgw!();
    let bucket = bucket_with_one_object(&endpoint);
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("m");
    std::fs::create_dir(&mnt).unwrap();
    let m = mnt.to_str().unwrap();
    let src = format!("s3://{bucket}");
    let ep = ["--endpoint-url", endpoint.as_str(), "--force-path-style"];
    let with = |extra: &[&'static str]| -> Vec<String> {
        let mut v: Vec<String> = vec![src.clone(), m.to_string()];
        v.extend(ep.iter().map(|s| s.to_string()));
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let run = |args: Vec<String>, env: &[(&str, &str)]| {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        mount_fails(&refs, env)
    };

    // The exit status tells the kind of failure (`riffle mount`'s table, `cli::failure`).
    use rifflefs::cli::FailureKind::*;
    let [not_found, denied, unavailable, precondition] =
        [NotFound, PermissionDenied, Unavailable, FailedPrecondition].map(|k| k.exit_code());
    let cases: Vec<Case> = vec![
        (
            vec![
                format!("s3://missing-{bucket}"),
                m.into(),
                "--endpoint-url".into(),
                endpoint.clone(),
                "--force-path-style".into(),
            ],
            vec![],
            not_found,
            "does not exist",
        ),
        (
            with(&[]),
            vec![("AWS_SECRET_ACCESS_KEY", "wrong-secret")],
            denied,
            "secret key is wrong",
        ),
        (
            with(&[]),
            vec![("AWS_ACCESS_KEY_ID", "NOSUCHKEY")],
            denied,
            "access key is not known",
        ),
        (
            vec![
                src.clone(),
                m.into(),
                "--endpoint-url".into(),
                "http://127.0.0.1:9".into(),
                "--force-path-style".into(),
            ],
            vec![],
            unavailable,
            "cannot reach http://127.0.0.1:9",
        ),
        (
            vec![
                src.clone(),
                "/nonexistent/riffle/mnt".into(),
                "--endpoint-url".into(),
                endpoint.clone(),
            ],
            vec![],
            precondition,
            "does not exist",
        ),
        (
            vec![
                src.clone(),
                "/proc".into(),
                "--endpoint-url".into(),
                endpoint.clone(),
            ],
            vec![],
            precondition,
            "already mounted",
        ),
        (
            vec![
                src.clone(),
                dir.path().to_str().unwrap().into(),
                "--endpoint-url".into(),
                endpoint.clone(),
            ],
            vec![],
            precondition,
            "not empty",
        ),
        (
            vec!["http://bucket".into(), m.into()],
            vec![],
            2,
            "not an S3 URL",
        ),
        (
            vec!["s3://ab".into(), m.into()],
            vec![],
            2,
            "3 to 63 characters",
        ),
        (
            with(&["--metadata-ttl", "forever"]),
            vec![],
            2,
            "'indefinite'",
        ),
        (with(&["--max-inflight", "0"]), vec![], 2, "max-inflight"),
        (with(&["--max-memory", "12Q"]), vec![], 2, "unknown unit"),
        (with(&["--file-mode", "rwx"]), vec![], 2, "octal"),
        (
            with(&["--endpoint-url", "not a url"]),
            vec![],
            2,
            "endpoint-url",
        ),
        (with(&["--log-level", "loud"]), vec![], 2, "log-level"),
        (
            with(&["--fuse-transport", "pigeon"]),
            vec![],
            2,
            "fuse-transport",
        ),
        (
            with(&["--fuse-transport", "io-uring", "--restart"]),
            vec![],
            2,
            "cannot be used with --restart",
        ),
        (with(&["--block-size", "3M"]), vec![], 2, "power of two"),
        (
            with(&["--block-size", "16M", "--max-memory", "32M"]),
            vec![],
            1,
            "at least 4 blocks",
        ),
        (with(&["--cache-size", "120%"]), vec![], 2, "cache-size"),
        (
            with(&["--cache-dir", "/tmp", "--eviction", "random"]),
            vec![],
            2,
            "eviction policy",
        ),
        (
            with(&["--cache-dir", "/proc/riffle-cache"]),
            vec![],
            1,
            "cannot use cache directory",
        ),
    ];
    for (args, env, code, needle) in cases {
        let (got, stderr) = run(args.clone(), &env);
        assert_eq!(got, code, "{args:?}: {stderr}");
        assert!(
            stderr.contains(needle),
            "{args:?}: expected '{needle}' in {stderr:?}"
        );
        assert!(stderr.starts_with("riffle: "), "{stderr}");
    }
    let file = dir.path().join("file");
    std::fs::write(&file, "x").unwrap();
    let (code, stderr) = run(
        vec![
            src.clone(),
            file.to_str().unwrap().into(),
            "--endpoint-url".into(),
            endpoint.clone(),
        ],
        &[],
    );
    assert_eq!(code, precondition);
    assert!(stderr.contains("not a directory"), "{stderr}");
    // Nothing is left mounted after the failures.
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!info.contains(m), "{info}");
}

#[cfg(feature = "rgw-tests")]
#[test]
fn secrets_never_reach_logs_or_arguments() {
    let endpoint = need_rgw!();
    let bucket = bucket_with_one_object(&endpoint);
    let secret = std::env::var("AWS_SECRET_ACCESS_KEY").unwrap();
    let mount = Mount::new(
        &endpoint,
        &format!("s3://{bucket}"),
        &["--log-level", "trace"],
    );
    assert_eq!(std::fs::read(mount.join("a.txt")).unwrap(), b"hello");
    let _ = std::fs::read(mount.join("missing.txt"));
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", mount.pid())).unwrap();
    let cmdline = String::from_utf8_lossy(&cmdline);
    assert!(!cmdline.contains(&secret), "secret in argv");
    let log = mount.log_text();
    assert!(log.contains("mounted"), "{log}");
    assert!(!log.contains(&secret), "secret in the log");
    // A failing mount does not print it either.
    let dir = tempfile::tempdir().unwrap();
    let (_, stderr) = mount_fails(
        &[
            &format!("s3://{bucket}"),
            dir.path().to_str().unwrap(),
            "--endpoint-url",
            &endpoint,
            "--force-path-style",
        ],
        &[("AWS_SECRET_ACCESS_KEY", "the-wrong-secret-value")],
    );
    assert!(!stderr.contains("the-wrong-secret-value"), "{stderr}");
}

#[cfg(feature = "rgw-tests")]
#[test]
fn a_killed_daemon_leaves_a_dead_mount_that_can_be_cleaned() {
    let endpoint = need_rgw!();
    let bucket = bucket_with_one_object(&endpoint);
    let mount = Mount::new(&endpoint, &format!("s3://{bucket}"), &[]);
    assert_eq!(std::fs::read(mount.join("a.txt")).unwrap(), b"hello");
    let pid = mount.pid();
    unsafe { libc::kill(pid, libc::SIGKILL) };
    // Wait (bounded) for the process to be gone.
    for _ in 0..500 {
        if std::fs::metadata(format!("/proc/{pid}")).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let err = std::fs::read(mount.join("a.txt")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTCONN), "{err}");
    let m = mount.path.to_str().unwrap();
    let (code, stderr) = mount_fails(
        &[
            &format!("s3://{bucket}"),
            m,
            "--endpoint-url",
            &endpoint,
            "--force-path-style",
        ],
        &[],
    );
    assert_eq!(
        code,
        rifflefs::cli::FailureKind::FailedPrecondition.exit_code()
    );
    assert!(stderr.contains("dead mount"), "{stderr}");
    let out = run_with_timeout(
        Command::new(RIFFLE).args(["unmount", m]),
        Duration::from_secs(30),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The same mountpoint works again.
    let out = run_with_timeout(
        Command::new(RIFFLE).args([
            "mount",
            &format!("s3://{bucket}"),
            m,
            "--endpoint-url",
            &endpoint,
            "--force-path-style",
        ]),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(mount.join("a.txt")).unwrap(), b"hello");
}

#[test]
fn unmount_explains_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_with_timeout(
        Command::new(RIFFLE).arg("unmount").arg(dir.path()),
        Duration::from_secs(10),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not mounted"));
    let out = run_with_timeout(
        Command::new(RIFFLE).args(["unmount", "/proc"]),
        Duration::from_secs(10),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a riffle mount"));
}
