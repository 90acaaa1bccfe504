//! Parsing and validation of profile documents (Mesos's `ParseExample` / `ParseInvalids`)
//! and selector matching.

#![cfg(test)]

use std::collections::BTreeSet;

use slrp_profiles::{DocumentError, ProfileMapping, ProviderKey, Selector};
use slrp_proto::mesos::v1::volume::source::csi_volume::volume_capability::{
    AccessType, access_mode::Mode,
};

/// The example from the Mesos URI adaptor's help text.
#[test]
fn parse_example() {
    let doc = br#"
    {
      "profile_matrix" : {
        "my-profile" : {
          "csi_plugin_type_selector" : { "plugin_type" : "org.apache.mesos.csi.test" },
          "volume_capabilities" : {
            "block" : {},
            "access_mode" : { "mode" : "SINGLE_NODE_WRITER" }
          },
          "create_parameters" : {
            "mesos-does-not" : "interpret-these",
            "type" : "raid5",
            "stripes" : "3",
            "stripesize" : "64"
          }
        }
      }
    }"#;
    let mapping = ProfileMapping::parse(doc).unwrap();
    assert_eq!(mapping.profiles.len(), 1);
    let m = &mapping.profiles["my-profile"];
    assert_eq!(
        m.selector,
        Selector::CsiPluginType("org.apache.mesos.csi.test".into())
    );
    let cap = &m.info.capability;
    assert!(matches!(cap.access_type, Some(AccessType::Block(_))));
    assert_eq!(cap.access_mode.mode, Mode::SingleNodeWriter as i32);
    let params: Vec<(&str, &str)> = m
        .info
        .parameters
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        params,
        [
            ("mesos-does-not", "interpret-these"),
            ("stripes", "3"),
            ("stripesize", "64"),
            ("type", "raid5"),
        ]
    );
}

#[test]
fn mount_capability_and_provider_selector() {
    let doc = br#"{"profile_matrix":{"fast":{
        "resource_provider_selector":{"resource_providers":[
            {"type":"org.apache.mesos.rp.local.storage","name":"lvm"},
            {"type":"org.apache.mesos.rp.local.storage","name":"zfs"}]},
        "volume_capabilities":{"mount":{"fs_type":"xfs","mount_flags":["noatime","nodiratime"]},
                               "access_mode":{"mode":"SINGLE_NODE_WRITER"}}}}}"#;
    let m = &ProfileMapping::parse(doc).unwrap().profiles["fast"];
    let Some(AccessType::Mount(mount)) = &m.info.capability.access_type else {
        panic!("expected a mount capability, got {:?}", m.info.capability);
    };
    assert_eq!(mount.fs_type.as_deref(), Some("xfs"));
    assert_eq!(mount.mount_flags, ["noatime", "nodiratime"]);
    let Selector::ResourceProviders(refs) = &m.selector else {
        panic!("expected a provider selector");
    };
    assert_eq!(refs.len(), 2);
    assert!(m.info.parameters.is_empty());
}

/// proto3 JSON: lowerCamelCase names, `null` as unset, enum numbers, unknown fields ignored.
#[test]
fn proto3_json_forms_are_accepted() {
    let camel = br#"{"profileMatrix":{"p":{
        "csiPluginTypeSelector":{"pluginType":"t"},
        "volumeCapabilities":{"mount":{"fsType":"ext4","mountFlags":null},
                              "accessMode":{"mode":5},"future_field":1},
        "createParameters":null,
        "resourceProviderSelector":null,
        "someNewField":{"nested":[1,2,3]}}},
      "unknown_top_level":true}"#;
    let snake = br#"{"profile_matrix":{"p":{
        "csi_plugin_type_selector":{"plugin_type":"t"},
        "volume_capabilities":{"mount":{"fs_type":"ext4"},
                               "access_mode":{"mode":"MULTI_NODE_MULTI_WRITER"}}}}}"#;
    assert_eq!(
        ProfileMapping::parse(camel).unwrap(),
        ProfileMapping::parse(snake).unwrap()
    );
    assert!(ProfileMapping::parse(b"{}").unwrap().profiles.is_empty());
    assert!(
        ProfileMapping::parse(br#"{"profile_matrix":null}"#)
            .unwrap()
            .profiles
            .is_empty()
    );
}

/// Mesos copies `fs_type` even when empty; unset and empty are the same profile.
#[test]
fn unset_and_empty_fs_type_are_equal() {
    let a = br#"{"profile_matrix":{"p":{"csi_plugin_type_selector":{"plugin_type":"t"},
        "volume_capabilities":{"mount":{},"access_mode":{"mode":"SINGLE_NODE_WRITER"}}}}}"#;
    let b = br#"{"profile_matrix":{"p":{"csi_plugin_type_selector":{"plugin_type":"t"},
        "volume_capabilities":{"mount":{"fs_type":""},"access_mode":{"mode":"SINGLE_NODE_WRITER"}}}}}"#;
    assert_eq!(
        ProfileMapping::parse(a).unwrap(),
        ProfileMapping::parse(b).unwrap()
    );
}

/// Recognizes the expected error of one invalid document.
type Check = fn(&DocumentError) -> bool;

const SEL: &str = r#""csi_plugin_type_selector":{"plugin_type":"org.apache.mesos.csi.test"}"#;

fn one(profile_body: &str) -> String {
    format!(r#"{{"profile_matrix":{{"profile":{{{profile_body}}}}}}}"#)
}

/// Mesos's `ParseInvalids` list (as valid JSON: Mesos's own copy has trailing commas that
/// would fail earlier for the wrong reason), plus the cases Mesos checks elsewhere. Each
/// fails, with a distinct message that names the profile and field where there is one.
#[test]
fn parse_invalids() {
    let long_flags = format!(
        r#"{SEL},"volume_capabilities":{{"mount":{{"mount_flags":["{}","{}"]}},"access_mode":{{"mode":"SINGLE_NODE_WRITER"}}}}"#,
        "a".repeat(2048),
        "b".repeat(2049)
    );
    let cases: Vec<(String, Check)> = vec![
        ("Not an object, but still JSON".into(), |e| {
            matches!(e, DocumentError::Json { .. })
        }),
        (r#""a JSON string""#.into(), |e| {
            matches!(e, DocumentError::NotAnObject { found: "a string" })
        }),
        (
            r#"{"profile_matrix":["not","an","object"]}"#.into(),
            |e| matches!(e, DocumentError::WrongType { profile: None, field, .. } if field == "profile_matrix"),
        ),
        (
            r#"{"profile_matrix":{"profile":"This is not an object"}}"#.into(),
            |e| {
                matches!(
                    e,
                    DocumentError::WrongType {
                        profile: Some(_),
                        ..
                    }
                )
            },
        ),
        (one(""), |e| matches!(e, DocumentError::NoSelector { .. })),
        (
            one(r#""resource_provider_selector":"Wrong JSON type""#),
            |e| matches!(e, DocumentError::WrongType { field, .. } if field == "resource_provider_selector"),
        ),
        (
            one(r#""resource_provider_selector":{"resource_providers":"Wrong JSON type"}"#),
            |e| matches!(e, DocumentError::WrongType { field, .. } if field == "resource_provider_selector.resource_providers"),
        ),
        (
            one(r#""resource_provider_selector":{"resource_providers":[{"not-type":"x"}]}"#),
            |e| matches!(e, DocumentError::ProviderTypeMissing { index: 0, .. }),
        ),
        (
            one(
                r#""resource_provider_selector":{"resource_providers":[{"type":"t","name":"n"},{"type":"t","not-name":"x"}]}"#,
            ),
            |e| matches!(e, DocumentError::ProviderNameMissing { index: 1, .. }),
        ),
        (
            one(r#""csi_plugin_type_selector":"Wrong JSON type""#),
            |e| matches!(e, DocumentError::WrongType { field, .. } if field == "csi_plugin_type_selector"),
        ),
        (
            one(r#""csi_plugin_type_selector":{"not-plugin_type":"x"}"#),
            |e| matches!(e, DocumentError::PluginTypeMissing { .. }),
        ),
        (
            one(&format!(
                r#""resource_provider_selector":{{"resource_providers":[{{"type":"t","name":"n"}}]}},{SEL}"#
            )),
            |e| matches!(e, DocumentError::TwoSelectors { .. }),
        ),
        (
            one(&format!(r#"{SEL},"not-volume_capabilities":"x""#)),
            |e| matches!(e, DocumentError::CapabilityMissing { .. }),
        ),
        (
            one(&format!(r#"{SEL},"volume_capabilities":"Wrong JSON type""#)),
            |e| matches!(e, DocumentError::WrongType { field, .. } if field == "volume_capabilities"),
        ),
        (one(&format!(r#"{SEL},"volume_capabilities":{{}}"#)), |e| {
            matches!(e, DocumentError::AccessModeMissing { .. })
        }),
        (
            one(&format!(
                r#"{SEL},"volume_capabilities":{{"mount":{{"fs_type":["not an array"]}}}}"#
            )),
            |e| matches!(e, DocumentError::WrongType { field, .. } if field == "volume_capabilities.mount.fs_type"),
        ),
        (
            one(&format!(
                r#"{SEL},"volume_capabilities":{{"mount":{{}},"block":{{}},"access_mode":{{"mode":"SINGLE_NODE_WRITER"}}}}"#
            )),
            |e| matches!(e, DocumentError::TwoAccessTypes { .. }),
        ),
        (one(&long_flags), |e| {
            matches!(e, DocumentError::MountFlagsTooLong { bytes: 4097, .. })
        }),
        (
            one(&format!(
                r#"{SEL},"volume_capabilities":{{"block":{{}},"access_mode":{{"mode":"No-enum-of-this-name"}}}}"#
            )),
            |e| matches!(e, DocumentError::AccessModeUnrecognized { .. }),
        ),
        (
            one(&format!(
                r#"{SEL},"volume_capabilities":{{"block":{{}},"access_mode":{{"mode":"UNKNOWN"}}}}"#
            )),
            |e| matches!(e, DocumentError::AccessModeUnset { .. }),
        ),
        (
            one(&format!(
                r#"{SEL},"volume_capabilities":{{"block":{{}},"access_mode":{{"mode":42}}}}"#
            )),
            |e| matches!(e, DocumentError::AccessModeUnrecognized { value, .. } if value == "42"),
        ),
        (
            one(&format!(
                r#"{SEL},"volume_capabilities":{{"mount":{{"mount_flags":["a","b","c"]}},"access_mode":{{"mode":"SINGLE_NODE_WRITER"}}}},"create_parameters":"Wrong JSON type""#
            )),
            |e| matches!(e, DocumentError::WrongType { field, .. } if field == "create_parameters"),
        ),
        (
            one(&format!(
                r#"{SEL},"volume_capabilities":{{"mount":{{"fs_type":"abc"}},"access_mode":{{"mode":"SINGLE_NODE_READER_ONLY"}}}},"create_parameters":{{"incorrect":["JSON type of parameter"]}}"#
            )),
            |e| matches!(e, DocumentError::WrongType { field, .. } if field == "create_parameters.incorrect"),
        ),
        (
            format!(
                r#"{{"profile_matrix":{{"profile":{{{SEL},"volume_capabilities":{{"block":{{}},"access_mode":{{"mode":"MULTI_NODE_READER_ONLY"}}}}}},
                   "first profile is fine, second profile is broken":{{}}}}}}"#
            ),
            |e| matches!(e, DocumentError::NoSelector { profile } if profile == "first profile is fine, second profile is broken"),
        ),
    ];

    let mut messages = BTreeSet::new();
    for (doc, expected) in &cases {
        let err = match ProfileMapping::parse(doc.as_bytes()) {
            Ok(m) => panic!("accepted invalid document {doc}: {m:?}"),
            Err(e) => e,
        };
        assert!(expected(&err), "wrong error for {doc}: {err:?}");
        // Every error inside a profile names it (the field is checked per case above).
        if doc.contains("\"profile\":") && !doc.contains("\"profile_matrix\":[") {
            let name = err.profile().expect("error names its profile");
            assert!(err.to_string().contains(&format!("'{name}'")), "{err}");
        }
        assert!(
            messages.insert(full_message(&err)),
            "duplicate message {err}"
        );
    }
    assert_eq!(messages.len(), cases.len());
}

fn full_message(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out = format!("{out}: {s}");
        cur = s.source();
    }
    out
}

#[test]
fn error_messages_name_profile_and_field() {
    let err =
        ProfileMapping::parse(one(&format!(r#"{SEL},"volume_capabilities":{{}}"#)).as_bytes())
            .unwrap_err();
    assert_eq!(
        err.to_string(),
        "profile 'profile': 'volume_capabilities.access_mode' is required"
    );
    // An absent mode is UNKNOWN in proto3, and reported as Mesos does.
    let err = ProfileMapping::parse(
        one(&format!(
            r#"{SEL},"volume_capabilities":{{"block":{{}},"access_mode":{{}}}}"#
        ))
        .as_bytes(),
    )
    .unwrap_err();
    assert!(
        matches!(err, DocumentError::AccessModeUnset { .. }),
        "{err:?}"
    );
    let err = ProfileMapping::parse(one("").as_bytes()).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("profile 'profile' has no valid selector")
    );
}

#[test]
fn selectors_match_like_mesos() {
    let doc = br#"{"profile_matrix":{
        "by-provider":{"resource_provider_selector":{"resource_providers":[{"type":"rp.t","name":"a"}]},
                       "volume_capabilities":{"block":{},"access_mode":{"mode":"SINGLE_NODE_WRITER"}}},
        "by-plugin":{"csi_plugin_type_selector":{"plugin_type":"csi.x"},
                     "volume_capabilities":{"block":{},"access_mode":{"mode":"SINGLE_NODE_WRITER"}}}}}"#;
    let m = ProfileMapping::parse(doc).unwrap();
    let (by_provider, by_plugin) = (&m.profiles["by-provider"], &m.profiles["by-plugin"]);

    let a = ProviderKey::new("rp.t", "a", Some("csi.x".into()));
    assert!(by_provider.applies_to(&a) && by_plugin.applies_to(&a));
    // Type and name must both match.
    assert!(!by_provider.applies_to(&ProviderKey::new("rp.t", "b", None)));
    assert!(!by_provider.applies_to(&ProviderKey::new("rp.other", "a", None)));
    // A provider without a storage part never matches a plugin type selector.
    assert!(!by_plugin.applies_to(&ProviderKey::new("rp.t", "a", None)));
    assert!(!by_plugin.applies_to(&ProviderKey::new("rp.t", "a", Some("csi.y".into()))));
}
