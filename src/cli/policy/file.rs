//! `batcher policy import|diff FILE`: a config file's `[defaults]` and
//! `[keys."..."]` tables (loaded and checked as `serve` loads them) against
//! the store. `import` writes them in one ImportPolicies call, so they are
//! one revision; `diff` reads the store and shows what that would change,
//! in the forms the history uses (`field: store -> file`).

use std::collections::BTreeMap;

use super::super::client::{CliError, Client};
use super::super::output::{self, line};
use super::form;
use super::{DiffArgs, ImportArgs};
use crate::config::Config;
use crate::pb;

/// `batcher policy import`.
pub async fn import(args: ImportArgs) -> Result<(), CliError> {
    let policies = form::file_policies(&Config::load(&args.file)?);
    let file = args.file.display();
    let reason = match &args.reason {
        Some(reason) => reason.clone(),
        None => format!("batcher policy import {file}"),
    };
    let request = pb::ImportPoliciesRequest {
        policies: policies.into_values().collect(),
        prune: args.prune,
        reason,
        expect_revision: args.expect_revision,
    };
    let remote = &args.remote;
    let mut client = remote.connect().await?;
    let done = remote.call(client.import_policies(request)).await?;
    if remote.json {
        return Ok(output::json(&done)?);
    }
    let (created, changed, deleted) = (done.created, done.changed, done.deleted);
    match created + changed + deleted {
        0 => line(&format!(
            "no changes: the store already holds {file}'s policies (revision {})",
            done.revision
        ))?,
        _ => line(&format!(
            "imported {file} as revision {}: {created} created, {changed} changed, {deleted} deleted",
            done.revision
        ))?,
    }
    Ok(())
}

/// Every policy in the store by name, and the revision of the first page.
async fn store_policies(
    client: &mut Client,
) -> Result<(BTreeMap<String, pb::Policy>, u64), tonic::Status> {
    let mut policies = BTreeMap::new();
    let mut request = pb::ListPoliciesRequest {
        page_size: 1000,
        ..Default::default()
    };
    let mut revision = None;
    loop {
        let page = client.list_policies(request.clone()).await?.into_inner();
        revision.get_or_insert(page.revision);
        policies.extend(page.policies.into_iter().map(|p| (p.name.clone(), p)));
        if page.next_page_token.is_empty() {
            return Ok((policies, revision.unwrap_or(0)));
        }
        request.page_token = page.next_page_token;
    }
}

/// What importing `file` over `store` changes: the file's policies created
/// or updated, then (with `prune`) the store's key policies deleted.
fn changes(
    store: &BTreeMap<String, pb::Policy>,
    file: &BTreeMap<String, pb::Policy>,
    prune: bool,
) -> Vec<pb::PolicyChange> {
    // By name, so "policies/defaults" comes before "policies/keys/...".
    let written = file
        .iter()
        .filter_map(|(name, p)| form::change(name, store.get(name), Some(p)));
    let gone = store
        .keys()
        .filter(|name| prune && !file.contains_key(*name));
    let deleted = gone.filter_map(|name| form::change(name, store.get(name), None));
    written.chain(deleted).collect()
}

/// `batcher policy diff`: fails with [`CliError::Differences`] when there
/// are differences and `--exit-code` asks so.
pub async fn diff(args: DiffArgs) -> Result<(), CliError> {
    let file = form::file_policies(&Config::load(&args.file)?);
    let remote = &args.remote;
    let mut client = remote.connect().await?;
    let (store, revision) = remote.within(store_policies(&mut client)).await?;
    let changes = changes(&store, &file, args.prune);
    let kept = store.keys().filter(|n| !file.contains_key(*n)).count();
    if !args.prune && kept > 0 {
        eprintln!("{kept} key policies only in the store are kept (--prune would delete them)");
    }
    if remote.json {
        changes.iter().try_for_each(output::json)?;
    } else if changes.is_empty() {
        line(&format!("no differences (store at revision {revision})"))?;
    } else {
        let lines = changes.iter().flat_map(|c| form::change_lines(c, ""));
        line(&lines.collect::<Vec<_>>().join("\n"))?;
        let count = |action: &str| changes.iter().filter(|c| c.action == action).count();
        line(&format!(
            "{} policies differ from the store at revision {revision}: {} created, {} updated, {} deleted",
            changes.len(),
            count("CREATED"),
            count("UPDATED"),
            count("DELETED"),
        ))?;
    }
    match args.exit_code && !changes.is_empty() {
        true => Err(CliError::Differences),
        false => Ok(()),
    }
}
