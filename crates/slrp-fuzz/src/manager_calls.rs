//! The embedded manager's request bodies: the resource provider API
//! (`/api/v1/resource_provider`) and the operator API (`/api/v1`), each in protobuf and
//! JSON, decoded and validated as the HTTP handlers do
//! ([`slrp_manager::fuzzing`]).
//!
//! Input: one selector byte (bit 0: JSON; bit 1: the operator API), then the body.
//!
//! Properties:
//! - a refused body gets its 400 text, never a panic;
//! - an accepted call encodes (protobuf and JSON) and decodes again to the same call,
//!   which is accepted again;
//! - a container a `LAUNCH_CONTAINER` would start gets its sandbox and record inside the
//!   containers directory.

use std::path::Path;

use slrp_manager::fuzzing::{operator_call, provider_call};
use slrp_wire::ContentType;

use crate::util::{byte, inside, same};

/// The target.
pub fn run(data: &[u8]) {
    let mut data = data;
    let selector = byte(&mut data);
    let content_type = if selector & 1 == 0 {
        ContentType::Protobuf
    } else {
        ContentType::Json
    };
    if selector & 2 == 0 {
        let Ok(call) = provider_call(content_type, data) else {
            return;
        };
        for ct in [ContentType::Protobuf, ContentType::Json] {
            let Ok(bytes) = slrp_wire::encode(ct, &call) else {
                assert_eq!(ct, ContentType::Json, "protobuf encoding cannot fail");
                continue;
            };
            let again = provider_call(ct, &bytes)
                .unwrap_or_else(|e| panic!("an accepted call, as {ct}, is refused: {e}"));
            assert!(
                same(&call, &again),
                "{ct} round trip changed the call:\n{call:?}\n{again:?}"
            );
        }
    } else {
        let dir = Path::new("/var/lib/slrp/containers");
        let Ok((call, paths)) = operator_call(content_type, data, dir) else {
            return;
        };
        for p in &paths {
            assert!(
                inside(dir, p)
                    && (p.parent() == Some(dir) || p.parent() == Some(&dir.join(".slrp-runtime"))),
                "container path {} leaves {}",
                p.display(),
                dir.display()
            );
        }
        for ct in [ContentType::Protobuf, ContentType::Json] {
            let Ok(bytes) = slrp_wire::encode(ct, &call) else {
                assert_eq!(ct, ContentType::Json, "protobuf encoding cannot fail");
                continue;
            };
            let (again, _) = operator_call(ct, &bytes, dir)
                .unwrap_or_else(|e| panic!("an accepted operator call, as {ct}, is refused: {e}"));
            assert!(
                same(&call, &again),
                "{ct} round trip changed the operator call"
            );
        }
    }
}

/// A seed input.
#[must_use]
pub fn seed(json: bool, operator: bool, body: &[u8]) -> Vec<u8> {
    let mut out = vec![u8::from(json) | u8::from(operator) << 1];
    out.extend_from_slice(body);
    out
}
