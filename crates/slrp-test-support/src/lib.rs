//! Test harness shared by slrp's crates. A dev-dependency only: nothing here ships.
//!
//! # Overview
//! Integration tests across the workspace drive the real bundled plugin,
//! `slrp-csi-local`, as a child process. This crate finds (or builds) its binary and runs
//! it in a private temporary directory with a fault-injection file, so every test gets its
//! own plugin, socket and volumes.
//!
//! With feature `volume` (slrp-core's tests, and the provider's later): `fake_csi`
//! (`FakeCsi`, an in-memory CSI plugin with scripted faults and held calls) and `harness`
//! (`Harness`, a volume manager on a temporary state directory that can be crashed and
//! restarted, plus request builders and waiting helpers).
//!
//! With feature `proxy`: `proxy` (`FaultProxy`, a loopback TCP proxy that passes
//! through, refuses, resets and counts, answers 503, cuts an event stream mid-record or
//! black-holes connections, switched at run time).
//!
//! With feature `hostile`: `hostile` (`HostilePlugin`, a CSI v1 plugin on a unix socket
//! that misbehaves per test: CreateVolume answers over the asked range, with unstorable
//! ids or huge contexts, endless or broken listings, negative capacities).
//!
//! With feature `mesos`: `mesos` (`MesosWorkDir`, a Mesos agent work directory with the
//! Mesos SLRP's checkpoints in Mesos's layout and encodings, for `slrp import-mesos`).
//!
//! [`require`](mod@require) decides whether a test may run on this machine (root, tools,
//! capabilities, prepared environments): a notice and a skip locally, a failure under
//! `CI=true`.
//!
//! # Invariants
//! A [`Plugin`] kills its process when dropped; its directory is removed with it.
//!
//! # Limitations
//! Setup failures panic: that is what a test harness should do.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::time::Duration;

#[cfg(feature = "volume")]
pub mod fake_csi;
#[cfg(feature = "volume")]
pub mod harness;
#[cfg(feature = "hostile")]
pub mod hostile;
#[cfg(feature = "mesos")]
pub mod mesos;
#[cfg(feature = "proxy")]
pub mod proxy;
pub mod require;

pub use require::{
    Cap, current_test, find_tool, has_cap, in_ci, is_root, require, require_cap, require_path,
    require_root, require_tool,
};

/// Path of the `slrp-csi-local` binary: `$SLRP_CSI_LOCAL_BIN`, else beside the running
/// test's target directory (`cargo nextest run --workspace` builds it; if it is absent it
/// is built here with cargo).
///
/// # Panics
/// If the binary cannot be found or built.
pub fn csi_local_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("SLRP_CSI_LOCAL_BIN") {
        return p.into();
    }
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<test binary> → target/<profile>/slrp-csi-local
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binaries live in target/<profile>/deps")
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

/// A running `slrp-csi-local` in its own temporary directory; killed on drop.
#[derive(Debug)]
pub struct Plugin {
    /// The directory holding the socket, the plugin root (`root/`) and the faults file.
    pub dir: tempfile::TempDir,
    /// The plugin's unix socket.
    pub socket: PathBuf,
    /// The fault-injection file the plugin re-reads on every RPC.
    pub faults: PathBuf,
    /// The plugin process.
    pub child: tokio::process::Child,
}

impl Plugin {
    /// Starts the plugin speaking `version` (`"v1"` or `"v0"`) with an empty faults file,
    /// and waits for its socket.
    ///
    /// # Panics
    /// If the plugin cannot be started or its socket does not appear within 20 s.
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

    /// Replaces the fault rules atomically (the plugin never sees a half-written file).
    ///
    /// # Panics
    /// On I/O errors.
    pub fn set_faults(&self, json: &str) {
        let tmp = self.faults.with_extension("tmp");
        std::fs::write(&tmp, json).unwrap();
        std::fs::rename(&tmp, &self.faults).unwrap();
    }

    /// The fault rules as they are now (counted rules are decremented by the plugin).
    ///
    /// # Panics
    /// On I/O errors or if the file is not JSON.
    pub fn faults_left(&self) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(&self.faults).unwrap()).unwrap()
    }
}

/// Waits until something accepts connections on `socket`, for at most 20 s (a hang guard,
/// not a timing assertion): polling, since a plugin signals readiness only by listening.
///
/// # Panics
/// If nothing ever listens there.
pub async fn wait_until_listening(socket: &Path) {
    for _ in 0..2000 {
        if tokio::net::UnixStream::connect(socket).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("nothing ever listened on {}", socket.display());
}

/// Waits until `socket` exists, for at most 20 s (a hang guard, not a timing assertion).
///
/// # Panics
/// If it never appears.
pub async fn wait_for(socket: &Path) {
    for _ in 0..2000 {
        if socket.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("socket {} never appeared", socket.display());
}

/// Quotes `s` for `/bin/sh`.
#[must_use]
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A tmpfs of a fixed size mounted on a fresh temporary directory, for tests that need a
/// disk that fills up; unmounted (lazily) and removed on drop, even when the test fails.
#[derive(Debug)]
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (tmpfs syntax: `256k`, `8m`). Needs root.
    ///
    /// # Panics
    /// If the directory cannot be made or the mount fails.
    pub fn mount(size: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            dir.path(),
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some(format!("size={size}").as_str()),
        )
        .unwrap();
        Self { dir }
    }

    /// The mount point.
    #[must_use]
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(self.dir.path(), nix::mount::MntFlags::MNT_DETACH);
    }
}
