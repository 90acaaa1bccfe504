//! `csi.v0` backend (CSI 0.2 and 0.3 plugins). Same shape as [`crate::v1`]; differences:
//! `Volume.id`/`attributes`, `publish_info`, per-call secret field names, `supported`
//! instead of `confirmed`, no expansion or stats, and `NodeGetId` for 0.2 plugins.

use std::collections::HashMap;
use std::time::Duration;

use slrp_proto::csi::v0 as pb;
use slrp_proto::csi::v0::controller_client::ControllerClient;
use slrp_proto::csi::v0::identity_client::IdentityClient;
use slrp_proto::csi::v0::node_client::NodeClient;
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

pub(crate) fn capability_in(c: &VolumeCapability) -> Result<pb::VolumeCapability, AttemptError> {
    c.to_csi_v0().map_err(|_| {
        // The only capability v0 cannot carry is one with a v1-only access mode.
        AttemptError::Unsupported(match c.access_mode {
            AccessMode::SingleNodeSingleWriter => "access mode SINGLE_NODE_SINGLE_WRITER",
            AccessMode::SingleNodeMultiWriter => "access mode SINGLE_NODE_MULTI_WRITER",
            _ => "this access mode",
        })
    })
}

fn capabilities_in(caps: &[VolumeCapability]) -> Result<Vec<pb::VolumeCapability>, AttemptError> {
    caps.iter().map(capability_in).collect()
}

/// The volume as the plugin gave it; [`crate::answer`] decides what is usable.
fn volume_of(v: pb::Volume) -> Volume {
    Volume {
        volume_id: VolumeId::new(v.id),
        capacity_bytes: v.capacity_bytes,
        volume_context: map_out(v.attributes),
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
    use pb::plugin_capability::{Type, service};
    let r = IdentityClient::new(ch)
        .get_plugin_capabilities(request(pb::GetPluginCapabilitiesRequest {}, t))
        .await?
        .into_inner();
    let mut caps = PluginCapabilities::default();
    for c in r.capabilities {
        if let Some(Type::Service(s)) = c.r#type {
            match service::Type::try_from(s.r#type) {
                Ok(service::Type::ControllerService) => caps.controller_service = true,
                Ok(service::Type::AccessibilityConstraints) => {
                    caps.accessibility_constraints = true;
                }
                Ok(service::Type::Unknown) | Err(_) => {}
            }
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
            Ok(R::Unknown) | Err(_) => {}
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
        if let Some(Type::Rpc(rpc)) = c.r#type
            && let Ok(R::StageUnstageVolume) = R::try_from(rpc.r#type)
        {
            caps.stage_unstage_volume = true;
        }
    }
    Ok(caps)
}

/// `NodeGetInfo` (0.3), falling back to the deprecated `NodeGetId` when the plugin does
/// not implement it (0.2 plugins such as Ember-CSI in v0.2.0 mode).
pub(crate) async fn node_info(ch: Channel, t: Duration) -> Result<NodeInfo, AttemptError> {
    let mut node = NodeClient::new(ch);
    match node
        .node_get_info(request(pb::NodeGetInfoRequest {}, t))
        .await
    {
        Ok(r) => {
            let r = r.into_inner();
            Ok(NodeInfo {
                node_id: r.node_id,
                max_volumes_per_node: r.max_volumes_per_node,
                accessible_topology: r.accessible_topology.map(|t| map_out(t.segments)),
            })
        }
        Err(s) if s.code() == tonic::Code::Unimplemented => {
            #[allow(deprecated)] // NodeGetId is exactly what a 0.2 plugin serves.
            let r = node
                .node_get_id(request(pb::NodeGetIdRequest {}, t))
                .await?
                .into_inner();
            Ok(NodeInfo {
                node_id: r.node_id,
                max_volumes_per_node: 0,
                accessible_topology: None,
            })
        }
        Err(s) => Err(s.into()),
    }
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
        volume_capabilities: capabilities_in(&req.capabilities)?,
        parameters: map_in(&req.parameters),
        controller_create_secrets: req.secrets.to_proto(),
        ..Default::default()
    };
    let r = ControllerClient::new(ch)
        .create_volume(request(msg, t))
        .await?
        .into_inner();
    volume_out(r.volume)
}

pub(crate) async fn delete_volume(
    ch: Channel,
    t: Duration,
    id: &VolumeId,
    secrets: &Secrets,
) -> Result<(), AttemptError> {
    let msg = pb::DeleteVolumeRequest {
        volume_id: id.as_str().to_owned(),
        controller_delete_secrets: secrets.to_proto(),
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
        volume_capability: Some(capability_in(&req.capability)?),
        readonly: req.readonly,
        controller_publish_secrets: req.secrets.to_proto(),
        volume_attributes: map_in(&req.volume_context),
    };
    let r = ControllerClient::new(ch)
        .controller_publish_volume(request(msg, t))
        .await?
        .into_inner();
    Ok(map_out(r.publish_info))
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
        controller_unpublish_secrets: HashMap::new(),
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
    if !req.parameters.is_empty() {
        // v0 has no parameters field; Mesos warns and validates without them.
        tracing::warn!(volume_id = %req.volume_id, "CSI v0 cannot validate creation parameters; ignoring them");
    }
    let msg = pb::ValidateVolumeCapabilitiesRequest {
        volume_id: req.volume_id.as_str().to_owned(),
        volume_capabilities: capabilities_in(&req.capabilities)?,
        volume_attributes: map_in(&req.volume_context),
        accessible_topology: Vec::new(),
    };
    let r = ControllerClient::new(ch)
        .validate_volume_capabilities(request(msg, t))
        .await?
        .into_inner();
    Ok(Validation {
        confirmed: r.supported,
        message: r.message,
        confirmed_fields: None,
    })
}

pub(crate) async fn list_volumes(
    ch: Channel,
    t: Duration,
    max_entries: i32,
    starting_token: Option<&str>,
) -> Result<RawPage, AttemptError> {
    let msg = pb::ListVolumesRequest {
        max_entries,
        starting_token: starting_token.unwrap_or_default().to_owned(),
    };
    let r = ControllerClient::new(ch)
        .list_volumes(request(msg, t))
        .await?
        .into_inner();
    Ok(RawPage {
        entries: r
            .entries
            .into_iter()
            .map(|e| e.volume.map(volume_of))
            .collect(),
        next_token: (!r.next_token.is_empty()).then_some(r.next_token),
    })
}

pub(crate) async fn capacity(
    ch: Channel,
    t: Duration,
    caps: &[VolumeCapability],
    parameters: &StringMap,
) -> Result<Capacity, AttemptError> {
    let msg = pb::GetCapacityRequest {
        volume_capabilities: capabilities_in(caps)?,
        parameters: map_in(parameters),
        accessible_topology: None,
    };
    let r = ControllerClient::new(ch)
        .get_capacity(request(msg, t))
        .await?
        .into_inner();
    Ok(Capacity {
        available_bytes: r.available_capacity,
        maximum_volume_size: None,
    })
}

pub(crate) async fn node_stage(
    ch: Channel,
    t: Duration,
    req: &NodeStageRequest,
) -> Result<(), AttemptError> {
    let msg = pb::NodeStageVolumeRequest {
        volume_id: req.volume_id.as_str().to_owned(),
        publish_info: map_in(&req.publish_context),
        staging_target_path: req.staging_target_path.clone(),
        volume_capability: Some(capability_in(&req.capability)?),
        node_stage_secrets: req.secrets.to_proto(),
        volume_attributes: map_in(&req.volume_context),
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
        publish_info: map_in(&req.publish_context),
        staging_target_path: req.staging_target_path.clone().unwrap_or_default(),
        target_path: req.target_path.clone(),
        volume_capability: Some(capability_in(&req.capability)?),
        readonly: req.readonly,
        node_publish_secrets: req.secrets.to_proto(),
        volume_attributes: map_in(&req.volume_context),
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
