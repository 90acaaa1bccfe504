//! Logging setup shared by slrp's binaries (`slrp` and the bundled plugin `slrp-csi-local`).
//!
//! # Design
//! Both binaries log through `tracing` to standard error, in one of two [`LogFormat`]s:
//! - `text` (the default): one human-readable line per event ([`EscapedFields`]: every
//!   control character of every field value escaped, so a value from outside cannot
//!   forge a line or put NULs and escape sequences into the file), with ANSI colours only when
//!   standard error is a terminal and `NO_COLOR` is unset, so log files and journald never
//!   receive escape codes (the supervisor appends a plugin's standard error to
//!   `stderr.log`, which is how escape codes used to end up in files);
//! - `json`: one JSON object per line (`timestamp`, `level`, `target`, `fields.message`
//!   and the other fields, the current `span` and the `spans` list), for log collectors.
//!
//! The filter comes from `SLRP_LOG`, else `RUST_LOG`, else the binary's default (`info` for
//! daemons). A variable that is set but does not parse is not silently ignored: the default
//! is used and [`init`] returns a [`FilterWarning`] that the caller logs once the subscriber
//! is installed.
//!
//! Child processes: [`installed_format`] tells the plugin supervisor which format to pass
//! to the plugins it launches (as `SLRP_LOG_FORMAT`, unless the plugin's own command sets
//! it), so one flag makes a whole service log alike.
//!
//! # Limitations
//! The format is chosen once per process; there is no reload.

mod escape;

pub use escape::{EscapedFields, escape_control};

use std::io::IsTerminal;
use std::sync::{Arc, Mutex, OnceLock};

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

/// The variables the filter is read from, in order of preference.
pub const FILTER_VARS: [&str; 2] = ["SLRP_LOG", "RUST_LOG"];

/// The environment variable that selects the format when no flag does.
pub const FORMAT_VAR: &str = "SLRP_LOG_FORMAT";

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    /// The name `--log-format` and [`FORMAT_VAR`] take.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::Json => "json",
        }
    }
}

/// The format [`init`] installed for this process, if it did.
///
/// Logging is process-wide by nature (one global subscriber); this records the one fact
/// about it that child processes need: the plugin supervisor passes it to the plugins it
/// launches as [`FORMAT_VAR`], so that `slrp --log-format json` makes the bundled plugin's
/// log JSON too, as `SLRP_LOG_FORMAT=json` in slrp's environment already did.
static INSTALLED: OnceLock<LogFormat> = OnceLock::new();

/// The format of this process's logs when [`init`] installed them (`None` otherwise,
/// e.g. in tests and in programs that set up their own subscriber).
pub fn installed_format() -> Option<LogFormat> {
    INSTALLED.get().copied()
}

/// A filter variable that is set but could not be used; the default filter was used instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterWarning {
    /// The variable (`SLRP_LOG` or `RUST_LOG`).
    pub var: &'static str,
    /// Its value.
    pub value: String,
    /// Why it does not parse.
    pub reason: String,
}

impl FilterWarning {
    /// Logs the warning through the installed subscriber.
    pub fn log(&self) {
        tracing::warn!(
            var = self.var,
            value = %self.value,
            reason = %self.reason,
            "ignoring a log filter that does not parse; using the default"
        );
    }
}

/// The filter from the first of [`FILTER_VARS`] that `lookup` finds set and non-empty, or
/// `default` (plus a warning when that variable does not parse).
///
/// `lookup` is the environment in the binaries (`std::env::var`); tests pass a map.
pub fn filter_from(
    lookup: impl Fn(&str) -> Option<String>,
    default: &str,
) -> (EnvFilter, Option<FilterWarning>) {
    let Some((var, value)) = FILTER_VARS.iter().find_map(|&var| {
        lookup(var)
            .filter(|v| !v.trim().is_empty())
            .map(|v| (var, v))
    }) else {
        return (EnvFilter::new(default), None);
    };
    match EnvFilter::try_new(&value) {
        Ok(filter) => (filter, None),
        Err(e) => (
            EnvFilter::new(default),
            Some(FilterWarning {
                var,
                value,
                reason: e.to_string(),
            }),
        ),
    }
}

/// Whether text logs may carry ANSI colours: standard error is a terminal and `NO_COLOR`
/// (<https://no-color.org>) is unset or empty.
pub fn stderr_wants_colour() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// The subscriber for `format`, writing to `writer` with `filter`; colours only when `ansi`
/// (and never in JSON).
pub fn subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    ansi: bool,
    writer: W,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Text => Box::new(builder.with_ansi(ansi).fmt_fields(EscapedFields).finish()),
        LogFormat::Json => Box::new(builder.with_ansi(false).json().finish()),
    }
}

/// Installs the process-wide subscriber: `format` on standard error, the filter from the
/// environment (see [`filter_from`]) or `default`. Call once, first thing in `main`; a
/// second call leaves the first subscriber in place.
///
/// Returns the warning for a filter variable that did not parse, already logged.
pub fn init(format: LogFormat, default: &str) -> Option<FilterWarning> {
    let (filter, warning) = filter_from(|var| std::env::var(var).ok(), default);
    let installed = tracing::subscriber::set_global_default(subscriber(
        format,
        filter,
        stderr_wants_colour(),
        std::io::stderr,
    ))
    .is_ok();
    if installed {
        let _ = INSTALLED.set(format);
        if let Some(w) = &warning {
            w.log();
        }
    }
    warning
}

/// A writer that keeps every log line in memory, for tests that check what was logged
/// (pass it to [`subscriber`] or to a `tracing_subscriber::fmt()` builder).
#[derive(Debug, Clone, Default)]
pub struct MemoryWriter(Arc<Mutex<Vec<u8>>>);

impl MemoryWriter {
    /// Everything written so far (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.lock()).into_owned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        // A test that panicked while logging leaves whole lines behind: keep them.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl std::io::Write for MemoryWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.lock().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'w> MakeWriter<'w> for MemoryWriter {
    type Writer = Self;

    fn make_writer(&'w self) -> Self {
        self.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn capture(format: LogFormat, filter: &str, ansi: bool) -> String {
        let buf = MemoryWriter::default();
        let sub = subscriber(format, EnvFilter::new(filter), ansi, buf.clone());
        tracing::subscriber::with_default(sub, || {
            let span = tracing::info_span!("operation", operation_uuid = "u-1");
            let _g = span.enter();
            tracing::info!(volume_id = "v-1", "volume created");
            tracing::debug!("filtered out at info");
        });
        buf.text()
    }

    #[test]
    fn json_is_one_object_per_line_with_level_message_target_and_span() {
        let out = capture(LogFormat::Json, "info", true);
        let lines: Vec<_> = out.lines().collect();
        assert_eq!(lines.len(), 1, "{out}");
        let v: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["fields"]["message"], "volume created");
        assert_eq!(v["fields"]["volume_id"], "v-1");
        assert_eq!(v["target"], module_path!());
        assert_eq!(v["span"]["operation_uuid"], "u-1");
        assert!(!out.contains('\x1b'), "{out}");
    }

    #[test]
    fn text_has_escape_codes_only_when_asked() {
        let plain = capture(LogFormat::Text, "info", false);
        assert!(plain.contains("volume created"), "{plain}");
        assert!(plain.contains("operation_uuid"), "{plain}");
        assert!(!plain.contains('\x1b'), "{plain}");
        let coloured = capture(LogFormat::Text, "info", true);
        assert!(coloured.contains("\x1b["), "{coloured}");
    }

    #[test]
    fn text_escapes_control_characters_of_every_field_one_event_one_line() {
        let buf = MemoryWriter::default();
        let sub = subscriber(LogFormat::Text, EnvFilter::new("info"), false, buf.clone());
        let forged = "v1\n2024-01-01T00:00:00Z ERROR slrp: forged line\0\x1b[2J";
        tracing::subscriber::with_default(sub, || {
            let span = tracing::info_span!("provider", name = %forged);
            let _g = span.enter();
            tracing::info!(volume_id = %forged, context = ?forged, "created {forged}");
            let err = std::io::Error::other(forged);
            tracing::warn!(error = &err as &(dyn std::error::Error + 'static), "failed");
        });
        let out = buf.text();
        assert_eq!(out.lines().count(), 2, "{out}");
        assert!(!out.contains('\0') && !out.contains('\x1b'), "{out:?}");
        let first = out.lines().next().unwrap();
        for part in [
            "created v1\\n2024-01-01T00:00:00Z ERROR slrp: forged line\\0\\u{1b}[2J",
            "volume_id=v1\\n2024",
            // Debug values were escaped by Debug already; nothing is escaped twice.
            "context=\"v1\\n2024",
            "provider{name=v1\\n2024",
        ] {
            assert!(first.contains(part), "{part} in {first}");
        }
    }

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn filter_prefers_slrp_log_then_rust_log_then_the_default() {
        let (f, w) = filter_from(env(&[("SLRP_LOG", "debug"), ("RUST_LOG", "error")]), "info");
        assert_eq!((f.to_string(), w), ("debug".to_owned(), None));
        let (f, w) = filter_from(env(&[("SLRP_LOG", " "), ("RUST_LOG", "error")]), "info");
        assert_eq!((f.to_string(), w), ("error".to_owned(), None));
        let (f, w) = filter_from(env(&[]), "warn");
        assert_eq!((f.to_string(), w), ("warn".to_owned(), None));
    }

    #[test]
    fn a_filter_that_does_not_parse_falls_back_with_a_warning() {
        let (f, w) = filter_from(env(&[("SLRP_LOG", "slrp=loud")]), "info");
        assert_eq!(f.to_string(), "info");
        let w = w.expect("a warning");
        assert_eq!((w.var, w.value.as_str()), ("SLRP_LOG", "slrp=loud"));
        assert!(!w.reason.is_empty());
    }
}
