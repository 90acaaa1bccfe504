//! The pure volume state machine: no I/O, no clock, no tokio.
//!
//! A driver (the volume manager) moves one volume towards a [`Goal`] with this loop:
//!
//! 1. `(record, call) = record.next_call(goal, caps, boot)` applies every transition the
//!    plugin's capabilities make a no-op (in memory) and names the next RPC, if any;
//! 2. `record = record.begin(call, boot)?` enters the in-flight state, which the driver
//!    makes durable *before* sending the RPC;
//! 3. after a successful RPC, `record = record.finish(call, publish_context)?` settles,
//!    and the driver persists it; a failed RPC keeps the in-flight state (Mesos's rule).
//!
//! On start, [`super::plan::plan_recovery`] maps stored records to the current boot and
//! the mount table and names the jobs that finish interrupted calls. See
//! `docs/state-machines.md`.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use slrp_csi::{CsiCapabilities, CsiRpc, StringMap, VolumeCapability, VolumeId};
use slrp_store::{Kind, Record};

pub use slrp_types::BootId;

/// Where a secret comes from: a reference resolved when the RPC is built. Secret *values*
/// are never part of a record, so they never reach the disk or `slrp inspect`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SecretRef {
    /// Name of the secret.
    pub name: String,
    /// Key within the secret.
    pub key: String,
}

/// What does not change over a volume's life: how it is used and with what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeSpec {
    /// The capability the volume was created or validated with.
    pub capability: VolumeCapability,
    /// CreateVolume parameters (from the profile).
    #[serde(default)]
    pub parameters: StringMap,
    /// Volume context returned by CreateVolume (or given for a pre-existing volume).
    #[serde(default)]
    pub volume_context: StringMap,
    /// Publish read-only (ControllerPublish and NodePublish `readonly`).
    #[serde(default)]
    pub readonly: bool,
    /// The volume was not created by slrp (it came from ListVolumes or the CSI server).
    #[serde(default)]
    pub pre_provisioned: bool,
    /// NodeStageVolume secrets, by CSI secret key.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_stage_secrets: BTreeMap<String, SecretRef>,
    /// NodePublishVolume secrets, by CSI secret key.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_publish_secrets: BTreeMap<String, SecretRef>,
    /// Forget the volume once it is unstaged (back at NODE_READY after an unpublish):
    /// Mesos's `pre_provisioned` of a volume its agent's CSI server published for a task
    /// (spec §4.6 unstage steps 1, 3, 6). Only `slrp import-mesos` sets it; slrp's own
    /// volumes keep being tracked until they are deleted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub untrack_on_unstage: bool,
}

/// Durable lifecycle of one volume (Mesos `VolumeState`). Each variant carries exactly the
/// data valid in it. In-flight variants (`*ing`) are written *before* their RPC is sent.
///
/// `boot_id` appears from `NodeStaging` on: the boot in which staging was (or may have
/// been) done. A stale boot id means the staging and publish mounts are gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state")]
pub enum VolumeState {
    /// Provisioned, not attached to this node.
    #[serde(rename = "CREATED")]
    Created,
    /// ControllerPublishVolume in flight.
    #[serde(rename = "CONTROLLER_PUBLISH")]
    ControllerPublishing,
    /// Attached to this node (or the plugin needs no attach).
    #[serde(rename = "NODE_READY")]
    NodeReady {
        /// ControllerPublishVolume's `publish_context`.
        publish_context: StringMap,
    },
    /// ControllerUnpublishVolume in flight.
    #[serde(rename = "CONTROLLER_UNPUBLISH")]
    ControllerUnpublishing,
    /// NodeStageVolume in flight.
    #[serde(rename = "NODE_STAGE")]
    NodeStaging {
        /// Boot in which the RPC was sent.
        boot_id: BootId,
        /// ControllerPublishVolume's `publish_context`.
        publish_context: StringMap,
    },
    /// Staged at the staging path (or the plugin needs no staging).
    #[serde(rename = "VOL_READY")]
    VolReady {
        /// Boot in which staging happened.
        boot_id: BootId,
        /// ControllerPublishVolume's `publish_context`.
        publish_context: StringMap,
    },
    /// NodePublishVolume in flight.
    #[serde(rename = "NODE_PUBLISH")]
    NodePublishing {
        /// Boot in which staging happened.
        boot_id: BootId,
        /// ControllerPublishVolume's `publish_context`.
        publish_context: StringMap,
    },
    /// Published at the target path.
    #[serde(rename = "PUBLISHED")]
    Published {
        /// Boot in which staging happened.
        boot_id: BootId,
        /// ControllerPublishVolume's `publish_context`.
        publish_context: StringMap,
    },
    /// NodeUnpublishVolume in flight.
    #[serde(rename = "NODE_UNPUBLISH")]
    NodeUnpublishing {
        /// Boot in which staging happened.
        boot_id: BootId,
        /// ControllerPublishVolume's `publish_context`.
        publish_context: StringMap,
    },
    /// NodeUnstageVolume in flight.
    #[serde(rename = "NODE_UNSTAGE")]
    NodeUnstaging {
        /// Boot in which staging happened.
        boot_id: BootId,
        /// ControllerPublishVolume's `publish_context`.
        publish_context: StringMap,
    },
}

/// The name of a state, with Mesos's spelling and checkpoint number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StateName {
    /// `CREATED` (1).
    Created,
    /// `NODE_READY` (2).
    NodeReady,
    /// `PUBLISHED` (3).
    Published,
    /// `CONTROLLER_PUBLISH` (4).
    ControllerPublish,
    /// `CONTROLLER_UNPUBLISH` (5).
    ControllerUnpublish,
    /// `NODE_PUBLISH` (6).
    NodePublish,
    /// `NODE_UNPUBLISH` (7).
    NodeUnpublish,
    /// `VOL_READY` (8).
    VolReady,
    /// `NODE_STAGE` (9).
    NodeStage,
    /// `NODE_UNSTAGE` (10).
    NodeUnstage,
}

impl StateName {
    /// Mesos's name, e.g. `NODE_READY`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Created => "CREATED",
            Self::NodeReady => "NODE_READY",
            Self::Published => "PUBLISHED",
            Self::ControllerPublish => "CONTROLLER_PUBLISH",
            Self::ControllerUnpublish => "CONTROLLER_UNPUBLISH",
            Self::NodePublish => "NODE_PUBLISH",
            Self::NodeUnpublish => "NODE_UNPUBLISH",
            Self::VolReady => "VOL_READY",
            Self::NodeStage => "NODE_STAGE",
            Self::NodeUnstage => "NODE_UNSTAGE",
        }
    }
}

impl fmt::Display for StateName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a volume should end up. Deletion is the volume manager's business: it drives the
/// volume to `Created` and then calls DeleteVolume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Goal {
    /// Detached from the node.
    Created,
    /// Attached (controller-published).
    NodeReady,
    /// Staged.
    VolReady,
    /// Published at the target path.
    Published,
}

/// An RPC that moves a volume between states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CsiCall {
    /// `ControllerPublishVolume`.
    ControllerPublish,
    /// `ControllerUnpublishVolume`.
    ControllerUnpublish,
    /// `NodeStageVolume`.
    NodeStage,
    /// `NodeUnstageVolume`.
    NodeUnstage,
    /// `NodePublishVolume`.
    NodePublish,
    /// `NodeUnpublishVolume`.
    NodeUnpublish,
}

impl CsiCall {
    /// All calls.
    pub const ALL: [CsiCall; 6] = [
        Self::ControllerPublish,
        Self::ControllerUnpublish,
        Self::NodeStage,
        Self::NodeUnstage,
        Self::NodePublish,
        Self::NodeUnpublish,
    ];

    /// The CSI RPC.
    pub fn rpc(self) -> CsiRpc {
        match self {
            Self::ControllerPublish => CsiRpc::ControllerPublishVolume,
            Self::ControllerUnpublish => CsiRpc::ControllerUnpublishVolume,
            Self::NodeStage => CsiRpc::NodeStageVolume,
            Self::NodeUnstage => CsiRpc::NodeUnstageVolume,
            Self::NodePublish => CsiRpc::NodePublishVolume,
            Self::NodeUnpublish => CsiRpc::NodeUnpublishVolume,
        }
    }

    /// The CSI RPC name.
    pub fn rpc_name(self) -> &'static str {
        self.rpc().as_str()
    }

    /// Whether the plugin serves this RPC; without it the transition is an in-memory no-op.
    pub fn is_supported(self, caps: &CsiCapabilities) -> bool {
        match self {
            Self::ControllerPublish | Self::ControllerUnpublish => caps.controller_publish(),
            Self::NodeStage | Self::NodeUnstage => caps.node_stage(),
            Self::NodePublish | Self::NodeUnpublish => true,
        }
    }

    /// Whether the call moves away from `Created` (an undo call moves towards it).
    pub fn is_forward(self) -> bool {
        match self {
            Self::ControllerPublish | Self::NodeStage | Self::NodePublish => true,
            Self::ControllerUnpublish | Self::NodeUnstage | Self::NodeUnpublish => false,
        }
    }
}

impl fmt::Display for CsiCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.rpc_name())
    }
}

/// The next move towards a goal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Send this RPC (begin, persist, call, finish, persist).
    Call(CsiCall),
    /// The plugin lacks the capability: apply the transition in memory ([`VolumeState::skip`]).
    Skip(CsiCall),
}

/// A transition that is not allowed from the current state. Returned without any change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    /// `begin` or `skip` from a state the call cannot start from.
    #[error("{call} cannot start from state {state}")]
    CannotStart {
        /// The call.
        call: CsiCall,
        /// The current state.
        state: StateName,
    },
    /// `finish` for a call that is not in flight.
    #[error("{call} is not in flight (state {state})")]
    NotInFlight {
        /// The call.
        call: CsiCall,
        /// The current state.
        state: StateName,
    },
}

impl VolumeState {
    /// The state's name.
    pub fn name(&self) -> StateName {
        match self {
            Self::Created => StateName::Created,
            Self::ControllerPublishing => StateName::ControllerPublish,
            Self::NodeReady { .. } => StateName::NodeReady,
            Self::ControllerUnpublishing => StateName::ControllerUnpublish,
            Self::NodeStaging { .. } => StateName::NodeStage,
            Self::VolReady { .. } => StateName::VolReady,
            Self::NodePublishing { .. } => StateName::NodePublish,
            Self::Published { .. } => StateName::Published,
            Self::NodeUnpublishing { .. } => StateName::NodeUnpublish,
            Self::NodeUnstaging { .. } => StateName::NodeUnstage,
        }
    }

    /// The RPC this state is waiting for, if it is an in-flight state.
    pub fn in_flight_call(&self) -> Option<CsiCall> {
        match self {
            Self::Created
            | Self::NodeReady { .. }
            | Self::VolReady { .. }
            | Self::Published { .. } => None,
            Self::ControllerPublishing => Some(CsiCall::ControllerPublish),
            Self::ControllerUnpublishing => Some(CsiCall::ControllerUnpublish),
            Self::NodeStaging { .. } => Some(CsiCall::NodeStage),
            Self::NodeUnstaging { .. } => Some(CsiCall::NodeUnstage),
            Self::NodePublishing { .. } => Some(CsiCall::NodePublish),
            Self::NodeUnpublishing { .. } => Some(CsiCall::NodeUnpublish),
        }
    }

    /// The boot in which staging happened (or may have), for states past `NodeReady`.
    pub fn boot_id(&self) -> Option<&BootId> {
        match self {
            Self::Created
            | Self::ControllerPublishing
            | Self::NodeReady { .. }
            | Self::ControllerUnpublishing => None,
            Self::NodeStaging { boot_id, .. }
            | Self::VolReady { boot_id, .. }
            | Self::NodePublishing { boot_id, .. }
            | Self::Published { boot_id, .. }
            | Self::NodeUnpublishing { boot_id, .. }
            | Self::NodeUnstaging { boot_id, .. } => Some(boot_id),
        }
    }

    /// ControllerPublishVolume's `publish_context`, in states where the volume is attached.
    pub fn publish_context(&self) -> Option<&StringMap> {
        match self {
            Self::Created | Self::ControllerPublishing | Self::ControllerUnpublishing => None,
            Self::NodeReady { publish_context }
            | Self::NodeStaging {
                publish_context, ..
            }
            | Self::VolReady {
                publish_context, ..
            }
            | Self::NodePublishing {
                publish_context, ..
            }
            | Self::Published {
                publish_context, ..
            }
            | Self::NodeUnpublishing {
                publish_context, ..
            }
            | Self::NodeUnstaging {
                publish_context, ..
            } => Some(publish_context),
        }
    }

    /// Whether `call` may begin from this state (the guard of [`VolumeState::begin`]).
    pub fn can_begin(&self, call: CsiCall) -> bool {
        // The transition table, one row per state, columns in `CsiCall::ALL` order:
        //                                  CPub   CUnpub NStage NUnstg NPub   NUnpub
        let row: [bool; 6] = match self {
            Self::Created =>
            /*                */
            {
                [true, false, false, false, false, false]
            }
            Self::ControllerPublishing =>
            /*   */
            {
                [true, true, false, false, false, false]
            }
            Self::NodeReady { .. } =>
            /*       */
            {
                [false, true, true, false, false, false]
            }
            Self::ControllerUnpublishing =>
            /* */
            {
                [false, true, false, false, false, false]
            }
            Self::NodeStaging { .. } =>
            /*     */
            {
                [false, false, true, true, false, false]
            }
            Self::VolReady { .. } =>
            /*        */
            {
                [false, false, false, true, true, false]
            }
            Self::NodePublishing { .. } =>
            /*  */
            {
                [false, false, false, false, true, true]
            }
            Self::Published { .. } =>
            /*       */
            {
                [false, false, false, false, false, true]
            }
            Self::NodeUnpublishing { .. } =>
            /**/
            {
                [false, false, false, false, false, true]
            }
            Self::NodeUnstaging { .. } =>
            /*   */
            {
                [false, false, false, true, false, false]
            }
        };
        let column = match call {
            CsiCall::ControllerPublish => 0,
            CsiCall::ControllerUnpublish => 1,
            CsiCall::NodeStage => 2,
            CsiCall::NodeUnstage => 3,
            CsiCall::NodePublish => 4,
            CsiCall::NodeUnpublish => 5,
        };
        row[column]
    }

    /// The next move from this state towards `goal`, or `None` when it is reached.
    ///
    /// In-flight states are finished in the direction of the goal if the interrupted call
    /// points there (re-drive) and undone otherwise; an interrupted undo is always completed
    /// first (Mesos's rule).
    pub fn next_step(&self, goal: Goal, caps: &CsiCapabilities) -> Option<Step> {
        use CsiCall as C;
        use Goal as G;
        let call = match (self, goal) {
            (Self::Created, G::Created) => return None,
            (Self::Created, G::NodeReady | G::VolReady | G::Published) => C::ControllerPublish,
            (Self::ControllerPublishing, G::Created) => C::ControllerUnpublish,
            (Self::ControllerPublishing, G::NodeReady | G::VolReady | G::Published) => {
                C::ControllerPublish
            }
            (Self::NodeReady { .. }, G::Created) => C::ControllerUnpublish,
            (Self::NodeReady { .. }, G::NodeReady) => return None,
            (Self::NodeReady { .. }, G::VolReady | G::Published) => C::NodeStage,
            (
                Self::ControllerUnpublishing,
                G::Created | G::NodeReady | G::VolReady | G::Published,
            ) => C::ControllerUnpublish,
            (Self::NodeStaging { .. }, G::Created | G::NodeReady) => C::NodeUnstage,
            (Self::NodeStaging { .. }, G::VolReady | G::Published) => C::NodeStage,
            (Self::VolReady { .. }, G::Created | G::NodeReady) => C::NodeUnstage,
            (Self::VolReady { .. }, G::VolReady) => return None,
            (Self::VolReady { .. }, G::Published) => C::NodePublish,
            (
                Self::NodeUnstaging { .. },
                G::Created | G::NodeReady | G::VolReady | G::Published,
            ) => C::NodeUnstage,
            (Self::NodePublishing { .. }, G::Created | G::NodeReady | G::VolReady) => {
                C::NodeUnpublish
            }
            (Self::NodePublishing { .. }, G::Published) => C::NodePublish,
            (Self::Published { .. }, G::Created | G::NodeReady | G::VolReady) => C::NodeUnpublish,
            (Self::Published { .. }, G::Published) => return None,
            (
                Self::NodeUnpublishing { .. },
                G::Created | G::NodeReady | G::VolReady | G::Published,
            ) => C::NodeUnpublish,
        };
        Some(if call.is_supported(caps) {
            Step::Call(call)
        } else {
            Step::Skip(call)
        })
    }

    /// Enters the in-flight state of `call`. `now` is the boot in which the RPC will be
    /// sent (recorded when staging starts). The result must be durable before the RPC is sent.
    pub fn begin(&self, call: CsiCall, now: &BootId) -> Result<VolumeState, TransitionError> {
        if !self.can_begin(call) {
            return Err(TransitionError::CannotStart {
                call,
                state: self.name(),
            });
        }
        let pc = || self.publish_context().cloned().unwrap_or_default();
        let boot = || self.boot_id().cloned().unwrap_or_else(|| now.clone());
        Ok(match call {
            CsiCall::ControllerPublish => Self::ControllerPublishing,
            CsiCall::ControllerUnpublish => Self::ControllerUnpublishing,
            CsiCall::NodeStage => Self::NodeStaging {
                boot_id: boot(),
                publish_context: pc(),
            },
            CsiCall::NodeUnstage => Self::NodeUnstaging {
                boot_id: boot(),
                publish_context: pc(),
            },
            CsiCall::NodePublish => Self::NodePublishing {
                boot_id: boot(),
                publish_context: pc(),
            },
            CsiCall::NodeUnpublish => Self::NodeUnpublishing {
                boot_id: boot(),
                publish_context: pc(),
            },
        })
    }

    /// Settles the in-flight state of `call` after its RPC succeeded; `publish_context`
    /// is ControllerPublishVolume's result and ignored for every other call. A failed RPC
    /// has no transition: the in-flight state stays (Mesos's rule; the RPC may have taken
    /// effect), and the next request or recovery re-drives or undoes it.
    pub fn finish(
        &self,
        call: CsiCall,
        publish_context: StringMap,
    ) -> Result<VolumeState, TransitionError> {
        let not_in_flight = || TransitionError::NotInFlight {
            call,
            state: self.name(),
        };
        if self.in_flight_call() != Some(call) {
            return Err(not_in_flight());
        }
        let (boot_id, kept) = match self {
            Self::ControllerPublishing => return Ok(Self::NodeReady { publish_context }),
            Self::ControllerUnpublishing => return Ok(Self::Created),
            Self::NodeStaging {
                boot_id,
                publish_context,
            }
            | Self::NodeUnstaging {
                boot_id,
                publish_context,
            }
            | Self::NodePublishing {
                boot_id,
                publish_context,
            }
            | Self::NodeUnpublishing {
                boot_id,
                publish_context,
            } => (boot_id.clone(), publish_context.clone()),
            // Excluded by the in-flight check above.
            Self::Created
            | Self::NodeReady { .. }
            | Self::VolReady { .. }
            | Self::Published { .. } => {
                return Err(not_in_flight());
            }
        };
        let publish_context = kept;
        Ok(match call {
            CsiCall::NodeStage | CsiCall::NodeUnpublish => Self::VolReady {
                boot_id,
                publish_context,
            },
            CsiCall::NodeUnstage => Self::NodeReady { publish_context },
            CsiCall::NodePublish => Self::Published {
                boot_id,
                publish_context,
            },
            CsiCall::ControllerPublish | CsiCall::ControllerUnpublish => {
                return Err(not_in_flight());
            }
        })
    }

    /// Applies `call` in memory because the plugin lacks its capability (no RPC, nothing
    /// to persist first). `now` becomes the boot id of a no-op staging.
    pub fn skip(&self, call: CsiCall, now: &BootId) -> Result<VolumeState, TransitionError> {
        let started = self.begin(call, now)?;
        let done = started.finish(call, StringMap::new())?;
        Ok(match (call, done) {
            // A no-op stage happens now, whatever boot an earlier attempt was made in.
            (
                CsiCall::NodeStage,
                Self::VolReady {
                    publish_context, ..
                },
            ) => Self::VolReady {
                boot_id: now.clone(),
                publish_context,
            },
            (_, done) => done,
        })
    }

    /// Applies in-memory no-ops towards `goal` and returns the state to continue from and
    /// the next RPC to send (`None`: the goal is reached).
    pub fn next_call(
        &self,
        goal: Goal,
        caps: &CsiCapabilities,
        now: &BootId,
    ) -> (VolumeState, Option<CsiCall>) {
        let mut state = self.clone();
        // Each skip moves one step along a chain of at most eight transitions; the bound
        // only guards against a planning bug turning into a hang.
        for _ in 0..16 {
            match state.next_step(goal, caps) {
                None => return (state, None),
                Some(Step::Call(call)) => return (state, Some(call)),
                Some(Step::Skip(call)) => match state.skip(call, now) {
                    Ok(next) => state = next,
                    Err(_) => return (state, Some(call)),
                },
            }
        }
        let call = state.next_step(goal, caps).map(|s| match s {
            Step::Call(c) | Step::Skip(c) => c,
        });
        (state, call)
    }
}

/// A growth of a volume (`slrp ctl expand-disk`) that is not finished. It is durable
/// before each of its calls, so that recovery finishes what a crash interrupted: both
/// expansion RPCs are idempotent for the same size (CSI).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expansion {
    /// The size asked for, in bytes.
    pub target_bytes: i64,
    /// ControllerExpandVolume is done (or the plugin has none) and NodeExpandVolume is
    /// owed: sent now if the volume is staged or published, else once it is published
    /// again (CSI: a CO calls it when the volume is next made available on the node).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub node_owed: bool,
}

/// One tracked volume: the record the store keeps under kind `volume`, key = volume id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    /// Plugin-assigned id.
    pub id: VolumeId,
    /// The CreateVolume name it was created with (slrp uses the operation UUID), so that a
    /// replayed CreateVolume that returns this id is recognised as the same volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// How the volume is used.
    pub spec: VolumeSpec,
    /// Where it is in its lifecycle.
    pub state: VolumeState,
    /// Set once the volume was published; it stays set (also across reboots, when the
    /// volume is published again during recovery) until the volume is explicitly
    /// unpublished or deleted.
    #[serde(default)]
    pub node_publish_required: bool,
    /// Capacity in bytes as the plugin reported it (or as requested when it did not).
    #[serde(default)]
    pub capacity_bytes: i64,
    /// A deletion is in progress: written before the first step of the deletion, so that
    /// recovery finishes one that was *interrupted* (a crash, a shutdown) instead of
    /// publishing the volume again. A deletion that *failed* (the plugin refused, a step
    /// failed) clears it and records [`VolumeRecord::delete_failed`]: the volume stays
    /// usable and nothing deletes it unasked (Mesos leaves it tracked).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleting: bool,
    /// Users may have written to the volume: set when it is published, cleared only once
    /// its contents were removed before a deletion. Unlike `node_publish_required`, an
    /// unpublish keeps it, so data never passes to the next user of the space (Mesos
    /// cleans a volume that was published before DeleteVolume).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub needs_cleanup: bool,
    /// Why the last deletion failed, for operators; cleared when a deletion starts again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_failed: Option<String>,
    /// An expansion in progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expansion: Option<Expansion>,
    /// The size slrp grew the volume to (the plugin took the space): the provider offers
    /// the volume's disk at this size. Without it a known volume keeps the size its disk
    /// was created with, whatever the plugin lists (spec §12 item 28).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expanded_bytes: Option<i64>,
}

impl Record for VolumeRecord {
    const KIND: Kind = Kind::VOLUME;
    fn key(&self) -> String {
        self.id.as_str().to_owned()
    }
}

impl VolumeRecord {
    /// A newly created (or newly validated) volume.
    pub fn created(id: VolumeId, name: Option<String>, spec: VolumeSpec) -> Self {
        Self {
            id,
            name,
            spec,
            state: VolumeState::Created,
            node_publish_required: false,
            capacity_bytes: 0,
            deleting: false,
            needs_cleanup: false,
            delete_failed: None,
            expansion: None,
            expanded_bytes: None,
        }
    }

    /// The record with its deletion started: `deleting` set, a failed deletion's reason
    /// cleared, and a published volume (`node_publish_required`; records written before
    /// `needs_cleanup` existed know one only by it) owing the removal of its contents
    /// instead of a publish.
    pub fn marked_for_deletion(&self) -> Self {
        Self {
            deleting: true,
            needs_cleanup: self.needs_cleanup || self.node_publish_required,
            node_publish_required: false,
            delete_failed: None,
            ..self.clone()
        }
    }

    fn with_state(&self, state: VolumeState) -> Self {
        Self {
            state,
            ..self.clone()
        }
    }

    /// [`VolumeState::next_call`] on this record.
    pub fn next_call(
        &self,
        goal: Goal,
        caps: &CsiCapabilities,
        now: &BootId,
    ) -> (Self, Option<CsiCall>) {
        let (state, call) = self.state.next_call(goal, caps, now);
        (self.with_state(state), call)
    }

    /// [`VolumeState::begin`] on this record.
    pub fn begin(&self, call: CsiCall, now: &BootId) -> Result<Self, TransitionError> {
        Ok(self.with_state(self.state.begin(call, now)?))
    }

    /// [`VolumeState::finish`] on this record; a publish sets `node_publish_required` and
    /// `needs_cleanup`.
    pub fn finish(
        &self,
        call: CsiCall,
        publish_context: StringMap,
    ) -> Result<Self, TransitionError> {
        let mut next = self.with_state(self.state.finish(call, publish_context)?);
        next.node_publish_required |= call == CsiCall::NodePublish;
        next.needs_cleanup |= call == CsiCall::NodePublish;
        Ok(next)
    }
}
