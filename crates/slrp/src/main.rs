//! `slrp`: the daemon and operator CLI. Parsing and dispatch only; logic lives in modules.

mod cli;
mod csi_cmd;
mod ctl;
mod daemon_common;
mod import_cmd;
mod inspect_cmd;
mod run_cmd;
mod standalone;

use std::process::ExitCode;

// jemalloc with background purging (docs/benchmarks.md, figure 5).
slrp_provider::use_jemalloc!();

fn main() -> ExitCode {
    cli::main()
}
