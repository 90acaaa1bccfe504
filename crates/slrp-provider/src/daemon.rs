//! The daemon: every configured provider, the shared profile adaptor and the admin endpoint
//! in one process (`slrp run`).
//!
//! # Start
//!
//! 1. Every provider's work directory is checked for Mesos checkpoints
//!    ([`crate::workdir`]) and its store opened (`S/providers/<type>.<name>/store`), all
//!    before anything runs: a refused work directory or an unreadable store stops the
//!    daemon with an error naming the provider and the path.
//! 2. The metrics registry is built (one [`MetricsFamilies`] holding each provider's
//!    [`ProviderMetrics`] and agent client counters under a `provider` label, and the
//!    profile adaptor's), the profile adaptor is
//!    spawned if configured (one per daemon, shared by the providers), and the admin
//!    socket bound. `/ready` answers from here on, naming each provider's step.
//! 3. The agent id is learnt with GET_AGENT (`slrp_agent::operator::get_agent_id`),
//!    retried with backoff until the agent answers with one: a Mesos agent has none until
//!    it registers with a master, and it creates its resource provider manager only then
//!    (spec §2.1), so there is nothing to subscribe to before. It is learnt before the
//!    plugins start because Mesos gives node plugins `MESOS_AGENT_ID`.
//! 4. Each provider then starts on its own: its [`PluginStack`] (plugin, services,
//!    volume manager and its recovery), then the provider worker ([`Provider::spawn`]),
//!    which recovers the provider state of that agent id and subscribes.
//!
//! # Failures
//!
//! Providers are independent, as in a Mesos agent: a provider whose stack cannot start,
//! whose worker fails fatally (a checkpoint write, spec conventions "fatal means fatal") or
//! whose volume manager ends, is stopped (its plugins too) and reported as `FAILED` by
//! `/ready` and in the log; the others keep running. [`run`] returns an error when every
//! provider has failed, so the process exits non-zero and a service manager restarts it;
//! recovery on the next start picks up from the durable state.
//!
//! # Shutdown order (conventions §4.5 rule 3)
//!
//! When `shutdown` fires:
//! 1. each provider worker is cancelled: it stops taking events from the agent and its
//!    agent stream is closed (its state is already durable: nothing to flush);
//! 2. each volume manager is stopped (running CSI jobs get their grace; their intents are
//!    checkpointed and idempotent, so an interrupted one resumes on the next start);
//! 3. the plugins are stopped (SIGTERM, then SIGKILL) or left running for the next slrp
//!    to adopt, as [`crate::config::PluginsOnExit`] says — also when the shutdown comes
//!    while a plugin stack is still starting;
//! 4. the profile adaptor stops and the admin socket is removed.
//!
//! The providers shut down in parallel; the whole is bounded by
//! [`DaemonConfig::shutdown_grace`], after which what is left is abandoned with a warning
//! (a second signal to `slrp run` forces that at once).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use prometheus_client::registry::Registry;
use slrp_agent::AgentConfig;
use slrp_core::provider::lifecycle::Lifecycle;
use slrp_core::provider::operations::{StatusRetry, TrackedOperation};

use crate::persist::load_operations;
use slrp_core::provider::state::StateError;
use slrp_core::volume::{MountPaths, VolumeManagerHandle};
use slrp_profiles::ProviderKey;
use slrp_store::Store;
use slrp_supervisor::ContainerState;
use slrp_types::{Backoff, DisplayChain, Jitter, JitterRng};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::admin::api::{PluginHealth, ProfileSummary};
use crate::admin::{
    AdminError, AdminListener, AdminProvider, AdminState, AdminTcpListener, BoxFuture, DaemonExtras,
};
use crate::config::{AdminListen, DaemonConfig, ProviderConfig};
use crate::import::MesosImport;
use crate::metrics::{MetricsFamilies, ProviderMetrics};
use crate::stack::{PluginStack, StackConfig, StackError, StopPlugins};
use crate::workdir::{WorkDirError, check_work_dir};
use crate::worker::{Provider, ProviderDeps, ProviderError, ProviderParams, ProviderStatus};

/// Waits between GET_AGENT attempts: the agent may take minutes to register.
const AGENT_ID_BACKOFF: Backoff = Backoff::PLUGIN_RESTART;

/// Why the daemon could not start, or stopped on its own.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The state directory cannot be created.
    #[error("creating the state directory {path}")]
    StateDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A provider's work directory holds Mesos checkpoints.
    #[error("resource provider {provider}: refusing the work directory")]
    WorkDir {
        /// `<type>.<name>`.
        provider: String,
        /// What was found.
        #[source]
        source: WorkDirError,
    },
    /// A provider's store cannot be opened (unreadable, corrupt, or another daemon holds
    /// it).
    #[error("resource provider {provider}: opening its state in {path}")]
    Store {
        /// `<type>.<name>`.
        provider: String,
        /// The store directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: slrp_store::StoreError,
    },
    /// The admin endpoint cannot listen.
    #[error("the admin endpoint")]
    Admin(#[source] AdminError),
    /// Every provider failed; each failure was logged when it happened.
    #[error("every resource provider failed ({failed}); see the log for each cause")]
    AllProvidersFailed {
        /// `<type>.<name>` of the providers, comma-separated.
        failed: String,
    },
}

impl DaemonError {
    /// Whether the error is in the configuration or the state on disk (the operator must
    /// act), as opposed to a failure while running.
    pub fn is_config(&self) -> bool {
        match self {
            Self::StateDir { .. } | Self::WorkDir { .. } | Self::Store { .. } | Self::Admin(_) => {
                true
            }
            Self::AllProvidersFailed { .. } => false,
        }
    }
}

/// Why one provider stopped on its own.
#[derive(Debug, thiserror::Error)]
enum ProviderRunError {
    #[error("the plugin stack did not start")]
    Stack(#[source] StackError),
    #[error("the agent operator API client for the plugin containers")]
    PluginBackend(#[source] slrp_agent::OperatorError),
    #[error("plugin container {container} failed and is not restarted: {reason}")]
    PluginFailed { container: String, reason: String },
    #[error("the provider worker did not start")]
    Spawn(#[source] ProviderError),
    #[error("the provider worker failed")]
    Worker(#[source] ProviderError),
    #[error("the provider worker stopped without being asked to")]
    WorkerStopped,
    #[error("the volume manager ended")]
    Volumes(#[source] slrp_core::volume::VolumeError),
    #[error("the volume manager ended without an error while the provider ran")]
    VolumesStopped,
}

/// Where a provider is, for `/ready`.
#[derive(Debug, Clone)]
enum Phase {
    /// Waiting for the agent id.
    WaitingForAgent,
    /// Starting the plugin stack.
    StartingPlugin,
    /// The worker runs; its status says where the lifecycle is. The volume manager
    /// serves the admin API's volume routes.
    Running(Box<Running>),
    /// Stopped on its own, with the cause chain.
    Failed(String),
    /// Shutting down.
    Stopping,
}

/// What the admin endpoint reads of a running provider.
#[derive(Debug, Clone)]
struct Running {
    status: watch::Receiver<ProviderStatus>,
    volumes: VolumeManagerHandle,
    paths: MountPaths,
    csi_version: &'static str,
    /// Each supervised plugin container and its state.
    containers: Vec<(String, watch::Receiver<ContainerState>)>,
    /// Asks the worker for a reconciliation.
    reconciler: crate::worker::Reconciler,
}

/// One provider as the admin endpoint sees it.
#[derive(Debug)]
struct Slot {
    key: String,
    /// `<type>.<name>` of the provider's CSI plugin.
    plugin: String,
    /// How the profile adaptor selects profiles for this provider.
    profile_key: ProviderKey,
    profiles: Option<slrp_profiles::ProfileAdaptorHandle>,
    /// The provider's store: its operation records are read from it (safe while the
    /// worker writes), so the admin routes never wait on the worker's loop.
    store: Store,
    metrics: ProviderMetrics,
    /// The volume health poller's cache and counters (filled while the stack runs).
    health: crate::health::ProviderHealth,
    phase: Mutex<Phase>,
}

impl Slot {
    fn set(&self, phase: Phase) {
        *self
            .phase
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = phase;
    }

    fn phase(&self) -> Phase {
        self.phase
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn running(&self) -> Option<Box<Running>> {
        match self.phase() {
            Phase::Running(running) => Some(running),
            Phase::WaitingForAgent | Phase::StartingPlugin | Phase::Failed(_) | Phase::Stopping => {
                None
            }
        }
    }

    fn status(&self) -> Option<ProviderStatus> {
        self.running().map(|r| r.status.borrow().clone())
    }
}

impl AdminProvider for Slot {
    fn key(&self) -> String {
        self.key.clone()
    }

    fn state(&self) -> String {
        match self.phase() {
            Phase::WaitingForAgent => "WAITING_FOR_AGENT".to_owned(),
            Phase::StartingPlugin => "STARTING_PLUGIN".to_owned(),
            Phase::Running(running) => running.status.borrow().lifecycle.as_str().to_owned(),
            Phase::Failed(_) => "FAILED".to_owned(),
            Phase::Stopping => "STOPPING".to_owned(),
        }
    }

    fn is_ready(&self) -> bool {
        self.running()
            .is_some_and(|r| r.status.borrow().lifecycle == Lifecycle::Ready)
    }

    fn snapshot(&self) -> BTreeMap<String, f64> {
        self.metrics.snapshot()
    }

    fn error(&self) -> Option<String> {
        match self.phase() {
            Phase::Failed(error) => Some(error),
            Phase::Running(running) => running.status.borrow().last_error.clone(),
            Phase::WaitingForAgent | Phase::StartingPlugin | Phase::Stopping => None,
        }
    }

    fn volumes(&self) -> Option<VolumeManagerHandle> {
        self.running().map(|r| r.volumes)
    }

    fn mount_paths(&self) -> Option<MountPaths> {
        self.running().map(|r| r.paths)
    }

    fn agent_id(&self) -> Option<String> {
        self.status().map(|s| s.agent_id)
    }

    fn provider_id(&self) -> Option<String> {
        self.status().and_then(|s| s.provider_id)
    }

    fn total(&self) -> Vec<slrp_proto::mesos::v1::Resource> {
        self.running()
            .map(|r| r.status.borrow().total.to_vec())
            .unwrap_or_default()
    }

    fn operation_counts(&self) -> (usize, usize) {
        self.running().map_or((0, 0), |r| {
            let s = r.status.borrow();
            (s.operations, s.unacknowledged)
        })
    }

    fn operations(&self) -> BoxFuture<'_, Result<Vec<TrackedOperation>, StateError>> {
        Box::pin(async move {
            match self.agent_id() {
                Some(agent_id) => load_operations(&self.store, &agent_id).await,
                None => Ok(Vec::new()),
            }
        })
    }

    fn profiles(&self) -> BoxFuture<'_, Vec<ProfileSummary>> {
        Box::pin(async move {
            let Some(handle) = &self.profiles else {
                return Vec::new();
            };
            match handle.status().await {
                Ok(status) => profile_summaries(&status, &self.profile_key),
                Err(slrp_profiles::AdaptorStopped) => Vec::new(),
            }
        })
    }

    fn volume_error(&self, id: &slrp_csi::VolumeId) -> Option<String> {
        self.metrics.volumes().last_error(id.as_str())
    }

    fn create_retry(&self, name: &str) -> Option<crate::metrics::CreateRetry> {
        self.metrics.volumes().create_retry(name)
    }

    fn wait_disk(
        &self,
        volume_id: &str,
        present: bool,
        within: std::time::Duration,
    ) -> BoxFuture<'_, bool> {
        let volume_id = volume_id.to_owned();
        Box::pin(async move {
            let Some(running) = self.running() else {
                return false;
            };
            let mut status = running.status.clone();
            let shown = |s: &ProviderStatus| {
                s.total
                    .iter()
                    .any(|r| crate::admin::source_id(r) == Some(volume_id.as_str()))
                    == present
            };
            tokio::time::timeout(within, status.wait_for(shown))
                .await
                .is_ok_and(|r| r.is_ok())
        })
    }

    fn volume_health(&self, id: &slrp_csi::VolumeId) -> Option<crate::health::VolumeHealth> {
        self.health.cache().get(id)
    }

    fn profile_info(&self, name: &str) -> BoxFuture<'_, Option<slrp_types::ProfileInfo>> {
        let name = name.to_owned();
        Box::pin(async move {
            let handle = self.profiles.as_ref()?;
            handle.translate(&name, &self.profile_key).await.ok()
        })
    }

    fn wait_total(
        &self,
        holds: crate::admin::TotalCheck,
        within: std::time::Duration,
    ) -> BoxFuture<'_, bool> {
        Box::pin(async move {
            let Some(running) = self.running() else {
                return false;
            };
            let mut status = running.status.clone();
            tokio::time::timeout(within, status.wait_for(|s| holds(&s.total)))
                .await
                .is_ok_and(|r| r.is_ok())
        })
    }

    fn request_reconciliation(&self) {
        if let Some(running) = self.running() {
            running.reconciler.request();
        }
    }

    fn refresh_metrics(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.metrics
                .volumes()
                .refresh(self.volumes().as_ref())
                .await;
        })
    }

    fn plugins(&self) -> Vec<PluginHealth> {
        let supervisor = self.metrics.supervisor();
        match self.phase() {
            Phase::Running(running) if running.containers.is_empty() => vec![PluginHealth {
                provider: self.key.clone(),
                plugin: self.plugin.clone(),
                csi_version: Some(running.csi_version.to_owned()),
                healthy: true,
                restarts: 0,
                error: None,
                container: None,
            }],
            Phase::Running(running) => running
                .containers
                .iter()
                .map(|(container, state)| PluginHealth {
                    provider: self.key.clone(),
                    plugin: self.plugin.clone(),
                    csi_version: Some(running.csi_version.to_owned()),
                    healthy: matches!(*state.borrow(), ContainerState::Ready { .. }),
                    restarts: supervisor.restarts(container),
                    error: None,
                    container: Some(container.clone()),
                })
                .collect(),
            phase @ (Phase::WaitingForAgent
            | Phase::StartingPlugin
            | Phase::Failed(_)
            | Phase::Stopping) => vec![PluginHealth {
                provider: self.key.clone(),
                plugin: self.plugin.clone(),
                csi_version: None,
                healthy: false,
                restarts: 0,
                error: match phase {
                    Phase::Failed(error) => Some(error),
                    _ => None,
                },
                container: None,
            }],
        }
    }
}

/// The active profiles of `status` that apply to the provider `key`.
fn profile_summaries(
    status: &slrp_profiles::StatusSnapshot,
    key: &ProviderKey,
) -> Vec<ProfileSummary> {
    status
        .profiles
        .iter()
        .filter(|(_, p)| {
            p.active
                && slrp_profiles::Manifest {
                    selector: p.selector.clone(),
                    info: p.info.clone(),
                }
                .applies_to(key)
        })
        .map(|(name, p)| {
            let capability = slrp_csi::VolumeCapability::from_mesos(&p.info.capability).ok();
            let (kind, fs_type) = match capability.map(|c| c.access_type) {
                Some(slrp_csi::AccessType::Block) => ("block", None),
                Some(slrp_csi::AccessType::Mount { fs_type, .. }) => {
                    ("mount", Some(fs_type).filter(|f| !f.is_empty()))
                }
                None => ("unknown", None),
            };
            ProfileSummary {
                name: name.clone(),
                r#type: kind.to_owned(),
                fs_type,
                parameters: p.info.parameters.clone(),
            }
        })
        .collect()
}

/// What one provider's task needs.
struct ProviderRun {
    config: ProviderConfig,
    slot: Arc<Slot>,
    store: Store,
    work_dir: PathBuf,
    runtime_dir: PathBuf,
    agent: AgentConfig,
    agent_metrics: slrp_agent::Metrics,
    profiles: Option<slrp_profiles::ProfileAdaptorHandle>,
    plugins_on_exit: StopPlugins,
    plugin_backend: crate::config::PluginBackend,
    remove_sandboxes: crate::config::RemoveSandboxes,
    plugin_ready_timeout: Option<std::time::Duration>,
    csi_retry: Backoff,
    status_update_retry: Backoff,
    csi_limits: slrp_csi::AnswerLimits,
    volume_health: crate::health::HealthConfig,
}

/// Runs every provider until `shutdown` fires or every provider has failed; see the module
/// docs for the start, the failure policy and the shutdown order.
///
/// # Errors
/// [`DaemonError`]: a configuration or state problem found at start ([`DaemonError::is_config`]),
/// or [`DaemonError::AllProvidersFailed`].
pub async fn run(config: DaemonConfig, shutdown: CancellationToken) -> Result<(), DaemonError> {
    run_with(config, DaemonExtras::default(), shutdown).await
}

/// [`run`] with the admin endpoint's extras: `slrp standalone` passes its mode and the
/// embedded manager's actions.
///
/// # Errors
/// As [`run`].
pub async fn run_with(
    config: DaemonConfig,
    extras: DaemonExtras,
    shutdown: CancellationToken,
) -> Result<(), DaemonError> {
    prepare_dirs(&config)?;
    let stores = open_stores(&config).await?;
    check_work_dirs(&config, &stores).await?;
    let mut registry = Registry::default();
    // One set of families for all providers, each series labelled with its provider:
    // a family registered per provider would repeat its `# TYPE` line, which
    // Prometheus rejects.
    let families = MetricsFamilies::default();
    families.register(&mut registry);
    let health = crate::health::HealthMetrics::default();
    health.register(&mut registry);
    let services = CancellationToken::new();
    let mut background = JoinSet::new();
    let profiles = start_profiles(&config, &mut registry, &services, &mut background);
    let slots = provider_slots(&config, &stores, &families, &health, profiles.as_ref());
    start_admin(
        &config,
        &slots,
        registry,
        extras,
        &services,
        &mut background,
    )
    .await?;

    let stop = CancellationToken::new();
    let agent_id = tokio::select! {
        () = shutdown.cancelled() => None,
        id = learn_agent_id(&config.agent) => Some(id),
    };
    let mut providers = JoinSet::new();
    if let Some(agent_id) = agent_id {
        for ((provider, slot), store) in config.providers.iter().zip(&slots).zip(stores) {
            let run = ProviderRun {
                config: provider.clone(),
                slot: slot.clone(),
                store,
                work_dir: config.work_dir.clone(),
                runtime_dir: config.provider_dir(provider).join("plugins"),
                agent: config.agent.clone(),
                agent_metrics: slot.metrics.agent(),
                profiles: profiles.clone(),
                plugins_on_exit: config.plugins_on_exit,
                plugin_backend: config.plugin_backend,
                remove_sandboxes: config.remove_sandboxes,
                plugin_ready_timeout: config.plugin_ready_timeout,
                csi_retry: config.csi_retry,
                status_update_retry: config.status_update_retry,
                csi_limits: config.csi_limits,
                volume_health: config.volume_health,
            };
            let span = tracing::info_span!(parent: None, "provider", provider = %slot.key);
            providers.spawn(run_provider(run, agent_id.clone(), stop.clone()).instrument(span));
        }
    }

    let outcome = supervise_providers(&mut providers, &shutdown).await;
    tracing::info!("shutting down");
    stop.cancel();
    let drain = async {
        while providers.join_next().await.is_some() {}
        services.cancel();
        while background.join_next().await.is_some() {}
    };
    if tokio::time::timeout(config.shutdown_grace, drain)
        .await
        .is_err()
    {
        tracing::warn!(grace = ?config.shutdown_grace, "shutdown did not finish in time; abandoning what is left");
        services.cancel();
    }
    outcome
}

/// The state directory (0700).
// The daemon's error is made at most once, at start: its size costs nothing.
#[allow(clippy::result_large_err)]
fn prepare_dirs(config: &DaemonConfig) -> Result<(), DaemonError> {
    create_private_dir(&config.state_dir).map_err(|source| DaemonError::StateDir {
        path: config.state_dir.clone(),
        source,
    })
}

/// Every provider's work directory, checked against the Mesos checkpoints its store's
/// import markers took over (`slrp import-mesos`).
async fn check_work_dirs(config: &DaemonConfig, stores: &[Store]) -> Result<(), DaemonError> {
    for (provider, store) in config.providers.iter().zip(stores) {
        let imported =
            store
                .load_all::<MesosImport>()
                .await
                .map_err(|source| DaemonError::Store {
                    provider: provider.key(),
                    path: store.path().to_owned(),
                    source,
                })?;
        check_work_dir(&config.work_dir, &provider.info, &imported).map_err(|source| {
            DaemonError::WorkDir {
                provider: provider.key(),
                source,
            }
        })?;
    }
    Ok(())
}

/// Every provider's store, in the order of `config.providers`.
async fn open_stores(config: &DaemonConfig) -> Result<Vec<Store>, DaemonError> {
    let mut stores = Vec::with_capacity(config.providers.len());
    for provider in &config.providers {
        let path = config.provider_dir(provider).join("store");
        let opened = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || Store::open(&path)).await
        };
        let store = match opened {
            Ok(Ok(store)) => store,
            Ok(Err(source)) => {
                return Err(DaemonError::Store {
                    provider: provider.key(),
                    path,
                    source,
                });
            }
            Err(join) => std::panic::resume_unwind(join.into_panic()),
        };
        stores.push(store);
    }
    Ok(stores)
}

/// The profile adaptor, when profiles are configured: its metrics go into `registry`,
/// its task into `background`, and it stops with `services`.
fn start_profiles(
    config: &DaemonConfig,
    registry: &mut Registry,
    services: &CancellationToken,
    background: &mut JoinSet<()>,
) -> Option<slrp_profiles::ProfileAdaptorHandle> {
    config.profiles.clone().map(|profiles| {
        let metrics = slrp_profiles::Metrics::register(registry);
        let (handle, task) = slrp_profiles::spawn(profiles, metrics, services.child_token());
        background.spawn(async move {
            if let Err(e) = task.await {
                tracing::error!(error = %DisplayChain(&e), "the profile adaptor task failed");
            }
        });
        handle
    })
}

/// One slot per provider (what the admin endpoint reads), waiting for the agent.
fn provider_slots(
    config: &DaemonConfig,
    stores: &[Store],
    families: &MetricsFamilies,
    health: &crate::health::HealthMetrics,
    profiles: Option<&slrp_profiles::ProfileAdaptorHandle>,
) -> Vec<Arc<Slot>> {
    config
        .providers
        .iter()
        .zip(stores)
        .map(|(p, store)| {
            let metrics = families.provider(&p.info.r#type, &p.info.name);
            let (plugin_type, plugin_name) = p.plugin();
            Arc::new_cyclic(|slot: &std::sync::Weak<Slot>| Slot {
                health: health.provider(&p.key(), Some(profile_lookup(slot.clone()))),
                key: p.key(),
                plugin: format!("{plugin_type}.{plugin_name}"),
                profile_key: ProviderKey::new(
                    p.info.r#type.clone(),
                    p.info.name.clone(),
                    Some(plugin_type),
                ),
                profiles: profiles.cloned(),
                store: store.clone(),
                metrics,
                phase: Mutex::new(Phase::WaitingForAgent),
            })
        })
        .collect()
}

/// The profile of each volume of the provider in `slot` (volume id → profile), from its
/// resources as last computed: the `profile` label of its `slrp_volume_stats_*` series.
fn profile_lookup(slot: std::sync::Weak<Slot>) -> crate::health::metrics::ProfileLookup {
    Arc::new(move || {
        let Some(running) = slot.upgrade().and_then(|s| s.running()) else {
            return std::collections::HashMap::new();
        };
        let status = running.status.borrow();
        status
            .total
            .iter()
            .filter_map(|r| {
                let source = r.disk.as_ref()?.source.as_ref()?;
                Some((source.id.clone()?, source.profile.clone()?))
            })
            .collect()
    })
}

/// Binds the admin socket (and the TCP listener, if configured) and serves them in
/// `background` until `services` stops.
async fn start_admin(
    config: &DaemonConfig,
    slots: &[Arc<Slot>],
    registry: Registry,
    extras: DaemonExtras,
    services: &CancellationToken,
    background: &mut JoinSet<()>,
) -> Result<(), DaemonError> {
    let AdminListen::Unix(socket) = &config.admin;
    let listener = AdminListener::bind(socket).map_err(DaemonError::Admin)?;
    let tcp = match &config.admin_tcp {
        Some(tcp) => Some({
            for warning in crate::admin::tcp_exposure_warnings(tcp.listen, &tcp.token_file) {
                tracing::warn!("{warning}");
            }
            AdminTcpListener::bind(tcp.listen, tcp.token.clone())
                .await
                .map_err(DaemonError::Admin)?
        }),
        None => None,
    };
    tracing::info!(socket = %listener.path().display(), "admin endpoint listening");
    let views: Vec<Arc<dyn AdminProvider>> = slots
        .iter()
        .map(|slot| Arc::clone(slot) as Arc<dyn AdminProvider>)
        .collect();
    let admin_state = AdminState::with_extras(views, registry, extras);
    if let Some(tcp) = tcp {
        tracing::info!(addr = ?tcp.local_addr().ok(), "admin endpoint listening on TCP (bearer token required)");
        background.spawn(tcp.serve(admin_state.clone(), services.child_token()));
    }
    background.spawn(listener.serve(admin_state, services.child_token()));
    Ok(())
}

/// Waits until `shutdown` fires or every provider has ended: an error naming the failed
/// ones if none is left running and some failed, while the others keep running.
async fn supervise_providers(
    providers: &mut JoinSet<(String, Result<(), ProviderRunError>)>,
    shutdown: &CancellationToken,
) -> Result<(), DaemonError> {
    let mut failed = Vec::new();
    let mut running = providers.len();
    loop {
        if running == 0 {
            return if failed.is_empty() {
                Ok(())
            } else {
                Err(DaemonError::AllProvidersFailed {
                    failed: failed.join(", "),
                })
            };
        }
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            ended = providers.join_next() => {
                running -= 1;
                match ended {
                    Some(Ok((key, Err(e)))) => {
                        tracing::error!(provider = %key, error = %DisplayChain(&e), "resource provider failed; the others keep running");
                        failed.push(key);
                    }
                    Some(Ok((_, Ok(())))) | None => {}
                    Some(Err(join)) => {
                        tracing::error!(error = %DisplayChain(&join), "a resource provider task panicked");
                        failed.push("(panicked)".to_owned());
                    }
                }
            }
        }
    }
}

/// Creates `dir` (and its parents) with mode 0700 for what slrp creates: the state holds
/// plugin pid records and the admin socket.
fn create_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// GET_AGENT until the agent answers with an id; every failure is logged once per attempt.
async fn learn_agent_id(agent: &AgentConfig) -> String {
    let mut jitter = JitterRng::new(Jitter::Full);
    let mut attempt: u32 = 0;
    loop {
        match slrp_agent::operator::get_agent_id(agent).await {
            Ok(id) => {
                tracing::info!(agent_id = %id, "learnt the agent id");
                return id;
            }
            Err(e) => {
                attempt = attempt.saturating_add(1);
                let wait = AGENT_ID_BACKOFF.delay(attempt, &mut jitter);
                // A permanent refusal (wrong token, an invalid id) will not mend itself, but
                // the operator can fix the agent without restarting slrp, so keep asking —
                // loudly, so the log says what to fix instead of looking like a slow start.
                if e.is_transient() {
                    tracing::warn!(error = %DisplayChain(&e), retry_in = ?wait, "the agent id is not available yet");
                } else {
                    tracing::error!(error = %DisplayChain(&e), retry_in = ?wait, "the agent refused to tell its id; fix the agent URL or token (retrying)");
                }
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// One provider from start to stop. Returns its key and why it stopped on its own, if it
/// did; `Ok` when `stop` fired.
async fn run_provider(
    run: ProviderRun,
    agent_id: String,
    stop: CancellationToken,
) -> (String, Result<(), ProviderRunError>) {
    let slot = run.slot.clone();
    let result = run_provider_inner(run, agent_id, stop).await;
    if let Err(e) = &result {
        slot.set(Phase::Failed(DisplayChain(e).to_string()));
    }
    (slot.key.clone(), result)
}

/// Mesos's retry rule for the volume manager's calls (spec §4.3) with the configured
/// bounds.
fn csi_retry_config(bounds: Backoff) -> slrp_csi::RetryConfig {
    let policy = slrp_csi::RetryPolicy::mesos().with_backoff(bounds);
    slrp_csi::RetryConfig::none()
        .with(slrp_csi::CsiRpc::CreateVolume, policy.clone())
        .with(slrp_csi::CsiRpc::DeleteVolume, policy)
}

/// The supervisor backend of `provider`: the agent's standalone containers, or local
/// processes that first retire what the agent backend (or a Mesos provider) left under
/// `<work_dir>/csi/<plugin>/containers`, so a switch of backends leaves one plugin.
fn plugin_backend_of(
    provider: &ProviderConfig,
    agent: &AgentConfig,
    work_dir: &std::path::Path,
    choice: crate::config::PluginBackend,
    remove_sandboxes: crate::config::RemoveSandboxes,
) -> Result<std::sync::Arc<dyn slrp_supervisor::ContainerBackend>, slrp_agent::OperatorError> {
    let mut cfg = slrp_supervisor::AgentBackendConfig::new(
        agent.clone(),
        work_dir,
        &provider.info.r#type,
        &provider.info.name,
    );
    cfg.remove_sandboxes = remove_sandboxes;
    let agent_backend = slrp_supervisor::AgentBackend::new(cfg)?;
    Ok(match choice {
        crate::config::PluginBackend::Agent => std::sync::Arc::new(agent_backend),
        crate::config::PluginBackend::Process => std::sync::Arc::new(
            slrp_supervisor::ProcessBackend::retiring_agent_containers(agent_backend),
        ),
    })
}

async fn run_provider_inner(
    run: ProviderRun,
    agent_id: String,
    stop: CancellationToken,
) -> Result<(), ProviderRunError> {
    let ProviderRun {
        config,
        slot,
        store,
        work_dir,
        runtime_dir,
        agent,
        agent_metrics,
        profiles,
        plugins_on_exit,
        plugin_backend,
        remove_sandboxes,
        plugin_ready_timeout,
        csi_retry,
        status_update_retry,
        csi_limits,
        volume_health,
    } = run;
    slot.set(Phase::StartingPlugin);
    let backend = plugin_backend_of(&config, &agent, &work_dir, plugin_backend, remove_sandboxes)
        .map_err(ProviderRunError::PluginBackend)?;
    let mut stack_config =
        StackConfig::new(config.info.clone(), work_dir, runtime_dir, store.clone());
    stack_config.supervisor.agent_id = Some(agent_id.clone());
    stack_config.supervisor.backend = backend;
    // A shutdown during the start leaves the plugins as a shutdown after it would.
    stack_config.plugins_on_cancel = plugins_on_exit;
    if let Some(timeout) = plugin_ready_timeout {
        stack_config.ready_timeout = timeout;
    }
    stack_config.volume_retry = csi_retry_config(csi_retry);
    stack_config.answer_limits = csi_limits;
    stack_config.health = volume_health;
    stack_config.health_metrics = Some(slot.health.clone());
    // Not a child of `stop`: cancelling it also stops the volume manager, which must
    // outlive the worker on shutdown. `stop` during the start aborts it through this.
    let stack_cancel = CancellationToken::new();
    let start = PluginStack::start(stack_config, &slot.metrics, stack_cancel.clone());
    tokio::pin!(start);
    let started = tokio::select! {
        started = &mut start => started,
        () = stop.cancelled() => {
            stack_cancel.cancel();
            start.await
        }
    };
    let mut stack = match started {
        Ok(stack) => stack,
        Err(StackError::Cancelled { .. }) => return Ok(()),
        Err(e) => {
            return Err(ProviderRunError::Stack(e));
        }
    };
    let mut params = ProviderParams::new(config.info.clone(), agent, agent_id);
    params.mount_paths = Some(stack.paths().clone());
    params.status_retry = StatusRetry {
        min: status_update_retry.base(),
        max: status_update_retry.max(),
        ..StatusRetry::default()
    };
    let deps = ProviderDeps {
        volumes: stack.volumes().clone(),
        store,
        profiles,
        metrics: slot.metrics.clone(),
        agent_metrics,
    };
    // Its own token, not a child of `stop`: the worker must stop before the volume manager.
    let worker_cancel = CancellationToken::new();
    let (handle, mut task) = match Provider::spawn(params, deps, worker_cancel.clone()).await {
        Ok(spawned) => spawned,
        Err(e) => {
            slot.set(Phase::Stopping);
            stack.shutdown(plugins_on_exit).await;
            return Err(ProviderRunError::Spawn(e));
        }
    };
    slot.set(Phase::Running(Box::new(Running {
        status: handle.status(),
        volumes: stack.volumes().clone(),
        paths: stack.paths().clone(),
        csi_version: stack.prepared().version.as_str(),
        containers: stack.plugin_states(),
        reconciler: handle.reconciler(),
    })));
    tracing::info!("resource provider started");
    let mut worker_done = false;
    let mut status = handle.status();
    let mut agent_id = status.borrow().agent_id.clone();
    let plugin_failed = stack.plugin_failed();
    tokio::pin!(plugin_failed);
    let ended = loop {
        tokio::select! {
            () = stop.cancelled() => break None,
            worker = &mut task => {
                worker_done = true;
                break Some(worker.map_or_else(ProviderRunError::Worker, |()| ProviderRunError::WorkerStopped));
            }
            volumes = stack.volume_manager_ended() => {
                break Some(volumes.map_or_else(ProviderRunError::Volumes, |()| ProviderRunError::VolumesStopped));
            }
            (container, reason) = &mut plugin_failed => {
                break Some(ProviderRunError::PluginFailed { container, reason });
            }
            Ok(()) = status.changed() => {
                let now = status.borrow_and_update().agent_id.clone();
                if now != agent_id {
                    // A new identity (spec §3.6); the node plugin is left as Mesos leaves it.
                    stack.agent_id_changed(&now);
                    agent_id = now;
                }
            }
        }
    };
    slot.set(Phase::Stopping);
    worker_cancel.cancel();
    if !worker_done && let Err(e) = task.await {
        tracing::warn!(error = %DisplayChain(&e), "the provider worker ended with an error while stopping");
    }
    stack.shutdown(plugins_on_exit).await;
    tracing::info!(plugins = ?plugins_on_exit, "resource provider stopped");
    ended.map_or(Ok(()), Err)
}
