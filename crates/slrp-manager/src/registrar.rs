//! The registrar: which provider IDs this manager has admitted or removed.
//!
//! Mesos keeps this registry under the agent's meta directory so that a provider that
//! resubscribes after an agent restart is admitted again. Here it is one small JSON file,
//! `<state_dir>/resource_provider_registry.json`, replaced atomically by
//! [`slrp_types::write_atomic`] (write a temporary file, fsync, rename, fsync the
//! directory) on every change. It holds a handful of records and changes only on admission
//! and removal, so a whole-file rewrite is cheaper and simpler than a database. Without a
//! state dir the registry lives in memory.
//!
//! The file also holds the agent ID the manager serves on GET_AGENT, so that a restarted
//! manager is the same agent. Mesos keeps the registry under `meta/slaves/<agent_id>/`: an
//! agent with a new ID starts from an empty registry. Here a configured agent ID that
//! differs from the recorded one does the same (the providers admitted under the old ID
//! are forgotten), which is what lets a test restart the manager as a re-registered agent.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::RegistrarError;

const FILE_NAME: &str = "resource_provider_registry.json";
const FORMAT_VERSION: u32 = 1;

/// What the registrar remembers of a provider: Mesos's `{id, type, name}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderRecord {
    /// The assigned provider ID.
    pub id: String,
    /// `ResourceProviderInfo.type`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `ResourceProviderInfo.name`.
    pub name: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct RegistryFile {
    version: u32,
    /// Absent in files written before GET_AGENT existed: those keep their providers and
    /// adopt the configured (or a new) agent ID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    agent_id: Option<String>,
    providers: Vec<ProviderRecord>,
    removed: Vec<ProviderRecord>,
}

#[derive(Debug)]
pub(crate) struct Registrar {
    path: Option<PathBuf>,
    agent_id: String,
    known: BTreeMap<String, ProviderRecord>,
    removed: BTreeMap<String, ProviderRecord>,
}

impl Registrar {
    /// Loads the registry (blocking; runs before the manager serves anything) and settles
    /// the agent ID: `configured` if given, else the recorded one, else a fresh one. A
    /// configured ID that differs from the recorded one starts an empty registry, as a
    /// Mesos agent registered under a new ID does.
    pub(crate) fn recover(
        state_dir: Option<&Path>,
        configured: Option<&str>,
    ) -> Result<Self, RegistrarError> {
        let Some(dir) = state_dir else {
            return Ok(Self {
                path: None,
                agent_id: configured.map_or_else(new_agent_id, str::to_owned),
                known: BTreeMap::new(),
                removed: BTreeMap::new(),
            });
        };
        let path = dir.join(FILE_NAME);
        let mut file = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice::<RegistryFile>(&bytes).map_err(|source| {
                RegistrarError::Parse {
                    path: path.clone(),
                    source,
                }
            })?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(dir).map_err(|source| RegistrarError::Write {
                    path: path.clone(),
                    source,
                })?;
                RegistryFile::default()
            }
            Err(source) => return Err(RegistrarError::Read { path, source }),
        };
        let agent_id = match (configured, file.agent_id.as_deref()) {
            (Some(new), Some(old)) if new != old => {
                tracing::info!(
                    old_agent_id = old,
                    agent_id = new,
                    forgotten = file.providers.len(),
                    "the agent ID changed: providers admitted under the old ID are unknown now"
                );
                file.providers.clear();
                file.removed.clear();
                new.to_owned()
            }
            (Some(id), _) | (None, Some(id)) => id.to_owned(),
            (None, None) => new_agent_id(),
        };
        let changed = file.agent_id.as_deref() != Some(agent_id.as_str());
        let by_id = |records: Vec<ProviderRecord>| {
            records
                .into_iter()
                .map(|record| (record.id.clone(), record))
                .collect()
        };
        let registrar = Self {
            path: Some(path),
            agent_id,
            known: by_id(file.providers),
            removed: by_id(file.removed),
        };
        // Written at once so that the ID is stable even if no provider is ever admitted.
        if changed && let Some(path) = &registrar.path {
            write_atomically(path, &registrar.file())?;
        }
        Ok(registrar)
    }

    /// Admits `records` before anything is served (blocking, like [`Registrar::recover`]):
    /// as a Mesos agent's registrar that knew a provider before slrp took it over. A record
    /// already known is kept as it is; a removed one cannot be admitted again.
    pub(crate) fn preadmit(&mut self, records: &[ProviderRecord]) -> Result<(), RegistrarError> {
        let mut changed = false;
        for record in records {
            if self.removed.contains_key(&record.id) {
                return Err(RegistrarError::Removed {
                    id: record.id.clone(),
                });
            }
            if !self.known.contains_key(&record.id) {
                self.known.insert(record.id.clone(), record.clone());
                changed = true;
            }
        }
        if changed && let Some(path) = &self.path {
            write_atomically(path, &self.file())?;
        }
        Ok(())
    }

    /// The agent ID served on GET_AGENT.
    pub(crate) fn agent_id(&self) -> &str {
        &self.agent_id
    }

    pub(crate) fn known(&self, id: &str) -> Option<&ProviderRecord> {
        self.known.get(id)
    }

    /// Records a new provider (Mesos `AdmitResourceProvider`).
    pub(crate) async fn admit(&mut self, record: ProviderRecord) -> Result<(), RegistrarError> {
        if self.removed.contains_key(&record.id) {
            return Err(RegistrarError::Removed { id: record.id });
        }
        let id = record.id.clone();
        self.known.insert(id.clone(), record);
        if let Err(error) = self.persist().await {
            self.known.remove(&id);
            return Err(error);
        }
        Ok(())
    }

    /// Marks a provider removed (Mesos `RemoveResourceProvider`).
    pub(crate) async fn remove(&mut self, id: &str) -> Result<(), RegistrarError> {
        let Some(record) = self.known.remove(id) else {
            return Err(RegistrarError::Unknown { id: id.to_owned() });
        };
        self.removed.insert(id.to_owned(), record.clone());
        if let Err(error) = self.persist().await {
            self.removed.remove(id);
            self.known.insert(id.to_owned(), record);
            return Err(error);
        }
        Ok(())
    }

    async fn persist(&self) -> Result<(), RegistrarError> {
        let Some(path) = self.path.clone() else {
            return Ok(());
        };
        let file = self.file();
        tokio::task::spawn_blocking(move || write_atomically(&path, &file))
            .await
            .map_err(RegistrarError::Task)?
    }
}

impl Registrar {
    fn file(&self) -> RegistryFile {
        RegistryFile {
            version: FORMAT_VERSION,
            agent_id: Some(self.agent_id.clone()),
            providers: self.known.values().cloned().collect(),
            removed: self.removed.values().cloned().collect(),
        }
    }
}

/// An ID of the form a Mesos master gives an agent: `<master-assigned UUID>-S<n>`.
fn new_agent_id() -> String {
    format!("{}-S0", uuid::Uuid::new_v4())
}

fn write_atomically(path: &Path, file: &RegistryFile) -> Result<(), RegistrarError> {
    let error = |source| RegistrarError::Write {
        path: path.to_owned(),
        source,
    };
    let bytes = serde_json::to_vec_pretty(file)
        .map_err(std::io::Error::other)
        .map_err(error)?;
    slrp_types::write_atomic(path, &bytes).map_err(|e| error(e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> ProviderRecord {
        ProviderRecord {
            id: id.to_owned(),
            kind: "org.apache.mesos.rp.local.storage".to_owned(),
            name: "test".to_owned(),
        }
    }

    // Mesos ResourceProviderRegistrarTest.GenericRegistrar.
    #[tokio::test]
    async fn generic_registrar() -> Result<(), RegistrarError> {
        let dir = tempfile::tempdir().map_err(|source| RegistrarError::Read {
            path: PathBuf::new(),
            source,
        })?;
        let mut registrar = Registrar::recover(Some(dir.path()), None)?;
        registrar.admit(record("a")).await?;
        registrar.remove("a").await?;
        assert!(matches!(
            registrar.admit(record("a")).await,
            Err(RegistrarError::Removed { .. })
        ));
        assert!(matches!(
            registrar.remove("b").await,
            Err(RegistrarError::Unknown { .. })
        ));
        registrar.admit(record("c")).await?;

        let recovered = Registrar::recover(Some(dir.path()), None)?;
        assert_eq!(recovered.known("c"), Some(&record("c")));
        assert_eq!(recovered.known("a"), None);
        assert!(recovered.removed.contains_key("a"));
        Ok(())
    }

    #[tokio::test]
    async fn agent_id_is_stable_and_a_new_one_starts_an_empty_registry()
    -> Result<(), RegistrarError> {
        let dir = tempfile::tempdir().map_err(|source| RegistrarError::Read {
            path: PathBuf::new(),
            source,
        })?;
        let first = Registrar::recover(Some(dir.path()), None)?;
        let generated = first.agent_id().to_owned();
        assert!(generated.ends_with("-S0"), "{generated}");
        assert!(slrp_types::validate_id(&generated).is_ok());
        drop(first);
        let mut again = Registrar::recover(Some(dir.path()), None)?;
        assert_eq!(again.agent_id(), generated, "stable across restarts");
        again.admit(record("a")).await?;

        let same = Registrar::recover(Some(dir.path()), Some(&generated))?;
        assert_eq!(same.known("a"), Some(&record("a")));

        let renewed = Registrar::recover(Some(dir.path()), Some("new-S1"))?;
        assert_eq!(renewed.agent_id(), "new-S1");
        assert_eq!(renewed.known("a"), None, "a new agent ID knows no provider");
        let reread = Registrar::recover(Some(dir.path()), None)?;
        assert_eq!(reread.agent_id(), "new-S1");
        assert_eq!(reread.known("a"), None);

        let memory = Registrar::recover(None, None)?;
        assert_ne!(
            memory.agent_id(),
            Registrar::recover(None, None)?.agent_id()
        );
        Ok(())
    }

    #[test]
    fn preadmitted_records_are_known_and_recorded() -> Result<(), RegistrarError> {
        let dir = tempfile::tempdir().map_err(|source| RegistrarError::Read {
            path: PathBuf::new(),
            source,
        })?;
        let mut registrar = Registrar::recover(Some(dir.path()), None)?;
        assert_eq!(registrar.known("a"), None);
        registrar.preadmit(&[record("a")])?;
        assert_eq!(registrar.known("a"), Some(&record("a")));
        let recovered = Registrar::recover(Some(dir.path()), None)?;
        assert_eq!(recovered.known("a"), Some(&record("a")), "written at once");

        let mut memory = Registrar::recover(None, None)?;
        memory.preadmit(&[record("b")])?;
        assert_eq!(memory.known("b"), Some(&record("b")));
        Ok(())
    }

    #[tokio::test]
    async fn a_removed_provider_cannot_be_preadmitted() -> Result<(), RegistrarError> {
        let mut registrar = Registrar::recover(None, None)?;
        registrar.admit(record("a")).await?;
        registrar.remove("a").await?;
        assert!(matches!(
            registrar.preadmit(&[record("a")]),
            Err(RegistrarError::Removed { id }) if id == "a"
        ));
        Ok(())
    }

    #[test]
    fn corrupt_registry_is_an_error() -> Result<(), std::io::Error> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join(FILE_NAME), b"not json")?;
        assert!(matches!(
            Registrar::recover(Some(dir.path()), None),
            Err(RegistrarError::Parse { .. })
        ));
        Ok(())
    }
}
