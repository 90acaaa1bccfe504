//! `slrp import-mesos` as a process: exit statuses (0, 64, 78 naming the file), `--dry-run`
//! and `--json` writing nothing, a re-run being a no-op, and `slrp run` starting on the
//! work directory it refused before the import.

#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::json;
use slrp_proto::mesos::csi::state::VolumeState;
use slrp_proto::mesos::csi::state::volume_state::State;
use slrp_proto::mesos::resource_provider::ResourceProviderState;
use slrp_proto::mesos::v1::{Operation, OperationState, OperationStatus, Uuid as MesosUuid, offer};
use slrp_test_support::mesos::MesosWorkDir;

const EX_USAGE: i32 = 64;
const EX_CONFIG: i32 = 78;
const AGENT: &str = "a1b2-S0";

fn slrp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_slrp"))
        .args(args)
        .env_remove("SLRP_LOG")
        .output()
        .expect("running slrp")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A Mesos work dir (one published volume, a provider identity with an operation whose
/// FINISHED status was never acknowledged) and `rp/test.json`.
struct Setup {
    dir: tempfile::TempDir,
    mesos: MesosWorkDir,
    stream: PathBuf,
}

impl Setup {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("rp")).unwrap();
        let provider = json!({
            "type": "org.apache.mesos.rp.local.storage",
            "name": "test",
            "storage": {"plugin": {
                "type": "org.apache.mesos.csi.test",
                "name": "local",
                "containers": [{
                    "services": ["CONTROLLER_SERVICE", "NODE_SERVICE"],
                    "command": {"shell": false, "value": "/bin/false", "arguments": ["false"]}
                }]
            }}
        });
        std::fs::write(
            dir.path().join("rp/test.json"),
            serde_json::to_vec(&provider).unwrap(),
        )
        .unwrap();
        let mesos = MesosWorkDir::new(dir.path().join("work"))
            .agent(AGENT)
            .boot_id("boot-agent");
        let capability = slrp_wire::json::from_value(json!({
            "mount": {}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}
        }))
        .unwrap();
        mesos.volume(
            "org.apache.mesos.csi.test",
            "local",
            "vol-1",
            &VolumeState {
                state: State::Published as i32,
                volume_capability: Some(capability),
                boot_id: "boot-agent".into(),
                node_publish_required: true,
                ..VolumeState::default()
            },
        );
        let op = uuid::Uuid::new_v4();
        let done = OperationStatus {
            state: OperationState::OperationFinished as i32,
            uuid: Some(MesosUuid {
                value: uuid::Uuid::new_v4().as_bytes().to_vec(),
            }),
            ..OperationStatus::default()
        };
        let rp = mesos.provider("org.apache.mesos.rp.local.storage", "test", "rp-1");
        let operation = Operation {
            framework_id: None,
            agent_id: None,
            info: offer::Operation {
                r#type: Some(offer::operation::Type::Unreserve as i32),
                unreserve: Some(offer::operation::Unreserve { resources: vec![] }),
                ..offer::Operation::default()
            },
            latest_status: done.clone(),
            statuses: vec![done.clone()],
            uuid: MesosUuid {
                value: op.as_bytes().to_vec(),
            },
        };
        rp.state(&ResourceProviderState {
            operations: vec![operation],
            resources: vec![],
            storage: None,
        });
        let mut stream = rp.stream(op);
        stream.update(done).torn_tail(3);
        let stream = stream.path().to_owned();
        Self { dir, mesos, stream }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn import(&self, extra: &[&str]) -> Output {
        let mut args = vec![
            "import-mesos",
            "--work-dir",
            s(self.mesos.root()),
            "--resource-provider-config-dir",
            s(&self.path("rp")),
            "--state-dir",
            s(&self.path("state")),
        ]
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>();
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        slrp(&args)
    }

    fn run_args(&self) -> Vec<String> {
        [
            "run",
            // Nothing listens here: the work-dir check comes first.
            "--agent",
            "http://127.0.0.1:1",
            "--resource-provider-config-dir",
            s(&self.path("rp")),
            "--state-dir",
            s(&self.path("state")),
            "--work-dir",
            s(self.mesos.root()),
        ]
        .into_iter()
        .map(str::to_owned)
        .collect()
    }
}

fn nothing_written(setup: &Setup) {
    assert!(
        !setup.path("state/providers").exists(),
        "no store was created"
    );
}

#[test]
fn a_usage_error_is_64() {
    let setup = Setup::new();
    let out = slrp(&[
        "import-mesos",
        "--resource-provider-config-dir",
        s(&setup.path("rp")),
    ]);
    assert_eq!(out.status.code(), Some(EX_USAGE), "{out:?}");
    assert!(text(&out.stderr).contains("--work-dir"), "{out:?}");
    let out = setup.import(&["--provider", "no.such"]);
    assert_eq!(out.status.code(), Some(EX_USAGE), "{out:?}");
    assert!(text(&out.stderr).contains("org.apache.mesos.rp.local.storage.test"));
    let out = slrp(&["import-mesos", "--lenent"]);
    assert_eq!(out.status.code(), Some(EX_USAGE), "{out:?}");
}

#[test]
fn strict_refuses_naming_the_file_then_dry_run_json_and_import_and_slrp_run_starts() {
    let setup = Setup::new();
    // Before any import, `slrp run` refuses the Mesos work dir.
    let run = slrp(
        &setup
            .run_args()
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert_eq!(run.status.code(), Some(EX_CONFIG), "{run:?}");
    assert!(text(&run.stderr).contains("slrp import-mesos"), "{run:?}");
    std::fs::remove_dir_all(setup.path("state")).unwrap();

    let out = setup.import(&[]);
    assert_eq!(out.status.code(), Some(EX_CONFIG), "{out:?}");
    let err = text(&out.stderr);
    assert!(
        err.contains(s(&setup.stream)) && err.contains("torn") && err.contains("--lenient"),
        "{err}"
    );
    assert!(err.contains("nothing was written"), "{err}");
    nothing_written(&setup);

    let out = setup.import(&["--lenient", "--dry-run"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let report = text(&out.stdout);
    for needle in [
        "rp-1",
        AGENT,
        "vol-1 PUBLISHED",
        "1 unacknowledged",
        "dry run",
        "torn",
    ] {
        assert!(report.contains(needle), "{needle:?} not in {report}");
    }
    nothing_written(&setup);

    let out = setup.import(&["--lenient", "--dry-run", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["dry_run"], true);
    let p = &json["providers"][0];
    assert_eq!(p["provider_id"], "rp-1");
    assert_eq!(p["agent_id"], AGENT);
    assert_eq!(p["volumes_by_state"]["PUBLISHED"], 1);
    assert_eq!(p["operations"][0]["unacknowledged"], 1);
    assert_eq!(p["boot"]["agent_boot_id"], "boot-agent");
    nothing_written(&setup);

    let before = snapshot(setup.mesos.root());
    let out = setup.import(&["--lenient"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(text(&out.stdout).contains("imported into"), "{out:?}");
    let again = setup.import(&["--lenient"]);
    assert_eq!(again.status.code(), Some(0), "{again:?}");
    assert!(
        text(&again.stdout).contains("already imported"),
        "{again:?}"
    );
    assert_eq!(
        snapshot(setup.mesos.root()),
        before,
        "Mesos's files are never touched"
    );

    // `slrp run` now gets past the work-dir check: it listens on its admin socket and
    // waits for the (absent) agent.
    let mut child = Command::new(env!("CARGO_BIN_EXE_slrp"))
        .args(setup.run_args())
        .env_remove("SLRP_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let socket = setup.path("state/admin.sock");
    // The socket is the readiness signal; 1,500 looks 20 ms apart bound the wait at 30 s.
    let mut listening = false;
    for _ in 0..1_500 {
        listening = socket.exists();
        if listening || child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(listening, "slrp run did not start: {}", text(&out.stderr));
}

fn snapshot(root: &Path) -> HashMap<PathBuf, Vec<u8>> {
    fn walk(dir: &Path, out: &mut HashMap<PathBuf, Vec<u8>>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            if meta.is_dir() {
                walk(&p, out);
            } else if meta.is_file() {
                out.insert(p.clone(), std::fs::read(&p).unwrap());
            }
        }
    }
    let mut out = HashMap::new();
    walk(root, &mut out);
    out
}

/// The agent id is checked against the agent's GET_AGENT answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_checks_the_agent_id_and_refuses_a_mismatch() {
    let setup = Setup::new();
    for (agent_id, code) in [("other-S9", EX_CONFIG), (AGENT, 0)] {
        let mut config = slrp_manager::ManagerConfig::loopback();
        config.agent_id = Some(agent_id.to_owned());
        let (handle, guard) = slrp_manager::EmbeddedManager::spawn(
            config,
            tokio_util::sync::CancellationToken::new(),
        )
        .await
        .unwrap();
        let url = handle.endpoint().url();
        let (rp, state) = (setup.path("rp"), setup.path("state"));
        let setup_args = [
            "import-mesos",
            "--work-dir",
            s(setup.mesos.root()),
            "--resource-provider-config-dir",
            s(&rp),
            "--state-dir",
            s(&state),
            "--agent",
            &url,
            "--lenient",
            "--dry-run",
        ];
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_slrp"))
            .args(setup_args)
            .env_remove("SLRP_LOG")
            .output()
            .await
            .unwrap();
        assert_eq!(out.status.code(), Some(code), "{agent_id}: {out:?}");
        let err = text(&out.stderr);
        if code == EX_CONFIG {
            assert!(err.contains("other-S9") && err.contains(AGENT), "{err}");
        } else {
            assert!(!err.contains("warning: no --agent"), "{err}");
        }
        guard.shutdown().await;
    }
    nothing_written(&setup);
}
