//! The persisted profile table: the last good state survives restarts, so a restart does not
//! depend on the profile source being reachable (a TODO in Mesos).
//!
//! # Format
//! ```text
//! slrp-profiles-state 1 crc32=<8 hex digits>\n
//! {"profiles":{"<name>":{"active":true,"manifest":{<CSIManifest in the document format>}}}}
//! ```
//! The header carries a magic word, the format version and a CRC-32 (IEEE) of the JSON body.
//! Manifests are stored in the same format as the profile document and are re-validated by
//! the same code on load, so a state file can never smuggle in something a document could
//! not.
//!
//! # Crash safety
//! Written by [`slrp_types::write_atomic`]: `<file>.tmp` (a stale one from a crash is
//! removed first; we are the only writer) → fsync → rename over `<file>` → fsync of the
//! directory, so a crash leaves either the old or the new file, never a torn one.

use std::{
    collections::BTreeMap,
    fs,
    io::{self, Read},
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use crate::{
    document::{DocumentError, WireManifest, validate_manifest},
    table::{ProfileTable, TableEntry},
};

const MAGIC: &str = "slrp-profiles-state";
const VERSION: u32 = 1;

/// Floor of [`state_limit`]. The state file holds every profile ever seen (inactive ones
/// too), each in a longer form than the document that brought it, so `max_document_bytes`
/// alone cannot bound it; this bound only guards memory against a file that is not ours.
const MIN_STATE_LIMIT: usize = 64 << 20;

/// The largest state file read or written, for a given document limit. [`save`] refuses to
/// write more than [`load`] accepts, so every state file written can be read back.
pub(crate) fn state_limit(max_document_bytes: usize) -> usize {
    max_document_bytes.saturating_mul(16).max(MIN_STATE_LIMIT)
}

/// Why the state file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// An I/O error on the state file or its directory.
    #[error("{op} of profile state file {path}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The file is larger than the configured document limit.
    #[error("profile state file {path} is larger than {limit} bytes")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The limit.
        limit: usize,
    },
    /// The header is missing or not ours.
    #[error("profile state file {path} has no valid header")]
    BadHeader {
        /// The file.
        path: PathBuf,
    },
    /// Written by a newer (or unknown) format version.
    #[error("profile state file {path} has unsupported format version {version}")]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// The version found.
        version: String,
    },
    /// The body does not match its checksum.
    #[error("profile state file {path} is corrupt: checksum mismatch")]
    Checksum {
        /// The file.
        path: PathBuf,
    },
    /// The body is not the expected JSON.
    #[error("profile state file {path} has a malformed body")]
    Body {
        /// The file.
        path: PathBuf,
        /// The decoder's complaint.
        #[source]
        source: serde_json::Error,
    },
    /// A stored manifest fails validation.
    #[error("profile state file {path} holds an invalid profile")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The validation error.
        #[source]
        source: DocumentError,
    },
}

#[derive(Serialize, Deserialize)]
struct Body {
    profiles: BTreeMap<String, StoredEntry>,
}

#[derive(Serialize, Deserialize)]
struct StoredEntry {
    active: bool,
    manifest: WireManifest,
}

/// Encodes the table in the state file format.
pub(crate) fn encode(table: &ProfileTable) -> Vec<u8> {
    let body = Body {
        profiles: table
            .entries()
            .iter()
            .map(|(name, e)| {
                (
                    name.clone(),
                    StoredEntry {
                        active: e.active,
                        manifest: e.manifest.to_wire(),
                    },
                )
            })
            .collect(),
    };
    let json = serde_json::to_vec(&body)
        .expect("plain structs of strings, maps and options always serialize to memory");
    let mut out = format!("{MAGIC} {VERSION} crc32={:08x}\n", crc32(&json)).into_bytes();
    out.extend_from_slice(&json);
    out
}

/// Decodes a state file's bytes.
pub(crate) fn decode(path: &Path, bytes: &[u8]) -> Result<ProfileTable, PersistError> {
    let bad_header = || PersistError::BadHeader {
        path: path.to_owned(),
    };
    let newline = bytes
        .iter()
        .position(|b| *b == b'\n')
        .ok_or_else(bad_header)?;
    let header = std::str::from_utf8(&bytes[..newline]).map_err(|_| bad_header())?;
    let body = &bytes[newline + 1..];
    let mut words = header.split(' ');
    if words.next() != Some(MAGIC) {
        return Err(bad_header());
    }
    let version = words.next().ok_or_else(bad_header)?;
    if version != VERSION.to_string() {
        return Err(PersistError::UnsupportedVersion {
            path: path.to_owned(),
            version: version.to_owned(),
        });
    }
    let crc = words
        .next()
        .and_then(|w| w.strip_prefix("crc32="))
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .ok_or_else(bad_header)?;
    if crc32(body) != crc {
        return Err(PersistError::Checksum {
            path: path.to_owned(),
        });
    }
    let parsed: Body = serde_json::from_slice(body).map_err(|source| PersistError::Body {
        path: path.to_owned(),
        source,
    })?;
    let mut entries = BTreeMap::new();
    for (name, stored) in parsed.profiles {
        let manifest =
            validate_manifest(&name, stored.manifest).map_err(|source| PersistError::Invalid {
                path: path.to_owned(),
                source,
            })?;
        entries.insert(
            name,
            TableEntry {
                manifest,
                active: stored.active,
            },
        );
    }
    Ok(ProfileTable::from_entries(entries))
}

/// Loads the table; `Ok(None)` when there is no state file yet. Blocking.
pub(crate) fn load(path: &Path, limit: usize) -> Result<Option<ProfileTable>, PersistError> {
    let io_err = |op, source| PersistError::Io {
        op,
        path: path.to_owned(),
        source,
    };
    let file = match fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err("opening", e)),
    };
    let mut bytes = Vec::new();
    file.take(u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| io_err("reading", e))?;
    if bytes.len() > limit {
        return Err(PersistError::TooLarge {
            path: path.to_owned(),
            limit,
        });
    }
    decode(path, &bytes).map(Some)
}

/// Replaces the state file crash-atomically, unless it would exceed `limit` (then the old
/// file stays). Blocking.
pub(crate) fn save(path: &Path, table: &ProfileTable, limit: usize) -> Result<(), PersistError> {
    let bytes = encode(table);
    if bytes.len() > limit {
        return Err(PersistError::TooLarge {
            path: path.to_owned(),
            limit,
        });
    }
    slrp_types::write_atomic(path, &bytes).map_err(|e| PersistError::Io {
        op: e.step.as_str(),
        path: e.path,
        source: e.source,
    })
}

/// CRC-32 (IEEE 802.3, reflected, as zlib's `crc32`), bitwise: state files are small.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & mask);
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::document::ProfileMapping;

    fn table() -> ProfileTable {
        let mut t = ProfileTable::default();
        t.apply(
            ProfileMapping::parse(
                br#"{"profile_matrix":{
                "a":{"csi_plugin_type_selector":{"plugin_type":"t"},
                     "volume_capabilities":{"mount":{"fs_type":"ext4","mount_flags":["ro"]},
                                            "access_mode":{"mode":"SINGLE_NODE_WRITER"}},
                     "create_parameters":{"k":"v"}},
                "b":{"resource_provider_selector":{"resource_providers":[{"type":"t","name":"n"}]},
                     "volume_capabilities":{"block":{},"access_mode":{"mode":"SINGLE_NODE_WRITER"}}}}}"#,
            )
            .unwrap(),
        );
        t.apply(
            ProfileMapping::parse(
                br#"{"profile_matrix":{
                "b":{"resource_provider_selector":{"resource_providers":[{"type":"t","name":"n"}]},
                     "volume_capabilities":{"block":{},"access_mode":{"mode":"SINGLE_NODE_WRITER"}}}}}"#,
            )
            .unwrap(),
        );
        t
    }

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn encode_decode_round_trip_keeps_inactive_entries() {
        let t = table();
        let decoded = decode(Path::new("x"), &encode(&t)).unwrap();
        assert_eq!(decoded, t);
        assert!(!decoded.entries()["a"].active);
    }

    #[test]
    fn corruption_is_detected() {
        let p = Path::new("x");
        let good = encode(&table());
        let mut flipped = good.clone();
        let last = flipped.len() - 2;
        flipped[last] ^= 0x01;
        assert!(matches!(
            decode(p, &flipped),
            Err(PersistError::Checksum { .. })
        ));
        assert!(matches!(
            decode(p, b"garbage"),
            Err(PersistError::BadHeader { .. })
        ));
        let newer = String::from_utf8(good).unwrap().replacen(" 1 ", " 2 ", 1);
        assert!(matches!(
            decode(p, newer.as_bytes()),
            Err(PersistError::UnsupportedVersion { .. })
        ));
    }

    #[test]
    fn save_and_load_through_the_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("profiles.state");
        assert!(load(&path, 1 << 20).unwrap().is_none());
        // A stale temporary from a "crash" does not block the next save.
        fs::write(dir.path().join("profiles.state.tmp"), b"partial").unwrap();
        save(&path, &table(), 1 << 20).unwrap();
        assert_eq!(load(&path, 1 << 20).unwrap(), Some(table()));
        assert!(!dir.path().join("profiles.state.tmp").exists());
        assert!(matches!(
            load(&path, 10),
            Err(PersistError::TooLarge { .. })
        ));
        // What cannot be read back is not written: the old file stays.
        assert!(matches!(
            save(&path, &ProfileTable::default(), 10),
            Err(PersistError::TooLarge { .. })
        ));
        assert_eq!(load(&path, 1 << 20).unwrap(), Some(table()));
        assert!(state_limit(1) >= MIN_STATE_LIMIT);
        assert_eq!(state_limit(usize::MAX), usize::MAX);
    }
}
