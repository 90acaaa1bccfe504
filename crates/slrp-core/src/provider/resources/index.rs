//! The index a large [`Resources`](super::Resources) keeps beside its entries: kind key
//! → positions of the entries with that key, and the sequence numbers that keep the
//! collection's order while entries are removed by moving the last one into the freed
//! place. [`Resources`](super::Resources) says what this buys.

use std::collections::BTreeMap;
use std::sync::Arc;

use slrp_proto::mesos::v1::Resource;

use super::resource::kind_key;

/// The positions of the entries with one kind key; one position (the common case: a
/// volume) needs no allocation of its own.
#[derive(Debug, Clone)]
pub(super) enum Bucket {
    One(usize),
    Many(Vec<usize>),
}

impl Bucket {
    pub(super) fn positions(&self) -> &[usize] {
        match self {
            Bucket::One(position) => std::slice::from_ref(position),
            Bucket::Many(positions) => positions,
        }
    }

    pub(super) fn push(&mut self, position: usize) {
        match self {
            Bucket::One(first) => *self = Bucket::Many(vec![*first, position]),
            Bucket::Many(positions) => positions.push(position),
        }
    }

    /// Removes `position`; false if the bucket is empty afterwards.
    pub(super) fn remove(&mut self, position: usize) -> bool {
        let Bucket::Many(positions) = self else {
            return false;
        };
        positions.retain(|p| *p != position);
        if let [only] = positions.as_slice() {
            *self = Bucket::One(*only);
        }
        true
    }

    pub(super) fn replace(&mut self, old: usize, new: usize) {
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
pub(super) struct Kinds(pub(super) std::collections::HashMap<u64, Bucket>);

impl Kinds {
    pub(super) fn positions(&self, key: u64) -> &[usize] {
        self.0.get(&key).map_or(&[], Bucket::positions)
    }

    pub(super) fn insert(&mut self, key: u64, position: usize) {
        match self.0.entry(key) {
            std::collections::hash_map::Entry::Occupied(mut bucket) => {
                bucket.get_mut().push(position);
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(Bucket::One(position));
            }
        }
    }

    pub(super) fn remove(&mut self, key: u64, position: usize) {
        if let Some(bucket) = self.0.get_mut(&key)
            && !bucket.remove(position)
        {
            self.0.remove(&key);
        }
    }

    pub(super) fn replace(&mut self, key: u64, old: usize, new: usize) {
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
pub(super) struct Index {
    pub(super) kinds: Kinds,
    /// Sequence number of the entry at each position.
    pub(super) seqs: Vec<u64>,
    /// Sequence number → position: the collection's order.
    pub(super) order: BTreeMap<u64, usize>,
    next: u64,
}

impl Index {
    pub(super) fn build(entries: &[Arc<Resource>], room: usize) -> Self {
        // Room for what the entries have room for (`Resources::from_shared` keeps them
        // at their length).
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
    pub(super) fn push(&mut self, key: u64, position: usize, seq: Option<u64>) {
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
pub(super) enum Candidates<'a> {
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
