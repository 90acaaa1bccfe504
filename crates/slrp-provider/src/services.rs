//! `prepareServices` (spec §4.4): what the provider learns from its plugin before the
//! volume manager starts.
//!
//! # Design
//! [`prepare_services`] makes Mesos's calls in Mesos's order, none of them retried:
//! 1. the CSI version of the first requested service (the controller's if there is one):
//!    the Probe sequence (v1, then v0), counted once;
//! 2. `GetPluginCapabilities` on that service; a requested controller service without
//!    the `CONTROLLER_SERVICE` plugin capability is an error with Mesos's text;
//! 3. `GetPluginInfo` on every requested service, one call each even when one container
//!    serves both (Mesos's startup budget counts 2); differing names or vendor versions
//!    are only logged;
//! 4. `ControllerGetCapabilities` if a controller service is requested (all false
//!    otherwise), `NodeGetCapabilities`;
//! 5. `NodeGetInfo` (`NodeGetId` for CSI 0.2) only if the controller has
//!    `PUBLISH_UNPUBLISH_VOLUME`; otherwise the node id stays empty.
//!
//! A plugin without a controller container (node-only) requests only the node service:
//! its controller capabilities are all false, so no controller RPC is ever sent.
//! The calls go through the stack's managed clients, so each waits for its container's
//! endpoint as every managed call does; nothing here retries.
//!
//! The calls are made through [`ServiceCalls`], implemented by [`CsiClient`] (and by
//! test fakes).

use std::future::Future;

use slrp_csi::{
    ControllerCapabilities, CsiCapabilities, CsiClient, CsiError, CsiRpc, CsiServices, CsiVersion,
    NodeCapabilities, NodeInfo, PluginCapabilities, PluginInfo,
};

/// The CSI calls of `prepareServices` on one service's endpoint.
pub trait ServiceCalls: Send + Sync {
    /// The CSI version, probing for it if not yet known.
    fn version(&self) -> impl Future<Output = Result<CsiVersion, CsiError>> + Send;
    /// `GetPluginCapabilities`.
    fn plugin_capabilities(
        &self,
    ) -> impl Future<Output = Result<PluginCapabilities, CsiError>> + Send;
    /// `GetPluginInfo`.
    fn plugin_info(&self) -> impl Future<Output = Result<PluginInfo, CsiError>> + Send;
    /// `ControllerGetCapabilities`.
    fn controller_capabilities(
        &self,
    ) -> impl Future<Output = Result<ControllerCapabilities, CsiError>> + Send;
    /// `NodeGetCapabilities`.
    fn node_capabilities(&self) -> impl Future<Output = Result<NodeCapabilities, CsiError>> + Send;
    /// `NodeGetInfo` (`NodeGetId` for CSI 0.2).
    fn node_info(&self) -> impl Future<Output = Result<NodeInfo, CsiError>> + Send;
}

impl ServiceCalls for CsiClient {
    fn version(&self) -> impl Future<Output = Result<CsiVersion, CsiError>> + Send {
        CsiClient::version(self)
    }
    fn plugin_capabilities(
        &self,
    ) -> impl Future<Output = Result<PluginCapabilities, CsiError>> + Send {
        CsiClient::plugin_capabilities(self)
    }
    fn plugin_info(&self) -> impl Future<Output = Result<PluginInfo, CsiError>> + Send {
        CsiClient::plugin_info(self)
    }
    fn controller_capabilities(
        &self,
    ) -> impl Future<Output = Result<ControllerCapabilities, CsiError>> + Send {
        CsiClient::controller_capabilities(self)
    }
    fn node_capabilities(&self) -> impl Future<Output = Result<NodeCapabilities, CsiError>> + Send {
        CsiClient::node_capabilities(self)
    }
    fn node_info(&self) -> impl Future<Output = Result<NodeInfo, CsiError>> + Send {
        CsiClient::node_info(self)
    }
}

/// A CSI service as Mesos names it in `CSIPluginContainerInfo.services`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestedService {
    /// `CONTROLLER_SERVICE`.
    Controller,
    /// `NODE_SERVICE`.
    Node,
}

impl RequestedService {
    /// The Mesos enum name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Controller => "CONTROLLER_SERVICE",
            Self::Node => "NODE_SERVICE",
        }
    }
}

/// What `prepareServices` learnt: what the volume manager and the provider plan with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedServices {
    /// The CSI version of the plugin.
    pub version: CsiVersion,
    /// Plugin, controller (all false without a controller service) and node capabilities.
    pub caps: CsiCapabilities,
    /// The node id for `ControllerPublishVolume`; empty unless the controller has
    /// `PUBLISH_UNPUBLISH_VOLUME`.
    pub node_id: String,
    /// `GetPluginInfo` of every requested service, controller first.
    pub plugin_infos: Vec<(RequestedService, PluginInfo)>,
}

impl PreparedServices {
    /// Whether the plugin has a controller service (node-only plugins do not).
    pub fn has_controller(&self) -> bool {
        self.plugin_infos
            .iter()
            .any(|(s, _)| *s == RequestedService::Controller)
    }
}

/// A failure of `prepareServices`.
#[derive(Debug, thiserror::Error)]
pub enum ServicesError {
    /// A controller service is configured but the plugin does not offer one (Mesos's text).
    #[error(
        "CONTROLLER_SERVICE plugin capability is not supported for CSI plugin type '{plugin_type}' and name '{plugin_name}'"
    )]
    NoControllerService {
        /// `CSIPluginInfo.type`.
        plugin_type: String,
        /// `CSIPluginInfo.name`.
        plugin_name: String,
    },
    /// The controller's and the node's containers speak different CSI versions; one
    /// volume manager cannot drive both.
    #[error(
        "CSI plugin type '{plugin_type}' and name '{plugin_name}': CONTROLLER_SERVICE speaks CSI {controller} but NODE_SERVICE speaks CSI {node}"
    )]
    VersionMismatch {
        /// `CSIPluginInfo.type`.
        plugin_type: String,
        /// `CSIPluginInfo.name`.
        plugin_name: String,
        /// The controller's version.
        controller: CsiVersion,
        /// The node's version.
        node: CsiVersion,
    },
    /// A call failed (not retried, as in Mesos).
    #[error(
        "preparing services of CSI plugin type '{plugin_type}' and name '{plugin_name}': {rpc} on {service}"
    )]
    Rpc {
        /// `CSIPluginInfo.type`.
        plugin_type: String,
        /// `CSIPluginInfo.name`.
        plugin_name: String,
        /// The call (the version detection counts as `Probe`).
        rpc: CsiRpc,
        /// The service it was sent to.
        service: &'static str,
        /// Why.
        #[source]
        source: CsiError,
    },
}

/// The clients of the requested services: controller (if requested) and node.
#[derive(Debug, Clone, Copy)]
pub struct Services<'a, C> {
    /// The client of `CONTROLLER_SERVICE`; `None` for a node-only plugin.
    pub controller: Option<&'a C>,
    /// The client of `NODE_SERVICE` (may be the same client as the controller's).
    pub node: &'a C,
}

impl<'a> Services<'a, CsiClient> {
    /// The services of the stack's routed clients.
    pub fn of(services: &'a CsiServices) -> Self {
        Self {
            controller: services.controller(),
            node: services.node(),
        }
    }
}

/// Runs `prepareServices` (see the module docs) for the plugin `plugin_type`/`plugin_name`.
///
/// # Errors
/// [`ServicesError`] naming the plugin, the call and the service.
pub async fn prepare_services<C: ServiceCalls>(
    plugin_type: &str,
    plugin_name: &str,
    services: Services<'_, C>,
) -> Result<PreparedServices, ServicesError> {
    let rpc_err = |rpc: CsiRpc, service: RequestedService| {
        move |source: CsiError| ServicesError::Rpc {
            plugin_type: plugin_type.to_owned(),
            plugin_name: plugin_name.to_owned(),
            rpc,
            service: service.as_str(),
            source,
        }
    };
    let mut requested = Vec::with_capacity(2);
    if let Some(c) = services.controller {
        requested.push((RequestedService::Controller, c));
    }
    requested.push((RequestedService::Node, services.node));
    let (first_service, first) = requested[0];

    let version = first
        .version()
        .await
        .map_err(rpc_err(CsiRpc::Probe, first_service))?;
    let plugin = first
        .plugin_capabilities()
        .await
        .map_err(rpc_err(CsiRpc::GetPluginCapabilities, first_service))?;
    if services.controller.is_some() && !plugin.controller_service {
        return Err(ServicesError::NoControllerService {
            plugin_type: plugin_type.to_owned(),
            plugin_name: plugin_name.to_owned(),
        });
    }

    let mut plugin_infos = Vec::with_capacity(requested.len());
    for (service, client) in &requested {
        let info = client
            .plugin_info()
            .await
            .map_err(rpc_err(CsiRpc::GetPluginInfo, *service))?;
        tracing::info!(
            plugin_type,
            plugin_name,
            service = service.as_str(),
            name = %info.name,
            vendor_version = %info.vendor_version,
            "CSI plugin info"
        );
        plugin_infos.push((*service, info));
    }
    if let [(_, a), (_, b)] = plugin_infos.as_slice()
        && (a.name != b.name || a.vendor_version != b.vendor_version)
    {
        tracing::warn!(
            plugin_type,
            plugin_name,
            controller_name = %a.name,
            controller_vendor_version = %a.vendor_version,
            node_name = %b.name,
            node_vendor_version = %b.vendor_version,
            "CONTROLLER_SERVICE and NODE_SERVICE report different plugin names or vendor versions"
        );
    }

    let controller = match services.controller {
        Some(c) => {
            // A second container detects its own version on its first call; it must be
            // the one the volume manager will speak.
            let v = c
                .version()
                .await
                .map_err(rpc_err(CsiRpc::Probe, RequestedService::Controller))?;
            check_same_version(plugin_type, plugin_name, v, version)?;
            c.controller_capabilities().await.map_err(rpc_err(
                CsiRpc::ControllerGetCapabilities,
                RequestedService::Controller,
            ))?
        }
        None => ControllerCapabilities::default(),
    };
    let node_version = services
        .node
        .version()
        .await
        .map_err(rpc_err(CsiRpc::Probe, RequestedService::Node))?;
    check_same_version(plugin_type, plugin_name, version, node_version)?;
    let node = services
        .node
        .node_capabilities()
        .await
        .map_err(rpc_err(CsiRpc::NodeGetCapabilities, RequestedService::Node))?;
    let node_id = if controller.publish_unpublish_volume {
        services
            .node
            .node_info()
            .await
            .map_err(rpc_err(CsiRpc::NodeGetInfo, RequestedService::Node))?
            .node_id
    } else {
        String::new()
    };
    Ok(PreparedServices {
        version,
        caps: CsiCapabilities {
            plugin,
            controller,
            node,
        },
        node_id,
        plugin_infos,
    })
}

fn check_same_version(
    plugin_type: &str,
    plugin_name: &str,
    controller: CsiVersion,
    node: CsiVersion,
) -> Result<(), ServicesError> {
    if controller == node {
        return Ok(());
    }
    Err(ServicesError::VersionMismatch {
        plugin_type: plugin_type.to_owned(),
        plugin_name: plugin_name.to_owned(),
        controller,
        node,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A plugin endpoint that answers from fixed values and records the calls.
    #[derive(Default)]
    struct Fake {
        version: Option<CsiVersion>,
        plugin: PluginCapabilities,
        controller: ControllerCapabilities,
        name: &'static str,
        calls: Mutex<Vec<&'static str>>,
    }

    impl Fake {
        fn new(controller_service: bool, controller: ControllerCapabilities) -> Self {
            Self {
                version: Some(CsiVersion::V1),
                plugin: PluginCapabilities {
                    controller_service,
                    ..Default::default()
                },
                controller,
                name: "org.example.fake",
                calls: Mutex::default(),
            }
        }

        fn record(&self, rpc: &'static str) {
            self.calls.lock().unwrap().push(rpc);
        }

        fn calls(&self) -> Vec<&'static str> {
            self.calls.lock().unwrap().clone()
        }
    }

    impl ServiceCalls for Fake {
        async fn version(&self) -> Result<CsiVersion, CsiError> {
            self.record("Version");
            self.version.ok_or(CsiError::UnknownVersion {
                endpoint: "fake".into(),
            })
        }
        async fn plugin_capabilities(&self) -> Result<PluginCapabilities, CsiError> {
            self.record("GetPluginCapabilities");
            Ok(self.plugin)
        }
        async fn plugin_info(&self) -> Result<PluginInfo, CsiError> {
            self.record("GetPluginInfo");
            Ok(PluginInfo {
                name: self.name.into(),
                vendor_version: "1".into(),
                manifest: Default::default(),
            })
        }
        async fn controller_capabilities(&self) -> Result<ControllerCapabilities, CsiError> {
            self.record("ControllerGetCapabilities");
            Ok(self.controller)
        }
        async fn node_capabilities(&self) -> Result<NodeCapabilities, CsiError> {
            self.record("NodeGetCapabilities");
            Ok(NodeCapabilities {
                stage_unstage_volume: true,
                ..Default::default()
            })
        }
        async fn node_info(&self) -> Result<NodeInfo, CsiError> {
            self.record("NodeGetInfo");
            Ok(NodeInfo {
                node_id: "node-1".into(),
                max_volumes_per_node: 0,
                accessible_topology: None,
            })
        }
    }

    /// `prepareServices` of one container serving both services.
    async fn prepare(t: &str, n: &str, f: &Fake) -> Result<PreparedServices, ServicesError> {
        let both = Services {
            controller: Some(f),
            node: f,
        };
        prepare_services(t, n, both).await
    }

    fn publish() -> ControllerCapabilities {
        ControllerCapabilities {
            create_delete_volume: true,
            publish_unpublish_volume: true,
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn one_container_serving_both_is_asked_as_mesos_asks() {
        let f = Fake::new(true, publish());
        let p = prepare("t", "n", &f).await.unwrap();
        assert_eq!(
            f.calls(),
            [
                "Version",
                "GetPluginCapabilities",
                "GetPluginInfo",
                "GetPluginInfo",
                "Version",
                "ControllerGetCapabilities",
                "Version",
                "NodeGetCapabilities",
                "NodeGetInfo",
            ]
        );
        assert_eq!(p.node_id, "node-1");
        assert_eq!(p.version, CsiVersion::V1);
        assert!(p.caps.controller.publish_unpublish_volume);
        assert!(p.caps.node.stage_unstage_volume);
        assert!(p.has_controller());
        assert_eq!(
            p.plugin_infos.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
            [RequestedService::Controller, RequestedService::Node]
        );
    }

    #[tokio::test]
    async fn node_id_only_with_publish_unpublish_volume() {
        let f = Fake::new(true, ControllerCapabilities::default());
        let p = prepare("t", "n", &f).await.unwrap();
        assert_eq!(p.node_id, "");
        assert!(!f.calls().contains(&"NodeGetInfo"), "{:?}", f.calls());
    }

    #[tokio::test]
    async fn a_controller_container_without_controller_service_fails_with_mesos_text() {
        let f = Fake::new(false, publish());
        let err = prepare("org.apache.mesos.csi.test", "local", &f)
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "CONTROLLER_SERVICE plugin capability is not supported for CSI plugin type \
             'org.apache.mesos.csi.test' and name 'local'"
        );
        assert_eq!(f.calls(), ["Version", "GetPluginCapabilities"]);
    }

    #[tokio::test]
    async fn node_only_plugins_never_see_a_controller_call() {
        // The plugin offers a controller service, but none is configured: it is not used.
        let f = Fake::new(true, publish());
        let p = prepare_services(
            "t",
            "n",
            Services {
                controller: None,
                node: &f,
            },
        )
        .await
        .unwrap();
        assert_eq!(p.caps.controller, ControllerCapabilities::default());
        assert_eq!(p.node_id, "");
        assert!(!p.has_controller());
        assert_eq!(
            f.calls(),
            [
                "Version",
                "GetPluginCapabilities",
                "GetPluginInfo",
                "Version",
                "NodeGetCapabilities"
            ]
        );
    }

    #[tokio::test]
    async fn two_containers_are_each_asked_and_must_agree_on_the_version() {
        let c = Fake::new(true, publish());
        let mut n = Fake::new(true, publish());
        n.name = "org.example.other";
        let p = prepare_services(
            "t",
            "n",
            Services {
                controller: Some(&c),
                node: &n,
            },
        )
        .await
        .unwrap();
        assert_eq!(p.plugin_infos[1].1.name, "org.example.other");
        assert_eq!(
            n.calls(),
            [
                "GetPluginInfo",
                "Version",
                "NodeGetCapabilities",
                "NodeGetInfo"
            ]
        );

        n.version = Some(CsiVersion::V0);
        let err = prepare_services(
            "t",
            "n",
            Services {
                controller: Some(&c),
                node: &n,
            },
        )
        .await
        .unwrap_err();
        assert!(
            matches!(err, ServicesError::VersionMismatch { .. }),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_failed_call_names_the_call_and_the_service() {
        let mut f = Fake::new(true, publish());
        f.version = None;
        let err = prepare("t", "n", &f).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "preparing services of CSI plugin type 't' and name 'n': Probe on CONTROLLER_SERVICE"
        );
        assert!(std::error::Error::source(&err).is_some());
    }
}
