//! `slrp csi` end to end: the real binary against the real `slrp-csi-local` plugin.

// An integration-test crate: all of it is test code (the lints target library code).
#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used
)]

use std::process::Output;

use slrp_test_support::Plugin;

fn slrp(p: &Plugin, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_slrp"))
        .arg("csi")
        .arg("--endpoint")
        .arg(format!("unix://{}", p.socket.display()))
        .args(args)
        .output()
        .unwrap()
}

fn ok_json(p: &Plugin, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = slrp(p, &all);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test]
async fn create_list_validate_delete_with_json_output() {
    let p = Plugin::start("v1").await;
    let info = ok_json(&p, &["info"]);
    assert_eq!(info["name"], "slrp-csi-local.slrp.io");
    assert_eq!(info["version"], "v1");

    let v = ok_json(
        &p,
        &[
            "create-volume",
            "--name",
            "cli-1",
            "--size",
            "64MiB",
            "--parameter",
            "pool=default",
        ],
    );
    let keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
    assert_eq!(keys, vec!["capacity_bytes", "volume_context", "volume_id"]);
    assert_eq!(v["capacity_bytes"], 64 << 20);
    let id = v["volume_id"].as_str().unwrap().to_owned();

    let list = ok_json(&p, &["list-volumes", "--page-size", "1"]);
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["volume_id"], id.as_str());

    let valid = ok_json(&p, &["validate", &id]);
    assert_eq!(valid["confirmed"], true);

    let caps = ok_json(&p, &["capabilities"]);
    assert_eq!(caps["controller"]["create_delete_volume"], true);

    let del = ok_json(&p, &["delete-volume", &id]);
    assert_eq!(del["volume_id"], id.as_str());
    assert!(
        ok_json(&p, &["list-volumes"])
            .as_array()
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn human_output_and_v0_detection() {
    let p = Plugin::start("v0").await;
    let out = slrp(&p, &["info"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("io.slrp.csi-local"), "{text}");
    assert!(text.contains("csi_version:    v0"), "{text}");
    let out = slrp(&p, &["probe"]);
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim(),
        "ready (csi v0)"
    );
}

#[tokio::test]
async fn usage_errors_exit_64_and_rpc_errors_exit_1_with_the_cause() {
    let p = Plugin::start("v1").await;
    let out = slrp(&p, &["create-volume", "--name", "x", "--size", "ten"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--size"));
    let out = slrp(
        &p,
        &["create-volume", "--name", "x", "--access-mode", "sometimes"],
    );
    assert_eq!(out.status.code(), Some(64));
    let out = slrp(&p, &["no-such-command"]);
    assert_eq!(out.status.code(), Some(64));
    let out = slrp(&p, &["--timeout", "0s", "info"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("greater than zero"));

    p.set_faults(r#"[{"rpc": "GetCapacity", "fail": "INTERNAL", "message": "disk on fire"}]"#);
    let out = slrp(&p, &["capacity"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    // The whole chain: our context, the RPC, the plugin's message.
    assert!(err.contains("CSI plugin at unix://"), "{err}");
    assert!(err.contains("GetCapacity failed with Internal"), "{err}");
    assert!(err.contains("disk on fire"), "{err}");
}

/// `slrp csi --json probe` with its standard output going to `stdout`.
fn probe_into(p: &Plugin, stdout: std::process::Stdio) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_slrp"))
        .arg("csi")
        .arg("--endpoint")
        .arg(format!("unix://{}", p.socket.display()))
        .args(["--json", "probe"])
        .stdout(stdout)
        .output()
        .unwrap()
}

#[tokio::test]
async fn output_that_cannot_be_written_is_an_error() {
    // A script redirecting `create-volume --json` to a full disk must not see success.
    let p = Plugin::start("v1").await;
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = probe_into(&p, full.into());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("writing"), "{err}");

    // A reader that went away (`| head`) is not an error.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = probe_into(&p, writer.into());
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}
