//! One sink's deliverer on this instance: the shards it holds a lease on,
//! the batches it read from them, and the deliveries in flight.
//!
//! Order per key needs one deliverer per key at a time, across instances: a
//! key's batches all land in one shard, so each shard of a sink is held by
//! one instance at a time, under a lease in Redis renewed every third of
//! its length. The holder reads the shard's new batches through the sink's
//! consumer group; an instance that takes a shard over (its holder died,
//! or left) first takes every batch the group holds pending there, in stream
//! order, then reads on, so a key's batches go out in flush order and
//! nothing pending is left behind. Within the shards it holds, a deliverer
//! delivers up to `max_in_flight` keys side by side, each with one batch in
//! flight; a key whose batch waits for a retry holds back only that key.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::webhook::{Attempt, Webhook};
use crate::batch::{Batch, StreamId};
use crate::config::{SinkConfig, SinkOptions, WebhookOptions};
use crate::metrics::sinks::SinkMetrics;
use crate::store::Store;

/// The longest a deliverer waits before reading its shards again.
const POLL: Duration = Duration::from_millis(100);
/// Most batches one sink's deliverer holds in memory (read, not yet
/// delivered); the rest wait in Redis.
const MAX_HELD: usize = 1024;
/// Batches taken over per call when a shard changes hands.
const TAKE_OVER_CHUNK: usize = 256;
/// Pause before a failed Redis call (ack, dead letter) is tried again.
const REDIS_RETRY: Duration = Duration::from_millis(200);

/// A batch waiting for its turn, and the attempts it has had here.
struct Queued {
    batch: Arc<Batch>,
    attempts: u32,
}

/// One key's line of batches.
#[derive(Default)]
struct KeyLine {
    shard: u16,
    batches: VecDeque<Queued>,
    /// Its head is being delivered.
    busy: bool,
    /// Its head waits for a retry until then.
    not_before: Option<Instant>,
}

/// What became of a delivery.
enum Done {
    /// Acked, or dead-lettered: the next batch of the key may go.
    Settled,
    /// Failed; try again after the delay.
    Retry(Duration),
}

/// What a delivery needs, shared by every delivery of the sink.
struct Shared {
    store: Store,
    group: String,
    options: WebhookOptions,
    webhook: Webhook,
    metrics: SinkMetrics,
    name: String,
}

/// A sink's deliverer on this instance.
pub(super) struct Deliverer {
    shared: Arc<Shared>,
    sink: SinkConfig,
    consumer: String,
}

impl Deliverer {
    pub(super) fn new(
        store: Store,
        sink: SinkConfig,
        webhook: Webhook,
        consumer: String,
    ) -> Deliverer {
        let SinkOptions::Webhook(options) = sink.options.clone();
        Deliverer {
            shared: Arc::new(Shared {
                store,
                group: sink.group(),
                options,
                webhook,
                metrics: SinkMetrics::new(&sink.name),
                name: sink.name.clone(),
            }),
            sink,
            consumer,
        }
    }

    /// Delivers until `stop`; then gives its leases up, so another
    /// instance takes its shards over at once.
    pub(super) async fn run(self, stop: CancellationToken) {
        let shared = &self.shared;
        let store = &shared.store;
        let group = &shared.group;
        // The group starts at the end of each stream, like a durable
        // subscription's; an existing one keeps its place.
        loop {
            let created = store.create_consumer_group(group, "", false).await;
            match created {
                Ok(_) => break,
                Err(err) => {
                    tracing::warn!(sink = %shared.name, %err, "cannot create the sink's consumer group; retrying");
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(self.sink.lease / 3) => {}
                    }
                }
            }
        }
        let shards = store.keyspace().shards();
        let mut state = State {
            held_until: vec![None; usize::from(shards)],
            lines: HashMap::new(),
            held: 0,
            in_flight: JoinSet::new(),
            flying: HashMap::new(),
            read_from: 0,
            next_lease: Instant::now(),
            next_read: Instant::now(),
        };
        loop {
            let now = Instant::now();
            if now >= state.next_lease {
                self.renew(&mut state).await;
                state.next_lease = Instant::now() + self.sink.lease / 3;
            }
            if Instant::now() >= state.next_read {
                state.next_read = match self.read(&mut state).await {
                    Ok(true) => Instant::now(),
                    Ok(false) => Instant::now() + POLL,
                    Err(err) => {
                        tracing::warn!(sink = %shared.name, %err, "sink read failed; retrying");
                        Instant::now() + POLL
                    }
                };
            }
            self.dispatch(&mut state);
            let wake = state.wake();
            tokio::select! {
                _ = stop.cancelled() => break,
                Some(done) = state.in_flight.join_next_with_id(), if !state.in_flight.is_empty() => {
                    let (key, done) = match done {
                        Ok((id, (key, done))) => {
                            state.flying.remove(&id);
                            (key, done)
                        }
                        // A delivery that panicked is tried again.
                        Err(err) => match state.flying.remove(&err.id()) {
                            Some(key) => (key, Done::Retry(shared.options.backoff_min)),
                            None => continue,
                        },
                    };
                    state.settle(&key, done, shared);
                }
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
        // What was in flight stays pending for the group; the next holder
        // delivers it again (with the same id).
        state.in_flight.abort_all();
        for shard in 0..shards {
            if state.held_until[usize::from(shard)].is_some() {
                let _ = store
                    .sink_lease(shard, group, &self.consumer, Duration::ZERO)
                    .await;
            }
        }
        shared.metrics.retrying(0);
    }

    /// Takes or renews the lease on every shard; a shard newly held is
    /// first caught up with what the group holds pending there. A shard
    /// whose lease could not be renewed in time is let go.
    async fn renew(&self, state: &mut State) {
        let shared = &self.shared;
        for shard in 0..shared.store.keyspace().shards() {
            let at = usize::from(shard);
            let asked = Instant::now();
            let held = shared
                .store
                .sink_lease(shard, &shared.group, &self.consumer, self.sink.lease)
                .await;
            match held {
                Ok(true) => {
                    let was_held = state.held_until[at].is_some();
                    state.held_until[at] = Some(asked + self.sink.lease);
                    if !was_held {
                        tracing::info!(sink = %shared.name, shard, "sink shard taken");
                        if let Err(err) = self.take_over(shard, state).await {
                            tracing::warn!(sink = %shared.name, shard, %err, "sink take-over failed; retrying");
                            state.let_go(shard);
                        }
                    }
                }
                Ok(false) => state.let_go(shard),
                Err(err) => {
                    tracing::warn!(sink = %shared.name, shard, %err, "sink lease renewal failed");
                    if state.held_until[at].is_some_and(|until| Instant::now() >= until) {
                        state.let_go(shard);
                    }
                }
            }
        }
    }

    /// Takes every batch the group holds pending in `shard`, oldest first.
    async fn take_over(
        &self,
        shard: u16,
        state: &mut State,
    ) -> Result<(), crate::store::StoreError> {
        let shared = &self.shared;
        let mut start = StreamId::ZERO;
        loop {
            let (batches, next) = shared
                .store
                .take_pending(shard, &shared.group, &self.consumer, start, TAKE_OVER_CHUNK)
                .await?;
            self.queue(shard, batches, state).await?;
            match next {
                Some(next) => start = next,
                None => return Ok(()),
            }
        }
    }

    /// Reads new batches from the shards it holds, as many as it has room
    /// for. Returns whether a shard may have more right away.
    async fn read(&self, state: &mut State) -> Result<bool, crate::store::StoreError> {
        let shared = &self.shared;
        let mut more = false;
        let shards = shared.store.keyspace().shards();
        // Each read starts one shard further, so a shard with a backlog
        // cannot keep the others' batches waiting.
        state.read_from = (state.read_from + 1) % shards;
        let first = state.read_from;
        for shard in (0..shards).map(|i| (first + i) % shards) {
            if state.held_until[usize::from(shard)].is_none() {
                continue;
            }
            let room = MAX_HELD.saturating_sub(state.held);
            if room == 0 {
                return Ok(false);
            }
            let batches = shared
                .store
                .read_group(shard, &shared.group, &self.consumer, room)
                .await?;
            more |= batches.len() == room;
            self.queue(shard, batches, state).await?;
        }
        Ok(more)
    }

    /// Puts batches in their keys' lines, in the order given; acks at once
    /// those the sink does not take (other keys, another group's re-driven
    /// copies).
    async fn queue(
        &self,
        shard: u16,
        batches: Vec<Batch>,
        state: &mut State,
    ) -> Result<(), crate::store::StoreError> {
        let shared = &self.shared;
        let mut skipped = Vec::new();
        for batch in batches {
            let for_us = batch.for_group.as_ref().is_none_or(|g| *g == shared.group);
            if !for_us || !self.takes(&batch.key) {
                skipped.push(batch.stream_id);
                continue;
            }
            let line = state.lines.entry(batch.key.clone()).or_default();
            line.shard = shard;
            // Taken over while this instance still delivers it.
            if line
                .batches
                .iter()
                .any(|q| q.batch.stream_id == batch.stream_id)
            {
                continue;
            }
            line.batches.push_back(Queued {
                batch: Arc::new(batch),
                attempts: 0,
            });
            state.held += 1;
        }
        shared
            .store
            .ack_entries(shard, &shared.group, &skipped)
            .await
    }

    /// Whether the sink takes `key`'s batches.
    fn takes(&self, key: &str) -> bool {
        self.sink
            .keys
            .iter()
            .any(|pattern| crate::policy::glob_matches(pattern, key))
    }

    /// Starts the next delivery of every key that may go, up to
    /// `max_in_flight` at once.
    fn dispatch(&self, state: &mut State) {
        let limit = self.shared.options.max_in_flight.get();
        let now = Instant::now();
        for (key, line) in state.lines.iter_mut() {
            if state.in_flight.len() >= limit {
                break;
            }
            if line.busy || line.not_before.is_some_and(|t| t > now) {
                continue;
            }
            let Some(head) = line.batches.front_mut() else {
                continue;
            };
            head.attempts += 1;
            line.busy = true;
            line.not_before = None;
            let (batch, attempts) = (head.batch.clone(), head.attempts);
            let shared = self.shared.clone();
            let task_key = key.clone();
            let task = state.in_flight.spawn(async move {
                let done = deliver(&shared, &batch, attempts).await;
                (task_key, done)
            });
            state.flying.insert(task.id(), key.clone());
        }
        let retrying = state
            .lines
            .values()
            .filter(|l| l.not_before.is_some())
            .count();
        self.shared.metrics.retrying(retrying);
    }
}

/// What the deliverer loop keeps.
struct State {
    /// Per shard: until when this instance holds its lease (None: it does not).
    held_until: Vec<Option<Instant>>,
    /// The keys' lines of batches.
    lines: HashMap<String, KeyLine>,
    /// Batches in the lines.
    held: usize,
    in_flight: JoinSet<(String, Done)>,
    /// The key of each delivery in flight, by task.
    flying: HashMap<tokio::task::Id, String>,
    /// The shard the last read started at.
    read_from: u16,
    next_lease: Instant,
    next_read: Instant,
}

impl State {
    /// When the loop must look again: the next lease renewal, read, or retry.
    fn wake(&self) -> Instant {
        let retry = self
            .lines
            .values()
            .filter(|l| !l.busy)
            .filter_map(|l| l.not_before);
        retry
            .chain([self.next_lease, self.next_read])
            .min()
            .unwrap_or(self.next_read)
    }

    /// Forgets a shard: its lines that are not in flight (their batches
    /// stay pending for the group, for the shard's next holder).
    fn let_go(&mut self, shard: u16) {
        let at = usize::from(shard);
        if self.held_until[at].take().is_some() {
            tracing::info!(shard, "sink shard let go");
        }
        let mut dropped = 0;
        self.lines.retain(|_, line| {
            if line.shard != shard {
                return true;
            }
            let keep = usize::from(line.busy);
            dropped += line.batches.len() - keep;
            line.batches.truncate(keep);
            line.not_before = None;
            keep > 0
        });
        self.held -= dropped;
    }

    /// Moves `key`'s line on after a delivery.
    fn settle(&mut self, key: &str, done: Done, shared: &Shared) {
        let Some(line) = self.lines.get_mut(key) else {
            return;
        };
        line.busy = false;
        match done {
            Done::Settled => {
                if line.batches.pop_front().is_some() {
                    self.held -= 1;
                }
                if line.batches.is_empty() {
                    self.lines.remove(key);
                }
            }
            Done::Retry(after) => {
                line.not_before = Some(Instant::now() + after);
                // A line of a shard let go meanwhile is done here.
                if self.held_until[usize::from(line.shard)].is_none() {
                    self.held -= line.batches.len();
                    self.lines.remove(key);
                }
            }
        }
        let retrying = self
            .lines
            .values()
            .filter(|l| l.not_before.is_some())
            .count();
        shared.metrics.retrying(retrying);
    }
}

/// One attempt at `batch` (its `attempts`th here): on acceptance it is
/// acked; on a refusal, or a failure past `max_attempts` or `max_age`, it
/// goes to the dead letters; else it is retried after the backoff (or the
/// receiver's `Retry-After`).
async fn deliver(shared: &Shared, batch: &Batch, attempts: u32) -> Done {
    let body = super::body(batch, attempts);
    let id = batch.id();
    let why = match shared.webhook.post(&id, body).await {
        Attempt::Accepted => {
            shared.metrics.delivered();
            let entry = [(batch.shard, batch.origin.unwrap_or(batch.stream_id))];
            retry_redis("ack", shared, || shared.store.ack(&shared.group, &entry)).await;
            return Done::Settled;
        }
        Attempt::Refused { why } => why,
        Attempt::Retry { after, why } => {
            shared.metrics.failed();
            let options = &shared.options;
            let age = Duration::from_millis(now_ms().saturating_sub(batch.flushed_at_ms));
            if attempts < options.max_attempts.get() && age < options.max_age {
                let delay = after.unwrap_or_else(|| backoff(options, attempts));
                tracing::info!(sink = %shared.name, batch = %id, attempts, %why, ?delay, "sink delivery failed; retrying");
                return Done::Retry(delay);
            }
            why
        }
    };
    shared.metrics.dead_lettered();
    tracing::warn!(sink = %shared.name, batch = %id, attempts, %why, "sink delivery dead-lettered");
    retry_redis("dead letter", shared, || {
        shared.store.dead_letter_sink(&shared.group, batch, &why)
    })
    .await;
    Done::Settled
}

/// Runs a Redis call until it succeeds: the delivery is done, only its
/// record is missing. (On shutdown the task is aborted, the batch stays
/// pending, and is delivered again.)
async fn retry_redis<T, F, Fut>(what: &str, shared: &Shared, mut call: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, crate::store::StoreError>>,
{
    loop {
        match call().await {
            Ok(_) => return,
            Err(err) => {
                tracing::warn!(sink = %shared.name, %err, "sink {what} failed; retrying");
                tokio::time::sleep(REDIS_RETRY).await;
            }
        }
    }
}

/// The delay before attempt `attempts + 1`: `backoff_min` doubled per
/// attempt, at most `backoff_max`, with up to half of it taken off at
/// random, so that keys failing together do not retry together.
fn backoff(options: &WebhookOptions, attempts: u32) -> Duration {
    let doubled = options
        .backoff_min
        .saturating_mul(1u32 << attempts.saturating_sub(1).min(20));
    let full = doubled.min(options.backoff_max);
    full.mul_f64(1.0 - fastrand::f64() / 2.0)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Backoff doubles from backoff_min, stays within backoff_max, and its
    /// jitter takes at most half off.
    #[test]
    fn backoff_doubles_within_bounds() {
        let options = WebhookOptions {
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(1),
            ..WebhookOptions::default()
        };
        for _ in 0..100 {
            let first = backoff(&options, 1);
            assert!(first <= Duration::from_millis(100) && first >= Duration::from_millis(50));
            let third = backoff(&options, 3);
            assert!(third <= Duration::from_millis(400) && third >= Duration::from_millis(200));
            let late = backoff(&options, 30);
            assert!(late <= Duration::from_secs(1) && late >= Duration::from_millis(500));
        }
    }
}
