//! [`VolumeError`]: failures of the volume manager.

use std::path::PathBuf;

use slrp_csi::{CsiError, CsiRpc, VolumeId};
use slrp_store::StoreError;

use super::paths::PathError;
use super::state::{StateName, TransitionError};

/// Errors of the volume manager. `Display` names this layer only; causes are in `source()`.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// The volume is not tracked.
    #[error("volume {id} is not tracked")]
    UnknownVolume {
        /// The volume.
        id: VolumeId,
    },
    /// A CSI call failed; the volume stays in the call's in-flight state, so the next
    /// request or recovery re-drives or undoes it.
    #[error("{rpc} failed for volume {volume}")]
    Csi {
        /// The RPC.
        rpc: CsiRpc,
        /// Volume id, or the CreateVolume name.
        volume: String,
        /// The client's error.
        #[source]
        source: CsiError,
    },
    /// Making a change durable failed. Fatal (the manager stops and the next start
    /// recovers from what is on disk) unless the store refused the change before writing
    /// anything, e.g. a volume id longer than a store key may be
    /// ([`StoreError::is_fatal`]).
    #[error("persisting the state of volume {volume} failed")]
    Store {
        /// Volume id, or the CreateVolume name.
        volume: String,
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
    /// The plugin lacks a capability the request needs.
    #[error("the CSI plugin does not support {what}")]
    Unsupported {
        /// The missing capability.
        what: &'static str,
    },
    /// The request is malformed.
    #[error("invalid request: {what}")]
    InvalidRequest {
        /// What is wrong.
        what: String,
    },
    /// A tracked volume was asked for with another capability or other parameters than it
    /// was created or validated with (Mesos: "Mismatched capability/parameters").
    #[error("volume {id} is tracked with a different {what}")]
    Mismatch {
        /// The volume.
        id: VolumeId,
        /// `capability`, `parameters`, or `name` (CreateVolume returned a volume tracked
        /// under another name or validated).
        what: &'static str,
    },
    /// `ValidateVolumeCapabilities` did not confirm the capability.
    #[error("the plugin did not confirm the capability of volume {id}: {message}")]
    NotConfirmed {
        /// The volume.
        id: VolumeId,
        /// The plugin's explanation.
        message: String,
    },
    /// The volume id cannot be mapped to a mount directory.
    #[error("volume {id} has no usable mount path")]
    Path {
        /// The volume.
        id: VolumeId,
        /// Why.
        #[source]
        source: PathError,
    },
    /// Preparing a staging or target directory failed.
    #[error("preparing {path} failed")]
    Prepare {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A transition was refused (a planning bug; the state is unchanged).
    #[error("volume {id} cannot move on from {state}")]
    Transition {
        /// The volume.
        id: VolumeId,
        /// Its state.
        state: StateName,
        /// The refusal.
        #[source]
        source: TransitionError,
    },
    /// NodePublishVolume succeeded but left nothing at the target path (Mesos's text);
    /// the volume stays in NODE_PUBLISH.
    #[error("Target path '{}' not created", path.display())]
    TargetNotCreated {
        /// The target path.
        path: PathBuf,
    },
    /// NodeUnpublishVolume succeeded but the plugin, which creates its target paths, left
    /// the target in place (Mesos's text); the volume stays in NODE_UNPUBLISH.
    #[error("Target path '{}' not removed", path.display())]
    TargetNotRemoved {
        /// The target path.
        path: PathBuf,
    },
    /// A secret reference could not be resolved.
    #[error("secret {name:?} (key {key:?}) for volume {id} cannot be resolved")]
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

impl VolumeError {
    /// Whether the manager must stop: durability can no longer be promised, and the
    /// next start recovers from what is on disk (conventions §4.4 rule 5).
    pub fn is_fatal(&self) -> bool {
        match self {
            // A refused key or an unencodable record was never sent to the writer: nothing
            // changed, so only the request that carried it fails.
            Self::Store { source, .. } => source.is_fatal(),
            Self::Load { .. } | Self::Injected { .. } => true,
            Self::UnknownVolume { .. }
            | Self::Csi { .. }
            | Self::Unsupported { .. }
            | Self::InvalidRequest { .. }
            | Self::Mismatch { .. }
            | Self::NotConfirmed { .. }
            | Self::Path { .. }
            | Self::Prepare { .. }
            | Self::Transition { .. }
            | Self::TargetNotCreated { .. }
            | Self::TargetNotRemoved { .. }
            | Self::Secret { .. }
            | Self::RecoveryFailed { .. }
            | Self::Stopped => false,
        }
    }
}
