//! How a change to the policy store is computed: each policy's new fields
//! (whole, or the fields an update mask names), its etag checked, the whole
//! set checked by the rules a config file's tables get, and the field
//! changes the history records.

use std::collections::{BTreeMap, HashSet};

use serde_json::{Map, Value, json};
use tonic::Code;

use super::{DEFAULTS, KEYS, Snapshot};
use crate::config::{Config, KeyPolicy, Violation};
use crate::error::{Error, invalid};
use crate::store::{PolicyWrite, StoredPolicy};

/// The fields of a policy, as an update mask names them.
pub const FIELDS: [&str; 12] = [
    "max_items",
    "max_wait",
    "max_bytes",
    "max_idle",
    "capacity",
    "cutoffs",
    "timezone",
    "deadline_lead",
    "min_items",
    "max_age",
    "max_groups",
    "overflow",
];

/// One policy to change.
#[derive(Clone, Debug)]
pub struct Change {
    /// `defaults` or `keys/<pattern>`.
    pub name: String,
    /// The etag (revision) the caller read; the change is refused if the
    /// policy has another. `Some(0)`: it must not exist yet.
    pub etag: Option<u64>,
    /// What to do.
    pub action: Action,
}

/// What a change does to its policy.
#[derive(Clone, Debug)]
pub enum Action {
    /// Creates or changes it: with a mask, only the fields the mask names
    /// are taken from `policy` (a named field `policy` leaves unset is
    /// cleared); without one, `policy` replaces every field.
    Set {
        policy: Box<KeyPolicy>,
        mask: Option<Vec<String>>,
    },
    /// Deletes it; NOT_FOUND if it does not exist.
    Delete,
}

impl Change {
    /// Creates or replaces `name` with `policy`, whatever its etag.
    pub fn set(name: &str, policy: KeyPolicy) -> Change {
        Change {
            name: name.to_owned(),
            etag: None,
            action: Action::Set {
                policy: Box::new(policy),
                mask: None,
            },
        }
    }
}

/// A computed change: the writes for the store.
pub(super) struct Plan {
    pub writes: Vec<PolicyWrite>,
}

/// A change in force: its revision and each changed policy after it
/// (`None`: deleted).
#[derive(Clone, Debug)]
pub struct Changed {
    pub revision: u64,
    pub policies: Vec<(String, Option<StoredPolicy>)>,
}

impl Plan {
    /// The result once the store took it as `revision` and `copy` holds it.
    pub fn changed(&self, revision: u64, copy: &Snapshot) -> Changed {
        let policies = self.writes.iter().map(|w| {
            let doc = copy.docs.get(&w.name).cloned();
            (w.name.clone(), doc)
        });
        Changed {
            revision,
            policies: policies.collect(),
        }
    }
}

/// Refusal of a change computed on an older revision than the store's.
pub(super) fn store_moved(revision: u64) -> Error {
    Error::refused(
        Code::Aborted,
        "STORE_MOVED",
        format!("the policy store moved on to revision {revision}; read it again and retry"),
    )
    .with("revision", revision)
}

/// INVALID_ARGUMENT for a rule a policy breaks, naming its field as
/// `policy.<field>` (or `policy.name` for a pattern itself).
pub(super) fn invalid_policy(violation: &Violation) -> Error {
    let (name, field) = match violation.path.as_slice() {
        [table, rest @ ..] if table == "defaults" => (DEFAULTS.to_owned(), rest.join(".")),
        [table, pattern] if table == "keys" => (format!("{KEYS}{pattern}"), "name".to_owned()),
        [table, pattern, rest @ ..] if table == "keys" => {
            (format!("{KEYS}{pattern}"), rest.join("."))
        }
        other => (String::new(), other.join(".")),
    };
    invalid(
        format!("policy.{field}"),
        format!("{} (policy {name})", violation.message),
    )
}

/// Checks a policy name: `defaults` or `keys/` and a non-empty pattern.
pub fn check_name(field: &str, name: &str) -> Result<(), Error> {
    match name.strip_prefix(KEYS) {
        _ if name == DEFAULTS => Ok(()),
        Some(pattern) if !pattern.is_empty() => Ok(()),
        _ => Err(invalid(
            field,
            format!("{name:?} is not a policy name: use \"{DEFAULTS}\" or \"{KEYS}<key or glob>\""),
        )),
    }
}

/// Computes `changes` on `copy`: refuses a stale etag (ABORTED), a missing
/// policy to delete (NOT_FOUND), and a set of policies that breaks a rule
/// of the config file's tables (INVALID_ARGUMENT, naming the field).
pub(super) fn plan(base: &Config, copy: &Snapshot, changes: &[Change]) -> Result<Plan, Error> {
    let mut writes = Vec::with_capacity(changes.len());
    // The names seen so far: an import of 100k areas checks each against
    // the others in a hash lookup, not a scan of the writes before it.
    let mut seen = HashSet::with_capacity(changes.len());
    for change in changes {
        check_name("policy.name", &change.name)?;
        if !seen.insert(change.name.as_str()) {
            return Err(invalid(
                "policy.name",
                format!("{} appears twice", change.name),
            ));
        }
        let current = copy.docs.get(&change.name);
        check_etag(&change.name, change.etag, current)?;
        let old = current.map(|doc| &doc.policy);
        let new = match &change.action {
            Action::Set { policy, mask } => Some(masked(old, policy, mask.as_deref())?),
            Action::Delete if old.is_none() => return Err(not_found(&change.name)),
            Action::Delete => None,
        };
        writes.push(PolicyWrite {
            name: change.name.clone(),
            fields: field_changes(old, new.as_ref()),
            body: new,
        });
    }
    check(base, copy, &writes)?;
    Ok(Plan { writes })
}

/// Checks the policies `writes` leaves on `copy` by the rules a config
/// file's tables get: each written key policy over the defaults, or, when
/// the defaults change, every policy over the new ones.
fn check(base: &Config, copy: &Snapshot, writes: &[PolicyWrite]) -> Result<(), Error> {
    if !writes.iter().any(|w| w.name == DEFAULTS) {
        let defaults = copy.complete_defaults();
        for write in writes {
            if let (Some(pattern), Some(table)) = (write.name.strip_prefix(KEYS), &write.body) {
                base.key_policy(&defaults, pattern, table)
                    .map_err(|v| invalid_policy(&v))?;
            }
        }
        return Ok(());
    }
    let mut docs: BTreeMap<&str, &KeyPolicy> = copy
        .docs
        .iter()
        .map(|(name, doc)| (name.as_str(), &doc.policy))
        .collect();
    for write in writes {
        match &write.body {
            Some(policy) => docs.insert(&write.name, policy),
            None => docs.remove(write.name.as_str()),
        };
    }
    let defaults = docs.get(DEFAULTS).map(|d| (*d).clone()).unwrap_or_default();
    let patterns = docs
        .into_iter()
        .filter_map(|(name, p)| Some((name.strip_prefix(KEYS)?.to_owned(), p.clone())))
        .collect();
    base.with_policies(&defaults, patterns)
        .map_err(|v| invalid_policy(&v))?;
    Ok(())
}

/// NOT_FOUND for a policy that does not exist.
pub fn not_found(name: &str) -> Error {
    Error::refused(
        Code::NotFound,
        "POLICY_NOT_FOUND",
        format!("policy {name} does not exist"),
    )
    .with("policy", name)
}

/// ABORTED unless `etag` (when given) is `current`'s revision, or 0 for a
/// policy that does not exist.
fn check_etag(name: &str, etag: Option<u64>, current: Option<&StoredPolicy>) -> Result<(), Error> {
    let Some(etag) = etag else { return Ok(()) };
    let now = current.map_or(0, |doc| doc.revision);
    if etag == now {
        return Ok(());
    }
    let message = match current {
        Some(_) => format!(
            "policy {name} has etag \"{now}\", not \"{etag}\": it changed since it was read; \
             read it again"
        ),
        None => format!("policy {name} does not exist (etag \"{etag}\" was given)"),
    };
    Err(Error::refused(Code::Aborted, "ETAG_MISMATCH", message)
        .with("policy", name)
        .with("etag", now))
}

/// `policy`, or with a mask, `old` with the named fields taken from `policy`.
fn masked(
    old: Option<&KeyPolicy>,
    policy: &KeyPolicy,
    mask: Option<&[String]>,
) -> Result<KeyPolicy, Error> {
    let Some(mask) = mask else {
        return Ok(policy.clone());
    };
    let mut merged = object(old);
    let given = object(Some(policy));
    for path in mask {
        if !FIELDS.contains(&path.as_str()) {
            return Err(invalid(
                "update_mask",
                format!(
                    "{path:?} is not a policy field (fields: {})",
                    FIELDS.join(", ")
                ),
            ));
        }
        match given.get(path) {
            Some(value) => merged.insert(path.clone(), value.clone()),
            None => merged.remove(path),
        };
    }
    serde_json::from_value(Value::Object(merged))
        .map_err(|err| invalid("policy", format!("cannot be merged: {err}")))
}

/// A policy's set fields as a JSON object (empty for none).
fn object(policy: Option<&KeyPolicy>) -> Map<String, Value> {
    match policy.map(serde_json::to_value) {
        Some(Ok(Value::Object(map))) => map,
        _ => Map::new(),
    }
}

/// What a change did (`CREATED`, `UPDATED` or `DELETED`) and the fields
/// that differ between `old` and `new`, as JSON `{"action", "fields":
/// [{"field", "old", "new"}]}` (null: unset), for the history.
fn field_changes(old: Option<&KeyPolicy>, new: Option<&KeyPolicy>) -> String {
    let action = match (old, new) {
        (None, _) => "CREATED",
        (_, None) => "DELETED",
        _ => "UPDATED",
    };
    let (old, new) = (object(old), object(new));
    let changed = FIELDS.iter().filter_map(|field| {
        let (a, b) = (old.get(*field), new.get(*field));
        (a != b).then(|| json!({"field": field, "old": a, "new": b}))
    });
    let fields = Value::Array(changed.collect());
    json!({"action": action, "fields": fields}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(json: &str) -> KeyPolicy {
        serde_json::from_str(json).unwrap()
    }

    /// A mask takes only the fields it names, clearing a named field the
    /// request leaves unset, and refuses a name that is no field.
    #[test]
    fn masks_take_only_the_named_fields() {
        let old = policy(r#"{"max_items": 10, "max_wait": "4m", "max_idle": "1m"}"#);
        let given = policy(r#"{"max_items": 40, "max_wait": "1h"}"#);
        let mask = ["max_items".to_owned(), "max_idle".to_owned()];
        let merged = masked(Some(&old), &given, Some(&mask)).unwrap();
        assert_eq!(merged, policy(r#"{"max_items": 40, "max_wait": "4m"}"#));
        assert_eq!(masked(Some(&old), &given, None).unwrap(), given);
        let err = masked(Some(&old), &given, Some(&["max_item".to_owned()])).unwrap_err();
        assert!(
            err.to_string().starts_with("update_mask: \"max_item\""),
            "{err}"
        );
    }

    /// A change that names a policy an earlier change of the same call
    /// named is refused, naming it, and distinct names make a write each.
    #[test]
    fn a_plan_refuses_a_name_given_twice() {
        let empty = Snapshot {
            revision: 0,
            docs: Default::default(),
        };
        let set = |area: &str| Change::set(&format!("{KEYS}{area}"), policy(r#"{"max_items": 5}"#));
        let base = Config::default();
        let distinct = [set("10115"), set("10117"), set("2*")];
        assert_eq!(plan(&base, &empty, &distinct).unwrap().writes.len(), 3);
        let twice = [set("10115"), set("10117"), set("10115")];
        let err = plan(&base, &empty, &twice).err().unwrap().to_string();
        assert!(err.contains(&format!("{KEYS}10115 appears twice")), "{err}");
    }

    /// The history records each changed field with its old and new value.
    #[test]
    fn field_changes_name_old_and_new() {
        let old = policy(r#"{"max_items": 10, "max_wait": "4m"}"#);
        let new = policy(r#"{"max_items": 40, "max_wait": "4m", "capacity": {"kg": 5}}"#);
        let changes: Value = serde_json::from_str(&field_changes(Some(&old), Some(&new))).unwrap();
        assert_eq!(
            changes,
            json!({"action": "UPDATED", "fields": [
                {"field": "max_items", "old": 10, "new": 40},
                {"field": "capacity", "old": null, "new": {"kg": 5}},
            ]})
        );
        let same: Value = serde_json::from_str(&field_changes(Some(&old), Some(&old))).unwrap();
        assert_eq!(same["fields"], json!([]));
        let gone: Value = serde_json::from_str(&field_changes(Some(&old), None)).unwrap();
        assert_eq!(gone["action"], "DELETED");
    }

    /// A document's JSON keeps every field's value and form.
    #[test]
    fn documents_round_trip_through_json() {
        let text = r#"{"max_items":40,"max_wait":"2h","max_bytes":1048576,"max_idle":"20m",
            "capacity":{"weight_g":24000000},"cutoffs":["11:30","17:45:10"],
            "timezone":"Europe/Berlin","deadline_lead":"45m","min_items":5,"max_age":"6h",
            "max_groups":500,"overflow":"flush_oldest"}"#;
        let p = policy(text);
        assert_eq!(p.max_bytes.map(|b| b.as_u64()), Some(1_048_576));
        let again: KeyPolicy = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
        assert_eq!(again, p);
        let value: Value = serde_json::to_value(&p).unwrap();
        assert_eq!(value["cutoffs"], json!(["11:30", "17:45:10"]));
        assert_eq!(value["max_wait"], json!("2h"));
        assert_eq!(value["overflow"], json!("flush_oldest"));
        assert_eq!(value["max_groups"], json!(500));
    }
}
