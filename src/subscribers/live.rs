//! Live subscriptions: the shard tails, which publish every new batch on
//! the hub's broadcast channel, and the live subscribers, which catch up
//! from Redis and then follow that broadcast.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::{Cursor, Delivery, Filter, Tails};
use crate::batch::{Batch, StreamId};
use crate::store::{Conn, Store, StoreError};

/// Entries per tail read or catch-up read.
const READ_COUNT: usize = 256;
/// How long a tail's blocking read waits before it checks for shutdown.
const BLOCK: Duration = Duration::from_millis(1000);

/// One live subscriber: its position in every shard's stream, what it wants,
/// and where its batches go.
pub(super) struct Subscriber {
    pub store: Store,
    pub position: Cursor,
    pub filter: Filter,
    pub tx: mpsc::Sender<Delivery>,
    /// The tails' state, for how many know where they start (see [`tail`]).
    pub tails: watch::Receiver<Tails>,
}

impl Subscriber {
    pub(super) async fn run(
        mut self,
        mut live: broadcast::Receiver<Arc<Batch>>,
        shutdown: CancellationToken,
    ) {
        // The broadcast receiver exists before the catch-up reads, and the
        // reads start once every tail knows where it starts, so every batch
        // is either read back from Redis or received live (or both; the
        // position drops the second copy).
        let shards = self.position.0.len() as u16;
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = self.tx.closed() => return,
            ready = self.tails.wait_for(|t| t.positioned >= shards) => if ready.is_err() { return },
        }
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

/// Tails one shard's stream on its own connection and publishes each batch,
/// while someone listens (see [`Tails`]). It starts after the stream's
/// newest entry when its connection comes up, and then counts itself as
/// positioned: a batch flushed before that is never published, so live
/// subscribers read back from Redis only once every tail has started. With
/// no listener left it stops, and starts anew when one comes.
pub(super) async fn tail(
    store: Store,
    shard: u16,
    live: broadcast::Sender<Arc<Batch>>,
    tails: Arc<watch::Sender<Tails>>,
    shutdown: CancellationToken,
) {
    let mut wake = tails.subscribe();
    let mut last: Option<StreamId> = None;
    let mut conn: Option<Conn> = None;
    let mut failures: u32 = 0;
    while !shutdown.is_cancelled() {
        let counted = last.is_some();
        let idle = tails.send_if_modified(|t| {
            if t.listeners > 0 {
                return false;
            }
            if counted {
                t.positioned -= 1;
            }
            true
        });
        if idle {
            last = None;
            tokio::select! {
                _ = shutdown.cancelled() => return,
                woken = wake.wait_for(|t| t.listeners > 0) => if woken.is_err() { return },
            }
            continue;
        }
        let step = async {
            let conn = match &mut conn {
                Some(conn) => conn,
                None => conn.insert(store.blocking_connection().await?),
            };
            let after = match last {
                Some(after) => after,
                None => {
                    let head = *last.insert(store.stream_heads().await?[usize::from(shard)]);
                    tails.send_modify(|t| t.positioned += 1);
                    head
                }
            };
            store
                .tail_batches(conn, shard, after, READ_COUNT, BLOCK)
                .await
        };
        let batches = tokio::select! {
            _ = shutdown.cancelled() => return,
            batches = step => batches,
        };
        match batches {
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
