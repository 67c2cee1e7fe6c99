//! The shard streams, the outbox of flushed batches: where each stream's head
//! is, reading batches back (non-blocking on the shared connection, or
//! blocking on a dedicated one, as the subscribers' tails do), and trimming.

use std::time::Duration;

use futures::future::try_join_all;
use redis::streams::{StreamReadOptions, StreamTrimOptions, StreamTrimmingMode};
use redis::{AsyncTypedCommands, ErrorKind, RedisError, ServerErrorKind};

use super::decode::{LastGenerated, batches_from_entries, batches_from_read};
use super::{Conn, Result, Store};
use crate::batch::{Batch, StreamId};

/// Whether an error is Redis's answer to reading a stream that does not exist yet.
fn no_stream(err: &RedisError) -> bool {
    err.kind() == ErrorKind::Server(ServerErrorKind::ResponseError)
}

impl Store {
    /// The last entry id each shard's stream ever generated: the position
    /// "now". Unlike the newest retained entry, it survives trimming, so a
    /// cursor stays valid after its batches are trimmed away.
    pub async fn stream_heads(&self) -> Result<Vec<StreamId>> {
        let heads = (0..self.keys.shards()).map(|shard| async move {
            let mut conn = self.conn.clone();
            let info = redis::cmd("XINFO")
                .arg("STREAM")
                .arg(self.keys.shard(shard).stream)
                .query_async::<LastGenerated>(&mut conn)
                .await;
            match info {
                Ok(LastGenerated(head)) => Ok(head),
                // No stream yet: nothing was ever flushed in this shard.
                Err(err) if no_stream(&err) => Ok(StreamId::ZERO),
                Err(err) => Err(err.into()),
            }
        });
        try_join_all(heads).await
    }

    /// Reads up to `count` batches of a shard's stream after `after`.
    pub async fn read_batches(
        &self,
        shard: u16,
        after: StreamId,
        count: usize,
    ) -> Result<Vec<Batch>> {
        let mut conn = self.conn.clone();
        let stream = self.keys.shard(shard).stream;
        let entries = redis::Cmd::xrange_count(stream, format!("({after}"), "+", count)
            .query_async(&mut conn)
            .await?;
        Ok(batches_from_entries(shard, entries)?)
    }

    /// The batch stored at `entry` of a shard's stream, if it is still
    /// retained.
    pub async fn batch(&self, shard: u16, entry: StreamId) -> Result<Option<Batch>> {
        let mut conn = self.conn.clone();
        let stream = self.keys.shard(shard).stream;
        let id = entry.to_string();
        let entries = redis::Cmd::xrange_count(stream, &id, &id, 1)
            .query_async(&mut conn)
            .await?;
        Ok(batches_from_entries(shard, entries)?.pop())
    }

    /// Waits up to `block` for batches of a shard's stream after `after`, and
    /// reads up to `count` of them. Blocking, so `conn` must be a connection
    /// of the caller's own ([`Store::blocking_connection`]), never the shared one.
    pub async fn tail_batches(
        &self,
        conn: &mut Conn,
        shard: u16,
        after: StreamId,
        count: usize,
        block: Duration,
    ) -> Result<Vec<Batch>> {
        let options = StreamReadOptions::default()
            .count(count)
            .block(block.as_millis() as usize);
        let stream = self.keys.shard(shard).stream;
        let reply = redis::Cmd::xread_options(&[stream], &[after.to_string()], &options)
            .query_async(conn)
            .await?;
        Ok(batches_from_read(shard, reply)?)
    }

    /// Trims a shard's stream of entries older than `min`, but never one that
    /// a consumer group has not yet acked: the cut stays at or below every
    /// group's oldest pending entry, first undelivered entry and oldest dead
    /// letter. Returns the cut used.
    pub async fn trim_before(&self, shard: u16, min: StreamId) -> Result<StreamId> {
        let stream = self.keys.shard(shard).stream;
        let mut conn = self.conn.clone();
        let groups = match conn.xinfo_groups(&stream).await {
            Ok(info) => info.groups,
            // No stream yet: nothing to trim.
            Err(err) if no_stream(&err) => return Ok(min),
            Err(err) => return Err(err.into()),
        };
        let mut cut = min;
        for group in groups {
            // Everything after the last delivered entry is undelivered.
            let last_delivered: StreamId = group.last_delivered_id.parse()?;
            cut = cut.min(StreamId {
                ms: last_delivered.ms,
                seq: last_delivered.seq + 1,
            });
            if group.pending > 0 {
                let oldest = conn
                    .xpending_count(&stream, &group.name, "-", "+", 1)
                    .await?;
                if let Some(entry) = oldest.ids.first() {
                    cut = cut.min(entry.id.parse()?);
                }
            }
            let dead: Vec<String> = redis::cmd("ZRANGE")
                .arg(self.keys.dead_letters(shard, &group.name))
                .arg(0)
                .arg(0)
                .query_async(&mut conn)
                .await?;
            if let Some(id) = dead.first() {
                cut = cut.min(id.parse()?);
            }
        }
        // Exact, not approximate (~): with `~` Redis only drops whole nodes,
        // and a quiet stream would keep its old batches indefinitely.
        let exact = StreamTrimOptions::minid(StreamTrimmingMode::Exact, cut.to_string());
        conn.xtrim_options(&stream, &exact).await?;
        // Requeue markers of trimmed batches: those batches cannot be
        // requeued any more (NOT_FOUND), so the markers have done their job.
        let _: () = redis::cmd("ZREMRANGEBYSCORE")
            .arg(self.keys.shard(shard).requeued)
            .arg("-inf")
            .arg(format!("({}", cut.ms))
            .query_async(&mut conn)
            .await?;
        Ok(cut)
    }
}
