//! Live subscriptions: tails each shard's stream and fans batches out.
//!
//! One task per shard tails its stream with blocking XREADs on a dedicated
//! connection (never the shared command connection) and publishes each batch
//! on an in-process broadcast channel. Each subscriber has its own task: it
//! first catches up from its position with non-blocking XRANGE reads, then
//! follows the broadcast, skipping what it has already seen. If it falls
//! behind the broadcast it catches up from Redis again, so a slow subscriber
//! never blocks the tails, the flushes, or the other subscribers.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::batch::{Batch, StreamId};
use crate::store::{Store, StoreError, batches_from_entries};

/// Batches held for subscribers that are momentarily behind the tails.
const BROADCAST_CAPACITY: usize = 4096;
/// Entries per XREAD or XRANGE call.
const READ_COUNT: usize = 256;
/// How long a tail's XREAD blocks before it checks for shutdown.
const BLOCK_MS: u64 = 1000;

/// Where a subscriber is in every shard's stream. Its text form is the opaque
/// cursor handed out with each batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cursor(pub Vec<StreamId>);

impl Cursor {
    const VERSION: &str = "c1";

    /// The text form: `c1.<ms>-<seq>.<ms>-<seq>...`, one id per shard.
    pub fn encode(&self) -> String {
        let mut out = String::from(Self::VERSION);
        for id in &self.0 {
            out.push('.');
            out.push_str(&id.to_string());
        }
        out
    }

    /// Parses a cursor made for `shards` shards.
    pub fn decode(text: &str, shards: u16) -> Option<Cursor> {
        let mut parts = text.split('.');
        if parts.next()? != Self::VERSION {
            return None;
        }
        let ids = parts
            .map(|p| p.parse().ok())
            .collect::<Option<Vec<StreamId>>>()?;
        (ids.len() == usize::from(shards)).then_some(Cursor(ids))
    }
}

/// Which keys a subscriber wants.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub keys: HashSet<String>,
    pub prefixes: Vec<String>,
}

impl Filter {
    /// Empty filters match every key.
    pub fn matches(&self, key: &str) -> bool {
        (self.keys.is_empty() && self.prefixes.is_empty())
            || self.keys.contains(key)
            || self.prefixes.iter().any(|p| key.starts_with(p.as_str()))
    }
}

/// A batch as sent to one subscriber, with the cursor that resumes after it.
pub type Delivery = (Arc<Batch>, String);

/// The fan-out point shared by every subscriber of this instance.
#[derive(Clone)]
pub struct Hub {
    store: Store,
    live: broadcast::Sender<Arc<Batch>>,
    buffer: usize,
    tracker: TaskTracker,
    shutdown: CancellationToken,
}

impl Hub {
    /// Starts one tail task per shard on `tracker`.
    pub fn start(
        store: Store,
        buffer: usize,
        tracker: &TaskTracker,
        shutdown: CancellationToken,
    ) -> Hub {
        let (live, _) = broadcast::channel(BROADCAST_CAPACITY);
        for shard in 0..store.keyspace().shards() {
            tracker.spawn(tail(store.clone(), shard, live.clone(), shutdown.clone()));
        }
        Hub {
            store,
            live,
            buffer,
            tracker: tracker.clone(),
            shutdown,
        }
    }

    /// The position "now": batches flushed from here on are new.
    pub async fn now(&self) -> Result<Cursor, StoreError> {
        Ok(Cursor(self.store.stream_heads().await?))
    }

    /// Whether a cursor could have come from these streams: none of its
    /// positions is past the newest entry of its shard.
    pub async fn is_known(&self, cursor: &Cursor) -> Result<bool, StoreError> {
        let heads = self.store.stream_heads().await?;
        Ok(cursor.0.iter().zip(&heads).all(|(pos, head)| pos <= head))
    }

    /// Starts a subscription after `from`; batches arrive on the receiver.
    /// It ends when the receiver is dropped or the service shuts down.
    pub fn subscribe(&self, from: Cursor, filter: Filter) -> mpsc::Receiver<Delivery> {
        let (tx, rx) = mpsc::channel(self.buffer);
        let live = self.live.subscribe();
        let subscriber = Subscriber {
            store: self.store.clone(),
            position: from,
            filter,
            tx,
        };
        self.tracker
            .spawn(subscriber.run(live, self.shutdown.clone()));
        rx
    }
}

struct Subscriber {
    store: Store,
    position: Cursor,
    filter: Filter,
    tx: mpsc::Sender<Delivery>,
}

impl Subscriber {
    async fn run(mut self, mut live: broadcast::Receiver<Arc<Batch>>, shutdown: CancellationToken) {
        // The broadcast receiver exists before the catch-up reads, so every
        // batch is either read back from Redis or received live (or both; the
        // position drops the second copy).
        let mut behind = true;
        loop {
            if behind {
                match self.catch_up(&shutdown).await {
                    Ok(true) => behind = false,
                    Ok(false) => return,
                    Err(err) => {
                        tracing::warn!(%err, "subscriber catch-up failed; retrying");
                        tokio::select! {
                            _ = shutdown.cancelled() => return,
                            _ = self.tx.closed() => return,
                            _ = tokio::time::sleep(Duration::from_millis(250)) => continue,
                        }
                    }
                }
            }
            let next = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.tx.closed() => return,
                next = live.recv() => next,
            };
            match next {
                Ok(batch) => {
                    if !self.deliver(batch).await {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => behind = true,
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    /// Reads every retained batch past the position from Redis. Returns false
    /// when the subscriber has gone.
    async fn catch_up(&mut self, shutdown: &CancellationToken) -> Result<bool, StoreError> {
        for shard in 0..self.position.0.len() as u16 {
            loop {
                if shutdown.is_cancelled() {
                    return Ok(false);
                }
                let after = self.position.0[usize::from(shard)];
                let batches = self.store.read_batches(shard, after, READ_COUNT).await?;
                let done = batches.len() < READ_COUNT;
                for batch in batches {
                    if !self.deliver(Arc::new(batch)).await {
                        return Ok(false);
                    }
                }
                if done {
                    break;
                }
            }
        }
        Ok(true)
    }

    /// Advances the position past `batch` and sends it if it matches and is
    /// new. Returns false when the subscriber has gone.
    async fn deliver(&mut self, batch: Arc<Batch>) -> bool {
        let Some(seen) = self.position.0.get_mut(usize::from(batch.shard)) else {
            return true;
        };
        if batch.stream_id <= *seen {
            return true;
        }
        *seen = batch.stream_id;
        if !self.filter.matches(&batch.key) {
            return true;
        }
        let cursor = self.position.encode();
        self.tx.send((batch, cursor)).await.is_ok()
    }
}

/// Tails one shard's stream on its own connection and publishes each batch.
async fn tail(
    store: Store,
    shard: u16,
    live: broadcast::Sender<Arc<Batch>>,
    shutdown: CancellationToken,
) {
    let stream = store.keyspace().shard(shard).stream;
    let mut last: Option<StreamId> = None;
    let mut conn: Option<redis::aio::MultiplexedConnection> = None;
    let mut failures: u32 = 0;
    while !shutdown.is_cancelled() {
        let step = async {
            if conn.is_none() {
                // No response timeout: the blocking read is meant to wait.
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(Duration::from_secs(2)))
                    .set_response_timeout(None);
                conn = Some(
                    store
                        .client()
                        .get_multiplexed_async_connection_with_config(&config)
                        .await?,
                );
            }
            if last.is_none() {
                last = Some(store.stream_heads().await?[usize::from(shard)]);
            }
            let after = last.unwrap_or_default();
            let reply: redis::Value = redis::cmd("XREAD")
                .arg("COUNT")
                .arg(READ_COUNT)
                .arg("BLOCK")
                .arg(BLOCK_MS)
                .arg("STREAMS")
                .arg(&stream)
                .arg(after.to_string())
                .query_async(conn.as_mut().expect("connected above"))
                .await?;
            Ok::<_, StoreError>(reply)
        };
        let reply = tokio::select! {
            _ = shutdown.cancelled() => return,
            reply = step => reply,
        };
        match reply.and_then(|reply| batches_from_xread(shard, reply)) {
            Ok(batches) => {
                failures = 0;
                for batch in batches {
                    last = Some(batch.stream_id);
                    // An error only means no subscriber is listening right now.
                    let _ = live.send(Arc::new(batch));
                }
            }
            Err(err) => {
                conn = None;
                failures += 1;
                if failures == 1 || failures.is_multiple_of(50) {
                    tracing::warn!(shard, failures, %err, "stream tail failed; reconnecting");
                }
                let backoff = Duration::from_millis(50 * u64::from(failures.min(20)));
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
            }
        }
    }
}

/// Decodes an XREAD reply for one stream: nil on timeout, else
/// [[stream, [entries...]]].
fn batches_from_xread(shard: u16, reply: redis::Value) -> Result<Vec<Batch>, StoreError> {
    match reply {
        redis::Value::Array(streams) => match streams.into_iter().next() {
            Some(redis::Value::Array(mut pair)) if pair.len() == 2 => {
                Ok(batches_from_entries(shard, pair.remove(1))?)
            }
            _ => Ok(Vec::new()),
        },
        _ => Ok(Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cursor survives its text form, and malformed or foreign cursors are refused.
    #[test]
    fn cursor_round_trip() {
        let cursor = Cursor(vec![StreamId { ms: 5, seq: 1 }, StreamId::ZERO]);
        let text = cursor.encode();
        assert_eq!(Cursor::decode(&text, 2), Some(cursor));
        assert_eq!(Cursor::decode(&text, 3), None);
        assert_eq!(Cursor::decode("c1.5-1.x", 2), None);
        assert_eq!(Cursor::decode("0", 2), None);
        assert_eq!(Cursor::decode("", 2), None);
    }

    /// Empty filters match all keys; otherwise exact keys plus prefixes.
    #[test]
    fn filter_matching() {
        assert!(Filter::default().matches("anything"));
        let filter = Filter {
            keys: ["north".to_string()].into(),
            prefixes: vec!["south-".into()],
        };
        assert!(filter.matches("north"));
        assert!(filter.matches("south-3"));
        assert!(!filter.matches("northwest"));
        assert!(!filter.matches("east"));
    }
}
