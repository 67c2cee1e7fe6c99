//! Durable subscriptions: one consumer of a consumer group, which reads the
//! group's batches through the store and keeps them pending until acked.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use super::{Delivery, Durable, Filter};
use crate::batch::Batch;
use crate::store::{Store, StoreError};

/// One consumer of a consumer group. It never blocks on Redis: it reads the
/// group's new batches (XREADGROUP without BLOCK) when the stream tails
/// announce a new batch, or at the latest every `POLL`, and only as many as
/// its queue has room for, so a stalled consumer holds no more than its
/// buffer. Every `ack_timeout / 2` it takes over batches that any consumer of
/// the group has held unacked for `ack_timeout`.
pub(super) struct DurableSubscriber {
    pub store: Store,
    pub durable: Durable,
    pub filter: Filter,
    pub tx: mpsc::Sender<Delivery>,
}

/// The longest a durable subscriber waits before looking for new batches
/// without being told of one.
const POLL: Duration = Duration::from_millis(500);

impl DurableSubscriber {
    pub(super) async fn run(
        self,
        mut live: broadcast::Receiver<Arc<Batch>>,
        shutdown: CancellationToken,
    ) {
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
            let wake = next_claim.min(next_poll);
            if !self.wait(&mut live, &mut dirty, wake, &shutdown).await {
                return;
            }
            if tokio::time::Instant::now() >= next_poll {
                // The safety net: look at every shard now and then even if no
                // announcement came (one may have been missed while Redis was away).
                dirty.fill(true);
                next_poll = tokio::time::Instant::now() + POLL;
            }
        }
    }

    /// Waits until `wake` or until a tail announces a batch, and marks the
    /// shards of every announcement queued by then as dirty (all of them if
    /// some were missed). Returns false when the subscription must end.
    async fn wait(
        &self,
        live: &mut broadcast::Receiver<Arc<Batch>>,
        dirty: &mut [bool],
        wake: tokio::time::Instant,
        shutdown: &CancellationToken,
    ) -> bool {
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
            _ = shutdown.cancelled() => return false,
            _ = self.tx.closed() => return false,
            next = live.recv() => mark(next),
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
                Err(_) => return true,
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
