//! Version-agnostic request and response types of the plugin core.
//!
//! The v0 and v1 adapters convert their protobuf messages into these (rejecting malformed
//! ones with INVALID_ARGUMENT), so [`crate::Plugin`] never sees a CSI package.

use std::collections::HashMap;
use std::time::SystemTime;

/// How a volume is accessed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessType {
    /// A mounted file system.
    Mount {
        /// Requested file system type; empty means the plugin's default.
        fs_type: String,
        /// Extra mount options.
        mount_flags: Vec<String>,
    },
    /// The raw block device.
    Block,
}

/// CSI access modes (the union of v0 and v1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessMode {
    /// One node, read-write.
    SingleNodeWriter,
    /// One node, read-only.
    SingleNodeReaderOnly,
    /// One node, one writer (CSI 1.5+).
    SingleNodeSingleWriter,
    /// One node, many writers (CSI 1.5+).
    SingleNodeMultiWriter,
    /// Many nodes, read-only.
    MultiNodeReaderOnly,
    /// Many nodes, one writer.
    MultiNodeSingleWriter,
    /// Many nodes, many writers.
    MultiNodeMultiWriter,
}

impl AccessMode {
    /// Whether a node-local volume can honour the mode. Multi-node modes need shared
    /// storage; every single-node mode is served (the plugin has the SINGLE_NODE_MULTI_WRITER
    /// capabilities).
    pub fn is_supported(self) -> bool {
        matches!(
            self,
            Self::SingleNodeWriter
                | Self::SingleNodeReaderOnly
                | Self::SingleNodeSingleWriter
                | Self::SingleNodeMultiWriter
        )
    }
}

/// A volume capability: access type plus access mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capability {
    /// Mount or block.
    pub access: AccessType,
    /// Access mode.
    pub mode: AccessMode,
}

/// A CSI capacity range; 0 means unset, as on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CapacityRange {
    /// Minimum size.
    pub required_bytes: i64,
    /// Maximum size.
    pub limit_bytes: i64,
}

/// CreateVolume arguments.
#[derive(Debug, Clone, Default)]
pub struct CreateVolume {
    /// The CO's idempotency key.
    pub name: String,
    /// Requested size.
    pub capacity_range: Option<CapacityRange>,
    /// Requested capabilities.
    pub capabilities: Vec<Capability>,
    /// Plugin parameters (`pool`, `backend`).
    pub parameters: HashMap<String, String>,
    /// The snapshot or volume whose data the new volume starts with.
    pub content_source: Option<ContentSource>,
}

/// CreateVolume's `volume_content_source`: where a new volume's data comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContentSource {
    /// Restore this snapshot.
    Snapshot(String),
    /// Clone this volume.
    Volume(String),
}

/// A volume as CreateVolume and ListVolumes report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeInfo {
    /// Volume id.
    pub volume_id: String,
    /// Size in bytes (0 = unknown).
    pub capacity_bytes: i64,
    /// Volume context handed back to the node calls.
    pub volume_context: HashMap<String, String>,
    /// The snapshot or volume the volume was created from.
    pub content_source: Option<ContentSource>,
    /// The controller's view of the volume's health (`status.volume_condition`): set in
    /// ListVolumes and ControllerGetVolume answers, `None` in CreateVolume's.
    pub condition: Option<Condition>,
    /// `status.published_node_ids`: this node's id while the volume is staged or published
    /// here, else empty.
    pub published_node_ids: Vec<String>,
}

/// CreateSnapshot arguments.
#[derive(Debug, Clone, Default)]
pub struct CreateSnapshot {
    /// The CO's idempotency key.
    pub name: String,
    /// The volume to copy.
    pub source_volume_id: String,
    /// Plugin parameters (only the Kubernetes sidecars' `csi.storage.k8s.io/` keys).
    pub parameters: HashMap<String, String>,
}

/// A snapshot as CreateSnapshot, ListSnapshots and GetSnapshot report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Snapshot id.
    pub snapshot_id: String,
    /// The volume it was taken of (which may since have been deleted).
    pub source_volume_id: String,
    /// The source volume's size: the least a volume restored from it can have.
    pub size_bytes: i64,
    /// When the copy was taken.
    pub creation_time: SystemTime,
    /// Whether it can be restored: always, once listed (the copy is made within
    /// CreateSnapshot).
    pub ready_to_use: bool,
}

/// One ListSnapshots page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotPage {
    /// The snapshots of this page.
    pub entries: Vec<SnapshotInfo>,
    /// Token for the next page; empty at the end.
    pub next_token: String,
}

/// One ListVolumes page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumePage {
    /// The volumes of this page.
    pub entries: Vec<VolumeInfo>,
    /// Token for the next page; empty at the end.
    pub next_token: String,
}

/// GetCapacity answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapacityInfo {
    /// Bytes still available in the pool.
    pub available_capacity: i64,
    /// Largest volume that can be created now.
    pub maximum_volume_size: Option<i64>,
    /// Smallest volume of the backend.
    pub minimum_volume_size: Option<i64>,
}

/// ValidateVolumeCapabilities answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Validation {
    /// All capabilities are supported and the context and parameters given are the
    /// volume's own; the adapters echo what the request carried.
    Confirmed,
    /// Something is not supported or does not match; the message says what.
    Unconfirmed(String),
}

/// NodeStageVolume arguments.
#[derive(Debug, Clone)]
pub struct StageVolume {
    /// Volume id.
    pub volume_id: String,
    /// The CO's staging path.
    pub staging_target_path: String,
    /// Requested capability.
    pub capability: Capability,
}

/// NodePublishVolume arguments.
#[derive(Debug, Clone)]
pub struct PublishVolume {
    /// Volume id.
    pub volume_id: String,
    /// Where the volume was staged.
    pub staging_target_path: String,
    /// Where to publish it.
    pub target_path: String,
    /// Requested capability.
    pub capability: Capability,
    /// Publish read-only.
    pub readonly: bool,
}

/// Unit of a [`Usage`] figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageUnit {
    /// Bytes.
    Bytes,
    /// Inodes.
    Inodes,
}

/// One usage figure of NodeGetVolumeStats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Unit.
    pub unit: UsageUnit,
    /// Total.
    pub total: i64,
    /// In use.
    pub used: i64,
    /// Available.
    pub available: i64,
}

/// Health of a volume as the node sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// Whether something is wrong.
    pub abnormal: bool,
    /// What, or "ok".
    pub message: String,
}

/// NodeGetVolumeStats answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeStats {
    /// Usage figures.
    pub usage: Vec<Usage>,
    /// Condition.
    pub condition: Condition,
}
