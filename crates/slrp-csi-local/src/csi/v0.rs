//! `csi.v0` Identity, Controller and Node services (CSI 0.2 and 0.3 clients).
//!
//! CSI 0.2 clients call `NodeGetId`, 0.3 clients `NodeGetInfo`; both are served. v0 has no
//! expansion and no volume stats, so those capabilities are not advertised here.
//!
//! CSI 0.3's snapshots map directly onto the core: CreateSnapshot, DeleteSnapshot and
//! ListSnapshots (CREATE_DELETE_SNAPSHOT, LIST_SNAPSHOTS), and CreateVolume from a snapshot
//! (its only content source). 0.3 has no cloning (no volume source), no GetSnapshot and
//! no SINGLE_NODE_MULTI_WRITER. A snapshot's `created_at` is nanoseconds since the Unix
//! epoch and its status READY (the copy is made within CreateSnapshot).

use slrp_proto::csi::v0 as csi;
use slrp_proto::csi::v0::controller_server::Controller;
use slrp_proto::csi::v0::identity_server::Identity;
use slrp_proto::csi::v0::node_server::Node;
use tonic::{Request, Response, Status};

use super::{Shared, VENDOR_VERSION, capability, range};
use crate::host::Host;
use crate::types::{self, AccessMode, AccessType, Capability, Validation};

/// CSI v0 plugin names are reverse-domain names.
pub(crate) const PLUGIN_NAME: &str = "io.slrp.csi-local";

/// The v0 services, one value serving all three.
#[derive(Debug)]
pub(crate) struct CsiV0<H: Host>(pub(crate) Shared<H>);

impl<H: Host> Clone for CsiV0<H> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

fn mode(m: Option<&csi::volume_capability::AccessMode>) -> Option<AccessMode> {
    use csi::volume_capability::access_mode::Mode;
    Some(match Mode::try_from(m?.mode).ok()? {
        Mode::Unknown => return None,
        Mode::SingleNodeWriter => AccessMode::SingleNodeWriter,
        Mode::SingleNodeReaderOnly => AccessMode::SingleNodeReaderOnly,
        Mode::MultiNodeReaderOnly => AccessMode::MultiNodeReaderOnly,
        Mode::MultiNodeSingleWriter => AccessMode::MultiNodeSingleWriter,
        Mode::MultiNodeMultiWriter => AccessMode::MultiNodeMultiWriter,
    })
}

fn cap(field: &'static str, c: &csi::VolumeCapability) -> Result<Capability, Status> {
    use csi::volume_capability::AccessType as At;
    let access = c.access_type.as_ref().map(|a| match a {
        At::Block(_) => AccessType::Block,
        At::Mount(m) => AccessType::Mount {
            fs_type: m.fs_type.clone(),
            mount_flags: m.mount_flags.clone(),
        },
    });
    capability(field, access, mode(c.access_mode.as_ref()))
}

fn caps(field: &'static str, cs: &[csi::VolumeCapability]) -> Result<Vec<Capability>, Status> {
    cs.iter().map(|c| cap(field, c)).collect()
}

fn required_cap(
    field: &'static str,
    c: Option<&csi::VolumeCapability>,
) -> Result<Capability, Status> {
    match c {
        Some(c) => cap(field, c),
        None => Err(Status::invalid_argument(format!(
            "invalid {field}: is missing"
        ))),
    }
}

fn volume(v: types::VolumeInfo) -> csi::Volume {
    use csi::volume_content_source::{SnapshotSource, Type};
    csi::Volume {
        capacity_bytes: v.capacity_bytes,
        id: v.volume_id,
        attributes: v.volume_context,
        // A clone's source (a volume) has no v0 form; it is left out.
        content_source: match v.content_source {
            Some(types::ContentSource::Snapshot(id)) => Some(csi::VolumeContentSource {
                r#type: Some(Type::Snapshot(SnapshotSource { id })),
            }),
            Some(types::ContentSource::Volume(_)) | None => None,
        },
        accessible_topology: Vec::new(),
    }
}

fn content_source(
    s: Option<csi::VolumeContentSource>,
) -> Result<Option<types::ContentSource>, Status> {
    use csi::volume_content_source::Type;
    let Some(s) = s else { return Ok(None) };
    match s.r#type {
        Some(Type::Snapshot(snap)) => Ok(Some(types::ContentSource::Snapshot(snap.id))),
        None => Err(Status::invalid_argument(
            "invalid volume_content_source: names no snapshot",
        )),
    }
}

fn snapshot(s: types::SnapshotInfo) -> csi::Snapshot {
    let nanos = s
        .creation_time
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    csi::Snapshot {
        size_bytes: s.size_bytes,
        id: s.snapshot_id,
        source_volume_id: s.source_volume_id,
        created_at: i64::try_from(nanos).unwrap_or(i64::MAX),
        status: Some(csi::SnapshotStatus {
            r#type: if s.ready_to_use {
                csi::snapshot_status::Type::Ready
            } else {
                csi::snapshot_status::Type::Uploading
            } as i32,
            details: String::new(),
        }),
    }
}

fn empty_id(field: &str, id: &str) -> Result<(), Status> {
    if id.is_empty() {
        return Err(Status::invalid_argument(format!(
            "invalid {field}: is empty"
        )));
    }
    Ok(())
}

#[tonic::async_trait]
impl<H: Host> Identity for CsiV0<H> {
    async fn get_plugin_info(
        &self,
        _req: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        self.0.enter("GetPluginInfo").await?;
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: PLUGIN_NAME.to_owned(),
            vendor_version: VENDOR_VERSION.to_owned(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _req: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        use csi::plugin_capability::{Service, Type, service};
        self.0.enter("GetPluginCapabilities").await?;
        Ok(Response::new(csi::GetPluginCapabilitiesResponse {
            capabilities: vec![csi::PluginCapability {
                r#type: Some(Type::Service(Service {
                    r#type: service::Type::ControllerService as i32,
                })),
            }],
        }))
    }

    async fn probe(
        &self,
        _req: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        self.0.enter("Probe").await?;
        Ok(Response::new(csi::ProbeResponse { ready: Some(true) }))
    }
}

#[tonic::async_trait]
impl<H: Host> Controller for CsiV0<H> {
    async fn create_volume(
        &self,
        req: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        self.0.enter("CreateVolume").await?;
        let r = req.into_inner();
        if r.name.is_empty() {
            return Err(Status::invalid_argument("invalid name: is empty"));
        }
        let domain = types::CreateVolume {
            name: r.name,
            capacity_range: r
                .capacity_range
                .map(|c| range(c.required_bytes, c.limit_bytes)),
            capabilities: caps("volume_capabilities", &r.volume_capabilities)?,
            parameters: r.parameters,
            content_source: content_source(r.volume_content_source)?,
        };
        let v = self.0.run(move |p| p.create_volume(&domain)).await?;
        Ok(Response::new(csi::CreateVolumeResponse {
            volume: Some(volume(v)),
        }))
    }

    async fn delete_volume(
        &self,
        req: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        self.0.enter("DeleteVolume").await?;
        let id = req.into_inner().volume_id;
        self.0.run(move |p| p.delete_volume(&id)).await?;
        Ok(Response::new(csi::DeleteVolumeResponse {}))
    }

    async fn controller_publish_volume(
        &self,
        _req: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        self.0.enter("ControllerPublishVolume").await?;
        Err(Status::unimplemented(
            "node-local volumes need no ControllerPublishVolume",
        ))
    }

    async fn controller_unpublish_volume(
        &self,
        _req: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        self.0.enter("ControllerUnpublishVolume").await?;
        Err(Status::unimplemented(
            "node-local volumes need no ControllerUnpublishVolume",
        ))
    }

    async fn validate_volume_capabilities(
        &self,
        req: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        self.0.enter("ValidateVolumeCapabilities").await?;
        let r = req.into_inner();
        empty_id("volume_id", &r.volume_id)?;
        let cs = caps("volume_capabilities", &r.volume_capabilities)?;
        let (id, attributes) = (r.volume_id, r.volume_attributes);
        // v0 has no parameters in this call; its attributes are v1's volume context.
        let outcome = self
            .0
            .run(move |p| {
                p.validate_volume_capabilities(&id, &cs, &attributes, &Default::default())
            })
            .await?;
        let resp = match outcome {
            Validation::Confirmed => csi::ValidateVolumeCapabilitiesResponse {
                supported: true,
                message: String::new(),
            },
            Validation::Unconfirmed(message) => csi::ValidateVolumeCapabilitiesResponse {
                supported: false,
                message,
            },
        };
        Ok(Response::new(resp))
    }

    async fn list_volumes(
        &self,
        req: Request<csi::ListVolumesRequest>,
    ) -> Result<Response<csi::ListVolumesResponse>, Status> {
        let r = req.into_inner();
        let page = self.0.list_volumes(r.max_entries, r.starting_token).await?;
        Ok(Response::new(csi::ListVolumesResponse {
            entries: page
                .entries
                .into_iter()
                .map(|v| csi::list_volumes_response::Entry {
                    volume: Some(volume(v)),
                })
                .collect(),
            next_token: page.next_token,
        }))
    }

    async fn get_capacity(
        &self,
        req: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        self.0.enter("GetCapacity").await?;
        let r = req.into_inner();
        let cs = caps("volume_capabilities", &r.volume_capabilities)?;
        let c = self
            .0
            .run(move |p| p.get_capacity(&cs, &r.parameters))
            .await?;
        Ok(Response::new(csi::GetCapacityResponse {
            available_capacity: c.available_capacity,
        }))
    }

    async fn controller_get_capabilities(
        &self,
        _req: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        use csi::controller_service_capability::{Rpc, Type, rpc::Type as T};
        self.0.enter("ControllerGetCapabilities").await?;
        let capabilities = [
            T::CreateDeleteVolume,
            T::ListVolumes,
            T::GetCapacity,
            T::CreateDeleteSnapshot,
            T::ListSnapshots,
        ]
        .into_iter()
        .map(|t| csi::ControllerServiceCapability {
            r#type: Some(Type::Rpc(Rpc { r#type: t as i32 })),
        })
        .collect();
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn create_snapshot(
        &self,
        req: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        self.0.enter("CreateSnapshot").await?;
        let r = req.into_inner();
        let domain = types::CreateSnapshot {
            name: r.name,
            source_volume_id: r.source_volume_id,
            parameters: r.parameters,
        };
        let s = self.0.run(move |p| p.create_snapshot(&domain)).await?;
        Ok(Response::new(csi::CreateSnapshotResponse {
            snapshot: Some(snapshot(s)),
        }))
    }

    async fn delete_snapshot(
        &self,
        req: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        self.0.enter("DeleteSnapshot").await?;
        let id = req.into_inner().snapshot_id;
        self.0.run(move |p| p.delete_snapshot(&id)).await?;
        Ok(Response::new(csi::DeleteSnapshotResponse {}))
    }

    async fn list_snapshots(
        &self,
        req: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        self.0.enter("ListSnapshots").await?;
        let r = req.into_inner();
        let page = self
            .0
            .run(move |p| {
                p.list_snapshots(
                    r.max_entries,
                    &r.starting_token,
                    &r.source_volume_id,
                    &r.snapshot_id,
                )
            })
            .await?;
        Ok(Response::new(csi::ListSnapshotsResponse {
            entries: page
                .entries
                .into_iter()
                .map(|s| csi::list_snapshots_response::Entry {
                    snapshot: Some(snapshot(s)),
                })
                .collect(),
            next_token: page.next_token,
        }))
    }
}

#[tonic::async_trait]
impl<H: Host> Node for CsiV0<H> {
    async fn node_stage_volume(
        &self,
        req: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        self.0.enter("NodeStageVolume").await?;
        let r = req.into_inner();
        empty_id("volume_id", &r.volume_id)?;
        empty_id("staging_target_path", &r.staging_target_path)?;
        let st = types::StageVolume {
            capability: required_cap("volume_capability", r.volume_capability.as_ref())?,
            volume_id: r.volume_id,
            staging_target_path: r.staging_target_path,
        };
        self.0.run(move |p| p.stage_volume(&st)).await?;
        Ok(Response::new(csi::NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        req: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        self.0.enter("NodeUnstageVolume").await?;
        let r = req.into_inner();
        self.0
            .run(move |p| p.unstage_volume(&r.volume_id, &r.staging_target_path))
            .await?;
        Ok(Response::new(csi::NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        req: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        self.0.enter("NodePublishVolume").await?;
        let r = req.into_inner();
        empty_id("volume_id", &r.volume_id)?;
        empty_id("target_path", &r.target_path)?;
        let pr = types::PublishVolume {
            capability: required_cap("volume_capability", r.volume_capability.as_ref())?,
            volume_id: r.volume_id,
            staging_target_path: r.staging_target_path,
            target_path: r.target_path,
            readonly: r.readonly,
        };
        self.0.run(move |p| p.publish_volume(&pr)).await?;
        Ok(Response::new(csi::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        req: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        self.0.enter("NodeUnpublishVolume").await?;
        let r = req.into_inner();
        self.0
            .run(move |p| p.unpublish_volume(&r.volume_id, &r.target_path))
            .await?;
        Ok(Response::new(csi::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_id(
        &self,
        _req: Request<csi::NodeGetIdRequest>,
    ) -> Result<Response<csi::NodeGetIdResponse>, Status> {
        self.0.enter("NodeGetId").await?;
        Ok(Response::new(csi::NodeGetIdResponse {
            node_id: self.0.plugin.node_info().0,
        }))
    }

    async fn node_get_capabilities(
        &self,
        _req: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        use csi::node_service_capability::{Rpc, Type, rpc::Type as T};
        self.0.enter("NodeGetCapabilities").await?;
        Ok(Response::new(csi::NodeGetCapabilitiesResponse {
            capabilities: vec![csi::NodeServiceCapability {
                r#type: Some(Type::Rpc(Rpc {
                    r#type: T::StageUnstageVolume as i32,
                })),
            }],
        }))
    }

    async fn node_get_info(
        &self,
        _req: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        self.0.enter("NodeGetInfo").await?;
        let (node_id, max) = self.0.plugin.node_info();
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id,
            max_volumes_per_node: i64::try_from(max).unwrap_or(i64::MAX),
            accessible_topology: None,
        }))
    }
}
