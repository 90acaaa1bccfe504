//! `cargo xtask fuzz`: builds the libFuzzer driver (`fuzz/`) with coverage
//! instrumentation on the stable toolchain and runs the targets of `crates/slrp-fuzz`.
//!
//! * `fuzz build` builds the driver.
//! * `fuzz run [--seconds N | --runs N] [TARGET...]`: every target (or those named) for N
//!   seconds, or N executions (the same work on every machine; CI's way)
//!   (default 20) from the committed corpus; new inputs go to a scratch corpus, so the
//!   run does not change the repository. Fails if any target saved a crash, a timeout or
//!   an out-of-memory input. CI runs this.
//! * `fuzz soak --minutes N [TARGET...]`: the same for N minutes per target, keeping its
//!   corpus under the target directory between soaks, restarting a target after a crash
//!   until its time is used; prints the same table.
//! * `fuzz merge [TARGET...]`: minimizes the committed corpus together with the soak's
//!   (libFuzzer `-merge=1`) into `fuzz/corpus/<target>`.
//!
//! Every run prints one line per target: executions, executions per second, coverage
//! (libFuzzer's `cov:`, instrumented edges reached, and `ft:`, features), corpus size,
//! seconds, the CPU seconds the fuzzer process used (user + system, from the kernel's
//! account of waited children), and the crashes saved (files under
//! `<target dir>/fuzz-work/artifacts/`).

// The budgets are wall-clock time of external fuzzer processes; no tokio timer is involved.
#![allow(clippy::disallowed_types)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

/// The instrumentation libFuzzer needs, on stable rustc: LLVM's SanitizerCoverage pass
/// with 8-bit counters, the PC table and comparison tracing (what `cargo fuzz` passes,
/// without its nightly-only sanitizer flag).
const RUSTFLAGS: &str = "-Cpasses=sancov-module \
    -Cllvm-args=-sanitizer-coverage-level=4 \
    -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
    -Cllvm-args=-sanitizer-coverage-pc-table \
    -Cllvm-args=-sanitizer-coverage-trace-compares \
    --cfg fuzzing";

/// Per-input time bound (seconds): a slower input is saved as `timeout-*` and fails.
const INPUT_TIMEOUT: u32 = 10;

/// libFuzzer's memory bound for the whole process.
const RSS_LIMIT_MB: u32 = 2048;

struct Paths {
    root: PathBuf,
    build: PathBuf,
    work: PathBuf,
}

impl Paths {
    fn new(root: &Path) -> Self {
        let target =
            std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
        Self {
            root: root.to_owned(),
            build: target.join("fuzz"),
            work: target.join("fuzz-work"),
        }
    }

    fn binary(&self) -> anyhow::Result<PathBuf> {
        Ok(self.build.join(host()?).join("release/slrp-fuzz"))
    }
}

fn host() -> anyhow::Result<String> {
    let out = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
        .arg("-vV")
        .output()
        .context("running rustc -vV")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .context("rustc -vV names no host")
}

fn targets(root: &Path, named: &[String]) -> anyhow::Result<Vec<String>> {
    let mut all: Vec<String> = fs::read_dir(root.join("fuzz/corpus"))
        .context("listing fuzz/corpus")?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    all.sort();
    if named.is_empty() {
        return Ok(all);
    }
    for n in named {
        if !all.contains(n) {
            bail!("no fuzz target {n:?} (fuzz/corpus has {all:?})");
        }
    }
    Ok(named.to_vec())
}

/// `cargo xtask fuzz ...`.
pub(crate) fn main(root: &Path, args: &[String]) -> anyhow::Result<()> {
    let paths = Paths::new(root);
    let (command, rest) = args
        .split_first()
        .map_or(("", &[][..]), |(c, r)| (c.as_str(), r));
    let mut amount = None;
    let mut runs = None;
    let mut named = Vec::new();
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--seconds" => amount = Some(parse(it.next())?),
            "--minutes" => amount = Some(parse(it.next())? * 60),
            "--runs" => runs = Some(parse(it.next())?),
            other if other.starts_with('-') => bail!("unknown option {other}"),
            other => named.push(other.to_owned()),
        }
    }
    match command {
        "build" => build(&paths),
        "run" => {
            build(&paths)?;
            let list = targets(root, &named)?;
            // A number of runs is the same work on every machine: with the fixed seed, CI
            // meets the inputs a run here met. The time is then only a bound.
            let seconds = amount.unwrap_or(if runs.is_some() { 600 } else { 20 });
            campaign(&paths, &list, seconds, false, runs)
        }
        "soak" => {
            let Some(seconds) = amount else {
                bail!("fuzz soak needs --minutes N");
            };
            build(&paths)?;
            let list = targets(root, &named)?;
            campaign(&paths, &list, seconds, true, None)
        }
        "merge" => {
            build(&paths)?;
            for t in targets(root, &named)? {
                merge(&paths, &t)?;
            }
            Ok(())
        }
        _ => bail!(
            "usage: cargo xtask fuzz <build | run [--seconds N | --runs N] | soak --minutes N | merge> [TARGET...]"
        ),
    }
}

fn parse(v: Option<&String>) -> anyhow::Result<u64> {
    v.context("a number must follow")?
        .parse()
        .context("not a whole number")
}

/// Builds the driver. Its lock file is the workspace's, copied afresh (and git-ignored):
/// every crate the targets link resolves to the version the daemon is built and tested
/// with, and a dependency change in the workspace needs no second lock file kept in step;
/// cargo adds only the driver's own dependencies (`libfuzzer-sys`, pinned, and its two).
fn build(paths: &Paths) -> anyhow::Result<()> {
    let fuzz = paths.root.join("fuzz");
    fs::copy(paths.root.join("Cargo.lock"), fuzz.join("Cargo.lock"))
        .context("copying Cargo.lock into fuzz/")?;
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(&fuzz)
        .env("RUSTFLAGS", RUSTFLAGS)
        .env("CARGO_TARGET_DIR", &paths.build)
        .args(["build", "--release", "--target", &host()?])
        .status()
        .context("running cargo build for fuzz/")?;
    if !status.success() {
        bail!("building the fuzz driver failed");
    }
    Ok(())
}

/// What one libFuzzer run reported.
#[derive(Debug, Default)]
struct Figures {
    runs: u64,
    cov: u64,
    ft: u64,
    corpus: u64,
}

fn figures(log: &str) -> Figures {
    let mut f = Figures::default();
    let field = |line: &str, key: &str| -> Option<u64> {
        let rest = line.split(key).nth(1)?.trim_start();
        let num: String = rest.chars().take_while(char::is_ascii_digit).collect();
        num.parse().ok()
    };
    for line in log.lines() {
        if line.starts_with('#') && line.contains("cov: ") {
            f.cov = field(line, "cov:").unwrap_or(f.cov);
            f.ft = field(line, "ft:").unwrap_or(f.ft);
            f.corpus = field(line, "corp:").unwrap_or(f.corpus);
        }
        if let Some(n) = line
            .strip_prefix("stat::number_of_executed_units:")
            .and_then(|v| v.trim().parse::<u64>().ok())
        {
            f.runs += n;
        }
    }
    f
}

/// User and system CPU seconds of every waited child so far. The soak's budget is wall
/// time, and on a shared machine a target may get less than a core: the CPU time is
/// what says how much fuzzing was done.
fn children_cpu_seconds() -> f64 {
    use nix::sys::resource::{UsageWho, getrusage};
    getrusage(UsageWho::RUSAGE_CHILDREN).map_or(0.0, |u| {
        let secs = |t: nix::sys::time::TimeVal| {
            #[allow(clippy::cast_precision_loss)]
            let v = t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
            v
        };
        secs(u.user_time()) + secs(u.system_time())
    })
}

fn artifacts(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name().is_some_and(|n| {
                        let n = n.to_string_lossy();
                        ["crash-", "timeout-", "oom-", "leak-"]
                            .iter()
                            .any(|k| n.starts_with(k))
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

fn campaign(
    paths: &Paths,
    list: &[String],
    seconds: u64,
    soak: bool,
    runs: Option<u64>,
) -> anyhow::Result<()> {
    let binary = paths.binary()?;
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    let mut cpu_total = 0.0;
    for t in list {
        let committed = paths.root.join("fuzz/corpus").join(t);
        let corpus = if soak {
            paths.work.join("corpus").join(t)
        } else {
            paths.work.join("run-corpus").join(t)
        };
        if !soak {
            let _ = fs::remove_dir_all(&corpus);
        }
        let artifact_dir = paths.work.join("artifacts").join(t);
        fs::create_dir_all(&corpus)?;
        fs::create_dir_all(&artifact_dir)?;
        let before = artifacts(&artifact_dir).len();
        let dict = paths.root.join("fuzz/dict").join(format!("{t}.dict"));
        let started = Instant::now();
        let cpu_before = children_cpu_seconds();
        let budget = Duration::from_secs(seconds);
        let mut total = Figures::default();
        let mut log_all = String::new();
        // A soak restarts a target after a crash until its time is used; a run stops.
        loop {
            let left = budget.saturating_sub(started.elapsed());
            if left < Duration::from_secs(1) {
                break;
            }
            let mut cmd = Command::new(&binary);
            cmd.env("SLRP_FUZZ_TARGET", t)
                .arg(format!("-max_total_time={}", left.as_secs()))
                .arg(format!("-timeout={INPUT_TIMEOUT}"))
                .arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"))
                .arg("-print_final_stats=1")
                .arg(format!("-artifact_prefix={}/", artifact_dir.display()));
            if dict.is_file() {
                cmd.arg(format!("-dict={}", dict.display()));
            }
            if !soak {
                // A run (CI's) explores the same way each time: what it finds is found
                // again on the next run, not by chance once. SLRP_FUZZ_SEED picks another.
                let seed = std::env::var("SLRP_FUZZ_SEED").unwrap_or_else(|_| "1".to_owned());
                cmd.arg(format!("-seed={seed}"));
            }
            if let Some(runs) = runs {
                cmd.arg(format!("-runs={runs}"));
            }
            cmd.arg(&corpus).arg(&committed);
            let out = cmd
                .output()
                .with_context(|| format!("running {}", binary.display()))?;
            let log = String::from_utf8_lossy(&out.stderr).into_owned();
            let f = figures(&log);
            total.runs += f.runs;
            total.cov = total.cov.max(f.cov);
            total.ft = total.ft.max(f.ft);
            total.corpus = f.corpus.max(total.corpus);
            log_all.push_str(&log);
            if out.status.success() {
                break;
            }
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!(
                "--- {t}: libFuzzer exited with {} ---\n{}",
                out.status,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
            if !soak {
                break;
            }
        }
        let _ = fs::write(paths.work.join(format!("{t}.log")), &log_all);
        let elapsed = started.elapsed().as_secs_f64();
        let cpu = children_cpu_seconds() - cpu_before;
        cpu_total += cpu;
        let saved = artifacts(&artifact_dir);
        let new = saved.len() - before;
        if new > 0 {
            failed.push(format!(
                "{t}: {}",
                saved[before..]
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        #[allow(clippy::cast_precision_loss)]
        let rate = total.runs as f64 / elapsed.max(1e-3);
        let row = format!(
            "{t:<15} {:>11} {:>9.0} {:>6} {:>7} {:>6} {:>7.0} {:>7.0} {:>7}",
            total.runs, rate, total.cov, total.ft, total.corpus, elapsed, cpu, new
        );
        println!("{row}");
        rows.push(row);
    }
    println!(
        "\n{:<15} {:>11} {:>9} {:>6} {:>7} {:>6} {:>7} {:>7} {:>7}",
        "target", "execs", "exec/s", "cov", "ft", "corpus", "seconds", "cpu s", "crashes"
    );
    for r in &rows {
        println!("{r}");
    }
    println!("CPU time fuzzed: {:.1} min", cpu_total / 60.0);
    if !failed.is_empty() {
        bail!(
            "fuzzing saved failing inputs (reproduce: SLRP_FUZZ_TARGET=<target> {} <file>):\n{}",
            binary.display(),
            failed.join("\n")
        );
    }
    Ok(())
}

fn merge(paths: &Paths, t: &str) -> anyhow::Result<()> {
    let committed = paths.root.join("fuzz/corpus").join(t);
    let fresh = paths.work.join("merged").join(t);
    let _ = fs::remove_dir_all(&fresh);
    fs::create_dir_all(&fresh)?;
    let soaked = paths.work.join("corpus").join(t);
    fs::create_dir_all(&soaked)?;
    let status = Command::new(paths.binary()?)
        .env("SLRP_FUZZ_TARGET", t)
        .arg("-merge=1")
        .arg(format!("-timeout={INPUT_TIMEOUT}"))
        .arg(&fresh)
        .arg(&committed)
        .arg(&soaked)
        .status()?;
    if !status.success() {
        bail!("merging {t} failed");
    }
    fs::remove_dir_all(&committed)?;
    fs::create_dir_all(&committed)?;
    for e in fs::read_dir(&fresh)? {
        let e = e?;
        fs::copy(e.path(), committed.join(e.file_name()))?;
    }
    println!("{t}: {} inputs", fs::read_dir(&committed)?.count());
    Ok(())
}
