//! The v0 service's csi-sanity cases.

use super::*;

/// The v0 service (CSI 0.2/0.3, as Mesos calls it): csi-sanity's required-field and
/// error-code cases as they apply to v0, which has NodeGetId, `supported` instead of
/// `confirmed`, and no expansion or stats.
#[tokio::test]
#[allow(deprecated)] // NodeGetId is deprecated in CSI 0.3 but is what 0.2 clients call.
async fn sanity_v0_required_fields_and_codes() {
    let p = TestPlugin::start(&["--csi-version", "v0"]).await;
    let mut c = p.v0().await;
    let info = c
        .identity
        .get_plugin_info(v0::GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(sanity_name_ok(&info.name), "{}", info.name);
    assert!(
        !c.node
            .node_get_id(v0::NodeGetIdRequest {})
            .await
            .unwrap()
            .into_inner()
            .node_id
            .is_empty()
    );
    let caps: HashSet<i32> = c
        .node
        .node_get_capabilities(v0::NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities
        .into_iter()
        .filter_map(|c| c.r#type)
        .map(|v0::node_service_capability::Type::Rpc(r)| r.r#type)
        .collect();
    assert_eq!(
        caps,
        HashSet::from([v0::node_service_capability::rpc::Type::StageUnstageVolume as i32])
    );
    let ctl = &mut c.controller;
    code_is(
        ctl.create_volume(v0::CreateVolumeRequest::default()).await,
        Code::InvalidArgument,
    );
    code_is(
        ctl.create_volume(v0::CreateVolumeRequest {
            name: "no-caps".into(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
    );
    code_is(
        ctl.create_volume(v0::CreateVolumeRequest {
            name: "ctl\u{1}char".into(),
            volume_capabilities: vec![v0_cap()],
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
    );
    let v = ctl
        .create_volume(v0::CreateVolumeRequest {
            name: "v0".into(),
            volume_capabilities: vec![v0_cap()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    code_is(
        ctl.delete_volume(v0::DeleteVolumeRequest::default()).await,
        Code::InvalidArgument,
    );
    ctl.delete_volume(v0::DeleteVolumeRequest {
        volume_id: "fake-vol-id".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    code_is(
        ctl.validate_volume_capabilities(v0::ValidateVolumeCapabilitiesRequest::default())
            .await,
        Code::InvalidArgument,
    );
    code_is(
        ctl.validate_volume_capabilities(v0::ValidateVolumeCapabilitiesRequest {
            volume_id: v.id.clone(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
    );
    code_is(
        ctl.validate_volume_capabilities(v0::ValidateVolumeCapabilitiesRequest {
            volume_id: "fake-vol-id-0123456789".into(),
            volume_capabilities: vec![v0_cap()],
            ..Default::default()
        })
        .await,
        Code::NotFound,
    );
    code_is(
        ctl.list_volumes(v0::ListVolumesRequest {
            max_entries: 0,
            starting_token: "invalid-token".into(),
        })
        .await,
        Code::Aborted,
    );
    let n = &mut c.node;
    let staging = p.path_str("staging");
    let target = p.path_str("target");
    code_is(
        n.node_stage_volume(v0::NodeStageVolumeRequest {
            staging_target_path: staging.clone(),
            volume_capability: Some(v0_cap()),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
    );
    code_is(
        n.node_stage_volume(v0::NodeStageVolumeRequest {
            volume_id: v.id.clone(),
            volume_capability: Some(v0_cap()),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
    );
    code_is(
        n.node_stage_volume(v0::NodeStageVolumeRequest {
            volume_id: v.id.clone(),
            staging_target_path: staging.clone(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
    );
    code_is(
        n.node_publish_volume(v0::NodePublishVolumeRequest::default())
            .await,
        Code::InvalidArgument,
    );
    code_is(
        n.node_publish_volume(v0::NodePublishVolumeRequest {
            volume_id: v.id.clone(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
    );
    code_is(
        n.node_publish_volume(v0::NodePublishVolumeRequest {
            volume_id: v.id.clone(),
            target_path: target.clone(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
    );
    code_is(
        n.node_unpublish_volume(v0::NodeUnpublishVolumeRequest::default())
            .await,
        Code::InvalidArgument,
    );
    code_is(
        n.node_unpublish_volume(v0::NodeUnpublishVolumeRequest {
            volume_id: v.id.clone(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
    );
    code_is(
        n.node_unpublish_volume(v0::NodeUnpublishVolumeRequest {
            volume_id: "fake-vol-id-0123456789".into(),
            target_path: target.clone(),
        })
        .await,
        Code::NotFound,
    );
    code_is(
        n.node_unstage_volume(v0::NodeUnstageVolumeRequest {
            staging_target_path: staging.clone(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
    );
    code_is(
        n.node_unstage_volume(v0::NodeUnstageVolumeRequest {
            volume_id: v.id.clone(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
    );
    code_is(
        n.node_unstage_volume(v0::NodeUnstageVolumeRequest {
            volume_id: "fake-vol-id-0123456789".into(),
            staging_target_path: staging,
        })
        .await,
        Code::NotFound,
    );
}
