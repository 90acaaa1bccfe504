//! A minimal resource provider API client over hyper, speaking to the manager exactly as a
//! provider speaks to an agent: one connection for the SUBSCRIBE stream, one per call.

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use slrp_manager::{EmbeddedManager, Endpoint, Listen, ManagerConfig, ManagerGuard, ManagerHandle};
use slrp_proto::mesos::v1::resource_provider::{Call, Event, call};
use slrp_proto::mesos::v1::{Resource, ResourceProviderId, ResourceProviderInfo, Uuid, value};
use slrp_wire::{ContentType, RecordIoDecoder};
use tokio::task::JoinHandle;
use tokio_util::codec::Decoder as _;
use tokio_util::sync::CancellationToken;

/// Upper bound for anything a test waits for.
pub const WAIT: Duration = Duration::from_secs(10);

pub const PATH: &str = "/slave(1)/api/v1/resource_provider";
pub const RP_TYPE: &str = "org.apache.mesos.rp.test";
pub const RP_NAME: &str = "test";

#[derive(Debug, Clone, Copy)]
pub enum Transport {
    Tcp,
    Unix,
}

pub struct Harness {
    pub handle: ManagerHandle,
    pub guard: ManagerGuard,
    pub client: Client,
    /// Before `dir`: the records it reads live there.
    pub containers: ContainersGuard,
    pub dir: tempfile::TempDir,
}

/// Kills what is left of the containers recorded under its directory when dropped (a
/// panicking test included): they survive their manager on purpose.
pub struct ContainersGuard(pub Option<std::path::PathBuf>);

impl Drop for ContainersGuard {
    fn drop(&mut self) {
        if let Some(dir) = &self.0 {
            slrp_manager::kill_recorded_containers(dir);
        }
    }
}

pub async fn start(transport: Transport) -> Harness {
    start_with(transport, |_| {}).await
}

pub async fn start_with(transport: Transport, adjust: impl FnOnce(&mut ManagerConfig)) -> Harness {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = match transport {
        Transport::Tcp => ManagerConfig::loopback(),
        Transport::Unix => ManagerConfig::new(Listen::Unix(dir.path().join("agent.sock"))),
    };
    config.state_dir = Some(dir.path().join("state"));
    adjust(&mut config);
    let containers = ContainersGuard(config.containers_dir.clone());
    let (handle, guard) = EmbeddedManager::spawn(config, CancellationToken::new())
        .await
        .expect("manager starts");
    let client = Client {
        endpoint: handle.endpoint().clone(),
    };
    Harness {
        handle,
        guard,
        client,
        containers,
        dir,
    }
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

#[derive(Clone)]
pub struct Client {
    pub endpoint: Endpoint,
}

async fn within<F: Future>(what: &str, future: F) -> F::Output {
    tokio::time::timeout(WAIT, future)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

impl Client {
    async fn connect(
        &self,
    ) -> (
        hyper::client::conn::http1::SendRequest<Full<Bytes>>,
        JoinHandle<()>,
    ) {
        macro_rules! handshake {
            ($io:expr) => {{
                let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new($io))
                    .await
                    .expect("handshake");
                let task = tokio::spawn(async move {
                    let _ = connection.await;
                });
                (sender, task)
            }};
        }
        match &self.endpoint {
            Endpoint::Tcp(addr) => {
                handshake!(tokio::net::TcpStream::connect(addr).await.expect("connect"))
            }
            Endpoint::Unix(path) => handshake!(
                tokio::net::UnixStream::connect(path)
                    .await
                    .expect("connect")
            ),
        }
    }

    pub async fn send_raw(
        &self,
        request: Request<Full<Bytes>>,
    ) -> (StatusCode, HeaderMap, Incoming, JoinHandle<()>) {
        let (mut sender, task) = self.connect().await;
        let response = within("a response", sender.send_request(request))
            .await
            .expect("response");
        let (parts, body) = response.into_parts();
        (parts.status, parts.headers, body, task)
    }

    pub async fn request(&self, request: Request<Full<Bytes>>) -> Reply {
        let (status, headers, body, task) = self.send_raw(request).await;
        let body = within("a body", body.collect())
            .await
            .expect("body")
            .to_bytes();
        task.abort();
        Reply {
            status,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    }

    pub fn post(content_type: Option<&str>, body: impl Into<Bytes>) -> http::request::Builder {
        let mut builder = Request::post(PATH).header("Host", "localhost");
        if let Some(content_type) = content_type {
            builder = builder.header("Content-Type", content_type);
        }
        let _ = body;
        builder
    }

    pub fn build(builder: http::request::Builder, body: impl Into<Bytes>) -> Request<Full<Bytes>> {
        builder.body(Full::new(body.into())).expect("request")
    }

    pub async fn call(
        &self,
        content_type: ContentType,
        call: &Call,
        stream_id: Option<&str>,
    ) -> Reply {
        let body = slrp_wire::encode(content_type, call).expect("encode");
        let mut builder = Request::post(PATH)
            .header("Host", "localhost")
            .header("Content-Type", content_type.as_str())
            .header("Accept", content_type.as_str());
        if let Some(stream_id) = stream_id {
            builder = builder.header("Mesos-Stream-Id", stream_id);
        }
        self.request(Self::build(builder, body)).await
    }

    /// SUBSCRIBE with `Accept` set to exactly the content type, as the reference provider does.
    pub async fn subscribe(&self, content_type: ContentType, info: ResourceProviderInfo) -> Stream {
        let body = slrp_wire::encode(content_type, &subscribe_call(info)).expect("encode");
        let builder = Request::post(PATH)
            .header("Host", "localhost")
            .header("Content-Type", content_type.as_str())
            .header("Accept", content_type.as_str());
        let (status, headers, body, connection) = self.send_raw(Self::build(builder, body)).await;
        assert_eq!(status, StatusCode::OK);
        let stream_id = headers
            .get("Mesos-Stream-Id")
            .expect("Mesos-Stream-Id")
            .to_str()
            .expect("ascii")
            .to_owned();
        Stream {
            headers,
            stream_id,
            content_type,
            body,
            buffer: BytesMut::new(),
            decoder: RecordIoDecoder::new(1 << 20),
            connection,
        }
    }
}

pub struct Stream {
    pub headers: HeaderMap,
    pub stream_id: String,
    pub content_type: ContentType,
    body: Incoming,
    buffer: BytesMut,
    decoder: RecordIoDecoder,
    connection: JoinHandle<()>,
}

impl Stream {
    /// The next event, or `None` at EOF.
    pub async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(record) = self.decoder.decode(&mut self.buffer).expect("recordio") {
                return Some(slrp_wire::decode(self.content_type, &record).expect("event"));
            }
            match within("an event", self.body.frame()).await {
                None => return None,
                Some(frame) => {
                    if let Ok(data) = frame.expect("frame").into_data() {
                        self.buffer.extend_from_slice(&data);
                    }
                }
            }
        }
    }

    /// Subscribes and returns the assigned provider ID from the SUBSCRIBED event.
    pub async fn subscribed(&mut self) -> String {
        let event = self.next().await.expect("SUBSCRIBED event");
        assert_eq!(
            event.r#type,
            Some(slrp_proto::mesos::v1::resource_provider::event::Type::Subscribed as i32)
        );
        event
            .subscribed
            .expect("subscribed payload")
            .provider_id
            .value
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.connection.abort();
    }
}

pub fn info(id: Option<&str>) -> ResourceProviderInfo {
    ResourceProviderInfo {
        id: id.map(provider_id),
        r#type: RP_TYPE.to_owned(),
        name: RP_NAME.to_owned(),
        ..ResourceProviderInfo::default()
    }
}

pub fn provider_id(id: &str) -> ResourceProviderId {
    ResourceProviderId {
        value: id.to_owned(),
    }
}

pub fn uuid() -> Uuid {
    Uuid {
        value: uuid::Uuid::new_v4().as_bytes().to_vec(),
    }
}

pub fn subscribe_call(info: ResourceProviderInfo) -> Call {
    Call {
        r#type: Some(call::Type::Subscribe as i32),
        subscribe: Some(call::Subscribe {
            resource_provider_info: info,
        }),
        ..Call::default()
    }
}

pub fn disk(provider: &str, megabytes: f64) -> Resource {
    Resource {
        name: "disk".to_owned(),
        r#type: value::Type::Scalar as i32,
        scalar: Some(value::Scalar { value: megabytes }),
        provider_id: Some(provider_id(provider)),
        ..Resource::default()
    }
}

pub fn update_state(provider: &str, resources: Vec<Resource>) -> Call {
    Call {
        resource_provider_id: Some(provider_id(provider)),
        r#type: Some(call::Type::UpdateState as i32),
        update_state: Some(call::UpdateState {
            operations: Vec::new(),
            resources,
            resource_version_uuid: uuid(),
        }),
        ..Call::default()
    }
}

/// A started manager with one provider subscribed over `content_type`.
pub async fn start_subscribed(
    transport: Transport,
    content_type: ContentType,
) -> (Harness, Stream, String) {
    let harness = start(transport).await;
    let mut stream = harness.client.subscribe(content_type, info(None)).await;
    let id = stream.subscribed().await;
    (harness, stream, id)
}
