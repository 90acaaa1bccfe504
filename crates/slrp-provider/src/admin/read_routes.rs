//! The read routes of `docs/admin-api.md`: status, resources, volumes, operations,
//! profiles, plugins.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::Json;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use slrp_core::volume::{MountPaths, RefusedCreate, StateName, VolumeRecord};
use slrp_csi::answer::shown;
use slrp_csi::{AccessType, VolumeId};
use slrp_proto::mesos::v1::Resource;
use slrp_types::DisplayChain;

use super::api::{self, OperationSummary, VolumeSummary};
use super::{AdminProvider, AdminState, Refusal, field_refusal, refusal, volume_records};

/// The one path parameter of a route, percent-decoded. One that does not decode (say,
/// `%9a`: not UTF-8) is refused with the API's JSON error like every other refusal, not
/// with axum's plain-text one (found by the `admin_api` fuzz target).
pub(super) struct Segment(String);

impl<S: Send + Sync> FromRequestParts<S> for Segment {
    type Rejection = Refusal;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Path::<String>::from_request_parts(parts, state).await {
            Ok(Path(segment)) => Ok(Self(segment)),
            Err(rejection) => Err(refusal(
                StatusCode::BAD_REQUEST,
                format!("the request path: {}", rejection.body_text()),
            )),
        }
    }
}

pub(super) async fn status(State(state): State<AdminState>) -> Json<api::Status> {
    let mut providers = Vec::with_capacity(state.providers.len());
    for p in state.providers.iter() {
        let (operations, unacknowledged) = p.operation_counts();
        let volumes = match p.volumes() {
            Some(handle) => handle.volumes().await.ok().map(|v| v.len()),
            None => None,
        };
        providers.push(api::ProviderSummary {
            provider: p.key(),
            state: p.state(),
            ready: p.is_ready(),
            resource_provider_id: p.provider_id(),
            error: p.error(),
            operations,
            unacknowledged,
            volumes,
        });
    }
    Json(api::Status {
        mode: state.extras.mode,
        version: env!("CARGO_PKG_VERSION").to_owned(),
        agent_id: state.providers.iter().find_map(|p| p.agent_id()),
        ready: providers.iter().all(|p| p.ready),
        providers,
    })
}

pub(super) async fn resources(
    State(state): State<AdminState>,
) -> Result<Json<Vec<serde_json::Value>>, Refusal> {
    let mut all = Vec::new();
    for p in state.providers.iter() {
        for r in p.total() {
            let value = slrp_wire::json::to_value(&r).map_err(|e| {
                tracing::error!(provider = %p.key(), error = %DisplayChain(&e), "a resource does not render as JSON");
                refusal(StatusCode::INTERNAL_SERVER_ERROR, DisplayChain(&e).to_string())
            })?;
            all.push(value);
        }
    }
    Ok(Json(all))
}

/// The `disk.source.id` of a disk resource.
pub(crate) fn source_id(r: &Resource) -> Option<&str> {
    r.disk.as_ref()?.source.as_ref()?.id.as_deref()
}

/// The `disk.source.profile` of a disk resource.
pub(crate) fn disk_profile(r: &Resource) -> Option<&str> {
    r.disk.as_ref()?.source.as_ref()?.profile.as_deref()
}

/// One volume manager record as the admin API shows it; the profile comes from the
/// provider's resources (the record does not keep it).
fn summary(
    provider: &dyn AdminProvider,
    record: &VolumeRecord,
    total: &[Resource],
    paths: Option<&MountPaths>,
) -> VolumeSummary {
    let state = record.state.name();
    let staged = matches!(
        state,
        StateName::NodeStage
            | StateName::VolReady
            | StateName::NodePublish
            | StateName::Published
            | StateName::NodeUnpublish
            | StateName::NodeUnstage
    );
    let published = matches!(state, StateName::Published | StateName::NodeUnpublish);
    let path_of = |f: fn(&MountPaths, &VolumeId) -> Result<std::path::PathBuf, _>| {
        paths
            .and_then(|p| f(p, &record.id).ok())
            .map(|p| p.to_string_lossy().into_owned())
    };
    let profile = total
        .iter()
        .filter(|r| source_id(r) == Some(record.id.as_str()))
        .find_map(|r| r.disk.as_ref()?.source.as_ref()?.profile.clone());
    VolumeSummary {
        provider: provider.key(),
        volume_id: record.id.as_str().to_owned(),
        state: state.as_str().to_owned(),
        r#type: Some(
            match record.spec.capability.access_type {
                AccessType::Block => "block",
                AccessType::Mount { .. } => "mount",
            }
            .to_owned(),
        ),
        capacity_bytes: u64::try_from(record.capacity_bytes).ok().filter(|b| *b > 0),
        profile,
        staging_path: if staged {
            path_of(MountPaths::staging)
        } else {
            None
        },
        target_path: if published {
            path_of(MountPaths::target)
        } else {
            None
        },
        // A failed deletion says more (the volume is no longer being deleted).
        last_error: record
            .delete_failed
            .clone()
            .or_else(|| provider.volume_error(&record.id)),
        health: provider
            .volume_health(&record.id)
            .map(|h| api::VolumeHealthSummary::of(&h, tokio::time::Instant::now())),
    }
}

/// The volumes of one provider (none while its volume manager does not run).
pub(super) async fn provider_volumes(
    p: &Arc<dyn AdminProvider>,
) -> Result<Vec<VolumeSummary>, Refusal> {
    let Some(handle) = p.volumes() else {
        return Ok(Vec::new());
    };
    let records = volume_records(&handle).await?;
    let total = p.total();
    let paths = p.mount_paths();
    let mut all: Vec<VolumeSummary> = records
        .iter()
        .map(|r| summary(p.as_ref(), r, &total, paths.as_ref()))
        .collect();
    let refused = handle.refused_creates().await.map_err(|e| {
        refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            DisplayChain(&e).to_string(),
        )
    })?;
    all.extend(refused.iter().map(|r| refused_summary(p.as_ref(), r)));
    Ok(all)
}

/// A refused CreateVolume answer as a volume line (state `CREATE_REFUSED`): the volume the
/// plugin named (escaped and cut: it may be anything), and what became of it.
fn refused_summary(provider: &dyn AdminProvider, r: &RefusedCreate) -> VolumeSummary {
    VolumeSummary {
        provider: provider.key(),
        volume_id: r
            .cleanup
            .volume_id()
            .map_or_else(String::new, |id| shown(id.as_str())),
        state: "CREATE_REFUSED".to_owned(),
        r#type: Some(
            match r.request.capability.access_type {
                AccessType::Block => "block",
                AccessType::Mount { .. } => "mount",
            }
            .to_owned(),
        ),
        capacity_bytes: None,
        profile: None,
        staging_path: None,
        target_path: None,
        last_error: Some(format!("create '{}': {r}", r.request.name)),
        health: None,
    }
}

pub(super) async fn volumes(
    State(state): State<AdminState>,
) -> Result<Json<Vec<VolumeSummary>>, Refusal> {
    let mut all = Vec::new();
    for p in state.providers.iter() {
        all.extend(provider_volumes(p).await?);
    }
    Ok(Json(all))
}

pub(super) async fn volume(
    State(state): State<AdminState>,
    Segment(id): Segment,
) -> Result<Json<VolumeSummary>, Refusal> {
    for p in state.providers.iter() {
        if let Some(found) = provider_volumes(p)
            .await?
            .into_iter()
            .find(|v| v.volume_id == id)
        {
            return Ok(Json(found));
        }
    }
    Err(field_refusal(
        StatusCode::NOT_FOUND,
        "volume_id",
        format!("no provider tracks a volume '{id}'"),
    ))
}

/// Every provider's tracked operations, then (standalone) the manager's record of the
/// others, deduplicated by uuid: a provider's record knows the acknowledgements.
async fn all_operations(state: &AdminState) -> Result<Vec<OperationSummary>, Refusal> {
    let mut all = Vec::new();
    for p in state.providers.iter() {
        let key = p.key();
        let ops = p.operations().await.map_err(|e| {
            tracing::error!(provider = %key, error = %DisplayChain(&e), "reading the provider's operations failed");
            refusal(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("provider '{key}': {}", DisplayChain(&e)),
            )
        })?;
        all.extend(ops.iter().map(|op| {
            let mut summary = api::tracked_summary(&key, op);
            // A CREATE_DISK's CreateVolume is named after its operation.
            if !summary.is_terminal()
                && let Some(retry) = p.create_retry(&summary.operation_uuid)
            {
                summary.last_error = Some(retry.last_error);
                summary.next_retry =
                    Some(humantime::format_rfc3339_seconds(retry.next_retry).to_string());
            }
            summary
        }));
    }
    if let Some(actions) = &state.extras.actions {
        let mut seen: BTreeSet<String> = all.iter().map(|o| o.operation_uuid.clone()).collect();
        for op in actions.operations().await {
            if seen.insert(op.operation_uuid.clone()) {
                all.push(op);
            }
        }
    }
    Ok(all)
}

pub(super) async fn operations(
    State(state): State<AdminState>,
) -> Result<Json<Vec<OperationSummary>>, Refusal> {
    all_operations(&state).await.map(Json)
}

pub(super) async fn operation(
    State(state): State<AdminState>,
    Segment(uuid): Segment,
) -> Result<Json<OperationSummary>, Refusal> {
    let Ok(parsed) = uuid::Uuid::parse_str(&uuid) else {
        return Err(super::bad_field(
            "uuid",
            format!("'{uuid}' is not an operation uuid"),
        ));
    };
    let wanted = parsed.hyphenated().to_string();
    all_operations(&state)
        .await?
        .into_iter()
        .find(|o| o.operation_uuid == wanted)
        .map(Json)
        .ok_or_else(|| {
            field_refusal(
                StatusCode::NOT_FOUND,
                "uuid",
                format!("no operation '{wanted}' is known"),
            )
        })
}

pub(super) async fn profiles(State(state): State<AdminState>) -> Json<Vec<api::ProfileSummary>> {
    let mut seen = BTreeSet::new();
    let mut all = Vec::new();
    for p in state.providers.iter() {
        for profile in p.profiles().await {
            if seen.insert(profile.name.clone()) {
                all.push(profile);
            }
        }
    }
    all.sort_by(|a, b| a.name.cmp(&b.name));
    Json(all)
}

pub(super) async fn plugins(State(state): State<AdminState>) -> Json<Vec<api::PluginHealth>> {
    Json(state.providers.iter().flat_map(|p| p.plugins()).collect())
}
