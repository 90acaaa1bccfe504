//! `slrp ctl`: the operator's client of the admin API (`docs/admin-api.md`), and `slrp
//! completions` / `slrp man`, generated from the same clap definition.
//!
//! Human output is aligned tables; `--json` prints the API's bodies exactly as the daemon
//! sent them (pretty-printed), for scripts. Every failure maps to one exit code of the
//! FIXED contract (`docs/cli.md`): see [`client::CtlError::exit_code`].

mod client;
mod generate;
mod resources;
mod snapshots;
mod table;

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand, ValueEnum};
use slrp_provider::admin::api::{
    CreateDisk, CreateSnapshot, DestroyDisk, DiskExpanded, ExpandDisk, OperationSummary,
    PluginHealth, ProfileSummary, SnapshotDeleted, SnapshotRef, SnapshotSummary, Status,
    VolumeChanged, VolumeRef, VolumeSummary,
};
use slrp_types::parse_size;

use crate::cli::{UsageError, write_stdout};
use client::{AdminClient, CtlError, Endpoint, Token};
pub(crate) use generate::{CompletionsArgs, ManArgs, completions, man};
use table::{Table, cells, or_dash, rendered, several, table};

/// `<default state dir>/admin.sock` (slrp_provider's `DEFAULT_STATE_DIR`; a test checks
/// that they agree).
const DEFAULT_ADMIN: &str = "/var/lib/slrp/admin.sock";

/// The exit codes of the FIXED contract, in `slrp ctl --help` and its man page.
const EXIT_CODES: &str = "\
Exit codes:
  0   done
  1   the daemon refused or failed the request, or the operation did not finish
  2   slrp is not running or cannot be reached
  3   permission denied on the socket, or a missing or wrong token (TCP)
  4   unknown volume, operation or profile
  5   --wait timed out (the operation goes on)
  64  usage error";

/// `slrp ctl` arguments.
#[derive(Debug, Args)]
#[command(after_help = EXIT_CODES)]
pub(crate) struct CtlArgs {
    /// The admin endpoint: the daemon's socket (a path or `unix:///path`), or
    /// `http://host:port` for its TCP listener (with --token-file).
    #[arg(long, env = "SLRP_ADMIN", default_value = DEFAULT_ADMIN, value_name = "SOCKET_OR_URL", global = true)]
    admin: String,
    /// The file holding the bearer token of a TCP endpoint (the token itself is never
    /// taken on the command line).
    #[arg(
        long,
        env = "SLRP_ADMIN_TOKEN_FILE",
        value_name = "FILE",
        global = true
    )]
    token_file: Option<PathBuf>,
    /// Print the API's JSON bodies instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: CtlCommand,
}

#[derive(Debug, Subcommand)]
enum CtlCommand {
    /// The daemon's mode, version, agent id and each provider's state.
    Status,
    /// Each CSI storage pool with the profiles drawing on it (used, free, total) and the
    /// disks, from the providers' Mesos resources.
    Resources,
    /// The volumes the providers' volume managers track: state, mounts, last error.
    Volumes {
        /// Show only this volume, in detail.
        id: Option<String>,
    },
    /// The operations the providers track (and, in standalone mode, the recent ones the
    /// embedded manager saw end), with their status updates under --json.
    Operations {
        /// Show only this operation, with its status updates.
        uuid: Option<String>,
    },
    /// The disk profiles and their CSI parameters.
    Profiles,
    /// The CSI plugins: health, CSI version, restarts, last error.
    Plugins,
    /// Create a disk from a profile's pool (standalone mode).
    CreateDisk {
        /// The disk profile whose pool the disk comes from.
        #[arg(long)]
        profile: String,
        /// The size, e.g. `64MiB`, `10GiB`, `1G` (rounded up to whole MiB).
        #[arg(long)]
        size: String,
        /// `mount` or `block` (default: the profile's type).
        #[arg(long = "type", value_enum, value_name = "TYPE")]
        kind: Option<DiskType>,
        /// Restore this snapshot into the new disk.
        #[arg(long, value_name = "SNAP", conflicts_with = "from_disk")]
        from_snapshot: Option<String>,
        /// Clone this disk into the new disk.
        #[arg(long, value_name = "ID")]
        from_disk: Option<String>,
        #[command(flatten)]
        wait: WaitArgs,
        #[command(flatten)]
        provider: ProviderArg,
    },
    /// Destroy a disk (standalone mode): its data is deleted.
    DestroyDisk {
        /// The volume id (`disk.source.id`).
        id: String,
        #[command(flatten)]
        wait: WaitArgs,
        #[command(flatten)]
        provider: ProviderArg,
    },
    /// Grow a disk (standalone mode): the plugin grows the volume and, if it is published,
    /// its file system; the pool gives the space.
    ExpandDisk {
        /// The volume id (`disk.source.id`).
        id: String,
        /// The new size, e.g. `2GiB` (rounded up to whole MiB).
        #[arg(long)]
        size: String,
        #[command(flatten)]
        wait: WaitArgs,
        #[command(flatten)]
        provider: ProviderArg,
    },
    /// Take a snapshot of a disk (standalone mode).
    Snapshot {
        /// The volume id (`disk.source.id`).
        id: String,
        /// The snapshot's name (the same name for the same disk answers the snapshot taken
        /// before); default a fresh one.
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        provider: ProviderArg,
    },
    /// The snapshots (of one disk, when given).
    Snapshots {
        /// Show only the snapshots of this disk.
        id: Option<String>,
    },
    /// Delete a snapshot (standalone mode).
    DeleteSnapshot {
        /// The snapshot id.
        id: String,
        #[command(flatten)]
        provider: ProviderArg,
    },
    /// Publish a volume on this node, as before a task starts (standalone mode); the last
    /// line of the output is the mount directory or the block device.
    Publish {
        /// The volume id.
        id: String,
        #[command(flatten)]
        provider: ProviderArg,
    },
    /// Unpublish and unstage a volume without destroying it (make sure no task uses it).
    Unpublish {
        /// The volume id.
        id: String,
        #[command(flatten)]
        provider: ProviderArg,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum DiskType {
    Mount,
    Block,
}

impl DiskType {
    fn as_str(self) -> &'static str {
        match self {
            Self::Mount => "mount",
            Self::Block => "block",
        }
    }
}

#[derive(Debug, Args)]
struct WaitArgs {
    /// Wait until the operation ends (a spinner on a terminal); exit 1 if it did not
    /// finish, 5 on timeout.
    #[arg(long)]
    wait: bool,
    /// How long --wait waits, in seconds (only with --wait).
    #[arg(long, value_name = "SECONDS", default_value_t = 300, requires = "wait",
          value_parser = clap::value_parser!(u64).range(1..))]
    timeout: u64,
}

#[derive(Debug, Args)]
struct ProviderArg {
    /// The provider (`<type>.<name>`); needed only when the daemon runs several.
    #[arg(long)]
    provider: Option<String>,
}

/// The exit code an error of `slrp ctl` stands for, if it is one of ours.
pub(crate) fn exit_code(e: &anyhow::Error) -> Option<u8> {
    e.downcast_ref::<CtlError>().map(CtlError::exit_code)
}

/// Runs one `slrp ctl` command.
pub(crate) async fn run(args: CtlArgs) -> anyhow::Result<ExitCode> {
    let endpoint = Endpoint::parse(&args.admin)?;
    let token = match (&endpoint, &args.token_file) {
        (Endpoint::Tcp { .. }, Some(path)) => Some(Token::read(path)?),
        _ => None,
    };
    let client = AdminClient::new(endpoint, token);
    let json = args.json;
    match args.command {
        CtlCommand::Status => {
            list(&client, json, "/status", |s: Status| status_text(&s)).await?;
        }
        CtlCommand::Resources => {
            // The profiles say which share a CSI pool; --json prints /resources alone.
            let (profiles, snapshots): (Vec<ProfileSummary>, Vec<SnapshotSummary>) = if json {
                (Vec::new(), Vec::new())
            } else {
                (
                    client.get("/profiles").await?,
                    client.get("/snapshots").await?,
                )
            };
            list(&client, json, "/resources", |r: Vec<serde_json::Value>| {
                let mut text = resources::render(&r, &profiles);
                text.push_str(&snapshots::space_text(&snapshots));
                text
            })
            .await?;
        }
        CtlCommand::Volumes { id: None } => {
            list(&client, json, "/volumes", |v: Vec<VolumeSummary>| {
                volumes_text(&v)
            })
            .await?;
        }
        CtlCommand::Volumes { id: Some(id) } => {
            let path = format!("/volumes/{}", percent_encode(&id));
            list(&client, json, &path, |v: VolumeSummary| volume_text(&v))
                .await
                .map_err(volume_hint)?;
        }
        CtlCommand::Operations { uuid: None } => {
            list(&client, json, "/operations", |o: Vec<OperationSummary>| {
                operations_text(&o)
            })
            .await?;
        }
        CtlCommand::Operations { uuid: Some(uuid) } => {
            let path = format!("/operations/{}", percent_encode(&uuid));
            list(&client, json, &path, |o: OperationSummary| {
                operation_text(&o)
            })
            .await?;
        }
        CtlCommand::Profiles => {
            list(&client, json, "/profiles", |p: Vec<ProfileSummary>| {
                profiles_text(&p)
            })
            .await?;
        }
        CtlCommand::Plugins => {
            list(&client, json, "/plugins", |p: Vec<PluginHealth>| {
                plugins_text(&p)
            })
            .await?;
        }
        CtlCommand::CreateDisk {
            profile,
            size,
            kind,
            from_snapshot,
            from_disk,
            wait,
            provider,
        } => {
            let size_bytes = parse_size(&size).map_err(|e| UsageError(format!("--size: {e}")))?;
            if size_bytes == 0 {
                return Err(UsageError("--size: a disk needs more than 0 bytes".into()).into());
            }
            let kind = match kind {
                Some(kind) => kind.as_str().to_owned(),
                None => profile_type(&client, &profile).await?,
            };
            let request = CreateDisk {
                provider: provider.provider,
                profile: profile.clone(),
                size_bytes,
                r#type: Some(kind.clone()),
                wait: wait.wait,
                timeout_seconds: wait.wait.then_some(wait.timeout),
                from_snapshot: from_snapshot.clone(),
                from_disk: from_disk.clone(),
            };
            let from = match (&from_snapshot, &from_disk) {
                (Some(snap), _) => format!(" restored from snapshot {snap}"),
                (None, Some(disk)) => format!(" cloned from disk {disk}"),
                (None, None) => String::new(),
            };
            let what = format!(
                "creating a {kind} disk of {} from profile {profile}{from}",
                disk_size_text(size_bytes)
            );
            let op = operation(&client, json, "/disks", &request, &wait, &what).await?;
            if !json {
                write_stdout(&match (&op.volume_id, wait.wait) {
                    (Some(id), true) => format!("created disk {id} (profile {profile})\n"),
                    _ => pending_text(&op),
                })?;
            }
        }
        CtlCommand::DestroyDisk { id, wait, provider } => {
            let request = DestroyDisk {
                provider: provider.provider,
                volume_id: id.clone(),
                wait: wait.wait,
                timeout_seconds: wait.wait.then_some(wait.timeout),
            };
            let what = format!("destroying disk {id}");
            let op = operation(&client, json, "/disks/destroy", &request, &wait, &what)
                .await
                .map_err(volume_hint)?;
            if !json {
                write_stdout(&if wait.wait {
                    format!("destroyed disk {id}\n")
                } else {
                    pending_text(&op)
                })?;
            }
        }
        CtlCommand::ExpandDisk {
            id,
            size,
            wait,
            provider,
        } => {
            let size_bytes = parse_size(&size).map_err(|e| UsageError(format!("--size: {e}")))?;
            if size_bytes == 0 {
                return Err(UsageError("--size: a disk needs more than 0 bytes".into()).into());
            }
            let request = ExpandDisk {
                provider: provider.provider,
                volume_id: id.clone(),
                size_bytes,
                wait: wait.wait,
                timeout_seconds: wait.wait.then_some(wait.timeout),
            };
            let what = format!("growing disk {id} to {}", disk_size_text(size_bytes));
            let progress = Progress::start(wait.wait && std::io::stderr().is_terminal(), &what);
            // The plugin's calls (a file system to grow) come before the answer, with or
            // without --wait.
            let answer = client
                .post_raw(
                    "/disks/expand",
                    &request,
                    Duration::from_secs(wait.timeout) + Duration::from_secs(30),
                )
                .await;
            progress.finish();
            let raw = answer.map_err(anyhow::Error::from).map_err(volume_hint)?;
            let grown: DiskExpanded = client.parse("POST /disks/expand", &raw)?;
            if json {
                print_json(&client, "/disks/expand", &raw)?;
            } else {
                write_stdout(&expanded_text(&grown))?;
            }
        }
        CtlCommand::Snapshot { id, name, provider } => {
            let request = CreateSnapshot {
                provider: provider.provider,
                volume_id: id,
                name,
            };
            // A snapshot is a copy: as long as the data is large, with or without reflinks.
            let raw = client
                .post_raw("/snapshots", &request, Duration::from_secs(3600))
                .await
                .map_err(anyhow::Error::from)
                .map_err(volume_hint)?;
            let taken: SnapshotSummary = client.parse("POST /snapshots", &raw)?;
            if json {
                print_json(&client, "/snapshots", &raw)?;
            } else {
                write_stdout(&snapshots::taken_text(&taken))?;
            }
        }
        CtlCommand::Snapshots { id } => {
            list(&client, json, "/snapshots", |all: Vec<SnapshotSummary>| {
                snapshots::snapshots_text(&all, id.as_deref())
            })
            .await?;
        }
        CtlCommand::DeleteSnapshot { id, provider } => {
            let request = SnapshotRef {
                provider: provider.provider,
                snapshot_id: id.clone(),
            };
            let raw = client
                .post_raw("/snapshots/delete", &request, client::REQUEST_TIMEOUT)
                .await
                .map_err(|e| match e {
                    CtlError::NotFound { error } => CtlError::NotFound {
                        error: format!("{error}; `slrp ctl snapshots` lists the snapshots"),
                    },
                    other => other,
                })?;
            let _: SnapshotDeleted = client.parse("POST /snapshots/delete", &raw)?;
            if json {
                print_json(&client, "/snapshots/delete", &raw)?;
            } else {
                write_stdout(&format!("deleted snapshot {id}\n"))?;
            }
        }
        CtlCommand::Publish { id, provider } => {
            let changed = volume_change(&client, json, "/volumes/publish", id, provider)
                .await
                .map_err(volume_hint)?;
            // Under --json too: a script reads `.path` as it reads the last line.
            let text = published_text(&changed)?;
            if !json {
                write_stdout(&text)?;
            }
        }
        CtlCommand::Unpublish { id, provider } => {
            let changed = volume_change(&client, json, "/volumes/unpublish", id, provider)
                .await
                .map_err(volume_hint)?;
            if !json {
                write_stdout(&format!(
                    "unpublished {} ({})\n",
                    changed.volume_id, changed.state
                ))?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `expand-disk`'s answer for people.
fn expanded_text(grown: &DiskExpanded) -> String {
    let mut text = format!(
        "expanded disk {} to {}",
        grown.volume_id,
        disk_size_text(grown.size_bytes)
    );
    if grown.node_expansion_owed {
        text.push_str(" (its file system grows when it is next published)");
    }
    if grown.offered_bytes < grown.size_bytes {
        text.push_str(&format!(
            "; the provider still offers it at {} until its next reconciliation",
            disk_size_text(grown.offered_bytes)
        ));
    }
    text.push('\n');
    text
}

/// `GET path`: the body as sent under `--json`, else `human` of the parsed body.
async fn list<T: serde::de::DeserializeOwned>(
    client: &AdminClient,
    json: bool,
    path: &str,
    human: impl FnOnce(T) -> String,
) -> anyhow::Result<()> {
    let raw = client.get_raw(path).await?;
    // Parsed in both modes: a body that is not what the API documents is an error, not
    // something to pass on to a script.
    let value: T = client.parse(&format!("GET {path}"), &raw)?;
    if json {
        print_json(client, path, &raw)
    } else {
        write_stdout(&human(value))
    }
}

/// Pretty-prints a JSON body as the daemon sent it (fields this client does not know
/// included).
fn print_json(client: &AdminClient, path: &str, raw: &[u8]) -> anyhow::Result<()> {
    let value: serde_json::Value = client.parse(path, raw)?;
    let text = serde_json::to_string_pretty(&value).context("encoding JSON output")?;
    write_stdout(&format!("{text}\n"))
}

/// The type of `profile`, so that `create-disk` of a BLOCK profile needs no `--type`.
async fn profile_type(client: &AdminClient, profile: &str) -> Result<String, CtlError> {
    let profiles: Vec<ProfileSummary> = client.get("/profiles").await?;
    match profiles.iter().find(|p| p.name == profile) {
        Some(p) => Ok(p.r#type.clone()),
        None => {
            let names: Vec<_> = profiles.iter().map(|p| p.name.as_str()).collect();
            Err(CtlError::NotFound {
                error: format!(
                    "unknown profile '{profile}' (the daemon has: {})",
                    if names.is_empty() {
                        "none".to_owned()
                    } else {
                        names.join(", ")
                    }
                ),
            })
        }
    }
}

/// Starts an operation with `POST path`; with `--wait`, waits for its end (the daemon
/// waits, the client shows a spinner meanwhile) and fails unless it FINISHED. Under
/// `--json` the summary is printed whatever the outcome.
async fn operation<B: serde::Serialize>(
    client: &AdminClient,
    json: bool,
    path: &str,
    request: &B,
    wait: &WaitArgs,
    what: &str,
) -> anyhow::Result<OperationSummary> {
    let limit = Duration::from_secs(wait.timeout);
    let raw = if wait.wait {
        let progress = Progress::start(std::io::stderr().is_terminal(), what);
        // The daemon answers 504 when its wait ends; the margin lets that answer arrive
        // rather than the client giving up first.
        let answer = client
            .post_raw(path, request, limit + Duration::from_secs(30))
            .await;
        progress.finish();
        answer.map_err(|e| waited_error(e, limit))?
    } else {
        client
            .post_raw(path, request, client::REQUEST_TIMEOUT)
            .await?
    };
    let op: OperationSummary = client.parse(&format!("POST {path}"), &raw)?;
    if json {
        print_json(client, path, &raw)?;
    }
    if wait.wait {
        if !op.is_terminal() {
            return Err(CtlError::WaitTimedOut { after: limit }.into());
        }
        if op.state != "OPERATION_FINISHED" {
            return Err(CtlError::OperationEnded {
                operation: op.operation_uuid.clone(),
                kind: op.r#type.clone(),
                state: op.state.clone(),
                message: op.message.clone().unwrap_or_else(|| "no message".into()),
            }
            .into());
        }
    }
    Ok(op)
}

/// What a failed `--wait` request stands for: the daemon's 504 (its wait ended) and the
/// client's own deadline are a timeout (exit 5), the operation going on.
fn waited_error(e: CtlError, limit: Duration) -> CtlError {
    match e {
        CtlError::Daemon { status: 504, .. } | CtlError::NoAnswer { .. } => {
            CtlError::WaitTimedOut { after: limit }
        }
        e => e,
    }
}

/// An unknown volume's error, with where to find the known ones (the daemon's text speaks
/// of the API).
fn volume_hint(e: anyhow::Error) -> anyhow::Error {
    match e.downcast::<CtlError>() {
        Ok(CtlError::NotFound { error }) => CtlError::NotFound {
            error: format!("{error}; `slrp ctl volumes` lists the volumes"),
        }
        .into(),
        Ok(other) => other.into(),
        Err(e) => e,
    }
}

/// What `publish` prints: the state, then the path on the last line. An answer without a
/// path is an error, as scripts take the last line for the path.
fn published_text(changed: &VolumeChanged) -> Result<String, CtlError> {
    match changed.path.as_deref() {
        Some(path) if !path.is_empty() => Ok(format!(
            "published {} ({})\n{path}\n",
            changed.volume_id, changed.state
        )),
        Some(_) | None => Err(CtlError::NoPublishedPath {
            volume_id: changed.volume_id.clone(),
            state: changed.state.clone(),
        }),
    }
}

/// `POST path` with a [`VolumeRef`]; prints the answer under `--json`.
async fn volume_change(
    client: &AdminClient,
    json: bool,
    path: &str,
    volume_id: String,
    provider: ProviderArg,
) -> anyhow::Result<VolumeChanged> {
    let request = VolumeRef {
        provider: provider.provider,
        volume_id,
    };
    let raw = client
        .post_raw(path, &request, client::REQUEST_TIMEOUT)
        .await?;
    let changed: VolumeChanged = client.parse(&format!("POST {path}"), &raw)?;
    if json {
        print_json(client, path, &raw)?;
    }
    Ok(changed)
}

/// A spinner with the elapsed time on stderr while `--wait` waits, only on a terminal:
/// piped or redirected output stays free of control characters.
struct Progress(Option<indicatif::ProgressBar>);

impl Progress {
    fn start(on_terminal: bool, what: &str) -> Self {
        if !on_terminal {
            return Self(None);
        }
        let bar =
            indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
        if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
            bar.set_style(style);
        }
        bar.set_message(what.to_owned());
        bar.enable_steady_tick(Duration::from_millis(100));
        Self(Some(bar))
    }

    fn finish(self) {
        if let Some(bar) = self.0 {
            bar.finish_and_clear();
        }
    }
}

/// The size of the disk `size_bytes` asks for, as the daemon makes it: rounded up to whole
/// MiB (`1G` is a 954MiB disk), in GiB or TiB only when that is exact.
fn disk_size_text(size_bytes: u64) -> String {
    let mib = size_bytes.div_ceil(1 << 20);
    if mib.is_multiple_of(1024) {
        #[allow(clippy::cast_precision_loss)]
        resources::human_mb(mib as f64)
    } else {
        format!("{mib}MiB")
    }
}

fn bytes_to_mb(bytes: u64) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let b = bytes as f64;
    b / 1_048_576.0
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.to_owned()
}

fn status_text(s: &Status) -> String {
    let mode = match s.mode {
        slrp_provider::admin::api::Mode::Standalone => "standalone",
        slrp_provider::admin::api::Mode::Run => "run",
    };
    let mut out = format!(
        "mode:     {mode}\nversion:  {}\nagent id: {}\nready:    {}\n\n",
        s.version,
        or_dash(s.agent_id.as_deref()),
        yes_no(s.ready)
    );
    let mut t = Table::new(&[
        "PROVIDER",
        "STATE",
        "READY",
        "VOLUMES",
        "OPERATIONS",
        "UNACKNOWLEDGED",
        "ERROR",
    ]);
    for p in &s.providers {
        t.row(vec![
            p.provider.clone(),
            p.state.clone(),
            yes_no(p.ready),
            p.volumes.map_or_else(|| "-".to_owned(), |v| v.to_string()),
            p.operations.to_string(),
            p.unacknowledged.to_string(),
            or_dash(p.error.as_deref()),
        ]);
    }
    out.push_str(&rendered(&t, "no providers"));
    out
}

fn volumes_text(volumes: &[VolumeSummary]) -> String {
    let with = several(volumes.iter().map(|v| v.provider.as_str()));
    let mut t = table(
        with,
        &[
            "VOLUME",
            "STATE",
            "TYPE",
            "SIZE",
            "PROFILE",
            "PATH",
            "LAST ERROR",
            "USED",
            "HEALTH",
        ],
    );
    for v in volumes {
        t.row(cells(
            with,
            &v.provider,
            vec![
                v.volume_id.clone(),
                v.state.clone(),
                or_dash(v.r#type.as_deref()),
                v.capacity_bytes
                    .map_or_else(|| "-".to_owned(), |b| resources::human_mb(bytes_to_mb(b))),
                or_dash(v.profile.as_deref()),
                or_dash(v.target_path.as_deref().or(v.staging_path.as_deref())),
                or_dash(v.last_error.as_deref()),
                used_text(v),
                v.health
                    .as_ref()
                    .map_or_else(|| "-".to_owned(), |h| h.column().to_owned()),
            ],
        ));
    }
    rendered(&t, "no volumes")
}

/// The USED column: the bytes used on the volume and their share of its file system
/// (`12MiB (18%)`), from the last sample; `-` without one.
fn used_text(v: &VolumeSummary) -> String {
    let Some((used, share)) = v
        .health
        .as_ref()
        .and_then(|h| h.usage.as_ref())
        .and_then(|u| u.used_bytes())
    else {
        return "-".to_owned();
    };
    let bytes = resources::human_mb(bytes_to_mb(used));
    match share {
        Some(share) => format!("{bytes} ({share:.0}%)"),
        None => bytes,
    }
}

/// The `volumes ID` lines of the volume health sample (after the existing ones).
fn health_fields(v: &VolumeSummary) -> Vec<(&'static str, String)> {
    let Some(h) = &v.health else {
        return vec![("health", "-".to_owned())];
    };
    let amounts = |a: Option<slrp_provider::admin::api::AmountsSummary>, human: bool| {
        a.map_or_else(
            || "-".to_owned(),
            |a| {
                if human {
                    format!(
                        "{} of {} ({} available)",
                        resources::human_mb(bytes_to_mb(a.used)),
                        resources::human_mb(bytes_to_mb(a.total)),
                        resources::human_mb(bytes_to_mb(a.available))
                    )
                } else {
                    format!("{} of {} ({} free)", a.used, a.total, a.available)
                }
            },
        )
    };
    let usage = h.usage.as_ref();
    vec![
        ("health", h.column().to_owned()),
        (
            "condition",
            match (&h.message, &h.source) {
                (Some(m), Some(s)) => format!("{m} (from {s})"),
                (Some(m), None) => m.clone(),
                (None, _) => "-".to_owned(),
            },
        ),
        ("used", used_text(v)),
        ("bytes", amounts(usage.and_then(|u| u.bytes), true)),
        ("inodes", amounts(usage.and_then(|u| u.inodes), false)),
        (
            "sampled",
            match (&h.sampled_at, h.age_seconds) {
                (Some(at), Some(age)) => format!("{at} ({age:.0}s ago)"),
                (Some(at), None) => at.clone(),
                (None, _) => "never".to_owned(),
            },
        ),
        ("health error", or_dash(h.error.as_deref())),
    ]
}

/// `key: value` lines, the values aligned.
fn fields(pairs: &[(&str, String)]) -> String {
    let width = pairs.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
    pairs
        .iter()
        .map(|(k, v)| format!("{:<width$} {v}\n", format!("{k}:")))
        .collect()
}

fn volume_text(v: &VolumeSummary) -> String {
    fields(
        &[
            ("volume", v.volume_id.clone()),
            ("provider", v.provider.clone()),
            ("state", v.state.clone()),
            ("type", or_dash(v.r#type.as_deref())),
            (
                "size",
                v.capacity_bytes
                    .map_or_else(|| "-".to_owned(), |b| resources::human_mb(bytes_to_mb(b))),
            ),
            ("profile", or_dash(v.profile.as_deref())),
            ("staging path", or_dash(v.staging_path.as_deref())),
            ("target path", or_dash(v.target_path.as_deref())),
            ("last error", or_dash(v.last_error.as_deref())),
        ]
        .into_iter()
        .chain(health_fields(v))
        .collect::<Vec<_>>(),
    )
}

fn operation_text(o: &OperationSummary) -> String {
    let mut rows = vec![
        ("operation", o.operation_uuid.clone()),
        ("provider", o.provider.clone()),
        ("type", o.r#type.clone()),
        ("state", o.state.clone()),
        ("message", or_dash(o.message.as_deref())),
        ("framework", or_dash(o.framework_id.as_deref())),
        ("volume", or_dash(o.volume_id.as_deref())),
    ];
    // Only while a call waits for a retry: the usual view keeps its shape.
    if let Some(error) = &o.last_error {
        rows.push(("last error", error.clone()));
        rows.push(("next retry", or_dash(o.next_retry.as_deref())));
    }
    let mut out = fields(&rows);
    out.push('\n');
    let mut t = Table::new(&["STATUS", "STATE", "ACKNOWLEDGED", "MESSAGE"]);
    for st in &o.statuses {
        t.row(vec![
            or_dash(st.status_uuid.as_deref()),
            st.state.clone(),
            st.acknowledged.map_or_else(|| "-".to_owned(), yes_no),
            or_dash(st.message.as_deref()),
        ]);
    }
    out.push_str(&rendered(&t, "no status updates"));
    out
}

/// `text` as one path segment: unreserved characters kept, every other byte `%XX`, so an
/// id can neither leave its route (`/`, `..`) nor break the request line.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    // `.` and `..` alone are unreserved but name a directory step.
    match out.as_str() {
        "." => "%2E".to_owned(),
        ".." => "%2E%2E".to_owned(),
        _ => out,
    }
}

fn operations_text(ops: &[OperationSummary]) -> String {
    let with = several(ops.iter().map(|o| o.provider.as_str()));
    let mut t = table(with, &["OPERATION", "TYPE", "STATE", "VOLUME", "MESSAGE"]);
    for o in ops {
        t.row(cells(
            with,
            &o.provider,
            vec![
                o.operation_uuid.clone(),
                o.r#type.clone(),
                o.state.clone(),
                or_dash(o.volume_id.as_deref()),
                operation_message(o),
            ],
        ));
    }
    rendered(&t, "no operations")
}

/// The status message, or for a pending operation whose call waits for a retry, why and
/// until when.
fn operation_message(o: &OperationSummary) -> String {
    match (&o.last_error, &o.next_retry) {
        (Some(error), Some(next)) => format!("retrying at {next} after: {error}"),
        (Some(error), None) => format!("retrying after: {error}"),
        (None, _) => or_dash(o.message.as_deref()),
    }
}

fn profiles_text(profiles: &[ProfileSummary]) -> String {
    let mut t = Table::new(&["PROFILE", "TYPE", "FS", "PARAMETERS"]);
    for p in profiles {
        let parameters: Vec<_> = p
            .parameters
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        t.row(vec![
            p.name.clone(),
            p.r#type.clone(),
            or_dash(p.fs_type.as_deref()),
            or_dash(Some(&parameters.join(","))),
        ]);
    }
    rendered(&t, "no profiles")
}

fn plugins_text(plugins: &[PluginHealth]) -> String {
    let mut t = Table::new(&["PROVIDER", "PLUGIN", "CSI", "HEALTHY", "RESTARTS", "ERROR"]);
    for p in plugins {
        t.row(vec![
            p.provider.clone(),
            p.plugin.clone(),
            or_dash(p.csi_version.as_deref()),
            yes_no(p.healthy),
            p.restarts.to_string(),
            or_dash(p.error.as_deref()),
        ]);
    }
    rendered(&t, "no plugins")
}

/// An operation that was started and not waited for.
fn pending_text(op: &OperationSummary) -> String {
    format!(
        "operation {} ({}): {}\n",
        op.operation_uuid, op.r#type, op.state
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_admin_socket_is_in_the_default_state_dir() {
        assert_eq!(
            std::path::Path::new(DEFAULT_ADMIN),
            std::path::Path::new(slrp_provider::config::DEFAULT_STATE_DIR).join("admin.sock")
        );
    }

    #[test]
    fn publish_prints_the_path_last_and_fails_without_one() {
        let mut changed = VolumeChanged {
            volume_id: "vol-1".into(),
            state: "PUBLISHED".into(),
            path: Some("/var/lib/slrp/work/csi/x/mounts/vol-1/target".into()),
        };
        let text = published_text(&changed).unwrap();
        assert_eq!(
            text.lines().last(),
            Some("/var/lib/slrp/work/csi/x/mounts/vol-1/target"),
            "{text}"
        );
        for path in [None, Some(String::new())] {
            changed.path = path;
            let e = published_text(&changed).unwrap_err();
            assert_eq!(e.exit_code(), 1);
            assert!(
                e.to_string()
                    .starts_with("the daemon did not say where vol-1 is published"),
                "{e}"
            );
        }
    }

    #[test]
    fn the_size_shown_is_the_disk_the_daemon_makes() {
        assert_eq!(disk_size_text(1_000_000_000), "954MiB");
        assert_eq!(disk_size_text(64 << 20), "64MiB");
        assert_eq!(disk_size_text((64 << 20) + 1), "65MiB");
        assert_eq!(disk_size_text(1 << 30), "1GiB");
        assert_eq!(disk_size_text(3 << 29), "1536MiB");
        assert_eq!(disk_size_text(1), "1MiB");
    }

    #[test]
    fn a_wait_the_daemon_or_the_client_gave_up_is_exit_5() {
        let limit = Duration::from_secs(7);
        let gateway = CtlError::Daemon {
            status: 504,
            error: "no terminal state within 7 s".into(),
        };
        let e = waited_error(gateway, limit);
        assert_eq!(e.exit_code(), 5);
        assert!(e.to_string().contains("within 7s"), "{e}");
        let silent = CtlError::NoAnswer {
            endpoint: "s".into(),
            after: Duration::from_secs(37),
        };
        assert_eq!(waited_error(silent, limit).exit_code(), 5);
        let conflict = CtlError::Daemon {
            status: 409,
            error: "not enough free space".into(),
        };
        assert_eq!(waited_error(conflict, limit).exit_code(), 1);
    }

    #[test]
    fn an_unknown_volume_says_where_the_volumes_are_listed() {
        let e = volume_hint(
            CtlError::NotFound {
                error: "no disk with id 'v'".into(),
            }
            .into(),
        );
        assert_eq!(exit_code(&e), Some(4));
        assert_eq!(
            e.to_string(),
            "no disk with id 'v'; `slrp ctl volumes` lists the volumes"
        );
        let other = volume_hint(
            CtlError::Daemon {
                status: 409,
                error: "in use".into(),
            }
            .into(),
        );
        assert_eq!(other.to_string(), "in use (HTTP 409)");
    }

    #[test]
    fn ids_stay_one_path_segment() {
        assert_eq!(percent_encode("vol-1_a.b~"), "vol-1_a.b~");
        assert_eq!(percent_encode("a/../b c"), "a%2F..%2Fb%20c");
        assert_eq!(percent_encode(".."), "%2E%2E");
        assert_eq!(percent_encode("é"), "%C3%A9");
    }

    #[test]
    fn one_volume_in_detail() {
        assert_eq!(
            volume_text(&volume("a.b", "v1")),
            "volume:       v1\n\
             provider:     a.b\n\
             state:        PUBLISHED\n\
             type:         mount\n\
             size:         64MiB\n\
             profile:      mount\n\
             staging path: /s\n\
             target path:  /t\n\
             last error:   -\n\
             health:       -\n"
        );
    }

    fn sampled() -> VolumeSummary {
        use slrp_provider::admin::api::{AmountsSummary, UsageSummary, VolumeHealthSummary};
        let mut v = volume("a.b", "v1");
        v.health = Some(VolumeHealthSummary {
            status: "abnormal".into(),
            message: Some("directory /d of volume v1 is missing".into()),
            source: Some("NodeGetVolumeStats".into()),
            usage: Some(UsageSummary {
                bytes: Some(AmountsSummary {
                    total: 64 << 20,
                    available: 48 << 20,
                    used: 16 << 20,
                }),
                inodes: Some(AmountsSummary {
                    total: 100,
                    available: 90,
                    used: 10,
                }),
            }),
            sampled_at: Some("2026-12-03T21:00:00Z".into()),
            age_seconds: Some(12.3),
            error: None,
        });
        v
    }

    #[test]
    fn a_sampled_volume_shows_its_use_health_and_condition() {
        let table = volumes_text(&[sampled()]);
        assert_eq!(
            table,
            "VOLUME  STATE      TYPE   SIZE   PROFILE  PATH  LAST ERROR  USED         HEALTH\n\
             v1      PUBLISHED  mount  64MiB  mount    /t    -           16MiB (25%)  abnormal\n"
        );
        let detail = volume_text(&sampled());
        assert!(
            detail.ends_with(
                "last error:   -\n\
                 health:       abnormal\n\
                 condition:    directory /d of volume v1 is missing (from NodeGetVolumeStats)\n\
                 used:         16MiB (25%)\n\
                 bytes:        16MiB of 64MiB (48MiB available)\n\
                 inodes:       10 of 100 (90 free)\n\
                 sampled:      2026-12-03T21:00:00Z (12s ago)\n\
                 health error: -\n"
            ),
            "{detail}"
        );
    }

    #[test]
    fn no_spinner_off_a_terminal() {
        let p = Progress::start(false, "x");
        assert!(p.0.is_none());
        p.finish();
    }

    fn volume(provider: &str, id: &str) -> VolumeSummary {
        VolumeSummary {
            provider: provider.into(),
            volume_id: id.into(),
            state: "PUBLISHED".into(),
            r#type: Some("mount".into()),
            capacity_bytes: Some(64 << 20),
            profile: Some("mount".into()),
            staging_path: Some("/s".into()),
            target_path: Some("/t".into()),
            last_error: None,
            health: None,
        }
    }

    #[test]
    fn a_provider_column_only_with_several_providers() {
        let one = volumes_text(&[volume("a.b", "v1"), volume("a.b", "v2")]);
        assert_eq!(
            one,
            "VOLUME  STATE      TYPE   SIZE   PROFILE  PATH  LAST ERROR  USED  HEALTH\n\
             v1      PUBLISHED  mount  64MiB  mount    /t    -           -     -\n\
             v2      PUBLISHED  mount  64MiB  mount    /t    -           -     -\n"
        );
        let two = volumes_text(&[volume("a.b", "v1"), volume("a.c", "v2")]);
        assert!(two.starts_with("PROVIDER  VOLUME"), "{two}");
        assert!(two.contains("\na.c       v2"), "{two}");
        assert_eq!(volumes_text(&[]), "no volumes\n");
    }
}
