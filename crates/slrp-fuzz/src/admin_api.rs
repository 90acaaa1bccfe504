//! Admin API requests (method, path, `Content-Type`, body), through the daemon's own
//! router ([`slrp_provider::admin::router`]) with one fake provider (READY, no volume
//! manager, one operation-free total) and, in standalone mode, fake manager actions that
//! answer 404.
//!
//! Input: `[flags][method][path length][path][body...]`; flags bit 0: standalone mode;
//! bit 1: a JSON `Content-Type`.
//!
//! Properties:
//! - every request is answered, within the target's time bound, never with a panic;
//! - no answer is a 500 (nothing here fails inside);
//! - every refusal (4xx, 5xx) but to HEAD is a JSON object with an `error` string, as
//!   `docs/admin-api.md` says.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt as _;
use prometheus_client::registry::Registry;
use slrp_provider::admin::api::{CreateDisk, DestroyDisk, Mode, OperationSummary, VolumeRef};
use slrp_provider::admin::{
    ActionError, AdminProvider, AdminState, BoxFuture, DaemonExtras, ManagerActions, router,
};
use tower::ServiceExt as _;

use crate::util::{byte, runtime, take};

/// The provider key of the fake provider.
pub const PROVIDER: &str = "org.apache.mesos.rp.local.storage.local";

#[derive(Debug)]
struct Fake;

impl AdminProvider for Fake {
    fn key(&self) -> String {
        PROVIDER.to_owned()
    }
    fn state(&self) -> String {
        "READY".to_owned()
    }
    fn is_ready(&self) -> bool {
        true
    }
    fn snapshot(&self) -> BTreeMap<String, f64> {
        BTreeMap::from([(
            format!("resource_providers/{PROVIDER}/csi_plugin/rpcs_finished"),
            1.0,
        )])
    }
}

#[derive(Debug)]
struct Actions;

fn not_found<T>() -> Result<T, ActionError> {
    Err(ActionError::new(
        StatusCode::NOT_FOUND,
        "no such thing here",
    ))
}

impl ManagerActions for Actions {
    fn create_disk(&self, _r: CreateDisk) -> BoxFuture<'_, Result<OperationSummary, ActionError>> {
        Box::pin(async { not_found() })
    }
    fn destroy_disk(
        &self,
        _r: DestroyDisk,
    ) -> BoxFuture<'_, Result<OperationSummary, ActionError>> {
        Box::pin(async { not_found() })
    }
    fn publish(&self, _r: VolumeRef) -> BoxFuture<'_, Result<(), ActionError>> {
        Box::pin(async { not_found() })
    }
    fn operations(&self) -> BoxFuture<'_, Vec<OperationSummary>> {
        Box::pin(async { Vec::new() })
    }
    fn snapshot(&self) -> BTreeMap<String, f64> {
        BTreeMap::new()
    }
    fn register_metrics(&self, _registry: &mut Registry) {}
}

const METHODS: [Method; 6] = [
    Method::GET,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::HEAD,
    Method::PATCH,
];

/// The target.
pub fn run(data: &[u8]) {
    let mut data = data;
    let flags = byte(&mut data);
    let method = METHODS[usize::from(byte(&mut data)) % METHODS.len()].clone();
    let len = usize::from(byte(&mut data));
    let path = take(&mut data, len);
    let Ok(path) = std::str::from_utf8(path) else {
        return;
    };
    let head = method == Method::HEAD;
    let mut request = Request::builder().method(method).uri(path);
    if flags & 2 == 2 {
        request = request.header(header::CONTENT_TYPE, "application/json");
    }
    let Ok(request) = request.body(Body::from(data.to_vec())) else {
        return;
    };
    let extras = if flags & 1 == 1 {
        DaemonExtras {
            mode: Mode::Standalone,
            actions: Some(Arc::new(Actions)),
        }
    } else {
        DaemonExtras::default()
    };
    let state = AdminState::with_extras(vec![Arc::new(Fake)], Registry::default(), extras);
    let (status, body) = runtime().block_on(async {
        let response = router(state)
            .oneshot(request)
            .await
            .expect("the router's error type is Infallible");
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        (status, body)
    });
    assert_ne!(
        status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "500 for {path:?}: {body:?}"
    );
    // A HEAD answer has no body, by HTTP's rules.
    if !head && (status.is_client_error() || status.is_server_error()) {
        let parsed: serde_json::Value = serde_json::from_slice(&body)
            .unwrap_or_else(|e| panic!("refusal {status} of {path:?} is not JSON ({e}): {body:?}"));
        assert!(
            parsed
                .get("error")
                .is_some_and(serde_json::Value::is_string),
            "refusal {status} of {path:?} has no 'error': {parsed}"
        );
    }
}

/// A seed input.
#[must_use]
pub fn seed(standalone: bool, method: u8, path: &str, body: &[u8]) -> Vec<u8> {
    let mut out = vec![u8::from(standalone) | 2, method];
    out.push(u8::try_from(path.len()).expect("seed paths are short"));
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(body);
    out
}
