//! `csi.v1` backend: conversions between domain types and `csi.v1` messages, and one
//! function per RPC. Each function is a single attempt; deadlines, retries and metrics are
//! the client's job.

use std::collections::HashMap;
use std::time::Duration;

use slrp_proto::csi::v1 as pb;
use slrp_proto::csi::v1::controller_client::ControllerClient;
use slrp_proto::csi::v1::identity_client::IdentityClient;
use slrp_proto::csi::v1::node_client::NodeClient;
use tonic::transport::Channel;

use crate::client::{AttemptError, RawPage};
use crate::types::*;

fn request<T>(msg: T, timeout: Duration) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(timeout);
    r
}

fn map_in(m: &StringMap) -> HashMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn map_out(m: HashMap<String, String>) -> StringMap {
    m.into_iter().collect()
}

pub(crate) fn capability_in(c: &VolumeCapability) -> pb::VolumeCapability {
    c.to_csi_v1()
}

/// The volume as the plugin gave it; [`crate::answer`] decides what is usable.
fn volume_of(v: pb::Volume) -> Volume {
    Volume {
        volume_id: VolumeId::new(v.volume_id),
        capacity_bytes: v.capacity_bytes,
        volume_context: map_out(v.volume_context),
    }
}

fn volume_out(v: Option<pb::Volume>) -> Result<Volume, AttemptError> {
    v.map(volume_of)
        .ok_or_else(|| AttemptError::missing("volume"))
}

pub(crate) async fn probe(ch: Channel, t: Duration) -> Result<bool, tonic::Status> {
    let r = IdentityClient::new(ch)
        .probe(request(pb::ProbeRequest {}, t))
        .await?
        .into_inner();
    Ok(r.ready.unwrap_or(true))
}

pub(crate) async fn plugin_info(ch: Channel, t: Duration) -> Result<PluginInfo, AttemptError> {
    let r = IdentityClient::new(ch)
        .get_plugin_info(request(pb::GetPluginInfoRequest {}, t))
        .await?
        .into_inner();
    Ok(PluginInfo {
        name: r.name,
        vendor_version: r.vendor_version,
        manifest: map_out(r.manifest),
    })
}

pub(crate) async fn plugin_capabilities(
    ch: Channel,
    t: Duration,
) -> Result<PluginCapabilities, AttemptError> {
    use pb::plugin_capability::{Type, service, volume_expansion};
    let r = IdentityClient::new(ch)
        .get_plugin_capabilities(request(pb::GetPluginCapabilitiesRequest {}, t))
        .await?
        .into_inner();
    let mut caps = PluginCapabilities::default();
    for c in r.capabilities {
        match c.r#type {
            Some(Type::Service(s)) => match service::Type::try_from(s.r#type) {
                Ok(service::Type::ControllerService) => caps.controller_service = true,
                Ok(service::Type::VolumeAccessibilityConstraints) => {
                    caps.accessibility_constraints = true;
                }
                Ok(service::Type::GroupControllerService) => caps.group_controller_service = true,
                Ok(service::Type::Unknown | service::Type::SnapshotMetadataService) | Err(_) => {}
            },
            Some(Type::VolumeExpansion(e)) => match volume_expansion::Type::try_from(e.r#type) {
                Ok(volume_expansion::Type::Online) => caps.expansion_online = true,
                Ok(volume_expansion::Type::Offline) => caps.expansion_offline = true,
                Ok(volume_expansion::Type::Unknown) | Err(_) => {}
            },
            None => {}
        }
    }
    Ok(caps)
}

pub(crate) async fn controller_capabilities(
    ch: Channel,
    t: Duration,
) -> Result<ControllerCapabilities, AttemptError> {
    use pb::controller_service_capability::{Type, rpc::Type as R};
    let r = ControllerClient::new(ch)
        .controller_get_capabilities(request(pb::ControllerGetCapabilitiesRequest {}, t))
        .await?
        .into_inner();
    let mut caps = ControllerCapabilities::default();
    for c in r.capabilities {
        let Some(Type::Rpc(rpc)) = c.r#type else {
            continue;
        };
        match R::try_from(rpc.r#type) {
            Ok(R::CreateDeleteVolume) => caps.create_delete_volume = true,
            Ok(R::PublishUnpublishVolume) => caps.publish_unpublish_volume = true,
            Ok(R::ListVolumes) => caps.list_volumes = true,
            Ok(R::GetCapacity) => caps.get_capacity = true,
            Ok(R::CreateDeleteSnapshot) => caps.create_delete_snapshot = true,
            Ok(R::ListSnapshots) => caps.list_snapshots = true,
            Ok(R::CloneVolume) => caps.clone_volume = true,
            Ok(R::PublishReadonly) => caps.publish_readonly = true,
            Ok(R::ExpandVolume) => caps.expand_volume = true,
            Ok(R::GetVolume) => caps.get_volume = true,
            Ok(R::VolumeCondition) => caps.volume_condition = true,
            // Recognized but not used by slrp; unknown values are ignored (spec §4.4).
            Ok(_) | Err(_) => {}
        }
    }
    Ok(caps)
}

pub(crate) async fn node_capabilities(
    ch: Channel,
    t: Duration,
) -> Result<NodeCapabilities, AttemptError> {
    use pb::node_service_capability::{Type, rpc::Type as R};
    let r = NodeClient::new(ch)
        .node_get_capabilities(request(pb::NodeGetCapabilitiesRequest {}, t))
        .await?
        .into_inner();
    let mut caps = NodeCapabilities::default();
    for c in r.capabilities {
        let Some(Type::Rpc(rpc)) = c.r#type else {
            continue;
        };
        match R::try_from(rpc.r#type) {
            Ok(R::StageUnstageVolume) => caps.stage_unstage_volume = true,
            Ok(R::GetVolumeStats) => caps.get_volume_stats = true,
            Ok(R::ExpandVolume) => caps.expand_volume = true,
            Ok(R::VolumeCondition) => caps.volume_condition = true,
            Ok(_) | Err(_) => {}
        }
    }
    Ok(caps)
}

pub(crate) async fn node_info(ch: Channel, t: Duration) -> Result<NodeInfo, AttemptError> {
    let r = NodeClient::new(ch)
        .node_get_info(request(pb::NodeGetInfoRequest {}, t))
        .await?
        .into_inner();
    Ok(NodeInfo {
        node_id: r.node_id,
        max_volumes_per_node: r.max_volumes_per_node,
        accessible_topology: r.accessible_topology.map(|t| map_out(t.segments)),
    })
}

pub(crate) async fn create_volume(
    ch: Channel,
    t: Duration,
    req: &CreateVolumeRequest,
) -> Result<Volume, AttemptError> {
    let msg = pb::CreateVolumeRequest {
        name: req.name.clone(),
        capacity_range: (req.required_bytes != 0 || req.limit_bytes != 0).then_some(
            pb::CapacityRange {
                required_bytes: req.required_bytes,
                limit_bytes: req.limit_bytes,
            },
        ),
        volume_capabilities: req.capabilities.iter().map(capability_in).collect(),
        parameters: map_in(&req.parameters),
        secrets: req.secrets.to_proto(),
        volume_content_source: req.content_source.as_ref().map(content_source_in),
        ..Default::default()
    };
    let r = ControllerClient::new(ch)
        .create_volume(request(msg, t))
        .await?
        .into_inner();
    volume_out(r.volume)
}

fn content_source_in(source: &ContentSource) -> pb::VolumeContentSource {
    use pb::volume_content_source::{SnapshotSource, Type, VolumeSource};
    pb::VolumeContentSource {
        r#type: Some(match source {
            ContentSource::Snapshot(id) => Type::Snapshot(SnapshotSource {
                snapshot_id: id.clone(),
            }),
            ContentSource::Volume(id) => Type::Volume(VolumeSource {
                volume_id: id.as_str().to_owned(),
            }),
        }),
    }
}

fn snapshot_out(s: Option<pb::Snapshot>) -> Result<Snapshot, AttemptError> {
    let s = s.ok_or(AttemptError::Invalid {
        violation: crate::answer::Violation::Missing { field: "snapshot" },
        created: None,
    })?;
    Ok(Snapshot {
        snapshot_id: s.snapshot_id,
        source_volume_id: VolumeId::new(s.source_volume_id),
        size_bytes: s.size_bytes,
        creation_time: s.creation_time.map(|t| t.seconds),
        ready_to_use: s.ready_to_use,
    })
}

pub(crate) async fn create_snapshot(
    ch: Channel,
    t: Duration,
    req: &CreateSnapshotRequest,
) -> Result<Snapshot, AttemptError> {
    let msg = pb::CreateSnapshotRequest {
        source_volume_id: req.source_volume_id.as_str().to_owned(),
        name: req.name.clone(),
        secrets: HashMap::new(),
        parameters: map_in(&req.parameters),
    };
    let r = ControllerClient::new(ch)
        .create_snapshot(request(msg, t))
        .await?
        .into_inner();
    snapshot_out(r.snapshot)
}

pub(crate) async fn delete_snapshot(
    ch: Channel,
    t: Duration,
    snapshot_id: &str,
) -> Result<(), AttemptError> {
    let msg = pb::DeleteSnapshotRequest {
        snapshot_id: snapshot_id.to_owned(),
        secrets: HashMap::new(),
    };
    ControllerClient::new(ch)
        .delete_snapshot(request(msg, t))
        .await?;
    Ok(())
}

pub(crate) async fn list_snapshots(
    ch: Channel,
    t: Duration,
    max_entries: i32,
    starting_token: Option<&str>,
) -> Result<SnapshotPage, AttemptError> {
    let msg = pb::ListSnapshotsRequest {
        max_entries,
        starting_token: starting_token.unwrap_or_default().to_owned(),
        ..Default::default()
    };
    let r = ControllerClient::new(ch)
        .list_snapshots(request(msg, t))
        .await?
        .into_inner();
    let snapshots = r
        .entries
        .into_iter()
        .map(|e| snapshot_out(e.snapshot))
        .collect::<Result<_, _>>()?;
    Ok(SnapshotPage {
        snapshots,
        next_token: (!r.next_token.is_empty()).then_some(r.next_token),
    })
}

pub(crate) async fn delete_volume(
    ch: Channel,
    t: Duration,
    id: &VolumeId,
    secrets: &Secrets,
) -> Result<(), AttemptError> {
    let msg = pb::DeleteVolumeRequest {
        volume_id: id.as_str().to_owned(),
        secrets: secrets.to_proto(),
    };
    ControllerClient::new(ch)
        .delete_volume(request(msg, t))
        .await?;
    Ok(())
}

pub(crate) async fn controller_publish(
    ch: Channel,
    t: Duration,
    req: &ControllerPublishRequest,
) -> Result<StringMap, AttemptError> {
    let msg = pb::ControllerPublishVolumeRequest {
        volume_id: req.volume_id.as_str().to_owned(),
        node_id: req.node_id.clone(),
        volume_capability: Some(capability_in(&req.capability)),
        readonly: req.readonly,
        secrets: req.secrets.to_proto(),
        volume_context: map_in(&req.volume_context),
    };
    let r = ControllerClient::new(ch)
        .controller_publish_volume(request(msg, t))
        .await?
        .into_inner();
    Ok(map_out(r.publish_context))
}

pub(crate) async fn controller_unpublish(
    ch: Channel,
    t: Duration,
    id: &VolumeId,
    node_id: &str,
) -> Result<(), AttemptError> {
    let msg = pb::ControllerUnpublishVolumeRequest {
        volume_id: id.as_str().to_owned(),
        node_id: node_id.to_owned(),
        secrets: HashMap::new(),
    };
    ControllerClient::new(ch)
        .controller_unpublish_volume(request(msg, t))
        .await?;
    Ok(())
}

pub(crate) async fn validate(
    ch: Channel,
    t: Duration,
    req: &ValidateRequest,
) -> Result<Validation, AttemptError> {
    let msg = pb::ValidateVolumeCapabilitiesRequest {
        volume_id: req.volume_id.as_str().to_owned(),
        volume_context: map_in(&req.volume_context),
        volume_capabilities: req.capabilities.iter().map(capability_in).collect(),
        parameters: map_in(&req.parameters),
        ..Default::default()
    };
    let r = ControllerClient::new(ch)
        .validate_volume_capabilities(request(msg, t))
        .await?
        .into_inner();
    let confirmed_fields = r.confirmed.map(|c| Confirmed {
        volume_context: map_out(c.volume_context),
        capabilities: c
            .volume_capabilities
            .iter()
            .filter_map(|cap| VolumeCapability::from_csi_v1(cap).ok())
            .collect(),
        parameters: map_out(c.parameters),
    });
    Ok(Validation {
        confirmed: confirmed_fields.is_some(),
        message: r.message,
        confirmed_fields,
    })
}

/// One `ListVolumes` page as the plugin answered it.
async fn list_page(
    ch: Channel,
    t: Duration,
    max_entries: i32,
    starting_token: Option<&str>,
) -> Result<pb::ListVolumesResponse, AttemptError> {
    let msg = pb::ListVolumesRequest {
        max_entries,
        starting_token: starting_token.unwrap_or_default().to_owned(),
    };
    Ok(ControllerClient::new(ch)
        .list_volumes(request(msg, t))
        .await?
        .into_inner())
}

pub(crate) async fn list_volumes(
    ch: Channel,
    t: Duration,
    max_entries: i32,
    starting_token: Option<&str>,
) -> Result<RawPage, AttemptError> {
    let r = list_page(ch, t, max_entries, starting_token).await?;
    Ok(RawPage {
        entries: r
            .entries
            .into_iter()
            .map(|e| e.volume.map(volume_of))
            .collect(),
        next_token: (!r.next_token.is_empty()).then_some(r.next_token),
    })
}

/// A `ListVolumes` page read for its entries' `status.volume_condition`: the ids as
/// given (checked by the client) and the conditions.
pub(crate) async fn list_conditions(
    ch: Channel,
    t: Duration,
    max_entries: i32,
    starting_token: Option<&str>,
) -> Result<
    (
        Vec<(Option<String>, Option<VolumeCondition>)>,
        Option<String>,
    ),
    AttemptError,
> {
    let r = list_page(ch, t, max_entries, starting_token).await?;
    let entries = r
        .entries
        .into_iter()
        .map(|e| {
            let condition = e.status.and_then(|s| s.volume_condition).map(condition_of);
            (e.volume.map(|v| v.volume_id), condition)
        })
        .collect();
    Ok((entries, (!r.next_token.is_empty()).then_some(r.next_token)))
}

fn condition_of(c: pb::VolumeCondition) -> VolumeCondition {
    VolumeCondition {
        abnormal: c.abnormal,
        message: c.message,
    }
}

/// `ControllerGetVolume`: the volume's `status.volume_condition`, if given.
pub(crate) async fn controller_get_volume(
    ch: Channel,
    t: Duration,
    id: &VolumeId,
) -> Result<Option<VolumeCondition>, AttemptError> {
    let msg = pb::ControllerGetVolumeRequest {
        volume_id: id.as_str().to_owned(),
    };
    let r = ControllerClient::new(ch)
        .controller_get_volume(request(msg, t))
        .await?
        .into_inner();
    Ok(r.status.and_then(|s| s.volume_condition).map(condition_of))
}

pub(crate) async fn capacity(
    ch: Channel,
    t: Duration,
    caps: &[VolumeCapability],
    parameters: &StringMap,
) -> Result<Capacity, AttemptError> {
    let msg = pb::GetCapacityRequest {
        volume_capabilities: caps.iter().map(capability_in).collect(),
        parameters: map_in(parameters),
        accessible_topology: None,
    };
    let r = ControllerClient::new(ch)
        .get_capacity(request(msg, t))
        .await?
        .into_inner();
    Ok(Capacity {
        available_bytes: r.available_capacity,
        maximum_volume_size: r.maximum_volume_size,
    })
}

pub(crate) async fn controller_expand(
    ch: Channel,
    t: Duration,
    id: &VolumeId,
    required_bytes: i64,
    capability: Option<&VolumeCapability>,
) -> Result<ControllerExpansion, AttemptError> {
    let msg = pb::ControllerExpandVolumeRequest {
        volume_id: id.as_str().to_owned(),
        capacity_range: Some(pb::CapacityRange {
            required_bytes,
            limit_bytes: 0,
        }),
        secrets: HashMap::new(),
        volume_capability: capability.map(capability_in),
    };
    let r = ControllerClient::new(ch)
        .controller_expand_volume(request(msg, t))
        .await?
        .into_inner();
    Ok(ControllerExpansion {
        capacity_bytes: r.capacity_bytes,
        node_expansion_required: r.node_expansion_required,
    })
}

pub(crate) async fn node_stage(
    ch: Channel,
    t: Duration,
    req: &NodeStageRequest,
) -> Result<(), AttemptError> {
    let msg = pb::NodeStageVolumeRequest {
        volume_id: req.volume_id.as_str().to_owned(),
        publish_context: map_in(&req.publish_context),
        staging_target_path: req.staging_target_path.clone(),
        volume_capability: Some(capability_in(&req.capability)),
        secrets: req.secrets.to_proto(),
        volume_context: map_in(&req.volume_context),
    };
    NodeClient::new(ch)
        .node_stage_volume(request(msg, t))
        .await?;
    Ok(())
}

pub(crate) async fn node_unstage(
    ch: Channel,
    t: Duration,
    id: &VolumeId,
    staging_target_path: &str,
) -> Result<(), AttemptError> {
    let msg = pb::NodeUnstageVolumeRequest {
        volume_id: id.as_str().to_owned(),
        staging_target_path: staging_target_path.to_owned(),
    };
    NodeClient::new(ch)
        .node_unstage_volume(request(msg, t))
        .await?;
    Ok(())
}

pub(crate) async fn node_publish(
    ch: Channel,
    t: Duration,
    req: &NodePublishRequest,
) -> Result<(), AttemptError> {
    let msg = pb::NodePublishVolumeRequest {
        volume_id: req.volume_id.as_str().to_owned(),
        publish_context: map_in(&req.publish_context),
        staging_target_path: req.staging_target_path.clone().unwrap_or_default(),
        target_path: req.target_path.clone(),
        volume_capability: Some(capability_in(&req.capability)),
        readonly: req.readonly,
        secrets: req.secrets.to_proto(),
        volume_context: map_in(&req.volume_context),
    };
    NodeClient::new(ch)
        .node_publish_volume(request(msg, t))
        .await?;
    Ok(())
}

pub(crate) async fn node_unpublish(
    ch: Channel,
    t: Duration,
    id: &VolumeId,
    target_path: &str,
) -> Result<(), AttemptError> {
    let msg = pb::NodeUnpublishVolumeRequest {
        volume_id: id.as_str().to_owned(),
        target_path: target_path.to_owned(),
    };
    NodeClient::new(ch)
        .node_unpublish_volume(request(msg, t))
        .await?;
    Ok(())
}

pub(crate) async fn node_stats(
    ch: Channel,
    t: Duration,
    id: &VolumeId,
    volume_path: &str,
) -> Result<VolumeStats, AttemptError> {
    use pb::volume_usage::Unit;
    let msg = pb::NodeGetVolumeStatsRequest {
        volume_id: id.as_str().to_owned(),
        volume_path: volume_path.to_owned(),
        staging_target_path: String::new(),
    };
    let r = NodeClient::new(ch)
        .node_get_volume_stats(request(msg, t))
        .await?
        .into_inner();
    let usage = r
        .usage
        .into_iter()
        .map(|u| VolumeUsage {
            unit: match Unit::try_from(u.unit) {
                Ok(Unit::Bytes) => UsageUnit::Bytes,
                Ok(Unit::Inodes) => UsageUnit::Inodes,
                Ok(Unit::Unknown) | Err(_) => UsageUnit::Unknown,
            },
            available: u.available,
            total: u.total,
            used: u.used,
        })
        .collect();
    Ok(VolumeStats {
        usage,
        abnormal: r.volume_condition.as_ref().map(|c| c.abnormal),
        condition_message: r.volume_condition.map(|c| c.message),
    })
}

pub(crate) async fn node_expand(
    ch: Channel,
    t: Duration,
    req: &NodeExpandRequest,
) -> Result<i64, AttemptError> {
    let msg = pb::NodeExpandVolumeRequest {
        volume_id: req.volume_id.as_str().to_owned(),
        volume_path: req.volume_path.clone(),
        staging_target_path: req.staging_target_path.clone().unwrap_or_default(),
        capacity_range: Some(pb::CapacityRange {
            required_bytes: req.required_bytes,
            limit_bytes: 0,
        }),
        volume_capability: req.capability.as_ref().map(capability_in),
        secrets: HashMap::new(),
    };
    let r = NodeClient::new(ch)
        .node_expand_volume(request(msg, t))
        .await?
        .into_inner();
    Ok(r.capacity_bytes)
}
