//! A Mesos SLRP's checkpoint tree, as `slrp import-mesos` reads it: [`plan`] over a work
//! directory holding the fuzzed files (the provider's `resource_provider.state`, its
//! operations' status streams, its plugin's `volume.state` files, the agent's
//! `meta/boot_id`, ...), strict or lenient.
//!
//! Input: one flags byte (bit 0: lenient; bit 1: commit an accepted plan into a store),
//! then files, each `[base][name length][name][u16 length][content]`, where `base` picks
//! the directory `name` is relative to (0: the work directory, 1: the provider's
//! checkpoint directory, 2: the plugin's directory `csi/<type>/<name>`). Names with `..`,
//! absolute names and duplicates are skipped. The agent (`a1b2-S0`, `meta/slaves/latest`)
//! and the provider's `latest` link (`rp-1`) are always there.
//!
//! Properties:
//! - the import refuses with reasons naming files, never panics;
//! - it changes none of Mesos's files;
//! - every volume it plans has an id that maps to one directory under the mount root, and
//!   every file it names is inside the work directory;
//! - a planned import commits (one store transaction).

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use slrp_core::volume::{BootId, MountPaths, MountTable};
use slrp_proto::mesos::v1::resource_provider_info::Storage;
use slrp_proto::mesos::v1::{CsiPluginInfo, ResourceProviderInfo};
use slrp_provider::config::ProviderConfig;
use slrp_provider::import::{ImportOptions, open_store, plan};

use crate::util::{byte, chunk, inside, put_chunk, runtime, scratch, take};

/// The agent id of the tree.
pub const AGENT: &str = "a1b2-S0";
/// The provider's type.
pub const RP_TYPE: &str = "org.apache.mesos.rp.local.storage";
/// The provider's name.
pub const RP_NAME: &str = "test";
/// The provider's id.
pub const RP_ID: &str = "rp-1";
/// The plugin's type.
pub const PLUGIN_TYPE: &str = "org.apache.mesos.csi.test";
/// The plugin's name.
pub const PLUGIN_NAME: &str = "local";
/// The host's boot id the import is told.
pub const BOOT: &str = "boot-1";

/// No mounts (the import reports what is mounted; the target mounts nothing).
#[derive(Debug)]
struct NoMounts;

impl MountTable for NoMounts {
    fn mounts_under(&self, _dir: &Path) -> std::io::Result<Vec<PathBuf>> {
        Ok(Vec::new())
    }
}

fn provider() -> ProviderConfig {
    ProviderConfig {
        info: ResourceProviderInfo {
            r#type: RP_TYPE.into(),
            name: RP_NAME.into(),
            storage: Some(Storage {
                plugin: CsiPluginInfo {
                    r#type: PLUGIN_TYPE.into(),
                    name: Some(PLUGIN_NAME.into()),
                    ..CsiPluginInfo::default()
                },
                reconciliation_interval_seconds: None,
            }),
            ..ResourceProviderInfo::default()
        },
        source: PathBuf::from("/etc/slrp/resource-providers/test.json"),
    }
}

/// The directory a file's `base` byte names, relative to the work directory.
fn base_dir(base: u8) -> PathBuf {
    match base % 3 {
        0 => PathBuf::new(),
        1 => Path::new("meta/slaves")
            .join(AGENT)
            .join("resource_providers")
            .join(RP_TYPE)
            .join(RP_NAME)
            .join(RP_ID),
        _ => Path::new("csi").join(PLUGIN_TYPE).join(PLUGIN_NAME),
    }
}

fn plain_relative(name: &str) -> bool {
    !name.is_empty()
        && !name.contains('\0')
        && Path::new(name)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}

/// The work directory's fixed skeleton: the agent and the provider's `latest` links.
fn skeleton(work: &Path) -> std::io::Result<()> {
    let agent = work.join("meta/slaves").join(AGENT);
    std::fs::create_dir_all(&agent)?;
    std::os::unix::fs::symlink(&agent, work.join("meta/slaves/latest"))?;
    let rp_parent = work
        .join(base_dir(1))
        .parent()
        .map(Path::to_owned)
        .unwrap_or_default();
    std::fs::create_dir_all(rp_parent.join(RP_ID))?;
    std::os::unix::fs::symlink(rp_parent.join(RP_ID), rp_parent.join("latest"))?;
    std::fs::create_dir_all(work.join(base_dir(2)))
}

/// Every regular file under `dir` with its bytes.
fn snapshot(dir: &Path, out: &mut Vec<(PathBuf, Vec<u8>)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            snapshot(&path, out);
        } else if meta.is_file() {
            let bytes = std::fs::read(&path).unwrap_or_default();
            out.push((path, bytes));
        }
    }
}

/// The target.
pub fn run(data: &[u8]) {
    let mut data = data;
    let flags = byte(&mut data);
    let dir = scratch();
    let work = dir.path().join("work");
    skeleton(&work).expect("laying out the scratch work directory");
    let mut files = 0;
    while !data.is_empty() && files < 32 {
        let base = byte(&mut data);
        let len = usize::from(byte(&mut data));
        let name = String::from_utf8_lossy(take(&mut data, len)).into_owned();
        let content = chunk(&mut data);
        if !plain_relative(&name) {
            continue;
        }
        let path = work.join(base_dir(base)).join(&name);
        if path.exists()
            || path
                .parent()
                .is_some_and(|p| std::fs::create_dir_all(p).is_err())
        {
            continue;
        }
        if std::fs::write(&path, content).is_ok() {
            files += 1;
        }
    }
    let mut before = Vec::new();
    snapshot(&work, &mut before);

    let opts = ImportOptions {
        agent_id: None,
        lenient: flags & 1 == 1,
        current_boot: Some(BootId::new(BOOT)),
        mounts: Some(Arc::new(NoMounts)),
    };
    let planned = plan(&work, &provider(), &opts);

    let mut after = Vec::new();
    snapshot(&work, &mut after);
    assert!(before == after, "the import changed Mesos's files");

    let Ok(planned) = planned else {
        return;
    };
    let mounts = MountPaths::under_work_dir(&work, PLUGIN_TYPE, PLUGIN_NAME)
        .expect("fixed plugin names are path components");
    for v in planned.volumes() {
        let volume_dir = mounts
            .volume_dir(&v.record.id)
            .unwrap_or_else(|e| panic!("planned volume {:?} has no directory: {e}", v.record.id));
        assert!(
            inside(mounts.root(), &volume_dir) && volume_dir.parent() == Some(mounts.root()),
            "volume {:?} maps to {} outside the mount root",
            v.record.id,
            volume_dir.display()
        );
        assert!(
            inside(&work, &v.file),
            "volume file {} outside",
            v.file.display()
        );
    }
    for op in planned.operations() {
        if let Some(f) = &op.stream_file {
            assert!(inside(&work, f), "stream file {} outside", f.display());
        }
    }
    if flags & 2 == 2 {
        let store = open_store(&dir.path().join("state")).expect("opening the scratch store");
        runtime()
            .block_on(planned.commit(&store))
            .unwrap_or_else(|e| panic!("a planned import does not commit: {e:?}"));
    }
}

/// A seed input from the files of a Mesos work directory (`root`), as (base, name,
/// content) triples relative to [`run`]'s bases; files outside them are given relative to
/// the work directory.
#[must_use]
pub fn seed(lenient: bool, commit: bool, root: &Path) -> Vec<u8> {
    let mut out = vec![u8::from(lenient) | u8::from(commit) << 1];
    let mut files = Vec::new();
    snapshot(root, &mut files);
    for (path, content) in files {
        let Ok(rel) = path.strip_prefix(root) else {
            continue;
        };
        let (base, name) = [1u8, 2]
            .iter()
            .find_map(|b| {
                rel.strip_prefix(base_dir(*b))
                    .ok()
                    .map(|n| (*b, n.to_owned()))
            })
            .unwrap_or((0, rel.to_owned()));
        let name = name.to_string_lossy().into_owned();
        let Ok(len) = u8::try_from(name.len()) else {
            continue;
        };
        out.push(base);
        out.push(len);
        out.extend_from_slice(name.as_bytes());
        put_chunk(&mut out, &content);
    }
    out
}
