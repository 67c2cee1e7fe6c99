//! Scenarios 1 and 2, ingest: closed-loop callers add items under 10k keys
//! (the default policy, max_items 10, so groups flush by SIZE as they fill)
//! through AddMany or unary Add, counting the items added inside the window
//! and metering every process's CPU over that window. Scenario 11 runs the
//! same AddMany load under other policies ([`add_many_load`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use batcher::pb;

use super::load::{Done, LoadStats, Rng, add_request, added, closed_loop, connect_many, id, key};
use super::procs::CpuUse;
use super::scenarios::{Sizes, Target};

/// Throughput of an ingest scenario, and the CPU each process used meanwhile.
pub struct Ingest {
    pub stats: LoadStats,
    pub cpu: CpuUse,
    /// Batches the adds wrote, indexed by `pb::FlushReason` value, warm-up
    /// included (AddMany only; empty for unary Add).
    pub flushes: Vec<u64>,
}

impl Ingest {
    /// redis-server's CPU time over the window divided by the items added in
    /// it, in µs: the Redis work per item. None when Redis is not the bench's
    /// own (its CPU time cannot be read) or nothing was added.
    pub fn redis_us_per_item(&self) -> Option<f64> {
        us_per_add(&self.cpu, "redis", &self.stats)
    }

    /// The service's CPU time over the window divided by the items added in
    /// it, in µs. None when the service is not the bench's own or nothing
    /// was added.
    pub fn service_us_per_item(&self) -> Option<f64> {
        us_per_add(&self.cpu, "service", &self.stats)
    }

    /// "SIZE 52%, CAPACITY 48%": the share of each reason among the batches
    /// the adds wrote, or "none".
    pub fn flush_shares(&self) -> String {
        let total: u64 = self.flushes.iter().sum();
        let shares: Vec<String> = (self.flushes.iter().enumerate())
            .filter(|(_, n)| **n > 0)
            .map(|(reason, n)| {
                let name = pb::FlushReason::try_from(reason as i32)
                    .map_or("?", |r| r.as_str_name().trim_start_matches("FLUSH_REASON_"));
                format!("{name} {:.0}%", 100.0 * *n as f64 / total as f64)
            })
            .collect();
        if shares.is_empty() {
            "none".into()
        } else {
            shares.join(", ")
        }
    }
}

/// The CPU time the process named `process` used over the window divided by
/// the items added in it, in µs; None when it was not metered or nothing was
/// added.
pub fn us_per_add(cpu: &CpuUse, process: &str, stats: &LoadStats) -> Option<f64> {
    let secs = cpu.seconds(process)?;
    (stats.added > 0).then(|| secs * 1e6 / stats.added as f64)
}

/// Keys the ingest scenarios spread their items over.
pub const INGEST_KEYS: u64 = 10_000;

/// Scenario 1: AddMany calls of 100 items over 10k keys, from 16 callers over
/// 4 HTTP/2 connections.
pub async fn ingest_add_many(t: &Target, s: &Sizes, run: &str) -> Result<Ingest, String> {
    add_many_load(t, s, run, "am", |_, key, id| add_request(key, id)).await
}

/// Makes one AddMany item from its key and id, drawing whatever else it
/// carries from the caller's generator.
pub type MakeItem = fn(&mut Rng, String, String) -> pb::AddRequest;

/// Scenario 1's load, with the keys `<scenario>-<run><n>` and the items
/// `make` builds (scenario 11 runs it under another policy). Also counts the
/// batches every add wrote, by reason, over the whole run.
pub async fn add_many_load(
    t: &Target,
    s: &Sizes,
    run: &str,
    scenario: &'static str,
    make: MakeItem,
) -> Result<Ingest, String> {
    const CALLERS: usize = 16;
    const CONNECTIONS: usize = 4;
    const BATCH: u64 = 100;
    let clients = connect_many(t.addr, CONNECTIONS).await?;
    let cpu = t.cpu_during(s.warmup, s.window);
    let run = run.to_string();
    let flushes = Arc::new(Flushes::default());
    let tally = flushes.clone();
    let stats = closed_loop(CALLERS, s.warmup, s.window, move |caller, seq| {
        let mut client = clients[caller % CONNECTIONS].clone();
        let mut rng = Rng::new(((caller as u64) << 40) ^ seq);
        let items = (0..BATCH)
            .map(|i| {
                let k = key(scenario, &run, rng.below(INGEST_KEYS));
                make(&mut rng, k, id(&run, caller, seq * BATCH + i))
            })
            .collect();
        let tally = tally.clone();
        async move {
            let response = client
                .add_many(pb::AddManyRequest { items })
                .await
                .map_err(|s| format!("AddMany: {}", s.message()))?
                .into_inner();
            tally.count(&response.results);
            let ok = added(&response.results);
            Ok(Done {
                added: ok,
                duplicates: response.results.len() as u64 - ok,
            })
        }
    })
    .await?;
    let cpu = cpu.await.unwrap_or_default();
    Ok(Ingest {
        stats,
        cpu,
        flushes: flushes.counts(),
    })
}

/// Batches written by adds, by `pb::FlushReason` value.
#[derive(Default)]
struct Flushes([AtomicU64; FLUSH_REASONS]);

/// One past the highest `pb::FlushReason` value.
const FLUSH_REASONS: usize = pb::FlushReason::Closed as usize + 1;

impl Flushes {
    fn count(&self, results: &[pb::AddResponse]) {
        for batch in results.iter().flat_map(|r| &r.batches) {
            if let Some(n) = self.0.get(batch.reason as usize) {
                n.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn counts(&self) -> Vec<u64> {
        self.0.iter().map(|n| n.load(Ordering::Relaxed)).collect()
    }
}

/// Scenario 2: unary Add calls over 10k keys from 64 callers over 8 HTTP/2
/// connections.
pub async fn ingest_add(t: &Target, s: &Sizes, run: &str) -> Result<Ingest, String> {
    const CALLERS: usize = 64;
    const CONNECTIONS: usize = 8;
    let clients = connect_many(t.addr, CONNECTIONS).await?;
    let cpu = t.cpu_during(s.warmup, s.window);
    let run = run.to_string();
    let stats = closed_loop(CALLERS, s.warmup, s.window, move |caller, seq| {
        let client = clients[caller % CONNECTIONS].clone();
        let mut rng = Rng::new(((caller as u64) << 40) ^ seq);
        let request = add_request(
            key("ad", &run, rng.below(INGEST_KEYS)),
            id(&run, caller, seq),
        );
        unary_add(client, request)
    })
    .await?;
    let cpu = cpu.await.unwrap_or_default();
    Ok(Ingest {
        stats,
        cpu,
        flushes: Vec::new(),
    })
}

/// One unary Add, counted as added or duplicate.
pub async fn unary_add(
    mut client: pb::batcher_client::BatcherClient<tonic::transport::Channel>,
    request: pb::AddRequest,
) -> Result<Done, String> {
    let response = client
        .add(request)
        .await
        .map_err(|s| format!("Add: {}", s.message()))?
        .into_inner();
    let ok = u64::from(response.outcome == pb::AddOutcome::Added as i32);
    Ok(Done {
        added: ok,
        duplicates: 1 - ok,
    })
}
