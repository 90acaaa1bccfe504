//! The kernel's boot id: mounts, stagings and process start times are only meaningful
//! within the boot that made them.

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Where the kernel publishes the id of the current boot.
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// The kernel's boot id (`/proc/sys/kernel/random/boot_id`): mounts and stagings made in
/// one boot are gone in the next.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BootId(String);

impl BootId {
    /// Wraps a boot id as read from the kernel.
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    /// The id text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id text, owned.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for BootId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An environment variable naming a file to read the boot id from instead of
/// [`BOOT_ID_PATH`]. Process-level tests simulate a reboot with it (unmount every volume,
/// then start the daemon under another boot id) without rebooting the machine; nothing
/// else should set it.
pub const BOOT_ID_FILE_ENV: &str = "SLRP_BOOT_ID_FILE";

/// Reads the current boot id from [`BOOT_ID_PATH`], or from the file named by
/// [`BOOT_ID_FILE_ENV`] if that is set.
///
/// # Errors
/// When the file cannot be read or holds only whitespace.
pub fn read_boot_id() -> std::io::Result<BootId> {
    read_boot_id_from(&boot_id_path(std::env::var_os(BOOT_ID_FILE_ENV)))
}

/// The file the boot id is read from, given the value of [`BOOT_ID_FILE_ENV`].
fn boot_id_path(env: Option<std::ffi::OsString>) -> std::path::PathBuf {
    match env {
        Some(p) if !p.is_empty() => p.into(),
        _ => BOOT_ID_PATH.into(),
    }
}

/// Reads a boot id from `path` (the kernel's file in production, a fixture in tests).
///
/// # Errors
/// When the file cannot be read or holds only whitespace.
pub fn read_boot_id_from(path: &Path) -> std::io::Result<BootId> {
    let text = std::fs::read_to_string(path)?;
    let id = text.trim();
    if id.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("boot id file {} is empty", path.display()),
        ));
    }
    Ok(BootId::new(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_override_names_another_file_and_an_empty_one_is_ignored() {
        assert_eq!(boot_id_path(None), Path::new(BOOT_ID_PATH));
        assert_eq!(boot_id_path(Some("".into())), Path::new(BOOT_ID_PATH));
        assert_eq!(boot_id_path(Some("/tmp/b".into())), Path::new("/tmp/b"));
    }

    #[test]
    fn the_running_kernel_has_a_boot_id() {
        let id = read_boot_id().unwrap();
        assert_eq!(id.as_str().len(), 36, "a UUID: {id}");
        assert_eq!(read_boot_id().unwrap(), id, "stable within a boot");
    }

    #[test]
    fn whitespace_is_trimmed_and_an_empty_file_is_an_error() {
        let dir = std::env::temp_dir().join(format!("slrp-types-boot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("boot_id");
        std::fs::write(&f, "abc\n").unwrap();
        assert_eq!(read_boot_id_from(&f).unwrap(), BootId::new("abc"));
        std::fs::write(&f, " \n").unwrap();
        let e = read_boot_id_from(&f).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("is empty"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
