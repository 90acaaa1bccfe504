//! The admin API's JSON bodies (`docs/admin-api.md`), shared by the endpoint and by
//! `slrp ctl`, so that both sides agree on every field by construction.
//!
//! Field names are snake_case; optional fields are left out when unset (and accepted as
//! missing or `null`), so that a newer daemon can add fields without breaking an older
//! `slrp ctl`. Mesos objects (`Resource`) are carried in Mesos's own JSON form, as
//! `serde_json::Value`s made by `slrp_wire::json`.

use serde::{Deserialize, Serialize};
use slrp_core::provider::operations::TrackedOperation;
use slrp_proto::mesos::v1::{Operation, OperationState, OperationStatus, Resource, offer};

/// How the daemon runs: which actions the admin API offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// `slrp standalone`: the embedded manager plays agent and master, so the operator
    /// may create, destroy, publish and unpublish.
    Standalone,
    /// `slrp run`: a Mesos agent and master own the operations; the operator may only
    /// unpublish.
    Run,
}

/// Every refusal and failure: `{"error": "…", "field": "…"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong, with its cause chain; says what to do where that is known.
    pub error: String,
    /// The request field that was wrong (`"size_bytes"`, `"volume_id"`, …), when one was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// `GET /status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// How the daemon runs.
    pub mode: Mode,
    /// slrp's version (`CARGO_PKG_VERSION`).
    pub version: String,
    /// The agent id the providers serve, once learnt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// Whether every provider is READY.
    pub ready: bool,
    /// One entry per configured provider, in configuration order.
    pub providers: Vec<ProviderSummary>,
}

/// One provider in [`Status`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProviderSummary {
    /// `<type>.<name>`.
    pub provider: String,
    /// The lifecycle state's Mesos name (`READY`, …) or the daemon's step
    /// (`WAITING_FOR_AGENT`, `STARTING_PLUGIN`, `FAILED`, `STOPPING`).
    pub state: String,
    /// Whether the provider is READY.
    pub ready: bool,
    /// The resource provider id, once the manager assigned one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_provider_id: Option<String>,
    /// Why the provider failed, or the last error it reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Operations tracked (pending, and terminal ones not yet acknowledged).
    #[serde(default)]
    pub operations: usize,
    /// Operations with a status update not yet acknowledged.
    #[serde(default)]
    pub unacknowledged: usize,
    /// Volumes the volume manager tracks (absent while it is not running).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes: Option<usize>,
}

/// One plugin in `GET /plugins`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PluginHealth {
    /// `<type>.<name>` of the provider the plugin serves.
    pub provider: String,
    /// The plugin's `<type>.<name>` from the ResourceProviderInfo.
    pub plugin: String,
    /// The CSI version spoken (`v1` or `v0`), once probed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub csi_version: Option<String>,
    /// Whether the last probe succeeded and the plugin's process runs.
    pub healthy: bool,
    /// Restarts of the plugin's process by the supervisor since slrp started.
    #[serde(default)]
    pub restarts: u64,
    /// The last probe or launch error, with its cause chain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The supervised container (a plugin may run controller and node apart); absent
    /// for a plugin slrp does not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
}

/// One volume in `GET /volumes` and `GET /volumes/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VolumeSummary {
    /// `<type>.<name>` of the provider.
    pub provider: String,
    /// The CSI volume id.
    pub volume_id: String,
    /// The volume's state name as Mesos checkpoints it (`CREATED`, `NODE_READY`,
    /// `PUBLISHED`, …).
    pub state: String,
    /// `mount` or `block`, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r#type: Option<String>,
    /// Bytes, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    /// The disk profile the volume was created or imported with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// Where the volume is staged, while it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staging_path: Option<String>,
    /// Where the volume is published (a directory for MOUNT, a device file for BLOCK),
    /// while it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_path: Option<String>,
    /// Why the volume's last deletion failed; else the last CSI call on it that failed and
    /// left it in flight (`<RPC>: <cause chain>`, e.g. a failed NodeStageVolume of a
    /// publish), until the volume completes a transition. Kept in the daemon's memory
    /// only: a restart forgets it (a failed deletion's reason is in the volume record and
    /// survives).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// What the volume health poller knows of the volume (docs/admin-api.md, "Volume
    /// health"); absent when the plugin is asked nothing about it (it advertises none of
    /// the calls, or the poller is disabled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<VolumeHealthSummary>,
}

/// Total, available and used amounts of one unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AmountsSummary {
    /// Total.
    pub total: u64,
    /// Available.
    pub available: u64,
    /// Used.
    pub used: u64,
}

/// A volume's last `NodeGetVolumeStats` usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageSummary {
    /// Bytes, when reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<AmountsSummary>,
    /// Inodes, when reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inodes: Option<AmountsSummary>,
}

impl UsageSummary {
    /// Used bytes and their share of the total in percent (`None` without a byte sample;
    /// no share for a total of 0).
    pub fn used_bytes(&self) -> Option<(u64, Option<f64>)> {
        let b = self.bytes?;
        #[allow(clippy::cast_precision_loss)]
        let share = (b.total > 0).then(|| b.used as f64 * 100.0 / b.total as f64);
        Some((b.used, share))
    }
}

/// What the volume health poller knows of one volume.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VolumeHealthSummary {
    /// `ok`, `abnormal`, or `unknown` (the plugin gave no condition, or none yet).
    pub status: String,
    /// The plugin's condition message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The CSI call that reported the condition (`NodeGetVolumeStats`,
    /// `ControllerGetVolume`, `ListVolumes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The last usage sample (published volumes only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageSummary>,
    /// When the last sample was taken (RFC 3339, seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampled_at: Option<String>,
    /// How old the last sample is, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age_seconds: Option<f64>,
    /// The poller's last call about the volume failed with this (until one succeeds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl VolumeHealthSummary {
    /// The summary of `h` at `now`.
    pub fn of(h: &crate::health::VolumeHealth, now: tokio::time::Instant) -> Self {
        let amounts = |a: crate::health::Amounts| AmountsSummary {
            total: a.total,
            available: a.available,
            used: a.used,
        };
        Self {
            status: match h.status() {
                crate::health::HealthStatus::Ok => "ok",
                crate::health::HealthStatus::Abnormal => "abnormal",
                crate::health::HealthStatus::Unknown => "unknown",
            }
            .to_owned(),
            message: h.condition.as_ref().map(|c| c.message.clone()),
            source: h.condition.as_ref().map(|c| c.source.to_owned()),
            usage: h.usage.map(|u| UsageSummary {
                bytes: u.bytes.map(amounts),
                inodes: u.inodes.map(amounts),
            }),
            sampled_at: h.age(now).and_then(|age| {
                let at = std::time::SystemTime::now().checked_sub(age)?;
                Some(humantime::format_rfc3339_seconds(at).to_string())
            }),
            age_seconds: h.age(now).map(|a| a.as_secs_f64()),
            error: h.last_error.clone(),
        }
    }

    /// `ok`, `abnormal` or `-` (unknown), as the `HEALTH` column shows it.
    pub fn column(&self) -> &str {
        match self.status.as_str() {
            "ok" | "abnormal" => &self.status,
            _ => "-",
        }
    }
}

/// One status update in [`OperationSummary::statuses`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusSummary {
    /// The status update's uuid (canonical hyphenated form), absent for an unreliable one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_uuid: Option<String>,
    /// `OPERATION_PENDING`, `OPERATION_FINISHED`, …
    pub state: String,
    /// The status message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Whether the manager acknowledged it (absent where unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acknowledged: Option<bool>,
}

/// One operation in `GET /operations` and `GET /operations/{uuid}`, and the answer of
/// the actions that start one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationSummary {
    /// `<type>.<name>` of the provider.
    pub provider: String,
    /// The operation uuid (canonical hyphenated form).
    pub operation_uuid: String,
    /// `CREATE_DISK`, `DESTROY_DISK`, `RESERVE`, … (Mesos's `Offer.Operation.Type` names).
    pub r#type: String,
    /// The latest state: `OPERATION_PENDING`, `OPERATION_FINISHED`, `OPERATION_FAILED`, …
    pub state: String,
    /// The latest status's message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The framework, for a framework's operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub framework_id: Option<String>,
    /// The volume the operation created (CREATE_DISK, once finished) or consumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_id: Option<String>,
    /// The converted resources of a finished operation, in Mesos's JSON form.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub converted_resources: Vec<serde_json::Value>,
    /// Every status update of the operation's stream, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub statuses: Vec<StatusSummary>,
    /// While a pending operation's CSI call waits for a retry (a CreateVolume that
    /// timed out, or whose plugin was unavailable): the last attempt's error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When that call's next attempt goes out (RFC 3339, UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_retry: Option<String>,
}

impl OperationSummary {
    /// Whether the latest state is terminal (Mesos `protobuf::isTerminalState`).
    #[must_use]
    pub fn is_terminal(&self) -> bool {
        !matches!(
            self.state.as_str(),
            "OPERATION_PENDING" | "OPERATION_UNREACHABLE" | "OPERATION_RECOVERING"
        )
    }
}

/// `POST /disks`: create a disk from a profile's pool (standalone mode).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateDisk {
    /// `<type>.<name>`; may be left out when the daemon runs one provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The disk profile whose pool the disk comes from.
    pub profile: String,
    /// The size in bytes; rounded up to whole MiB (Mesos counts disk in MB of 2^20 bytes).
    pub size_bytes: u64,
    /// `mount` (default) or `block`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r#type: Option<String>,
    /// Answer only when the operation is terminal (else at once, PENDING).
    #[serde(default)]
    pub wait: bool,
    /// How long to wait when `wait` (default 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
    /// Restore this snapshot into the new disk (its id, `GET /snapshots`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_snapshot: Option<String>,
    /// Clone this disk (its volume id) into the new disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_disk: Option<String>,
}

/// `POST /disks/destroy`: destroy a disk (standalone mode).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DestroyDisk {
    /// `<type>.<name>`; may be left out when the daemon runs one provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The CSI volume id (`disk.source.id`).
    pub volume_id: String,
    /// Answer only when the operation is terminal (else at once, PENDING).
    #[serde(default)]
    pub wait: bool,
    /// How long to wait when `wait` (default 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
}

/// `POST /disks/expand`: grow a disk (standalone mode; Mesos has no such operation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpandDisk {
    /// `<type>.<name>`; may be left out when the daemon runs one provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The CSI volume id (`disk.source.id`).
    pub volume_id: String,
    /// The new size; rounded up to whole MiB (Mesos counts disk in MB of 2^20 bytes).
    pub size_bytes: u64,
    /// Answer only once the provider's resources show the disk at its new size (the
    /// plugin's calls are made before the answer either way).
    #[serde(default)]
    pub wait: bool,
    /// How long to wait for the resources when `wait` (default 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
}

/// The answer of `POST /disks/expand`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskExpanded {
    /// The CSI volume id.
    pub volume_id: String,
    /// The size asked for, in whole MiB, as the disk is offered from now on.
    pub size_bytes: u64,
    /// The volume's capacity as the plugin reported it (it may round up).
    pub capacity_bytes: u64,
    /// NodeExpandVolume is still owed: the file system grows when the volume is next
    /// published (it is not published now).
    pub node_expansion_owed: bool,
    /// The disk's size in the provider's resources when the answer was made: the new size
    /// once the reconciliation that follows the growth is done (with `wait`, unless the
    /// wait timed out), else the old one.
    pub offered_bytes: u64,
}

/// `POST /snapshots`: snapshot a disk (standalone mode).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshot {
    /// `<type>.<name>`; may be left out when the daemon runs one provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The CSI volume id of the disk.
    pub volume_id: String,
    /// The snapshot's name (CreateSnapshot's idempotency key: the same name for the same
    /// disk answers the snapshot taken before); default a fresh `slrp-<uuid>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// `POST /snapshots/delete`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRef {
    /// `<type>.<name>`; may be left out when the daemon runs one provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The plugin's snapshot id.
    pub snapshot_id: String,
}

/// One snapshot in `GET /snapshots` and the answer of `POST /snapshots`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotSummary {
    /// `<type>.<name>` of its provider.
    pub provider: String,
    /// The plugin's id.
    pub snapshot_id: String,
    /// The name it was taken with.
    pub name: String,
    /// The disk it was taken of (it may be destroyed since).
    pub source_volume_id: String,
    /// Its size in bytes as the plugin reported it (0: unknown).
    pub size_bytes: u64,
    /// When it was taken, seconds since the Unix epoch.
    pub created_at: i64,
    /// Whether a disk can be created from it.
    pub ready_to_use: bool,
    /// A deletion is in progress (it finishes at the next start if interrupted).
    #[serde(default)]
    pub deleting: bool,
    /// Why the last deletion failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_failed: Option<String>,
}

/// The answer of `POST /snapshots/delete`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotDeleted {
    /// The plugin's id.
    pub snapshot_id: String,
}

/// `POST /volumes/publish` and `POST /volumes/unpublish`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeRef {
    /// `<type>.<name>`; may be left out when the daemon runs one provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The CSI volume id.
    pub volume_id: String,
}

/// The answer of `POST /volumes/publish` and `POST /volumes/unpublish`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeChanged {
    /// The CSI volume id.
    pub volume_id: String,
    /// The volume's state afterwards.
    pub state: String,
    /// Where it is published (publish only): a directory for MOUNT, a device file for
    /// BLOCK.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// One profile in `GET /profiles`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileSummary {
    /// The profile's name.
    pub name: String,
    /// `mount` or `block`.
    pub r#type: String,
    /// The file system a MOUNT profile asks for, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs_type: Option<String>,
    /// The CSI parameters the profile passes to the plugin.
    #[serde(default)]
    pub parameters: std::collections::BTreeMap<String, String>,
}

/// The parts of an operation [`operation_summary`] reads: what a provider tracks
/// (`TrackedOperation`) and what a manager records (`mesos.v1.Operation`) both give them.
#[derive(Debug, Clone, Copy)]
pub struct OperationParts<'a> {
    /// `<type>.<name>` of the provider.
    pub provider: &'a str,
    /// The operation uuid.
    pub uuid: uuid::Uuid,
    /// The framework that asked for it, if any.
    pub framework_id: Option<&'a str>,
    /// What was asked.
    pub info: &'a offer::Operation,
    /// The newest status.
    pub latest: &'a OperationStatus,
    /// The status stream, oldest first.
    pub statuses: &'a [OperationStatus],
    /// How many of `statuses` (a prefix) are acknowledged; `None` where unknown.
    pub acknowledged: Option<usize>,
}

/// The admin API's summary of an operation: Mesos's enum names (`CREATE_DISK`,
/// `OPERATION_FINISHED`), canonical hyphenated uuids, resources in Mesos's JSON form.
#[must_use]
pub fn operation_summary(parts: OperationParts<'_>) -> OperationSummary {
    let OperationParts {
        provider,
        uuid,
        framework_id,
        info,
        latest,
        statuses,
        acknowledged,
    } = parts;
    let r#type = info
        .r#type
        .and_then(|t| offer::operation::Type::try_from(t).ok())
        .unwrap_or(offer::operation::Type::Unknown)
        .as_str_name()
        .to_owned();
    OperationSummary {
        provider: provider.to_owned(),
        operation_uuid: uuid.hyphenated().to_string(),
        r#type,
        state: state_name(latest.state),
        message: latest.message.clone(),
        framework_id: framework_id.map(str::to_owned),
        volume_id: operation_volume(info, latest),
        converted_resources: latest
            .converted_resources
            .iter()
            .filter_map(|r| slrp_wire::json::to_value(r).ok())
            .collect(),
        statuses: statuses
            .iter()
            .enumerate()
            .map(|(i, s)| StatusSummary {
                status_uuid: s
                    .uuid
                    .as_ref()
                    .and_then(|u| uuid::Uuid::from_slice(&u.value).ok())
                    .map(|u| u.hyphenated().to_string()),
                state: state_name(s.state),
                message: s.message.clone(),
                acknowledged: acknowledged.map(|acked| i < acked),
            })
            .collect(),
        last_error: None,
        next_retry: None,
    }
}

/// [`operation_summary`] of a manager's `mesos.v1.Operation` (its `statuses` are the
/// stream; acknowledgements unknown). `None` if its uuid is not 16 bytes.
#[must_use]
pub fn summary_of_operation(provider: &str, op: &Operation) -> Option<OperationSummary> {
    let uuid = uuid::Uuid::from_slice(&op.uuid.value).ok()?;
    Some(operation_summary(OperationParts {
        provider,
        uuid,
        framework_id: op.framework_id.as_ref().map(|f| f.value.as_str()),
        info: &op.info,
        latest: &op.latest_status,
        statuses: &op.statuses,
        acknowledged: None,
    }))
}

/// [`operation_summary`] of an operation a provider tracks (its stream, with the
/// acknowledged prefix).
#[must_use]
pub fn tracked_summary(provider: &str, op: &TrackedOperation) -> OperationSummary {
    operation_summary(OperationParts {
        provider,
        uuid: op.uuid,
        framework_id: op.framework_id.as_ref().map(|f| f.value.as_str()),
        info: &op.info,
        latest: &op.latest_status,
        statuses: &op.stream,
        acknowledged: Some(op.acked),
    })
}

/// `OPERATION_PENDING`, …; the number for a state this build does not know.
fn state_name(state: i32) -> String {
    OperationState::try_from(state)
        .map_or_else(|_| state.to_string(), |s| s.as_str_name().to_owned())
}

/// The volume an operation created (CREATE_DISK, from its converted resources) or
/// consumed (the source of DESTROY_DISK and the disk operations).
fn operation_volume(info: &offer::Operation, latest: &OperationStatus) -> Option<String> {
    let id_of = |r: &Resource| {
        r.disk
            .as_ref()
            .and_then(|d| d.source.as_ref())
            .and_then(|s| s.id.clone())
    };
    latest
        .converted_resources
        .iter()
        .find_map(id_of)
        .or_else(|| info.destroy_disk.as_ref().and_then(|d| id_of(&d.source)))
        .or_else(|| info.create_disk.as_ref().and_then(|d| id_of(&d.source)))
        .or_else(|| info.grow_volume.as_ref().and_then(|d| id_of(&d.volume)))
        .or_else(|| info.shrink_volume.as_ref().and_then(|d| id_of(&d.volume)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn optional_fields_may_be_missing_and_are_left_out() {
        let op: OperationSummary = serde_json::from_str(
            r#"{"provider":"a.b","operation_uuid":"u","type":"CREATE_DISK","state":"OPERATION_PENDING"}"#,
        )
        .unwrap();
        assert!(!op.is_terminal());
        let text = serde_json::to_string(&op).unwrap();
        assert!(!text.contains("volume_id"), "{text}");
        assert!(!text.contains("statuses"), "{text}");
    }

    #[test]
    fn requests_name_an_unknown_field() {
        let e = serde_json::from_str::<CreateDisk>(r#"{"profile":"p","size_bytes":1,"sise":2}"#)
            .unwrap_err();
        assert!(e.to_string().contains("sise"), "{e}");
    }
}
