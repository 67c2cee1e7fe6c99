//! The policy methods' bodies (GetPolicy, ListPolicies, UpdatePolicy,
//! DeletePolicy, ImportPolicies, ListPolicyRevisions) and the mapping
//! between a `pb::Policy` and a stored document. Names on the wire are
//! `policies/defaults` and `policies/keys/{pattern}`; the store's are the
//! same without `policies/`.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::time::Duration;

use bytesize::ByteSize;
use serde::Deserialize;
use serde::de::value::{Error as ValueError, StrDeserializer};
use tonic::Request;

use super::BatcherService;
use super::checks::page_size;
use crate::auth::Caller;
use crate::config::{CutoffTimes, KeyPolicy, TimeZoneName};
use crate::error::{Error, invalid};
use crate::pb;
use crate::policy::Overflow;
use crate::policy_store::{Action, Change, DEFAULTS, KEYS, Snapshot};
use crate::store::{Revision, StoredPolicy};

/// The prefix of every policy's resource name.
const PREFIX: &str = "policies/";

/// A policy's store name from its resource name, checked (field `field`).
fn store_name(field: &str, name: &str) -> Result<String, Error> {
    let bad = || {
        invalid(
            field,
            format!(
                "{name:?} is not a policy name: use \"policies/defaults\" or \"policies/keys/<key or glob>\""
            ),
        )
    };
    let rest = name.strip_prefix(PREFIX).ok_or_else(bad)?;
    crate::policy_store::check_name(field, rest).map_err(|_| bad())?;
    Ok(rest.to_owned())
}

/// The pattern a store name holds (`None` for the defaults).
fn pattern_of(name: &str) -> Option<&str> {
    name.strip_prefix(KEYS)
}

/// PERMISSION_DENIED unless the caller's key prefixes cover the policy's
/// pattern (only an unscoped token covers the defaults).
fn check_scope(caller: &Caller, name: &str) -> Result<(), Error> {
    caller.check_pattern(pattern_of(name))
}

/// An etag from the wire: "" for none, else the revision it holds.
fn etag(field: &str, text: &str) -> Result<Option<u64>, Error> {
    if text.is_empty() {
        return Ok(None);
    }
    let parsed = text.trim_matches('"').parse::<u64>();
    parsed
        .map(Some)
        .map_err(|_| invalid(field, format!("{text:?} is not an etag from this service")))
}

fn duration(field: &str, d: Option<prost_types::Duration>) -> Result<Option<Duration>, Error> {
    d.map(|d| {
        Duration::try_from(d)
            .map_err(|_| invalid(format!("policy.{field}"), "must not be negative"))
    })
    .transpose()
}

/// `overflow` from its config name ("refuse" or "flush_oldest"), read as
/// the config file reads it.
fn overflow(name: &str) -> Result<Overflow, Error> {
    let text = StrDeserializer::<ValueError>::new(name);
    Overflow::deserialize(text).map_err(|e| invalid("policy.overflow", e.to_string()))
}

fn duration_pb(d: Option<Duration>) -> Option<prost_types::Duration> {
    d.and_then(|d| prost_types::Duration::try_from(d).ok())
}

/// A policy's fields from the wire (the checks between fields come later,
/// when the change is planned over the defaults).
pub(super) fn key_policy(p: &pb::Policy) -> Result<KeyPolicy, Error> {
    let max_items = p
        .max_items
        .map(|n| {
            NonZeroU32::new(n).ok_or_else(|| invalid("policy.max_items", "must be at least 1"))
        })
        .transpose()?;
    let cutoffs = p
        .cutoffs
        .as_ref()
        .map(|c| CutoffTimes::try_from(c.times.clone()))
        .transpose()
        .map_err(|e| invalid("policy.cutoffs", e))?;
    let timezone = p
        .timezone
        .clone()
        .map(TimeZoneName::try_from)
        .transpose()
        .map_err(|e| invalid("policy.timezone", e))?;
    Ok(KeyPolicy {
        max_items,
        max_wait: duration("max_wait", p.max_wait)?,
        max_bytes: p.max_bytes.map(ByteSize::b),
        max_idle: duration("max_idle", p.max_idle)?,
        capacity: p
            .capacity
            .as_ref()
            .map(|c| c.limits.clone().into_iter().collect()),
        cutoffs,
        timezone,
        deadline_lead: duration("deadline_lead", p.deadline_lead)?,
        min_items: p.min_items,
        max_age: duration("max_age", p.max_age)?,
        max_groups: p.max_groups,
        overflow: p.overflow.as_deref().map(overflow).transpose()?,
    })
}

/// A stored policy for the wire.
pub fn policy_pb(name: &str, doc: &StoredPolicy) -> pb::Policy {
    let p = &doc.policy;
    pb::Policy {
        name: format!("{PREFIX}{name}"),
        max_items: p.max_items.map(NonZeroU32::get),
        max_wait: duration_pb(p.max_wait),
        max_bytes: p.max_bytes.map(|b| b.as_u64()),
        max_idle: duration_pb(p.max_idle),
        capacity: p.capacity.as_ref().map(|c| pb::Capacity {
            limits: c.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        }),
        cutoffs: p.cutoffs.clone().map(|c| pb::Cutoffs { times: c.into() }),
        timezone: p.timezone.as_ref().map(|t| t.name().to_owned()),
        deadline_lead: duration_pb(p.deadline_lead),
        min_items: p.min_items,
        max_age: duration_pb(p.max_age),
        max_groups: p.max_groups,
        overflow: p.overflow.map(|o| o.as_str().to_owned()),
        revision: doc.revision,
        etag: doc.revision.to_string(),
        update_time: Some(timestamp(doc.updated_at)),
        updated_by: doc.updated_by.clone(),
    }
}

fn timestamp(ms: u64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: (ms / 1000) as i64,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

/// Who the history names for a call: the token's name, or with auth off
/// the peer's address.
fn who<T>(request: &Request<T>) -> String {
    let caller = Caller::of(request);
    match caller.name() {
        "" => request
            .remote_addr()
            .map_or_else(|| "unknown peer".to_owned(), |a| format!("peer {a}")),
        name => format!("token {name}"),
    }
}

/// A revision for the wire.
fn revision_pb(rev: Revision) -> pb::PolicyRevision {
    let changes = rev.changes.into_iter().map(|change| {
        let parsed: serde_json::Value = serde_json::from_str(&change.fields).unwrap_or_default();
        let fields = parsed["fields"].as_array().cloned().unwrap_or_default();
        pb::PolicyChange {
            name: format!("{PREFIX}{}", change.name),
            action: parsed["action"].as_str().unwrap_or("UPDATED").to_owned(),
            fields: fields
                .iter()
                .map(|f| pb::FieldChange {
                    field: f["field"].as_str().unwrap_or_default().to_owned(),
                    old_value: f["old"].to_string(),
                    new_value: f["new"].to_string(),
                })
                .collect(),
        }
    });
    pb::PolicyRevision {
        revision: rev.revision,
        time: Some(timestamp(rev.time)),
        who: rev.who,
        reason: rev.reason,
        changes: changes.collect(),
        bulk_count: rev.bulk.unwrap_or(0) as u32,
    }
}

impl BatcherService {
    pub(super) async fn get_policy_body(
        &self,
        request: Request<pb::GetPolicyRequest>,
    ) -> Result<pb::Policy, Error> {
        let caller = Caller::of(&request);
        let name = store_name("name", &request.get_ref().name)?;
        check_scope(&caller, &name)?;
        let copy = self.policy_store()?.snapshot().await?;
        let doc = copy
            .docs
            .get(&name)
            .ok_or_else(|| crate::policy_store::not_found(&name))?;
        Ok(policy_pb(&name, doc))
    }

    pub(super) async fn list_policies_body(
        &self,
        request: Request<pb::ListPoliciesRequest>,
    ) -> Result<pb::ListPoliciesResponse, Error> {
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let limit = page_size(req.page_size)?;
        let after = match req.page_token.as_str() {
            "" => None,
            token => Some(store_name("page_token", token)?),
        };
        let copy = self.policy_store()?.snapshot().await?;
        let wanted = |name: &String| {
            let in_prefix = match pattern_of(name) {
                Some(pattern) => pattern.starts_with(&req.key_prefix),
                None => req.key_prefix.is_empty(),
            };
            in_prefix && check_scope(&caller, name).is_ok()
        };
        let mut page: Vec<pb::Policy> = listed(&copy, after.as_deref())
            .filter(|(name, _)| wanted(name))
            .take(limit + 1)
            .map(|(name, doc)| policy_pb(name, doc))
            .collect();
        let more = page.len() > limit;
        page.truncate(limit);
        let next = match more {
            true => page.last().map(|p| p.name.clone()).unwrap_or_default(),
            false => String::new(),
        };
        Ok(pb::ListPoliciesResponse {
            policies: page,
            next_page_token: next,
            revision: copy.revision,
        })
    }

    pub(super) async fn update_policy_body(
        &self,
        request: Request<pb::UpdatePolicyRequest>,
    ) -> Result<pb::Policy, Error> {
        let caller = Caller::of(&request);
        let who = who(&request);
        let req = request.into_inner();
        let policy = req.policy.ok_or_else(|| invalid("policy", "is required"))?;
        let name = store_name("policy.name", &policy.name)?;
        check_scope(&caller, &name)?;
        let mask = req
            .update_mask
            .map(|m| m.paths)
            .filter(|paths| !paths.is_empty());
        let change = Change {
            name: name.clone(),
            etag: etag("policy.etag", &policy.etag)?,
            action: Action::Set {
                policy: Box::new(key_policy(&policy)?),
                mask,
            },
        };
        let store = self.policy_store()?;
        let changed = store.change(vec![change], &who, &req.reason, None).await?;
        let doc = changed.policies.first().and_then(|(_, doc)| doc.as_ref());
        let doc = doc.ok_or_else(|| crate::policy_store::not_found(&name))?;
        Ok(policy_pb(&name, doc))
    }

    pub(super) async fn delete_policy_body(
        &self,
        request: Request<pb::DeletePolicyRequest>,
    ) -> Result<pb::DeletePolicyResponse, Error> {
        let caller = Caller::of(&request);
        let who = who(&request);
        let req = request.into_inner();
        let name = store_name("name", &req.name)?;
        check_scope(&caller, &name)?;
        let change = Change {
            name,
            etag: etag("etag", &req.etag)?,
            action: Action::Delete,
        };
        let store = self.policy_store()?;
        let changed = store.change(vec![change], &who, &req.reason, None).await?;
        Ok(pb::DeletePolicyResponse {
            revision: changed.revision,
        })
    }

    pub(super) async fn import_policies_body(
        &self,
        request: Request<pb::ImportPoliciesRequest>,
    ) -> Result<pb::ImportPoliciesResponse, Error> {
        let caller = Caller::of(&request);
        let who = who(&request);
        let req = request.into_inner();
        let mut given = BTreeMap::new();
        for (i, policy) in req.policies.iter().enumerate() {
            let name = store_name(&format!("policies[{i}].name"), &policy.name)?;
            check_scope(&caller, &name)?;
            given.insert(name, key_policy(policy)?);
        }
        let store = self.policy_store()?;
        let copy = store.snapshot().await?;
        let expect = (req.expect_revision > 0).then_some(req.expect_revision);
        let (mut created, mut changed, mut deleted) = (0, 0, 0);
        let mut changes = Vec::new();
        for (name, policy) in &given {
            match copy.docs.get(name) {
                Some(doc) if doc.policy == *policy => continue,
                Some(_) => changed += 1,
                None => created += 1,
            }
            changes.push(Change::set(name, policy.clone()));
        }
        if req.prune {
            for name in copy.docs.keys().filter(|n| !given.contains_key(*n)) {
                check_scope(&caller, name)?;
                deleted += 1;
                let (etag, action) = (None, Action::Delete);
                changes.push(Change {
                    name: name.clone(),
                    etag,
                    action,
                });
            }
        }
        if changes.is_empty() {
            return Ok(pb::ImportPoliciesResponse {
                revision: copy.revision,
                ..Default::default()
            });
        }
        let expect = expect.or(Some(copy.revision));
        let done = store.change(changes, &who, &req.reason, expect).await?;
        Ok(pb::ImportPoliciesResponse {
            revision: done.revision,
            created,
            changed,
            deleted,
        })
    }

    pub(super) async fn list_policy_revisions_body(
        &self,
        request: Request<pb::ListPolicyRevisionsRequest>,
    ) -> Result<pb::ListPolicyRevisionsResponse, Error> {
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let limit = page_size(req.page_size)?;
        let name = match req.name.as_str() {
            "" => None,
            name => Some(store_name("name", name)?),
        };
        match &name {
            Some(name) => check_scope(&caller, name)?,
            None => caller.check_pattern(None)?,
        }
        let before =
            match req.page_token.as_str() {
                "" => None,
                token => Some(token.parse::<u64>().map_err(|_| {
                    invalid("page_token", "is not a token from ListPolicyRevisions")
                })?),
            };
        let store = self.policy_store()?;
        let (revisions, next) = store.history(name.as_deref(), before, limit).await?;
        Ok(pb::ListPolicyRevisionsResponse {
            revisions: revisions.into_iter().map(revision_pb).collect(),
            next_page_token: next.map(|r| r.to_string()).unwrap_or_default(),
        })
    }
}

/// The documents after `after` (all when `None`), defaults first, then by name.
fn listed<'a>(
    copy: &'a Snapshot,
    after: Option<&'a str>,
) -> impl Iterator<Item = (&'a String, &'a StoredPolicy)> + 'a {
    let rank = |name: &'a str| (name != DEFAULTS, name);
    let defaults = copy.docs.get_key_value(DEFAULTS);
    let keys = copy.docs.iter().filter(|(name, _)| name.starts_with(KEYS));
    defaults
        .into_iter()
        .chain(keys)
        .filter(move |(name, _)| after.is_none_or(|a| rank(name) > rank(a)))
}
