//! The background task that refreshes the metrics gauges read from Redis
//! (open groups, and each consumer group's pending batches, lag and dead
//! letters) and runs the recorder's upkeep. It reads through `store`, so it
//! lives above both `store` and `metrics`, which `store` records into.

use std::time::Duration;

use ::metrics::gauge;
use tokio_util::sync::CancellationToken;

use crate::metrics::{CONSUMER_LAG, CONSUMER_PENDING, DEAD_LETTERS, OPEN_GROUPS, handle};
use crate::store::{Store, StoreError};

/// How often the gauges read from Redis are refreshed.
pub const REFRESH_EVERY: Duration = Duration::from_secs(5);

/// Refreshes the gauges every [`REFRESH_EVERY`] until `shutdown`. A failed
/// read is logged (once until one succeeds again) and retried next time;
/// the gauges keep their last values meanwhile.
pub async fn refresh(store: Store, shutdown: CancellationToken) {
    let mut failing = false;
    loop {
        // Drains the histograms' samples even when nobody scrapes.
        handle().run_upkeep();
        match read(&store).await {
            Ok(()) => failing = false,
            Err(err) => {
                if !failing {
                    tracing::warn!(%err, "cannot read the metrics gauges from redis; retrying");
                }
                failing = true;
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(REFRESH_EVERY) => {}
        }
    }
}

/// Reads the gauges' values from Redis and sets them.
async fn read(store: &Store) -> Result<(), StoreError> {
    gauge!(OPEN_GROUPS).set(store.open_groups().await? as f64);
    for group in store.consumer_group_stats().await? {
        let label = || ("consumer_group", group.name.clone());
        gauge!(CONSUMER_PENDING, &[label()]).set(group.pending as f64);
        gauge!(CONSUMER_LAG, &[label()]).set(group.lag as f64);
        gauge!(DEAD_LETTERS, &[label()]).set(group.dead_letters as f64);
    }
    Ok(())
}
