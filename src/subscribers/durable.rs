//! Durable subscriptions: one consumer of a consumer group, which reads the
//! group's batches through the store and keeps them pending until acked, and
//! holds at most its prefetch limit (`max_unacked`) of them.
//!
//! The count of what a consumer holds lives in Redis, in the group's pending
//! lists: an ack through any instance or connection lowers it, and so does a
//! takeover by another consumer after `ack_timeout`. Each subscriber keeps an
//! upper bound of it (the last count plus what it took since) and counts
//! again only when that bound reaches the limit and something may have freed
//! a slot: an ack on this instance (the `Releases` signal), a takeover by a
//! consumer of this instance, or the poll bound (acks through other instances).
//!
//! When an instance drains, each of its consumers releases what it holds
//! (`Store::release`) before its stream ends, and the group's count of
//! releases goes up; every consumer reads that count at the poll bound and
//! claims at once when it has changed, so released batches move to another
//! instance within about one poll, not after `ack_timeout`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Delivery, Durable, Filter};
use crate::batch::Batch;
use crate::store::{Store, StoreError};

/// Tells this instance's durable subscribers that a consumer group's batches
/// were acked or taken over, so those at their prefetch limit count again.
#[derive(Clone, Default)]
pub(super) struct Releases {
    /// A std Mutex, not a tokio one: no await happens while it is held.
    groups: Arc<Mutex<HashMap<String, watch::Sender<()>>>>,
}

impl Releases {
    /// A receiver that changes whenever `group` releases batches. Signals of
    /// groups nobody watches any more are dropped here.
    pub(super) fn watch(&self, group: &str) -> watch::Receiver<()> {
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        groups.retain(|_, tx| tx.receiver_count() > 0);
        let tx = groups
            .entry(group.to_owned())
            .or_insert_with(|| watch::channel(()).0);
        tx.subscribe()
    }

    /// Wakes the subscribers of `group` on this instance.
    pub(super) fn release(&self, group: &str) {
        let groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = groups.get(group) {
            tx.send_replace(());
        }
    }
}

/// One consumer of a consumer group. It never blocks on Redis: it reads the
/// group's new batches (XREADGROUP without BLOCK) when the stream tails
/// announce a new batch, or at the latest every `POLL`, and only as many as
/// its prefetch limit and its queue have room for. Every `ack_timeout / 2`
/// it takes over batches that any consumer of the group has held unacked for
/// `ack_timeout` (its own ones, which it already counts, regardless of room).
pub(super) struct DurableSubscriber {
    pub store: Store,
    pub durable: Durable,
    pub filter: Filter,
    pub tx: mpsc::Sender<Delivery>,
    pub releases: Releases,
}

/// The longest a durable subscriber waits before looking for new batches
/// (and, at its limit, counting what it holds) without being told to.
const POLL: Duration = Duration::from_millis(500);

/// What a subscriber knows between steps.
struct Progress {
    /// Shards that may hold batches the group has not read yet: set when a
    /// tail announces a batch there (or at every poll), cleared when a read
    /// comes back short.
    dirty: Vec<bool>,
    /// The shard the next read starts at, so that a consumer at its limit,
    /// taking a few batches at a time, serves every shard in turn.
    start: usize,
    /// An upper bound of the batches the consumer holds unacked: the last
    /// count from Redis plus what was delivered to it since.
    held: usize,
    /// Whether batches may have been released since the last count.
    stale: bool,
    /// When to look at every shard and count again without being told to.
    next_poll: Instant,
}

/// What became of a batch handed to [`DurableSubscriber::deliver`].
enum Delivered {
    /// Queued for the consumer: it holds it until it acks.
    Sent,
    /// Not for this group: acked at once, the consumer does not hold it.
    Skipped,
    /// The consumer has gone (the batch stays pending and is redelivered).
    Gone,
}

impl DurableSubscriber {
    pub(super) async fn run(
        self,
        mut live: broadcast::Receiver<Arc<Batch>>,
        mut released: watch::Receiver<()>,
        shutdown: CancellationToken,
    ) {
        let limit = self.durable.max_unacked as usize;
        let claim_every = (self.durable.ack_timeout / 2).max(Duration::from_millis(10));
        // A reconnecting consumer first gets back what it held unacked.
        let mut own_first = true;
        let mut next_claim = Instant::now();
        // How often a draining instance has released the group's batches,
        // as last read: a change calls for a claim now (see `Store::release`).
        let mut releases = None;
        let mut next_releases_check = Instant::now();
        // Unknown at first: counted before the first read.
        let mut progress = Progress {
            dirty: vec![true; usize::from(self.store.keyspace().shards())],
            start: 0,
            held: limit,
            stale: true,
            next_poll: Instant::now() + POLL,
        };
        loop {
            // Wait for room in the queue before taking batches off the group.
            let queue_room = match self.tx.reserve().await {
                Ok(permit) => {
                    drop(permit);
                    self.tx.capacity()
                }
                Err(_) => return,
            };
            if released.has_changed().unwrap_or(false) {
                released.borrow_and_update();
                progress.stale = true;
            }
            if progress.held >= limit
                && progress.stale
                && !self.count(&mut progress, &shutdown).await
            {
                return;
            }
            if !own_first && Instant::now() >= next_releases_check {
                next_releases_check = Instant::now() + POLL;
                let read = self.store.releases(&self.durable.group);
                let read = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = self.tx.closed() => return,
                    read = read => read,
                };
                match read {
                    Ok(now) if now != releases => {
                        releases = now;
                        next_claim = Instant::now();
                    }
                    Ok(_) => {}
                    Err(err) => {
                        tracing::warn!(group = %self.durable.group, %err, "durable subscriber could not read the group's releases; retrying");
                    }
                }
            }
            let room = queue_room.min(limit.saturating_sub(progress.held));
            let claim_due = own_first || Instant::now() >= next_claim;
            if claim_due || (room > 0 && progress.dirty.contains(&true)) {
                let step = self.step(room, claim_due, own_first, &mut progress);
                let result = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = self.tx.closed() => return,
                    result = step => result,
                };
                match result {
                    Ok(true) => {
                        if claim_due {
                            own_first = false;
                            next_claim = Instant::now() + claim_every;
                        }
                        continue;
                    }
                    Ok(false) => return,
                    Err(err) => {
                        tracing::warn!(group = %self.durable.group, %err, "durable subscriber read failed; retrying");
                        progress.dirty.fill(true);
                    }
                }
            }
            // Nothing to read, or no room: wait for a tail to announce a
            // batch, a release, the next claim, or the poll bound.
            let full = progress.held >= limit;
            let wake = next_claim.min(next_releases_check);
            let waited = self.wait(&mut live, &mut released, full, &mut progress, wake);
            if !tokio::select! {
                _ = shutdown.cancelled() => false,
                _ = self.tx.closed() => false,
                open = waited => open,
            } {
                return;
            }
        }
    }

    /// Counts what the consumer holds unacked, in Redis. Returns false when
    /// the subscription must end.
    async fn count(&self, progress: &mut Progress, shutdown: &CancellationToken) -> bool {
        let count = self
            .store
            .pending_of(&self.durable.group, &self.durable.consumer);
        let result = tokio::select! {
            _ = shutdown.cancelled() => return false,
            _ = self.tx.closed() => return false,
            result = count => result,
        };
        match result {
            Ok(held) => {
                progress.held = held;
                progress.stale = false;
            }
            Err(err) => {
                tracing::warn!(group = %self.durable.group, %err, "durable subscriber count failed; retrying");
            }
        }
        true
    }

    /// Waits until `next_claim` (or the next look at the group's releases) or the poll bound, until a tail announces a
    /// batch, or (when `full`) until the group releases batches, and marks
    /// the shards of every announcement queued by then as dirty (all of them
    /// if some were missed, or at the poll bound). Returns false when the
    /// subscription must end.
    async fn wait(
        &self,
        live: &mut broadcast::Receiver<Arc<Batch>>,
        released: &mut watch::Receiver<()>,
        full: bool,
        progress: &mut Progress,
        next_claim: Instant,
    ) -> bool {
        let wake = next_claim.min(progress.next_poll);
        let dirty = &mut progress.dirty;
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
            next = live.recv() => mark(next),
            // The sender lives in the hub's registry while this receiver does.
            _ = released.changed(), if full => {
                progress.stale = true;
                true
            }
            _ = tokio::time::sleep_until(wake) => true,
        };
        if !open {
            return false;
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
        if Instant::now() >= progress.next_poll {
            // The safety net: look at every shard now and then even if no
            // announcement came (one may have been missed while Redis was
            // away), and count again (acks through other instances).
            progress.dirty.fill(true);
            progress.stale = true;
            progress.next_poll = Instant::now() + POLL;
        }
        true
    }

    /// Takes over timed-out batches (when `claim` is set), then reads the
    /// dirty shards' new batches, up to `room` in all, delivering each.
    /// Returns false when the consumer has gone.
    async fn step(
        &self,
        room: usize,
        claim: bool,
        own_first: bool,
        progress: &mut Progress,
    ) -> Result<bool, StoreError> {
        let mut room = room;
        if claim {
            let Some(taken) = self.take_over(room, own_first).await? else {
                return Ok(false);
            };
            progress.held += taken;
            room = room.saturating_sub(taken);
        }
        let shards = progress.dirty.len();
        for i in 0..shards {
            let shard = (progress.start + i) % shards;
            if room == 0 {
                break;
            }
            if !progress.dirty[shard] {
                continue;
            }
            let (group, consumer) = (&self.durable.group, &self.durable.consumer);
            let batches = self
                .store
                .read_group(shard as u16, group, consumer, room)
                .await?;
            if batches.len() < room {
                progress.dirty[shard] = false;
            }
            // The next read starts after the last shard that gave batches.
            if !batches.is_empty() {
                progress.start = (shard + 1) % shards;
            }
            room -= batches.len();
            for batch in batches {
                match self.deliver(batch, 1).await? {
                    Delivered::Sent => progress.held += 1,
                    Delivered::Skipped => {}
                    Delivered::Gone => return Ok(false),
                }
            }
        }
        Ok(true)
    }

    /// Takes over, in every shard, the consumer's own batches (all of them on
    /// a reconnect, else those idle for `ack_timeout`: it already counts
    /// them), then (unless reconnecting) up to `room` batches other
    /// consumers have left idle for `ack_timeout`, and delivers them. Returns
    /// how many it took from others (now its own), or None when the consumer
    /// has gone.
    async fn take_over(&self, room: usize, own_first: bool) -> Result<Option<usize>, StoreError> {
        let (own_idle, ack_timeout) = if own_first {
            (Duration::ZERO, self.durable.ack_timeout)
        } else {
            (self.durable.ack_timeout, self.durable.ack_timeout)
        };
        let limit = self.durable.max_unacked as usize;
        let own = Some(self.durable.consumer.as_str());
        if self.claim(own_idle, limit, own).await?.is_none() {
            return Ok(None);
        }
        if own_first {
            return Ok(Some(0));
        }
        let taken = self.claim(ack_timeout, room, None).await?;
        if taken.is_some_and(|n| n > 0) {
            // Their former holders on this instance have room again.
            self.releases.release(&self.durable.group);
        }
        Ok(taken)
    }

    /// Claims up to `count` batches idle for `min_idle` (only `owner`'s, if
    /// given) over every shard and delivers them. Returns how many were
    /// delivered, or None when the consumer has gone.
    async fn claim(
        &self,
        min_idle: Duration,
        count: usize,
        owner: Option<&str>,
    ) -> Result<Option<usize>, StoreError> {
        let (mut left, mut sent) = (count, 0);
        for shard in 0..self.store.keyspace().shards() {
            if left == 0 {
                break;
            }
            let claimed = self
                .store
                .claim(
                    shard,
                    &self.durable.group,
                    &self.durable.consumer,
                    min_idle,
                    left,
                    self.durable.max_deliveries,
                    owner,
                )
                .await?;
            left = left.saturating_sub(claimed.len());
            for (batch, count) in claimed {
                match self.deliver(batch, count).await? {
                    Delivered::Sent => sent += 1,
                    Delivered::Skipped => {}
                    Delivered::Gone => return Ok(None),
                }
            }
        }
        Ok(Some(sent))
    }

    /// Sends a batch to the consumer, or acks it for the group at once when
    /// the group does not want it.
    async fn deliver(&self, batch: Batch, delivery_count: u32) -> Result<Delivered, StoreError> {
        let wanted = match &batch.for_group {
            Some(group) => *group == self.durable.group,
            None => true,
        } && self.filter.matches(&batch.key);
        if !wanted {
            self.store
                .ack_entries(batch.shard, &self.durable.group, &[batch.stream_id])
                .await?;
            return Ok(Delivered::Skipped);
        }
        let delivery = Delivery {
            batch: Arc::new(batch),
            cursor: String::new(),
            delivery_count,
        };
        Ok(match self.tx.send(delivery).await {
            Ok(()) => Delivered::Sent,
            Err(_) => Delivered::Gone,
        })
    }
}
