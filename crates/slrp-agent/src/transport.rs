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

use crate::config::{AgentConfig, AgentEndpoint};
use crate::error::AgentError;

/// The request body type: every call is one buffered message.
pub(crate) type ReqBody = Full<Bytes>;

/// Either socket kind, so hyper sees one I/O type.
enum Io {
    Tcp(TcpStream),
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
            Io::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_flush(cx),
            Io::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_shutdown(cx),
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

async fn open_socket(config: &AgentConfig) -> io::Result<Io> {
    match &config.endpoint {
        AgentEndpoint::Tcp { host, port, .. } => {
            let stream = TcpStream::connect((host.as_str(), *port)).await?;
            tune_tcp(&stream, config)?;
            Ok(Io::Tcp(stream))
        }
        AgentEndpoint::Unix { socket, .. } => Ok(Io::Unix(UnixStream::connect(socket).await?)),
    }
}

/// Connects and performs the HTTP/1.1 handshake within `config.connect_timeout`.
pub(crate) async fn connect(config: &AgentConfig) -> Result<Connection, AgentError> {
    let work = async {
        let io = open_socket(config)
            .await
            .map_err(|source| AgentError::Connect {
                endpoint: config.endpoint.to_string(),
                source,
            })?;
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
        let Io::Tcp(stream) = open_socket(&config).await.expect("connect") else {
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
