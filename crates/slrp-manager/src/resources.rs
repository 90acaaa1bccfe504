//! The agent's own resource arithmetic (spec §6.9) and operation conversions (§5.3, §2.9
//! step 5) over `slrp_proto` types.
//!
//! The provider computes the same things in `slrp_core`; this is a separate, small
//! implementation on purpose: the manager checks the provider the way a Mesos agent does,
//! so a shared bug would hide exactly what this is meant to catch. Only what an agent needs
//! for provider resources is here: scalar arithmetic at Mesos's 3-decimal fixed point, the
//! merge/subtract rules, and `getResourceConversions` for the speculative kinds.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use slrp_proto::mesos::v1::resource::disk_info::source::Type as SourceType;
use slrp_proto::mesos::v1::resource::{DiskInfo, disk_info};
use slrp_proto::mesos::v1::{Labels, Resource, offer, value};

/// One conversion: remove `.0`, then add `.1`.
pub(crate) type Conversion = (Vec<Resource>, Vec<Resource>);

/// Mesos compares and adds scalars as `llround(value × 1000)`.
fn fixed(value: f64) -> i64 {
    // Resource quantities are far inside i64 at this scale; NaN and infinities are
    // rejected by Mesos validation long before they could reach an agent.
    #[allow(clippy::cast_possible_truncation)]
    let millis = (value * 1000.0).round() as i64;
    millis
}

fn float(millis: i64) -> f64 {
    // Exact for every quantity below 2^53 thousandths.
    #[allow(clippy::cast_precision_loss)]
    let value = millis as f64 / 1000.0;
    value
}

fn amount(resource: &Resource) -> Option<i64> {
    (resource.r#type == value::Type::Scalar as i32)
        .then(|| resource.scalar.as_ref().map_or(0, |s| fixed(s.value)))
}

/// Mesos's `Resources::isEmpty` for one resource: a zero scalar is nothing.
fn is_empty(resource: &Resource) -> bool {
    amount(resource).is_some_and(|millis| millis == 0)
}

/// Whether two resources of the same identity merge into one entry on addition: plain
/// scalars, PATH disks and RAW disks without an id (storage pools); never volumes.
fn mergeable(resource: &Resource) -> bool {
    if resource.shared.is_some() || amount(resource).is_none() {
        return false;
    }
    let Some(disk) = &resource.disk else {
        return true;
    };
    if disk.persistence.is_some() {
        return false;
    }
    disk.source.as_ref().is_none_or(|source| {
        match SourceType::try_from(source.r#type).unwrap_or(SourceType::Unknown) {
            SourceType::Path => true,
            SourceType::Raw => source.id.is_none(),
            _ => false,
        }
    })
}

/// Labels compare as multisets (Mesos ignores their order).
fn same_labels(a: Option<&Labels>, b: Option<&Labels>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            a.labels.len() == b.labels.len()
                && a.labels.iter().all(|label| {
                    let count =
                        |labels: &Labels| labels.labels.iter().filter(|l| *l == label).count();
                    count(a) == count(b)
                })
        }
        _ => false,
    }
}

fn same_disk(a: Option<&DiskInfo>, b: Option<&DiskInfo>) -> bool {
    let (a, b) = match (a, b) {
        (None, None) => return true,
        (Some(a), Some(b)) => (a, b),
        _ => return false,
    };
    // `disk.volume` is ignored, as in Mesos; a persistence compares by id.
    let persistence = |disk: &DiskInfo| disk.persistence.as_ref().map(|p| p.id.clone());
    let same_source = match (&a.source, &b.source) {
        (None, None) => true,
        (Some(x), Some(y)) => same_source(x, y),
        _ => false,
    };
    same_source && persistence(a) == persistence(b)
}

fn same_source(a: &disk_info::Source, b: &disk_info::Source) -> bool {
    a.r#type == b.r#type
        && a.path == b.path
        && a.mount == b.mount
        && a.vendor == b.vendor
        && a.id == b.id
        && a.profile == b.profile
        && same_labels(a.metadata.as_ref(), b.metadata.as_ref())
}

/// Everything but the quantity (and `disk.volume`) is equal.
fn same_identity(a: &Resource, b: &Resource) -> bool {
    a.allocation_info == b.allocation_info && same_but_allocation(a, b)
}

/// [`same_identity`] but for the allocation info.
fn same_but_allocation(a: &Resource, b: &Resource) -> bool {
    a.name == b.name
        && a.r#type == b.r#type
        && a.provider_id == b.provider_id
        && a.role == b.role
        && a.reservation == b.reservation
        && a.reservations == b.reservations
        && a.revocable == b.revocable
        && a.shared == b.shared
        && same_disk(a.disk.as_ref(), b.disk.as_ref())
}

/// Whether `contains` weighs `a` without its allocation info and `b` together (they
/// count against the same entries), without copying `a`.
pub(crate) fn related_unallocated(a: &Resource, b: &Resource) -> bool {
    b.allocation_info.is_none() && same_but_allocation(a, b) && (mergeable(a) == mergeable(b))
}

fn identical(a: &Resource, b: &Resource) -> bool {
    same_identity(a, b) && amount(a) == amount(b) && a.ranges == b.ranges && a.set == b.set
}

/// A hash of fields [`same_identity`] compares exactly (labels, which compare as
/// multisets, and the quantity left out): resources of one identity have one key.
fn identity_key(resource: &Resource) -> u64 {
    use std::hash::{Hash, Hasher};
    // Fixed keys: the key of a resource is the same in every total and every clone.
    let mut h = std::hash::DefaultHasher::new();
    resource.name.hash(&mut h);
    resource.r#type.hash(&mut h);
    resource.provider_id.as_ref().map(|p| &p.value).hash(&mut h);
    resource.role.hash(&mut h);
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

/// The agent's total of one provider: Mesos's `Resources`, a sequence in the order
/// entries were added (an entry merged into keeps its place), indexed by identity, so
/// that an operation's check and conversion look only at the entries of the identities
/// it touches. A plain vector made every apply and every FINISHED status a scan of the
/// whole total (and a removal a shift of it): the manager's share of an operation grew
/// with the number of volumes.
#[derive(Debug, Clone, Default)]
pub(crate) struct Total {
    /// Sequence number → entry: the total's order.
    entries: BTreeMap<u64, Resource>,
    /// Identity key → sequence numbers of the entries with it, ascending.
    keys: HashMap<u64, Vec<u64>>,
    next: u64,
}

impl Total {
    /// The total `resources` are, as they are (an UPDATE_STATE's: not merged again).
    pub(crate) fn from_resources(resources: &[Resource]) -> Self {
        let mut total = Self::default();
        for resource in resources {
            total.push(resource.clone());
        }
        total
    }

    /// The entries, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Resource> {
        self.entries.values()
    }

    /// The entries, in order.
    pub(crate) fn to_vec(&self) -> Vec<Resource> {
        self.iter().cloned().collect()
    }

    /// Number of entries.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Removes every entry.
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.keys.clear();
    }

    fn push(&mut self, resource: Resource) {
        let seq = self.next;
        self.next += 1;
        self.keys
            .entry(identity_key(&resource))
            .or_default()
            .push(seq);
        self.entries.insert(seq, resource);
    }

    fn remove(&mut self, seq: u64) {
        let Some(resource) = self.entries.remove(&seq) else {
            return;
        };
        let key = identity_key(&resource);
        if let Some(seqs) = self.keys.get_mut(&key) {
            seqs.retain(|s| *s != seq);
            if seqs.is_empty() {
                self.keys.remove(&key);
            }
        }
    }

    /// Sequence numbers of the entries that may be of `resource`'s identity, in order.
    fn candidates(&self, resource: &Resource) -> Vec<u64> {
        self.keys
            .get(&identity_key(resource))
            .cloned()
            .unwrap_or_default()
    }

    /// The entries that may be of `resource`'s identity, in order (callers compare).
    fn alike<'a>(&'a self, resource: &Resource) -> impl Iterator<Item = &'a Resource> {
        self.keys
            .get(&identity_key(resource))
            .into_iter()
            .flatten()
            .filter_map(|seq| self.entries.get(seq))
    }
}

/// Mesos `Resources::add` of one resource.
pub(crate) fn add(total: &mut Total, resource: &Resource) {
    if is_empty(resource) {
        return;
    }
    if mergeable(resource)
        && let Some(seq) = total.candidates(resource).into_iter().find(|seq| {
            total
                .entries
                .get(seq)
                .is_some_and(|entry| mergeable(entry) && same_identity(entry, resource))
        })
        && let Some(entry) = total.entries.get_mut(&seq)
    {
        let sum = amount(entry).unwrap_or(0) + amount(resource).unwrap_or(0);
        entry.scalar = Some(value::Scalar { value: float(sum) });
        return;
    }
    total.push(resource.clone());
}

/// Mesos `Resources::contains`: every resource of `wanted` can be taken from `total`
/// (resources of one identity in `wanted` add up).
pub(crate) fn contains(total: &Total, wanted: &[Resource]) -> bool {
    wanted.iter().enumerate().all(|(index, resource)| {
        if is_empty(resource) {
            return true;
        }
        // The first occurrence of an identity checks the sum of all of them.
        let earlier = |matches: &dyn Fn(&Resource) -> bool| wanted[..index].iter().any(matches);
        if mergeable(resource) {
            if earlier(&|other| mergeable(other) && same_identity(other, resource)) {
                return true;
            }
            let needed: i64 = wanted
                .iter()
                .filter(|other| mergeable(other) && same_identity(other, resource))
                .filter_map(amount)
                .sum();
            let available: i64 = total
                .alike(resource)
                .filter(|entry| mergeable(entry) && same_identity(entry, resource))
                .filter_map(amount)
                .sum();
            needed <= available
        } else {
            if earlier(&|other| identical(other, resource)) {
                return true;
            }
            let needed = wanted
                .iter()
                .filter(|other| identical(other, resource))
                .count();
            let available = total
                .alike(resource)
                .filter(|entry| identical(entry, resource))
                .count();
            needed <= available
        }
    })
}

/// Mesos `Resources::subtract` of one resource the caller knows is contained.
fn subtract(total: &mut Total, resource: &Resource) {
    if is_empty(resource) {
        return;
    }
    if mergeable(resource) {
        let mut left = amount(resource).unwrap_or(0);
        for seq in total.candidates(resource) {
            if left <= 0 {
                break;
            }
            let Some(entry) = total.entries.get_mut(&seq) else {
                continue;
            };
            if !(mergeable(entry) && same_identity(entry, resource)) {
                continue;
            }
            let have = amount(entry).unwrap_or(0);
            let take = have.min(left);
            left -= take;
            if have == take {
                total.remove(seq);
            } else {
                entry.scalar = Some(value::Scalar {
                    value: float(have - take),
                });
            }
        }
    } else if let Some(seq) = total.candidates(resource).into_iter().find(|seq| {
        total
            .entries
            .get(seq)
            .is_some_and(|entry| identical(entry, resource))
    }) {
        total.remove(seq);
    }
}

/// Mesos `Resources::apply(conversions)`: each conversion in turn, all or nothing. The
/// error is Mesos's "<total> does not contain <consumed>".
pub(crate) fn apply(total: &mut Total, conversions: &[Conversion]) -> Result<(), String> {
    // Checking every step before changing anything needs a scratch copy only when there
    // is more than one step (the common single conversion is checked in place).
    if conversions.len() > 1 {
        let mut scratch = total.clone();
        apply_checked(&mut scratch, conversions)?;
        *total = scratch;
        Ok(())
    } else {
        apply_checked(total, conversions)
    }
}

fn apply_checked(total: &mut Total, conversions: &[Conversion]) -> Result<(), String> {
    for (consumed, converted) in conversions {
        if !contains(total, consumed) {
            return Err(format!(
                "{} does not contain {}",
                describe(total.iter()),
                describe(consumed)
            ));
        }
        for resource in consumed {
            subtract(total, resource);
        }
        for resource in converted {
            add(total, resource);
        }
    }
    Ok(())
}

/// `resources` without `allocation_info` (the agent's total has none).
pub(crate) fn unallocated(resources: &[Resource]) -> Vec<Resource> {
    resources
        .iter()
        .map(|resource| Resource {
            allocation_info: None,
            ..resource.clone()
        })
        .collect()
}

/// A short text form for messages: `disk(role)[RAW id,profile]:1024`.
pub(crate) fn describe<'a>(resources: impl IntoIterator<Item = &'a Resource>) -> String {
    let mut out = String::from("[");
    for (index, resource) in resources.into_iter().enumerate() {
        if index > 0 {
            out.push_str(", ");
        }
        out.push_str(&resource.name);
        if let Some(last) = resource.reservations.last() {
            let _ = write!(out, "({})", last.role.as_deref().unwrap_or("*"));
        }
        if let Some(source) = resource.disk.as_ref().and_then(|d| d.source.as_ref()) {
            let kind = SourceType::try_from(source.r#type).unwrap_or(SourceType::Unknown);
            let _ = write!(out, "[{}", kind.as_str_name());
            for part in [&source.id, &source.profile].into_iter().flatten() {
                let _ = write!(out, " {part}");
            }
            out.push(']');
        }
        if let Some(persistence) = resource.disk.as_ref().and_then(|d| d.persistence.as_ref()) {
            let _ = write!(out, "<{}>", persistence.id);
        }
        match amount(resource) {
            Some(millis) => {
                let _ = write!(out, ":{}", float(millis));
            }
            None => out.push_str(":?"),
        }
    }
    out.push(']');
    out
}

/// Mesos `Resources::createStrippedScalarQuantity`: the scalar quantities by name, in
/// thousandths (each resource's `llround(value × 1000)`, summed as Mesos adds scalars);
/// a name whose quantity is zero is left out, as `Resources` drops empty resources.
fn scalar_quantities(resources: &[Resource]) -> BTreeMap<&str, i64> {
    let mut quantities = BTreeMap::new();
    for resource in resources {
        if let Some(millis) = amount(resource) {
            *quantities.entry(resource.name.as_str()).or_insert(0) += millis;
        }
    }
    quantities.retain(|_, millis| *millis != 0);
    quantities
}

fn describe_quantities(quantities: &BTreeMap<&str, i64>) -> String {
    if quantities.is_empty() {
        return "nothing".to_owned();
    }
    let parts: Vec<String> = quantities
        .iter()
        .map(|(name, millis)| format!("{name}:{}", float(*millis)))
        .collect();
    parts.join("; ")
}

/// The master allocator's invariant on a conversion of allocated resources
/// (`HierarchicalAllocatorProcess::updateAllocation`, MESOS-8825): it either keeps its
/// scalar quantities or removes what it consumes completely (converts it into nothing).
/// Mesos subtracts the framework's stripped quantities after the conversion from those
/// before (a subtraction that stops at zero, so a grow passes) and `CHECK_EQ`s the
/// difference against the consumed quantities of the conversions whose converted side is
/// empty: a conversion into something smaller aborts the master. A conversion that
/// consumes nothing is skipped, as there. Err: the quantities of both sides, for the
/// message.
pub(crate) fn check_quantities(
    consumed: &[Resource],
    converted: &[Resource],
) -> Result<(), String> {
    if consumed.iter().all(is_empty) || converted.iter().all(is_empty) {
        return Ok(());
    }
    let before = scalar_quantities(consumed);
    let after = scalar_quantities(converted);
    let shrinks = before
        .iter()
        .any(|(name, millis)| after.get(name).copied().unwrap_or(0) < *millis);
    if shrinks {
        return Err(format!(
            "consumed {} and converted {}",
            describe_quantities(&before),
            describe_quantities(&after)
        ));
    }
    Ok(())
}

/// The operation type, when the event carries a known one.
pub(crate) fn kind(info: &offer::Operation) -> Option<offer::operation::Type> {
    info.r#type
        .and_then(|raw| offer::operation::Type::try_from(raw).ok())
}

/// Mesos `isSpeculativeOperation`.
pub(crate) fn is_speculative(info: &offer::Operation) -> bool {
    use offer::operation::Type;
    matches!(
        kind(info),
        Some(Type::Reserve | Type::Unreserve | Type::Create | Type::Destroy)
    )
}

fn pop_reservation(resource: &Resource) -> Result<Resource, String> {
    let mut popped = resource.clone();
    if popped.reservations.pop().is_none() {
        return Err(format!(
            "{} has no reservation to pop",
            describe(std::slice::from_ref(resource))
        ));
    }
    Ok(popped)
}

/// A volume without what CREATE adds: persistence, `disk.volume`, sharedness.
fn without_persistence(volume: &Resource) -> Resource {
    let mut bare = volume.clone();
    if let Some(disk) = bare.disk.as_mut() {
        disk.persistence = None;
        disk.volume = None;
    }
    bare.shared = None;
    bare
}

fn missing(field: &str) -> String {
    format!("the operation lacks its '{field}' payload")
}

/// Mesos `getResourceConversions` for the speculative kinds, on the operation with
/// allocation info stripped (the agent's `apply`). Err for another kind or a malformed
/// operation (a master would not have sent it).
pub(crate) fn speculative_conversions(info: &offer::Operation) -> Result<Vec<Conversion>, String> {
    use offer::operation::Type;
    let each = |resources: &[Resource],
                convert: &dyn Fn(&Resource) -> Result<Conversion, String>| {
        unallocated(resources)
            .iter()
            .map(convert)
            .collect::<Result<Vec<_>, _>>()
    };
    match kind(info) {
        Some(Type::Reserve) => {
            let reserve = info.reserve.as_ref().ok_or_else(|| missing("reserve"))?;
            if reserve.source.is_empty() {
                each(&reserve.resources, &|r| {
                    Ok((vec![pop_reservation(r)?], vec![r.clone()]))
                })
            } else {
                Ok(vec![(
                    unallocated(&reserve.source),
                    unallocated(&reserve.resources),
                )])
            }
        }
        Some(Type::Unreserve) => {
            let unreserve = info
                .unreserve
                .as_ref()
                .ok_or_else(|| missing("unreserve"))?;
            each(&unreserve.resources, &|r| {
                Ok((vec![r.clone()], vec![pop_reservation(r)?]))
            })
        }
        Some(Type::Create) => {
            let create = info.create.as_ref().ok_or_else(|| missing("create"))?;
            each(&create.volumes, &|v| {
                Ok((vec![without_persistence(v)], vec![v.clone()]))
            })
        }
        Some(Type::Destroy) => {
            let destroy = info.destroy.as_ref().ok_or_else(|| missing("destroy"))?;
            each(&destroy.volumes, &|v| {
                Ok((vec![v.clone()], vec![without_persistence(v)]))
            })
        }
        other => Err(format!(
            "{} is not a speculative operation",
            other.map_or("an unknown type", |t| t.as_str_name())
        )),
    }
}

/// Mesos `getConsumedResources` for the non-speculative kinds an agent converts on a
/// FINISHED status, allocation info stripped. `None` for the others.
pub(crate) fn disk_consumed(info: &offer::Operation) -> Option<Vec<Resource>> {
    disk_source(info).map(|source| unallocated(std::slice::from_ref(source)))
}

/// The resource a CREATE_DISK or DESTROY_DISK consumes, as the operation carries it
/// (with its allocation info). `None` for the other kinds.
pub(crate) fn disk_source(info: &offer::Operation) -> Option<&Resource> {
    use offer::operation::Type;
    match kind(info) {
        Some(Type::CreateDisk) => Some(&info.create_disk.as_ref()?.source),
        Some(Type::DestroyDisk) => Some(&info.destroy_disk.as_ref()?.source),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use slrp_proto::mesos::v1::resource::{ReservationInfo, disk_info::Persistence};
    use slrp_proto::mesos::v1::{ResourceProviderId, resource};

    use super::*;

    fn disk(megabytes: f64) -> Resource {
        Resource {
            name: "disk".to_owned(),
            r#type: value::Type::Scalar as i32,
            scalar: Some(value::Scalar { value: megabytes }),
            provider_id: Some(ResourceProviderId {
                value: "rp".to_owned(),
            }),
            ..Resource::default()
        }
    }

    fn with_source(mut r: Resource, kind: SourceType, id: Option<&str>) -> Resource {
        r.disk = Some(DiskInfo {
            source: Some(disk_info::Source {
                r#type: kind as i32,
                id: id.map(str::to_owned),
                profile: Some("fast".to_owned()),
                ..disk_info::Source::default()
            }),
            ..DiskInfo::default()
        });
        r
    }

    fn reserved(mut r: Resource, role: &str) -> Resource {
        r.reservations.push(ReservationInfo {
            r#type: Some(resource::reservation_info::Type::Dynamic as i32),
            role: Some(role.to_owned()),
            ..ReservationInfo::default()
        });
        r
    }

    #[test]
    fn pools_merge_and_split_volumes_do_not() {
        let pool = with_source(disk(100.0), SourceType::Raw, None);
        let mut total = Total::default();
        add(&mut total, &pool);
        add(&mut total, &pool);
        assert_eq!(total.len(), 1);
        assert_eq!(
            total.to_vec()[0].scalar.as_ref().map(|s| s.value),
            Some(200.0)
        );
        let volume = with_source(disk(50.0), SourceType::Mount, Some("v1"));
        add(&mut total, &volume);
        add(&mut total, &volume);
        assert_eq!(total.len(), 3);
        // A volume is only subtracted by an identical one: half of it is not contained.
        assert!(!contains(
            &total,
            &[with_source(disk(25.0), SourceType::Mount, Some("v1"))]
        ));
        assert!(contains(&total, &[volume.clone(), volume.clone()]));
        assert!(!contains(&total, &[volume.clone(), volume.clone(), volume]));
        // Pool capacity adds up across the wanted list.
        assert!(contains(
            &total,
            &[
                with_source(disk(150.0), SourceType::Raw, None),
                with_source(disk(50.0), SourceType::Raw, None)
            ]
        ));
        assert!(!contains(
            &total,
            &[
                with_source(disk(150.0), SourceType::Raw, None),
                with_source(disk(50.001), SourceType::Raw, None)
            ]
        ));
    }

    /// The indexed total behaves as Mesos's vector: order kept across removals, a merge
    /// into the entry of the same identity only (in its place), sums per identity.
    #[test]
    fn a_large_total_keeps_its_order_and_its_identities_apart() {
        let pool = with_source(disk(100.0), SourceType::Raw, None);
        let reserved_pool = reserved(pool.clone(), "role");
        let volumes: Vec<Resource> = (0..100)
            .map(|n| with_source(disk(1.0), SourceType::Mount, Some(&format!("v{n}"))))
            .collect();
        let mut all = vec![pool.clone()];
        all.extend(volumes.iter().cloned());
        all.push(reserved_pool.clone());
        let mut total = Total::from_resources(&all);
        apply(&mut total, &[(vec![volumes[50].clone()], vec![])]).expect("contained");
        all.remove(51);
        assert_eq!(total.to_vec(), all);
        let part = with_source(disk(30.0), SourceType::Raw, None);
        assert!(contains(
            &total,
            &[part.clone(), part.clone(), part.clone()]
        ));
        // 100 of the unreserved pool: the reserved one's 100 do not count.
        assert!(!contains(
            &total,
            &[part.clone(), part.clone(), part.clone(), part.clone()]
        ));
        add(&mut total, &reserved(part.clone(), "role"));
        let after = total.to_vec();
        assert_eq!(after.len(), all.len());
        assert_eq!(after[0], pool);
        assert_eq!(
            after
                .last()
                .and_then(|r| r.scalar.as_ref())
                .map(|s| s.value),
            Some(130.0)
        );
        assert!(!contains(&total, &[volumes[50].clone()]));
        assert!(contains(&total, &[volumes[99].clone()]));
    }

    #[test]
    fn apply_is_total_minus_consumed_plus_converted_or_nothing() {
        let pool = with_source(disk(100.0), SourceType::Raw, None);
        let mut total = Total::from_resources(std::slice::from_ref(&pool));
        let volume = with_source(disk(40.0), SourceType::Mount, Some("v1"));
        let taken = with_source(disk(40.0), SourceType::Raw, None);
        apply(&mut total, &[(vec![taken.clone()], vec![volume.clone()])]).expect("contained");
        assert_eq!(total.len(), 2);
        assert_eq!(
            total.to_vec()[0].scalar.as_ref().map(|s| s.value),
            Some(60.0)
        );
        assert_eq!(total.to_vec()[1], volume);
        // The second step fails: nothing changes.
        let before = total.to_vec();
        let error = apply(
            &mut total,
            &[
                (vec![volume.clone()], vec![taken.clone()]),
                (vec![volume.clone()], vec![]),
            ],
        )
        .expect_err("the volume is gone after the first step");
        assert!(error.contains("does not contain"), "{error}");
        assert_eq!(total.to_vec(), before);
        // Thousandths of a megabyte are the unit.
        apply(
            &mut total,
            &[(
                vec![with_source(disk(59.9995), SourceType::Raw, None)],
                vec![],
            )],
        )
        .expect("rounds to 60.000");
        assert_eq!(total.to_vec(), vec![volume]);
    }

    /// MESOS-8825 in the master's fixed point: 1.0015 MB is 1002 thousandths
    /// (`llround(1001.5)`), the 1050148 bytes a plugin echoes back for it are 1.0014992 MB,
    /// 1001 thousandths: a shrink; 1050149 bytes are 1002 again.
    #[test]
    fn conversions_keep_or_remove_their_quantities() {
        let mb = |bytes: f64| bytes / 1_048_576.0;
        let pool = |size: f64| with_source(disk(size), SourceType::Raw, None);
        let volume = |size: f64| with_source(disk(size), SourceType::Mount, Some("v"));
        let consumed = [pool(1.0015)];
        let error = check_quantities(&consumed, &[volume(mb(1_050_148.0))])
            .expect_err("1001 < 1002 thousandths");
        assert_eq!(error, "consumed disk:1.002 and converted disk:1.001");
        for kept in [mb(1_050_149.0), 1.0015, 1.002, 2.0] {
            check_quantities(&consumed, &[volume(kept)]).expect("kept or grown");
        }
        // Converted into nothing: removed completely (a 0-sized resource, or one below
        // half a thousandth, is nothing).
        for nothing in [vec![], vec![volume(0.0)], vec![volume(0.0004)]] {
            check_quantities(&consumed, &nothing).expect("removed");
        }
        // Consuming nothing is not checked.
        check_quantities(&[], &[volume(1.0)]).expect("nothing consumed");
        check_quantities(&[pool(0.0)], &[volume(1.0)]).expect("nothing consumed");
        // Quantities add up per name; another name does not make up for a missing one.
        check_quantities(&consumed, &[volume(0.501), pool(0.501)]).expect("1002");
        assert!(check_quantities(&consumed, &[volume(0.501), pool(0.5)]).is_err());
        let mut other = disk(5.0);
        other.name = "mem".to_owned();
        let error = check_quantities(&consumed, &[other]).expect_err("no disk left");
        assert_eq!(error, "consumed disk:1.002 and converted mem:5");
    }

    #[test]
    fn speculative_conversions_follow_get_resource_conversions() {
        let unreserved = disk(10.0);
        let mut allocated = reserved(disk(10.0), "role");
        allocated.allocation_info = Some(resource::AllocationInfo {
            role: Some("role".to_owned()),
        });
        let reserve = offer::Operation {
            r#type: Some(offer::operation::Type::Reserve as i32),
            reserve: Some(offer::operation::Reserve {
                source: Vec::new(),
                resources: vec![allocated.clone()],
            }),
            ..offer::Operation::default()
        };
        let conversions = speculative_conversions(&reserve).expect("reserve");
        assert_eq!(
            conversions,
            vec![(vec![unreserved.clone()], vec![reserved(disk(10.0), "role")])]
        );

        let mut volume = with_source(disk(10.0), SourceType::Mount, Some("v"));
        let bare = volume.clone();
        if let Some(d) = volume.disk.as_mut() {
            d.persistence = Some(Persistence {
                id: "p".to_owned(),
                principal: None,
            });
        }
        let create = offer::Operation {
            r#type: Some(offer::operation::Type::Create as i32),
            create: Some(offer::operation::Create {
                volumes: vec![volume.clone()],
            }),
            ..offer::Operation::default()
        };
        assert_eq!(
            speculative_conversions(&create).expect("create"),
            vec![(vec![bare.clone()], vec![volume.clone()])]
        );
        let destroy = offer::Operation {
            r#type: Some(offer::operation::Type::Destroy as i32),
            destroy: Some(offer::operation::Destroy {
                volumes: vec![volume.clone()],
            }),
            ..offer::Operation::default()
        };
        assert_eq!(
            speculative_conversions(&destroy).expect("destroy"),
            vec![(vec![volume], vec![bare])]
        );
        let unreserve = offer::Operation {
            r#type: Some(offer::operation::Type::Unreserve as i32),
            unreserve: Some(offer::operation::Unreserve {
                resources: vec![unreserved],
            }),
            ..offer::Operation::default()
        };
        let error = speculative_conversions(&unreserve).expect_err("nothing to pop");
        assert!(error.contains("no reservation"), "{error}");
    }
}
