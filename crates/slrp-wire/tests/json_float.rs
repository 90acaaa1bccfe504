//! A resource scalar survives Mesos JSON bit for bit (found by the `manager_calls` fuzz
//! target: without serde_json's `float_roundtrip`, 0.09999659089371563 came back as
//! 0.09999659089371564).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use slrp_proto::mesos::v1::{Resource, value};

#[test]
fn scalars_round_trip_exactly_through_json() {
    for v in [
        0.099_996_590_893_715_63,
        0.1,
        1.0015,
        4_096.000_000_000_001,
        1e-300,
        f64::MAX,
    ] {
        let r = Resource {
            name: "cpus".into(),
            r#type: value::Type::Scalar as i32,
            scalar: Some(value::Scalar { value: v }),
            ..Resource::default()
        };
        let text = slrp_wire::json::to_vec(&r).unwrap();
        let back: Resource = slrp_wire::json::from_slice(&text).unwrap();
        assert_eq!(
            back.scalar.unwrap().value.to_bits(),
            v.to_bits(),
            "{v} via {}",
            String::from_utf8_lossy(&text)
        );
    }
}
