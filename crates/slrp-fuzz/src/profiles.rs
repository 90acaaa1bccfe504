//! Profile documents (Mesos's URI disk profile adaptor format) and the profile adaptor's
//! state file, as `slrp-profiles` reads them: [`ProfileMapping::parse`] (a fetched or
//! file document, in the lenient dialect of protobuf's JSON parser),
//! [`ProfileMapping::from_value`] (strict JSON: an inline document), and the state file
//! the adaptor reloads at start.
//!
//! Input: one selector byte (bit 0: read the rest as a state file), then the bytes.
//!
//! Properties:
//! - refusals are typed ([`DocumentError`](slrp_profiles::DocumentError),
//!   [`PersistError`](slrp_profiles::PersistError)), never panics;
//! - the lenient reader agrees with the strict one on strict JSON: the same mapping, or a
//!   refusal by both;
//! - an accepted mapping, rendered back as a document, reads again to the same mapping;
//! - an accepted state file, written again, reads back to the same table, and its bytes
//!   are a fixed point of writing.

use slrp_profiles::ProfileMapping;
use slrp_profiles::fuzzing::{state_file, to_document};

use crate::util::byte;

/// The target.
pub fn run(data: &[u8]) {
    let mut data = data;
    if byte(&mut data) & 1 == 1 {
        check_state_file(data);
    } else {
        check_document(data);
    }
}

fn check_document(data: &[u8]) {
    let lenient = ProfileMapping::parse(data);
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
        let strict = ProfileMapping::from_value(value);
        match (&lenient, &strict) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "lenient and strict readings differ"),
            (Err(_), Err(_)) => {}
            _ => panic!(
                "lenient and strict readers disagree on strict JSON: {lenient:?} vs {strict:?}"
            ),
        }
    }
    let Ok(mapping) = lenient else {
        return;
    };
    let document = to_document(&mapping);
    let again = ProfileMapping::from_value(document.clone())
        .unwrap_or_else(|e| panic!("an accepted mapping, rendered, is refused: {e:?}\n{document}"));
    assert_eq!(mapping, again, "the mapping changed through its document");
    let text = serde_json::to_vec(&document).expect("a JSON value renders");
    let reparsed = ProfileMapping::parse(&text).expect("rendered JSON parses leniently");
    assert_eq!(
        mapping, reparsed,
        "the lenient reader changed a rendered document"
    );
}

fn check_state_file(data: &[u8]) {
    let Ok((table, written)) = state_file(data) else {
        return;
    };
    let (again, rewritten) = state_file(&written)
        .unwrap_or_else(|e| panic!("a state file slrp wrote is refused: {e:?}"));
    assert_eq!(table, again, "the table changed through its state file");
    assert_eq!(
        written, rewritten,
        "writing the state file is not a fixed point"
    );
}

/// A seed input: a document (`state` false) or a state file.
#[must_use]
pub fn seed(state: bool, bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![u8::from(state)];
    out.extend_from_slice(bytes);
    out
}
