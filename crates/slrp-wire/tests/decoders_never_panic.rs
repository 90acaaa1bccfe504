//! Property tests: every decoder answers arbitrary and malformed input with an error,
//! never a panic.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use proptest::prelude::*;
use serde_json::Value;
use slrp_proto::mesos::v1::{ResourceProviderInfo, agent, resource_provider};
use slrp_wire::{ContentType, decode, json};

fn decode_everything(bytes: &[u8]) {
    for content_type in [ContentType::Protobuf, ContentType::Json] {
        let _ = decode::<resource_provider::Event>(content_type, bytes);
        let _ = decode::<resource_provider::Call>(content_type, bytes);
        let _ = decode::<ResourceProviderInfo>(content_type, bytes);
        let _ = decode::<agent::Response>(content_type, bytes);
    }
    let _ = json::from_slice_with::<ResourceProviderInfo>(bytes, json::Unknown::Reject);
}

/// Arbitrary JSON, biased towards the field names and enum names the decoders know, so
/// that generated documents get past the first field and exercise nested paths.
fn json_value() -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        Just("type".to_owned()),
        Just("name".to_owned()),
        Just("value".to_owned()),
        Just("subscribe".to_owned()),
        Just("resource_provider_info".to_owned()),
        Just("storage".to_owned()),
        Just("plugin".to_owned()),
        Just("containers".to_owned()),
        Just("apply_operation".to_owned()),
        Just("info".to_owned()),
        Just("resources".to_owned()),
        Just("scalar".to_owned()),
        Just("disk".to_owned()),
        Just("source".to_owned()),
        "[a-z_]{1,12}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        prop_oneof![
            Just("SUBSCRIBE".to_owned()),
            Just("APPLY_OPERATION".to_owned()),
            Just("SCALAR".to_owned()),
            Just("RAW".to_owned()),
            Just("AAAAAAAAAAAAAAAAAAAAAA==".to_owned()),
            ".{0,16}",
        ]
        .prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 64, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(key.clone(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        decode_everything(&bytes);
    }

    #[test]
    fn random_json_documents(value in json_value()) {
        let _ = json::from_value::<resource_provider::Event>(value.clone());
        let _ = json::from_value::<resource_provider::Call>(value.clone());
        let _ = json::from_value_with::<ResourceProviderInfo>(value.clone(), json::Unknown::Reject);
        decode_everything(value.to_string().as_bytes());
    }

    #[test]
    fn mutated_valid_messages(flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
                              cut in any::<prop::sample::Index>()) {
        let config = include_bytes!("data/slrp-config.json");
        let info: ResourceProviderInfo = json::from_slice(config).unwrap();
        let call = resource_provider::Call {
            r#type: Some(resource_provider::call::Type::Subscribe as i32),
            subscribe: Some(resource_provider::call::Subscribe { resource_provider_info: info }),
            ..Default::default()
        };
        for mut bytes in [prost::Message::encode_to_vec(&call), config.to_vec()] {
            for (index, byte) in &flips {
                let i = index.index(bytes.len());
                bytes[i] ^= byte;
            }
            decode_everything(&bytes);
            let end = cut.index(bytes.len() + 1);
            decode_everything(&bytes[..end]);
        }
    }
}
