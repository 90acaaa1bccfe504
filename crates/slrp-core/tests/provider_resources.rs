//! The provider's resource arithmetic (spec §6, §7.3) as tables, plus the Mesos provider
//! test scenarios that are pure arithmetic (spec §11.1: RecoverDuplicatedVolumes,
//! RecoverDiskWithChangedMetadata, ProfileAppeared, ProfileDisappeared) and properties of
//! the `Resources` algebra.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test")]

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use slrp_core::provider::resources::{
    Conversion, CreatedKind, CreatedVolume, ProfileChange, ProviderResources, ResourceError,
    Resources, labels_from_context, pool_profile_changes, pool_profiles, pools_without_profile,
    resource_eq,
};
use slrp_csi::{Volume, VolumeId};
use slrp_proto::mesos::v1::resource::ReservationInfo;
use slrp_proto::mesos::v1::resource::disk_info::source::Type as SourceType;
use slrp_proto::mesos::v1::resource::disk_info::{Persistence, Source};
use slrp_proto::mesos::v1::resource::reservation_info::Type as ReservationType;
use slrp_proto::mesos::v1::{Label, Labels, Resource, ResourceProviderId};

const MB: u64 = 1_048_576;
const GB: u64 = 1024 * MB;

fn reservation(kind: ReservationType, role: &str) -> ReservationInfo {
    ReservationInfo {
        r#type: Some(kind as i32),
        role: Some(role.to_owned()),
        principal: None,
        labels: None,
    }
}

fn provider_with(default_reservations: Vec<ReservationInfo>) -> ProviderResources {
    ProviderResources::new(
        ResourceProviderId {
            value: "rp-1".to_owned(),
        },
        "org.apache.mesos.csi.test",
        "local",
        default_reservations,
    )
    .unwrap()
}

fn provider() -> ProviderResources {
    provider_with(vec![reservation(ReservationType::Dynamic, "storage")])
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    Labels {
        labels: pairs
            .iter()
            .map(|(k, v)| Label {
                key: (*k).to_owned(),
                value: Some((*v).to_owned()),
            })
            .collect(),
    }
}

fn pool(p: &ProviderResources, profile: &str, bytes: u64) -> Resource {
    p.raw_disk(bytes, Some(profile), None, None)
}

fn volume(p: &ProviderResources, id: &str, bytes: u64, profile: Option<&str>) -> Resource {
    p.raw_disk(bytes, profile, Some(id), None)
}

/// RESERVE: push a refinement for role `storage/fw`.
fn refined(mut r: Resource) -> Resource {
    r.reservations
        .push(reservation(ReservationType::Dynamic, "storage/fw"));
    r
}

/// CREATE_DISK(MOUNT) result shape.
fn mounted(p: &ProviderResources, mut r: Resource) -> Resource {
    let source = r.disk.as_mut().unwrap().source.as_mut().unwrap();
    source.r#type = SourceType::Mount as i32;
    source.mount = Some(p.mount_source());
    r
}

fn persistent(mut r: Resource) -> Resource {
    r.disk.as_mut().unwrap().persistence = Some(Persistence {
        id: "pv".to_owned(),
        principal: None,
    });
    r
}

fn with_metadata(mut r: Resource, md: Option<Labels>) -> Resource {
    r.disk.as_mut().unwrap().source.as_mut().unwrap().metadata = md;
    r
}

fn res(all: &[Resource]) -> Resources {
    all.iter().collect()
}

fn one(r: &Resource) -> Resources {
    Resources::from(r.clone())
}

fn listed(id: &str, bytes: u64, context: &[(&str, &str)]) -> Volume {
    Volume {
        volume_id: VolumeId::new(id),
        capacity_bytes: i64::try_from(bytes).unwrap(),
        volume_context: context
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<BTreeMap<_, _>>(),
    }
}

fn src(r: &Resource) -> &Source {
    r.disk.as_ref().unwrap().source.as_ref().unwrap()
}

fn mb(r: &Resource) -> f64 {
    r.scalar.unwrap().value
}

// ---------------------------------------------------------------------------------------
// §6.1, §6.2, §6.8: shapes.

#[test]
fn raw_disk_has_the_mesos_shape() {
    let p = provider();
    let r = p.raw_disk(
        1536 * 1024,
        Some("fast"),
        Some("vol-1"),
        Some(labels(&[("k", "v")])),
    );
    assert_eq!(r.name, "disk");
    assert_eq!(mb(&r), 1.5, "bytes / 1048576, not rounded");
    assert_eq!(r.provider_id.as_ref().unwrap().value, "rp-1");
    assert_eq!(r.reservations, p.default_reservations());
    assert!(r.role.is_none() && r.reservation.is_none() && r.allocation_info.is_none());
    let disk = r.disk.as_ref().unwrap();
    assert!(disk.persistence.is_none() && disk.volume.is_none());
    let source = disk.source.as_ref().unwrap();
    assert_eq!(source.r#type, SourceType::Raw as i32);
    assert_eq!(
        source.vendor.as_deref(),
        Some("org.apache.mesos.csi.test.local")
    );
    assert_eq!(source.profile.as_deref(), Some("fast"));
    assert_eq!(source.id.as_deref(), Some("vol-1"));
    assert!(source.mount.is_none() && source.path.is_none());
    assert_eq!(
        p.mount_root(),
        "./csi/org.apache.mesos.csi.test/local/mounts"
    );
}

#[test]
fn storage_pools_drop_zero_capacities() {
    let p = provider();
    let pools = p.storage_pools([("a", 4 * GB), ("b", 0), ("c", 1)]);
    let profiles: Vec<_> = pools.iter().map(|r| src(r).profile.clone()).collect();
    // One byte is below Mesos's 0.001 MB resolution: an empty resource as well.
    assert_eq!(profiles, vec![Some("a".to_owned())]);
    let r = &pools.as_slice()[0];
    assert_eq!(mb(r), 4096.0);
    assert!(src(r).id.is_none());
}

#[test]
fn context_rejects_what_mesos_would_misuse() {
    let id = ResourceProviderId { value: "x".into() };
    for (t, n) in [("a/b", "n"), ("t", ".."), ("", "n"), ("t", "")] {
        assert!(
            matches!(
                ProviderResources::new(id.clone(), t, n, vec![]),
                Err(ResourceError::BadPluginName { .. })
            ),
            "{t:?} {n:?}"
        );
    }
    let table: Vec<(Vec<ReservationInfo>, Option<usize>)> = vec![
        (vec![], None),
        (vec![reservation(ReservationType::Static, "a")], None),
        (
            vec![
                reservation(ReservationType::Static, "a"),
                reservation(ReservationType::Dynamic, "a/b"),
            ],
            None,
        ),
        (
            vec![
                reservation(ReservationType::Dynamic, "a"),
                reservation(ReservationType::Static, "a/b"),
            ],
            Some(1),
        ),
        (
            vec![
                reservation(ReservationType::Dynamic, "a"),
                reservation(ReservationType::Dynamic, "ab"),
            ],
            Some(1),
        ),
        (vec![reservation(ReservationType::Unknown, "a")], Some(0)),
        (vec![reservation(ReservationType::Dynamic, "*")], Some(0)),
        (vec![reservation(ReservationType::Dynamic, "a//b")], Some(0)),
        (vec![reservation(ReservationType::Dynamic, "a/-b")], Some(0)),
        (vec![reservation(ReservationType::Dynamic, "a b")], Some(0)),
        (vec![reservation(ReservationType::Dynamic, "/a")], Some(0)),
    ];
    for (stack, bad) in table {
        let got = ProviderResources::new(id.clone(), "t", "n", stack.clone());
        match (bad, got) {
            (None, Ok(_)) => {}
            (Some(i), Err(ResourceError::BadReservation { index, .. })) => {
                assert_eq!(index, i, "{stack:?}")
            }
            (want, got) => panic!("{stack:?}: want error at {want:?}, got {got:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------
// §6.9: the algebra.

#[test]
fn pools_merge_and_split_but_volumes_are_indivisible() {
    let p = provider();
    let a = res(&[pool(&p, "x", GB), pool(&p, "x", GB), pool(&p, "y", GB)]);
    assert_eq!(a.len(), 2, "same pool merges, other profile does not");
    assert_eq!(mb(&a.as_slice()[0]), 2048.0);

    let left = a.clone() - &res(&[pool(&p, "x", 512 * MB)]);
    assert_eq!(mb(&left.as_slice()[0]), 1536.0);

    let v = volume(&p, "v", GB, None);
    let vols = res(&[v.clone(), v.clone()]);
    assert_eq!(vols.len(), 2, "disks with an id are never merged");
    let half = volume(&p, "v", 512 * MB, None);
    assert!(!vols.contains(&one(&half)), "no part of a volume");
    assert_eq!(
        (vols.clone() - &res(&[half])).len(),
        2,
        "subtracting a part takes nothing"
    );
    assert_eq!((vols - &res(&[v])).len(), 1, "one identical copy goes");

    let m = mounted(&p, volume(&p, "m", GB, None));
    assert!(!one(&m).contains(&res(&[volume(&p, "m", GB, None)])));
    assert!(res(&[m.clone(), m.clone()]).len() == 2);
    let pv = persistent(pool(&p, "x", GB));
    assert_eq!(
        res(&[pv.clone(), pv]).len(),
        2,
        "persistent volumes never merge"
    );
}

#[test]
fn scalars_compare_at_three_decimals() {
    let p = provider();
    let mut a = pool(&p, "x", GB);
    let mut b = a.clone();
    a.scalar.as_mut().unwrap().value = 1.0004;
    b.scalar.as_mut().unwrap().value = 1.0;
    assert!(resource_eq(&a, &b));
    b.scalar.as_mut().unwrap().value = 1.0006;
    assert!(!resource_eq(&a, &b));
    a.scalar.as_mut().unwrap().value = 0.0004;
    assert!(res(&[a]).is_empty(), "below 0.0005 MB is empty");
    // Merging rounds to 0.001, as Mesos's fixed-point addition does.
    let mut c = pool(&p, "x", GB);
    c.scalar.as_mut().unwrap().value = 0.1234;
    let sum = res(&[c.clone(), c]);
    assert_eq!(mb(&sum.as_slice()[0]), 0.246);
}

#[test]
fn metadata_and_reservation_labels_compare_order_insensitively() {
    let p = provider();
    let a = with_metadata(
        volume(&p, "v", GB, None),
        Some(labels(&[("a", "1"), ("b", "2")])),
    );
    let b = with_metadata(
        volume(&p, "v", GB, None),
        Some(labels(&[("b", "2"), ("a", "1")])),
    );
    let c = with_metadata(
        volume(&p, "v", GB, None),
        Some(labels(&[("a", "1"), ("b", "3")])),
    );
    assert!(resource_eq(&a, &b));
    assert!(!resource_eq(&a, &c));
    // A multiset comparison (Mesos's "each left label is somewhere on the right" calls
    // these two equal).
    let aab = labels(&[("a", "1"), ("a", "1"), ("b", "2")]);
    let abb = labels(&[("a", "1"), ("b", "2"), ("b", "2")]);
    assert!(!resource_eq(
        &with_metadata(volume(&p, "v", GB, None), Some(aab)),
        &with_metadata(volume(&p, "v", GB, None), Some(abb)),
    ));
    // `disk.volume` is how a task uses a disk, not what it is: ignored.
    let mut d = a.clone();
    d.disk.as_mut().unwrap().volume = Some(Default::default());
    assert!(resource_eq(&a, &d));
    // Absent and empty metadata are different resources (has_metadata).
    let e = with_metadata(volume(&p, "v", GB, None), Some(Labels::default()));
    assert!(!resource_eq(&volume(&p, "v", GB, None), &e));
}

#[test]
fn apply_fails_when_the_total_lacks_what_is_consumed() {
    let p = provider();
    let total = res(&[pool(&p, "x", GB)]);
    let conversion = Conversion {
        consumed: res(&[pool(&p, "x", 2 * GB)]),
        converted: res(&[volume(&p, "v", 2 * GB, Some("x"))]),
    };
    let err = total.apply(&conversion).unwrap_err();
    assert!(matches!(err, ResourceError::NotContained { .. }));
    assert!(err.to_string().contains("do not contain"), "{err}");

    let ok = Conversion {
        consumed: res(&[pool(&p, "x", GB)]),
        converted: res(&[volume(&p, "v", GB, Some("x"))]),
    };
    assert_eq!(
        total.apply(&ok).unwrap(),
        res(&[volume(&p, "v", GB, Some("x"))])
    );
}

fn arb_pool() -> impl Strategy<Value = Resource> {
    (0usize..3, 1u64..100_000, any::<bool>()).prop_map(|(profile, kb, refine)| {
        let p = provider();
        let r = p.raw_disk(kb * 1024, Some(["a", "b", "c"][profile]), None, None);
        if refine { refined(r) } else { r }
    })
}

fn arb_resource() -> impl Strategy<Value = Resource> {
    prop_oneof![
        arb_pool(),
        (0usize..3, 1u64..4, any::<bool>()).prop_map(|(id, gb, mount)| {
            let p = provider();
            let v = volume(&p, ["v1", "v2", "v3"][id], gb * GB, Some("a"));
            if mount { mounted(&p, v) } else { v }
        }),
    ]
}

proptest! {
    #[test]
    fn adding_then_subtracting_gives_back_the_start(
        a in prop::collection::vec(arb_resource(), 0..8),
        b in prop::collection::vec(arb_resource(), 0..8),
    ) {
        let (a, b) = (res(&a), res(&b));
        let sum = a.clone() + &b;
        prop_assert!(sum.contains(&a));
        prop_assert!(sum.contains(&b));
        prop_assert_eq!(sum.clone() - &b, a.clone());
        prop_assert_eq!(sum, b + &a, "addition commutes");
    }

    #[test]
    fn contains_is_subtracting_without_shortfall(
        a in prop::collection::vec(arb_resource(), 0..8),
        b in prop::collection::vec(arb_resource(), 0..4),
    ) {
        let (a, b) = (res(&a), res(&b));
        if a.contains(&b) {
            prop_assert_eq!((a.clone() - &b) + &b, a);
        } else {
            // Something of b is not taken out of a in full: what is left of b after
            // taking a out of it is not empty.
            prop_assert!(!(b.clone() - &a).is_empty());
        }
    }

    #[test]
    fn entry_order_does_not_matter(mut a in prop::collection::vec(arb_resource(), 0..8)) {
        let forward = res(&a);
        a.reverse();
        prop_assert_eq!(forward, res(&a));
    }
}

// ---------------------------------------------------------------------------------------
// §6.4: computeConversion as a table.

struct Case {
    name: &'static str,
    checkpointed: Vec<Resource>,
    discovered: Vec<Resource>,
    consumed: Vec<Resource>,
    converted: Vec<Resource>,
    missing: usize,
}

#[test]
fn compute_conversion_table() {
    let p = provider();
    let v = |id, gb| volume(&p, id, gb * GB, Some("a"));
    let cases = vec![
        Case {
            name: "unchanged pool",
            checkpointed: vec![pool(&p, "a", 4 * GB)],
            discovered: vec![pool(&p, "a", 4 * GB)],
            consumed: vec![],
            converted: vec![],
            missing: 0,
        },
        Case {
            name: "pool grew: the delta is added",
            checkpointed: vec![pool(&p, "a", 4 * GB)],
            discovered: vec![pool(&p, "a", 6 * GB)],
            consumed: vec![],
            converted: vec![pool(&p, "a", 2 * GB)],
            missing: 0,
        },
        Case {
            name: "unconverted pool shrank: replaced",
            checkpointed: vec![pool(&p, "a", 4 * GB)],
            discovered: vec![pool(&p, "a", 3 * GB)],
            consumed: vec![pool(&p, "a", 4 * GB)],
            converted: vec![pool(&p, "a", 3 * GB)],
            missing: 0,
        },
        Case {
            name: "unconverted pool gone: removed",
            checkpointed: vec![pool(&p, "a", 4 * GB)],
            discovered: vec![],
            consumed: vec![pool(&p, "a", 4 * GB)],
            converted: vec![],
            missing: 0,
        },
        Case {
            name: "a reserved part of a pool still reported: nothing changes",
            checkpointed: vec![pool(&p, "a", 3 * GB), refined(pool(&p, "a", GB))],
            discovered: vec![pool(&p, "a", 4 * GB)],
            consumed: vec![],
            converted: vec![],
            missing: 0,
        },
        Case {
            name: "a reserved pool gone: kept",
            checkpointed: vec![refined(pool(&p, "a", GB))],
            discovered: vec![],
            consumed: vec![],
            converted: vec![],
            missing: 1,
        },
        Case {
            name: "MOUNT disk still listed: nothing changes",
            checkpointed: vec![mounted(&p, v("v1", 2))],
            discovered: vec![volume(&p, "v1", 2 * GB, Some("a"))],
            consumed: vec![],
            converted: vec![],
            missing: 0,
        },
        Case {
            name: "MOUNT disk gone: kept",
            checkpointed: vec![mounted(&p, v("v1", 2))],
            discovered: vec![],
            consumed: vec![],
            converted: vec![],
            missing: 1,
        },
        Case {
            name: "persistent volume gone: kept",
            checkpointed: vec![persistent(mounted(&p, v("v1", 2)))],
            discovered: vec![],
            consumed: vec![],
            converted: vec![],
            missing: 1,
        },
        Case {
            name: "RAW volume gone: removed",
            checkpointed: vec![v("v1", 2)],
            discovered: vec![],
            consumed: vec![v("v1", 2)],
            converted: vec![],
            missing: 0,
        },
        Case {
            name: "new volume: added",
            checkpointed: vec![],
            discovered: vec![volume(&p, "v9", GB, None)],
            consumed: vec![],
            converted: vec![volume(&p, "v9", GB, None)],
            missing: 0,
        },
        Case {
            name: "RAW volume changed size: replaced",
            checkpointed: vec![v("v1", 2)],
            discovered: vec![v("v1", 3)],
            consumed: vec![v("v1", 2)],
            converted: vec![v("v1", 3)],
            missing: 0,
        },
        Case {
            name: "MOUNT disk changed size: kept, and the new size appears as RAW",
            checkpointed: vec![mounted(&p, v("v1", 2))],
            discovered: vec![v("v1", 3)],
            consumed: vec![],
            converted: vec![v("v1", 3)],
            missing: 1,
        },
    ];
    for case in cases {
        let got = p.compute_conversion(&res(&case.checkpointed), &res(&case.discovered));
        assert_eq!(
            got.conversion.consumed,
            res(&case.consumed),
            "{}: consumed",
            case.name
        );
        assert_eq!(
            got.conversion.converted,
            res(&case.converted),
            "{}: converted",
            case.name
        );
        assert_eq!(got.missing_converted.len(), case.missing, "{}", case.name);
        // Applying the conversion to the checkpointed resources always works.
        res(&case.checkpointed).apply(&got.conversion).unwrap();
    }
}

/// Changing `default_reservations` of an existing provider (§6.7, §12 item 32). Spec
/// §6.7 says unconverted resources get duplicated; what the arithmetic of Mesos actually
/// does (and this reproduces) is: a resource the plugin still reports keeps its *old*
/// reservations (its unconverted form under the new defaults is found among the
/// discovered ones), growth comes under the new defaults, and a resource the plugin no
/// longer reports looks converted and is kept for good.
#[test]
fn changing_default_reservations_keeps_the_old_ones() {
    let old = provider();
    let new = provider_with(vec![reservation(ReservationType::Dynamic, "other")]);
    let total = res(&[pool(&old, "a", 4 * GB), pool(&old, "b", GB)]);
    let discovered = new.storage_pools([("a", 6 * GB)]);
    let got = new.reconcile_pools(&total, &discovered, &Resources::new());
    assert_eq!(got.missing_converted, vec![pool(&old, "b", GB)]);
    let after = total.apply(&got.conversion).unwrap();
    assert_eq!(
        after,
        res(&[
            pool(&old, "a", 4 * GB),
            pool(&old, "b", GB),
            pool(&new, "a", 2 * GB)
        ])
    );
}

// ---------------------------------------------------------------------------------------
// §6.3: existing volumes: duplicates, drift, profiles.

fn reconcile(
    p: &ProviderResources,
    total: &Resources,
    listing: &[Volume],
    capacities: &[(&str, u64)],
) -> Resources {
    let volumes = p.existing_volumes(total, listing).unwrap();
    let pools = p.reconcile_pools(
        total,
        &p.storage_pools(capacities.iter().copied()),
        &Resources::new(),
    );
    p.reconcile(total, &volumes, &pools)
        .unwrap()
        .total
        .unwrap_or_else(|| total.clone())
}

/// Mesos RecoverDuplicatedVolumes (MESOS-9965): the plugin lists one 2 GB volume twice;
/// the provider exposes a single 2 GB disk, and a total that already holds it twice is
/// cleaned up.
#[test]
fn recover_duplicated_volumes() {
    let p = provider();
    let listing = [listed("v1", 2 * GB, &[]), listed("v1", 2 * GB, &[])];
    let first = reconcile(&p, &Resources::new(), &listing, &[]);
    assert_eq!(first, res(&[volume(&p, "v1", 2 * GB, None)]));
    let got = p.existing_volumes(&Resources::new(), &listing).unwrap();
    assert_eq!(got.repeated_in_listing, vec!["v1".to_owned()]);

    // A total with the volume twice (as a Mesos provider before the fix checkpointed it).
    let v = volume(&p, "v1", 2 * GB, None);
    let doubled = res(&[v.clone(), v.clone()]);
    assert_eq!(doubled.len(), 2);
    let got = p.existing_volumes(&doubled, &listing).unwrap();
    assert_eq!(got.duplicates, vec![v.clone()]);
    assert_eq!(reconcile(&p, &doubled, &listing, &[]), res(&[v]));

    // A converted copy and a RAW duplicate: the first is kept, the later one removed.
    let m = mounted(&p, volume(&p, "v1", 2 * GB, None));
    let mixed = res(&[m.clone(), volume(&p, "v1", 2 * GB, None)]);
    assert_eq!(reconcile(&p, &mixed, &listing, &[]), res(&[m]));
}

/// Mesos RecoverDiskWithChangedMetadata (MESOS-9395): created with `label=foo`, listed
/// with `label=bar` after a restart: exactly one MOUNT disk, with the new metadata, its
/// conversions (MOUNT, refined reservation) intact.
#[test]
fn recover_disk_with_changed_metadata() {
    let p = provider();
    let created = refined(mounted(
        &p,
        p.raw_disk(
            2 * GB,
            Some("a"),
            Some("v1"),
            Some(labels(&[("label", "foo")])),
        ),
    ));
    let total = one(&created);
    let listing = [listed("v1", 2 * GB, &[("label", "bar")])];
    let got = p.existing_volumes(&total, &listing).unwrap();
    assert_eq!(got.drifted, vec!["v1".to_owned()]);
    assert!(got.merge.conversion.is_noop(), "{:?}", got.merge);
    let after = reconcile(&p, &total, &listing, &[]);
    let expected = with_metadata(created.clone(), Some(labels(&[("label", "bar")])));
    assert_eq!(after, res(&[expected]));

    // The context emptied: the metadata is cleared, not set to empty labels.
    let cleared = reconcile(&p, &total, &[listed("v1", 2 * GB, &[])], &[]);
    assert_eq!(cleared, res(&[with_metadata(created.clone(), None)]));

    // Reordered labels are no drift.
    let two = with_metadata(created, Some(labels(&[("a", "1"), ("b", "2")])));
    let total = one(&two);
    let got = p
        .existing_volumes(&total, &[listed("v1", 2 * GB, &[("b", "2"), ("a", "1")])])
        .unwrap();
    assert!(got.drifted.is_empty() && got.cleanup.is_noop());
}

/// Name, total, listing, total after the volume conversions.
type VolumeCase = (&'static str, Vec<Resource>, Vec<Volume>, Vec<Resource>);

#[test]
fn existing_volumes_table() {
    let p = provider();
    let raw_a = volume(&p, "v1", 2 * GB, Some("a"));
    let cases: Vec<VolumeCase> = vec![
        (
            "a listed volume inherits the checkpointed profile",
            vec![raw_a.clone()],
            vec![listed("v1", 2 * GB, &[])],
            vec![raw_a.clone()],
        ),
        (
            "an unknown volume comes without profile, with its context",
            vec![],
            vec![listed("v2", GB, &[("k", "v")])],
            vec![p.raw_disk(GB, None, Some("v2"), Some(labels(&[("k", "v")])))],
        ),
        (
            "a RAW volume that vanished goes",
            vec![raw_a.clone()],
            vec![],
            vec![],
        ),
        (
            "a MOUNT disk that vanished stays",
            vec![mounted(&p, raw_a.clone())],
            vec![],
            vec![mounted(&p, raw_a.clone())],
        ),
        (
            "a volume of unknown (0) capacity is not discovered",
            vec![],
            vec![listed("v3", 0, &[])],
            vec![],
        ),
        (
            "pools are left to the pool reconciliation",
            vec![pool(&p, "a", GB)],
            vec![],
            vec![pool(&p, "a", GB)],
        ),
    ];
    for (name, total, listing, expected) in cases {
        let total = res(&total);
        let v = p.existing_volumes(&total, &listing).unwrap();
        let after = total.apply_all([&v.cleanup, &v.merge.conversion]).unwrap();
        assert_eq!(after, res(&expected), "{name}");
    }
}

// ---------------------------------------------------------------------------------------
// §6.5 reconciliation, §7.3 profiles.

/// Mesos ProfileAppeared at the arithmetic level: no profiles, nothing reported; a
/// profile appears; its pool is added.
#[test]
fn profile_appeared() {
    let p = provider();
    let change = ProfileChange::between([], &BTreeSet::from(["test".to_owned()]));
    assert_eq!(change.to_translate, vec!["test".to_owned()]);
    let empty = Resources::new();
    let none = p.reconcile(
        &empty,
        &p.existing_volumes(&empty, &[]).unwrap(),
        &p.reconcile_pools(&empty, &p.storage_pools([]), &empty),
    );
    assert!(!none.unwrap().changed, "NoResource: nothing to report");
    let got = p
        .reconcile(
            &empty,
            &p.existing_volumes(&empty, &[]).unwrap(),
            &p.reconcile_pools(&empty, &p.storage_pools([("test", 4 * GB)]), &empty),
        )
        .unwrap();
    assert!(got.changed);
    assert_eq!(got.added, res(&[pool(&p, "test", 4 * GB)]));
    assert!(got.removed.is_empty());
}

/// Mesos ProfileDisappeared at the arithmetic level: a 2 GB MOUNT disk was created from
/// the 4 GB `test1` pool; the profiles switch to `test2`: the remaining `test1` pool goes,
/// the disk keeps its vanished profile, the `test2` pool appears.
#[test]
fn profile_disappeared() {
    let p = provider();
    let disk = mounted(&p, volume(&p, "v1", 2 * GB, Some("test1")));
    let total = res(&[pool(&p, "test1", 2 * GB), disk.clone()]);
    let change = ProfileChange::between(["test1"], &BTreeSet::from(["test2".to_owned()]));
    assert_eq!(change.removed, vec!["test1".to_owned()]);
    assert_eq!(change.to_translate, vec!["test2".to_owned()]);
    let after = reconcile(
        &p,
        &total,
        &[listed("v1", 2 * GB, &[])],
        &[("test2", 2 * GB)],
    );
    assert_eq!(after, res(&[disk, pool(&p, "test2", 2 * GB)]));
    assert_eq!(pool_profiles(&after), BTreeSet::from(["test2".to_owned()]));
}

/// `pool_profile_changes` says for every touched pool's profile what a scan of the whole
/// total says (`pool_profiles`), on an indexed total: a pool partly consumed stays, the
/// last plain pool of a profile consumed while a refined one of it is left stays (found
/// by the scan, not the kind lookup), and the last pool of a profile consumed goes.
#[test]
fn pool_profile_changes_agree_with_a_scan_of_the_total() {
    let p = provider();
    let mut total = res(&[
        pool(&p, "a", 4 * GB),
        refined(pool(&p, "a", GB)),
        pool(&p, "b", GB),
    ]);
    for n in 0..20 {
        total.add(&mounted(&p, volume(&p, &format!("v{n}"), MB, Some("a"))));
    }
    let cases = [
        (pool(&p, "a", GB), vec![("a", true)]),
        (pool(&p, "a", 3 * GB), vec![("a", true)]),
        (pool(&p, "b", GB), vec![("b", false)]),
        (refined(pool(&p, "a", GB)), vec![("a", false)]),
    ];
    for (consumed, expected) in cases {
        let disk = mounted(&p, volume(&p, "new", 1, None));
        let conversion = Conversion {
            consumed: one(&consumed),
            converted: one(&disk),
        };
        total.apply_in_place(&conversion).unwrap();
        let touched = one(&consumed) + &one(&disk);
        let changes = pool_profile_changes(&total, &touched);
        let expected: BTreeMap<String, bool> = expected
            .into_iter()
            .map(|(name, present)| (name.to_owned(), present))
            .collect();
        assert_eq!(changes, expected, "after consuming {consumed:?}");
        let scanned = pool_profiles(&total);
        for (name, present) in &changes {
            assert_eq!(scanned.contains(name), *present, "profile {name}");
        }
    }
}

/// Spec §12 item 11: a converted pool outlives its profile; it is reported, not fatal.
#[test]
fn converted_pool_outlives_its_profile() {
    let p = provider();
    let reserved = refined(pool(&p, "old", GB));
    let total = one(&reserved);
    let after = reconcile(&p, &total, &[], &[("new", GB)]);
    let known = BTreeSet::from(["new".to_owned()]);
    assert_eq!(pools_without_profile(&after, &known), vec![&reserved]);
    assert_eq!(
        pool_profiles(&after),
        BTreeSet::from(["old".to_owned(), "new".to_owned()])
    );
}

/// "Capacity reported to the manager excludes volumes still being created": with 4 GB of
/// a 10 GB pool consumed by a pending CREATE_DISK, a plugin that already counts the new
/// volume reports 6 GB. Mesos's arithmetic shrinks the pool to 6 GB, and the operation's
/// conversion (consume 4 GB) then leaves only 2 GB free; worse, a plugin reporting less
/// than what is in flight leaves a total that cannot apply the operation at all (Mesos
/// aborts). Taking the in-flight part out of both sides never touches it.
#[test]
fn reconciliation_never_takes_space_of_pending_creates() {
    let p = provider();
    let total = res(&[pool(&p, "a", 10 * GB)]);
    let in_flight = res(&[pool(&p, "a", 4 * GB)]);
    let create = Conversion {
        consumed: in_flight.clone(),
        converted: res(&[mounted(&p, volume(&p, "v1", 4 * GB, Some("a")))]),
    };

    // The plugin reports less than is in flight (e.g. it reserved extra space).
    let discovered = p.storage_pools([("a", 3 * GB)]);
    let mesos = p.compute_conversion(&total.filter(|_| true), &discovered);
    let mesos_total = total.apply(&mesos.conversion).unwrap();
    assert!(mesos_total.apply(&create).is_err(), "the reference abort");

    let got = p.reconcile_pools(&total, &discovered, &in_flight);
    let after = total.apply(&got.conversion).unwrap();
    assert!(after.contains(&in_flight));
    // Free space offered: what the plugin reports minus what is in flight, never more.
    assert_eq!(after.clone() - &in_flight, Resources::new());
    let done = after.apply(&create).unwrap();
    assert_eq!(
        done, create.converted,
        "the pool is used up by the new disk"
    );

    // The plugin does not count the pending volume yet: 10 GB reported, 6 GB free.
    let got = p.reconcile_pools(&total, &p.storage_pools([("a", 10 * GB)]), &in_flight);
    assert!(got.conversion.is_noop());
    // It already does: 6 GB reported, 2 GB free until the create finishes (conservative).
    let got = p.reconcile_pools(&total, &p.storage_pools([("a", 6 * GB)]), &in_flight);
    let after = total.apply(&got.conversion).unwrap();
    assert_eq!(after.clone() - &in_flight, res(&[pool(&p, "a", 2 * GB)]));
}

// ---------------------------------------------------------------------------------------
// CREATE_DISK / DESTROY_DISK conversions (§5.4, §5.5, §6.8).

fn created<'a>(id: &'a str, context: &'a BTreeMap<String, String>) -> CreatedVolume<'a> {
    CreatedVolume {
        id,
        context,
        profile: "test",
    }
}

/// Mesos CreateDestroyDisk at the arithmetic level: RESERVE (refine) + CREATE_DISK(MOUNT)
/// on a 4 GB pool gives a MOUNT disk with the relative MOUNT root; DESTROY_DISK and
/// UNRESERVE give the original pool back.
#[test]
fn create_then_destroy_gives_the_pool_back() {
    let p = provider();
    let original = res(&[pool(&p, "test", 4 * GB)]);
    let reserved = refined(pool(&p, "test", 4 * GB));
    let reserve = Conversion {
        consumed: original.clone(),
        converted: one(&reserved),
    };
    let total = original.apply(&reserve).unwrap();

    let context = BTreeMap::from([("label".to_owned(), "foo".to_owned())]);
    let create = p.created_disk(&reserved, &created("v1", &context), CreatedKind::Mount);
    let total = total.apply(&create).unwrap();
    let disk = &total.as_slice()[0];
    let s = src(disk);
    assert_eq!(s.r#type, SourceType::Mount as i32);
    assert_eq!(
        s.mount.as_ref().unwrap().root.as_deref(),
        Some("./csi/org.apache.mesos.csi.test/local/mounts")
    );
    assert_eq!(
        (s.id.as_deref(), s.profile.as_deref()),
        (Some("v1"), Some("test"))
    );
    assert_eq!(s.metadata, Some(labels(&[("label", "foo")])));
    assert_eq!(
        disk.reservations, reserved.reservations,
        "reservations kept"
    );
    assert_eq!(mb(disk), 4096.0);

    let block = p.created_disk(
        &reserved,
        &created("v2", &BTreeMap::new()),
        CreatedKind::Block,
    );
    let b = &block.converted.as_slice()[0];
    assert_eq!(src(b).r#type, SourceType::Block as i32);
    assert!(src(b).mount.is_none() && src(b).metadata.is_none());

    let destroy = p.destroyed_disk(disk, true, |profile| profile == "test");
    assert!(!destroy.reconcile_pools);
    let total = total.apply(&destroy.conversion).unwrap();
    assert_eq!(total, one(&reserved));
    let unreserve = Conversion {
        consumed: one(&reserved),
        converted: original.clone(),
    };
    assert_eq!(total.apply(&unreserve).unwrap(), original);
}

/// Mesos ProfileDisappeared, second half: DESTROY_DISK of a disk whose profile is gone
/// finishes with empty converted resources and asks for a pool reconciliation.
#[test]
fn destroying_a_disk_of_a_vanished_profile_frees_nothing_until_reconciled() {
    let p = provider();
    let disk = mounted(&p, volume(&p, "v1", 2 * GB, Some("test1")));
    let got = p.destroyed_disk(&disk, true, |profile| profile == "test2");
    assert!(got.reconcile_pools);
    assert!(got.conversion.converted.is_empty());
    assert_eq!(got.conversion.consumed, one(&disk));

    // Without DeleteVolume the volume stays: RAW, with its id, without profile.
    let kept = p.destroyed_disk(&disk, false, |_| true);
    assert!(!kept.reconcile_pools);
    let raw = &kept.conversion.converted.to_vec()[0];
    assert_eq!(raw, &volume(&p, "v1", 2 * GB, None));
}

/// A plugin that rounds sizes (spec §12 item 28) lists a volume larger than the disk
/// created from it; the disk keeps the consumed size (a Mesos master aborts on a
/// conversion that shrinks and so must be given the same quantity back), and the listing
/// of that known id is the same disk: nothing is added, nothing is kept as missing.
#[test]
fn a_created_disk_keeps_its_size_when_the_plugin_lists_another() {
    let p = provider();
    let requested = pool(&p, "test", GB);
    let context = BTreeMap::new();
    let create = p.created_disk(&requested, &created("v1", &context), CreatedKind::Mount);
    assert_eq!(mb(&create.converted.as_slice()[0]), 1024.0);
    let total = one(&requested).apply(&create).unwrap();
    for listed_bytes in [GB + 4 * MB, GB - 4 * MB, GB] {
        let got = p
            .existing_volumes(&total, &[listed("v1", listed_bytes, &[])])
            .unwrap();
        assert!(
            got.merge.conversion.is_noop(),
            "{listed_bytes}: {:?}",
            got.merge
        );
        assert!(got.merge.missing_converted.is_empty(), "{listed_bytes}");
    }
    // A volume the total does not know takes the listed size.
    let got = p
        .existing_volumes(&total, &[listed("v2", GB + 4 * MB, &[])])
        .unwrap();
    assert_eq!(
        got.merge.conversion.converted,
        one(&volume(&p, "v2", GB + 4 * MB, None))
    );
}

/// `slrp ctl expand-disk` (issue #24): a grown disk keeps everything but its size (kind,
/// mount, profile, reservations), the pool shrinks by GetCapacity's answer, and the
/// reconciliation after it (the plugin listing the larger size) changes nothing more.
#[test]
fn a_grown_disk_keeps_its_kind_and_the_reconciliation_after_it_agrees() {
    let p = provider();
    let context = BTreeMap::new();
    let requested = pool(&p, "test", GB);
    let create = p.created_disk(&requested, &created("v1", &context), CreatedKind::Mount);
    let total = res(&[requested, pool(&p, "test", 4 * GB)])
        .apply(&create)
        .unwrap();
    let expanded = BTreeMap::from([("v1".to_owned(), 3 * GB)]);
    let grown = p.grown_disks(&total, &expanded);
    assert_eq!(grown.consumed.len(), 1);
    let after = total.apply(&grown).unwrap();
    let disk = after
        .iter()
        .find(|r| {
            r.disk
                .as_ref()
                .unwrap()
                .source
                .as_ref()
                .unwrap()
                .id
                .is_some()
        })
        .unwrap();
    assert_eq!(mb(disk), 3072.0);
    assert_eq!(
        src(disk).r#type,
        SourceType::Mount as i32,
        "still a MOUNT disk"
    );
    assert_eq!(src(disk).profile.as_deref(), Some("test"));
    // The plugin took 2 GB of the pool, lists the volume at 3 GB.
    let reconciled = reconcile(
        &p,
        &after,
        &[listed("v1", 3 * GB, &[])],
        &[("test", 2 * GB)],
    );
    assert_eq!(
        reconciled,
        res(&[disk.clone(), pool(&p, "test", 2 * GB)]),
        "{reconciled:?}"
    );
    // Nothing to grow twice, or for a size not larger.
    assert!(p.grown_disks(&after, &expanded).is_noop());
    let smaller = BTreeMap::from([("v1".to_owned(), GB / 2)]);
    assert!(p.grown_disks(&total, &smaller).is_noop());
    assert!(p.grown_disks(&total, &BTreeMap::new()).is_noop());
}

// ---------------------------------------------------------------------------------------
// Properties of a whole reconciliation.

fn arb_listing() -> impl Strategy<Value = Vec<Volume>> {
    prop::collection::vec(
        (0usize..4, 0u64..4, any::<bool>()).prop_map(|(id, gb, context)| {
            let ctx: &[(&str, &str)] = if context { &[("k", "v")] } else { &[] };
            listed(["v1", "v2", "v3", "v4"][id], gb * GB, ctx)
        }),
        0..5,
    )
}

fn arb_capacities() -> impl Strategy<Value = Vec<(&'static str, u64)>> {
    prop::collection::vec(
        (0usize..3, 0u64..8).prop_map(|(p, gb)| (["a", "b", "c"][p], gb * GB)),
        0..3,
    )
    .prop_map(|mut c| {
        // One GetCapacity answer per profile.
        c.sort_by_key(|(p, _)| *p);
        c.dedup_by_key(|(p, _)| *p);
        c
    })
}

proptest! {
    /// Reconciling again with the same plugin answers changes nothing, whatever the
    /// total held before (converted, reserved, duplicated, vanished resources).
    #[test]
    fn reconciliation_is_idempotent(
        total in prop::collection::vec(arb_resource(), 0..6),
        listing in arb_listing(),
        capacities in arb_capacities(),
    ) {
        let p = provider();
        let once = reconcile(&p, &res(&total), &listing, &capacities);
        let twice = reconcile(&p, &once, &listing, &capacities);
        prop_assert_eq!(&twice, &once);
        // Every volume with a size at its first listing is in the total, in some form.
        let mut seen = BTreeSet::new();
        let first = listing.iter().filter(|v| seen.insert(v.volume_id.as_str()));
        for v in first.filter(|v| v.capacity_bytes > 0) {
            prop_assert!(once.iter().any(|r| src(r).id.as_deref() == Some(v.volume_id.as_str())));
        }
    }

    /// `existing_volumes` pairs each resource with the listed volume of its id instead of
    /// building every listed volume's disk first; what it finds is Mesos's
    /// `computeConversion(checkpointed, discovered)` over the whole discovered collection
    /// (§6.3 steps 2 and 4, written out here), whatever the total and the listing hold
    /// (duplicates on both sides, drifted metadata, converted and vanished volumes, sizes
    /// that differ).
    #[test]
    fn existing_volumes_agrees_with_mesos_over_every_discovered_disk(
        total in prop::collection::vec(
            (arb_resource(), any::<bool>(), 0u8..4).prop_map(|(mut r, md, vendor)| {
                // Now and then a volume of another vendor (state of another plugin).
                if vendor == 0 && src(&r).id.is_some() {
                    r.disk.as_mut().unwrap().source.as_mut().unwrap().vendor =
                        Some("other.plugin".into());
                }
                if md { with_metadata(r, Some(labels(&[("k", "v")]))) } else { r }
            }),
            0..10,
        ),
        listing in arb_listing(),
    ) {
        let p = provider();
        let total = res(&total);
        let got = p.existing_volumes(&total, &listing).unwrap();

        let mut by_id: BTreeMap<&str, &Resource> = BTreeMap::new();
        for r in &total {
            if let Some(id) = src(r).id.as_deref() {
                by_id.entry(id).or_insert(r);
            }
        }
        let mut discovered = Resources::new();
        let mut seen = BTreeSet::new();
        for v in &listing {
            let id = v.volume_id.as_str();
            if !seen.insert(id) {
                continue;
            }
            let known = by_id.get(id).copied();
            let context = (!v.volume_context.is_empty())
                .then(|| labels_from_context(&v.volume_context));
            let bytes = u64::try_from(v.capacity_bytes).unwrap_or(0);
            let profile = known.and_then(|k| src(k).profile.as_deref());
            let mut disk = p.raw_disk(bytes, profile, Some(id), context);
            if let Some(known) = known && bytes > 0 {
                disk.scalar = known.scalar;
            }
            discovered.add(&disk);
        }
        let checkpointed = total
            .filter(|r| src(r).id.is_some())
            .apply(&got.cleanup)
            .unwrap();
        let mesos = p.compute_conversion(&checkpointed, &discovered);
        prop_assert_eq!(&got.merge.conversion, &mesos.conversion);
        prop_assert_eq!(&got.merge.missing_converted, &mesos.missing_converted);
    }

    /// `reconcile`'s report (changed, removed, added) is Mesos's over the whole totals:
    /// `result != total`, `total - result`, `result - total`, entries in the same order.
    #[test]
    fn reconciliation_reports_the_whole_totals_difference(
        total in prop::collection::vec(arb_resource(), 0..10),
        listing in arb_listing(),
        capacities in arb_capacities(),
    ) {
        let p = provider();
        let total = res(&total);
        let volumes = p.existing_volumes(&total, &listing).unwrap();
        let pools = p.reconcile_pools(
            &total,
            &p.storage_pools(capacities.iter().copied()),
            &Resources::new(),
        );
        let got = p.reconcile(&total, &volumes, &pools).unwrap();
        let result = total
            .apply_all([&volumes.cleanup, &volumes.merge.conversion, &pools.conversion])
            .unwrap();
        prop_assert_eq!(got.changed, result != total);
        // The new total comes exactly when it changed.
        prop_assert_eq!(got.total.map(|t| t.to_vec()), got.changed.then(|| result.to_vec()));
        prop_assert_eq!(got.removed.to_vec(), (total.clone() - &result).to_vec());
        prop_assert_eq!(got.added.to_vec(), (result.clone() - &total).to_vec());
    }

    /// With creates pending, the total always still holds what they consume.
    #[test]
    fn pending_creates_always_stay_applicable(
        total_gb in 1u64..16,
        pending_gb in 1u64..16,
        reported_gb in 0u64..16,
    ) {
        let p = provider();
        let total = res(&[pool(&p, "a", total_gb * GB)]);
        let in_flight = res(&[pool(&p, "a", pending_gb.min(total_gb) * GB)]);
        let got = p.reconcile_pools(&total, &p.storage_pools([("a", reported_gb * GB)]), &in_flight);
        let after = total.apply(&got.conversion).unwrap();
        prop_assert!(after.contains(&in_flight));
        // The free part is exactly what the plugin reports beyond what is in flight.
        let pending = pending_gb.min(total_gb);
        let free = after - &in_flight;
        prop_assert_eq!(free, p.storage_pools([("a", reported_gb.saturating_sub(pending) * GB)]));
    }
}

// ---------------------------------------------------------------------------------------
// Storage is never counted twice (issue #21): pools × reservations × operations in flight ×
// reconciliation results.

/// Whole megabytes of `r` in Mesos's fixed point (0.001 MB).
fn fixed(r: &Resource) -> i64 {
    (mb(r) * 1000.0).round() as i64
}

fn profile_sum(total: &Resources, profile: &str, keep: impl Fn(&Resource) -> bool) -> i64 {
    total
        .iter()
        .filter(|r| src(r).profile.as_deref() == Some(profile) && src(r).id.is_none())
        .filter(|r| keep(r))
        .map(fixed)
        .sum()
}

/// A CREATE_DISK in flight on a RESERVEd part of a pool: the plugin reports the pool's
/// whole size (the new volume not counted yet). Subtracting the reserved in-flight part
/// from the plugin's unreserved answer took nothing away, and the pool was offered whole
/// beside the part being created.
#[test]
fn a_create_on_a_reserved_pool_part_is_not_offered_again() {
    let p = provider();
    let reserved = refined(pool(&p, "a", GB));
    let total = res(&[pool(&p, "a", 9 * GB), reserved.clone()]);
    let in_flight = one(&reserved);
    let got = p.reconcile_pools(&total, &p.storage_pools([("a", 10 * GB)]), &in_flight);
    assert!(
        got.conversion.is_noop(),
        "the pool is already what the plugin reports: {:?}",
        got.conversion
    );
    // The plugin already counts the new volume: 9 GB left, 8 GB of it free.
    let got = p.reconcile_pools(&total, &p.storage_pools([("a", 9 * GB)]), &in_flight);
    let after = total.apply(&got.conversion).unwrap();
    assert!(after.contains(&in_flight));
    assert_eq!(after - &in_flight, res(&[pool(&p, "a", 8 * GB)]));
}

/// One part of a pool in the total: its profile, size, whether a framework RESERVEd it
/// and how much of it a pending CREATE_DISK consumes.
#[derive(Debug, Clone)]
struct Part {
    profile: &'static str,
    gb: u64,
    reserved: bool,
    in_flight_gb: u64,
}

fn arb_parts() -> impl Strategy<Value = Vec<Part>> {
    prop::collection::vec(
        (0usize..2, 1u64..6, any::<bool>(), 0u64..6).prop_map(|(p, gb, reserved, f)| Part {
            profile: ["a", "b"][p],
            gb,
            reserved,
            in_flight_gb: f.min(gb),
        }),
        0..5,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// Whatever the pools, their reservations, the creates in flight on them and the
    /// plugin's answers, a reconciliation
    /// - keeps every in-flight part in the total (the operation still applies);
    /// - offers, per profile, at most what the plugin reports beyond the in-flight parts
    ///   in unreserved form;
    /// - invents no reserved storage (a reserved part survives only if it was there, as
    ///   Mesos keeps a "missing converted" resource);
    /// - is idempotent.
    #[test]
    fn storage_is_never_counted_twice(
        default_reservations in any::<bool>(),
        parts in arb_parts(),
        reported in (0u64..16, 0u64..16),
    ) {
        let p = if default_reservations { provider() } else { provider_with(vec![]) };
        let shape = |part: &Part, gb: u64| {
            let r = pool(&p, part.profile, gb * GB);
            if part.reserved { refined(r) } else { r }
        };
        let total: Resources = parts.iter().map(|part| shape(part, part.gb)).collect();
        let in_flight: Resources = parts
            .iter()
            .filter(|part| part.in_flight_gb > 0)
            .map(|part| shape(part, part.in_flight_gb))
            .collect();
        let answers = [("a", reported.0 * GB), ("b", reported.1 * GB)];
        let got = p.reconcile_pools(&total, &p.storage_pools(answers), &in_flight);
        let after = total.apply(&got.conversion).unwrap();
        prop_assert!(after.contains(&in_flight));
        let free = after.clone() - &in_flight;
        let is_default = |r: &Resource| r.reservations == p.default_reservations();
        for (profile, bytes) in answers {
            let report = i64::try_from(bytes / MB).unwrap() * 1000;
            let flying = profile_sum(&in_flight, profile, |_| true);
            let offered = profile_sum(&free, profile, is_default);
            prop_assert!(
                offered <= (report - flying).max(0),
                "profile {profile}: {offered} offered unreserved beside {flying} in flight, \
                 the plugin reports {report}"
            );
            let kept = profile_sum(&free, profile, |r| !is_default(r));
            let before = profile_sum(&(total.clone() - &in_flight), profile, |r| !is_default(r));
            prop_assert!(kept <= before, "profile {profile}: reserved {kept} > {before} before");
        }
        let again = p.reconcile_pools(&after, &p.storage_pools(answers), &in_flight);
        prop_assert!(again.conversion.is_noop(), "not idempotent: {:?}", again.conversion);
    }
}
