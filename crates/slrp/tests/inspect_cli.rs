//! `slrp inspect`: read-only, complete, and loud about damage.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Output};

use serde::{Deserialize, Serialize};
use slrp_store::{Kind, Record, Store};

#[derive(Debug, Serialize, Deserialize)]
struct Vol {
    id: String,
    state: String,
}

impl Record for Vol {
    const KIND: Kind = Kind::VOLUME;
    fn key(&self) -> String {
        self.id.clone()
    }
}

fn slrp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_slrp"))
        .args(args)
        .output()
        .expect("running slrp")
}

fn seed(dir: &Path, records: &[(&str, &str)]) {
    let store = Store::open(dir).unwrap();
    let mut tx = store.transaction();
    for (id, state) in records {
        tx.put(&Vol {
            id: (*id).to_owned(),
            state: (*state).to_owned(),
        })
        .unwrap();
    }
    tx.commit_blocking().unwrap();
}

#[test]
fn prints_every_record_as_json_and_human_text() {
    let dir = tempfile::tempdir().unwrap();
    seed(dir.path(), &[("vol-a", "PUBLISHED"), ("vol-b", "CREATED")]);
    let state_dir = dir.path().to_str().unwrap();

    let out = slrp(&["inspect", "--state-dir", state_dir, "--json"]);
    assert!(out.status.success(), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["records"]["volume"]["vol-a"]["state"], "PUBLISHED");
    assert_eq!(json["records"]["volume"]["vol-b"]["state"], "CREATED");
    assert_eq!(json["corrupt"], serde_json::json!([]));

    let out = slrp(&["inspect", "--state-dir", state_dir]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("records: 2, corrupt: 0"), "{text}");
    assert!(text.contains("vol-a"), "{text}");
}

#[test]
fn corrupt_records_are_listed_and_the_exit_status_says_so() {
    let dir = tempfile::tempdir().unwrap();
    seed(
        dir.path(),
        &[("good", "CREATED"), ("victim", "MARKER_STATE_QQQ")],
    );
    let db = dir.path().join("state.db");
    let mut bytes = std::fs::read(&db).unwrap();
    let at = bytes
        .windows(16)
        .position(|w| w == b"MARKER_STATE_QQQ")
        .expect("record value in the database file");
    bytes[at + 2] ^= 0x01;
    std::fs::write(&db, &bytes).unwrap();

    let out = slrp(&[
        "inspect",
        "--state-dir",
        dir.path().to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["corrupt"][0]["key"], "victim");
    assert!(json["records"]["volume"].get("victim").is_none());
    assert_eq!(json["records"]["volume"]["good"]["state"], "CREATED");
}

#[test]
fn a_missing_state_dir_is_an_error_and_is_not_created() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let out = slrp(&["inspect", "--state-dir", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("inspecting the state in"), "{err}");
    assert!(!missing.exists());
}

fn inspect_into(dir: &Path, stdout: std::process::Stdio) -> Output {
    Command::new(env!("CARGO_BIN_EXE_slrp"))
        .args(["inspect", "--state-dir", dir.to_str().unwrap()])
        .stdout(stdout)
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("running slrp")
}

#[test]
fn a_closed_pipe_ends_the_output_quietly() {
    // `slrp inspect | head -1` once head has exited.
    let dir = tempfile::tempdir().unwrap();
    seed(dir.path(), &[("vol-a", "CREATED")]);
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = inspect_into(dir.path(), writer.into());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.code(), Some(0), "{err}");
}

#[test]
fn output_that_cannot_be_written_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    seed(dir.path(), &[("vol-a", "CREATED")]);
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = inspect_into(dir.path(), full.into());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("writing"), "{err}");
}

#[test]
fn a_daemon_state_dir_shows_every_providers_store() {
    let dir = tempfile::tempdir().unwrap();
    let providers = dir.path().join("providers");
    let a = providers.join("org.apache.mesos.rp.local.storage.a/store");
    let b = providers.join("org.apache.mesos.rp.local.storage.b/store");
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    seed(&a, &[("vol-a", "PUBLISHED")]);
    seed(&b, &[("vol-b", "CREATED")]);
    let state_dir = dir.path().to_str().unwrap();

    let out = slrp(&["inspect", "--state-dir", state_dir, "--json"]);
    assert!(out.status.success(), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = &json["providers"];
    assert_eq!(
        p["org.apache.mesos.rp.local.storage.a"]["records"]["volume"]["vol-a"]["state"],
        "PUBLISHED"
    );
    assert_eq!(
        p["org.apache.mesos.rp.local.storage.b"]["records"]["volume"]["vol-b"]["state"],
        "CREATED"
    );

    let out = slrp(&["inspect", "--state-dir", state_dir]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("== resource provider org.apache.mesos.rp.local.storage.a")
            && text.contains("vol-b"),
        "{text}"
    );
}
