//! A policy's forms on the operator's side: its resource name from what an
//! operator types, its fields as the config file and the history write them
//! (durations as "2h", `max_bytes` in bytes: what `serde_json::to_value` of
//! a [`KeyPolicy`] gives), the same as short text for tables, the change
//! between two versions of it, and a config file's tables as `pb::Policy`s.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::config::{Config, KeyPolicy};
use crate::pb;
use crate::policy_store::FIELDS;

/// The prefix of every policy's resource name.
pub const PREFIX: &str = "policies/";

/// The resource name of the defaults.
pub const DEFAULTS: &str = "policies/defaults";

/// The resource name of what an operator typed: `defaults`, a key pattern
/// (`north-*`), or a full name (`policies/...`, which is also how to name
/// a pattern that is literally "defaults": `policies/keys/defaults`).
pub fn resource_name(typed: &str) -> String {
    match typed {
        "defaults" => DEFAULTS.to_owned(),
        name if name.starts_with(PREFIX) => name.to_owned(),
        pattern => format!("{PREFIX}keys/{pattern}"),
    }
}

/// A duration in the config file's form ("2h", "1h 30m").
fn duration(d: Option<&prost_types::Duration>) -> Option<Value> {
    let d = Duration::try_from(*d?).ok()?;
    Some(Value::String(humantime::format_duration(d).to_string()))
}

/// The fields `p` sets, by name, in the forms of the config file and of
/// the history's field changes.
pub fn fields(p: &pb::Policy) -> Map<String, Value> {
    let capacity = p.capacity.as_ref().map(|c| {
        let limits = c.limits.iter().map(|(k, v)| (k.clone(), Value::from(*v)));
        Value::Object(limits.collect())
    });
    let entries = [
        ("max_items", p.max_items.map(Value::from)),
        ("max_wait", duration(p.max_wait.as_ref())),
        ("max_bytes", p.max_bytes.map(Value::from)),
        ("max_idle", duration(p.max_idle.as_ref())),
        ("capacity", capacity),
        (
            "cutoffs",
            p.cutoffs.as_ref().map(|c| Value::from(c.times.clone())),
        ),
        ("timezone", p.timezone.clone().map(Value::from)),
        ("deadline_lead", duration(p.deadline_lead.as_ref())),
        ("min_items", p.min_items.map(Value::from)),
        ("max_age", duration(p.max_age.as_ref())),
        ("max_groups", p.max_groups.map(Value::from)),
        ("overflow", p.overflow.clone().map(Value::from)),
    ];
    let set = entries
        .into_iter()
        .filter_map(|(k, v)| Some((k.to_owned(), v?)));
    set.collect()
}

/// A field's value as short text: strings bare, lists and limits joined by
/// ",", an empty capacity as "none".
pub fn plain(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Array(items) => items.iter().map(plain).collect::<Vec<_>>().join(","),
        Value::Object(limits) if limits.is_empty() => "none".into(),
        Value::Object(limits) => {
            let pairs = limits.iter().map(|(k, v)| format!("{k}={}", plain(v)));
            pairs.collect::<Vec<_>>().join(",")
        }
        other => other.to_string(),
    }
}

/// The fields `p` sets as `field=value` pairs, for one table cell ("-"
/// when it sets none); a capacity in braces.
pub fn compact(p: &pb::Policy) -> String {
    let set = fields(p);
    let shown = FIELDS.iter().filter_map(|field| {
        let value = set.get(*field)?;
        Some(match value {
            Value::Object(limits) if !limits.is_empty() => format!("{field}={{{}}}", plain(value)),
            _ => format!("{field}={}", plain(value)),
        })
    });
    let text = shown.collect::<Vec<_>>().join(" ");
    if text.is_empty() { "-".into() } else { text }
}

/// What turning `old` into `new` does to the policy `name` (`None` for
/// "does not exist"), as the history records it: CREATED, UPDATED or
/// DELETED, with each field whose value differs (values as JSON text,
/// "null" when unset). `None` when nothing differs.
pub fn change(
    name: &str,
    old: Option<&pb::Policy>,
    new: Option<&pb::Policy>,
) -> Option<pb::PolicyChange> {
    let action = match (old, new) {
        (None, None) => return None,
        (None, Some(_)) => "CREATED",
        (Some(_), None) => "DELETED",
        (Some(_), Some(_)) => "UPDATED",
    };
    let (old, new) = (old.map(fields), new.map(fields));
    let (old, new) = (old.unwrap_or_default(), new.unwrap_or_default());
    let text = |v: Option<&Value>| v.map_or_else(|| "null".to_owned(), Value::to_string);
    let differ = FIELDS.iter().filter(|f| old.get(**f) != new.get(**f));
    let changed: Vec<_> = differ
        .map(|field| pb::FieldChange {
            field: (*field).to_owned(),
            old_value: text(old.get(*field)),
            new_value: text(new.get(*field)),
        })
        .collect();
    if action == "UPDATED" && changed.is_empty() {
        return None;
    }
    Some(pb::PolicyChange {
        name: name.to_owned(),
        action: action.to_owned(),
        fields: changed,
    })
}

/// A change as lines, indented by `indent`: `ACTION NAME`, then one
/// `  field: old -> new` per field.
pub fn change_lines(change: &pb::PolicyChange, indent: &str) -> Vec<String> {
    let head = format!("{indent}{} {}", change.action, change.name);
    let fields = change.fields.iter().map(|f| {
        let (field, old, new) = (&f.field, &f.old_value, &f.new_value);
        format!("{indent}  {field}: {old} -> {new}")
    });
    std::iter::once(head).chain(fields).collect()
}

/// A config file's table as a policy named `name`.
pub fn policy_pb(name: String, table: &KeyPolicy) -> pb::Policy {
    let d = |d: Option<Duration>| d.and_then(|d| prost_types::Duration::try_from(d).ok());
    pb::Policy {
        name,
        max_items: table.max_items.map(NonZeroU32::get),
        max_wait: d(table.max_wait),
        max_bytes: table.max_bytes.map(|b| b.as_u64()),
        max_idle: d(table.max_idle),
        capacity: table.capacity.as_ref().map(|limits| pb::Capacity {
            limits: limits.clone().into_iter().collect(),
        }),
        cutoffs: table
            .cutoffs
            .clone()
            .map(|c| pb::Cutoffs { times: c.into() }),
        timezone: table.timezone.as_ref().map(|t| t.name().to_owned()),
        deadline_lead: d(table.deadline_lead),
        min_items: table.min_items,
        max_age: d(table.max_age),
        max_groups: table.max_groups,
        overflow: table.overflow.map(|o| o.as_str().to_owned()),
        ..Default::default()
    }
}

/// A config file's policies by resource name: `[defaults]` with every field
/// set (the built-in defaults where the file leaves one out), as the store
/// keeps them, and each `[keys."..."]` table as written.
pub fn file_policies(config: &Config) -> BTreeMap<String, pb::Policy> {
    let defaults = KeyPolicy::complete(&config.defaults);
    let keys = config.keys.iter().map(|(pattern, table)| {
        let name = format!("{PREFIX}keys/{pattern}");
        (name.clone(), policy_pb(name, table))
    });
    let defaults = (
        DEFAULTS.to_owned(),
        policy_pb(DEFAULTS.to_owned(), &defaults),
    );
    std::iter::once(defaults).chain(keys).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(json: &str) -> KeyPolicy {
        serde_json::from_str(json).unwrap()
    }

    /// A table's fields through `policy_pb` and `fields` are exactly the
    /// store's JSON of it, so `diff` and the history speak the same forms.
    #[test]
    fn fields_are_the_stores_json() {
        let text = r#"{"max_items":40,"max_wait":"2h","max_bytes":1048576,"max_idle":"1h 30m",
            "capacity":{"weight_g":24000000,"volume_l":3},"cutoffs":["11:30","17:45:10"],
            "timezone":"Europe/Berlin","deadline_lead":"45m","min_items":5,"max_age":"6h",
            "max_groups":0,"overflow":"flush_oldest"}"#;
        for json in [text, "{}", r#"{"capacity":{}}"#] {
            let t = table(json);
            let ours = Value::Object(fields(&policy_pb("policies/keys/x".into(), &t)));
            assert_eq!(ours, serde_json::to_value(&t).unwrap(), "{json}");
        }
    }

    /// Names, short text, and a change listing only the fields that differ.
    #[test]
    fn names_text_and_changes() {
        assert_eq!(resource_name("defaults"), "policies/defaults");
        assert_eq!(resource_name("north-*"), "policies/keys/north-*");
        assert_eq!(resource_name("policies/keys/a"), "policies/keys/a");
        let old = policy_pb(DEFAULTS.into(), &table(r#"{"max_items":10,"min_items":1}"#));
        let new = table(r#"{"max_items":40,"max_wait":"2h","min_items":1,"capacity":{"kg":5}}"#);
        let new = policy_pb(DEFAULTS.into(), &new);
        assert_eq!(
            compact(&new),
            "max_items=40 max_wait=2h capacity={kg=5} min_items=1"
        );
        let c = change(DEFAULTS, Some(&old), Some(&new)).unwrap();
        assert_eq!(
            change_lines(&c, ""),
            [
                "UPDATED policies/defaults",
                "  max_items: 10 -> 40",
                "  max_wait: null -> \"2h\"",
                "  capacity: null -> {\"kg\":5}",
            ]
        );
        assert!(change(DEFAULTS, Some(&old), Some(&old)).is_none());
        let none = policy_pb(DEFAULTS.into(), &table(r#"{"capacity":{}}"#));
        assert_eq!(compact(&none), "capacity=none");
        let gone = change(DEFAULTS, Some(&old), None).unwrap();
        assert_eq!(gone.action, "DELETED");
    }
}
