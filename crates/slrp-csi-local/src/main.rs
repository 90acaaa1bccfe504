//! `slrp-csi-local`: parse, configure, serve until SIGTERM/SIGINT.

use std::process::ExitCode;

use clap::Parser;
use slrp_csi_local::{Args, Config};

/// sysexits' EX_USAGE: the command line or environment is wrong.
const EX_USAGE: u8 = 64;

fn main() -> ExitCode {
    let args = Args::parse();
    slrp_log::init(args.log_format, "info");
    let config = match Config::try_from(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("slrp-csi-local: {:#}", anyhow::Error::from(e));
            return ExitCode::from(EX_USAGE);
        }
    };
    match run(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "slrp-csi-local failed");
            ExitCode::FAILURE
        }
    }
}

fn run(config: Config) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let shutdown = slrp_csi_local::shutdown_signal()?;
        slrp_csi_local::serve(config, shutdown).await?;
        Ok(())
    })
}
