//! Interoperability: slrp's provider-side client (`slrp-agent`) against the embedded
//! manager, over TCP and a unix socket, protobuf and JSON — the same code path a provider
//! uses against a Mesos agent.

mod common;

use common::{Transport, WAIT};
use slrp_agent::{AgentClient, AgentConfig, AgentEndpoint, Metrics, SessionEvent};
use slrp_manager::{Endpoint, ManagerMessage};
use slrp_proto::mesos::v1::resource_provider::{Call, call, event};
use slrp_wire::ContentType;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

async fn next_session_event(events: &mut mpsc::Receiver<SessionEvent>) -> SessionEvent {
    tokio::time::timeout(WAIT, events.recv())
        .await
        .expect("a session event in time")
        .expect("client running")
}

async fn session(transport: Transport, content_type: ContentType) {
    let harness = common::start(transport).await;
    let url = match harness.handle.endpoint() {
        Endpoint::Tcp(addr) => format!("http://{addr}"),
        Endpoint::Unix(path) => format!("unix://{}", path.display()),
    };
    let mut config = AgentConfig::new(AgentEndpoint::parse(&url).expect("url"));
    config.content_type = content_type;
    let cancel = CancellationToken::new();
    let (client, mut events) = AgentClient::spawn(
        config,
        common::info(None),
        None,
        Metrics::default(),
        cancel.clone(),
    )
    .expect("client");
    let mut messages = harness.handle.messages();

    let (provider_id, stream_id) = loop {
        match next_session_event(&mut events).await {
            SessionEvent::Connected => {}
            SessionEvent::Subscribed {
                provider_id,
                stream_id,
            } => break (provider_id.value, stream_id),
            other => panic!("expected SUBSCRIBED, got {other:?}"),
        }
    };
    let providers = harness.handle.providers().await.expect("providers");
    assert_eq!(providers[0].stream_id.to_string(), stream_id);

    client
        .call(common::update_state(
            &provider_id,
            vec![common::disk(&provider_id, 10.0)],
        ))
        .await
        .expect("UPDATE_STATE accepted");
    assert!(matches!(
        tokio::time::timeout(WAIT, messages.recv()).await,
        Ok(Ok(ManagerMessage::Subscribed { .. }))
    ));
    assert!(matches!(
        tokio::time::timeout(WAIT, messages.recv()).await,
        Ok(Ok(ManagerMessage::UpdateState { .. }))
    ));

    let manager = harness.handle.clone();
    let resources = vec![common::disk(&provider_id, 10.0)];
    let publish = tokio::spawn(async move { manager.publish(resources).await });
    let SessionEvent::Event(event) = next_session_event(&mut events).await else {
        panic!("expected PUBLISH_RESOURCES");
    };
    assert_eq!(event.r#type, Some(event::Type::PublishResources as i32));
    let uuid = event.publish_resources.expect("payload").uuid;
    client
        .call(Call {
            resource_provider_id: Some(common::provider_id(&provider_id)),
            r#type: Some(call::Type::UpdatePublishResourcesStatus as i32),
            update_publish_resources_status: Some(call::UpdatePublishResourcesStatus {
                uuid,
                status: call::update_publish_resources_status::Status::Ok as i32,
            }),
            ..Call::default()
        })
        .await
        .expect("reply accepted");
    tokio::time::timeout(WAIT, publish)
        .await
        .expect("publish completes")
        .expect("join")
        .expect("published");
    cancel.cancel();
}

#[tokio::test]
async fn agent_client_over_tcp_protobuf() {
    session(Transport::Tcp, ContentType::Protobuf).await;
}

#[tokio::test]
async fn agent_client_over_unix_json() {
    session(Transport::Unix, ContentType::Json).await;
}
