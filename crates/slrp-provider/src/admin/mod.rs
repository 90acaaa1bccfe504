//! The admin endpoint: HTTP on a unix socket, for operators and probes.
//!
//! # Routes
//!
//! - `GET /health`: 200 while the process runs and serves.
//! - `GET /ready`: 200 when every provider is `READY`, else 503; the JSON body names each
//!   provider and its state (`{"ready": false, "providers": [{"provider": "<type>.<name>",
//!   "state": "SUBSCRIBED", "ready": false, "error": "…"}], "not_ready": ["<type>.<name>"]}`;
//!   `error`, when present, is why the provider failed or the last error it reported).
//! - `GET /metrics`: OpenMetrics text of the daemon's registry.
//! - `GET /metrics/snapshot`: a JSON object of Mesos-style names to numbers (spec §9), the
//!   union of every provider's [`AdminProvider::snapshot`], as a Mesos agent's
//!   `/metrics/snapshot` shows them.
//! - `POST /volumes/unpublish` with `{"provider": "<type>.<name>", "volume_id": "…"}`
//!   (`provider` may be left out when the daemon runs one provider): unpublishes and
//!   unstages a volume without destroying it, so it is not published again after a
//!   reboot until a task needs it (Mesos never unpublishes, spec §12 item 25). 200
//!   `{"volume_id": "…", "state": "NODE_READY"}` (the volume's state afterwards); 400 for
//!   a body that is not such an object; 404 for an unknown provider or volume; 503 while
//!   the provider's volume manager is not running; 409/500/503 with `{"error": "…"}` when
//!   the unpublish fails (conflict, failure, plugin unavailable). The operator makes sure
//!   no task uses the volume: the agent is not asked.
//!
//! The rest of the admin API (status, resources, volumes, operations, profiles, plugins,
//! disks, publish) is specified in `docs/admin-api.md`: the read routes are in
//! `read_routes`, the action routes in `action_routes` (the embedded manager's side of
//! the actions is [`ManagerActions`], in [`manager_actions`]), their bodies in [`api`].
//! Every refusal is an [`api::ErrorBody`] naming the request field that was wrong, when
//! one was.
//!
//! # The socket
//!
//! [`AdminListener::bind`] refuses a socket a live daemon answers on, replaces the stale
//! socket of a dead one, and refuses to delete anything that is not a socket. The socket is
//! bound inside a fresh mode-0700 directory beside the target (so the process umask does
//! not matter and nobody else can reach it while it is still group- or world-accessible),
//! made mode 0600 there, then renamed into place: there is no moment in which others could
//! connect. The umask is not changed for this: it is process-wide, and other threads
//! create files meanwhile. [`AdminListener::serve`] removes the socket when it stops,
//! unless another daemon has replaced it meanwhile.

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use prometheus_client::registry::Registry;
use slrp_core::provider::operations::TrackedOperation;
use slrp_core::provider::state::StateError;
use slrp_core::volume::{MountPaths, VolumeErrorKind, VolumeManagerHandle};
use slrp_csi::VolumeId;
use slrp_proto::mesos::v1::Resource;
use slrp_types::DisplayChain;
use tokio_util::sync::CancellationToken;

use crate::config::AdminToken;

mod action_routes;
pub mod api;
pub mod manager_actions;
mod read_routes;
mod snapshot_routes;

pub(crate) use read_routes::source_id;

pub use manager_actions::{ActionError, BoxFuture, ManagerActions};

/// What the admin endpoint needs to know about one provider. The daemon implements it over
/// the provider's status and metrics; tests implement it with fakes.
pub trait AdminProvider: Send + Sync + 'static {
    /// `<rp type>.<rp name>`.
    fn key(&self) -> String;
    /// The lifecycle state's Mesos name (`READY`, …), or the daemon's step while the
    /// provider is not running yet (`STARTING`, `FAILED`, …).
    fn state(&self) -> String;
    /// Whether the provider is `READY`.
    fn is_ready(&self) -> bool;
    /// Mesos-style metric names to values (`resource_providers/<type>.<name>/…`).
    fn snapshot(&self) -> BTreeMap<String, f64>;
    /// Why the provider failed, or the last error it reported (with its cause chain).
    fn error(&self) -> Option<String> {
        None
    }
    /// The provider's volume manager while its plugin stack runs (`None` before it
    /// started and once it stops): the operator's volume routes go through it.
    fn volumes(&self) -> Option<VolumeManagerHandle> {
        None
    }
    /// Where the volume manager stages and publishes volumes, while it runs.
    fn mount_paths(&self) -> Option<MountPaths> {
        None
    }
    /// The agent id the provider serves, once learnt.
    fn agent_id(&self) -> Option<String> {
        None
    }
    /// The resource provider id, once the manager assigned one.
    fn provider_id(&self) -> Option<String> {
        None
    }
    /// The provider's total resources as last computed (empty before it runs).
    fn total(&self) -> Vec<Resource> {
        Vec::new()
    }
    /// Operations tracked, and those with a status update not yet acknowledged.
    fn operation_counts(&self) -> (usize, usize) {
        (0, 0)
    }
    /// The operations the provider tracks (pending, and terminal until acknowledged), as
    /// last committed.
    fn operations(&self) -> BoxFuture<'_, Result<Vec<TrackedOperation>, StateError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    /// The disk profiles that apply to the provider (the profile adaptor's view).
    fn profiles(&self) -> BoxFuture<'_, Vec<api::ProfileSummary>> {
        Box::pin(async { Vec::new() })
    }
    /// The health of the provider's plugin (one entry per plugin container).
    fn plugins(&self) -> Vec<api::PluginHealth> {
        Vec::new()
    }
    /// The last error of a CSI call on volume `id` that left it in flight, until it
    /// completes a transition.
    fn volume_error(&self, id: &VolumeId) -> Option<String> {
        let _ = id;
        None
    }
    /// Waits, at most `within`, until the provider's total as the admin API shows it
    /// ([`AdminProvider::total`]) holds a disk whose `disk.source.id` is `volume_id`
    /// (`present`) or none (`!present`); returns whether it came to. The answers of the
    /// waited actions use it, so that what an operator reads next shows their effect.
    fn wait_disk(
        &self,
        volume_id: &str,
        present: bool,
        within: std::time::Duration,
    ) -> BoxFuture<'_, bool> {
        let _ = within;
        let holds = self
            .total()
            .iter()
            .any(|r| read_routes::source_id(r) == Some(volume_id))
            == present;
        Box::pin(async move { holds })
    }
    /// What the volume health poller knows of volume `id` (`None`: nothing is asked
    /// about it, or the provider does not run).
    fn volume_health(&self, id: &VolumeId) -> Option<crate::health::VolumeHealth> {
        let _ = id;
        None
    }
    /// The CreateVolume of `name` (the operation uuid of a CREATE_DISK) while it waits
    /// for a retry: its last error and when the next attempt goes out.
    fn create_retry(&self, name: &str) -> Option<crate::metrics::CreateRetry> {
        let _ = name;
        None
    }
    /// Brings the gauges that are read rather than counted (volumes per state, jobs) up
    /// to date; called before every `/metrics` and `/metrics/snapshot` answer.
    fn refresh_metrics(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
    /// The definition of profile `name` as the provider's adaptor translates it (`None`:
    /// no such profile, or no adaptor).
    fn profile_info(&self, name: &str) -> BoxFuture<'_, Option<slrp_types::ProfileInfo>> {
        let _ = name;
        Box::pin(async { None })
    }
    /// Waits, at most `within`, until `holds` is true of the provider's total; returns
    /// whether it came to.
    fn wait_total(&self, holds: TotalCheck, within: std::time::Duration) -> BoxFuture<'_, bool> {
        let _ = within;
        let now = holds(&self.total().iter().collect());
        Box::pin(async move { now })
    }
    /// Asks the provider to reconcile soon: the plugin's volumes changed outside an
    /// operation (a disk was grown), so the resources must follow.
    fn request_reconciliation(&self) {}
}

/// A question about a provider's total ([`AdminProvider::wait_total`]).
pub type TotalCheck = Box<dyn Fn(&slrp_core::provider::resources::Resources) -> bool + Send + Sync>;

/// The size in MB of disk `volume_id` in `total` (0 without one).
pub(crate) fn disk_mb<'a>(total: impl IntoIterator<Item = &'a Resource>, volume_id: &str) -> f64 {
    total
        .into_iter()
        .filter(|r| read_routes::source_id(r) == Some(volume_id))
        .filter_map(|r| r.scalar.map(|s| s.value))
        .fold(0.0, f64::max)
}

/// What the daemon adds to the admin endpoint beyond its providers: how it runs and, in
/// standalone mode, the embedded manager's actions.
#[derive(Clone)]
pub struct DaemonExtras {
    /// How the daemon runs.
    pub mode: api::Mode,
    /// The embedded manager (standalone mode); `None` under `slrp run`.
    pub actions: Option<Arc<dyn ManagerActions>>,
}

impl Default for DaemonExtras {
    /// `slrp run`: no actions.
    fn default() -> Self {
        Self {
            mode: api::Mode::Run,
            actions: None,
        }
    }
}

impl std::fmt::Debug for DaemonExtras {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DaemonExtras")
            .field("mode", &self.mode)
            .field("actions", &self.actions.is_some())
            .finish()
    }
}

/// What the routes read: the providers, the metrics registry and the daemon's extras.
#[derive(Clone)]
pub struct AdminState {
    providers: Arc<Vec<Arc<dyn AdminProvider>>>,
    registry: Arc<Registry>,
    extras: DaemonExtras,
}

impl std::fmt::Debug for AdminState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminState")
            .field(
                "providers",
                &self.providers.iter().map(|p| p.key()).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl AdminState {
    /// The state for these providers and this registry (complete: nothing registers later).
    pub fn new(providers: Vec<Arc<dyn AdminProvider>>, registry: Registry) -> Self {
        Self::with_extras(providers, registry, DaemonExtras::default())
    }

    /// As [`AdminState::new`], with the daemon's mode and actions; the manager's metrics
    /// are registered into `registry` here.
    pub fn with_extras(
        providers: Vec<Arc<dyn AdminProvider>>,
        mut registry: Registry,
        extras: DaemonExtras,
    ) -> Self {
        if let Some(actions) = &extras.actions {
            actions.register_metrics(&mut registry);
        }
        Self {
            providers: Arc::new(providers),
            registry: Arc::new(registry),
            extras,
        }
    }

    /// How the daemon runs, and the embedded manager's actions in standalone mode.
    pub fn extras(&self) -> &DaemonExtras {
        &self.extras
    }

    /// The `/ready` answer: status and JSON body.
    pub fn readiness(&self) -> (StatusCode, serde_json::Value) {
        let mut not_ready = Vec::new();
        let providers: Vec<_> = self
            .providers
            .iter()
            .map(|p| {
                let ready = p.is_ready();
                if !ready {
                    not_ready.push(p.key());
                }
                let mut entry =
                    serde_json::json!({"provider": p.key(), "state": p.state(), "ready": ready});
                if let Some(error) = p.error() {
                    entry["error"] = error.into();
                }
                entry
            })
            .collect();
        let ready = not_ready.is_empty();
        let body = serde_json::json!({
            "ready": ready,
            "providers": providers,
            "not_ready": not_ready,
        });
        let status = if ready {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        (status, body)
    }

    /// Refreshes every provider's read-on-scrape gauges ([`AdminProvider::refresh_metrics`]).
    pub async fn refresh_metrics(&self) {
        for p in self.providers.iter() {
            p.refresh_metrics().await;
        }
    }

    /// The `/metrics/snapshot` object.
    pub fn snapshot(&self) -> BTreeMap<String, f64> {
        let mut all: BTreeMap<String, f64> =
            self.providers.iter().flat_map(|p| p.snapshot()).collect();
        if let Some(actions) = &self.extras.actions {
            all.extend(actions.snapshot());
        }
        all
    }
}

/// The routes over `state`.
pub fn router(state: AdminState) -> axum::Router {
    axum::Router::new()
        .route("/health", get(|| async { "OK\n" }))
        .route("/ready", get(ready))
        .route("/status", get(read_routes::status))
        .route("/resources", get(read_routes::resources))
        .route("/volumes", get(read_routes::volumes))
        .route("/volumes/{id}", get(read_routes::volume))
        .route("/operations", get(read_routes::operations))
        .route("/operations/{uuid}", get(read_routes::operation))
        .route("/profiles", get(read_routes::profiles))
        .route("/plugins", get(read_routes::plugins))
        .route("/metrics", get(metrics))
        .route("/metrics/snapshot", get(snapshot))
        .route("/disks", post(action_routes::create_disk))
        .route("/disks/destroy", post(action_routes::destroy_disk))
        .route("/disks/expand", post(action_routes::expand_disk))
        .route(
            "/snapshots",
            get(snapshot_routes::snapshots).post(snapshot_routes::create_snapshot),
        )
        .route("/snapshots/delete", post(snapshot_routes::delete_snapshot))
        .route("/volumes/publish", post(action_routes::publish))
        .route("/volumes/unpublish", post(action_routes::unpublish))
        .fallback(unknown_route)
        .method_not_allowed_fallback(wrong_method)
        .with_state(state)
}

async fn unknown_route(uri: axum::http::Uri) -> Refusal {
    refusal(StatusCode::NOT_FOUND, format!("no route {}", uri.path()))
}

async fn wrong_method(method: axum::http::Method, uri: axum::http::Uri) -> Refusal {
    refusal(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{method} is not served on {}", uri.path()),
    )
}

async fn ready(State(state): State<AdminState>) -> Response {
    let (status, body) = state.readiness();
    (status, axum::Json(body)).into_response()
}

async fn snapshot(State(state): State<AdminState>) -> Response {
    state.refresh_metrics().await;
    axum::Json(state.snapshot()).into_response()
}

/// A refused or failed admin request: the status and an [`api::ErrorBody`].
#[derive(Debug)]
pub(crate) struct Refusal {
    status: StatusCode,
    body: api::ErrorBody,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body)).into_response()
    }
}

impl From<ActionError> for Refusal {
    fn from(e: ActionError) -> Self {
        Self {
            status: e.status,
            body: e.body,
        }
    }
}

/// A refusal without a field.
pub(crate) fn refusal(status: StatusCode, error: impl Into<String>) -> Refusal {
    Refusal {
        status,
        body: api::ErrorBody {
            error: error.into(),
            field: None,
        },
    }
}

/// A 400 naming the request field that was wrong.
pub(crate) fn bad_field(field: &str, error: impl Into<String>) -> Refusal {
    field_refusal(StatusCode::BAD_REQUEST, field, error)
}

impl AdminState {
    /// The provider a request names, or the only one.
    fn provider(&self, key: Option<&str>) -> Result<&Arc<dyn AdminProvider>, Refusal> {
        match key {
            Some(key) => self
                .providers
                .iter()
                .find(|p| p.key() == key)
                .ok_or_else(|| {
                    field_refusal(
                        StatusCode::NOT_FOUND,
                        "provider",
                        format!("unknown provider '{key}'"),
                    )
                }),
            None => match self.providers.as_slice() {
                [only] => Ok(only),
                all => Err(bad_field(
                    "provider",
                    format!(
                        "'provider' is required with {} providers (one of: {})",
                        all.len(),
                        all.iter().map(|p| p.key()).collect::<Vec<_>>().join(", ")
                    ),
                )),
            },
        }
    }

    /// The running volume manager of `provider`, or 503.
    fn volume_manager(provider: &Arc<dyn AdminProvider>) -> Result<VolumeManagerHandle, Refusal> {
        provider.volumes().ok_or_else(|| {
            refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "provider '{}' has no running volume manager (state {})",
                    provider.key(),
                    provider.state()
                ),
            )
        })
    }
}

/// A refusal naming the request field that was wrong.
pub(crate) fn field_refusal(status: StatusCode, field: &str, error: impl Into<String>) -> Refusal {
    Refusal {
        status,
        body: api::ErrorBody {
            error: error.into(),
            field: Some(field.to_owned()),
        },
    }
}

/// The 404 of a volume no provider tracks.
pub(crate) fn unknown_volume(key: &str, id: &VolumeId) -> Refusal {
    field_refusal(
        StatusCode::NOT_FOUND,
        "volume_id",
        format!("provider '{key}' tracks no volume '{id}'"),
    )
}

/// The volume manager's records, or 503 when it stopped meanwhile.
pub(crate) async fn volume_records(
    volumes: &VolumeManagerHandle,
) -> Result<Vec<slrp_core::volume::VolumeRecord>, Refusal> {
    volumes.volumes().await.map_err(|e| {
        refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            DisplayChain(&e).to_string(),
        )
    })
}

/// The Mesos name of the state of volume `id`, if the volume manager tracks it.
pub(crate) async fn volume_state(
    volumes: &VolumeManagerHandle,
    id: &VolumeId,
) -> Result<Option<&'static str>, Refusal> {
    Ok(volume_records(volumes)
        .await?
        .iter()
        .find(|r| r.id == *id)
        .map(|r| r.state.name().as_str()))
}

/// The HTTP status of a failed volume manager request.
pub(crate) fn volume_error_status(kind: VolumeErrorKind) -> StatusCode {
    match kind {
        VolumeErrorKind::Conflict => StatusCode::CONFLICT,
        VolumeErrorKind::Unavailable | VolumeErrorKind::NotReady | VolumeErrorKind::Stopped => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        VolumeErrorKind::Invalid
        | VolumeErrorKind::PluginMisbehaved
        | VolumeErrorKind::Rejected
        | VolumeErrorKind::Local
        | VolumeErrorKind::Internal
        | VolumeErrorKind::Fatal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

async fn metrics(State(state): State<AdminState>) -> Response {
    state.refresh_metrics().await;
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, &state.registry) {
        Ok(()) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => {
            tracing::error!(error = %e, "encoding the metrics failed");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// Why the admin endpoint cannot listen.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// Another process answers on the socket: a daemon with the same state directory runs.
    #[error(
        "the admin socket {path} is in use: another slrp daemon with this state directory is running"
    )]
    InUse {
        /// The socket.
        path: PathBuf,
    },
    /// Something other than a socket is at the path; slrp does not delete it.
    #[error("the admin socket path {path} exists and is not a socket")]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// The TCP listener cannot be bound.
    #[error("listening on TCP {addr}")]
    BindTcp {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Creating, securing or placing the socket failed.
    #[error("creating the admin socket {path}")]
    Bind {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// A bound admin socket, not yet serving.
#[derive(Debug)]
pub struct AdminListener {
    listener: tokio::net::UnixListener,
    path: PathBuf,
    /// Device and inode of the socket we created, so that stopping removes only ours.
    identity: (u64, u64),
}

impl AdminListener {
    /// Binds the socket at `path` (mode 0600), replacing a stale one.
    ///
    /// # Errors
    /// [`AdminError`]: a live daemon answers there, the path is not a socket, or the
    /// socket cannot be created.
    pub fn bind(path: &Path) -> Result<Self, AdminError> {
        let bind_error = |source| AdminError::Bind {
            path: path.to_owned(),
            source,
        };
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_socket() => {
                match std::os::unix::net::UnixStream::connect(path) {
                    Ok(_) => {
                        return Err(AdminError::InUse {
                            path: path.to_owned(),
                        });
                    }
                    // Nobody listens: the socket of a daemon that died without cleaning up.
                    Err(_) => remove_if_present(path).map_err(bind_error)?,
                }
            }
            Ok(_) => {
                return Err(AdminError::NotASocket {
                    path: path.to_owned(),
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(bind_error(e)),
        }
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        std::fs::create_dir_all(parent).map_err(bind_error)?;
        let (listener, meta) = bind_privately(path, parent, |_| {}).map_err(bind_error)?;
        Ok(Self {
            listener,
            path: path.to_owned(),
            identity: (meta.dev(), meta.ino()),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serves `state` until `cancel` fires, then lets requests in progress finish and
    /// removes the socket (if it is still ours).
    pub async fn serve(self, state: AdminState, cancel: CancellationToken) {
        let Self {
            listener,
            path,
            identity,
        } = self;
        let served = axum::serve(listener, router(state))
            .with_graceful_shutdown(cancel.cancelled_owned())
            .await;
        if let Err(e) = served {
            tracing::error!(error = %DisplayChain(&e), socket = %path.display(), "the admin endpoint failed");
        }
        let ours = std::fs::symlink_metadata(&path).is_ok_and(|m| (m.dev(), m.ino()) == identity);
        if ours && let Err(e) = std::fs::remove_file(&path) {
            tracing::warn!(error = %DisplayChain(&e), socket = %path.display(), "removing the admin socket failed");
        }
    }
}

/// Binds a socket in a fresh 0700 directory in `parent`, makes it 0600 and renames it to
/// `path`; `staged` sees the socket before the rename (tests check where it was made).
/// Returns the listener and the placed socket's metadata.
fn bind_privately(
    path: &Path,
    parent: &Path,
    staged: impl FnOnce(&Path),
) -> std::io::Result<(tokio::net::UnixListener, std::fs::Metadata)> {
    // A random name, created with mode 0700 (mkdtemp): no other user can enter it, so
    // the socket in it is unreachable whatever mode the umask gives it.
    let dir = tempfile::Builder::new()
        .prefix(".slrp-admin-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir_in(parent)?;
    let staging = dir.path().join("admin.sock");
    let listener = tokio::net::UnixListener::bind(&staging)?;
    std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o600))?;
    staged(&staging);
    std::fs::rename(&staging, path)?;
    let meta = std::fs::symlink_metadata(path)?;
    // Dropping `dir` removes the now empty directory; a leftover is harmless, but say so.
    if let Err(e) = dir.close() {
        tracing::warn!(error = %DisplayChain(&e), "removing the admin socket's staging directory failed");
    }
    Ok((listener, meta))
}

/// The admin endpoint's TCP listener, bound, not yet serving. Every request needs
/// `Authorization: Bearer <token>`.
#[derive(Debug)]
pub struct AdminTcpListener {
    listener: tokio::net::TcpListener,
    token: AdminToken,
}

impl AdminTcpListener {
    /// Binds `addr`; requests must carry `token`.
    ///
    /// # Errors
    /// [`AdminError::BindTcp`].
    pub async fn bind(addr: std::net::SocketAddr, token: AdminToken) -> Result<Self, AdminError> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| AdminError::BindTcp { addr, source })?;
        Ok(Self { listener, token })
    }

    /// The address bound (with the port the system chose for port 0).
    ///
    /// # Errors
    /// The socket's error.
    pub fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves `state` until `cancel` fires, then lets requests in progress finish.
    pub async fn serve(self, state: AdminState, cancel: CancellationToken) {
        let addr = self.listener.local_addr().ok();
        let app = router(state).layer(axum::middleware::from_fn_with_state(
            self.token,
            require_token,
        ));
        let served = axum::serve(self.listener, app)
            .with_graceful_shutdown(cancel.cancelled_owned())
            .await;
        if let Err(e) = served {
            tracing::error!(error = %DisplayChain(&e), addr = ?addr, "the admin TCP endpoint failed");
        }
    }
}

/// What is unsafe about serving the admin API on TCP at `listen` with the token in
/// `token_file`, one sentence each (never the token): a token file that its group or
/// others can read (anyone who reads it can act as the operator), and an address that is
/// not loopback (plain HTTP: the token crosses the network in clear). The daemon logs
/// each as a warning at start; it still serves, as configured.
pub fn tcp_exposure_warnings(listen: std::net::SocketAddr, token_file: &Path) -> Vec<String> {
    let mut warnings = Vec::new();
    // It was read moments ago; a file that vanished since is no exposure to warn about.
    if let Ok(meta) = std::fs::metadata(token_file)
        && meta.mode() & 0o077 != 0
    {
        warnings.push(format!(
            "the admin token file {} is open to {} (mode {:04o}): anyone who reads it can use the admin API; chmod 600 it",
            token_file.display(),
            if meta.mode() & 0o007 != 0 {
                "every user"
            } else {
                "its group"
            },
            meta.mode() & 0o7777
        ));
    }
    if !listen.ip().to_canonical().is_loopback() {
        warnings.push(format!(
            "the admin API listens on {listen}, not a loopback address: it is plain HTTP, so the bearer token crosses the network in clear; listen on loopback or put a TLS proxy in front"
        ));
    }
    warnings
}

/// The token of an `Authorization` header value `Bearer <token>` (scheme in any case).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let space = value.iter().position(|b| *b == b' ')?;
    let (scheme, rest) = value.split_at(space);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    Some(rest.trim_ascii())
}

/// Refuses a TCP request without the right bearer token: 401 with
/// `WWW-Authenticate: Bearer`. Neither the expected nor the presented token is logged.
async fn require_token(
    State(token): State<AdminToken>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| bearer(v.as_bytes()));
    let refused = match presented {
        Some(Some(candidate)) if token.matches(candidate) => return next.run(request).await,
        Some(Some(_)) => "the bearer token is wrong",
        Some(None) => "the Authorization header is not 'Bearer <token>'",
        None => "no 'Authorization: Bearer <token>' header",
    };
    tracing::warn!(method = %request.method(), path = %request.uri().path(), reason = refused, "refused an admin request on TCP");
    let mut response = refusal(
        StatusCode::UNAUTHORIZED,
        format!(
            "{refused}: the TCP admin endpoint needs the token of the daemon's 'admin.token_file'"
        ),
    )
    .into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        axum::http::HeaderValue::from_static("Bearer"),
    );
    response
}

fn remove_if_present(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        Ok(()) | Err(_) => Ok(()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_readable_token_file_and_a_non_loopback_address_are_warned_about() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "secret-token-value\n").unwrap();
        let loopback: std::net::SocketAddr = "127.0.0.1:5052".parse().unwrap();
        let set_mode = |mode| {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
        };

        set_mode(0o600);
        assert_eq!(tcp_exposure_warnings(loopback, &file), Vec::<String>::new());
        let v6: std::net::SocketAddr = "[::1]:5052".parse().unwrap();
        assert_eq!(tcp_exposure_warnings(v6, &file), Vec::<String>::new());

        set_mode(0o640);
        let warned = tcp_exposure_warnings(loopback, &file);
        assert_eq!(warned.len(), 1, "{warned:?}");
        assert!(warned[0].contains("its group (mode 0640)"), "{warned:?}");
        assert!(
            warned[0].contains(&file.display().to_string()),
            "{warned:?}"
        );

        set_mode(0o604);
        let any: std::net::SocketAddr = "0.0.0.0:5052".parse().unwrap();
        let warned = tcp_exposure_warnings(any, &file);
        assert_eq!(warned.len(), 2, "{warned:?}");
        assert!(warned[0].contains("every user"), "{warned:?}");
        assert!(warned[1].contains("0.0.0.0:5052"), "{warned:?}");
        assert!(warned[1].contains("in clear"), "{warned:?}");
        assert!(
            warned.iter().all(|w| !w.contains("secret-token")),
            "no token in a warning: {warned:?}"
        );
    }

    /// Before it is renamed into a shared directory, the socket exists only in a
    /// directory no other user can enter, so nobody can connect to it before it is 0600.
    #[tokio::test]
    async fn the_socket_is_made_in_a_private_directory_and_leaves_none_behind() {
        let shared = tempfile::tempdir().unwrap();
        std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        let target = shared.path().join("admin.sock");
        let mut seen = None;
        let (_listener, meta) = bind_privately(&target, shared.path(), |staging| {
            let dir = staging.parent().unwrap();
            let dir_meta = std::fs::symlink_metadata(dir).unwrap();
            let socket_mode = std::fs::symlink_metadata(staging).unwrap().mode() & 0o777;
            seen = Some((
                dir.to_owned(),
                dir_meta.is_dir(),
                dir_meta.mode() & 0o777,
                socket_mode,
            ));
        })
        .unwrap();
        let (dir, is_dir, dir_mode, socket_mode) = seen.unwrap();
        assert_ne!(
            dir,
            shared.path(),
            "the socket was made in the shared directory"
        );
        assert!(dir.starts_with(shared.path()), "{}", dir.display());
        assert!(is_dir);
        assert_eq!(dir_mode, 0o700, "the staging directory is open to others");
        assert_eq!(socket_mode, 0o600);
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.mode() & 0o777, 0o600);
        let left: Vec<_> = std::fs::read_dir(shared.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from("admin.sock")]);
    }
}
