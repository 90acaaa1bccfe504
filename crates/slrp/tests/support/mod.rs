//! The process-level harness of `slrp run`: an embedded manager in the test process (real
//! HTTP on loopback), provider configs in Mesos's format whose plugin is the bundled
//! `slrp-csi-local`, and the daemon as a child process.
//!
//! A test observes only what a Mesos agent would (the manager's messages: SUBSCRIBE,
//! UPDATE_STATE with resources) plus the daemon's admin endpoint
//! (`<state-dir>/admin.sock`). Every wait has a timeout and, when it expires, panics with
//! the daemon's log. Dropping a [`Cluster`] kills the daemon and every plugin process
//! started under its directory (also when the test panics), so no process outlives a test.

// Shared by several test binaries; each uses a part.
#![allow(dead_code, unreachable_pub, missing_docs)]

pub mod ops;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use slrp_manager::{
    AckPolicy, ApplyRequest, EmbeddedManager, Listen, ManagerConfig, ManagerGuard, ManagerHandle,
    ManagerMessage, OperationView, PublishError,
};
use slrp_proto::mesos::v1::resource_provider::call;
use slrp_proto::mesos::v1::{FrameworkId, OperationStatus, offer};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

/// The only local resource provider type (spec §10.1).
pub const RP_TYPE: &str = "org.apache.mesos.rp.local.storage";
/// The plugin type of Mesos's test fixture (vendor `org.apache.mesos.csi.test.<name>`).
pub const PLUGIN_TYPE: &str = "org.apache.mesos.csi.test";
/// The role of the fixture's default reservation.
pub const DEFAULT_ROLE: &str = "storage";

/// The manager's `--jwt_secret_key` under [`DaemonOptions::agent_backend`] (a test secret:
/// nothing outside the test's loopback manager accepts it).
pub const JWT_SECRET: &str = "slrp-e2e-jwt-secret";

/// Mesos's `cid_prefix` of a local resource provider (spec §4.1.2): the type with `.`
/// replaced by `-`, the name, and `--`.
pub fn cid_prefix(rp_name: &str) -> String {
    format!("{}-{rp_name}--", RP_TYPE.replace('.', "-"))
}

/// How long any single wait may take before the test fails (a hang guard: a healthy run
/// takes a fraction of it, even on 2 busy cores).
pub const WAIT: Duration = Duration::from_secs(60);

/// The daemon's first resend of an unacknowledged operation status update (Mesos: 10 s).
pub const STATUS_RETRY_MIN: Duration = Duration::from_millis(200);
/// The longest wait between resends (Mesos: 10 min).
pub const STATUS_RETRY_MAX: Duration = Duration::from_millis(1600);
/// The first retry of a transiently failed CreateVolume/DeleteVolume (Mesos: 10 s).
pub const CSI_RETRY_MIN: Duration = Duration::from_millis(50);
/// The longest wait between those retries (Mesos: 10 min).
pub const CSI_RETRY_MAX: Duration = Duration::from_millis(400);

/// One provider of the cluster: its ResourceProviderInfo and its plugin's flags.
#[derive(Debug, Clone)]
pub struct ProviderSpec {
    /// `ResourceProviderInfo.name`.
    pub name: String,
    /// `storage.plugin.name` (the plugin type is [`PLUGIN_TYPE`]).
    pub plugin_name: String,
    /// `--csi-version` of the plugin.
    pub csi_version: &'static str,
    /// `--pool NAME=SIZE` flags of the plugin.
    pub pools: Vec<String>,
    /// `storage.reconciliation_interval_seconds` (Mesos's fixture: 0).
    pub reconciliation_interval_seconds: f64,
}

impl ProviderSpec {
    /// Mesos's fixture: provider `test`, plugin `local` (CSI v1) with a 4 GiB pool,
    /// periodic reconciliation off.
    pub fn fixture() -> Self {
        Self::named("test", "local")
    }

    /// The same with the plugin speaking CSI `version` (`"v1"` or `"v0"`).
    #[must_use]
    pub fn csi(mut self, version: &'static str) -> Self {
        self.csi_version = version;
        self
    }

    /// The fixture under other names.
    pub fn named(name: &str, plugin_name: &str) -> Self {
        Self {
            name: name.into(),
            plugin_name: plugin_name.into(),
            csi_version: "v1",
            pools: vec!["default=4GiB".into()],
            reconciliation_interval_seconds: 0.0,
        }
    }

    /// `<plugin type>.<plugin name>`, the resources' `disk.source.vendor`.
    pub fn vendor(&self) -> String {
        format!("{PLUGIN_TYPE}.{}", self.plugin_name)
    }

    /// `<rp type>.<rp name>`, the provider's metrics prefix and state directory name.
    pub fn key(&self) -> String {
        format!("{RP_TYPE}.{}", self.name)
    }
}

/// An UPDATE_STATE as the manager received it, resources in Mesos's JSON form.
#[derive(Debug, Clone)]
pub struct Update {
    pub provider_id: String,
    pub resources: Vec<Value>,
    pub resource_version: Vec<u8>,
}

impl Update {
    /// From the fields of a [`ManagerMessage::UpdateState`].
    pub fn new(
        provider_id: String,
        resources: &[slrp_proto::mesos::v1::Resource],
        version: &slrp_proto::mesos::v1::Uuid,
    ) -> Self {
        Self {
            provider_id,
            resources: resources
                .iter()
                .map(|r| slrp_wire::json::to_value(r).unwrap())
                .collect(),
            resource_version: version.value.clone(),
        }
    }

    /// The storage pools: RAW, vendor, profile, no id (Mesos's `isStoragePool`).
    pub fn pools(&self) -> Vec<&Value> {
        self.resources
            .iter()
            .filter(|r| source(r)["type"] == "RAW" && source(r)["id"].is_null())
            .collect()
    }

    /// The storage pool of `profile`, if reported.
    pub fn pool(&self, profile: &str) -> Option<&Value> {
        self.pools()
            .into_iter()
            .find(|r| source(r)["profile"] == profile)
    }

    /// The disks with an id (pre-existing or created).
    pub fn disks(&self) -> Vec<&Value> {
        self.resources
            .iter()
            .filter(|r| !source(r)["id"].is_null())
            .collect()
    }
}

/// Resources as sorted JSON texts, to compare two totals regardless of order.
pub fn sorted(resources: &[Value]) -> Vec<String> {
    let mut v: Vec<String> = resources.iter().map(Value::to_string).collect();
    v.sort();
    v
}

/// [`sorted`] of one resource.
pub fn sorted_one(resource: &Value) -> Vec<String> {
    sorted(std::slice::from_ref(resource))
}

/// `disk.source` of a resource (`Value::Null` if absent).
pub fn source(r: &Value) -> &Value {
    &r["disk"]["source"]
}

/// A resource's size in MB.
pub fn mb(r: &Value) -> f64 {
    r["scalar"]["value"].as_f64().unwrap_or(f64::NAN)
}

/// `disk.source.metadata` as a map (empty if absent).
pub fn metadata(r: &Value) -> BTreeMap<String, String> {
    source(r)["metadata"]["labels"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|l| {
            (
                l["key"].as_str().unwrap_or_default().to_owned(),
                l["value"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// Asserts the shape every provider resource has (spec §6.1): `disk`, SCALAR, the
/// provider id, the fixture's default reservation, the plugin's vendor.
pub fn assert_provider_resource(r: &Value, spec: &ProviderSpec, provider_id: &str) {
    assert_eq!(r["name"], "disk", "{r}");
    assert_eq!(r["type"], "SCALAR", "{r}");
    assert_eq!(r["provider_id"]["value"], provider_id, "{r}");
    assert_eq!(
        r["reservations"],
        json!([{"type": "DYNAMIC", "role": DEFAULT_ROLE}]),
        "{r}"
    );
    assert_eq!(source(r)["vendor"], spec.vendor(), "{r}");
}

/// A profile document (Mesos URI adaptor format) with `names`, each selecting the test
/// plugin type with capability `mount {}` + SINGLE_NODE_WRITER and no parameters, as
/// Mesos's fixture does.
pub fn profiles(names: &[&str]) -> Value {
    let matrix: serde_json::Map<String, Value> = names
        .iter()
        .map(|n| {
            (
                (*n).to_owned(),
                json!({
                    "csi_plugin_type_selector": {"plugin_type": PLUGIN_TYPE},
                    "volume_capabilities": {
                        "mount": {},
                        "access_mode": {"mode": "SINGLE_NODE_WRITER"}
                    }
                }),
            )
        })
        .collect();
    json!({ "profile_matrix": matrix })
}

/// The daemon child process; SIGKILLed on drop.
#[derive(Debug)]
pub struct Daemon {
    child: tokio::process::Child,
}

impl Daemon {
    /// `None` once reaped.
    fn pid(&self) -> Option<Pid> {
        self.child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .map(Pid::from_raw)
    }
}

/// How the daemon is started (flags and config of `slrp run`).
#[derive(Debug, Clone, Default)]
pub struct DaemonOptions {
    /// The agent URL's transport: protobuf (default) or JSON.
    pub json: bool,
    /// How often the profile document is re-read; `None`: no `--disk-profiles` at all.
    pub profiles_poll: Option<Duration>,
    /// `plugins_on_exit = "leave"` instead of `"stop"`.
    pub leave_plugins: bool,
    /// The daemon's `--agent` instead of the manager's URL (e.g. a fault proxy in front
    /// of the manager).
    pub agent_url: Option<String>,
    /// More `[agent]` settings of the config file, as TOML lines (`call_timeout = "2s"`).
    pub agent_settings: Vec<String>,
    /// Serve `profiles.json` over HTTP on loopback (`--disk-profiles http://…`), as Mesos's
    /// ProfileAppeared does, instead of naming the file.
    pub profiles_http: bool,
    /// More arguments after `slrp run`'s (e.g. `--log-format json`).
    pub extra_args: Vec<String>,
    /// More environment for the daemon (e.g. `SLRP_LOG_FORMAT=json`).
    pub env: Vec<(String, String)>,
    /// Plugins run as the manager's standalone containers (`slrp run --plugin-backend
    /// agent`): the manager keeps their sandboxes under `<work dir>/containers` (so they
    /// survive its restarts, as under an agent), verifies JWTs under [`JWT_SECRET`], and the
    /// daemon's `[agent] token_file` holds a JWT with the first provider's `cid_prefix`, as
    /// a Mesos agent started with `--jwt_secret_key` mints it.
    pub agent_backend: bool,
    /// The agent ID the manager serves from its first start (`None`: a generated one), as
    /// an agent whose `meta/slaves/latest` names it.
    pub manager_agent_id: Option<String>,
    /// Providers the manager's registrar admits at its first start, as a Mesos agent
    /// whose registrar knew them (the import test's Mesos provider).
    pub preadmitted: Vec<slrp_manager::registrar::ProviderRecord>,
}

impl DaemonOptions {
    /// Profiles from the cluster's `profiles.json`, re-read every 100 ms.
    pub fn with_profiles() -> Self {
        Self {
            profiles_poll: Some(Duration::from_millis(100)),
            ..Self::default()
        }
    }
}

/// A manager, a state directory and the daemon's providers, all under one temporary
/// directory.
#[derive(Debug)]
pub struct Cluster {
    /// The test's directory (see [`Cluster::new`] for the layout).
    pub dir: tempfile::TempDir,
    pub specs: Vec<ProviderSpec>,
    pub options: DaemonOptions,
    manager: Option<(ManagerHandle, ManagerGuard)>,
    /// Subscribed when the manager started, so nothing it observed is missed.
    messages: Option<broadcast::Receiver<ManagerMessage>>,
    /// The manager's address, kept across manager restarts (the daemon's `--agent`).
    addr: Option<SocketAddr>,
    /// The agent ID the manager serves (`None`: the one in its registry).
    agent_id: Option<String>,
    daemon: Option<Daemon>,
    /// Daemon starts so far (each appends to the same log, separated by a banner).
    starts: usize,
    /// The profile document's URI (`file://…`, or the HTTP server's).
    profiles_uri: String,
    /// The HTTP server of `profiles.json` ([`DaemonOptions::profiles_http`]).
    profile_server: Option<tokio::task::JoinHandle<()>>,
    /// A failure already printed the daemon's log (the drop need not repeat it).
    log_shown: std::cell::Cell<bool>,
    /// The latest manager messages that a wait for one kind passed over (oldest first,
    /// at most [`SKIPPED_SHOWN`]). A wait that times out lists them: a message a test
    /// waits for may have been consumed by an earlier wait for something else.
    skipped: std::collections::VecDeque<String>,
    /// The hang guard of every wait ([`WAIT`] unless a harness test shortens it).
    pub wait: Duration,
    /// How the manager acknowledges status updates when it (re)starts.
    pub ack_policy: AckPolicy,
    /// Protocol violations counted by earlier manager instances (a restart resets the
    /// manager's counter).
    violations_before: f64,
    /// Boot ids the daemon was started under by [`Cluster::simulate_reboot`] (`None`: the
    /// kernel's).
    boot_id: Option<String>,
}

/// How many passed-over manager messages a timed-out wait lists.
const SKIPPED_SHOWN: usize = 16;

/// One line per manager message for failure reports: the kind, the provider and, for an
/// UPDATE_STATE, its storage pools' profiles and disk ids (what tests wait for).
pub fn describe(m: &ManagerMessage) -> String {
    match m {
        ManagerMessage::Subscribed { info } => format!(
            "SUBSCRIBED {} (id {})",
            info.name,
            info.id.as_ref().map_or("none", |id| id.value.as_str())
        ),
        ManagerMessage::UpdateState {
            provider_id,
            resources,
            resource_version_uuid,
            ..
        } => {
            let u = Update::new(provider_id.clone(), resources, resource_version_uuid);
            let pools: Vec<&str> = u
                .pools()
                .iter()
                .filter_map(|r| source(r)["profile"].as_str())
                .collect();
            let disks: Vec<&str> = u
                .disks()
                .iter()
                .filter_map(|r| source(r)["id"].as_str())
                .collect();
            format!(
                "UPDATE_STATE {provider_id}: {} resources, pools {pools:?}, disks {disks:?}",
                resources.len()
            )
        }
        ManagerMessage::UpdateOperationStatus { provider_id, .. } => {
            format!("UPDATE_OPERATION_STATUS {provider_id}")
        }
        ManagerMessage::Disconnected { provider_id } => format!("DISCONNECTED {provider_id}"),
        ManagerMessage::Removed { provider_id } => format!("REMOVED {provider_id}"),
        ManagerMessage::ProtocolViolation {
            provider_id,
            reason,
        } => format!("PROTOCOL_VIOLATION {provider_id}: {reason}"),
        ManagerMessage::ContainerLaunched { id } => format!("CONTAINER_LAUNCHED {id}"),
        ManagerMessage::ContainerTerminated { id, status } => {
            format!("CONTAINER_TERMINATED {id} (status {status:?})")
        }
    }
}

impl Cluster {
    /// Lays out `dir`: `manager/` (registrar), `state/` (`--state-dir`), `work/`
    /// (`--work-dir`), `rp/` (`--resource-provider-config-dir`, one JSON per spec),
    /// `plugins/<name>/{root,faults.json}`, `profiles.json`, `slrp.toml`, `daemon.log`; and
    /// starts the manager. The daemon is not started.
    pub async fn new(specs: Vec<ProviderSpec>, options: DaemonOptions) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let agent_id = options.manager_agent_id.clone();
        let mut cluster = Self {
            dir,
            specs,
            options,
            manager: None,
            messages: None,
            addr: None,
            agent_id,
            daemon: None,
            starts: 0,
            profiles_uri: String::new(),
            profile_server: None,
            log_shown: std::cell::Cell::new(false),
            skipped: std::collections::VecDeque::new(),
            wait: WAIT,
            ack_policy: AckPolicy::Auto,
            violations_before: 0.0,
            boot_id: None,
        };
        for sub in ["manager", "state", "work", "rp"] {
            std::fs::create_dir_all(cluster.path(sub)).unwrap();
        }
        for spec in cluster.specs.clone() {
            std::fs::create_dir_all(cluster.plugin_root(&spec.name)).unwrap();
            std::fs::write(cluster.faults_file(&spec.name), "[]").unwrap();
            let info = cluster.provider_info(&spec);
            write_atomic(
                &cluster.path("rp").join(format!("{}.json", spec.name)),
                &serde_json::to_vec_pretty(&info).unwrap(),
            );
        }
        cluster.set_profiles(&profiles(&[]));
        cluster.profiles_uri = format!("file://{}", cluster.path("profiles.json").display());
        if cluster.options.profiles_http {
            let (addr, task) = serve_file(cluster.path("profiles.json")).await;
            cluster.profiles_uri = format!("http://{addr}/profiles");
            cluster.profile_server = Some(task);
        }
        cluster.write_config();
        cluster.start_manager().await;
        cluster
    }

    /// The fixture's single provider with default options.
    pub async fn fixture() -> Self {
        Self::fixture_csi("v1").await
    }

    /// The same with the plugin speaking CSI `version`.
    pub async fn fixture_csi(version: &'static str) -> Self {
        Self::new(
            vec![ProviderSpec::fixture().csi(version)],
            DaemonOptions::default(),
        )
        .await
    }

    pub fn path(&self, sub: &str) -> PathBuf {
        self.dir.path().join(sub)
    }

    pub fn state_dir(&self) -> PathBuf {
        self.path("state")
    }

    pub fn admin_socket(&self) -> PathBuf {
        self.state_dir().join("admin.sock")
    }

    pub fn plugin_root(&self, provider: &str) -> PathBuf {
        self.path("plugins").join(provider).join("root")
    }

    pub fn faults_file(&self, provider: &str) -> PathBuf {
        self.path("plugins").join(provider).join("faults.json")
    }

    pub fn spec(&self, provider: &str) -> &ProviderSpec {
        self.specs
            .iter()
            .find(|s| s.name == provider)
            .expect("no such provider in this cluster")
    }

    /// The ResourceProviderInfo JSON of `spec`, as Mesos's fixture writes it (spec §11).
    fn provider_info(&self, spec: &ProviderSpec) -> Value {
        let bin = slrp_test_support::csi_local_bin();
        let mut args = vec![
            "slrp-csi-local".to_owned(),
            "--root".to_owned(),
            self.plugin_root(&spec.name).display().to_string(),
            "--node-id".to_owned(),
            "test-node".to_owned(),
            "--csi-version".to_owned(),
            spec.csi_version.to_owned(),
            "--faults-file".to_owned(),
            self.faults_file(&spec.name).display().to_string(),
        ];
        for pool in &spec.pools {
            args.extend(["--pool".to_owned(), pool.clone()]);
        }
        json!({
            "type": RP_TYPE,
            "name": spec.name,
            "default_reservations": [{"type": "DYNAMIC", "role": DEFAULT_ROLE}],
            "storage": {
                "plugin": {
                    "type": PLUGIN_TYPE,
                    "name": spec.plugin_name,
                    "containers": [{
                        "services": ["CONTROLLER_SERVICE", "NODE_SERVICE"],
                        "command": {
                            "shell": false,
                            "value": bin.display().to_string(),
                            "arguments": args,
                        },
                        "resources": [
                            {"name": "cpus", "type": "SCALAR", "scalar": {"value": 0.1}},
                            {"name": "mem", "type": "SCALAR", "scalar": {"value": 1024}}
                        ]
                    }]
                },
                "reconciliation_interval_seconds": spec.reconciliation_interval_seconds
            }
        })
    }

    /// slrp's own config file (`--config`): what has no flag. Reconnects are quick
    /// (100 ms to 1 s) so that restarts of the manager do not make the tests slow.
    fn write_config(&self) {
        let mut toml = format!(
            "plugins_on_exit = \"{}\"\n[agent]\nbackoff_base = \"100ms\"\nbackoff_max = \"1s\"\n",
            if self.options.leave_plugins {
                "leave"
            } else {
                "stop"
            }
        );
        if self.options.json {
            toml.push_str("content_type = \"json\"\n");
        }
        for line in &self.options.agent_settings {
            toml.push_str(line);
            toml.push('\n');
        }
        if self.options.agent_backend {
            let claims = json!({"cid_prefix": cid_prefix(&self.specs[0].name)}).to_string();
            let token = slrp_manager::jwt::mint(&slrp_manager::Secret::new(JWT_SECRET), &claims);
            write_atomic(&self.path("agent.token"), token.as_bytes());
            toml.push_str(&format!(
                "token_file = \"{}\"\n",
                self.path("agent.token").display()
            ));
        }
        // Mesos's 10 s retries would make every retry test slow; the bounds keep the
        // doubling visible (several steps before the ceiling).
        toml.push_str(&format!(
            "[retries]\nstatus_update_min = \"{}ms\"\nstatus_update_max = \"{}ms\"\ncsi_min = \"{}ms\"\ncsi_max = \"{}ms\"\n",
            STATUS_RETRY_MIN.as_millis(),
            STATUS_RETRY_MAX.as_millis(),
            CSI_RETRY_MIN.as_millis(),
            CSI_RETRY_MAX.as_millis(),
        ));
        if let Some(poll) = self.options.profiles_poll {
            toml.push_str(&format!(
                "[disk_profiles]\nuri = \"{}\"\npoll_interval = \"{}ms\"\n",
                self.profiles_uri,
                poll.as_millis()
            ));
        }
        write_atomic(&self.path("slrp.toml"), toml.as_bytes());
    }

    /// Replaces the profile document atomically (the adaptor never reads half a file).
    pub fn set_profiles(&self, doc: &Value) {
        write_atomic(
            &self.path("profiles.json"),
            &serde_json::to_vec_pretty(doc).unwrap(),
        );
    }

    /// Replaces a provider's plugin fault rules (see docs/csi-local.md).
    pub fn set_faults(&self, provider: &str, rules: &Value) {
        write_atomic(
            &self.faults_file(provider),
            &serde_json::to_vec(rules).unwrap(),
        );
    }

    /// The fault rules as the plugin left them (counted rules are decremented).
    pub fn faults_left(&self, provider: &str) -> Value {
        serde_json::from_slice(&std::fs::read(self.faults_file(provider)).unwrap()).unwrap()
    }

    /// How many calls of `rpc` the plugin answered since [`Cluster::count_calls`] set up
    /// its counter: a counted no-op rule (`delay_ms: 0`) is decremented once per call.
    pub fn calls(&self, provider: &str, rpc: &str) -> u64 {
        let rules = self.faults_left(provider);
        let left = rules
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["rpc"] == rpc)
            .map_or(0, |r| r["times"].as_u64().unwrap());
        COUNTER - left
    }

    /// Counts every call of `rpcs` from now on (see [`Cluster::calls`]).
    pub fn count_calls(&self, provider: &str, rpcs: &[&str]) {
        let rules: Vec<Value> = rpcs
            .iter()
            .map(|rpc| json!({"rpc": rpc, "delay_ms": 0, "times": COUNTER}))
            .collect();
        self.set_faults(provider, &Value::Array(rules));
    }

    /// Places a pre-existing volume in a provider's plugin: a sparse image of `bytes`
    /// imported as `import-loop-<name>` (docs/csi-local.md, "Imported volumes").
    pub fn import_volume(&self, provider: &str, name: &str, bytes: u64) -> String {
        let dir = self.plugin_root(provider).join("import").join("loop");
        std::fs::create_dir_all(&dir).unwrap();
        let f = std::fs::File::create(dir.join(format!("{name}.img"))).unwrap();
        f.set_len(bytes).unwrap();
        format!("import-loop-{name}")
    }

    // ---- the manager ----

    async fn start_manager(&mut self) {
        let listen = match self.addr {
            Some(addr) => Listen::Tcp(addr),
            None => ManagerConfig::loopback().listen,
        };
        let mut config = ManagerConfig::new(listen);
        config.ack_policy = self.ack_policy;
        // The crash storm's status updates and resends must not overrun the test's receiver.
        config.message_buffer = 1 << 14;
        config.state_dir = Some(self.path("manager"));
        config.agent_id.clone_from(&self.agent_id);
        if self.options.agent_backend {
            config.containers_dir = Some(self.agent_containers_dir());
            config.jwt_secret = Some(slrp_manager::Secret::new(JWT_SECRET));
        }
        if self.addr.is_none() {
            config.preadmitted.clone_from(&self.options.preadmitted);
        }
        let (handle, guard) = EmbeddedManager::spawn(config, CancellationToken::new())
            .await
            .unwrap();
        let slrp_manager::Endpoint::Tcp(addr) = handle.endpoint().clone() else {
            unreachable!("the harness listens on TCP")
        };
        self.addr = Some(addr);
        self.messages = Some(handle.messages());
        self.manager = Some((handle, guard));
    }

    /// Stops the manager (every stream closes; connections are refused) until
    /// [`Cluster::resume_manager`], as an agent that is down.
    pub async fn stop_manager(&mut self) {
        self.violations_before = self.protocol_violations();
        let (_, guard) = self.manager.take().expect("manager not running");
        guard.shutdown().await;
        self.messages = None;
    }

    /// Starts the stopped manager again on the same address and registry.
    pub async fn resume_manager(&mut self) {
        assert!(self.manager.is_none(), "manager already running");
        self.start_manager().await;
    }

    /// Restarts the manager as an agent that registered with a new agent ID `agent_id`:
    /// same address, but its registry of providers starts empty (spec §3.6, §8.6).
    pub async fn restart_manager_with_agent_id(&mut self, agent_id: &str) {
        self.agent_id = Some(agent_id.to_owned());
        self.restart_manager().await;
    }

    /// Stops the manager (every stream closes) and starts it again on the same address
    /// and registrar state, as an agent restart that keeps its ID.
    pub async fn restart_manager(&mut self) {
        self.stop_manager().await;
        self.start_manager().await;
    }

    /// Where the manager keeps its standalone containers' sandboxes and records under
    /// [`DaemonOptions::agent_backend`]: Mesos's `<agent work dir>/containers`.
    pub fn agent_containers_dir(&self) -> PathBuf {
        self.path("work").join("containers")
    }

    /// The standalone containers the manager runs (launched through its operator API).
    pub async fn agent_containers(&self) -> Vec<slrp_manager::ContainerView> {
        self.manager().containers().await
    }

    /// The plugin container of `provider` as the agent runs it: its pid while it runs.
    /// Fails unless exactly one container of the provider's `cid_prefix` is listed.
    pub async fn agent_plugin_container(&self, provider: &str) -> slrp_manager::ContainerView {
        let prefix = cid_prefix(provider);
        let mine: Vec<_> = self
            .agent_containers()
            .await
            .into_iter()
            .filter(|c| c.id.starts_with(&prefix))
            .collect();
        match &mine[..] {
            [one] => one.clone(),
            other => self.fail(&format!(
                "one agent container with prefix {prefix} expected, found {:?}",
                other.iter().map(|c| (&c.id, c.pid)).collect::<Vec<_>>()
            )),
        }
    }

    /// Waits until the manager runs `provider`'s plugin container with a pid other than
    /// `old` that is the one plugin process; returns that pid.
    pub async fn agent_plugin_relaunched(&self, provider: &str, old: i32) -> i32 {
        self.within(
            "the plugin container to be relaunched by the agent",
            async {
                loop {
                    let pids = self.plugin_pids(provider);
                    let listed = self.agent_plugin_pid(provider).await;
                    if let (Some(pid), [only]) = (listed, &pids[..])
                        && pid != old
                        && pid == *only
                    {
                        return pid;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            },
        )
        .await
    }

    /// The pid GET_CONTAINERS would report for `provider`'s running plugin container.
    async fn agent_plugin_pid(&self, provider: &str) -> Option<i32> {
        let prefix = cid_prefix(provider);
        self.agent_containers()
            .await
            .into_iter()
            .find(|c| c.id.starts_with(&prefix))
            .and_then(|c| c.pid)
    }

    pub fn manager(&self) -> &ManagerHandle {
        &self.manager.as_ref().expect("manager not running").0
    }

    /// The `--agent` URL.
    pub fn agent_url(&self) -> String {
        self.manager().endpoint().url()
    }

    /// The next manager observation, or a panic with the daemon's log after [`Cluster::wait`] or
    /// as soon as the daemon has exited (nothing more will come).
    pub async fn next_message(&mut self) -> ManagerMessage {
        let deadline = tokio::time::Instant::now() + self.wait;
        let Self {
            messages, daemon, ..
        } = self;
        let rx = messages.as_mut().expect("manager not running");
        let failure = loop {
            // Short slices, so that a daemon that died is noticed at once.
            match tokio::time::timeout(Duration::from_millis(100), rx.recv()).await {
                Ok(Ok(ManagerMessage::ProtocolViolation { reason, .. })) => {
                    break format!("protocol violation: {reason}");
                }
                Ok(Ok(m)) => return m,
                Ok(Err(broadcast::error::RecvError::Lagged(n))) => {
                    break format!("the test missed {n} manager messages (buffer too small)");
                }
                Ok(Err(broadcast::error::RecvError::Closed)) => break "the manager stopped".into(),
                Err(_) => {}
            }
            if let Some(d) = daemon.as_mut()
                && let Ok(Some(status)) = d.child.try_wait()
            {
                break format!("the daemon exited ({status}) while a manager message was awaited");
            }
            if tokio::time::Instant::now() > deadline {
                break "no manager message within the timeout".into();
            }
        };
        if self.skipped.is_empty() {
            self.fail(&failure)
        }
        let skipped: Vec<&str> = self.skipped.iter().map(String::as_str).collect();
        self.fail(&format!(
            "{failure}\nmessages that earlier waits passed over (was one of them what this \
             wait expects?):\n  {}",
            skipped.join("\n  ")
        ))
    }

    /// The next manager message, with no hang guard of its own (the caller bounds the
    /// wait); `None` once the manager stopped. A protocol violation fails the test.
    pub async fn next_raw_message(&mut self) -> Option<ManagerMessage> {
        let rx = self.messages.as_mut()?;
        let m = loop {
            match rx.recv().await {
                Ok(m) => break m,
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        };
        if let ManagerMessage::ProtocolViolation { reason, .. } = &m {
            self.fail(&format!("protocol violation: {reason}"));
        }
        Some(m)
    }

    /// Forgets every manager message not read yet (a test that did not read them for a
    /// while starts afresh rather than from a lagged buffer).
    pub fn drain_messages(&mut self) {
        self.messages = Some(self.manager().messages());
        self.skipped.clear();
    }

    /// Notes a message a wait passed over, for the report of a later timeout.
    fn skip(&mut self, m: &ManagerMessage) {
        if self.skipped.len() == SKIPPED_SHOWN {
            self.skipped.pop_front();
        }
        self.skipped.push_back(describe(m));
    }

    /// Waits for the next SUBSCRIBE admitted by the manager; returns the provider's info
    /// as JSON (with its `id`).
    pub async fn next_subscribed(&mut self) -> Value {
        loop {
            match self.next_message().await {
                ManagerMessage::Subscribed { info } => {
                    return slrp_wire::json::to_value(&info).unwrap();
                }
                other => self.skip(&other),
            }
        }
    }

    /// Waits for the next UPDATE_STATE (of any provider).
    pub async fn next_update(&mut self) -> Update {
        loop {
            match self.next_message().await {
                ManagerMessage::UpdateState {
                    provider_id,
                    resources,
                    resource_version_uuid,
                    ..
                } => return Update::new(provider_id, &resources, &resource_version_uuid),
                other => self.skip(&other),
            }
        }
    }

    /// Waits for an UPDATE_STATE for which `want` holds, skipping others.
    pub async fn update_where(&mut self, want: impl Fn(&Update) -> bool) -> Update {
        loop {
            let m = self.next_message().await;
            if let ManagerMessage::UpdateState {
                provider_id,
                resources,
                resource_version_uuid,
                ..
            } = &m
            {
                let u = Update::new(provider_id.clone(), resources, resource_version_uuid);
                if want(&u) {
                    return u;
                }
            }
            self.skip(&m);
        }
    }

    // ---- the daemon ----

    /// Starts `slrp run` with this cluster's flags; output goes to `daemon.log`.
    pub fn start_daemon(&mut self) {
        assert!(self.daemon.is_none(), "daemon already running");
        self.starts += 1;
        let log_path = self.path("daemon.log");
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .unwrap();
        std::io::Write::write_all(
            &mut log,
            format!("==== daemon start {} ====\n", self.starts).as_bytes(),
        )
        .unwrap();
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_slrp"));
        cmd.arg("run")
            .arg("--config")
            .arg(self.path("slrp.toml"))
            .arg("--agent")
            .arg(
                self.options
                    .agent_url
                    .clone()
                    .unwrap_or_else(|| self.agent_url()),
            )
            .arg("--work-dir")
            .arg(self.path("work"))
            .arg("--state-dir")
            .arg(self.state_dir())
            .arg("--resource-provider-config-dir")
            .arg(self.path("rp"));
        if self.options.profiles_poll.is_some() {
            cmd.arg("--disk-profiles").arg(&self.profiles_uri);
        }
        if self.options.agent_backend {
            cmd.arg("--plugin-backend").arg("agent");
        }
        if self.boot_id.is_some() {
            cmd.env("SLRP_BOOT_ID_FILE", self.path("boot_id"));
        }
        // The options' environment comes last, so that it can override `SLRP_LOG`.
        cmd.env("SLRP_LOG", "info")
            .args(&self.options.extra_args)
            .envs(self.options.env.iter().map(|(k, v)| (k, v)));
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        self.daemon = Some(Daemon { child });
    }

    /// SIGTERM; the exit must be clean (status 0), else the test fails with the log.
    pub async fn stop_daemon_cleanly(&mut self) {
        let status = self.stop_daemon().await;
        if !status.success() {
            self.fail(&format!("the daemon exited with {status} after SIGTERM"));
        }
    }

    /// A clean stop and a start: a restart of the provider on the same state.
    pub async fn restart_daemon(&mut self) {
        self.stop_daemon_cleanly().await;
        self.start_daemon();
    }

    /// SIGTERM, then waits for the exit; returns its status.
    pub async fn stop_daemon(&mut self) -> ExitStatus {
        self.signal_and_wait(Signal::SIGTERM).await
    }

    /// SIGKILL, then reaps it (plugins it started may live on, as after a crash).
    pub async fn kill_daemon(&mut self) -> ExitStatus {
        self.signal_and_wait(Signal::SIGKILL).await
    }

    async fn signal_and_wait(&mut self, signal: Signal) -> ExitStatus {
        let Some(pid) = self.daemon.as_ref().expect("daemon not running").pid() else {
            self.fail("the daemon had already exited")
        };
        kill(pid, signal).unwrap();
        let mut daemon = self.daemon.take().unwrap();
        match tokio::time::timeout(self.wait, daemon.child.wait()).await {
            Ok(status) => status.unwrap(),
            Err(_) => {
                self.daemon = Some(daemon);
                self.fail(&format!("the daemon did not exit after {signal}"))
            }
        }
    }

    /// The orderly end of a test: SIGTERM, exit status 0, and no plugin process left
    /// (with `plugins_on_exit = "stop"`).
    pub async fn finish(mut self) {
        self.assert_no_protocol_violation();
        self.stop_daemon_cleanly().await;
        if !self.options.leave_plugins {
            self.wait_no_plugins().await;
        }
    }

    /// Waits until no plugin process of this cluster is left (their exit is observed by
    /// polling /proc: nothing else announces it).
    pub async fn wait_no_plugins(&self) {
        let dir = self.dir.path().to_owned();
        self.within("plugin processes to exit", async {
            while !processes_mentioning(&dir).is_empty() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    }

    /// Whether the daemon is still running (it has not exited on its own).
    pub fn daemon_running(&mut self) -> bool {
        self.daemon
            .as_mut()
            .is_some_and(|d| d.child.try_wait().unwrap().is_none())
    }

    /// The daemon's combined output so far.
    pub fn daemon_log(&self) -> String {
        std::fs::read_to_string(self.path("daemon.log")).unwrap_or_default()
    }

    /// Panics with `what` and the daemon's log.
    pub fn fail(&self, what: &str) -> ! {
        self.log_shown.set(true);
        panic!(
            "{what}\n---- daemon log ({}) ----\n{}---- end of daemon log ----",
            self.path("daemon.log").display(),
            self.daemon_log()
        )
    }

    /// Runs `f` with the hang guard [`Cluster::wait`]; on timeout fails with `what` and the
    /// log.
    pub async fn within<T>(&self, what: &str, f: impl Future<Output = T>) -> T {
        match tokio::time::timeout(self.wait, f).await {
            Ok(v) => v,
            Err(_) => self.fail(&format!("timed out: {what}")),
        }
    }

    // ---- the admin endpoint ----

    /// `GET path` on the admin socket: `(status, body)`, or `None` while nothing listens.
    pub async fn admin_get(&self, path: &str) -> Option<(u16, String)> {
        http_get_unix(&self.admin_socket(), path).await
    }

    /// `POST path` with a JSON body on the admin socket: `(status, body)`.
    pub async fn admin_post(&self, path: &str, body: &Value) -> (u16, String) {
        match http_unix(&self.admin_socket(), "POST", path, Some(body)).await {
            Some(answer) => answer,
            None => self.fail(&format!("POST {path}: no answer on the admin socket")),
        }
    }

    /// Polls until `GET path` answers (the daemon's admin endpoint is up); returns the
    /// body of a 200. Polling, since the endpoint signals readiness only by answering.
    pub async fn admin_ok(&self, path: &str) -> String {
        self.within(&format!("admin {path} answering 200"), async {
            loop {
                if let Some((200, body)) = self.admin_get(path).await {
                    return body;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
    }

    /// `/metrics/snapshot` as Mesos-style names → values.
    pub async fn snapshot(&self) -> BTreeMap<String, f64> {
        let body = self.admin_ok("/metrics/snapshot").await;
        let v: BTreeMap<String, Value> = serde_json::from_str(&body).unwrap_or_else(|e| {
            self.fail(&format!(
                "/metrics/snapshot is not a JSON object: {e}: {body}"
            ))
        });
        v.into_iter()
            .filter_map(|(k, v)| v.as_f64().map(|f| (k, f)))
            .collect()
    }

    /// One metric of a provider (`name` after `resource_providers/<type>.<name>/`).
    pub async fn provider_metric(&self, provider: &str, name: &str) -> f64 {
        let key = format!("resource_providers/{}/{name}", self.spec(provider).key());
        let snap = self.snapshot().await;
        match snap.get(&key) {
            Some(v) => *v,
            None => self.fail(&format!("metric {key} missing from {snap:?}")),
        }
    }

    /// Polls the snapshot until `want` holds for it; returns it. On timeout the failure
    /// shows the last snapshot seen.
    pub async fn snapshot_until(
        &self,
        what: &str,
        want: impl Fn(&BTreeMap<String, f64>) -> bool,
    ) -> BTreeMap<String, f64> {
        let last = std::cell::RefCell::new(BTreeMap::new());
        let got = tokio::time::timeout(self.wait, async {
            loop {
                let snap = self.snapshot().await;
                if want(&snap) {
                    return snap;
                }
                *last.borrow_mut() = snap;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        match got {
            Ok(snap) => snap,
            Err(_) => self.fail(&format!(
                "timed out: {what}; last snapshot: {:#?}",
                last.borrow()
            )),
        }
    }

    // ---- operations (the manager as agent and master, spec §2.9–§2.11) ----

    /// The provider id of `provider` (by name) as the manager knows it; fails if it is not
    /// subscribed.
    pub async fn provider_id(&self, provider: &str) -> String {
        let views = self.manager().providers().await.unwrap();
        match views.iter().find(|v| v.info.name == provider) {
            Some(v) => v.info.id.as_ref().map(|id| id.value.clone()).unwrap(),
            None => self.fail(&format!("provider {provider} is not subscribed")),
        }
    }

    /// The resource version of the first provider's last UPDATE_STATE, as the manager
    /// holds it (what [`ApplyRequest`] sends by default).
    pub async fn current_version(&self) -> Vec<u8> {
        let name = &self.specs[0].name;
        let views = self.manager().providers().await.unwrap();
        views
            .iter()
            .find(|v| &v.info.name == name)
            .and_then(|v| v.resource_version_uuid.as_ref())
            .map(|u| u.value.clone())
            .unwrap_or_else(|| self.fail("no UPDATE_STATE yet"))
    }

    /// The id of the single provider of this cluster.
    pub async fn the_provider_id(&self) -> String {
        let name = self.specs[0].name.clone();
        self.provider_id(&name).await
    }

    /// Applies `req` to the first provider through the manager (as agent: recorded,
    /// speculative conversions applied to its view, APPLY_OPERATION sent); returns the
    /// operation uuid.
    pub fn apply_request(&self, req: ApplyRequest) -> Boxed<'_, uuid::Uuid> {
        Box::pin(async move {
            let id = self.the_provider_id().await;
            match self.manager().apply_operation(&id, req).await {
                Ok(uuid) => uuid,
                Err(e) => self.fail(&format!(
                    "the manager refused the operation: {}",
                    slrp_types::DisplayChain(&e)
                )),
            }
        })
    }

    /// Applies `op` as the test framework's operation (framework id [`FRAMEWORK_ID`]).
    pub fn apply(&self, op: offer::Operation) -> Boxed<'_, uuid::Uuid> {
        let mut req = ApplyRequest::new(op);
        req.framework_id = Some(framework_id());
        self.apply_request(req)
    }

    /// Waits until the agent's record of `operation` is terminal.
    pub fn terminal(&self, operation: uuid::Uuid) -> Boxed<'_, OperationView> {
        Box::pin(async move {
            match self.manager().wait_terminal(operation, self.wait).await {
                Ok(view) => view,
                Err(e) => self.fail(&format!(
                    "operation {operation} did not become terminal: {}",
                    slrp_types::DisplayChain(&e)
                )),
            }
        })
    }

    /// Applies `op` and waits for its terminal status.
    pub fn run_op(&self, op: offer::Operation) -> Boxed<'_, OperationStatus> {
        Box::pin(async move {
            let uuid = self.apply(op).await;
            self.terminal(uuid).await.latest_status
        })
    }

    /// Applies `op`, asserts it FINISHED; returns its converted resources as JSON with
    /// their allocation info (as the status carries them).
    pub fn finished(&self, op: offer::Operation) -> Boxed<'_, Vec<serde_json::Value>> {
        Box::pin(async move {
            let what = describe_operation(&op);
            let status = self.run_op(op).await;
            if ops::state_name(&status) != "OPERATION_FINISHED" {
                self.fail(&format!(
                    "{what} did not finish: {}",
                    ops::status_json(&status)
                ));
            }
            ops::converted(&status)
        })
    }

    /// [`Cluster::finished`] for an operation that converts into exactly one resource.
    pub fn finished_one(&self, op: offer::Operation) -> Boxed<'_, serde_json::Value> {
        Box::pin(async move {
            match &self.finished(op).await[..] {
                [one] => one.clone(),
                other => self.fail(&format!("one converted resource expected: {other:?}")),
            }
        })
    }

    /// Applies `op`, asserts it ended in `state` (`"OPERATION_FAILED"`, …); returns its
    /// message.
    pub fn ended<'a>(&'a self, op: offer::Operation, state: &'a str) -> Boxed<'a, String> {
        Box::pin(async move {
            let what = describe_operation(&op);
            let status = self.run_op(op).await;
            if ops::state_name(&status) != state {
                self.fail(&format!(
                    "{what}: {state} expected: {}",
                    ops::status_json(&status)
                ));
            }
            status.message.unwrap_or_default()
        })
    }

    /// The agent's view of the first provider's total, as sorted JSON texts.
    pub async fn agent_total(&self) -> Vec<String> {
        let id = self.the_provider_id().await;
        let total = self.manager().agent_total(&id).await.unwrap();
        let json: Vec<serde_json::Value> = total.iter().map(ops::json_of).collect();
        sorted(&json)
    }

    /// PUBLISH_RESOURCES of `resources` (JSON, as offered) through the manager.
    pub async fn publish(&self, resources: &[serde_json::Value]) -> Result<(), PublishError> {
        let rs = resources.iter().map(ops::resource).collect();
        self.within(
            "PUBLISH_RESOURCES to be answered",
            self.manager().publish(rs),
        )
        .await
    }

    /// Publishes `resources` and fails the test if the provider answers FAILED.
    pub async fn published(&self, resources: &[serde_json::Value]) {
        if let Err(e) = self.publish(resources).await {
            self.fail(&format!(
                "publishing failed: {}",
                slrp_types::DisplayChain(&e)
            ));
        }
    }

    /// Where the agent finds a MOUNT disk's data: `<work dir>/<mount.root>/<id>/target`
    /// (spec §5.4 step 4, §6.8). The plugin's ids need no encoding.
    pub fn volume_path(&self, disk: &serde_json::Value) -> PathBuf {
        let id = source(disk)["id"].as_str().expect("a disk with an id");
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.'),
            "{id}"
        );
        let root = source(disk)["mount"]["root"]
            .as_str()
            .expect("a MOUNT disk");
        self.path("work").join(root).join(id).join("target")
    }

    /// The volume ids the plugin of `provider` holds (its records and its imports).
    pub fn plugin_volumes(&self, provider: &str) -> std::collections::BTreeSet<String> {
        let root = self.plugin_root(provider);
        let mut ids = std::collections::BTreeSet::new();
        for e in std::fs::read_dir(root.join("meta"))
            .into_iter()
            .flatten()
            .flatten()
        {
            if let Some(id) = e.file_name().to_str().and_then(|n| n.strip_suffix(".json")) {
                ids.insert(id.to_owned());
            }
        }
        for (kind, suffix) in [("dir", ""), ("loop", ".img")] {
            let dir = root.join("import").join(kind);
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                if let Some(name) = e.file_name().to_str().and_then(|n| n.strip_suffix(suffix)) {
                    ids.insert(format!("import-{kind}-{name}"));
                }
            }
        }
        ids
    }

    /// The next UPDATE_OPERATION_STATUS the manager received (skipping other messages).
    pub async fn next_status_update(&mut self) -> call::UpdateOperationStatus {
        loop {
            match self.next_message().await {
                ManagerMessage::UpdateOperationStatus { update, .. } => return update,
                other => self.skip(&other),
            }
        }
    }

    /// Changes the manager's acknowledgement policy now and for its later restarts.
    pub fn set_ack_policy(&mut self, policy: AckPolicy) {
        self.ack_policy = policy;
        self.manager().set_ack_policy(policy);
    }

    /// Protocol violations the manager counted since the cluster started (a Mesos agent
    /// would have aborted on each).
    pub fn protocol_violations(&self) -> f64 {
        let current = self.manager.as_ref().map_or(0.0, |(m, _)| {
            m.metrics()
                .snapshot()
                .get(slrp_manager::metrics::PROTOCOL_VIOLATIONS)
                .copied()
                .unwrap_or(0.0)
        });
        self.violations_before + current
    }

    /// Fails the test if the manager saw a protocol violation (also one no wait read).
    pub fn assert_no_protocol_violation(&self) {
        let n = self.protocol_violations();
        if n != 0.0 {
            self.fail(&format!(
                "the manager counted {n} protocol violations (a Mesos agent aborts on them)"
            ));
        }
    }

    /// A power loss and reboot of the host (Mesos's `...WithReboot` tests): the daemon and
    /// its plugins die (SIGKILL), every mount under the test directory goes away and its
    /// loop devices are detached, and the next start sees a new boot id (through
    /// `SLRP_BOOT_ID_FILE`). The daemon is not restarted.
    pub async fn simulate_reboot(&mut self) {
        if self.daemon.is_some() {
            self.kill_daemon().await;
        }
        for pid in processes_mentioning(self.dir.path()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        self.wait_no_plugins().await;
        unmount_under(self.dir.path());
        let id = uuid::Uuid::new_v4().to_string();
        write_atomic(&self.path("boot_id"), format!("{id}\n").as_bytes());
        self.boot_id = Some(id);
    }

    // ---- plugin processes ----

    /// Live `slrp-csi-local` processes of `provider` (found by the plugin root in their
    /// command line, unique to this test).
    pub fn plugin_pids(&self, provider: &str) -> Vec<i32> {
        processes_mentioning(&self.plugin_root(provider))
    }

    /// The one plugin process of `provider`.
    pub fn plugin_pid(&self, provider: &str) -> i32 {
        match self.plugin_pids(provider)[..] {
            [pid] => pid,
            ref pids => self.fail(&format!("one plugin process expected, found {pids:?}")),
        }
    }

    /// SIGKILLs the plugin of `provider` and waits until it is gone; returns its pid.
    pub async fn kill_plugin(&self, provider: &str) -> i32 {
        let pid = self.plugin_pid(provider);
        kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
        self.within("the killed plugin to be gone", async {
            while self.plugin_pids(provider).contains(&pid) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        pid
    }

    /// Waits until `provider` runs one plugin process other than `old`; returns its pid.
    pub async fn plugin_relaunched(&self, provider: &str, old: i32) -> i32 {
        self.within("the plugin to be relaunched", async {
            loop {
                if let [pid] = self.plugin_pids(provider)[..]
                    && pid != old
                {
                    return pid;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() && self.daemon.is_some() && !self.log_shown.get() {
            eprintln!(
                "---- daemon log at the failure ----\n{}---- end ----",
                self.daemon_log()
            );
        }
        if let Some(server) = &self.profile_server {
            server.abort();
        }
        if let Some(pid) = self.daemon.as_ref().and_then(Daemon::pid) {
            let _ = kill(pid, Signal::SIGKILL);
        }
        // Plugins outlive a SIGKILLed daemon; only processes naming this test's directory
        // are ours.
        for pid in processes_mentioning(self.dir.path()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        // Published volumes stay mounted (Mesos never unpublishes): the directory could
        // not be removed, and the mounts would outlive the test.
        unmount_under(self.dir.path());
    }
}

/// Runs a test body taking the plugin's CSI version as `<name>::v1` and `<name>::v0`, as
/// Mesos instantiates its provider tests
/// (`CSIVersion/StorageLocalResourceProviderTest.<Name>/v0`).
#[allow(unused_macros)]
macro_rules! csi_versions {
    ($name:ident) => {
        mod $name {
            #[tokio::test]
            async fn v1() {
                super::$name("v1").await;
            }
            #[tokio::test]
            async fn v0() {
                super::$name("v0").await;
            }
        }
    };
}

/// A boxed future: the operation helpers hold whole `Offer.Operation`s (kilobytes), too
/// large to nest unboxed in every test's future.
pub type Boxed<'a, T> = std::pin::Pin<Box<dyn Future<Output = T> + 'a>>;

/// The framework of the tests' operations.
pub const FRAMEWORK_ID: &str = "framework-1";

/// [`FRAMEWORK_ID`] as a proto.
pub fn framework_id() -> FrameworkId {
    FrameworkId {
        value: FRAMEWORK_ID.into(),
    }
}

/// An operation's type and id for failure messages.
pub fn describe_operation(op: &offer::Operation) -> String {
    let v = slrp_wire::json::to_value(op).unwrap();
    format!(
        "{} {}",
        v["type"].as_str().unwrap_or("?"),
        v["id"]["value"].as_str().unwrap_or("(no id)")
    )
}

/// Mount points under `dir` (from `/proc/self/mountinfo`), deepest first.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        // mountinfo escapes space, tab, newline and backslash as octal.
        .map(|p| PathBuf::from(unescape_mountinfo(p)))
        .filter(|p| p.starts_with(dir) && p != dir)
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    points
}

fn unescape_mountinfo(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest
            .get(i + 1..i + 4)
            .and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(b) => {
                out.push(char::from(b));
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Unmounts (lazily) everything mounted under `dir` and detaches the loop devices whose
/// backing files are under it: what a reboot does to a test's volumes.
pub fn unmount_under(dir: &Path) {
    for point in mounts_under(dir) {
        let _ = nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH);
    }
    for e in std::fs::read_dir("/sys/block")
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        let Ok(backing) = std::fs::read_to_string(e.path().join("loop/backing_file")) else {
            continue;
        };
        if Path::new(backing.trim()).starts_with(dir) {
            let _ = std::process::Command::new("losetup")
                .arg("-d")
                .arg(format!("/dev/{name}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// The remaining uses of a counting rule; large enough never to run out in a test.
const COUNTER: u64 = 1_000_000;

/// Writes through a temporary file and a rename, so a reader sees the old or the new
/// content, never a mix.
pub fn write_atomic(path: &Path, data: &[u8]) {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, data).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Pids of live (not zombie) processes whose command line contains `needle`.
pub fn processes_mentioning(needle: &Path) -> Vec<i32> {
    let needle = needle.display().to_string();
    let me = std::process::id();
    let mut pids = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if u32::try_from(pid).is_ok_and(|p| p == me) {
            continue;
        }
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let zombie = std::fs::read_to_string(e.path().join("stat"))
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('Z')))
            .unwrap_or(true);
        if !zombie && cmdline.contains(&needle) {
            pids.push(pid);
        }
    }
    pids
}

/// Serves `file` (read at each request, so rewriting it changes the answer) to every
/// HTTP GET on a loopback port: a minimal HTTP/1.1 server, one request per connection.
pub async fn serve_file(file: PathBuf) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let file = file.clone();
            tokio::spawn(async move {
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let body = std::fs::read(&file).unwrap_or_default();
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(&body).await;
                let _ = s.shutdown().await;
            });
        }
    });
    (addr, task)
}

/// A minimal HTTP/1.0 GET over a unix socket (the admin endpoint): `None` if nothing
/// accepts the connection or the answer is cut short.
pub async fn http_get_unix(socket: &Path, path: &str) -> Option<(u16, String)> {
    http_unix(socket, "GET", path, None).await
}

/// A minimal HTTP/1.0 request over a unix socket, with a JSON body if given.
pub async fn http_unix(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Option<(u16, String)> {
    let mut s = tokio::net::UnixStream::connect(socket).await.ok()?;
    // HTTP/1.0 and `Connection: close`: the answer is delimited by the close, not chunked.
    let mut req = format!("{method} {path} HTTP/1.0\r\nHost: localhost\r\nConnection: close\r\n");
    let body = body.map(Value::to_string).unwrap_or_default();
    if !body.is_empty() {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(&body);
    s.write_all(req.as_bytes()).await.ok()?;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut raw))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}
