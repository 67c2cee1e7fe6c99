//! The add writers, which run the add function for the jobs that queued
//! up meanwhile: each call takes a shard's waiting jobs together, so under
//! load many small requests share one call.
//!
//! On one Redis, [`LANES`] writers serve the shards in rounds
//! ([`run_rounds`]): a round sends one call per shard of its lane with
//! jobs, all at once on the shared connection, and the next round takes
//! what queued while it was in flight. The calls of a round travel in few
//! packets and their replies come back together, so Redis and the service
//! each pay for fewer, fuller calls. On
//! a cluster each shard has a writer of its own ([`AddWriter::run`]), so a
//! slow or failing node holds up only the shards it serves.

use std::collections::VecDeque;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::future::join_all;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Instant;

use super::conn::{Code, Conn, WaitReplicas, invoke};
use super::decode::{AddReply, ItemReply};
use super::job::{AddJob, NewItem, ShardReply, Slot, Waiting, writer_gone};
use super::{AddArgs, Result, StoreError};
use crate::batch::{AddOutcome, AddResult, Batch, DecodeError, OpenLimit};
use crate::keys::Keyspace;
use crate::scripts::Function;

/// Most items one merged add call takes, so no call holds Redis for
/// long; a single request's shard part is never split, whatever its size.
const MERGE_LIMIT: usize = 1000;

/// One shard's queue: the writer's inbox, and the room left in it.
///
/// The channel itself is unbounded, but every job in it holds permits of
/// `room` for its items (at least one), so it never holds more than
/// `limit` items, nor more than `limit` jobs.
pub(super) struct ShardQueue {
    jobs: mpsc::UnboundedSender<AddJob>,
    /// One permit per item the queue may still take; a job gives its
    /// permits back when its writer has answered it.
    room: Arc<Semaphore>,
    limit: usize,
}

impl ShardQueue {
    pub(super) fn new(jobs: mpsc::UnboundedSender<AddJob>, limit: NonZeroUsize) -> ShardQueue {
        ShardQueue {
            jobs,
            room: Arc::new(Semaphore::new(limit.get())),
            limit: limit.get(),
        }
    }

    /// Hands `job` to the shard's writer.
    pub(super) fn send(&self, job: AddJob) -> Result<()> {
        self.jobs.send(job).map_err(|_| writer_gone())
    }

    /// The same inbox with room for `limit` items.
    pub(super) fn resized(&self, limit: NonZeroUsize) -> ShardQueue {
        ShardQueue::new(self.jobs.clone(), limit)
    }

    /// Room for `items` items, or QueueFull at once. A part larger than the
    /// whole queue takes all of it: it goes when the queue is empty.
    pub(super) fn reserve(&self, shard: u16, items: usize) -> Result<OwnedSemaphorePermit> {
        let wanted = u32::try_from(items.clamp(1, self.limit)).unwrap_or(u32::MAX);
        self.room
            .clone()
            .try_acquire_many_owned(wanted)
            .map_err(|_| StoreError::QueueFull {
                shard,
                limit: self.limit,
            })
    }
}

/// Runs the add function for one shard, one call at a time. While a call is in
/// flight, new jobs queue up; the next call takes all of them (up to
/// `MERGE_LIMIT` items), so the batching costs no latency when idle and
/// grows with load. Each job's items stay contiguous and in order, so a
/// request's part is still applied atomically.
///
/// A job whose deadline passed while it queued is dropped, not sent: its
/// caller was already told it failed. One already sent may still land after
/// its deadline; that is safe, because adds are idempotent by item id: the
/// caller's retry is answered DUPLICATE, and the item is in one batch.
pub(super) struct AddWriter {
    pub conn: Conn,
    pub wait: Option<WaitReplicas>,
    pub keys: Keyspace,
    pub dedup: Duration,
    pub shard: u16,
    /// `[limits] max_open_groups` over all shards (0: none).
    pub open_limit: Arc<AtomicU32>,
}

impl AddWriter {
    pub(super) async fn run(self, mut jobs: mpsc::UnboundedReceiver<AddJob>) {
        while let Some(first) = jobs.recv().await {
            let now = Instant::now();
            let Some(first) = first.expired(now) else {
                continue;
            };
            let mut total = first.items.len();
            let mut batch = vec![first];
            while total < MERGE_LIMIT {
                match jobs.try_recv() {
                    Ok(job) => {
                        if let Some(job) = job.expired(now) {
                            total += job.items.len();
                            batch.push(job);
                        }
                    }
                    Err(_) => break,
                }
            }
            self.answer(batch).await;
        }
    }

    /// Runs one add function call for `batch`, jobs of this shard in
    /// order, and answers each job with its part of the results.
    async fn answer(&self, batch: Vec<AddJob>) {
        let items: Vec<&NewItem> = batch.iter().flat_map(|job| job.items.iter()).collect();
        match self.call(&items).await {
            Ok((earliest, results)) => {
                let mut results = results.into_iter();
                for job in batch {
                    let mine = results.by_ref().take(job.items.len()).collect();
                    // A caller that went away no longer needs its reply.
                    let _ = job.reply.send(Ok((earliest, mine)));
                }
            }
            Err(err) => {
                for job in batch {
                    let _ = job.reply.send(Err(err.clone()));
                }
            }
        }
    }

    /// One add function call for `items`, all of this shard, in order. The
    /// batches it flushed are recorded in the metrics, and traced.
    async fn call(&self, items: &[&NewItem]) -> Result<ShardReply> {
        let open_limit = self.open_limit.load(Ordering::Relaxed);
        let mut args = AddArgs::new(&self.keys, self.shard, self.dedup).with_open_limit(open_limit);
        for new in items {
            args.item_with(
                &new.key,
                &new.policy,
                &new.item,
                new.close,
                new.requeue_of.as_deref(),
            );
        }
        let (keys, args) = args.into_parts();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let reply: AddReply = invoke(
            &self.conn,
            self.wait,
            Code::Function(Function::Add),
            &keys,
            args,
        )
        .await?;
        let earliest = reply.earliest;
        let (replies, rooms) = reply
            .split(items.len())
            .map_err(|e| DecodeError(e.to_string()))?;
        let results = replies
            .into_iter()
            .zip(items)
            .map(|((outcome, group_size, batch), new)| {
                let flushed: Vec<Batch> = batch
                    .into_iter()
                    .flatten()
                    .map(|batch| batch.into_batch(self.shard, &new.key))
                    .collect();
                for batch in &flushed {
                    crate::metrics::flushed(batch, None);
                    crate::telemetry::flushed(batch);
                }
                let limit = |by_policy: bool| match (&new.policy.scope, by_policy) {
                    (Some(scope), true) => OpenLimit::Policy(scope.clone()),
                    _ => OpenLimit::Service,
                };
                let outcome = match outcome {
                    ItemReply::Added => AddOutcome::Added,
                    ItemReply::Duplicate => AddOutcome::Duplicate,
                    ItemReply::Refused { by_policy } => AddOutcome::Refused(limit(by_policy)),
                    ItemReply::Waiting { by_policy, room } => {
                        return Slot::Waiting(Box::new(Waiting {
                            item: (*new).clone(),
                            room: room.checked_sub(1).and_then(|at| rooms.get(at)).cloned(),
                            limit: limit(by_policy),
                            flushed,
                        }));
                    }
                };
                Slot::Done(AddResult {
                    outcome,
                    group_size,
                    flushed,
                })
            })
            .collect();
        Ok((earliest, results))
    }
}

/// How many round writers share one Redis's shards (shard `s` is in lane
/// `s % LANES`): while one lane's replies are answered and its next round
/// gathers, another lane's round keeps Redis busy.
pub(super) const LANES: u16 = 2;

/// The writer of one lane of shards on one Redis (see the module docs):
/// each round takes the jobs that queued while the last one was in flight,
/// up to `MERGE_LIMIT` items a shard (a shard's further jobs wait, in
/// order, for the next round), and sends one call per shard with jobs, all
/// at once. `writers` holds one per shard of the lane, in shard order; they
/// only make the calls.
pub(super) async fn run_rounds(writers: Vec<AddWriter>, mut jobs: mpsc::UnboundedReceiver<AddJob>) {
    let mut waiting: Vec<VecDeque<AddJob>> = writers.iter().map(|_| VecDeque::new()).collect();
    let at = |job: &AddJob| usize::from(job.shard / LANES);
    let mut queued = 0;
    loop {
        if queued == 0 {
            let Some(first) = jobs.recv().await else {
                return;
            };
            waiting[at(&first)].push_back(first);
            queued += 1;
        }
        while let Ok(job) = jobs.try_recv() {
            waiting[at(&job)].push_back(job);
            queued += 1;
        }
        let now = Instant::now();
        let mut calls = Vec::new();
        for (writer, queue) in writers.iter().zip(&mut waiting) {
            let mut batch = Vec::new();
            let mut total = 0;
            while total < MERGE_LIMIT
                && let Some(job) = queue.pop_front()
            {
                queued -= 1;
                if let Some(job) = job.expired(now) {
                    total += job.items.len();
                    batch.push(job);
                }
            }
            if !batch.is_empty() {
                calls.push(writer.answer(batch));
            }
        }
        join_all(calls).await;
    }
}
