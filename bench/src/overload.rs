//! Scenario 10, overload: first scenario 1's closed-loop AddMany load measures
//! the items per second the service takes (its capacity on this Redis);
//! then AddMany calls of 100 items are sent open-loop, at a fixed rate of
//! twice that, for the window, whatever the replies. Accepted calls are
//! timed; calls refused with RESOURCE_EXHAUSTED are counted; any other
//! failure is recorded. The service's RSS is sampled every 100 ms.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use batcher::pb;
use hdrhistogram::Histogram;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::ingest;
use super::load::{Client, Rng, add_request, added, connect_many, histogram, id, key, record};
use super::procs::rss_kib;
use super::scenarios::{Sizes, Target};

/// Items per AddMany call.
const BATCH: u64 = 100;
/// Keys the calls spread their items over.
const KEYS: u64 = 10_000;
/// HTTP/2 connections the calls are spread over.
const CONNECTIONS: usize = 16;
/// Offered load, as a multiple of the measured capacity.
pub const OVERLOAD: f64 = 2.0;
/// Calls the bench keeps outstanding at most; beyond, it skips (and counts)
/// calls rather than queue them itself.
const MAX_OUTSTANDING: usize = 20_000;

/// What the overload run measured.
pub struct Overload {
    /// Items/s the closed-loop run added.
    pub capacity: f64,
    /// Items/s offered open-loop.
    pub offered: f64,
    pub window: Duration,
    /// Items added by accepted calls completing inside the window.
    pub accepted_items: u64,
    pub accepted_calls: u64,
    /// Calls refused with RESOURCE_EXHAUSTED inside the window.
    pub refused_calls: u64,
    /// Calls that failed otherwise, and the first of them.
    pub other_errors: u64,
    pub first_other: Option<String>,
    /// Calls the bench did not send, having too many outstanding.
    pub skipped: u64,
    /// Latency of accepted calls completing inside the window, µs.
    pub latency: Histogram<u64>,
    /// The service's RSS before the load, KiB.
    pub idle_rss_kib: Option<u64>,
    /// (seconds since the open loop started, RSS KiB), every 100 ms.
    pub rss: Vec<(f64, u64)>,
}

impl Overload {
    pub fn max_rss_kib(&self) -> Option<u64> {
        self.rss.iter().map(|(_, kib)| *kib).max()
    }

    /// The RSS's peak over the second half of the series over its peak over
    /// the first: about 1 when the RSS stopped growing, and towards 2 when it
    /// grew in step with time, as it would with a queue without bound (at
    /// twice the capacity, the refused half of the offered items, some 8 MB
    /// a second at 100 bytes an item, against an idle RSS of about 20 MiB).
    pub fn rss_growth(&self) -> Option<f64> {
        growth(&self.rss)
    }

    pub fn calls(&self) -> u64 {
        self.accepted_calls + self.refused_calls + self.other_errors
    }

    pub fn refused_share(&self) -> f64 {
        self.refused_calls as f64 / self.calls().max(1) as f64
    }
}

/// What the open-loop calls were answered, inside the window.
#[derive(Default)]
struct Tally {
    accepted_items: u64,
    accepted_calls: u64,
    refused_calls: u64,
    other_errors: u64,
    first_other: Option<String>,
    latency: Option<Histogram<u64>>,
}

/// Scenario 10: measures capacity, then offers [`OVERLOAD`] times it.
pub async fn overload(t: &Target, s: &Sizes, run: &str) -> Result<Overload, String> {
    let idle_rss_kib = t.rss();
    let capacity = ingest::ingest_add_many(t, s, run).await?.stats.per_sec();
    if capacity <= 0.0 {
        return Err("the closed-loop run added nothing".into());
    }
    let offered = capacity * OVERLOAD;
    let clients = connect_many(t.addr, CONNECTIONS).await?;
    let stop = CancellationToken::new();
    let sampler = sample_rss(t.service_pid, stop.clone());
    let calls_per_sec = offered / BATCH as f64;
    let (tally, skipped) = open_loop(clients, calls_per_sec, s, run).await;
    stop.cancel();
    let rss = sampler.await.unwrap_or_default();
    Ok(Overload {
        capacity,
        offered,
        window: s.window,
        accepted_items: tally.accepted_items,
        accepted_calls: tally.accepted_calls,
        refused_calls: tally.refused_calls,
        other_errors: tally.other_errors,
        first_other: tally.first_other,
        skipped,
        latency: tally.latency.unwrap_or_else(histogram),
        idle_rss_kib,
        rss,
    })
}

/// Sends AddMany calls at `calls_per_sec` for the warm-up and the window,
/// each on a task of its own, and waits for the last answers. Returns what
/// the calls completing inside the window were told, and the calls skipped.
async fn open_loop(clients: Vec<Client>, calls_per_sec: f64, s: &Sizes, run: &str) -> (Tally, u64) {
    let began = Instant::now();
    let (start, end) = (began + s.warmup, began + s.warmup + s.window);
    let tally = Arc::new(Mutex::new(Tally::default()));
    let outstanding = Arc::new(AtomicUsize::new(0));
    let mut ticks = tokio::time::interval(Duration::from_millis(2));
    let (mut issued, mut skipped) = (0u64, 0u64);
    let mut rng = Rng::new(0x0ed0);
    while Instant::now() < end {
        ticks.tick().await;
        let due = (began.elapsed().as_secs_f64() * calls_per_sec) as u64;
        while issued < due {
            issued += 1;
            if outstanding.load(Ordering::Relaxed) >= MAX_OUTSTANDING {
                skipped += 1;
                continue;
            }
            let items = (0..BATCH)
                .map(|i| {
                    add_request(
                        key("ov", run, rng.below(KEYS)),
                        id(run, 0, issued * BATCH + i),
                    )
                })
                .collect();
            let client = clients[issued as usize % clients.len()].clone();
            outstanding.fetch_add(1, Ordering::Relaxed);
            let (tally, outstanding) = (tally.clone(), outstanding.clone());
            tokio::spawn(async move {
                call(client, items, (start, end), &tally).await;
                outstanding.fetch_sub(1, Ordering::Relaxed);
            });
        }
    }
    let drained = Instant::now() + Duration::from_secs(30);
    while outstanding.load(Ordering::Relaxed) > 0 && Instant::now() < drained {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let tally = std::mem::take(&mut *tally.lock().unwrap());
    (tally, skipped)
}

/// One AddMany call; its answer counts if it completes inside `window`.
async fn call(
    mut client: Client,
    items: Vec<pb::AddRequest>,
    (start, end): (Instant, Instant),
    tally: &Mutex<Tally>,
) {
    let sent = Instant::now();
    let reply = client.add_many(pb::AddManyRequest { items }).await;
    let done = Instant::now();
    if done < start || done > end {
        return;
    }
    let mut tally = tally.lock().unwrap();
    match reply {
        Ok(response) => {
            tally.accepted_calls += 1;
            tally.accepted_items += added(&response.into_inner().results);
            let latency = tally.latency.get_or_insert_with(histogram);
            record(latency, (done - sent).as_micros() as u64);
        }
        Err(status) if status.code() == tonic::Code::ResourceExhausted => {
            tally.refused_calls += 1;
        }
        Err(status) => {
            tally.other_errors += 1;
            tally
                .first_other
                .get_or_insert_with(|| format!("{:?}: {}", status.code(), status.message()));
        }
    }
}

/// Samples the service's RSS every 100 ms until `stop`: (seconds, KiB).
fn sample_rss(pid: Option<u32>, stop: CancellationToken) -> JoinHandle<Vec<(f64, u64)>> {
    tokio::spawn(async move {
        let began = Instant::now();
        let mut samples = Vec::new();
        while !stop.is_cancelled() {
            if let Some(rss) = pid.and_then(rss_kib) {
                samples.push((began.elapsed().as_secs_f64(), rss));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        samples
    })
}

/// The peak of the second half of `samples` over the peak of the first
/// half; None with fewer than two samples.
fn growth(samples: &[(f64, u64)]) -> Option<f64> {
    let half = samples.len() / 2;
    let peak = |part: &[(f64, u64)]| part.iter().map(|(_, kib)| *kib).max();
    let (first, second) = (peak(&samples[..half])?, peak(&samples[half..])?);
    Some(second as f64 / first.max(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::growth;

    /// RSS that levels off reads about 1, and RSS growing in step with time
    /// reads well over the 1.2 the target allows.
    #[test]
    fn growth_tells_a_plateau_from_a_queue_without_bound() {
        let series = |rss: &dyn Fn(f64) -> u64| -> Vec<(f64, u64)> {
            (0..110)
                .map(|i| i as f64 / 10.0)
                .map(|t| (t, rss(t)))
                .collect()
        };
        // As measured at ad19f6e: 29 MiB at the start, about 47 MiB from 2 s on.
        let plateau = series(&|t| {
            if t < 2.0 {
                29_000 + (9_000.0 * t) as u64
            } else {
                47_000
            }
        });
        let plateau = growth(&plateau).unwrap();
        assert!((0.99..1.01).contains(&plateau), "{plateau}");
        // 18 MiB idle and 8 MB more every second.
        let unbounded = series(&|t| 18_000 + (8_000.0 * t) as u64);
        let unbounded = growth(&unbounded).unwrap();
        assert!(unbounded > 1.5, "{unbounded}");
        assert_eq!(growth(&[(0.0, 1)]), None);
    }
}
