//! Rules for slrp-core's own tests, checked over their sources (CONTRIBUTING.md, "Tests"):
//!
//! - a function that configures a fail point holds a `fail::FailScenario` guard, so a
//!   panicking test cannot leak a configured fail point into the next test in the same
//!   process;
//! - no sleep is used as synchronisation: a test waits for a signal (a job count, a call
//!   reaching the fake, an answer) through the harness's bounded polling helpers. A sleep
//!   that is part of a workload says so in a comment just above it ("not
//!   synchronisation").

#![allow(clippy::unwrap_used, reason = "test")]

use std::path::{Path, PathBuf};

fn test_sources() -> Vec<(PathBuf, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut out: Vec<(PathBuf, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect();
    out.sort();
    assert!(out.len() > 5, "tests not found in {}", dir.display());
    out
}

/// The top-level functions of a source file: (name line, body), split at lines that
/// start a function in column 0.
fn functions(text: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        let starts = ["fn ", "async fn ", "pub fn ", "pub async fn "]
            .iter()
            .any(|p| line.starts_with(p));
        if starts {
            out.push((line.to_owned(), String::new()));
        } else if let Some((_, body)) = out.last_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    out
}

#[test]
fn fail_point_tests_hold_a_scenario_guard() {
    let mut offenders = Vec::new();
    for (path, text) in test_sources() {
        // This file names the calls in its own checks.
        if path.ends_with("test_rules.rs") {
            continue;
        }
        for (name, body) in functions(&text) {
            if body.contains("fail::cfg(") && !body.contains("FailScenario::setup()") {
                offenders.push(format!("{}: {name}", path.display()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "configure fail points under `let _scenario = fail::FailScenario::setup();`:\n{}",
        offenders.join("\n")
    );
}

#[test]
fn no_sleep_is_used_as_synchronisation() {
    let mut offenders = Vec::new();
    for (path, text) in test_sources() {
        if path.ends_with("test_rules.rs") {
            continue;
        }
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if !line.contains("sleep(") || line.trim_start().starts_with("//") {
                continue;
            }
            let justified = lines[i.saturating_sub(3)..i].iter().any(|l| {
                l.trim_start().starts_with("//") && l.to_lowercase().contains("not synchronisation")
            });
            if !justified {
                offenders.push(format!("{}:{}: {}", path.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "wait for a signal instead (slrp_test_support::harness::{{until, jobs_until}}), or \
         say in a comment above why the sleep is \"not synchronisation\":\n{}",
        offenders.join("\n")
    );
}
