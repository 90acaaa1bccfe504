//! Where profile documents come from, and fetching them.
//!
//! URI rules follow Mesos's URI adaptor: an absolute path (a `file://` prefix is stripped),
//! `http://` or `https://`, or an inline document. HTTPS uses rustls with the ring crypto
//! provider; the server is verified against the system trust store, or only against the
//! PEM bundle in `ca_file` when one is configured (see docs/profiles.md).

use std::{
    fmt,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::{
    client::legacy::{
        Client,
        connect::{Connect, HttpConnector},
    },
    rt::TokioExecutor,
};
use rustls::pki_types::{CertificateDer, pem::PemObject};
use tokio::io::AsyncReadExt;

use crate::config::ConfigError;

/// Where the profile document comes from.
#[derive(Clone, PartialEq, Eq)]
pub enum ProfileSource {
    /// A local file, read on every poll.
    File(PathBuf),
    /// An `http://` or `https://` URL, fetched with GET on every poll.
    Http(http::Uri),
    /// A document embedded in slrp's own configuration; "fetched" once.
    Inline(serde_json::Value),
}

impl ProfileSource {
    /// Parses a `uri` setting as Mesos does.
    ///
    /// # Errors
    /// Unsupported schemes, relative paths, malformed URLs and URLs with credentials.
    pub fn parse_uri(uri: &str) -> Result<Self, ConfigError> {
        if uri.is_empty() {
            return Err(ConfigError::EmptyUri);
        }
        if let Some(path) = uri.strip_prefix("file://") {
            return Self::file(path);
        }
        if uri.starts_with("http://") || uri.starts_with("https://") {
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

    /// Whether this is an `https://` source (the only kind that uses `ca_file`).
    #[must_use]
    pub fn is_https(&self) -> bool {
        matches!(self, Self::Http(uri) if uri.scheme() == Some(&http::uri::Scheme::HTTPS))
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
    /// The TLS client could not be set up (trust roots); retried on the next fetch.
    #[error("setting up TLS for {url}")]
    TlsSetup {
        /// The URL (redacted).
        url: String,
        /// What went wrong.
        #[source]
        source: TlsSetupError,
    },
    /// The TLS handshake failed: most often a server certificate that is not trusted, has
    /// expired or names another host.
    #[error("TLS handshake with {url} failed")]
    Tls {
        /// The URL (redacted).
        url: String,
        /// The TLS library's verdict (e.g. `invalid peer certificate: UnknownIssuer`).
        #[source]
        source: rustls::Error,
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

/// Why the trust roots for an `https://` source could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    /// `ca_file` could not be read.
    #[error("reading CA file {path}")]
    ReadCaFile {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// `ca_file` is not a well-formed PEM file.
    #[error("CA file {path} is not valid PEM")]
    BadPem {
        /// The file.
        path: PathBuf,
        /// The parser's complaint.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// `ca_file` holds no `CERTIFICATE` block.
    #[error("CA file {path} contains no PEM certificate")]
    NoCertificates {
        /// The file.
        path: PathBuf,
    },
    /// A certificate in `ca_file` cannot serve as a trust anchor.
    #[error("CA file {path}: certificate #{index} is not a usable trust anchor")]
    BadCertificate {
        /// The file.
        path: PathBuf,
        /// Position of the certificate in the file, from 1.
        index: usize,
        /// The TLS library's complaint.
        #[source]
        source: rustls::Error,
    },
    /// The system trust store yielded no usable root certificate.
    #[error(
        "no usable root certificate in the system trust store (install ca-certificates, set SSL_CERT_FILE, or set 'ca_file')"
    )]
    NoSystemRoots {
        /// The first error met while loading the store, if any.
        #[source]
        first_error: Option<rustls_native_certs::Error>,
    },
    /// The TLS library refused the client configuration.
    #[error("building the TLS client configuration")]
    Config(#[source] rustls::Error),
    /// The blocking task that loads the roots did not finish (runtime shutting down).
    #[error("loading the trust roots was interrupted")]
    Interrupted(#[source] tokio::task::JoinError),
}

type HttpsClient = Client<HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// Fetches documents from one source. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub(crate) struct Fetcher {
    source: ProfileSource,
    client: Client<HttpConnector, Empty<Bytes>>,
    /// Built on the first `https://` fetch and kept once it succeeds: loading the trust
    /// roots is blocking I/O that should not happen on every poll, and a failure (say, a
    /// missing `ca_file`) is retried on the next poll instead of being fatal.
    tls_client: tokio::sync::OnceCell<HttpsClient>,
    ca_file: Option<PathBuf>,
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
    /// `ca_file` replaces the system trust store for `https://` sources; it is ignored for
    /// others.
    pub(crate) fn new(
        source: ProfileSource,
        ca_file: Option<PathBuf>,
        timeout: Duration,
        max_bytes: usize,
    ) -> Self {
        let client = Client::builder(TokioExecutor::new()).build(tcp_connector(timeout));
        Self {
            source,
            client,
            tls_client: tokio::sync::OnceCell::new(),
            ca_file,
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
                ProfileSource::Http(uri) if self.source.is_https() => {
                    let client = self.tls_client(uri).await?;
                    get(client, uri, self.max_bytes).await.map(Fetched::Bytes)
                }
                ProfileSource::Http(uri) => get(&self.client, uri, self.max_bytes)
                    .await
                    .map(Fetched::Bytes),
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

    async fn tls_client(&self, uri: &http::Uri) -> Result<&HttpsClient, FetchError> {
        self.tls_client
            .get_or_try_init(|| async {
                let ca_file = self.ca_file.clone();
                let config = tokio::task::spawn_blocking(move || tls_config(ca_file.as_deref()))
                    .await
                    .map_err(TlsSetupError::Interrupted)
                    .and_then(|r| r)
                    .map_err(|source| FetchError::TlsSetup {
                        url: redact(uri),
                        source,
                    })?;
                let mut tcp = tcp_connector(self.timeout);
                tcp.enforce_http(false);
                // https_only: an https source must never be fetched in clear text.
                let connector = HttpsConnectorBuilder::new()
                    .with_tls_config(config)
                    .https_only()
                    .enable_http1()
                    .wrap_connector(tcp);
                Ok(Client::builder(TokioExecutor::new()).build(connector))
            })
            .await
    }
}

fn tcp_connector(timeout: Duration) -> HttpConnector {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(timeout));
    connector
}

/// The client TLS configuration: the ring provider, rustls's safe protocol versions, and
/// either the `ca_file` bundle alone or the system trust store. Blocking (reads files).
fn tls_config(ca_file: Option<&Path>) -> Result<rustls::ClientConfig, TlsSetupError> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let pem = std::fs::read(path).map_err(|source| TlsSetupError::ReadCaFile {
                path: path.to_owned(),
                source,
            })?;
            add_pem_roots(&mut roots, path, &pem)?;
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            // Per-file errors are tolerated while some roots load: one broken entry in
            // /etc/ssl/certs must not stop every fetch.
            let (added, _unparsable) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(TlsSetupError::NoSystemRoots {
                    first_error: found.errors.into_iter().next(),
                });
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsSetupError::Config)?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// Adds every `CERTIFICATE` block of a PEM bundle; other blocks (keys, CRLs) are skipped.
fn add_pem_roots(
    roots: &mut rustls::RootCertStore,
    path: &Path,
    pem: &[u8],
) -> Result<(), TlsSetupError> {
    let mut count = 0;
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|source| TlsSetupError::BadPem {
            path: path.to_owned(),
            source,
        })?;
        count += 1;
        roots
            .add(cert)
            .map_err(|source| TlsSetupError::BadCertificate {
                path: path.to_owned(),
                index: count,
                source,
            })?;
    }
    if count == 0 {
        return Err(TlsSetupError::NoCertificates {
            path: path.to_owned(),
        });
    }
    Ok(())
}

/// One GET within the size limit; no redirects are followed (the legacy client never does).
async fn get<C>(
    client: &Client<C, Empty<Bytes>>,
    uri: &http::Uri,
    max_bytes: usize,
) -> Result<Bytes, FetchError>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    let url = redact(uri);
    let request = http::Request::get(uri.clone())
        .header(http::header::ACCEPT, "application/json")
        .header(http::header::USER_AGENT, "slrp")
        .body(Empty::<Bytes>::new())
        .map_err(|e| FetchError::Body {
            url: url.clone(),
            source: Box::new(e),
        })?;
    let response = client
        .request(request)
        .await
        .map_err(|source| match tls_error(&source) {
            Some(tls) => FetchError::Tls {
                url: url.clone(),
                source: tls,
            },
            None => FetchError::Request {
                url: url.clone(),
                source,
            },
        })?;
    if response.status() != http::StatusCode::OK {
        return Err(FetchError::Status {
            url,
            status: response.status(),
        });
    }
    match Limited::new(response.into_body(), max_bytes)
        .collect()
        .await
    {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(FetchError::BodyTooLarge {
            url,
            limit: max_bytes,
        }),
        Err(source) => Err(FetchError::Body { url, source }),
    }
}

/// Finds a TLS failure in a client error's cause chain. tokio-rustls reports it as an
/// `io::Error` wrapping the `rustls::Error`, and `io::Error::source` skips the wrapped
/// error itself, so the walk looks inside `io::Error`s.
fn tls_error(err: &(dyn std::error::Error + 'static)) -> Option<rustls::Error> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls.clone());
        }
        cur = match e
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    None
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
        let https = ProfileSource::parse_uri("https://host:8443/x").unwrap();
        assert!(https.is_https());
        assert!(
            !ProfileSource::parse_uri("http://host/x")
                .unwrap()
                .is_https()
        );
        assert!(matches!(
            ProfileSource::parse_uri("https://user:pw@host/x"),
            Err(ConfigError::CredentialsInUrl)
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

    fn self_signed_pem() -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["ca.test".to_owned()]).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.self_signed(&key).unwrap().pem()
    }

    #[test]
    fn ca_bundles_are_checked() {
        let path = Path::new("/etc/ca.pem");
        let add =
            |pem: &str| add_pem_roots(&mut rustls::RootCertStore::empty(), path, pem.as_bytes());

        let two = format!("{}{}", self_signed_pem(), self_signed_pem());
        let mut roots = rustls::RootCertStore::empty();
        add_pem_roots(&mut roots, path, two.as_bytes()).unwrap();
        assert_eq!(roots.len(), 2);

        // Other blocks are skipped, but a bundle must hold a certificate.
        let key_only = rcgen::KeyPair::generate().unwrap().serialize_pem();
        assert!(matches!(
            add(&key_only),
            Err(TlsSetupError::NoCertificates { .. })
        ));
        assert!(matches!(add(""), Err(TlsSetupError::NoCertificates { .. })));
        let bad_base64 = "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n";
        assert!(matches!(add(bad_base64), Err(TlsSetupError::BadPem { .. })));
        let not_der = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let err = add(&format!("{}{not_der}", self_signed_pem())).unwrap_err();
        assert!(
            matches!(err, TlsSetupError::BadCertificate { index: 2, .. }),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "CA file /etc/ca.pem: certificate #2 is not a usable trust anchor"
        );
    }

    #[test]
    fn tls_failures_are_found_inside_io_errors() {
        let cause = rustls::Error::InvalidCertificate(rustls::CertificateError::Expired);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, cause.clone());
        #[derive(Debug, thiserror::Error)]
        #[error("connect")]
        struct Outer(#[source] std::io::Error);
        assert_eq!(tls_error(&Outer(io)), Some(cause));
        let plain = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(tls_error(&Outer(plain)), None);
    }
}
