//! Fault injection through `--faults-file`, as the provider's retry and supervision tests
//! will use it.

// An integration test crate is test code throughout: helpers fail by panicking, and the
// tests need no `mod tests` wrapper (the lint targets test code hidden in src/).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::tests_outside_test_module
)]

mod common;

use common::*;
use slrp_proto::csi::v1;
use tonic::Code;

fn rules_left(p: &TestPlugin) -> Vec<serde_json::Value> {
    serde_json::from_slice(&std::fs::read(&p.faults).unwrap()).unwrap()
}

#[tokio::test]
async fn fail_the_next_n_calls_then_succeed() {
    let p = TestPlugin::start(&[]).await;
    p.write_faults(
        r#"[{"rpc": "CreateVolume", "fail": "UNAVAILABLE", "message": "try later", "times": 2}]"#,
    );
    let mut c = p.v1().await;
    for _ in 0..2 {
        let err = c
            .controller
            .create_volume(create_req("f", MIB, mount_cap(""), &[]))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unavailable);
        assert_eq!(err.message(), "try later");
    }
    // Other RPCs were never affected.
    c.identity.probe(v1::ProbeRequest {}).await.unwrap();
    c.controller
        .create_volume(create_req("f", MIB, mount_cap(""), &[]))
        .await
        .unwrap();
    assert!(rules_left(&p).is_empty());
}

#[tokio::test]
async fn wildcard_rules_and_file_changes_apply_immediately() {
    let p = TestPlugin::start(&[]).await;
    let mut c = p.v1().await;
    p.write_faults(r#"[{"rpc": "*", "fail": "INTERNAL", "message": "boom"}]"#);
    assert_code(c.identity.probe(v1::ProbeRequest {}).await, Code::Internal);
    assert_code(
        c.node.node_get_info(v1::NodeGetInfoRequest {}).await,
        Code::Internal,
    );
    // A malformed file is ignored (logged), never a crash.
    p.write_faults("[{\"rpc\": ");
    c.identity.probe(v1::ProbeRequest {}).await.unwrap();
    p.write_faults("[]");
    c.identity.probe(v1::ProbeRequest {}).await.unwrap();
}

#[tokio::test]
async fn delay_is_applied_before_handling() {
    let p = TestPlugin::start(&[]).await;
    let mut c = p.v1().await;
    p.write_faults(r#"[{"rpc": "Probe", "delay_ms": 3000}]"#);
    // The delay shows as a missed deadline; no wall-clock measurement needed.
    let mut req = tonic::Request::new(v1::ProbeRequest {});
    req.set_timeout(std::time::Duration::from_millis(200));
    let err = c.identity.probe(req).await.unwrap_err();
    assert!(
        matches!(err.code(), Code::Cancelled | Code::DeadlineExceeded),
        "{err:?}"
    );
    p.write_faults("[]");
    c.identity.probe(v1::ProbeRequest {}).await.unwrap();
}

#[tokio::test]
async fn exit_crashes_once_and_the_count_survives_the_restart() {
    let mut p = TestPlugin::start(&[]).await;
    let mut c = p.v1().await;
    let vol = c
        .controller
        .create_volume(create_req("e", MIB, mount_cap(""), &[]))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    p.write_faults(r#"[{"rpc": "DeleteVolume", "exit": true, "times": 1}]"#);
    let err = c
        .controller
        .delete_volume(v1::DeleteVolumeRequest {
            volume_id: vol.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    // The connection breaks without a reply; tonic reports that as either code.
    assert!(
        matches!(err.code(), Code::Unavailable | Code::Unknown),
        "{err:?}"
    );
    let status = p.wait_exit().await;
    assert_eq!(status.code(), Some(1));
    assert!(
        rules_left(&p).is_empty(),
        "the used rule must be gone before the crash"
    );
    p.spawn().await;
    let mut c = p.v1().await;
    // The volume was not touched by the crashed call; deleting it now works.
    c.controller
        .delete_volume(v1::DeleteVolumeRequest {
            volume_id: vol.volume_id,
            ..Default::default()
        })
        .await
        .unwrap();
}

/// `(id, context)` of every entry of one v1 ListVolumes page.
async fn listed_v1(c: &mut V1) -> Vec<(String, std::collections::HashMap<String, String>)> {
    c.controller
        .list_volumes(v1::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries
        .into_iter()
        .map(|e| {
            let v = e.volume.unwrap();
            (v.volume_id, v.volume_context)
        })
        .collect()
}

#[tokio::test]
async fn list_volumes_can_list_a_volume_twice_and_report_another_context() {
    let p = TestPlugin::start(&[]).await;
    let mut c = p.v1().await;
    let id = c
        .controller
        .create_volume(create_req("dup", MIB, mount_cap(""), &[]))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    let own = listed_v1(&mut c).await;
    assert_eq!(own.len(), 1, "off unless configured: {own:?}");

    // RecoverDuplicatedVolumes: the same volume twice in one answer.
    p.write_faults(r#"[{"rpc": "ListVolumes", "duplicate_entries": true}]"#);
    let twice = listed_v1(&mut c).await;
    assert_eq!(twice, vec![own[0].clone(), own[0].clone()]);

    // RecoverDiskWithChangedMetadata: `label=bar` instead of the volume's own context, for
    // the selected volume only; the records keep the real context.
    p.write_faults(&format!(
        r#"[{{"rpc": "ListVolumes", "volume_context": {{"label": "bar"}}, "volume_id": "{id}"}}]"#
    ));
    let changed = listed_v1(&mut c).await;
    assert_eq!(changed.len(), 1);
    assert_eq!(
        changed[0].1,
        std::collections::HashMap::from([("label".to_owned(), "bar".to_owned())])
    );
    p.write_faults("[]");
    assert_eq!(listed_v1(&mut c).await, own);
}

#[tokio::test]
async fn list_volume_edits_apply_to_v0_attributes_too() {
    use slrp_proto::csi::v0;
    let p = TestPlugin::start(&["--csi-version", "v0"]).await;
    let mut c = p.v0().await;
    std::fs::create_dir_all(p.path("root/import/dir/old")).unwrap();
    p.write_faults(
        r#"[{"rpc": "ListVolumes", "duplicate_entries": true, "volume_context": {"label": "foo"}}]"#,
    );
    let entries = c
        .controller
        .list_volumes(v0::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries;
    let got: Vec<_> = entries
        .into_iter()
        .map(|e| {
            let v = e.volume.unwrap();
            (v.id, v.attributes)
        })
        .collect();
    let foo = std::collections::HashMap::from([("label".to_owned(), "foo".to_owned())]);
    assert_eq!(
        got,
        vec![
            ("import-dir-old".to_owned(), foo.clone()),
            ("import-dir-old".to_owned(), foo)
        ]
    );
}
