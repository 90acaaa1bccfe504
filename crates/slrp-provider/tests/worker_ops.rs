//! The provider worker's operations (spec §5, §8.5) against the real embedded manager
//! (HTTP on a unix socket) and a volume manager over the in-memory fake plugin: disk
//! operations, durable-before-applied, duplicates, deferral during a reconciliation,
//! status retries and acknowledgements, reconciliation of unknown operations, publish.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod worker_env;

use std::time::Duration;

use slrp_core::provider::operations::StatusRetry;
use slrp_core::provider::resources::Resources;
use slrp_csi::CsiRpc;
use slrp_manager::{ApplyRequest, ManagerMessage};
use slrp_proto::mesos::v1::resource::disk_info::source::Type as SourceType;
use slrp_proto::mesos::v1::resource_provider::{Event, call, event};
use slrp_proto::mesos::v1::{OperationState, Resource, Uuid, offer};
use slrp_provider::persist::load_operations;
use slrp_provider::worker::{ProviderParams, ProviderStatus};
use slrp_test_support::fake_csi::FakeCsi;
use slrp_test_support::harness::until;
use slrp_types::Jitter;
use worker_env::*;

fn proto(uuid: uuid::Uuid) -> Uuid {
    Uuid {
        value: uuid.as_bytes().to_vec(),
    }
}

fn apply_event(info: offer::Operation, operation: uuid::Uuid, version: &[u8]) -> Event {
    Event {
        r#type: Some(event::Type::ApplyOperation as i32),
        apply_operation: Some(event::ApplyOperation {
            framework_id: None,
            info,
            operation_uuid: proto(operation),
            resource_version_uuid: Uuid {
                value: version.to_vec(),
            },
        }),
        ..Event::default()
    }
}

fn ack_event(operation: &[u8], status: &Uuid) -> Event {
    Event {
        r#type: Some(event::Type::AcknowledgeOperationStatus as i32),
        acknowledge_operation_status: Some(event::AcknowledgeOperationStatus {
            status_uuid: status.clone(),
            operation_uuid: Uuid {
                value: operation.to_vec(),
            },
        }),
        ..Event::default()
    }
}

fn reconcile_event(operation: uuid::Uuid) -> Event {
    Event {
        r#type: Some(event::Type::ReconcileOperations as i32),
        reconcile_operations: Some(event::ReconcileOperations {
            operation_uuids: vec![proto(operation)],
        }),
        ..Event::default()
    }
}

fn create_disk(source: Resource) -> offer::Operation {
    offer::Operation {
        r#type: Some(offer::operation::Type::CreateDisk as i32),
        create_disk: Some(offer::operation::CreateDisk {
            source,
            target_type: SourceType::Mount as i32,
            target_profile: None,
        }),
        ..offer::Operation::default()
    }
}

fn destroy_disk(source: Resource) -> offer::Operation {
    offer::Operation {
        r#type: Some(offer::operation::Type::DestroyDisk as i32),
        destroy_disk: Some(offer::operation::DestroyDisk { source }),
        ..offer::Operation::default()
    }
}

/// `resource` with `mb` megabytes.
fn sized(resource: &Resource, mb: f64) -> Resource {
    let mut resource = resource.clone();
    resource.scalar = Some(slrp_proto::mesos::v1::value::Scalar { value: mb });
    resource
}

fn state_of(status: &slrp_proto::mesos::v1::OperationStatus) -> OperationState {
    OperationState::try_from(status.state).unwrap()
}

/// Status retries fast enough for a test (100 ms doubling to 400 ms, no jitter).
fn fast_retry(params: &mut ProviderParams) {
    params.status_retry = StatusRetry {
        min: Duration::from_millis(100),
        max: Duration::from_millis(400),
        jitter: Jitter::None,
    };
}

/// A READY provider with one storage pool ("test") and its id, pool and version.
struct Pool {
    provider: Running,
    id: String,
    pool: Resource,
}

impl Env {
    fn ops_params(&self, interval: Option<f64>) -> ProviderParams {
        let mut params = self.params(interval, AGENT_S0);
        fast_retry(&mut params);
        params.mount_paths = Some(self.harness.paths());
        params
    }

    /// Spawns a provider and waits for READY and the UPDATE_STATE that reports the pool.
    async fn with_pool(&mut self, params: ProviderParams) -> Pool {
        if self.profiles.is_none() {
            self.with_profiles(&profile_doc(&["test"]));
        }
        let provider = self.spawn(params).await;
        let id = loop {
            let (id, resources) = self.next_update().await;
            if let Some(pool) = resources.iter().find(|r| source_of(r).profile.is_some()) {
                ready(&provider.handle).await;
                return Pool {
                    provider,
                    id,
                    pool: pool.clone(),
                };
            }
            if resources.is_empty() {
                continue;
            }
            break id;
        };
        panic!("provider {id} reported resources without the pool");
    }

    fn version(&self) -> Vec<u8> {
        self.versions.last().cloned().expect("no UPDATE_STATE seen")
    }

    /// The next status update of `operation` the manager received.
    async fn next_status(&mut self, operation: uuid::Uuid) -> call::UpdateOperationStatus {
        let messages = &mut self.messages;
        let versions = &mut self.versions;
        tokio::time::timeout(HANG, async {
            loop {
                match messages.recv().await.unwrap() {
                    ManagerMessage::UpdateOperationStatus { update, .. }
                        if update.operation_uuid.value == operation.as_bytes() =>
                    {
                        return update;
                    }
                    ManagerMessage::UpdateState {
                        resource_version_uuid,
                        ..
                    } => versions.push(resource_version_uuid.value),
                    ManagerMessage::ProtocolViolation { reason, .. } => {
                        panic!("protocol violation: {reason}")
                    }
                    _ => {}
                }
            }
        })
        .await
        .expect("no status update")
    }

    /// Sends CREATE_DISK of `mb` from `pool` (past the manager) and returns once the
    /// plugin made the volume and holds the CreateVolume answer.
    async fn held_create_disk(&self, id: &str, pool: &Resource, mb: f64) -> uuid::Uuid {
        let op = uuid::Uuid::new_v4();
        self.fake().hold_create(&op.to_string());
        let calls = self.fake().calls(CsiRpc::CreateVolume);
        self.send(
            id,
            apply_event(create_disk(sized(pool, mb)), op, &self.version()),
        )
        .await;
        until(|| self.fake().calls(CsiRpc::CreateVolume) > calls).await;
        op
    }

    /// CREATE_DISK of `mb` from `pool` through the manager; its first status update.
    async fn create_disk_through_manager(
        &mut self,
        id: &str,
        pool: &Resource,
        mb: f64,
    ) -> (uuid::Uuid, call::UpdateOperationStatus) {
        let op = self
            .manager()
            .apply_operation(id, ApplyRequest::new(create_disk(sized(pool, mb))))
            .await
            .unwrap();
        (op, self.next_status(op).await)
    }

    async fn send(&self, id: &str, event: Event) {
        self.manager().send_event(id, event).await.unwrap();
    }

    /// The agent's view of the total (its own applications of the statuses) equals the
    /// provider's, and no protocol violation was counted.
    async fn assert_agent_agrees(&self, id: &str, total: &[Resource]) {
        let agent = self.manager().agent_total(id).await.unwrap();
        assert_eq!(
            Resources::from_iter(agent),
            Resources::from_iter(total.iter().cloned()),
            "the agent's view equals the provider's total"
        );
        let violations =
            self.manager().metrics().snapshot()[slrp_manager::metrics::PROTOCOL_VIOLATIONS];
        assert_eq!(violations, 0.0);
    }

    async fn stored_operations(&self) -> Vec<slrp_core::provider::operations::TrackedOperation> {
        load_operations(&self.store, AGENT_S0).await.unwrap()
    }
}

/// Mesos CreateDestroyDisk over the worker: CREATE_DISK from the pool FINISHES with a
/// MOUNT disk carrying the plugin's id (the agent's `total − consumed + converted` holds:
/// no protocol violation), the acknowledgement forgets it (record deleted); DESTROY_DISK
/// returns the space to the pool and deletes the volume.
#[tokio::test]
async fn create_disk_then_destroy_disk() {
    let mut env = Env::new(FakeCsi::full()).await;
    let Pool { provider, id, pool } = env.with_pool(env.ops_params(None)).await;

    let source = sized(&pool, 1024.0);
    // As a master and agent would: the agent applies `total − consumed + converted` on
    // FINISHED and flags a consumed resource it does not have.
    let op = env
        .manager()
        .apply_operation(&id, ApplyRequest::new(create_disk(source.clone())))
        .await
        .unwrap();
    let update = env.next_status(op).await;
    assert_eq!(state_of(&update.status), OperationState::OperationFinished);
    let converted = &update.status.converted_resources;
    assert_eq!(converted.len(), 1, "{converted:?}");
    let disk = &converted[0];
    assert_eq!(source_of(disk).r#type, SourceType::Mount as i32);
    let volume = source_of(disk)
        .id
        .clone()
        .expect("the disk has the volume id");
    assert_eq!(env.fake().ids().len(), 1);
    assert_eq!(env.fake().id_of(&op.to_string()).unwrap().as_str(), volume);
    // The total holds the disk and the rest of the pool.
    let status = status_until(&provider.handle, "disk in total", |s| {
        s.total
            .iter()
            .any(|r| source_of(r).id.as_deref() == Some(&volume))
    })
    .await;
    assert_eq!(status.operations, 1);
    assert_eq!(status.unacknowledged, 1);
    assert_eq!(env.stored_operations().await.len(), 1);
    env.assert_agent_agrees(&id, &status.total.to_vec()).await;

    let status_uuid = update.status.uuid.clone().expect("a reliable status");
    env.send(&id, ack_event(op.as_bytes(), &status_uuid)).await;
    status_until(&provider.handle, "forgotten", |s| s.operations == 0).await;
    assert!(env.stored_operations().await.is_empty());

    let destroy = env
        .manager()
        .apply_operation(&id, ApplyRequest::new(destroy_disk(disk.clone())))
        .await
        .unwrap();
    let update = env.next_status(destroy).await;
    assert_eq!(
        state_of(&update.status),
        OperationState::OperationFinished,
        "{:?}",
        update.status.message
    );
    assert!(env.fake().ids().is_empty(), "the volume is deleted");
    let status = status_until(&provider.handle, "space back in the pool", |s| {
        s.total.iter().all(|r| source_of(r).id.is_none())
    })
    .await;
    assert_eq!(status.total.len(), 1, "{:?}", status.total);
    assert_eq!(status.total.to_vec()[0].scalar, pool.scalar);
    env.assert_agent_agrees(&id, &status.total.to_vec()).await;
    provider.stop().await;
}

/// Every formatted log line.
#[derive(Clone, Default)]
struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Every log line about an operation is in its span, which names its uuid and type: the
/// acceptance, the completion after the disk task and the acknowledgement (the logs item
/// of #12: an operator greps one uuid).
// A current-thread runtime: the worker runs on this thread, where the capturing
// subscriber is the default.
#[tokio::test(flavor = "current_thread")]
async fn every_log_line_of_an_operation_is_in_its_span() {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);
    let mut env = Env::new(FakeCsi::full()).await;
    let Pool { provider, id, pool } = env.with_pool(env.ops_params(None)).await;
    let (op, update) = env.create_disk_through_manager(&id, &pool, 64.0).await;
    assert_eq!(state_of(&update.status), OperationState::OperationFinished);
    let status_uuid = update.status.uuid.clone().expect("a reliable status");
    env.send(&id, ack_event(op.as_bytes(), &status_uuid)).await;
    status_until(&provider.handle, "forgotten", |s| s.operations == 0).await;
    provider.stop().await;

    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let span = format!("operation{{operation_uuid={op} operation=CreateDisk}}");
    for message in [
        "accepted operation",
        "operation finished",
        "the operation's terminal status was acknowledged",
    ] {
        let line = text
            .lines()
            .find(|line| line.contains(message))
            .unwrap_or_else(|| panic!("no line {message:?} in:\n{text}"));
        assert!(line.contains(&span), "not in the operation's span: {line}");
    }
}

/// plugin holds the CreateVolume answer; the restarted worker finds the operation PENDING,
/// applies it again (CreateVolume by the same name) and reports exactly one terminal
/// status, with exactly one volume made.
#[tokio::test]
async fn an_accepted_operation_survives_a_crash_and_is_applied_once() {
    let mut env = Env::new(FakeCsi::full()).await;
    let Pool { provider, id, pool } = env.with_pool(env.ops_params(None)).await;

    let op = env.held_create_disk(&id, &pool, 512.0).await;
    let stored = env.stored_operations().await;
    assert_eq!(stored.len(), 1);
    assert!(!stored[0].is_terminal(), "recorded PENDING before applied");
    provider.stop().await;

    env.fake().unhold_create(&op.to_string());
    let again = env.spawn(env.ops_params(None)).await;
    let update = env.next_status(op).await;
    assert_eq!(
        state_of(&update.status),
        OperationState::OperationFinished,
        "{:?}",
        update.status.message
    );
    assert_eq!(env.fake().ids().len(), 1, "exactly one volume");
    assert_eq!(env.fake().st().created, 1);
    let status = status_until(&again.handle, "READY with the disk", |s| {
        s.lifecycle == slrp_core::provider::lifecycle::Lifecycle::Ready
            && s.total.iter().any(|r| source_of(r).id.is_some())
    })
    .await;
    let disks = status
        .total
        .iter()
        .filter(|r| source_of(r).id.is_some())
        .count();
    assert_eq!(disks, 1, "{:?}", status.total);
    let stored = env.stored_operations().await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].statuses.len(), 1, "one terminal status");
    again.stop().await;
}

/// Spec §5.2 item 4 (Mesos aborts on a tracked uuid): a repeated APPLY_OPERATION is
/// answered with the operation's latest status and applied no second time.
#[tokio::test]
async fn a_duplicate_operation_uuid_gets_its_latest_status() {
    let mut env = Env::new(FakeCsi::full()).await;
    // No retry comes within the test: a second status can only be the duplicate's answer.
    let mut params = env.ops_params(None);
    params.status_retry.min = Duration::from_secs(3600);
    params.status_retry.max = Duration::from_secs(3600);
    let Pool { provider, id, pool } = env.with_pool(params).await;
    let op = uuid::Uuid::new_v4();
    let event = apply_event(create_disk(sized(&pool, 256.0)), op, &env.version());
    env.send(&id, event.clone()).await;
    let first = env.next_status(op).await;
    assert_eq!(state_of(&first.status), OperationState::OperationFinished);

    env.send(&id, event).await;
    let second = env.next_status(op).await;
    assert_eq!(
        second.status.uuid, first.status.uuid,
        "the same status again"
    );
    assert_eq!(env.fake().calls(CsiRpc::CreateVolume), 1);
    assert_eq!(env.fake().ids().len(), 1);
    let status = provider.handle.status().borrow().clone();
    assert_eq!(status.operations, 1);
    assert!(status.last_error.is_none(), "{:?}", status.last_error);
    provider.stop().await;
}

/// Spec §12 item 6 (Mesos drops it): a CREATE_DISK arriving while a periodic
/// reconciliation runs (its GetCapacity held) is tracked PENDING at once, is not applied
/// while the reconciliation runs, and FINISHES after it.
#[tokio::test]
async fn a_disk_operation_during_a_reconciliation_is_deferred_not_dropped() {
    let mut env = Env::new(FakeCsi::full()).await;
    let Pool { provider, id, pool } = env.with_pool(env.ops_params(Some(0.05))).await;

    env.fake().set_down(CsiRpc::GetCapacity, true);
    until(|| env.fake().st().waiting_for_endpoint >= 1).await;
    let op = uuid::Uuid::new_v4();
    env.send(
        &id,
        apply_event(create_disk(sized(&pool, 128.0)), op, &env.version()),
    )
    .await;
    status_until(&provider.handle, "tracked", |s| s.operations == 1).await;
    let stored = env.stored_operations().await;
    assert_eq!(stored.len(), 1, "tracked PENDING and durable at once");
    assert!(!stored[0].is_terminal());
    // A round trip through the worker loop: once the answer to this RECONCILE is in, an
    // applied CREATE_DISK would have handed its CreateVolume to the volume manager, whose
    // command queue is FIFO, so `jobs()` would count it.
    let probe = uuid::Uuid::new_v4();
    env.send(&id, reconcile_event(probe)).await;
    env.next_status(probe).await;
    let jobs = env.volumes.jobs().await.unwrap();
    assert_eq!(
        jobs.running + jobs.parked + jobs.queued,
        0,
        "not applied while the reconciliation runs: {jobs:?}"
    );
    assert_eq!(env.fake().calls(CsiRpc::CreateVolume), 0);

    env.fake().set_down(CsiRpc::GetCapacity, false);
    let update = env.next_status(op).await;
    assert_eq!(
        state_of(&update.status),
        OperationState::OperationFinished,
        "{:?}",
        update.status.message
    );
    assert_eq!(env.fake().ids().len(), 1);
    provider.stop().await;
}

/// A deferred disk operation is judged against the reconciled total (issue #21): the
/// reconciliation it waited for removed the pre-existing volume it would import (the
/// plugin no longer lists it), so it ends DROPPED with Mesos's reconciliation text and no
/// CSI call at all. It used to call ValidateVolume first and only then fail with "does
/// not contain".
#[tokio::test]
async fn a_deferred_operation_whose_source_the_reconciliation_took_is_dropped_uncalled() {
    let mut env = Env::new(fake_with_one_volume()).await;
    env.with_profiles(&profile_doc(&["test"]));
    let provider = env.spawn(env.ops_params(Some(0.05))).await;
    // The RAW disk comes first, the pool with the profile job's UPDATE_STATE.
    let (id, resources) = loop {
        let (id, resources) = env.next_update().await;
        if resources.iter().any(|r| source_of(r).profile.is_some()) {
            break (id, resources);
        }
    };
    ready(&provider.handle).await;
    let raw = resources
        .iter()
        .find(|r| source_of(r).id.as_deref() == Some("vol-1"))
        .cloned()
        .expect("the pre-existing volume is a RAW disk");

    // Hold the next periodic reconciliation before it asks anything.
    env.fake().set_down(CsiRpc::GetCapacity, true);
    env.fake().set_down(CsiRpc::ListVolumes, true);
    until(|| env.fake().st().waiting_for_endpoint >= 2).await;
    let mut import = create_disk(raw);
    import.create_disk.as_mut().unwrap().target_profile = Some("test".to_owned());
    let op = uuid::Uuid::new_v4();
    env.send(&id, apply_event(import, op, &env.version())).await;
    status_until(&provider.handle, "tracked", |s| s.operations == 1).await;

    // The volume goes away before the plugin is asked.
    env.fake()
        .st()
        .volumes
        .remove(&slrp_core::volume::VolumeId::new("vol-1"));
    env.fake().set_down(CsiRpc::GetCapacity, false);
    env.fake().set_down(CsiRpc::ListVolumes, false);
    let update = env.next_status(op).await;
    assert_eq!(
        state_of(&update.status),
        OperationState::OperationDropped,
        "{:?}",
        update.status.message
    );
    assert_eq!(
        update.status.message.as_deref(),
        Some("Cannot apply operation when reconciling storage pools")
    );
    assert!(update.status.uuid.is_some(), "dropped reliably");
    assert_eq!(env.fake().calls(CsiRpc::ValidateVolumeCapabilities), 0);
    let status = status_until(&provider.handle, "the volume gone", |s| {
        !s.total.iter().any(|r| source_of(r).id.is_some())
    })
    .await;
    env.assert_agent_agrees(&id, &status.total.to_vec()).await;
    provider.stop().await;
}

/// Spec §8.5: an unacknowledged status is resent (same status uuid) with the retry
/// interval until acknowledged; the acknowledgement stops the retries and forgets it.
#[tokio::test]
async fn an_unacknowledged_status_is_resent_until_acknowledged() {
    let mut env = Env::new(FakeCsi::full()).await;
    let Pool { provider, id, pool } = env.with_pool(env.ops_params(None)).await;
    let op = uuid::Uuid::new_v4();
    env.send(
        &id,
        apply_event(create_disk(sized(&pool, 64.0)), op, &env.version()),
    )
    .await;
    let first = env.next_status(op).await;
    for _ in 0..2 {
        let again = env.next_status(op).await;
        assert_eq!(again.status.uuid, first.status.uuid);
        assert_eq!(
            again.latest_status.as_ref().map(|s| s.state),
            Some(first.status.state)
        );
    }
    env.send(
        &id,
        ack_event(op.as_bytes(), first.status.uuid.as_ref().unwrap()),
    )
    .await;
    status_until(&provider.handle, "forgotten", |s| s.operations == 0).await;
    assert!(env.stored_operations().await.is_empty());
    provider.stop().await;
}

/// Spec §5.8: a resource version mismatch drops the operation with Mesos's message; the
/// DROPPED status is reliable (it has a status uuid) and the operation tracked until
/// acknowledged; nothing is applied.
#[tokio::test]
async fn a_mismatched_resource_version_drops_the_operation() {
    let mut env = Env::new(FakeCsi::full()).await;
    let Pool { provider, id, pool } = env.with_pool(env.ops_params(None)).await;
    let op = uuid::Uuid::new_v4();
    let stale = uuid::Uuid::new_v4();
    env.send(
        &id,
        apply_event(create_disk(sized(&pool, 64.0)), op, stale.as_bytes()),
    )
    .await;
    let update = env.next_status(op).await;
    assert_eq!(state_of(&update.status), OperationState::OperationDropped);
    let message = update.status.message.clone().unwrap_or_default();
    assert!(
        message.starts_with(&format!("Mismatched resource version {stale}")),
        "{message}"
    );
    assert!(update.status.uuid.is_some(), "reliable");
    assert_eq!(env.fake().calls(CsiRpc::CreateVolume), 0);
    assert_eq!(env.stored_operations().await.len(), 1);
    provider.stop().await;
}

/// Spec §5.12 / §5.8(2): RECONCILE_OPERATIONS of an unknown uuid is answered with an
/// unreliable "Unknown operation" DROPPED (no status uuid, no latest status).
#[tokio::test]
async fn reconciling_an_unknown_operation_drops_it_unreliably() {
    let mut env = Env::new(FakeCsi::full()).await;
    let Pool { provider, id, .. } = env.with_pool(env.ops_params(None)).await;
    let unknown = uuid::Uuid::new_v4();
    env.send(&id, reconcile_event(unknown)).await;
    let update = env.next_status(unknown).await;
    assert_eq!(state_of(&update.status), OperationState::OperationDropped);
    assert_eq!(update.status.message.as_deref(), Some("Unknown operation"));
    assert!(update.status.uuid.is_none());
    assert!(update.latest_status.is_none());
    assert_eq!(provider.handle.status().borrow().operations, 0);
    provider.stop().await;
}

/// Spec §5.14: PUBLISH_RESOURCES of a created MOUNT disk publishes its volume and answers
/// OK; a resource the provider does not have is answered FAILED.
#[tokio::test]
async fn publish_resources_publishes_the_volume() {
    let mut env = Env::new(FakeCsi::full()).await;
    let Pool { provider, id, pool } = env.with_pool(env.ops_params(None)).await;
    let op = uuid::Uuid::new_v4();
    env.send(
        &id,
        apply_event(create_disk(sized(&pool, 64.0)), op, &env.version()),
    )
    .await;
    let update = env.next_status(op).await;
    let disk = update.status.converted_resources[0].clone();
    let volume = slrp_core::volume::VolumeId::new(source_of(&disk).id.clone().unwrap());

    tokio::time::timeout(HANG, env.manager().publish(vec![disk.clone()]))
        .await
        .unwrap()
        .expect("published");
    assert!(env.fake().volume(&volume).unwrap().published.is_some());

    let unknown = sized(&disk, 1.0);
    let refused = tokio::time::timeout(HANG, env.manager().publish(vec![unknown]))
        .await
        .unwrap();
    assert!(refused.is_err(), "an unknown resource is not published");
    provider.stop().await;
}

/// Spec §5.8(1) with §3.6: an APPLY_OPERATION before READY is DROPPED ("Cannot apply
/// operation in SUBSCRIBED state"), tracked, and its status delivered once READY (the
/// status update manager is paused before).
#[tokio::test]
async fn an_operation_before_ready_is_dropped_reliably() {
    let mut env = Env::new(FakeCsi::full()).await;
    env.fake().set_down(CsiRpc::ListVolumes, true);
    let provider = env.spawn(env.ops_params(None)).await;
    let status = status_until(&provider.handle, "SUBSCRIBED", |s| {
        s.lifecycle == slrp_core::provider::lifecycle::Lifecycle::Subscribed
    })
    .await;
    let id = status.provider_id.unwrap();
    let op = uuid::Uuid::new_v4();
    env.send(&id, apply_event(offer::Operation::default(), op, &[0; 16]))
        .await;
    status_until(&provider.handle, "tracked", |s| s.operations == 1).await;
    assert_eq!(env.stored_operations().await.len(), 1);

    env.fake().set_down(CsiRpc::ListVolumes, false);
    let update = env.next_status(op).await;
    assert_eq!(state_of(&update.status), OperationState::OperationDropped);
    assert_eq!(
        update.status.message.as_deref(),
        Some("Cannot apply operation in SUBSCRIBED state")
    );
    assert!(update.status.uuid.is_some());
    provider.stop().await;
}

/// Spec §2.8 / §8.6: UPDATE_STATE carries the tracked operations (an unacknowledged
/// terminal one included), so a restarted manager learns them.
#[tokio::test]
async fn update_state_carries_the_tracked_operations() {
    let mut env = Env::new(FakeCsi::full()).await;
    let Pool { provider, id, pool } = env.with_pool(env.ops_params(None)).await;
    let op = uuid::Uuid::new_v4();
    env.send(
        &id,
        apply_event(create_disk(sized(&pool, 64.0)), op, &env.version()),
    )
    .await;
    env.next_status(op).await;

    env.restart_manager(4 * 1024 * 1024).await;
    let operations = tokio::time::timeout(HANG, async {
        loop {
            if let ManagerMessage::UpdateState { operations, .. } =
                env.messages.recv().await.unwrap()
            {
                return operations;
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(operations.len(), 1);
    assert_eq!(operations[0].uuid.value, op.as_bytes());
    assert_eq!(
        state_of(&operations[0].latest_status),
        OperationState::OperationFinished
    );
    provider.stop().await;
}

fn reserve(resource: &Resource, role: &str) -> offer::Operation {
    use slrp_proto::mesos::v1::resource::ReservationInfo;
    use slrp_proto::mesos::v1::resource::reservation_info::Type as ReservationType;
    let mut reserved = resource.clone();
    reserved.reservations.push(ReservationInfo {
        r#type: Some(ReservationType::Dynamic as i32),
        role: Some(role.to_owned()),
        ..ReservationInfo::default()
    });
    offer::Operation {
        r#type: Some(offer::operation::Type::Reserve as i32),
        reserve: Some(offer::operation::Reserve {
            source: vec![resource.clone()],
            resources: vec![reserved],
        }),
        ..offer::Operation::default()
    }
}

/// Spec §5.3: a speculative RESERVE is applied before the next event, its one commit holds
/// the FINISHED operation and the changed resources (a restarted provider recovers the
/// reservation), and the agent's view, which applied it at once, equals the provider's.
#[tokio::test]
async fn a_speculative_reserve_is_applied_and_durable_at_once() {
    let mut env = Env::new(FakeCsi::full()).await;
    let Pool { provider, id, pool } = env.with_pool(env.ops_params(None)).await;
    let part = sized(&pool, 2048.0);
    let op = env
        .manager()
        .apply_operation(&id, ApplyRequest::new(reserve(&part, "storage")))
        .await
        .unwrap();
    let update = env.next_status(op).await;
    assert_eq!(
        state_of(&update.status),
        OperationState::OperationFinished,
        "{:?}",
        update.status.message
    );
    let reserved = |s: &ProviderStatus| {
        s.total
            .iter()
            .filter(|r| !r.reservations.is_empty())
            .count()
    };
    let status = status_until(&provider.handle, "the reservation in the total", |s| {
        reserved(s) > 0
    })
    .await;
    assert_eq!(reserved(&status), 1, "{:?}", status.total);
    env.assert_agent_agrees(&id, &status.total.to_vec()).await;
    let stored = env.stored_operations().await;
    assert_eq!(stored.len(), 1);
    assert!(stored[0].is_terminal(), "committed finished, never PENDING");
    provider.stop().await;

    let again = env.spawn(env.ops_params(None)).await;
    let recovered = again.handle.status().borrow().total.clone();
    assert_eq!(
        Resources::from_iter(recovered.iter()),
        Resources::from_iter(status.total.iter()),
        "the reservation was committed with the operation"
    );
    again.stop().await;
}

/// Spec §9: operation metrics with Mesos's names; recovery feeds them from every tracked
/// operation's latest state (once, not again at a resubscription).
#[tokio::test]
async fn operation_metrics_are_counted_and_recovered() {
    let mut env = Env::new(FakeCsi::full()).await;
    env.with_profiles(&profile_doc(&["test"]));
    let metrics = slrp_provider::metrics::ProviderMetrics::new(RP_TYPE, RP_NAME);
    let deps = slrp_provider::worker::ProviderDeps {
        metrics: metrics.clone(),
        ..env.deps()
    };
    let provider = env.spawn_with(env.ops_params(None), deps).await;
    let (id, pool) = loop {
        let (id, resources) = env.next_update().await;
        if let Some(pool) = resources.iter().find(|r| source_of(r).profile.is_some()) {
            break (id, pool.clone());
        }
    };
    ready(&provider.handle).await;
    let op = env
        .manager()
        .apply_operation(&id, ApplyRequest::new(create_disk(sized(&pool, 32.0))))
        .await
        .unwrap();
    env.next_status(op).await;
    let stale = uuid::Uuid::new_v4();
    let dropped = uuid::Uuid::new_v4();
    env.send(
        &id,
        apply_event(create_disk(sized(&pool, 32.0)), dropped, stale.as_bytes()),
    )
    .await;
    env.next_status(dropped).await;
    let prefix = format!("resource_providers/{RP_TYPE}.{RP_NAME}/operations");
    let read = |metrics: &slrp_provider::metrics::ProviderMetrics, name: &str| {
        metrics.snapshot()[&format!("{prefix}/{name}")]
    };
    assert_eq!(read(&metrics, "create_disk/finished"), 1.0);
    assert_eq!(read(&metrics, "create_disk/dropped"), 1.0);
    assert_eq!(read(&metrics, "create_disk/pending"), 0.0);
    provider.stop().await;

    // Both are unacknowledged: a restarted provider counts them again from the records.
    let fresh = slrp_provider::metrics::ProviderMetrics::new(RP_TYPE, RP_NAME);
    let deps = slrp_provider::worker::ProviderDeps {
        metrics: fresh.clone(),
        ..env.deps()
    };
    let again = env.spawn_with(env.ops_params(None), deps).await;
    // The recovered total already holds the pool: the profile update sends nothing.
    let sent = ready(&again.handle).await.updates_sent;
    env.restart_manager(4 * 1024 * 1024).await;
    status_until(&again.handle, "resubscribed", |s| {
        s.lifecycle == slrp_core::provider::lifecycle::Lifecycle::Ready && s.updates_sent > sent
    })
    .await;
    assert_eq!(read(&fresh, "create_disk/finished"), 1.0, "counted once");
    assert_eq!(read(&fresh, "create_disk/dropped"), 1.0);
    again.stop().await;
}

/// Spec §5.5 step 3: a DESTROY_DISK whose profile has vanished frees its space as nothing
/// (`converted_resources` empty) and asks for a storage pool reconciliation, which runs
/// although the periodic loop is off.
#[tokio::test]
async fn destroying_a_disk_of_a_vanished_profile_reconciles_the_pools() {
    let mut env = Env::new(FakeCsi::full()).await;
    let file = env.with_profiles(&profile_doc(&["test"]));
    let Pool { provider, id, pool } = env.with_pool(env.ops_params(None)).await;
    env.create_disk_through_manager(&id, &pool, 64.0).await;

    std::fs::write(&file, profile_doc(&[]).to_string()).unwrap();
    env.profiles.as_ref().unwrap().poll_now().await.unwrap();
    // The pool goes with its profile; the disk stays (as the manager learns it: the
    // reconciliation takes the plugin's volume context as its metadata).
    let disk = loop {
        let (_, resources) = env.next_update().await;
        if resources.iter().all(|r| source_of(r).id.is_some()) {
            assert_eq!(resources.len(), 1, "{resources:?}");
            break resources[0].clone();
        }
    };
    let before = provider.handle.status().borrow().reconciliations;

    let destroy = env
        .manager()
        .apply_operation(&id, ApplyRequest::new(destroy_disk(disk)))
        .await
        .unwrap();
    let update = env.next_status(destroy).await;
    assert_eq!(
        state_of(&update.status),
        OperationState::OperationFinished,
        "{:?}",
        update.status.message
    );
    assert!(update.status.converted_resources.is_empty());
    // The status shows a total changed by operations within `status_total_delay`.
    let status = status_until(&provider.handle, "pools reconciled, nothing left", |s| {
        s.reconciliations > before && s.total.is_empty()
    })
    .await;
    env.assert_agent_agrees(&id, &status.total.to_vec()).await;
    provider.stop().await;
}

/// The bound on PUBLISH_RESOURCES in progress (`max_publishes`): with one running (the
/// plugin holds its calls), another is answered FAILED at once; the first still succeeds
/// once the plugin answers, and the loop kept serving meanwhile.
#[tokio::test]
async fn publishes_in_progress_are_bounded() {
    let mut env = Env::new(FakeCsi::full()).await;
    let mut params = env.ops_params(None);
    params.max_publishes = 1;
    let Pool { provider, id, pool } = env.with_pool(params).await;
    let op = env
        .manager()
        .apply_operation(&id, ApplyRequest::new(create_disk(sized(&pool, 64.0))))
        .await
        .unwrap();
    let disk = env.next_status(op).await.status.converted_resources[0].clone();
    let volume = slrp_core::volume::VolumeId::new(source_of(&disk).id.clone().unwrap());

    env.fake().hold(&volume);
    let before = env.fake().total_calls();
    let manager = env.manager().clone();
    let held = {
        let disk = disk.clone();
        tokio::spawn(async move { manager.publish(vec![disk]).await })
    };
    until(|| env.fake().total_calls() > before).await;
    let second = tokio::time::timeout(HANG, env.manager().publish(vec![disk.clone()]))
        .await
        .unwrap();
    assert!(second.is_err(), "beyond the bound: FAILED at once");
    // The loop is not blocked by the held publish.
    let probe = uuid::Uuid::new_v4();
    env.send(&id, reconcile_event(probe)).await;
    env.next_status(probe).await;

    env.fake().unhold(&volume);
    let first = tokio::time::timeout(HANG, held).await.unwrap().unwrap();
    assert!(first.is_ok(), "{first:?}");
    provider.stop().await;
}

/// `disk` as a persistent volume with persistence id `pid`.
fn persistent(disk: &Resource, pid: &str) -> Resource {
    use slrp_proto::mesos::v1::resource::disk_info::Persistence;
    let mut volume = disk.clone();
    let info = volume.disk.as_mut().unwrap();
    info.persistence = Some(Persistence {
        id: pid.to_owned(),
        principal: None,
    });
    info.volume = Some(Box::new(slrp_proto::mesos::v1::Volume {
        container_path: "data".to_owned(),
        mode: slrp_proto::mesos::v1::volume::Mode::Rw as i32,
        ..slrp_proto::mesos::v1::Volume::default()
    }));
    volume
}

fn create_persistent(volume: Resource) -> offer::Operation {
    offer::Operation {
        r#type: Some(offer::operation::Type::Create as i32),
        create: Some(offer::operation::Create {
            volumes: vec![volume],
        }),
        ..offer::Operation::default()
    }
}

fn destroy_persistent(volume: Resource) -> offer::Operation {
    offer::Operation {
        r#type: Some(offer::operation::Type::Destroy as i32),
        destroy: Some(offer::operation::Destroy {
            volumes: vec![volume],
        }),
        ..offer::Operation::default()
    }
}

/// A FAILED status whose message says the total does not contain what it consumes.
fn assert_not_contained(update: &call::UpdateOperationStatus) {
    assert_eq!(
        state_of(&update.status),
        OperationState::OperationFailed,
        "{:?}",
        update.status.message
    );
    let message = update.status.message.as_deref().unwrap_or("");
    assert!(message.contains("does not contain"), "{message}");
}

/// Creates a MOUNT disk of `mb` from the pool through the manager; returns it and its
/// volume id.
async fn created_disk(
    env: &mut Env,
    id: &str,
    pool: &Resource,
    mb: f64,
) -> (Resource, slrp_core::volume::VolumeId) {
    let op = env
        .manager()
        .apply_operation(id, ApplyRequest::new(create_disk(sized(pool, mb))))
        .await
        .unwrap();
    let update = env.next_status(op).await;
    assert_eq!(state_of(&update.status), OperationState::OperationFinished);
    let mut disk = update.status.converted_resources[0].clone();
    disk.allocation_info = None;
    let volume = slrp_core::volume::VolumeId::new(source_of(&disk).id.clone().unwrap());
    (disk, volume)
}

/// A PENDING CREATE_DISK's source is not available to another operation: a RESERVE of
/// the whole pool arriving while the CreateVolume runs (sent past the manager, which
/// refuses it itself) FAILS with Mesos's text; the CREATE_DISK then FINISHES, and its
/// volume is in the total. Without the check the RESERVE finished and the created volume
/// was in no resource.
#[tokio::test]
async fn a_pending_disk_operations_resources_are_not_given_to_another() {
    let mut env = Env::new(FakeCsi::full()).await;
    let Pool { provider, id, pool } = env.with_pool(env.ops_params(None)).await;

    let create = env.held_create_disk(&id, &pool, 512.0).await;

    let reserve_op = uuid::Uuid::new_v4();
    env.send(
        &id,
        apply_event(reserve(&pool, "storage"), reserve_op, &env.version()),
    )
    .await;
    assert_not_contained(&env.next_status(reserve_op).await);

    env.fake().unhold_create(&create.to_string());
    let update = env.next_status(create).await;
    assert_eq!(
        state_of(&update.status),
        OperationState::OperationFinished,
        "{:?}",
        update.status.message
    );
    let volume = env.fake().id_of(&create.to_string()).unwrap();
    let status = status_until(&provider.handle, "the disk in the total", |s| {
        s.total
            .iter()
            .any(|r| source_of(r).id.as_deref() == Some(volume.as_str()))
    })
    .await;
    assert!(
        status.total.iter().all(|r| r.reservations.is_empty()),
        "{:?}",
        status.total
    );
    provider.stop().await;
}

/// The mirror: CREATE of a persistent volume on a MOUNT disk while its DESTROY_DISK runs
/// FAILS before anything changes; the DESTROY_DISK then FINISHES.
#[tokio::test]
async fn a_disk_being_destroyed_cannot_get_a_persistent_volume() {
    let mut env = Env::new(FakeCsi::full()).await;
    let Pool { provider, id, pool } = env.with_pool(env.ops_params(None)).await;
    let (disk, volume) = created_disk(&mut env, &id, &pool, 1024.0).await;

    env.fake().hold(&volume);
    let destroy = uuid::Uuid::new_v4();
    env.send(
        &id,
        apply_event(destroy_disk(disk.clone()), destroy, &env.version()),
    )
    .await;
    until(|| env.fake().calls(CsiRpc::DeleteVolume) == 1).await;

    let create = uuid::Uuid::new_v4();
    env.send(
        &id,
        apply_event(
            create_persistent(persistent(&disk, "pv")),
            create,
            &env.version(),
        ),
    )
    .await;
    assert_not_contained(&env.next_status(create).await);

    env.fake().unhold(&volume);
    let update = env.next_status(destroy).await;
    assert_eq!(
        state_of(&update.status),
        OperationState::OperationFinished,
        "{:?}",
        update.status.message
    );
    let status = status_until(&provider.handle, "space back in the pool", |s| {
        s.total.iter().all(|r| source_of(r).id.is_none())
    })
    .await;
    assert!(
        status
            .total
            .iter()
            .all(|r| r.disk.as_ref().unwrap().persistence.is_none()),
        "{:?}",
        status.total
    );
    provider.stop().await;
}

/// A DESTROY of a persistent volume the total does not hold (stale) FAILS without
/// touching the disk's data: the check comes before the removal.
#[tokio::test]
async fn a_stale_destroy_keeps_the_data() {
    let mut env = Env::new(FakeCsi::full()).await;
    let params = env.ops_params(None);
    let paths = params.mount_paths.clone().unwrap();
    let Pool { provider, id, pool } = env.with_pool(params).await;
    let (disk, volume) = created_disk(&mut env, &id, &pool, 1024.0).await;
    let target = paths.target(&volume).unwrap();
    std::fs::create_dir_all(&target).unwrap();
    let file = target.join("precious");
    std::fs::write(&file, b"data").unwrap();

    let destroy = uuid::Uuid::new_v4();
    env.send(
        &id,
        apply_event(
            destroy_persistent(persistent(&disk, "never-created")),
            destroy,
            &env.version(),
        ),
    )
    .await;
    assert_not_contained(&env.next_status(destroy).await);
    assert!(file.exists(), "the data of a volume not destroyed is kept");
    provider.stop().await;
}

/// CREATE_DISK of a pre-existing volume whose profile the plugin does not confirm FAILS
/// with Mesos's "Cannot apply profile '<p>' to resource '<r>': <error>".
#[tokio::test]
async fn a_failed_import_names_the_profile_and_the_resource() {
    let mut env = Env::new(fake_with_one_volume()).await;
    let mut doc = profile_doc(&["test"]);
    doc["profile_matrix"]["test"]["create_parameters"] = serde_json::json!({"unsupported": "1"});
    env.with_profiles(&doc);
    let provider = env.spawn(env.ops_params(None)).await;
    // The RAW disk comes first, the pool with the profile job's UPDATE_STATE.
    let (id, resources) = loop {
        let (id, resources) = env.next_update().await;
        if resources.iter().any(|r| source_of(r).profile.is_some()) {
            break (id, resources);
        }
    };
    ready(&provider.handle).await;
    let raw = resources
        .iter()
        .find(|r| source_of(r).id.as_deref() == Some("vol-1"))
        .cloned()
        .expect("the pre-existing volume is a RAW disk");
    let mut import = create_disk(raw);
    import.create_disk.as_mut().unwrap().target_profile = Some("test".to_owned());
    let op = env
        .manager()
        .apply_operation(&id, ApplyRequest::new(import))
        .await
        .unwrap();
    let update = env.next_status(op).await;
    assert_eq!(state_of(&update.status), OperationState::OperationFailed);
    let message = update.status.message.as_deref().unwrap_or("");
    assert!(
        message.starts_with("Cannot apply profile 'test' to resource '"),
        "{message}"
    );
    provider.stop().await;
}
