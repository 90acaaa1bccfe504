//! Repository automation for slrp.
//!
//! * `cargo xtask codegen` compiles every `.proto` under `proto/` with `protox` (a pure-Rust
//!   protobuf compiler, so no `protoc` is needed) and writes the prost/tonic code and the
//!   encoded `FileDescriptorSet` into `crates/slrp-proto/src/generated/`.
//! * `cargo xtask check-codegen` generates into a temporary directory and fails if the
//!   committed output differs, so CI catches a `.proto` edited without regenerating.
//! * `cargo xtask crate-graph [--write|--check]` prints the workspace crate graph from
//!   `cargo metadata`, writes it into `docs/architecture.md`, or checks the doc shows it;
//!   a test runs the check, so a stale doc fails the test suite.
//! * `cargo xtask fuzz <build|run|soak|merge>` builds and runs the fuzz targets
//!   (`fuzz/`, `crates/slrp-fuzz`; see `fuzz.rs` and docs/testing.md).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use prost::Message as _;

mod fuzz;
mod graph;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = workspace_root();
    match args.first().map(String::as_str) {
        Some("codegen") => {
            let out = root.join(GENERATED_DIR);
            codegen(&root, &out)?;
            println!("generated code written to {}", out.display());
            Ok(())
        }
        Some("check-codegen") => check_codegen(&root),
        Some("crate-graph") if args.get(1).map(String::as_str) == Some("--write") => {
            graph::write(&root)?;
            println!("crate graph written to {}", graph::DOC);
            Ok(())
        }
        Some("crate-graph") if args.get(1).map(String::as_str) == Some("--check") => {
            graph::check(&root)
        }
        Some("crate-graph") => {
            print!("{}", graph::render(&graph::read(&root)?)?);
            Ok(())
        }
        Some("fuzz") => fuzz::main(&root, &args[1..]),
        _ => bail!(
            "usage: cargo xtask <codegen|check-codegen|crate-graph [--write|--check]|fuzz ...>"
        ),
    }
}

/// Where the committed generated code lives, relative to the workspace root.
const GENERATED_DIR: &str = "crates/slrp-proto/src/generated";

/// Name of the encoded descriptor set written beside the generated code. `slrp-proto`
/// embeds it so the JSON codec and required-field validation can reflect on messages.
const DESCRIPTOR_FILE: &str = "file_descriptor_set.bin";

fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// Every `.proto` file under `proto/`, sorted so generation is deterministic.
fn proto_files(proto_root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut dirs = vec![proto_root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "proto") {
                files.push(path);
            }
        }
    }
    files.sort();
    if files.is_empty() {
        bail!("no .proto files under {}", proto_root.display());
    }
    Ok(files)
}

/// Messages whose derived `Debug` would print a secret value: every message with a field
/// `secrets`, `*_secrets` or `secret` holding strings or bytes, and the value of a Mesos
/// `Secret`. Keep in step with `slrp_proto::redact::REDACTED` (a mismatch does not compile:
/// a message then has no `Debug` or two).
const REDACTED_DEBUG: &[&str] = &[
    "csi.v0.ControllerPublishVolumeRequest",
    "csi.v0.ControllerUnpublishVolumeRequest",
    "csi.v0.CreateSnapshotRequest",
    "csi.v0.CreateVolumeRequest",
    "csi.v0.DeleteSnapshotRequest",
    "csi.v0.DeleteVolumeRequest",
    "csi.v0.NodePublishVolumeRequest",
    "csi.v0.NodeStageVolumeRequest",
    "csi.v1.ControllerExpandVolumeRequest",
    "csi.v1.ControllerModifyVolumeRequest",
    "csi.v1.ControllerPublishVolumeRequest",
    "csi.v1.ControllerUnpublishVolumeRequest",
    "csi.v1.CreateSnapshotRequest",
    "csi.v1.CreateVolumeGroupSnapshotRequest",
    "csi.v1.CreateVolumeRequest",
    "csi.v1.DeleteSnapshotRequest",
    "csi.v1.DeleteVolumeGroupSnapshotRequest",
    "csi.v1.DeleteVolumeRequest",
    "csi.v1.GetMetadataAllocatedRequest",
    "csi.v1.GetMetadataDeltaRequest",
    "csi.v1.GetSnapshotRequest",
    "csi.v1.GetVolumeGroupSnapshotRequest",
    "csi.v1.ListSnapshotsRequest",
    "csi.v1.NodeExpandVolumeRequest",
    "csi.v1.NodePublishVolumeRequest",
    "csi.v1.NodeStageVolumeRequest",
    "csi.v1.ValidateVolumeCapabilitiesRequest",
    "mesos.v1.Credential",
    "mesos.v1.Secret.Value",
];

fn codegen(root: &Path, out: &Path) -> anyhow::Result<()> {
    let proto_root = root.join("proto");
    let files = proto_files(&proto_root)?;
    let fds = protox::compile(&files, [&proto_root]).context("compiling .proto files")?;

    fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    for entry in fs::read_dir(out)? {
        let path = entry?.path();
        if path.is_file() {
            fs::remove_file(&path)?;
        }
    }

    // The runtime descriptor set carries no source info: it is only used for reflection.
    let mut runtime_fds = fds.clone();
    for file in &mut runtime_fds.file {
        file.source_code_info = None;
    }
    fs::write(out.join(DESCRIPTOR_FILE), runtime_fds.encode_to_vec())?;

    let mut config = prost_build::Config::new();
    // `prost::Name` lets the codecs find a message's descriptor by its full name.
    config.enable_type_names();
    // These messages carry secret values: slrp-proto implements their `Debug` itself, with
    // the values redacted (its `redact` module; a test there checks this list is complete).
    config.skip_debug(REDACTED_DEBUG.iter().map(|name| format!(".{name}")));
    // A `Volume` is 760 of a `Resource`'s 1,232 bytes inline, and only persistent volumes
    // and paths set it: boxed, a resource is ~480 bytes, and every copy of a total of
    // 10,000 volumes is 7 MiB smaller (docs/benchmarks.md).
    config.boxed(".mesos.v1.Resource.DiskInfo.volume");
    // An `Offer.Operation` is held per tracked operation and moved along the apply path:
    // the kinds a storage provider does not carry out (LAUNCH_GROUP is the agent's; it
    // refuses GROW_VOLUME and SHRINK_VOLUME as unsupported) are boxed (3,520 -> ~1,200
    // bytes inline).
    for kind in ["launch_group", "grow_volume", "shrink_volume"] {
        config.boxed(format!(".mesos.v1.Offer.Operation.{kind}"));
    }
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .build_transport(true)
        .out_dir(out)
        .emit_rerun_if_changed(false)
        .compile_fds_with_config(fds, config)
        .context("generating Rust code")?;
    Ok(())
}

fn read_tree(dir: &Path) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
    let mut files = BTreeMap::new();
    if !dir.exists() {
        return Ok(files);
    }
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_file() {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .context("non-UTF-8 file name in generated directory")?
                .to_owned();
            files.insert(name, fs::read(&path)?);
        }
    }
    Ok(files)
}

fn check_codegen(root: &Path) -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    codegen(root, tmp.path())?;
    let fresh = read_tree(tmp.path())?;
    let committed = read_tree(&root.join(GENERATED_DIR))?;
    let mut stale = Vec::new();
    for (name, bytes) in &fresh {
        match committed.get(name) {
            Some(old) if old == bytes => {}
            Some(_) => stale.push(format!("{name} differs")),
            None => stale.push(format!("{name} is missing")),
        }
    }
    for name in committed.keys() {
        if !fresh.contains_key(name) {
            stale.push(format!("{name} is no longer generated"));
        }
    }
    if !stale.is_empty() {
        bail!(
            "generated code in {GENERATED_DIR} is stale ({}); run `cargo xtask codegen` and commit",
            stale.join(", ")
        );
    }
    println!("generated code is up to date ({} files)", fresh.len());
    Ok(())
}
