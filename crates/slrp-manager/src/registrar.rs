//! The registrar: which provider IDs this manager has admitted or removed.
//!
//! Mesos keeps this registry under the agent's meta directory so that a provider that
//! resubscribes after an agent restart is admitted again. Here it is one small JSON file,
//! `<state_dir>/resource_provider_registry.json`, replaced atomically (write a temporary
//! file, fsync, rename, fsync the directory) on every change. It holds a handful of
//! records and changes only on admission and removal, so a whole-file rewrite is cheaper
//! and simpler than a database. Without a state dir the registry lives in memory.

use std::collections::BTreeMap;
use std::io::Write as _;
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
    providers: Vec<ProviderRecord>,
    removed: Vec<ProviderRecord>,
}

#[derive(Debug)]
pub(crate) struct Registrar {
    path: Option<PathBuf>,
    known: BTreeMap<String, ProviderRecord>,
    removed: BTreeMap<String, ProviderRecord>,
}

impl Registrar {
    /// Loads the registry (blocking; runs before the manager serves anything).
    pub(crate) fn recover(state_dir: Option<&Path>) -> Result<Self, RegistrarError> {
        let Some(dir) = state_dir else {
            return Ok(Self {
                path: None,
                known: BTreeMap::new(),
                removed: BTreeMap::new(),
            });
        };
        let path = dir.join(FILE_NAME);
        let file = match std::fs::read(&path) {
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
        let by_id = |records: Vec<ProviderRecord>| {
            records
                .into_iter()
                .map(|record| (record.id.clone(), record))
                .collect()
        };
        Ok(Self {
            path: Some(path),
            known: by_id(file.providers),
            removed: by_id(file.removed),
        })
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
        let file = RegistryFile {
            version: FORMAT_VERSION,
            providers: self.known.values().cloned().collect(),
            removed: self.removed.values().cloned().collect(),
        };
        tokio::task::spawn_blocking(move || write_atomically(&path, &file))
            .await
            .map_err(RegistrarError::Task)?
    }
}

fn write_atomically(path: &Path, file: &RegistryFile) -> Result<(), RegistrarError> {
    let error = |source| RegistrarError::Write {
        path: path.to_owned(),
        source,
    };
    let bytes = serde_json::to_vec_pretty(file)
        .map_err(std::io::Error::other)
        .map_err(error)?;
    let temp = path.with_extension("json.tmp");
    let mut out = std::fs::File::create(&temp).map_err(error)?;
    out.write_all(&bytes).map_err(error)?;
    out.sync_all().map_err(error)?;
    std::fs::rename(&temp, path).map_err(error)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|dir| dir.sync_all())
            .map_err(error)?;
    }
    Ok(())
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
        let mut registrar = Registrar::recover(Some(dir.path()))?;
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

        let recovered = Registrar::recover(Some(dir.path()))?;
        assert_eq!(recovered.known("c"), Some(&record("c")));
        assert_eq!(recovered.known("a"), None);
        assert!(recovered.removed.contains_key("a"));
        Ok(())
    }

    #[test]
    fn corrupt_registry_is_an_error() -> Result<(), std::io::Error> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join(FILE_NAME), b"not json")?;
        assert!(matches!(
            Registrar::recover(Some(dir.path())),
            Err(RegistrarError::Parse { .. })
        ));
        Ok(())
    }
}
