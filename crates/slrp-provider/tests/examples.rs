//! The files under `examples/` load with the daemon's own loaders: `slrp.toml` (every key
//! it shows, commented ones included, is a key the loader knows, and the active ones
//! resolve into a configuration) and the ResourceProviderInfo files, validated as Mesos
//! validates them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use slrp_provider::config::{
    DaemonConfig, DaemonConfigFile, Overrides, PluginsOnExit, load_provider_dir,
};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

#[test]
fn the_example_config_loads_and_resolves() {
    let file = DaemonConfigFile::load(&examples().join("slrp.toml")).unwrap();
    assert_eq!(file.agent.url.as_deref(), Some("http://127.0.0.1:5051"));
    // Paths from the file point at the host; the test's own go through the flags, which
    // win over the file as they do for an operator.
    let tmp = tempfile::tempdir().unwrap();
    let file = file.apply(Overrides {
        state_dir: Some(tmp.path().join("state")),
        work_dir: Some(tmp.path().join("work")),
        resource_provider_config_dir: Some(examples().join("resource-providers")),
        disk_profiles: Some(examples().join("profiles.json").display().to_string()),
        admin_socket: Some(tmp.path().join("admin.sock")),
        ..Overrides::default()
    });
    let config = DaemonConfig::resolve(file).unwrap();
    assert_eq!(config.providers.len(), 1);
    assert_eq!(config.plugins_on_exit, PluginsOnExit::Stop);
    assert_eq!(config.shutdown_grace, Duration::from_secs(30));
    assert_eq!(config.plugin_ready_timeout, Some(Duration::from_secs(120)));
    let profiles = config.profiles.expect("the [profiles] table");
    assert_eq!(profiles.poll_interval, Some(Duration::from_secs(10)));
}

/// Uncommenting a `# key = value` line of the example gives a file the loader accepts
/// (it refuses unknown keys), so no commented key is misspelt or stale.
#[test]
fn every_commented_key_of_the_example_is_a_real_one() {
    let text = std::fs::read_to_string(examples().join("slrp.toml")).unwrap();
    let mut uncommented = 0;
    let all: String = text
        .lines()
        .map(|line| {
            let setting = line.strip_prefix("# ").filter(|rest| {
                rest.split_once(" = ").is_some_and(|(key, _)| {
                    !key.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                })
            });
            match setting {
                Some(rest) => {
                    uncommented += 1;
                    format!("{rest}\n")
                }
                None => format!("{line}\n"),
            }
        })
        .collect();
    assert!(uncommented >= 5, "{uncommented} commented keys:\n{all}");
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("slrp.toml");
    std::fs::write(&path, &all).unwrap();
    if let Err(e) = DaemonConfigFile::load(&path) {
        panic!("{:#}\n{all}", anyhow::Error::from(e));
    }
}

#[test]
fn the_example_provider_files_load_as_mesos_validates_them() {
    let providers = load_provider_dir(&examples().join("resource-providers")).unwrap();
    let keys: Vec<_> = providers.iter().map(|p| p.key()).collect();
    assert_eq!(keys, ["org.apache.mesos.rp.local.storage.local"]);
    let plugin = providers[0].info.storage.as_ref().unwrap().plugin.clone();
    assert_eq!(plugin.r#type, "io.slrp.csi.local");
}
