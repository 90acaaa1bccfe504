//! Opening one HTTP/1.1 connection to the agent over TCP or a unix socket.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio::task::JoinHandle;

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use tokio_rustls::TlsConnector;

use crate::config::{AgentConfig, AgentEndpoint};
use crate::error::{AgentError, ConfigError};

/// The request body type: every call is one buffered message.
pub(crate) type ReqBody = Full<Bytes>;

/// Either socket kind, so hyper sees one I/O type.
enum Io {
    Tcp(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    Unix(UnixStream),
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Io::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Io::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Io::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Io::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// One open connection. Dropping it stops the task that drives the connection, which
/// closes the socket.
pub(crate) struct Connection {
    pub(crate) sender: SendRequest<ReqBody>,
    driver: JoinHandle<()>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").finish_non_exhaustive()
    }
}

fn tune_tcp(stream: &TcpStream, config: &AgentConfig) -> io::Result<()> {
    let sock = socket2::SockRef::from(stream);
    // Calls are small and latency matters more than packet count.
    stream.set_nodelay(true)?;
    if let Some(k) = &config.tcp_keepalive {
        let ka = socket2::TcpKeepalive::new()
            .with_time(k.idle)
            .with_interval(k.interval)
            .with_retries(k.count);
        sock.set_tcp_keepalive(&ka)?;
    }
    if let Some(t) = config.tcp_user_timeout {
        sock.set_tcp_user_timeout(Some(t))?;
    }
    Ok(())
}

/// Opens connections to one endpoint; holds the TLS setup, which is built once.
#[derive(Clone)]
pub(crate) struct Connector {
    tls: Option<(TlsConnector, ServerName<'static>)>,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// The trust roots: `ca_file` alone, or the system store. Reads files (blocking).
fn roots(config: &AgentConfig) -> Result<rustls::RootCertStore, ConfigError> {
    let mut roots = rustls::RootCertStore::empty();
    let Some(path) = &config.ca_file else {
        let found = rustls_native_certs::load_native_certs();
        let (added, _unparsable) = roots.add_parsable_certificates(found.certs);
        return if added == 0 {
            Err(ConfigError::NoSystemRoots)
        } else {
            Ok(roots)
        };
    };
    let pem = std::fs::read(path).map_err(|source| ConfigError::ReadCaFile {
        path: path.clone(),
        source,
    })?;
    let bad = |source| ConfigError::BadCaFile {
        path: path.clone(),
        source,
    };
    for cert in CertificateDer::pem_slice_iter(&pem) {
        roots
            .add(cert.map_err(|e| bad(Some(e)))?)
            .map_err(ConfigError::Tls)?;
    }
    if roots.is_empty() {
        return Err(bad(None));
    }
    Ok(roots)
}

impl Connector {
    /// Prepares TLS for an `https://` endpoint (loading the trust roots); nothing otherwise.
    pub(crate) fn new(config: &AgentConfig) -> Result<Self, ConfigError> {
        let AgentEndpoint::Tcp {
            host, tls: true, ..
        } = &config.endpoint
        else {
            return Ok(Self { tls: None });
        };
        let name = ServerName::try_from(host.clone())
            .map_err(|_| ConfigError::ServerName { host: host.clone() })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(ConfigError::Tls)?
            .with_root_certificates(roots(config)?)
            .with_no_client_auth();
        Ok(Self {
            tls: Some((TlsConnector::from(Arc::new(client)), name)),
        })
    }

    async fn open_socket(&self, config: &AgentConfig) -> Result<Io, AgentError> {
        let endpoint = || config.endpoint.to_string();
        let connect_error = |source| AgentError::Connect {
            endpoint: endpoint(),
            source,
        };
        match &config.endpoint {
            AgentEndpoint::Tcp { host, port, .. } => {
                let stream = TcpStream::connect((host.as_str(), *port))
                    .await
                    .map_err(connect_error)?;
                tune_tcp(&stream, config).map_err(connect_error)?;
                let Some((tls, name)) = &self.tls else {
                    return Ok(Io::Tcp(stream));
                };
                let stream = tls.connect(name.clone(), stream).await.map_err(|source| {
                    AgentError::TlsHandshake {
                        endpoint: endpoint(),
                        source,
                    }
                })?;
                Ok(Io::Tls(Box::new(stream)))
            }
            AgentEndpoint::Unix { socket, .. } => Ok(Io::Unix(
                UnixStream::connect(socket).await.map_err(connect_error)?,
            )),
        }
    }

    /// Connects and performs the HTTP/1.1 handshake within `config.connect_timeout`.
    pub(crate) async fn connect(&self, config: &AgentConfig) -> Result<Connection, AgentError> {
        let work = async {
            let io = self.open_socket(config).await?;
            let (sender, conn) = http1::handshake(TokioIo::new(io))
                .await
                .map_err(AgentError::Http)?;
            let driver = tokio::spawn(async move {
                if let Err(error) = conn.await {
                    tracing::debug!(error = %slrp_types::DisplayChain(&error), "agent connection ended");
                }
            });
            Ok(Connection { sender, driver })
        };
        tokio::time::timeout(config.connect_timeout, work)
            .await
            .map_err(|_| AgentError::Timeout {
                what: "connecting to the agent",
                timeout: config.connect_timeout,
            })?
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::TcpKeepalive;

    #[tokio::test]
    async fn tcp_connections_get_the_configured_keepalive_and_user_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let url = format!("http://127.0.0.1:{port}");
        let mut config = AgentConfig::new(AgentEndpoint::parse(&url).expect("url"));
        config.tcp_keepalive = Some(TcpKeepalive {
            idle: Duration::from_secs(7),
            interval: Duration::from_secs(3),
            count: 4,
        });
        config.tcp_user_timeout = Some(Duration::from_millis(1500));
        let connector = Connector::new(&config).expect("plain http");
        let Io::Tcp(stream) = connector.open_socket(&config).await.expect("connect") else {
            panic!("a TCP endpoint gives a TCP stream");
        };
        let sock = socket2::SockRef::from(&stream);
        assert!(sock.keepalive().expect("SO_KEEPALIVE"));
        assert_eq!(
            sock.tcp_keepalive_time().expect("idle"),
            Duration::from_secs(7)
        );
        assert_eq!(
            sock.tcp_keepalive_interval().expect("intvl"),
            Duration::from_secs(3)
        );
        assert_eq!(sock.tcp_keepalive_retries().expect("cnt"), 4);
        assert_eq!(
            sock.tcp_user_timeout().expect("user timeout"),
            Some(Duration::from_millis(1500))
        );
    }
}
