//! The policy store's reads and writes (keys in [`crate::keys::PolicyStoreKeys`]):
//! the documents, the revision, and the history, one stream entry per
//! revision. One script makes every change (`src/lua/policy_update.lua`); it
//! refuses a change computed on another revision than the store's, so
//! changes from several instances never interleave.

use serde::{Deserialize, Serialize};

use super::conn::Code;
use super::{Result, Store};
use crate::batch::DecodeError;
use crate::config::KeyPolicy;
use crate::scripts;

/// A policy as the store holds it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct StoredPolicy {
    /// The revision that last wrote it: its etag.
    pub revision: u64,
    /// When (ms since the epoch, Redis's clock).
    pub updated_at: u64,
    /// Who: a token's name, or a peer's address when auth is off.
    pub updated_by: String,
    /// Its fields.
    pub policy: KeyPolicy,
}

impl StoredPolicy {
    /// A stored document, from its JSON.
    pub fn parse(name: &str, json: &str) -> std::result::Result<StoredPolicy, DecodeError> {
        serde_json::from_str(json)
            .map_err(|err| DecodeError(format!("policy document {name:?}: {err}")))
    }
}

/// One revision in the history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Revision {
    /// Its number.
    pub revision: u64,
    /// When (ms since the epoch, Redis's clock).
    pub time: u64,
    /// Who made it.
    pub who: String,
    /// Why, as they said (may be empty).
    pub reason: String,
    /// The policies it changed, each with its document after the change
    /// (`None`: deleted) and its field changes as JSON. Empty for a bulk
    /// change.
    pub changes: Vec<PolicyChange>,
    /// For a bulk change (an import of many policies), how many it changed.
    pub bulk: Option<u64>,
}

/// What one revision did to one policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyChange {
    /// The policy's name.
    pub name: String,
    /// Its document after the change; `None` when it was deleted.
    pub doc: Option<StoredPolicy>,
    /// Its changed fields, as the JSON the writer gave.
    pub fields: String,
}

/// One policy to write: its name, its body (`None` deletes it) and its
/// field changes as JSON, for the history.
#[derive(Clone, Debug)]
pub struct PolicyWrite {
    pub name: String,
    pub body: Option<KeyPolicy>,
    pub fields: String,
}

/// What a change did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    /// It is in force as this revision, made at this time (ms).
    At { revision: u64, time: u64 },
    /// Nothing was written: the store is at this revision, not the one
    /// the change was computed on.
    Moved { revision: u64 },
}

/// A change with more policies than this keeps only their count in the history.
pub const BULK_CHANGE: usize = 1000;

impl Store {
    /// The policy store's revision (0: it never took a change).
    pub async fn policy_revision(&self) -> Result<u64> {
        let keys = self.keys.policy_store();
        let mut conn = self.conn.clone();
        let rev: Option<u64> = redis::cmd("GET")
            .arg(&keys.revision)
            .query_async(&mut conn)
            .await?;
        Ok(rev.unwrap_or(0))
    }

    /// Every policy document, by name. The store may take changes while
    /// they are read: replay the history from a revision read before.
    pub async fn policy_docs(&self) -> Result<Vec<(String, StoredPolicy)>> {
        let keys = self.keys.policy_store();
        let mut conn = self.conn.clone();
        let docs: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(&keys.docs)
            .query_async(&mut conn)
            .await?;
        docs.into_iter()
            .map(|(name, json)| {
                let doc = StoredPolicy::parse(&name, &json)?;
                Ok((name, doc))
            })
            .collect()
    }

    /// Up to `count` revisions after `after`, oldest first.
    pub async fn policy_history_after(&self, after: u64, count: usize) -> Result<Vec<Revision>> {
        let keys = self.keys.policy_store();
        let mut conn = self.conn.clone();
        let entries: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
            .arg(&keys.history)
            .arg(format!("{}-0", after + 1))
            .arg("+")
            .arg("COUNT")
            .arg(count)
            .query_async(&mut conn)
            .await?;
        entries.into_iter().map(revision_of).collect()
    }

    /// Up to `count` revisions before `before` (all when `None`), newest first.
    pub async fn policy_history_before(
        &self,
        before: Option<u64>,
        count: usize,
    ) -> Result<Vec<Revision>> {
        let keys = self.keys.policy_store();
        let mut conn = self.conn.clone();
        let end = match before {
            Some(0) => return Ok(Vec::new()),
            Some(rev) => format!("({rev}-0"),
            None => "+".to_owned(),
        };
        let entries: Vec<(String, Vec<String>)> = redis::cmd("XREVRANGE")
            .arg(&keys.history)
            .arg(end)
            .arg("-")
            .arg("COUNT")
            .arg(count)
            .query_async(&mut conn)
            .await?;
        entries.into_iter().map(revision_of).collect()
    }

    /// Writes `writes` as one revision if the store is still at `expected`;
    /// the history keeps the last `keep` revisions.
    pub async fn write_policies(
        &self,
        expected: u64,
        who: &str,
        reason: &str,
        keep: usize,
        writes: &[PolicyWrite],
    ) -> Result<Written> {
        let keys = self.keys.policy_store();
        let mut args = vec![
            expected.to_string().into_bytes(),
            who.as_bytes().to_vec(),
            reason.as_bytes().to_vec(),
            keep.to_string().into_bytes(),
        ];
        for write in writes {
            let body = match &write.body {
                Some(policy) => serde_json::to_vec(policy)
                    .map_err(|err| DecodeError(format!("policy {}: {err}", write.name)))?,
                None => Vec::new(),
            };
            args.extend([write.name.as_bytes().to_vec(), body]);
            args.push(write.fields.as_bytes().to_vec());
        }
        let reply: Vec<u64> = self
            .run_script(
                Code::Script(&scripts::POLICY_UPDATE),
                &[&keys.docs, &keys.revision, &keys.history],
                args,
            )
            .await?;
        written(&reply)
    }

    /// Redis's clock, in ms since the epoch.
    pub async fn redis_time_ms(&self) -> Result<u64> {
        let mut conn = self.conn.clone();
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await?;
        Ok(secs * 1000 + micros / 1000)
    }

    /// Replaces every document with `docs` (name, document as JSON) as one
    /// revision if the store is still at `expected`, for a bulk change of
    /// `count` policies made at `time` (ms): the documents are staged in
    /// chunks, each a short command, then swapped in by one short script,
    /// so Redis never runs one long call. A staged hash left by a crash
    /// expires within the hour.
    #[allow(clippy::too_many_arguments)]
    pub async fn replace_policies(
        &self,
        expected: u64,
        who: &str,
        reason: &str,
        keep: usize,
        docs: &[(String, String)],
        count: usize,
        time: u64,
    ) -> Result<Written> {
        let keys = self.keys.policy_store();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let staged = format!("{}:{}-{nanos}", keys.staged, std::process::id());
        let mut conn = self.conn.clone();
        for chunk in docs.chunks(STAGE_CHUNK) {
            let mut pipe = redis::pipe();
            pipe.cmd("HSET").arg(&staged);
            for (name, json) in chunk {
                pipe.arg(name).arg(json);
            }
            pipe.ignore().cmd("EXPIRE").arg(&staged).arg(3600).ignore();
            pipe.query_async::<()>(&mut conn).await?;
        }
        let args = [
            expected.to_string(),
            who.to_owned(),
            reason.to_owned(),
            keep.to_string(),
            count.to_string(),
            time.to_string(),
        ];
        let reply: Vec<u64> = self
            .run_script(
                Code::Script(&scripts::POLICY_SWAP),
                &[&keys.docs, &keys.revision, &keys.history, &staged],
                args.into_iter().map(String::into_bytes).collect(),
            )
            .await?;
        written(&reply)
    }
}

/// Documents staged by one command of a bulk change.
const STAGE_CHUNK: usize = 1000;

/// The reply of a write script.
fn written(reply: &[u64]) -> Result<Written> {
    match reply {
        [1, revision, time] => Ok(Written::At {
            revision: *revision,
            time: *time,
        }),
        [0, revision] => Ok(Written::Moved {
            revision: *revision,
        }),
        other => Err(DecodeError(format!("policy update reply {other:?}")).into()),
    }
}

/// A history entry: its id and its fields, in order (`name`, `doc` and
/// `changes` repeat, once per policy).
fn revision_of((id, fields): (String, Vec<String>)) -> Result<Revision> {
    let bad = || DecodeError(format!("policy history entry {id}"));
    let mut rev = Revision {
        revision: 0,
        time: 0,
        who: String::new(),
        reason: String::new(),
        changes: Vec::new(),
        bulk: None,
    };
    let mut pairs = fields.chunks_exact(2);
    for pair in pairs.by_ref() {
        let (field, value) = (pair[0].as_str(), &pair[1]);
        let number = || value.parse::<u64>().map_err(|_| bad());
        match field {
            "revision" => rev.revision = number()?,
            "time" => rev.time = number()?,
            "who" => rev.who = value.clone(),
            "reason" => rev.reason = value.clone(),
            "bulk" => rev.bulk = Some(number()?),
            "name" => rev.changes.push(PolicyChange {
                name: value.clone(),
                doc: None,
                fields: String::new(),
            }),
            "doc" if !value.is_empty() => {
                let change = rev.changes.last_mut().ok_or_else(bad)?;
                change.doc = Some(StoredPolicy::parse(&change.name, value)?);
            }
            "changes" => rev.changes.last_mut().ok_or_else(bad)?.fields = value.clone(),
            _ => {}
        }
    }
    if rev.revision == 0 {
        return Err(bad().into());
    }
    Ok(rev)
}
