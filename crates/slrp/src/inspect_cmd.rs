//! `slrp inspect --state-dir DIR [--json]`: a read-only dump of the provider's durable state.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;
use slrp_store::inspect::{self, Format};

/// The state directory used when `--state-dir` is not given.
pub(crate) const DEFAULT_STATE_DIR: &str = "/var/lib/slrp";

/// Exit status when the store opened but some records failed verification.
const EXIT_CORRUPT: u8 = 2;

#[derive(Debug, Args)]
pub(crate) struct InspectArgs {
    /// The daemon's state directory (it holds `state.db`).
    #[arg(long, env = "SLRP_STATE_DIR", default_value = DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// Print one JSON document instead of a human summary.
    #[arg(long)]
    json: bool,
}

/// Prints the store. Exits 0 when every record verified, 2 when some are corrupt (they are
/// listed, never shown as data), 1 when the store cannot be read at all.
pub(crate) fn run(args: &InspectArgs) -> anyhow::Result<ExitCode> {
    let format = if args.json {
        Format::Json
    } else {
        Format::Human
    };
    let report = inspect::inspect(&args.state_dir)
        .with_context(|| format!("inspecting the state in {}", args.state_dir.display()))?;
    crate::cli::write_stdout(&report.render(format))?;
    Ok(if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_CORRUPT)
    })
}
