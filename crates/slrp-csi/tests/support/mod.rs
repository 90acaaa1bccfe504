//! A scripted in-process CSI plugin (v1 or v0) on a unix socket in a tempdir.
//!
//! Every RPC looks up the next scripted step for its method name: a queue of one-shot
//! steps first, then a standing reply; anything unscripted answers `UNIMPLEMENTED`, so a
//! test fails loudly on a call it did not expect. Every request is recorded with the
//! (paused or real) tokio time at which it arrived.

// Test-only helper module: panicking on a poisoned lock or a mis-scripted test is the point.
#![allow(
    dead_code,
    unreachable_pub,
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used
)]

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use slrp_proto::csi::{v0 as pb0, v1 as pb1};
use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Code, Request, Response, Status};

pub type Handler =
    Arc<dyn Fn(&(dyn Any + Send)) -> Result<Box<dyn Any + Send>, Status> + Send + Sync>;

#[derive(Clone)]
pub struct Step {
    pub delay: Option<Duration>,
    pub handler: Handler,
}

pub struct Call {
    pub rpc: String,
    pub at: Instant,
    pub request: Box<dyn Any + Send>,
}

pub struct Script {
    epoch: Instant,
    queued: Mutex<HashMap<String, VecDeque<Step>>>,
    standing: Mutex<HashMap<String, Step>>,
    calls: Mutex<Vec<Call>>,
}

impl Script {
    fn new() -> Self {
        Self {
            epoch: Instant::now(),
            queued: Mutex::default(),
            standing: Mutex::default(),
            calls: Mutex::default(),
        }
    }

    /// Always answer `rpc` with `resp`.
    pub fn reply<R: Any + Send + Clone + Sync>(&self, rpc: &str, resp: R) {
        self.standing.lock().unwrap().insert(
            rpc.to_owned(),
            Step {
                delay: None,
                handler: Arc::new(move |_| Ok(Box::new(resp.clone()))),
            },
        );
    }

    /// Always answer `rpc` by calling `f` with the request.
    pub fn reply_with<Req: Any, Resp: Any + Send>(
        &self,
        rpc: &str,
        f: impl Fn(&Req) -> Result<Resp, Status> + Send + Sync + 'static,
    ) {
        self.standing.lock().unwrap().insert(
            rpc.to_owned(),
            Step {
                delay: None,
                handler: handler(f),
            },
        );
    }

    /// The next `times` calls of `rpc` fail with `code`.
    pub fn fail_times(&self, rpc: &str, code: Code, times: usize) {
        let mut q = self.queued.lock().unwrap();
        let entry = q.entry(rpc.to_owned()).or_default();
        for _ in 0..times {
            entry.push_back(Step {
                delay: None,
                handler: Arc::new(move |_| Err(Status::new(code, "scripted failure"))),
            });
        }
    }

    /// The next call of `rpc` waits `delay` before being answered by the standing reply
    /// (or by `UNIMPLEMENTED` if there is none).
    pub fn delay_once(&self, rpc: &str, delay: Duration) {
        let standing = self.standing.lock().unwrap().get(rpc).cloned();
        let handler = standing
            .map(|s| s.handler)
            .unwrap_or_else(|| Arc::new(|_| Err(Status::unimplemented("unscripted"))));
        self.queued
            .lock()
            .unwrap()
            .entry(rpc.to_owned())
            .or_default()
            .push_back(Step {
                delay: Some(delay),
                handler,
            });
    }

    /// Names of the calls received, in order.
    pub fn call_names(&self) -> Vec<String> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .map(|c| c.rpc.clone())
            .collect()
    }

    /// Arrival times (seconds since the fake started) of calls of `rpc`.
    pub fn call_times(&self, rpc: &str) -> Vec<u64> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.rpc == rpc)
            .map(|c| (c.at - self.epoch).as_secs())
            .collect()
    }

    /// Requests of `rpc`, decoded as `R`.
    pub fn requests<R: Any + Clone>(&self, rpc: &str) -> Vec<R> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.rpc == rpc)
            .map(|c| c.request.downcast_ref::<R>().expect("request type").clone())
            .collect()
    }

    async fn handle<Req: Any + Send, Resp: Any>(
        &self,
        rpc: &str,
        req: Req,
    ) -> Result<Response<Resp>, Status> {
        let step = {
            let mut q = self.queued.lock().unwrap();
            q.get_mut(rpc).and_then(VecDeque::pop_front)
        }
        .or_else(|| self.standing.lock().unwrap().get(rpc).cloned());
        let boxed: Box<dyn Any + Send> = Box::new(req);
        let result = match &step {
            None => Err(Status::unimplemented(format!("fake: {rpc} not scripted"))),
            Some(step) => (step.handler)(boxed.as_ref()),
        };
        self.calls.lock().unwrap().push(Call {
            rpc: rpc.to_owned(),
            at: Instant::now(),
            request: boxed,
        });
        if let Some(d) = step.as_ref().and_then(|s| s.delay) {
            tokio::time::sleep(d).await;
        }
        let out = result?;
        out.downcast::<Resp>()
            .map(|b| Response::new(*b))
            .map_err(|_| Status::internal(format!("fake: wrong reply type for {rpc}")))
    }
}

pub fn handler<Req: Any, Resp: Any + Send>(
    f: impl Fn(&Req) -> Result<Resp, Status> + Send + Sync + 'static,
) -> Handler {
    Arc::new(move |req| {
        let req = req
            .downcast_ref::<Req>()
            .ok_or_else(|| Status::internal("fake: wrong request type"))?;
        Ok(Box::new(f(req)?) as Box<dyn Any + Send>)
    })
}

#[derive(Clone)]
pub struct Fake(Arc<Script>);

// The whole impl is generated so that `async_trait` sees the methods (an attribute
// cannot look into a macro call inside the impl).
macro_rules! fake_impl {
    ($tr:path; $pb:ident; $($method:ident => $name:literal : $req:ident -> $resp:ident),* $(,)?) => {
        #[tonic::async_trait]
        impl $tr for Fake {
            $(
                async fn $method(
                    &self,
                    request: Request<$pb::$req>,
                ) -> Result<Response<$pb::$resp>, Status> {
                    self.0.handle($name, request.into_inner()).await
                }
            )*
        }
    };
}

fake_impl!(pb1::identity_server::Identity; pb1;
    get_plugin_info => "GetPluginInfo": GetPluginInfoRequest -> GetPluginInfoResponse,
    get_plugin_capabilities => "GetPluginCapabilities": GetPluginCapabilitiesRequest -> GetPluginCapabilitiesResponse,
    probe => "Probe": ProbeRequest -> ProbeResponse,
);

fake_impl!(pb1::controller_server::Controller; pb1;
    create_volume => "CreateVolume": CreateVolumeRequest -> CreateVolumeResponse,
    delete_volume => "DeleteVolume": DeleteVolumeRequest -> DeleteVolumeResponse,
    controller_publish_volume => "ControllerPublishVolume": ControllerPublishVolumeRequest -> ControllerPublishVolumeResponse,
    controller_unpublish_volume => "ControllerUnpublishVolume": ControllerUnpublishVolumeRequest -> ControllerUnpublishVolumeResponse,
    validate_volume_capabilities => "ValidateVolumeCapabilities": ValidateVolumeCapabilitiesRequest -> ValidateVolumeCapabilitiesResponse,
    list_volumes => "ListVolumes": ListVolumesRequest -> ListVolumesResponse,
    get_capacity => "GetCapacity": GetCapacityRequest -> GetCapacityResponse,
    controller_get_capabilities => "ControllerGetCapabilities": ControllerGetCapabilitiesRequest -> ControllerGetCapabilitiesResponse,
    create_snapshot => "CreateSnapshot": CreateSnapshotRequest -> CreateSnapshotResponse,
    delete_snapshot => "DeleteSnapshot": DeleteSnapshotRequest -> DeleteSnapshotResponse,
    list_snapshots => "ListSnapshots": ListSnapshotsRequest -> ListSnapshotsResponse,
    get_snapshot => "GetSnapshot": GetSnapshotRequest -> GetSnapshotResponse,
    controller_expand_volume => "ControllerExpandVolume": ControllerExpandVolumeRequest -> ControllerExpandVolumeResponse,
    controller_get_volume => "ControllerGetVolume": ControllerGetVolumeRequest -> ControllerGetVolumeResponse,
    controller_modify_volume => "ControllerModifyVolume": ControllerModifyVolumeRequest -> ControllerModifyVolumeResponse,
);

fake_impl!(pb1::node_server::Node; pb1;
    node_stage_volume => "NodeStageVolume": NodeStageVolumeRequest -> NodeStageVolumeResponse,
    node_unstage_volume => "NodeUnstageVolume": NodeUnstageVolumeRequest -> NodeUnstageVolumeResponse,
    node_publish_volume => "NodePublishVolume": NodePublishVolumeRequest -> NodePublishVolumeResponse,
    node_unpublish_volume => "NodeUnpublishVolume": NodeUnpublishVolumeRequest -> NodeUnpublishVolumeResponse,
    node_get_volume_stats => "NodeGetVolumeStats": NodeGetVolumeStatsRequest -> NodeGetVolumeStatsResponse,
    node_expand_volume => "NodeExpandVolume": NodeExpandVolumeRequest -> NodeExpandVolumeResponse,
    node_get_capabilities => "NodeGetCapabilities": NodeGetCapabilitiesRequest -> NodeGetCapabilitiesResponse,
    node_get_info => "NodeGetInfo": NodeGetInfoRequest -> NodeGetInfoResponse,
);

fake_impl!(pb0::identity_server::Identity; pb0;
    get_plugin_info => "GetPluginInfo": GetPluginInfoRequest -> GetPluginInfoResponse,
    get_plugin_capabilities => "GetPluginCapabilities": GetPluginCapabilitiesRequest -> GetPluginCapabilitiesResponse,
    probe => "Probe": ProbeRequest -> ProbeResponse,
);

fake_impl!(pb0::controller_server::Controller; pb0;
    create_volume => "CreateVolume": CreateVolumeRequest -> CreateVolumeResponse,
    delete_volume => "DeleteVolume": DeleteVolumeRequest -> DeleteVolumeResponse,
    controller_publish_volume => "ControllerPublishVolume": ControllerPublishVolumeRequest -> ControllerPublishVolumeResponse,
    controller_unpublish_volume => "ControllerUnpublishVolume": ControllerUnpublishVolumeRequest -> ControllerUnpublishVolumeResponse,
    validate_volume_capabilities => "ValidateVolumeCapabilities": ValidateVolumeCapabilitiesRequest -> ValidateVolumeCapabilitiesResponse,
    list_volumes => "ListVolumes": ListVolumesRequest -> ListVolumesResponse,
    get_capacity => "GetCapacity": GetCapacityRequest -> GetCapacityResponse,
    controller_get_capabilities => "ControllerGetCapabilities": ControllerGetCapabilitiesRequest -> ControllerGetCapabilitiesResponse,
    create_snapshot => "CreateSnapshot": CreateSnapshotRequest -> CreateSnapshotResponse,
    delete_snapshot => "DeleteSnapshot": DeleteSnapshotRequest -> DeleteSnapshotResponse,
    list_snapshots => "ListSnapshots": ListSnapshotsRequest -> ListSnapshotsResponse,
);

fake_impl!(pb0::node_server::Node; pb0;
    node_stage_volume => "NodeStageVolume": NodeStageVolumeRequest -> NodeStageVolumeResponse,
    node_unstage_volume => "NodeUnstageVolume": NodeUnstageVolumeRequest -> NodeUnstageVolumeResponse,
    node_publish_volume => "NodePublishVolume": NodePublishVolumeRequest -> NodePublishVolumeResponse,
    node_unpublish_volume => "NodeUnpublishVolume": NodeUnpublishVolumeRequest -> NodeUnpublishVolumeResponse,
    node_get_id => "NodeGetId": NodeGetIdRequest -> NodeGetIdResponse,
    node_get_capabilities => "NodeGetCapabilities": NodeGetCapabilitiesRequest -> NodeGetCapabilitiesResponse,
    node_get_info => "NodeGetInfo": NodeGetInfoRequest -> NodeGetInfoResponse,
);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serve {
    V1,
    V0,
    /// Registers no CSI service at all.
    Nothing,
}

/// A running fake plugin; stops and removes its socket on drop.
pub struct FakePlugin {
    pub script: Arc<Script>,
    pub socket: PathBuf,
    _dir: Option<tempfile::TempDir>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakePlugin {
    pub async fn start(serve: Serve) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("csi.sock");
        let mut p = Self::start_at(serve, &socket).await;
        p._dir = Some(dir);
        p
    }

    pub async fn start_at(serve: Serve, socket: &Path) -> Self {
        let script = Arc::new(Script::new());
        let fake = Fake(script.clone());
        let listener = UnixListener::bind(socket).unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let mut builder = tonic::transport::Server::builder();
        let router = match serve {
            Serve::V1 => builder
                .add_service(pb1::identity_server::IdentityServer::new(fake.clone()))
                .add_service(pb1::controller_server::ControllerServer::new(fake.clone()))
                .add_service(pb1::node_server::NodeServer::new(fake)),
            Serve::V0 => builder
                .add_service(pb0::identity_server::IdentityServer::new(fake.clone()))
                .add_service(pb0::controller_server::ControllerServer::new(fake.clone()))
                .add_service(pb0::node_server::NodeServer::new(fake)),
            // A server with an unrelated service only, so every CSI call is UNIMPLEMENTED.
            Serve::Nothing => builder.add_service(pb0::node_server::NodeServer::new(fake)),
        };
        let task = tokio::spawn(async move {
            let _ = router
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = rx.await;
                })
                .await;
        });
        Self {
            script,
            socket: socket.to_owned(),
            _dir: None,
            stop: Some(tx),
            task,
        }
    }
}

impl Drop for FakePlugin {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        self.task.abort();
        let _ = std::fs::remove_file(&self.socket);
    }
}
