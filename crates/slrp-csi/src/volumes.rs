//! [`CsiVolumes`]: the CSI calls the volume manager makes, as a trait, so the manager is
//! generic over the transport and can run against an in-memory fake plugin in tests
//! (conventions §4.8 rule 3). [`CsiClient`] is the real implementation.

use std::future::Future;

use crate::answer::{AnswerLimits, ListingBudget};
use crate::client::CsiClient;
use crate::error::{CsiError, CsiRpc};
use crate::types::{
    Capacity, ControllerExpansion, ControllerPublishRequest, CreateSnapshotRequest,
    CreateVolumeRequest, NodeExpandRequest, NodePublishRequest, NodeStageRequest, Secrets,
    Snapshot, StringMap, ValidateRequest, Validation, Volume, VolumeCapability, VolumeId,
    VolumePage,
};

/// Volume lifecycle RPCs of one plugin (controller and node services).
///
/// Every method has the contract of the [`CsiClient`] method of the same name: one
/// attempt, whose deadline is the implementation's business (retries are the caller's,
/// through [`crate::retry()`]), errors are classified [`CsiError`]s, and `NOT_FOUND` from the calls that remove something comes back as an
/// error whose [`CsiError::retry_class`] is [`crate::RetryClass::AlreadyDone`].
pub trait CsiVolumes: Send + Sync + 'static {
    /// Waits, at most one call deadline, until the endpoint serving `rpc` takes calls
    /// (managed plugins, see [`crate::readiness`]); at once where nobody reports
    /// readiness. A caller that bounds its calls in flight waits here before it takes a
    /// slot, so calls waiting for a restarting plugin hold none.
    ///
    /// # Errors
    /// [`CsiError::NotReady`] when the deadline passes first (nothing was sent),
    /// [`CsiError::EndpointStopped`], [`CsiError::NoService`].
    fn endpoint_ready(&self, rpc: CsiRpc) -> impl Future<Output = Result<(), CsiError>> + Send {
        let _ = rpc;
        std::future::ready(Ok(()))
    }

    /// The bounds of one listing followed page by page with
    /// [`CsiVolumes::list_volumes_page`] ([`crate::answer`]); the default bounds where
    /// the implementation has no configuration of its own.
    fn listing_budget(&self) -> ListingBudget {
        ListingBudget::new(AnswerLimits::default())
    }

    /// `CreateVolume` (idempotent by `req.name`).
    fn create_volume(
        &self,
        req: &CreateVolumeRequest,
    ) -> impl Future<Output = Result<Volume, CsiError>> + Send;

    /// `DeleteVolume`.
    fn delete_volume(
        &self,
        id: &VolumeId,
        secrets: &Secrets,
    ) -> impl Future<Output = Result<(), CsiError>> + Send;

    /// `ValidateVolumeCapabilities`.
    fn validate(
        &self,
        req: &ValidateRequest,
    ) -> impl Future<Output = Result<Validation, CsiError>> + Send;

    /// One page of `ListVolumes` (`max_entries` 0 = the plugin's choice).
    fn list_volumes_page(
        &self,
        max_entries: i32,
        starting_token: Option<&str>,
    ) -> impl Future<Output = Result<VolumePage, CsiError>> + Send;

    /// `GetCapacity` for volumes with `capabilities` and `parameters`.
    fn capacity(
        &self,
        capabilities: &[VolumeCapability],
        parameters: &StringMap,
    ) -> impl Future<Output = Result<Capacity, CsiError>> + Send;

    /// `ControllerPublishVolume`; returns the publish context.
    fn controller_publish(
        &self,
        req: &ControllerPublishRequest,
    ) -> impl Future<Output = Result<StringMap, CsiError>> + Send;

    /// `ControllerUnpublishVolume`.
    fn controller_unpublish(
        &self,
        id: &VolumeId,
        node_id: &str,
    ) -> impl Future<Output = Result<(), CsiError>> + Send;

    /// `NodeStageVolume`.
    fn node_stage(
        &self,
        req: &NodeStageRequest,
    ) -> impl Future<Output = Result<(), CsiError>> + Send;

    /// `NodeUnstageVolume`.
    fn node_unstage(
        &self,
        id: &VolumeId,
        staging_path: &str,
    ) -> impl Future<Output = Result<(), CsiError>> + Send;

    /// `NodePublishVolume`.
    fn node_publish(
        &self,
        req: &NodePublishRequest,
    ) -> impl Future<Output = Result<(), CsiError>> + Send;

    /// `NodeUnpublishVolume`.
    fn node_unpublish(
        &self,
        id: &VolumeId,
        target_path: &str,
    ) -> impl Future<Output = Result<(), CsiError>> + Send;

    /// `ControllerExpandVolume` to `required_bytes`. The default answers as a v0 plugin
    /// does (nothing sent): only an implementation that can grow volumes overrides it.
    fn controller_expand(
        &self,
        id: &VolumeId,
        required_bytes: i64,
        capability: Option<&VolumeCapability>,
    ) -> impl Future<Output = Result<ControllerExpansion, CsiError>> + Send {
        let _ = (id, required_bytes, capability);
        unsupported(CsiRpc::ControllerExpandVolume, "volume expansion")
    }

    /// `CreateSnapshot`. Default as [`CsiVolumes::controller_expand`]'s.
    fn create_snapshot(
        &self,
        req: &CreateSnapshotRequest,
    ) -> impl Future<Output = Result<Snapshot, CsiError>> + Send {
        let _ = req;
        unsupported(CsiRpc::CreateSnapshot, "snapshots")
    }

    /// `DeleteSnapshot` (`NOT_FOUND` is [`crate::RetryClass::AlreadyDone`]). Default as
    /// [`CsiVolumes::controller_expand`]'s.
    fn delete_snapshot(
        &self,
        snapshot_id: &str,
    ) -> impl Future<Output = Result<(), CsiError>> + Send {
        let _ = snapshot_id;
        unsupported(CsiRpc::DeleteSnapshot, "snapshots")
    }

    /// `NodeExpandVolume`; returns the new capacity (0 = unknown). Default as
    /// [`CsiVolumes::controller_expand`]'s.
    fn node_expand(
        &self,
        req: &NodeExpandRequest,
    ) -> impl Future<Output = Result<i64, CsiError>> + Send {
        let _ = req;
        unsupported(CsiRpc::NodeExpandVolume, "volume expansion")
    }
}

/// The answer of a default method: what a v0 plugin answers, nothing sent.
fn unsupported<T>(rpc: CsiRpc, what: &'static str) -> std::future::Ready<Result<T, CsiError>> {
    std::future::ready(Err(CsiError::Unsupported {
        rpc,
        version: crate::CsiVersion::V0,
        what,
    }))
}

impl CsiVolumes for CsiClient {
    fn create_snapshot(
        &self,
        req: &CreateSnapshotRequest,
    ) -> impl Future<Output = Result<Snapshot, CsiError>> + Send {
        CsiClient::create_snapshot(self, req)
    }

    fn delete_snapshot(
        &self,
        snapshot_id: &str,
    ) -> impl Future<Output = Result<(), CsiError>> + Send {
        CsiClient::delete_snapshot(self, snapshot_id)
    }

    fn controller_expand(
        &self,
        id: &VolumeId,
        required_bytes: i64,
        capability: Option<&VolumeCapability>,
    ) -> impl Future<Output = Result<ControllerExpansion, CsiError>> + Send {
        CsiClient::controller_expand(self, id, required_bytes, capability)
    }

    fn node_expand(
        &self,
        req: &NodeExpandRequest,
    ) -> impl Future<Output = Result<i64, CsiError>> + Send {
        CsiClient::node_expand(self, req)
    }

    fn listing_budget(&self) -> ListingBudget {
        CsiClient::listing_budget(self)
    }

    fn endpoint_ready(&self, rpc: CsiRpc) -> impl Future<Output = Result<(), CsiError>> + Send {
        CsiClient::endpoint_ready(self, rpc)
    }

    fn create_volume(
        &self,
        req: &CreateVolumeRequest,
    ) -> impl Future<Output = Result<Volume, CsiError>> + Send {
        CsiClient::create_volume(self, req)
    }

    fn delete_volume(
        &self,
        id: &VolumeId,
        secrets: &Secrets,
    ) -> impl Future<Output = Result<(), CsiError>> + Send {
        CsiClient::delete_volume(self, id, secrets)
    }

    fn validate(
        &self,
        req: &ValidateRequest,
    ) -> impl Future<Output = Result<Validation, CsiError>> + Send {
        CsiClient::validate(self, req)
    }

    fn list_volumes_page(
        &self,
        max_entries: i32,
        starting_token: Option<&str>,
    ) -> impl Future<Output = Result<VolumePage, CsiError>> + Send {
        CsiClient::list_volumes_page(self, max_entries, starting_token)
    }

    fn capacity(
        &self,
        capabilities: &[VolumeCapability],
        parameters: &StringMap,
    ) -> impl Future<Output = Result<Capacity, CsiError>> + Send {
        CsiClient::capacity(self, capabilities, parameters)
    }

    fn controller_publish(
        &self,
        req: &ControllerPublishRequest,
    ) -> impl Future<Output = Result<StringMap, CsiError>> + Send {
        CsiClient::controller_publish(self, req)
    }

    fn controller_unpublish(
        &self,
        id: &VolumeId,
        node_id: &str,
    ) -> impl Future<Output = Result<(), CsiError>> + Send {
        CsiClient::controller_unpublish(self, id, node_id)
    }

    fn node_stage(
        &self,
        req: &NodeStageRequest,
    ) -> impl Future<Output = Result<(), CsiError>> + Send {
        CsiClient::node_stage(self, req)
    }

    fn node_unstage(
        &self,
        id: &VolumeId,
        staging_path: &str,
    ) -> impl Future<Output = Result<(), CsiError>> + Send {
        CsiClient::node_unstage(self, id, staging_path)
    }

    fn node_publish(
        &self,
        req: &NodePublishRequest,
    ) -> impl Future<Output = Result<(), CsiError>> + Send {
        CsiClient::node_publish(self, req)
    }

    fn node_unpublish(
        &self,
        id: &VolumeId,
        target_path: &str,
    ) -> impl Future<Output = Result<(), CsiError>> + Send {
        CsiClient::node_unpublish(self, id, target_path)
    }
}
