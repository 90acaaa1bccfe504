//! Readiness of a supervised plugin endpoint, and the routing of calls to the container
//! that serves them.
//!
//! Mesos waits for the service's endpoint before every attempt of every call
//! (`ServiceManager::getServiceEndpoint`, spec §4.1.6): while the plugin container is
//! restarting, the endpoint future is pending and calls queue behind it; its gRPC calls
//! also set `wait_for_ready`, so a call whose connection is refused waits for the
//! channel instead of failing. A [`CsiClient`] built with [`CsiClient::managed`] does
//! the same: before each attempt it waits, within the attempt's deadline, until the
//! supervisor reports the endpoint [`EndpointStatus::Up`], and a connection that cannot
//! be opened (nothing was sent) sends it back to waiting instead of failing the call.
//!
//! [`CsiServices`] sends controller calls to the client of the container serving
//! `CONTROLLER_SERVICE` and node calls to the one serving `NODE_SERVICE` (a plugin may be
//! two containers, spec §4.1.1).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::client::CsiClient;
use crate::error::{CsiError, CsiRpc};
use crate::types::{
    Capacity, ConditionPage, ControllerCapabilities, ControllerPublishRequest, CreateVolumeRequest,
    CsiCapabilities, NodeInfo, NodePublishRequest, NodeStageRequest, Secrets, StringMap,
    ValidateRequest, Validation, Volume, VolumeCapability, VolumeCondition, VolumeId, VolumePage,
};
use crate::volumes::CsiVolumes;

/// How long a call waits after a refused connection to an endpoint reported up before
/// it tries again (unless the status changes first). Mesos polls for a missing socket
/// every 10 ms (spec §4.1.5); the supervisor notices a dead plugin within about that.
const RECONNECT_PAUSE: Duration = Duration::from_millis(20);

/// Whether a supervised endpoint takes calls, as its supervisor sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointStatus {
    /// Starting, restarting or backing off: calls wait.
    Down,
    /// Probed ready: calls go through.
    Up,
    /// Stopped for good (shutdown): calls fail at once.
    Stopped,
}

/// The receiving side of an endpoint's status; cheap to clone. The supervisor holds the
/// [`watch::Sender`]; a dropped sender counts as [`EndpointStatus::Stopped`].
#[derive(Debug, Clone)]
pub struct EndpointReadiness {
    rx: watch::Receiver<EndpointStatus>,
    /// For [`EndpointReadiness::fixed`]: keeps the channel open (a dropped sender reads
    /// as stopped).
    _fixed: Option<Arc<watch::Sender<EndpointStatus>>>,
}

/// The endpoint was stopped while a call waited for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EndpointStopped;

impl EndpointReadiness {
    /// Follows `rx`.
    pub fn new(rx: watch::Receiver<EndpointStatus>) -> Self {
        Self { rx, _fixed: None }
    }

    /// A status that never changes (tests; endpoints nobody supervises but that are
    /// known to be up).
    pub fn fixed(status: EndpointStatus) -> Self {
        let (tx, rx) = watch::channel(status);
        Self {
            rx,
            _fixed: Some(Arc::new(tx)),
        }
    }

    /// The current status.
    pub fn status(&self) -> EndpointStatus {
        if self.rx.has_changed().is_err() {
            return EndpointStatus::Stopped;
        }
        *self.rx.borrow()
    }

    /// Waits until the endpoint is up.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads the watch.
    pub(crate) async fn wait_up(&self) -> Result<(), EndpointStopped> {
        let mut rx = self.rx.clone();
        loop {
            // A supervisor that is gone stopped its plugin, whatever it last said.
            if rx.has_changed().is_err() {
                return Err(EndpointStopped);
            }
            match *rx.borrow_and_update() {
                EndpointStatus::Up => return Ok(()),
                EndpointStatus::Stopped => return Err(EndpointStopped),
                EndpointStatus::Down => {}
            }
            rx.changed().await.map_err(|_| EndpointStopped)?;
        }
    }

    /// After a refused connection: waits for the status to change, for at most
    /// [`RECONNECT_PAUSE`] or until `deadline`.
    pub(crate) async fn pause(&self, deadline: Instant) {
        let mut rx = self.rx.clone();
        rx.mark_unchanged();
        let until = deadline.min(Instant::now() + RECONNECT_PAUSE);
        let _ = tokio::time::timeout_at(until, rx.changed()).await;
    }
}

/// The clients of a plugin's services: controller calls go to the container serving
/// `CONTROLLER_SERVICE`, node calls to the one serving `NODE_SERVICE` (the same client
/// if one container serves both).
#[derive(Debug, Clone)]
pub struct CsiServices {
    controller: Option<CsiClient>,
    node: CsiClient,
}

impl CsiServices {
    /// A plugin whose controller and node services may be served by different
    /// endpoints (pass clones of one client if they are the same).
    pub fn new(controller: CsiClient, node: CsiClient) -> Self {
        Self {
            controller: Some(controller),
            node,
        }
    }

    /// A plugin without a controller service: controller calls fail with
    /// [`CsiError::NoService`] without being sent.
    pub fn node_only(node: CsiClient) -> Self {
        Self {
            controller: None,
            node,
        }
    }

    /// The client of the controller service, if there is one.
    pub fn controller(&self) -> Option<&CsiClient> {
        self.controller.as_ref()
    }

    /// The client of the node service.
    pub fn node(&self) -> &CsiClient {
        &self.node
    }

    fn controller_for(&self, rpc: CsiRpc) -> Result<&CsiClient, CsiError> {
        self.controller.as_ref().ok_or(CsiError::NoService {
            rpc,
            service: "controller",
        })
    }

    /// The capability sets the volume manager plans with, each asked of the service it
    /// belongs to as Mesos does (spec §4.4): plugin capabilities of the controller
    /// service (of the node service without one), controller capabilities if the plugin
    /// has a controller service (all false otherwise), node capabilities of the node.
    ///
    /// # Errors
    /// The first failing RPC.
    pub async fn capabilities(&self) -> Result<CsiCapabilities, CsiError> {
        let first = self.controller.as_ref().unwrap_or(&self.node);
        let plugin = first.plugin_capabilities().await?;
        let controller = match &self.controller {
            Some(c) if plugin.controller_service => c.controller_capabilities().await?,
            Some(_) | None => ControllerCapabilities::default(),
        };
        let node = self.node.node_capabilities().await?;
        Ok(CsiCapabilities {
            plugin,
            controller,
            node,
        })
    }

    /// `ControllerGetVolume` of the controller service (see
    /// [`CsiClient::controller_get_volume`]).
    ///
    /// # Errors
    /// [`CsiError::NoService`] without a controller service; the RPC's failure.
    pub async fn controller_get_volume(
        &self,
        id: &VolumeId,
    ) -> Result<Option<VolumeCondition>, CsiError> {
        self.controller_for(CsiRpc::ControllerGetVolume)?
            .controller_get_volume(id)
            .await
    }

    /// One `ListVolumes` page of the controller service read for its entries'
    /// conditions (see [`CsiClient::list_conditions_page`]).
    ///
    /// # Errors
    /// [`CsiError::NoService`] without a controller service; the RPC's failure.
    pub async fn list_conditions_page(
        &self,
        max_entries: i32,
        starting_token: Option<&str>,
    ) -> Result<ConditionPage, CsiError> {
        self.controller_for(CsiRpc::ListVolumes)?
            .list_conditions_page(max_entries, starting_token)
            .await
    }

    /// `NodeGetInfo` of the node service.
    ///
    /// # Errors
    /// The RPC's failure.
    pub async fn node_info(&self) -> Result<NodeInfo, CsiError> {
        self.node.node_info().await
    }
}

impl CsiVolumes for CsiServices {
    fn listing_budget(&self) -> crate::answer::ListingBudget {
        // Listings go to the controller; its limits are the node's (one config).
        self.controller().unwrap_or(&self.node).listing_budget()
    }

    async fn endpoint_ready(&self, rpc: CsiRpc) -> Result<(), CsiError> {
        match rpc {
            CsiRpc::CreateVolume
            | CsiRpc::DeleteVolume
            | CsiRpc::ControllerPublishVolume
            | CsiRpc::ControllerUnpublishVolume
            | CsiRpc::ValidateVolumeCapabilities
            | CsiRpc::ListVolumes
            | CsiRpc::GetCapacity
            | CsiRpc::ControllerGetCapabilities
            | CsiRpc::ControllerExpandVolume
            | CsiRpc::ControllerGetVolume
            | CsiRpc::CreateSnapshot
            | CsiRpc::DeleteSnapshot
            | CsiRpc::ListSnapshots => self.controller_for(rpc)?.endpoint_ready(rpc).await,
            CsiRpc::GetPluginInfo
            | CsiRpc::GetPluginCapabilities
            | CsiRpc::Probe
            | CsiRpc::NodeStageVolume
            | CsiRpc::NodeUnstageVolume
            | CsiRpc::NodePublishVolume
            | CsiRpc::NodeUnpublishVolume
            | CsiRpc::NodeGetVolumeStats
            | CsiRpc::NodeExpandVolume
            | CsiRpc::NodeGetCapabilities
            | CsiRpc::NodeGetInfo => self.node.endpoint_ready(rpc).await,
        }
    }

    async fn create_volume(&self, req: &CreateVolumeRequest) -> Result<Volume, CsiError> {
        self.controller_for(CsiRpc::CreateVolume)?
            .create_volume(req)
            .await
    }

    async fn controller_expand(
        &self,
        id: &VolumeId,
        required_bytes: i64,
        capability: Option<&VolumeCapability>,
    ) -> Result<crate::ControllerExpansion, CsiError> {
        self.controller_for(CsiRpc::ControllerExpandVolume)?
            .controller_expand(id, required_bytes, capability)
            .await
    }

    async fn create_snapshot(
        &self,
        req: &crate::CreateSnapshotRequest,
    ) -> Result<crate::Snapshot, CsiError> {
        self.controller_for(CsiRpc::CreateSnapshot)?
            .create_snapshot(req)
            .await
    }

    async fn delete_snapshot(&self, snapshot_id: &str) -> Result<(), CsiError> {
        self.controller_for(CsiRpc::DeleteSnapshot)?
            .delete_snapshot(snapshot_id)
            .await
    }

    async fn node_expand(&self, req: &crate::NodeExpandRequest) -> Result<i64, CsiError> {
        self.node.node_expand(req).await
    }

    async fn delete_volume(&self, id: &VolumeId, secrets: &Secrets) -> Result<(), CsiError> {
        self.controller_for(CsiRpc::DeleteVolume)?
            .delete_volume(id, secrets)
            .await
    }

    async fn validate(&self, req: &ValidateRequest) -> Result<Validation, CsiError> {
        self.controller_for(CsiRpc::ValidateVolumeCapabilities)?
            .validate(req)
            .await
    }

    async fn list_volumes_page(
        &self,
        max_entries: i32,
        starting_token: Option<&str>,
    ) -> Result<VolumePage, CsiError> {
        self.controller_for(CsiRpc::ListVolumes)?
            .list_volumes_page(max_entries, starting_token)
            .await
    }

    async fn capacity(
        &self,
        capabilities: &[VolumeCapability],
        parameters: &StringMap,
    ) -> Result<Capacity, CsiError> {
        self.controller_for(CsiRpc::GetCapacity)?
            .capacity(capabilities, parameters)
            .await
    }

    async fn controller_publish(
        &self,
        req: &ControllerPublishRequest,
    ) -> Result<StringMap, CsiError> {
        self.controller_for(CsiRpc::ControllerPublishVolume)?
            .controller_publish(req)
            .await
    }

    async fn controller_unpublish(&self, id: &VolumeId, node_id: &str) -> Result<(), CsiError> {
        self.controller_for(CsiRpc::ControllerUnpublishVolume)?
            .controller_unpublish(id, node_id)
            .await
    }

    fn node_stage(
        &self,
        req: &NodeStageRequest,
    ) -> impl Future<Output = Result<(), CsiError>> + Send {
        self.node.node_stage(req)
    }

    fn node_unstage(
        &self,
        id: &VolumeId,
        staging_path: &str,
    ) -> impl Future<Output = Result<(), CsiError>> + Send {
        self.node.node_unstage(id, staging_path)
    }

    fn node_publish(
        &self,
        req: &NodePublishRequest,
    ) -> impl Future<Output = Result<(), CsiError>> + Send {
        self.node.node_publish(req)
    }

    fn node_unpublish(
        &self,
        id: &VolumeId,
        target_path: &str,
    ) -> impl Future<Output = Result<(), CsiError>> + Send {
        self.node.node_unpublish(id, target_path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn waits_while_down_and_fails_once_stopped() {
        let (tx, rx) = watch::channel(EndpointStatus::Down);
        let r = EndpointReadiness::new(rx);
        let wait = r.wait_up();
        tokio::pin!(wait);
        assert!(
            tokio::time::timeout(Duration::from_secs(5), &mut wait)
                .await
                .is_err()
        );
        tx.send_replace(EndpointStatus::Up);
        assert_eq!(wait.await, Ok(()));
        tx.send_replace(EndpointStatus::Stopped);
        assert_eq!(r.wait_up().await, Err(EndpointStopped));
        tx.send_replace(EndpointStatus::Down);
        drop(tx);
        assert_eq!(r.status(), EndpointStatus::Stopped);
        assert_eq!(r.wait_up().await, Err(EndpointStopped));
    }

    #[tokio::test]
    async fn a_fixed_status_stays() {
        let r = EndpointReadiness::fixed(EndpointStatus::Up);
        assert_eq!(r.status(), EndpointStatus::Up);
        assert_eq!(r.wait_up().await, Ok(()));
    }
}
