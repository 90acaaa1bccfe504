//! Fault injection for tests of the plugin's users (off unless `--faults-file` is given).
//!
//! The file holds a JSON array of rules (see `docs/csi-local.md`). It is read on every RPC,
//! so tests change faults by rewriting it. A rule with `times` is decremented *in the file*
//! (atomic rewrite) before it acts, so the count survives the plugin's own crash: an
//! `exit` rule with `times: 1` crashes the plugin once, not on every restart.
//!
//! Most rules act when an RPC arrives ([`Faults::take`]). A rule with `at` acts at a named
//! point inside the plugin's handling instead ([`Faults::take_at`]): `"at": "copy"` exits
//! in the middle of the data copy of CreateSnapshot or of a CreateVolume from a source,
//! which is how the tests show that a crash there leaves nothing half-made.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::store;
use crate::types::VolumeInfo;
use slrp_types::{DisplayChain, parse_code};

/// Points inside an RPC where an `at` rule can act, with the RPCs that have them.
const POINTS: &[(&str, &[&str])] = &[("copy", &["CreateSnapshot", "CreateVolume"])];

/// Every RPC name of CSI v0 and v1 services, as in the service definitions.
const RPC_NAMES: &[&str] = &[
    "GetPluginInfo",
    "GetPluginCapabilities",
    "Probe",
    "CreateVolume",
    "DeleteVolume",
    "ControllerPublishVolume",
    "ControllerUnpublishVolume",
    "ValidateVolumeCapabilities",
    "ListVolumes",
    "GetCapacity",
    "ControllerGetCapabilities",
    "CreateSnapshot",
    "DeleteSnapshot",
    "ListSnapshots",
    "GetSnapshot",
    "ControllerExpandVolume",
    "ControllerGetVolume",
    "ControllerModifyVolume",
    "NodeStageVolume",
    "NodeUnstageVolume",
    "NodePublishVolume",
    "NodeUnpublishVolume",
    "NodeGetVolumeStats",
    "NodeExpandVolume",
    "NodeGetCapabilities",
    "NodeGetInfo",
    "NodeGetId",
];

/// One rule of the faults file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rule {
    rpc: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    delay_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fail: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    exit: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    times: Option<u64>,
    /// ListVolumes only: every entry of the page is listed twice (a non-conforming plugin,
    /// Mesos's RecoverDuplicatedVolumes).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    duplicate_entries: bool,
    /// ListVolumes only: the listed volumes report this context instead of their own (a
    /// plugin whose metadata changed, Mesos's RecoverDiskWithChangedMetadata).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    volume_context: Option<BTreeMap<String, String>>,
    /// With `volume_context`: only this volume's context is replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    volume_id: Option<String>,
    /// With `exit`: exit at this point inside the RPC (see [`POINTS`]) instead of when it
    /// arrives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    at: Option<String>,
}

impl Rule {
    fn edits_listing(&self) -> bool {
        self.duplicate_entries || self.volume_context.is_some() || self.volume_id.is_some()
    }
}

/// How a ListVolumes answer is altered before it is sent (nothing by default). The
/// plugin's records are never changed: only what this one answer reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListEdit {
    /// List every entry twice, each copy right after its original.
    pub duplicate_entries: bool,
    /// Report this context for the selected volumes.
    pub volume_context: Option<BTreeMap<String, String>>,
    /// Select only this volume (`None`: all of them).
    pub volume_id: Option<String>,
}

impl ListEdit {
    /// Applies the edit to one ListVolumes page.
    pub fn apply(&self, entries: Vec<VolumeInfo>) -> Vec<VolumeInfo> {
        let mut out = Vec::with_capacity(entries.len() * 2);
        for mut e in entries {
            if let Some(ctx) = &self.volume_context
                && self
                    .volume_id
                    .as_deref()
                    .is_none_or(|want| want == e.volume_id)
            {
                e.volume_context = ctx.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            }
            if self.duplicate_entries {
                out.push(e.clone());
            }
            out.push(e);
        }
        out
    }
}

/// What to do with an RPC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Handle it normally after `delay`, then alter a ListVolumes answer by `edit`.
    Proceed {
        /// Sleep first.
        delay: Option<Duration>,
        /// What to change in a ListVolumes answer (default for every other RPC).
        edit: ListEdit,
    },
    /// Fail it with this status after `delay`.
    Fail {
        /// Sleep first.
        delay: Option<Duration>,
        /// Status code.
        code: tonic::Code,
        /// Status message.
        message: String,
    },
    /// Exit the process (status 1) after `delay`, without replying.
    Exit {
        /// Sleep first.
        delay: Option<Duration>,
    },
}

/// Why a faults file was ignored.
#[derive(Debug, thiserror::Error)]
enum RulesError {
    #[error("not a JSON array of rules")]
    Json(#[source] serde_json::Error),
    #[error("rule {index}: {reason}")]
    Rule { index: usize, reason: String },
}

fn parse_rules(data: &[u8]) -> Result<Vec<Rule>, RulesError> {
    let rules: Vec<Rule> = serde_json::from_slice(data).map_err(RulesError::Json)?;
    for (index, r) in rules.iter().enumerate() {
        let bad = |reason: String| RulesError::Rule { index, reason };
        if r.rpc != "*" && !RPC_NAMES.contains(&r.rpc.as_str()) {
            return Err(bad(format!("unknown rpc {:?}", r.rpc)));
        }
        if let Some(f) = &r.fail {
            match parse_code(f) {
                None => return Err(bad(format!("unknown gRPC code {f:?}"))),
                Some(tonic::Code::Ok) => return Err(bad("fail cannot be OK".to_owned())),
                Some(_) => {}
            }
        }
        if r.fail.is_some() && r.exit {
            return Err(bad("fail and exit exclude each other".to_owned()));
        }
        if r.edits_listing() {
            if r.rpc != "ListVolumes" {
                return Err(bad(
                    "duplicate_entries, volume_context and volume_id apply to ListVolumes only"
                        .to_owned(),
                ));
            }
            if r.fail.is_some() || r.exit {
                return Err(bad(
                    "a ListVolumes edit answers the call: it excludes fail and exit".to_owned(),
                ));
            }
            if r.volume_id.is_some() && r.volume_context.is_none() {
                return Err(bad(
                    "volume_id selects whose volume_context is replaced: give volume_context"
                        .to_owned(),
                ));
            }
        }
        if let Some(at) = &r.at {
            let Some((_, rpcs)) = POINTS.iter().find(|(p, _)| p == at) else {
                return Err(bad(format!(
                    "unknown point {at:?} (known: {:?})",
                    POINTS.iter().map(|(p, _)| *p).collect::<Vec<_>>()
                )));
            };
            if !rpcs.contains(&r.rpc.as_str()) {
                return Err(bad(format!(
                    "{} has no point {at:?} (only {rpcs:?})",
                    r.rpc
                )));
            }
            if !r.exit || r.delay_ms.is_some() {
                return Err(bad("at takes exit, and nothing else".to_owned()));
            }
        }
        if r.fail.is_none() && !r.exit && r.delay_ms.is_none() && !r.edits_listing() {
            return Err(bad(
                "no action: give delay_ms, fail, exit or a ListVolumes edit".to_owned(),
            ));
        }
    }
    Ok(rules)
}

/// The fault-injection source. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Faults {
    path: Option<PathBuf>,
    /// Serializes read-decrement-rewrite so concurrent RPCs never lose a count, and
    /// remembers the last malformed content so it is logged once, not per RPC.
    last_bad: Mutex<Option<Vec<u8>>>,
}

impl Faults {
    /// Faults from `path`, or none.
    pub fn new(path: Option<PathBuf>) -> Self {
        Self {
            path,
            last_bad: Mutex::new(None),
        }
    }

    /// Decides what to do with a call of `rpc`, consuming one use of a counted rule.
    /// Blocking (reads and may rewrite the file). Rules with `at` are not considered.
    pub fn take(&self, rpc: &str) -> Fault {
        let proceed = Fault::Proceed {
            delay: None,
            edit: ListEdit::default(),
        };
        let Some(rule) = self.consume(|r| r.at.is_none() && (r.rpc == "*" || r.rpc == rpc)) else {
            return proceed;
        };
        tracing::info!(rpc, rule = ?rule, "injecting fault");
        let delay = rule.delay_ms.map(Duration::from_millis);
        if rule.exit {
            return Fault::Exit { delay };
        }
        match rule.fail.as_deref().and_then(parse_code) {
            Some(code) => Fault::Fail {
                delay,
                code,
                message: rule
                    .message
                    .unwrap_or_else(|| format!("injected fault for {rpc}")),
            },
            None => Fault::Proceed {
                delay,
                edit: ListEdit {
                    duplicate_entries: rule.duplicate_entries,
                    volume_context: rule.volume_context,
                    volume_id: rule.volume_id,
                },
            },
        }
    }

    /// Whether the plugin should exit at `point` of `rpc` (an `at` rule), consuming one use
    /// of a counted rule. Blocking, like [`Faults::take`].
    pub fn take_at(&self, rpc: &str, point: &str) -> bool {
        let found = self.consume(|r| r.rpc == rpc && r.at.as_deref() == Some(point));
        if let Some(rule) = &found {
            tracing::info!(rpc, point, rule = ?rule, "injecting fault");
        }
        found.is_some_and(|r| r.exit)
    }

    /// The first rule that `matches` and has uses left, after recording its use in the
    /// file (a counted rule is decremented, and removed at zero).
    fn consume(&self, matches: impl Fn(&Rule) -> bool) -> Option<Rule> {
        let path = self.path.as_ref()?;
        let mut last_bad = self
            .last_bad
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let data = match std::fs::read(path) {
            Ok(d) => d,
            // No file means no faults: tests create it when they want some.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::error!(path = %path.display(), error = %slrp_types::DisplayChain(&e), "cannot read faults file; no faults injected");
                return None;
            }
        };
        let mut rules = match parse_rules(&data) {
            Ok(r) => r,
            Err(e) => {
                if last_bad.as_deref() != Some(data.as_slice()) {
                    tracing::error!(path = %path.display(), error = %DisplayChain(&e), "ignoring malformed faults file");
                    *last_bad = Some(data);
                }
                return None;
            }
        };
        let idx = rules
            .iter()
            .position(|r| matches(r) && r.times.is_none_or(|t| t > 0))?;
        let rule = rules[idx].clone();
        if let Some(t) = rule.times {
            if t <= 1 {
                rules.remove(idx);
            } else {
                rules[idx].times = Some(t - 1);
            }
            if let Err(e) = rewrite(path, &rules) {
                // Acting without recording the use could repeat a crash forever.
                tracing::error!(path = %path.display(), error = %DisplayChain(&e), "cannot update faults file; rule not applied");
                return None;
            }
        }
        Some(rule)
    }
}

fn rewrite(path: &Path, rules: &[Rule]) -> Result<(), store::StoreError> {
    let data = serde_json::to_vec_pretty(rules).map_err(|source| store::StoreError::Decode {
        path: path.to_owned(),
        source,
    })?;
    store::write_atomic(path, &data)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn proceed(delay: Option<Duration>) -> Fault {
        Fault::Proceed {
            delay,
            edit: ListEdit::default(),
        }
    }

    fn faults(content: &str) -> (tempfile::TempDir, PathBuf, Faults) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("faults.json");
        std::fs::write(&path, content).unwrap();
        let f = Faults::new(Some(path.clone()));
        (dir, path, f)
    }

    #[test]
    fn counted_rules_are_decremented_in_the_file() {
        let (_d, path, f) = faults(
            r#"[{"rpc":"CreateVolume","fail":"UNAVAILABLE","times":2},{"rpc":"*","delay_ms":5}]"#,
        );
        let fail = Fault::Fail {
            delay: None,
            code: tonic::Code::Unavailable,
            message: "injected fault for CreateVolume".into(),
        };
        assert_eq!(f.take("CreateVolume"), fail);
        let left: Vec<Rule> = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(left[0].times, Some(1));
        assert_eq!(f.take("CreateVolume"), fail);
        let delayed = proceed(Some(Duration::from_millis(5)));
        assert_eq!(f.take("CreateVolume"), delayed);
        assert_eq!(f.take("Probe"), delayed);
        let left: Vec<Rule> = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(left.len(), 1);
    }

    #[test]
    fn first_matching_rule_wins_and_exit_is_reported() {
        let (_d, _p, f) = faults(
            r#"[{"rpc":"NodeStageVolume","exit":true,"delay_ms":1},{"rpc":"NodeStageVolume","fail":"INTERNAL","message":"boom"}]"#,
        );
        assert_eq!(
            f.take("NodeStageVolume"),
            Fault::Exit {
                delay: Some(Duration::from_millis(1))
            }
        );
        assert_eq!(f.take("Probe"), proceed(None));
    }

    #[test]
    fn malformed_or_missing_files_inject_nothing() {
        for bad in [
            "{",
            r#"{"rpc":"Probe"}"#,
            r#"[{"rpc":"Prob","fail":"INTERNAL"}]"#,
            r#"[{"rpc":"Probe","fail":"EXPLODED"}]"#,
            r#"[{"rpc":"Probe","fail":"OK"}]"#,
            r#"[{"rpc":"Probe"}]"#,
            r#"[{"rpc":"Probe","fail":"INTERNAL","exit":true}]"#,
            r#"[{"rpc":"Probe","fail":"INTERNAL","colour":1}]"#,
            r#"[{"rpc":"GetCapacity","duplicate_entries":true}]"#,
            r#"[{"rpc":"*","volume_context":{"label":"bar"}}]"#,
            r#"[{"rpc":"ListVolumes","duplicate_entries":true,"fail":"INTERNAL"}]"#,
            r#"[{"rpc":"ListVolumes","volume_context":{},"exit":true}]"#,
            r#"[{"rpc":"ListVolumes","volume_id":"v1"}]"#,
            r#"[{"rpc":"CreateSnapshot","exit":true,"at":"mkfs"}]"#,
            r#"[{"rpc":"Probe","exit":true,"at":"copy"}]"#,
            r#"[{"rpc":"*","exit":true,"at":"copy"}]"#,
            r#"[{"rpc":"CreateSnapshot","fail":"INTERNAL","at":"copy"}]"#,
            r#"[{"rpc":"CreateSnapshot","exit":true,"delay_ms":1,"at":"copy"}]"#,
        ] {
            let (_d, _p, f) = faults(bad);
            assert_eq!(f.take("Probe"), proceed(None), "{bad}");
        }
        let f = Faults::new(Some(PathBuf::from("/nonexistent/faults.json")));
        assert_eq!(f.take("Probe"), proceed(None));
        assert_eq!(Faults::new(None).take("Probe"), proceed(None));
    }

    #[test]
    fn point_rules_act_only_at_their_point() {
        let (_d, path, f) = faults(
            r#"[{"rpc":"CreateSnapshot","exit":true,"at":"copy","times":1},{"rpc":"CreateVolume","exit":true,"at":"copy"}]"#,
        );
        // Not when the RPC arrives, and not at another RPC's point.
        assert_eq!(f.take("CreateSnapshot"), proceed(None));
        assert!(!f.take_at("DeleteSnapshot", "copy"));
        assert!(f.take_at("CreateSnapshot", "copy"));
        assert!(!f.take_at("CreateSnapshot", "copy"), "used up");
        let left: Vec<Rule> = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(left.len(), 1);
        assert!(f.take_at("CreateVolume", "copy"));
        assert!(f.take_at("CreateVolume", "copy"), "not counted: every time");
        assert!(!Faults::new(None).take_at("CreateVolume", "copy"));
    }

    #[test]
    fn every_grpc_code_name_parses() {
        for (name, code) in [
            ("UNAVAILABLE", tonic::Code::Unavailable),
            ("DEADLINE_EXCEEDED", tonic::Code::DeadlineExceeded),
            ("RESOURCE_EXHAUSTED", tonic::Code::ResourceExhausted),
            ("UNAUTHENTICATED", tonic::Code::Unauthenticated),
        ] {
            assert_eq!(parse_code(name), Some(code));
        }
        assert_eq!(parse_code("unavailable"), None);
    }

    #[test]
    fn list_edits_are_returned_for_list_volumes_and_off_by_default() {
        let (_d, _p, f) = faults(
            r#"[{"rpc":"ListVolumes","duplicate_entries":true,"volume_context":{"label":"bar"},"volume_id":"b","times":1}]"#,
        );
        let Fault::Proceed { delay: None, edit } = f.take("ListVolumes") else {
            panic!("a ListVolumes edit proceeds");
        };
        assert_eq!(
            edit,
            ListEdit {
                duplicate_entries: true,
                volume_context: Some(BTreeMap::from([("label".into(), "bar".into())])),
                volume_id: Some("b".into()),
            }
        );
        // Counted like any rule, then gone.
        assert_eq!(f.take("ListVolumes"), proceed(None));
    }

    #[test]
    fn list_edit_duplicates_and_overrides_the_selected_contexts() {
        let volume = |id: &str| VolumeInfo {
            volume_id: id.into(),
            capacity_bytes: 1 << 30,
            volume_context: HashMap::from([("label".to_owned(), "foo".to_owned())]),
            content_source: None,
            condition: None,
            published_node_ids: Vec::new(),
        };
        let page = || vec![volume("a"), volume("b")];
        assert_eq!(ListEdit::default().apply(page()), page());

        let dup = ListEdit {
            duplicate_entries: true,
            ..ListEdit::default()
        };
        let ids: Vec<String> = dup.apply(page()).into_iter().map(|e| e.volume_id).collect();
        assert_eq!(ids, ["a", "a", "b", "b"]);

        let bar = HashMap::from([("label".to_owned(), "bar".to_owned())]);
        let all = ListEdit {
            volume_context: Some(BTreeMap::from([("label".into(), "bar".into())])),
            ..ListEdit::default()
        };
        let got = all.apply(page());
        assert!(got.iter().all(|e| e.volume_context == bar), "{got:?}");

        let only_b = ListEdit {
            volume_id: Some("b".into()),
            ..all.clone()
        };
        let got = only_b.apply(page());
        assert_eq!(got[0], page()[0]);
        assert_eq!(got[1].volume_context, bar);

        let cleared = ListEdit {
            volume_context: Some(BTreeMap::new()),
            ..ListEdit::default()
        };
        assert!(
            cleared
                .apply(page())
                .iter()
                .all(|e| e.volume_context.is_empty())
        );
    }
}
