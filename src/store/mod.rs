//! The store: every read and write of batcher's state in Redis.
//!
//! Writes go through the Lua scripts in `scripts`, each run by [`invoke`] with
//! all of its keys in KEYS, and they always share one shard's hash tag. Calls
//! made together (AddMany across shards, a sweep's flushes) are issued
//! concurrently on the multiplexed connection, which pipelines them. The only
//! blocking reads, the subscribers' stream tails, also live here, but run on
//! a dedicated connection that the caller owns.
//!
//! Replies are decoded by redis-rs: its stream reply types for stream
//! commands, and `FromRedisValue` impls in `decode` for our own shapes.
//!
//! - `add`: the add path and the per-shard writers; `add_args` builds the
//!   add script's arguments (also used by the bench).
//! - `groups`: remove, flush, the due scan, and reading open groups.
//! - `streams`: stream heads, reads (including blocking tails) and trimming.
//! - `consumer_groups`: durable subscriptions' reads, claims, acks and dead letters.
//! - `decode`: how replies become our types.

mod add;
mod add_args;
mod consumer_groups;
mod decode;
mod groups;
mod streams;

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{ErrorKind, FromRedisValue, RedisError, ServerErrorKind};
use tokio::sync::mpsc;

use crate::batch::DecodeError;
use crate::keys::{Keyspace, debug_assert_one_slot};
use crate::policy::PolicyHandle;

pub use add::{AddOutcome, AddReport, AddResult, NewItem};
pub use add_args::AddArgs;
pub use groups::{DueScan, GroupPos};

use add::{AddJob, AddWriter};

/// Errors of the store layer.
#[derive(Clone, Debug, thiserror::Error)]
pub enum StoreError {
    /// Redis could not be reached, or is not ready to serve (loading, failing over).
    #[error("redis unavailable: {0}")]
    Unavailable(RedisError),
    /// Redis answered with an error that retrying will not fix.
    #[error("redis error: {0}")]
    Redis(RedisError),
    /// Redis holds data that batcher did not write in that shape.
    #[error(transparent)]
    Decode(#[from] DecodeError),
}

impl From<RedisError> for StoreError {
    fn from(err: RedisError) -> StoreError {
        let transient = err.is_io_error()
            || err.is_timeout()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
            || matches!(
                err.kind(),
                ErrorKind::Server(
                    ServerErrorKind::BusyLoading
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                )
            );
        if transient {
            StoreError::Unavailable(err)
        } else if err.kind() == ErrorKind::Parse {
            // A reply that did not decode into the type asked for.
            StoreError::Decode(DecodeError(err.to_string()))
        } else {
            StoreError::Redis(err)
        }
    }
}

/// Result type of the store.
pub type Result<T> = std::result::Result<T, StoreError>;

/// The Redis-backed state of batcher.
#[derive(Clone)]
pub struct Store {
    /// Multiplexed and self-reconnecting; shared by every request. Never used
    /// for blocking reads, which would stall every other caller.
    conn: ConnectionManager,
    /// Kept to open dedicated connections for blocking stream reads.
    client: redis::Client,
    keys: Keyspace,
    dedup: Duration,
    /// The policies in force, for the `max_items` a flush cuts a group by.
    policies: PolicyHandle,
    /// One add writer per shard (see [`Store::add`]).
    writers: Arc<[mpsc::UnboundedSender<AddJob>]>,
}

/// Timeouts of the command connection.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    pub connect: Duration,
    pub response: Duration,
}

impl Store {
    /// A store over the Redis at `url`. Connects lazily, so the service starts
    /// (and answers UNAVAILABLE) while Redis is down. Must be called inside a
    /// tokio runtime: it starts one add writer task per shard, which ends
    /// when the last clone of the store is dropped.
    pub fn open(
        url: &str,
        keys: Keyspace,
        dedup_window: Duration,
        timeouts: Timeouts,
        policies: PolicyHandle,
    ) -> Result<Store> {
        // No Nagle: every command is a small write that must not wait for
        // Redis's delayed ACK (redis-rs leaves TCP_NODELAY off by default).
        let info = redis::IntoConnectionInfo::into_connection_info(url)?
            .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
        let client = redis::Client::open(info)?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeouts.connect))
            .set_response_timeout(Some(timeouts.response))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(200));
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), config)?;
        let writers = (0..keys.shards())
            .map(|shard| {
                let (tx, rx) = mpsc::unbounded_channel();
                let writer = AddWriter {
                    conn: conn.clone(),
                    keys: keys.clone(),
                    dedup: dedup_window,
                    shard,
                };
                tokio::spawn(writer.run(rx));
                tx
            })
            .collect();
        Ok(Store {
            conn,
            client,
            keys,
            dedup: dedup_window,
            policies,
            writers,
        })
    }

    /// The key layout.
    pub fn keyspace(&self) -> &Keyspace {
        &self.keys
    }

    /// The policies in force: the handle a reload swaps them in.
    pub fn policies(&self) -> &PolicyHandle {
        &self.policies
    }

    /// The client, for dedicated connections.
    pub fn client(&self) -> &redis::Client {
        &self.client
    }

    /// Checks that Redis answers.
    pub async fn ping(&self) -> Result<()> {
        let mut conn = self.conn.clone();
        redis::cmd("PING").query_async::<()>(&mut conn).await?;
        Ok(())
    }

    /// Runs a script on the shared connection (see [`invoke`]).
    async fn run_script<T: FromRedisValue>(
        &self,
        script: &redis::Script,
        keys: &[&str],
        args: Vec<Vec<u8>>,
    ) -> Result<T> {
        invoke(&self.conn, script, keys, args).await
    }
}

/// Runs a script with all of its keys in KEYS (checked, in debug builds, to
/// share one cluster slot), and decodes its reply.
async fn invoke<T: FromRedisValue>(
    conn: &ConnectionManager,
    script: &redis::Script,
    keys: &[&str],
    args: Vec<Vec<u8>>,
) -> Result<T> {
    debug_assert_one_slot(keys);
    let mut invocation = script.prepare_invoke();
    for key in keys {
        invocation.key(*key);
    }
    for arg in args {
        invocation.arg(arg);
    }
    let mut conn = conn.clone();
    Ok(invocation.invoke_async(&mut conn).await?)
}
