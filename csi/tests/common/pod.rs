//! A training pod's reader (`pod_reader.py`): the files it is given and writes, and what it
//! read, wherever it runs (a mount namespace: `emulated`; a container: `containers.rs`); the
//! caller starts and stops its process.

use sha2::{Digest, Sha256};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The reader's directory on this machine: `pod_reader.py`, the manifest of the files it
/// checks, and the stop, progress and result files.
pub struct ReaderFiles {
    dir: PathBuf,
}

/// What the reader did, from its result file.
#[derive(Debug, serde::Deserialize)]
pub struct ReaderResult {
    pub passes: u64,
    pub reads: u64,
    pub failed: u64,
    pub wrong: u64,
    pub longest_ms: f64,
    pub errors: Vec<String>,
}

impl ReaderResult {
    /// Writes the pod's reads to the transcript under `scenario` (`rounds` of it), and asserts
    /// that it read, with no failed read and no wrong byte.
    pub fn check(&self, scenario: &str, rounds: usize) {
        super::transcript(format!(
            "{scenario}: {rounds} rounds; reads {} ({} passes), failed reads {}, wrong reads {}, longest read {} ms",
            self.reads,
            self.passes,
            self.failed,
            self.wrong,
            self.longest_ms
        ));
        assert_eq!(self.failed, 0, "failed reads: {:?}", self.errors);
        assert_eq!(self.wrong, 0, "wrong bytes: {:?}", self.errors);
        assert!(self.reads > 0);
    }
}

impl ReaderFiles {
    /// Writes the script and the manifest of `files` (path, bytes) into `dir` (created,
    /// writable by any user: the pod may run as one).
    pub fn new(dir: &Path, files: &[(String, Vec<u8>)]) -> Self {
        std::fs::create_dir_all(dir).expect("reader dir");
        let manifest: Vec<(String, usize, String)> = files
            .iter()
            .map(|(path, bytes)| {
                (
                    path.clone(),
                    bytes.len(),
                    hex::encode(Sha256::digest(bytes)),
                )
            })
            .collect();
        std::fs::write(
            dir.join("manifest.json"),
            serde_json::to_vec(&manifest).expect("manifest json"),
        )
        .expect("write manifest");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pod_reader.py");
        std::fs::copy(script, dir.join("pod_reader.py")).expect("copy pod_reader.py");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        for f in ["stop", "progress", "result"] {
            let _ = std::fs::remove_file(dir.join(f));
        }
        Self {
            dir: dir.to_path_buf(),
        }
    }

    /// `python3 pod_reader.py ROOT ...` as the reader sees its files: `root` is the volume and
    /// `dir` this directory where the reader runs.
    pub fn command(&self, root: &Path, dir: &Path) -> Vec<OsString> {
        let mut argv: Vec<OsString> = vec!["python3".into(), dir.join("pod_reader.py").into()];
        argv.push(root.into());
        for f in ["manifest.json", "stop", "progress", "result"] {
            argv.push(dir.join(f).into());
        }
        argv
    }

    /// Passes over every file done so far.
    pub fn passes(&self) -> u64 {
        std::fs::read_to_string(self.dir.join("progress"))
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Asks the reader to stop after its current pass.
    pub fn stop(&self) {
        std::fs::write(self.dir.join("stop"), b"").expect("stop file");
    }

    /// The result the reader wrote when it stopped.
    pub fn result(&self) -> ReaderResult {
        serde_json::from_slice(&std::fs::read(self.dir.join("result")).expect("reader result"))
            .expect("reader result json")
    }
}
