//! The one-shot commands: each connects, makes its calls and prints the
//! answer. With `--json`, a command prints its response message (`add`,
//! `flush`, `remove`, `redrive`, `requeue`), or one object per group or
//! batch (`get`, `list`, `dead-letters`).

use std::io::Read;
use std::path::Path;

use tonic::Status;

use super::client::{CliError, Client};
use super::output::{self, line};
use super::{AddArgs, Command, DeadLettersArgs, ListArgs, Pages, Remote};
use crate::config::Config;
use crate::pb;

/// `batcher config check FILE`: `Config::load`, exactly as `serve` does.
pub fn config_check(file: &Path) -> Result<(), CliError> {
    Config::load(file)?;
    line(&format!("{}: ok", file.display()))?;
    Ok(())
}

/// Runs a one-shot command (not `tail`, not `config`).
pub async fn run(command: Command) -> Result<(), CliError> {
    match command {
        Command::Add(args) => add(args).await,
        Command::Get { key, remote } => get(&remote, key).await,
        Command::List(args) => list(args).await,
        Command::Flush { key, remote } => flush(&remote, key).await,
        Command::Remove { key, id, remote } => remove(&remote, key, id).await,
        Command::DeadLetters(args) => dead_letters(args).await,
        Command::Redrive { group, ids, remote } => redrive(&remote, group, ids).await,
        Command::Requeue {
            batch_id,
            item_ids,
            remote,
        } => requeue(&remote, batch_id, item_ids).await,
        Command::Tail(_) | Command::Config(_) | Command::Policy(_) => {
            unreachable!("run by cli::run")
        }
    }
}

/// `batcher add`.
async fn add(args: AddArgs) -> Result<(), CliError> {
    let payload = match (&args.payload, &args.payload_file) {
        (Some(text), _) => text.clone().into_bytes(),
        (None, Some(path)) => read_payload(path)?,
        (None, None) => Vec::new(),
    };
    let deadline = args.deadline.map(|at| prost_types::Timestamp {
        seconds: at.as_second(),
        nanos: at.subsec_nanosecond(),
    });
    let request = pb::AddRequest {
        key: args.key.clone(),
        item: Some(pb::Item {
            id: args.id.clone(),
            payload,
            measures: args.measures.into_iter().collect(),
            deadline,
            requeue_count: 0,
        }),
        close_group: args.close,
        ..Default::default()
    };
    let remote = &args.remote;
    let mut client = remote.connect().await?;
    let response = remote.call(client.add(request)).await?;
    if remote.json {
        return Ok(output::json(&response)?);
    }
    let (id, key) = (&args.id, &args.key);
    let size = response.group_size;
    match response.outcome() {
        pb::AddOutcome::Duplicate => line(&format!(
            "duplicate: {id} is already in {key}'s open group or was flushed lately (group size {size})"
        ))?,
        _ => line(&format!("added {id} to {key} (group size {size})"))?,
    }
    for batch in &response.batches {
        flushed(batch)?;
    }
    Ok(())
}

/// The payload file's bytes; `-` reads stdin.
fn read_payload(path: &Path) -> Result<Vec<u8>, CliError> {
    let mut bytes = Vec::new();
    let read = match path.to_str() {
        Some("-") => std::io::stdin().read_to_end(&mut bytes).map(drop),
        _ => std::fs::read(path).map(|b| bytes = b),
    };
    read.map_err(|e| CliError::Input(format!("--payload-file {}: {e}", path.display())))?;
    Ok(bytes)
}

/// One line saying a batch was flushed.
fn flushed(batch: &pb::Batch) -> std::io::Result<()> {
    line(&format!(
        "flushed batch {} of {}: {}, reason {}",
        batch.id,
        batch.key,
        output::count_items(batch.items.len()),
        output::reason(batch.reason)
    ))
}

/// `batcher get`: exits 1 when the key has no open group.
async fn get(remote: &Remote, key: String) -> Result<(), CliError> {
    let mut client = remote.connect().await?;
    let request = pb::GetGroupRequest { key: key.clone() };
    let response = remote.call(client.get_group(request)).await?;
    let Some(group) = response.group else {
        return Err(CliError::Input(format!("no open group under key {key:?}")));
    };
    match remote.json {
        true => output::json(&group)?,
        false => line(&output::group(&group))?,
    }
    Ok(())
}

/// `batcher list`.
async fn list(args: ListArgs) -> Result<(), CliError> {
    let remote = &args.remote;
    let first = pb::ListGroupsRequest {
        page_size: args.pages.page_size,
        key_prefix: args.prefix.clone(),
        ..Default::default()
    };
    if paged(remote, &args.pages, "list", first, output::groups).await? == 0 && !remote.json {
        eprintln!("no open groups");
    }
    Ok(())
}

/// A list request, paged by `page_token` (AIP-158).
pub(super) trait Listing: Sized {
    /// What a page lists.
    type Entry: prost::Name;
    /// This request for the page after `page_token`.
    fn at(&self, page_token: String) -> Self;
    /// Gets the page: its entries and the next page token.
    async fn fetch(self, client: &mut Client) -> Result<(Vec<Self::Entry>, String), Status>;
}

/// Implements [`Listing`] for a request whose response lists `$entries`.
macro_rules! listing {
    ($request:ty, $entry:ty, $method:ident, $entries:ident) => {
        impl Listing for $request {
            type Entry = $entry;
            fn at(&self, page_token: String) -> Self {
                Self {
                    page_token,
                    ..self.clone()
                }
            }
            async fn fetch(self, client: &mut Client) -> Result<(Vec<$entry>, String), Status> {
                let page = client.$method(self).await?.into_inner();
                Ok((page.$entries, page.next_page_token))
            }
        }
    };
}

listing!(pb::ListGroupsRequest, pb::Group, list_groups, groups);
listing!(
    pb::ListDeadLettersRequest,
    pb::Batch,
    list_dead_letters,
    batches
);
listing!(pb::ListPoliciesRequest, pb::Policy, list_policies, policies);
listing!(
    pb::ListPolicyRevisionsRequest,
    pb::PolicyRevision,
    list_policy_revisions,
    revisions
);

/// Prints the pages of `first` (from --page-token on, each as a table or as
/// JSON lines) and returns how many entries they held.
pub(super) async fn paged<L: Listing>(
    remote: &Remote,
    pages: &Pages,
    command: &str,
    first: L,
    table: fn(&[L::Entry]) -> String,
) -> Result<usize, CliError> {
    let mut client = remote.connect().await?;
    let mut token = pages.page_token.clone();
    let mut shown = 0;
    loop {
        let (entries, next) = remote.within(first.at(token).fetch(&mut client)).await?;
        shown += entries.len();
        match remote.json {
            true => entries.iter().try_for_each(output::json)?,
            false if entries.is_empty() => {}
            false => line(&table(&entries))?,
        }
        token = next;
        if !more(pages, &token, command) {
            return Ok(shown);
        }
    }
}

/// Whether to fetch the page after `token`: with --all, while there is one;
/// without, tell on stderr how to get it.
fn more(pages: &Pages, token: &str, command: &str) -> bool {
    if token.is_empty() {
        return false;
    }
    if !pages.all {
        eprintln!(
            "more follow: batcher {command} ... --page-token {token} (or --all for every page)"
        );
    }
    pages.all
}

/// `batcher flush`.
async fn flush(remote: &Remote, key: String) -> Result<(), CliError> {
    let mut client = remote.connect().await?;
    let request = pb::FlushRequest { key: key.clone() };
    let response = remote.call(client.flush(request)).await?;
    if remote.json {
        return Ok(output::json(&response)?);
    }
    if response.batches.is_empty() {
        line(&format!("no open group under key {key:?}: nothing flushed"))?;
    }
    for batch in &response.batches {
        flushed(batch)?;
    }
    Ok(())
}

/// `batcher remove`.
async fn remove(remote: &Remote, key: String, id: String) -> Result<(), CliError> {
    let mut client = remote.connect().await?;
    let request = pb::RemoveRequest {
        key: key.clone(),
        item_id: id.clone(),
    };
    let response = remote.call(client.remove(request)).await?;
    if remote.json {
        return Ok(output::json(&response)?);
    }
    let size = response.group_size;
    match response.removed {
        true => line(&format!("removed {id} from {key} (group size {size})"))?,
        false => line(&format!("{id} was not in {key}'s open group"))?,
    }
    Ok(())
}

/// `batcher dead-letters`.
async fn dead_letters(args: DeadLettersArgs) -> Result<(), CliError> {
    let remote = &args.remote;
    let first = pb::ListDeadLettersRequest {
        consumer_group: args.group.clone(),
        page_size: args.pages.page_size,
        ..Default::default()
    };
    let shown = paged(remote, &args.pages, "dead-letters", first, output::batches).await?;
    if shown == 0 && !remote.json {
        eprintln!("no dead letters in consumer group {:?}", args.group);
    }
    Ok(())
}

/// `batcher redrive`.
async fn redrive(remote: &Remote, group: String, ids: Vec<String>) -> Result<(), CliError> {
    let mut client = remote.connect().await?;
    let asked = ids.len();
    let request = pb::RedriveRequest {
        consumer_group: group.clone(),
        batch_ids: ids,
    };
    let response = remote.call(client.redrive(request)).await?;
    match remote.json {
        true => output::json(&response)?,
        false => line(&format!(
            "redriven {} of {asked} batches to consumer group {group}",
            response.redriven
        ))?,
    }
    Ok(())
}

/// `batcher requeue`.
async fn requeue(remote: &Remote, batch_id: String, ids: Vec<String>) -> Result<(), CliError> {
    let mut client = remote.connect().await?;
    let asked = ids.len();
    let request = pb::RequeueRequest {
        batch_id,
        item_ids: ids,
    };
    let response = remote.call(client.requeue(request)).await?;
    match remote.json {
        true => output::json(&response)?,
        false => line(&format!(
            "requeued {} of {asked} items (group size {})",
            response.requeued, response.group_size
        ))?,
    }
    Ok(())
}
