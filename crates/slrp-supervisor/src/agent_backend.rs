//! The agent backend: plugin containers as the agent's standalone containers, launched
//! through its operator API as Mesos's service manager and container daemon do (spec
//! §4.1; `src/csi/service_manager.cpp`, `src/slave/container_daemon.cpp`).
//!
//! # Layout (Mesos's, so a Mesos provider's leftovers and slrp's are the same thing)
//! ```text
//! <work_dir>/csi/<plugin type>/<plugin name>/containers/<container id>/container.info
//! <work_dir>/csi/<plugin type>/<plugin name>/containers/<container id>/endpoint -> $TMPDIR/mesos-csi-XXXXXX
//! <work_dir>/csi/<plugin type>/<plugin name>/mounts
//! <work_dir>/containers/<container id>     (the agent's sandbox)
//! ```
//! The container ID is `cid_prefix + <plugin type, . → ->-<plugin name>--<SERVICES>` with
//! the configured services as written (duplicates kept).
//!
//! # What differs from Mesos (on purpose)
//! - Relaunches wait a jittered exponential backoff (the supervisor's), not nothing.
//! - A WAIT that fails in transport (agent restarting) is retried with backoff; only an
//!   answer ends it: 200 (the container ended) or 404 (the agent does not know it).
//! - LAUNCH answered 401/403 fails the container for good (Mesos's daemon fails too);
//!   any other failed LAUNCH is retried with backoff.
//! - REMOVE_CONTAINER is never sent: a Mesos 1.11 agent aborts on one for a top-level
//!   container. Sandboxes stay (Mesos parity) unless `remove_sandboxes = files`.
//! - Recovery retires only directories named with this provider's `cid_prefix` (Mesos
//!   retires every directory under `containers/`, the CSI server's included).
//! - A stop the agent never confirmed keeps the socket directory (the container may run).

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use slrp_agent::{AgentConfig, Kill, Launch, OperatorClient, OperatorError, Wait};
use slrp_proto::mesos::v1 as mesos;
use slrp_proto::mesos::v1::agent::call::LaunchContainer;
use slrp_types::{Backoff, DisplayChain, Jitter, JitterRng};
use slrp_wire::checkpoint;

use crate::backend::{Adopted, BoxFuture, ContainerBackend, PluginRun, retire_processes};
use crate::metrics::SupervisorMetrics;
use crate::process::ExitInfo;
use crate::spec::{ContainerSpec, PluginSpec, SpecChecks, SpecError, is_safe_component};
use crate::supervisor::{SupervisorConfig, SupervisorError, remove_endpoint_dir};

/// Prefix of the socket directories (Mesos's `mesos-csi-XXXXXX`).
pub const SOCKET_DIR_PREFIX: &str = "mesos-csi-";
/// Mesos's `MAX_CONTAINER_ID_LENGTH` (`src/slave/constants.hpp`).
pub const MAX_CONTAINER_ID_LENGTH: usize = 242;
/// The checkpointed `CSIPluginContainerInfo` of a container directory.
pub const CONTAINER_INFO: &str = "container.info";
/// SIGTERM, the first signal of a stop.
const SIGTERM: i32 = 15;
/// SIGKILL, after the grace period.
const SIGKILL: i32 = 9;

/// What happens to a retired container's sandbox (`[plugins] remove_sandboxes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RemoveSandboxes {
    /// Leave it (Mesos: plugin sandboxes accumulate; only REMOVE_CONTAINER deletes them,
    /// and that aborts a real agent for a top-level container).
    #[default]
    Never,
    /// Delete `<work_dir>/containers/<container id>` after the container's WAIT answered.
    Files,
}

/// Settings of the agent backend.
#[derive(Debug, Clone)]
pub struct AgentBackendConfig {
    /// The agent (the operator API is the parent path of its resource provider
    /// endpoint), with its token.
    pub agent: AgentConfig,
    /// The agent's work directory (plugin directories under `csi/`, sandboxes under
    /// `containers/`).
    pub work_dir: PathBuf,
    /// `<rp type, . → ->-<rp name>--` ([`cid_prefix`]): the token's `cid_prefix` claim.
    pub cid_prefix: String,
    /// What happens to retired containers' sandboxes.
    pub remove_sandboxes: RemoveSandboxes,
    /// Waits between WAIT_CONTAINER attempts that failed in transport.
    pub wait_retry: Backoff,
    /// How those waits are drawn below their ceiling (default [`Jitter::Full`]).
    pub wait_jitter: Jitter,
}

impl AgentBackendConfig {
    /// Defaults for a provider of type `rp_type` named `rp_name`.
    pub fn new(
        agent: AgentConfig,
        work_dir: impl Into<PathBuf>,
        rp_type: &str,
        rp_name: &str,
    ) -> Self {
        Self {
            agent,
            work_dir: work_dir.into(),
            cid_prefix: cid_prefix(rp_type, rp_name),
            remove_sandboxes: RemoveSandboxes::Never,
            wait_retry: Backoff::PLUGIN_RESTART,
            wait_jitter: Jitter::Full,
        }
    }
}

/// Mesos's `cid_prefix` of a resource provider: `<type, . → ->-<name>--`
/// (`LocalResourceProvider::principal`).
pub fn cid_prefix(rp_type: &str, rp_name: &str) -> String {
    format!("{}-{}--", rp_type.replace('.', "-"), rp_name)
}

/// Why the agent backend failed on a container.
#[derive(Debug, thiserror::Error)]
pub enum AgentBackendError {
    /// An operator API call failed.
    #[error("{call}")]
    Operator {
        /// The call.
        call: &'static str,
        /// Why.
        #[source]
        source: OperatorError,
    },
    /// A file or directory operation failed.
    #[error("{action} {path}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A `container.info` does not decode.
    #[error("reading {path}")]
    ContainerInfo {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: Box<slrp_wire::CheckpointError>,
    },
    /// The socket path handed to the container is not a `unix://` endpoint.
    #[error("CSI_ENDPOINT {value:?} is not a unix:// socket path")]
    Endpoint {
        /// The value.
        value: String,
    },
    /// A leftover container did not end in time after KILL.
    #[error("container {container} still runs {after:?} after KILL_CONTAINER")]
    NotEnded {
        /// Container id.
        container: String,
        /// How long it was waited for.
        after: Duration,
    },
}

fn operator(call: &'static str) -> impl FnOnce(OperatorError) -> AgentBackendError {
    move |source| AgentBackendError::Operator { call, source }
}

/// Checks an agent container ID as the agent's `validateContainerId` does (plus the
/// standalone-container rules: ≤ 242 characters, no `.`, no space).
///
/// # Errors
/// The rule it breaks.
pub fn validate_container_id(id: &str) -> Result<(), &'static str> {
    if id.is_empty() {
        return Err("is empty");
    }
    if id.len() > MAX_CONTAINER_ID_LENGTH {
        return Err("is longer than 242 characters (Mesos's MAX_CONTAINER_ID_LENGTH)");
    }
    if id.contains(['/', '\\']) {
        return Err("contains '/' or '\\'");
    }
    if id.contains('.') {
        return Err("contains '.'");
    }
    if id.contains(' ') {
        return Err("contains a space");
    }
    if id.chars().any(char::is_control) {
        return Err("contains a control character");
    }
    Ok(())
}

/// The agent container ID of `c` for a provider with `cid_prefix`.
pub fn container_id(cid_prefix: &str, c: &ContainerSpec) -> String {
    format!("{cid_prefix}{}", c.mesos_id())
}

/// Checks every container ID of a plugin for the agent backend, at configuration time.
///
/// # Errors
/// [`SpecError::ContainerId`] naming the ID and the rule.
pub fn check_container_ids(
    rp_type: &str,
    rp_name: &str,
    plugin: &mesos::CsiPluginInfo,
) -> Result<(), SpecError> {
    let crate::PluginDeployment::Managed(spec) = crate::deployment_for(plugin, SpecChecks::Agent)?
    else {
        return Ok(());
    };
    check_ids(&cid_prefix(rp_type, rp_name), &spec)
}

fn check_ids(prefix: &str, spec: &PluginSpec) -> Result<(), SpecError> {
    for c in &spec.containers {
        let id = container_id(prefix, c);
        validate_container_id(&id).map_err(|rule| SpecError::ContainerId {
            id: id.clone(),
            rule,
        })?;
    }
    Ok(())
}

/// Plugin containers through the agent's operator API.
#[derive(Debug, Clone)]
pub struct AgentBackend {
    client: OperatorClient,
    cfg: Arc<AgentBackendConfig>,
}

impl AgentBackend {
    /// A backend reaching the operator API of `cfg.agent`.
    ///
    /// # Errors
    /// [`OperatorError`] if the client cannot be made (bad TLS setup, no parent path).
    pub fn new(cfg: AgentBackendConfig) -> Result<Self, OperatorError> {
        Ok(Self {
            client: OperatorClient::new(&cfg.agent)?,
            cfg: Arc::new(cfg),
        })
    }

    /// The operator API client.
    pub fn client(&self) -> &OperatorClient {
        &self.client
    }

    fn plugin_dir(&self, spec: &PluginSpec) -> PathBuf {
        // Type and name were checked to be single safe components (`deployment_for`).
        self.cfg
            .work_dir
            .join("csi")
            .join(&spec.plugin_type)
            .join(&spec.plugin_name)
    }

    fn run(&self, id: String, pid: i32, adopted: bool) -> AgentRun {
        AgentRun {
            client: self.client.clone(),
            cfg: self.cfg.clone(),
            id: mesos::ContainerId {
                value: id,
                parent: None,
            },
            pid,
            adopted,
            exited: None,
            pending: None,
        }
    }

    /// The `executor_pid` the agent reports for `id` (0 if it reports none).
    async fn executor_pid(&self, id: &str) -> i32 {
        match self.client.get_containers(false, true).await {
            Ok(list) => list
                .iter()
                .find(|c| c.container_id.value == id && c.container_id.parent.is_none())
                .and_then(|c| c.container_status.as_ref()?.executor_pid)
                .and_then(|p| i32::try_from(p).ok())
                .unwrap_or(0),
            Err(e) => {
                tracing::warn!(container = %id, error = %DisplayChain(&e), "GET_CONTAINERS after LAUNCH failed; the pid is unknown");
                0
            }
        }
    }

    /// Mesos's service-manager recovery (spec §4.1.4): keeps configured, running
    /// containers whose `container.info` equals the configuration (their next LAUNCH
    /// answers 202); kills, waits for and removes every other container directory whose
    /// name starts with this provider's `cid_prefix` (the others belong to another
    /// provider or to the agent's CSI server).
    pub(crate) async fn recover_containers(
        &self,
        spec: &PluginSpec,
        root: &Path,
        cfg: &SupervisorConfig,
        metrics: &SupervisorMetrics,
    ) -> Result<(), SupervisorError> {
        let mut dirs = Vec::new();
        match std::fs::read_dir(root) {
            Ok(entries) => {
                for entry in entries {
                    let entry = entry.map_err(crate::supervisor::io_err("listing", root))?;
                    let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                        continue;
                    };
                    if !is_safe_component(&name) || !entry.path().is_dir() {
                        continue;
                    }
                    if !name.starts_with(&self.cfg.cid_prefix) {
                        // Another provider's with the same plugin, or the agent's CSI
                        // server's (`mesos-internal-csi-*`): not ours to retire, and no
                        // GET_CONTAINERS of ours lists it (Mesos retires these too).
                        tracing::debug!(container = %name, prefix = %self.cfg.cid_prefix, "leaving a container directory of another owner");
                        continue;
                    }
                    dirs.push(name);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(crate::supervisor::io_err("listing", root)(e)),
        }
        if dirs.is_empty() {
            // Nothing of ours can run: spare the agent the call (and the process
            // backend's start when no agent container ever ran here).
            return Ok(());
        }
        let fail = |container: &str| {
            let container = container.to_owned();
            move |source| SupervisorError::Agent {
                container,
                source: Box::new(source),
            }
        };
        let listed: HashMap<String, bool> = self
            .client
            .get_containers(false, true)
            .await
            .map_err(operator("GET_CONTAINERS"))
            .map_err(fail(&self.cfg.cid_prefix))?
            .into_iter()
            .filter(|c| {
                c.container_id.parent.is_none()
                    && c.container_id.value.starts_with(&self.cfg.cid_prefix)
            })
            .map(|c| {
                let running = c
                    .container_status
                    .as_ref()
                    .is_some_and(|s| s.executor_pid.is_some());
                (c.container_id.value, running)
            })
            .collect();
        for name in dirs {
            let dir = root.join(&name);
            let configured = spec
                .containers
                .iter()
                .find(|c| container_id(&self.cfg.cid_prefix, c) == name);
            let running = listed.get(&name).copied();
            if let (Some(c), Some(true)) = (configured, running) {
                let path = dir.join(CONTAINER_INFO);
                let recorded = read_container_info(&path).map_err(fail(&name))?;
                if recorded.is_some_and(|r| same_container_info(&r, &c.raw.0)) {
                    tracing::info!(container = %name, "keeping the running plugin container (same container.info)");
                    continue;
                }
            }
            let id = mesos::ContainerId {
                value: name.clone(),
                parent: None,
            };
            if running == Some(true) {
                tracing::info!(container = %name, "killing a plugin container that is not part of this configuration");
                self.client
                    .kill_container(&id, None)
                    .await
                    .map_err(operator("KILL_CONTAINER"))
                    .map_err(fail(&name))?;
                // Under the configured container's own label, as the process backend.
                metrics.stopped_leftover(configured.map_or(name.as_str(), |c| c.id.as_str()));
            }
            if running.is_some() {
                let bound = cfg.stop_grace + self.client.call_timeout();
                match tokio::time::timeout(bound, self.client.wait_container(&id)).await {
                    Ok(Ok(Wait::Exited(_) | Wait::NotFound)) => {}
                    Ok(Err(e)) => return Err(fail(&name)(operator("WAIT_CONTAINER")(e))),
                    Err(_) => {
                        return Err(fail(&name)(AgentBackendError::NotEnded {
                            container: name.clone(),
                            after: bound,
                        }));
                    }
                }
                self.remove_sandbox(&name);
            }
            remove_endpoint_dir(&dir);
            std::fs::remove_dir_all(&dir)
                .or_else(|e| {
                    if e.kind() == io::ErrorKind::NotFound {
                        Ok(())
                    } else {
                        Err(e)
                    }
                })
                .map_err(crate::supervisor::io_err("removing", &dir))?;
        }
        Ok(())
    }

    fn remove_sandbox(&self, id: &str) {
        remove_sandbox(&self.cfg, id);
    }
}

fn remove_sandbox(cfg: &AgentBackendConfig, id: &str) {
    if cfg.remove_sandboxes != RemoveSandboxes::Files {
        return;
    }
    let sandbox = cfg.work_dir.join("containers").join(id);
    match std::fs::remove_dir_all(&sandbox) {
        Ok(()) => {
            tracing::info!(sandbox = %sandbox.display(), "removed the sandbox of a retired plugin container")
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(sandbox = %sandbox.display(), error = %DisplayChain(&e), "removing the sandbox of a retired plugin container failed")
        }
    }
}

impl ContainerBackend for AgentBackend {
    fn name(&self) -> &'static str {
        "agent"
    }

    fn checks(&self) -> SpecChecks {
        SpecChecks::Agent
    }

    fn check(&self, spec: &PluginSpec) -> Result<(), SupervisorError> {
        check_ids(&self.cfg.cid_prefix, spec).map_err(|source| SupervisorError::Spec {
            backend: "agent",
            source,
        })
    }

    fn root(&self, spec: &PluginSpec, _cfg: &SupervisorConfig) -> PathBuf {
        self.plugin_dir(spec).join("containers")
    }

    fn dir_name(&self, c: &ContainerSpec) -> String {
        container_id(&self.cfg.cid_prefix, c)
    }

    fn socket_dir_prefix(&self) -> &'static str {
        SOCKET_DIR_PREFIX
    }

    fn clears_socket_before_launch(&self) -> bool {
        false
    }

    fn recover<'a>(
        &'a self,
        spec: &'a PluginSpec,
        root: &'a Path,
        cfg: &'a SupervisorConfig,
        metrics: &'a SupervisorMetrics,
    ) -> BoxFuture<'a, Result<Adopted, SupervisorError>> {
        Box::pin(async move {
            // A previous run with the process backend: its plugins must not run beside
            // the agent's (one plugin, whatever the backend was).
            retire_processes(spec, cfg, metrics).await?;
            self.recover_containers(spec, root, cfg, metrics).await?;
            // Kept containers are re-attached by their first LAUNCH (202), as Mesos does.
            Ok(Adopted::new())
        })
    }

    fn launch<'a>(
        &'a self,
        c: &'a ContainerSpec,
        env: &'a [(String, String)],
        dir: &'a Path,
        _cfg: &'a SupervisorConfig,
    ) -> BoxFuture<'a, Result<Box<dyn PluginRun>, SupervisorError>> {
        Box::pin(async move {
            let id = container_id(&self.cfg.cid_prefix, c);
            let fail = |source| SupervisorError::Agent {
                container: id.clone(),
                source: Box::new(source),
            };
            // Checkpointed first, as Mesos does, so the container is known even if the
            // launch fails half way.
            let info_path = dir.join(CONTAINER_INFO);
            write_container_info(&info_path, &c.raw.0).map_err(|source| {
                fail(AgentBackendError::Io {
                    action: "writing",
                    path: info_path.clone(),
                    source,
                })
            })?;
            // <work_dir>/csi/<pt>/<pn>/containers/<cid> → <work_dir>/csi/<pt>/<pn>/mounts
            let mount_root = dir
                .parent()
                .and_then(Path::parent)
                .map(|p| p.join("mounts"))
                .ok_or_else(|| {
                    fail(AgentBackendError::Io {
                        action: "finding the mount root of",
                        path: dir.to_owned(),
                        source: io::Error::from(io::ErrorKind::InvalidInput),
                    })
                })?;
            std::fs::create_dir_all(&mount_root).map_err(|source| {
                fail(AgentBackendError::Io {
                    action: "creating",
                    path: mount_root.clone(),
                    source,
                })
            })?;
            let launch = launch_call(&id, c, env, &mount_root).map_err(fail)?;
            let adopted = match self.client.launch_container(launch).await {
                Ok(Launch::Launched) => false,
                Ok(Launch::AlreadyRunning) => true,
                Err(OperatorError::Refused { status, body }) => {
                    return Err(SupervisorError::Refused {
                        container: id,
                        status: status.as_u16(),
                        body,
                    });
                }
                Err(e) => return Err(fail(operator("LAUNCH_CONTAINER")(e))),
            };
            let pid = self.executor_pid(&id).await;
            Ok(Box::new(self.run(id, pid, adopted)) as Box<dyn PluginRun>)
        })
    }
}

/// The LAUNCH_CONTAINER of `c` as Mesos's service manager builds it (spec §4.1.3): the
/// configured command plus `CSI_ENDPOINT` (and `MESOS_AGENT_ID`), the configured
/// resources, the configured container (default `{type: MESOS}`) plus the endpoint
/// directory and the mount root as volumes.
fn launch_call(
    id: &str,
    c: &ContainerSpec,
    env: &[(String, String)],
    mount_root: &Path,
) -> Result<LaunchContainer, AgentBackendError> {
    use mesos::volume::source::HostPath;
    let raw = &c.raw.0;
    let endpoint = env
        .iter()
        .find(|(k, _)| k == "CSI_ENDPOINT")
        .map(|(_, v)| v.as_str())
        .unwrap_or_default();
    let socket = endpoint
        .strip_prefix("unix://")
        .map(Path::new)
        .ok_or_else(|| AgentBackendError::Endpoint {
            value: endpoint.to_owned(),
        })?;
    let endpoint_dir = socket
        .parent()
        .ok_or_else(|| AgentBackendError::Endpoint {
            value: endpoint.to_owned(),
        })?
        .to_string_lossy()
        .into_owned();
    let mut command = raw.command.clone().unwrap_or_default();
    let vars = &mut command
        .environment
        .get_or_insert_with(Default::default)
        .variables;
    for (name, value) in env {
        vars.push(mesos::environment::Variable {
            name: name.clone(),
            value: Some(value.clone()),
            ..Default::default()
        });
    }
    let mut container = raw.container.clone().unwrap_or(mesos::ContainerInfo {
        r#type: mesos::container_info::Type::Mesos as i32,
        ..Default::default()
    });
    container.volumes.push(mesos::Volume {
        mode: mesos::volume::Mode::Rw as i32,
        container_path: endpoint_dir.clone(),
        host_path: Some(endpoint_dir),
        ..Default::default()
    });
    let mount_root = mount_root.to_string_lossy().into_owned();
    container.volumes.push(mesos::Volume {
        mode: mesos::volume::Mode::Rw as i32,
        container_path: mount_root.clone(),
        source: Some(mesos::volume::Source {
            r#type: Some(mesos::volume::source::Type::HostPath as i32),
            host_path: Some(HostPath {
                path: mount_root,
                mount_propagation: Some(mesos::MountPropagation {
                    mode: Some(mesos::mount_propagation::Mode::Bidirectional as i32),
                }),
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    Ok(LaunchContainer {
        container_id: mesos::ContainerId {
            value: id.to_owned(),
            parent: None,
        },
        command: Some(command),
        resources: raw.resources.clone(),
        container: Some(container),
        limits: HashMap::new(),
    })
}

/// Mesos's `operator==` of `CSIPluginContainerInfo` (`src/common/type_utils.cpp`):
/// services as a multiset, then command, resources and container.
fn same_container_info(
    a: &mesos::CsiPluginContainerInfo,
    b: &mesos::CsiPluginContainerInfo,
) -> bool {
    let mut sa = a.services.clone();
    let mut sb = b.services.clone();
    sa.sort_unstable();
    sb.sort_unstable();
    sa == sb && a.command == b.command && a.resources == b.resources && a.container == b.container
}

/// Writes `container.info` in Mesos's format (a `u32` little-endian length, then the
/// message; resources downgraded; atomic, not fsync'ed, as Mesos).
fn write_container_info(path: &Path, info: &mesos::CsiPluginContainerInfo) -> io::Result<()> {
    let mut info = info.clone();
    // Mesos checkpoints resources downgraded (spec §8.1).
    checkpoint::downgrade_resources(&mut info.resources);
    checkpoint::write_message(path, &info, false)
}

/// Reads a `container.info`; `None` for an empty or missing file (Mesos: absent).
fn read_container_info(
    path: &Path,
) -> Result<Option<mesos::CsiPluginContainerInfo>, AgentBackendError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(AgentBackendError::Io {
                action: "reading",
                path: path.to_owned(),
                source,
            });
        }
    };
    let mut info =
        checkpoint::read_message::<mesos::CsiPluginContainerInfo>(&bytes).map_err(|source| {
            AgentBackendError::ContainerInfo {
                path: path.to_owned(),
                source: Box::new(source),
            }
        })?;
    if let Some(i) = &mut info {
        checkpoint::upgrade_resources(&mut i.resources);
    }
    Ok(info)
}

/// One agent container, as a worker sees it.
#[derive(Debug)]
struct AgentRun {
    client: OperatorClient,
    cfg: Arc<AgentBackendConfig>,
    id: mesos::ContainerId,
    pid: i32,
    adopted: bool,
    exited: Option<ExitInfo>,
    /// The one WAIT_CONTAINER of this run, with its retries. A task rather than a future
    /// of `wait()`: the worker drops `wait()` on every health tick, and the long poll
    /// (and a retry's backoff) must outlive that, as Mesos's daemon sends one WAIT per
    /// container life.
    pending: Option<tokio::task::JoinHandle<ExitInfo>>,
}

impl Drop for AgentRun {
    fn drop(&mut self) {
        // Detached or done with: nobody is watching any more (the agent keeps the
        // container; only our connection closes).
        if let Some(task) = &self.pending {
            task.abort();
        }
    }
}

impl AgentRun {
    async fn wait_inner(&mut self) -> ExitInfo {
        if let Some(e) = self.exited {
            return e;
        }
        let task = self.pending.get_or_insert_with(|| {
            tokio::spawn(keep_waiting(
                self.client.clone(),
                self.cfg.clone(),
                self.id.clone(),
            ))
        });
        let info = match task.await {
            Ok(info) => info,
            Err(e) => {
                // Only a panic gets here (the task is aborted on drop alone).
                tracing::error!(container = %self.id.value, error = %DisplayChain(&e), "the WAIT_CONTAINER task failed; treating the container as gone");
                ExitInfo::Gone
            }
        };
        self.pending = None;
        self.exited = Some(info);
        info
    }

    async fn kill(&self, signal: i32) {
        match self.client.kill_container(&self.id, Some(signal)).await {
            Ok(Kill::Signalled | Kill::NotFound) => {}
            Err(e) => {
                tracing::warn!(container = %self.id.value, signal, error = %DisplayChain(&e), "KILL_CONTAINER failed");
            }
        }
    }

    async fn stop_inner(&mut self, grace: Duration) -> (ExitInfo, bool) {
        if let Some(e) = self.exited {
            return (e, false);
        }
        self.kill(SIGTERM).await;
        if let Ok(info) = tokio::time::timeout(grace, self.wait_inner()).await {
            remove_sandbox(&self.cfg, &self.id.value);
            return (info, false);
        }
        self.kill(SIGKILL).await;
        // Bounded: an agent that stays away must not hold a shutdown forever.
        let bound = grace + self.client.call_timeout();
        let info = match tokio::time::timeout(bound, self.wait_inner()).await {
            Ok(info) => {
                remove_sandbox(&self.cfg, &self.id.value);
                info
            }
            Err(_) => {
                tracing::warn!(container = %self.id.value, after = ?bound, "no answer to WAIT_CONTAINER after SIGKILL; the container may still run");
                ExitInfo::Unconfirmed
            }
        };
        (info, true)
    }
}

/// WAIT_CONTAINER until the agent answers about the container: transport failures (the
/// agent restarting, the connection cut) say nothing about it and are retried with the
/// configured backoff.
async fn keep_waiting(
    client: OperatorClient,
    cfg: Arc<AgentBackendConfig>,
    id: mesos::ContainerId,
) -> ExitInfo {
    let mut jitter = JitterRng::new(cfg.wait_jitter);
    // Consecutive WAITs that failed in transport (the backoff of the next one).
    let mut failures: u32 = 0;
    loop {
        let asked = tokio::time::Instant::now();
        match client.wait_container(&id).await {
            Ok(Wait::Exited(w)) => {
                return ExitInfo::Waited {
                    exit_status: w.exit_status,
                };
            }
            Ok(Wait::NotFound) => return ExitInfo::Gone,
            Err(OperatorError::Refused { status, body }) => {
                // Not a transport problem: asking again cannot help. Mesos's daemon
                // fails on any answer but 200/404.
                tracing::error!(container = %id.value, %status, body, "WAIT_CONTAINER refused; treating the container as ended");
                return ExitInfo::RefusedWait {
                    status: status.as_u16(),
                };
            }
            Err(e) => {
                // A poll that was answered for a long while before it broke starts the
                // backoff afresh (a later agent restart is a new outage).
                if asked.elapsed() >= cfg.wait_retry.max() {
                    failures = 0;
                }
                failures = failures.saturating_add(1);
                let delay = cfg.wait_retry.delay(failures, &mut jitter);
                tracing::warn!(container = %id.value, error = %DisplayChain(&e), ?delay, "WAIT_CONTAINER failed; asking again");
                tokio::time::sleep(delay).await;
            }
        }
    }
}

impl PluginRun for AgentRun {
    fn pid(&self) -> i32 {
        self.pid
    }

    fn is_adopted(&self) -> bool {
        self.adopted
    }

    fn wait(&mut self) -> BoxFuture<'_, ExitInfo> {
        Box::pin(self.wait_inner())
    }

    fn stop(&mut self, grace: Duration) -> BoxFuture<'_, (ExitInfo, bool)> {
        Box::pin(self.stop_inner(grace))
    }

    fn detach(self: Box<Self>) {
        // The agent keeps running it; the next slrp's LAUNCH re-attaches (202).
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    #[test]
    fn container_ids_follow_mesos_s_rules() {
        assert_eq!(
            cid_prefix("org.apache.mesos.rp.local.storage", "test"),
            "org-apache-mesos-rp-local-storage-test--"
        );
        assert!(validate_container_id("a-b--C").is_ok());
        assert!(validate_container_id(&"x".repeat(242)).is_ok());
        for (bad, rule) in [
            ("", "empty"),
            ("a.b", "'.'"),
            ("a b", "space"),
            ("a/b", "'/'"),
            ("a\u{1}b", "control"),
        ] {
            let err = validate_container_id(bad).unwrap_err();
            assert!(err.contains(rule), "{bad:?}: {err}");
        }
        assert!(
            validate_container_id(&"x".repeat(243))
                .unwrap_err()
                .contains("242")
        );
    }

    #[test]
    fn container_info_round_trips_in_mesos_s_format() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CONTAINER_INFO);
        let info = mesos::CsiPluginContainerInfo {
            services: vec![2],
            resources: vec![mesos::Resource {
                name: "cpus".into(),
                r#type: mesos::value::Type::Scalar as i32,
                scalar: Some(mesos::value::Scalar { value: 0.1 }),
                ..Default::default()
            }],
            ..Default::default()
        };
        write_container_info(&path, &info).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let len = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
        assert_eq!(len, bytes.len() - 4);
        // Downgraded on disk: the unreserved resource names role "*".
        let on_disk = mesos::CsiPluginContainerInfo::decode(&bytes[4..]).unwrap();
        assert_eq!(on_disk.resources[0].role.as_deref(), Some("*"));
        assert_eq!(read_container_info(&path).unwrap(), Some(info));
        std::fs::write(&path, b"").unwrap();
        assert_eq!(read_container_info(&path).unwrap(), None);
        std::fs::write(&path, [9, 0, 0, 0, 1]).unwrap();
        assert!(read_container_info(&path).is_err());
    }

    #[test]
    fn services_compare_as_a_multiset() {
        let a = mesos::CsiPluginContainerInfo {
            services: vec![1, 2],
            ..Default::default()
        };
        let mut b = a.clone();
        b.services = vec![2, 1];
        assert!(same_container_info(&a, &b));
        b.command = Some(mesos::CommandInfo {
            value: Some("other".into()),
            ..Default::default()
        });
        assert!(!same_container_info(&a, &b));
    }
}
