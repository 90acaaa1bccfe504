//! Every committed corpus file (`fuzz/corpus/<target>/`) and reproducer
//! (`fuzz/regressions/<target>/`) through its target, under the ordinary test command: a
//! reproducer of a fixed bug fails here if the bug comes back.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

fn replay(kind: &str, target: &str) -> usize {
    let dir = fuzz_dir().join(kind).join(target);
    let files = inputs(&dir);
    for file in &files {
        let data = std::fs::read(file).unwrap();
        let result = std::panic::catch_unwind(|| slrp_fuzz::run(target, &data));
        assert!(result.is_ok(), "{target}: {} fails", file.display());
    }
    files.len()
}

#[test]
fn every_target_has_a_seed_corpus_that_passes() {
    for (target, _) in slrp_fuzz::TARGETS {
        let n = replay("corpus", target);
        assert!(n > 0, "{target} has no committed corpus");
    }
}

#[test]
fn every_reproducer_passes() {
    for (target, _) in slrp_fuzz::TARGETS {
        replay("regressions", target);
    }
}

#[test]
fn every_corpus_directory_is_a_target() {
    for kind in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(fuzz_dir().join(kind)) else {
            continue;
        };
        for entry in entries {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            assert!(
                slrp_fuzz::target(&name).is_some(),
                "fuzz/{kind}/{name} names no target"
            );
        }
    }
}
