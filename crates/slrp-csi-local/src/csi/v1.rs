//! `csi.v1` Identity, Controller and Node services.

use slrp_proto::csi::v1 as csi;
use slrp_proto::csi::v1::controller_server::Controller;
use slrp_proto::csi::v1::identity_server::Identity;
use slrp_proto::csi::v1::node_server::Node;
use tonic::{Request, Response, Status};

use super::{Shared, VENDOR_VERSION, capability, range};
use crate::host::Host;
use crate::types::{self, AccessMode, AccessType, Capability, UsageUnit, Validation};

/// CSI v1 plugin names are domain names.
pub(crate) const PLUGIN_NAME: &str = "slrp-csi-local.slrp.io";

/// The v1 services, one value serving all three.
#[derive(Debug)]
pub(crate) struct CsiV1<H: Host>(pub(crate) Shared<H>);

impl<H: Host> Clone for CsiV1<H> {
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
        Mode::SingleNodeSingleWriter => AccessMode::SingleNodeSingleWriter,
        Mode::SingleNodeMultiWriter => AccessMode::SingleNodeMultiWriter,
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
    use csi::volume_content_source::{SnapshotSource, Type, VolumeSource};
    csi::Volume {
        capacity_bytes: v.capacity_bytes,
        volume_id: v.volume_id,
        volume_context: v.volume_context,
        content_source: v.content_source.map(|s| csi::VolumeContentSource {
            r#type: Some(match s {
                types::ContentSource::Snapshot(snapshot_id) => {
                    Type::Snapshot(SnapshotSource { snapshot_id })
                }
                types::ContentSource::Volume(volume_id) => Type::Volume(VolumeSource { volume_id }),
            }),
        }),
        accessible_topology: Vec::new(),
    }
}

fn content_source(
    s: Option<csi::VolumeContentSource>,
) -> Result<Option<types::ContentSource>, Status> {
    use csi::volume_content_source::Type;
    let Some(s) = s else { return Ok(None) };
    match s.r#type {
        Some(Type::Snapshot(snap)) => Ok(Some(types::ContentSource::Snapshot(snap.snapshot_id))),
        Some(Type::Volume(vol)) => Ok(Some(types::ContentSource::Volume(vol.volume_id))),
        None => Err(Status::invalid_argument(
            "invalid volume_content_source: names neither a snapshot nor a volume",
        )),
    }
}

fn snapshot(s: types::SnapshotInfo) -> csi::Snapshot {
    let since = s
        .creation_time
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    csi::Snapshot {
        size_bytes: s.size_bytes,
        snapshot_id: s.snapshot_id,
        source_volume_id: s.source_volume_id,
        creation_time: Some(prost_types::Timestamp {
            seconds: i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(since.subsec_nanos()).unwrap_or(0),
        }),
        ready_to_use: s.ready_to_use,
        group_snapshot_id: String::new(),
    }
}

fn condition(c: types::Condition) -> csi::VolumeCondition {
    csi::VolumeCondition {
        abnormal: c.abnormal,
        message: c.message,
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
impl<H: Host> Identity for CsiV1<H> {
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
        use csi::plugin_capability::{Service, Type, VolumeExpansion, service, volume_expansion};
        self.0.enter("GetPluginCapabilities").await?;
        let capabilities = vec![
            csi::PluginCapability {
                r#type: Some(Type::Service(Service {
                    r#type: service::Type::ControllerService as i32,
                })),
            },
            csi::PluginCapability {
                r#type: Some(Type::VolumeExpansion(VolumeExpansion {
                    r#type: volume_expansion::Type::Online as i32,
                })),
            },
        ];
        Ok(Response::new(csi::GetPluginCapabilitiesResponse {
            capabilities,
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
impl<H: Host> Controller for CsiV1<H> {
    async fn create_volume(
        &self,
        req: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        self.0.enter("CreateVolume").await?;
        let r = req.into_inner();
        if r.name.is_empty() {
            return Err(Status::invalid_argument("invalid name: is empty"));
        }
        if !r.mutable_parameters.is_empty() {
            return Err(Status::invalid_argument(
                "invalid mutable_parameters: not supported (the plugin has no MODIFY_VOLUME capability)",
            ));
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
        let (id, ctx, params) = (
            r.volume_id.clone(),
            r.volume_context.clone(),
            r.parameters.clone(),
        );
        let outcome = self
            .0
            .run(move |p| p.validate_volume_capabilities(&id, &cs, &ctx, &params))
            .await?;
        let resp = match outcome {
            // Without MODIFY_VOLUME no mutable parameter can be honoured.
            Validation::Confirmed if !r.mutable_parameters.is_empty() => {
                csi::ValidateVolumeCapabilitiesResponse {
                    confirmed: None,
                    message: "mutable_parameters are not supported (no MODIFY_VOLUME capability)"
                        .to_owned(),
                }
            }
            // Echo exactly what was validated, so the CO's comparison with its request holds.
            Validation::Confirmed => csi::ValidateVolumeCapabilitiesResponse {
                confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
                    volume_context: r.volume_context,
                    volume_capabilities: r.volume_capabilities,
                    parameters: r.parameters,
                    mutable_parameters: Default::default(),
                }),
                message: String::new(),
            },
            Validation::Unconfirmed(message) => csi::ValidateVolumeCapabilitiesResponse {
                confirmed: None,
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
                    status: Some(csi::list_volumes_response::VolumeStatus {
                        published_node_ids: v.published_node_ids.clone(),
                        volume_condition: v.condition.clone().map(condition),
                    }),
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
            maximum_volume_size: c.maximum_volume_size,
            minimum_volume_size: c.minimum_volume_size,
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
            T::ExpandVolume,
            T::GetVolume,
            T::VolumeCondition,
            T::CreateDeleteSnapshot,
            T::ListSnapshots,
            T::GetSnapshot,
            T::CloneVolume,
            // Not LIST_VOLUMES_PUBLISHED_NODES: the spec makes it require
            // PUBLISH_UNPUBLISH_VOLUME, which a node-local plugin does not serve.
            T::SingleNodeMultiWriter,
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

    async fn get_snapshot(
        &self,
        req: Request<csi::GetSnapshotRequest>,
    ) -> Result<Response<csi::GetSnapshotResponse>, Status> {
        self.0.enter("GetSnapshot").await?;
        let id = req.into_inner().snapshot_id;
        let s = self.0.run(move |p| p.get_snapshot(&id)).await?;
        Ok(Response::new(csi::GetSnapshotResponse {
            snapshot: Some(snapshot(s)),
        }))
    }

    async fn controller_expand_volume(
        &self,
        req: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        self.0.enter("ControllerExpandVolume").await?;
        let r = req.into_inner();
        empty_id("volume_id", &r.volume_id)?;
        let c = r
            .volume_capability
            .as_ref()
            .map(|c| cap("volume_capability", c))
            .transpose()?;
        let rg = r
            .capacity_range
            .map(|c| range(c.required_bytes, c.limit_bytes));
        let (size, node) = self
            .0
            .run(move |p| p.controller_expand_volume(&r.volume_id, rg, c.as_ref()))
            .await?;
        Ok(Response::new(csi::ControllerExpandVolumeResponse {
            capacity_bytes: i64::try_from(size).unwrap_or(i64::MAX),
            node_expansion_required: node,
        }))
    }

    async fn controller_get_volume(
        &self,
        req: Request<csi::ControllerGetVolumeRequest>,
    ) -> Result<Response<csi::ControllerGetVolumeResponse>, Status> {
        self.0.enter("ControllerGetVolume").await?;
        let id = req.into_inner().volume_id;
        let v = self.0.run(move |p| p.get_volume(&id)).await?;
        Ok(Response::new(csi::ControllerGetVolumeResponse {
            status: Some(csi::controller_get_volume_response::VolumeStatus {
                published_node_ids: v.published_node_ids.clone(),
                volume_condition: v.condition.clone().map(condition),
            }),
            volume: Some(volume(v)),
        }))
    }

    async fn controller_modify_volume(
        &self,
        _req: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        self.0.enter("ControllerModifyVolume").await?;
        Err(Status::unimplemented("MODIFY_VOLUME is not advertised"))
    }
}

#[tonic::async_trait]
impl<H: Host> Node for CsiV1<H> {
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

    async fn node_get_volume_stats(
        &self,
        req: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        use csi::volume_usage::Unit;
        self.0.enter("NodeGetVolumeStats").await?;
        let r = req.into_inner();
        let stats = self
            .0
            .run(move |p| p.volume_stats(&r.volume_id, &r.volume_path))
            .await?;
        Ok(Response::new(csi::NodeGetVolumeStatsResponse {
            usage: stats
                .usage
                .into_iter()
                .map(|u| csi::VolumeUsage {
                    available: u.available,
                    total: u.total,
                    used: u.used,
                    unit: match u.unit {
                        UsageUnit::Bytes => Unit::Bytes,
                        UsageUnit::Inodes => Unit::Inodes,
                    } as i32,
                })
                .collect(),
            volume_condition: Some(condition(stats.condition)),
        }))
    }

    async fn node_expand_volume(
        &self,
        req: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        self.0.enter("NodeExpandVolume").await?;
        let r = req.into_inner();
        empty_id("volume_id", &r.volume_id)?;
        empty_id("volume_path", &r.volume_path)?;
        let c = r
            .volume_capability
            .as_ref()
            .map(|c| cap("volume_capability", c))
            .transpose()?;
        let rg = r
            .capacity_range
            .map(|c| range(c.required_bytes, c.limit_bytes));
        let size = self
            .0
            .run(move |p| p.node_expand_volume(&r.volume_id, &r.volume_path, rg, c.as_ref()))
            .await?;
        Ok(Response::new(csi::NodeExpandVolumeResponse {
            capacity_bytes: i64::try_from(size).unwrap_or(i64::MAX),
        }))
    }

    async fn node_get_capabilities(
        &self,
        _req: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        use csi::node_service_capability::{Rpc, Type, rpc::Type as T};
        self.0.enter("NodeGetCapabilities").await?;
        let capabilities = [
            T::StageUnstageVolume,
            T::GetVolumeStats,
            T::ExpandVolume,
            T::VolumeCondition,
            T::SingleNodeMultiWriter,
        ]
        .into_iter()
        .map(|t| csi::NodeServiceCapability {
            r#type: Some(Type::Rpc(Rpc { r#type: t as i32 })),
        })
        .collect();
        Ok(Response::new(csi::NodeGetCapabilitiesResponse {
            capabilities,
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
