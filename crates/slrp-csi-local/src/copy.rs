//! Copying volume data for snapshots and clones, the way `cp -a --reflink=auto
//! --sparse=always` would, without an external tool.
//!
//! Why in-process rather than `cp`: a copy's run time grows with the volume (minutes for
//! large images), so the tool timeout, a hang guard sized for `losetup` and `mount`, would
//! kill legitimate copies and every retry after them.
//!
//! A file is first cloned with FICLONE, which shares the source's blocks on file systems
//! that support it (btrfs, xfs with reflink, bcachefs): instant, and no space is used until
//! either side changes. Elsewhere (ext4, tmpfs) the data is copied range by range: only the
//! ranges `SEEK_DATA`/`SEEK_HOLE` report as data are read, and blocks of zeros inside them
//! are not written, so a sparse image stays sparse (a 10 GiB image holding 50 MiB copies
//! 50 MiB).
//!
//! A tree copy keeps directories, regular files, symbolic links, hard links (files linked
//! within the tree stay linked), FIFOs, sockets and device nodes, with their owner, mode
//! (setuid/setgid/sticky included) and access and modification times. It does not copy
//! extended attributes or ACLs, and it does not descend into other file systems mounted
//! inside the source.
//!
//! Durability: [`copy_file`] fsyncs the copy; [`copy_tree`] ends with one `syncfs` of the
//! destination's file system (cheaper than an fsync per file for large trees).

use std::collections::HashMap;
use std::fs::{self, DirBuilder, File, Metadata, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sys::stat::{Mode, SFlag, UtimensatFlags};
use nix::sys::time::TimeSpec;
use nix::unistd::Whence;

use crate::host::HostError;

/// Bytes read at a time from a data range.
const CHUNK: usize = 1 << 20;
/// Granularity of the zero-block check: a file system block. A block of zeros inside a
/// data range is skipped, leaving a hole in the copy.
const BLOCK: usize = 4096;

/// How the data of a copy was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyMethod {
    /// Every file shares the source's blocks (FICLONE); a tree has at least one file.
    Reflink,
    /// The data was read and written, holes and blocks of zeros left out (or a tree had
    /// no file to copy).
    Sparse,
}

impl CopyMethod {
    /// The method's name, for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reflink => "reflink",
            Self::Sparse => "sparse copy",
        }
    }
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> HostError + 'a {
    move |source| HostError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

fn nix_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(Errno) -> HostError + 'a {
    move |e| HostError::Io {
        op,
        path: path.to_owned(),
        source: io::Error::from(e),
    }
}

/// Copies the regular file `source` to `dest`, which must not exist, and makes the copy
/// durable. The copy has mode 0600 and the source's length; `progress` is called after
/// each chunk written (once for a reflink).
///
/// # Errors
/// [`HostError::Io`] naming the step and path; `dest` may then exist with partial data
/// (the caller removes it).
pub fn copy_file(
    source: &Path,
    dest: &Path,
    progress: &mut dyn FnMut(),
) -> Result<CopyMethod, HostError> {
    let method = copy_file_data(source, dest, progress)?;
    File::open(dest)
        .and_then(|f| f.sync_all())
        .map_err(io_err("fsyncing", dest))?;
    Ok(method)
}

/// [`copy_file`] without the final fsync (a tree copy syncs once at the end).
fn copy_file_data(
    source: &Path,
    dest: &Path,
    progress: &mut dyn FnMut(),
) -> Result<CopyMethod, HostError> {
    let input = File::open(source).map_err(io_err("opening", source))?;
    let len = input.metadata().map_err(io_err("reading", source))?.len();
    let output = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dest)
        .map_err(io_err("creating", dest))?;
    match reflink(&input, &output) {
        Ok(()) => {
            progress();
            return Ok(CopyMethod::Reflink);
        }
        Err(e) if reflink_unsupported(e) => {}
        Err(e) => return Err(nix_err("cloning (FICLONE) into", dest)(e)),
    }
    copy_sparse(&input, source, &output, dest, len, progress)?;
    output.set_len(len).map_err(io_err("sizing", dest))?;
    Ok(CopyMethod::Sparse)
}

/// Errors of FICLONE that mean "not here" (another file system, or one without
/// reflinks), after which a plain copy is right.
fn reflink_unsupported(e: Errno) -> bool {
    matches!(
        e,
        Errno::EOPNOTSUPP | Errno::ENOTTY | Errno::EXDEV | Errno::EINVAL | Errno::ENOSYS
    )
}

/// The FICLONE ioctl, in a private module: the macro makes a `pub` function.
mod sys {
    nix::ioctl_write_int!(
        /// FICLONE = _IOW(0x94, 9, int): makes the destination share all of the source's
        /// blocks.
        ficlone,
        0x94,
        9
    );
}

#[allow(unsafe_code)]
fn reflink(input: &File, output: &File) -> Result<(), Errno> {
    let src_fd =
        nix::sys::ioctl::ioctl_param_type::try_from(input.as_raw_fd()).map_err(|_| Errno::EBADF)?;
    // SAFETY: FICLONE takes the source descriptor by value (no pointer is passed), and both
    // descriptors stay open for the call: they belong to `input` and `output`, borrowed
    // here.
    unsafe { sys::ficlone(output.as_raw_fd(), src_fd) }.map(drop)
}

/// Copies the data ranges of `input` (`SEEK_DATA`/`SEEK_HOLE`), leaving out blocks of
/// zeros, into `output` at the same offsets.
fn copy_sparse(
    input: &File,
    source: &Path,
    output: &File,
    dest: &Path,
    len: u64,
    progress: &mut dyn FnMut(),
) -> Result<(), HostError> {
    let mut buf = vec![0u8; CHUNK];
    let mut pos = 0u64;
    while pos < len {
        let Some((start, end)) = next_data_range(input, source, pos, len)? else {
            break;
        };
        let mut off = start;
        while off < end {
            let want = usize::try_from(end - off).map_or(CHUNK, |n| n.min(CHUNK));
            let got =
                read_full_at(input, &mut buf[..want], off).map_err(io_err("reading", source))?;
            if got == 0 {
                // The source is shorter than it was: nothing more to copy.
                return Ok(());
            }
            write_non_zero(output, &buf[..got], off).map_err(io_err("writing", dest))?;
            off += got as u64;
            progress();
        }
        pos = end;
    }
    Ok(())
}

/// The next data range at or after `pos`, or `None` when only a hole is left.
fn next_data_range(
    input: &File,
    source: &Path,
    pos: u64,
    len: u64,
) -> Result<Option<(u64, u64)>, HostError> {
    let at = i64::try_from(pos).unwrap_or(i64::MAX);
    let start = match nix::unistd::lseek(input, at, Whence::SeekData) {
        Ok(o) => u64::try_from(o).unwrap_or(len),
        // No data after `pos`.
        Err(Errno::ENXIO) => return Ok(None),
        // A file system without SEEK_DATA: everything is data.
        Err(Errno::EINVAL | Errno::EOPNOTSUPP) => return Ok(Some((pos, len))),
        Err(e) => return Err(nix_err("seeking data in", source)(e)),
    };
    if start >= len {
        return Ok(None);
    }
    let from = i64::try_from(start).unwrap_or(i64::MAX);
    let end = match nix::unistd::lseek(input, from, Whence::SeekHole) {
        Ok(o) => u64::try_from(o).unwrap_or(len).min(len),
        Err(Errno::ENXIO | Errno::EINVAL | Errno::EOPNOTSUPP) => len,
        Err(e) => return Err(nix_err("seeking a hole in", source)(e)),
    };
    Ok(Some((start, end.max(start))))
}

/// Reads until `buf` is full or the file ends; the bytes read.
fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Writes the blocks of `data` that are not all zeros, at `offset` plus their position;
/// consecutive ones in one write.
fn write_non_zero(file: &File, data: &[u8], offset: u64) -> io::Result<()> {
    let mut run_start: Option<usize> = None;
    let mut at = 0;
    while at < data.len() {
        let end = (at + BLOCK).min(data.len());
        let zero = data[at..end].iter().all(|b| *b == 0);
        match (zero, run_start) {
            (false, None) => run_start = Some(at),
            (true, Some(s)) => {
                file.write_all_at(&data[s..at], offset + s as u64)?;
                run_start = None;
            }
            (false, Some(_)) | (true, None) => {}
        }
        at = end;
    }
    if let Some(s) = run_start {
        file.write_all_at(&data[s..], offset + s as u64)?;
    }
    Ok(())
}

/// One step of the tree walk: copy a directory's entries, or (after them) give a copied
/// directory its attributes, whose times its entries' creation would otherwise change.
enum Step {
    Enter { source: PathBuf, dest: PathBuf },
    Finish { dest: PathBuf, md: Box<Metadata> },
}

/// Copies the directory tree `source` to `dest`, which must not exist (see the module
/// docs for what is kept). `progress` is called after each entry and each chunk of file
/// data.
///
/// # Errors
/// [`HostError::Io`] naming the step and path; `dest` may then exist with part of the
/// tree (the caller removes it).
pub fn copy_tree(
    source: &Path,
    dest: &Path,
    progress: &mut dyn FnMut(),
) -> Result<CopyMethod, HostError> {
    let root = fs::symlink_metadata(source).map_err(io_err("reading", source))?;
    if !root.is_dir() {
        return Err(HostError::Io {
            op: "copying (not a directory)",
            path: source.to_owned(),
            source: io::Error::from(io::ErrorKind::InvalidInput),
        });
    }
    DirBuilder::new()
        .mode(0o700)
        .create(dest)
        .map_err(io_err("creating", dest))?;
    let device = root.dev();
    // Files with several links in the tree: (device, inode) → their first copy.
    let mut linked: HashMap<(u64, u64), PathBuf> = HashMap::new();
    let (mut files, mut reflinked) = (0usize, 0usize);
    let mut steps = vec![
        Step::Finish {
            dest: dest.to_owned(),
            md: Box::new(root),
        },
        Step::Enter {
            source: source.to_owned(),
            dest: dest.to_owned(),
        },
    ];
    while let Some(step) = steps.pop() {
        let (dir, into) = match step {
            Step::Finish { dest, md } => {
                set_attributes(&dest, &md)?;
                continue;
            }
            Step::Enter { source, dest } => (source, dest),
        };
        for entry in fs::read_dir(&dir).map_err(io_err("listing", &dir))? {
            let entry = entry.map_err(io_err("listing", &dir))?;
            let from = entry.path();
            let to = into.join(entry.file_name());
            let md = fs::symlink_metadata(&from).map_err(io_err("reading", &from))?;
            if md.dev() != device {
                // Another file system mounted inside the volume is not the volume's data.
                tracing::debug!(path = %from.display(), "not copying a mount point inside the tree");
                continue;
            }
            let ft = md.file_type();
            if ft.is_dir() {
                DirBuilder::new()
                    .mode(0o700)
                    .create(&to)
                    .map_err(io_err("creating", &to))?;
                steps.push(Step::Finish {
                    dest: to.clone(),
                    md: Box::new(md),
                });
                steps.push(Step::Enter {
                    source: from,
                    dest: to,
                });
            } else if ft.is_file() {
                let key = (md.dev(), md.ino());
                if md.nlink() > 1
                    && let Some(first) = linked.get(&key)
                {
                    fs::hard_link(first, &to).map_err(io_err("linking", &to))?;
                } else {
                    files += 1;
                    if copy_file_data(&from, &to, progress)? == CopyMethod::Reflink {
                        reflinked += 1;
                    }
                    set_attributes(&to, &md)?;
                    if md.nlink() > 1 {
                        linked.insert(key, to);
                    }
                }
            } else if ft.is_symlink() {
                let target = fs::read_link(&from).map_err(io_err("reading link", &from))?;
                std::os::unix::fs::symlink(&target, &to).map_err(io_err("creating link", &to))?;
                set_attributes(&to, &md)?;
            } else {
                make_node(&to, &md)?;
                set_attributes(&to, &md)?;
            }
            progress();
        }
    }
    let dest_dir = File::open(dest).map_err(io_err("opening", dest))?;
    nix::unistd::syncfs(&dest_dir).map_err(nix_err("syncing the file system of", dest))?;
    Ok(if files > 0 && reflinked == files {
        CopyMethod::Reflink
    } else {
        CopyMethod::Sparse
    })
}

/// Recreates a FIFO, socket or device node.
fn make_node(path: &Path, md: &Metadata) -> Result<(), HostError> {
    let kind = SFlag::from_bits_truncate(md.mode() & SFlag::S_IFMT.bits());
    let perm = Mode::from_bits_truncate(md.mode() & 0o7777);
    nix::sys::stat::mknod(path, kind, perm, md.rdev()).map_err(nix_err("creating node", path))
}

/// Gives `path` the owner, mode (not for symbolic links, which have none of their own)
/// and times of `md`. The owner goes first: changing it clears setuid and setgid bits.
fn set_attributes(path: &Path, md: &Metadata) -> Result<(), HostError> {
    std::os::unix::fs::lchown(path, Some(md.uid()), Some(md.gid()))
        .map_err(io_err("changing the owner of", path))?;
    if !md.file_type().is_symlink() {
        fs::set_permissions(path, fs::Permissions::from_mode(md.mode() & 0o7777))
            .map_err(io_err("changing the mode of", path))?;
    }
    let atime = TimeSpec::new(md.atime(), md.atime_nsec());
    let mtime = TimeSpec::new(md.mtime(), md.mtime_nsec());
    nix::sys::stat::utimensat(
        nix::fcntl::AT_FDCWD,
        path,
        &atime,
        &mtime,
        UtimensatFlags::NoFollowSymlink,
    )
    .map_err(nix_err("setting the times of", path))
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::fs::{FileTypeExt, symlink};

    use super::*;

    fn allocated(path: &Path) -> u64 {
        fs::metadata(path).unwrap().blocks() * 512
    }

    #[test]
    fn sparse_images_stay_sparse_and_equal() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("a.img");
        let f = File::create(&src).unwrap();
        f.set_len(64 << 20).unwrap();
        // Data at the start, in the middle (with a zero block inside it) and at the end.
        f.write_all_at(&[7u8; 10_000], 0).unwrap();
        let mut mixed = vec![1u8; 3 * BLOCK];
        mixed[BLOCK..2 * BLOCK].fill(0);
        f.write_all_at(&mixed, 20 << 20).unwrap();
        f.write_all_at(b"tail", (64 << 20) - 4).unwrap();
        f.sync_all().unwrap();
        let dst = dir.path().join("b.img");
        let mut calls = 0;
        copy_file(&src, &dst, &mut || calls += 1).unwrap();
        assert!(calls >= 1);
        assert_eq!(fs::metadata(&dst).unwrap().len(), 64 << 20);
        assert_eq!(fs::read(&src).unwrap(), fs::read(&dst).unwrap());
        // Sparse (or shared): far below the 64 MiB a plain copy would allocate.
        assert!(
            allocated(&dst) < 4 << 20,
            "{} bytes allocated",
            allocated(&dst)
        );
        assert_eq!(
            fs::metadata(&dst).unwrap().permissions().mode() & 0o777,
            0o600
        );
        // The destination must not exist.
        assert!(copy_file(&src, &dst, &mut || {}).is_err());
    }

    #[test]
    fn an_empty_or_all_hole_image_copies() {
        let dir = tempfile::tempdir().unwrap();
        for len in [0u64, 1 << 30] {
            let src = dir.path().join(format!("{len}.img"));
            File::create(&src).unwrap().set_len(len).unwrap();
            let dst = dir.path().join(format!("{len}.copy"));
            copy_file(&src, &dst, &mut || {}).unwrap();
            assert_eq!(fs::metadata(&dst).unwrap().len(), len);
            assert!(allocated(&dst) < 1 << 20);
        }
    }

    #[test]
    fn zero_runs_are_skipped_and_data_kept() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("o");
        let f = File::create(&out).unwrap();
        let mut data = vec![0u8; 5 * BLOCK + 10];
        data[BLOCK + 3] = 9;
        data[5 * BLOCK + 9] = 4;
        write_non_zero(&f, &data, 0).unwrap();
        f.set_len(data.len() as u64).unwrap();
        assert_eq!(fs::read(&out).unwrap(), data);
    }

    #[test]
    fn trees_keep_files_links_modes_and_times() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        fs::create_dir_all(src.join("sub/deeper")).unwrap();
        let mut f = File::create(src.join("sub/data")).unwrap();
        f.write_all(b"hello").unwrap();
        drop(f);
        let sparse = File::create(src.join("sparse")).unwrap();
        sparse.set_len(256 << 20).unwrap();
        sparse.write_all_at(b"x", 100 << 20).unwrap();
        fs::hard_link(src.join("sub/data"), src.join("hard")).unwrap();
        symlink("sub/data", src.join("link")).unwrap();
        symlink("/nowhere", src.join("dangling")).unwrap();
        nix::unistd::mkfifo(&src.join("fifo"), Mode::from_bits_truncate(0o640)).unwrap();
        fs::set_permissions(src.join("sub"), fs::Permissions::from_mode(0o750)).unwrap();
        fs::set_permissions(src.join("sub/data"), fs::Permissions::from_mode(0o604)).unwrap();
        let old = TimeSpec::new(1_000_000_000, 5);
        nix::sys::stat::utimensat(
            nix::fcntl::AT_FDCWD,
            &src.join("sub/deeper"),
            &old,
            &old,
            UtimensatFlags::NoFollowSymlink,
        )
        .unwrap();

        let dst = dir.path().join("dst");
        let mut entries = 0;
        copy_tree(&src, &dst, &mut || entries += 1).unwrap();
        assert!(entries >= 7);
        assert_eq!(fs::read(dst.join("sub/data")).unwrap(), b"hello");
        let data = fs::metadata(dst.join("sub/data")).unwrap();
        let hard = fs::metadata(dst.join("hard")).unwrap();
        assert_eq!((data.ino(), data.nlink()), (hard.ino(), 2));
        assert_eq!(data.permissions().mode() & 0o7777, 0o604);
        assert_eq!(
            fs::metadata(dst.join("sub")).unwrap().permissions().mode() & 0o7777,
            0o750
        );
        assert_eq!(
            fs::read_link(dst.join("link")).unwrap(),
            PathBuf::from("sub/data")
        );
        assert_eq!(
            fs::read_link(dst.join("dangling")).unwrap(),
            PathBuf::from("/nowhere")
        );
        assert!(
            fs::symlink_metadata(dst.join("fifo"))
                .unwrap()
                .file_type()
                .is_fifo()
        );
        let deeper = fs::metadata(dst.join("sub/deeper")).unwrap();
        assert_eq!((deeper.mtime(), deeper.mtime_nsec()), (1_000_000_000, 5));
        let sparse = dst.join("sparse");
        assert_eq!(fs::metadata(&sparse).unwrap().len(), 256 << 20);
        assert!(allocated(&sparse) < 1 << 20);
        let mut byte = [0u8];
        File::open(&sparse)
            .unwrap()
            .read_exact_at(&mut byte, 100 << 20)
            .unwrap();
        assert_eq!(&byte, b"x");
        // The destination must not exist.
        assert!(copy_tree(&src, &dst, &mut || {}).is_err());
    }

    /// On a file system with reflinks the copy shares the source's blocks.
    #[test]
    fn reflinks_are_used_where_the_file_system_has_them() {
        if !slrp_test_support::require_root("reflinks_are_used_where_the_file_system_has_them")
            || !slrp_test_support::require_tool(
                "reflinks_are_used_where_the_file_system_has_them",
                "mkfs.xfs",
            )
        {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("xfs.img");
        File::create(&image).unwrap().set_len(320 << 20).unwrap();
        let run = |cmd: &str, args: &[&str]| {
            let out = std::process::Command::new(cmd).args(args).output().unwrap();
            assert!(out.status.success(), "{cmd} {args:?}: {out:?}");
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        };
        run(
            "mkfs.xfs",
            &["-q", "-m", "reflink=1", image.to_str().unwrap()],
        );
        let mnt = dir.path().join("mnt");
        fs::create_dir(&mnt).unwrap();
        run(
            "mount",
            &["-o", "loop", image.to_str().unwrap(), mnt.to_str().unwrap()],
        );
        /// Unmounts (and detaches) the test's file system even when the test fails.
        struct Unmount(PathBuf);
        impl Drop for Unmount {
            fn drop(&mut self) {
                let _ = std::process::Command::new("umount")
                    .arg("-d")
                    .arg(&self.0)
                    .status();
            }
        }
        let _mounted = Unmount(mnt.clone());
        let src = mnt.join("a");
        let f = File::create(&src).unwrap();
        f.write_all_at(&[3u8; 1 << 20], 0).unwrap();
        f.sync_all().unwrap();
        let method = copy_file(&src, &mnt.join("b"), &mut || {}).unwrap();
        assert_eq!(method, CopyMethod::Reflink);
        assert_eq!(fs::read(&src).unwrap(), fs::read(mnt.join("b")).unwrap());
    }
}
