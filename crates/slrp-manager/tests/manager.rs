//! Mesos's `ResourceProviderManagerHttpApiTest` cases (spec §11.2) against the embedded
//! manager, over real HTTP, protobuf and JSON.

mod common;

use common::{Transport, WAIT};
use slrp_manager::{ManagerMessage, PublishError, SendEventError, metrics};
use slrp_proto::mesos::v1::resource_provider::{Call, Event, call, event};
use slrp_proto::mesos::v1::{FrameworkId, OperationState, OperationStatus};
use slrp_wire::ContentType;
use tokio::sync::broadcast;

const BOTH: [ContentType; 2] = [ContentType::Protobuf, ContentType::Json];

async fn next_message(messages: &mut broadcast::Receiver<ManagerMessage>) -> ManagerMessage {
    tokio::time::timeout(WAIT, messages.recv())
        .await
        .expect("a manager message in time")
        .expect("message")
}

fn event_type(event: &Event) -> Option<event::Type> {
    event.r#type.and_then(|raw| event::Type::try_from(raw).ok())
}

fn publish_reply(
    id: &str,
    uuid: slrp_proto::mesos::v1::Uuid,
    status: call::update_publish_resources_status::Status,
) -> Call {
    Call {
        resource_provider_id: Some(common::provider_id(id)),
        r#type: Some(call::Type::UpdatePublishResourcesStatus as i32),
        update_publish_resources_status: Some(call::UpdatePublishResourcesStatus {
            uuid,
            status: status as i32,
        }),
        ..Call::default()
    }
}

#[tokio::test]
async fn update_state() {
    for ct in BOTH {
        let harness = common::start(Transport::Tcp).await;
        let mut messages = harness.handle.messages();
        let mut stream = harness.client.subscribe(ct, common::info(None)).await;
        assert_eq!(
            stream.headers.get("Content-Type").expect("content type"),
            ct.as_str()
        );
        let id = stream.subscribed().await;
        assert!(!id.is_empty());
        match next_message(&mut messages).await {
            ManagerMessage::Subscribed { info } => {
                assert_eq!(info.id, Some(common::provider_id(&id)))
            }
            other => panic!("expected Subscribed, got {other:?}"),
        }
        let update = common::update_state(&id, vec![common::disk(&id, 1024.0)]);
        let reply = harness
            .client
            .call(ct, &update, Some(&stream.stream_id))
            .await;
        assert_eq!(reply.status, http::StatusCode::ACCEPTED);
        assert_eq!(reply.body, "");
        let sent = update.update_state.expect("payload");
        match next_message(&mut messages).await {
            ManagerMessage::UpdateState {
                provider_id,
                resources,
                resource_version_uuid,
                ..
            } => {
                assert_eq!(provider_id, id);
                assert_eq!(resources, sent.resources);
                assert_eq!(resource_version_uuid, sent.resource_version_uuid);
            }
            other => panic!("expected UpdateState, got {other:?}"),
        }
        let providers = harness.handle.providers().await.expect("providers");
        assert_eq!(providers[0].resources, sent.resources);
        assert_eq!(
            providers[0].resource_version_uuid,
            Some(sent.resource_version_uuid)
        );
    }
}

#[tokio::test]
async fn update_operation_status() {
    for ct in BOTH {
        let (harness, stream, id) = common::start_subscribed(Transport::Unix, ct).await;
        let mut messages = harness.handle.messages();
        let status = OperationStatus {
            state: OperationState::OperationFinished as i32,
            uuid: Some(common::uuid()),
            resource_provider_id: Some(common::provider_id(&id)),
            ..OperationStatus::default()
        };
        let operation_uuid = common::uuid();
        let framework_id = FrameworkId {
            value: "framework".to_owned(),
        };
        let update = Call {
            resource_provider_id: Some(common::provider_id(&id)),
            r#type: Some(call::Type::UpdateOperationStatus as i32),
            update_operation_status: Some(call::UpdateOperationStatus {
                framework_id: Some(framework_id.clone()),
                status: status.clone(),
                latest_status: Some(status.clone()),
                operation_uuid: operation_uuid.clone(),
            }),
            ..Call::default()
        };
        // A retry of the same status must not be recorded twice.
        for _ in 0..2 {
            let reply = harness
                .client
                .call(ct, &update, Some(&stream.stream_id))
                .await;
            assert_eq!(reply.status, http::StatusCode::ACCEPTED);
            match next_message(&mut messages).await {
                ManagerMessage::UpdateOperationStatus {
                    provider_id,
                    update,
                } => {
                    assert_eq!(provider_id, id);
                    assert_eq!(update.framework_id.as_ref(), Some(&framework_id));
                    assert_eq!(update.status, status);
                    assert_eq!(update.operation_uuid, operation_uuid);
                }
                other => panic!("expected UpdateOperationStatus, got {other:?}"),
            }
        }
        // The agent did not apply this operation, so it forwards the update without
        // recording it (Mesos `updateOperation` runs only for known operations);
        // tests/operations.rs covers the bookkeeping of known ones.
        let providers = harness.handle.providers().await.expect("providers");
        assert!(providers[0].operations.is_empty());
    }
}

#[tokio::test]
async fn latest_status_of_another_provider_is_a_protocol_violation() {
    let (harness, stream, id) =
        common::start_subscribed(Transport::Tcp, ContentType::Protobuf).await;
    let mut messages = harness.handle.messages();
    let status = OperationStatus {
        state: OperationState::OperationFinished as i32,
        resource_provider_id: Some(common::provider_id(&id)),
        ..OperationStatus::default()
    };
    let update = Call {
        resource_provider_id: Some(common::provider_id(&id)),
        r#type: Some(call::Type::UpdateOperationStatus as i32),
        update_operation_status: Some(call::UpdateOperationStatus {
            framework_id: None,
            status: status.clone(),
            latest_status: Some(OperationStatus {
                resource_provider_id: None,
                ..status
            }),
            operation_uuid: common::uuid(),
        }),
        ..Call::default()
    };
    let reply = harness
        .client
        .call(ContentType::Protobuf, &update, Some(&stream.stream_id))
        .await;
    assert_eq!(reply.status, http::StatusCode::ACCEPTED);
    assert!(matches!(
        next_message(&mut messages).await,
        ManagerMessage::ProtocolViolation { .. }
    ));
}

async fn publish_answered(
    ct: ContentType,
    answer: call::update_publish_resources_status::Status,
) -> Result<(), PublishError> {
    let (harness, mut stream, id) = common::start_subscribed(Transport::Tcp, ct).await;
    let handle = harness.handle.clone();
    let resources = vec![common::disk(&id, 1.0)];
    let publish = tokio::spawn({
        let resources = resources.clone();
        async move { handle.publish(resources).await }
    });
    let event = stream.next().await.expect("PUBLISH_RESOURCES");
    assert_eq!(event_type(&event), Some(event::Type::PublishResources));
    let payload = event.publish_resources.expect("payload");
    assert_eq!(payload.resources, resources);
    // An unknown UUID is logged and ignored.
    let stray = publish_reply(
        &id,
        common::uuid(),
        call::update_publish_resources_status::Status::Failed,
    );
    assert_eq!(
        harness
            .client
            .call(ct, &stray, Some(&stream.stream_id))
            .await
            .status,
        http::StatusCode::ACCEPTED
    );
    let reply = publish_reply(&id, payload.uuid, answer);
    assert_eq!(
        harness
            .client
            .call(ct, &reply, Some(&stream.stream_id))
            .await
            .status,
        http::StatusCode::ACCEPTED
    );
    tokio::time::timeout(WAIT, publish)
        .await
        .expect("publish completes")
        .expect("join")
}

#[tokio::test]
async fn publish_resources_success() {
    for ct in BOTH {
        publish_answered(ct, call::update_publish_resources_status::Status::Ok)
            .await
            .expect("published");
    }
}

#[tokio::test]
async fn publish_resources_failure() {
    for ct in BOTH {
        let result =
            publish_answered(ct, call::update_publish_resources_status::Status::Failed).await;
        assert!(
            matches!(
                result,
                Err(PublishError::Failed {
                    status: "FAILED",
                    ..
                })
            ),
            "{result:?}"
        );
    }
}

#[tokio::test]
async fn publish_resources_disconnected() {
    for ct in BOTH {
        let (harness, mut stream, id) = common::start_subscribed(Transport::Unix, ct).await;
        let handle = harness.handle.clone();
        let resources = vec![common::disk(&id, 1.0)];
        let publish = tokio::spawn(async move { handle.publish(resources).await });
        let event = stream.next().await.expect("PUBLISH_RESOURCES");
        assert_eq!(event_type(&event), Some(event::Type::PublishResources));
        drop(stream);
        let result = tokio::time::timeout(WAIT, publish)
            .await
            .expect("publish completes")
            .expect("join");
        assert_eq!(
            result,
            Err(PublishError::ConnectionClosed { id: id.clone() })
        );
        assert_eq!(
            result.expect_err("failed").to_string(),
            format!("failed to publish resources from resource provider {id}: Connection closed")
        );
    }
}

#[tokio::test]
async fn publish_to_unsubscribed_provider_fails_immediately() {
    let harness = common::start(Transport::Tcp).await;
    let result = harness
        .handle
        .publish(vec![common::disk("nobody", 1.0)])
        .await;
    assert_eq!(
        result,
        Err(PublishError::NotSubscribed {
            id: "nobody".to_owned()
        })
    );
}

#[tokio::test]
async fn resubscribe_resource_provider() {
    for ct in BOTH {
        let harness = common::start(Transport::Tcp).await;
        let mut first = harness.client.subscribe(ct, common::info(None)).await;
        let id = first.subscribed().await;
        // Provider failover: the same ID again, on a new stream.
        let mut second = harness.client.subscribe(ct, common::info(Some(&id))).await;
        assert_eq!(second.subscribed().await, id);
        drop(second);

        // Manager (agent) failover with the same state dir.
        let state_dir = harness.dir.path().join("state");
        harness.guard.shutdown().await;
        let mut config = slrp_manager::ManagerConfig::loopback();
        config.state_dir = Some(state_dir);
        let (handle, guard) = slrp_manager::EmbeddedManager::spawn(
            config,
            tokio_util::sync::CancellationToken::new(),
        )
        .await
        .expect("restart");
        let client = common::Client {
            endpoint: handle.endpoint().clone(),
        };
        let mut third = client.subscribe(ct, common::info(Some(&id))).await;
        assert_eq!(third.subscribed().await, id);
        guard.shutdown().await;
    }
}

#[tokio::test]
async fn resubscribe_unknown_id_or_changed_identity_is_dropped() {
    for ct in BOTH {
        let harness = common::start(Transport::Unix).await;
        let mut unknown = harness
            .client
            .subscribe(ct, common::info(Some("unknown")))
            .await;
        assert!(
            unknown.next().await.is_none(),
            "stream must close without any event"
        );

        let mut first = harness.client.subscribe(ct, common::info(None)).await;
        let id = first.subscribed().await;
        let mut renamed = common::info(Some(&id));
        renamed.name = "renamed".to_owned();
        let mut second = harness.client.subscribe(ct, renamed).await;
        assert!(
            second.next().await.is_none(),
            "stream must close without any event"
        );
        // The original subscription is untouched.
        let providers = harness.handle.providers().await.expect("providers");
        assert_eq!(providers.len(), 1);
        assert_eq!(providers[0].stream_id.to_string(), first.stream_id);
    }
}

#[tokio::test]
async fn resource_provider_subscribe_disconnect() {
    let harness = common::start(Transport::Tcp).await;
    let ct = ContentType::Protobuf;
    let mut first = harness.client.subscribe(ct, common::info(None)).await;
    let id = first.subscribed().await;
    let mut second = harness.client.subscribe(ct, common::info(Some(&id))).await;
    assert_eq!(second.subscribed().await, id);
    assert!(first.next().await.is_none(), "the first stream is closed");
    // Calls on the old stream id are refused, the new one works.
    let update = common::update_state(&id, vec![]);
    for (stream_id, expected) in [
        (&first.stream_id, http::StatusCode::BAD_REQUEST),
        (&second.stream_id, http::StatusCode::ACCEPTED),
    ] {
        let reply = harness.client.call(ct, &update, Some(stream_id)).await;
        assert_eq!(reply.status, expected);
    }
    assert_eq!(
        harness.handle.metrics().snapshot()[metrics::SUBSCRIBED],
        1.0
    );
}

#[tokio::test]
async fn metrics() {
    let harness = common::start(Transport::Tcp).await;
    let values = |h: &slrp_manager::ManagerHandle| {
        let snapshot = h.metrics().snapshot();
        (
            snapshot[metrics::SUBSCRIBED],
            snapshot[metrics::EVENTS_SUBSCRIBE],
            snapshot[metrics::EVENTS_DISCONNECT],
        )
    };
    assert_eq!(values(&harness.handle), (0.0, 0.0, 0.0));
    let mut messages = harness.handle.messages();
    let mut stream = harness
        .client
        .subscribe(ContentType::Protobuf, common::info(None))
        .await;
    stream.subscribed().await;
    assert_eq!(values(&harness.handle), (1.0, 1.0, 0.0));
    assert!(matches!(
        next_message(&mut messages).await,
        ManagerMessage::Subscribed { .. }
    ));
    drop(stream);
    assert!(matches!(
        next_message(&mut messages).await,
        ManagerMessage::Disconnected { .. }
    ));
    assert_eq!(values(&harness.handle), (0.0, 1.0, 1.0));

    let mut registry = prometheus_client::registry::Registry::default();
    harness.handle.metrics().register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    assert!(
        text.contains("resource_provider_manager_events_disconnect_total 1"),
        "{text}"
    );
}

#[tokio::test]
async fn remove_resource_provider() {
    let harness = common::start(Transport::Unix).await;
    let ct = ContentType::Json;
    let mut stream = harness.client.subscribe(ct, common::info(None)).await;
    let id = stream.subscribed().await;
    let mut messages = harness.handle.messages();
    harness.handle.remove_provider(&id).await.expect("removed");
    let teardown = stream.next().await.expect("TEARDOWN");
    assert_eq!(event_type(&teardown), Some(event::Type::Teardown));
    assert!(stream.next().await.is_none());
    assert!(
        matches!(next_message(&mut messages).await, ManagerMessage::Removed { provider_id } if provider_id == id)
    );
    let mut again = harness.client.subscribe(ct, common::info(Some(&id))).await;
    assert!(
        again.next().await.is_none(),
        "a removed provider is not admitted"
    );
    assert!(harness.handle.remove_provider("unknown").await.is_err());
}

#[tokio::test]
async fn send_event_delivers_operation_events_only() {
    let (harness, mut stream, id) =
        common::start_subscribed(Transport::Tcp, ContentType::Protobuf).await;
    let reconcile = Event {
        r#type: Some(event::Type::ReconcileOperations as i32),
        reconcile_operations: Some(event::ReconcileOperations {
            operation_uuids: vec![common::uuid()],
        }),
        ..Event::default()
    };
    harness
        .handle
        .send_event(&id, reconcile.clone())
        .await
        .expect("sent");
    assert_eq!(stream.next().await, Some(reconcile));
    let teardown = Event {
        r#type: Some(event::Type::Teardown as i32),
        ..Event::default()
    };
    assert!(matches!(
        harness.handle.send_event(&id, teardown).await,
        Err(SendEventError::NotAllowed { .. })
    ));
    let empty = Event {
        r#type: Some(event::Type::ApplyOperation as i32),
        ..Event::default()
    };
    assert!(matches!(
        harness.handle.send_event(&id, empty).await,
        Err(SendEventError::MissingPayload { .. })
    ));
}

#[tokio::test]
async fn provider_that_does_not_read_is_disconnected() {
    let harness = common::start_with(Transport::Tcp, |config| config.event_queue = 2).await;
    let mut stream = harness
        .client
        .subscribe(ContentType::Protobuf, common::info(None))
        .await;
    let id = stream.subscribed().await;
    // ~160 KiB per event: socket buffers fill after a few MiB, then the queue of 2.
    let big = Event {
        r#type: Some(event::Type::ReconcileOperations as i32),
        reconcile_operations: Some(event::ReconcileOperations {
            operation_uuids: (0..8192).map(|_| common::uuid()).collect(),
        }),
        ..Event::default()
    };
    let mut outcome = None;
    for _ in 0..2000 {
        if let Err(error) = harness.handle.send_event(&id, big.clone()).await {
            outcome = Some(error);
            break;
        }
    }
    assert!(
        matches!(outcome, Some(SendEventError::Disconnected { .. })),
        "{outcome:?}"
    );
    assert!(
        harness
            .handle
            .providers()
            .await
            .expect("providers")
            .is_empty()
    );
    assert_eq!(
        harness.handle.metrics().snapshot()[metrics::EVENTS_DISCONNECT],
        1.0
    );
    drop(stream);
}
