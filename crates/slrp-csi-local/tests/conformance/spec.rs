//! Capabilities csi-sanity skips, and CSI spec rules it does not check.

use super::*;

// ===================== Capabilities csi-sanity skips for this plugin =====================

/// The csi-sanity cases skipped for this plugin's capabilities (ControllerPublish/Unpublish,
/// ModifyVolume, group snapshots) hit RPCs it answers with UNIMPLEMENTED, the code the
/// spec gives a CO that calls what is not advertised.
#[tokio::test]
async fn sanity_skipped_capabilities_answer_unimplemented() {
    let mut s = Sanity::start().await;
    let ctl = &mut s.c.controller;
    code_is(
        ctl.controller_publish_volume(v1::ControllerPublishVolumeRequest::default())
            .await,
        Code::Unimplemented,
    );
    code_is(
        ctl.controller_unpublish_volume(v1::ControllerUnpublishVolumeRequest::default())
            .await,
        Code::Unimplemented,
    );
    code_is(
        ctl.controller_modify_volume(v1::ControllerModifyVolumeRequest::default())
            .await,
        Code::Unimplemented,
    );
    // The group controller service is not served at all.
    let ch = s.p.channel().await.unwrap();
    let mut group = v1::group_controller_client::GroupControllerClient::new(ch);
    code_is(
        group
            .group_controller_get_capabilities(v1::GroupControllerGetCapabilitiesRequest {})
            .await,
        Code::Unimplemented,
    );
    s.cleanup().await;
}

// ===================== Spec rules beyond csi-sanity =====================

/// CreateVolume name: "Any Unicode string … except those containing … U+0000-U+0008,
/// U+000B, U+000C, U+000E-U+001F, U+007F-U+009F" (INVALID_ARGUMENT); common whitespace and
/// other Unicode are fine.
#[tokio::test]
async fn spec_create_volume_name_characters() {
    let mut s = Sanity::start().await;
    for bad in [
        "nul\u{0}x",
        "bell\u{7}",
        "vt\u{b}",
        "esc\u{1b}[0m",
        "del\u{7f}",
        "c1\u{85}",
    ] {
        let req = s.create_req(bad);
        code_is(s.create(req).await, Code::InvalidArgument);
    }
    for good in ["tab\there", "line\nbreak\r", "ünïcødé ✓", "../../etc"] {
        let req = s.create_req(good);
        s.create(req)
            .await
            .unwrap_or_else(|e| panic!("{good:?}: {e:?}"));
    }
    s.cleanup().await;
}

/// CreateVolume `mutable_parameters` "SHALL NOT be specified unless the SP has the
/// MODIFY_VOLUME plugin capability": an unsupported field is INVALID_ARGUMENT, not ignored.
#[tokio::test]
async fn spec_create_volume_refuses_mutable_parameters() {
    let mut s = Sanity::start().await;
    let mut req = s.create_req("mutable");
    req.mutable_parameters = HashMap::from([("XXX_FakeKey".into(), "XXX_FakeValue".into())]);
    code_is(s.create(req).await, Code::InvalidArgument);
    assert!(s.created.is_empty());
    s.cleanup().await;
}

/// CapacityRange: 0 means unspecified; the volume is at least `required_bytes` and at most
/// `limit_bytes`; required > limit or negative values are INVALID_ARGUMENT; a limit the
/// backend cannot meet is OUT_OF_RANGE.
#[tokio::test]
async fn spec_capacity_range_semantics() {
    let mut s = Sanity::start().await;
    let sized = |name: &str, required_bytes: i64, limit_bytes: i64, params: &[(&str, &str)]| {
        let mut r = s.create_req(name);
        r.capacity_range = Some(v1::CapacityRange {
            required_bytes,
            limit_bytes,
        });
        r.parameters = params
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        r
    };
    let reqs = [
        sized("zero", 0, 0, &[]),
        sized("limit-only", 0, 100 << 20, &[]),
        sized("both", 3 << 20, 5 << 20, &[]),
        sized("loop-round", (8 << 20) + 1, 0, &[("backend", "loop")]),
        sized("loop-limit", 0, (9 << 20) + 7, &[("backend", "loop")]),
    ];
    let bad = [
        (
            sized("inverted", 5 << 20, 3 << 20, &[]),
            Code::InvalidArgument,
        ),
        (sized("negative", -1, 0, &[]), Code::InvalidArgument),
        (sized("negative-limit", 0, -1, &[]), Code::InvalidArgument),
        // ext4 needs 8 MiB; a 1 MiB limit cannot be honoured.
        (
            sized("too-small", 0, 1 << 20, &[("backend", "loop")]),
            Code::OutOfRange,
        ),
    ];
    let mut sizes = Vec::new();
    for r in reqs {
        let (lim, req) = r
            .capacity_range
            .map(|c| (c.limit_bytes, c.required_bytes))
            .unwrap();
        let v = s.create(r).await.unwrap();
        assert!(v.capacity_bytes >= req, "{v:?}");
        assert!(lim == 0 || v.capacity_bytes <= lim, "{v:?}");
        sizes.push(v.capacity_bytes);
    }
    assert_eq!(sizes[0], 1 << 30, "no range: the documented default");
    assert_eq!(
        sizes[1],
        100 << 20,
        "limit only: the default capped by the limit"
    );
    assert_eq!(
        sizes[3],
        (8 << 20) + 4096,
        "loop sizes are whole 4 KiB blocks"
    );
    assert_eq!(sizes[4], 9 << 20, "rounded down to stay within the limit");
    for (r, code) in bad {
        code_is(s.create(r).await, code);
    }
    s.cleanup().await;
}

/// ValidateVolumeCapabilities: `confirmed` only when every capability is supported and the
/// `volume_context` / `parameters` given are the volume's; `confirmed` echoes what was
/// validated; `mutable_parameters` (no MODIFY_VOLUME) are never confirmed. v0: the same
/// with `volume_attributes` and `supported`.
#[tokio::test]
async fn spec_validate_confirms_only_matching_context_and_parameters() {
    let mut s = Sanity::start().await;
    let mut req = s.create_req("validate");
    req.parameters = HashMap::from([("pool".into(), "default".into())]);
    let v = s.create(req).await.unwrap();
    let validate = |ctx: HashMap<String, String>,
                    params: HashMap<String, String>,
                    caps: Vec<v1::VolumeCapability>| {
        v1::ValidateVolumeCapabilitiesRequest {
            volume_id: v.volume_id.clone(),
            volume_context: ctx,
            volume_capabilities: caps,
            parameters: params,
            ..Default::default()
        }
    };
    let params = HashMap::from([("pool".to_owned(), "default".to_owned())]);
    let ok =
        s.c.controller
            .validate_volume_capabilities(validate(
                v.volume_context.clone(),
                params.clone(),
                vec![s.snw()],
            ))
            .await
            .unwrap()
            .into_inner()
            .confirmed
            .expect("matching context and parameters are confirmed");
    assert_eq!(ok.volume_context, v.volume_context);
    assert_eq!(ok.parameters, params);
    assert_eq!(ok.volume_capabilities, vec![s.snw()]);
    // Nothing optional given: nothing optional echoed.
    let bare =
        s.c.controller
            .validate_volume_capabilities(validate(HashMap::new(), HashMap::new(), vec![s.snw()]))
            .await
            .unwrap()
            .into_inner()
            .confirmed
            .unwrap();
    assert!(bare.volume_context.is_empty() && bare.parameters.is_empty());

    let mut wrong_ctx = v.volume_context.clone();
    wrong_ctx.insert("backend".into(), "loop".into());
    let wrong_params = HashMap::from([("pool".to_owned(), "other".to_owned())]);
    let mut mutable = validate(HashMap::new(), HashMap::new(), vec![s.snw()]);
    mutable.mutable_parameters = HashMap::from([("iops".into(), "100".into())]);
    let mut multi = s.snw();
    multi.access_mode = Some(v1::volume_capability::AccessMode {
        mode: Mode::MultiNodeMultiWriter as i32,
    });
    for req in [
        validate(wrong_ctx, HashMap::new(), vec![s.snw()]),
        validate(HashMap::new(), wrong_params, vec![s.snw()]),
        mutable,
        validate(HashMap::new(), HashMap::new(), vec![s.snw(), multi]),
    ] {
        let res =
            s.c.controller
                .validate_volume_capabilities(req)
                .await
                .unwrap()
                .into_inner();
        assert!(res.confirmed.is_none(), "{res:?}");
        assert!(!res.message.is_empty());
    }
    s.cleanup().await;

    // v0.
    let p = TestPlugin::start(&["--csi-version", "v0"]).await;
    let mut c = p.v0().await;
    let cap = v0_cap();
    let v = c
        .controller
        .create_volume(v0::CreateVolumeRequest {
            name: "validate".into(),
            volume_capabilities: vec![cap.clone()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let v0_validate = |attributes: HashMap<String, String>| v0::ValidateVolumeCapabilitiesRequest {
        volume_id: v.id.clone(),
        volume_capabilities: vec![cap.clone()],
        volume_attributes: attributes,
        ..Default::default()
    };
    let ok = c
        .controller
        .validate_volume_capabilities(v0_validate(v.attributes.clone()))
        .await
        .unwrap()
        .into_inner();
    assert!(ok.supported, "{}", ok.message);
    let mut wrong = v.attributes.clone();
    wrong.insert("backend".into(), "loop".into());
    let no = c
        .controller
        .validate_volume_capabilities(v0_validate(wrong))
        .await
        .unwrap()
        .into_inner();
    assert!(!no.supported && !no.message.is_empty());
}

/// capabilities"); a `limit_bytes` below the current size is OUT_OF_RANGE; asking for no
/// more than the volume has is OK.
#[tokio::test]
async fn spec_node_expand_capability_and_range() {
    if !can_mount("spec_node_expand_capability_and_range") {
        return;
    }
    let mut s = Sanity::start().await;
    let v = s.must_create("node-expand-rules").await;
    s.stage_and_publish(&v).await;
    let target = s.target();
    let expand = |cap: Option<v1::VolumeCapability>, required_bytes: i64, limit_bytes: i64| {
        v1::NodeExpandVolumeRequest {
            volume_id: v.volume_id.clone(),
            volume_path: target.clone(),
            capacity_range: Some(v1::CapacityRange {
                required_bytes,
                limit_bytes,
            }),
            volume_capability: cap,
            ..Default::default()
        }
    };
    code_is(
        s.c.node
            .node_expand_volume(expand(Some(block_cap()), SIZE, 0))
            .await,
        Code::InvalidArgument,
    );
    code_is(
        s.c.node.node_expand_volume(expand(None, 0, SIZE / 2)).await,
        Code::OutOfRange,
    );
    code_is(
        s.c.node.node_expand_volume(expand(None, 2 * SIZE, 0)).await,
        Code::OutOfRange,
    );
    let res =
        s.c.node
            .node_expand_volume(expand(Some(s.snw()), SIZE / 2, 0))
            .await
            .unwrap()
            .into_inner();
    assert_eq!(res.capacity_bytes, SIZE);
    s.cleanup().await;
}

/// Volume context "SHALL NOT be mutable … A volume … SHALL always report the same
/// volume_context": an imported image's file system type is learnt when it is first
/// staged, and must not change what ListVolumes reports.
#[tokio::test]
async fn spec_volume_context_never_changes() {
    if !can_mount("spec_volume_context_never_changes") || !has_tool("mkfs.ext4") {
        return;
    }
    let mut s = Sanity::start().await;
    let image = s.p.root.join("import/loop/data.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let mut loop_req = s.create_req("loop-created");
    loop_req.parameters = HashMap::from([("backend".into(), "loop".into())]);
    let created = s.create(loop_req).await.unwrap();
    let contexts = |s: &mut Sanity| {
        let mut c = s.c.controller.clone();
        async move {
            c.list_volumes(v1::ListVolumesRequest::default())
                .await
                .unwrap()
                .into_inner()
                .entries
                .into_iter()
                .map(|e| {
                    let v = e.volume.unwrap();
                    (v.volume_id, v.volume_context)
                })
                .collect::<HashMap<_, _>>()
        }
    };
    let before = contexts(&mut s).await;
    assert_eq!(before.len(), 2);
    assert_eq!(before[&created.volume_id], created.volume_context);
    let import = v1::Volume {
        volume_id: "import-loop-data".into(),
        volume_context: before["import-loop-data"].clone(),
        ..Default::default()
    };
    s.created.push(import.volume_id.clone());
    for v in [&import, &created] {
        s.stage_and_publish(v).await;
        let after = contexts(&mut s).await;
        assert_eq!(
            after, before,
            "staging {} changed a volume context",
            v.volume_id
        );
        s.cleanup_node(v).await;
    }
    s.cleanup().await;
}

/// Secrets "MUST be treated as such (not logged, etc.)", and `mount_flags` "MAY contain
/// sensitive information … MUST NOT leak": with the most verbose logging, neither appears
/// in the plugin's log nor in a status message, even when a mount with those flags fails.
#[tokio::test]
async fn spec_secrets_and_mount_flags_never_leak() {
    const SECRET: &str = "s3cret-Value-4711";
    const FLAG: &str = "hunter2-mount-flag";
    let p = TestPlugin::start_logged(&[], &[("RUST_LOG", "trace")]).await;
    let mut c = p.v1().await;
    let secrets = HashMap::from([("password".to_owned(), SECRET.to_owned())]);
    let mut req = create_req("secret", 16 * MIB, mount_cap(""), &[("backend", "loop")]);
    req.secrets = secrets.clone();
    let v = c
        .controller
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let mut messages = Vec::new();
    if can_mount("spec_secrets_and_mount_flags_never_leak (mount part)") && has_tool("mkfs.ext4") {
        let mut cap = mount_cap("");
        if let Some(v1::volume_capability::AccessType::Mount(m)) = &mut cap.access_type {
            m.mount_flags = vec![FLAG.to_owned()];
        }
        let err = c
            .node
            .node_stage_volume(v1::NodeStageVolumeRequest {
                volume_id: v.volume_id.clone(),
                staging_target_path: p.path_str("staging"),
                volume_capability: Some(cap),
                secrets: secrets.clone(),
                ..Default::default()
            })
            .await
            .expect_err("mount(8) refuses an unknown option");
        assert_eq!(err.code(), Code::Internal, "{err:?}");
        assert!(err.message().contains("<redacted>"), "{}", err.message());
        messages.push(err.message().to_owned());
    }
    let err = c
        .controller
        .create_volume({
            let mut r = create_req("secret", 32 * MIB, mount_cap(""), &[("backend", "loop")]);
            r.secrets = secrets.clone();
            r
        })
        .await
        .unwrap_err();
    messages.push(err.message().to_owned());
    c.controller
        .delete_volume(v1::DeleteVolumeRequest {
            volume_id: v.volume_id,
            secrets,
        })
        .await
        .unwrap();
    let log = p.log();
    assert!(
        log.contains("deleted volume"),
        "the log was captured: {log}"
    );
    assert!(log.contains("TRACE"), "logging was at its most verbose");
    for text in messages.iter().chain(std::iter::once(&log)) {
        assert!(!text.contains(SECRET), "secret leaked: {text}");
        assert!(!text.contains(FLAG), "mount flag leaked: {text}");
    }
}
