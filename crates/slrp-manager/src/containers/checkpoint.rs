//! Runtime records of surviving containers: `<containers_dir>/.slrp-runtime/<id>.json`,
//! written when a container is launched and removed when it terminates, read at spawn.
//!
//! A container ID cannot contain `.` (Mesos's rule), so the directory never collides with
//! a sandbox, and `<id>.json` never leaves it (IDs are validated before they get here).
//! Like an agent's runtime directory (usually on tmpfs) the records are not fsync'ed: a
//! host crash kills the containers too, and the boot id then says they are gone.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use slrp_proto::mesos::v1::agent::call::LaunchContainer;

use super::process::ProcessId;
use crate::error::ContainerError;

const DIR: &str = ".slrp-runtime";
const VERSION: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
struct File {
    version: u32,
    process: ProcessId,
    boot_id: Option<String>,
    /// The LAUNCH_CONTAINER payload, in Mesos's JSON.
    launch: serde_json::Value,
}

/// One recovered record.
#[derive(Debug)]
pub(crate) struct Record {
    pub(crate) process: ProcessId,
    pub(crate) boot_id: Option<String>,
    pub(crate) launch: LaunchContainer,
    pub(crate) path: PathBuf,
}

pub(crate) fn path(containers_dir: &Path, id: &str) -> PathBuf {
    containers_dir.join(DIR).join(format!("{id}.json"))
}

pub(crate) fn write(
    containers_dir: &Path,
    id: &str,
    process: ProcessId,
    boot_id: Option<String>,
    launch: &LaunchContainer,
) -> Result<(), ContainerError> {
    let path = path(containers_dir, id);
    let error = |source| ContainerError::Checkpoint {
        path: path.clone(),
        source,
    };
    let launch = slrp_wire::json::to_value(launch)
        .map_err(std::io::Error::other)
        .map_err(error)?;
    let file = File {
        version: VERSION,
        process,
        boot_id,
        launch,
    };
    let bytes = serde_json::to_vec_pretty(&file)
        .map_err(std::io::Error::other)
        .map_err(error)?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(error)?;
    }
    let temp = path.with_extension("json.tmp");
    std::fs::write(&temp, bytes).map_err(error)?;
    std::fs::rename(&temp, &path).map_err(error)
}

pub(crate) fn remove(path: &Path) {
    if let Err(error) = std::fs::remove_file(path)
        && error.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), error = %error, "removing a container record");
    }
}

/// Every record under `containers_dir` (none if the directory does not exist).
pub(crate) fn read_all(containers_dir: &Path) -> Result<Vec<Record>, ContainerError> {
    let dir = containers_dir.join(DIR);
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(ContainerError::Recover { path: dir, source }),
    };
    let mut records = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| ContainerError::Recover {
            path: dir.clone(),
            source,
        })?;
        let path = entry.path();
        if path.extension().is_none_or(|ext| ext != "json") {
            // A temporary file of a write that did not finish: the launch did not answer.
            continue;
        }
        let error = |source| ContainerError::Recover {
            path: path.clone(),
            source,
        };
        let bytes = std::fs::read(&path).map_err(error)?;
        let file: File = serde_json::from_slice(&bytes)
            .map_err(std::io::Error::other)
            .map_err(error)?;
        if file.version != VERSION {
            return Err(error(std::io::Error::other(format!(
                "unknown record version {}",
                file.version
            ))));
        }
        let launch = slrp_wire::json::from_value(file.launch)
            .map_err(std::io::Error::other)
            .map_err(error)?;
        records.push(Record {
            process: file.process,
            boot_id: file.boot_id,
            launch,
            path,
        });
    }
    Ok(records)
}
