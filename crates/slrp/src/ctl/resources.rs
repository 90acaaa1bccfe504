//! `slrp ctl resources`: the providers' Mesos resources read as storage pools and disks.
//!
//! What Mesos offers of a profile is the RAW resource with the profile and no
//! `disk.source.id` (Mesos's `isStoragePool`); the disks are the resources with an id. Several
//! profiles can draw on one CSI pool (their `pool` parameter in `GET /profiles`: standalone's
//! `block` and `ext4` both use `loop`), and each then gets a RAW resource sized to that
//! pool's whole remaining space. So a row is one CSI pool of one provider, listing its
//! profiles: **free** is that space counted once, **used** every disk of its profiles. A
//! profile without a `pool` parameter is a pool of its own. Counted per provider, since two
//! providers may have profiles (and pools) of the same name.

use std::collections::BTreeMap;

use serde_json::Value;
use slrp_provider::admin::api::ProfileSummary;

use super::table::{cells, or_dash, rendered, several, table};

/// The CSI parameter naming the plugin's pool a profile draws on.
const POOL_PARAMETER: &str = "pool";

/// What a row groups: a CSI pool, or a profile that names none.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Group {
    Csi(String),
    Profile(String),
}

/// One CSI pool of one provider (or one profile that names no pool).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Pool {
    /// `provider_id.value`, when the resource has one.
    pub(crate) provider_id: Option<String>,
    /// The CSI pool (the profiles' `pool` parameter); `None` for a profile without one.
    pub(crate) pool: Option<String>,
    /// The disk profiles drawing on it, sorted.
    pub(crate) profiles: Vec<String>,
    /// MB (2^20 bytes) not yet given to a disk, counted once however many profiles offer
    /// it.
    pub(crate) free_mb: f64,
    /// MB in disks of its profiles.
    pub(crate) used_mb: f64,
    /// How many disks of its profiles there are.
    pub(crate) disks: usize,
}

impl Pool {
    /// Free plus used.
    pub(crate) fn total_mb(&self) -> f64 {
        self.free_mb + self.used_mb
    }
}

/// One disk resource with an id.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Disk {
    /// `disk.source.id`: the CSI volume id.
    pub(crate) id: String,
    /// `disk.source.type`: `RAW`, `MOUNT`, `BLOCK`, …
    pub(crate) kind: String,
    /// `disk.source.profile`, absent for a pre-existing volume offered without one.
    pub(crate) profile: Option<String>,
    /// `scalar.value`.
    pub(crate) mb: f64,
    /// `provider_id.value`.
    pub(crate) provider_id: Option<String>,
}

/// A pool being summed: the free space offered per profile, kept apart until the end so
/// that the profiles sharing the pool count it once.
#[derive(Default)]
struct Sum {
    free_by_profile: BTreeMap<String, f64>,
    used_mb: f64,
    disks: usize,
}

/// Pools (sorted by provider, then pool) and disks (in the order given) of `resources`,
/// grouped by the CSI pool `profiles` give each profile; resources without a
/// `disk.source` (not a provider's) are left out.
pub(crate) fn summarize(
    resources: &[Value],
    profiles: &[ProfileSummary],
) -> (Vec<Pool>, Vec<Disk>) {
    let pool_of: BTreeMap<&str, &str> = profiles
        .iter()
        .filter_map(|p| Some((p.name.as_str(), p.parameters.get(POOL_PARAMETER)?.as_str())))
        .collect();
    let mut pools: BTreeMap<(Option<String>, Group), Sum> = BTreeMap::new();
    let mut disks = Vec::new();
    for r in resources {
        let source = &r["disk"]["source"];
        if r["name"] != "disk" || !source.is_object() {
            continue;
        }
        let provider_id = r["provider_id"]["value"].as_str().map(str::to_owned);
        let profile = source["profile"].as_str().map(str::to_owned);
        let mb = r["scalar"]["value"].as_f64().unwrap_or(0.0);
        let id = source["id"].as_str();
        if let Some(profile) = &profile {
            let group = pool_of.get(profile.as_str()).map_or_else(
                || Group::Profile(profile.clone()),
                |pool| Group::Csi((*pool).to_owned()),
            );
            let sum = pools.entry((provider_id.clone(), group)).or_default();
            let free = sum.free_by_profile.entry(profile.clone()).or_insert(0.0);
            if id.is_some() {
                sum.used_mb += mb;
                sum.disks += 1;
            } else if source["type"] == "RAW" {
                *free += mb;
            }
        }
        if let Some(id) = id {
            disks.push(Disk {
                id: id.to_owned(),
                kind: source["type"].as_str().unwrap_or("?").to_owned(),
                profile,
                mb,
                provider_id,
            });
        }
    }
    let pools = pools
        .into_iter()
        .map(|((provider_id, group), sum)| Pool {
            provider_id,
            pool: match group {
                Group::Csi(pool) => Some(pool),
                Group::Profile(_) => None,
            },
            // Each profile is offered the same remaining space of the pool; the largest
            // offer stands for it should one profile's parameters get less.
            free_mb: sum.free_by_profile.values().copied().fold(0.0, f64::max),
            profiles: sum.free_by_profile.into_keys().collect(),
            used_mb: sum.used_mb,
            disks: sum.disks,
        })
        .collect();
    (pools, disks)
}

/// `[####......]`, `width` cells, `#` for the used share. Any use shows at least one `#`
/// and any free space at least one `.`, so that a nearly empty or nearly full pool is not
/// shown as exactly empty or full.
pub(crate) fn bar(used: f64, total: f64, width: usize) -> String {
    let filled = if total <= 0.0 || used <= 0.0 {
        0
    } else if used >= total {
        width
    } else {
        let share = used / total;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let cells = (share * width as f64).round() as usize;
        cells.clamp(1, width.saturating_sub(1))
    };
    format!("[{}{}]", "#".repeat(filled), ".".repeat(width - filled))
}

/// MB (2^20 bytes) in the largest binary unit that keeps the number at least 1, with one
/// decimal where it is not whole: `512MiB`, `1.5GiB`, `0B`.
pub(crate) fn human_mb(mb: f64) -> String {
    const UNITS: [(&str, f64); 5] = [
        ("PiB", 1_073_741_824.0),
        ("TiB", 1_048_576.0),
        ("GiB", 1024.0),
        ("MiB", 1.0),
        ("KiB", 1.0 / 1024.0),
    ];
    if mb <= 0.0 {
        return "0B".to_owned();
    }
    let (name, factor) = UNITS
        .iter()
        .find(|(_, f)| mb >= *f)
        .copied()
        .unwrap_or(("KiB", 1.0 / 1024.0));
    let value = mb / factor;
    let text = format!("{value:.1}");
    format!("{}{name}", text.strip_suffix(".0").unwrap_or(&text))
}

/// The human output of `slrp ctl resources`, the pools grouped as `profiles` say.
pub(crate) fn render(resources: &[Value], profiles: &[ProfileSummary]) -> String {
    let (pools, disks) = summarize(resources, profiles);
    let with = several(
        pools
            .iter()
            .map(|p| p.provider_id.as_deref().unwrap_or("-"))
            .chain(
                disks
                    .iter()
                    .map(|d| d.provider_id.as_deref().unwrap_or("-")),
            ),
    );
    let mut t = table(
        with,
        &[
            "POOL", "PROFILES", "USED", "FREE", "TOTAL", "DISKS", "USAGE",
        ],
    );
    for p in &pools {
        t.row(cells(
            with,
            &or_dash(p.provider_id.as_deref()),
            vec![
                or_dash(p.pool.as_deref()),
                p.profiles.join(","),
                human_mb(p.used_mb),
                human_mb(p.free_mb),
                human_mb(p.total_mb()),
                p.disks.to_string(),
                bar(p.used_mb, p.total_mb(), 20),
            ],
        ));
    }
    let mut out = rendered(&t, "no storage pools");
    out.push('\n');
    let mut t = table(with, &["DISK", "TYPE", "PROFILE", "SIZE"]);
    for d in &disks {
        t.row(cells(
            with,
            &or_dash(d.provider_id.as_deref()),
            vec![
                d.id.clone(),
                d.kind.clone(),
                or_dash(d.profile.as_deref()),
                human_mb(d.mb),
            ],
        ));
    }
    out.push_str(&rendered(&t, "no disks"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A provider resource in Mesos's JSON form, as `GET /resources` gives it.
    fn disk(provider: &str, kind: &str, profile: Option<&str>, id: Option<&str>, mb: f64) -> Value {
        let mut source = serde_json::json!({"type": kind, "vendor": "org.apache.mesos.csi.local"});
        if let Some(p) = profile {
            source["profile"] = p.into();
        }
        if let Some(id) = id {
            source["id"] = id.into();
        }
        serde_json::json!({
            "name": "disk",
            "type": "SCALAR",
            "scalar": {"value": mb},
            "disk": {"source": source},
            "provider_id": {"value": provider},
            "reservations": [{"type": "DYNAMIC", "role": "storage"}],
        })
    }

    /// `GET /profiles`'s entry of a profile drawing on CSI pool `pool` (none: no `pool`
    /// parameter).
    fn profile(name: &str, kind: &str, pool: Option<&str>) -> ProfileSummary {
        ProfileSummary {
            name: name.to_owned(),
            r#type: kind.to_owned(),
            fs_type: None,
            parameters: pool
                .map(|p| {
                    [
                        ("pool".to_owned(), p.to_owned()),
                        ("backend".to_owned(), p.to_owned()),
                    ]
                })
                .into_iter()
                .flatten()
                .collect(),
        }
    }

    /// (provider, pool, profiles, used, free, total, disks) of each pool.
    type PoolView<'a> = (&'a str, Option<&'a str>, Vec<&'a str>, f64, f64, f64, usize);

    fn view(pools: &[Pool]) -> Vec<PoolView<'_>> {
        pools
            .iter()
            .map(|p| {
                (
                    p.provider_id.as_deref().unwrap(),
                    p.pool.as_deref(),
                    p.profiles.iter().map(String::as_str).collect(),
                    p.used_mb,
                    p.free_mb,
                    p.total_mb(),
                    p.disks,
                )
            })
            .collect()
    }

    #[test]
    fn free_is_the_pool_and_used_the_disks_of_the_same_profile_and_provider() {
        let resources = vec![
            disk("p1", "RAW", Some("mount"), None, 3072.0),
            disk("p1", "MOUNT", Some("mount"), Some("v1"), 512.0),
            disk("p1", "MOUNT", Some("mount"), Some("v2"), 512.0),
            disk("p1", "RAW", Some("block"), None, 1024.0),
            // An unconverted disk of the profile still uses the pool's space.
            disk("p1", "RAW", Some("block"), Some("v3"), 1024.0),
            // Another provider's profile of the same name is another pool.
            disk("p2", "RAW", Some("mount"), None, 100.0),
            // A pre-existing volume without a profile belongs to no pool.
            disk("p1", "RAW", None, Some("old"), 64.0),
            // Not a provider's disk: no source.
            serde_json::json!({"name": "disk", "type": "SCALAR", "scalar": {"value": 9.0}}),
            serde_json::json!({"name": "cpus", "type": "SCALAR", "scalar": {"value": 4.0}}),
        ];
        // No profile names a CSI pool: each is a pool of its own.
        let (pools, disks) = summarize(&resources, &[]);
        assert_eq!(
            view(&pools),
            vec![
                ("p1", None, vec!["block"], 1024.0, 1024.0, 2048.0, 1),
                ("p1", None, vec!["mount"], 1024.0, 3072.0, 4096.0, 2),
                ("p2", None, vec!["mount"], 0.0, 100.0, 100.0, 0),
            ]
        );
        let ids: Vec<_> = disks.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["v1", "v2", "v3", "old"]);
        assert_eq!(disks[3].profile, None);
        assert_eq!(disks[2].kind, "RAW");
    }

    /// Standalone's profiles: `mount` on pool `dir`, `block` and `ext4` both on `loop`.
    /// Mesos offers `block` and `ext4` each the whole remaining 2 GiB of `loop`; the row of
    /// `loop` counts it once and adds the disks of both.
    #[test]
    fn profiles_sharing_a_csi_pool_are_one_row_with_its_free_space_counted_once() {
        let profiles = [
            profile("mount", "mount", Some("dir")),
            profile("block", "block", Some("loop")),
            profile("ext4", "mount", Some("loop")),
        ];
        let resources = vec![
            disk("p1", "RAW", Some("mount"), None, 4096.0),
            disk("p1", "RAW", Some("block"), None, 2048.0),
            disk("p1", "RAW", Some("ext4"), None, 2048.0),
            disk("p1", "BLOCK", Some("block"), Some("b1"), 512.0),
            disk("p1", "MOUNT", Some("ext4"), Some("e1"), 1024.0),
        ];
        let (pools, disks) = summarize(&resources, &profiles);
        assert_eq!(
            view(&pools),
            vec![
                ("p1", Some("dir"), vec!["mount"], 0.0, 4096.0, 4096.0, 0),
                (
                    "p1",
                    Some("loop"),
                    vec!["block", "ext4"],
                    1536.0,
                    2048.0,
                    3584.0,
                    2
                ),
            ]
        );
        assert_eq!(disks.len(), 2);
        // The pool is exactly full: no RAW offer is left, the disks still count.
        let full = vec![
            disk("p1", "BLOCK", Some("block"), Some("b1"), 512.0),
            disk("p1", "MOUNT", Some("ext4"), Some("e1"), 1024.0),
        ];
        let (pools, _) = summarize(&full, &profiles);
        assert_eq!(
            view(&pools),
            vec![(
                "p1",
                Some("loop"),
                vec!["block", "ext4"],
                1536.0,
                0.0,
                1536.0,
                2
            )]
        );
        let text = render(&resources, &profiles);
        assert!(
            text.starts_with(
                "POOL  PROFILES    USED    FREE  TOTAL   DISKS  USAGE\n\
                 dir   mount       0B      4GiB  4GiB    0      [....................]\n\
                 loop  block,ext4  1.5GiB  2GiB  3.5GiB  2      [#########...........]\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn the_bar_shows_the_used_share() {
        assert_eq!(bar(1024.0, 4096.0, 12), "[###.........]");
        assert_eq!(bar(0.0, 4096.0, 4), "[....]");
        assert_eq!(bar(4096.0, 4096.0, 4), "[####]");
        assert_eq!(bar(1.0, 4096.0, 4), "[#...]");
        assert_eq!(bar(4095.0, 4096.0, 4), "[###.]");
        assert_eq!(bar(0.0, 0.0, 4), "[....]");
    }

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(human_mb(512.0), "512MiB");
        assert_eq!(human_mb(1536.0), "1.5GiB");
        assert_eq!(human_mb(4096.0), "4GiB");
        assert_eq!(human_mb(0.5), "512KiB");
        assert_eq!(human_mb(0.0), "0B");
        assert_eq!(human_mb(2.0 * 1_048_576.0), "2TiB");
    }

    #[test]
    fn the_table_has_one_row_per_pool_then_the_disks() {
        let resources = vec![
            disk("p1", "RAW", Some("mount"), None, 3072.0),
            disk("p1", "MOUNT", Some("mount"), Some("v1"), 1024.0),
        ];
        let text = render(&resources, &[profile("mount", "mount", Some("dir"))]);
        assert_eq!(
            text,
            "POOL  PROFILES  USED  FREE  TOTAL  DISKS  USAGE\n\
             dir   mount     1GiB  3GiB  4GiB   1      [#####...............]\n\
             \n\
             DISK  TYPE   PROFILE  SIZE\n\
             v1    MOUNT  mount    1GiB\n"
        );
        let two = vec![
            disk("p1", "RAW", Some("mount"), None, 3072.0),
            disk("p2", "RAW", Some("mount"), None, 1024.0),
        ];
        let text = render(&two, &[]);
        assert!(text.starts_with("PROVIDER  POOL  PROFILES"), "{text}");
        assert!(text.ends_with("no disks\n"), "{text}");
        assert_eq!(render(&[], &[]), "no storage pools\n\nno disks\n");
    }
}
