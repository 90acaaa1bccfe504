//! `slrp completions` and `slrp man`: generated from the CLI definition, so they name
//! every command, `slrp ctl`'s included.

#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::process::{Command, Output};

fn slrp(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_slrp"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "slrp {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn completions_name_the_ctl_commands() {
    let bash = String::from_utf8(slrp(&["completions", "bash"]).stdout).unwrap();
    assert!(
        bash.contains("complete -F _slrp"),
        "a bash completion script"
    );
    for word in [
        "ctl",
        "create-disk",
        "destroy-disk",
        "--admin",
        "--token-file",
    ] {
        assert!(bash.contains(word), "bash completions mention {word}");
    }
    let zsh = String::from_utf8(slrp(&["completions", "zsh"]).stdout).unwrap();
    assert!(
        zsh.starts_with("#compdef slrp"),
        "{}",
        &zsh[..40.min(zsh.len())]
    );
    assert!(zsh.contains("create-disk"));
    let fish = String::from_utf8(slrp(&["completions", "fish"]).stdout).unwrap();
    assert!(fish.contains("complete -c slrp"));
    assert!(fish.contains("unpublish"));

    let out = Command::new(env!("CARGO_BIN_EXE_slrp"))
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(64),
        "an unknown shell is a usage error"
    );
}

#[test]
fn ctl_help_lists_the_exit_codes() {
    let help = String::from_utf8(slrp(&["ctl", "--help"]).stdout).unwrap();
    for code in [
        "  2   slrp is not running",
        "  5   --wait timed out",
        "  64  usage error",
    ] {
        assert!(help.contains(code), "{code} in\n{help}");
    }
}

#[test]
fn the_man_page_renders_with_the_subcommands() {
    let page = String::from_utf8(slrp(&["man"]).stdout).unwrap();
    assert!(page.contains(".TH slrp 1"), "roff title: {page}");
    for sub in [
        "slrp\\-ctl(1)",
        "slrp\\-csi(1)",
        "slrp\\-run(1)",
        "slrp\\-man(1)",
    ] {
        assert!(page.contains(sub), "slrp.1 lists {sub}: {page}");
    }

    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("man1");
    let listed =
        String::from_utf8(slrp(&["man", "--dir", out_dir.to_str().unwrap()]).stdout).unwrap();
    let mut files: Vec<String> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    for want in [
        "slrp.1",
        "slrp-ctl.1",
        "slrp-ctl-create-disk.1",
        "slrp-ctl-unpublish.1",
        "slrp-csi-create-volume.1",
        "slrp-completions.1",
    ] {
        assert!(files.iter().any(|f| f == want), "{want} in {files:?}");
    }
    assert!(
        !files.iter().any(|f| f.contains("help")),
        "no page for `help`: {files:?}"
    );
    assert_eq!(listed.lines().count(), files.len(), "{listed}");
    let ctl = std::fs::read_to_string(out_dir.join("slrp-ctl.1")).unwrap();
    assert!(ctl.contains("Exit codes:"), "{ctl}");
    assert!(ctl.contains("\\-\\-wait timed out"), "{ctl}");
    let create = std::fs::read_to_string(out_dir.join("slrp-ctl-create-disk.1")).unwrap();
    assert!(create.contains("\\-\\-profile"), "{create}");
    assert!(create.contains("\\-\\-wait"), "{create}");
}
