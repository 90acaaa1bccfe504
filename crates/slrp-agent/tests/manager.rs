//! The agent client against slrp's embedded manager, which answers as a Mesos agent does.

mod support;

use slrp_agent::{AgentClient, AgentEndpoint, Metrics, SessionEvent};
use slrp_manager::{EmbeddedManager, Endpoint, Listen, ManagerConfig};
use slrp_proto::mesos::v1::resource_provider::{Call, Event, call, event};
use slrp_proto::mesos::v1::{ResourceProviderId, Uuid};
use slrp_wire::ContentType;
use support::{info, next_event, test_config};
use tokio_util::sync::CancellationToken;

fn agent_url(endpoint: &Endpoint) -> String {
    match endpoint {
        Endpoint::Tcp(addr) => format!("http://{addr}"),
        Endpoint::Unix(path) => format!("unix://{}", path.display()),
    }
}

async fn subscribed(events: &mut tokio::sync::mpsc::Receiver<SessionEvent>) -> (String, String) {
    loop {
        match next_event(events).await {
            SessionEvent::Connected => {}
            SessionEvent::Subscribed {
                provider_id,
                stream_id,
            } => return (provider_id.value, stream_id),
            other => panic!("expected SUBSCRIBED, got {other:?}"),
        }
    }
}

async fn session_against_the_manager(listen: Listen, ct: ContentType) {
    let cancel = CancellationToken::new();
    let (manager, _guard) = EmbeddedManager::spawn(ManagerConfig::new(listen), cancel.clone())
        .await
        .expect("manager");
    let endpoint = AgentEndpoint::parse(&agent_url(manager.endpoint())).expect("url");
    let mut config = test_config(endpoint);
    config.content_type = ct;

    let client_cancel = cancel.child_token();
    let (handle, mut events) = AgentClient::spawn(
        config.clone(),
        info(),
        None,
        Metrics::default(),
        client_cancel.clone(),
    )
    .expect("client");
    let (provider_id, stream_id) = subscribed(&mut events).await;

    let version = Uuid { value: vec![3; 16] };
    handle
        .call(Call {
            r#type: Some(call::Type::UpdateState as i32),
            update_state: Some(call::UpdateState {
                resource_version_uuid: version.clone(),
                ..call::UpdateState::default()
            }),
            ..Call::default()
        })
        .await
        .expect("the manager accepts UPDATE_STATE");
    let providers = manager.providers().await.expect("providers");
    assert_eq!(providers.len(), 1);
    let view = &providers[0];
    assert_eq!(view.info.id.as_ref().expect("id").value, provider_id);
    assert_eq!(view.stream_id.to_string(), stream_id);
    assert_eq!(view.resource_version_uuid.as_ref(), Some(&version));

    let reconcile = Event {
        r#type: Some(event::Type::ReconcileOperations as i32),
        reconcile_operations: Some(event::ReconcileOperations {
            operation_uuids: vec![Uuid { value: vec![9; 16] }],
        }),
        ..Event::default()
    };
    manager
        .send_event(&provider_id, reconcile.clone())
        .await
        .expect("sent");
    match next_event(&mut events).await {
        SessionEvent::Event(got) => assert_eq!(*got, reconcile),
        other => panic!("expected the event, got {other:?}"),
    }

    // A restarted provider resubscribes with its durable id and is admitted again.
    client_cancel.cancel();
    drop(events);
    let (_handle, mut events) = AgentClient::spawn(
        config,
        info(),
        Some(ResourceProviderId {
            value: provider_id.clone(),
        }),
        Metrics::default(),
        cancel.child_token(),
    )
    .expect("client");
    let (again, new_stream) = subscribed(&mut events).await;
    assert_eq!(again, provider_id);
    assert_ne!(new_stream, stream_id);
    cancel.cancel();
}

#[tokio::test]
async fn protobuf_over_tcp_against_the_embedded_manager() {
    session_against_the_manager(ManagerConfig::loopback().listen, ContentType::Protobuf).await;
}

#[tokio::test]
async fn json_over_a_unix_socket_against_the_embedded_manager() {
    let dir = tempfile::tempdir().expect("tempdir");
    session_against_the_manager(
        Listen::Unix(dir.path().join("manager.sock")),
        ContentType::Json,
    )
    .await;
}
