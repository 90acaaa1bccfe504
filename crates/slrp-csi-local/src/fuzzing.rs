//! Entry points for the fuzz targets (`crates/slrp-fuzz`), not an API: the plugin's CSI
//! services, v1 and v0, called with a request message's bytes as tonic's codec hands them
//! over (prost-decoded), on a [`Plugin`] over any [`Host`].

use std::sync::Arc;

use prost::Message;
use slrp_proto::csi::{v0, v1};
use tonic::{Request, Status};

use crate::config::Config;
use crate::csi::Shared;
use crate::csi::v0::CsiV0;
use crate::csi::v1::CsiV1;
use crate::host::Host;
use crate::plugin::{OpenError, Plugin};

/// The v1 and v0 services of one plugin (sharing its root and state).
#[derive(Debug)]
pub struct Services<H: Host> {
    v1: CsiV1<H>,
    v0: CsiV0<H>,
}

/// The RPCs [`Services::call`] serves, by index; the same names in v1 and v0 (v0 has no
/// expand, stats or GetSnapshot RPCs: those indices answer `None` there). New RPCs are
/// appended, so the committed corpus keeps its meaning.
pub const RPCS: &[&str] = &[
    "CreateVolume",
    "DeleteVolume",
    "ValidateVolumeCapabilities",
    "ListVolumes",
    "GetCapacity",
    "NodeStageVolume",
    "NodeUnstageVolume",
    "NodePublishVolume",
    "NodeUnpublishVolume",
    "ControllerExpandVolume",
    "NodeExpandVolume",
    "NodeGetVolumeStats",
    "ControllerPublishVolume",
    "GetPluginInfo",
    "NodeGetInfo",
    "CreateSnapshot",
    "DeleteSnapshot",
    "ListSnapshots",
    "GetSnapshot",
];

/// Decodes `bytes` as the request of `$svc::$method` and calls it; a body that does not
/// decode is answered as tonic answers it (INTERNAL, before the service sees it).
macro_rules! dispatch {
    ($svc:expr, $trait:path, $method:ident, $req:ty, $bytes:expr) => {{
        use $trait as _;
        match <$req>::decode($bytes) {
            Ok(req) => Some(
                $svc.$method(Request::new(req))
                    .await
                    .map(|r| r.into_inner().encoded_len()),
            ),
            Err(e) => Some(Err(Status::internal(format!("decoding the request: {e}")))),
        }
    }};
}

impl<H: Host> Services<H> {
    /// Opens the plugin on `config.root` (recovery included) with `host`.
    ///
    /// # Errors
    /// As [`Plugin::open`].
    pub fn open(config: &Config, host: H) -> Result<Self, OpenError> {
        let plugin = Plugin::open(config, host)?;
        let shared = Shared {
            faults: plugin.faults(),
            plugin: Arc::new(plugin),
        };
        Ok(Self {
            v1: CsiV1(shared.clone()),
            v0: CsiV0(shared),
        })
    }

    /// Calls RPC number `rpc` (of [`RPCS`]) of v1 (`v0` false) or v0 with the request
    /// encoded in `bytes`; the answer's encoded length or its status. `None`: no such RPC.
    pub async fn call(&self, v0: bool, rpc: usize, bytes: &[u8]) -> Option<Result<usize, Status>> {
        if v0 {
            self.call_v0(rpc, bytes).await
        } else {
            self.call_v1(rpc, bytes).await
        }
    }

    async fn call_v1(&self, rpc: usize, b: &[u8]) -> Option<Result<usize, Status>> {
        use v1::controller_server::Controller as C;
        use v1::identity_server::Identity as I;
        use v1::node_server::Node as N;
        let s = &self.v1;
        match rpc {
            0 => dispatch!(s, C, create_volume, v1::CreateVolumeRequest, b),
            1 => dispatch!(s, C, delete_volume, v1::DeleteVolumeRequest, b),
            2 => dispatch!(
                s,
                C,
                validate_volume_capabilities,
                v1::ValidateVolumeCapabilitiesRequest,
                b
            ),
            3 => dispatch!(s, C, list_volumes, v1::ListVolumesRequest, b),
            4 => dispatch!(s, C, get_capacity, v1::GetCapacityRequest, b),
            5 => dispatch!(s, N, node_stage_volume, v1::NodeStageVolumeRequest, b),
            6 => dispatch!(s, N, node_unstage_volume, v1::NodeUnstageVolumeRequest, b),
            7 => dispatch!(s, N, node_publish_volume, v1::NodePublishVolumeRequest, b),
            8 => dispatch!(
                s,
                N,
                node_unpublish_volume,
                v1::NodeUnpublishVolumeRequest,
                b
            ),
            9 => dispatch!(
                s,
                C,
                controller_expand_volume,
                v1::ControllerExpandVolumeRequest,
                b
            ),
            10 => dispatch!(s, N, node_expand_volume, v1::NodeExpandVolumeRequest, b),
            11 => dispatch!(
                s,
                N,
                node_get_volume_stats,
                v1::NodeGetVolumeStatsRequest,
                b
            ),
            12 => dispatch!(
                s,
                C,
                controller_publish_volume,
                v1::ControllerPublishVolumeRequest,
                b
            ),
            13 => dispatch!(s, I, get_plugin_info, v1::GetPluginInfoRequest, b),
            14 => dispatch!(s, N, node_get_info, v1::NodeGetInfoRequest, b),
            15 => dispatch!(s, C, create_snapshot, v1::CreateSnapshotRequest, b),
            16 => dispatch!(s, C, delete_snapshot, v1::DeleteSnapshotRequest, b),
            17 => dispatch!(s, C, list_snapshots, v1::ListSnapshotsRequest, b),
            18 => dispatch!(s, C, get_snapshot, v1::GetSnapshotRequest, b),
            _ => None,
        }
    }

    async fn call_v0(&self, rpc: usize, b: &[u8]) -> Option<Result<usize, Status>> {
        use v0::controller_server::Controller as C;
        use v0::identity_server::Identity as I;
        use v0::node_server::Node as N;
        let s = &self.v0;
        match rpc {
            0 => dispatch!(s, C, create_volume, v0::CreateVolumeRequest, b),
            1 => dispatch!(s, C, delete_volume, v0::DeleteVolumeRequest, b),
            2 => dispatch!(
                s,
                C,
                validate_volume_capabilities,
                v0::ValidateVolumeCapabilitiesRequest,
                b
            ),
            3 => dispatch!(s, C, list_volumes, v0::ListVolumesRequest, b),
            4 => dispatch!(s, C, get_capacity, v0::GetCapacityRequest, b),
            5 => dispatch!(s, N, node_stage_volume, v0::NodeStageVolumeRequest, b),
            6 => dispatch!(s, N, node_unstage_volume, v0::NodeUnstageVolumeRequest, b),
            7 => dispatch!(s, N, node_publish_volume, v0::NodePublishVolumeRequest, b),
            8 => dispatch!(
                s,
                N,
                node_unpublish_volume,
                v0::NodeUnpublishVolumeRequest,
                b
            ),
            12 => dispatch!(
                s,
                C,
                controller_publish_volume,
                v0::ControllerPublishVolumeRequest,
                b
            ),
            13 => dispatch!(s, I, get_plugin_info, v0::GetPluginInfoRequest, b),
            14 => dispatch!(s, N, node_get_info, v0::NodeGetInfoRequest, b),
            15 => dispatch!(s, C, create_snapshot, v0::CreateSnapshotRequest, b),
            16 => dispatch!(s, C, delete_snapshot, v0::DeleteSnapshotRequest, b),
            17 => dispatch!(s, C, list_snapshots, v0::ListSnapshotsRequest, b),
            _ => None,
        }
    }
}
