//! One provider's plugin stack over the real bundled plugin (`slrp-csi-local`), from a
//! ResourceProviderInfo in Mesos's JSON format: the startup RPC budget of Mesos's test
//! `CsiPluginRpcMetrics` (health probes do not count), node-only plugins, a failing
//! `prepareServices` that leaves no plugin behind, adoption across a restart, and the
//! volume manager as the one layer that retries a CSI call.
//!
//! Real time: the plugin is a separate process. Waits are on conditions with timeouts.

#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used
)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use std::time::Duration;

use slrp_csi::CsiRpc;
use slrp_csi::retry::{Backoff, Jitter, RetryConfig, RetryPolicy};
use slrp_proto::csi::v1 as pb;
use slrp_proto::mesos::v1 as mesos;
use slrp_provider::metrics::ProviderMetrics;
use slrp_provider::stack::{PluginStack, StackConfig, StackError, StackStep, StopPlugins};
use slrp_store::Store;
use slrp_test_support::csi_local_bin;
use slrp_test_support::harness::{until, within};
use tokio_util::sync::CancellationToken;

const RP_TYPE: &str = "org.apache.mesos.rp.local.storage";

struct Env {
    dir: tempfile::TempDir,
    store: Store,
}

impl Env {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("state/store")).unwrap();
        std::fs::write(dir.path().join("faults.json"), "[]").unwrap();
        Self { dir, store }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn set_faults(&self, json: &str) {
        let tmp = self.path("faults.tmp");
        std::fs::write(&tmp, json).unwrap();
        std::fs::rename(&tmp, self.path("faults.json")).unwrap();
    }

    /// A ResourceProviderInfo as in Mesos's example (spec §10.1), in Mesos's JSON, with
    /// the bundled plugin as the test plugin and one container per entry of `containers`
    /// (each a list of services).
    fn info(&self, name: &str, containers: &[&[&str]]) -> mesos::ResourceProviderInfo {
        let containers: Vec<_> = containers
            .iter()
            .map(|services| {
                serde_json::json!({
                    "services": services,
                    "command": {
                        "shell": false,
                        "value": csi_local_bin(),
                        "arguments": [
                            "slrp-csi-local",
                            "--root", self.path("plugin-root"),
                            "--node-id", "node-1",
                            "--pool", "default=1GiB",
                            "--faults-file", self.path("faults.json"),
                        ]
                    },
                    "resources": [
                        { "name": "cpus", "type": "SCALAR", "scalar": { "value": 0.1 } },
                        { "name": "mem", "type": "SCALAR", "scalar": { "value": 1024 } }
                    ]
                })
            })
            .collect();
        let json = serde_json::json!({
            "type": RP_TYPE,
            "name": name,
            "default_reservations": [ { "type": "DYNAMIC", "role": "storage" } ],
            "storage": {
                "plugin": {
                    "type": "org.apache.mesos.csi.test",
                    "name": "local",
                    "containers": containers,
                },
                "reconciliation_interval_seconds": 0
            }
        });
        slrp_wire::json::from_value(json).unwrap()
    }

    fn config(&self, info: mesos::ResourceProviderInfo) -> StackConfig {
        let mut cfg = StackConfig::new(
            info,
            self.path("work"),
            self.path("state/plugins"),
            self.store.clone(),
        );
        cfg.supervisor.socket_base = self.dir.path().to_owned();
        cfg.supervisor.ready_probe_interval = Duration::from_millis(20);
        // Several health probes per test second: the budget check must see them.
        cfg.supervisor.health_interval = Duration::from_millis(20);
        cfg.supervisor.stop_grace = Duration::from_secs(5);
        cfg.supervisor.adopt_poll = Duration::from_millis(50);
        cfg.ready_timeout = Duration::from_secs(30);
        cfg
    }

    async fn start(&self, info: mesos::ResourceProviderInfo, m: &ProviderMetrics) -> PluginStack {
        within(PluginStack::start(
            self.config(info),
            m,
            CancellationToken::new(),
        ))
        .await
        .unwrap()
    }

    /// A start that must fail.
    async fn start_err(
        &self,
        info: mesos::ResourceProviderInfo,
        m: &ProviderMetrics,
    ) -> StackError {
        within(PluginStack::start(
            self.config(info),
            m,
            CancellationToken::new(),
        ))
        .await
        .unwrap_err()
    }

    /// The pid of the plugin container's record, if one is there.
    fn plugin_pid(&self, container: &str) -> Option<i64> {
        let rec = self
            .path("state/plugins/containers")
            .join(container)
            .join("pid.json");
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(rec).ok()?).ok()?;
        find_pid(&v)
    }
}

/// Appends `args` to the first plugin container's command.
fn add_plugin_args(info: &mut mesos::ResourceProviderInfo, args: &[&str]) {
    let command = info.storage.as_mut().unwrap().plugin.containers[0]
        .command
        .as_mut()
        .unwrap();
    command
        .arguments
        .extend(args.iter().map(|a| (*a).to_owned()));
}

fn find_pid(v: &serde_json::Value) -> Option<i64> {
    match v {
        serde_json::Value::Object(m) => m
            .get("pid")
            .and_then(serde_json::Value::as_i64)
            .or_else(|| m.values().find_map(find_pid)),
        _ => None,
    }
}

/// Whether `pid` runs (a zombie waiting to be reaped does not).
fn alive(pid: i64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

/// Live processes whose command line names `needle` (this test's plugin root).
fn processes_naming(needle: &Path) -> Vec<i64> {
    let needle = needle.to_str().unwrap().as_bytes();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i64>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.windows(needle.len()).any(|w| w == needle))
        })
        .filter(|pid| alive(*pid))
        .collect()
}

const BOTH: &[&str] = &["CONTROLLER_SERVICE", "NODE_SERVICE"];
const CONTAINER: &str = "org-apache-mesos-csi-test-local--CONTROLLER_SERVICE-NODE_SERVICE";

fn snapshot_value(m: &ProviderMetrics, name: &str) -> f64 {
    let key = format!("resource_providers/{RP_TYPE}.test/csi_plugin/{name}");
    *m.snapshot()
        .get(&key)
        .unwrap_or_else(|| panic!("{key} missing"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_counts_mesos_budget_and_health_probes_do_not_count() {
    let env = Env::new();
    let m = ProviderMetrics::new(RP_TYPE, "test");
    let stack = env.start(env.info("test", &[BOTH]), &m).await;

    // Mesos's startup budget, the stack's share (spec §9): Probe 1, GetPluginInfo 2
    // (one per requested service, one container serving both), GetPluginCapabilities 1,
    // ControllerGetCapabilities 1, NodeGetCapabilities 1; NodeGetInfo only with
    // PUBLISH_UNPUBLISH_VOLUME, which the bundled plugin lacks.
    let csi = m.csi();
    let per_rpc: BTreeMap<&str, u64> = CsiRpc::ALL
        .into_iter()
        .map(|r| (r.as_str(), csi.finished(r)))
        .filter(|(_, n)| *n > 0)
        .collect();
    let budget = BTreeMap::from([
        ("Probe", 1),
        ("GetPluginInfo", 2),
        ("GetPluginCapabilities", 1),
        ("ControllerGetCapabilities", 1),
        ("NodeGetCapabilities", 1),
    ]);
    assert_eq!(per_rpc, budget);
    assert_eq!(snapshot_value(&m, "rpcs_finished"), 6.0);
    assert_eq!(snapshot_value(&m, "rpcs_failed"), 0.0);
    assert_eq!(snapshot_value(&m, "rpcs_pending"), 0.0);
    assert_eq!(stack.prepared().node_id, "");
    assert!(stack.prepared().caps.controller.get_capacity);

    // Wait for several health probes; none of them may reach the provider's metrics.
    let probes = m.health_probes();
    let seen = probes.finished(CsiRpc::Probe);
    until(|| probes.finished(CsiRpc::Probe) >= seen + 5).await;
    assert_eq!(snapshot_value(&m, "rpcs_finished"), 6.0);
    assert_eq!(snapshot_value(&m, "rpcs_failed"), 0.0);
    assert_eq!(snapshot_value(&m, "container_terminations"), 0.0);

    stack.shutdown(StopPlugins::Stop).await;
    assert_eq!(snapshot_value(&m, "container_terminations"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_only_plugin_gets_no_controller_call() {
    let env = Env::new();
    let m = ProviderMetrics::new(RP_TYPE, "test");
    let stack = env.start(env.info("test", &[&["NODE_SERVICE"]]), &m).await;
    let p = stack.prepared();
    assert!(!p.has_controller());
    assert_eq!(
        p.caps.controller,
        slrp_csi::ControllerCapabilities::default()
    );
    assert_eq!(p.node_id, "");
    let csi = m.csi();
    assert_eq!(csi.finished(CsiRpc::GetPluginInfo), 1);
    assert_eq!(csi.finished(CsiRpc::GetPluginCapabilities), 1);
    assert_eq!(csi.finished(CsiRpc::NodeGetCapabilities), 1);
    for rpc in CsiRpc::ALL {
        let controller_rpc = matches!(
            rpc,
            CsiRpc::ControllerGetCapabilities
                | CsiRpc::ListVolumes
                | CsiRpc::GetCapacity
                | CsiRpc::CreateVolume
        );
        if controller_rpc {
            assert_eq!(csi.finished(rpc) + csi.failed(rpc), 0, "{rpc}");
        }
    }
    // Without LIST_VOLUMES the volume manager lists nothing, without sending anything.
    assert_eq!(stack.volumes().list_all(10).await.unwrap(), []);
    assert_eq!(
        csi.finished(CsiRpc::ListVolumes) + csi.failed(CsiRpc::ListVolumes),
        0
    );
    stack.shutdown(StopPlugins::Stop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_prepare_services_names_the_step_and_leaves_no_plugin() {
    let env = Env::new();
    env.set_faults(r#"[{"rpc": "GetPluginCapabilities", "fail": "FAILED_PRECONDITION"}]"#);
    let m = ProviderMetrics::new(RP_TYPE, "test");
    let err = env.start_err(env.info("test", &[BOTH]), &m).await;
    assert_eq!(err.step(), StackStep::PrepareServices);
    let chain = slrp_types::DisplayChain(&err).to_string();
    assert!(
        chain.starts_with(&format!(
            "resource provider {RP_TYPE}.test: preparing the CSI services: preparing services of \
             CSI plugin type 'org.apache.mesos.csi.test' and name 'local': GetPluginCapabilities \
             on CONTROLLER_SERVICE"
        )),
        "{chain}"
    );
    assert!(matches!(err, StackError::Step { .. }));
    assert_eq!(snapshot_value(&m, "rpcs_failed"), 1.0);
    // Stopped and waited for before `start` returned, not merely asked to stop.
    assert_eq!(snapshot_value(&m, "container_terminations"), 1.0);
    assert_eq!(env.plugin_pid(CONTAINER), None);
    assert_eq!(
        processes_naming(&env.path("plugin-root")),
        Vec::<i64>::new(),
        "the plugin must be stopped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_stack_adopts_the_plugin_it_left_running() {
    let env = Env::new();
    let m = ProviderMetrics::new(RP_TYPE, "test");
    let stack = env.start(env.info("test", &[BOTH]), &m).await;
    let pid = env.plugin_pid(CONTAINER).expect("pid record");
    stack.shutdown(StopPlugins::Leave).await;
    assert!(alive(pid), "left running");
    assert_eq!(snapshot_value(&m, "container_terminations"), 0.0);

    let m2 = ProviderMetrics::new(RP_TYPE, "test");
    let stack = env.start(env.info("test", &[BOTH]), &m2).await;
    assert_eq!(m2.supervisor().adoptions(CONTAINER), 1);
    assert_eq!(env.plugin_pid(CONTAINER), Some(pid));
    assert_eq!(
        processes_naming(&env.path("plugin-root")),
        [pid],
        "no second copy"
    );
    // The adopted plugin is asked again, as Mesos's recovery does after a restart.
    assert_eq!(m2.csi().finished(CsiRpc::Probe), 1);

    stack.shutdown(StopPlugins::Stop).await;
    until(|| !alive(pid)).await;
    assert_eq!(env.plugin_pid(CONTAINER), None);
}

/// A CSI v1 plugin that serves only the identity service and does not offer
/// CONTROLLER_SERVICE (the bundled plugin always does).
struct IdentityOnly;

#[tonic::async_trait]
impl pb::identity_server::Identity for IdentityOnly {
    async fn get_plugin_info(
        &self,
        _: tonic::Request<pb::GetPluginInfoRequest>,
    ) -> Result<tonic::Response<pb::GetPluginInfoResponse>, tonic::Status> {
        Ok(tonic::Response::new(pb::GetPluginInfoResponse {
            name: "org.example.identity-only".into(),
            vendor_version: "1".into(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: tonic::Request<pb::GetPluginCapabilitiesRequest>,
    ) -> Result<tonic::Response<pb::GetPluginCapabilitiesResponse>, tonic::Status> {
        Ok(tonic::Response::new(pb::GetPluginCapabilitiesResponse {
            capabilities: Vec::new(),
        }))
    }

    async fn probe(
        &self,
        _: tonic::Request<pb::ProbeRequest>,
    ) -> Result<tonic::Response<pb::ProbeResponse>, tonic::Status> {
        Ok(tonic::Response::new(pb::ProbeResponse {
            ready: Some(true),
        }))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_without_controller_service_fails_with_mesos_text() {
    let env = Env::new();
    let socket = env.path("identity.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(pb::identity_server::IdentityServer::new(IdentityOnly))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let endpoint = format!("unix://{}", socket.display());
    let mut info = env.info("test", &[BOTH]);
    let plugin = &mut info.storage.as_mut().unwrap().plugin;
    plugin.containers.clear();
    plugin.endpoints = ["CONTROLLER_SERVICE", "NODE_SERVICE"]
        .into_iter()
        .map(|s| mesos::CsiPluginEndpoint {
            csi_service: mesos::csi_plugin_container_info::Service::from_str_name(s).unwrap()
                as i32,
            endpoint: endpoint.clone(),
        })
        .collect();
    let m = ProviderMetrics::new(RP_TYPE, "test");
    let err = env.start_err(info, &m).await;
    assert_eq!(err.step(), StackStep::PrepareServices);
    let cause = std::error::Error::source(&err).unwrap().to_string();
    assert_eq!(
        cause,
        "CONTROLLER_SERVICE plugin capability is not supported for CSI plugin type \
         'org.apache.mesos.csi.test' and name 'local'"
    );
    // Only the version probe and GetPluginCapabilities were sent, as in Mesos.
    assert_eq!(snapshot_value(&m, "rpcs_finished"), 2.0);
    server.abort();
}

/// Unmounts whatever a test left mounted under `dir` (deepest first), so a failing test
/// leaks no mount.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        use slrp_core::volume::MountTable;
        let mut mounts = slrp_core::volume::ProcMountTable
            .mounts_under(&self.0)
            .unwrap_or_default();
        mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for m in mounts {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&m)
                .status();
        }
    }
}

fn is_mounted(p: &Path) -> bool {
    use slrp_core::volume::MountTable;
    slrp_core::volume::ProcMountTable
        .mounts_under(p)
        .unwrap()
        .iter()
        .any(|m| m == p)
}

/// Creates, publishes, unpublishes and deletes one volume through the stack; returns
/// the target path it was published at.
async fn publish_one(stack: &PluginStack) -> PathBuf {
    let v = stack
        .volumes()
        .create(slrp_core::volume::CreateVolume {
            name: "op-1".into(),
            required_bytes: 1 << 20,
            limit_bytes: 0,
            capability: slrp_csi::VolumeCapability::mount_default(),
            parameters: Default::default(),
            content_source: None,
        })
        .await
        .unwrap();
    let target = stack.volumes().publish(&v.id).await.unwrap();
    assert!(is_mounted(&target), "{}", target.display());
    stack.volumes().unpublish(&v.id).await.unwrap();
    assert!(stack.volumes().delete(&v.id).await.unwrap());
    target
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_mount_where_the_agent_looks_unless_target_path_root_moves_them() {
    if !slrp_test_support::require_root(&slrp_test_support::current_test()) {
        return;
    }
    let env = Env::new();
    let _unmount = Unmount(env.dir.path().to_owned());
    let m = ProviderMetrics::new(RP_TYPE, "test");
    let stack = env.start(env.info("test", &[BOTH]), &m).await;
    let target = publish_one(&stack).await;
    // The MOUNT root the provider reports, `./csi/<plugin type>/<plugin name>/mounts`,
    // resolved against the work dir as the agent does (spec §6.8).
    let root = env.path("work/csi/org.apache.mesos.csi.test/local/mounts");
    assert_eq!(target.parent().unwrap().parent().unwrap(), root);
    assert_eq!(target.file_name().unwrap(), "target");
    stack.shutdown(StopPlugins::Stop).await;

    let mut info = env.info("test", &[BOTH]);
    let moved = env.path("elsewhere");
    info.storage.as_mut().unwrap().plugin.target_path_root = Some(moved.to_str().unwrap().into());
    let stack = env.start(info, &m).await;
    let target = publish_one(&stack).await;
    assert_eq!(target.parent().unwrap().parent().unwrap(), moved);
    stack.shutdown(StopPlugins::Stop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_start_stops_the_plugin_it_launched() {
    let env = Env::new();
    let m = ProviderMetrics::new(RP_TYPE, "test");
    let cancel = CancellationToken::new();
    cancel.cancel();
    let err = within(PluginStack::start(
        env.config(env.info("test", &[BOTH])),
        &m,
        cancel,
    ))
    .await
    .unwrap_err();
    assert!(
        matches!(
            err,
            StackError::Cancelled {
                step: StackStep::WaitReady,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "resource provider {RP_TYPE}.test: cancelled while waiting for the plugin to become ready"
        )
    );
    assert_eq!(env.plugin_pid(CONTAINER), None);
    assert_eq!(
        processes_naming(&env.path("plugin-root")),
        Vec::<i64>::new()
    );
    assert_eq!(snapshot_value(&m, "rpcs_finished"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v0_plugin_is_detected_with_one_counted_probe() {
    let env = Env::new();
    let mut info = env.info("test", &[BOTH]);
    add_plugin_args(&mut info, &["--csi-version", "v0"]);
    let m = ProviderMetrics::new(RP_TYPE, "test");
    let stack = env.start(info, &m).await;
    assert_eq!(stack.prepared().version, slrp_csi::CsiVersion::V0);
    // v1 answered UNIMPLEMENTED, then v0: one Probe attempt, as in Mesos.
    assert_eq!(m.csi().finished(CsiRpc::Probe), 1);
    assert_eq!(m.csi().failed(CsiRpc::Probe), 0);
    assert_eq!(snapshot_value(&m, "rpcs_finished"), 6.0);
    stack.shutdown(StopPlugins::Stop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relative_target_path_root_is_refused_before_the_plugin_runs() {
    let env = Env::new();
    let mut info = env.info("test", &[BOTH]);
    info.storage.as_mut().unwrap().plugin.target_path_root = Some("relative/mounts".into());
    let m = ProviderMetrics::new(RP_TYPE, "test");
    let err = env.start_err(info, &m).await;
    assert_eq!(err.step(), StackStep::PluginConfig);
    assert_eq!(
        slrp_types::DisplayChain(&err).to_string(),
        format!(
            "resource provider {RP_TYPE}.test: reading the plugin configuration: \
             'CSIPluginInfo.target_path_root' must be an absolute path, not 'relative/mounts'"
        )
    );
    assert_eq!(env.plugin_pid(CONTAINER), None);
    assert_eq!(snapshot_value(&m, "rpcs_finished"), 0.0);
    assert_eq!(snapshot_value(&m, "container_terminations"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_start_leaves_the_plugin_running_when_told_to() {
    let env = Env::new();
    let m = ProviderMetrics::new(RP_TYPE, "test");
    let mut cfg = env.config(env.info("test", &[BOTH]));
    cfg.plugins_on_cancel = StopPlugins::Leave;
    let cancel = CancellationToken::new();
    cancel.cancel();
    let err = within(PluginStack::start(cfg, &m, cancel))
        .await
        .unwrap_err();
    assert!(matches!(err, StackError::Cancelled { .. }), "{err}");
    let pid = env
        .plugin_pid(CONTAINER)
        .expect("pid record left for adoption");
    assert!(alive(pid), "left running");
    assert_eq!(snapshot_value(&m, "container_terminations"), 0.0);

    // The next start adopts it rather than launching a second copy.
    let m2 = ProviderMetrics::new(RP_TYPE, "test");
    let stack = env.start(env.info("test", &[BOTH]), &m2).await;
    assert_eq!(m2.supervisor().adoptions(CONTAINER), 1);
    assert_eq!(processes_naming(&env.path("plugin-root")), [pid]);
    stack.shutdown(StopPlugins::Stop).await;
    until(|| !alive(pid)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_stack_stops_its_volume_manager_and_plugin() {
    let env = Env::new();
    let m = ProviderMetrics::new(RP_TYPE, "test");
    let stack = env.start(env.info("test", &[BOTH]), &m).await;
    let pid = env.plugin_pid(CONTAINER).expect("pid record");
    let volumes = stack.volumes().clone();
    assert!(volumes.jobs().await.is_ok());
    drop(stack);
    within(async {
        while !matches!(
            volumes.jobs().await,
            Err(slrp_core::volume::VolumeError::Stopped)
        ) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    until(|| !alive(pid)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leftover_stopped_at_start_is_no_termination_of_this_run() {
    let env = Env::new();
    let m = ProviderMetrics::new(RP_TYPE, "test");
    let stack = env.start(env.info("test", &[BOTH]), &m).await;
    let old = env.plugin_pid(CONTAINER).expect("pid record");
    stack.shutdown(StopPlugins::Leave).await;

    // Another configuration of the same container: the leftover is stopped, not adopted.
    let mut info = env.info("test", &[BOTH]);
    add_plugin_args(&mut info, &["--pool", "other=1GiB"]);
    let m2 = ProviderMetrics::new(RP_TYPE, "test");
    let stack = env.start(info, &m2).await;
    assert!(!alive(old), "the leftover is stopped");
    assert_eq!(m2.supervisor().adoptions(CONTAINER), 0);
    assert_eq!(
        m2.supervisor()
            .terminations(CONTAINER, slrp_supervisor::TerminationCause::Stopped),
        1
    );
    // Mesos's counter: no plugin of this run has terminated.
    assert_eq!(snapshot_value(&m2, "container_terminations"), 0.0);
    stack.shutdown(StopPlugins::Stop).await;
}

/// A call the volume manager retries is retried there and nowhere else (spec §4.3: every
/// attempt is one RPC). With a policy of 3 attempts and a plugin that keeps answering
/// UNAVAILABLE, the plugin sees exactly 3 CreateVolume calls and the provider's CSI
/// metrics count 3 failed attempts. A retry layer in the stack's clients would multiply
/// that (or, under Mesos's unlimited policy, never end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_the_volume_manager_retries_is_retried_by_it_alone() {
    let env = Env::new();
    let m = ProviderMetrics::new(RP_TYPE, "test");
    let mut cfg = env.config(env.info("test", &[BOTH]));
    let policy = RetryPolicy::mesos()
        .with_backoff(Backoff::new(Duration::from_millis(10), Duration::from_millis(10)).unwrap())
        .with_jitter(Jitter::None)
        .with_max_attempts(Some(3));
    cfg.volume_retry = RetryConfig::none().with(CsiRpc::CreateVolume, policy);
    let stack = within(PluginStack::start(cfg, &m, CancellationToken::new()))
        .await
        .unwrap();
    env.set_faults(r#"[{"rpc": "CreateVolume", "fail": "UNAVAILABLE", "times": 100}]"#);

    let err = within(stack.volumes().create(slrp_core::volume::CreateVolume {
        name: "retried".into(),
        required_bytes: 1 << 20,
        limit_bytes: 0,
        capability: slrp_csi::VolumeCapability::mount_default(),
        parameters: Default::default(),
        content_source: None,
    }))
    .await
    .unwrap_err();
    assert!(
        matches!(&err, slrp_core::volume::VolumeError::Csi { source, .. }
            if source.code() == Some(slrp_csi::Code::Unavailable)),
        "{err:?}"
    );
    let left: serde_json::Value =
        serde_json::from_slice(&std::fs::read(env.path("faults.json")).unwrap()).unwrap();
    assert_eq!(
        left[0]["times"], 97,
        "CreateVolume calls the plugin saw: {left}"
    );
    let csi = m.csi();
    assert_eq!(
        (
            csi.failed(CsiRpc::CreateVolume),
            csi.finished(CsiRpc::CreateVolume)
        ),
        (3, 0)
    );
    stack.shutdown(StopPlugins::Stop).await;
}
