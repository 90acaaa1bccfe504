//! One plugin per endpoint: claiming the socket path at start, giving it back at exit.
//!
//! A socket file at the endpoint is either *live* (something accepts connections on it)
//! or *stale* (left by a process that died: connecting is refused). Only a stale one is
//! removed; a live one makes the plugin refuse to start. Anything that accepts a
//! connection counts as live, whether or not it answers gRPC: a plugin that hangs is its
//! supervisor's to kill, and taking its socket over would leave two processes that both
//! believe they serve the endpoint. A listener too busy to accept within
//! [`PROBE_TIMEOUT`] (or with a full backlog) is live as well.
//!
//! At exit the socket is removed only if the path still names the socket this process
//! bound (same device and inode), so an instance that was replaced does not delete its
//! successor's socket. [`Claimed`] keeps a duplicate of the listening socket open until
//! then: a bound socket pins its file's inode, so no newer socket can reuse that inode
//! number while the comparison is made, even after the server has dropped its listener.
//!
//! Races: the check-remove-bind at start and the compare-remove at exit both run under an
//! exclusive `flock` on the socket's directory, held only for those few system calls. Two
//! instances of this plugin therefore never interleave them. What is left: a process that
//! does not take that lock (another program, or a person) can still replace or delete the
//! socket between our check and our bind or unlink.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};
use tokio::net::{UnixListener, UnixStream};

/// How long a connection attempt may take before the listener is taken as live but busy.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Why the endpoint could not be claimed.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// Another process accepts connections on the endpoint.
    #[error("endpoint {path} is in use: another process accepts connections on it (stop it first)")]
    InUse {
        /// The socket path.
        path: PathBuf,
    },
    /// Something other than a socket is at the endpoint path.
    #[error("endpoint {path} exists and is not a socket; refusing to replace it")]
    NotSocket {
        /// The path.
        path: PathBuf,
    },
    /// A system call on the endpoint or its directory failed.
    #[error("{op} endpoint {path}")]
    Io {
        /// What was attempted.
        op: &'static str,
        /// The socket path or its directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> EndpointError + 'a {
    move |source| EndpointError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

/// What is at the endpoint path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Nothing.
    Absent,
    /// A socket nobody listens on.
    Stale,
    /// A socket something accepts connections on.
    Live,
}

/// Finds out whether a listener serves `path`, without sending it anything.
///
/// # Errors
/// The path is not a socket, or inspecting or connecting failed for another reason than
/// "nobody listens".
pub async fn probe(path: &Path) -> Result<Liveness, EndpointError> {
    match std::fs::symlink_metadata(path) {
        Ok(md) if md.file_type().is_socket() => {}
        Ok(_) => {
            return Err(EndpointError::NotSocket {
                path: path.to_owned(),
            });
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Liveness::Absent),
        Err(e) => return Err(io_err("inspecting", path)(e)),
    }
    match tokio::time::timeout(PROBE_TIMEOUT, UnixStream::connect(path)).await {
        Ok(Ok(_)) | Err(_) => Ok(Liveness::Live),
        Ok(Err(e)) => match e.kind() {
            io::ErrorKind::ConnectionRefused => Ok(Liveness::Stale),
            io::ErrorKind::NotFound => Ok(Liveness::Absent),
            // EAGAIN: the listener's backlog is full, so it is alive.
            io::ErrorKind::WouldBlock => Ok(Liveness::Live),
            _ => Err(io_err("probing", path)(e)),
        },
    }
}

/// An exclusive `flock` on the endpoint's directory, serializing claim and release.
struct DirLock {
    _lock: Flock<File>,
}

impl DirLock {
    fn acquire(dir: &Path) -> Result<Self, EndpointError> {
        let file = File::open(dir).map_err(io_err("opening the directory of", dir))?;
        let lock = Flock::lock(file, FlockArg::LockExclusive)
            .map_err(|(_, errno)| io_err("locking the directory of", dir)(errno.into()))?;
        Ok(Self { _lock: lock })
    }

    async fn acquire_async(dir: &Path) -> Result<Self, EndpointError> {
        let owned = dir.to_owned();
        tokio::task::spawn_blocking(move || Self::acquire(&owned))
            .await
            .map_err(|e| io_err("locking the directory of", dir)(io::Error::other(e)))?
    }
}

/// The directory the socket lives in (the current directory for a bare name).
fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// The socket this process bound; [`Claimed::release`] removes it if it is still there.
#[derive(Debug)]
pub struct Claimed {
    path: PathBuf,
    dev: u64,
    ino: u64,
    /// The listening socket, kept open so its inode stays ours until [`Claimed::release`].
    _pin: OwnedFd,
}

/// Binds `path` unless a live listener serves it; a stale socket is replaced.
///
/// # Errors
/// [`EndpointError::InUse`] for a live listener, [`EndpointError::NotSocket`] for another
/// kind of file, [`EndpointError::Io`] otherwise.
pub async fn claim(path: &Path) -> Result<(UnixListener, Claimed), EndpointError> {
    let dir = dir_of(path);
    std::fs::create_dir_all(dir).map_err(io_err("creating the directory of", path))?;
    let _lock = DirLock::acquire_async(dir).await?;
    match probe(path).await? {
        Liveness::Live => {
            return Err(EndpointError::InUse {
                path: path.to_owned(),
            });
        }
        Liveness::Stale => {
            tracing::info!(endpoint = %path.display(), "removing stale socket");
            match std::fs::remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("removing stale", path)(e)),
            }
        }
        Liveness::Absent => {}
    }
    let listener = UnixListener::bind(path).map_err(io_err("binding", path))?;
    let md = std::fs::symlink_metadata(path).map_err(io_err("inspecting", path))?;
    let pin = listener
        .as_fd()
        .try_clone_to_owned()
        .map_err(io_err("duplicating the listener of", path))?;
    Ok((
        listener,
        Claimed {
            path: path.to_owned(),
            dev: md.dev(),
            ino: md.ino(),
            _pin: pin,
        },
    ))
}

impl Claimed {
    /// Removes the socket if the path still names the one this process bound.
    ///
    /// Blocking (it waits for the directory lock). Once it returns, new connections are
    /// refused; connections already accepted are not affected.
    pub fn release(self) {
        let path = &self.path;
        let _lock = match DirLock::acquire(dir_of(path)) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(endpoint = %path.display(), error = %slrp_types::DisplayChain(&e),
                    "could not lock the socket directory; leaving the socket in place");
                return;
            }
        };
        match std::fs::symlink_metadata(path) {
            Ok(md) if md.dev() == self.dev && md.ino() == self.ino => {
                if let Err(e) = std::fs::remove_file(path)
                    && e.kind() != io::ErrorKind::NotFound
                {
                    tracing::warn!(endpoint = %path.display(), error = %slrp_types::DisplayChain(&e), "could not remove socket");
                }
            }
            Ok(_) => tracing::info!(endpoint = %path.display(),
                "the socket was replaced by another process; leaving it in place"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(endpoint = %path.display(), error = %slrp_types::DisplayChain(&e), "could not inspect socket");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn probe_tells_absent_stale_and_live_apart() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("s.sock");
        assert_eq!(probe(&sock).await.unwrap(), Liveness::Absent);
        let live = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        assert_eq!(probe(&sock).await.unwrap(), Liveness::Live);
        drop(live);
        assert_eq!(probe(&sock).await.unwrap(), Liveness::Stale);
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        assert!(matches!(
            probe(&file).await,
            Err(EndpointError::NotSocket { .. })
        ));
    }

    #[tokio::test]
    async fn claim_replaces_stale_refuses_live_and_release_keeps_a_replacement() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("s.sock");
        drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
        let (listener, claimed) = claim(&sock).await.unwrap();
        assert!(matches!(
            claim(&sock).await,
            Err(EndpointError::InUse { .. })
        ));
        // Replaced under us (and our listener already closed, as after the server stops):
        // release must leave the newcomer alone.
        drop(listener);
        std::fs::remove_file(&sock).unwrap();
        let newcomer = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        claimed.release();
        assert!(sock.exists());
        drop(newcomer);
        std::fs::remove_file(&sock).unwrap();
        let (_listener, claimed) = claim(&sock).await.unwrap();
        claimed.release();
        assert!(!sock.exists());
    }
}
