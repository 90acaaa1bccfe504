//! csi-sanity's Controller Service and ExpandVolume [Controller Server] cases.

use super::*;

// ===================== Controller Service =====================

/// Controller Service / ControllerGetCapabilities / should return appropriate capabilities.
#[tokio::test]
async fn sanity_controller_get_capabilities() {
    let s = Sanity::start().await;
    let res =
        s.c.controller
            .clone()
            .controller_get_capabilities(v1::ControllerGetCapabilitiesRequest {})
            .await
            .unwrap()
            .into_inner();
    assert!(!res.capabilities.is_empty());
    for cap in res.capabilities {
        let Some(v1::controller_service_capability::Type::Rpc(rpc)) = cap.r#type else {
            panic!("capability without an rpc");
        };
        let t = v1::controller_service_capability::rpc::Type::try_from(rpc.r#type);
        assert!(
            t.is_ok_and(|t| t != v1::controller_service_capability::rpc::Type::Unknown),
            "unknown capability {}",
            rpc.r#type
        );
    }
    s.cleanup().await;
}

/// Controller Service / GetCapacity / should return capacity (no optional values added).
#[tokio::test]
async fn sanity_get_capacity_no_optional_values() {
    let s = Sanity::start().await;
    let res =
        s.c.controller
            .clone()
            .get_capacity(v1::GetCapacityRequest::default())
            .await
            .unwrap()
            .into_inner();
    assert!(res.available_capacity >= 0);
    assert!(res.maximum_volume_size.unwrap_or(0) >= 0);
    assert!(res.minimum_volume_size.unwrap_or(0) >= 0);
    s.cleanup().await;
}

/// Controller Service / ListVolumes / should return appropriate values (no optional values
/// added).
#[tokio::test]
async fn sanity_list_volumes_no_optional_values() {
    let mut s = Sanity::start().await;
    s.must_create("sanity-list").await;
    let res =
        s.c.controller
            .list_volumes(v1::ListVolumesRequest::default())
            .await
            .unwrap()
            .into_inner();
    assert_eq!(res.entries.len(), 1);
    for e in &res.entries {
        assert!(!e.volume.as_ref().unwrap().volume_id.is_empty());
    }
    assert!(res.next_token.is_empty());
    s.cleanup().await;
}

/// Controller Service / ListVolumes / should fail when an invalid starting_token is passed.
#[tokio::test]
async fn sanity_list_volumes_invalid_starting_token() {
    let mut s = Sanity::start().await;
    code_is(
        s.c.controller
            .list_volumes(v1::ListVolumesRequest {
                max_entries: 0,
                starting_token: "invalid-token".into(),
            })
            .await,
        Code::Aborted,
    );
    s.cleanup().await;
}

async fn list_ids(s: &mut Sanity, max_entries: i32, token: &str) -> (Vec<String>, String) {
    let res =
        s.c.controller
            .list_volumes(v1::ListVolumesRequest {
                max_entries,
                starting_token: token.into(),
            })
            .await
            .unwrap()
            .into_inner();
    (
        res.entries
            .into_iter()
            .map(|e| e.volume.unwrap().volume_id)
            .collect(),
        res.next_token,
    )
}

/// Controller Service / ListVolumes / check the presence of new volumes and absence of
/// deleted ones in the volume list.
#[tokio::test]
async fn sanity_list_volumes_new_present_deleted_absent() {
    let mut s = Sanity::start().await;
    let before = list_ids(&mut s, 0, "").await.0.len();
    let v = s.must_create("sanity").await;
    assert_eq!(list_ids(&mut s, 0, "").await.0.len(), before + 1);
    s.c.controller
        .delete_volume(v1::DeleteVolumeRequest {
            volume_id: v.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(list_ids(&mut s, 0, "").await.0.len(), before);
    s.cleanup().await;
}

/// Controller Service / ListVolumes / pagination should detect volumes added between pages
/// and accept tokens when the last volume from a page is deleted (an `XIt`, disabled
/// upstream as fragile; checked here all the same).
#[tokio::test]
async fn sanity_list_volumes_pagination_survives_changes_between_pages() {
    let mut s = Sanity::start().await;
    let mut existing: HashMap<String, bool> = HashMap::new();
    for i in 0..3 {
        let v = s.must_create(&format!("sanity{i}")).await;
        existing.insert(v.volume_id, true);
    }
    let (page, token) = list_ids(&mut s, 2, "").await;
    assert_eq!(page.len(), 2);
    assert!(!token.is_empty());
    for id in &page {
        assert!(existing[id]);
        s.c.controller
            .delete_volume(v1::DeleteVolumeRequest {
                volume_id: id.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        existing.insert(id.clone(), false);
    }
    let new = s.must_create("new-addition").await;
    existing.insert(new.volume_id, true);
    let (rest, _) = list_ids(&mut s, 0, &token).await;
    assert!(rest.len() <= 3 - 2 + 1, "{rest:?}");
    for id in rest {
        assert!(existing[&id], "{id} listed but deleted, or listed twice");
        existing.insert(id, false);
    }
    s.cleanup().await;
}

/// Controller Service / CreateVolume / should fail when no name is provided.
#[tokio::test]
async fn sanity_create_volume_no_name() {
    let mut s = Sanity::start().await;
    code_is(
        s.c.controller
            .create_volume(v1::CreateVolumeRequest::default())
            .await,
        Code::InvalidArgument,
    );
    s.cleanup().await;
}

/// Controller Service / CreateVolume / should fail when no volume capabilities are provided.
#[tokio::test]
async fn sanity_create_volume_no_capabilities() {
    let mut s = Sanity::start().await;
    code_is(
        s.c.controller
            .create_volume(v1::CreateVolumeRequest {
                name: "sanity-controller-create-no-volume-capabilities".into(),
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
    );
    s.cleanup().await;
}

/// Controller Service / CreateVolume / should return appropriate values SingleNodeWriter
/// NoCapacity (csi-sanity keeps the capacity; the spec's no-range case is checked too).
#[tokio::test]
async fn sanity_create_volume_single_node_writer_no_capacity() {
    let mut s = Sanity::start().await;
    s.must_create("sanity-controller-create-single-no-capacity")
        .await;
    let mut no_range = s.create_req("no-range");
    no_range.capacity_range = None;
    let v = s.create(no_range).await.unwrap();
    assert!(v.capacity_bytes > 0);
    s.cleanup().await;
}

/// Controller Service / CreateVolume / should return appropriate values SingleNodeWriter
/// WithCapacity 1Gi.
#[tokio::test]
async fn sanity_create_volume_single_node_writer_with_capacity() {
    let mut s = Sanity::start().await;
    let v = s
        .must_create("sanity-controller-create-single-with-capacity")
        .await;
    assert!(!v.volume_id.is_empty());
    assert!(v.capacity_bytes >= SIZE);
    s.cleanup().await;
}

/// Controller Service / CreateVolume / should not fail when requesting to create a volume
/// with already existing name and same capacity.
#[tokio::test]
async fn sanity_create_volume_same_name_same_capacity() {
    let mut s = Sanity::start().await;
    let a = s.must_create("sanity-controller-create-twice").await;
    let b = s.must_create("sanity-controller-create-twice").await;
    assert!(a.capacity_bytes >= SIZE && b.capacity_bytes >= SIZE);
    assert_eq!(a.volume_id, b.volume_id);
    assert_eq!(s.created.len(), 1);
    s.cleanup().await;
}

/// Controller Service / CreateVolume / should fail when requesting to create a volume with
/// already existing name and different capacity.
#[tokio::test]
async fn sanity_create_volume_same_name_different_capacity() {
    let mut s = Sanity::start().await;
    let name = "sanity-controller-create-twice-different";
    let mut r1 = s.create_req(name);
    r1.capacity_range = Some(v1::CapacityRange {
        required_bytes: SIZE,
        limit_bytes: SIZE,
    });
    let v = s.create(r1).await.unwrap();
    assert_eq!(v.capacity_bytes, SIZE);
    let mut r2 = s.create_req(name);
    r2.capacity_range = Some(v1::CapacityRange {
        required_bytes: 2 * SIZE,
        limit_bytes: 2 * SIZE,
    });
    code_is(s.create(r2).await, Code::AlreadyExists);
    s.cleanup().await;
}

/// Controller Service / CreateVolume / should not fail when creating volume with
/// maximum-length name.
#[tokio::test]
async fn sanity_create_volume_maximum_length_name() {
    let mut s = Sanity::start().await;
    let prefix = "sanity-controller-create-maxlen";
    let name = format!("{prefix}{}", "x".repeat(MAX_NAME_LENGTH - prefix.len()));
    assert_eq!(name.len(), MAX_NAME_LENGTH);
    let v = s.must_create(&name).await;
    assert!(v.capacity_bytes >= SIZE);
    s.cleanup().await;
}

/// Controller Service / DeleteVolume / should fail when no volume id is provided.
#[tokio::test]
async fn sanity_delete_volume_no_id() {
    let mut s = Sanity::start().await;
    code_is(
        s.c.controller
            .delete_volume(v1::DeleteVolumeRequest::default())
            .await,
        Code::InvalidArgument,
    );
    s.cleanup().await;
}

/// Controller Service / DeleteVolume / should succeed when an invalid volume id is used.
#[tokio::test]
async fn sanity_delete_volume_invalid_id() {
    let mut s = Sanity::start().await;
    for id in ["fake-vol-id", "../../etc/passwd", "vol-with spaces"] {
        s.c.controller
            .delete_volume(v1::DeleteVolumeRequest {
                volume_id: id.into(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    s.cleanup().await;
}

/// Controller Service / DeleteVolume / should return appropriate values (no optional values
/// added).
#[tokio::test]
async fn sanity_delete_volume_appropriate_values() {
    let mut s = Sanity::start().await;
    let v = s.must_create("sanity-controller-create-appropriate").await;
    s.c.controller
        .delete_volume(v1::DeleteVolumeRequest {
            volume_id: v.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    // Idempotent: deleting again is OK.
    s.c.controller
        .delete_volume(v1::DeleteVolumeRequest {
            volume_id: v.volume_id,
            ..Default::default()
        })
        .await
        .unwrap();
    s.cleanup().await;
}

/// Controller Service / ValidateVolumeCapabilities / should fail when no volume id is
/// provided.
#[tokio::test]
async fn sanity_validate_no_volume_id() {
    let mut s = Sanity::start().await;
    code_is(
        s.c.controller
            .validate_volume_capabilities(v1::ValidateVolumeCapabilitiesRequest::default())
            .await,
        Code::InvalidArgument,
    );
    s.cleanup().await;
}

/// Controller Service / ValidateVolumeCapabilities / should fail when no volume
/// capabilities are provided.
#[tokio::test]
async fn sanity_validate_no_capabilities() {
    let mut s = Sanity::start().await;
    let v = s.must_create("sanity-controller-validate-nocaps").await;
    code_is(
        s.c.controller
            .validate_volume_capabilities(v1::ValidateVolumeCapabilitiesRequest {
                volume_id: v.volume_id,
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
    );
    s.cleanup().await;
}

/// Controller Service / ValidateVolumeCapabilities / should return appropriate values (no
/// optional values added).
#[tokio::test]
async fn sanity_validate_appropriate_values() {
    let mut s = Sanity::start().await;
    let v = s.must_create("sanity-controller-validate").await;
    let res =
        s.c.controller
            .validate_volume_capabilities(v1::ValidateVolumeCapabilitiesRequest {
                volume_id: v.volume_id,
                volume_capabilities: vec![s.snw()],
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
    let confirmed = res.confirmed.expect("a supported capability is confirmed");
    assert_eq!(confirmed.volume_capabilities, vec![s.snw()]);
    s.cleanup().await;
}

/// Controller Service / ValidateVolumeCapabilities / should fail when the requested volume
/// does not exist.
#[tokio::test]
async fn sanity_validate_volume_does_not_exist() {
    let mut s = Sanity::start().await;
    let req = v1::ValidateVolumeCapabilitiesRequest {
        volume_id: "fake-vol-id-0123456789".into(),
        volume_capabilities: vec![s.snw()],
        ..Default::default()
    };
    code_is(
        s.c.controller.validate_volume_capabilities(req).await,
        Code::NotFound,
    );
    s.cleanup().await;
}

// ===================== ExpandVolume [Controller Server] =====================

/// ExpandVolume / should fail if no volume id is given.
#[tokio::test]
async fn sanity_controller_expand_no_volume_id() {
    let mut s = Sanity::start().await;
    let req = v1::ControllerExpandVolumeRequest {
        capacity_range: Some(v1::CapacityRange {
            required_bytes: EXPAND_SIZE,
            limit_bytes: 0,
        }),
        volume_capability: Some(s.snw()),
        ..Default::default()
    };
    code_is(
        s.c.controller.controller_expand_volume(req).await,
        Code::InvalidArgument,
    );
    s.cleanup().await;
}

/// ExpandVolume / should fail if no capacity range is given.
#[tokio::test]
async fn sanity_controller_expand_no_capacity_range() {
    let mut s = Sanity::start().await;
    code_is(
        s.c.controller
            .controller_expand_volume(v1::ControllerExpandVolumeRequest::default())
            .await,
        Code::InvalidArgument,
    );
    // And with a real volume, so the missing range is what is refused.
    let v = s.must_create("sanity-expand-no-range").await;
    code_is(
        s.c.controller
            .controller_expand_volume(v1::ControllerExpandVolumeRequest {
                volume_id: v.volume_id,
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
    );
    s.cleanup().await;
}

#[tokio::test]
async fn sanity_controller_expand_works() {
    let mut s = Sanity::start().await;
    let v = s.must_create("sanity-expand-volume").await;
    assert_eq!(controller_expand(&mut s, &v, true).await, EXPAND_SIZE);
    // Idempotent (CSI: already as large → OK with the current size).
    assert_eq!(controller_expand(&mut s, &v, true).await, EXPAND_SIZE);
    s.cleanup().await;
}

/// csi-sanity's sizes against a plugin started with default flags only (no `--pool`): a
/// plain 10 GiB CreateVolume, ControllerExpandVolume by 1 GiB, then NodeExpandVolume of the
/// published volume. The default pool must hold them.
#[tokio::test]
async fn sanity_default_flags_fit_the_default_sizes() {
    let mut s = Sanity::start().await;
    let plain = s.must_create("sanity-defaults-plain").await;
    assert_eq!(plain.capacity_bytes, SIZE);
    let v = s.must_create("sanity-defaults-expand").await;
    assert_eq!(controller_expand(&mut s, &v, true).await, EXPAND_SIZE);
    if can_mount("sanity_default_flags_fit_the_default_sizes (node expansion)") {
        s.stage_and_publish(&v).await;
        assert_eq!(node_expand(&mut s, &v).await, EXPAND_SIZE);
    }
    s.cleanup().await;
}

// ===================== GetVolume and VolumeCondition =====================

/// Controller Service / ControllerGetVolume (csi-sanity's `GET_VOLUME` cases): an empty id
/// is INVALID_ARGUMENT, an unknown one NOT_FOUND, a created one answers with the volume
/// and, with `VOLUME_CONDITION`, a condition.
#[tokio::test]
async fn sanity_controller_get_volume() {
    let mut s = Sanity::start().await;
    code_is(
        s.c.controller
            .controller_get_volume(v1::ControllerGetVolumeRequest::default())
            .await,
        Code::InvalidArgument,
    );
    code_is(
        s.c.controller
            .controller_get_volume(v1::ControllerGetVolumeRequest {
                volume_id: "vol-does-not-exist".into(),
            })
            .await,
        Code::NotFound,
    );
    let v = s.must_create("sanity-get").await;
    let got =
        s.c.controller
            .controller_get_volume(v1::ControllerGetVolumeRequest {
                volume_id: v.volume_id.clone(),
            })
            .await
            .unwrap()
            .into_inner();
    let volume = got.volume.unwrap();
    assert_eq!(volume.volume_id, v.volume_id);
    assert_eq!(volume.capacity_bytes, v.capacity_bytes);
    assert_eq!(volume.volume_context, v.volume_context);
    let condition = got.status.unwrap().volume_condition.unwrap();
    assert!(!condition.abnormal, "{condition:?}");
    s.cleanup().await;
}

/// What ControllerGetVolume and ListVolumes say of volume `id`'s condition.
async fn conditions(s: &mut Sanity, id: &str) -> [v1::VolumeCondition; 2] {
    let got =
        s.c.controller
            .controller_get_volume(v1::ControllerGetVolumeRequest {
                volume_id: id.to_owned(),
            })
            .await
            .unwrap()
            .into_inner();
    let listed =
        s.c.controller
            .list_volumes(v1::ListVolumesRequest::default())
            .await
            .unwrap()
            .into_inner()
            .entries
            .into_iter()
            .find(|e| e.volume.as_ref().is_some_and(|v| v.volume_id == id))
            .expect("the volume is listed");
    [
        got.status.unwrap().volume_condition.unwrap(),
        listed.status.unwrap().volume_condition.unwrap(),
    ]
}

/// CSI `VolumeCondition` (controller): a volume whose backing storage is gone (a dir
/// volume's directory, a loop volume's image) is abnormal in ControllerGetVolume and in
/// its ListVolumes entry, with a message naming what is missing; it is normal again once
/// the storage is back.
#[tokio::test]
async fn spec_controller_volume_condition_follows_the_backing_storage() {
    let mut s = Sanity::start().await;
    let dir = s.must_create("cond-dir").await;
    let mut loop_req = s.create_req("cond-loop");
    loop_req
        .parameters
        .insert("backend".to_owned(), "loop".to_owned());
    loop_req.capacity_range = Some(v1::CapacityRange {
        required_bytes: 64 << 20,
        limit_bytes: 0,
    });
    let image = s.create(loop_req).await.unwrap();
    s.created.push(image.volume_id.clone());
    let cases = [
        (
            &dir,
            s.p.root.join("volumes/dir").join(&dir.volume_id),
            "directory",
        ),
        (
            &image,
            s.p.root
                .join("volumes/loop")
                .join(format!("{}.img", image.volume_id)),
            "image",
        ),
    ];
    for (v, backing, what) in cases {
        for c in conditions(&mut s, &v.volume_id).await {
            assert!(!c.abnormal, "{what}: {c:?}");
        }
        let aside = backing.with_extension("aside");
        std::fs::rename(&backing, &aside).unwrap();
        for c in conditions(&mut s, &v.volume_id).await {
            assert!(c.abnormal, "{what}: {c:?}");
            assert!(c.message.starts_with(what), "{c:?}");
            assert!(c.message.contains(&v.volume_id), "{c:?}");
            assert!(c.message.ends_with("is missing"), "{c:?}");
        }
        std::fs::rename(&aside, &backing).unwrap();
        for c in conditions(&mut s, &v.volume_id).await {
            assert!(!c.abnormal, "{what} repaired: {c:?}");
        }
    }
    s.cleanup().await;
}
