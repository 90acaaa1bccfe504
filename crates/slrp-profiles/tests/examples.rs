//! `examples/profiles.json` is a profile document the adaptor accepts (the format of
//! Mesos's URI disk profile adaptor), with the profiles standalone mode generates.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use slrp_profiles::ProfileMapping;

#[test]
fn the_example_profile_document_parses() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/profiles.json");
    let doc = ProfileMapping::parse(&std::fs::read(path).unwrap()).unwrap();
    let names: Vec<_> = doc.profiles.keys().map(String::as_str).collect();
    assert_eq!(names, ["block", "ext4", "mount"]);
    let ext4 = &doc.profiles["ext4"].info.parameters;
    assert_eq!(ext4.get("pool").map(String::as_str), Some("loop"));
}
