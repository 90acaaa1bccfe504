//! The working default of `slrp standalone`: the files it generates in the state
//! directory when the operator gives none of their own (see `docs/standalone.md`).
//!
//! - `<state dir>/config/resource-providers/local.json`: one ResourceProviderInfo in
//!   Mesos's format, provider `org.apache.mesos.rp.local.storage.local`, whose plugin is
//!   the bundled `slrp-csi-local` with a dir-backed pool `dir` and a loop-backed pool
//!   `loop`;
//! - `<state dir>/config/profiles.json`: a profile document in the format of Mesos's URI
//!   disk profile adaptor with the profiles `mount`, `block` and `ext4`.
//!
//! Each is written once, when absent, so an operator can read it and edit it; deleting it
//! makes the next start write it again (the provider's identity is its type and name,
//! which do not change).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use slrp_provider::config::STORAGE_PROVIDER_TYPE;

/// The default provider's name (`ResourceProviderInfo.name`).
pub(crate) const PROVIDER_NAME: &str = "local";
/// The default provider's plugin type: its volumes are mounted under
/// `<work dir>/csi/<plugin type>/<plugin name>/mounts/`.
pub(crate) const PLUGIN_TYPE: &str = "io.slrp.csi.local";
/// The default provider's plugin name.
pub(crate) const PLUGIN_NAME: &str = "local";
/// The bundled plugin's file name.
pub(crate) const PLUGIN_BINARY: &str = "slrp-csi-local";

/// The largest default pool: enough for a person to try things, small enough not to
/// surprise anyone on a laptop.
const POOL_MAX_BYTES: u64 = 10 << 30;
/// Each pool is at most this fraction of the state directory's free space, so the two
/// pools together never promise more than half of it (dir volumes are only accounted and
/// loop images are sparse: a promise beyond the free space fails in the workload later).
const POOL_FREE_DIVISOR: u64 = 4;
/// Below this a pool is not worth having (an ext4 loop volume needs 8 MiB).
const POOL_MIN_BYTES: u64 = 64 << 20;
/// Periodic reconciliation of the pools and volumes (Mesos's default is 10 s): the two
/// loop profiles share a pool, so a disk created from one shows in the other's capacity
/// only at the next reconciliation, and a person should not wait for it.
const RECONCILIATION_INTERVAL_SECONDS: f64 = 2.0;

/// The files of the state directory that standalone mode uses.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    state_dir: PathBuf,
}

impl Layout {
    pub(crate) fn new(state_dir: PathBuf) -> Self {
        Self { state_dir }
    }

    /// The generated ResourceProviderInfo files (`--resource-provider-config-dir`).
    pub(crate) fn provider_dir(&self) -> PathBuf {
        self.state_dir.join("config").join("resource-providers")
    }

    /// The generated ResourceProviderInfo of the default provider.
    pub(crate) fn provider_file(&self) -> PathBuf {
        self.provider_dir().join(format!("{PROVIDER_NAME}.json"))
    }

    /// The generated profile document (`--disk-profiles`).
    pub(crate) fn profiles_file(&self) -> PathBuf {
        self.state_dir.join("config").join("profiles.json")
    }

    /// The embedded manager's registrar (admitted providers, the agent id).
    pub(crate) fn manager_dir(&self) -> PathBuf {
        self.state_dir.join("manager")
    }

    /// The embedded manager's socket, the providers' agent URL.
    pub(crate) fn manager_socket(&self) -> PathBuf {
        self.state_dir.join("manager.sock")
    }

    /// The bundled plugin's `--root`.
    pub(crate) fn plugin_root(&self) -> PathBuf {
        self.state_dir.join("csi-local")
    }

    /// Held locked while a `slrp standalone` runs on this state directory.
    pub(crate) fn lock_file(&self) -> PathBuf {
        self.state_dir.join("standalone.lock")
    }
}

/// Why the default configuration cannot be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DefaultsError {
    /// The bundled plugin is neither beside `slrp` nor on `PATH`.
    #[error(
        "cannot find the bundled CSI plugin {PLUGIN_BINARY}: not beside slrp ({beside}) and not on PATH ({path}); install it next to slrp, or give --resource-provider-config-dir with your own plugin"
    )]
    PluginNotFound {
        /// Where it was looked for beside the running binary.
        beside: String,
        /// The `PATH` searched.
        path: String,
    },
    /// The free space of the state directory's file system cannot be read.
    #[error("reading the free space of {path}")]
    FreeSpace {
        /// The state directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: nix::Error,
    },
    /// The state directory's file system is too full for the default pools.
    #[error(
        "{path} has {free_mib} MiB free: the default pools need at least {need_mib} MiB; free some space or give --state-dir on another file system"
    )]
    NoSpace {
        /// The state directory.
        path: PathBuf,
        /// Its free space in MiB.
        free_mib: u64,
        /// What the pools need at least.
        need_mib: u64,
    },
    /// The generated provider file names a plugin binary that is not there (slrp was
    /// moved or reinstalled elsewhere since the file was written).
    #[error(
        "{file} runs the plugin {plugin}, which does not exist; delete {file} to have it written again with the plugin found now"
    )]
    PluginGone {
        /// The provider file.
        file: PathBuf,
        /// The plugin it names.
        plugin: PathBuf,
    },
    /// A generated file cannot be written.
    #[error("writing {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Finds the bundled plugin: beside the running `slrp` (`exe_dir`), then in each
/// directory of `path_var` (`PATH`).
///
/// # Errors
/// [`DefaultsError::PluginNotFound`] naming both places.
pub(crate) fn find_plugin(
    exe_dir: Option<&Path>,
    path_var: Option<&OsStr>,
) -> Result<PathBuf, DefaultsError> {
    let beside = exe_dir.map(|dir| dir.join(PLUGIN_BINARY));
    if let Some(candidate) = &beside
        && is_executable(candidate)
    {
        return Ok(candidate.clone());
    }
    if let Some(path) = path_var {
        for dir in std::env::split_paths(path) {
            // An empty entry means the working directory, which a daemon must not trust.
            if !dir.is_absolute() {
                continue;
            }
            let candidate = dir.join(PLUGIN_BINARY);
            if is_executable(&candidate) {
                return Ok(candidate);
            }
        }
    }
    Err(DefaultsError::PluginNotFound {
        beside: beside.map_or_else(
            || "the directory of slrp is unknown".to_owned(),
            |p| p.display().to_string(),
        ),
        path: path_var.map_or_else(|| "unset".to_owned(), |p| p.to_string_lossy().into_owned()),
    })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The size of each default pool for `free_bytes` of free space: 10 GiB, but at most a
/// quarter of the free space, in whole MiB; `None` when that is under 64 MiB.
pub(crate) fn pool_bytes(free_bytes: u64) -> Option<u64> {
    let bytes = (free_bytes / POOL_FREE_DIVISOR).min(POOL_MAX_BYTES) >> 20 << 20;
    (bytes >= POOL_MIN_BYTES).then_some(bytes)
}

/// The free space (for an unprivileged user, as the pools' files are ordinary files) of
/// the file system holding `dir`.
fn free_bytes(dir: &Path) -> Result<u64, DefaultsError> {
    let stat = nix::sys::statvfs::statvfs(dir).map_err(|source| DefaultsError::FreeSpace {
        path: dir.to_owned(),
        source,
    })?;
    Ok(stat.blocks_available().saturating_mul(stat.fragment_size()))
}

/// The default provider's ResourceProviderInfo, in Mesos's JSON form: the bundled plugin
/// at `plugin`, its volumes under `root`, pools `dir` and `loop` of `pool_bytes` each.
pub(crate) fn provider_info(plugin: &Path, root: &Path, pool_bytes: u64) -> Value {
    let mib = pool_bytes >> 20;
    json!({
        "type": STORAGE_PROVIDER_TYPE,
        "name": PROVIDER_NAME,
        "storage": {
            "plugin": {
                "type": PLUGIN_TYPE,
                "name": PLUGIN_NAME,
                "containers": [{
                    "services": ["CONTROLLER_SERVICE", "NODE_SERVICE"],
                    "command": {
                        "shell": false,
                        "value": plugin.display().to_string(),
                        "arguments": [
                            PLUGIN_BINARY,
                            "--root", root.display().to_string(),
                            "--pool", format!("dir={mib}MiB"),
                            "--pool", format!("loop={mib}MiB"),
                        ],
                    },
                }],
            },
            "reconciliation_interval_seconds": RECONCILIATION_INTERVAL_SECONDS,
        },
    })
}

/// The default profile document: `mount` (a directory of the `dir` pool), `block` (a
/// loop device of the `loop` pool) and `ext4` (an ext4 file system on a loop device of
/// the `loop` pool), each for the default plugin type, single node writer.
pub(crate) fn profiles() -> Value {
    let profile = |capability: Value, pool: &str| {
        let mut capabilities = capability;
        capabilities["access_mode"] = json!({"mode": "SINGLE_NODE_WRITER"});
        json!({
            "csi_plugin_type_selector": {"plugin_type": PLUGIN_TYPE},
            "volume_capabilities": capabilities,
            "create_parameters": {"pool": pool, "backend": pool},
        })
    };
    json!({
        "profile_matrix": {
            "mount": profile(json!({"mount": {}}), "dir"),
            "block": profile(json!({"block": {}}), "loop"),
            "ext4": profile(json!({"mount": {"fs_type": "ext4"}}), "loop"),
        }
    })
}

/// Writes the default provider's file unless it exists; the plugin is looked for and the
/// free space measured only then.
///
/// # Errors
/// [`DefaultsError`]: no plugin, too little space, or the file cannot be written.
pub(crate) fn ensure_provider_file(layout: &Layout) -> Result<(), DefaultsError> {
    let path = layout.provider_file();
    if path.exists() {
        return Ok(());
    }
    let exe = std::env::current_exe().ok();
    let plugin = find_plugin(
        exe.as_deref().and_then(Path::parent),
        std::env::var_os("PATH").as_deref(),
    )?;
    let free = free_bytes(&layout.state_dir)?;
    let pool = pool_bytes(free).ok_or_else(|| DefaultsError::NoSpace {
        path: layout.state_dir.clone(),
        free_mib: free >> 20,
        need_mib: (POOL_MIN_BYTES * POOL_FREE_DIVISOR) >> 20,
    })?;
    let info = provider_info(&plugin, &layout.plugin_root(), pool);
    tracing::info!(file = %path.display(), plugin = %plugin.display(), pool_mib = pool >> 20, "writing the default resource provider");
    write_new(&path, &info)
}

/// Points the default provider's file at the bundled plugin found now (beside the
/// running `slrp`, else on `PATH`), at every start: an upgraded or moved `slrp` runs the
/// plugin that came with it, not the one found when the file was written. Only a
/// command naming `slrp-csi-local` is rewritten, and only its `value`: the arguments
/// (root, pools and their sizes) stay as recorded. A plugin that is neither found now nor
/// where the file says fails at once with what to do. A file that is not valid, or a
/// command run through a shell, is left to the daemon's own checks.
///
/// # Errors
/// [`DefaultsError::PluginGone`], [`DefaultsError::Write`].
pub(crate) fn check_provider_file(layout: &Layout) -> Result<(), DefaultsError> {
    let exe = std::env::current_exe().ok();
    let found = find_plugin(
        exe.as_deref().and_then(Path::parent),
        std::env::var_os("PATH").as_deref(),
    )
    .ok();
    refresh_plugin(&layout.provider_file(), found.as_deref())
}

/// [`check_provider_file`] with the plugin `found` (if any).
fn refresh_plugin(file: &Path, found: Option<&Path>) -> Result<(), DefaultsError> {
    let Ok(text) = std::fs::read(file) else {
        return Ok(());
    };
    let Ok(mut info) = serde_json::from_slice::<Value>(&text) else {
        return Ok(());
    };
    let mut changed = false;
    let containers = info["storage"]["plugin"]["containers"].as_array_mut();
    for command in containers.into_iter().flatten().map(|c| &mut c["command"]) {
        if command["shell"] != Value::Bool(false) {
            continue;
        }
        let Some(plugin) = command["value"].as_str().map(PathBuf::from) else {
            continue;
        };
        let bundled = plugin.file_name() == Some(std::ffi::OsStr::new(PLUGIN_BINARY));
        match found {
            Some(now) if bundled && now != plugin => {
                tracing::info!(file = %file.display(), was = %plugin.display(), now = %now.display(), "the default provider runs the plugin found beside slrp now");
                command["value"] = Value::String(now.display().to_string());
                changed = true;
            }
            _ if plugin.is_absolute() && !plugin.exists() => {
                return Err(DefaultsError::PluginGone {
                    file: file.to_owned(),
                    plugin,
                });
            }
            _ => {}
        }
    }
    if changed {
        write_new(file, &info)?;
    }
    Ok(())
}

/// Writes the default profile document unless it exists.
///
/// # Errors
/// [`DefaultsError::Write`].
pub(crate) fn ensure_profiles_file(layout: &Layout) -> Result<(), DefaultsError> {
    let path = layout.profiles_file();
    if path.exists() {
        return Ok(());
    }
    tracing::info!(file = %path.display(), "writing the default disk profiles");
    write_new(&path, &profiles())
}

/// Writes `value` as pretty JSON with [`slrp_types::write_atomic`] (a temporary file, an
/// fsync, a rename and an fsync of the directory), so that a crash leaves either no file
/// (written again at the next start) or the whole of it, and a power loss after the write
/// does not lose it (a regenerated file would re-measure the pools).
fn write_new(path: &Path, value: &Value) -> Result<(), DefaultsError> {
    let failed = |source| DefaultsError::Write {
        path: path.to_owned(),
        source,
    };
    let mut text = serde_json::to_vec_pretty(value).map_err(|e| failed(e.into()))?;
    text.push(b'\n');
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(failed)?;
    }
    slrp_types::write_atomic(path, &text).map_err(|e| failed(e.into()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn executable(path: &Path) {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::write(path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn the_plugin_beside_slrp_wins_over_path() {
        let beside = tempfile::tempdir().unwrap();
        let on_path = tempfile::tempdir().unwrap();
        executable(&beside.path().join(PLUGIN_BINARY));
        executable(&on_path.path().join(PLUGIN_BINARY));
        let path = std::env::join_paths([on_path.path()]).unwrap();
        assert_eq!(
            find_plugin(Some(beside.path()), Some(&path)).unwrap(),
            beside.path().join(PLUGIN_BINARY)
        );
    }

    #[test]
    fn the_plugin_is_found_on_path_skipping_relative_entries_and_non_executables() {
        let beside = tempfile::tempdir().unwrap();
        let not_exec = tempfile::tempdir().unwrap();
        let on_path = tempfile::tempdir().unwrap();
        std::fs::write(not_exec.path().join(PLUGIN_BINARY), "").unwrap();
        executable(&on_path.path().join(PLUGIN_BINARY));
        let path =
            std::env::join_paths([Path::new("relative"), not_exec.path(), on_path.path()]).unwrap();
        assert_eq!(
            find_plugin(Some(beside.path()), Some(&path)).unwrap(),
            on_path.path().join(PLUGIN_BINARY)
        );
    }

    #[test]
    fn a_missing_plugin_names_both_places() {
        let beside = tempfile::tempdir().unwrap();
        let e = find_plugin(Some(beside.path()), Some(OsStr::new("/nonexistent/bin"))).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains(&beside.path().join(PLUGIN_BINARY).display().to_string()),
            "{text}"
        );
        assert!(text.contains("/nonexistent/bin"), "{text}");
    }

    #[test]
    fn pools_are_ten_gib_at_most_a_quarter_of_the_free_space_in_whole_mib() {
        assert_eq!(pool_bytes(1 << 40), Some(10 << 30));
        assert_eq!(pool_bytes(8 << 30), Some(2 << 30));
        assert_eq!(pool_bytes((1 << 30) + 12345), Some(256 << 20));
        assert_eq!(pool_bytes(256 << 20), Some(64 << 20));
        assert_eq!(pool_bytes((256 << 20) - 1), None);
    }

    #[test]
    fn the_generated_files_are_a_valid_provider_and_profile_set() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path().to_owned());
        let plugin = dir.path().join(PLUGIN_BINARY);
        write_new(
            &layout.provider_file(),
            &provider_info(&plugin, &layout.plugin_root(), 1 << 30),
        )
        .unwrap();
        let providers = slrp_provider::config::load_provider_dir(&layout.provider_dir()).unwrap();
        assert_eq!(providers.len(), 1);
        assert_eq!(
            providers[0].key(),
            "org.apache.mesos.rp.local.storage.local"
        );
        assert_eq!(
            providers[0].plugin(),
            (PLUGIN_TYPE.to_owned(), PLUGIN_NAME.to_owned())
        );
        // The profiles parse and validate as an inline set would (the same checks as a
        // fetched document).
        let toml = format!(
            "[agent]\nurl = \"unix:///run/x.sock\"\n[profiles]\ninline = '{}'\n",
            profiles()
        );
        let config = dir.path().join("slrp.toml");
        std::fs::write(&config, toml).unwrap();
        let mut file = slrp_provider::config::DaemonConfigFile::load(&config).unwrap();
        file.resource_provider_config_dir = Some(layout.provider_dir());
        slrp_provider::config::DaemonConfig::resolve(file).unwrap();
    }

    #[test]
    fn a_generated_file_whose_plugin_is_gone_says_to_delete_it() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path().to_owned());
        let plugin = dir.path().join(PLUGIN_BINARY);
        write_new(
            &layout.provider_file(),
            &provider_info(&plugin, &layout.plugin_root(), 1 << 30),
        )
        .unwrap();
        let e = refresh_plugin(&layout.provider_file(), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains(&plugin.display().to_string()), "{e}");
        assert!(e.contains("delete"), "{e}");
        executable(&plugin);
        refresh_plugin(&layout.provider_file(), None).unwrap();
    }

    #[test]
    fn the_generated_file_follows_the_plugin_found_now_keeping_the_pools() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path().to_owned());
        let old = dir.path().join("old").join(PLUGIN_BINARY);
        write_new(
            &layout.provider_file(),
            &provider_info(&old, &layout.plugin_root(), 3 << 30),
        )
        .unwrap();
        let now = dir.path().join("new").join(PLUGIN_BINARY);
        std::fs::create_dir_all(now.parent().unwrap()).unwrap();
        executable(&now);
        // Also when the old binary still exists (version skew), and when it is gone.
        for old_exists in [true, false] {
            if old_exists {
                std::fs::create_dir_all(old.parent().unwrap()).unwrap();
                executable(&old);
            } else {
                std::fs::remove_file(&old).ok();
            }
            write_new(
                &layout.provider_file(),
                &provider_info(&old, &layout.plugin_root(), 3 << 30),
            )
            .unwrap();
            refresh_plugin(&layout.provider_file(), Some(&now)).unwrap();
            let info: Value =
                serde_json::from_slice(&std::fs::read(layout.provider_file()).unwrap()).unwrap();
            assert_eq!(
                info,
                provider_info(&now, &layout.plugin_root(), 3 << 30),
                "only the command's value changes"
            );
        }
    }

    #[test]
    fn an_existing_file_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path().to_owned());
        std::fs::create_dir_all(layout.profiles_file().parent().unwrap()).unwrap();
        std::fs::write(layout.profiles_file(), "{\"profile_matrix\": {}}").unwrap();
        ensure_profiles_file(&layout).unwrap();
        assert_eq!(
            std::fs::read_to_string(layout.profiles_file()).unwrap(),
            "{\"profile_matrix\": {}}"
        );
        let fresh = tempfile::tempdir().unwrap();
        let layout = Layout::new(fresh.path().to_owned());
        ensure_profiles_file(&layout).unwrap();
        let doc: Value =
            serde_json::from_slice(&std::fs::read(layout.profiles_file()).unwrap()).unwrap();
        assert_eq!(doc, profiles());
    }
}
