//! The Mesos checkpoint codecs: reading rules, record streams, golden bytes, and the
//! resource downgrade/upgrade pair.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::fs::OpenOptions;

use slrp_proto::mesos::csi::state::{VolumeState, volume_state};
use slrp_proto::mesos::internal::{
    UpdateOperationStatusMessage, UpdateOperationStatusRecord, update_operation_status_record,
};
use slrp_proto::mesos::resource_provider::ResourceProviderState;
use slrp_proto::mesos::resource_provider::resource_provider_state::{Storage, storage};
use slrp_proto::mesos::v1::offer::operation::{CreateDisk, Type as OperationType};
use slrp_proto::mesos::v1::resource::reservation_info::Type as ReservationType;
use slrp_proto::mesos::v1::resource::{DiskInfo, ReservationInfo, disk_info};
use slrp_proto::mesos::v1::volume::source::csi_volume::VolumeCapability;
use slrp_proto::mesos::v1::volume::source::csi_volume::volume_capability::{
    AccessMode, AccessType, MountVolume, access_mode,
};
use slrp_proto::mesos::v1::{
    AgentId, CommandInfo, CsiPluginContainerInfo, FrameworkId, Label, Labels, Operation,
    OperationState, OperationStatus, Resource, Secret, Uuid, Value, csi_plugin_container_info,
    offer, secret, value,
};
use slrp_wire::checkpoint::{
    CheckpointError, Records, Tail, append_record, downgrade_message, downgrade_resources,
    encode_message, read_message, read_records, record_starts, upgrade_message, upgrade_resources,
    write_message,
};

/// Parses a hex dump written with spaces and line breaks between bytes.
fn hex(dump: &str) -> Vec<u8> {
    dump.split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).expect("a hex byte"))
        .collect()
}

fn uuid(bytes: &[u8]) -> Uuid {
    Uuid {
        value: bytes.to_vec(),
    }
}

fn status(state: OperationState, status_uuid: &[u8]) -> OperationStatus {
    OperationStatus {
        state: state as i32,
        uuid: Some(uuid(status_uuid)),
        ..OperationStatus::default()
    }
}

fn update_record(update: UpdateOperationStatusMessage) -> UpdateOperationStatusRecord {
    UpdateOperationStatusRecord {
        r#type: update_operation_status_record::Type::Update as i32,
        update: Some(update),
        uuid: None,
    }
}

fn ack_record(status_uuid: &[u8]) -> UpdateOperationStatusRecord {
    UpdateOperationStatusRecord {
        r#type: update_operation_status_record::Type::Ack as i32,
        update: None,
        uuid: Some(uuid(status_uuid)),
    }
}

fn update(state: OperationState, status_uuid: &[u8]) -> UpdateOperationStatusMessage {
    UpdateOperationStatusMessage {
        framework_id: Some(FrameworkId { value: "fw".into() }),
        slave_id: Some(AgentId { value: "ag".into() }),
        status: status(state, status_uuid),
        latest_status: None,
        operation_uuid: Some(uuid(&[0xbb, 0xbb])),
    }
}

fn mount_capability() -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: AccessMode {
            mode: access_mode::Mode::SingleNodeWriter as i32,
        },
    }
}

fn disk(mb: f64) -> Resource {
    Resource {
        name: "disk".into(),
        r#type: value::Type::Scalar as i32,
        scalar: Some(value::Scalar { value: mb }),
        ..Resource::default()
    }
}

fn reservation(kind: ReservationType, role: &str) -> ReservationInfo {
    ReservationInfo {
        r#type: Some(kind as i32),
        role: Some(role.into()),
        ..ReservationInfo::default()
    }
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    Labels {
        labels: pairs
            .iter()
            .map(|(k, v)| Label {
                key: (*k).into(),
                value: Some((*v).into()),
            })
            .collect(),
    }
}

// ---------------------------------------------------------------------------------------
// Golden bytes: hand-assembled from the field numbers of the Mesos sources, so a wrong
// field number or wire type in a .proto fails here. Both directions are checked: slrp
// decodes Mesos's bytes, and encodes exactly them (prost, like C++, writes fields in
// field-number order).

fn assert_golden<M>(msg: &M, golden: &[u8])
where
    M: prost::Message + prost::Name + Default + PartialEq + std::fmt::Debug,
{
    assert_eq!(
        encode_message(msg),
        golden,
        "encoding of {}",
        M::full_name()
    );
    let decoded: M = read_message(golden).unwrap().unwrap();
    assert_eq!(&decoded, msg);
}

#[test]
fn golden_ack_record() {
    let status_uuid: Vec<u8> = (0..16).collect();
    let golden = hex("16 00 00 00
         08 01
         1a 12 0a 10 00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f");
    assert_golden(&ack_record(&status_uuid), &golden);
}

#[test]
fn golden_update_record() {
    let golden = hex("20 00 00 00
         08 00
         12 1c
            0a 04 0a 02 66 77
            12 04 0a 02 61 67
            1a 08 10 02 2a 04 0a 02 aa aa
            2a 04 0a 02 bb bb");
    let record = update_record(update(OperationState::OperationFinished, &[0xaa, 0xaa]));
    assert_golden(&record, &golden);
}

#[test]
fn golden_update_message() {
    // What Mesos's NonStrictRecoveryCorruptedFile appends: the bare message, no record.
    let golden = hex("1c 00 00 00
         0a 04 0a 02 66 77
         12 04 0a 02 61 67
         1a 08 10 02 2a 04 0a 02 aa aa
         2a 04 0a 02 bb bb");
    assert_golden(
        &update(OperationState::OperationFinished, &[0xaa, 0xaa]),
        &golden,
    );
}

#[test]
fn golden_resource_provider_state() {
    let golden = hex("44 00 00 00
         0a 0e
            1a 02 08 0d
            22 02 10 01
            32 04 0a 02 01 02
         12 16
            0a 04 64 69 73 6b
            10 00
            1a 09 09 00 00 00 00 00 00 90 40
            32 01 2a
         1a 1a
            0a 18
               0a 04 66 61 73 74
               12 10
                  0a 06 12 00 1a 02 08 01
                  12 06 0a 01 61 12 01 62");
    let mut resource = disk(1024.0);
    resource.role = Some("*".into());
    let state = ResourceProviderState {
        operations: vec![Operation {
            info: offer::Operation {
                r#type: Some(OperationType::CreateDisk as i32),
                ..offer::Operation::default()
            },
            latest_status: OperationStatus {
                state: OperationState::OperationPending as i32,
                ..OperationStatus::default()
            },
            uuid: uuid(&[1, 2]),
            ..Operation::default()
        }],
        resources: vec![resource],
        storage: Some(Storage {
            profiles: HashMap::from([(
                "fast".to_owned(),
                storage::ProfileInfo {
                    capability: mount_capability(),
                    parameters: HashMap::from([("a".to_owned(), "b".to_owned())]),
                },
            )]),
        }),
    };
    assert_golden(&state, &golden);
}

#[test]
fn golden_volume_state() {
    let golden = hex("4a 00 00 00
         08 03
         12 06 12 00 1a 02 08 01
         1a 06 0a 01 63 12 01 32
         22 06 0a 01 78 12 01 33
         2a 01 62
         32 06 0a 01 70 12 01 31
         38 01
         40 01
         48 01
         52 0f 0a 01 73 12 0a 08 01 12 06 0a 01 6e 12 01 6b
         5a 0c 0a 01 74 12 07 08 02 1a 03 0a 01 76");
    let one = |k: &str, v: &str| HashMap::from([(k.to_owned(), v.to_owned())]);
    let state = VolumeState {
        state: volume_state::State::Published as i32,
        volume_capability: Some(mount_capability()),
        parameters: one("p", "1"),
        volume_context: one("c", "2"),
        publish_context: one("x", "3"),
        boot_id: "b".into(),
        node_publish_required: true,
        pre_provisioned: true,
        readonly: true,
        node_stage_secrets: HashMap::from([(
            "s".to_owned(),
            Secret {
                r#type: Some(secret::Type::Reference as i32),
                reference: Some(secret::Reference {
                    name: "n".into(),
                    key: Some("k".into()),
                }),
                value: None,
            },
        )]),
        node_publish_secrets: HashMap::from([(
            "t".to_owned(),
            Secret {
                r#type: Some(secret::Type::Value as i32),
                reference: None,
                value: Some(secret::Value {
                    data: b"v".to_vec(),
                }),
            },
        )]),
    };
    assert_golden(&state, &golden);
}

#[test]
fn golden_volume_state_enum_numbers() {
    // The states whose numbers are out of declaration order in Mesos.
    for (state, number) in [
        (volume_state::State::VolReady, 8),
        (volume_state::State::NodeStage, 9),
        (volume_state::State::NodeUnstage, 10),
        (volume_state::State::NodePublish, 6),
        (volume_state::State::NodeUnpublish, 7),
        (volume_state::State::ControllerPublish, 4),
        (volume_state::State::ControllerUnpublish, 5),
    ] {
        let msg = VolumeState {
            state: state as i32,
            ..VolumeState::default()
        };
        assert_eq!(
            encode_message(&msg),
            [2, 0, 0, 0, 0x08, number],
            "{state:?}"
        );
    }
}

#[test]
fn golden_container_info() {
    let golden = hex("0e 00 00 00
         08 01 08 02
         12 08 1a 01 70 30 00 3a 01 61");
    let info = CsiPluginContainerInfo {
        services: vec![
            csi_plugin_container_info::Service::ControllerService as i32,
            csi_plugin_container_info::Service::NodeService as i32,
        ],
        command: Some(CommandInfo {
            value: Some("p".into()),
            shell: Some(false),
            arguments: vec!["a".into()],
            ..CommandInfo::default()
        }),
        ..CsiPluginContainerInfo::default()
    };
    assert_golden(&info, &golden);
}

// ---------------------------------------------------------------------------------------
// Single-message reading rules (stout protobuf::read, ignorePartial = false).

fn volume(state: volume_state::State) -> VolumeState {
    VolumeState {
        state: state as i32,
        volume_capability: Some(mount_capability()),
        boot_id: "boot-1".into(),
        ..VolumeState::default()
    }
}

#[test]
fn empty_file_is_no_message() {
    assert_eq!(read_message::<VolumeState>(&[]).unwrap(), None);
}

#[test]
fn short_length_prefix_is_truncated() {
    let err = read_message::<VolumeState>(&[5, 0]).unwrap_err();
    assert!(
        matches!(err, CheckpointError::Truncated { want: 4, have: 2 }),
        "{err:?}"
    );
}

#[test]
fn short_body_is_truncated() {
    let bytes = encode_message(&volume(volume_state::State::Published));
    let cut = &bytes[..bytes.len() - 1];
    let err = read_message::<VolumeState>(cut).unwrap_err();
    match err {
        CheckpointError::Truncated { want, have } => {
            assert_eq!((want, have), (bytes.len(), bytes.len() - 1));
        }
        other => panic!("expected Truncated, got {other:?}"),
    }
    // A prefix alone, announcing a body that is not there.
    let err = read_message::<VolumeState>(&bytes[..4]).unwrap_err();
    assert!(
        matches!(err, CheckpointError::Truncated { have: 4, .. }),
        "{err:?}"
    );
}

#[test]
fn bytes_after_the_message_are_ignored() {
    let msg = volume(volume_state::State::VolReady);
    let mut bytes = encode_message(&msg);
    bytes.extend_from_slice(b"\xff\xff trailing garbage");
    assert_eq!(read_message::<VolumeState>(&bytes).unwrap(), Some(msg));
}

#[test]
fn garbage_body_is_a_decode_error() {
    // Field 1 with wire type 7, which does not exist.
    let err = read_message::<VolumeState>(&[1, 0, 0, 0, 0x0f]).unwrap_err();
    assert!(
        matches!(&err, CheckpointError::Decode { message, .. } if message == "mesos.csi.state.VolumeState"),
        "{err:?}"
    );
}

#[test]
fn missing_required_field_is_refused_with_its_path() {
    // An UPDATE record without `type` (field 1).
    let err = read_message::<UpdateOperationStatusRecord>(&[2, 0, 0, 0, 0x12, 0x00]).unwrap_err();
    match &err {
        CheckpointError::MissingRequired { message, path, .. } => {
            assert_eq!(message, "mesos.internal.UpdateOperationStatusRecord");
            assert_eq!(path, "type");
        }
        other => panic!("expected MissingRequired, got {other:?}"),
    }
    // A record whose update lacks its required `status`.
    let err = read_message::<UpdateOperationStatusRecord>(&[4, 0, 0, 0, 0x08, 0x00, 0x12, 0x00])
        .unwrap_err();
    assert!(
        matches!(&err, CheckpointError::MissingRequired { path, .. } if path == "update.status"),
        "{err:?}"
    );
    // The profile's capability is required in the RP state (proto2), nested in a map.
    let bytes = hex("0c 00 00 00 1a 0a 0a 08 0a 04 66 61 73 74 12 00");
    let err = read_message::<ResourceProviderState>(&bytes).unwrap_err();
    assert!(
        matches!(&err, CheckpointError::MissingRequired { path, .. }
            if path == "storage.profiles[\"fast\"].capability"),
        "{err:?}"
    );
}

// ---------------------------------------------------------------------------------------
// Writing.

#[test]
fn write_message_round_trips_and_replaces_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a/b/volume.state");
    let first = volume(volume_state::State::NodeReady);
    write_message(&path, &first, true).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes, encode_message(&first));
    assert_eq!(read_message::<VolumeState>(&bytes).unwrap(), Some(first));

    let second = volume(volume_state::State::Published);
    write_message(&path, &second, false).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(read_message::<VolumeState>(&bytes).unwrap(), Some(second));
    // The temporary files were renamed away: only the checkpoint is left.
    let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["volume.state"]);
}

// ---------------------------------------------------------------------------------------
// Record streams (operation.updates).

fn stream(records: &[UpdateOperationStatusRecord]) -> Vec<u8> {
    records.iter().flat_map(encode_message).collect()
}

#[test]
fn append_record_then_read_records_replays_updates_and_acks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("operation.updates");
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap();
    let written = [
        update_record(update(OperationState::OperationPending, &[1])),
        update_record(update(OperationState::OperationFinished, &[2])),
        ack_record(&[1]),
        ack_record(&[2]),
    ];
    for record in &written {
        append_record(&mut file, record).unwrap();
    }
    let bytes = std::fs::read(&path).unwrap();
    let read: Records<UpdateOperationStatusRecord> = read_records(&bytes);
    assert_eq!(read.tail, Tail::Clean);
    assert_eq!(read.good_len, bytes.len());
    assert_eq!(read.records, written);
}

#[test]
fn record_starts_name_every_whole_record_up_to_a_torn_one() {
    let records = [
        update_record(update(OperationState::OperationPending, &[1])),
        ack_record(&[1]),
    ];
    let (first, second) = (encode_message(&records[0]), encode_message(&records[1]));
    let mut bytes = [first.clone(), second.clone()].concat();
    // A whole record that does not decode still has a start; a torn one has none.
    bytes.extend_from_slice(&[1, 0, 0, 0, 0xff]);
    bytes.extend_from_slice(&second[..7]);
    let whole = first.len() + second.len();
    assert_eq!(record_starts(&bytes), [0, first.len(), whole]);
    let read = read_records::<UpdateOperationStatusRecord>(&bytes);
    assert_eq!(read.records, records);
    assert_eq!(record_starts(&[]), Vec::<usize>::new());
}

#[test]
fn empty_stream_is_clean_and_empty() {
    let read = read_records::<UpdateOperationStatusRecord>(&[]);
    assert_eq!((read.records.len(), read.good_len), (0, 0));
    assert_eq!(read.tail, Tail::Clean);
}

/// One good UPDATE record followed by `torn`: the record is read, the tail is torn with
/// `have` of `want` bytes.
fn assert_torn_after_one_record(torn: &[u8], have: usize, want: usize) {
    let good = stream(&[update_record(update(
        OperationState::OperationPending,
        &[1],
    ))]);
    let mut bytes = good.clone();
    bytes.extend_from_slice(torn);
    let read = read_records::<UpdateOperationStatusRecord>(&bytes);
    assert_eq!(read.records.len(), 1);
    assert_eq!(read.good_len, good.len());
    let offset = good.len();
    assert_eq!(read.tail, Tail::Torn { offset, have, want });
}

#[test]
fn torn_length_prefix_is_reported_after_the_good_records() {
    assert_torn_after_one_record(&[9, 0, 0], 3, 4);
}

#[test]
fn torn_body_is_reported_after_the_good_records() {
    let second = encode_message(&ack_record(&[1]));
    let cut = second.len() - 3;
    assert_torn_after_one_record(&second[..cut], cut, second.len());
}

#[test]
fn a_whole_message_appended_as_mesos_corrupted_file_test_is_corrupt() {
    // Mesos's NonStrictRecoveryCorruptedFile: a checkpointed UPDATE, then the bare
    // UpdateOperationStatusMessage written with a valid length prefix.
    let message = update(OperationState::OperationFinished, &[7]);
    let good = stream(&[update_record(message.clone())]);
    let mut bytes = good.clone();
    bytes.extend_from_slice(&encode_message(&message));
    // A good record after the bad one is not read: recovery stops at the first error.
    bytes.extend_from_slice(&encode_message(&ack_record(&[7])));
    let read = read_records::<UpdateOperationStatusRecord>(&bytes);
    assert_eq!(read.records, [update_record(message)]);
    assert_eq!(read.good_len, good.len());
    match &read.tail {
        Tail::Corrupt { offset, reason } => {
            assert_eq!(*offset, good.len());
            assert!(
                reason.contains("mesos.internal.UpdateOperationStatusRecord"),
                "{reason}"
            );
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn a_record_without_its_required_type_is_corrupt() {
    let good = stream(&[ack_record(&[1])]);
    let mut bytes = good.clone();
    bytes.extend_from_slice(&[2, 0, 0, 0, 0x1a, 0x00]);
    let read = read_records::<UpdateOperationStatusRecord>(&bytes);
    assert_eq!(read.records.len(), 1);
    match &read.tail {
        Tail::Corrupt { offset, reason } => {
            assert_eq!(*offset, good.len());
            assert!(reason.contains("'type'"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// Resource downgrade/upgrade (spec §8.1).

/// Downgrades a disk with `reservations`, checks the legacy form, and upgrades it back.
fn assert_downgrades(
    reservations: Vec<ReservationInfo>,
    role: &str,
    legacy_reservation: Option<ReservationInfo>,
) {
    let mut reserved = disk(1.0);
    reserved.reservations = reservations;
    let mut resources = vec![reserved.clone()];
    downgrade_resources(&mut resources);
    assert_eq!(resources[0].role.as_deref(), Some(role));
    assert_eq!(resources[0].reservation, legacy_reservation);
    assert!(resources[0].reservations.is_empty());
    upgrade_resources(&mut resources);
    assert_eq!(resources, [reserved]);
}

#[test]
fn unreserved_downgrades_to_role_star_and_back() {
    assert_downgrades(vec![], "*", None);
}

#[test]
fn static_reservation_downgrades_to_role_without_reservation() {
    assert_downgrades(
        vec![reservation(ReservationType::Static, "storage")],
        "storage",
        None,
    );
}

#[test]
fn dynamic_reservation_keeps_principal_and_labels() {
    let principal = Some("ops".to_owned());
    let team = Some(labels(&[("team", "db")]));
    assert_downgrades(
        vec![ReservationInfo {
            principal: principal.clone(),
            labels: team.clone(),
            ..reservation(ReservationType::Dynamic, "storage")
        }],
        "storage",
        Some(ReservationInfo {
            principal,
            labels: team,
            ..ReservationInfo::default()
        }),
    );
}

#[test]
fn dynamic_reservation_without_principal_stays_dynamic() {
    // An empty `reservation` is what tells the upgrade DYNAMIC from STATIC.
    assert_downgrades(
        vec![reservation(ReservationType::Dynamic, "storage")],
        "storage",
        Some(ReservationInfo::default()),
    );
}

#[test]
fn refined_reservations_are_untouched() {
    let mut refined = disk(1.0);
    refined.reservations = vec![
        reservation(ReservationType::Static, "storage"),
        ReservationInfo {
            principal: Some("ops".into()),
            ..reservation(ReservationType::Dynamic, "storage/db")
        },
    ];
    let mut resources = vec![refined.clone()];
    downgrade_resources(&mut resources);
    assert_eq!(resources, [refined.clone()]);
    upgrade_resources(&mut resources);
    assert_eq!(resources, [refined]);
}

#[test]
fn upgrade_drops_the_legacy_fields_of_the_endpoint_format() {
    // Mesos's ENDPOINT format carries both forms; the upgrade keeps `reservations`.
    let mut both = disk(1.0);
    both.reservations = vec![reservation(ReservationType::Static, "storage")];
    both.role = Some("storage".into());
    let mut resources = vec![both];
    upgrade_resources(&mut resources);
    assert_eq!(resources[0].role, None);
    assert_eq!(
        resources[0].reservations,
        [reservation(ReservationType::Static, "storage")]
    );
}

#[test]
fn conversions_are_idempotent() {
    let mut reserved = disk(1.0);
    reserved.reservations = vec![ReservationInfo {
        principal: Some("ops".into()),
        ..reservation(ReservationType::Dynamic, "storage")
    }];
    let mut once = vec![disk(2.0), reserved.clone()];
    downgrade_resources(&mut once);
    let mut twice = once.clone();
    downgrade_resources(&mut twice);
    assert_eq!(once, twice);
    upgrade_resources(&mut once);
    let mut twice = once.clone();
    upgrade_resources(&mut twice);
    assert_eq!(once, twice);
    assert_eq!(once, [disk(2.0), reserved]);
}

fn raw_pool(profile: &str) -> Resource {
    Resource {
        disk: Some(DiskInfo {
            source: Some(disk_info::Source {
                r#type: disk_info::source::Type::Raw as i32,
                profile: Some(profile.into()),
                ..disk_info::Source::default()
            }),
            ..DiskInfo::default()
        }),
        ..disk(100.0)
    }
}

#[test]
fn message_conversion_reaches_every_nested_resource() {
    let mut source = raw_pool("fast");
    source.reservations = vec![reservation(ReservationType::Static, "storage")];
    let converted = Resource {
        provider_id: None,
        ..source.clone()
    };
    let finished = OperationStatus {
        converted_resources: vec![converted],
        ..status(OperationState::OperationFinished, &[3])
    };
    let original = ResourceProviderState {
        operations: vec![Operation {
            info: offer::Operation {
                r#type: Some(OperationType::CreateDisk as i32),
                create_disk: Some(CreateDisk {
                    source: source.clone(),
                    target_type: disk_info::source::Type::Mount as i32,
                    target_profile: None,
                }),
                ..offer::Operation::default()
            },
            latest_status: finished.clone(),
            statuses: vec![finished],
            uuid: uuid(&[1; 16]),
            ..Operation::default()
        }],
        resources: vec![raw_pool("slow"), source],
        storage: None,
    };

    let mut state = original.clone();
    downgrade_message(&mut state).unwrap();
    let op = &state.operations[0];
    let legacy = |r: &Resource, role: &str| {
        r.role.as_deref() == Some(role) && r.reservations.is_empty() && r.reservation.is_none()
    };
    assert!(legacy(&state.resources[0], "*"), "{:?}", state.resources[0]);
    assert!(legacy(&state.resources[1], "storage"));
    assert!(legacy(
        &op.info.create_disk.as_ref().unwrap().source,
        "storage"
    ));
    assert!(legacy(&op.latest_status.converted_resources[0], "storage"));
    assert!(legacy(&op.statuses[0].converted_resources[0], "storage"));

    // Through a file, as Mesos writes and reads it.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("resource_provider.state");
    write_message(&path, &state, true).unwrap();
    let mut read: ResourceProviderState = read_message(&std::fs::read(&path).unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(read, state);
    upgrade_message(&mut read).unwrap();
    assert_eq!(read, original);
}

#[test]
fn message_conversion_leaves_messages_without_resources_alone() {
    let original = volume(volume_state::State::Published);
    let mut msg = original.clone();
    upgrade_message(&mut msg).unwrap();
    downgrade_message(&mut msg).unwrap();
    assert_eq!(msg, original);
    let mut value = Value {
        r#type: value::Type::Text as i32,
        ..Value::default()
    };
    // Not a checkpoint message, but any message with a descriptor converts.
    upgrade_message(&mut value).unwrap();
    assert_eq!(value.r#type, value::Type::Text as i32);
}

// ---------------------------------------------------------------------------------------
// Properties: arbitrary bytes never panic; a stream cut anywhere reads as the records
// before the cut and a torn tail.

mod properties {
    use proptest::prelude::*;

    use super::*;

    fn any_record() -> impl Strategy<Value = UpdateOperationStatusRecord> {
        (any::<bool>(), proptest::collection::vec(any::<u8>(), 0..20)).prop_map(
            |(is_ack, status_uuid)| {
                if is_ack {
                    ack_record(&status_uuid)
                } else {
                    update_record(update(OperationState::OperationFinished, &status_uuid))
                }
            },
        )
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = read_message::<ResourceProviderState>(&bytes);
            let _ = read_message::<VolumeState>(&bytes);
            let _ = read_message::<CsiPluginContainerInfo>(&bytes);
            let read = read_records::<UpdateOperationStatusRecord>(&bytes);
            prop_assert!(read.good_len <= bytes.len());
            match read.tail {
                Tail::Clean => prop_assert_eq!(read.good_len, bytes.len()),
                Tail::Torn { offset, have, want } => {
                    prop_assert_eq!(offset, read.good_len);
                    prop_assert_eq!(offset + have, bytes.len());
                    prop_assert!(have < want);
                }
                Tail::Corrupt { offset, .. } => prop_assert_eq!(offset, read.good_len),
            }
        }

        #[test]
        fn a_stream_cut_anywhere_keeps_the_records_before_the_cut(
            records in proptest::collection::vec(any_record(), 1..6),
            cut in any::<prop::sample::Index>(),
        ) {
            let encoded: Vec<Vec<u8>> = records.iter().map(encode_message).collect();
            let bytes: Vec<u8> = encoded.concat();
            let cut = cut.index(bytes.len() + 1);
            let read = read_records::<UpdateOperationStatusRecord>(&bytes[..cut]);
            // The records wholly before the cut, and where the last of them ends.
            let mut end = 0;
            let mut whole = 0;
            for record in &encoded {
                if end + record.len() > cut {
                    break;
                }
                end += record.len();
                whole += 1;
            }
            prop_assert_eq!(&read.records[..], &records[..whole]);
            prop_assert_eq!(read.good_len, end);
            if cut == end {
                prop_assert_eq!(read.tail, Tail::Clean);
            } else {
                let have = cut - end;
                // Until the length prefix is whole, only its 4 bytes are known to be needed.
                let want = if have < 4 { 4 } else { encoded[whole].len() };
                prop_assert_eq!(read.tail, Tail::Torn { offset: end, have, want });
            }
        }
    }
}

/// The path and number of the `UndefinedEnum` error reading `msg` as `M`.
fn undefined_enum<M, W>(msg: &W) -> (String, i32)
where
    M: prost::Message + prost::Name + Default + std::fmt::Debug,
    W: prost::Message,
{
    match read_message::<M>(&encode_message(msg)) {
        Err(CheckpointError::UndefinedEnum { path, number, .. }) => (path, number),
        other => panic!("expected UndefinedEnum, got {other:?}"),
    }
}

#[test]
fn an_undefined_number_in_a_proto2_enum_is_refused() {
    // Required (C++ parsing fails: the number goes to the unknown fields).
    let mut record = update_record(update(OperationState::OperationFinished, &[1]));
    record.r#type = 7;
    assert_eq!(
        undefined_enum::<UpdateOperationStatusRecord, _>(&record),
        ("type".to_owned(), 7)
    );
    let mut record = update_record(update(OperationState::OperationFinished, &[1]));
    record.update.as_mut().unwrap().status.state = 42;
    assert_eq!(
        undefined_enum::<UpdateOperationStatusRecord, _>(&record),
        ("update.status.state".to_owned(), 42)
    );
    // Optional, nested in a list.
    let state = ResourceProviderState {
        operations: vec![Operation {
            info: offer::Operation {
                r#type: Some(99),
                ..offer::Operation::default()
            },
            ..Operation::default()
        }],
        ..ResourceProviderState::default()
    };
    assert_eq!(
        undefined_enum::<ResourceProviderState, _>(&state),
        ("operations[0].info.type".to_owned(), 99)
    );
    // Repeated.
    let info = CsiPluginContainerInfo {
        services: vec![1, 9],
        ..CsiPluginContainerInfo::default()
    };
    assert_eq!(
        undefined_enum::<CsiPluginContainerInfo, _>(&info),
        ("services[1]".to_owned(), 9)
    );
    // In a stream, the record is corrupt.
    let mut bad = ack_record(&[1]);
    bad.r#type = 3;
    let read = read_records::<UpdateOperationStatusRecord>(&encode_message(&bad));
    assert!(
        matches!(&read.tail, Tail::Corrupt { offset: 0, reason } if reason.contains("'type'")),
        "{:?}",
        read.tail
    );
}

#[test]
fn proto3_enums_are_open() {
    // VolumeState is proto3: Mesos parses any number and reports "INVALID state" itself.
    let msg = VolumeState {
        state: 42,
        ..VolumeState::default()
    };
    let read: VolumeState = read_message(&encode_message(&msg)).unwrap().unwrap();
    assert_eq!(read.state, 42);
}
