//! `slrp_provider::config`: the provider files (spec §10.1) and the daemon's TOML file, as
//! tables of inputs and the error each must produce.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use slrp_provider::config::{
    AdminListen, ConfigError, DaemonConfig, DaemonConfigFile, Overrides, PluginBackend,
    PluginsOnExit, RemoveSandboxes, load_provider_dir, load_provider_file,
};
use slrp_types::{Backoff, DisplayChain};
use slrp_wire::ContentType;

fn valid() -> Value {
    json!({
        "type": "org.apache.mesos.rp.local.storage",
        "name": "test",
        "default_reservations": [{"type": "DYNAMIC", "role": "storage"}],
        "storage": {
            "plugin": {
                "type": "org.apache.mesos.csi.test",
                "name": "local",
                "containers": [{
                    "services": ["CONTROLLER_SERVICE", "NODE_SERVICE"],
                    "command": {"shell": false, "value": "/bin/true", "arguments": ["true"]},
                    "resources": [{"name": "cpus", "type": "SCALAR", "scalar": {"value": 0.1}}]
                }]
            },
            "reconciliation_interval_seconds": 10
        }
    })
}

fn write(dir: &Path, name: &str, value: &Value) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_vec_pretty(value).unwrap()).unwrap();
    path
}

/// Applies `edit` to the valid document at a JSON pointer (`None` removes the field).
fn edited(pointer: &str, edit: Option<Value>) -> Value {
    let mut v = valid();
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let parent = v.pointer_mut(parent).unwrap();
    match edit {
        Some(new) => parent[key] = new,
        None => {
            parent.as_object_mut().unwrap().remove(key);
        }
    }
    v
}

#[test]
fn a_mesos_example_config_is_accepted_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "test.json", &valid());
    let config = load_provider_file(&path).unwrap();
    assert_eq!(config.source, path);
    assert_eq!(config.key(), "org.apache.mesos.rp.local.storage.test");
    assert_eq!(
        config.plugin(),
        ("org.apache.mesos.csi.test".into(), "local".into())
    );
    assert_eq!(config.info.default_reservations.len(), 1);
}

#[test]
fn every_rule_of_section_10_1_is_enforced_with_mesos_text_file_and_field() {
    let unknown_service = {
        let mut v = valid();
        v["storage"]["plugin"]["containers"][0]["services"] = json!(["CONTROLLER_SERVICE"]);
        v
    };
    let cases: Vec<(&str, Value, &str, &str)> = vec![
        (
            "type",
            edited("/type", Some(json!("org.apache.mesos.rp.local.other"))),
            "type",
            "Unknown local resource provider type 'org.apache.mesos.rp.local.other'",
        ),
        (
            "id",
            edited("/id", Some(json!({"value": "abc"}))),
            "id",
            "'ResourceProviderInfo.id' must not be set",
        ),
        (
            "name with a dash",
            edited("/name", Some(json!("te-st"))),
            "name",
            "Resource provider name 'te-st' does not follow Java package naming convention",
        ),
        (
            "empty name",
            edited("/name", Some(json!(""))),
            "name",
            "Resource provider name '' does not follow Java package naming convention",
        ),
        (
            "storage",
            edited("/storage", None),
            "storage",
            "'ResourceProviderInfo.storage' must be set",
        ),
        (
            "plugin type",
            edited("/storage/plugin/type", Some(json!("org..csi"))),
            "storage.plugin",
            "CSI plugin type 'org..csi' and name 'local' does not follow Java package naming convention",
        ),
        (
            "plugin name",
            edited("/storage/plugin/name", Some(json!("lo/cal"))),
            "storage.plugin",
            "CSI plugin type 'org.apache.mesos.csi.test' and name 'lo/cal' does not follow Java package naming convention",
        ),
        (
            "node service",
            unknown_service,
            "storage.plugin.containers",
            "NODE_SERVICE not found",
        ),
        (
            "no containers",
            edited("/storage/plugin/containers", Some(json!([]))),
            "storage.plugin.containers",
            "NODE_SERVICE not found",
        ),
        (
            "interval",
            edited(
                "/storage/reconciliation_interval_seconds",
                Some(json!("ten")),
            ),
            "storage.reconciliation_interval_seconds",
            "invalid float",
        ),
        (
            "reservations",
            edited(
                "/default_reservations",
                Some(json!([{"type": "DYNAMIC", "role": "a"}, {"type": "STATIC", "role": "a/b"}])),
            ),
            "default_reservations",
            "a refined reservation must be DYNAMIC",
        ),
        (
            "required field",
            edited("/storage/plugin/type", None),
            "storage.plugin.type",
            "missing required field 'type'",
        ),
    ];
    for (what, document, field, text) in cases {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "rp.json", &document);
        let err = load_provider_file(&path).expect_err(what);
        let chain = format!("{}", slrp_types::DisplayChain(&err));
        assert!(
            chain.contains(&path.display().to_string()),
            "{what}: {chain}"
        );
        assert!(chain.contains(&format!("'{field}'")), "{what}: {chain}");
        assert!(chain.contains(text), "{what}: {chain}");
    }
}

#[test]
fn unknown_fields_and_enum_names_are_ignored_as_stout_ignores_them() {
    let mut v = valid();
    v["future_field"] = json!({"x": 1});
    v["storage"]["plugin"]["containers"][0]["command"]["also_new"] = json!(true);
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "rp.json", &v);
    let config = load_provider_file(&path).unwrap();
    assert_eq!(config.info.name, "test");

    // An unknown enum name of an optional field is dropped, as stout drops it (proto2).
    let v = edited(
        "/storage/plugin/containers/0/services",
        Some(json!(["NODE_SERVICE", "CONTROLER_SERVICE"])),
    );
    let config = load_provider_file(&write(dir.path(), "rp.json", &v)).unwrap();
    let container = &config.info.storage.unwrap().plugin.containers[0];
    assert_eq!(container.services, [2], "NODE_SERVICE only");
}

#[test]
fn a_zero_or_negative_reconciliation_interval_is_accepted_and_the_plugin_name_defaulted() {
    for value in [json!(0), json!(-5), json!(2.5)] {
        let v = edited(
            "/storage/reconciliation_interval_seconds",
            Some(value.clone()),
        );
        let dir = tempfile::tempdir().unwrap();
        load_provider_file(&write(dir.path(), "rp.json", &v)).expect("accepted");
    }
    let v = edited("/storage/plugin/name", None);
    let dir = tempfile::tempdir().unwrap();
    let config = load_provider_file(&write(dir.path(), "rp.json", &v)).unwrap();
    let plugin = config.info.storage.unwrap().plugin;
    assert_eq!(
        plugin.name.as_deref(),
        Some("default"),
        "Mesos's proto default"
    );
}

#[test]
fn a_node_only_plugin_is_accepted() {
    let mut v = valid();
    v["storage"]["plugin"]["containers"][0]["services"] = json!(["NODE_SERVICE"]);
    let dir = tempfile::tempdir().unwrap();
    load_provider_file(&write(dir.path(), "rp.json", &v)).unwrap();
}

#[test]
fn the_directory_skips_hidden_files_staging_and_other_extensions() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "b.json", &valid());
    let mut second = valid();
    second["name"] = json!("second");
    second["storage"]["plugin"]["name"] = json!("other");
    write(dir.path(), "a.json", &second);
    std::fs::write(dir.path().join(".hidden.json"), "not json").unwrap();
    std::fs::write(dir.path().join("README"), "not json").unwrap();
    std::fs::write(dir.path().join("x.json~"), "not json").unwrap();
    std::fs::create_dir(dir.path().join(".staging")).unwrap();
    std::fs::create_dir(dir.path().join("sub.json")).unwrap();
    let providers = load_provider_dir(dir.path()).unwrap();
    let names: Vec<_> = providers.iter().map(|p| p.info.name.as_str()).collect();
    assert_eq!(names, ["second", "test"], "file name order");
}

#[test]
fn duplicates_are_refused_naming_both_files() {
    let dir = tempfile::tempdir().unwrap();
    let first = write(dir.path(), "a.json", &valid());
    let mut other_plugin = valid();
    other_plugin["storage"]["plugin"]["name"] = json!("other");
    let second = write(dir.path(), "b.json", &other_plugin);
    let err = load_provider_dir(dir.path()).unwrap_err();
    assert!(
        matches!(err, ConfigError::DuplicateProvider { .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("Multiple resource providers with type 'org.apache.mesos.rp.local.storage' and name 'test'")
            && text.contains(&first.display().to_string())
            && text.contains(&second.display().to_string()),
        "{text}"
    );

    let mut same_plugin = valid();
    same_plugin["name"] = json!("other");
    write(dir.path(), "b.json", &same_plugin);
    let err = load_provider_dir(dir.path()).unwrap_err();
    assert!(
        matches!(err, ConfigError::DuplicatePlugin { .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("org.apache.mesos.csi.test"),
        "{err}"
    );
}

#[test]
fn an_empty_or_missing_directory_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let err = load_provider_dir(dir.path()).unwrap_err();
    assert!(matches!(err, ConfigError::NoProviders { .. }), "{err:?}");
    let missing = dir.path().join("nope");
    let err = load_provider_dir(&missing).unwrap_err();
    assert!(
        err.to_string().contains(&missing.display().to_string()),
        "{err}"
    );
}

struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("rp")).unwrap();
        write(&dir.path().join("rp"), "test.json", &valid());
        Self { dir }
    }

    fn config(&self, toml: &str) -> std::path::PathBuf {
        let path = self.dir.path().join("slrp.toml");
        std::fs::write(&path, toml).unwrap();
        path
    }

    fn resolve(&self, toml: &str, flags: Overrides) -> Result<DaemonConfig, ConfigError> {
        let file = DaemonConfigFile::load(&self.config(toml))?;
        DaemonConfig::resolve(file.apply(flags))
    }
}

#[test]
fn the_toml_file_sets_everything_and_relative_paths_follow_the_file() {
    let s = Setup::new();
    std::fs::write(s.dir.path().join("token"), "s3cret\n").unwrap();
    let config = s
        .resolve(
            r#"
state_dir = "state"
work_dir = "/var/lib/mesos"
resource_provider_config_dir = "rp"
plugins_on_exit = "leave"
shutdown_grace = "5s"
plugin_ready_timeout = "7s"

[agent]
url = "http://127.0.0.1:5051"
token_file = "token"
content_type = "json"
call_timeout = "3secs"
backoff_base = "100ms"
backoff_max = "2s"

[profiles]
uri = "profiles.json"
poll_interval = "10secs"

[admin]
socket = "/run/slrp.sock"

[retries]
status_update_min = "100ms"
status_update_max = "1s"
csi_min = "50ms"

[csi]
max_list_pages = 7
max_map_bytes = 4096
"#,
            Overrides::default(),
        )
        .unwrap();
    assert_eq!(
        config.status_update_retry,
        Backoff::new(Duration::from_millis(100), Duration::from_secs(1)).unwrap()
    );
    assert_eq!(
        config.csi_retry,
        Backoff::new(Duration::from_millis(50), Backoff::MESOS.max()).unwrap(),
        "an unset bound keeps Mesos's"
    );
    assert_eq!(
        config.csi_limits,
        slrp_csi::AnswerLimits {
            max_list_pages: 7,
            max_map_bytes: 4096,
            ..slrp_csi::AnswerLimits::default()
        },
        "an unset bound keeps its default"
    );
    let base = s.dir.path();
    assert_eq!(config.state_dir, base.join("state"));
    assert_eq!(config.work_dir, Path::new("/var/lib/mesos"));
    assert_eq!(config.providers.len(), 1);
    assert_eq!(config.plugins_on_exit, PluginsOnExit::Leave);
    assert_eq!(config.shutdown_grace, Duration::from_secs(5));
    assert_eq!(config.plugin_ready_timeout, Some(Duration::from_secs(7)));
    assert_eq!(config.admin, AdminListen::Unix("/run/slrp.sock".into()));
    assert_eq!(config.agent.content_type, ContentType::Json);
    assert_eq!(config.agent.call_timeout, Duration::from_secs(3));
    assert_eq!(config.agent.backoff.base(), Duration::from_millis(100));
    assert_eq!(
        config.agent.endpoint.to_string(),
        "http://127.0.0.1:5051/slave(1)/api/v1/resource_provider"
    );
    assert!(config.agent.token.is_some());
    assert!(
        !format!("{config:?}").contains("s3cret"),
        "the token never shows"
    );
    let profiles = config.profiles.unwrap();
    assert_eq!(
        profiles.source.to_string(),
        base.join("profiles.json").display().to_string()
    );
    assert_eq!(profiles.poll_interval, Some(Duration::from_secs(10)));
}

#[test]
fn flags_override_the_file_and_defaults_hang_off_the_state_dir() {
    let s = Setup::new();
    let rp = s.dir.path().join("rp");
    let config = s
        .resolve(
            "state_dir = \"/nowhere\"\n[agent]\nurl = \"http://10.0.0.1:5051\"\n",
            Overrides {
                agent: Some("unix:///run/agent.sock".into()),
                state_dir: Some(s.dir.path().join("s")),
                resource_provider_config_dir: Some(rp),
                disk_profiles: Some("/etc/profiles.json".into()),
                ..Overrides::default()
            },
        )
        .unwrap();
    let state = s.dir.path().join("s");
    assert_eq!(config.state_dir, state);
    assert_eq!(config.work_dir, state.join("work"));
    assert_eq!(config.admin, AdminListen::Unix(state.join("admin.sock")));
    assert_eq!(config.plugins_on_exit, PluginsOnExit::Stop);
    assert_eq!(config.status_update_retry, Backoff::MESOS);
    assert_eq!(config.csi_retry, Backoff::MESOS);
    assert_eq!(config.csi_limits, slrp_csi::AnswerLimits::default());
    assert_eq!(
        config.agent.endpoint.to_string(),
        "unix:///run/agent.sock/slave(1)/api/v1/resource_provider"
    );
    assert_eq!(
        config.profiles.unwrap().source.to_string(),
        "/etc/profiles.json"
    );
}

#[test]
fn bad_settings_are_refused_naming_the_key() {
    let s = Setup::new();
    let rp = "resource_provider_config_dir = \"rp\"\n".to_owned();
    let cases = [
        (
            "unknown top-level key",
            format!("{rp}colour = 1\n[agent]\nurl = \"http://a:1\"\n"),
            "colour",
        ),
        (
            "plugin backend",
            format!("{rp}[agent]\nurl = \"http://a:1\"\n[plugins]\nbackend = \"docker\"\n"),
            "plugins.backend",
        ),
        (
            "remove sandboxes",
            format!("{rp}[agent]\nurl = \"http://a:1\"\n[plugins]\nremove_sandboxes = \"api\"\n"),
            "plugins.remove_sandboxes",
        ),
        (
            "unknown plugins key",
            format!("{rp}[agent]\nurl = \"http://a:1\"\n[plugins]\nimage = \"x\"\n"),
            "image",
        ),
        (
            "unknown agent key",
            format!("{rp}[agent]\nurl = \"http://a:1\"\ntoken = \"x\"\n"),
            "token",
        ),
        ("no agent", rp.clone(), "--agent"),
        (
            "bad url",
            format!("{rp}[agent]\nurl = \"ftp://a\"\n"),
            "agent.url",
        ),
        (
            "bad duration",
            format!("{rp}[agent]\nurl = \"http://a:1\"\ncall_timeout = \"soon\"\n"),
            "agent.call_timeout",
        ),
        (
            "zero duration",
            format!("{rp}[agent]\nurl = \"http://a:1\"\nconnect_timeout = \"0s\"\n"),
            "agent.connect_timeout",
        ),
        (
            "content type",
            format!("{rp}[agent]\nurl = \"http://a:1\"\ncontent_type = \"xml\"\n"),
            "agent.content_type",
        ),
        (
            "backoff",
            format!(
                "{rp}[agent]\nurl = \"http://a:1\"\nbackoff_base = \"10s\"\nbackoff_max = \"1s\"\n"
            ),
            "agent.backoff_max",
        ),
        (
            "status update retry",
            format!(
                "{rp}[agent]\nurl = \"http://a:1\"\n[retries]\nstatus_update_min = \"20min\"\n"
            ),
            "retries.status_update_max",
        ),
        (
            "csi retry",
            format!("{rp}[agent]\nurl = \"http://a:1\"\n[retries]\ncsi_max = \"soon\"\n"),
            "retries.csi_max",
        ),
        (
            "zero answer bound",
            format!("{rp}[agent]\nurl = \"http://a:1\"\n[csi]\nmax_list_bytes = 0\n"),
            "csi.max_list_bytes",
        ),
        (
            "ids longer than a store key",
            format!("{rp}[agent]\nurl = \"http://a:1\"\n[csi]\nmax_id_bytes = 1025\n"),
            "setting 'csi.max_id_bytes': 1025 is over 1024: ids are keys of the state store",
        ),
        (
            "unknown csi key",
            format!("{rp}[agent]\nurl = \"http://a:1\"\n[csi]\nmax_pages = 3\n"),
            "max_pages",
        ),
        (
            "zero health concurrency",
            format!("{rp}[agent]\nurl = \"http://a:1\"\n[volume_health]\nconcurrency = 0\n"),
            "volume_health.concurrency",
        ),
        (
            "bad health interval",
            format!("{rp}[agent]\nurl = \"http://a:1\"\n[volume_health]\ninterval = \"often\"\n"),
            "volume_health.interval",
        ),
        (
            "unknown health key",
            format!("{rp}[agent]\nurl = \"http://a:1\"\n[volume_health]\nrate = 3\n"),
            "rate",
        ),
        (
            "missing token file",
            format!("{rp}[agent]\nurl = \"http://a:1\"\ntoken_file = \"nope\"\n"),
            "agent.token_file",
        ),
        (
            "plugins_on_exit",
            format!("{rp}plugins_on_exit = \"keep\"\n[agent]\nurl = \"http://a:1\"\n"),
            "plugins_on_exit",
        ),
        (
            "profiles",
            format!("{rp}[agent]\nurl = \"http://a:1\"\n[disk_profiles]\nuri = \"ftp://x\"\n"),
            "setting 'profiles'",
        ),
        (
            "profiles key",
            format!("{rp}[agent]\nurl = \"http://a:1\"\n[disk_profiles]\nurl = \"/x\"\n"),
            "url",
        ),
        (
            "no provider dir",
            "[agent]\nurl = \"http://a:1\"\n".to_owned(),
            "--resource-provider-config-dir",
        ),
        ("syntax", "[agent\n".to_owned(), "slrp.toml"),
    ];
    for (what, toml, needle) in cases {
        let err = s.resolve(&toml, Overrides::default()).expect_err(what);
        let chain = format!("{}", slrp_types::DisplayChain(&err));
        assert!(chain.contains(needle), "{what}: {chain}");
    }
    std::fs::write(s.dir.path().join("empty"), "\n").unwrap();
    let err = s
        .resolve(
            &format!("{rp}[agent]\nurl = \"http://a:1\"\ntoken_file = \"empty\"\n"),
            Overrides::default(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("agent.token_file"), "{err}");
}

#[test]
fn a_provider_error_surfaces_through_the_daemon_config_naming_the_file() {
    let s = Setup::new();
    let bad = write(
        &s.dir.path().join("rp"),
        "bad.json",
        &edited("/name", Some(json!("bad name"))),
    );
    let err = s
        .resolve(
            "resource_provider_config_dir = \"rp\"\n[agent]\nurl = \"http://a:1\"\n",
            Overrides::default(),
        )
        .unwrap_err();
    assert!(
        matches!(err, ConfigError::InvalidProvider { .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&bad.display().to_string()),
        "{err}"
    );
}

#[test]
fn the_examples_are_valid() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let file = DaemonConfigFile::load(&examples.join("slrp.toml")).unwrap();
    let config = DaemonConfig::resolve(file.apply(Overrides {
        resource_provider_config_dir: Some(examples.join("resource-providers")),
        ..Overrides::default()
    }))
    .unwrap();
    assert_eq!(config.providers.len(), 1);
    assert_eq!(
        config.providers[0].key(),
        "org.apache.mesos.rp.local.storage.local"
    );
    let profiles = std::fs::read(examples.join("profiles.json")).unwrap();
    slrp_profiles::document::ProfileMapping::parse(&profiles).unwrap();
}

#[test]
fn the_admin_tcp_endpoint_needs_a_token_file() {
    let s = Setup::new();
    let base = "resource_provider_config_dir = \"rp\"\n[agent]\nurl = \"http://127.0.0.1:5051\"\n";
    std::fs::write(s.dir.path().join("admin-token"), "t0ken-value \t\n").unwrap();
    std::fs::write(s.dir.path().join("empty-token"), "\n").unwrap();
    let refused = [
        (
            "[admin]\nlisten = \"127.0.0.1:5052\"\n",
            "setting 'admin.token_file'",
            "needs a token file",
        ),
        (
            "[admin]\nlisten = \"127.0.0.1:5052\"\ntoken_file = \"empty-token\"\n",
            "setting 'admin.token_file'",
            "the token file is empty",
        ),
        (
            "[admin]\nlisten = \"127.0.0.1:5052\"\ntoken_file = \"missing\"\n",
            "setting 'admin.token_file': reading",
            "No such file",
        ),
        (
            "[admin]\nlisten = \"localhost\"\ntoken_file = \"admin-token\"\n",
            "setting 'admin.listen'",
            "is not an address and port",
        ),
        (
            "[admin]\ntoken_file = \"admin-token\"\n",
            "setting 'admin.token_file'",
            "give 'admin.listen'",
        ),
    ];
    for (admin, top, cause) in refused {
        let e = s
            .resolve(&format!("{base}{admin}"), Overrides::default())
            .unwrap_err();
        let chain = DisplayChain(&e).to_string();
        assert!(e.to_string().starts_with(top), "{admin}: {chain}");
        assert!(chain.contains(cause), "{admin}: {chain}");
    }
    let config = s
        .resolve(
            &format!("{base}[admin]\nlisten = \"127.0.0.1:5052\"\ntoken_file = \"admin-token\"\n"),
            Overrides::default(),
        )
        .unwrap();
    let tcp = config.admin_tcp.clone().unwrap();
    assert_eq!(tcp.listen, "127.0.0.1:5052".parse().unwrap());
    assert!(
        tcp.token.matches(b"t0ken-value"),
        "the whitespace at the end is not the token's (as for slrp ctl)"
    );
    assert!(
        !format!("{config:?}").contains("t0ken"),
        "the token never shows"
    );

    // The flags set the same, relative to the working directory.
    let token = s.dir.path().join("admin-token");
    let config = s
        .resolve(
            base,
            Overrides {
                admin_listen: Some("[::1]:0".into()),
                admin_token_file: Some(token),
                ..Overrides::default()
            },
        )
        .unwrap();
    assert_eq!(config.admin_tcp.unwrap().listen, "[::1]:0".parse().unwrap());
    assert!(
        s.resolve(base, Overrides::default())
            .unwrap()
            .admin_tcp
            .is_none()
    );
}

#[test]
fn the_plugin_backend_comes_from_the_file_and_the_flag_wins() {
    let s = Setup::new();
    let base = "resource_provider_config_dir = \"rp\"\n[agent]\nurl = \"http://a:1\"\n";
    let config = s.resolve(base, Overrides::default()).unwrap();
    assert_eq!(config.plugin_backend, PluginBackend::Process);
    assert_eq!(config.remove_sandboxes, RemoveSandboxes::Never);

    let file = format!("{base}[plugins]\nbackend = \"agent\"\nremove_sandboxes = \"files\"\n");
    let config = s.resolve(&file, Overrides::default()).unwrap();
    assert_eq!(config.plugin_backend, PluginBackend::Agent);
    assert_eq!(config.remove_sandboxes, RemoveSandboxes::Files);

    let flags = Overrides {
        plugin_backend: Some("process".into()),
        ..Overrides::default()
    };
    let config = s.resolve(&file, flags).unwrap();
    assert_eq!(config.plugin_backend, PluginBackend::Process);
    let flags = Overrides {
        plugin_backend: Some("agent".into()),
        ..Overrides::default()
    };
    assert_eq!(
        s.resolve(base, flags).unwrap().plugin_backend,
        PluginBackend::Agent
    );
}

/// A provider whose plugin one backend can run and the other cannot: refused at
/// configuration time naming the file, accepted with the other backend.
fn per_backend(document: &Value, refused_by: PluginBackend, text: &str) {
    let s = Setup::new();
    let path = write(&s.dir.path().join("rp"), "test.json", document);
    let toml = |backend: &str| {
        format!(
            "resource_provider_config_dir = \"rp\"\n[agent]\nurl = \"http://a:1\"\n[plugins]\nbackend = \"{backend}\"\n"
        )
    };
    let (refusing, accepting) = match refused_by {
        PluginBackend::Process => ("process", "agent"),
        PluginBackend::Agent => ("agent", "process"),
    };
    let err = s
        .resolve(&toml(refusing), Overrides::default())
        .expect_err(refusing);
    assert!(
        matches!(err, ConfigError::InvalidProvider { .. }),
        "{err:?}"
    );
    let chain = DisplayChain(&err).to_string();
    assert!(chain.contains(&path.display().to_string()), "{chain}");
    assert!(chain.contains(text), "{chain}");
    s.resolve(&toml(accepting), Overrides::default())
        .unwrap_or_else(|e| panic!("{accepting}: {}", DisplayChain(&e)));
}

#[test]
fn a_plugin_without_a_command_runs_on_the_agent_only() {
    per_backend(
        &edited("/storage/plugin/containers/0/command", None),
        PluginBackend::Process,
        "no command",
    );
}

#[test]
fn a_secret_reference_runs_on_the_agent_only() {
    per_backend(
        &edited(
            "/storage/plugin/containers/0/command/environment",
            Some(json!({"variables": [{
                "name": "TOKEN",
                "type": "SECRET",
                "secret": {"type": "REFERENCE", "reference": {"name": "vault/token"}}
            }]})),
        ),
        PluginBackend::Process,
        "secret reference",
    );
}

#[test]
fn an_agent_container_id_longer_than_242_characters_is_refused_for_the_agent() {
    let long_type = vec!["segment"; 32].join(".");
    per_backend(
        &edited("/storage/plugin/type", Some(json!(long_type))),
        PluginBackend::Agent,
        "242",
    );
}

/// `[volume_health]` sets the poller's settings; unset ones keep their defaults.
#[test]
fn the_volume_health_table_sets_the_poller() {
    let s = Setup::new();
    let rp = "resource_provider_config_dir = \"rp\"\n[agent]\nurl = \"http://a:1\"\n";
    let defaults = s.resolve(rp, Overrides::default()).unwrap();
    assert_eq!(
        defaults.volume_health,
        slrp_provider::health::HealthConfig::default()
    );
    assert_eq!(
        defaults.volume_health.interval,
        std::time::Duration::from_secs(60)
    );
    let set = s
        .resolve(
            &format!(
                "{rp}[volume_health]\nenabled = false\ninterval = \"5m\"\nconcurrency = 2\ntimeout = \"3s\"\n"
            ),
            Overrides::default(),
        )
        .unwrap()
        .volume_health;
    assert!(!set.enabled);
    assert_eq!(set.interval, std::time::Duration::from_secs(300));
    assert_eq!(set.concurrency, 2);
    assert_eq!(set.timeout, std::time::Duration::from_secs(3));
}
