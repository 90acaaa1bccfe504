//! Record kinds, the [`Record`] trait and the envelope every record is stored in.

use std::fmt;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::crc32c::record_checksum;

use crate::error::{Corruption, StoreError};

/// Longest key accepted, in bytes. Keys are ids (volume ids are ≤ 128 bytes in CSI, UUIDs
/// 36), so this only stops accidents.
pub const MAX_KEY_LEN: usize = 1024;

/// The character that bounds prefix scans; keys may not contain it (it is a Unicode
/// noncharacter, so no id has it).
pub(crate) const PREFIX_END: char = '\u{10FFFF}';

/// The kind of a record: one table-like namespace of keys (`volume`, `operation`, ...).
///
/// Kinds are compile-time constants of the code that owns the record type, so a kind is a
/// `&'static str`; [`Kind::new`] checks the spelling when the constant is evaluated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Kind(&'static str);

impl Kind {
    /// Volumes tracked by the volume manager (key: plugin volume id).
    pub const VOLUME: Kind = Kind::new("volume");
    /// Operations tracked by the provider, each with its status update stream inside
    /// (key: `<agent id>/<operation uuid>`).
    pub const OPERATION: Kind = Kind::new("operation");
    /// The provider's identity and the profiles of its storage pools (key: agent id).
    pub const PROVIDER: Kind = Kind::new("provider");

    /// A kind named `name`: lowercase ASCII letters, digits and `_`, 1 to 64 bytes.
    ///
    /// # Panics
    /// On a malformed name. Use it for constants, where the panic happens at compile time.
    pub const fn new(name: &'static str) -> Self {
        let b = name.as_bytes();
        assert!(
            !b.is_empty() && b.len() <= 64,
            "record kind must be 1 to 64 bytes"
        );
        let mut i = 0;
        while i < b.len() {
            let c = b[i];
            assert!(
                c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_',
                "record kind may contain only a-z, 0-9 and _"
            );
            i += 1;
        }
        Self(name)
    }

    /// The kind's name as stored.
    pub const fn as_str(self) -> &'static str {
        self.0
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// A value the store can hold: serialised as JSON inside the envelope.
///
/// `SCHEMA_VERSION` is the version of the type's JSON shape. It is stored with every
/// record; reading a record written by a newer schema fails with
/// [`StoreError::RecordSchema`] instead of misreading it. A type whose shape changes
/// bumps the version and teaches [`Record::upgrade`] to read the old shapes.
pub trait Record: Serialize + DeserializeOwned + Send + 'static {
    /// The namespace of this record type.
    const KIND: Kind;
    /// Version of this type's JSON shape.
    const SCHEMA_VERSION: u32 = 1;

    /// The record's key within its kind.
    fn key(&self) -> String;

    /// Converts a record stored with an older `schema` into the current shape. The
    /// default accepts only the current version, which is right until a type changes shape.
    fn upgrade(schema: u32, value: serde_json::Value) -> Result<serde_json::Value, String> {
        if schema == Self::SCHEMA_VERSION {
            Ok(value)
        } else {
            Err(format!("no upgrade from schema version {schema}"))
        }
    }
}

/// Checks a key before it reaches the database.
pub(crate) fn check_key(kind: Kind, key: &str) -> Result<(), StoreError> {
    let reason = if key.is_empty() {
        Some("key is empty")
    } else if key.len() > MAX_KEY_LEN {
        Some("key is longer than 1024 bytes")
    } else if key.contains('\0') {
        Some("key contains NUL")
    } else if key.contains(PREFIX_END) {
        Some("key contains U+10FFFF")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(StoreError::InvalidKey {
            kind: kind.as_str(),
            key: key.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

/// One record exactly as stored, after its checksum was verified. Used by
/// [`crate::inspect`] and by callers that read kinds they have no type for.
#[derive(Debug, Clone, PartialEq)]
pub struct RawRecord {
    /// Kind name.
    pub kind: String,
    /// Key.
    pub key: String,
    /// Schema version of the value's shape.
    pub schema: u32,
    /// The value.
    pub value: serde_json::Value,
}

/// A row as read from the database, not yet verified: raw bytes, since a damaged row may
/// not even be UTF-8.
pub(crate) struct StoredRow {
    pub(crate) kind: Vec<u8>,
    pub(crate) key: Vec<u8>,
    /// `None`: the stored value is not a `u32` (damaged).
    pub(crate) schema: Option<u32>,
    pub(crate) value: Vec<u8>,
    /// `None`: the stored value is not a `u32` (damaged).
    pub(crate) crc: Option<u32>,
}

impl StoredRow {
    fn corrupt(&self, problem: Corruption) -> StoreError {
        StoreError::CorruptRecord {
            kind: String::from_utf8_lossy(&self.kind).into_owned(),
            key: String::from_utf8_lossy(&self.key).into_owned(),
            problem,
        }
    }

    /// Verifies the checksum; the only way a row becomes usable.
    pub(crate) fn verify(self) -> Result<VerifiedRow, StoreError> {
        let (Some(schema), Some(crc)) = (self.schema, self.crc) else {
            let column = if self.schema.is_none() {
                "schema"
            } else {
                "crc"
            };
            return Err(self.corrupt(Corruption::Column { column }));
        };
        let computed = record_checksum(&self.kind, &self.key, schema, &self.value);
        if computed != crc {
            return Err(self.corrupt(Corruption::Checksum {
                stored: crc,
                computed,
            }));
        }
        // The writer only stores UTF-8, and the checksum matched, so these conversions fail
        // only if the checksum collided; treat that as corruption too.
        let text = |b: Vec<u8>| String::from_utf8(b).map_err(|e| e.into_bytes());
        let (kind, key, value) = match (text(self.kind), text(self.key), text(self.value)) {
            (Ok(kind), Ok(key), Ok(value)) => (kind, key, value),
            (kind, key, _) => {
                let lossy = |r: Result<String, Vec<u8>>| match r {
                    Ok(s) => s,
                    Err(b) => String::from_utf8_lossy(&b).into_owned(),
                };
                return Err(StoreError::CorruptRecord {
                    kind: lossy(kind),
                    key: lossy(key),
                    problem: Corruption::NotUtf8,
                });
            }
        };
        Ok(VerifiedRow {
            kind,
            key,
            schema,
            value,
        })
    }
}

/// A row whose checksum matched.
pub(crate) struct VerifiedRow {
    pub(crate) kind: String,
    pub(crate) key: String,
    schema: u32,
    value: String,
}

impl VerifiedRow {
    fn not_json(&self) -> StoreError {
        StoreError::CorruptRecord {
            kind: self.kind.clone(),
            key: self.key.clone(),
            problem: Corruption::NotJson,
        }
    }

    pub(crate) fn into_raw(self) -> Result<RawRecord, StoreError> {
        let value = serde_json::from_str(&self.value).map_err(|_| self.not_json())?;
        Ok(RawRecord {
            kind: self.kind,
            key: self.key,
            schema: self.schema,
            value,
        })
    }

    pub(crate) fn decode<R: Record>(self) -> Result<R, StoreError> {
        let schema_error = |r: &Self, reason: String| StoreError::RecordSchema {
            kind: r.kind.clone(),
            key: r.key.clone(),
            found: r.schema,
            supported: R::SCHEMA_VERSION,
            reason,
        };
        if self.schema > R::SCHEMA_VERSION {
            return Err(schema_error(&self, "written by a newer schema".to_owned()));
        }
        let decoded = if self.schema == R::SCHEMA_VERSION {
            serde_json::from_str(&self.value)
        } else {
            let value: serde_json::Value =
                serde_json::from_str(&self.value).map_err(|_| self.not_json())?;
            let upgraded =
                R::upgrade(self.schema, value).map_err(|reason| schema_error(&self, reason))?;
            serde_json::from_value(upgraded)
        };
        decoded.map_err(|source| StoreError::Decode {
            kind: self.kind,
            key: self.key,
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked() {
        assert!(check_key(Kind::VOLUME, "vol-1").is_ok());
        assert!(check_key(Kind::VOLUME, "/abs/path id with spaces").is_ok());
        for bad in ["", "a\0b", "x\u{10FFFF}"] {
            assert!(
                matches!(
                    check_key(Kind::VOLUME, bad),
                    Err(StoreError::InvalidKey { .. })
                ),
                "{bad:?}"
            );
        }
        assert!(check_key(Kind::VOLUME, &"k".repeat(MAX_KEY_LEN + 1)).is_err());
    }
}
