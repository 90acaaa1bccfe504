//! `slrp import-mesos`: takes a Mesos storage local resource provider's checkpoints over
//! (docs/migrating-from-mesos.md).
//!
//! Exit status: 0 imported (or already imported, or a dry run), 64 for a command line that
//! is wrong, 78 (`EX_CONFIG`) when the import is refused (every reason printed with its
//! file; nothing written) or the configuration is unusable, 1 when a commit failed.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use serde::Serialize;
use slrp_provider::config::{ConfigError, DaemonConfig, DaemonConfigFile, Overrides};
use slrp_provider::import::{self, Committed, ImportOptions, ImportPlan, ImportReport};
use slrp_types::DisplayChain;

use crate::cli::{EX_USAGE, write_stdout};
use crate::daemon_common::EX_CONFIG;

#[derive(Debug, Args)]
pub(crate) struct ImportArgs {
    /// The Mesos agent's work directory (its `--work_dir`), holding the Mesos provider's
    /// checkpoints; also what `slrp run --work-dir` must be afterwards.
    #[arg(long, value_name = "DIR")]
    work_dir: Option<PathBuf>,
    /// One ResourceProviderInfo JSON file per provider (the agent's
    /// `--resource_provider_config_dir`).
    #[arg(long, value_name = "DIR")]
    resource_provider_config_dir: Option<PathBuf>,
    /// slrp's state directory (default `/var/lib/slrp`): the stores written.
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// slrp's TOML config file, as for `slrp run`; flags win.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The agent, to check the agent id against its GET_AGENT answer.
    #[arg(long, value_name = "URL")]
    agent: Option<String>,
    /// A file holding the agent's bearer token.
    #[arg(long, value_name = "FILE", requires = "agent")]
    agent_token_file: Option<PathBuf>,
    /// The agent id the import is for (default: the work directory's `meta/slaves/latest`).
    #[arg(long, value_name = "ID")]
    agent_id: Option<String>,
    /// Import only this provider (`<type>.<name>`).
    #[arg(long, value_name = "TYPE.NAME")]
    provider: Option<String>,
    /// Print what would be imported; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Keep the records of a status stream before a torn or unparseable record (what a
    /// Mesos agent does) instead of refusing.
    #[arg(long)]
    lenient: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// An exit with a message on standard error.
struct Exit(u8, String);

/// The agent URL used only to resolve the configuration when none is given: `import-mesos`
/// needs no agent, `DaemonConfig::resolve` does. Never contacted.
const UNUSED_AGENT: &str = "http://127.0.0.1:5051";

fn configure(args: &ImportArgs) -> Result<(DaemonConfig, bool), Exit> {
    let file = match &args.config {
        Some(path) => DaemonConfigFile::load(path),
        None => Ok(DaemonConfigFile::default()),
    };
    let config_exit = |e: ConfigError| {
        let code = match e {
            ConfigError::NoProviderDir => EX_USAGE,
            _ => EX_CONFIG,
        };
        Exit(code, DisplayChain(&e).to_string())
    };
    let mut file = file.map_err(config_exit)?.apply(Overrides {
        agent: args.agent.clone(),
        agent_token_file: args.agent_token_file.clone(),
        work_dir: args.work_dir.clone(),
        state_dir: args.state_dir.clone(),
        resource_provider_config_dir: args.resource_provider_config_dir.clone(),
        ..Overrides::default()
    });
    if file.work_dir.is_none() {
        return Err(Exit(
            EX_USAGE,
            "--work-dir is required: the Mesos agent's work directory".into(),
        ));
    }
    let has_agent = file.agent.url.is_some();
    if !has_agent {
        file.agent.url = Some(UNUSED_AGENT.to_owned());
    }
    let config = DaemonConfig::resolve(file).map_err(config_exit)?;
    Ok((config, has_agent))
}

/// The result of one provider, as printed.
#[derive(Debug, Serialize)]
struct ProviderOutcome {
    #[serde(flatten)]
    report: ImportReport,
    /// `planned` (dry run), `imported`, `already imported`, `nothing to import`.
    result: String,
}

#[derive(Debug, Serialize)]
struct Output {
    dry_run: bool,
    providers: Vec<ProviderOutcome>,
}

fn print(args: &ImportArgs, output: &Output) -> Result<(), Exit> {
    let text = if args.json {
        serde_json::to_string_pretty(output).map_err(|e| Exit(1, e.to_string()))? + "\n"
    } else {
        let mut text = String::new();
        for p in &output.providers {
            text.push_str(&p.report.to_string());
            text.push_str(&format!("  result:       {}\n", p.result));
        }
        text
    };
    write_stdout(&text).map_err(|e| Exit(1, format!("{e:#}")))
}

async fn import(args: &ImportArgs) -> Result<(), Exit> {
    let (config, has_agent) = configure(args)?;
    let mut providers = config.providers.clone();
    if let Some(wanted) = &args.provider {
        providers.retain(|p| &p.key() == wanted);
        if providers.is_empty() {
            let known: Vec<String> = config.providers.iter().map(|p| p.key()).collect();
            return Err(Exit(
                EX_USAGE,
                format!(
                    "--provider {wanted}: no such provider in the provider directory (there \
                     are: {})",
                    known.join(", ")
                ),
            ));
        }
    }
    let mut agent_id = args.agent_id.clone();
    if has_agent {
        let answered = slrp_agent::get_agent_id(&config.agent).await.map_err(|e| {
            Exit(
                EX_CONFIG,
                format!(
                    "asking the agent {} for its id: {}",
                    config.agent.endpoint,
                    DisplayChain(&e)
                ),
            )
        })?;
        if let Some(given) = &agent_id
            && *given != answered
        {
            return Err(Exit(
                EX_CONFIG,
                format!(
                    "--agent-id {given}, but the agent answers GET_AGENT with id {answered}: \
                     the import would be kept under an identity the agent does not have"
                ),
            ));
        }
        agent_id = Some(answered);
    } else {
        eprintln!(
            "warning: no --agent: the agent id of the work directory is not checked against \
             the running agent; if they differ, `slrp run` starts as a new provider and the \
             volumes come back as pre-existing"
        );
    }
    let opts = ImportOptions {
        agent_id,
        lenient: args.lenient,
        ..ImportOptions::default()
    };
    let work_dir = config.work_dir.clone();
    let mut plans: Vec<(ImportPlan, PathBuf)> = Vec::new();
    let mut refusals = Vec::new();
    for provider in &providers {
        match import::plan(&work_dir, provider, &opts) {
            Ok(plan) => plans.push((plan, config.provider_dir(provider).join("store"))),
            Err(found) => refusals.extend(found),
        }
    }
    if !refusals.is_empty() {
        let mut text = format!(
            "the import is refused ({} reason(s)); nothing was written:\n",
            refusals.len()
        );
        for r in &refusals {
            text.push_str(&format!("  {r}\n"));
        }
        return Err(Exit(EX_CONFIG, text.trim_end().to_owned()));
    }
    if plans.iter().all(|(plan, _)| plan.is_empty()) {
        return Err(Exit(
            EX_CONFIG,
            format!(
                "no Mesos storage local resource provider checkpoint for {} under {}",
                providers
                    .iter()
                    .map(|p| p.key())
                    .collect::<Vec<_>>()
                    .join(", "),
                work_dir.display()
            ),
        ));
    }
    let mut output = Output {
        dry_run: args.dry_run,
        providers: Vec::new(),
    };
    for (plan, store_dir) in &plans {
        let result = if plan.is_empty() {
            "nothing to import".to_owned()
        } else if args.dry_run {
            "planned (dry run: nothing written)".to_owned()
        } else {
            match commit(plan, store_dir.clone()).await {
                Ok(Committed::Imported) => format!("imported into {}", store_dir.display()),
                Ok(Committed::AlreadyImported { imported_at }) => format!(
                    "already imported into {} at {imported_at}; nothing written",
                    store_dir.display()
                ),
                Err(e) => {
                    // What the earlier providers' commits did is printed before failing.
                    print(args, &output)?;
                    let code = if e.is_refusal() { EX_CONFIG } else { 1 };
                    return Err(Exit(
                        code,
                        format!("provider {}: {}", plan.provider(), DisplayChain(&e)),
                    ));
                }
            }
        };
        output.providers.push(ProviderOutcome {
            report: plan.report(),
            result,
        });
    }
    print(args, &output)
}

async fn commit(plan: &ImportPlan, store_dir: PathBuf) -> Result<Committed, import::ImportError> {
    let store = tokio::task::spawn_blocking(move || import::open_store(&store_dir))
        .await
        .unwrap_or_else(|join| std::panic::resume_unwind(join.into_panic()))?;
    let committed = plan.commit(&store).await;
    // Dropping the store joins its writer thread: not on the runtime's thread.
    let _ = tokio::task::spawn_blocking(move || drop(store)).await;
    committed
}

/// Runs the import.
pub(crate) async fn run(args: &ImportArgs) -> anyhow::Result<ExitCode> {
    match import(args).await {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(Exit(code, message)) => {
            eprintln!("error: {message}");
            Ok(ExitCode::from(code))
        }
    }
}
