//! Where profile documents come from, and fetching them.
//!
//! URI rules follow Mesos's URI adaptor: an absolute path (a `file://` prefix is stripped),
//! `http://`, or an inline document. Unlike Mesos, `https://` is refused with a clear error:
//! slrp carries no TLS stack (see docs/profiles.md).

use std::{
    fmt,
    path::{Path, PathBuf},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use tokio::io::AsyncReadExt;

use crate::config::ConfigError;

/// Where the profile document comes from.
#[derive(Clone, PartialEq, Eq)]
pub enum ProfileSource {
    /// A local file, read on every poll.
    File(PathBuf),
    /// An `http://` URL, fetched with GET on every poll.
    Http(http::Uri),
    /// A document embedded in slrp's own configuration; "fetched" once.
    Inline(serde_json::Value),
}

impl ProfileSource {
    /// Parses a `uri` setting as Mesos does.
    ///
    /// # Errors
    /// Unsupported schemes (including `https`), relative paths, malformed URLs and URLs with
    /// credentials.
    pub fn parse_uri(uri: &str) -> Result<Self, ConfigError> {
        if uri.is_empty() {
            return Err(ConfigError::EmptyUri);
        }
        if let Some(path) = uri.strip_prefix("file://") {
            return Self::file(path);
        }
        if uri.starts_with("https://") {
            return Err(ConfigError::HttpsUnsupported);
        }
        if uri.starts_with("http://") {
            let parsed: http::Uri = uri.parse().map_err(|source| ConfigError::BadUrl {
                url: redact_str(uri),
                source,
            })?;
            if parsed.authority().is_some_and(|a| a.as_str().contains('@')) {
                return Err(ConfigError::CredentialsInUrl);
            }
            if parsed.host().is_none_or(str::is_empty) {
                return Err(ConfigError::NoHost {
                    url: redact_str(uri),
                });
            }
            return Ok(Self::Http(parsed));
        }
        if let Some((scheme, _)) = uri.split_once("://") {
            return Err(ConfigError::UnsupportedScheme {
                scheme: scheme.to_owned(),
            });
        }
        Self::file(uri)
    }

    fn file(path: &str) -> Result<Self, ConfigError> {
        let path = Path::new(path);
        if !path.is_absolute() {
            return Err(ConfigError::RelativePath {
                path: path.to_owned(),
            });
        }
        Ok(Self::File(path.to_owned()))
    }
}

/// Shows the source without anything secret: no query string (it may carry a token).
impl fmt::Display for ProfileSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File(p) => write!(f, "{}", p.display()),
            Self::Http(uri) => f.write_str(&redact(uri)),
            Self::Inline(_) => f.write_str("inline profile set"),
        }
    }
}

impl fmt::Debug for ProfileSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File(p) => f.debug_tuple("File").field(p).finish(),
            Self::Http(_) => f.debug_tuple("Http").field(&self.to_string()).finish(),
            Self::Inline(_) => f.write_str("Inline(..)"),
        }
    }
}

fn redact(uri: &http::Uri) -> String {
    let mut out = String::new();
    if let Some(scheme) = uri.scheme_str() {
        out.push_str(scheme);
        out.push_str("://");
    }
    if let Some(auth) = uri.authority() {
        out.push_str(auth.as_str().rsplit('@').next().unwrap_or_default());
    }
    out.push_str(uri.path());
    if uri.query().is_some() {
        out.push_str("?<redacted>");
    }
    out
}

fn redact_str(uri: &str) -> String {
    let no_query = uri.split('?').next().unwrap_or_default();
    match no_query.split_once("://") {
        Some((scheme, rest)) => {
            let (auth, path) = rest.split_once('/').unwrap_or((rest, ""));
            let host = auth.rsplit('@').next().unwrap_or_default();
            format!("{scheme}://{host}/{path}")
        }
        None => no_query.to_owned(),
    }
}

/// Why a fetch failed. The previous mapping stays in force.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The file could not be read.
    #[error("reading profile file {path}")]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file exceeds the document size limit.
    #[error("profile file {path} is larger than {limit} bytes")]
    FileTooLarge {
        /// The file.
        path: PathBuf,
        /// The limit.
        limit: usize,
    },
    /// The request could not be sent or no response arrived.
    #[error("GET {url}")]
    Request {
        /// The URL (redacted).
        url: String,
        /// The client error.
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    /// The server answered with something other than 200.
    #[error("GET {url} returned {status}, expected 200 OK")]
    Status {
        /// The URL (redacted).
        url: String,
        /// The status received.
        status: http::StatusCode,
    },
    /// The response body could not be read.
    #[error("reading the response body of GET {url}")]
    Body {
        /// The URL (redacted).
        url: String,
        /// The transport error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The response body exceeds the document size limit.
    #[error("response body of GET {url} is larger than {limit} bytes")]
    BodyTooLarge {
        /// The URL (redacted).
        url: String,
        /// The limit.
        limit: usize,
    },
    /// The fetch did not finish within the per-fetch timeout.
    #[error("fetching {source_name} timed out after {after:?}")]
    Timeout {
        /// The source (redacted).
        source_name: String,
        /// The timeout.
        after: Duration,
    },
}

/// Fetches documents from one source. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub(crate) struct Fetcher {
    source: ProfileSource,
    client: Client<HttpConnector, Empty<Bytes>>,
    timeout: Duration,
    max_bytes: usize,
}

/// A fetched document: raw bytes, or an inline JSON value.
#[derive(Debug)]
pub(crate) enum Fetched {
    Bytes(Bytes),
    Value(serde_json::Value),
}

impl Fetcher {
    pub(crate) fn new(source: ProfileSource, timeout: Duration, max_bytes: usize) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(timeout));
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Self {
            source,
            client,
            timeout,
            max_bytes,
        }
    }

    pub(crate) fn source(&self) -> &ProfileSource {
        &self.source
    }

    /// Fetches the document once, within the per-fetch timeout.
    ///
    /// # Cancel safety
    /// Dropping the future abandons the fetch; nothing is left behind.
    pub(crate) async fn fetch(&self) -> Result<Fetched, FetchError> {
        let work = async {
            match &self.source {
                ProfileSource::File(path) => self.fetch_file(path).await.map(Fetched::Bytes),
                ProfileSource::Http(uri) => self.fetch_http(uri).await.map(Fetched::Bytes),
                ProfileSource::Inline(v) => Ok(Fetched::Value(v.clone())),
            }
        };
        tokio::time::timeout(self.timeout, work)
            .await
            .unwrap_or_else(|_| {
                Err(FetchError::Timeout {
                    source_name: self.source.to_string(),
                    after: self.timeout,
                })
            })
    }

    async fn fetch_file(&self, path: &Path) -> Result<Bytes, FetchError> {
        let read_err = |source| FetchError::ReadFile {
            path: path.to_owned(),
            source,
        };
        let file = tokio::fs::File::open(path).await.map_err(read_err)?;
        let mut buf = Vec::new();
        file.take(
            u64::try_from(self.max_bytes)
                .unwrap_or(u64::MAX)
                .saturating_add(1),
        )
        .read_to_end(&mut buf)
        .await
        .map_err(read_err)?;
        if buf.len() > self.max_bytes {
            return Err(FetchError::FileTooLarge {
                path: path.to_owned(),
                limit: self.max_bytes,
            });
        }
        Ok(Bytes::from(buf))
    }

    async fn fetch_http(&self, uri: &http::Uri) -> Result<Bytes, FetchError> {
        let url = redact(uri);
        let request = http::Request::get(uri.clone())
            .header(http::header::ACCEPT, "application/json")
            .header(http::header::USER_AGENT, "slrp")
            .body(Empty::<Bytes>::new())
            .map_err(|e| FetchError::Body {
                url: url.clone(),
                source: Box::new(e),
            })?;
        let response =
            self.client
                .request(request)
                .await
                .map_err(|source| FetchError::Request {
                    url: url.clone(),
                    source,
                })?;
        if response.status() != http::StatusCode::OK {
            return Err(FetchError::Status {
                url,
                status: response.status(),
            });
        }
        match Limited::new(response.into_body(), self.max_bytes)
            .collect()
            .await
        {
            Ok(collected) => Ok(collected.to_bytes()),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(FetchError::BodyTooLarge {
                url,
                limit: self.max_bytes,
            }),
            Err(source) => Err(FetchError::Body { url, source }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_rules_follow_mesos() {
        assert_eq!(
            ProfileSource::parse_uri("/etc/profiles.json").unwrap(),
            ProfileSource::File("/etc/profiles.json".into())
        );
        assert_eq!(
            ProfileSource::parse_uri("file:///etc/profiles.json").unwrap(),
            ProfileSource::File("/etc/profiles.json".into())
        );
        assert!(matches!(
            ProfileSource::parse_uri("http://127.0.0.1:8080/profiles").unwrap(),
            ProfileSource::Http(_)
        ));
        assert!(matches!(
            ProfileSource::parse_uri("profiles.json"),
            Err(ConfigError::RelativePath { .. })
        ));
        assert!(matches!(
            ProfileSource::parse_uri("file://relative/x.json"),
            Err(ConfigError::RelativePath { .. })
        ));
        assert!(matches!(
            ProfileSource::parse_uri("ftp://host/x"),
            Err(ConfigError::UnsupportedScheme { .. })
        ));
        assert!(matches!(
            ProfileSource::parse_uri("https://host/x"),
            Err(ConfigError::HttpsUnsupported)
        ));
        assert!(matches!(
            ProfileSource::parse_uri("http://user:secret@host/x"),
            Err(ConfigError::CredentialsInUrl)
        ));
        assert!(matches!(
            ProfileSource::parse_uri(""),
            Err(ConfigError::EmptyUri)
        ));
    }

    #[test]
    fn display_hides_query_strings() {
        let s = ProfileSource::parse_uri("http://host:1/p?token=hunter2").unwrap();
        assert_eq!(s.to_string(), "http://host:1/p?<redacted>");
        assert!(!format!("{s:?}").contains("hunter2"));
        let err = ProfileSource::parse_uri("http://a b/?token=hunter2").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }
}
