//! csi-sanity's snapshot cases (ListSnapshots, GetSnapshot, DeleteSnapshot, CreateSnapshot
//! [Controller Server]) and its CreateVolume cases with a content source (a snapshot or a
//! volume), plus the spec rules around them that csi-sanity does not check.

use super::*;

use v1::volume_content_source::{SnapshotSource, Type as SourceType, VolumeSource};

/// csi-sanity's `verifySnapshotInfo`: an id, a source volume and a creation time.
fn verify_snapshot_info(s: &v1::Snapshot) {
    assert!(!s.snapshot_id.is_empty(), "{s:?}");
    assert!(!s.source_volume_id.is_empty(), "{s:?}");
    let t = s.creation_time.as_ref().expect("creation_time is REQUIRED");
    assert!(t.seconds > 0, "{s:?}");
}

fn snapshot_source(id: &str) -> Option<v1::VolumeContentSource> {
    Some(v1::VolumeContentSource {
        r#type: Some(SourceType::Snapshot(SnapshotSource {
            snapshot_id: id.to_owned(),
        })),
    })
}

fn volume_source(id: &str) -> Option<v1::VolumeContentSource> {
    Some(v1::VolumeContentSource {
        r#type: Some(SourceType::Volume(VolumeSource {
            volume_id: id.to_owned(),
        })),
    })
}

impl Sanity {
    /// csi-sanity's `MakeCreateSnapshotReq` (no `TestSnapshotParameters` by default).
    fn snapshot_req(&self, name: &str, source_volume_id: &str) -> v1::CreateSnapshotRequest {
        v1::CreateSnapshotRequest {
            name: name.to_owned(),
            source_volume_id: source_volume_id.to_owned(),
            ..Default::default()
        }
    }

    /// CreateSnapshot that registers the snapshot for cleanup, like csi-sanity's
    /// `Resources.CreateSnapshot`.
    async fn create_snapshot(
        &mut self,
        req: v1::CreateSnapshotRequest,
    ) -> Result<v1::Snapshot, tonic::Status> {
        let s = self
            .c
            .controller
            .create_snapshot(req)
            .await?
            .into_inner()
            .snapshot
            .expect("CreateSnapshotResponse.snapshot is REQUIRED");
        if !s.snapshot_id.is_empty() && !self.snapshots.iter().any(|(_, id)| *id == s.snapshot_id) {
            self.snapshots
                .push((self.created.len(), s.snapshot_id.clone()));
        }
        Ok(s)
    }

    /// csi-sanity's `MustCreateSnapshot`.
    async fn must_create_snapshot(&mut self, req: v1::CreateSnapshotRequest) -> v1::Snapshot {
        let s = self.create_snapshot(req).await.expect("CreateSnapshot");
        verify_snapshot_info(&s);
        s
    }

    /// csi-sanity's `MustCreateSnapshotFromVolumeRequest`.
    async fn must_create_snapshot_from_volume_request(
        &mut self,
        req: v1::CreateVolumeRequest,
        snapshot_name: &str,
    ) -> (v1::Snapshot, v1::Volume) {
        let v = self.create(req).await.expect("CreateVolume");
        let s = self
            .must_create_snapshot(self.snapshot_req(snapshot_name, &v.volume_id))
            .await;
        (s, v)
    }

    /// DeleteSnapshot that unregisters the snapshot, like csi-sanity's
    /// `Resources.DeleteSnapshot`.
    async fn delete_snapshot(&mut self, id: &str) -> Result<(), tonic::Status> {
        self.c
            .controller
            .delete_snapshot(v1::DeleteSnapshotRequest {
                snapshot_id: id.to_owned(),
                ..Default::default()
            })
            .await?;
        if !id.is_empty() {
            self.snapshots.retain(|(_, s)| s != id);
        }
        Ok(())
    }

    async fn list_snapshots(
        &mut self,
        req: v1::ListSnapshotsRequest,
    ) -> Result<v1::ListSnapshotsResponse, tonic::Status> {
        self.c
            .controller
            .list_snapshots(req)
            .await
            .map(tonic::Response::into_inner)
    }
}

// ===================== CreateVolume from a content source =====================

/// Controller Service / CreateVolume / should create volume from an existing source
/// snapshot.
async fn create_volume_from_snapshot(flavour: Flavour) {
    let mut s = Sanity::start_with(flavour).await;
    let vol1 = s.must_create(&unique("sanity-controller-source-vol")).await;
    let snap_req = s.snapshot_req(&unique("sanity-controller-snap-from-vol"), &vol1.volume_id);
    // csi-sanity repeats the call until `ready_to_use`; here it is ready at once.
    let snap = s.must_create_snapshot(snap_req).await;
    assert!(snap.ready_to_use, "{snap:?}");
    let mut vol2_req = s.create_req(&unique("sanity-controller-vol-from-snap"));
    vol2_req.volume_content_source = snapshot_source(&snap.snapshot_id);
    let vol = s.create(vol2_req).await.unwrap();
    assert_eq!(vol.content_source, snapshot_source(&snap.snapshot_id));
    s.cleanup().await;
}

/// Whether a flavour's controller cases can run here (no mounts needed; a loop MOUNT
/// volume needs `mkfs.ext4` installed to be created).
fn controller_flavour_runs(test: &str, flavour: Flavour) -> bool {
    flavour != Flavour::LoopMount || slrp_test_support::require_tool(test, "mkfs.ext4")
}

#[tokio::test]
async fn sanity_create_volume_from_snapshot_dir() {
    create_volume_from_snapshot(Flavour::Dir).await;
}

#[tokio::test]
async fn sanity_create_volume_from_snapshot_loop() {
    if controller_flavour_runs(
        "sanity_create_volume_from_snapshot_loop",
        Flavour::LoopMount,
    ) {
        create_volume_from_snapshot(Flavour::LoopMount).await;
    }
}

#[tokio::test]
async fn sanity_create_volume_from_snapshot_block() {
    create_volume_from_snapshot(Flavour::Block).await;
}

/// Controller Service / CreateVolume / should fail when the volume source snapshot is not
/// found.
#[tokio::test]
async fn sanity_create_volume_from_snapshot_not_found() {
    let mut s = Sanity::start().await;
    let mut req = s.create_req(&unique("sanity-controller-vol-from-snap"));
    req.volume_content_source = snapshot_source("non-existing-snapshot-id");
    code_is(s.create(req).await, Code::NotFound);
    s.cleanup().await;
}

/// Controller Service / CreateVolume / should create volume from an existing source
/// volume.
async fn create_volume_from_volume(flavour: Flavour) {
    let mut s = Sanity::start_with(flavour).await;
    let volume1 = s.must_create(&unique("sanity-controller-source-vol")).await;
    let mut vol2_req = s.create_req(&unique("sanity-controller-vol-from-vol"));
    vol2_req.volume_content_source = volume_source(&volume1.volume_id);
    let v = s.create(vol2_req).await.unwrap();
    // Beyond csi-sanity: the response names its source.
    assert_eq!(v.content_source, volume_source(&volume1.volume_id));
    s.cleanup().await;
}

#[tokio::test]
async fn sanity_create_volume_from_volume_dir() {
    create_volume_from_volume(Flavour::Dir).await;
}

#[tokio::test]
async fn sanity_create_volume_from_volume_loop() {
    if controller_flavour_runs("sanity_create_volume_from_volume_loop", Flavour::LoopMount) {
        create_volume_from_volume(Flavour::LoopMount).await;
    }
}

#[tokio::test]
async fn sanity_create_volume_from_volume_block() {
    create_volume_from_volume(Flavour::Block).await;
}

/// Controller Service / CreateVolume / should fail when the volume source volume is not
/// found.
#[tokio::test]
async fn sanity_create_volume_from_volume_not_found() {
    let mut s = Sanity::start().await;
    let mut req = s.create_req(&unique("sanity-controller-vol-from-snap"));
    req.volume_content_source = volume_source("fake-vol-id-0123456789");
    code_is(s.create(req).await, Code::NotFound);
    s.cleanup().await;
}

// ===================== ListSnapshots [Controller Server] =====================

/// ListSnapshots / should return appropriate values (no optional values added).
#[tokio::test]
async fn sanity_list_snapshots_no_optional_values() {
    let mut s = Sanity::start().await;
    // One snapshot, so the loop below checks something.
    let req = s.create_req(&unique("listSnapshots-volume-0"));
    s.must_create_snapshot_from_volume_request(req, &unique("listSnapshots-snapshot-0"))
        .await;
    let snapshots = s
        .list_snapshots(v1::ListSnapshotsRequest::default())
        .await
        .unwrap();
    assert_eq!(snapshots.entries.len(), 1);
    for e in &snapshots.entries {
        verify_snapshot_info(e.snapshot.as_ref().unwrap());
    }
    s.cleanup().await;
}

/// Three snapshots of three volumes; the second is the one a filter should find.
async fn three_snapshots(s: &mut Sanity, tag: &str) -> v1::Snapshot {
    let mut target = None;
    for (i, what) in ["unrelated", "target", "unrelated"].iter().enumerate() {
        let suffix = match i {
            0 => format!("{what}-{tag}-1"),
            1 => format!("{what}-{tag}"),
            _ => format!("{what}-{tag}-2"),
        };
        let req = s.create_req(&unique(&format!("listSnapshots-volume-{suffix}")));
        let (snap, _) = s
            .must_create_snapshot_from_volume_request(
                req,
                &unique(&format!("listSnapshots-snapshot-{suffix}")),
            )
            .await;
        if i == 1 {
            target = Some(snap);
        }
    }
    target.unwrap()
}

/// ListSnapshots / should return snapshots that match the specified snapshot id.
#[tokio::test]
async fn sanity_list_snapshots_by_snapshot_id() {
    let mut s = Sanity::start().await;
    let target = three_snapshots(&mut s, "s").await;
    let snapshots = s
        .list_snapshots(v1::ListSnapshotsRequest {
            snapshot_id: target.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(snapshots.entries.len(), 1);
    let got = snapshots.entries[0].snapshot.as_ref().unwrap();
    verify_snapshot_info(got);
    assert_eq!(got.snapshot_id, target.snapshot_id);
    s.cleanup().await;
}

/// ListSnapshots / should return empty when the specified snapshot id does not exist.
#[tokio::test]
async fn sanity_list_snapshots_snapshot_id_does_not_exist() {
    let mut s = Sanity::start().await;
    let snapshots = s
        .list_snapshots(v1::ListSnapshotsRequest {
            snapshot_id: "none-exist-id".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(snapshots.entries.is_empty());
    s.cleanup().await;
}

/// ListSnapshots / should return snapshots that match the specified source volume id.
#[tokio::test]
async fn sanity_list_snapshots_by_source_volume_id() {
    let mut s = Sanity::start().await;
    let target = three_snapshots(&mut s, "v").await;
    let snapshots = s
        .list_snapshots(v1::ListSnapshotsRequest {
            source_volume_id: target.source_volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(snapshots.entries.len(), 1);
    let got = snapshots.entries[0].snapshot.as_ref().unwrap();
    verify_snapshot_info(got);
    assert_eq!(got.source_volume_id, target.source_volume_id);
    s.cleanup().await;
}

/// ListSnapshots / should return empty when the specified source volume id does not exist.
#[tokio::test]
async fn sanity_list_snapshots_source_volume_does_not_exist() {
    let mut s = Sanity::start().await;
    let snapshots = s
        .list_snapshots(v1::ListSnapshotsRequest {
            source_volume_id: "fake-vol-id-0123456789".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(snapshots.entries.is_empty());
    s.cleanup().await;
}

/// ListSnapshots / check the presence of new snapshots in the snapshot list.
#[tokio::test]
async fn sanity_list_snapshots_new_present_deleted_absent() {
    let mut s = Sanity::start().await;
    let all = v1::ListSnapshotsRequest::default;
    let total = s.list_snapshots(all()).await.unwrap().entries.len();
    let req = s.create_req(&unique("listSnapshots-volume-3"));
    let (snapshot, _) = s
        .must_create_snapshot_from_volume_request(req, &unique("listSnapshots-snapshot-3"))
        .await;
    verify_snapshot_info(&snapshot);
    assert_eq!(
        s.list_snapshots(all()).await.unwrap().entries.len(),
        total + 1
    );
    s.delete_snapshot(&snapshot.snapshot_id).await.unwrap();
    assert_eq!(s.list_snapshots(all()).await.unwrap().entries.len(), total);
    s.cleanup().await;
}

/// ListSnapshots / should return next token when a limited number of entries are
/// requested. The case holds five 10 GiB volumes and a snapshot of each at once: 100 GiB
/// of pool. The default pool is the root file system's size, less than that on small
/// disks (91 GiB on the machine this was written on), so the replay gives a pool as the
/// docs tell an operator running csi-sanity to.
#[tokio::test]
async fn sanity_list_snapshots_next_token() {
    let mut s = Sanity::start_with_flags(Flavour::Dir, &["--pool", "default=1024GiB"]).await;
    let min_snapshot_count = 5;
    let max_entries = 2;
    let initial = s
        .list_snapshots(v1::ListSnapshotsRequest::default())
        .await
        .unwrap()
        .entries
        .len();
    let mut current = initial;
    if initial < min_snapshot_count {
        let required = min_snapshot_count - initial;
        for i in 1..=required {
            let req = s.create_req(&unique(&format!("volume{i}")));
            let (snapshot, _) = s
                .must_create_snapshot_from_volume_request(req, &unique(&format!("snapshot{i}")))
                .await;
            verify_snapshot_info(&snapshot);
        }
        current += required;
    }
    let first = s
        .list_snapshots(v1::ListSnapshotsRequest {
            max_entries: i32::try_from(max_entries).unwrap(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(first.entries.len(), max_entries);
    let rest = s
        .list_snapshots(v1::ListSnapshotsRequest {
            starting_token: first.next_token,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(rest.entries.len(), current - max_entries);
    s.cleanup().await;
}

/// ListSnapshots: "Invalid `starting_token` → ABORTED" (spec table; csi-sanity checks it
/// for ListVolumes only), and a negative `max_entries` is INVALID_ARGUMENT.
#[tokio::test]
async fn spec_list_snapshots_invalid_starting_token_and_max_entries() {
    let mut s = Sanity::start().await;
    code_is(
        s.list_snapshots(v1::ListSnapshotsRequest {
            starting_token: "invalid-token".into(),
            ..Default::default()
        })
        .await,
        Code::Aborted,
    );
    code_is(
        s.list_snapshots(v1::ListSnapshotsRequest {
            max_entries: -1,
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
    );
    s.cleanup().await;
}

// ===================== GetSnapshot [Controller Server] =====================

/// GetSnapshot / should return an error (no snapshot id).
#[tokio::test]
async fn sanity_get_snapshot_without_id_is_an_error() {
    let mut s = Sanity::start().await;
    let res =
        s.c.controller
            .get_snapshot(v1::GetSnapshotRequest::default())
            .await;
    // csi-sanity only wants an error; the spec's is INVALID_ARGUMENT (a REQUIRED field).
    code_is(res, Code::InvalidArgument);
    s.cleanup().await;
}

/// GetSnapshot / should return snapshot that match the specified snapshot id.
#[tokio::test]
async fn sanity_get_snapshot_by_id() {
    let mut s = Sanity::start().await;
    let target = three_snapshots(&mut s, "g").await;
    let got =
        s.c.controller
            .get_snapshot(v1::GetSnapshotRequest {
                snapshot_id: target.snapshot_id.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap();
    verify_snapshot_info(&got);
    assert_eq!(got.snapshot_id, target.snapshot_id);
    assert_eq!(got, target, "the same facts as CreateSnapshot reported");
    s.cleanup().await;
}

/// GetSnapshot / should return an error when the specified snapshot id does not exist.
#[tokio::test]
async fn sanity_get_snapshot_does_not_exist() {
    let mut s = Sanity::start().await;
    let res =
        s.c.controller
            .get_snapshot(v1::GetSnapshotRequest {
                snapshot_id: "none-exist-id".into(),
                ..Default::default()
            })
            .await;
    // csi-sanity only wants an error; the spec's table says NOT_FOUND.
    code_is(res, Code::NotFound);
    s.cleanup().await;
}

// ===================== DeleteSnapshot [Controller Server] =====================

/// DeleteSnapshot / should fail when no snapshot id is provided.
#[tokio::test]
async fn sanity_delete_snapshot_no_id() {
    let mut s = Sanity::start().await;
    code_is(s.delete_snapshot("").await, Code::InvalidArgument);
    s.cleanup().await;
}

/// DeleteSnapshot / should succeed when an invalid snapshot id is used.
#[tokio::test]
async fn sanity_delete_snapshot_invalid_id() {
    let mut s = Sanity::start().await;
    s.delete_snapshot("reallyfakesnapshotid").await.unwrap();
    // Beyond csi-sanity: ids that could never be ours are unknown, not an error.
    for id in ["../../etc/passwd", "snap with spaces", ".hidden"] {
        s.delete_snapshot(id).await.unwrap();
    }
    s.cleanup().await;
}

/// DeleteSnapshot / should return appropriate values (no optional values added). The
/// deletion itself is csi-sanity's cleanup (`DeleteSnapshot`, any error failing).
#[tokio::test]
async fn sanity_delete_snapshot_appropriate_values() {
    let mut s = Sanity::start().await;
    let req = s.create_req(&unique("DeleteSnapshot-volume-1"));
    let volume = s.create(req).await.unwrap();
    let snap_req = s.snapshot_req(&unique("DeleteSnapshot-snapshot-1"), &volume.volume_id);
    s.must_create_snapshot(snap_req).await;
    s.cleanup().await;
}

// ===================== CreateSnapshot [Controller Server] =====================

/// CreateSnapshot / should fail when no name is provided.
#[tokio::test]
async fn sanity_create_snapshot_no_name() {
    let mut s = Sanity::start().await;
    let req = v1::CreateSnapshotRequest {
        source_volume_id: "testId".into(),
        ..Default::default()
    };
    code_is(s.create_snapshot(req).await, Code::InvalidArgument);
    s.cleanup().await;
}

/// CreateSnapshot / should fail when no source volume id is provided.
#[tokio::test]
async fn sanity_create_snapshot_no_source_volume_id() {
    let mut s = Sanity::start().await;
    let req = v1::CreateSnapshotRequest {
        name: "name".into(),
        ..Default::default()
    };
    code_is(s.create_snapshot(req).await, Code::InvalidArgument);
    s.cleanup().await;
}

/// CreateSnapshot / should succeed when requesting to create a snapshot with already
/// existing name and same source volume ID.
#[tokio::test]
async fn sanity_create_snapshot_same_name_same_source() {
    let mut s = Sanity::start().await;
    let volume = s.must_create(&unique("CreateSnapshot-volume-1")).await;
    let req = s.snapshot_req(&unique("CreateSnapshot-snapshot-1"), &volume.volume_id);
    let first = s.must_create_snapshot(req.clone()).await;
    let second = s.must_create_snapshot(req).await;
    // Beyond csi-sanity: the same snapshot, not a second one.
    assert_eq!(first, second);
    assert_eq!(s.snapshots.len(), 1);
    s.cleanup().await;
}

/// CreateSnapshot / should fail when requesting to create a snapshot with already existing
/// name and different source volume ID.
#[tokio::test]
async fn sanity_create_snapshot_same_name_different_source() {
    let mut s = Sanity::start().await;
    let snapshot_name = unique("CreateSnapshot-snapshot-2");
    let req = s.create_req(&unique("CreateSnapshot-volume-2"));
    s.must_create_snapshot_from_volume_request(req, &snapshot_name)
        .await;
    let volume2 = s.must_create(&unique("CreateSnapshot-volume-3")).await;
    let req = s.snapshot_req(&snapshot_name, &volume2.volume_id);
    code_is(s.create_snapshot(req).await, Code::AlreadyExists);
    s.cleanup().await;
}

/// CreateSnapshot / should succeed when creating snapshot with maximum-length name.
#[tokio::test]
async fn sanity_create_snapshot_maximum_length_name() {
    let mut s = Sanity::start().await;
    let volume = s
        .must_create(&unique("CreateSnapshot-volume-maxlen-name"))
        .await;
    let name = unique_with_length("CreateSnapshot-snapshot-maxlen", MAX_NAME_LENGTH);
    assert_eq!(name.len(), MAX_NAME_LENGTH);
    let req = s.snapshot_req(&name, &volume.volume_id);
    s.must_create_snapshot(req.clone()).await;
    s.must_create_snapshot(req).await;
    s.cleanup().await;
}

// ===================== Spec rules around snapshots and sources =====================

/// CreateSnapshot "Not enough space to create snapshot" is RESOURCE_EXHAUSTED; snapshots
/// take their source's size from the pool (GetCapacity shows it) and stay when their
/// volume is deleted.
#[tokio::test]
async fn spec_snapshots_take_capacity_and_outlive_their_volume() {
    let p = TestPlugin::start(&["--pool", "default=30MiB"]).await;
    let mut c = p.v1().await;
    let free = |c: &mut V1| {
        let mut ctl = c.controller.clone();
        async move {
            ctl.get_capacity(v1::GetCapacityRequest::default())
                .await
                .unwrap()
                .into_inner()
                .available_capacity
        }
    };
    let v = c
        .controller
        .create_volume(create_req("v", 10 * MIB, mount_cap(""), &[]))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let snap = |name: &str| v1::CreateSnapshotRequest {
        name: name.into(),
        source_volume_id: v.volume_id.clone(),
        ..Default::default()
    };
    let s1 = c
        .controller
        .create_snapshot(snap("a"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(s1.snapshot.as_ref().unwrap().size_bytes, 10 * MIB);
    assert_eq!(free(&mut c).await, 10 * MIB);
    c.controller.create_snapshot(snap("b")).await.unwrap();
    assert_eq!(free(&mut c).await, 0);
    assert_code(
        c.controller.create_snapshot(snap("c")).await,
        Code::ResourceExhausted,
    );
    c.controller
        .delete_volume(v1::DeleteVolumeRequest {
            volume_id: v.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(free(&mut c).await, 10 * MIB);
    let listed = c
        .controller
        .list_snapshots(v1::ListSnapshotsRequest {
            source_volume_id: v.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.entries.len(), 2, "snapshots outlive their volume");
}

/// CreateVolume from a source: "Unsupported capacity_range → OUT_OF_RANGE … when trying to
/// create a volume smaller than the source snapshot"; a source the new volume cannot hold
/// (another pool, another access type or backend) is INVALID_ARGUMENT with the reason;
/// the same name with another source is ALREADY_EXISTS.
#[tokio::test]
async fn spec_create_volume_from_source_checks_size_and_shape() {
    let p = TestPlugin::start(&["--pool", "default=1GiB", "--pool", "fast=1GiB"]).await;
    let mut c = p.v1().await;
    let v = c
        .controller
        .create_volume(create_req("v", 10 * MIB, mount_cap(""), &[]))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let s = c
        .controller
        .create_snapshot(v1::CreateSnapshotRequest {
            name: "s".into(),
            source_volume_id: v.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    let from = |name: &str, bytes: i64, cap, params: &[(&str, &str)], src| {
        let mut r = create_req(name, bytes, cap, params);
        r.volume_content_source = src;
        r
    };
    let snap_src = || snapshot_source(&s.snapshot_id);
    for (what, req, code) in [
        (
            "smaller than the snapshot",
            from("x", 5 * MIB, mount_cap(""), &[], snap_src()),
            Code::OutOfRange,
        ),
        (
            "smaller than the volume",
            from(
                "x",
                5 * MIB,
                mount_cap(""),
                &[],
                volume_source(&v.volume_id),
            ),
            Code::OutOfRange,
        ),
        (
            "another pool",
            from("x", 0, mount_cap(""), &[("pool", "fast")], snap_src()),
            Code::InvalidArgument,
        ),
        (
            "BLOCK from a MOUNT volume",
            from("x", 0, block_cap(), &[], snap_src()),
            Code::InvalidArgument,
        ),
        (
            "a loop volume from a dir volume",
            from("x", 0, mount_cap(""), &[("backend", "loop")], snap_src()),
            Code::InvalidArgument,
        ),
    ] {
        let err = c.controller.create_volume(req).await.unwrap_err();
        assert_eq!(err.code(), code, "{what}: {}", err.message());
    }
    let r = c
        .controller
        .create_volume(from("r", 20 * MIB, mount_cap(""), &[], snap_src()))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(r.capacity_bytes, 20 * MIB, "larger than the source is fine");
    let again = c
        .controller
        .create_volume(from("r", 20 * MIB, mount_cap(""), &[], snap_src()))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(again, r);
    let err = c
        .controller
        .create_volume(from(
            "r",
            20 * MIB,
            mount_cap(""),
            &[],
            volume_source(&v.volume_id),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{}", err.message());
    // ListVolumes and ControllerGetVolume report the source too.
    let got = c
        .controller
        .controller_get_volume(v1::ControllerGetVolumeRequest {
            volume_id: r.volume_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.volume.unwrap().content_source, snap_src());
}

/// ListVolumes (LIST_VOLUMES_PUBLISHED_NODES) and ControllerGetVolume report this node in
/// `published_node_ids` while a volume is staged or published here, and nothing
/// otherwise.
#[tokio::test]
async fn spec_published_node_ids_follow_the_node_state() {
    if !can_mount("spec_published_node_ids_follow_the_node_state") {
        return;
    }
    let mut s = Sanity::start().await;
    let v = s.must_create("published-nodes").await;
    let node_id =
        s.c.node
            .node_get_info(v1::NodeGetInfoRequest {})
            .await
            .unwrap()
            .into_inner()
            .node_id;
    let published = |s: &mut Sanity| {
        let mut ctl = s.c.controller.clone();
        let id = v.volume_id.clone();
        async move {
            let listed = ctl
                .list_volumes(v1::ListVolumesRequest::default())
                .await
                .unwrap()
                .into_inner()
                .entries
                .into_iter()
                .find(|e| e.volume.as_ref().unwrap().volume_id == id)
                .unwrap()
                .status
                .unwrap()
                .published_node_ids;
            let got = ctl
                .controller_get_volume(v1::ControllerGetVolumeRequest { volume_id: id })
                .await
                .unwrap()
                .into_inner()
                .status
                .unwrap()
                .published_node_ids;
            assert_eq!(listed, got);
            listed
        }
    };
    assert!(published(&mut s).await.is_empty());
    s.stage_and_publish(&v).await;
    assert_eq!(published(&mut s).await, [node_id]);
    s.cleanup_node(&v).await;
    assert!(published(&mut s).await.is_empty());
    s.cleanup().await;
}
