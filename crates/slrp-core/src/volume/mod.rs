//! Volumes: the durable per-volume state machine, the mount paths it uses and the
//! manager that drives it through CSI.
//!
//! - [`state`]: the pure state machine ([`VolumeState`], [`VolumeRecord`], planning,
//!   begin/finish, recovery).
//! - [`plan`]: recovery planning, pure ([`plan_recovery`]: stored records, intents,
//!   boot id and mounts → [`RecoveryPlan`]).
//! - [`paths`]: volume id ↔ directory name encoding and the staging/target paths.
//! - [`manager`]: [`VolumeManager`] (the worker: its loop, config and shutdown) and the
//!   design of the whole manager; its parts are private modules beside it:
//!   - `handle`: [`VolumeManagerHandle`] and the request/answer types;
//!   - `schedule`: lanes and the create gate ([`JobCounts`]);
//!   - `jobs`: what each request does (create, validate, delete, publish, unpublish,
//!     list, capacity);
//!   - `driver`: the durable driver loop of one transition and the requests it builds;
//!   - `recovery`: the start-up plan ([`RecoveryReport`]);
//!   - `cleanup`: mount-directory cleanup;
//!   - `fold`: the manager's records written in a caller's commits ([`Staged`],
//!     [`Owed`], [`DeleteIntent`]);
//!   - `expand`: growing a volume (ControllerExpandVolume, NodeExpandVolume), each step
//!     behind a durable [`Expansion`];
//!   - `snapshots`: snapshots of tracked volumes, behind intents and marks
//!     ([`SnapshotRecord`]);
//!   - `refused`: CreateVolume answers the CSI client refused, settled
//!     ([`RefusedCreate`]).
//! - [`host`]: boot id, mount table and secret resolution (injectable).
//! - [`error`]: the manager's error type, [`VolumeError`].

mod cleanup;
mod driver;
pub mod error;
mod expand;
mod fold;
mod handle;
pub mod host;
mod jobs;
pub mod manager;
pub mod paths;
pub mod plan;
mod recovery;
mod refused;
mod schedule;
mod snapshots;
pub mod state;

pub use error::{
    Mismatched, PreparedDir, Subject, ValidationFailure, VolumeError, VolumeErrorKind,
};
pub use fold::{Committed, DeleteIntent, Owed, Staged, stage_create, stage_delete};
pub use handle::{CreateVolume, ValidateVolume, VolumeInfo, VolumeManagerHandle};
pub use host::{
    MountTable, NoSecrets, ProcMountTable, SecretResolver, StaticSecrets, read_boot_id,
};
pub use manager::{
    CallObserver, TargetPath, VolumeManager, VolumeManagerConfig, VolumeManagerGuard,
};
pub use paths::{MountPaths, PathError, decode_volume_id, encode_volume_id};
pub use plan::{MountMismatch, PlannedJob, RecoveryGoal, RecoveryPlan, plan_recovery};
pub use recovery::RecoveryReport;
pub use refused::{RefusedCleanup, RefusedCreate};
pub use schedule::JobCounts;
pub use snapshots::{SnapshotIntent, SnapshotRecord};
pub use state::{
    BootId, CsiCall, Expansion, Goal, SecretRef, StateName, Step, TransitionError, VolumeRecord,
    VolumeSpec, VolumeState,
};

// The CSI domain types live in `slrp-csi` (one definition each); re-exported because the
// state machine's API is written in them.
pub use slrp_csi::{
    AccessMode, AccessType, CsiCapabilities, StringMap, VolumeCapability, VolumeId,
};
