//! `slrp run` as a process: the command line, configuration errors and the work-dir
//! refusal, each with its exit status and a message naming the file and the field; and a
//! run against the embedded manager that reaches READY and stops on SIGTERM, with the
//! plugins stopped or left running for the next start to adopt.

#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::path::Path;
use std::process::{Command, Output};

use serde_json::json;

mod support;

use support::Cluster;

const EX_USAGE: i32 = 64;
const EX_CONFIG: i32 = 78;

fn slrp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_slrp"))
        .args(args)
        .env_remove("SLRP_LOG")
        .output()
        .expect("running slrp")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn provider() -> serde_json::Value {
    json!({
        "type": "org.apache.mesos.rp.local.storage",
        "name": "test",
        "storage": {
            "plugin": {
                "type": "org.apache.mesos.csi.test",
                "name": "local",
                "containers": [{
                    "services": ["CONTROLLER_SERVICE", "NODE_SERVICE"],
                    "command": {"shell": false, "value": "/bin/false", "arguments": ["false"]}
                }]
            }
        }
    })
}

/// A directory with `rp/test.json` and a `state/` path; returns it.
fn setup() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("rp")).unwrap();
    std::fs::write(
        dir.path().join("rp/test.json"),
        serde_json::to_vec(&provider()).unwrap(),
    )
    .unwrap();
    dir
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn an_unknown_flag_is_a_usage_error() {
    let out = slrp(&["run", "--agnet", "http://127.0.0.1:1"]);
    assert_eq!(out.status.code(), Some(EX_USAGE), "{out:?}");
    assert!(stderr(&out).contains("--agnet"), "{}", stderr(&out));
}

#[test]
fn no_agent_is_a_usage_error_naming_the_flag() {
    let dir = setup();
    let out = slrp(&[
        "run",
        "--resource-provider-config-dir",
        s(&dir.path().join("rp")),
    ]);
    assert_eq!(out.status.code(), Some(EX_USAGE), "{out:?}");
    assert!(stderr(&out).contains("--agent"), "{}", stderr(&out));
}

#[test]
fn a_config_file_with_an_unknown_key_is_a_config_error_naming_file_and_key() {
    let dir = setup();
    let config = dir.path().join("slrp.toml");
    std::fs::write(
        &config,
        "[agent]\nurl = \"http://127.0.0.1:1\"\ntokn_file = \"/x\"\n",
    )
    .unwrap();
    let out = slrp(&[
        "run",
        "--config",
        s(&config),
        "--resource-provider-config-dir",
        s(&dir.path().join("rp")),
    ]);
    assert_eq!(out.status.code(), Some(EX_CONFIG), "{out:?}");
    let err = stderr(&out);
    assert!(
        err.contains(s(&config)) && err.contains("tokn_file"),
        "{err}"
    );
}

#[test]
fn a_bad_provider_file_is_a_config_error_naming_file_and_field() {
    let dir = setup();
    let mut bad = provider();
    bad["storage"]["plugin"]["containers"][0]["services"] = json!(["CONTROLLER_SERVICE"]);
    let file = dir.path().join("rp/test.json");
    std::fs::write(&file, serde_json::to_vec(&bad).unwrap()).unwrap();
    let out = slrp(&[
        "run",
        "--agent",
        "http://127.0.0.1:1",
        "--resource-provider-config-dir",
        s(&dir.path().join("rp")),
        "--state-dir",
        s(&dir.path().join("state")),
    ]);
    assert_eq!(out.status.code(), Some(EX_CONFIG), "{out:?}");
    let err = stderr(&out);
    assert!(
        err.contains(s(&file))
            && err.contains("'storage.plugin.containers'")
            && err.contains("NODE_SERVICE not found"),
        "{err}"
    );
    assert!(
        !dir.path().join("state").exists(),
        "nothing is created before the configuration is valid"
    );
}

#[test]
fn a_mesos_work_dir_is_refused_before_anything_starts() {
    let dir = setup();
    let work = dir.path().join("work");
    let latest = work
        .join("meta/slaves/S0/resource_providers/org.apache.mesos.rp.local.storage/test/latest");
    std::fs::create_dir_all(latest.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink("rp-id", &latest).unwrap();
    let out = slrp(&[
        "run",
        // Nothing listens here: the refusal must come before any attempt to reach it.
        "--agent",
        "http://127.0.0.1:1",
        "--resource-provider-config-dir",
        s(&dir.path().join("rp")),
        "--state-dir",
        s(&dir.path().join("state")),
        "--work-dir",
        s(&work),
    ]);
    assert_eq!(out.status.code(), Some(EX_CONFIG), "{out:?}");
    let err = stderr(&out);
    assert!(
        err.contains(s(&latest)) && err.contains("slrp import-mesos"),
        "{err}"
    );
    assert!(
        !dir.path().join("state/admin.sock").exists(),
        "the admin endpoint never listened"
    );
}

#[test]
fn a_busy_admin_socket_is_refused() {
    let dir = setup();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let socket = state.join("admin.sock");
    let _live = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let out = slrp(&[
        "run",
        "--agent",
        "http://127.0.0.1:1",
        "--resource-provider-config-dir",
        s(&dir.path().join("rp")),
        "--state-dir",
        s(&state),
    ]);
    assert_eq!(out.status.code(), Some(EX_CONFIG), "{out:?}");
    let err = stderr(&out);
    assert!(err.contains(s(&socket)) && err.contains("in use"), "{err}");
}

#[tokio::test]
async fn a_run_reaches_ready_and_sigterm_stops_it_and_its_plugins() {
    let mut c = Cluster::fixture().await;
    c.start_daemon();
    let body = c.admin_ok("/ready").await;
    let ready: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(ready["providers"][0]["state"], "READY", "{body}");
    assert_eq!(c.admin_ok("/health").await, "OK\n");
    let pids = c.plugin_pids("test");
    assert_eq!(pids.len(), 1, "one plugin process: {pids:?}");

    let status = c.stop_daemon().await;
    assert_eq!(status.code(), Some(0), "{}", c.daemon_log());
    assert!(
        c.plugin_pids("test").is_empty(),
        "plugins are stopped by default: {}",
        c.daemon_log()
    );
    assert!(!c.admin_socket().exists(), "the admin socket is removed");
}

#[tokio::test]
async fn with_leave_the_plugins_outlive_the_daemon_and_are_adopted_by_the_next_start() {
    let mut c = Cluster::new(
        vec![support::ProviderSpec::fixture()],
        support::DaemonOptions {
            leave_plugins: true,
            ..support::DaemonOptions::default()
        },
    )
    .await;
    c.start_daemon();
    c.admin_ok("/ready").await;
    let pids = c.plugin_pids("test");
    assert_eq!(pids.len(), 1, "{pids:?}");
    let status = c.stop_daemon().await;
    assert_eq!(status.code(), Some(0), "{}", c.daemon_log());
    assert_eq!(c.plugin_pids("test"), pids, "left running");

    c.start_daemon();
    c.admin_ok("/ready").await;
    assert_eq!(
        c.plugin_pids("test"),
        pids,
        "adopted, not restarted: {}",
        c.daemon_log()
    );
}

/// Replaces provider `name`'s plugin command by one that exits at once, and bounds the
/// plugin's readiness wait so that its provider fails quickly.
fn break_plugin(c: &Cluster, name: &str) {
    let file = c.path("rp").join(format!("{name}.json"));
    let mut info: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    info["storage"]["plugin"]["containers"][0]["command"] =
        json!({"shell": false, "value": "/bin/false", "arguments": ["false"]});
    std::fs::write(&file, serde_json::to_vec(&info).unwrap()).unwrap();
    // Top-level keys must precede the file's tables.
    let config = c.path("slrp.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("plugin_ready_timeout = \"2s\"\n{text}")).unwrap();
}

#[tokio::test]
async fn a_failed_provider_does_not_stop_the_others() {
    let mut c = Cluster::new(
        vec![
            support::ProviderSpec::fixture(),
            support::ProviderSpec::named("broken", "broken"),
        ],
        support::DaemonOptions::default(),
    )
    .await;
    break_plugin(&c, "broken");
    c.start_daemon();
    let want_failed = |body: &str| {
        let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        let field = |key: &str, field: &str| {
            v["providers"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["provider"] == key)
                .map(|p| p[field].clone())
        };
        let state = |key: &str| field(key, "state");
        let error = field("org.apache.mesos.rp.local.storage.broken", "error");
        state("org.apache.mesos.rp.local.storage.broken") == Some(json!("FAILED"))
            && error.is_some_and(|e| e.as_str().is_some_and(|e| e.contains("plugin stack")))
            && state("org.apache.mesos.rp.local.storage.test") == Some(json!("READY"))
    };
    c.within("broken FAILED and test READY on /ready", async {
        loop {
            if let Some((503, body)) = c.admin_get("/ready").await
                && want_failed(&body)
            {
                break;
            }
            // The endpoint answers only when asked: poll it.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(c.daemon_running(), "{}", c.daemon_log());
    let status = c.stop_daemon().await;
    assert_eq!(status.code(), Some(0), "{}", c.daemon_log());
}

#[tokio::test]
async fn the_daemon_exits_1_when_every_provider_failed() {
    let c = Cluster::fixture().await;
    break_plugin(&c, "test");
    let mut daemon = spawn_daemon(&c);
    let mut err = String::new();
    let mut pipe = daemon.stderr.take().unwrap();
    let status = c
        .within("the daemon exiting", async {
            tokio::io::AsyncReadExt::read_to_string(&mut pipe, &mut err)
                .await
                .unwrap();
            daemon.wait().await.unwrap()
        })
        .await;
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("every resource provider failed"), "{err}");
}

#[test]
fn an_unreadable_provider_store_is_a_config_error_naming_it() {
    let dir = setup();
    let store = dir
        .path()
        .join("state/providers/org.apache.mesos.rp.local.storage.test/store");
    std::fs::create_dir_all(&store).unwrap();
    std::fs::write(store.join("state.db"), b"this is not a database").unwrap();
    let out = slrp(&[
        "run",
        "--agent",
        "http://127.0.0.1:1",
        "--resource-provider-config-dir",
        s(&dir.path().join("rp")),
        "--state-dir",
        s(&dir.path().join("state")),
    ]);
    assert_eq!(out.status.code(), Some(EX_CONFIG), "{out:?}");
    let err = stderr(&out);
    assert!(
        err.contains(s(&store)) && err.contains("org.apache.mesos.rp.local.storage.test"),
        "{err}"
    );
}

/// `slrp run` with the cluster's flags, stderr piped.
fn spawn_daemon(c: &Cluster) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_slrp"))
        .arg("run")
        .arg("--config")
        .arg(c.path("slrp.toml"))
        .arg("--agent")
        .arg(c.agent_url())
        .arg("--work-dir")
        .arg(c.path("work"))
        .arg("--state-dir")
        .arg(c.state_dir())
        .arg("--resource-provider-config-dir")
        .arg(c.path("rp"))
        .env("SLRP_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

#[tokio::test]
async fn a_second_signal_forces_the_exit_while_a_plugin_ignores_sigterm() {
    use tokio::io::AsyncBufReadExt as _;
    let c = Cluster::fixture().await;
    // The plugin's process group leader ignores SIGTERM (an ignored signal stays ignored
    // across exec), so stopping the plugins would wait for the supervisor's SIGKILL.
    // `tail` names a path in the cluster's directory, so the cluster's drop kills it.
    let file = c.path("rp/test.json");
    let mut info: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let command = &info["storage"]["plugin"]["containers"][0]["command"];
    let mut line = format!("trap '' TERM; '{}'", command["value"].as_str().unwrap());
    for arg in command["arguments"].as_array().unwrap().iter().skip(1) {
        line.push_str(&format!(" '{}'", arg.as_str().unwrap()));
    }
    let keep = c.plugin_root("test").join("keep");
    std::fs::write(&keep, "").unwrap();
    line.push_str(&format!(" & exec tail -f '{}'", keep.display()));
    info["storage"]["plugin"]["containers"][0]["command"] = json!({"shell": true, "value": line});
    std::fs::write(&file, serde_json::to_vec(&info).unwrap()).unwrap();

    let mut daemon = spawn_daemon(&c);
    let pid = nix::unistd::Pid::from_raw(i32::try_from(daemon.id().unwrap()).unwrap());
    let mut lines = tokio::io::BufReader::new(daemon.stderr.take().unwrap()).lines();
    let mut log = String::new();
    let mut wait_for = async |needle: &str, log: &mut String| {
        while let Some(l) = lines.next_line().await.unwrap() {
            log.push_str(&l);
            log.push('\n');
            if l.contains(needle) {
                return;
            }
        }
        panic!("the daemon ended before logging {needle:?}:\n{log}");
    };
    c.within("READY", wait_for("to=READY", &mut log)).await;
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    c.within("shutting down", wait_for("shutting down", &mut log))
        .await;
    let second = tokio::time::Instant::now();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = c.within("the forced exit", daemon.wait()).await.unwrap();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        second.elapsed() < std::time::Duration::from_secs(8),
        "the exit did not wait for the plugin's 10 s stop grace: {:?}",
        second.elapsed()
    );
}
