//! One Mesos `Resource` as Mesos's `Resources` sees it (`src/common/resources.cpp`,
//! `src/v1/resources.cpp`, `type_utils.cpp`): quantities in fixed point, equality, whether
//! two resources merge on addition or one subtracts from the other, the kind key the
//! index groups entries by, accessors on disk sources, and the compact display. Nothing
//! here is about this provider.

use std::collections::BTreeMap;
use std::fmt;

use slrp_proto::mesos::v1::resource::disk_info::Source;
use slrp_proto::mesos::v1::resource::disk_info::source::Type as SourceType;
use slrp_proto::mesos::v1::resource::{DiskInfo, ReservationInfo};
use slrp_proto::mesos::v1::value::{Scalar, Type as ValueType};
use slrp_proto::mesos::v1::{Label, Labels, Resource};

// ---------------------------------------------------------------------------------------
// Fixed-point scalars (Mesos `convertToFixed`: llround(value × 1000)).

/// A scalar in Mesos's fixed point: thousandths.
fn fixed(value: f64) -> i64 {
    // `as` saturates on overflow and maps NaN to 0, the only sane reading of a broken
    // scalar; f64::round rounds half away from zero like llround.
    (value * 1000.0).round() as i64
}

fn floating(fixed: i64) -> f64 {
    fixed as f64 / 1000.0
}

pub(super) fn scalar_of(resource: &Resource) -> i64 {
    resource.scalar.map_or(0, |s| fixed(s.value))
}

pub(super) fn set_scalar(resource: &mut Resource, fixed_value: i64) {
    resource.scalar = Some(Scalar {
        value: floating(fixed_value),
    });
}

pub(super) fn is_scalar(resource: &Resource) -> bool {
    resource.r#type == ValueType::Scalar as i32
}

/// Mesos `Resources::isEmpty`: a scalar at or below zero in fixed point. Non-scalar
/// resources (never produced by the provider) are kept as they are.
pub(super) fn is_empty(resource: &Resource) -> bool {
    is_scalar(resource) && scalar_of(resource) <= 0
}

// ---------------------------------------------------------------------------------------
// Equality as Mesos defines it (`operator==` in src/v1/resources.cpp and type_utils.cpp).

/// Mesos compares labels order-insensitively. Mesos checks "same size and every left
/// label occurs on the right", which calls `{a, a, b}` and `{a, b, b}` equal; comparing
/// sorted copies (a multiset comparison) is a deliberate, stricter difference.
pub(super) fn labels_eq(left: Option<&Labels>, right: Option<&Labels>) -> bool {
    fn sorted(labels: Option<&Labels>) -> Vec<(&str, Option<&str>)> {
        let mut all: Vec<(&str, Option<&str>)> = labels
            .map(|l| l.labels.as_slice())
            .unwrap_or_default()
            .iter()
            .map(|label| (label.key.as_str(), label.value.as_deref()))
            .collect();
        all.sort_unstable();
        all
    }
    sorted(left) == sorted(right)
}

fn reservation_eq(left: &ReservationInfo, right: &ReservationInfo) -> bool {
    left.r#type == right.r#type
        && left.role == right.role
        && left.principal == right.principal
        && left.labels.is_some() == right.labels.is_some()
        && labels_eq(left.labels.as_ref(), right.labels.as_ref())
}

fn reservations_eq(left: &[ReservationInfo], right: &[ReservationInfo]) -> bool {
    left.len() == right.len() && left.iter().zip(right).all(|(l, r)| reservation_eq(l, r))
}

fn source_eq(left: &Source, right: &Source) -> bool {
    left.r#type == right.r#type
        && left.path == right.path
        && left.mount == right.mount
        && left.vendor == right.vendor
        && left.id == right.id
        && left.metadata.is_some() == right.metadata.is_some()
        && labels_eq(left.metadata.as_ref(), right.metadata.as_ref())
        && left.profile == right.profile
}

/// Mesos `operator==(DiskInfo)`: `volume` is ignored (it says how a task uses the disk,
/// not what the disk is), and of `persistence` only the id counts.
fn disk_eq(left: &DiskInfo, right: &DiskInfo) -> bool {
    let sources = match (&left.source, &right.source) {
        (None, None) => true,
        (Some(l), Some(r)) => source_eq(l, r),
        (None, Some(_)) | (Some(_), None) => false,
    };
    sources && left.persistence.as_ref().map(|p| &p.id) == right.persistence.as_ref().map(|p| &p.id)
}

/// Everything of Mesos's `operator==(Resource)` except the quantity.
pub(super) fn same_kind(left: &Resource, right: &Resource) -> bool {
    let disks = match (&left.disk, &right.disk) {
        (None, None) => true,
        (Some(l), Some(r)) => disk_eq(l, r),
        (None, Some(_)) | (Some(_), None) => false,
    };
    left.name == right.name
        && left.r#type == right.r#type
        && left.allocation_info == right.allocation_info
        && reservations_eq(&left.reservations, &right.reservations)
        && disks
        && left.revocable.is_some() == right.revocable.is_some()
        && left.shared.is_some() == right.shared.is_some()
        && left.provider_id == right.provider_id
}

/// Mesos `operator==(Resource)`: scalars compare in fixed point; other values exactly.
pub fn resource_eq(left: &Resource, right: &Resource) -> bool {
    same_kind(left, right)
        && if is_scalar(left) {
            scalar_of(left) == scalar_of(right)
        } else {
            left.ranges == right.ranges && left.set == right.set
        }
}

/// How a disk may be split or merged (Mesos's `addable`/`subtractable` switch on the
/// source type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Divisibility {
    /// A quantity: merged on addition, partly subtracted.
    Divisible,
    /// One exclusive thing (MOUNT/BLOCK disk, RAW with an id, persistent volume, shared
    /// resource, non-scalar value): never merged, subtracted only by an identical one.
    Indivisible,
}

fn divisibility(resource: &Resource) -> Divisibility {
    if resource.shared.is_some() || !is_scalar(resource) {
        return Divisibility::Indivisible;
    }
    let Some(disk) = &resource.disk else {
        return Divisibility::Divisible;
    };
    if disk.persistence.is_some() {
        return Divisibility::Indivisible;
    }
    let Some(source) = &disk.source else {
        return Divisibility::Divisible;
    };
    match SourceType::try_from(source.r#type) {
        Ok(SourceType::Path) => Divisibility::Divisible,
        Ok(SourceType::Raw) if source.id.is_none() => Divisibility::Divisible,
        // Mesos treats UNKNOWN as unreachable; an unknown number is no better.
        Ok(SourceType::Raw | SourceType::Mount | SourceType::Block | SourceType::Unknown)
        | Err(_) => Divisibility::Indivisible,
    }
}

/// Mesos `addable`: the two merge into one entry on addition.
pub(super) fn addable(left: &Resource, right: &Resource) -> bool {
    same_kind(left, right) && divisibility(left) == Divisibility::Divisible
}

/// Mesos `subtractable`: `right` may be taken out of `left`.
pub(super) fn subtractable(left: &Resource, right: &Resource) -> bool {
    same_kind(left, right)
        && match divisibility(left) {
            Divisibility::Divisible => true,
            Divisibility::Indivisible => resource_eq(left, right),
        }
}

// ---------------------------------------------------------------------------------------
// The kind key an indexed collection groups its entries by.

/// A hash of fields [`same_kind`] compares exactly, so that two resources of the same
/// kind always have the same key (different kinds may share one: candidates are still
/// compared with `same_kind`). Labels are left out (they compare as multisets), and so
/// is the allocation info, so that the key is also that of the resource's identity in
/// the durable state (`state::identity`, which clears it):
/// [`Resources::possibly_alike`](super::Resources::possibly_alike).
pub(super) fn kind_key(resource: &Resource) -> u64 {
    use std::hash::{Hash, Hasher};
    // `DefaultHasher::new()` has fixed keys: the key is the same for every collection,
    // which clones and `contains` across collections rely on.
    let mut h = std::hash::DefaultHasher::new();
    resource.name.hash(&mut h);
    resource.r#type.hash(&mut h);
    resource.provider_id.as_ref().map(|p| &p.value).hash(&mut h);
    resource.reservations.len().hash(&mut h);
    for reservation in &resource.reservations {
        (reservation.r#type, &reservation.role).hash(&mut h);
    }
    if let Some(disk) = &resource.disk {
        disk.persistence.as_ref().map(|p| &p.id).hash(&mut h);
        disk.source
            .as_ref()
            .map(|s| (s.r#type, &s.id, &s.profile))
            .hash(&mut h);
    }
    h.finish()
}

// ---------------------------------------------------------------------------------------
// Accessors on disk sources.

pub(super) fn source(resource: &Resource) -> Option<&Source> {
    resource.disk.as_ref()?.source.as_ref()
}

pub(super) fn source_mut(resource: &mut Resource) -> &mut Source {
    resource
        .disk
        .get_or_insert_with(DiskInfo::default)
        .source
        .get_or_insert_with(Source::default)
}

pub(super) fn disk_id(resource: &Resource) -> Option<&str> {
    source(resource)?.id.as_deref()
}

pub(super) fn disk_profile(resource: &Resource) -> Option<&str> {
    source(resource)?.profile.as_deref()
}

/// Mesos `Resources::isDisk(resource, RAW) && !has_id()`: a storage pool.
pub fn is_storage_pool(resource: &Resource) -> bool {
    source(resource).is_some_and(|s| s.r#type == SourceType::Raw as i32 && s.id.is_none())
}

/// Mesos `convertStringMapToLabels`: one label per key, in key order.
pub fn labels_from_context(context: &BTreeMap<String, String>) -> Labels {
    Labels {
        labels: context
            .iter()
            .map(|(key, value)| Label {
                key: key.clone(),
                value: Some(value.clone()),
            })
            .collect(),
    }
}

// ---------------------------------------------------------------------------------------
// Display.

/// Display of one resource in the format of [`Resources`](super::Resources)' `Display`.
/// Metadata values are not printed (a plugin's volume context may hold anything).
#[derive(Debug)]
pub struct DisplayResource<'a>(pub &'a Resource);

impl fmt::Display for DisplayResource<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let resource = self.0;
        f.write_str(&resource.name)?;
        if !resource.reservations.is_empty() {
            let roles: Vec<&str> = resource
                .reservations
                .iter()
                .map(|r| r.role.as_deref().unwrap_or("?"))
                .collect();
            write!(f, "(reservations: [{}])", roles.join(","))?;
        }
        if let Some(source) = resource.disk.as_ref().and_then(|d| d.source.as_ref()) {
            let kind = SourceType::try_from(source.r#type).map_or("?", |t| t.as_str_name());
            let parts: Vec<&str> = [&source.vendor, &source.id, &source.profile]
                .into_iter()
                .map(|p| p.as_deref().unwrap_or(""))
                .collect();
            write!(f, "[{kind}({})]", parts.join(","))?;
        }
        if resource
            .disk
            .as_ref()
            .is_some_and(|d| d.persistence.is_some())
        {
            f.write_str("(persistent)")?;
        }
        match resource.scalar {
            Some(s) if is_scalar(resource) => write!(f, ":{}", s.value),
            _ => f.write_str(":<non-scalar>"),
        }
    }
}
