//! The host operations the plugin needs (mounts, loop devices, file systems, copies of
//! volume data), behind the [`Host`] trait so the volume logic can be unit tested without
//! root.
//!
//! [`RealHost`] uses `mount(2)`/`umount2(2)` through nix for bind mounts, [`crate::copy`]
//! for data copies, and the standard tools for the rest: `losetup`, `blkid`, `mkfs.<fs>`,
//! `mount`, `resize2fs`, `e2fsck`, `xfs_growfs`, `fsfreeze`, each run through a
//! [`ToolRunner`] with a timeout (see [`crate::tool`]).
//! Mount points are read from `/proc/self/mountinfo`, never guessed from the directory.

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::mount::{MntFlags, MsFlags};

use crate::copy::{self, CopyMethod};
use crate::tool::ToolRunner;

/// A failed host operation, with the evidence needed to debug it.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A system call failed.
    #[error("{op} {path}")]
    Io {
        /// The call.
        op: &'static str,
        /// Its path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A tool could not be started.
    #[error("running {program}")]
    Spawn {
        /// The tool.
        program: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A tool exited unsuccessfully.
    #[error("{command} exited with {status}: {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// The tail of its standard error.
        stderr: String,
    },
    /// A tool did not finish within the tool timeout; it was killed with its process group.
    /// (Boxed: this error travels inside every `VolumeError`.)
    #[error(
        "{} did not finish within {:?} and was killed; stderr: {}",
        .0.command,
        .0.after,
        .0.stderr
    )]
    Timeout(Box<ToolTimeout>),
    /// Waiting for a tool or reading its output failed.
    #[error("waiting for {command}")]
    Wait {
        /// The command line.
        command: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A tool printed something unexpected.
    #[error("unexpected output from {command}: {output:?}")]
    Output {
        /// The command line.
        command: String,
        /// What it printed.
        output: String,
    },
    /// The file system mounted at a path is not the one on the device it should be on, so
    /// it is not frozen (freezing whatever else is mounted there, e.g. the host's own file
    /// system, would stop the host's writers).
    #[error("the file system at {mount_point} is not the one on {device}; not freezing it")]
    NotOnDevice {
        /// The path.
        mount_point: PathBuf,
        /// The device expected there.
        device: PathBuf,
    },
}

/// The evidence of a tool that timed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolTimeout {
    /// The command line.
    pub command: String,
    /// The timeout.
    pub after: Duration,
    /// The tail of what it wrote to standard error before it was killed.
    pub stderr: String,
}

/// File system statistics of a mounted path (`statvfs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FsStats {
    /// Total bytes.
    pub total_bytes: u64,
    /// Bytes available to unprivileged users.
    pub available_bytes: u64,
    /// Bytes in use.
    pub used_bytes: u64,
    /// Total inodes.
    pub total_inodes: u64,
    /// Free inodes.
    pub free_inodes: u64,
}

/// Host operations used by the volume logic. All methods block.
pub trait Host: Send + Sync + 'static {
    /// Bind-mounts `source` onto `target`, then remounts read-only if `readonly`.
    fn bind_mount(&self, source: &Path, target: &Path, readonly: bool) -> Result<(), HostError>;
    /// Mounts the file system on `device` at `target`.
    fn mount_fs(
        &self,
        device: &Path,
        target: &Path,
        fs_type: Option<&str>,
        options: &[String],
    ) -> Result<(), HostError>;
    /// Unmounts every mount stacked on `target`; succeeds if nothing is mounted there.
    fn unmount_all(&self, target: &Path) -> Result<(), HostError>;
    /// Whether something is mounted exactly at `path`.
    fn is_mount_point(&self, path: &Path) -> Result<bool, HostError>;
    /// Loop devices currently backed by `file`, except those already being detached
    /// (AUTOCLEAR set): such a device disappears at its last close, so reusing it for a
    /// stage could hand mkfs or mount a device that is gone a moment later.
    fn loop_devices_of(&self, file: &Path) -> Result<Vec<PathBuf>, HostError>;
    /// Attaches `file` to a free loop device and returns the device.
    fn loop_attach(&self, file: &Path) -> Result<PathBuf, HostError>;
    /// Detaches a loop device.
    fn loop_detach(&self, device: &Path) -> Result<(), HostError>;
    /// Makes a loop device pick up the new size of its file.
    fn loop_refresh_size(&self, device: &Path) -> Result<(), HostError>;
    /// The file system type found on `device`, if any.
    fn probe_fs(&self, device: &Path) -> Result<Option<String>, HostError>;
    /// Creates a file system on `device`. With `force`, a file system signature already on
    /// the device does not stop the tool (used only to redo an interrupted mkfs of our own).
    fn mkfs(&self, device: &Path, fs_type: &str, force: bool) -> Result<(), HostError>;
    /// Grows the file system on `device`, mounted at `mount_point`, to the device size.
    fn grow_fs(&self, device: &Path, mount_point: &Path, fs_type: &str) -> Result<(), HostError>;
    /// `statvfs` of a path.
    fn fs_stats(&self, path: &Path) -> Result<FsStats, HostError>;
    /// Whether `mkfs.<fs_type>` is installed.
    fn has_mkfs(&self, fs_type: &str) -> bool;
    /// Grows the file system on `device`, which is not mounted, to the device size. Only
    /// ext2/3/4 can grow unmounted (`e2fsck -f -p`, which `resize2fs` demands first, then
    /// `resize2fs`); unlike online growth this needs no CAP_SYS_RESOURCE.
    fn grow_fs_offline(&self, device: &Path, fs_type: &str) -> Result<(), HostError>;
    /// Copies the image file `source` to `dest` (which must not exist) and makes the copy
    /// durable: a reflink where the file system shares blocks, else a copy that keeps the
    /// image sparse (see [`crate::copy`]). `progress` is called as data is written.
    fn copy_image(
        &self,
        source: &Path,
        dest: &Path,
        progress: &mut dyn FnMut(),
    ) -> Result<CopyMethod, HostError>;
    /// Copies the directory tree `source` to `dest` (which must not exist) and makes the
    /// copy durable (see [`crate::copy`] for what is kept). `progress` is called as entries
    /// and data are written.
    fn copy_tree(
        &self,
        source: &Path,
        dest: &Path,
        progress: &mut dyn FnMut(),
    ) -> Result<CopyMethod, HostError>;
    /// Freezes the file system of `device` mounted at `mount_point` (`fsfreeze -f`): its
    /// dirty data reaches the device and new writes block until [`Host::thaw_fs`], so a
    /// copy of the device sees a consistent file system. Refuses
    /// ([`HostError::NotOnDevice`]) unless the file system at `mount_point` is the one on
    /// `device`.
    fn freeze_fs(&self, device: &Path, mount_point: &Path) -> Result<(), HostError>;
    /// Thaws the file system mounted at `mount_point` (`fsfreeze -u`). Fails if it is not
    /// frozen or not mounted.
    fn thaw_fs(&self, mount_point: &Path) -> Result<(), HostError>;
    /// Writes the block device's cached writes through to it (fsync of the device), so a
    /// copy of a loop device's backing file holds every write that completed before.
    fn flush_device(&self, device: &Path) -> Result<(), HostError>;
}

/// The real host.
#[derive(Debug, Default, Clone)]
pub struct RealHost {
    tools: ToolRunner,
}

impl RealHost {
    /// A host running tools through `tools`.
    #[must_use]
    pub fn new(tools: ToolRunner) -> Self {
        Self { tools }
    }

    fn run<I, S>(&self, program: &str, args: I) -> Result<String, HostError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.tools.run(program, args)
    }
}

impl Host for RealHost {
    fn bind_mount(&self, source: &Path, target: &Path, readonly: bool) -> Result<(), HostError> {
        let io = |op| {
            move |e: nix::Error| HostError::Io {
                op,
                path: target.to_owned(),
                source: io::Error::from(e),
            }
        };
        // Mount onto the descriptor, not the name: a symlink swapped in at `target` after
        // the caller's checks cannot redirect the mount.
        let pinned = open_mount_point(target)?;
        nix::mount::mount(
            Some(source),
            &fd_path(&pinned),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(io("bind-mounting onto"))?;
        if readonly {
            // A bind mount ignores MS_RDONLY on creation; it takes a remount (mount(8) does the
            // same). The remount needs the new mount's root, so the path is opened again.
            let res = open_mount_point(target).and_then(|root| {
                nix::mount::mount(
                    None::<&str>,
                    &fd_path(&root),
                    None::<&str>,
                    MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
                    None::<&str>,
                )
                .map_err(io("remounting read-only"))
            });
            if let Err(e) = res {
                let _ =
                    nix::mount::umount2(target, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW);
                return Err(e);
            }
        }
        Ok(())
    }

    fn mount_fs(
        &self,
        device: &Path,
        target: &Path,
        fs_type: Option<&str>,
        options: &[String],
    ) -> Result<(), HostError> {
        let mut args: Vec<&OsStr> = Vec::new();
        if let Some(t) = fs_type {
            args.extend([OsStr::new("-t"), OsStr::new(t)]);
        }
        let joined = options.join(",");
        let mut redacted = Vec::new();
        if !options.is_empty() {
            args.push(OsStr::new("-o"));
            // CSI: mount_flags MAY contain sensitive information and must not leak, so
            // they never appear in logs or status messages.
            redacted.push(args.len());
            args.push(OsStr::new(&joined));
        }
        args.extend([device.as_os_str(), target.as_os_str()]);
        self.tools.run_redacted("mount", args, &redacted).map(drop)
    }

    fn unmount_all(&self, target: &Path) -> Result<(), HostError> {
        // Bounded: a path can carry a few stacked mounts, never an unbounded number.
        for _ in 0..16 {
            if !self.is_mount_point(target)? {
                return Ok(());
            }
            // NOFOLLOW: a symlink at the target must not make us unmount what it points to.
            nix::mount::umount2(target, MntFlags::UMOUNT_NOFOLLOW).map_err(|e| HostError::Io {
                op: "unmounting",
                path: target.to_owned(),
                source: io::Error::from(e),
            })?;
        }
        Err(HostError::Io {
            op: "unmounting (too many stacked mounts)",
            path: target.to_owned(),
            source: io::Error::from(io::ErrorKind::Other),
        })
    }

    fn is_mount_point(&self, path: &Path) -> Result<bool, HostError> {
        // A symlink is never a mount point itself; resolving it would report the mount
        // status of whatever it points to.
        if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
            return Ok(false);
        }
        let canonical = match std::fs::canonicalize(path) {
            Ok(p) => p,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(source) => {
                return Err(HostError::Io {
                    op: "resolving",
                    path: path.to_owned(),
                    source,
                });
            }
        };
        let err = |e: procfs::ProcError| HostError::Io {
            op: "reading",
            path: PathBuf::from("/proc/self/mountinfo"),
            source: io::Error::other(e.to_string()),
        };
        let infos = procfs::process::Process::myself()
            .map_err(err)?
            .mountinfo()
            .map_err(err)?;
        Ok(infos.into_iter().any(|m| m.mount_point == canonical))
    }

    fn loop_devices_of(&self, file: &Path) -> Result<Vec<PathBuf>, HostError> {
        let out = self.run("losetup", [OsStr::new("-j"), file.as_os_str()])?;
        // Lines look like "/dev/loop3: [2049]:1234 (/path/file)".
        Ok(out
            .lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(dev, _)| PathBuf::from(dev.trim()))
            .filter(|d| d.starts_with("/dev/") && !detach_pending(d))
            .collect())
    }

    fn loop_attach(&self, file: &Path) -> Result<PathBuf, HostError> {
        let out = self.run(
            "losetup",
            [OsStr::new("--find"), OsStr::new("--show"), file.as_os_str()],
        )?;
        let dev = out.trim();
        if !dev.starts_with("/dev/") {
            return Err(HostError::Output {
                command: format!("losetup --find --show {}", file.display()),
                output: out.clone(),
            });
        }
        Ok(PathBuf::from(dev))
    }

    fn loop_detach(&self, device: &Path) -> Result<(), HostError> {
        self.run("losetup", [OsStr::new("-d"), device.as_os_str()])
            .map(drop)
    }

    fn loop_refresh_size(&self, device: &Path) -> Result<(), HostError> {
        self.run("losetup", [OsStr::new("-c"), device.as_os_str()])
            .map(drop)
    }

    fn probe_fs(&self, device: &Path) -> Result<Option<String>, HostError> {
        let args = [
            OsStr::new("-p"),
            OsStr::new("-o"),
            OsStr::new("value"),
            OsStr::new("-s"),
            OsStr::new("TYPE"),
            device.as_os_str(),
        ];
        match self.run("blkid", args) {
            Ok(out) => {
                let t = out.trim();
                Ok((!t.is_empty()).then(|| t.to_owned()))
            }
            // blkid exits 2 when it finds no signature: an empty device.
            Err(HostError::Command { status, .. }) if status.code() == Some(2) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn mkfs(&self, device: &Path, fs_type: &str, force: bool) -> Result<(), HostError> {
        let program = format!("mkfs.{fs_type}");
        let mut args: Vec<&OsStr> = Vec::new();
        match fs_type {
            // Discarding a fresh sparse file only costs time. mke2fs needs -F anyway for a
            // non-partition device; it only formats what blkid found empty (or, with
            // `force`, our own interrupted attempt).
            "ext4" | "ext3" | "ext2" => {
                args.extend(["-q", "-F", "-E", "nodiscard"].map(OsStr::new))
            }
            "xfs" => {
                args.extend(["-q", "-K"].map(OsStr::new));
                if force {
                    args.push(OsStr::new("-f"));
                }
            }
            _ => {}
        }
        args.push(device.as_os_str());
        self.run(&program, args).map(drop)
    }

    fn grow_fs(&self, device: &Path, mount_point: &Path, fs_type: &str) -> Result<(), HostError> {
        match fs_type {
            "xfs" => self.run("xfs_growfs", [mount_point.as_os_str()]).map(drop),
            _ => self.run("resize2fs", [device.as_os_str()]).map(drop),
        }
    }

    fn fs_stats(&self, path: &Path) -> Result<FsStats, HostError> {
        let st = nix::sys::statvfs::statvfs(path).map_err(|e| HostError::Io {
            op: "statvfs",
            path: path.to_owned(),
            source: io::Error::from(e),
        })?;
        let frag = st.fragment_size();
        let total = st.blocks().saturating_mul(frag);
        let free = st.blocks_free().saturating_mul(frag);
        Ok(FsStats {
            total_bytes: total,
            available_bytes: st.blocks_available().saturating_mul(frag),
            used_bytes: total.saturating_sub(free),
            total_inodes: st.files(),
            free_inodes: st.files_free(),
        })
    }

    fn has_mkfs(&self, fs_type: &str) -> bool {
        self.tools.find(&format!("mkfs.{fs_type}")).is_some()
    }

    fn grow_fs_offline(&self, device: &Path, fs_type: &str) -> Result<(), HostError> {
        if !fs_type.starts_with("ext") {
            return Err(HostError::Output {
                command: format!("growing {fs_type} on {} unmounted", device.display()),
                output: format!("{fs_type} grows only while mounted"),
            });
        }
        // resize2fs refuses a file system not checked since its last mount (a copy of a
        // mounted one always is). -p repairs only what is safe without a human; exit 1 means
        // it did, 2 that a mounted root should reboot (not the case here).
        match self.run(
            "e2fsck",
            [OsStr::new("-f"), OsStr::new("-p"), device.as_os_str()],
        ) {
            Ok(_) => {}
            Err(HostError::Command { status, .. }) if matches!(status.code(), Some(1 | 2)) => {}
            Err(e) => return Err(e),
        }
        self.run("resize2fs", [device.as_os_str()]).map(drop)
    }

    fn copy_image(
        &self,
        source: &Path,
        dest: &Path,
        progress: &mut dyn FnMut(),
    ) -> Result<CopyMethod, HostError> {
        copy::copy_file(source, dest, progress)
    }

    fn copy_tree(
        &self,
        source: &Path,
        dest: &Path,
        progress: &mut dyn FnMut(),
    ) -> Result<CopyMethod, HostError> {
        copy::copy_tree(source, dest, progress)
    }

    fn freeze_fs(&self, device: &Path, mount_point: &Path) -> Result<(), HostError> {
        use std::os::unix::fs::MetadataExt;
        let not_on_device = || HostError::NotOnDevice {
            mount_point: mount_point.to_owned(),
            device: device.to_owned(),
        };
        if !self.is_mount_point(mount_point)? {
            return Err(not_on_device());
        }
        let io = |op| {
            move |source| HostError::Io {
                op,
                path: mount_point.to_owned(),
                source,
            }
        };
        let mounted = std::fs::metadata(mount_point).map_err(io("reading"))?;
        let dev = std::fs::metadata(device).map_err(|source| HostError::Io {
            op: "reading",
            path: device.to_owned(),
            source,
        })?;
        if mounted.dev() != dev.rdev() {
            return Err(not_on_device());
        }
        self.run(
            "fsfreeze",
            [OsStr::new("--freeze"), mount_point.as_os_str()],
        )
        .map(drop)
    }

    fn thaw_fs(&self, mount_point: &Path) -> Result<(), HostError> {
        self.run(
            "fsfreeze",
            [OsStr::new("--unfreeze"), mount_point.as_os_str()],
        )
        .map(drop)
    }

    fn flush_device(&self, device: &Path) -> Result<(), HostError> {
        std::fs::File::open(device)
            .and_then(|f| f.sync_all())
            .map_err(|source| HostError::Io {
                op: "flushing",
                path: device.to_owned(),
                source,
            })
    }
}

/// Opens `path` itself (`O_PATH | O_NOFOLLOW`) to mount onto it through [`fd_path`]; a
/// symbolic link there is refused.
/// Whether the loop device is marked to detach at its last close: `losetup -d` while
/// another process (a `losetup -j` of another volume, udev's probe) had it open.
fn detach_pending(device: &Path) -> bool {
    // `file_name` is one component ("loop3"), so the path stays under /sys/block.
    device.file_name().is_some_and(|name| {
        std::fs::read_to_string(Path::new("/sys/block").join(name).join("loop/autoclear"))
            .is_ok_and(|v| v.trim() == "1")
    })
}

fn open_mount_point(path: &Path) -> Result<std::fs::File, HostError> {
    use std::os::unix::fs::OpenOptionsExt;
    let err = |source| HostError::Io {
        op: "opening mount point",
        path: path.to_owned(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_PATH | nix::libc::O_NOFOLLOW)
        .open(path)
        .map_err(err)?;
    if file.metadata().map_err(err)?.file_type().is_symlink() {
        return Err(err(io::Error::from_raw_os_error(nix::libc::ELOOP)));
    }
    Ok(file)
}

/// The `/proc/self/fd` name of an open file: mount(2) resolves it to that very file.
fn fd_path(file: &std::fs::File) -> PathBuf {
    use std::os::fd::AsRawFd;
    PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// An in-memory host for unit tests: mounts and loop devices are table entries.
#[cfg(test)]
pub(crate) mod fake {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use super::*;

    #[derive(Debug, Default)]
    pub(crate) struct FakeState {
        /// Mount point → (source, readonly).
        pub(crate) mounts: BTreeMap<PathBuf, (PathBuf, bool)>,
        /// Device → backing file.
        pub(crate) loops: BTreeMap<PathBuf, PathBuf>,
        /// Devices with a file system.
        pub(crate) formatted: BTreeMap<PathBuf, String>,
        pub(crate) mkfs_calls: usize,
        /// The `force` argument of every mkfs call.
        pub(crate) mkfs_forced: Vec<bool>,
        /// How many coming mkfs calls time out, leaving a partial signature behind.
        pub(crate) mkfs_timeouts: usize,
        /// How many coming loop detaches find the device already gone (dropped by
        /// AUTOCLEAR after the listing) and fail with ENXIO, as `losetup -d` does.
        pub(crate) vanished_detaches: usize,
        /// How many coming copies fail (with EIO) after writing their data.
        pub(crate) copy_failures: usize,
        /// Mount points frozen now.
        pub(crate) frozen: std::collections::BTreeSet<PathBuf>,
        /// Every mount point frozen, in order.
        pub(crate) freezes: Vec<PathBuf>,
        /// Every device flushed, in order.
        pub(crate) flushes: Vec<PathBuf>,
        /// Devices grown online (mounted) and offline, in order.
        pub(crate) online_grows: Vec<PathBuf>,
        pub(crate) offline_grows: Vec<PathBuf>,
        next_loop: usize,
    }

    impl FakeHost {
        fn copy_result(
            &self,
            res: Result<CopyMethod, HostError>,
            dest: &Path,
        ) -> Result<CopyMethod, HostError> {
            let mut s = self.state.lock().unwrap();
            if s.copy_failures > 0 && res.is_ok() {
                s.copy_failures -= 1;
                return Err(HostError::Io {
                    op: "writing",
                    path: dest.to_owned(),
                    source: io::Error::from_raw_os_error(nix::libc::EIO),
                });
            }
            res
        }
    }

    #[derive(Debug, Default)]
    pub(crate) struct FakeHost {
        pub(crate) state: Mutex<FakeState>,
    }

    impl Host for FakeHost {
        fn bind_mount(&self, source: &Path, target: &Path, ro: bool) -> Result<(), HostError> {
            let mut s = self.state.lock().unwrap();
            s.mounts.insert(target.to_owned(), (source.to_owned(), ro));
            Ok(())
        }
        fn mount_fs(
            &self,
            device: &Path,
            target: &Path,
            _fs: Option<&str>,
            _o: &[String],
        ) -> Result<(), HostError> {
            let mut s = self.state.lock().unwrap();
            s.mounts
                .insert(target.to_owned(), (device.to_owned(), false));
            Ok(())
        }
        fn unmount_all(&self, target: &Path) -> Result<(), HostError> {
            self.state.lock().unwrap().mounts.remove(target);
            Ok(())
        }
        fn is_mount_point(&self, path: &Path) -> Result<bool, HostError> {
            Ok(self.state.lock().unwrap().mounts.contains_key(path))
        }
        fn loop_devices_of(&self, file: &Path) -> Result<Vec<PathBuf>, HostError> {
            let s = self.state.lock().unwrap();
            Ok(s.loops
                .iter()
                .filter(|(_, f)| f.as_path() == file)
                .map(|(d, _)| d.clone())
                .collect())
        }
        fn loop_attach(&self, file: &Path) -> Result<PathBuf, HostError> {
            let mut s = self.state.lock().unwrap();
            let dev = PathBuf::from(format!("/dev/fakeloop{}", s.next_loop));
            s.next_loop += 1;
            s.loops.insert(dev.clone(), file.to_owned());
            Ok(dev)
        }
        fn loop_detach(&self, device: &Path) -> Result<(), HostError> {
            let mut s = self.state.lock().unwrap();
            s.loops.remove(device);
            if s.vanished_detaches > 0 {
                s.vanished_detaches -= 1;
                return Err(HostError::Output {
                    command: format!("losetup -d {}", device.display()),
                    output: "detach failed: No such device or address".to_owned(),
                });
            }
            Ok(())
        }
        fn loop_refresh_size(&self, _device: &Path) -> Result<(), HostError> {
            Ok(())
        }
        fn probe_fs(&self, device: &Path) -> Result<Option<String>, HostError> {
            let s = self.state.lock().unwrap();
            let file = s.loops.get(device).cloned().unwrap_or_default();
            Ok(s.formatted.get(&file).cloned())
        }
        fn mkfs(&self, device: &Path, fs_type: &str, force: bool) -> Result<(), HostError> {
            let mut s = self.state.lock().unwrap();
            let file = s.loops.get(device).cloned().unwrap_or_default();
            s.mkfs_calls += 1;
            s.mkfs_forced.push(force);
            if s.mkfs_timeouts > 0 {
                // Like a killed mkfs.xfs: a signature is on disk, the file system is not.
                s.mkfs_timeouts -= 1;
                s.formatted.insert(file, format!("partial-{fs_type}"));
                return Err(HostError::Timeout(Box::new(ToolTimeout {
                    command: format!("mkfs.{fs_type} {}", device.display()),
                    after: Duration::from_millis(1),
                    stderr: String::new(),
                })));
            }
            if s.formatted.contains_key(&file) && !force {
                return Err(HostError::Output {
                    command: format!("mkfs.{fs_type} {}", device.display()),
                    output: "appears to contain an existing filesystem".to_owned(),
                });
            }
            s.formatted.insert(file, fs_type.to_owned());
            Ok(())
        }
        fn grow_fs(&self, d: &Path, _m: &Path, _f: &str) -> Result<(), HostError> {
            self.state.lock().unwrap().online_grows.push(d.to_owned());
            Ok(())
        }
        fn fs_stats(&self, _path: &Path) -> Result<FsStats, HostError> {
            Ok(FsStats {
                total_bytes: 100,
                available_bytes: 60,
                used_bytes: 40,
                total_inodes: 10,
                free_inodes: 7,
            })
        }
        fn has_mkfs(&self, fs_type: &str) -> bool {
            fs_type == "ext4"
        }
        fn grow_fs_offline(&self, device: &Path, _fs: &str) -> Result<(), HostError> {
            self.state
                .lock()
                .unwrap()
                .offline_grows
                .push(device.to_owned());
            Ok(())
        }
        fn copy_image(
            &self,
            source: &Path,
            dest: &Path,
            progress: &mut dyn FnMut(),
        ) -> Result<CopyMethod, HostError> {
            let res = copy::copy_file(source, dest, progress);
            // The file system "on" an image is a table entry here: it travels with the copy.
            let mut s = self.state.lock().unwrap();
            if let Some(fs) = s.formatted.get(source).cloned() {
                s.formatted.insert(dest.to_owned(), fs);
            }
            drop(s);
            self.copy_result(res, dest)
        }
        fn copy_tree(
            &self,
            source: &Path,
            dest: &Path,
            progress: &mut dyn FnMut(),
        ) -> Result<CopyMethod, HostError> {
            let res = copy::copy_tree(source, dest, progress);
            self.copy_result(res, dest)
        }
        fn freeze_fs(&self, device: &Path, mount_point: &Path) -> Result<(), HostError> {
            let mut s = self.state.lock().unwrap();
            if s.mounts.get(mount_point).map(|m| &m.0) != Some(&device.to_owned()) {
                return Err(HostError::NotOnDevice {
                    mount_point: mount_point.to_owned(),
                    device: device.to_owned(),
                });
            }
            s.frozen.insert(mount_point.to_owned());
            s.freezes.push(mount_point.to_owned());
            Ok(())
        }
        fn thaw_fs(&self, mount_point: &Path) -> Result<(), HostError> {
            if self.state.lock().unwrap().frozen.remove(mount_point) {
                Ok(())
            } else {
                Err(HostError::Output {
                    command: format!("fsfreeze --unfreeze {}", mount_point.display()),
                    output: "unfreeze failed: Invalid argument".to_owned(),
                })
            }
        }
        fn flush_device(&self, device: &Path) -> Result<(), HostError> {
            self.state.lock().unwrap().flushes.push(device.to_owned());
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unmounts (lazily) whatever the test mounted, even when it fails.
    struct Unmount(Vec<PathBuf>);

    impl Drop for Unmount {
        fn drop(&mut self) {
            for p in &self.0 {
                let _ = nix::mount::umount2(p, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW);
            }
        }
    }

    /// A device detached while something else holds it open stays attached with AUTOCLEAR
    /// until that close; it is not offered for reuse (nor detached again).
    #[test]
    fn a_loop_device_being_detached_is_not_listed() {
        if !slrp_test_support::require_root("a_loop_device_being_detached_is_not_listed") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("a.img");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        let host = RealHost::default();
        let dev = host.loop_attach(&image).unwrap();
        assert_eq!(host.loop_devices_of(&image).unwrap(), vec![dev.clone()]);
        let holder = std::fs::File::open(&dev).unwrap();
        let res = host.loop_detach(&dev);
        // Only AUTOCLEAR is set while `holder` is open: still bound to the image.
        let still_bound = std::fs::read_to_string(
            Path::new("/sys/block")
                .join(dev.file_name().unwrap())
                .join("loop/backing_file"),
        )
        .is_ok();
        let listed = host.loop_devices_of(&image);
        drop(holder);
        res.unwrap();
        assert!(still_bound, "{} was dropped while open", dev.display());
        assert_eq!(listed.unwrap(), Vec::<PathBuf>::new());
    }

    /// The last line of defence against a symlink swapped in at a mount point after the
    /// plugin's checks: the real host neither mounts through it nor unmounts through it.
    #[test]
    fn real_host_never_follows_a_symlink_at_the_mount_point() {
        if !slrp_test_support::require_root("real_host_never_follows_a_symlink_at_the_mount_point")
        {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let d = |n: &str| {
            let p = dir.path().join(n);
            std::fs::create_dir(&p).unwrap();
            p
        };
        let (src, victim, mounted, mounted_src) = (d("src"), d("victim"), d("m"), d("m-src"));
        let _guard = Unmount(vec![victim.clone(), mounted.clone(), dir.path().join("ok")]);
        nix::mount::mount(
            Some(&mounted_src),
            &mounted,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .unwrap();
        let host = RealHost::default();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let err = host.bind_mount(&src, &link, false).unwrap_err();
        assert!(matches!(err, HostError::Io { .. }), "{err:?}");
        assert!(!host.is_mount_point(&victim).unwrap());

        let link2 = dir.path().join("link2");
        std::os::unix::fs::symlink(&mounted, &link2).unwrap();
        assert!(!host.is_mount_point(&link2).unwrap());
        let _ = host.unmount_all(&link2);
        assert!(
            host.is_mount_point(&mounted).unwrap(),
            "unmounted through a link"
        );

        // A real directory still works, read-only included.
        let ok = d("ok");
        host.bind_mount(&src, &ok, true).unwrap();
        assert!(host.is_mount_point(&ok).unwrap());
        let e = std::fs::write(ok.join("x"), b"x").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(nix::libc::EROFS));
        host.unmount_all(&ok).unwrap();
        assert!(!host.is_mount_point(&ok).unwrap());
    }
}
