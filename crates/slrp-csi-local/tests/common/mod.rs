//! Harness for tests that run the real `slrp-csi-local` binary on a socket in a tempdir.
//!
//! [`TestPlugin`] owns the tempdir, the child process and everything the plugin may have
//! mounted or attached there; its `Drop` kills the child and unmounts/detaches whatever is
//! left, so a failing test leaks no mounts or loop devices.

#![allow(
    dead_code,
    unreachable_pub,
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used
)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use slrp_proto::csi::{v0, v1};
use tonic::transport::{Channel, Endpoint};

pub const MIB: i64 = 1 << 20;

/// Whether this process may mount and attach loop devices: a skip notice locally, a
/// failure under `CI=true` (see `slrp_test_support::require`).
pub fn can_mount(test: &str) -> bool {
    slrp_test_support::require_root(test)
}

/// Whether the effective capability set holds CAP_SYS_RESOURCE (a fact; tests that
/// cannot do without it call `slrp_test_support::require_cap`).
pub fn has_cap_sys_resource() -> bool {
    slrp_test_support::has_cap(slrp_test_support::Cap::SysResource)
}

/// Whether `tool` is installed (a fact; tests that need it call `require_tool`).
pub fn has_tool(tool: &str) -> bool {
    slrp_test_support::find_tool(tool).is_some()
}

pub struct TestPlugin {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub root: PathBuf,
    pub faults: PathBuf,
    pub args: Vec<String>,
    /// Extra environment for the plugin (e.g. a `PATH` with fake tools first).
    pub env: Vec<(String, String)>,
    /// When set, the plugin's stderr (its log) is appended to this file instead of the
    /// test's own stderr, so a test can read what the plugin logged.
    pub stderr_log: Option<PathBuf>,
    /// Whether `--faults-file` is passed (off only for runs with the default flags).
    pub faults_flag: bool,
    pub child: Option<Child>,
}

impl TestPlugin {
    /// Starts the plugin with extra command-line arguments and waits until Probe answers.
    pub async fn start(extra: &[&str]) -> Self {
        Self::start_with_env(extra, &[]).await
    }

    /// [`TestPlugin::start`] with extra environment variables.
    pub async fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start_full(extra, env, false).await
    }

    /// [`TestPlugin::start_with_env`], with the plugin's log captured in [`TestPlugin::log`].
    pub async fn start_logged(extra: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start_full(extra, env, true).await
    }

    async fn start_full(extra: &[&str], env: &[(&str, &str)], logged: bool) -> Self {
        let mut p = Self::prepare(None, extra, env, logged);
        p.spawn().await;
        p
    }

    /// Starts the plugin with no flags but `--endpoint`, `--root` and `--node-id`, as an
    /// operator running csi-sanity against a default installation would.
    pub async fn start_defaults() -> Self {
        Self::start_defaults_and(&[]).await
    }

    /// [`TestPlugin::start_defaults`] plus `extra` flags (and still no `--faults-file`).
    pub async fn start_defaults_and(extra: &[&str]) -> Self {
        let mut p = Self::prepare(None, extra, &[], false);
        p.faults_flag = false;
        p.spawn().await;
        p
    }

    /// A plugin not started yet, with its own tempdir, root and log, that will serve
    /// `socket` (typically another plugin's).
    pub fn on_socket(socket: &Path) -> Self {
        Self::prepare(Some(socket), &[], &[], true)
    }

    pub fn prepare(
        socket: Option<&Path>,
        extra: &[&str],
        env: &[(&str, &str)],
        logged: bool,
    ) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("csil")
            .tempdir_in("/tmp")
            .expect("tempdir");
        let socket = socket.map_or_else(|| dir.path().join("csi.sock"), Path::to_owned);
        let root = dir.path().join("root");
        let faults = dir.path().join("faults.json");
        Self {
            socket,
            root,
            faults,
            args: extra.iter().map(|s| (*s).to_owned()).collect(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            stderr_log: logged.then(|| dir.path().join("plugin.log")),
            faults_flag: true,
            child: None,
            dir,
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn path_str(&self, rel: &str) -> String {
        self.path(rel).display().to_string()
    }

    /// What the plugin logged so far (empty unless started with [`TestPlugin::start_logged`]).
    pub fn log(&self) -> String {
        self.stderr_log
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
    }

    pub async fn spawn(&mut self) {
        self.spawn_child();
        self.wait_ready().await;
    }

    /// Starts the process without waiting for it to serve.
    pub fn spawn_child(&mut self) {
        assert!(self.child.is_none(), "already running");
        let stderr = match &self.stderr_log {
            Some(p) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .expect("opening the plugin log"),
            ),
            None => Stdio::inherit(),
        };
        let child = Command::new(env!("CARGO_BIN_EXE_slrp-csi-local"))
            .arg("--endpoint")
            .arg(format!("unix://{}", self.socket.display()))
            .arg("--root")
            .arg(&self.root)
            .arg("--node-id")
            .arg("test-node")
            .args(
                self.faults_flag
                    .then(|| [PathBuf::from("--faults-file"), self.faults.clone()])
                    .into_iter()
                    .flatten(),
            )
            .args(&self.args)
            .env("RUST_LOG", "info")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawning slrp-csi-local");
        self.child = Some(child);
    }

    /// Waits for the socket and a successful Probe (bounded: the test fails, not hangs).
    async fn wait_ready(&mut self) {
        for _ in 0..200 {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("plugin exited during start: {status}");
            }
            if self.socket.exists()
                && let Ok(ch) = self.channel().await
            {
                {
                    // Either package: the plugin answers only the one it serves.
                    let v1_ok = v1::identity_client::IdentityClient::new(ch.clone())
                        .probe(v1::ProbeRequest {})
                        .await
                        .is_ok();
                    let v0_ok = v0::identity_client::IdentityClient::new(ch)
                        .probe(v0::ProbeRequest {})
                        .await
                        .is_ok();
                    if v1_ok || v0_ok {
                        return;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("plugin did not become ready");
    }

    pub async fn channel(&self) -> Result<Channel, tonic::transport::Error> {
        Endpoint::from_shared(format!("unix://{}", self.socket.display()))?
            .connect()
            .await
    }

    pub async fn v1(&self) -> V1 {
        let ch = self.channel().await.expect("connect");
        V1 {
            identity: v1::identity_client::IdentityClient::new(ch.clone()),
            controller: v1::controller_client::ControllerClient::new(ch.clone()),
            node: v1::node_client::NodeClient::new(ch),
        }
    }

    pub async fn v0(&self) -> V0 {
        let ch = self.channel().await.expect("connect");
        V0 {
            identity: v0::identity_client::IdentityClient::new(ch.clone()),
            controller: v0::controller_client::ControllerClient::new(ch.clone()),
            node: v0::node_client::NodeClient::new(ch),
        }
    }

    /// kill -9 and wait.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// kill -9, then start again on the same root and socket.
    pub async fn crash_and_restart(&mut self) {
        self.kill();
        self.spawn().await;
    }

    /// Waits (bounded) for the child to exit on its own and returns its status.
    pub async fn wait_exit(&mut self) -> std::process::ExitStatus {
        for _ in 0..200 {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return status;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("plugin did not exit");
    }

    pub fn write_faults(&self, json: &str) {
        std::fs::write(&self.faults, json).expect("writing faults file");
    }

    /// Mount points under this test's directory, deepest first.
    pub fn mounts_here(&self) -> Vec<PathBuf> {
        let base = std::fs::canonicalize(self.dir.path()).unwrap_or(self.dir.path().to_owned());
        let mut v: Vec<PathBuf> = procfs::process::Process::myself()
            .and_then(|p| p.mountinfo())
            .map(|m| {
                m.into_iter()
                    .map(|i| i.mount_point)
                    .filter(|p| p.starts_with(&base))
                    .collect()
            })
            .unwrap_or_default();
        v.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        v
    }

    /// Loop devices still backed by files here after waiting (bounded, a hang guard) for
    /// detached ones to go: `losetup -d` on a device that someone else has open (udev
    /// probing it after a change) only marks it for release on last close, so a device the
    /// plugin detached can linger for a moment.
    pub async fn loops_after_release(&self) -> Vec<String> {
        for _ in 0..100 {
            if self.loops_here().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.loops_here()
    }

    /// Loop devices backed by files under this test's directory.
    pub fn loops_here(&self) -> Vec<String> {
        let out = Command::new("losetup")
            .args(["-l", "-n", "-O", "NAME,BACK-FILE"])
            .output();
        let Ok(out) = out else { return Vec::new() };
        let base = self.dir.path().display().to_string();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                let dev = it.next()?;
                let file = it.next()?;
                file.starts_with(&base).then(|| dev.to_owned())
            })
            .collect()
    }
}

impl Drop for TestPlugin {
    fn drop(&mut self) {
        self.kill();
        for m in self.mounts_here() {
            let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
        }
        for dev in self.loops_here() {
            let _ = Command::new("losetup").args(["-d", &dev]).status();
        }
    }
}

pub struct V1 {
    pub identity: v1::identity_client::IdentityClient<Channel>,
    pub controller: v1::controller_client::ControllerClient<Channel>,
    pub node: v1::node_client::NodeClient<Channel>,
}

pub struct V0 {
    pub identity: v0::identity_client::IdentityClient<Channel>,
    pub controller: v0::controller_client::ControllerClient<Channel>,
    pub node: v0::node_client::NodeClient<Channel>,
}

pub fn mount_cap(fs_type: &str) -> v1::VolumeCapability {
    use v1::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
    v1::VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs_type.to_owned(),
            ..Default::default()
        })),
    }
}

pub fn block_cap() -> v1::VolumeCapability {
    use v1::volume_capability::{AccessMode, AccessType, BlockVolume, access_mode::Mode};
    v1::VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    }
}

pub fn stage_req(id: &str, path: &str, cap: v1::VolumeCapability) -> v1::NodeStageVolumeRequest {
    v1::NodeStageVolumeRequest {
        volume_id: id.to_owned(),
        staging_target_path: path.to_owned(),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

pub fn unstage_req(id: &str, path: &str) -> v1::NodeUnstageVolumeRequest {
    v1::NodeUnstageVolumeRequest {
        volume_id: id.to_owned(),
        staging_target_path: path.to_owned(),
    }
}

pub fn publish_req(
    id: &str,
    staging: &str,
    target: &str,
    cap: v1::VolumeCapability,
) -> v1::NodePublishVolumeRequest {
    v1::NodePublishVolumeRequest {
        volume_id: id.to_owned(),
        staging_target_path: staging.to_owned(),
        target_path: target.to_owned(),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

pub fn unpublish_req(id: &str, target: &str) -> v1::NodeUnpublishVolumeRequest {
    v1::NodeUnpublishVolumeRequest {
        volume_id: id.to_owned(),
        target_path: target.to_owned(),
    }
}

pub fn create_req(
    name: &str,
    bytes: i64,
    cap: v1::VolumeCapability,
    params: &[(&str, &str)],
) -> v1::CreateVolumeRequest {
    v1::CreateVolumeRequest {
        name: name.to_owned(),
        capacity_range: Some(v1::CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![cap],
        parameters: params
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Default::default()
    }
}

/// Asserts a call failed with `code`.
#[track_caller]
pub fn assert_code<T: std::fmt::Debug>(res: Result<T, tonic::Status>, code: tonic::Code) {
    match res {
        Ok(v) => panic!("expected {code:?}, got Ok({v:?})"),
        Err(s) => assert_eq!(s.code(), code, "message: {}", s.message()),
    }
}
