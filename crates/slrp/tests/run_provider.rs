//! Mesos's provider tests (spec §11.1) as real-process tests of `slrp run`: the embedded
//! manager in this process, the daemon and its `slrp-csi-local` plugins as children. Each
//! test asserts what the Mesos test asserts, as the manager sees it (SUBSCRIBE,
//! UPDATE_STATE) or as the daemon's `/metrics/snapshot` reports it.

// An integration-test crate: all of it is test code (the lints target library code).
#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::float_cmp
)]

#[macro_use]
mod support;

use std::collections::BTreeMap;

use serde_json::json;
use slrp_manager::ManagerMessage;
use support::{
    Cluster, DaemonOptions, ProviderSpec, Update, assert_provider_resource, mb, metadata, profiles,
    sorted, source,
};

/// The provider id of a SUBSCRIBED provider's info.
fn id_of(info: &serde_json::Value) -> String {
    info["id"]["value"].as_str().unwrap().to_owned()
}

/// Starts `spec` with profile `test` under `options`, after `prepare` (faults, imported
/// volumes), and waits for the `test` pool: the cluster, the provider id, that update.
async fn started_with_pool(
    spec: ProviderSpec,
    options: DaemonOptions,
    prepare: impl FnOnce(&Cluster),
) -> (Cluster, String, Update) {
    let mut c = Cluster::new(vec![spec], options).await;
    c.set_profiles(&profiles(&["test"]));
    prepare(&c);
    c.start_daemon();
    let id = id_of(&c.next_subscribed().await);
    let u = c.update_where(|u| u.pool("test").is_some()).await;
    (c, id, u)
}

/// NoResource (§11.1 test 1): no profiles and no pre-existing volumes → one UPDATE_STATE
/// with zero resources after SUBSCRIBE; after a daemon restart the recovered provider
/// again sends one with zero resources (an UPDATE_STATE always follows a subscription).
async fn no_resource(csi: &'static str) {
    let mut c = Cluster::fixture_csi(csi).await;
    c.start_daemon();
    let info = c.next_subscribed().await;
    let id = id_of(&info);
    assert_eq!(info["type"], support::RP_TYPE);
    assert_eq!(info["name"], "test");
    let u = c.next_update().await;
    assert_eq!(u.provider_id, id);
    assert!(u.resources.is_empty(), "{:?}", u.resources);

    c.restart_daemon().await;
    let again = c.next_subscribed().await;
    assert_eq!(id_of(&again), id, "the recovered provider keeps its id");
    let u = c.next_update().await;
    assert_eq!(u.provider_id, id);
    assert!(u.resources.is_empty(), "{:?}", u.resources);
    c.finish().await;
}
csi_versions!(no_resource);

/// ProfileAppeared (§11.1 test 4): the profile server (HTTP on loopback, as in Mesos)
/// serves `{}` first (no pool); once it serves profile `test`, an UPDATE_STATE carries a RAW storage pool of that profile with
/// the plugin's capacity (4 GiB = 4096 MB), the plugin's vendor, the provider id and the
/// default reservation.
async fn profile_appeared(csi: &'static str) {
    let options = DaemonOptions {
        profiles_http: true,
        ..DaemonOptions::with_profiles()
    };
    let mut c = Cluster::new(vec![ProviderSpec::fixture().csi(csi)], options).await;
    c.set_profiles(&json!({}));
    c.start_daemon();
    let id = id_of(&c.next_subscribed().await);
    let first = c.next_update().await;
    assert!(first.resources.is_empty(), "{:?}", first.resources);

    c.set_profiles(&profiles(&["test"]));
    let u = c.update_where(|u| u.pool("test").is_some()).await;
    assert_eq!(u.provider_id, id);
    assert_eq!(u.resources.len(), 1, "{:?}", u.resources);
    let pool = u.pool("test").unwrap();
    assert_provider_resource(pool, c.spec("test"), &id);
    assert_eq!(mb(pool), 4096.0, "{pool}");
    assert!(
        source(pool)["id"].is_null() && source(pool)["metadata"].is_null(),
        "{pool}"
    );
    assert_ne!(u.resource_version, first.resource_version);
    c.finish().await;
}
csi_versions!(profile_appeared);

/// ProfileDisappeared (§11.1 test 9), the part without operations: the `test1` pool is
/// reported; the mapping switches to `test2` → the `test1` pool goes, a `test2` pool of the
/// same capacity appears, with a new resource version. (That a CREATE_DISK on the old pool
/// is then DROPPED and a `test1` disk keeps its profile needs operations: issue #11.)
async fn profile_disappeared(csi: &'static str) {
    let mut c = Cluster::new(
        vec![ProviderSpec::fixture().csi(csi)],
        DaemonOptions::with_profiles(),
    )
    .await;
    c.set_profiles(&profiles(&["test1"]));
    c.start_daemon();
    let id = id_of(&c.next_subscribed().await);
    let before = c.update_where(|u| u.pool("test1").is_some()).await;
    assert_eq!(mb(before.pool("test1").unwrap()), 4096.0);

    c.set_profiles(&profiles(&["test2"]));
    let after = c.update_where(|u| u.pool("test2").is_some()).await;
    assert_eq!(after.provider_id, id);
    assert!(after.pool("test1").is_none(), "{:?}", after.resources);
    assert_eq!(after.resources.len(), 1, "{:?}", after.resources);
    let pool = after.pool("test2").unwrap();
    assert_provider_resource(pool, c.spec("test"), &id);
    assert_eq!(mb(pool), 4096.0);
    assert_ne!(after.resource_version, before.resource_version);
    c.finish().await;
}
csi_versions!(profile_disappeared);

/// A pre-existing 2 GiB volume of the fixture's plugin, as the only resource (no
/// profiles): RAW, vendor, id, no profile (Mesos's "preprovisioned" predicate).
fn assert_single_preexisting(c: &Cluster, u: &Update, volume: &str) {
    assert_eq!(u.resources.len(), 1, "{:?}", u.resources);
    let disk = &u.resources[0];
    assert_provider_resource(disk, c.spec("test"), &u.provider_id);
    assert_eq!(source(disk)["type"], "RAW", "{disk}");
    assert_eq!(source(disk)["id"], volume, "{disk}");
    assert!(source(disk)["profile"].is_null(), "{disk}");
    assert_eq!(mb(disk), 2048.0, "{disk}");
}

/// RecoverDuplicatedVolumes (§11.1 test 8, MESOS-9965): the plugin lists its one 2 GiB
/// volume twice; the provider reports a single 2 GiB disk, before and after a restart.
async fn recover_duplicated_volumes(csi: &'static str) {
    let mut c = Cluster::fixture_csi(csi).await;
    let volume = c.import_volume("test", "vol1", 2 << 30);
    c.set_faults(
        "test",
        &json!([{"rpc": "ListVolumes", "duplicate_entries": true}]),
    );
    c.start_daemon();
    let id = id_of(&c.next_subscribed().await);
    let u = c.next_update().await;
    assert_single_preexisting(&c, &u, &volume);

    c.restart_daemon().await;
    assert_eq!(id_of(&c.next_subscribed().await), id);
    let u = c.next_update().await;
    assert_single_preexisting(&c, &u, &volume);
    c.finish().await;
}
csi_versions!(recover_duplicated_volumes);

/// RecoverDiskWithChangedMetadata (§11.1 test 7, MESOS-9395): the volume is reported
/// with `label=foo`; after a restart the plugin reports `label=bar`; exactly one disk is
/// reported, with the new metadata. (Mesos's disk is a MOUNT disk made by CREATE_DISK;
/// without operations, issue #11, it is a pre-existing RAW volume here.)
async fn recover_disk_with_changed_metadata(csi: &'static str) {
    let mut c = Cluster::fixture_csi(csi).await;
    let volume = c.import_volume("test", "vol1", 2 << 30);
    let label = |v: &str| json!([{"rpc": "ListVolumes", "volume_context": {"label": v}}]);
    c.set_faults("test", &label("foo"));
    c.start_daemon();
    let id = id_of(&c.next_subscribed().await);
    let u = c.next_update().await;
    assert_single_preexisting(&c, &u, &volume);
    let label_foo = BTreeMap::from([("label".to_owned(), "foo".to_owned())]);
    assert_eq!(metadata(&u.resources[0]), label_foo);

    c.stop_daemon_cleanly().await;
    c.set_faults("test", &label("bar"));
    c.start_daemon();
    assert_eq!(id_of(&c.next_subscribed().await), id);
    let u = c.next_update().await;
    assert_single_preexisting(&c, &u, &volume);
    let label_bar = BTreeMap::from([("label".to_owned(), "bar".to_owned())]);
    assert_eq!(metadata(&u.resources[0]), label_bar);
    c.finish().await;
}
csi_versions!(recover_disk_with_changed_metadata);

/// The startup calls per RPC (spec §9) for the bundled plugin, which advertises no
/// PUBLISH_UNPUBLISH_VOLUME: Mesos's test plugin does, so Mesos also calls NodeGetId once
/// (its budget is 10); without that capability no node id is asked for (spec §4.4), in
/// v1 (NodeGetInfo) or v0 (NodeGetId).
const STARTUP_BUDGET: [(&str, u64); 9] = [
    ("Probe", 1),
    ("GetPluginInfo", 2),
    ("GetPluginCapabilities", 1),
    ("ControllerGetCapabilities", 1),
    ("NodeGetCapabilities", 1),
    ("NodeGetInfo", 0),
    ("NodeGetId", 0),
    ("ListVolumes", 2),
    ("GetCapacity", 1),
];

/// CsiPluginRpcMetrics (§11.1 test 27), the startup part: with one profile and periodic
/// reconciliation off, the plugin answers exactly Mesos's startup calls (Probe aside:
/// the supervisor's health probes reach the plugin too), ListVolumes twice (subscription
/// and profile reconciliations), and `rpcs_finished` counts them with the version
/// detection's Probe as one: 9 here, Mesos's 10 less its NodeGetId. `rpcs_failed` 0. A
/// health probe counted in the provider's metrics would make it more.
async fn csi_plugin_rpc_metrics(csi: &'static str) {
    let (c, _, _) = started_with_pool(
        ProviderSpec::fixture().csi(csi),
        DaemonOptions::with_profiles(),
        |c| c.count_calls("test", &STARTUP_BUDGET.map(|(rpc, _)| rpc)),
    )
    .await;
    let budget: u64 = STARTUP_BUDGET.iter().map(|(_, n)| n).sum();
    let prefix = format!("resource_providers/{}/csi_plugin", c.spec("test").key());
    let finished = format!("{prefix}/rpcs_finished");
    let pending = format!("{prefix}/rpcs_pending");
    #[allow(clippy::cast_precision_loss)]
    let budget_f = budget as f64;
    let snap = c
        .snapshot_until("startup RPCs to finish", |s| {
            s.get(&pending) == Some(&0.0) && s.get(&finished).is_some_and(|v| *v >= budget_f)
        })
        .await;
    let calls: Vec<(&str, u64)> = STARTUP_BUDGET
        .iter()
        .map(|(rpc, _)| (*rpc, c.calls("test", rpc)))
        .collect();
    for ((rpc, want), (_, got)) in STARTUP_BUDGET.iter().zip(&calls) {
        if *rpc == "Probe" {
            assert!(got >= want, "Probe: {calls:?}");
        } else {
            assert_eq!(got, want, "{rpc}: {calls:?}");
        }
    }
    assert_eq!(snap[&finished], budget_f, "{snap:?} {calls:?}");
    assert_eq!(snap[&format!("{prefix}/rpcs_failed")], 0.0, "{snap:?}");
    assert_eq!(snap[&format!("{prefix}/rpcs_cancelled")], 0.0, "{snap:?}");
    c.finish().await;
}
csi_versions!(csi_plugin_rpc_metrics);

/// Update (§11.1 test 35): with a short `reconciliation_interval_seconds`, ListVolumes
/// and GetCapacity are called at startup and again later, without any event. Counted at
/// the plugin (a counting fault rule) and in the provider's RPC metrics.
async fn periodic_reconciliation_calls_the_plugin_again(csi: &'static str) {
    let mut spec = ProviderSpec::fixture().csi(csi);
    spec.reconciliation_interval_seconds = 1.0;
    let (c, _, _) = started_with_pool(spec, DaemonOptions::with_profiles(), |c| {
        c.count_calls("test", &["ListVolumes", "GetCapacity"]);
    })
    .await;
    let (lv, gc) = (
        c.calls("test", "ListVolumes"),
        c.calls("test", "GetCapacity"),
    );
    assert!(
        lv >= 1 && gc >= 1,
        "startup reconciles: {lv} ListVolumes, {gc} GetCapacity"
    );
    let finished = c.provider_metric("test", "csi_plugin/rpcs_finished").await;

    c.within("periodic reconciliation", async {
        while c.calls("test", "ListVolumes") <= lv || c.calls("test", "GetCapacity") <= gc {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await;
    // The plugin counts a call when it arrives, the provider when its answer does.
    let key = format!(
        "resource_providers/{}/csi_plugin/rpcs_finished",
        c.spec("test").key()
    );
    c.snapshot_until("the later calls counted as finished", |s| {
        s.get(&key).is_some_and(|v| *v > finished)
    })
    .await;
    c.finish().await;
}
csi_versions!(periodic_reconciliation_calls_the_plugin_again);

/// Two providers in one process (two config files, two plugins): both subscribe with
/// distinct ids, each reports its own pool (4 GiB and 2 GiB, its plugin's vendor), and
/// each has its own metrics.
#[tokio::test]
async fn two_providers_in_one_process() {
    let one = ProviderSpec::named("test1", "local1");
    let mut two = ProviderSpec::named("test2", "local2");
    two.pools = vec!["default=2GiB".into()];
    let mut c = Cluster::new(vec![one, two], DaemonOptions::with_profiles()).await;
    c.set_profiles(&profiles(&["test"]));
    c.start_daemon();
    // Both providers run concurrently: one's UPDATE_STATE may come before the other's
    // SUBSCRIBE, so both kinds are taken from one stream of messages.
    let mut ids = BTreeMap::new();
    let mut pools = BTreeMap::new();
    while ids.len() < 2 || pools.len() < 2 {
        match c.next_message().await {
            ManagerMessage::Subscribed { info } => {
                let id = info.id.unwrap().value;
                assert!(ids.insert(info.name, id).is_none(), "subscribed twice");
            }
            ManagerMessage::UpdateState {
                provider_id,
                resources,
                resource_version_uuid,
                ..
            } => {
                let u = Update::new(provider_id, &resources, &resource_version_uuid);
                if let Some(pool) = u.pool("test") {
                    pools.insert(u.provider_id.clone(), pool.clone());
                }
            }
            _ => {}
        }
    }
    assert_ne!(ids["test1"], ids["test2"]);
    for (name, size) in [("test1", 4096.0), ("test2", 2048.0)] {
        let pool = &pools[&ids[name]];
        assert_provider_resource(pool, c.spec(name), &ids[name]);
        assert_eq!(mb(pool), size, "{pool}");
    }
    assert_eq!(c.plugin_pids("test1").len(), 1);
    assert_eq!(c.plugin_pids("test2").len(), 1);
    for name in ["test1", "test2"] {
        let v = c.provider_metric(name, "csi_plugin/rpcs_finished").await;
        assert!(v >= 1.0, "{name}: {v}");
    }
    // One scrapeable OpenMetrics page for both: each family declared once (Prometheus
    // refuses a second `# TYPE` for a name), both providers' series in it by label.
    let page = c.admin_ok("/metrics").await;
    let mut typed = std::collections::BTreeSet::new();
    for line in page.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split(' ').next().unwrap_or_default();
            assert!(
                typed.insert(name.to_owned()),
                "two `# TYPE {name}` lines:\n{page}"
            );
        }
    }
    assert!(page.trim_end().ends_with("# EOF"), "no `# EOF`:\n{page}");
    for name in ["test1", "test2"] {
        let label = format!("provider=\"{}\"", c.spec(name).key());
        assert!(
            page.lines()
                .any(|l| l.starts_with("csi_rpcs_finished") && l.contains(&label)),
            "no csi_rpcs_finished series with {label}:\n{page}"
        );
    }
    c.finish().await;
}

/// The JSON transport (`[agent] content_type = "json"`): the same subscription and
/// UPDATE_STATE as with protobuf; the manager is strict about both.
#[tokio::test]
async fn json_transport() {
    let options = DaemonOptions {
        json: true,
        ..DaemonOptions::with_profiles()
    };
    let (c, id, u) = started_with_pool(ProviderSpec::fixture(), options, |_| {}).await;
    assert_provider_resource(u.pool("test").unwrap(), c.spec("test"), &id);
    c.finish().await;
}

/// The provider restarts (SIGTERM, then SIGKILL) while the manager runs: it resubscribes
/// with the same id, reports the same resources, and runs one plugin, not two.
#[tokio::test]
async fn provider_restarts_keep_id_resources_and_one_plugin() {
    let volume = "import-loop-vol1";
    let (mut c, id, first) = started_with_pool(
        ProviderSpec::fixture(),
        DaemonOptions::with_profiles(),
        |c| {
            assert_eq!(c.import_volume("test", "vol1", 2 << 30), volume);
        },
    )
    .await;
    assert_eq!(first.disks().len(), 1);
    assert_eq!(source(first.disks()[0])["id"], volume);
    assert_eq!(c.plugin_pids("test").len(), 1);

    c.stop_daemon_cleanly().await;
    c.wait_no_plugins().await;
    c.start_daemon();
    assert_eq!(id_of(&c.next_subscribed().await), id);
    let u = c.next_update().await;
    assert_eq!(sorted(&u.resources), sorted(&first.resources));
    assert_eq!(c.plugin_pids("test").len(), 1);

    c.kill_daemon().await;
    c.start_daemon();
    assert_eq!(id_of(&c.next_subscribed().await), id);
    let u = c.next_update().await;
    assert_eq!(sorted(&u.resources), sorted(&first.resources));
    let pids = c.plugin_pids("test");
    assert_eq!(
        pids.len(),
        1,
        "one plugin after a SIGKILL and restart: {pids:?}"
    );
    c.finish().await;
}

/// The manager (agent) restarts on the same registry while the provider runs: the
/// provider reconnects, resubscribes with its id and reports its resources again.
#[tokio::test]
async fn manager_restart_resubscribes_with_the_same_id() {
    let (mut c, id, first) = started_with_pool(
        ProviderSpec::fixture(),
        DaemonOptions::with_profiles(),
        |_| {},
    )
    .await;

    c.restart_manager().await;
    assert_eq!(id_of(&c.next_subscribed().await), id);
    let u = c.next_update().await;
    assert_eq!(u.provider_id, id);
    assert_eq!(sorted(&u.resources), sorted(&first.resources));
    assert!(c.daemon_running());
    c.finish().await;
}

/// The fixture with pre-existing 2 GiB and 3 GiB volumes; their ids → sizes in MB.
async fn two_preexisting_volumes() -> (Cluster, BTreeMap<String, f64>) {
    let c = Cluster::fixture().await;
    let small = c.import_volume("test", "vol2g", 2 << 30);
    let large = c.import_volume("test", "vol3g", 3 << 30);
    (c, BTreeMap::from([(small, 2048.0), (large, 3072.0)]))
}

/// The pre-existing RAW disks of an update (id → MB), each checked to be the provider's.
fn disks(u: &Update) -> BTreeMap<String, f64> {
    u.disks()
        .into_iter()
        .map(|d| {
            assert_provider_resource(d, &ProviderSpec::fixture(), &u.provider_id);
            assert_eq!(source(d)["type"], "RAW", "{d}");
            assert!(source(d)["profile"].is_null(), "{d}");
            (source(d)["id"].as_str().unwrap().to_owned(), mb(d))
        })
        .collect()
}

/// ROOT_AgentRegisteredWithNewId (§11.1 test 11), the part without operations: the agent
/// comes back with a new agent ID (its registry of providers is empty) → the restarted
/// daemon subscribes as a new provider (new id), and the plugin's volumes reappear as
/// pre-existing RAW disks of that new provider. (Mesos's volumes are MOUNT disks with
/// persistent volumes, re-imported by CREATE_DISK with `target_profile`: issue #11.)
#[tokio::test]
async fn agent_registered_with_new_id() {
    let (mut c, want) = two_preexisting_volumes().await;
    c.start_daemon();
    let old = id_of(&c.next_subscribed().await);
    let u = c.next_update().await;
    assert_eq!(disks(&u), want);

    c.stop_daemon_cleanly().await;
    c.restart_manager_with_agent_id("11111111-2222-3333-4444-555555555555-S1")
        .await;
    c.start_daemon();
    let new = id_of(&c.next_subscribed().await);
    assert_ne!(new, old, "a new agent ID is a new provider identity");
    let u = c.next_update().await;
    assert_eq!(u.provider_id, new);
    assert_eq!(u.resources.len(), 2, "{:?}", u.resources);
    assert_eq!(disks(&u), want);
    c.finish().await;
}

/// As above, but the daemon keeps running while the agent comes back with a new ID: its
/// resubscription is not admitted, it learns the new agent ID and subscribes as a new
/// provider in-process (spec §3.6); the volumes reappear under the new provider id.
#[tokio::test]
async fn agent_registered_with_new_id_while_the_daemon_runs() {
    let (mut c, want) = two_preexisting_volumes().await;
    c.start_daemon();
    let old = id_of(&c.next_subscribed().await);
    assert_eq!(disks(&c.next_update().await), want);

    c.restart_manager_with_agent_id("11111111-2222-3333-4444-555555555555-S1")
        .await;
    let new = id_of(&c.next_subscribed().await);
    assert_ne!(new, old, "a new agent ID is a new provider identity");
    let u = c.next_update().await;
    assert_eq!(u.provider_id, new);
    assert_eq!(u.resources.len(), 2, "{:?}", u.resources);
    assert_eq!(disks(&u), want);
    assert!(c.daemon_running());
    c.finish().await;
}

/// AgentFailoverPluginKilled (§11.1 test 10): while the agent is down the plugin is
/// SIGKILLed; when the agent is back the provider has relaunched its plugin, resubscribes
/// with its id and reports its resources again.
async fn agent_failover_plugin_killed(csi: &'static str) {
    let (mut c, id, first) = started_with_pool(
        ProviderSpec::fixture().csi(csi),
        DaemonOptions::with_profiles(),
        |_| {},
    )
    .await;
    c.stop_manager().await;
    let old = c.kill_plugin("test").await;
    c.resume_manager().await;
    assert_eq!(id_of(&c.next_subscribed().await), id);
    let u = c.next_update().await;
    assert_eq!(sorted(&u.resources), sorted(&first.resources));
    c.plugin_relaunched("test", old).await;
    c.finish().await;
}
csi_versions!(agent_failover_plugin_killed);

/// ContainerTerminationMetric (§11.1 test 24): `csi_plugin/container_terminations` is 0,
/// then 1 after the plugin is SIGKILLed (and relaunched).
async fn container_termination_metric(csi: &'static str) {
    let (c, _, _) = started_with_pool(
        ProviderSpec::fixture().csi(csi),
        DaemonOptions::with_profiles(),
        |_| {},
    )
    .await;
    let key = format!(
        "resource_providers/{}/csi_plugin/container_terminations",
        c.spec("test").key()
    );
    assert_eq!(c.snapshot().await.get(&key), Some(&0.0));
    let old = c.kill_plugin("test").await;
    c.snapshot_until("the termination counted", |s| s.get(&key) == Some(&1.0))
        .await;
    c.plugin_relaunched("test", old).await;
    assert_eq!(c.snapshot().await.get(&key), Some(&1.0));
    c.finish().await;
}
csi_versions!(container_termination_metric);

/// DISABLED_SmallDisk (§11.1 test 3, disabled in Mesos): a 512 KiB storage pool and a
/// 512 KiB pre-existing volume are reported with exactly 0.5 MB (spec §6.1: MB as a
/// double, not rounded).
async fn small_disk(csi: &'static str) {
    let mut spec = ProviderSpec::fixture().csi(csi);
    spec.pools = vec![format!("default={}", 512 << 10)];
    let (c, _, u) = started_with_pool(spec, DaemonOptions::with_profiles(), |c| {
        c.import_volume("test", "small", 512 << 10);
    })
    .await;
    assert_eq!(mb(u.pool("test").unwrap()), 0.5, "{:?}", u.resources);
    let disks = u.disks();
    assert_eq!(disks.len(), 1, "{:?}", u.resources);
    assert_eq!(source(disks[0])["id"], "import-loop-small");
    assert_eq!(mb(disks[0]), 0.5, "{:?}", u.resources);
    c.finish().await;
}
csi_versions!(small_disk);

/// DISABLED_ZeroSizedDisk (§11.1 test 2, disabled in Mesos): a 0-byte pre-existing
/// volume produces no resource; a 1 MiB one beside it does (so the listing was seen).
async fn zero_sized_disk(csi: &'static str) {
    let mut c = Cluster::fixture_csi(csi).await;
    c.import_volume("test", "empty", 0);
    let one = c.import_volume("test", "one", 1 << 20);
    c.start_daemon();
    c.next_subscribed().await;
    let u = c.next_update().await;
    assert_eq!(u.resources.len(), 1, "{:?}", u.resources);
    assert_eq!(source(&u.resources[0])["id"], one.as_str());
    assert_eq!(mb(&u.resources[0]), 1.0);
    c.finish().await;
}
csi_versions!(zero_sized_disk);
