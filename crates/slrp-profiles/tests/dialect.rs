//! Profile documents in the JSON dialect Mesos accepts (protobuf 3.5's parser): each
//! construct, used in an otherwise strict document, loads and yields exactly the profiles
//! of the strict form. What protobuf rejects is still rejected, with the line and column
//! of the document as written.

#![cfg(test)]

use slrp_profiles::{DocumentError, ProfileMapping};

/// The strict form every variant below must equal (the spec §7.2 example).
const STRICT: &str = r#"{
  "profile_matrix": {
    "fast": {
      "csi_plugin_type_selector": { "plugin_type": "org.apache.mesos.csi.test" },
      "volume_capabilities": {
        "mount": { "fs_type": "xfs", "mount_flags": ["noatime"] },
        "access_mode": { "mode": "SINGLE_NODE_WRITER" }
      },
      "create_parameters": { "type": "raid5", "stripes": "3" }
    },
    "raw-block": {
      "resource_provider_selector": {
        "resource_providers": [ { "type": "org.apache.mesos.rp.local.storage", "name": "lvm" } ]
      },
      "volume_capabilities": { "block": {}, "access_mode": { "mode": "SINGLE_NODE_WRITER" } }
    }
  }
}"#;

fn strict() -> ProfileMapping {
    ProfileMapping::parse(STRICT.as_bytes()).unwrap()
}

fn loads_like_strict(variant: &str) {
    assert_ne!(
        variant, STRICT,
        "the variant must differ from the strict form"
    );
    match ProfileMapping::parse(variant.as_bytes()) {
        Ok(m) => assert_eq!(m, strict(), "{variant}"),
        Err(e) => panic!("rejected: {e} ({e:?})\n{variant}"),
    }
}

#[test]
fn trailing_commas_in_objects_and_arrays() {
    loads_like_strict(
        &STRICT
            .replace(r#""stripes": "3" }"#, r#""stripes": "3", }"#)
            .replace(r#"["noatime"]"#, r#"["noatime",]"#)
            .replace(r#""name": "lvm" } ]"#, r#""name": "lvm" }, ]"#)
            .replace("\n  }\n}", ",\n  },\n}"),
    );
}

#[test]
fn single_quoted_keys_and_values() {
    loads_like_strict(
        &STRICT
            .replace(r#""fast""#, "'fast'")
            .replace(r#""fs_type": "xfs""#, "'fs_type': 'xfs'")
            .replace(r#""stripes": "3""#, r#"'stripes': '3'"#),
    );
}

#[test]
fn unquoted_keys() {
    loads_like_strict(
        &STRICT
            .replace(r#""profile_matrix":"#, "profile_matrix:")
            .replace(r#""volume_capabilities":"#, "volume_capabilities:")
            .replace(r#""mode":"#, "mode:")
            .replace(r#""type": "raid5""#, r#"type: "raid5""#),
    );
}

#[test]
fn escapes_protobuf_reads_as_the_character_itself() {
    // `\'` inside a single-quoted string, and an escaped ordinary letter.
    loads_like_strict(
        &STRICT
            .replace(r#""raid5""#, r#"'r\aid5'"#)
            .replace(r#""noatime""#, r#"'no\atime'"#),
    );
    let quoted = STRICT.replace(r#""stripes": "3""#, r#"'stripes': '3', 'note': 'it\'s'"#);
    let m = ProfileMapping::parse(quoted.as_bytes()).unwrap();
    assert_eq!(m.profiles["fast"].info.parameters["note"], "it's");
}

#[test]
fn vertical_tab_and_form_feed_are_whitespace() {
    loads_like_strict(&STRICT.replace("\n    \"raw-block\"", "\u{0b}\u{0c}\"raw-block\""));
}

#[test]
fn numbers_strtod_takes() {
    // The access mode by number, written as `1.` (protobuf parses it as the double 1).
    let strict_number = STRICT.replacen(r#""mode": "SINGLE_NODE_WRITER""#, r#""mode": 1"#, 1);
    let want = ProfileMapping::parse(strict_number.as_bytes()).unwrap();
    let dotted = strict_number.replacen(r#""mode": 1"#, r#""mode": 1."#, 1);
    match ProfileMapping::parse(dotted.as_bytes()) {
        // Whether a double is taken for an enum number is the document layer's decision,
        // not the dialect's: it must at least get past the JSON syntax.
        Ok(m) => assert_eq!(m, want),
        Err(e) => assert!(!matches!(e, DocumentError::Json { .. }), "{e}"),
    }
}

#[test]
fn every_construct_at_once() {
    let doc = "{profile_matrix: {'fast': {csi_plugin_type_selector: {plugin_type: \
        'org.apache.mesos.csi.test',}, volume_capabilities: {mount: {fs_type: 'xfs', \
        mount_flags: ['noatime',],}, access_mode: {mode: 'SINGLE_NODE_WRITER'},}, \
        create_parameters: {type: 'raid5', stripes: '3',},}, 'raw-block': \
        {resource_provider_selector: {resource_providers: [{type: \
        'org.apache.mesos.rp.local.storage', name: 'lvm'},],}, volume_capabilities: \
        {block: {}, access_mode: {mode: 'SINGLE_NODE_WRITER'}}},},}";
    loads_like_strict(doc);
}

#[test]
fn what_protobuf_rejects_is_rejected_with_the_position_as_written() {
    // A comment on line 3: protobuf has no comments.
    let doc = "{\n  profile_matrix: {\n    // fast disks\n  }\n}";
    let e = ProfileMapping::parse(doc.as_bytes()).unwrap_err();
    let DocumentError::Json { line, column, .. } = &e else {
        panic!("{e:?}");
    };
    assert_eq!((*line, *column), (3, 5), "{e}");
    assert!(e.to_string().contains("line 3, column 5"), "{e}");
    for bad in [
        "{'profile_matrix': {,}}",
        "{'profile_matrix': {},,}",
        "{profile_matrix: {}} /* x */",
        "{nullable: 1}",
        "{'profile_matrix': 0x10}",
    ] {
        let e = ProfileMapping::parse(bad.as_bytes()).unwrap_err();
        assert!(matches!(e, DocumentError::Json { .. }), "{bad}: {e:?}");
    }
}

#[test]
fn field_errors_in_the_dialect_still_name_the_profile_and_field() {
    let doc = STRICT.replace(r#""stripes": "3""#, "stripes: 3,");
    let e = ProfileMapping::parse(doc.as_bytes()).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("'fast'") && text.contains("create_parameters"),
        "{text}"
    );
}
