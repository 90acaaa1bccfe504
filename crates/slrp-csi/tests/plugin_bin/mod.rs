//! Runs the real `slrp-csi-local` plugin binary for tests (a copy of this helper lives in
//! each crate's tests that need it, since test-only code cannot be shared as a library
//! without a test-support crate).

// Test-only helper module: panicking on setup failures is the point.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Path of the plugin binary: `$SLRP_CSI_LOCAL_BIN`, else next to this test's target dir
/// (built by `cargo nextest run --workspace`; built here with cargo if absent).
pub fn csi_local_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("SLRP_CSI_LOCAL_BIN") {
        return p.into();
    }
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("slrp-csi-local");
    if !bin.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = std::process::Command::new(cargo)
            .args(["build", "--quiet", "-p", "slrp-csi-local"])
            .status()
            .unwrap();
        assert!(status.success(), "building slrp-csi-local failed");
    }
    assert!(bin.exists(), "{} missing", bin.display());
    bin
}

/// A running plugin in its own tempdir; killed on drop.
pub struct Plugin {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub faults: PathBuf,
    pub child: tokio::process::Child,
}

impl Plugin {
    /// Starts the plugin speaking `version` ("v1" or "v0") with an (initially empty)
    /// faults file, and waits for its socket.
    pub async fn start(version: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("csi.sock");
        let faults = dir.path().join("faults.json");
        std::fs::write(&faults, "[]").unwrap();
        let child = tokio::process::Command::new(csi_local_bin())
            .arg("--endpoint")
            .arg(format!("unix://{}", socket.display()))
            .arg("--root")
            .arg(dir.path().join("root"))
            .args(["--node-id", "test-node", "--csi-version", version])
            .arg("--faults-file")
            .arg(&faults)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        wait_for(&socket).await;
        Self {
            dir,
            socket,
            faults,
            child,
        }
    }

    pub fn set_faults(&self, json: &str) {
        let tmp = self.faults.with_extension("tmp");
        std::fs::write(&tmp, json).unwrap();
        std::fs::rename(&tmp, &self.faults).unwrap();
    }

    pub fn faults_left(&self) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(&self.faults).unwrap()).unwrap()
    }
}

pub async fn wait_for(socket: &Path) {
    for _ in 0..2000 {
        if socket.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("socket {} never appeared", socket.display());
}
