//! `slrp standalone` as a process, as an operator starts it: its defaults, its refusals
//! (no root, no plugin binary, a state directory in use, an agent in the config), a
//! restart after SIGKILL with the same agent id and provider id, and a clean SIGTERM.
//!
//! The bundled plugin must be found beside the `slrp` binary: `csi_local_bin()` builds
//! `target/<profile>/slrp-csi-local` if `cargo nextest run --workspace` did not.

#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

mod support;

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use support::{WAIT, http_get_unix, http_unix, processes_mentioning, unmount_under};

/// The default provider's key (the FIXED defaults of standalone mode).
const DEFAULT_PROVIDER: &str = "org.apache.mesos.rp.local.storage.local";

/// A `slrp standalone` on a temporary state directory; on drop its processes (and the
/// plugins they started, found by the directory in their command line) are killed and
/// their mounts removed.
struct Standalone {
    dir: tempfile::TempDir,
    child: Option<tokio::process::Child>,
    starts: usize,
}

impl Standalone {
    fn new() -> Self {
        // Built beside `slrp` if missing: the default configuration looks for it there.
        slrp_test_support::csi_local_bin();
        Self {
            dir: tempfile::tempdir().unwrap(),
            child: None,
            starts: 0,
        }
    }

    fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn admin_socket(&self) -> PathBuf {
        self.state_dir().join("admin.sock")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("slrp.log")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn fail(&self, what: &str) -> ! {
        panic!("{what}\n---- slrp log ----\n{}---- end ----", self.log())
    }

    /// The command with the state directory and the test's log settings.
    fn command(&self, binary: &Path, extra: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(binary);
        cmd.arg("standalone")
            .arg("--state-dir")
            .arg(self.state_dir())
            .args(extra)
            .env("SLRP_LOG", "info")
            .stdin(Stdio::null());
        cmd
    }

    /// Starts the daemon with `extra` flags; its output is appended to the log.
    fn start_with(&mut self, extra: &[&str]) {
        assert!(self.child.is_none(), "already running");
        self.starts += 1;
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap();
        std::io::Write::write_all(
            &mut log,
            format!("==== start {} ====\n", self.starts).as_bytes(),
        )
        .unwrap();
        let child = self
            .command(Path::new(env!("CARGO_BIN_EXE_slrp")), extra)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    fn start(&mut self) {
        self.start_with(&[]);
    }

    /// Waits until `/ready` answers 200; returns how long that took and the body.
    async fn ready(&mut self) -> (Duration, Value) {
        let begin = Instant::now();
        let deadline = begin + WAIT;
        loop {
            if let Some((200, body)) = http_get_unix(&self.admin_socket(), "/ready").await {
                return (begin.elapsed(), serde_json::from_str(&body).unwrap());
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.fail(&format!("slrp standalone exited ({status}) before READY"));
            }
            if Instant::now() > deadline {
                self.fail("not READY in time");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.as_ref().unwrap().id().unwrap()).unwrap())
    }

    async fn signal(&mut self, signal: Signal) -> ExitStatus {
        kill(self.pid(), signal).unwrap();
        let mut child = self.child.take().unwrap();
        match tokio::time::timeout(WAIT, child.wait()).await {
            Ok(status) => status.unwrap(),
            Err(_) => {
                self.child = Some(child);
                self.fail(&format!("no exit after {signal}"))
            }
        }
    }

    /// The embedded manager's registry: `(agent id, [(provider id, name)])`.
    fn registry(&self) -> (String, Vec<(String, String)>) {
        let path = self
            .state_dir()
            .join("manager")
            .join("resource_provider_registry.json");
        let v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let providers = v["providers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["id"]["value"]
                        .as_str()
                        .or_else(|| p["id"].as_str())
                        .unwrap()
                        .to_owned(),
                    p["name"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        (v["agent_id"].as_str().unwrap().to_owned(), providers)
    }

    /// The provider id the daemon's durable state holds for the default provider under
    /// `agent_id` (`slrp inspect`, read-only).
    fn durable_provider_id(&self, agent_id: &str) -> String {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_slrp"))
            .arg("inspect")
            .arg("--state-dir")
            .arg(self.state_dir())
            .arg("--json")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let v: Value = serde_json::from_str(&text).unwrap();
        v["providers"][DEFAULT_PROVIDER]["records"]["provider"][agent_id]["provider_id"]
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("no resource_provider_id in slrp inspect: {text}"))
    }

    /// `GET path` on the admin socket: `(status, JSON body)`.
    async fn get(&self, path: &str) -> (u16, Value) {
        match http_get_unix(&self.admin_socket(), path).await {
            Some((status, body)) => (status, json_of(&body)),
            None => self.fail(&format!("GET {path}: no answer")),
        }
    }

    /// `POST path` with a JSON body on the admin socket: `(status, JSON body)`.
    async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        match http_unix(&self.admin_socket(), "POST", path, Some(body)).await {
            Some((status, text)) => (status, json_of(&text)),
            None => self.fail(&format!("POST {path}: no answer")),
        }
    }

    /// The free MB of the storage pool of `profile` (`None` if not reported).
    async fn pool_mb(&self, profile: &str) -> Option<f64> {
        let (status, resources) = self.get("/resources").await;
        assert_eq!(status, 200, "{resources}");
        resources.as_array().unwrap().iter().find_map(|r| {
            let source = &r["disk"]["source"];
            (source["type"] == "RAW" && source["id"].is_null() && source["profile"] == profile)
                .then(|| r["scalar"]["value"].as_f64().unwrap())
        })
    }

    /// Polls until the pool of `profile` is reported (READY comes before the first
    /// GetCapacity answers); its free MB.
    async fn pool_reported(&self, profile: &str) -> f64 {
        let found = tokio::time::timeout(WAIT, async {
            loop {
                if let Some(mb) = self.pool_mb(profile).await {
                    return mb;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        found.unwrap_or_else(|_| self.fail(&format!("no {profile} pool reported")))
    }

    /// Polls until the pool of `profile` has `mb` free (the total reaches the admin API a
    /// little after the operation's status; a shared pool's other profile waits for the
    /// next reconciliation).
    async fn pool_is(&self, profile: &str, mb: f64) {
        let reached = tokio::time::timeout(WAIT, async {
            while self.pool_mb(profile).await != Some(mb) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        if reached.is_err() {
            let now = self.pool_mb(profile).await;
            self.fail(&format!("the {profile} pool is {now:?} MB, not {mb}"));
        }
    }

    async fn plugins_gone(&self) {
        let dir = self.dir.path().to_owned();
        let gone = tokio::time::timeout(WAIT, async {
            while !processes_mentioning(&dir).is_empty() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        if gone.is_err() {
            self.fail(&format!(
                "plugin processes left: {:?}",
                processes_mentioning(&dir)
            ));
        }
    }
}

impl Drop for Standalone {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- slrp log at the failure ----\n{}---- end ----",
                self.log()
            );
        }
        if let Some(pid) = self.child.as_ref().and_then(tokio::process::Child::id) {
            let _ = kill(Pid::from_raw(i32::try_from(pid).unwrap()), Signal::SIGKILL);
        }
        for pid in processes_mentioning(self.dir.path()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        unmount_under(self.dir.path());
    }
}

fn json_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Runs `cmd` to its end within the hang guard; `(status, stderr)`.
async fn finish(mut cmd: tokio::process::Command) -> (ExitStatus, String) {
    let out = tokio::time::timeout(
        WAIT,
        cmd.stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("slrp standalone did not exit")
    .unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_default_is_ready_in_seconds_and_survives_sigkill_with_its_identity() {
    if !slrp_test_support::require_root(
        "the_default_is_ready_in_seconds_and_survives_sigkill_with_its_identity",
    ) {
        return;
    }
    let mut s = Standalone::new();
    s.start();
    let (took, ready) = s.ready().await;
    eprintln!("READY after {took:?}");
    assert!(took < Duration::from_secs(30), "READY after {took:?}");
    assert_eq!(
        ready["providers"][0]["provider"], DEFAULT_PROVIDER,
        "{ready}"
    );

    // What the default made: a private state directory, the admin socket 0600, the
    // provider and profile files an operator can read.
    assert_eq!(mode(&s.state_dir()), 0o700);
    assert_eq!(mode(&s.admin_socket()), 0o600);
    let info: Value = serde_json::from_slice(
        &std::fs::read(s.state_dir().join("config/resource-providers/local.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(info["type"], "org.apache.mesos.rp.local.storage");
    assert_eq!(info["name"], "local");
    let command = &info["storage"]["plugin"]["containers"][0]["command"];
    assert_eq!(
        Path::new(command["value"].as_str().unwrap()),
        Path::new(env!("CARGO_BIN_EXE_slrp"))
            .parent()
            .unwrap()
            .join("slrp-csi-local"),
        "the plugin beside slrp"
    );
    let args: Vec<&str> = command["arguments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let root = s.state_dir().join("csi-local");
    assert!(
        args.windows(2)
            .any(|w| w[0] == "--root" && Path::new(w[1]) == root),
        "{args:?}"
    );
    for pool in ["dir=", "loop="] {
        assert!(
            args.windows(2)
                .any(|w| w[0] == "--pool" && w[1].starts_with(pool)),
            "{args:?}"
        );
    }
    let profiles: Value =
        serde_json::from_slice(&std::fs::read(s.state_dir().join("config/profiles.json")).unwrap())
            .unwrap();
    let matrix = &profiles["profile_matrix"];
    assert_eq!(
        matrix["mount"]["create_parameters"],
        json!({"pool": "dir", "backend": "dir"})
    );
    assert_eq!(
        matrix["block"]["create_parameters"],
        json!({"pool": "loop", "backend": "loop"})
    );
    assert!(matrix["block"]["volume_capabilities"]["block"].is_object());
    assert_eq!(
        matrix["ext4"]["volume_capabilities"]["mount"]["fs_type"],
        "ext4"
    );

    let (agent_id, providers) = s.registry();
    assert_eq!(providers.len(), 1, "{providers:?}");
    assert_eq!(providers[0].1, "local");
    let provider_id = s.durable_provider_id(&agent_id);
    assert_eq!(provider_id, providers[0].0);

    // kill -9: nothing is lost; the next start is the same agent with the same provider.
    let status = s.signal(Signal::SIGKILL).await;
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    let written =
        std::fs::read(s.state_dir().join("config/resource-providers/local.json")).unwrap();
    s.start();
    s.ready().await;
    assert_eq!(s.registry(), (agent_id.clone(), providers.clone()));
    assert_eq!(s.durable_provider_id(&agent_id), provider_id);
    assert_eq!(
        std::fs::read(s.state_dir().join("config/resource-providers/local.json")).unwrap(),
        written,
        "the generated file is kept"
    );

    // SIGTERM: exit 0, the plugin stopped, the admin socket removed.
    let status = s.signal(Signal::SIGTERM).await;
    assert!(status.success(), "{status}");
    s.plugins_gone().await;
    assert!(!s.admin_socket().exists());
}

#[tokio::test]
async fn a_second_standalone_on_the_same_state_dir_is_refused_and_the_first_keeps_serving() {
    if !slrp_test_support::require_root(
        "a_second_standalone_on_the_same_state_dir_is_refused_and_the_first_keeps_serving",
    ) {
        return;
    }
    let mut s = Standalone::new();
    s.start();
    s.ready().await;
    let first = s.pid();
    let (status, stderr) = finish(s.command(Path::new(env!("CARGO_BIN_EXE_slrp")), &[])).await;
    assert_eq!(status.code(), Some(78), "{stderr}");
    assert!(stderr.contains("in use"), "{stderr}");
    assert!(stderr.contains(&format!("pid {first}")), "{stderr}");
    // The first one's sockets were not touched.
    let (code, _) = http_get_unix(&s.admin_socket(), "/ready").await.unwrap();
    assert_eq!(code, 200);
    let (_, providers) = s.registry();
    assert_eq!(providers.len(), 1);
    assert!(s.signal(Signal::SIGTERM).await.success());
}

#[tokio::test]
async fn without_root_it_says_what_it_needs_in_one_line_and_exits_77() {
    let s = Standalone::new();
    let binary = Path::new(env!("CARGO_BIN_EXE_slrp"));
    let cmd = if slrp_test_support::is_root() {
        // As `nobody`: setpriv changes the ids and execs slrp (no shell, no PAM).
        let mut cmd = tokio::process::Command::new("setpriv");
        cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(binary)
            .arg("standalone")
            .arg("--state-dir")
            .arg(s.state_dir())
            .stdin(Stdio::null());
        cmd
    } else {
        s.command(binary, &[])
    };
    let (status, stderr) = finish(cmd).await;
    assert_eq!(status.code(), Some(77), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr:?}");
    assert!(stderr.contains("root"), "{stderr}");
    assert!(
        stderr.contains("mount") && stderr.contains("loop devices"),
        "{stderr}"
    );
    assert!(
        !s.state_dir().exists(),
        "nothing is created before the check"
    );
}

#[tokio::test]
async fn without_the_plugin_binary_it_names_both_places_it_looked() {
    if !slrp_test_support::require_root("without_the_plugin_binary_it_names_both_places_it_looked")
    {
        return;
    }
    let s = Standalone::new();
    // A copy of slrp alone in a directory (a hard link where the file system allows:
    // the binary is large), with a PATH that has no plugin either.
    let lonely = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let binary = lonely.path().join("slrp");
    if std::fs::hard_link(env!("CARGO_BIN_EXE_slrp"), &binary).is_err() {
        std::fs::copy(env!("CARGO_BIN_EXE_slrp"), &binary).unwrap();
    }
    let empty_path = tempfile::tempdir().unwrap();
    let mut cmd = s.command(&binary, &[]);
    cmd.env("PATH", empty_path.path());
    let (status, stderr) = finish(cmd).await;
    assert_eq!(status.code(), Some(78), "{stderr}");
    assert!(
        stderr.contains(&lonely.path().join("slrp-csi-local").display().to_string()),
        "{stderr}"
    );
    assert!(
        stderr.contains(&empty_path.path().display().to_string()),
        "{stderr}"
    );
    assert!(
        !s.state_dir()
            .join("config/resource-providers/local.json")
            .exists()
    );
}

#[tokio::test]
async fn an_agent_url_in_the_config_file_is_refused() {
    if !slrp_test_support::require_root("an_agent_url_in_the_config_file_is_refused") {
        return;
    }
    let s = Standalone::new();
    let config = s.dir.path().join("slrp.toml");
    std::fs::write(&config, "[agent]\nurl = \"http://127.0.0.1:5051\"\n").unwrap();
    let config = config.display().to_string();
    let (status, stderr) = finish(s.command(
        Path::new(env!("CARGO_BIN_EXE_slrp")),
        &["--config", &config],
    ))
    .await;
    assert_eq!(status.code(), Some(78), "{stderr}");
    assert!(
        stderr.contains("agent.url") && stderr.contains("slrp run"),
        "{stderr}"
    );
}

#[tokio::test]
async fn mesos_files_replace_the_generated_provider_and_profiles() {
    if !slrp_test_support::require_root("mesos_files_replace_the_generated_provider_and_profiles") {
        return;
    }
    let mut s = Standalone::new();
    let rp = s.dir.path().join("rp");
    std::fs::create_dir_all(&rp).unwrap();
    let plugin_root = s.dir.path().join("plugin");
    let info = json!({
        "type": "org.apache.mesos.rp.local.storage",
        "name": "mine",
        "default_reservations": [{"type": "DYNAMIC", "role": "storage"}],
        "storage": {
            "plugin": {
                "type": "org.apache.mesos.csi.test",
                "name": "local",
                "containers": [{
                    "services": ["CONTROLLER_SERVICE", "NODE_SERVICE"],
                    "command": {
                        "shell": false,
                        "value": slrp_test_support::csi_local_bin().display().to_string(),
                        "arguments": [
                            "slrp-csi-local",
                            "--root", plugin_root.display().to_string(),
                            "--pool", "fast=1GiB",
                        ],
                    },
                }],
            },
            "reconciliation_interval_seconds": 0,
        },
    });
    std::fs::write(rp.join("mine.json"), info.to_string()).unwrap();
    let profiles = s.dir.path().join("profiles.json");
    std::fs::write(
        &profiles,
        json!({"profile_matrix": {"gold": {
            "csi_plugin_type_selector": {"plugin_type": "org.apache.mesos.csi.test"},
            "volume_capabilities": {"mount": {}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}},
            "create_parameters": {"pool": "fast"},
        }}})
        .to_string(),
    )
    .unwrap();
    let rp = rp.display().to_string();
    let profiles = profiles.display().to_string();
    s.start_with(&[
        "--resource-provider-config-dir",
        &rp,
        "--disk-profiles",
        &profiles,
    ]);
    let (_, ready) = s.ready().await;
    let listed = ready["providers"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{ready}");
    assert_eq!(
        listed[0]["provider"], "org.apache.mesos.rp.local.storage.mine",
        "{ready}"
    );
    assert!(!s.state_dir().join("config/resource-providers").exists());
    assert!(!s.state_dir().join("config/profiles.json").exists());
    let (_, providers) = s.registry();
    assert_eq!(
        providers.iter().map(|p| p.1.as_str()).collect::<Vec<_>>(),
        ["mine"]
    );
    assert!(s.signal(Signal::SIGTERM).await.success());
}

#[tokio::test]
async fn disks_are_created_published_and_destroyed_through_the_embedded_manager() {
    if !slrp_test_support::require_root(
        "disks_are_created_published_and_destroyed_through_the_embedded_manager",
    ) {
        return;
    }
    let mut s = Standalone::new();
    s.start();
    s.ready().await;
    let mount_free = s.pool_reported("mount").await;
    let block_free = s.pool_reported("block").await;
    assert_eq!(s.pool_reported("ext4").await, block_free, "one loop pool");

    // Refusals name the field: an unknown profile lists the known ones, too large a
    // disk names the pool's free space.
    let (status, e) = s
        .post("/disks", &json!({"profile": "gold", "size_bytes": 1 << 20}))
        .await;
    assert_eq!(status, 404, "{e}");
    assert_eq!(e["field"], "profile", "{e}");
    assert!(
        e["error"].as_str().unwrap().contains("block, ext4, mount"),
        "{e}"
    );
    let (status, e) = s
        .post(
            "/disks",
            &json!({"profile": "mount", "size_bytes": (mount_free as u64 + 1) << 20}),
        )
        .await;
    assert_eq!(status, 409, "{e}");
    assert_eq!(e["field"], "size_bytes", "{e}");
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .contains(&format!("{mount_free} MiB free")),
        "{e}"
    );

    // A MOUNT disk of 100 MiB and one byte is a disk of 101 MiB (Mesos counts whole MB).
    let (status, op) = s
        .post(
            "/disks",
            &json!({"profile": "mount", "size_bytes": (100 << 20) + 1, "wait": true}),
        )
        .await;
    assert_eq!(status, 200, "{op}");
    assert_eq!(op["type"], "CREATE_DISK", "{op}");
    assert_eq!(op["state"], "OPERATION_FINISHED", "{op}");
    let id = op["volume_id"].as_str().expect("volume_id").to_owned();
    let disk = &op["converted_resources"][0];
    assert_eq!(disk["disk"]["source"]["id"], id.as_str(), "{op}");
    assert_eq!(disk["disk"]["source"]["type"], "MOUNT", "{op}");
    assert_eq!(disk["scalar"]["value"], 101.0, "{op}");
    s.pool_is("mount", mount_free - 101.0).await;

    // Published through the manager: the path is a mount under the work directory.
    let (status, published) = s.post("/volumes/publish", &json!({"volume_id": id})).await;
    assert_eq!(status, 200, "{published}");
    let path = PathBuf::from(published["path"].as_str().expect("a path"));
    assert!(
        path.starts_with(
            s.state_dir()
                .join("work/csi/io.slrp.csi.local/local/mounts")
        ),
        "{published}"
    );
    std::fs::write(path.join("data"), "kept").unwrap();

    // A BLOCK disk from the shared loop pool, without waiting: PENDING at once (202),
    // then listed terminal by /operations after the manager forgot it.
    let (status, pending) = s
        .post(
            "/disks",
            &json!({"profile": "block", "size_bytes": 16 << 20, "type": "block"}),
        )
        .await;
    assert_eq!(status, 202, "{pending}");
    assert_eq!(pending["state"], "OPERATION_PENDING", "{pending}");
    let uuid = pending["operation_uuid"].as_str().unwrap().to_owned();
    let finished =
        tokio::time::timeout(WAIT, async {
            loop {
                let (_, ops) = s.get("/operations").await;
                if let Some(op) = ops.as_array().into_iter().flatten().find(|o| {
                    o["operation_uuid"] == uuid.as_str() && o["state"] != "OPERATION_PENDING"
                }) {
                    return op.clone();
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .unwrap_or_else(|_| s.fail("the BLOCK disk's operation is not listed terminal"));
    assert_eq!(finished["state"], "OPERATION_FINISHED", "{finished}");
    let block_id = finished["volume_id"].as_str().unwrap().to_owned();
    s.pool_is("block", block_free - 16.0).await;
    // The ext4 profile shares the loop pool: its free space follows at the next
    // reconciliation (2 s).
    s.pool_is("ext4", block_free - 16.0).await;

    // The manager's metrics are on the admin endpoint.
    let (_, snapshot) = s.get("/metrics/snapshot").await;
    assert_eq!(
        snapshot["resource_provider_manager/subscribed"], 1.0,
        "{snapshot}"
    );

    // kill -9 and a new start: the data and the disks are still there.
    s.signal(Signal::SIGKILL).await;
    s.start();
    s.ready().await;
    assert_eq!(std::fs::read_to_string(path.join("data")).unwrap(), "kept");
    s.pool_is("mount", mount_free - 101.0).await;

    // Destroy: an unknown id is 404; the disks go and the pools are whole again.
    let (status, e) = s
        .post(
            "/disks/destroy",
            &json!({"volume_id": "vol-nope", "wait": true}),
        )
        .await;
    assert_eq!(status, 404, "{e}");
    assert_eq!(e["field"], "volume_id", "{e}");
    for (volume, profile, free) in [(&id, "mount", mount_free), (&block_id, "block", block_free)] {
        let (status, op) = s
            .post(
                "/disks/destroy",
                &json!({"volume_id": volume, "wait": true}),
            )
            .await;
        assert_eq!(status, 200, "{op}");
        assert_eq!(op["type"], "DESTROY_DISK", "{op}");
        assert_eq!(op["state"], "OPERATION_FINISHED", "{op}");
        assert_eq!(op["volume_id"], volume.as_str(), "{op}");
        s.pool_is(profile, free).await;
    }
    assert!(s.signal(Signal::SIGTERM).await.success());
}

/// A minimal HTTP/1.0 GET on TCP with optional headers: `(status, body)`.
async fn http_get_tcp(addr: &str, path: &str, headers: &[&str]) -> (u16, String) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = format!("GET {path} HTTP/1.0\r\nHost: localhost\r\nConnection: close\r\n");
    for h in headers {
        req.push_str(h);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut raw))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    (
        head.split_whitespace().nth(1).unwrap().parse().unwrap(),
        body.to_owned(),
    )
}

#[tokio::test]
async fn the_admin_api_is_also_served_on_tcp_with_a_token_and_refused_without_one() {
    if !slrp_test_support::require_root(
        "the_admin_api_is_also_served_on_tcp_with_a_token_and_refused_without_one",
    ) {
        return;
    }
    let mut s = Standalone::new();
    let token_file = s.dir.path().join("admin.token");
    std::fs::write(&token_file, "s3cret-token\n").unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let token_path = token_file.display().to_string();
    s.start_with(&["--admin-listen", &addr, "--admin-token-file", &token_path]);
    s.ready().await;
    let (status, body) =
        http_get_tcp(&addr, "/status", &["Authorization: Bearer s3cret-token"]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(json_of(&body)["mode"], "standalone", "{body}");
    let (status, body) = http_get_tcp(&addr, "/status", &[]).await;
    assert_eq!(status, 401, "{body}");
    assert!(s.signal(Signal::SIGTERM).await.success());
    assert!(
        !s.log().contains("s3cret-token"),
        "the token is never logged"
    );

    // A TCP endpoint without a token is refused before anything runs.
    let alone = Standalone::new();
    let (status, stderr) = finish(alone.command(
        Path::new(env!("CARGO_BIN_EXE_slrp")),
        &["--admin-listen", &addr],
    ))
    .await;
    assert_eq!(status.code(), Some(78), "{stderr}");
    assert!(stderr.contains("admin.listen"), "{stderr}");
}
