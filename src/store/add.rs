//! The add path: [`Store::add`] splits a request per shard and hands each
//! part to that shard's writer, which runs the add function for whatever parts
//! queued up meanwhile in one call.
//!
//! Each shard's queue is bounded in items (`[limits] max_queued_adds`): a
//! call whose part does not fit fails at once with
//! [`StoreError::QueueFull`], and a call spanning shards reserves room in
//! every one of them before it queues anything, so it is never half queued.
//! A call may carry a [`Deadline`]: the writer drops a part whose deadline
//! passed while it waited, so it is not written after its caller was told
//! it failed.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::future::try_join_all;
use redis::{ErrorKind, RedisError};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use super::conn::{Code, Conn, WaitReplicas, invoke};
use super::decode::{AddReply, ItemReply, Room};
use super::{AddArgs, Result, Store, StoreError};
use crate::batch::{AddOutcome, AddResult, Batch, DecodeError, Item, OpenLimit};
use crate::keys::Keyspace;
use crate::policy::Policy;
use crate::scripts::Function;

/// One item to add, with the policy of its key resolved.
#[derive(Clone, Debug)]
pub struct NewItem {
    pub key: String,
    pub item: Item,
    pub policy: Policy,
    /// Flush the group right after adding the item (`close_group`).
    pub close: bool,
    /// For a requeued item: the id of the batch it is requeued from. The
    /// item then bypasses the dedup window, once per (batch, item).
    pub requeue_of: Option<String>,
}

/// The results of a set of adds, and the deadlines the adds opened.
#[derive(Debug, Default)]
pub struct AddReport {
    /// One per item, in request order.
    pub results: Vec<AddResult>,
    /// Per shard that had a group opened: the earliest due time opened (ms).
    pub opened: Vec<(u16, u64)>,
}

/// What a shard writer answers for one job: the earliest due time the call
/// opened, and one result per item of the job.
type ShardReply = (Option<u64>, Vec<Slot>);

/// One item's result from a round of add calls: done, or waiting for room
/// under a limit on open groups.
#[derive(Debug)]
pub(super) enum Slot {
    Done(AddResult),
    Waiting(Box<Waiting>),
}

/// An item whose group could not open under a limit on open groups whose
/// overflow flushes the oldest: the group to flush first, if the call named
/// one, and what the item wrote before it waited.
#[derive(Debug)]
pub(super) struct Waiting {
    pub item: NewItem,
    pub room: Option<Room>,
    pub limit: OpenLimit,
    pub flushed: Vec<Batch>,
}

/// When a call must be answered by: the instant, and the whole budget it was
/// given (for the message that says how long Redis had).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline {
    pub at: Instant,
    pub budget: Duration,
}

impl Deadline {
    /// A deadline `budget` from now.
    pub fn after(budget: Duration) -> Deadline {
        Deadline {
            at: Instant::now() + budget,
            budget,
        }
    }

    /// The error of a call that ran out of time.
    pub fn expired(&self) -> StoreError {
        StoreError::Timeout(self.budget)
    }
}

impl Store {
    /// Adds items, atomically per shard, in request order. A group that
    /// reaches its threshold is flushed by the add that completes it.
    ///
    /// Each shard's part goes to that shard's writer, which runs it in one
    /// add function call, together with whatever other requests queued up for the
    /// shard meanwhile: under load, many small requests share one call.
    pub async fn add(&self, items: Vec<NewItem>) -> Result<AddReport> {
        self.add_within(items, None).await
    }

    /// [`Store::add`], with a deadline: a part still queued when it passes is
    /// dropped, and the call fails with [`StoreError::Timeout`]. Fails at
    /// once with [`StoreError::QueueFull`], queuing nothing, when a shard's
    /// queue has no room for the call's part.
    pub async fn add_within(
        &self,
        items: Vec<NewItem>,
        deadline: Option<Deadline>,
    ) -> Result<AddReport> {
        // Nothing is written under a prefix that holds another data format.
        self.check_format().await?;
        let (slots, opened) = self.add_round(items, deadline).await?;
        self.settle(slots, opened, deadline).await
    }

    /// One round of add calls for `items`: one result slot per item, in
    /// order, and the earliest due time opened per shard.
    pub(super) async fn add_round(
        &self,
        items: Vec<NewItem>,
        deadline: Option<Deadline>,
    ) -> Result<(Vec<Slot>, Vec<(u16, u64)>)> {
        // Split the request per shard, keeping each shard's items in order.
        let count = items.len();
        let mut per_shard: HashMap<u16, (Vec<usize>, Vec<NewItem>)> = HashMap::new();
        for (index, item) in items.into_iter().enumerate() {
            let part = per_shard.entry(self.keys.shard_of(&item.key)).or_default();
            part.0.push(index);
            part.1.push(item);
        }
        // Room in every shard first, so that a full shard refuses the whole
        // call before any of its parts is queued.
        let mut parts = Vec::with_capacity(per_shard.len());
        for (shard, (indexes, items)) in per_shard {
            let room = self.queues[usize::from(shard)].reserve(shard, items.len())?;
            parts.push((shard, indexes, items, room));
        }
        let calls = parts
            .into_iter()
            .map(|(shard, indexes, items, room)| async move {
                let (reply, done) = oneshot::channel();
                let job = AddJob {
                    items,
                    deadline,
                    reply,
                    _room: room,
                };
                if self.queues[usize::from(shard)].jobs.send(job).is_err() {
                    return Err(writer_gone());
                }
                let (earliest, results) = done.await.map_err(|_| writer_gone())??;
                Ok((shard, indexes, earliest, results))
            });
        let replies = try_join_all(calls).await?;

        let mut results: Vec<Option<Slot>> = std::iter::repeat_with(|| None).take(count).collect();
        let mut opened = Vec::new();
        for (shard, indexes, earliest, shard_results) in replies {
            if let Some(due) = earliest {
                opened.push((shard, due));
            }
            for (index, result) in indexes.into_iter().zip(shard_results) {
                results[index] = Some(result);
            }
        }
        let results = results
            .into_iter()
            .map(|r| {
                r.ok_or_else(|| DecodeError("the add function returned too few results".into()))
            })
            .collect::<std::result::Result<_, _>>()?;
        Ok((results, opened))
    }
}

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

    /// The same inbox with room for `limit` items.
    pub(super) fn resized(&self, limit: NonZeroUsize) -> ShardQueue {
        ShardQueue::new(self.jobs.clone(), limit)
    }

    /// Room for `items` items, or QueueFull at once. A part larger than the
    /// whole queue takes all of it: it goes when the queue is empty.
    fn reserve(&self, shard: u16, items: usize) -> Result<OwnedSemaphorePermit> {
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

/// One request's part for one shard, waiting for its shard's writer.
pub(super) struct AddJob {
    items: Vec<NewItem>,
    deadline: Option<Deadline>,
    reply: oneshot::Sender<Result<ShardReply>>,
    /// The part's room in the queue, given back when the job is dropped.
    _room: OwnedSemaphorePermit,
}

impl AddJob {
    /// Whether the job's deadline has passed; if so, answers it so.
    fn expired(self, now: Instant) -> Option<AddJob> {
        match self.deadline {
            Some(deadline) if deadline.at <= now => {
                let _ = self.reply.send(Err(deadline.expired()));
                None
            }
            _ => Some(self),
        }
    }
}

fn writer_gone() -> StoreError {
    StoreError::Redis(RedisError::from((
        ErrorKind::Client,
        "shard writer stopped",
    )))
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
