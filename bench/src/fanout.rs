//! Scenario 4, flush to subscriber: 100 subscribers, each on its own
//! connection, while groups of 10 items are completed at 100 per second (each
//! AddMany of 10 items to a fresh key flushes one batch by SIZE). Latency is
//! each subscriber's receive time minus the batch's flushed_at.

use std::time::{Duration, Instant};

use batcher::pb;
use hdrhistogram::Histogram;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use super::load::{
    add_request, connect, connect_many, histogram, id, key, now_micros, record, subscribe,
    ts_micros,
};
use super::procs::{CpuUse, rss_kib};
use super::scenarios::{Sizes, Target};

const SUBSCRIBERS: usize = 100;
const PER_SEC: u64 = 100;
const ITEMS: u64 = 10;

/// Flush-to-subscriber latency of scenario 4.
pub struct Fanout {
    pub subscribers: usize,
    pub batches: u64,
    /// Receive time minus flushed_at, µs.
    pub latency: Histogram<u64>,
    pub delivered: u64,
    pub rss_max_kib: Option<u64>,
    pub errors: String,
    pub cpu: CpuUse,
}

/// Each subscriber's latencies and the batches it received.
type Receivers = JoinSet<Result<(Histogram<u64>, u64), String>>;

/// Scenario 4: subscribes, samples the service's RSS, completes the groups
/// on schedule, then gathers every subscriber's latencies.
pub async fn fanout(t: &Target, s: &Sizes, run: &str) -> Result<Fanout, String> {
    let batches = PER_SEC * s.fanout_window.as_secs();
    let stop = CancellationToken::new();
    let receivers = spawn_receivers(t, &format!("fs-{run}"), batches, &stop).await?;
    let sampler = sample_rss(t.service_pid, stop.clone());
    let cpu = t.cpu_meter();
    let errors = complete_groups(t, run, batches).await?;
    let (latency, delivered) = gather(receivers, &stop).await?;
    let cpu = cpu.finish();
    let rss_max_kib = sampler.await.unwrap_or(None);
    Ok(Fanout {
        subscribers: SUBSCRIBERS,
        batches,
        latency,
        delivered,
        rss_max_kib,
        errors,
        cpu,
    })
}

/// Starts the subscribers, each on its own connection, each recording the
/// latency of every batch until it has `batches` or `stop` is cancelled.
async fn spawn_receivers(
    t: &Target,
    prefix: &str,
    batches: u64,
    stop: &CancellationToken,
) -> Result<Receivers, String> {
    let mut receivers = JoinSet::new();
    for _ in 0..SUBSCRIBERS {
        let mut client = connect(t.addr).await?;
        let mut stream = subscribe(&mut client, prefix).await?;
        let stop = stop.clone();
        receivers.spawn(async move {
            let _client = client;
            let mut latency = histogram();
            let mut count = 0;
            while count < batches {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    message = stream.message() => match message {
                        Ok(Some(batch)) => {
                            let flushed = ts_micros(batch.flushed_at.as_ref());
                            record(&mut latency, now_micros().saturating_sub(flushed));
                            count += 1;
                        }
                        Ok(None) => break,
                        Err(status) => return Err(format!("Subscribe stream: {}", status.message())),
                    },
                }
            }
            Ok((latency, count))
        });
    }
    Ok(receivers)
}

/// Samples the service's RSS every 100 ms until `stop`; the peak, in KiB.
fn sample_rss(pid: Option<u32>, stop: CancellationToken) -> JoinHandle<Option<u64>> {
    tokio::spawn(async move {
        let mut max = None;
        while !stop.is_cancelled() {
            if let Some(rss) = pid.and_then(rss_kib) {
                max = Some(max.unwrap_or(0).max(rss));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        max
    })
}

/// Completes `batches` groups at `PER_SEC`, each with one AddMany of
/// `ITEMS` items under a fresh key. Returns "" or a note of failed calls.
async fn complete_groups(t: &Target, run: &str, batches: u64) -> Result<String, String> {
    let clients = connect_many(t.addr, 2).await?;
    let started = Instant::now();
    let mut adds = JoinSet::new();
    for b in 0..batches {
        let at = started + Duration::from_secs(1) * b as u32 / PER_SEC as u32;
        tokio::time::sleep_until(at.into()).await;
        let mut client = clients[b as usize % clients.len()].clone();
        let group = key("fs", run, b);
        let items = (0..ITEMS)
            .map(|i| add_request(group.clone(), id(run, 0, i)))
            .collect();
        adds.spawn(async move { client.add_many(pb::AddManyRequest { items }).await });
    }
    let (mut errors, mut first_error) = (0, None);
    while let Some(joined) = adds.join_next().await {
        if let Err(status) = joined.map_err(|e| e.to_string())? {
            errors += 1;
            first_error.get_or_insert(status.message().to_string());
        }
    }
    Ok(if errors > 0 {
        format!(
            "; {errors} failed AddMany calls (first: {})",
            first_error.unwrap_or_default()
        )
    } else {
        String::new()
    })
}

/// Gives the last batches 3 s to arrive, stops whatever is still waiting,
/// and merges every subscriber's latencies and counts.
async fn gather(
    mut receivers: Receivers,
    stop: &CancellationToken,
) -> Result<(Histogram<u64>, u64), String> {
    let mut results = Vec::new();
    let all = async {
        while let Some(joined) = receivers.join_next().await {
            results.push(joined);
        }
    };
    if tokio::time::timeout(Duration::from_secs(3), all)
        .await
        .is_err()
    {
        stop.cancel();
        while let Some(joined) = receivers.join_next().await {
            results.push(joined);
        }
    }
    stop.cancel();
    let mut latency = histogram();
    let mut delivered = 0;
    for result in results {
        let (h, count) = result.map_err(|e| e.to_string())??;
        latency.add(&h).map_err(|e| e.to_string())?;
        delivered += count;
    }
    Ok((latency, delivered))
}
