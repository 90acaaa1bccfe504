//! Errors of the CSI client layer and their retry classification.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use tonic::Code;

use crate::answer::Violation;
use crate::types::{CsiVersion, VolumeId};

/// A CSI RPC, named as in the service definition (the same names in v0 and v1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(missing_docs)] // The variants are the CSI method names.
pub enum CsiRpc {
    GetPluginInfo,
    GetPluginCapabilities,
    Probe,
    CreateVolume,
    DeleteVolume,
    ControllerPublishVolume,
    ControllerUnpublishVolume,
    ValidateVolumeCapabilities,
    ListVolumes,
    GetCapacity,
    ControllerGetCapabilities,
    ControllerExpandVolume,
    ControllerGetVolume,
    NodeStageVolume,
    NodeUnstageVolume,
    NodePublishVolume,
    NodeUnpublishVolume,
    NodeGetVolumeStats,
    NodeExpandVolume,
    NodeGetCapabilities,
    /// `NodeGetInfo`, or `NodeGetId` for CSI 0.2 plugins (counted as one RPC).
    NodeGetInfo,
    CreateSnapshot,
    DeleteSnapshot,
    ListSnapshots,
}

impl CsiRpc {
    /// Every RPC the client issues.
    pub const ALL: [CsiRpc; 24] = [
        Self::GetPluginInfo,
        Self::GetPluginCapabilities,
        Self::Probe,
        Self::CreateVolume,
        Self::DeleteVolume,
        Self::ControllerPublishVolume,
        Self::ControllerUnpublishVolume,
        Self::ValidateVolumeCapabilities,
        Self::ListVolumes,
        Self::GetCapacity,
        Self::ControllerGetCapabilities,
        Self::ControllerExpandVolume,
        Self::ControllerGetVolume,
        Self::NodeStageVolume,
        Self::NodeUnstageVolume,
        Self::NodePublishVolume,
        Self::NodeUnpublishVolume,
        Self::NodeGetVolumeStats,
        Self::NodeExpandVolume,
        Self::NodeGetCapabilities,
        Self::NodeGetInfo,
        Self::CreateSnapshot,
        Self::DeleteSnapshot,
        Self::ListSnapshots,
    ];

    /// The CSI method name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::GetPluginInfo => "GetPluginInfo",
            Self::GetPluginCapabilities => "GetPluginCapabilities",
            Self::Probe => "Probe",
            Self::CreateVolume => "CreateVolume",
            Self::DeleteVolume => "DeleteVolume",
            Self::ControllerPublishVolume => "ControllerPublishVolume",
            Self::ControllerUnpublishVolume => "ControllerUnpublishVolume",
            Self::ValidateVolumeCapabilities => "ValidateVolumeCapabilities",
            Self::ListVolumes => "ListVolumes",
            Self::GetCapacity => "GetCapacity",
            Self::ControllerGetCapabilities => "ControllerGetCapabilities",
            Self::ControllerExpandVolume => "ControllerExpandVolume",
            Self::ControllerGetVolume => "ControllerGetVolume",
            Self::NodeStageVolume => "NodeStageVolume",
            Self::NodeUnstageVolume => "NodeUnstageVolume",
            Self::NodePublishVolume => "NodePublishVolume",
            Self::NodeUnpublishVolume => "NodeUnpublishVolume",
            Self::NodeGetVolumeStats => "NodeGetVolumeStats",
            Self::NodeExpandVolume => "NodeExpandVolume",
            Self::NodeGetCapabilities => "NodeGetCapabilities",
            Self::NodeGetInfo => "NodeGetInfo",
            Self::CreateSnapshot => "CreateSnapshot",
            Self::DeleteSnapshot => "DeleteSnapshot",
            Self::ListSnapshots => "ListSnapshots",
        }
    }

    /// Parses a CSI method name (exact spelling).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

impl fmt::Display for CsiRpc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a caller should do about a failed call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryClass {
    /// The same call may succeed later (plugin busy, restarting, slow), and its effect
    /// may already have happened (timed out or cancelled after it was sent).
    Transient,
    /// Retrying the same call cannot help.
    Permanent,
    /// The effect the call wanted is already in place (e.g. `DeleteVolume` → `NOT_FOUND`);
    /// callers treat it as success.
    AlreadyDone,
}

/// Errors of the CSI client. `Display` describes this layer only; causes are in `source()`.
#[derive(Debug, thiserror::Error)]
pub enum CsiError {
    /// The endpoint string is not a usable unix socket address.
    #[error("invalid CSI endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Preparing a short alias for a socket path longer than `sun_path` failed.
    #[error("creating a short alias for socket path {path}")]
    SocketAlias {
        /// The long socket path.
        path: PathBuf,
        /// The I/O failure.
        #[source]
        source: std::io::Error,
    },
    /// The plugin answered with a gRPC error.
    #[error("{rpc} failed with {code:?}")]
    Rpc {
        /// The RPC.
        rpc: CsiRpc,
        /// gRPC status code.
        code: Code,
        /// The status, including the plugin's message.
        #[source]
        source: tonic::Status,
    },
    /// No answer within the per-RPC deadline.
    #[error("{rpc} timed out after {after:?}")]
    Timeout {
        /// The RPC.
        rpc: CsiRpc,
        /// The deadline.
        after: Duration,
    },
    /// The call was cancelled by the caller (shutdown).
    #[error("{rpc} cancelled")]
    Cancelled {
        /// The RPC.
        rpc: CsiRpc,
    },
    /// Neither `csi.v1` nor `csi.v0` is served at the endpoint.
    #[error(
        "plugin at {endpoint} serves neither csi.v1 nor csi.v0 (Probe is UNIMPLEMENTED in both)"
    )]
    UnknownVersion {
        /// The endpoint.
        endpoint: String,
    },
    /// The request needs something the plugin's CSI version does not have.
    #[error("{rpc} with {what} is not available in CSI {version}")]
    Unsupported {
        /// The RPC.
        rpc: CsiRpc,
        /// The plugin's version.
        version: CsiVersion,
        /// The missing feature.
        what: &'static str,
    },
    /// The plugin's answer breaks a rule of the CSI spec or a bound of slrp's
    /// ([`crate::answer`]); nothing of it was used.
    #[error("{rpc} returned an answer slrp refuses: {violation}")]
    InvalidResponse {
        /// The RPC.
        rpc: CsiRpc,
        /// The rule or bound it breaks (boxed: it is large, and the error is passed by
        /// value everywhere).
        violation: Box<Violation>,
        /// The id of the volume a refused CreateVolume answer names, when it is one slrp
        /// can send back (non-empty, at most [`crate::answer::MAX_CLEANUP_ID_BYTES`]):
        /// the plugin created that volume, and the caller deletes it.
        created: Option<VolumeId>,
    },
    /// The request itself is invalid (caught before it is sent).
    #[error("invalid {rpc} request: {what}")]
    InvalidRequest {
        /// The RPC.
        rpc: CsiRpc,
        /// What is wrong.
        what: String,
    },
    /// The supervised endpoint did not become ready within the call's deadline; the call
    /// was not sent (see [`crate::readiness`]).
    #[error("{rpc} timed out after {after:?} waiting for plugin endpoint {endpoint} to be ready")]
    NotReady {
        /// The RPC.
        rpc: CsiRpc,
        /// The endpoint waited for.
        endpoint: String,
        /// The deadline.
        after: Duration,
    },
    /// The supervised endpoint was stopped for good; the call was not sent.
    #[error("{rpc} not sent: plugin endpoint {endpoint} is stopped")]
    EndpointStopped {
        /// The RPC.
        rpc: CsiRpc,
        /// The endpoint.
        endpoint: String,
    },
    /// The plugin has no container serving the service the RPC belongs to.
    #[error("{rpc} not sent: the plugin has no {service} service")]
    NoService {
        /// The RPC.
        rpc: CsiRpc,
        /// The missing service (`controller`).
        service: &'static str,
    },
}

impl CsiError {
    /// An answer from the plugin with gRPC `code` and `message`, as fakes and tests
    /// produce it (the real client builds these from the transport).
    pub fn status(rpc: CsiRpc, code: Code, message: impl Into<String>) -> Self {
        Self::Rpc {
            rpc,
            code,
            source: tonic::Status::new(code, message),
        }
    }

    /// The RPC this error belongs to, if any.
    pub fn rpc(&self) -> Option<CsiRpc> {
        match self {
            Self::Rpc { rpc, .. }
            | Self::Timeout { rpc, .. }
            | Self::Cancelled { rpc }
            | Self::Unsupported { rpc, .. }
            | Self::InvalidResponse { rpc, .. }
            | Self::InvalidRequest { rpc, .. }
            | Self::NotReady { rpc, .. }
            | Self::EndpointStopped { rpc, .. }
            | Self::NoService { rpc, .. } => Some(*rpc),
            Self::InvalidEndpoint { .. }
            | Self::SocketAlias { .. }
            | Self::UnknownVersion { .. } => None,
        }
    }

    /// The gRPC code, for errors that carry one (a local timeout counts as
    /// `DEADLINE_EXCEEDED`, as gRPC reports an expired deadline).
    pub fn code(&self) -> Option<Code> {
        match self {
            Self::Rpc { code, .. } => Some(*code),
            Self::Timeout { .. } | Self::NotReady { .. } => Some(Code::DeadlineExceeded),
            Self::Cancelled { .. } => Some(Code::Cancelled),
            // No code: a stopped endpoint never comes back, so no retry policy (they retry
            // by code, and UNAVAILABLE is in Mesos's) may spin on it until shutdown.
            Self::EndpointStopped { .. }
            | Self::NoService { .. }
            | Self::InvalidEndpoint { .. }
            | Self::SocketAlias { .. }
            | Self::UnknownVersion { .. }
            | Self::Unsupported { .. }
            | Self::InvalidResponse { .. }
            | Self::InvalidRequest { .. } => None,
        }
    }

    /// Classifies the error for callers that decide between retrying, failing and
    /// treating the call as done. This is the general classification; which transient
    /// failures are actually retried is the caller's [`crate::RetryPolicy`]'s decision.
    pub fn retry_class(&self) -> RetryClass {
        match self {
            Self::Rpc { rpc, code, .. } => classify_code(*rpc, *code),
            // Like a timeout, a cancelled call may or may not have taken effect in the
            // plugin; calling it Permanent would tell callers that nothing happened (the
            // volume manager then drops its CreateVolume intent and orphans a volume).
            Self::Timeout { .. } | Self::Cancelled { .. } => RetryClass::Transient,
            // The plugin may be back later; nothing was sent.
            Self::NotReady { .. } => RetryClass::Transient,
            Self::EndpointStopped { .. }
            | Self::NoService { .. }
            | Self::InvalidEndpoint { .. }
            | Self::SocketAlias { .. }
            | Self::UnknownVersion { .. }
            | Self::Unsupported { .. }
            | Self::InvalidResponse { .. }
            | Self::InvalidRequest { .. } => RetryClass::Permanent,
        }
    }
}

impl CsiError {
    /// A wait for the endpoint that ended while detecting the version before `rpc`
    /// belongs to `rpc`: the caller asked for `rpc`, and nothing was sent.
    pub(crate) fn waited_for(self, rpc: CsiRpc) -> Self {
        match self {
            Self::NotReady {
                endpoint, after, ..
            } => Self::NotReady {
                rpc,
                endpoint,
                after,
            },
            Self::EndpointStopped { endpoint, .. } => Self::EndpointStopped { rpc, endpoint },
            other => other,
        }
    }

    /// Whether the plugin may have acted on the call: it was sent and the answer does not
    /// rule an effect out. A question apart from [`CsiError::retry_class`]: `ABORTED`
    /// ("operation pending for volume") is worth retrying *and* means the pending
    /// operation may still complete; `RESOURCE_EXHAUSTED` is worth retrying later but
    /// created nothing. Callers that keep an intent until its effect is settled (the
    /// volume manager's CreateVolume intent) ask this one.
    pub fn may_have_taken_effect(&self) -> bool {
        match self {
            Self::Rpc { code, .. } => code_may_have_taken_effect(*code),
            // Sent (or about to be) with no answer; an invalid answer to a successful
            // call may hide a volume that exists.
            Self::Timeout { .. } | Self::Cancelled { .. } | Self::InvalidResponse { .. } => true,
            Self::InvalidEndpoint { .. }
            | Self::SocketAlias { .. }
            | Self::UnknownVersion { .. }
            | Self::Unsupported { .. }
            | Self::InvalidRequest { .. }
            | Self::NotReady { .. }
            | Self::EndpointStopped { .. }
            | Self::NoService { .. } => false,
        }
    }
}

/// Whether a call answered with `code` may have had its effect in the plugin.
///
/// The codes the CSI spec's error tables give for requests the plugin refused before
/// acting (bad arguments, conflicts, no space, unsupported) rule an effect out. The
/// others leave it open: `DEADLINE_EXCEEDED`, `CANCELLED` and `UNAVAILABLE` (the call may
/// have been processed before the answer was lost), `ABORTED` (CSI: an operation for the
/// volume is pending, so it may still complete), and `UNKNOWN`, `INTERNAL`, `DATA_LOSS`,
/// which say nothing about how far the plugin got.
pub fn code_may_have_taken_effect(code: Code) -> bool {
    match code {
        Code::DeadlineExceeded
        | Code::Unavailable
        | Code::Cancelled
        | Code::Aborted
        | Code::Unknown
        | Code::Internal
        | Code::DataLoss => true,
        Code::Ok
        | Code::InvalidArgument
        | Code::NotFound
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::Unauthenticated
        | Code::ResourceExhausted
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::Unimplemented => false,
    }
}

/// Classification of a gRPC code returned by `rpc`.
///
/// `NOT_FOUND` from the calls that remove something means "already removed": the CSI spec
/// asks plugins to answer OK in that case, but some answer `NOT_FOUND`, and either way
/// the goal is reached.
pub fn classify_code(rpc: CsiRpc, code: Code) -> RetryClass {
    match code {
        Code::Unavailable | Code::DeadlineExceeded | Code::Aborted | Code::ResourceExhausted => {
            RetryClass::Transient
        }
        Code::NotFound
            if matches!(
                rpc,
                CsiRpc::DeleteVolume
                    | CsiRpc::DeleteSnapshot
                    | CsiRpc::ControllerUnpublishVolume
                    | CsiRpc::NodeUnstageVolume
                    | CsiRpc::NodeUnpublishVolume
            ) =>
        {
            RetryClass::AlreadyDone
        }
        Code::Ok
        | Code::Cancelled
        | Code::Unknown
        | Code::InvalidArgument
        | Code::NotFound
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::Unimplemented
        | Code::Internal
        | Code::DataLoss
        | Code::Unauthenticated => RetryClass::Permanent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delete_not_found_is_already_done_but_create_not_found_is_permanent() {
        assert_eq!(
            classify_code(CsiRpc::DeleteVolume, Code::NotFound),
            RetryClass::AlreadyDone
        );
        assert_eq!(
            classify_code(CsiRpc::NodeUnpublishVolume, Code::NotFound),
            RetryClass::AlreadyDone
        );
        assert_eq!(
            classify_code(CsiRpc::CreateVolume, Code::NotFound),
            RetryClass::Permanent
        );
        assert_eq!(
            classify_code(CsiRpc::CreateVolume, Code::Unavailable),
            RetryClass::Transient
        );
        assert_eq!(
            classify_code(CsiRpc::Probe, Code::Unimplemented),
            RetryClass::Permanent
        );
    }

    #[test]
    fn rpc_names_round_trip() {
        for rpc in CsiRpc::ALL {
            assert_eq!(CsiRpc::parse(rpc.as_str()), Some(rpc));
        }
        assert_eq!(CsiRpc::parse("createvolume"), None);
    }

    #[test]
    fn a_cancelled_call_is_not_permanent() {
        // Its outcome is unknown: the plugin may have created the volume already.
        let e = CsiError::Cancelled {
            rpc: CsiRpc::CreateVolume,
        };
        assert_eq!(e.retry_class(), RetryClass::Transient);
    }

    #[test]
    fn retrying_and_having_had_an_effect_are_separate_questions() {
        let status = |code| CsiError::status(CsiRpc::CreateVolume, code, "x");
        // Worth retrying, created nothing.
        let e = status(Code::ResourceExhausted);
        assert_eq!(e.retry_class(), RetryClass::Transient);
        assert!(!e.may_have_taken_effect());
        // Worth retrying, and the pending operation may still create the volume.
        let e = status(Code::Aborted);
        assert_eq!(e.retry_class(), RetryClass::Transient);
        assert!(e.may_have_taken_effect());
        // Not worth retrying, and nothing is known about how far the plugin got.
        let e = status(Code::Internal);
        assert_eq!(e.retry_class(), RetryClass::Permanent);
        assert!(e.may_have_taken_effect());
        for refused in [
            Code::InvalidArgument,
            Code::OutOfRange,
            Code::AlreadyExists,
            Code::Unimplemented,
            Code::FailedPrecondition,
        ] {
            assert!(!status(refused).may_have_taken_effect(), "{refused:?}");
        }
        for unknown in [Code::DeadlineExceeded, Code::Unavailable, Code::Cancelled] {
            assert!(status(unknown).may_have_taken_effect(), "{unknown:?}");
        }
        let not_sent = CsiError::NotReady {
            rpc: CsiRpc::CreateVolume,
            endpoint: "unix:///x".into(),
            after: Duration::from_secs(1),
        };
        assert_eq!(not_sent.retry_class(), RetryClass::Transient);
        assert!(!not_sent.may_have_taken_effect());
        assert!(
            CsiError::Cancelled {
                rpc: CsiRpc::CreateVolume
            }
            .may_have_taken_effect()
        );
    }

    #[test]
    fn a_stopped_endpoint_is_retried_by_no_policy() {
        let e = CsiError::EndpointStopped {
            rpc: CsiRpc::DeleteVolume,
            endpoint: "unix:///run/p.sock".to_owned(),
        };
        assert_eq!(e.retry_class(), RetryClass::Permanent);
        assert!(!crate::RetryPolicy::mesos().retries(&e));
    }

    #[test]
    fn local_timeout_counts_as_deadline_exceeded() {
        let e = CsiError::Timeout {
            rpc: CsiRpc::CreateVolume,
            after: Duration::from_secs(1),
        };
        assert_eq!(e.code(), Some(Code::DeadlineExceeded));
        assert_eq!(e.retry_class(), RetryClass::Transient);
    }
}
