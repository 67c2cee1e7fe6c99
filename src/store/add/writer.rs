//! The add writers, which run the add function for the jobs that queued
//! up meanwhile: each call takes a shard's waiting jobs together, so under
//! load many small requests share one call.
//!
//! On one Redis, [`LANES`] writers serve the shards in rounds
//! ([`run_rounds`]): a round sends the jobs of every shard of its lane in
//! one call (`add_shards`, a section per shard; more calls only past
//! `MERGE_LIMIT` items), and the next round takes what queued while it was
//! in flight. Redis then pays its fixed cost of a call once per round, not
//! once per shard: under many callers of one add each, a call carries the
//! round's adds of all its shards. On a cluster each shard has a writer of
//! its own ([`AddWriter::run`]), whose calls stay in its shard's slot, so a
//! slow or failing node holds up only the shards it serves.

use std::collections::VecDeque;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::future::join_all;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Instant;

use super::args::{AddArgs, AddCall};
use super::job::{AddJob, NewItem, ShardReply, Slot, Waiting, writer_gone};
use super::reply::{AddReply, ItemReply};
use crate::batch::{AddOutcome, AddResult, Batch, DecodeError, OpenLimit};
use crate::keys::Keyspace;
use crate::scripts::Function;
use crate::store::conn::{Code, Conn, WaitReplicas, run_command};
use crate::store::{Result, StoreError};

/// Most items one merged add call takes, so no call holds Redis for
/// long; a single request's shard part is never split, whatever its size.
const MERGE_LIMIT: usize = 1000;

/// One shard's queue: the writer's inbox, and the room left in it.
///
/// The channel itself is unbounded, but every job in it holds permits of
/// `room` for its items (at least one), so it never holds more than
/// `limit` items, nor more than `limit` jobs.
pub(in crate::store) struct ShardQueue {
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
    pub(in crate::store) fn resized(&self, limit: NonZeroUsize) -> ShardQueue {
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
#[derive(Clone)]
pub(in crate::store) struct AddWriter {
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
        let reply = self.call(&items).await;
        drop(items);
        reply_jobs(batch, reply);
    }

    /// One add function call for `items`, all of this shard, in order.
    async fn call(&self, items: &[&NewItem]) -> Result<ShardReply> {
        let call = self.args(items);
        let code = Code::Function(Function::Add);
        let mut cmd = code.start(call.key_count(), call.arg_count(), call.size_hint());
        call.write_keys(&mut cmd);
        debug_assert_keys(&call);
        call.write_args(&mut cmd);
        let order = call.order().to_vec();
        drop(call);
        let due = &self.keys.shard_keys(self.shard).due;
        let reply: AddReply = run_command(&self.conn, self.wait, code, &cmd, due).await?;
        self.results(items, reply, &order)
    }

    /// The add function's call for `items`, all of this shard, laid out
    /// ([`AddArgs`]).
    fn args<'a>(&'a self, items: &[&'a NewItem]) -> AddCall<'a> {
        let open_limit = self.open_limit.load(Ordering::Relaxed);
        let mut args = AddArgs::new(&self.keys, self.shard, self.dedup).with_open_limit(open_limit);
        args.reserve(items.len());
        for new in items {
            args.item_with(
                &new.key,
                &new.policy,
                &new.item,
                new.close,
                new.requeue_of.as_deref(),
            );
        }
        args.finish()
    }

    /// The results of `items` from the add function's reply to them, the
    /// `j`-th reply being to item `order[j]` (to item `j` when `order` is
    /// empty). The batches it flushed are recorded in the metrics, and
    /// traced.
    fn results(&self, items: &[&NewItem], reply: AddReply, order: &[usize]) -> Result<ShardReply> {
        let earliest = reply.earliest;
        let (replies, rooms) = reply
            .split(items.len())
            .map_err(|e| DecodeError(e.to_string()))?;
        let replies = if order.is_empty() {
            replies
        } else {
            let mut placed: Vec<_> = order.iter().copied().zip(replies).collect();
            placed.sort_unstable_by_key(|(at, _)| *at);
            placed.into_iter().map(|(_, reply)| reply).collect()
        };
        let results = replies
            .into_iter()
            .zip(items)
            .map(|((outcome, group_size, batch), new)| {
                let flushed: Vec<Batch> = batch
                    .into_iter()
                    .flatten()
                    .map(|batch| batch.into_batch(self.shard))
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

/// Panics (in debug builds) unless the keys of `call` share one cluster slot.
fn debug_assert_keys(call: &AddCall) {
    if cfg!(debug_assertions) {
        let mut keys: Vec<Vec<u8>> = Vec::new();
        call.write_keys(&mut keys);
        let keys: Vec<&str> = keys
            .iter()
            .map(|k| std::str::from_utf8(k).unwrap_or(""))
            .collect();
        crate::keys::debug_assert_one_slot(&keys);
    }
}

/// A shard's writer and the jobs of its next call.
type ShardBatch<'a> = (&'a AddWriter, Vec<AddJob>);

/// Answers each job of `batch` with its part of `reply`, in order.
fn reply_jobs(batch: Vec<AddJob>, reply: Result<ShardReply>) {
    match reply {
        Ok((earliest, results)) if batch.len() == 1 => {
            if let Some(job) = batch.into_iter().next() {
                let _ = job.reply.send(Ok((earliest, results)));
            }
        }
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

/// One call of the add function's `add_shards` for several shards' batches
/// (writer and jobs), each shard a section, each batch answered as
/// [`AddWriter::answer`] would. One Redis only: the sections' keys are in
/// different slots.
async fn answer_shards(parts: Vec<ShardBatch<'_>>) {
    let items: Vec<Vec<&NewItem>> = parts
        .iter()
        .map(|(_, batch)| batch.iter().flat_map(|job| job.items.iter()).collect())
        .collect();
    let calls: Vec<AddCall> = parts
        .iter()
        .zip(&items)
        .map(|((writer, _), items)| writer.args(items))
        .collect();
    let code = Code::Function(Function::AddShards);
    let keys = calls.iter().map(AddCall::key_count).sum();
    let args = 1 + calls.iter().map(AddCall::arg_count).sum::<usize>();
    let bytes = calls.iter().map(AddCall::size_hint).sum();
    let mut cmd = code.start(keys, args, bytes);
    for call in &calls {
        call.write_keys(&mut cmd);
    }
    let counts = calls
        .iter()
        .flat_map(|call| [call.key_count(), call.arg_count()])
        .map(|count| count as f64);
    let header: Vec<u8> = std::iter::once(calls.len() as f64)
        .chain(counts)
        .flat_map(f64::to_le_bytes)
        .collect();
    cmd.arg(header);
    for call in &calls {
        call.write_args(&mut cmd);
    }
    let orders: Vec<Vec<usize>> = calls.iter().map(|call| call.order().to_vec()).collect();
    drop(calls);
    let (conn, wait) = (&parts[0].0.conn, parts[0].0.wait);
    let due = &parts[0].0.keys.shard_keys(parts[0].0.shard).due;
    let replies: Result<Vec<AddReply>> = run_command(conn, wait, code, &cmd, due).await;
    let replies = replies.and_then(|replies| {
        if replies.len() == parts.len() {
            Ok(replies)
        } else {
            Err(DecodeError("add_shards: not one reply per section".into()).into())
        }
    });
    let replies: Vec<Result<AddReply>> = match replies {
        Ok(replies) => replies.into_iter().map(Ok).collect(),
        Err(err) => parts.iter().map(|_| Err(err.clone())).collect(),
    };
    let results: Vec<Result<ShardReply>> = parts
        .iter()
        .zip(&items)
        .zip(replies.into_iter().zip(&orders))
        .map(|(((writer, _), items), (reply, order))| writer.results(items, reply?, order))
        .collect();
    drop(items);
    for ((_, batch), reply) in parts.into_iter().zip(results) {
        reply_jobs(batch, reply);
    }
}

/// Sends one call of a round: a shard's batch alone as a plain add call,
/// several shards' batches as one of `add_shards`.
async fn answer_call(mut parts: Vec<ShardBatch<'_>>) {
    if parts.len() == 1 {
        let (writer, batch) = parts.remove(0);
        writer.answer(batch).await;
    } else {
        answer_shards(parts).await;
    }
}

/// Starts the add writers of every shard of `writer.keys` (`writer` is
/// any one of them: each gets its own shard) and returns each shard's
/// queue, of `limit` items. On one Redis, writers in rounds, one per lane
/// of shards; on a cluster, one writer per shard. Each writer's task ends
/// when the last sender of its queue is dropped.
pub(in crate::store) fn start_writers(writer: AddWriter, limit: NonZeroUsize) -> Arc<[ShardQueue]> {
    let shards = writer.keys.shards();
    let writers = (0..shards).map(|shard| AddWriter {
        shard,
        ..writer.clone()
    });
    if matches!(writer.conn, Conn::Cluster(_)) {
        return writers
            .map(|writer| {
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(writer.run(rx));
                ShardQueue::new(tx, limit)
            })
            .collect();
    }
    let lanes: Vec<_> = (0..LANES).map(|_| mpsc::unbounded_channel()).collect();
    let lane_of = |shard: u16| usize::from(shard % LANES);
    let queues = (0..shards)
        .map(|shard| ShardQueue::new(lanes[lane_of(shard)].0.clone(), limit))
        .collect();
    let mut lane_writers: Vec<Vec<AddWriter>> = lanes.iter().map(|_| Vec::new()).collect();
    for one in writers {
        lane_writers[lane_of(one.shard)].push(one);
    }
    for ((_, rx), writers) in lanes.into_iter().zip(lane_writers) {
        tokio::spawn(run_rounds(writers, rx));
    }
    queues
}

/// How many round writers share one Redis's shards (shard `s` is in lane
/// `s % LANES`): while one lane's replies are answered and its next round
/// gathers, another lane's round keeps Redis busy.
pub const LANES: u16 = 2;

/// The writer of one lane of shards on one Redis (see the module docs):
/// each round takes the jobs that queued while the last one was in flight,
/// up to `MERGE_LIMIT` items a shard (a shard's further jobs wait, in
/// order, for the next round), and sends them all at once: one call of
/// the shards' batches together while they hold at most `MERGE_LIMIT`
/// items, a plain add call for a shard alone. `writers` holds one per
/// shard of the lane, in shard order; they build each shard's arguments
/// and read its replies.
pub(super) async fn run_rounds(writers: Vec<AddWriter>, mut jobs: mpsc::UnboundedReceiver<AddJob>) {
    let mut waiting: Vec<VecDeque<AddJob>> = writers.iter().map(|_| VecDeque::new()).collect();
    let at = |job: &AddJob| usize::from(job.shard / LANES);
    let mut queued = 0;
    // The round's calls, each a list of shards' batches of at most
    // MERGE_LIMIT items in all (unless one batch alone is larger); the
    // list is kept from round to round.
    let mut calls: Vec<(usize, Vec<ShardBatch>)> = Vec::new();
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
            if batch.is_empty() {
                continue;
            }
            match calls.last_mut() {
                Some((items, parts)) if *items + total <= MERGE_LIMIT => {
                    *items += total;
                    parts.push((writer, batch));
                }
                _ => calls.push((total, vec![(writer, batch)])),
            }
        }
        if let [(_, parts)] = &mut calls[..] {
            answer_call(std::mem::take(parts)).await;
            calls.clear();
        } else {
            join_all(calls.drain(..).map(|(_, parts)| answer_call(parts))).await;
        }
    }
}
