//! Crash-safe replacement of a whole file: the one writer behind every file slrp keeps
//! outside its state store (profile state, the registrar, csi-local's records, Mesos
//! checkpoints, the generated standalone configuration, pid and runtime records).
//!
//! # Overview
//! [`write_atomic`] (or an [`AtomicWrite`] with options) replaces a file so that a crash
//! at any moment leaves under its name either the old content or the new one, never a torn
//! or empty file; once it returns `Ok`, the new content also survives a power loss. It
//! takes these steps, each an [`AtomicWriteStep`] that an error names:
//!
//! 1. [`RemoveStaleTemp`](AtomicWriteStep::RemoveStaleTemp): remove the temporary file a
//!    crash mid-write may have left (fixed temporary names only; it holds nothing anyone
//!    needs, since its rename never happened);
//! 2. [`CreateTemp`](AtomicWriteStep::CreateTemp): create the temporary file in the
//!    target's directory (so on the same file system, which the rename needs), exclusively
//!    (`O_EXCL`: never through a symlink or into someone else's file), with the requested
//!    mode from the first byte rather than `chmod`ed after;
//! 3. [`WriteTemp`](AtomicWriteStep::WriteTemp): write the bytes;
//! 4. [`SyncTemp`](AtomicWriteStep::SyncTemp): fsync the temporary file, so the data is on
//!    disk before a name points at it (otherwise ext4 and xfs can show the renamed file
//!    empty after a power loss);
//! 5. [`Rename`](AtomicWriteStep::Rename): `rename(2)` it over the target, which replaces
//!    the directory entry atomically;
//! 6. [`SyncDir`](AtomicWriteStep::SyncDir): fsync the directory, so the rename itself is
//!    durable (until then a power loss can bring back the old file, or none, although the
//!    write returned).
//!
//! # Invariants
//! - Until step 5, the target is untouched: an error before it leaves the old content (or
//!   no file) in place. The temporary file is removed on every error (best effort: if that
//!   fails too, the next write with a fixed name removes it in step 1).
//! - An error in step 6 comes after the rename: the file holds the new content, but whether
//!   that survives a power loss is unknown. Callers treat it as a failed write.
//! - Synchronous `std` I/O only (no tokio): async callers run it in `spawn_blocking`.
//!
//! # Limitations
//! - One writer per file with fixed temporary names: two concurrent writers of the same
//!   file would share `<name>.tmp`. Every caller serializes its writes (one owner per file).
//!   [`AtomicWrite::random_temp_name`] has no such limit.
//! - The directories on the way are not created, nor made durable: a caller that creates
//!   the target's directory first syncs its parent itself if it needs that.
//! - [`AtomicWrite::durable`]`(false)` skips both fsyncs: atomic against a crash of the
//!   process, not of the machine. It is for files a host crash makes meaningless anyway (the
//!   runtime records of processes, which die with the host) and for what Mesos itself writes
//!   without syncing.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use rand::Rng as _;
use rand::distr::Alphanumeric;

/// Suffix of a fixed temporary name: `<file name>.tmp` beside the target.
pub const TEMP_SUFFIX: &str = ".tmp";

/// Characters of a random temporary name, as `mkstemp`'s `XXXXXX`.
const RANDOM_NAME_LEN: usize = 6;

/// Random names tried before giving up on creating a temporary file (each collision needs
/// a file of that name to exist already; `tempfile` and glibc try far more, but a
/// directory with that many six-character leftovers has a problem of its own).
const RANDOM_NAME_ATTEMPTS: u32 = 100;

/// Replaces the file at `path` with `bytes`, crash-safely and durably, with the defaults of
/// [`AtomicWrite::new`]: temporary file `<name>.tmp`, default mode (`0o666` less the
/// umask), both fsyncs. See the [module docs](self) for the steps and guarantees.
///
/// # Errors
/// [`AtomicWriteError`] naming the step that failed, the path it acted on and the OS
/// error. Unless the step is [`AtomicWriteStep::SyncDir`], the target was not changed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), AtomicWriteError> {
    AtomicWrite::new().write(path, bytes)
}

/// Options of a crash-safe file replacement; [`AtomicWrite::write`] does it.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = std::env::temp_dir().join(format!("slrp-types-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir)?;
/// use slrp_types::AtomicWrite;
///
/// // A record holding secrets: owner-only from its first byte.
/// AtomicWrite::new().mode(0o600).write(&dir.join("record.json"), b"{}")?;
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct AtomicWrite {
    /// Permission bits of the new file (before the umask); `None`: `0o666`, as
    /// `File::create`.
    mode: Option<u32>,
    /// Whether to fsync the file before the rename and the directory after it.
    durable: bool,
    /// Whether the temporary file gets a random `mkstemp`-style name instead of
    /// `<name>.tmp`.
    random_temp_name: bool,
}

impl Default for AtomicWrite {
    fn default() -> Self {
        Self::new()
    }
}

impl AtomicWrite {
    /// Durable, temporary file `<name>.tmp` (a stale one is removed first), default mode.
    pub const fn new() -> Self {
        Self {
            mode: None,
            durable: true,
            random_temp_name: false,
        }
    }

    /// Creates the file with these permission bits (less the umask, as `open(2)` does),
    /// e.g. `0o600` for a file holding secrets. The temporary file has them from its
    /// creation, so the content is never readable with wider ones.
    pub const fn mode(self, mode: u32) -> Self {
        Self {
            mode: Some(mode),
            ..self
        }
    }

    /// With `false`, neither the file nor the directory is fsynced: the replacement is
    /// still atomic for readers and against a crash of the process, but a power loss can
    /// lose it (see the module's Limitations).
    pub const fn durable(self, durable: bool) -> Self {
        Self { durable, ..self }
    }

    /// Names the temporary file with six random alphanumerics in the target's directory,
    /// as Mesos's `slave::state::checkpoint` does (`mkstemp` with `XXXXXX`), instead of
    /// `<name>.tmp`. For files in Mesos's layout, whose readers skip such leftovers; a
    /// crash leaves the leftover in place (nothing removes it later).
    pub const fn random_temp_name(self) -> Self {
        Self {
            random_temp_name: true,
            ..self
        }
    }

    /// Replaces the file at `path` with `bytes` (see the [module docs](self)).
    ///
    /// # Errors
    /// [`AtomicWriteError`] naming the step that failed; unless it is
    /// [`AtomicWriteStep::SyncDir`], the target was not changed. A `path` without a file
    /// name (`/`, `..`) fails in [`AtomicWriteStep::CreateTemp`] with
    /// [`io::ErrorKind::InvalidInput`].
    pub fn write(&self, path: &Path, bytes: &[u8]) -> Result<(), AtomicWriteError> {
        self.write_with(path, bytes, &mut |_, _| Ok(()))
    }

    /// [`AtomicWrite::write`], calling `before(step, path)` before each step and failing
    /// that step with its error: the seam the tests use to record the steps and to fail
    /// each one. [`AtomicWrite::write`] passes a closure that does nothing.
    fn write_with(
        &self,
        path: &Path,
        bytes: &[u8],
        before: &mut impl FnMut(AtomicWriteStep, &Path) -> io::Result<()>,
    ) -> Result<(), AtomicWriteError> {
        let dir = parent_dir(path);
        let (temp, file) = self.create_temp(path, dir, before)?;
        let replaced = self.fill(file, &temp, bytes, before).and_then(|()| {
            run(AtomicWriteStep::Rename, path, before, || {
                fs::rename(&temp, path)
            })
        });
        if let Err(e) = replaced {
            // Best effort: the error that matters is the one being returned, and a fixed
            // name's leftover is removed by the next write (step 1).
            let _ = fs::remove_file(&temp);
            return Err(e);
        }
        if self.durable {
            run(AtomicWriteStep::SyncDir, dir, before, || sync_dir(dir))?;
        }
        Ok(())
    }

    /// Steps 1 and 2: the temporary file's path and the open file.
    fn create_temp(
        &self,
        path: &Path,
        dir: &Path,
        before: &mut impl FnMut(AtomicWriteStep, &Path) -> io::Result<()>,
    ) -> Result<(PathBuf, File), AtomicWriteError> {
        let Some(name) = path.file_name() else {
            return Err(AtomicWriteError {
                step: AtomicWriteStep::CreateTemp,
                path: path.to_owned(),
                source: io::Error::new(io::ErrorKind::InvalidInput, "the path has no file name"),
            });
        };
        if !self.random_temp_name {
            let mut temp_name = name.to_owned();
            temp_name.push(TEMP_SUFFIX);
            let temp = path.with_file_name(temp_name);
            run(
                AtomicWriteStep::RemoveStaleTemp,
                &temp,
                before,
                || match fs::remove_file(&temp) {
                    Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                    other => other,
                },
            )?;
            let file = run(AtomicWriteStep::CreateTemp, &temp, before, || {
                self.open_new(&temp)
            })?;
            return Ok((temp, file));
        }
        let mut attempts = 0;
        loop {
            let temp = dir.join(random_name());
            match run(AtomicWriteStep::CreateTemp, &temp, before, || {
                self.open_new(&temp)
            }) {
                Err(e)
                    if e.source.kind() == io::ErrorKind::AlreadyExists
                        && attempts + 1 < RANDOM_NAME_ATTEMPTS =>
                {
                    attempts += 1;
                }
                created => return created.map(|file| (temp, file)),
            }
        }
    }

    fn open_new(&self, temp: &Path) -> io::Result<File> {
        let mut options = OpenOptions::new();
        options.write(true).create_new(true);
        if let Some(mode) = self.mode {
            options.mode(mode);
        }
        options.open(temp)
    }

    /// Steps 3 and 4; closes the file.
    fn fill(
        &self,
        mut file: File,
        temp: &Path,
        bytes: &[u8],
        before: &mut impl FnMut(AtomicWriteStep, &Path) -> io::Result<()>,
    ) -> Result<(), AtomicWriteError> {
        run(AtomicWriteStep::WriteTemp, temp, before, || {
            file.write_all(bytes)
        })?;
        if self.durable {
            run(AtomicWriteStep::SyncTemp, temp, before, || file.sync_all())?;
        }
        Ok(())
    }
}

/// Makes the changes of entries in `dir` (a create, rename or unlink) durable: fsync of the
/// directory itself.
///
/// # Errors
/// The OS error opening or syncing `dir`.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The directory holding `path`'s entry: its parent, or `.` for a bare file name.
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

fn random_name() -> String {
    rand::rng()
        .sample_iter(Alphanumeric)
        .take(RANDOM_NAME_LEN)
        .map(char::from)
        .collect()
}

/// Runs one step after `before` allows it, naming the step and `path` in its error.
fn run<T>(
    step: AtomicWriteStep,
    path: &Path,
    before: &mut impl FnMut(AtomicWriteStep, &Path) -> io::Result<()>,
    op: impl FnOnce() -> io::Result<T>,
) -> Result<T, AtomicWriteError> {
    before(step, path)
        .and_then(|()| op())
        .map_err(|source| AtomicWriteError {
            step,
            path: path.to_owned(),
            source,
        })
}

/// A step of a crash-safe write, in order (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AtomicWriteStep {
    /// Removing the temporary file a crash left (fixed names only).
    RemoveStaleTemp,
    /// Creating the temporary file.
    CreateTemp,
    /// Writing the bytes to the temporary file.
    WriteTemp,
    /// Fsyncing the temporary file (durable writes only).
    SyncTemp,
    /// Renaming the temporary file over the target.
    Rename,
    /// Fsyncing the directory after the rename (durable writes only).
    SyncDir,
}

impl AtomicWriteStep {
    /// What the step does, as the start of a message that goes on with the path it acted
    /// on ([`AtomicWriteError::path`]): `"renaming the temporary file over"`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::RemoveStaleTemp => "removing the stale temporary file",
            Self::CreateTemp => "creating the temporary file",
            Self::WriteTemp => "writing the temporary file",
            Self::SyncTemp => "syncing the temporary file",
            Self::Rename => "renaming the temporary file over",
            Self::SyncDir => "syncing the directory",
        }
    }
}

impl fmt::Display for AtomicWriteStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A crash-safe write failed. `Display` names the step and its path; the OS error is the
/// `source()`. Callers with an error type of their own map the three fields into it, or
/// turn it into an [`io::Error`] (which keeps the kind and this error as its message).
#[derive(Debug, thiserror::Error)]
#[error("{step} {}", .path.display())]
pub struct AtomicWriteError {
    /// The step that failed.
    pub step: AtomicWriteStep,
    /// What it acted on: the temporary file (steps 1 to 4), the target ([`Rename`]) or the
    /// directory ([`SyncDir`]).
    ///
    /// [`Rename`]: AtomicWriteStep::Rename
    /// [`SyncDir`]: AtomicWriteStep::SyncDir
    pub path: PathBuf,
    /// The OS error.
    #[source]
    pub source: io::Error,
}

impl From<AtomicWriteError> for io::Error {
    /// Same kind as the OS error; the message names the step and path, and `source()` is
    /// still the OS error, so a chain prints both once.
    fn from(e: AtomicWriteError) -> Self {
        Self::new(e.source.kind(), e)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    use AtomicWriteStep::{CreateTemp, RemoveStaleTemp, Rename, SyncDir, SyncTemp, WriteTemp};

    /// The names in `dir`, sorted.
    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    /// Writes with `options`, recording each step and the path it acts on.
    fn recorded(
        options: AtomicWrite,
        path: &Path,
        bytes: &[u8],
    ) -> (
        Result<(), AtomicWriteError>,
        Vec<(AtomicWriteStep, PathBuf)>,
    ) {
        let mut steps = Vec::new();
        let result = options.write_with(path, bytes, &mut |step, p| {
            steps.push((step, p.to_owned()));
            Ok(())
        });
        (result, steps)
    }

    /// Writes with `options`, failing `failing` with an injected error before it acts.
    fn failing_at(
        options: AtomicWrite,
        path: &Path,
        bytes: &[u8],
        failing: AtomicWriteStep,
    ) -> Result<(), AtomicWriteError> {
        options.write_with(path, bytes, &mut |step, _| {
            if step == failing {
                Err(io::Error::other("injected"))
            } else {
                Ok(())
            }
        })
    }

    #[test]
    fn writes_a_new_file_in_six_steps_ending_with_the_directory_sync() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.json");
        let temp = dir.path().join("a.json.tmp");
        let (result, steps) = recorded(AtomicWrite::new(), &path, b"new");
        result.unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new");
        assert_eq!(names(dir.path()), ["a.json"], "no temporary file is left");
        assert_eq!(
            steps,
            [
                (RemoveStaleTemp, temp.clone()),
                (CreateTemp, temp.clone()),
                (WriteTemp, temp.clone()),
                (SyncTemp, temp),
                (Rename, path),
                // The rename is durable only once its directory is.
                (SyncDir, dir.path().to_owned()),
            ]
        );
    }

    #[test]
    fn replaces_the_content_of_an_existing_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        write_atomic(&path, b"old content, longer than the new").unwrap();
        write_atomic(&path, b"new").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new");
        assert_eq!(names(dir.path()), ["state"]);
    }

    #[test]
    fn a_stale_temporary_file_of_a_crash_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let temp = dir.path().join("state.tmp");
        fs::write(&temp, b"half a record").unwrap();
        fs::set_permissions(&temp, fs::Permissions::from_mode(0o644)).unwrap();
        AtomicWrite::new()
            .mode(0o600)
            .write(&path, b"whole")
            .unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"whole");
        assert_eq!(names(dir.path()), ["state"]);
        // Not the leftover reused with its wider mode: a new file.
        let mode = fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    }

    #[test]
    fn a_failure_before_the_rename_leaves_the_old_content_and_no_temporary_file() {
        let fixed = [RemoveStaleTemp, CreateTemp, WriteTemp, SyncTemp, Rename];
        let random = [CreateTemp, WriteTemp, SyncTemp, Rename];
        let cases = [
            (AtomicWrite::new(), &fixed[..]),
            (AtomicWrite::new().random_temp_name(), &random[..]),
        ];
        for (options, steps) in cases {
            for &step in steps {
                let dir = tempfile::tempdir().unwrap();
                let path = dir.path().join("state");
                write_atomic(&path, b"old").unwrap();
                let e = failing_at(options, &path, b"new", step).unwrap_err();
                assert_eq!((e.step, e.source.to_string()), (step, "injected".into()));
                assert_eq!(fs::read(&path).unwrap(), b"old", "{options:?} {step:?}");
                assert_eq!(names(dir.path()), ["state"], "{options:?} {step:?}");
            }
        }
    }

    #[test]
    fn a_real_rename_failure_removes_the_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        // A non-empty directory cannot be renamed over.
        let path = dir.path().join("taken");
        fs::create_dir(&path).unwrap();
        fs::write(path.join("inside"), b"kept").unwrap();
        let e = write_atomic(&path, b"new").unwrap_err();
        assert_eq!(e.step, Rename);
        assert_eq!(e.path, path);
        assert_eq!(names(dir.path()), ["taken"]);
        assert_eq!(fs::read(path.join("inside")).unwrap(), b"kept");
    }

    #[test]
    fn a_failed_directory_sync_is_reported_after_the_rename() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        write_atomic(&path, b"old").unwrap();
        let e = failing_at(AtomicWrite::new(), &path, b"new", SyncDir).unwrap_err();
        assert_eq!(e.step, SyncDir);
        assert_eq!(e.path, dir.path());
        // The documented exception: the new content is in place, its durability unknown.
        assert_eq!(fs::read(&path).unwrap(), b"new");
        assert_eq!(names(dir.path()), ["state"]);
    }

    #[test]
    fn without_durability_nothing_is_synced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let (result, steps) = recorded(AtomicWrite::new().durable(false), &path, b"x");
        result.unwrap();
        let steps: Vec<_> = steps.into_iter().map(|(step, _)| step).collect();
        assert_eq!(steps, [RemoveStaleTemp, CreateTemp, WriteTemp, Rename]);
        assert_eq!(fs::read(&path).unwrap(), b"x");
    }

    #[test]
    fn the_mode_holds_from_the_temporary_file_s_creation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        let mut temp_modes = Vec::new();
        AtomicWrite::new()
            .mode(0o600)
            .write_with(&path, b"s3cret", &mut |step, p| {
                if step == WriteTemp {
                    temp_modes.push(fs::metadata(p)?.permissions().mode() & 0o777);
                }
                Ok(())
            })
            .unwrap();
        assert_eq!(temp_modes, [0o600], "before a byte is written");
        let mode = fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    }

    #[test]
    fn random_temporary_names_are_six_alphanumerics_beside_the_target() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("volume.state");
        let (result, steps) = recorded(AtomicWrite::new().random_temp_name(), &path, b"x");
        result.unwrap();
        let (step, temp) = &steps[0];
        assert_eq!(*step, CreateTemp, "no stale file to remove: {steps:?}");
        assert_eq!(temp.parent(), Some(dir.path()));
        let name = temp.file_name().unwrap().to_str().unwrap();
        assert!(
            name.len() == 6 && name.bytes().all(|b| b.is_ascii_alphanumeric()),
            "{name}"
        );
        assert_eq!(steps.last().unwrap(), &(SyncDir, dir.path().to_owned()));
        assert_eq!(names(dir.path()), ["volume.state"]);
    }

    #[test]
    fn a_colliding_random_name_is_retried() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let mut collisions = 2;
        AtomicWrite::new()
            .random_temp_name()
            .write_with(&path, b"x", &mut |step, _| {
                if step == CreateTemp && collisions > 0 {
                    collisions -= 1;
                    return Err(io::ErrorKind::AlreadyExists.into());
                }
                Ok(())
            })
            .unwrap();
        assert_eq!(collisions, 0);
        assert_eq!(fs::read(&path).unwrap(), b"x");
    }

    #[test]
    fn a_bare_file_name_lives_in_the_current_directory_and_a_path_needs_a_name() {
        assert_eq!(parent_dir(Path::new("state")), Path::new("."));
        assert_eq!(parent_dir(Path::new("/a/state")), Path::new("/a"));
        for nameless in ["/", "a/.."] {
            let e = write_atomic(Path::new(nameless), b"x").unwrap_err();
            assert_eq!(e.step, CreateTemp);
            assert_eq!(e.source.kind(), io::ErrorKind::InvalidInput);
        }
    }

    #[test]
    fn as_an_io_error_it_keeps_the_kind_and_prints_step_path_and_cause_once() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no/such/dir/state");
        let e = io::Error::from(write_atomic(&missing, b"x").unwrap_err());
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        let chain = crate::DisplayChain(&e).to_string();
        let temp = missing.with_file_name("state.tmp");
        let want = format!("creating the temporary file {}: ", temp.display());
        assert!(chain.starts_with(&want), "{chain}");
        assert_eq!(chain.matches("No such file").count(), 1, "{chain}");
    }
}
