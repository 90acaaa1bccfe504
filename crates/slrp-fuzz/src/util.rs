//! Helpers shared by the targets.

use std::path::{Component, Path};
use std::sync::OnceLock;

/// A current-thread runtime for the async targets, made once per process (with its
/// blocking pool: the bundled plugin and the volume manager use `spawn_blocking`).
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime builds")
    })
}

/// A fresh scratch directory, in memory where `/dev/shm` exists (a target makes one per
/// input).
pub(crate) fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    let builder = || {
        let mut b = tempfile::Builder::new();
        b.prefix("slrp-fuzz-");
        b
    };
    if shm.is_dir()
        && let Ok(dir) = builder().tempdir_in(shm)
    {
        return dir;
    }
    builder().tempdir().expect("a temporary directory")
}

/// Whether `path`, taken lexically, stays inside `dir`: it starts with `dir` and no `..`
/// follows.
pub(crate) fn inside(dir: &Path, path: &Path) -> bool {
    path.strip_prefix(dir).is_ok_and(|rest| {
        rest.components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
    })
}

/// Takes `n` bytes from the front of `data` (fewer at the end).
pub(crate) fn take<'a>(data: &mut &'a [u8], n: usize) -> &'a [u8] {
    let (head, tail) = data.split_at(n.min(data.len()));
    *data = tail;
    head
}

/// Takes one byte (0 at the end).
pub(crate) fn byte(data: &mut &[u8]) -> u8 {
    take(data, 1).first().copied().unwrap_or(0)
}

/// Takes a little-endian `u16` length and that many bytes.
pub(crate) fn chunk<'a>(data: &mut &'a [u8]) -> &'a [u8] {
    let lo = usize::from(byte(data));
    let hi = usize::from(byte(data));
    take(data, lo | hi << 8)
}

/// Appends `bytes` as [`chunk`] reads it.
pub(crate) fn put_chunk(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u16::try_from(bytes.len()).expect("seed chunks are under 64 KiB");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Two messages are the same: equal, or (a NaN makes `==` false) equal encodings.
pub(crate) fn same<M: prost::Message + PartialEq>(a: &M, b: &M) -> bool {
    a == b || a.encode_to_vec() == b.encode_to_vec()
}
