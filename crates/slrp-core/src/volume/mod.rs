//! Volumes: the durable per-volume state machine, the mount paths it uses and the
//! manager that drives it through CSI.
//!
//! - [`state`]: the pure state machine ([`VolumeState`], [`VolumeRecord`], planning,
//!   begin/finish, recovery).
//! - [`paths`]: volume id ↔ directory name encoding and the staging/target paths.
//! - [`manager`]: [`VolumeManager`] (worker) and [`VolumeManagerHandle`]: per-volume
//!   serialization, the durable driver loop, create/delete/publish/unpublish/validate,
//!   recovery.
//! - [`host`]: boot id, mount table and secret resolution (injectable).
//! - [`error`]: the manager's error type, [`VolumeError`].

pub mod error;
pub mod host;
pub mod manager;
pub mod paths;
pub mod state;

pub use error::VolumeError;
pub use host::{
    MountTable, NoSecrets, ProcMountTable, SecretResolver, StaticSecrets, read_boot_id,
};
pub use manager::{
    CreateVolume, JobCounts, RecoveryReport, ValidateVolume, VolumeInfo, VolumeManager,
    VolumeManagerConfig, VolumeManagerHandle,
};
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
