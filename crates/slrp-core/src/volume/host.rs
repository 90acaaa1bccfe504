//! What the volume manager reads from the host: the boot id, the mount table, secrets.
//! Each is injectable, so tests can simulate a reboot or a plugin that mounts nothing.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use super::state::SecretRef;

pub use slrp_types::boot::{BOOT_ID_PATH, read_boot_id};

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
    /// The kernel lists mount points resolved (no symlinks, absolute) and with space, tab,
    /// newline and backslash escaped as octal (`\040`...); `dir` is resolved the same way
    /// and the results are given back under `dir` as the caller spelled it, so that they
    /// compare equal to paths the caller built. A `dir` that does not exist has nothing
    /// mounted at or below it.
    fn mounts_under(&self, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
        let resolved = match std::fs::canonicalize(dir) {
            Ok(p) => p,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let infos = procfs::process::Process::myself()
            .and_then(|p| p.mountinfo())
            .map_err(std::io::Error::other)?;
        Ok(infos
            .into_iter()
            .filter_map(|m| {
                let point = unescape_mount_point(&m.mount_point);
                let rest = point.strip_prefix(&resolved).ok()?;
                Some(if rest.as_os_str().is_empty() {
                    dir.to_owned()
                } else {
                    dir.join(rest)
                })
            })
            .collect())
    }
}

/// Undoes the kernel's octal escapes in a mountinfo path (`\040` = space, `\011` = tab,
/// `\012` = newline, `\134` = backslash). Anything else is kept as it is.
fn unescape_mount_point(p: &Path) -> PathBuf {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let b = p.as_os_str().as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .map(|d| d.iter().fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0')))
            .and_then(|v| u8::try_from(v).ok());
        match octal {
            Some(v) => {
                out.push(v);
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
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

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(
            unescape_mount_point(Path::new(r"/a\040b/c\134d\011\012")),
            Path::new("/a b/c\\d\t\n")
        );
        // Not an escape: kept.
        assert_eq!(
            unescape_mount_point(Path::new(r"/x\9y\04")),
            Path::new(r"/x\9y\04")
        );
    }

    /// Unmounts (lazily) on drop, so a failing assertion leaves no mount behind.
    struct Mounted(PathBuf);

    impl Drop for Mounted {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }

    fn mount_tmpfs(at: &Path) -> Mounted {
        std::fs::create_dir_all(at).unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            at,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("size=1m"),
        )
        .unwrap();
        Mounted(at.to_owned())
    }

    /// The mount table must see mounts under a root reached through a symlink, and under
    /// paths with characters the kernel escapes in mountinfo (`\040` for a space):
    /// otherwise a mounted target looks unmounted and its directory is removed
    /// recursively, through the mount, with the volume's data.
    #[test]
    fn proc_mount_table_sees_mounts_through_symlinks_and_escapes() {
        if !slrp_test_support::require_root(
            "proc_mount_table_sees_mounts_through_symlinks_and_escapes",
        ) {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real root");
        let target = real.join("vol").join("target");
        let _m = mount_tmpfs(&target);
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();

        let direct = ProcMountTable.mounts_under(&real.join("vol")).unwrap();
        assert_eq!(direct, vec![target.clone()]);
        // Reported in the caller's spelling, so it compares equal to paths built from it.
        let via_link = ProcMountTable.mounts_under(&link.join("vol")).unwrap();
        assert_eq!(via_link, vec![link.join("vol").join("target")]);
        assert!(
            ProcMountTable
                .mounts_under(&dir.path().join("missing"))
                .unwrap()
                .is_empty()
        );
    }
}
