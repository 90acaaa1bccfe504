//! The refusal to start on a work directory that holds a Mesos SLRP's checkpoints.
//!
//! slrp mounts its volumes under `<work dir>/csi/<plugin type>/<plugin name>/mounts/`, the
//! directory a Mesos agent resolves MOUNT disks against (spec §6.8). A Mesos SLRP uses the
//! same tree and keeps its checkpoints beside it (spec §8.2):
//!
//! - `<work dir>/meta/slaves/<agent id>/resource_providers/<rp type>/<rp name>/latest`, the
//!   provider's identity;
//! - `<work dir>/csi/<plugin type>/<plugin name>/volumes/<volume>/volume.state`, one per
//!   volume.
//!
//! slrp's store knows nothing of those volumes, so its recovery would take their mounts for
//! untracked ones and unmount them, under the tasks using them. [`check_work_dir`] finds
//! either kind of checkpoint for the provider or plugin about to start and refuses, pointing
//! to `slrp import-mesos`, which takes the volumes over. slrp's own `mounts/` directory is
//! not a reason to refuse: it is there on every restart of slrp.
//!
//! After an import, the provider's store holds a [`MesosImport`] marker naming what was
//! taken over: the `latest` of its agent id and the `volume.state` files it read no longer
//! refuse, as long as they are byte for byte what was imported (slrp never writes them; a
//! changed one means a Mesos provider ran again). Any other checkpoint (a volume created by
//! a Mesos provider after the import, a provider under another agent id) still refuses.

use std::path::{Path, PathBuf};

use slrp_proto::mesos::v1::ResourceProviderInfo;
use slrp_types::ProviderKey;

use crate::import::MesosImport;

/// The work directory holds a Mesos SLRP's checkpoints for this provider or plugin.
#[derive(Debug, thiserror::Error)]
pub enum WorkDirError {
    /// A Mesos checkpoint was found.
    #[error(
        "{found} is a Mesos storage local resource provider checkpoint for {what}: slrp would treat \
         the volumes of that provider as untracked mounts and unmount them under running tasks; \
         stop the Mesos provider and take its volumes over with `slrp import-mesos` first (see \
         docs/migrating-from-mesos.md)"
    )]
    MesosCheckpoint {
        /// The checkpoint found.
        found: PathBuf,
        /// `provider <type>.<name>` or `plugin <type>/<name>`.
        what: String,
    },
    /// A checkpoint an import took over has changed since.
    #[error(
        "{found} changed since `slrp import-mesos` took it over for {what} at {imported_at}: a \
         Mesos provider ran again on this work directory, and slrp and Mesos would both manage \
         its volumes; stop the Mesos provider and import into an empty state directory"
    )]
    ChangedSinceImport {
        /// The checkpoint.
        found: PathBuf,
        /// `provider <type>.<name>` or `plugin <type>/<name>`.
        what: String,
        /// When the import was made.
        imported_at: String,
    },
    /// A directory that must be searched cannot be read.
    #[error("reading {path} while looking for Mesos checkpoints")]
    Read {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Entries of `dir`; a missing directory has none.
fn entries(dir: &Path) -> Result<Vec<PathBuf>, WorkDirError> {
    match std::fs::read_dir(dir) {
        Ok(iter) => iter
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| WorkDirError::Read {
                path: dir.to_owned(),
                source,
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(source) => Err(WorkDirError::Read {
            path: dir.to_owned(),
            source,
        }),
    }
}

/// Whether `path` exists as anything, a dangling symlink included (`latest` is a symlink).
fn exists(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

/// Refuses a work directory holding a Mesos SLRP's checkpoints for `info`'s provider (any
/// agent id) or for its plugin, except those `imported` (the markers of the provider's
/// store) names and that are unchanged since. `info` must be validated (its type and names
/// are single path components).
///
/// # Errors
/// [`WorkDirError::MesosCheckpoint`] naming the first checkpoint found that no import took
/// over, [`WorkDirError::ChangedSinceImport`] for one that changed since its import, or
/// [`WorkDirError::Read`] when a directory on the way cannot be read.
pub fn check_work_dir(
    work_dir: &Path,
    info: &ResourceProviderInfo,
    imported: &[MesosImport],
) -> Result<(), WorkDirError> {
    let key = ProviderKey::from(info).to_string();
    let provider_what = || format!("provider {key}");
    let slaves = work_dir.join("meta").join("slaves");
    let mut agents = entries(&slaves)?;
    agents.sort();
    for agent in agents {
        // `meta/slaves/latest` names one of the agent directories listed beside it.
        if agent.file_name().is_some_and(|n| n == "latest") && agent.is_symlink() {
            continue;
        }
        let latest = agent
            .join("resource_providers")
            .join(&info.r#type)
            .join(&info.name)
            .join("latest");
        if !exists(&latest) {
            continue;
        }
        let agent_id = agent
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let Some(import) = imported
            .iter()
            .find(|m| m.agent_id == agent_id && m.provider == key)
        else {
            return Err(WorkDirError::MesosCheckpoint {
                found: latest,
                what: provider_what(),
            });
        };
        let resolved = std::fs::canonicalize(&latest)
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
        let changed = match (&import.provider_id, &import.rp_state) {
            (Some(id), _) if resolved.as_ref() != Some(id) => Some(latest.clone()),
            (_, Some(digest)) if !digest.matches(work_dir) => Some(work_dir.join(&digest.path)),
            _ => None,
        };
        if let Some(found) = changed {
            return Err(WorkDirError::ChangedSinceImport {
                found,
                what: provider_what(),
                imported_at: import.imported_at.clone(),
            });
        }
    }
    let plugin = info.storage.as_ref().map(|s| &s.plugin);
    let plugin_type = plugin.map(|p| p.r#type.as_str()).unwrap_or_default();
    let plugin_name = plugin.and_then(|p| p.name.as_deref()).unwrap_or("default");
    let plugin_what = || format!("plugin {plugin_type}/{plugin_name}");
    let plugin_key = format!("{plugin_type}/{plugin_name}");
    let volumes = work_dir
        .join("csi")
        .join(plugin_type)
        .join(plugin_name)
        .join("volumes");
    let mut volumes = entries(&volumes)?;
    volumes.sort();
    for volume in volumes {
        let state = volume.join("volume.state");
        // Mesos ignores an empty one (an interrupted first checkpoint), and so does slrp.
        if !exists(&state) || std::fs::metadata(&state).is_ok_and(|m| m.len() == 0) {
            continue;
        }
        let dir = volume
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let Some((import, file)) = imported
            .iter()
            .filter(|m| m.plugin == plugin_key)
            .find_map(|m| m.volume_by_dir(&dir).map(|v| (m, v)))
        else {
            return Err(WorkDirError::MesosCheckpoint {
                found: state,
                what: plugin_what(),
            });
        };
        if !file.file.matches(work_dir) {
            return Err(WorkDirError::ChangedSinceImport {
                found: state,
                what: plugin_what(),
                imported_at: import.imported_at.clone(),
            });
        }
    }
    Ok(())
}
