//! [`HostilePlugin`]: a CSI v1 plugin (identity, controller, node) on a unix socket that
//! misbehaves as each test sets it to, for process-level tests of what slrp makes of a
//! broken or hostile plugin (feature `hostile`).
//!
//! Left alone it is an honest, minimal plugin: it creates volumes in memory (idempotent by
//! name), lists them page by page, reports capacity from a fixed total, validates what it
//! knows and publishes by creating the target directory. A test switches misbehaviours
//! on and off at run time through [`HostilePlugin::set`] ([`Misbehaviour`]) and reads what
//! the plugin was asked through [`HostilePlugin::seen`] ([`Seen`]). Nothing it keeps grows
//! with a misbehaviour: an endless listing is generated page by page.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use slrp_proto::csi::v1 as pb;
use slrp_proto::csi::v1::controller_service_capability::rpc::Type as ControllerRpc;
use slrp_proto::csi::v1::plugin_capability::service::Type as ServiceType;
use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// gRPC status codes, for [`CreateAnswer::Fail`] and [`ListAnswer::Fail`].
pub use tonic::Code;

/// What CreateVolume answers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum CreateAnswer {
    /// The volume as asked: `required_bytes` (or 1 GiB), id `vol-<n>`.
    #[default]
    Honest,
    /// The volume, with this `capacity_bytes`.
    Capacity(i64),
    /// The volume, with this id (the plugin keeps it under that id).
    Id(String),
    /// The volume, with a context of `entries` entries of `value_bytes` each.
    Context {
        /// Entries in the context.
        entries: usize,
        /// Bytes of each value.
        value_bytes: usize,
    },
    /// An error (the volume is not created).
    Fail(Code, String),
}

/// What ListVolumes answers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ListAnswer {
    /// The plugin's volumes, `max_entries` per page (all at once for 0).
    #[default]
    Honest,
    /// A new `next_token` on every page, for ever: `entries` volumes per page with ids
    /// unique over the listing and a context of `context_bytes`.
    Endless {
        /// Volumes per page.
        entries: usize,
        /// Bytes of each volume's context.
        context_bytes: usize,
    },
    /// The plugin's volumes (one page), plus these entries (id, capacity) as given.
    Extra(Vec<(String, i64)>),
    /// The plugin's volumes, each listed twice (one page).
    Twice,
    /// An error.
    Fail(Code, String),
}

/// What the plugin does about volume health calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HealthAnswer {
    /// Advertises none of GET_VOLUME_STATS, GET_VOLUME, VOLUME_CONDITION (and answers
    /// their RPCs UNIMPLEMENTED, counted in [`Seen`]).
    #[default]
    NotAdvertised,
    /// Advertises the node's GET_VOLUME_STATS, and never answers NodeGetVolumeStats.
    HangStats,
}

/// How the plugin misbehaves; [`Misbehaviour::default`] is honest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Misbehaviour {
    /// CreateVolume's answer.
    pub create: CreateAnswer,
    /// ListVolumes' answer.
    pub list: ListAnswer,
    /// GetCapacity's `available_capacity` instead of what is free.
    pub capacity: Option<i64>,
    /// The volume health calls.
    pub health: HealthAnswer,
}

/// What the plugin was asked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    /// CreateVolume calls per name.
    pub creates: BTreeMap<String, usize>,
    /// DeleteVolume calls, by id, in order.
    pub deletes: Vec<String>,
    /// ListVolumes calls (pages).
    pub list_pages: usize,
    /// NodeGetVolumeStats calls (answered or not).
    pub stats_calls: usize,
    /// ControllerGetVolume calls.
    pub get_volume_calls: usize,
}

/// One volume the plugin has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostileVolume {
    /// The CreateVolume name (empty for one a test added).
    pub name: String,
    /// Its size as the plugin reports it.
    pub capacity: i64,
    /// Its context.
    pub context: BTreeMap<String, String>,
}

#[derive(Debug, Default)]
struct State {
    misbehaviour: Misbehaviour,
    seen: Seen,
    volumes: BTreeMap<String, HostileVolume>,
    by_name: BTreeMap<String, String>,
    next_id: u64,
}

/// The plugin's total capacity (GetCapacity answers this less what its volumes hold).
pub const HOSTILE_TOTAL_BYTES: i64 = 64 << 30;

#[derive(Debug, Clone)]
struct Service(Arc<Mutex<State>>);

impl Service {
    fn st(&self) -> std::sync::MutexGuard<'_, State> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A running hostile plugin; stops and removes its socket on drop.
#[derive(Debug)]
pub struct HostilePlugin {
    /// The socket it serves (CSI v1 identity, controller and node).
    pub socket: PathBuf,
    service: Service,
    _dir: Option<tempfile::TempDir>,
    stop: Option<oneshot::Sender<()>>,
}

impl HostilePlugin {
    /// Starts an honest plugin on a socket in a temporary directory.
    ///
    /// # Panics
    /// If the socket cannot be bound.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let socket = dir.path().join("csi.sock");
        Self::serve(socket, Some(dir))
    }

    /// Starts an honest plugin on `socket` (its directory must exist).
    ///
    /// # Panics
    /// If the socket cannot be bound.
    pub fn start_at(socket: &Path) -> Self {
        Self::serve(socket.to_owned(), None)
    }

    fn serve(socket: PathBuf, dir: Option<tempfile::TempDir>) -> Self {
        let service = Service(Arc::default());
        let listener = UnixListener::bind(&socket).expect("binding the plugin socket");
        let (stop, stopped) = oneshot::channel::<()>();
        let router = tonic::transport::Server::builder()
            .add_service(pb::identity_server::IdentityServer::new(service.clone()))
            .add_service(pb::controller_server::ControllerServer::new(
                service.clone(),
            ))
            .add_service(pb::node_server::NodeServer::new(service.clone()));
        tokio::spawn(async move {
            let _ = router
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await;
        });
        Self {
            socket,
            service,
            _dir: dir,
            stop: Some(stop),
        }
    }

    /// `unix://<socket>`, for a CSIPluginInfo endpoint.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// Misbehaves as `m` from now on.
    pub fn set(&self, m: Misbehaviour) {
        self.service.st().misbehaviour = m;
    }

    /// What it was asked so far.
    pub fn seen(&self) -> Seen {
        self.service.st().seen.clone()
    }

    /// Its volumes, by id.
    pub fn volumes(&self) -> BTreeMap<String, HostileVolume> {
        self.service.st().volumes.clone()
    }

    /// Adds a volume as if created outside slrp.
    pub fn add_volume(&self, id: &str, capacity: i64) {
        self.service.st().volumes.insert(
            id.to_owned(),
            HostileVolume {
                name: String::new(),
                capacity,
                context: BTreeMap::new(),
            },
        );
    }
}

impl Drop for HostilePlugin {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

fn volume(id: &str, v: &HostileVolume) -> pb::Volume {
    pb::Volume {
        volume_id: id.to_owned(),
        capacity_bytes: v.capacity,
        volume_context: v.context.clone().into_iter().collect(),
        ..pb::Volume::default()
    }
}

fn entry(v: pb::Volume) -> pb::list_volumes_response::Entry {
    pb::list_volumes_response::Entry {
        volume: Some(v),
        status: None,
    }
}

fn unimplemented<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented(
        "the hostile plugin does not serve this",
    ))
}

#[tonic::async_trait]
impl pb::identity_server::Identity for Service {
    async fn get_plugin_info(
        &self,
        _: Request<pb::GetPluginInfoRequest>,
    ) -> Result<Response<pb::GetPluginInfoResponse>, Status> {
        Ok(Response::new(pb::GetPluginInfoResponse {
            name: "hostile.slrp.io".into(),
            vendor_version: "0.1.0".into(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<pb::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<pb::GetPluginCapabilitiesResponse>, Status> {
        use pb::plugin_capability::{Service as Svc, Type};
        Ok(Response::new(pb::GetPluginCapabilitiesResponse {
            capabilities: vec![pb::PluginCapability {
                r#type: Some(Type::Service(Svc {
                    r#type: ServiceType::ControllerService as i32,
                })),
            }],
        }))
    }

    async fn probe(
        &self,
        _: Request<pb::ProbeRequest>,
    ) -> Result<Response<pb::ProbeResponse>, Status> {
        Ok(Response::new(pb::ProbeResponse { ready: Some(true) }))
    }
}

#[tonic::async_trait]
impl pb::controller_server::Controller for Service {
    async fn create_volume(
        &self,
        request: Request<pb::CreateVolumeRequest>,
    ) -> Result<Response<pb::CreateVolumeResponse>, Status> {
        let r = request.into_inner();
        let mut st = self.st();
        *st.seen.creates.entry(r.name.clone()).or_default() += 1;
        let answer = st.misbehaviour.create.clone();
        if let CreateAnswer::Fail(code, message) = answer {
            return Err(Status::new(code, message));
        }
        let id = match st.by_name.get(&r.name) {
            Some(id) => id.clone(),
            None => {
                st.next_id += 1;
                let id = match &answer {
                    CreateAnswer::Id(id) => id.clone(),
                    CreateAnswer::Honest
                    | CreateAnswer::Capacity(_)
                    | CreateAnswer::Context { .. }
                    | CreateAnswer::Fail(..) => format!("vol-{}", st.next_id),
                };
                let asked = r
                    .capacity_range
                    .map_or(1 << 30, |c| c.required_bytes.max(c.limit_bytes));
                let capacity = match answer {
                    CreateAnswer::Capacity(c) => c,
                    CreateAnswer::Honest
                    | CreateAnswer::Id(_)
                    | CreateAnswer::Context { .. }
                    | CreateAnswer::Fail(..) => asked,
                };
                let context = match answer {
                    CreateAnswer::Context {
                        entries,
                        value_bytes,
                    } => (0..entries)
                        .map(|i| (format!("key-{i:06}"), "v".repeat(value_bytes)))
                        .collect(),
                    CreateAnswer::Honest
                    | CreateAnswer::Id(_)
                    | CreateAnswer::Capacity(_)
                    | CreateAnswer::Fail(..) => BTreeMap::new(),
                };
                st.by_name.insert(r.name.clone(), id.clone());
                st.volumes.insert(
                    id.clone(),
                    HostileVolume {
                        name: r.name.clone(),
                        capacity,
                        context,
                    },
                );
                id
            }
        };
        let v = &st.volumes[&id];
        Ok(Response::new(pb::CreateVolumeResponse {
            volume: Some(volume(&id, v)),
        }))
    }

    async fn delete_volume(
        &self,
        request: Request<pb::DeleteVolumeRequest>,
    ) -> Result<Response<pb::DeleteVolumeResponse>, Status> {
        let id = request.into_inner().volume_id;
        let mut st = self.st();
        st.seen.deletes.push(id.clone());
        if let Some(v) = st.volumes.remove(&id) {
            st.by_name.remove(&v.name);
        }
        Ok(Response::new(pb::DeleteVolumeResponse {}))
    }

    async fn controller_publish_volume(
        &self,
        _: Request<pb::ControllerPublishVolumeRequest>,
    ) -> Result<Response<pb::ControllerPublishVolumeResponse>, Status> {
        unimplemented()
    }

    async fn controller_unpublish_volume(
        &self,
        _: Request<pb::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<pb::ControllerUnpublishVolumeResponse>, Status> {
        unimplemented()
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<pb::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<pb::ValidateVolumeCapabilitiesResponse>, Status> {
        let r = request.into_inner();
        if !self.st().volumes.contains_key(&r.volume_id) {
            return Err(Status::not_found("no such volume"));
        }
        Ok(Response::new(pb::ValidateVolumeCapabilitiesResponse {
            confirmed: Some(pb::validate_volume_capabilities_response::Confirmed {
                volume_context: r.volume_context,
                volume_capabilities: r.volume_capabilities,
                parameters: r.parameters,
                mutable_parameters: Default::default(),
            }),
            message: String::new(),
        }))
    }

    async fn list_volumes(
        &self,
        request: Request<pb::ListVolumesRequest>,
    ) -> Result<Response<pb::ListVolumesResponse>, Status> {
        let r = request.into_inner();
        let mut st = self.st();
        st.seen.list_pages += 1;
        let all =
            || -> Vec<pb::Volume> { st.volumes.iter().map(|(id, v)| volume(id, v)).collect() };
        let page = match st.misbehaviour.list.clone() {
            ListAnswer::Fail(code, message) => return Err(Status::new(code, message)),
            ListAnswer::Honest => {
                let start: usize = r.starting_token.parse().unwrap_or(0);
                let volumes = all();
                let n = usize::try_from(r.max_entries)
                    .ok()
                    .filter(|n| *n > 0)
                    .unwrap_or(volumes.len());
                let end = start.saturating_add(n).min(volumes.len());
                pb::ListVolumesResponse {
                    entries: volumes
                        .get(start..end)
                        .unwrap_or_default()
                        .iter()
                        .cloned()
                        .map(entry)
                        .collect(),
                    next_token: if end < volumes.len() {
                        end.to_string()
                    } else {
                        String::new()
                    },
                }
            }
            ListAnswer::Endless {
                entries,
                context_bytes,
            } => {
                let page: u64 = r.starting_token.parse().unwrap_or(0);
                pb::ListVolumesResponse {
                    entries: (0..entries)
                        .map(|i| {
                            entry(pb::Volume {
                                volume_id: format!("endless-{page}-{i}"),
                                capacity_bytes: 1 << 20,
                                volume_context: [("c".to_owned(), "x".repeat(context_bytes))]
                                    .into_iter()
                                    .collect(),
                                ..pb::Volume::default()
                            })
                        })
                        .collect(),
                    next_token: (page + 1).to_string(),
                }
            }
            ListAnswer::Extra(extra) => {
                let mut entries: Vec<_> = all().into_iter().map(entry).collect();
                entries.extend(extra.into_iter().map(|(id, capacity)| {
                    entry(pb::Volume {
                        volume_id: id,
                        capacity_bytes: capacity,
                        ..pb::Volume::default()
                    })
                }));
                pb::ListVolumesResponse {
                    entries,
                    next_token: String::new(),
                }
            }
            ListAnswer::Twice => pb::ListVolumesResponse {
                entries: all()
                    .into_iter()
                    .flat_map(|v| [entry(v.clone()), entry(v)])
                    .collect(),
                next_token: String::new(),
            },
        };
        Ok(Response::new(page))
    }

    async fn get_capacity(
        &self,
        _: Request<pb::GetCapacityRequest>,
    ) -> Result<Response<pb::GetCapacityResponse>, Status> {
        let st = self.st();
        let used: i64 = st.volumes.values().map(|v| v.capacity.max(0)).sum();
        let available = st
            .misbehaviour
            .capacity
            .unwrap_or_else(|| HOSTILE_TOTAL_BYTES.saturating_sub(used).max(0));
        Ok(Response::new(pb::GetCapacityResponse {
            available_capacity: available,
            maximum_volume_size: None,
            minimum_volume_size: None,
        }))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<pb::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<pb::ControllerGetCapabilitiesResponse>, Status> {
        use pb::controller_service_capability::{Rpc, Type};
        let rpc = |t: ControllerRpc| pb::ControllerServiceCapability {
            r#type: Some(Type::Rpc(Rpc { r#type: t as i32 })),
        };
        Ok(Response::new(pb::ControllerGetCapabilitiesResponse {
            capabilities: vec![
                rpc(ControllerRpc::CreateDeleteVolume),
                rpc(ControllerRpc::ListVolumes),
                rpc(ControllerRpc::GetCapacity),
            ],
        }))
    }

    async fn create_snapshot(
        &self,
        _: Request<pb::CreateSnapshotRequest>,
    ) -> Result<Response<pb::CreateSnapshotResponse>, Status> {
        unimplemented()
    }

    async fn delete_snapshot(
        &self,
        _: Request<pb::DeleteSnapshotRequest>,
    ) -> Result<Response<pb::DeleteSnapshotResponse>, Status> {
        unimplemented()
    }

    async fn list_snapshots(
        &self,
        _: Request<pb::ListSnapshotsRequest>,
    ) -> Result<Response<pb::ListSnapshotsResponse>, Status> {
        unimplemented()
    }

    async fn get_snapshot(
        &self,
        _: Request<pb::GetSnapshotRequest>,
    ) -> Result<Response<pb::GetSnapshotResponse>, Status> {
        unimplemented()
    }

    async fn controller_expand_volume(
        &self,
        _: Request<pb::ControllerExpandVolumeRequest>,
    ) -> Result<Response<pb::ControllerExpandVolumeResponse>, Status> {
        unimplemented()
    }

    async fn controller_get_volume(
        &self,
        _: Request<pb::ControllerGetVolumeRequest>,
    ) -> Result<Response<pb::ControllerGetVolumeResponse>, Status> {
        self.st().seen.get_volume_calls += 1;
        unimplemented()
    }

    async fn controller_modify_volume(
        &self,
        _: Request<pb::ControllerModifyVolumeRequest>,
    ) -> Result<Response<pb::ControllerModifyVolumeResponse>, Status> {
        unimplemented()
    }
}

#[tonic::async_trait]
impl pb::node_server::Node for Service {
    async fn node_stage_volume(
        &self,
        _: Request<pb::NodeStageVolumeRequest>,
    ) -> Result<Response<pb::NodeStageVolumeResponse>, Status> {
        unimplemented()
    }

    async fn node_unstage_volume(
        &self,
        _: Request<pb::NodeUnstageVolumeRequest>,
    ) -> Result<Response<pb::NodeUnstageVolumeResponse>, Status> {
        unimplemented()
    }

    async fn node_publish_volume(
        &self,
        request: Request<pb::NodePublishVolumeRequest>,
    ) -> Result<Response<pb::NodePublishVolumeResponse>, Status> {
        // CSI v1: the plugin creates the target; an empty directory stands for a mount.
        let target = request.into_inner().target_path;
        std::fs::create_dir_all(Path::new(&target))
            .map_err(|e| Status::internal(format!("creating {target}: {e}")))?;
        Ok(Response::new(pb::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<pb::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<pb::NodeUnpublishVolumeResponse>, Status> {
        let target = request.into_inner().target_path;
        match std::fs::remove_dir(Path::new(&target)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Status::internal(format!("removing {target}: {e}"))),
        }
        Ok(Response::new(pb::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        _: Request<pb::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<pb::NodeGetVolumeStatsResponse>, Status> {
        let health = {
            let mut st = self.st();
            st.seen.stats_calls += 1;
            st.misbehaviour.health
        };
        match health {
            HealthAnswer::NotAdvertised => unimplemented(),
            HealthAnswer::HangStats => std::future::pending().await,
        }
    }

    async fn node_expand_volume(
        &self,
        _: Request<pb::NodeExpandVolumeRequest>,
    ) -> Result<Response<pb::NodeExpandVolumeResponse>, Status> {
        unimplemented()
    }

    async fn node_get_capabilities(
        &self,
        _: Request<pb::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<pb::NodeGetCapabilitiesResponse>, Status> {
        use pb::node_service_capability::{Rpc, Type, rpc::Type as NodeRpc};
        let capabilities = match self.st().misbehaviour.health {
            HealthAnswer::NotAdvertised => Vec::new(),
            HealthAnswer::HangStats => vec![pb::NodeServiceCapability {
                r#type: Some(Type::Rpc(Rpc {
                    r#type: NodeRpc::GetVolumeStats as i32,
                })),
            }],
        };
        Ok(Response::new(pb::NodeGetCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<pb::NodeGetInfoRequest>,
    ) -> Result<Response<pb::NodeGetInfoResponse>, Status> {
        Ok(Response::new(pb::NodeGetInfoResponse {
            node_id: "hostile-node".into(),
            max_volumes_per_node: 0,
            accessible_topology: None,
        }))
    }
}
