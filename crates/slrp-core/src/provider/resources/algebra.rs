//! Mesos's `Resources` (spec §6.9): [`Resources`], the collection with its algebra (add,
//! subtract, contains, filter, apply a [`Conversion`] or several, all or nothing) and its
//! compact `Display`. Nothing here is about this provider.

use std::fmt;
use std::sync::Arc;

use slrp_proto::mesos::v1::Resource;
use slrp_proto::mesos::v1::value::Scalar;

use super::ResourceError;
use super::index::{Candidates, Index};
use super::resource::{
    DisplayResource, addable, is_empty, is_scalar, kind_key, scalar_of, set_scalar, subtractable,
};

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
/// 10,000-entry total at rest instead of two (docs/benchmarks.md, figure 5). Each entry
/// is shared on its own too, so that first change copies a vector of pointers and the
/// entries it touches, not every resource: with 100,000 volumes copying them all took a
/// tenth of the worker's time under load.
#[derive(Clone, Default)]
pub struct Resources {
    entries: Arc<Vec<Arc<Resource>>>,
    /// Built once `entries` grows past [`INDEX_FROM`] (small collections, such as the sides
    /// of a conversion, are searched faster than hashed) and kept from then on.
    index: Option<Arc<Index>>,
}

/// Entries up to which a collection is searched linearly.
const INDEX_FROM: usize = 8;

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
        resource: Arc<Resource>,
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
    Plain(std::slice::Iter<'a, Arc<Resource>>),
    Ordered {
        order: std::collections::btree_map::Values<'a, u64, usize>,
        entries: &'a [Arc<Resource>],
    },
}

impl<'a> Iterator for Iter<'a> {
    type Item = &'a Resource;
    fn next(&mut self) -> Option<&'a Resource> {
        match &mut self.inner {
            IterInner::Plain(entries) => entries.next().map(Arc::as_ref),
            IterInner::Ordered { order, entries } => order.next().map(|p| &*entries[*p]),
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
            IterInner::Plain(entries) => entries.next_back().map(Arc::as_ref),
            IterInner::Ordered { order, entries } => order.next_back().map(|p| &*entries[*p]),
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

    /// The entries as stored, each shared ([`Resources`] says why). Until an entry of a
    /// collection of more than a few entries is removed this is the collection's order
    /// ([`Self::iter`]); after that, an order of its own (everything that sends or
    /// compares a whole total treats it as a set, as Mesos does). [`Self::to_vec`] has
    /// the collection's order.
    pub fn as_slice(&self) -> &[Arc<Resource>] {
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
            return entries.into_iter().map(Arc::unwrap_or_clone).collect();
        };
        let mut slots: Vec<Option<Arc<Resource>>> = entries.into_iter().map(Some).collect();
        index
            .order
            .values()
            .filter_map(|position| slots[*position].take())
            .map(Arc::unwrap_or_clone)
            .collect()
    }

    /// The entries, shared, in the collection's order.
    pub(crate) fn into_shared_vec(self) -> Vec<Arc<Resource>> {
        let Some(index) = &self.index else {
            return Arc::unwrap_or_clone(self.entries);
        };
        index
            .order
            .values()
            .map(|position| Arc::clone(&self.entries[*position]))
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
        positions.iter().map(|p| &*self.entries[*p]).collect()
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
    /// are, without `add`'s search for an entry to merge with. The vector is kept at its
    /// length: the index is sized by its capacity.
    pub(crate) fn from_shared(mut entries: Vec<Arc<Resource>>) -> Self {
        entries.shrink_to_fit();
        let index = (entries.len() > INDEX_FROM)
            .then(|| Arc::new(Index::build(&entries, entries.capacity())));
        Self {
            entries: Arc::new(entries),
            index,
        }
    }

    /// The entries and the index to change (copied first if shared with a clone).
    fn parts_mut(&mut self) -> (&mut Vec<Arc<Resource>>, Option<&mut Index>) {
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

    fn candidates(&self, resource: &Resource) -> Candidates<'_> {
        match &self.index {
            None => Candidates::All(0..self.entries.len()),
            Some(index) => Candidates::Indexed(index.kinds.positions(kind_key(resource)).iter()),
        }
    }

    /// The entry at `position`, to change (copied first if shared with a clone).
    fn entry_mut(&mut self, position: usize) -> &mut Resource {
        Arc::make_mut(&mut Arc::make_mut(&mut self.entries)[position])
    }

    /// The first entry (in the collection's order) of which `wanted` holds. Only entries
    /// of the resource's kind key are looked at: `wanted` must imply
    /// [`same_kind`](super::resource::same_kind).
    fn first(&self, resource: &Resource, wanted: impl Fn(&Resource) -> bool) -> Option<usize> {
        let found = self
            .candidates(resource)
            .filter(|position| wanted(&self.entries[*position]));
        match &self.index {
            None => found.min(),
            Some(index) => found.min_by_key(|position| index.seqs[*position]),
        }
    }

    fn push(&mut self, resource: Arc<Resource>, seq: Option<u64>) {
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
    fn remove(&mut self, position: usize) -> (Arc<Resource>, Option<u64>) {
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
    fn reinsert(&mut self, position: usize, resource: Arc<Resource>, seq: Option<u64>) {
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
                Undo::Scalar { position, old } => self.entry_mut(position).scalar = old,
                Undo::Pushed => self.pop(),
                Undo::Removed {
                    position,
                    resource,
                    seq,
                } => self.reinsert(position, resource, seq),
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
                let entry = self.entry_mut(position);
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
                self.push(Arc::new(resource.clone()), None);
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
        let left = scalar_of(&self.entries[position]).saturating_sub(scalar_of(resource));
        if is_scalar(resource) && left > 0 {
            // Only an entry that stays is copied (if shared): a removed one is not.
            let entry = self.entry_mut(position);
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
                    resource,
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
        let positions: Box<dyn Iterator<Item = usize>> = match &self.index {
            None => Box::new(0..self.entries.len()),
            Some(index) => Box::new(index.order.values().copied()),
        };
        // Part of a collection is one already (no two entries merge, none is empty):
        // its entries are shared as they are, in the collection's order.
        let kept: Vec<Arc<Resource>> = positions
            .map(|position| &self.entries[position])
            .filter(|entry| keep(entry))
            .cloned()
            .collect();
        Self::from_shared(kept)
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

#[cfg(test)]
mod tests {
    //! The indexed algebra against the plain one: Mesos's linear searches over a vector
    //! (with order-keeping removal).

    use std::collections::BTreeMap;

    use proptest::prelude::*;
    use slrp_proto::mesos::v1::resource::AllocationInfo;
    use slrp_proto::mesos::v1::resource::disk_info::source::{Mount, Type as SourceType};
    use slrp_proto::mesos::v1::resource::disk_info::{Persistence, Source};
    use slrp_proto::mesos::v1::resource::reservation_info::Type as ReservationType;
    use slrp_proto::mesos::v1::resource::{DiskInfo, ReservationInfo, RevocableInfo, SharedInfo};
    use slrp_proto::mesos::v1::value::{Range, Ranges, Type as ValueType};
    use slrp_proto::mesos::v1::{Labels, ResourceProviderId};

    use super::super::resource::{disk_id, labels_from_context};
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

    /// The first change after a clone copies pointers, not resources: every entry it
    /// does not touch stays shared with the clone, and a changed entry is copied alone.
    #[test]
    fn a_change_after_a_clone_copies_only_the_entries_it_touches() {
        let mut pools: Vec<Resource> = (0..20).map(|i| mount_disk(&format!("v{i}"))).collect();
        let mut pool = mount_disk("pool");
        pool.disk = None;
        pools.push(pool.clone());
        let mut total: Resources = pools.into_iter().collect();
        let snapshot = total.clone();
        total.add(&pool);
        total.subtract(&mount_disk("v7"));
        let shared = |r: &Resource| {
            snapshot
                .as_slice()
                .iter()
                .any(|s| std::ptr::eq(Arc::as_ptr(s), r))
        };
        for entry in total.iter() {
            let merged = entry.disk.is_none();
            assert_eq!(shared(entry), !merged, "{entry:?}");
        }
        assert_eq!(snapshot.len(), 21);
        assert_eq!(total.len(), 20);
        assert_eq!(
            total
                .iter()
                .find(|r| r.disk.is_none())
                .and_then(|r| r.scalar),
            Some(Scalar { value: 2.0 })
        );

        // A removed entry is not copied either: taken back by a failed apply, it is
        // the very one the clone holds.
        let mut again = snapshot.clone();
        let failing = [
            Conversion {
                consumed: Resources::from(mount_disk("v3")),
                converted: Resources::new(),
            },
            Conversion {
                consumed: Resources::from(mount_disk("absent")),
                converted: Resources::new(),
            },
        ];
        again.apply_all_in_place(&failing).unwrap_err();
        let v3 = again.iter().find(|r| disk_id(r) == Some("v3")).unwrap();
        assert!(shared(v3), "the removed and restored entry was copied");
    }

    /// Entries taken as they are get a vector and an index of their size, not of the
    /// capacity of the vector they came in (a loader's vector grows by doubling, and
    /// the index was sized by its capacity).
    #[test]
    fn normalized_entries_are_held_at_their_size() {
        let mut entries = Vec::with_capacity(1000);
        entries.extend((0..100).map(|i| Arc::new(mount_disk(&format!("v{i}")))));
        let total = Resources::from_shared(entries);
        assert_eq!(total.entries.capacity(), 100);
        assert!(total.index.as_ref().unwrap().seqs.capacity() <= 100);
        assert_index_exact(&total);
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
