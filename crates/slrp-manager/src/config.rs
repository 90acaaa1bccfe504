//! Configuration of the embedded manager.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use crate::error::ConfigError;

/// Where the manager listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// A TCP address; it must be a loopback address (port 0 picks a free port).
    Tcp(SocketAddr),
    /// A unix socket path. A stale socket at the path is replaced; any other file is an
    /// error.
    Unix(PathBuf),
}

/// Settings of an [`crate::EmbeddedManager`]. Build one with [`ManagerConfig::new`] and
/// adjust the public fields; [`ManagerConfig::validate`] runs at spawn.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    /// The endpoint to serve.
    pub listen: Listen,
    /// Where the registrar keeps admitted provider IDs. `None` keeps them in memory only,
    /// so a restarted manager admits no resubscription (like an agent whose ID changed).
    pub state_dir: Option<PathBuf>,
    /// Largest accepted request body; a larger one is answered `413`.
    pub max_body_bytes: usize,
    /// How long reading a request body may take; a slower one is answered `408`.
    pub body_timeout: Duration,
    /// Events queued per subscription stream. A provider that lets its queue fill up is
    /// disconnected (its stream closed), so a reader that stalls cannot grow memory.
    pub event_queue: usize,
    /// Buffered observations ([`crate::ManagerMessage`]) per subscriber of
    /// [`crate::ManagerHandle::messages`]; a slower subscriber sees a lag error.
    pub message_buffer: usize,
    /// The agent ID served on GET_AGENT (`agent_info.id`). `None`: the one recorded in the
    /// registry under `state_dir`, else a fresh `<uuid>-S0` (recorded there, so it is
    /// stable across restarts). An ID different from the recorded one is a re-registered
    /// agent: the registry starts empty, as under Mesos's `meta/slaves/<agent_id>/`.
    pub agent_id: Option<String>,
    /// `agent_info.hostname` on GET_AGENT. The manager serves only this host.
    pub hostname: String,
    /// When set, every request to either API must carry `Authorization: Bearer <token>`
    /// (compared as a shared secret, not verified as a JWT); others are answered `401` as
    /// libprocess's JWT authenticator answers. `None`: no authentication, as a Mesos 1.11
    /// agent's resource provider endpoint. `Debug` of the config does not show it.
    pub token: Option<Secret>,
    /// How the manager, as master, acknowledges operation status updates (changeable at
    /// run time with [`crate::ManagerHandle::set_ack_policy`]).
    pub ack_policy: AckPolicy,
    /// Where standalone containers (operator API `LAUNCH_CONTAINER`) get their sandboxes,
    /// `<containers_dir>/<container id>` as under a Mesos agent's `<work_dir>/containers`,
    /// and where their pids are checkpointed so that they survive a manager restart (an
    /// agent going down leaves its containers running). `None`: sandboxes in a temporary
    /// directory, and the containers die with the manager.
    pub containers_dir: Option<PathBuf>,
    /// The agent's `--jwt_secret_key`: a bearer token that is an HS256 JWT signed with it
    /// authenticates as the principal its claims describe (a `cid_prefix` claim limits the
    /// container calls to IDs with that prefix). The plain [`ManagerConfig::token`] stays
    /// an operator allowed everything. Either one being set makes authentication required.
    pub jwt_secret: Option<Secret>,
    /// Providers the registrar admits at spawn (recorded under `state_dir` like any
    /// admission), as a Mesos agent's registrar knows the ID of a provider it had before:
    /// a provider resubscribing with one of these IDs is admitted.
    pub preadmitted: Vec<crate::registrar::ProviderRecord>,
}

/// How the manager (as master) acknowledges operation status updates (spec §2.9 step 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AckPolicy {
    /// Acknowledge every status that has a uuid as soon as it arrives (operator operations).
    #[default]
    Auto,
    /// Never by itself; tests call [`crate::ManagerHandle::acknowledge`].
    Manual,
    /// Ignore the first `n` updates that carry a status uuid (as if lost on the way to the
    /// master), then `Auto`.
    DropFirst(usize),
}

/// A secret string whose `Debug` is redacted.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps `value`.
    #[must_use]
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// The default bound on a request body: 128 MiB. A provider's UPDATE_STATE carries its
/// whole total (spec §3.4), about 390 bytes per MOUNT disk in JSON and 220 in protobuf
/// (100,000 volumes: 39 MB and 22 MB, measured by
/// `the_default_body_limit_fits_100k_volumes`), so either fits with room to spare.
/// At 4 MiB, a provider past ~13,000 volumes could not come back after a restart (issue
/// #25). A Mesos agent sets no bound; this one keeps a broken client from growing the
/// process without end.
pub const DEFAULT_MAX_BODY_BYTES: usize = 128 * 1024 * 1024;

impl ManagerConfig {
    /// Defaults: [`DEFAULT_MAX_BODY_BYTES`] bodies, 30 s body timeout, 1024 queued events,
    /// 1024 messages.
    #[must_use]
    pub fn new(listen: Listen) -> Self {
        Self {
            listen,
            state_dir: None,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            body_timeout: Duration::from_secs(30),
            event_queue: 1024,
            message_buffer: 1024,
            agent_id: None,
            hostname: "localhost".to_owned(),
            token: None,
            ack_policy: AckPolicy::Auto,
            containers_dir: None,
            jwt_secret: None,
            preadmitted: Vec::new(),
        }
    }

    /// A configuration listening on `127.0.0.1` at a free port.
    #[must_use]
    pub fn loopback() -> Self {
        Self::new(Listen::Tcp(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))))
    }

    /// Checks the settings.
    ///
    /// # Errors
    /// [`ConfigError`] naming the offending setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Listen::Tcp(addr) = &self.listen
            && !addr.ip().is_loopback()
        {
            return Err(ConfigError::NotLoopback { addr: *addr });
        }
        if let Some(id) = &self.agent_id {
            slrp_types::validate_id(id).map_err(|source| ConfigError::AgentId {
                id: id.clone(),
                source,
            })?;
        }
        if self.hostname.is_empty() {
            return Err(ConfigError::Empty { field: "hostname" });
        }
        if self
            .token
            .as_ref()
            .is_some_and(|t| t.0.is_empty() || t.0.contains(char::is_whitespace))
        {
            return Err(ConfigError::Empty { field: "token" });
        }
        if self.jwt_secret.as_ref().is_some_and(|s| s.0.is_empty()) {
            return Err(ConfigError::Empty {
                field: "jwt_secret",
            });
        }
        for record in &self.preadmitted {
            slrp_types::validate_id(&record.id).map_err(|source| ConfigError::PreadmittedId {
                id: record.id.clone(),
                source,
            })?;
            if record.kind.is_empty() || record.name.is_empty() {
                return Err(ConfigError::Empty {
                    field: "preadmitted type and name",
                });
            }
        }
        let positive = [
            ("max_body_bytes", self.max_body_bytes > 0),
            ("body_timeout", !self.body_timeout.is_zero()),
            ("event_queue", self.event_queue > 0),
            ("message_buffer", self.message_buffer > 0),
        ];
        match positive.iter().find(|(_, ok)| !ok) {
            Some((field, _)) => Err(ConfigError::Zero { field }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue #25: the UPDATE_STATE of a provider with 100,000 MOUNT disks (the resources
    /// the provider reports, with ids and mount roots of real lengths) fits the default
    /// body limit, in protobuf and in JSON.
    #[test]
    fn the_default_body_limit_fits_100k_volumes() {
        use slrp_proto::mesos::v1::resource::disk_info::{Source, source};
        use slrp_proto::mesos::v1::resource::{DiskInfo, ReservationInfo, reservation_info};
        use slrp_proto::mesos::v1::resource_provider::{Call, call};
        use slrp_proto::mesos::v1::{Resource, ResourceProviderId, Uuid, value};

        let provider = ResourceProviderId {
            value: "6d1c9b44-3b0a-4c43-9a7e-1f7f2e0c8d11".to_owned(),
        };
        let disk = |n: usize| Resource {
            provider_id: Some(provider.clone()),
            name: "disk".to_owned(),
            r#type: value::Type::Scalar as i32,
            scalar: Some(value::Scalar { value: 1024.0 }),
            reservations: vec![ReservationInfo {
                r#type: Some(reservation_info::Type::Dynamic as i32),
                role: Some("storage".to_owned()),
                ..ReservationInfo::default()
            }],
            disk: Some(DiskInfo {
                source: Some(Source {
                    r#type: source::Type::Mount as i32,
                    mount: Some(source::Mount {
                        root: Some("./csi/org.apache.mesos.csi.local/local/mounts".to_owned()),
                    }),
                    vendor: Some("org.apache.mesos.csi.local.local".to_owned()),
                    id: Some(format!("{:032x}-{n:08}", u128::MAX - n as u128)),
                    profile: Some("fast-ssd".to_owned()),
                    ..Source::default()
                }),
                ..DiskInfo::default()
            }),
            ..Resource::default()
        };
        let call = Call {
            r#type: Some(call::Type::UpdateState as i32),
            resource_provider_id: Some(provider.clone()),
            update_state: Some(call::UpdateState {
                operations: Vec::new(),
                resources: (0..100_000).map(disk).collect(),
                resource_version_uuid: Uuid { value: vec![7; 16] },
            }),
            ..Call::default()
        };
        let defaults = ManagerConfig::new(Listen::Unix("/run/m.sock".into()));
        for content_type in [
            slrp_wire::ContentType::Protobuf,
            slrp_wire::ContentType::Json,
        ] {
            let body = slrp_wire::encode(content_type, &call)
                .unwrap_or_else(|e| unreachable!("encoding: {e}"));
            assert!(
                body.len() * 2 < defaults.max_body_bytes,
                "{content_type:?}: {} bytes for 100,000 volumes, limit {}",
                body.len(),
                defaults.max_body_bytes
            );
        }
    }

    #[test]
    fn rejects_non_loopback_and_zero_limits() {
        let mut config = ManagerConfig::new(Listen::Tcp(
            "0.0.0.0:5051"
                .parse()
                .unwrap_or_else(|_| unreachable!("literal address")),
        ));
        assert!(matches!(
            config.validate(),
            Err(ConfigError::NotLoopback { .. })
        ));
        config = ManagerConfig::loopback();
        assert!(config.validate().is_ok());
        config.event_queue = 0;
        assert!(matches!(
            config.validate(),
            Err(ConfigError::Zero {
                field: "event_queue"
            })
        ));
        config = ManagerConfig::loopback();
        config.agent_id = Some("a/b".to_owned());
        let error = config.validate().expect_err("a slash in the agent ID");
        assert!(error.to_string().contains("\"a/b\""), "{error}");
        config.agent_id = Some("2c9b0b4b-S0".to_owned());
        assert!(config.validate().is_ok());
        config.hostname.clear();
        assert!(matches!(
            config.validate(),
            Err(ConfigError::Empty { field: "hostname" })
        ));
    }
}
