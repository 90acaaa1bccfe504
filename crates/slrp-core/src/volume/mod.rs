//! Volumes: the durable per-volume state machine and the mount paths it uses.
//!
//! - [`state`]: the pure state machine ([`VolumeState`], [`VolumeRecord`], planning,
//!   begin/finish, recovery).
//! - [`paths`]: volume id ↔ directory name encoding and the staging/target paths.
//!
//! The async volume manager that drives CSI calls through these functions lives beside
//! them once the CSI client layer is in place.

pub mod paths;
pub mod state;

pub use paths::{MountPaths, PathError, decode_volume_id, encode_volume_id};
pub use state::{
    BootId, CallOutcome, CsiCall, Goal, OnCallFail, SecretRef, StateName, Step, TransitionError,
    VolumeRecord, VolumeSpec, VolumeState,
};

// The CSI domain types live in `slrp-csi` (one definition each); re-exported because the
// state machine's API is written in them.
pub use slrp_csi::{
    AccessMode, AccessType, CsiCapabilities, StringMap, VolumeCapability, VolumeId,
};
