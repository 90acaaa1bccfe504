//! CSI conformance: every csi-sanity (kubernetes-csi/csi-test `pkg/sanity`) case that applies
//! to the capabilities this plugin advertises, replayed against the real binary over its
//! socket, plus the CSI spec rules csi-sanity does not check.
//!
//! Each `sanity_*` test mirrors one csi-sanity `It(...)`: the same requests (csi-sanity's
//! defaults: 10 GiB volumes, expansion by 1 GiB, SINGLE_NODE_WRITER MOUNT capability with no
//! fs_type, staging path and target parent created beforehand, target `<parent>/target`),
//! the same expectations, and the same cleanup (newest resource first: NodeUnpublish,
//! NodeUnstage, DeleteVolume for a volume, where any error but NOT_FOUND fails the test;
//! DeleteSnapshot for a snapshot, where any error fails it). The node lifecycle cases also
//! run with
//! csi-sanity's `--csi.testvolumeparameters backend=loop` and `--csi.testvolumeaccesstype
//! block`, and so do the restore and clone cases. `spec_*` tests check spec rules beyond csi-sanity. docs/csi-local.md
//! ("Conformance") maps each csi-sanity case to its test here.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::tests_outside_test_module
)]

#[path = "../common/mod.rs"]
mod common;
mod controller;
mod identity;
mod node;
mod snapshots;
mod spec;
mod v0_service;

use std::collections::{HashMap, HashSet};

use common::*;
use slrp_proto::csi::{v0, v1};
use tonic::Code;
use v1::volume_capability::access_mode::Mode;

const GIB: i64 = 1 << 30;
/// csi-sanity's default `TestVolumeSize`.
const SIZE: i64 = 10 * GIB;
/// csi-sanity's `TestVolumeExpandSize` default: `TestVolumeSize` + 1 GiB.
const EXPAND_SIZE: i64 = SIZE + GIB;
/// csi-sanity's `MaxNameLength`.
const MAX_NAME_LENGTH: usize = 128;
/// csi-sanity's `UniqueString` suffix: `-` and a `PseudoUUID` drawn once per run.
const UNIQUE_SUFFIX: &str = "-5EED51C0-0BADF00D";

/// csi-sanity's `UniqueString`.
fn unique(prefix: &str) -> String {
    format!("{prefix}{UNIQUE_SUFFIX}")
}

/// csi-sanity's `UniqueStringWithLength`: the unique string padded with `a` to `length`.
fn unique_with_length(prefix: &str, length: usize) -> String {
    let s = unique(prefix);
    assert!(s.len() <= length, "prefix {prefix:?} is too long");
    format!("{s}{}", "a".repeat(length - s.len()))
}

/// How csi-sanity is configured for a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flavour {
    /// Defaults: MOUNT access, no parameters (a `dir` volume).
    Dir,
    /// `--csi.testvolumeparameters backend=loop`: an ext4 loop volume.
    LoopMount,
    /// `--csi.testvolumeaccesstype block` (the plugin picks the loop backend).
    Block,
}

/// One csi-sanity `TestContext` plus its `Resources`: a plugin, clients, the staging and
/// target locations, and the volumes to clean up.
struct Sanity {
    p: TestPlugin,
    c: V1,
    flavour: Flavour,
    staging: String,
    target_parent: String,
    created: Vec<String>,
    /// Snapshots to clean up, each with the number of volumes registered before it, so
    /// the cleanup runs newest first across both kinds, as csi-sanity's `Resources` does.
    snapshots: Vec<(usize, String)>,
    /// `MountVolume.fs_type` of mount capabilities; empty = the plugin's default (ext4).
    fs_type: String,
}

impl Sanity {
    async fn start() -> Self {
        Self::start_with(Flavour::Dir).await
    }

    async fn start_with(flavour: Flavour) -> Self {
        Self::start_with_flags(flavour, &[]).await
    }

    async fn start_with_flags(flavour: Flavour, extra: &[&str]) -> Self {
        // Default flags, as csi-sanity is run against a default installation: the default
        // pool must hold its 10 GiB volumes and their growth to 11 GiB.
        let p = TestPlugin::start_defaults_and(extra).await;
        let c = p.v1().await;
        // csi-sanity creates both directories before the suite runs.
        let staging = p.path_str("csi-staging");
        let target_parent = p.path_str("csi-mount");
        std::fs::create_dir_all(&staging).unwrap();
        std::fs::create_dir_all(&target_parent).unwrap();
        Self {
            p,
            c,
            flavour,
            staging,
            target_parent,
            created: Vec::new(),
            snapshots: Vec::new(),
            fs_type: String::new(),
        }
    }

    fn target(&self) -> String {
        format!("{}/target", self.target_parent)
    }

    /// csi-sanity's `TestVolumeCapabilityWithAccessType`.
    fn cap(&self, mode: Mode) -> v1::VolumeCapability {
        use v1::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
        v1::VolumeCapability {
            access_mode: Some(AccessMode { mode: mode as i32 }),
            access_type: Some(if self.flavour == Flavour::Block {
                AccessType::Block(BlockVolume {})
            } else {
                AccessType::Mount(MountVolume {
                    fs_type: self.fs_type.clone(),
                    ..MountVolume::default()
                })
            }),
        }
    }

    fn snw(&self) -> v1::VolumeCapability {
        self.cap(Mode::SingleNodeWriter)
    }

    /// csi-sanity's `MakeCreateVolumeReq`.
    fn create_req(&self, name: &str) -> v1::CreateVolumeRequest {
        let parameters = match self.flavour {
            Flavour::LoopMount => HashMap::from([("backend".to_owned(), "loop".to_owned())]),
            Flavour::Dir | Flavour::Block => HashMap::new(),
        };
        v1::CreateVolumeRequest {
            name: name.to_owned(),
            volume_capabilities: vec![self.snw()],
            capacity_range: Some(v1::CapacityRange {
                required_bytes: SIZE,
                limit_bytes: 0,
            }),
            parameters,
            ..Default::default()
        }
    }

    /// CreateVolume that registers the volume for cleanup, like csi-sanity's `Resources`.
    async fn create(&mut self, req: v1::CreateVolumeRequest) -> Result<v1::Volume, tonic::Status> {
        let v = self
            .c
            .controller
            .create_volume(req)
            .await?
            .into_inner()
            .volume
            .expect("CreateVolumeResponse.volume is REQUIRED");
        if !self.created.contains(&v.volume_id) {
            self.created.push(v.volume_id.clone());
        }
        Ok(v)
    }

    async fn must_create(&mut self, name: &str) -> v1::Volume {
        let req = self.create_req(name);
        self.create(req).await.expect("CreateVolume")
    }

    fn stage_req(&self, v: &v1::Volume, cap: v1::VolumeCapability) -> v1::NodeStageVolumeRequest {
        v1::NodeStageVolumeRequest {
            volume_id: v.volume_id.clone(),
            staging_target_path: self.staging.clone(),
            volume_capability: Some(cap),
            volume_context: v.volume_context.clone(),
            ..Default::default()
        }
    }

    fn publish_req(
        &self,
        v: &v1::Volume,
        cap: v1::VolumeCapability,
    ) -> v1::NodePublishVolumeRequest {
        v1::NodePublishVolumeRequest {
            volume_id: v.volume_id.clone(),
            staging_target_path: self.staging.clone(),
            target_path: self.target(),
            volume_capability: Some(cap),
            volume_context: v.volume_context.clone(),
            ..Default::default()
        }
    }

    async fn stage_and_publish(&mut self, v: &v1::Volume) {
        let (stage, publish) = (
            self.stage_req(v, self.snw()),
            self.publish_req(v, self.snw()),
        );
        self.c.node.node_stage_volume(stage).await.unwrap();
        self.c.node.node_publish_volume(publish).await.unwrap();
    }

    /// csi-sanity's `Resources.Cleanup`, newest resource first: for a volume any error but
    /// NOT_FOUND fails, for a snapshot any error.
    async fn cleanup(mut self) {
        let ignore_not_found = |what: &str, r: Result<(), tonic::Status>| match r {
            Err(s) if s.code() != Code::NotFound => panic!("cleanup: {what}: {s:?}"),
            _ => {}
        };
        let mut snapshots = std::mem::take(&mut self.snapshots);
        let volumes = std::mem::take(&mut self.created);
        for (index, id) in volumes.into_iter().enumerate().rev() {
            self.cleanup_snapshots_after(&mut snapshots, index + 1)
                .await;
            let r = self
                .c
                .node
                .node_unpublish_volume(v1::NodeUnpublishVolumeRequest {
                    volume_id: id.clone(),
                    target_path: self.target(),
                })
                .await
                .map(drop);
            ignore_not_found("NodeUnpublishVolume", r);
            let r = self
                .c
                .node
                .node_unstage_volume(v1::NodeUnstageVolumeRequest {
                    volume_id: id.clone(),
                    staging_target_path: self.staging.clone(),
                })
                .await
                .map(drop);
            ignore_not_found("NodeUnstageVolume", r);
            self.c
                .controller
                .delete_volume(v1::DeleteVolumeRequest {
                    volume_id: id.clone(),
                    ..Default::default()
                })
                .await
                .unwrap_or_else(|s| panic!("cleanup: DeleteVolume {id}: {s:?}"));
        }
        self.cleanup_snapshots_after(&mut snapshots, 0).await;
        assert!(self.p.mounts_here().is_empty(), "cleanup left mounts");
        let loops = self.p.loops_after_release().await;
        assert!(loops.is_empty(), "cleanup left loop devices: {loops:?}");
    }
}

impl Sanity {
    /// Deletes, newest first, the snapshots registered after the first `volumes` volumes.
    async fn cleanup_snapshots_after(
        &mut self,
        snapshots: &mut Vec<(usize, String)>,
        volumes: usize,
    ) {
        while let Some((_, id)) = snapshots.pop_if(|(before, _)| *before >= volumes) {
            self.c
                .controller
                .delete_snapshot(v1::DeleteSnapshotRequest {
                    snapshot_id: id.clone(),
                    ..Default::default()
                })
                .await
                .unwrap_or_else(|s| panic!("cleanup: DeleteSnapshot {id}: {s:?}"));
        }
    }
}

fn code_is<T: std::fmt::Debug>(res: Result<T, tonic::Status>, code: Code) {
    assert_code(res, code);
}

/// Whether the flavour can run here; prints why not.
fn flavour_runs(test: &str, flavour: Flavour) -> bool {
    if !can_mount(test) {
        return false;
    }
    if flavour == Flavour::LoopMount && !slrp_test_support::require_tool(test, "mkfs.ext4") {
        return false;
    }
    true
}

/// csi-sanity's plugin-name check: `^[a-zA-Z][A-Za-z0-9-\.\_]{0,61}[a-zA-Z]$`.
fn sanity_name_ok(name: &str) -> bool {
    let b = name.as_bytes();
    (2..=63).contains(&b.len())
        && b[0].is_ascii_alphabetic()
        && b[b.len() - 1].is_ascii_alphabetic()
        && b[1..b.len() - 1]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || b"-._\\".contains(c))
}

async fn controller_expand(s: &mut Sanity, v: &v1::Volume, cap: bool) -> i64 {
    let req = v1::ControllerExpandVolumeRequest {
        volume_id: v.volume_id.clone(),
        capacity_range: Some(v1::CapacityRange {
            required_bytes: EXPAND_SIZE,
            limit_bytes: 0,
        }),
        volume_capability: cap.then(|| s.snw()),
        ..Default::default()
    };
    s.c.controller
        .controller_expand_volume(req)
        .await
        .unwrap()
        .into_inner()
        .capacity_bytes
}

/// ExpandVolume / should work.
fn v0_cap() -> v0::VolumeCapability {
    use v0::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
    v0::VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

/// NodeExpandVolume: a capability the volume does not serve is INVALID_ARGUMENT ("Exceeds
impl Sanity {
    async fn cleanup_node(&mut self, v: &v1::Volume) {
        self.c
            .node
            .node_unpublish_volume(v1::NodeUnpublishVolumeRequest {
                volume_id: v.volume_id.clone(),
                target_path: self.target(),
            })
            .await
            .unwrap();
        self.c
            .node
            .node_unstage_volume(v1::NodeUnstageVolumeRequest {
                volume_id: v.volume_id.clone(),
                staging_target_path: self.staging.clone(),
            })
            .await
            .unwrap();
    }
}

/// NodeExpandVolume of the published volume to csi-sanity's expansion size.
async fn node_expand(s: &mut Sanity, v: &v1::Volume) -> i64 {
    let req = v1::NodeExpandVolumeRequest {
        volume_id: v.volume_id.clone(),
        volume_path: s.target(),
        capacity_range: Some(v1::CapacityRange {
            required_bytes: EXPAND_SIZE,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    s.c.node
        .node_expand_volume(req)
        .await
        .unwrap()
        .into_inner()
        .capacity_bytes
}
