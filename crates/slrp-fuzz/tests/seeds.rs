//! Writes the seed corpus of every target into `fuzz/corpus/<target>/seed-*`, from the
//! repository's examples and the kinds of inputs the tests use (Mesos checkpoints as the
//! import tests write them with `slrp_test_support::mesos`). Run by hand, then minimize
//! with `cargo xtask fuzz merge`:
//! `cargo test -p slrp-fuzz --test seeds -- --ignored`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use prost::Message as _;
use serde_json::json;
use slrp_fuzz::{
    admin_api, agent_stream, csi_local, manager_calls, mesos_import, profiles as prof,
};
use slrp_proto::mesos::csi::state::VolumeState as MesosVolume;
use slrp_proto::mesos::csi::state::volume_state::State;
use slrp_proto::mesos::resource_provider::ResourceProviderState;
use slrp_proto::mesos::v1::resource_provider::{Call, Event};
use slrp_proto::mesos::v1::{OperationState, OperationStatus, Resource};
use slrp_test_support::mesos::MesosWorkDir;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = root().join("fuzz/corpus").join(target);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("seed-{name}")), bytes).unwrap();
}

fn resource(v: serde_json::Value) -> Resource {
    slrp_wire::json::from_value(v).unwrap()
}

fn pool(mb: f64) -> serde_json::Value {
    json!({"provider_id": {"value": "rp-1"}, "name": "disk", "type": "SCALAR",
        "scalar": {"value": mb},
        "reservations": [{"type": "DYNAMIC", "role": "storage", "principal": "ops"}],
        "disk": {"source": {"type": "RAW", "vendor": "org.apache.mesos.csi.test.local",
            "profile": "fast"}}})
}

fn mount_disk(id: &str, mb: f64) -> serde_json::Value {
    json!({"provider_id": {"value": "rp-1"}, "name": "disk", "type": "SCALAR",
        "scalar": {"value": mb},
        "reservations": [{"type": "DYNAMIC", "role": "storage", "principal": "ops"}],
        "disk": {"source": {"type": "MOUNT", "vendor": "org.apache.mesos.csi.test.local",
            "id": id, "mount": {"root": "./csi/org.apache.mesos.csi.test/local/mounts"},
            "profile": "fast", "metadata": {"labels": [{"key": "k", "value": "v"}]}}}})
}

fn operation(uuid: &uuid::Uuid) -> serde_json::Value {
    json!({"type": "CREATE_DISK", "id": "op-1",
        "create_disk": {"source": pool(100.0), "target_type": "MOUNT"}})
    .as_object()
    .map(|o| {
        let mut o = o.clone();
        o.remove("id");
        serde_json::Value::Object(o)
    })
    .map(|info| {
        json!({"info": info,
                "latest_status": {"state": "OPERATION_PENDING",
                    "uuid": {"value": base64(uuid.as_bytes())}},
                "statuses": [],
                "uuid": {"value": base64(uuid.as_bytes())}})
    })
    .unwrap()
}

fn base64(bytes: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = u32::from(c[0]) << 16
            | u32::from(*c.get(1).unwrap_or(&0)) << 8
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(char::from(A[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn events() -> Vec<serde_json::Value> {
    let op = uuid::Uuid::from_u128(0x1234_5678_9abc_def0_1234_5678_9abc_def0);
    vec![
        json!({"type": "SUBSCRIBED", "subscribed": {"provider_id": {"value": "rp-1"}}}),
        json!({"type": "APPLY_OPERATION", "apply_operation": {
            "framework_id": {"value": "fw-1"},
            "info": {"type": "CREATE_DISK", "id": {"value": "op-1"},
                "create_disk": {"source": pool(1024.0), "target_type": "MOUNT"}},
            "operation_uuid": {"value": base64(op.as_bytes())},
            "resource_version_uuid": {"value": base64(op.as_bytes())}}}),
        json!({"type": "APPLY_OPERATION", "apply_operation": {
            "info": {"type": "DESTROY_DISK", "destroy_disk": {"source": mount_disk("vol-1", 64.0)}},
            "operation_uuid": {"value": base64(op.as_bytes())},
            "resource_version_uuid": {"value": base64(op.as_bytes())}}}),
        json!({"type": "PUBLISH_RESOURCES", "publish_resources": {
            "uuid": {"value": base64(op.as_bytes())}, "resources": [mount_disk("vol-1", 64.0)]}}),
        json!({"type": "ACKNOWLEDGE_OPERATION_STATUS", "acknowledge_operation_status": {
            "status_uuid": {"value": base64(op.as_bytes())},
            "operation_uuid": {"value": base64(op.as_bytes())}}}),
        json!({"type": "RECONCILE_OPERATIONS", "reconcile_operations": {
            "operation_uuids": [{"value": base64(op.as_bytes())}]}}),
        json!({"type": "TEARDOWN"}),
    ]
}

fn calls() -> Vec<serde_json::Value> {
    let op = uuid::Uuid::from_u128(0x0fed_cba9_8765_4321_0fed_cba9_8765_4321);
    let info: serde_json::Value = serde_json::from_slice(
        &std::fs::read(root().join("examples/resource-providers/local.json")).unwrap(),
    )
    .unwrap();
    vec![
        json!({"type": "SUBSCRIBE", "subscribe": {"resource_provider_info": info}}),
        json!({"type": "UPDATE_STATE", "resource_provider_id": {"value": "rp-1"},
            "update_state": {"resources": [pool(100.0), mount_disk("vol-1", 10.0)],
                "operations": [], "resource_version_uuid": {"value": base64(op.as_bytes())}}}),
        json!({"type": "UPDATE_OPERATION_STATUS", "resource_provider_id": {"value": "rp-1"},
            "update_operation_status": {"framework_id": {"value": "fw"},
                "status": {"state": "OPERATION_FINISHED", "uuid": {"value": base64(op.as_bytes())},
                    "converted_resources": [mount_disk("vol-1", 10.0)]},
                "operation_uuid": {"value": base64(op.as_bytes())}}}),
        json!({"type": "UPDATE_PUBLISH_RESOURCES_STATUS", "resource_provider_id": {"value": "rp-1"},
            "update_publish_resources_status": {"uuid": {"value": base64(op.as_bytes())},
                "status": "OK"}}),
    ]
}

fn operator_calls() -> Vec<serde_json::Value> {
    let cid =
        json!({"value": "slrp-org-apache-mesos-csi-test-local--CONTROLLER_SERVICE-NODE_SERVICE"});
    vec![
        json!({"type": "GET_AGENT"}),
        json!({"type": "GET_CONTAINERS"}),
        json!({"type": "LAUNCH_CONTAINER", "launch_container": {"container_id": cid,
            "command": {"value": "/bin/true", "shell": false, "arguments": ["true"]},
            "resources": [{"name": "cpus", "type": "SCALAR", "scalar": {"value": 0.1}}]}}),
        json!({"type": "WAIT_CONTAINER", "wait_container": {"container_id": cid}}),
        json!({"type": "KILL_CONTAINER", "kill_container": {"container_id": cid, "signal": 15}}),
        json!({"type": "REMOVE_CONTAINER", "remove_container": {"container_id": {"value": "c",
            "parent": {"value": "p"}}}}),
    ]
}

fn mesos_trees() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mount_cap: slrp_proto::mesos::v1::volume::source::csi_volume::VolumeCapability =
        slrp_wire::json::from_value(
            json!({"mount": {}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}}),
        )
        .unwrap();
    for (i, (state, boot)) in [
        (State::Created, ""),
        (State::NodeReady, ""),
        (State::VolReady, "boot-1"),
        (State::Published, "boot-0"),
    ]
    .into_iter()
    .enumerate()
    {
        let dir = tempfile::tempdir().unwrap();
        let w = MesosWorkDir::new(dir.path().join("work"))
            .agent(mesos_import::AGENT)
            .boot_id("boot-agent");
        let op = uuid::Uuid::from_u128(0x42 + i as u128);
        let mut rp_state: ResourceProviderState = slrp_wire::json::from_value(json!({
            "resources": [pool(1000.0), mount_disk("vol-1", 1024.0)],
            "storage": {"profiles": {"fast": {"capability": {"mount": {},
                "access_mode": {"mode": "SINGLE_NODE_WRITER"}}, "parameters": {"pool": "fast"}}}}
        }))
        .unwrap();
        if i % 2 == 1 {
            rp_state.operations = vec![slrp_wire::json::from_value(operation(&op)).unwrap()];
        }
        let p = w.provider(
            mesos_import::RP_TYPE,
            mesos_import::RP_NAME,
            mesos_import::RP_ID,
        );
        p.state(&rp_state);
        if i % 2 == 1 {
            let status = OperationStatus {
                state: OperationState::OperationFinished as i32,
                uuid: Some(slrp_proto::mesos::v1::Uuid {
                    value: op.as_bytes().to_vec(),
                }),
                converted_resources: vec![resource(mount_disk("vol-2", 100.0))],
                ..OperationStatus::default()
            };
            let mut s = p.stream(op);
            s.update(status).ack(op);
            if i == 3 {
                s.torn_tail(3);
            }
        }
        let volume = MesosVolume {
            state: state as i32,
            volume_capability: Some(mount_cap.clone()),
            parameters: HashMap::from([("pool".to_owned(), "fast".to_owned())]),
            volume_context: HashMap::from([("ctx".to_owned(), "1".to_owned())]),
            publish_context: HashMap::from([("pc".to_owned(), "1".to_owned())]),
            boot_id: boot.to_owned(),
            ..MesosVolume::default()
        };
        w.volume(
            mesos_import::PLUGIN_TYPE,
            mesos_import::PLUGIN_NAME,
            "vol-1",
            &volume,
        );
        if i == 2 {
            w.volume(
                mesos_import::PLUGIN_TYPE,
                mesos_import::PLUGIN_NAME,
                "a b/c",
                &volume,
            );
        }
        out.push((
            format!("tree-{i}"),
            mesos_import::seed(i == 3, i == 1, w.root()),
        ));
    }
    out
}

/// Snapshot requests and a restore: the plugin's ids are random, so these name made-up
/// ones; the fuzzer's mutations of the lifecycle seed's answers reach the real ones.
fn v1_snapshot_calls() -> Vec<(&'static str, Vec<u8>)> {
    use slrp_proto::csi::v1 as c;
    let mount = c::VolumeCapability {
        access_type: Some(c::volume_capability::AccessType::Mount(
            c::volume_capability::MountVolume::default(),
        )),
        access_mode: Some(c::volume_capability::AccessMode { mode: 1 }),
    };
    vec![
        (
            "CreateSnapshot",
            c::CreateSnapshotRequest {
                source_volume_id: "vol-x".into(),
                name: "snap-name".into(),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "ListSnapshots",
            c::ListSnapshotsRequest {
                max_entries: 1,
                source_volume_id: "vol-x".into(),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "GetSnapshot",
            c::GetSnapshotRequest {
                snapshot_id: "snap-x".into(),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "CreateVolume",
            c::CreateVolumeRequest {
                name: "restored".into(),
                volume_capabilities: vec![mount],
                volume_content_source: Some(c::VolumeContentSource {
                    r#type: Some(c::volume_content_source::Type::Snapshot(
                        c::volume_content_source::SnapshotSource {
                            snapshot_id: "snap-x".into(),
                        },
                    )),
                }),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "DeleteSnapshot",
            c::DeleteSnapshotRequest {
                snapshot_id: "snap-x".into(),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
    ]
}

fn v1_calls() -> Vec<(&'static str, Vec<u8>)> {
    use slrp_proto::csi::v1 as c;
    let mount = c::VolumeCapability {
        access_type: Some(c::volume_capability::AccessType::Mount(
            c::volume_capability::MountVolume::default(),
        )),
        access_mode: Some(c::volume_capability::AccessMode { mode: 1 }),
    };
    let block = c::VolumeCapability {
        access_type: Some(c::volume_capability::AccessType::Block(
            c::volume_capability::BlockVolume {},
        )),
        access_mode: Some(c::volume_capability::AccessMode { mode: 1 }),
    };
    let params = |b: &str| {
        HashMap::from([
            ("backend".to_owned(), b.to_owned()),
            ("pool".to_owned(), "default".to_owned()),
        ])
    };
    vec![
        (
            "CreateVolume",
            c::CreateVolumeRequest {
                name: "v1".into(),
                volume_capabilities: vec![mount.clone()],
                capacity_range: Some(c::CapacityRange {
                    required_bytes: 1 << 20,
                    limit_bytes: 0,
                }),
                parameters: params("dir"),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "CreateVolume",
            c::CreateVolumeRequest {
                name: "v2".into(),
                volume_capabilities: vec![block.clone()],
                capacity_range: Some(c::CapacityRange {
                    required_bytes: 1 << 20,
                    limit_bytes: 0,
                }),
                parameters: params("loop"),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "ListVolumes",
            c::ListVolumesRequest {
                max_entries: 1,
                starting_token: String::new(),
            }
            .encode_to_vec(),
        ),
        (
            "GetCapacity",
            c::GetCapacityRequest {
                volume_capabilities: vec![mount.clone()],
                parameters: params("dir"),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "ValidateVolumeCapabilities",
            c::ValidateVolumeCapabilitiesRequest {
                volume_id: "vol-x".into(),
                volume_capabilities: vec![mount.clone()],
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "NodeStageVolume",
            c::NodeStageVolumeRequest {
                volume_id: "vol-x".into(),
                staging_target_path: "/staging/v".into(),
                volume_capability: Some(mount.clone()),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "NodePublishVolume",
            c::NodePublishVolumeRequest {
                volume_id: "vol-x".into(),
                staging_target_path: "/staging/v".into(),
                target_path: "/target/v".into(),
                volume_capability: Some(mount.clone()),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "NodeGetVolumeStats",
            c::NodeGetVolumeStatsRequest {
                volume_id: "vol-x".into(),
                volume_path: "/target/v".into(),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "NodeUnpublishVolume",
            c::NodeUnpublishVolumeRequest {
                volume_id: "vol-x".into(),
                target_path: "/target/v".into(),
            }
            .encode_to_vec(),
        ),
        (
            "NodeUnstageVolume",
            c::NodeUnstageVolumeRequest {
                volume_id: "vol-x".into(),
                staging_target_path: "/staging/v".into(),
            }
            .encode_to_vec(),
        ),
        (
            "DeleteVolume",
            c::DeleteVolumeRequest {
                volume_id: "vol-x".into(),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
    ]
}

#[test]
#[ignore = "writes the seed corpus; run by hand"]
fn write_seeds() {
    // agent_stream: each event alone and all in one stream, protobuf and JSON.
    let events: Vec<Event> = events()
        .into_iter()
        .map(|v| slrp_wire::json::from_value(v).unwrap())
        .collect();
    let proto: Vec<Vec<u8>> = events.iter().map(prost::Message::encode_to_vec).collect();
    let text: Vec<Vec<u8>> = events
        .iter()
        .map(|e| slrp_wire::json::to_vec(e).unwrap())
        .collect();
    write(
        "agent_stream",
        "proto-all",
        &agent_stream::seed(false, 7, &proto),
    );
    write(
        "agent_stream",
        "json-all",
        &agent_stream::seed(true, 3, &text),
    );
    for (i, (p, j)) in proto.iter().zip(&text).enumerate() {
        write(
            "agent_stream",
            &format!("proto-{i}"),
            &agent_stream::seed(false, 0, std::slice::from_ref(p)),
        );
        write(
            "agent_stream",
            &format!("json-{i}"),
            &agent_stream::seed(true, 31, std::slice::from_ref(j)),
        );
    }

    // provider_info: the example and the harness's fixture shape.
    let example = std::fs::read(root().join("examples/resource-providers/local.json")).unwrap();
    write("provider_info", "example-local", &example);
    write(
        "provider_info",
        "mesos-fixture",
        json!({
        "type": "org.apache.mesos.rp.local.storage", "name": "test",
        "default_reservations": [{"type": "DYNAMIC", "role": "storage"}],
        "storage": {"plugin": {"type": "org.apache.mesos.csi.test", "name": "local",
            "containers": [{"services": ["CONTROLLER_SERVICE", "NODE_SERVICE"],
                "command": {"shell": false, "value": "/usr/bin/slrp-csi-local",
                    "arguments": ["slrp-csi-local", "--endpoint=$CSI_ENDPOINT"]},
                "resources": [{"name": "cpus", "type": "SCALAR", "scalar": {"value": 0.1}}]}]},
            "reconciliation_interval_seconds": 0}})
        .to_string()
        .as_bytes(),
    );

    // profiles: the example, in Mesos's lenient dialect too, and a state file.
    let doc = std::fs::read(root().join("examples/profiles.json")).unwrap();
    write("profiles", "example", &prof::seed(false, &doc));
    write("profiles", "lenient", &prof::seed(false, b"{profile_matrix: {'fast': {csi_plugin_type_selector: {plugin_type: 'local',}, volume_capabilities: {mount: {fs_type: 'ext4', mount_flags: ['noatime',],}, access_mode: {mode: 'SINGLE_NODE_WRITER'}}, create_parameters: {pool: 'a\\'b',},},\n'sel': {resource_provider_selector: {resource_providers: [{type: 'org.apache.mesos.rp.local.storage', name: 'test'}]}, volume_capabilities: {block: {}, access_mode: {mode: 1}}}}}"));
    let mapping = slrp_profiles::ProfileMapping::parse(&doc).unwrap();
    write(
        "profiles",
        "state-file",
        &prof::seed(true, &slrp_profiles::fuzzing::state_file_of(&mapping)),
    );

    // daemon_config: the example and small ones.
    write(
        "daemon_config",
        "example",
        &std::fs::read(root().join("examples/slrp.toml")).unwrap(),
    );
    write("daemon_config", "run", b"state_dir = \"state\"\nplugins_on_exit = \"leave\"\nshutdown_grace = \"5s\"\n[agent]\nurl = \"http://127.0.0.1:5051\"\ntoken_file = \"agent.token\"\ncontent_type = \"json\"\nbackoff_base = \"100ms\"\nbackoff_max = \"1s\"\n[profiles]\nuri = \"profiles.json\"\npoll_interval = \"1s\"\nmax_document_bytes = 4096\n[retries]\nstatus_update_min = \"200ms\"\nstatus_update_max = \"1600ms\"\n[admin]\nlisten = \"127.0.0.1:9000\"\ntoken_file = \"admin.token\"\n[plugins]\nbackend = \"agent\"\nremove_sandboxes = \"files\"\n");
    write("daemon_config", "inline", b"[disk_profiles]\ninline = { profile_matrix = { fast = { csi_plugin_type_selector = { plugin_type = \"local\" }, volume_capabilities = { mount = {}, access_mode = { mode = \"SINGLE_NODE_WRITER\" } } } } }\n");

    // mesos_import: work directories as the import tests lay them out.
    for (name, bytes) in mesos_trees() {
        write("mesos_import", &name, &bytes);
    }

    // admin_api: every route.
    let routes: &[(bool, u8, &str, serde_json::Value)] = &[
        (false, 0, "/health", json!(null)),
        (false, 0, "/ready", json!(null)),
        (false, 0, "/status", json!(null)),
        (false, 0, "/resources", json!(null)),
        (false, 0, "/volumes", json!(null)),
        (false, 0, "/volumes/vol-1", json!(null)),
        (false, 0, "/operations", json!(null)),
        (
            false,
            0,
            "/operations/12345678-9abc-def0-1234-56789abcdef0",
            json!(null),
        ),
        (false, 0, "/profiles", json!(null)),
        (false, 0, "/plugins", json!(null)),
        (false, 0, "/metrics", json!(null)),
        (false, 0, "/metrics/snapshot", json!(null)),
        (
            true,
            1,
            "/disks",
            json!({"profile": "mount", "size_bytes": 67_108_864, "type": "mount", "wait": true, "timeout_seconds": 5}),
        ),
        (
            true,
            1,
            "/disks/destroy",
            json!({"volume_id": "vol-1", "provider": "org.apache.mesos.rp.local.storage.local"}),
        ),
        (true, 1, "/volumes/publish", json!({"volume_id": "vol-1"})),
        (
            false,
            1,
            "/volumes/unpublish",
            json!({"provider": "org.apache.mesos.rp.local.storage.local", "volume_id": "vol-1"}),
        ),
    ];
    for (i, (standalone, method, path, body)) in routes.iter().enumerate() {
        let body = if body.is_null() {
            Vec::new()
        } else {
            body.to_string().into_bytes()
        };
        write(
            "admin_api",
            &format!("route-{i:02}"),
            &admin_api::seed(*standalone, *method, path, &body),
        );
    }

    // manager_calls: both APIs, JSON and protobuf.
    for (i, c) in calls().into_iter().enumerate() {
        let call: Call = slrp_wire::json::from_value(c.clone()).unwrap();
        write(
            "manager_calls",
            &format!("rp-json-{i}"),
            &manager_calls::seed(true, false, c.to_string().as_bytes()),
        );
        write(
            "manager_calls",
            &format!("rp-proto-{i}"),
            &manager_calls::seed(false, false, &call.encode_to_vec()),
        );
    }
    for (i, c) in operator_calls().into_iter().enumerate() {
        let call: slrp_proto::mesos::v1::agent::Call =
            slrp_wire::json::from_value(c.clone()).unwrap();
        write(
            "manager_calls",
            &format!("op-json-{i}"),
            &manager_calls::seed(true, true, c.to_string().as_bytes()),
        );
        write(
            "manager_calls",
            &format!("op-proto-{i}"),
            &manager_calls::seed(false, true, &call.encode_to_vec()),
        );
    }

    // csi_answers: scripts of requests and answers.
    let id = |s: &str| {
        let mut v = vec![u8::try_from(s.len()).unwrap()];
        v.extend_from_slice(s.as_bytes());
        v
    };
    let mut create_publish = vec![0u8, 0x00, 0x00];
    create_publish.extend(id("vol-1"));
    create_publish.extend([0, 0, 16, 0, 0, 0, 0, 0, 1]);
    create_publish.extend(id("k"));
    create_publish.extend(id("v"));
    create_publish.extend([0x04, 0, 0, 0, 0x05, 0, 0, 0x06, 0, 0]);
    write("csi_answers", "create-publish-delete", &create_publish);
    let mut list = vec![1u8, 0x01, 0x00, 2];
    list.extend(id("vol-a"));
    list.extend([0; 9]);
    list.extend(id("vol-b"));
    list.extend([0; 9]);
    list.extend(id("next"));
    list.extend([0x00, 0]);
    list.extend(id(""));
    list.extend([
        0x02, 0x00, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x03, 0x00, 3,
    ]);
    write("csi_answers", "list-capacity-validate", &list);
    write(
        "csi_answers",
        "refusals",
        &[0, 0x10, 0x82, 0x00, 0x8d, 0x01, 0x85, 0x02, 0x83],
    );

    // csi_local: the lifecycle in v1 and v0.
    write(
        "csi_local",
        "v1-lifecycle",
        &csi_local::seed(false, &v1_calls()),
    );
    write(
        "csi_local",
        "v1-create",
        &csi_local::seed(false, &v1_calls()[..1]),
    );
    let mut with_snapshots = v1_calls()[..1].to_vec();
    with_snapshots.extend(v1_snapshot_calls());
    write(
        "csi_local",
        "v1-snapshots",
        &csi_local::seed(false, &with_snapshots),
    );
}
