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
    /// A canonical text form, stored as a consumer group's definition: sorted,
    /// de-duplicated, each entry `k` (key) or `p` (prefix), its byte length, `:`, itself.
    pub fn encode(&self) -> String {
        let mut keys: Vec<&String> = self.keys.iter().collect();
        keys.sort();
        let mut prefixes: Vec<&String> = self.prefixes.iter().collect();
        prefixes.sort();
        prefixes.dedup();
        let mut out = String::new();
        for (tag, list) in [('k', keys), ('p', prefixes)] {
            for item in list {
                out.push_str(&format!("{tag}{}:{item}", item.len()));
            }
        }
        out
    }

    /// Parses [`Filter::encode`]'s form.
    pub fn decode(mut text: &str) -> Option<Filter> {
        let mut filter = Filter::default();
        while !text.is_empty() {
            let tag = text.chars().next()?;
            let colon = text.find(':')?;
            let len: usize = text.get(1..colon)?.parse().ok()?;
            let item = text.get(colon + 1..colon + 1 + len)?.to_owned();
            text = &text[colon + 1 + len..];
            match tag {
                'k' => {
                    filter.keys.insert(item);
                }
                'p' => filter.prefixes.push(item),
                _ => return None,
            }
        }
        Some(filter)
    }

    /// True when the filter selects every key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.prefixes.is_empty()
    }

    /// Empty filters match every key.
    pub fn matches(&self, key: &str) -> bool {
        (self.keys.is_empty() && self.prefixes.is_empty())
            || self.keys.contains(key)
            || self.prefixes.iter().any(|p| key.starts_with(p.as_str()))
    }
}

/// A batch as sent to one subscriber.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub batch: Arc<Batch>,
    /// Live subscriptions: the cursor that resumes right after this batch.
    pub cursor: String,
    /// Durable subscriptions: how often the group has been handed this batch.
    pub delivery_count: u32,
}

/// What a durable subscription needs besides its filter.
#[derive(Clone, Debug)]
pub struct Durable {
    pub group: String,
    pub consumer: String,
    pub ack_timeout: Duration,
    pub max_deliveries: u32,
}

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

impl Hub {
    /// Starts a durable subscription through a consumer group (which must
    /// exist); batches arrive on the receiver and stay pending until acked.
    pub fn subscribe_durable(&self, durable: Durable, filter: Filter) -> mpsc::Receiver<Delivery> {
        let (tx, rx) = mpsc::channel(self.buffer);
        let subscriber = DurableSubscriber {
            store: self.store.clone(),
            durable,
            filter,
            tx,
        };
        self.tracker
            .spawn(subscriber.run(self.live.subscribe(), self.shutdown.clone()));
        rx
    }
}

/// One consumer of a consumer group. It never blocks on Redis: it reads the
/// group's new batches (XREADGROUP without BLOCK) when the stream tails
/// announce a new batch, or at the latest every `POLL`, and only as many as
/// its queue has room for, so a stalled consumer holds no more than its
/// buffer. Every `ack_timeout / 2` it takes over batches that any consumer of
/// the group has held unacked for `ack_timeout`.
struct DurableSubscriber {
    store: Store,
    durable: Durable,
    filter: Filter,
    tx: mpsc::Sender<Delivery>,
}

/// The longest a durable subscriber waits before looking for new batches
/// without being told of one.
const POLL: Duration = Duration::from_millis(500);

impl DurableSubscriber {
    async fn run(self, mut live: broadcast::Receiver<Arc<Batch>>, shutdown: CancellationToken) {
        let shards = usize::from(self.store.keyspace().shards());
        let claim_every = (self.durable.ack_timeout / 2).max(Duration::from_millis(10));
        // A reconnecting consumer first gets back what it held unacked.
        let mut own_first = true;
        let mut next_claim = tokio::time::Instant::now();
        // Shards that may hold batches the group has not read yet: set when a
        // tail announces a batch there (or at every poll), cleared when a read
        // comes back short.
        let mut dirty = vec![true; shards];
        let mut next_poll = tokio::time::Instant::now() + POLL;
        loop {
            // Wait for room before taking batches off the group.
            let room = match self.tx.reserve().await {
                Ok(permit) => {
                    drop(permit);
                    self.tx.capacity()
                }
                Err(_) => return,
            };
            let claim_due = own_first || tokio::time::Instant::now() >= next_claim;
            if claim_due || dirty.contains(&true) {
                let step = self.step(room, claim_due, own_first, &mut dirty);
                let result = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = self.tx.closed() => return,
                    result = step => result,
                };
                match result {
                    Ok(true) => {
                        if claim_due {
                            own_first = false;
                            next_claim = tokio::time::Instant::now() + claim_every;
                        }
                        continue;
                    }
                    Ok(false) => return,
                    Err(err) => {
                        tracing::warn!(group = %self.durable.group, %err, "durable subscriber read failed; retrying");
                        dirty.fill(true);
                    }
                }
            }
            // Nothing to read: wait for a tail to announce a batch, the next
            // claim, or the poll bound.
            let now = tokio::time::Instant::now();
            let wake = next_claim.min(next_poll).max(now);
            let mut mark = |next: Result<Arc<Batch>, broadcast::error::RecvError>| match next {
                Ok(batch) => {
                    if let Some(d) = dirty.get_mut(usize::from(batch.shard)) {
                        *d = true;
                    }
                    true
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    dirty.fill(true);
                    true
                }
                Err(broadcast::error::RecvError::Closed) => false,
            };
            let open = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.tx.closed() => return,
                next = live.recv() => mark(next),
                _ = tokio::time::sleep_until(wake) => true,
            };
            if !open {
                return;
            }
            // Take every other announcement already queued.
            loop {
                match live.try_recv() {
                    Ok(batch) => {
                        mark(Ok(batch));
                    }
                    Err(broadcast::error::TryRecvError::Lagged(_)) => {
                        mark(Err(broadcast::error::RecvError::Lagged(0)));
                    }
                    Err(_) => break,
                }
            }
            if tokio::time::Instant::now() >= next_poll {
                // The safety net: look at every shard now and then even if no
                // announcement came (one may have been missed while Redis was away).
                dirty.fill(true);
                next_poll = tokio::time::Instant::now() + POLL;
            }
        }
    }

    /// Takes over timed-out batches (when `claim` is set) and reads the dirty
    /// shards' new batches, up to `room` per call, delivering each. Returns
    /// false when the consumer has gone.
    async fn step(
        &self,
        room: usize,
        claim: bool,
        own_first: bool,
        dirty: &mut [bool],
    ) -> Result<bool, StoreError> {
        if claim {
            let (min_idle, owner) = if own_first {
                (Duration::ZERO, Some(self.durable.consumer.as_str()))
            } else {
                (self.durable.ack_timeout, None)
            };
            for shard in 0..dirty.len() as u16 {
                let claimed = self
                    .store
                    .claim(
                        shard,
                        &self.durable.group,
                        &self.durable.consumer,
                        min_idle,
                        room,
                        self.durable.max_deliveries,
                        owner,
                    )
                    .await?;
                for (batch, count) in claimed {
                    if !self.deliver(batch, count).await? {
                        return Ok(false);
                    }
                }
            }
        }
        for (shard, is_dirty) in dirty.iter_mut().enumerate() {
            if !*is_dirty {
                continue;
            }
            let batches = self
                .store
                .read_group(
                    shard as u16,
                    &self.durable.group,
                    &self.durable.consumer,
                    room,
                )
                .await?;
            if batches.len() < room {
                *is_dirty = false;
            }
            for batch in batches {
                if !self.deliver(batch, 1).await? {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// Sends a batch to the consumer, or acks it for the group at once when
    /// the group does not want it. Returns false when the consumer has gone
    /// (the batch stays pending and is redelivered).
    async fn deliver(&self, batch: Batch, delivery_count: u32) -> Result<bool, StoreError> {
        let wanted = match &batch.for_group {
            Some(group) => *group == self.durable.group,
            None => true,
        } && self.filter.matches(&batch.key);
        if !wanted {
            self.store
                .ack_entries(batch.shard, &self.durable.group, &[batch.stream_id])
                .await?;
            return Ok(true);
        }
        let delivery = Delivery {
            batch: Arc::new(batch),
            cursor: String::new(),
            delivery_count,
        };
        Ok(self.tx.send(delivery).await.is_ok())
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
        // Re-driven copies are for one consumer group, not for live subscribers.
        if batch.for_group.is_some() || !self.filter.matches(&batch.key) {
            return true;
        }
        let cursor = self.position.encode();
        let delivery = Delivery {
            batch,
            cursor,
            delivery_count: 0,
        };
        self.tx.send(delivery).await.is_ok()
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

    /// A consumer group's filter survives its stored form, including odd keys.
    #[test]
    fn filter_round_trip() {
        let filter = Filter {
            keys: ["a:b".to_string(), "k7:x".to_string(), "ключ".to_string()].into(),
            prefixes: vec!["p-".into(), "".into()],
        };
        let decoded = Filter::decode(&filter.encode()).unwrap();
        assert_eq!(decoded.keys, filter.keys);
        assert_eq!(decoded.encode(), filter.encode());
        assert!(Filter::decode("").unwrap().is_empty());
        assert!(Filter::decode("k9:x").is_none());
    }
}
