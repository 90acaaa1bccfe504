//! What to run: a plugin's containers, taken from Mesos's `CSIPluginInfo`.

use std::fmt;
use std::path::Path;

use serde::Serialize;
use slrp_csi::CsiEndpoint;
use slrp_proto::mesos::v1 as mesos;

/// A CSI service a container (or endpoint) provides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Service {
    /// `CONTROLLER_SERVICE`.
    Controller,
    /// `NODE_SERVICE`.
    Node,
}

impl Service {
    /// The Mesos enum name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Controller => "CONTROLLER_SERVICE",
            Self::Node => "NODE_SERVICE",
        }
    }
}

/// A `CSIPluginInfo` that cannot be run.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// `type` or `name` would not make a safe directory name.
    #[error(
        "plugin {field} {value:?} must be non-empty and use only letters, digits, '.', '_' and '-'"
    )]
    UnsafeName {
        /// `type` or `name`.
        field: &'static str,
        /// The value.
        value: String,
    },
    /// Neither containers nor endpoints are configured.
    #[error("plugin {plugin} has neither containers nor endpoints")]
    Empty {
        /// Plugin type and name.
        plugin: String,
    },
    /// No container/endpoint serves `NODE_SERVICE` (Mesos's config validation requires one).
    #[error("plugin {plugin} has no container or endpoint serving NODE_SERVICE")]
    NoNodeService {
        /// Plugin type and name.
        plugin: String,
    },
    /// A container lists an unknown service value.
    #[error("plugin {plugin} container {index} lists unknown service {value}")]
    UnknownService {
        /// Plugin type and name.
        plugin: String,
        /// Index in `containers`.
        index: usize,
        /// The raw enum value.
        value: i32,
    },
    /// A container has no command (slrp launches processes, not images).
    #[error("plugin {plugin} container {index} has no command value")]
    NoCommand {
        /// Plugin type and name.
        plugin: String,
        /// Index in `containers`.
        index: usize,
    },
    /// An environment variable uses a secret reference, which slrp cannot resolve.
    #[error(
        "plugin {plugin} environment variable {name} is a secret reference; only VALUE secrets are supported"
    )]
    SecretReference {
        /// Plugin type and name.
        plugin: String,
        /// Variable name.
        name: String,
    },
    /// An agent container ID breaks the agent's rules (the agent would refuse LAUNCH).
    #[error("agent container ID {id:?} {rule}")]
    ContainerId {
        /// The ID.
        id: String,
        /// The rule it breaks.
        rule: &'static str,
    },
    /// An endpoint is not a unix socket address.
    #[error("plugin {plugin} endpoint for {service}")]
    Endpoint {
        /// Plugin type and name.
        plugin: String,
        /// The service.
        service: &'static str,
        /// Why.
        #[source]
        source: slrp_csi::CsiError,
    },
}

/// How to start one container's process.
#[derive(Clone, PartialEq, Eq, Serialize)]
pub struct LaunchCommand {
    /// `CommandInfo.shell` (default true): run `value` with `/bin/sh -c`.
    pub shell: bool,
    /// The shell command line, or the program when `shell` is false.
    pub value: String,
    /// argv (including argv\[0\]) when `shell` is false; ignored otherwise, as in Mesos.
    pub arguments: Vec<String>,
    /// Extra environment variables (added to slrp's own environment).
    pub env: Vec<(String, String)>,
}

impl fmt::Debug for LaunchCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Environment values may be secrets: show names only.
        f.debug_struct("LaunchCommand")
            .field("shell", &self.shell)
            .field("value", &self.value)
            .field("arguments", &self.arguments)
            .field(
                "env",
                &self.env.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// A container's `CSIPluginContainerInfo` exactly as configured: the agent backend
/// launches it field for field, builds Mesos's container ID from its **raw** services
/// (duplicates kept) and checkpoints it as `container.info`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RawContainerInfo(pub mesos::CsiPluginContainerInfo);

// Compared by value only to tell two specs apart; the float fields of its resources are
// configuration values, never NaN, so the partial order is total here.
impl Eq for RawContainerInfo {}

/// One supervised container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContainerSpec {
    /// Mesos-style id, also the directory name: `<type with . → ->-<name>--<SERVICES>`.
    pub id: String,
    /// Services it provides, in configuration order.
    pub services: Vec<Service>,
    /// What to run.
    pub command: LaunchCommand,
    /// The configured `CSIPluginContainerInfo`. Not part of [`ContainerSpec::config_hash`],
    /// so pid records of earlier releases keep matching.
    #[serde(skip)]
    pub raw: RawContainerInfo,
}

impl ContainerSpec {
    /// Mesos's container ID without the provider's `cid_prefix`:
    /// `<plugin type, . → ->-<plugin name>--<raw services>` (spec §4.1.2). Differs from
    /// [`ContainerSpec::id`] only when a service is listed twice.
    pub fn mesos_id(&self) -> String {
        let dedup = self
            .services
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("-");
        let base = self.id.strip_suffix(&dedup).unwrap_or(&self.id);
        format!("{base}{}", self.raw_services_suffix())
    }

    /// The container's services as configured (raw enum names, duplicates kept, in order),
    /// joined by `-`: the suffix of Mesos's container ID (spec §4.1.2).
    pub fn raw_services_suffix(&self) -> String {
        self.raw
            .0
            .services
            .iter()
            .map(|raw| {
                mesos::csi_plugin_container_info::Service::try_from(*raw)
                    .map_or_else(|_| raw.to_string(), |s| s.as_str_name().to_owned())
            })
            .collect::<Vec<_>>()
            .join("-")
    }
}

impl ContainerSpec {
    /// A stable fingerprint of what is launched, recorded with the process so a restarted
    /// slrp can tell whether a surviving plugin still matches the configuration.
    pub fn config_hash(&self) -> String {
        // FNV-1a over the JSON form: stable across Rust versions, unlike `DefaultHasher`.
        let bytes = serde_json::to_vec(self).unwrap_or_default();
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        format!("{h:016x}")
    }
}

/// A managed plugin: containers slrp launches and supervises.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginSpec {
    /// `CSIPluginInfo.type`.
    pub plugin_type: String,
    /// `CSIPluginInfo.name` (default `default`).
    pub plugin_name: String,
    /// The containers that serve at least one service, deduplicated.
    pub containers: Vec<ContainerSpec>,
    controller: Option<usize>,
    node: Option<usize>,
}

impl PluginSpec {
    /// The same plugin with no containers: recovery with it retires every leftover.
    pub(crate) fn without_containers(&self) -> Self {
        Self {
            plugin_type: self.plugin_type.clone(),
            plugin_name: self.plugin_name.clone(),
            containers: Vec::new(),
            controller: None,
            node: None,
        }
    }

    /// Index into [`PluginSpec::containers`] of the container serving `service`.
    pub fn container_for(&self, service: Service) -> Option<usize> {
        match service {
            Service::Controller => self.controller,
            Service::Node => self.node,
        }
    }
}

/// How slrp reaches a plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginDeployment {
    /// slrp launches and supervises the plugin (`CSIPluginInfo.containers`).
    Managed(PluginSpec),
    /// Someone else runs it (`CSIPluginInfo.endpoints`).
    Unmanaged {
        /// Endpoint of the controller service, if any.
        controller: Option<CsiEndpoint>,
        /// Endpoint of the node service.
        node: CsiEndpoint,
    },
}

fn safe_name(field: &'static str, value: &str) -> Result<(), SpecError> {
    let ok = !value.is_empty()
        && !value.starts_with('.')
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(SpecError::UnsafeName {
            field,
            value: value.to_owned(),
        })
    }
}

fn service_of(raw: i32) -> Option<Service> {
    use mesos::csi_plugin_container_info::Service as S;
    match S::try_from(raw) {
        Ok(S::ControllerService) => Some(Service::Controller),
        Ok(S::NodeService) => Some(Service::Node),
        Ok(S::Unknown) | Err(_) => None,
    }
}

/// Which checks a container's command gets: a local process needs a command and the
/// values of its secrets; an agent launches an image's entrypoint and resolves secret
/// references itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpecChecks {
    /// Local processes: `NoCommand` and `SecretReference` are errors.
    #[default]
    Process,
    /// Agent containers: neither is checked (the agent sends the raw `CommandInfo`).
    Agent,
}

pub(crate) fn command_of(
    plugin: &str,
    index: usize,
    c: &mesos::CommandInfo,
    checks: SpecChecks,
) -> Result<LaunchCommand, SpecError> {
    use mesos::environment::variable::Type as VarType;
    use mesos::secret::Type as SecretType;
    let value = match c.value.clone().filter(|v| !v.is_empty()) {
        Some(v) => v,
        None if checks == SpecChecks::Agent => String::new(),
        None => {
            return Err(SpecError::NoCommand {
                plugin: plugin.to_owned(),
                index,
            });
        }
    };
    let mut env = Vec::new();
    for var in c.environment.iter().flat_map(|e| e.variables.iter()) {
        let ty = var.r#type.map(VarType::try_from);
        let value = match ty {
            None | Some(Ok(VarType::Value)) => var.value.clone().unwrap_or_default(),
            Some(Ok(VarType::Secret)) => {
                let secret = var.secret.as_ref();
                let is_value = secret
                    .and_then(|s| s.r#type)
                    .is_some_and(|t| t == SecretType::Value as i32);
                match secret.and_then(|s| s.value.as_ref()) {
                    Some(v) if is_value => String::from_utf8_lossy(&v.data).into_owned(),
                    // The agent's secret resolver handles it from the raw info.
                    _ if checks == SpecChecks::Agent => continue,
                    _ => {
                        return Err(SpecError::SecretReference {
                            plugin: plugin.to_owned(),
                            name: var.name.clone(),
                        });
                    }
                }
            }
            Some(Ok(VarType::Unknown) | Err(_)) => var.value.clone().unwrap_or_default(),
        };
        env.push((var.name.clone(), value));
    }
    Ok(LaunchCommand {
        shell: c.shell.unwrap_or(true),
        value,
        arguments: c.arguments.clone(),
        env,
    })
}

/// Decides how to run the plugin described by `info`.
///
/// Containers win over endpoints when both are given. For each service, the first
/// container listing it serves it (spec §4.1.1); one container may serve both. Unlike
/// Mesos, a plugin without a controller container is accepted (a node-only plugin).
///
/// # Errors
/// [`SpecError`] naming the offending part of `info`.
pub fn deployment_from_info(info: &mesos::CsiPluginInfo) -> Result<PluginDeployment, SpecError> {
    deployment_for(info, SpecChecks::Process)
}

/// [`deployment_from_info`] with the command checks of one backend.
///
/// # Errors
/// [`SpecError`] naming the offending part of `info`.
pub fn deployment_for(
    info: &mesos::CsiPluginInfo,
    checks: SpecChecks,
) -> Result<PluginDeployment, SpecError> {
    let plugin_name = info.name.clone().unwrap_or_else(|| "default".to_owned());
    safe_name("type", &info.r#type)?;
    safe_name("name", &plugin_name)?;
    let plugin = format!("{}/{}", info.r#type, plugin_name);
    if info.containers.is_empty() {
        return unmanaged(&plugin, info);
    }
    let mut containers: Vec<ContainerSpec> = Vec::new();
    let (mut controller, mut node) = (None, None);
    for (index, c) in info.containers.iter().enumerate() {
        let mut services = Vec::new();
        for raw in &c.services {
            let s = service_of(*raw).ok_or(SpecError::UnknownService {
                plugin: plugin.clone(),
                index,
                value: *raw,
            })?;
            if !services.contains(&s) {
                services.push(s);
            }
        }
        let serves_controller = controller.is_none() && services.contains(&Service::Controller);
        let serves_node = node.is_none() && services.contains(&Service::Node);
        if !serves_controller && !serves_node {
            // A later duplicate serves nothing; Mesos never launches it either.
            continue;
        }
        let command = command_of(
            &plugin,
            index,
            c.command.as_ref().unwrap_or(&Default::default()),
            checks,
        )?;
        let suffix = services
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("-");
        let id = format!(
            "{}-{}--{}",
            info.r#type.replace('.', "-"),
            plugin_name,
            suffix
        );
        let pos = containers.len();
        containers.push(ContainerSpec {
            id,
            services,
            command,
            raw: RawContainerInfo(c.clone()),
        });
        if serves_controller {
            controller = Some(pos);
        }
        if serves_node {
            node = Some(pos);
        }
    }
    if node.is_none() {
        return Err(SpecError::NoNodeService { plugin });
    }
    Ok(PluginDeployment::Managed(PluginSpec {
        plugin_type: info.r#type.clone(),
        plugin_name,
        containers,
        controller,
        node,
    }))
}

fn unmanaged(plugin: &str, info: &mesos::CsiPluginInfo) -> Result<PluginDeployment, SpecError> {
    if info.endpoints.is_empty() {
        return Err(SpecError::Empty {
            plugin: plugin.to_owned(),
        });
    }
    let (mut controller, mut node) = (None, None);
    for e in &info.endpoints {
        let Some(service) = service_of(e.csi_service) else {
            continue;
        };
        let slot = match service {
            Service::Controller => &mut controller,
            Service::Node => &mut node,
        };
        if slot.is_none() {
            let ep = CsiEndpoint::parse(&e.endpoint).map_err(|source| SpecError::Endpoint {
                plugin: plugin.to_owned(),
                service: service.as_str(),
                source,
            })?;
            *slot = Some(ep);
        }
    }
    let node = node.ok_or_else(|| SpecError::NoNodeService {
        plugin: plugin.to_owned(),
    })?;
    Ok(PluginDeployment::Unmanaged { controller, node })
}

/// Whether `name` is a safe single path component (used for directory names on disk).
pub(crate) fn is_safe_component(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains('/')
        && !name.contains('\0')
        && Path::new(name).components().count() == 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesos::csi_plugin_container_info::Service as S;

    fn container(services: &[S], cmd: &str) -> mesos::CsiPluginContainerInfo {
        mesos::CsiPluginContainerInfo {
            services: services.iter().map(|s| *s as i32).collect(),
            command: Some(mesos::CommandInfo {
                value: Some(cmd.to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn info(containers: Vec<mesos::CsiPluginContainerInfo>) -> mesos::CsiPluginInfo {
        mesos::CsiPluginInfo {
            r#type: "io.slrp.csi-local".into(),
            name: Some("local".into()),
            containers,
            ..Default::default()
        }
    }

    #[test]
    fn first_container_per_service_wins_and_one_may_serve_both() {
        let d = deployment_from_info(&info(vec![
            container(&[S::ControllerService, S::NodeService], "a"),
            container(&[S::NodeService], "b"),
        ]))
        .unwrap();
        let PluginDeployment::Managed(spec) = d else {
            panic!("managed expected")
        };
        assert_eq!(spec.containers.len(), 1);
        assert_eq!(
            spec.containers[0].id,
            "io-slrp-csi-local-local--CONTROLLER_SERVICE-NODE_SERVICE"
        );
        assert_eq!(spec.container_for(Service::Controller), Some(0));
        assert_eq!(spec.container_for(Service::Node), Some(0));
        assert!(spec.containers[0].command.shell);
    }

    #[test]
    fn split_controller_and_node_and_node_only_is_allowed() {
        let PluginDeployment::Managed(spec) = deployment_from_info(&info(vec![
            container(&[S::NodeService], "n"),
            container(&[S::ControllerService], "c"),
        ]))
        .unwrap() else {
            panic!()
        };
        assert_eq!(spec.container_for(Service::Node), Some(0));
        assert_eq!(spec.container_for(Service::Controller), Some(1));

        let PluginDeployment::Managed(spec) =
            deployment_from_info(&info(vec![container(&[S::NodeService], "n")])).unwrap()
        else {
            panic!()
        };
        assert_eq!(spec.container_for(Service::Controller), None);
    }

    #[test]
    fn bad_configurations_are_rejected_with_the_reason() {
        let e = deployment_from_info(&info(vec![container(&[S::ControllerService], "c")]));
        assert!(matches!(e, Err(SpecError::NoNodeService { .. })));
        let mut i = info(vec![container(&[S::NodeService], "n")]);
        i.r#type = "../etc".into();
        assert!(matches!(
            deployment_from_info(&i),
            Err(SpecError::UnsafeName { .. })
        ));
        let e = deployment_from_info(&info(vec![]));
        assert!(matches!(e, Err(SpecError::Empty { .. })));
        let mut c = container(&[S::NodeService], "");
        c.command = None;
        assert!(matches!(
            deployment_from_info(&info(vec![c.clone()])),
            Err(SpecError::NoCommand { .. })
        ));
        // An agent launches an image's entrypoint: no command is fine there.
        assert!(deployment_for(&info(vec![c]), SpecChecks::Agent).is_ok());
    }

    #[test]
    fn secret_references_are_refused_for_processes_only() {
        use mesos::environment::Variable;
        let mut c = container(&[S::NodeService], "run");
        c.command.as_mut().unwrap().environment = Some(mesos::Environment {
            variables: vec![Variable {
                name: "TOKEN".into(),
                r#type: Some(mesos::environment::variable::Type::Secret as i32),
                secret: Some(mesos::Secret {
                    r#type: Some(mesos::secret::Type::Reference as i32),
                    reference: Some(mesos::secret::Reference {
                        name: "vault/token".into(),
                        key: None,
                    }),
                    value: None,
                }),
                value: None,
            }],
        });
        assert!(matches!(
            deployment_from_info(&info(vec![c.clone()])),
            Err(SpecError::SecretReference { .. })
        ));
        let PluginDeployment::Managed(spec) =
            deployment_for(&info(vec![c.clone()]), SpecChecks::Agent).unwrap()
        else {
            panic!()
        };
        assert_eq!(spec.containers[0].raw.0, c);
    }

    #[test]
    fn the_raw_services_keep_duplicates() {
        let c = container(
            &[S::NodeService, S::ControllerService, S::NodeService],
            "run",
        );
        let PluginDeployment::Managed(spec) = deployment_from_info(&info(vec![c])).unwrap() else {
            panic!()
        };
        assert_eq!(
            spec.containers[0].id,
            "io-slrp-csi-local-local--NODE_SERVICE-CONTROLLER_SERVICE"
        );
        assert_eq!(
            spec.containers[0].raw_services_suffix(),
            "NODE_SERVICE-CONTROLLER_SERVICE-NODE_SERVICE"
        );
        assert_eq!(
            spec.containers[0].mesos_id(),
            "io-slrp-csi-local-local--NODE_SERVICE-CONTROLLER_SERVICE-NODE_SERVICE"
        );
    }

    #[test]
    fn environment_values_and_value_secrets_are_resolved_but_not_shown() {
        use mesos::environment::Variable;
        let mut c = container(&[S::NodeService], "run");
        c.command.as_mut().unwrap().environment = Some(mesos::Environment {
            variables: vec![
                Variable {
                    name: "PLAIN".into(),
                    value: Some("1".into()),
                    ..Default::default()
                },
                Variable {
                    name: "TOKEN".into(),
                    r#type: Some(mesos::environment::variable::Type::Secret as i32),
                    secret: Some(mesos::Secret {
                        r#type: Some(mesos::secret::Type::Value as i32),
                        value: Some(mesos::secret::Value {
                            data: b"hunter2".to_vec(),
                        }),
                        reference: None,
                    }),
                    value: None,
                },
            ],
        });
        let PluginDeployment::Managed(spec) = deployment_from_info(&info(vec![c])).unwrap() else {
            panic!()
        };
        let cmd = &spec.containers[0].command;
        assert_eq!(
            cmd.env,
            vec![
                ("PLAIN".into(), "1".into()),
                ("TOKEN".into(), "hunter2".into())
            ]
        );
        assert!(!format!("{cmd:?}").contains("hunter2"));
    }

    #[test]
    fn endpoints_make_an_unmanaged_plugin() {
        let mut i = info(vec![]);
        i.endpoints = vec![mesos::CsiPluginEndpoint {
            csi_service: S::NodeService as i32,
            endpoint: "unix:///run/csi.sock".into(),
        }];
        let d = deployment_from_info(&i).unwrap();
        assert!(matches!(
            d,
            PluginDeployment::Unmanaged {
                controller: None,
                ..
            }
        ));
    }

    #[test]
    fn config_hash_is_stable_and_sensitive() {
        let a = ContainerSpec {
            id: "x".into(),
            services: vec![Service::Node],
            command: LaunchCommand {
                shell: true,
                value: "run".into(),
                arguments: vec![],
                env: vec![],
            },
            raw: RawContainerInfo::default(),
        };
        let mut b = a.clone();
        assert_eq!(a.config_hash(), b.config_hash());
        b.command.value = "run2".into();
        assert_ne!(a.config_hash(), b.config_hash());
    }

    #[test]
    fn safe_components() {
        assert!(is_safe_component("io-x--NODE_SERVICE"));
        for bad in ["", ".", "..", "a/b", "a\0b"] {
            assert!(!is_safe_component(bad), "{bad:?}");
        }
    }
}
