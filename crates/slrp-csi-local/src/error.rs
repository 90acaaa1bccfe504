//! Errors of the plugin's domain layer and their mapping to gRPC status codes.
//!
//! Every variant names the CSI error condition it stands for, so the v0/v1 adapters never
//! choose a code themselves: [`VolumeError::code`] is the single table from condition to
//! code, written after the per-RPC error tables of the CSI spec.

use std::path::PathBuf;

use slrp_types::DisplayChain;

use crate::host::HostError;
use crate::store::StoreError;

/// What an error's id names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    /// A volume.
    Volume,
    /// A snapshot.
    Snapshot,
}

impl std::fmt::Display for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Volume => "volume",
            Self::Snapshot => "snapshot",
        })
    }
}

/// Why a plugin operation failed. `Display` names this layer only; causes are in `source()`.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// A request field is missing or malformed (CSI: INVALID_ARGUMENT).
    #[error("invalid {field}: {reason}")]
    InvalidArgument {
        /// The request field at fault, as named in the CSI spec.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// No volume has this id (CSI: NOT_FOUND).
    #[error("volume {volume_id:?} does not exist")]
    VolumeNotFound {
        /// The id from the request.
        volume_id: String,
    },
    /// No snapshot has this id (CSI: NOT_FOUND).
    #[error("snapshot {snapshot_id:?} does not exist")]
    SnapshotNotFound {
        /// The id from the request.
        snapshot_id: String,
    },
    /// The volume exists but not at the path the request names (CSI: NOT_FOUND).
    #[error("volume {volume_id} is not available at {path}")]
    PathNotFound {
        /// The volume.
        volume_id: String,
        /// The path from the request.
        path: PathBuf,
    },
    /// A volume or publication exists with incompatible arguments (CSI: ALREADY_EXISTS).
    #[error("{what}")]
    AlreadyExists {
        /// What conflicts, for the status message.
        what: String,
    },
    /// The requested size cannot be provided (CSI: OUT_OF_RANGE).
    #[error("capacity out of range: {reason}")]
    OutOfRange {
        /// Why.
        reason: String,
    },
    /// The pool has no room for a snapshot (CSI CreateSnapshot: RESOURCE_EXHAUSTED).
    #[error("not enough space: {reason}")]
    NoSpace {
        /// Why.
        reason: String,
    },
    /// The volume is in a state that does not allow the call (CSI: FAILED_PRECONDITION).
    #[error("{reason}")]
    FailedPrecondition {
        /// Why.
        reason: String,
    },
    /// A `starting_token` was not issued by this plugin (CSI: ABORTED).
    #[error("invalid starting_token {token:?}")]
    InvalidToken {
        /// The token from the request.
        token: String,
    },
    /// The node already holds `max_volumes_per_node` staged volumes (CSI: RESOURCE_EXHAUSTED).
    #[error("node already has {limit} staged volumes")]
    TooManyVolumes {
        /// The configured limit.
        limit: u64,
    },
    /// Reading or writing the plugin's own metadata failed (INTERNAL).
    #[error("metadata of {subject} {id}")]
    Store {
        /// What `id` names.
        subject: Subject,
        /// The volume or snapshot whose record was being written.
        id: String,
        /// The cause.
        #[source]
        source: StoreError,
    },
    /// A host operation (mount, loop device, mkfs, copy, file system call) failed
    /// (INTERNAL; an external tool that timed out: DEADLINE_EXCEEDED, see
    /// [`VolumeError::code`]).
    #[error("{action} for {subject} {id}")]
    Host {
        /// What the plugin was doing.
        action: &'static str,
        /// What `id` names.
        subject: Subject,
        /// The volume or snapshot concerned.
        id: String,
        /// The cause.
        #[source]
        source: HostError,
    },
}

impl VolumeError {
    /// The gRPC code the CSI spec prescribes for this condition.
    ///
    /// The spec has no row for a plugin-side timeout. A tool killed by the tool timeout is
    /// DEADLINE_EXCEEDED: gRPC's code for "did not finish in time, the state may have
    /// changed", which COs retry (Mesos retries it and UNAVAILABLE; Kubernetes sidecars
    /// treat it as "operation may still be in progress"). A retry is safe because every
    /// node operation is idempotent and an interrupted mkfs is redone, not adopted.
    pub fn code(&self) -> tonic::Code {
        match self {
            Self::Host {
                source: HostError::Timeout(_),
                ..
            } => tonic::Code::DeadlineExceeded,
            Self::InvalidArgument { .. } => tonic::Code::InvalidArgument,
            Self::VolumeNotFound { .. }
            | Self::SnapshotNotFound { .. }
            | Self::PathNotFound { .. } => tonic::Code::NotFound,
            Self::AlreadyExists { .. } => tonic::Code::AlreadyExists,
            Self::OutOfRange { .. } => tonic::Code::OutOfRange,
            Self::FailedPrecondition { .. } => tonic::Code::FailedPrecondition,
            Self::InvalidToken { .. } => tonic::Code::Aborted,
            Self::TooManyVolumes { .. } | Self::NoSpace { .. } => tonic::Code::ResourceExhausted,
            Self::Store { .. } | Self::Host { .. } => tonic::Code::Internal,
        }
    }

    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field,
            reason: reason.into(),
        }
    }

    pub(crate) fn precondition(reason: impl Into<String>) -> Self {
        Self::FailedPrecondition {
            reason: reason.into(),
        }
    }

    pub(crate) fn host(action: &'static str, volume_id: &str, source: HostError) -> Self {
        Self::Host {
            action,
            subject: Subject::Volume,
            id: volume_id.to_owned(),
            source,
        }
    }

    pub(crate) fn snapshot_host(
        action: &'static str,
        snapshot_id: &str,
        source: HostError,
    ) -> Self {
        Self::Host {
            action,
            subject: Subject::Snapshot,
            id: snapshot_id.to_owned(),
            source,
        }
    }

    pub(crate) fn store(volume_id: &str, source: StoreError) -> Self {
        Self::Store {
            subject: Subject::Volume,
            id: volume_id.to_owned(),
            source,
        }
    }

    pub(crate) fn snapshot_store(snapshot_id: &str, source: StoreError) -> Self {
        Self::Store {
            subject: Subject::Snapshot,
            id: snapshot_id.to_owned(),
            source,
        }
    }
}

impl From<VolumeError> for tonic::Status {
    fn from(err: VolumeError) -> Self {
        let code = err.code();
        match code {
            tonic::Code::Internal => tracing::error!(error = %DisplayChain(&err), "request failed"),
            tonic::Code::DeadlineExceeded => {
                tracing::warn!(error = %DisplayChain(&err), "request timed out; the CO may retry");
            }
            _ => {}
        }
        tonic::Status::new(code, DisplayChain(&err).to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_follow_the_csi_tables() {
        assert_eq!(
            VolumeError::invalid("volume_id", "empty").code(),
            tonic::Code::InvalidArgument
        );
        assert_eq!(
            VolumeError::VolumeNotFound {
                volume_id: "x".into()
            }
            .code(),
            tonic::Code::NotFound
        );
        assert_eq!(
            VolumeError::InvalidToken { token: "t".into() }.code(),
            tonic::Code::Aborted
        );
        assert_eq!(
            VolumeError::OutOfRange { reason: "r".into() }.code(),
            tonic::Code::OutOfRange
        );
        assert_eq!(
            VolumeError::SnapshotNotFound {
                snapshot_id: "s".into()
            }
            .code(),
            tonic::Code::NotFound
        );
        assert_eq!(
            VolumeError::NoSpace { reason: "r".into() }.code(),
            tonic::Code::ResourceExhausted
        );
        assert_eq!(
            VolumeError::snapshot_store(
                "snap-1",
                StoreError::Locked {
                    path: PathBuf::from("/l")
                }
            )
            .to_string(),
            "metadata of snapshot snap-1"
        );
    }

    #[test]
    fn tool_timeouts_are_retryable() {
        let timeout = VolumeError::host(
            "formatting",
            "vol-1",
            HostError::Timeout(Box::new(crate::host::ToolTimeout {
                command: "mkfs.ext4 /dev/loop0".into(),
                after: std::time::Duration::from_secs(120),
                stderr: "Discarding device blocks".into(),
            })),
        );
        assert_eq!(timeout.code(), tonic::Code::DeadlineExceeded);
        let status = tonic::Status::from(timeout);
        assert_eq!(
            status.message(),
            "formatting for volume vol-1: mkfs.ext4 /dev/loop0 did not finish within 120s and was killed; stderr: Discarding device blocks"
        );
        let failed = VolumeError::host(
            "formatting",
            "vol-1",
            HostError::Output {
                command: "mkfs.xfs".into(),
                output: String::new(),
            },
        );
        assert_eq!(failed.code(), tonic::Code::Internal);
    }

    #[test]
    fn status_message_carries_the_chain() {
        let err = VolumeError::host(
            "attaching loop device",
            "vol-1",
            HostError::Io {
                op: "open",
                path: PathBuf::from("/x"),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            },
        );
        let status = tonic::Status::from(err);
        assert_eq!(status.code(), tonic::Code::Internal);
        assert!(
            status
                .message()
                .starts_with("attaching loop device for volume vol-1: open /x")
        );
    }
}
