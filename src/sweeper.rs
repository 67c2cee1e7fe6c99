//! The sweeper: flushes groups whose due time has passed.
//!
//! Every instance sweeps every shard, one task per shard. A task sleeps until
//! the earliest due time it knows of: the one the due-groups script returns,
//! or an earlier one that a local add just opened (the add wakes it). The
//! sleep is timed from when Redis read its clock (the middle of the scan's
//! round trip), and on waking the task flushes the groups the scan saw
//! falling due then before it scans again, so a timeout flush waits on one
//! round trip, not two. An add that opens a group while a scan is under way
//! does not wake the task (under load nearly every add lands in a scan, and
//! each wake was one more scan): its due time is kept, and the plan made
//! after the scan takes it into account. It never
//! sleeps longer than `max_sleep`, so it also finds groups that other
//! instances opened. Pub/sub is not used. Racing sweepers are harmless: the
//! flush script re-checks that a group is due, so each group yields one batch.
//!
//! A failed round (Redis down, or out of memory, which refuses the flush
//! script's writes) leaves the groups due; the sweeper backs off, up to
//! `max_sleep`, and tries again, logging at most one line per shard every
//! few seconds.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::batch::StreamId;
use crate::config::SweeperConfig;
use crate::store::{Store, StoreError};

/// Wakes the shard sweepers when a local add opens an earlier deadline.
#[derive(Clone)]
pub struct SweeperHandle {
    shards: Arc<[ShardWake]>,
}

/// `ShardWake::planned` while its sweeper scans.
const SCANNING: u64 = u64::MAX;

struct ShardWake {
    /// The Redis-clock time (ms) at which the sweeper will next look, or
    /// [`SCANNING`].
    planned: AtomicU64,
    /// The earliest due time (ms) opened during a scan, for the plan that
    /// follows it (`u64::MAX`: none).
    opened: AtomicU64,
    /// Stores a permit when nobody waits, so a wake-up is never lost.
    notify: Notify,
}

impl ShardWake {
    fn new() -> ShardWake {
        ShardWake {
            planned: AtomicU64::new(SCANNING),
            opened: AtomicU64::new(u64::MAX),
            notify: Notify::new(),
        }
    }

    /// A group due at `due_ms` was opened: wakes the sweeper when that is
    /// before its plan, and returns whether it did. During a scan, keeps the
    /// time for [`ShardWake::plan`] instead. All orderings are SeqCst: if
    /// the second look still sees a scan, the `fetch_min` came before the
    /// `swap` in `plan` (which follows the store that ends the scan), so
    /// the plan takes the time; otherwise the time is weighed against the
    /// plan here.
    fn opened(&self, due_ms: u64) -> bool {
        let mut planned = self.planned.load(Ordering::SeqCst);
        if planned == SCANNING {
            self.opened.fetch_min(due_ms, Ordering::SeqCst);
            planned = self.planned.load(Ordering::SeqCst);
            if planned == SCANNING {
                return false;
            }
        }
        if due_ms >= planned {
            return false;
        }
        self.notify.notify_one();
        true
    }

    /// A scan begins: adds from now on keep their due times for the plan.
    fn scanning(&self) {
        self.planned.store(SCANNING, Ordering::SeqCst);
    }

    /// The scan is over and planned a look at `wake_at`: returns the time
    /// to look at, the earlier of that and the due times opened meanwhile.
    fn plan(&self, wake_at: u64) -> u64 {
        self.planned.store(wake_at, Ordering::SeqCst);
        let opened = self.opened.swap(u64::MAX, Ordering::SeqCst);
        if opened < wake_at {
            self.planned.store(opened, Ordering::SeqCst);
            return opened;
        }
        wake_at
    }
}

impl SweeperHandle {
    /// Tells the sweeper of `shard` that a group due at `due_ms` was opened.
    pub fn opened(&self, shard: u16, due_ms: u64) {
        if let Some(wake) = self.shards.get(usize::from(shard)) {
            wake.opened(due_ms);
        }
    }
}

/// Starts one sweeper task per shard on `tracker`; they end on `shutdown`.
pub fn spawn(
    store: Store,
    config: SweeperConfig,
    retention: Duration,
    trim_every: Duration,
    tracker: &TaskTracker,
    shutdown: CancellationToken,
) -> SweeperHandle {
    let shards: Arc<[ShardWake]> = (0..store.keyspace().shards())
        .map(|_| ShardWake::new())
        .collect();
    let handle = SweeperHandle { shards };
    for shard in 0..store.keyspace().shards() {
        let sweeper = ShardSweeper {
            shard,
            store: store.clone(),
            config,
            retention_ms: retention.as_millis() as u64,
            trim_every_ms: trim_every.as_millis() as u64,
            handle: handle.clone(),
        };
        tracker.spawn(sweeper.run(shutdown.clone()));
    }
    handle
}

struct ShardSweeper {
    shard: u16,
    store: Store,
    config: SweeperConfig,
    retention_ms: u64,
    trim_every_ms: u64,
    handle: SweeperHandle,
}

impl ShardSweeper {
    async fn run(self, shutdown: CancellationToken) {
        let wake = &self.handle.shards[usize::from(self.shard)];
        let max_sleep_ms = self.config.max_sleep.as_millis() as u64;
        let mut failures = Failures::new(self.shard);
        let mut last_trim_ms = 0;
        // The keys the last scan saw falling due at the time the timer woke
        // us for: flushed at once, without a scan's round trip first.
        let mut expected = Vec::new();
        while !shutdown.is_cancelled() {
            wake.scanning();
            if !expected.is_empty() {
                let keys = std::mem::take(&mut expected);
                if !self.flush(&keys, &mut failures, &shutdown).await {
                    return;
                }
            }
            let sent = Instant::now();
            let scan = match self
                .store
                .due_groups(self.shard, self.config.batch.get())
                .await
            {
                Ok(scan) => scan,
                Err(err) => {
                    let backoff = failures.failed("sweep", &err, self.config.max_sleep);
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => continue,
                    }
                }
            };
            // When Redis read its clock, as near as the round trip tells.
            let read_at = sent + sent.elapsed() / 2;
            if scan.now_ms.saturating_sub(last_trim_ms) >= self.trim_every_ms {
                last_trim_ms = scan.now_ms;
                self.trim(scan.now_ms, &mut failures).await;
            }
            if !scan.keys.is_empty() {
                if !self.flush(&scan.keys, &mut failures, &shutdown).await {
                    return;
                }
                // Look again at once: more may be due, and the next due time moved.
                continue;
            }
            failures.recovered();
            let horizon = scan.now_ms + max_sleep_ms;
            let wake_at = wake.plan(scan.next_due_ms.map_or(horizon, |due| due.min(horizon)));
            let sleep = Duration::from_millis(wake_at.saturating_sub(scan.now_ms));
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = wake.notify.notified() => {}
                _ = tokio::time::sleep_until((read_at + sleep).into()) => {
                    if scan.next_due_ms == Some(wake_at) {
                        expected = scan.next_keys;
                    }
                }
            }
        }
    }

    /// Trims the shard's stream of batches older than the retention.
    async fn trim(&self, now_ms: u64, failures: &mut Failures) {
        let min = StreamId {
            ms: now_ms.saturating_sub(self.retention_ms),
            seq: 0,
        };
        if let Err(err) = self.store.trim_before(self.shard, min).await {
            failures.log("stream trim", &err);
        }
    }

    /// Flushes those of `keys` that are due; after a failure, backs off.
    /// Returns false if the shutdown came meanwhile.
    async fn flush(
        &self,
        keys: &[String],
        failures: &mut Failures,
        shutdown: &CancellationToken,
    ) -> bool {
        match self.store.flush_due(self.shard, keys).await {
            Ok(batches) => {
                failures.recovered();
                tracing::debug!(
                    shard = self.shard,
                    count = batches.len(),
                    "flushed by timeout"
                );
                true
            }
            Err(err) => {
                // The flush script writes nothing when it fails (at OOM Redis
                // refuses its first write): the groups stay due, and the next
                // round flushes them.
                let backoff = failures.failed("timeout flush", &err, self.config.max_sleep);
                tokio::select! {
                    _ = shutdown.cancelled() => false,
                    _ = tokio::time::sleep(backoff) => true,
                }
            }
        }
    }
}

/// Least time between two failure logs of one shard's sweeper, so that a
/// long outage or an out-of-memory Redis does not flood the log.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// A shard sweeper's consecutive failures: the back-off they call for, and
/// their logs, at most one per [`LOG_EVERY`].
struct Failures {
    shard: u16,
    count: u32,
    last_log: Option<Instant>,
}

impl Failures {
    fn new(shard: u16) -> Failures {
        Failures {
            shard,
            count: 0,
            last_log: None,
        }
    }

    /// Counts a failure of `what`; returns how long to wait before the next
    /// try: growing with the failures, up to `max`.
    fn failed(&mut self, what: &str, err: &StoreError, max: Duration) -> Duration {
        self.count += 1;
        self.log(what, err);
        Duration::from_millis(50 * u64::from(self.count.min(20))).min(max)
    }

    /// Logs a failure of `what`, unless one was logged less than
    /// [`LOG_EVERY`] ago.
    fn log(&mut self, what: &str, err: &StoreError) {
        let now = Instant::now();
        if self.last_log.is_some_and(|last| now - last < LOG_EVERY) {
            return;
        }
        self.last_log = Some(now);
        let (shard, failures) = (self.shard, self.count);
        if matches!(err, StoreError::OutOfMemory(_)) {
            tracing::warn!(
                shard,
                failures,
                "{what} failed: redis is out of memory (maxmemory); retrying until memory frees"
            );
        } else {
            tracing::warn!(shard, failures, %err, "{what} failed; retrying");
        }
    }

    /// A round went through: the failures, if any, are over.
    fn recovered(&mut self) {
        if self.count > 0 {
            tracing::info!(shard = self.shard, "sweeper works again");
        }
        self.count = 0;
        self.last_log = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An add during a scan wakes no one, and its due time moves the plan
    /// that follows the scan only when it is earlier.
    #[test]
    fn a_scan_keeps_the_due_times_opened_during_it_for_its_plan() {
        let wake = ShardWake::new();
        wake.scanning();
        assert!(!wake.opened(5_000));
        assert!(!wake.opened(7_000));
        assert_eq!(wake.plan(9_000), 5_000);
        // Taken: the next scan's plan starts afresh.
        wake.scanning();
        assert!(!wake.opened(20_000));
        assert_eq!(wake.plan(9_000), 9_000);
    }

    /// Between scans an add wakes the sweeper only for a due time before
    /// its plan.
    #[test]
    fn an_add_between_scans_wakes_only_for_an_earlier_due_time() {
        let wake = ShardWake::new();
        wake.scanning();
        assert_eq!(wake.plan(9_000), 9_000);
        assert!(!wake.opened(9_000));
        assert!(!wake.opened(12_000));
        assert!(wake.opened(8_999));
    }
}
