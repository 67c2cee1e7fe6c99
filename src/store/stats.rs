//! Reads for the metrics gauges: how many groups are open, and each
//! consumer group's pending batches, lag and dead letters, summed over the
//! shards. One command per shard key, so each goes to its shard's node.

use std::collections::BTreeMap;

use futures::future::try_join_all;
use redis::AsyncTypedCommands;
use redis::streams::StreamInfoGroupsReply;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::conn::Code;
use super::{Result, Store};
use crate::batch::OpenLimit;
use crate::scripts::Function;

/// One consumer group's backlog, summed over the shard streams.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConsumerGroupStats {
    pub name: String,
    /// Batches delivered to a consumer and not yet acked.
    pub pending: u64,
    /// Batches not yet delivered to any consumer (Redis 7 `XINFO GROUPS`
    /// `lag`; a shard where Redis cannot tell counts 0).
    pub lag: u64,
    /// Batches dead-lettered, not re-driven.
    pub dead_letters: u64,
}

/// The limits on open groups in force, as [`Store::open_limits`] reads them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpenLimits {
    /// Per limit: its name (see [`OpenLimit::name`]), the groups open
    /// under it, and the limit.
    pub rows: Vec<(String, u64, u64)>,
    /// Age of the oldest group open under a limit, if any is open.
    pub oldest_age: Option<Duration>,
}

/// The groups opened under limits on open groups, summed over the shards.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpenLimitStats {
    /// Every group open under a limit (the service's counts these).
    pub groups: u64,
    /// When the oldest of them opened (ms, Redis clock).
    pub oldest_opened_ms: Option<u64>,
    /// Per scope asked for, in order, its groups.
    pub per_scope: Vec<u64>,
}

impl Store {
    /// The limits on open groups in force (the service's, then each
    /// policy's), each with the groups open under it now, and the age of
    /// the oldest of those groups. Reads nothing when no limit is set.
    pub async fn open_limits(&self) -> Result<OpenLimits> {
        let table = self.policies.current();
        let limited = table.limited();
        let service = self.max_open_groups();
        if service == 0 && limited.is_empty() {
            return Ok(OpenLimits::default());
        }
        let scopes: Vec<&str> = limited.iter().filter_map(|p| p.scope.as_deref()).collect();
        let stats = self.open_limit_stats(&scopes).await?;
        let mut rows = Vec::new();
        if service > 0 {
            rows.push((OpenLimit::Service.name(), stats.groups, u64::from(service)));
        }
        for (policy, open) in limited.iter().zip(&stats.per_scope) {
            let scope = policy.scope.clone().unwrap_or_default();
            let limit = u64::from(policy.max_groups);
            rows.push((OpenLimit::Policy(scope).name(), *open, limit));
        }
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let oldest_age = stats
            .oldest_opened_ms
            .map(|opened| Duration::from_millis(now_ms.saturating_sub(opened)));
        Ok(OpenLimits { rows, oldest_age })
    }

    /// The groups open under limits on open groups: all of them, the
    /// oldest one's opening, and those counted under each of `scopes` (a
    /// policy's scope, see `Policy::scope`).
    pub async fn open_limit_stats(&self, scopes: &[&str]) -> Result<OpenLimitStats> {
        let args: Vec<Vec<u8>> = scopes.iter().map(|s| s.as_bytes().to_vec()).collect();
        let reads = (0..self.keys.shards()).map(|shard| {
            let args = args.clone();
            async move {
                let index = self.keys.shard(shard).open_index;
                self.run_read_script::<Vec<i64>>(
                    Code::Function(Function::OpenStats),
                    &[&index],
                    args,
                )
                .await
            }
        });
        let mut stats = OpenLimitStats {
            per_scope: vec![0; scopes.len()],
            ..OpenLimitStats::default()
        };
        for shard in try_join_all(reads).await? {
            let mut parts = shard.into_iter().map(|n| u64::try_from(n).ok());
            stats.groups += parts.next().flatten().unwrap_or(0);
            if let Some(opened) = parts.next().flatten() {
                stats.oldest_opened_ms =
                    Some(stats.oldest_opened_ms.map_or(opened, |o| o.min(opened)));
            }
            for (sum, n) in stats.per_scope.iter_mut().zip(parts) {
                *sum += n.unwrap_or(0);
            }
        }
        Ok(stats)
    }

    /// Open groups: the entries of every shard's due set.
    pub async fn open_groups(&self) -> Result<u64> {
        let counts = (0..self.keys.shards()).map(|shard| async move {
            let mut conn = self.conn.clone();
            conn.zcard(self.keys.shard(shard).due).await
        });
        Ok(try_join_all(counts).await?.into_iter().sum::<usize>() as u64)
    }

    /// Every consumer group on the shard streams, by name, with its backlog.
    pub async fn consumer_group_stats(&self) -> Result<Vec<ConsumerGroupStats>> {
        let shards = (0..self.keys.shards()).map(|shard| self.shard_group_stats(shard));
        let mut sums: BTreeMap<String, ConsumerGroupStats> = BTreeMap::new();
        for stats in try_join_all(shards).await?.into_iter().flatten() {
            let sum = sums.entry(stats.name.clone()).or_default();
            sum.name = stats.name;
            sum.pending += stats.pending;
            sum.lag += stats.lag;
            sum.dead_letters += stats.dead_letters;
        }
        Ok(sums.into_values().collect())
    }

    /// The consumer groups of one shard's stream and their backlog there.
    async fn shard_group_stats(&self, shard: u16) -> Result<Vec<ConsumerGroupStats>> {
        let mut conn = self.conn.clone();
        let stream = self.keys.shard(shard).stream;
        // XINFO GROUPS fails on a stream that does not exist yet.
        if !conn.exists(&stream).await? {
            return Ok(Vec::new());
        }
        let reply: StreamInfoGroupsReply = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(&stream)
            .query_async(&mut conn)
            .await?;
        let reads = reply.groups.into_iter().map(|group| {
            let mut conn = self.conn.clone();
            let dead = self.keys.dead_letters(shard, &group.name);
            async move {
                let dead_letters = conn.zcard(dead).await?;
                Ok::<_, redis::RedisError>(ConsumerGroupStats {
                    name: group.name,
                    pending: group.pending as u64,
                    lag: group.lag.unwrap_or(0) as u64,
                    dead_letters: dead_letters as u64,
                })
            }
        });
        Ok(try_join_all(reads).await?)
    }
}
