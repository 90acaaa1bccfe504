//! CSI requests into the bundled plugin (`slrp-csi-local`): a sequence of v1 or v0 RPCs,
//! each a request message's bytes as tonic hands them to the service
//! ([`slrp_csi_local::fuzzing::Services`]), on a plugin opened on a scratch root over
//! an in-memory host (mounts and loop devices are table entries).
//!
//! Input: one flags byte (bit 0: v0), then up to 12 calls `[rpc][u16 length][request]`
//! (`rpc` indexes [`RPCS`]).
//!
//! Every absolute path a Node request names (staging and target paths, volume paths) is
//! moved under the scratch directory's `co/` before the call, `..` components and all, so
//! that what the plugin accepts cannot reach the host's own directories; the plugin's
//! refusal of `..` and of relative paths is still what decides.
//!
//! Snapshot requests (CreateSnapshot, DeleteSnapshot, ListSnapshots, GetSnapshot) and
//! CreateVolume's content sources reach the same plugin; their data copies are real
//! (under the scratch root), through `slrp_csi_local::copy`.
//!
//! Properties:
//! - every request is answered with a response or a status, never a panic or a hang;
//! - every host operation the plugin asks for stays inside its root or the CO's
//!   directory, and never names a path with `..`; copies read and write under the root
//!   only, and only mounted file systems of attached devices are frozen;
//! - no file system is left frozen once a request has been answered;
//! - the plugin can be opened again on its root afterwards (its records stay readable).

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message;
use slrp_csi_local::Config;
use slrp_csi_local::config::CsiVersion;
use slrp_csi_local::copy::{self, CopyMethod};
use slrp_csi_local::fuzzing::{RPCS, Services};
use slrp_csi_local::host::{FsStats, Host, HostError};
use slrp_proto::csi::{v0, v1};

use crate::util::{byte, chunk, put_chunk, runtime, scratch};

/// The in-memory host, which checks every path it is given.
#[derive(Debug)]
struct FuzzHost {
    root: PathBuf,
    co: PathBuf,
    /// Shared with the target, which checks it between requests.
    state: Arc<Mutex<HostState>>,
}

#[derive(Debug, Default)]
struct HostState {
    mounts: BTreeMap<PathBuf, PathBuf>,
    loops: BTreeMap<PathBuf, PathBuf>,
    formatted: BTreeMap<PathBuf, String>,
    /// Mount points frozen now.
    frozen: std::collections::BTreeSet<PathBuf>,
    next_loop: usize,
}

impl FuzzHost {
    fn state(&self) -> std::sync::MutexGuard<'_, HostState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Asserts `path` is under the root (`root`) or the CO's directory, without `..`.
    fn check(&self, what: &str, path: &Path, root: bool) {
        assert!(
            !path.components().any(|c| c == Component::ParentDir),
            "{what} {} has a '..'",
            path.display()
        );
        let ok = path.starts_with(&self.co) || (root && path.starts_with(&self.root));
        assert!(
            ok,
            "{what} {} is outside the plugin's directories",
            path.display()
        );
    }

    fn check_device(&self, device: &Path) {
        assert!(
            self.state().loops.contains_key(device),
            "device {} is not a loop device the plugin attached",
            device.display()
        );
    }
}

impl Host for FuzzHost {
    fn bind_mount(&self, source: &Path, target: &Path, _ro: bool) -> Result<(), HostError> {
        self.check("bind source", source, true);
        self.check("bind target", target, false);
        self.state()
            .mounts
            .insert(target.to_owned(), source.to_owned());
        Ok(())
    }
    fn mount_fs(
        &self,
        device: &Path,
        target: &Path,
        _fs: Option<&str>,
        _o: &[String],
    ) -> Result<(), HostError> {
        self.check_device(device);
        self.check("mount target", target, false);
        self.state()
            .mounts
            .insert(target.to_owned(), device.to_owned());
        Ok(())
    }
    fn unmount_all(&self, target: &Path) -> Result<(), HostError> {
        self.check("unmount target", target, true);
        self.state().mounts.remove(target);
        Ok(())
    }
    fn is_mount_point(&self, path: &Path) -> Result<bool, HostError> {
        Ok(self.state().mounts.contains_key(path))
    }
    fn loop_devices_of(&self, file: &Path) -> Result<Vec<PathBuf>, HostError> {
        self.check("loop file", file, true);
        Ok(self
            .state()
            .loops
            .iter()
            .filter(|(_, f)| f.as_path() == file)
            .map(|(d, _)| d.clone())
            .collect())
    }
    fn loop_attach(&self, file: &Path) -> Result<PathBuf, HostError> {
        self.check("loop file", file, true);
        let mut s = self.state();
        let dev = PathBuf::from(format!("/dev/fuzzloop{}", s.next_loop));
        s.next_loop += 1;
        s.loops.insert(dev.clone(), file.to_owned());
        Ok(dev)
    }
    fn loop_detach(&self, device: &Path) -> Result<(), HostError> {
        self.state().loops.remove(device);
        Ok(())
    }
    fn loop_refresh_size(&self, device: &Path) -> Result<(), HostError> {
        self.check_device(device);
        Ok(())
    }
    fn probe_fs(&self, device: &Path) -> Result<Option<String>, HostError> {
        let s = self.state();
        let file = s.loops.get(device).cloned().unwrap_or_default();
        Ok(s.formatted.get(&file).cloned())
    }
    fn mkfs(&self, device: &Path, fs_type: &str, _force: bool) -> Result<(), HostError> {
        self.check_device(device);
        let mut s = self.state();
        let file = s.loops.get(device).cloned().unwrap_or_default();
        s.formatted.insert(file, fs_type.to_owned());
        Ok(())
    }
    fn grow_fs(&self, device: &Path, mount_point: &Path, _f: &str) -> Result<(), HostError> {
        self.check_device(device);
        self.check("grown mount point", mount_point, true);
        Ok(())
    }
    fn fs_stats(&self, path: &Path) -> Result<FsStats, HostError> {
        self.check("statted path", path, true);
        Ok(FsStats {
            total_bytes: 100,
            available_bytes: 60,
            used_bytes: 40,
            total_inodes: 10,
            free_inodes: 7,
        })
    }
    fn has_mkfs(&self, fs_type: &str) -> bool {
        fs_type == "ext4" || fs_type == "xfs"
    }
    fn grow_fs_offline(&self, device: &Path, _fs: &str) -> Result<(), HostError> {
        self.check_device(device);
        Ok(())
    }
    fn copy_image(
        &self,
        source: &Path,
        dest: &Path,
        progress: &mut dyn FnMut(),
    ) -> Result<CopyMethod, HostError> {
        self.check("copied image", source, true);
        self.check("image copy", dest, true);
        assert!(
            source.starts_with(&self.root) && dest.starts_with(&self.root),
            "an image copy leaves the root"
        );
        let res = copy::copy_file(source, dest, progress);
        // The file system "on" an image is a table entry here: it travels with the copy.
        let mut s = self.state();
        if let Some(fs) = s.formatted.get(source).cloned() {
            s.formatted.insert(dest.to_owned(), fs);
        }
        res
    }
    fn copy_tree(
        &self,
        source: &Path,
        dest: &Path,
        progress: &mut dyn FnMut(),
    ) -> Result<CopyMethod, HostError> {
        self.check("copied tree", source, true);
        self.check("tree copy", dest, true);
        assert!(
            source.starts_with(&self.root) && dest.starts_with(&self.root),
            "a tree copy leaves the root"
        );
        copy::copy_tree(source, dest, progress)
    }
    fn freeze_fs(&self, device: &Path, mount_point: &Path) -> Result<(), HostError> {
        self.check_device(device);
        self.check("frozen mount point", mount_point, false);
        let mut s = self.state();
        assert_eq!(
            s.mounts.get(mount_point).map(PathBuf::as_path),
            Some(device),
            "freezing {} which is not the file system of {}",
            mount_point.display(),
            device.display()
        );
        assert!(
            s.frozen.insert(mount_point.to_owned()),
            "{} frozen twice",
            mount_point.display()
        );
        Ok(())
    }
    fn thaw_fs(&self, mount_point: &Path) -> Result<(), HostError> {
        if self.state().frozen.remove(mount_point) {
            Ok(())
        } else {
            Err(HostError::Output {
                command: format!("fsfreeze --unfreeze {}", mount_point.display()),
                output: "unfreeze failed: Invalid argument".to_owned(),
            })
        }
    }
    fn flush_device(&self, device: &Path) -> Result<(), HostError> {
        self.check_device(device);
        Ok(())
    }
}

/// Moves an absolute CO path under `co` (lexically: `..` stays for the plugin to refuse).
fn jail(path: &mut String, co: &Path) {
    if let Some(rest) = path.strip_prefix('/') {
        *path = format!("{}/{rest}", co.display());
    }
}

/// The request bytes with every CO path jailed; unchanged when they do not decode.
fn jailed(v0_api: bool, rpc: usize, bytes: &[u8], co: &Path) -> Vec<u8> {
    macro_rules! rewrite {
        ($ty:ty, $($field:ident),+) => {
            match <$ty>::decode(bytes) {
                Ok(mut m) => {
                    $(jail(&mut m.$field, co);)+
                    m.encode_to_vec()
                }
                Err(_) => bytes.to_vec(),
            }
        };
    }
    match (v0_api, RPCS.get(rpc).copied()) {
        (false, Some("NodeStageVolume")) => {
            rewrite!(v1::NodeStageVolumeRequest, staging_target_path)
        }
        (false, Some("NodeUnstageVolume")) => {
            rewrite!(v1::NodeUnstageVolumeRequest, staging_target_path)
        }
        (false, Some("NodePublishVolume")) => {
            rewrite!(
                v1::NodePublishVolumeRequest,
                staging_target_path,
                target_path
            )
        }
        (false, Some("NodeUnpublishVolume")) => {
            rewrite!(v1::NodeUnpublishVolumeRequest, target_path)
        }
        (false, Some("NodeGetVolumeStats")) => {
            rewrite!(
                v1::NodeGetVolumeStatsRequest,
                volume_path,
                staging_target_path
            )
        }
        (false, Some("NodeExpandVolume")) => {
            rewrite!(
                v1::NodeExpandVolumeRequest,
                volume_path,
                staging_target_path
            )
        }
        (true, Some("NodeStageVolume")) => {
            rewrite!(v0::NodeStageVolumeRequest, staging_target_path)
        }
        (true, Some("NodeUnstageVolume")) => {
            rewrite!(v0::NodeUnstageVolumeRequest, staging_target_path)
        }
        (true, Some("NodePublishVolume")) => {
            rewrite!(
                v0::NodePublishVolumeRequest,
                staging_target_path,
                target_path
            )
        }
        (true, Some("NodeUnpublishVolume")) => {
            rewrite!(v0::NodeUnpublishVolumeRequest, target_path)
        }
        _ => bytes.to_vec(),
    }
}

fn config(root: &Path, v0_api: bool) -> Config {
    Config {
        endpoint: root.join("csi.sock"),
        root: root.to_owned(),
        node_id: "node-1".into(),
        csi_version: if v0_api {
            CsiVersion::V0
        } else {
            CsiVersion::V1
        },
        pools: BTreeMap::from([("default".to_owned(), 64 << 20)]),
        max_volume_size: None,
        max_volumes_per_node: 0,
        faults_file: None,
        tool_timeout: Duration::from_secs(5),
    }
}

/// The target.
pub fn run(data: &[u8]) {
    let mut data = data;
    let v0_api = byte(&mut data) & 1 == 1;
    let dir = scratch();
    let root = dir.path().join("root");
    let co = dir.path().join("co");
    std::fs::create_dir_all(&co).expect("making the CO directory");
    let host = |root: &Path, state: &Arc<Mutex<HostState>>| FuzzHost {
        root: root.to_owned(),
        co: co.clone(),
        state: Arc::clone(state),
    };
    let state = Arc::new(Mutex::new(HostState::default()));
    let services = Services::open(&config(&root, v0_api), host(&root, &state))
        .unwrap_or_else(|e| panic!("the plugin does not open on a fresh root: {e:?}"));
    runtime().block_on(async {
        for _ in 0..12 {
            if data.is_empty() {
                break;
            }
            let rpc = usize::from(byte(&mut data)) % RPCS.len();
            let request = jailed(v0_api, rpc, chunk(&mut data), &co);
            let _ = services.call(v0_api, rpc, &request).await;
            let frozen = state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .frozen
                .clone();
            assert!(
                frozen.is_empty(),
                "{frozen:?} left frozen after {}",
                RPCS[rpc]
            );
        }
    });
    drop(services);
    let fresh = Arc::new(Mutex::new(HostState::default()));
    if let Err(e) = Services::open(&config(&root, v0_api), host(&root, &fresh)) {
        panic!("the plugin does not open again on its root: {e:?}");
    }
}

/// A seed input: `calls` as (rpc name, request bytes).
///
/// # Panics
/// For an RPC name not in [`RPCS`].
#[must_use]
pub fn seed(v0_api: bool, calls: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut out = vec![u8::from(v0_api)];
    for (name, bytes) in calls {
        let rpc = RPCS.iter().position(|n| n == name).expect("a known RPC");
        out.push(u8::try_from(rpc).expect("few RPCs"));
        put_chunk(&mut out, bytes);
    }
    out
}
