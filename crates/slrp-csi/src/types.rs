//! Domain types of the CSI client: what the rest of slrp sees instead of `csi.v0`/`csi.v1`.
//!
//! Everything here is version-neutral. Fields that only one CSI version knows are either
//! optional (`None`/empty when the plugin speaks the other version) or rejected with
//! [`crate::CsiError::Unsupported`] when a request needs them and the plugin cannot take them.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// A string map as CSI uses it (`parameters`, `volume_context`, `publish_context`).
///
/// Ordered so that human output and JSON are stable.
pub type StringMap = BTreeMap<String, String>;

/// Which CSI package a plugin serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CsiVersion {
    /// `csi.v0` (spec 0.2 and 0.3).
    V0,
    /// `csi.v1` (spec 1.x).
    V1,
}

impl CsiVersion {
    /// The version as Mesos spells it (`"v0"`, `"v1"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V0 => "v0",
            Self::V1 => "v1",
        }
    }
}

impl fmt::Display for CsiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Identifier a plugin assigned to a volume (`Volume.volume_id`, v0 `Volume.id`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct VolumeId(String);

impl VolumeId {
    /// Wraps a plugin-assigned id.
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    /// The id as sent on the wire.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for VolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for VolumeId {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl From<&str> for VolumeId {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

/// Secrets passed to a plugin (`secrets`, v0 `*_secrets`).
///
/// `Debug` never shows the values, so a request can be logged with `?req`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secrets(StringMap);

impl Secrets {
    /// Wraps a map of secret values.
    pub fn new(map: StringMap) -> Self {
        Self(map)
    }

    /// Whether there are no secrets.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The secret values, for transports and fakes that must send or check them. Never
    /// log the result.
    pub fn expose(&self) -> &StringMap {
        &self.0
    }

    pub(crate) fn to_proto(&self) -> std::collections::HashMap<String, String> {
        self.0.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Keys are not secret and help debugging; values are.
        f.debug_map()
            .entries(self.0.keys().map(|k| (k, "<redacted>")))
            .finish()
    }
}

/// `GetPluginInfo` result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PluginInfo {
    /// Plugin name (domain notation in v1, reverse-domain in v0).
    pub name: String,
    /// Vendor version string.
    pub vendor_version: String,
    /// Opaque vendor data.
    pub manifest: StringMap,
}

/// `GetPluginCapabilities` result.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PluginCapabilities {
    /// `CONTROLLER_SERVICE`.
    pub controller_service: bool,
    /// `VOLUME_ACCESSIBILITY_CONSTRAINTS` (v0 `ACCESSIBILITY_CONSTRAINTS`).
    pub accessibility_constraints: bool,
    /// `GROUP_CONTROLLER_SERVICE` (v1 only).
    pub group_controller_service: bool,
    /// Volume expansion `ONLINE` (v1 only).
    pub expansion_online: bool,
    /// Volume expansion `OFFLINE` (v1 only).
    pub expansion_offline: bool,
}

/// `ControllerGetCapabilities` result. Unknown capability values are ignored (spec §4.4).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ControllerCapabilities {
    /// `CREATE_DELETE_VOLUME`.
    pub create_delete_volume: bool,
    /// `PUBLISH_UNPUBLISH_VOLUME`.
    pub publish_unpublish_volume: bool,
    /// `LIST_VOLUMES`.
    pub list_volumes: bool,
    /// `GET_CAPACITY`.
    pub get_capacity: bool,
    /// `CREATE_DELETE_SNAPSHOT`.
    pub create_delete_snapshot: bool,
    /// `LIST_SNAPSHOTS`.
    pub list_snapshots: bool,
    /// `CLONE_VOLUME` (v1 only).
    pub clone_volume: bool,
    /// `PUBLISH_READONLY` (v1 only).
    pub publish_readonly: bool,
    /// `EXPAND_VOLUME` (v1 only).
    pub expand_volume: bool,
    /// `GET_VOLUME`: `ControllerGetVolume` is served (v1 only).
    pub get_volume: bool,
    /// `VOLUME_CONDITION`: `ControllerGetVolume` and `ListVolumes` entries carry
    /// `status.volume_condition` (v1 only).
    pub volume_condition: bool,
}

/// `NodeGetCapabilities` result.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeCapabilities {
    /// `STAGE_UNSTAGE_VOLUME`.
    pub stage_unstage_volume: bool,
    /// `GET_VOLUME_STATS` (v1 only).
    pub get_volume_stats: bool,
    /// `EXPAND_VOLUME` (v1 only).
    pub expand_volume: bool,
    /// `VOLUME_CONDITION`: `NodeGetVolumeStats` carries `volume_condition` (v1 only).
    pub volume_condition: bool,
}

/// Everything a plugin says it can do: what the volume manager plans its transitions
/// with (spec §4.4). Services the plugin does not run report all-false.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CsiCapabilities {
    /// `GetPluginCapabilities`.
    pub plugin: PluginCapabilities,
    /// `ControllerGetCapabilities` (all false without `CONTROLLER_SERVICE`).
    pub controller: ControllerCapabilities,
    /// `NodeGetCapabilities`.
    pub node: NodeCapabilities,
}

impl CsiCapabilities {
    /// Whether `ControllerPublishVolume`/`ControllerUnpublishVolume` are served
    /// (`PUBLISH_UNPUBLISH_VOLUME`); without it attach/detach are in-memory no-ops.
    pub fn controller_publish(&self) -> bool {
        self.controller.publish_unpublish_volume
    }

    /// Whether `NodeStageVolume`/`NodeUnstageVolume` are served (`STAGE_UNSTAGE_VOLUME`);
    /// without it stage/unstage are in-memory no-ops and no staging path is sent.
    pub fn node_stage(&self) -> bool {
        self.node.stage_unstage_volume
    }

    /// A set with only the two bits that decide volume transitions, the rest false
    /// (for planning and tests).
    #[must_use]
    pub fn with_publish_stage(controller_publish: bool, node_stage: bool) -> Self {
        let mut caps = Self::default();
        caps.controller.publish_unpublish_volume = controller_publish;
        caps.node.stage_unstage_volume = node_stage;
        caps
    }
}

/// `NodeGetInfo` result (v0 0.2 plugins: from `NodeGetId`, with the other fields empty).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeInfo {
    /// Node id to pass to `ControllerPublishVolume`.
    pub node_id: String,
    /// Maximum number of volumes on this node; 0 = no limit reported.
    pub max_volumes_per_node: i64,
    /// Topology segments of this node, if reported.
    pub accessible_topology: Option<StringMap>,
}

pub use slrp_types::capability::{AccessMode, AccessType, VolumeCapability};

/// A CSI volume as returned by `CreateVolume` and `ListVolumes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Volume {
    /// Plugin-assigned id.
    pub volume_id: VolumeId,
    /// Capacity in bytes; 0 = unknown.
    pub capacity_bytes: i64,
    /// Opaque context to pass back on later calls (v0 `attributes`).
    pub volume_context: StringMap,
}

/// `CreateVolume` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateVolumeRequest {
    /// Idempotency name (Mesos: the operation UUID).
    pub name: String,
    /// `capacity_range.required_bytes`; 0 = unset.
    pub required_bytes: i64,
    /// `capacity_range.limit_bytes`; 0 = unset.
    pub limit_bytes: i64,
    /// Requested capabilities.
    pub capabilities: Vec<VolumeCapability>,
    /// Opaque plugin parameters.
    pub parameters: StringMap,
    /// Secrets for the call.
    pub secrets: Secrets,
    /// What the new volume holds at first (`volume_content_source`; v1 only).
    pub content_source: Option<ContentSource>,
}

/// Where a new volume's contents come from (`volume_content_source`): a restore from a
/// snapshot or a clone of a volume.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContentSource {
    /// A snapshot's id.
    Snapshot(String),
    /// A volume's id.
    Volume(VolumeId),
}

/// `CreateSnapshot` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateSnapshotRequest {
    /// Idempotency name: the same name and source give the same snapshot.
    pub name: String,
    /// The volume to snapshot.
    pub source_volume_id: VolumeId,
    /// Opaque plugin parameters.
    pub parameters: StringMap,
}

/// A snapshot as the plugin describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The plugin's id.
    pub snapshot_id: String,
    /// The volume it was taken of.
    pub source_volume_id: VolumeId,
    /// Its size in bytes (0: unknown).
    pub size_bytes: i64,
    /// When it was taken, seconds since the Unix epoch, if the plugin says.
    pub creation_time: Option<i64>,
    /// Whether it can be restored from now.
    pub ready_to_use: bool,
}

/// One page of `ListSnapshots`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SnapshotPage {
    /// Snapshots on this page.
    pub snapshots: Vec<Snapshot>,
    /// Token for the next page; `None` on the last page.
    pub next_token: Option<String>,
}

/// One page of `ListVolumes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VolumePage {
    /// Volumes on this page.
    pub volumes: Vec<Volume>,
    /// Token for the next page; `None` on the last page.
    pub next_token: Option<String>,
}

/// `GetCapacity` result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Capacity {
    /// Bytes available for new volumes with the given capability and parameters.
    pub available_bytes: i64,
    /// Largest single volume the plugin could create, if reported (v1 only).
    pub maximum_volume_size: Option<i64>,
}

/// `ValidateVolumeCapabilities` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidateRequest {
    /// Volume to check.
    pub volume_id: VolumeId,
    /// Capabilities to confirm.
    pub capabilities: Vec<VolumeCapability>,
    /// Volume context from `CreateVolume`.
    pub volume_context: StringMap,
    /// Creation parameters (v1 only; ignored with a warning for v0, as Mesos does).
    pub parameters: StringMap,
}

/// `ValidateVolumeCapabilities` outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Validation {
    /// v1: `confirmed` is set; v0: `supported` is true.
    pub confirmed: bool,
    /// Plugin's explanation, if any.
    pub message: String,
    /// v1: what the plugin confirmed, for the caller to compare with what it asked
    /// (Mesos does, spec §4.5). `None` for v0 (only `supported`) and when not confirmed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confirmed_fields: Option<Confirmed>,
}

/// The `confirmed` message of a v1 `ValidateVolumeCapabilitiesResponse`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Confirmed {
    /// The volume context the plugin confirmed.
    pub volume_context: StringMap,
    /// The capabilities it confirmed (ones slrp cannot represent are left out: they
    /// cannot equal a requested one).
    pub capabilities: Vec<VolumeCapability>,
    /// The parameters it confirmed.
    pub parameters: StringMap,
}

/// `ControllerPublishVolume` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerPublishRequest {
    /// Volume to attach.
    pub volume_id: VolumeId,
    /// Node from `NodeGetInfo`.
    pub node_id: String,
    /// Capability the volume will be used with.
    pub capability: VolumeCapability,
    /// Publish read-only.
    pub readonly: bool,
    /// Volume context from `CreateVolume`.
    pub volume_context: StringMap,
    /// Secrets for the call.
    pub secrets: Secrets,
}

/// `NodeStageVolume` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStageRequest {
    /// Volume to stage.
    pub volume_id: VolumeId,
    /// `publish_context` from `ControllerPublishVolume` (v0 `publish_info`).
    pub publish_context: StringMap,
    /// Global staging path.
    pub staging_target_path: String,
    /// Capability the volume will be used with.
    pub capability: VolumeCapability,
    /// Volume context from `CreateVolume`.
    pub volume_context: StringMap,
    /// Secrets for the call.
    pub secrets: Secrets,
}

/// `NodeExpandVolume` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeExpandRequest {
    /// Volume to grow.
    pub volume_id: VolumeId,
    /// Where the volume is published (or, for a volume only staged, its staging path).
    pub volume_path: String,
    /// Staging path, iff the node has `STAGE_UNSTAGE_VOLUME` and the volume is staged.
    pub staging_target_path: Option<String>,
    /// The size asked for.
    pub required_bytes: i64,
    /// The capability the volume is used with: a plugin needs it to tell a BLOCK volume
    /// (nothing to grow on the node but the device) from a file system.
    pub capability: Option<VolumeCapability>,
}

/// `NodePublishVolume` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePublishRequest {
    /// Volume to publish.
    pub volume_id: VolumeId,
    /// `publish_context` from `ControllerPublishVolume`.
    pub publish_context: StringMap,
    /// Staging path, iff the node has `STAGE_UNSTAGE_VOLUME`.
    pub staging_target_path: Option<String>,
    /// Where the volume must appear.
    pub target_path: String,
    /// Capability the volume will be used with.
    pub capability: VolumeCapability,
    /// Publish read-only.
    pub readonly: bool,
    /// Volume context from `CreateVolume`.
    pub volume_context: StringMap,
    /// Secrets for the call.
    pub secrets: Secrets,
}

/// Unit of a [`VolumeUsage`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UsageUnit {
    /// The plugin did not say.
    Unknown,
    /// Bytes.
    Bytes,
    /// Inodes.
    Inodes,
}

/// One entry of `NodeGetVolumeStats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct VolumeUsage {
    /// What is counted.
    pub unit: UsageUnit,
    /// Available amount.
    pub available: i64,
    /// Total amount.
    pub total: i64,
    /// Used amount.
    pub used: i64,
}

/// `NodeGetVolumeStats` result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VolumeStats {
    /// Usage entries.
    pub usage: Vec<VolumeUsage>,
    /// `volume_condition.abnormal`, if reported.
    pub abnormal: Option<bool>,
    /// `volume_condition.message`, if reported.
    pub condition_message: Option<String>,
}

/// A volume's `VolumeCondition` as the plugin reports it (CSI v1.3+).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VolumeCondition {
    /// Whether the volume is abnormal.
    pub abnormal: bool,
    /// The plugin's explanation (within the client's string bound).
    pub message: String,
}

/// One entry of a `ListVolumes` page as the volume health poller reads it: the volume
/// id and its `status.volume_condition`, if the plugin gave one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ListedCondition {
    /// The plugin's id.
    pub volume_id: VolumeId,
    /// `status.volume_condition`.
    pub condition: Option<VolumeCondition>,
}

/// One page of `ListVolumes` read for the conditions of its entries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConditionPage {
    /// The entries with a usable volume id.
    pub entries: Vec<ListedCondition>,
    /// Token for the next page; `None` on the last page.
    pub next_token: Option<String>,
}

/// `ControllerExpandVolume` result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ControllerExpansion {
    /// New capacity.
    pub capacity_bytes: i64,
    /// Whether `NodeExpandVolume` must follow.
    pub node_expansion_required: bool,
}

/// Outcome of `Probe`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ProbeResult {
    /// The version that answered.
    pub version: CsiVersion,
    /// `ready`; an unset field means ready (CSI spec, `ProbeResponse`).
    pub ready: bool,
}
