//! Client configuration: where the agent is, how to talk to it, and the time bounds.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use slrp_types::{Backoff, Jitter};
use slrp_wire::ContentType;

use crate::error::ConfigError;

/// The agent's resource provider endpoint path (spec §2.1), used when `--agent` has no path.
pub const RESOURCE_PROVIDER_PATH: &str = "/slave(1)/api/v1/resource_provider";

/// The URL scheme for an agent (or embedded manager) listening on a unix socket.
pub const UNIX_SCHEME: &str = "unix://";

/// Where the agent listens and which path serves the resource provider API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentEndpoint {
    /// HTTP over TCP, or over TLS over TCP (`https://`).
    Tcp {
        /// Host name or IP literal (IPv6 without brackets); also the TLS server name.
        host: String,
        /// TCP port.
        port: u16,
        /// Request path.
        path: String,
        /// Whether TLS is used.
        tls: bool,
    },
    /// HTTP over a unix stream socket.
    Unix {
        /// The socket's filesystem path.
        socket: PathBuf,
        /// Request path.
        path: String,
    },
}

impl AgentEndpoint {
    /// Parses an `--agent` URL: `http[s]://HOST[:PORT][/PATH]` or `unix:///SOCKET/PATH`.
    ///
    /// An http(s) URL without a path (or with just `/`) gets [`RESOURCE_PROVIDER_PATH`];
    /// the port defaults to 80 (443 for https) as for any such URL. A unix URL names the socket file; requests
    /// on it always use [`RESOURCE_PROVIDER_PATH`].
    ///
    /// # Errors
    /// [`ConfigError::AgentUrl`] naming the URL and what is wrong with it.
    pub fn parse(url: &str) -> Result<Self, ConfigError> {
        let bad = |reason: &'static str| ConfigError::AgentUrl {
            url: url.to_owned(),
            reason,
        };
        if let Some(rest) = url.strip_prefix(UNIX_SCHEME) {
            if !rest.starts_with('/') {
                return Err(bad(
                    "a unix URL needs an absolute socket path: unix:///path/to/sock",
                ));
            }
            if rest.contains(['?', '#']) {
                return Err(bad("a unix URL takes no query or fragment"));
            }
            return Ok(Self::Unix {
                socket: PathBuf::from(rest),
                path: RESOURCE_PROVIDER_PATH.to_owned(),
            });
        }
        let uri: http::Uri = url.parse().map_err(|_| bad("not a valid URL"))?;
        let tls = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return Err(bad("the scheme must be http://, https:// or unix://")),
        };
        let authority = uri.authority().ok_or_else(|| bad("the URL has no host"))?;
        if authority.as_str().contains('@') {
            return Err(bad(
                "credentials in the URL are not supported; configure a token",
            ));
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        if host.is_empty() {
            return Err(bad("the URL has no host"));
        }
        if uri.query().is_some() {
            return Err(bad("the agent URL takes no query"));
        }
        let path = match uri.path() {
            "" | "/" => RESOURCE_PROVIDER_PATH.to_owned(),
            p => p.to_owned(),
        };
        Ok(Self::Tcp {
            host: host.to_owned(),
            port: authority.port_u16().unwrap_or(if tls { 443 } else { 80 }),
            path,
            tls,
        })
    }

    /// The request path.
    pub fn path(&self) -> &str {
        match self {
            Self::Tcp { path, .. } | Self::Unix { path, .. } => path,
        }
    }

    /// The `Host` header value.
    pub(crate) fn host_header(&self) -> String {
        match self {
            Self::Tcp { host, port, .. } if host.contains(':') => format!("[{host}]:{port}"),
            Self::Tcp { host, port, .. } => format!("{host}:{port}"),
            // RFC 7230 requires a Host; a socket has no name, and the agent ignores it.
            Self::Unix { .. } => "localhost".to_owned(),
        }
    }
}

impl fmt::Display for AgentEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tcp { tls, .. } => {
                let scheme = if *tls { "https" } else { "http" };
                write!(f, "{scheme}://{}{}", self.host_header(), self.path())
            }
            Self::Unix { socket, path } => write!(f, "{UNIX_SCHEME}{}{path}", socket.display()),
        }
    }
}

/// A bearer token. `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// Wraps a token.
    pub fn new(token: impl Into<String>) -> Self {
        Self(token.into())
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// TCP keepalive probing of an idle connection: a peer that vanished without a FIN or RST
/// (host down, cable cut, NAT state lost) is detected after about
/// `idle + interval * count`. The event stream carries no heartbeats (spec §2.3), so this
/// is what bounds how long a dead agent goes unnoticed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpKeepalive {
    /// Idle time before the first probe (`TCP_KEEPIDLE`).
    pub idle: Duration,
    /// Time between unanswered probes (`TCP_KEEPINTVL`).
    pub interval: Duration,
    /// Unanswered probes before the connection is dropped (`TCP_KEEPCNT`).
    pub count: u32,
}

impl TcpKeepalive {
    /// The worst-case time to notice a silent dead peer on an idle connection.
    pub fn detection_bound(&self) -> Duration {
        self.idle + self.interval * self.count
    }
}

/// Everything [`crate::AgentClient`] needs. Build with [`AgentConfig::new`], adjust the
/// public fields, and let [`crate::AgentClient::spawn`] validate it.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Where the agent is.
    pub endpoint: AgentEndpoint,
    /// Trust roots for `https://`: a PEM bundle that replaces the system trust store.
    pub ca_file: Option<PathBuf>,
    /// Media type of calls and events. Protobuf by default, as the reference provider.
    pub content_type: ContentType,
    /// Sent as `Authorization: Bearer <token>` on every request when set.
    pub token: Option<Token>,
    /// Bounds of the wait between connection attempts.
    pub backoff: Backoff,
    /// How waits are drawn below their ceiling.
    pub jitter: Jitter,
    /// A subscription that lasted this long resets the backoff: the next reconnect waits
    /// at most the base again.
    pub backoff_reset_after: Duration,
    /// Bound on opening one connection (TCP or unix connect plus HTTP handshake).
    pub connect_timeout: Duration,
    /// Bound from sending SUBSCRIBE to receiving the SUBSCRIBED event. An agent that accepts
    /// and never answers, or an inadmissible subscription, ends the attempt after this.
    pub subscribe_timeout: Duration,
    /// Bound on one non-SUBSCRIBE call, from sending to reading the whole answer.
    pub call_timeout: Duration,
    /// Keepalive probing on TCP connections; `None` leaves the OS default (off).
    pub tcp_keepalive: Option<TcpKeepalive>,
    /// `TCP_USER_TIMEOUT`: unacknowledged sent data for this long drops the connection.
    pub tcp_user_timeout: Option<Duration>,
    /// The largest event record accepted; a larger one ends the stream.
    pub max_record_len: usize,
    /// Capacity of the session event channel; a slow consumer slows the stream reader.
    pub event_buffer: usize,
}

impl AgentConfig {
    /// A configuration with the documented defaults for `endpoint`.
    pub fn new(endpoint: AgentEndpoint) -> Self {
        Self {
            endpoint,
            content_type: ContentType::Protobuf,
            ca_file: None,
            token: None,
            backoff: Backoff::new(Duration::from_millis(500), Duration::from_secs(30))
                .unwrap_or(Backoff::PLUGIN_RESTART),
            jitter: Jitter::Full,
            backoff_reset_after: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
            subscribe_timeout: Duration::from_secs(30),
            call_timeout: Duration::from_secs(30),
            tcp_keepalive: Some(TcpKeepalive {
                idle: Duration::from_secs(10),
                interval: Duration::from_secs(5),
                count: 3,
            }),
            tcp_user_timeout: Some(Duration::from_secs(30)),
            max_record_len: slrp_wire::recordio::DEFAULT_MAX_RECORD_LEN,
            event_buffer: 64,
        }
    }

    /// Checks the values that cannot work.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first offending setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let positive = [
            ("connect_timeout", self.connect_timeout),
            ("subscribe_timeout", self.subscribe_timeout),
            ("call_timeout", self.call_timeout),
        ];
        for (name, value) in positive {
            if value.is_zero() {
                return Err(ConfigError::ZeroDuration { name });
            }
        }
        if let Some(k) = &self.tcp_keepalive {
            if k.idle < Duration::from_secs(1) || k.interval < Duration::from_secs(1) {
                // The socket options take whole seconds; less would silently become 0.
                return Err(ConfigError::KeepaliveTooShort);
            }
            if k.count == 0 {
                return Err(ConfigError::ZeroCount {
                    name: "tcp_keepalive.count",
                });
            }
        }
        if self.tcp_user_timeout.is_some_and(|t| t.is_zero()) {
            return Err(ConfigError::ZeroDuration {
                name: "tcp_user_timeout",
            });
        }
        if self.max_record_len == 0 {
            return Err(ConfigError::ZeroCount {
                name: "max_record_len",
            });
        }
        if self.event_buffer == 0 {
            return Err(ConfigError::ZeroCount {
                name: "event_buffer",
            });
        }
        if let Some(token) = &self.token {
            let value = format!("Bearer {}", token.expose());
            if token.expose().is_empty() || http::HeaderValue::from_str(&value).is_err() {
                return Err(ConfigError::BadToken);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_without_path_gets_the_resource_provider_path() {
        for url in ["http://127.0.0.1:5051", "http://127.0.0.1:5051/"] {
            let e = AgentEndpoint::parse(url).expect("valid");
            assert_eq!(
                e,
                AgentEndpoint::Tcp {
                    host: "127.0.0.1".into(),
                    port: 5051,
                    path: RESOURCE_PROVIDER_PATH.into(),
                    tls: false,
                }
            );
        }
        let e = AgentEndpoint::parse("https://agent").expect("valid");
        assert_eq!(
            e.to_string(),
            "https://agent:443/slave(1)/api/v1/resource_provider"
        );
        let e = AgentEndpoint::parse("http://10.0.0.1:5051/slave(1)/api/v1/resource_provider")
            .expect("valid");
        assert_eq!(e.path(), RESOURCE_PROVIDER_PATH);
        let e = AgentEndpoint::parse("http://agent/api/v1/resource_provider").expect("valid");
        assert_eq!(e.path(), "/api/v1/resource_provider");
        assert_eq!(e.host_header(), "agent:80");
        let e = AgentEndpoint::parse("http://[::1]:5051").expect("valid");
        assert_eq!(e.host_header(), "[::1]:5051");
    }

    #[test]
    fn unix_urls_name_the_socket() {
        let e = AgentEndpoint::parse("unix:///run/slrp/manager.sock").expect("valid");
        assert_eq!(
            e,
            AgentEndpoint::Unix {
                socket: "/run/slrp/manager.sock".into(),
                path: RESOURCE_PROVIDER_PATH.into()
            }
        );
        assert_eq!(
            e.to_string(),
            "unix:///run/slrp/manager.sock/slave(1)/api/v1/resource_provider"
        );
    }

    #[test]
    fn bad_urls_are_refused_with_the_reason() {
        for (url, needle) in [
            ("ftp://agent", "scheme"),
            ("unix://relative.sock", "absolute"),
            ("http://user:pw@agent", "credentials"),
            ("127.0.0.1:5051", "scheme"),
        ] {
            let err = AgentEndpoint::parse(url).expect_err(url).to_string();
            assert!(err.contains(url) && err.contains(needle), "{url}: {err}");
        }
    }

    #[test]
    fn validation_names_the_setting_and_hides_the_token() {
        let endpoint = AgentEndpoint::parse("http://127.0.0.1:1").expect("valid");
        let mut c = AgentConfig::new(endpoint.clone());
        c.validate().expect("defaults are valid");
        c.call_timeout = Duration::ZERO;
        assert!(
            c.validate()
                .expect_err("zero")
                .to_string()
                .contains("call_timeout")
        );
        let mut c = AgentConfig::new(endpoint);
        c.token = Some(Token::new("sec\nret"));
        let err = c.validate().expect_err("newline");
        assert!(!err.to_string().contains("sec"));
        assert!(!format!("{c:?}").contains("sec"));
    }
}
