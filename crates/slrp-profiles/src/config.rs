//! Configuration: the raw form read from slrp's config file, and the validated form.

use std::{path::PathBuf, time::Duration};

use serde::Deserialize;

use crate::{
    document::{DocumentError, ProfileMapping},
    source::ProfileSource,
};

/// Default per-fetch timeout.
pub const DEFAULT_FETCH_TIMEOUT: Duration = Duration::from_secs(30);
/// Default bound on a document's size (and the state file's).
pub const DEFAULT_MAX_DOCUMENT_BYTES: usize = 4 << 20;

/// The `[profiles]` section of slrp's configuration, as written. No I/O, no validation.
///
/// Durations accept humantime forms (`10s`, `1m 30s`) and Mesos forms (`10secs`,
/// `1.5mins`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfilesConfigFile {
    /// Absolute path, `file://`, `http://` or `https://` URI of the profile document.
    pub uri: Option<String>,
    /// PEM bundle of the CA certificates that an `https://` source must chain to; replaces
    /// the system trust store. Absolute path.
    pub ca_file: Option<PathBuf>,
    /// An inline profile document (same format), as a table or as a JSON string.
    pub inline: Option<serde_json::Value>,
    /// How long after a fetch completes the next one starts; absent = fetch once.
    pub poll_interval: Option<String>,
    /// Upper bound of the random delay before watchers learn about a change.
    pub max_random_wait: Option<String>,
    /// Per-fetch timeout.
    pub fetch_timeout: Option<String>,
    /// Largest accepted document, in bytes.
    pub max_document_bytes: Option<u64>,
    /// Where the last good profile table is persisted.
    pub state_file: Option<PathBuf>,
}

/// Validated adaptor configuration.
#[derive(Debug, Clone)]
pub struct ProfilesConfig {
    /// Where documents come from.
    pub source: ProfileSource,
    /// Delay between the end of one fetch and the start of the next; `None` = fetch once,
    /// as in Mesos.
    pub poll_interval: Option<Duration>,
    /// Each change notification waits a uniform random time in `[0, max_random_wait]`, so
    /// that many providers do not reconcile at the same instant.
    pub max_random_wait: Duration,
    /// Bound on one fetch (connect, response and body).
    pub fetch_timeout: Duration,
    /// Bound on a document's size.
    pub max_document_bytes: usize,
    /// Persisted last good table; `None` = not persisted.
    pub state_file: Option<PathBuf>,
    /// For an `https://` source: the PEM bundle of trusted CA certificates, used *instead
    /// of* the system trust store; `None` = the system store. Ignored for other sources.
    pub ca_file: Option<PathBuf>,
}

impl ProfilesConfig {
    /// A configuration with defaults: fetch once, no random wait, not persisted.
    #[must_use]
    pub fn new(source: ProfileSource) -> Self {
        Self {
            source,
            poll_interval: None,
            max_random_wait: Duration::ZERO,
            fetch_timeout: DEFAULT_FETCH_TIMEOUT,
            max_document_bytes: DEFAULT_MAX_DOCUMENT_BYTES,
            state_file: None,
            ca_file: None,
        }
    }

    /// Sets the poll interval.
    #[must_use]
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = Some(interval);
        self
    }

    /// Sets the maximum random wait before notifying watchers.
    #[must_use]
    pub fn max_random_wait(mut self, wait: Duration) -> Self {
        self.max_random_wait = wait;
        self
    }

    /// Sets the per-fetch timeout.
    #[must_use]
    pub fn fetch_timeout(mut self, timeout: Duration) -> Self {
        self.fetch_timeout = timeout;
        self
    }

    /// Sets the document size bound.
    #[must_use]
    pub fn max_document_bytes(mut self, bytes: usize) -> Self {
        self.max_document_bytes = bytes;
        self
    }

    /// Sets the state file.
    #[must_use]
    pub fn state_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.state_file = Some(path.into());
        self
    }

    /// Trusts only the CA certificates in this PEM bundle for an `https://` source.
    #[must_use]
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }
}

/// A configuration problem, found before anything starts.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Neither `uri` nor `inline` is set.
    #[error("profiles: one of 'uri' or 'inline' is required")]
    NoSource,
    /// Both `uri` and `inline` are set.
    #[error("profiles: 'uri' and 'inline' are mutually exclusive")]
    TwoSources,
    /// `uri` is empty.
    #[error("profiles: 'uri' is empty")]
    EmptyUri,
    /// A scheme other than file, http and https.
    #[error("profiles: 'uri' must use a supported scheme (file, http or https), not '{scheme}'")]
    UnsupportedScheme {
        /// The scheme found.
        scheme: String,
    },
    /// `ca_file` with a source that is not `https://`.
    #[error("profiles: 'ca_file' is only meaningful with an https:// 'uri'")]
    CaFileWithoutHttps,
    /// `ca_file` is a relative path.
    #[error("profiles: 'ca_file' must be an absolute path, got {path}")]
    CaFileRelative {
        /// The path given.
        path: PathBuf,
    },
    /// A relative file path.
    #[error("profiles: 'uri' to a file must be an absolute path, got {path}")]
    RelativePath {
        /// The path given.
        path: PathBuf,
    },
    /// An unparsable http URL.
    #[error("profiles: 'uri' {url} is not a valid URL")]
    BadUrl {
        /// The URL, redacted.
        url: String,
        /// The parser's complaint.
        #[source]
        source: http::uri::InvalidUri,
    },
    /// An http URL without a host.
    #[error("profiles: 'uri' {url} has no host")]
    NoHost {
        /// The URL, redacted.
        url: String,
    },
    /// `user:password@` in the URL.
    #[error("profiles: credentials in 'uri' are not supported")]
    CredentialsInUrl,
    /// The inline document is invalid.
    #[error("profiles: 'inline' is not a valid profile document")]
    InlineInvalid(#[source] DocumentError),
    /// `poll_interval` with an inline document, which never changes.
    #[error("profiles: 'poll_interval' has no meaning for an 'inline' profile set")]
    PollInline,
    /// A duration that does not parse.
    #[error("profiles: '{field}' = {value:?} is not a duration (e.g. 10secs, 1m 30s)")]
    BadDuration {
        /// The setting.
        field: &'static str,
        /// The value given.
        value: String,
    },
    /// A duration that must be positive is zero.
    #[error("profiles: '{field}' must be greater than zero")]
    NotPositive {
        /// The setting.
        field: &'static str,
    },
    /// `max_document_bytes` is zero or does not fit in memory addressing.
    #[error("profiles: 'max_document_bytes' must be between 1 and {max}", max = usize::MAX)]
    BadDocumentLimit,
}

impl TryFrom<ProfilesConfigFile> for ProfilesConfig {
    type Error = ConfigError;

    fn try_from(raw: ProfilesConfigFile) -> Result<Self, ConfigError> {
        let source = match (raw.uri, raw.inline) {
            (None, None) => return Err(ConfigError::NoSource),
            (Some(_), Some(_)) => return Err(ConfigError::TwoSources),
            (Some(uri), None) => ProfileSource::parse_uri(&uri)?,
            (None, Some(inline)) => {
                let value = match inline {
                    serde_json::Value::String(text) => {
                        serde_json::from_str(&text).map_err(|e| {
                            ConfigError::InlineInvalid(DocumentError::json_at(
                                &e,
                                e.line(),
                                e.column(),
                            ))
                        })?
                    }
                    other => other,
                };
                // Validate now so a bad inline set is a startup error, not a runtime one.
                ProfileMapping::from_value(value.clone()).map_err(ConfigError::InlineInvalid)?;
                ProfileSource::Inline(value)
            }
        };
        let mut cfg = Self::new(source);
        if let Some(v) = raw.poll_interval {
            if matches!(cfg.source, ProfileSource::Inline(_)) {
                return Err(ConfigError::PollInline);
            }
            let d = parse_duration("poll_interval", &v)?;
            if d.is_zero() {
                return Err(ConfigError::NotPositive {
                    field: "poll_interval",
                });
            }
            cfg.poll_interval = Some(d);
        }
        if let Some(v) = raw.max_random_wait {
            cfg.max_random_wait = parse_duration("max_random_wait", &v)?;
        }
        if let Some(v) = raw.fetch_timeout {
            let d = parse_duration("fetch_timeout", &v)?;
            if d.is_zero() {
                return Err(ConfigError::NotPositive {
                    field: "fetch_timeout",
                });
            }
            cfg.fetch_timeout = d;
        }
        if let Some(n) = raw.max_document_bytes {
            cfg.max_document_bytes = usize::try_from(n)
                .ok()
                .filter(|n| *n > 0)
                .ok_or(ConfigError::BadDocumentLimit)?;
        }
        cfg.state_file = raw.state_file;
        if let Some(path) = raw.ca_file {
            // Caught here rather than ignored: a ca_file next to an http:// uri means the
            // operator believes the fetch is authenticated when it is not.
            if !cfg.source.is_https() {
                return Err(ConfigError::CaFileWithoutHttps);
            }
            if !path.is_absolute() {
                return Err(ConfigError::CaFileRelative { path });
            }
            cfg.ca_file = Some(path);
        }
        Ok(cfg)
    }
}

/// Parses a duration in humantime form or in Mesos's `<number><unit>` form, where the
/// number may be fractional (`1.5secs`). Negative values are rejected by both.
///
/// # Errors
/// [`ConfigError::BadDuration`] naming the setting.
pub fn parse_duration(field: &'static str, value: &str) -> Result<Duration, ConfigError> {
    let bad = || ConfigError::BadDuration {
        field,
        value: value.to_owned(),
    };
    let trimmed = value.trim();
    if let Ok(d) = humantime::parse_duration(trimmed) {
        return Ok(d);
    }
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(bad)?;
    let (number, unit) = trimmed.split_at(split);
    let number: f64 = number.parse().map_err(|_| bad())?;
    let unit_secs = match unit.trim() {
        "ns" => 1e-9,
        "us" => 1e-6,
        "ms" => 1e-3,
        "secs" => 1.0,
        "mins" => 60.0,
        "hrs" => 3600.0,
        "days" => 86_400.0,
        "weeks" => 604_800.0,
        _ => return Err(bad()),
    };
    Duration::try_from_secs_f64(number * unit_secs).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn raw(toml_text: &str) -> ProfilesConfigFile {
        toml::from_str(toml_text).unwrap()
    }

    #[test]
    fn durations_accept_mesos_and_humantime_forms() {
        let p = |s| parse_duration("x", s).unwrap();
        assert_eq!(p("10secs"), Duration::from_secs(10));
        assert_eq!(p("1.5mins"), Duration::from_secs(90));
        assert_eq!(p("2hrs"), Duration::from_secs(7200));
        assert_eq!(p("250ms"), Duration::from_millis(250));
        assert_eq!(p("1m 30s"), Duration::from_secs(90));
        assert_eq!(p("0secs"), Duration::ZERO);
        for bad in ["", "-1secs", "10", "ten secs", "5 parsecs"] {
            assert!(
                matches!(
                    parse_duration("x", bad),
                    Err(ConfigError::BadDuration { .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn full_config_from_toml() {
        let cfg = ProfilesConfig::try_from(raw(r#"
            uri = "http://127.0.0.1:9/profiles"
            poll_interval = "10secs"
            max_random_wait = "5s"
            fetch_timeout = "3s"
            max_document_bytes = 1024
            state_file = "/var/lib/slrp/profiles.state"
            "#))
        .unwrap();
        assert_eq!(cfg.poll_interval, Some(Duration::from_secs(10)));
        assert_eq!(cfg.max_random_wait, Duration::from_secs(5));
        assert_eq!(cfg.fetch_timeout, Duration::from_secs(3));
        assert_eq!(cfg.max_document_bytes, 1024);
        assert!(cfg.state_file.is_some());
        assert!(cfg.ca_file.is_none());

        let cfg = ProfilesConfig::try_from(raw(r#"
            uri = "https://profiles.example/p.json"
            ca_file = "/etc/slrp/profiles-ca.pem"
            "#))
        .unwrap();
        assert!(cfg.source.is_https());
        assert_eq!(
            cfg.ca_file.as_deref(),
            Some(Path::new("/etc/slrp/profiles-ca.pem"))
        );
    }

    /// slrp's own configuration stays strict: the protobuf dialect accepted in fetched
    /// profile documents (for Mesos compatibility) is refused in inline JSON text.
    #[test]
    fn inline_json_text_is_strict() {
        for text in [
            r#"{"profile_matrix": {},}"#,
            "{'profile_matrix': {}}",
            "{profile_matrix: {}}",
        ] {
            let toml_text = format!("inline = '''{text}'''");
            let e = ProfilesConfig::try_from(raw(&toml_text)).unwrap_err();
            assert!(
                matches!(
                    e,
                    ConfigError::InlineInvalid(DocumentError::Json { line: 1, .. })
                ),
                "{text}: {e:?}"
            );
            // The same text is a valid profile document when fetched.
            assert!(ProfileMapping::parse(text.as_bytes()).is_ok(), "{text}");
        }
    }

    #[test]
    fn inline_profiles_as_toml_tables_or_json_text() {
        let cfg = ProfilesConfig::try_from(raw(
            r#"
            [inline.profile_matrix.fast]
            csi_plugin_type_selector = { plugin_type = "local" }
            volume_capabilities = { mount = { fs_type = "ext4" }, access_mode = { mode = "SINGLE_NODE_WRITER" } }
            "#,
        ))
        .unwrap();
        assert!(matches!(cfg.source, ProfileSource::Inline(_)));
        let cfg = ProfilesConfig::try_from(raw(r#"inline = '{"profile_matrix": {}}'"#)).unwrap();
        assert!(matches!(cfg.source, ProfileSource::Inline(_)));
    }

    #[test]
    fn invalid_configs_are_rejected_with_the_setting_named() {
        let err = |t: &str| ProfilesConfig::try_from(raw(t)).unwrap_err();
        assert!(matches!(err(""), ConfigError::NoSource));
        assert!(matches!(
            err("uri = \"/x\"\ninline = {}"),
            ConfigError::TwoSources
        ));
        assert!(matches!(
            err("uri = \"/x\"\npoll_interval = \"0secs\""),
            ConfigError::NotPositive {
                field: "poll_interval"
            }
        ));
        assert!(matches!(
            err("uri = \"/x\"\nmax_random_wait = \"soon\""),
            ConfigError::BadDuration {
                field: "max_random_wait",
                ..
            }
        ));
        assert!(matches!(
            err("inline = {}\npoll_interval = \"1s\""),
            ConfigError::PollInline
        ));
        assert!(matches!(
            err("inline = { profile_matrix = { p = {} } }"),
            ConfigError::InlineInvalid(DocumentError::NoSelector { .. })
        ));
        assert!(matches!(
            err("uri = \"/x\"\nmax_document_bytes = 0"),
            ConfigError::BadDocumentLimit
        ));
        assert!(matches!(
            err("uri = \"http://host/p\"\nca_file = \"/etc/ca.pem\""),
            ConfigError::CaFileWithoutHttps
        ));
        assert!(matches!(
            err("uri = \"https://host/p\"\nca_file = \"ca.pem\""),
            ConfigError::CaFileRelative { .. }
        ));
        assert!(toml::from_str::<ProfilesConfigFile>("url = \"/x\"").is_err());
    }
}
