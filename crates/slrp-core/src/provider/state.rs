//! The provider's durable state (spec §3.3 step 4, §8.3, §8.4): its identity, its total
//! resources and the profiles of its storage pools, in one store record.
//!
//! Mesos keeps this in `meta/slaves/<agent id>/resource_providers/<type>/<name>/latest`
//! (the identity) and `resource_provider.state` (resources, operations, profiles). Here it
//! is one [`ProviderRecord`] of kind `provider` keyed by the agent id, in the provider's own
//! store beside the volume records, replaced in one transaction. Keying by agent id keeps
//! Mesos's rule that an agent with a new id means a new provider identity (§3.6, §8.6): the
//! record of the old agent id stays (as Mesos never removes old provider directories) and
//! is simply not looked at.
//!
//! Mesos messages are stored as Mesos JSON (`slrp_wire::json`), so `slrp inspect` and
//! `sqlite3` show them readably; the record's shape is versioned by the store
//! ([`Record::SCHEMA_VERSION`], stored with every record).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use slrp_proto::mesos::v1::volume::source::csi_volume::VolumeCapability;
use slrp_proto::mesos::v1::{Resource, ResourceProviderId};
use slrp_store::{Kind, Record, Store, StoreError};
use slrp_wire::JsonError;

use super::resources::{DisplayResource, Resources};

/// What a profile means to the provider (spec §7.3: name → capability and parameters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileDef {
    /// The volume capability, in the Mesos form the profile adaptor translates to.
    pub capability: VolumeCapability,
    /// The parameters passed to CreateVolume and GetCapacity.
    pub parameters: BTreeMap<String, String>,
}

/// The provider state as the worker holds it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProviderState {
    /// The id the manager assigned; `None` until the first subscription of this identity.
    pub provider_id: Option<ResourceProviderId>,
    /// The total resources last computed (and reported).
    pub total: Resources,
    /// The profiles of the storage pools in `total` (spec §8.2: exactly those are
    /// checkpointed).
    pub profiles: BTreeMap<String, ProfileDef>,
}

impl ProviderState {
    /// The state to checkpoint: `total` with the profiles of its storage pools, taken
    /// from `known` (the provider's profile map). A pool whose profile `known` lacks is
    /// left without a checkpointed profile, which recovery then refuses: callers keep
    /// profiles of pools in their map (spec §12 item 11).
    pub fn checkpoint(
        provider_id: Option<ResourceProviderId>,
        total: Resources,
        known: &BTreeMap<String, ProfileDef>,
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

    /// The record for agent `agent_id`.
    ///
    /// # Errors
    /// [`StateError::Encode`] if a message cannot be written as Mesos JSON (a descriptor
    /// missing from `slrp-proto`: a build problem).
    pub fn to_record(&self, agent_id: &str) -> Result<ProviderRecord, StateError> {
        let encode = StateError::encode;
        let resources = self
            .total
            .iter()
            .map(|r| slrp_wire::json::to_value(r).map_err(encode("a resource")))
            .collect::<Result<_, _>>()?;
        let profiles = self
            .profiles
            .iter()
            .map(|(name, def)| {
                let capability = slrp_wire::json::to_value(&def.capability)
                    .map_err(encode("a profile capability"))?;
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
            resources,
            profiles,
        })
    }

    /// The state a record holds, checked as Mesos checks a recovered state (§3.3 step 4):
    /// every storage pool's profile must be in the record. Every resource must also belong
    /// to the recorded provider id: the total is reported as is in UPDATE_STATE, and a
    /// resource of another (or no) provider would be advertised under this one's id.
    /// `store` names where the record came from in errors.
    ///
    /// # Errors
    /// [`StateError::Decode`] for a message that is not valid Mesos JSON;
    /// [`StateError::MissingProfile`] for a pool whose profile is not recorded;
    /// [`StateError::ForeignResource`] for a resource of another provider id.
    pub fn from_record(record: ProviderRecord, store: &Path) -> Result<Self, StateError> {
        let decode = |what| StateError::decode(store, what);
        let mut total = Resources::new();
        for (index, value) in record.resources.into_iter().enumerate() {
            let resource: Resource =
                slrp_wire::json::from_value(value).map_err(decode(format!("resource {index}")))?;
            let owner = resource.provider_id.as_ref().map(|id| &id.value);
            if owner != record.provider_id.as_ref() {
                return Err(StateError::ForeignResource {
                    resource: DisplayResource(&resource).to_string(),
                    provider_id: record.provider_id,
                    store: store.to_owned(),
                });
            }
            total.add(&resource);
        }
        let mut profiles = BTreeMap::new();
        for (name, stored) in record.profiles {
            let capability = slrp_wire::json::from_value(stored.capability)
                .map_err(decode(format!("the capability of profile {name:?}")))?;
            profiles.insert(
                name,
                ProfileDef {
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
            provider_id: record.provider_id.map(|value| ResourceProviderId { value }),
            total,
            profiles,
        })
    }

    /// Loads the state of agent `agent_id` from `store`: the empty state (a brand-new
    /// identity, subscribe without id) when there is no record under that agent id.
    ///
    /// # Errors
    /// [`StateError::Store`] if the store cannot be read; the errors of
    /// [`Self::from_record`].
    pub async fn load(store: &Store, agent_id: &str) -> Result<Self, StateError> {
        let record = store
            .get::<ProviderRecord>(agent_id)
            .await
            .map_err(|source| StateError::Store {
                store: store.path().to_owned(),
                source,
            })?;
        match record {
            None => Ok(Self::default()),
            Some(record) => Self::from_record(record, store.path()),
        }
    }

    /// Replaces the record of agent `agent_id` in one durable transaction.
    ///
    /// # Errors
    /// [`StateError::Encode`], or [`StateError::Store`] if the commit failed (the store is
    /// then poisoned: fatal, conventions §4.4 rule 5).
    pub async fn save(&self, store: &Store, agent_id: &str) -> Result<(), StateError> {
        let record = self.to_record(agent_id)?;
        let error = |source| StateError::Store {
            store: store.path().to_owned(),
            source,
        };
        let mut txn = store.transaction();
        txn.put(&record).map_err(error)?;
        txn.commit().await.map_err(error)
    }
}

/// A profile as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredProfile {
    /// `mesos.v1.Volume.Source.CSIVolume.VolumeCapability` in Mesos JSON.
    pub capability: serde_json::Value,
    /// CreateVolume / GetCapacity parameters.
    pub parameters: BTreeMap<String, String>,
}

/// The durable record (kind `provider`, key: the agent id).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProviderRecord {
    /// The agent the identity belongs to (also the key).
    pub agent_id: String,
    /// The provider id the manager assigned under this agent id.
    pub provider_id: Option<String>,
    /// The total resources (`mesos.v1.Resource` in Mesos JSON), in order.
    pub resources: Vec<serde_json::Value>,
    /// Profiles of the storage pools in `resources`.
    pub profiles: BTreeMap<String, StoredProfile>,
}

impl Record for ProviderRecord {
    const KIND: Kind = Kind::PROVIDER;
    const SCHEMA_VERSION: u32 = 1;

    fn key(&self) -> String {
        self.agent_id.clone()
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::provider::resources::ProviderResources;
    use slrp_proto::mesos::v1::volume::source::csi_volume::volume_capability::{
        AccessMode, AccessType, BlockVolume, access_mode,
    };

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

    fn block() -> ProfileDef {
        ProfileDef {
            capability: VolumeCapability {
                access_mode: AccessMode {
                    mode: access_mode::Mode::SingleNodeWriter as i32,
                },
                access_type: Some(AccessType::Block(BlockVolume {})),
            },
            parameters: BTreeMap::from([("pool".into(), "default".into())]),
        }
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
        let c = ctx();
        let total: Resources = [
            c.raw_disk(1 << 30, Some("fast"), None, None),
            c.raw_disk(1 << 20, None, Some("vol-1"), None),
        ]
        .into_iter()
        .collect();
        let state = ProviderState::checkpoint(
            Some(c.provider_id().clone()),
            total,
            &BTreeMap::from([("fast".to_owned(), block())]),
        );
        let record = state.to_record("agent-S0").unwrap();
        assert_eq!(record.key(), "agent-S0");
        // Through the store's JSON, as it is written.
        let json = serde_json::to_value(&record).unwrap();
        let back: ProviderRecord = serde_json::from_value(json).unwrap();
        let recovered = ProviderState::from_record(back, Path::new("/s")).unwrap();
        assert_eq!(recovered, state);
    }

    #[test]
    fn a_pool_without_its_profile_fails_recovery_naming_pool_and_store() {
        let c = ctx();
        let state = ProviderState {
            provider_id: Some(c.provider_id().clone()),
            total: Resources::from(c.raw_disk(1 << 30, Some("fast"), None, None)),
            profiles: BTreeMap::new(),
        };
        let record = state.to_record("agent-S0").unwrap();
        let error = ProviderState::from_record(record, Path::new("/state/store")).unwrap_err();
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
    fn a_broken_resource_is_a_decode_error() {
        let record = ProviderRecord {
            agent_id: "a".into(),
            provider_id: None,
            resources: vec![serde_json::json!({"name": 5})],
            profiles: BTreeMap::new(),
        };
        let error = ProviderState::from_record(record, Path::new("/s")).unwrap_err();
        assert!(matches!(error, StateError::Decode { .. }), "{error}");
    }

    #[test]
    fn a_resource_of_another_provider_fails_recovery() {
        let c = ctx();
        let state = ProviderState {
            provider_id: Some(c.provider_id().clone()),
            total: Resources::from(c.raw_disk(1 << 20, None, Some("vol-1"), None)),
            profiles: BTreeMap::new(),
        };
        let mut other = state.to_record("agent-S0").unwrap();
        other.provider_id = Some("rp-2".into());
        let error = ProviderState::from_record(other, Path::new("/s")).unwrap_err();
        assert!(
            matches!(&error, StateError::ForeignResource { provider_id, .. } if provider_id.as_deref() == Some("rp-2")),
            "{error}"
        );
        assert!(error.to_string().contains("vol-1"), "{error}");
        // Resources without any provider id recorded: never assigned, nothing to report.
        let mut orphan = state.to_record("agent-S0").unwrap();
        orphan.provider_id = None;
        let error = ProviderState::from_record(orphan, Path::new("/s")).unwrap_err();
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

    #[tokio::test]
    async fn save_and_load_by_agent_id() {
        let dir = tempfile::tempdir().unwrap();
        let store = tokio::task::spawn_blocking({
            let path = dir.path().to_owned();
            move || Store::open(path)
        })
        .await
        .unwrap()
        .unwrap();
        let c = ctx();
        let state = ProviderState {
            provider_id: Some(c.provider_id().clone()),
            total: Resources::from(c.raw_disk(1 << 20, None, Some("v"), None)),
            profiles: BTreeMap::new(),
        };
        state.save(&store, "agent-1").await.unwrap();
        assert_eq!(ProviderState::load(&store, "agent-1").await.unwrap(), state);
        // Another agent id is another identity: nothing recorded under it.
        assert_eq!(
            ProviderState::load(&store, "agent-2").await.unwrap(),
            ProviderState::default()
        );
    }
}
