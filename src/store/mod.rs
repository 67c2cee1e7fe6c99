//! The store: every read and write of batcher's state in Redis.
//!
//! Writes go through the Lua in `scripts` (the library's functions, and the
//! durable subscriptions' scripts), each run by `invoke` with
//! all of its keys in KEYS, and they always share one shard's hash tag. Calls
//! made together (AddMany across shards, a sweep's flushes) are issued
//! concurrently on the multiplexed connection, which pipelines them. The only
//! blocking reads, the subscribers' stream tails, also live here, but run on
//! a dedicated connection that the caller owns. Every command and pipeline
//! keeps to one shard's keys, so each goes whole to the node that holds the
//! shard on a Redis Cluster.
//!
//! Replies are decoded by redis-rs: its stream reply types for stream
//! commands, and `FromRedisValue` impls in `decode` for our own shapes.
//!
//! - `add/`: the write path, one wing (its module doc describes it whole):
//!   a request split per shard, the add writers and their queues, the add
//!   function's arguments and reply, and making room under a limit on open
//!   groups.
//! - `conn`: connections to one Redis or a cluster, and `invoke` (with `WAIT`).
//! - `groups`: remove, flush, the due scan, and reading open groups.
//! - `streams`: stream heads, reads (including blocking tails) and trimming.
//! - `consumer_groups`: durable subscriptions' reads, claims, acks and dead letters.
//! - `sinks`: a sink's shard leases, recovery of what a former holder
//!   left pending, and dead letters with why they failed.
//! - `policies`: the policy store's documents, revision and history.
//! - `stats`: the counts behind the metrics gauges (open groups, consumer backlogs).
//! - `decode`: how replies become our types; `ext`: an item's ext, packed
//!   for the add function and read back from batches and groups.
//! - `error`: [`StoreError`], the layer's one error enum.

mod add;
mod conn;
mod consumer_groups;
mod decode;
mod error;
mod ext;
mod groups;
mod policies;
mod sinks;
mod stats;
mod streams;

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use redis::{FromRedisValue, RedisError};

use crate::keys::Keyspace;
use crate::policy::PolicyHandle;

pub use add::{AddArgs, AddReport, Deadline, LANES, NewItem};
pub use conn::{Conn, Endpoint, Password, RedisTarget, Timeouts, WaitReplicas};
pub use consumer_groups::DeadLetterPosition;
pub use decode::DueScan;
pub use error::{Result, StoreError};
pub use groups::GroupPos;
pub use policies::{BULK_CHANGE, PolicyChange, PolicyWrite, Revision, StoredPolicy, Written};
pub use stats::{ConsumerGroupStats, OpenLimitStats, OpenLimits};

use add::{AddWriter, ShardQueue};
use conn::{Code, Connector, invoke};

/// The Redis-backed state of batcher.
#[derive(Clone)]
pub struct Store {
    /// Multiplexed and self-reconnecting; shared by every request. Never used
    /// for blocking reads, which would stall every other caller.
    conn: Conn,
    /// Opens dedicated connections for blocking stream reads.
    connector: Connector,
    /// Whether, and how, write scripts wait for replicas.
    wait: Option<WaitReplicas>,
    connect_timeout: Duration,
    keys: Keyspace,
    dedup: Duration,
    /// The policies in force, for the `max_items` a flush cuts a group by.
    policies: PolicyHandle,
    /// One add writer per shard, with its bounded queue (see [`Store::add`]).
    queues: Arc<[ShardQueue]>,
    /// `[limits] max_open_groups` (0: none), which the writers read per call.
    open_limit: Arc<AtomicU32>,
    /// Set once the prefix's data format was found to be ours: at start, or
    /// (when Redis was down then) before the first add.
    format_checked: Arc<tokio::sync::OnceCell<()>>,
}

impl Store {
    /// A store over the Redis (or Redis Cluster) of `target`. Connects
    /// lazily, so the service starts (and answers UNAVAILABLE) while Redis is
    /// down. Must be called inside a tokio runtime: it starts one add writer
    /// task per shard, which ends when the last clone of the store is dropped.
    pub fn open(
        target: &RedisTarget,
        keys: Keyspace,
        dedup_window: Duration,
        policies: PolicyHandle,
    ) -> Result<Store> {
        let connector = Connector::new(target)?;
        let conn = connector.shared(target.timeouts)?;
        let open_limit = Arc::new(AtomicU32::new(0));
        let writer = AddWriter {
            conn: conn.clone(),
            wait: target.wait,
            keys: keys.clone(),
            dedup: dedup_window,
            shard: 0,
            open_limit: open_limit.clone(),
        };
        let queues = add::start_writers(writer, crate::config::DEFAULT_MAX_QUEUED_ADDS);
        Ok(Store {
            conn,
            connector,
            wait: target.wait,
            connect_timeout: target.timeouts.connect,
            keys,
            dedup: dedup_window,
            policies,
            queues,
            open_limit,
            format_checked: Arc::default(),
        })
    }

    /// The same store with each shard's add queue bounded to `max` items
    /// (`[limits] max_queued_adds`); call it before the store is shared.
    pub fn with_max_queued_adds(mut self, max: NonZeroUsize) -> Store {
        self.queues = self.queues.iter().map(|q| q.resized(max)).collect();
        self
    }

    /// Sets `[limits] max_open_groups`, the limit on open groups over all
    /// keys (0: none), for the adds from now on (a reload calls it too).
    pub fn set_max_open_groups(&self, total: u32) {
        self.open_limit.store(total, Ordering::Relaxed);
    }

    /// `[limits] max_open_groups` in force (0: none).
    pub fn max_open_groups(&self) -> u32 {
        self.open_limit.load(Ordering::Relaxed)
    }

    /// The key layout.
    pub fn keyspace(&self) -> &Keyspace {
        &self.keys
    }

    /// The policies in force: the handle a reload swaps them in.
    pub fn policies(&self) -> &PolicyHandle {
        &self.policies
    }

    /// A connection of the caller's own for blocking reads (each stream tail
    /// holds one). On a cluster it follows its shard's slot between nodes.
    pub async fn blocking_connection(&self) -> Result<Conn> {
        self.connector.dedicated(self.connect_timeout).await
    }

    /// Checks that Redis answers for every shard: on a cluster, that the
    /// master of each shard's slot does (a `PING` would go to every node, and
    /// fail for a replica the service does not need).
    pub async fn ping(&self) -> Result<()> {
        let checks = (0..self.keys.shards()).map(|shard| async move {
            let mut conn = self.conn.clone();
            redis::cmd("EXISTS")
                .arg(self.keys.shard(shard).due)
                .query_async::<()>(&mut conn)
                .await
        });
        futures::future::try_join_all(checks).await?;
        Ok(())
    }

    /// Checks the format marker under the prefix ([`Keyspace::format_marker`])
    /// against [`crate::scripts::FORMAT`], and the shard count recorded
    /// beside it ([`Keyspace::shards_marker`]) against `[redis] shards`,
    /// and sets both where the prefix holds nothing yet. A prefix with open
    /// groups or batches but no marker holds format 1, which had none (an
    /// empty shard stream is no sign of it: creating a consumer group makes
    /// one). Fails with [`StoreError::WrongFormat`] for any other format,
    /// older or newer, and with [`StoreError::WrongShards`] for another
    /// count. A prefix marked before the count was recorded takes this
    /// store's count. Once both were found to be ours, later calls answer
    /// at once: the service checks at start, or, when Redis is down then,
    /// before its first add.
    pub async fn check_format(&self) -> Result<()> {
        self.format_checked
            .get_or_try_init(|| self.read_format())
            .await
            .map(drop)
    }

    /// [`Store::check_format`], each time it is called.
    async fn read_format(&self) -> Result<()> {
        let format = crate::scripts::FORMAT.to_string();
        let shards = self.keys.shards().to_string();
        let (found, found_shards) = self.read_markers().await?;
        let found = match found {
            Some(found) => found,
            None if self.holds_unmarked_data().await? => "1".into(),
            None => self.set_once(&self.keys.format_marker(), &format).await?,
        };
        if found != format {
            return Err(StoreError::WrongFormat {
                found,
                prefix: self.keys.prefix().to_owned(),
            });
        }
        let found = match found_shards {
            Some(found) => found,
            // A fresh prefix, or one marked before counts were recorded.
            None => self.set_once(&self.keys.shards_marker(), &shards).await?,
        };
        if found != shards {
            return Err(StoreError::WrongShards {
                found,
                configured: self.keys.shards(),
                prefix: self.keys.prefix().to_owned(),
            });
        }
        Ok(())
    }

    /// Sets `key` to `value` unless it is set, and returns what it holds
    /// then: `value`, or what another instance set first.
    async fn set_once(&self, key: &str, value: &str) -> Result<String> {
        let mut conn = self.conn.clone();
        let set: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(value)
            .arg("NX")
            .query_async(&mut conn)
            .await?;
        if set.is_some() {
            return Ok(value.to_owned());
        }
        let held: Option<String> = redis::cmd("GET").arg(key).query_async(&mut conn).await?;
        // Deleted meanwhile: nothing under the prefix says otherwise.
        Ok(held.unwrap_or_else(|| value.to_owned()))
    }

    /// The format marker and the recorded shard count. Both share the
    /// prefix's hash tag: one slot, one `MGET`.
    async fn read_markers(&self) -> Result<(Option<String>, Option<String>)> {
        let mut conn = self.conn.clone();
        Ok(redis::cmd("MGET")
            .arg(self.keys.format_marker())
            .arg(self.keys.shards_marker())
            .query_async(&mut conn)
            .await?)
    }

    /// Whether any shard's due set or stream exists: data of format 1,
    /// when the prefix has no marker.
    async fn holds_unmarked_data(&self) -> Result<bool> {
        let shards = (0..self.keys.shards()).map(|shard| {
            let keys = self.keys.shard(shard);
            let mut conn = self.conn.clone();
            async move {
                let groups: u32 = redis::cmd("EXISTS")
                    .arg(&keys.due)
                    .query_async(&mut conn)
                    .await?;
                let batches: u32 = redis::cmd("XLEN")
                    .arg(&keys.stream)
                    .query_async(&mut conn)
                    .await?;
                Ok::<_, RedisError>(groups + batches)
            }
        });
        let used = futures::future::try_join_all(shards).await?;
        Ok(used.iter().any(|n| *n > 0))
    }

    /// Runs a write function or script on the shared connection, waiting for replicas
    /// when the store is set to (see `invoke`).
    async fn run_script<T: FromRedisValue>(
        &self,
        code: Code<'_>,
        keys: &[&str],
        args: Vec<Vec<u8>>,
    ) -> Result<T> {
        invoke(&self.conn, self.wait, code, keys, args).await
    }

    /// Runs a function or script that writes nothing: no replica has anything to confirm.
    async fn run_read_script<T: FromRedisValue>(
        &self,
        code: Code<'_>,
        keys: &[&str],
        args: Vec<Vec<u8>>,
    ) -> Result<T> {
        invoke(&self.conn, None, code, keys, args).await
    }
}
