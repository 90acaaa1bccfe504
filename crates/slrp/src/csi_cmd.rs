//! `slrp csi`: a direct CSI client for operators, on top of `slrp_csi::CsiClient`.
//!
//! Human output by default; `--json` prints one JSON document per command (the domain
//! types' serde form; `create-volume` prints the CSI `Volume` as
//! `{"volume_id","capacity_bytes","volume_context"}`).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;
use slrp_csi::*;
use slrp_types::{format_size, parse_size};

use crate::cli::{UsageError, write_stdout};

/// `slrp csi` arguments.
#[derive(Debug, Args)]
pub(crate) struct CsiArgs {
    /// Plugin endpoint: `unix:///path/to/csi.sock` (or a bare absolute path).
    #[arg(long, env = "CSI_ENDPOINT")]
    endpoint: String,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    /// CSI version to speak; `auto` probes v1, then v0.
    #[arg(long, value_enum, default_value_t = VersionArg::Auto, global = true)]
    csi_version: VersionArg,
    /// Deadline of each RPC (e.g. `30s`, `2m`).
    #[arg(long, default_value = "60s", value_parser = parse_timeout, global = true)]
    timeout: Duration,
    /// Retries of CreateVolume/DeleteVolume on UNAVAILABLE/DEADLINE_EXCEEDED, with Mesos's
    /// backoff (10 s doubling). 0 = fail on the first error.
    // The client itself never retries: these go through `slrp_csi::retry`, the loop the
    // daemon's volume manager uses.
    #[arg(long, default_value_t = 0, global = true)]
    retries: u32,
    #[command(subcommand)]
    command: CsiCommand,
}

/// A positive duration: a zero deadline would make every call fail.
fn parse_timeout(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(d) if d.is_zero() => Err("the timeout must be greater than zero".to_owned()),
        Ok(d) => Ok(d),
        Err(e) => Err(e.to_string()),
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum VersionArg {
    Auto,
    V0,
    V1,
}

/// Access type and mode of the volume capability a command sends.
#[derive(Debug, Args)]
struct CapabilityArgs {
    /// Block volume instead of a mounted filesystem.
    #[arg(long, conflicts_with_all = ["fs_type", "mount_flag"])]
    block: bool,
    /// Filesystem type of a mount volume (plugin default if absent).
    #[arg(long)]
    fs_type: Option<String>,
    /// Mount flag (repeatable).
    #[arg(long)]
    mount_flag: Vec<String>,
    /// Access mode, e.g. SINGLE_NODE_WRITER (default), MULTI_NODE_READER_ONLY.
    #[arg(long, default_value = "SINGLE_NODE_WRITER")]
    access_mode: String,
}

impl CapabilityArgs {
    fn capability(&self) -> Result<VolumeCapability, UsageError> {
        let access_mode = AccessMode::parse(&self.access_mode).ok_or_else(|| {
            let all: Vec<_> = AccessMode::ALL.iter().map(|m| m.as_str()).collect();
            UsageError(format!(
                "unknown access mode {:?} (one of {})",
                self.access_mode,
                all.join(", ")
            ))
        })?;
        let access_type = if self.block {
            AccessType::Block
        } else {
            AccessType::Mount {
                fs_type: self.fs_type.clone().unwrap_or_default(),
                mount_flags: self.mount_flag.clone(),
            }
        };
        Ok(VolumeCapability {
            access_type,
            access_mode,
        })
    }
}

#[derive(Debug, Subcommand)]
enum CsiCommand {
    /// GetPluginInfo (and the detected CSI version).
    Info,
    /// Probe.
    Probe,
    /// Plugin, controller and node capabilities.
    Capabilities,
    /// CreateVolume.
    CreateVolume {
        /// Volume name (the idempotency key).
        #[arg(long)]
        name: String,
        /// Required capacity, e.g. `64MiB`, `10GiB`, `1G`.
        #[arg(long)]
        size: Option<String>,
        /// Capacity limit (default: none).
        #[arg(long)]
        limit: Option<String>,
        /// Creation parameter `KEY=VALUE` (repeatable).
        #[arg(long = "parameter", value_name = "KEY=VALUE")]
        parameters: Vec<String>,
        #[command(flatten)]
        cap: CapabilityArgs,
    },
    /// DeleteVolume.
    DeleteVolume {
        /// Volume id.
        id: String,
    },
    /// ListVolumes (all pages).
    ListVolumes {
        /// Entries per page (0 = plugin's choice).
        #[arg(long, default_value_t = 0)]
        page_size: i32,
    },
    /// GetCapacity.
    Capacity {
        /// Parameter `KEY=VALUE` (repeatable).
        #[arg(long = "parameter", value_name = "KEY=VALUE")]
        parameters: Vec<String>,
        #[command(flatten)]
        cap: CapabilityArgs,
    },
    /// ValidateVolumeCapabilities.
    Validate {
        /// Volume id.
        id: String,
        /// Volume context `KEY=VALUE` from create-volume (repeatable).
        #[arg(long = "context", value_name = "KEY=VALUE")]
        context: Vec<String>,
        /// Creation parameter `KEY=VALUE` (repeatable; v1 only).
        #[arg(long = "parameter", value_name = "KEY=VALUE")]
        parameters: Vec<String>,
        #[command(flatten)]
        cap: CapabilityArgs,
    },
    /// NodeStageVolume.
    Stage {
        /// Volume id.
        id: String,
        /// Staging path.
        #[arg(long)]
        staging_path: String,
        /// Volume context `KEY=VALUE` (repeatable).
        #[arg(long = "context", value_name = "KEY=VALUE")]
        context: Vec<String>,
        /// Publish context `KEY=VALUE` from ControllerPublishVolume (repeatable).
        #[arg(long = "publish-context", value_name = "KEY=VALUE")]
        publish_context: Vec<String>,
        #[command(flatten)]
        cap: CapabilityArgs,
    },
    /// NodeUnstageVolume.
    Unstage {
        /// Volume id.
        id: String,
        /// Staging path.
        #[arg(long)]
        staging_path: String,
    },
    /// NodePublishVolume.
    Publish {
        /// Volume id.
        id: String,
        /// Target path.
        #[arg(long)]
        target_path: String,
        /// Staging path (if the plugin stages).
        #[arg(long)]
        staging_path: Option<String>,
        /// Publish read-only.
        #[arg(long)]
        readonly: bool,
        /// Volume context `KEY=VALUE` (repeatable).
        #[arg(long = "context", value_name = "KEY=VALUE")]
        context: Vec<String>,
        /// Publish context `KEY=VALUE` (repeatable).
        #[arg(long = "publish-context", value_name = "KEY=VALUE")]
        publish_context: Vec<String>,
        #[command(flatten)]
        cap: CapabilityArgs,
    },
    /// NodeUnpublishVolume.
    Unpublish {
        /// Volume id.
        id: String,
        /// Target path.
        #[arg(long)]
        target_path: String,
    },
    /// NodeGetVolumeStats.
    Stats {
        /// Volume id.
        id: String,
        /// Path where the volume is published or staged.
        #[arg(long)]
        path: String,
    },
    /// ControllerExpandVolume, then NodeExpandVolume if `--path` is given.
    Expand {
        /// Volume id.
        id: String,
        /// New size, e.g. `20GiB`.
        #[arg(long)]
        size: String,
        /// Published path, for the node part of the expansion.
        #[arg(long)]
        path: Option<String>,
    },
}

fn pairs(items: &[String], what: &str) -> Result<StringMap, UsageError> {
    let mut map = StringMap::new();
    for item in items {
        let (k, v) = item
            .split_once('=')
            .filter(|(k, _)| !k.is_empty())
            .ok_or_else(|| UsageError(format!("{what} {item:?} is not KEY=VALUE")))?;
        map.insert(k.to_owned(), v.to_owned());
    }
    Ok(map)
}

fn size_arg(s: &str, what: &str) -> Result<i64, UsageError> {
    let bytes = parse_size(s).map_err(|e| UsageError(format!("{what}: {e}")))?;
    i64::try_from(bytes).map_err(|_| UsageError(format!("{what}: {s:?} is too large")))
}

/// Writes `value` as JSON, or `human` as text.
fn emit<T: Serialize>(json: bool, value: &T, human: impl FnOnce() -> String) -> anyhow::Result<()> {
    let text = if json {
        serde_json::to_string_pretty(value).context("encoding JSON output")?
    } else {
        human()
    };
    write_stdout(&format!("{}\n", text.trim_end()))
}

fn human_map(m: &StringMap) -> String {
    if m.is_empty() {
        return "-".to_owned();
    }
    m.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn human_size(bytes: i64) -> String {
    u64::try_from(bytes).map_or_else(
        |_| bytes.to_string(),
        |b| format!("{b} ({})", format_size(b)),
    )
}

fn flags<const N: usize>(set: [(&str, bool); N]) -> String {
    let on: Vec<_> = set.iter().filter(|(_, v)| *v).map(|(n, _)| *n).collect();
    if on.is_empty() {
        "none".to_owned()
    } else {
        on.join(" ")
    }
}

fn volume_line(v: &Volume) -> String {
    format!(
        "{}\t{}\t{}",
        v.volume_id,
        human_size(v.capacity_bytes),
        human_map(&v.volume_context)
    )
}

#[derive(Serialize)]
struct Capabilities {
    version: CsiVersion,
    plugin: PluginCapabilities,
    controller: Option<ControllerCapabilities>,
    node: Option<NodeCapabilities>,
}

#[derive(Serialize)]
struct Info {
    version: CsiVersion,
    #[serde(flatten)]
    info: PluginInfo,
}

/// `UNIMPLEMENTED` means the service is not served at this endpoint (e.g. a node-only
/// plugin): show it as absent rather than failing the whole command.
fn optional<T>(r: Result<T, CsiError>) -> Result<Option<T>, CsiError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.code() == Some(Code::Unimplemented) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Runs one `slrp csi` command.
pub(crate) async fn run(args: CsiArgs) -> anyhow::Result<ExitCode> {
    let endpoint = CsiEndpoint::parse(&args.endpoint).map_err(|e| UsageError(e.to_string()))?;
    let version = match args.csi_version {
        VersionArg::Auto => VersionSelect::Auto,
        VersionArg::V0 => VersionSelect::Force(CsiVersion::V0),
        VersionArg::V1 => VersionSelect::Force(CsiVersion::V1),
    };
    // Only CreateVolume and DeleteVolume are retried (Mesos's rule), and only when asked.
    let policy = (args.retries > 0)
        .then(|| RetryPolicy::mesos().with_max_attempts(Some(args.retries.saturating_add(1))));
    // Nothing cancels a backoff but the operator's ^C, which ends the process.
    let no_cancel = tokio_util::sync::CancellationToken::new();
    let cfg = ClientConfig::default()
        .version(version)
        .rpc_timeout(args.timeout);
    let client = CsiClient::new(endpoint.clone(), cfg, CsiMetrics::default())
        .with_context(|| format!("preparing a client for {endpoint}"))?;
    let json = args.json;
    let ctx = || format!("CSI plugin at {endpoint}");

    match args.command {
        CsiCommand::Info => {
            let version = client.version().await.with_context(ctx)?;
            let info = client.plugin_info().await.with_context(ctx)?;
            let out = Info { version, info };
            emit(json, &out, || {
                format!(
                    "name:           {}\nvendor_version: {}\ncsi_version:    {}\nmanifest:       {}",
                    out.info.name,
                    out.info.vendor_version,
                    out.version,
                    human_map(&out.info.manifest)
                )
            })?;
        }
        CsiCommand::Probe => {
            let p = client.probe().await.with_context(ctx)?;
            emit(json, &p, || {
                format!(
                    "{} (csi {})",
                    if p.ready { "ready" } else { "not ready" },
                    p.version
                )
            })?;
            if !p.ready {
                return Ok(ExitCode::FAILURE);
            }
        }
        CsiCommand::Capabilities => {
            let version = client.version().await.with_context(ctx)?;
            let plugin = client.plugin_capabilities().await.with_context(ctx)?;
            let controller = optional(client.controller_capabilities().await).with_context(ctx)?;
            let node = optional(client.node_capabilities().await).with_context(ctx)?;
            let out = Capabilities {
                version,
                plugin,
                controller,
                node,
            };
            emit(json, &out, || {
                let p = &out.plugin;
                let mut s = format!(
                    "csi_version: {}\nplugin:      {}\n",
                    out.version,
                    flags([
                        ("CONTROLLER_SERVICE", p.controller_service),
                        ("ACCESSIBILITY_CONSTRAINTS", p.accessibility_constraints),
                        ("GROUP_CONTROLLER_SERVICE", p.group_controller_service),
                        ("EXPANSION_ONLINE", p.expansion_online),
                        ("EXPANSION_OFFLINE", p.expansion_offline),
                    ])
                );
                s += &match &out.controller {
                    None => "controller:  (not served)\n".to_owned(),
                    Some(c) => format!(
                        "controller:  {}\n",
                        flags([
                            ("CREATE_DELETE_VOLUME", c.create_delete_volume),
                            ("PUBLISH_UNPUBLISH_VOLUME", c.publish_unpublish_volume),
                            ("LIST_VOLUMES", c.list_volumes),
                            ("GET_CAPACITY", c.get_capacity),
                            ("CREATE_DELETE_SNAPSHOT", c.create_delete_snapshot),
                            ("LIST_SNAPSHOTS", c.list_snapshots),
                            ("CLONE_VOLUME", c.clone_volume),
                            ("PUBLISH_READONLY", c.publish_readonly),
                            ("EXPAND_VOLUME", c.expand_volume),
                            ("GET_VOLUME", c.get_volume),
                            ("VOLUME_CONDITION", c.volume_condition),
                        ])
                    ),
                };
                s += &match &out.node {
                    None => "node:        (not served)".to_owned(),
                    Some(n) => format!(
                        "node:        {}",
                        flags([
                            ("STAGE_UNSTAGE_VOLUME", n.stage_unstage_volume),
                            ("GET_VOLUME_STATS", n.get_volume_stats),
                            ("EXPAND_VOLUME", n.expand_volume),
                            ("VOLUME_CONDITION", n.volume_condition),
                        ])
                    ),
                };
                s
            })?;
        }
        CsiCommand::CreateVolume {
            name,
            size,
            limit,
            parameters,
            cap,
        } => {
            let req = CreateVolumeRequest {
                name,
                required_bytes: size
                    .as_deref()
                    .map(|s| size_arg(s, "--size"))
                    .transpose()?
                    .unwrap_or(0),
                limit_bytes: limit
                    .as_deref()
                    .map(|s| size_arg(s, "--limit"))
                    .transpose()?
                    .unwrap_or(0),
                capabilities: vec![cap.capability()?],
                parameters: pairs(&parameters, "--parameter")?,
                secrets: Secrets::default(),
                content_source: None,
            };
            let v = retry(CsiRpc::CreateVolume, policy.as_ref(), &no_cancel, || {
                client.create_volume(&req)
            })
            .await
            .with_context(ctx)?;
            emit(json, &v, || {
                format!(
                    "volume_id:      {}\ncapacity_bytes: {}\nvolume_context: {}",
                    v.volume_id,
                    human_size(v.capacity_bytes),
                    human_map(&v.volume_context)
                )
            })?;
        }
        CsiCommand::DeleteVolume { id } => {
            let id = VolumeId::new(id);
            let secrets = Secrets::default();
            let delete = || client.delete_volume(&id, &secrets);
            let result = retry(CsiRpc::DeleteVolume, policy.as_ref(), &no_cancel, delete).await;
            let gone = match result {
                Ok(()) => false,
                Err(e) if e.retry_class() == RetryClass::AlreadyDone => true,
                Err(e) => return Err(anyhow::Error::new(e).context(ctx())),
            };
            #[derive(Serialize)]
            struct Deleted<'a> {
                volume_id: &'a VolumeId,
                already_gone: bool,
            }
            emit(
                json,
                &Deleted {
                    volume_id: &id,
                    already_gone: gone,
                },
                || {
                    if gone {
                        format!("{id} did not exist")
                    } else {
                        format!("deleted {id}")
                    }
                },
            )?;
        }
        CsiCommand::ListVolumes { page_size } => {
            if page_size < 0 {
                return Err(UsageError("--page-size must not be negative".into()).into());
            }
            let vols = client.list_volumes(page_size).await.with_context(ctx)?;
            emit(json, &vols, || {
                let mut s = String::from("VOLUME_ID\tCAPACITY\tCONTEXT\n");
                for v in &vols {
                    s += &volume_line(v);
                    s.push('\n');
                }
                s
            })?;
        }
        CsiCommand::Capacity { parameters, cap } => {
            let c = client
                .capacity(&[cap.capability()?], &pairs(&parameters, "--parameter")?)
                .await
                .with_context(ctx)?;
            emit(json, &c, || {
                let mut s = format!("available: {}", human_size(c.available_bytes));
                if let Some(m) = c.maximum_volume_size {
                    s += &format!("\nmaximum_volume_size: {}", human_size(m));
                }
                s
            })?;
        }
        CsiCommand::Validate {
            id,
            context,
            parameters,
            cap,
        } => {
            let req = ValidateRequest {
                volume_id: VolumeId::new(id),
                capabilities: vec![cap.capability()?],
                volume_context: pairs(&context, "--context")?,
                parameters: pairs(&parameters, "--parameter")?,
            };
            let v = client.validate(&req).await.with_context(ctx)?;
            emit(json, &v, || {
                let verdict = if v.confirmed {
                    "confirmed"
                } else {
                    "not confirmed"
                };
                if v.message.is_empty() {
                    verdict.to_owned()
                } else {
                    format!("{verdict}: {}", v.message)
                }
            })?;
            if !v.confirmed {
                return Ok(ExitCode::FAILURE);
            }
        }
        CsiCommand::Stage {
            id,
            staging_path,
            context,
            publish_context,
            cap,
        } => {
            let req = NodeStageRequest {
                volume_id: VolumeId::new(id),
                publish_context: pairs(&publish_context, "--publish-context")?,
                staging_target_path: staging_path,
                capability: cap.capability()?,
                volume_context: pairs(&context, "--context")?,
                secrets: Secrets::default(),
            };
            client.node_stage(&req).await.with_context(ctx)?;
            done(json, "staged", &req.volume_id, &req.staging_target_path)?;
        }
        CsiCommand::Unstage { id, staging_path } => {
            let id = VolumeId::new(id);
            client
                .node_unstage(&id, &staging_path)
                .await
                .with_context(ctx)?;
            done(json, "unstaged", &id, &staging_path)?;
        }
        CsiCommand::Publish {
            id,
            target_path,
            staging_path,
            readonly,
            context,
            publish_context,
            cap,
        } => {
            let req = NodePublishRequest {
                volume_id: VolumeId::new(id),
                publish_context: pairs(&publish_context, "--publish-context")?,
                staging_target_path: staging_path,
                target_path,
                capability: cap.capability()?,
                readonly,
                volume_context: pairs(&context, "--context")?,
                secrets: Secrets::default(),
            };
            client.node_publish(&req).await.with_context(ctx)?;
            done(json, "published", &req.volume_id, &req.target_path)?;
        }
        CsiCommand::Unpublish { id, target_path } => {
            let id = VolumeId::new(id);
            client
                .node_unpublish(&id, &target_path)
                .await
                .with_context(ctx)?;
            done(json, "unpublished", &id, &target_path)?;
        }
        CsiCommand::Stats { id, path } => {
            let s = client
                .node_stats(&VolumeId::new(id), &path)
                .await
                .with_context(ctx)?;
            emit(json, &s, || {
                let mut out = String::from("UNIT\tUSED\tAVAILABLE\tTOTAL\n");
                for u in &s.usage {
                    out += &format!("{:?}\t{}\t{}\t{}\n", u.unit, u.used, u.available, u.total);
                }
                if let Some(abnormal) = s.abnormal {
                    out += &format!(
                        "condition: {} {}\n",
                        if abnormal { "abnormal" } else { "normal" },
                        s.condition_message.as_deref().unwrap_or("")
                    );
                }
                out
            })?;
        }
        CsiCommand::Expand { id, size, path } => {
            let id = VolumeId::new(id);
            let bytes = size_arg(&size, "--size")?;
            let c = client
                .controller_expand(&id, bytes, None)
                .await
                .with_context(ctx)?;
            let node_capacity = match &path {
                Some(p) if c.node_expansion_required => {
                    let req = slrp_csi::NodeExpandRequest {
                        volume_id: id.clone(),
                        volume_path: p.clone(),
                        staging_target_path: None,
                        required_bytes: bytes,
                        capability: None,
                    };
                    Some(client.node_expand(&req).await.with_context(ctx)?)
                }
                Some(_) | None => None,
            };
            #[derive(Serialize)]
            struct Expanded {
                controller: ControllerExpansion,
                node_capacity_bytes: Option<i64>,
            }
            let out = Expanded {
                controller: c,
                node_capacity_bytes: node_capacity,
            };
            emit(json, &out, || {
                let mut s = format!(
                    "capacity_bytes: {}\nnode_expansion_required: {}",
                    human_size(c.capacity_bytes),
                    c.node_expansion_required
                );
                if let Some(n) = node_capacity {
                    s += &format!("\nnode capacity_bytes: {}", human_size(n));
                } else if c.node_expansion_required && path.is_none() {
                    s += "\n(pass --path to expand on the node as well)";
                }
                s
            })?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn done(json: bool, what: &str, id: &VolumeId, path: &str) -> anyhow::Result<()> {
    #[derive(Serialize)]
    struct Done<'a> {
        volume_id: &'a VolumeId,
        path: &'a str,
        result: &'a str,
    }
    emit(
        json,
        &Done {
            volume_id: id,
            path,
            result: what,
        },
        || format!("{what} {id} at {path}"),
    )
}
