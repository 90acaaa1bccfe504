//! ResourceProviderInfo files (the agent's `--resource_provider_config_dir`, Mesos's JSON),
//! as `slrp run` and `slrp standalone` load them: [`parse_provider_file`].
//!
//! Input: the file's bytes.
//!
//! Properties:
//! - a refused file is refused with a typed [`ConfigError`](slrp_provider::config::ConfigError);
//! - an accepted provider, written back as Mesos JSON, loads again to the same provider;
//! - the directories named after it (its state directory, its plugin's mount root) stay
//!   inside their parents;
//! - the plugin backend checks answer for either backend without panicking.

use std::path::Path;

use slrp_core::volume::MountPaths;
use slrp_provider::config::{
    PluginBackend, check_plugin_backend, parse_provider_file, provider_state_dir,
};

use crate::util::inside;

/// The target.
pub fn run(data: &[u8]) {
    let path = Path::new("/etc/slrp/resource-providers/fuzz.json");
    let Ok(provider) = parse_provider_file(path, data) else {
        return;
    };
    let written = slrp_wire::json::to_vec(&provider.info).expect("a decoded info renders as JSON");
    let again = parse_provider_file(path, &written).unwrap_or_else(|e| {
        panic!(
            "an accepted provider, written back, is refused: {e:?}\n{}",
            String::from_utf8_lossy(&written)
        )
    });
    assert_eq!(provider, again, "the provider changed through its JSON");

    let state = Path::new("/var/lib/slrp");
    let dir = provider_state_dir(state, &provider.info);
    assert!(
        inside(&state.join("providers"), &dir) && dir != state.join("providers"),
        "provider state directory {} leaves {}",
        dir.display(),
        state.display()
    );
    let work = Path::new("/var/lib/mesos");
    let (plugin_type, plugin_name) = provider.plugin();
    let mounts = MountPaths::under_work_dir(work, &plugin_type, &plugin_name)
        .expect("a validated plugin type and name are path components");
    assert!(
        inside(&work.join("csi"), mounts.root()),
        "mount root {} leaves the work directory",
        mounts.root().display()
    );
    for backend in [PluginBackend::Process, PluginBackend::Agent] {
        let _ = check_plugin_backend(&provider, backend);
    }
}
