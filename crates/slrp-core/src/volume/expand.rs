//! Growing a volume (`slrp ctl expand-disk`): ControllerExpandVolume, then
//! NodeExpandVolume where the plugin asks for it, each behind a durable [`Expansion`]
//! in the volume's record, so that recovery finishes what a crash interrupted.
//!
//! The steps, each a commit followed by at most one call:
//! 1. the record with `expansion` (`node_owed` unset; set at once for a plugin that
//!    grows volumes only on the node), then ControllerExpandVolume;
//! 2. the record with the new `capacity_bytes` and `expanded_bytes` and, when the plugin
//!    says so, `node_owed`; then, if the volume is published, NodeExpandVolume;
//! 3. the record without `expansion`.
//!
//! A ControllerExpandVolume that fails for good (a permanent gRPC code) clears
//! `expansion` durably and answers the error: nothing grows it later unasked. One cut
//! short or failed transiently keeps it: the next start (or the next expansion of the
//! volume) sends the same call again, which CSI makes idempotent for the same size.
//! NodeExpandVolume stays owed whatever its failure (the space is the volume's already)
//! and is sent again at the next publish, start or expansion; one owed by a volume that
//! is not published waits for its next publish.

use slrp_csi::{CsiError, CsiRpc, CsiVolumes, NodeExpandRequest, RetryClass};
use slrp_types::DisplayChain;

use super::error::{Subject, VolumeError};
use super::handle::VolumeInfo;
use super::jobs::{Change, Ctx};
use super::manager::{failpoints, injected};
use super::schedule::Key;
use super::state::{Expansion, StateName, VolumeRecord, VolumeState};

impl<C: CsiVolumes> Ctx<C> {
    /// The `expand` job: grows the volume of `key` to `target_bytes`.
    pub(super) async fn expand(
        &self,
        key: &Key,
        record: Option<VolumeRecord>,
        target_bytes: i64,
    ) -> (Result<VolumeInfo, VolumeError>, Change) {
        let Some(mut rec) = record else {
            let id = key.volume_id();
            return (Err(VolumeError::UnknownVolume { id }), Change::None);
        };
        if let Err(e) = self.check_expansion(&rec, target_bytes) {
            return (Err(e), Change::None);
        }
        let result = self.expand_steps(&mut rec, target_bytes).await;
        (
            result.map(|()| VolumeInfo::of(&rec)),
            Change::Put(Box::new(rec)),
        )
    }

    fn check_expansion(&self, rec: &VolumeRecord, target_bytes: i64) -> Result<(), VolumeError> {
        let id = rec.id.clone();
        if rec.deleting {
            return Err(VolumeError::BeingDeleted { id });
        }
        if target_bytes <= 0 {
            return Err(VolumeError::BadRequest {
                field: "size",
                problem: "must be positive",
            });
        }
        let caps = &self.cfg.caps;
        if !caps.controller.expand_volume && !caps.node.expand_volume {
            return Err(VolumeError::CannotExpand {
                id,
                why: "the CSI plugin grows no volumes (it advertises EXPAND_VOLUME neither for \
                      its controller nor for its node service)"
                    .to_owned(),
            });
        }
        let size = rec.capacity_bytes.max(rec.expanded_bytes.unwrap_or(0));
        if target_bytes < size {
            return Err(VolumeError::CannotExpand {
                id,
                why: format!(
                    "{target_bytes} bytes is less than its size of {size} bytes, and volumes do not shrink"
                ),
            });
        }
        let attached = match rec.state {
            VolumeState::Created => false,
            // Without ControllerPublishVolume, NODE_READY is CREATED for the plugin.
            VolumeState::NodeReady { .. } => caps.controller_publish(),
            VolumeState::ControllerPublishing
            | VolumeState::ControllerUnpublishing
            | VolumeState::NodeStaging { .. }
            | VolumeState::VolReady { .. }
            | VolumeState::NodePublishing { .. }
            | VolumeState::Published { .. }
            | VolumeState::NodeUnpublishing { .. }
            | VolumeState::NodeUnstaging { .. } => true,
        };
        if attached && caps.plugin.expansion_offline && !caps.plugin.expansion_online {
            return Err(VolumeError::ExpandOffline {
                id,
                state: rec.state.name(),
            });
        }
        Ok(())
    }

    async fn expand_steps(
        &self,
        rec: &mut VolumeRecord,
        target_bytes: i64,
    ) -> Result<(), VolumeError> {
        let caps = &self.cfg.caps;
        if rec.expansion.is_none() && target_bytes <= rec.capacity_bytes {
            // The plugin made the volume this large already (it rounded up at creation):
            // no call, only the size the provider offers.
            if rec.expanded_bytes.is_none_or(|b| b < target_bytes) {
                let mut next = rec.clone();
                next.expanded_bytes = Some(target_bytes);
                self.persist(&next).await?;
                *rec = next;
            }
            return Ok(());
        }
        let mut marked = rec.clone();
        marked.expansion = Some(Expansion {
            target_bytes,
            node_owed: !caps.controller.expand_volume,
        });
        if marked != *rec {
            self.persist(&marked).await?;
            *rec = marked;
        }
        self.resume_expansion(rec).await
    }

    /// Carries on with the expansion `rec` holds, from its durable step: the expand job,
    /// recovery and a publish (for NodeExpandVolume owed) call this.
    pub(super) async fn resume_expansion(&self, rec: &mut VolumeRecord) -> Result<(), VolumeError> {
        let Some(expansion) = rec.expansion.clone() else {
            return Ok(());
        };
        if !expansion.node_owed {
            self.controller_expand_step(rec, expansion.target_bytes)
                .await?;
        }
        if rec.expansion.as_ref().is_some_and(|e| e.node_owed)
            && rec.state.name() == StateName::Published
        {
            self.node_expand_step(rec).await?;
        }
        Ok(())
    }

    /// After a publish: the NodeExpandVolume an expansion still owes. Its failure does
    /// not fail the publish (the volume is usable at its old size); it is logged, and
    /// a transient one is tried again at the next publish or start.
    pub(super) async fn owed_node_expansion(&self, rec: &mut VolumeRecord) {
        if rec.expansion.as_ref().is_some_and(|e| e.node_owed)
            && let Err(e) = self.resume_expansion(rec).await
        {
            tracing::warn!(volume = %rec.id, error = %DisplayChain(&e),
                "published, but NodeExpandVolume owed by its expansion failed");
        }
    }

    async fn controller_expand_step(
        &self,
        rec: &mut VolumeRecord,
        target_bytes: i64,
    ) -> Result<(), VolumeError> {
        injected(failpoints::BEFORE_CALL)?;
        let (id, capability) = (&rec.id, &rec.spec.capability);
        let result = self
            .call(CsiRpc::ControllerExpandVolume, || {
                self.csi
                    .controller_expand(id, target_bytes, Some(capability))
            })
            .await;
        injected(failpoints::AFTER_CALL)?;
        let answer = match result {
            Ok(answer) => answer,
            Err(source) => {
                let e = VolumeError::Csi {
                    rpc: CsiRpc::ControllerExpandVolume,
                    subject: Subject::Volume(rec.id.clone()),
                    source,
                };
                return Err(self.expansion_ended(rec, e).await);
            }
        };
        if answer.capacity_bytes > 0 && answer.capacity_bytes < target_bytes {
            let e = VolumeError::PluginMisbehaved {
                rpc: CsiRpc::ControllerExpandVolume,
                what: format!(
                    "a capacity of {} bytes for volume '{}', less than the {target_bytes} bytes asked",
                    answer.capacity_bytes, rec.id
                ),
            };
            return Err(self.expansion_ended(rec, e).await);
        }
        let node_owed = self.cfg.caps.node.expand_volume && answer.node_expansion_required;
        let mut next = rec.clone();
        next.capacity_bytes = answer.capacity_bytes.max(target_bytes);
        next.expanded_bytes = Some(target_bytes);
        next.expansion = node_owed.then_some(Expansion {
            target_bytes,
            node_owed: true,
        });
        self.persist(&next).await?;
        tracing::info!(volume = %rec.id, bytes = next.capacity_bytes, node_owed, "ControllerExpandVolume done");
        *rec = next;
        Ok(())
    }

    async fn node_expand_step(&self, rec: &mut VolumeRecord) -> Result<(), VolumeError> {
        let Some(expansion) = rec.expansion.clone() else {
            return Ok(());
        };
        let path_err = |source| VolumeError::Path {
            id: rec.id.clone(),
            source,
        };
        let paths = &self.cfg.mount_paths;
        let target = paths.target(&rec.id).map_err(path_err)?;
        let staging = if self.cfg.caps.node_stage() {
            Some(paths.staging(&rec.id).map_err(path_err)?)
        } else {
            None
        };
        let req = NodeExpandRequest {
            volume_id: rec.id.clone(),
            volume_path: target.to_string_lossy().into_owned(),
            staging_target_path: staging.map(|p| p.to_string_lossy().into_owned()),
            required_bytes: expansion.target_bytes,
            capability: Some(rec.spec.capability.clone()),
        };
        injected(failpoints::BEFORE_CALL)?;
        let result = self
            .call(CsiRpc::NodeExpandVolume, || self.csi.node_expand(&req))
            .await;
        injected(failpoints::AFTER_CALL)?;
        if let Err(source) = result {
            // Still owed, whatever the failure: the plugin has the space, and a file
            // system that cannot grow while mounted may grow at the next publish (or
            // once a person fixed what the error names); the next publish, start or
            // expansion of the volume sends it again.
            return Err(VolumeError::Csi {
                rpc: CsiRpc::NodeExpandVolume,
                subject: Subject::Volume(rec.id.clone()),
                source,
            });
        }
        let mut next = rec.clone();
        next.expansion = None;
        if !self.cfg.caps.controller.expand_volume {
            // A plugin that grows volumes only on the node takes the space here.
            next.capacity_bytes = next.capacity_bytes.max(expansion.target_bytes);
            next.expanded_bytes = Some(expansion.target_bytes);
        }
        self.persist(&next).await?;
        tracing::info!(volume = %rec.id, bytes = expansion.target_bytes, "NodeExpandVolume done");
        *rec = next;
        Ok(())
    }

    /// An expansion's call ended with `e`. Refused for good: the expansion is dropped
    /// durably (nothing sends it again unasked) and `e` answered. Cut short or failed
    /// transiently: the plugin may have acted, so the step stays owed and is sent again
    /// by the next start or the next expansion of the volume.
    async fn expansion_ended(&self, rec: &mut VolumeRecord, e: VolumeError) -> VolumeError {
        let permanent = if let VolumeError::Csi { source, .. } = &e {
            source.retry_class() != RetryClass::Transient
                && !matches!(
                    source,
                    CsiError::Cancelled { .. } | CsiError::EndpointStopped { .. }
                )
        } else {
            matches!(e, VolumeError::PluginMisbehaved { .. })
        };
        if !permanent || self.cancel.is_cancelled() {
            tracing::warn!(volume = %rec.id, error = %DisplayChain(&e),
                "expansion interrupted; it is sent again at the next start or expansion");
            return e;
        }
        let mut dropped = rec.clone();
        dropped.expansion = None;
        match self.persist(&dropped).await {
            Ok(()) => {
                tracing::warn!(volume = %rec.id, error = %DisplayChain(&e), "expansion failed");
                *rec = dropped;
                e
            }
            Err(store) => store,
        }
    }
}
