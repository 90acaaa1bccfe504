//! [`VolumeError`]: failures of the volume manager, and [`VolumeErrorKind`], what a caller
//! (the provider) does with one.
//!
//! Texts that become an operation's status message are Mesos's (spec Appendix B; checked
//! against `src/csi/v1_volume_manager.cpp` and `v0_volume_manager.cpp`): `Display` gives
//! exactly Mesos's text, and where Mesos appends a cause (`"...: <error>"`) the cause is
//! this error's `source()`, so printing the chain reproduces Mesos's whole message.

use std::fmt;
use std::path::PathBuf;

use slrp_csi::{CsiError, CsiRpc, CsiVersion, RetryClass, VolumeId};
use slrp_store::StoreError;

use super::paths::PathError;
use super::refused::RefusedCreate;
use super::state::{StateName, TransitionError};

/// What an error is about: a volume, a CreateVolume name (the id is not known yet), or
/// nothing in particular (ListVolumes, GetCapacity).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Subject {
    /// A volume, by the plugin's id.
    Volume(VolumeId),
    /// A volume being created, by its CreateVolume name.
    Name(String),
    /// The volumes recovery changed at start, committed together.
    Recovered {
        /// How many.
        count: usize,
    },
    /// No volume (ListVolumes, GetCapacity).
    None,
}

impl Subject {
    /// `" for <subject>"`, or nothing for [`Subject::None`]: the tail of an RPC failure.
    fn for_suffix(&self) -> String {
        match self {
            Self::None => String::new(),
            Self::Volume(_) | Self::Name(_) | Self::Recovered { .. } => format!(" for {self}"),
        }
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Volume(id) => write!(f, "volume '{id}'"),
            Self::Name(name) => write!(f, "volume name '{name}'"),
            Self::Recovered { count } => write!(f, "{count} recovered volume(s)"),
            Self::None => f.write_str("no volume"),
        }
    }
}

/// Which property of a tracked volume differs from a request's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mismatched {
    /// The volume capability.
    Capability,
    /// The CreateVolume parameters.
    Parameters,
}

/// Why ValidateVolumeCapabilities did not validate a volume.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ValidationFailure {
    /// The plugin did not confirm (v1 `confirmed` unset, v0 `supported` false), with the
    /// plugin's message.
    NotConfirmed {
        /// The plugin's explanation (may be empty).
        message: String,
    },
    /// The confirmed volume context differs from the requested one (v1).
    MismatchedVolumeContext,
    /// None of the confirmed capabilities is the requested one (v1).
    UnsupportedCapability,
    /// The confirmed parameters differ from the requested ones (v1).
    MismatchedParameters,
}

/// Which directory the CO creates for a call (CSI: the staging path, and the target path
/// or its parent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PreparedDir {
    /// The staging path (NodeStageVolume).
    Staging,
    /// The target path itself (v0 plugins expect it to exist).
    Target,
    /// The parent of the target path (v1 plugins create the target themselves).
    TargetParent,
}

/// What a caller does with a [`VolumeError`]: the provider maps it to an operation's
/// status (see `docs/volume-manager.md`, "Errors").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VolumeErrorKind {
    /// The request cannot succeed as asked: malformed, for an unknown volume, for a
    /// capability the plugin lacks, differing from the tracked volume, or refused by
    /// validation. Fail the operation; the same request fails again.
    Invalid,
    /// The request conflicts with what is tracked or happening (a name whose volume id
    /// is tracked otherwise, a volume being deleted, a volume validated meanwhile). Fail
    /// the operation; the state that caused it may change.
    Conflict,
    /// The plugin answered something a CSI plugin must not (a repeated page token, a
    /// target path it claimed to create but did not). Fail the operation; a person should
    /// look at the plugin.
    PluginMisbehaved,
    /// A CSI call failed in a way that may pass later (unavailable, deadline, aborted):
    /// the volume stays in flight and the next request or recovery re-drives it. Retry.
    Unavailable,
    /// The plugin refused a call (a permanent gRPC code). Fail the operation.
    Rejected,
    /// A local step failed (creating a mount directory, cleaning up a volume's data).
    /// Fail the operation; the host may need a person.
    Local,
    /// A bug in slrp (a transition the plan should not have produced). Fail the
    /// operation and report it.
    Internal,
    /// Recovery could not restore what must be restored: the provider must not report
    /// ready.
    NotReady,
    /// Durability can no longer be promised: the manager stops and the process must
    /// restart and recover from disk. The operation is neither failed nor done.
    Fatal,
    /// The manager is not running (shutdown, or after a fatal error): the request may
    /// or may not have taken effect; recovery after a restart settles it.
    Stopped,
}

/// Errors of the volume manager. `Display` names this layer only; causes are in `source()`.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// Publishing a volume that is not tracked (Mesos's text).
    #[error("Cannot publish unknown volume '{id}'")]
    UnknownVolume {
        /// The volume.
        id: VolumeId,
    },
    /// A CSI call failed; the volume stays in the call's in-flight state, so the next
    /// request or recovery re-drives or undoes it. Mesos's message is the client's
    /// error, which is this error's source.
    #[error("{rpc} failed{}", .subject.for_suffix())]
    Csi {
        /// The RPC.
        rpc: CsiRpc,
        /// What it was about.
        subject: Subject,
        /// The client's error.
        #[source]
        source: CsiError,
    },
    /// Making a change durable failed. Fatal (the manager stops and the next start
    /// recovers from what is on disk) unless the store refused the change before writing
    /// anything, e.g. a volume id longer than a store key may be
    /// ([`StoreError::is_fatal`]).
    #[error("persisting the state of {subject} failed")]
    Store {
        /// What was being persisted.
        subject: Subject,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// Loading the state at start failed.
    #[error("loading the volume state failed")]
    Load {
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// The plugin lacks a controller capability the request needs. Mesos's text,
    /// including its missing closing quote.
    #[error(
        "{capability} controller capability is not supported for CSI plugin type \
         '{plugin_type}' and name '{plugin_name}"
    )]
    Unsupported {
        /// The missing capability, e.g. `CREATE_DELETE_VOLUME`.
        capability: &'static str,
        /// The plugin's type ([`super::VolumeManagerConfig::plugin`]).
        plugin_type: String,
        /// The plugin's name.
        plugin_name: String,
    },
    /// An expansion that cannot be done as asked (the plugin cannot grow volumes, the
    /// size is not larger, ...). Nothing was sent.
    #[error("volume '{id}' cannot be expanded: {why}")]
    CannotExpand {
        /// The volume.
        id: VolumeId,
        /// Why, and what to do about it.
        why: String,
    },
    /// The plugin grows volumes only offline (its `VolumeExpansion` is `OFFLINE`) and
    /// this one is attached or in use. Nothing was sent.
    #[error(
        "volume '{id}' is {state}, and the CSI plugin expands volumes only offline: unpublish it first"
    )]
    ExpandOffline {
        /// The volume.
        id: VolumeId,
        /// Its state.
        state: super::state::StateName,
    },
    /// A snapshot name already names a snapshot of another volume.
    #[error("snapshot name '{name}' is taken by a snapshot of volume '{of}'")]
    SnapshotNameTaken {
        /// The name.
        name: String,
        /// The volume its snapshot was taken of.
        of: VolumeId,
    },
    /// A [`super::VolumeManagerConfig`] setting is unusable; nothing was started.
    #[error("invalid volume manager config: {field} {problem}")]
    Config {
        /// The field at fault.
        field: &'static str,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// The caller's request is malformed.
    #[error("invalid request: {field} {problem}")]
    BadRequest {
        /// The request field at fault.
        field: &'static str,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// A tracked volume was asked for with another capability or other parameters than
    /// it was created or validated with. Mesos's texts: v1 calls a differing capability
    /// unsupported, v0 mismatched.
    #[error("{}", mismatch_text(*.what, .id, *.version))]
    Mismatch {
        /// The volume.
        id: VolumeId,
        /// What differs.
        what: Mismatched,
        /// The plugin's CSI version (it picks Mesos's wording).
        version: CsiVersion,
    },
    /// CreateVolume returned the id of a volume tracked under another name (or
    /// validated); that record is left alone (Mesos's text).
    #[error("Volume with name '{name}' already exists")]
    NameTaken {
        /// The CreateVolume name.
        name: String,
        /// The id the plugin returned.
        id: VolumeId,
    },
    /// ValidateVolumeCapabilities did not validate the volume (Mesos's texts).
    #[error("{}", validation_text(.id, .reason, *.version))]
    ValidationFailed {
        /// The volume.
        id: VolumeId,
        /// Why.
        reason: ValidationFailure,
        /// The plugin's CSI version (it picks Mesos's wording).
        version: CsiVersion,
    },
    /// The volume became tracked while it was being validated (Mesos's text).
    #[error("Volume '{id}' already validated")]
    AlreadyValidated {
        /// The volume.
        id: VolumeId,
    },
    /// The volume is being deleted; only the deletion may continue.
    #[error("volume '{id}' is being deleted")]
    BeingDeleted {
        /// The volume.
        id: VolumeId,
    },
    /// The plugin answered something a CSI plugin must not.
    #[error("the CSI plugin answered {rpc} with {what}")]
    PluginMisbehaved {
        /// The RPC.
        rpc: CsiRpc,
        /// What was wrong with the answer.
        what: String,
    },
    /// The CSI client refused the plugin's CreateVolume answer for `name` (now or at an
    /// earlier create of the name): the name is never created again, and the volume
    /// the plugin made is deleted when it can be (`refusal` says what became of it).
    #[error("volume name '{name}': {refusal}")]
    CreateRefused {
        /// The CreateVolume name.
        name: String,
        /// The refusal as recorded.
        refusal: Box<RefusedCreate>,
    },
    /// NodePublishVolume succeeded but the target path does not exist (Mesos's text).
    #[error("Target path '{}' not created", .path.display())]
    TargetNotCreated {
        /// The volume.
        id: VolumeId,
        /// The target path.
        path: PathBuf,
    },
    /// NodeUnpublishVolume succeeded but the target path still exists (Mesos's text).
    #[error("Target path '{}' not removed", .path.display())]
    TargetNotRemoved {
        /// The volume.
        id: VolumeId,
        /// The target path.
        path: PathBuf,
    },
    /// The volume id cannot be mapped to a mount directory.
    #[error("volume '{id}' has no usable mount path")]
    Path {
        /// The volume.
        id: VolumeId,
        /// Why.
        #[source]
        source: PathError,
    },
    /// Creating a directory a call needs failed (Mesos's texts; the I/O error is the
    /// source).
    #[error("{}", prepare_text(*.dir, .path))]
    Prepare {
        /// Which directory.
        dir: PreparedDir,
        /// Its path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Removing a volume's data before DeleteVolume failed (Mesos's text; the I/O error
    /// is the source).
    #[error("Failed to clean up volume '{id}'")]
    Cleanup {
        /// The volume.
        id: VolumeId,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A transition was refused (a planning bug; the state is unchanged).
    #[error("volume '{id}' cannot move on from {state}")]
    Transition {
        /// The volume.
        id: VolumeId,
        /// Its state.
        state: StateName,
        /// The refusal.
        #[source]
        source: TransitionError,
    },
    /// Something slrp guarantees did not hold (a bug).
    #[error("internal error for {subject}: {what}")]
    Internal {
        /// What it was about.
        subject: Subject,
        /// What did not hold.
        what: &'static str,
    },
    /// A secret reference could not be resolved.
    #[error("secret {name:?} (key {key:?}) for volume '{id}' cannot be resolved")]
    Secret {
        /// The volume.
        id: VolumeId,
        /// Secret name.
        name: String,
        /// Key in the secret.
        key: String,
    },
    /// Recovery left volumes that must be published (or names whose creation must be
    /// finished) unresolved; the provider must not report ready.
    #[error("recovery failed for {} volume(s): {}", failed.len(), failed.join(", "))]
    RecoveryFailed {
        /// The volumes (ids or CreateVolume names) with what failed.
        failed: Vec<String>,
    },
    /// The manager stopped (shutdown or a fatal error).
    #[error("the volume manager is not running")]
    Stopped,
    /// A fail point fired (tests only): treated like a crash.
    #[error("fail point {point} fired")]
    Injected {
        /// The fail point.
        point: &'static str,
    },
}

fn mismatch_text(what: Mismatched, id: &VolumeId, version: CsiVersion) -> String {
    match (what, version) {
        (Mismatched::Capability, CsiVersion::V1) => {
            format!("Unsupported volume capability for volume '{id}'")
        }
        (Mismatched::Capability, CsiVersion::V0) => {
            format!("Mismatched capability for volume '{id}'")
        }
        (Mismatched::Parameters, CsiVersion::V0 | CsiVersion::V1) => {
            format!("Mismatched parameters for volume '{id}'")
        }
    }
}

fn validation_text(id: &VolumeId, reason: &ValidationFailure, version: CsiVersion) -> String {
    let detail = match reason {
        ValidationFailure::NotConfirmed { message } => {
            return match version {
                CsiVersion::V1 => format!("Validation failed for volume '{id}': {message}"),
                CsiVersion::V0 => {
                    format!("Unsupported volume capability for volume '{id}': {message}")
                }
            };
        }
        ValidationFailure::MismatchedVolumeContext => "Mismatched volume context",
        ValidationFailure::UnsupportedCapability => "Unsupported volume capability",
        ValidationFailure::MismatchedParameters => "Mismatched parameters",
    };
    format!("Validation failed for volume '{id}': {detail}")
}

fn prepare_text(dir: PreparedDir, path: &std::path::Path) -> String {
    let path = path.display();
    match dir {
        PreparedDir::Staging => format!("Failed to create mount staging path '{path}'"),
        PreparedDir::Target => format!("Failed to create the target path '{path}'"),
        PreparedDir::TargetParent => {
            format!("Failed to create parent directory of target path '{path}'")
        }
    }
}

impl VolumeError {
    /// What a caller does with this error (see [`VolumeErrorKind`]).
    pub fn kind(&self) -> VolumeErrorKind {
        use VolumeErrorKind as K;
        match self {
            Self::UnknownVolume { .. }
            | Self::Unsupported { .. }
            | Self::Config { .. }
            | Self::BadRequest { .. }
            | Self::Mismatch { .. }
            | Self::ValidationFailed { .. }
            | Self::Path { .. }
            | Self::CannotExpand { .. }
            | Self::Secret { .. } => K::Invalid,
            Self::NameTaken { .. }
            | Self::AlreadyValidated { .. }
            | Self::BeingDeleted { .. }
            | Self::SnapshotNameTaken { .. }
            | Self::ExpandOffline { .. } => K::Conflict,
            Self::PluginMisbehaved { .. }
            | Self::CreateRefused { .. }
            | Self::TargetNotCreated { .. }
            | Self::TargetNotRemoved { .. } => K::PluginMisbehaved,
            Self::Csi { source, .. } => match source.retry_class() {
                RetryClass::Transient => K::Unavailable,
                // `AlreadyDone` is success wherever the manager expects it; anywhere
                // else the plugin refused what was asked.
                RetryClass::Permanent | RetryClass::AlreadyDone => K::Rejected,
            },
            // A refused key or an unencodable record was never sent to the writer: nothing
            // changed, so only the request that carried it fails.
            Self::Store { source, .. } => {
                if source.is_fatal() {
                    K::Fatal
                } else {
                    K::Invalid
                }
            }
            Self::Prepare { .. } | Self::Cleanup { .. } => K::Local,
            Self::Transition { .. } | Self::Internal { .. } => K::Internal,
            Self::RecoveryFailed { .. } => K::NotReady,
            Self::Load { .. } | Self::Injected { .. } => K::Fatal,
            Self::Stopped => K::Stopped,
        }
    }

    /// Whether the manager must stop: durability can no longer be promised, and the
    /// next start recovers from what is on disk (conventions §4.4 rule 5).
    pub fn is_fatal(&self) -> bool {
        self.kind() == VolumeErrorKind::Fatal
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use slrp_csi::{Code, CsiError, CsiRpc, CsiVersion, VolumeId};
    use slrp_store::StoreError;

    use super::super::paths::PathError;
    use super::super::state::{CsiCall, StateName, TransitionError};
    use super::{
        Mismatched, PreparedDir, Subject, ValidationFailure, VolumeError, VolumeErrorKind as K,
    };
    use slrp_types::DisplayChain;

    fn id() -> VolumeId {
        VolumeId::new("vol-1")
    }

    fn refused() -> super::RefusedCreate {
        super::RefusedCreate {
            request: super::super::handle::CreateVolume {
                name: "op".into(),
                required_bytes: 1 << 20,
                limit_bytes: 1 << 20,
                capability: slrp_csi::VolumeCapability::mount_default(),
                parameters: Default::default(),
                content_source: None,
            },
            rule: "above_limit".into(),
            reason: "capacity_bytes 9223372036854775807 is above the limit_bytes 1048576 asked for"
                .into(),
            cleanup: super::super::refused::RefusedCleanup::Deleted {
                volume_id: VolumeId::new("big\nid"),
            },
        }
    }

    fn io() -> std::io::Error {
        std::io::Error::from(std::io::ErrorKind::PermissionDenied)
    }

    fn csi(code: Code) -> CsiError {
        CsiError::status(CsiRpc::NodeStageVolume, code, "no")
    }

    #[test]
    fn every_error_has_the_kind_its_caller_acts_on() {
        let store_invalid = StoreError::InvalidKey {
            kind: "volume",
            key: "k".into(),
            reason: "too long",
        };
        let table: Vec<(VolumeError, K)> = vec![
            (VolumeError::UnknownVolume { id: id() }, K::Invalid),
            (
                VolumeError::Csi {
                    rpc: CsiRpc::NodeStageVolume,
                    subject: Subject::Volume(id()),
                    source: csi(Code::Unavailable),
                },
                K::Unavailable,
            ),
            (
                VolumeError::Csi {
                    rpc: CsiRpc::NodeStageVolume,
                    subject: Subject::Volume(id()),
                    source: csi(Code::InvalidArgument),
                },
                K::Rejected,
            ),
            (
                VolumeError::Store {
                    subject: Subject::Volume(id()),
                    source: StoreError::Poisoned,
                },
                K::Fatal,
            ),
            (
                VolumeError::Store {
                    subject: Subject::Volume(id()),
                    source: store_invalid,
                },
                K::Invalid,
            ),
            (
                VolumeError::Load {
                    source: StoreError::WriterStopped,
                },
                K::Fatal,
            ),
            (
                VolumeError::Unsupported {
                    capability: "CREATE_DELETE_VOLUME",
                    plugin_type: "t".into(),
                    plugin_name: "n".into(),
                },
                K::Invalid,
            ),
            (
                VolumeError::Config {
                    field: "max_concurrent",
                    problem: "must be at least 1",
                },
                K::Invalid,
            ),
            (
                VolumeError::BadRequest {
                    field: "name",
                    problem: "is empty",
                },
                K::Invalid,
            ),
            (
                VolumeError::Mismatch {
                    id: id(),
                    what: Mismatched::Capability,
                    version: CsiVersion::V1,
                },
                K::Invalid,
            ),
            (
                VolumeError::NameTaken {
                    name: "op".into(),
                    id: id(),
                },
                K::Conflict,
            ),
            (
                VolumeError::ValidationFailed {
                    id: id(),
                    reason: ValidationFailure::MismatchedParameters,
                    version: CsiVersion::V1,
                },
                K::Invalid,
            ),
            (VolumeError::AlreadyValidated { id: id() }, K::Conflict),
            (VolumeError::BeingDeleted { id: id() }, K::Conflict),
            (
                VolumeError::PluginMisbehaved {
                    rpc: CsiRpc::ListVolumes,
                    what: "x".into(),
                },
                K::PluginMisbehaved,
            ),
            (
                VolumeError::CreateRefused {
                    name: "op".into(),
                    refusal: Box::new(refused()),
                },
                K::PluginMisbehaved,
            ),
            (
                VolumeError::TargetNotCreated {
                    id: id(),
                    path: "/t".into(),
                },
                K::PluginMisbehaved,
            ),
            (
                VolumeError::TargetNotRemoved {
                    id: id(),
                    path: "/t".into(),
                },
                K::PluginMisbehaved,
            ),
            (
                VolumeError::Path {
                    id: id(),
                    source: PathError::EmptyId,
                },
                K::Invalid,
            ),
            (
                VolumeError::Prepare {
                    dir: PreparedDir::Staging,
                    path: "/s".into(),
                    source: io(),
                },
                K::Local,
            ),
            (
                VolumeError::Cleanup {
                    id: id(),
                    source: io(),
                },
                K::Local,
            ),
            (
                VolumeError::Transition {
                    id: id(),
                    state: StateName::Created,
                    source: TransitionError::NotInFlight {
                        call: CsiCall::NodeStage,
                        state: StateName::Created,
                    },
                },
                K::Internal,
            ),
            (
                VolumeError::Internal {
                    subject: Subject::None,
                    what: "x",
                },
                K::Internal,
            ),
            (
                VolumeError::Secret {
                    id: id(),
                    name: "s".into(),
                    key: "k".into(),
                },
                K::Invalid,
            ),
            (
                VolumeError::RecoveryFailed {
                    failed: vec!["v".into()],
                },
                K::NotReady,
            ),
            (VolumeError::Stopped, K::Stopped),
            (VolumeError::Injected { point: "p" }, K::Fatal),
            (
                VolumeError::CannotExpand {
                    id: id(),
                    why: "no".into(),
                },
                K::Invalid,
            ),
            (
                VolumeError::ExpandOffline {
                    id: id(),
                    state: crate::volume::StateName::Published,
                },
                K::Conflict,
            ),
            (
                VolumeError::SnapshotNameTaken {
                    name: "n".into(),
                    of: id(),
                },
                K::Conflict,
            ),
        ];
        for (e, kind) in &table {
            assert_eq!(e.kind(), *kind, "{e:?}");
            assert_eq!(e.is_fatal(), *kind == K::Fatal, "{e:?}");
        }
        // Every variant is in the table: a new one must be added here to compile.
        let mut seen = [false; VARIANTS];
        for (e, _) in &table {
            seen[variant(e)] = true;
        }
        assert!(seen.iter().all(|s| *s), "{seen:?}");
    }

    const VARIANTS: usize = 28;

    fn variant(e: &VolumeError) -> usize {
        match e {
            VolumeError::UnknownVolume { .. } => 0,
            VolumeError::Csi { .. } => 1,
            VolumeError::Store { .. } => 2,
            VolumeError::Load { .. } => 3,
            VolumeError::Unsupported { .. } => 4,
            VolumeError::BadRequest { .. } => 5,
            VolumeError::Mismatch { .. } => 6,
            VolumeError::NameTaken { .. } => 7,
            VolumeError::ValidationFailed { .. } => 8,
            VolumeError::AlreadyValidated { .. } => 9,
            VolumeError::BeingDeleted { .. } => 10,
            VolumeError::PluginMisbehaved { .. } => 11,
            VolumeError::TargetNotCreated { .. } => 12,
            VolumeError::TargetNotRemoved { .. } => 13,
            VolumeError::Path { .. } => 14,
            VolumeError::Prepare { .. } => 15,
            VolumeError::Cleanup { .. } => 16,
            VolumeError::Transition { .. } => 17,
            VolumeError::Internal { .. } => 18,
            VolumeError::Secret { .. } => 19,
            VolumeError::RecoveryFailed { .. } => 20,
            VolumeError::Stopped => 21,
            VolumeError::Injected { .. } => 22,
            VolumeError::Config { .. } => 23,
            VolumeError::CreateRefused { .. } => 24,
            VolumeError::CannotExpand { .. } => 25,
            VolumeError::ExpandOffline { .. } => 26,
            VolumeError::SnapshotNameTaken { .. } => 27,
        }
    }

    #[test]
    fn messages_are_mesos_texts() {
        let cases: Vec<(VolumeError, &str)> = vec![
            (
                VolumeError::UnknownVolume { id: id() },
                "Cannot publish unknown volume 'vol-1'",
            ),
            (
                VolumeError::Unsupported {
                    capability: "CREATE_DELETE_VOLUME",
                    plugin_type: "org.apache.mesos.csi.test".into(),
                    plugin_name: "local".into(),
                },
                // Mesos's text has no closing quote after the name.
                "CREATE_DELETE_VOLUME controller capability is not supported for CSI plugin \
                 type 'org.apache.mesos.csi.test' and name 'local",
            ),
            (
                VolumeError::NameTaken {
                    name: "op-1".into(),
                    id: id(),
                },
                "Volume with name 'op-1' already exists",
            ),
            (
                VolumeError::Mismatch {
                    id: id(),
                    what: Mismatched::Capability,
                    version: CsiVersion::V1,
                },
                "Unsupported volume capability for volume 'vol-1'",
            ),
            (
                VolumeError::Mismatch {
                    id: id(),
                    what: Mismatched::Capability,
                    version: CsiVersion::V0,
                },
                "Mismatched capability for volume 'vol-1'",
            ),
            (
                VolumeError::Mismatch {
                    id: id(),
                    what: Mismatched::Parameters,
                    version: CsiVersion::V1,
                },
                "Mismatched parameters for volume 'vol-1'",
            ),
            (
                VolumeError::Mismatch {
                    id: id(),
                    what: Mismatched::Parameters,
                    version: CsiVersion::V0,
                },
                "Mismatched parameters for volume 'vol-1'",
            ),
            (
                VolumeError::ValidationFailed {
                    id: id(),
                    reason: ValidationFailure::NotConfirmed {
                        message: "too big".into(),
                    },
                    version: CsiVersion::V1,
                },
                "Validation failed for volume 'vol-1': too big",
            ),
            (
                VolumeError::ValidationFailed {
                    id: id(),
                    reason: ValidationFailure::NotConfirmed {
                        message: "too big".into(),
                    },
                    version: CsiVersion::V0,
                },
                "Unsupported volume capability for volume 'vol-1': too big",
            ),
            (
                VolumeError::ValidationFailed {
                    id: id(),
                    reason: ValidationFailure::MismatchedVolumeContext,
                    version: CsiVersion::V1,
                },
                "Validation failed for volume 'vol-1': Mismatched volume context",
            ),
            (
                VolumeError::ValidationFailed {
                    id: id(),
                    reason: ValidationFailure::UnsupportedCapability,
                    version: CsiVersion::V1,
                },
                "Validation failed for volume 'vol-1': Unsupported volume capability",
            ),
            (
                VolumeError::ValidationFailed {
                    id: id(),
                    reason: ValidationFailure::MismatchedParameters,
                    version: CsiVersion::V1,
                },
                "Validation failed for volume 'vol-1': Mismatched parameters",
            ),
            (
                VolumeError::AlreadyValidated { id: id() },
                "Volume 'vol-1' already validated",
            ),
            (
                VolumeError::TargetNotCreated {
                    id: id(),
                    path: "/m/vol-1/target".into(),
                },
                "Target path '/m/vol-1/target' not created",
            ),
            (
                VolumeError::TargetNotRemoved {
                    id: id(),
                    path: "/m/vol-1/target".into(),
                },
                "Target path '/m/vol-1/target' not removed",
            ),
        ];
        for (e, text) in &cases {
            assert_eq!(e.to_string(), *text, "{e:?}");
        }
    }

    #[test]
    fn messages_with_a_cause_keep_the_mesos_prefix() {
        let denied = io().to_string();
        let cases: Vec<(VolumeError, String)> = vec![
            (
                VolumeError::Prepare {
                    dir: PreparedDir::Staging,
                    path: PathBuf::from("/m/v/staging"),
                    source: io(),
                },
                format!("Failed to create mount staging path '/m/v/staging': {denied}"),
            ),
            (
                VolumeError::Prepare {
                    dir: PreparedDir::Target,
                    path: PathBuf::from("/m/v/target"),
                    source: io(),
                },
                format!("Failed to create the target path '/m/v/target': {denied}"),
            ),
            (
                VolumeError::Prepare {
                    dir: PreparedDir::TargetParent,
                    path: PathBuf::from("/m/v/target"),
                    source: io(),
                },
                format!("Failed to create parent directory of target path '/m/v/target': {denied}"),
            ),
            (
                VolumeError::Cleanup {
                    id: id(),
                    source: io(),
                },
                format!("Failed to clean up volume 'vol-1': {denied}"),
            ),
        ];
        for (e, text) in &cases {
            assert_eq!(DisplayChain(e).to_string(), *text, "{e:?}");
        }
    }

    #[test]
    fn rpc_failures_name_their_typed_subject() {
        let e = |subject| VolumeError::Csi {
            rpc: CsiRpc::CreateVolume,
            subject,
            source: csi(Code::Internal),
        };
        assert_eq!(
            e(Subject::Volume(id())).to_string(),
            "CreateVolume failed for volume 'vol-1'"
        );
        assert_eq!(
            e(Subject::Name("op".into())).to_string(),
            "CreateVolume failed for volume name 'op'"
        );
        assert_eq!(e(Subject::None).to_string(), "CreateVolume failed");
    }
}
