//! Mesos's provider tests about plugin containers (spec §11.1) with the plugins run by the
//! agent: `slrp run --plugin-backend agent` launches `slrp-csi-local` through the embedded
//! manager's operator API (LAUNCH/WAIT/KILL/GET_CONTAINERS), as Mesos's SLRP does through
//! its container daemons. The manager keeps its containers across its own restarts (an
//! agent going down leaves them running) and counts a REMOVE_CONTAINER of a top-level
//! container as a protocol violation (a Mesos 1.11 agent aborts on it), which fails every
//! test here at its `finish`.

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

use slrp_manager::ManagerMessage;
use support::{Cluster, DaemonOptions, ProviderSpec, Update, cid_prefix, profiles, sorted, source};

/// The provider id of a SUBSCRIBED provider's info.
fn id_of(info: &serde_json::Value) -> String {
    info["id"]["value"].as_str().unwrap().to_owned()
}

/// Profiles re-read every 100 ms and the plugins run by the agent.
fn agent_options() -> DaemonOptions {
    DaemonOptions {
        agent_backend: true,
        ..DaemonOptions::with_profiles()
    }
}

/// `resource_providers/<key>/csi_plugin/container_terminations`.
fn terminations_key(c: &Cluster) -> String {
    format!(
        "resource_providers/{}/csi_plugin/container_terminations",
        c.spec("test").key()
    )
}

/// Starts the fixture speaking `csi` under `options` with profile `test`, waits for its
/// pool; checks that the one plugin process is the agent's container of the provider.
/// Returns the cluster, the provider id, that update and the plugin's pid.
async fn started(csi: &'static str, options: DaemonOptions) -> (Cluster, String, Update, i32) {
    let mut c = Cluster::new(vec![ProviderSpec::fixture().csi(csi)], options).await;
    c.set_profiles(&profiles(&["test"]));
    c.start_daemon();
    let id = id_of(&c.next_subscribed().await);
    let u = c.update_where(|u| u.pool("test").is_some()).await;
    assert_eq!(u.provider_id, id);
    let pid = c.plugin_pid("test");
    let container = c.agent_plugin_container("test").await;
    assert_eq!(
        container.pid,
        Some(pid),
        "the plugin process is the agent's container {}",
        container.id
    );
    (c, id, u, pid)
}

/// What the manager observed after a restart until the provider's resources came back:
/// the SUBSCRIBE's provider id, the first UPDATE_STATE after it, and the IDs of the
/// containers launched (LAUNCH answered 200) meanwhile. With `launch_expected`, waits on
/// (past the update) until a launch was seen.
async fn resubscription(c: &mut Cluster, launch_expected: bool) -> (String, Update, Vec<String>) {
    let mut id = None;
    let mut update = None;
    let mut launched = Vec::new();
    while id.is_none() || update.is_none() || (launch_expected && launched.is_empty()) {
        match c.next_message().await {
            ManagerMessage::Subscribed { info } => {
                id = Some(id_of(&slrp_wire::json::to_value(&info).unwrap()));
            }
            ManagerMessage::UpdateState {
                provider_id,
                resources,
                resource_version_uuid,
                ..
            } if id.is_some() && update.is_none() => {
                update = Some(Update::new(provider_id, &resources, &resource_version_uuid));
            }
            ManagerMessage::ContainerLaunched { id } => launched.push(id),
            _ => {}
        }
    }
    (id.unwrap(), update.unwrap(), launched)
}

/// AgentFailoverPluginKilled (§11.1 test 10) with the agent backend: while the agent is
/// down the plugin is SIGKILLed; the resumed agent has forgotten the dead container (its
/// WAIT answers 404), so the provider relaunches it through LAUNCH_CONTAINER, resubscribes
/// with its id and reports the same resources.
async fn agent_failover_plugin_killed(csi: &'static str) {
    let (mut c, id, first, _) = started(csi, agent_options()).await;
    let container = c.agent_plugin_container("test").await.id;
    assert!(container.starts_with(&cid_prefix("test")), "{container}");

    c.stop_manager().await;
    let old = c.kill_plugin("test").await;
    c.resume_manager().await;
    let (again, u, launched) = resubscription(&mut c, true).await;
    assert_eq!(again, id);
    assert_eq!(sorted(&u.resources), sorted(&first.resources));
    assert_eq!(
        launched,
        std::slice::from_ref(&container),
        "relaunched under its ID"
    );
    let new = c.agent_plugin_relaunched("test", old).await;
    assert_eq!(c.agent_plugin_container("test").await.id, container);
    assert_ne!(new, old);
    c.finish().await;
}
csi_versions!(agent_failover_plugin_killed);

/// ContainerTerminationMetric (§11.1 test 24) with the agent backend:
/// `csi_plugin/container_terminations` is 0, then 1 after the plugin container is
/// SIGKILLed (its WAIT answered) and relaunched through the agent.
async fn container_termination_metric(csi: &'static str) {
    let (c, _, _, _) = started(csi, agent_options()).await;
    let key = terminations_key(&c);
    assert_eq!(c.snapshot().await.get(&key), Some(&0.0));
    let old = c.kill_plugin("test").await;
    c.snapshot_until("the termination counted", |s| s.get(&key) == Some(&1.0))
        .await;
    c.agent_plugin_relaunched("test", old).await;
    assert_eq!(c.snapshot().await.get(&key), Some(&1.0));
    c.finish().await;
}
csi_versions!(container_termination_metric);

/// With `plugins_on_exit = "leave"` a restarted daemon finds its plugin still running
/// under the agent: its LAUNCH is answered 202 (the same container ID and
/// `container.info`), so there is no second plugin process, the pid is the same and no
/// termination is counted.
async fn adoption_after_a_slrp_restart_with_no_duplicate_plugin(csi: &'static str) {
    let options = DaemonOptions {
        leave_plugins: true,
        ..agent_options()
    };
    let (mut c, id, first, pid) = started(csi, options).await;
    let container = c.agent_plugin_container("test").await.id;

    c.stop_daemon_cleanly().await;
    assert_eq!(c.plugin_pids("test"), [pid], "left running by the stop");
    c.start_daemon();
    let (again, u, launched) = resubscription(&mut c, false).await;
    assert_eq!(again, id);
    assert_eq!(sorted(&u.resources), sorted(&first.resources));
    assert!(
        launched.is_empty(),
        "the running container is re-used (202), not launched again: {launched:?}"
    );
    assert_eq!(c.plugin_pids("test"), [pid], "one plugin process, the same");
    let view = c.agent_plugin_container("test").await;
    assert_eq!((view.id, view.pid), (container, Some(pid)));
    assert_eq!(c.snapshot().await.get(&terminations_key(&c)), Some(&0.0));
    c.finish().await;
}
csi_versions!(adoption_after_a_slrp_restart_with_no_duplicate_plugin);

/// ROOT_AgentRegisteredWithNewId (§11.1 test 11) with the agent backend, the daemon
/// running throughout: the agent comes back with a new agent ID and an empty registry, but
/// it kept its containers; the provider subscribes as a new provider, its plugin is the
/// same process (no relaunch, no termination), and the plugin's volumes reappear as
/// pre-existing RAW disks of the new provider.
async fn agent_registered_with_new_id(csi: &'static str) {
    let mut c = Cluster::new(vec![ProviderSpec::fixture().csi(csi)], agent_options()).await;
    let want = BTreeMap::from([
        (c.import_volume("test", "vol2g", 2 << 30), 2048.0),
        (c.import_volume("test", "vol3g", 3 << 30), 3072.0),
    ]);
    let disks = |u: &Update| -> BTreeMap<String, f64> {
        u.disks()
            .into_iter()
            .map(|d| {
                assert_eq!(d["provider_id"]["value"], u.provider_id.as_str(), "{d}");
                assert_eq!(source(d)["type"], "RAW", "{d}");
                (source(d)["id"].as_str().unwrap().to_owned(), support::mb(d))
            })
            .collect()
    };
    c.start_daemon();
    let old = id_of(&c.next_subscribed().await);
    assert_eq!(disks(&c.next_update().await), want);
    let pid = c.plugin_pid("test");
    let container = c.agent_plugin_container("test").await;
    assert_eq!(container.pid, Some(pid));

    c.restart_manager_with_agent_id("11111111-2222-3333-4444-555555555555-S1")
        .await;
    let (new, u, launched) = resubscription(&mut c, false).await;
    assert_ne!(new, old, "a new agent ID is a new provider identity");
    assert_eq!(u.provider_id, new);
    assert_eq!(u.resources.len(), 2, "{:?}", u.resources);
    assert_eq!(disks(&u), want);
    assert!(launched.is_empty(), "nothing relaunched: {launched:?}");
    assert_eq!(c.plugin_pids("test"), [pid], "the container survived");
    let view = c.agent_plugin_container("test").await;
    assert_eq!((view.id, view.pid), (container.id, Some(pid)));
    assert_eq!(c.snapshot().await.get(&terminations_key(&c)), Some(&0.0));
    assert!(c.daemon_running());
    c.finish().await;
}
csi_versions!(agent_registered_with_new_id);
