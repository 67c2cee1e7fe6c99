//! Prometheus metrics: the name of every family, the recorder, and the
//! helpers the rest of the code calls (`metrics::flushed(&batch, due)` and
//! so on), so that no name is spelled twice. The one debug log line per
//! flush is written here too, beside the flush's metrics.
//!
//! The recorder is `metrics-exporter-prometheus`'s, installed as the
//! process's global `metrics` recorder on first use (see [`handle`]); the
//! HTTP listener (`crate::http`) renders it for `GET /metrics`. One recorder
//! per process is what a deployment runs (one service per process). Tests
//! that run several services in one process see those services' sums in
//! the counters, and whichever service refreshed a Redis-derived gauge
//! last (they read the same Redis, so it is the same number).
//!
//! - `requests`: the wrapper around the gRPC service that counts and times calls.
//!
//! The gauges read from Redis are set by `crate::gauges`, above `store`.

mod requests;
pub mod sinks;

use std::future::Future;
use std::sync::{LazyLock, OnceLock};
use std::time::Duration;

use ::metrics::{Counter, Gauge, Histogram, counter, describe_counter, describe_gauge};
use ::metrics::{describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::batch::{AddOutcome, AddResult, Batch, FlushReason};

pub use requests::{Requests, code_name, record_call};

/// Items of adds, by `outcome`: `added`, `duplicate`, or `refused` (by a
/// limit on open groups).
pub const ITEMS_ADDED: &str = "batcher_items_added_total";
/// Batches this instance flushed, by `reason` (the flush reason, lowercase).
pub const BATCHES_FLUSHED: &str = "batcher_batches_flushed_total";
/// Items per flushed batch (histogram).
pub const BATCH_ITEMS: &str = "batcher_batch_items";
/// Flushed-at minus due-at of timeout flushes, in seconds (histogram).
pub const FLUSH_LATENESS: &str = "batcher_flush_lateness_seconds";
/// Open groups: the entries of every shard's due set.
pub const OPEN_GROUPS: &str = "batcher_open_groups";
/// Groups open under a limit on open groups, by `limit` (its name, such as
/// `limits.max_open_groups` or `policies/keys/scan-*.max_groups`).
pub const LIMITED_GROUPS: &str = "batcher_limited_open_groups";
/// Each limit on open groups, by `limit`: the most groups it lets open.
pub const OPEN_GROUPS_LIMIT: &str = "batcher_open_groups_limit";
/// Age of the oldest group open under a limit on open groups, in seconds.
pub const OLDEST_LIMITED_GROUP_AGE: &str = "batcher_oldest_limited_group_age_seconds";
/// Subscriptions open on this instance, by `mode`: `live` or `durable`.
pub const SUBSCRIBERS: &str = "batcher_subscribers";
/// Batches delivered to a consumer group and not yet acked, by `consumer_group`.
pub const CONSUMER_PENDING: &str = "batcher_consumer_pending";
/// Batches not yet delivered to a consumer group, by `consumer_group`.
pub const CONSUMER_LAG: &str = "batcher_consumer_lag";
/// Dead-lettered batches of a consumer group, by `consumer_group`.
pub const DEAD_LETTERS: &str = "batcher_dead_letters";
/// Redis errors met by this instance, by `kind` (see [`REDIS_ERROR_KINDS`]).
pub const REDIS_ERRORS: &str = "batcher_redis_errors_total";
/// Finished calls of the Batcher API, by `method` and `code` (the gRPC code).
pub const REQUESTS: &str = "batcher_requests_total";
/// How long Batcher API calls took until their response began, by `method` (histogram).
pub const REQUEST_DURATION: &str = "batcher_request_duration_seconds";

/// Every family the service exports, for the dashboard's test.
pub const FAMILIES: &[&str] = &[
    ITEMS_ADDED,
    BATCHES_FLUSHED,
    BATCH_ITEMS,
    FLUSH_LATENESS,
    OPEN_GROUPS,
    LIMITED_GROUPS,
    OPEN_GROUPS_LIMIT,
    OLDEST_LIMITED_GROUP_AGE,
    SUBSCRIBERS,
    CONSUMER_PENDING,
    CONSUMER_LAG,
    DEAD_LETTERS,
    REDIS_ERRORS,
    REQUESTS,
    REQUEST_DURATION,
];

/// The `kind` labels of [`REDIS_ERRORS`].
pub const REDIS_ERROR_KINDS: &[&str] = &["unavailable", "timeout", "oom", "readonly", "other"];

/// Buckets of [`BATCH_ITEMS`]: item counts.
const ITEM_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0,
];
/// Buckets of [`FLUSH_LATENESS`]: 1 ms to 60 s.
const LATENESS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Buckets of [`REQUEST_DURATION`]: 100 µs to 10 s.
const DURATION_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// The process's Prometheus recorder, installed as the global `metrics`
/// recorder on the first call. If another global recorder was installed
/// first (by an application embedding batcher), the handle renders nothing
/// batcher records, and a warning says so.
pub fn handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let builder = [
            (BATCH_ITEMS, ITEM_BUCKETS),
            (FLUSH_LATENESS, LATENESS_BUCKETS),
            (REQUEST_DURATION, DURATION_BUCKETS),
        ]
        .into_iter()
        .fold(PrometheusBuilder::new(), |builder, (name, buckets)| {
            builder
                .set_buckets_for_metric(Matcher::Full(name.to_owned()), buckets)
                .expect("buckets are not empty")
        });
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        if let Err(err) = ::metrics::set_global_recorder(recorder) {
            tracing::warn!(%err, "another metrics recorder is installed; /metrics shows none of batcher's");
        }
        describe();
        handle
    })
}

/// The text format of every family, for `GET /metrics`.
pub fn render() -> String {
    // The families with fixed labels exist from the start, at zero.
    LazyLock::force(&HANDLES);
    handle().render()
}

/// The help texts of the families.
fn describe() {
    sinks::describe();
    describe_counter!(ITEMS_ADDED, "Items accepted by adds, by outcome.");
    describe_counter!(BATCHES_FLUSHED, "Batches this instance flushed, by reason.");
    describe_histogram!(BATCH_ITEMS, "Items per flushed batch.");
    describe_histogram!(
        FLUSH_LATENESS,
        "Flushed-at minus due-at of timeout flushes."
    );
    describe_gauge!(OPEN_GROUPS, "Open groups (entries of the due sets).");
    describe_gauge!(
        LIMITED_GROUPS,
        "Groups open under a limit on open groups, by limit."
    );
    describe_gauge!(OPEN_GROUPS_LIMIT, "The most groups each limit lets open.");
    describe_gauge!(
        OLDEST_LIMITED_GROUP_AGE,
        "Age of the oldest group open under a limit on open groups."
    );
    describe_gauge!(SUBSCRIBERS, "Subscriptions open on this instance, by mode.");
    describe_gauge!(
        CONSUMER_PENDING,
        "Batches delivered to a consumer group, not yet acked."
    );
    describe_gauge!(
        CONSUMER_LAG,
        "Batches not yet delivered to a consumer group."
    );
    describe_gauge!(DEAD_LETTERS, "Dead-lettered batches of a consumer group.");
    describe_counter!(REDIS_ERRORS, "Redis errors met by this instance, by kind.");
    describe_counter!(
        REQUESTS,
        "Finished Batcher API calls, by method and gRPC code."
    );
    describe_histogram!(
        REQUEST_DURATION,
        "Batcher API call time until the response began."
    );
}

/// The handles of the families whose labels are fixed, registered once, so
/// the hot paths only bump atomics.
struct Handles {
    added: Counter,
    duplicate: Counter,
    refused: Counter,
    /// In the order of `FlushReason::ALL`.
    flushed: Vec<Counter>,
    batch_items: Histogram,
    lateness: Histogram,
    live: Gauge,
    durable: Gauge,
    /// In the order of `REDIS_ERROR_KINDS`.
    redis_errors: Vec<Counter>,
}

static HANDLES: LazyLock<Handles> = LazyLock::new(|| {
    handle();
    let live = gauge!(SUBSCRIBERS, "mode" => "live");
    let durable = gauge!(SUBSCRIBERS, "mode" => "durable");
    live.increment(0.0);
    durable.increment(0.0);
    let handles = Handles {
        added: counter!(ITEMS_ADDED, "outcome" => "added"),
        duplicate: counter!(ITEMS_ADDED, "outcome" => "duplicate"),
        refused: counter!(ITEMS_ADDED, "outcome" => "refused"),
        flushed: FlushReason::ALL
            .iter()
            .map(|(_, word)| counter!(BATCHES_FLUSHED, "reason" => word.to_ascii_lowercase()))
            .collect(),
        batch_items: histogram!(BATCH_ITEMS),
        lateness: histogram!(FLUSH_LATENESS),
        live,
        durable,
        redis_errors: REDIS_ERROR_KINDS
            .iter()
            .map(|kind| counter!(REDIS_ERRORS, "kind" => *kind))
            .collect(),
    };
    // Counters show at zero before their first event.
    for c in [&handles.added, &handles.duplicate, &handles.refused] {
        c.increment(0);
    }
    for c in handles.flushed.iter().chain(&handles.redis_errors) {
        c.increment(0);
    }
    handles
});

/// Counts the outcomes of a set of adds.
pub fn added(results: &[AddResult]) {
    let (mut duplicates, mut refused) = (0, 0);
    for r in results {
        match r.outcome {
            AddOutcome::Added => {}
            AddOutcome::Duplicate => duplicates += 1,
            AddOutcome::Refused(_) => refused += 1,
        }
    }
    // A counter is shared by every thread: one left alone stays in its cache.
    for (counter, count) in [
        (&HANDLES.added, results.len() as u64 - duplicates - refused),
        (&HANDLES.duplicate, duplicates),
        (&HANDLES.refused, refused),
    ] {
        if count > 0 {
            counter.increment(count);
        }
    }
}

/// Records a batch this instance flushed: its reason, its size and, for a
/// timeout flush whose due time (`due_at_ms`, Redis clock) is known, its
/// lateness. Logs one line at debug level: key, reason, item count, batch
/// id and lateness; never the items.
pub fn flushed(batch: &Batch, due_at_ms: Option<u64>) {
    let reason = FlushReason::ALL
        .iter()
        .position(|(reason, _)| *reason == batch.reason);
    if let Some(counter) = reason.and_then(|i| HANDLES.flushed.get(i)) {
        counter.increment(1);
    }
    HANDLES.batch_items.record(batch.items.len() as f64);
    let lateness = due_at_ms
        .filter(|_| batch.reason == FlushReason::Timeout)
        .map(|due| Duration::from_millis(batch.flushed_at_ms.saturating_sub(due)));
    if let Some(lateness) = lateness {
        HANDLES.lateness.record(lateness.as_secs_f64());
    }
    tracing::debug!(
        key = %batch.key,
        reason = batch.reason.as_str(),
        items = batch.items.len(),
        batch_id = %batch.id(),
        lateness_ms = lateness.map(|l| l.as_millis() as u64),
        "flushed"
    );
}

/// Counts a Redis error; `transient` says whether the store takes it for
/// Redis being unreachable or not ready.
pub fn redis_error(err: &RedisError, transient: bool) {
    let kind = if err.is_timeout() {
        "timeout"
    } else if err.code() == Some("OOM") {
        "oom"
    } else if err.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly) {
        "readonly"
    } else if transient {
        "unavailable"
    } else {
        "other"
    };
    count_redis_error(kind);
}

/// Counts a call whose deadline passed while it waited on Redis (kind `timeout`).
pub fn redis_timeout() {
    count_redis_error("timeout");
}

fn count_redis_error(kind: &str) {
    let index = REDIS_ERROR_KINDS.iter().position(|k| *k == kind);
    if let Some(counter) = index.and_then(|i| HANDLES.redis_errors.get(i)) {
        counter.increment(1);
    }
}

/// The two kinds of subscription.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubscriberMode {
    Live,
    Durable,
}

/// Runs a subscriber's task, counted in [`SUBSCRIBERS`] from this call
/// until the task ends.
pub fn subscribed<F: Future>(mode: SubscriberMode, task: F) -> impl Future<Output = F::Output> {
    let gauge = match mode {
        SubscriberMode::Live => HANDLES.live.clone(),
        SubscriberMode::Durable => HANDLES.durable.clone(),
    };
    let counted = Counted::new(gauge);
    async move {
        let _counted = counted;
        task.await
    }
}

/// Holds one unit of a gauge while it lives.
struct Counted(Gauge);

impl Counted {
    fn new(gauge: Gauge) -> Counted {
        gauge.increment(1.0);
        Counted(gauge)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}
