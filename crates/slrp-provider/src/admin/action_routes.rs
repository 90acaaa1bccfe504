//! The action routes of `docs/admin-api.md`: create-disk, destroy-disk and publish
//! through the embedded manager (standalone mode), unpublish through the volume manager
//! (both modes).

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use slrp_core::volume::{MountPaths, StateName, VolumeErrorKind};
use slrp_csi::VolumeId;
use slrp_types::DisplayChain;

use super::api::{
    CreateDisk, DestroyDisk, DiskExpanded, ExpandDisk, OperationSummary, VolumeChanged, VolumeRef,
};
use super::{
    AdminProvider, AdminState, ManagerActions, Refusal, bad_field, refusal, unknown_volume,
    volume_error_status, volume_records, volume_state,
};

/// The field a JSON error is about: the path where it stopped, or the field a
/// "missing field `x`" / "unknown field `x`" message names.
fn error_field(path: &str, error: &serde_json::Error) -> Option<String> {
    if path != "." && !path.is_empty() {
        return Some(path.to_owned());
    }
    let text = error.to_string();
    ["missing field `", "unknown field `"]
        .iter()
        .find_map(|lead| {
            let rest = text.split_once(lead)?.1;
            Some(rest.split_once('`')?.0.to_owned())
        })
}

/// Decodes a request body as `T` (`shape` says what it should look like): 400 naming
/// the field for malformed JSON, a wrong type, a missing or an unknown field.
pub(super) fn parse_body<T: DeserializeOwned>(body: &[u8], shape: &str) -> Result<T, Refusal> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let parsed = serde_path_to_error::deserialize::<_, T>(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        (error_field(&path, &inner), inner)
    });
    let parsed = parsed.and_then(|v| de.end().map(|()| v).map_err(|e| (None, e)));
    parsed.map_err(|(field, e)| {
        let error = format!("the body must be {shape}: {e}");
        match field {
            Some(field) => bad_field(&field, error),
            None => refusal(StatusCode::BAD_REQUEST, error),
        }
    })
}

/// The embedded manager, or 403 under `slrp run`.
fn manager<'a>(state: &'a AdminState, what: &str) -> Result<&'a Arc<dyn ManagerActions>, Refusal> {
    state.extras.actions.as_ref().ok_or_else(|| {
        refusal(
            StatusCode::FORBIDDEN,
            format!(
                "{what} is offered only by 'slrp standalone': under 'slrp run' the Mesos master and agent own the operations (only POST /volumes/unpublish is served)"
            ),
        )
    })
}

/// 503 unless `provider` is READY, saying what it is and why (its last error): an
/// operation sent to a provider before READY would be judged against resources it has
/// not reported yet (a "0 MiB free" that is no statement about space).
fn ready(provider: &Arc<dyn AdminProvider>) -> Result<(), Refusal> {
    if provider.is_ready() {
        return Ok(());
    }
    let why = provider
        .error()
        .map_or_else(String::new, |e| format!(": {e}"));
    Err(refusal(
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "provider '{}' is not READY (it is {}){why}",
            provider.key(),
            provider.state()
        ),
    ))
}

fn non_empty(field: &str, value: &str) -> Result<(), Refusal> {
    if value.is_empty() {
        return Err(bad_field(field, format!("'{field}' is empty")));
    }
    Ok(())
}

fn positive_timeout(timeout: Option<u64>) -> Result<(), Refusal> {
    if timeout == Some(0) {
        return Err(bad_field(
            "timeout_seconds",
            "'timeout_seconds' must be greater than zero",
        ));
    }
    Ok(())
}

/// 202 with the PENDING operation, or 200 with the terminal one after a wait.
pub(super) fn operation_answer(wait: bool, op: OperationSummary) -> Response {
    let status = if wait {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    (status, Json(op)).into_response()
}

pub(super) async fn create_disk(
    State(state): State<AdminState>,
    body: Bytes,
) -> Result<Response, Refusal> {
    let request: CreateDisk = parse_body(
        &body,
        r#"{"profile": "<name>", "size_bytes": <bytes>, "type": "mount"|"block", "wait": <bool>, "timeout_seconds": <seconds>}"#,
    )?;
    non_empty("profile", &request.profile)?;
    if request.size_bytes == 0 {
        return Err(bad_field(
            "size_bytes",
            "'size_bytes' must be greater than zero",
        ));
    }
    if let Some(kind) = &request.r#type
        && kind != "mount"
        && kind != "block"
    {
        return Err(bad_field(
            "type",
            format!("'type' is {kind:?}, not one of \"mount\", \"block\""),
        ));
    }
    positive_timeout(request.timeout_seconds)?;
    let provider = state.provider(request.provider.as_deref())?;
    let actions = manager(&state, "POST /disks")?;
    ready(provider)?;
    let wait = request.wait;
    let profiles = provider.profiles().await;
    let known = profiles.iter().find(|p| p.name == request.profile);
    let mut request = request;
    // Without a type the disk is what its profile says (the profile adaptor's view).
    if request.r#type.is_none() {
        request.r#type = known.map(|p| p.r#type.clone());
    }
    if request.from_snapshot.is_some() || request.from_disk.is_some() {
        if known.is_none() {
            return Err(field_refusal_404_profile(&provider.key(), &request.profile));
        }
        return super::snapshot_routes::create_from(provider, actions, request).await;
    }
    let (profile, mib) = (
        request.profile.clone(),
        request.size_bytes.div_ceil(1 << 20),
    );
    match actions.create_disk(request).await {
        Ok(op) => {
            if wait
                && op.state == "OPERATION_FINISHED"
                && let Some(id) = &op.volume_id
            {
                settle(provider, id, true).await;
            }
            Ok(operation_answer(wait, op))
        }
        // A pool that is exactly full has no RAW resource left, so the manager's view
        // knows no pool of the profile; the provider does: that is no space, not 404.
        Err(e)
            if known.is_some()
                && e.status == StatusCode::NOT_FOUND
                && e.body.field.as_deref() == Some("profile") =>
        {
            let mut r = refusal(
                StatusCode::CONFLICT,
                format!(
                    "not enough free space in the pool of profile '{profile}': {mib} MiB asked, 0 MiB free (a provider that has just become READY offers its pools a moment later)"
                ),
            );
            r.body.field = Some("size_bytes".to_owned());
            Err(r)
        }
        Err(e) => Err(e.into()),
    }
}

pub(super) async fn destroy_disk(
    State(state): State<AdminState>,
    body: Bytes,
) -> Result<Response, Refusal> {
    let request: DestroyDisk = parse_body(
        &body,
        r#"{"volume_id": "<id>", "wait": <bool>, "timeout_seconds": <seconds>}"#,
    )?;
    non_empty("volume_id", &request.volume_id)?;
    positive_timeout(request.timeout_seconds)?;
    let provider = state.provider(request.provider.as_deref())?;
    let actions = manager(&state, "POST /disks/destroy")?;
    ready(provider)?;
    refuse_in_use(provider, &request.volume_id).await?;
    let wait = request.wait;
    let id = request.volume_id.clone();
    let op = actions.destroy_disk(request).await?;
    if wait && op.state == "OPERATION_FINISHED" {
        settle(provider, &id, false).await;
    }
    Ok(operation_answer(wait, op))
}

/// How long a waited action's answer waits for the provider's total to show its effect:
/// twice the longest the provider takes to publish a changed total.
const SETTLE: std::time::Duration = crate::worker::STATUS_TOTAL_MAX_INTERVAL.saturating_mul(2);

/// Read your own writes: a waited CREATE_DISK (`present`) or DESTROY_DISK that FINISHED is
/// answered once the provider's total, which `GET /resources` and the profiles of
/// `GET /volumes` read, shows the disk `id` (or no longer does). The provider publishes a
/// changed total a moment after the operation's status (`status_total_delay`), so without
/// this the next `slrp ctl resources` could miss it. Bounded by [`SETTLE`]; past it the
/// answer goes out as it is, with a warning.
pub(super) async fn settle(provider: &Arc<dyn AdminProvider>, id: &str, present: bool) {
    if !provider.wait_disk(id, present, SETTLE).await {
        tracing::warn!(provider = %provider.key(), volume_id = id, present, "the provider's resources did not show the finished operation in time");
    }
}

/// 409 while volume `volume_id` is staged or published: DESTROY_DISK would unmount it
/// under whoever writes through it and delete the data. A Mesos master refuses to
/// destroy under a running task; in standalone mode the operator's publish stands in
/// for that task. A volume the volume manager does not track is the actions' 404.
async fn refuse_in_use(provider: &Arc<dyn AdminProvider>, volume_id: &str) -> Result<(), Refusal> {
    use slrp_core::volume::StateName;
    let volumes = AdminState::volume_manager(provider)?;
    let id = VolumeId::new(volume_id.to_owned());
    let Some(record) = volume_records(&volumes)
        .await?
        .into_iter()
        .find(|r| r.id == id)
    else {
        return Ok(());
    };
    let name = record.state.name();
    // A deletion under way already unpublishes on its own: asking again is harmless.
    if record.deleting
        || matches!(
            name,
            StateName::Created
                | StateName::NodeReady
                | StateName::ControllerPublish
                | StateName::ControllerUnpublish
        )
    {
        return Ok(());
    }
    let place = match name {
        StateName::Published | StateName::NodePublish | StateName::NodeUnpublish => provider
            .mount_paths()
            .and_then(|p| p.target(&id).ok())
            .map_or_else(
                || format!("is published ({name})"),
                |p| format!("is published at {}", p.display()),
            ),
        _ => format!("is staged ({name})"),
    };
    let mut r = refusal(
        StatusCode::CONFLICT,
        format!("volume {id} {place}: unpublish it first (`slrp ctl unpublish {id}`)"),
    );
    r.body.field = Some("volume_id".to_owned());
    Err(r)
}

const VOLUME_REF: &str = r#"{"provider": "<type>.<name>", "volume_id": "<id>"}"#;

/// The volume a [`VolumeRef`] names, on its provider's running volume manager.
struct Target<'a> {
    provider: &'a Arc<dyn AdminProvider>,
    volumes: slrp_core::volume::VolumeManagerHandle,
    /// Where that volume manager mounts, read together with it: the provider's paths may
    /// go away (a plugin restart) while the request runs.
    paths: Option<MountPaths>,
    id: VolumeId,
}

/// The provider and volume a [`VolumeRef`] names, with the provider's running volume
/// manager; 404 if the volume is not tracked.
async fn volume_of<'a>(state: &'a AdminState, request: &VolumeRef) -> Result<Target<'a>, Refusal> {
    non_empty("volume_id", &request.volume_id)?;
    let provider = state.provider(request.provider.as_deref())?;
    let volumes = AdminState::volume_manager(provider)?;
    let paths = provider.mount_paths();
    let id = VolumeId::new(request.volume_id.clone());
    if volume_state(&volumes, &id).await?.is_none() {
        return Err(unknown_volume(&provider.key(), &id));
    }
    Ok(Target {
        provider,
        volumes,
        paths,
        id,
    })
}

pub(super) async fn publish(
    State(state): State<AdminState>,
    body: Bytes,
) -> Result<Json<VolumeChanged>, Refusal> {
    let request: VolumeRef = parse_body(&body, VOLUME_REF)?;
    let actions = manager(&state, "POST /volumes/publish")?;
    let Target {
        provider,
        volumes,
        paths,
        id,
    } = volume_of(&state, &request).await?;
    ready(provider)?;
    actions.publish(request).await?;
    let key = provider.key();
    let record = volume_records(&volumes)
        .await?
        .into_iter()
        .find(|r| r.id == id)
        .ok_or_else(|| unknown_volume(&key, &id))?;
    // The target of the volume manager that published it, and only while its record says
    // it is published there (an unpublish may have come in between).
    let path = paths
        .filter(|_| record.state.name() == StateName::Published)
        .and_then(|p| p.target(&record.id).ok())
        .map(|p| p.to_string_lossy().into_owned());
    tracing::info!(provider = %key, volume_id = %id, path = ?path, "volume published by the operator");
    Ok(Json(VolumeChanged {
        volume_id: id.as_str().to_owned(),
        state: record.state.name().as_str().to_owned(),
        path,
    }))
}

pub(super) async fn unpublish(
    State(state): State<AdminState>,
    body: Bytes,
) -> Result<Json<VolumeChanged>, Refusal> {
    let request: VolumeRef = parse_body(&body, VOLUME_REF)?;
    let Target {
        provider,
        volumes,
        id,
        ..
    } = volume_of(&state, &request).await?;
    let key = provider.key();
    if let Err(e) = volumes.unpublish(&id).await {
        let error = DisplayChain(&e).to_string();
        tracing::warn!(provider = %key, volume_id = %id, %error, "the operator's unpublish failed");
        return Err(refusal(volume_error_status(e.kind()), error));
    }
    match volume_state(&volumes, &id).await? {
        Some(after) => {
            tracing::info!(provider = %key, volume_id = %id, state = after, "volume unpublished by the operator");
            Ok(Json(VolumeChanged {
                volume_id: id.as_str().to_owned(),
                state: after.to_owned(),
                path: None,
            }))
        }
        // Destroyed meanwhile (DESTROY_DISK unpublishes too).
        None => Err(unknown_volume(&key, &id)),
    }
}

/// `POST /disks/expand` (standalone): grows disk `volume_id` through the volume manager
/// (ControllerExpandVolume, then NodeExpandVolume for a published volume), then asks the
/// provider to reconcile, which offers the disk at its new size and the pool with the
/// space the plugin took out. Mesos has no offer operation for this, so `slrp run`
/// refuses it (docs/mesos-differences.md).
pub(super) async fn expand_disk(
    State(state): State<AdminState>,
    body: Bytes,
) -> Result<Json<DiskExpanded>, Refusal> {
    let request: ExpandDisk = parse_body(
        &body,
        r#"{"volume_id": "<id>", "size_bytes": <bytes>, "wait": <bool>, "timeout_seconds": <seconds>}"#,
    )?;
    non_empty("volume_id", &request.volume_id)?;
    if request.size_bytes == 0 {
        return Err(bad_field(
            "size_bytes",
            "'size_bytes' must be greater than zero",
        ));
    }
    positive_timeout(request.timeout_seconds)?;
    let provider = state.provider(request.provider.as_deref())?;
    if state.extras.actions.is_none() {
        return Err(refusal(
            StatusCode::FORBIDDEN,
            "POST /disks/expand is offered only by 'slrp standalone': Mesos has no offer operation that grows a resource provider's disk, and under 'slrp run' a framework may hold the disk at its size (docs/mesos-differences.md)",
        ));
    }
    ready(provider)?;
    let volumes = AdminState::volume_manager(provider)?;
    let id = VolumeId::new(request.volume_id.clone());
    let key = provider.key();
    if volume_state(&volumes, &id).await?.is_none() {
        // Offered but not tracked (a pre-existing volume no CREATE_DISK took yet): the
        // volume manager has nothing to grow.
        return Err(unknown_volume(&key, &id));
    }
    let total = provider.total();
    let disk = total
        .iter()
        .find(|r| super::read_routes::source_id(r) == Some(id.as_str()))
        .ok_or_else(|| {
            let mut r = refusal(
                StatusCode::NOT_FOUND,
                format!("provider '{key}' offers no disk '{id}'"),
            );
            r.body.field = Some("volume_id".to_owned());
            r
        })?;
    let mib = request.size_bytes.div_ceil(1 << 20);
    let bytes = mib << 20;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let current = disk.scalar.map_or(0, |s| s.value.max(0.0) as u64);
    if mib < current {
        return Err(field_conflict(
            "size_bytes",
            format!(
                "disk {id} is {current} MiB; {mib} MiB would shrink it, and disks do not shrink"
            ),
        ));
    }
    if let Some(profile) = super::read_routes::disk_profile(disk) {
        let free = pool_free_mib(&total, profile);
        let more = mib - current;
        if more > free {
            return Err(field_conflict(
                "size_bytes",
                format!(
                    "not enough free space in the pool of profile '{profile}': {more} MiB more asked for disk {id}, {free} MiB free"
                ),
            ));
        }
    }
    let Ok(target) = i64::try_from(bytes) else {
        return Err(bad_field("size_bytes", "'size_bytes' is too large"));
    };
    let grown = match volumes.expand(&id, target).await {
        Ok(info) => info,
        Err(e) => {
            let error = DisplayChain(&e).to_string();
            tracing::warn!(provider = %key, volume_id = %id, %error, "the operator's expansion failed");
            let status = match e.kind() {
                VolumeErrorKind::Invalid
                | VolumeErrorKind::Conflict
                | VolumeErrorKind::Rejected => StatusCode::CONFLICT,
                kind => volume_error_status(kind),
            };
            return Err(refusal(status, error));
        }
    };
    provider.request_reconciliation();
    let owed = volume_records(&volumes)
        .await?
        .into_iter()
        .find(|r| r.id == id)
        .is_some_and(|r| r.expansion.is_some_and(|e| e.node_owed));
    tracing::info!(provider = %key, volume_id = %id, mib, node_expansion_owed = owed, "disk expanded by the operator");
    let within = if request.wait {
        std::time::Duration::from_secs(request.timeout_seconds.unwrap_or(300))
    } else {
        std::time::Duration::ZERO
    };
    #[allow(clippy::cast_precision_loss)]
    let (disk, want) = (id.as_str().to_owned(), mib as f64);
    let holds = Box::new(move |total: &slrp_core::provider::resources::Resources| {
        super::disk_mb(total, &disk) >= want
    });
    provider.wait_total(holds, within).await;
    let offered = super::disk_mb(&provider.total(), id.as_str());
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let offered_bytes = (offered.max(0.0) as u64) << 20;
    if request.wait && offered_bytes < bytes {
        tracing::warn!(provider = %key, volume_id = %id, "the provider's resources did not show the grown disk in time");
    }
    Ok(Json(DiskExpanded {
        volume_id: id.as_str().to_owned(),
        size_bytes: bytes,
        capacity_bytes: u64::try_from(grown.capacity_bytes).unwrap_or(0),
        node_expansion_owed: owed,
        offered_bytes,
    }))
}

/// 404 for a profile the provider does not know.
fn field_refusal_404_profile(key: &str, profile: &str) -> Refusal {
    super::field_refusal(
        StatusCode::NOT_FOUND,
        "profile",
        format!("provider '{key}' has no profile '{profile}' (`slrp ctl profiles` lists them)"),
    )
}

/// 409 naming `field`.
fn field_conflict(field: &str, message: String) -> Refusal {
    let mut r = refusal(StatusCode::CONFLICT, message);
    r.body.field = Some(field.to_owned());
    r
}

/// The free space (whole MiB) of the storage pool of `profile` in `total`: its RAW
/// resources without an id, as Mesos offers them.
fn pool_free_mib(total: &[slrp_proto::mesos::v1::Resource], profile: &str) -> u64 {
    let mb: f64 = total
        .iter()
        .filter(|r| {
            super::read_routes::source_id(r).is_none()
                && super::read_routes::disk_profile(r) == Some(profile)
        })
        .filter_map(|r| r.scalar.map(|s| s.value))
        .sum();
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let mib = mb.max(0.0) as u64;
    mib
}
