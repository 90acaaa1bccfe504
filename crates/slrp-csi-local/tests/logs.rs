//! The plugin's log on standard error as the supervisor captures it (appended to a file):
//! no ANSI escape codes in the text format, one JSON object per line on request.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::tests_outside_test_module
)]

mod common;

use common::{MIB, TestPlugin, create_req, mount_cap};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Starts the plugin logging to a file, creates and deletes a volume (so there is more
/// than the start-up line), stops it with SIGTERM and returns what it logged.
async fn run_logged(extra: &[&str], env: &[(&str, &str)]) -> String {
    let mut p = TestPlugin::start_logged(extra, env).await;
    let mut c = p.v1().await;
    let v = c
        .controller
        .create_volume(create_req("logged", 4 * MIB, mount_cap(""), &[]))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    c.controller
        .delete_volume(slrp_proto::csi::v1::DeleteVolumeRequest {
            volume_id: v.volume_id,
            ..Default::default()
        })
        .await
        .unwrap();
    let pid = p.child.as_ref().unwrap().id();
    kill(Pid::from_raw(i32::try_from(pid).unwrap()), Signal::SIGTERM).unwrap();
    assert!(p.wait_exit().await.success());
    p.log()
}

#[tokio::test]
async fn text_log_in_a_file_has_no_escape_codes() {
    let log = run_logged(&[], &[]).await;
    assert!(log.contains("serving CSI"), "{log}");
    assert!(log.contains("shutting down"), "{log}");
    assert!(
        !log.contains("\x1b["),
        "escape codes in a log file: {log:?}"
    );
}

fn assert_json_lines(log: &str) {
    let mut messages = Vec::new();
    for line in log.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
        assert!(v["level"].is_string(), "{line}");
        assert!(v["target"].is_string(), "{line}");
        messages.push(v["fields"]["message"].as_str().unwrap().to_owned());
    }
    assert!(messages.iter().any(|m| m == "serving CSI"), "{log}");
    assert!(messages.iter().any(|m| m == "shutting down"), "{log}");
    assert!(!log.contains('\x1b'), "{log:?}");
}

#[tokio::test]
async fn log_format_json_gives_one_object_per_line() {
    assert_json_lines(&run_logged(&["--log-format", "json"], &[]).await);
}

#[tokio::test]
async fn slrp_log_format_selects_json_too() {
    assert_json_lines(&run_logged(&[], &[("SLRP_LOG_FORMAT", "json")]).await);
}

#[test]
fn an_unknown_log_format_is_a_usage_error() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_slrp-csi-local"))
        .args([
            "--endpoint",
            "unix:///nonexistent/x.sock",
            "--log-format",
            "xml",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--log-format"), "{stderr}");
}
