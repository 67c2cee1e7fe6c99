//! Open groups: removing an item, flushing (by hand or by timeout), the
//! sweeper's due scan, and reading one group or a page of them.

use std::time::Duration;

use futures::future::try_join_all;

use super::conn::Code;
use super::decode::{DueScan, GroupReply, ScriptBatch};
use super::{Result, Store};
use crate::batch::{Batch, FlushReason, Group};
use crate::scripts::Function;

/// A position in the list of open groups: (due time, key).
pub type GroupPos = (u64, String);

/// What one shard's scan of the due set found: the matching positions, and
/// the last position scanned if the scan budget ran out first.
type ShardScan = (Vec<GroupPos>, Option<GroupPos>);

impl Store {
    /// Removes an item from its open group. Returns whether it was there, and
    /// the group's size after.
    pub async fn remove(&self, key: &str, id: &[u8]) -> Result<(bool, u32)> {
        let shard = self.keys.shard_of(key);
        let shard_keys = self.keys.shard(shard);
        let group = self.keys.group(shard, key);
        let policy = self.policies.resolve(key);
        self.run_script(
            Code::Function(Function::Remove),
            &[&shard_keys.due, &group, &shard_keys.open_index],
            vec![
                key.as_bytes().to_vec(),
                id.to_vec(),
                policy.min_items.to_string().into_bytes(),
            ],
        )
        .await
    }

    /// Flushes a key's open group, cut into batches of at most the key's
    /// `max_items` in force, oldest first. With `Timeout`, only if it is due
    /// by the Redis clock, with the reason of the rule that made it due, and
    /// not at all when `min_items` holds it (it is re-armed instead). Returns the batches written: none when there was
    /// no open group, more than one only when a reload lowered `max_items`
    /// while the group was open. Each batch is recorded in the metrics, and traced.
    pub async fn flush(&self, key: &str, reason: FlushReason) -> Result<Vec<Batch>> {
        let shard = self.keys.shard_of(key);
        self.flush_in_shard(shard, key, reason).await
    }

    /// Flushes a group to make room under a limit on open groups (reason
    /// OVERFLOW), as the add function named it.
    pub(super) async fn flush_overflow(&self, key: &str) -> Result<Vec<Batch>> {
        let shard = self.keys.shard_of(key);
        self.flush_in_shard(shard, key, FlushReason::Overflow).await
    }

    async fn flush_in_shard(
        &self,
        shard: u16,
        key: &str,
        reason: FlushReason,
    ) -> Result<Vec<Batch>> {
        let shard_keys = self.keys.shard(shard);
        let group = self.keys.group(shard, key);
        let policy = self.policies.resolve(key);
        let (due_at_ms, batches): (u64, Vec<ScriptBatch>) = self
            .run_script(
                Code::Function(Function::Flush),
                &[
                    &shard_keys.due,
                    &shard_keys.stream,
                    &shard_keys.flushed,
                    &group,
                    &shard_keys.open_index,
                ],
                vec![
                    key.as_bytes().to_vec(),
                    reason.as_str().as_bytes().to_vec(),
                    self.dedup.as_millis().to_string().into_bytes(),
                    policy.max_items.to_string().into_bytes(),
                    policy.min_items.to_string().into_bytes(),
                ],
            )
            .await?;
        let batches: Vec<Batch> = batches
            .into_iter()
            .map(|batch| batch.into_batch(shard))
            .collect();
        for batch in &batches {
            crate::metrics::flushed(batch, Some(due_at_ms));
            crate::telemetry::flushed(batch);
        }
        Ok(batches)
    }

    /// Reads which groups of a shard are due (at most `limit`), when the
    /// next one falls due, and which fall due then (at most `limit`).
    pub async fn due_groups(&self, shard: u16, limit: usize) -> Result<DueScan> {
        let shard_keys = self.keys.shard(shard);
        self.run_read_script(
            Code::Function(Function::Due),
            &[&shard_keys.due],
            vec![limit.to_string().into_bytes()],
        )
        .await
    }

    /// Flushes, by timeout, those of the given groups of one shard that are
    /// still due. The calls are pipelined.
    pub async fn flush_due(&self, shard: u16, keys: &[String]) -> Result<Vec<Batch>> {
        let calls = keys
            .iter()
            .map(|key| self.flush_in_shard(shard, key, FlushReason::Timeout));
        Ok(try_join_all(calls).await?.into_iter().flatten().collect())
    }

    /// Reads a key's open group, with its items in arrival order.
    pub async fn group(&self, key: &str) -> Result<Option<Group>> {
        self.open_group(self.keys.shard_of(key), key, true).await
    }

    /// Reads one open group (with its items, or without), as its rules
    /// make it due by the Redis clock now.
    async fn open_group(&self, shard: u16, key: &str, items: bool) -> Result<Option<Group>> {
        let min_items = self.policies.resolve(key).min_items;
        let reply: GroupReply = self
            .run_read_script(
                Code::Function(Function::Group),
                &[&self.keys.shard(shard).due, &self.keys.group(shard, key)],
                vec![
                    key.as_bytes().to_vec(),
                    min_items.to_string().into_bytes(),
                    if items { b"1".to_vec() } else { b"0".to_vec() },
                ],
            )
            .await?;
        Ok(reply.0.map(|group| Group {
            key: key.to_owned(),
            ..group
        }))
    }

    /// Lists open groups soonest-due first, after `after`, whose key starts
    /// with one of `prefixes` (`[""]`: every key). Returns the page and the position to continue from, if
    /// there may be more. Scans a bounded number of entries per shard, so a
    /// rare prefix can yield a short (even empty) page with a continuation.
    pub async fn list_groups(
        &self,
        limit: usize,
        after: Option<&GroupPos>,
        prefixes: &[String],
    ) -> Result<(Vec<Group>, Option<GroupPos>)> {
        const SCAN_BUDGET: usize = 4096;
        let scans = (0..self.keys.shards())
            .map(|shard| self.scan_due(shard, limit, after, prefixes, SCAN_BUDGET));
        let scans = try_join_all(scans).await?;

        // A shard that ran out of budget was read only up to its last position:
        // the page must stop there too, or it would skip that shard's rest.
        let cut = scans
            .iter()
            .filter_map(|(_, stopped)| stopped.clone())
            .min();
        let mut candidates: Vec<(u64, String, u16)> = scans
            .into_iter()
            .enumerate()
            .flat_map(|(shard, (found, _))| {
                found
                    .into_iter()
                    .map(move |(due, key)| (due, key, shard as u16))
            })
            .filter(|(due, key, _)| cut.as_ref().is_none_or(|c| (*due, key) <= (c.0, &c.1)))
            .collect();
        candidates.sort();
        let full = candidates.len() > limit;
        candidates.truncate(limit);

        let groups = self.group_summaries(&candidates).await?;
        let next = if full || (candidates.len() == limit && cut.is_some()) {
            candidates.last().map(|(due, key, _)| (*due, key.clone()))
        } else {
            cut
        };
        Ok((groups, next))
    }

    /// Reads the metadata (not the items) of the given (due, key, shard)
    /// groups. Each read is its own call, so that on a cluster each goes
    /// to the node of its shard; the multiplexed connection pipelines them.
    /// A group flushed meanwhile is left out.
    async fn group_summaries(&self, candidates: &[(u64, String, u16)]) -> Result<Vec<Group>> {
        let reads = candidates
            .iter()
            .map(|(_, key, shard)| self.open_group(*shard, key, false));
        Ok(try_join_all(reads).await?.into_iter().flatten().collect())
    }

    /// Reads up to `limit` (due, key) entries of one shard after `after`
    /// matching one of `prefixes`, scanning at most `budget` entries. Also returns the
    /// last position scanned when the budget ran out first.
    async fn scan_due(
        &self,
        shard: u16,
        limit: usize,
        after: Option<&GroupPos>,
        prefixes: &[String],
        budget: usize,
    ) -> Result<ShardScan> {
        let due_key = self.keys.shard(shard).due;
        let mut conn = self.conn.clone();
        let min = after.map_or("-inf".to_owned(), |(due, _)| due.to_string());
        let page = 256.min(budget);
        let mut found = Vec::new();
        let mut scanned = 0;
        let mut last: Option<GroupPos> = None;
        while found.len() <= limit {
            let entries: Vec<(String, u64)> = redis::cmd("ZRANGE")
                .arg(&due_key)
                .arg(&min)
                .arg("+inf")
                .arg("BYSCORE")
                .arg("LIMIT")
                .arg(scanned)
                .arg(page)
                .arg("WITHSCORES")
                .query_async(&mut conn)
                .await?;
            let exhausted = entries.len() < page;
            scanned += entries.len();
            for (key, due) in entries {
                let pos = (due, key);
                if after.is_some_and(|a| pos <= *a) {
                    continue;
                }
                if prefixes.iter().any(|p| pos.1.starts_with(p.as_str())) {
                    found.push(pos.clone());
                }
                last = Some(pos);
            }
            if exhausted {
                return Ok((found, None));
            }
            if scanned >= budget {
                return Ok((found, last));
            }
        }
        Ok((found, None))
    }

    /// The keys of one shard's open groups, a page at a time: pass the
    /// cursor returned (0 at first); 0 back means the scan is done. A key
    /// may come twice.
    pub async fn open_keys(&self, shard: u16, cursor: u64) -> Result<(u64, Vec<String>)> {
        let due_key = self.keys.shard(shard).due;
        let mut conn = self.conn.clone();
        let (next, flat): (u64, Vec<String>) = redis::cmd("ZSCAN")
            .arg(&due_key)
            .arg(cursor)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await?;
        Ok((next, flat.into_iter().step_by(2).collect()))
    }

    /// Brings `key`'s open group under a shorter `max_wait`: it is due no
    /// later than its opening plus `max_wait`. Returns its due time (ms),
    /// 0 when no group is open.
    pub async fn retime(&self, key: &str, max_wait: Duration) -> Result<u64> {
        let shard = self.keys.shard_of(key);
        self.run_script(
            Code::Function(Function::Retime),
            &[&self.keys.shard(shard).due, &self.keys.group(shard, key)],
            vec![
                key.as_bytes().to_vec(),
                max_wait.as_millis().to_string().into_bytes(),
            ],
        )
        .await
    }
}
