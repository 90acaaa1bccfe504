//! One provider's plugin stack: the supervised plugin, its services as Mesos prepares
//! them, and the volume manager over them (spec §3.3 steps 1–3, §4.1, §4.4, §4.7).
//!
//! # Steps of [`PluginStack::start`]
//! 1. `deployment_for(info.storage.plugin, ..)`: the containers to run (or, for a
//!    plugin given by `endpoints`, the sockets someone else serves), with the command
//!    checks of the supervisor's backend (`StackConfig.supervisor.backend`: local
//!    processes, or the agent's standalone containers).
//! 2. [`Supervisor::start`] under `runtime_dir`: adopts plugins a previous slrp left
//!    running (same configuration) or stops them, launches the others with
//!    `CSI_ENDPOINT=unix://…` (through `/bin/sh -c` when `shell` is true, Mesos's
//!    default). Readiness and health are checked by [`CsiProbe`] counting into
//!    [`ProviderMetrics::health_probes`], never into the provider's RPC metrics.
//! 3. Waits until the node container (and the controller container) is ready.
//! 4. [`prepare_services`] through managed clients counting into
//!    [`ProviderMetrics::csi`]: the version detection (one Probe sequence per
//!    container), `GetPluginCapabilities`, `GetPluginInfo` per service, the controller
//!    and node capabilities, `NodeGetInfo` when needed.
//! 5. The volume manager: mounts under `<work_dir>/csi/<plugin type>/<plugin name>/mounts`
//!    (or `plugin.target_path_root`), the target path rule of the detected version and
//!    `plugin.target_path_exists`, a client that does not retry (the manager does);
//!    then waits for its recovery (spec §4.7).
//! 6. The volume usage and health poller ([`crate::health`]), when
//!    [`StackConfig::health_metrics`] is set and the plugin advertises something it asks:
//!    its own CSI clients, woken by the volume manager's observer ([`MovedNotice`]) when a
//!    volume moves, stopped with the volume manager.
//!
//! Any failure stops what was started (plugins included) and is returned as a
//! [`StackError`] naming the provider and the step.
//!
//! # Shutdown
//! Dropping a [`PluginStack`] without `shutdown` stops the volume manager and the plugins
//! without waiting for either.
//! [`PluginStack::shutdown`] stops the health poller (its calls are dropped: nothing
//! they do is durable) and the volume manager first (running jobs get their
//! grace period), then the plugins ([`StopPlugins::Stop`]) or leaves them running with
//! their pid records for the next slrp to adopt ([`StopPlugins::Leave`]). The `cancel`
//! token given to `start` aborts a start in progress and stops the volume manager; what
//! then happens to the plugins is [`StackConfig::plugins_on_cancel`], so a daemon that
//! leaves its plugins running on shutdown leaves them too when the shutdown comes during
//! a start. A start that fails (not cancelled) always stops them.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use slrp_core::volume::{
    BootId, MountPaths, PathError, RecoveryReport, TargetPath, VolumeError, VolumeManager,
    VolumeManagerConfig, VolumeManagerHandle, read_boot_id,
};
use slrp_csi::{
    AnswerLimits, ClientConfig, CsiClient, CsiEndpoint, CsiError, CsiMetrics, CsiServices,
    DEFAULT_RPC_TIMEOUT, RetryConfig,
};
use slrp_proto::mesos::v1 as mesos;
use slrp_store::Store;
use slrp_supervisor::{
    CsiProbe, PluginDeployment, Service, SpecError, Supervisor, SupervisorConfig, SupervisorError,
    SupervisorHandle, deployment_for,
};
use slrp_types::{DisplayChain, ProviderKey};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::health::{
    HealthConfig, HealthPoller, ManagerVolumes, MovedNotice, Plan, ProviderHealth,
};
use crate::metrics::ProviderMetrics;
use crate::services::{PreparedServices, Services, ServicesError, prepare_services};

/// What a plugin stack is built from.
#[derive(Debug, Clone)]
pub struct StackConfig {
    /// The provider's ResourceProviderInfo (validated; `storage.plugin` is the plugin).
    pub info: mesos::ResourceProviderInfo,
    /// The agent's work directory: volumes are mounted under
    /// `<work_dir>/csi/<plugin type>/<plugin name>/mounts` (spec §6.8).
    pub work_dir: PathBuf,
    /// The supervisor's runtime directory (pid records, logs, endpoint links):
    /// `S/providers/<type>.<name>/plugins`. Replaces `supervisor.runtime_dir`.
    pub runtime_dir: PathBuf,
    /// The provider's store; the volume records go here.
    pub store: Store,
    /// Supervision settings (probe periods, restart backoff, stop grace, agent id).
    pub supervisor: SupervisorConfig,
    /// How long `start` waits for each plugin container to become ready.
    pub ready_timeout: Duration,
    /// Deadline of every CSI call of the provider (Mesos: 1 min).
    pub rpc_timeout: Duration,
    /// The boot id the volume manager compares records with; `None`: read it from
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot_id: Option<BootId>,
    /// How long running volume jobs may take to finish on shutdown.
    pub volume_shutdown_grace: Duration,
    /// What a start aborted by its `cancel` token does with the plugins it launched or
    /// adopted (a failed start always stops them). Default [`StopPlugins::Stop`].
    pub plugins_on_cancel: StopPlugins,
    /// Which CSI calls of the volume manager are retried and how (Mesos's: CreateVolume
    /// and DeleteVolume on `DEADLINE_EXCEEDED`/`UNAVAILABLE`, 10 s doubling to 10 min).
    /// The only retries of the provider's CSI calls: its clients make one attempt each.
    pub volume_retry: RetryConfig,
    /// How much of the plugin's answers its clients accept (`slrp_csi::answer`).
    pub answer_limits: AnswerLimits,
    /// The volume usage and health poller's settings.
    pub health: HealthConfig,
    /// Where the poller records (the provider's cache and counters); `None`: no poller.
    pub health_metrics: Option<ProviderHealth>,
}

impl StackConfig {
    /// Defaults: Mesos's timeouts (1 min socket wait plus 1 min of readiness probes,
    /// 1 min RPC deadline), the supervisor's defaults, the real boot id.
    pub fn new(
        info: mesos::ResourceProviderInfo,
        work_dir: impl Into<PathBuf>,
        runtime_dir: impl Into<PathBuf>,
        store: Store,
    ) -> Self {
        let runtime_dir = runtime_dir.into();
        Self {
            info,
            work_dir: work_dir.into(),
            supervisor: SupervisorConfig::new(runtime_dir.clone()),
            runtime_dir,
            store,
            ready_timeout: Duration::from_secs(120),
            rpc_timeout: DEFAULT_RPC_TIMEOUT,
            boot_id: None,
            volume_shutdown_grace: Duration::from_secs(30),
            plugins_on_cancel: StopPlugins::Stop,
            volume_retry: RetryConfig::default(),
            answer_limits: AnswerLimits::default(),
            health: HealthConfig::default(),
            health_metrics: None,
        }
    }
}

/// What [`PluginStack::shutdown`] does with the plugin processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StopPlugins {
    /// Stop them (SIGTERM, SIGKILL after the grace period).
    #[default]
    Stop,
    /// Leave them running for the next slrp to adopt.
    Leave,
}

/// A step of [`PluginStack::start`], named in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StackStep {
    /// Reading `storage.plugin`.
    PluginConfig,
    /// Starting the supervisor.
    Supervisor,
    /// Waiting for a plugin container to become ready.
    WaitReady,
    /// Making the CSI clients.
    Clients,
    /// `prepareServices`.
    PrepareServices,
    /// Building the volume manager's configuration.
    VolumeConfig,
    /// Starting the volume manager.
    VolumeManager,
    /// The volume manager's recovery.
    Recovery,
}

impl StackStep {
    /// A lower-case description.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PluginConfig => "reading the plugin configuration",
            Self::Supervisor => "starting the plugin supervisor",
            Self::WaitReady => "waiting for the plugin to become ready",
            Self::Clients => "making the CSI clients",
            Self::PrepareServices => "preparing the CSI services",
            Self::VolumeConfig => "configuring the volume manager",
            Self::VolumeManager => "starting the volume manager",
            Self::Recovery => "recovering volumes",
        }
    }
}

impl std::fmt::Display for StackStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a plugin stack could not start.
#[derive(Debug, thiserror::Error)]
pub enum StackError {
    /// A step failed.
    #[error("resource provider {provider}: {step}")]
    Step {
        /// `<type>.<name>` of the provider.
        provider: String,
        /// What was being done.
        step: StackStep,
        /// Why it failed.
        #[source]
        source: StackCause,
    },
    /// `cancel` fired before the stack was up.
    #[error("resource provider {provider}: cancelled while {step}")]
    Cancelled {
        /// `<type>.<name>` of the provider.
        provider: String,
        /// What was being done.
        step: StackStep,
    },
}

impl StackError {
    /// The step that failed or was cancelled.
    pub fn step(&self) -> StackStep {
        match self {
            Self::Step { step, .. } | Self::Cancelled { step, .. } => *step,
        }
    }

    /// What a start that ended with this error does with its plugins.
    fn plugins_after(&self, on_cancel: StopPlugins) -> StopPlugins {
        match self {
            Self::Cancelled { .. } => on_cancel,
            Self::Step { .. } => StopPlugins::Stop,
        }
    }
}

/// The cause of a [`StackError::Step`]: the error of the layer below.
#[derive(Debug, thiserror::Error)]
pub enum StackCause {
    /// `ResourceProviderInfo.storage` is missing.
    #[error("'ResourceProviderInfo.storage' must be set")]
    NoStorage,
    /// The plugin description cannot be run.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// The supervisor failed.
    #[error(transparent)]
    Supervisor(#[from] SupervisorError),
    /// A CSI client could not be made.
    #[error(transparent)]
    Csi(#[from] CsiError),
    /// `prepareServices` failed.
    #[error(transparent)]
    Services(#[from] ServicesError),
    /// The mount root is unusable.
    #[error(transparent)]
    Paths(#[from] PathError),
    /// `CSIPluginInfo.target_path_root` is relative: it would resolve against slrp's
    /// working directory, and CSI requires absolute staging and target paths.
    #[error("'CSIPluginInfo.target_path_root' must be an absolute path, not '{0}'")]
    RelativeTargetPathRoot(String),
    /// The boot id could not be read.
    #[error("reading the boot id")]
    BootId(#[source] std::io::Error),
    /// The volume manager failed.
    #[error(transparent)]
    Volume(#[from] VolumeError),
}

/// Builds the error of a failed `step` of `provider`'s start.
fn failed(provider: &str, step: StackStep) -> impl FnOnce(StackCause) -> StackError + '_ {
    move |source| StackError::Step {
        provider: provider.to_owned(),
        step,
        source,
    }
}

fn cancelled(provider: &str, step: StackStep) -> StackError {
    StackError::Cancelled {
        provider: provider.to_owned(),
        step,
    }
}

/// How the plugin is run: supervised by us, or by someone else.
#[derive(Debug)]
enum Plugin {
    Managed(SupervisorHandle),
    Unmanaged,
}

impl Plugin {
    async fn stop(self, how: StopPlugins) {
        match (self, how) {
            (Self::Managed(s), StopPlugins::Stop) => s.shutdown().await,
            (Self::Managed(s), StopPlugins::Leave) => s.detach().await,
            (Self::Unmanaged, _) => {}
        }
    }
}

/// One provider's running plugin stack; see the module docs.
#[derive(Debug)]
pub struct PluginStack {
    provider: String,
    plugin: Plugin,
    services: CsiServices,
    prepared: PreparedServices,
    recovery: RecoveryReport,
    volumes: VolumeManagerHandle,
    /// Where the volume manager stages and publishes volumes.
    paths: MountPaths,
    /// Stops the volume manager (child of the `cancel` given to `start`).
    volume_cancel: CancellationToken,
    /// The volume manager's end; `None` once awaited.
    volume_task: Option<JoinHandle<Result<(), VolumeError>>>,
    /// The volume health poller (ends with `volume_cancel`); `None` without one.
    health_task: Option<JoinHandle<()>>,
}

impl PluginStack {
    /// Launches (or adopts) the plugin, detects its CSI version, prepares its services as
    /// Mesos does (spec §4.4), spawns the volume manager and waits for its recovery.
    ///
    /// # Errors
    /// [`StackError`] naming the provider and the step; whatever was started is stopped.
    pub async fn start(
        cfg: StackConfig,
        metrics: &ProviderMetrics,
        cancel: CancellationToken,
    ) -> Result<Self, StackError> {
        let provider = ProviderKey::from(&cfg.info).to_string();
        let plugin_info = cfg
            .info
            .storage
            .as_ref()
            .map(|s| s.plugin.clone())
            .ok_or(StackCause::NoStorage)
            .map_err(failed(&provider, StackStep::PluginConfig))?;
        check_target_path_root(&plugin_info).map_err(failed(&provider, StackStep::PluginConfig))?;
        let deployment = deployment_for(&plugin_info, cfg.supervisor.backend.checks())
            .map_err(|e| failed(&provider, StackStep::PluginConfig)(e.into()))?;
        // One attempt per call: the volume manager alone retries (`volume_retry`).
        let client_cfg = ClientConfig::default()
            .rpc_timeout(cfg.rpc_timeout)
            .limits(cfg.answer_limits);

        let (plugin, services) = match deployment {
            PluginDeployment::Managed(spec) => {
                let has_controller = spec.container_for(Service::Controller).is_some();
                let mut sup = cfg.supervisor.clone();
                sup.runtime_dir.clone_from(&cfg.runtime_dir);
                let probe = CsiProbe::new(sup.probe_timeout, metrics.health_probes());
                // Its own token: only `shutdown` decides whether plugins stop or stay.
                let handle = Box::pin(Supervisor::start(
                    spec,
                    sup,
                    probe,
                    metrics.supervisor(),
                    CancellationToken::new(),
                ))
                .await
                .map_err(|e| failed(&provider, StackStep::Supervisor)(e.into()))?;
                let ready = async {
                    handle.wait_ready(Service::Node, cfg.ready_timeout).await?;
                    if has_controller {
                        handle
                            .wait_ready(Service::Controller, cfg.ready_timeout)
                            .await?;
                    }
                    Ok::<_, SupervisorError>(())
                };
                let outcome = match until_cancelled(&cancel, ready).await {
                    Some(Ok(())) => handle
                        .services(client_cfg.clone(), metrics.csi())
                        .map_err(|e| failed(&provider, StackStep::Clients)(e.into())),
                    Some(Err(e)) => Err(failed(&provider, StackStep::WaitReady)(e.into())),
                    None => Err(cancelled(&provider, StackStep::WaitReady)),
                };
                match outcome {
                    Ok(services) => (Plugin::Managed(handle), services),
                    Err(e) => {
                        Plugin::Managed(handle)
                            .stop(e.plugins_after(cfg.plugins_on_cancel))
                            .await;
                        return Err(e);
                    }
                }
            }
            PluginDeployment::Unmanaged { controller, node } => {
                let services = unmanaged_services(controller, node, &client_cfg, metrics)
                    .map_err(|e| failed(&provider, StackStep::Clients)(e.into()))?;
                (Plugin::Unmanaged, services)
            }
        };

        // Boxed, like the supervisor's start: the futures of the layers below are large.
        let part = Box::pin(volume_manager(
            &provider,
            &cfg,
            &plugin_info,
            &services,
            metrics,
            &cancel,
        ));
        match part.await {
            Ok(v) => Ok(Self {
                provider,
                plugin,
                services,
                prepared: v.prepared,
                recovery: v.recovery,
                volumes: v.volumes,
                paths: v.paths,
                volume_cancel: v.cancel,
                volume_task: Some(v.task),
                health_task: v.health_task,
            }),
            Err(e) => {
                plugin.stop(e.plugins_after(cfg.plugins_on_cancel)).await;
                Err(e)
            }
        }
    }

    /// `<type>.<name>` of the provider.
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// The volume manager.
    pub fn volumes(&self) -> &VolumeManagerHandle {
        &self.volumes
    }

    /// Where the volume manager stages and publishes volumes (`target_path_root`, or
    /// the work dir's `csi/<type>/<name>/mounts`).
    pub fn paths(&self) -> &MountPaths {
        &self.paths
    }

    /// What `prepareServices` learnt: capabilities, node id, plugin infos, version.
    pub fn prepared(&self) -> &PreparedServices {
        &self.prepared
    }

    /// The volume manager's recovery at start.
    pub fn recovery(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// Each supervised plugin container's id and a receiver of its state, for the admin
    /// endpoint's plugin health; empty for a plugin slrp does not run.
    pub fn plugin_states(
        &self,
    ) -> Vec<(
        String,
        tokio::sync::watch::Receiver<slrp_supervisor::ContainerState>,
    )> {
        let Plugin::Managed(supervisor) = &self.plugin else {
            return Vec::new();
        };
        supervisor
            .containers()
            .into_iter()
            .filter_map(|(id, services)| {
                let service = *services.first()?;
                supervisor.watch(service).ok().map(|rx| (id, rx))
            })
            .collect()
    }

    /// Waits until a plugin container fails for good (the agent refused to relaunch it:
    /// `ContainerState::Failed`) and returns its id and the reason; pending forever while
    /// none has (and for a plugin slrp does not run). The provider must fail then, as
    /// Mesos's does when a container daemon fails.
    ///
    /// The future holds its own receivers, so it does not borrow the stack.
    pub fn plugin_failed(&self) -> impl Future<Output = (String, String)> + Send + 'static {
        let waits: Vec<_> = self
            .plugin_states()
            .into_iter()
            .map(|(id, mut rx)| {
                Box::pin(async move {
                    let failed = rx
                        .wait_for(|s| matches!(s, slrp_supervisor::ContainerState::Failed { .. }))
                        .await
                        .ok()
                        .map(|s| s.clone());
                    match failed {
                        Some(slrp_supervisor::ContainerState::Failed { reason }) => (id, reason),
                        // The supervisor is gone (stopping): not a failure of its plugin.
                        _ => std::future::pending().await,
                    }
                })
            })
            .collect();
        async move {
            if waits.is_empty() {
                return std::future::pending().await;
            }
            futures_util::future::select_all(waits).await.0
        }
    }

    /// The agent ID changed while the provider runs: the node plugin keeps its
    /// `MESOS_AGENT_ID` (as in Mesos; see [`SupervisorHandle::agent_id_changed`]). Returns
    /// the containers concerned.
    pub fn agent_id_changed(&self, new: &str) -> Vec<String> {
        match &self.plugin {
            Plugin::Managed(supervisor) => supervisor.agent_id_changed(new),
            Plugin::Unmanaged => Vec::new(),
        }
    }

    /// The plugin's routed CSI clients (counting into the provider's metrics).
    pub fn services(&self) -> &CsiServices {
        &self.services
    }

    /// Waits until the volume manager ends by itself (a fatal error; the provider must
    /// fail then), pending forever while it runs. Returns at once once it was awaited.
    ///
    /// # Cancel safety
    /// Cancel safe.
    ///
    /// # Errors
    /// The volume manager's fatal error.
    pub async fn volume_manager_ended(&mut self) -> Result<(), VolumeError> {
        let Some(task) = self.volume_task.as_mut() else {
            return Ok(());
        };
        let res = join_volume_task(task).await;
        self.volume_task = None;
        res
    }

    /// Stops the volume manager, then the plugins ([`StopPlugins::Stop`]) or leaves them
    /// running for the next slrp to adopt ([`StopPlugins::Leave`]).
    pub async fn shutdown(mut self, plugins: StopPlugins) {
        self.volume_cancel.cancel();
        if let Some(task) = self.health_task.take()
            && let Err(e) = task.await
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
        if let Some(task) = self.volume_task.as_mut()
            && let Err(e) = join_volume_task(task).await
        {
            tracing::warn!(provider = %self.provider, error = %DisplayChain(&e), "volume manager ended with an error");
        }
        self.volume_task = None;
        std::mem::replace(&mut self.plugin, Plugin::Unmanaged)
            .stop(plugins)
            .await;
        tracing::info!(provider = %self.provider, ?plugins, "plugin stack stopped");
    }
}

impl Drop for PluginStack {
    /// A stack dropped without [`PluginStack::shutdown`] (its owner's future was dropped)
    /// stops its volume manager too, which would otherwise run on, holding the store,
    /// against plugins the dropped supervisor handle stops.
    fn drop(&mut self) {
        self.volume_cancel.cancel();
    }
}

async fn join_volume_task(
    task: &mut JoinHandle<Result<(), VolumeError>>,
) -> Result<(), VolumeError> {
    match task.await {
        Ok(res) => res,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(VolumeError::Stopped),
    }
}

/// What [`volume_manager`] started.
struct VolumePart {
    paths: MountPaths,
    prepared: PreparedServices,
    recovery: RecoveryReport,
    volumes: VolumeManagerHandle,
    cancel: CancellationToken,
    task: JoinHandle<Result<(), VolumeError>>,
    health_task: Option<JoinHandle<()>>,
}

/// Steps 4 and 5 of the module docs, once the plugin is up and its clients are made.
async fn volume_manager(
    provider: &str,
    cfg: &StackConfig,
    plugin_info: &mesos::CsiPluginInfo,
    services: &CsiServices,
    metrics: &ProviderMetrics,
    cancel: &CancellationToken,
) -> Result<VolumePart, StackError> {
    let plugin_type = plugin_info.r#type.as_str();
    let plugin_name = plugin_info.name.as_deref().unwrap_or("default");
    let prepared = until_cancelled(
        cancel,
        Box::pin(prepare_services(
            plugin_type,
            plugin_name,
            Services::of(services),
        )),
    )
    .await
    .ok_or_else(|| cancelled(provider, StackStep::PrepareServices))?
    .map_err(|e| failed(provider, StackStep::PrepareServices)(e.into()))?;
    tracing::info!(
        provider,
        version = %prepared.version,
        node_id = %prepared.node_id,
        caps = ?prepared.caps,
        "CSI services prepared"
    );

    let paths = match plugin_info.target_path_root.as_deref() {
        Some(root) if !root.is_empty() => Ok(MountPaths::new(root)),
        _ => MountPaths::under_work_dir(&cfg.work_dir, plugin_type, plugin_name),
    }
    .map_err(|e| failed(provider, StackStep::VolumeConfig)(e.into()))?;
    let boot_id = match &cfg.boot_id {
        Some(b) => b.clone(),
        None => read_boot_id()
            .map_err(|e| failed(provider, StackStep::VolumeConfig)(StackCause::BootId(e)))?,
    };
    let target = TargetPath::for_plugin(
        prepared.version,
        plugin_info.target_path_exists.unwrap_or(false),
    );
    let moved = Arc::new(tokio::sync::Notify::new());
    let vm_cfg = VolumeManagerConfig::new(
        paths.clone(),
        prepared.node_id.clone(),
        prepared.caps,
        boot_id,
        target,
    )
    .plugin(plugin_type, plugin_name, prepared.version)
    .shutdown_grace(cfg.volume_shutdown_grace)
    .retry(cfg.volume_retry.clone())
    .observer(Arc::new(MovedNotice {
        inner: Arc::new(metrics.volumes().clone()),
        moved: moved.clone(),
    }));

    let volume_cancel = cancel.child_token();
    let (volumes, guard) = VolumeManager::spawn(
        vm_cfg,
        cfg.store.clone(),
        Arc::new(services.clone()),
        &volume_cancel,
    )
    .map_err(|e| failed(provider, StackStep::VolumeManager)(e.into()))?;
    let mut task = tokio::spawn(guard.join());
    match volumes.ready().await {
        Ok(recovery) => {
            let health_task = spawn_health(
                provider,
                cfg,
                &prepared,
                services,
                &volumes,
                &paths,
                moved,
                &volume_cancel,
            );
            Ok(VolumePart {
                paths,
                prepared,
                recovery,
                volumes,
                cancel: volume_cancel,
                task,
                health_task,
            })
        }
        Err(e) => {
            volume_cancel.cancel();
            let _ = join_volume_task(&mut task).await;
            if cancel.is_cancelled() {
                return Err(cancelled(provider, StackStep::Recovery));
            }
            Err(failed(provider, StackStep::Recovery)(e.into()))
        }
    }
}

/// Spawns the volume health poller (`crate::health`) when the stack has somewhere to
/// record and the plugin advertises something to ask: its own clients (own connections,
/// the poller's deadline, metrics counted nowhere else), stopped by `cancel`.
#[allow(clippy::too_many_arguments)]
fn spawn_health(
    provider: &str,
    cfg: &StackConfig,
    prepared: &PreparedServices,
    services: &CsiServices,
    volumes: &VolumeManagerHandle,
    paths: &MountPaths,
    moved: Arc<tokio::sync::Notify>,
    cancel: &CancellationToken,
) -> Option<JoinHandle<()>> {
    let metrics = cfg.health_metrics.clone()?;
    let plan = Plan::of(&prepared.caps, prepared.version);
    if plan.is_idle() || !cfg.health.enabled {
        tracing::debug!(provider, ?plan, "no volume health poller: nothing to ask");
        return None;
    }
    let client_cfg = ClientConfig::default()
        .version(slrp_csi::VersionSelect::Force(prepared.version))
        .rpc_timeout(cfg.health.timeout)
        .limits(cfg.answer_limits)
        .cancel(cancel.clone());
    let own = |c: &CsiClient| {
        CsiClient::new(
            c.endpoint().clone(),
            client_cfg.clone(),
            CsiMetrics::default(),
        )
    };
    let node = match own(services.node()) {
        Ok(node) => node,
        Err(e) => {
            tracing::warn!(provider, error = %DisplayChain(&e), "no volume health poller: its CSI client cannot be made");
            return None;
        }
    };
    let calls = match services.controller() {
        None => CsiServices::node_only(node),
        Some(c) if c.endpoint() == services.node().endpoint() => {
            CsiServices::new(node.clone(), node)
        }
        Some(c) => match own(c) {
            Ok(controller) => CsiServices::new(controller, node),
            Err(e) => {
                tracing::warn!(provider, error = %DisplayChain(&e), "no volume health poller: its CSI client cannot be made");
                return None;
            }
        },
    };
    tracing::info!(provider, ?plan, interval = ?cfg.health.interval, concurrency = cfg.health.concurrency, "volume health poller started");
    let poller = HealthPoller {
        cfg: cfg.health,
        plan,
        calls,
        source: ManagerVolumes {
            handle: volumes.clone(),
            paths: paths.clone(),
        },
        metrics,
        moved,
    };
    let span = tracing::info_span!(parent: None, "volume_health", provider);
    Some(tokio::spawn(tracing::Instrument::instrument(
        poller.run(cancel.child_token()),
        span,
    )))
}

/// Refuses a relative `target_path_root` before anything is launched (an empty one means
/// unset, as in Mesos's JSON).
fn check_target_path_root(plugin: &mesos::CsiPluginInfo) -> Result<(), StackCause> {
    match plugin.target_path_root.as_deref() {
        Some(root) if !root.is_empty() && !std::path::Path::new(root).is_absolute() => {
            Err(StackCause::RelativeTargetPathRoot(root.to_owned()))
        }
        _ => Ok(()),
    }
}

/// Runs `fut` unless `cancel` fires first (`None` then).
async fn until_cancelled<T>(cancel: &CancellationToken, fut: impl Future<Output = T>) -> Option<T> {
    tokio::select! {
        biased;
        () = cancel.cancelled() => None,
        v = fut => Some(v),
    }
}

/// Clients of a plugin someone else runs (`CSIPluginInfo.endpoints`): sent at once, no
/// readiness to wait for.
fn unmanaged_services(
    controller: Option<CsiEndpoint>,
    node: CsiEndpoint,
    client_cfg: &ClientConfig,
    metrics: &ProviderMetrics,
) -> Result<CsiServices, CsiError> {
    let shared = controller.as_ref().is_some_and(|c| c.path() == node.path());
    let node = CsiClient::new(node, client_cfg.clone(), metrics.csi())?;
    Ok(match controller {
        None => CsiServices::node_only(node),
        Some(_) if shared => CsiServices::new(node.clone(), node),
        Some(c) => CsiServices::new(CsiClient::new(c, client_cfg.clone(), metrics.csi())?, node),
    })
}
