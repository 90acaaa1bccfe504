//! Unix socket endpoints: parsing, the `sun_path` limit, and the lazy tonic channel.
//!
//! # The path-length problem
//! `sockaddr_un.sun_path` holds 108 bytes including the terminating NUL, so a socket path
//! of more than [`MAX_SOCKET_PATH`] bytes cannot be passed to `connect(2)` or `bind(2)`.
//! The kernel resolves symlinks in the path *after* the address is copied in, so a short
//! symlink pointing at the long path works for `connect`. Two directions:
//! - connecting to a plugin whose socket has a long path: [`SocketAlias`] makes
//!   `/tmp/slrp-csi-<random>/endpoint.sock -> <long path>` for the life of the client;
//! - a plugin that must *bind* under a long directory: the supervisor gives it a short path
//!   and puts a symlink in the long place (see `slrp-supervisor`, as Mesos does).

use std::io;
use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::error::CsiError;

/// Longest socket path `connect(2)`/`bind(2)` accept (108-byte `sun_path` minus the NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// A CSI endpoint: an absolute unix socket path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CsiEndpoint {
    path: PathBuf,
}

impl CsiEndpoint {
    /// Parses `unix:///abs/path`, `unix:/abs/path` or a bare absolute path.
    ///
    /// # Errors
    /// [`CsiError::InvalidEndpoint`] for other schemes, relative paths and empty input.
    pub fn parse(s: &str) -> Result<Self, CsiError> {
        let invalid = |reason| CsiError::InvalidEndpoint {
            endpoint: s.to_owned(),
            reason,
        };
        let path = if let Some(rest) = s.strip_prefix("unix://") {
            rest
        } else if let Some(rest) = s.strip_prefix("unix:") {
            rest
        } else if s.contains("://") {
            return Err(invalid("only unix:// endpoints are supported"));
        } else {
            s
        };
        if path.is_empty() {
            return Err(invalid("the socket path is empty"));
        }
        if !path.starts_with('/') {
            return Err(invalid("the socket path must be absolute"));
        }
        if path.contains('\0') {
            return Err(invalid("the socket path contains a NUL byte"));
        }
        Ok(Self {
            path: PathBuf::from(path),
        })
    }

    /// An endpoint for an absolute socket path.
    ///
    /// # Errors
    /// [`CsiError::InvalidEndpoint`] if `path` is relative or not UTF-8.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, CsiError> {
        let p = path.as_ref();
        let s = p.to_str().ok_or_else(|| CsiError::InvalidEndpoint {
            endpoint: p.display().to_string(),
            reason: "the socket path is not UTF-8",
        })?;
        Self::parse(s)
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `unix://<path>`, the form `CSI_ENDPOINT` uses.
    pub fn uri(&self) -> String {
        format!("unix://{}", self.path.display())
    }
}

impl std::fmt::Display for CsiEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unix://{}", self.path.display())
    }
}

/// Whether `path` is too long for `sun_path`.
pub fn is_too_long(path: &Path) -> bool {
    path.as_os_str().len() > MAX_SOCKET_PATH
}

/// A short symlink to a long socket path; removed on drop.
#[derive(Debug)]
pub struct SocketAlias {
    dir: tempfile::TempDir,
    link: PathBuf,
}

impl SocketAlias {
    /// Creates `<tmp>/slrp-csi-<random>/endpoint.sock -> target` under the system temp dir
    /// (`$TMPDIR`, default `/tmp`).
    ///
    /// # Errors
    /// [`CsiError::SocketAlias`] if the directory or symlink cannot be created, or if even
    /// the alias is too long (a very long `$TMPDIR`).
    pub fn create(target: &Path) -> Result<Self, CsiError> {
        let err = |source| CsiError::SocketAlias {
            path: target.to_owned(),
            source,
        };
        let dir = tempfile::Builder::new()
            .prefix("slrp-csi-")
            .tempdir()
            .map_err(err)?;
        let link = dir.path().join("endpoint.sock");
        if is_too_long(&link) {
            return Err(err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the temporary directory path is itself too long for a socket",
            )));
        }
        std::os::unix::fs::symlink(target, &link).map_err(err)?;
        Ok(Self { dir, link })
    }

    /// The short path to connect to.
    pub fn path(&self) -> &Path {
        &self.link
    }

    /// The directory holding the alias.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// A lazily connecting channel to `socket`. Nothing is dialled until the first call;
/// every reconnect dials the path again, so a restarted plugin is found at the same path.
pub(crate) fn lazy_channel(socket: PathBuf) -> Channel {
    // The URI is a placeholder: the connector ignores it and dials the unix socket.
    let endpoint = Endpoint::from_static("http://[::]:50051");
    endpoint.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
        let socket = socket.clone();
        async move { Ok::<_, io::Error>(TokioIo::new(UnixStream::connect(socket).await?)) }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_unix_forms_and_rejects_others() {
        assert_eq!(
            CsiEndpoint::parse("unix:///run/csi.sock").unwrap().path(),
            Path::new("/run/csi.sock")
        );
        assert_eq!(
            CsiEndpoint::parse("unix:/run/csi.sock").unwrap().path(),
            Path::new("/run/csi.sock")
        );
        assert_eq!(
            CsiEndpoint::parse("/run/csi.sock").unwrap().uri(),
            "unix:///run/csi.sock"
        );
        for bad in [
            "tcp://1.2.3.4:5",
            "unix://relative.sock",
            "",
            "unix://",
            "a.sock",
        ] {
            let e = CsiEndpoint::parse(bad).unwrap_err();
            assert!(matches!(e, CsiError::InvalidEndpoint { .. }), "{bad}");
        }
    }

    #[test]
    fn alias_points_at_target_and_is_removed_on_drop() {
        let target = PathBuf::from(format!("/{}/x.sock", "d".repeat(150)));
        assert!(is_too_long(&target));
        let alias = SocketAlias::create(&target).unwrap();
        assert!(!is_too_long(alias.path()));
        assert_eq!(std::fs::read_link(alias.path()).unwrap(), target);
        let dir = alias.dir().to_owned();
        drop(alias);
        assert!(!dir.exists());
    }
}
