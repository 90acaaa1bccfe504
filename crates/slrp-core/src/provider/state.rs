//! The provider's durable state (spec §3.3 step 4, §8.3, §8.4): its identity, its total
//! resources and the profiles of its storage pools.
//!
//! Mesos keeps this in `meta/slaves/<agent id>/resource_providers/<type>/<name>/latest`
//! (the identity) and `resource_provider.state` (resources, operations, profiles), which
//! it rewrites whole on every change (spec §12 item 1). Here it lives in the provider's
//! own store beside the volume records, keyed by the agent id, in records a change
//! touches only where it changes something:
//!
//! - one [`ProviderRecord`] (kind `provider`, key `<agent id>`): the identity and the
//!   profiles of the storage pools;
//! - one [`ProviderResourceRecord`] per distinct resource of the total (kind
//!   `provider_resource`, key `<agent id>/<identity digest>`, see [`identity_digest`]).
//!   An operation's commit rewrites the records of the resources it consumes and
//!   produces ([`ProviderState::stage`] with `touched`), so it costs the same with 100
//!   or 10,000 volumes.
//!
//! Keying by agent id keeps Mesos's rule that an agent with a new id means a new provider
//! identity (§3.6, §8.6): the records of the old agent id stay (as Mesos never removes old
//! provider directories) and are simply not looked at. Agent ids have no `/` (Mesos's are
//! `<uuid>-S<n>`), so `<agent id>/` bounds the resource records of one identity.
//!
//! Mesos messages are stored as Mesos JSON (`slrp_wire::json`), so `slrp inspect` and
//! `sqlite3` show them readably; the records' shapes are versioned by the store
//! ([`Record::SCHEMA_VERSION`], stored with every record). The provider record of schema
//! version 1 held the whole total inside; it still loads, and
//! [`ProviderState::from_stored`] asks for it to be rewritten in the current layout.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use prost::Message;
use serde::{Deserialize, Serialize};
use slrp_proto::mesos::v1::{Labels, Resource, ResourceProviderId};
use slrp_store::{Changes, Kind, Record, StoreError};
use slrp_types::ProfileInfo;
use slrp_wire::JsonError;

use super::resources::{DisplayResource, Resources};

/// The provider state as the worker holds it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProviderState {
    /// The id the manager assigned; `None` until the first subscription of this identity.
    pub provider_id: Option<ResourceProviderId>,
    /// The total resources last computed (and reported).
    pub total: Resources,
    /// The profiles of the storage pools in `total` (spec §8.2: exactly those are
    /// checkpointed).
    pub profiles: BTreeMap<String, ProfileInfo>,
}

impl ProviderState {
    /// The state to checkpoint: `total` with the profiles of its storage pools, taken
    /// from `known` (the provider's profile map). A pool whose profile `known` lacks is
    /// left without a checkpointed profile, which recovery then refuses: callers keep
    /// profiles of pools in their map (spec §12 item 11).
    pub fn checkpoint(
        provider_id: Option<ResourceProviderId>,
        total: Resources,
        known: &BTreeMap<String, ProfileInfo>,
    ) -> Self {
        let profiles = super::resources::pool_profiles(&total)
            .into_iter()
            .filter_map(|name| known.get(&name).map(|def| (name, def.clone())))
            .collect();
        Self {
            provider_id,
            total,
            profiles,
        }
    }

    /// The provider record for agent `agent_id` (identity and profiles; the resources
    /// have records of their own, [`Self::resource_records`]).
    ///
    /// # Errors
    /// [`StateError::Encode`] if a message cannot be written as Mesos JSON (a descriptor
    /// missing from `slrp-proto`: a build problem).
    pub fn to_record(&self, agent_id: &str) -> Result<ProviderRecord, StateError> {
        let profiles = self
            .profiles
            .iter()
            .map(|(name, def)| {
                let capability = slrp_wire::json::to_value(&def.capability)
                    .map_err(StateError::encode("a profile capability"))?;
                Ok((
                    name.clone(),
                    StoredProfile {
                        capability,
                        parameters: def.parameters.clone(),
                    },
                ))
            })
            .collect::<Result<_, StateError>>()?;
        Ok(ProviderRecord {
            agent_id: agent_id.to_owned(),
            provider_id: self.provider_id.as_ref().map(|id| id.value.clone()),
            resources: Vec::new(),
            profiles,
        })
    }

    /// The resource records of the whole total for agent `agent_id`, one per identity.
    ///
    /// # Errors
    /// [`StateError::Encode`] (a build problem).
    pub fn resource_records(
        &self,
        agent_id: &str,
    ) -> Result<Vec<ProviderResourceRecord>, StateError> {
        let mut groups: BTreeMap<String, Vec<&Resource>> = BTreeMap::new();
        for resource in self.total.iter() {
            groups
                .entry(identity_digest(resource))
                .or_default()
                .push(resource);
        }
        groups
            .into_iter()
            .map(|(digest, entries)| ProviderResourceRecord::new(agent_id, digest, &entries))
            .collect()
    }

    /// Adds to `txn` the records that make the stored state equal `self`: the provider
    /// record (identity, profiles) and, for `touched = Some(rs)`, the `provider_resource`
    /// records of the identities of `rs` only (the total's entries of that identity, or
    /// a delete if the total has none); `None` rewrites every resource record (delete
    /// the prefix, put all): for reconciliations. Pass the consumed and converted
    /// resources of an operation's conversions as `touched`.
    ///
    /// With `touched`, the cost is one digest per touched resource and a look at the
    /// total's entries that may share its identity ([`Resources::possibly_alike`], the
    /// total's index): the same with 100 or 10,000 volumes.
    ///
    /// # Errors
    /// [`StateError::Encode`]; [`StateError::Stage`] for a key the store refuses.
    pub fn stage(
        &self,
        txn: &mut Changes,
        agent_id: &str,
        touched: Option<&Resources>,
    ) -> Result<(), StateError> {
        let record = self.to_record(agent_id)?;
        put(txn, &record)?;
        let Some(touched) = touched else {
            txn.delete_prefix::<ProviderResourceRecord>(&resource_prefix(agent_id));
            for record in self.resource_records(agent_id)? {
                put(txn, &record)?;
            }
            return Ok(());
        };
        let mut done = BTreeSet::new();
        for resource in touched.iter() {
            let identity = identity(resource);
            let digest = digest_of(&identity);
            if !done.insert(digest.clone()) {
                continue;
            }
            let entries: Vec<&Resource> = self
                .total
                .possibly_alike(&identity)
                .into_iter()
                .filter(|entry| same_identity(entry, &identity))
                .collect();
            if entries.is_empty() {
                let key = resource_key(agent_id, &digest);
                txn.delete::<ProviderResourceRecord>(&key)
                    .map_err(|source| StateError::Stage { key, source })?;
            } else {
                put(
                    txn,
                    &ProviderResourceRecord::new(agent_id, digest, &entries)?,
                )?;
            }
        }
        Ok(())
    }

    /// The state a provider record holds (with the resources a version-1 record has
    /// inside); see [`Self::from_records`].
    ///
    /// # Errors
    /// As [`Self::from_records`].
    pub fn from_record(record: ProviderRecord, store: &Path) -> Result<Self, StateError> {
        Self::from_entries(record, Vec::new(), store)
    }

    /// The state of a provider record and its resource records, checked as Mesos checks a
    /// recovered state (§3.3 step 4): every storage pool's profile must be in the record.
    /// Every resource must also belong to the recorded provider id: the total is reported
    /// as is in UPDATE_STATE, and a resource of another (or no) provider would be
    /// advertised under this one's id. `store` names where the records came from in
    /// errors.
    ///
    /// # Errors
    /// [`StateError::Decode`] for a message that is not valid Mesos JSON;
    /// [`StateError::MissingProfile`] for a pool whose profile is not recorded;
    /// [`StateError::ForeignResource`] for a resource of another provider id.
    pub fn from_records(
        record: ProviderRecord,
        resources: Vec<ProviderResourceRecord>,
        store: &Path,
    ) -> Result<Self, StateError> {
        let mut entries = Vec::new();
        for stored in resources {
            entries.extend(Self::resources_of(
                stored,
                record.provider_id.as_deref(),
                store,
            )?);
        }
        Self::from_entries(record, entries, store)
    }

    /// The total's entries one resource record holds, decoded and checked to belong to
    /// `provider_id` (the provider record's). A driver loading a large total decodes each
    /// record as it is read ([`slrp_store::Store::fold_prefix`]) and passes the entries to
    /// [`Self::from_loaded`]: the records' JSON trees, several times the size of the
    /// resources, are then never all alive at once (with 30,000 volumes they were two
    /// thirds of the restart's peak of memory).
    ///
    /// # Errors
    /// [`StateError::Decode`] and [`StateError::ForeignResource`], as
    /// [`Self::from_records`].
    pub fn resources_of(
        stored: ProviderResourceRecord,
        provider_id: Option<&str>,
        store: &Path,
    ) -> Result<Vec<Arc<Resource>>, StateError> {
        let key = stored.key();
        // Only the entries of one record are merged: records of distinct identities never
        // merge with each other, which keeps loading a large total linear.
        let mut group = Resources::new();
        for (index, value) in stored.resources.into_iter().enumerate() {
            group.add(&decode_resource(
                value,
                || format!("resource {index} of record '{key}'"),
                provider_id,
                store,
            )?);
        }
        Ok(group.into_shared_vec())
    }

    /// Adds to `entries` those of `stored` ([`Self::resources_of`]) if it is a record of
    /// agent `agent_id`: the key prefix `<agent id>/` also holds the records of an agent
    /// id that extends this one with a `/`. One step of a driver's fold over the records.
    ///
    /// # Errors
    /// As [`Self::resources_of`].
    pub fn add_record(
        entries: &mut Vec<Arc<Resource>>,
        stored: ProviderResourceRecord,
        agent_id: &str,
        provider_id: Option<&str>,
        store: &Path,
    ) -> Result<(), StateError> {
        if stored.agent_id == agent_id {
            entries.extend(Self::resources_of(stored, provider_id, store)?);
        }
        Ok(())
    }

    /// The state of a provider record and the entries of its resource records
    /// ([`Self::resources_of`]), checked as [`Self::from_records`] says.
    fn from_entries(
        record: ProviderRecord,
        mut entries: Vec<Arc<Resource>>,
        store: &Path,
    ) -> Result<Self, StateError> {
        let decode = |what| StateError::decode(store, what);
        let provider_id = record.provider_id;
        // Version 1: one list, merged as Mesos merges it.
        let mut total = Resources::new();
        for (index, value) in record.resources.into_iter().enumerate() {
            total.add(&decode_resource(
                value,
                || format!("resource {index}"),
                provider_id.as_deref(),
                store,
            )?);
        }
        entries.splice(0..0, total.into_shared_vec());
        // Shared as they were decoded: a vector of the resources themselves, then one of
        // pointers to them, was 60 MiB more at the start with 100,000 volumes.
        let total = Resources::from_shared(entries);
        let mut profiles = BTreeMap::new();
        for (name, stored) in record.profiles {
            let capability = slrp_wire::json::from_value(stored.capability)
                .map_err(decode(format!("the capability of profile {name:?}")))?;
            profiles.insert(
                name,
                ProfileInfo {
                    capability,
                    parameters: stored.parameters,
                },
            );
        }
        let known = profiles.keys().cloned().collect();
        if let Some(pool) = super::resources::pools_without_profile(&total, &known).first() {
            return Err(StateError::MissingProfile {
                pool: DisplayResource(pool).to_string(),
                store: store.to_owned(),
            });
        }
        Ok(Self {
            provider_id: provider_id.map(|value| ResourceProviderId { value }),
            total,
            profiles,
        })
    }

    /// The state of agent `agent_id` from what a driver read: its provider record, if
    /// any, and its resource records (only those of a current-layout record are looked
    /// at; the driver may skip reading them for a version-1 record, whose total is
    /// inside). The empty state (a brand-new identity, subscribe without id) without a
    /// record. The flag says the record is of version 1 and must be rewritten in the
    /// current layout (one transaction, [`Self::stage`] without `touched`), so that later
    /// changes staged with `touched` find every resource record.
    ///
    /// # Errors
    /// The errors of [`Self::from_record`] and [`Self::from_records`].
    pub fn from_stored(
        record: Option<ProviderRecord>,
        resources: Vec<ProviderResourceRecord>,
        agent_id: &str,
        store: &Path,
    ) -> Result<(Self, bool), StateError> {
        let provider_id = record.as_ref().and_then(|r| r.provider_id.as_deref());
        let mut entries = Vec::new();
        if record.as_ref().is_some_and(|r| r.resources.is_empty()) {
            for stored in resources {
                Self::add_record(&mut entries, stored, agent_id, provider_id, store)?;
            }
        }
        Self::from_loaded(record, entries, store)
    }

    /// [`Self::from_stored`] with the resource records already decoded, each by
    /// [`Self::add_record`].
    ///
    /// # Errors
    /// As [`Self::from_stored`].
    pub fn from_loaded(
        record: Option<ProviderRecord>,
        entries: Vec<Arc<Resource>>,
        store: &Path,
    ) -> Result<(Self, bool), StateError> {
        let Some(record) = record else {
            return Ok((Self::default(), false));
        };
        if !record.resources.is_empty() {
            return Ok((Self::from_record(record, store)?, true));
        }
        Ok((Self::from_entries(record, entries, store)?, false))
    }
}

/// One stored resource in Mesos JSON, decoded and checked to belong to `provider_id`.
fn decode_resource(
    value: serde_json::Value,
    what: impl FnOnce() -> String,
    provider_id: Option<&str>,
    store: &Path,
) -> Result<Resource, StateError> {
    let resource: Resource =
        slrp_wire::json::from_value(value).map_err(StateError::decode(store, what()))?;
    let owner = resource.provider_id.as_ref().map(|id| id.value.as_str());
    if owner != provider_id {
        return Err(StateError::ForeignResource {
            resource: DisplayResource(&resource).to_string(),
            provider_id: provider_id.map(str::to_owned),
            store: store.to_owned(),
        });
    }
    Ok(resource)
}

/// The key prefix of agent `agent_id`'s resource records.
pub fn resource_prefix(agent_id: &str) -> String {
    format!("{agent_id}/")
}

fn put<R: Record>(txn: &mut Changes, record: &R) -> Result<(), StateError> {
    txn.put(record).map_err(|source| StateError::Stage {
        key: record.key(),
        source,
    })?;
    Ok(())
}

/// The identity of a resource: what Mesos's `Resources::add` compares to decide whether
/// two entries merge, without the quantity (`scalar`) and without `allocation_info`
/// (the total holds none; an operation's converted resources may). Fields the
/// comparison ignores are cleared and label lists sorted, so that resources that merge
/// have equal identities.
pub fn identity(resource: &Resource) -> Resource {
    let mut id = resource.clone();
    id.scalar = None;
    id.allocation_info = None;
    // Pre-reservation-refinement fields: the comparison reads `reservations` only.
    id.role = None;
    id.reservation = None;
    for reservation in &mut id.reservations {
        sort_labels(reservation.labels.as_mut());
    }
    if let Some(disk) = &mut id.disk {
        disk.volume = None;
        if let Some(persistence) = &mut disk.persistence {
            persistence.principal = None;
        }
        if let Some(source) = &mut disk.source {
            sort_labels(source.metadata.as_mut());
        }
    }
    // Only whether these are set counts.
    if id.revocable.is_some() {
        id.revocable = Some(Default::default());
    }
    if id.shared.is_some() {
        id.shared = Some(Default::default());
    }
    id
}

fn sort_labels(labels: Option<&mut Labels>) {
    if let Some(labels) = labels {
        labels
            .labels
            .sort_by(|a, b| (&a.key, &a.value).cmp(&(&b.key, &b.value)));
    }
}

/// The key part of a resource's record: a 128-bit FNV-1a digest of the protobuf
/// encoding of its [`identity`], as 32 lowercase hex digits. Stable across builds
/// (protobuf encodes fields in field-number order; FNV has no seed).
pub fn identity_digest(resource: &Resource) -> String {
    digest_of(&identity(resource))
}

fn digest_of(identity: &Resource) -> String {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    let hash = identity.encode_to_vec().iter().fold(OFFSET, |hash, byte| {
        (hash ^ u128::from(*byte)).wrapping_mul(PRIME)
    });
    format!("{hash:032x}")
}

/// Whether `entry` has identity `identity`, comparing the fields that tell resources
/// apart first so that most entries are rejected without building their identity.
fn same_identity(entry: &Resource, identity: &Resource) -> bool {
    fn disk_key(r: &Resource) -> Option<DiskKey<'_>> {
        r.disk.as_ref().map(|d| {
            (
                d.source.as_ref().map(|s| (s.r#type, &s.id, &s.profile)),
                d.persistence.as_ref().map(|p| &p.id),
            )
        })
    }
    type DiskKey<'a> = (
        Option<(i32, &'a Option<String>, &'a Option<String>)>,
        Option<&'a String>,
    );
    disk_key(entry) == disk_key(identity)
        && entry.name == identity.name
        && entry.r#type == identity.r#type
        && entry.provider_id == identity.provider_id
        && self::identity(entry) == *identity
}

fn resource_key(agent_id: &str, digest: &str) -> String {
    format!("{agent_id}/{digest}")
}

/// A profile as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredProfile {
    /// `mesos.v1.Volume.Source.CSIVolume.VolumeCapability` in Mesos JSON.
    pub capability: serde_json::Value,
    /// CreateVolume / GetCapacity parameters.
    pub parameters: BTreeMap<String, String>,
}

/// The provider record (kind `provider`, key: the agent id).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProviderRecord {
    /// The agent the identity belongs to (also the key).
    pub agent_id: String,
    /// The provider id the manager assigned under this agent id.
    pub provider_id: Option<String>,
    /// Schema version 1 only: the total resources (`mesos.v1.Resource` in Mesos JSON).
    /// Empty (and not written) since version 2, where each resource has a
    /// [`ProviderResourceRecord`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<serde_json::Value>,
    /// Profiles of the storage pools in the total.
    pub profiles: BTreeMap<String, StoredProfile>,
}

impl Record for ProviderRecord {
    const KIND: Kind = Kind::PROVIDER;
    const SCHEMA_VERSION: u32 = 2;

    fn key(&self) -> String {
        self.agent_id.clone()
    }

    /// Version 1 has the same fields, with `resources` filled.
    fn upgrade(schema: u32, value: serde_json::Value) -> Result<serde_json::Value, String> {
        match schema {
            1 | 2 => Ok(value),
            _ => Err(format!("no upgrade from schema version {schema}")),
        }
    }
}

/// Record kind of the resources of the total.
pub const PROVIDER_RESOURCE: Kind = Kind::new("provider_resource");

/// One distinct resource of the total (kind `provider_resource`, key
/// `<agent id>/<identity digest>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProviderResourceRecord {
    /// The agent the identity belongs to.
    pub agent_id: String,
    /// [`identity_digest`] of the resources below.
    pub digest: String,
    /// The total's entries of this identity (`mesos.v1.Resource` in Mesos JSON): one,
    /// except for identical copies of an indivisible resource, which the total keeps as
    /// separate entries.
    pub resources: Vec<serde_json::Value>,
}

impl ProviderResourceRecord {
    fn new(agent_id: &str, digest: String, entries: &[&Resource]) -> Result<Self, StateError> {
        let resources = entries
            .iter()
            .map(|r| slrp_wire::json::to_value(*r).map_err(StateError::encode("a resource")))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            agent_id: agent_id.to_owned(),
            digest,
            resources,
        })
    }
}

impl Record for ProviderResourceRecord {
    const KIND: Kind = PROVIDER_RESOURCE;
    const SCHEMA_VERSION: u32 = 1;

    fn key(&self) -> String {
        resource_key(&self.agent_id, &self.digest)
    }
}

/// Errors of the durable provider state.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Reading or writing the store failed.
    #[error("provider state in store {}", store.display())]
    Store {
        /// The store's directory.
        store: PathBuf,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// A message could not be encoded.
    #[error("cannot encode {what} of the provider state")]
    Encode {
        /// Which message.
        what: &'static str,
        /// Why.
        #[source]
        source: Box<JsonError>,
    },
    /// A stored message is not valid Mesos JSON.
    #[error("cannot decode {what} of the provider state in store {}", store.display())]
    Decode {
        /// The store's directory.
        store: PathBuf,
        /// Which message.
        what: String,
        /// Why.
        #[source]
        source: Box<JsonError>,
    },
    /// A recovered resource belongs to another provider id than the record's (or the
    /// record has no provider id).
    #[error(
        "resource '{resource}' in the provider state in store {} does not belong to provider {}",
        store.display(),
        provider_id.as_deref().unwrap_or("(none)")
    )]
    ForeignResource {
        /// The resource.
        resource: String,
        /// The record's provider id.
        provider_id: Option<String>,
        /// The store's directory.
        store: PathBuf,
    },
    /// A stored operation record contradicts itself.
    #[error("invalid operation record '{key}' in store {}: {reason}", store.display())]
    InvalidOperation {
        /// The record's key.
        key: String,
        /// The store's directory.
        store: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A record could not be added to a transaction (a key the store refuses).
    #[error("cannot stage record '{key}' of the provider state")]
    Stage {
        /// The record's key.
        key: String,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// A recovered storage pool has no recorded profile (Mesos's text).
    #[error("Cannot recover profile for storage pool '{pool}' from '{}'", store.display())]
    MissingProfile {
        /// The pool.
        pool: String,
        /// The store's directory.
        store: PathBuf,
    },
}

impl StateError {
    /// A mapper of `slrp_wire` encoding errors of `what` to [`StateError::Encode`].
    pub(crate) fn encode(what: &'static str) -> impl FnOnce(JsonError) -> Self {
        move |source| Self::Encode {
            what,
            source: Box::new(source),
        }
    }

    /// A mapper of `slrp_wire` decoding errors of `what` (read from `store`) to
    /// [`StateError::Decode`].
    pub(crate) fn decode(store: &Path, what: String) -> impl FnOnce(JsonError) -> Self {
        let store = store.to_owned();
        move |source| Self::Decode {
            store,
            what,
            source: Box::new(source),
        }
    }
}

/// Opens a store in `dir` for the tests of this module and of `operations`.
#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) async fn open_store(dir: &Path) -> slrp_store::Store {
    let path = dir.to_owned();
    tokio::task::spawn_blocking(move || slrp_store::Store::open(path))
        .await
        .unwrap()
        .unwrap()
}

/// What the driver's load does (`slrp_provider::persist`), for the tests of the pure
/// decoding here: reads, decodes, rewrites a version-1 record.
#[cfg(test)]
pub(crate) mod test_io {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::provider::operations::{
        OperationRecord, TrackedOperation, operations_of, operations_prefix,
    };
    use slrp_store::Store;

    fn store_error(store: &Store) -> impl Fn(StoreError) -> StateError + '_ {
        |source| StateError::Store {
            store: store.path().to_owned(),
            source,
        }
    }

    pub(crate) async fn load(store: &Store, agent_id: &str) -> Result<ProviderState, StateError> {
        let record: Option<ProviderRecord> =
            store.get(agent_id).await.map_err(store_error(store))?;
        let resources = store
            .load_prefix::<ProviderResourceRecord>(&resource_prefix(agent_id))
            .await
            .map_err(store_error(store))?;
        let (state, rewrite) =
            ProviderState::from_stored(record, resources, agent_id, store.path())?;
        if rewrite && !store.is_read_only() {
            save(&state, store, agent_id).await?;
        }
        Ok(state)
    }

    pub(crate) async fn save(
        state: &ProviderState,
        store: &Store,
        agent_id: &str,
    ) -> Result<(), StateError> {
        let mut txn = store.transaction();
        state.stage(txn.changes(), agent_id, None)?;
        txn.commit().await.map_err(store_error(store))
    }

    pub(crate) async fn load_operations(
        store: &Store,
        agent_id: &str,
    ) -> Result<Vec<TrackedOperation>, StateError> {
        let records = store
            .load_prefix::<OperationRecord>(&operations_prefix(agent_id))
            .await
            .map_err(store_error(store))?;
        operations_of(records, agent_id, store.path())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::provider::resources::{Conversion, CreatedKind, CreatedVolume, ProviderResources};
    use slrp_proto::mesos::v1::Label;
    use slrp_proto::mesos::v1::resource::AllocationInfo;
    use slrp_proto::mesos::v1::volume::source::csi_volume::VolumeCapability;
    use slrp_proto::mesos::v1::volume::source::csi_volume::volume_capability::{
        AccessMode, AccessType, BlockVolume, access_mode,
    };
    use slrp_store::Store;

    const MB: u64 = 1 << 20;

    fn ctx() -> ProviderResources {
        ProviderResources::new(
            ResourceProviderId {
                value: "rp-1".into(),
            },
            "org.test",
            "fake",
            Vec::new(),
        )
        .unwrap()
    }

    fn block() -> ProfileInfo {
        ProfileInfo {
            capability: VolumeCapability {
                access_mode: AccessMode {
                    mode: access_mode::Mode::SingleNodeWriter as i32,
                },
                access_type: Some(AccessType::Block(BlockVolume {})),
            },
            parameters: BTreeMap::from([("pool".into(), "default".into())]),
        }
    }

    fn profiles() -> BTreeMap<String, ProfileInfo> {
        BTreeMap::from([("fast".to_owned(), block())])
    }

    /// A pool of `fast` and `volumes` existing volumes.
    fn state(volumes: usize) -> ProviderState {
        let c = ctx();
        let mut total = Resources::from(c.raw_disk(1 << 40, Some("fast"), None, None));
        for i in 0..volumes {
            total.add(&c.raw_disk(MB, None, Some(&format!("vol-{i}")), None));
        }
        ProviderState::checkpoint(Some(c.provider_id().clone()), total, &profiles())
    }

    /// Through the store's JSON, as it is written.
    fn via_json<T: Serialize + serde::de::DeserializeOwned>(value: &T) -> T {
        serde_json::from_value(serde_json::to_value(value).unwrap()).unwrap()
    }

    fn records(state: &ProviderState) -> (ProviderRecord, Vec<ProviderResourceRecord>) {
        let record = state.to_record("agent-S0").unwrap();
        let resources = state.resource_records("agent-S0").unwrap();
        (via_json(&record), resources.iter().map(via_json).collect())
    }

    fn count_resource_records(store: &Store, agent_id: &str) -> usize {
        store
            .load_prefix_blocking::<ProviderResourceRecord>(&format!("{agent_id}/"))
            .unwrap()
            .len()
    }

    #[test]
    fn checkpoint_keeps_exactly_the_profiles_of_pools() {
        let c = ctx();
        let total: Resources = [
            c.raw_disk(1 << 30, Some("fast"), None, None),
            // A volume with a profile is no pool: its profile is not checkpointed.
            c.raw_disk(1 << 20, Some("slow"), Some("vol-1"), None),
        ]
        .into_iter()
        .collect();
        let known = BTreeMap::from([
            ("fast".to_owned(), block()),
            ("slow".to_owned(), block()),
            ("unused".to_owned(), block()),
        ]);
        let state = ProviderState::checkpoint(Some(c.provider_id().clone()), total, &known);
        assert_eq!(state.profiles.keys().collect::<Vec<_>>(), ["fast"]);
    }

    #[test]
    fn record_round_trip() {
        let state = state(2);
        let (record, resources) = records(&state);
        assert_eq!(record.key(), "agent-S0");
        assert!(record.resources.is_empty());
        assert_eq!(resources.len(), 3);
        let recovered = ProviderState::from_records(record, resources, Path::new("/s")).unwrap();
        assert_eq!(recovered, state);
    }

    #[test]
    fn the_provider_record_no_longer_holds_resources() {
        let json = serde_json::to_value(state(1).to_record("a").unwrap()).unwrap();
        assert!(json.get("resources").is_none(), "{json}");
    }

    #[test]
    fn a_pool_without_its_profile_fails_recovery_naming_pool_and_store() {
        let c = ctx();
        let state = ProviderState {
            provider_id: Some(c.provider_id().clone()),
            total: Resources::from(c.raw_disk(1 << 30, Some("fast"), None, None)),
            profiles: BTreeMap::new(),
        };
        let (record, resources) = records(&state);
        let error =
            ProviderState::from_records(record, resources, Path::new("/state/store")).unwrap_err();
        let text = error.to_string();
        assert!(matches!(error, StateError::MissingProfile { .. }), "{text}");
        assert!(
            text.starts_with("Cannot recover profile for storage pool '"),
            "{text}"
        );
        assert!(
            text.contains("fast") && text.ends_with("from '/state/store'"),
            "{text}"
        );
    }

    #[test]
    fn a_broken_resource_is_a_decode_error_naming_its_record() {
        let (record, mut resources) = records(&state(0));
        resources[0].resources = vec![serde_json::json!({"name": 5})];
        let key = resources[0].key();
        let error = ProviderState::from_records(record, resources, Path::new("/s")).unwrap_err();
        assert!(matches!(error, StateError::Decode { .. }), "{error}");
        assert!(error.to_string().contains(&key), "{error}");
    }

    #[test]
    fn a_resource_of_another_provider_fails_recovery() {
        let c = ctx();
        let state = ProviderState {
            provider_id: Some(c.provider_id().clone()),
            total: Resources::from(c.raw_disk(1 << 20, None, Some("vol-1"), None)),
            profiles: BTreeMap::new(),
        };
        let (mut other, resources) = records(&state);
        other.provider_id = Some("rp-2".into());
        let error =
            ProviderState::from_records(other, resources.clone(), Path::new("/s")).unwrap_err();
        assert!(
            matches!(&error, StateError::ForeignResource { provider_id, .. } if provider_id.as_deref() == Some("rp-2")),
            "{error}"
        );
        assert!(error.to_string().contains("vol-1"), "{error}");
        // Resources without any provider id recorded: never assigned, nothing to report.
        let (mut orphan, _) = records(&state);
        orphan.provider_id = None;
        let error = ProviderState::from_records(orphan, resources, Path::new("/s")).unwrap_err();
        assert!(
            matches!(
                &error,
                StateError::ForeignResource {
                    provider_id: None,
                    ..
                }
            ),
            "{error}"
        );
    }

    #[test]
    fn resources_that_merge_have_one_identity() {
        let c = ctx();
        let label = |key: &str| Label {
            key: key.into(),
            value: Some("v".into()),
        };
        let small = c.raw_disk(MB, Some("fast"), None, None);
        let mut large = c.raw_disk(7 * MB, Some("fast"), None, None);
        large.allocation_info = Some(AllocationInfo {
            role: Some("role".into()),
        });
        assert_eq!(identity_digest(&small), identity_digest(&large));

        let with = |labels: Vec<Label>| {
            let mut r = c.raw_disk(MB, Some("fast"), None, Some(Labels { labels }));
            r.scalar = Some(slrp_proto::mesos::v1::value::Scalar { value: 3.0 });
            r
        };
        let ab = with(vec![label("a"), label("b")]);
        let ba = with(vec![label("b"), label("a")]);
        let mut merged = Resources::from(ab.clone());
        merged.add(&ba);
        assert_eq!(merged.len(), 1, "Resources::add merges them");
        assert_eq!(identity_digest(&ab), identity_digest(&ba));

        // What does not merge is told apart.
        let other_profile = c.raw_disk(MB, Some("slow"), None, None);
        let volume = c.raw_disk(MB, None, Some("vol-1"), None);
        let other_volume = c.raw_disk(MB, None, Some("vol-2"), None);
        let digests: BTreeSet<String> = [&small, &other_profile, &volume, &other_volume]
            .into_iter()
            .map(identity_digest)
            .collect();
        assert_eq!(digests.len(), 4);
        assert_eq!(identity_digest(&small).len(), 32);
    }

    #[tokio::test]
    async fn a_touched_stage_writes_only_the_touched_records() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(dir.path()).await;
        let mut state = state(100);
        test_io::save(&state, &store, "agent-S0").await.unwrap();
        assert_eq!(count_resource_records(&store, "agent-S0"), 101);

        // CREATE_DISK from the pool: the pool shrinks, a disk appears.
        let c = ctx();
        let source = c.raw_disk(4 * MB, Some("fast"), None, None);
        let created = c.created_disk(
            &source,
            &CreatedVolume {
                id: "new-vol",
                context: &BTreeMap::new(),
                profile: "fast",
            },
            CreatedKind::Mount,
        );
        state.total = state.total.apply(&created).unwrap();
        let touched = created.consumed.clone() + &created.converted;
        let mut txn = store.transaction();
        state
            .stage(txn.changes(), "agent-S0", Some(&touched))
            .unwrap();
        // The provider record, the pool's record and the new disk's.
        assert_eq!(txn.len(), 3);
        txn.commit().await.unwrap();
        assert_eq!(count_resource_records(&store, "agent-S0"), 102);
        assert_eq!(test_io::load(&store, "agent-S0").await.unwrap(), state);

        // DESTROY of an existing volume that leaves nothing: its record is deleted.
        let gone = Conversion {
            consumed: Resources::from(c.raw_disk(MB, None, Some("vol-7"), None)),
            converted: Resources::new(),
        };
        state.total = state.total.apply(&gone).unwrap();
        let mut txn = store.transaction();
        state
            .stage(txn.changes(), "agent-S0", Some(&gone.consumed))
            .unwrap();
        assert_eq!(txn.len(), 2);
        txn.commit().await.unwrap();
        assert_eq!(count_resource_records(&store, "agent-S0"), 101);
        assert_eq!(test_io::load(&store, "agent-S0").await.unwrap(), state);
    }

    #[tokio::test]
    async fn load_after_staged_conversions_equals_the_total() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(dir.path()).await;
        let c = ctx();
        let mut state = state(3);
        test_io::save(&state, &store, "agent-S0").await.unwrap();
        let mut disks = Vec::new();
        for step in 0..40u64 {
            let conversion = if step % 3 == 2 && !disks.is_empty() {
                // Destroy a disk: back to the pool.
                let disk: Resource = disks.remove(usize::try_from(step).unwrap() % disks.len());
                c.destroyed_disk(&disk, true, |p| p == "fast").conversion
            } else {
                let source = c.raw_disk((step + 1) * MB, Some("fast"), None, None);
                let created = c.created_disk(
                    &source,
                    &CreatedVolume {
                        id: &format!("disk-{step}"),
                        context: &BTreeMap::new(),
                        profile: "fast",
                    },
                    if step % 2 == 0 {
                        CreatedKind::Mount
                    } else {
                        CreatedKind::Block
                    },
                );
                disks.extend(created.converted.iter().cloned());
                created
            };
            state.total = state.total.apply(&conversion).unwrap();
            let touched = conversion.consumed.clone() + &conversion.converted;
            let mut txn = store.transaction();
            state
                .stage(txn.changes(), "agent-S0", Some(&touched))
                .unwrap();
            txn.commit().await.unwrap();
            assert_eq!(
                test_io::load(&store, "agent-S0").await.unwrap(),
                state,
                "after step {step}"
            );
        }
        assert_eq!(
            count_resource_records(&store, "agent-S0"),
            state.total.len()
        );
    }

    #[tokio::test]
    async fn save_and_load_by_agent_id() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(dir.path()).await;
        let state = state(2);
        test_io::save(&state, &store, "agent-1").await.unwrap();
        assert_eq!(test_io::load(&store, "agent-1").await.unwrap(), state);
        // Another agent id is another identity: nothing recorded under it.
        assert_eq!(
            test_io::load(&store, "agent-2").await.unwrap(),
            ProviderState::default()
        );
        // A full save replaces every resource record.
        let smaller = ProviderState {
            total: Resources::from(state.total.iter().next().unwrap().clone()),
            ..state
        };
        test_io::save(&smaller, &store, "agent-1").await.unwrap();
        assert_eq!(count_resource_records(&store, "agent-1"), 1);
        assert_eq!(test_io::load(&store, "agent-1").await.unwrap(), smaller);
    }

    /// What a Mesos agent keeps on an operation's resources and the provider strips from
    /// the total (§5.6 step 1).
    fn allocated(resources: &Resources) -> Resources {
        resources
            .iter()
            .map(|r| Resource {
                allocation_info: Some(AllocationInfo {
                    role: Some("role".into()),
                }),
                ..r.clone()
            })
            .collect()
    }

    fn load_blocking(store: &Store) -> ProviderState {
        let record = store
            .get_blocking::<ProviderRecord>("agent-S0")
            .unwrap()
            .unwrap();
        let resources = store
            .load_prefix_blocking::<ProviderResourceRecord>("agent-S0/")
            .unwrap();
        ProviderState::from_records(record, resources, store.path()).unwrap()
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]

        /// Any sequence of disk creations and destructions (touched resources carrying
        /// allocation info, as an operation's do) and reconciliations (full rewrites)
        /// leaves exactly the total in the store, one record per identity.
        #[test]
        fn staged_changes_keep_the_store_equal_to_the_total(
            steps in proptest::collection::vec((0u8..3, proptest::prelude::any::<u8>(), proptest::prelude::any::<bool>()), 1..16)
        ) {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open(dir.path()).unwrap();
            let c = ctx();
            let mut known = profiles();
            known.insert("slow".into(), block());
            let total: Resources = [
                c.raw_disk(1 << 40, Some("fast"), None, None),
                c.raw_disk(1 << 40, Some("slow"), None, None),
            ]
            .into_iter()
            .collect();
            let mut state = ProviderState::checkpoint(Some(c.provider_id().clone()), total, &known);
            let mut txn = store.transaction();
            state.stage(txn.changes(), "agent-S0", None).unwrap();
            txn.commit_blocking().unwrap();
            let mut disks: Vec<Resource> = Vec::new();
            for (n, (action, arg, flag)) in steps.into_iter().enumerate() {
                let touched = match action {
                    0 => {
                        let profile = if arg % 2 == 0 { "fast" } else { "slow" };
                        let source = c.raw_disk(u64::from(arg % 8 + 1) * MB, Some(profile), None, None);
                        let conversion = c.created_disk(
                            &source,
                            &CreatedVolume {
                                id: &format!("disk-{n}"),
                                context: &BTreeMap::new(),
                                profile,
                            },
                            if flag { CreatedKind::Mount } else { CreatedKind::Block },
                        );
                        disks.extend(conversion.converted.iter().cloned());
                        state.total = state.total.apply(&conversion).unwrap();
                        Some(allocated(&conversion.consumed) + &allocated(&conversion.converted))
                    }
                    1 if !disks.is_empty() => {
                        let disk = disks.remove(usize::from(arg) % disks.len());
                        let conversion = c.destroyed_disk(&disk, flag, |p| p == "fast").conversion;
                        state.total = state.total.apply(&conversion).unwrap();
                        Some(allocated(&conversion.consumed) + &allocated(&conversion.converted))
                    }
                    _ => {
                        state.total.add(&c.raw_disk(MB, None, Some(&format!("found-{n}")), None));
                        None
                    }
                };
                let mut txn = store.transaction();
                state.stage(txn.changes(), "agent-S0", touched.as_ref()).unwrap();
                txn.commit_blocking().unwrap();
                proptest::prop_assert_eq!(&load_blocking(&store), &state, "after step {}", n);
                let identities: BTreeSet<String> = state.total.iter().map(identity_digest).collect();
                proptest::prop_assert_eq!(count_resource_records(&store, "agent-S0"), identities.len());
            }
        }
    }

    /// A record exactly as schema version 1 wrote it.
    #[derive(Serialize, Deserialize)]
    struct V1(serde_json::Value);

    impl Record for V1 {
        const KIND: Kind = Kind::PROVIDER;
        const SCHEMA_VERSION: u32 = 1;

        fn key(&self) -> String {
            self.0["agent_id"].as_str().unwrap().to_owned()
        }
    }

    #[tokio::test]
    async fn a_version_1_record_loads_and_is_rewritten_in_the_current_layout() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(dir.path()).await;
        let v1 = serde_json::json!({
            "agent_id": "agent-S0",
            "provider_id": "rp-1",
            "resources": [
                {
                    "provider_id": {"value": "rp-1"},
                    "name": "disk",
                    "type": "SCALAR",
                    "scalar": {"value": 1024.0},
                    "disk": {"source": {"type": "RAW", "vendor": "org.test.fake", "profile": "fast"}}
                },
                {
                    "provider_id": {"value": "rp-1"},
                    "name": "disk",
                    "type": "SCALAR",
                    "scalar": {"value": 1.0},
                    "disk": {"source": {"type": "RAW", "vendor": "org.test.fake", "id": "vol-1"}}
                }
            ],
            "profiles": {
                "fast": {
                    "capability": {"block": {}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}},
                    "parameters": {"pool": "default"}
                }
            }
        });
        let mut txn = store.transaction();
        txn.put(&V1(v1)).unwrap();
        txn.commit().await.unwrap();

        let loaded = test_io::load(&store, "agent-S0").await.unwrap();
        assert_eq!(loaded.provider_id.as_ref().unwrap().value, "rp-1");
        assert_eq!(loaded.total.len(), 2);
        assert_eq!(loaded.profiles, profiles());
        // Rewritten: the provider record without resources, one record per resource.
        let raw = store
            .get_blocking::<ProviderRecord>("agent-S0")
            .unwrap()
            .unwrap();
        assert!(raw.resources.is_empty());
        assert_eq!(count_resource_records(&store, "agent-S0"), 2);
        assert_eq!(test_io::load(&store, "agent-S0").await.unwrap(), loaded);
    }
}
