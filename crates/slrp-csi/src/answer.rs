//! The checks every plugin answer passes before slrp stores or uses anything in it.
//!
//! # Overview
//! A CSI plugin is code slrp does not control. Whatever it answers ends up in slrp's
//! state store, in the resources sent to Mesos, in the admin API and in the log, so the
//! client checks each answer here, at its boundary, against the CSI spec's rules (ids
//! REQUIRED, sizes non-negative, a created volume within the capacity range asked for)
//! and against slrp's size bounds ([`AnswerLimits`]). The spec's own "Size Limits" (128
//! bytes per string, 4 KiB per map) are recommendations that real plugins exceed, so
//! the defaults are far above them and far below harm, as slrp's 1,024-byte id bound
//! (the state store's key bound) is: every bound is configurable (`[csi]` in slrp's
//! config file).
//!
//! What happens to an answer that breaks a rule ([`Violation`]):
//! - **refused**: the call fails with [`CsiError::InvalidResponse`](crate::CsiError::InvalidResponse) naming the rule and
//!   the bound (and, for CreateVolume, the id of what the plugin created, when it gave
//!   one that can be sent back, so the caller can delete it);
//! - **entry skipped**: one bad entry of a ListVolumes page (no volume, an empty or
//!   unstorable id, a context over the bound) is left out and the rest of the page used:
//!   one bad entry must not hide every other volume;
//! - **repaired**: a negative size the spec forbids in a listed volume or in GetCapacity
//!   is read as 0 ("unknown"/"no space"), as slrp always did, but no longer silently.
//!
//! Skips and repairs are counted (`csi_answer_violations_total{rpc, rule}`) and logged
//! at WARN the first time per RPC and rule, then at DEBUG: a plugin that breaks a rule on
//! every reconciliation must not flood the log.
//!
//! A listing (ListVolumes followed page by page) is bounded by [`ListingBudget`]: pages,
//! entries and bytes, and a token seen before ends it; the tokens are kept as 64-bit
//! hashes, so a plugin that hands out a new token forever is stopped with bounded
//! memory.
//!
//! # Limitations
//! slrp sends no snapshot or topology-requirement calls, so no answer of its has
//! timestamps; NodeGetInfo's topology is checked as a map. A status message of a failed
//! call is cut to the string bound, not refused (it is an error already).

use std::collections::HashSet;
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::error::CsiRpc;
use crate::metrics::CsiMetrics;
use crate::types::{CreateVolumeRequest, StringMap, Volume, VolumePage};

/// Default bound on a volume id or node id, in bytes: the state store's key bound
/// (`slrp_store::MAX_KEY_LEN`), since ids become keys. Real ids are UUIDs or paths of a
/// few dozen bytes; CSI recommends 128.
pub const DEFAULT_MAX_ID_BYTES: usize = 1024;
/// Default bound on any other string of an answer (page tokens, plugin name and
/// version, messages), in bytes. CSI recommends 128.
pub const DEFAULT_MAX_STRING_BYTES: usize = 4096;
/// Default bound on a string map of an answer (a volume or publish context, the plugin
/// manifest, a topology), keys and values together, in bytes. CSI recommends 4 KiB.
pub const DEFAULT_MAX_MAP_BYTES: usize = 16 * 1024;
/// Default bound on the pages of one listing: a plugin that lists one volume per page
/// may list this many volumes.
pub const DEFAULT_MAX_LIST_PAGES: usize = 100_000;
/// Default bound on the volumes of one listing (5 × the 100,000 volumes slrp is
/// benchmarked with).
pub const DEFAULT_MAX_LIST_ENTRIES: usize = 500_000;
/// Default bound on the bytes of one listing (ids, contexts and tokens): 100,000
/// volumes with a 600-byte context each fit.
pub const DEFAULT_MAX_LIST_BYTES: usize = 64 << 20;

/// Longest id of a refused CreateVolume answer that slrp keeps to delete the volume by
/// (far over any bound: an id refused as too long is still sent back, but not a
/// megabyte of it).
pub const MAX_CLEANUP_ID_BYTES: usize = 64 * 1024;

/// How much of a plugin's answers slrp accepts; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnswerLimits {
    /// Longest volume or node id, in bytes.
    pub max_id_bytes: usize,
    /// Longest other string, in bytes.
    pub max_string_bytes: usize,
    /// Largest string map (keys and values), in bytes.
    pub max_map_bytes: usize,
    /// Most pages in one listing.
    pub max_list_pages: usize,
    /// Most volumes in one listing.
    pub max_list_entries: usize,
    /// Most bytes in one listing.
    pub max_list_bytes: usize,
}

impl Default for AnswerLimits {
    fn default() -> Self {
        Self {
            max_id_bytes: DEFAULT_MAX_ID_BYTES,
            max_string_bytes: DEFAULT_MAX_STRING_BYTES,
            max_map_bytes: DEFAULT_MAX_MAP_BYTES,
            max_list_pages: DEFAULT_MAX_LIST_PAGES,
            max_list_entries: DEFAULT_MAX_LIST_ENTRIES,
            max_list_bytes: DEFAULT_MAX_LIST_BYTES,
        }
    }
}

impl AnswerLimits {
    /// The settings with their values, in the order of the config file.
    pub fn settings(&self) -> [(&'static str, usize); 6] {
        [
            ("max_id_bytes", self.max_id_bytes),
            ("max_string_bytes", self.max_string_bytes),
            ("max_map_bytes", self.max_map_bytes),
            ("max_list_pages", self.max_list_pages),
            ("max_list_entries", self.max_list_entries),
            ("max_list_bytes", self.max_list_bytes),
        ]
    }
}

/// Which bound of a listing was passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListingBound {
    /// [`AnswerLimits::max_list_pages`].
    Pages,
    /// [`AnswerLimits::max_list_entries`].
    Entries,
    /// [`AnswerLimits::max_list_bytes`].
    Bytes,
}

impl ListingBound {
    /// The setting that raises it (`[csi]` in the config file).
    pub fn setting(self) -> &'static str {
        match self {
            Self::Pages => "max_list_pages",
            Self::Entries => "max_list_entries",
            Self::Bytes => "max_list_bytes",
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Self::Pages => "pages",
            Self::Entries => "volumes",
            Self::Bytes => "bytes",
        }
    }
}

/// A rule of the CSI spec or a bound of slrp's that an answer breaks. `Display` names
/// the field and, for a bound, its value and the setting that raises it; it never
/// repeats the offending value (it may be megabytes, or forge log lines).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// A REQUIRED message is absent.
    #[error("{field} is missing")]
    Missing {
        /// The field.
        field: &'static str,
    },
    /// A REQUIRED string is empty.
    #[error("{field} is empty")]
    Empty {
        /// The field.
        field: &'static str,
    },
    /// A string is longer than its bound.
    #[error("{field} has {len} bytes, over the bound of {max} (setting csi.{setting})")]
    TooLong {
        /// The field.
        field: &'static str,
        /// Its length.
        len: usize,
        /// The bound.
        max: usize,
        /// The setting of the bound.
        setting: &'static str,
    },
    /// An id holds a character the state store cannot hold in a key.
    #[error("{field} contains {what}, which slrp cannot store")]
    BadCharacter {
        /// The field.
        field: &'static str,
        /// The character (`NUL`, `U+10FFFF`).
        what: &'static str,
    },
    /// A string map is larger than its bound.
    #[error(
        "{field} holds {bytes} bytes in {entries} entries, over the bound of {max} (setting csi.max_map_bytes)"
    )]
    MapTooLarge {
        /// The field.
        field: &'static str,
        /// Its entries.
        entries: usize,
        /// Its keys and values, in bytes.
        bytes: usize,
        /// The bound.
        max: usize,
    },
    /// A size the spec says MUST NOT be negative is.
    #[error("{field} is negative ({value})")]
    Negative {
        /// The field.
        field: &'static str,
        /// Its value.
        value: i64,
    },
    /// A created volume is smaller than `required_bytes` (spec: "MUST be at least").
    #[error("capacity_bytes {capacity} is below the required_bytes {required} asked for")]
    BelowRequired {
        /// The answer's `capacity_bytes`.
        capacity: i64,
        /// The request's `required_bytes`.
        required: i64,
    },
    /// A created volume is larger than `limit_bytes` (spec: "MUST not be bigger").
    #[error("capacity_bytes {capacity} is above the limit_bytes {limit} asked for")]
    AboveLimit {
        /// The answer's `capacity_bytes`.
        capacity: i64,
        /// The request's `limit_bytes`.
        limit: i64,
    },
    /// A field names something other than what the request was about (a snapshot of
    /// another volume).
    #[error("{field} is {what}")]
    Mismatch {
        /// The field.
        field: &'static str,
        /// What it is instead.
        what: String,
    },
    /// A listing's `next_token` is one it gave before: following it would never end.
    #[error("next_token repeats a token of the same listing")]
    RepeatedToken,
    /// A listing passed one of its bounds.
    #[error("the listing passed {max} {} (setting csi.{})", bound.unit(), bound.setting())]
    Listing {
        /// Which bound.
        bound: ListingBound,
        /// Its value.
        max: usize,
    },
}

impl Violation {
    /// The rule's name: the `rule` label of `csi_answer_violations_total`.
    pub fn rule(&self) -> &'static str {
        match self {
            Self::Missing { .. } => "missing",
            Self::Empty { .. } => "empty",
            Self::TooLong { .. } => "too_long",
            Self::BadCharacter { .. } => "bad_character",
            Self::MapTooLarge { .. } => "map_too_large",
            Self::Negative { .. } => "negative",
            Self::BelowRequired { .. } => "below_required",
            Self::AboveLimit { .. } => "above_limit",
            Self::Mismatch { .. } => "mismatch",
            Self::RepeatedToken => "repeated_token",
            Self::Listing {
                bound: ListingBound::Pages,
                ..
            } => "too_many_pages",
            Self::Listing {
                bound: ListingBound::Entries,
                ..
            } => "too_many_entries",
            Self::Listing {
                bound: ListingBound::Bytes,
                ..
            } => "too_many_bytes",
        }
    }
}

/// `id` (a volume or node id): non-empty, within [`AnswerLimits::max_id_bytes`], and
/// free of the characters the state store refuses in a key.
///
/// # Errors
/// The first rule it breaks.
pub fn check_id(field: &'static str, id: &str, limits: &AnswerLimits) -> Result<(), Violation> {
    if id.is_empty() {
        return Err(Violation::Empty { field });
    }
    if id.len() > limits.max_id_bytes {
        return Err(Violation::TooLong {
            field,
            len: id.len(),
            max: limits.max_id_bytes,
            setting: "max_id_bytes",
        });
    }
    // The store's key rules (slrp_store::record::check_key): NUL ends a C string in
    // SQLite's API, U+10FFFF bounds its prefix scans.
    for (c, what) in [('\0', "NUL"), ('\u{10FFFF}', "U+10FFFF")] {
        if id.contains(c) {
            return Err(Violation::BadCharacter { field, what });
        }
    }
    Ok(())
}

/// Any other string: within [`AnswerLimits::max_string_bytes`].
///
/// # Errors
/// [`Violation::TooLong`].
pub fn check_string(field: &'static str, s: &str, limits: &AnswerLimits) -> Result<(), Violation> {
    if s.len() > limits.max_string_bytes {
        return Err(Violation::TooLong {
            field,
            len: s.len(),
            max: limits.max_string_bytes,
            setting: "max_string_bytes",
        });
    }
    Ok(())
}

/// Bytes of a map's keys and values.
pub fn map_bytes(m: &StringMap) -> usize {
    m.iter().map(|(k, v)| k.len().saturating_add(v.len())).sum()
}

/// A string map: keys and values together within [`AnswerLimits::max_map_bytes`].
///
/// # Errors
/// [`Violation::MapTooLarge`].
pub fn check_map(
    field: &'static str,
    m: &StringMap,
    limits: &AnswerLimits,
) -> Result<(), Violation> {
    let bytes = map_bytes(m);
    if bytes > limits.max_map_bytes {
        return Err(Violation::MapTooLarge {
            field,
            entries: m.len(),
            bytes,
            max: limits.max_map_bytes,
        });
    }
    Ok(())
}

/// A size the spec says MUST NOT be negative.
///
/// # Errors
/// [`Violation::Negative`].
pub fn check_size(field: &'static str, value: i64) -> Result<(), Violation> {
    if value < 0 {
        return Err(Violation::Negative { field, value });
    }
    Ok(())
}

/// The parts of a volume that identify it and are stored with it: its id and its
/// context (a listed volume's size is [`check_size`]d apart, since it can be repaired).
///
/// # Errors
/// The first rule it breaks.
pub fn check_volume_identity(v: &Volume, limits: &AnswerLimits) -> Result<(), Violation> {
    check_id("volume_id", v.volume_id.as_str(), limits)?;
    check_map("volume_context", &v.volume_context, limits)
}

/// A CreateVolume answer for `req`: a storable volume whose `capacity_bytes` is not
/// negative and, when known (not 0), within the range asked for (spec `CapacityRange`:
/// "MUST be at least" `required_bytes`, "MUST not be bigger than" `limit_bytes`).
///
/// # Errors
/// The first rule it breaks.
pub fn check_created(
    req: &CreateVolumeRequest,
    v: &Volume,
    limits: &AnswerLimits,
) -> Result<(), Violation> {
    check_volume_identity(v, limits)?;
    let capacity = v.capacity_bytes;
    check_size("capacity_bytes", capacity)?;
    if capacity > 0 && req.required_bytes > 0 && capacity < req.required_bytes {
        return Err(Violation::BelowRequired {
            capacity,
            required: req.required_bytes,
        });
    }
    if req.limit_bytes > 0 && capacity > req.limit_bytes {
        return Err(Violation::AboveLimit {
            capacity,
            limit: req.limit_bytes,
        });
    }
    Ok(())
}

/// The bounds of one listing, followed page by page; see the module docs.
///
/// Memory: one 64-bit hash per page for the tokens, whatever the tokens' size.
#[derive(Debug)]
pub struct ListingBudget {
    limits: AnswerLimits,
    pages: usize,
    entries: usize,
    bytes: usize,
    tokens: HashSet<u64>,
    hasher: RandomState,
    /// Where a passed bound is counted (the client's metrics), if anywhere.
    metrics: Option<CsiMetrics>,
}

impl ListingBudget {
    /// A listing that has taken nothing yet.
    pub fn new(limits: AnswerLimits) -> Self {
        Self {
            limits,
            pages: 0,
            entries: 0,
            bytes: 0,
            tokens: HashSet::new(),
            hasher: RandomState::new(),
            metrics: None,
        }
    }

    /// A budget whose passed bounds count in `metrics`.
    pub(crate) fn counted(limits: AnswerLimits, metrics: CsiMetrics) -> Self {
        Self {
            metrics: Some(metrics),
            ..Self::new(limits)
        }
    }

    /// Counts `page` (already checked by the client) against the bounds; its token, if
    /// any, is the next one to follow.
    ///
    /// # Errors
    /// [`Violation::Listing`] naming the bound passed, or [`Violation::RepeatedToken`].
    pub fn take(&mut self, page: &VolumePage) -> Result<(), Violation> {
        let taken = self.count(page);
        if let (Err(v), Some(metrics)) = (&taken, &self.metrics) {
            metrics.answer_violation(CsiRpc::ListVolumes, v.rule());
        }
        taken
    }

    fn count(&mut self, page: &VolumePage) -> Result<(), Violation> {
        let bound = |bound, max| Violation::Listing { bound, max };
        self.pages = self.pages.saturating_add(1);
        if self.pages > self.limits.max_list_pages {
            return Err(bound(ListingBound::Pages, self.limits.max_list_pages));
        }
        self.entries = self.entries.saturating_add(page.volumes.len());
        if self.entries > self.limits.max_list_entries {
            return Err(bound(ListingBound::Entries, self.limits.max_list_entries));
        }
        let page_bytes: usize = page
            .volumes
            .iter()
            .map(|v| {
                v.volume_id
                    .as_str()
                    .len()
                    .saturating_add(map_bytes(&v.volume_context))
            })
            .sum();
        let token_bytes = page.next_token.as_ref().map_or(0, String::len);
        self.bytes = self
            .bytes
            .saturating_add(page_bytes)
            .saturating_add(token_bytes);
        if self.bytes > self.limits.max_list_bytes {
            return Err(bound(ListingBound::Bytes, self.limits.max_list_bytes));
        }
        if let Some(token) = &page.next_token
            && !self.tokens.insert(self.hasher.hash_one(token))
        {
            return Err(Violation::RepeatedToken);
        }
        Ok(())
    }
}

/// `s` as it may appear in a message or a log field: control characters escaped, and
/// cut after 64 characters with its length said. For ids and names that come from a
/// plugin.
pub fn shown(s: &str) -> String {
    const SHOWN: usize = 64;
    let mut out: String = s.chars().take(SHOWN).flat_map(char::escape_debug).collect();
    if s.chars().nth(SHOWN).is_some() {
        out.push_str(&format!("… ({} bytes)", s.len()));
    }
    out
}

/// What the client does with the violations it finds: counts them, and logs the first
/// skip or repair of each kind. Shared by the clones of one client.
#[derive(Clone)]
pub(crate) struct AnswerCheck {
    pub(crate) limits: AnswerLimits,
    metrics: CsiMetrics,
    endpoint: Arc<str>,
    /// The (RPC, rule) pairs already logged at WARN: a finite set.
    warned: Arc<Mutex<HashSet<(CsiRpc, &'static str)>>>,
}

impl fmt::Debug for AnswerCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnswerCheck")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl AnswerCheck {
    pub(crate) fn new(limits: AnswerLimits, metrics: CsiMetrics, endpoint: &str) -> Self {
        Self {
            limits,
            metrics,
            endpoint: Arc::from(endpoint),
            warned: Arc::default(),
        }
    }

    /// An answer refused: counted; the caller's error says the rest.
    pub(crate) fn refused(&self, rpc: CsiRpc, v: &Violation) {
        self.metrics.answer_violation(rpc, v.rule());
    }

    /// A part of an answer skipped or repaired (`action` says which): counted, logged at
    /// WARN the first time per RPC and rule, at DEBUG after.
    pub(crate) fn tolerated(&self, rpc: CsiRpc, v: &Violation, action: &'static str) {
        self.metrics.answer_violation(rpc, v.rule());
        let first = self
            .warned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert((rpc, v.rule()));
        if first {
            tracing::warn!(%rpc, endpoint = %self.endpoint, rule = v.rule(), violation = %v, action,
                "a plugin answer breaks a CSI rule; further ones of this kind are counted in csi_answer_violations_total and logged at DEBUG");
        } else {
            tracing::debug!(%rpc, endpoint = %self.endpoint, rule = v.rule(), violation = %v, action,
                "a plugin answer breaks a CSI rule");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Secrets, VolumeId};

    fn small() -> AnswerLimits {
        AnswerLimits {
            max_id_bytes: 8,
            max_string_bytes: 6,
            max_map_bytes: 10,
            max_list_pages: 3,
            max_list_entries: 4,
            max_list_bytes: 40,
        }
    }

    fn volume(id: &str, capacity: i64, context: &[(&str, &str)]) -> Volume {
        Volume {
            volume_id: VolumeId::new(id),
            capacity_bytes: capacity,
            volume_context: context
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    fn create(required: i64, limit: i64) -> CreateVolumeRequest {
        CreateVolumeRequest {
            name: "op".into(),
            required_bytes: required,
            limit_bytes: limit,
            capabilities: Vec::new(),
            parameters: StringMap::new(),
            secrets: Secrets::default(),
            content_source: None,
        }
    }

    #[test]
    fn ids_are_non_empty_bounded_and_storable() {
        let l = small();
        let table: [(&str, Option<&str>); 7] = [
            ("v", None),
            ("12345678", None),
            ("123456789", Some("too_long")),
            ("", Some("empty")),
            ("a\0b", Some("bad_character")),
            ("a\u{10FFFF}", Some("bad_character")),
            // Other control characters are storable; logs and messages escape them.
            ("a\nb", None),
        ];
        for (id, rule) in table {
            let got = check_id("volume_id", id, &l).err().map(|v| v.rule());
            assert_eq!(got, rule, "{id:?}");
        }
    }

    #[test]
    fn strings_are_bounded() {
        let l = small();
        for (s, ok) in [("", true), ("123456", true), ("1234567", false)] {
            assert_eq!(check_string("next_token", s, &l).is_ok(), ok, "{s:?}");
        }
    }

    #[test]
    fn maps_are_bounded_by_keys_and_values_together() {
        let l = small();
        let map = |pairs: &[(&str, &str)]| -> StringMap {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        for (m, ok) in [
            (map(&[]), true),
            (map(&[("key", "value12")]), true),
            (map(&[("key", "value123")]), false),
            (map(&[("a", "1234"), ("b", "123")]), true),
            (map(&[("a", "12345"), ("b", "1234")]), false),
        ] {
            assert_eq!(check_map("volume_context", &m, &l).is_ok(), ok, "{m:?}");
        }
        let e = check_map("volume_context", &map(&[("a", "123456789012")]), &l).unwrap_err();
        assert_eq!(
            e.to_string(),
            "volume_context holds 13 bytes in 1 entries, over the bound of 10 (setting csi.max_map_bytes)"
        );
    }

    #[test]
    fn sizes_are_not_negative() {
        for (value, ok) in [
            (0, true),
            (1, true),
            (i64::MAX, true),
            (-1, false),
            (i64::MIN, false),
        ] {
            assert_eq!(check_size("capacity_bytes", value).is_ok(), ok, "{value}");
        }
    }

    #[test]
    fn a_created_volume_is_within_the_range_asked_for() {
        let l = AnswerLimits::default();
        let mib = 1 << 20;
        // (required, limit, capacity, rule broken)
        let table: [(i64, i64, i64, Option<&str>); 10] = [
            (mib, mib, mib, None),
            (mib, 0, 8 * mib, None),
            (0, mib, mib / 2, None),
            (0, 0, i64::MAX, None),
            // 0 is "unknown" (an NFS share): nothing to compare.
            (mib, mib, 0, None),
            (mib, mib, i64::MAX, Some("above_limit")),
            (mib, 2 * mib, 2 * mib + 1, Some("above_limit")),
            (mib, 0, mib - 1, Some("below_required")),
            (mib, mib, -1, Some("negative")),
            (0, 0, -5, Some("negative")),
        ];
        for (required, limit, capacity, rule) in table {
            let got = check_created(&create(required, limit), &volume("v", capacity, &[]), &l)
                .err()
                .map(|v| v.rule());
            assert_eq!(
                got, rule,
                "required {required} limit {limit} capacity {capacity}"
            );
        }
        // The id and the context are checked too.
        let v = volume("", mib, &[]);
        assert_eq!(
            check_created(&create(mib, mib), &v, &l).unwrap_err().rule(),
            "empty"
        );
        let big = "x".repeat(DEFAULT_MAX_MAP_BYTES);
        let v = volume("v", mib, &[("k", &big)]);
        assert_eq!(
            check_created(&create(mib, mib), &v, &l).unwrap_err().rule(),
            "map_too_large"
        );
    }

    fn page(ids: &[&str], next: Option<&str>) -> VolumePage {
        VolumePage {
            volumes: ids.iter().map(|id| volume(id, 1, &[])).collect(),
            next_token: next.map(str::to_owned),
        }
    }

    #[test]
    fn a_listing_is_bounded_in_pages_entries_bytes_and_tokens() {
        // (pages, the rule the last one breaks)
        let table: Vec<(Vec<VolumePage>, Option<&str>)> = vec![
            (vec![page(&["a"], Some("1")), page(&["b"], None)], None),
            (
                vec![
                    page(&[], Some("1")),
                    page(&[], Some("2")),
                    page(&[], Some("3")),
                    page(&[], None),
                ],
                Some("too_many_pages"),
            ),
            (
                vec![page(&["a", "b", "c"], Some("1")), page(&["d", "e"], None)],
                Some("too_many_entries"),
            ),
            // 3 ids of 12 bytes and a token of 1: 37; 4 more bytes pass 40.
            (
                vec![
                    page(&["aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc"], Some("1")),
                    page(&["dddd"], None),
                ],
                Some("too_many_bytes"),
            ),
            (
                vec![page(&["a"], Some("t")), page(&["b"], Some("t"))],
                Some("repeated_token"),
            ),
        ];
        for (pages, rule) in table {
            let mut budget = ListingBudget::new(small());
            let mut got = None;
            for p in &pages {
                if let Err(v) = budget.take(p) {
                    got = Some(v.rule());
                    break;
                }
            }
            assert_eq!(got, rule, "{pages:?}");
        }
        let e = Violation::Listing {
            bound: ListingBound::Pages,
            max: 3,
        };
        assert_eq!(
            e.to_string(),
            "the listing passed 3 pages (setting csi.max_list_pages)"
        );
    }

    #[test]
    fn an_endless_listing_is_stopped_with_bounded_memory() {
        // A new token on every page, each a kilobyte: the budget keeps 8 bytes per page.
        let limits = AnswerLimits {
            max_list_pages: 10_000,
            max_list_bytes: usize::MAX,
            ..AnswerLimits::default()
        };
        let mut budget = ListingBudget::new(limits);
        let mut n = 0_usize;
        let err = loop {
            let token = format!("{n:01024}");
            if let Err(v) = budget.take(&page(&[], Some(&token))) {
                break v;
            }
            n += 1;
        };
        assert_eq!(n, 10_000);
        assert_eq!(err.rule(), "too_many_pages");
        assert!(budget.tokens.len() <= 10_000);
    }

    #[test]
    fn shown_escapes_and_cuts() {
        assert_eq!(shown("a\nb\0c"), "a\\nb\\0c");
        let long = "x".repeat(10_000);
        let s = shown(&long);
        assert!(s.starts_with(&"x".repeat(64)), "{s}");
        assert!(s.ends_with("… (10000 bytes)"), "{s}");
    }

    #[test]
    fn defaults_admit_the_answers_of_real_plugins() {
        let l = AnswerLimits::default();
        // slrp-csi-local: ids are <pool>/<name>; Ember-CSI: UUIDs, node ids
        // `io.ember-csi.<node>`; hostpath-style plugins: UUIDs; cloud plugins: resource
        // paths of ~100 bytes.
        for id in [
            "default/5f0c5c4e-0000-4000-8000-000000000000",
            "0c1b8b8e-4a0d-4d4a-9e51-2b8c2f7a6f10",
            "io.ember-csi.node1",
            "projects/my-project/zones/us-central1-a/disks/pvc-0c1b8b8e-4a0d-4d4a-9e51-2b8c2f7a6f10",
        ] {
            check_id("volume_id", id, &l).unwrap();
        }
        let context: StringMap = (0..20)
            .map(|i| (format!("storage.kubernetes.io/key{i}"), "v".repeat(200)))
            .collect();
        check_map("volume_context", &context, &l).unwrap();
    }
}
