//! `slrp completions` and `slrp man`: shell completions and man pages generated from the
//! clap definition, so that they never disagree with the commands.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

use crate::cli::write_stdout;

/// `slrp completions` arguments.
#[derive(Debug, Args)]
pub(crate) struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

/// `slrp man` arguments.
#[derive(Debug, Args)]
pub(crate) struct ManArgs {
    /// Write `slrp.1` and one page per subcommand (`slrp-ctl.1`, `slrp-ctl-status.1`, …)
    /// into DIR (created if missing) instead of printing `slrp.1`.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// Prints the completion script of `cmd` for the shell.
pub(crate) fn completions(
    mut cmd: clap::Command,
    args: &CompletionsArgs,
) -> anyhow::Result<ExitCode> {
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "slrp", &mut script);
    write_stdout(&String::from_utf8_lossy(&script))?;
    Ok(ExitCode::SUCCESS)
}

/// Prints `cmd`'s man page, or writes every page into `--dir` and lists the files.
pub(crate) fn man(cmd: clap::Command, args: &ManArgs) -> anyhow::Result<ExitCode> {
    // As clap_mangen does for its own `generate_to`: `help` is not a page, and building
    // gives every subcommand its full name (`slrp-ctl-status`).
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    match &args.dir {
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(cmd)
                .render(&mut page)
                .context("rendering the man page")?;
            write_stdout(&String::from_utf8_lossy(&page))?;
        }
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            let mut written = Vec::new();
            write_pages(&cmd, dir, &mut written)?;
            let list: String = written
                .iter()
                .map(|p| format!("{}\n", p.display()))
                .collect();
            write_stdout(&list)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The page of `cmd`, then those of its visible subcommands, depth first.
fn write_pages(cmd: &clap::Command, dir: &Path, written: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let page = clap_mangen::Man::new(cmd.clone());
    let path = page
        .generate_to(dir)
        .with_context(|| format!("writing {} into {}", page.get_filename(), dir.display()))?;
    written.push(path);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub, dir, written)?;
    }
    Ok(())
}
