//! What a sink's deliverer asks of Redis besides a durable group's reads
//! and acks: a lease per shard (the one instance that delivers the shard's
//! batches), taking over what a former holder left pending, and dead
//! letters that keep why they failed.

use std::time::Duration;

use redis::AsyncTypedCommands;

use super::conn::Code;
use super::decode::{Entry, batches_from_entries};
use super::{Result, Store};
use crate::batch::{Batch, StreamId};
use crate::scripts;

impl Store {
    /// Takes or renews `holder`'s lease on a shard of a sink's `group` for
    /// `ttl` (a zero `ttl` gives it up). Returns whether `holder` holds it.
    pub async fn sink_lease(
        &self,
        shard: u16,
        group: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool> {
        let lease = self.keys.sink_lease(shard, group);
        let held: u32 = self
            .run_script(
                Code::Script(&scripts::TAKE_LEASE),
                &[&lease],
                vec![
                    holder.as_bytes().to_vec(),
                    ttl.as_millis().to_string().into_bytes(),
                ],
            )
            .await?;
        Ok(held == 1)
    }

    /// Takes every batch of a shard that the group holds pending, whoever
    /// holds it, for `consumer`: up to `count` of them from `start` on
    /// (`StreamId::ZERO` first), in stream order, with where to go on from
    /// (None once the pending list is done).
    pub async fn take_pending(
        &self,
        shard: u16,
        group: &str,
        consumer: &str,
        start: StreamId,
        count: usize,
    ) -> Result<(Vec<Batch>, Option<StreamId>)> {
        let mut conn = self.conn.clone();
        let stream = self.keys.shard(shard).stream;
        let (next, entries, _deleted): (String, Vec<Entry>, Vec<String>) = redis::cmd("XAUTOCLAIM")
            .arg(&stream)
            .arg(group)
            .arg(consumer)
            .arg(0)
            .arg(start.to_string())
            .arg("COUNT")
            .arg(count)
            .query_async(&mut conn)
            .await?;
        let batches = batches_from_entries(shard, entries)?;
        let next: Option<StreamId> = next.parse().ok().filter(|id| *id != StreamId::ZERO);
        Ok((batches, next))
    }

    /// Moves a batch the group holds pending to the group's dead letters,
    /// with `why` (the last status and an excerpt of the answer), in one
    /// transaction. `redrive` sends it again.
    pub async fn dead_letter_sink(&self, group: &str, batch: &Batch, why: &str) -> Result<()> {
        let shard = batch.shard;
        let mut conn = self.conn.clone();
        let id = batch.stream_id.to_string();
        let mut pipe = redis::pipe();
        pipe.atomic()
            .zadd(
                self.keys.dead_letters(shard, group),
                &id,
                batch.stream_id.ms,
            )
            .ignore()
            .xack(self.keys.shard(shard).stream, group, &[&id])
            .ignore()
            .hset(self.keys.sink_failures(shard, group), batch.id(), why)
            .ignore();
        let () = pipe.query_async(&mut conn).await?;
        Ok(())
    }

    /// Why a sink's dead letter failed (the last status and an excerpt of
    /// the answer), by batch id.
    pub async fn sink_failure(&self, group: &str, batch_id: &str) -> Result<Option<String>> {
        let Some((shard, _)) = Batch::parse_id(batch_id) else {
            return Ok(None);
        };
        let mut conn = self.conn.clone();
        Ok(conn
            .hget(self.keys.sink_failures(shard, group), batch_id)
            .await?)
    }
}
