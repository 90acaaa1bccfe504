//! Runtime records of surviving containers: `<containers_dir>/.slrp-runtime/<id>.json`,
//! written when a container is launched and removed when it terminates, read at spawn.
//!
//! A container ID cannot contain `.` (Mesos's rule), so the directory never collides with
//! a sandbox, and `<id>.json` never leaves it (IDs are validated before they get here).
//! Like an agent's runtime directory (usually on tmpfs) the records are not fsync'ed: a
//! host crash kills the containers too, and the boot id then says they are gone. They are
//! written 0600: a launch's environment may hold SECRET values.

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
    // The launch may carry SECRET values of its command's environment: readable by the
    // owner only, from the first byte (created with the mode, not chmod'ed after). Not
    // fsync'ed (see the module docs); `<id>.json.tmp` leftovers are skipped by `read_all`.
    slrp_types::AtomicWrite::new()
        .mode(0o600)
        .durable(false)
        .write(&path, &bytes)
        .map_err(|e| error(e.into()))
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

/// SIGKILLs the group of every container recorded under `containers_dir` whose process
/// still runs (best effort, synchronous: usable where nothing can be awaited).
pub(crate) fn kill_recorded(containers_dir: &Path) {
    let Ok(records) = read_all(containers_dir) else {
        return;
    };
    for record in records {
        // The start time in the check guards against a recycled pid.
        if super::process::is_alive(record.process) {
            super::process::kill_group(record.process.pid);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use slrp_proto::mesos::v1 as mesos;

    use super::*;

    /// A record holds the launch as given, SECRET values included: only its owner may
    /// read it, whatever the umask.
    #[test]
    fn records_are_readable_by_their_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let launch = LaunchContainer {
            container_id: mesos::ContainerId {
                value: "c".into(),
                parent: None,
            },
            ..Default::default()
        };
        let process = ProcessId {
            pid: 1,
            start_time: 0,
        };
        // A leftover of a write that did not finish, world-readable.
        let record = path(dir.path(), "c");
        std::fs::create_dir_all(record.parent().unwrap()).unwrap();
        std::fs::write(record.with_extension("json.tmp"), b"{}").unwrap();
        write(dir.path(), "c", process, None, &launch).unwrap();
        let mode = std::fs::metadata(&record).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
        let read = read_all(dir.path()).unwrap();
        assert_eq!(read.len(), 1);
        assert_eq!(read[0].launch, launch);
    }
}
