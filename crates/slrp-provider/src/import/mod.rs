//! `slrp import-mesos`: taking over a Mesos storage local resource provider's
//! checkpoints (spec §8) so that slrp keeps every volume, mount, pending operation and
//! unacknowledged status of it.
//!
//! [`plan`] reads one provider's checkpoints under a Mesos agent's work directory as
//! Mesos's own recovery would (its identity, `resource_provider.state`, every operation's
//! status stream, every `volume.state` of its plugin), maps them to slrp's records and
//! collects **every** reason to refuse, each naming its file. [`ImportPlan::commit`]
//! writes all records and the [`MesosImport`] marker in **one** store transaction:
//! nothing is ever half-imported, and Mesos's files are never modified. The marker lifts
//! `slrp run`'s refusal of the work directory ([`crate::workdir`]) for what it names.
//!
//! Strictness: by default (strict) a status stream with a torn or unparseable record is
//! refused; `lenient` keeps every record before the first bad one and lists what it
//! dropped, as a Mesos agent started with `--strict=false` does. This is stricter than
//! Mesos, which drops a torn last record silently even with `--strict`.
//!
//! See `docs/migrating-from-mesos.md`.

mod map;
pub mod marker;
mod mesos;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use slrp_core::provider::operations::{
    OperationRecord, TrackedOperation, is_terminal_state, stage_operation,
};
use slrp_core::provider::resources::{DisplayResource, Resources, is_storage_pool};
use slrp_core::provider::state::{
    ProviderRecord, ProviderResourceRecord, ProviderState, StateError,
};
use slrp_core::volume::{
    BootId, CreateVolume, MountPaths, MountTable, ProcMountTable, VolumeRecord, read_boot_id,
};
use slrp_proto::mesos::v1::{OperationState, ResourceProviderId};
use slrp_store::{Record, Store, StoreError, Transaction};
use slrp_types::ProfileInfo;

use crate::config::ProviderConfig;

pub use marker::{FileDigest, ImportedVolumeFile, MESOS_IMPORT, MesosImport};

/// How to import.
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// The agent id the import must be for (`--agent-id`, or what the agent's GET_AGENT
    /// answered). `None`: the work directory's `meta/slaves/latest` decides.
    pub agent_id: Option<String>,
    /// Keep the records of a status stream before its first torn or unparseable record
    /// (what Mesos does) instead of refusing the import.
    pub lenient: bool,
    /// The host's boot id; `None` reads it (tests pass one).
    pub current_boot: Option<BootId>,
    /// The mount table the report's "mounted now" comes from; `None`: the real one.
    pub mounts: Option<Arc<dyn MountTable>>,
}

/// A reason the import cannot be done: the file and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Refusal {
    /// The file (or directory) at fault.
    pub path: PathBuf,
    /// What is wrong, in Mesos's words where Mesos has them.
    pub reason: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.reason)
    }
}

/// Something the import leaves out, as Mesos's recovery would.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skipped {
    /// The file or directory.
    pub path: PathBuf,
    /// Why it is left out.
    pub reason: String,
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.reason)
    }
}

/// One volume the import takes over.
#[derive(Debug, Clone)]
pub struct PlannedVolume {
    /// The record written.
    pub record: VolumeRecord,
    /// Its `volume.state`.
    pub file: PathBuf,
    /// Mesos's state name.
    pub mesos_state: String,
    /// Mount points under the volume's mount directory now.
    pub mounted: Vec<PathBuf>,
    /// What the report says about the mapping.
    pub notes: Vec<String>,
}

/// One operation the import takes over.
#[derive(Debug, Clone)]
pub struct PlannedOperation {
    /// The operation and its stream.
    pub op: TrackedOperation,
    /// Its `operation.updates`, if it had one.
    pub stream_file: Option<PathBuf>,
    /// What lenient mode dropped or let pass in its stream.
    pub notes: Vec<String>,
}

/// Everything one provider's import will write, checked and ready to commit.
#[derive(Debug, Clone)]
pub struct ImportPlan {
    provider: String,
    agent_id: String,
    state: Option<ProviderState>,
    volumes: Vec<PlannedVolume>,
    operations: Vec<PlannedOperation>,
    skipped: Vec<Skipped>,
    boot: BootReport,
    marker: MesosImport,
}

/// Which boot ids the import used (NODE_STAGE has none in Mesos's records).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BootReport {
    /// `meta/boot_id`: the boot of the agent's last start, if recorded.
    pub agent_boot_id: Option<String>,
    /// The host's boot id now.
    pub current_boot_id: String,
    /// What a NODE_STAGE volume gets: `agent_boot_id`, else `current_boot_id`.
    pub node_stage_boot_id: String,
}

/// Reads and checks one provider's Mesos checkpoints under `work_dir` and builds what the
/// import writes. `provider` must be validated (as `slrp run` loads it).
///
/// # Errors
/// Every refusal found, each naming its file and reason (never only the first).
pub fn plan(
    work_dir: &Path,
    provider: &ProviderConfig,
    opts: &ImportOptions,
) -> Result<ImportPlan, Vec<Refusal>> {
    let mut c = mesos::Collect::new(work_dir, opts.lenient);
    let current_boot = match &opts.current_boot {
        Some(b) => Some(b.clone()),
        None => match read_boot_id() {
            Ok(b) => Some(b),
            Err(e) => {
                c.refuse(
                    Path::new(slrp_types::BOOT_ID_PATH),
                    format!("the host's boot id cannot be read: {e}"),
                );
                None
            }
        },
    };
    let agent = mesos::read_agent(&mut c, opts.agent_id.as_deref());
    let info = &provider.info;
    let read = agent
        .as_ref()
        .and_then(|a| mesos::read_provider(&mut c, &a.id, &info.r#type, &info.name));
    let (plugin_type, plugin_name) = provider.plugin();
    let volume_files = mesos::read_volumes(&mut c, &plugin_type, &plugin_name);
    let (Some(agent), Some(current_boot)) = (agent, current_boot) else {
        return Err(c.refusals);
    };

    // The provider state (B.5 item 1).
    let mut state = None;
    let mut operations_in_state = Vec::new();
    if let Some(read) = &read {
        let rp_state = read.state.clone().unwrap_or_default();
        let profiles: BTreeMap<String, ProfileInfo> = rp_state
            .storage
            .iter()
            .flat_map(|s| &s.profiles)
            .map(|(name, p)| {
                (
                    name.clone(),
                    ProfileInfo {
                        capability: p.capability.clone(),
                        parameters: p
                            .parameters
                            .iter()
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect(),
                    },
                )
            })
            .collect();
        let mut total = Resources::new();
        for resource in &rp_state.resources {
            let owner = resource.provider_id.as_ref().map(|p| p.value.as_str());
            if owner != Some(read.rp_id.as_str()) {
                c.refuse(
                    &read.state_path,
                    format!(
                        "resource '{}' belongs to provider {}, not to {}",
                        DisplayResource(resource),
                        owner.unwrap_or("(none)"),
                        read.rp_id
                    ),
                );
            }
            if is_storage_pool(resource)
                && let Some(profile) = resource
                    .disk
                    .as_ref()
                    .and_then(|d| d.source.as_ref())
                    .and_then(|s| s.profile.as_deref())
                && !profiles.contains_key(profile)
            {
                c.refuse(
                    &read.state_path,
                    format!(
                        "Cannot recover profile for storage pool '{}' from '{}'",
                        DisplayResource(resource),
                        read.state_path.display()
                    ),
                );
            }
            total.add(resource);
        }
        state = Some(ProviderState {
            provider_id: Some(ResourceProviderId {
                value: read.rp_id.clone(),
            }),
            total,
            profiles,
        });
        operations_in_state = rp_state.operations;
    }

    // Operations (B.5 items 2-5).
    let mut operations = Vec::new();
    let mut streams = Vec::new();
    if let Some(read) = &read {
        for op in &operations_in_state {
            let Ok(uuid) = uuid::Uuid::from_slice(&op.uuid.value) else {
                c.refuse(&read.state_path, "an operation's uuid is not 16 bytes");
                continue;
            };
            let (file, stream) = match read.streams.get(&uuid) {
                Some((file, stream)) => (Some(file.clone()), stream.clone()),
                None => (None, mesos::StreamRead::default()),
            };
            if let Some(digest) = &stream.digest {
                streams.push(digest.clone());
            }
            if stream.terminated {
                c.skip(
                    file.as_deref().unwrap_or(&read.state_path),
                    format!(
                        "operation {uuid} is terminated (its terminal status was acknowledged): \
                         Mesos forgets it"
                    ),
                );
                continue;
            }
            match map::operation(op, &stream) {
                Ok(op) => operations.push(PlannedOperation {
                    op,
                    stream_file: file,
                    notes: stream.notes.clone(),
                }),
                Err(reason) => c.refuse(&read.state_path, reason),
            }
        }
    }

    // Volumes (B.5 items 6-8, C.5).
    let meta_boot = agent.boot_id.clone().map(BootId::new);
    let total_vec: Vec<_> = state.as_ref().map(|s| s.total.to_vec()).unwrap_or_default();
    let pending_creates = state
        .as_ref()
        .map(|s| map::pending_creates(&operations_in_state, &s.profiles))
        .unwrap_or_default();
    let ctx = map::VolumeCtx {
        lenient: opts.lenient,
        meta_boot: meta_boot.as_ref(),
        current_boot: &current_boot,
        total: &total_vec,
        pending_creates: &pending_creates,
    };
    let mount_paths = mount_paths(work_dir, provider);
    let table: Arc<dyn MountTable> = opts
        .mounts
        .clone()
        .unwrap_or_else(|| Arc::new(ProcMountTable));
    let mut volumes = Vec::new();
    let mut volume_marks = Vec::new();
    for v in &volume_files {
        match map::volume(v, &ctx) {
            Ok(mapped) => {
                let mounted = mount_paths
                    .as_ref()
                    .and_then(|p| p.volume_dir(&mapped.record.id).ok())
                    .and_then(|dir| table.mounts_under(&dir).ok())
                    .unwrap_or_default();
                volume_marks.push(ImportedVolumeFile {
                    id: v.id.clone(),
                    dir: v.dir.clone(),
                    file: v.digest.clone(),
                });
                volumes.push(PlannedVolume {
                    mesos_state: mesos_state_name(v.state.state),
                    record: mapped.record,
                    file: v.path.clone(),
                    mounted,
                    notes: mapped.notes,
                });
            }
            Err(reasons) => {
                for reason in reasons {
                    c.refuse(&v.path, reason);
                }
            }
        }
    }

    // Mesos's own recovery checks of the state as slrp will load it (spec §3.3 step 4).
    if let (Some(read), Some(state)) = (&read, &state)
        && c.refusals.is_empty()
    {
        let checked = state.to_record(&agent.id).and_then(|record| {
            let resources = state.resource_records(&agent.id)?;
            ProviderState::from_records(record, resources, &read.state_path)
        });
        if let Err(e) = checked {
            c.refuse(&read.state_path, slrp_types::DisplayChain(&e).to_string());
        }
    }
    if !c.refusals.is_empty() {
        return Err(c.refusals);
    }

    let boot = BootReport {
        agent_boot_id: agent.boot_id.clone(),
        current_boot_id: current_boot.as_str().to_owned(),
        node_stage_boot_id: meta_boot
            .as_ref()
            .unwrap_or(&current_boot)
            .as_str()
            .to_owned(),
    };
    let mut skipped_lines: Vec<String> = c.skipped.iter().map(ToString::to_string).collect();
    for op in &operations {
        for note in &op.notes {
            skipped_lines.push(format!(
                "{}: {note}",
                op.stream_file
                    .as_deref()
                    .unwrap_or(Path::new("?"))
                    .display()
            ));
        }
    }
    let marker = MesosImport {
        agent_id: agent.id.clone(),
        provider: provider.key(),
        plugin: format!("{plugin_type}/{plugin_name}"),
        source_work_dir: work_dir.to_owned(),
        provider_id: read.as_ref().map(|r| r.rp_id.clone()),
        latest: read.as_ref().map(|r| c.relative(&r.latest)),
        rp_state: read.as_ref().and_then(|r| r.digest.clone()),
        volumes: volume_marks,
        streams,
        operations: operations.iter().map(|o| o.op.uuid.to_string()).collect(),
        skipped: skipped_lines,
        lenient: opts.lenient,
        imported_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        slrp_version: env!("CARGO_PKG_VERSION").to_owned(),
    };
    Ok(ImportPlan {
        provider: provider.key(),
        agent_id: agent.id,
        state,
        volumes,
        operations,
        skipped: c.skipped,
        boot,
        marker,
    })
}

/// Where the provider's volumes are mounted (`target_path_root`, else Mesos's default).
fn mount_paths(work_dir: &Path, provider: &ProviderConfig) -> Option<MountPaths> {
    let plugin = provider.info.storage.as_ref().map(|s| &s.plugin);
    match plugin.and_then(|p| p.target_path_root.as_deref()) {
        Some(root) if !root.is_empty() => Some(MountPaths::new(root)),
        _ => {
            let (t, n) = provider.plugin();
            MountPaths::under_work_dir(work_dir, &t, &n).ok()
        }
    }
}

fn mesos_state_name(state: i32) -> String {
    slrp_proto::mesos::csi::state::volume_state::State::try_from(state)
        .map_or_else(|_| format!("{state}"), |s| s.as_str_name().to_owned())
}

/// What a commit did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Committed {
    /// Every record and the marker were written, in one transaction.
    Imported,
    /// The store already holds this import, of the same unchanged checkpoints: nothing
    /// was written.
    AlreadyImported {
        /// When the earlier import was made.
        imported_at: String,
    },
}

/// Why a commit did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The store is open for writing elsewhere.
    #[error(
        "the state store {path} is in use: `slrp run` (or another import) holds it; stop it \
         and import again"
    )]
    Busy {
        /// The store directory.
        path: PathBuf,
        /// The lock failure.
        #[source]
        source: StoreError,
    },
    /// The store cannot be opened or read.
    #[error("the state store {path} cannot be used")]
    Store {
        /// The store directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: StoreError,
    },
    /// The store already holds other slrp state.
    #[error(
        "the state store {path} already holds slrp state ({found}): an import never merges \
         into existing state; import into an empty state directory"
    )]
    Merge {
        /// The store directory.
        path: PathBuf,
        /// What was found.
        found: String,
    },
    /// The store holds an import of other (changed) checkpoints.
    #[error(
        "the state store {path} already holds an import of agent {agent_id} made at \
         {imported_at}, and the Mesos checkpoints changed since (a Mesos provider ran after \
         it): an import never merges; import into an empty state directory"
    )]
    Changed {
        /// The store directory.
        path: PathBuf,
        /// The agent id.
        agent_id: String,
        /// When the earlier import was made.
        imported_at: String,
    },
    /// A record could not be built.
    #[error("building the records of the import")]
    Build(#[source] StateError),
    /// The transaction failed (nothing of it is in the store).
    #[error("committing the import to {path}")]
    Commit {
        /// The store directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: StoreError,
    },
}

impl ImportError {
    /// A refusal (the store's state or lock), not a failure of the commit itself.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            Self::Busy { .. } | Self::Merge { .. } | Self::Changed { .. }
        )
    }
}

/// Opens the provider's store for the import (blocking), telling a store held by a running
/// `slrp run` apart.
///
/// # Errors
/// [`ImportError::Busy`] when another process holds it; [`ImportError::Store`] otherwise.
pub fn open_store(dir: &Path) -> Result<Store, ImportError> {
    Store::open(dir).map_err(|source| match source {
        StoreError::Locked { .. } => ImportError::Busy {
            path: dir.to_owned(),
            source,
        },
        source => ImportError::Store {
            path: dir.to_owned(),
            source,
        },
    })
}

impl ImportPlan {
    /// `<rp type>.<rp name>`.
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// The Mesos agent id the identity is imported under.
    pub fn agent_id(&self) -> &str {
        &self.agent_id
    }

    /// The provider state (identity, total, profiles), if the provider had an identity.
    pub fn state(&self) -> Option<&ProviderState> {
        self.state.as_ref()
    }

    /// The volumes.
    pub fn volumes(&self) -> &[PlannedVolume] {
        &self.volumes
    }

    /// The operations.
    pub fn operations(&self) -> &[PlannedOperation] {
        &self.operations
    }

    /// What is left out, as Mesos's recovery would.
    pub fn skipped(&self) -> &[Skipped] {
        &self.skipped
    }

    /// The marker the commit writes.
    pub fn marker(&self) -> &MesosImport {
        &self.marker
    }

    /// Whether there is nothing to import (no identity and no volume).
    pub fn is_empty(&self) -> bool {
        self.state.is_none() && self.volumes.is_empty()
    }

    /// What the import takes over, for people ([`fmt::Display`]) and scripts (serde).
    pub fn report(&self) -> ImportReport {
        let mut volumes_by_state = BTreeMap::new();
        for v in &self.volumes {
            *volumes_by_state
                .entry(v.record.state.name().as_str().to_owned())
                .or_insert(0usize) += 1;
        }
        ImportReport {
            provider: self.provider.clone(),
            agent_id: self.agent_id.clone(),
            provider_id: self.marker.provider_id.clone(),
            resources: self.state.as_ref().map_or(0, |s| s.total.len()),
            profiles: self
                .state
                .as_ref()
                .map(|s| s.profiles.keys().cloned().collect())
                .unwrap_or_default(),
            volumes_by_state,
            volumes: self
                .volumes
                .iter()
                .map(|v| VolumeLine {
                    id: v.record.id.as_str().to_owned(),
                    mesos_state: v.mesos_state.clone(),
                    state: v.record.state.name().as_str().to_owned(),
                    boot_id: v.record.state.boot_id().map(|b| b.as_str().to_owned()),
                    capacity_bytes: v.record.capacity_bytes,
                    name: v.record.name.clone(),
                    node_publish_required: v.record.node_publish_required,
                    mounted: v.mounted.clone(),
                    notes: v.notes.clone(),
                })
                .collect(),
            operations: self
                .operations
                .iter()
                .map(|o| {
                    let op = &o.op;
                    OperationLine {
                        uuid: op.uuid.to_string(),
                        r#type: op
                            .info
                            .r#type
                            .and_then(|t| {
                                slrp_proto::mesos::v1::offer::operation::Type::try_from(t).ok()
                            })
                            .map_or_else(|| "UNKNOWN".to_owned(), |t| t.as_str_name().to_owned()),
                        state: OperationState::try_from(op.latest_status.state)
                            .map_or_else(|_| "UNKNOWN".to_owned(), |s| s.as_str_name().to_owned()),
                        pending: op.latest_status.state == OperationState::OperationPending as i32,
                        terminal: is_terminal_state(op.latest_status.state),
                        unacknowledged: op.stream.len().saturating_sub(op.acked),
                        notes: o.notes.clone(),
                    }
                })
                .collect(),
            skipped: self.skipped.iter().map(ToString::to_string).collect(),
            boot: self.boot.clone(),
        }
    }

    /// Writes every record and the marker in one transaction (or nothing).
    ///
    /// # Errors
    /// [`ImportError::Merge`] if the store holds other slrp state (volumes, this agent's
    /// provider records, operations or CreateVolume intents), [`ImportError::Changed`] if it
    /// holds an import of changed checkpoints, [`ImportError::Store`] when it cannot be
    /// read, [`ImportError::Build`], [`ImportError::Commit`].
    pub async fn commit(&self, store: &Store) -> Result<Committed, ImportError> {
        let path = store.path().to_owned();
        let read_err = |source| ImportError::Store {
            path: path.clone(),
            source,
        };
        let agent = self.agent_id.as_str();
        if let Some(earlier) = store.get::<MesosImport>(agent).await.map_err(read_err)? {
            if earlier.same_source(&self.marker) {
                return Ok(Committed::AlreadyImported {
                    imported_at: earlier.imported_at,
                });
            }
            return Err(ImportError::Changed {
                path,
                agent_id: agent.to_owned(),
                imported_at: earlier.imported_at,
            });
        }
        let prefix = format!("{agent}/");
        let mut found = Vec::new();
        let count = |n: usize, what: &str| (n > 0).then(|| format!("{n} {what}"));
        found.extend(count(
            store
                .load_all::<VolumeRecord>()
                .await
                .map_err(read_err)?
                .len(),
            "volume records",
        ));
        found.extend(count(
            store
                .load_all::<CreateVolume>()
                .await
                .map_err(read_err)?
                .len(),
            "CreateVolume intents",
        ));
        found.extend(count(
            usize::from(
                store
                    .get::<ProviderRecord>(agent)
                    .await
                    .map_err(read_err)?
                    .is_some(),
            ),
            &format!("provider record of agent {agent}"),
        ));
        found.extend(count(
            store
                .load_prefix::<ProviderResourceRecord>(&prefix)
                .await
                .map_err(read_err)?
                .len(),
            &format!("resource records of agent {agent}"),
        ));
        found.extend(count(
            store
                .load_prefix::<OperationRecord>(&prefix)
                .await
                .map_err(read_err)?
                .len(),
            &format!("operation records of agent {agent}"),
        ));
        if !found.is_empty() {
            return Err(ImportError::Merge {
                path,
                found: found.join(", "),
            });
        }
        let mut txn = store.transaction();
        for v in &self.volumes {
            put(&mut txn, &v.record)?;
        }
        if let Some(state) = &self.state {
            state
                .stage(txn.changes(), agent, None)
                .map_err(ImportError::Build)?;
        }
        for op in &self.operations {
            stage_operation(txn.changes(), agent, &op.op).map_err(ImportError::Build)?;
        }
        put(&mut txn, &self.marker)?;
        txn.commit()
            .await
            .map_err(|source| ImportError::Commit { path, source })?;
        Ok(Committed::Imported)
    }
}

fn put<R: Record>(txn: &mut Transaction, record: &R) -> Result<(), ImportError> {
    txn.put(record).map_err(|source| {
        ImportError::Build(StateError::Stage {
            key: record.key(),
            source,
        })
    })?;
    Ok(())
}

/// The report of a plan (what `--dry-run` prints, `--json` as JSON).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ImportReport {
    /// `<rp type>.<rp name>`.
    pub provider: String,
    /// The Mesos agent id.
    pub agent_id: String,
    /// The provider id, if the provider had an identity.
    pub provider_id: Option<String>,
    /// Resources in the total.
    pub resources: usize,
    /// Profiles of the storage pools.
    pub profiles: Vec<String>,
    /// Volumes by slrp state.
    pub volumes_by_state: BTreeMap<String, usize>,
    /// Every volume.
    pub volumes: Vec<VolumeLine>,
    /// Every operation.
    pub operations: Vec<OperationLine>,
    /// What is left out and why.
    pub skipped: Vec<String>,
    /// The boot ids used.
    pub boot: BootReport,
}

/// One volume of a report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VolumeLine {
    /// The volume id.
    pub id: String,
    /// Mesos's state.
    pub mesos_state: String,
    /// slrp's state.
    pub state: String,
    /// The boot the staging is recorded in.
    pub boot_id: Option<String>,
    /// Capacity (from the provider's total).
    pub capacity_bytes: i64,
    /// The CreateVolume name, if known.
    pub name: Option<String>,
    /// Republished at every start.
    pub node_publish_required: bool,
    /// Mount points under the volume's directory now.
    pub mounted: Vec<PathBuf>,
    /// Notes on the mapping.
    pub notes: Vec<String>,
}

/// One operation of a report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OperationLine {
    /// The operation uuid.
    pub uuid: String,
    /// `CREATE_DISK`, …
    pub r#type: String,
    /// The latest state.
    pub state: String,
    /// Still to be applied (slrp replays it).
    pub pending: bool,
    /// The latest state is terminal.
    pub terminal: bool,
    /// Status updates still to be delivered and acknowledged.
    pub unacknowledged: usize,
    /// What lenient mode dropped or let pass in its stream.
    pub notes: Vec<String>,
}

impl fmt::Display for ImportReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "provider {}", self.provider)?;
        writeln!(f, "  agent id:     {}", self.agent_id)?;
        writeln!(
            f,
            "  provider id:  {}",
            self.provider_id
                .as_deref()
                .unwrap_or("(none: a new provider)")
        )?;
        writeln!(
            f,
            "  resources:    {} (profiles: {})",
            self.resources,
            if self.profiles.is_empty() {
                "none".to_owned()
            } else {
                self.profiles.join(", ")
            }
        )?;
        writeln!(
            f,
            "  boot ids:     agent's last start {}, now {}; NODE_STAGE volumes get {}",
            self.boot.agent_boot_id.as_deref().unwrap_or("(unknown)"),
            self.boot.current_boot_id,
            self.boot.node_stage_boot_id
        )?;
        let by_state: Vec<String> = self
            .volumes_by_state
            .iter()
            .map(|(s, n)| format!("{n} {s}"))
            .collect();
        writeln!(
            f,
            "  volumes:      {}{}",
            self.volumes.len(),
            if by_state.is_empty() {
                String::new()
            } else {
                format!(" ({})", by_state.join(", "))
            }
        )?;
        for v in &self.volumes {
            write!(f, "    {} {}", v.id, v.mesos_state)?;
            if v.mesos_state != v.state {
                write!(f, " -> {}", v.state)?;
            }
            write!(f, ", {} bytes", v.capacity_bytes)?;
            if v.mounted.is_empty() {
                write!(f, ", not mounted")?;
            } else {
                let points: Vec<String> =
                    v.mounted.iter().map(|p| p.display().to_string()).collect();
                write!(f, ", mounted at {}", points.join(", "))?;
            }
            writeln!(f)?;
            for note in &v.notes {
                writeln!(f, "      {note}")?;
            }
        }
        writeln!(f, "  operations:   {}", self.operations.len())?;
        for o in &self.operations {
            writeln!(
                f,
                "    {} {} {}{}, {} unacknowledged status update(s)",
                o.uuid,
                o.r#type,
                o.state,
                if o.pending { " (replayed)" } else { "" },
                o.unacknowledged
            )?;
            for note in &o.notes {
                writeln!(f, "      {note}")?;
            }
        }
        writeln!(f, "  skipped:      {}", self.skipped.len())?;
        for s in &self.skipped {
            writeln!(f, "    {s}")?;
        }
        Ok(())
    }
}
