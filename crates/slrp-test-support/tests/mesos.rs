//! The Mesos work-dir fixture writes Mesos's layout, and what it writes decodes back with
//! the checkpoint codecs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::path::Path;

use slrp_proto::mesos::csi::state::{VolumeState, volume_state};
use slrp_proto::mesos::internal::{UpdateOperationStatusRecord, update_operation_status_record};
use slrp_proto::mesos::resource_provider::ResourceProviderState;
use slrp_proto::mesos::v1::resource::ReservationInfo;
use slrp_proto::mesos::v1::resource::reservation_info::Type as ReservationType;
use slrp_proto::mesos::v1::{
    CsiPluginContainerInfo, OperationState, OperationStatus, Resource, csi_plugin_container_info,
    value,
};
use slrp_test_support::mesos::{MesosWorkDir, mesos_uuid};
use slrp_wire::checkpoint::{Tail, read_message, read_records, upgrade_message};
use uuid::Uuid;

const RP_TYPE: &str = "org.apache.mesos.rp.local.storage";
const PLUGIN_TYPE: &str = "org.apache.mesos.csi.test";

fn work_dir(root: &Path) -> MesosWorkDir {
    MesosWorkDir::new(root.join("work"))
        .agent("agent-1")
        .boot_id("boot-1")
}

fn read<M: prost::Message + prost::Name + Default>(path: &Path) -> M {
    read_message(&fs::read(path).unwrap()).unwrap().unwrap()
}

fn status(state: OperationState, uuid: Uuid) -> OperationStatus {
    OperationStatus {
        state: state as i32,
        uuid: Some(mesos_uuid(uuid)),
        ..OperationStatus::default()
    }
}

/// Whether `name` is a `mkstemp` name: `prefix` then six alphanumerics.
fn is_mkstemp(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix)
        .is_some_and(|rest| rest.len() == 6 && rest.bytes().all(|b| b.is_ascii_alphanumeric()))
}

#[test]
fn agent_and_provider_links_are_absolute_and_name_the_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let work = work_dir(tmp.path());
    let root = work.root().to_owned();
    assert!(root.is_absolute());
    assert_eq!(
        fs::read_to_string(root.join("meta/boot_id")).unwrap(),
        "boot-1"
    );

    let latest = fs::read_link(root.join("meta/slaves/latest")).unwrap();
    assert_eq!(latest, root.join("meta/slaves/agent-1"));
    assert!(latest.is_dir());

    let provider = work.provider(RP_TYPE, "lvm", "rp-1");
    let link = root.join(format!(
        "meta/slaves/agent-1/resource_providers/{RP_TYPE}/lvm/latest"
    ));
    assert_eq!(provider.latest_path(), link);
    let target = fs::read_link(&link).unwrap();
    assert!(target.is_absolute());
    // Mesos takes the provider id from the basename of latest's realpath.
    let real = fs::canonicalize(&link).unwrap();
    assert_eq!(real.file_name().unwrap(), "rp-1");
    assert_eq!(real, provider.dir());

    // A new agent id moves `latest`; the old agent's directory stays.
    let work = work.agent("agent-2");
    assert_eq!(
        fs::read_link(root.join("meta/slaves/latest")).unwrap(),
        root.join("meta/slaves/agent-2")
    );
    assert!(root.join("meta/slaves/agent-1").is_dir());
    assert_eq!(work.agent_dir(), root.join("meta/slaves/agent-2"));
}

#[test]
fn provider_state_is_written_downgraded_and_upgrades_back() {
    let tmp = tempfile::tempdir().unwrap();
    let work = work_dir(tmp.path());
    let provider = work.provider(RP_TYPE, "lvm", "rp-1");
    let unreserved = Resource {
        name: "disk".into(),
        r#type: value::Type::Scalar as i32,
        scalar: Some(value::Scalar { value: 10.0 }),
        ..Resource::default()
    };
    let reserved = Resource {
        reservations: vec![ReservationInfo {
            r#type: Some(ReservationType::Dynamic as i32),
            role: Some("storage".into()),
            principal: Some("ops".into()),
            labels: None,
        }],
        ..unreserved.clone()
    };
    let state = ResourceProviderState {
        resources: vec![unreserved, reserved],
        ..ResourceProviderState::default()
    };
    provider.state(state.clone());

    let path = provider.state_path();
    assert_eq!(path, provider.dir().join("resource_provider.state"));
    let mut stored: ResourceProviderState = read(&path);
    assert_eq!(stored.resources[0].role.as_deref(), Some("*"));
    assert_eq!(stored.resources[1].role.as_deref(), Some("storage"));
    assert!(stored.resources[1].reservations.is_empty());
    assert_eq!(
        stored.resources[1]
            .reservation
            .as_ref()
            .unwrap()
            .principal
            .as_deref(),
        Some("ops")
    );
    upgrade_message(&mut stored).unwrap();
    assert_eq!(stored, state);
    // The atomic write left no temporary file behind.
    let names: Vec<_> = fs::read_dir(provider.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["resource_provider.state"]);
}

#[test]
fn stream_records_are_updates_and_acks_as_mesos_appends_them() {
    let tmp = tempfile::tempdir().unwrap();
    let work = work_dir(tmp.path());
    let provider = work.provider(RP_TYPE, "lvm", "rp-1");
    let op = Uuid::new_v4();
    let (pending, finished) = (Uuid::new_v4(), Uuid::new_v4());
    let mut stream = provider.stream(op);
    stream
        .update(status(OperationState::OperationPending, pending))
        .update(status(OperationState::OperationFinished, finished))
        .ack(pending);

    assert_eq!(
        stream.path(),
        provider
            .dir()
            .join("operations")
            .join(op.hyphenated().to_string())
            .join("operation.updates")
    );
    let read = read_records::<UpdateOperationStatusRecord>(&fs::read(stream.path()).unwrap());
    assert_eq!(read.tail, Tail::Clean);
    let kinds: Vec<_> = read.records.iter().map(|r| r.r#type()).collect();
    use update_operation_status_record::Type::{Ack, Update};
    assert_eq!(kinds, [Update, Update, Ack]);
    let first = read.records[0].update.as_ref().unwrap();
    assert_eq!(first.slave_id.as_ref().unwrap().value, "agent-1");
    assert_eq!(first.operation_uuid, Some(mesos_uuid(op)));
    assert_eq!(
        first.status,
        status(OperationState::OperationPending, pending)
    );
    assert_eq!(first.latest_status, None);
    assert_eq!(read.records[2].uuid, Some(mesos_uuid(pending)));
    assert_eq!(read.records[2].update, None);
}

#[test]
fn a_stream_with_no_record_has_a_directory_and_no_file() {
    let tmp = tempfile::tempdir().unwrap();
    let work = work_dir(tmp.path());
    let stream = work.provider(RP_TYPE, "lvm", "rp-1").stream(Uuid::new_v4());
    assert!(stream.path().parent().unwrap().is_dir());
    assert!(!stream.path().exists());
}

#[test]
fn torn_tails_tear_the_prefix_or_the_body() {
    let tmp = tempfile::tempdir().unwrap();
    let work = work_dir(tmp.path());
    let provider = work.provider(RP_TYPE, "lvm", "rp-1");
    for (bytes, want) in [(2, 4), (10, 26)] {
        let mut stream = provider.stream(Uuid::new_v4());
        stream
            .update(status(OperationState::OperationPending, Uuid::new_v4()))
            .torn_tail(bytes);
        let data = fs::read(stream.path()).unwrap();
        let read = read_records::<UpdateOperationStatusRecord>(&data);
        assert_eq!(read.records.len(), 1);
        let offset = data.len() - bytes;
        assert_eq!(
            read.tail,
            Tail::Torn {
                offset,
                have: bytes,
                want
            }
        );
    }
}

#[test]
fn corrupt_record_is_a_whole_message_that_is_not_a_record() {
    let tmp = tempfile::tempdir().unwrap();
    let work = work_dir(tmp.path());
    let mut stream = work.provider(RP_TYPE, "lvm", "rp-1").stream(Uuid::new_v4());
    stream
        .update(status(OperationState::OperationFinished, Uuid::new_v4()))
        .corrupt_record();
    let data = fs::read(stream.path()).unwrap();
    let read = read_records::<UpdateOperationStatusRecord>(&data);
    assert_eq!(read.records.len(), 1);
    match read.tail {
        Tail::Corrupt { offset, .. } => assert_eq!(offset, read.good_len),
        other => panic!("expected a corrupt tail, got {other:?}"),
    }
    // The appended record is the bare update, length prefix and all.
    let rest = &data[read.good_len..];
    let message: slrp_proto::mesos::internal::UpdateOperationStatusMessage =
        read_message(rest).unwrap().unwrap();
    assert_eq!(&message, read.records[0].update.as_ref().unwrap());
}

#[test]
fn volume_state_lives_under_the_percent_encoded_id() {
    let tmp = tempfile::tempdir().unwrap();
    let work = work_dir(tmp.path());
    let state = VolumeState {
        state: volume_state::State::VolReady as i32,
        boot_id: "boot-1".into(),
        ..VolumeState::default()
    };
    let path = work.volume(PLUGIN_TYPE, "lvm", "vg/lv 1:%", &state);
    // Mesos's encoding (spec §8.2): `/`, ` `, `:` and `%` as upper-case %XX.
    assert_eq!(
        path,
        work.root()
            .join("csi")
            .join(PLUGIN_TYPE)
            .join("lvm/volumes/vg%2Flv%201%3A%25/volume.state")
    );
    assert_eq!(read::<VolumeState>(&path), state);

    let (staging, target) = work.mount_dirs(PLUGIN_TYPE, "lvm", "vg/lv 1:%");
    let mounts = work
        .plugin_dir(PLUGIN_TYPE, "lvm")
        .join("mounts/vg%2Flv%201%3A%25");
    assert_eq!(
        (staging, target),
        (mounts.join("staging"), mounts.join("target"))
    );
    assert!(mounts.join("target").is_dir());
}

#[test]
fn container_info_and_endpoint_link() {
    let tmp = tempfile::tempdir().unwrap();
    let work = work_dir(tmp.path()).temp_dir(tmp.path().join("tmpdir"));
    let info = CsiPluginContainerInfo {
        services: vec![csi_plugin_container_info::Service::NodeService as i32],
        ..CsiPluginContainerInfo::default()
    };
    let cid = "org-apache-mesos-rp-local-storage-lvm--org-apache-mesos-csi-test-lvm--NODE_SERVICE";
    let dir = work.container(PLUGIN_TYPE, "lvm", cid, &info);
    assert_eq!(
        dir,
        work.plugin_dir(PLUGIN_TYPE, "lvm")
            .join("containers")
            .join(cid)
    );
    assert_eq!(
        read::<CsiPluginContainerInfo>(&dir.join("container.info")),
        info
    );
    let endpoint = fs::read_link(dir.join("endpoint")).unwrap();
    assert_eq!(endpoint.parent().unwrap(), tmp.path().join("tmpdir"));
    assert!(endpoint.is_dir());
    let name = endpoint.file_name().unwrap().to_str().unwrap();
    assert!(is_mkstemp(name, "mesos-csi-"), "{name}");
}

#[test]
fn temp_leftovers_have_mkstemp_names() {
    let tmp = tempfile::tempdir().unwrap();
    let work = work_dir(tmp.path());
    let provider = work.provider(RP_TYPE, "lvm", "rp-1");
    let leftover = work.temp_leftover(provider.dir());
    assert_eq!(leftover.parent().unwrap(), provider.dir());
    let name = leftover.file_name().unwrap().to_str().unwrap();
    assert!(is_mkstemp(name, ""), "{name}");
    assert!(!fs::read(&leftover).unwrap().is_empty());
}
