use super::*;

use slrp_csi::CsiVersion;
use slrp_proto::mesos::v1::Label;
use slrp_proto::mesos::v1::offer::operation::{
    Create, CreateDisk, Destroy, DestroyDisk, Reserve, Unreserve,
};
use slrp_proto::mesos::v1::resource::disk_info::Persistence;
use slrp_proto::mesos::v1::resource::reservation_info::Type as ReservationType;
use slrp_proto::mesos::v1::resource::{AllocationInfo, ReservationInfo, SharedInfo};

use crate::volume::{Mismatched, VolumeError};

const MB: u64 = 1_048_576;

fn ctx() -> ProviderResources {
    ProviderResources::new(
        ResourceProviderId {
            value: "rp".to_owned(),
        },
        "org.apache.mesos.csi.test",
        "local",
        vec![],
    )
    .unwrap()
}

fn pool(mb: u64, profile: &str) -> Resource {
    ctx().raw_disk(mb * MB, Some(profile), None, None)
}

fn preexisting(mb: u64, id: &str, metadata: Option<Labels>) -> Resource {
    ctx().raw_disk(mb * MB, None, Some(id), metadata)
}

/// A MOUNT (or `kind`) disk with volume id `id`, as CREATE_DISK makes it.
fn disk(kind: SourceType, id: &str) -> Resource {
    let mut r = ctx().raw_disk(64 * MB, Some("fast"), Some(id), None);
    let s = r.disk.as_mut().unwrap().source.as_mut().unwrap();
    s.r#type = kind as i32;
    if kind == SourceType::Mount {
        s.mount = Some(ctx().mount_source());
    }
    r
}

fn persistent(mut r: Resource, pid: &str) -> Resource {
    r.disk.as_mut().unwrap().persistence = Some(Persistence {
        id: pid.to_owned(),
        principal: None,
    });
    r
}

fn reserved(mut r: Resource, role: &str) -> Resource {
    r.reservations.push(ReservationInfo {
        r#type: Some(ReservationType::Dynamic as i32),
        role: Some(role.to_owned()),
        principal: None,
        labels: None,
    });
    r
}

fn allocated(mut r: Resource) -> Resource {
    r.allocation_info = Some(AllocationInfo {
        role: Some("storage".to_owned()),
    });
    r
}

fn op(t: OperationType) -> offer::Operation {
    offer::Operation {
        r#type: Some(t as i32),
        ..Default::default()
    }
}

fn reserve_op(source: Vec<Resource>, resources: Vec<Resource>) -> offer::Operation {
    offer::Operation {
        reserve: Some(Reserve { source, resources }),
        ..op(OperationType::Reserve)
    }
}

fn unreserve_op(resources: Vec<Resource>) -> offer::Operation {
    offer::Operation {
        unreserve: Some(Unreserve { resources }),
        ..op(OperationType::Unreserve)
    }
}

fn create_op(volumes: Vec<Resource>) -> offer::Operation {
    offer::Operation {
        create: Some(Create { volumes }),
        ..op(OperationType::Create)
    }
}

fn destroy_op(volumes: Vec<Resource>) -> offer::Operation {
    offer::Operation {
        destroy: Some(Destroy { volumes }),
        ..op(OperationType::Destroy)
    }
}

fn create_disk_op(
    source: Resource,
    target: SourceType,
    target_profile: Option<&str>,
) -> offer::Operation {
    offer::Operation {
        create_disk: Some(CreateDisk {
            source,
            target_type: target as i32,
            target_profile: target_profile.map(str::to_owned),
        }),
        ..op(OperationType::CreateDisk)
    }
}

fn destroy_disk_op(source: Resource) -> offer::Operation {
    offer::Operation {
        destroy_disk: Some(DestroyDisk { source }),
        ..op(OperationType::DestroyDisk)
    }
}

fn profiles() -> BTreeMap<String, ProfileInfo> {
    let def = |capability: VolumeCapability| ProfileInfo {
        capability: capability.to_mesos().unwrap(),
        parameters: [("kind".to_owned(), "ssd".to_owned())].into(),
    };
    [
        ("fast".to_owned(), def(VolumeCapability::mount_default())),
        ("raw".to_owned(), def(VolumeCapability::block())),
    ]
    .into()
}

fn planned(source: Resource, target: SourceType, target_profile: Option<&str>) -> CreateDiskPlan {
    text(plan_create_disk(
        &create_disk_op(source, target, target_profile),
        &uuid::Uuid::from_u128(1),
        &profiles(),
    ))
    .unwrap()
}

// --- acceptance -------------------------------------------------------------------

#[test]
fn reconciliation_table_of_spec_5_2() {
    let mount = disk(SourceType::Mount, "v1");
    let cases = [
        (
            reserve_op(vec![], vec![reserved(pool(10, "fast"), "a")]),
            false,
        ),
        (
            reserve_op(
                vec![pool(10, "fast")],
                vec![reserved(pool(10, "fast"), "a")],
            ),
            false,
        ),
        (reserve_op(vec![], vec![reserved(mount.clone(), "a")]), true),
        (unreserve_op(vec![reserved(pool(10, "fast"), "a")]), false),
        (unreserve_op(vec![reserved(mount.clone(), "a")]), true),
        // A pre-existing volume has no profile: not part of a pool.
        (
            reserve_op(vec![], vec![reserved(preexisting(5, "p", None), "a")]),
            true,
        ),
        (create_op(vec![persistent(mount.clone(), "pv")]), true),
        (destroy_op(vec![persistent(mount.clone(), "pv")]), true),
        (
            create_disk_op(pool(10, "fast"), SourceType::Mount, None),
            false,
        ),
        (destroy_disk_op(mount), false),
        (op(OperationType::GrowVolume), false),
        (op(OperationType::Launch), false),
    ];
    for (i, (info, allows)) in cases.iter().enumerate() {
        assert_eq!(allows_reconciliation(info), *allows, "case {i}: {info:?}");
    }
}

fn input<'a>(
    info: &'a offer::Operation,
    current: &'a uuid::Uuid,
    received: Option<uuid::Uuid>,
) -> AdmissionInput<'a> {
    AdmissionInput {
        info,
        reconciling: false,
        current_version: current,
        received_version: received,
        tracked: false,
    }
}

#[test]
fn a_matching_version_is_accepted_and_a_mismatch_dropped_with_canonical_uuids() {
    let current = uuid::Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
    let other = uuid::Uuid::from_u128(0xfedc_ba98_7654_3210_fedc_ba98_7654_3210);
    let info = create_disk_op(pool(10, "fast"), SourceType::Mount, None);
    assert_eq!(
        admit(&input(&info, &current, Some(current))),
        Admission::Accept
    );
    assert_eq!(
        admit(&input(&info, &current, Some(other))),
        Admission::Drop(
            "Mismatched resource version fedcba98-7654-3210-fedc-ba9876543210 \
             (expected: 01234567-89ab-cdef-0123-456789abcdef)"
                .to_owned()
        )
    );
    assert_eq!(
        admit(&input(&info, &current, None)),
        Admission::Drop(
            "Missing or malformed resource version \
             (expected: 01234567-89ab-cdef-0123-456789abcdef)"
                .to_owned()
        )
    );
}

#[test]
fn a_tracked_uuid_is_a_duplicate_whatever_else_is_wrong() {
    let current = uuid::Uuid::from_u128(1);
    for info in [
        create_disk_op(pool(10, "fast"), SourceType::Mount, None),
        op(OperationType::GrowVolume),
    ] {
        let mut i = input(&info, &current, Some(uuid::Uuid::from_u128(2)));
        i.tracked = true;
        i.reconciling = true;
        assert_eq!(admit(&i), Admission::Duplicate);
    }
}

#[test]
fn disk_operations_are_deferred_while_reconciling_and_speculative_ones_accepted() {
    let current = uuid::Uuid::from_u128(7);
    let deferred = [
        create_disk_op(pool(10, "fast"), SourceType::Mount, None),
        destroy_disk_op(disk(SourceType::Mount, "v")),
    ];
    let accepted = [
        reserve_op(vec![], vec![reserved(pool(10, "fast"), "a")]),
        unreserve_op(vec![reserved(pool(10, "fast"), "a")]),
        create_op(vec![persistent(disk(SourceType::Mount, "v"), "pv")]),
    ];
    for info in &deferred {
        let mut i = input(info, &current, Some(current));
        i.reconciling = true;
        assert_eq!(admit(&i), Admission::Defer, "{info:?}");
        i.reconciling = false;
        assert_eq!(admit(&i), Admission::Accept, "{info:?}");
    }
    for info in &accepted {
        let mut i = input(info, &current, Some(current));
        i.reconciling = true;
        assert_eq!(admit(&i), Admission::Accept, "{info:?}");
    }
    // Mesos's order: the reconciliation before the version. One that could not be
    // applied anyway is dropped with Mesos's reconciliation text.
    let mut i = input(&deferred[0], &current, Some(uuid::Uuid::from_u128(8)));
    i.reconciling = true;
    assert_eq!(admit(&i), Admission::Drop(RECONCILING_MESSAGE.to_owned()));
    i.received_version = None;
    assert_eq!(admit(&i), Admission::Drop(RECONCILING_MESSAGE.to_owned()));
    // Speculative ones go on to the version check.
    let mut i = input(&accepted[0], &current, Some(uuid::Uuid::from_u128(8)));
    i.reconciling = true;
    assert!(matches!(admit(&i), Admission::Drop(m) if m.starts_with("Mismatched")));
}

#[test]
fn unsupported_kinds_are_dropped_with_a_clear_message() {
    let current = uuid::Uuid::from_u128(3);
    let cases = [
        (
            op(OperationType::GrowVolume),
            "Growing a volume from a resource provider is not supported",
        ),
        (
            op(OperationType::ShrinkVolume),
            "Shrinking a volume from a resource provider is not supported",
        ),
        (
            op(OperationType::Launch),
            "Operation LAUNCH is not applied by a resource provider",
        ),
        (
            op(OperationType::LaunchGroup),
            "Operation LAUNCH_GROUP is not applied by a resource provider",
        ),
        (
            op(OperationType::Unknown),
            "Operation type 0 is not supported",
        ),
        (offer::Operation::default(), "Operation has no type"),
        (
            offer::Operation {
                r#type: Some(42),
                ..Default::default()
            },
            "Operation type 42 is not supported",
        ),
    ];
    for (info, message) in cases {
        // Refused before the version is looked at.
        assert_eq!(
            admit(&input(&info, &current, None)),
            Admission::Drop(message.to_owned())
        );
        assert_eq!(
            text(speculative_conversions(&info)),
            Err(message.to_owned())
        );
    }
}

#[test]
fn the_agent_applies_grow_and_shrink_speculatively() {
    for (t, speculative) in [
        (OperationType::Reserve, true),
        (OperationType::Destroy, true),
        (OperationType::GrowVolume, true),
        (OperationType::ShrinkVolume, true),
        (OperationType::CreateDisk, false),
        (OperationType::Launch, false),
    ] {
        assert_eq!(agent_applies_speculatively(&op(t)), speculative, "{t:?}");
    }
}

// --- speculative conversions ------------------------------------------------------

#[test]
fn reserve_pops_the_last_reservation_or_takes_the_source() {
    let target = reserved(reserved(pool(10, "fast"), "a"), "a/b");
    let popped = reserved(pool(10, "fast"), "a");
    let conversions = text(speculative_conversions(&reserve_op(
        vec![],
        vec![target.clone()],
    )))
    .unwrap();
    assert_eq!(
        conversions,
        vec![Conversion {
            consumed: Resources::from(popped),
            converted: Resources::from(target.clone()),
        }]
    );
    let source = pool(10, "fast");
    let conversions = text(speculative_conversions(&reserve_op(
        vec![source.clone()],
        vec![target.clone()],
    )))
    .unwrap();
    assert_eq!(conversions[0].consumed, Resources::from(source));
    assert_eq!(
        text(speculative_conversions(&reserve_op(
            vec![],
            vec![pool(10, "fast")]
        ))),
        Err(format!(
            "Cannot pop a reservation from unreserved resource '{}'",
            DisplayResource(&pool(10, "fast"))
        ))
    );
}

#[test]
fn unreserve_converts_each_resource_to_its_popped_form() {
    let a = reserved(pool(10, "fast"), "a");
    let b = reserved(disk(SourceType::Mount, "v"), "a");
    let conversions = text(speculative_conversions(&unreserve_op(vec![a, b]))).unwrap();
    assert_eq!(conversions.len(), 2);
    assert_eq!(conversions[0].converted, Resources::from(pool(10, "fast")));
    assert_eq!(
        conversions[1].converted,
        Resources::from(disk(SourceType::Mount, "v"))
    );
    assert!(
        text(speculative_conversions(&unreserve_op(vec![pool(
            1, "fast"
        )])))
        .is_err()
    );
}

#[test]
fn create_and_destroy_convert_between_the_disk_and_the_persistent_volume() {
    let mut volume = persistent(disk(SourceType::Mount, "v"), "pv");
    volume.shared = Some(SharedInfo {});
    let bare = disk(SourceType::Mount, "v");
    let created = text(speculative_conversions(&create_op(vec![volume.clone()]))).unwrap();
    assert_eq!(
        created,
        vec![Conversion {
            consumed: Resources::from(bare.clone()),
            converted: Resources::from(volume.clone()),
        }]
    );
    assert!(created[0].consumed.as_slice()[0].shared.is_none());
    let destroyed = text(speculative_conversions(&destroy_op(vec![volume.clone()]))).unwrap();
    assert_eq!(
        destroyed,
        vec![Conversion {
            consumed: Resources::from(volume),
            converted: Resources::from(bare),
        }]
    );
}

#[test]
fn persistent_volumes_only_on_mount_disks_with_mesos_text() {
    for (kind, name) in [
        (SourceType::Block, "BLOCK"),
        (SourceType::Raw, "RAW"),
        (SourceType::Path, "PATH"),
    ] {
        let volume = persistent(disk(kind, "v"), "pv1");
        assert_eq!(
            text(speculative_conversions(&create_op(vec![volume.clone()]))),
            Err(format!(
                "Cannot create persistent volume 'pv1' on a {name} disk"
            ))
        );
        assert_eq!(
            text(speculative_conversions(&destroy_op(vec![volume]))),
            Err(format!(
                "Cannot destroy persistent volume 'pv1' on a {name} disk"
            ))
        );
    }
    let mut no_source = persistent(disk(SourceType::Mount, "v"), "pv2");
    no_source.disk.as_mut().unwrap().source = None;
    assert_eq!(
        text(speculative_conversions(&create_op(vec![no_source]))),
        Err("Cannot create persistent volume 'pv2' on a UNKNOWN disk".to_owned())
    );
    let plain = disk(SourceType::Mount, "v");
    assert_eq!(
        text(speculative_conversions(&create_op(vec![plain.clone()]))),
        Err(format!(
            "Cannot create resource '{}': it is not a persistent volume",
            DisplayResource(&plain)
        ))
    );
    let mut no_id = persistent(disk(SourceType::Mount, "v"), "pv3");
    no_id.disk.as_mut().unwrap().source.as_mut().unwrap().id = None;
    assert_eq!(
        text(speculative_conversions(&destroy_op(vec![no_id]))),
        Err(
            "Cannot destroy persistent volume 'pv3': its disk is not backed by a CSI volume"
                .to_owned()
        )
    );
    assert_eq!(
        text(speculative_conversions(&op(OperationType::Create))),
        Err("CREATE operation without 'create'".to_owned())
    );
    assert_eq!(
        text(speculative_conversions(&create_disk_op(
            pool(1, "fast"),
            SourceType::Mount,
            None
        ))),
        Err("CREATE_DISK is not a speculative operation".to_owned())
    );
}

#[test]
fn destroy_targets_name_the_volume_and_persistence_ids() {
    let info = destroy_op(vec![
        persistent(disk(SourceType::Mount, "v1"), "a"),
        persistent(disk(SourceType::Mount, "v2"), "b"),
    ]);
    assert_eq!(
        text(destroy_targets(&info)).unwrap(),
        vec![
            PersistentVolume {
                volume_id: VolumeId::new("v1"),
                persistence_id: "a".to_owned()
            },
            PersistentVolume {
                volume_id: VolumeId::new("v2"),
                persistence_id: "b".to_owned()
            },
        ]
    );
    assert!(
        text(destroy_targets(&destroy_op(vec![persistent(
            disk(SourceType::Block, "v"),
            "c"
        )])))
        .is_err()
    );
    assert!(text(destroy_targets(&create_op(vec![]))).is_err());
}

#[test]
fn conversions_apply_without_allocation_info_and_report_it() {
    let volume = persistent(disk(SourceType::Mount, "v"), "pv");
    let info = create_op(vec![allocated(volume.clone())]);
    let conversions = text(speculative_conversions(&info)).unwrap();
    let total = Resources::from(disk(SourceType::Mount, "v")) + &Resources::from(pool(5, "fast"));
    let after = text(apply_conversions(&total, &info, &conversions)).unwrap();
    assert_eq!(
        after,
        Resources::from(volume) + &Resources::from(pool(5, "fast"))
    );
    assert!(after.iter().all(|r| r.allocation_info.is_none()));
    let reported = converted_resources(&conversions);
    assert_eq!(reported.len(), 1);
    assert!(reported.as_slice()[0].allocation_info.is_some());
}

#[test]
fn a_conversion_the_total_does_not_hold_fails_with_mesos_text() {
    let info = create_op(vec![persistent(disk(SourceType::Mount, "v"), "pv")]);
    let conversions = text(speculative_conversions(&info)).unwrap();
    let total = Resources::from(pool(5, "fast"));
    assert_eq!(
        text(apply_conversions(&total, &info, &conversions)),
        Err(format!(
            "{total} does not contain {}",
            Resources::from(disk(SourceType::Mount, "v"))
        ))
    );
}

#[test]
fn destroying_one_of_two_shared_copies_fails() {
    let mut volume = persistent(disk(SourceType::Mount, "v"), "pv");
    volume.shared = Some(SharedInfo {});
    let mut total = Resources::from(volume.clone());
    total.add(&volume);
    assert_eq!(total.len(), 2);
    let info = destroy_op(vec![volume.clone()]);
    let conversions = text(speculative_conversions(&info)).unwrap();
    let error = text(apply_conversions(&total, &info, &conversions)).unwrap_err();
    assert!(
        error.ends_with("cannot be removed due to additional shared copies"),
        "{error}"
    );
    assert!(
        text(apply_conversions(
            &Resources::from(volume),
            &info,
            &conversions
        ))
        .is_ok()
    );
}

// --- CREATE_DISK ------------------------------------------------------------------

#[test]
fn a_pool_becomes_a_create_volume_named_by_the_operation() {
    let operation = uuid::Uuid::from_u128(0xabc);
    let mut source = pool(0, "fast");
    source.scalar = Some(slrp_proto::mesos::v1::value::Scalar { value: 1.5 + 1e-7 });
    let plan = text(plan_create_disk(
        &create_disk_op(allocated(source.clone()), SourceType::Mount, None),
        &operation,
        &profiles(),
    ))
    .unwrap();
    assert_eq!(plan.profile, "fast");
    assert_eq!(plan.kind, CreatedKind::Mount);
    assert_eq!(plan.source, allocated(source));
    let DiskRequest::Create(create) = &plan.request else {
        panic!("expected a CreateVolume: {plan:?}");
    };
    assert_eq!(create.name, "00000000-0000-0000-0000-000000000abc");
    // 1.5000001 MB × 1048576 = 1572864.10…: truncated.
    assert_eq!(create.required_bytes, 1_572_864);
    assert_eq!(create.limit_bytes, 1_572_864);
    assert_eq!(create.capability, VolumeCapability::mount_default());
    assert_eq!(create.parameters, profiles()["fast"].parameters);
    let block = text(plan_create_disk(
        &create_disk_op(pool(8, "raw"), SourceType::Block, None),
        &operation,
        &profiles(),
    ))
    .unwrap();
    assert_eq!(block.kind, CreatedKind::Block);
}

#[test]
fn a_preexisting_volume_is_validated_with_the_target_profile() {
    let metadata = Labels {
        labels: vec![Label {
            key: "path".to_owned(),
            value: Some("/x".to_owned()),
        }],
    };
    let source = preexisting(3, "vol-7", Some(metadata));
    let plan = planned(source, SourceType::Mount, Some("fast"));
    let DiskRequest::Import(validate) = &plan.request else {
        panic!("expected a ValidateVolume: {plan:?}");
    };
    assert_eq!(validate.id, VolumeId::new("vol-7"));
    assert_eq!(validate.capacity_bytes, 3 * 1_048_576);
    assert_eq!(
        validate.volume_context,
        [("path".to_owned(), "/x".to_owned())].into()
    );
    assert_eq!(validate.capability, VolumeCapability::mount_default());
    assert_eq!(validate.parameters, profiles()["fast"].parameters);
    assert_eq!(plan.profile, "fast");
}

#[test]
fn create_disk_refusals_carry_mesos_texts() {
    let id = uuid::Uuid::from_u128(1);
    let plan =
        |info: offer::Operation| text(plan_create_disk(&info, &id, &profiles())).unwrap_err();
    let pre = preexisting(3, "v", None);
    let cases = [
        (
            create_disk_op(pool(1, "gone"), SourceType::Mount, None),
            "Profile 'gone' not found".to_owned(),
        ),
        (
            create_disk_op(pool(1, "raw"), SourceType::Mount, None),
            "Profile 'raw' cannot be used to create a MOUNT disk".to_owned(),
        ),
        (
            create_disk_op(pool(1, "fast"), SourceType::Block, None),
            "Profile 'fast' cannot be used to create a BLOCK disk".to_owned(),
        ),
        (
            create_disk_op(pre.clone(), SourceType::Block, Some("fast")),
            "Profile 'fast' cannot be used to create a BLOCK disk".to_owned(),
        ),
        (
            create_disk_op(pool(1, "fast"), SourceType::Mount, Some("fast")),
            "'target_profile' must not be set when 'source' has a profile".to_owned(),
        ),
        (
            create_disk_op(pre.clone(), SourceType::Mount, None),
            "'target_profile' must be set when 'source' has no profile".to_owned(),
        ),
        (
            create_disk_op(pool(1, "fast"), SourceType::Raw, None),
            "'target_type' is neither MOUNT or BLOCK".to_owned(),
        ),
        (
            create_disk_op(disk(SourceType::Mount, "v"), SourceType::Mount, None),
            "'source' is not a RAW disk resource".to_owned(),
        ),
        (
            op(OperationType::CreateDisk),
            "CREATE_DISK operation without 'create_disk'".to_owned(),
        ),
    ];
    for (info, message) in cases {
        assert_eq!(plan(info), message);
    }
    let mut both = pool(1, "fast");
    both.disk.as_mut().unwrap().source.as_mut().unwrap().id = Some("v".to_owned());
    assert!(plan(create_disk_op(both, SourceType::Mount, None)).contains("neither a storage pool"));
    let neither = ctx().raw_disk(MB, None, None, None);
    assert!(
        plan(create_disk_op(neither, SourceType::Mount, Some("fast")))
            .contains("neither a storage pool")
    );
}

#[test]
fn metadata_that_is_not_a_map_fails_the_import_instead_of_aborting() {
    let id = uuid::Uuid::from_u128(1);
    let label = |key: &str, value: Option<&str>| Label {
        key: key.to_owned(),
        value: value.map(str::to_owned),
    };
    for (labels, why) in [
        (
            vec![label("a", Some("1")), label("a", Some("2"))],
            "Repeated key 'a' in labels",
        ),
        (
            vec![label("b", None)],
            "Missing value for key 'b' in labels",
        ),
    ] {
        let source = preexisting(3, "v", Some(Labels { labels }));
        let error = text(plan_create_disk(
            &create_disk_op(source.clone(), SourceType::Mount, Some("fast")),
            &id,
            &profiles(),
        ))
        .unwrap_err();
        assert_eq!(
            error,
            format!(
                "Cannot apply profile 'fast' to resource '{}': {why}",
                DisplayResource(&source)
            )
        );
    }
}

#[test]
fn a_create_disk_outcome_is_the_conversion_or_the_failed_message() {
    let ctx = ctx();
    let source = preexisting(3, "v", None);
    let plan = planned(source.clone(), SourceType::Mount, Some("fast"));
    let volume = VolumeInfo {
        id: VolumeId::new("v"),
        capacity_bytes: (3 * MB) as i64,
        volume_context: BTreeMap::new(),
    };
    assert_eq!(
        text(create_disk_outcome(&ctx, &plan, Ok(volume.clone()))),
        Ok(vec![create_disk_conversion(&ctx, &plan, &volume)])
    );
    let mismatch = VolumeError::Mismatch {
        id: VolumeId::new("v"),
        what: Mismatched::Capability,
        version: CsiVersion::V0,
    };
    assert_eq!(
        text(create_disk_outcome(&ctx, &plan, Err(mismatch))),
        Err(format!(
            "Cannot apply profile 'fast' to resource '{}': Mismatched capability for volume 'v'",
            DisplayResource(&source)
        ))
    );
}

#[test]
fn a_failed_validation_names_the_profile_and_resource() {
    let source = preexisting(3, "v", None);
    let plan = planned(source.clone(), SourceType::Mount, Some("fast"));
    let mismatch = VolumeError::Mismatch {
        id: VolumeId::new("v"),
        what: Mismatched::Parameters,
        version: CsiVersion::V1,
    };
    assert_eq!(
        plan.failure(&mismatch).to_string(),
        format!(
            "Cannot apply profile 'fast' to resource '{}': Mismatched parameters for volume 'v'",
            DisplayResource(&source)
        )
    );
    let create = planned(pool(1, "fast"), SourceType::Mount, None);
    let taken = VolumeError::NameTaken {
        name: "n".to_owned(),
        id: VolumeId::new("v"),
    };
    assert_eq!(
        create.failure(&taken),
        OperationError::Volume {
            chain: "Volume with name 'n' already exists".to_owned()
        }
    );
}

#[test]
fn a_created_disk_keeps_the_allocation_and_the_consumed_size() {
    let ctx = ctx();
    let source = allocated(pool(10, "fast"));
    let plan = planned(source.clone(), SourceType::Mount, None);
    let volume = VolumeInfo {
        id: VolumeId::new("vol-1"),
        capacity_bytes: (12 * MB) as i64,
        volume_context: [("k".to_owned(), "v".to_owned())].into(),
    };
    let conversion = create_disk_conversion(&ctx, &plan, &volume);
    assert_eq!(conversion.consumed, Resources::from(source));
    let converted = &conversion.converted.as_slice()[0];
    assert!(converted.allocation_info.is_some());
    let s = converted.disk.as_ref().unwrap().source.as_ref().unwrap();
    assert_eq!(s.r#type, SourceType::Mount as i32);
    assert_eq!(s.id.as_deref(), Some("vol-1"));
    assert_eq!(s.profile.as_deref(), Some("fast"));
    assert_eq!(
        s.mount.as_ref().unwrap().root.as_deref(),
        Some("./csi/org.apache.mesos.csi.test/local/mounts")
    );
    assert_eq!(s.metadata.as_ref().unwrap().labels.len(), 1);
    // The plugin made 12 MB of the 10 asked: frameworks were given 10.
    assert_eq!(converted.scalar.unwrap().value, 10.0);

    // An import keeps the listed size whatever the record says.
    let pre = preexisting(3, "vol-2", None);
    let plan = planned(pre, SourceType::Block, Some("raw"));
    let volume = VolumeInfo {
        id: VolumeId::new("vol-2"),
        capacity_bytes: (5 * MB) as i64,
        volume_context: BTreeMap::new(),
    };
    let converted = create_disk_conversion(&ctx, &plan, &volume).converted;
    let converted = &converted.as_slice()[0];
    assert_eq!(converted.scalar.unwrap().value, 3.0);
    let s = converted.disk.as_ref().unwrap().source.as_ref().unwrap();
    assert_eq!(s.r#type, SourceType::Block as i32);
    assert!(s.mount.is_none());
    assert_eq!(s.profile.as_deref(), Some("raw"));
}

/// Mesos's fixed point (`llround(value * 1000)`), in which a master compares sizes.
fn fixed(value: f64) -> i64 {
    (value * 1000.0).round() as i64
}

/// A master aborts when a FINISHED conversion is smaller than what it consumed. On a
/// rounding edge, 1.0015 MB is 1002 in fixed point, but the 1,050,148 bytes asked for
/// (and echoed back by the plugin) are 1001; a plugin that makes less than asked is
/// the plain case.
#[test]
fn a_created_disk_is_never_smaller_than_what_it_consumed() {
    let ctx = ctx();
    let mut source = pool(1, "fast");
    source.scalar = Some(slrp_proto::mesos::v1::value::Scalar { value: 1.0015 });
    let plan = planned(source.clone(), SourceType::Mount, None);
    let DiskRequest::Create(request) = &plan.request else {
        panic!("a pool makes a CreateVolume");
    };
    assert_eq!(request.required_bytes, 1_050_148);
    for created in [request.required_bytes, 1_048_576, 1] {
        let volume = VolumeInfo {
            id: VolumeId::new("vol-1"),
            capacity_bytes: created,
            volume_context: BTreeMap::new(),
        };
        let conversion = create_disk_conversion(&ctx, &plan, &volume);
        let converted = conversion.converted.as_slice()[0].scalar.unwrap().value;
        assert_eq!(fixed(converted), fixed(1.0015), "created {created} bytes");
    }
}

// --- DESTROY_DISK -----------------------------------------------------------------

#[test]
fn destroy_disk_targets_the_volume_id() {
    let source = allocated(disk(SourceType::Mount, "vol-9"));
    let (id, carried) = text(destroy_disk_target(&destroy_disk_op(source.clone()))).unwrap();
    assert_eq!(id, VolumeId::new("vol-9"));
    assert_eq!(carried, source);
    let pre = preexisting(1, "pre", None);
    assert_eq!(
        text(destroy_disk_target(&destroy_disk_op(pre))).unwrap().0,
        VolumeId::new("pre")
    );
}

#[test]
fn destroy_disk_refusals_carry_the_master_texts() {
    let pv = persistent(disk(SourceType::Mount, "v"), "pv");
    let cases = [
        (
            destroy_disk_op(pool(1, "fast")),
            "'source' is not backed by a CSI volume".to_owned(),
        ),
        (
            destroy_disk_op(disk(SourceType::Path, "v")),
            "'source' is neither a MOUNT, BLOCK or RAW disk resource".to_owned(),
        ),
        (
            destroy_disk_op(pv.clone()),
            format!(
                "A disk resource containing a persistent volume {} cannot be destroyed \
                 directly. Please destroy the persistent volume first then destroy the \
                 disk resource",
                DisplayResource(&pv)
            ),
        ),
        (
            op(OperationType::DestroyDisk),
            "DESTROY_DISK operation without 'destroy_disk'".to_owned(),
        ),
    ];
    for (info, message) in cases {
        assert_eq!(text(destroy_disk_target(&info)).unwrap_err(), message);
    }
}

#[test]
fn destroying_a_disk_of_a_vanished_profile_asks_for_a_reconciliation() {
    let ctx = ctx();
    let source = disk(SourceType::Mount, "v");
    let known = destroy_disk_conversion(&ctx, &source, true, &profiles());
    assert!(!known.reconcile_pools);
    assert_eq!(
        known.conversion.converted,
        Resources::from(pool(64, "fast"))
    );
    let gone = destroy_disk_conversion(&ctx, &source, true, &BTreeMap::new());
    assert!(gone.reconcile_pools);
    assert!(gone.conversion.converted.is_empty());
}

fn of_type(t: OperationType) -> offer::Operation {
    offer::Operation {
        r#type: Some(t as i32),
        ..Default::default()
    }
}

#[test]
fn kinds_follow_the_type_field() {
    let cases = [
        (
            OperationType::Reserve,
            OperationKind::Reserve,
            Some("reserve"),
            true,
        ),
        (
            OperationType::Unreserve,
            OperationKind::Unreserve,
            Some("unreserve"),
            true,
        ),
        (
            OperationType::Create,
            OperationKind::Create,
            Some("create"),
            true,
        ),
        (
            OperationType::Destroy,
            OperationKind::Destroy,
            Some("destroy"),
            true,
        ),
        (
            OperationType::CreateDisk,
            OperationKind::CreateDisk,
            Some("create_disk"),
            false,
        ),
        (
            OperationType::DestroyDisk,
            OperationKind::DestroyDisk,
            Some("destroy_disk"),
            false,
        ),
        (
            OperationType::GrowVolume,
            OperationKind::Unsupported,
            None,
            false,
        ),
        (
            OperationType::ShrinkVolume,
            OperationKind::Unsupported,
            None,
            false,
        ),
        (
            OperationType::Launch,
            OperationKind::Unsupported,
            None,
            false,
        ),
        (
            OperationType::LaunchGroup,
            OperationKind::Unsupported,
            None,
            false,
        ),
        (
            OperationType::Unknown,
            OperationKind::Unsupported,
            None,
            false,
        ),
    ];
    for (t, kind, name, speculative) in cases {
        let got = OperationKind::of(&of_type(t));
        assert_eq!(got, kind, "{t:?}");
        assert_eq!(got.metric_name(), name, "{t:?}");
        assert_eq!(got.is_speculative(), speculative, "{t:?}");
    }
}

#[test]
fn absent_or_unknown_type_numbers_are_unsupported() {
    assert_eq!(
        OperationKind::of(&offer::Operation::default()),
        OperationKind::Unsupported
    );
    let odd = offer::Operation {
        r#type: Some(99),
        ..Default::default()
    };
    assert_eq!(OperationKind::of(&odd), OperationKind::Unsupported);
}

#[test]
fn every_counted_kind_has_a_distinct_metric_name() {
    let names: std::collections::BTreeSet<_> = OperationKind::COUNTED
        .iter()
        .map(|k| k.metric_name().expect("counted kinds are named"))
        .collect();
    assert_eq!(names.len(), OperationKind::COUNTED.len());
    assert!(!OperationKind::COUNTED.contains(&OperationKind::Unsupported));
}

// --- statuses ---------------------------------------------------------------------

fn tracked(info: offer::Operation) -> TrackedOperation {
    TrackedOperation::pending(
        uuid::Uuid::from_u128(9),
        None,
        info,
        &AgentId {
            value: "old-agent".to_owned(),
        },
        &ResourceProviderId {
            value: "rp".to_owned(),
        },
    )
}

#[test]
fn terminal_statuses_carry_ids_and_a_fresh_uuid() {
    let agent = AgentId {
        value: "agent".to_owned(),
    };
    let mut info = create_op(vec![persistent(disk(SourceType::Mount, "v"), "pv")]);
    info.id = Some(slrp_proto::mesos::v1::OperationId {
        value: "op-1".to_owned(),
    });
    let create = tracked(info);
    let converted = Resources::from(allocated(disk(SourceType::Mount, "v")));
    let finished = finished_status(&create, &converted, &agent);
    assert_eq!(finished.state, OperationState::OperationFinished as i32);
    assert_eq!(finished.operation_id.as_ref().unwrap().value, "op-1");
    assert_eq!(finished.message, None);
    assert_eq!(finished.converted_resources, converted.to_vec());
    assert_eq!(finished.agent_id.as_ref(), Some(&agent));
    assert_eq!(finished.resource_provider_id.as_ref().unwrap().value, "rp");
    let again = finished_status(&create, &converted, &agent);
    assert!(finished.uuid.is_some());
    assert_ne!(finished.uuid, again.uuid);

    let failed = failed_status(&create, "Profile 'x' not found", &agent);
    assert_eq!(failed.state, OperationState::OperationFailed as i32);
    assert_eq!(failed.message.as_deref(), Some("Profile 'x' not found"));
    assert!(failed.converted_resources.is_empty());
    assert!(failed.uuid.is_some());

    let dropped = dropped_status(&tracked(op(OperationType::GrowVolume)), "no", &agent);
    assert_eq!(dropped.state, OperationState::OperationDropped as i32);
    assert_eq!(dropped.operation_id, None);
    assert_eq!(dropped.message.as_deref(), Some("no"));
    assert!(dropped.uuid.is_some());
}

#[test]
fn the_reconciliation_answer_is_unreliable_and_anonymous() {
    let status = unknown_operation_status(
        &AgentId {
            value: "a".to_owned(),
        },
        &ResourceProviderId {
            value: "rp".to_owned(),
        },
    );
    assert_eq!(status.state, OperationState::OperationDropped as i32);
    assert_eq!(status.message.as_deref(), Some("Unknown operation"));
    assert_eq!(status.uuid, None);
    assert_eq!(status.operation_id, None);
    assert_eq!(status.agent_id.unwrap().value, "a");
    assert_eq!(status.resource_provider_id.unwrap().value, "rp");
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    fn with_roles(mut r: Resource, roles: &[String]) -> Resource {
        let mut path = String::new();
        for role in roles {
            path = if path.is_empty() {
                role.clone()
            } else {
                format!("{path}/{role}")
            };
            r = reserved(r, &path);
        }
        r
    }

    /// `total` after the speculative operation `info`.
    fn run(total: &Resources, info: &offer::Operation) -> Resources {
        text(apply_conversions(
            total,
            info,
            &speculative_conversions(info).unwrap(),
        ))
        .unwrap()
    }

    proptest! {
        /// RESERVE pushing one reservation and UNRESERVE of the result cancel out, and
        /// so do CREATE and DESTROY of a persistent volume, whatever else the total
        /// holds.
        #[test]
        fn speculative_operations_undo_each_other(
            mb in 1u64..10_000,
            other_mb in 0u64..10_000,
            roles in proptest::collection::vec("[a-z]{1,4}", 0..3),
            role in "[a-z]{1,4}",
            pid in "[a-z0-9]{1,8}",
        ) {
            let base = with_roles(pool(mb, "fast"), &roles);
            let total: Resources =
                [base.clone(), pool(other_mb, "slow"), disk(SourceType::Mount, "m")]
                    .into_iter()
                    .collect();
            let mut path = roles.join("/");
            path = if path.is_empty() { role } else { format!("{path}/{role}") };
            let pushed = reserved(base, &path);
            let reserve = reserve_op(vec![], vec![allocated(pushed.clone())]);
            let after = run(&total, &reserve);
            prop_assert!(after != total);
            let unreserve = unreserve_op(vec![pushed]);
            let back = run(&after, &unreserve);
            prop_assert_eq!(&back, &total);

            let volume = persistent(disk(SourceType::Mount, "m"), &pid);
            let create = create_op(vec![volume.clone()]);
            let created = run(&total, &create);
            prop_assert!(created.contains(&Resources::from(volume.clone())));
            let destroy = destroy_op(vec![volume]);
            let destroyed = run(&created, &destroy);
            prop_assert_eq!(&destroyed, &total);
        }
    }
}

/// The FAILED message of a result: the tests compare Mesos's texts.
fn text<T>(result: Result<T, OperationError>) -> Result<T, String> {
    result.map_err(|e| e.to_string())
}
