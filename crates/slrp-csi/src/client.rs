//! [`CsiClient`]: the version-agnostic client the rest of slrp uses.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic::transport::Channel;

use tokio::time::Instant;

use crate::answer::{
    AnswerCheck, AnswerLimits, ListingBudget, MAX_CLEANUP_ID_BYTES, Violation, check_created,
    check_id, check_map, check_size, check_string, check_volume_identity,
};
use crate::endpoint::{CsiEndpoint, SocketAlias, is_connect_failure, is_too_long, lazy_channel};
use crate::error::{CsiError, CsiRpc};
use crate::metrics::{CsiMetrics, Outcome};
use crate::readiness::EndpointReadiness;
use crate::types::*;
use crate::{v0, v1};

/// Default per-RPC deadline (Mesos: 60 s, spec §4.2).
pub const DEFAULT_RPC_TIMEOUT: Duration = Duration::from_secs(60);

/// Which CSI version to speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VersionSelect {
    /// Probe `csi.v1`, then `csi.v0` on `UNIMPLEMENTED` (Mesos, spec §4.1.5).
    #[default]
    Auto,
    /// Speak this version without probing for it.
    Force(CsiVersion),
}

/// Client settings.
///
/// There is no retry setting: a call is one attempt. Callers that retry run their calls
/// through [`crate::retry()`] (the volume manager, `slrp csi --retries`).
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Version selection.
    pub version: VersionSelect,
    /// Deadline of every RPC attempt (sent as `grpc-timeout` and enforced locally).
    pub rpc_timeout: Duration,
    /// Fires on shutdown: calls in flight stop at once with [`CsiError::Cancelled`].
    pub cancel: CancellationToken,
    /// How much of the plugin's answers is accepted ([`crate::answer`]).
    pub limits: AnswerLimits,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            version: VersionSelect::Auto,
            rpc_timeout: DEFAULT_RPC_TIMEOUT,
            cancel: CancellationToken::new(),
            limits: AnswerLimits::default(),
        }
    }
}

impl ClientConfig {
    /// Sets the version selection.
    #[must_use]
    pub fn version(mut self, v: VersionSelect) -> Self {
        self.version = v;
        self
    }

    /// Sets the per-RPC deadline.
    #[must_use]
    pub fn rpc_timeout(mut self, t: Duration) -> Self {
        self.rpc_timeout = t;
        self
    }

    /// Sets the cancellation token.
    #[must_use]
    pub fn cancel(mut self, c: CancellationToken) -> Self {
        self.cancel = c;
        self
    }

    /// Sets the bounds on the plugin's answers.
    #[must_use]
    pub fn limits(mut self, l: AnswerLimits) -> Self {
        self.limits = l;
        self
    }
}

/// Failure of one attempt inside a backend, before it is tied to an RPC name.
#[derive(Debug)]
pub(crate) enum AttemptError {
    Status(tonic::Status),
    Unsupported(&'static str),
    /// The answer breaks a rule; `created` names what a refused CreateVolume created.
    Invalid {
        violation: Violation,
        created: Option<VolumeId>,
    },
    UnknownVersion,
}

impl From<Violation> for AttemptError {
    fn from(violation: Violation) -> Self {
        Self::Invalid {
            violation,
            created: None,
        }
    }
}

impl AttemptError {
    pub(crate) fn missing(field: &'static str) -> Self {
        Violation::Missing { field }.into()
    }

    fn into_csi(
        self,
        rpc: CsiRpc,
        version: Option<CsiVersion>,
        endpoint: &CsiEndpoint,
        timeout: Duration,
        limits: &AnswerLimits,
    ) -> CsiError {
        match self {
            // tonic enforces the `grpc-timeout` we send and reports its expiry as
            // CANCELLED; it is our deadline, so report it as one (retried like
            // DEADLINE_EXCEEDED).
            Self::Status(s) if is_local_timeout(&s) => CsiError::Timeout {
                rpc,
                after: timeout,
            },
            // A connection that breaks mid-call (plugin crashed or restarted) comes back
            // from tonic as UNKNOWN "transport error"; gRPC C++ (and so Mesos) sees
            // UNAVAILABLE there, which is what the retry policy is written against.
            Self::Status(s) if is_transport_failure(&s) => CsiError::Rpc {
                rpc,
                code: Code::Unavailable,
                source: s,
            },
            Self::Status(s) => CsiError::Rpc {
                rpc,
                code: s.code(),
                source: bounded_status(s, limits.max_string_bytes),
            },
            Self::Unsupported(what) => CsiError::Unsupported {
                rpc,
                version: version.unwrap_or(CsiVersion::V0),
                what,
            },
            Self::Invalid { violation, created } => CsiError::InvalidResponse {
                rpc,
                violation: Box::new(violation),
                created,
            },
            Self::UnknownVersion => CsiError::UnknownVersion {
                endpoint: endpoint.to_string(),
            },
        }
    }
}

/// `status` with its message cut to `max` bytes (at a character boundary), so a plugin's
/// error text cannot carry megabytes into the log, the state or an operation's status.
fn bounded_status(status: tonic::Status, max: usize) -> tonic::Status {
    let message = status.message();
    if message.len() <= max {
        return status;
    }
    let mut end = max;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    tonic::Status::new(
        status.code(),
        format!(
            "{}… (cut at {max} of {} bytes)",
            &message[..end],
            message.len()
        ),
    )
}

/// Whether `status` is tonic's report of the client-side deadline expiring.
fn is_local_timeout(status: &tonic::Status) -> bool {
    if status.code() != Code::Cancelled {
        return false;
    }
    let mut source = std::error::Error::source(status);
    while let Some(err) = source {
        if err.is::<tonic::TimeoutExpired>() {
            return true;
        }
        source = err.source();
    }
    false
}

/// Whether `status` reports a broken transport rather than an answer from the plugin.
fn is_transport_failure(status: &tonic::Status) -> bool {
    if status.code() != Code::Unknown {
        return false;
    }
    let mut source = std::error::Error::source(status);
    while let Some(err) = source {
        if err.is::<tonic::transport::Error>() {
            return true;
        }
        source = err.source();
    }
    false
}

impl From<tonic::Status> for AttemptError {
    fn from(s: tonic::Status) -> Self {
        Self::Status(s)
    }
}

/// A CSI client bound to one plugin endpoint. Cheap to clone; clones share the
/// connection, the detected version and the metrics.
///
/// The connection is made lazily and re-made after failures, always to the same socket
/// path, so a supervised plugin that restarts is reached again without a new client.
/// A client made with [`CsiClient::managed`] also waits for its endpoint to be ready
/// before each attempt (see [`crate::readiness`]).
#[derive(Debug, Clone)]
pub struct CsiClient {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    endpoint: CsiEndpoint,
    channel: Channel,
    /// Fixed by the first successful probe (or by configuration); never changes after.
    version: OnceLock<CsiVersion>,
    config: ClientConfig,
    metrics: CsiMetrics,
    /// The checks of every answer, with the client's limits.
    answers: AnswerCheck,
    /// The supervisor's view of the endpoint, for managed plugins: attempts wait for it
    /// to be up. `None` (unmanaged endpoints): every attempt is sent at once.
    readiness: Option<EndpointReadiness>,
    /// Keeps the short symlink of an over-long socket path alive as long as the client.
    _alias: Option<SocketAlias>,
}

impl CsiClient {
    /// A client for `endpoint`. Nothing is dialled yet.
    ///
    /// # Errors
    /// [`CsiError::SocketAlias`] if the socket path is longer than `sun_path` and the
    /// short alias cannot be created.
    pub fn new(
        endpoint: CsiEndpoint,
        config: ClientConfig,
        metrics: CsiMetrics,
    ) -> Result<Self, CsiError> {
        Self::build(endpoint, None, config, metrics)
    }

    /// A client for the endpoint of a supervised plugin: every attempt first waits, within
    /// its deadline ([`ClientConfig::rpc_timeout`]), until `readiness` reports the
    /// endpoint up, and an attempt whose connection is refused (nothing sent) waits
    /// again instead of failing, as Mesos's calls do across a plugin restart.
    ///
    /// # Errors
    /// As [`CsiClient::new`].
    pub fn managed(
        endpoint: CsiEndpoint,
        readiness: EndpointReadiness,
        config: ClientConfig,
        metrics: CsiMetrics,
    ) -> Result<Self, CsiError> {
        Self::build(endpoint, Some(readiness), config, metrics)
    }

    fn build(
        endpoint: CsiEndpoint,
        readiness: Option<EndpointReadiness>,
        config: ClientConfig,
        metrics: CsiMetrics,
    ) -> Result<Self, CsiError> {
        let (dial, alias) = if is_too_long(endpoint.path()) {
            let alias = SocketAlias::create(endpoint.path())?;
            (alias.path().to_owned(), Some(alias))
        } else {
            (endpoint.path().to_owned(), None)
        };
        let version = OnceLock::new();
        if let VersionSelect::Force(v) = config.version {
            let _ = version.set(v);
        }
        let answers = AnswerCheck::new(config.limits, metrics.clone(), &endpoint.to_string());
        Ok(Self {
            inner: Arc::new(Inner {
                endpoint,
                channel: lazy_channel(dial),
                version,
                config,
                metrics,
                answers,
                readiness,
                _alias: alias,
            }),
        })
    }

    /// The plugin's endpoint.
    pub fn endpoint(&self) -> &CsiEndpoint {
        &self.inner.endpoint
    }

    /// The metrics this client records into.
    pub fn metrics(&self) -> &CsiMetrics {
        &self.inner.metrics
    }

    /// The version, if already known (forced or detected).
    pub fn known_version(&self) -> Option<CsiVersion> {
        self.inner.version.get().copied()
    }

    /// The plugin's CSI version, probing for it if not yet known.
    ///
    /// # Errors
    /// As [`CsiClient::probe`].
    pub async fn version(&self) -> Result<CsiVersion, CsiError> {
        match self.known_version() {
            Some(v) => Ok(v),
            None => Ok(self.probe().await?.version),
        }
    }

    /// `Probe`. While the version is unknown this is the detection sequence (v1, then v0
    /// on `UNIMPLEMENTED`), counted as one attempt; its first success fixes the version.
    ///
    /// # Errors
    /// [`CsiError::UnknownVersion`] if both versions are `UNIMPLEMENTED`; otherwise the
    /// failure of the probe.
    pub async fn probe(&self) -> Result<ProbeResult, CsiError> {
        let known = self.known_version();
        let (version, ready) = self
            .call(CsiRpc::Probe, known, |ch, _, t| async move {
                match known {
                    Some(CsiVersion::V1) => Ok((CsiVersion::V1, v1::probe(ch, t).await?)),
                    Some(CsiVersion::V0) => Ok((CsiVersion::V0, v0::probe(ch, t).await?)),
                    None => detect(ch, t).await,
                }
            })
            .await?;
        // A concurrent detection may have won; both saw the same plugin.
        let _ = self.inner.version.set(version);
        Ok(ProbeResult { version, ready })
    }

    /// `GetPluginInfo`.
    ///
    /// # Errors
    /// The RPC's failure, classified (see [`CsiError::retry_class`]).
    pub async fn plugin_info(&self) -> Result<PluginInfo, CsiError> {
        let limits = &self.inner.config.limits;
        self.versioned(CsiRpc::GetPluginInfo, |ch, v, t| async move {
            let info = match v {
                CsiVersion::V1 => v1::plugin_info(ch, t).await,
                CsiVersion::V0 => v0::plugin_info(ch, t).await,
            }?;
            check_string("name", &info.name, limits)?;
            check_string("vendor_version", &info.vendor_version, limits)?;
            check_map("manifest", &info.manifest, limits)?;
            Ok(info)
        })
        .await
    }

    /// `GetPluginCapabilities`.
    ///
    /// # Errors
    /// The RPC's failure.
    pub async fn plugin_capabilities(&self) -> Result<PluginCapabilities, CsiError> {
        self.versioned(CsiRpc::GetPluginCapabilities, |ch, v, t| async move {
            match v {
                CsiVersion::V1 => v1::plugin_capabilities(ch, t).await,
                CsiVersion::V0 => v0::plugin_capabilities(ch, t).await,
            }
        })
        .await
    }

    /// `ControllerGetCapabilities`.
    ///
    /// # Errors
    /// The RPC's failure.
    pub async fn controller_capabilities(&self) -> Result<ControllerCapabilities, CsiError> {
        self.versioned(CsiRpc::ControllerGetCapabilities, |ch, v, t| async move {
            match v {
                CsiVersion::V1 => v1::controller_capabilities(ch, t).await,
                CsiVersion::V0 => v0::controller_capabilities(ch, t).await,
            }
        })
        .await
    }

    /// `NodeGetCapabilities`.
    ///
    /// # Errors
    /// The RPC's failure.
    pub async fn node_capabilities(&self) -> Result<NodeCapabilities, CsiError> {
        self.versioned(CsiRpc::NodeGetCapabilities, |ch, v, t| async move {
            match v {
                CsiVersion::V1 => v1::node_capabilities(ch, t).await,
                CsiVersion::V0 => v0::node_capabilities(ch, t).await,
            }
        })
        .await
    }

    /// Every capability set the volume manager plans with: plugin capabilities, then
    /// controller capabilities if the plugin runs `CONTROLLER_SERVICE` (all false
    /// otherwise, spec §4.4), then node capabilities.
    ///
    /// # Errors
    /// The first failing RPC.
    pub async fn capabilities(&self) -> Result<CsiCapabilities, CsiError> {
        let plugin = self.plugin_capabilities().await?;
        let controller = if plugin.controller_service {
            self.controller_capabilities().await?
        } else {
            ControllerCapabilities::default()
        };
        let node = self.node_capabilities().await?;
        Ok(CsiCapabilities {
            plugin,
            controller,
            node,
        })
    }

    /// `NodeGetInfo`; for v0 plugins without it (CSI 0.2), `NodeGetId`.
    ///
    /// # Errors
    /// The RPC's failure.
    pub async fn node_info(&self) -> Result<NodeInfo, CsiError> {
        let limits = &self.inner.config.limits;
        self.versioned(CsiRpc::NodeGetInfo, |ch, v, t| async move {
            let info = match v {
                CsiVersion::V1 => v1::node_info(ch, t).await,
                CsiVersion::V0 => v0::node_info(ch, t).await,
            }?;
            check_id("node_id", &info.node_id, limits)?;
            check_size("max_volumes_per_node", info.max_volumes_per_node)?;
            if let Some(topology) = &info.accessible_topology {
                check_map("accessible_topology", topology, limits)?;
            }
            Ok(info)
        })
        .await
    }

    /// `CreateVolume`, one attempt (Mesos retries it on `DEADLINE_EXCEEDED`/`UNAVAILABLE`:
    /// run it through [`crate::retry()`] for that).
    ///
    /// # Errors
    /// [`CsiError::InvalidRequest`] for an empty name; [`CsiError::InvalidResponse`] for
    /// an answer [`check_created`] refuses (naming the volume the plugin created, when
    /// it gave an id that can be sent back: the caller deletes it); otherwise the RPC's
    /// failure.
    pub async fn create_volume(&self, req: &CreateVolumeRequest) -> Result<Volume, CsiError> {
        if req.name.is_empty() {
            return Err(CsiError::InvalidRequest {
                rpc: CsiRpc::CreateVolume,
                what: "the volume name is empty".to_owned(),
            });
        }
        let limits = &self.inner.config.limits;
        self.versioned(CsiRpc::CreateVolume, |ch, v, t| async move {
            let volume = match v {
                CsiVersion::V1 => v1::create_volume(ch, t, req).await,
                CsiVersion::V0 => v0::create_volume(ch, t, req).await,
            }?;
            if let Err(violation) = check_created(req, &volume, limits) {
                let id = volume.volume_id;
                let usable = !id.as_str().is_empty() && id.as_str().len() <= MAX_CLEANUP_ID_BYTES;
                return Err(AttemptError::Invalid {
                    violation,
                    created: usable.then_some(id),
                });
            }
            Ok(volume)
        })
        .await
    }

    /// `DeleteVolume`, one attempt (retried by Mesos as `CreateVolume`). A `NOT_FOUND`
    /// answer is returned as an error whose [`CsiError::retry_class`] is
    /// [`RetryClass::AlreadyDone`](crate::RetryClass::AlreadyDone).
    ///
    /// # Errors
    /// The RPC's failure.
    pub async fn delete_volume(&self, id: &VolumeId, secrets: &Secrets) -> Result<(), CsiError> {
        self.versioned(CsiRpc::DeleteVolume, |ch, v, t| async move {
            match v {
                CsiVersion::V1 => v1::delete_volume(ch, t, id, secrets).await,
                CsiVersion::V0 => v0::delete_volume(ch, t, id, secrets).await,
            }
        })
        .await
    }

    /// `ControllerPublishVolume`; returns the publish context.
    ///
    /// # Errors
    /// The RPC's failure.
    pub async fn controller_publish(
        &self,
        req: &ControllerPublishRequest,
    ) -> Result<StringMap, CsiError> {
        let limits = &self.inner.config.limits;
        self.versioned(CsiRpc::ControllerPublishVolume, |ch, v, t| async move {
            let context = match v {
                CsiVersion::V1 => v1::controller_publish(ch, t, req).await,
                CsiVersion::V0 => v0::controller_publish(ch, t, req).await,
            }?;
            check_map("publish_context", &context, limits)?;
            Ok(context)
        })
        .await
    }

    /// `ControllerUnpublishVolume`.
    ///
    /// # Errors
    /// The RPC's failure.
    pub async fn controller_unpublish(&self, id: &VolumeId, node_id: &str) -> Result<(), CsiError> {
        self.versioned(CsiRpc::ControllerUnpublishVolume, |ch, v, t| async move {
            match v {
                CsiVersion::V1 => v1::controller_unpublish(ch, t, id, node_id).await,
                CsiVersion::V0 => v0::controller_unpublish(ch, t, id, node_id).await,
            }
        })
        .await
    }

    /// `ValidateVolumeCapabilities`.
    ///
    /// # Errors
    /// The RPC's failure.
    pub async fn validate(&self, req: &ValidateRequest) -> Result<Validation, CsiError> {
        let limits = &self.inner.config.limits;
        self.versioned(CsiRpc::ValidateVolumeCapabilities, |ch, v, t| async move {
            let validation = match v {
                CsiVersion::V1 => v1::validate(ch, t, req).await,
                CsiVersion::V0 => v0::validate(ch, t, req).await,
            }?;
            check_string("message", &validation.message, limits)?;
            if let Some(confirmed) = &validation.confirmed_fields {
                check_map(
                    "confirmed.volume_context",
                    &confirmed.volume_context,
                    limits,
                )?;
                check_map("confirmed.parameters", &confirmed.parameters, limits)?;
            }
            Ok(validation)
        })
        .await
    }

    /// One page of `ListVolumes`. `max_entries` 0 lets the plugin choose.
    ///
    /// Entries that cannot be used (no volume, an id that is empty, too long or not
    /// storable, a context over the bound) are left out, and a negative size is read as
    /// 0 (unknown): counted and logged as [`crate::answer`] says, so that one bad entry
    /// does not hide the other volumes.
    ///
    /// # Errors
    /// [`CsiError::InvalidRequest`] for a negative `max_entries`;
    /// [`CsiError::InvalidResponse`] for a `next_token` over the string bound; otherwise
    /// the RPC's failure.
    pub async fn list_volumes_page(
        &self,
        max_entries: i32,
        starting_token: Option<&str>,
    ) -> Result<VolumePage, CsiError> {
        check_max_entries(max_entries)?;
        let answers = &self.inner.answers;
        self.versioned(CsiRpc::ListVolumes, |ch, v, t| async move {
            let raw = match v {
                CsiVersion::V1 => v1::list_volumes(ch, t, max_entries, starting_token).await,
                CsiVersion::V0 => v0::list_volumes(ch, t, max_entries, starting_token).await,
            }?;
            checked_page(answers, raw)
        })
        .await
    }

    /// One page of `ListVolumes` read for its entries' `status.volume_condition` (v1
    /// only): what the volume health poller asks a plugin with `LIST_VOLUMES` and
    /// `VOLUME_CONDITION` but no `GET_VOLUME`. Entries without a usable volume id are
    /// left out, and a condition message over the string bound is cut, counted as
    /// [`crate::answer`] says.
    ///
    /// # Errors
    /// [`CsiError::Unsupported`] for v0 plugins (no `status` in their listing);
    /// [`CsiError::InvalidRequest`] for a negative `max_entries`;
    /// [`CsiError::InvalidResponse`] for a `next_token` over the string bound; otherwise
    /// the RPC's failure.
    pub async fn list_conditions_page(
        &self,
        max_entries: i32,
        starting_token: Option<&str>,
    ) -> Result<ConditionPage, CsiError> {
        check_max_entries(max_entries)?;
        let answers = &self.inner.answers;
        self.versioned(CsiRpc::ListVolumes, |ch, v, t| async move {
            let (raw, next_token) = match v {
                CsiVersion::V1 => v1::list_conditions(ch, t, max_entries, starting_token).await?,
                CsiVersion::V0 => return Err(AttemptError::Unsupported("volume conditions")),
            };
            if let Some(token) = &next_token {
                check_string("next_token", token, &answers.limits)?;
            }
            let mut entries = Vec::with_capacity(raw.len());
            for (id, condition) in raw {
                let Some(id) = id else {
                    answers.tolerated(
                        CsiRpc::ListVolumes,
                        &Violation::Missing { field: "volume" },
                        "entry skipped",
                    );
                    continue;
                };
                if let Err(v) = check_id("volume_id", &id, &answers.limits) {
                    answers.tolerated(CsiRpc::ListVolumes, &v, "entry skipped");
                    continue;
                }
                entries.push(ListedCondition {
                    volume_id: VolumeId::new(id),
                    condition: condition
                        .map(|c| bounded_condition(answers, CsiRpc::ListVolumes, c)),
                });
            }
            Ok(ConditionPage {
                entries,
                next_token,
            })
        })
        .await
    }

    /// `ControllerGetVolume` (v1 only): the volume's `status.volume_condition`, `None`
    /// when the plugin gave none. A message over the string bound is cut.
    ///
    /// # Errors
    /// [`CsiError::Unsupported`] for v0 plugins; otherwise the RPC's failure
    /// (`NOT_FOUND` for a volume the plugin does not know).
    pub async fn controller_get_volume(
        &self,
        id: &VolumeId,
    ) -> Result<Option<VolumeCondition>, CsiError> {
        let answers = &self.inner.answers;
        self.versioned(CsiRpc::ControllerGetVolume, |ch, v, t| async move {
            match v {
                CsiVersion::V1 => Ok(v1::controller_get_volume(ch, t, id)
                    .await?
                    .map(|c| bounded_condition(answers, CsiRpc::ControllerGetVolume, c))),
                CsiVersion::V0 => Err(AttemptError::Unsupported("ControllerGetVolume")),
            }
        })
        .await
    }

    /// A [`ListingBudget`] with this client's limits, for callers that follow pages of
    /// [`CsiClient::list_volumes_page`] themselves.
    pub fn listing_budget(&self) -> ListingBudget {
        ListingBudget::counted(self.inner.config.limits, self.inner.metrics.clone())
    }

    /// All volumes, following `next_token` with pages of `page_size` (0 = plugin's
    /// choice), within the bounds of a [`ListingBudget`].
    ///
    /// # Errors
    /// A page's failure, or [`CsiError::InvalidResponse`] when the listing passes a bound
    /// or the plugin hands out a token it already gave (which would loop forever).
    pub async fn list_volumes(&self, page_size: i32) -> Result<Vec<Volume>, CsiError> {
        let mut budget = self.listing_budget();
        let mut all = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = self.list_volumes_page(page_size, token.as_deref()).await?;
            if let Err(violation) = budget.take(&page) {
                return Err(CsiError::InvalidResponse {
                    rpc: CsiRpc::ListVolumes,
                    violation: Box::new(violation),
                    created: None,
                });
            }
            all.extend(page.volumes);
            match page.next_token {
                None => return Ok(all),
                Some(next) => token = Some(next),
            }
        }
    }

    /// `GetCapacity` for volumes with `capabilities` and `parameters`.
    ///
    /// # Errors
    /// The RPC's failure.
    pub async fn capacity(
        &self,
        capabilities: &[VolumeCapability],
        parameters: &StringMap,
    ) -> Result<Capacity, CsiError> {
        let answers = &self.inner.answers;
        self.versioned(CsiRpc::GetCapacity, |ch, v, t| async move {
            let mut capacity = match v {
                CsiVersion::V1 => v1::capacity(ch, t, capabilities, parameters).await,
                CsiVersion::V0 => v0::capacity(ch, t, capabilities, parameters).await,
            }?;
            // Negative is no space (and no size bound): what slrp always made of it,
            // now said.
            if let Err(v) = check_size("available_capacity", capacity.available_bytes) {
                answers.tolerated(CsiRpc::GetCapacity, &v, "read as 0");
                capacity.available_bytes = 0;
            }
            if let Some(max) = capacity.maximum_volume_size
                && let Err(v) = check_size("maximum_volume_size", max)
            {
                answers.tolerated(CsiRpc::GetCapacity, &v, "ignored");
                capacity.maximum_volume_size = None;
            }
            Ok(capacity)
        })
        .await
    }

    /// `ControllerExpandVolume` (v1 only).
    ///
    /// # Errors
    /// [`CsiError::Unsupported`] for v0 plugins; otherwise the RPC's failure.
    pub async fn controller_expand(
        &self,
        id: &VolumeId,
        required_bytes: i64,
        capability: Option<&VolumeCapability>,
    ) -> Result<ControllerExpansion, CsiError> {
        self.versioned(CsiRpc::ControllerExpandVolume, |ch, v, t| async move {
            match v {
                CsiVersion::V1 => {
                    let expansion =
                        v1::controller_expand(ch, t, id, required_bytes, capability).await?;
                    check_size("capacity_bytes", expansion.capacity_bytes)?;
                    Ok(expansion)
                }
                CsiVersion::V0 => Err(AttemptError::Unsupported("volume expansion")),
            }
        })
        .await
    }

    /// `CreateSnapshot` (v1 only): idempotent by `req.name` and source.
    ///
    /// # Errors
    /// [`CsiError::Unsupported`] for v0 plugins; an answer without a usable snapshot id,
    /// of another source, or with a negative size ([`CsiError::InvalidResponse`]);
    /// otherwise the RPC's failure.
    pub async fn create_snapshot(&self, req: &CreateSnapshotRequest) -> Result<Snapshot, CsiError> {
        if req.name.is_empty() {
            return Err(CsiError::InvalidRequest {
                rpc: CsiRpc::CreateSnapshot,
                what: "the snapshot name is empty".to_owned(),
            });
        }
        let limits = &self.inner.config.limits;
        self.versioned(CsiRpc::CreateSnapshot, |ch, v, t| async move {
            match v {
                CsiVersion::V1 => {
                    let snapshot = v1::create_snapshot(ch, t, req).await?;
                    let invalid = |violation| AttemptError::Invalid {
                        violation,
                        created: None,
                    };
                    crate::answer::check_id("snapshot.snapshot_id", &snapshot.snapshot_id, limits)
                        .map_err(invalid)?;
                    check_size("snapshot.size_bytes", snapshot.size_bytes).map_err(invalid)?;
                    if snapshot.source_volume_id != req.source_volume_id {
                        return Err(invalid(crate::answer::Violation::Mismatch {
                            field: "snapshot.source_volume_id",
                            what: format!(
                                "'{}', not the volume asked for ('{}')",
                                snapshot.source_volume_id, req.source_volume_id
                            ),
                        }));
                    }
                    Ok(snapshot)
                }
                CsiVersion::V0 => Err(AttemptError::Unsupported("snapshots")),
            }
        })
        .await
    }

    /// `DeleteSnapshot` (v1 only). A `NOT_FOUND` answer is returned as an error whose
    /// [`CsiError::retry_class`] is [`RetryClass::AlreadyDone`](crate::RetryClass::AlreadyDone).
    ///
    /// # Errors
    /// [`CsiError::Unsupported`] for v0 plugins; otherwise the RPC's failure.
    pub async fn delete_snapshot(&self, snapshot_id: &str) -> Result<(), CsiError> {
        self.versioned(CsiRpc::DeleteSnapshot, |ch, v, t| async move {
            match v {
                CsiVersion::V1 => v1::delete_snapshot(ch, t, snapshot_id).await,
                CsiVersion::V0 => Err(AttemptError::Unsupported("snapshots")),
            }
        })
        .await
    }

    /// One page of `ListSnapshots` (v1 only; `max_entries` 0 = the plugin's choice).
    ///
    /// # Errors
    /// [`CsiError::Unsupported`] for v0 plugins; otherwise the RPC's failure.
    pub async fn list_snapshots_page(
        &self,
        max_entries: i32,
        starting_token: Option<&str>,
    ) -> Result<SnapshotPage, CsiError> {
        self.versioned(CsiRpc::ListSnapshots, |ch, v, t| async move {
            match v {
                CsiVersion::V1 => v1::list_snapshots(ch, t, max_entries, starting_token).await,
                CsiVersion::V0 => Err(AttemptError::Unsupported("snapshots")),
            }
        })
        .await
    }

    /// `NodeStageVolume`.
    ///
    /// # Errors
    /// The RPC's failure.
    pub async fn node_stage(&self, req: &NodeStageRequest) -> Result<(), CsiError> {
        self.versioned(CsiRpc::NodeStageVolume, |ch, v, t| async move {
            match v {
                CsiVersion::V1 => v1::node_stage(ch, t, req).await,
                CsiVersion::V0 => v0::node_stage(ch, t, req).await,
            }
        })
        .await
    }

    /// `NodeUnstageVolume`.
    ///
    /// # Errors
    /// The RPC's failure (`NOT_FOUND` classifies as
    /// [`RetryClass::AlreadyDone`](crate::RetryClass::AlreadyDone)).
    pub async fn node_unstage(&self, id: &VolumeId, staging_path: &str) -> Result<(), CsiError> {
        self.versioned(CsiRpc::NodeUnstageVolume, |ch, v, t| async move {
            match v {
                CsiVersion::V1 => v1::node_unstage(ch, t, id, staging_path).await,
                CsiVersion::V0 => v0::node_unstage(ch, t, id, staging_path).await,
            }
        })
        .await
    }

    /// `NodePublishVolume`.
    ///
    /// # Errors
    /// The RPC's failure.
    pub async fn node_publish(&self, req: &NodePublishRequest) -> Result<(), CsiError> {
        self.versioned(CsiRpc::NodePublishVolume, |ch, v, t| async move {
            match v {
                CsiVersion::V1 => v1::node_publish(ch, t, req).await,
                CsiVersion::V0 => v0::node_publish(ch, t, req).await,
            }
        })
        .await
    }

    /// `NodeUnpublishVolume`.
    ///
    /// # Errors
    /// The RPC's failure (`NOT_FOUND` classifies as
    /// [`RetryClass::AlreadyDone`](crate::RetryClass::AlreadyDone)).
    pub async fn node_unpublish(&self, id: &VolumeId, target_path: &str) -> Result<(), CsiError> {
        self.versioned(CsiRpc::NodeUnpublishVolume, |ch, v, t| async move {
            match v {
                CsiVersion::V1 => v1::node_unpublish(ch, t, id, target_path).await,
                CsiVersion::V0 => v0::node_unpublish(ch, t, id, target_path).await,
            }
        })
        .await
    }

    /// `NodeGetVolumeStats` (v1 only).
    ///
    /// # Errors
    /// [`CsiError::Unsupported`] for v0 plugins; otherwise the RPC's failure.
    pub async fn node_stats(
        &self,
        id: &VolumeId,
        volume_path: &str,
    ) -> Result<VolumeStats, CsiError> {
        let limits = &self.inner.config.limits;
        self.versioned(CsiRpc::NodeGetVolumeStats, |ch, v, t| async move {
            match v {
                CsiVersion::V1 => {
                    let stats = v1::node_stats(ch, t, id, volume_path).await?;
                    if let Some(message) = &stats.condition_message {
                        check_string("volume_condition.message", message, limits)?;
                    }
                    Ok(stats)
                }
                CsiVersion::V0 => Err(AttemptError::Unsupported("volume stats")),
            }
        })
        .await
    }

    /// `NodeExpandVolume` (v1 only); returns the new capacity (0 = unknown).
    ///
    /// # Errors
    /// [`CsiError::Unsupported`] for v0 plugins; otherwise the RPC's failure.
    pub async fn node_expand(&self, req: &NodeExpandRequest) -> Result<i64, CsiError> {
        self.versioned(CsiRpc::NodeExpandVolume, |ch, v, t| async move {
            match v {
                CsiVersion::V1 => {
                    let capacity = v1::node_expand(ch, t, req).await?;
                    check_size("capacity_bytes", capacity)?;
                    Ok(capacity)
                }
                CsiVersion::V0 => Err(AttemptError::Unsupported("volume expansion")),
            }
        })
        .await
    }

    // === plumbing ===

    /// An RPC that needs the version: detect it first, then [`CsiClient::call`]. The
    /// detection is part of the call: a caller that retries `rpc` retries it too.
    async fn versioned<'a, T, F, Fut>(&'a self, rpc: CsiRpc, op: F) -> Result<T, CsiError>
    where
        F: Fn(Channel, CsiVersion, Duration) -> Fut + 'a,
        Fut: Future<Output = Result<T, AttemptError>> + 'a,
    {
        let version = match self.known_version() {
            Some(v) => v,
            None => self.probe().await.map_err(|e| e.waited_for(rpc))?.version,
        };
        self.call(rpc, Some(version), move |ch, _, t| op(ch, version, t))
            .await
    }

    /// One attempt of `rpc`, ended at once with [`CsiError::Cancelled`] when the
    /// cancellation token fires. Never retried here (see [`crate::retry()`]).
    async fn call<T, F, Fut>(
        &self,
        rpc: CsiRpc,
        version: Option<CsiVersion>,
        op: F,
    ) -> Result<T, CsiError>
    where
        F: Fn(Channel, Option<CsiVersion>, Duration) -> Fut,
        Fut: Future<Output = Result<T, AttemptError>>,
    {
        tokio::select! {
            biased;
            () = self.inner.config.cancel.cancelled() => Err(CsiError::Cancelled { rpc }),
            r = self.attempt(rpc, version, &op) => r,
        }
    }

    /// One attempt: readiness wait, metrics guard, deadline, error mapping. The deadline
    /// covers the wait for a managed endpoint as well as the RPC.
    async fn attempt<T, F, Fut>(
        &self,
        rpc: CsiRpc,
        version: Option<CsiVersion>,
        op: &F,
    ) -> Result<T, CsiError>
    where
        F: Fn(Channel, Option<CsiVersion>, Duration) -> Fut,
        Fut: Future<Output = Result<T, AttemptError>>,
    {
        let timeout = self.inner.config.rpc_timeout;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(ready) = &self.inner.readiness {
                self.wait_ready(ready, rpc, deadline).await?;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let guard = self.inner.metrics.start(rpc);
            let result =
                tokio::time::timeout(left, op(self.inner.channel.clone(), version, left)).await;
            match result {
                Ok(Ok(v)) => {
                    guard.finish(Outcome::Finished);
                    return Ok(v);
                }
                Ok(Err(AttemptError::Status(s)))
                    if self.inner.readiness.is_some() && is_connect_failure(&s) =>
                {
                    // Nothing went out: the plugin died or its socket is not bound yet and
                    // the supervisor has not said so. Wait like gRPC's `wait_for_ready`.
                    guard.finish(Outcome::NotSent);
                    tracing::debug!(%rpc, endpoint = %self.inner.endpoint,
                        "plugin socket refused the connection; waiting for the endpoint");
                    if let Some(ready) = &self.inner.readiness {
                        ready.pause(deadline).await;
                    }
                    if Instant::now() >= deadline {
                        return Err(self.not_ready(rpc));
                    }
                }
                Ok(Err(e)) => {
                    // Refused before anything was sent (the plugin's version lacks the
                    // feature): not an RPC, so not counted as one.
                    let outcome = if matches!(e, AttemptError::Unsupported(_)) {
                        Outcome::NotSent
                    } else {
                        Outcome::Failed
                    };
                    guard.finish(outcome);
                    if let AttemptError::Invalid { violation, .. } = &e {
                        self.inner.answers.refused(rpc, violation);
                    }
                    let err = e.into_csi(
                        rpc,
                        version,
                        &self.inner.endpoint,
                        timeout,
                        &self.inner.config.limits,
                    );
                    tracing::debug!(%rpc, endpoint = %self.inner.endpoint, error = %slrp_types::DisplayChain(&err), "CSI call failed");
                    return Err(err);
                }
                Err(_elapsed) => {
                    guard.finish(Outcome::Failed);
                    return Err(CsiError::Timeout {
                        rpc,
                        after: timeout,
                    });
                }
            }
        }
    }

    /// Waits, at most [`ClientConfig::rpc_timeout`], until a managed endpoint is up; at
    /// once for an unmanaged one (see [`crate::CsiVolumes::endpoint_ready`]).
    ///
    /// # Errors
    /// [`CsiError::NotReady`] if the wait runs out, [`CsiError::EndpointStopped`] if the
    /// endpoint was stopped.
    pub async fn endpoint_ready(&self, rpc: CsiRpc) -> Result<(), CsiError> {
        match &self.inner.readiness {
            None => Ok(()),
            Some(ready) => {
                let deadline = Instant::now() + self.inner.config.rpc_timeout;
                self.wait_ready(ready, rpc, deadline).await
            }
        }
    }

    /// Waits until a managed endpoint is up, at most until `deadline`.
    async fn wait_ready(
        &self,
        ready: &EndpointReadiness,
        rpc: CsiRpc,
        deadline: Instant,
    ) -> Result<(), CsiError> {
        match tokio::time::timeout_at(deadline, ready.wait_up()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_stopped)) => Err(CsiError::EndpointStopped {
                rpc,
                endpoint: self.inner.endpoint.to_string(),
            }),
            Err(_elapsed) => Err(self.not_ready(rpc)),
        }
    }

    fn not_ready(&self, rpc: CsiRpc) -> CsiError {
        CsiError::NotReady {
            rpc,
            endpoint: self.inner.endpoint.to_string(),
            after: self.inner.config.rpc_timeout,
        }
    }
}

/// One ListVolumes page as a backend decoded it: entries without a volume are `None`.
#[derive(Debug)]
pub(crate) struct RawPage {
    pub(crate) entries: Vec<Option<Volume>>,
    pub(crate) next_token: Option<String>,
}

/// A `ListVolumes` page size the request can carry (0 lets the plugin choose).
fn check_max_entries(max_entries: i32) -> Result<(), CsiError> {
    if max_entries < 0 {
        return Err(CsiError::InvalidRequest {
            rpc: CsiRpc::ListVolumes,
            what: format!("max_entries {max_entries} is negative"),
        });
    }
    Ok(())
}

/// `c` with its message cut to the string bound (the rest is only words for a human).
fn bounded_condition(
    answers: &AnswerCheck,
    rpc: CsiRpc,
    mut c: VolumeCondition,
) -> VolumeCondition {
    let max = answers.limits.max_string_bytes;
    if let Err(v) = check_string("volume_condition.message", &c.message, &answers.limits) {
        answers.tolerated(rpc, &v, "cut");
        let mut end = max;
        while !c.message.is_char_boundary(end) {
            end -= 1;
        }
        c.message.truncate(end);
    }
    c
}

/// The usable part of `raw` (see [`CsiClient::list_volumes_page`]).
fn checked_page(answers: &AnswerCheck, raw: RawPage) -> Result<VolumePage, AttemptError> {
    let rpc = CsiRpc::ListVolumes;
    if let Some(token) = &raw.next_token {
        check_string("next_token", token, &answers.limits)?;
    }
    let mut volumes = Vec::with_capacity(raw.entries.len());
    for entry in raw.entries {
        let Some(mut volume) = entry else {
            answers.tolerated(
                rpc,
                &Violation::Missing { field: "volume" },
                "entry skipped",
            );
            continue;
        };
        if let Err(v) = check_volume_identity(&volume, &answers.limits) {
            answers.tolerated(rpc, &v, "entry skipped");
            continue;
        }
        if let Err(v) = check_size("capacity_bytes", volume.capacity_bytes) {
            // Unknown, as CSI spells it: the volume is still there.
            answers.tolerated(rpc, &v, "read as 0 (unknown)");
            volume.capacity_bytes = 0;
        }
        volumes.push(volume);
    }
    Ok(VolumePage {
        volumes,
        next_token: raw.next_token,
    })
}

/// The detection sequence of spec §4.1.5: v1 `Probe`, then v0 on `UNIMPLEMENTED`.
async fn detect(ch: Channel, t: Duration) -> Result<(CsiVersion, bool), AttemptError> {
    match v1::probe(ch.clone(), t).await {
        Ok(ready) => Ok((CsiVersion::V1, ready)),
        Err(s) if s.code() == Code::Unimplemented => match v0::probe(ch, t).await {
            Ok(ready) => Ok((CsiVersion::V0, ready)),
            Err(s) if s.code() == Code::Unimplemented => Err(AttemptError::UnknownVersion),
            Err(s) => Err(s.into()),
        },
        Err(s) => Err(s.into()),
    }
}
