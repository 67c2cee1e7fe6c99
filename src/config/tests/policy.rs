//! Tests of the logistics fields of the policy tables: `max_idle`,
//! `capacity`, `cutoffs`, `timezone`, `deadline_lead`, `min_items` and
//! `max_age`, how a key table merges over `[defaults]`, the rules checked
//! on each merged table, the limits on open groups (`max_groups`,
//! `overflow`), and the logistics and delayed-queue config examples of
//! docs/policies.md.

use std::sync::Arc;

use super::*;
use crate::policy::Overflow;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Ms since the epoch of an RFC 3339 instant.
fn ms(instant: &str) -> u64 {
    let at: jiff::Timestamp = instant.parse().unwrap();
    u64::try_from(at.as_millisecond()).unwrap()
}

const ALL_FIELDS: &str = r#"
[defaults]
max_items = 40
max_wait = "2h"
max_idle = "20m"
capacity = { weight_g = 24000000, volume_cm3 = 80000000 }
cutoffs = ["17:45:30", "11:30"]
timezone = "Europe/Berlin"
deadline_lead = "45m"
min_items = 5
max_age = "6h"

[keys."north-*"]                 # sets every field: nothing comes from [defaults]
max_idle = "5m"
capacity = { weight_g = 1000 }
cutoffs = ["06:00"]
timezone = "America/New_York"
deadline_lead = "0s"
min_items = 0
max_age = "3h"

[keys."south-*"]                 # only the zone: the default cutoffs, read in Tokyo
timezone = "Asia/Tokyo"

[keys."east"]                    # sets nothing
"#;

/// Every new field parses in `[defaults]` and becomes the defaults' policy.
#[test]
fn defaults_parse_to_policy() {
    let c = parse(ALL_FIELDS).unwrap();
    let d = &c.defaults;
    assert_eq!(d.max_idle, Some(secs(20 * 60)));
    assert_eq!(d.capacity["weight_g"], 24_000_000);
    assert_eq!(d.timezone.name(), "Europe/Berlin");
    assert_eq!(d.cutoffs.as_ref().unwrap().times().len(), 2);
    let p = c.policies().defaults();
    assert_eq!(p.max_items, 40);
    assert_eq!(p.max_wait, secs(2 * 3600));
    assert_eq!(p.max_idle, Some(secs(20 * 60)));
    let capacity = BTreeMap::from([
        ("volume_cm3".to_owned(), 80_000_000),
        ("weight_g".to_owned(), 24_000_000),
    ]);
    assert_eq!(p.capacity, Arc::new(capacity));
    assert_eq!(p.deadline_lead, secs(45 * 60));
    assert_eq!(p.min_items, 5);
    assert_eq!(p.max_age, Some(secs(6 * 3600)));
    let cutoffs = p.cutoffs.expect("cutoffs");
    assert_eq!(cutoffs.zone(), "Europe/Berlin");
    // 11:30 and 17:45:30 CEST are 09:30 and 15:45:30 UTC.
    assert_eq!(
        cutoffs.next_after(ms("2026-07-01T09:00:00Z")),
        ms("2026-07-01T09:30:00Z")
    );
    assert_eq!(
        cutoffs.next_after(ms("2026-07-01T09:30:00Z")),
        ms("2026-07-01T15:45:30Z")
    );
}

/// A key table's fields override the defaults' one by one; unset ones fall
/// back, and cutoffs from `[defaults]` are read in the key table's zone.
#[test]
fn key_tables_override_and_fall_back() {
    let c = parse(ALL_FIELDS).unwrap();
    let p = c.policies();
    let north = p.resolve("north-1");
    assert_eq!(north.max_items, 40);
    assert_eq!(north.max_idle, Some(secs(5 * 60)));
    let capacity = BTreeMap::from([("weight_g".to_owned(), 1000)]);
    assert_eq!(
        north.capacity,
        Arc::new(capacity),
        "capacity is replaced whole"
    );
    assert_eq!(north.deadline_lead, Duration::ZERO);
    assert_eq!(north.min_items, 0);
    assert_eq!(north.max_age, Some(secs(3 * 3600)));
    let cutoffs = north.cutoffs.expect("cutoffs");
    assert_eq!(cutoffs.zone(), "America/New_York");
    // 06:00 EDT = 10:00 UTC.
    assert_eq!(
        cutoffs.next_after(ms("2026-07-01T00:00:00Z")),
        ms("2026-07-01T10:00:00Z")
    );

    let south = p.resolve("south-1");
    let cutoffs = south.cutoffs.clone().expect("cutoffs");
    assert_eq!(cutoffs.zone(), "Asia/Tokyo");
    // 11:30 JST (+09:00, no DST) = 02:30 UTC.
    assert_eq!(
        cutoffs.next_after(ms("2026-07-01T00:00:00Z")),
        ms("2026-07-01T02:30:00Z")
    );
    let defaults = p.defaults();
    assert_eq!(
        Policy {
            cutoffs: defaults.cutoffs.clone(),
            ..south
        },
        defaults,
        "south differs from [defaults] only in its zone"
    );
    assert_eq!(p.resolve("east"), defaults);
}

/// Without the new fields a policy has none of them: no idle flush, no
/// capacity, no cutoffs (zone UTC), no lead, no minimum, no maximum age;
/// the zone alone, without cutoffs, is accepted and sets none.
#[test]
fn new_fields_default_to_off() {
    let d = parse("").unwrap().defaults;
    assert_eq!(d.timezone.name(), DEFAULT_TIMEZONE);
    assert_eq!(d.timezone, TimeZoneName::default());
    assert_eq!(d.deadline_lead, DEFAULT_DEADLINE_LEAD);
    assert_eq!(d.min_items, DEFAULT_MIN_ITEMS);
    let p = Policy::default();
    assert_eq!(p, Policy::basic(10, secs(240), None));
    let c = parse("[defaults]\ntimezone = \"Europe/Berlin\"\n[keys.\"a\"]\ntimezone = \"UTC\"\n");
    let p = c.unwrap().policies();
    assert_eq!(p.defaults().cutoffs, None);
    assert_eq!(p.resolve("a"), Policy::default());
}

/// Capacity names must be measure names, at most 64 of them, and values 1 to 2^53 - 1.
#[test]
fn capacity_rules() {
    let max = (1u64 << 53) - 1;
    let c = parse(&format!(
        "[keys.\"a\"]\ncapacity = {{ \"w.g-1_x\" = {max} }}\n"
    ))
    .unwrap();
    assert_eq!(c.policies().resolve("a").capacity["w.g-1_x"], max);
    let long = "x".repeat(65);
    let many: Vec<String> = (0..65).map(|k| format!("m{k} = 1")).collect();
    let many = many.join(", ");
    let cases = [
        (
            "[defaults]\ncapacity = { \"weight g\" = 5 }\n".to_owned(),
            "batcher.toml: [defaults] capacity: \"weight g\" is not a measure name: use 1 to 64 \
             of A-Z a-z 0-9 _ - . (line 2, column 1)"
                .to_owned(),
        ),
        (
            format!("[defaults]\ncapacity = {{ {long} = 5 }}\n"),
            "[defaults] capacity: \"xxxx".to_owned(),
        ),
        (
            "[keys.\"a\"]\ncapacity = { \"\" = 5 }\n".to_owned(),
            "[keys.\"a\"] capacity: \"\" is not a measure name".to_owned(),
        ),
        (
            "[keys.\"a\"]\nmax_items = 3\ncapacity = { weight_g = 0 }\n".to_owned(),
            format!("[keys.\"a\"] capacity: weight_g: must be between 1 and {max}, got 0 (line 3"),
        ),
        (
            format!("[defaults]\ncapacity = {{ weight_g = {} }}\n", max + 1),
            format!(
                "[defaults] capacity: weight_g: must be between 1 and {max}, got {}",
                max + 1
            ),
        ),
        (
            format!("[defaults]\ncapacity = {{ {many} }}\n"),
            "[defaults] capacity: names 65 measures, more than the 64 allowed (line 2".to_owned(),
        ),
        (
            "[defaults]\ncapacity = { weight_g = -1 }\n".to_owned(),
            // serde names the measure as a field of the capacity table.
            "[defaults.capacity] weight_g: invalid value: integer `-1`, expected u64 (line 2"
                .to_owned(),
        ),
    ];
    assert_rejected(&cases);
}

/// Cutoffs must be times of day and not an empty list; the zone must be a
/// known IANA name. Each error names the table, the field and the line.
#[test]
fn cutoff_and_timezone_rules() {
    assert_rejected(&[
        (
            "[defaults]\ncutoffs = [\"11:30\", \"25:00\"]\n",
            "batcher.toml: [defaults] cutoffs: \"25:00\" is not a time of day: \
             write HH:MM or HH:MM:SS (00:00 to 23:59:59) (line 2",
        ),
        (
            "[keys.\"a\"]\ncutoffs = [\"9:30\"]\n",
            "[keys.\"a\"] cutoffs: \"9:30\" is not a time of day",
        ),
        (
            "[defaults]\ncutoffs = [\"11:30:60\"]\n",
            "[defaults] cutoffs: \"11:30:60\" is not a time of day",
        ),
        (
            "[defaults]\ncutoffs = []\n",
            "[defaults] cutoffs: must list at least one time of day (leave cutoffs out for none) (line 2",
        ),
        (
            "[defaults]\ncutoffs = [1130]\n",
            "[defaults.cutoffs] 0: invalid type: integer `1130`, expected a string (line 2",
        ),
        (
            "[defaults]\ntimezone = \"Europe/Bärlin\"\n",
            "batcher.toml: [defaults] timezone: \"Europe/Bärlin\" is not a known IANA time zone (such",
        ),
        (
            "[keys.\"a\"]\ncutoffs = [\"11:30\"]\ntimezone = \"CEST\"\n",
            "[keys.\"a\"] timezone: \"CEST\" is not a known IANA time zone (such as \"Europe/Berlin\" or \"UTC\") (line 3",
        ),
    ]);
}

/// Durations are above 0 (`deadline_lead` may be 0) and at most 30 days.
#[test]
fn duration_rules() {
    let c = parse("[defaults]\ndeadline_lead = \"0s\"\n[keys.\"a\"]\nmax_age = \"30days\"\n");
    assert_eq!(c.unwrap().keys["a"].max_age, Some(MAX_WAIT_LIMIT));
    let mut cases = Vec::new();
    for (field, zero_ok) in [
        ("max_idle", false),
        ("max_age", false),
        ("deadline_lead", true),
    ] {
        for table in ["[defaults]", "[keys.\"a\"]"] {
            if !zero_ok {
                cases.push((
                    format!("{table}\n{field} = \"0s\"\n"),
                    format!(
                        "{table} {field}: must be greater than 0 and at most 30days, got 0s (line 2"
                    ),
                ));
            }
            let least = if zero_ok { "" } else { "greater than 0 and " };
            cases.push((
                format!("{table}\n{field} = \"31days\"\n"),
                format!(
                    "{table} {field}: must be {least}at most 30days, got 1month 13h 26m 24s (line 2"
                ),
            ));
        }
    }
    assert_rejected(&cases);
}

/// `min_items` needs `max_age` and at most `max_items`, and `max_age` is at
/// least `max_wait`, on the policy each table's keys get: a rule broken by
/// one field from `[defaults]` and one from a key table is caught too.
#[test]
fn merged_rules() {
    let ok = "[defaults]\nmin_items = 5\nmax_age = \"6h\"\n[keys.\"a\"]\nmax_items = 5\n";
    assert_eq!(parse(ok).unwrap().policies().resolve("a").min_items, 5);
    // A key table may turn the minimum off, and then needs no max_age.
    let off = "[defaults]\nmin_items = 5\nmax_age = \"6h\"\n[keys.\"a\"]\nmin_items = 0\n";
    assert_eq!(parse(off).unwrap().policies().resolve("a").min_items, 0);
    let needs = "needs max_age: a group held below min_items must still leave at some age \
                 (nothing may wait forever)";
    assert_rejected(&[
        (
            "[defaults]\nmin_items = 5\n",
            &format!(
                "batcher.toml: [defaults] min_items: min_items = 5 {needs} (line 2, column 1)"
            ),
        ),
        (
            "[keys.\"a\"]\nmax_wait = \"1m\"\nmin_items = 3\n",
            &format!("[keys.\"a\"] min_items: min_items = 3 {needs} (line 3"),
        ),
    ]);
    // min_items from [defaults], max_age only in one key table: the
    // defaults themselves break the rule.
    assert_rejected(&[(
        "[defaults]\nmin_items = 5\n[keys.\"a\"]\nmax_age = \"2h\"\n",
        &format!("[defaults] min_items: min_items = 5 {needs} (line 2"),
    )]);
    assert_rejected(&[
        (
            // A key table lowers max_items below the default minimum.
            "[defaults]\nmin_items = 5\nmax_age = \"1h\"\n[keys.\"b\"]\nmax_items = 4\n",
            "[keys.\"b\"] min_items: 5 (from [defaults]) must be at most max_items = 4 (line 4",
        ),
        (
            "[defaults]\nmax_items = 4\nmax_age = \"1h\"\nmin_items = 6\n",
            "[defaults] min_items: 6 must be at most max_items = 4 (line 4",
        ),
        (
            "[defaults]\nmax_age = \"1h\"\nmax_wait = \"2h\"\n",
            "[defaults] max_age: 1h must be at least max_wait = 2h (line 2",
        ),
        (
            // A key table's longer max_wait passes the defaults' max_age.
            "[defaults]\nmax_age = \"1h\"\n[keys.\"a\"]\nmax_wait = \"90m\"\n",
            "[keys.\"a\"] max_age: 1h (from [defaults]) must be at least max_wait = 1h 30m (line 3",
        ),
    ]);
}

/// `max_groups` and `overflow` parse in `[defaults]` and in key tables,
/// with `[limits] max_open_groups`; a table that leaves them unset takes
/// the defaults', and each glob's keys are counted apart from the
/// defaults' (an exact key, with at most one group, is not counted). Off
/// by default: no limit, and "refuse".
#[test]
fn open_group_limits_parse() {
    let c = parse(
        "[defaults]\nmax_groups = 1000\noverflow = \"flush_oldest\"\n\
         [keys.\"scan-*\"]\nmax_groups = 50\noverflow = \"refuse\"\n\
         [keys.\"east-*\"]\n\
         [keys.\"north\"]\n\
         [keys.\"west\"]\nmax_groups = 0\n\
         [limits]\nmax_open_groups = 100000\n",
    )
    .unwrap();
    assert_eq!(c.limits.max_open_groups, 100_000);
    assert_eq!(c.keys["scan-*"].max_groups, Some(50));
    assert_eq!(c.keys["scan-*"].overflow, Some(Overflow::Refuse));
    assert_eq!(c.keys["east-*"].overflow, None);
    let p = c.policies();
    let defaults = p.defaults();
    assert_eq!(
        (defaults.max_groups, defaults.overflow),
        (1000, Overflow::FlushOldest)
    );
    let scan = p.resolve("scan-1");
    assert_eq!((scan.max_groups, scan.overflow), (50, Overflow::Refuse));
    let east = p.resolve("east-1");
    assert_eq!(
        (east.max_groups, east.overflow),
        (1000, Overflow::FlushOldest)
    );
    let west = p.resolve("west");
    assert_eq!((west.max_groups, west.scope), (0, None), "no limit");
    assert_eq!(
        p.resolve("north").scope,
        None,
        "an exact key is not counted"
    );
    let scopes = [defaults.scope, scan.scope, east.scope];
    assert!(scopes.iter().all(Option::is_some), "{scopes:?}");
    assert!(
        scopes[0] != scopes[1] && scopes[0] != scopes[2] && scopes[1] != scopes[2],
        "each table counted apart: {scopes:?}"
    );
    let off = parse("").unwrap();
    assert_eq!(off.limits.max_open_groups, 0);
    let d = off.policies().defaults();
    assert_eq!((d.max_groups, d.overflow), (0, Overflow::Refuse));
    assert_eq!(Overflow::FlushOldest.as_str(), "flush_oldest");
}

/// A bad `overflow` or `max_groups` names the table, the field and the
/// line, and `overflow` says which names it takes.
#[test]
fn open_group_limit_errors_name_the_field() {
    assert_rejected(&[
        (
            "[defaults]\noverflow = \"sometimes\"\n",
            "batcher.toml: [defaults] overflow: unknown variant `sometimes`, \
             expected `refuse` or `flush_oldest` (line 2",
        ),
        (
            "[keys.\"a\"]\nmax_items = 3\noverflow = \"FLUSH_OLDEST\"\n",
            "[keys.\"a\"] overflow: unknown variant `FLUSH_OLDEST`",
        ),
        (
            "[keys.\"a\"]\noverflow = 1\n",
            "[keys.\"a\"] overflow: wanted string or table (line 2",
        ),
        (
            "[defaults]\nmax_groups = -1\n",
            "[defaults] max_groups: invalid value: integer `-1`, expected u32 (line 2",
        ),
        (
            "[limits]\nmax_open_groups = \"many\"\n",
            "[limits] max_open_groups: invalid type: string \"many\"",
        ),
    ]);
}

/// The first ```toml block after the heading `heading` of docs/policies.md.
fn policies_page_block(heading: &str) -> &'static str {
    let page = include_str!("../../../docs/policies.md");
    let start = page.find(heading).expect("the section of docs/policies.md");
    page[start..]
        .split("```toml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a toml block in the section")
}

/// The parcel-to-truck config of docs/policies.md parses to the policies
/// its worked example walks through: 24 t and 80 m³ trucks, two departures
/// a day in Berlin per area, and the plain defaults for other keys.
#[test]
fn documented_logistics_example_parses() {
    let c = parse(policies_page_block("## Parcels onto trucks")).unwrap();
    let p = c.policies();
    let north = p.resolve("north-1");
    assert_eq!((north.max_items, north.max_wait), (40, secs(2 * 3600)));
    assert_eq!(north.max_idle, Some(secs(20 * 60)));
    let capacity = BTreeMap::from([
        ("volume_cm3".to_owned(), 80_000_000),
        ("weight_g".to_owned(), 24_000_000),
    ]);
    assert_eq!(north.capacity, Arc::new(capacity));
    assert_eq!(north.deadline_lead, secs(45 * 60));
    assert_eq!((north.min_items, north.max_age), (5, Some(secs(6 * 3600))));
    let departures = |key: &str| {
        let cutoffs = p.resolve(key).cutoffs.expect("cutoffs");
        assert_eq!(cutoffs.zone(), "Europe/Berlin");
        let first = cutoffs.next_after(ms("2026-07-01T05:40:00Z"));
        (first, cutoffs.next_after(first))
    };
    // 11:30 and 17:45 CEST; 12:15 and 19:00 CEST.
    let want = (ms("2026-07-01T09:30:00Z"), ms("2026-07-01T15:45:00Z"));
    assert_eq!(departures("north-1"), want);
    let want = (ms("2026-07-01T10:15:00Z"), ms("2026-07-01T17:00:00Z"));
    assert_eq!(departures("south-3"), want);
    let south = p.resolve("south-3");
    assert_eq!(
        Policy {
            cutoffs: None,
            ..south
        },
        Policy {
            cutoffs: None,
            ..north
        }
    );
    assert_eq!(p.resolve("east"), Policy::default());
}

/// The delayed-queue table of docs/policies.md parses to a policy whose
/// only due rules are max_wait and item deadlines, with no lead: nothing
/// flushes the one item before its deadline.
#[test]
fn documented_delayed_queue_example_parses() {
    let c = parse(policies_page_block("## Recipe: batcher as a delayed queue")).unwrap();
    let p = c.policies().resolve("unpaid:1001");
    assert_eq!(p, Policy::basic(2, secs(3600), None));
    assert_eq!(
        (p.deadline_lead, p.max_idle, p.min_items),
        (Duration::ZERO, None, 0)
    );
    assert!(p.cutoffs.is_none() && p.capacity.is_empty() && p.max_age.is_none());
}
