//! The client refuses, skips or repairs plugin answers as `slrp_csi::answer` says, over
//! a real socket (the scripted in-process plugin): what a caller gets, what is counted,
//! and what is logged.

#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used
)]

mod support;

use std::collections::HashMap;

use prometheus_client::registry::Registry;
use slrp_csi::*;
use slrp_proto::csi::v1 as pb1;
use support::{FakePlugin, Serve};
use tonic::{Code, Status};

fn client(p: &FakePlugin, limits: AnswerLimits) -> (CsiClient, CsiMetrics) {
    let metrics = CsiMetrics::register(&mut Registry::default());
    let cfg = ClientConfig::default()
        .version(VersionSelect::Force(CsiVersion::V1))
        .limits(limits);
    let c = CsiClient::new(
        CsiEndpoint::from_path(&p.socket).unwrap(),
        cfg,
        metrics.clone(),
    )
    .unwrap();
    (c, metrics)
}

fn create(required: i64, limit: i64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: "op-1".into(),
        required_bytes: required,
        limit_bytes: limit,
        capabilities: vec![VolumeCapability::mount_default()],
        parameters: StringMap::new(),
        secrets: Secrets::default(),
        content_source: None,
    }
}

fn answer_volume(p: &FakePlugin, id: &str, capacity: i64, context: HashMap<String, String>) {
    p.script.reply(
        "CreateVolume",
        pb1::CreateVolumeResponse {
            volume: Some(pb1::Volume {
                volume_id: id.into(),
                capacity_bytes: capacity,
                volume_context: context,
                ..Default::default()
            }),
        },
    );
}

fn entry(id: &str, capacity: i64) -> pb1::list_volumes_response::Entry {
    pb1::list_volumes_response::Entry {
        volume: Some(pb1::Volume {
            volume_id: id.into(),
            capacity_bytes: capacity,
            ..Default::default()
        }),
        status: None,
    }
}

const MIB: i64 = 1 << 20;

/// The rule a refused answer broke.
fn violation_of(err: &CsiError) -> Option<&Violation> {
    match err {
        CsiError::InvalidResponse { violation, .. } => Some(violation),
        _ => None,
    }
}

type Context = HashMap<String, String>;

#[tokio::test]
async fn a_refused_create_answer_names_the_volume_to_delete_when_it_can() {
    // (id, capacity, context entries, rule, whether the id can be sent back)
    let big_context: HashMap<String, String> = (0..5000)
        .map(|i| (format!("k{i}"), "v".repeat(400)))
        .collect();
    let table: Vec<(String, i64, Context, &str, bool)> = vec![
        ("v1".into(), i64::MAX, HashMap::new(), "above_limit", true),
        ("v2".into(), MIB / 2, HashMap::new(), "below_required", true),
        ("v3".into(), -1, HashMap::new(), "negative", true),
        ("v\0nul".into(), MIB, HashMap::new(), "bad_character", true),
        ("x".repeat(10_000), MIB, HashMap::new(), "too_long", true),
        (String::new(), MIB, HashMap::new(), "empty", false),
        ("v4".into(), MIB, big_context, "map_too_large", true),
    ];
    for (id, capacity, context, rule, usable) in table {
        let p = FakePlugin::start(Serve::V1).await;
        answer_volume(&p, &id, capacity, context);
        let (c, metrics) = client(&p, AnswerLimits::default());
        let err = c.create_volume(&create(MIB, MIB)).await.unwrap_err();
        let CsiError::InvalidResponse {
            rpc,
            violation,
            created,
        } = &err
        else {
            panic!("{rule}: {err:?}");
        };
        assert_eq!(*rpc, CsiRpc::CreateVolume);
        assert_eq!(violation.rule(), rule);
        assert_eq!(
            created.as_ref().map(VolumeId::as_str),
            usable.then_some(id.as_str()),
            "{rule}"
        );
        // The plugin may have created it: a caller keeps what it knows until settled.
        assert!(err.may_have_taken_effect(), "{rule}");
        assert_eq!(err.retry_class(), RetryClass::Permanent, "{rule}");
        assert_eq!(
            metrics.answer_violations(CsiRpc::CreateVolume, rule),
            1,
            "{rule}"
        );
        assert_eq!(metrics.failed(CsiRpc::CreateVolume), 1, "{rule}");
        // The message never carries the offending value.
        assert!(err.to_string().len() < 200, "{rule}: {err}");
    }
}

#[tokio::test]
async fn a_create_answer_within_the_range_is_taken() {
    let p = FakePlugin::start(Serve::V1).await;
    answer_volume(&p, "v", MIB, HashMap::from([("k".into(), "v".into())]));
    let (c, metrics) = client(&p, AnswerLimits::default());
    let v = c.create_volume(&create(MIB, MIB)).await.unwrap();
    assert_eq!((v.volume_id.as_str(), v.capacity_bytes), ("v", MIB));
    assert_eq!(metrics.finished(CsiRpc::CreateVolume), 1);
}

#[tokio::test]
async fn bad_list_entries_are_skipped_and_negative_sizes_read_as_unknown() {
    let p = FakePlugin::start(Serve::V1).await;
    p.script.reply(
        "ListVolumes",
        pb1::ListVolumesResponse {
            entries: vec![
                entry("good", MIB),
                entry("", MIB),
                pb1::list_volumes_response::Entry {
                    volume: None,
                    status: None,
                },
                entry("bad\0id", MIB),
                entry("negative", -7),
            ],
            next_token: String::new(),
        },
    );
    let (c, metrics) = client(&p, AnswerLimits::default());
    let log = slrp_log::MemoryWriter::default();
    let _guard = tracing::subscriber::set_default(slrp_log::subscriber(
        slrp_log::LogFormat::Text,
        tracing_subscriber::EnvFilter::new("warn"),
        false,
        log.clone(),
    ));
    for round in 1..=3 {
        let all = c.list_volumes(0).await.unwrap();
        let got: Vec<_> = all
            .iter()
            .map(|v| (v.volume_id.as_str().to_owned(), v.capacity_bytes))
            .collect();
        assert_eq!(
            got,
            vec![("good".to_owned(), MIB), ("negative".to_owned(), 0)]
        );
        for rule in ["empty", "missing", "bad_character", "negative"] {
            assert_eq!(
                metrics.answer_violations(CsiRpc::ListVolumes, rule),
                round,
                "{rule}"
            );
        }
    }
    assert_eq!(metrics.finished(CsiRpc::ListVolumes), 3);
    // Warned once per rule over three listings, not once per entry and listing.
    let text = log.text();
    for rule in ["empty", "missing", "bad_character", "negative"] {
        assert_eq!(
            text.matches(&format!("rule=\"{rule}\"")).count(),
            1,
            "{rule}:\n{text}"
        );
    }
    assert_eq!(text.lines().count(), 4, "{text}");
}

#[tokio::test]
async fn a_listing_with_new_tokens_forever_ends_at_its_bound() {
    let p = FakePlugin::start(Serve::V1).await;
    p.script
        .reply_with("ListVolumes", |r: &pb1::ListVolumesRequest| {
            let n: u64 = r.starting_token.parse().unwrap_or(0);
            Ok(pb1::ListVolumesResponse {
                entries: vec![entry(&format!("v{n}"), MIB)],
                next_token: (n + 1).to_string(),
            })
        });
    let limits = AnswerLimits {
        max_list_pages: 50,
        ..AnswerLimits::default()
    };
    let (c, metrics) = client(&p, limits);
    let err = c.list_volumes(0).await.unwrap_err();
    assert!(
        matches!(violation_of(&err), Some(Violation::Listing { max: 50, .. })),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "ListVolumes returned an answer slrp refuses: the listing passed 50 pages (setting csi.max_list_pages)"
    );
    assert_eq!(
        p.script
            .requests::<pb1::ListVolumesRequest>("ListVolumes")
            .len(),
        51
    );
    assert_eq!(
        metrics.answer_violations(CsiRpc::ListVolumes, "too_many_pages"),
        1
    );
}

#[tokio::test]
async fn a_page_token_over_the_bound_is_refused() {
    let p = FakePlugin::start(Serve::V1).await;
    p.script.reply(
        "ListVolumes",
        pb1::ListVolumesResponse {
            entries: vec![entry("v", MIB)],
            next_token: "t".repeat(DEFAULT_STRING + 1),
        },
    );
    let (c, _) = client(&p, AnswerLimits::default());
    let err = c.list_volumes_page(0, None).await.unwrap_err();
    assert!(
        matches!(
            violation_of(&err),
            Some(Violation::TooLong {
                field: "next_token",
                ..
            })
        ),
        "{err:?}"
    );
}

const DEFAULT_STRING: usize = slrp_csi::answer::DEFAULT_MAX_STRING_BYTES;

#[tokio::test]
async fn a_negative_capacity_is_no_space_and_counted() {
    let p = FakePlugin::start(Serve::V1).await;
    p.script.reply(
        "GetCapacity",
        pb1::GetCapacityResponse {
            available_capacity: -1,
            maximum_volume_size: Some(-2),
            minimum_volume_size: None,
        },
    );
    let (c, metrics) = client(&p, AnswerLimits::default());
    let cap = c.capacity(&[], &StringMap::new()).await.unwrap();
    assert_eq!((cap.available_bytes, cap.maximum_volume_size), (0, None));
    assert_eq!(
        metrics.answer_violations(CsiRpc::GetCapacity, "negative"),
        2
    );
}

#[tokio::test]
async fn a_long_error_message_is_cut_to_the_string_bound() {
    let p = FakePlugin::start(Serve::V1).await;
    p.script
        .reply_with("DeleteVolume", |_: &pb1::DeleteVolumeRequest| {
            Err::<pb1::DeleteVolumeResponse, _>(Status::new(Code::Internal, "e".repeat(10_000)))
        });
    let (c, _) = client(&p, AnswerLimits::default());
    let err = c
        .delete_volume(&VolumeId::new("v"), &Secrets::default())
        .await
        .unwrap_err();
    let CsiError::Rpc { source, code, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(*code, Code::Internal);
    assert!(
        source.message().len() < DEFAULT_STRING + 64,
        "{}",
        source.message().len()
    );
    assert!(
        source.message().ends_with("(cut at 4096 of 10000 bytes)"),
        "{}",
        &source.message()[4000..]
    );
}

#[tokio::test]
async fn oversized_maps_in_other_answers_are_refused() {
    let p = FakePlugin::start(Serve::V1).await;
    let big: HashMap<String, String> = HashMap::from([("k".into(), "v".repeat(20_000))]);
    p.script.reply(
        "GetPluginInfo",
        pb1::GetPluginInfoResponse {
            name: "hostile.slrp.io".into(),
            vendor_version: "1".into(),
            manifest: big.clone(),
        },
    );
    p.script.reply(
        "ControllerPublishVolume",
        pb1::ControllerPublishVolumeResponse {
            publish_context: big,
        },
    );
    let (c, _) = client(&p, AnswerLimits::default());
    let err = c.plugin_info().await.unwrap_err();
    assert!(
        matches!(
            violation_of(&err),
            Some(Violation::MapTooLarge {
                field: "manifest",
                ..
            })
        ),
        "{err:?}"
    );
    let req = ControllerPublishRequest {
        volume_id: VolumeId::new("v"),
        node_id: "n".into(),
        capability: VolumeCapability::mount_default(),
        readonly: false,
        volume_context: StringMap::new(),
        secrets: Secrets::default(),
    };
    let err = c.controller_publish(&req).await.unwrap_err();
    assert!(
        matches!(
            violation_of(&err),
            Some(Violation::MapTooLarge {
                field: "publish_context",
                ..
            })
        ),
        "{err:?}"
    );
}
