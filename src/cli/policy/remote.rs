//! `batcher policy get|list|set|delete|history`: each makes its calls and
//! prints the policy (or the page, or the revisions); with `--json`, the
//! protobuf JSON mapping of the policy, one object per policy or revision,
//! or the DeletePolicy response.

use super::super::client::CliError;
use super::super::commands::paged;
use super::super::output::{self, Table, line};
use super::super::{Pages, Remote};
use super::form::{self, DEFAULTS, compact, fields, plain, resource_name};
use super::{ListArgs, SetArgs};
use crate::pb;
use crate::policy_store::FIELDS;

/// One policy for people: the fields it sets, those it leaves unset, and
/// its revision, etag and last writer.
pub fn policy_text(p: &pb::Policy) -> String {
    let set = fields(p);
    let mut table = Table::new(&["name:", &p.name]);
    for field in FIELDS.iter().filter(|f| set.contains_key(**f)) {
        table.row(vec![format!("{field}:"), plain(&set[*field])]);
    }
    let unset = FIELDS.iter().filter(|f| !set.contains_key(**f));
    let unset = unset.copied().collect::<Vec<_>>().join(", ");
    if !unset.is_empty() {
        let label = match p.name == DEFAULTS {
            true => "unset:",
            false => "from defaults:",
        };
        table.row(vec![label.into(), unset]);
    }
    table.row(vec!["revision:".into(), p.revision.to_string()]);
    table.row(vec!["etag:".into(), p.etag.clone()]);
    table.row(vec!["updated by:".into(), p.updated_by.clone()]);
    table.row(vec![
        "updated:".into(),
        output::time(p.update_time.as_ref()),
    ]);
    table.render()
}

/// Prints a policy as text, or as JSON with `--json`.
fn print(remote: &Remote, p: &pb::Policy) -> Result<(), CliError> {
    match remote.json {
        true => output::json(p)?,
        false => line(&policy_text(p))?,
    }
    Ok(())
}

/// `batcher policy get`.
pub async fn get(remote: &Remote, name: &str) -> Result<(), CliError> {
    let mut client = remote.connect().await?;
    let request = pb::GetPolicyRequest {
        name: resource_name(name),
    };
    let policy = remote.call(client.get_policy(request)).await?;
    print(remote, &policy)
}

/// Policies as a table: name, revision, and the fields each sets.
fn policies_table(policies: &[pb::Policy]) -> String {
    let mut table = Table::new(&["NAME", "REVISION", "FIELDS"]);
    for p in policies {
        table.row(vec![p.name.clone(), p.revision.to_string(), compact(p)]);
    }
    table.render()
}

/// `batcher policy list`.
pub async fn list(args: ListArgs) -> Result<(), CliError> {
    let remote = &args.remote;
    let first = pb::ListPoliciesRequest {
        page_size: args.pages.page_size,
        key_prefix: args.prefix.clone(),
        ..Default::default()
    };
    let shown = paged(remote, &args.pages, "policy list", first, policies_table).await?;
    if shown == 0 && !remote.json {
        eprintln!("no policies");
    }
    Ok(())
}

/// The UpdatePolicy request of `set`: the policy with the fields given, and
/// a mask naming exactly those and the ones to unset.
pub fn update_request(args: &SetArgs) -> Result<pb::UpdatePolicyRequest, CliError> {
    let capacity = (!args.capacity.is_empty()).then(|| pb::Capacity {
        limits: args.capacity.iter().filter_map(|l| l.0.clone()).collect(),
    });
    let policy = pb::Policy {
        name: resource_name(&args.name),
        etag: args.etag.clone(),
        max_items: args.max_items,
        max_wait: args.max_wait,
        max_bytes: args.max_bytes,
        max_idle: args.max_idle,
        capacity,
        cutoffs: args.cutoffs.clone().map(|c| pb::Cutoffs { times: c.0 }),
        timezone: args.timezone.clone(),
        deadline_lead: args.deadline_lead,
        min_items: args.min_items,
        max_age: args.max_age,
        max_groups: args.max_groups,
        overflow: args.overflow.clone(),
        ..Default::default()
    };
    let set = fields(&policy);
    if let Some(both) = args.unset.iter().find(|f| set.contains_key(*f)) {
        let flag = both.replace('_', "-");
        return Err(CliError::Input(format!(
            "--unset {both} and --{flag} both name {both}: give one"
        )));
    }
    let named = |f: &str| set.contains_key(f) || args.unset.iter().any(|u| u == f);
    let paths: Vec<String> = FIELDS
        .iter()
        .filter(|f| named(f))
        .map(|f| f.to_string())
        .collect();
    if paths.is_empty() {
        return Err(CliError::Input(
            "nothing to change: give a field's flag (such as --max-items) or --unset FIELD".into(),
        ));
    }
    Ok(pb::UpdatePolicyRequest {
        policy: Some(policy),
        update_mask: Some(prost_types::FieldMask { paths }),
        reason: args.reason.clone(),
    })
}

/// `batcher policy set`.
pub async fn set(args: SetArgs) -> Result<(), CliError> {
    let request = update_request(&args)?;
    let remote = &args.remote;
    let mut client = remote.connect().await?;
    let policy = remote.call(client.update_policy(request)).await?;
    print(remote, &policy)
}

/// `batcher policy delete`.
pub async fn delete(
    remote: &Remote,
    name: &str,
    etag: String,
    reason: String,
) -> Result<(), CliError> {
    let name = resource_name(name);
    let mut client = remote.connect().await?;
    let request = pb::DeletePolicyRequest {
        name: name.clone(),
        etag,
        reason,
    };
    let response = remote.call(client.delete_policy(request)).await?;
    match remote.json {
        true => output::json(&response)?,
        false => line(&format!("deleted {name} (revision {})", response.revision))?,
    }
    Ok(())
}

/// Revisions for people: per revision a line with its number, time, who
/// and why, then each policy's action and `field: old -> new`.
fn revisions_text(revisions: &[pb::PolicyRevision]) -> String {
    let mut lines = Vec::new();
    for rev in revisions {
        let mut head = format!(
            "revision {}  {}  {}",
            rev.revision,
            output::time(rev.time.as_ref()),
            rev.who
        );
        if !rev.reason.is_empty() {
            head.push_str(&format!("  reason: {}", rev.reason));
        }
        lines.push(head);
        for change in &rev.changes {
            lines.extend(form::change_lines(change, "  "));
        }
        if rev.bulk_count > 0 {
            lines.push(format!(
                "  {} policies changed (a bulk change keeps no details)",
                rev.bulk_count
            ));
        }
    }
    lines.join("\n")
}

/// `batcher policy history`.
pub async fn history(remote: &Remote, pages: &Pages, name: Option<&str>) -> Result<(), CliError> {
    let first = pb::ListPolicyRevisionsRequest {
        name: name.map(resource_name).unwrap_or_default(),
        page_size: pages.page_size,
        ..Default::default()
    };
    let shown = paged(remote, pages, "policy history", first, revisions_text).await?;
    if shown == 0 && !remote.json {
        eprintln!("no revisions");
    }
    Ok(())
}
