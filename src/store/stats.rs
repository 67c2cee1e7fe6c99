//! Reads for the metrics gauges: how many groups are open, and each
//! consumer group's pending batches, lag and dead letters, summed over the
//! shards. One command per shard key, so each goes to its shard's node.

use std::collections::BTreeMap;

use futures::future::try_join_all;
use redis::AsyncTypedCommands;
use redis::streams::StreamInfoGroupsReply;

use super::{Result, Store};

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

impl Store {
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
