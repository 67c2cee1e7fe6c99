//! A sink's metrics (src/sinks): deliveries by outcome, and keys waiting for a retry.
//! They carry the sink's name only: never its URL or secret.

use metrics::{Counter, Gauge, counter, gauge};

/// Batches a sink delivered, by outcome.
pub const SINK_DELIVERIES: &str = "batcher_sink_deliveries_total";
/// Keys of a sink whose next batch waits for a retry.
pub const SINK_RETRYING_KEYS: &str = "batcher_sink_retrying_keys";

/// Describes the families (once, with the others').
pub fn describe() {
    metrics::describe_counter!(
        SINK_DELIVERIES,
        "Sink delivery attempts on this instance, by sink and outcome \
         (delivered, failed: a retry follows, dead_lettered)."
    );
    metrics::describe_gauge!(
        SINK_RETRYING_KEYS,
        "Keys of a sink on this instance whose next batch waits for a retry."
    );
}

/// The handles of one sink's metrics.
#[derive(Clone)]
pub struct SinkMetrics {
    delivered: Counter,
    failed: Counter,
    dead_lettered: Counter,
    retrying: Gauge,
}

impl SinkMetrics {
    pub fn new(sink: &str) -> SinkMetrics {
        let outcome = |word: &'static str| counter!(SINK_DELIVERIES, "sink" => sink.to_owned(), "outcome" => word);
        SinkMetrics {
            delivered: outcome("delivered"),
            failed: outcome("failed"),
            dead_lettered: outcome("dead_lettered"),
            retrying: gauge!(SINK_RETRYING_KEYS, "sink" => sink.to_owned()),
        }
    }

    pub fn delivered(&self) {
        self.delivered.increment(1);
    }

    pub fn failed(&self) {
        self.failed.increment(1);
    }

    pub fn dead_lettered(&self) {
        self.dead_lettered.increment(1);
    }

    pub fn retrying(&self, keys: usize) {
        self.retrying.set(keys as f64);
    }
}
