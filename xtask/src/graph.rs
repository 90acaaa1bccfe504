//! The workspace's internal crate graph, from `cargo metadata`, and the check that
//! `docs/architecture.md` shows it.
//!
//! The diagram in the docs is generated text (crates by layer, each with the workspace
//! crates it depends on), so it can be compared byte for byte: a hand-drawn picture drifted
//! from the Cargo files before.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use anyhow::{Context as _, bail};

/// The file holding the generated block.
pub(crate) const DOC: &str = "docs/architecture.md";
const BEGIN: &str = "<!-- crate-graph:begin (cargo xtask crate-graph) -->\n";
const END: &str = "<!-- crate-graph:end -->\n";

/// One workspace crate: whether it builds a binary, and its normal (non-dev, non-build)
/// dependencies on other workspace crates.
#[derive(Debug, Default)]
pub(crate) struct Crate {
    binary: bool,
    deps: BTreeSet<String>,
}

/// Reads the graph with `cargo metadata --no-deps` (no network, no dependency resolution).
pub(crate) fn read(root: &Path) -> anyhow::Result<BTreeMap<String, Crate>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root)
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("parsing cargo metadata")?;
    let packages = meta["packages"]
        .as_array()
        .context("cargo metadata has no packages")?;
    let names: BTreeSet<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    let mut graph = BTreeMap::new();
    for p in packages {
        let name = p["name"].as_str().context("package without a name")?;
        if name == "xtask" {
            continue;
        }
        let binary = p["targets"].as_array().is_some_and(|ts| {
            ts.iter().any(|t| {
                t["kind"]
                    .as_array()
                    .is_some_and(|k| k.iter().any(|k| k == "bin"))
            })
        });
        let deps = p["dependencies"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| d["kind"].is_null())
            .filter_map(|d| d["name"].as_str())
            .filter(|d| names.contains(d) && *d != name)
            .map(str::to_owned)
            .collect();
        graph.insert(name.to_owned(), Crate { binary, deps });
    }
    Ok(graph)
}

/// The graph as text: crates by layer (a crate's layer is one above its highest
/// dependency), each with what it depends on.
pub(crate) fn render(graph: &BTreeMap<String, Crate>) -> anyhow::Result<String> {
    let mut layer: BTreeMap<&str, usize> = BTreeMap::new();
    while layer.len() < graph.len() {
        let before = layer.len();
        for (name, c) in graph {
            if layer.contains_key(name.as_str()) {
                continue;
            }
            let below: Option<Vec<usize>> = c
                .deps
                .iter()
                .map(|d| layer.get(d.as_str()).copied())
                .collect();
            if let Some(below) = below {
                layer.insert(name, below.iter().max().map_or(0, |m| m + 1));
            }
        }
        if layer.len() == before {
            bail!("the workspace crate graph has a cycle");
        }
    }
    let width = graph
        .keys()
        .map(|n| n.len() + " (bin)".len())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    let top = layer.values().max().copied().unwrap_or(0);
    for l in 0..=top {
        let mut first = true;
        for (name, c) in graph.iter().filter(|(n, _)| layer[n.as_str()] == l) {
            let label = if c.binary {
                format!("{name} (bin)")
            } else {
                name.clone()
            };
            let prefix = if first { format!("{l}") } else { String::new() };
            first = false;
            let deps: Vec<&str> = c.deps.iter().map(String::as_str).collect();
            let arrow = if deps.is_empty() {
                String::new()
            } else {
                format!(" → {}", deps.join(", "))
            };
            let line = format!("{prefix:<3}{label:<width$}{arrow}");
            writeln!(out, "{}", line.trim_end()).expect("writing to a String");
        }
    }
    Ok(out)
}

/// The block as it appears in the doc, fences and markers included.
pub(crate) fn block(rendered: &str) -> String {
    format!("{BEGIN}```\n{rendered}```\n{END}")
}

/// The doc's current block, if the markers are there.
pub(crate) fn current_block(doc: &str) -> Option<&str> {
    let start = doc.find(BEGIN)?;
    let end = doc[start..].find(END)? + start + END.len();
    Some(&doc[start..end])
}

/// Fails unless the doc shows the graph the Cargo files define.
pub(crate) fn check(root: &Path) -> anyhow::Result<()> {
    let want = block(&render(&read(root)?)?);
    let doc = std::fs::read_to_string(root.join(DOC)).with_context(|| format!("reading {DOC}"))?;
    match current_block(&doc) {
        Some(have) if have == want => Ok(()),
        Some(have) => bail!(
            "{DOC} shows a stale crate graph; run `cargo xtask crate-graph --write`.\n--- in the doc\n{have}--- from cargo metadata\n{want}"
        ),
        None => bail!("{DOC} has no crate-graph block (markers {BEGIN:?} ... {END:?})"),
    }
}

/// Rewrites the doc's block from the Cargo files.
pub(crate) fn write(root: &Path) -> anyhow::Result<()> {
    let want = block(&render(&read(root)?)?);
    let path = root.join(DOC);
    let doc = std::fs::read_to_string(&path).with_context(|| format!("reading {DOC}"))?;
    let have = current_block(&doc)
        .with_context(|| format!("{DOC} has no crate-graph block to replace"))?;
    std::fs::write(&path, doc.replacen(have, &want, 1)).with_context(|| format!("writing {DOC}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(edges: &[(&str, bool, &[&str])]) -> BTreeMap<String, Crate> {
        edges
            .iter()
            .map(|(n, binary, deps)| {
                let deps = deps.iter().map(|d| (*d).to_owned()).collect();
                (
                    (*n).to_owned(),
                    Crate {
                        binary: *binary,
                        deps,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn layers_sit_one_above_the_highest_dependency() {
        let g = graph(&[
            ("app", true, &["core", "proto"]),
            ("core", false, &["types"]),
            ("proto", false, &[]),
            ("types", false, &["proto"]),
        ]);
        assert_eq!(
            render(&g).unwrap(),
            "0  proto\n1  types       → proto\n2  core        → types\n3  app (bin)   → core, proto\n"
        );
    }

    #[test]
    fn a_cycle_is_an_error() {
        let g = graph(&[("a", false, &["b"]), ("b", false, &["a"])]);
        assert!(render(&g).is_err());
    }

    /// The architecture doc shows the crate graph of the Cargo files (item: docs match).
    #[test]
    fn architecture_doc_shows_the_cargo_crate_graph() {
        check(&crate::workspace_root()).unwrap();
    }
}
