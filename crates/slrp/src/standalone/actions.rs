//! The admin API's actions in standalone mode, over the embedded manager: an operator's
//! create, destroy and publish go the way a framework's operations would, as
//! CREATE_DISK / DESTROY_DISK applied through the manager (which validates them as a
//! master does) and PUBLISH_RESOURCES as an agent sends it before a task starts.
//!
//! Resources are chosen from the manager's view of the provider's total
//! (`ManagerHandle::agent_total`), the view a master offers from. The choice and the
//! apply are serialised per provider: the manager's total holds an applied operation's
//! consumption at once (speculatively), so the next choice sees what is left.
//!
//! The admin routes validate the requests (fields, provider names) before they get
//! here; what is checked here is what only the manager's view knows.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use prometheus_client::registry::Registry;
use slrp_manager::{
    AckPolicy, ApplyRequest, ManagerError, ManagerHandle, OperationError, OperationView,
    PublishError, SubscribedProvider,
};
use slrp_proto::mesos::v1::resource::disk_info::source::Type as SourceType;
use slrp_proto::mesos::v1::{OperationState, Resource, offer};
use slrp_provider::admin::api::{
    CreateDisk, DestroyDisk, OperationParts, OperationSummary, VolumeRef, operation_summary,
};
use slrp_provider::admin::{ActionError, BoxFuture, ManagerActions};
use slrp_provider::config::provider_key;
use slrp_types::DisplayChain;

/// How long an action waits for a terminal status when the request gives no timeout.
const DEFAULT_WAIT: Duration = Duration::from_secs(300);
/// Operations applied through the admin API that `operations()` still lists after the
/// manager acknowledged (and forgot) them.
const RECENT_KEPT: usize = 1024;
/// Mesos counts disk space in MB of 2^20 bytes.
const MIB: u64 = 1 << 20;
/// How long `operations()` waits, in all, for the manager's records of remembered
/// operations it no longer lists (it answers for acknowledged ones at once; a pending
/// one of a disconnected provider would otherwise hold the listing).
const LOOKUP_BOUND: Duration = Duration::from_millis(250);

/// One operation applied through the admin API.
#[derive(Debug, Clone)]
struct Recent {
    uuid: uuid::Uuid,
    provider: String,
    /// Its terminal record, once seen (it never changes after that).
    terminal: Option<OperationSummary>,
}

/// [`ManagerActions`] over the embedded manager.
#[derive(Debug, Clone)]
pub(crate) struct StandaloneActions {
    manager: ManagerHandle,
    recent: Arc<Mutex<VecDeque<Recent>>>,
    /// Per provider id: held from reading the manager's total until the chosen
    /// operation is applied, so that concurrent creates do not pick the same space.
    choosing: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
    /// Whether the manager acknowledges every status as it arrives
    /// ([`AckPolicy::Auto`]), so that every status it holds is acknowledged.
    acks_all: bool,
}

impl StandaloneActions {
    pub(crate) fn new(manager: ManagerHandle, ack_policy: AckPolicy) -> Self {
        Self {
            manager,
            recent: Arc::new(Mutex::new(VecDeque::new())),
            choosing: Arc::new(Mutex::new(HashMap::new())),
            acks_all: ack_policy == AckPolicy::Auto,
        }
    }

    /// The lock that serialises choose+apply on provider `provider_id`.
    fn choice_lock(&self, provider_id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self
            .choosing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(locks.entry(provider_id.to_owned()).or_default())
    }

    fn recent(&self) -> std::sync::MutexGuard<'_, VecDeque<Recent>> {
        self.recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn remember(&self, uuid: uuid::Uuid, provider: &str, terminal: Option<OperationSummary>) {
        let mut recent = self.recent();
        if let Some(entry) = recent.iter_mut().find(|r| r.uuid == uuid) {
            if terminal.is_some() {
                entry.terminal = terminal;
            }
            return;
        }
        if recent.len() == RECENT_KEPT {
            recent.pop_front();
        }
        recent.push_back(Recent {
            uuid,
            provider: provider.to_owned(),
            terminal,
        });
    }

    async fn providers(&self) -> Result<Vec<SubscribedProvider>, ActionError> {
        self.manager.providers().await.map_err(manager_stopped)
    }

    /// The provider `key` names, or the only one: the route checked the name (and that
    /// there is only one when none is given), so what is left is the manager's side, a
    /// provider that has not subscribed (yet, or again).
    async fn provider(&self, key: Option<&str>) -> Result<SubscribedProvider, ActionError> {
        self.providers()
            .await?
            .into_iter()
            .find(|v| key.is_none_or(|key| provider_key(&v.info) == key))
            .ok_or_else(not_subscribed)
    }

    /// The disk whose `disk.source.id` is `volume_id`, with its provider's key and id,
    /// among the provider `key` names (or all of them).
    async fn find_disk(
        &self,
        key: Option<&str>,
        volume_id: &str,
    ) -> Result<(String, String, Resource), ActionError> {
        let views = match key {
            Some(_) => vec![self.provider(key).await?],
            None => self.providers().await?,
        };
        if views.is_empty() {
            return Err(not_subscribed());
        }
        for view in views {
            let id = provider_id(&view);
            let total = self.agent_total(&id).await?;
            if let Some(disk) = total.into_iter().find(|r| disk_id(r) == Some(volume_id)) {
                return Ok((provider_key(&view.info), id, disk));
            }
        }
        Err(ActionError::field(
            StatusCode::NOT_FOUND,
            "volume_id",
            format!("no disk with id '{volume_id}' (see GET /resources)"),
        ))
    }

    async fn agent_total(&self, provider_id: &str) -> Result<Vec<Resource>, ActionError> {
        self.manager
            .agent_total(provider_id)
            .await
            .map_err(|e| match e {
                ManagerError::NotSubscribed { .. } => not_subscribed(),
                other => manager_stopped(other),
            })
    }

    /// Applies `operation` to the provider and remembers it.
    async fn submit(
        &self,
        provider: &str,
        provider_id: &str,
        operation: offer::Operation,
    ) -> Result<uuid::Uuid, ActionError> {
        let kind = operation_type(Some(&operation));
        let uuid = self
            .manager
            .apply_operation(provider_id, ApplyRequest::new(operation))
            .await
            .map_err(refused)?;
        tracing::info!(provider, operation_uuid = %uuid, r#type = kind, "operator operation applied through the embedded manager");
        self.remember(uuid, provider, None);
        Ok(uuid)
    }

    /// The answer to an applied operation: PENDING, or (with `wait`) its terminal record.
    async fn answer(
        &self,
        provider: &str,
        uuid: uuid::Uuid,
        kind: &str,
        wait: Option<Duration>,
    ) -> Result<OperationSummary, ActionError> {
        let Some(timeout) = wait else {
            return Ok(OperationSummary {
                provider: provider.to_owned(),
                operation_uuid: uuid.to_string(),
                r#type: kind.to_owned(),
                state: OperationState::OperationPending.as_str_name().to_owned(),
                message: None,
                framework_id: None,
                volume_id: None,
                converted_resources: Vec::new(),
                statuses: Vec::new(),
                last_error: None,
                next_retry: None,
            });
        };
        let view = self
            .manager
            .wait_terminal(uuid, timeout)
            .await
            .map_err(|e| match e {
                OperationError::Timeout { .. } => ActionError::new(
                    StatusCode::GATEWAY_TIMEOUT,
                    format!(
                        "operation {uuid} is not terminal after {}s; it goes on (GET /operations/{uuid})",
                        timeout.as_secs()
                    ),
                ),
                other => internal(&other),
            })?;
        let summary = self.summarize(provider, uuid, &view);
        self.remember(uuid, provider, Some(summary.clone()));
        Ok(summary)
    }

    /// Chooses an operation from the manager's total of the provider (under the
    /// provider's choice lock, until it is applied) and answers as [`Self::answer`].
    async fn choose_and_apply(
        &self,
        provider: &str,
        provider_id: &str,
        wait: Option<Duration>,
        choose: impl FnOnce(Vec<Resource>) -> Result<offer::Operation, ActionError>,
    ) -> Result<OperationSummary, ActionError> {
        let lock = self.choice_lock(provider_id);
        let guard = lock.lock().await;
        let operation = choose(self.agent_total(provider_id).await?)?;
        let kind = operation_type(Some(&operation));
        let uuid = Box::pin(self.submit(provider, provider_id, operation)).await?;
        drop(guard);
        Box::pin(self.answer(provider, uuid, kind, wait)).await
    }

    async fn create(&self, request: CreateDisk) -> Result<OperationSummary, ActionError> {
        // The route accepts only "mount" and "block".
        let target = match request.r#type.as_deref() {
            Some("block") => SourceType::Block,
            _ => SourceType::Mount,
        };
        let mib = request.size_bytes.div_ceil(MIB);
        let view = self.provider(request.provider.as_deref()).await?;
        let key = provider_key(&view.info);
        let id = provider_id(&view);
        let wait = wait_of(request.wait, request.timeout_seconds);
        Box::pin(self.choose_and_apply(&key, &id, wait, |total| {
            let source = choose_pool(&total, &request.profile, mib)?;
            Ok(offer::Operation {
                r#type: Some(offer::operation::Type::CreateDisk as i32),
                create_disk: Some(offer::operation::CreateDisk {
                    source,
                    target_type: target as i32,
                    target_profile: None,
                }),
                ..offer::Operation::default()
            })
        }))
        .await
    }

    async fn adopt(
        &self,
        request: CreateDisk,
        volume_id: String,
    ) -> Result<OperationSummary, ActionError> {
        let target = match request.r#type.as_deref() {
            Some("block") => SourceType::Block,
            _ => SourceType::Mount,
        };
        let wait = wait_of(request.wait, request.timeout_seconds);
        // The provider offers a new volume in its next UPDATE_STATE, which reaches the
        // manager a moment after the provider's own total shows it.
        let deadline = tokio::time::Instant::now() + ADOPT_WITHIN;
        let (key, id, disk) = loop {
            match self
                .find_disk(request.provider.as_deref(), &volume_id)
                .await
            {
                Err(e)
                    if e.status == StatusCode::NOT_FOUND
                        && tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                found => break found?,
            }
        };
        let operation = offer::Operation {
            r#type: Some(offer::operation::Type::CreateDisk as i32),
            create_disk: Some(offer::operation::CreateDisk {
                source: disk,
                target_type: target as i32,
                target_profile: Some(request.profile),
            }),
            ..offer::Operation::default()
        };
        let kind = operation_type(Some(&operation));
        let uuid = Box::pin(self.submit(&key, &id, operation)).await?;
        Box::pin(self.answer(&key, uuid, kind, wait)).await
    }

    async fn destroy(&self, request: DestroyDisk) -> Result<OperationSummary, ActionError> {
        let wait = wait_of(request.wait, request.timeout_seconds);
        let (key, id, disk) = self
            .find_disk(request.provider.as_deref(), &request.volume_id)
            .await?;
        if disk.disk.as_ref().is_some_and(|d| d.persistence.is_some()) {
            return Err(ActionError::field(
                StatusCode::CONFLICT,
                "volume_id",
                format!(
                    "disk '{}' holds a persistent volume: destroy the persistent volume first",
                    request.volume_id
                ),
            ));
        }
        let operation = offer::Operation {
            r#type: Some(offer::operation::Type::DestroyDisk as i32),
            destroy_disk: Some(offer::operation::DestroyDisk { source: disk }),
            ..offer::Operation::default()
        };
        let kind = operation_type(Some(&operation));
        let uuid = Box::pin(self.submit(&key, &id, operation)).await?;
        Box::pin(self.answer(&key, uuid, kind, wait)).await
    }

    async fn publish_disk(&self, request: VolumeRef) -> Result<(), ActionError> {
        let (_, _, disk) = self
            .find_disk(request.provider.as_deref(), &request.volume_id)
            .await?;
        self.manager.publish(vec![disk]).await.map_err(|e| match e {
            PublishError::NotSubscribed { .. }
            | PublishError::ConnectionClosed { .. }
            | PublishError::Stopped => ActionError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                DisplayChain(&e).to_string(),
            ),
            PublishError::Failed { .. } => ActionError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!(
                    "{}; the provider's log says why (GET /volumes/{} shows its last error)",
                    DisplayChain(&e),
                    request.volume_id
                ),
            ),
        })
    }

    /// The operations of `GET /operations`: the manager's tables, then the operations
    /// applied here that it no longer lists.
    async fn operations_list(&self) -> Vec<OperationSummary> {
        let views = self.manager.providers().await.unwrap_or_default();
        let mut out: Vec<OperationSummary> = views
            .iter()
            .flat_map(|v| {
                let key = provider_key(&v.info);
                v.operations
                    .iter()
                    .filter_map(move |op| self.summarize_listed(&key, op))
                    .collect::<Vec<_>>()
            })
            .collect();
        let listed: BTreeSet<String> = out.iter().map(|o| o.operation_uuid.clone()).collect();
        let recent: Vec<Recent> = self.recent().iter().cloned().collect();
        let mut unseen = Vec::new();
        for entry in recent {
            if listed.contains(&entry.uuid.to_string()) {
                continue;
            }
            match entry.terminal {
                Some(done) => out.push(done),
                None => unseen.push(entry),
            }
        }
        // Not in the manager's table and not seen terminal: acknowledged and removed
        // since (the manager answers for those at once), or pending on a provider that
        // is not subscribed right now. Asked all at once, under one short bound.
        let mut lookups = tokio::task::JoinSet::new();
        for entry in unseen {
            let manager = self.manager.clone();
            lookups.spawn(async move {
                let answer = manager.wait_terminal(entry.uuid, LOOKUP_BOUND).await;
                (entry, answer)
            });
        }
        while let Some(joined) = lookups.join_next().await {
            let Ok((entry, answer)) = joined else {
                continue;
            };
            match answer {
                Ok(view) => {
                    let summary = self.summarize(&entry.provider, entry.uuid, &view);
                    self.remember(entry.uuid, &entry.provider, Some(summary.clone()));
                    out.push(summary);
                }
                // Dropped without a terminal status, or beyond what the manager
                // remembers: nothing will ever be known of it, so it is not asked again.
                Err(OperationError::Forgotten { .. } | OperationError::Unknown { .. }) => {
                    self.recent().retain(|r| r.uuid != entry.uuid);
                }
                Err(_) => {}
            }
        }
        out
    }

    /// The manager's record of operation `uuid` as the admin API shows it (the admin
    /// API's own conversion, so both modes show operations alike).
    fn summarize(
        &self,
        provider: &str,
        uuid: uuid::Uuid,
        view: &OperationView,
    ) -> OperationSummary {
        summarize(provider, uuid, view, self.acks_all)
    }

    fn summarize_listed(&self, provider: &str, view: &OperationView) -> Option<OperationSummary> {
        summarize_listed(provider, view, self.acks_all)
    }
}

impl ManagerActions for StandaloneActions {
    fn create_disk(
        &self,
        request: CreateDisk,
    ) -> BoxFuture<'_, Result<OperationSummary, ActionError>> {
        Box::pin(self.create(request))
    }

    fn destroy_disk(
        &self,
        request: DestroyDisk,
    ) -> BoxFuture<'_, Result<OperationSummary, ActionError>> {
        Box::pin(self.destroy(request))
    }

    fn adopt_disk(
        &self,
        request: CreateDisk,
        volume_id: String,
    ) -> BoxFuture<'_, Result<OperationSummary, ActionError>> {
        Box::pin(self.adopt(request, volume_id))
    }

    fn publish(&self, request: VolumeRef) -> BoxFuture<'_, Result<(), ActionError>> {
        Box::pin(self.publish_disk(request))
    }

    fn operations(&self) -> BoxFuture<'_, Vec<OperationSummary>> {
        Box::pin(self.operations_list())
    }

    fn snapshot(&self) -> BTreeMap<String, f64> {
        self.manager
            .metrics()
            .snapshot()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect()
    }

    fn register_metrics(&self, registry: &mut Registry) {
        self.manager.metrics().register(registry);
    }
}

/// How long a CREATE_DISK of a new volume waits for the manager to see it offered.
const ADOPT_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// `a, b` or `none`.
fn joined_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".to_owned()
    } else {
        items.join(", ")
    }
}

fn not_subscribed() -> ActionError {
    ActionError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "no resource provider has subscribed to the embedded manager yet; retry when GET /ready answers 200",
    )
}

fn manager_stopped(e: ManagerError) -> ActionError {
    ActionError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        DisplayChain(&e).to_string(),
    )
}

fn internal(e: &(dyn std::error::Error + 'static)) -> ActionError {
    ActionError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        DisplayChain(e).to_string(),
    )
}

/// The manager's refusal of an apply as the admin API's answer.
fn refused(e: OperationError) -> ActionError {
    match e {
        OperationError::NotSubscribed { .. }
        | OperationError::NoResourceVersion { .. }
        | OperationError::Send(_)
        | OperationError::Stopped => ActionError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            DisplayChain(&e).to_string(),
        ),
        // The view changed between the choice and the apply (another operation took the
        // resources meanwhile): the operator may retry.
        OperationError::Invalid { .. } => {
            ActionError::new(StatusCode::CONFLICT, DisplayChain(&e).to_string())
        }
        other => internal(&other),
    }
}

/// The wait of a request: `None` without `wait`, else its timeout (default 300 s; the
/// route refuses 0).
fn wait_of(wait: bool, timeout_seconds: Option<u64>) -> Option<Duration> {
    wait.then(|| timeout_seconds.map_or(DEFAULT_WAIT, Duration::from_secs))
}

fn provider_id(view: &SubscribedProvider) -> String {
    view.info
        .id
        .as_ref()
        .map(|id| id.value.clone())
        .unwrap_or_default()
}

fn source(r: &Resource) -> Option<&slrp_proto::mesos::v1::resource::disk_info::Source> {
    r.disk.as_ref().and_then(|d| d.source.as_ref())
}

/// `disk.source.id`, if any.
fn disk_id(r: &Resource) -> Option<&str> {
    source(r).and_then(|s| s.id.as_deref())
}

/// The profile of a storage pool (RAW, a profile, no id: Mesos's `isStoragePool`).
fn pool_profile(r: &Resource) -> Option<&str> {
    source(r)
        .filter(|s| s.r#type == SourceType::Raw as i32 && s.id.is_none())
        .and_then(|s| s.profile.as_deref())
}

fn scalar_mb(r: &Resource) -> f64 {
    r.scalar.as_ref().map_or(0.0, |s| s.value)
}

/// A part of `mib` MB of a storage pool of `profile` with that much free, as a framework
/// takes it from an offer (reservations and provider id kept).
fn choose_pool(total: &[Resource], profile: &str, mib: u64) -> Result<Resource, ActionError> {
    // Exact for any size a file system can hold: MB values up to 2^53.
    #[allow(clippy::cast_precision_loss)]
    let wanted = mib as f64;
    let pools: Vec<&Resource> = total
        .iter()
        .filter(|r| pool_profile(r) == Some(profile))
        .collect();
    if pools.is_empty() {
        let known: BTreeSet<String> = total
            .iter()
            .filter_map(|r| {
                pool_profile(r).or_else(|| source(r).and_then(|s| s.profile.as_deref()))
            })
            .map(str::to_owned)
            .collect();
        return Err(ActionError::field(
            StatusCode::NOT_FOUND,
            "profile",
            format!(
                "no storage pool of profile '{profile}' (the provider's profiles: {}; a profile whose pool is full has none)",
                joined_or_none(&known.into_iter().collect::<Vec<_>>())
            ),
        ));
    }
    let Some(pool) = pools.iter().find(|r| scalar_mb(r) >= wanted) else {
        let largest = pools.iter().map(|r| scalar_mb(r)).fold(0.0, f64::max);
        return Err(ActionError::field(
            StatusCode::CONFLICT,
            "size_bytes",
            format!(
                "not enough free space in the pool of profile '{profile}': {mib} MiB asked, {largest} MiB free"
            ),
        ));
    };
    let mut part = (*pool).clone();
    part.allocation_info = None;
    if let Some(scalar) = &mut part.scalar {
        scalar.value = wanted;
    }
    Ok(part)
}

/// `CREATE_DISK`, … of an operation; `UNKNOWN` when the manager does not know its info.
fn operation_type(info: Option<&offer::Operation>) -> &'static str {
    info.and_then(|i| i.r#type)
        .and_then(|t| offer::operation::Type::try_from(t).ok())
        .map_or("UNKNOWN", |t| t.as_str_name())
}

/// The manager's record of operation `uuid` in the admin API's form; `acks_all` when the
/// manager acknowledges every status it holds.
fn summarize(
    provider: &str,
    uuid: uuid::Uuid,
    view: &OperationView,
    acks_all: bool,
) -> OperationSummary {
    let unknown = offer::Operation::default();
    operation_summary(OperationParts {
        provider,
        uuid,
        framework_id: view.framework_id.as_ref().map(|f| f.value.as_str()),
        info: view.info.as_ref().unwrap_or(&unknown),
        latest: &view.latest_status,
        statuses: &view.statuses,
        acknowledged: acks_all.then_some(view.statuses.len()),
    })
}

/// [`summarize`] of a record of the manager's table (`None` for a uuid that is not 16
/// bytes, which no provider of this process sends).
fn summarize_listed(
    provider: &str,
    view: &OperationView,
    acks_all: bool,
) -> Option<OperationSummary> {
    let uuid = uuid::Uuid::from_slice(&view.operation_uuid.value).ok()?;
    Some(summarize(provider, uuid, view, acks_all))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;

    fn resource(v: serde_json::Value) -> Resource {
        slrp_wire::json::from_value(v).unwrap()
    }

    fn pool(profile: &str, mb: f64) -> Resource {
        resource(json!({
            "name": "disk", "type": "SCALAR", "scalar": {"value": mb},
            "provider_id": {"value": "rp"},
            "reservations": [{"type": "DYNAMIC", "role": "storage"}],
            "disk": {"source": {"type": "RAW", "vendor": "v", "profile": profile}},
        }))
    }

    fn disk(id: &str, profile: &str) -> Resource {
        resource(json!({
            "name": "disk", "type": "SCALAR", "scalar": {"value": 10.0},
            "provider_id": {"value": "rp"},
            "disk": {"source": {"type": "MOUNT", "vendor": "v", "id": id, "profile": profile}},
        }))
    }

    #[test]
    fn a_pool_part_keeps_the_reservations_and_provider_and_takes_whole_mib() {
        let total = vec![
            pool("mount", 100.0),
            pool("block", 5.0),
            pool("block", 50.0),
        ];
        let part = choose_pool(&total, "block", 20).unwrap();
        let v = slrp_wire::json::to_value(&part).unwrap();
        assert_eq!(v["scalar"]["value"], 20.0);
        assert_eq!(v["provider_id"]["value"], "rp");
        assert_eq!(v["reservations"][0]["role"], "storage");
        assert_eq!(v["disk"]["source"]["profile"], "block");
    }

    #[test]
    fn too_large_a_disk_is_a_conflict_naming_the_free_space() {
        let e = choose_pool(&[pool("mount", 100.0)], "mount", 101).unwrap_err();
        assert_eq!(e.status, StatusCode::CONFLICT);
        assert_eq!(e.body.field.as_deref(), Some("size_bytes"));
        assert!(e.body.error.contains("100 MiB free"), "{}", e.body.error);
    }

    #[test]
    fn an_unknown_profile_is_not_found_listing_the_known_ones() {
        let total = vec![pool("mount", 100.0), disk("vol-1", "ext4")];
        let e = choose_pool(&total, "fast", 1).unwrap_err();
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        assert_eq!(e.body.field.as_deref(), Some("profile"));
        assert!(e.body.error.contains("ext4, mount"), "{}", e.body.error);
    }

    #[test]
    fn a_finished_create_names_its_volume_and_a_destroy_its_source() {
        let uuid = uuid::Uuid::new_v4();
        let created = disk("vol-7", "mount");
        let view = OperationView {
            operation_uuid: slrp_proto::mesos::v1::Uuid {
                value: uuid.as_bytes().to_vec(),
            },
            framework_id: None,
            info: Some(offer::Operation {
                r#type: Some(offer::operation::Type::CreateDisk as i32),
                ..offer::Operation::default()
            }),
            latest_status: slrp_proto::mesos::v1::OperationStatus {
                state: OperationState::OperationFinished as i32,
                converted_resources: vec![created.clone()],
                ..Default::default()
            },
            statuses: vec![slrp_proto::mesos::v1::OperationStatus {
                state: OperationState::OperationFinished as i32,
                uuid: Some(slrp_proto::mesos::v1::Uuid {
                    value: uuid.as_bytes().to_vec(),
                }),
                ..Default::default()
            }],
        };
        let s = summarize_listed("p", &view, true).unwrap();
        assert_eq!(s.operation_uuid, uuid.to_string());
        assert_eq!(s.r#type, "CREATE_DISK");
        assert_eq!(s.state, "OPERATION_FINISHED");
        assert_eq!(s.volume_id.as_deref(), Some("vol-7"));
        assert_eq!(s.statuses[0].status_uuid, Some(uuid.to_string()));
        assert_eq!(s.statuses[0].acknowledged, Some(true));
        let unknown = summarize_listed("p", &view, false).unwrap();
        assert_eq!(unknown.statuses[0].acknowledged, None);
        assert!(s.is_terminal());

        let mut pending = view.clone();
        pending.latest_status.state = OperationState::OperationPending as i32;
        pending.latest_status.converted_resources.clear();
        assert_eq!(summarize("p", uuid, &pending, true).volume_id, None);

        let mut destroy = view;
        destroy.info = Some(offer::Operation {
            r#type: Some(offer::operation::Type::DestroyDisk as i32),
            destroy_disk: Some(offer::operation::DestroyDisk { source: created }),
            ..offer::Operation::default()
        });
        destroy.latest_status.converted_resources.clear();
        assert_eq!(
            summarize("p", uuid, &destroy, true).volume_id.as_deref(),
            Some("vol-7")
        );
        let mut short = destroy;
        short.operation_uuid.value.truncate(3);
        assert_eq!(summarize_listed("p", &short, true), None);
    }

    #[test]
    fn a_wait_defaults_to_five_minutes_and_none_without_wait() {
        assert_eq!(wait_of(false, Some(7)), None);
        assert_eq!(wait_of(true, None), Some(DEFAULT_WAIT));
        assert_eq!(wait_of(true, Some(7)), Some(Duration::from_secs(7)));
    }
}
