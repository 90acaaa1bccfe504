//! The Mesos wire formats, checked against bytes produced by protobuf's reference
//! implementation from Mesos's own `.proto` files.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use prost::Message as _;
use serde_json::json;
use slrp_proto::mesos::v1::{
    self as mesos, FrameworkId, OperationId, OperationState, OperationStatus, ResourceProviderId,
    ResourceProviderInfo, TimeInfo, Uuid,
    resource_provider::{Call, Event, call, event},
};
use slrp_wire::{ContentType, DecodeError, JsonError, decode, encode, json};

const CONFIG: &str = include_str!("data/slrp-config.json");

/// `Call{type: SUBSCRIBE, subscribe{resource_provider_info: <data/slrp-config.json>}}` as
/// serialized by libprotobuf (Python, upb) from Mesos's `resource_provider.proto` and
/// `mesos.proto` at the 1.11 line.
const SUBSCRIBE_GOLDEN: &str = "10011acd020aca021a216f72672e6170616368652e6d65736f732e72702e6c6f63616c2e73746f726167652204746573742a0b1a0773746f7261676520023291020a85020a196f72672e6170616368652e6d65736f732e6373692e7465737412056c6f63616c1ae0010801080212b00112140a120a094c4f475f4c4556454c120564656275671a182f706174682f746f2f746573742d6373692d706c7567696e30003a0f746573742d6373692d706c7567696e3a102d2d6170695f76657273696f6e3d76313a1c2d2d776f726b5f6469723d2f7661722f6c69622f746573742d6373693a182d2d617661696c61626c655f63617061636974793d3447423a212d2d766f6c756d65733d766f6c756d65313a3247423b766f6c756d65323a3247421a130a046370757310001a09099a9999999999b93f1a120a036d656d10001a09090000000000009040110000000000002440";

/// An `UPDATE_OPERATION_STATUS` call, serialized the same way (see `update_status_call`).
const UPDATE_STATUS_GOLDEN: &str = "0a060a0472702d311002226a0a040a02667712260a060a046f702d3110022a120a10000102030405060708090a0b0c0d0e0f3a060a0472702d311a260a060a046f702d3110022a120a10000102030405060708090a0b0c0d0e0f3a060a0472702d3122120a10101112131415161718191a1b1c1d1e1f";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn subscribe_call() -> Call {
    let info: ResourceProviderInfo = json::from_slice(CONFIG.as_bytes()).unwrap();
    Call {
        r#type: Some(call::Type::Subscribe as i32),
        subscribe: Some(call::Subscribe {
            resource_provider_info: info,
        }),
        ..Default::default()
    }
}

fn update_status_call() -> Call {
    let status = OperationStatus {
        operation_id: Some(OperationId {
            value: "op-1".into(),
        }),
        state: OperationState::OperationFinished as i32,
        uuid: Some(Uuid {
            value: (0u8..16).collect(),
        }),
        resource_provider_id: Some(ResourceProviderId {
            value: "rp-1".into(),
        }),
        ..Default::default()
    };
    Call {
        resource_provider_id: Some(ResourceProviderId {
            value: "rp-1".into(),
        }),
        r#type: Some(call::Type::UpdateOperationStatus as i32),
        update_operation_status: Some(call::UpdateOperationStatus {
            framework_id: Some(FrameworkId { value: "fw".into() }),
            status: status.clone(),
            latest_status: Some(status),
            operation_uuid: Uuid {
                value: (16u8..32).collect(),
            },
        }),
        ..Default::default()
    }
}

#[test]
fn subscribe_call_encodes_byte_for_byte_like_mesos() {
    let bytes = encode(ContentType::Protobuf, &subscribe_call()).unwrap();
    assert_eq!(hex(&bytes), SUBSCRIBE_GOLDEN);
}

#[test]
fn update_operation_status_call_encodes_byte_for_byte_like_mesos() {
    let bytes = encode(ContentType::Protobuf, &update_status_call()).unwrap();
    assert_eq!(hex(&bytes), UPDATE_STATUS_GOLDEN);
}

#[test]
fn golden_bytes_decode_to_the_same_messages() {
    let golden: Vec<u8> = (0..SUBSCRIBE_GOLDEN.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&SUBSCRIBE_GOLDEN[i..i + 2], 16).unwrap())
        .collect();
    let call: Call = decode(ContentType::Protobuf, &golden).unwrap();
    assert_eq!(call, subscribe_call());
    let plugin = &call
        .subscribe
        .unwrap()
        .resource_provider_info
        .storage
        .unwrap()
        .plugin;
    assert_eq!(plugin.r#type, "org.apache.mesos.csi.test");
    assert_eq!(plugin.containers[0].services, vec![1, 2]);
}

#[test]
fn slrp_config_parses_with_defaults_and_round_trips_through_json() {
    let info: ResourceProviderInfo = json::from_slice(CONFIG.as_bytes()).unwrap();
    assert_eq!(info.r#type, "org.apache.mesos.rp.local.storage");
    assert_eq!(info.name, "test");
    assert_eq!(info.default_reservations.len(), 1);
    assert_eq!(info.default_reservations[0].role(), "storage");
    let storage = info.storage.as_ref().unwrap();
    assert_eq!(storage.reconciliation_interval_seconds, Some(10.0));
    let container = &storage.plugin.containers[0];
    let command = container.command.as_ref().unwrap();
    assert_eq!(command.shell, Some(false));
    assert_eq!(command.arguments.len(), 5);
    assert_eq!(container.resources[0].scalar.as_ref().unwrap().value, 0.1);

    let value = json::to_value(&info).unwrap();
    // Mesos form: proto field names and enum names.
    assert_eq!(
        value["storage"]["plugin"]["containers"][0]["services"],
        json!(["CONTROLLER_SERVICE", "NODE_SERVICE"])
    );
    assert_eq!(value["default_reservations"][0]["type"], json!("DYNAMIC"));
    assert_eq!(
        value["storage"]["reconciliation_interval_seconds"],
        json!(10.0)
    );
    let again: ResourceProviderInfo = json::from_value(value).unwrap();
    assert_eq!(again, info);

    let pretty = json::to_string_pretty(&info).unwrap();
    let from_pretty: ResourceProviderInfo = json::from_slice(pretty.as_bytes()).unwrap();
    assert_eq!(from_pretty, info);
}

#[test]
fn sixty_four_bit_integers_are_json_numbers_and_bytes_are_base64() {
    let time = TimeInfo {
        nanoseconds: 1 << 52,
    };
    let value = json::to_value(&time).unwrap();
    assert_eq!(value, json!({ "nanoseconds": 1_i64 << 52 }));
    let back: TimeInfo = json::from_value(value).unwrap();
    assert_eq!(back, time);

    let uuid = Uuid {
        value: vec![0xfb, 0xff, 0x00, 0x10],
    };
    assert_eq!(
        json::to_value(&uuid).unwrap(),
        json!({ "value": "+/8AEA==" })
    );
    let back: Uuid = json::from_value(json!({ "value": "+/8AEA==" })).unwrap();
    assert_eq!(back, uuid);
}

#[test]
fn unknown_fields_are_ignored_as_mesos_does() {
    let text = json!({
        "type": "org.apache.mesos.rp.local.storage",
        "name": "test",
        "some_future_field": { "nested": [1, 2, 3] },
        "storage": { "plugin": { "type": "t", "unknown": true } }
    });
    let info: ResourceProviderInfo = json::from_value(text).unwrap();
    assert_eq!(info.storage.unwrap().plugin.name(), "default");
}

#[test]
fn a_missing_required_field_is_named_with_its_path() {
    let err = json::from_value::<ResourceProviderInfo>(json!({ "type": "x" })).unwrap_err();
    let JsonError::Required { message, source } = err else {
        panic!("unexpected error {err:?}");
    };
    assert_eq!(message, "mesos.v1.ResourceProviderInfo");
    assert_eq!(source.field, "name");

    let mut config: serde_json::Value = serde_json::from_str(CONFIG).unwrap();
    config["storage"]["plugin"]["containers"][0]["resources"][1]
        .as_object_mut()
        .unwrap()
        .remove("type");
    let err = json::from_value::<ResourceProviderInfo>(config).unwrap_err();
    let JsonError::Required { source, .. } = &err else {
        panic!("unexpected error {err:?}");
    };
    assert_eq!(source.message, "mesos.v1.Resource");
    assert_eq!(
        source.path.to_string(),
        "storage.plugin.containers[0].resources[1].type"
    );
    let chain = format!("{err}: {source}");
    assert!(
        chain.contains("incomplete mesos.v1.ResourceProviderInfo"),
        "{chain}"
    );
    assert!(chain.contains("'type' of mesos.v1.Resource"), "{chain}");
}

#[test]
fn unknown_enum_names_are_dropped_by_default_and_rejected_on_request() {
    let text = json!({ "type": "t", "name": "n", "default_reservations": [ { "type": "DYNAMC", "role": "r" } ] });
    // Mesos drops an unknown enum name of an optional field.
    let info: ResourceProviderInfo = json::from_value(text.clone()).unwrap();
    assert_eq!(info.default_reservations[0].r#type, None);
    // Operators' files are parsed strictly, so the typo is reported.
    let err =
        json::from_value_with::<ResourceProviderInfo>(text, json::Unknown::Reject).unwrap_err();
    let JsonError::Invalid { source, .. } = &err else {
        panic!("unexpected error {err:?}");
    };
    assert!(source.to_string().contains("DYNAMC"), "{source}");

    let text = br#"{"type":"t","name":"n","storage":{"plugin":{"type":"p"},"reconcilation_interval_seconds":5}}"#;
    assert!(json::from_slice::<ResourceProviderInfo>(text).is_ok());
    let err =
        json::from_slice_with::<ResourceProviderInfo>(text, json::Unknown::Reject).unwrap_err();
    assert!(
        format!("{:?}", err).contains("reconcilation_interval_seconds"),
        "{err:?}"
    );
}

#[test]
fn wrongly_typed_json_is_rejected_with_the_message_name() {
    for bad in [
        json!({ "type": "t", "name": 5 }),
        json!({ "type": "t", "name": "n", "default_reservations": { "role": "x" } }),
        json!([1, 2]),
    ] {
        let err = json::from_value::<ResourceProviderInfo>(bad.clone()).unwrap_err();
        assert!(
            matches!(err, JsonError::Invalid { ref message, .. } if message == "mesos.v1.ResourceProviderInfo"),
            "{bad}: {err:?}"
        );
    }
    let err = json::from_slice::<ResourceProviderInfo>(b"{\"type\": \"t\", ").unwrap_err();
    assert!(matches!(err, JsonError::Invalid { .. }), "{err:?}");
    let err = json::from_slice::<ResourceProviderInfo>(b"{\"type\":\"t\",\"name\":\"n\"} trailing")
        .unwrap_err();
    assert!(matches!(err, JsonError::Invalid { .. }), "{err:?}");
}

#[test]
fn protobuf_event_without_a_required_field_is_rejected() {
    // APPLY_OPERATION whose payload lacks `operation_uuid` and `resource_version_uuid`.
    let event = Event {
        r#type: Some(event::Type::ApplyOperation as i32),
        apply_operation: Some(event::ApplyOperation {
            info: mesos::offer::Operation {
                r#type: Some(mesos::offer::operation::Type::CreateDisk as i32),
                ..Default::default()
            },
            ..Default::default()
        }),
        ..Default::default()
    };
    // prost always emits required fields, so build the bytes a broken peer would send by
    // hand: only `type` and `apply_operation{info}`.
    let mut bytes = Vec::new();
    prost::encoding::int32::encode(1, &(event::Type::ApplyOperation as i32), &mut bytes);
    let info = event.apply_operation.as_ref().unwrap().info.encode_to_vec();
    let mut apply = Vec::new();
    prost::encoding::bytes::encode(2, &info, &mut apply);
    prost::encoding::bytes::encode(3, &apply, &mut bytes);

    let err = decode::<Event>(ContentType::Protobuf, &bytes).unwrap_err();
    let DecodeError::Required { message, source } = err else {
        panic!("unexpected error {err:?}");
    };
    assert_eq!(message, "mesos.v1.resource_provider.Event");
    assert_eq!(source.path.to_string(), "apply_operation.operation_uuid");
}

#[test]
fn json_call_without_a_required_payload_field_is_rejected() {
    let incomplete = json!({ "type": "UPDATE_STATE", "resource_provider_id": { "value": "rp" }, "update_state": {} });
    let err = json::from_value::<Call>(incomplete).unwrap_err();
    let JsonError::Required { source, .. } = &err else {
        panic!("unexpected error {err:?}");
    };
    assert_eq!(
        source.path.to_string(),
        "update_state.resource_version_uuid"
    );
}

#[test]
fn every_event_type_round_trips_through_both_content_types() {
    let uuid = |b: u8| Uuid { value: vec![b; 16] };
    let events = vec![
        Event {
            r#type: Some(event::Type::Subscribed as i32),
            subscribed: Some(event::Subscribed {
                provider_id: ResourceProviderId { value: "rp".into() },
            }),
            ..Default::default()
        },
        Event {
            r#type: Some(event::Type::ApplyOperation as i32),
            apply_operation: Some(event::ApplyOperation {
                framework_id: Some(FrameworkId { value: "fw".into() }),
                info: mesos::offer::Operation {
                    r#type: Some(mesos::offer::operation::Type::DestroyDisk as i32),
                    ..Default::default()
                },
                operation_uuid: uuid(1),
                resource_version_uuid: uuid(2),
            }),
            ..Default::default()
        },
        Event {
            r#type: Some(event::Type::PublishResources as i32),
            publish_resources: Some(event::PublishResources {
                uuid: uuid(3),
                resources: vec![],
            }),
            ..Default::default()
        },
        Event {
            r#type: Some(event::Type::AcknowledgeOperationStatus as i32),
            acknowledge_operation_status: Some(event::AcknowledgeOperationStatus {
                status_uuid: uuid(4),
                operation_uuid: uuid(5),
            }),
            ..Default::default()
        },
        Event {
            r#type: Some(event::Type::ReconcileOperations as i32),
            reconcile_operations: Some(event::ReconcileOperations {
                operation_uuids: vec![uuid(6), uuid(7)],
            }),
            ..Default::default()
        },
        Event {
            r#type: Some(event::Type::Teardown as i32),
            ..Default::default()
        },
    ];
    for event in events {
        for content_type in [ContentType::Protobuf, ContentType::Json] {
            let bytes = encode(content_type, &event).unwrap();
            let back: Event = decode(content_type, &bytes).unwrap();
            assert_eq!(back, event, "{content_type}");
        }
    }
}

#[test]
fn content_type_header_parsing() {
    assert_eq!(
        ContentType::from_header("application/x-protobuf"),
        Some(ContentType::Protobuf)
    );
    assert_eq!(
        ContentType::from_header("application/json; charset=utf-8"),
        Some(ContentType::Json)
    );
    assert_eq!(
        ContentType::from_header("Application/JSON"),
        Some(ContentType::Json)
    );
    assert_eq!(ContentType::from_header("text/plain"), None);
    assert_eq!(ContentType::from_header(""), None);
}
