//! The runbook's alerts (`docs/runbook.md`) name only metrics the service
//! exports, so an alert copied from it can fire.

use std::collections::BTreeSet;

/// Every `batcher_*` series in the runbook is one of the service's families
/// (or a histogram's `_bucket`, `_sum` or `_count`), and the runbook covers
/// the families its alerts rest on.
#[test]
fn the_runbook_names_only_metrics_the_service_exports() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/runbook.md");
    let text = std::fs::read_to_string(path).unwrap();
    let named: BTreeSet<&str> = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("batcher_"))
        .collect();
    let sinks = [
        batcher::metrics::sinks::SINK_DELIVERIES,
        batcher::metrics::sinks::SINK_RETRYING_KEYS,
    ];
    let families: Vec<&str> = batcher::metrics::FAMILIES
        .iter()
        .copied()
        .chain(sinks)
        .collect();
    let unknown: Vec<&&str> = named
        .iter()
        .filter(|name| {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            !families.contains(&base) && !families.contains(*name)
        })
        .collect();
    assert!(unknown.is_empty(), "not exported: {unknown:?}");
    for family in [
        batcher::metrics::REDIS_ERRORS,
        batcher::metrics::CONSUMER_LAG,
        batcher::metrics::DEAD_LETTERS,
        batcher::metrics::LIMITED_GROUPS,
        batcher::metrics::OPEN_GROUPS_LIMIT,
        batcher::metrics::FLUSH_LATENESS,
        batcher::metrics::REQUESTS,
        batcher::metrics::sinks::SINK_DELIVERIES,
    ] {
        assert!(
            named.iter().any(|n| n.starts_with(family)),
            "no alert on {family}"
        );
    }
}
