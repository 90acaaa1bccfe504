//! Runs the real `slrp-csi-local` plugin binary for tests (a copy of this helper lives in
//! each crate's tests that need it, since test-only code cannot be shared as a library
//! without a test-support crate).

// Test-only helper module: panicking on setup failures is the point.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

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

/// Quotes `s` for `/bin/sh`.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}
