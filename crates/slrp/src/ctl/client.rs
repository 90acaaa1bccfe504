//! The admin API's client: one HTTP/1.1 request per connection, over the daemon's unix
//! socket or over TCP with a bearer token, and the errors an operator can act on.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, StatusCode, header};
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use slrp_provider::admin::api::ErrorBody;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::cli::{EX_USAGE, UsageError};

/// Exit code: the daemon answered with an error, or the operation did not finish.
pub(crate) const EXIT_FAILED: u8 = 1;
/// Exit code: the daemon is not running or cannot be reached.
pub(crate) const EXIT_UNREACHABLE: u8 = 2;
/// Exit code: permission denied on the socket, or a missing or wrong token (401).
pub(crate) const EXIT_DENIED: u8 = 3;
/// Exit code: unknown volume, operation or profile (404).
pub(crate) const EXIT_NOT_FOUND: u8 = 4;
/// Exit code: `--wait` timed out (the operation goes on).
pub(crate) const EXIT_TIMED_OUT: u8 = 5;

/// Where the admin API listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// The daemon's unix socket (no token: the socket's mode is the access control).
    Unix(PathBuf),
    /// `http://host:port`: every request carries the bearer token.
    Tcp {
        /// `host:port`, for the connection and the `Host` header.
        authority: String,
    },
}

impl Endpoint {
    /// `--admin`: a socket path, `unix:///path`, or `http://host:port`.
    pub(crate) fn parse(text: &str) -> Result<Self, UsageError> {
        let bad = |why: &str| UsageError(format!("--admin {text:?}: {why}"));
        if let Some(path) = text.strip_prefix("unix://") {
            if !path.starts_with('/') {
                return Err(bad(
                    "a unix:// address needs an absolute path (unix:///path)",
                ));
            }
            return Ok(Self::Unix(PathBuf::from(path)));
        }
        if let Some(rest) = text.strip_prefix("http://") {
            let authority = rest.strip_suffix('/').unwrap_or(rest);
            let valid = authority.parse::<http::uri::Authority>().ok().filter(|a| {
                a.port_u16().is_some() && !a.host().is_empty() && !authority.contains('@')
            });
            return match valid {
                Some(_) => Ok(Self::Tcp {
                    authority: authority.to_owned(),
                }),
                None => Err(bad("expected http://host:port with no path")),
            };
        }
        if text.contains("://") {
            return Err(bad(
                "unsupported scheme; use a socket path, unix:///path or http://host:port",
            ));
        }
        if text.is_empty() {
            return Err(bad("empty"));
        }
        Ok(Self::Unix(PathBuf::from(text)))
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unix(path) => write!(f, "{}", path.display()),
            Self::Tcp { authority } => write!(f, "http://{authority}"),
        }
    }
}

/// The bearer token, read from a file; never printed.
#[derive(Clone)]
pub(crate) struct Token(HeaderValue);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Token {
    /// Reads the token from `path` as the daemon reads its `token_file`
    /// ([`slrp_types::read_token_file`]: ASCII whitespace at both ends, such as the final
    /// newline an editor adds, is not part of it).
    pub(crate) fn read(path: &Path) -> Result<Self, CtlError> {
        let token = slrp_types::read_token_file(path).map_err(|e| match e {
            slrp_types::TokenFileError::Read { path, source } => {
                CtlError::TokenFile { path, source }
            }
            slrp_types::TokenFileError::Empty { path } => CtlError::EmptyToken { path },
        })?;
        let mut value =
            HeaderValue::try_from(format!("Bearer {token}")).map_err(|_| CtlError::BadToken {
                path: path.to_owned(),
            })?;
        value.set_sensitive(true);
        Ok(Self(value))
    }
}

/// What went wrong talking to the daemon, each with the exit code of the FIXED contract
/// (docs/cli.md).
#[derive(Debug, thiserror::Error)]
pub(crate) enum CtlError {
    /// The socket file does not exist.
    #[error(
        "slrp is not running (no admin socket at {}); start it with `slrp standalone` or pass --admin",
        .socket.display()
    )]
    NotRunning {
        /// The socket asked for.
        socket: PathBuf,
    },
    /// The socket exists (or the TCP port is closed) but nothing accepts on it.
    #[error(
        "slrp is not running (nothing listens on {endpoint}); start it with `slrp standalone` or pass --admin"
    )]
    NotListening {
        /// The endpoint asked for.
        endpoint: String,
    },
    /// Any other failure to connect or to complete the exchange.
    #[error("cannot reach slrp at {endpoint}")]
    Unreachable {
        /// The endpoint asked for.
        endpoint: String,
        /// The I/O or HTTP failure.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// No answer in time.
    #[error("slrp at {endpoint} did not answer within {}s", .after.as_secs())]
    NoAnswer {
        /// The endpoint asked for.
        endpoint: String,
        /// How long the client waited.
        after: Duration,
    },
    /// The socket (or its directory) may not be opened by this user.
    #[error(
        "cannot open {}: permission denied; run as root or as the daemon's user",
        .path.display()
    )]
    PermissionDenied {
        /// The socket asked for.
        path: PathBuf,
    },
    /// 401: no token, or a wrong one.
    #[error(
        "slrp at {endpoint} refused the request: {error}; pass the file holding the admin token with --token-file or SLRP_ADMIN_TOKEN_FILE"
    )]
    Unauthorized {
        /// The endpoint asked for.
        endpoint: String,
        /// The daemon's error text.
        error: String,
    },
    /// 404: the daemon does not know the volume, operation, profile or route.
    #[error("{error}")]
    NotFound {
        /// The daemon's error text (or the client's, for a profile it looked up).
        error: String,
    },
    /// Any other 4xx/5xx answer.
    #[error("{error} (HTTP {status})")]
    Daemon {
        /// The HTTP status.
        status: u16,
        /// The daemon's error text, with the field it names.
        error: String,
    },
    /// A publish answer without the path (the provider's mount paths went away meanwhile).
    #[error(
        "the daemon did not say where {volume_id} is published (state {state}); `slrp ctl volumes {volume_id}` shows its paths"
    )]
    NoPublishedPath {
        /// The volume.
        volume_id: String,
        /// Its state in the answer.
        state: String,
    },
    /// A `--wait` that the daemon (504) or the client gave up on: the operation goes on.
    #[error(
        "the operation did not end within {}s (it goes on: follow it with `slrp ctl operations`)",
        .after.as_secs()
    )]
    WaitTimedOut {
        /// The `--timeout`.
        after: Duration,
    },
    /// The operation ended in a state other than FINISHED.
    #[error("operation {operation} ({kind}) ended {state}: {message}")]
    OperationEnded {
        /// The operation uuid.
        operation: String,
        /// `CREATE_DISK`, `DESTROY_DISK`.
        kind: String,
        /// `OPERATION_FAILED`, `OPERATION_DROPPED`, `OPERATION_ERROR`, …
        state: String,
        /// The status message (or "no message").
        message: String,
    },
    /// The token file could not be read.
    #[error("cannot read the admin token file {}", .path.display())]
    TokenFile {
        /// `--token-file`.
        path: PathBuf,
        /// The read failure.
        #[source]
        source: io::Error,
    },
    /// The token file holds only whitespace.
    #[error("the admin token file {} is empty", .path.display())]
    EmptyToken {
        /// `--token-file`.
        path: PathBuf,
    },
    /// The token has characters a header cannot carry.
    #[error("the admin token in {} has characters an HTTP header cannot carry", .path.display())]
    BadToken {
        /// `--token-file`.
        path: PathBuf,
    },
    /// A 2xx answer whose body is not what the API documents.
    #[error("unexpected answer from slrp at {endpoint} to {request}")]
    BadAnswer {
        /// The endpoint asked for.
        endpoint: String,
        /// `GET /status`, …
        request: String,
        /// Why the body did not parse.
        #[source]
        source: serde_json::Error,
    },
}

impl CtlError {
    /// The process exit code for this error (docs/cli.md).
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            Self::NotRunning { .. }
            | Self::NotListening { .. }
            | Self::Unreachable { .. }
            | Self::NoAnswer { .. } => EXIT_UNREACHABLE,
            Self::PermissionDenied { .. } | Self::Unauthorized { .. } => EXIT_DENIED,
            Self::TokenFile { source, .. } if source.kind() == io::ErrorKind::PermissionDenied => {
                EXIT_DENIED
            }
            Self::TokenFile { .. } | Self::EmptyToken { .. } | Self::BadToken { .. } => EX_USAGE,
            Self::NotFound { .. } => EXIT_NOT_FOUND,
            Self::WaitTimedOut { .. } => EXIT_TIMED_OUT,
            Self::Daemon { .. }
            | Self::OperationEnded { .. }
            | Self::BadAnswer { .. }
            | Self::NoPublishedPath { .. } => EXIT_FAILED,
        }
    }
}

/// How long a request that does not wait for an operation may take.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The admin API client.
#[derive(Debug, Clone)]
pub(crate) struct AdminClient {
    endpoint: Endpoint,
    /// Sent on TCP only: the unix socket needs none.
    token: Option<Token>,
}

/// A request body, already encoded.
type Body = Full<Bytes>;

impl AdminClient {
    /// A client of `endpoint`, with the token for TCP.
    pub(crate) fn new(endpoint: Endpoint, token: Option<Token>) -> Self {
        Self { endpoint, token }
    }

    /// `GET path`, the body parsed as `T`.
    pub(crate) async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, CtlError> {
        let raw = self.get_raw(path).await?;
        self.parse(&format!("GET {path}"), &raw)
    }

    /// `GET path`, the body as the daemon sent it.
    pub(crate) async fn get_raw(&self, path: &str) -> Result<Bytes, CtlError> {
        self.request(Method::GET, path, None, REQUEST_TIMEOUT).await
    }

    /// `POST path` with `body` as JSON, waiting at most `timeout` for the answer.
    pub(crate) async fn post_raw<B: serde::Serialize>(
        &self,
        path: &str,
        body: &B,
        timeout: Duration,
    ) -> Result<Bytes, CtlError> {
        // Encoding the API's own request types cannot fail (no maps with non-string keys).
        let body = serde_json::to_vec(body).map_err(|source| CtlError::BadAnswer {
            endpoint: self.endpoint.to_string(),
            request: format!("POST {path} (encoding the request)"),
            source,
        })?;
        self.request(Method::POST, path, Some(body), timeout).await
    }

    /// `raw` parsed as `T`, or [`CtlError::BadAnswer`] naming `request`.
    pub(crate) fn parse<T: DeserializeOwned>(
        &self,
        request: &str,
        raw: &[u8],
    ) -> Result<T, CtlError> {
        serde_json::from_slice(raw).map_err(|source| CtlError::BadAnswer {
            endpoint: self.endpoint.to_string(),
            request: request.to_owned(),
            source,
        })
    }

    async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<Bytes, CtlError> {
        let endpoint = self.endpoint.to_string();
        let host = match &self.endpoint {
            Endpoint::Unix(_) => "localhost",
            Endpoint::Tcp { authority } => authority.as_str(),
        };
        let mut builder = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, host)
            .header(header::ACCEPT, "application/json");
        if let (Endpoint::Tcp { .. }, Some(token)) = (&self.endpoint, &self.token) {
            builder = builder.header(header::AUTHORIZATION, token.0.clone());
        }
        if body.is_some() {
            builder = builder.header(header::CONTENT_TYPE, "application/json");
        }
        let request = builder
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| CtlError::Unreachable {
                endpoint: endpoint.clone(),
                source: Box::new(e),
            })?;
        let exchange = async {
            match &self.endpoint {
                Endpoint::Unix(socket) => {
                    let io = tokio::net::UnixStream::connect(socket)
                        .await
                        .map_err(|e| connect_error(&self.endpoint, e))?;
                    exchange(io, request, &endpoint).await
                }
                Endpoint::Tcp { authority } => {
                    let io = tokio::net::TcpStream::connect(authority.as_str())
                        .await
                        .map_err(|e| connect_error(&self.endpoint, e))?;
                    exchange(io, request, &endpoint).await
                }
            }
        };
        let (status, bytes) = tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| CtlError::NoAnswer {
                endpoint: endpoint.clone(),
                after: timeout,
            })??;
        if status.is_success() {
            return Ok(bytes);
        }
        Err(refusal(status, &bytes, &endpoint))
    }
}

/// Sends `request` on a fresh connection and reads the whole answer.
async fn exchange<I>(
    io: I,
    request: Request<Body>,
    endpoint: &str,
) -> Result<(StatusCode, Bytes), CtlError>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let broken = |e: hyper::Error| CtlError::Unreachable {
        endpoint: endpoint.to_owned(),
        source: Box::new(e),
    };
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(broken)?;
    // The connection ends with the exchange: the task ends when the answer is read and
    // `sender` is dropped, or with the runtime.
    tokio::spawn(connection);
    let response = sender.send_request(request).await.map_err(broken)?;
    let status = response.status();
    let body = response.into_body().collect().await.map_err(broken)?;
    Ok((status, body.to_bytes()))
}

fn connect_error(endpoint: &Endpoint, e: io::Error) -> CtlError {
    match (endpoint, e.kind()) {
        (Endpoint::Unix(socket), io::ErrorKind::NotFound) => CtlError::NotRunning {
            socket: socket.clone(),
        },
        (Endpoint::Unix(socket), io::ErrorKind::PermissionDenied) => CtlError::PermissionDenied {
            path: socket.clone(),
        },
        (_, io::ErrorKind::ConnectionRefused) => CtlError::NotListening {
            endpoint: endpoint.to_string(),
        },
        _ => CtlError::Unreachable {
            endpoint: endpoint.to_string(),
            source: Box::new(e),
        },
    }
}

/// The error an unsuccessful answer stands for: the daemon's `{"error", "field"}` text, or
/// the status's reason when the body is not one (a route an older daemon lacks).
fn refusal(status: StatusCode, body: &[u8], endpoint: &str) -> CtlError {
    let error = match serde_json::from_slice::<ErrorBody>(body) {
        Ok(ErrorBody {
            error,
            field: Some(field),
        }) => format!("{error} (field '{field}')"),
        Ok(ErrorBody { error, field: None }) => error,
        Err(_) => {
            let text = String::from_utf8_lossy(body);
            let text = text.trim();
            let reason = status.canonical_reason().unwrap_or("error");
            if text.is_empty() {
                reason.to_lowercase()
            } else {
                format!("{}: {text}", reason.to_lowercase())
            }
        }
    };
    match status {
        StatusCode::UNAUTHORIZED => CtlError::Unauthorized {
            endpoint: endpoint.to_owned(),
            error,
        },
        StatusCode::NOT_FOUND => CtlError::NotFound { error },
        _ => CtlError::Daemon {
            status: status.as_u16(),
            error,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_addresses_parse() {
        assert_eq!(
            Endpoint::parse("/var/lib/slrp/admin.sock").unwrap(),
            Endpoint::Unix("/var/lib/slrp/admin.sock".into())
        );
        assert_eq!(
            Endpoint::parse("unix:///run/slrp.sock").unwrap(),
            Endpoint::Unix("/run/slrp.sock".into())
        );
        assert_eq!(
            Endpoint::parse("http://127.0.0.1:5055/").unwrap(),
            Endpoint::Tcp {
                authority: "127.0.0.1:5055".into()
            }
        );
        for bad in [
            "",
            "unix://relative.sock",
            "http://127.0.0.1",
            "http://127.0.0.1:5055/status",
            "http://user@127.0.0.1:5055",
            "https://127.0.0.1:5055",
        ] {
            let e = Endpoint::parse(bad).unwrap_err();
            assert!(e.0.contains("--admin"), "{bad}: {e}");
        }
    }

    #[test]
    fn refusals_keep_the_daemons_text_and_map_to_the_documented_codes() {
        let body = br#"{"error":"unknown volume 'v1'","field":"volume_id"}"#;
        let e = refusal(StatusCode::NOT_FOUND, body, "s");
        assert_eq!(e.exit_code(), EXIT_NOT_FOUND);
        assert_eq!(e.to_string(), "unknown volume 'v1' (field 'volume_id')");
        let e = refusal(
            StatusCode::UNAUTHORIZED,
            br#"{"error":"wrong token"}"#,
            "http://h:1",
        );
        assert_eq!(e.exit_code(), EXIT_DENIED);
        assert!(e.to_string().contains("--token-file"), "{e}");
        let e = refusal(
            StatusCode::CONFLICT,
            br#"{"error":"not enough space"}"#,
            "s",
        );
        assert_eq!(e.exit_code(), EXIT_FAILED);
        assert_eq!(e.to_string(), "not enough space (HTTP 409)");
        // A route an older daemon lacks: axum's empty 404.
        let e = refusal(StatusCode::NOT_FOUND, b"", "s");
        assert_eq!(e.to_string(), "not found");
    }

    #[test]
    fn the_token_is_trimmed_and_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, " s3cret\t \n").unwrap();
        let token = Token::read(&path).unwrap();
        assert_eq!(token.0.to_str().unwrap(), "Bearer s3cret");
        assert!(token.0.is_sensitive());
        assert!(!format!("{token:?}").contains("s3cret"));
        std::fs::write(&path, " \n").unwrap();
        let e = Token::read(&path).unwrap_err();
        assert_eq!(e.exit_code(), EX_USAGE);
        let e = Token::read(&dir.path().join("missing")).unwrap_err();
        assert_eq!(e.exit_code(), EX_USAGE);
    }
}
