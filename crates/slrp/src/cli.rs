//! Top-level command line: subcommands, exit codes, error printing.

use std::io::Write;
use std::process::ExitCode;

use clap::{CommandFactory as _, Parser, Subcommand};

use crate::{csi_cmd, ctl, import_cmd, inspect_cmd, run_cmd, standalone};

/// `EX_USAGE` from sysexits.h: the command line was wrong.
pub(crate) const EX_USAGE: u8 = 64;

/// Storage Local Resource Provider.
#[derive(Debug, Parser)]
#[command(name = "slrp", version, about)]
struct Cli {
    /// Log format on standard error: `text` (the default) for people (colours only on a
    /// terminal), `json` for log collectors (one object per line); any case. Without the
    /// flag, `SLRP_LOG_FORMAT` sets it (a value there that is neither warns and falls back
    /// to text). The filter comes from `SLRP_LOG` (else `RUST_LOG`), e.g. `SLRP_LOG=debug`
    /// or `SLRP_LOG=info,slrp_csi=trace`.
    // Not `env = ...`: clap would refuse a bad environment value with exit 64 for every
    // command (`slrp ctl status` included), where a typo in a service file should only cost
    // the format, as a bad `SLRP_LOG` only costs the filter.
    #[arg(
        long,
        global = true,
        value_enum,
        ignore_case = true,
        value_name = "FORMAT"
    )]
    log_format: Option<slrp_log::LogFormat>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print a shell completion script for slrp.
    Completions(ctl::CompletionsArgs),
    /// Talk to a CSI plugin directly (an operator's CSI client).
    Csi(Box<csi_cmd::CsiArgs>),
    /// Query and act on a running slrp through its admin API.
    Ctl(Box<ctl::CtlArgs>),
    /// Take a Mesos storage local resource provider's checkpoints over (its volumes,
    /// mounts, pending operations and unacknowledged statuses), before `slrp run`.
    ImportMesos(Box<import_cmd::ImportArgs>),
    /// Print the provider's durable state, read-only (safe while the daemon runs).
    Inspect(inspect_cmd::InspectArgs),
    /// Print slrp's man page, or write the pages of slrp and every subcommand into a
    /// directory.
    Man(ctl::ManArgs),
    /// Run the resource providers against a Mesos agent (or another manager), in the
    /// foreground, until SIGTERM or SIGINT.
    Run(Box<run_cmd::RunArgs>),
    /// Run the embedded manager and the resource providers in one process, in the
    /// foreground, until SIGTERM or SIGINT; with no flags, a working default (root needed).
    Standalone(Box<standalone::StandaloneArgs>),
}

/// The commands that run once on a single-threaded runtime.
enum OneShot {
    Csi(Box<csi_cmd::CsiArgs>),
    Ctl(Box<ctl::CtlArgs>),
    ImportMesos(Box<import_cmd::ImportArgs>),
    Inspect(inspect_cmd::InspectArgs),
}

/// A command-line error found after parsing (bad size, bad key=value...): exit 64.
#[derive(Debug)]
pub(crate) struct UsageError(pub(crate) String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Writes `text` to standard output. A reader that went away (`| head`) ends the output
/// quietly; any other failure is an error, so that output redirected to a full disk does
/// not look like success to a script.
pub(crate) fn write_stdout(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(anyhow::Error::new(e).context("writing to standard output"))
        }
        Ok(()) | Err(_) => Ok(()),
    }
}

pub(crate) fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { EX_USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    // The daemon tells what it does; the operator commands only what went wrong.
    let default_level = match cli.command {
        Command::Run(_) | Command::Standalone(_) => "info",
        Command::Csi(_)
        | Command::Ctl(_)
        | Command::ImportMesos(_)
        | Command::Inspect(_)
        | Command::Completions(_)
        | Command::Man(_) => "warn",
    };
    let (log_format, bad_format) =
        log_format(cli.log_format, std::env::var(slrp_log::FORMAT_VAR).ok());
    slrp_log::init(log_format, default_level);
    if let Some(value) = bad_format {
        tracing::warn!(
            var = slrp_log::FORMAT_VAR,
            %value,
            "ignoring a log format that is neither `text` nor `json`; using text"
        );
    }
    let command = match cli.command {
        // The daemon builds its own (multi-threaded) runtime, after reading its config.
        Command::Run(args) => return run_cmd::run(&args),
        Command::Standalone(args) => return standalone::run(&args),
        Command::Csi(args) => OneShot::Csi(args),
        Command::Ctl(args) => OneShot::Ctl(args),
        Command::Completions(args) => return report(ctl::completions(Cli::command(), &args)),
        Command::Man(args) => return report(ctl::man(Cli::command(), &args)),
        Command::Inspect(args) => OneShot::Inspect(args),
        Command::ImportMesos(args) => OneShot::ImportMesos(args),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match command {
            OneShot::Csi(args) => csi_cmd::run(*args).await,
            OneShot::Ctl(args) => ctl::run(*args).await,
            OneShot::Inspect(args) => inspect_cmd::run(&args),
            OneShot::ImportMesos(args) => import_cmd::run(&args).await,
        }
    });
    report(result)
}

/// The log format: the flag, else the environment's value (any case; empty is unset), else
/// text. Also returns the environment's value when it was used but named no format.
fn log_format(
    flag: Option<slrp_log::LogFormat>,
    env: Option<String>,
) -> (slrp_log::LogFormat, Option<String>) {
    use clap::ValueEnum as _;
    if let Some(format) = flag {
        return (format, None);
    }
    match env.filter(|v| !v.trim().is_empty()) {
        None => (slrp_log::LogFormat::Text, None),
        Some(value) => match slrp_log::LogFormat::from_str(value.trim(), true) {
            Ok(format) => (format, None),
            Err(_) => (slrp_log::LogFormat::Text, Some(value)),
        },
    }
}

/// The exit code of a command's result, its error printed with the cause chain.
fn report(result: anyhow::Result<ExitCode>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "error: {e:#}");
            if e.downcast_ref::<UsageError>().is_some() {
                ExitCode::from(EX_USAGE)
            } else if let Some(code) = ctl::exit_code(&e) {
                ExitCode::from(code)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use slrp_log::LogFormat;

    use super::*;

    #[test]
    fn the_log_format_flag_takes_any_case_and_a_bad_one_is_a_usage_error() {
        for arg in ["json", "JSON", "Json"] {
            let cli = Cli::try_parse_from(["slrp", "--log-format", arg, "man"]).unwrap();
            assert_eq!(cli.log_format, Some(LogFormat::Json), "{arg}");
        }
        let err = Cli::try_parse_from(["slrp", "--log-format", "yaml", "man"]).unwrap_err();
        assert!(err.use_stderr(), "{err}");
    }

    #[test]
    fn the_environment_sets_the_format_and_a_bad_value_falls_back_to_text() {
        let env = |v: &str| Some(v.to_owned());
        assert_eq!(log_format(None, None), (LogFormat::Text, None));
        assert_eq!(log_format(None, env("")), (LogFormat::Text, None));
        assert_eq!(log_format(None, env("JSON")), (LogFormat::Json, None));
        assert_eq!(log_format(None, env(" json\n")), (LogFormat::Json, None));
        assert_eq!(log_format(None, env("text")), (LogFormat::Text, None));
        assert_eq!(
            log_format(None, env("jsno")),
            (LogFormat::Text, Some("jsno".to_owned()))
        );
        // The flag wins, and then the environment is not looked at.
        assert_eq!(
            log_format(Some(LogFormat::Text), env("json")),
            (LogFormat::Text, None)
        );
        assert_eq!(
            log_format(Some(LogFormat::Json), env("jsno")),
            (LogFormat::Json, None)
        );
    }
}
