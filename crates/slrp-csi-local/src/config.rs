//! Command line and environment (`Args`, no I/O) and the validated [`Config`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use slrp_types::{SizeError, parse_size};

use crate::tool::DEFAULT_TOOL_TIMEOUT;

/// Default root directory for volumes and metadata.
pub const DEFAULT_ROOT: &str = "/var/lib/slrp-csi-local";
/// Name of the pool used when no `--pool` is given and when CreateVolume names none.
pub const DEFAULT_POOL: &str = "default";

/// Which CSI package the plugin serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CsiVersion {
    /// `csi.v1` (CSI 1.x).
    V1,
    /// `csi.v0` (CSI 0.2/0.3), for COs that only speak the old protocol.
    V0,
}

/// Raw command line of `slrp-csi-local`.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "slrp-csi-local",
    version,
    about = "slrp's node-local CSI plugin"
)]
pub struct Args {
    /// Socket to serve on: `unix:///abs/path.sock` or a bare absolute path.
    #[arg(long, env = "CSI_ENDPOINT")]
    pub endpoint: String,
    /// Directory holding volumes and metadata.
    #[arg(long, env = "SLRP_CSI_LOCAL_ROOT", default_value = DEFAULT_ROOT)]
    pub root: PathBuf,
    /// Node id reported by NodeGetInfo (default: the host name).
    #[arg(long)]
    pub node_id: Option<String>,
    /// CSI package to serve.
    #[arg(long, value_enum, default_value = "v1")]
    pub csi_version: CsiVersion,
    /// A storage pool, `NAME=SIZE` (repeatable), e.g. `fast=10GiB`. Without any, one pool
    /// `default` as large as the file system under --root (less its root-reserved blocks),
    /// measured at start.
    #[arg(long = "pool")]
    pub pools: Vec<String>,
    /// Largest volume CreateVolume accepts.
    #[arg(long)]
    pub max_volume_size: Option<String>,
    /// Most volumes staged at once, reported as `max_volumes_per_node` (0 = no limit).
    #[arg(long, default_value_t = 0)]
    pub max_volumes_per_node: u64,
    /// JSON fault-injection rules for tests (off unless given).
    #[arg(long, env = "SLRP_CSI_LOCAL_FAULTS")]
    pub faults_file: Option<PathBuf>,
    /// Longest an external tool (losetup, mkfs, mount, resize2fs, ...) may run before it is
    /// killed and the request fails with DEADLINE_EXCEEDED, e.g. `2m`, `90s` (default 2m).
    #[arg(long, env = "SLRP_CSI_LOCAL_TOOL_TIMEOUT")]
    pub tool_timeout: Option<String>,
    /// Log format on standard error: `text` (colours only on a terminal) or `json` (one
    /// object per line). The filter comes from `SLRP_LOG`, else `RUST_LOG` (default `info`).
    #[arg(
        long,
        value_enum,
        env = slrp_log::FORMAT_VAR,
        default_value_t = slrp_log::LogFormat::Text,
        value_name = "FORMAT"
    )]
    pub log_format: slrp_log::LogFormat,
}

/// Validated plugin configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Socket path (without `unix://`).
    pub endpoint: PathBuf,
    /// Root directory for volumes and metadata.
    pub root: PathBuf,
    /// Node id for NodeGetInfo/NodeGetId.
    pub node_id: String,
    /// Served CSI package.
    pub csi_version: CsiVersion,
    /// Pool name → total bytes. Empty when no `--pool` is given: the plugin then sizes a
    /// pool `default` from the file system under the root when it opens it.
    pub pools: BTreeMap<String, u64>,
    /// Upper bound for a single volume, if any.
    pub max_volume_size: Option<u64>,
    /// Staged-volume limit (0 = none).
    pub max_volumes_per_node: u64,
    /// Fault-injection rules file.
    pub faults_file: Option<PathBuf>,
    /// Bound on one external tool run.
    pub tool_timeout: Duration,
}

/// A configuration value that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The endpoint is not a unix socket path.
    #[error("endpoint {0:?} must be unix:///absolute/path or an absolute path")]
    Endpoint(String),
    /// A size does not parse.
    #[error("{what}: {value:?} is not a size (examples: 10GiB, 512MiB, 1G, 4096)")]
    Size {
        /// Which flag.
        what: &'static str,
        /// The text given.
        value: String,
        /// What is wrong with it.
        #[source]
        source: SizeError,
    },
    /// A `--pool` value is malformed.
    #[error("--pool {0:?} must be NAME=SIZE with a non-empty name")]
    Pool(String),
    /// The same pool is given twice.
    #[error("--pool {0:?} is given more than once")]
    DuplicatePool(String),
    /// The root is not absolute.
    #[error("--root {0:?} must be an absolute path")]
    Root(PathBuf),
    /// The node id is empty or too long.
    #[error("node id {0:?} must be 1 to 128 bytes")]
    NodeId(String),
    /// `--tool-timeout` is not a positive duration.
    #[error("--tool-timeout {0:?} must be a positive duration (examples: 2m, 90s, 500ms)")]
    ToolTimeout(String),
    /// The host name could not be read for the default node id.
    #[error("reading the host name for the default node id")]
    HostName(#[source] nix::Error),
}

/// Strips an optional `unix://` scheme; the rest must be an absolute path.
pub fn parse_endpoint(raw: &str) -> Result<PathBuf, ConfigError> {
    let path = raw.strip_prefix("unix://").unwrap_or(raw);
    let p = PathBuf::from(path);
    if path.is_empty() || !p.is_absolute() || raw.contains("://") && !raw.starts_with("unix://") {
        return Err(ConfigError::Endpoint(raw.to_owned()));
    }
    Ok(p)
}

impl TryFrom<Args> for Config {
    type Error = ConfigError;

    fn try_from(args: Args) -> Result<Self, ConfigError> {
        let endpoint = parse_endpoint(&args.endpoint)?;
        if !args.root.is_absolute() {
            return Err(ConfigError::Root(args.root));
        }
        let mut pools = BTreeMap::new();
        for p in &args.pools {
            let (name, size) = p
                .split_once('=')
                .ok_or_else(|| ConfigError::Pool(p.clone()))?;
            if name.is_empty() {
                return Err(ConfigError::Pool(p.clone()));
            }
            let bytes = parse_size(size).map_err(|source| ConfigError::Size {
                what: "--pool",
                value: size.to_owned(),
                source,
            })?;
            if pools.insert(name.to_owned(), bytes).is_some() {
                return Err(ConfigError::DuplicatePool(name.to_owned()));
            }
        }
        let max_volume_size = args
            .max_volume_size
            .as_deref()
            .map(|s| {
                parse_size(s).map_err(|source| ConfigError::Size {
                    what: "--max-volume-size",
                    value: s.to_owned(),
                    source,
                })
            })
            .transpose()?;
        let node_id = match args.node_id {
            Some(id) => id,
            None => nix::unistd::gethostname()
                .map_err(ConfigError::HostName)?
                .to_string_lossy()
                .into_owned(),
        };
        if node_id.is_empty() || node_id.len() > 128 {
            return Err(ConfigError::NodeId(node_id));
        }
        let tool_timeout = match &args.tool_timeout {
            None => DEFAULT_TOOL_TIMEOUT,
            Some(text) => humantime::parse_duration(text.trim())
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| ConfigError::ToolTimeout(text.clone()))?,
        };
        Ok(Self {
            endpoint,
            root: args.root,
            node_id,
            csi_version: args.csi_version,
            pools,
            max_volume_size,
            max_volumes_per_node: args.max_volumes_per_node,
            faults_file: args.faults_file,
            tool_timeout,
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("10GiB"), Ok(10 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("1G"), Ok(1_000_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size(" 2 kib "), Ok(2048));
        for bad in ["", "GiB", "10XB", "-1", "1e3", "99999999999999999999TiB"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn endpoints_with_and_without_scheme() {
        assert_eq!(
            parse_endpoint("unix:///tmp/x.sock").unwrap(),
            PathBuf::from("/tmp/x.sock")
        );
        assert_eq!(
            parse_endpoint("/tmp/x.sock").unwrap(),
            PathBuf::from("/tmp/x.sock")
        );
        assert!(parse_endpoint("tcp://1.2.3.4:5").is_err());
        assert!(parse_endpoint("unix://rel.sock").is_err());
        assert!(parse_endpoint("").is_err());
    }

    #[test]
    fn defaults_give_one_pool() {
        let args = Args::try_parse_from(["x", "--endpoint", "/s.sock", "--node-id", "n1"]).unwrap();
        let cfg = Config::try_from(args).unwrap();
        assert!(cfg.pools.is_empty(), "the default pool is sized at open");
        assert_eq!(cfg.root, PathBuf::from(DEFAULT_ROOT));
        assert_eq!(cfg.csi_version, CsiVersion::V1);
        assert_eq!(cfg.tool_timeout, DEFAULT_TOOL_TIMEOUT);
    }

    #[test]
    fn tool_timeout_is_a_positive_duration() {
        let parse = |t: &str| {
            let flag = format!("--tool-timeout={t}");
            let argv = [
                "x",
                "--endpoint",
                "/s.sock",
                "--node-id",
                "n",
                flag.as_str(),
            ];
            Config::try_from(Args::try_parse_from(argv).unwrap())
        };
        assert_eq!(parse("90s").unwrap().tool_timeout, Duration::from_secs(90));
        assert_eq!(
            parse("1m 30s").unwrap().tool_timeout,
            Duration::from_secs(90)
        );
        assert_eq!(
            parse("200ms").unwrap().tool_timeout,
            Duration::from_millis(200)
        );
        for bad in ["0s", "soon", "-5s", ""] {
            assert!(
                matches!(parse(bad), Err(ConfigError::ToolTimeout(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn pools_are_validated() {
        let parse = |pools: &[&str]| {
            let mut argv = vec!["x", "--endpoint", "/s.sock", "--node-id", "n"];
            for p in pools {
                argv.extend(["--pool", p]);
            }
            Config::try_from(Args::try_parse_from(argv).unwrap())
        };
        let cfg = parse(&["a=1GiB", "b=512MiB"]).unwrap();
        assert_eq!(cfg.pools.len(), 2);
        assert!(matches!(parse(&["a"]), Err(ConfigError::Pool(_))));
        assert!(matches!(parse(&["=1G"]), Err(ConfigError::Pool(_))));
        assert!(matches!(parse(&["a=lots"]), Err(ConfigError::Size { .. })));
        assert!(matches!(
            parse(&["a=1G", "a=2G"]),
            Err(ConfigError::DuplicatePool(_))
        ));
    }
}
