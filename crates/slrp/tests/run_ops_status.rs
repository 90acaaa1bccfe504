//! Mesos's operation-status tests (spec §11.1, §8.5): reliable status updates, their
//! acknowledgements, operation reconciliation, the operation metrics and the retries of
//! CSI calls, against the real daemon. The daemon's retry intervals are shortened through
//! its config (`[retries]`, see `support::STATUS_RETRY_MIN`), never waited for at Mesos's
//! 10 s.

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

use std::time::Duration;

use serde_json::{Value, json};
use slrp_manager::{AckPolicy, ApplyRequest, ManagerMessage};
use slrp_proto::mesos::v1::resource_provider::call;
use support::ops::{self, FRAMEWORK_ROLE, allocated, create_disk, destroy_disk, with_id};
use support::{Cluster, DaemonOptions, ProviderSpec, STATUS_RETRY_MAX, profiles, sorted, source};

/// The fixture with profile `test`, started, and its pool.
async fn with_pool(csi: &'static str) -> (Cluster, Value) {
    let mut c = Cluster::new(
        vec![ProviderSpec::fixture().csi(csi)],
        DaemonOptions::with_profiles(),
    )
    .await;
    c.set_profiles(&profiles(&["test"]));
    c.start_daemon();
    let u = c.update_where(|u| u.pool("test").is_some()).await;
    let pool = u.pool("test").unwrap().clone();
    (c, pool)
}

/// A CREATE_DISK(MOUNT) of 1 GiB of `pool`, with operation id `id`.
fn create_1g(pool: &Value, id: &str) -> slrp_proto::mesos::v1::offer::Operation {
    with_id(
        create_disk(
            &allocated(&ops::portion(pool, 1024.0), FRAMEWORK_ROLE),
            "MOUNT",
            None,
        ),
        id,
    )
}

/// The operation uuid and status uuid of an update.
fn uuids(u: &call::UpdateOperationStatus) -> (uuid::Uuid, Option<uuid::Uuid>) {
    let op = uuid::Uuid::from_slice(&u.operation_uuid.value).unwrap();
    let status = u
        .status
        .uuid
        .as_ref()
        .map(|s| uuid::Uuid::from_slice(&s.value).unwrap());
    (op, status)
}

/// The next status update of operation `op`.
async fn next_update_of(c: &mut Cluster, op: uuid::Uuid) -> call::UpdateOperationStatus {
    loop {
        let u = c.next_status_update().await;
        if uuids(&u).0 == op {
            return u;
        }
    }
}

/// How long to watch for a resend that must not come: beyond two doublings of the
/// longest interval, so a provider that ignored the acknowledgement would have resent.
const QUIET: Duration = Duration::from_millis(2 * STATUS_RETRY_MAX.as_millis() as u64 + 500);

/// Asserts that no status update of `op` arrives within [`QUIET`].
async fn no_more_updates_of(c: &mut Cluster, op: uuid::Uuid) {
    let deadline = tokio::time::Instant::now() + QUIET;
    while let Ok(Some(m)) = tokio::time::timeout_at(deadline, c.next_raw_message()).await {
        if let ManagerMessage::UpdateOperationStatus { update, .. } = m
            && uuids(&update).0 == op
        {
            c.fail(&format!(
                "operation {op} got another status update after its acknowledgement: {}",
                ops::status_json(&update.status)
            ));
        }
    }
}

/// RetryOperationStatusUpdate (§11.1 test 22): the first status update of a CREATE_DISK
/// is lost on its way to the master; the provider resends it (same status uuid) after
/// the retry interval; the master acknowledges it and no further resend comes.
async fn retry_operation_status_update(csi: &'static str) {
    let (mut c, pool) = with_pool(csi).await;
    c.set_ack_policy(AckPolicy::DropFirst(1));
    let op = c.apply(create_1g(&pool, "op")).await;
    let first = next_update_of(&mut c, op).await;
    let status = uuids(&first)
        .1
        .expect("a reliable update has a status uuid");
    assert_eq!(ops::state_name(&first.status), "OPERATION_FINISHED");
    let resent = next_update_of(&mut c, op).await;
    assert_eq!(uuids(&resent).1, Some(status), "the same update, resent");
    assert_eq!(resent.status, first.status);
    no_more_updates_of(&mut c, op).await;
    assert_eq!(
        ops::state_name(&c.terminal(op).await.latest_status),
        "OPERATION_FINISHED"
    );
    c.finish().await;
}
csi_versions!(retry_operation_status_update);

/// RetryOperationStatusUpdateAfterRecovery (§11.1 test 23): the status update of a
/// CREATE_DISK goes unacknowledged and the daemon restarts; the recovered provider resends
/// the same update (its status stream is durable); once acknowledged, no more resends.
async fn retry_operation_status_update_after_recovery(csi: &'static str) {
    let (mut c, pool) = with_pool(csi).await;
    c.set_ack_policy(AckPolicy::Manual);
    let op = c.apply(create_1g(&pool, "op")).await;
    let first = next_update_of(&mut c, op).await;
    let status = uuids(&first).1.unwrap();
    c.stop_daemon_cleanly().await;
    // Only what the restarted daemon sends counts; the master acknowledges it.
    c.drain_messages();
    c.set_ack_policy(AckPolicy::Auto);
    c.start_daemon();
    let resent = next_update_of(&mut c, op).await;
    assert_eq!(
        uuids(&resent).1,
        Some(status),
        "the same update, after recovery"
    );
    assert_eq!(resent.status, first.status);
    no_more_updates_of(&mut c, op).await;
    c.finish().await;
}
csi_versions!(retry_operation_status_update_after_recovery);

/// RetryOperationStatusUpdateToScheduler (§11.1 test 29): the framework does not
/// acknowledge at first; the update is resent after the retry interval; once the
/// framework acknowledges it the provider stops resending; one finished operation is
/// counted.
async fn retry_operation_status_update_to_scheduler(csi: &'static str) {
    let (mut c, pool) = with_pool(csi).await;
    c.set_ack_policy(AckPolicy::Manual);
    let op = c.apply(create_1g(&pool, "op")).await;
    let first = next_update_of(&mut c, op).await;
    let status = uuids(&first).1.unwrap();
    let resent = next_update_of(&mut c, op).await;
    assert_eq!(uuids(&resent).1, Some(status));
    let resent_again = next_update_of(&mut c, op).await;
    assert_eq!(
        uuids(&resent_again).1,
        Some(status),
        "resent until acknowledged"
    );
    let id = c.the_provider_id().await;
    c.manager().acknowledge(&id, op, status).await.unwrap();
    no_more_updates_of(&mut c, op).await;
    let snap = counted(&c, "operations/create_disk/finished", 1.0).await;
    assert_eq!(snap[&metric("operations/create_disk/pending")], 0.0);
    c.finish().await;
}
csi_versions!(retry_operation_status_update_to_scheduler);

/// Waits until the fixture provider's metric `name` is `value`; returns that snapshot.
async fn counted(c: &Cluster, name: &str, value: f64) -> std::collections::BTreeMap<String, f64> {
    let key = metric(name);
    c.snapshot_until(&format!("{name} = {value}"), |s| {
        s.get(&key) == Some(&value)
    })
    .await
}

/// How many MOUNT disks the agent's total (sorted JSON texts) holds.
fn mount_disks(total: &[String]) -> usize {
    total.iter().filter(|r| r.contains("\"MOUNT\"")).count()
}

/// The fixture provider's metric `name`.
fn metric(name: &str) -> String {
    format!(
        "resource_providers/{}/{name}",
        ProviderSpec::fixture().key()
    )
}

/// OperationUpdate (§11.1 test 25): a framework's CREATE_DISK with an operation id: the
/// update carries that id, state FINISHED, a status uuid, the agent id and the provider
/// id (also in `latest_status`), the framework id; one finished operation is counted.
async fn operation_update(csi: &'static str) {
    let (mut c, pool) = with_pool(csi).await;
    let op = c.apply(create_1g(&pool, "operation-1")).await;
    let u = next_update_of(&mut c, op).await;
    let provider = c.the_provider_id().await;
    let agent = c.manager().agent_id().to_owned();
    for s in [Some(&u.status), u.latest_status.as_ref()] {
        let s = ops::status_json(s.expect("latest_status is set"));
        assert_eq!(s["operation_id"]["value"], "operation-1", "{s}");
        assert_eq!(s["state"], "OPERATION_FINISHED", "{s}");
        assert!(s["uuid"]["value"].is_string(), "{s}");
        assert_eq!(s["agent_id"]["value"], agent.as_str(), "{s}");
        assert_eq!(s["resource_provider_id"]["value"], provider.as_str(), "{s}");
    }
    assert_eq!(
        u.framework_id.as_ref().map(|f| f.value.as_str()),
        Some(support::FRAMEWORK_ID)
    );
    c.terminal(op).await;
    counted(&c, "operations/create_disk/finished", 1.0).await;
    c.finish().await;
}
csi_versions!(operation_update);

/// OperationStateMetrics (§11.1 test 26): `create_disk/finished` = 1 after a create; the
/// volume's directory removed behind the plugin's back makes its DeleteVolume fail (Mesos's
/// test plugin answers an error from its `rmdir`; here a fault rule gives that answer:
/// the bundled plugin's own DeleteVolume tolerates a missing directory, and a NOT_FOUND
/// counts as deleted, as CSI's idempotency asks), so DESTROY_DISK fails
/// (`destroy_disk/failed` = 1); a DESTROY_DISK with a tampered resource version is
/// DROPPED (`destroy_disk/dropped` = 1); nothing pending.
async fn operation_state_metrics(csi: &'static str) {
    let (c, pool) = with_pool(csi).await;
    let disk = c.finished_one(create_1g(&pool, "create")).await;
    counted(&c, "operations/create_disk/finished", 1.0).await;
    c.set_faults(
        "test",
        &json!([{"rpc": "DeleteVolume", "fail": "INTERNAL", "message": "rmdir: No such file or directory", "times": 1}]),
    );
    c.ended(with_id(destroy_disk(&disk), "destroy"), "OPERATION_FAILED")
        .await;
    let mut tampered = ApplyRequest::new(with_id(destroy_disk(&disk), "tampered"));
    tampered.framework_id = Some(support::framework_id());
    tampered.resource_version = Some(slrp_proto::mesos::v1::Uuid {
        value: uuid::Uuid::new_v4().as_bytes().to_vec(),
    });
    let uuid = c.apply_request(tampered).await;
    assert_eq!(
        ops::state_name(&c.terminal(uuid).await.latest_status),
        "OPERATION_DROPPED"
    );
    let snap = c
        .snapshot_until("destroy_disk failed 1 and dropped 1", |s| {
            s.get(&metric("operations/destroy_disk/failed")) == Some(&1.0)
                && s.get(&metric("operations/destroy_disk/dropped")) == Some(&1.0)
        })
        .await;
    assert_eq!(snap[&metric("operations/create_disk/finished")], 1.0);
    assert_eq!(snap[&metric("operations/create_disk/pending")], 0.0);
    assert_eq!(snap[&metric("operations/destroy_disk/pending")], 0.0);
    assert_eq!(snap[&metric("operations/destroy_disk/finished")], 0.0);
    c.finish().await;
}
csi_versions!(operation_state_metrics);

/// ReconcileDroppedOperation (§11.1 test 28): two CREATE_DISKs, the second's
/// APPLY_OPERATION lost in transit; the master reconciles the one still pending; the
/// provider answers DROPPED (unreliable: no status uuid) for it, never having seen it;
/// the states are {FINISHED, DROPPED} and exactly one MOUNT disk results.
async fn reconcile_dropped_operation(csi: &'static str) {
    let (mut c, pool) = with_pool(csi).await;
    let delivered = c.apply(create_1g(&pool, "delivered")).await;
    let mut lost = ApplyRequest::new(create_1g(&pool, "lost"));
    lost.framework_id = Some(support::framework_id());
    lost.deliver = false;
    let lost = c.apply_request(lost).await;
    assert_eq!(
        ops::state_name(&c.terminal(delivered).await.latest_status),
        "OPERATION_FINISHED"
    );
    let id = c.the_provider_id().await;
    // The master reconciles what it believes pending: the delivered operation is
    // terminal (and acknowledged) already.
    c.manager()
        .reconcile_operations(&id, vec![lost])
        .await
        .unwrap();
    let dropped = next_update_of(&mut c, lost).await;
    assert_eq!(ops::state_name(&dropped.status), "OPERATION_DROPPED");
    assert_eq!(dropped.status.message.as_deref(), Some("Unknown operation"));
    assert_eq!(uuids(&dropped).1, None, "unreliable: no status uuid");
    assert_eq!(
        ops::state_name(&c.terminal(lost).await.latest_status),
        "OPERATION_DROPPED"
    );
    let total = c.agent_total().await;
    assert_eq!(mount_disks(&total), 1, "{total:?}");
    counted(&c, "operations/unknown/dropped", 1.0).await;
    c.finish().await;
}
csi_versions!(reconcile_dropped_operation);

/// ReconcileUnacknowledgedTerminalOperation (§11.1 test 30): a FINISHED CREATE_DISK stays
/// unacknowledged; a reconciliation of it gets no DROPPED (the provider tracks it); after
/// an agent restart the provider lists it FINISHED in UPDATE_STATE and resends the same
/// update until it is acknowledged.
async fn reconcile_unacknowledged_terminal_operation(csi: &'static str) {
    let (mut c, pool) = with_pool(csi).await;
    c.set_ack_policy(AckPolicy::Manual);
    let op = c.apply(create_1g(&pool, "op")).await;
    let first = next_update_of(&mut c, op).await;
    let status = uuids(&first).1.unwrap();
    let id = c.the_provider_id().await;
    c.manager()
        .reconcile_operations(&id, vec![op])
        .await
        .unwrap();
    c.restart_manager().await;
    // The resend may come before or after the UPDATE_STATE of the new session.
    let (mut state, mut resent) = (None, None);
    while state.is_none() || resent.is_none() {
        match c.next_message().await {
            ManagerMessage::UpdateState {
                operations,
                resources,
                ..
            } if state.is_none() => state = Some((operations, resources)),
            ManagerMessage::UpdateOperationStatus { update, .. } if uuids(&update).0 == op => {
                resent = Some(update);
            }
            _ => {}
        }
    }
    let ((operations, resources), resent) = (state.unwrap(), resent.unwrap());
    let listed: Vec<Value> = operations
        .iter()
        .map(|o| slrp_wire::json::to_value(o).unwrap())
        .collect();
    let [o] = &listed[..] else {
        panic!("one tracked operation: {listed:?}")
    };
    assert_eq!(o["latest_status"]["state"], "OPERATION_FINISHED", "{o}");
    assert_eq!(o["info"]["id"]["value"], "op", "{o}");
    let mount: Vec<Value> = resources
        .iter()
        .map(ops::json_of)
        .filter(|r| source(r)["type"] == "MOUNT")
        .collect();
    assert_eq!(mount.len(), 1, "the disk is in the total: {resources:?}");
    assert_eq!(
        uuids(&resent).1,
        Some(status),
        "resent after the reconnection"
    );
    assert_eq!(ops::state_name(&resent.status), "OPERATION_FINISHED");
    let id = c.the_provider_id().await;
    c.manager().acknowledge(&id, op, status).await.unwrap();
    no_more_updates_of(&mut c, op).await;
    c.finish().await;
}
csi_versions!(reconcile_unacknowledged_terminal_operation);

/// RetryRpcWithExponentialBackoff (§11.1 test 31): CreateVolume fails with
/// DEADLINE_EXCEEDED then UNAVAILABLE (`n` times in all), is retried each time and then
/// succeeds → FINISHED; DeleteVolume fails `n` times retryably, then UNIMPLEMENTED →
/// FAILED without a further retry. RPC metrics: +1 finished, +2n+1 failed.
async fn retry_rpc_with_exponential_backoff(csi: &'static str) {
    const N: u64 = 4;
    let (c, pool) = with_pool(csi).await;
    let finished = c.provider_metric("test", "csi_plugin/rpcs_finished").await;
    let failed = c.provider_metric("test", "csi_plugin/rpcs_failed").await;
    c.set_faults(
        "test",
        &json!([
            {"rpc": "CreateVolume", "fail": "DEADLINE_EXCEEDED", "times": N / 2},
            {"rpc": "CreateVolume", "fail": "UNAVAILABLE", "times": N / 2},
        ]),
    );
    let disk = c.finished_one(create_1g(&pool, "create")).await;
    assert_eq!(
        c.faults_left("test"),
        json!([]),
        "every failure was retried"
    );
    c.set_faults(
        "test",
        &json!([
            {"rpc": "DeleteVolume", "fail": "UNAVAILABLE", "times": N},
            {"rpc": "DeleteVolume", "fail": "UNIMPLEMENTED", "times": 1},
            {"rpc": "DeleteVolume", "delay_ms": 0, "times": 1_000_000},
        ]),
    );
    c.ended(destroy_disk(&disk), "OPERATION_FAILED").await;
    let left = c.faults_left("test");
    assert_eq!(
        left,
        json!([{"rpc": "DeleteVolume", "delay_ms": 0, "times": 1_000_000}]),
        "no retry after UNIMPLEMENTED"
    );
    let snap = c.snapshot().await;
    assert_eq!(snap[&metric("csi_plugin/rpcs_finished")] - finished, 1.0);
    assert_eq!(
        snap[&metric("csi_plugin/rpcs_failed")] - failed,
        (2 * N + 1) as f64
    );
    c.finish().await;
}
csi_versions!(retry_rpc_with_exponential_backoff);

/// CsiPluginRpcMetrics (§11.1 test 27), the operation half: a CREATE_DISK adds one
/// finished RPC (CreateVolume); a DESTROY_DISK whose DeleteVolume fails (non-retryable)
/// adds one failed RPC.
async fn csi_plugin_rpc_metrics(csi: &'static str) {
    let (c, pool) = with_pool(csi).await;
    let finished = c.provider_metric("test", "csi_plugin/rpcs_finished").await;
    let failed = c.provider_metric("test", "csi_plugin/rpcs_failed").await;
    let disk = c.finished_one(create_1g(&pool, "create")).await;
    assert_eq!(
        c.provider_metric("test", "csi_plugin/rpcs_finished").await - finished,
        1.0
    );
    c.set_faults(
        "test",
        &json!([{"rpc": "DeleteVolume", "fail": "INTERNAL", "times": 1}]),
    );
    c.ended(destroy_disk(&disk), "OPERATION_FAILED").await;
    let snap = c.snapshot().await;
    assert_eq!(snap[&metric("csi_plugin/rpcs_finished")] - finished, 1.0);
    assert_eq!(snap[&metric("csi_plugin/rpcs_failed")] - failed, 1.0);
    // The disk stays (a failed DESTROY_DISK changes nothing).
    let total = c.agent_total().await;
    assert_eq!(total.len(), 2, "{total:?}");
    assert!(
        total.contains(&sorted(&[ops::unallocated(&disk)])[0]),
        "{total:?}"
    );
    c.finish().await;
}
csi_versions!(csi_plugin_rpc_metrics);

/// A duplicate operation uuid (spec §5.2 step 4; Mesos aborts): an APPLY_OPERATION sent
/// again while the first is still running, and again after it finished unacknowledged, is
/// answered with the operation's latest status and applied only once: one CreateVolume
/// answered, one volume, one disk in the agent's total, `create_disk/finished` 1, the
/// daemon still running.
async fn duplicate_operation_uuid_is_answered_not_applied_again(csi: &'static str) {
    let (mut c, pool) = with_pool(csi).await;
    c.set_ack_policy(AckPolicy::Manual);
    // A slow CreateVolume keeps the first application running while the duplicate comes.
    c.set_faults(
        "test",
        &json!([{"rpc": "CreateVolume", "delay_ms": 500, "times": 1_000_000}]),
    );
    let op = uuid::Uuid::new_v4();
    let request = || {
        let mut req = ApplyRequest::new(create_1g(&pool, "op"));
        req.framework_id = Some(support::framework_id());
        req.operation_uuid = Some(op);
        req
    };
    c.apply_request(request()).await;
    c.apply_request(request()).await;
    let first = next_update_of(&mut c, op).await;
    assert_eq!(ops::state_name(&first.status), "OPERATION_FINISHED");
    let status = uuids(&first).1.unwrap();
    // After the terminal status (unacknowledged, so the agent still tracks the uuid):
    // answered again with that status.
    c.apply_request(request()).await;
    let answer = next_update_of(&mut c, op).await;
    assert_eq!(uuids(&answer).1, Some(status));
    assert_eq!(answer.status, first.status);
    let id = c.the_provider_id().await;
    c.manager().acknowledge(&id, op, status).await.unwrap();
    assert_eq!(c.calls("test", "CreateVolume"), 1, "applied once");
    assert_eq!(c.plugin_volumes("test").len(), 1);
    let total = c.agent_total().await;
    assert_eq!(mount_disks(&total), 1, "{total:?}");
    let snap = counted(&c, "operations/create_disk/finished", 1.0).await;
    assert_eq!(snap[&metric("operations/create_disk/pending")], 0.0);
    assert!(c.daemon_running());
    c.finish().await;
}
csi_versions!(duplicate_operation_uuid_is_answered_not_applied_again);

/// Nothing is lost across a disconnection (spec §8.5: paused while disconnected, resumed
/// on READY): a CREATE_DISK whose (slowed) CreateVolume is running when the agent goes
/// away finishes while it is away; when the agent is back the provider's UPDATE_STATE
/// lists the operation FINISHED with the disk in its total, and then the status update
/// comes, with the one status uuid of the operation; the agent's view has the disk once.
async fn status_of_an_operation_finished_while_disconnected_is_delivered(csi: &'static str) {
    let (mut c, pool) = with_pool(csi).await;
    c.set_faults(
        "test",
        &json!([{"rpc": "CreateVolume", "delay_ms": 1000, "times": 1}]),
    );
    let op = c.apply(create_1g(&pool, "op")).await;
    // The plugin consumes the rule when the call arrives.
    c.within("CreateVolume to be called", async {
        while c.faults_left("test") != json!([]) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    c.stop_manager().await;
    counted(&c, "operations/create_disk/finished", 1.0).await;
    c.resume_manager().await;
    let (mut state, mut updates) = (None, Vec::new());
    while state.is_none() || updates.is_empty() {
        match c.next_message().await {
            ManagerMessage::UpdateState {
                operations,
                resources,
                ..
            } if state.is_none() => {
                assert!(
                    updates.is_empty(),
                    "the status comes after the UPDATE_STATE"
                );
                state = Some((operations, resources));
            }
            ManagerMessage::UpdateOperationStatus { update, .. } if uuids(&update).0 == op => {
                updates.push(update);
            }
            _ => {}
        }
    }
    let (operations, resources) = state.unwrap();
    let listed: Vec<Value> = operations
        .iter()
        .map(|o| slrp_wire::json::to_value(o).unwrap())
        .collect();
    let [o] = &listed[..] else {
        panic!("one tracked operation: {listed:?}")
    };
    assert_eq!(o["latest_status"]["state"], "OPERATION_FINISHED", "{o}");
    let mount = resources
        .iter()
        .map(ops::json_of)
        .filter(|r| source(r)["type"] == "MOUNT")
        .count();
    assert_eq!(mount, 1, "{resources:?}");
    let update = &updates[0];
    assert_eq!(ops::state_name(&update.status), "OPERATION_FINISHED");
    assert!(uuids(update).1.is_some());
    assert_eq!(
        ops::state_name(&c.terminal(op).await.latest_status),
        "OPERATION_FINISHED"
    );
    assert_eq!(mount_disks(&c.agent_total().await), 1);
    no_more_updates_of(&mut c, op).await;
    c.finish().await;
}
csi_versions!(status_of_an_operation_finished_while_disconnected_is_delivered);
