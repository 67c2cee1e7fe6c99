//! The store's errors: one enum for the layer, and how a Redis error
//! becomes one of them (unavailable, out of memory, a reply that did not
//! decode, or an error that retrying will not fix).

use std::time::Duration;

use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::batch::DecodeError;

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
    /// The shard's add queue holds `limit` adds already: Redis is not keeping
    /// up. Nothing of the call was queued.
    #[error("the add queue of shard {shard} is full ({limit} adds waiting); retry later")]
    QueueFull { shard: u16, limit: usize },
    /// Redis is at its `maxmemory` and refuses writes (`OOM`); a write
    /// script refused so wrote nothing, since the refusal comes before its
    /// first write.
    #[error("redis is out of memory (maxmemory)")]
    OutOfMemory(RedisError),
    /// Redis holds data under the prefix in another format than this
    /// build's ([`crate::scripts::FORMAT`]); nothing is written to it.
    #[error(
        "redis holds batcher data format {found} under prefix {prefix:?}, and this batcher reads \
         and writes format {}; run the version that wrote it until every group has flushed and \
         every subscriber caught up, then delete the prefix's keys, or give this one another \
         [redis] prefix",
        crate::scripts::FORMAT
    )]
    WrongFormat { found: String, prefix: String },
    /// Redis holds data under the prefix spread over another number of
    /// shards than `[redis] shards`: under this count every key maps to
    /// other shard keys, so the open groups, their due times and the dedup
    /// window would be left where no writer or sweeper looks. Nothing is
    /// written to it.
    #[error(
        "redis holds batcher data in {found} shards under prefix {prefix:?}, and this config has \
         [redis] shards = {configured}; set shards = {found} (the count cannot change while the \
         prefix holds data: every group, due time and remembered id would be stranded), or give \
         this one another [redis] prefix"
    )]
    WrongShards {
        found: String,
        configured: u16,
        prefix: String,
    },
    /// The call's deadline (this long) passed before Redis answered.
    #[error("redis did not answer within {}", humantime::format_duration(*.0))]
    Timeout(Duration),
}

impl From<RedisError> for StoreError {
    fn from(err: RedisError) -> StoreError {
        let transient = err.is_io_error()
            || err.is_timeout()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
            // A cluster client that reaches no node (they are down, or
            // refuse its credentials).
            || err.kind() == ErrorKind::ClusterConnectionNotFound
            || matches!(
                err.kind(),
                ErrorKind::Server(
                    ServerErrorKind::BusyLoading
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                        // A redirect that outlived the client's retries: the
                        // cluster is failing over or moving the slot.
                        | ServerErrorKind::Moved
                        | ServerErrorKind::Ask
                )
            );
        crate::metrics::redis_error(&err, transient);
        if err.code() == Some("OOM") {
            StoreError::OutOfMemory(err)
        } else if transient {
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
