//! What the volume manager reads from the host: the boot id, the mount table, secrets.
//! Each is injectable, so tests can simulate a reboot or a plugin that mounts nothing.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use super::state::{BootId, SecretRef};

/// Where the kernel publishes the id of the current boot.
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// Reads the current boot id.
///
/// # Errors
/// When the file cannot be read or is empty.
pub fn read_boot_id() -> std::io::Result<BootId> {
    let text = std::fs::read_to_string(BOOT_ID_PATH)?;
    let id = text.trim();
    if id.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "boot id is empty",
        ));
    }
    Ok(BootId::new(id))
}

/// The mount table, as far as recovery needs it.
pub trait MountTable: Send + Sync + fmt::Debug + 'static {
    /// Every mount point at or below `dir`.
    ///
    /// # Errors
    /// When the table cannot be read; callers then treat everything as possibly mounted.
    fn mounts_under(&self, dir: &Path) -> std::io::Result<Vec<PathBuf>>;
}

/// The real mount table: `/proc/self/mountinfo`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcMountTable;

impl MountTable for ProcMountTable {
    fn mounts_under(&self, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
        let infos = procfs::process::Process::myself()
            .and_then(|p| p.mountinfo())
            .map_err(std::io::Error::other)?;
        Ok(infos
            .into_iter()
            .map(|m| m.mount_point)
            .filter(|p| p.starts_with(dir))
            .collect())
    }
}

/// Turns secret references into values when a request is built. Values are never
/// stored or logged.
pub trait SecretResolver: Send + Sync + fmt::Debug + 'static {
    /// The value of `r`, or `None` if unknown.
    fn resolve(&self, r: &SecretRef) -> Option<String>;
}

/// A resolver that knows no secrets: a volume that references one fails to stage or
/// publish with a clear error instead of being sent without it.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoSecrets;

impl SecretResolver for NoSecrets {
    fn resolve(&self, _: &SecretRef) -> Option<String> {
        None
    }
}

/// Secrets held in memory (from configuration), keyed by name and key.
#[derive(Clone, Default)]
pub struct StaticSecrets(BTreeMap<(String, String), String>);

impl StaticSecrets {
    /// Adds secret `name`'s `key` with `value`.
    #[must_use]
    pub fn with(mut self, name: &str, key: &str, value: &str) -> Self {
        self.0
            .insert((name.to_owned(), key.to_owned()), value.to_owned());
        self
    }
}

impl fmt::Debug for StaticSecrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Names are not secret; values are.
        f.debug_list()
            .entries(self.0.keys().map(|(n, k)| format!("{n}/{k}")))
            .finish()
    }
}

impl SecretResolver for StaticSecrets {
    fn resolve(&self, r: &SecretRef) -> Option<String> {
        self.0.get(&(r.name.clone(), r.key.clone())).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_secrets_resolve_and_never_show_values() {
        let s = StaticSecrets::default().with("db", "password", "hunter2");
        let r = SecretRef {
            name: "db".into(),
            key: "password".into(),
        };
        assert_eq!(s.resolve(&r).as_deref(), Some("hunter2"));
        assert!(!format!("{s:?}").contains("hunter2"));
        assert_eq!(NoSecrets.resolve(&r), None);
    }

    #[test]
    fn boot_id_is_read() {
        // Every Linux test host has one; it is what reboot detection compares.
        let id = read_boot_id().unwrap();
        assert_eq!(id.as_str().len(), 36);
    }

    #[test]
    fn proc_mount_table_sees_root() {
        let all = ProcMountTable.mounts_under(Path::new("/")).unwrap();
        assert!(all.iter().any(|p| p == Path::new("/")));
        let none = ProcMountTable
            .mounts_under(Path::new("/nonexistent-slrp-dir"))
            .unwrap();
        assert!(none.is_empty());
    }
}
