//! Durable subscriptions: consumer groups over the shard streams. Creating
//! one, reading its new batches, claiming timed-out ones (or dead-lettering
//! them), acks, dead letters and re-drives.

use std::collections::HashMap;
use std::time::Duration;

use futures::future::try_join_all;
use redis::AsyncTypedCommands;
use redis::streams::{StreamPendingReply, StreamReadOptions};

use super::conn::Code;
use super::decode::{Claimed, batch_from_entry, batches_from_entries, batches_from_read};
use super::{Result, Store};
use crate::batch::{Batch, DecodeError, StreamId};
use crate::scripts;

impl Store {
    /// Reads a consumer group's definition.
    pub async fn consumer_group(&self, name: &str) -> Result<Option<String>> {
        let mut conn = self.conn.clone();
        Ok(conn.hget(self.keys.consumer_groups(), name).await?)
    }

    /// Creates a consumer group on every shard stream, starting at the end
    /// (`from_start` false) or at the oldest retained batch, then records its
    /// definition unless another caller recorded one first. Returns the
    /// definition in force.
    pub async fn create_consumer_group(
        &self,
        name: &str,
        definition: &str,
        from_start: bool,
    ) -> Result<String> {
        // Nothing is written under a prefix that holds another data format.
        self.check_format().await?;
        let start = if from_start { "0" } else { "$" };
        // One command per shard stream, each to the node of its shard.
        let creates = (0..self.keys.shards()).map(|shard| async move {
            let mut conn = self.conn.clone();
            let stream = self.keys.shard(shard).stream;
            match conn.xgroup_create_mkstream(stream, name, start).await {
                Ok(()) => Ok(()),
                Err(err) if err.code() == Some("BUSYGROUP") => Ok(()),
                Err(err) => Err(err),
            }
        });
        try_join_all(creates).await?;
        let mut conn = self.conn.clone();
        conn.hset_nx(self.keys.consumer_groups(), name, definition)
            .await?;
        Ok(self
            .consumer_group(name)
            .await?
            .unwrap_or_else(|| definition.to_owned()))
    }

    /// Reads up to `count` batches of a shard not yet delivered to the group,
    /// and delivers them to `consumer` (they are pending until acked).
    /// Non-blocking, so it may use the shared connection.
    pub async fn read_group(
        &self,
        shard: u16,
        group: &str,
        consumer: &str,
        count: usize,
    ) -> Result<Vec<Batch>> {
        let mut conn = self.conn.clone();
        let options = StreamReadOptions::default()
            .group(group, consumer)
            .count(count);
        let stream = self.keys.shard(shard).stream;
        let reply = redis::Cmd::xread_options(&[stream], &[">"], &options)
            .query_async(&mut conn)
            .await?;
        Ok(batches_from_read(shard, reply)?)
    }

    /// How many batches `consumer` holds unacked, over every shard: the
    /// entries of the group's pending lists that it owns. The pending lists
    /// are the one count every instance agrees on: an ack anywhere and a
    /// takeover by another consumer both lower it.
    pub async fn pending_of(&self, group: &str, consumer: &str) -> Result<usize> {
        let counts = (0..self.keys.shards()).map(|shard| async move {
            let mut conn = self.conn.clone();
            let reply = conn.xpending(self.keys.shard(shard).stream, group).await?;
            Ok::<_, super::StoreError>(match reply {
                StreamPendingReply::Data(data) => data
                    .consumers
                    .iter()
                    .find(|c| c.name == consumer)
                    .map_or(0, |c| c.pending),
                // Empty: nothing pending in this shard.
                _ => 0,
            })
        });
        Ok(try_join_all(counts).await?.into_iter().sum())
    }

    /// Takes over a group's batches that have been pending for at least
    /// `min_idle` (only `owner`'s, if given) for `consumer`, dead-lettering
    /// those delivered `max_deliveries` times. Returns the batches with their
    /// delivery counts.
    #[allow(clippy::too_many_arguments)]
    pub async fn claim(
        &self,
        shard: u16,
        group: &str,
        consumer: &str,
        min_idle: Duration,
        count: usize,
        max_deliveries: u32,
        owner: Option<&str>,
    ) -> Result<Vec<(Batch, u32)>> {
        let stream = self.keys.shard(shard).stream;
        let dead = self.keys.dead_letters(shard, group);
        let claimed: Vec<Claimed> = self
            .run_script(
                Code::Script(&scripts::CLAIM_BATCHES),
                &[&stream, &dead],
                vec![
                    group.as_bytes().to_vec(),
                    consumer.as_bytes().to_vec(),
                    min_idle.as_millis().to_string().into_bytes(),
                    count.to_string().into_bytes(),
                    max_deliveries.to_string().into_bytes(),
                    owner.unwrap_or("").as_bytes().to_vec(),
                ],
            )
            .await?;
        claimed
            .into_iter()
            .map(|claimed| {
                let batch = batch_from_entry(shard, claimed.entry).map_err(DecodeError::from)?;
                Ok((batch, claimed.deliveries))
            })
            .collect()
    }

    /// Releases the batches `consumer` holds unacked in every shard, so that
    /// the group's other consumers take them over at their next claim
    /// (`release_batches.lua`), then counts the release in the group's
    /// entry of the released hash, which those consumers watch. Returns how
    /// many batches were released.
    pub async fn release(&self, group: &str, consumer: &str) -> Result<usize> {
        let releases = (0..self.keys.shards()).map(|shard| async move {
            let stream = self.keys.shard(shard).stream;
            self.run_script::<usize>(
                Code::Script(&scripts::RELEASE_BATCHES),
                &[&stream],
                vec![
                    group.as_bytes().to_vec(),
                    consumer.as_bytes().to_vec(),
                    RELEASE_AT_MOST.to_string().into_bytes(),
                ],
            )
            .await
        });
        let released: usize = try_join_all(releases).await?.into_iter().sum();
        if released > 0 {
            let mut conn = self.conn.clone();
            conn.hincr(self.keys.released(), group, 1).await?;
        }
        Ok(released)
    }

    /// How many times batches of `group` have been released (see
    /// [`Store::release`]); None before the first time.
    pub async fn releases(&self, group: &str) -> Result<Option<u64>> {
        let mut conn = self.conn.clone();
        let count: Option<u64> = redis::cmd("HGET")
            .arg(self.keys.released())
            .arg(group)
            .query_async(&mut conn)
            .await?;
        Ok(count)
    }

    /// Acks stream entries for a group (batches a consumer group skips).
    pub async fn ack_entries(&self, shard: u16, group: &str, ids: &[StreamId]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut conn = self.conn.clone();
        let ids: Vec<String> = ids.iter().map(StreamId::to_string).collect();
        conn.xack(self.keys.shard(shard).stream, group, &ids)
            .await?;
        Ok(())
    }

    /// Acks batches (by shard and original entry id) for a group. Returns how
    /// many were pending.
    pub async fn ack(&self, group: &str, ids: &[(u16, StreamId)]) -> Result<u32> {
        let calls = per_shard(ids).into_iter().map(|(shard, ids)| async move {
            let stream = self.keys.shard(shard).stream;
            let redriven = self.keys.redriven(shard, group);
            self.run_script::<u32>(
                Code::Script(&scripts::ACK_BATCHES),
                &[&stream, &redriven],
                group_and_ids(group, &ids),
            )
            .await
        });
        Ok(try_join_all(calls).await?.into_iter().sum())
    }

    /// Re-drives dead-lettered batches of a group. Returns how many were dead letters.
    pub async fn redrive(&self, group: &str, ids: &[(u16, StreamId)]) -> Result<u32> {
        let calls = per_shard(ids).into_iter().map(|(shard, ids)| async move {
            let stream = self.keys.shard(shard).stream;
            let dead = self.keys.dead_letters(shard, group);
            let redriven = self.keys.redriven(shard, group);
            self.run_script::<u32>(
                Code::Script(&scripts::REDRIVE_BATCHES),
                &[&stream, &dead, &redriven],
                group_and_ids(group, &ids),
            )
            .await
        });
        Ok(try_join_all(calls).await?.into_iter().sum())
    }

    /// A page of a group's dead letters, oldest first: at most `limit`,
    /// after the position `after` (a shard and its stream entry id), with the
    /// position to continue from when more follow. A dead letter whose batch
    /// retention has trimmed is left out.
    pub async fn dead_letters(
        &self,
        group: &str,
        limit: usize,
        after: Option<DeadLetterPosition>,
    ) -> Result<(Vec<Batch>, Option<DeadLetterPosition>)> {
        let mut candidates = Vec::new();
        for shard in 0..self.keys.shards() {
            let ids = self.dead_ids_after(shard, group, limit + 1, after).await?;
            candidates.extend(ids.into_iter().map(|id| (id, shard)));
        }
        candidates.sort();
        let next = (candidates.len() > limit).then(|| {
            let (id, shard) = candidates[limit - 1];
            (shard, id)
        });
        candidates.truncate(limit);
        let reads = candidates.iter().map(|&(id, shard)| {
            let mut conn = self.conn.clone();
            let stream = self.keys.shard(shard).stream;
            let id = id.to_string();
            async move {
                let entries = redis::Cmd::xrange(&stream, &id, &id)
                    .query_async(&mut conn)
                    .await?;
                batches_from_entries(shard, entries).map_err(super::StoreError::from)
            }
        });
        let batches = try_join_all(reads).await?.into_iter().flatten().collect();
        Ok((batches, next))
    }

    /// Up to `want` of a shard's dead-lettered entry ids that sort after
    /// `after`, oldest first. The set is scored by each entry's milliseconds,
    /// so the read starts at the position's millisecond and skips what is
    /// not after it.
    async fn dead_ids_after(
        &self,
        shard: u16,
        group: &str,
        want: usize,
        after: Option<DeadLetterPosition>,
    ) -> Result<Vec<StreamId>> {
        let mut conn = self.conn.clone();
        let key = self.keys.dead_letters(shard, group);
        let from = after.map_or(0, |(_, id)| id.ms);
        let chunk = want.max(64);
        let mut out = Vec::new();
        let mut offset = 0;
        loop {
            let ids: Vec<String> = redis::cmd("ZRANGE")
                .arg(&key)
                .arg(from)
                .arg("+inf")
                .arg("BYSCORE")
                .arg("LIMIT")
                .arg(offset)
                .arg(chunk)
                .query_async(&mut conn)
                .await?;
            let read = ids.len();
            for id in ids {
                let id: StreamId = id
                    .parse()
                    .map_err(|_| DecodeError(format!("dead letter {id:?} is not an entry id")))?;
                if after.is_none_or(|position| (id, shard) > (position.1, position.0)) {
                    out.push(id);
                }
            }
            if read < chunk || out.len() >= want {
                out.sort();
                out.truncate(want);
                return Ok(out);
            }
            offset += chunk;
        }
    }
}

/// The most batches one release takes from a consumer in one shard: far
/// more than a consumer holds (its `max_unacked`, at most a little over).
const RELEASE_AT_MOST: usize = 100_000;

/// A place in the listing of a group's dead letters: a shard and a stream
/// entry id. Pages run in (entry id, shard) order.
pub type DeadLetterPosition = (u16, StreamId);

/// The arguments of the ack and re-drive scripts: the group, then the entry ids.
fn group_and_ids(group: &str, ids: &[StreamId]) -> Vec<Vec<u8>> {
    let mut args = vec![group.as_bytes().to_vec()];
    args.extend(ids.iter().map(|id| id.to_string().into_bytes()));
    args
}

/// Groups (shard, id) pairs by shard.
fn per_shard(ids: &[(u16, StreamId)]) -> HashMap<u16, Vec<StreamId>> {
    let mut out: HashMap<u16, Vec<StreamId>> = HashMap::new();
    for (shard, id) in ids {
        out.entry(*shard).or_default().push(*id);
    }
    out
}
