//! The snapshot routes of `docs/admin-api.md` (issue #24): take and delete snapshots of
//! disks (standalone mode; Mesos has no such operation) and list them (both modes).

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use slrp_core::volume::{SnapshotRecord, VolumeErrorKind};
use slrp_csi::VolumeId;
use slrp_types::DisplayChain;

use super::action_routes::parse_body;
use super::api::{CreateSnapshot, SnapshotDeleted, SnapshotRef, SnapshotSummary};
use super::{
    AdminState, Refusal, bad_field, field_refusal, refusal, unknown_volume, volume_error_status,
    volume_state,
};

/// CSI's bound on names (the spec's "128 bytes" for ids and names).
const MAX_NAME_BYTES: usize = 128;

fn summary(provider: &str, s: SnapshotRecord) -> SnapshotSummary {
    SnapshotSummary {
        provider: provider.to_owned(),
        snapshot_id: s.id,
        name: s.name,
        source_volume_id: s.source_volume_id.as_str().to_owned(),
        size_bytes: u64::try_from(s.size_bytes).unwrap_or(0),
        created_at: s.created_at,
        ready_to_use: s.ready_to_use,
        deleting: s.deleting,
        delete_failed: s.delete_failed,
    }
}

/// 403 under `slrp run`, naming the route.
fn standalone_only(state: &AdminState, route: &str) -> Result<(), Refusal> {
    if state.extras.actions.is_some() {
        return Ok(());
    }
    Err(refusal(
        StatusCode::FORBIDDEN,
        format!(
            "{route} is offered only by 'slrp standalone': Mesos has no offer operation for snapshots, and under 'slrp run' the master owns what is done with a disk (docs/mesos-differences.md)"
        ),
    ))
}

/// A volume manager refusal: 409 for what the request cannot do as asked (no
/// CREATE_DELETE_SNAPSHOT, a name taken, a plugin refusal), else the usual status.
fn volume_refusal(e: &slrp_core::volume::VolumeError) -> Refusal {
    let status = match e.kind() {
        VolumeErrorKind::Invalid | VolumeErrorKind::Conflict | VolumeErrorKind::Rejected => {
            StatusCode::CONFLICT
        }
        kind => volume_error_status(kind),
    };
    refusal(status, DisplayChain(e).to_string())
}

pub(super) async fn create_snapshot(
    State(state): State<AdminState>,
    body: Bytes,
) -> Result<Json<SnapshotSummary>, Refusal> {
    let request: CreateSnapshot = parse_body(
        &body,
        r#"{"provider": "<type>.<name>", "volume_id": "<id>", "name": "<name>"}"#,
    )?;
    if request.volume_id.is_empty() {
        return Err(bad_field("volume_id", "'volume_id' is empty"));
    }
    let name = match request.name {
        Some(name)
            if name.is_empty()
                || name.len() > MAX_NAME_BYTES
                || name.chars().any(char::is_control) =>
        {
            return Err(bad_field(
                "name",
                format!("'name' must be 1 to {MAX_NAME_BYTES} bytes without control characters"),
            ));
        }
        Some(name) => name,
        None => format!("slrp-{}", uuid::Uuid::new_v4()),
    };
    let provider = state.provider(request.provider.as_deref())?;
    standalone_only(&state, "POST /snapshots")?;
    let volumes = AdminState::volume_manager(provider)?;
    let id = VolumeId::new(request.volume_id);
    let key = provider.key();
    if volume_state(&volumes, &id).await?.is_none() {
        return Err(unknown_volume(&key, &id));
    }
    let taken = volumes.snapshot(&id, name).await.map_err(|e| {
        tracing::warn!(provider = %key, volume_id = %id, error = %DisplayChain(&e), "the operator's snapshot failed");
        volume_refusal(&e)
    })?;
    // The copy took space from the pool: the resources follow.
    provider.request_reconciliation();
    tracing::info!(provider = %key, volume_id = %id, snapshot = %taken.id, "snapshot taken by the operator");
    Ok(Json(summary(&key, taken)))
}

pub(super) async fn snapshots(
    State(state): State<AdminState>,
) -> Result<Json<Vec<SnapshotSummary>>, Refusal> {
    let mut all = Vec::new();
    for provider in state.providers.iter() {
        let Some(volumes) = provider.volumes() else {
            continue;
        };
        let key = provider.key();
        let records = volumes.snapshots().await.map_err(|e| {
            refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("provider '{key}': {}", DisplayChain(&e)),
            )
        })?;
        all.extend(records.into_iter().map(|s| summary(&key, s)));
    }
    Ok(Json(all))
}

pub(super) async fn delete_snapshot(
    State(state): State<AdminState>,
    body: Bytes,
) -> Result<Json<SnapshotDeleted>, Refusal> {
    let request: SnapshotRef = parse_body(
        &body,
        r#"{"provider": "<type>.<name>", "snapshot_id": "<id>"}"#,
    )?;
    if request.snapshot_id.is_empty() {
        return Err(bad_field("snapshot_id", "'snapshot_id' is empty"));
    }
    let provider = state.provider(request.provider.as_deref())?;
    standalone_only(&state, "POST /snapshots/delete")?;
    let volumes = AdminState::volume_manager(provider)?;
    let key = provider.key();
    let id = request.snapshot_id;
    let deleted = volumes.delete_snapshot(&id).await.map_err(|e| {
        tracing::warn!(provider = %key, snapshot = %id, error = %DisplayChain(&e), "the operator's snapshot deletion failed");
        volume_refusal(&e)
    })?;
    if !deleted {
        return Err(field_refusal(
            StatusCode::NOT_FOUND,
            "snapshot_id",
            format!("provider '{key}' has no snapshot '{id}'"),
        ));
    }
    provider.request_reconciliation();
    tracing::info!(provider = %key, snapshot = %id, "snapshot deleted by the operator");
    Ok(Json(SnapshotDeleted { snapshot_id: id }))
}

/// How long a restore or clone waits for the provider to offer the new volume before it
/// can turn it into a disk: a reconciliation is asked for at once.
const OFFERED_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

/// `POST /disks` with `from_snapshot` or `from_disk` (standalone): the volume manager
/// creates the volume with that content (CreateVolume with `volume_content_source`,
/// behind its intent like every create), the provider offers it as a RAW disk with its
/// id, and a CREATE_DISK with `target_profile` turns that into the profile's MOUNT or
/// BLOCK disk (Mesos's import of a pre-existing volume; the validation compares the
/// volume with the profile). Mesos's CREATE_DISK has no content source, hence the detour;
/// a crash between the two leaves a RAW disk without a profile, shown by `resources`,
/// which a CREATE_DISK or a DESTROY_DISK settles.
pub(super) async fn create_from(
    provider: &std::sync::Arc<dyn super::AdminProvider>,
    actions: &std::sync::Arc<dyn super::ManagerActions>,
    request: super::api::CreateDisk,
) -> Result<axum::response::Response, Refusal> {
    use slrp_csi::ContentSource;
    let source = match (&request.from_snapshot, &request.from_disk) {
        (Some(_), Some(_)) => {
            return Err(bad_field(
                "from_disk",
                "give 'from_snapshot' or 'from_disk', not both",
            ));
        }
        (Some(snapshot), None) => ContentSource::Snapshot(snapshot.clone()),
        (None, Some(disk)) => ContentSource::Volume(VolumeId::new(disk.clone())),
        (None, None) => {
            return Err(refusal(
                StatusCode::INTERNAL_SERVER_ERROR,
                "create_from without a source",
            ));
        }
    };
    let volumes = AdminState::volume_manager(provider)?;
    let key = provider.key();
    match &source {
        ContentSource::Snapshot(id) => {
            let snapshots = volumes.snapshots().await.map_err(|e| volume_refusal(&e))?;
            if !snapshots.iter().any(|s| s.id == *id && !s.deleting) {
                return Err(field_refusal(
                    StatusCode::NOT_FOUND,
                    "from_snapshot",
                    format!(
                        "provider '{key}' has no snapshot '{id}' (`slrp ctl snapshots` lists them)"
                    ),
                ));
            }
        }
        ContentSource::Volume(id) => {
            if volume_state(&volumes, id).await?.is_none() {
                let mut r = unknown_volume(&key, id);
                r.body.field = Some("from_disk".to_owned());
                return Err(r);
            }
        }
    }
    let Some(info) = provider.profile_info(&request.profile).await else {
        return Err(field_refusal(
            StatusCode::NOT_FOUND,
            "profile",
            format!("provider '{key}' has no profile '{}'", request.profile),
        ));
    };
    let capability = slrp_csi::VolumeCapability::from_mesos(&info.capability).map_err(|e| {
        refusal(
            StatusCode::CONFLICT,
            format!("profile '{}': {}", request.profile, DisplayChain(&e)),
        )
    })?;
    use slrp_proto::mesos::v1::resource::disk_info::source::Type as DiskSourceType;
    let kind = if capability.disk_source_type() == DiskSourceType::Block {
        "block"
    } else {
        "mount"
    };
    if request.r#type.as_deref().is_some_and(|t| t != kind) {
        return Err(bad_field(
            "type",
            format!("profile '{}' makes {kind} disks", request.profile),
        ));
    }
    let bytes = request.size_bytes.div_ceil(1 << 20) << 20;
    let Ok(required_bytes) = i64::try_from(bytes) else {
        return Err(bad_field("size_bytes", "'size_bytes' is too large"));
    };
    let create = slrp_core::volume::CreateVolume {
        name: format!("slrp-{}", uuid::Uuid::new_v4()),
        required_bytes,
        limit_bytes: 0,
        capability,
        parameters: info.parameters,
        content_source: Some(source.clone()),
    };
    let created = volumes.create(create).await.map_err(|e| {
        tracing::warn!(provider = %key, source = ?source, error = %DisplayChain(&e), "the operator's restore or clone failed");
        volume_refusal(&e)
    })?;
    let id = created.id.as_str().to_owned();
    tracing::info!(provider = %key, volume_id = %id, source = ?source, "volume restored or cloned; offering it as a disk");
    provider.request_reconciliation();
    if !provider.wait_disk(&id, true, OFFERED_WITHIN).await {
        return Err(refusal(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "volume {id} was created, but provider '{key}' did not offer it within {} s; it shows in `slrp ctl resources` as a disk without a profile once offered: `slrp ctl destroy-disk {id}` removes it",
                OFFERED_WITHIN.as_secs()
            ),
        ));
    }
    let wait = request.wait;
    let profile = request.profile.clone();
    let mut request = request;
    request.r#type = Some(kind.to_owned());
    let op = actions.adopt_disk(request, id.clone()).await?;
    if wait && op.state == "OPERATION_FINISHED" {
        // Read your own writes: the disk was offered already, without a profile; the
        // answer waits until it is offered with the profile.
        let disk = id.clone();
        let holds = Box::new(move |total: &slrp_core::provider::resources::Resources| {
            total.iter().any(|r| {
                super::read_routes::source_id(r) == Some(disk.as_str())
                    && super::read_routes::disk_profile(r) == Some(profile.as_str())
            })
        });
        if !provider.wait_total(holds, OFFERED_WITHIN).await {
            tracing::warn!(provider = %key, volume_id = %id, "the provider's resources did not show the new disk's profile in time");
        }
    }
    Ok(super::action_routes::operation_answer(wait, op))
}
