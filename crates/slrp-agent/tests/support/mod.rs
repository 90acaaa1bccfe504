//! A scripted fake agent: it answers only what the test tells it to, request by request.
//! Every request is handed to the test, which must take and answer (or hold) it; a
//! request the test did not expect is caught by `assert_idle` at the end.

#![allow(dead_code, unreachable_pub, missing_docs)]

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use prost::{Message, Name};
use slrp_agent::{AgentConfig, AgentEndpoint, SessionEvent};
use slrp_proto::mesos::v1::resource_provider::{Call, Event, event};
use slrp_proto::mesos::v1::{ResourceProviderId, ResourceProviderInfo};
use slrp_types::{Backoff, Jitter};
use slrp_wire::ContentType;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// Every wait in the tests is bounded by this.
pub const WAIT: Duration = Duration::from_secs(10);

type Body = BoxBody<Bytes, Infallible>;

/// One request received by the fake.
pub struct Incoming {
    pub method: Method,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    respond: oneshot::Sender<Response<Body>>,
}

impl Incoming {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("ASCII header"))
    }

    pub fn call(&self, ct: ContentType) -> Call {
        assert_eq!(self.header("content-type"), Some(ct.as_str()));
        slrp_wire::decode(ct, &self.body).expect("a valid Call")
    }

    pub fn respond(self, status: StatusCode, body: &str) {
        let response = Response::builder()
            .status(status)
            .body(Full::new(Bytes::from(body.to_owned())).boxed())
            .expect("response");
        // The client may have given up already; the test's own assertions catch that.
        let _ = self.respond.send(response);
    }

    /// Answers with a binary body of the given media type.
    pub fn respond_bytes(self, status: StatusCode, content_type: &str, body: Vec<u8>) {
        let response = Response::builder()
            .status(status)
            .header("content-type", content_type)
            .body(Full::new(Bytes::from(body)).boxed())
            .expect("response");
        let _ = self.respond.send(response);
    }

    /// Answers 200 with an open event stream; the returned writer feeds it.
    pub fn respond_stream(self, ct: ContentType, stream_id: &str) -> StreamWriter {
        let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(16);
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        let response = Response::builder()
            .status(StatusCode::OK)
            .header("content-type", ct.as_str())
            .header("mesos-stream-id", stream_id)
            .body(StreamBody::new(stream).boxed())
            .expect("response");
        let _ = self.respond.send(response);
        StreamWriter { tx, ct }
    }

    /// Never answers while the returned value lives.
    pub fn hold(self) -> oneshot::Sender<Response<Body>> {
        self.respond
    }
}

/// The open body of an event stream. Dropping it ends the stream (EOF).
pub struct StreamWriter {
    tx: mpsc::Sender<Result<Frame<Bytes>, Infallible>>,
    ct: ContentType,
}

impl StreamWriter {
    pub async fn raw(&self, bytes: &[u8]) {
        self.tx
            .send(Ok(Frame::data(Bytes::copy_from_slice(bytes))))
            .await
            .expect("client reads the stream");
    }

    pub async fn record(&self, payload: &[u8]) {
        self.raw(&slrp_wire::recordio::encode_record(payload)).await;
    }

    pub async fn event(&self, event: &Event) {
        let payload = slrp_wire::encode(self.ct, event).expect("encodable");
        self.record(&payload).await;
    }

    pub async fn subscribed(&self, provider_id: &str) {
        self.event(&subscribed(provider_id)).await;
    }
}

pub fn subscribed(provider_id: &str) -> Event {
    Event {
        r#type: Some(event::Type::Subscribed as i32),
        subscribed: Some(event::Subscribed {
            provider_id: ResourceProviderId {
                value: provider_id.into(),
            },
        }),
        ..Event::default()
    }
}

/// Where the fake listens.
pub enum Listen {
    Tcp(TcpListener),
    Tls(TcpListener, tokio_rustls::TlsAcceptor),
    Unix(UnixListener, PathBuf, tempfile::TempDir),
}

pub struct FakeAgent {
    requests: mpsc::UnboundedReceiver<Incoming>,
    pub connections: Arc<AtomicUsize>,
    pub endpoint: AgentEndpoint,
    task: JoinHandle<()>,
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve<S>(stream: S, tx: mpsc::UnboundedSender<Incoming>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
        let tx = tx.clone();
        async move {
            let (parts, body) = req.into_parts();
            let body = body.collect().await?.to_bytes();
            let (respond, answer) = oneshot::channel();
            let incoming = Incoming {
                method: parts.method,
                path: parts.uri.path().to_owned(),
                headers: parts.headers,
                body,
                respond,
            };
            if tx.send(incoming).is_err() {
                return Ok(Response::new(Full::new(Bytes::new()).boxed()));
            }
            // A held (dropped) responder closes the connection without an answer.
            match answer.await {
                Ok(response) => Ok::<_, hyper::Error>(response),
                Err(_) => std::future::pending().await,
            }
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

impl FakeAgent {
    pub async fn tcp() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        Self::start(Listen::Tcp(listener))
    }

    pub async fn tcp_on(listener: TcpListener) -> Self {
        Self::start(Listen::Tcp(listener))
    }

    /// An https agent on 127.0.0.1 with a certificate signed by a fresh CA; returns the
    /// CA certificate in PEM.
    pub async fn tls() -> (Self, String) {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let ca =
            rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().expect("key"))
                .expect("CA");
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .expect("params")
            .signed_by(&key, &ca)
            .expect("cert");
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key)
            .expect("server config");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        (Self::start(Listen::Tls(listener, acceptor)), ca.pem())
    }

    pub fn unix() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("agent.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        Self::start(Listen::Unix(listener, path, dir))
    }

    fn start(listen: Listen) -> Self {
        let (tx, requests) = mpsc::unbounded_channel();
        let connections = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&connections);
        let (endpoint, task) = match listen {
            Listen::Tcp(listener) => {
                let port = listener.local_addr().expect("addr").port();
                let url = format!("http://127.0.0.1:{port}");
                let task = tokio::spawn(async move {
                    while let Ok((stream, _)) = listener.accept().await {
                        counter.fetch_add(1, Ordering::SeqCst);
                        tokio::spawn(serve(stream, tx.clone()));
                    }
                });
                (AgentEndpoint::parse(&url).expect("url"), task)
            }
            Listen::Tls(listener, acceptor) => {
                let port = listener.local_addr().expect("addr").port();
                let url = format!("https://127.0.0.1:{port}");
                let task = tokio::spawn(async move {
                    while let Ok((stream, _)) = listener.accept().await {
                        counter.fetch_add(1, Ordering::SeqCst);
                        let (acceptor, tx) = (acceptor.clone(), tx.clone());
                        tokio::spawn(async move {
                            // A refused handshake is what a test provokes; nothing to serve.
                            if let Ok(stream) = acceptor.accept(stream).await {
                                serve(stream, tx).await;
                            }
                        });
                    }
                });
                (AgentEndpoint::parse(&url).expect("url"), task)
            }
            Listen::Unix(listener, path, dir) => {
                let url = format!("unix://{}", path.display());
                let task = tokio::spawn(async move {
                    let _dir = dir;
                    while let Ok((stream, _)) = listener.accept().await {
                        counter.fetch_add(1, Ordering::SeqCst);
                        tokio::spawn(serve(stream, tx.clone()));
                    }
                });
                (AgentEndpoint::parse(&url).expect("url"), task)
            }
        };
        Self {
            requests,
            connections,
            endpoint,
            task,
        }
    }

    pub async fn next(&mut self) -> Incoming {
        self.next_at(slrp_agent::RESOURCE_PROVIDER_PATH).await
    }

    /// The next request, which must be a POST to `path`.
    pub async fn next_at(&mut self, path: &str) -> Incoming {
        let req = tokio::time::timeout(WAIT, self.requests.recv())
            .await
            .expect("a request within the bound")
            .expect("server running");
        assert_eq!(req.method, Method::POST);
        assert_eq!(req.path, path);
        req
    }

    pub fn assert_idle(&mut self) {
        if let Ok(req) = self.requests.try_recv() {
            panic!("unexpected request: {:?} {:?}", req.headers, req.body);
        }
    }

    pub fn config(&self) -> AgentConfig {
        test_config(self.endpoint.clone())
    }
}

pub fn test_config(endpoint: AgentEndpoint) -> AgentConfig {
    let mut config = AgentConfig::new(endpoint);
    config.backoff =
        Backoff::new(Duration::from_millis(20), Duration::from_millis(200)).expect("valid");
    config.jitter = Jitter::None;
    config.connect_timeout = Duration::from_secs(5);
    config.subscribe_timeout = Duration::from_secs(5);
    config.call_timeout = Duration::from_secs(5);
    config
}

pub fn info() -> ResourceProviderInfo {
    ResourceProviderInfo {
        r#type: "org.apache.mesos.rp.local.storage".into(),
        name: "test".into(),
        ..ResourceProviderInfo::default()
    }
}

pub async fn next_event(events: &mut mpsc::Receiver<SessionEvent>) -> SessionEvent {
    tokio::time::timeout(WAIT, events.recv())
        .await
        .expect("a session event within the bound")
        .expect("worker running")
}

pub fn decode_protobuf<M: Message + Name + Default>(bytes: &[u8]) -> M {
    slrp_wire::decode(ContentType::Protobuf, bytes).expect("valid")
}
