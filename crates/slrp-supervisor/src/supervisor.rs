//! The supervisor: one worker task per plugin container, and the handle that owns them.
//!
//! # Lifecycle of a container (one worker)
//! ```text
//!  launch (or adopt) ─► wait for socket ─► probe until ready ─► Ready ─► health probes
//!       ▲                     │ timeout          │ timeout       │ exit / N failed probes
//!       │                     ▼                  ▼               ▼
//!       └──── backoff ◄──── terminated (cause counted, pid record and socket removed)
//! ```
//! Each launch first makes sure the socket directory exists at its original path (a tmp
//! cleaner may have removed it) and identifies the new process by its `/proc` start time;
//! a launch whose start time stays unreadable kills the process and fails (see
//! [`crate::process::LaunchError::UnknownStartTime`]). Every probe first checks that the
//! socket file still exists.
//!
//! The n-th consecutive failure waits `restart_backoff` (jittered, capped); a run that
//! stayed ready for `healthy_reset` resets the count, so a crash after a long healthy
//! period restarts quickly while a crash loop slows down (Mesos relaunches at once).
//!
//! # Shutdown protocol
//! [`SupervisorHandle::shutdown`] cancels every worker; each sends SIGTERM to its plugin's
//! process group, SIGKILL after `stop_grace`, waits for it, and removes its pid record,
//! socket and socket directory. Dropping the handle cancels the workers the same way; if
//! the runtime itself goes away, dropping a worker SIGKILLs its plugin group.
//! [`SupervisorHandle::detach`] instead leaves the plugins running with their records in
//! place, for a next slrp process to adopt.
//!
//! # Restart of slrp (adoption)
//! Each launch writes `pid.json` (pid, start time, config hash, boot id) into the
//! container's directory. [`Supervisor::start`] reads them first: a live process with the
//! recorded start time and the current config hash is adopted (watched by polling
//! `/proc`, since it is not our child); any other live one is stopped before anything is
//! launched, so there are never two copies. A record from an earlier boot names no
//! process of ours, so whatever now has its pid is left alone.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use slrp_csi::endpoint::is_too_long;
use slrp_csi::{
    ClientConfig, CsiClient, CsiEndpoint, CsiError, CsiMetrics, CsiServices, EndpointReadiness,
    EndpointStatus,
};
use slrp_types::{Backoff, DisplayChain, Jitter, JitterRng};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backend::{ContainerBackend, PROCESS_SOCKET_PREFIX, PluginRun, ProcessBackend, RECORD};
use crate::metrics::{SupervisorMetrics, TerminationCause};
use crate::process::{ExitInfo, LaunchError, ProcFs, ProcReader};
use crate::readiness::{Readiness, ReadinessCheck};
use crate::spec::{ContainerSpec, PluginSpec, Service, SpecError};

/// Supervisor settings. Defaults follow Mesos where Mesos has a number.
#[derive(Debug, Clone)]
pub struct SupervisorConfig {
    /// Per-container directories (pid records, logs, endpoint symlinks) live under
    /// `<runtime_dir>/containers/`. Must persist across slrp restarts for adoption.
    pub runtime_dir: PathBuf,
    /// Where short socket directories are created (`slrp-csi-<random>`); the system temp
    /// directory by default. Sockets cannot live under long paths (`sun_path`).
    pub socket_base: PathBuf,
    /// How long to wait for the socket to appear (Mesos: 1 min).
    pub socket_timeout: Duration,
    /// How often to look for the socket (Mesos: 10 ms).
    pub socket_poll: Duration,
    /// How long to keep probing a started plugin until it is ready.
    pub ready_timeout: Duration,
    /// Pause between start-up probes.
    pub ready_probe_interval: Duration,
    /// Deadline of one probe.
    pub probe_timeout: Duration,
    /// Period of health probes once ready.
    pub health_interval: Duration,
    /// Consecutive failed health probes that make a plugin unhealthy (restarted).
    pub unhealthy_after: u32,
    /// Restart backoff bounds.
    pub restart_backoff: Backoff,
    /// Restart jitter.
    pub restart_jitter: Jitter,
    /// A run that stayed ready this long resets the backoff.
    pub healthy_reset: Duration,
    /// Time between SIGTERM and SIGKILL when stopping.
    pub stop_grace: Duration,
    /// How often an adopted process (not our child) is checked for exit.
    pub adopt_poll: Duration,
    /// Exported to node-service containers as `MESOS_AGENT_ID`, as Mesos does.
    pub agent_id: Option<String>,
    /// Reads the start time of each launched process for its pid record ([`ProcFs`];
    /// replaceable so tests can simulate an unreadable `/proc`).
    pub proc_reader: Arc<dyn ProcReader>,
    /// Where the containers run: [`ProcessBackend`] (local processes, the default) or
    /// [`crate::agent_backend::AgentBackend`] (the agent's standalone containers).
    pub backend: Arc<dyn ContainerBackend>,
}

impl SupervisorConfig {
    /// Defaults with the given runtime directory.
    pub fn new(runtime_dir: impl Into<PathBuf>) -> Self {
        Self {
            runtime_dir: runtime_dir.into(),
            socket_base: std::env::temp_dir(),
            socket_timeout: Duration::from_secs(60),
            socket_poll: Duration::from_millis(10),
            ready_timeout: Duration::from_secs(60),
            ready_probe_interval: Duration::from_millis(500),
            probe_timeout: Duration::from_secs(10),
            health_interval: Duration::from_secs(10),
            unhealthy_after: 3,
            restart_backoff: Backoff::PLUGIN_RESTART,
            restart_jitter: Jitter::Full,
            healthy_reset: Duration::from_secs(60),
            stop_grace: Duration::from_secs(10),
            adopt_poll: Duration::from_millis(500),
            agent_id: None,
            proc_reader: Arc::new(ProcFs),
            backend: Arc::new(ProcessBackend::default()),
        }
    }

    /// Checks the settings; [`Supervisor::start`] refuses a config that fails this.
    ///
    /// # Errors
    /// [`SupervisorError::Config`] naming the first field at fault: a zero polling or
    /// probing period (`socket_poll`, `ready_probe_interval`, `health_interval`,
    /// `adopt_poll`: a busy loop), a zero deadline (`socket_timeout`, `ready_timeout`,
    /// `probe_timeout`: nothing could ever pass), or `unhealthy_after` of 0 (a plugin would
    /// count as unhealthy before any probe failed).
    pub fn validate(&self) -> Result<(), SupervisorError> {
        let periods = [
            ("socket_poll", self.socket_poll),
            ("ready_probe_interval", self.ready_probe_interval),
            ("health_interval", self.health_interval),
            ("adopt_poll", self.adopt_poll),
            ("socket_timeout", self.socket_timeout),
            ("ready_timeout", self.ready_timeout),
            ("probe_timeout", self.probe_timeout),
        ];
        if let Some((field, _)) = periods.iter().find(|(_, d)| d.is_zero()) {
            return Err(SupervisorError::Config {
                field,
                problem: "must be longer than zero",
            });
        }
        if self.unhealthy_after == 0 {
            return Err(SupervisorError::Config {
                field: "unhealthy_after",
                problem: "must be at least 1",
            });
        }
        Ok(())
    }
}

/// Errors of the supervisor.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    /// A [`SupervisorConfig`] setting is unusable; nothing was started.
    #[error("invalid supervisor config: {field} {problem}")]
    Config {
        /// The field at fault.
        field: &'static str,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// A file or directory operation failed.
    #[error("{action} {path}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The failure.
        #[source]
        source: io::Error,
    },
    /// The plugin has no container for the service.
    #[error("no container serves {0:?}")]
    NoService(Service),
    /// The container did not become ready in time.
    #[error("container {container} not ready after {after:?} (state {state:?})")]
    NotReady {
        /// Container id.
        container: String,
        /// How long we waited.
        after: Duration,
        /// Its state at that moment.
        state: ContainerState,
    },
    /// A plugin process could not be launched.
    #[error("launching the plugin of container {container}")]
    Launch {
        /// Container id.
        container: String,
        /// Why.
        #[source]
        source: LaunchError,
    },
    /// The supervisor was stopped.
    #[error("container {container} is stopped")]
    Stopped {
        /// Container id.
        container: String,
    },
    /// The plugin's configuration cannot run on the configured backend.
    #[error("plugin configuration for the {backend} backend")]
    Spec {
        /// The backend's name.
        backend: &'static str,
        /// What is wrong.
        #[source]
        source: SpecError,
    },
    /// The agent refused to launch the container (401/403: the token does not allow
    /// this container ID); not retried.
    #[error("the agent refused to launch container {container}: {status} {body:?}")]
    Refused {
        /// Container id (the agent's).
        container: String,
        /// The HTTP status.
        status: u16,
        /// The body the agent sent.
        body: String,
    },
    /// The agent backend failed on a container.
    #[error("agent container {container}")]
    Agent {
        /// Container id (the agent's).
        container: String,
        /// Why (boxed: large, and a cold path).
        #[source]
        source: Box<crate::agent_backend::AgentBackendError>,
    },
    /// The container failed for good (e.g. the agent refused it); it is not restarted.
    #[error("container {container} failed and is not restarted: {reason}")]
    Failed {
        /// Container id.
        container: String,
        /// Why, with its causes.
        reason: String,
    },
    /// A CSI client for a container's endpoint could not be made.
    #[error("making a CSI client for container {container}")]
    Client {
        /// Container id.
        container: String,
        /// Why.
        #[source]
        source: CsiError,
    },
}

pub(crate) fn io_err(
    action: &'static str,
    path: &Path,
) -> impl FnOnce(io::Error) -> SupervisorError {
    let path = path.to_owned();
    move |source| SupervisorError::Io {
        action,
        path,
        source,
    }
}

/// Observable state of one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContainerState {
    /// Launched (or adopted), waiting for socket and readiness. `launch` counts launches.
    Starting {
        /// 1 for the first launch.
        launch: u32,
    },
    /// Ready and being health-probed.
    Ready {
        /// Its pid.
        pid: i32,
    },
    /// Terminated; the next launch follows after `delay`.
    BackingOff {
        /// The wait before the next launch.
        delay: Duration,
        /// Consecutive failures so far (resets after a healthy period).
        failures: u32,
    },
    /// Stopped for good (shutdown or detach).
    Stopped,
    /// Failed for good and not restarted (the agent refused to launch it).
    Failed {
        /// Why, with its causes.
        reason: String,
    },
}

impl ContainerState {
    /// What managed CSI clients of the container's endpoint make of this state.
    pub fn endpoint_status(&self) -> EndpointStatus {
        match self {
            Self::Ready { .. } => EndpointStatus::Up,
            Self::Starting { .. } | Self::BackingOff { .. } => EndpointStatus::Down,
            Self::Stopped | Self::Failed { .. } => EndpointStatus::Stopped,
        }
    }
}

/// Publishes a container's state, and with it its endpoint's status for the managed
/// clients of [`SupervisorHandle::client`] (which wait while it is down).
struct StatePublisher {
    state: watch::Sender<ContainerState>,
    endpoint: watch::Sender<EndpointStatus>,
}

impl StatePublisher {
    fn send_replace(&self, next: ContainerState) {
        let status = next.endpoint_status();
        let publish = || {
            self.endpoint.send_if_modified(|s| {
                let changed = *s != status;
                *s = status;
                changed
            })
        };
        // Clients are told "down" before the state changes and "up" after it, so whoever
        // sees the endpoint up finds the container ready.
        if status == EndpointStatus::Up {
            self.state.send_replace(next);
            publish();
        } else {
            publish();
            self.state.send_replace(next);
        }
    }
}

const ENDPOINT_LINK: &str = "endpoint";
const SOCKET: &str = "endpoint.sock";

pub(crate) fn remove_if_exists(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        Ok(()) | Err(_) => Ok(()),
    }
}

/// The short socket directory of a container, reusing the one its `endpoint` symlink
/// points at (an adopted plugin listens there), else creating a fresh one (Mesos style).
fn endpoint_dir(container_dir: &Path, base: &Path, prefix: &str) -> io::Result<PathBuf> {
    let link = container_dir.join(ENDPOINT_LINK);
    match std::fs::read_link(&link) {
        Ok(target) if target.is_dir() => return Ok(target),
        Ok(_) => std::fs::remove_file(&link)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(base)?
        .keep();
    std::os::unix::fs::symlink(&dir, &link)?;
    Ok(dir)
}

/// Makes sure the socket directory of `socket` exists, belongs to us and is private
/// (0700, as created), and that the container's `endpoint` link points at it; then removes
/// a stale socket if `clear_socket`. The directory keeps its path, so the endpoint handed out by
/// [`SupervisorHandle::endpoint`] stays valid.
fn ensure_socket_dir(container_dir: &Path, socket: &Path, clear_socket: bool) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let dir = socket
        .parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "socket has no directory"))?;
    match std::fs::symlink_metadata(dir) {
        Ok(meta) => {
            // The name is in a shared directory (/tmp): if it was removed, someone else
            // may have taken it. Never hand a plugin a directory we do not own alone.
            if !meta.is_dir() {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "the socket directory's path is taken by something that is not a directory",
                ));
            }
            if meta.uid() != nix::unistd::geteuid().as_raw() {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "the socket directory belongs to another user",
                ));
            }
            if meta.mode() & 0o7777 != 0o700 {
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            // Not recursive: the base directory itself missing is a configuration problem.
            // `create` fails if someone takes the name first; the next launch then finds
            // it and refuses it above.
            std::fs::DirBuilder::new().mode(0o700).create(dir)?;
            tracing::warn!(dir = %dir.display(), "socket directory had been removed (by a tmp cleaner?); recreated it");
        }
        Err(e) => return Err(e),
    }
    let link = container_dir.join(ENDPOINT_LINK);
    if std::fs::read_link(&link).ok().as_deref() != Some(dir) {
        remove_if_exists(&link)?;
        std::os::unix::fs::symlink(dir, &link)?;
    }
    // A stale socket from a previous run would make the wait succeed too early, and some
    // plugins refuse to start when it exists.
    if clear_socket {
        remove_if_exists(socket)?;
    }
    Ok(())
}

/// Removes the short socket directory a container's `endpoint` link points at (only if
/// it looks like one of ours: `slrp-csi-*`, or Mesos's `mesos-csi-*`), then the link.
pub(crate) fn remove_endpoint_dir(container_dir: &Path) {
    let link = container_dir.join(ENDPOINT_LINK);
    if let Ok(target) = std::fs::read_link(&link) {
        let ours = target
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| {
                n.starts_with(PROCESS_SOCKET_PREFIX)
                    || n.starts_with(crate::agent_backend::SOCKET_DIR_PREFIX)
            });
        if ours {
            let _ = std::fs::remove_dir_all(&target);
        }
    }
    let _ = std::fs::remove_file(&link);
}

/// Entry point; see the module docs.
#[derive(Debug)]
pub struct Supervisor;

impl Supervisor {
    /// Recovers leftovers of a previous run, then starts supervising every container of
    /// `spec`. Returns once workers are spawned; use [`SupervisorHandle::wait_ready`].
    ///
    /// # Errors
    /// [`SupervisorError::Config`] if `cfg` fails [`SupervisorConfig::validate`];
    /// [`SupervisorError::Io`] if the runtime or socket directories cannot be prepared.
    pub async fn start(
        spec: PluginSpec,
        cfg: SupervisorConfig,
        readiness: Arc<dyn ReadinessCheck>,
        metrics: SupervisorMetrics,
        cancel: CancellationToken,
    ) -> Result<SupervisorHandle, SupervisorError> {
        cfg.validate()?;
        let cfg = Arc::new(cfg);
        // Socket aliases of CSI clients in a previous slrp that was SIGKILLed (best effort;
        // see `slrp_csi::endpoint`).
        slrp_csi::endpoint::sweep_stale_aliases(&std::env::temp_dir());
        let backend = cfg.backend.clone();
        backend.check(&spec)?;
        let root = backend.root(&spec, &cfg);
        std::fs::create_dir_all(&root).map_err(io_err("creating", &root))?;
        let mut adopted = backend.recover(&spec, &root, &cfg, &metrics).await?;

        // Every fallible step comes before the first worker is spawned: an error after
        // that would return without a handle and leave running workers (and plugins)
        // that nobody can stop.
        let mut prepared = Vec::with_capacity(spec.containers.len());
        for c in &spec.containers {
            let dir = root.join(backend.dir_name(c));
            std::fs::create_dir_all(&dir).map_err(io_err("creating", &dir))?;
            let sock_dir = endpoint_dir(&dir, &cfg.socket_base, backend.socket_dir_prefix())
                .map_err(io_err("preparing socket directory for", &dir))?;
            let socket = sock_dir.join(SOCKET);
            if is_too_long(&socket) {
                return Err(SupervisorError::Io {
                    action: "using socket path (longer than sun_path allows; set a shorter socket_base)",
                    path: socket,
                    source: io::Error::from(io::ErrorKind::InvalidInput),
                });
            }
            prepared.push((dir, socket));
        }

        let detach = CancellationToken::new();
        let mut containers = Vec::new();
        let mut tasks = Vec::new();
        for (c, (dir, socket)) in spec.containers.iter().zip(prepared) {
            let adopted_proc = adopted.remove(&c.id);
            if let Some(p) = &adopted_proc {
                metrics.adopted(&c.id);
                tracing::info!(container = %c.id, pid = p.pid(), backend = backend.name(), "adopted plugin left running by a previous slrp");
            }
            let initial = ContainerState::Starting { launch: 1 };
            let (endpoint_tx, endpoint_rx) = watch::channel(initial.endpoint_status());
            let (state_tx, state_rx) = watch::channel(initial);
            let worker = Worker {
                spec: c.clone(),
                dir,
                socket: socket.clone(),
                cfg: cfg.clone(),
                readiness: readiness.clone(),
                metrics: metrics.clone(),
                state: StatePublisher {
                    state: state_tx,
                    endpoint: endpoint_tx,
                },
                cancel: cancel.clone(),
                detach: detach.clone(),
                adopted: adopted_proc,
            };
            let span = tracing::info_span!(parent: None, "plugin", container = %c.id);
            tasks.push(tokio::spawn(worker.run().instrument(span)));
            containers.push(ContainerEntry {
                id: c.id.clone(),
                services: c.services.clone(),
                socket,
                state: state_rx,
                endpoint: endpoint_rx,
            });
        }
        Ok(SupervisorHandle {
            spec,
            containers,
            tasks,
            cancel,
            detach,
            agent_id: cfg.agent_id.clone(),
        })
    }
}

#[derive(Debug)]
struct ContainerEntry {
    id: String,
    services: Vec<Service>,
    socket: PathBuf,
    state: watch::Receiver<ContainerState>,
    endpoint: watch::Receiver<EndpointStatus>,
}

/// Owner of a running supervisor. Dropping it cancels the workers (plugins are stopped).
#[derive(Debug)]
pub struct SupervisorHandle {
    spec: PluginSpec,
    containers: Vec<ContainerEntry>,
    /// Worker tasks; joined by `shutdown`/`detach` so callers know plugins are gone.
    tasks: Vec<JoinHandle<()>>,
    /// Stops workers and their plugins.
    cancel: CancellationToken,
    /// Stops workers but leaves plugins running (hand-over to a next slrp).
    detach: CancellationToken,
    /// The `MESOS_AGENT_ID` the node containers were launched with.
    agent_id: Option<String>,
}

impl SupervisorHandle {
    /// The agent's ID changed while the plugins run (a new provider identity, spec §3.6):
    /// returns the containers whose `MESOS_AGENT_ID` is now stale, each logged as a
    /// warning. They are not restarted, as in Mesos (whose re-launch is answered 202 and
    /// keeps the old environment): a node ID changing under published volumes is worse
    /// than a stale variable. They get the new ID when they are next launched.
    pub fn agent_id_changed(&self, new: &str) -> Vec<String> {
        let Some(old) = self.agent_id.as_deref().filter(|old| *old != new) else {
            return Vec::new();
        };
        self.containers
            .iter()
            .filter(|c| c.services.contains(&Service::Node))
            .map(|c| {
                tracing::warn!(container = %c.id, old_agent_id = old, new_agent_id = new, "the agent ID changed; the node plugin keeps its MESOS_AGENT_ID until it is next launched (not restarted, as in Mesos)");
                c.id.clone()
            })
            .collect()
    }

    fn entry(&self, service: Service) -> Result<&ContainerEntry, SupervisorError> {
        self.spec
            .container_for(service)
            .and_then(|i| self.containers.get(i))
            .ok_or(SupervisorError::NoService(service))
    }

    /// The (stable) endpoint of the container serving `service`. The same path is used
    /// across plugin restarts, so a `CsiClient` made from it stays valid.
    ///
    /// # Errors
    /// [`SupervisorError::NoService`] if no container serves `service`.
    pub fn endpoint(&self, service: Service) -> Result<CsiEndpoint, SupervisorError> {
        let e = self.entry(service)?;
        CsiEndpoint::from_path(&e.socket).map_err(|err| SupervisorError::Io {
            action: "using socket path",
            path: e.socket.clone(),
            source: io::Error::other(err),
        })
    }

    /// The current state of the container serving `service`.
    ///
    /// # Errors
    /// [`SupervisorError::NoService`] if no container serves `service`.
    pub fn state(&self, service: Service) -> Result<ContainerState, SupervisorError> {
        Ok(self.entry(service)?.state.borrow().clone())
    }

    /// A receiver of state changes of the container serving `service`.
    ///
    /// # Errors
    /// [`SupervisorError::NoService`] if no container serves `service`.
    pub fn watch(
        &self,
        service: Service,
    ) -> Result<watch::Receiver<ContainerState>, SupervisorError> {
        Ok(self.entry(service)?.state.clone())
    }

    /// The status of the endpoint of the container serving `service`, as managed CSI
    /// clients wait on it (up while the container is ready).
    ///
    /// # Errors
    /// [`SupervisorError::NoService`] if no container serves `service`.
    pub fn readiness(&self, service: Service) -> Result<EndpointReadiness, SupervisorError> {
        Ok(EndpointReadiness::new(
            self.entry(service)?.endpoint.clone(),
        ))
    }

    /// A managed CSI client of the container serving `service`: each attempt waits
    /// (within its deadline) while the container is not ready, e.g. across a restart,
    /// as Mesos's calls wait for the service endpoint.
    ///
    /// # Errors
    /// [`SupervisorError::NoService`], or [`SupervisorError::Client`] if the client
    /// cannot be made.
    pub fn client(
        &self,
        service: Service,
        config: ClientConfig,
        metrics: CsiMetrics,
    ) -> Result<CsiClient, SupervisorError> {
        let entry = self.entry(service)?;
        CsiClient::managed(
            self.endpoint(service)?,
            self.readiness(service)?,
            config,
            metrics,
        )
        .map_err(|source| SupervisorError::Client {
            container: entry.id.clone(),
            source,
        })
    }

    /// Managed clients of the plugin's services (spec §4.1.1): controller calls go to
    /// the container serving `CONTROLLER_SERVICE`, node calls to the one serving
    /// `NODE_SERVICE`; one client is shared if one container serves both. A plugin
    /// without a controller container gets [`CsiServices::node_only`].
    ///
    /// # Errors
    /// As [`SupervisorHandle::client`].
    pub fn services(
        &self,
        config: ClientConfig,
        metrics: CsiMetrics,
    ) -> Result<CsiServices, SupervisorError> {
        let node = self.client(Service::Node, config.clone(), metrics.clone())?;
        let controller = match (
            self.spec.container_for(Service::Controller),
            self.spec.container_for(Service::Node),
        ) {
            (None, _) => return Ok(CsiServices::node_only(node)),
            (Some(c), Some(n)) if c == n => node.clone(),
            (Some(_), _) => self.client(Service::Controller, config, metrics)?,
        };
        Ok(CsiServices::new(controller, node))
    }

    /// Ids and services of all containers.
    pub fn containers(&self) -> Vec<(String, Vec<Service>)> {
        self.containers
            .iter()
            .map(|c| (c.id.clone(), c.services.clone()))
            .collect()
    }

    /// Waits until the container serving `service` is ready, for at most `timeout`.
    ///
    /// # Errors
    /// [`SupervisorError::NotReady`] on timeout, [`SupervisorError::Stopped`] if the
    /// supervisor stopped, [`SupervisorError::NoService`] if nothing serves `service`.
    pub async fn wait_ready(
        &self,
        service: Service,
        timeout: Duration,
    ) -> Result<CsiEndpoint, SupervisorError> {
        let entry = self.entry(service)?;
        let mut rx = entry.state.clone();
        let wait = rx.wait_for(|s| {
            matches!(
                s,
                ContainerState::Ready { .. }
                    | ContainerState::Stopped
                    | ContainerState::Failed { .. }
            )
        });
        match tokio::time::timeout(timeout, wait).await {
            Ok(Ok(s)) if matches!(*s, ContainerState::Ready { .. }) => self.endpoint(service),
            Ok(Ok(s)) if matches!(*s, ContainerState::Failed { .. }) => {
                let ContainerState::Failed { reason } = &*s else {
                    unreachable!("matched above")
                };
                Err(SupervisorError::Failed {
                    container: entry.id.clone(),
                    reason: reason.clone(),
                })
            }
            Ok(Ok(_) | Err(_)) => Err(SupervisorError::Stopped {
                container: entry.id.clone(),
            }),
            Err(_) => Err(SupervisorError::NotReady {
                container: entry.id.clone(),
                after: timeout,
                state: entry.state.borrow().clone(),
            }),
        }
    }

    /// Stops every plugin (SIGTERM, SIGKILL after the grace period) and waits for it.
    pub async fn shutdown(mut self) {
        self.cancel.cancel();
        join(&mut self.tasks).await;
    }

    /// Stops supervising but leaves the plugins running, with their pid records, for the
    /// next slrp process to adopt.
    pub async fn detach(mut self) {
        self.detach.cancel();
        join(&mut self.tasks).await;
    }
}

async fn join(tasks: &mut Vec<JoinHandle<()>>) {
    for t in tasks.drain(..) {
        if let Err(e) = t.await
            && e.is_panic()
        {
            tracing::error!(error = %DisplayChain(&e), "plugin worker panicked");
        }
    }
}

impl Drop for SupervisorHandle {
    fn drop(&mut self) {
        if !self.detach.is_cancelled() {
            self.cancel.cancel();
        }
    }
}

/// Owns one container's process and drives its lifecycle.
struct Worker {
    spec: ContainerSpec,
    dir: PathBuf,
    socket: PathBuf,
    cfg: Arc<SupervisorConfig>,
    readiness: Arc<dyn ReadinessCheck>,
    metrics: SupervisorMetrics,
    state: StatePublisher,
    cancel: CancellationToken,
    detach: CancellationToken,
    adopted: Option<Box<dyn PluginRun>>,
}

enum Phase {
    Cancelled,
    Detached,
    Ended(TerminationCause, String),
}

impl Worker {
    async fn run(mut self) {
        let mut jitter = JitterRng::new(self.cfg.restart_jitter);
        let mut failures: u32 = 0;
        let mut launches: u32 = 0;
        loop {
            let mut proc = match self.adopted.take() {
                Some(p) => p,
                None => {
                    if launches > 0 {
                        self.metrics.restarted(&self.spec.id);
                    }
                    launches = launches.saturating_add(1);
                    match self.launch().await {
                        Ok(p) => {
                            if p.is_adopted() {
                                // The agent answered 202: the container of a previous run.
                                self.metrics.adopted(&self.spec.id);
                            }
                            p
                        }
                        Err(e @ SupervisorError::Refused { .. }) => {
                            // Permanent (Mesos's FailedAuthorization): retrying cannot help,
                            // and the start (or the provider) must fail naming it.
                            let reason = DisplayChain(&e).to_string();
                            tracing::error!(error = %reason, "the agent refused the plugin container; not retrying");
                            self.metrics
                                .terminated(&self.spec.id, TerminationCause::Refused);
                            self.state.send_replace(ContainerState::Failed { reason });
                            return;
                        }
                        Err(e) => {
                            tracing::error!(error = %DisplayChain(&e), "launching plugin failed");
                            self.metrics
                                .terminated(&self.spec.id, TerminationCause::LaunchFailed);
                            failures = failures.saturating_add(1);
                            if self.backoff(failures, &mut jitter).await {
                                continue;
                            }
                            return;
                        }
                    }
                }
            };
            self.state.send_replace(ContainerState::Starting {
                launch: launches.max(1),
            });
            let phase = self.supervise(&mut proc, &mut failures).await;
            match phase {
                Phase::Cancelled => {
                    let (exit, killed) = proc.stop(self.cfg.stop_grace).await;
                    tracing::info!(%exit, killed, "plugin stopped");
                    self.metrics
                        .terminated(&self.spec.id, TerminationCause::Stopped);
                    if exit == ExitInfo::Unconfirmed {
                        // It may still run and listen there: the next start re-attaches
                        // (LAUNCH 202) and finds the socket where the plugin made it.
                        tracing::warn!(socket = %self.socket.display(), "keeping the socket directory of a plugin whose end was not confirmed");
                    } else {
                        self.cleanup();
                        remove_endpoint_dir(&self.dir);
                    }
                    self.state.send_replace(ContainerState::Stopped);
                    return;
                }
                Phase::Detached => {
                    tracing::info!(pid = proc.pid(), "leaving plugin running for the next slrp");
                    proc.detach();
                    self.state.send_replace(ContainerState::Stopped);
                    return;
                }
                Phase::Ended(cause, why) => {
                    tracing::warn!(cause = cause.as_str(), %why, stderr_tail = %self.stderr_tail(), "plugin terminated");
                    self.metrics.terminated(&self.spec.id, cause);
                    drop(proc);
                    self.cleanup();
                    failures = failures.saturating_add(1);
                    if !self.backoff(failures, &mut jitter).await {
                        self.state.send_replace(ContainerState::Stopped);
                        return;
                    }
                }
            }
        }
    }

    /// Start-up and health monitoring of one run; resets `failures` after a healthy period.
    async fn supervise(&self, proc: &mut Box<dyn PluginRun>, failures: &mut u32) -> Phase {
        let ready = tokio::select! {
            () = self.cancel.cancelled() => return Phase::Cancelled,
            () = self.detach.cancelled() => return Phase::Detached,
            exit = proc.wait() => {
                return Phase::Ended(TerminationCause::Exited, format!("exited during start-up: {exit}"));
            }
            r = self.wait_ready() => r,
        };
        if let Err(why) = ready {
            let (exit, _) = proc.stop(self.cfg.stop_grace).await;
            return Phase::Ended(
                TerminationCause::StartTimeout,
                format!("{why} (then {exit})"),
            );
        }
        tracing::info!(
            pid = proc.pid(),
            adopted = proc.is_adopted(),
            "plugin ready"
        );
        self.state
            .send_replace(ContainerState::Ready { pid: proc.pid() });
        self.metrics.set_ready(&self.spec.id, true);
        let ready_at = Instant::now();
        let phase = self.monitor(proc).await;
        self.metrics.set_ready(&self.spec.id, false);
        if ready_at.elapsed() >= self.cfg.healthy_reset {
            *failures = 0;
        }
        phase
    }

    async fn monitor(&self, proc: &mut Box<dyn PluginRun>) -> Phase {
        let period = self.cfg.health_interval;
        let mut tick = tokio::time::interval_at(Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut bad: u32 = 0;
        loop {
            tokio::select! {
                () = self.cancel.cancelled() => return Phase::Cancelled,
                () = self.detach.cancelled() => return Phase::Detached,
                exit = proc.wait() => return Phase::Ended(TerminationCause::Exited, exit.to_string()),
                _ = tick.tick() => {
                    let r = self.check().await;
                    if r == Readiness::Ready {
                        bad = 0;
                        continue;
                    }
                    bad = bad.saturating_add(1);
                    tracing::warn!(result = ?r, consecutive = bad, "health probe failed");
                    if bad >= self.cfg.unhealthy_after {
                        let (exit, killed) = proc.stop(self.cfg.stop_grace).await;
                        return Phase::Ended(
                            TerminationCause::Unhealthy,
                            format!("{bad} failed health probes, last {r:?}; stopped ({exit}, sigkill {killed})"),
                        );
                    }
                }
            }
        }
    }

    async fn check(&self) -> Readiness {
        // A probe may ride on a connection opened before the socket file was removed (by a
        // tmp cleaner): it keeps succeeding while nobody can connect anew.
        if !tokio::fs::try_exists(&self.socket).await.unwrap_or(false) {
            return Readiness::Failed(format!("socket {} no longer exists", self.socket.display()));
        }
        match tokio::time::timeout(self.cfg.probe_timeout, self.readiness.check(&self.socket)).await
        {
            Ok(r) => r,
            Err(_) => Readiness::Failed(format!(
                "probe timed out after {:?}",
                self.cfg.probe_timeout
            )),
        }
    }

    /// Waits for the socket, then probes until ready (spec §4.1.5, plus honouring `ready`).
    async fn wait_ready(&self) -> Result<(), String> {
        let deadline = Instant::now() + self.cfg.socket_timeout;
        while !tokio::fs::try_exists(&self.socket).await.unwrap_or(false) {
            if Instant::now() >= deadline {
                return Err(format!(
                    "timed out waiting for endpoint {} after {:?}",
                    self.socket.display(),
                    self.cfg.socket_timeout
                ));
            }
            tokio::time::sleep(self.cfg.socket_poll).await;
        }
        let deadline = Instant::now() + self.cfg.ready_timeout;
        loop {
            let r = self.check().await;
            if r == Readiness::Ready {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "not ready after {:?}: {r:?}",
                    self.cfg.ready_timeout
                ));
            }
            tokio::time::sleep(self.cfg.ready_probe_interval).await;
        }
    }

    async fn launch(&self) -> Result<Box<dyn PluginRun>, SupervisorError> {
        // Before every launch, not just at start: a tmp cleaner may have removed the
        // directory during a long run, and the plugin could not bind its socket.
        ensure_socket_dir(
            &self.dir,
            &self.socket,
            self.cfg.backend.clears_socket_before_launch(),
        )
        .map_err(io_err("preparing the socket directory of", &self.socket))?;
        let mut env = vec![(
            "CSI_ENDPOINT".to_owned(),
            format!("unix://{}", self.socket.display()),
        )];
        if let Some(agent) = &self.cfg.agent_id
            && self.spec.services.contains(&Service::Node)
        {
            env.push(("MESOS_AGENT_ID".to_owned(), agent.clone()));
        }
        let p = self
            .cfg
            .backend
            .launch(&self.spec, &env, &self.dir, &self.cfg)
            .await?;
        tracing::info!(pid = p.pid(), adopted = p.is_adopted(), socket = %self.socket.display(), "plugin launched");
        Ok(p)
    }

    fn cleanup(&self) {
        let _ = remove_if_exists(&self.dir.join(RECORD));
        let _ = remove_if_exists(&self.socket);
    }

    /// Waits before the next launch; false if cancelled or detached meanwhile.
    async fn backoff(&self, failures: u32, jitter: &mut JitterRng) -> bool {
        let delay = self.cfg.restart_backoff.delay(failures, jitter);
        self.state
            .send_replace(ContainerState::BackingOff { delay, failures });
        tokio::select! {
            () = self.cancel.cancelled() => false,
            () = self.detach.cancelled() => false,
            () = tokio::time::sleep(delay) => true,
        }
    }

    /// The last lines of the plugin's stderr log, as evidence in termination logs.
    fn stderr_tail(&self) -> String {
        const TAIL: usize = 1024;
        let Ok(bytes) = std::fs::read(self.dir.join("stderr.log")) else {
            return String::new();
        };
        let start = bytes.len().saturating_sub(TAIL);
        String::from_utf8_lossy(&bytes[start..]).trim().to_owned()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{SupervisorConfig, SupervisorError};

    #[test]
    fn unusable_settings_are_refused_naming_the_field() {
        assert!(SupervisorConfig::new("/run/slrp").validate().is_ok());
        type Break = fn(&mut SupervisorConfig);
        let cases: [(&str, Break); 8] = [
            ("socket_poll", |c| c.socket_poll = Duration::ZERO),
            ("ready_probe_interval", |c| {
                c.ready_probe_interval = Duration::ZERO
            }),
            ("health_interval", |c| c.health_interval = Duration::ZERO),
            ("adopt_poll", |c| c.adopt_poll = Duration::ZERO),
            ("socket_timeout", |c| c.socket_timeout = Duration::ZERO),
            ("ready_timeout", |c| c.ready_timeout = Duration::ZERO),
            ("probe_timeout", |c| c.probe_timeout = Duration::ZERO),
            ("unhealthy_after", |c| c.unhealthy_after = 0),
        ];
        for (want, break_it) in cases {
            let mut cfg = SupervisorConfig::new("/run/slrp");
            break_it(&mut cfg);
            match cfg.validate() {
                Err(e @ SupervisorError::Config { field, .. }) => {
                    assert_eq!(field, want);
                    assert!(e.to_string().contains(want), "{e}");
                }
                other => panic!("{want}: {other:?}"),
            }
        }
    }
}
