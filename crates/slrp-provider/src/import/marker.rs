//! The `mesos_import` record: what an import took over, kept in the provider's store.
//!
//! Written in the import's one transaction, it says which Mesos checkpoints slrp owns
//! from then on. [`crate::workdir::check_work_dir`] lets those files be (a Mesos work
//! directory is otherwise refused); a second import of the same, unchanged checkpoints
//! is a no-op; an import of checkpoints that changed since (a Mesos provider ran again)
//! is refused. `slrp inspect` shows it like every record.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use slrp_store::{Kind, Record};

/// Record kind of import markers.
pub const MESOS_IMPORT: Kind = Kind::new("mesos_import");

/// One Mesos file as it was read: where, how long, its SHA-256.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileDigest {
    /// The file, relative to the Mesos work directory.
    pub path: PathBuf,
    /// Its size in bytes.
    pub size: u64,
    /// SHA-256 of its bytes, lowercase hex.
    pub sha256: String,
}

impl FileDigest {
    /// The digest of `bytes` read from `path` (relative to the work directory).
    pub fn of(path: PathBuf, bytes: &[u8]) -> Self {
        Self {
            path,
            size: bytes.len() as u64,
            sha256: sha256_hex(bytes),
        }
    }

    /// Whether the file under `work_dir` still holds the bytes this digest was made of
    /// (`false` for a file that is gone or cannot be read).
    pub fn matches(&self, work_dir: &Path) -> bool {
        std::fs::read(work_dir.join(&self.path))
            .is_ok_and(|bytes| bytes.len() as u64 == self.size && sha256_hex(&bytes) == self.sha256)
    }
}

/// SHA-256 of `bytes` as lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// One imported `volume.state`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportedVolumeFile {
    /// The volume id.
    pub id: String,
    /// The volume's directory name under `csi/<type>/<name>/volumes/` (the encoded id).
    pub dir: String,
    /// The file as read.
    pub file: FileDigest,
}

/// The marker of one import (kind `mesos_import`, key: the Mesos agent id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MesosImport {
    /// The Mesos agent id the provider's identity was under (also the key).
    pub agent_id: String,
    /// `<rp type>.<rp name>`.
    pub provider: String,
    /// The CSI plugin `<type>/<name>` whose volumes were imported.
    pub plugin: String,
    /// The Mesos work directory as given to the import.
    pub source_work_dir: PathBuf,
    /// The provider id Mesos had assigned, if the provider had an identity.
    pub provider_id: Option<String>,
    /// The provider's `latest` symlink, relative to the work directory, if there was one.
    pub latest: Option<PathBuf>,
    /// `resource_provider.state`, if there was one.
    pub rp_state: Option<FileDigest>,
    /// Every imported `volume.state`.
    pub volumes: Vec<ImportedVolumeFile>,
    /// Every status stream (`operation.updates`) read.
    pub streams: Vec<FileDigest>,
    /// The operations imported (uuids).
    pub operations: Vec<String>,
    /// What was left out and why, one line each.
    pub skipped: Vec<String>,
    /// Whether `--lenient` was given.
    pub lenient: bool,
    /// When, RFC 3339 (UTC, seconds).
    pub imported_at: String,
    /// The slrp version that imported.
    pub slrp_version: String,
}

impl Record for MesosImport {
    const KIND: Kind = MESOS_IMPORT;

    fn key(&self) -> String {
        self.agent_id.clone()
    }
}

impl MesosImport {
    /// Whether `other` was made of the same Mesos checkpoints (same agent, provider,
    /// files and digests): importing it again would change nothing.
    pub fn same_source(&self, other: &MesosImport) -> bool {
        self.agent_id == other.agent_id
            && self.provider == other.provider
            && self.plugin == other.plugin
            && self.provider_id == other.provider_id
            && self.latest == other.latest
            && self.rp_state == other.rp_state
            && self.volumes == other.volumes
            && self.streams == other.streams
    }

    /// The imported `volume.state` whose volume directory is named `dir`, if any.
    pub fn volume_by_dir(&self, dir: &str) -> Option<&ImportedVolumeFile> {
        self.volumes.iter().find(|v| v.dir == dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_of_known_input() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
