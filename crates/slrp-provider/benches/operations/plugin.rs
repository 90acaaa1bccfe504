//! A CSI v1 plugin that answers at once: volumes live in a `HashMap`, no disk work, served
//! by tonic on a unix socket in this process. The bundled plugin does real disk work per
//! volume, so it would measure the disk, not the provider.
//!
//! It does what the provider needs and CSI requires of these calls (CreateVolume is
//! idempotent by name, DeleteVolume of an unknown id succeeds, ListVolumes pages), answers
//! NodeGetVolumeStats at once for any volume (the volume health benchmark) and
//! `UNIMPLEMENTED` to the rest.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use slrp_proto::csi::v1 as pb;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// Capacity every GetCapacity reports: far more than any run uses.
const CAPACITY: i64 = 1 << 50;

#[derive(Default)]
struct Volumes {
    /// Volume id → (capacity, CreateVolume name), ordered so ListVolumes pages are stable.
    by_id: BTreeMap<String, (i64, String)>,
    /// CreateVolume name → volume id.
    by_name: HashMap<String, String>,
}

/// The plugin's state, shared by its services.
#[derive(Default, Clone)]
pub(crate) struct FastPlugin {
    volumes: Arc<Mutex<Volumes>>,
    next: Arc<AtomicU64>,
}

impl FastPlugin {
    /// Volumes the plugin holds now.
    pub(crate) fn volume_count(&self) -> usize {
        self.lock().by_id.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Volumes> {
        self.volumes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Serves the identity, controller and node services on `socket` until the runtime
    /// ends.
    pub(crate) fn serve(&self, socket: &Path) -> std::io::Result<()> {
        let listener = tokio::net::UnixListener::bind(socket)?;
        let server = tonic::transport::Server::builder()
            .add_service(pb::identity_server::IdentityServer::new(self.clone()))
            .add_service(pb::controller_server::ControllerServer::new(self.clone()))
            .add_service(pb::node_server::NodeServer::new(self.clone()))
            .serve_with_incoming(UnixListenerStream::new(listener));
        tokio::spawn(async move {
            if let Err(error) = server.await {
                eprintln!("fast plugin stopped: {error}");
            }
        });
        Ok(())
    }
}

fn unimplemented<T>(rpc: &str) -> Result<Response<T>, Status> {
    Err(Status::unimplemented(format!("{rpc} is not served")))
}

#[tonic::async_trait]
impl pb::identity_server::Identity for FastPlugin {
    async fn get_plugin_info(
        &self,
        _: Request<pb::GetPluginInfoRequest>,
    ) -> Result<Response<pb::GetPluginInfoResponse>, Status> {
        Ok(Response::new(pb::GetPluginInfoResponse {
            name: "org.slrp.bench.fast".into(),
            vendor_version: "1".into(),
            manifest: HashMap::new(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<pb::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<pb::GetPluginCapabilitiesResponse>, Status> {
        use pb::plugin_capability::{Service, Type, service};
        Ok(Response::new(pb::GetPluginCapabilitiesResponse {
            capabilities: vec![pb::PluginCapability {
                r#type: Some(Type::Service(Service {
                    r#type: service::Type::ControllerService as i32,
                })),
            }],
        }))
    }

    async fn probe(
        &self,
        _: Request<pb::ProbeRequest>,
    ) -> Result<Response<pb::ProbeResponse>, Status> {
        Ok(Response::new(pb::ProbeResponse { ready: Some(true) }))
    }
}

#[tonic::async_trait]
impl pb::controller_server::Controller for FastPlugin {
    async fn create_volume(
        &self,
        request: Request<pb::CreateVolumeRequest>,
    ) -> Result<Response<pb::CreateVolumeResponse>, Status> {
        let request = request.into_inner();
        if request.name.is_empty() {
            return Err(Status::invalid_argument("name is required"));
        }
        let capacity = request
            .capacity_range
            .map_or(0, |range| range.required_bytes);
        let mut volumes = self.lock();
        let id = match volumes.by_name.get(&request.name) {
            Some(id) => id.clone(),
            None => {
                let id = format!("fast-{}", self.next.fetch_add(1, Ordering::Relaxed));
                volumes.by_name.insert(request.name.clone(), id.clone());
                volumes.by_id.insert(id.clone(), (capacity, request.name));
                id
            }
        };
        let capacity_bytes = volumes.by_id.get(&id).map_or(capacity, |(c, _)| *c);
        Ok(Response::new(pb::CreateVolumeResponse {
            volume: Some(pb::Volume {
                capacity_bytes,
                volume_id: id,
                ..pb::Volume::default()
            }),
        }))
    }

    async fn delete_volume(
        &self,
        request: Request<pb::DeleteVolumeRequest>,
    ) -> Result<Response<pb::DeleteVolumeResponse>, Status> {
        let id = request.into_inner().volume_id;
        let mut volumes = self.lock();
        if let Some((_, name)) = volumes.by_id.remove(&id) {
            volumes.by_name.remove(&name);
        }
        Ok(Response::new(pb::DeleteVolumeResponse {}))
    }

    async fn controller_publish_volume(
        &self,
        _: Request<pb::ControllerPublishVolumeRequest>,
    ) -> Result<Response<pb::ControllerPublishVolumeResponse>, Status> {
        unimplemented("ControllerPublishVolume")
    }

    async fn controller_unpublish_volume(
        &self,
        _: Request<pb::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<pb::ControllerUnpublishVolumeResponse>, Status> {
        unimplemented("ControllerUnpublishVolume")
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<pb::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<pb::ValidateVolumeCapabilitiesResponse>, Status> {
        let request = request.into_inner();
        if !self.lock().by_id.contains_key(&request.volume_id) {
            return Err(Status::not_found(request.volume_id));
        }
        Ok(Response::new(pb::ValidateVolumeCapabilitiesResponse {
            confirmed: Some(pb::validate_volume_capabilities_response::Confirmed {
                volume_context: request.volume_context,
                volume_capabilities: request.volume_capabilities,
                parameters: request.parameters,
                mutable_parameters: request.mutable_parameters,
            }),
            message: String::new(),
        }))
    }

    async fn list_volumes(
        &self,
        request: Request<pb::ListVolumesRequest>,
    ) -> Result<Response<pb::ListVolumesResponse>, Status> {
        let request = request.into_inner();
        let volumes = self.lock();
        let start = request.starting_token;
        let limit = usize::try_from(request.max_entries)
            .ok()
            .filter(|&n| n > 0)
            .unwrap_or(usize::MAX);
        let mut entries = Vec::new();
        let mut next_token = String::new();
        // The token is the id to start at (exclusive bounds are not needed: ids are unique).
        for (id, &(capacity, _)) in volumes.by_id.range(start..) {
            if entries.len() == limit {
                next_token.clone_from(id);
                break;
            }
            entries.push(pb::list_volumes_response::Entry {
                volume: Some(pb::Volume {
                    capacity_bytes: capacity,
                    volume_id: id.clone(),
                    ..pb::Volume::default()
                }),
                status: None,
            });
        }
        Ok(Response::new(pb::ListVolumesResponse {
            entries,
            next_token,
        }))
    }

    async fn get_capacity(
        &self,
        _: Request<pb::GetCapacityRequest>,
    ) -> Result<Response<pb::GetCapacityResponse>, Status> {
        Ok(Response::new(pb::GetCapacityResponse {
            available_capacity: CAPACITY,
            maximum_volume_size: None,
            minimum_volume_size: None,
        }))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<pb::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<pb::ControllerGetCapabilitiesResponse>, Status> {
        use pb::controller_service_capability::{Rpc, Type, rpc::Type as T};
        let capabilities = [T::CreateDeleteVolume, T::ListVolumes, T::GetCapacity]
            .into_iter()
            .map(|t| pb::ControllerServiceCapability {
                r#type: Some(Type::Rpc(Rpc { r#type: t as i32 })),
            })
            .collect();
        Ok(Response::new(pb::ControllerGetCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn create_snapshot(
        &self,
        _: Request<pb::CreateSnapshotRequest>,
    ) -> Result<Response<pb::CreateSnapshotResponse>, Status> {
        unimplemented("CreateSnapshot")
    }

    async fn delete_snapshot(
        &self,
        _: Request<pb::DeleteSnapshotRequest>,
    ) -> Result<Response<pb::DeleteSnapshotResponse>, Status> {
        unimplemented("DeleteSnapshot")
    }

    async fn list_snapshots(
        &self,
        _: Request<pb::ListSnapshotsRequest>,
    ) -> Result<Response<pb::ListSnapshotsResponse>, Status> {
        unimplemented("ListSnapshots")
    }

    async fn get_snapshot(
        &self,
        _: Request<pb::GetSnapshotRequest>,
    ) -> Result<Response<pb::GetSnapshotResponse>, Status> {
        unimplemented("GetSnapshot")
    }

    async fn controller_expand_volume(
        &self,
        _: Request<pb::ControllerExpandVolumeRequest>,
    ) -> Result<Response<pb::ControllerExpandVolumeResponse>, Status> {
        unimplemented("ControllerExpandVolume")
    }

    async fn controller_get_volume(
        &self,
        _: Request<pb::ControllerGetVolumeRequest>,
    ) -> Result<Response<pb::ControllerGetVolumeResponse>, Status> {
        unimplemented("ControllerGetVolume")
    }

    async fn controller_modify_volume(
        &self,
        _: Request<pb::ControllerModifyVolumeRequest>,
    ) -> Result<Response<pb::ControllerModifyVolumeResponse>, Status> {
        unimplemented("ControllerModifyVolume")
    }
}

#[tonic::async_trait]
impl pb::node_server::Node for FastPlugin {
    async fn node_stage_volume(
        &self,
        _: Request<pb::NodeStageVolumeRequest>,
    ) -> Result<Response<pb::NodeStageVolumeResponse>, Status> {
        unimplemented("NodeStageVolume")
    }

    async fn node_unstage_volume(
        &self,
        _: Request<pb::NodeUnstageVolumeRequest>,
    ) -> Result<Response<pb::NodeUnstageVolumeResponse>, Status> {
        unimplemented("NodeUnstageVolume")
    }

    async fn node_publish_volume(
        &self,
        _: Request<pb::NodePublishVolumeRequest>,
    ) -> Result<Response<pb::NodePublishVolumeResponse>, Status> {
        unimplemented("NodePublishVolume")
    }

    async fn node_unpublish_volume(
        &self,
        _: Request<pb::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<pb::NodeUnpublishVolumeResponse>, Status> {
        unimplemented("NodeUnpublishVolume")
    }

    async fn node_get_volume_stats(
        &self,
        _: Request<pb::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<pb::NodeGetVolumeStatsResponse>, Status> {
        // At once, for the volume health benchmark (which asks without capabilities: the
        // operations benchmark's provider never asks, as nothing is advertised).
        let usage = |unit: pb::volume_usage::Unit, total| pb::VolumeUsage {
            available: total / 2,
            total,
            used: total / 2,
            unit: unit as i32,
        };
        Ok(Response::new(pb::NodeGetVolumeStatsResponse {
            usage: vec![
                usage(pb::volume_usage::Unit::Bytes, 1 << 30),
                usage(pb::volume_usage::Unit::Inodes, 1 << 16),
            ],
            volume_condition: Some(pb::VolumeCondition {
                abnormal: false,
                message: "ok".into(),
            }),
        }))
    }

    async fn node_expand_volume(
        &self,
        _: Request<pb::NodeExpandVolumeRequest>,
    ) -> Result<Response<pb::NodeExpandVolumeResponse>, Status> {
        unimplemented("NodeExpandVolume")
    }

    async fn node_get_capabilities(
        &self,
        _: Request<pb::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<pb::NodeGetCapabilitiesResponse>, Status> {
        Ok(Response::new(pb::NodeGetCapabilitiesResponse {
            capabilities: Vec::new(),
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<pb::NodeGetInfoRequest>,
    ) -> Result<Response<pb::NodeGetInfoResponse>, Status> {
        Ok(Response::new(pb::NodeGetInfoResponse {
            node_id: "bench-node".into(),
            max_volumes_per_node: 0,
            accessible_topology: None,
        }))
    }
}
