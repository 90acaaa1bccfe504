//! Resource arithmetic of the storage local resource provider (spec §6, §7.3).
//!
//! Everything follows Mesos's `src/resource_provider/storage/provider.cpp`
//! (`createRawDiskResource`, `getStoragePools`, `getExistingVolumes`, `computeConversion`,
//! `reconcileResources`) and the parts of `src/common/resources.cpp` those rely on, so that
//! a provider built on it computes the same totals as a Mesos SLRP. Deliberate differences
//! are named on the function they concern.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use slrp_csi::Volume;
use slrp_proto::mesos::v1::resource::disk_info::Source;
use slrp_proto::mesos::v1::resource::disk_info::source::{Mount, Type as SourceType};
use slrp_proto::mesos::v1::resource::reservation_info::Type as ReservationType;
use slrp_proto::mesos::v1::resource::{DiskInfo, ReservationInfo};
use slrp_proto::mesos::v1::value::{Scalar, Type as ValueType};
use slrp_proto::mesos::v1::{Label, Labels, Resource, ResourceProviderId};

/// Bytes in one Mesos megabyte: disk scalars are MB as a double.
const BYTES_PER_MB: f64 = 1_048_576.0;

/// Errors of the resource arithmetic.
#[derive(Debug, thiserror::Error)]
pub enum ResourceError {
    /// A conversion consumes resources the total does not hold (Mesos:
    /// "`<total>` does not contain `<consumed>`", where the reference provider aborts).
    #[error("resources {total} do not contain {consumed}")]
    NotContained {
        /// The resources the conversion was applied to.
        total: String,
        /// What the conversion consumes.
        consumed: String,
    },
    /// A plugin type or name that cannot be a single directory component of the MOUNT
    /// root (§6.8).
    #[error("plugin {field} {value:?} is not a single path component")]
    BadPluginName {
        /// `type` or `name`.
        field: &'static str,
        /// The offending value.
        value: String,
    },
    /// `default_reservations` is not a valid reservation stack (§6.7).
    #[error("default reservation {index} is invalid: {reason}")]
    BadReservation {
        /// Position in the stack, from the bottom.
        index: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
}

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

fn scalar_of(resource: &Resource) -> i64 {
    resource.scalar.map_or(0, |s| fixed(s.value))
}

fn set_scalar(resource: &mut Resource, fixed_value: i64) {
    resource.scalar = Some(Scalar {
        value: floating(fixed_value),
    });
}

fn is_scalar(resource: &Resource) -> bool {
    resource.r#type == ValueType::Scalar as i32
}

/// Mesos `Resources::isEmpty`: a scalar at or below zero in fixed point. Non-scalar
/// resources (never produced by the provider) are kept as they are.
fn is_empty(resource: &Resource) -> bool {
    is_scalar(resource) && scalar_of(resource) <= 0
}

// ---------------------------------------------------------------------------------------
// Equality as Mesos defines it (`operator==` in src/v1/resources.cpp and type_utils.cpp).

/// Mesos compares labels order-insensitively. Mesos checks "same size and every left
/// label occurs on the right", which calls `{a, a, b}` and `{a, b, b}` equal; comparing
/// sorted copies (a multiset comparison) is a deliberate, stricter difference.
fn labels_eq(left: Option<&Labels>, right: Option<&Labels>) -> bool {
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
fn same_kind(left: &Resource, right: &Resource) -> bool {
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
fn addable(left: &Resource, right: &Resource) -> bool {
    same_kind(left, right) && divisibility(left) == Divisibility::Divisible
}

/// Mesos `subtractable`: `right` may be taken out of `left`.
fn subtractable(left: &Resource, right: &Resource) -> bool {
    same_kind(left, right)
        && match divisibility(left) {
            Divisibility::Divisible => true,
            Divisibility::Indivisible => resource_eq(left, right),
        }
}

// ---------------------------------------------------------------------------------------
// Resources.

/// A collection of resources with Mesos's `Resources` algebra (spec §6.9).
///
/// Divisible resources of the same kind are merged into one entry; indivisible ones
/// (disks with an id, MOUNT/BLOCK disks, persistent volumes) stay separate and identical
/// copies are kept as separate entries, which is how Mesos counts them. Empty resources
/// are dropped. Equality is Mesos's: each side contains the other.
///
/// The collection's order ([`Self::iter`]) is the order entries were added in; an entry
/// merged into keeps its place and removing one keeps the order of the others (Mesos
/// moves its last entry into the freed place instead; the reconciliation's "first
/// resource with an id wins" and `computeConversion`'s matching depend on the order, and
/// keeping it makes a repeated reconciliation change nothing).
///
/// Cost: once it holds more than a few entries, a collection keeps an index from a kind
/// key (name, type, provider, reservation types and roles, disk source type, id and
/// profile, persistence id: fields every two resources of the same kind share) to the
/// positions of its entries, so [`Self::add`], [`Self::subtract`] and [`Self::contains`]
/// look only at entries that might be of the same kind, and it removes an entry without
/// shifting the ones behind it (the order is kept by sequence numbers): an operation on a
/// total of 10,000 volumes costs what it costs on 100 ([`Self::apply_in_place`]).
///
/// Limitation: ranges, sets and shared resources are treated as indivisible (Mesos adds
/// ranges and sets and counts shared copies); the provider only deals in disk scalars.
///
/// Memory: entries and index are shared copy-on-write, so a clone costs two reference
/// counts and the first change of either side copies what it changes. The provider's
/// status shares its worker's total this way: the worker holds one copy of a
/// 10,000-entry total at rest instead of two (docs/benchmarks.md, figure 5).
#[derive(Clone, Default)]
pub struct Resources {
    entries: Arc<Vec<Resource>>,
    /// Built once `entries` grows past [`INDEX_FROM`] (small collections, such as the sides
    /// of a conversion, are searched faster than hashed) and kept from then on.
    index: Option<Arc<Index>>,
}

/// Entries up to which a collection is searched linearly.
const INDEX_FROM: usize = 8;

/// A hash of fields [`same_kind`] compares exactly, so that two resources of the same
/// kind always have the same key (different kinds may share one: candidates are still
/// compared with `same_kind`). Labels are left out (they compare as multisets), and so
/// is the allocation info, so that the key is also that of the resource's identity in
/// the durable state (`state::identity`, which clears it): [`Resources::possibly_alike`].
fn kind_key(resource: &Resource) -> u64 {
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

/// The positions of the entries with one kind key; one position (the common case: a
/// volume) needs no allocation of its own.
#[derive(Debug, Clone)]
enum Bucket {
    One(usize),
    Many(Vec<usize>),
}

impl Bucket {
    fn positions(&self) -> &[usize] {
        match self {
            Bucket::One(position) => std::slice::from_ref(position),
            Bucket::Many(positions) => positions,
        }
    }

    fn push(&mut self, position: usize) {
        match self {
            Bucket::One(first) => *self = Bucket::Many(vec![*first, position]),
            Bucket::Many(positions) => positions.push(position),
        }
    }

    /// Removes `position`; false if the bucket is empty afterwards.
    fn remove(&mut self, position: usize) -> bool {
        let Bucket::Many(positions) = self else {
            return false;
        };
        positions.retain(|p| *p != position);
        if let [only] = positions.as_slice() {
            *self = Bucket::One(*only);
        }
        true
    }

    fn replace(&mut self, old: usize, new: usize) {
        match self {
            Bucket::One(position) => *position = new,
            Bucket::Many(positions) => {
                if let Some(p) = positions.iter_mut().find(|p| **p == old) {
                    *p = new;
                }
            }
        }
    }
}

/// Kind key → positions of the entries with that key.
#[derive(Debug, Clone, Default)]
struct Kinds(std::collections::HashMap<u64, Bucket>);

impl Kinds {
    fn positions(&self, key: u64) -> &[usize] {
        self.0.get(&key).map_or(&[], Bucket::positions)
    }

    fn insert(&mut self, key: u64, position: usize) {
        match self.0.entry(key) {
            std::collections::hash_map::Entry::Occupied(mut bucket) => {
                bucket.get_mut().push(position);
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(Bucket::One(position));
            }
        }
    }

    fn remove(&mut self, key: u64, position: usize) {
        if let Some(bucket) = self.0.get_mut(&key)
            && !bucket.remove(position)
        {
            self.0.remove(&key);
        }
    }

    fn replace(&mut self, key: u64, old: usize, new: usize) {
        if let Some(bucket) = self.0.get_mut(&key) {
            bucket.replace(old, new);
        }
    }
}

/// What a large collection keeps beside its entries. Entries are removed by moving the
/// last one into the freed place (no shifting of the entries behind it), so the order of
/// the collection (the order entries were added in, as a plain vector with order-keeping
/// removal has it) is kept apart: every entry has a sequence number, increasing in that
/// order.
#[derive(Debug, Clone)]
struct Index {
    kinds: Kinds,
    /// Sequence number of the entry at each position.
    seqs: Vec<u64>,
    /// Sequence number → position: the collection's order.
    order: BTreeMap<u64, usize>,
    next: u64,
}

impl Index {
    fn build(entries: &[Resource], room: usize) -> Self {
        // Room for what the entries have room for: a collection being filled (see
        // `Resources::reserve`) does not regrow its index either.
        let mut index = Index {
            kinds: Kinds(std::collections::HashMap::with_capacity(room)),
            seqs: Vec::with_capacity(room),
            order: BTreeMap::new(),
            next: 0,
        };
        for (position, entry) in entries.iter().enumerate() {
            index.push(kind_key(entry), position, None);
        }
        index
    }

    /// Records an entry appended at `position`, with sequence number `seq` (a fresh one
    /// if `None`).
    fn push(&mut self, key: u64, position: usize, seq: Option<u64>) {
        let seq = seq.unwrap_or_else(|| {
            self.next += 1;
            self.next - 1
        });
        self.kinds.insert(key, position);
        self.seqs.push(seq);
        self.order.insert(seq, position);
    }
}

/// The positions of the entries that may be of a resource's kind.
enum Candidates<'a> {
    All(std::ops::Range<usize>),
    Indexed(std::slice::Iter<'a, usize>),
}

impl Iterator for Candidates<'_> {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        match self {
            Candidates::All(range) => range.next(),
            Candidates::Indexed(positions) => positions.next().copied(),
        }
    }
}

/// A change to a collection, recorded so that [`Resources::apply_all_in_place`] can take
/// back the conversions before a failing one exactly (entries, values and order).
#[derive(Debug)]
enum Undo {
    /// An entry's scalar was changed (a merge or a partial subtraction).
    Scalar {
        position: usize,
        old: Option<Scalar>,
    },
    /// An entry was appended.
    Pushed,
    /// An entry was removed.
    Removed {
        position: usize,
        resource: Box<Resource>,
        seq: Option<u64>,
    },
}

/// Iterator over the entries of [`Resources`], in its order.
#[derive(Debug, Clone)]
pub struct Iter<'a> {
    inner: IterInner<'a>,
}

#[derive(Debug, Clone)]
enum IterInner<'a> {
    Plain(std::slice::Iter<'a, Resource>),
    Ordered {
        order: std::collections::btree_map::Values<'a, u64, usize>,
        entries: &'a [Resource],
    },
}

impl<'a> Iterator for Iter<'a> {
    type Item = &'a Resource;
    fn next(&mut self) -> Option<&'a Resource> {
        match &mut self.inner {
            IterInner::Plain(entries) => entries.next(),
            IterInner::Ordered { order, entries } => order.next().map(|p| &entries[*p]),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match &self.inner {
            IterInner::Plain(entries) => entries.size_hint(),
            IterInner::Ordered { order, .. } => order.size_hint(),
        }
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        match &mut self.inner {
            IterInner::Plain(entries) => entries.next_back(),
            IterInner::Ordered { order, entries } => order.next_back().map(|p| &entries[*p]),
        }
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl fmt::Debug for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Resources(")?;
        f.debug_list().entries(self.iter()).finish()?;
        f.write_str(")")
    }
}

impl Resources {
    /// No resources.
    pub fn new() -> Self {
        Self::default()
    }

    /// The entries as stored. Until an entry of a collection of more than a few entries
    /// is removed this is the collection's order ([`Self::iter`]); after that, an order
    /// of its own (everything that sends or compares a whole total treats it as a set,
    /// as Mesos does). [`Self::to_vec`] has the collection's order.
    pub fn as_slice(&self) -> &[Resource] {
        &self.entries
    }

    /// The entries, in the collection's order.
    pub fn to_vec(&self) -> Vec<Resource> {
        self.iter().cloned().collect()
    }

    /// The entries, in the collection's order.
    pub fn into_vec(self) -> Vec<Resource> {
        let entries = Arc::unwrap_or_clone(self.entries);
        let Some(index) = self.index else {
            return entries;
        };
        let mut slots: Vec<Option<Resource>> = entries.into_iter().map(Some).collect();
        index
            .order
            .values()
            .filter_map(|position| slots[*position].take())
            .collect()
    }

    /// Iterates over the entries in the collection's order: the order they were added
    /// in (an entry merged into keeps its place).
    pub fn iter(&self) -> Iter<'_> {
        let inner = match &self.index {
            None => IterInner::Plain(self.entries.iter()),
            Some(index) => IterInner::Ordered {
                order: index.order.values(),
                entries: &self.entries,
            },
        };
        Iter { inner }
    }

    /// The entries that may be of `resource`'s kind whatever their quantity and
    /// allocation info (every such entry, and maybe others: callers compare), in the
    /// collection's order. Costs what the result holds once the collection is indexed.
    pub fn possibly_alike<'a>(&'a self, resource: &Resource) -> Vec<&'a Resource> {
        let mut positions: Vec<usize> = self.candidates(resource).collect();
        if let Some(index) = &self.index {
            positions.sort_unstable_by_key(|position| index.seqs[*position]);
        }
        positions.iter().map(|p| &self.entries[*p]).collect()
    }

    /// Number of entries (not of resources' quantities).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries that are normalized already: no two of them merge under [`Self::add`] and
    /// none is empty (e.g. the durable total's records, one per identity). Taken as they
    /// are, without `add`'s search for an entry to merge with.
    pub(crate) fn from_normalized(entries: Vec<Resource>) -> Self {
        let index = (entries.len() > INDEX_FROM)
            .then(|| Arc::new(Index::build(&entries, entries.capacity())));
        Self {
            entries: Arc::new(entries),
            index,
        }
    }

    /// The entries and the index to change (copied first if shared with a clone).
    fn parts_mut(&mut self) -> (&mut Vec<Resource>, Option<&mut Index>) {
        (
            Arc::make_mut(&mut self.entries),
            self.index.as_mut().map(Arc::make_mut),
        )
    }

    /// Indexes the collection from now on.
    fn build_index(&mut self) {
        self.index = Some(Arc::new(Index::build(
            &self.entries,
            self.entries.capacity(),
        )));
    }

    /// Room for `additional` more entries. Filling a large collection one `add` at a time
    /// regrew its vector of (large) entries again and again; with 10,000 volumes the
    /// regrowth's copies and page faults were a fifth of a reconciliation.
    fn reserve(&mut self, additional: usize) {
        let (entries, index) = self.parts_mut();
        entries.reserve(additional);
        if let Some(index) = index {
            index.seqs.reserve(additional);
            index.kinds.0.reserve(additional);
        }
    }

    fn candidates(&self, resource: &Resource) -> Candidates<'_> {
        match &self.index {
            None => Candidates::All(0..self.entries.len()),
            Some(index) => Candidates::Indexed(index.kinds.positions(kind_key(resource)).iter()),
        }
    }

    /// The first entry (in the collection's order) of which `wanted` holds. Only entries
    /// of the resource's kind key are looked at: `wanted` must imply [`same_kind`].
    fn first(&self, resource: &Resource, wanted: impl Fn(&Resource) -> bool) -> Option<usize> {
        let found = self
            .candidates(resource)
            .filter(|position| wanted(&self.entries[*position]));
        match &self.index {
            None => found.min(),
            Some(index) => found.min_by_key(|position| index.seqs[*position]),
        }
    }

    fn push(&mut self, resource: Resource, seq: Option<u64>) {
        let (entries, index) = self.parts_mut();
        if let Some(index) = index {
            index.push(kind_key(&resource), entries.len(), seq);
        }
        entries.push(resource);
        if self.index.is_none() && self.entries.len() > INDEX_FROM {
            self.build_index();
        }
    }

    fn pop(&mut self) {
        let (entries, index) = self.parts_mut();
        let Some(resource) = entries.pop() else {
            return;
        };
        if let Some(index) = index {
            let position = entries.len();
            index.kinds.remove(kind_key(&resource), position);
            if let Some(seq) = index.seqs.pop() {
                index.order.remove(&seq);
            }
        }
    }

    /// Removes the entry at `position`; returns it with its sequence number. Small
    /// collections shift the entries behind it; indexed ones move the last entry into
    /// its place (their order is kept by the sequence numbers).
    fn remove(&mut self, position: usize) -> (Resource, Option<u64>) {
        let (entries, index) = self.parts_mut();
        let Some(index) = index else {
            return (entries.remove(position), None);
        };
        let last = entries.len() - 1;
        let resource = entries.swap_remove(position);
        let seq = index.seqs.swap_remove(position);
        index.order.remove(&seq);
        index.kinds.remove(kind_key(&resource), position);
        if position != last {
            index.order.insert(index.seqs[position], position);
            index
                .kinds
                .replace(kind_key(&entries[position]), last, position);
        }
        (resource, Some(seq))
    }

    /// Undoes [`Self::remove`].
    fn reinsert(&mut self, position: usize, resource: Resource, seq: Option<u64>) {
        if self.index.is_none() {
            Arc::make_mut(&mut self.entries).insert(position, resource);
            return;
        }
        let last = self.entries.len();
        self.push(resource, seq);
        let (entries, Some(index)) = self.parts_mut() else {
            return;
        };
        if position == last {
            return;
        }
        entries.swap(position, last);
        index.seqs.swap(position, last);
        index.order.insert(index.seqs[position], position);
        index.order.insert(index.seqs[last], last);
        let (back, moved) = (kind_key(&entries[position]), kind_key(&entries[last]));
        // With one key both positions stay in its bucket.
        if back != moved {
            index.kinds.replace(back, last, position);
            index.kinds.replace(moved, position, last);
        }
    }

    fn undo(&mut self, log: Vec<Undo>) {
        for change in log.into_iter().rev() {
            match change {
                Undo::Scalar { position, old } => {
                    Arc::make_mut(&mut self.entries)[position].scalar = old;
                }
                Undo::Pushed => self.pop(),
                Undo::Removed {
                    position,
                    resource,
                    seq,
                } => self.reinsert(position, *resource, seq),
            }
        }
    }

    /// Mesos `Resources::add`: merged into the first addable entry, else appended; empty
    /// resources are ignored. Merging adds in fixed point, so merged scalars are rounded
    /// to 0.001 (Mesos does the same).
    pub fn add(&mut self, resource: &Resource) {
        self.add_logged(resource, None);
    }

    fn add_logged(&mut self, resource: &Resource, log: Option<&mut Vec<Undo>>) {
        if is_empty(resource) {
            return;
        }
        match self.first(resource, |entry| addable(entry, resource)) {
            Some(position) => {
                let entry = &mut Arc::make_mut(&mut self.entries)[position];
                if let Some(log) = log {
                    log.push(Undo::Scalar {
                        position,
                        old: entry.scalar,
                    });
                }
                let sum = scalar_of(entry).saturating_add(scalar_of(resource));
                set_scalar(entry, sum);
            }
            None => {
                self.push(resource.clone(), None);
                if let Some(log) = log {
                    log.push(Undo::Pushed);
                }
            }
        }
    }

    /// Mesos `Resources::subtract`: taken out of the first subtractable entry; an entry
    /// that becomes empty or negative is removed (subtracting more than is there is not
    /// an error, exactly as in Mesos: use [`Resources::contains`] first).
    pub fn subtract(&mut self, resource: &Resource) {
        self.subtract_logged(resource, None);
    }

    fn subtract_logged(&mut self, resource: &Resource, log: Option<&mut Vec<Undo>>) {
        if is_empty(resource) {
            return;
        }
        let Some(position) = self.first(resource, |entry| subtractable(entry, resource)) else {
            return;
        };
        let entry = &mut Arc::make_mut(&mut self.entries)[position];
        let left = scalar_of(entry).saturating_sub(scalar_of(resource));
        if is_scalar(resource) && left > 0 {
            if let Some(log) = log {
                log.push(Undo::Scalar {
                    position,
                    old: entry.scalar,
                });
            }
            set_scalar(entry, left);
        } else {
            let (resource, seq) = self.remove(position);
            if let Some(log) = log {
                log.push(Undo::Removed {
                    position,
                    resource: Box::new(resource),
                    seq,
                });
            }
        }
    }

    /// Mesos `Resources::contains`: `other` can be subtracted without anything going
    /// short.
    ///
    /// The subtractions are not carried out on a copy: only what they leave of the
    /// entries they touch is tracked. Which of several candidate entries a subtraction
    /// takes does not change the answer: entries of one kind are either a single
    /// divisible one or indivisible ones that a resource subtracts only when it equals
    /// them, so all candidates are alike for every later resource.
    pub fn contains(&self, other: &Resources) -> bool {
        // Fixed-point value left in each touched entry; `None`: taken out.
        let mut left: std::collections::HashMap<usize, Option<i64>> =
            std::collections::HashMap::new();
        for resource in other {
            let mut first: Option<(usize, i64)> = None;
            let mut found = false;
            for position in self.candidates(resource) {
                let entry = &self.entries[position];
                let Some(value) = left
                    .get(&position)
                    .copied()
                    .unwrap_or_else(|| Some(scalar_of(entry)))
                else {
                    continue;
                };
                if !subtractable(entry, resource) {
                    continue;
                }
                found |= !is_scalar(resource) || scalar_of(resource) <= value;
                if first.is_none_or(|(p, _)| position < p) {
                    first = Some((position, value));
                }
            }
            if !found {
                return false;
            }
            if is_empty(resource) {
                continue;
            }
            if let Some((position, value)) = first {
                let rest = value.saturating_sub(scalar_of(resource));
                left.insert(position, (is_scalar(resource) && rest > 0).then_some(rest));
            }
        }
        true
    }

    /// Mesos `Resources::filter`.
    pub fn filter(&self, keep: impl Fn(&Resource) -> bool) -> Resources {
        let kept: Vec<&Resource> = self.iter().filter(|r| keep(r)).collect();
        let mut all = Resources::new();
        all.reserve(kept.len());
        for resource in kept {
            all.add(resource);
        }
        all
    }

    fn not_contained(&self, conversion: &Conversion) -> ResourceError {
        ResourceError::NotContained {
            total: self.to_string(),
            consumed: conversion.consumed.to_string(),
        }
    }

    /// Mesos `Resources::apply(ResourceConversion)`, into a new collection (one copy of
    /// `self`); see [`Self::apply_in_place`].
    ///
    /// # Errors
    /// [`ResourceError::NotContained`] if `self` does not contain `conversion.consumed`
    /// (where the reference provider aborts, this returns the error).
    pub fn apply(&self, conversion: &Conversion) -> Result<Resources, ResourceError> {
        if !self.contains(&conversion.consumed) {
            return Err(self.not_contained(conversion));
        }
        let mut result = self.clone();
        result.apply_unchecked(conversion, None);
        Ok(result)
    }

    /// Mesos `Resources::apply(ResourceConversion)` on `self`: checks that `self` contains
    /// `conversion.consumed`, then takes it out and adds `conversion.converted`. Costs
    /// what the conversion touches, not the size of `self`; on error `self` is unchanged
    /// (only then is the whole total formatted, for the message).
    ///
    /// # Errors
    /// [`ResourceError::NotContained`] as [`Self::apply`].
    pub fn apply_in_place(&mut self, conversion: &Conversion) -> Result<(), ResourceError> {
        if !self.contains(&conversion.consumed) {
            return Err(self.not_contained(conversion));
        }
        self.apply_unchecked(conversion, None);
        Ok(())
    }

    fn apply_unchecked(&mut self, conversion: &Conversion, mut log: Option<&mut Vec<Undo>>) {
        for resource in &conversion.consumed {
            self.subtract_logged(resource, log.as_deref_mut());
        }
        for resource in &conversion.converted {
            self.add_logged(resource, log.as_deref_mut());
        }
    }

    /// Applies conversions one after the other (Mesos `apply(vector<ResourceConversion>)`).
    ///
    /// # Errors
    /// The first conversion that cannot be applied.
    pub fn apply_all<'a>(
        &self,
        conversions: impl IntoIterator<Item = &'a Conversion>,
    ) -> Result<Resources, ResourceError> {
        let mut result = self.clone();
        result.apply_all_in_place(conversions)?;
        Ok(result)
    }

    /// [`Self::apply_all`] on `self`, all or nothing: if a conversion cannot be applied,
    /// the ones before it are taken back exactly (entries, values and order) and `self`
    /// is as it was.
    ///
    /// # Errors
    /// The first conversion that cannot be applied; its message names the total it was
    /// applied to (with the conversions before it applied), as [`Self::apply_all`]'s.
    pub fn apply_all_in_place<'a>(
        &mut self,
        conversions: impl IntoIterator<Item = &'a Conversion>,
    ) -> Result<(), ResourceError> {
        let conversions: Vec<&Conversion> = conversions.into_iter().collect();
        // Positions in the log mean one thing throughout only if the collection does not
        // become indexed half-way (small ones shift entries on removal, indexed ones move
        // the last entry): index it now if the conversions could make it grow past
        // the limit.
        let most = conversions.iter().map(|c| c.converted.len()).sum::<usize>();
        if self.index.is_none() && self.entries.len() + most > INDEX_FROM {
            self.build_index();
        }
        let mut log = Vec::new();
        for conversion in conversions {
            if !self.contains(&conversion.consumed) {
                let error = self.not_contained(conversion);
                self.undo(log);
                return Err(error);
            }
            self.apply_unchecked(conversion, Some(&mut log));
        }
        Ok(())
    }
}

impl FromIterator<Resource> for Resources {
    fn from_iter<I: IntoIterator<Item = Resource>>(iter: I) -> Self {
        let mut all = Resources::new();
        for resource in iter {
            all.add(&resource);
        }
        all
    }
}

impl<'a> FromIterator<&'a Resource> for Resources {
    fn from_iter<I: IntoIterator<Item = &'a Resource>>(iter: I) -> Self {
        let mut all = Resources::new();
        for resource in iter {
            all.add(resource);
        }
        all
    }
}

impl From<Resource> for Resources {
    fn from(resource: Resource) -> Self {
        std::iter::once(resource).collect()
    }
}

impl<'a> IntoIterator for &'a Resources {
    type Item = &'a Resource;
    type IntoIter = Iter<'a>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl std::ops::Add<&Resources> for Resources {
    type Output = Resources;
    fn add(mut self, other: &Resources) -> Resources {
        for resource in other {
            Resources::add(&mut self, resource);
        }
        self
    }
}

impl std::ops::Sub<&Resources> for Resources {
    type Output = Resources;
    fn sub(mut self, other: &Resources) -> Resources {
        for resource in other {
            self.subtract(resource);
        }
        self
    }
}

impl PartialEq for Resources {
    fn eq(&self, other: &Self) -> bool {
        self.contains(other) && other.contains(self)
    }
}

/// Compact text for logs and errors, close to Mesos's stringification:
/// `disk(reservations: [role,…])[RAW(vendor,id,profile)]:1024`.
impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, resource) in self.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}", DisplayResource(resource))?;
        }
        f.write_str("]")
    }
}

/// Display of one resource in the format of [`Resources`]' `Display`. Metadata values
/// are not printed (a plugin's volume context may hold anything).
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

/// Mesos `ResourceConversion`: take `consumed` out, put `converted` in.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Conversion {
    /// Resources removed from the total.
    pub consumed: Resources,
    /// Resources added to the total.
    pub converted: Resources,
}

impl Conversion {
    /// Whether applying it changes nothing.
    pub fn is_noop(&self) -> bool {
        self.consumed.is_empty() && self.converted.is_empty()
    }
}

// ---------------------------------------------------------------------------------------
// Accessors on disk sources.

fn source(resource: &Resource) -> Option<&Source> {
    resource.disk.as_ref()?.source.as_ref()
}

fn source_mut(resource: &mut Resource) -> &mut Source {
    resource
        .disk
        .get_or_insert_with(DiskInfo::default)
        .source
        .get_or_insert_with(Source::default)
}

fn disk_id(resource: &Resource) -> Option<&str> {
    source(resource)?.id.as_deref()
}

fn disk_profile(resource: &Resource) -> Option<&str> {
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
// The provider context.

/// What every provider resource is built from (spec §6.1, §6.7, §6.8).
#[derive(Debug, Clone)]
pub struct ProviderResources {
    provider_id: ResourceProviderId,
    vendor: String,
    default_reservations: Vec<ReservationInfo>,
    mount_root: String,
}

impl ProviderResources {
    /// The context of the provider `provider_id` serving plugin `plugin_type`/`plugin_name`
    /// with `default_reservations` (`ResourceProviderInfo.default_reservations`).
    ///
    /// # Errors
    /// - [`ResourceError::BadPluginName`]: the plugin type or name is empty, `.`, `..` or
    ///   holds a `/` or NUL (it becomes a directory of the MOUNT root; Mesos does not
    ///   check, see spec §12).
    /// - [`ResourceError::BadReservation`]: the stack is not "first STATIC or DYNAMIC, the
    ///   rest DYNAMIC, each role a child of the one below" (§6.7; Mesos validates this when
    ///   the config is read).
    pub fn new(
        provider_id: ResourceProviderId,
        plugin_type: &str,
        plugin_name: &str,
        default_reservations: Vec<ReservationInfo>,
    ) -> Result<Self, ResourceError> {
        for (field, value) in [("type", plugin_type), ("name", plugin_name)] {
            if value.is_empty() || value == "." || value == ".." || value.contains(['/', '\0']) {
                return Err(ResourceError::BadPluginName {
                    field,
                    value: value.to_owned(),
                });
            }
        }
        validate_reservations(&default_reservations)?;
        Ok(Self {
            provider_id,
            vendor: format!("{plugin_type}.{plugin_name}"),
            default_reservations,
            mount_root: format!("./csi/{plugin_type}/{plugin_name}/mounts"),
        })
    }

    /// `<plugin type>.<plugin name>`, the `disk.source.vendor` of every resource.
    pub fn vendor(&self) -> &str {
        &self.vendor
    }

    /// The provider id every resource carries.
    pub fn provider_id(&self) -> &ResourceProviderId {
        &self.provider_id
    }

    /// The default reservation stack.
    pub fn default_reservations(&self) -> &[ReservationInfo] {
        &self.default_reservations
    }

    /// `./csi/<plugin type>/<plugin name>/mounts`: the `mount.root` of MOUNT disks,
    /// relative to the agent's work dir (§6.8; Mesos `csi::paths::getMountRootDir` on
    /// `getCsiRootDir(".")`).
    pub fn mount_root(&self) -> &str {
        &self.mount_root
    }

    /// The `disk.source.mount` a MOUNT disk of this provider carries.
    pub fn mount_source(&self) -> Mount {
        Mount {
            root: Some(self.mount_root.clone()),
        }
    }

    /// Mesos `createRawDiskResource` with the provider's vendor (§6.1): `bytes` as MB
    /// (not rounded), the provider id, the default reservations verbatim, a RAW source.
    pub fn raw_disk(
        &self,
        bytes: u64,
        profile: Option<&str>,
        id: Option<&str>,
        metadata: Option<Labels>,
    ) -> Resource {
        self.raw_disk_mb(
            bytes as f64 / BYTES_PER_MB,
            profile,
            Some(&self.vendor),
            id,
            metadata,
        )
    }

    fn raw_disk_mb(
        &self,
        megabytes: f64,
        profile: Option<&str>,
        vendor: Option<&str>,
        id: Option<&str>,
        metadata: Option<Labels>,
    ) -> Resource {
        Resource {
            provider_id: Some(self.provider_id.clone()),
            name: "disk".to_owned(),
            r#type: ValueType::Scalar as i32,
            scalar: Some(Scalar { value: megabytes }),
            role: None,
            reservations: self.default_reservations.clone(),
            disk: Some(DiskInfo {
                persistence: None,
                volume: None,
                source: Some(Source {
                    r#type: SourceType::Raw as i32,
                    path: None,
                    mount: None,
                    vendor: vendor.map(str::to_owned),
                    id: id.map(str::to_owned),
                    metadata,
                    profile: profile.map(str::to_owned),
                }),
            }),
            ..Resource::default()
        }
    }

    /// Storage pools from GetCapacity answers (§6.2, Mesos `getStoragePools`): one RAW
    /// resource per `(profile, available bytes)`, without id or metadata; zero capacities
    /// are dropped.
    pub fn storage_pools<'a>(
        &self,
        capacities: impl IntoIterator<Item = (&'a str, u64)>,
    ) -> Resources {
        capacities
            .into_iter()
            .map(|(profile, bytes)| self.raw_disk(bytes, Some(profile), None, None))
            .collect()
    }

    /// Mesos `computeConversion(checkpointed, discovered)` (§6.4): keep what frameworks
    /// converted, drop untouched resources the plugin no longer reports, add newly
    /// reported ones.
    ///
    /// For each checkpointed resource its "unconverted" form (a fresh RAW disk of the same
    /// size, profile, vendor, id and metadata with the *current* default reservations) is
    /// looked up in what is left of `discovered`: found, it is not new; not found and the
    /// checkpointed resource is unconverted, it is removed; otherwise it is kept and
    /// reported in [`ComputedConversion::missing_converted`] (Mesos logs "Missing converted
    /// resource").
    ///
    /// Difference: Mesos rebuilds the size through `Bytes(mb × 1048576)` (truncating to
    /// whole bytes); this keeps the MB value, which compares equal at the 0.001 MB
    /// granularity of every comparison involved.
    pub fn compute_conversion(
        &self,
        checkpointed: &Resources,
        discovered: &Resources,
    ) -> ComputedConversion {
        self.compute_conversion_from(checkpointed, discovered.clone())
    }

    /// [`Self::compute_conversion`] taking `discovered`: a caller that built it for this
    /// saves a copy of a collection as large as the total.
    fn compute_conversion_from<'a>(
        &self,
        checkpointed: impl IntoIterator<Item = &'a Resource>,
        discovered: Resources,
    ) -> ComputedConversion {
        let mut to_add = discovered;
        let mut to_remove = Resources::new();
        let mut missing_converted = Vec::new();
        for resource in checkpointed {
            let unconverted = Resources::from(self.unconverted(resource));
            if to_add.contains(&unconverted) {
                to_add = to_add - &unconverted;
            } else if unconverted == Resources::from(resource.clone()) {
                to_remove = to_remove + &unconverted;
            } else {
                missing_converted.push(resource.clone());
            }
        }
        ComputedConversion {
            conversion: Conversion {
                consumed: to_remove,
                converted: to_add,
            },
            missing_converted,
        }
    }

    /// The "unconverted" form of `resource` (Mesos `computeConversion`): a fresh RAW disk
    /// of the same size, profile, vendor, id and metadata with the *current* default
    /// reservations, as the plugin's answers would make it.
    fn unconverted(&self, resource: &Resource) -> Resource {
        let source = source(resource);
        let field = |get: fn(&Source) -> Option<&String>| source.and_then(get);
        self.raw_disk_mb(
            resource.scalar.map_or(0.0, |s| s.value),
            field(|s| s.profile.as_ref()).map(String::as_str),
            field(|s| s.vendor.as_ref()).map(String::as_str),
            field(|s| s.id.as_ref()).map(String::as_str),
            source.and_then(|s| s.metadata.clone()),
        )
    }

    /// The pool part of a reconciliation (§6.2, Mesos `getStoragePools`), with pending
    /// creates taken into account.
    ///
    /// `in_flight` is what pending CREATE_DISK operations consume (RAW pool resources the
    /// total still holds until they finish). Difference from Mesos: both the checkpointed
    /// pools and the GetCapacity answers have `in_flight` taken out before
    /// [`compute_conversion`](Self::compute_conversion), so (a) the conversion never
    /// removes space a pending operation consumes (in Mesos a plugin that shrinks its
    /// capacity while a create runs can leave the total without the operation's consumed
    /// resources, and applying its result then aborts), and (b) the capacity reported to
    /// the manager excludes volumes still being created whether or not the plugin's
    /// GetCapacity already counts them. A plugin that already counts them is
    /// under-reported until the next reconciliation after the create finishes; space is
    /// never offered twice.
    ///
    /// The in-flight part is taken out of the checkpointed pools as it is (it is in the
    /// total with its reservations) but out of the answers in its unconverted form: the
    /// answers are fresh RAW disks with the default reservations, from which a RESERVEd
    /// part (or one of a provider whose default reservations changed) would subtract
    /// nothing, and its space would be offered twice.
    pub fn reconcile_pools(
        &self,
        total: &Resources,
        discovered: &Resources,
        in_flight: &Resources,
    ) -> ComputedConversion {
        let checkpointed = total.filter(is_storage_pool) - in_flight;
        let claimed: Resources = in_flight.iter().map(|r| self.unconverted(r)).collect();
        self.compute_conversion_from(&checkpointed, discovered.clone() - &claimed)
    }

    /// The volume part of a reconciliation (§6.3, Mesos `getExistingVolumes`) from a
    /// ListVolumes answer.
    ///
    /// 1. Resources of `total` with an id already seen are duplicates (a non-conforming
    ///    plugin) and are removed.
    /// 2. Each listed volume becomes a RAW disk with the vendor, its id, capacity and
    ///    context as metadata (none if empty) and the profile of the checkpointed
    ///    resource with that id; a repeated id in the listing is ignored after the first.
    ///    Difference: a volume with a checkpointed resource (and a listed size) takes that
    ///    resource's size, so a plugin whose sizes differ from the requested ones (spec
    ///    §12 item 28) does not make a second resource of the same volume.
    /// 3. A checkpointed resource whose metadata differs from the listed context is
    ///    replaced by a copy with the listed metadata (its conversions kept).
    /// 4. [`compute_conversion`](Self::compute_conversion) over the resources with an id
    ///    after step 1 and 3.
    ///
    /// As in Mesos, a volume listed with capacity 0 (unknown) makes an empty resource and
    /// is therefore not discovered; a negative capacity counts as 0.
    ///
    /// # Errors
    /// [`ResourceError::NotContained`] if the cleanup does not apply to `total`, which
    /// only a `total` holding mergeable disks with ids (PATH disks) can cause; Mesos
    /// aborts there.
    pub fn existing_volumes(
        &self,
        total: &Resources,
        listed: &[Volume],
    ) -> Result<ExistingVolumes, ResourceError> {
        let mut cleanup = Conversion::default();
        let mut duplicates = Vec::new();
        let mut by_id: BTreeMap<&str, &Resource> = BTreeMap::new();
        for resource in total {
            let Some(id) = disk_id(resource) else {
                continue;
            };
            if by_id.contains_key(id) {
                cleanup.consumed.add(resource);
                duplicates.push(resource.clone());
            } else {
                by_id.insert(id, resource);
            }
        }

        let mut discovered = Resources::new();
        discovered.reserve(listed.len());
        let mut seen = BTreeSet::new();
        let mut repeated_in_listing = Vec::new();
        let mut drifted = Vec::new();
        for volume in listed {
            let id = volume.volume_id.as_str();
            if !seen.insert(id) {
                repeated_in_listing.push(id.to_owned());
                continue;
            }
            let checkpointed = by_id.get(id).copied();
            let metadata = (!volume.volume_context.is_empty())
                .then(|| labels_from_context(&volume.volume_context));
            // A known volume keeps the size its resource has: a plugin that created more
            // than was asked (or lists a rounded size) still has the same volume, and
            // the disk's size is the one frameworks were given (`created_disk`). The
            // listed size counts for volumes not in the total, and a zero listed size
            // still means "unknown" (not discovered), as in Mesos.
            let listed_bytes = u64::try_from(volume.capacity_bytes).unwrap_or(0);
            let discovered_disk = match checkpointed {
                Some(known) if listed_bytes > 0 => self.raw_disk_mb(
                    known.scalar.map_or(0.0, |s| s.value),
                    disk_profile(known),
                    Some(&self.vendor),
                    Some(id),
                    metadata.clone(),
                ),
                _ => self.raw_disk(
                    listed_bytes,
                    checkpointed.and_then(disk_profile),
                    Some(id),
                    metadata.clone(),
                ),
            };
            discovered.add(&discovered_disk);
            let Some(checkpointed) = checkpointed else {
                continue;
            };
            // Mesos compares with `metadata.getOrElse(Labels())`: absent and empty agree.
            let current = source(checkpointed).and_then(|s| s.metadata.as_ref());
            let wanted = metadata.clone().unwrap_or_default();
            if !labels_eq(
                Some(current.cloned().unwrap_or_default()).as_ref(),
                Some(&wanted),
            ) {
                cleanup.consumed.add(checkpointed);
                let mut changed = checkpointed.clone();
                source_mut(&mut changed).metadata = metadata;
                cleanup.converted.add(&changed);
                drifted.push(id.to_owned());
            }
        }

        // The common case (a conforming plugin whose listing matches) needs no copy of
        // the total's volumes: a copy was a third of the subscription's peak of memory
        // with 10,000 volumes.
        let merge = if cleanup.is_noop() {
            self.compute_conversion_from(total.iter().filter(|r| disk_id(r).is_some()), discovered)
        } else {
            let with_id = total.filter(|r| disk_id(r).is_some()).apply(&cleanup)?;
            self.compute_conversion_from(&with_id, discovered)
        };
        Ok(ExistingVolumes {
            cleanup,
            merge,
            duplicates,
            drifted,
            repeated_in_listing,
        })
    }

    /// Mesos `reconcileResources` (§6.5) without the I/O: applies the volume conversions
    /// and then the pool conversion to `total` and says what changed. The caller
    /// checkpoints and sends UPDATE_STATE when [`Reconciled::changed`] (or always after a
    /// subscription).
    ///
    /// # Errors
    /// [`ResourceError::NotContained`] if a conversion does not apply (Mesos aborts).
    pub fn reconcile(
        &self,
        total: &Resources,
        volumes: &ExistingVolumes,
        pools: &ComputedConversion,
    ) -> Result<Reconciled, ResourceError> {
        let conversions = [
            &volumes.cleanup,
            &volumes.merge.conversion,
            &pools.conversion,
        ];
        // Nothing to apply (every reconciliation of a provider whose plugin and profiles
        // agree with its checkpoint, e.g. at each start): the total as it is. The general
        // path below would say the same after two copies of the total and a subtraction
        // of it from itself each way, which with 10,000 volumes was a tenth of the start.
        if conversions.iter().all(|c| c.is_noop()) {
            return Ok(Reconciled {
                total: None,
                changed: false,
                removed: Resources::new(),
                added: Resources::new(),
            });
        }
        let result = total.apply_all(conversions)?;
        // Only entries of a kind the conversions touch can differ: subtraction, addition
        // and `contains` pair an entry only with entries of its kind, whose kind key is
        // the same, and the other kinds' entries are the same in both totals (so they
        // cancel in either difference and compare equal). Comparing and subtracting just
        // the touched kinds gives Mesos's whole-total answers, in the same order, without
        // copying and subtracting 10,000 untouched volumes when one pool changed.
        let keys: std::collections::HashSet<u64> = conversions
            .iter()
            .flat_map(|c| c.consumed.iter().chain(c.converted.iter()))
            .map(kind_key)
            .collect();
        let touched = |r: &Resource| keys.contains(&kind_key(r));
        let (before, after) = (total.filter(touched), result.filter(touched));
        let changed = before != after;
        Ok(Reconciled {
            changed,
            removed: before.clone() - &after,
            added: after - &before,
            total: changed.then_some(result),
        })
    }
}

impl ProviderResources {
    /// The conversion of a finished CREATE_DISK (Mesos `applyCreateDisk`): `source` (a
    /// pool, or a RAW disk with an id for a pre-existing volume) becomes a `kind` disk
    /// with the plugin's volume id, the profile, the volume context as metadata (left as
    /// it was if the context is empty) and, for MOUNT, this provider's
    /// [`mount_root`](Self::mount_root). Reservations and everything else are kept.
    ///
    /// The disk keeps the consumed size, as in Mesos, whatever size the plugin created:
    /// a Mesos master applies the conversion to the framework's allocation and aborts
    /// when a conversion changes a quantity other than by removing it (its allocator's
    /// invariant, MESOS-8825). A plugin that rounds sizes (spec §12 item 28) is handled
    /// by the reconciliation instead: a listed volume of a known id keeps the
    /// checkpointed size ([`Self::existing_volumes`]); the real size is the volume
    /// manager's record.
    pub fn created_disk(
        &self,
        source: &Resource,
        created: &CreatedVolume<'_>,
        kind: CreatedKind,
    ) -> Conversion {
        let mut disk = source.clone();
        let s = source_mut(&mut disk);
        s.id = Some(created.id.to_owned());
        s.profile = Some(created.profile.to_owned());
        if !created.context.is_empty() {
            s.metadata = Some(labels_from_context(created.context));
        }
        match kind {
            CreatedKind::Mount => {
                s.r#type = SourceType::Mount as i32;
                s.mount = Some(self.mount_source());
            }
            CreatedKind::Block => s.r#type = SourceType::Block as i32,
        }
        Conversion {
            consumed: Resources::from(source.clone()),
            converted: Resources::from(disk),
        }
    }

    /// The conversion of a finished DESTROY_DISK (Mesos `applyDestroyDisk`): the disk
    /// becomes RAW again (MOUNT root cleared).
    ///
    /// - `deprovisioned` (the plugin deleted the volume): id and metadata are cleared, so
    ///   the space returns to its pool; if the disk has no profile or `profile_known`
    ///   says its profile is gone, the space is returned as nothing (an empty converted
    ///   side) and [`DestroyedDisk::reconcile_pools`] asks for a pool reconciliation, which
    ///   lets the currently existing profiles claim it.
    /// - not deprovisioned (no DeleteVolume capability): the volume stays, as a RAW disk
    ///   with its id and no profile.
    pub fn destroyed_disk(
        &self,
        resource: &Resource,
        deprovisioned: bool,
        profile_known: impl Fn(&str) -> bool,
    ) -> DestroyedDisk {
        let mut raw = resource.clone();
        let s = source_mut(&mut raw);
        s.r#type = SourceType::Raw as i32;
        s.mount = None;
        let mut reconcile_pools = false;
        if deprovisioned {
            s.id = None;
            s.metadata = None;
            if !s.profile.as_deref().is_some_and(&profile_known) {
                raw.scalar = Some(Scalar { value: 0.0 });
                reconcile_pools = true;
            }
        } else {
            s.profile = None;
        }
        DestroyedDisk {
            conversion: Conversion {
                consumed: Resources::from(resource.clone()),
                converted: Resources::from(raw),
            },
            reconcile_pools,
        }
    }
}

/// What CREATE_DISK made, for [`ProviderResources::created_disk`].
#[derive(Debug, Clone, Copy)]
pub struct CreatedVolume<'a> {
    /// The plugin's volume id.
    pub id: &'a str,
    /// The volume context (becomes the disk's metadata).
    pub context: &'a BTreeMap<String, String>,
    /// The profile the disk was created with.
    pub profile: &'a str,
}

/// The disk type CREATE_DISK produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreatedKind {
    /// A MOUNT disk (a file system the agent mounts under the MOUNT root).
    Mount,
    /// A BLOCK disk.
    Block,
}

/// The result of [`ProviderResources::destroyed_disk`].
#[derive(Debug, Clone, PartialEq)]
pub struct DestroyedDisk {
    /// The disk out, the freed RAW resource (possibly nothing) in.
    pub conversion: Conversion,
    /// The freed space had no live profile: reconcile the pools to recover it (Mesos
    /// does so unless a reconciliation is already pending).
    pub reconcile_pools: bool,
}

/// Mesos validates `default_reservations` with `Resources::validate` on the reservation
/// stack; these are the rules that matter to the provider.
fn validate_reservations(stack: &[ReservationInfo]) -> Result<(), ResourceError> {
    let mut parent: Option<&str> = None;
    for (index, reservation) in stack.iter().enumerate() {
        let bad = |reason| Err(ResourceError::BadReservation { index, reason });
        let kind = reservation
            .r#type
            .and_then(|t| ReservationType::try_from(t).ok());
        match (index, kind) {
            (0, Some(ReservationType::Static | ReservationType::Dynamic))
            | (_, Some(ReservationType::Dynamic)) => {}
            (0, _) => return bad("the first reservation must be STATIC or DYNAMIC"),
            (_, _) => return bad("a refined reservation must be DYNAMIC"),
        }
        let Some(role) = reservation.role.as_deref().filter(|r| !r.is_empty()) else {
            return bad("the role is missing");
        };
        // Mesos `roles::validate`: no empty, `.`, `..` or `-`-prefixed component, no
        // whitespace or DEL; `*` cannot be reserved for.
        let bad_part =
            |part: &str| part.is_empty() || part == "." || part == ".." || part.starts_with('-');
        let bad_char = |c: char| c.is_ascii_whitespace() || c == '\x0b' || c == '\x7f';
        if role == "*" || role.contains(bad_char) || role.split('/').any(bad_part) {
            return bad("the role is not a valid role name");
        }
        if let Some(parent) = parent
            && !role
                .strip_prefix(parent)
                .is_some_and(|rest| rest.starts_with('/'))
        {
            return bad("the role is not a child of the role below it");
        }
        parent = Some(role);
    }
    Ok(())
}

/// The result of [`ProviderResources::compute_conversion`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ComputedConversion {
    /// What to take out of and put into the total.
    pub conversion: Conversion,
    /// Checkpointed resources that frameworks converted and the plugin no longer reports;
    /// kept. Mesos warns: "Missing converted resource '…'. This might cause further
    /// operations to fail."
    pub missing_converted: Vec<Resource>,
}

/// The result of [`ProviderResources::existing_volumes`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExistingVolumes {
    /// Removes duplicates and replaces drifted metadata (Mesos's `metadataConversion`).
    pub cleanup: Conversion,
    /// `computeConversion` of the resources with an id after `cleanup` against the
    /// listing.
    pub merge: ComputedConversion,
    /// Resources of the total removed because their id was already taken (Mesos warns
    /// "Removing duplicated volume").
    pub duplicates: Vec<Resource>,
    /// Ids whose metadata was replaced by the listed context.
    pub drifted: Vec<String>,
    /// Ids listed more than once; later copies were ignored (Mesos warns "Dropping
    /// duplicated volume").
    pub repeated_in_listing: Vec<String>,
}

/// The result of [`ProviderResources::reconcile`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reconciled {
    /// The new total if it changed; `None`: the old one stands (not copied, which with
    /// 10,000 volumes was a copy per reconciliation for nothing).
    pub total: Option<Resources>,
    /// Whether it differs from the old total (Mesos `result != totalResources`).
    pub changed: bool,
    /// Old total minus new (Mesos logs "Removing '…' and adding '…'").
    pub removed: Resources,
    /// New total minus old.
    pub added: Resources,
}

// ---------------------------------------------------------------------------------------
// Profiles (§7.3).

/// What a reported profile set asks of the provider's profile map (§7.3 "Profile
/// update"): drop `removed`, translate `to_translate`. Successful translations are
/// inserted, failures left out (the next watch reports them again).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProfileChange {
    /// Names in the map that the adaptor no longer reports.
    pub removed: Vec<String>,
    /// Reported names the map does not hold yet.
    pub to_translate: Vec<String>,
}

impl ProfileChange {
    /// The change from the names in the map to the reported set.
    pub fn between<'a>(
        current: impl IntoIterator<Item = &'a str>,
        reported: &BTreeSet<String>,
    ) -> Self {
        let current: BTreeSet<&str> = current.into_iter().collect();
        Self {
            removed: current
                .iter()
                .filter(|name| !reported.contains(**name))
                .map(|name| (*name).to_owned())
                .collect(),
            to_translate: reported
                .iter()
                .filter(|name| !current.contains(name.as_str()))
                .cloned()
                .collect(),
        }
    }

    /// Whether nothing changes.
    pub fn is_empty(&self) -> bool {
        self.removed.is_empty() && self.to_translate.is_empty()
    }
}

/// Profiles of the storage pools in `total`: the profile map Mesos recovers from a
/// checkpoint holds exactly these (§7.3).
pub fn pool_profiles(total: &Resources) -> BTreeSet<String> {
    total
        .iter()
        .filter(|r| is_storage_pool(r))
        .filter_map(|r| disk_profile(r).map(str::to_owned))
        .collect()
}

/// How a change that touched only `touched` (the consumed and converted resources of
/// its conversions) changed [`pool_profiles`] of the `total` after it: for the profile of
/// every storage pool in `touched`, whether `total` still has a pool with it. Profiles of
/// pools the change did not touch are as they were, so this costs what the change
/// touched, not the size of the total, where [`pool_profiles`] is a scan of the total.
/// The pools of a touched pool's kind (one index lookup) are looked at first; only when
/// none of them has the profile (the last pool of that kind was consumed) is the total
/// scanned for another pool of it (differently reserved, say).
pub fn pool_profile_changes(total: &Resources, touched: &Resources) -> BTreeMap<String, bool> {
    let has_profile = |resource: &Resource, profile: &str| {
        is_storage_pool(resource) && disk_profile(resource) == Some(profile)
    };
    let mut changes = BTreeMap::new();
    for pool in touched.iter().filter(|r| is_storage_pool(r)) {
        let Some(profile) = disk_profile(pool) else {
            continue;
        };
        if changes.contains_key(profile) {
            continue;
        }
        let present = total
            .possibly_alike(pool)
            .into_iter()
            .any(|entry| has_profile(entry, profile))
            || total.iter().any(|entry| has_profile(entry, profile));
        changes.insert(profile.to_owned(), present);
    }
    changes
}

/// Storage pools of `total` whose profile is not in `known`: converted pools (e.g. with
/// a refined reservation) outlive their profile, because `computeConversion` keeps
/// converted resources. Mesos asserts on the next checkpoint that every pool's profile is
/// known and aborts (spec §12 item 11); a provider reports these instead and keeps them.
pub fn pools_without_profile<'a>(
    total: &'a Resources,
    known: &BTreeSet<String>,
) -> Vec<&'a Resource> {
    total
        .iter()
        .filter(|r| is_storage_pool(r) && disk_profile(r).is_some_and(|p| !known.contains(p)))
        .collect()
}

#[cfg(test)]
mod tests {
    //! The indexed algebra against the plain one: Mesos's linear searches over a vector
    //! (with order-keeping removal).

    use proptest::prelude::*;
    use slrp_proto::mesos::v1::resource::AllocationInfo;
    use slrp_proto::mesos::v1::resource::disk_info::Persistence;
    use slrp_proto::mesos::v1::resource::{RevocableInfo, SharedInfo};
    use slrp_proto::mesos::v1::value::{Range, Ranges};

    use super::*;

    /// The reference: every search a scan of the whole vector, `contains` on a copy.
    #[derive(Debug, Clone, Default)]
    struct Naive(Vec<Resource>);

    impl Naive {
        fn add(&mut self, resource: &Resource) {
            if is_empty(resource) {
                return;
            }
            match self.0.iter_mut().find(|entry| addable(entry, resource)) {
                Some(entry) => {
                    let sum = scalar_of(entry).saturating_add(scalar_of(resource));
                    set_scalar(entry, sum);
                }
                None => self.0.push(resource.clone()),
            }
        }

        fn subtract(&mut self, resource: &Resource) {
            if is_empty(resource) {
                return;
            }
            let Some(index) = self.0.iter().position(|e| subtractable(e, resource)) else {
                return;
            };
            let left = scalar_of(&self.0[index]).saturating_sub(scalar_of(resource));
            if is_scalar(resource) && left > 0 {
                set_scalar(&mut self.0[index], left);
            } else {
                self.0.remove(index);
            }
        }

        fn contains(&self, other: &Resources) -> bool {
            let mut remaining = self.clone();
            for resource in other {
                let found = remaining.0.iter().any(|entry| {
                    subtractable(entry, resource)
                        && (!is_scalar(resource) || scalar_of(resource) <= scalar_of(entry))
                });
                if !found {
                    return false;
                }
                remaining.subtract(resource);
            }
            true
        }

        fn apply(&self, conversion: &Conversion) -> Option<Naive> {
            if !self.contains(&conversion.consumed) {
                return None;
            }
            let mut result = self.clone();
            conversion.consumed.iter().for_each(|r| result.subtract(r));
            conversion.converted.iter().for_each(|r| result.add(r));
            Some(result)
        }
    }

    /// The index says exactly where every entry is and in which order.
    fn assert_index_exact(resources: &Resources) {
        let Some(index) = &resources.index else {
            assert!(resources.len() <= INDEX_FROM, "indexed once it grew");
            return;
        };
        let mut expected: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        for (position, entry) in resources.entries.iter().enumerate() {
            expected.entry(kind_key(entry)).or_default().push(position);
        }
        let actual: BTreeMap<u64, Vec<usize>> = index
            .kinds
            .0
            .iter()
            .map(|(key, bucket)| {
                let mut positions = bucket.positions().to_vec();
                positions.sort_unstable();
                (*key, positions)
            })
            .collect();
        assert_eq!(actual, expected);
        assert_eq!(index.seqs.len(), resources.len());
        assert_eq!(index.order.len(), resources.len());
        for (seq, position) in &index.order {
            assert_eq!(index.seqs[*position], *seq);
        }
    }

    /// Every entry is among the entries `possibly_alike` its identity-like probe (no
    /// quantity, no allocation), which come in the collection's order.
    fn assert_alike_finds_every_entry(resources: &Resources) {
        let order: Vec<*const Resource> = resources.iter().map(std::ptr::from_ref).collect();
        for entry in resources {
            let probe = Resource {
                scalar: None,
                allocation_info: None,
                ..entry.clone()
            };
            let alike: Vec<usize> = resources
                .possibly_alike(&probe)
                .into_iter()
                .map(|a| order.iter().position(|p| std::ptr::eq(*p, a)).unwrap())
                .collect();
            assert!(alike.is_sorted(), "{alike:?}");
            assert!(alike.iter().any(|p| std::ptr::eq(order[*p], entry)));
        }
    }

    fn ordered(resources: &Resources) -> Vec<Resource> {
        let all = resources.to_vec();
        assert_eq!(resources.iter().rev().count(), all.len());
        assert_eq!(resources.clone().into_vec(), all);
        all
    }

    const VALUES: [f64; 10] = [0.0, 0.0004, 0.5, 1.0, 1.0004, 1.5, 2.0, 3.25, 10.0, 100.0];

    fn arb_labels() -> impl Strategy<Value = Option<Labels>> {
        let sorted = labels_from_context(&BTreeMap::from([
            ("a".to_owned(), "1".to_owned()),
            ("b".to_owned(), "2".to_owned()),
        ]));
        let mut reversed = sorted.clone();
        reversed.labels.reverse();
        prop_oneof![
            Just(None),
            Just(Some(Labels::default())),
            Just(Some(sorted)),
            Just(Some(reversed)),
        ]
    }

    fn arb_reservation() -> impl Strategy<Value = ReservationInfo> {
        (
            prop::sample::select(vec![ReservationType::Static, ReservationType::Dynamic]),
            prop::sample::select(vec!["r", "r/x"]),
            prop::option::of(prop::sample::select(vec!["p", "q"])),
            arb_labels(),
        )
            .prop_map(|(kind, role, principal, labels)| ReservationInfo {
                r#type: Some(kind as i32),
                role: Some(role.to_owned()),
                principal: principal.map(str::to_owned),
                labels,
            })
    }

    fn arb_source() -> impl Strategy<Value = Source> {
        (
            prop::sample::select(vec![
                SourceType::Raw,
                SourceType::Raw,
                SourceType::Mount,
                SourceType::Block,
                SourceType::Path,
            ]),
            prop::option::of(prop::sample::select(vec!["v1", "v2", "v3"])),
            prop::option::of(prop::sample::select(vec!["fast", "slow"])),
            arb_labels(),
        )
            .prop_map(|(kind, id, profile, metadata)| Source {
                r#type: kind as i32,
                mount: (kind == SourceType::Mount).then(|| Mount {
                    root: Some("./mounts".to_owned()),
                }),
                vendor: Some("org.test".to_owned()),
                id: id.map(str::to_owned),
                metadata,
                profile: profile.map(str::to_owned),
                ..Source::default()
            })
    }

    fn arb_disk() -> impl Strategy<Value = DiskInfo> {
        (
            prop::option::of(arb_source()),
            prop::option::weighted(
                0.3,
                (
                    prop::sample::select(vec!["p1", "p2"]),
                    prop::option::of(prop::sample::select(vec!["alice", "bob"])),
                ),
            ),
            any::<bool>(),
        )
            .prop_map(|(source, persistence, volume)| DiskInfo {
                source,
                persistence: persistence.map(|(id, principal)| Persistence {
                    id: id.to_owned(),
                    principal: principal.map(str::to_owned),
                }),
                // Ignored by the comparison: entries equal to Mesos that still differ.
                volume: volume.then(|| {
                    Box::new(slrp_proto::mesos::v1::Volume {
                        container_path: "data".to_owned(),
                        ..Default::default()
                    })
                }),
            })
    }

    prop_compose! {
        fn arb_resource()(
            name in prop::sample::select(vec!["disk", "disk", "disk", "cpus", "ports"]),
            value in 0..VALUES.len(),
            allocation in prop::option::of(prop::sample::select(vec!["a", "b"])),
            reservations in prop::collection::vec(arb_reservation(), 0..3),
            disk in prop::option::weighted(0.8, arb_disk()),
            shared in prop::bool::weighted(0.1),
            revocable in prop::bool::weighted(0.1),
            provider in prop::option::of(prop::sample::select(vec!["rp1", "rp2"])),
        ) -> Resource {
            let ranges = name == "ports";
            Resource {
                provider_id: provider.map(|value| ResourceProviderId { value: value.to_owned() }),
                name: name.to_owned(),
                r#type: if ranges { ValueType::Ranges } else { ValueType::Scalar } as i32,
                scalar: (!ranges).then_some(Scalar { value: VALUES[value] }),
                ranges: ranges.then(|| Ranges {
                    range: vec![Range { begin: 1, end: 1 + value as u64 % 3 }],
                }),
                allocation_info: allocation.map(|role| AllocationInfo { role: Some(role.to_owned()) }),
                reservations,
                disk: disk.filter(|_| !ranges),
                shared: shared.then_some(SharedInfo {}),
                revocable: revocable.then_some(RevocableInfo {}),
                ..Resource::default()
            }
        }
    }

    /// Resources taken from the current entries (the position modulo their number; a
    /// new value, possibly) and fresh ones, so that most conversions apply.
    #[derive(Debug, Clone)]
    struct Picks {
        taken: Vec<(usize, Option<usize>)>,
        fresh: Vec<Resource>,
    }

    impl Picks {
        fn resolve(&self, current: &Naive) -> Resources {
            let mut picked = Resources::new();
            if !current.0.is_empty() {
                for (position, value) in &self.taken {
                    let mut r = current.0[position % current.0.len()].clone();
                    if let Some(value) = value {
                        r.scalar = Some(Scalar {
                            value: VALUES[*value],
                        });
                    }
                    picked.add(&r);
                }
            }
            for r in &self.fresh {
                picked.add(r);
            }
            picked
        }
    }

    prop_compose! {
        fn arb_picks()(
            taken in prop::collection::vec(
                (any::<usize>(), prop::option::weighted(0.3, 0..VALUES.len())), 0..4),
            fresh in prop::collection::vec(arb_resource(), 0..2),
        ) -> Picks {
            Picks { taken, fresh }
        }
    }

    #[derive(Debug, Clone)]
    enum Step {
        Add(Box<Resource>),
        Subtract(Picks),
        Contains(Picks),
        Apply(Picks, Picks),
        ApplyAll(Vec<(Picks, Picks)>),
    }

    fn arb_step() -> impl Strategy<Value = Step> {
        prop_oneof![
            2 => arb_resource().prop_map(|r| Step::Add(Box::new(r))),
            2 => arb_picks().prop_map(Step::Subtract),
            2 => arb_picks().prop_map(Step::Contains),
            4 => (arb_picks(), arb_picks()).prop_map(|(c, v)| Step::Apply(c, v)),
            2 => prop::collection::vec((arb_picks(), arb_picks()), 1..4).prop_map(Step::ApplyAll),
        ]
    }

    fn conversion(current: &Naive, consumed: &Picks, converted: &Picks) -> Conversion {
        Conversion {
            consumed: consumed.resolve(current),
            converted: converted.resolve(current),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Same entries, same values, same order, same answers as the plain algebra,
        /// through adds, subtractions, containment checks and (failing) conversions.
        #[test]
        fn indexed_algebra_is_the_plain_one(
            start in prop::collection::vec(arb_resource(), 0..40),
            steps in prop::collection::vec(arb_step(), 1..40),
        ) {
            let mut indexed = Resources::new();
            let mut naive = Naive::default();
            for r in &start {
                indexed.add(r);
                naive.add(r);
            }
            prop_assert_eq!(ordered(&indexed), naive.0.clone());
            assert_index_exact(&indexed);
            for step in &steps {
                match step {
                    Step::Add(r) => {
                        indexed.add(r);
                        naive.add(r);
                    }
                    Step::Subtract(picks) => {
                        for r in &picks.resolve(&naive) {
                            indexed.subtract(r);
                            naive.subtract(r);
                        }
                    }
                    Step::Contains(picks) => {
                        let other = picks.resolve(&naive);
                        prop_assert_eq!(indexed.contains(&other), naive.contains(&other));
                    }
                    Step::Apply(consumed, converted) => {
                        let c = conversion(&naive, consumed, converted);
                        let copied = indexed.apply(&c).ok();
                        let in_place = indexed.apply_in_place(&c).is_ok();
                        match naive.apply(&c) {
                            Some(result) => {
                                prop_assert!(in_place);
                                naive = result;
                                let copied = copied.expect("apply agrees with apply_in_place");
                                prop_assert_eq!(ordered(&copied), naive.0.clone());
                            }
                            None => prop_assert!(!in_place && copied.is_none()),
                        }
                    }
                    Step::ApplyAll(pairs) => {
                        // Built against the start, so that later ones fail sometimes.
                        let cs: Vec<Conversion> =
                            pairs.iter().map(|(c, v)| conversion(&naive, c, v)).collect();
                        let expected = cs.iter().try_fold(naive.clone(), |t, c| t.apply(c));
                        let copied = indexed.apply_all(&cs).ok();
                        let in_place = indexed.apply_all_in_place(&cs).is_ok();
                        prop_assert_eq!(in_place, expected.is_some());
                        prop_assert_eq!(copied.is_some(), expected.is_some());
                        if let Some(result) = expected {
                            naive = result;
                        }
                    }
                }
                prop_assert_eq!(ordered(&indexed), naive.0.clone());
                assert_index_exact(&indexed);
            }
            assert_alike_finds_every_entry(&indexed);
        }
    }

    fn mount_disk(id: &str) -> Resource {
        Resource {
            name: "disk".to_owned(),
            r#type: ValueType::Scalar as i32,
            scalar: Some(Scalar { value: 1.0 }),
            disk: Some(DiskInfo {
                source: Some(Source {
                    r#type: SourceType::Mount as i32,
                    id: Some(id.to_owned()),
                    ..Source::default()
                }),
                ..DiskInfo::default()
            }),
            ..Resource::default()
        }
    }

    #[test]
    fn a_clone_shares_the_entries_until_one_side_changes() {
        let disk = mount_disk;
        let mut total: Resources = (0..20).map(|i| disk(&format!("v{i}"))).collect();
        let snapshot = total.clone();
        let expected = ordered(&snapshot);
        assert!(
            Arc::ptr_eq(&total.entries, &snapshot.entries),
            "a clone is not a copy"
        );
        assert!(Arc::ptr_eq(
            total.index.as_ref().unwrap(),
            snapshot.index.as_ref().unwrap()
        ));

        // Every kind of change (remove by moving the last entry, append, merge, a failed
        // apply's undo) copies on write and leaves the clone as it was.
        total.subtract(&disk("v3"));
        assert!(!Arc::ptr_eq(&total.entries, &snapshot.entries));
        total.add(&disk("w"));
        let failing = Conversion {
            consumed: Resources::from(disk("v3")),
            converted: Resources::new(),
        };
        total.apply_all_in_place([&failing]).unwrap_err();
        assert_eq!(ordered(&snapshot), expected);
        assert_index_exact(&snapshot);
        assert_index_exact(&total);
        assert_eq!(total.len(), 20);
        assert!(!total.iter().any(|r| disk_id(r) == Some("v3")));
        assert_eq!(total.iter().next_back().and_then(disk_id), Some("w"));

        // The clone changes on its own too, without touching the original.
        let mut clone = total.clone();
        clone.subtract(&disk("w"));
        assert_eq!(total.iter().next_back().and_then(disk_id), Some("w"));
        assert_eq!(clone.len(), 19);
        assert_index_exact(&clone);
    }

    #[test]
    fn a_failed_apply_all_names_the_total_it_failed_on_and_changes_nothing() {
        let disk = mount_disk;
        let mut total: Resources = (0..20).map(|i| disk(&format!("v{i}"))).collect();
        let before = total.clone();
        let first = Conversion {
            consumed: Resources::from(disk("v3")),
            converted: Resources::from(disk("w")),
        };
        let second = Conversion {
            consumed: Resources::from(disk("v3")),
            converted: Resources::new(),
        };
        let error = total.apply_all_in_place([&first, &second]).unwrap_err();
        assert_eq!(ordered(&total), ordered(&before));
        let text = error.to_string();
        let (applied_to, consumed) = text.split_once(" do not contain ").unwrap();
        assert!(
            applied_to.contains("(,w,)") && !applied_to.contains("(,v3,)"),
            "{text}"
        );
        assert_eq!(consumed, "[disk[MOUNT(,v3,)]:1]");
    }

    /// A small collection that the first conversion makes large (indexed) is restored
    /// in order when the second fails.
    #[test]
    fn a_failed_apply_all_restores_a_collection_it_made_large() {
        let mut total: Resources = (0..INDEX_FROM)
            .map(|i| mount_disk(&format!("v{i}")))
            .collect();
        assert!(total.index.is_none());
        let before = total.to_vec();
        let grow = Conversion {
            consumed: Resources::from(mount_disk("v0")),
            converted: ["a", "b", "c"].into_iter().map(mount_disk).collect(),
        };
        let fail = Conversion {
            consumed: Resources::from(mount_disk("v0")),
            converted: Resources::new(),
        };
        total.apply_all_in_place([&grow, &fail]).unwrap_err();
        assert_eq!(total.to_vec(), before);
        assert_index_exact(&total);
        total.apply_all_in_place([&grow]).unwrap();
        let ids: Vec<_> = total.iter().filter_map(disk_id).collect();
        assert_eq!(
            ids,
            ["v1", "v2", "v3", "v4", "v5", "v6", "v7", "a", "b", "c"]
        );
    }
}
