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

use std::path::{Path, PathBuf};

use slrp_proto::mesos::v1::ResourceProviderInfo;

/// The work directory holds a Mesos SLRP's checkpoints for this provider or plugin.
#[derive(Debug, thiserror::Error)]
pub enum WorkDirError {
    /// A Mesos checkpoint was found.
    #[error(
        "{found} is a Mesos storage local resource provider checkpoint for {what}: slrp would treat \
         the volumes of that provider as untracked mounts and unmount them under running tasks; \
         stop the Mesos provider and take its volumes over with `slrp import-mesos` instead \
         (not in this release yet: until then, keep the Mesos provider for this plugin)"
    )]
    MesosCheckpoint {
        /// The checkpoint found.
        found: PathBuf,
        /// `provider <type>.<name>` or `plugin <type>/<name>`.
        what: String,
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
/// agent id) or for its plugin. `info` must be validated (its type and names are single
/// path components).
///
/// # Errors
/// [`WorkDirError::MesosCheckpoint`] naming the first checkpoint found, or
/// [`WorkDirError::Read`] when a directory on the way cannot be read.
pub fn check_work_dir(work_dir: &Path, info: &ResourceProviderInfo) -> Result<(), WorkDirError> {
    let mut agents = entries(&work_dir.join("meta").join("slaves"))?;
    agents.sort();
    for agent in agents {
        let latest = agent
            .join("resource_providers")
            .join(&info.r#type)
            .join(&info.name)
            .join("latest");
        if exists(&latest) {
            return Err(WorkDirError::MesosCheckpoint {
                found: latest,
                what: format!("provider {}.{}", info.r#type, info.name),
            });
        }
    }
    let plugin = info.storage.as_ref().map(|s| &s.plugin);
    let plugin_type = plugin.map(|p| p.r#type.as_str()).unwrap_or_default();
    let plugin_name = plugin.and_then(|p| p.name.as_deref()).unwrap_or("default");
    let volumes = work_dir
        .join("csi")
        .join(plugin_type)
        .join(plugin_name)
        .join("volumes");
    let mut volumes = entries(&volumes)?;
    volumes.sort();
    for volume in volumes {
        let state = volume.join("volume.state");
        if exists(&state) {
            return Err(WorkDirError::MesosCheckpoint {
                found: state,
                what: format!("plugin {plugin_type}/{plugin_name}"),
            });
        }
    }
    Ok(())
}
