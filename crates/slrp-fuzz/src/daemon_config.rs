//! The daemon's TOML configuration (`--config`), as `slrp run` and `slrp standalone` read
//! it: [`DaemonConfigFile::parse`] (what [`DaemonConfigFile::load`] does with the file's
//! text), then [`DaemonConfig::resolve`].
//!
//! Input: the file's text (invalid UTF-8 is what `load`'s `read_to_string` refuses, so
//! it is skipped).
//!
//! The files the configuration names are replaced by files of the target's scratch
//! directory before `resolve` reads any (a token file and an empty provider directory),
//! so the target reads nothing of the host.
//!
//! Properties:
//! - refusals are typed [`ConfigError`](slrp_provider::config::ConfigError)s, never
//!   panics;
//! - every path of a parsed file is absolute (relative ones are rebased on the file's
//!   directory).

use std::path::{Path, PathBuf};

use slrp_provider::config::{DaemonConfig, DaemonConfigFile};

use crate::util::scratch;

/// The target.
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(mut file) = DaemonConfigFile::parse(Path::new("/etc/slrp/slrp.toml"), text) else {
        return;
    };
    let mut paths: Vec<&PathBuf> = [
        &file.work_dir,
        &file.state_dir,
        &file.resource_provider_config_dir,
        &file.agent.token_file,
        &file.agent.ca_file,
        &file.admin.socket,
        &file.admin.token_file,
    ]
    .into_iter()
    .flatten()
    .collect();
    if let Some(p) = &file.profiles {
        paths.extend(p.ca_file.iter().chain(p.state_file.iter()));
    }
    for p in paths {
        assert!(p.is_absolute(), "path {} was not rebased", p.display());
    }

    let dir = scratch();
    let token = dir.path().join("token");
    let providers = dir.path().join("providers");
    std::fs::write(&token, "fuzz-token\n").expect("writing the scratch token");
    std::fs::create_dir(&providers).expect("making the scratch provider directory");
    let here = |p: &mut Option<PathBuf>, to: &Path| {
        if p.is_some() {
            *p = Some(to.to_owned());
        }
    };
    here(&mut file.agent.token_file, &token);
    here(&mut file.agent.ca_file, &token);
    here(&mut file.admin.token_file, &token);
    if let Some(p) = &mut file.profiles {
        here(&mut p.ca_file, &token);
        here(&mut p.state_file, &dir.path().join("profiles.state"));
        if p.uri.as_deref().is_some_and(|u| !u.contains("://")) {
            p.uri = Some(dir.path().join("profiles.json").display().to_string());
        }
    }
    file.resource_provider_config_dir = Some(providers);
    let _ = DaemonConfig::resolve(file);
}
