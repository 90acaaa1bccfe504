//! The host operations the plugin needs (mounts, loop devices, file systems), behind the
//! [`Host`] trait so the volume logic can be unit tested without root.
//!
//! [`RealHost`] uses `mount(2)`/`umount2(2)` through nix for bind mounts, and the standard
//! tools for the rest: `losetup`, `blkid`, `mkfs.<fs>`, `mount`, `resize2fs`, `xfs_growfs`.
//! Mount points are read from `/proc/self/mountinfo`, never guessed from the directory.

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::mount::{MntFlags, MsFlags};

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
    /// A tool printed something unexpected.
    #[error("unexpected output from {command}: {output:?}")]
    Output {
        /// The command line.
        command: String,
        /// What it printed.
        output: String,
    },
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
    /// Loop devices currently backed by `file`.
    fn loop_devices_of(&self, file: &Path) -> Result<Vec<PathBuf>, HostError>;
    /// Attaches `file` to a free loop device and returns the device.
    fn loop_attach(&self, file: &Path) -> Result<PathBuf, HostError>;
    /// Detaches a loop device.
    fn loop_detach(&self, device: &Path) -> Result<(), HostError>;
    /// Makes a loop device pick up the new size of its file.
    fn loop_refresh_size(&self, device: &Path) -> Result<(), HostError>;
    /// The file system type found on `device`, if any.
    fn probe_fs(&self, device: &Path) -> Result<Option<String>, HostError>;
    /// Creates a file system on `device`.
    fn mkfs(&self, device: &Path, fs_type: &str) -> Result<(), HostError>;
    /// Grows the file system on `device`, mounted at `mount_point`, to the device size.
    fn grow_fs(&self, device: &Path, mount_point: &Path, fs_type: &str) -> Result<(), HostError>;
    /// `statvfs` of a path.
    fn fs_stats(&self, path: &Path) -> Result<FsStats, HostError>;
    /// Whether `mkfs.<fs_type>` is installed.
    fn has_mkfs(&self, fs_type: &str) -> bool;
}

/// The real host.
#[derive(Debug, Default, Clone)]
pub struct RealHost;

fn run<I, S>(program: &str, args: I) -> Result<String, HostError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<_> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    let command = std::iter::once(program.to_owned())
        .chain(args.iter().map(|a| a.to_string_lossy().into_owned()))
        .collect::<Vec<_>>()
        .join(" ");
    tracing::debug!(%command, "running");
    let out = Command::new(program)
        .args(&args)
        .env("LC_ALL", "C")
        .output()
        .map_err(|source| HostError::Spawn {
            program: program.to_owned(),
            source,
        })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: String = stderr
            .trim()
            .chars()
            .rev()
            .take(1000)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        return Err(HostError::Command {
            command,
            status: out.status,
            stderr: tail,
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn find_in_path(program: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/sbin", "/usr/sbin"].map(PathBuf::from))
        .any(|d| d.join(program).is_file())
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
        nix::mount::mount(
            Some(source),
            target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(io("bind-mounting onto"))?;
        if readonly {
            // A bind mount ignores MS_RDONLY on creation; it takes a remount (mount(8) does the same).
            let res = nix::mount::mount(
                None::<&str>,
                target,
                None::<&str>,
                MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
                None::<&str>,
            )
            .map_err(io("remounting read-only"));
            if let Err(e) = res {
                let _ = nix::mount::umount2(target, MntFlags::MNT_DETACH);
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
        if !options.is_empty() {
            args.extend([OsStr::new("-o"), OsStr::new(&joined)]);
        }
        args.extend([device.as_os_str(), target.as_os_str()]);
        run("mount", args).map(drop)
    }

    fn unmount_all(&self, target: &Path) -> Result<(), HostError> {
        // Bounded: a path can carry a few stacked mounts, never an unbounded number.
        for _ in 0..16 {
            if !self.is_mount_point(target)? {
                return Ok(());
            }
            nix::mount::umount2(target, MntFlags::empty()).map_err(|e| HostError::Io {
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
        let out = run("losetup", [OsStr::new("-j"), file.as_os_str()])?;
        // Lines look like "/dev/loop3: [2049]:1234 (/path/file)".
        Ok(out
            .lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(dev, _)| PathBuf::from(dev.trim()))
            .filter(|d| d.starts_with("/dev/"))
            .collect())
    }

    fn loop_attach(&self, file: &Path) -> Result<PathBuf, HostError> {
        let out = run(
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
        run("losetup", [OsStr::new("-d"), device.as_os_str()]).map(drop)
    }

    fn loop_refresh_size(&self, device: &Path) -> Result<(), HostError> {
        run("losetup", [OsStr::new("-c"), device.as_os_str()]).map(drop)
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
        match run("blkid", args) {
            Ok(out) => {
                let t = out.trim();
                Ok((!t.is_empty()).then(|| t.to_owned()))
            }
            // blkid exits 2 when it finds no signature: an empty device.
            Err(HostError::Command { status, .. }) if status.code() == Some(2) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn mkfs(&self, device: &Path, fs_type: &str) -> Result<(), HostError> {
        let program = format!("mkfs.{fs_type}");
        let mut args: Vec<&OsStr> = Vec::new();
        match fs_type {
            // Discarding a fresh sparse file only costs time.
            "ext4" | "ext3" | "ext2" => {
                args.extend(["-q", "-F", "-E", "nodiscard"].map(OsStr::new))
            }
            "xfs" => args.extend(["-q", "-K"].map(OsStr::new)),
            _ => {}
        }
        args.push(device.as_os_str());
        run(&program, args).map(drop)
    }

    fn grow_fs(&self, device: &Path, mount_point: &Path, fs_type: &str) -> Result<(), HostError> {
        match fs_type {
            "xfs" => run("xfs_growfs", [mount_point.as_os_str()]).map(drop),
            _ => run("resize2fs", [device.as_os_str()]).map(drop),
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
        find_in_path(&format!("mkfs.{fs_type}"))
    }
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
        next_loop: usize,
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
            self.state.lock().unwrap().loops.remove(device);
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
        fn mkfs(&self, device: &Path, fs_type: &str) -> Result<(), HostError> {
            let mut s = self.state.lock().unwrap();
            let file = s.loops.get(device).cloned().unwrap_or_default();
            s.formatted.insert(file, fs_type.to_owned());
            s.mkfs_calls += 1;
            Ok(())
        }
        fn grow_fs(&self, _d: &Path, _m: &Path, _f: &str) -> Result<(), HostError> {
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
    }
}
