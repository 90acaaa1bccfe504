//! Error codes and idempotency of every RPC, capacity accounting, pagination and imports,
//! against the real binary over its socket.

// An integration test crate is test code throughout: helpers fail by panicking, and the
// tests need no `mod tests` wrapper (the lint targets test code hidden in src/).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::tests_outside_test_module
)]

mod common;

use common::*;
use slrp_proto::csi::v1;
use tonic::Code;

#[tokio::test]
async fn identity_and_capabilities() {
    let p = TestPlugin::start(&[]).await;
    let mut c = p.v1().await;
    let info = c
        .identity
        .get_plugin_info(v1::GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "slrp-csi-local.slrp.io");
    assert!(!info.vendor_version.is_empty());
    let probe = c
        .identity
        .probe(v1::ProbeRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(true));
    let caps = c
        .identity
        .get_plugin_capabilities(v1::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(caps.capabilities.len(), 2);
    let ctrl: Vec<i32> = c
        .controller
        .controller_get_capabilities(v1::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities
        .into_iter()
        .filter_map(|c| {
            c.r#type
                .map(|v1::controller_service_capability::Type::Rpc(r)| r.r#type)
        })
        .collect();
    use v1::controller_service_capability::rpc::Type as C;
    assert_eq!(
        ctrl,
        [
            C::CreateDeleteVolume,
            C::ListVolumes,
            C::GetCapacity,
            C::ExpandVolume,
            C::GetVolume,
            C::VolumeCondition,
            C::CreateDeleteSnapshot,
            C::ListSnapshots,
            C::GetSnapshot,
            C::CloneVolume,
            C::SingleNodeMultiWriter,
        ]
        .map(|t| t as i32)
    );
    let node: Vec<i32> = c
        .node
        .node_get_capabilities(v1::NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities
        .into_iter()
        .filter_map(|c| {
            c.r#type
                .map(|v1::node_service_capability::Type::Rpc(r)| r.r#type)
        })
        .collect();
    use v1::node_service_capability::rpc::Type as N;
    assert_eq!(
        node,
        [
            N::StageUnstageVolume,
            N::GetVolumeStats,
            N::ExpandVolume,
            N::VolumeCondition,
            N::SingleNodeMultiWriter,
        ]
        .map(|t| t as i32)
    );
    let ni = c
        .node
        .node_get_info(v1::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ni.node_id, "test-node");
    assert_code(
        c.controller
            .controller_publish_volume(v1::ControllerPublishVolumeRequest::default())
            .await,
        Code::Unimplemented,
    );
    // Snapshots are served: an empty request is malformed, not unimplemented.
    assert_code(
        c.controller
            .create_snapshot(v1::CreateSnapshotRequest::default())
            .await,
        Code::InvalidArgument,
    );
    // A v1 plugin does not answer csi.v0.
    let ch = p.channel().await.unwrap();
    let mut v0 = slrp_proto::csi::v0::identity_client::IdentityClient::new(ch);
    assert_code(
        v0.probe(slrp_proto::csi::v0::ProbeRequest {}).await,
        Code::Unimplemented,
    );
}

#[tokio::test]
async fn controller_error_codes_and_idempotency() {
    let p = TestPlugin::start(&["--pool", "default=1GiB", "--max-volume-size", "512MiB"]).await;
    let mut c = p.v1().await;
    let ctl = &mut c.controller;
    // CreateVolume.
    assert_code(
        ctl.create_volume(create_req("", MIB, mount_cap(""), &[]))
            .await,
        Code::InvalidArgument,
    );
    let mut no_caps = create_req("a", MIB, mount_cap(""), &[]);
    no_caps.volume_capabilities.clear();
    assert_code(ctl.create_volume(no_caps).await, Code::InvalidArgument);
    let mut no_mode = create_req("a", MIB, mount_cap(""), &[]);
    no_mode.volume_capabilities[0].access_mode = None;
    assert_code(ctl.create_volume(no_mode).await, Code::InvalidArgument);
    let mut multi = create_req("a", MIB, mount_cap(""), &[]);
    multi.volume_capabilities[0].access_mode = Some(v1::volume_capability::AccessMode {
        mode: v1::volume_capability::access_mode::Mode::MultiNodeMultiWriter as i32,
    });
    assert_code(ctl.create_volume(multi).await, Code::InvalidArgument);
    assert_code(
        ctl.create_volume(create_req(
            "a",
            MIB,
            mount_cap("ext4"),
            &[("backend", "dir")],
        ))
        .await,
        Code::InvalidArgument,
    );
    assert_code(
        ctl.create_volume(create_req("a", MIB, mount_cap(""), &[("pool", "nope")]))
            .await,
        Code::InvalidArgument,
    );
    assert_code(
        ctl.create_volume(create_req("a", 600 * MIB, mount_cap(""), &[]))
            .await,
        Code::OutOfRange,
    );
    let mut src = create_req("a", MIB, mount_cap(""), &[]);
    src.volume_content_source = Some(v1::VolumeContentSource {
        r#type: Some(v1::volume_content_source::Type::Snapshot(
            v1::volume_content_source::SnapshotSource {
                snapshot_id: "s".into(),
            },
        )),
    });
    assert_code(ctl.create_volume(src.clone()).await, Code::NotFound);
    src.volume_content_source = Some(v1::VolumeContentSource { r#type: None });
    assert_code(ctl.create_volume(src).await, Code::InvalidArgument);
    let a = ctl
        .create_volume(create_req("a", 10 * MIB, mount_cap(""), &[]))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let again = ctl
        .create_volume(create_req("a", 10 * MIB, mount_cap(""), &[]))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(a, again);
    assert_code(
        ctl.create_volume(create_req("a", 20 * MIB, mount_cap(""), &[]))
            .await,
        Code::AlreadyExists,
    );
    assert_code(
        ctl.create_volume(create_req("a", 10 * MIB, block_cap(), &[]))
            .await,
        Code::AlreadyExists,
    );
    // A name as long as csi-sanity's maximum works; names never reach paths.
    let long = format!("../{}", "n".repeat(125));
    ctl.create_volume(create_req(&long, MIB, mount_cap(""), &[]))
        .await
        .unwrap();

    // DeleteVolume.
    assert_code(
        ctl.delete_volume(v1::DeleteVolumeRequest::default()).await,
        Code::InvalidArgument,
    );
    for unknown in ["vol-0000", "../../etc", "import-dir-nothing"] {
        ctl.delete_volume(v1::DeleteVolumeRequest {
            volume_id: unknown.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    }

    // ValidateVolumeCapabilities.
    let validate =
        |id: &str, caps: Vec<v1::VolumeCapability>| v1::ValidateVolumeCapabilitiesRequest {
            volume_id: id.into(),
            volume_capabilities: caps,
            ..Default::default()
        };
    assert_code(
        ctl.validate_volume_capabilities(validate("", vec![mount_cap("")]))
            .await,
        Code::InvalidArgument,
    );
    assert_code(
        ctl.validate_volume_capabilities(validate(&a.volume_id, vec![]))
            .await,
        Code::InvalidArgument,
    );
    assert_code(
        ctl.validate_volume_capabilities(validate("vol-nope", vec![mount_cap("")]))
            .await,
        Code::NotFound,
    );
    let ok = ctl
        .validate_volume_capabilities(validate(&a.volume_id, vec![mount_cap("")]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        ok.confirmed.unwrap().volume_capabilities,
        vec![mount_cap("")]
    );
    let no = ctl
        .validate_volume_capabilities(validate(&a.volume_id, vec![block_cap()]))
        .await
        .unwrap()
        .into_inner();
    assert!(no.confirmed.is_none() && !no.message.is_empty());

    // ListVolumes.
    assert_code(
        ctl.list_volumes(v1::ListVolumesRequest {
            max_entries: 0,
            starting_token: "invalid-token".into(),
        })
        .await,
        Code::Aborted,
    );
    assert_code(
        ctl.list_volumes(v1::ListVolumesRequest {
            max_entries: -1,
            starting_token: String::new(),
        })
        .await,
        Code::InvalidArgument,
    );

    // ControllerExpandVolume.
    let expand = |id: &str, bytes: Option<i64>| v1::ControllerExpandVolumeRequest {
        volume_id: id.into(),
        capacity_range: bytes.map(|b| v1::CapacityRange {
            required_bytes: b,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    assert_code(
        ctl.controller_expand_volume(expand("", Some(MIB))).await,
        Code::InvalidArgument,
    );
    assert_code(
        ctl.controller_expand_volume(expand(&a.volume_id, None))
            .await,
        Code::InvalidArgument,
    );
    assert_code(
        ctl.controller_expand_volume(expand("vol-nope", Some(MIB)))
            .await,
        Code::NotFound,
    );
    assert_code(
        ctl.controller_expand_volume(expand(&a.volume_id, Some(513 * MIB)))
            .await,
        Code::OutOfRange,
    );
    let grown = ctl
        .controller_expand_volume(expand(&a.volume_id, Some(20 * MIB)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grown.capacity_bytes, 20 * MIB);
    assert!(
        !grown.node_expansion_required,
        "dir volumes need no node step"
    );
    // Repeating or asking for less is a no-op, never a shrink.
    let same = ctl
        .controller_expand_volume(expand(&a.volume_id, Some(5 * MIB)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(same.capacity_bytes, 20 * MIB);
}

#[tokio::test]
async fn node_error_codes() {
    let p = TestPlugin::start(&[]).await;
    let mut c = p.v1().await;
    let vol = c
        .controller
        .create_volume(create_req("n", MIB, mount_cap(""), &[]))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let id = vol.volume_id.clone();
    let staging = p.path_str("staging");
    let target = p.path_str("target");
    let stage =
        |id: &str, path: &str, cap: Option<v1::VolumeCapability>| v1::NodeStageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: path.into(),
            volume_capability: cap,
            ..Default::default()
        };
    let n = &mut c.node;
    assert_code(
        n.node_stage_volume(stage("", &staging, Some(mount_cap(""))))
            .await,
        Code::InvalidArgument,
    );
    assert_code(
        n.node_stage_volume(stage(&id, "", Some(mount_cap(""))))
            .await,
        Code::InvalidArgument,
    );
    assert_code(
        n.node_stage_volume(stage(&id, &staging, None)).await,
        Code::InvalidArgument,
    );
    assert_code(
        n.node_stage_volume(stage(&id, "/tmp/../etc", Some(mount_cap(""))))
            .await,
        Code::InvalidArgument,
    );
    assert_code(
        n.node_stage_volume(stage("vol-nope", &staging, Some(mount_cap(""))))
            .await,
        Code::NotFound,
    );
    assert_code(
        n.node_stage_volume(stage("../../etc", &staging, Some(mount_cap(""))))
            .await,
        Code::NotFound,
    );
    // A dir volume cannot be used as a block device.
    assert_code(
        n.node_stage_volume(stage(&id, &staging, Some(block_cap())))
            .await,
        Code::FailedPrecondition,
    );

    let publish = |id: &str, staging: &str, target: &str, cap: Option<v1::VolumeCapability>| {
        v1::NodePublishVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.into(),
            target_path: target.into(),
            volume_capability: cap,
            ..Default::default()
        }
    };
    assert_code(
        n.node_publish_volume(publish("", &staging, &target, Some(mount_cap(""))))
            .await,
        Code::InvalidArgument,
    );
    assert_code(
        n.node_publish_volume(publish(&id, &staging, "", Some(mount_cap(""))))
            .await,
        Code::InvalidArgument,
    );
    assert_code(
        n.node_publish_volume(publish(&id, &staging, &target, None))
            .await,
        Code::InvalidArgument,
    );
    assert_code(
        n.node_publish_volume(publish(&id, "", &target, Some(mount_cap(""))))
            .await,
        Code::FailedPrecondition,
    );
    assert_code(
        n.node_publish_volume(publish("vol-nope", &staging, &target, Some(mount_cap(""))))
            .await,
        Code::NotFound,
    );
    // Not staged yet.
    assert_code(
        n.node_publish_volume(publish(&id, &staging, &target, Some(mount_cap(""))))
            .await,
        Code::FailedPrecondition,
    );

    let unpublish = |id: &str, t: &str| v1::NodeUnpublishVolumeRequest {
        volume_id: id.into(),
        target_path: t.into(),
    };
    assert_code(
        n.node_unpublish_volume(unpublish("", &target)).await,
        Code::InvalidArgument,
    );
    assert_code(
        n.node_unpublish_volume(unpublish(&id, "")).await,
        Code::InvalidArgument,
    );
    assert_code(
        n.node_unpublish_volume(unpublish("vol-nope", &target))
            .await,
        Code::NotFound,
    );
    n.node_unpublish_volume(unpublish(&id, &target))
        .await
        .unwrap();

    let unstage = |id: &str, s: &str| v1::NodeUnstageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: s.into(),
    };
    assert_code(
        n.node_unstage_volume(unstage("", &staging)).await,
        Code::InvalidArgument,
    );
    assert_code(
        n.node_unstage_volume(unstage(&id, "")).await,
        Code::InvalidArgument,
    );
    assert_code(
        n.node_unstage_volume(unstage("vol-nope", &staging)).await,
        Code::NotFound,
    );
    n.node_unstage_volume(unstage(&id, &staging)).await.unwrap();

    let stats = |id: &str, path: &str| v1::NodeGetVolumeStatsRequest {
        volume_id: id.into(),
        volume_path: path.into(),
        ..Default::default()
    };
    assert_code(
        n.node_get_volume_stats(stats("", &target)).await,
        Code::InvalidArgument,
    );
    assert_code(
        n.node_get_volume_stats(stats(&id, "")).await,
        Code::InvalidArgument,
    );
    assert_code(
        n.node_get_volume_stats(stats("vol-nope", &target)).await,
        Code::NotFound,
    );
    assert_code(
        n.node_get_volume_stats(stats(&id, &target)).await,
        Code::NotFound,
    );

    let expand = |id: &str, path: &str| v1::NodeExpandVolumeRequest {
        volume_id: id.into(),
        volume_path: path.into(),
        ..Default::default()
    };
    assert_code(
        n.node_expand_volume(expand("", &target)).await,
        Code::InvalidArgument,
    );
    assert_code(
        n.node_expand_volume(expand(&id, "")).await,
        Code::InvalidArgument,
    );
    assert_code(
        n.node_expand_volume(expand("vol-nope", &target)).await,
        Code::NotFound,
    );

    if !can_mount("node_error_codes (mounting part)") {
        return;
    }
    n.node_stage_volume(stage(&id, &staging, Some(mount_cap(""))))
        .await
        .unwrap();
    n.node_stage_volume(stage(&id, &staging, Some(mount_cap(""))))
        .await
        .unwrap();
    // Same path, different capability; and a different volume on the same path.
    let mut flags = mount_cap("");
    if let Some(v1::volume_capability::AccessType::Mount(m)) = &mut flags.access_type {
        m.mount_flags = vec!["noatime".into()];
    }
    assert_code(
        n.node_stage_volume(stage(&id, &staging, Some(flags))).await,
        Code::AlreadyExists,
    );
    let other = c
        .controller
        .create_volume(create_req("other", MIB, mount_cap(""), &[]))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let n = &mut c.node;
    assert_code(
        n.node_stage_volume(stage(&other.volume_id, &staging, Some(mount_cap(""))))
            .await,
        Code::AlreadyExists,
    );
    n.node_publish_volume(publish(&id, &staging, &target, Some(mount_cap(""))))
        .await
        .unwrap();
    n.node_publish_volume(publish(&id, &staging, &target, Some(mount_cap(""))))
        .await
        .unwrap();
    let mut ro = publish(&id, &staging, &target, Some(mount_cap("")));
    ro.readonly = true;
    assert_code(n.node_publish_volume(ro).await, Code::AlreadyExists);
    assert_code(
        n.node_publish_volume(publish(
            &id,
            &staging,
            &p.path_str("t2"),
            Some(mount_cap("")),
        ))
        .await,
        Code::FailedPrecondition,
    );
    // Stats of a path the volume is not published at.
    assert_code(
        n.node_get_volume_stats(stats(&id, &p.path_str("t2"))).await,
        Code::NotFound,
    );
    let st = n
        .node_get_volume_stats(stats(&id, &target))
        .await
        .unwrap()
        .into_inner();
    assert!(!st.volume_condition.unwrap().abnormal);
    n.node_unpublish_volume(unpublish(&id, &target))
        .await
        .unwrap();
    n.node_unstage_volume(unstage(&id, &staging)).await.unwrap();
    assert!(p.mounts_here().is_empty());
}

#[tokio::test]
async fn capacity_is_accounted_per_pool() {
    let p = TestPlugin::start(&["--pool", "fast=100MiB", "--pool", "slow=1GiB"]).await;
    let mut c = p.v1().await;
    let ctl = &mut c.controller;
    let cap = |ctl: &mut v1::controller_client::ControllerClient<_>, pool: &str| {
        let req = v1::GetCapacityRequest {
            parameters: [("pool".to_owned(), pool.to_owned())].into(),
            ..Default::default()
        };
        let mut ctl = ctl.clone();
        async move { ctl.get_capacity(req).await.unwrap().into_inner() }
    };
    assert_eq!(cap(ctl, "fast").await.available_capacity, 100 * MIB);
    assert_eq!(cap(ctl, "slow").await.available_capacity, 1024 * MIB);
    assert_eq!(cap(ctl, "missing").await.available_capacity, 0);
    // No `default` pool is configured here, so a create without a pool fails.
    assert_code(
        ctl.create_volume(create_req("x", MIB, mount_cap(""), &[]))
            .await,
        Code::InvalidArgument,
    );
    let mut ids = Vec::new();
    for i in 0..4 {
        let v = ctl
            .create_volume(create_req(
                &format!("f{i}"),
                25 * MIB,
                mount_cap(""),
                &[("pool", "fast")],
            ))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        ids.push(v.volume_id);
    }
    let full = cap(ctl, "fast").await;
    assert_eq!(full.available_capacity, 0);
    assert_eq!(full.maximum_volume_size, Some(0));
    assert_code(
        ctl.create_volume(create_req("f4", MIB, mount_cap(""), &[("pool", "fast")]))
            .await,
        Code::OutOfRange,
    );
    assert_eq!(cap(ctl, "slow").await.available_capacity, 1024 * MIB);
    // Accounting survives a crash.
    let mut p = p;
    p.crash_and_restart().await;
    let mut c = p.v1().await;
    let ctl = &mut c.controller;
    assert_eq!(cap(ctl, "fast").await.available_capacity, 0);
    ctl.delete_volume(v1::DeleteVolumeRequest {
        volume_id: ids[0].clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(cap(ctl, "fast").await.available_capacity, 25 * MIB);
    // Capability-aware: BLOCK volumes cannot come from the dir backend.
    let req = v1::GetCapacityRequest {
        volume_capabilities: vec![block_cap()],
        parameters: [
            ("pool".to_owned(), "slow".to_owned()),
            ("backend".to_owned(), "dir".to_owned()),
        ]
        .into(),
        ..Default::default()
    };
    assert_eq!(
        ctl.get_capacity(req)
            .await
            .unwrap()
            .into_inner()
            .available_capacity,
        0
    );
    let req = v1::GetCapacityRequest {
        parameters: [("backend".to_owned(), "tape".to_owned())].into(),
        ..Default::default()
    };
    assert_code(ctl.get_capacity(req).await, Code::InvalidArgument);
}

#[tokio::test]
async fn pagination_and_imported_volumes() {
    let p = TestPlugin::start(&[]).await;
    let mut c = p.v1().await;
    let mut created = Vec::new();
    for i in 0..5 {
        let v = c
            .controller
            .create_volume(create_req(&format!("p{i}"), MIB, mount_cap(""), &[]))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        created.push(v.volume_id);
    }
    // Operator-placed volumes, including one with a name that cannot be an id.
    std::fs::create_dir_all(p.path("root/import/dir/shared-data")).unwrap();
    std::fs::write(
        p.path("root/import/dir/shared-data/file"),
        b"from the operator",
    )
    .unwrap();
    std::fs::create_dir_all(p.path("root/import/dir/bad name")).unwrap();
    let img = std::fs::File::create(p.path("root/import/loop/disk1.img")).unwrap();
    img.set_len(64 * MIB as u64).unwrap();

    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let page = c
            .controller
            .list_volumes(v1::ListVolumesRequest {
                max_entries: 2,
                starting_token: token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.entries.len() <= 2);
        pages += 1;
        seen.extend(page.entries.into_iter().map(|e| e.volume.unwrap()));
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    assert_eq!(pages, 4);
    let ids: Vec<&str> = seen.iter().map(|v| v.volume_id.as_str()).collect();
    assert_eq!(ids.len(), 7, "{ids:?}");
    assert!(ids.contains(&"import-dir-shared-data"));
    assert!(ids.contains(&"import-loop-disk1"));
    for id in &created {
        assert!(ids.contains(&id.as_str()));
    }
    let disk = seen
        .iter()
        .find(|v| v.volume_id == "import-loop-disk1")
        .unwrap();
    assert_eq!(disk.capacity_bytes, 64 * MIB);

    if !can_mount("pagination_and_imported_volumes (publish part)") {
        return;
    }
    // Imported volumes can be used like created ones; the image gets a file system.
    for (id, file) in [
        ("import-dir-shared-data", Some("file")),
        ("import-loop-disk1", None),
    ] {
        let staging = p.path_str(&format!("s-{id}"));
        let target = p.path_str(&format!("t-{id}"));
        c.node
            .node_stage_volume(v1::NodeStageVolumeRequest {
                volume_id: id.into(),
                staging_target_path: staging.clone(),
                volume_capability: Some(mount_cap("")),
                ..Default::default()
            })
            .await
            .unwrap();
        c.node
            .node_publish_volume(v1::NodePublishVolumeRequest {
                volume_id: id.into(),
                staging_target_path: staging.clone(),
                target_path: target.clone(),
                volume_capability: Some(mount_cap("")),
                ..Default::default()
            })
            .await
            .unwrap();
        if let Some(f) = file {
            assert_eq!(
                std::fs::read(p.path(&format!("t-{id}/{f}"))).unwrap(),
                b"from the operator"
            );
        }
        c.node
            .node_unpublish_volume(v1::NodeUnpublishVolumeRequest {
                volume_id: id.into(),
                target_path: target,
            })
            .await
            .unwrap();
        c.node
            .node_unstage_volume(v1::NodeUnstageVolumeRequest {
                volume_id: id.into(),
                staging_target_path: staging,
            })
            .await
            .unwrap();
    }
    c.controller
        .delete_volume(v1::DeleteVolumeRequest {
            volume_id: "import-loop-disk1".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(!p.path("root/import/loop/disk1.img").exists());
    assert!(p.loops_here().is_empty());
}

#[tokio::test]
async fn second_plugin_on_the_same_root_refuses_to_start() {
    let p = TestPlugin::start(&[]).await;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_slrp-csi-local"))
        .arg("--endpoint")
        .arg(p.path("other.sock"))
        .arg("--root")
        .arg(&p.root)
        .arg("--node-id")
        .arg("n")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("in use by another"), "{stderr}");
    // The first one is unaffected.
    let mut c = p.v1().await;
    c.identity.probe(v1::ProbeRequest {}).await.unwrap();
}

#[tokio::test]
async fn bad_command_line_exits_with_usage_error() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_slrp-csi-local"))
        .args(["--endpoint", "tcp://127.0.0.1:1", "--node-id", "n"])
        .env_remove("CSI_ENDPOINT")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("endpoint"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_slrp-csi-local"))
        .args([
            "--endpoint",
            "/tmp/x.sock",
            "--node-id",
            "n",
            "--pool",
            "a=lots",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("lots"));
}

#[tokio::test]
async fn sigterm_shuts_down_cleanly_and_removes_the_socket() {
    let mut p = TestPlugin::start(&[]).await;
    let pid = p.child.as_ref().unwrap().id();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = p.wait_exit().await;
    assert!(status.success(), "{status}");
    assert!(!p.socket.exists());
}

#[tokio::test]
async fn endpoint_from_environment_and_stale_socket() {
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let sock = dir.path().join("env.sock");
    // A stale socket from a previous run.
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_slrp-csi-local"))
        .env("CSI_ENDPOINT", &sock) // bare path, no unix://
        .env("SLRP_CSI_LOCAL_ROOT", dir.path().join("root"))
        .arg("--node-id")
        .arg("n")
        .spawn()
        .unwrap();
    let mut ok = false;
    for _ in 0..200 {
        if let Ok(ch) =
            tonic::transport::Endpoint::from_shared(format!("unix://{}", sock.display()))
                .unwrap()
                .connect()
                .await
            && v1::identity_client::IdentityClient::new(ch)
                .probe(v1::ProbeRequest {})
                .await
                .is_ok()
        {
            ok = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(ok, "plugin did not serve on the CSI_ENDPOINT socket");
}

#[tokio::test]
async fn concurrent_creates_never_oversubscribe_a_pool() {
    let p = TestPlugin::start(&["--pool", "default=100MiB"]).await;
    let c = p.v1().await;
    let mut tasks = Vec::new();
    for i in 0..8 {
        let mut ctl = c.controller.clone();
        // Half the requests share a name: they must all get the same volume.
        let name = if i % 2 == 0 {
            "same".to_owned()
        } else {
            format!("n{i}")
        };
        tasks.push(tokio::spawn(async move {
            ctl.create_volume(create_req(&name, 30 * MIB, mount_cap(""), &[]))
                .await
                .map(|r| (name, r.into_inner().volume.unwrap().volume_id))
        }));
    }
    let mut ok = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok(v) => ok.push(v),
            Err(s) => assert_eq!(s.code(), Code::OutOfRange, "{s:?}"),
        }
    }
    let same: std::collections::BTreeSet<_> = ok
        .iter()
        .filter(|(n, _)| n == "same")
        .map(|(_, id)| id.clone())
        .collect();
    // "same" may have lost the race for space, but never got two volumes.
    assert!(same.len() <= 1, "one name, one volume: {same:?}");
    let distinct: std::collections::BTreeSet<_> = ok.iter().map(|(_, id)| id).collect();
    assert_eq!(
        distinct.len(),
        3,
        "100 MiB holds exactly three 30 MiB volumes"
    );
}

async fn available(p: &TestPlugin) -> i64 {
    v1::controller_client::ControllerClient::new(p.channel().await.unwrap())
        .get_capacity(v1::GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner()
        .available_capacity
}

/// Without `--pool`, the default pool is as large as the file system under the root, and
/// data written into a volume does not shrink it at the next start. The root is a tmpfs
/// of known size.
#[tokio::test]
async fn default_pool_is_the_root_file_system_and_keeps_its_size_across_restarts() {
    if !can_mount("default_pool_is_the_root_file_system_and_keeps_its_size_across_restarts") {
        return;
    }
    let mut p = TestPlugin::prepare(None, &[], &[], false);
    p.faults_flag = false;
    std::fs::create_dir_all(&p.root).unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        &p.root,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=256m"),
    )
    .unwrap();
    p.spawn().await;
    let before = available(&p).await;
    assert_eq!(before, 256 * MIB);
    let mut c = p.v1().await;
    let v = c
        .controller
        .create_volume(create_req("data", 64 * MIB, mount_cap(""), &[]))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    // 32 MiB of data written into the directory volume.
    let backing = p.root.join("volumes/dir").join(&v.volume_id).join("data");
    std::fs::write(&backing, vec![7u8; 32 << 20]).unwrap();
    let accounted = before - 64 * MIB;
    assert!(available(&p).await.abs_diff(accounted) < MIB.unsigned_abs());
    drop(c);
    p.crash_and_restart().await;
    let after = available(&p).await;
    // Free space alone would give 32 MiB less.
    assert!(
        after.abs_diff(accounted) < MIB.unsigned_abs(),
        "{after} vs {accounted}"
    );
}
