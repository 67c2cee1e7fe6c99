//! Scenario 8, Redis memory per remembered item id: the dedup sets. Scenario
//! 6 measures open groups; this one measures what every flushed item leaves
//! behind for the dedup window, its id in its shard's flushed set.
//!
//! N items (200k; quick: 20k) are added through the service by AddMany calls
//! of 100 items, ten items under each of N/10 fresh keys (policy: max_items
//! 10), so every group flushes by SIZE and every id lands in a flushed set.
//! The figure is `MEMORY USAGE <flushed set> SAMPLES 0` (every member
//! sampled, so Redis's allocation-size accounting of exactly those keys)
//! summed over the shards, divided by their `ZCARD` total. As a cross-check
//! the details give Redis `used_memory` after − before − the `MEMORY USAGE`
//! of the shard streams those batches were written to, per item.

use std::sync::Arc;
use std::time::Instant;

use batcher::keys::Keyspace;
use redis::aio::MultiplexedConnection;

use super::load::{connect_many, fill, key};
use super::scenarios::{Sizes, Target, redis_connection, used_memory};

/// Items per key: the default policy's max_items, so each key flushes once.
const PER_KEY: usize = 10;

/// What scenario 8 measured.
pub struct Remembered {
    /// Items added (and flushed) through the service.
    pub items: u64,
    pub added_per_sec: f64,
    /// Ids in the flushed sets afterwards, summed over the shards.
    pub remembered: u64,
    /// `MEMORY USAGE … SAMPLES 0` of the flushed sets, summed over the shards.
    pub flushed_set_bytes: u64,
    /// `MEMORY USAGE … SAMPLES 0` of the shard streams, summed.
    pub stream_bytes: u64,
    /// Redis used_memory before and after the adds.
    pub memory_before: u64,
    pub memory_after: u64,
}

impl Remembered {
    /// The figure: bytes of flushed set per remembered id.
    pub fn bytes_per_id(&self) -> f64 {
        self.flushed_set_bytes as f64 / self.remembered.max(1) as f64
    }

    /// The cross-check: (used_memory growth − stream bytes) per item added.
    pub fn used_memory_per_item(&self) -> f64 {
        let grown = self.memory_after as f64 - self.memory_before as f64;
        (grown - self.stream_bytes as f64) / self.items.max(1) as f64
    }
}

/// Scenario 8: flushes `sizes.remembered` items through the service (keys
/// `rm-<run><n>`, 15 bytes; ids 25 bytes) and measures the flushed sets of
/// `keyspace`, the keyspace the service writes.
pub async fn remembered_ids(
    t: &Target,
    s: &Sizes,
    run: &str,
    keyspace: &Keyspace,
) -> Result<Remembered, String> {
    let clients = connect_many(t.addr, 4).await?;
    let keys: Vec<String> = (0..s.remembered.div_ceil(PER_KEY))
        .flat_map(|n| std::iter::repeat_n(key("rm", run, n as u64), PER_KEY))
        .collect();
    let wanted = keys.len() as u64;
    let memory_before = used_memory(&t.redis_url).await?;
    let started = Instant::now();
    // Chunks of 100 consecutive keys: ten whole groups per AddMany call.
    let items = fill(&clients, Arc::new(keys), run, 16).await?;
    let added_per_sec = items as f64 / started.elapsed().as_secs_f64();
    if items != wanted {
        return Err(format!("added {items} items, expected {wanted}"));
    }
    let memory_after = used_memory(&t.redis_url).await?;
    let mut conn = redis_connection(&t.redis_url).await?;
    let (mut remembered, mut flushed_set_bytes, mut stream_bytes) = (0, 0, 0);
    for shard in 0..keyspace.shards() {
        let keys = keyspace.shard(shard);
        remembered += zcard(&mut conn, &keys.flushed).await?;
        flushed_set_bytes += memory_usage(&mut conn, &keys.flushed).await?;
        stream_bytes += memory_usage(&mut conn, &keys.stream).await?;
    }
    Ok(Remembered {
        items,
        added_per_sec,
        remembered,
        flushed_set_bytes,
        stream_bytes,
        memory_before,
        memory_after,
    })
}

/// `MEMORY USAGE key SAMPLES 0` (every element sampled); 0 for no key.
async fn memory_usage(conn: &mut MultiplexedConnection, key: &str) -> Result<u64, String> {
    let bytes: Option<u64> = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .arg("SAMPLES")
        .arg(0)
        .query_async(conn)
        .await
        .map_err(|e| format!("MEMORY USAGE {key}: {e}"))?;
    Ok(bytes.unwrap_or(0))
}

async fn zcard(conn: &mut MultiplexedConnection, key: &str) -> Result<u64, String> {
    redis::cmd("ZCARD")
        .arg(key)
        .query_async(conn)
        .await
        .map_err(|e| format!("ZCARD {key}: {e}"))
}
