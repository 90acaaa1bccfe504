//! The manager as agent and master for operations (spec §2.8–§2.10, §5.3, §6.9): a
//! scripted provider speaks the API over real HTTP and checks what the manager sends and
//! how its view of the provider's total changes.

mod common;

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use common::{Harness, Stream, Transport, WAIT};
use slrp_manager::{AckPolicy, ApplyRequest, ManagerMessage, OperationError, metrics};
use slrp_proto::mesos::v1::resource::{AllocationInfo, DiskInfo, ReservationInfo, disk_info};
use slrp_proto::mesos::v1::resource_provider::{Call, Event, call, event};
use slrp_proto::mesos::v1::{
    FrameworkId, Operation, OperationId, OperationState, OperationStatus, Resource, Uuid, offer,
    resource,
};
use slrp_wire::ContentType;
use tokio::sync::broadcast;

/// A provider driven by the test: one subscription and the calls it makes.
struct Provider {
    harness: Harness,
    stream: Stream,
    id: String,
    ct: ContentType,
}

impl Provider {
    async fn start(transport: Transport, ct: ContentType, policy: AckPolicy) -> Self {
        let harness = common::start_with(transport, |config| config.ack_policy = policy).await;
        let mut stream = harness.client.subscribe(ct, common::info(None)).await;
        let id = stream.subscribed().await;
        Self {
            harness,
            stream,
            id,
            ct,
        }
    }

    async fn call(&self, call: Call) {
        let reply = self
            .harness
            .client
            .call(self.ct, &call, Some(&self.stream.stream_id))
            .await;
        assert_eq!(reply.status, http::StatusCode::ACCEPTED, "{}", reply.body);
    }

    /// UPDATE_STATE with a fresh version; returns the version.
    async fn update_state(&self, resources: Vec<Resource>, operations: Vec<Operation>) -> Uuid {
        let version = common::uuid();
        self.call(Call {
            resource_provider_id: Some(common::provider_id(&self.id)),
            r#type: Some(call::Type::UpdateState as i32),
            update_state: Some(call::UpdateState {
                operations,
                resources,
                resource_version_uuid: version.clone(),
            }),
            ..Call::default()
        })
        .await;
        version
    }

    /// UPDATE_OPERATION_STATUS with `status` as status and latest status.
    async fn status(&self, operation: uuid::Uuid, status: &OperationStatus) {
        self.call(Call {
            resource_provider_id: Some(common::provider_id(&self.id)),
            r#type: Some(call::Type::UpdateOperationStatus as i32),
            update_operation_status: Some(call::UpdateOperationStatus {
                framework_id: None,
                status: status.clone(),
                latest_status: Some(status.clone()),
                operation_uuid: proto(operation),
            }),
            ..Call::default()
        })
        .await;
    }

    fn reliable(&self, state: OperationState, converted: Vec<Resource>) -> OperationStatus {
        OperationStatus {
            state: state as i32,
            converted_resources: converted,
            uuid: Some(common::uuid()),
            resource_provider_id: Some(common::provider_id(&self.id)),
            ..OperationStatus::default()
        }
    }

    async fn next(&mut self) -> Event {
        self.stream.next().await.expect("an event")
    }

    /// The next event, which must be of type `kind`.
    async fn expect(&mut self, kind: event::Type) -> Event {
        let event = self.next().await;
        assert_eq!(
            event.r#type.and_then(|raw| event::Type::try_from(raw).ok()),
            Some(kind),
            "{event:?}"
        );
        event
    }

    /// Proves that nothing else was queued before: a RECONCILE_OPERATIONS sent now is
    /// the next event (the stream is ordered).
    async fn expect_nothing_queued(&mut self) {
        let marker = uuid::Uuid::new_v4();
        self.harness
            .handle
            .reconcile_operations(&self.id, vec![marker])
            .await
            .expect("reconcile");
        let event = self.expect(event::Type::ReconcileOperations).await;
        assert_eq!(
            event.reconcile_operations.expect("payload").operation_uuids,
            vec![proto(marker)]
        );
    }

    async fn total(&self) -> Vec<Resource> {
        self.harness
            .handle
            .agent_total(&self.id)
            .await
            .expect("agent total")
    }

    async fn terminal(&self, uuid: uuid::Uuid) -> slrp_manager::OperationView {
        self.harness
            .handle
            .wait_terminal(uuid, WAIT)
            .await
            .expect("terminal")
    }

    async fn operations(&self) -> Vec<slrp_manager::OperationView> {
        let providers = self.harness.handle.providers().await.expect("providers");
        providers[0].operations.clone()
    }
}

fn proto(uuid: uuid::Uuid) -> Uuid {
    Uuid {
        value: uuid.as_bytes().to_vec(),
    }
}

fn source(kind: disk_info::source::Type, id: Option<&str>) -> DiskInfo {
    DiskInfo {
        source: Some(disk_info::Source {
            r#type: kind as i32,
            id: id.map(str::to_owned),
            profile: Some("fast".to_owned()),
            ..disk_info::Source::default()
        }),
        ..DiskInfo::default()
    }
}

/// A storage pool (RAW, profile, no id) of `mb` megabytes.
fn pool(provider: &str, mb: f64) -> Resource {
    Resource {
        disk: Some(source(disk_info::source::Type::Raw, None)),
        ..common::disk(provider, mb)
    }
}

fn volume(provider: &str, id: &str, mb: f64) -> Resource {
    Resource {
        disk: Some(source(disk_info::source::Type::Mount, Some(id))),
        ..common::disk(provider, mb)
    }
}

fn allocated(mut resource: Resource) -> Resource {
    resource.allocation_info = Some(AllocationInfo {
        role: Some("storage".to_owned()),
    });
    resource
}

fn reserved(mut resource: Resource) -> Resource {
    resource.reservations.push(ReservationInfo {
        r#type: Some(resource::reservation_info::Type::Dynamic as i32),
        role: Some("storage".to_owned()),
        ..ReservationInfo::default()
    });
    resource
}

fn create_disk(source: Resource) -> offer::Operation {
    offer::Operation {
        r#type: Some(offer::operation::Type::CreateDisk as i32),
        id: Some(OperationId {
            value: "create".to_owned(),
        }),
        create_disk: Some(offer::operation::CreateDisk {
            source,
            target_type: disk_info::source::Type::Mount as i32,
            target_profile: None,
        }),
        ..offer::Operation::default()
    }
}

fn destroy_disk(source: Resource) -> offer::Operation {
    offer::Operation {
        r#type: Some(offer::operation::Type::DestroyDisk as i32),
        id: Some(OperationId {
            value: "destroy".to_owned(),
        }),
        destroy_disk: Some(offer::operation::DestroyDisk { source }),
        ..offer::Operation::default()
    }
}

fn reserve(resources: Vec<Resource>) -> offer::Operation {
    offer::Operation {
        r#type: Some(offer::operation::Type::Reserve as i32),
        reserve: Some(offer::operation::Reserve {
            source: Vec::new(),
            resources,
        }),
        ..offer::Operation::default()
    }
}

fn scalar(resource: &Resource) -> f64 {
    resource.scalar.as_ref().map_or(0.0, |s| s.value)
}

async fn next_violation(messages: &mut broadcast::Receiver<ManagerMessage>) -> String {
    loop {
        match tokio::time::timeout(WAIT, messages.recv())
            .await
            .expect("a message in time")
            .expect("message")
        {
            ManagerMessage::ProtocolViolation { reason, .. } => return reason,
            _ => continue,
        }
    }
}

/// Polls `future` once, so that its command is queued before whatever the test does next
/// (the worker handles commands in order).
async fn start_polling<F: Future>(future: &mut Pin<Box<F>>) {
    std::future::poll_fn(|cx| {
        assert!(future.as_mut().poll(cx).is_pending(), "already complete");
        Poll::Ready(())
    })
    .await;
}

#[tokio::test]
async fn speculative_operations_apply_to_the_agent_view_at_once() {
    for (transport, ct) in [
        (Transport::Tcp, ContentType::Protobuf),
        (Transport::Unix, ContentType::Json),
    ] {
        let mut p = Provider::start(transport, ct, AckPolicy::Manual).await;
        let id = p.id.clone();
        let version = p
            .update_state(vec![common::disk(&id, 100.0)], Vec::new())
            .await;

        // RESERVE 60 of 100 (as a framework's offer carries it, allocated).
        let framework = FrameworkId {
            value: "framework".to_owned(),
        };
        let info = reserve(vec![allocated(reserved(common::disk(&id, 60.0)))]);
        let mut request = ApplyRequest::new(info.clone());
        request.framework_id = Some(framework.clone());
        let uuid = p
            .harness
            .handle
            .apply_operation(&id, request)
            .await
            .expect("applied");

        // Before any status: the agent's view already has the reservation.
        let total = p.total().await;
        assert_eq!(total.len(), 2, "{total:?}");
        assert_eq!(scalar(&total[0]), 40.0);
        assert!(total[0].reservations.is_empty());
        assert_eq!(total[1], reserved(common::disk(&id, 60.0)));

        // The event carries what the master sent, with the provider's current version.
        let event = p.expect(event::Type::ApplyOperation).await;
        let apply = event.apply_operation.expect("payload");
        assert_eq!(apply.operation_uuid, proto(uuid));
        assert_eq!(apply.resource_version_uuid, version);
        assert_eq!(apply.framework_id, Some(framework.clone()));
        assert_eq!(apply.info, info);

        // Recorded PENDING, with the agent's and provider's IDs and no status yet.
        let operations = p.operations().await;
        assert_eq!(operations.len(), 1);
        let pending = &operations[0];
        assert_eq!(pending.operation_uuid, proto(uuid));
        assert_eq!(pending.framework_id, Some(framework));
        assert_eq!(
            pending.latest_status.state,
            OperationState::OperationPending as i32
        );
        assert_eq!(
            pending
                .latest_status
                .agent_id
                .as_ref()
                .map(|a| a.value.as_str()),
            Some(p.harness.handle.agent_id())
        );
        assert_eq!(
            pending.latest_status.resource_provider_id,
            Some(common::provider_id(&id))
        );
        assert!(pending.statuses.is_empty());

        // Its FINISHED status changes nothing more: a speculative operation was applied.
        let finished = p.reliable(OperationState::OperationFinished, Vec::new());
        p.status(uuid, &finished).await;
        let view = p.terminal(uuid).await;
        assert_eq!(view.latest_status, finished);
        assert_eq!(p.total().await, total);

        // The master refuses what the agent's view does not contain.
        let error = p
            .harness
            .handle
            .apply_operation(
                &id,
                ApplyRequest::new(reserve(vec![reserved(common::disk(&id, 41.0))])),
            )
            .await
            .expect_err("only 40 unreserved left");
        assert!(matches!(error, OperationError::Invalid { .. }), "{error}");
        assert!(error.to_string().contains("does not contain"), "{error}");
        assert_eq!(p.total().await, total);
        p.expect_nothing_queued().await;
    }
}

#[tokio::test]
async fn finished_create_disk_is_applied_once_even_when_retried() {
    let mut p = Provider::start(Transport::Tcp, ContentType::Protobuf, AckPolicy::Manual).await;
    let id = p.id.clone();
    p.update_state(vec![pool(&id, 100.0)], Vec::new()).await;
    let uuid = p
        .harness
        .handle
        .apply_operation(
            &id,
            ApplyRequest::new(create_disk(allocated(pool(&id, 40.0)))),
        )
        .await
        .expect("applied");
    p.expect(event::Type::ApplyOperation).await;
    // Non-speculative: nothing changes until it finishes.
    assert_eq!(p.total().await, vec![pool(&id, 100.0)]);

    // The provider reports the converted resources as the operation carried them
    // (allocated); the agent strips the allocation. The retry (same status uuid) is
    // harmless.
    let finished = p.reliable(
        OperationState::OperationFinished,
        vec![allocated(volume(&id, "vol-1", 40.0))],
    );
    p.status(uuid, &finished).await;
    p.status(uuid, &finished).await;
    let total = p.total().await;
    assert_eq!(total, vec![pool(&id, 60.0), volume(&id, "vol-1", 40.0)]);

    let operations = p.operations().await;
    assert_eq!(operations.len(), 1);
    assert_eq!(
        operations[0].statuses.len(),
        1,
        "deduplicated by status uuid"
    );
    // The agent fills in the operation ID from its own record.
    assert_eq!(
        operations[0].latest_status.operation_id,
        Some(OperationId {
            value: "create".to_owned()
        })
    );
    let view = p.terminal(uuid).await;
    assert_eq!(
        view.latest_status.state,
        OperationState::OperationFinished as i32
    );

    // The master acknowledges: the provider gets the event, and the terminal
    // operation leaves the agent's table (waiters still get it).
    let status_uuid =
        uuid::Uuid::from_slice(&finished.uuid.clone().expect("uuid").value).expect("uuid");
    p.harness
        .handle
        .acknowledge(&id, uuid, status_uuid)
        .await
        .expect("acknowledged");
    let ack = p.expect(event::Type::AcknowledgeOperationStatus).await;
    let ack = ack.acknowledge_operation_status.expect("payload");
    assert_eq!(ack.operation_uuid, proto(uuid));
    assert_eq!(ack.status_uuid, proto(status_uuid));
    assert!(p.operations().await.is_empty());
    let view = p
        .harness
        .handle
        .wait_terminal(uuid, WAIT)
        .await
        .expect("still answered after removal");
    assert_eq!(
        view.latest_status.state,
        OperationState::OperationFinished as i32
    );

    // A retry after the removal (the provider did not get the ACK) is not applied again.
    p.status(uuid, &finished).await;
    assert_eq!(p.total().await, total);
}

#[tokio::test]
async fn a_finished_conversion_the_total_does_not_contain_is_a_violation() {
    let mut p = Provider::start(Transport::Unix, ContentType::Json, AckPolicy::Auto).await;
    let id = p.id.clone();
    let mut messages = p.harness.handle.messages();
    p.update_state(vec![pool(&id, 10.0)], Vec::new()).await;
    // Two CREATE_DISKs of the whole pool: the master refuses the second while the first
    // is pending, but the provider reports it (an agent adopts operations it learns from
    // UPDATE_STATE); the provider finishing both is what an agent aborts on.
    let info = create_disk(pool(&id, 10.0));
    let mut uuids = vec![
        p.harness
            .handle
            .apply_operation(&id, ApplyRequest::new(info.clone()))
            .await
            .expect("applied"),
    ];
    p.expect(event::Type::ApplyOperation).await;
    uuids.push(uuid::Uuid::new_v4());
    let pending = |uuid: uuid::Uuid| Operation {
        framework_id: None,
        agent_id: None,
        info: info.clone(),
        latest_status: OperationStatus {
            state: OperationState::OperationPending as i32,
            ..OperationStatus::default()
        },
        statuses: Vec::new(),
        uuid: proto(uuid),
    };
    p.update_state(
        vec![pool(&id, 10.0)],
        uuids.iter().copied().map(pending).collect(),
    )
    .await;
    let first = p.reliable(
        OperationState::OperationFinished,
        vec![volume(&id, "a", 10.0)],
    );
    p.status(uuids[0], &first).await;
    p.expect(event::Type::AcknowledgeOperationStatus).await;
    assert_eq!(p.total().await, vec![volume(&id, "a", 10.0)]);
    assert_eq!(
        p.harness.handle.metrics().snapshot()[metrics::PROTOCOL_VIOLATIONS],
        0.0
    );

    let second = p.reliable(
        OperationState::OperationFinished,
        vec![volume(&id, "b", 10.0)],
    );
    p.status(uuids[1], &second).await;
    let reason = next_violation(&mut messages).await;
    assert!(reason.contains("does not contain"), "{reason}");
    assert!(reason.contains(&uuids[1].to_string()), "{reason}");
    assert_eq!(
        p.harness.handle.metrics().snapshot()[metrics::PROTOCOL_VIOLATIONS],
        1.0
    );
    // The view is left as it was and the manager goes on (it still acknowledges).
    assert_eq!(p.total().await, vec![volume(&id, "a", 10.0)]);
    p.expect(event::Type::AcknowledgeOperationStatus).await;
}

#[tokio::test]
async fn ack_policies() {
    let mut p = Provider::start(Transport::Tcp, ContentType::Protobuf, AckPolicy::Auto).await;
    let id = p.id.clone();
    p.update_state(vec![common::disk(&id, 10.0)], Vec::new())
        .await;
    // Operations the agent tracks: it drops acknowledgements of the others.
    let mut ops = Vec::new();
    for _ in 0..4 {
        let info = reserve(vec![reserved(common::disk(&id, 1.0))]);
        ops.push(
            p.harness
                .handle
                .apply_operation(&id, ApplyRequest::new(info))
                .await
                .expect("applied"),
        );
        p.expect(event::Type::ApplyOperation).await;
    }

    // Auto: a status with a uuid is acknowledged at once, one without is not.
    let failed = p.reliable(OperationState::OperationFailed, Vec::new());
    p.status(ops[0], &failed).await;
    let ack = p.expect(event::Type::AcknowledgeOperationStatus).await;
    let ack = ack.acknowledge_operation_status.expect("payload");
    assert_eq!(ack.operation_uuid, proto(ops[0]));
    assert_eq!(ack.status_uuid, failed.uuid.clone().expect("uuid"));
    let unreliable = OperationStatus {
        uuid: None,
        ..failed.clone()
    };
    p.status(ops[1], &unreliable).await;
    p.expect_nothing_queued().await;

    // DropFirst(2): two updates are lost on the way to the master, the third is acked.
    p.harness.handle.set_ack_policy(AckPolicy::DropFirst(2));
    p.status(ops[2], &failed).await;
    p.status(ops[2], &failed).await;
    p.expect_nothing_queued().await;
    p.status(ops[2], &failed).await;
    let ack = p.expect(event::Type::AcknowledgeOperationStatus).await;
    assert_eq!(
        ack.acknowledge_operation_status
            .expect("payload")
            .operation_uuid,
        proto(ops[2])
    );

    // Manual: never by itself.
    p.harness.handle.set_ack_policy(AckPolicy::Manual);
    p.status(ops[3], &failed).await;
    p.expect_nothing_queued().await;
}

/// As `Slave::operationStatusAcknowledgement`: the agent drops an acknowledgement of an
/// operation it does not track (logged), so the provider never hears of it and nothing
/// comes back to life; an operation an `UPDATE_STATE` brought back is tracked again.
#[tokio::test]
async fn acknowledgements_of_operations_the_agent_does_not_track_are_dropped() {
    let mut p = Provider::start(Transport::Unix, ContentType::Protobuf, AckPolicy::Manual).await;
    let id = p.id.clone();
    let handle = p.harness.handle.clone();
    p.update_state(vec![pool(&id, 100.0)], Vec::new()).await;
    let info = create_disk(allocated(pool(&id, 40.0)));
    let uuid = handle
        .apply_operation(&id, ApplyRequest::new(info.clone()))
        .await
        .expect("applied");
    p.expect(event::Type::ApplyOperation).await;
    let finished = p.reliable(
        OperationState::OperationFinished,
        vec![allocated(volume(&id, "vol-1", 40.0))],
    );
    p.status(uuid, &finished).await;
    let total = p.total().await;
    let status_uuid =
        uuid::Uuid::from_slice(&finished.uuid.clone().expect("uuid").value).expect("uuid");
    handle
        .acknowledge(&id, uuid, status_uuid)
        .await
        .expect("acknowledged");
    p.expect(event::Type::AcknowledgeOperationStatus).await;
    assert!(p.operations().await.is_empty());

    // The master acknowledges again: the agent no longer tracks the operation.
    handle
        .acknowledge(&id, uuid, status_uuid)
        .await
        .expect("the master's send succeeds");
    p.expect_nothing_queued().await;
    // The provider resends (as if the first acknowledgement were lost) and the master
    // acknowledges the resend: dropped too, and nothing is converted or recorded again.
    handle.set_ack_policy(AckPolicy::Auto);
    p.status(uuid, &finished).await;
    p.expect_nothing_queued().await;
    assert!(p.operations().await.is_empty());
    assert_eq!(p.total().await, total);
    assert_eq!(p.terminal(uuid).await.latest_status.state, finished.state);
    // An operation the agent never saw.
    handle
        .acknowledge(&id, uuid::Uuid::new_v4(), uuid::Uuid::new_v4())
        .await
        .expect("the master's send succeeds");
    p.expect_nothing_queued().await;

    // The provider lists it in its UPDATE_STATE: the agent adopts it, and the
    // acknowledgement of its next resend reaches the provider and removes it again.
    p.update_state(
        total.clone(),
        vec![Operation {
            framework_id: None,
            agent_id: None,
            info,
            latest_status: finished.clone(),
            statuses: vec![finished.clone()],
            uuid: proto(uuid),
        }],
    )
    .await;
    assert_eq!(p.operations().await.len(), 1);
    p.status(uuid, &finished).await;
    let ack = p.expect(event::Type::AcknowledgeOperationStatus).await;
    assert_eq!(
        ack.acknowledge_operation_status
            .expect("payload")
            .operation_uuid,
        proto(uuid)
    );
    assert!(p.operations().await.is_empty());
    assert_eq!(p.total().await, total);
    p.expect_nothing_queued().await;
}

#[tokio::test]
async fn wait_terminal_reports_unknown_timeout_reconciled_and_gone() {
    let mut p = Provider::start(Transport::Unix, ContentType::Protobuf, AckPolicy::Manual).await;
    let id = p.id.clone();
    let handle = p.harness.handle.clone();
    p.update_state(vec![pool(&id, 100.0)], Vec::new()).await;

    let unknown = uuid::Uuid::new_v4();
    assert_eq!(
        handle.wait_terminal(unknown, WAIT).await,
        Err(OperationError::Unknown { uuid: unknown })
    );

    // Recorded but not delivered (a lost ApplyOperationMessage): pending until the
    // provider's next UPDATE_STATE, which does not list it.
    let mut request = ApplyRequest::new(create_disk(pool(&id, 10.0)));
    request.deliver = false;
    let lost = handle
        .apply_operation(&id, request)
        .await
        .expect("recorded");
    let short = Duration::from_millis(20);
    assert_eq!(
        handle.wait_terminal(lost, short).await,
        Err(OperationError::Timeout {
            uuid: lost,
            timeout: short
        })
    );
    let mut waiting = Box::pin(handle.wait_terminal(lost, WAIT));
    start_polling(&mut waiting).await;
    p.update_state(vec![pool(&id, 100.0)], Vec::new()).await;
    // The agent's table forgets it, as Mesos's does; the master asks the provider
    // instead of leaving it without a terminal status (Mesos's TODO).
    assert!(p.operations().await.is_empty());
    let event = p.expect(event::Type::ReconcileOperations).await;
    assert_eq!(
        event.reconcile_operations.expect("payload").operation_uuids,
        vec![proto(lost)]
    );
    start_polling(&mut waiting).await;
    // The provider does not know it: its unreliable DROPPED ends it.
    let unknown_to_it = OperationStatus {
        state: OperationState::OperationDropped as i32,
        message: Some("Unknown operation".to_owned()),
        resource_provider_id: Some(common::provider_id(&id)),
        ..OperationStatus::default()
    };
    p.status(lost, &unknown_to_it).await;
    let view = waiting.await.expect("terminal");
    // The master fills in the operation ID the provider did not know, as for any update.
    let with_id = OperationStatus {
        operation_id: Some(OperationId {
            value: "create".to_owned(),
        }),
        ..unknown_to_it
    };
    assert_eq!(view.latest_status, with_id);
    assert_eq!(handle.wait_terminal(lost, WAIT).await, Ok(view));
    p.expect_nothing_queued().await;

    // A provider removed by the operator: its pending operations are gone.
    let pending = handle
        .apply_operation(&id, ApplyRequest::new(create_disk(pool(&id, 10.0))))
        .await
        .expect("applied");
    let mut waiting = Box::pin(handle.wait_terminal(pending, WAIT));
    start_polling(&mut waiting).await;
    handle.remove_provider(&id).await.expect("removed");
    let view = waiting.await.expect("terminal");
    assert_eq!(
        view.latest_status.state,
        OperationState::OperationGoneByOperator as i32
    );
    assert_eq!(
        handle
            .apply_operation(&id, ApplyRequest::new(create_disk(pool(&id, 1.0))))
            .await,
        Err(OperationError::NotSubscribed { id: id.clone() })
    );
}

/// An APPLY_OPERATION that crossed an UPDATE_STATE on the wire: the agent's table drops
/// it, the provider then drops it for the resource version that update announced. The
/// master keeps its record: the waiter gets the DROPPED status, and so does whoever asks
/// after the acknowledgement (before, both were told the agent did not know it).
#[tokio::test]
async fn an_operation_crossing_an_update_state_keeps_its_status() {
    let mut p = Provider::start(Transport::Unix, ContentType::Protobuf, AckPolicy::Auto).await;
    let id = p.id.clone();
    let handle = p.harness.handle.clone();
    p.update_state(vec![common::disk(&id, 10.0)], Vec::new())
        .await;
    let info = reserve(vec![reserved(common::disk(&id, 4.0))]);
    let uuid = handle
        .apply_operation(&id, ApplyRequest::new(info))
        .await
        .expect("applied");
    p.expect(event::Type::ApplyOperation).await;
    let mut waiting = Box::pin(handle.wait_terminal(uuid, WAIT));
    start_polling(&mut waiting).await;
    p.update_state(vec![common::disk(&id, 10.0)], Vec::new())
        .await;
    p.expect(event::Type::ReconcileOperations).await;
    let dropped = OperationStatus {
        message: Some("Mismatched resource version".to_owned()),
        ..p.reliable(OperationState::OperationDropped, Vec::new())
    };
    p.status(uuid, &dropped).await;
    let view = waiting.await.expect("terminal");
    assert_eq!(view.latest_status, dropped);
    // The master acknowledges it (its record ends there); the agent, which forgot the
    // operation, drops the acknowledgement, as Mesos's does.
    p.expect_nothing_queued().await;
    assert_eq!(handle.wait_terminal(uuid, WAIT).await, Ok(view));
}

/// The same crossing, with the provider's next UPDATE_STATE (it resynchronizes the agent
/// after dropping a speculative operation) reaching the agent before the DROPPED status:
/// the update adopts the orphaned operation in its terminal state, and whoever waits for
/// it learns so then; the status update that follows finds it terminal. The waiter used
/// to be woken by nothing (the crash storm's "did not become terminal within 60s").
#[tokio::test]
async fn an_orphan_an_update_state_adopts_terminal_wakes_its_waiter() {
    let mut p = Provider::start(Transport::Unix, ContentType::Protobuf, AckPolicy::Auto).await;
    let id = p.id.clone();
    let handle = p.harness.handle.clone();
    p.update_state(vec![common::disk(&id, 10.0)], Vec::new())
        .await;
    let info = reserve(vec![reserved(common::disk(&id, 4.0))]);
    let uuid = handle
        .apply_operation(&id, ApplyRequest::new(info.clone()))
        .await
        .expect("applied");
    p.expect(event::Type::ApplyOperation).await;
    let mut waiting = Box::pin(handle.wait_terminal(uuid, WAIT));
    start_polling(&mut waiting).await;
    p.update_state(vec![common::disk(&id, 10.0)], Vec::new())
        .await;
    p.expect(event::Type::ReconcileOperations).await;
    let dropped = OperationStatus {
        message: Some("Mismatched resource version".to_owned()),
        ..p.reliable(OperationState::OperationDropped, Vec::new())
    };
    let operation = Operation {
        framework_id: None,
        agent_id: None,
        info,
        latest_status: dropped.clone(),
        statuses: vec![dropped.clone()],
        uuid: proto(uuid),
    };
    p.update_state(vec![common::disk(&id, 10.0)], vec![operation])
        .await;
    let view = waiting.await.expect("terminal");
    assert_eq!(view.latest_status, dropped);
    p.status(uuid, &dropped).await;
    assert_eq!(
        handle
            .wait_terminal(uuid, WAIT)
            .await
            .map(|v| v.latest_status),
        Ok(dropped)
    );
}

#[tokio::test]
async fn update_state_reconciles_the_operation_table() {
    let mut p = Provider::start(Transport::Tcp, ContentType::Json, AckPolicy::Manual).await;
    let id = p.id.clone();
    let handle = p.harness.handle.clone();
    // Before any UPDATE_STATE there is no version to send.
    assert_eq!(
        handle
            .apply_operation(&id, ApplyRequest::new(create_disk(pool(&id, 1.0))))
            .await,
        Err(OperationError::NoResourceVersion { id: id.clone() })
    );
    p.update_state(vec![pool(&id, 100.0)], Vec::new()).await;
    let info = create_disk(pool(&id, 40.0));
    let uuid = handle
        .apply_operation(&id, ApplyRequest::new(info.clone()))
        .await
        .expect("applied");
    p.expect(event::Type::ApplyOperation).await;
    let mut waiting = Box::pin(handle.wait_terminal(uuid, WAIT));
    start_polling(&mut waiting).await;

    // The provider finished it and reports its new total and the terminal operation
    // before the status update arrives (e.g. after a restart).
    let finished = p.reliable(
        OperationState::OperationFinished,
        vec![volume(&id, "vol", 40.0)],
    );
    let reported_total = vec![pool(&id, 60.0), volume(&id, "vol", 40.0)];
    let adopted_uuid = uuid::Uuid::new_v4();
    let adopted = Operation {
        framework_id: None,
        agent_id: None,
        info: reserve(vec![reserved(common::disk(&id, 1.0))]),
        latest_status: OperationStatus {
            state: OperationState::OperationPending as i32,
            ..OperationStatus::default()
        },
        statuses: Vec::new(),
        uuid: proto(adopted_uuid),
    };
    p.update_state(
        reported_total.clone(),
        vec![
            Operation {
                framework_id: None,
                agent_id: None,
                info,
                latest_status: finished.clone(),
                statuses: vec![finished.clone()],
                uuid: proto(uuid),
            },
            adopted,
        ],
    )
    .await;
    assert_eq!(waiting.await.expect("terminal").latest_status, finished);
    assert_eq!(p.total().await, reported_total);
    // Its status update now converts nothing: the total already reflects it.
    p.status(uuid, &finished).await;
    assert_eq!(p.total().await, reported_total);
    let operations = p.operations().await;
    let uuids: Vec<_> = operations
        .iter()
        .map(|op| op.operation_uuid.clone())
        .collect();
    assert!(
        uuids.contains(&proto(adopted_uuid)),
        "unknown operations are adopted"
    );
    assert!(uuids.contains(&proto(uuid)));
    p.expect_nothing_queued().await;
}

#[tokio::test]
async fn reconcile_and_a_resent_uuid() {
    let mut p = Provider::start(Transport::Unix, ContentType::Json, AckPolicy::Manual).await;
    let id = p.id.clone();
    let handle = p.harness.handle.clone();
    p.update_state(vec![common::disk(&id, 10.0)], Vec::new())
        .await;
    let known = uuid::Uuid::new_v4();
    let other = uuid::Uuid::new_v4();
    handle
        .reconcile_operations(&id, vec![known, other])
        .await
        .expect("sent");
    let event = p.expect(event::Type::ReconcileOperations).await;
    assert_eq!(
        event.reconcile_operations.expect("payload").operation_uuids,
        vec![proto(known), proto(other)]
    );

    // The same operation uuid twice: sent twice, applied to the agent's view once.
    let info = reserve(vec![reserved(common::disk(&id, 4.0))]);
    let mut request = ApplyRequest::new(info);
    request.operation_uuid = Some(known);
    for _ in 0..2 {
        assert_eq!(
            handle.apply_operation(&id, request.clone()).await,
            Ok(known)
        );
        p.expect(event::Type::ApplyOperation).await;
    }
    let total = p.total().await;
    assert_eq!(total.iter().map(scalar).collect::<Vec<_>>(), vec![6.0, 4.0]);
    // A version given explicitly is sent as is (to test the provider's mismatch drop).
    let stale = common::uuid();
    request.operation_uuid = None;
    request.resource_version = Some(stale.clone());
    request.info = reserve(vec![reserved(common::disk(&id, 1.0))]);
    handle.apply_operation(&id, request).await.expect("applied");
    let event = p.expect(event::Type::ApplyOperation).await;
    assert_eq!(
        event
            .apply_operation
            .expect("payload")
            .resource_version_uuid,
        stale
    );
}

/// A master never offers what a pending disk operation consumes: while CREATE_DISK of 40
/// of a 100 pool is PENDING, a RESERVE of the whole pool and a second CREATE_DISK of 70
/// are refused (the agent's view is unchanged), a CREATE_DISK of the 60 left is accepted;
/// once the first one is terminal its source is no longer held.
#[tokio::test]
async fn resources_of_pending_disk_operations_are_not_offered() {
    let mut p = Provider::start(Transport::Tcp, ContentType::Protobuf, AckPolicy::Manual).await;
    let id = p.id.clone();
    p.update_state(vec![pool(&id, 100.0)], Vec::new()).await;
    let first = p
        .harness
        .handle
        .apply_operation(&id, ApplyRequest::new(create_disk(pool(&id, 40.0))))
        .await
        .expect("applied");
    p.expect(event::Type::ApplyOperation).await;

    for refused in [
        reserve(vec![reserved(pool(&id, 100.0))]),
        create_disk(pool(&id, 70.0)),
    ] {
        let error = p
            .harness
            .handle
            .apply_operation(&id, ApplyRequest::new(refused))
            .await
            .expect_err("the pending operation holds 40");
        assert!(
            matches!(&error, OperationError::Invalid { reason } if reason.contains("does not contain")),
            "{error:?}"
        );
    }
    assert_eq!(p.total().await, vec![pool(&id, 100.0)]);
    p.harness
        .handle
        .apply_operation(&id, ApplyRequest::new(create_disk(pool(&id, 60.0))))
        .await
        .expect("the rest is free");
    p.expect(event::Type::ApplyOperation).await;

    let failed = p.reliable(OperationState::OperationFailed, Vec::new());
    p.status(first, &failed).await;
    p.terminal(first).await;
    p.harness
        .handle
        .apply_operation(&id, ApplyRequest::new(create_disk(pool(&id, 40.0))))
        .await
        .expect("a terminal operation holds nothing");
}

/// Applies `info`, takes its APPLY_OPERATION and reports it FINISHED with `converted`.
async fn finish(p: &mut Provider, info: offer::Operation, converted: Vec<Resource>) -> uuid::Uuid {
    let uuid = p
        .harness
        .handle
        .apply_operation(&p.id, ApplyRequest::new(info))
        .await
        .expect("applied");
    p.expect(event::Type::ApplyOperation).await;
    let finished = p.reliable(OperationState::OperationFinished, converted);
    p.status(uuid, &finished).await;
    uuid
}

/// MESOS-8825: the master's allocator (`updateAllocation`, on the FINISHED status of a
/// CREATE_DISK or DESTROY_DISK) aborts unless the conversion keeps its scalar quantities,
/// in its fixed point, or converts what it consumed into nothing. 1.0015 MB is 1002
/// thousandths; the 1050148 bytes a plugin echoes back for it are 1.0014992 MB, 1001: a
/// shrink. An equal or larger conversion passes, and so does a DESTROY_DISK into a
/// 0-sized resource; a speculative operation's reported conversion is not the master's.
#[tokio::test]
async fn finished_disk_conversions_keep_or_remove_their_quantities() {
    let mut p = Provider::start(Transport::Tcp, ContentType::Protobuf, AckPolicy::Manual).await;
    let id = p.id.clone();
    let mut messages = p.harness.handle.messages();
    let violations =
        |p: &Provider| p.harness.handle.metrics().snapshot()[metrics::PROTOCOL_VIOLATIONS];
    let mb = |bytes: f64| bytes / 1_048_576.0;
    p.update_state(vec![pool(&id, 100.0)], Vec::new()).await;

    let shrunk = volume(&id, "shrunk", mb(1_050_148.0));
    let create = create_disk(allocated(pool(&id, 1.0015)));
    let uuid = finish(&mut p, create.clone(), vec![allocated(shrunk.clone())]).await;
    assert_eq!(violations(&p), 1.0);
    let reason = next_violation(&mut messages).await;
    for part in [
        &format!("FINISHED CREATE_DISK operation {uuid}"),
        "consumed disk:1.002 and converted disk:1.001",
        "MESOS-8825",
    ] {
        assert!(reason.contains(part), "{part:?} in {reason}");
    }
    // The agent's own conversion is fine: it holds what was consumed.
    assert!(p.total().await.contains(&shrunk));

    // Equal in fixed point (1050149 bytes are 1002 thousandths), or larger: no violation.
    let equal = volume(&id, "equal", mb(1_050_149.0));
    let grown = volume(&id, "grown", 2.0);
    for converted in [equal.clone(), grown.clone()] {
        finish(&mut p, create.clone(), vec![allocated(converted)]).await;
        assert_eq!(violations(&p), 1.0, "{reason}");
    }

    // DESTROY_DISK: into a 0-sized pool or nothing is a complete removal; into a pool of
    // the same size is kept; into a smaller pool is a shrink.
    finish(&mut p, destroy_disk(allocated(grown)), vec![pool(&id, 0.0)]).await;
    finish(&mut p, destroy_disk(allocated(equal)), Vec::new()).await;
    assert_eq!(violations(&p), 1.0);
    let kept = volume(&id, "kept", 1.002);
    finish(&mut p, create.clone(), vec![kept.clone()]).await;
    assert_eq!(violations(&p), 1.0);
    let destroy = finish(
        &mut p,
        destroy_disk(allocated(shrunk)),
        vec![pool(&id, 0.5)],
    )
    .await;
    assert_eq!(violations(&p), 2.0);
    let reason = next_violation(&mut messages).await;
    assert!(
        reason.contains(&format!("FINISHED DESTROY_DISK operation {destroy}"))
            && reason.contains("consumed disk:1.001 and converted disk:0.5"),
        "{reason}"
    );
    finish(&mut p, destroy_disk(kept), vec![pool(&id, 1.002)]).await;
    assert_eq!(violations(&p), 2.0);

    // A speculative operation's converted resources are not checked (the master applied
    // its own conversion when it accepted it).
    finish(
        &mut p,
        reserve(vec![reserved(pool(&id, 1.0))]),
        vec![reserved(pool(&id, 0.5))],
    )
    .await;
    assert_eq!(violations(&p), 2.0);

    // The master checks an operation the agent forgot (absent from an UPDATE_STATE) too:
    // it still tracks it.
    let mut request = ApplyRequest::new(create);
    request.deliver = false;
    let lost = p
        .harness
        .handle
        .apply_operation(&id, request)
        .await
        .expect("recorded");
    p.update_state(p.total().await, Vec::new()).await;
    p.expect(event::Type::ReconcileOperations).await;
    let finished = p.reliable(
        OperationState::OperationFinished,
        vec![volume(&id, "lost", 1.0)],
    );
    p.status(lost, &finished).await;
    assert_eq!(violations(&p), 3.0);
    let reason = next_violation(&mut messages).await;
    assert!(
        reason.contains(&format!("FINISHED CREATE_DISK operation {lost}")),
        "{reason}"
    );
    p.expect_nothing_queued().await;
}

/// Mesos's agent takes only `latest_status` from the operations of an `UPDATE_STATE` it
/// already tracks (and only a terminal one); their statuses are those of the status
/// updates it received.
#[tokio::test]
async fn update_state_takes_only_the_latest_status_of_a_known_operation() {
    let mut p = Provider::start(Transport::Tcp, ContentType::Json, AckPolicy::Manual).await;
    let id = p.id.clone();
    p.update_state(vec![pool(&id, 100.0)], Vec::new()).await;
    let info = create_disk(pool(&id, 40.0));
    let uuid = p
        .harness
        .handle
        .apply_operation(&id, ApplyRequest::new(info.clone()))
        .await
        .expect("applied");
    p.expect(event::Type::ApplyOperation).await;
    let finished = p.reliable(
        OperationState::OperationFinished,
        vec![volume(&id, "vol", 40.0)],
    );
    let listed = |latest_status: &OperationStatus, statuses: Vec<OperationStatus>| Operation {
        framework_id: None,
        agent_id: None,
        info: info.clone(),
        latest_status: latest_status.clone(),
        statuses,
        uuid: proto(uuid),
    };
    let total = vec![pool(&id, 60.0), volume(&id, "vol", 40.0)];

    // Non-terminal in the update: nothing changes.
    let pending = OperationStatus {
        state: OperationState::OperationPending as i32,
        ..OperationStatus::default()
    };
    p.update_state(
        vec![pool(&id, 100.0)],
        vec![listed(&pending, vec![finished.clone()])],
    )
    .await;
    let operations = p.operations().await;
    assert_eq!(
        operations[0].latest_status.state,
        OperationState::OperationPending as i32
    );
    assert!(operations[0].statuses.is_empty(), "{operations:?}");

    // Terminal: its latest status is taken, its statuses are not.
    p.update_state(
        total.clone(),
        vec![listed(&finished, vec![finished.clone()])],
    )
    .await;
    let operations = p.operations().await;
    assert_eq!(operations[0].latest_status, finished);
    assert!(operations[0].statuses.is_empty(), "{operations:?}");

    // The status update brings the status (once), and converts nothing.
    p.status(uuid, &finished).await;
    let with_id = OperationStatus {
        operation_id: info.id.clone(),
        ..finished.clone()
    };
    assert_eq!(p.operations().await[0].statuses, vec![with_id.clone()]);
    let other = p.reliable(OperationState::OperationFailed, Vec::new());
    p.update_state(
        total.clone(),
        vec![listed(&finished, vec![finished.clone(), other])],
    )
    .await;
    assert_eq!(p.operations().await[0].statuses, vec![with_id]);
    assert_eq!(p.total().await, total);
    p.expect_nothing_queued().await;
}
