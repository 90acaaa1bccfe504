//! `slrp`'s log on standard error as a service manager captures it (a file): `--log-format
//! json` or `SLRP_LOG_FORMAT=json` gives one JSON object per line; the text format has no
//! ANSI escape codes off a terminal (and has them on one, unless `NO_COLOR`); the bundled
//! plugin's log file (`stderr.log`, appended by the supervisor) has none either, and
//! follows the daemon's format.

#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::path::{Path, PathBuf};

mod support;

use support::{Cluster, DaemonOptions, ProviderSpec};

/// Runs the daemon to READY and stops it with SIGTERM; returns its log (without the
/// harness's start banners) and the plugins' `stderr.log` files.
async fn run_to_ready(options: DaemonOptions) -> (String, Vec<(PathBuf, String)>) {
    run_prepared_to_ready(options, |_| ()).await
}

/// [`run_to_ready`], with `prepare` changing the cluster's files before the start.
async fn run_prepared_to_ready(
    options: DaemonOptions,
    prepare: impl FnOnce(&Cluster),
) -> (String, Vec<(PathBuf, String)>) {
    let mut c = Cluster::new(vec![ProviderSpec::fixture()], options).await;
    prepare(&c);
    c.start_daemon();
    c.admin_ok("/ready").await;
    c.stop_daemon_cleanly().await;
    let log: String = c
        .daemon_log()
        .lines()
        .filter(|l| !l.starts_with("==== daemon start"))
        .map(|l| format!("{l}\n"))
        .collect();
    let mut plugin_logs = Vec::new();
    find_files(&c.state_dir(), "stderr.log", &mut plugin_logs);
    assert!(
        !plugin_logs.is_empty(),
        "no plugin stderr.log under the state dir"
    );
    let plugin_logs = plugin_logs
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect();
    (log, plugin_logs)
}

fn find_files(dir: &Path, name: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            find_files(&path, name, out);
        } else if path.file_name().is_some_and(|n| n == name) {
            out.push(path);
        }
    }
}

/// The plugins logged JSON lines too (the supervisor passed slrp's format on).
fn assert_plugin_json(plugin_logs: &[(PathBuf, String)]) {
    for (path, text) in plugin_logs {
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{} is not JSON ({e}): {line:?}", path.display()));
            assert!(v["fields"]["message"].is_string(), "{line}");
        }
    }
}

fn assert_no_escape_codes(plugin_logs: &[(PathBuf, String)]) {
    for (path, text) in plugin_logs {
        assert!(
            text.contains("serving CSI"),
            "{} holds the plugin's log: {text}",
            path.display()
        );
        assert!(
            !text.contains("\x1b["),
            "escape codes in {}: {text:?}",
            path.display()
        );
    }
}

/// Every line is a JSON object with a level, a target and a message; the provider's
/// transition to READY is among them, with its fields.
fn assert_json_lines(log: &str) {
    let mut ready = false;
    for line in log.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
        assert!(v["level"].is_string(), "{line}");
        assert!(
            v["target"].as_str().is_some_and(|t| !t.is_empty()),
            "{line}"
        );
        assert!(v["fields"]["message"].is_string(), "{line}");
        ready |= v["fields"]["to"] == "READY";
    }
    assert!(ready, "the READY transition is logged: {log}");
    assert!(!log.contains('\x1b'), "{log:?}");
}

#[tokio::test]
async fn log_format_json_gives_one_object_per_line() {
    let (log, plugins) = run_to_ready(DaemonOptions {
        extra_args: vec!["--log-format".into(), "json".into()],
        ..DaemonOptions::default()
    })
    .await;
    assert_json_lines(&log);
    assert_no_escape_codes(&plugins);
    assert_plugin_json(&plugins);
}

#[tokio::test]
async fn slrp_log_format_in_the_environment_selects_json() {
    let (log, plugins) = run_to_ready(DaemonOptions {
        env: vec![("SLRP_LOG_FORMAT".into(), "json".into())],
        ..DaemonOptions::default()
    })
    .await;
    assert_json_lines(&log);
    assert_no_escape_codes(&plugins);
    assert_plugin_json(&plugins);
}

#[tokio::test]
async fn the_text_log_in_a_file_has_no_escape_codes() {
    let (log, plugins) = run_to_ready(DaemonOptions::default()).await;
    assert!(log.contains("READY"), "{log}");
    assert!(
        !log.contains("\x1b["),
        "escape codes in the log file: {log:?}"
    );
    assert!(
        serde_json::from_str::<serde_json::Value>(log.lines().next().unwrap()).is_err(),
        "text, not JSON: {log}"
    );
    assert_no_escape_codes(&plugins);
}

/// A log format in the plugin's own command (its ResourceProviderInfo) wins over the one
/// the supervisor passes on.
#[tokio::test]
async fn the_plugins_own_log_format_wins() {
    let (log, plugins) = run_prepared_to_ready(
        DaemonOptions {
            extra_args: vec!["--log-format".into(), "json".into()],
            ..DaemonOptions::default()
        },
        |c| {
            let file = c.path("rp/test.json");
            let mut info: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
            info["storage"]["plugin"]["containers"][0]["command"]["environment"] = serde_json::json!({
                "variables": [{"name": "SLRP_LOG_FORMAT", "type": "VALUE", "value": "text"}]
            });
            std::fs::write(&file, serde_json::to_vec(&info).unwrap()).unwrap();
        },
    )
    .await;
    assert_json_lines(&log);
    for (path, text) in &plugins {
        let first = text.lines().next().unwrap_or_default();
        assert!(
            serde_json::from_str::<serde_json::Value>(first).is_err() && first.contains("INFO"),
            "{} is text: {text}",
            path.display()
        );
    }
}

/// The agent's bearer token is sent on every call, yet with every crate logging at `trace`
/// (hyper included) it appears neither in the daemon's log nor in the plugin's.
#[tokio::test]
async fn the_agent_token_never_reaches_a_log_at_trace_level() {
    const TOKEN: &str = "agent-t0ken-4711";
    let token_dir = tempfile::tempdir().unwrap();
    let token_file = token_dir.path().join("agent.token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let (log, plugins) = run_to_ready(DaemonOptions {
        agent_settings: vec![format!(
            "token_file = {:?}",
            token_file.display().to_string()
        )],
        env: vec![("SLRP_LOG".into(), "trace".into())],
        ..DaemonOptions::default()
    })
    .await;
    assert!(
        log.contains("TRACE"),
        "logging was at its most verbose: {log}"
    );
    assert!(
        log.contains("hyper") || log.contains("h2"),
        "transport crates logged too"
    );
    assert!(
        !log.contains(TOKEN),
        "the agent token leaked into the daemon's log"
    );
    for (path, text) in &plugins {
        assert!(
            !text.contains(TOKEN),
            "the agent token leaked into {}",
            path.display()
        );
    }
}

#[test]
fn an_unknown_log_format_is_a_usage_error_naming_the_flag() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_slrp"))
        .args([
            "--log-format",
            "xml",
            "inspect",
            "--state-dir",
            "/nonexistent",
        ])
        .env_remove("SLRP_LOG_FORMAT")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--log-format") && err.contains("xml"), "{err}");
}

/// A bad `SLRP_LOG_FORMAT` (a typo in a service file) costs only the format: one warning,
/// text logs, and the command runs; any case of a good value works.
#[test]
fn a_bad_log_format_in_the_environment_warns_and_logs_text() {
    let inspect = |format: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_slrp"))
            .args(["inspect", "--state-dir", "/nonexistent"])
            .env("SLRP_LOG_FORMAT", format)
            .env_remove("SLRP_LOG")
            .output()
            .unwrap()
    };
    let out = inspect("xml");
    assert_ne!(out.status.code(), Some(64), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    let warning = err
        .lines()
        .find(|l| l.contains("SLRP_LOG_FORMAT"))
        .unwrap_or_else(|| panic!("no warning naming SLRP_LOG_FORMAT: {err}"));
    assert!(
        warning.contains("WARN") && warning.contains("xml") && !warning.starts_with('{'),
        "{warning}"
    );
    // The command itself ran: its own error is about the state dir.
    assert!(err.contains("/nonexistent"), "{err}");
    let out = inspect("JSON");
    assert_ne!(out.status.code(), Some(64), "{out:?}");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("SLRP_LOG_FORMAT"),
        "{out:?}"
    );
}

/// `slrp`'s stderr on a pseudo-terminal (`script`), with `env` added; what it wrote.
fn on_a_terminal(env: &str) -> String {
    // A bad SLRP_LOG_FORMAT logs one warning at once, through the installed subscriber.
    let command = format!(
        "env {env} SLRP_LOG_FORMAT=bogus {} ctl --admin /nonexistent/admin.sock status",
        env!("CARGO_BIN_EXE_slrp")
    );
    let out = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("ignoring a log format"), "{text:?}");
    text
}

#[test]
fn text_log_on_a_terminal_is_coloured_unless_no_color() {
    const TEST: &str = "text_log_on_a_terminal_is_coloured_unless_no_color";
    if !slrp_test_support::require_tool(TEST, "script") {
        return;
    }
    let coloured = on_a_terminal("-u NO_COLOR");
    assert!(
        coloured.contains("\x1b["),
        "no colours on a terminal: {coloured:?}"
    );
    let plain = on_a_terminal("NO_COLOR=1");
    assert!(
        !plain.contains('\x1b'),
        "colours despite NO_COLOR: {plain:?}"
    );
}
