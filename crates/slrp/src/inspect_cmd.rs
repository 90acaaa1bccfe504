//! `slrp inspect --state-dir DIR [--json]`: a read-only dump of the providers' durable state.
//!
//! `DIR` is either the daemon's state directory, whose providers each have a store at
//! `providers/<type>.<name>/store` (every one is shown), or a single store directory (the
//! one holding `state.db`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;
use slrp_store::inspect::{self, Format, Report};

/// The state directory used when `--state-dir` is not given.
pub(crate) const DEFAULT_STATE_DIR: &str = "/var/lib/slrp";

/// Exit status when the store opened but some records failed verification.
const EXIT_CORRUPT: u8 = 2;

#[derive(Debug, Args)]
pub(crate) struct InspectArgs {
    /// The daemon's state directory (or one provider's store directory, holding `state.db`).
    #[arg(long, env = "SLRP_STATE_DIR", default_value = DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// Print one JSON document instead of a human summary.
    #[arg(long)]
    json: bool,
}

/// The provider stores under a daemon's state directory, by `<type>.<name>`, in name order.
fn provider_stores(state_dir: &Path) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let providers = state_dir.join("providers");
    let entries = match std::fs::read_dir(&providers) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(anyhow::Error::new(e).context(format!("listing {}", providers.display())));
        }
    };
    let mut stores = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("listing {}", providers.display()))?;
        let store = entry.path().join("store");
        if store.is_dir() {
            stores.push((entry.file_name().to_string_lossy().into_owned(), store));
        }
    }
    stores.sort();
    Ok(stores)
}

fn read(dir: &Path) -> anyhow::Result<Report> {
    inspect::inspect(dir).with_context(|| format!("inspecting the state in {}", dir.display()))
}

/// Prints the store(s). Exits 0 when every record verified, 2 when some are corrupt (they
/// are listed, never shown as data), 1 when a store cannot be read at all.
pub(crate) fn run(args: &InspectArgs) -> anyhow::Result<ExitCode> {
    let format = if args.json {
        Format::Json
    } else {
        Format::Human
    };
    let stores = if args.state_dir.join("state.db").exists() {
        Vec::new()
    } else {
        provider_stores(&args.state_dir)?
    };
    let (text, clean) = if stores.is_empty() {
        let report = read(&args.state_dir)?;
        (report.render(format), report.is_clean())
    } else {
        let mut reports = Vec::with_capacity(stores.len());
        for (key, dir) in &stores {
            reports.push((key.as_str(), read(dir)?));
        }
        let clean = reports.iter().all(|(_, r)| r.is_clean());
        let text = match format {
            Format::Json => {
                let providers: serde_json::Map<String, serde_json::Value> = reports
                    .iter()
                    .map(|(key, r)| Ok(((*key).to_owned(), serde_json::to_value(r)?)))
                    .collect::<Result<_, serde_json::Error>>()
                    .context("rendering the reports")?;
                let mut text =
                    serde_json::to_string_pretty(&serde_json::json!({ "providers": providers }))
                        .context("rendering the reports")?;
                text.push('\n');
                text
            }
            Format::Human => reports
                .iter()
                .map(|(key, r)| format!("== resource provider {key}\n{}", r.render(format)))
                .collect::<Vec<_>>()
                .join("\n"),
        };
        (text, clean)
    };
    crate::cli::write_stdout(&text)?;
    Ok(if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_CORRUPT)
    })
}
