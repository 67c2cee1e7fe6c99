//! The background task that refreshes the metrics gauges read from Redis
//! (open groups, and each consumer group's pending batches, lag and dead
//! letters) and runs the recorder's upkeep. It reads through `store`, so it
//! lives above both `store` and `metrics`, which `store` records into.

use std::time::Duration;

use ::metrics::gauge;
use tokio_util::sync::CancellationToken;

use crate::metrics::{
    CONSUMER_LAG, CONSUMER_PENDING, DEAD_LETTERS, LIMITED_GROUPS, OLDEST_LIMITED_GROUP_AGE,
    OPEN_GROUPS, OPEN_GROUPS_LIMIT, handle,
};
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
    read_limits(store).await?;
    for group in store.consumer_group_stats().await? {
        let label = || ("consumer_group", group.name.clone());
        gauge!(CONSUMER_PENDING, &[label()]).set(group.pending as f64);
        gauge!(CONSUMER_LAG, &[label()]).set(group.lag as f64);
        gauge!(DEAD_LETTERS, &[label()]).set(group.dead_letters as f64);
    }
    Ok(())
}

/// Sets the gauges of the limits on open groups.
async fn read_limits(store: &Store) -> Result<(), StoreError> {
    let limits = store.open_limits().await?;
    for (name, open, limit) in &limits.rows {
        gauge!(LIMITED_GROUPS, "limit" => name.clone()).set(*open as f64);
        gauge!(OPEN_GROUPS_LIMIT, "limit" => name.clone()).set(*limit as f64);
    }
    if !limits.rows.is_empty() {
        let age = limits.oldest_age.unwrap_or_default();
        gauge!(OLDEST_LIMITED_GROUP_AGE).set(age.as_secs_f64());
    }
    Ok(())
}
