//! Read-only rendering of a store for `slrp inspect --state-dir DIR [--json]`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::StoreError;
use crate::record::RawRecord;
use crate::store::{FORMAT_VERSION, Store};

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One section per kind, one line per record.
    Human,
    /// One JSON document: `{"path", "format_version", "records": {kind: {key: value}},
    /// "corrupt": [{"kind", "key", "error"}]}`.
    Json,
}

/// A damaged record, as reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CorruptEntry {
    /// Kind as stored (possibly itself damaged).
    pub kind: String,
    /// Key as stored (possibly itself damaged).
    pub key: String,
    /// What is wrong.
    pub error: String,
}

/// Everything in a store, read without writing.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The database file.
    pub path: PathBuf,
    /// Format version of the file.
    pub format_version: i64,
    /// Records by kind, then key.
    pub records: BTreeMap<String, BTreeMap<String, serde_json::Value>>,
    /// Records that failed verification; they are listed, never shown as data.
    pub corrupt: Vec<CorruptEntry>,
}

impl Report {
    /// Whether every record verified. The CLI exits non-zero otherwise.
    pub fn is_clean(&self) -> bool {
        self.corrupt.is_empty()
    }

    /// Renders the report.
    pub fn render(&self, format: Format) -> String {
        match format {
            Format::Json => {
                let mut s = serde_json::to_string_pretty(self)
                    .unwrap_or_else(|e| format!("{{\"error\": \"rendering failed: {e}\"}}"));
                s.push('\n');
                s
            }
            Format::Human => self.render_human(),
        }
    }

    fn render_human(&self) -> String {
        let mut out = String::new();
        let total: usize = self.records.values().map(BTreeMap::len).sum();
        // Writing to a String cannot fail.
        let _ = writeln!(out, "state store: {}", self.path.display());
        let _ = writeln!(out, "format version: {}", self.format_version);
        let _ = writeln!(out, "records: {total}, corrupt: {}", self.corrupt.len());
        for (kind, records) in &self.records {
            let _ = writeln!(out, "\n{kind} ({})", records.len());
            for (key, value) in records {
                let _ = writeln!(out, "  {key}  {value}");
            }
        }
        if !self.corrupt.is_empty() {
            let _ = writeln!(out, "\nCORRUPT ({})", self.corrupt.len());
            for c in &self.corrupt {
                let _ = writeln!(out, "  {}/{}  {}", c.kind, c.key, c.error);
            }
        }
        out
    }
}

/// Reads the store in `dir` without writing anything. A damaged record does not stop the
/// report: it appears under `corrupt`. A damaged or foreign database file is an error.
pub fn inspect(dir: &Path) -> Result<Report, StoreError> {
    let store = Store::open_read_only(dir)?;
    let mut records: BTreeMap<String, BTreeMap<String, serde_json::Value>> = BTreeMap::new();
    let mut corrupt = Vec::new();
    for r in store.load_raw_blocking(None)? {
        match r {
            Ok(RawRecord {
                kind, key, value, ..
            }) => {
                records.entry(kind).or_default().insert(key, value);
            }
            Err(StoreError::CorruptRecord { kind, key, problem }) => {
                corrupt.push(CorruptEntry {
                    kind,
                    key,
                    error: problem.to_string(),
                });
            }
            Err(e) => return Err(e),
        }
    }
    Ok(Report {
        path: store.path().to_owned(),
        format_version: FORMAT_VERSION,
        records,
        corrupt,
    })
}

/// [`inspect`] rendered in `format`.
pub fn render(dir: &Path, format: Format) -> Result<String, StoreError> {
    Ok(inspect(dir)?.render(format))
}
