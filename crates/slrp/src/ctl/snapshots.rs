//! `slrp ctl snapshot`, `snapshots` and `delete-snapshot`: their human output.

use std::time::{Duration, UNIX_EPOCH};

use slrp_provider::admin::api::SnapshotSummary;

use super::table::{cells, rendered, several, table};
use super::{bytes_to_mb, resources};

/// When a snapshot was taken, as RFC 3339 UTC to the second.
fn taken_at(secs: i64) -> String {
    u64::try_from(secs).map_or_else(
        |_| "-".to_owned(),
        |s| humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(s)).to_string(),
    )
}

fn state(s: &SnapshotSummary) -> String {
    if s.deleting {
        "deleting".to_owned()
    } else if s.delete_failed.is_some() {
        "delete failed".to_owned()
    } else if s.ready_to_use {
        "ready".to_owned()
    } else {
        "not ready".to_owned()
    }
}

/// `snapshots [ID]`: one row per snapshot (of disk `of`, when given), then why a
/// deletion failed, if one did.
pub(super) fn snapshots_text(all: &[SnapshotSummary], of: Option<&str>) -> String {
    let shown: Vec<&SnapshotSummary> = all
        .iter()
        .filter(|s| of.is_none_or(|id| s.source_volume_id == id))
        .collect();
    let with = several(shown.iter().map(|s| s.provider.as_str()));
    let mut t = table(
        with,
        &["SNAPSHOT", "NAME", "DISK", "SIZE", "CREATED", "STATE"],
    );
    for s in &shown {
        t.row(cells(
            with,
            &s.provider,
            vec![
                s.snapshot_id.clone(),
                s.name.clone(),
                s.source_volume_id.clone(),
                resources::human_mb(bytes_to_mb(s.size_bytes)),
                taken_at(s.created_at),
                state(s),
            ],
        ));
    }
    let mut text = rendered(
        &t,
        &of.map_or_else(
            || "no snapshots".to_owned(),
            |id| format!("no snapshots of {id}"),
        ),
    );
    for s in &shown {
        if let Some(why) = &s.delete_failed {
            text.push_str(&format!(
                "{}: the last deletion failed: {why}\n",
                s.snapshot_id
            ));
        }
    }
    text
}

/// The line `resources` ends with when there are snapshots: their space is out of
/// their disks' pools (the pools' FREE no longer counts it) and in no disk.
pub(super) fn space_text(all: &[SnapshotSummary]) -> String {
    if all.is_empty() {
        return String::new();
    }
    #[allow(clippy::cast_precision_loss)]
    let mb = all.iter().map(|s| s.size_bytes).sum::<u64>() as f64 / 1_048_576.0;
    format!(
        "\nsnapshots: {} holding {} of their disks' pools (`slrp ctl snapshots`)\n",
        all.len(),
        resources::human_mb(mb)
    )
}

/// `snapshot ID`'s answer.
pub(super) fn taken_text(s: &SnapshotSummary) -> String {
    format!(
        "snapshot {} of disk {} ({}, name {})\n",
        s.snapshot_id,
        s.source_volume_id,
        resources::human_mb(bytes_to_mb(s.size_bytes)),
        s.name
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(id: &str, of: &str) -> SnapshotSummary {
        SnapshotSummary {
            provider: "io.slrp.csi.local.local".to_owned(),
            snapshot_id: id.to_owned(),
            name: format!("name-{id}"),
            source_volume_id: of.to_owned(),
            size_bytes: 64 << 20,
            created_at: 1_700_000_000,
            ready_to_use: true,
            deleting: false,
            delete_failed: None,
        }
    }

    #[test]
    fn the_table_filters_by_disk_and_says_why_a_deletion_failed() {
        let mut failed = snap("s2", "vol-b");
        failed.delete_failed = Some("DeleteSnapshot failed: busy".to_owned());
        let all = [snap("s1", "vol-a"), failed];
        let text = snapshots_text(&all, None);
        assert!(text.starts_with("SNAPSHOT"), "{text}");
        assert!(text.contains("s1") && text.contains("s2"), "{text}");
        assert!(text.contains("2023-11-14T22:13:20Z"), "{text}");
        assert!(text.contains("delete failed"), "{text}");
        assert!(
            text.ends_with("s2: the last deletion failed: DeleteSnapshot failed: busy\n"),
            "{text}"
        );
        let text = snapshots_text(&all, Some("vol-a"));
        assert!(text.contains("s1") && !text.contains("s2"), "{text}");
        assert_eq!(
            snapshots_text(&all, Some("vol-c")),
            "no snapshots of vol-c\n"
        );
        assert_eq!(
            taken_text(&all[0]),
            "snapshot s1 of disk vol-a (64MiB, name name-s1)\n"
        );
        assert_eq!(space_text(&[]), "");
        assert_eq!(
            space_text(&all),
            "\nsnapshots: 2 holding 128MiB of their disks' pools (`slrp ctl snapshots`)\n"
        );
    }
}
