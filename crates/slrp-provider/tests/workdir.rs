//! `slrp_provider::workdir`: Mesos checkpoints in the work directory stop the provider;
//! slrp's own mounts, other providers' checkpoints and what an import took over (unchanged)
//! do not.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use slrp_proto::mesos::v1::resource_provider_info::Storage;
use slrp_proto::mesos::v1::{CsiPluginInfo, ResourceProviderInfo};
use slrp_provider::import::{FileDigest, ImportedVolumeFile, MesosImport};
use slrp_provider::workdir::{WorkDirError, check_work_dir};

fn info() -> ResourceProviderInfo {
    ResourceProviderInfo {
        r#type: "org.apache.mesos.rp.local.storage".into(),
        name: "test".into(),
        storage: Some(Storage {
            plugin: CsiPluginInfo {
                r#type: "org.apache.mesos.csi.test".into(),
                name: Some("local".into()),
                ..CsiPluginInfo::default()
            },
            reconciliation_interval_seconds: None,
        }),
        ..ResourceProviderInfo::default()
    }
}

fn touch(root: &Path, relative: &str) -> std::path::PathBuf {
    let path = root.join(relative);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, b"checkpoint").unwrap();
    path
}

#[test]
fn an_empty_or_missing_work_dir_is_fine() {
    let dir = tempfile::tempdir().unwrap();
    check_work_dir(dir.path(), &info(), &[]).unwrap();
    check_work_dir(&dir.path().join("absent"), &info(), &[]).unwrap();
}

#[test]
fn slrps_own_mounts_and_other_providers_checkpoints_are_not_a_reason_to_refuse() {
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path();
    std::fs::create_dir_all(w.join("csi/org.apache.mesos.csi.test/local/mounts/vol1/target"))
        .unwrap();
    touch(
        w,
        "meta/slaves/S0/resource_providers/org.apache.mesos.rp.local.storage/other/latest",
    );
    touch(
        w,
        "csi/org.apache.mesos.csi.test/other/volumes/v/volume.state",
    );
    std::fs::create_dir_all(w.join("csi/org.apache.mesos.csi.test/local/volumes/empty")).unwrap();
    check_work_dir(w, &info(), &[]).unwrap();
}

#[test]
fn a_mesos_provider_identity_is_refused_naming_the_path_and_the_import() {
    let dir = tempfile::tempdir().unwrap();
    let meta = dir
        .path()
        .join("meta/slaves/a-S1/resource_providers/org.apache.mesos.rp.local.storage/test");
    std::fs::create_dir_all(meta.join("rp-id")).unwrap();
    // `latest` is a symlink in Mesos; a dangling one counts too.
    std::os::unix::fs::symlink(meta.join("gone"), meta.join("latest")).unwrap();
    let err = check_work_dir(dir.path(), &info(), &[]).unwrap_err();
    let WorkDirError::MesosCheckpoint { found, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(found, &meta.join("latest"));
    let text = err.to_string();
    for needle in [
        meta.join("latest").display().to_string(),
        "slrp import-mesos".to_owned(),
        "untracked mounts".to_owned(),
    ] {
        assert!(text.contains(&needle), "{text}");
    }
}

#[test]
fn a_mesos_volume_checkpoint_of_the_same_plugin_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let state = touch(
        dir.path(),
        "csi/org.apache.mesos.csi.test/local/volumes/%2Ftmp%2Fvol1/volume.state",
    );
    let err = check_work_dir(dir.path(), &info(), &[]).unwrap_err();
    assert!(
        matches!(&err, WorkDirError::MesosCheckpoint { found, .. } if found == &state),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("plugin org.apache.mesos.csi.test/local"),
        "{err}"
    );
}

#[test]
fn an_unreadable_directory_is_an_error_not_a_pass() {
    let dir = tempfile::tempdir().unwrap();
    // A file where a directory is expected cannot be listed.
    touch(dir.path(), "meta/slaves");
    let err = check_work_dir(dir.path(), &info(), &[]).unwrap_err();
    assert!(matches!(err, WorkDirError::Read { .. }), "{err:?}");
}

/// The marker an import writes for `volumes` (dir name → file) and the provider's
/// `latest` under agent `S1`.
fn marker(w: &Path, volumes: &[&str], rp_state: Option<&str>) -> MesosImport {
    let digest =
        |relative: &str| FileDigest::of(relative.into(), &std::fs::read(w.join(relative)).unwrap());
    MesosImport {
        agent_id: "S1".into(),
        provider: "org.apache.mesos.rp.local.storage.test".into(),
        plugin: "org.apache.mesos.csi.test/local".into(),
        source_work_dir: w.to_owned(),
        provider_id: Some("rp-id".into()),
        latest: None,
        rp_state: rp_state.map(digest),
        volumes: volumes
            .iter()
            .map(|dir| ImportedVolumeFile {
                id: (*dir).into(),
                dir: (*dir).into(),
                file: digest(&format!("{VOLUMES}/{dir}/volume.state")),
            })
            .collect(),
        streams: Vec::new(),
        operations: Vec::new(),
        skipped: Vec::new(),
        lenient: false,
        imported_at: "2026-12-01T18:00:00Z".into(),
        slrp_version: "0.1.0".into(),
    }
}

const VOLUMES: &str = "csi/org.apache.mesos.csi.test/local/volumes";
const RP: &str = "meta/slaves/S1/resource_providers/org.apache.mesos.rp.local.storage/test";

#[test]
fn imported_checkpoints_no_longer_refuse_and_any_other_still_does() {
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path();
    let state = format!("{RP}/rp-id/resource_provider.state");
    touch(w, &state);
    std::os::unix::fs::symlink(w.join(RP).join("rp-id"), w.join(RP).join("latest")).unwrap();
    std::os::unix::fs::symlink(w.join("meta/slaves/S1"), w.join("meta/slaves/latest")).unwrap();
    touch(w, &format!("{VOLUMES}/vol1/volume.state"));
    touch(w, &format!("{VOLUMES}/vol2/volume.state"));
    let imported = [marker(w, &["vol1", "vol2"], Some(&state))];
    check_work_dir(w, &info(), &imported).unwrap();

    // A volume a Mesos provider created after the import.
    let new = touch(w, &format!("{VOLUMES}/vol3/volume.state"));
    let err = check_work_dir(w, &info(), &imported).unwrap_err();
    assert!(
        matches!(&err, WorkDirError::MesosCheckpoint { found, .. } if *found == new),
        "{err:?}"
    );
    assert!(err.to_string().contains("slrp import-mesos"), "{err}");
    std::fs::remove_file(&new).unwrap();
    // An empty volume.state is ignored, as Mesos ignores it.
    std::fs::write(&new, b"").unwrap();
    check_work_dir(w, &info(), &imported).unwrap();

    // An imported file that changed since: a Mesos provider ran again.
    std::fs::write(w.join(VOLUMES).join("vol2/volume.state"), b"moved on").unwrap();
    let err = check_work_dir(w, &info(), &imported).unwrap_err();
    assert!(
        matches!(&err, WorkDirError::ChangedSinceImport { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("2026-12-01T18:00:00Z"), "{err}");
    let imported = [marker(w, &["vol1", "vol2"], Some(&state))];
    check_work_dir(w, &info(), &imported).unwrap();
    std::fs::write(w.join(&state), b"rewritten").unwrap();
    let err = check_work_dir(w, &info(), &imported).unwrap_err();
    assert!(
        matches!(&err, WorkDirError::ChangedSinceImport { found, .. } if *found == w.join(&state)),
        "{err:?}"
    );
    let imported = [marker(w, &["vol1", "vol2"], Some(&state))];

    // The same provider under another agent id was not imported.
    let other = w.join("meta/slaves/S2/resource_providers/org.apache.mesos.rp.local.storage/test");
    std::fs::create_dir_all(other.join("rp-2")).unwrap();
    std::os::unix::fs::symlink(other.join("rp-2"), other.join("latest")).unwrap();
    let err = check_work_dir(w, &info(), &imported).unwrap_err();
    assert!(
        matches!(&err, WorkDirError::MesosCheckpoint { found, .. } if *found == other.join("latest")),
        "{err:?}"
    );
    // Without any marker, the imported ones refuse again.
    std::fs::remove_file(other.join("latest")).unwrap();
    check_work_dir(w, &info(), &imported).unwrap();
    assert!(check_work_dir(w, &info(), &[]).is_err());
}
