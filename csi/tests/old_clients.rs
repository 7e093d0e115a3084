//! A gRPC client that sends the socket path as `:authority` (kubelet before
//! 1.26, old CSI sidecars) is rejected by the HTTP/2 server; the plugin's
//! log must say what happened and what is supported.
//!
//! The client is played with raw HTTP/2 frames: no Rust HTTP/2 client can
//! send an authority that is not a valid URI authority. Needs no S3 server.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One HTTP/2 frame: 9-byte header, then the payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// An HPACK "literal without indexing, indexed name" field (short values).
fn literal(name_index: u8, value: &str) -> Vec<u8> {
    assert!(name_index < 15 && value.len() < 127);
    let mut out = vec![name_index, value.len() as u8];
    out.extend_from_slice(value.as_bytes());
    out
}

/// Sends a Probe request with `authority` and returns the HTTP/2 error code
/// of the RST_STREAM (or GOAWAY) the server answers with, if any.
fn probe_with_authority(socket: &Path, authority: &str) -> Option<u32> {
    let mut stream = UnixStream::connect(socket).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut block = vec![0x83, 0x86]; // :method POST, :scheme http
    block.extend(literal(4, "/csi.v1.Identity/Probe")); // :path
    block.extend(literal(1, authority)); // :authority
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[])); // SETTINGS
    out.extend(frame(0x1, 0x4 | 0x1, 1, &block)); // HEADERS, END_HEADERS|END_STREAM
    stream.write_all(&out).expect("write");
    let mut header = [0u8; 9];
    loop {
        if stream.read_exact(&mut header).is_err() {
            return None;
        }
        let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let mut payload = vec![0u8; len];
        stream.read_exact(&mut payload).expect("payload");
        match header[3] {
            0x3 => return Some(u32::from_be_bytes(payload[0..4].try_into().ok()?)),
            0x7 => return Some(u32::from_be_bytes(payload[4..8].try_into().ok()?)),
            0x1 => return Some(0), // HEADERS: an answer, not a reset
            0x4 if header[4] & 1 == 0 => stream.write_all(&frame(0x4, 0x1, 0, &[])).expect("ack"),
            _ => {}
        }
    }
}

#[test]
fn a_client_sending_the_socket_path_as_authority_is_named_in_the_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Secrets on the tmpfs at /dev/shm, not the default /run/riffle-csi of
    // the machine running the test.
    let secrets = tempfile::tempdir_in("/dev/shm").expect("a tmpfs at /dev/shm");
    let socket = dir.path().join("csi.sock");
    let log_path = dir.path().join("plugin.log");
    let log = std::fs::File::create(&log_path).expect("log");
    let mut plugin = Command::new(env!("CARGO_BIN_EXE_riffle-csi"))
        .arg(format!("--endpoint=unix://{}", socket.display()))
        .arg("--node-id=test-node")
        .arg(format!(
            "--state-dir={}",
            dir.path().join("state").display()
        ))
        .arg(format!(
            "--mounter-socket={}",
            dir.path().join("no-mounter.sock").display()
        ))
        .arg(format!("--secrets-dir={}", secrets.path().display()))
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start riffle-csi");
    let deadline = Instant::now() + Duration::from_secs(30);
    while UnixStream::connect(&socket).is_err() {
        assert!(Instant::now() < deadline, "the plugin never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
    // A current client is answered...
    assert_eq!(probe_with_authority(&socket, "localhost"), Some(0));
    // ...an old one is reset with PROTOCOL_ERROR (1), and the log says why.
    let code = probe_with_authority(&socket, "/csi/csi.sock");
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        if text.contains("which HTTP/2 rejects") || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = plugin.kill();
    let _ = plugin.wait();
    assert_eq!(code, Some(1), "PROTOCOL_ERROR");
    let line = text
        .lines()
        .find(|l| l.contains("which HTTP/2 rejects"))
        .unwrap_or_else(|| panic!("no warning in the log:\n{text}"));
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains(":authority /csi/csi.sock,"), "{line}");
    assert!(line.contains("kubelet >= 1.26"), "{line}");
    println!("plugin log: {line}");
}
