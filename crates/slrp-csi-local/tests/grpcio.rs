//! Interop with a gRPC C-core client: Python grpcio with default channel options and a
//! `unix:///abs/path` target, which sends the socket path as the HTTP/2 `:authority`
//! (what grpc C-core ≥ 1.57, grpc-java and older grpc-go do). Stubs are generated from the
//! repository's `proto/` with `grpc_tools.protoc`; the client is `tests/grpcio_client.py`.
//!
//! The venv comes from `.ci/grpcio.sh`; it is found through `$SLRP_GRPCIO_VENV` or
//! `/opt/slrp-ci/grpcio-venv`. Without it the tests print a skip notice and pass, except
//! under CI, where a missing venv fails them (`slrp_test_support::require`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::tests_outside_test_module
)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;

/// Bound on one client run (the client puts a deadline on each call as well).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);

fn python(test: &str) -> Option<PathBuf> {
    let venv = std::env::var_os("SLRP_GRPCIO_VENV")
        .map_or_else(|| PathBuf::from("/opt/slrp-ci/grpcio-venv"), PathBuf::from);
    let python = venv.join("bin/python");
    let usable = std::process::Command::new(&python)
        .args(["-c", "import grpc, grpc_tools"])
        .status()
        .is_ok_and(|s| s.success());
    let need = format!("Python grpcio in {} (run .ci/grpcio.sh)", venv.display());
    slrp_test_support::require(test, &need, usable).then_some(python)
}

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// Python modules `csi.v1` and `csi.v0`, generated into a tempdir.
fn stubs(python: &Path) -> tempfile::TempDir {
    let out = tempfile::tempdir().unwrap();
    let proto = repo_file("../../proto");
    let status = std::process::Command::new(python)
        .args(["-m", "grpc_tools.protoc"])
        .arg(format!("-I{}", proto.display()))
        .arg(format!("--python_out={}", out.path().display()))
        .arg(format!("--grpc_python_out={}", out.path().display()))
        .args(["csi/v1/csi.proto", "csi/v0/csi.proto"])
        .status()
        .unwrap();
    assert!(status.success(), "grpc_tools.protoc failed: {status}");
    out
}

/// Runs the Python client against `p` and returns its output lines.
async fn run_client(python: &Path, stubs: &Path, version: &str, p: &TestPlugin) -> Vec<String> {
    let child = tokio::process::Command::new(python)
        .arg(repo_file("tests/grpcio_client.py"))
        .arg(stubs)
        .arg(version)
        .arg(format!("unix://{}", p.socket.display()))
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(CLIENT_TIMEOUT, child)
        .await
        .expect("the grpcio client hung")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "grpcio client ({version}) failed: {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout.lines().map(str::to_owned).collect()
}

/// The filter's debug log, so a test sees that the client's `:authority` needed repair
/// (a client that sent a valid one would pass without exercising the filter).
const FILTER_LOG: [(&str, &str); 1] = [("RUST_LOG", "info,slrp_csi_local::authority=debug")];

fn assert_authority_repaired(p: &TestPlugin) {
    let log = p.log();
    assert!(
        log.contains("replacing an :authority that is not a URI authority"),
        "grpcio sent a valid :authority: the filter was not exercised\n{log}"
    );
}

fn assert_calls(lines: &[String], rpcs: &[&str]) {
    for rpc in rpcs {
        assert!(
            lines.iter().any(|l| l.starts_with(&format!("OK {rpc}"))),
            "{rpc} missing from {lines:?}"
        );
    }
}

const COMMON_RPCS: [&str; 9] = [
    "GetPluginInfo",
    "Probe",
    "GetPluginCapabilities",
    "ControllerGetCapabilities",
    "NodeGetCapabilities",
    "CreateVolume",
    "ListVolumes",
    "NodeGetInfo",
    "DeleteVolume",
];

#[tokio::test]
async fn grpcio_with_default_options_calls_the_v1_plugin() {
    let Some(python) = python("grpcio_with_default_options_calls_the_v1_plugin") else {
        return;
    };
    let stubs = stubs(&python);
    let p = TestPlugin::start_logged(&[], &FILTER_LOG).await;
    let lines = run_client(&python, stubs.path(), "v1", &p).await;
    assert_calls(&lines, &COMMON_RPCS);
    assert_authority_repaired(&p);
    assert!(lines[0].contains("slrp-csi-local.slrp.io"), "{lines:?}");
}

#[tokio::test]
async fn grpcio_with_default_options_calls_the_v0_plugin() {
    let Some(python) = python("grpcio_with_default_options_calls_the_v0_plugin") else {
        return;
    };
    let stubs = stubs(&python);
    let p = TestPlugin::start_logged(&["--csi-version", "v0"], &FILTER_LOG).await;
    let lines = run_client(&python, stubs.path(), "v0", &p).await;
    assert_calls(&lines, &COMMON_RPCS);
    assert_authority_repaired(&p);
    assert_calls(&lines, &["NodeGetId"]);
    assert!(lines[0].contains("io.slrp.csi-local"), "{lines:?}");
}
