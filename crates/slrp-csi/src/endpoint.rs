//! Unix socket endpoints: parsing, the `sun_path` limit, and the lazy tonic channel.
//!
//! # The path-length problem
//! `sockaddr_un.sun_path` holds 108 bytes including the terminating NUL, so a socket path
//! of more than [`MAX_SOCKET_PATH`] bytes cannot be passed to `connect(2)` or `bind(2)`.
//! The kernel resolves symlinks in the path *after* the address is copied in, so a short
//! symlink pointing at the long path works for `connect`. Two directions:
//! - connecting to a plugin whose socket has a long path: [`SocketAlias`] makes
//!   `/tmp/slrp-csi-alias-<pid>-<start time>-<random>/endpoint.sock -> <long path>` for
//!   the life of the client;
//! - a plugin that must *bind* under a long directory: the supervisor gives it a short path
//!   and puts a symlink in the long place (see `slrp-supervisor`, as Mesos does).
//!
//! # Stale aliases
//! An alias is removed when its client is dropped, which never happens after a SIGKILL.
//! The alias directory's name therefore records its creator (pid and `/proc` start time,
//! which together survive pid reuse), and [`sweep_stale_aliases`] (run by
//! [`SocketAlias::create`] and by the supervisor at start) removes directories whose
//! creator is gone *and* whose link no longer leads anywhere. It only touches directories
//! that match the name exactly, belong to our user and hold nothing but the link.

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
        let base = std::env::temp_dir();
        sweep_stale_aliases(&base);
        let prefix = match own_identity() {
            Some((pid, start)) => format!("{ALIAS_PREFIX}{pid}-{start}-"),
            // Without a creator the sweep never recognises the directory: a leak after a
            // SIGKILL is better than removing an alias a live client still uses.
            None => {
                tracing::debug!("own start time unknown; alias directory will not be swept");
                "slrp-csi-".to_owned()
            }
        };
        let dir = tempfile::Builder::new()
            .prefix(&prefix)
            .rand_bytes(ALIAS_RANDOM_LEN)
            .tempdir_in(&base)
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

/// Name prefix of alias directories; the full name is
/// `slrp-csi-alias-<creator pid>-<creator start time>-<random>`.
const ALIAS_PREFIX: &str = "slrp-csi-alias-";
/// Length of the random part of an alias directory's name.
const ALIAS_RANDOM_LEN: usize = 6;
/// The one entry of an alias directory.
const ALIAS_LINK: &str = "endpoint.sock";

/// Parses `/proc/<pid>/stat` for `starttime` (field 22). The command name (field 2) may
/// contain spaces and parentheses, so fields are counted from the *last* `)`.
fn parse_start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// Whether a process is still the one that created an alias.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    Alive,
    Gone,
    /// `/proc` could not tell: treated like alive.
    Unknown,
}

fn owner_state(pid: u32, start_time: u64) -> Owner {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(text) => match parse_start_time(&text) {
            // A different start time means the pid was reused: the creator is gone.
            Some(t) if t == start_time => Owner::Alive,
            Some(_) => Owner::Gone,
            None => Owner::Unknown,
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => Owner::Gone,
        Err(_) => Owner::Unknown,
    }
}

/// This process's pid and start time, recorded in the name of the aliases it creates.
fn own_identity() -> Option<(u32, u64)> {
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    Some((std::process::id(), parse_start_time(&text)?))
}

/// Splits an alias directory name into the creator's pid and start time; `None` for
/// anything that does not match the pattern exactly.
fn parse_alias_name(name: &str) -> Option<(u32, u64)> {
    let mut parts = name.strip_prefix(ALIAS_PREFIX)?.split('-');
    let (pid, start, random) = (parts.next()?, parts.next()?, parts.next()?);
    let decimal = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let valid = parts.next().is_none()
        && decimal(pid)
        && decimal(start)
        && random.len() == ALIAS_RANDOM_LEN
        && random.bytes().all(|b| b.is_ascii_alphanumeric());
    if !valid {
        return None;
    }
    let pid: u32 = pid.parse().ok().filter(|p| *p > 0)?;
    Some((pid, start.parse().ok()?))
}

/// Whether `dir` is a stale alias directory: named like ours with a creator that is gone,
/// a real directory owned by `uid`, holding only the `endpoint.sock` symlink, whose target
/// no longer exists.
fn is_stale_alias(dir: &Path, name: &str, uid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some((pid, start_time)) = parse_alias_name(name) else {
        return false;
    };
    let Ok(meta) = std::fs::symlink_metadata(dir) else {
        return false;
    };
    if !meta.is_dir() || meta.uid() != uid {
        return false;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    let mut only_link = false;
    for entry in entries {
        let Ok(entry) = entry else { return false };
        let is_link = entry.file_type().is_ok_and(|t| t.is_symlink());
        if entry.file_name() != ALIAS_LINK || !is_link {
            return false;
        }
        only_link = true;
    }
    if !only_link {
        return false;
    }
    // The target of a live client's alias can be missing for a moment (its plugin is
    // restarting), so a dangling link alone never condemns a directory.
    let dangling = matches!(
        std::fs::metadata(dir.join(ALIAS_LINK)),
        Err(e) if e.kind() == io::ErrorKind::NotFound
    );
    dangling && owner_state(pid, start_time) == Owner::Gone
}

/// Removes alias directories under `base` (normally the system temp directory) left by
/// clients that were killed before they could clean up: see the module docs for what
/// counts as stale. Best effort: anything unreadable or unexpected is left alone.
/// Returns the directories removed.
pub fn sweep_stale_aliases(base: &Path) -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let mut removed = Vec::new();
    // `/proc/self` is owned by our effective uid; only our own user's aliases are ours.
    let Ok(uid) = std::fs::metadata("/proc/self").map(|m| m.uid()) else {
        return removed;
    };
    let Ok(entries) = std::fs::read_dir(base) else {
        return removed;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let dir = entry.path();
        if !is_stale_alias(&dir, name, uid) {
            continue;
        }
        // Link first, then an *empty* directory: never a recursive removal.
        let result =
            std::fs::remove_file(dir.join(ALIAS_LINK)).and_then(|()| std::fs::remove_dir(&dir));
        match result {
            Ok(()) => {
                tracing::info!(dir = %dir.display(), "removed stale CSI socket alias");
                removed.push(dir);
            }
            Err(e) => {
                tracing::debug!(dir = %dir.display(), error = %slrp_types::DisplayChain(&e), "could not remove stale CSI socket alias");
            }
        }
    }
    removed
}

/// A lazily connecting channel to `socket`. Nothing is dialled until the first call;
/// every reconnect dials the path again, so a restarted plugin is found at the same path.
pub(crate) fn lazy_channel(socket: PathBuf) -> Channel {
    // The URI is a placeholder: the connector ignores it and dials the unix socket.
    let endpoint = Endpoint::from_static("http://[::]:50051");
    endpoint.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
        let socket = socket.clone();
        async move {
            UnixStream::connect(socket)
                .await
                .map(TokioIo::new)
                .map_err(ConnectFailed)
        }
    }))
}

/// The socket could not be connected to, so no request went out on this attempt. Its
/// own type so the client can find it in a failed call's source chain and tell "not
/// sent" from "connection lost mid-call".
#[derive(Debug, thiserror::Error)]
#[error("connecting to the plugin socket")]
pub(crate) struct ConnectFailed(#[source] pub(crate) io::Error);

/// Whether `err`'s chain says the connection was never made.
pub(crate) fn is_connect_failure(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(err);
    while let Some(e) = source {
        if e.is::<ConnectFailed>() {
            return true;
        }
        source = e.source();
    }
    false
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
        let name = dir.file_name().unwrap().to_str().unwrap();
        assert_eq!(parse_alias_name(name), own_identity(), "{name}");
        drop(alias);
        assert!(!dir.exists());
    }

    #[test]
    fn alias_names_parse_only_in_the_exact_form() {
        assert_eq!(
            parse_alias_name("slrp-csi-alias-42-123456-aB3xY9"),
            Some((42, 123_456))
        );
        for bad in [
            "slrp-csi-aB3xY9",
            "slrp-csi-alias-42-123456",
            "slrp-csi-alias-42-123456-aB3xY",
            "slrp-csi-alias-42-123456-aB3xY9-x",
            "slrp-csi-alias-0-123456-aB3xY9",
            "slrp-csi-alias--123456-aB3xY9",
            "slrp-csi-alias-+42-123456-aB3xY9",
            "slrp-csi-alias-42-12a456-aB3xY9",
            "slrp-csi-alias-42-123456-aB3.Y9",
            "xslrp-csi-alias-42-123456-aB3xY9",
        ] {
            assert_eq!(parse_alias_name(bad), None, "{bad}");
        }
    }

    /// The pid and start time of a process that has exited and been reaped.
    fn dead_process() -> (u32, u64) {
        let mut child = std::process::Command::new("sleep")
            .arg("1000")
            .spawn()
            .unwrap();
        let pid = child.id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let start = parse_start_time(&stat).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        (pid, start)
    }

    fn make_alias(base: &Path, name: &str, target: &Path) -> PathBuf {
        let dir = base.join(name);
        std::fs::create_dir(&dir).unwrap();
        std::os::unix::fs::symlink(target, dir.join(ALIAS_LINK)).unwrap();
        dir
    }

    #[test]
    fn sweep_removes_only_aliases_of_dead_creators_with_dangling_links() {
        let base = tempfile::tempdir().unwrap();
        let gone = base.path().join("gone.sock");
        let present = base.path().join("present.sock");
        std::fs::write(&present, b"").unwrap();
        let (me, my_start) = own_identity().unwrap();
        let (dead, dead_start) = dead_process();

        let stale = make_alias(
            base.path(),
            &format!("{ALIAS_PREFIX}{dead}-{dead_start}-aaaaaa"),
            &gone,
        );
        // Our pid with another start time: the pid was reused, the creator is gone.
        let reused = make_alias(
            base.path(),
            &format!("{ALIAS_PREFIX}{me}-{}-bbbbbb", my_start + 1),
            &gone,
        );
        let kept = [
            // Live creator, target missing for the moment (its plugin restarting).
            make_alias(
                base.path(),
                &format!("{ALIAS_PREFIX}{me}-{my_start}-cccccc"),
                &gone,
            ),
            // Dead creator, but the target still exists.
            make_alias(
                base.path(),
                &format!("{ALIAS_PREFIX}{dead}-{dead_start}-dddddd"),
                &present,
            ),
            // Not our naming: an old-style alias or a supervisor socket directory.
            make_alias(base.path(), "slrp-csi-eeeeee", &gone),
            make_alias(
                base.path(),
                &format!("{ALIAS_PREFIX}{dead}-{dead_start}-ffffff-x"),
                &gone,
            ),
        ];
        // Looks like ours but holds something else too.
        let crowded = make_alias(
            base.path(),
            &format!("{ALIAS_PREFIX}{dead}-{dead_start}-gggggg"),
            &gone,
        );
        std::fs::write(crowded.join("data"), b"keep me").unwrap();
        // The right name, but the link is a regular file.
        let not_link = base
            .path()
            .join(format!("{ALIAS_PREFIX}{dead}-{dead_start}-hhhhhh"));
        std::fs::create_dir(&not_link).unwrap();
        std::fs::write(not_link.join(ALIAS_LINK), b"").unwrap();
        // The right name on a symlink to a directory, not a directory.
        let elsewhere = tempfile::tempdir().unwrap();
        make_alias(elsewhere.path(), "target", &gone);
        let linked = base
            .path()
            .join(format!("{ALIAS_PREFIX}{dead}-{dead_start}-iiiiii"));
        std::os::unix::fs::symlink(elsewhere.path().join("target"), &linked).unwrap();
        // A real alias of this (live) process, pointing at a long path that does not exist.
        let live =
            SocketAlias::create(&PathBuf::from(format!("/{}/x.sock", "d".repeat(150)))).unwrap();

        let mut removed = sweep_stale_aliases(base.path());
        removed.sort();
        let mut expected = vec![stale.clone(), reused.clone()];
        expected.sort();
        assert_eq!(removed, expected);
        assert!(!stale.exists() && !reused.exists());
        for dir in kept.iter().chain([&crowded, &not_link]) {
            assert!(
                dir.join(ALIAS_LINK).symlink_metadata().is_ok(),
                "{}",
                dir.display()
            );
        }
        assert_eq!(std::fs::read(crowded.join("data")).unwrap(), b"keep me");
        assert!(
            elsewhere
                .path()
                .join("target")
                .join(ALIAS_LINK)
                .symlink_metadata()
                .is_ok()
        );
        assert!(linked.symlink_metadata().is_ok());
        // The sweep of the system temp directory leaves a live alias alone too.
        sweep_stale_aliases(&std::env::temp_dir());
        assert!(live.path().symlink_metadata().is_ok());
    }
}
