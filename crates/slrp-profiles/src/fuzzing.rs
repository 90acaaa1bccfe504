//! Entry points for the fuzz targets (`crates/slrp-fuzz`), not an API.

use std::collections::BTreeMap;
use std::path::Path;

use crate::document::{ProfileMapping, WireMapping};
use crate::persist::{self, PersistError};
use crate::table::TableEntry;

/// The document a mapping is read from, as `serde_json` renders it (what a round trip
/// through [`ProfileMapping::from_value`] must give back).
///
/// # Panics
/// Never: the wire types are plain structs of strings, maps and options.
#[must_use]
pub fn to_document(mapping: &ProfileMapping) -> serde_json::Value {
    let wire = WireMapping {
        profile_matrix: Some(
            mapping
                .profiles
                .iter()
                .map(|(name, manifest)| (name.clone(), manifest.to_wire()))
                .collect(),
        ),
    };
    serde_json::to_value(wire).expect("plain structs always serialize")
}

/// A profiles state file's bytes decoded as the adaptor reads them at start, and the
/// bytes the adaptor would write for what it read.
///
/// # Errors
/// What the adaptor's start reports for this file.
pub fn state_file(bytes: &[u8]) -> Result<(BTreeMap<String, TableEntry>, Vec<u8>), PersistError> {
    let table = persist::decode(Path::new("profiles.state"), bytes)?;
    let encoded = persist::encode(&table);
    Ok((table.entries().clone(), encoded))
}

/// The state file the adaptor writes after accepting `mapping` as its first document (a
/// seed for the fuzz target).
#[must_use]
pub fn state_file_of(mapping: &ProfileMapping) -> Vec<u8> {
    let mut table = crate::table::ProfileTable::default();
    let _ = table.apply(mapping.clone());
    persist::encode(&table)
}
