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

/// CSI 0.3 snapshots through the v0 service: CREATE_DELETE_SNAPSHOT and LIST_SNAPSHOTS
/// advertised, CreateSnapshot (READY, `created_at` in nanoseconds), ListSnapshots by id
/// and by source with tokens, CreateVolume from the snapshot, DeleteSnapshot, and the
/// error codes of the v1 cases.
#[tokio::test]
async fn sanity_v0_snapshots_and_restore() {
    use v0::controller_service_capability::{Type, rpc::Type as T};
    let p = TestPlugin::start(&["--csi-version", "v0"]).await;
    let mut c = p.v0().await;
    let ctl = &mut c.controller;
    let caps: HashSet<i32> = ctl
        .controller_get_capabilities(v0::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities
        .into_iter()
        .filter_map(|c| c.r#type)
        .map(|Type::Rpc(r)| r.r#type)
        .collect();
    for t in [T::CreateDeleteSnapshot, T::ListSnapshots] {
        assert!(caps.contains(&(t as i32)), "{t:?} not advertised");
    }
    let vol = |name: &str| v0::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(v0::CapacityRange {
            required_bytes: MIB,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![v0_cap()],
        ..Default::default()
    };
    let a = ctl
        .create_volume(vol("a"))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let b = ctl
        .create_volume(vol("b"))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let snap = |name: &str, source: &str| v0::CreateSnapshotRequest {
        name: name.into(),
        source_volume_id: source.into(),
        ..Default::default()
    };
    let s = ctl
        .create_snapshot(snap("s", &a.id))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert!(s.id.starts_with("snap-"), "{s:?}");
    assert_eq!(
        (s.source_volume_id.as_str(), s.size_bytes),
        (a.id.as_str(), MIB)
    );
    // Nanoseconds since the epoch: later than 2020-01-01 in nanoseconds.
    assert!(s.created_at > 1_577_836_800_000_000_000, "{s:?}");
    assert_eq!(
        s.status.as_ref().unwrap().r#type,
        v0::snapshot_status::Type::Ready as i32
    );
    let again = ctl
        .create_snapshot(snap("s", &a.id))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.snapshot.unwrap(), s);
    code_is(
        ctl.create_snapshot(snap("s", &b.id)).await,
        Code::AlreadyExists,
    );
    code_is(
        ctl.create_snapshot(snap("", &a.id)).await,
        Code::InvalidArgument,
    );
    code_is(
        ctl.create_snapshot(snap("n", "")).await,
        Code::InvalidArgument,
    );
    code_is(
        ctl.create_snapshot(snap("n", "vol-nope")).await,
        Code::NotFound,
    );
    let t = ctl
        .create_snapshot(snap("t", &b.id))
        .await
        .unwrap()
        .into_inner();
    let t = t.snapshot.unwrap();

    let list = |max_entries, token: &str, source: &str, id: &str| v0::ListSnapshotsRequest {
        max_entries,
        starting_token: token.into(),
        source_volume_id: source.into(),
        snapshot_id: id.into(),
    };
    let ids = |r: v0::ListSnapshotsResponse| {
        r.entries
            .into_iter()
            .map(|e| e.snapshot.unwrap().id)
            .collect::<Vec<_>>()
    };
    let by_id = ctl.list_snapshots(list(0, "", "", &t.id)).await.unwrap();
    assert_eq!(ids(by_id.into_inner()), std::slice::from_ref(&t.id));
    let by_source = ctl.list_snapshots(list(0, "", &a.id, "")).await.unwrap();
    assert_eq!(ids(by_source.into_inner()), std::slice::from_ref(&s.id));
    let first = ctl
        .list_snapshots(list(1, "", "", ""))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.entries.len(), 1);
    let rest = ctl
        .list_snapshots(list(0, &first.next_token, "", ""))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rest.entries.len(), 1);
    code_is(
        ctl.list_snapshots(list(0, "invalid-token", "", "")).await,
        Code::Aborted,
    );

    let mut restore = vol("r");
    restore.volume_content_source = Some(v0::VolumeContentSource {
        r#type: Some(v0::volume_content_source::Type::Snapshot(
            v0::volume_content_source::SnapshotSource { id: s.id.clone() },
        )),
    });
    let r = ctl
        .create_volume(restore.clone())
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(r.content_source, restore.volume_content_source);
    restore.name = "r2".into();
    restore.volume_content_source = Some(v0::VolumeContentSource {
        r#type: Some(v0::volume_content_source::Type::Snapshot(
            v0::volume_content_source::SnapshotSource {
                id: "snap-none".into(),
            },
        )),
    });
    code_is(ctl.create_volume(restore).await, Code::NotFound);

    for id in [&s.id, &t.id, &s.id] {
        ctl.delete_snapshot(v0::DeleteSnapshotRequest {
            snapshot_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    code_is(
        ctl.delete_snapshot(v0::DeleteSnapshotRequest::default())
            .await,
        Code::InvalidArgument,
    );
    assert!(
        ids(ctl
            .list_snapshots(list(0, "", "", ""))
            .await
            .unwrap()
            .into_inner())
        .is_empty()
    );
}
