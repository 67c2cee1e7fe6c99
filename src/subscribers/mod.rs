//! Subscriptions, live and durable, and the fan-out point they share.
//!
//! - Live (`live`): one task per shard tails its stream with blocking reads
//!   on a dedicated connection (never the shared command connection) and
//!   publishes each batch on an in-process broadcast channel. The tails read
//!   only while this instance has a subscriber, live or durable ([`Tails`]):
//!   an instance that only ingests reads no batch back. Each live
//!   subscriber has its own task: it first catches up from its position
//!   with non-blocking reads, then follows the broadcast, skipping what it
//!   has already seen. If it falls behind the broadcast it catches up from
//!   Redis again, so a slow subscriber never blocks the tails, the flushes,
//!   or the other subscribers.
//! - Durable (`durable`): one task per consumer of a consumer group. It
//!   reads the group's new batches when a tail announces one (or at a poll
//!   bound), only while the consumer holds fewer than its prefetch limit
//!   (`max_unacked`) unacked, so a batch's ack timeout starts close to the
//!   consumer; an ack (`Hub::acked`) wakes a consumer at its limit. It also
//!   takes over batches that consumers left unacked too long.
//!
//! Every Redis call goes through the store.

mod durable;
mod live;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::batch::{Batch, StreamId};
use crate::metrics::{self, SubscriberMode};
use crate::store::{Store, StoreError};

use durable::{DurableSubscriber, Releases};
use live::{Subscriber, tail};

/// Batches held for subscribers that are momentarily behind the tails.
const BROADCAST_CAPACITY: usize = 4096;

/// Where a subscriber is in every shard's stream. Its text form is the opaque
/// cursor handed out with each batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cursor(pub Vec<StreamId>);

impl Cursor {
    const VERSION: &str = "c1";

    /// The text form: `c1.<ms>-<seq>.<ms>-<seq>...`, one id per shard.
    /// Written into one buffer sized for every id: each live delivery
    /// carries one, so a batch for 100 subscribers encodes it 100 times.
    pub fn encode(&self) -> String {
        use std::fmt::Write;
        // ".", a 13-digit ms, "-" and a seq of up to 4 digits, with room to spare.
        let mut out = String::with_capacity(Self::VERSION.len() + 24 * self.0.len());
        out.push_str(Self::VERSION);
        for id in &self.0 {
            // Writing into a String cannot fail.
            let _ = write!(out, ".{id}");
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

/// What the shard tails and the subscribers share: who listens, and how
/// many tails know where they started. A tail that finds no listener stops
/// reading, forgets its place and leaves the count; a subscriber counts
/// itself in before it waits for every tail, so a tail it may rely on cannot
/// stop (both change under the watch's one lock). A tail woken again starts
/// after its stream's newest entry, as at start-up, and a live subscriber
/// reads what came before from Redis.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Tails {
    /// This instance's live and durable subscribers.
    pub listeners: usize,
    /// Tails that are reading and know where they started.
    pub positioned: u16,
}

/// A subscriber's place among the tails' listeners, left when dropped.
struct Listening(Arc<watch::Sender<Tails>>);

impl Listening {
    fn start(tails: &Arc<watch::Sender<Tails>>) -> Listening {
        tails.send_modify(|t| t.listeners += 1);
        Listening(tails.clone())
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.0.send_modify(|t| t.listeners -= 1);
    }
}

/// What a durable subscription needs besides its filter.
#[derive(Clone, Debug)]
pub struct Durable {
    pub group: String,
    pub consumer: String,
    pub ack_timeout: Duration,
    pub max_deliveries: u32,
    /// The prefetch limit: the most batches the consumer holds unacked.
    pub max_unacked: u32,
}

/// The fan-out point shared by every subscriber of this instance.
#[derive(Clone)]
pub struct Hub {
    store: Store,
    live: broadcast::Sender<Arc<Batch>>,
    tails: Arc<watch::Sender<Tails>>,
    buffer: usize,
    releases: Releases,
    tracker: TaskTracker,
    shutdown: CancellationToken,
}

impl Hub {
    /// Starts one tail task per shard on `tracker`; they read while a
    /// subscriber listens.
    pub fn start(
        store: Store,
        buffer: usize,
        tracker: &TaskTracker,
        shutdown: CancellationToken,
    ) -> Hub {
        let (live, _) = broadcast::channel(BROADCAST_CAPACITY);
        let tails = Arc::new(watch::channel(Tails::default()).0);
        for shard in 0..store.keyspace().shards() {
            let tail = tail(
                store.clone(),
                shard,
                live.clone(),
                tails.clone(),
                shutdown.clone(),
            );
            tracker.spawn(tail);
        }
        Hub {
            store,
            live,
            tails,
            buffer,
            releases: Releases::default(),
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
            tails: self.tails.subscribe(),
        };
        self.spawn_subscriber(
            SubscriberMode::Live,
            subscriber.run(live, self.shutdown.clone()),
        );
        rx
    }

    /// Starts a durable subscription through a consumer group (which must
    /// exist); batches arrive on the receiver and stay pending until acked.
    /// When the service drains, the batches the consumer holds unacked are
    /// released to the group's other consumers before the receiver ends.
    pub fn subscribe_durable(&self, durable: Durable, filter: Filter) -> mpsc::Receiver<Delivery> {
        let (tx, rx) = mpsc::channel(self.buffer);
        let released = self.releases.watch(&durable.group);
        let (group, consumer) = (durable.group.clone(), durable.consumer.clone());
        // Held until the release is done, so the stream ends after it.
        let hold = tx.clone();
        let subscriber = DurableSubscriber {
            store: self.store.clone(),
            durable,
            filter,
            tx,
            releases: self.releases.clone(),
        };
        let (store, shutdown) = (self.store.clone(), self.shutdown.clone());
        let run = subscriber.run(self.live.subscribe(), released, shutdown.clone());
        let task = async move {
            run.await;
            if shutdown.is_cancelled() && !hold.is_closed() {
                release(&store, &group, &consumer).await;
            }
            drop(hold);
        };
        self.spawn_subscriber(SubscriberMode::Durable, task);
        rx
    }

    /// Whether the service is draining: subscriptions end, and no new one starts.
    pub fn is_closing(&self) -> bool {
        self.shutdown.is_cancelled()
    }

    /// Spawns a subscriber's task, counted among the tails' listeners from
    /// now until it ends (so before it waits for the tails).
    fn spawn_subscriber(
        &self,
        mode: SubscriberMode,
        task: impl Future<Output = ()> + Send + 'static,
    ) {
        let listening = Listening::start(&self.tails);
        self.tracker.spawn(metrics::subscribed(mode, async move {
            let _listening = listening;
            task.await
        }));
    }

    /// Tells this instance's consumers of `group` that some of its batches
    /// were acked, so those at their prefetch limit count what they hold.
    pub fn acked(&self, group: &str) {
        self.releases.release(group);
    }
}

/// Releases what `consumer` of `group` holds, and logs how many and how
/// long it took; a failure is logged too (the batches then wait for the
/// ack timeout, as after a crash).
async fn release(store: &Store, group: &str, consumer: &str) {
    let started = std::time::Instant::now();
    match store.release(group, consumer).await {
        Ok(released) => tracing::info!(
            group,
            consumer,
            released,
            took = ?started.elapsed(),
            "drain: released the batches a durable consumer held"
        ),
        Err(err) => tracing::warn!(
            group,
            consumer,
            %err,
            "drain: could not release the batches a durable consumer held; they wait for the ack timeout"
        ),
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
        assert_eq!(text, "c1.5-1.0-0", "the text form clients keep");
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
